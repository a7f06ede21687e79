--
-- books: no caller can make the books wrong (DESIGN §4, §5, §7).
--   1. the application's idempotency keys never meet payidem's decisions;
--   2. a status and its bookkeeping never disagree, whoever writes;
--   3. a late success (after failed or closed) is recorded and refundable;
--   4. money records are kept: DELETE and TRUNCATE refused.
-- Generated numbers are never printed, only their properties.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := regexp_replace(err_message, '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	err_detail := regexp_replace(regexp_replace(err_detail, '(PO|PY|RF)[0-9]{24}', '\1***', 'g'),
								 '[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.+-]+', '<time>', 'g');
	RETURN NEXT;
END
$$;

SELECT merchant_no AS m FROM payidem.create_merchant('Books Shop', 'retail', 0.006) \gset
SELECT payidem.create_channel('BK_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(:'m', 'BK_WX');
CREATE ROLE books_app;
SELECT payidem.grant_app('books_app');

--------------------------------------------------------------- 1. namespaces
-- an application claims and records keys of the shapes payidem once used
-- for its own decisions; the channel's results are decided as if they were
-- not there
SELECT payidem.create_order(:'m', 'B-0001', 1000, 'Keys') AS o1 \gset
SELECT payidem.begin_payment(:'o1', 'BK_WX') AS p1 \gset
SET ROLE books_app;
SELECT outcome FROM payidem.idem_claim('payment:' || :'p1' || ':succeeded', 'payment_result', :'o1', 'BK_WX', 1000);
SELECT outcome FROM payidem.idem_record('payment:' || :'p1' || ':failed', 'payment_result', :'o1', 'BK_WX', 1000,
                                        '{"outcome": "applied"}');
SELECT outcome FROM payidem.idem_claim('payment:' || :'p1' || ':closed', 'other', :'o1', 'BK_WX', 1, lease => '1 hour');
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'BK-T-1', 1000) AS success_applied;
SELECT payidem.refund(:'p1', 400, 'BR-1') AS r1 \gset
SELECT outcome FROM payidem.idem_record('refund:' || :'r1' || ':succeeded', 'refund_result', :'o1', 'BK_WX', 400,
                                        '{"outcome": "applied"}');
SELECT outcome FROM payidem.idem_claim('refund:' || :'r1' || ':failed', 'x', NULL, NULL, 1, lease => '1 hour');
SELECT payidem.apply_refund_result(:'r1', 'succeeded', 'BK-R-1') AS refund_applied;
RESET ROLE;
SELECT p.status, p.refunded_amount, o.status AS order_status, o.refunded_amount AS order_refunded,
       r.status AS refund_status
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) JOIN payidem.refund r USING (payment_no)
 WHERE p.payment_no = :'p1';
-- the application's keys are its own, untouched
SELECT idem_key ~ '^(payment|refund):' AS app_shape, biz_type, status
  FROM payidem.idempotency WHERE idem_key IN ('payment:' || :'p1' || ':succeeded', 'payment:' || :'p1' || ':failed',
        'payment:' || :'p1' || ':closed', 'refund:' || :'r1' || ':succeeded', 'refund:' || :'r1' || ':failed')
 ORDER BY biz_type, status;

------------------------------------------------- 2. status and bookkeeping agree
SELECT payidem.create_order(:'m', 'B-0002', 2000, 'Bookkeeping') AS o2 \gset
SELECT payidem.begin_payment(:'o2', 'BK_WX') AS p2 \gset
SET ROLE books_app;
-- an order paid without its payment, a success without its transaction id
-- and fees: refused at once
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_order(%L, %L)', :'o2', 'paid'));
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_payment(%L, %L)', :'p2', 'succeeded'));
RESET ROLE;
SELECT p.status, o.status AS order_status FROM payidem.payment p JOIN payidem."order" o USING (order_no)
 WHERE p.payment_no = :'p2';
