------------------------------------------------------------------------------
-- Roles: application, auditor, merchant-scoped reporting (row-level security)
------------------------------------------------------------------------------

-- Roles are kept by OID (regrole), not by name: a role dropped and created
-- again under the same name is a new role and inherits nothing.  pg_dump
-- writes regrole values as role names, so a restore maps them to the roles of
-- the target cluster (restore the roles first, as for any GRANT).
CREATE TABLE payidem.merchant_role (
	role		regrole		NOT NULL,
	merchant_no	text		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_role_pkey PRIMARY KEY (role, merchant_no),
	CONSTRAINT merchant_role_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no)
);
COMMENT ON TABLE payidem.merchant_role IS
	'Reporting roles mapped to merchants: such a role reads only its merchants'' orders, payments, refunds and anomalies (row-level security). Managed with map_merchant_role()/unmap_merchant_role(); a role is kept by OID, so a new role with a dropped one''s name inherits nothing.';

CREATE TABLE payidem.auditor_role (
	role		regrole		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT auditor_role_pkey PRIMARY KEY (role)
);
COMMENT ON TABLE payidem.auditor_role IS
	'Roles granted read access to all merchants'' rows (without secrets) by grant_auditor(), until revoke_auditor(); kept by OID.';

-- Used by the row-level security policies, which pass the querying role's
-- OID (the policy expression runs as that role; inside this SECURITY DEFINER
-- function CURRENT_USER would be the owner).  Runs as the extension's owner,
-- so the mapping tables need no grants.
-- (SECURITY DEFINER: it reads the mapping tables, which a mapped role may
-- not; and it answers only for a role the session can act as, so that no
-- role learns another's mappings by calling it with that role's name)
CREATE FUNCTION payidem._row_visible(p_merchant_no text, p_role regrole)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.pg_has_role(SESSION_USER, p_role, 'MEMBER')
	AND (EXISTS (SELECT 1 FROM payidem.auditor_role a WHERE a.role = p_role)
		 OR EXISTS (SELECT 1 FROM payidem.merchant_role r
					 WHERE r.role = p_role AND r.merchant_no = p_merchant_no));

-- Rows of roles that no longer exist (a role is dropped with DROP OWNED BY,
-- which revokes the grants but cannot see these rows): removed whenever a
-- mapping is changed, so that they are not left behind for good.
CREATE FUNCTION payidem._forget_dropped_roles()
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	DELETE FROM payidem.auditor_role a
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = a.role::oid);
	DELETE FROM payidem.merchant_role r
	 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = r.role::oid);
END;

