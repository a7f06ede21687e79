--
-- app_api: what an application reads and follows up without table
-- privileges (DESIGN section 7):
--   1. apply_payment_result_ex(): the outcome and the anomaly it names (a
--      repeated refusal names the same open anomaly; a success for an unknown
--      number its unknown_transaction anomaly, once);
--   2. get_order() lists the order's anomalies;
--   3. list_orders(): keyset pages, newest first (by order number), a
--      status filter, bad input;
--   4. the work queues list_anomalies() and list_differences(): pages,
--      filters, resolved ones out of the open queue;
--   5. who sees what: the application role every merchant, a merchant's
--      reporting role its own, a role that is both refused;
--   6. health().
-- Generated numbers are printed as labels; the lists are read for this
-- test's rows only (the database holds the other tests' too).
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS payidem;
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, YMD';
SET payidem.bill_timezone = 'UTC';
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE TEMP TABLE lbl (no text PRIMARY KEY, label text NOT NULL UNIQUE);
GRANT SELECT ON lbl TO PUBLIC;
CREATE FUNCTION pg_temp.l(t text) RETURNS text LANGUAGE sql STABLE
	AS $$ SELECT coalesce((SELECT label FROM lbl WHERE no = t), t) $$;
-- an error as a row, the generated numbers in it as their labels
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (code text, message text, detail text, hint text)
LANGUAGE plpgsql AS $$
DECLARE
	x record;
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
		detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
	FOR x IN SELECT no, label FROM lbl LOOP
		message := replace(message, x.no, x.label);
		detail := replace(detail, x.no, x.label);
	END LOOP;
	RETURN NEXT;
END
$$;

SELECT coalesce(max(anomaly_id), 0) AS a0 FROM payidem.anomaly \gset
SELECT merchant_no AS ma FROM payidem.create_merchant('App A', 'retail', 0.006) \gset
SELECT merchant_no AS mb FROM payidem.create_merchant('App B', 'retail', 0.006) \gset
INSERT INTO lbl VALUES (:'ma', 'MA'), (:'mb', 'MB');
SELECT payidem.create_channel('APP_WX', 'wechat', 0.0025);
SELECT payidem.bind_channel(:'ma', 'APP_WX'), payidem.bind_channel(:'mb', 'APP_WX');

-- seven orders of A in one transaction, then three more, and two of B
BEGIN;
INSERT INTO lbl SELECT payidem.create_order(:'ma', 'A-' || i, 100 * i, 'item ' || i), 'A' || i
  FROM generate_series(1, 7) i;
COMMIT;
INSERT INTO lbl SELECT payidem.create_order(:'ma', 'A-' || i, 100 * i, 'item ' || i), 'A' || i
  FROM generate_series(8, 10) i;
INSERT INTO lbl SELECT payidem.create_order(:'mb', 'B-' || i, 100 * i, 'item ' || i), 'B' || i
  FROM generate_series(1, 2) i;
SELECT no AS a1 FROM lbl WHERE label = 'A1' \gset
SELECT no AS a2 FROM lbl WHERE label = 'A2' \gset
SELECT no AS a3 FROM lbl WHERE label = 'A3' \gset
SELECT no AS b1 FROM lbl WHERE label = 'B1' \gset