-- the real callback is applied, not a duplicate
SELECT payidem.apply_payment_result(:'p2', 'callback', 'succeeded', 'BK-T-2', 2000) AS real_callback;
SELECT status, transaction_id, fee_amount, cost_amount FROM payidem.payment WHERE payment_no = :'p2';
-- a refund marked succeeded without moving the payment: refused at commit;
-- a payment marked refunded without a refund: refused at once
SELECT payidem.refund(:'p2', 500, 'BR-2') AS r2 \gset
SET ROLE books_app;
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_payment(%L, %L)', :'p2', 'partially_refunded'));
RESET ROLE;
-- (the commit-time check, fired early and caught: nothing stays)
CREATE FUNCTION pg_temp.commit_of(stmt text) RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	SET CONSTRAINTS payidem.status_ledger_at_commit IMMEDIATE;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := regexp_replace(err_message, '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	err_detail := regexp_replace(err_detail, '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	RETURN NEXT;
END
$$;
SET ROLE books_app;
SELECT * FROM pg_temp.commit_of(format('SELECT payidem.transit_refund(%L, %L)', :'r2', 'succeeded'));
-- and at a real COMMIT
BEGIN;
SELECT payidem.transit_refund(:'r2', 'succeeded') AS moved_until_commit;
\set VERBOSITY sqlstate
COMMIT;
\set VERBOSITY default
RESET ROLE;
SELECT status FROM payidem.refund WHERE refund_no = :'r2';
-- a DBA's own UPDATE is held to the same rules
SELECT * FROM pg_temp.commit_of(format('UPDATE payidem.payment SET refunded_amount = 500, status = %L WHERE payment_no = %L',
                                       'partially_refunded', :'p2'));
SELECT * FROM pg_temp.commit_of(format('UPDATE payidem."order" SET paid_payment_no = %L WHERE order_no = %L',
                                       :'p1', :'o2'));
SELECT * FROM pg_temp.try(format('UPDATE payidem."order" SET refunded_amount = 2000 WHERE order_no = %L', :'o2'));
SELECT * FROM pg_temp.try(format('UPDATE payidem.payment SET fee_amount = NULL WHERE payment_no = %L', :'p2'));
-- also when the checks across rows are set to run at the end of the
-- statement before it runs: they see what the statement wrote
CREATE FUNCTION pg_temp.immediate(stmt text) RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
BEGIN
	SET CONSTRAINTS ALL IMMEDIATE;
	RETURN QUERY SELECT * FROM pg_temp.try(stmt);
END
$$;
SELECT * FROM pg_temp.immediate(format('UPDATE payidem.refund SET status = %L WHERE refund_no = %L', 'succeeded', :'r2'));
SELECT status FROM payidem.refund WHERE refund_no = :'r2';
-- an order stays with its merchant (its events name it)
SELECT merchant_no AS m_other FROM payidem.create_merchant('Books Other', 'retail', 0.006) \gset
SELECT payidem.create_order(:'m', 'B-0009', 900, 'Stays here') AS o9 \gset
SELECT err_code, err_message, regexp_replace(err_detail, 'M[0-9A-Z]{15}', 'M***', 'g') AS err_detail, err_hint
  FROM pg_temp.try(format('UPDATE payidem."order" SET merchant_no = %L WHERE order_no = %L', :'m_other', :'o9'));
SELECT merchant_no = :'m' AS kept_its_merchant FROM payidem."order" WHERE order_no = :'o9';
-- the flow function does it all together; each row then agrees, also when
-- the checks across rows run at the end of each statement
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT payidem.apply_refund_result(:'r2', 'succeeded') AS refund_applied;
COMMIT;
SELECT p.status, p.refunded_amount, o.status AS order_status, o.refunded_amount AS order_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p2';
-- a DBA's own flow works as before: paid -> shipping
SELECT payidem.create_order(:'m', 'B-0003', 3000, 'Shipping') AS o3 \gset
SELECT payidem.apply_payment_result(payidem.begin_payment(:'o3', 'BK_WX'), 'callback', 'succeeded', 'BK-T-3', 3000) AS paid;
INSERT INTO payidem.state (entity, status) VALUES ('order', 'shipping') ON CONFLICT DO NOTHING;
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'shipping') ON CONFLICT DO NOTHING;
SET ROLE books_app;
SELECT payidem.transit_order(:'o3', 'shipping') AS shipped;
RESET ROLE;
SELECT status FROM payidem."order" WHERE order_no = :'o3';
-- a DBA's flow strands no refund: refund() takes the payment of a shipping
-- order, and the success the channel reports is recorded.  The refunded
-- amounts move and the refund.succeeded event is written; the order stays
-- shipping while the whitelist has no shipping -> partially_refunded, and
-- moves to refunded once shipping -> refunded is added.
SELECT payidem.create_order(:'m', 'B-0010', 3000, 'Shipping, refunded', 'https://shop.example/notify') AS o10 \gset
SELECT payidem.begin_payment(:'o10', 'BK_WX') AS p10 \gset
SELECT payidem.apply_payment_result(:'p10', 'callback', 'succeeded', 'BK-T-10', 3000) AS paid;
SELECT payidem.transit_order(:'o10', 'shipping') AS shipped;
SET ROLE books_app;
SELECT payidem.refund(:'p10', 1000, 'BR-10A') AS r10a \gset
SELECT payidem.apply_refund_result(:'r10a', 'succeeded', 'BK-R-10A') AS refund_applied;
SELECT payidem.apply_refund_result(:'r10a', 'succeeded', 'BK-R-10A') AS refund_again;
RESET ROLE;
SELECT p.status, p.refunded_amount, o.status AS order_status, o.refunded_amount AS order_refunded,
       o.paid_payment_no = :'p10' AS still_paid_by_it
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p10';
SELECT event, e.payload::jsonb ->> 'status' AS order_status, e.payload::jsonb ->> 'refund_amount' AS refund_amount,
       e.payload::jsonb ->> 'refunded_amount' AS refunded_amount
  FROM payidem.notify_event e WHERE e.order_no = :'o10' ORDER BY e.event_id;
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'shipping', 'refunded');
SELECT payidem.apply_refund_result(payidem.refund(:'p10', 2000, 'BR-10B'), 'succeeded') AS rest_refunded;
SELECT p.status, p.refunded_amount, o.status AS order_status, o.refunded_amount AS order_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p10';
SELECT status, count(*) AS refunds, sum(amount) AS amount FROM payidem.refund WHERE order_no = :'o10' GROUP BY status;
SELECT l.entity, l.from_status, l.to_status FROM payidem.status_log l
 WHERE l.entity_no IN (:'o10', :'p10') AND l.from_status IS NOT NULL ORDER BY l.log_id;
