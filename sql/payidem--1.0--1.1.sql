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