---------------------------------------------------------------- 1. results name their anomaly
SELECT payidem.begin_payment(:'a1', 'APP_WX') AS pa1 \gset
SELECT payidem.begin_payment(:'a2', 'APP_WX') AS pa2 \gset
SELECT payidem.begin_payment(:'b1', 'APP_WX') AS pb1 \gset
INSERT INTO lbl VALUES (:'pa1', 'PA1'), (:'pa2', 'PA2'), (:'pb1', 'PB1');
CREATE TEMP TABLE seen (step text, outcome text, anomaly_id bigint);
-- a wrong amount: rejected, an amount_mismatch; its repeat names the same one
INSERT INTO seen SELECT 'A1 999', * FROM payidem.apply_payment_result_ex(:'pa1', 'callback', 'succeeded', 'APP-T1', 99);
INSERT INTO seen SELECT 'A1 999 again', * FROM payidem.apply_payment_result_ex(:'pa1', 'callback', 'succeeded', 'APP-T1', 99);
-- the right one: applied, and its repeat a duplicate, neither names one
INSERT INTO seen SELECT 'A1 paid', * FROM payidem.apply_payment_result_ex(:'pa1', 'callback', 'succeeded', 'APP-T1', 100);
INSERT INTO seen SELECT 'A1 paid again', * FROM payidem.apply_payment_result_ex(:'pa1', 'query', 'succeeded', 'APP-T1', 100);
-- a second charge reported: rejected, conflicting_result
INSERT INTO seen SELECT 'A1 other charge', * FROM payidem.apply_payment_result_ex(:'pa1', 'callback', 'succeeded', 'APP-T1b', 100);
-- a success after the order was closed: anomaly, paid_after_close
SELECT payidem.close_order(:'a2');
INSERT INTO seen SELECT 'A2 after close', * FROM payidem.apply_payment_result_ex(:'pa2', 'callback', 'succeeded', 'APP-T2', 200);
-- B pays
INSERT INTO seen SELECT 'B1 paid', * FROM payidem.apply_payment_result_ex(:'pb1', 'callback', 'succeeded', 'APP-T3', 100);
-- a success for a number that names no payment: rejected, unknown_transaction, once
SELECT payidem.order_no_make('PY', now(), 0, 999999) AS unknown \gset
INSERT INTO seen SELECT 'unknown', * FROM payidem.apply_payment_result_ex(:'unknown', 'callback', 'succeeded', 'APP-T9', 500);
INSERT INTO seen SELECT 'unknown again', * FROM payidem.apply_payment_result_ex(:'unknown', 'query', 'succeeded', 'APP-T9', 500);
SELECT s.step, s.outcome, a.kind, pg_temp.l(a.payment_no) AS payment,
       s.anomaly_id = min(s.anomaly_id) OVER (PARTITION BY a.anomaly_id) AS first_named
  FROM seen s LEFT JOIN payidem.anomaly a ON a.anomaly_id = s.anomaly_id
 ORDER BY s.ctid;
-- every anomaly is named by a result
SELECT count(*) AS anomalies, count(*) FILTER (WHERE anomaly_id IN (SELECT anomaly_id FROM seen)) AS named
  FROM payidem.anomaly WHERE anomaly_id > :a0;
-- the same arguments' errors as apply_payment_result()
INSERT INTO lbl VALUES (:'unknown', 'UNKNOWN');
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result_ex(%L, %L, %L)', :'pa1', 'callback', 'succeeded'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result_ex(%L, %L, %L)', :'unknown', 'callback', 'failed'));

---------------------------------------------------------------- 2. get_order's anomalies
SELECT x ->> 'kind' AS kind, x ->> 'handle_status' AS handle_status, (x ->> 'amount')::bigint AS amount,
       x ->> 'action' AS action, pg_temp.l(x ->> 'payment_no') AS payment,
       x ->> 'created_at' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$' AS utc_time
  FROM jsonb_array_elements(payidem.get_order(:'a1') -> 'anomalies') x;
SELECT jsonb_array_length(payidem.get_order(:'a2') -> 'anomalies') AS a2_anomalies,
       payidem.get_order(:'a3') -> 'anomalies' AS a3_anomalies;

---------------------------------------------------------------- 3. list_orders
-- pages of 4 through A's ten orders, each after the last of the one before
CREATE TEMP TABLE pages (page int, pos int, order_no text, status text);
DO $$
DECLARE
	v_after text;
	v_page int := 0;
	r record;
BEGIN
	LOOP
		v_page := v_page + 1;
		FOR r IN SELECT x ->> 'order_no' AS o, x ->> 'status' AS s, n
				   FROM payidem.list_orders((SELECT no FROM lbl WHERE label = 'MA'), v_after, 4)
						WITH ORDINALITY AS t(x, n) LOOP
			INSERT INTO pages VALUES (v_page, r.n, r.o, r.s);
			v_after := r.o;
		END LOOP;
		EXIT WHEN NOT FOUND OR v_page > 5;
	END LOOP;
END
$$;
SELECT page, string_agg(pg_temp.l(order_no) || ' ' || status, ', ' ORDER BY pos) AS orders FROM pages GROUP BY page ORDER BY page;
-- exactly the merchant's orders, newest first: in the order they were made
SELECT array_agg(order_no ORDER BY page, pos) = (SELECT array_agg(no ORDER BY substr(label, 2)::int DESC)
												   FROM lbl WHERE label ~ '^A[0-9]+$') AS all_in_order
  FROM pages;
