-- The obvious way: one FULL JOIN of the day's payments (through the index of
-- the times paid, payment_paid, as reconcile() reads them) and bill lines, the
-- differing rows written to a table.  No re-run rule, no straddle check, no
-- anomaly, no batch record: the floor reconcile() is compared against.
CREATE TEMP TABLE baseline_diffs AS
SELECT coalesce(p.transaction_id, b.transaction_id) AS transaction_id,
	   CASE WHEN p.transaction_id IS NULL THEN 'channel_only'
			WHEN b.transaction_id IS NULL THEN 'platform_only'
			WHEN p.amount <> b.amount THEN 'amount_mismatch'
			ELSE 'status_mismatch' END AS diff_type,
	   p.payment_no, p.amount AS platform_amount, b.amount AS channel_amount,
	   p.status AS platform_status, b.status AS channel_status
  FROM (SELECT pay.* FROM payidem.payment_paid pp
		  JOIN payidem.payment pay ON pay.payment_no = pp.payment_no
		 WHERE pp.channel_no = 'BENCH_WX'
		   AND pp.paid_at >= '2024-05-01 00:00:00+00' AND pp.paid_at < '2024-05-02 00:00:00+00'
		   AND pay.status IN ('succeeded', 'partially_refunded', 'refunded')) p
  FULL JOIN (SELECT * FROM payidem.channel_bill
			  WHERE channel_no = 'BENCH_WX' AND bill_date = '2024-05-01') b
	ON p.transaction_id = b.transaction_id
 WHERE p.transaction_id IS NULL OR b.transaction_id IS NULL
	OR p.amount <> b.amount
	OR (b.status = 'refunded') <> (p.status IN ('refunded', 'partially_refunded'));
