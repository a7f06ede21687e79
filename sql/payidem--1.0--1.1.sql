-- payidem 1.0 -> 1.1 (ALTER EXTENSION payidem UPDATE TO '1.1').  Every change
-- made to sql/parts/ since 1.0, in the same words.
\echo Use "ALTER EXTENSION payidem UPDATE TO '1.1'" to load this file. \quit

-- observability: which version the loaded shared library is
CREATE FUNCTION payidem.library_version()
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_library_version'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.library_version() IS
	'The version the loaded payidem library was built as; pg_extension.extversion is the version of the SQL objects, which ALTER EXTENSION payidem UPDATE brings up to it.';
REVOKE ALL ON FUNCTION payidem.library_version() FROM PUBLIC;

-- roles: a role that is no longer an auditor nor mapped to a merchant keeps
-- none of the grants grant_auditor() and map_merchant_role() gave it

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
				 'payidem.notify_event, payidem.notification_backlog' END;
COMMENT ON FUNCTION payidem._reader_tables(boolean) IS
	'Internal: what map_merchant_role() (true) and grant_auditor() (both) grant SELECT on, as a list for GRANT and REVOKE.';
REVOKE ALL ON FUNCTION payidem._reader_tables(boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem.grant_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON %s, %s TO %I', payidem._reader_tables(false),
				   payidem._reader_tables(true), v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.auditor_role (role) VALUES (grant_auditor.role) ON CONFLICT DO NOTHING;
END
$$;

CREATE OR REPLACE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	PERFORM payidem._merchant_for_update(map_merchant_role.merchant_no);
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON %s TO %I', payidem._reader_tables(true), v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.merchant_role (role, merchant_no)
	VALUES (map_merchant_role.role, map_merchant_role.merchant_no) ON CONFLICT DO NOTHING;
END
$$;

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
REVOKE ALL ON FUNCTION payidem._revoke_reader_grants(regrole, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem.revoke_auditor(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role, to_grant => false);
BEGIN
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.auditor_role a WHERE a.role = revoke_auditor.role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role % is not an auditor', role USING
			ERRCODE = 'PI009',
			HINT = 'payidem.auditor_role lists the roles grant_auditor() has made auditors.';
	END IF;
	-- what grant_auditor() granted, except what a merchant mapping still needs
	EXECUTE format('REVOKE SELECT ON %s FROM %I', payidem._reader_tables(false), v_role);
	PERFORM payidem._revoke_reader_grants(role, v_role);
END
$$;
COMMENT ON FUNCTION payidem.revoke_auditor(regrole) IS
	'Undo grant_auditor(): the role no longer sees every merchant''s rows (a merchant mapping it has stays); a role left with no mapping keeps no payidem grant grant_auditor() gave.';

CREATE OR REPLACE FUNCTION payidem.unmap_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role, to_grant => false);
BEGIN
	PERFORM payidem._forget_dropped_roles();
	DELETE FROM payidem.merchant_role r
	 WHERE r.role = unmap_merchant_role.role AND r.merchant_no OPERATOR(pg_catalog.=) unmap_merchant_role.merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role % is not mapped to merchant %', role,
			coalesce(quote_literal(left(unmap_merchant_role.merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009';
	END IF;
	PERFORM payidem._revoke_reader_grants(role, v_role);
END
$$;
COMMENT ON FUNCTION payidem.unmap_merchant_role(regrole, text) IS
	'Remove a reporting role''s access to one merchant''s rows; after its last merchant (and not an auditor), the role keeps no payidem grant map_merchant_role() gave.';

-- logical replication of every table (FOR ALL TABLES): a subscriber skips the
-- built-in whitelist rows it has and the payment keys it makes itself
CREATE OR REPLACE FUNCTION payidem._whitelist_guard()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_in_use boolean := false;
	v_present boolean;
BEGIN
	IF TG_OP = 'TRUNCATE' THEN
		RAISE EXCEPTION 'payidem.% cannot be truncated', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = 'It holds the built-in state machines that payidem''s functions rely on.',
			HINT = 'Delete your own rows: DELETE FROM payidem.' || TG_TABLE_NAME || ' WHERE NOT builtin.';
	END IF;
	IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.builtin THEN
		RAISE EXCEPTION 'built-in rows of payidem.% cannot be changed or deleted', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s is built in: payidem''s functions rely on it, and CREATE EXTENSION recreates it on a restore.',
							TG_TABLE_NAME, to_jsonb(OLD) - 'builtin'),
			HINT = 'Add statuses and transitions of your own; only rows with builtin = false can be changed or deleted.';
	END IF;
	-- (nested: PL/pgSQL may evaluate every operand of an AND, and a
	-- transition row has no status field)
	IF TG_TABLE_NAME = 'state' AND TG_OP IN ('UPDATE', 'DELETE') THEN
		IF TG_OP = 'DELETE' THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		ELSIF (NEW.entity, NEW.status) IS DISTINCT FROM (OLD.entity, OLD.status) THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		END IF;
	END IF;
	IF v_in_use THEN
		RAISE EXCEPTION 'status % of % is in use', quote_literal(OLD.status), OLD.entity USING
			ERRCODE = 'foreign_key_violation',
			DETAIL = format('Rows of payidem.%s have status %L; the whitelist cannot lose it.',
							CASE OLD.entity WHEN 'order' THEN '"order"' ELSE OLD.entity END, OLD.status),
			HINT = format('Move them to another status first (payidem.transit_%s), or keep the status.', OLD.entity);
	END IF;
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	-- a built-in row that a load in session_replication_role = replica brings
	-- (a logical-replication subscriber's initial copy) and that this
	-- database's own CREATE EXTENSION made already: skipped, not refused
	IF NEW.builtin AND TG_OP = 'INSERT' AND current_setting('session_replication_role') = 'replica' THEN
		EXECUTE format('SELECT EXISTS (SELECT 1 FROM payidem.%I x WHERE to_jsonb(x) = $1)', TG_TABLE_NAME)
			INTO v_present USING to_jsonb(NEW);
		IF v_present THEN
			RETURN NULL;
		END IF;
	END IF;
	IF NEW.builtin THEN
		RAISE EXCEPTION 'only CREATE EXTENSION installs built-in rows' USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s has builtin = true.', TG_TABLE_NAME, to_jsonb(NEW) - 'builtin'),
			HINT = 'Insert it with builtin = false (the default), so that pg_dump keeps it.';
	END IF;
	IF TG_TABLE_NAME = 'transition' THEN
		IF EXISTS (SELECT 1 FROM payidem.state s
					WHERE s.entity = NEW.entity AND s.status = NEW.from_status AND s.terminal) THEN
			RAISE EXCEPTION 'a transition cannot leave a terminal status' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: ''%s'' is terminal in payidem.state; the transition was ''%s'' -> ''%s''.',
								NEW.entity, NEW.from_status, NEW.from_status, NEW.to_status),
				HINT = 'Leave from a status that is not terminal, or add your own status for the new path.';
		END IF;
	ELSIF NEW.terminal THEN
		IF EXISTS (SELECT 1 FROM payidem.transition t
					WHERE t.entity = NEW.entity AND t.from_status = NEW.status) THEN
			RAISE EXCEPTION 'a status that transitions leave cannot be terminal' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: transitions in payidem.transition leave ''%s''.', NEW.entity, NEW.status),
				HINT = 'Delete those transitions first, or keep the status non-terminal.';
		END IF;
	END IF;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION payidem._whitelist_guard() IS
	'Trigger on payidem.state and payidem.transition: built-in rows are fixed; no transition leaves a terminal status; a status rows have is not deleted or renamed.';

-- The keys a logical-replication worker receives (a publication FOR ALL
-- TABLES or TABLES IN SCHEMA payidem includes them): skipped, as the
-- subscriber's status_keys makes them from the payments it receives
-- (src/flow.c).  ENABLE REPLICA: it fires in session_replication_role =
-- replica only, where such a worker writes.
CREATE FUNCTION payidem._payment_keys_received()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_received'
LANGUAGE C;
REVOKE ALL ON FUNCTION payidem._payment_keys_received() FROM PUBLIC;
COMMENT ON FUNCTION payidem._payment_keys_received() IS
	'Trigger keys_received on payidem.payment_pending and payidem.payment_paid: a logical-replication worker''s rows are skipped; the subscriber''s status_keys makes its keys from its payments.';
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_pending
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_received;
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_paid
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_received;
-- A TRUNCATE of a key table such a worker applies: the table made again from
-- the subscriber's payments (src/flow.c).
CREATE FUNCTION payidem._payment_keys_truncated()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_truncated'
LANGUAGE C;
REVOKE ALL ON FUNCTION payidem._payment_keys_truncated() FROM PUBLIC;
COMMENT ON FUNCTION payidem._payment_keys_truncated() IS
	'Trigger keys_truncated on payidem.payment_pending and payidem.payment_paid: a TRUNCATE a logical-replication worker applies is followed by the keys of the subscriber''s payments.';
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_pending
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_truncated;
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_paid
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_truncated;
-- No replica identity: the rows go only where payidem's C code (the trigger,
-- the rebuild) writes them, below the executor, and a publication that
-- includes the tables then sends their inserts (which a subscriber skips)
-- and no delete (which it would not find: its own trigger removed the row).
ALTER TABLE payidem.payment_pending REPLICA IDENTITY NOTHING;
ALTER TABLE payidem.payment_paid REPLICA IDENTITY NOTHING;

-- the rebuild empties the keys below the executor, as the trigger does
COMMENT ON FUNCTION payidem._payment_keys_fill() IS
	'Internal (rebuild_payment_keys): payidem.payment_pending and payidem.payment_paid emptied and made again from every payment, as trigger status_keys makes them; how many rows.';
CREATE OR REPLACE FUNCTION payidem.rebuild_payment_keys()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.payment IN SHARE MODE;
	RETURN payidem._payment_keys_fill();
END
$$;

-- The replication payidem sees (DESIGN section 12), for monitoring
CREATE FUNCTION payidem.replication_mode()
RETURNS TABLE (mode text, synchronous_standby_names text, synchronous_commit text,
			   require_synchronous_standby boolean, writes_allowed boolean, timeline integer)
AS 'MODULE_PATHNAME', 'payidem_replication_mode'
LANGUAGE C STABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem.replication_mode() IS
	'The replication payidem sees in this session: mode standby (in recovery), synchronous (synchronous_standby_names set and synchronous_commit on or remote_apply) or asynchronous; the two settings; payidem.require_synchronous_standby; whether payidem''s writes are allowed; the WAL timeline (NULL on a standby).';
REVOKE ALL ON FUNCTION payidem.replication_mode() FROM PUBLIC;

-- closed merchants, control characters, durations: the checks of names,
-- subjects and codes refuse control characters in one place
-- (_check_no_controls); _check_duration is the C check idem_claim and
-- idem_purge use too; a closed merchant gets no new secret, binding or role

-- A duration argument (an order's expiry, a secret's grace period): not NULL,
-- and now() plus it is after now (or now itself, where allow_zero) and at most
-- now() plus 100 years.  The end is what is checked: PostgreSQL compares
-- intervals counting a month as 30 days, but adds months and days to a time
-- by the calendar ('1 month -29 days' can end before it starts), and a sum past
-- the timestamp range is 22008, so each part is bounded before the sum.
-- 22023 for all of these.  In C (src/payidem.c, payidem_check_interval),
-- where idem_claim's lease and idem_purge's retention are checked by the same
-- code: the rule is written once.
CREATE OR REPLACE FUNCTION payidem._check_duration(message text, what text, value interval,
										allow_zero boolean, hint text)
RETURNS interval
AS 'MODULE_PATHNAME', 'payidem_check_duration'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_duration(text, text, interval, boolean, text) IS
	'Internal: value, if now() plus it is after now() (or now() itself, where allow_zero) and at most 100 years later, each of its parts within 100 years; 22023 with message, the value in DETAIL and hint otherwise.';

-- The one rule for a name or description a person reads (a merchant's name,
-- an order's subject, the codes _check_code checks): no control character
-- (tab, line break, U+0000 to U+001F, DEL).  22023 with the value escaped in
-- DETAIL, never its raw bytes.  In C (src/payidem.c), as the escaping of
-- values in payidem's C errors is.
CREATE FUNCTION payidem._check_no_controls(message text, what text, value text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_check_no_controls'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_no_controls(text, text, text) IS
	'Internal: value, unless it holds a control character (tab, line break, U+0000 to U+001F, DEL): 22023 with message and the value escaped in DETAIL.';
REVOKE ALL ON FUNCTION payidem._check_no_controls(text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem._check_code(what text, value text, pattern text, rule text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._check_no_controls('invalid ' || what, 'The value', value);
	IF value IS NULL OR value !~ pattern THEN
		RAISE EXCEPTION 'invalid %', what USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The value was %s; %s', coalesce(quote_literal(left(value, 64)), 'NULL'), rule);
	END IF;
	RETURN value;
END
$$;

-- The attributes of a new merchant (create_merchant, and its copies on shards).
CREATE OR REPLACE FUNCTION payidem._check_merchant_fields(name text, merchant_type text, fee_rate numeric,
	settle_cycle text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF name IS NULL OR length(btrim(name)) NOT BETWEEN 1 AND 128 THEN
		RAISE EXCEPTION 'invalid merchant name' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The name was %s; it must have 1 to 128 characters.', coalesce(quote_literal(left(name, 64)), 'NULL'));
	END IF;
	PERFORM payidem._check_no_controls('invalid merchant name', 'The name', name);
	PERFORM payidem._check_code('merchant type', merchant_type, '^[a-z][a-z0-9_]{0,31}$',
		'a merchant type is a lower-case code such as retail or catering.');
	PERFORM payidem._check_rate('merchant fee', fee_rate);
	PERFORM payidem._check_code('settlement cycle', settle_cycle, '^[TD][0-9]{1,2}$',
		'a settlement cycle is T<n> or D<n>, e.g. T1 or D0.');
END
$$;

-- The same, for a change a closed merchant no longer takes (closed is final):
-- a new API secret, a channel binding, a reporting role.  PI004 if it is
-- closed; action says what it is refused.
CREATE FUNCTION payidem._open_merchant_for_update(p_merchant_no text, action text)
RETURNS payidem.merchant
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant := payidem._merchant_for_update(p_merchant_no);
BEGIN
	IF m.status = 'closed' THEN
		RAISE EXCEPTION 'merchant % is closed', m.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status closed; a closed merchant %s.', m.merchant_no, action),
			HINT = 'A closed merchant stays closed; create a new merchant instead.';
	END IF;
	RETURN m;
END
$$;
REVOKE ALL ON FUNCTION payidem._open_merchant_for_update(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem.rotate_merchant_secret(merchant_no text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m        payidem.merchant;
	v_next   integer;
	v_secret text;
	v_sealed record;
BEGIN
	PERFORM payidem._check_duration('invalid grace period', 'The grace period', grace, true,
									'The default is ''24 hours''; 0 ends the previous secret now.');
	m := payidem._open_merchant_for_update(rotate_merchant_secret.merchant_no, 'gets no new API secret');

	-- secrets still in an earlier grace window end now: only current + previous stay valid
	UPDATE payidem.merchant_secret s
	   SET valid_until = greatest(now(), s.valid_from + interval '1 microsecond')
	 WHERE s.merchant_no = m.merchant_no AND s.valid_until > now();
	-- the current secret gets the grace window
	UPDATE payidem.merchant_secret s
	   SET valid_until = greatest(now() + grace, s.valid_from + interval '1 microsecond')
	 WHERE s.merchant_no = m.merchant_no AND s.valid_until IS NULL;

	SELECT coalesce(max(s.secret_version), 0) + 1 INTO v_next
	  FROM payidem.merchant_secret s WHERE s.merchant_no = m.merchant_no;
	v_secret := payidem._random_secret();
	v_sealed := payidem._seal(payidem._secret_aad(m.merchant_no, v_next), convert_to(v_secret, 'UTF8'));
	INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag)
	VALUES (m.merchant_no, v_next, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag);
	UPDATE payidem.merchant SET updated_at = now() WHERE payidem.merchant.merchant_no = m.merchant_no;
	RETURN v_secret;
END
$$;
COMMENT ON FUNCTION payidem.rotate_merchant_secret(text, interval) IS
	'New API secret (returned once); the previous one stays valid for the grace period, older ones end now.';

CREATE OR REPLACE FUNCTION payidem.bind_channel(merchant_no text, channel_no text, fee_rate numeric DEFAULT NULL,
	single_limit bigint DEFAULT NULL, daily_limit bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
	c payidem.channel;
BEGIN
	m := payidem._open_merchant_for_update(bind_channel.merchant_no, 'is bound to no channel');
	c := payidem._channel_for_update(bind_channel.channel_no);
	IF bind_channel.fee_rate IS NOT NULL THEN
		PERFORM payidem._check_rate('merchant fee', bind_channel.fee_rate);
	END IF;
	PERFORM payidem._check_limit('single limit', single_limit);
	PERFORM payidem._check_limit('daily limit', daily_limit);
	IF single_limit > daily_limit THEN
		RAISE EXCEPTION 'single limit exceeds daily limit' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The single limit was %s and the daily limit %s.', single_limit, daily_limit);
	END IF;
	IF c.allowed_merchant_types IS NOT NULL AND NOT m.merchant_type = ANY (c.allowed_merchant_types) THEN
		RAISE EXCEPTION 'channel % does not admit merchants of type %', c.channel_no, m.merchant_type USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s admits %s; merchant %s is %s.', c.channel_no,
							array_to_string(c.allowed_merchant_types, ', '), m.merchant_no, m.merchant_type),
			HINT = 'Bind a channel that admits this merchant type, or change the channel''s allowed_merchant_types.';
	END IF;
	INSERT INTO payidem.merchant_channel AS b (merchant_no, channel_no, fee_rate, single_limit, daily_limit)
	VALUES (m.merchant_no, c.channel_no, bind_channel.fee_rate, bind_channel.single_limit, bind_channel.daily_limit)
	ON CONFLICT ON CONSTRAINT merchant_channel_pkey DO UPDATE
	   SET fee_rate = excluded.fee_rate, single_limit = excluded.single_limit,
		   daily_limit = excluded.daily_limit, status = 'active', updated_at = now();
END
$$;
COMMENT ON FUNCTION payidem.bind_channel(text, text, numeric, bigint, bigint) IS
	'Let a merchant use a channel, with an optional own rate and limits (binding again updates them and re-activates).';

CREATE OR REPLACE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_role name := payidem._check_role(role);
BEGIN
	PERFORM payidem._open_merchant_for_update(map_merchant_role.merchant_no, 'is mapped to no reporting role');
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', v_role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO %I', v_role);
	EXECUTE format('GRANT SELECT ON %s TO %I', payidem._reader_tables(true), v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.merchant_role (role, merchant_no)
	VALUES (map_merchant_role.role, map_merchant_role.merchant_no) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.map_merchant_role(regrole, text) IS
	'Let a reporting role read the orders, payments, refunds and anomalies of one merchant (row-level security).';

CREATE OR REPLACE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no text := create_order.merchant_no;
	v_out_trade_no text := create_order.out_trade_no;
	v_amount bigint := create_order.amount;
	v_subject text := create_order.subject;
	v_status text;
	v_order_no text;
	o payidem."order";
BEGIN
	PERFORM payidem._require('merchant_no', create_order.merchant_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		RAISE EXCEPTION 'invalid order amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be a positive number of minor units (fen, cents).',
							coalesce(v_amount::text, 'NULL')),
			HINT = 'Pass 12.50 CNY as 1250.';
	END IF;
	IF v_subject IS NULL OR NOT payidem._fits(v_subject, 'payidem.order_subject') THEN
		RAISE EXCEPTION 'invalid order subject' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The subject was %s; it must have 1 to 256 characters (not only spaces).',
							coalesce(quote_literal(left(v_subject, 64)), 'NULL')),
			HINT = 'Describe what is being paid for, e.g. ''Green tea 250 g''.';
	END IF;
	PERFORM payidem._check_no_controls('invalid order subject', 'The subject', v_subject);
	IF v_out_trade_no IS NULL OR NOT payidem._fits(v_out_trade_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_trade_no', v_out_trade_no, 'payidem.merchant_ref',
										'Use the merchant''s own order number, e.g. SHOP-20261129-0001.');
	END IF;
	PERFORM payidem._check_duration('invalid expiry', 'expire_in', expire_in, false,
									'The default is ''2 hours''.');
	IF NOT payidem._fits(notify_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('notify_url', notify_url, 'payidem.http_url',
										'Pass NULL for no merchant notification.');
	END IF;
	IF NOT payidem._fits(return_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('return_url', return_url, 'payidem.http_url', 'Pass NULL for none.');
	END IF;
	IF NOT payidem._fits(body, 'payidem.order_body') THEN
		RAISE EXCEPTION 'invalid order body' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The body has %s characters; at most 1024 are allowed.', length(body));
	END IF;

	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = v_merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(v_merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
	END IF;
	IF v_status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', v_merchant_no, v_status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', v_merchant_no, v_status),
			HINT = 'Only active merchants take orders.';
	END IF;

	-- the unique constraint decides between concurrent first calls; the loser
	-- waits for the winner's commit, then reads its row below
	INSERT INTO payidem."order" AS x (order_no, merchant_no, out_trade_no, subject, body, amount,
									  notify_url, return_url, expire_at)
	VALUES (payidem.gen_order_no('PO'), v_merchant_no, v_out_trade_no, v_subject, create_order.body, v_amount,
			create_order.notify_url, create_order.return_url, now() + expire_in)
	ON CONFLICT ON CONSTRAINT order_out_trade_no_key DO NOTHING
	RETURNING x.order_no INTO v_order_no;
	IF v_order_no IS NOT NULL THEN
		RETURN v_order_no;
	END IF;

	SELECT * INTO o FROM payidem."order" x
	 WHERE x.merchant_no = v_merchant_no AND x.out_trade_no = v_out_trade_no;
	IF NOT FOUND THEN	-- cannot happen: the conflicting row is committed and never deleted
		RAISE EXCEPTION 'order % of merchant % vanished', v_out_trade_no, v_merchant_no;
	END IF;
	IF o.amount <> v_amount THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another amount', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has amount %s; this call asked for %s.',
							o.order_no, v_merchant_no, v_out_trade_no, o.amount, v_amount),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	IF o.subject <> v_subject THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another subject', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has subject %L; this call asked for %L.',
							o.order_no, v_merchant_no, v_out_trade_no, left(o.subject, 64), left(v_subject, 64)),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	RETURN o.order_no;
END
$$;
COMMENT ON FUNCTION payidem.create_order(text, text, bigint, text, text, text, interval, text) IS
	'New pending order (order_no = gen_order_no(''PO'')). Idempotent on (merchant_no, out_trade_no): the same amount and subject return the existing order_no, others raise PI001. PI009 unknown merchant, PI004 merchant not active, 22023 bad input.';

-- A success reported for a payment number that names no payment (lost in an
-- asynchronous failover, or never made here) raises one anomaly per number
-- and transaction id, however often the channel repeats it, also when two
-- deliveries arrive at once.  The number is in detail: payment_no and
-- order_no name rows that exist (foreign keys), and there is none.
CREATE UNIQUE INDEX anomaly_unknown_transaction_once ON payidem.anomaly
	((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
	WHERE kind = 'unknown_transaction';

-- apply_payment_result(): what a result does is decided once, in C
-- (src/payment_decision.c), for the C fast path and the PL/pgSQL fallback
-- alike: the arguments' check, the verdict (a success for a number of this
-- shard that names no payment is rejected with one unknown_transaction
-- anomaly, not PI009), the fees
DROP FUNCTION payidem._fee(bigint, numeric);
DROP FUNCTION payidem._check_paid_at(text, timestamptz, timestamptz);
DROP FUNCTION payidem._paid_at_ok(timestamptz, timestamptz);
-- What a payment result does, decided once (src/payment_decision.c) for
-- apply_payment_result()'s C fast path and for _apply_payment_result() below:
-- the arguments' check, the verdict, the fees.
CREATE OR REPLACE FUNCTION payidem._check_payment_result_args(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_check_payment_result_args'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_payment_result_args(text, text, text, text, bigint, timestamptz) IS
	'Internal to apply_payment_result(): raises the error (22023, or PI009/22023 from _check_number) for the first invalid argument.';
CREATE FUNCTION payidem._decide_payment_result(payment_no text, status text, amount bigint,
	transaction_id text, paid_at timestamptz, payment_status text, payment_amount bigint,
	payment_transaction_id text, payment_created_at timestamptz, order_status text,
	transaction_id_taken boolean, OUT verdict text, OUT anomaly_kind text)
RETURNS record
AS 'MODULE_PATHNAME', 'payidem_decide_payment_result'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._decide_payment_result(text, text, bigint, text, timestamptz, text, bigint, text, timestamptz, text, boolean) IS
	'Internal to apply_payment_result(): the verdict on a valid report (applied, anomaly, duplicate, rejected, with the anomaly kind; not_found; read_order or check_transaction_id when that fact, NULL, is needed) from the payment (payment_status NULL: none) and order as read. 22023 for a paid_at outside the attempt''s lifetime.';
CREATE FUNCTION payidem._payment_fees(amount bigint, merchant_rate numeric, binding_rate numeric,
	channel_rate numeric, OUT fee_amount bigint, OUT cost_amount bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'payidem_payment_fees'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._payment_fees(bigint, numeric, numeric, numeric) IS
	'Internal to apply_payment_result(): what the merchant pays (the binding''s rate, else the merchant''s) and what the channel costs on amount, rounded half-up.';
REVOKE ALL ON FUNCTION payidem._decide_payment_result(text, text, bigint, text, timestamptz, text, bigint, text, timestamptz, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._payment_fees(bigint, numeric, numeric, numeric) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem._apply_payment_result(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- aliases, not copies: a copy is an expression, set up again in every
	-- transaction
	v_payment_no ALIAS FOR $1;
	v_source ALIAS FOR $2;
	v_status ALIAS FOR $3;
	v_txn ALIAS FOR $4;
	v_amount ALIAS FOR $5;
	v_reported_at ALIAS FOR $6;
	v_paid_at timestamptz;
	v_order_no text;
	v_other text;
	v_taken boolean;
	v_order_status text;
	v_order_paid_by text;
	v_order_row tid;
	v_merchant_rate numeric;
	v_binding_rate numeric;
	v_channel_rate numeric;
	d record;					-- the verdict and the anomaly kind
	f record;					-- the fees
	p record;					-- the payment's columns this function reads
BEGIN
	PERFORM payidem._check_payment_result_args(v_payment_no, v_source, v_status, v_txn, v_amount, v_reported_at);
	-- A repeated success is answered from the committed row, without a lock:
	-- from a paid status, a payment only moves on to other paid statuses,
	-- which answer a success the same way.
	IF v_status = 'succeeded' THEN
		SELECT x.status, x.amount, x.transaction_id, x.created_at INTO p
		  FROM payidem.payment x WHERE x.payment_no = v_payment_no;
		IF FOUND AND (SELECT y.verdict = 'duplicate'
						FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 p.status, p.amount, p.transaction_id, p.created_at,
															 NULL, NULL) y) THEN
			RETURN 'duplicate';
		END IF;
	END IF;

	SELECT x.order_no INTO v_order_no FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF NOT FOUND THEN
		-- a success for a number of this shard: unknown_transaction, one
		-- anomaly per number and transaction id (its unique index: a repeat,
		-- or a delivery at the same moment, adds none)
		SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 NULL, NULL, NULL, NULL, NULL, NULL);
		IF d.verdict = 'rejected' THEN
			INSERT INTO payidem.anomaly (kind, amount, detail)
			VALUES (d.anomaly_kind, v_amount,
					jsonb_build_object('reported_payment_no', v_payment_no, 'transaction_id', v_txn,
									   'reported_amount', v_amount, 'source', v_source,
									   'paid_at', coalesce(v_reported_at, now()),
									   'action', 'ask the channel which payment this is; refund it at the channel if none of ours was made for it',
									   'raw', payidem._flow_raw(raw)))
			ON CONFLICT ((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
				WHERE kind = 'unknown_transaction' DO NOTHING;
			RETURN 'rejected';
		END IF;
		RAISE EXCEPTION 'payment % does not exist', coalesce(quote_literal(left(v_payment_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.payment has no row with that payment_no.';
	END IF;
	-- The lock order of every flow function (docs/payment-flow.md): the
	-- order, then its payment.  Only a success changes the order; a failure
	-- or close report locks the payment alone.  FOR NO KEY UPDATE, as an
	-- UPDATE that keeps the key locks: the KEY SHARE locks that inserts of
	-- payments, refunds and anomalies take on their order and payment
	-- through the foreign keys do not wait for it (a FOR UPDATE lock would
	-- make refund(), which holds the payment, wait for the order).
	IF v_status = 'succeeded' THEN
		-- the order, locked (its number never changes), and the rates of the fees
		SELECT x.ctid, x.status, x.paid_payment_no, m.fee_rate, b.fee_rate, c.fee_rate
		  INTO v_order_row, v_order_status, v_order_paid_by, v_merchant_rate, v_binding_rate, v_channel_rate
		  FROM payidem."order" x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
		  JOIN payidem.payment y ON y.payment_no = v_payment_no
		  JOIN payidem.channel c ON c.channel_no = y.channel_no
		  LEFT JOIN payidem.merchant_channel b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
		 WHERE x.order_no = v_order_no
		   FOR NO KEY UPDATE OF x;
	END IF;
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
														 p.status, p.amount, p.transaction_id, p.created_at,
														 v_order_status, NULL);
	IF d.verdict = 'check_transaction_id' THEN
		-- two deliveries carrying one transaction id for two payments: the
		-- second waits until the first commits, then (READ COMMITTED: a new
		-- snapshot per statement) finds its row below.  The C path of
		-- apply_payment_result() takes the same lock.
		IF NOT payidem._lock_transaction_id(p.channel_no, v_txn, false) THEN
			PERFORM payidem._lock_transaction_id(p.channel_no, v_txn, true);
			IF current_setting('transaction_isolation') <> 'read committed' THEN
				RAISE EXCEPTION 'transaction id % is being applied to another payment at the same time', quote_literal(v_txn) USING
					ERRCODE = 'serialization_failure',
					DETAIL = format('Payment %s waited for another delivery of %s on channel %s; this transaction''s snapshot cannot see its outcome.',
									p.payment_no, quote_literal(v_txn), p.channel_no),
					HINT = 'Retry the transaction, or apply results in READ COMMITTED.';
			END IF;
		END IF;
		SELECT x.payment_no INTO v_other FROM payidem.payment_paid x
		 WHERE x.channel_no = p.channel_no AND x.transaction_id = v_txn AND x.payment_no <> p.payment_no;
		v_taken := FOUND;
		SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 p.status, p.amount, p.transaction_id, p.created_at,
															 v_order_status, v_taken);
	END IF;

	IF d.verdict = 'duplicate' THEN
		RETURN 'duplicate';		-- applied meanwhile, by the delivery we waited for
	ELSIF d.verdict = 'rejected' THEN
		-- A refusal changes nothing but one anomaly row, and a repeat of the
		-- same refusal adds none.
		IF d.anomaly_kind IS NOT NULL AND NOT EXISTS (
				SELECT 1 FROM payidem.anomaly a
				 WHERE a.payment_no = p.payment_no AND a.kind = d.anomaly_kind AND a.handle_status = 'open'
				   AND a.detail @> jsonb_build_object('reported_status', v_status,
													  'reported_amount', v_amount,
													  'transaction_id', v_txn)) THEN
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN d.anomaly_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)));
		END IF;
		RETURN 'rejected';
	ELSIF d.verdict NOT IN ('applied', 'anomaly') THEN
		RAISE EXCEPTION 'payidem: unexpected verdict % on payment %', d.verdict, p.payment_no;
	ELSIF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		RETURN 'applied';
	END IF;

	-- The success recorded, and the order paid if it is pending (applied),
	-- else an anomaly asks for the money's refund.  The status and the fields
	-- in one update of the row we hold locked (then the order's): the
	-- status_guard trigger checks each change against the whitelist and logs
	-- it, exactly as for transit_payment(); one new row version each.  A
	-- direct update (src/flow.c) unless the table has statement triggers,
	-- rules or row security that applies: then the same UPDATE in SQL.
	v_paid_at := coalesce(v_reported_at, now());
	SELECT * INTO f FROM payidem._payment_fees(p.amount, v_merchant_rate, v_binding_rate, v_channel_rate);
	IF NOT payidem._record_payment_success(p.ctid, p.payment_no, v_txn, v_paid_at, f.fee_amount, f.cost_amount) THEN
		UPDATE payidem.payment x
		   SET status = 'succeeded', updated_at = now(),
			   transaction_id = v_txn, paid_at = v_paid_at,
			   fee_amount = f.fee_amount, cost_amount = f.cost_amount
		 WHERE x.payment_no = p.payment_no;
	END IF;
	IF d.verdict = 'applied' THEN
		IF NOT payidem._record_order_paid(v_order_row, p.order_no, p.payment_no, v_paid_at) THEN
			UPDATE payidem."order" x
			   SET status = 'paid', updated_at = now(),
				   paid_payment_no = p.payment_no, paid_at = v_paid_at
			 WHERE x.order_no = p.order_no;
		END IF;
	ELSE
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)));
	END IF;
	RETURN d.verdict;
END
$$;
COMMENT ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Internal to apply_payment_result(): the whole contract in PL/pgSQL, for every call apply_payment_result() does not decide itself.';
COMMENT ON FUNCTION payidem.apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Apply a channel''s word on a payment (source callback|query|close; status succeeded|failed|closed; a success needs its transaction_id and amount, a paid_at within the attempt''s lifetime) exactly once per payment and status. Returns applied, duplicate, anomaly (a late success of a closed or failed payment whose order is closed or paid otherwise: paid_after_close, duplicate_payment; the payment is recorded succeeded and refund() takes it) or rejected (amount_mismatch, transaction_conflict, conflicting_result, and unknown_transaction for a success of a number of this shard that names no payment: nothing changes but an anomaly row). PI009 for another report of an unknown payment.';

-- apply_refund_result(): a refund the channel completed is recorded whatever
-- the order's status; an order in a status a DBA added after paid keeps it
-- unless the whitelist allows the move (src/ledger.c accepts such an order's
-- refunded amount when it names the payment that paid it)
CREATE OR REPLACE FUNCTION payidem.apply_refund_result(refund_no text, status text, channel_refund_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_refund_no text := apply_refund_result.refund_no;
	v_status text := apply_refund_result.status;
	v_crid text := apply_refund_result.channel_refund_id;
	v_payment_no text;
	v_order_no text;
	v_refunded bigint;
	v_order_refunded bigint;
	v_order_status text;
	p payidem.payment;
	r payidem.refund;
	o payidem."order";
BEGIN
	PERFORM payidem._check_number('refund', apply_refund_result.refund_no);
	IF v_status IS NULL OR v_status NOT IN ('succeeded', 'failed') THEN
		RAISE EXCEPTION 'invalid refund result status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be succeeded or failed.',
							coalesce(quote_literal(left(v_status, 64)), 'NULL'));
	END IF;
	IF NOT payidem._fits(v_crid, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('channel_refund_id', v_crid, 'payidem.channel_ref');
	END IF;

	-- the lock order of every flow function: the order (a success moves
	-- it), then the payment, then the refund; their numbers never change
	SELECT x.payment_no, x.order_no INTO v_payment_no, v_order_no FROM payidem.refund x WHERE x.refund_no = v_refund_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'refund % does not exist', coalesce(quote_literal(left(v_refund_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.refund has no row with that refund_no.';
	END IF;
	IF v_status = 'succeeded' THEN
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	SELECT * INTO r FROM payidem.refund x WHERE x.refund_no = v_refund_no FOR NO KEY UPDATE;

	IF r.status NOT IN ('pending', v_status) THEN
		-- succeeded and failed are both final: the other word comes too late
		IF v_status = 'succeeded' AND NOT EXISTS (
				SELECT 1 FROM payidem.anomaly a
				 WHERE a.payment_no = p.payment_no AND a.kind = 'refund_success_after_failure'
				   AND a.handle_status = 'open' AND a.detail @> jsonb_build_object('refund_no', r.refund_no)) THEN
			-- the channel says money went back on a refund we recorded as failed
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES ('refund_success_after_failure', p.order_no, p.payment_no, p.channel_no, r.amount,
					jsonb_build_object('refund_no', r.refund_no, 'channel_refund_id', v_crid));
		END IF;
		RETURN 'rejected';
	END IF;

	-- a repeat is answered from the refund's row, which we hold locked: it
	-- is the record of the decision (no idempotency key: DESIGN section 4)
	IF r.status = v_status THEN
		RETURN 'duplicate';
	END IF;

	IF v_status = 'failed' THEN
		PERFORM payidem.transit_refund(r.refund_no, 'failed');
		RETURN 'applied';
	END IF;

	-- The refund, its payment and (only if that payment paid it) the order,
	-- each row's status with its refunded amount, in one statement: the
	-- bookkeeping checks across rows see all three written also when they
	-- run at the end of each statement (SET CONSTRAINTS ... IMMEDIATE).
	-- status_guard checks and logs each status change.  The order's
	-- refunded amount always moves: a refund the channel completed is
	-- recorded whatever the order's status.  Its status becomes
	-- partially_refunded or refunded where the whitelist allows the move
	-- (always from paid and partially_refunded); an order in a status a DBA
	-- added after paid (shipping) without such a transition keeps it.
	v_refunded := p.refunded_amount + r.amount;
	v_order_refunded := o.refunded_amount + r.amount;
	v_order_status := CASE WHEN v_order_refunded >= o.amount THEN 'refunded' ELSE 'partially_refunded' END;
	IF o.status <> v_order_status AND NOT EXISTS (
			SELECT 1 FROM payidem.transition t
			 WHERE t.entity = 'order' AND t.from_status = o.status AND t.to_status = v_order_status) THEN
		v_order_status := o.status;
	END IF;
	WITH refund_done AS (
		UPDATE payidem.refund x
		   SET status = 'succeeded', refunded_at = now(), updated_at = now(),
			   channel_refund_id = coalesce(v_crid, x.channel_refund_id)
		 WHERE x.refund_no = r.refund_no
		RETURNING x.refund_no),
	payment_done AS (
		UPDATE payidem.payment x
		   SET refunded_amount = v_refunded, updated_at = now(),
			   status = CASE WHEN v_refunded >= p.amount THEN 'refunded' ELSE 'partially_refunded' END
		 WHERE x.payment_no = p.payment_no
		RETURNING x.payment_no)
	UPDATE payidem."order" x
	   SET refunded_amount = v_order_refunded, updated_at = now(), status = v_order_status
	 WHERE x.order_no = o.order_no AND o.paid_payment_no = p.payment_no;
	RETURN 'applied';
END
$$;
COMMENT ON FUNCTION payidem.apply_refund_result(text, text, text) IS
	'Apply a channel''s refund result (succeeded|failed) exactly once: succeeded moves the refunded amounts and statuses of the payment and, if that payment paid the order, of the order (an order in a status of a DBA''s, such as shipping, keeps it unless the whitelist allows its move to partially_refunded/refunded; its refunded amount moves). Returns applied, duplicate or rejected (the other final word came first).';

-- the bookkeeping of an order's own row: its paying payment never changes
-- once it left pending (src/ledger.c)
COMMENT ON FUNCTION payidem.ledger_row() IS
	'Trigger on payidem."order" and payidem.payment: a paid order names its payment and has paid_at; an order keeps its merchant, and the payment that paid it once it left pending; a succeeded payment has its transaction id, paid_at and fees; a status agrees with the refunded amount, which an order in another status than paid, partially_refunded or refunded (a DBA''s shipping) has only if it names the payment that paid it (PI002).';

-- notifications: a second signature scheme, v2, domain-separated from sign()
-- (HMAC-SHA256 of "payidem-notification-v2", a NUL byte and "<t>.<payload>",
-- src/crypto.c), beside v1 in the header; verify_notification() checks v2 only
-- A notification's v2 signature: HMAC-SHA256 of "payidem-notification-v2", a
-- NUL byte and the message, which no text (what sign() signs) can hold, so
-- the two never verify as each other (docs/notifications.md "Signature").
CREATE FUNCTION payidem._notify_v2_sign(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, message text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_notify_v2_sign'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE FUNCTION payidem._notify_v2_verify(aad text, key_version integer, nonce bytea, ciphertext bytea,
	auth_tag bytea, message text, signature text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_notify_v2_verify'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION payidem._notify_v2_sign(text, integer, bytea, bytea, bytea, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._notify_v2_verify(text, integer, bytea, bytea, bytea, text, text) FROM PUBLIC;

-- The signature: t=<unix seconds>,v1=<hex>,v2=<hex>, one v1 and v2 per secret
-- of the merchant valid now (two pairs during a rotation's grace period, the
-- current secret's first).  v2 = HMAC-SHA256(secret, "payidem-notification-v2"
-- NUL "<t>.<payload>") (_notify_v2_sign), which no sign() signature can be;
-- v1 = HMAC-SHA256(secret, "<t>.<payload>"), which is sign()'s of that text,
-- is kept for the receivers written for 1.0 and will be retired in a major
-- version (docs/notifications.md).  The only place a notification is signed.
CREATE OR REPLACE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_t text := floor(extract(epoch FROM now()))::bigint::text;
	v_sig text := 't=' || v_t;
	s payidem.merchant_secret;
BEGIN
	FOR s IN SELECT * FROM payidem._secrets_valid_now(p_merchant_no) ORDER BY secret_version DESC LOOP
		v_sig := v_sig || ',v1=' || payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
														s.key_version, s.nonce, s.ciphertext, s.auth_tag,
														v_t || '.' || p_payload)
					   || ',v2=' || payidem._notify_v2_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
															 s.key_version, s.nonce, s.ciphertext, s.auth_tag,
															 v_t || '.' || p_payload);
	END LOOP;
	RETURN v_sig;
END
$$;
COMMENT ON FUNCTION payidem._sign_notification(text, text) IS
	'Internal: the signature header of a notification payload, signed now: t, then v1 and v2 of each secret valid now (docs/notifications.md).';

CREATE OR REPLACE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	v_max_attempts constant integer := 16;		-- notify_result()'s schedule has 15 waits
	v_given_up bigint;
	n record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		RAISE EXCEPTION 'invalid max_rows' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			HINT = 'Pass how many events one worker takes at a time, e.g. 100.';
	END IF;
	-- a closed merchant's key signs nothing more: its due events are given
	-- up (failed), not handed out, and never hold up the others; so is an
	-- event whose last attempt was handed out and never answered
	WITH gone AS (
		SELECT e.event_id,
			   CASE WHEN m.status = 'closed' THEN 'merchant closed' ELSE 'no answer to the last attempt' END AS why
		  FROM payidem.notify_event e JOIN payidem.merchant m ON m.merchant_no = e.merchant_no
		 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
		   AND (m.status = 'closed' OR e.attempts >= v_max_attempts)
		   FOR UPDATE OF e SKIP LOCKED)
	UPDATE payidem.notify_event e
	   SET status = 'failed', next_attempt_at = NULL, last_response = gone.why
	  FROM gone WHERE e.event_id = gone.event_id;
	GET DIAGNOSTICS v_given_up = ROW_COUNT;
	IF v_given_up > 0 THEN
		PERFORM payidem._count('notify_failed', v_given_up);
	END IF;
	-- Events another worker holds are skipped.  Handing an event out is its
	-- next attempt (attempts counts hand-outs; the one handed out is named by
	-- attempt, and notify_result() takes reports of that one only) and
	-- leases it: its next_attempt_at moves ahead, so it is not handed out
	-- again after this transaction ends, until notify_result() or the lease
	-- runs out (a worker that died: that attempt had no answer).
	FOR n IN
		WITH due AS (
			SELECT e.event_id FROM payidem.notify_event e
			 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
			   AND e.attempts < v_max_attempts
			   AND NOT EXISTS (SELECT 1 FROM payidem.merchant m
								WHERE m.merchant_no = e.merchant_no AND m.status = 'closed')
			 ORDER BY e.next_attempt_at
			 LIMIT max_rows
			 FOR UPDATE SKIP LOCKED)
		UPDATE payidem.notify_event e
		   SET next_attempt_at = now() + v_lease, attempts = e.attempts + 1, last_attempt_at = now()
		  FROM due WHERE e.event_id = due.event_id
		RETURNING e.event_id, e.order_no, e.merchant_no, e.event, e.payload, e.attempts
	LOOP
		signature := payidem._sign_notification(n.merchant_no, n.payload);
		IF signature !~ ',v2=' THEN
			-- no secret of the merchant is valid now: nothing to sign with; the
			-- event waits (this was no attempt) and is not sent unsigned
			UPDATE payidem.notify_event e
			   SET attempts = e.attempts - 1, next_attempt_at = now() + interval '5 minutes',
				   last_response = 'no valid API secret'
			 WHERE e.event_id = n.event_id;
			CONTINUE;
		END IF;
		event_id := n.event_id;
		order_no := n.order_no;
		merchant_no := n.merchant_no;
		SELECT x.notify_url INTO notify_url FROM payidem."order" x WHERE x.order_no = n.order_no;
		event := n.event;
		payload := n.payload;
		attempt := n.attempts;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...,v2=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

-- The receiver's check, for tests and for merchants running PostgreSQL: a
-- signature header of the payload under a secret of api_key valid now, made
-- at most tolerance ago (or ahead: clocks differ).  Only v2 is checked: v1 is
-- sign()'s HMAC of "<t>.<payload>", which a merchant's own signed request of
-- that shape also is.  Other schemes in the header (v1 too) are ignored, as a
-- receiver should.
CREATE OR REPLACE FUNCTION payidem.verify_notification(api_key text, payload text, signature text,
											tolerance interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_part text;
	v_t text;
	v_sigs text[] := '{}';
	v_sig text;
	s payidem.merchant_secret;
	ok boolean := false;
BEGIN
	IF tolerance IS NULL OR tolerance < interval '0' THEN
		RAISE EXCEPTION 'invalid tolerance' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('tolerance was %s; it must be zero or more.', coalesce(tolerance::text, 'NULL')),
			HINT = 'Pass how old a notification may be, e.g. ''5 minutes''.';
	END IF;
	IF api_key IS NULL OR payload IS NULL OR signature IS NULL OR length(signature) > 1024 THEN
		RETURN false;
	END IF;
	FOREACH v_part IN ARRAY string_to_array(signature, ',') LOOP
		IF v_part ~ '^t=[0-9]{1,12}$' THEN
			IF v_t IS NOT NULL THEN
				RETURN false;		-- two timestamps: which one was signed?
			END IF;
			v_t := substr(v_part, 3);
		ELSIF v_part ~ '^v2=[0-9a-f]{64}$' THEN
			v_sigs := v_sigs || substr(v_part, 4);
		END IF;
	END LOOP;
	IF v_t IS NULL OR cardinality(v_sigs) = 0
	   OR abs(floor(extract(epoch FROM now())) - v_t::numeric) > extract(epoch FROM tolerance) THEN
		RETURN false;
	END IF;
	FOR s IN
		SELECT v.* FROM payidem.merchant m, payidem._secrets_valid_now(m.merchant_no) v
		 WHERE m.api_key OPERATOR(pg_catalog.=) verify_notification.api_key
	LOOP
		-- no early exit: the time taken does not say which secret or v2 matched
		FOREACH v_sig IN ARRAY v_sigs LOOP
			ok := payidem._notify_v2_verify(payidem._secret_aad(s.merchant_no, s.secret_version),
											s.key_version, s.nonce, s.ciphertext, s.auth_tag,
											v_t || '.' || payload, v_sig) OR ok;
		END LOOP;
	END LOOP;
	RETURN ok;
END
$$;
COMMENT ON FUNCTION payidem.verify_notification(text, text, text, interval) IS
	'true if a v2 of the signature header (t=...,v1=...,v2=...) signs its t and the payload under a secret of api_key valid now and t is within tolerance of now; false otherwise (a stale t, a changed byte, a rotated-out secret, a closed merchant, a header with no v2: v1 is not checked, since a sign() signature of "<t>.<payload>" is one).';

-- An application role is never also a merchant's reporting role: grant_app()
-- and map_merchant_role() refuse the combination (itself or through
-- membership), get_order()/find_order() refuse a role that is both (made by a
-- GRANT of membership, or by 1.0)

-- A role that both reads a merchant's rows (map_merchant_role(), itself or
-- through a role whose privileges it has) and may execute an API function
-- other than get_order() and find_order(): the rest of the API is not scoped
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
					 WHERE p.oid = x::oid AND p.proname NOT IN ('get_order', 'find_order')
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
REVOKE ALL ON FUNCTION payidem._app_merchant_roles(regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._refuse_app_merchant_role(regrole, regrole, text, regprocedure, text, boolean) FROM PUBLIC;
COMMENT ON FUNCTION payidem._refuse_app_merchant_role(regrole, regrole, text, regprocedure, text, boolean) IS
	'Internal: the error (22023 from grant_app()/map_merchant_role(), 42501 at a call) for a role that would be or is both an application role and a merchant''s reporting role.';

-- Refused (22023, nothing granted) if the role, a member of it or a role it
-- is a member of reads a merchant's rows: see _app_merchant_roles().
CREATE OR REPLACE FUNCTION payidem.grant_app(role regrole)
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

-- Refused (22023, nothing mapped) if the role, a member of it or a role it is
-- a member of may execute an API function other than get_order() and
-- find_order(): see _app_merchant_roles().
CREATE OR REPLACE FUNCTION payidem.map_merchant_role(role regrole, merchant_no text)
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

-- Who reads what: a caller row-level security does not apply to, or one
-- without SELECT on "order" (an application role), reads every order; a
-- caller that reads a merchant's rows (mapped itself or as a member of a
-- mapped role: a combination grant_app() and map_merchant_role() refuse, made
-- by a later GRANT of membership or before 1.1) is refused (42501), as the
-- rest of the API would act for every merchant for it; any other reads what
-- its row-level security shows it (the policies' rule, _row_visible): an
-- auditor everything, a role unmapped nothing.
CREATE OR REPLACE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
	a record;
BEGIN
	IF scoped THEN
		SELECT * INTO a FROM payidem._app_merchant_roles(caller) LIMIT 1;
		IF FOUND THEN
			PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function, NULL);
		END IF;
	END IF;
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		PERFORM payidem._check_number('order', _read_order.order_no);
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it)
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'order % does not exist', quote_literal(_read_order.order_no) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that order_no.';
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'merchant % has no order %', quote_literal(left(_read_order.merchant_no, 64)),
				quote_literal(left(_read_order.out_trade_no, 64)) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that merchant_no and out_trade_no.';
		END IF;
	END IF;
	RETURN payidem._order_json(o);
END
$$;
COMMENT ON FUNCTION payidem._read_order(text, text, text, regrole, boolean) IS
	'Internal to get_order() and find_order() (src/read_api.c): the order as JSON, if the caller may read it; PI009 otherwise.';

COMMENT ON FUNCTION payidem.get_order(text) IS
	'The order with its payment attempts and refunds, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number, 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

COMMENT ON FUNCTION payidem.find_order(text, text) IS
	'The order a merchant created with out_trade_no, as get_order() shows it. PI009 if there is none (or the caller''s row-level security hides it), 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

-- Nothing is refused retroactively: each role 1.0 let be both is named here,
-- and get_order()/find_order() refuse it from now on (42501)
DO $$
DECLARE
	a record;
BEGIN
	FOR a IN SELECT * FROM payidem._app_merchant_roles() LOOP
		PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function,
												  NULL, warn_only => true);
	END LOOP;
END
$$;
