--
-- install: CREATE / DROP / re-CREATE, non-relocatable fixed schema, and a
-- pg_dump of a database with data restoring into a fresh one with the rows.
--
\set VERBOSITY terse
CREATE EXTENSION payidem;
-- (at the version payidem.control names, which the loaded library was built as)
SELECT e.extname, e.extversion = a.default_version AS default_version,
       payidem.library_version() = e.extversion AS library_matches,
       n.nspname AS schema, e.extrelocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
  JOIN pg_available_extensions a ON a.name = e.extname
 WHERE e.extname = 'payidem';

-- the eighteen tables, all members of the extension
SELECT count(*) AS tables
  FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'payidem')
   AND d.classid = 'pg_class'::regclass AND c.relkind = 'r';

-- the schema is fixed
ALTER EXTENSION payidem SET SCHEMA public;
CREATE SCHEMA elsewhere;
DROP EXTENSION payidem;
CREATE EXTENSION payidem SCHEMA elsewhere;
DROP SCHEMA elsewhere;

-- dropping removes every table; re-creating brings back the default whitelist
SELECT count(*) AS payidem_tables_left FROM pg_class WHERE relnamespace = 'payidem'::regnamespace;
CREATE EXTENSION payidem;
SELECT entity, count(*) AS transitions FROM payidem.transition GROUP BY entity ORDER BY entity;

--
-- pg_dump keeps the rows of the extension's tables
--
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0123456789ABCDE', 'Corner Shop', 'retail', 0.006, 'ak_0123456789abcdef');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate)
VALUES ('WXPAY_001', 'wechat', 0.0025);
INSERT INTO payidem.merchant_channel (merchant_no, channel_no, single_limit)
VALUES ('M0123456789ABCDE', 'WXPAY_001', 500000);
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES ('PO202611290000000000013009', 'M0123456789ABCDE', 'SHOP-1', 'coffee', 1500, now() + interval '2 hours'),
       ('PO202611290000000000023194', 'M0123456789ABCDE', 'SHOP-2', 'tea', 900, now() + interval '2 hours');
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
VALUES ('PY202611290000000000016333', 'PO202611290000000000013009', 'M0123456789ABCDE', 'WXPAY_001', 1500);
-- (a DBA's own writes keep the bookkeeping too: the success with its
-- transaction id and fees, the order paid by it)
UPDATE payidem.payment SET status = 'succeeded', transaction_id = 'WX-42', paid_at = now(),
       fee_amount = 9, cost_amount = 4;
UPDATE payidem."order" SET status = 'paid', paid_at = now(), paid_payment_no = 'PY202611290000000000016333'
 WHERE out_trade_no = 'SHOP-1';
INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, amount, status, result)
VALUES ('pay:PO202611290000000000013009:callback', 'pay', 'PO202611290000000000013009', 1500,
        'completed', '{"answer": "SUCCESS"}');
INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
VALUES ('order', 'PO202611290000000000013009', NULL, 'pending');
-- a DBA's own flow (seed 002) survives too; the built-in rows are not doubled
INSERT INTO payidem.state (entity, status) VALUES ('order', 'shipping');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'shipping');

\set regressdb :DBNAME
\setenv PGDATABASE :regressdb
CREATE DATABASE payidem_restored;
-- a plain restore, no options: every row comes back as it was
\! pg_dump --format=custom | pg_restore --exit-on-error --dbname=payidem_restored
\c payidem_restored
\set VERBOSITY terse
SELECT e.extversion = a.default_version AS restored_at_default_version
  FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'payidem';
SELECT merchant_no, merchant_name, fee_rate, api_key FROM payidem.merchant;
SELECT merchant_no, channel_no, single_limit FROM payidem.merchant_channel;
SELECT order_no, out_trade_no, amount, status FROM payidem."order" ORDER BY order_no;
SELECT payment_no, status, transaction_id FROM payidem.payment;
SELECT idem_key, status, result FROM payidem.idempotency;
SELECT entity, entity_no, from_status, to_status FROM payidem.status_log;
SELECT entity, status, builtin FROM payidem.state WHERE NOT builtin;
SELECT count(*) AS order_transitions FROM payidem.transition WHERE entity = 'order';
-- the log's sequence continues after the restored rows
SELECT nextval('payidem.status_log_log_id_seq') > 1 AS log_sequence_restored;
\c :regressdb
DROP DATABASE payidem_restored;