-- only paid ones; a status that does not exist; one row per page
SELECT pg_temp.l(x ->> 'order_no') AS paid FROM payidem.list_orders(:'ma', status => 'paid') x;
SELECT pg_temp.l(x ->> 'order_no') AS closed FROM payidem.list_orders(:'ma', NULL, 100, 'closed') x;
SELECT pg_temp.l(x ->> 'order_no') AS newest FROM payidem.list_orders(:'mb', max_rows => 1) x;
-- a row is the order as get_order() shows it, without its lists
SELECT x = payidem.get_order(:'a1') - 'payments' - 'refunds' - 'anomalies' AS same_as_get_order
  FROM payidem.list_orders(:'ma', NULL, 1000) x WHERE x ->> 'order_no' = :'a1';
-- the foreign keys' unique index serves it: a backward scan of order_merchant_key
-- gives the merchant's orders in order, from the position on.  (Without a sort
-- or a sequential scan to choose: on this test's few rows the planner's choice
-- depends on when the statistics were last gathered.)
BEGIN;
SET LOCAL enable_sort = off;
SET LOCAL enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT o.order_no FROM payidem."order" o
 WHERE o.merchant_no = 'M' AND o.order_no < 'PO'
 ORDER BY o.order_no DESC LIMIT 100;
COMMIT;
-- after is a position: another merchant's number pages as well (nothing of it shown)
SELECT count(*) AS older_than_b1 FROM payidem.list_orders(:'ma', :'b1');
-- bad input
SELECT payidem.list_orders(NULL);
SELECT payidem.list_orders('MNOSUCHMERCHANT0');
SELECT payidem.list_orders(:'ma', NULL, 0);
SELECT payidem.list_orders(:'ma', NULL, 1001);
SELECT payidem.list_orders(:'ma', NULL, NULL);
\set VERBOSITY terse
SELECT payidem.list_orders(:'ma', NULL, 10, 'shipped');	-- (DETAIL: the statuses of the whitelist)
\set VERBOSITY default
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L, %L)', :'ma', 'nonsense'));

---------------------------------------------------------------- 4. the work queues
SELECT pg_temp.l(x ->> 'order_no') AS "order", x ->> 'kind' AS kind
  FROM payidem.list_anomalies() x WHERE (x ->> 'anomaly_id')::bigint > :a0;
-- pages of 2, A's anomalies only
SELECT x ->> 'kind' AS kind FROM payidem.list_anomalies(:'ma', max_rows => 2) x;
SELECT x ->> 'kind' AS kind
  FROM payidem.list_anomalies(:'ma', (SELECT (y ->> 'anomaly_id')::bigint FROM payidem.list_anomalies(:'ma', max_rows => 2) y
										OFFSET 1), 2) x;
-- resolved: out of the open queue, in the handled one
SELECT payidem.resolve_anomaly((SELECT anomaly_id FROM seen WHERE step = 'A1 999'), 'ignored', 'amount typo at the channel');
SELECT x ->> 'kind' AS open_kind FROM payidem.list_anomalies(:'ma') x;
SELECT x ->> 'kind' AS kind, x ->> 'handle_status' AS status, x ->> 'note' AS note,
       x ->> 'handled_by' = session_user AS by_me
  FROM payidem.list_anomalies(:'ma', handle_status => 'ignored') x;
SELECT count(*) AS all_of_a FROM payidem.list_anomalies(:'ma', handle_status => NULL);
SELECT payidem.list_anomalies(NULL, NULL, 10, 'closed');
SELECT payidem.list_anomalies('MNOSUCHMERCHANT0');

-- differences: A1 billed with another amount, B1 not billed, one unknown to us
SELECT payidem.load_bill('APP_WX', current_date,
	E'channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at\n'
	|| format(E'APP_WX,%s,APP-T1,%s,101,1,succeeded,%s\n', current_date, :'pa1', now())
	|| format(E'APP_WX,%s,APP-T2,%s,200,1,succeeded,%s\n', current_date, :'pa2', now())
	|| format(E'APP_WX,%s,APP-T7,,700,2,succeeded,%s\n', current_date, now())) AS lines;
SELECT matched, platform_only, channel_only, amount_mismatch FROM payidem.reconcile('APP_WX', current_date);
SELECT x ->> 'diff_type' AS diff_type, pg_temp.l(x ->> 'payment_no') AS payment, x ->> 'platform_amount' AS platform,
       x ->> 'channel_amount' AS channel, x ->> 'bill_date' = current_date::text AS today
  FROM payidem.list_differences('APP_WX') x;