ALTER TABLE payidem."order" ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.payment ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.refund ENABLE ROW LEVEL SECURITY;
ALTER TABLE payidem.anomaly ENABLE ROW LEVEL SECURITY;
CREATE POLICY merchant_rows ON payidem."order" FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.payment FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.refund FOR SELECT
	USING (payidem._row_visible(merchant_no, (SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));
CREATE POLICY merchant_rows ON payidem.anomaly FOR SELECT
	USING (payidem._row_visible((SELECT o.merchant_no FROM payidem."order" o WHERE o.order_no = anomaly.order_no),
								(SELECT u.oid::regrole FROM pg_catalog.pg_roles u WHERE u.rolname = CURRENT_USER)));

-- The role a grant function names: not NULL and existing (22023, 42704); to be
-- granted something (to_grant), also an ordinary role that row-level security
-- applies to, and not one of the predefined roles (22023).  Revoking and
-- unmapping take any role that exists, so that a grant can always be undone.
CREATE FUNCTION payidem._check_role(role regrole, to_grant boolean DEFAULT true)
RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	r pg_roles;
BEGIN
	IF role IS NULL THEN
		PERFORM payidem._raise_invalid('role must not be null', hint => 'Name an existing role, e.g. ''shop_app''.');
	END IF;
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE oid = role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role does not exist' USING
			ERRCODE = 'undefined_object',
			DETAIL = format('No role has OID %s (it was dropped).', role::oid);
	END IF;
	IF NOT to_grant THEN
		RETURN r.rolname;
	END IF;
	-- the predefined roles (pg_read_all_data, pg_database_owner, ...: the
	-- pg_ prefix is reserved to them) hold or pass on more than a grant here
	-- should give
	IF r.rolname ~ '^pg_' AND NOT (r.rolsuper OR r.rolbypassrls) THEN
		PERFORM payidem._raise_invalid(format('role %s is a predefined role', r.rolname),
			'Predefined roles are shared by every database of the server, and some are members of others.',
			'Create a role of its own for the application and name that one.');
	END IF;
	IF r.rolsuper OR r.rolbypassrls THEN
		PERFORM payidem._raise_invalid(format('role %s bypasses row-level security', r.rolname),
			hint => 'Use an ordinary role without SUPERUSER or BYPASSRLS.');
	END IF;
	RETURN r.rolname;
END
$$;

-- The application's API: what grant_app() makes executable.
CREATE FUNCTION payidem.app_functions()
RETURNS SETOF regprocedure
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT p.oid::regprocedure
	  FROM pg_catalog.pg_proc p
	 WHERE p.pronamespace = 'payidem'::regnamespace
	   AND p.proname IN ('gen_order_no', 'order_no_valid', 'order_no_parse', 'stats',
						 'idem_claim', 'idem_record', 'idem_finish', '_idem_key_held',
						 'transit_order', 'transit_payment', 'transit_refund',
						 'sign', 'verify_signature', 'route_channel', 'get_channel_config',
						 'create_order', 'begin_payment', 'apply_payment_result', 'close_payment',
						 'close_order', 'refund', 'apply_refund_result', 'notify_due', 'notify_result',
						 'verify_notification', 'query_due',
						 'reconcile', 'resolve_diff', 'resolve_anomaly', 'get_order', 'find_order',
						 'request_payout', 'apply_payout_result', 'balance', 'library_version',
						 'apply_payment_result_ex', 'list_orders', 'list_anomalies', 'list_differences',
						 'health', '_jsonb_stored');
END;
COMMENT ON FUNCTION payidem.app_functions() IS
	'The functions grant_app() lets an application role execute.';

-- A role that both reads a merchant's rows (map_merchant_role(), itself or
-- through a role whose privileges it has) and may execute an API function
-- other than the reads scoped to its merchants (get_order(), find_order(),
-- balance(), the lists; library_version()): the rest of the API is not scoped
-- to a merchant (notify_due(), sign(), close_order(), ... act for every
-- merchant), so such a role would be scoped in get_order() and not in the
-- rest.  (A reporting role given EXECUTE on get_order() and find_order()
-- alone is scoped in both.)  grant_app() and map_merchant_role() refuse to
-- make one; a role that became one by a GRANT made later (or before 1.1) is
-- refused by get_order() and find_order().  Superusers and BYPASSRLS roles
-- read every row anyway.  of_role: only that role's rows.
CREATE FUNCTION payidem._app_merchant_roles(of_role regrole DEFAULT NULL)
RETURNS TABLE (role regrole, mapped_role regrole, merchant_no text, app_function regprocedure)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT c.oid::regrole, r.role, r.merchant_no, f.f
	  FROM pg_catalog.pg_roles c, payidem.merchant_role r, pg_catalog.pg_roles m,
		   LATERAL (SELECT x AS f FROM payidem.app_functions() x, pg_catalog.pg_proc p
					 WHERE p.oid = x::oid AND p.proname NOT IN ('get_order', 'find_order', 'balance', 'library_version',
												 'list_orders', 'list_anomalies', 'list_differences')
					   AND pg_catalog.has_function_privilege(c.oid, x::oid, 'EXECUTE')
					 ORDER BY x::text LIKE 'payidem.\_%', x::text COLLATE "C" LIMIT 1) f
	 WHERE m.oid = r.role::oid
	   AND NOT (c.rolsuper OR c.rolbypassrls)
	   AND (_app_merchant_roles.of_role IS NULL OR c.oid = _app_merchant_roles.of_role::oid)
	   AND pg_catalog.pg_has_role(c.oid, m.oid, 'USAGE')
	 ORDER BY c.rolname COLLATE "C", m.rolname COLLATE "C", r.merchant_no COLLATE "C";
