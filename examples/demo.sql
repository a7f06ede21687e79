-- payidem — the guided tour.  `make demo` runs this on a throwaway cluster.
\pset footer off
\set VERBOSITY default

\echo
\echo '== 1. Install ================================================================'
\echo 'payidem lives in its own schema and must be preloaded (shared memory for order numbers).'
CREATE EXTENSION payidem;
SELECT extname, extversion, payidem.library_version() AS library_version FROM pg_extension WHERE extname = 'payidem';
SHOW shared_preload_libraries;

\echo
\echo '== 2. Order numbers that never collide ========================================'
\echo 'prefix + UTC second + shard + per-second sequence + ISO 7064 check digits, from shared memory:'
SELECT payidem.gen_order_no() AS order_no, payidem.gen_order_no('PY') AS payment_no,
       payidem.gen_order_no('RF') AS refund_no;
SELECT * FROM payidem.order_no_parse(payidem.gen_order_no());
\echo 'A million in one statement: all distinct, strictly increasing.'
SELECT count(DISTINCT n) AS distinct_numbers FROM
  (SELECT payidem.gen_order_no() AS n FROM generate_series(1, 1000000)) AS s;
\echo 'A mistyped number is caught by the check digits:'
SELECT payidem.gen_order_no() AS good \gset
SELECT :'good' AS number, payidem.order_no_valid(:'good') AS valid
UNION ALL
SELECT overlay(:'good' PLACING '9' FROM 20 FOR 1), payidem.order_no_valid(overlay(:'good' PLACING '9' FROM 20 FOR 1));
SELECT name, value FROM payidem.stats() WHERE name IN ('order_nos_issued', 'clock_rollbacks', 'seconds_borrowed');

\echo
\echo '== 3. Merchants, channels and secrets ========================================='
\echo 'A merchant gets a random, unguessable number and API key; the secret is shown once'
\echo 'and stored only AES-256-GCM encrypted under the master key file (payidem.master_key_file).'
SELECT merchant_no, api_key, api_secret FROM payidem.create_merchant('Corner Coffee', 'catering', 0.006) \gset
SELECT :'merchant_no' AS merchant_no, :'api_key' AS api_key, left(:'api_secret', 8) || '...' AS api_secret_shown_once;
SELECT secret_version, length(ciphertext) AS ciphertext_bytes, encode(nonce, 'hex') AS random_nonce
  FROM payidem.merchant_secret WHERE merchant_no = :'merchant_no';
\echo 'Requests are signed with HMAC-SHA256; the database checks them in constant time:'
SELECT payidem.sign(:'merchant_no', 'amount=1250&out_trade_no=T-1') AS signature \gset
SELECT payidem.verify_signature(:'api_key', 'amount=1250&out_trade_no=T-1', :'signature') AS genuine,
       payidem.verify_signature(:'api_key', 'amount=9250&out_trade_no=T-1', :'signature') AS tampered;
\echo 'Two WeChat channels with weights 1:3 and one Alipay channel; keys stored encrypted:'
SELECT payidem.create_channel('WXPAY_001', 'wechat', 0.0025, 100),
       payidem.create_channel('WXPAY_002', 'wechat', 0.0020, 300),
       payidem.create_channel('ALIPAY_001', 'alipay', 0.0060);
-- (a demo key written into the statement; real keys are loaded from a file the
-- server reads, so that no log can hold them: payidem.load_channel_config(),
-- docs/security.md)
SELECT payidem.set_channel_config('WXPAY_001', '{"mch_id": "1900000109", "api_v3_key": "demo-key"}');
SELECT payidem.bind_channel(:'merchant_no', 'WXPAY_001'), payidem.bind_channel(:'merchant_no', 'WXPAY_002'),
       payidem.bind_channel(:'merchant_no', 'ALIPAY_001');
SELECT payidem.route_channel(:'merchant_no', 'wechat') AS routed_to, count(*) AS of_1000
  FROM generate_series(1, 1000) GROUP BY 1 ORDER BY 1;
\echo 'Rotation: the previous secret keeps working for the grace period, then stops.'
SELECT left(payidem.rotate_merchant_secret(:'merchant_no', '1 hour'), 8) || '...' AS new_secret;
SELECT payidem.verify_signature(:'api_key', 'amount=1250&out_trade_no=T-1', :'signature') AS old_secret_in_grace;