SELECT event, e.payload::jsonb ->> 'status' AS order_status, e.payload::jsonb ->> 'refunded_amount' AS refunded_amount
  FROM payidem.notify_event e WHERE e.order_no = :'o10' ORDER BY e.event_id;
-- (delivered: they are not due later)
SELECT count(*) AS delivered
  FROM (SELECT payidem.notify_result(d.event_id, true) FROM payidem.notify_due(100) d WHERE d.order_no = :'o10') x;
-- the books still hold such an order: its refunded amount is its paying
-- payment's (refused at commit), and an order that names no payment has none
SELECT payidem.create_order(:'m', 'B-0011', 1100, 'Shipping, not refunded') AS o11 \gset
SELECT payidem.apply_payment_result(payidem.begin_payment(:'o11', 'BK_WX'), 'callback', 'succeeded', 'BK-T-11', 1100) AS paid;
SELECT payidem.transit_order(:'o11', 'shipping') AS shipped;
SELECT * FROM pg_temp.commit_of(format('UPDATE payidem."order" SET refunded_amount = 100 WHERE order_no = %L', :'o11'));
SELECT * FROM pg_temp.try(format('UPDATE payidem."order" SET refunded_amount = 100 WHERE order_no = %L', :'o9'));
SELECT status, refunded_amount FROM payidem."order" WHERE order_no IN (:'o9', :'o11') ORDER BY order_no;
-- a DBA's payment status that leaves the succeeded ones, for the payment that
-- paid its order: the order would be paid without a succeeded payment
SELECT payidem.create_order(:'m', 'B-0007', 7000, 'Disputed') AS o7 \gset
SELECT payidem.begin_payment(:'o7', 'BK_WX') AS p7 \gset
SELECT payidem.apply_payment_result(:'p7', 'callback', 'succeeded', 'BK-T-7', 7000) AS paid;
INSERT INTO payidem.state (entity, status) VALUES ('payment', 'disputed');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('payment', 'succeeded', 'disputed');
SELECT * FROM pg_temp.commit_of(format('SELECT payidem.transit_payment(%L, %L)', :'p7', 'disputed'));
DELETE FROM payidem.transition WHERE NOT builtin;
DELETE FROM payidem.state WHERE NOT builtin AND entity = 'payment';
SELECT status FROM payidem.payment WHERE payment_no = :'p7';

