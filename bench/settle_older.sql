-- bench/settle.sh: :old more succeeded payments on the days of 2025, already
-- settled (their settlement items, journals and balances written directly, as
-- settle() leaves them), and settle()'s progress past them (scan_from 2026-01-05): the
-- history settle() must not read again.  :from is the first number to use.
\set ON_ERROR_STOP 1
SET session_replication_role = replica;
CREATE TEMP TABLE old AS
SELECT i, 'M' || lpad((1 + i % :merchants)::text, 15, '0') AS merchant_no, 'BENCH_' || (i % 4) AS channel_no,
	   1000 + (i % 9000) AS amount,
	   timestamptz '2025-01-01 00:00:00+00' + (i / 100000) * interval '1 second' + (i % 365) * interval '1 day' AS t
  FROM generate_series(:from, :from + :old - 1) i;
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, paid_at,
							 paid_payment_no, expire_at, created_at)
SELECT payidem.order_no_make('PO', g.t, 0, g.i % 100000), g.merchant_no, 'O-' || g.i, 'bench', g.amount, 'paid',
	   g.t + interval '1 minute', payidem.order_no_make('PY', g.t, 0, g.i % 100000), g.t + interval '2 hours', g.t
  FROM old g;
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id,
							 fee_amount, cost_amount, paid_at, created_at)
SELECT payidem.order_no_make('PY', g.t, 0, g.i % 100000), payidem.order_no_make('PO', g.t, 0, g.i % 100000),
	   g.merchant_no, g.channel_no, g.amount, 'succeeded', 'O' || g.i,
	   round(g.amount * 0.006), round(g.amount * 0.002), g.t + interval '1 minute', g.t
  FROM old g;
INSERT INTO payidem.settlement_item (item_no, item_type, payment_no, merchant_no, channel_no, currency, bill_day,
									 settle_day, settle_date, amount, fee, cost)
SELECT payidem.order_no_make('PY', g.t, 0, g.i % 100000), 'payment', payidem.order_no_make('PY', g.t, 0, g.i % 100000),
	   g.merchant_no, g.channel_no, 'CNY', (g.t AT TIME ZONE 'UTC')::date, (g.t AT TIME ZONE 'UTC')::date + 1,
	   (g.t AT TIME ZONE 'UTC')::date + 1, g.amount, round(g.amount * 0.006), round(g.amount * 0.002)
  FROM old g;
-- their journals and the balances they moved, as settle() writes them
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
SELECT si.item_no, e.account, e.merchant_no, e.channel_no, si.currency, e.amount, si.item_no
  FROM payidem.settlement_item si
  JOIN old g ON si.item_no = payidem.order_no_make('PY', g.t, 0, g.i % 100000)
 CROSS JOIN LATERAL (VALUES
		('channel_receivable', NULL, si.channel_no, si.amount - si.cost),
		('channel_cost', NULL, NULL, si.cost),
		('merchant_available', si.merchant_no, NULL, -(si.amount - si.fee)),
		('fee_revenue', NULL, NULL, -si.fee)) e(account, merchant_no, channel_no, amount)
 WHERE e.amount <> 0;
INSERT INTO payidem.merchant_balance AS b (merchant_no, currency, available)
SELECT g.merchant_no, 'CNY', sum(g.amount - round(g.amount * 0.006))::bigint FROM old g GROUP BY g.merchant_no
ON CONFLICT (merchant_no, currency) DO UPDATE SET available = b.available + EXCLUDED.available;
INSERT INTO payidem.settle_state (id, scan_from) VALUES (true, '2026-01-05')
ON CONFLICT (id) DO UPDATE SET scan_from = EXCLUDED.scan_from;
RESET session_replication_role;
VACUUM ANALYZE;
