--
-- merchant_security: least privilege around merchants and secrets.
--   plain role: nothing; application role (grant_app): the API, no tables;
--   auditor (grant_auditor): all business rows, no secrets; reporting role
--   mapped to a merchant: that merchant's rows only (row-level security);
--   hostile look-alike functions and operators (CVE-2018-1058) are never called.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY terse

SELECT merchant_no AS m1, api_key AS m1_key FROM payidem.create_merchant('Sec One', 'retail', 0.006) \gset
SELECT merchant_no AS m2 FROM payidem.create_merchant('Sec Two', 'retail', 0.006) \gset
SELECT payidem.create_channel('SEC_WX', 'wechat', 0.002);
SELECT payidem.set_channel_config('SEC_WX', '{"key": "SEC-CANARY"}');
SELECT payidem.bind_channel(:'m1', 'SEC_WX');
SELECT payidem.sign(:'m1', 'hello') AS m1_sig \gset
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES ('PO202611290000000000051227', :'m1', 'SEC-1', 'one', 100, now() + interval '1 hour'),
       ('PO202611290000000000061315', :'m2', 'SEC-2', 'two', 200, now() + interval '1 hour');

CREATE ROLE regress_payidem_app;
CREATE ROLE regress_payidem_auditor;
CREATE ROLE regress_payidem_report;
CREATE ROLE regress_payidem_plain;
CREATE ROLE regress_payidem_hostile;
SELECT payidem.grant_app('regress_payidem_app');
SELECT payidem.grant_auditor('regress_payidem_auditor');
SELECT payidem.map_merchant_role('regress_payidem_report', :'m1');
SELECT payidem.grant_app('postgres');
SELECT payidem.map_merchant_role('regress_payidem_report', 'M000000000000000');

-------------------------------------------------------------- a plain role
SET ROLE regress_payidem_plain;
SELECT payidem.verify_signature(:'m1_key', 'hello', :'m1_sig');
SELECT payidem.gen_order_no();
RESET ROLE;

---------------------------------------------------------- application role
SET ROLE regress_payidem_app;
SELECT payidem.verify_signature(:'m1_key', 'hello', :'m1_sig') AS app_verifies;
SELECT payidem.sign(:'m1', 'hello') = :'m1_sig' AS app_signs;
SELECT payidem.route_channel(:'m1', 'wechat') AS app_routes;
SELECT payidem.get_channel_config('SEC_WX') ->> 'key' AS app_reads_config;
SELECT length(payidem.gen_order_no()) AS app_order_no;
-- but no table, no secret record, no crypto primitive, no operator function
SELECT count(*) FROM payidem.merchant_secret;
SELECT count(*) FROM payidem.channel_config;
SELECT count(*) FROM payidem.merchant;
SELECT count(*) FROM payidem."order";
SELECT payidem._open('channel_config:SEC_WX', 1, '\x00'::bytea, '\x00'::bytea, '\x00'::bytea);
SELECT payidem._hmac_sign('x', 1, '\x00'::bytea, '\x00'::bytea, '\x00'::bytea, 'p');
SELECT count(*) FROM payidem._secrets_valid_now(:'m1');
SELECT payidem.create_merchant('Evil', 'retail', 0);
SELECT payidem.rotate_merchant_secret(:'m1');
SELECT payidem.set_channel_config('SEC_WX', '{}');
SELECT payidem.reencrypt_secrets();
SELECT payidem.grant_auditor('regress_payidem_app');
RESET ROLE;
-- the secrets valid now are read with the caller's right on the tables, as the
-- SQL function they were read by: EXECUTE alone does not open them
GRANT EXECUTE ON FUNCTION payidem._secrets_valid_now(text) TO regress_payidem_app;
SET ROLE regress_payidem_app;
SELECT count(*) FROM payidem._secrets_valid_now(:'m1');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION payidem._secrets_valid_now(text) FROM regress_payidem_app;
-- ... and so is a notification's signature (no signing for whoever may not read them)
GRANT EXECUTE ON FUNCTION payidem._sign_notification(text, text) TO regress_payidem_app;
SET ROLE regress_payidem_app;
SELECT payidem._sign_notification(:'m1', 'forged');
RESET ROLE;
GRANT EXECUTE ON FUNCTION payidem._secrets_valid_now(text) TO regress_payidem_app;
GRANT SELECT ON payidem.merchant, payidem.merchant_secret TO regress_payidem_app;
SET ROLE regress_payidem_app;
SELECT payidem._sign_notification(:'m1', 'forged');
RESET ROLE;
REVOKE SELECT ON payidem.merchant, payidem.merchant_secret FROM regress_payidem_app;
REVOKE EXECUTE ON FUNCTION payidem._secrets_valid_now(text) FROM regress_payidem_app;
REVOKE EXECUTE ON FUNCTION payidem._sign_notification(text, text) FROM regress_payidem_app;
SELECT payidem._sign_notification(:'m1', 'genuine') ~ '^t=[0-9]+,v1=[0-9a-f]{64},v2=[0-9a-f]{64}$' AS owner_signs;
-- (the owner: the current secret of a merchant, and none of an unknown one)
SELECT count(*) AS valid_now, bool_and(valid_until IS NULL) AS current FROM payidem._secrets_valid_now(:'m1');
SELECT count(*) AS unknown_merchant FROM payidem._secrets_valid_now('M0000000000NONE0');
SELECT count(*) AS null_merchant FROM payidem._secrets_valid_now(NULL);

