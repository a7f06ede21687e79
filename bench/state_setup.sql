-- bench/state_setup.sql — a fresh payidem with :rows pending orders.
-- psql -v rows=200000 -v variant=none|c|plpgsql -f bench/state_setup.sql
-- Rows are loaded the way a restore loads them (session_replication_role =
-- replica: no trigger, no log rows), so every variant starts from the same
-- tables; then the variant's trigger set-up is applied.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS payidem CASCADE;
CREATE EXTENSION payidem;
DROP SEQUENCE IF EXISTS bench_seq;
CREATE SEQUENCE bench_seq CACHE 1;
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0123456789ABCDE', 'Bench Shop', 'retail', 0.006, 'ak_0123456789abcdef');
SET session_replication_role = replica;
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, i), 'M0123456789ABCDE', 'B-' || i, 'bench', 1000, now() + interval '1 day'
  FROM generate_series(1, :rows) i;
RESET session_replication_role;
\i bench/state_plpgsql.sql
SELECT bench_variant(:'variant');
VACUUM ANALYZE payidem."order";
VACUUM ANALYZE payidem.status_log;
CHECKPOINT;