----------------------------------------- 3. late successes, and their refunds
-- failed -> succeeded pays a pending order
SELECT payidem.create_order(:'m', 'B-0004', 4000, 'Late') AS o4 \gset
SELECT payidem.begin_payment(:'o4', 'BK_WX') AS p4 \gset
SELECT payidem.apply_payment_result(:'p4', 'callback', 'failed') AS failed;
SELECT payidem.apply_payment_result(:'p4', 'query', 'succeeded', 'BK-T-4', 4000) AS late_success;
SELECT p.status, o.status AS order_status, o.paid_payment_no = :'p4' AS paid_by_it
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p4';
-- (a DBA who moves the paying payment to another order leaves this one paid
-- without its payment: refused)
SELECT * FROM pg_temp.commit_of(format('UPDATE payidem.payment SET order_no = %L WHERE payment_no = %L',
                                       :'o1', :'p4'));
-- closed order, then money: anomaly; the payment is refundable in full
SELECT payidem.create_order(:'m', 'B-0005', 5000, 'After close') AS o5 \gset
SELECT payidem.begin_payment(:'o5', 'BK_WX') AS p5 \gset
SELECT payidem.close_order(:'o5') AS closed;
SELECT payidem.apply_payment_result(:'p5', 'callback', 'succeeded', 'BK-T-5', 5000) AS late_success;
SELECT kind FROM payidem.anomaly WHERE payment_no = :'p5';
SELECT payidem.apply_refund_result(payidem.refund(:'p5', 5000, 'BR-5'), 'succeeded') AS refunded;
SELECT p.status, p.refunded_amount, o.status AS order_status, o.refunded_amount AS order_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p5';
-- the payment that paid an order stays its paying payment: a DBA who points
-- a paid order at its other success (recorded as a duplicate_payment anomaly)
-- would leave the real paying payment a success with no anomaly; refused at
-- once, also on an order in a status of a DBA's own flow, and for NULL
SELECT payidem.create_order(:'m', 'B-0012', 1200, 'Paid twice') AS o12 \gset
SELECT payidem.begin_payment(:'o12', 'BK_WX') AS p12a \gset
SELECT payidem.close_payment(:'p12a') AS closed_a;
SELECT payidem.begin_payment(:'o12', 'BK_WX') AS p12b \gset
SELECT payidem.apply_payment_result(:'p12b', 'callback', 'succeeded', 'BK-T-12B', 1200) AS b_paid;
SELECT payidem.apply_payment_result(:'p12a', 'query', 'succeeded', 'BK-T-12A', 1200) AS a_late;
SELECT kind, payment_no = :'p12a' AS is_a FROM payidem.anomaly WHERE order_no = :'o12';
SELECT * FROM pg_temp.commit_of(format('UPDATE payidem."order" SET paid_payment_no = %L WHERE order_no = %L',
                                       :'p12a', :'o12'));
SELECT err_code, err_message FROM pg_temp.commit_of(format('UPDATE payidem."order" SET paid_payment_no = NULL WHERE order_no = %L',
                                                           :'o11'));
SELECT err_code, err_message FROM pg_temp.commit_of(format('UPDATE payidem."order" SET paid_payment_no = %L WHERE order_no = %L',
                                                           :'p12a', :'o11'));
SELECT order_no = :'o12' AS is_o12, status, paid_payment_no = CASE WHEN order_no = :'o12' THEN :'p12b' END AS paid_by_b
  FROM payidem."order" WHERE order_no IN (:'o11', :'o12') ORDER BY order_no = :'o12';
-- every anomaly that recorded money has a payment refund() takes
SELECT a.kind, p.status IN ('succeeded', 'partially_refunded', 'refunded') AS refundable
  FROM payidem.anomaly a JOIN payidem.payment p USING (payment_no)
 WHERE a.kind IN ('paid_after_close', 'duplicate_payment') AND p.merchant_no = :'m' ORDER BY a.anomaly_id;

-- a repeat of a success is held to the paid_at rule too
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 4000, now() + interval ''1 year'')',
                                 :'p4', 'callback', 'succeeded', 'BK-T-4'));