-------------------------------------------------------------------- auditor
SET ROLE regress_payidem_auditor;
SELECT count(*) AS auditor_sees_orders FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
SELECT count(*) > 0 AS auditor_sees_merchants FROM payidem.merchant;
SELECT count(*) FROM payidem.merchant_secret;
SELECT count(*) FROM payidem.channel_config;
SELECT count(*) FROM payidem.idempotency;
UPDATE payidem."order" SET amount = 1 WHERE out_trade_no = 'SEC-1';
SELECT payidem.get_channel_config('SEC_WX');
RESET ROLE;

---------------------------------------------------- merchant-mapped reporting
SET ROLE regress_payidem_report;
SELECT out_trade_no, amount FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%' ORDER BY 1;
SELECT count(*) AS other_merchants_rows FROM payidem."order" WHERE merchant_no <> :'m1';
SELECT count(*) FROM payidem.merchant;
DELETE FROM payidem."order";
RESET ROLE;
-- a mapped role learns nothing about other roles' mappings through the
-- visibility function its policy calls: it answers only for roles the
-- session can act as
SET SESSION AUTHORIZATION regress_payidem_report;
SELECT payidem._row_visible(:'m1', 'regress_payidem_report') AS own_mapping,
       payidem._row_visible(:'m1', 'regress_payidem_auditor') AS an_auditors,
       payidem._row_visible(:'m2', 'regress_payidem_auditor') AS an_auditors_elsewhere;
RESET SESSION AUTHORIZATION;
SELECT payidem.unmap_merchant_role('regress_payidem_report', :'m1');
SET ROLE regress_payidem_report;
SELECT count(*) AS rows_after_unmap FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
RESET ROLE;
-- its last merchant unmapped, the role keeps nothing map_merchant_role() gave
SELECT has_schema_privilege('regress_payidem_report', 'payidem', 'USAGE') AS schema_usage,
       has_function_privilege('regress_payidem_report', 'payidem._row_visible(text, regrole)', 'EXECUTE') AS row_visible,
       (SELECT count(*) FROM unnest(ARRAY['payidem."order"', 'payidem.payment', 'payidem.refund',
                                          'payidem.anomaly', 'payidem.open_anomalies']) t
         WHERE has_table_privilege('regress_payidem_report', t, 'SELECT')) AS tables_readable;