END;
COMMENT ON FUNCTION payidem._app_merchant_roles(regrole) IS
	'Internal: roles that read a merchant''s rows (map_merchant_role(), themselves or as a member of mapped_role) and may execute an API function other than get_order()/find_order() (app_function, one of them): a combination grant_app() and map_merchant_role() refuse to make, and get_order()/find_order() refuse to serve.';

-- The refusal of such a role: by grant_app() or map_merchant_role() (by_call
-- names it; 22023, as _check_role's refusals of a role), or at a call of the
-- API (by_call NULL; 42501); warn_only: a WARNING instead (the update to 1.1
-- names the roles 1.0 let be both).
CREATE FUNCTION payidem._refuse_app_merchant_role(role regrole, mapped_role regrole, merchant_no text,
	app_function regprocedure, by_call text, warn_only boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_via text := CASE WHEN mapped_role = role THEN '' ELSE format(' as a member of role %s', mapped_role) END;
	v_detail text := CASE WHEN by_call IS NULL
		THEN format('Role %s reads the rows of merchant %s%s and may execute %s and the other API functions, which are not scoped to a merchant.',
					role, quote_literal(merchant_no), v_via, app_function)
		ELSE format('After %s, role %s would read the rows of merchant %s%s and execute %s and the other API functions, which are not scoped to a merchant.',
					by_call, role, quote_literal(merchant_no), v_via, app_function) END;
	v_hint constant text := 'Use separate roles: one for the application (grant_app) and one per merchant for reporting (map_merchant_role), neither a member of the other.';
BEGIN
	IF warn_only THEN
		RAISE WARNING 'role % is both an application role and a reporting role of a merchant', role USING
			DETAIL = v_detail, HINT = v_hint;
	ELSE
		RAISE EXCEPTION 'role % cannot be both an application role and a reporting role of a merchant', role USING
			ERRCODE = CASE WHEN by_call IS NULL THEN 'insufficient_privilege' ELSE 'invalid_parameter_value' END,
			DETAIL = v_detail, HINT = v_hint;
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._refuse_app_merchant_role(regrole, regrole, text, regprocedure, text, boolean) IS
	'Internal: the error (22023 from grant_app()/map_merchant_role(), 42501 at a call) for a role that would be or is both an application role and a merchant''s reporting role.';

-- Refused (22023, nothing granted) if the role, a member of it or a role it
-- is a member of reads a merchant's rows: see _app_merchant_roles().
CREATE FUNCTION payidem.grant_app(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	f regprocedure;
	v_role name := payidem._check_role(role);
	a record;
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	FOR f IN SELECT * FROM payidem.app_functions() LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, v_role);
	END LOOP;
	-- (after the grants, so that one test says what a role can do; an error
	-- takes them back)
	SELECT * INTO a FROM payidem._app_merchant_roles() x
	 WHERE pg_catalog.pg_has_role(x.role::oid, grant_app.role::oid, 'USAGE') LIMIT 1;
	IF FOUND THEN
		PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function,
												  format('grant_app(%s)', grant_app.role));
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.grant_app(regrole) IS
	'Let an application role call payidem''s API functions (payidem.app_functions()); it gets no direct access to any table. Refused (22023) for a role that reads a merchant''s rows (map_merchant_role), itself, through a role it is a member of or through a member.';

-- The tables and views a reading role gets SELECT on, in one place: those
-- row-level security filters by merchant (what map_merchant_role() grants,
-- and an auditor sees whole), or the auditor's others.  A list for GRANT
-- and REVOKE.
CREATE FUNCTION payidem._reader_tables(merchant_filtered boolean)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN merchant_filtered
			THEN 'payidem."order", payidem.payment, payidem.refund, payidem.anomaly, payidem.open_anomalies'
			ELSE 'payidem.merchant, payidem.channel, payidem.merchant_channel, payidem.status_log, '
				 'payidem.state, payidem.transition, payidem.channel_bill, payidem.recon_batch, '
				 'payidem.reconciliation, payidem.recon_summary, payidem.open_differences, '
				 'payidem.notify_event, payidem.notification_backlog, '
				 'payidem.business_day, payidem.ledger_entry, payidem.merchant_balance, '
				 'payidem.settlement_item, payidem.settlement_hold, payidem.payout, payidem.adjustment, '
				 'payidem.merchant_balances, payidem.settlement_summary, payidem.platform_margin' END;
COMMENT ON FUNCTION payidem._reader_tables(boolean) IS
	'Internal: what map_merchant_role() (true) and grant_auditor() (both) grant SELECT on, as a list for GRANT and REVOKE.';

CREATE FUNCTION payidem.grant_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON %s, %s TO %I', payidem._reader_tables(false),
				   payidem._reader_tables(true), v_role);
	-- (the view merchant_balances calls _balances() with its reader's privileges)
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem.verify(), payidem._balances(text) TO %I', v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.auditor_role (role) VALUES (grant_auditor.role) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.grant_auditor(regrole) IS
	'Read-only access to every merchant''s business rows and the books (verify()); never to merchant_secret, channel_config or idempotency results.';

-- A finance role: the auditor's reads, and the books' writers a finance
-- team runs (settle, adjust_balance, set_merchant_notify_url).
CREATE FUNCTION payidem.grant_finance(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	PERFORM payidem.grant_auditor(role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem.settle(date), '
				   'payidem.adjust_balance(text, bigint, text, text, text), '
				   'payidem.set_merchant_notify_url(text, text) TO %I', v_role);
END
$$;
COMMENT ON FUNCTION payidem.grant_finance(regrole) IS
	'Let a finance role settle (settle()), adjust balances (adjust_balance()) and set merchants'' notification URLs, with an auditor''s reads (grant_auditor).';

-- What map_merchant_role() and grant_auditor() both grant, taken back once
-- the role is neither an auditor nor mapped to a merchant: SELECT on the
-- tables row-level security filters, EXECUTE on the visibility function its
-- policies call, and USAGE on the schema unless the role still holds a grant
-- on a table or a column of the schema (a DBA's GRANT).  Not from a role
-- that may also execute a payidem function, itself or through a role it is a
-- member of (grant_app(), a DBA's GRANT), nor from one with such a member:
-- without SELECT on "order", get_order() and find_order() would show it (or
-- its member) every merchant's orders, as to an application; with it, its
-- row-level security shows none.
CREATE FUNCTION payidem._revoke_reader_grants(role regrole, role_name name)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM payidem.auditor_role a WHERE a.role = _revoke_reader_grants.role)
	   OR EXISTS (SELECT 1 FROM payidem.merchant_role r WHERE r.role = _revoke_reader_grants.role)
	   OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles m, pg_catalog.pg_proc p
				   WHERE NOT (m.rolsuper OR m.rolbypassrls)	-- (members of every role; read every order anyway)
					 AND pg_catalog.pg_has_role(m.oid, _revoke_reader_grants.role::oid, 'MEMBER')
					 AND p.pronamespace = 'payidem'::regnamespace
					 AND p.oid <> 'payidem._row_visible(text, regrole)'::regprocedure
					 AND pg_catalog.has_function_privilege(m.oid, p.oid, 'EXECUTE')) THEN
		RETURN;
	END IF;
	EXECUTE format('REVOKE SELECT ON %s FROM %I', payidem._reader_tables(true), role_name);
	EXECUTE format('REVOKE EXECUTE ON FUNCTION payidem._row_visible(text, regrole) FROM %I', role_name);
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
					WHERE c.relnamespace = 'payidem'::regnamespace AND a.grantee = _revoke_reader_grants.role::oid)
	   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
						 JOIN pg_catalog.pg_attribute t ON t.attrelid = c.oid, pg_catalog.aclexplode(t.attacl) a
						WHERE c.relnamespace = 'payidem'::regnamespace AND a.grantee = _revoke_reader_grants.role::oid) THEN
		EXECUTE format('REVOKE USAGE ON SCHEMA payidem FROM %I', role_name);
	END IF;