\echo
\echo '== 4. The platform''s tables ==================================================='
SELECT c.relname AS "table", obj_description(c.oid, 'pg_class') AS "what it holds"
  FROM pg_class c
 WHERE c.relnamespace = 'payidem'::regnamespace AND c.relkind = 'r'
 ORDER BY 1;

\echo
\echo '== 5. State machines are data ================================================='
\echo 'The whitelist of status changes: a DBA extends it by inserting rows.'
SELECT entity, from_status || ' -> ' || to_status AS allowed
  FROM payidem.transition ORDER BY entity, from_status, to_status;
SELECT entity, string_agg(status, ', ' ORDER BY status) AS terminal_statuses
  FROM payidem.state WHERE terminal GROUP BY entity ORDER BY entity;

\echo
\echo '== 6. The database refuses bad money data, whoever writes it ================='

SELECT payidem.gen_order_no('PO') AS order_no, payidem.gen_order_no('PY') AS payment_no,
       payidem.gen_order_no('PY') AS payment_no2 \gset
\unset ON_ERROR_STOP
\echo '-- an amount is a whole number of fen/cents, never a decimal:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', :'merchant_no', 'T-1', 'latte', '12.50', now() + interval '2 hours');
\echo '-- and never negative:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', :'merchant_no', 'T-1', 'latte', -1250, now() + interval '2 hours');
\echo '-- a status must exist in the whitelist:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at)
VALUES (:'order_no', :'merchant_no', 'T-1', 'latte', 1250, 'payed', now() + interval '2 hours');
\echo '-- a rate is a fraction below 1:'
UPDATE payidem.merchant SET fee_rate = 1 WHERE merchant_no = :'merchant_no';
\echo '-- channel codes are upper case:'
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('alipay_001', 'alipay', 0.006);
\echo '-- a number must carry its check digits (the column''s domain checks it, whoever writes):'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (left(:'order_no', 24) || '00', :'merchant_no', 'T-1', 'latte', 1250, now() + interval '2 hours');
\set ON_ERROR_STOP 1

\echo '-- a correct order is accepted:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', :'merchant_no', 'T-1', 'latte', 1250, now() + interval '2 hours');
\echo '-- one order, at most one pending payment attempt at a time:'
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
VALUES (:'payment_no', :'order_no', :'merchant_no', 'WXPAY_001', 1250);
\unset ON_ERROR_STOP
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
VALUES (:'payment_no2', :'order_no', :'merchant_no', 'WXPAY_001', 1250);
\set ON_ERROR_STOP 1
SELECT order_no, amount, currency, status FROM payidem."order";
SELECT payment_no, order_no, channel_no, amount, status FROM payidem.payment;

\echo
\echo '== 7. The payment flow: one order, two attempts, duplicate callbacks ========'
\echo 'A double click sends the same out_trade_no twice: one order.'
SELECT payidem.create_order(:'merchant_no', 'SHOP-1001', 2599, 'Two lattes', 'https://shop.example/notify') AS order_no \gset
SELECT payidem.create_order(:'merchant_no', 'SHOP-1001', 2599, 'Two lattes', 'https://shop.example/notify') = :'order_no' AS same_order;
\unset ON_ERROR_STOP
\echo '-- the same out_trade_no with another amount is refused (PI001):'
SELECT payidem.create_order(:'merchant_no', 'SHOP-1001', 9999, 'Two lattes');
\set ON_ERROR_STOP 1
\echo 'The customer tries WeChat Pay; the attempt fails.'
SELECT payidem.begin_payment(:'order_no', 'WXPAY_001') AS wx_payment \gset
\unset ON_ERROR_STOP
\echo '-- while it is pending, no second attempt on another channel (PI003):'
SELECT payidem.begin_payment(:'order_no', 'ALIPAY_001');
\set ON_ERROR_STOP 1
SELECT payidem.apply_payment_result(:'wx_payment', 'callback', 'failed') AS wechat_result;
\echo 'Then Alipay; its success callback arrives three times, and our own query too:'
SELECT payidem.begin_payment(:'order_no', 'ALIPAY_001') AS ali_payment \gset
SELECT payidem.apply_payment_result(:'ali_payment', 'callback', 'succeeded', 'ALI-20261129-0001', 2599) AS first_callback;
SELECT payidem.apply_payment_result(:'ali_payment', 'callback', 'succeeded', 'ALI-20261129-0001', 2599) AS second_callback;
SELECT payidem.apply_payment_result(:'ali_payment', 'query', 'succeeded', 'ALI-20261129-0001', 2599) AS query_result;
SELECT payment_no = :'ali_payment' AS alipay, channel_no, status, fee_amount, cost_amount
  FROM payidem.payment WHERE order_no = :'order_no' ORDER BY created_at;
