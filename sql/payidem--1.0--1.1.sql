-- payidem 1.0 -> 1.1 (ALTER EXTENSION payidem UPDATE TO '1.1').  Every change
-- made to sql/parts/ since 1.0, in the same words.
\echo Use "ALTER EXTENSION payidem UPDATE TO '1.1'" to load this file. \quit

-- #38: the shared checks raise their errors through one function each
-- (_raise_invalid: 22023, _raise_not_found: PI009), replacing the copies of
-- the same RAISE in the functions below and at the end of this script

-- The one RAISE of the checks: SQLSTATE, message, and DETAIL and HINT unless
-- NULL (RAISE refuses a NULL option).  The message is taken as it is (no %
-- placeholders).
CREATE FUNCTION payidem._raise(state text, message text, detail text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF detail IS NULL AND hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message;
	ELSIF hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail;
	ELSIF detail IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, HINT = hint;
	END IF;
	RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;
COMMENT ON FUNCTION payidem._raise(text, text, text, text) IS
	'Internal: raise an error with this SQLSTATE and message, and DETAIL and HINT unless NULL.';
-- 22023: a malformed argument; DETAIL says the value and the rule, HINT the fix.
CREATE FUNCTION payidem._raise_invalid(message text, detail text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE sql PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem._raise('22023', message, detail, hint); END;
COMMENT ON FUNCTION payidem._raise_invalid(text, text, text) IS
	'Internal: raise 22023 (invalid_parameter_value) with message, and DETAIL and HINT unless NULL.';
-- PI009 "<what> <value> does not exist": a text value quoted and cut at 64
-- characters as in every message, a number as it is, NULL as NULL; DETAIL
-- "<in_table> has no row with that <by_key>." unless in_table is NULL.
CREATE FUNCTION payidem._raise_not_found(what text, value anyelement, in_table text DEFAULT NULL,
	by_key text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._raise('PI009', format('%s %s does not exist', what,
		CASE WHEN value IS NULL THEN 'NULL' WHEN pg_typeof(value) = 'text'::regtype
			 THEN quote_literal(left(value::text, 64)) ELSE value::text END),
		in_table || ' has no row with that ' || by_key || '.', hint);
END
$$;
COMMENT ON FUNCTION payidem._raise_not_found(text, anyelement, text, text, text) IS
	'Internal: raise PI009 "<what> <value> does not exist", DETAIL naming the table and key searched.';
REVOKE ALL ON FUNCTION payidem._raise(text, text, text, text), payidem._raise_invalid(text, text, text),
	payidem._raise_not_found(text, anyelement, text, text, text) FROM PUBLIC;

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
		PERFORM payidem._raise('PI009', format('role %s is not an auditor', role),
			hint => 'payidem.auditor_role lists the roles grant_auditor() has made auditors.');
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
		PERFORM payidem._raise('PI009', format('role %s is not mapped to merchant %s', role,
			coalesce(quote_literal(left(unmap_merchant_role.merchant_no, 64)), 'NULL')));
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
-- (src/payment_keys.c).  ENABLE REPLICA: it fires in session_replication_role =
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
-- the subscriber's payments (src/payment_keys.c).
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
-- 22023 for all of these.  In C (src/util.c, payidem_check_interval),
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
-- DETAIL, never its raw bytes.  In C (src/util.c), as the escaping of
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
		PERFORM payidem._raise_invalid(format('invalid %s', what),
			format('The value was %s; %s', coalesce(quote_literal(left(value, 64)), 'NULL'), rule));
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
		PERFORM payidem._raise_invalid('invalid merchant name',
			format('The name was %s; it must have 1 to 128 characters.', coalesce(quote_literal(left(name, 64)), 'NULL')));
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
		PERFORM payidem._raise_invalid('single limit exceeds daily limit',
			format('The single limit was %s and the daily limit %s.', single_limit, daily_limit));
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
		PERFORM payidem._raise_invalid('invalid order amount',
			format('The amount was %s; it must be a positive number of minor units (fen, cents).',
				coalesce(v_amount::text, 'NULL')),
			'Pass 12.50 CNY as 1250.');
	END IF;
	IF v_subject IS NULL OR NOT payidem._fits(v_subject, 'payidem.order_subject') THEN
		PERFORM payidem._raise_invalid('invalid order subject',
			format('The subject was %s; it must have 1 to 256 characters (not only spaces).',
				coalesce(quote_literal(left(v_subject, 64)), 'NULL')),
			'Describe what is being paid for, e.g. ''Green tea 250 g''.');
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
		PERFORM payidem._raise_invalid('invalid order body',
			format('The body has %s characters; at most 1024 are allowed.', length(body)));
	END IF;

	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = v_merchant_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', v_merchant_no, 'payidem.merchant', 'merchant_no');
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
		PERFORM payidem._raise_invalid('invalid refund result status',
			format('The status was %s; it must be succeeded or failed.',
				coalesce(quote_literal(left(v_status, 64)), 'NULL')));
	END IF;
	IF NOT payidem._fits(v_crid, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('channel_refund_id', v_crid, 'payidem.channel_ref');
	END IF;

	-- the lock order of every flow function: the order (a success moves
	-- it), then the payment, then the refund; their numbers never change
	SELECT x.payment_no, x.order_no INTO v_payment_no, v_order_no FROM payidem.refund x WHERE x.refund_no = v_refund_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('refund', v_refund_no, 'payidem.refund', 'refund_no');
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
	IF o.status <> v_order_status AND NOT payidem._transition_allowed('order', o.status, v_order_status) THEN
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
-- version (docs/notifications.md).  The only place a notification is signed:
-- src/notify.c, with the secrets _secrets_valid_now() names (each opened once
-- for both MACs).
CREATE OR REPLACE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_sign_notification'
LANGUAGE C STABLE STRICT;
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
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			'Pass how many events one worker takes at a time, e.g. 100.');
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
		PERFORM payidem._raise_invalid('invalid tolerance',
			format('tolerance was %s; it must be zero or more.', coalesce(tolerance::text, 'NULL')),
			'Pass how old a notification may be, e.g. ''5 minutes''.');
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


COMMENT ON FUNCTION payidem.get_order(text) IS
	'The order with its payment attempts, refunds and anomalies, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number, 42501 for a caller that also reads a merchant''s rows and may execute the rest of the API (map_merchant_role).';

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

-- the whitelist as status_guard reads it, for a caller that chooses a status
CREATE FUNCTION payidem._transition_allowed(entity text, from_status text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transition_allowed'
LANGUAGE C STABLE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem._transition_allowed(text, text, text) IS
	'Internal: whether the whitelist allows entity''s move from from_status to to_status (the cache status_guard checks with).';
REVOKE ALL ON FUNCTION payidem._transition_allowed(text, text, text) FROM PUBLIC;

-- #38: the functions that raised their own copy of a shared check's error
CREATE OR REPLACE FUNCTION payidem._invalid_format(what text, value text, domain regtype, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._raise_invalid('invalid ' || what, format('The value was %s; it must be %s.',
		coalesce(quote_literal(left(value, 64)), 'NULL'), payidem._format_rule(domain)), hint);
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_rate(what text, rate numeric)
RETURNS numeric
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF rate IS NULL OR rate < 0 OR rate >= 1 OR rate <> round(rate, 6) THEN
		PERFORM payidem._raise_invalid(format('invalid %s rate', what),
			format('The rate was %s; it must be a fraction from 0 up to but not including 1, with at most 6 decimals.',
				coalesce(rate::text, 'NULL')),
			'Write 0.6% as 0.006.');
	END IF;
	RETURN rate;
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_limit(what text, value bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NOT NULL AND value <= 0 THEN
		PERFORM payidem._raise_invalid(format('invalid %s', what),
			format('The limit was %s; a limit is a positive amount in minor units, or NULL for none.', value));
	END IF;
	RETURN value;
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_bill_date(bill_date date)
RETURNS date
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT isfinite(bill_date) OR bill_date < date '1970-01-01' OR bill_date > date '9999-12-31' THEN
		PERFORM payidem._raise_invalid('invalid bill date',
			format('The bill date was %s; a bill covers one calendar day from 1970-01-01 to 9999-12-31.',
				CASE WHEN isfinite(bill_date)	-- ISO, whatever DateStyle (to_char stops at 294276)
					THEN format('%s-%s-%s', extract(year FROM bill_date),
								lpad(extract(month FROM bill_date)::text, 2, '0'),
								lpad(extract(day FROM bill_date)::text, 2, '0'))
					ELSE bill_date::text END));
	END IF;
	RETURN bill_date;
END
$$;
CREATE OR REPLACE FUNCTION payidem._require(what text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL THEN
		PERFORM payidem._raise_invalid(what || ' must not be NULL', hint => format('Pass the %s.', what));
	END IF;
	RETURN value;
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_number(kind text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' ELSE 'RF' END;
	v_detail text;
BEGIN
	IF value IS NULL OR value !~ ('^' || v_prefix || '[0-9]{24}$') THEN
		PERFORM payidem._raise_invalid(format('invalid %s number', kind),
			format('The value was %s; %s %s number is %s followed by 24 digits.',
				coalesce(quote_literal(left(value, 64)) ||
						CASE WHEN length(value) > 64 THEN format('... (%s characters)', length(value)) ELSE '' END,
						'NULL'),
				CASE kind WHEN 'order' THEN 'an' ELSE 'a' END, kind, v_prefix),
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	IF NOT payidem.order_no_valid(value) THEN
		-- only on this error path: order_no_parse() says what is wrong
		BEGIN
			PERFORM payidem.order_no_parse(value);
		EXCEPTION WHEN invalid_parameter_value THEN
			GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
		END;
		PERFORM payidem._raise_invalid(format('invalid %s number %s', kind, quote_literal(value)),
			v_detail,
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	RETURN value;
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_resolution(what text, handle_status text, note text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF handle_status IS NULL OR handle_status NOT IN ('handled', 'ignored') THEN
		PERFORM payidem._raise_invalid('invalid handle status ' || coalesce(quote_literal(left(handle_status, 64)), 'NULL'),
			format('A person resolves %s as handled or ignored.', what));
	END IF;
	IF length(note) > 1024 THEN
		PERFORM payidem._raise_invalid('note too long',
			format('The note has %s characters; at most 1024 are kept.', length(note)));
	END IF;
END
$$;
CREATE OR REPLACE FUNCTION payidem._merchant_for_update(p_merchant_no text)
RETURNS payidem.merchant
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
BEGIN
	PERFORM payidem._require('merchant_no', p_merchant_no);
	SELECT * INTO m FROM payidem.merchant WHERE merchant_no OPERATOR(pg_catalog.=) p_merchant_no FOR UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', p_merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	RETURN m;
END
$$;
CREATE OR REPLACE FUNCTION payidem._channel_for_update(p_channel_no text)
RETURNS payidem.channel
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c payidem.channel;
BEGIN
	PERFORM payidem._require('channel_no', p_channel_no);
	SELECT * INTO c FROM payidem.channel WHERE channel_no OPERATOR(pg_catalog.=) p_channel_no FOR UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('channel', p_channel_no, 'payidem.channel', 'channel_no');
	END IF;
	RETURN c;
END
$$;
CREATE OR REPLACE FUNCTION payidem.sign(merchant_no text, payload text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s payidem.merchant_secret;
BEGIN
	PERFORM payidem._require('merchant_no', sign.merchant_no);
	SELECT * INTO s FROM payidem.merchant_secret ms
	 WHERE ms.merchant_no OPERATOR(pg_catalog.=) sign.merchant_no AND ms.valid_until IS NULL;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', sign.merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	-- a closed merchant's key is dead: it signs nothing more
	IF EXISTS (SELECT 1 FROM payidem.merchant m
				WHERE m.merchant_no OPERATOR(pg_catalog.=) s.merchant_no AND m.status OPERATOR(pg_catalog.=) 'closed') THEN
		RAISE EXCEPTION 'merchant % is closed', s.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status closed; its API secret no longer signs or verifies.', s.merchant_no);
	END IF;
	IF payload IS NULL THEN
		PERFORM payidem._raise_invalid('payload to sign must not be NULL',
			'payload was NULL.',
			'Pass the exact text that will be sent, e.g. the JSON body.');
	END IF;
	RETURN payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
							  s.key_version, s.nonce, s.ciphertext, s.auth_tag, payload);
END
$$;
CREATE OR REPLACE FUNCTION payidem.set_merchant_status(merchant_no text, status text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m payidem.merchant;
BEGIN
	IF status IS NULL OR status NOT IN ('active', 'frozen', 'closed') THEN
		PERFORM payidem._raise_invalid('invalid merchant status',
			format('The status was %s; it must be active, frozen or closed.', coalesce(quote_literal(left(status, 64)), 'NULL')));
	END IF;
	m := payidem._merchant_for_update(set_merchant_status.merchant_no);
	PERFORM payidem._merchant_status_change(m.merchant_no, m.status, status,
											'A closed merchant stays closed; create a new merchant instead.');
	UPDATE payidem.merchant SET status = set_merchant_status.status, updated_at = now()
	 WHERE payidem.merchant.merchant_no = m.merchant_no;
END
$$;
CREATE OR REPLACE FUNCTION payidem.create_channel(channel_no text, channel_type text, fee_rate numeric,
	weight integer DEFAULT 100, allowed_merchant_types text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._check_code('channel code', create_channel.channel_no, '^[A-Z][A-Z0-9_]{1,31}$',
		'a channel code is upper case, e.g. WXPAY_001.');
	PERFORM payidem._check_code('channel type', create_channel.channel_type, '^[a-z][a-z0-9_]{0,31}$',
		'a channel type is a lower-case code such as wechat, alipay or unionpay.');
	PERFORM payidem._check_rate('channel fee', create_channel.fee_rate);
	IF weight IS NULL OR weight NOT BETWEEN 0 AND 10000 THEN
		PERFORM payidem._raise_invalid('invalid channel weight',
			format('The weight was %s; it must be from 0 to 10000.', coalesce(weight::text, 'NULL')));
	END IF;
	IF allowed_merchant_types IS NOT NULL AND (cardinality(allowed_merchant_types) = 0
		OR array_position(allowed_merchant_types, NULL) IS NOT NULL
		OR array_to_string(allowed_merchant_types, ',') !~ '^[a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*$') THEN
		PERFORM payidem._raise_invalid('invalid list of allowed merchant types',
			format('The list was %s; it must be NULL (all types) or a non-empty list of lower-case merchant types.',
				left(allowed_merchant_types::text, 200)));
	END IF;
	INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, weight, allowed_merchant_types)
	VALUES (create_channel.channel_no, create_channel.channel_type, create_channel.fee_rate,
			create_channel.weight, create_channel.allowed_merchant_types)
	ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % already exists', create_channel.channel_no USING
			ERRCODE = 'duplicate_object',
			HINT = 'Choose another channel code, or change the existing channel.';
	END IF;
END
$$;
CREATE OR REPLACE FUNCTION payidem.set_channel_status(channel_no text, status text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c payidem.channel;
BEGIN
	IF status IS NULL OR status NOT IN ('active', 'disabled') THEN
		PERFORM payidem._raise_invalid('invalid channel status',
			format('The status was %s; it must be active or disabled.', coalesce(quote_literal(left(status, 64)), 'NULL')));
	END IF;
	c := payidem._channel_for_update(set_channel_status.channel_no);
	UPDATE payidem.channel SET status = set_channel_status.status, updated_at = now()
	 WHERE payidem.channel.channel_no = c.channel_no;
END
$$;
CREATE OR REPLACE FUNCTION payidem.set_channel_config(channel_no text, config jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	c        payidem.channel;
	v_sealed record;
BEGIN
	c := payidem._channel_for_update(set_channel_config.channel_no);
	IF config IS NULL OR jsonb_typeof(config) <> 'object' THEN
		PERFORM payidem._raise_invalid('channel configuration must be a JSON object',
			format('It was a JSON %s.', coalesce(jsonb_typeof(config), 'NULL')),
			'Pass e.g. {"app_id": "...", "private_key": "..."}.');
	END IF;
	v_sealed := payidem._seal(payidem._config_aad(c.channel_no), convert_to(config::text, 'UTF8'));
	INSERT INTO payidem.channel_config AS cc (channel_no, key_version, nonce, ciphertext, auth_tag)
	VALUES (c.channel_no, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag)
	ON CONFLICT ON CONSTRAINT channel_config_pkey DO UPDATE
	   SET key_version = excluded.key_version, nonce = excluded.nonce,
		   ciphertext = excluded.ciphertext, auth_tag = excluded.auth_tag, updated_at = now();
END
$$;
CREATE OR REPLACE FUNCTION payidem.get_channel_config(channel_no text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	cc payidem.channel_config;
BEGIN
	PERFORM payidem._require('channel_no', get_channel_config.channel_no);
	SELECT * INTO cc FROM payidem.channel_config x WHERE x.channel_no OPERATOR(pg_catalog.=) get_channel_config.channel_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise('PI009', format('channel %s has no configuration',
			coalesce(quote_literal(left(get_channel_config.channel_no, 64)), 'NULL')),
			hint => 'Store one with payidem.set_channel_config().');
	END IF;
	RETURN convert_from(payidem._open(payidem._config_aad(cc.channel_no), cc.key_version, cc.nonce,
									  cc.ciphertext, cc.auth_tag), 'UTF8')::jsonb;
END
$$;
CREATE OR REPLACE FUNCTION payidem.unbind_channel(merchant_no text, channel_no text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._require('merchant_no', unbind_channel.merchant_no);
	PERFORM payidem._require('channel_no', unbind_channel.channel_no);
	UPDATE payidem.merchant_channel b SET status = 'disabled', updated_at = now()
	 WHERE b.merchant_no OPERATOR(pg_catalog.=) unbind_channel.merchant_no
	   AND b.channel_no OPERATOR(pg_catalog.=) unbind_channel.channel_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise('PI009', format('merchant %s is not bound to channel %s',
			coalesce(quote_literal(left(unbind_channel.merchant_no, 64)), 'NULL'),
			coalesce(quote_literal(left(unbind_channel.channel_no, 64)), 'NULL')));
	END IF;
END
$$;
CREATE OR REPLACE FUNCTION payidem.route_channel(merchant_no text, channel_type text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m       payidem.merchant;
	v_total bigint;
	v_pick  double precision;
	r       record;
BEGIN
	PERFORM payidem._require('merchant_no', route_channel.merchant_no);
	PERFORM payidem._require('channel_type', route_channel.channel_type);
	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no OPERATOR(pg_catalog.=) route_channel.merchant_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', route_channel.merchant_no,
			'payidem.merchant', 'merchant_no');
	END IF;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', m.merchant_no, m.status),
			HINT = 'Only active merchants take payments.';
	END IF;
	-- effective weight: channel weight x binding weight
	SELECT sum(c.weight::bigint * b.weight) INTO v_total
	  FROM payidem.merchant_channel b
	  JOIN payidem.channel c ON c.channel_no = b.channel_no
	 WHERE b.merchant_no = m.merchant_no AND b.status = 'active'
	   AND c.status = 'active' AND c.channel_type OPERATOR(pg_catalog.=) route_channel.channel_type
	   AND (c.allowed_merchant_types IS NULL OR m.merchant_type = ANY (c.allowed_merchant_types))
	   AND c.weight > 0 AND b.weight > 0;
	IF v_total IS NULL THEN
		RAISE EXCEPTION 'no channel of type % is available to merchant %',
			coalesce(quote_literal(left(route_channel.channel_type, 64)), 'NULL'), m.merchant_no USING
			ERRCODE = 'PI004',
			DETAIL = 'A channel must be active, of that type, bound and active for the merchant, admit its merchant type, and have a weight above 0.',
			HINT = 'Bind an active channel of this type with payidem.bind_channel().';
	END IF;
	v_pick := random() * v_total;
	FOR r IN
		SELECT c.channel_no, c.weight::bigint * b.weight AS w
		  FROM payidem.merchant_channel b
		  JOIN payidem.channel c ON c.channel_no = b.channel_no
		 WHERE b.merchant_no = m.merchant_no AND b.status = 'active'
		   AND c.status = 'active' AND c.channel_type OPERATOR(pg_catalog.=) route_channel.channel_type
		   AND (c.allowed_merchant_types IS NULL OR m.merchant_type = ANY (c.allowed_merchant_types))
		   AND c.weight > 0 AND b.weight > 0
		 ORDER BY c.channel_no
	LOOP
		v_pick := v_pick - r.w;
		IF v_pick < 0 THEN
			RETURN r.channel_no;
		END IF;
	END LOOP;
	RETURN r.channel_no;		-- rounding at the very end of the range
END
$$;
CREATE OR REPLACE FUNCTION payidem._check_role(role regrole, to_grant boolean DEFAULT true)
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
CREATE OR REPLACE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := begin_payment.order_no;
	v_channel_no text := begin_payment.channel_no;
	o payidem."order";
	m payidem.merchant;
	c payidem.channel;
	b payidem.merchant_channel;
	p payidem.payment;
	v_tz text;
	v_day_start timestamptz;
	v_used numeric;		-- a day's sum may pass the bigint range
	v_payment_no text;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('begin_payment', 'the order''s pending attempt and the daily limit');
	END IF;
	PERFORM payidem._require('channel_no', begin_payment.channel_no);
	PERFORM payidem._check_number('order', begin_payment.order_no);
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('order', v_order_no, 'payidem."order"', 'order_no');
	END IF;
	IF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot take a payment', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order takes a payment.', o.order_no, o.status),
			HINT = CASE WHEN o.status = 'closed' THEN 'Create a new order (with a new out_trade_no).'
						ELSE 'The order is already paid.' END;
	END IF;
	IF o.expire_at <= now() THEN
		RAISE EXCEPTION 'order % has expired', o.order_no USING
			ERRCODE = 'PI008',
			DETAIL = format('Order %s expired at %s.', o.order_no, o.expire_at),
			HINT = 'Close it with payidem.close_order() and create a new order.';
	END IF;

	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no = o.merchant_no;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', m.merchant_no, m.status),
			HINT = 'Only active merchants take payments.';
	END IF;
	SELECT * INTO c FROM payidem.channel x WHERE x.channel_no = v_channel_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('channel', v_channel_no, 'payidem.channel', 'channel_no');
	END IF;
	IF c.status <> 'active' THEN
		RAISE EXCEPTION 'channel % is %', c.channel_no, c.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s has status %s.', c.channel_no, c.status),
			HINT = 'Route the payment to an active channel (payidem.route_channel()).';
	END IF;
	SELECT * INTO b FROM payidem.merchant_channel x
	 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no;
	IF NOT FOUND OR b.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is not bound to channel %', m.merchant_no, c.channel_no USING
			ERRCODE = 'PI004',
			DETAIL = CASE WHEN FOUND THEN format('The binding is %s.', b.status) ELSE 'There is no binding.' END,
			HINT = 'Bind the channel with payidem.bind_channel().';
	END IF;
	IF c.allowed_merchant_types IS NOT NULL AND NOT m.merchant_type = ANY (c.allowed_merchant_types) THEN
		RAISE EXCEPTION 'channel % does not admit merchants of type %', c.channel_no, m.merchant_type USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s admits %s; merchant %s is %s.', c.channel_no,
							array_to_string(c.allowed_merchant_types, ', '), m.merchant_no, m.merchant_type);
	END IF;

	-- at most one pending attempt per order (we hold the order's lock, so
	-- this read is stable; the partial unique index is the final guard)
	SELECT * INTO p FROM payidem.payment x WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF FOUND THEN
		IF p.channel_no = c.channel_no THEN
			RETURN p.payment_no;			-- a retried call: the same attempt
		END IF;
		RAISE EXCEPTION 'order % has a payment in progress on channel %', o.order_no, p.channel_no USING
			ERRCODE = 'PI003',
			DETAIL = format('Payment %s of order %s is pending on channel %s; this call asked for channel %s.',
							p.payment_no, o.order_no, p.channel_no, c.channel_no),
			HINT = format('Query channel %s, then close payment %s with payidem.close_payment() before starting another.',
						  p.channel_no, p.payment_no);
	END IF;

	IF o.amount > b.single_limit OR o.amount > c.single_limit THEN
		RAISE EXCEPTION 'amount exceeds the single-payment limit' USING
			ERRCODE = 'PI007',
			DETAIL = format('Order %s is for %s; the single limit is %s for merchant %s on channel %s and %s for the channel.',
							o.order_no, o.amount, coalesce(b.single_limit::text, 'none'), m.merchant_no,
							c.channel_no, coalesce(c.single_limit::text, 'none')),
			HINT = 'Use another channel, or raise the limit with payidem.bind_channel().';
	END IF;
	IF b.daily_limit IS NOT NULL OR c.daily_limit IS NOT NULL THEN
		-- serialize the day's sum of this merchant on this channel
		PERFORM 1 FROM payidem.merchant_channel x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no FOR UPDATE;
		v_tz := coalesce(nullif(current_setting('payidem.limit_timezone', true), ''), 'UTC');
		v_day_start := date_trunc('day', now() AT TIME ZONE v_tz) AT TIME ZONE v_tz;
		SELECT coalesce(sum(x.amount), 0) INTO v_used FROM payidem.payment x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no
		   AND x.created_at >= v_day_start
		   AND (x.status = 'pending' OR x.status = ANY (payidem._paid_payment_statuses()));
		IF v_used + o.amount > b.daily_limit OR v_used + o.amount > c.daily_limit THEN
			RAISE EXCEPTION 'amount exceeds the daily limit' USING
				ERRCODE = 'PI007',
				DETAIL = format('Merchant %s has %s pending or paid on channel %s today (%s); with %s more the daily limit (merchant %s, channel %s) would be exceeded.',
								m.merchant_no, v_used, c.channel_no, v_tz, o.amount,
								coalesce(b.daily_limit::text, 'none'), coalesce(c.daily_limit::text, 'none')),
				HINT = 'Use another channel, or try again tomorrow.';
		END IF;
	END IF;

	v_payment_no := payidem.gen_order_no('PY');
	INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
	VALUES (v_payment_no, o.order_no, m.merchant_no, c.channel_no, o.amount);
	RETURN v_payment_no;
END
$$;
CREATE OR REPLACE FUNCTION payidem.close_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := close_order.order_no;
	v_pending text;
	o payidem."order";
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('close_order', 'for a pending attempt of the order');
	END IF;
	PERFORM payidem._check_number('order', close_order.order_no);
	-- the lock order of every flow function: the order, then its payments
	-- (an attempt begin_payment() is committing is seen once the order's
	-- lock is ours: it held that lock)
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('order', v_order_no, 'payidem."order"', 'order_no');
	END IF;
	IF o.status = 'closed' THEN
		RETURN false;
	ELSIF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot be closed', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order can be closed.', o.order_no, o.status),
			HINT = 'A paid order is refunded, not closed: see payidem.refund().';
	END IF;
	-- with the order locked no new attempt can start; close the pending one
	SELECT x.payment_no INTO v_pending FROM payidem.payment x
	 WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF v_pending IS NOT NULL THEN
		PERFORM payidem.apply_payment_result(v_pending, 'close', 'closed');
	END IF;
	PERFORM payidem.transit_order(o.order_no, 'closed');
	RETURN true;
END
$$;
CREATE OR REPLACE FUNCTION payidem.refund(payment_no text, amount bigint, out_refund_no text, reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_payment_no text := refund.payment_no;
	v_amount bigint := refund.amount;
	v_out_refund_no text := refund.out_refund_no;
	v_refund_no text;
	v_order_no text;
	v_committed bigint;
	p payidem.payment;
	r payidem.refund;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('refund', 'the refunded total of the payment');
	END IF;
	PERFORM payidem._check_number('payment', refund.payment_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		PERFORM payidem._raise_invalid('invalid refund amount',
			format('The amount was %s; it must be a positive number of minor units.', coalesce(v_amount::text, 'NULL')));
	END IF;
	IF v_out_refund_no IS NULL OR NOT payidem._fits(v_out_refund_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_refund_no', v_out_refund_no, 'payidem.merchant_ref',
										'Use the merchant''s own refund number.');
	END IF;
	IF NOT payidem._fits(reason, 'payidem.refund_reason') THEN
		PERFORM payidem._raise_invalid('invalid refund reason',
			format('The reason has %s characters; at most 256 are allowed.', length(reason)));
	END IF;

	-- serializes the refunds of one payment; in the lock order of every flow
	-- function, the order first (its number never changes), so a refund and
	-- its result in one transaction cannot deadlock with a payment result
	SELECT x.order_no INTO v_order_no FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF FOUND THEN
		PERFORM 1 FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('payment', v_payment_no, 'payidem.payment', 'payment_no');
	END IF;

	<<attempt>>
	LOOP
		SELECT * INTO r FROM payidem.refund x
		 WHERE x.merchant_no = p.merchant_no AND x.out_refund_no = v_out_refund_no;
		IF FOUND THEN
			IF r.payment_no <> p.payment_no OR r.amount <> v_amount THEN
				RAISE EXCEPTION 'out_refund_no % was already used for another refund', v_out_refund_no USING
					ERRCODE = 'PI001',
					DETAIL = CASE WHEN r.payment_no <> p.payment_no
							 THEN format('Refund %s (out_refund_no %s) is for payment %s; this call names payment %s.',
										 r.refund_no, v_out_refund_no, r.payment_no, p.payment_no)
							 ELSE format('Refund %s (out_refund_no %s) is for amount %s; this call asked for %s.',
										 r.refund_no, v_out_refund_no, r.amount, v_amount) END,
					HINT = 'A repeated refund must carry the same payment and amount; use a new out_refund_no for a new refund.';
			END IF;
			RETURN r.refund_no;
		END IF;

		IF p.status NOT IN ('succeeded', 'partially_refunded') THEN
			RAISE EXCEPTION 'payment % cannot be refunded', p.payment_no USING
				ERRCODE = 'PI002',
				DETAIL = format('Payment %s is %s; only a succeeded or partially refunded payment can be refunded.',
								p.payment_no, p.status);
		END IF;
		SELECT coalesce(sum(x.amount), 0) INTO v_committed FROM payidem.refund x
		 WHERE x.payment_no = p.payment_no AND x.status IN ('pending', 'succeeded');
		-- (compared as amount - committed: v_committed + v_amount could overflow)
		IF v_amount > p.amount - v_committed THEN
			RAISE EXCEPTION 'refund exceeds the paid amount' USING
				ERRCODE = 'PI006',
				DETAIL = format('Payment %s is for %s; %s is already refunded or being refunded, so at most %s more can be refunded, not %s.',
								p.payment_no, p.amount, v_committed, p.amount - v_committed, v_amount);
		END IF;

		-- a concurrent refund of another payment of this merchant may take the
		-- same out_refund_no: then read its row and decide as above
		INSERT INTO payidem.refund AS x (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, reason)
		VALUES (payidem.gen_order_no('RF'), p.payment_no, p.order_no, p.merchant_no, v_out_refund_no, v_amount, reason)
		ON CONFLICT ON CONSTRAINT refund_out_refund_no_key DO NOTHING
		RETURNING x.refund_no INTO v_refund_no;
		IF v_refund_no IS NOT NULL THEN
			RETURN v_refund_no;
		END IF;
	END LOOP attempt;
END
$$;
CREATE OR REPLACE FUNCTION payidem.query_due(max_rows integer DEFAULT 100)
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	-- the advisory-lock space of query_due() (the first key of the pair)
	v_lock_class constant integer := hashtext('payidem.query_due');
	v_taken integer := 0;
	c record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			'Pass how many attempts one worker queries at a time, e.g. 100.');
	END IF;
	-- the leases of attempts that are no longer pending are dropped (they can
	-- never be handed out again, so no caller writes them meanwhile); one
	-- another caller is dropping is left to it
	DELETE FROM payidem.query_lease l
	 WHERE l.payment_no IN (SELECT x.payment_no FROM payidem.query_lease x
							 WHERE x.leased_until <= now()
							   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
												WHERE p.payment_no = x.payment_no AND p.status = 'pending')
							   FOR UPDATE SKIP LOCKED);
	-- Two callers never get the same attempt, and neither waits for the other.
	-- The candidates are read in expiry order and taken one at a time, until
	-- max_rows are had: an attempt another caller is handing out (its
	-- transaction-scoped advisory lock) is skipped, as SKIP LOCKED skips a
	-- row; one whose lease that caller committed after this query's snapshot
	-- is refused by the lease write itself (the upsert decides on the latest
	-- row).  Only the attempts handed out are locked (a lock per candidate
	-- read, never per pending attempt), and the attempts' rows not at all, so
	-- a payment result never waits for query_due().
	FOR c IN
		SELECT p.payment_no::text AS payment_no, p.order_no, p.channel_no, o.expire_at
		  FROM payidem.order_expiry q
		  JOIN payidem."order" o ON o.order_no = q.order_no AND o.expire_at = q.expire_at
		  JOIN payidem.payment p ON p.order_no = o.order_no AND p.status = 'pending'
		 WHERE q.expire_at <= now() AND o.status = 'pending'
		   AND NOT EXISTS (SELECT 1 FROM payidem.query_lease l
							WHERE l.payment_no = p.payment_no AND l.leased_until > now())
		 ORDER BY o.expire_at, p.payment_no
	LOOP
		CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_lock_class, hashtext(c.payment_no));
		INSERT INTO payidem.query_lease AS l (payment_no, leased_until)
		VALUES (c.payment_no, now() + v_lease)
		ON CONFLICT ON CONSTRAINT query_lease_pkey DO UPDATE SET leased_until = excluded.leased_until
		 WHERE l.leased_until <= now();
		CONTINUE WHEN NOT FOUND;
		payment_no := c.payment_no;
		order_no := c.order_no;
		channel_no := c.channel_no;
		expire_at := c.expire_at;
		RETURN NEXT;
		v_taken := v_taken + 1;
		EXIT WHEN v_taken >= max_rows;
	END LOOP;
END
$$;
CREATE OR REPLACE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- wait after the n-th failed attempt; after the 16th attempt: failed
	v_schedule constant interval[] := ARRAY['15 seconds', '15 seconds', '30 seconds', '3 minutes',
		'10 minutes', '20 minutes', '30 minutes', '30 minutes', '30 minutes', '60 minutes',
		'3 hours', '3 hours', '3 hours', '6 hours', '6 hours']::interval[];
	e payidem.notify_event;
BEGIN
	IF notify_result.event_id IS NULL OR notify_result.event_id <= 0 THEN
		PERFORM payidem._raise_invalid('invalid event_id',
			format('event_id was %s; it must be an id notify_due() handed out.',
				coalesce(notify_result.event_id::text, 'NULL')));
	END IF;
	IF ok IS NULL THEN
		PERFORM payidem._raise_invalid('notification result must not be NULL',
			'ok was NULL.',
			'Pass true if the merchant acknowledged the notification, false otherwise.');
	END IF;
	SELECT * INTO e FROM payidem.notify_event x WHERE x.event_id = notify_result.event_id FOR UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('notification event', notify_result.event_id,
			'payidem.notify_event', 'event_id');
	END IF;
	IF e.status <> 'pending' OR e.attempts = 0 THEN
		RETURN;			-- already sent or given up, or never handed out: nothing to report
	END IF;
	-- a report of an attempt that is not the last one handed out (its lease
	-- ran out and the event went to another worker) is stale: it changes nothing
	IF notify_result.attempt IS NOT NULL AND notify_result.attempt <> e.attempts THEN
		RETURN;
	END IF;
	IF ok THEN
		UPDATE payidem.notify_event x
		   SET status = 'sent', next_attempt_at = NULL, sent_at = now()
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_sent');
	ELSIF e.attempts > cardinality(v_schedule) THEN
		UPDATE payidem.notify_event x
		   SET status = 'failed', next_attempt_at = NULL, last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_failed');
	ELSE
		UPDATE payidem.notify_event x
		   SET next_attempt_at = now() + v_schedule[e.attempts], last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_retried');
	END IF;
END
$$;
CREATE OR REPLACE FUNCTION payidem.load_bill(channel_no text, bill_date date, csv text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := load_bill.channel_no;
	v_day		date := load_bill.bill_date;
	v_csv		text := load_bill.csv;
	v_tz		text := payidem._bill_timezone();
	v_day_text	text;
	v_bad		record;
	v_rows		bigint;
	-- the shape of a paid_at; the cast still checks the ranges
	c_time		constant text := '^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?( ?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?))?$';
	c_hint		constant text := 'Nothing was imported. The layout is channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at (see docs/reconciliation.md); fix the line and load the whole bill again.';
BEGIN
	IF v_channel IS NULL OR v_day IS NULL OR v_csv IS NULL THEN
		PERFORM payidem._raise_invalid('channel_no, bill_date and csv must not be null');
	END IF;
	PERFORM payidem._check_bill_date(v_day);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) v_channel) THEN
		PERFORM payidem._raise_not_found('channel', v_channel, 'payidem.channel', 'channel_no');
	END IF;
	v_day_text := to_char(v_day, 'YYYY-MM-DD');
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	-- the first bad line, if any (field by field, then duplicates)
	SELECT c.line_no, c.problem[1] AS field, c.problem[2] AS value, c.problem[3] AS rule
	  INTO v_bad
	  FROM (SELECT l.line_no,
				   CASE
					WHEN l.f IS NULL THEN
						ARRAY[NULL, NULL, 'a double quote is misplaced or not closed']
					WHEN cardinality(l.f) <> 8 THEN
						ARRAY[NULL, NULL, format('the line has %s fields instead of 8', cardinality(l.f))]
					WHEN l.f[1] NOT IN ('', v_channel) THEN
						ARRAY['channel_no', l.f[1], format('is not the channel of this bill (%s)', v_channel)]
					WHEN l.f[2] <> '' AND l.f[2] !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
						ARRAY['bill_date', l.f[2], 'is not a date written YYYY-MM-DD']
					WHEN l.f[2] <> '' AND l.f[2] <> v_day_text THEN
						ARRAY['bill_date', l.f[2], format('is not the day of this bill (%s)', v_day_text)]
					WHEN NOT payidem._fits(l.f[3], 'payidem.channel_ref') THEN
						ARRAY['transaction_id', l.f[3], 'must be ' || payidem._format_rule('payidem.channel_ref')]
					WHEN l.f[4] <> '' AND NOT payidem._fits(l.f[4], 'payidem.channel_ref') THEN
						ARRAY['payment_no', l.f[4], 'must be empty or ' || payidem._format_rule('payidem.channel_ref')]
					-- at most the bigint maximum, as create_order() takes (compared as text)
					WHEN l.f[5] !~ '^[0-9]+$' OR l.f[5] ~ '^0+$' OR length(ltrim(l.f[5], '0')) > 19
						 OR (length(ltrim(l.f[5], '0')) = 19
							 AND ltrim(l.f[5], '0') COLLATE "C" > '9223372036854775807') THEN
						ARRAY['amount', l.f[5], 'must be a positive integer in minor units (fen, cents)']
					WHEN l.f[6] <> '' AND (l.f[6] !~ '^[0-9]+$' OR length(ltrim(l.f[6], '0')) > 19
						 OR (length(ltrim(l.f[6], '0')) = 19
							 AND ltrim(l.f[6], '0') COLLATE "C" > '9223372036854775807')) THEN
						ARRAY['fee', l.f[6], 'must be empty or a non-negative integer in minor units (fen, cents)']
					WHEN l.f[7] NOT IN ('succeeded', 'refunded') THEN
						ARRAY['status', l.f[7], 'must be succeeded or refunded']
					WHEN l.f[8] <> '' AND l.f[8] !~ c_time THEN
						ARRAY['paid_at', l.f[8], 'is not a time written YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM]']
					WHEN l.first_line <> l.line_no THEN
						ARRAY['transaction_id', l.f[3], format('appears already on line %s', l.first_line)]
				   END AS problem
			  FROM (SELECT b.line_no, b.fields AS f,
						   min(b.line_no) OVER (PARTITION BY b.fields[3]) AS first_line
					  FROM payidem._bill_lines(v_csv) b) l) c
	 WHERE c.problem IS NOT NULL
	 ORDER BY c.line_no
	 LIMIT 1;
	IF FOUND THEN
		IF v_bad.field IS NULL THEN
			PERFORM payidem._raise_invalid(format('invalid line %s in the channel bill', v_bad.line_no),
				format('Line %s: %s.', v_bad.line_no, v_bad.rule),
				c_hint);
		END IF;
		PERFORM payidem._raise_invalid(format('invalid %s on line %s of the channel bill', v_bad.field, v_bad.line_no),
			format('Line %s, field %s: %s %s.', v_bad.line_no, v_bad.field,
				quote_literal(left(v_bad.value, 64)), v_bad.rule),
			c_hint);
	END IF;

	-- a bill loaded again replaces the channel's earlier bill of that day
	DELETE FROM payidem.channel_bill cb
	 WHERE cb.channel_no OPERATOR(pg_catalog.=) v_channel AND cb.bill_date OPERATOR(pg_catalog.=) v_day;
	BEGIN
		INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
		SELECT v_channel, v_day, b.fields[3], nullif(b.fields[4], ''), b.fields[5]::bigint,
			   coalesce(nullif(b.fields[6], '')::bigint, 0), b.fields[7],
			   CASE
				WHEN b.fields[8] = '' THEN NULL
				WHEN b.fields[8] ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN b.fields[8]::timestamptz
				ELSE timezone(v_tz, b.fields[8]::timestamp)
			   END
		  FROM payidem._bill_lines(v_csv) b;
		GET DIAGNOSTICS v_rows = ROW_COUNT;
	EXCEPTION WHEN data_exception THEN
		-- a paid_at of the right shape but out of range (month 13, 25 o'clock):
		-- find its line (only on this error path, line by line)
		FOR v_bad IN SELECT b.line_no, b.fields[8] AS value FROM payidem._bill_lines(v_csv) b ORDER BY b.line_no LOOP
			BEGIN
				PERFORM payidem._bill_time(v_bad.value, v_tz);
			EXCEPTION WHEN data_exception THEN
				PERFORM payidem._raise_invalid(format('invalid paid_at on line %s of the channel bill', v_bad.line_no),
					format('Line %s, field paid_at: %s is not a valid time (%s).', v_bad.line_no,
						quote_literal(left(v_bad.value, 64)), SQLERRM),
					c_hint);
			END;
		END LOOP;
		RAISE;
	END;
	RETURN v_rows;
END
$$;
CREATE OR REPLACE FUNCTION payidem._bill_day_lines(channel_no text, bill_date date)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF channel_no IS NULL OR bill_date IS NULL THEN
		PERFORM payidem._raise_invalid('channel_no and bill_date must not be null');
	END IF;
	PERFORM payidem._check_bill_date(bill_date);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no) THEN
		PERFORM payidem._raise_not_found('channel', channel_no, 'payidem.channel', 'channel_no');
	END IF;
	RETURN (SELECT count(*) FROM payidem.channel_bill b
			 WHERE b.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no
			   AND b.bill_date OPERATOR(pg_catalog.=) _bill_day_lines.bill_date);
END
$$;
CREATE OR REPLACE FUNCTION payidem.resolve_diff(recon_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_id		bigint := resolve_diff.recon_id;
	v_status	text := resolve_diff.handle_status;
	v_note		text := resolve_diff.note;
	d			payidem.reconciliation;
BEGIN
	PERFORM payidem._require('recon_id', resolve_diff.recon_id::text);
	PERFORM payidem._check_resolution('a difference', v_status, v_note);

	UPDATE payidem.reconciliation rc
	   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
		   note = v_note, updated_at = now()
	 WHERE rc.recon_id = v_id AND rc.handle_status = 'open'
	RETURNING rc.* INTO d;
	IF NOT FOUND THEN
		SELECT rc.* INTO d FROM payidem.reconciliation rc WHERE rc.recon_id = v_id;
		IF NOT FOUND THEN
			PERFORM payidem._raise_not_found('reconciliation difference', v_id);
		END IF;
		RAISE EXCEPTION 'reconciliation difference % is not open', v_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s%s.', d.handle_status,
							CASE WHEN d.handled_by IS NOT NULL THEN ' by ' || d.handled_by ELSE '' END),
			HINT = 'Only an open difference can be resolved.';
	END IF;

	-- the alarm raised for a channel_only difference is closed with it
	IF d.diff_type = 'channel_only' THEN
		UPDATE payidem.anomaly a
		   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
			   note = v_note, updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.channel_no = d.channel_no
		   AND a.detail ->> 'bill_date' = to_char(d.bill_date, 'YYYY-MM-DD')
		   AND a.detail ->> 'transaction_id' = d.transaction_id
		   AND a.handle_status = 'open';
	END IF;
END
$$;
CREATE OR REPLACE FUNCTION payidem.import_merchant(merchant_no text, name text, merchant_type text, fee_rate numeric,
	settle_cycle text, api_key text, api_secret text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	m        payidem.merchant;
	v_sealed record;
BEGIN
	PERFORM payidem._check_code('merchant number', import_merchant.merchant_no, '^M[0-9A-HJKMNP-TV-Z]{15}$',
		'a merchant number is M followed by 15 Crockford base32 characters.');
	PERFORM payidem._check_code('API key', import_merchant.api_key, '^[0-9A-Za-z_-]{16,64}$',
		'an API key has 16 to 64 characters of 0-9, A-Z, a-z, _ and -.');
	IF api_secret IS NULL OR length(api_secret) NOT BETWEEN 16 AND 256 THEN
		PERFORM payidem._raise_invalid('invalid API secret', 'An API secret has 16 to 256 characters.');	-- never the value
	END IF;
	PERFORM payidem._check_merchant_fields(name, import_merchant.merchant_type,
										   import_merchant.fee_rate, import_merchant.settle_cycle);

	INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, api_key)
	VALUES (import_merchant.merchant_no, btrim(name), import_merchant.merchant_type, import_merchant.fee_rate,
			import_merchant.settle_cycle, import_merchant.api_key)
	ON CONFLICT DO NOTHING;
	IF FOUND THEN
		v_sealed := payidem._seal(payidem._secret_aad(import_merchant.merchant_no, 1), convert_to(api_secret, 'UTF8'));
		INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag)
		VALUES (import_merchant.merchant_no, 1, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext, v_sealed.auth_tag);
		RETURN 'imported';
	END IF;

	-- already here (partition 0 made it, or a replay): it must be the same merchant
	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no OPERATOR(pg_catalog.=) import_merchant.merchant_no;
	IF NOT FOUND OR m.api_key <> import_merchant.api_key OR m.merchant_type <> import_merchant.merchant_type
	   OR m.fee_rate <> import_merchant.fee_rate OR m.settle_cycle <> import_merchant.settle_cycle
	   OR m.merchant_name <> btrim(name)
	   OR NOT payidem._current_secret_is(m.merchant_no, api_secret) THEN
		RAISE EXCEPTION 'merchant % exists on shard % with other attributes',
			import_merchant.merchant_no, payidem.shard_id() USING
			ERRCODE = 'duplicate_object',
			DETAIL = CASE WHEN NOT FOUND THEN format('The API key %s belongs to another merchant.', import_merchant.api_key)
						  ELSE 'Its name, type, rate, settlement cycle, API key or current secret differ from the copy.' END,
			HINT = 'Reference data must be written through the router, which writes the same row on every shard.';
	END IF;
	RETURN 'present';
END
$$;
CREATE OR REPLACE FUNCTION payidem.import_merchant_secret(merchant_no text, api_secret text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_sealed  record;
	v_version integer;
BEGIN
	IF api_secret IS NULL OR length(api_secret) NOT BETWEEN 16 AND 256 THEN
		PERFORM payidem._raise_invalid('invalid API secret', 'An API secret has 16 to 256 characters.');
	END IF;
	PERFORM payidem._merchant_for_update(import_merchant_secret.merchant_no);
	IF payidem._current_secret_is(import_merchant_secret.merchant_no, api_secret) THEN
		RETURN 'present';
	END IF;
	-- the same rotation (grace windows and all) as rotate_merchant_secret(),
	-- then its fresh random secret is replaced by the one of partition 0
	PERFORM payidem.rotate_merchant_secret(import_merchant_secret.merchant_no, grace);
	SELECT s.secret_version INTO v_version FROM payidem.merchant_secret s
	 WHERE s.merchant_no OPERATOR(pg_catalog.=) import_merchant_secret.merchant_no AND s.valid_until IS NULL;
	v_sealed := payidem._seal(payidem._secret_aad(import_merchant_secret.merchant_no, v_version),
							  convert_to(api_secret, 'UTF8'));
	UPDATE payidem.merchant_secret s
	   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce,
		   ciphertext = v_sealed.ciphertext, auth_tag = v_sealed.auth_tag
	 WHERE s.merchant_no OPERATOR(pg_catalog.=) import_merchant_secret.merchant_no AND s.secret_version = v_version;
	RETURN 'rotated';
END
$$;
CREATE OR REPLACE FUNCTION payidem.import_reference(reference jsonb)
RETURNS TABLE (kind text, added bigint, changed bigint, removed bigint, left_alone bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	s        record;
	v_sealed record;
	v_add    bigint;
	v_change bigint;
	v_remove bigint;
BEGIN
	IF reference IS NULL OR jsonb_typeof(reference) <> 'object'
	   OR NOT reference ?& ARRAY['merchants', 'secrets', 'channels', 'configs', 'bindings'] THEN
		PERFORM payidem._raise_invalid('invalid reference document',
			'It must be what payidem.export_reference() returns: an object with merchants, secrets, channels, configs and bindings.');
	END IF;
	-- a merchant closed here stays closed: partition 0 must close it too,
	-- not this shard reopen it
	PERFORM payidem._merchant_status_change(m.merchant_no, m.status, r.status,
			format('It is closed on shard %s: close it everywhere through the router (payidem.close_merchant(%L)), then repeat.',
				   payidem.shard_id(), m.merchant_no))
	   FROM jsonb_populate_recordset(NULL::payidem.merchant, reference -> 'merchants') r
	   JOIN payidem.merchant m ON m.merchant_no = r.merchant_no
	  WHERE m.status IS DISTINCT FROM r.status;

	-- merchants
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.merchant, reference -> 'merchants')),
	w AS (
		INSERT INTO payidem.merchant AS m (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, status, api_key)
		SELECT r.merchant_no, r.merchant_name, r.merchant_type, r.fee_rate, r.settle_cycle, r.status, r.api_key FROM r
		ON CONFLICT ON CONSTRAINT merchant_pkey DO UPDATE
		   SET merchant_name = excluded.merchant_name, merchant_type = excluded.merchant_type,
			   fee_rate = excluded.fee_rate, settle_cycle = excluded.settle_cycle, status = excluded.status,
			   api_key = excluded.api_key, updated_at = now()
		 WHERE (m.merchant_name, m.merchant_type, m.fee_rate, m.settle_cycle, m.status, m.api_key)
			   IS DISTINCT FROM (excluded.merchant_name, excluded.merchant_type, excluded.fee_rate,
								 excluded.settle_cycle, excluded.status, excluded.api_key)
		RETURNING m.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	kind := 'merchants'; added := v_add; changed := v_change; removed := 0;
	left_alone := (SELECT count(*) FROM payidem.merchant m
					WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
									   WHERE e ->> 'merchant_no' = m.merchant_no));
	RETURN NEXT;

	-- secrets: the same versions, windows and secrets; first those this
	-- shard has and partition 0 has not, then the ones that stop being
	-- current, then the rest (one current secret per merchant at all times)
	v_add := 0; v_change := 0;
	WITH r AS (SELECT * FROM jsonb_to_recordset(reference -> 'secrets') AS x(merchant_no text, secret_version integer))
	DELETE FROM payidem.merchant_secret s
	 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
					WHERE e ->> 'merchant_no' = s.merchant_no)
	   AND NOT EXISTS (SELECT 1 FROM r WHERE r.merchant_no = s.merchant_no AND r.secret_version = s.secret_version);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	FOR s IN
		SELECT r.*, x.merchant_no IS NOT NULL AS present,
			   x.merchant_no IS NOT NULL
			   AND (x.valid_from, x.valid_until) IS NOT DISTINCT FROM (r.valid_from, r.valid_until)
			   AND payidem._open(payidem._secret_aad(x.merchant_no, x.secret_version),
								 x.key_version, x.nonce, x.ciphertext, x.auth_tag)
				   = convert_to(r.secret, 'UTF8') AS same
		  FROM jsonb_to_recordset(reference -> 'secrets')
			   AS r(merchant_no text, secret_version integer, secret text, valid_from timestamptz, valid_until timestamptz)
		  LEFT JOIN payidem.merchant_secret x ON x.merchant_no = r.merchant_no AND x.secret_version = r.secret_version
		 ORDER BY r.valid_until IS NULL, r.merchant_no, r.secret_version
	LOOP
		CONTINUE WHEN s.same;
		v_sealed := payidem._seal(payidem._secret_aad(s.merchant_no, s.secret_version), convert_to(s.secret, 'UTF8'));
		IF s.present THEN
			UPDATE payidem.merchant_secret x
			   SET key_version = v_sealed.key_version, nonce = v_sealed.nonce, ciphertext = v_sealed.ciphertext,
				   auth_tag = v_sealed.auth_tag, valid_from = s.valid_from, valid_until = s.valid_until
			 WHERE x.merchant_no = s.merchant_no AND x.secret_version = s.secret_version;
			v_change := v_change + 1;
		ELSE
			INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext,
												 auth_tag, valid_from, valid_until)
			VALUES (s.merchant_no, s.secret_version, v_sealed.key_version, v_sealed.nonce, v_sealed.ciphertext,
					v_sealed.auth_tag, s.valid_from, s.valid_until);
			v_add := v_add + 1;
		END IF;
	END LOOP;
	kind := 'secrets'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;

	-- channels
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.channel, reference -> 'channels')),
	w AS (
		INSERT INTO payidem.channel AS c (channel_no, channel_type, fee_rate, status, weight, allowed_merchant_types,
										  single_limit, daily_limit)
		SELECT r.channel_no, r.channel_type, r.fee_rate, r.status, r.weight, r.allowed_merchant_types,
			   r.single_limit, r.daily_limit FROM r
		ON CONFLICT ON CONSTRAINT channel_pkey DO UPDATE
		   SET channel_type = excluded.channel_type, fee_rate = excluded.fee_rate, status = excluded.status,
			   weight = excluded.weight, allowed_merchant_types = excluded.allowed_merchant_types,
			   single_limit = excluded.single_limit, daily_limit = excluded.daily_limit, updated_at = now()
		 WHERE (c.channel_type, c.fee_rate, c.status, c.weight, c.allowed_merchant_types, c.single_limit, c.daily_limit)
			   IS DISTINCT FROM (excluded.channel_type, excluded.fee_rate, excluded.status, excluded.weight,
								 excluded.allowed_merchant_types, excluded.single_limit, excluded.daily_limit)
		RETURNING c.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	kind := 'channels'; added := v_add; changed := v_change; removed := 0;
	left_alone := (SELECT count(*) FROM payidem.channel c
					WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
									   WHERE e ->> 'channel_no' = c.channel_no));
	RETURN NEXT;

	-- channel configurations
	v_add := 0; v_change := 0;
	DELETE FROM payidem.channel_config cc
	 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
					WHERE e ->> 'channel_no' = cc.channel_no)
	   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'configs') e
						WHERE e ->> 'channel_no' = cc.channel_no);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	FOR s IN
		SELECT r.*, x.channel_no IS NOT NULL AS present,
			   x.channel_no IS NOT NULL
			   AND convert_from(payidem._open(payidem._config_aad(x.channel_no), x.key_version, x.nonce,
											  x.ciphertext, x.auth_tag), 'UTF8')::jsonb = r.config AS same
		  FROM jsonb_to_recordset(reference -> 'configs') AS r(channel_no text, config jsonb)
		  LEFT JOIN payidem.channel_config x ON x.channel_no = r.channel_no
	LOOP
		CONTINUE WHEN s.same;
		PERFORM payidem.set_channel_config(s.channel_no, s.config);
		IF s.present THEN v_change := v_change + 1; ELSE v_add := v_add + 1; END IF;
	END LOOP;
	kind := 'configs'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;

	-- bindings; one partition 0 does not have is disabled here (unbound)
	WITH r AS (SELECT * FROM jsonb_populate_recordset(NULL::payidem.merchant_channel, reference -> 'bindings')),
	w AS (
		INSERT INTO payidem.merchant_channel AS b (merchant_no, channel_no, fee_rate, single_limit, daily_limit,
												   status, weight)
		SELECT r.merchant_no, r.channel_no, r.fee_rate, r.single_limit, r.daily_limit, r.status, r.weight FROM r
		ON CONFLICT ON CONSTRAINT merchant_channel_pkey DO UPDATE
		   SET fee_rate = excluded.fee_rate, single_limit = excluded.single_limit, daily_limit = excluded.daily_limit,
			   status = excluded.status, weight = excluded.weight, updated_at = now()
		 WHERE (b.fee_rate, b.single_limit, b.daily_limit, b.status, b.weight)
			   IS DISTINCT FROM (excluded.fee_rate, excluded.single_limit, excluded.daily_limit,
								 excluded.status, excluded.weight)
		RETURNING b.xmax = 0 AS inserted)
	SELECT count(*) FILTER (WHERE w.inserted), count(*) FILTER (WHERE NOT w.inserted) INTO v_add, v_change FROM w;
	UPDATE payidem.merchant_channel b SET status = 'disabled', updated_at = now()
	 WHERE b.status <> 'disabled'
	   AND EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'merchants') e
					WHERE e ->> 'merchant_no' = b.merchant_no)
	   AND EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'channels') e
					WHERE e ->> 'channel_no' = b.channel_no)
	   AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(reference -> 'bindings') e
						WHERE e ->> 'merchant_no' = b.merchant_no AND e ->> 'channel_no' = b.channel_no);
	GET DIAGNOSTICS v_remove = ROW_COUNT;
	kind := 'bindings'; added := v_add; changed := v_change; removed := v_remove; left_alone := 0;
	RETURN NEXT;