END
$$;

CREATE FUNCTION payidem.revoke_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role, to_grant => false);
BEGIN
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.auditor_role a WHERE a.role = revoke_auditor.role;
	IF NOT FOUND THEN
		PERFORM payidem._raise('PI009', format('role %s is not an auditor', role),
			hint => 'payidem.auditor_role lists the roles grant_auditor() has made auditors.');
	END IF;
	-- what grant_auditor() granted, except what a merchant mapping still needs
	EXECUTE format('REVOKE SELECT ON %s FROM %I', payidem._reader_tables(false), v_role);
	EXECUTE format('REVOKE EXECUTE ON FUNCTION payidem.verify(), payidem._balances(text) FROM %I', v_role);
	PERFORM payidem._revoke_reader_grants(role, v_role);
END
$$;
COMMENT ON FUNCTION payidem.revoke_auditor(regrole) IS
	'Undo grant_auditor(): the role no longer sees every merchant''s rows (a merchant mapping it has stays); a role left with no mapping keeps no payidem grant grant_auditor() gave.';

-- Refused (22023, nothing mapped) if the role, a member of it or a role it is
-- a member of may execute an API function other than get_order() and
-- find_order(): see _app_merchant_roles().
CREATE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
	a record;
BEGIN
	PERFORM payidem._open_merchant_for_update(map_merchant_role.merchant_no, 'is mapped to no reporting role');
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON %s TO %I', payidem._reader_tables(true), v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.merchant_role (role, merchant_no)
	VALUES (map_merchant_role.role, map_merchant_role.merchant_no) ON CONFLICT DO NOTHING;
	-- (after the mapping, as in grant_app(); an error takes it back)
	SELECT * INTO a FROM payidem._app_merchant_roles() x
	 WHERE x.mapped_role = map_merchant_role.role AND x.merchant_no = map_merchant_role.merchant_no LIMIT 1;
	IF FOUND THEN
		PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function,
												  'map_merchant_role()');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.map_merchant_role(regrole, text) IS
	'Let a reporting role read the orders, payments, refunds and anomalies of one merchant (row-level security). Refused (22023) for a role that may execute an API function other than get_order/find_order (grant_app), itself, through a role it is a member of or through a member.';

CREATE FUNCTION payidem.unmap_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role, to_grant => false);
BEGIN
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.merchant_role r
	 WHERE r.role = unmap_merchant_role.role AND r.merchant_no OPERATOR(pg_catalog.=) unmap_merchant_role.merchant_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise('PI009', format('role %s is not mapped to merchant %s', role,
			coalesce(quote_literal(left(unmap_merchant_role.merchant_no, 64)), 'NULL')));
	END IF;
	PERFORM payidem._revoke_reader_grants(role, v_role);
END
$$;
COMMENT ON FUNCTION payidem.unmap_merchant_role(regrole, text) IS
	'Remove a reporting role''s access to one merchant''s rows; after its last merchant (and not an auditor), the role keeps no payidem grant map_merchant_role() gave.';

-- (end of merchant functions)