SELECT status, paid_payment_no = :'ali_payment' AS paid_by_alipay FROM payidem."order" WHERE order_no = :'order_no';
\echo 'The payment row itself records the decision: the repeats were answered duplicate, and one'
\echo 'order.paid event for the merchant was written in the same transaction as the first success:'
SELECT event, status FROM payidem.notify_event WHERE order_no = :'order_no';
\echo 'The status log holds every change, and nobody can rewrite it:'
SELECT entity, from_status, to_status FROM payidem.status_log
 WHERE entity_no IN (:'order_no', :'wx_payment', :'ali_payment') ORDER BY log_id;
\unset ON_ERROR_STOP
UPDATE payidem.status_log SET to_status = 'refunded' WHERE entity_no = :'order_no';
\echo '-- and no UPDATE can move money state outside the whitelist (PI002):'
UPDATE payidem."order" SET status = 'pending' WHERE order_no = :'order_no';
\set ON_ERROR_STOP 1

\echo
\echo '== 8. Money where it should not be: closed order, late success ==============='
SELECT payidem.create_order(:'merchant_no', 'SHOP-1002', 1200, 'Croissant') AS late_order \gset
SELECT payidem.begin_payment(:'late_order', 'WXPAY_001') AS late_payment \gset
SELECT payidem.close_order(:'late_order') AS order_closed;
\echo 'apply_payment_result_ex() is the same call; it also names the anomaly, for a person to resolve:'
SELECT * FROM payidem.apply_payment_result_ex(:'late_payment', 'callback', 'succeeded', 'WX-LATE-1', 1200);
SELECT kind, amount, handle_status FROM payidem.anomaly WHERE order_no = :'late_order';

\echo
\echo '== 9. Refunds never exceed what was paid ===================================='
SELECT payidem.refund(:'ali_payment', 1000, 'R-1', 'one latte was cold') AS refund_no \gset
SELECT payidem.apply_refund_result(:'refund_no', 'succeeded', 'ALI-R-1') AS refund_result;
\unset ON_ERROR_STOP
\echo '-- 1000 refunded of 2599; asking for 2000 more is refused (PI006):'
SELECT payidem.refund(:'ali_payment', 2000, 'R-2');
\set ON_ERROR_STOP 1
SELECT status, refunded_amount FROM payidem."order" WHERE order_no = :'order_no';

\echo
\echo '== 10. Signed notifications to the merchant ================================='
\echo 'One event per change (paid, each refund, closed), its payload the state at that event.'
\echo 'A worker POSTs payload as it is, with the signature as a header; the merchant checks'
\echo 'its v2, HMAC-SHA256(secret, "payidem-notification-v2" NUL "<t>.<payload>"), and that t'
\echo 'is recent (see docs/notifications.md).'
SELECT order_no = :'order_no' AS our_order, event, payload::jsonb ->> 'status' AS status,
       payload::jsonb ->> 'refunded_amount' AS refunded, attempt,
       regexp_replace(signature, 'v1=(.{8}).*v2=(.{8}).*', 'v1=\1...,v2=\2...') AS signature,
       payidem.verify_notification(:'api_key', payload, signature) AS merchant_can_verify
  FROM payidem.notify_due(10) ORDER BY event_id;
SELECT payidem.notify_result(event_id, true) FROM payidem.notify_event WHERE order_no = :'order_no';
SELECT * FROM payidem.notification_backlog;

\echo
\echo '== 11. Reconciliation: only the differences are stored ======================='
\echo 'The channel''s bill has our payment (not yet its partial refund: a status mismatch)'
\echo 'and a transaction we have no record of (channel_only: it also raises an anomaly).'
SELECT (paid_at AT TIME ZONE 'UTC')::date AS bill_day FROM payidem.payment WHERE payment_no = :'ali_payment' \gset
SELECT payidem.load_bill('ALIPAY_001', :'bill_day',
  'channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at' || E'\n' ||
  format('ALIPAY_001,%s,ALI-20261129-0001,%s,2599,16,succeeded,%s', :'bill_day', :'ali_payment', now()) || E'\n' ||
  format('ALIPAY_001,%s,ALI-UNKNOWN-9,,500,3,succeeded,%s', :'bill_day', now())) AS bill_lines;