END
$$;
CREATE OR REPLACE FUNCTION payidem.load_bill_part(channel_no text, bill_date date, csv text, partitions integer,
	placed_lines bigint[] DEFAULT NULL, placed_partitions integer[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_me   integer := payidem.shard_id();
	v_mine text;
BEGIN
	IF partitions IS NULL OR partitions < 1 OR v_me >= partitions THEN
		RAISE EXCEPTION 'shard % is not a partition of a %-partition cluster', v_me, partitions USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Check payidem.shard_id on the shards against the router''s server payidem (payidem.cluster_check()).';
	END IF;
	IF cardinality(placed_lines) IS DISTINCT FROM cardinality(placed_partitions) THEN
		PERFORM payidem._raise_invalid('placed_lines and placed_partitions differ in length',
			format('%s lines, %s partitions.', coalesce(cardinality(placed_lines), 0),
				coalesce(cardinality(placed_partitions), 0)));
	END IF;
	-- every shard checks the whole bill, so a bad line fails the load on all
	-- of them and none keeps a part (the router has no two-phase commit)
	PERFORM payidem._bill_check(channel_no, bill_date, csv);
	-- this shard's lines: those its payment number names, then those the
	-- router placed by transaction id, the rest on partition 0; the others
	-- become blank lines, so that line numbers in messages stay those of the
	-- whole bill
	SELECT string_agg(CASE WHEN b.line_no IS NULL
							 OR coalesce(payidem._bill_line_partition(nullif(b.fields[4], ''), partitions),
										 pl.partition, 0) = v_me
						   THEN t.line ELSE '' END,
					  chr(10) ORDER BY t.n)
	  INTO v_mine
	  FROM string_to_table(csv, chr(10)) WITH ORDINALITY AS t(line, n)
	  LEFT JOIN payidem._bill_lines(csv) b ON b.line_no = t.n
	  LEFT JOIN unnest(placed_lines, placed_partitions) AS pl(line_no, partition) ON pl.line_no = t.n;
	RETURN payidem.load_bill(channel_no, bill_date, coalesce(v_mine, ''));
END
$$;
CREATE OR REPLACE FUNCTION payidem.resolve_anomaly(anomaly_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	a payidem.anomaly;
BEGIN
	PERFORM payidem._require('anomaly_id', resolve_anomaly.anomaly_id::text);
	PERFORM payidem._check_resolution('an anomaly', resolve_anomaly.handle_status, resolve_anomaly.note);
	UPDATE payidem.anomaly x
	   SET handle_status = resolve_anomaly.handle_status, handled_by = session_user, handled_at = now(),
		   note = resolve_anomaly.note, updated_at = now()
	 WHERE x.anomaly_id = resolve_anomaly.anomaly_id AND x.handle_status = 'open'
	RETURNING x.* INTO a;
	IF NOT FOUND THEN
		SELECT x.* INTO a FROM payidem.anomaly x WHERE x.anomaly_id = resolve_anomaly.anomaly_id;
		IF NOT FOUND THEN
			PERFORM payidem._raise_not_found('anomaly', resolve_anomaly.anomaly_id,
				'payidem.anomaly', 'anomaly_id');
		END IF;
		RAISE EXCEPTION 'anomaly % is not open', a.anomaly_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s.', a.handle_status),
			HINT = 'Only an open anomaly can be resolved.';
	END IF;
END
$$;

------------------------------------------------------------------------------
-- 1.1: settlement, merchant balances in double entry, payouts, adjustments,
-- fee reconciliation and verify() (DESIGN section 11): the parts
-- settlement_tables and settlement, and what they change in 1.0's objects.
------------------------------------------------------------------------------

-- payout events
ALTER DOMAIN payidem.notify_event_type DROP CONSTRAINT notify_event_type_known;
ALTER DOMAIN payidem.notify_event_type ADD CONSTRAINT notify_event_type_known
	CHECK (VALUE IN ('order.paid', 'refund.succeeded', 'order.closed',
					 'payout.succeeded', 'payout.failed'));
COMMENT ON DOMAIN payidem.notify_event_type IS
	'What a merchant notification reports: order.paid, refund.succeeded, order.closed, payout.succeeded or payout.failed.';
-- a bill line without a fee has none (NULL), not 0; 1.0 wrote an empty fee
-- as 0, so its zeros are taken for "none" (a real fee of 0 is then not
-- compared, as an empty one)
ALTER TABLE payidem.channel_bill ALTER COLUMN fee DROP NOT NULL;
ALTER TABLE payidem.channel_bill ALTER COLUMN fee DROP DEFAULT;
UPDATE payidem.channel_bill SET fee = NULL WHERE fee = 0;
COMMENT ON COLUMN payidem.channel_bill.fee IS
	'What the channel charged for the line, minor units; NULL when the bill reports none (reconcile() then compares no fee).';
ALTER TYPE payidem._recon_leftover ADD ATTRIBUTE p_cost bigint;
ALTER TYPE payidem._recon_leftover ADD ATTRIBUTE b_fee bigint;
-- The payout and adjustment numbers, as the order-number domains
-- (order_tables): PT / AJ + 24 digits, MOD 97-10 check digits valid.
CREATE DOMAIN payidem.payout_number AS text
	CONSTRAINT payout_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PT[0-9]+$' THEN false
		ELSE ('2529' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.payout_number IS
	'A payout number: PT + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.adjust_number AS text
	CONSTRAINT adjust_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^AJ[0-9]+$' THEN false
		ELSE ('1019' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.adjust_number IS
	'An adjustment number: AJ + 24 digits, MOD 97-10 check digits valid.';

-- The calendar of T<n> cycles: Monday to Friday are business days, except the
-- days this table says otherwise (public holidays: false; a worked weekend
-- day: true).  Kept by a DBA; a change moves only items not yet settled.
CREATE TABLE payidem.business_day (
	day			date		NOT NULL,
	business	boolean		NOT NULL,
	note		text,
	CONSTRAINT business_day_pkey PRIMARY KEY (day)
);
COMMENT ON TABLE payidem.business_day IS
	'Exceptions to the Monday-to-Friday business week of T<n> settlement cycles: holidays (business false) and worked weekend days (business true).';

-- The fixed chart of accounts (DESIGN section 11), written once: which
-- accounts exist and whose they are.  A merchant's accounts name the
-- merchant, a channel's the channel, the platform's neither.
CREATE DOMAIN payidem.ledger_account AS text
	CONSTRAINT ledger_account_known CHECK (VALUE IN (
		'merchant_available', 'merchant_payout', 'channel_receivable',
		'fee_revenue', 'channel_cost', 'payout_clearing', 'adjustment'));
COMMENT ON DOMAIN payidem.ledger_account IS
	'An account of the chart: merchant_available, merchant_payout (per merchant), channel_receivable (per channel), fee_revenue, channel_cost, payout_clearing, adjustment (the platform''s).';

-- The journal: append-only (ledger_append_only), double entry.  Each
-- journal_no is one business event -- a settled payment or refund (its
-- number), a payout request (the payout's number), its result (the payout's
-- number and /succeeded or /failed), an adjustment (its number) -- and its
-- entries sum to 0 per currency, checked at commit for every writer
-- (src/journal.c).  Debit positive, credit negative; a merchant's available
-- balance is the negated sum of its merchant_available entries.  No index
-- but the key: every read by merchant goes to merchant_balance, every report
-- to settlement_item; verify() reads the journal whole.
CREATE TABLE payidem.ledger_entry (
	entry_id	bigserial		NOT NULL,
	journal_no	text			NOT NULL,
	account		payidem.ledger_account NOT NULL,
	merchant_no	text,
	channel_no	text,
	currency	character(3)	NOT NULL,
	amount		bigint			NOT NULL,
	source_no	text			NOT NULL,
	created_at	timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT ledger_entry_pkey PRIMARY KEY (entry_id),
	CONSTRAINT ledger_entry_amount_nonzero CHECK (amount <> 0),
	CONSTRAINT ledger_entry_journal_format CHECK (pg_catalog.length(journal_no) BETWEEN 1 AND 64),
	CONSTRAINT ledger_entry_owner_length CHECK (pg_catalog.length(merchant_no) <= 64 AND pg_catalog.length(channel_no) <= 64),
	CONSTRAINT ledger_entry_account_owner CHECK (
		CASE
			WHEN account IN ('merchant_available', 'merchant_payout')
				THEN merchant_no IS NOT NULL AND channel_no IS NULL
			WHEN account = 'channel_receivable'
				THEN channel_no IS NOT NULL AND merchant_no IS NULL
			ELSE merchant_no IS NULL AND channel_no IS NULL
		END)
);
COMMENT ON TABLE payidem.ledger_entry IS
	'The double-entry journal of settlements, payouts and adjustments: append-only; each journal_no sums to 0 per currency (checked at commit).';
COMMENT ON COLUMN payidem.ledger_entry.journal_no IS
	'One business event: a settled payment or refund (its number), a payout request (PT...), its result (PT.../succeeded, PT.../failed), an adjustment (AJ...).';
COMMENT ON COLUMN payidem.ledger_entry.currency IS
	'The currency of the business event (a payment''s order''s, a payout''s, an adjustment''s: each checked where it was written; not again per entry).';
COMMENT ON COLUMN payidem.ledger_entry.amount IS
	'Minor units; debit positive, credit negative.';
COMMENT ON COLUMN payidem.ledger_entry.source_no IS
	'The payment, refund, payout or adjustment the entry is for.';

-- A merchant's balances, kept for locking and speed: at every commit equal
-- to the negated sums of its merchant_available and merchant_payout entries
-- (src/journal.c checks the changes of both against each other).  A payout
-- locks and updates this row; settle() updates each merchant's once a run.
CREATE TABLE payidem.merchant_balance (
	merchant_no	text		NOT NULL,
	currency	payidem.currency_code NOT NULL,
	available	bigint		NOT NULL DEFAULT 0,
	in_payout	bigint		NOT NULL DEFAULT 0,
	updated_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_balance_pkey PRIMARY KEY (merchant_no, currency),
	CONSTRAINT merchant_balance_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT merchant_balance_in_payout_nonnegative CHECK (in_payout >= 0)
) WITH (fillfactor = 50);
COMMENT ON TABLE payidem.merchant_balance IS
	'Each merchant''s available and in-payout balance per currency, equal at every commit to its journal entries (merchant_available, merchant_payout).';
COMMENT ON COLUMN payidem.merchant_balance.available IS
	'Settled and not paid out, minor units; negative when refunds settled after the payments were paid out (later settlements repay it first).';
COMMENT ON COLUMN payidem.merchant_balance.in_payout IS
	'Requested payouts the bank has not yet confirmed or refused, minor units.';

-- Each settled item once: its number decides (a payment PY..., a refund
-- RF...).  Its journal is journal_no = item_no.  fee and cost are a
-- payment's fee_amount and cost_amount, or a refund's share of them.
CREATE TABLE payidem.settlement_item (
	item_no		text		NOT NULL,
	item_type	text		NOT NULL,
	payment_no	text		NOT NULL,
	merchant_no	text		NOT NULL,
	channel_no	text		NOT NULL,
	currency	character(3) NOT NULL,
	bill_day	date		NOT NULL,
	settle_day	date		NOT NULL,
	settle_date	date		NOT NULL,
	amount		bigint		NOT NULL,
	fee			bigint		NOT NULL,
	cost		bigint		NOT NULL,
	settled_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT settlement_item_pkey PRIMARY KEY (item_no),
	CONSTRAINT settlement_item_type_known CHECK (item_type IN ('payment', 'refund')),
	CONSTRAINT settlement_item_amounts CHECK (amount > 0 AND fee >= 0 AND cost >= 0
											  AND fee <= amount AND cost <= amount)
);
COMMENT ON TABLE payidem.settlement_item IS
	'Each succeeded payment and refund settled, once: its amount, fee and cost (a refund''s share of its payment''s), its bill day, settlement day and the settle() run that settled it.';
COMMENT ON COLUMN payidem.settlement_item.bill_day IS
	'The day of paid_at (refunded_at) in payidem.bill_timezone.';
COMMENT ON COLUMN payidem.settlement_item.settle_day IS
	'bill_day plus the merchant''s settle_cycle: when the money became due.';
COMMENT ON COLUMN payidem.settlement_item.settle_date IS
	'The date settle() was called with when it settled the item.';

-- Payments that were due but could not be settled (their bill day not
-- reconciled, an open difference or anomaly naming them): each settle()
-- run looks at them again, whatever their day.
CREATE TABLE payidem.settlement_hold (
	payment_no	text		NOT NULL,
	held_since	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT settlement_hold_pkey PRIMARY KEY (payment_no)
);
COMMENT ON TABLE payidem.settlement_hold IS
	'Succeeded payments that were due but held (day not reconciled, open difference or anomaly); settle() settles them once that is resolved.';

-- Where settle() starts looking: every succeeded payment and refund of a
-- bill day before scan_from is settled or held (docs/settlement.md: how it
-- stays true).  One row, made by the first settle() (so that a restore
-- brings it back as dumped); settle() locks it, so runs wait for each other.
CREATE TABLE payidem.settle_state (
	id				boolean		NOT NULL DEFAULT true,
	scan_from		date,
	last_xmax		xid8,
	last_scan_from	date,
	last_run_at		timestamptz,
	last_settle_date date,
	worker_day		date,
	scan_timezone	text,
	settle_from		date,
	CONSTRAINT settle_state_pkey PRIMARY KEY (id),
	CONSTRAINT settle_state_one_row CHECK (id)
);
COMMENT ON COLUMN payidem.settle_state.scan_timezone IS
	'The payidem.bill_timezone scan_from is a day of (a run with another zone reads from the same instant).';
COMMENT ON COLUMN payidem.settle_state.settle_from IS
	'Set by the owner, or NULL: no item of a bill day before it is settled (history paid outside payidem), and settle() never reads before it.';
COMMENT ON TABLE payidem.settle_state IS
	'settle()''s progress: the first bill day it still reads (scan_from), and when it ran; one row, its lock serializes settle() runs.';

-- Payouts: a payout takes money from available into in_payout; the bank's
-- answer moves it on (succeeded) or back (failed).  Entity payout of the
-- whitelist: pending -> succeeded | failed.
CREATE TABLE payidem.payout (
	payout_no		payidem.payout_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_payout_no	payidem.merchant_ref NOT NULL,
	amount			payidem.minor_amount NOT NULL,
	currency		payidem.currency_code NOT NULL,
	status			text		NOT NULL DEFAULT 'pending',
	bank_ref		payidem.channel_ref,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	finished_at		timestamptz,
	available_before bigint,
	CONSTRAINT payout_pkey PRIMARY KEY (payout_no),
	CONSTRAINT payout_out_payout_no_key UNIQUE (merchant_no, out_payout_no),
	CONSTRAINT payout_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no)
);
COMMENT ON TABLE payidem.payout IS
	'Payouts of merchants'' available balance to their bank: request_payout(), apply_payout_result().';
COMMENT ON COLUMN payidem.payout.payout_no IS
	'Platform payout number, payidem.gen_order_no(''PT'').';
COMMENT ON COLUMN payidem.payout.out_payout_no IS
	'The requester''s own number for the payout; unique per merchant (a repeated request returns the same payout).';
COMMENT ON COLUMN payidem.payout.available_before IS
	'The merchant''s available balance when the payout was taken (under the balance''s lock): verify() checks the payout took no more.';
COMMENT ON COLUMN payidem.payout.bank_ref IS
	'The bank''s reference of the transfer, as apply_payout_result() reported it.';

-- Adjustments: money credited (positive) or debited (negative) to a
-- merchant against the platform's adjustment account, with a reason.
CREATE TABLE payidem.adjustment (
	adjust_no		payidem.adjust_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_adjust_no	payidem.merchant_ref NOT NULL,
	amount			bigint		NOT NULL,
	currency		payidem.currency_code NOT NULL,
	reason			text		NOT NULL,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	created_by		text		NOT NULL DEFAULT SESSION_USER,
	CONSTRAINT adjustment_pkey PRIMARY KEY (adjust_no),
	CONSTRAINT adjustment_out_adjust_no_key UNIQUE (merchant_no, out_adjust_no),
	CONSTRAINT adjustment_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT adjustment_amount_nonzero CHECK (amount <> 0),
	CONSTRAINT adjustment_reason_length CHECK (pg_catalog.length(pg_catalog.btrim(reason)) BETWEEN 1 AND 256)
);
COMMENT ON TABLE payidem.adjustment IS
	'Adjustments of merchants'' balances (chargebacks, fines, corrections): adjust_balance().';

-- (built-in rows: the whitelist's guard admits them from CREATE EXTENSION
-- only, so it steps aside for the update)
ALTER TABLE payidem.state DISABLE TRIGGER whitelist_guard;
ALTER TABLE payidem.transition DISABLE TRIGGER whitelist_guard;
INSERT INTO payidem.state (entity, status, initial, terminal, builtin) VALUES
	('payout', 'pending',   true,  false, true),
	('payout', 'succeeded', false, true,  true),
	('payout', 'failed',    false, true,  true);
INSERT INTO payidem.transition (entity, from_status, to_status, builtin) VALUES
	('payout', 'pending', 'succeeded', true),
	('payout', 'pending', 'failed',    true);
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_guard;
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_guard;

-- What settlement adds to tables of 1.0, written as the update from 1.0
-- writes it, so that a new install and an updated one have the same tables.
-- A merchant's own notification URL (payout events belong to no order).
ALTER TABLE payidem.merchant ADD COLUMN notify_url payidem.http_url;
COMMENT ON COLUMN payidem.merchant.notify_url IS
	'Where notifications that belong to no order go (payout.succeeded, payout.failed): set_merchant_notify_url().';
-- A payout's events name the payout, not an order.
ALTER TABLE payidem.notify_event ALTER COLUMN order_no DROP NOT NULL;
ALTER TABLE payidem.notify_event ADD COLUMN payout_no text;
ALTER TABLE payidem.notify_event ADD CONSTRAINT notify_event_subject
	CHECK ((order_no IS NULL) <> (payout_no IS NULL));
COMMENT ON COLUMN payidem.notify_event.payout_no IS
	'The payout of a payout.succeeded or payout.failed event (order_no is then NULL).';
-- Reconciliation compares fees: a bill line's fee with the payment's
-- cost_amount (fee_mismatch).
ALTER TABLE payidem.recon_batch ADD COLUMN fee_mismatch bigint NOT NULL DEFAULT 0;
ALTER TABLE payidem.reconciliation ADD COLUMN platform_fee bigint;
ALTER TABLE payidem.reconciliation ADD COLUMN channel_fee bigint;
COMMENT ON COLUMN payidem.reconciliation.platform_fee IS
	'fee_mismatch: the payment''s cost_amount (what we expect the channel to charge).';
COMMENT ON COLUMN payidem.reconciliation.channel_fee IS
	'fee_mismatch: the fee the channel''s bill line charged.';
ALTER TABLE payidem.reconciliation DROP CONSTRAINT reconciliation_diff_type_known;
ALTER TABLE payidem.reconciliation ADD CONSTRAINT reconciliation_diff_type_known CHECK (
	diff_type IN ('platform_only', 'channel_only', 'amount_mismatch', 'status_mismatch', 'fee_mismatch'));
ALTER TABLE payidem.reconciliation DROP CONSTRAINT reconciliation_sides_consistent;
ALTER TABLE payidem.reconciliation ADD CONSTRAINT reconciliation_sides_consistent CHECK (
	CASE diff_type
		WHEN 'platform_only' THEN platform_amount IS NOT NULL AND channel_amount IS NULL
		WHEN 'channel_only' THEN platform_amount IS NULL AND channel_amount IS NOT NULL
		WHEN 'amount_mismatch' THEN platform_amount IS DISTINCT FROM channel_amount
			AND platform_amount IS NOT NULL AND channel_amount IS NOT NULL
		WHEN 'fee_mismatch' THEN platform_fee IS DISTINCT FROM channel_fee
			AND platform_fee IS NOT NULL AND channel_fee IS NOT NULL
		ELSE platform_status IS DISTINCT FROM channel_status
	END);
ALTER TABLE payidem.recon_batch ADD CONSTRAINT recon_batch_fee_mismatch_nonnegative CHECK (fee_mismatch >= 0);
COMMENT ON COLUMN payidem.reconciliation.diff_type IS
	'platform_only (we have it, the bill does not), channel_only (money taken, no record of ours), amount_mismatch, status_mismatch, fee_mismatch (the bill''s fee is not the payment''s cost_amount).';
-- Settlement holds a payment an open difference names: the open ones, by
-- payment (a difference is written by reconcile(), not on a payment's path).
CREATE INDEX reconciliation_open_payment ON payidem.reconciliation (payment_no) WHERE handle_status = 'open';
-- Settlement finds a merchant's refunds by the time they succeeded.
CREATE INDEX refund_merchant_refunded ON payidem.refund (merchant_no, refunded_at);

-- functions and views of 1.0 that settlement changes
CREATE OR REPLACE FUNCTION payidem._check_number(kind text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'payout' THEN 'PT' ELSE 'RF' END;
	v_detail text;
BEGIN
	IF value IS NULL OR value !~ ('^' || v_prefix || '[0-9]{24}$') THEN
		PERFORM payidem._raise_invalid(format('invalid %s number', kind),
			format('The value was %s; %s %s number is %s followed by 24 digits.',
				coalesce(quote_literal(left(value, 64)) ||
						CASE WHEN length(value) > 64 THEN format('... (%s characters)', length(value)) ELSE '' END,
						'NULL'),
				CASE kind WHEN 'order' THEN 'an' ELSE 'a' END, kind, v_prefix),
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	IF NOT payidem.order_no_valid(value) THEN
		-- only on this error path: order_no_parse() says what is wrong
		BEGIN
			PERFORM payidem.order_no_parse(value);
		EXCEPTION WHEN invalid_parameter_value THEN
			GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
		END;
		PERFORM payidem._raise_invalid(format('invalid %s number %s', kind, quote_literal(value)),
			v_detail,
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	RETURN value;
END
$$;

CREATE OR REPLACE FUNCTION payidem._keep_money_records()
RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RAISE EXCEPTION 'rows of payidem.% cannot be deleted', quote_ident(TG_TABLE_NAME) USING
		ERRCODE = 'insufficient_privilege',
		DETAIL = format('payidem.%s holds money records; %s is refused for every role.', quote_ident(TG_TABLE_NAME), TG_OP),
		HINT = CASE TG_TABLE_NAME
				   WHEN 'anomaly' THEN 'Set its handle_status to handled or ignored instead.'
				   WHEN 'order' THEN 'Close a pending order with payidem.close_order(); a paid one is refunded with payidem.refund().'
				   WHEN 'payment' THEN 'Close a pending payment with payidem.close_payment(); a succeeded one is refunded with payidem.refund().'
				   WHEN 'payout' THEN 'A payout ends succeeded or failed through payidem.apply_payout_result().'
				   WHEN 'adjustment' THEN 'Reverse an adjustment with another one: payidem.adjust_balance().'
				   WHEN 'merchant_balance' THEN 'A balance moves only with its journal: settle(), request_payout(), apply_payout_result(), adjust_balance().'
				   WHEN 'settlement_item' THEN 'A settled item is settled for good; correct its money with payidem.adjust_balance().'
				   ELSE 'A refund ends succeeded or failed through payidem.apply_refund_result().' END;
END
$$;
COMMENT ON FUNCTION payidem._keep_money_records() IS
	'Trigger on payidem."order", payment, refund, anomaly, payout, adjustment, merchant_balance and settlement_item: refuses DELETE and TRUNCATE.';

CREATE OR REPLACE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
AS 'MODULE_PATHNAME', 'payidem_notify_due'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...,v2=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

CREATE OR REPLACE FUNCTION payidem.load_bill(channel_no text, bill_date date, csv text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := load_bill.channel_no;
	v_day		date := load_bill.bill_date;
	v_csv		text := load_bill.csv;
	v_tz		text := payidem._bill_timezone();
	v_day_text	text;
	v_bad		record;
	v_rows		bigint;
	-- the shape of a paid_at; the cast still checks the ranges
	c_time		constant text := '^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?( ?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?))?$';
	c_hint		constant text := 'Nothing was imported. The layout is channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at (see docs/reconciliation.md); fix the line and load the whole bill again.';
BEGIN
	IF v_channel IS NULL OR v_day IS NULL OR v_csv IS NULL THEN
		PERFORM payidem._raise_invalid('channel_no, bill_date and csv must not be null');
	END IF;
	PERFORM payidem._check_bill_date(v_day);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) v_channel) THEN
		PERFORM payidem._raise_not_found('channel', v_channel, 'payidem.channel', 'channel_no');
	END IF;
	v_day_text := to_char(v_day, 'YYYY-MM-DD');
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	-- the first bad line, if any (field by field, then duplicates)
	SELECT c.line_no, c.problem[1] AS field, c.problem[2] AS value, c.problem[3] AS rule
	  INTO v_bad
	  FROM (SELECT l.line_no,
				   CASE
					WHEN l.f IS NULL THEN
						ARRAY[NULL, NULL, 'a double quote is misplaced or not closed']
					WHEN cardinality(l.f) <> 8 THEN
						ARRAY[NULL, NULL, format('the line has %s fields instead of 8', cardinality(l.f))]
					WHEN l.f[1] NOT IN ('', v_channel) THEN
						ARRAY['channel_no', l.f[1], format('is not the channel of this bill (%s)', v_channel)]
					WHEN l.f[2] <> '' AND l.f[2] !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
						ARRAY['bill_date', l.f[2], 'is not a date written YYYY-MM-DD']
					WHEN l.f[2] <> '' AND l.f[2] <> v_day_text THEN
						ARRAY['bill_date', l.f[2], format('is not the day of this bill (%s)', v_day_text)]
					WHEN NOT payidem._fits(l.f[3], 'payidem.channel_ref') THEN
						ARRAY['transaction_id', l.f[3], 'must be ' || payidem._format_rule('payidem.channel_ref')]
					WHEN l.f[4] <> '' AND NOT payidem._fits(l.f[4], 'payidem.channel_ref') THEN
						ARRAY['payment_no', l.f[4], 'must be empty or ' || payidem._format_rule('payidem.channel_ref')]
					-- at most the bigint maximum, as create_order() takes (compared as text)
					WHEN l.f[5] !~ '^[0-9]+$' OR l.f[5] ~ '^0+$' OR length(ltrim(l.f[5], '0')) > 19
						 OR (length(ltrim(l.f[5], '0')) = 19
							 AND ltrim(l.f[5], '0') COLLATE "C" > '9223372036854775807') THEN
						ARRAY['amount', l.f[5], 'must be a positive integer in minor units (fen, cents)']
					WHEN l.f[6] <> '' AND (l.f[6] !~ '^[0-9]+$' OR length(ltrim(l.f[6], '0')) > 19
						 OR (length(ltrim(l.f[6], '0')) = 19
							 AND ltrim(l.f[6], '0') COLLATE "C" > '9223372036854775807')) THEN
						ARRAY['fee', l.f[6], 'must be empty or a non-negative integer in minor units (fen, cents)']
					WHEN l.f[7] NOT IN ('succeeded', 'refunded') THEN
						ARRAY['status', l.f[7], 'must be succeeded or refunded']
					WHEN l.f[8] <> '' AND l.f[8] !~ c_time THEN
						ARRAY['paid_at', l.f[8], 'is not a time written YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM]']
					WHEN l.first_line <> l.line_no THEN
						ARRAY['transaction_id', l.f[3], format('appears already on line %s', l.first_line)]
				   END AS problem
			  FROM (SELECT b.line_no, b.fields AS f,
						   min(b.line_no) OVER (PARTITION BY b.fields[3]) AS first_line
					  FROM payidem._bill_lines(v_csv) b) l) c
	 WHERE c.problem IS NOT NULL
	 ORDER BY c.line_no
	 LIMIT 1;
	IF FOUND THEN
		IF v_bad.field IS NULL THEN
			PERFORM payidem._raise_invalid(format('invalid line %s in the channel bill', v_bad.line_no),
				format('Line %s: %s.', v_bad.line_no, v_bad.rule),
				c_hint);
		END IF;
		PERFORM payidem._raise_invalid(format('invalid %s on line %s of the channel bill', v_bad.field, v_bad.line_no),
			format('Line %s, field %s: %s %s.', v_bad.line_no, v_bad.field,
				quote_literal(left(v_bad.value, 64)), v_bad.rule),
			c_hint);
	END IF;

	-- a bill loaded again replaces the channel's earlier bill of that day
	DELETE FROM payidem.channel_bill cb
	 WHERE cb.channel_no OPERATOR(pg_catalog.=) v_channel AND cb.bill_date OPERATOR(pg_catalog.=) v_day;
	BEGIN
		INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
		SELECT v_channel, v_day, b.fields[3], nullif(b.fields[4], ''), b.fields[5]::bigint,
			   nullif(b.fields[6], '')::bigint, b.fields[7],
			   CASE
				WHEN b.fields[8] = '' THEN NULL
				WHEN b.fields[8] ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN b.fields[8]::timestamptz
				ELSE timezone(v_tz, b.fields[8]::timestamp)
			   END
		  FROM payidem._bill_lines(v_csv) b;
		GET DIAGNOSTICS v_rows = ROW_COUNT;
	EXCEPTION WHEN data_exception THEN
		-- a paid_at of the right shape but out of range (month 13, 25 o'clock):
		-- find its line (only on this error path, line by line)
		FOR v_bad IN SELECT b.line_no, b.fields[8] AS value FROM payidem._bill_lines(v_csv) b ORDER BY b.line_no LOOP
			BEGIN
				PERFORM payidem._bill_time(v_bad.value, v_tz);
			EXCEPTION WHEN data_exception THEN
				PERFORM payidem._raise_invalid(format('invalid paid_at on line %s of the channel bill', v_bad.line_no),
					format('Line %s, field paid_at: %s is not a valid time (%s).', v_bad.line_no,
						quote_literal(left(v_bad.value, 64)), SQLERRM),
					c_hint);
			END;
		END LOOP;
		RAISE;
	END;
	RETURN v_rows;
END
$$;
COMMENT ON FUNCTION payidem.load_bill(text, date, text) IS
	'Import a channel''s bill of one day from CSV text (channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at; channel_no and bill_date may be empty); replaces that day''s earlier bill; all lines or none (22023 naming the line and field); returns the number of lines.';

CREATE OR REPLACE FUNCTION payidem.app_functions()
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

CREATE OR REPLACE FUNCTION payidem._app_merchant_roles(of_role regrole DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION payidem._reader_tables(merchant_filtered boolean)
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
	-- (the view merchant_balances calls _balances() with its reader's privileges)
	EXECUTE format('GRANT EXECUTE ON FUNCTION payidem.verify(), payidem._balances(text) TO %I', v_role);
	PERFORM payidem._forget_dropped_roles();
	INSERT INTO payidem.auditor_role (role) VALUES (grant_auditor.role) ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION payidem.grant_auditor(regrole) IS
	'Read-only access to every merchant''s business rows and the books (verify()); never to merchant_secret, channel_config or idempotency results.';

CREATE OR REPLACE FUNCTION payidem.revoke_auditor(role regrole)
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

CREATE OR REPLACE VIEW payidem.open_differences WITH (security_invoker = true) AS
SELECT r.recon_id, r.channel_no, r.bill_date, r.diff_type, r.transaction_id, r.payment_no,
	   r.platform_amount, r.channel_amount, r.platform_status, r.channel_status, r.created_at,
	   pg_catalog.now() - r.created_at AS open_for, r.platform_fee, r.channel_fee
  FROM payidem.reconciliation r
 WHERE r.handle_status = 'open'
 ORDER BY r.bill_date, r.recon_id;
COMMENT ON VIEW payidem.open_differences IS
	'Open reconciliation differences, oldest bill day first; resolve each with payidem.resolve_diff().';

-- reconcile() returns fee_mismatch too: a new result type, so the function
-- is made again; the roles that had EXECUTE on it are named in a WARNING
-- (the update grants nothing: see the end of this part)
SELECT pg_catalog.set_config('payidem_update.reconcile_grantees',
		coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(u.rolname), ','), ''), true)
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles u
 WHERE p.oid = 'payidem.reconcile(text, date, boolean)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee = u.oid AND a.grantee <> p.proowner;
DROP FUNCTION payidem.reconcile(text, date, boolean);
CREATE FUNCTION payidem.reconcile(channel_no text, bill_date date, allow_empty boolean DEFAULT false)
RETURNS TABLE(recon_batch_no text, matched bigint, platform_only bigint,
			  channel_only bigint, amount_mismatch bigint, status_mismatch bigint, fee_mismatch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- The planner cannot know how many differences a day has (a CTE, a table
-- just written): a nested-loop anti-join of the day's differences against
-- the stored ones would be quadratic at 10,000+ differences.  Joins here
-- are hash joins; the look-ups that must be nested loops (LATERAL ... LIMIT,
-- subplans, = ANY) are not affected by this setting.  Step 1 alone is
-- planned with nested loops allowed: it reads the day's payments by key
-- from payment_paid, and whether to fetch each payment by its key or to
-- hash the whole table is the planner's to decide from the day's size (a
-- hash join there reads every payment ever made, each day).  The setting
-- also adds a huge "disabled" cost to the plans, which would trigger JIT
-- compilation (about 2 s a statement) on every run: JIT is off here.
SET enable_nestloop = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := reconcile.channel_no;
	v_day		date := reconcile.bill_date;
	v_tz		text := payidem._bill_timezone();
	v_from		timestamptz;
	v_to		timestamptz;
	v_batch		text;
	v_run		bigint;
	v_matched	bigint;
	v_bill_lines bigint;
	v_bill_amount numeric;	-- sums of bigint amounts: may pass the bigint range
	v_payments	bigint;
	v_pay_amount numeric;
	v_rows		bigint;
	-- what the join left over (the differences, before the straddle check)
	l_rows		payidem._recon_leftover[];
	n			record;
BEGIN
	-- no bill, no reconciliation: without one every payment of the day would
	-- be reported platform_only
	IF payidem._bill_day_lines(v_channel, v_day) = 0 AND allow_empty IS NOT TRUE THEN
		RAISE EXCEPTION 'no bill of channel % for % is loaded', v_channel, to_char(v_day, 'YYYY-MM-DD') USING
			ERRCODE = 'object_not_in_prerequisite_state',
			DETAIL = format('payidem.channel_bill has no line of channel %s for bill day %s.', v_channel,
							to_char(v_day, 'YYYY-MM-DD')),
			HINT = 'Load the day''s bill with payidem.load_bill() first; if the channel really reported nothing that day, call reconcile(channel_no, bill_date, allow_empty => true).';
	END IF;
	-- the bill day, midnight to midnight in the channel's zone
	v_from := timezone(v_tz, v_day::timestamp);
	v_to := timezone(v_tz, (v_day + 1)::timestamp);

	-- one run per channel at a time (also keeps two runs of a day from
	-- doubling differences, and a straddle update from racing its day)
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	SELECT coalesce(max(substring(b.recon_batch_no FROM '-([0-9]{1,9})$')::bigint), 0) + 1
	  INTO v_run
	  FROM payidem.recon_batch b
	 WHERE b.channel_no = v_channel AND b.bill_date = v_day;
	v_batch := format('RC-%s-%s-%s', v_channel, to_char(v_day, 'YYYYMMDD'),
					  CASE WHEN v_run < 1000 THEN lpad(v_run::text, 3, '0') ELSE v_run::text END);
	INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, bill_timezone)
	VALUES (v_batch, v_channel, v_day, 'running', v_tz);

	PERFORM set_config('enable_nestloop', 'on', true);	-- for step 1 alone (above)
	-- 1. The day: one hash full join of the bill and the platform's payments,
	--    counted in the same pass.  Per row only the test that keeps the rows
	--    that may differ (as cheap as the plain FULL JOIN's WHERE): they are
	--    kept as one array of rows, and what kind of difference each is, is
	--    worked out for them alone (step 2).  A candidate may still match: a
	--    payment refunded after the day's end, billed as succeeded.
	SELECT count(*), count(b.transaction_id), coalesce(sum(b.amount), 0),
		   count(p.payment_no), coalesce(sum(p.amount), 0),
		   array_agg(ROW(p.payment_no, p.transaction_id, p.amount, p.status,
						 b.transaction_id, b.amount, b.status, p.cost_amount, b.fee)::payidem._recon_leftover)
			 FILTER (WHERE p.payment_no IS NULL OR b.transaction_id IS NULL OR p.amount <> b.amount
						OR (b.status = 'refunded') = (p.status = 'succeeded')
						OR b.fee <> p.cost_amount)
	  INTO v_rows, v_bill_lines, v_bill_amount, v_payments, v_pay_amount, l_rows
	  FROM (SELECT pay.payment_no, pay.transaction_id, pay.amount, pay.status, pay.cost_amount
			  FROM payidem.payment_paid pp
			  JOIN payidem.payment pay ON pay.payment_no = pp.payment_no
			 WHERE pp.channel_no = v_channel
			   AND pp.paid_at >= v_from AND pp.paid_at < v_to
			   AND pay.status = ANY (payidem._paid_payment_statuses())) p
	  FULL JOIN
		   -- only what the join needs: the hash of the bill is its biggest
		   -- cost; the payment number the channel echoes is read for the
		   -- bill-only lines alone (bo below)
		   (SELECT cb.transaction_id, cb.amount, cb.status, cb.fee
			  FROM payidem.channel_bill cb
			 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day) b
		ON b.transaction_id = p.transaction_id;
	PERFORM set_config('enable_nestloop', 'off', true);	-- (the function's SET restores it at exit)
	v_matched := v_rows - coalesce(cardinality(l_rows), 0);

	-- 2. The leftovers: straddles, then the day's differences replace its
	--    open ones; one statement, one snapshot.
	WITH r AS MATERIALIZED (
		SELECT u.p_no, u.p_txn, u.p_amount, u.p_status, u.b_txn, u.b_amount, u.b_status, u.p_cost, u.b_fee,
			   CASE
				WHEN u.p_no IS NULL THEN 'bill_only'
				WHEN u.b_txn IS NULL THEN 'platform_only'
				WHEN u.p_amount <> u.b_amount THEN 'amount_mismatch'
				WHEN (u.b_status = 'refunded' AND u.p_status = 'succeeded')
				  OR (u.b_status = 'succeeded' AND u.p_status <> 'succeeded'
					  AND payidem._refunded_by(u.p_no, u.p_status, v_to)) THEN 'status_mismatch'
				-- amount and status agree: the channel's fee against our cost
				WHEN u.b_fee <> u.p_cost THEN 'fee_mismatch'
				ELSE 'matched'
			   END AS kind
		  FROM unnest(l_rows) AS u
	),
	-- a bill line without a payment of the day: ours from another day (a
	-- midnight straddle), ours but not paid, or unknown.  It is ours and paid
	-- (x_paid) when the payment has this transaction id -- or has none, was
	-- paid this bill day, and is the one whose number this line alone of the
	-- day's unmatched lines echoes -- and no earlier day's bill lists the
	-- transaction with the same status (that would be billing it twice; a
	-- later day's line is the repeat, so re-running this day changes nothing).
	bo AS (
		SELECT r.b_txn, bn.b_no, r.b_amount, r.b_status, bn.b_fee,
			   x.payment_no AS x_no, x.order_no AS x_order, x.amount AS x_amount, x.status AS x_status,
			   x.cost_amount AS x_cost,
			   coalesce(x.by_txn AND x.status = ANY (payidem._paid_payment_statuses()), false)
			   AND NOT (coalesce(x.by_no, false)
						AND count(*) OVER (PARTITION BY x.by_no, x.payment_no) > 1)
			   AND NOT EXISTS (SELECT 1 FROM payidem.channel_bill cb
								WHERE cb.channel_no = v_channel AND cb.transaction_id = r.b_txn
								  AND cb.bill_date < v_day AND cb.status = r.b_status) AS x_paid,
			   CASE WHEN x.by_txn THEN payidem._refunded_by(x.payment_no, x.status, v_to) ELSE false END AS x_refunded,
			   coalesce(x.paid_at >= v_from AND x.paid_at < v_to, false) AS x_of_the_day
		  FROM r
		 -- (LIMIT 1, the line is unique: a look-up per line, never a hash
		 -- join against the whole bill)
		 CROSS JOIN LATERAL (
				SELECT cb.payment_no AS b_no, cb.fee AS b_fee
				  FROM payidem.channel_bill cb
				 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day AND cb.transaction_id = r.b_txn
				 LIMIT 1) bn
		  LEFT JOIN LATERAL (
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status, true AS by_txn, false AS by_no,
					   pay.paid_at, pay.cost_amount
				  FROM payidem.payment_paid pp
				 -- the payment by its key (LIMIT: a look-up, never a hash
				 -- of every payment)
				 CROSS JOIN LATERAL (
						SELECT p1.payment_no, p1.order_no, p1.amount, p1.status, p1.paid_at, p1.cost_amount
						  FROM payidem.payment p1
						 WHERE p1.payment_no = pp.payment_no
						 LIMIT 1) pay
				 WHERE pp.channel_no = v_channel AND pp.transaction_id = r.b_txn
				UNION ALL
				-- else the payment number the channel echoes: the same payment
				-- if ours has no transaction id (a success reported without
				-- one) and was paid this bill day, otherwise for the record only
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status,
					   pay.transaction_id IS NULL AND pay.paid_at >= v_from AND pay.paid_at < v_to,
					   pay.transaction_id IS NULL, pay.paid_at, pay.cost_amount
				  FROM payidem.payment pay
				 WHERE pay.payment_no = bn.b_no AND pay.channel_no = v_channel
				LIMIT 1) x ON true
		 WHERE r.kind = 'bill_only'
	),
	-- a payment of the day missing from the bill: in the bill of another day?
	-- (One without a transaction id is in this bill if a line echoing its
	-- number was matched to it above.)
	po AS (
		SELECT r.p_no, r.p_txn, r.p_amount, r.p_status,
			   EXISTS (SELECT 1 FROM payidem.channel_bill cb
						WHERE cb.channel_no = v_channel AND cb.transaction_id = r.p_txn
						  AND cb.bill_date <> v_day) AS elsewhere
		  FROM r
		 WHERE r.kind = 'platform_only'
		   AND NOT (r.p_txn IS NULL AND EXISTS (SELECT 1 FROM bo WHERE bo.x_no = r.p_no AND bo.x_paid))
	),
	found AS MATERIALIZED (
		SELECT r.kind AS diff_type, r.p_txn AS transaction_id, r.p_no AS payment_no,
			   r.p_amount AS platform_amount, r.b_amount AS channel_amount,
			   r.p_status AS platform_status, r.b_status AS channel_status,
			   CASE WHEN r.kind = 'fee_mismatch' THEN r.p_cost END AS platform_fee,
			   CASE WHEN r.kind = 'fee_mismatch' THEN r.b_fee END AS channel_fee
		  FROM r
		 WHERE r.kind IN ('amount_mismatch', 'status_mismatch', 'fee_mismatch')
		UNION ALL
		SELECT 'platform_only', po.p_txn, po.p_no, po.p_amount, NULL, po.p_status, NULL, NULL, NULL
		  FROM po
		 WHERE NOT po.elsewhere
		UNION ALL
		SELECT s.diff_type, s.b_txn, coalesce(s.x_no, s.b_no),
			   CASE WHEN s.x_paid THEN s.x_amount END, s.b_amount, s.x_status, s.b_status,
			   CASE WHEN s.diff_type = 'fee_mismatch' THEN s.x_cost END,
			   CASE WHEN s.diff_type = 'fee_mismatch' THEN s.b_fee END
		  FROM (SELECT bo.*,
					   CASE
						WHEN NOT bo.x_paid THEN 'channel_only'
						WHEN bo.x_amount <> bo.b_amount THEN 'amount_mismatch'
						WHEN (bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						  OR (bo.b_status = 'succeeded' AND bo.x_refunded) THEN 'status_mismatch'
						-- a line of another day (a midnight straddle): its fee too
						WHEN bo.b_fee <> bo.x_cost THEN 'fee_mismatch'
					   END AS diff_type
				  FROM bo) s
		 WHERE s.diff_type IS NOT NULL
	),
	-- platform_only differences of other days that this bill explains
	auto AS (
		UPDATE payidem.reconciliation rc
		   SET handle_status = 'auto_resolved', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('found in the bill of %s (%s)', to_char(v_day, 'YYYY-MM-DD'), v_batch),
			   updated_at = now()
		 WHERE rc.channel_no = v_channel
		   AND (rc.transaction_id = ANY (ARRAY(SELECT bo.b_txn FROM bo WHERE bo.x_paid))
				OR (rc.transaction_id IS NULL
					AND rc.payment_no = ANY (ARRAY(SELECT bo.x_no FROM bo WHERE bo.x_paid))))
		   AND rc.diff_type = 'platform_only' AND rc.handle_status = 'open'
		   AND rc.bill_date <> v_day
		RETURNING rc.recon_id
	),
	-- open differences found again keep their recon_id, with today's values
	kept AS (
		UPDATE payidem.reconciliation rc
		   SET recon_batch_no = v_batch, payment_no = f.payment_no,
			   platform_amount = f.platform_amount, channel_amount = f.channel_amount,
			   platform_status = f.platform_status, channel_status = f.channel_status,
			   platform_fee = f.platform_fee, channel_fee = f.channel_fee,
			   updated_at = now()
		  FROM found f
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND rc.diff_type = f.diff_type
		   AND (rc.transaction_id IS NULL) = (f.transaction_id IS NULL)
		   AND coalesce(rc.transaction_id, rc.payment_no) = coalesce(f.transaction_id, f.payment_no)
		RETURNING rc.recon_id
	),
	-- open differences not found again are gone (bill corrected, payment fixed)
	dropped AS (
		DELETE FROM payidem.reconciliation rc
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND NOT EXISTS (SELECT 1 FROM found f
							WHERE f.diff_type = rc.diff_type
							  AND (f.transaction_id IS NULL) = (rc.transaction_id IS NULL)
							  AND coalesce(f.transaction_id, f.payment_no) = coalesce(rc.transaction_id, rc.payment_no))
		RETURNING rc.recon_id
	),
	-- the anomaly of a channel_only difference that is gone goes with it
	settled AS (
		UPDATE payidem.anomaly a
		   SET handle_status = 'handled', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('its difference is gone in %s (the bill no longer shows it)', v_batch),
			   updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.handle_status = 'open' AND a.channel_no = v_channel
		   AND a.detail ->> 'bill_date' = to_char(v_day, 'YYYY-MM-DD')
		   AND (a.detail ->> 'recon_id')::bigint IN (SELECT d.recon_id FROM dropped d)
		RETURNING a.anomaly_id
	),
	-- new ones; one a person handled or ignored is not opened again
	added AS (
		INSERT INTO payidem.reconciliation AS rc
			(recon_batch_no, channel_no, bill_date, diff_type, transaction_id, payment_no,
			 platform_amount, channel_amount, platform_status, channel_status, platform_fee, channel_fee)
		SELECT v_batch, v_channel, v_day, f.diff_type, f.transaction_id, f.payment_no,
			   f.platform_amount, f.channel_amount, f.platform_status, f.channel_status,
			   f.platform_fee, f.channel_fee
		  FROM found f
		 WHERE NOT EXISTS (SELECT 1 FROM payidem.reconciliation e
							WHERE e.channel_no = v_channel AND e.bill_date = v_day
							  AND e.diff_type = f.diff_type
							  AND (e.transaction_id IS NULL) = (f.transaction_id IS NULL)
							  AND coalesce(e.transaction_id, e.payment_no) = coalesce(f.transaction_id, f.payment_no))
		RETURNING rc.recon_id, rc.diff_type, rc.transaction_id, rc.channel_amount
	),
	-- money taken without a record of ours: an anomaly, once per difference
	alerted AS (
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		SELECT 'channel_only', bo.x_order, bo.x_no, v_channel, a.channel_amount,
			   jsonb_strip_nulls(jsonb_build_object(
				   'transaction_id', a.transaction_id,
				   'bill_date', to_char(v_day, 'YYYY-MM-DD'),
				   'recon_id', a.recon_id,
				   'recon_batch_no', v_batch,
				   'channel_status', bo.b_status,
				   'channel_payment_no', bo.b_no,
				   'platform_status', bo.x_status))
		  FROM added a
		  JOIN bo ON bo.b_txn = a.transaction_id
		 WHERE a.diff_type = 'channel_only'
		-- one per channel, day and transaction; one that a run closed because
		-- its difference was gone is opened again now that it is back (one a
		-- person handled stays as the person left it)
		ON CONFLICT (channel_no, (detail ->> 'bill_date'), (detail ->> 'transaction_id'))
			WHERE kind = 'channel_only'
			DO UPDATE SET handle_status = 'open', handled_at = NULL, handled_by = NULL, note = NULL,
						  amount = EXCLUDED.amount, detail = EXCLUDED.detail, updated_at = now()
			WHERE anomaly.handled_by = 'payidem.reconcile' AND anomaly.handle_status <> 'open'
		RETURNING anomaly_id
	)
	SELECT (SELECT count(*) FROM r WHERE r.kind = 'matched') AS matched_candidates,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'platform_only') AS platform_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'channel_only') AS channel_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'amount_mismatch') AS amount_mismatch,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'status_mismatch') AS status_mismatch,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'fee_mismatch') AS fee_mismatch,
		   (SELECT count(*) FROM bo
			 WHERE bo.x_paid AND bo.x_amount = bo.b_amount
			   AND NOT ((bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						OR (bo.b_status = 'succeeded' AND bo.x_refunded))
			   AND NOT coalesce(bo.b_fee <> bo.x_cost, false)) AS matched_across,
		   (SELECT count(*) FROM bo WHERE bo.x_paid AND NOT bo.x_of_the_day)
			 + (SELECT count(*) FROM po WHERE po.elsewhere) AS straddled,
		   (SELECT count(*) FROM auto) AS auto_resolved,
		   (SELECT count(*) FROM kept) + (SELECT count(*) FROM dropped)
			 + (SELECT count(*) FROM alerted) AS touched
	  INTO n;

	UPDATE payidem.recon_batch b
	   SET status = 'done', finished_at = clock_timestamp(),
		   matched = v_matched + n.matched_candidates + n.matched_across,
		   platform_only = n.platform_only, channel_only = n.channel_only,
		   amount_mismatch = n.amount_mismatch, status_mismatch = n.status_mismatch,
		   fee_mismatch = n.fee_mismatch, bill_lines = v_bill_lines, bill_amount_total = v_bill_amount,
		   platform_payments = v_payments, platform_amount_total = v_pay_amount,
		   straddled = n.straddled, auto_resolved = n.auto_resolved
	 WHERE b.recon_batch_no = v_batch;

	RETURN QUERY SELECT v_batch, v_matched + n.matched_candidates + n.matched_across, n.platform_only, n.channel_only,
						n.amount_mismatch, n.status_mismatch, n.fee_mismatch;
END
$$;
COMMENT ON FUNCTION payidem.reconcile(text, date, boolean) IS
	'Reconcile a channel''s bill of one day (cut in payidem.bill_timezone) against the platform''s payments (55000 if no bill line of that day is loaded, unless allow_empty): one hash full join on transaction_id; stores only the differences (platform_only, channel_only, amount_mismatch, status_mismatch, fee_mismatch: the bill line''s fee is not the payment''s cost_amount), replacing the day''s open ones and keeping handled ones; auto-resolves midnight straddles; a channel_only difference also raises an anomaly.';

REVOKE ALL ON FUNCTION payidem.reconcile(text, date, boolean) FROM PUBLIC;
DO $$
BEGIN
	IF current_setting('payidem_update.reconcile_grantees') <> '' THEN
		RAISE WARNING 'reconcile() was made again with a new result column (fee_mismatch): roles % no longer may execute it',
			current_setting('payidem_update.reconcile_grantees') USING
			HINT = 'Run payidem.grant_app() (or GRANT EXECUTE ON FUNCTION payidem.reconcile(text, date, boolean)) for them again.';
	END IF;
END
$$;
-- the daily report counts fee_mismatch, and a fee_mismatch's money is its fees' gap
CREATE OR REPLACE VIEW payidem.recon_summary AS
SELECT b.channel_no, b.bill_date,
	   b.recon_batch_no AS last_batch_no, b.finished_at, b.bill_timezone,
	   b.bill_lines, b.bill_amount_total, b.platform_payments, b.platform_amount_total,
	   b.matched, b.platform_only, b.channel_only, b.amount_mismatch, b.status_mismatch,
	   b.straddled,
	   coalesce(d.open_count, 0) AS open_count,
	   coalesce(d.open_amount, 0) AS open_amount,
	   coalesce(d.open_channel_only, 0) AS open_channel_only,
	   coalesce(d.handled_count, 0) AS handled_count,
	   coalesce(d.ignored_count, 0) AS ignored_count,
	   coalesce(d.auto_resolved_count, 0) AS auto_resolved_count,
	   b.fee_mismatch
  FROM (SELECT DISTINCT ON (rb.channel_no, rb.bill_date) rb.*
		  FROM payidem.recon_batch rb
		 WHERE rb.status = 'done'
		 ORDER BY rb.channel_no, rb.bill_date, rb.started_at DESC,
				  pg_catalog.length(rb.recon_batch_no) DESC, rb.recon_batch_no DESC) b
  LEFT JOIN (SELECT rc.channel_no, rc.bill_date,
					count(*) FILTER (WHERE rc.handle_status = 'open') AS open_count,
					sum(CASE rc.diff_type
						 WHEN 'platform_only' THEN rc.platform_amount
						 WHEN 'channel_only' THEN rc.channel_amount
						 WHEN 'amount_mismatch' THEN pg_catalog.abs(rc.platform_amount - rc.channel_amount)
						 WHEN 'fee_mismatch' THEN pg_catalog.abs(rc.platform_fee - rc.channel_fee)
						 ELSE coalesce(rc.channel_amount, rc.platform_amount)
						END) FILTER (WHERE rc.handle_status = 'open') AS open_amount,
					count(*) FILTER (WHERE rc.handle_status = 'open' AND rc.diff_type = 'channel_only') AS open_channel_only,
					count(*) FILTER (WHERE rc.handle_status = 'handled') AS handled_count,
					count(*) FILTER (WHERE rc.handle_status = 'ignored') AS ignored_count,
					count(*) FILTER (WHERE rc.handle_status = 'auto_resolved') AS auto_resolved_count
			   FROM payidem.reconciliation rc
			  GROUP BY rc.channel_no, rc.bill_date) d
	ON d.channel_no = b.channel_no AND d.bill_date = b.bill_date;
COMMENT ON VIEW payidem.recon_summary IS
	'Daily reconciliation report per channel and bill day: the last run''s counts and totals, and the differences still open (count, money concerned, channel_only among them) or closed by a person or automatically.';
COMMENT ON COLUMN payidem.recon_summary.open_amount IS
	'Money concerned by the open differences, minor units: the amount of a platform_only, channel_only or status_mismatch, the gap of an amount_mismatch or of a fee_mismatch''s fees.';

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
REVOKE ALL ON FUNCTION payidem.grant_finance(regrole) FROM PUBLIC;

-- Is day a business day?  Monday to Friday, unless payidem.business_day
-- says otherwise.
CREATE FUNCTION payidem._is_business_day(day date)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT b.business FROM payidem.business_day b WHERE b.day = _is_business_day.day),
				extract(isodow FROM day) < 6);
COMMENT ON FUNCTION payidem._is_business_day(date) IS
	'Internal: whether a day is a business day (Monday to Friday unless payidem.business_day overrides it).';

-- The settlement day of an item of bill day `day` on cycle D<n> (n calendar
-- days later) or T<n> (the n-th business day after it, whatever day it is:
-- a Saturday's T1 is Monday, as Friday's is); D0 and T0 are the day itself.
-- The one place the cycle rule is written.
CREATE FUNCTION payidem._settle_day(day date, settle_cycle text)
RETURNS date
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n integer;
	d date := day;
	tries integer := 0;
BEGIN
	IF settle_cycle IS NULL OR settle_cycle !~ '^[TD][0-9]{1,2}$' THEN
		PERFORM payidem._raise_invalid('invalid settlement cycle',
			format('The cycle was %s; it is T<n> (business days) or D<n> (calendar days), n from 0 to 99.',
				coalesce(quote_literal(left(settle_cycle, 64)), 'NULL')));
	END IF;
	n := substr(settle_cycle, 2)::integer;
	IF left(settle_cycle, 1) = 'D' THEN
		RETURN day + n;
	END IF;
	WHILE n > 0 LOOP
		d := d + 1;
		tries := tries + 1;
		IF tries > 3660 THEN
			PERFORM payidem._raise('55000', 'no business day in ten years',
				format('payidem.business_day marks every day after %s as not a business day.', day),
				'Correct payidem.business_day.');
		END IF;
		IF payidem._is_business_day(d) THEN
			n := n - 1;
		END IF;
	END LOOP;
	RETURN d;
END
$$;
COMMENT ON FUNCTION payidem._settle_day(date, text) IS
	'Internal: the settlement day of an item of a bill day on a merchant''s cycle (D<n>: n calendar days later; T<n>: the n-th business day after).';

-- Where settle() reads from: the start of settle_state.scan_from in the zone
-- it was recorded in (scan_timezone: the instant stays the same whatever the
-- session's payidem.bill_timezone), never before settle_from (in the
-- session's zone); -infinity before the first run.
CREATE FUNCTION payidem._scan_start()
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT coalesce(greatest(timezone(coalesce(s.scan_timezone, payidem._bill_timezone()), s.scan_from::timestamp),
								 timezone(payidem._bill_timezone(), s.settle_from::timestamp)),
						'-infinity'::timestamptz)
		  FROM payidem.settle_state s
		UNION ALL SELECT '-infinity'::timestamptz LIMIT 1);
COMMENT ON FUNCTION payidem._scan_start() IS
	'Internal: the instant settle() reads items from (settle_state: scan_from in scan_timezone, not before settle_from).';

-- The bill day of a time: its date in payidem.bill_timezone.  Inlined into
-- the queries that call it, a row at a time (no SET clause: a function with
-- one is called, not inlined); its names are schema-qualified instead.
CREATE FUNCTION payidem._bill_day(t timestamptz, tz text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CAST(pg_catalog.timezone(tz, t) AS pg_catalog.date);
COMMENT ON FUNCTION payidem._bill_day(timestamptz, text) IS
	'Internal: the calendar day of a time in a zone (the bill day, with payidem.bill_timezone).';

-- The items not yet settled: succeeded payments and refunds from the bill
-- day settle() reads from (settle_state.scan_from) on, the payments it holds,
-- and those an open anomaly names.  The one definition of "not settled",
-- for settle(), balance()'s pending and the merchant_balances view.  For
-- a merchant (p_merchant_no), or all (NULL); up to the end of bill day
-- p_until (NULL: no end).  A refund's fee and cost are its share of its
-- payment's, rounded cumulatively: what round(fee * refunded / amount)
-- half-up comes to with this refund, less what the payment's refunds before
-- it returned.  A payment's first refund returns round(fee * refund /
-- amount); together its refunds never return more than its fee and cost, and
-- exactly them once it is fully refunded.  (Each refund rounded on its own
-- would not add up: four refunds of a quarter of a cost of 2 would each
-- return round(0.5) = 1, and the last, taking the remainder, -1.)
CREATE FUNCTION payidem._unsettled_items(p_merchant_no text, p_until date)
RETURNS TABLE (item_no text, item_type text, payment_no text, merchant_no text, channel_no text,
			   currency text, bill_day date, amount bigint, fee bigint, cost bigint, scanned boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text := payidem._bill_timezone();
	v_from timestamptz := payidem._scan_start();
	-- (no payment of a day before settle_from: history paid outside payidem)
	v_floor timestamptz := (SELECT timezone(v_tz, s.settle_from::timestamp) FROM payidem.settle_state s);
	v_to timestamptz := CASE WHEN p_until IS NULL THEN 'infinity'::timestamptz
							 ELSE timezone(v_tz, (p_until + 1)::timestamp) END;
BEGIN
	RETURN QUERY
	WITH pay AS (
		-- the payments of the bill days read: by channel and time, from
		-- payment_paid (the key reconciliation reads), for all merchants ...
		SELECT pp.payment_no, true AS scanned
		  FROM payidem.channel c
		 CROSS JOIN LATERAL (
				SELECT x.payment_no FROM payidem.payment_paid x
				 WHERE x.channel_no = c.channel_no AND x.paid_at >= v_from AND x.paid_at < v_to) pp
		 WHERE p_merchant_no IS NULL
		UNION ALL
		-- ... or by the merchant's own key (merchant, channel, begun), for one
		-- (a payment begins before it is paid; one begun before the scan
		-- point and paid after it is held or named by an anomaly, below, or
		-- read here as long as it began at most 30 days before)
		SELECT p.payment_no, true
		  FROM payidem.merchant_channel mc
		 CROSS JOIN LATERAL (
				SELECT x.payment_no, x.paid_at FROM payidem.payment x
				 WHERE x.merchant_no = mc.merchant_no AND x.channel_no = mc.channel_no
				   AND x.created_at >= v_from - interval '30 days') p
		 WHERE p_merchant_no IS NOT NULL AND mc.merchant_no = p_merchant_no
		   AND p.paid_at >= v_from AND p.paid_at < v_to
		UNION ALL
		SELECT h.payment_no, false FROM payidem.settlement_hold h
		UNION ALL
		SELECT a.payment_no, false FROM payidem.anomaly a
		 WHERE a.handle_status = 'open' AND a.payment_no IS NOT NULL
	),
	-- each payment once (read by its day and held, say)
	each AS (
		SELECT x.payment_no, bool_or(x.scanned) AS scanned FROM pay x GROUP BY x.payment_no
	),
	payments AS (
		SELECT p.payment_no AS item_no, 'payment'::text AS item_type, p.payment_no, p.merchant_no,
			   p.channel_no, o.currency::text AS currency, payidem._bill_day(p.paid_at, v_tz) AS bill_day,
			   p.amount::bigint AS amount, p.fee_amount AS fee, p.cost_amount AS cost, e.scanned
		  FROM each e
		  JOIN payidem.payment p ON p.payment_no = e.payment_no
		  JOIN payidem."order" o ON o.order_no = p.order_no
		 WHERE p.status = ANY (payidem._paid_payment_statuses())
		   AND (p_merchant_no IS NULL OR p.merchant_no = p_merchant_no)
		   AND p.paid_at < v_to AND (v_floor IS NULL OR p.paid_at >= v_floor)
		   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = p.payment_no)
	),
	refunds AS (
		SELECT r.refund_no, r.payment_no, r.merchant_no, r.amount::bigint AS amount, r.refunded_at
		  FROM payidem.merchant m
		 CROSS JOIN LATERAL (
				SELECT x.refund_no, x.payment_no, x.merchant_no, x.amount, x.refunded_at
				  FROM payidem.refund x
				 WHERE x.merchant_no = m.merchant_no AND x.refunded_at >= v_from AND x.refunded_at < v_to
				   AND x.status = 'succeeded') r
		 WHERE p_merchant_no IS NULL OR m.merchant_no = p_merchant_no
	),
	unsettled_refunds AS (
		SELECT r.*
		  FROM refunds r
		 WHERE NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = r.refund_no)
	),
	-- a refund's share: what the payment's refunded amount so far (its
	-- settled refunds, then its unsettled ones in the order they succeeded,
	-- this one included) returns of the fee and cost, round(fee * refunded /
	-- amount) half-up, less what was returned before it (by the settled
	-- refunds, then the unsettled ones before it)
	shares AS (
		SELECT r.refund_no, r.payment_no, r.merchant_no, r.amount, r.refunded_at,
			   p.channel_no, o.currency::text AS currency, p.amount AS p_amount,
			   p.fee_amount, p.cost_amount, st.amount AS s_amount, st.fee AS s_fee, st.cost AS s_cost,
			   sum(r.amount) OVER (PARTITION BY r.payment_no ORDER BY r.refunded_at, r.refund_no) AS upto
		  FROM unsettled_refunds r
		  JOIN payidem.payment p ON p.payment_no = r.payment_no
		  JOIN payidem."order" o ON o.order_no = p.order_no
		 CROSS JOIN LATERAL (
				SELECT coalesce(sum(si.amount), 0) AS amount, coalesce(sum(si.fee), 0) AS fee,
					   coalesce(sum(si.cost), 0) AS cost
				  FROM payidem.refund r2
				  JOIN payidem.settlement_item si ON si.item_no = r2.refund_no
				 WHERE r2.payment_no = r.payment_no) st
	)
	SELECT x.item_no, x.item_type, x.payment_no, x.merchant_no, x.channel_no, x.currency, x.bill_day,
		   x.amount, x.fee, x.cost, x.scanned
	  FROM payments x
	UNION ALL
	SELECT s.refund_no, 'refund', s.payment_no, s.merchant_no, s.channel_no, s.currency,
		   payidem._bill_day(s.refunded_at, v_tz), s.amount,
		   (greatest(round(s.fee_amount::numeric * (s.s_amount + s.upto) / s.p_amount) - s.s_fee, 0)
			- greatest(round(s.fee_amount::numeric * (s.s_amount + s.upto - s.amount) / s.p_amount) - s.s_fee, 0))::bigint,
		   (greatest(round(s.cost_amount::numeric * (s.s_amount + s.upto) / s.p_amount) - s.s_cost, 0)
			- greatest(round(s.cost_amount::numeric * (s.s_amount + s.upto - s.amount) / s.p_amount) - s.s_cost, 0))::bigint,
		   true
	  FROM shares s;
END
$$;
COMMENT ON FUNCTION payidem._unsettled_items(text, date) IS
	'Internal: succeeded payments and refunds not yet settled (of one merchant or all, up to a bill day), with their fee and cost (a refund''s share); the one definition settle(), balance() and merchant_balances use.';

-- settle(d): every item whose settlement day is on or before d and that may
-- be settled, exactly once (settlement_item's key decides); a payment only
-- once its channel's bill day is reconciled and no open difference or
-- anomaly names it (else held, and looked at again by every run).  One run
-- at a time: the row of settle_state is locked to the end of the
-- transaction (a second run waits, then finds the first's items settled).
-- Everything in one statement, set-based: the items, their journals, the
-- balances, the holds.
CREATE FUNCTION payidem.settle(settle_date date DEFAULT CURRENT_DATE)
RETURNS TABLE (merchant_no text, currency text, items bigint, gross numeric, refunds numeric,
			   fees numeric, net numeric, held bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
	v_d date := settle.settle_date;
	v_tz text := payidem._bill_timezone();
	st payidem.settle_state;
	v_today date;
	v_pending_from date;
BEGIN
	IF v_d IS NULL OR NOT isfinite(v_d) OR v_d < date '1970-01-01' OR v_d > date '9999-12-30' THEN
		PERFORM payidem._raise_invalid('invalid settlement date',
			format('The date was %s; settle() takes a day from 1970-01-01 to 9999-12-30.', coalesce(v_d::text, 'NULL')),
			'Pass the day to settle up to, e.g. current_date.');
	END IF;
	-- (runs wait for each other on settle_state's row, then read what the
	-- one before settled: READ COMMITTED shows it, REPEATABLE READ would not)
	PERFORM payidem._refuse_repeatable_read('settle', 'the items other runs settled');
	INSERT INTO payidem.settle_state (id) VALUES (true) ON CONFLICT DO NOTHING;
	SELECT * INTO st FROM payidem.settle_state s FOR UPDATE;
	-- a run in another payidem.bill_timezone than the one scan_from is a day
	-- of: the day of this zone that holds the same instant (reading a little
	-- more, never less)
	IF st.scan_from IS NOT NULL AND st.scan_timezone IS DISTINCT FROM v_tz THEN
		UPDATE payidem.settle_state s
		   SET scan_from = (timezone(coalesce(st.scan_timezone, v_tz), st.scan_from::timestamp) AT TIME ZONE v_tz)::date,
			   scan_timezone = v_tz
		 WHERE s.id
		RETURNING * INTO st;
	END IF;
	-- the first bill day a pending order may still bring a payment of: its
	-- attempts may succeed at any time, with a paid_at as early as the order
	-- was made (less the clock skew a channel is allowed), and commit after
	-- this run has read.  Read before the run reads (an earlier snapshot): an
	-- order paid in between is paid in what the run reads.
	SELECT payidem._bill_day(min(o.created_at)
							 - coalesce(nullif(current_setting('payidem.max_clock_skew', true), '')::interval,
										interval '1 day'), v_tz)
	  INTO v_pending_from
	  FROM payidem.order_expiry q JOIN payidem."order" o ON o.order_no = q.order_no
	 WHERE o.status = 'pending';

	v_today := (now() AT TIME ZONE v_tz)::date;
	RETURN QUERY
	WITH u AS MATERIALIZED (
		SELECT x.*, m.settle_cycle
		  FROM payidem._unsettled_items(NULL, v_d) x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
	),
	-- the cycle rule once per bill day and cycle, not per item
	d AS MATERIALIZED (
		SELECT y.bill_day, y.settle_cycle, payidem._settle_day(y.bill_day, y.settle_cycle) AS settle_day
		  FROM (SELECT DISTINCT u.bill_day, u.settle_cycle FROM u) y
	),
	-- each item: due (its settlement day reached), and allowed (a refund
	-- always; a payment once its channel's bill day is reconciled and no
	-- open difference or anomaly names it)
	-- the channel days reconciled, once each (not a look-up per item)
	reconciled AS MATERIALIZED (
		SELECT c.channel_no, c.bill_day
		  FROM (SELECT DISTINCT u.channel_no, u.bill_day FROM u WHERE u.item_type = 'payment') c
		 WHERE EXISTS (SELECT 1 FROM payidem.recon_batch b
						WHERE b.channel_no = c.channel_no AND b.bill_date = c.bill_day AND b.status = 'done')
	),
	-- the payments an open anomaly or an open difference names (their
	-- partial indexes of open ones)
	flagged AS MATERIALIZED (
		SELECT a.payment_no FROM payidem.anomaly a
		 WHERE a.handle_status = 'open' AND a.payment_no IS NOT NULL
		UNION
		SELECT rc.payment_no FROM payidem.reconciliation rc
		 WHERE rc.handle_status = 'open' AND rc.payment_no IS NOT NULL
	),
	run0 AS MATERIALIZED (
		SELECT u.item_no, u.item_type, u.payment_no, u.merchant_no, u.channel_no, u.currency, u.bill_day,
			   d.settle_day, u.amount, u.fee, u.cost, u.scanned,
			   d.settle_day <= v_d AS due,
			   u.item_type = 'refund'
			   OR (rd.channel_no IS NOT NULL AND fl.payment_no IS NULL) AS allowed
		  FROM u
		  JOIN d ON d.bill_day = u.bill_day AND d.settle_cycle = u.settle_cycle
		  LEFT JOIN reconciled rd ON rd.channel_no = u.channel_no AND rd.bill_day = u.bill_day
		  LEFT JOIN flagged fl ON fl.payment_no = u.payment_no
	),
	-- a merchant whose available balance this run would take out of the
	-- bigint range (amounts up to the bigint maximum are accepted) is not
	-- settled: its due items are held, and the other merchants are settled
	beyond AS (
		SELECT x.merchant_no, x.currency
		  FROM (SELECT r.merchant_no, r.currency,
					   sum(CASE WHEN r.item_type = 'payment' THEN r.amount - r.fee ELSE r.fee - r.amount END) AS moves
				  FROM run0 r
				 WHERE r.due AND r.allowed
				 GROUP BY r.merchant_no, r.currency) x
		  LEFT JOIN payidem.merchant_balance b ON b.merchant_no = x.merchant_no AND b.currency = x.currency
		 WHERE (coalesce(b.available, 0) + x.moves NOT BETWEEN -9223372036854775808 AND 9223372036854775807
				OR x.moves NOT BETWEEN -9223372036854775808 AND 9223372036854775807)
		   -- (looked at only when some merchant could: the run's amounts and
		   -- the largest balance together pass the range)
		   AND (SELECT coalesce(sum(r.amount), 0) FROM run0 r WHERE r.due AND r.allowed)
			   + (SELECT coalesce(max(greatest(b2.available, -b2.available)), 0) FROM payidem.merchant_balance b2)
			   > 9223372036854775807
	),
	run AS MATERIALIZED (
		SELECT x.item_no, x.item_type, x.payment_no, x.merchant_no, x.channel_no, x.currency, x.bill_day,
			   x.settle_day, x.amount, x.fee, x.cost, x.scanned, x.due,
			   x.allowed AND NOT EXISTS (SELECT 1 FROM beyond o
										  WHERE o.merchant_no = x.merchant_no AND o.currency = x.currency) AS allowed
		  FROM run0 x
	),
	settled AS (
		INSERT INTO payidem.settlement_item AS si
			(item_no, item_type, payment_no, merchant_no, channel_no, currency, bill_day, settle_day,
			 settle_date, amount, fee, cost)
		SELECT r.item_no, r.item_type, r.payment_no, r.merchant_no, r.channel_no, r.currency, r.bill_day,
			   r.settle_day, v_d, r.amount, r.fee, r.cost
		  FROM run r
		 WHERE r.due AND r.allowed
		ON CONFLICT (item_no) DO NOTHING
		RETURNING si.item_no, si.item_type, si.merchant_no, si.channel_no, si.currency::text AS currency,
				  si.amount, si.fee, si.cost
	),
	sums AS (
		SELECT s.merchant_no, s.currency, count(*) AS items,
			   coalesce(sum(s.amount) FILTER (WHERE s.item_type = 'payment'), 0) AS gross,
			   coalesce(sum(s.amount) FILTER (WHERE s.item_type = 'refund'), 0) AS refunds,
			   coalesce(sum(s.fee) FILTER (WHERE s.item_type = 'payment'), 0)
				 - coalesce(sum(s.fee) FILTER (WHERE s.item_type = 'refund'), 0) AS fees
		  FROM settled s
		 GROUP BY s.merchant_no, s.currency
	),
	-- each merchant's balance row moves by what its items bring, locked in
	-- the order of merchant_no
	balances AS (
		INSERT INTO payidem.merchant_balance AS b (merchant_no, currency, available)
		SELECT x.merchant_no, x.currency, (x.gross - x.refunds - x.fees)::bigint
		  FROM sums x
		 ORDER BY x.merchant_no, x.currency
		ON CONFLICT (merchant_no, currency) DO UPDATE
		   SET available = b.available + EXCLUDED.available, updated_at = now()
		RETURNING 1
	),
	-- each item's journal (journal_no = its number): a payment credits the
	-- merchant its amount less its fee and the platform the fee, and debits
	-- the channel what it remits less its cost and the cost; a refund the
	-- reverse of its share.  Written once every balance row is locked (the
	-- join with balances: no entry before all of its rows): a merchant's
	-- entries are written in the order its balance moved (_post too), the
	-- order verify() replays them in.
	entries AS (
		INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
		SELECT s.item_no, e.account, e.merchant_no, e.channel_no, s.currency, e.amount * e.sign, s.item_no
		  FROM settled s
		 CROSS JOIN (SELECT count(*) FROM balances) locked
		 CROSS JOIN LATERAL (
				SELECT CASE WHEN s.item_type = 'payment' THEN 1 ELSE -1 END AS sign) g
		 CROSS JOIN LATERAL (VALUES
				('channel_receivable'::text, NULL::text, s.channel_no, s.amount - s.cost, g.sign),
				('channel_cost', NULL, NULL, s.cost, g.sign),
				('merchant_available', s.merchant_no, NULL, -(s.amount - s.fee), g.sign),
				('fee_revenue', NULL, NULL, -s.fee, g.sign)) e(account, merchant_no, channel_no, amount, sign)
		 WHERE e.amount <> 0
		RETURNING 1
	),
	unheld AS (
		DELETE FROM payidem.settlement_hold h
		 WHERE h.payment_no IN (SELECT s.item_no FROM settled s WHERE s.item_type = 'payment')
		RETURNING 1
	),
	blocked AS (
		SELECT r.merchant_no, r.currency, count(*) AS held
		  FROM run r
		 WHERE r.due AND NOT r.allowed
		 GROUP BY r.merchant_no, r.currency
	),
	-- held: the payments due but blocked, and those found only through an
	-- open anomaly that are not settled now (once it is resolved, nothing
	-- else would find them)
	holds AS (
		INSERT INTO payidem.settlement_hold (payment_no)
		SELECT r.payment_no FROM run r
		 WHERE r.item_type = 'payment' AND ((r.due AND NOT r.allowed) OR (NOT r.scanned AND NOT r.allowed)
											OR (NOT r.scanned AND NOT r.due))
		ON CONFLICT (payment_no) DO NOTHING
		RETURNING 1
	),
	-- where the next run starts reading: the first bill day with an item
	-- read but not yet due (or a refund held, which settlement_hold does not
	-- keep), but never past yesterday (a payment of yesterday
	-- may still be committed), nor past d + 1 (later days were not read),
	-- nor past the first day a pending order may still bring a payment of
	-- (its success may commit after this run read; a success for an order no
	-- longer pending is an anomaly, which names it); not moved while a
	-- transaction older than the last run is still open (it may commit an
	-- item of a day already passed); never back but for a pending order
	progress AS (
		UPDATE payidem.settle_state s
		   SET scan_from = CASE
				WHEN st.scan_from IS NOT NULL AND st.last_xmax IS NOT NULL
					 AND pg_snapshot_xmin(pg_current_snapshot()) < st.last_xmax THEN st.scan_from
				WHEN st.scan_from IS NULL AND NOT EXISTS (SELECT 1 FROM run) THEN NULL
				ELSE least(greatest(least(coalesce((SELECT min(r.bill_day) FROM run r
													 WHERE r.scanned AND (NOT r.due OR (NOT r.allowed AND r.item_type = 'refund'))),
												   v_d + 1),
										  v_d + 1, v_today - 1),
									st.scan_from),
						   greatest(v_pending_from, st.settle_from))
			   END,
			   scan_timezone = v_tz,
			   last_scan_from = st.scan_from,
			   last_xmax = pg_snapshot_xmax(pg_current_snapshot()),
			   last_run_at = now(), last_settle_date = v_d
		 WHERE s.id
		RETURNING 1
	),
	touched AS (
		SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM balances)
			   + (SELECT count(*) FROM unheld) + (SELECT count(*) FROM holds)
			   + (SELECT count(*) FROM progress) AS n
	)
	SELECT coalesce(x.merchant_no, k.merchant_no), coalesce(x.currency, k.currency),
		   coalesce(x.items, 0), coalesce(x.gross, 0)::numeric, coalesce(x.refunds, 0)::numeric,
		   coalesce(x.fees, 0)::numeric, coalesce(x.gross - x.refunds - x.fees, 0)::numeric,
		   coalesce(k.held, 0)
	  FROM sums x
	  FULL JOIN blocked k ON k.merchant_no = x.merchant_no AND k.currency = x.currency
	 CROSS JOIN touched
	 WHERE touched.n >= 0
	 ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION payidem.settle(date) IS
	'Settle every succeeded payment and refund whose settlement day (bill day plus the merchant''s settle_cycle) is on or before settle_date, each once: payments only once their channel''s bill day is reconciled and no open difference or anomaly names them (held otherwise; so is every item of a merchant whose balance would leave the bigint range). One row per merchant and currency with items settled or held.';

-- The worker's daily run: settle(today in payidem.bill_timezone) once the
-- day's payidem.settle_after has passed, once a day (settle_state.worker_day).
-- Returns whether it ran.
CREATE FUNCTION payidem._settle_if_due()
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text := payidem._bill_timezone();
	v_local timestamp := now() AT TIME ZONE v_tz;
	v_after time := coalesce(nullif(current_setting('payidem.settle_after', true), ''), '02:00')::time;
	v_day date;
BEGIN
	IF v_local::time < v_after THEN
		RETURN false;
	END IF;
	SELECT s.worker_day INTO v_day FROM payidem.settle_state s;
	IF v_day >= v_local::date THEN
		RETURN false;
	END IF;
	PERFORM count(*) FROM payidem.settle(v_local::date);
	UPDATE payidem.settle_state s SET worker_day = v_local::date WHERE s.id;
	RETURN true;
END
$$;
COMMENT ON FUNCTION payidem._settle_if_due() IS
	'Internal to the housekeeping worker: settle(today) once a day, after payidem.settle_after in payidem.bill_timezone.';

------------------------------------------------------------------------------
-- Payouts and adjustments
------------------------------------------------------------------------------

-- A currency argument: three upper-case letters (22023).
CREATE FUNCTION payidem._check_currency(currency text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF currency IS NULL OR currency !~ '^[A-Z]{3}$' THEN
		PERFORM payidem._raise_invalid('invalid currency',
			format('The currency was %s; it is an ISO 4217 code of three upper-case letters.',
				coalesce(quote_literal(left(currency, 64)), 'NULL')),
			'For example ''CNY''.');
	END IF;
	RETURN currency;
END
$$;

-- The merchant of a payout or adjustment: PI009 if there is none; its status.
CREATE FUNCTION payidem._merchant_status(merchant_no text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_status text;
BEGIN
	PERFORM payidem._require('merchant_no', merchant_no);
	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = _merchant_status.merchant_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	RETURN v_status;
END
$$;

-- Two entries of one journal, against a merchant's balance: the one way the
-- payout and adjustment functions post.  d_available / d_in_payout: how the
-- merchant's balances move (the merchant accounts' entries are their
-- negation); other_account takes what balances the journal.  The balance
-- row (made at 0 if missing) moves first, which locks it, then the entries
-- are written: every writer of a merchant's entries holds its balance row
-- while it writes them, so their order (entry_id) is the order the balance
-- moved in (verify() replays it).
CREATE FUNCTION payidem._post(p_journal text, p_source text, p_merchant_no text, p_currency text,
	d_available bigint, d_in_payout bigint, other_account text)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_other bigint := d_available + d_in_payout;
BEGIN
	-- (an update, the row made at 0 first if missing: an upsert would check
	-- the row it proposes, a negative in_payout, before finding the old one)
	UPDATE payidem.merchant_balance b
	   SET available = b.available + d_available, in_payout = b.in_payout + d_in_payout, updated_at = now()
	 WHERE b.merchant_no = p_merchant_no AND b.currency = p_currency;
	IF NOT FOUND THEN
		INSERT INTO payidem.merchant_balance (merchant_no, currency) VALUES (p_merchant_no, p_currency)
		ON CONFLICT DO NOTHING;
		UPDATE payidem.merchant_balance b
		   SET available = b.available + d_available, in_payout = b.in_payout + d_in_payout, updated_at = now()
		 WHERE b.merchant_no = p_merchant_no AND b.currency = p_currency;
	END IF;
	-- (the entries after the balance's lock: their order is the order in
	-- which the merchant's balance moved)
	INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
	SELECT p_journal, e.account, e.merchant_no, NULL, p_currency, e.amount, p_source
	  FROM (VALUES ('merchant_available'::text, p_merchant_no, -d_available),
				   ('merchant_payout', p_merchant_no, -d_in_payout),
				   (other_account, NULL, v_other)) e(account, merchant_no, amount)
	 WHERE e.amount <> 0;
END
$$;
COMMENT ON FUNCTION payidem._post(text, text, text, text, bigint, bigint, text) IS
	'Internal: one journal moving a merchant''s available and in-payout balances, balanced by other_account; the balance row moves with it.';

CREATE FUNCTION payidem.request_payout(merchant_no text, amount bigint, out_payout_no text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_merchant_no text := request_payout.merchant_no;
	v_amount bigint := request_payout.amount;
	v_out text := request_payout.out_payout_no;
	v_currency text := request_payout.currency;
	v_status text;
	v_payout_no text;
	v_available bigint;
	p payidem.payout;
BEGIN
	PERFORM payidem._require('merchant_no', v_merchant_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		PERFORM payidem._raise_invalid('invalid payout amount',
			format('The amount was %s; it must be a positive number of minor units (fen, cents).',
				coalesce(v_amount::text, 'NULL')),
			'Pass 12.50 CNY as 1250.');
	END IF;
	IF v_out IS NULL OR NOT payidem._fits(v_out, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_payout_no', v_out, 'payidem.merchant_ref',
										'Use your own number for the payout, e.g. PAYOUT-20261207-0001.');
	END IF;
	PERFORM payidem._check_currency(v_currency);
	v_status := payidem._merchant_status(v_merchant_no);

	-- a repeated request: the same payout, or PI001
	SELECT * INTO p FROM payidem.payout x WHERE x.merchant_no = v_merchant_no AND x.out_payout_no = v_out;
	IF NOT FOUND THEN
		IF v_status <> 'active' THEN
			RAISE EXCEPTION 'merchant % is %', v_merchant_no, v_status USING
				ERRCODE = 'PI004',
				DETAIL = format('Merchant %s has status %s.', v_merchant_no, v_status),
				HINT = 'Only active merchants are paid out; what a closed merchant is owed is paid with adjust_balance().';
		END IF;
		-- never more than is available: the balance row's lock orders
		-- concurrent payouts of the merchant, each sees what the one before
		-- left, and the payout records what it saw
		SELECT b.available INTO v_available FROM payidem.merchant_balance b
		 WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency
		   FOR NO KEY UPDATE;
		-- the unique constraint decides between concurrent first calls: the
		-- loser waits for the winner's commit and answers as a repeat
		INSERT INTO payidem.payout AS x (payout_no, merchant_no, out_payout_no, amount, currency, available_before)
		VALUES (payidem.gen_order_no('PT'), v_merchant_no, v_out, v_amount, v_currency, coalesce(v_available, 0))
		ON CONFLICT ON CONSTRAINT payout_out_payout_no_key DO NOTHING
		RETURNING x.payout_no INTO v_payout_no;
		IF v_payout_no IS NOT NULL THEN
			IF coalesce(v_available, 0) < v_amount THEN
				RAISE EXCEPTION 'insufficient balance for a payout of % %', v_amount, v_currency USING
					ERRCODE = 'PI010',
					DETAIL = format('Merchant %s has %s %s available; the payout asked for %s.',
									v_merchant_no, coalesce(v_available, 0), v_currency, v_amount),
					HINT = 'Request at most the available balance (payidem.balance()); settled payments add to it.';
			END IF;
			PERFORM payidem._post(v_payout_no, v_payout_no, v_merchant_no, v_currency,
								  -v_amount, v_amount, 'payout_clearing');
			RETURN v_payout_no;
		END IF;
		SELECT * INTO p FROM payidem.payout x WHERE x.merchant_no = v_merchant_no AND x.out_payout_no = v_out;
	END IF;
	IF p.amount <> v_amount OR p.currency <> v_currency THEN
		RAISE EXCEPTION 'out_payout_no % was already used with different parameters', v_out USING
			ERRCODE = 'PI001',
			DETAIL = format('Payout %s of merchant %s is %s %s; this request is %s %s.',
							p.payout_no, v_merchant_no, p.amount, p.currency, v_amount, v_currency),
			HINT = 'Use a new out_payout_no for a new payout.';
	END IF;
	RETURN p.payout_no;
END
$$;
COMMENT ON FUNCTION payidem.request_payout(text, bigint, text, text) IS
	'Pay out part of a merchant''s available balance: returns the payout number (PT...). PI010 above the available balance (also under concurrency), PI004 unless the merchant is active, PI001 for an out_payout_no reused with another amount; a repeat returns the same payout.';

CREATE FUNCTION payidem.apply_payout_result(payout_no text, status text, bank_ref text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_payout_no text := apply_payout_result.payout_no;
	v_status text := apply_payout_result.status;
	v_ref text := apply_payout_result.bank_ref;
	p payidem.payout;
BEGIN
	PERFORM payidem._check_number('payout', v_payout_no);
	IF v_status IS NULL OR v_status NOT IN ('succeeded', 'failed') THEN
		PERFORM payidem._raise_invalid('invalid payout status ' || coalesce(quote_literal(left(v_status, 64)), 'NULL'),
			'A payout ends succeeded or failed.', 'Report what the bank answered: succeeded or failed.');
	END IF;
	IF v_ref IS NOT NULL AND NOT payidem._fits(v_ref, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('bank_ref', v_ref, 'payidem.channel_ref', 'Pass the bank''s reference, or NULL.');
	END IF;
	-- lock order: the payout, then its merchant's balance (_post)
	SELECT * INTO p FROM payidem.payout x WHERE x.payout_no = v_payout_no FOR UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('payout', v_payout_no, 'payidem.payout', 'payout_no');
	END IF;
	IF p.status = v_status AND (v_ref IS NULL OR p.bank_ref IS NULL OR v_ref = p.bank_ref) THEN
		IF p.bank_ref IS NULL AND v_ref IS NOT NULL THEN
			-- the bank's reference, first given with a repeat
			UPDATE payidem.payout x SET bank_ref = v_ref, updated_at = now() WHERE x.payout_no = v_payout_no;
		END IF;
		RETURN 'duplicate';
	END IF;
	IF p.status <> 'pending' THEN
		-- the bank contradicts what was applied: a person looks at it
		INSERT INTO payidem.anomaly (kind, amount, detail)
		VALUES ('conflicting_payout_result', p.amount,
				jsonb_strip_nulls(jsonb_build_object('payout_no', p.payout_no, 'merchant_no', p.merchant_no,
					'applied_status', p.status, 'applied_bank_ref', p.bank_ref,
					'reported_status', v_status, 'reported_bank_ref', v_ref)));
		RETURN 'rejected';
	END IF;
	UPDATE payidem.payout x
	   SET status = v_status, bank_ref = coalesce(v_ref, x.bank_ref), finished_at = now(), updated_at = now()
	 WHERE x.payout_no = v_payout_no;
	IF v_status = 'succeeded' THEN
		PERFORM payidem._post(v_payout_no || '/succeeded', v_payout_no, p.merchant_no, p.currency,
							  0, -p.amount, 'payout_clearing');
	ELSE
		PERFORM payidem._post(v_payout_no || '/failed', v_payout_no, p.merchant_no, p.currency,
							  p.amount, -p.amount, 'payout_clearing');
	END IF;
	RETURN 'applied';
END
$$;
COMMENT ON FUNCTION payidem.apply_payout_result(text, text, text) IS
	'Record the bank''s answer to a payout: succeeded (the money left) or failed (it returns to the available balance). applied, duplicate (the same answer again), or rejected (a contradicting answer: an anomaly conflicting_payout_result, nothing else changes).';

CREATE FUNCTION payidem.adjust_balance(merchant_no text, amount bigint, out_adjust_no text, reason text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_merchant_no text := adjust_balance.merchant_no;
	v_amount bigint := adjust_balance.amount;
	v_out text := adjust_balance.out_adjust_no;
	v_currency text := adjust_balance.currency;
	v_adjust_no text;
	a payidem.adjustment;
BEGIN
	PERFORM payidem._require('merchant_no', v_merchant_no);
	-- (the smallest bigint has no opposite: its entry could not be written)
	IF v_amount IS NULL OR v_amount = 0 OR v_amount = -9223372036854775807 - 1 THEN
		PERFORM payidem._raise_invalid('invalid adjustment amount',
			format('The amount was %s; it is a non-zero number of minor units, from -9223372036854775807 up: positive credits the merchant, negative debits it.',
				coalesce(v_amount::text, 'NULL')));
	END IF;
	IF v_out IS NULL OR NOT payidem._fits(v_out, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_adjust_no', v_out, 'payidem.merchant_ref',
										'Use your own number for the adjustment, e.g. ADJ-20261207-0001.');
	END IF;
	IF reason IS NULL OR length(btrim(reason)) NOT BETWEEN 1 AND 256 THEN
		PERFORM payidem._raise_invalid('an adjustment needs a reason',
			format('The reason was %s; it must have 1 to 256 characters (not only spaces).',
				coalesce(quote_literal(left(reason, 64)), 'NULL')),
			'Say why, e.g. ''chargeback of PY...''.');
	END IF;
	PERFORM payidem._check_no_controls('invalid adjustment reason', 'The reason', reason);
	PERFORM payidem._check_currency(v_currency);
	PERFORM payidem._merchant_status(v_merchant_no);	-- any status: a closed merchant is still owed
	-- a balance that would leave the bigint range: refused, nothing written
	IF (SELECT b.available::numeric + v_amount FROM payidem.merchant_balance b
		 WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency)
	   NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
		PERFORM payidem._raise_invalid('adjustment out of range',
			format('Merchant %s has %s %s available; adding %s would pass the range of a bigint.',
				   v_merchant_no, (SELECT b.available FROM payidem.merchant_balance b
								   WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency),
				   v_currency, v_amount));
	END IF;

	INSERT INTO payidem.adjustment AS x (adjust_no, merchant_no, out_adjust_no, amount, currency, reason)
	VALUES (payidem.gen_order_no('AJ'), v_merchant_no, v_out, v_amount, v_currency, reason)
	ON CONFLICT ON CONSTRAINT adjustment_out_adjust_no_key DO NOTHING
	RETURNING x.adjust_no INTO v_adjust_no;
	IF v_adjust_no IS NOT NULL THEN
		PERFORM payidem._post(v_adjust_no, v_adjust_no, v_merchant_no, v_currency, v_amount, 0, 'adjustment');
		RETURN v_adjust_no;
	END IF;
	SELECT * INTO a FROM payidem.adjustment x WHERE x.merchant_no = v_merchant_no AND x.out_adjust_no = v_out;
	IF a.amount <> v_amount OR a.currency <> v_currency THEN
		RAISE EXCEPTION 'out_adjust_no % was already used with different parameters', v_out USING
			ERRCODE = 'PI001',
			DETAIL = format('Adjustment %s of merchant %s is %s %s; this request is %s %s.',
							a.adjust_no, v_merchant_no, a.amount, a.currency, v_amount, v_currency),
			HINT = 'Use a new out_adjust_no for a new adjustment.';
	END IF;
	RETURN a.adjust_no;
END
$$;
COMMENT ON FUNCTION payidem.adjust_balance(text, bigint, text, text, text) IS
	'Credit (positive amount) or debit (negative) a merchant''s available balance against the platform''s adjustment account, with a reason: returns the adjustment number (AJ...); a repeat with the same out_adjust_no and amount returns the same one, another amount is PI001.';

CREATE FUNCTION payidem.set_merchant_notify_url(merchant_no text, url text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._merchant_status(merchant_no);
	IF NOT payidem._fits(url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('notify_url', url, 'payidem.http_url',
										'Pass NULL for no notifications of payouts.');
	END IF;
	UPDATE payidem.merchant m SET notify_url = url, updated_at = now()
	 WHERE m.merchant_no = set_merchant_notify_url.merchant_no;
END
$$;
COMMENT ON FUNCTION payidem.set_merchant_notify_url(text, text) IS
	'Where a merchant''s notifications that belong to no order go (payout.succeeded, payout.failed); NULL for none.';

------------------------------------------------------------------------------
-- Reads: balance(), the views, verify()
------------------------------------------------------------------------------

-- Pending (earned, not yet settled: amounts less fees, refunds less their
-- fee shares; may be negative), available and in payout, per merchant and
-- currency.  NULL merchant: all.  As the owner: the view merchant_balances
-- calls it with its reader's privileges (grant_auditor grants EXECUTE on it),
-- and what it reads needs more than an auditor's SELECTs.
CREATE FUNCTION payidem._balances(p_merchant_no text)
RETURNS TABLE (merchant_no text, currency text, pending numeric, available bigint, in_payout bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT coalesce(b.merchant_no, u.merchant_no), coalesce(b.currency::text, u.currency),
		   coalesce(u.pending, 0), coalesce(b.available, 0), coalesce(b.in_payout, 0)
	  FROM (SELECT x.merchant_no, x.currency, x.available, x.in_payout FROM payidem.merchant_balance x
			 WHERE p_merchant_no IS NULL OR x.merchant_no = p_merchant_no) b
	  FULL JOIN (SELECT i.merchant_no, i.currency,
						sum(CASE WHEN i.item_type = 'payment' THEN i.amount - i.fee ELSE i.fee - i.amount END) AS pending
				   FROM payidem._unsettled_items(p_merchant_no, NULL) i
				  GROUP BY i.merchant_no, i.currency) u
		ON u.merchant_no = b.merchant_no AND u.currency = b.currency::text
	 ORDER BY 1, 2;
END;
COMMENT ON FUNCTION payidem._balances(text) IS
	'Internal: pending, available and in-payout balances of a merchant (or all) per currency.';

-- The caller's view, decided as for the read API (_check_reader): a role
-- that reads a merchant's rows (map_merchant_role) sees its own merchants
-- only (another is PI009, as if it did not exist), and one that may also
-- execute the rest of the API is refused (42501); the application
-- (grant_app) and auditors see every merchant.  caller is
-- the role current at the call of balance() (src/read_api.c, which runs
-- this as the owner: no one else may execute it).
CREATE FUNCTION payidem._balance(p_merchant_no text, p_currency text, caller regrole)
RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._require('merchant_no', p_merchant_no);
	PERFORM payidem._check_currency(p_currency);
	-- (scoped: a role mapped to merchants, the read API's rule; an auditor
	-- sees every balance)
	PERFORM payidem._check_readable_merchant(p_merchant_no, caller, payidem._check_reader(caller, false));
	RETURN QUERY
	SELECT coalesce(max(b.pending), 0), coalesce(max(b.available), 0)::bigint, coalesce(max(b.in_payout), 0)::bigint
	  FROM payidem._balances(p_merchant_no) b WHERE b.currency = p_currency;
END
$$;
COMMENT ON FUNCTION payidem._balance(text, text, regrole) IS
	'Internal to balance(): the balances of a merchant the caller may see (PI009 otherwise).';

-- (C, as get_order(): to know who calls while the caller needs EXECUTE on
-- this function alone; src/read_api.c)
CREATE FUNCTION payidem.balance(merchant_no text, currency text DEFAULT 'CNY')
RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
AS 'MODULE_PATHNAME', 'payidem_balance'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.balance(text, text) IS
	'A merchant''s balances in a currency: pending (earned, not yet settled, net of fees; may be negative), available (settled, may be paid out) and in_payout (requested, not yet confirmed). A role mapped to merchants (map_merchant_role) sees only its own: another is PI009.';

CREATE VIEW payidem.merchant_balances AS
	SELECT b.merchant_no, b.currency, b.pending, b.available, b.in_payout
	  FROM payidem._balances(NULL) b;
COMMENT ON VIEW payidem.merchant_balances IS
	'Every merchant''s pending, available and in-payout balance per currency.';

CREATE VIEW payidem.settlement_summary AS
	SELECT si.settle_day, si.merchant_no, si.currency::text AS currency, count(*) AS items,
		   coalesce(sum(si.amount) FILTER (WHERE si.item_type = 'payment'), 0)::numeric AS gross,
		   coalesce(sum(si.amount) FILTER (WHERE si.item_type = 'refund'), 0)::numeric AS refunds,
		   (coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS fees,
		   (coalesce(sum(si.amount - si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.amount - si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS net
	  FROM payidem.settlement_item si
	 GROUP BY si.settle_day, si.merchant_no, si.currency;
COMMENT ON VIEW payidem.settlement_summary IS
	'What was settled per settlement day (each item''s bill day plus its merchant''s cycle), merchant and currency: items, gross (payments), refunds, fees (less the refunds'' shares), net = gross - refunds - fees.';

CREATE VIEW payidem.platform_margin AS
	SELECT si.bill_day, si.channel_no, si.currency::text AS currency,
		   (coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS fee_revenue,
		   (coalesce(sum(si.cost) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.cost) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS channel_cost,
		   (coalesce(sum(si.fee - si.cost) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee - si.cost) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS margin
	  FROM payidem.settlement_item si
	 GROUP BY si.bill_day, si.channel_no, si.currency;
COMMENT ON VIEW payidem.platform_margin IS
	'What the platform earned on settled items per bill day, channel and currency: fee revenue less channel cost, net of the refunds'' shares.';

-- verify(): the invariants of DESIGN sections 5 and 11, re-derived from the
-- tables, one row per violation; none when the books are right.  Read-only
-- (it runs on a standby), for every writer's rows, including what
-- session_replication_role = replica let past the triggers.
CREATE FUNCTION payidem.verify()
RETURNS TABLE (invariant text, subject text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	-- every journal balances, per currency
	SELECT 'journal_balances', e.journal_no,
		   format('entries in %s sum to %s', e.currency, sum(e.amount))
	  FROM payidem.ledger_entry e
	 GROUP BY e.journal_no, e.currency
	HAVING sum(e.amount) <> 0
	UNION ALL
	-- each balance equals its entries
	SELECT 'balance_equals_entries', coalesce(b.merchant_no, e.merchant_no) || ' ' || coalesce(b.currency::text, e.currency::text),
		   format('available %s, in_payout %s; the journal says %s and %s',
				  coalesce(b.available, 0), coalesce(b.in_payout, 0), coalesce(e.available, 0), coalesce(e.in_payout, 0))
	  FROM payidem.merchant_balance b
	  FULL JOIN (SELECT x.merchant_no, x.currency,
						-sum(x.amount) FILTER (WHERE x.account = 'merchant_available') AS available,
						-sum(x.amount) FILTER (WHERE x.account = 'merchant_payout') AS in_payout
				   FROM payidem.ledger_entry x
				  WHERE x.account IN ('merchant_available', 'merchant_payout')
				  GROUP BY x.merchant_no, x.currency) e
		ON e.merchant_no = b.merchant_no AND e.currency = b.currency
	 WHERE coalesce(b.available, 0) <> coalesce(e.available, 0)
		OR coalesce(b.in_payout, 0) <> coalesce(e.in_payout, 0)
	UNION ALL
	-- each settled payment is a paid payment, settled with the amounts of its row
	SELECT 'settled_as_recorded', si.item_no,
		   format('settled %s (fee %s, cost %s) for merchant %s; the payment is %s (fee %s, cost %s) of merchant %s, %s',
				  si.amount, si.fee, si.cost, si.merchant_no, p.amount, p.fee_amount, p.cost_amount,
				  p.merchant_no, coalesce(p.status, 'missing'))
	  FROM payidem.settlement_item si
	  LEFT JOIN payidem.payment p ON p.payment_no = si.item_no
	 WHERE si.item_type = 'payment'
	   AND (p.payment_no IS NULL OR p.status <> ALL (payidem._paid_payment_statuses())
			OR p.amount <> si.amount OR p.fee_amount IS DISTINCT FROM si.fee
			OR p.cost_amount IS DISTINCT FROM si.cost OR p.merchant_no <> si.merchant_no)
	UNION ALL
	-- each settled refund is a succeeded refund, with its amount; its shares
	-- are within its payment's fee and cost
	SELECT 'settled_as_recorded', si.item_no,
		   format('settled %s (fee share %s, cost share %s); the refund is %s, %s',
				  si.amount, si.fee, si.cost, r.amount, coalesce(r.status, 'missing'))
	  FROM payidem.settlement_item si
	  LEFT JOIN payidem.refund r ON r.refund_no = si.item_no
	 WHERE si.item_type = 'refund'
	   AND (r.refund_no IS NULL OR r.status <> 'succeeded' OR r.amount <> si.amount
			OR r.payment_no <> si.payment_no)
	UNION ALL
	-- a payment's refunds return at most its fee and cost, exactly them once
	-- it is fully refunded and every refund is settled
	SELECT 'refund_shares_add_up', p.payment_no,
		   format('refunds settled %s of %s refunded return fee %s of %s and cost %s of %s',
				  s.refunded, p.amount, s.fee, p.fee_amount, s.cost, p.cost_amount)
	  FROM (SELECT si.payment_no, sum(si.amount) AS refunded, sum(si.fee) AS fee, sum(si.cost) AS cost
			  FROM payidem.settlement_item si WHERE si.item_type = 'refund'
			 GROUP BY si.payment_no) s
	  JOIN payidem.payment p ON p.payment_no = s.payment_no
	 WHERE s.fee > p.fee_amount OR s.cost > p.cost_amount OR s.refunded > p.amount
		OR (s.refunded = p.amount AND (s.fee <> p.fee_amount OR s.cost <> p.cost_amount))
	UNION ALL
	-- a settled item's journal says what the item says
	SELECT 'item_journal', si.item_no,
		   format('its journal moves the merchant by %s; the item says %s', coalesce(j.merchant, 0),
				  CASE WHEN si.item_type = 'payment' THEN si.amount - si.fee ELSE si.fee - si.amount END)
	  FROM payidem.settlement_item si
	  LEFT JOIN (SELECT x.journal_no, -sum(x.amount) AS merchant FROM payidem.ledger_entry x
				  WHERE x.account = 'merchant_available' GROUP BY x.journal_no) j ON j.journal_no = si.item_no
	 WHERE coalesce(j.merchant, 0) <> CASE WHEN si.item_type = 'payment' THEN si.amount - si.fee ELSE si.fee - si.amount END
	UNION ALL
	-- no payout took more than was available: what the merchant had when the
	-- payout was taken (recorded under the balance's lock)
	SELECT 'payout_within_available', p.payout_no,
		   format('%s %s paid out of %s available', p.amount, p.currency, coalesce(p.available_before::text, 'unrecorded'))
	  FROM payidem.payout p
	 WHERE p.available_before IS NULL OR p.amount > p.available_before
	UNION ALL
	-- every succeeded payment of a bill day settle() no longer reads is
	-- settled or held (else no run would find it: a DBA puts it in
	-- settlement_hold)
	SELECT 'settled_or_held', p.payment_no,
		   format('paid at %s, before the day settle() reads from (%s), neither settled nor held',
				  p.paid_at, st.scan_from)
	  FROM payidem.settle_state st
	  JOIN payidem.payment p
		ON p.paid_at < payidem._scan_start()
	   AND (st.settle_from IS NULL OR p.paid_at >= pg_catalog.timezone(payidem._bill_timezone(), st.settle_from::timestamp))
	 WHERE p.status = ANY (payidem._paid_payment_statuses())
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = p.payment_no)
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_hold h WHERE h.payment_no = p.payment_no)
	   AND NOT EXISTS (SELECT 1 FROM payidem.anomaly a
						WHERE a.payment_no = p.payment_no AND a.handle_status = 'open')
	UNION ALL
	SELECT 'settled_or_held', r.refund_no,
		   format('refunded at %s, before the day settle() reads from (%s), not settled', r.refunded_at, st.scan_from)
	  FROM payidem.settle_state st
	  JOIN payidem.refund r
		ON r.refunded_at < payidem._scan_start()
	   AND (st.settle_from IS NULL OR r.refunded_at >= pg_catalog.timezone(payidem._bill_timezone(), st.settle_from::timestamp))
	 WHERE r.status = 'succeeded'
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = r.refund_no)
	UNION ALL
	-- a payout's journals agree with its status
	SELECT 'payout_journals', p.payout_no,
		   format('status %s; journals: request %s, succeeded %s, failed %s', p.status,
				  coalesce(j.request, 0), coalesce(j.succeeded, 0), coalesce(j.failed, 0))
	  FROM payidem.payout p
	  LEFT JOIN (SELECT x.source_no,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no AND x.account = 'merchant_payout') AS request,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no || '/succeeded' AND x.account = 'merchant_payout') AS succeeded,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no || '/failed' AND x.account = 'merchant_payout') AS failed
				   FROM payidem.ledger_entry x WHERE x.source_no ~ '^PT' GROUP BY x.source_no) j
		ON j.source_no = p.payout_no
	 WHERE coalesce(j.request, 0) <> -p.amount
		OR coalesce(j.succeeded, 0) <> CASE WHEN p.status = 'succeeded' THEN p.amount ELSE 0 END
		OR coalesce(j.failed, 0) <> CASE WHEN p.status = 'failed' THEN p.amount ELSE 0 END
	UNION ALL
	-- DESIGN section 5: a paid order names one paying payment of its own
	SELECT 'paid_order_has_payment', o.order_no,
		   format('order %s, paid_at %s, paid_payment_no %s; that payment: %s', o.status,
				  coalesce(o.paid_at::text, 'NULL'), coalesce(o.paid_payment_no, 'NULL'),
				  coalesce(p.status || ' of order ' || p.order_no, 'missing'))
	  FROM payidem."order" o
	  LEFT JOIN payidem.payment p ON p.payment_no = o.paid_payment_no
	 WHERE o.status IN ('paid', 'partially_refunded', 'refunded')
	   AND (o.paid_at IS NULL OR p.payment_no IS NULL OR p.order_no <> o.order_no
			OR p.status <> ALL (payidem._paid_payment_statuses()))
	UNION ALL
	-- a paid payment has its transaction id, paid_at and fees
	SELECT 'paid_payment_complete', p.payment_no,
		   format('%s without %s', p.status,
				  concat_ws(', ', CASE WHEN p.transaction_id IS NULL THEN 'transaction_id' END,
							CASE WHEN p.paid_at IS NULL THEN 'paid_at' END,
							CASE WHEN p.fee_amount IS NULL THEN 'fee_amount' END,
							CASE WHEN p.cost_amount IS NULL THEN 'cost_amount' END))
	  FROM payidem.payment p
	 WHERE p.status = ANY (payidem._paid_payment_statuses())
	   AND (p.transaction_id IS NULL OR p.paid_at IS NULL OR p.fee_amount IS NULL OR p.cost_amount IS NULL)
	UNION ALL
	-- refunded amounts add up: a payment's is the sum of its succeeded
	-- refunds, its status agrees, and the order it paid mirrors it
	SELECT 'refunds_add_up', p.payment_no,
		   format('refunded_amount %s of %s, status %s; its succeeded refunds sum to %s; its order says %s',
				  p.refunded_amount, p.amount, p.status, coalesce(r.total, 0),
				  coalesce(o.refunded_amount::text, '-'))
	  FROM payidem.payment p
	  LEFT JOIN (SELECT x.payment_no, sum(x.amount) AS total FROM payidem.refund x
				  WHERE x.status = 'succeeded' GROUP BY x.payment_no) r ON r.payment_no = p.payment_no
	  LEFT JOIN payidem."order" o ON o.paid_payment_no = p.payment_no
	 WHERE p.refunded_amount <> coalesce(r.total, 0)
		OR (p.status = ANY (payidem._paid_payment_statuses())
			AND (p.status = 'partially_refunded') <> (p.refunded_amount > 0 AND p.refunded_amount < p.amount))
		OR (p.status = ANY (payidem._paid_payment_statuses())
			AND (p.status = 'refunded') <> (p.refunded_amount = p.amount))
		OR (o.order_no IS NOT NULL AND o.refunded_amount <> p.refunded_amount)
	UNION ALL
	-- pending and succeeded refunds never exceed the payment
	SELECT 'refunds_within_payment', p.payment_no,
		   format('refunds pending and succeeded %s of %s', r.total, p.amount)
	  FROM payidem.payment p
	  JOIN (SELECT x.payment_no, sum(x.amount) AS total FROM payidem.refund x
			 WHERE x.status IN ('pending', 'succeeded') GROUP BY x.payment_no) r ON r.payment_no = p.payment_no
	 WHERE r.total > p.amount;
END;
COMMENT ON FUNCTION payidem.verify() IS
	'Re-derive the books'' invariants (journals balance, balances equal their entries, items settled as recorded and at most once, refund shares, payouts within the available balance, payout journals, paid orders and payments complete, refunded amounts add up): one row per violation, none when the books are right. Read-only; runs on a standby.';

------------------------------------------------------------------------------
-- The triggers of the settlement tables
------------------------------------------------------------------------------

-- The journal's rules at commit (src/journal.c): what each statement adds to
-- ledger_entry and changes in merchant_balance is summed; a transaction whose
-- journals do not balance, or whose balances moved otherwise than their
-- entries, is refused at commit (PI002).
CREATE FUNCTION payidem._journal_capture()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_journal_capture'
LANGUAGE C;
COMMENT ON FUNCTION payidem._journal_capture() IS
	'Trigger journal_check on payidem.ledger_entry: the statement''s entries, for the check at commit that every journal balances and every balance moves with its entries.';
CREATE FUNCTION payidem._balance_capture()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_balance_capture'
LANGUAGE C;
COMMENT ON FUNCTION payidem._balance_capture() IS
	'Triggers balance_check_* on payidem.merchant_balance: the statement''s changes, for the check at commit that they equal the journal entries written with them.';
CREATE TRIGGER journal_check
	AFTER INSERT ON payidem.ledger_entry
	REFERENCING NEW TABLE AS new_entries
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._journal_capture();
CREATE TRIGGER balance_check_insert
	AFTER INSERT ON payidem.merchant_balance
	REFERENCING NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._balance_capture();
CREATE TRIGGER balance_check_update
	AFTER UPDATE ON payidem.merchant_balance
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._balance_capture();

-- The journal is append-only, for every role, also under
-- session_replication_role = replica (ENABLE ALWAYS), as status_log.
CREATE FUNCTION payidem._ledger_append_only()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_log_append_only'
LANGUAGE C;
COMMENT ON FUNCTION payidem._ledger_append_only() IS
	'Trigger on payidem.ledger_entry: refuses UPDATE, DELETE and TRUNCATE for every role.';
CREATE TRIGGER ledger_append_only
	BEFORE UPDATE OR DELETE OR TRUNCATE ON payidem.ledger_entry
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._ledger_append_only();
ALTER TABLE payidem.ledger_entry ENABLE ALWAYS TRIGGER ledger_append_only;

-- Payouts are guarded by the whitelist (entity payout) and logged in
-- status_log; their end is notified (src/notify.c).
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.payout
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('payout', 'payout_no');
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem.payout
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();

-- Money records are kept: no DELETE or TRUNCATE of payouts, adjustments,
-- balances or settled items, for any role.
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.payout
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.payout
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.adjustment
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.adjustment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.merchant_balance
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.merchant_balance
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.settlement_item
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.settlement_item
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();

-- A payment an anomaly or a difference named, once that is resolved, is held
-- for settlement: settle() found it through the open anomaly (or difference)
-- while it was open, and after a late success that is the only way it would
-- be found (docs/settlement.md, section 4).  For every writer of the two
-- tables (resolve_anomaly(), resolve_diff(), reconcile(), a DBA).
CREATE FUNCTION payidem._hold_resolved()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM payidem.payment p
				WHERE p.payment_no = NEW.payment_no AND p.status = ANY (payidem._paid_payment_statuses()))
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = NEW.payment_no) THEN
		INSERT INTO payidem.settlement_hold (payment_no) VALUES (NEW.payment_no) ON CONFLICT DO NOTHING;
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION payidem._hold_resolved() IS
	'Trigger settlement_hold_on_resolve on payidem.anomaly and payidem.reconciliation: the paid, unsettled payment a resolved anomaly or difference names is held for settle().';
CREATE TRIGGER settlement_hold_on_resolve
	AFTER UPDATE OF handle_status ON payidem.anomaly
	FOR EACH ROW
	WHEN (OLD.handle_status = 'open' AND NEW.handle_status <> 'open' AND NEW.payment_no IS NOT NULL)
	EXECUTE FUNCTION payidem._hold_resolved();
CREATE TRIGGER settlement_hold_on_resolve
	AFTER UPDATE OF handle_status ON payidem.reconciliation
	FOR EACH ROW
	WHEN (OLD.handle_status = 'open' AND NEW.handle_status <> 'open' AND NEW.payment_no IS NOT NULL)
	EXECUTE FUNCTION payidem._hold_resolved();

REVOKE ALL ON FUNCTION payidem._is_business_day(date),
	payidem._settle_day(date, text),
	payidem._scan_start(),
	payidem._bill_day(timestamptz, text),
	payidem._unsettled_items(text, date),
	payidem.settle(date),
	payidem._settle_if_due(),
	payidem._check_currency(text),
	payidem._merchant_status(text),
	payidem._post(text, text, text, text, bigint, bigint, text),
	payidem.request_payout(text, bigint, text, text),
	payidem.apply_payout_result(text, text, text),
	payidem.adjust_balance(text, bigint, text, text, text),
	payidem.set_merchant_notify_url(text, text),
	payidem._balances(text),
	payidem._balance(text, text, regrole),
	payidem.balance(text, text),
	payidem.verify(),
	payidem._journal_capture(),
	payidem._balance_capture(),
	payidem._ledger_append_only(),
	payidem._hold_resolved()
	FROM PUBLIC;

-- nothing for PUBLIC, as the install's privileges part makes it
REVOKE ALL ON TABLE payidem.business_day, payidem.ledger_entry, payidem.merchant_balance,
	payidem.settlement_item, payidem.settlement_hold, payidem.settle_state, payidem.payout,
	payidem.adjustment, payidem.merchant_balances, payidem.settlement_summary, payidem.platform_margin
	FROM PUBLIC;
REVOKE ALL ON SEQUENCE payidem.ledger_entry_entry_id_seq FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('payidem.business_day', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.ledger_entry', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.ledger_entry_entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_balance', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settlement_item', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settlement_hold', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settle_state', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.payout', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.adjustment', '');

-- Roles made before the update: the update grants them nothing (a GRANT
-- made by an extension's script is recorded as the extension's own, which
-- pg_dump leaves out, so a restore would lose it).  Run grant_app() and
-- grant_auditor() again for them after the update (CHANGELOG, README): they
-- add the payout functions and balance(), the books and verify().

------------------------------------------------------------------------------
-- 1.1: what an application needs (DESIGN section 7): results that name their
-- anomaly, get_order()'s anomalies, list_orders(), the work queues and
-- health().
------------------------------------------------------------------------------

-- apply_payment_result()'s SQL half answers the anomaly too: a new result
-- type, so it is made again (it is granted to no one)
DROP FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb);
-- Its result is the outcome and, for an anomaly or a refusal, the anomaly
-- that records it (apply_payment_result_ex() returns both).
CREATE FUNCTION payidem._apply_payment_result(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb,
	OUT outcome text, OUT anomaly_id bigint)
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
	v_anomaly bigint;
	v_snapshot_kept constant boolean := current_setting('transaction_isolation') <> 'read committed';
	v_stale boolean;
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
			outcome := 'duplicate';
			RETURN;
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
			INSERT INTO payidem.anomaly AS a (kind, amount, detail)
			VALUES (d.anomaly_kind, v_amount,
					jsonb_build_object('reported_payment_no', v_payment_no, 'transaction_id', v_txn,
									   'reported_amount', v_amount, 'source', v_source,
									   'paid_at', coalesce(v_reported_at, now()),
									   'action', 'ask the channel which payment this is; refund it at the channel if none of ours was made for it',
									   'raw', payidem._flow_raw(raw)))
			ON CONFLICT ((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
				WHERE kind = 'unknown_transaction' DO NOTHING
			RETURNING a.anomaly_id INTO v_anomaly;
			IF v_anomaly IS NULL THEN
				-- recorded before (the index's row, committed: the insert waited for it)
				SELECT a.anomaly_id INTO v_anomaly FROM payidem.anomaly a
				 WHERE a.kind = 'unknown_transaction' AND a.detail ->> 'reported_payment_no' = v_payment_no
				   AND a.detail ->> 'transaction_id' = v_txn;
			END IF;
			outcome := 'rejected';
			anomaly_id := v_anomaly;
			RETURN;
		END IF;
		PERFORM payidem._raise_not_found('payment', v_payment_no, 'payidem.payment', 'payment_no');
	END IF;
	-- The lock order of every flow function (docs/payment-flow.md): the
	-- order, then its payment.  Only a success changes the order; a failure
	-- or close report locks the payment alone.  FOR NO KEY UPDATE, as an
	-- UPDATE that keeps the key locks: the KEY SHARE locks that inserts of
	-- payments, refunds and anomalies take on their order and payment
	-- through the foreign keys do not wait for it (a FOR UPDATE lock would
	-- make refund(), which holds the payment, wait for the order).
	--
	-- Outside READ COMMITTED the snapshot is the transaction's: a delivery
	-- that waited for one of these locks cannot see what the one it waited
	-- for recorded without changing the row (a refusal's anomaly), and would
	-- decide on stale facts.  So it does not wait blind: a lock another
	-- transaction holds is waited for, then the call fails with 40001 (as
	-- the transaction id's lock below), and a retry decides afresh.
	v_stale := false;
	IF v_status = 'succeeded' THEN
		IF v_snapshot_kept THEN
			PERFORM FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE SKIP LOCKED;
			v_stale := NOT FOUND;
		END IF;
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
	IF v_snapshot_kept AND NOT v_stale THEN
		PERFORM FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE SKIP LOCKED;
		v_stale := NOT FOUND;
	END IF;
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	IF v_stale THEN
		PERFORM payidem._raise('40001', format('payment %s is being applied by another delivery at the same time', p.payment_no),
			format('This transaction (%s) waited for another delivery''s lock on payment %s; its snapshot cannot see that delivery''s outcome.',
				   current_setting('transaction_isolation'), p.payment_no),
			'Retry the transaction, or apply results in READ COMMITTED.');
	END IF;
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
			IF v_snapshot_kept THEN
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
		outcome := 'duplicate';		-- applied meanwhile, by the delivery we waited for
		RETURN;
	ELSIF d.verdict = 'rejected' THEN
		-- A refusal changes nothing but one anomaly row, and a repeat of the
		-- same refusal adds none (it is answered with the open one).
		IF d.anomaly_kind IS NOT NULL THEN
			SELECT a.anomaly_id INTO v_anomaly FROM payidem.anomaly a
			 WHERE a.payment_no = p.payment_no AND a.kind = d.anomaly_kind AND a.handle_status = 'open'
			   AND a.detail @> jsonb_build_object('reported_status', v_status,
												  'reported_amount', v_amount,
												  'transaction_id', v_txn)
			 ORDER BY a.anomaly_id LIMIT 1;
		END IF;
		IF d.anomaly_kind IS NOT NULL AND v_anomaly IS NULL THEN
			INSERT INTO payidem.anomaly AS a (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN d.anomaly_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)))
			RETURNING a.anomaly_id INTO v_anomaly;
		END IF;
		outcome := 'rejected';
		anomaly_id := v_anomaly;
		RETURN;
	ELSIF d.verdict NOT IN ('applied', 'anomaly') THEN
		RAISE EXCEPTION 'payidem: unexpected verdict % on payment %', d.verdict, p.payment_no;
	ELSIF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		outcome := 'applied';
		RETURN;
	END IF;

	-- The success recorded, and the order paid if it is pending (applied),
	-- else an anomaly asks for the money's refund.  The status and the fields
	-- in one update of the row we hold locked (then the order's): the
	-- status_guard trigger checks each change against the whitelist and logs
	-- it, exactly as for transit_payment(); one new row version each.  A
	-- direct update (src/payment_result.c) unless the table has statement triggers,
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
		INSERT INTO payidem.anomaly AS a (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)))
		RETURNING a.anomaly_id INTO anomaly_id;
	END IF;
	outcome := d.verdict;
END
$$;
COMMENT ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Internal to apply_payment_result() and apply_payment_result_ex(): the whole contract in PL/pgSQL, for every call they do not decide themselves; the outcome and the anomaly that records an anomaly or a refusal.';

-- The same call, answering also which anomaly records an anomaly or a
-- refusal (for resolve_anomaly(); NULL for the other outcomes and for a
-- refusal that records none).  The same C function decides both.
CREATE FUNCTION payidem.apply_payment_result_ex(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL,
	OUT outcome text, OUT anomaly_id bigint)
AS 'MODULE_PATHNAME', 'payidem_apply_payment_result_ex'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION payidem.apply_payment_result_ex(text, text, text, text, bigint, timestamptz, jsonb) IS
	'apply_payment_result() with the anomaly it names: outcome (applied, duplicate, anomaly, rejected) and, for anomaly and rejected, anomaly_id, the anomaly that records it (the one resolve_anomaly() takes; a repeat of a refusal names the open one). Same arguments, errors and effects.';

-- Since 1.1.  A page of a list (list_orders(), list_anomalies(),
-- list_differences()): 1 to 1000 rows.
CREATE FUNCTION payidem._check_page_size(max_rows integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000 THEN
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; a page has 1 to 1000 rows.', coalesce(max_rows::text, 'NULL')),
			'Pass how many rows one page shows, e.g. 100, and page on with the last row''s key.');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_page_size(integer) IS
	'Internal to the lists of the read API: max_rows from 1 to 1000 (22023).';

-- Since 1.1.  A value that must be one of a known few (a status to list by):
-- 22023 naming them.
CREATE FUNCTION payidem._check_one_of(what text, value text, known text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL OR NOT value = ANY (known) THEN
		PERFORM payidem._raise_invalid('invalid ' || what,
			format('The value was %s; it is one of %s.', coalesce(quote_literal(left(value, 64)), 'NULL'),
				   array_to_string(known, ', ')),
			'Pass NULL for all of them.');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_one_of(text, text, text[]) IS
	'Internal: value must be one of known (22023 naming them).';

-- order_merchant_key: the target of payment's and refund's foreign keys
-- (order_no, merchant_no), with merchant_no first (since 1.1) so that it also
-- serves list_orders(): a merchant's orders by number, newest first (an order
-- number grows with the order's issue, on one database), with no index of its
-- own to write.
-- (made again with its columns the other way round: the two foreign keys
-- that name it are dropped and made again, which checks them)
ALTER TABLE payidem.payment DROP CONSTRAINT payment_order_fkey;
ALTER TABLE payidem.refund DROP CONSTRAINT refund_order_fkey;
ALTER TABLE payidem."order" DROP CONSTRAINT order_merchant_key;
ALTER TABLE payidem."order" ADD CONSTRAINT order_merchant_key UNIQUE (merchant_no, order_no);
ALTER TABLE payidem.payment ADD CONSTRAINT payment_order_fkey FOREIGN KEY (order_no, merchant_no)
	REFERENCES payidem."order" (order_no, merchant_no);
ALTER TABLE payidem.refund ADD CONSTRAINT refund_order_fkey FOREIGN KEY (order_no, merchant_no)
	REFERENCES payidem."order" (order_no, merchant_no);

-- An order's own fields as the read API shows them: the top of get_order()
-- and each row of list_orders().  Every name schema-qualified and no SET
-- clause, so that a query calling it can inline it.  (A string body: a
-- parsed one would tie the tables' row types to these functions and refuse
-- an ALTER TABLE of them that rewrites the table.)
CREATE FUNCTION payidem._order_fields(o payidem."order")
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'order_no', o.order_no, 'merchant_no', o.merchant_no, 'out_trade_no', o.out_trade_no,
	'subject', o.subject, 'body', o.body, 'amount', o.amount, 'currency', o.currency,
	'status', o.status, 'refunded_amount', o.refunded_amount, 'paid_payment_no', o.paid_payment_no,
	'paid_at', payidem._utc(o.paid_at), 'expire_at', payidem._utc(o.expire_at),
	'closed_at', payidem._utc(o.closed_at), 'created_at', payidem._utc(o.created_at),
	'updated_at', payidem._utc(o.updated_at), 'notify_url', o.notify_url, 'return_url', o.return_url)
$$;
COMMENT ON FUNCTION payidem._order_fields(payidem."order") IS
	'Internal to the read API: an order''s own fields as JSON (times in UTC ISO 8601).';

-- An anomaly and a reconciliation difference as the read API shows them
-- (get_order(), list_anomalies(), list_differences()).
CREATE FUNCTION payidem._anomaly_fields(a payidem.anomaly)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'anomaly_id', a.anomaly_id, 'kind', a.kind, 'order_no', a.order_no, 'payment_no', a.payment_no,
	'channel_no', a.channel_no, 'amount', a.amount, 'action', a.detail OPERATOR(pg_catalog.->>) 'action',
	'detail', a.detail, 'handle_status', a.handle_status, 'handled_by', a.handled_by,
	'handled_at', payidem._utc(a.handled_at), 'note', a.note, 'created_at', payidem._utc(a.created_at))
$$;
COMMENT ON FUNCTION payidem._anomaly_fields(payidem.anomaly) IS
	'Internal to the read API: an anomaly as JSON (times in UTC ISO 8601).';
CREATE FUNCTION payidem._difference_fields(r payidem.reconciliation)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'recon_id', r.recon_id, 'recon_batch_no', r.recon_batch_no, 'channel_no', r.channel_no,
	'bill_date', r.bill_date, 'diff_type', r.diff_type, 'transaction_id', r.transaction_id,
	'payment_no', r.payment_no, 'platform_amount', r.platform_amount, 'channel_amount', r.channel_amount,
	'platform_status', r.platform_status, 'channel_status', r.channel_status,
	'platform_fee', r.platform_fee, 'channel_fee', r.channel_fee, 'handle_status', r.handle_status,
	'handled_by', r.handled_by, 'handled_at', payidem._utc(r.handled_at), 'note', r.note,
	'created_at', payidem._utc(r.created_at))
$$;
COMMENT ON FUNCTION payidem._difference_fields(payidem.reconciliation) IS
	'Internal to the read API: a reconciliation difference as JSON (times in UTC ISO 8601).';

-- PL/pgSQL, not SQL: its one expression is planned once per session (an SQL
-- function with a SET clause is parsed and planned again at every call)
CREATE OR REPLACE FUNCTION payidem._order_json(o payidem."order")
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
RETURN payidem._order_fields(o) || jsonb_build_object(
	'payments', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'payment_no', p.payment_no, 'channel_no', p.channel_no, 'amount', p.amount,
					'status', p.status, 'transaction_id', p.transaction_id, 'fee_amount', p.fee_amount,
					'cost_amount', p.cost_amount, 'refunded_amount', p.refunded_amount,
					'paid_at', payidem._utc(p.paid_at), 'closed_at', payidem._utc(p.closed_at),
					'created_at', payidem._utc(p.created_at)) ORDER BY p.created_at, p.payment_no)
		  FROM payidem.payment p WHERE p.order_no = o.order_no), '[]'),
	'refunds', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'refund_no', r.refund_no, 'payment_no', r.payment_no, 'out_refund_no', r.out_refund_no,
					'amount', r.amount, 'status', r.status, 'channel_refund_id', r.channel_refund_id,
					'reason', r.reason, 'refunded_at', payidem._utc(r.refunded_at),
					'created_at', payidem._utc(r.created_at)) ORDER BY r.created_at, r.refund_no)
		  FROM payidem.refund r WHERE r.order_no = o.order_no), '[]'),
	'anomalies', coalesce((
		SELECT jsonb_agg(payidem._anomaly_fields(a) ORDER BY a.created_at, a.anomaly_id)
		  FROM payidem.anomaly a WHERE a.order_no = o.order_no), '[]'));
END
$$;
COMMENT ON FUNCTION payidem._order_json(payidem."order") IS
	'Internal to get_order() and find_order(): the order, its attempts, its refunds and its anomalies as one JSON object (times in UTC ISO 8601).';

-- Who reads what (get_order(), find_order(), list_orders(), list_anomalies(),
-- list_differences()).  src/read_api.c says whether row-level security
-- scopes the caller (scoped: it applies to the caller, which may read the
-- tables); a caller that reads a merchant's rows (mapped itself or as a
-- member of a mapped role) is scoped too, whatever its SELECTs (a REVOKE
-- never widens what it reads).  A scoped caller that may also execute the
-- rest of the API (a combination grant_app() and map_merchant_role() refuse,
-- made by a later GRANT of membership or before 1.1) is refused (42501), as
-- the rest would act for every merchant for it; any other scoped caller
-- reads what its row-level security shows it (the policies' rule,
-- _row_visible): an auditor everything, a reporting role its merchants', a
-- role unmapped nothing.  A caller not scoped (the tables' owner, a
-- superuser, an application role: functions only) reads every merchant's.
-- Returns whether the caller is scoped.
CREATE FUNCTION payidem._check_reader(caller regrole, scoped boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	a record;
	v_scoped boolean := scoped;
BEGIN
	IF NOT v_scoped THEN
		-- the caller and the roles it is a member of, up the memberships (by
		-- index: the few roles above the caller, not every mapping; a member
		-- that does not inherit counts too, which only scopes more)
		v_scoped := EXISTS (
				WITH RECURSIVE up(r) AS (
					SELECT caller::oid
					UNION
					SELECT am.roleid FROM pg_auth_members am JOIN up ON am.member = up.r)
				SELECT 1 FROM up, LATERAL (SELECT 1 FROM payidem.merchant_role m
											WHERE m.role = up.r::regrole LIMIT 1) x)
			AND NOT EXISTS (SELECT 1 FROM pg_roles u
							 WHERE u.oid = caller::oid AND (u.rolsuper OR u.rolbypassrls));
	END IF;
	IF v_scoped THEN
		SELECT * INTO a FROM payidem._app_merchant_roles(caller) LIMIT 1;
		IF FOUND THEN
			PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function, NULL);
		END IF;
	END IF;
	RETURN v_scoped;
END
$$;
COMMENT ON FUNCTION payidem._check_reader(regrole, boolean) IS
	'Internal to the read API: whether the caller''s reads are scoped to the merchants its row-level security shows it (also a mapped role without SELECTs); refuses (42501) a scoped caller that may also execute the API functions that are not scoped to a merchant.';

CREATE OR REPLACE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it; a number
		-- that is not one is 22023, checked only here: a stored order's is one)
		IF NOT FOUND OR (v_scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			PERFORM payidem._check_number('order', _read_order.order_no);
			PERFORM payidem._raise_not_found('order', _read_order.order_no, 'payidem."order"', 'order_no');
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (v_scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			PERFORM payidem._raise('PI009', format('merchant %s has no order %s',
				quote_literal(left(_read_order.merchant_no, 64)), quote_literal(left(_read_order.out_trade_no, 64))),
				'payidem."order" has no row with that merchant_no and out_trade_no.');
		END IF;
	END IF;
	RETURN payidem._order_json(o);
END
$$;
COMMENT ON FUNCTION payidem._read_order(text, text, text, regrole, boolean) IS
	'Internal to get_order() and find_order() (src/read_api.c): the order as JSON, if the caller may read it; PI009 otherwise.';

-- Since 1.1.  A merchant named to a read the caller may make: it exists and,
-- for a scoped caller, is one of those its row-level security shows it
-- (another is PI009, as if it did not exist).
CREATE FUNCTION payidem._check_readable_merchant(merchant_no text, caller regrole, scoped boolean)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM payidem.merchant m WHERE m.merchant_no = _check_readable_merchant.merchant_no)
	   OR (scoped AND NOT payidem._row_visible(merchant_no, caller)) THEN
		PERFORM payidem._raise_not_found('merchant', merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_readable_merchant(text, regrole, boolean) IS
	'Internal to the read API: PI009 for a merchant that does not exist or the caller may not read.';

-- Since 1.1.  A merchant's orders, newest first, a page at a time, by order
-- number: on one database a number grows with each order issued, the issue
-- second first (gen_order_no: never backwards, also across a clock step);
-- after is the last order_no of the page before, a position only (keyset
-- pagination: a page costs the same however deep it is, and an order created
-- meanwhile never shifts one).  order_merchant_key (merchant_no, order_no)
-- serves it.
CREATE FUNCTION payidem._list_orders(merchant_no text, after text, max_rows integer, status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._require('merchant_no', v_merchant_no);
	PERFORM payidem._check_page_size(v_max_rows);
	PERFORM payidem._check_readable_merchant(v_merchant_no, caller, v_scoped);
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('order status', v_status,
			ARRAY(SELECT s.status FROM payidem.state s WHERE s.entity = 'order' ORDER BY s.status));
	END IF;
	IF v_after IS NULL THEN
		RETURN QUERY
		SELECT payidem._order_fields(o) FROM payidem."order" o
		 WHERE o.merchant_no = v_merchant_no AND (v_status IS NULL OR o.status = v_status)
		 ORDER BY o.order_no DESC
		 LIMIT v_max_rows;
		RETURN;
	END IF;
	PERFORM payidem._check_number('order', v_after);
	RETURN QUERY
	SELECT payidem._order_fields(o) FROM payidem."order" o
	 WHERE o.merchant_no = v_merchant_no AND o.order_no < v_after
	   AND (v_status IS NULL OR o.status = v_status)
	 ORDER BY o.order_no DESC
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_orders(text, text, integer, text, regrole, boolean) IS
	'Internal to list_orders() (src/read_api.c): a page of a merchant''s orders the caller may read.';

CREATE FUNCTION payidem.list_orders(merchant_no text, after text DEFAULT NULL, max_rows integer DEFAULT 100,
	status text DEFAULT NULL)
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_orders(text, text, integer, text) IS
	'A merchant''s orders, newest first (by order number), max_rows (1 to 1000) at a time, each as get_order() shows the order itself (without attempts, refunds and anomalies); only those of status if given. The next page: after = the last order_no of this one. PI009 unknown merchant (or one the caller''s row-level security hides), 22023 bad max_rows, status or order number.';

-- Since 1.1.  The work queues a support team follows up: anomalies (money
-- that needs a person; resolve_anomaly()) and reconciliation differences
-- (resolve_diff()), oldest first by id, a page at a time: after is the last
-- id of the page before, a position only (any number; a row resolved
-- meanwhile moves no page), so that pages of several shards merge by id
-- (the router).  Open ones by default; handle_status NULL lists all.  A
-- scoped caller sees the anomalies of its merchants' orders (the rule of
-- anomaly's row-level security) and the differences of its merchants'
-- payments.
CREATE FUNCTION payidem._list_anomalies(merchant_no text, after bigint, max_rows integer, handle_status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._check_page_size(v_max_rows);
	IF v_merchant_no IS NOT NULL THEN
		PERFORM payidem._check_readable_merchant(v_merchant_no, caller, v_scoped);
	END IF;
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('handle status', v_status, ARRAY['open', 'handled', 'ignored']);
	END IF;
	RETURN QUERY
	SELECT payidem._anomaly_fields(a)
	  FROM payidem.anomaly a
	  LEFT JOIN payidem."order" o ON o.order_no = a.order_no
	 WHERE a.anomaly_id > coalesce(v_after, -1)
	   AND (v_status IS NULL OR a.handle_status = v_status)
	   AND (v_merchant_no IS NULL OR o.merchant_no = v_merchant_no)
	   AND (NOT v_scoped OR payidem._row_visible(o.merchant_no, caller))
	 ORDER BY a.anomaly_id
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_anomalies(text, bigint, integer, text, regrole, boolean) IS
	'Internal to list_anomalies() (src/read_api.c): a page of the anomalies the caller may read.';

CREATE FUNCTION payidem.list_anomalies(merchant_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_anomalies(text, bigint, integer, text) IS
	'Anomalies (money that needs a person), oldest first (by anomaly_id), max_rows (1 to 1000) at a time: open ones unless handle_status says otherwise (NULL: all), of one merchant''s orders if merchant_no is given. Each with its anomaly_id (for resolve_anomaly()), kind, amount, its detail and the action it asks for where it names one. The next page: after = the last anomaly_id of this one.';

CREATE FUNCTION payidem._list_differences(channel_no text, after bigint, max_rows integer, handle_status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_channel_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._check_page_size(v_max_rows);
	IF v_channel_no IS NOT NULL AND NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no = v_channel_no) THEN
		PERFORM payidem._raise_not_found('channel', v_channel_no, 'payidem.channel', 'channel_no');
	END IF;
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('handle status', v_status, ARRAY['open', 'handled', 'ignored', 'auto_resolved']);
	END IF;
	RETURN QUERY
	SELECT payidem._difference_fields(r)
	  FROM payidem.reconciliation r
	  LEFT JOIN payidem.payment p ON p.payment_no = r.payment_no
	 WHERE r.recon_id > coalesce(v_after, -1)
	   AND (v_status IS NULL OR r.handle_status = v_status)
	   AND (v_channel_no IS NULL OR r.channel_no = v_channel_no)
	   AND (NOT v_scoped OR payidem._row_visible(p.merchant_no, caller))
	 ORDER BY r.recon_id
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_differences(text, bigint, integer, text, regrole, boolean) IS
	'Internal to list_differences() (src/read_api.c): a page of the reconciliation differences the caller may read.';

CREATE FUNCTION payidem.list_differences(channel_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_differences(text, bigint, integer, text) IS
	'Reconciliation differences, oldest first (by recon_id), max_rows (1 to 1000) at a time: open ones unless handle_status says otherwise (NULL: all), of one channel if channel_no is given. Each with its recon_id (for resolve_diff()), type, both sides'' amounts, statuses and fees. The next page: after = the last recon_id of this one.';

-- Since 1.1.  Internal to health(): what only shared memory knows.
CREATE FUNCTION payidem._shared_state(OUT preloaded boolean, OUT housekeeping_running boolean,
	OUT housekeeping_since timestamptz, OUT housekeeping_tracked boolean, OUT housekeeping_last_run timestamptz)
AS 'MODULE_PATHNAME', 'payidem_shared_state'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._shared_state() IS
	'Internal to health(): whether the library is preloaded; whether the housekeeping launcher is alive, and since when; whether this database has counters of its own (beyond the first 63, databases share one and their last run is not known); when the last housekeeping run in this database whose steps all succeeded ended (NULL: none since the server started).';

-- Since 1.1.  One call an application's health check makes (granted by
-- grant_app()): status 'ok', or 'degraded' with the problems a person must
-- fix, each in words; and the figures behind them.  A problem is what stops
-- payidem from doing its work (not preloaded, no master key, housekeeping
-- off, not running or without a successful run in this database for three
-- intervals, writes refused by the replication setting); the queues'
-- figures are reported, not judged: their thresholds are the team's.
CREATE FUNCTION payidem.health()
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s record;
	r record;
	v_problems text[] := '{}';
	v_key_version integer;
	v_key_problem text;
	v_hk_enabled boolean := coalesce(current_setting('payidem.housekeeping', true), 'on')::boolean;
	v_hk_interval integer := extract(epoch FROM coalesce(current_setting('payidem.housekeeping_interval', true), '10')::interval);
	v_due bigint;
	v_oldest_due timestamptz;
	v_anomalies bigint;
	v_differences bigint;
BEGIN
	SELECT * INTO s FROM payidem._shared_state();
	IF NOT s.preloaded THEN
		v_problems := v_problems || 'payidem is not in shared_preload_libraries: order numbers and payment results fail (55000)'::text;
	END IF;
	BEGIN
		v_key_version := payidem.master_key_version();
	EXCEPTION WHEN object_not_in_prerequisite_state OR insufficient_privilege OR invalid_parameter_value THEN
		v_key_problem := SQLERRM;
		v_problems := v_problems || ('the master key cannot be read: ' || SQLERRM);
	END;
	IF NOT v_hk_enabled THEN
		v_problems := v_problems || 'housekeeping is off (payidem.housekeeping): expired orders are not closed, nothing is settled by itself'::text;
	ELSIF s.preloaded AND NOT s.housekeeping_running THEN
		v_problems := v_problems || 'the housekeeping launcher is not running'::text;
	ELSIF s.preloaded AND s.housekeeping_tracked
		  AND coalesce(s.housekeeping_last_run, s.housekeeping_since) < now() - make_interval(secs => 3 * v_hk_interval + 60) THEN
		-- (no run, or none whose steps all succeeded, for three intervals: no
		-- worker slot free, or a step that fails; the server log says which)
		v_problems := v_problems || CASE WHEN s.housekeeping_last_run IS NULL
			THEN format('no housekeeping run has succeeded in this database since the launcher started at %s (see the server log)',
						payidem._utc(s.housekeeping_since))
			ELSE format('the last housekeeping run that succeeded in this database ended at %s, more than 3 intervals ago (see the server log)',
						payidem._utc(s.housekeeping_last_run)) END;
	END IF;
	SELECT * INTO r FROM payidem.replication_mode();
	IF NOT r.writes_allowed THEN
		v_problems := v_problems || (CASE WHEN r.mode = 'standby' THEN 'this server is a standby: payidem''s writes go to the primary'
									 ELSE 'payidem.require_synchronous_standby is on and no synchronous standby is configured: payidem''s writes are refused (55000)' END);
	END IF;
	SELECT count(*), min(e.next_attempt_at) INTO v_due, v_oldest_due
	  FROM payidem.notify_event e WHERE e.status = 'pending' AND e.next_attempt_at <= now();
	SELECT count(*) INTO v_anomalies FROM payidem.anomaly a WHERE a.handle_status = 'open';
	SELECT count(*) INTO v_differences FROM payidem.reconciliation d WHERE d.handle_status = 'open';
	RETURN jsonb_build_object(
		'status', CASE WHEN cardinality(v_problems) = 0 THEN 'ok' ELSE 'degraded' END,
		'problems', to_jsonb(v_problems),
		'checked_at', payidem._utc(now()),
		'shard_id', current_setting('payidem.shard_id')::integer,
		'library_version', payidem.library_version(),
		'extension_version', (SELECT e.extversion FROM pg_extension e WHERE e.extname = 'payidem'),
		'preloaded', s.preloaded,
		'master_key', jsonb_build_object('readable', v_key_problem IS NULL, 'version', v_key_version),
		'housekeeping', jsonb_build_object('enabled', v_hk_enabled, 'running', s.housekeeping_running,
										   'interval_seconds', v_hk_interval,
										   'running_since', payidem._utc(s.housekeeping_since),
										   'last_run_known', s.housekeeping_tracked,
										   'last_run_at', payidem._utc(s.housekeeping_last_run)),
		'replication', jsonb_build_object('mode', r.mode, 'writes_allowed', r.writes_allowed,
										  'require_synchronous_standby', r.require_synchronous_standby),
		'notifications', jsonb_build_object('due', v_due, 'oldest_due_at', payidem._utc(v_oldest_due),
											'behind_by_seconds',
											round(extract(epoch FROM now() - v_oldest_due))::bigint),
		'open_anomalies', v_anomalies,
		'open_differences', v_differences);
END
$$;
COMMENT ON FUNCTION payidem.health()
	IS 'For an application''s health check: status ok or degraded, the problems in words (not preloaded, master key unreadable, housekeeping off or not running, writes refused by replication), the shard id, the library and extension versions, housekeeping''s last run in this database, the replication mode, the due notifications and the oldest one, the open anomalies and reconciliation differences.';

REVOKE ALL ON FUNCTION payidem.apply_payment_result_ex(text, text, text, text, bigint, timestamptz, jsonb),
	payidem._check_page_size(integer),
	payidem._check_one_of(text, text, text[]),
	payidem._order_fields(payidem."order"),
	payidem._anomaly_fields(payidem.anomaly),
	payidem._difference_fields(payidem.reconciliation),
	payidem._check_reader(regrole, boolean),
	payidem._check_readable_merchant(text, regrole, boolean),
	payidem._list_orders(text, text, integer, text, regrole, boolean),
	payidem.list_orders(text, text, integer, text),
	payidem._list_anomalies(text, bigint, integer, text, regrole, boolean),
	payidem.list_anomalies(text, bigint, integer, text),
	payidem._list_differences(text, bigint, integer, text, regrole, boolean),
	payidem.list_differences(text, bigint, integer, text),
	payidem._shared_state(),
	payidem.health()
	FROM PUBLIC;
REVOKE ALL ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) FROM PUBLIC;

------------------------------------------------------------------------------
-- 1.1: the lifecycle's cost.  notify_due() (above, with settlement's payout
-- events) is C and takes one due event at a time at the head of its index:
-- its cost no longer grows with the backlog; notify_result() is C too, and
-- the signature (_sign_notification(), above), which reads the secrets valid
-- now and their associated data in C, the one decision _secrets_valid_now()
-- and _secret_aad() now are too; the functions an SQL function with a SET
-- clause made plan again at every call no longer do (_order_json() above);
-- create_order() and begin_payment() write their
-- row directly, call a check only where it fails, and begin_payment() reads
-- merchant, channel and binding at once.
------------------------------------------------------------------------------
-- the number domains without a counted repetition (order_tables): the same
-- rule, about 15,000 instructions less for each number written; adding the
-- constraint checks the numbers already stored once (order, payment, refund)
ALTER DOMAIN payidem.order_number DROP CONSTRAINT order_number_format;
ALTER DOMAIN payidem.order_number ADD CONSTRAINT order_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PO[0-9]+$' THEN false
		ELSE ('2524' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
ALTER DOMAIN payidem.payment_number DROP CONSTRAINT payment_number_format;
ALTER DOMAIN payidem.payment_number ADD CONSTRAINT payment_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PY[0-9]+$' THEN false
		ELSE ('2534' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
ALTER DOMAIN payidem.refund_number DROP CONSTRAINT refund_number_format;
ALTER DOMAIN payidem.refund_number ADD CONSTRAINT refund_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^RF[0-9]+$' THEN false
		ELSE ('2715' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);

-- status_log keyed by log_id alone (states): a logged change writes its
-- entry at the right end of the key instead of in the middle of each
-- entity's history.  Two rows with one log_id (written by hand, or while the
-- sequence stood behind the log), which the old key let in for two entities,
-- stop the update with what to do (README, "If the update to 1.1 stops at
-- status_log"); then the sequence is put past the log where it stood behind,
-- so that a status change does not repeat a log_id, and the log's guard is
-- stated as it must stand.
DO $$
DECLARE
	detail text;
BEGIN
	ALTER TABLE payidem.status_log DROP CONSTRAINT status_log_pkey,
		ADD CONSTRAINT status_log_pkey PRIMARY KEY (log_id);
EXCEPTION WHEN unique_violation THEN
	GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
	RAISE EXCEPTION 'payidem.status_log has rows that share a log_id, which its key in 1.1 refuses'
		USING ERRCODE = '23505',
			  DETAIL = detail || ' Rows share a log_id when written after payidem.status_log_log_id_seq was set back, or inserted by hand.',
			  HINT = 'Renumber the rows written since the sequence was set back as README.md shows ("If the update to 1.1 stops at status_log"), then run ALTER EXTENSION payidem UPDATE again.';
END
$$;
SELECT pg_catalog.setval('payidem.status_log_log_id_seq', x.top)
  FROM (SELECT max(log_id) AS top FROM payidem.status_log) x, payidem.status_log_log_id_seq s
 WHERE x.top > s.last_value OR (x.top = s.last_value AND NOT s.is_called);
ALTER TABLE payidem.status_log ENABLE ALWAYS TRIGGER status_log_append_only;

-- associated data binding a sealed record to its row: for a merchant's API
-- secret 'merchant_secret:<merchant_no>:<version>' (src/crypto.c, which the
-- notification's signature calls too)
CREATE OR REPLACE FUNCTION payidem._secret_aad(p_merchant_no text, p_version integer)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_secret_aad_sql'
LANGUAGE C IMMUTABLE STRICT;

CREATE OR REPLACE FUNCTION payidem._secrets_valid_now(p_merchant_no text)
RETURNS SETOF payidem.merchant_secret
AS 'MODULE_PATHNAME', 'payidem_secrets_valid_now'
LANGUAGE C STABLE;
COMMENT ON FUNCTION payidem._secrets_valid_now(text) IS
	'Internal: the merchant''s API secrets valid now, newest first (none if the merchant is closed).';

-- notify_result(): src/notify.c, beside notify_due() and the retry schedule
-- both follow; under READ COMMITTED a direct update of the event's row, as
-- the one UPDATE it was would have made.
CREATE OR REPLACE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_notify_result'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.notify_result(bigint, boolean, text, integer) IS
	'Report one delivery attempt of an event: ok = sent; not ok = retry after 15s, 15s, 30s, 3m, 10m, 20m, 30m, 30m, 30m, 60m, 3h, 3h, 3h, 6h, 6h, then failed (16 attempts); the start of a failure''s response is kept. No change if the event is no longer pending, or if attempt (as notify_due() handed it out) is given and is not the last one handed out. PI009 unknown event.';

-- create_order(): src/orders.c, the arguments checked against the domains of
-- their columns (payidem_domain_fits(), as _fits()), the merchant read by key
-- and the order written without an INSERT statement (no executor per row; the
-- CHECKs, defaults and index predicates compiled once per session), or with
-- it where the table has what a direct insert cannot reproduce (a rule, a
-- transition-table or BEFORE row trigger, row-level security, no INSERT
-- privilege, a column of another type); the unique constraint on
-- (merchant_no, out_trade_no) decides between concurrent first calls: the
-- loser waits for the winner's commit, then reads its row.  The errors of the
-- checks above (_require, _invalid_format, _raise_not_found) made by them, on
-- the paths that end there.
CREATE OR REPLACE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_create_order'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.create_order(text, text, bigint, text, text, text, interval, text) IS
	'New pending order (order_no = gen_order_no(''PO'')). Idempotent on (merchant_no, out_trade_no): the same amount and subject return the existing order_no, others raise PI001. PI009 unknown merchant, PI004 merchant not active, 22023 bad input.';

-- A merchant's sum of a day on a channel against its daily limits (the
-- binding's, the channel's; NULL: none), under the binding's lock: PI007 if
-- amount more would pass one.  The day is payidem.limit_timezone's (UTC by
-- default); pending and paid attempts count.  Internal to begin_payment(),
-- called only where a daily limit is set.
CREATE FUNCTION payidem._check_daily_limit(p_merchant_no text, p_channel_no text, p_amount bigint,
	p_binding_limit bigint, p_channel_limit bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text;
	v_day_start timestamptz;
	v_used numeric;		-- a day's sum may pass the bigint range
BEGIN
	-- serialize the day's sum of this merchant on this channel
	PERFORM 1 FROM payidem.merchant_channel x
	 WHERE x.merchant_no = p_merchant_no AND x.channel_no = p_channel_no FOR UPDATE;
	v_tz := coalesce(nullif(current_setting('payidem.limit_timezone', true), ''), 'UTC');
	v_day_start := date_trunc('day', now() AT TIME ZONE v_tz) AT TIME ZONE v_tz;
	SELECT coalesce(sum(x.amount), 0) INTO v_used FROM payidem.payment x
	 WHERE x.merchant_no = p_merchant_no AND x.channel_no = p_channel_no
	   AND x.created_at >= v_day_start
	   AND (x.status = 'pending' OR x.status = ANY (payidem._paid_payment_statuses()));
	IF v_used + p_amount > p_binding_limit OR v_used + p_amount > p_channel_limit THEN
		RAISE EXCEPTION 'amount exceeds the daily limit' USING
			ERRCODE = 'PI007',
			DETAIL = format('Merchant %s has %s pending or paid on channel %s today (%s); with %s more the daily limit (merchant %s, channel %s) would be exceeded.',
							p_merchant_no, v_used, p_channel_no, v_tz, p_amount,
							coalesce(p_binding_limit::text, 'none'), coalesce(p_channel_limit::text, 'none')),
			HINT = 'Use another channel, or try again tomorrow.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_daily_limit(text, text, bigint, bigint, bigint) IS
	'Internal to begin_payment(): PI007 if amount more would pass the merchant''s daily limit on the channel (binding''s or channel''s), under the binding''s lock.';

-- begin_payment(): src/orders.c, the order locked and everything read by key
-- without SQL; the errors of the checks above (_require, _check_number,
-- _raise_not_found, _refuse_repeatable_read, _check_daily_limit) made by
-- them, on the paths that end there.
REVOKE ALL ON FUNCTION payidem._check_daily_limit(text, text, bigint, bigint, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_begin_payment'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.begin_payment(text, text) IS
	'Start (or, on the same channel, return again) the pending payment attempt of an order; payment_no = gen_order_no(''PY''). PI009, PI002 (order not pending), PI008 (expired), PI004 (merchant/channel/binding/type), PI003 (pending on another channel), PI007 (limits).';

-- #41: a jsonb value in its stored form, for the router (get_order()'s
-- document reaches it without being printed and parsed again); an
-- application's function (app_functions(), above), as the router's role
-- has get_order() through grant_app()
CREATE FUNCTION payidem._jsonb_stored(value jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'payidem_jsonb_stored'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._jsonb_stored(jsonb) IS
	'Internal to the router: a jsonb value''s stored (binary) form, as bytea.';
REVOKE ALL ON FUNCTION payidem._jsonb_stored(jsonb) FROM PUBLIC;
