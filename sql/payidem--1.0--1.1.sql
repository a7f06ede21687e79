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
-- What map_merchant_role() and grant_auditor() both grant, taken back once
-- the role is neither an auditor nor mapped to a merchant: SELECT on the
-- tables row-level security filters, EXECUTE on the visibility function its
-- policies call, and USAGE on the schema unless the role still holds a grant
-- on a table of the schema (a DBA's GRANT).  Not from a role that may also
-- execute a payidem function, itself or through a role it is a member of
-- (grant_app(), a DBA's GRANT): without SELECT on
-- "order", get_order() and find_order() would show it every merchant's
-- orders, as to an application; with it, its row-level security shows none.
CREATE FUNCTION payidem._revoke_reader_grants(role regrole, role_name name)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM payidem.auditor_role a WHERE a.role = _revoke_reader_grants.role)
	   OR EXISTS (SELECT 1 FROM payidem.merchant_role r WHERE r.role = _revoke_reader_grants.role)
	   OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
				   WHERE p.pronamespace = 'payidem'::regnamespace
					 AND p.oid <> 'payidem._row_visible(text, regrole)'::regprocedure
					 AND pg_catalog.has_function_privilege(_revoke_reader_grants.role::oid, p.oid, 'EXECUTE')) THEN
		RETURN;
	END IF;
	EXECUTE format('REVOKE SELECT ON payidem."order", payidem.payment, payidem.refund, payidem.anomaly, '
				   'payidem.open_anomalies FROM %I', role_name);
	EXECUTE format('REVOKE EXECUTE ON FUNCTION payidem._row_visible(text, regrole) FROM %I', role_name);
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
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
	EXECUTE format('REVOKE SELECT ON payidem.merchant, payidem.channel, payidem.merchant_channel, '
				   'payidem.status_log, payidem.state, payidem.transition, payidem.channel_bill, '
				   'payidem.recon_batch, payidem.reconciliation, payidem.recon_summary, '
				   'payidem.open_differences, payidem.notify_event, payidem.notification_backlog FROM %I', v_role);
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
