-- payidem — the guided tour.  `make demo` runs this on a throwaway cluster.
\pset footer off
\set VERBOSITY default

\echo
\echo '== 1. Install ================================================================'
\echo 'payidem lives in its own schema and must be preloaded (shared memory for order numbers).'
CREATE EXTENSION payidem;
SELECT extname, extversion FROM pg_extension WHERE extname = 'payidem';
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
\echo '== 3. The platform''s tables ==================================================='
SELECT c.relname AS "table", obj_description(c.oid, 'pg_class') AS "what it holds"
  FROM pg_class c
 WHERE c.relnamespace = 'payidem'::regnamespace AND c.relkind = 'r'
 ORDER BY 1;

\echo
\echo '== 4. State machines are data ================================================='
\echo 'The whitelist of status changes: a DBA extends it by inserting rows.'
SELECT entity, from_status || ' -> ' || to_status AS allowed
  FROM payidem.transition ORDER BY entity, from_status, to_status;
SELECT entity, string_agg(status, ', ' ORDER BY status) AS terminal_statuses
  FROM payidem.state WHERE terminal GROUP BY entity ORDER BY entity;

\echo
\echo '== 5. The database refuses bad money data, whoever writes it ================='
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0123456789ABCDE', 'Corner Coffee', 'catering', 0.006, 'ak_demo_0123456789');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate)
VALUES ('WXPAY_001', 'wechat', 0.0025);

SELECT payidem.gen_order_no('PO') AS order_no, payidem.gen_order_no('PY') AS payment_no,
       payidem.gen_order_no('PY') AS payment_no2 \gset
\unset ON_ERROR_STOP
\echo '-- an amount is a whole number of fen/cents, never a decimal:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', 'M0123456789ABCDE', 'T-1', 'latte', '12.50', now() + interval '2 hours');
\echo '-- and never negative:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', 'M0123456789ABCDE', 'T-1', 'latte', -1250, now() + interval '2 hours');
\echo '-- a status must exist in the whitelist:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at)
VALUES (:'order_no', 'M0123456789ABCDE', 'T-1', 'latte', 1250, 'payed', now() + interval '2 hours');
\echo '-- a rate is a fraction below 1:'
UPDATE payidem.merchant SET fee_rate = 1 WHERE merchant_no = 'M0123456789ABCDE';
\echo '-- channel codes are upper case:'
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('alipay_001', 'alipay', 0.006);
\set ON_ERROR_STOP 1

\echo '-- a correct order is accepted:'
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'order_no', 'M0123456789ABCDE', 'T-1', 'latte', 1250, now() + interval '2 hours');
\echo '-- one order, at most one pending payment attempt at a time:'
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
VALUES (:'payment_no', :'order_no', 'M0123456789ABCDE', 'WXPAY_001', 1250);
\unset ON_ERROR_STOP
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
VALUES (:'payment_no2', :'order_no', 'M0123456789ABCDE', 'WXPAY_001', 1250);
\set ON_ERROR_STOP 1
SELECT order_no, amount, currency, status FROM payidem."order";
SELECT payment_no, order_no, channel_no, amount, status FROM payidem.payment;