SELECT count(*) AS after_the_first FROM payidem.list_differences('APP_WX',
	after => (SELECT (x ->> 'recon_id')::bigint FROM payidem.list_differences('APP_WX') x LIMIT 1));
SELECT payidem.resolve_diff((SELECT (x ->> 'recon_id')::bigint FROM payidem.list_differences('APP_WX') x
							  WHERE x ->> 'diff_type' = 'platform_only'), 'handled', 'late bill line');
SELECT x ->> 'diff_type' AS still_open FROM payidem.list_differences('APP_WX') x;
SELECT count(*) AS handled FROM payidem.list_differences('APP_WX', handle_status => 'handled');
SELECT payidem.list_differences('NO_CHANNEL');
SELECT payidem.list_differences(NULL, NULL, 10, 'auto');

---------------------------------------------------------------- 5. who sees what
CREATE ROLE app_api_app;
CREATE ROLE app_api_rep;
SELECT payidem.grant_app('app_api_app');
SELECT payidem.map_merchant_role('app_api_rep', :'ma');
GRANT EXECUTE ON FUNCTION payidem.list_orders(text, text, integer, text),
	payidem.list_anomalies(text, bigint, integer, text),
	payidem.list_differences(text, bigint, integer, text) TO app_api_rep;
SET ROLE app_api_app;
SELECT count(*) AS app_orders_of_b FROM payidem.list_orders(:'mb');
SELECT count(*) AS app_anomalies FROM payidem.list_anomalies(handle_status => NULL, max_rows => 1000) x
 WHERE (x ->> 'anomaly_id')::bigint > :a0;
SELECT count(*) AS app_differences FROM payidem.list_differences('APP_WX', handle_status => NULL);
SELECT (r).outcome FROM (SELECT payidem.apply_payment_result_ex(:'pb1', 'query', 'succeeded', 'APP-T3', 100) AS r) s;
SELECT payidem.health() ->> 'library_version' = payidem.library_version() AS app_reads_health;
SELECT * FROM payidem.open_anomalies;		-- (the views need table privileges: the functions do not)
RESET ROLE;
SET ROLE app_api_rep;
-- its merchant's only; another merchant does not exist for it
SELECT count(*) AS rep_orders_of_a FROM payidem.list_orders(:'ma');
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L)', :'mb'));
SELECT pg_temp.l(x ->> 'order_no') AS "order", x ->> 'kind' AS kind FROM payidem.list_anomalies(handle_status => NULL) x;
SELECT x ->> 'diff_type' AS diff_type, pg_temp.l(x ->> 'payment_no') AS payment FROM payidem.list_differences(handle_status => NULL) x;
SELECT * FROM pg_temp.try(format('SELECT payidem.list_anomalies(%L)', :'mb'));
RESET ROLE;
-- its SELECTs revoked, it is still scoped: a REVOKE never widens what it reads
REVOKE SELECT ON payidem."order", payidem.anomaly FROM app_api_rep;
SET ROLE app_api_rep;
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L)', :'mb'));
SELECT count(*) AS rep_orders_of_a_without_select FROM payidem.list_orders(:'ma');
SELECT count(*) AS rep_anomalies_without_select FROM payidem.list_anomalies(handle_status => NULL);
RESET ROLE;
-- so is a member of it (mapped through the membership, no grant of its own):
-- scoped, it reads what the tables' row-level security shows it, which maps
-- roles themselves, not their members: no merchant (fail closed)
CREATE ROLE app_api_member IN ROLE app_api_rep;
SET ROLE app_api_member;
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L)', :'mb'));
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L)', :'ma'));
RESET ROLE;
DROP ROLE app_api_member;
-- an auditor given the lists sees every row, those without a merchant too
CREATE ROLE app_api_audit;
SELECT payidem.grant_auditor('app_api_audit');
GRANT EXECUTE ON FUNCTION payidem.list_anomalies(text, bigint, integer, text),
	payidem.list_differences(text, bigint, integer, text) TO app_api_audit;
SET ROLE app_api_audit;
SELECT (SELECT count(*) FROM payidem.list_anomalies(handle_status => NULL, max_rows => 1000) x
		 WHERE (x ->> 'anomaly_id')::bigint > :a0) AS audit_listed,
	   (SELECT count(*) FROM payidem.anomaly WHERE anomaly_id > :a0) AS audit_in_table;
