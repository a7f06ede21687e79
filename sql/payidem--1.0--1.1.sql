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