-------------------- an application role is never a merchant's reporting role
-- The API (notify_due, sign, close_order, ...) acts for every merchant, so a
-- role that may execute it and also reads a merchant's rows would be scoped
-- in get_order() and in nothing else.  grant_app() and map_merchant_role()
-- refuse to make one (22023), the role itself or through membership either
-- way, and change nothing.  (Merchant numbers are shown as <m1>, <m2>.)
CREATE FUNCTION pg_temp.try(stmt text, m1 text, m2 text)
RETURNS TABLE (code text, message text, detail text, hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
		detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
	detail := replace(replace(detail, m1, '<m1>'), m2, '<m2>');
	RETURN NEXT;
END
$$;
\x on
CREATE ROLE regress_payidem_mapped_app;
SELECT payidem.grant_app('regress_payidem_mapped_app');
SELECT * FROM pg_temp.try(format('SELECT payidem.map_merchant_role(%L, %L)', 'regress_payidem_mapped_app', :'m1'), :'m1', :'m2');
SELECT payidem.map_merchant_role('regress_payidem_report', :'m1');
SELECT * FROM pg_temp.try($$SELECT payidem.grant_app('regress_payidem_report')$$, :'m1', :'m2');
\x off
-- nothing changed: the application is mapped nowhere and reads no table, the
-- reporting role executes no API function and still reads its merchant's rows
SELECT (SELECT count(*) FROM payidem.merchant_role WHERE role = 'regress_payidem_mapped_app'::regrole) AS app_mappings,
       has_table_privilege('regress_payidem_mapped_app', 'payidem."order"', 'SELECT') AS app_reads_orders,
       has_function_privilege('regress_payidem_mapped_app', 'payidem._row_visible(text, regrole)', 'EXECUTE') AS app_row_visible,
       has_function_privilege('regress_payidem_report', 'payidem.notify_due(integer)', 'EXECUTE') AS report_notify_due,
       (SELECT count(*) FROM payidem.app_functions() f WHERE has_function_privilege('regress_payidem_report', f, 'EXECUTE')) AS report_api,
       has_table_privilege('regress_payidem_report', 'payidem."order"', 'SELECT') AS report_reads_orders;
-- through membership: a member of the application role, a group role with an
-- application among its members; a member of the reporting role, a group
-- role with the reporting role among its members
CREATE ROLE regress_payidem_app_member IN ROLE regress_payidem_mapped_app;
CREATE ROLE regress_payidem_app_group;
GRANT regress_payidem_app_group TO regress_payidem_mapped_app;
CREATE ROLE regress_payidem_report_member IN ROLE regress_payidem_report;
CREATE ROLE regress_payidem_report_group;
GRANT regress_payidem_report_group TO regress_payidem_report;
SELECT r AS role, (pg_temp.try(format('SELECT payidem.map_merchant_role(%L, %L)', r, :'m2'), :'m1', :'m2')).*
  FROM unnest(ARRAY['regress_payidem_app_member', 'regress_payidem_app_group']) r;
SELECT r AS role, (pg_temp.try(format('SELECT payidem.grant_app(%L)', r), :'m1', :'m2')).*
  FROM unnest(ARRAY['regress_payidem_report_member', 'regress_payidem_report_group']) r;
SELECT count(*) AS new_mappings FROM payidem.merchant_role WHERE merchant_no = :'m2';
SELECT count(*) AS api_granted
  FROM payidem.app_functions() f, unnest(ARRAY['regress_payidem_report_member', 'regress_payidem_report_group']) r
 WHERE has_function_privilege(r, f, 'EXECUTE');
-- separate roles are fine: an auditor may be an application too, and a role
-- mapped to one merchant may be mapped to another
CREATE ROLE regress_payidem_app_auditor;
SELECT payidem.grant_auditor('regress_payidem_app_auditor');
SELECT payidem.grant_app('regress_payidem_app_auditor');
SET ROLE regress_payidem_app_auditor;
SELECT payidem.get_order('PO202611290000000000061315') ->> 'out_trade_no' AS auditor_app_reads;
RESET ROLE;
SELECT payidem.revoke_auditor('regress_payidem_app_auditor');
SELECT payidem.map_merchant_role('regress_payidem_report', :'m2');
SELECT payidem.unmap_merchant_role('regress_payidem_report', :'m2');
-- A GRANT of membership made after both exist is not seen by payidem when it
-- is made.  get_order() and find_order() then refuse the role that is both
-- (42501) rather than show it its merchant's orders only; the other API
-- functions are not checked at each call (documented in docs/security.md).
GRANT regress_payidem_report TO regress_payidem_mapped_app;
SET ROLE regress_payidem_mapped_app;
\x on
SELECT * FROM pg_temp.try($$SELECT payidem.get_order('PO202611290000000000051227')$$, :'m1', :'m2');
SELECT * FROM pg_temp.try(format('SELECT payidem.find_order(%L, %L)', :'m2', 'SEC-2'), :'m1', :'m2');
\x off
RESET ROLE;
REVOKE regress_payidem_report FROM regress_payidem_mapped_app;
GRANT regress_payidem_mapped_app TO regress_payidem_report;
SET ROLE regress_payidem_report;
SELECT code, message FROM pg_temp.try($$SELECT payidem.get_order('PO202611290000000000051227')$$, :'m1', :'m2');
RESET ROLE;
REVOKE regress_payidem_mapped_app FROM regress_payidem_report;
-- get_order() and find_order() alone are scoped: a reporting role may have
-- them (and reads its merchant's orders with them), until it is given more
GRANT EXECUTE ON FUNCTION payidem.get_order(text), payidem.find_order(text, text) TO regress_payidem_report;
SET ROLE regress_payidem_report;
SELECT payidem.get_order('PO202611290000000000051227') ->> 'out_trade_no' AS report_reads_its_order;
SELECT code FROM pg_temp.try($$SELECT payidem.get_order('PO202611290000000000061315')$$, :'m1', :'m2') AS report_reads_another;
RESET ROLE;
SELECT payidem.map_merchant_role('regress_payidem_report', :'m1');
GRANT EXECUTE ON FUNCTION payidem.notify_due(integer) TO regress_payidem_report;
SET ROLE regress_payidem_report;
SELECT code, detail FROM pg_temp.try($$SELECT payidem.get_order('PO202611290000000000051227')$$, :'m1', :'m2');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION payidem.get_order(text), payidem.find_order(text, text), payidem.notify_due(integer)
	FROM regress_payidem_report;
-- separate again, each reads as before
SET ROLE regress_payidem_mapped_app;
SELECT payidem.get_order('PO202611290000000000061315') ->> 'out_trade_no' AS app_reads_any_order;
RESET ROLE;
SET ROLE regress_payidem_report;
SELECT out_trade_no AS report_reads_m1 FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
RESET ROLE;
SELECT payidem.unmap_merchant_role('regress_payidem_report', :'m1');
-- A role 1.0 let be both (grant_app, then map_merchant_role as 1.0 did it:
-- the grants and the row), kept by the update to 1.1, which names it in a
-- WARNING (test/t/070_upgrade.pl): get_order() refuses it; it can still be
-- unmapped, and then keeps its reads (without SELECT on "order" get_order()
-- would show it every merchant's orders, as to an application; with it,
-- row-level security shows it none: fail closed).
CREATE ROLE regress_payidem_old_both;
SELECT payidem.grant_app('regress_payidem_old_both');
GRANT EXECUTE ON FUNCTION payidem._row_visible(text, regrole) TO regress_payidem_old_both;
GRANT SELECT ON payidem."order", payidem.payment, payidem.refund, payidem.anomaly, payidem.open_anomalies
	TO regress_payidem_old_both;
INSERT INTO payidem.merchant_role (role, merchant_no) VALUES ('regress_payidem_old_both', :'m2');
SELECT role, mapped_role, merchant_no = :'m2' AS is_m2, app_function FROM payidem._app_merchant_roles();
SET ROLE regress_payidem_old_both;
SELECT code, message, detail FROM pg_temp.try($$SELECT payidem.get_order('PO202611290000000000061315')$$, :'m1', :'m2');
RESET ROLE;
SELECT payidem.unmap_merchant_role('regress_payidem_old_both', :'m2');
SELECT has_schema_privilege('regress_payidem_old_both', 'payidem', 'USAGE') AS app_schema_usage,
       has_function_privilege('regress_payidem_old_both', 'payidem.create_order(text, text, bigint, text, text, text, interval, text)', 'EXECUTE') AS app_api,
       has_table_privilege('regress_payidem_old_both', 'payidem."order"', 'SELECT') AS app_reads_orders;
SET ROLE regress_payidem_old_both;
\set VERBOSITY sqlstate
SELECT payidem.get_order('PO202611290000000000061315');
\set VERBOSITY terse
RESET ROLE;
-- and a group role unmapped whose member is an application (made by a GRANT
-- after the mapping): the member still reads through the group's SELECT, so
-- the group keeps it
CREATE ROLE regress_payidem_group;
SELECT payidem.map_merchant_role('regress_payidem_group', :'m1');
GRANT regress_payidem_group TO regress_payidem_old_both;
SELECT payidem.unmap_merchant_role('regress_payidem_group', :'m1');
SELECT has_table_privilege('regress_payidem_group', 'payidem."order"', 'SELECT') AS group_keeps_reads;
SELECT count(*) AS app_and_merchant_roles_left FROM payidem._app_merchant_roles();
DROP OWNED BY regress_payidem_mapped_app, regress_payidem_app_member, regress_payidem_group,
	regress_payidem_app_group, regress_payidem_report_member, regress_payidem_report_group,
	regress_payidem_old_both, regress_payidem_app_auditor;
DROP ROLE regress_payidem_mapped_app, regress_payidem_app_member, regress_payidem_group,
	regress_payidem_app_group, regress_payidem_report_member, regress_payidem_report_group,
	regress_payidem_old_both, regress_payidem_app_auditor;

-------------------------------------------- roles are kept by OID, not name
-- A role dropped the usual way (DROP OWNED BY revokes its grants) and created
-- again under the same name is a new role: it must not inherit the old one's
-- auditor access, nor another merchant's mapping.
CREATE ROLE regress_payidem_reused;
SELECT payidem.grant_auditor('regress_payidem_reused');
DROP OWNED BY regress_payidem_reused;
DROP ROLE regress_payidem_reused;
CREATE ROLE regress_payidem_reused;
SELECT payidem.map_merchant_role('regress_payidem_reused', :'m2');
SET ROLE regress_payidem_reused;
SELECT out_trade_no FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%' ORDER BY 1;
RESET ROLE;
-- the dropped role's row is gone (removed when a mapping changed)
SELECT count(*) AS auditor_rows_of_dropped_roles
  FROM payidem.auditor_role a WHERE NOT EXISTS (SELECT 1 FROM pg_roles u WHERE u.oid = a.role);
-- a name that needs quoting is mapped and unmapped alike
CREATE ROLE "Regress-Payidem Report";
SELECT payidem.map_merchant_role('"Regress-Payidem Report"', :'m1');
SELECT role, merchant_no = :'m1' AS is_m1 FROM payidem.merchant_role WHERE role = '"Regress-Payidem Report"'::regrole;
SELECT payidem.unmap_merchant_role('"Regress-Payidem Report"', :'m1');
SET ROLE "Regress-Payidem Report";
SELECT count(*) AS rows_after_unmap FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
RESET ROLE;
\set VERBOSITY sqlstate
SELECT payidem.unmap_merchant_role('"Regress-Payidem Report"', :'m1');
\set VERBOSITY terse
-- revoke_auditor undoes grant_auditor; a merchant mapping of the same role stays
SELECT payidem.grant_auditor('regress_payidem_reused');
SET ROLE regress_payidem_reused;
SELECT count(*) AS auditor_sees FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
RESET ROLE;
SELECT payidem.revoke_auditor('regress_payidem_reused');
SET ROLE regress_payidem_reused;
SELECT out_trade_no AS still_mapped_to_m2 FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
SELECT count(*) FROM payidem.merchant;
RESET ROLE;
\set VERBOSITY sqlstate
SELECT payidem.revoke_auditor('regress_payidem_reused');
\set VERBOSITY terse
SELECT payidem.revoke_auditor('regress_payidem_auditor');
SET ROLE regress_payidem_auditor;
SELECT count(*) AS former_auditor_sees FROM payidem."order";
RESET ROLE;
-- an auditor revoked (and mapped nowhere) keeps no payidem grant at all
SELECT count(*) AS grants_left
  FROM (SELECT c.relacl AS acl FROM pg_class c WHERE c.relnamespace = 'payidem'::regnamespace
        UNION ALL SELECT p.proacl FROM pg_proc p WHERE p.pronamespace = 'payidem'::regnamespace
        UNION ALL SELECT n.nspacl FROM pg_namespace n WHERE n.nspname = 'payidem') o,
       aclexplode(o.acl) a
 WHERE a.grantee = 'regress_payidem_auditor'::regrole;
-- a grant can always be undone: an auditor that became BYPASSRLS is revoked
SELECT payidem.grant_auditor('regress_payidem_reused');
ALTER ROLE regress_payidem_reused BYPASSRLS;
SELECT payidem.revoke_auditor('regress_payidem_reused');
ALTER ROLE regress_payidem_reused NOBYPASSRLS;
SELECT count(*) AS auditors_left FROM payidem.auditor_role;
-- the application role does not load bills (grant load_bill explicitly)
SET ROLE regress_payidem_app;
SELECT payidem.load_bill('SEC_WX', '2026-01-01', '');
RESET ROLE;

------------------------------------------- look-alike functions and operators
-- A hostile role plants functions and operators in public that shadow
-- pg_catalog's (CVE-2018-1058).  payidem's functions pin their search_path,
-- so none of them is ever called, even from a session whose search_path puts
-- public first.
GRANT CREATE ON SCHEMA public TO regress_payidem_hostile;
SET ROLE regress_payidem_hostile;
CREATE FUNCTION public.hijacked() RETURNS void LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked: a look-alike function was called'; END $$;
CREATE FUNCTION public.length(text) RETURNS integer LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN 0; END $$;
CREATE FUNCTION public.btrim(text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN ''; END $$;
CREATE FUNCTION public.random() RETURNS double precision LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN 0; END $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN NULL; END $$;
CREATE FUNCTION public.quote_literal(text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN ''; END $$;
CREATE FUNCTION public.convert_to(text, name) RETURNS bytea LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN ''; END $$;
CREATE FUNCTION public.texteq_evil(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN true; END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, PROCEDURE = public.texteq_evil);
CREATE FUNCTION public.textcat_evil(text, text) RETURNS text LANGUAGE plpgsql AS
  $$ BEGIN PERFORM public.hijacked(); RETURN ''; END $$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, PROCEDURE = public.textcat_evil);
RESET ROLE;
SET search_path = public, pg_catalog;
SET ROLE regress_payidem_app;
-- the application's own session also has temp look-alikes
CREATE TEMP TABLE merchant_secret (merchant_no text);
CREATE FUNCTION pg_temp.lower(text) RETURNS text LANGUAGE sql AS $$ SELECT 'hijacked' $$;
-- (the test's own comparisons name pg_catalog's operators: its search_path is hostile too)
SELECT payidem.verify_signature(:'m1_key', 'hello', :'m1_sig') AS still_verifies;
SELECT payidem.sign(:'m1', 'hello') OPERATOR(pg_catalog.=) :'m1_sig' AS still_signs;
SELECT payidem.route_channel(:'m1', 'wechat') AS still_routes;
SELECT payidem.get_channel_config('SEC_WX') ->> 'key' AS still_reads_config;
SELECT pg_catalog.length(payidem.gen_order_no()) AS still_numbers;
RESET ROLE;
SELECT count(*) AS merchants_created FROM payidem.create_merchant('After Attack', 'retail', 0.006);
SELECT payidem.rotate_merchant_secret(:'m2') OPERATOR(pg_catalog.~) '^[0-9a-f]{64}$' AS still_rotates;
SELECT count(*) AS order_numbers_still_issued FROM payidem.gen_order_no('PY');
RESET search_path;

-- every SECURITY DEFINER function of payidem pins its search_path
SELECT p.oid::regprocedure AS definer_without_search_path
  FROM pg_proc p
 WHERE p.pronamespace = 'payidem'::regnamespace AND p.prosecdef
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);

-- clean up
DROP OWNED BY regress_payidem_hostile;
REVOKE CREATE ON SCHEMA public FROM regress_payidem_hostile;
-- (money records are kept: only the superuser's replica mode deletes them)
SET session_replication_role = replica;
DELETE FROM payidem."order" WHERE out_trade_no LIKE 'SEC-%';
RESET session_replication_role;
DELETE FROM payidem.auditor_role;
DELETE FROM payidem.merchant_role;
DROP OWNED BY regress_payidem_app, regress_payidem_auditor, regress_payidem_report, regress_payidem_reused,
	"Regress-Payidem Report";
DROP ROLE regress_payidem_app, regress_payidem_auditor, regress_payidem_report,
          regress_payidem_plain, regress_payidem_hostile, regress_payidem_reused, "Regress-Payidem Report";
