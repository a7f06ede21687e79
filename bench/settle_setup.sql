-- bench/settle.sh's data set: :merchants merchants (cycle D1) and :n
-- succeeded payments of bill day 2026-01-05 (UTC) over 4 channels, written
-- directly (the triggers off but status_keys, which keeps payment_paid, as
-- a restore loads rows) and the day reconciled on every channel (a recon_batch
-- done, no difference); fees 0.6 %, costs 0.2 %.  Also the plain tables of
-- the floor.
\set ON_ERROR_STOP 1
SET session_replication_role = replica;
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate)
SELECT 'BENCH_' || c, 'wechat', 0.002 FROM generate_series(0, 3) c;
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, api_key)
SELECT 'M' || lpad(m::text, 15, '0'), 'bench ' || m, 'retail', 0.006, 'D1', 'benchkey' || lpad(m::text, 16, '0')
  FROM generate_series(1, :merchants) m;
-- :n payments; numbers valid for their domains (order_no_make), 100,000 a second
CREATE TEMP TABLE gen AS
SELECT i, 'M' || lpad((1 + i % :merchants)::text, 15, '0') AS merchant_no, 'BENCH_' || (i % 4) AS channel_no,
	   1000 + (i % 9000) AS amount,
	   timestamptz '2026-01-05 00:00:00+00' + (i / 100000) * interval '1 second' AS t
  FROM generate_series(0, :n - 1) i;
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, paid_at,
							 paid_payment_no, expire_at, created_at)
SELECT payidem.order_no_make('PO', g.t, 0, g.i % 100000), g.merchant_no, 'B-' || g.i, 'bench', g.amount, 'paid',
	   g.t + interval '1 minute', payidem.order_no_make('PY', g.t, 0, g.i % 100000), g.t + interval '2 hours', g.t
  FROM gen g;
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id,
							 fee_amount, cost_amount, paid_at, created_at)
SELECT payidem.order_no_make('PY', g.t, 0, g.i % 100000), payidem.order_no_make('PO', g.t, 0, g.i % 100000),
	   g.merchant_no, g.channel_no, g.amount, 'succeeded', 'T' || g.i,
	   round(g.amount * 0.006), round(g.amount * 0.002), g.t + interval '1 minute', g.t
  FROM gen g;
INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, finished_at)
SELECT 'RC-BENCH_' || c || '-20260105-001', 'BENCH_' || c, '2026-01-05', 'done', clock_timestamp() + interval '1 second' FROM generate_series(0, 3) c;
RESET session_replication_role;

-- the floor's tables: settlement_item and ledger_entry as plain tables, the
-- same columns and keys, no triggers
CREATE TABLE floor_item (
	item_no text PRIMARY KEY, item_type text NOT NULL, payment_no text NOT NULL, merchant_no text NOT NULL,
	channel_no text NOT NULL, currency char(3) NOT NULL, bill_day date NOT NULL, settle_day date NOT NULL,
	settle_date date NOT NULL, amount bigint NOT NULL, fee bigint NOT NULL, cost bigint NOT NULL,
	settled_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE floor_entry (
	entry_id bigserial PRIMARY KEY, journal_no text NOT NULL, account text NOT NULL, merchant_no text,
	channel_no text, currency char(3) NOT NULL, amount bigint NOT NULL, source_no text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());
VACUUM ANALYZE;
