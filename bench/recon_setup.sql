-- Benchmark data for bench/recon.sh: :n paid payments of channel BENCH_WX on
-- 2024-05-01 (UTC) and the channel's bill of that day written to :'billfile'
-- as CSV in the documented layout, with 5 differences every :period payments
-- (5000: 0.1 %):
--   i % :period = 1   platform_only  (payment not in the bill)
--   i % :period = 2   amount_mismatch (bill amount + 1)
--   i % :period = 3   status_mismatch (bill refunded, payment succeeded)
--   i % :period = 5   status_mismatch (payment refunded, bill succeeded)
--   i % :period = 6   refunded on both sides (matched)
--   n / :period extra bill lines X<i>: channel_only
-- Bulk loading only: session_replication_role = replica skips the
-- state-machine and foreign-key triggers (reconcile() never reads orders, so
-- none are made).
CREATE EXTENSION payidem;
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M7BENCHRECQN0001', 'Bench Shop', 'retail', 0.006, 'ak_bench_recon_00000001');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('BENCH_WX', 'wechat', 0.0025);

SET session_replication_role = replica;
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status,
							 transaction_id, refunded_amount, paid_at, created_at, updated_at)
SELECT payidem.order_no_make('PY', timestamptz '2024-05-01 00:00:00+00' + (i / 1000000) * interval '1 second', 0, i % 1000000),
	       payidem.order_no_make('PO', timestamptz '2024-05-01 00:00:00+00' + (i / 1000000) * interval '1 second', 0, i % 1000000),
	   'M7BENCHRECQN0001', 'BENCH_WX', 1000 + i % 5000,
	   CASE WHEN i % :period IN (5, 6) THEN 'refunded' ELSE 'succeeded' END,
	   'T' || i,
	   CASE WHEN i % :period IN (5, 6) THEN 1000 + i % 5000 ELSE 0 END,
	   timestamptz '2024-05-01 00:00:00+00' + (i % 86400) * interval '1 second',
	   timestamptz '2024-05-01 00:00:00+00', timestamptz '2024-05-01 00:00:00+00'
  FROM generate_series(1, :n) i;
RESET session_replication_role;
VACUUM ANALYZE payidem.payment, payidem.payment_paid;

COPY (
	SELECT 'BENCH_WX', '2024-05-01', 'T' || i,
		   payidem.order_no_make('PY', timestamptz '2024-05-01 00:00:00+00' + (i / 1000000) * interval '1 second', 0, i % 1000000),
		   1000 + i % 5000 + CASE WHEN i % :period = 2 THEN 1 ELSE 0 END, 3,
		   CASE WHEN i % :period IN (3, 6) THEN 'refunded' ELSE 'succeeded' END,
		   to_char(timestamp '2024-05-01 00:00:00' + (i % 86400) * interval '1 second', 'YYYY-MM-DD HH24:MI:SS') || '+00'
	  FROM generate_series(1, :n) i
	 WHERE i % :period <> 1
	UNION ALL
	SELECT 'BENCH_WX', '2024-05-01', 'X' || i, '', 777, 1, 'succeeded', '2024-05-01 12:00:00+00'
	  FROM generate_series(1, :n / :period) i
) TO :'billfile' WITH (FORMAT csv);