-- A first success (payidem's fast path) writes its own bookkeeping and is not
-- checked at commit again; but a DBA's BEFORE UPDATE trigger may write
-- something else than it did, and then it is checked as any writer is: at
-- once (a success without its fees) and at commit (an order paid by
-- another order's payment); nothing stays
SELECT payidem.create_order(:'m', 'B-0013', 1300, 'Rewritten') AS o13 \gset
SELECT payidem.begin_payment(:'o13', 'BK_WX') AS p13 \gset
CREATE FUNCTION public.books_no_cost() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.cost_amount := NULL; RETURN NEW; END $$;
CREATE TRIGGER books_no_cost BEFORE UPDATE ON payidem.payment
	FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION public.books_no_cost();
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1300)',
                                 :'p13', 'callback', 'succeeded', 'BK-T-13'));
DROP TRIGGER books_no_cost ON payidem.payment;
CREATE FUNCTION public.books_other_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.paid_payment_no := (SELECT o.paid_payment_no FROM payidem."order" o
							 WHERE o.merchant_no = NEW.merchant_no AND o.out_trade_no = 'B-0004');
	RETURN NEW;
END $$;
CREATE TRIGGER books_other_payment BEFORE UPDATE ON payidem."order"
	FOR EACH ROW WHEN (NEW.status = 'paid') EXECUTE FUNCTION public.books_other_payment();
SELECT * FROM pg_temp.commit_of(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1300)',
                                       :'p13', 'callback', 'succeeded', 'BK-T-13'));
DROP TRIGGER books_other_payment ON payidem."order";
DROP FUNCTION public.books_no_cost(), public.books_other_payment();
SELECT p.status AS payment_status, o.status AS order_status
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p13';
SELECT payidem.apply_payment_result(:'p13', 'callback', 'succeeded', 'BK-T-13', 1300) AS then_applied;
-- an order a DBA's own flow took back to pending with its refunds is not
-- paid again by a first success: an order paid with refunds its paying
-- payment does not have (checked on the row itself, for every writer)
SELECT payidem.create_order(:'m', 'B-0014', 1000, 'Reopened') AS o14 \gset
SELECT payidem.apply_payment_result(payidem.begin_payment(:'o14', 'BK_WX'), 'callback', 'succeeded', 'BK-T-14', 1000)
    AS first_paid;
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 300, 'BR-14'), 'succeeded') AS refunded
  FROM payidem.payment p WHERE p.order_no = :'o14';
INSERT INTO payidem.transition VALUES ('order', 'partially_refunded', 'pending');
SELECT payidem.transit_order(:'o14', 'pending') AS reopened;
SELECT payidem.begin_payment(:'o14', 'BK_WX') AS p14b \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1000)',
                                 :'p14b', 'callback', 'succeeded', 'BK-T-14B'));
SELECT status, refunded_amount FROM payidem."order" WHERE order_no = :'o14';
SELECT payidem.close_payment(:'p14b') AS closed_b;
DELETE FROM payidem.transition WHERE entity = 'order' AND from_status = 'partially_refunded' AND to_status = 'pending';

----------------------------------------------- notifications of a closed merchant
-- a closed merchant's key signs nothing more: its notifications are given up,
-- and never stop another merchant's from going out
SELECT merchant_no AS mc FROM payidem.create_merchant('Closing Shop', 'retail', 0.006) \gset
SELECT payidem.bind_channel(:'mc', 'BK_WX');
SELECT payidem.create_order(:'mc', 'C-0001', 1000, 'Last sale', 'https://closing.example/n') AS oc \gset
SELECT payidem.create_order(:'m', 'B-0006', 1000, 'Notified', 'https://books.example/n') AS o6 \gset
SELECT payidem.apply_payment_result(payidem.begin_payment(:'oc', 'BK_WX'), 'callback', 'succeeded', 'BK-T-C1', 1000) AS paid_closing;
SELECT payidem.apply_payment_result(payidem.begin_payment(:'o6', 'BK_WX'), 'callback', 'succeeded', 'BK-T-6', 1000) AS paid_open;
SELECT payidem.close_merchant(:'mc');
SET ROLE books_app;
SELECT order_no = :'o6' AS is_the_open_merchants, signature IS NOT NULL AS signed
  FROM payidem.notify_due(100) WHERE merchant_no IN (:'m', :'mc');