\echo 'The bill''s fee for our payment, 16, is the cost we expect the channel to charge: no fee_mismatch.'
SELECT matched, platform_only, channel_only, amount_mismatch, status_mismatch, fee_mismatch
  FROM payidem.reconcile('ALIPAY_001', :'bill_day');
SELECT diff_type, transaction_id, channel_amount, handle_status FROM payidem.reconciliation
 WHERE channel_no = 'ALIPAY_001' ORDER BY recon_id;

\echo
\echo '== 12. Settlement: reconciled payments become the merchant''s balance ========='
\echo 'Nothing is settled yet: pending is what the payments brought in less their fees, less'
\echo 'the refund (net of the fee share it returns).'
SELECT * FROM payidem.balance(:'merchant_no');
\echo 'The merchant is on T1: a day''s items are due the next business day. settle(d) settles'
\echo 'every item due by d (the worker runs settle(today) once a day); settling a week ahead'
\echo 'shows them now. The refund is settled (refunds are never held), so the balance is'
\echo 'negative for now; the Alipay payment is held by its open status_mismatch, the late'
\echo 'WeChat payment by its open anomaly and its unreconciled day.'
SELECT * FROM payidem.settle(:'bill_day'::date + 7);
\echo 'A person checks the status mismatch (the bill was cut before the refund) and closes it;'
\echo 'the next run settles the payment; a run after it settles nothing twice (items 0; the'
\echo 'late payment is still held).'
SELECT recon_id FROM payidem.reconciliation
 WHERE payment_no = :'ali_payment' AND handle_status = 'open' \gset
SELECT payidem.resolve_diff(:recon_id, 'handled', 'the bill was cut before the partial refund');
SELECT * FROM payidem.settle(:'bill_day'::date + 7);
SELECT * FROM payidem.settle(:'bill_day'::date + 7);
SELECT * FROM payidem.balance(:'merchant_no');
\echo 'A payout within the available balance (a repeat is the same payout); the bank''s answer'
\echo 'moves it out, and the merchant is told at its own URL (payout.succeeded).'
SELECT payidem.set_merchant_notify_url(:'merchant_no', 'https://shop.example/payouts');
SELECT payidem.request_payout(:'merchant_no', 1000, 'PAYOUT-0001') AS payout_no \gset
SELECT payidem.request_payout(:'merchant_no', 1000, 'PAYOUT-0001') = :'payout_no' AS same_payout;
\unset ON_ERROR_STOP
\echo '-- more than is available is refused (PI010):'
SELECT payidem.request_payout(:'merchant_no', 5000, 'PAYOUT-0002');
\set ON_ERROR_STOP 1
SELECT payidem.apply_payout_result(:'payout_no', 'succeeded', 'BANK-0001') AS bank_answer;
SELECT payidem.apply_payout_result(:'payout_no', 'succeeded', 'BANK-0001') AS repeated_answer;
SELECT * FROM payidem.balance(:'merchant_no');
SELECT event, payload::jsonb ->> 'amount' AS amount, payload::jsonb ->> 'status' AS status
  FROM payidem.notify_event WHERE payout_no = :'payout_no';
\echo 'The journal: double entry, each journal sums to zero (checked at commit, for every writer).'
SELECT journal_no, account, coalesce(merchant_no, channel_no, '(platform)') AS owner, amount
  FROM payidem.ledger_entry ORDER BY entry_id;
\echo 'verify() re-derives the books from the tables: no rows, nothing wrong.'
SELECT * FROM payidem.verify();

\echo
\echo '== 13. What an application reads without table privileges ==================='
\echo 'A merchant''s orders, newest first, a page at a time (the next page: after the last order_no):'
SELECT x ->> 'out_trade_no' AS out_trade_no, x ->> 'status' AS status, (x ->> 'amount')::bigint AS amount
  FROM payidem.list_orders(:'merchant_no', max_rows => 2) x;
\echo 'The work queue of anomalies a support team follows up, with the id resolve_anomaly() takes:'
SELECT (x ->> 'anomaly_id')::bigint AS anomaly_id, x ->> 'kind' AS kind, (x ->> 'amount')::bigint AS amount, x ->> 'action' AS action
  FROM payidem.list_anomalies() x;
\echo 'And one call for a health check (here: housekeeping is off on the demo''s cluster):'
SELECT h ->> 'status' AS status, h -> 'problems' AS problems, h ->> 'library_version' AS library
  FROM payidem.health() h;

SELECT name, value FROM payidem.stats() WHERE value > 0 ORDER BY name;