SELECT x ->> 'diff_type' AS audit_difference, pg_temp.l(x ->> 'payment_no') AS payment
  FROM payidem.list_differences('APP_WX', handle_status => NULL) x;
RESET ROLE;
-- a role made both (a GRANT of membership after the fact) is refused by the lists too
GRANT app_api_app TO app_api_rep;
SET ROLE app_api_rep;
SELECT * FROM pg_temp.try(format('SELECT payidem.list_orders(%L)', :'ma'));
SELECT * FROM pg_temp.try('SELECT payidem.list_anomalies()');
RESET ROLE;
REVOKE app_api_app FROM app_api_rep;

---------------------------------------------------------------- 6. health()
-- the test clusters run without housekeeping: degraded, and says why
SELECT h ->> 'status' AS status, h -> 'problems' AS problems, h ->> 'preloaded' AS preloaded,
       h -> 'master_key' ->> 'readable' AS key_readable, h -> 'housekeeping' ->> 'enabled' AS housekeeping,
       h -> 'replication' ->> 'writes_allowed' AS writes_allowed,
       (h ->> 'open_anomalies')::int = (SELECT count(*) FROM payidem.anomaly WHERE handle_status = 'open') AS anomalies_right,
       (h ->> 'open_differences')::int = (SELECT count(*) FROM payidem.reconciliation WHERE handle_status = 'open') AS differences_right,
       h ->> 'extension_version' = (SELECT extversion FROM pg_extension WHERE extname = 'payidem') AS extension_version_right,
       (h -> 'notifications' ->> 'due')::int = (SELECT count(*) FROM payidem.notify_event
												 WHERE status = 'pending' AND next_attempt_at <= now()) AS due_right
  FROM payidem.health() h;
SELECT string_agg(k, ', ' ORDER BY k) AS health_keys FROM jsonb_object_keys(payidem.health()) k;

---------------------------------------------------------------- clean up
SELECT payidem.unmap_merchant_role('app_api_rep', :'ma');
SELECT payidem.revoke_auditor('app_api_audit');
DROP OWNED BY app_api_app, app_api_rep, app_api_audit;
DROP ROLE app_api_app, app_api_rep, app_api_audit;

---------------------------------------------------------------- the extension made again
-- (last: it drops what the other tests left) the lists keep their plans by
-- name: made again three times in one session, each list still works
DROP EXTENSION payidem CASCADE;
CREATE EXTENSION payidem;
SELECT merchant_no AS mx FROM payidem.create_merchant('Again 1', 'retail', 0.006) \gset
SELECT payidem.create_order(:'mx', 'AGAIN-1', 100, 'again') IS NOT NULL AS round_1;
SELECT (SELECT count(*) FROM payidem.list_orders(:'mx')) AS orders, (SELECT count(*) FROM payidem.list_anomalies()) AS anomalies,
	   (SELECT count(*) FROM payidem.list_differences()) AS differences;
DROP EXTENSION payidem CASCADE;
CREATE EXTENSION payidem;
SELECT merchant_no AS mx FROM payidem.create_merchant('Again 2', 'retail', 0.006) \gset
SELECT payidem.create_order(:'mx', 'AGAIN-1', 100, 'again') IS NOT NULL AS round_2;
SELECT (SELECT count(*) FROM payidem.list_orders(:'mx')) AS orders, (SELECT count(*) FROM payidem.list_anomalies()) AS anomalies,
	   (SELECT count(*) FROM payidem.list_differences()) AS differences;
DROP EXTENSION payidem CASCADE;
CREATE EXTENSION payidem;
SELECT merchant_no AS mx FROM payidem.create_merchant('Again 3', 'retail', 0.006) \gset
SELECT payidem.create_order(:'mx', 'AGAIN-1', 100, 'again') IS NOT NULL AS round_3;
SELECT (SELECT count(*) FROM payidem.list_orders(:'mx')) AS orders, (SELECT count(*) FROM payidem.list_anomalies()) AS anomalies,
	   (SELECT count(*) FROM payidem.list_differences()) AS differences;
-- create_order's checks of its arguments against their domains (one per
-- domain, kept for the session) were made again for each extension: the old
-- ones went, none is left behind
SELECT count(*) BETWEEN 1 AND 4 AS domain_checks_kept
  FROM pg_backend_memory_contexts WHERE name = 'payidem domain checks';