RESET ROLE;
SELECT order_no = :'oc' AS is_closed_merchants, event, status, last_response FROM payidem.notify_event
 WHERE order_no IN (:'oc', :'o6') ORDER BY order_no = :'oc' DESC;

---------------------------------------------------- anomalies, and who resolves them
-- open anomalies are listed oldest first; a person closes each
SELECT kind, amount, action IS NOT NULL AS says_what_to_do
  FROM payidem.open_anomalies WHERE payment_no IN (:'p5', :'p1') ORDER BY anomaly_id;
SELECT anomaly_id AS a5 FROM payidem.anomaly WHERE payment_no = :'p5' AND kind = 'paid_after_close' \gset
SET ROLE books_app;
SELECT payidem.resolve_anomaly(:a5, 'handled', 'refunded with BR-5');
SELECT err_code, err_hint FROM pg_temp.try(format('SELECT payidem.resolve_anomaly(%s, %L)', :a5, 'ignored'));
SELECT * FROM pg_temp.try('SELECT payidem.resolve_anomaly(-1, ''handled'')');
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_anomaly(%s, %L)', :a5, 'done'));
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_anomaly(%s, %L, repeat(%L, 1025))', :a5, 'handled', 'x'));
SELECT * FROM pg_temp.try('SELECT payidem.resolve_anomaly(NULL, ''handled'')');
RESET ROLE;
SELECT handle_status, handled_by = session_user AS by_the_session, handled_at IS NOT NULL AS when_known, note
  FROM payidem.anomaly WHERE anomaly_id = :a5;
SELECT count(*) AS still_listed FROM payidem.open_anomalies WHERE anomaly_id = :a5;
-- a merchant-scoped role sees its merchant's open anomalies only
SELECT payidem.create_order(:'m', 'B-0008', 800, 'Late too') AS o8 \gset
SELECT payidem.begin_payment(:'o8', 'BK_WX') AS p8 \gset
SELECT payidem.close_order(:'o8') AS closed, payidem.apply_payment_result(:'p8', 'callback', 'succeeded', 'BK-T-8', 800) AS late;
SELECT merchant_no AS mx FROM payidem.create_merchant('Other Shop', 'retail', 0.006) \gset
SELECT payidem.bind_channel(:'mx', 'BK_WX');
SELECT payidem.create_order(:'mx', 'X-0001', 900, 'Late') AS ox \gset
SELECT payidem.begin_payment(:'ox', 'BK_WX') AS px \gset
SELECT payidem.close_order(:'ox') AS closed, payidem.apply_payment_result(:'px', 'callback', 'succeeded', 'BK-T-X', 900) AS late;
SELECT count(*) AS mx_open FROM payidem.open_anomalies a JOIN payidem."order" o USING (order_no)
 WHERE o.merchant_no = :'mx' \gset
