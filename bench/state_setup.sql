-- bench/state_setup.sql — payidem with :rows pending orders and one guard
-- variant active.
-- psql -v rows=20000 -v variant=none|c|plpgsql -f bench/state_setup.sql
-- The first call creates the extension and the benchmark's functions; later
-- calls empty "order" and status_log (and the tables that reference "order")
-- instead, which leaves the same tables in less time.  Rows are loaded the way
-- a restore loads them (session_replication_role = replica: no trigger, no log
-- rows), so every variant starts from the same tables; then the variant's
-- trigger set-up is applied.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SELECT NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'payidem') AS fresh \gset
\if :fresh
CREATE EXTENSION payidem;
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0123456789ABCDE', 'Bench Shop', 'retail', 0.006, 'ak_0123456789abcdef');
\i bench/state_plpgsql.sql
\else
-- status_log refuses TRUNCATE to every role: lifted for this statement only;
-- the money records' TRUNCATE guard is an ordinary trigger (replica skips it)
ALTER TABLE payidem.status_log DISABLE TRIGGER status_log_append_only;
SET session_replication_role = replica;
TRUNCATE payidem."order", payidem.status_log RESTART IDENTITY CASCADE;
RESET session_replication_role;
ALTER TABLE payidem.status_log ENABLE ALWAYS TRIGGER status_log_append_only;
\endif
-- the whitelist alone: these orders become paid without a payment, so the
-- bookkeeping triggers are off here (bench/flow.sh measures a real success,
-- bookkeeping included)
ALTER TABLE payidem."order" DISABLE TRIGGER status_ledger, DISABLE TRIGGER status_ledger_at_commit;
DROP SEQUENCE IF EXISTS bench_seq;
CREATE SEQUENCE bench_seq CACHE 1;
SET session_replication_role = replica;
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, i), 'M0123456789ABCDE', 'B-' || i, 'bench', 1000, now() + interval '1 day'
  FROM generate_series(1, :rows) i;
RESET session_replication_role;
SELECT bench_variant(:'variant');
VACUUM ANALYZE payidem."order";
VACUUM ANALYZE payidem.status_log;
CHECKPOINT;
