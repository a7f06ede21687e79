-- bench/settle.sh's floor: the day's items and their balanced entries,
-- written by hand in plain SQL (INSERT ... SELECT), on plain tables.
WITH i AS (
	INSERT INTO floor_item (item_no, item_type, payment_no, merchant_no, channel_no, currency, bill_day,
							settle_day, settle_date, amount, fee, cost)
	SELECT p.payment_no, 'payment', p.payment_no, p.merchant_no, p.channel_no, o.currency,
		   (p.paid_at AT TIME ZONE 'UTC')::date, date '2026-01-06', date '2026-01-06',
		   p.amount, p.fee_amount, p.cost_amount
	  FROM payidem.channel c
	  JOIN payidem.payment_paid pp ON pp.channel_no = c.channel_no
	   AND pp.paid_at >= '2026-01-05 00:00:00+00' AND pp.paid_at < '2026-01-06 00:00:00+00'
	  JOIN payidem.payment p ON p.payment_no = pp.payment_no
	  JOIN payidem."order" o ON o.order_no = p.order_no
	RETURNING *)
INSERT INTO floor_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
SELECT i.item_no, e.account, e.merchant_no, e.channel_no, i.currency, e.amount, i.item_no
  FROM i CROSS JOIN LATERAL (VALUES
		('channel_receivable', NULL, i.channel_no, i.amount - i.cost),
		('channel_cost', NULL, NULL, i.cost),
		('merchant_available', i.merchant_no, NULL, -(i.amount - i.fee)),
		('fee_revenue', NULL, NULL, -i.fee)) e(account, merchant_no, channel_no, amount)
 WHERE e.amount <> 0;