SELECT count(*) > :mx_open AS others_have_open_ones FROM payidem.open_anomalies;
CREATE ROLE books_report;
SELECT payidem.map_merchant_role('books_report', :'mx');
GRANT EXECUTE ON FUNCTION payidem.get_order(text), payidem.find_order(text, text) TO books_report;
SET ROLE books_report;
SELECT count(*) = :mx_open AS sees_its_merchants_only, count(*) AS open_ones FROM payidem.open_anomalies;
-- and reads its merchant's orders only through the read API
SELECT payidem.get_order(:'ox') ->> 'out_trade_no' AS its_own_order;
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.get_order(%L)', :'o2'));
SELECT err_code FROM pg_temp.try(format('SELECT payidem.find_order(%L, %L)', :'m', 'B-0002'));
RESET ROLE;
-- (fail closed: a member of the mapped role, a SECURITY DEFINER wrapper the
-- mapped role owns, called by another role, and the role once unmapped read
-- no more than row-level security shows them)
CREATE ROLE books_report_member IN ROLE books_report;
SET ROLE books_report_member;
SELECT err_code FROM pg_temp.try(format('SELECT payidem.get_order(%L)', :'o2')) AS member_reading_another;
SELECT err_code FROM pg_temp.try(format('SELECT payidem.get_order(%L)', :'ox')) AS member_reading_its_roles;
RESET ROLE;
CREATE FUNCTION pg_temp.wrapped_get_order(o text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER
	AS $$ SELECT payidem.get_order(o) $$;
ALTER FUNCTION pg_temp.wrapped_get_order(text) OWNER TO books_report;
GRANT EXECUTE ON FUNCTION pg_temp.wrapped_get_order(text) TO books_app;
SET ROLE books_app;
SELECT err_code FROM pg_temp.try(format('SELECT pg_temp.wrapped_get_order(%L)', :'o2')) AS through_its_wrapper;
RESET ROLE;
DROP FUNCTION pg_temp.wrapped_get_order(text);
SELECT payidem.unmap_merchant_role('books_report', :'mx');
SET ROLE books_report;
SELECT err_code FROM pg_temp.try(format('SELECT payidem.get_order(%L)', :'ox')) AS once_unmapped;
RESET ROLE;
DROP ROLE books_report_member;
REVOKE ALL ON ALL TABLES IN SCHEMA payidem FROM books_report;
REVOKE ALL ON SCHEMA payidem FROM books_report;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM books_report;
DROP ROLE books_report;

------------------------------------------------------------------ the read API
-- an application reads an order with its attempts and refunds, without any
-- table privilege; times in UTC ISO 8601
SET ROLE books_app;
SELECT payidem.get_order(:'o2') AS j \gset
SELECT :'j'::jsonb ->> 'status' AS status, (:'j'::jsonb ->> 'amount')::bigint AS amount,
       (:'j'::jsonb ->> 'refunded_amount')::bigint AS refunded,
       :'j'::jsonb ->> 'paid_payment_no' = :'p2' AS paid_by_p2,
       :'j'::jsonb ->> 'paid_at' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$' AS paid_at_utc_iso,
       jsonb_array_length(:'j'::jsonb -> 'payments') AS payments,
       :'j'::jsonb -> 'payments' -> 0 ->> 'status' AS payment_status,
       :'j'::jsonb -> 'payments' -> 0 ->> 'transaction_id' AS txn,
       jsonb_array_length(:'j'::jsonb -> 'refunds') AS refunds,
       :'j'::jsonb -> 'refunds' -> 0 ->> 'status' AS refund_status;
SELECT string_agg(k, ', ' ORDER BY k) AS order_keys FROM jsonb_object_keys(:'j'::jsonb) k;
SELECT payidem.find_order(:'m', 'B-0002') = :'j'::jsonb AS find_order_says_the_same;
SELECT err_code, err_message FROM pg_temp.try('SELECT payidem.get_order(''PO202401010000000000000067'')');
SELECT err_code, err_message FROM pg_temp.try('SELECT payidem.get_order(''PO123'')');
SELECT err_code, err_detail FROM pg_temp.try(format('SELECT payidem.find_order(%L, %L)', :'m', 'NO-SUCH'));
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.find_order(%L, NULL)', :'m'));
RESET ROLE;

------------------------------------------------------- 4. money records are kept
SELECT (SELECT count(*) FROM payidem."order") AS orders, (SELECT count(*) FROM payidem.payment) AS payments,
       (SELECT count(*) FROM payidem.refund) AS refunds, (SELECT count(*) FROM payidem.anomaly) AS anomalies \gset before_
SELECT * FROM pg_temp.try(format('DELETE FROM payidem."order" WHERE order_no = %L', :'o5'));
SELECT * FROM pg_temp.try(format('DELETE FROM payidem.payment WHERE payment_no = %L', :'p5'));
SELECT * FROM pg_temp.try('DELETE FROM payidem.refund');
SELECT * FROM pg_temp.try('DELETE FROM payidem.anomaly');
SELECT * FROM pg_temp.try('TRUNCATE payidem."order" CASCADE');
SELECT * FROM pg_temp.try('TRUNCATE payidem.anomaly');
SELECT (SELECT count(*) FROM payidem."order") = :before_orders AS orders_kept,
       (SELECT count(*) FROM payidem.payment) = :before_payments AS payments_kept,
       (SELECT count(*) FROM payidem.refund) = :before_refunds AS refunds_kept,
       (SELECT count(*) FROM payidem.anomaly) = :before_anomalies AS anomalies_kept;

REVOKE ALL ON SCHEMA payidem FROM books_app;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM books_app;
DROP ROLE books_app;
