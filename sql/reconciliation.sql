--
-- reconciliation: bill import (load_bill and COPY), reconcile() with every kind
-- of difference, re-runs, resolve_diff(), midnight straddles, the bill time
-- zone, the channel_only anomaly and the daily summary.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, YMD';
\set VERBOSITY default
\set SHOW_CONTEXT never

-- errors as rows: SQLSTATE, message, detail
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL;
	-- recon_id values and the role name depend on the run
	err_message := regexp_replace(err_message, 'difference [0-9]+ ', 'difference <id> ');
	err_detail := regexp_replace(err_detail, ' by [^ ]+\.$', ' by <role>.');
	RETURN NEXT;
END
$$;

INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M7RECQNC0000001X', 'Reconciled Shop', 'retail', 0.006, 'ak_recon_test_0000001');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES
	('RECON_WX', 'wechat', 0.0025),
	('RECON_ALI', 'alipay', 0.0030);

-- A paid payment n of a channel: order pending -> paid, payment pending ->
-- succeeded (-> refunded ...), as the state machines allow.
CREATE FUNCTION pg_temp.paid(n int, p_channel text, p_txn text, p_amount bigint,
							 p_paid_at timestamptz, p_final text DEFAULT 'succeeded')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_order text := payidem.order_no_make('PO', '2024-05-01 00:00:00+00', 0, n);
	v_pay text := payidem.order_no_make('PY', '2024-05-01 00:00:00+00', 0, n);
	v_refunded bigint;
BEGIN
	INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at, created_at)
	VALUES (v_order, 'M7RECQNC0000001X', 'RECON-' || n, 'reconciliation test', p_amount,
			p_paid_at + interval '2 hours', p_paid_at - interval '1 minute');
	INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, created_at)
	VALUES (v_pay, v_order, 'M7RECQNC0000001X', p_channel, p_amount, p_paid_at - interval '1 minute');
	IF p_final = 'closed' THEN
		UPDATE payidem.payment SET status = 'closed', closed_at = p_paid_at WHERE payment_no = v_pay;
		RETURN v_pay;
	END IF;
	-- (a success without its transaction id cannot be written any more: one
	-- from before, as a restore in replica mode would load it)
	IF p_txn IS NULL THEN
		PERFORM set_config('session_replication_role', 'replica', true);
	END IF;
	-- (its cost what the channel's rate makes it, which its bill's fee says)
	UPDATE payidem.payment SET status = 'succeeded', transaction_id = p_txn, paid_at = p_paid_at,
		   fee_amount = 0,
		   cost_amount = round(p_amount * (SELECT c.fee_rate FROM payidem.channel c WHERE c.channel_no = p_channel))
	 WHERE payment_no = v_pay;
	PERFORM set_config('session_replication_role', 'origin', true);
	UPDATE payidem."order" SET status = 'paid', paid_at = p_paid_at, paid_payment_no = v_pay WHERE order_no = v_order;
	IF p_final IN ('refunded', 'partially_refunded') THEN
		-- with its refund, refunded at the moment of payment (within the day)
		v_refunded := CASE p_final WHEN 'refunded' THEN p_amount ELSE p_amount / 2 END;
		INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount)
		VALUES (payidem.order_no_make('RF', '2024-05-01 00:00:00+00', 0, n), v_pay, v_order,
				'M7RECQNC0000001X', 'RECON-RF-' || n, v_refunded);
		UPDATE payidem.refund SET status = 'succeeded', refunded_at = p_paid_at
		 WHERE refund_no = payidem.order_no_make('RF', '2024-05-01 00:00:00+00', 0, n);
		UPDATE payidem.payment SET status = p_final, refunded_amount = v_refunded WHERE payment_no = v_pay;
		UPDATE payidem."order" SET status = p_final, refunded_amount = v_refunded WHERE order_no = v_order;
	END IF;
	RETURN v_pay;
END
$$;

-- Day 2024-05-01 (UTC) on RECON_WX
SELECT count(*) AS payments FROM (VALUES
	(pg_temp.paid(1,  'RECON_WX', 'WX-T1',  1000, '2024-05-01 08:00:00+00')),  -- matched
	(pg_temp.paid(2,  'RECON_WX', 'WX-T2',  2000, '2024-05-01 00:00:00+00')),  -- matched (first instant of the day)
	(pg_temp.paid(3,  'RECON_WX', 'WX-T3',  1500, '2024-05-01 09:00:00+00')),  -- platform_only
	(pg_temp.paid(5,  'RECON_WX', 'WX-T5',  5000, '2024-05-01 10:00:00+00')),  -- amount_mismatch (bill 4900)
	(pg_temp.paid(6,  'RECON_WX', 'WX-T6',   800, '2024-05-01 11:00:00+00')),  -- status_mismatch: bill says refunded
	(pg_temp.paid(7,  'RECON_WX', 'WX-T7',   700, '2024-05-01 12:00:00+00', 'refunded')),  -- status_mismatch: we refunded
	(pg_temp.paid(8,  'RECON_WX', 'WX-T8',   600, '2024-05-01 13:00:00+00', 'refunded')),  -- matched, refunded both sides
	(pg_temp.paid(9,  'RECON_WX', NULL,      900, '2024-05-01 14:00:00+00', 'closed')),    -- closed here, paid there: channel_only
	(pg_temp.paid(10, 'RECON_WX', 'WX-T10',  300, '2024-05-01 23:59:59.5+00')), -- in the bill of 05-02: straddle
	(pg_temp.paid(11, 'RECON_WX', 'WX-T11',  400, '2024-04-30 23:59:59+00')),  -- another day: not compared
	(pg_temp.paid(12, 'RECON_WX', 'WX-T12', 1200, '2024-05-01 15:00:00+00', 'partially_refunded')), -- matched
	(pg_temp.paid(13, 'RECON_WX', 'WX-T13',  250, '2024-05-02 10:00:00+00'))   -- day 05-02, matched there
) v(p);

---------------------------------------------------------------- import
-- load_bill: the documented CSV layout, with a header, CRLF line ends, a
-- quoted field, empty channel_no/bill_date (taken from the arguments) and
-- an empty fee (0)
SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at\r\n'
	'RECON_WX,2024-05-01,WX-T1,PY202405010000000000000125,1000,3,succeeded,2024-05-01 08:00:01\r\n'
	',,WX-T2,PY202405010000000000000222,2000,5,succeeded,2024-05-01T00:00:00Z\r\n'
	'RECON_WX,2024-05-01,WX-T4,,3000,8,succeeded,2024-05-01 16:30:00+08:00\r\n'
	'RECON_WX,2024-05-01,"WX-T5",PY202405010000000000000513,4900,12,succeeded,2024-05-01 10:00:02\r\n'
	'RECON_WX,2024-05-01,WX-T6,PY202405010000000000000610,800,2,refunded,2024-05-01 11:00:01\r\n'
	'RECON_WX,2024-05-01,WX-T7,PY202405010000000000000707,700,2,succeeded,2024-05-01 12:00:01\r\n'
	'RECON_WX,2024-05-01,WX-T8,PY202405010000000000000804,600,,refunded,2024-05-01 13:00:01\r\n'
	'RECON_WX,2024-05-01,WX-T9,PY202405010000000000000998,900,2,succeeded,2024-05-01 14:00:30\r\n'
	'RECON_WX,2024-05-01,WX-T12,PY202405010000000000001289,1200,3,refunded,2024-05-01 15:00:01\r\n') AS lines_loaded;
SELECT transaction_id, payment_no, amount, fee, status, paid_at
  FROM payidem.channel_bill WHERE channel_no = 'RECON_WX' AND bill_date = '2024-05-01'
 ORDER BY transaction_id;

-- bad lines: 22023 naming the line and the field; nothing is imported
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded,\nRECON_WX,2024-05-01,A2,,12.50,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,-100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,0,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,-1,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded,\n\nEVIL_001,2024-05-01,A2,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-5-1,A1,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-02,A1,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded,yesterday\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded,2024-05-01 10:00:00\nRECON_WX,2024-05-01,A2,,100,0,succeeded,2024-13-01 10:00:00\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded,\nRECON_WX,2024-05-01,A2,,100,0,succeeded,\nRECON_WX,2024-05-01,A1,,200,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,SUCCESS,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,100,0,succeeded\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,"A1,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A 1,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('NO_SUCH', '2024-05-01', E'NO_SUCH,2024-05-01,A1,,100,0,succeeded,\n')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('RECON_WX', NULL, '')$$);
-- the first bad line is reported, and the day's bill is unchanged
SELECT count(*) AS lines_still_there, sum(amount) AS amount_still_there
  FROM payidem.channel_bill WHERE channel_no = 'RECON_WX' AND bill_date = '2024-05-01';
-- the hint says what to do
SELECT payidem.load_bill('RECON_WX', '2024-05-01', E'RECON_WX,2024-05-01,A1,,1.5,0,succeeded,\n');

-- plain COPY of the same layout: the table's constraints check the lines,
-- PostgreSQL names the line and column
\set SHOW_CONTEXT errors
COPY payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at) FROM STDIN WITH (FORMAT csv);
RECON_WX,2024-05-03,WX-X1,,300,1,succeeded,
RECON_WX,2024-05-03,WX-X2,,2.50,1,succeeded,
\.
\set SHOW_CONTEXT never

---------------------------------------------------------------- reconcile
SELECT * FROM payidem.reconcile('RECON_WX', '2024-05-01');
SELECT diff_type, transaction_id, payment_no, platform_amount, channel_amount,
       platform_status, channel_status, handle_status, recon_batch_no
  FROM payidem.reconciliation WHERE channel_no = 'RECON_WX' AND bill_date = '2024-05-01'
 ORDER BY diff_type, transaction_id;
SELECT recon_batch_no, status, finished_at >= started_at AS timed, bill_timezone,
       bill_lines, bill_amount_total, platform_payments, platform_amount_total,
       matched, platform_only, channel_only, amount_mismatch, status_mismatch, straddled, auto_resolved
  FROM payidem.recon_batch WHERE channel_no = 'RECON_WX' ORDER BY recon_batch_no;
-- money taken without a record of ours cannot be missed: an anomaly each
SELECT kind, channel_no, payment_no, amount, detail - 'recon_id' AS detail, handle_status,
       (detail ->> 'recon_id')::bigint = (SELECT recon_id FROM payidem.reconciliation r
                                           WHERE r.diff_type = 'channel_only'
                                             AND r.transaction_id = a.detail ->> 'transaction_id') AS points_at_difference
  FROM payidem.anomaly a WHERE kind = 'channel_only' ORDER BY detail ->> 'transaction_id';

-- a re-run finds the same, keeps the same rows (recon_id) and raises nothing again
CREATE TEMP TABLE first_run AS
	SELECT recon_id, diff_type, transaction_id FROM payidem.reconciliation WHERE bill_date = '2024-05-01';
SELECT * FROM payidem.reconcile('RECON_WX', '2024-05-01');
SELECT (SELECT count(*) FROM payidem.reconciliation WHERE bill_date = '2024-05-01') AS differences,
       (SELECT count(*) FROM payidem.reconciliation r JOIN first_run f USING (recon_id, diff_type, transaction_id)) AS same_rows,
       (SELECT count(*) FROM payidem.reconciliation WHERE bill_date = '2024-05-01'
                                                      AND recon_batch_no = 'RC-RECON_WX-20240501-002') AS confirmed_by_run_2,
       (SELECT count(*) FROM payidem.anomaly WHERE kind = 'channel_only') AS anomalies;

---------------------------------------------------------------- resolve_diff
SELECT recon_id AS t5 FROM payidem.reconciliation WHERE transaction_id = 'WX-T5' \gset
SELECT recon_id AS t4 FROM payidem.reconciliation WHERE transaction_id = 'WX-T4' \gset
SELECT recon_id AS t6 FROM payidem.reconciliation WHERE transaction_id = 'WX-T6' \gset
SELECT payidem.resolve_diff(:t5, 'handled', 'channel confirmed 4900; merchant refunded 100');
SELECT payidem.resolve_diff(:t4, 'handled', 'refunded to the payer');
SELECT payidem.resolve_diff(:t6, 'ignored');
SELECT transaction_id, handle_status, handled_by = session_user AS by_me, handled_at IS NOT NULL AS dated, note
  FROM payidem.reconciliation WHERE recon_id IN (:t4, :t5, :t6) ORDER BY transaction_id;
-- the anomaly of the channel_only difference is closed with it
SELECT detail ->> 'transaction_id' AS transaction_id, handle_status, note
  FROM payidem.anomaly WHERE kind = 'channel_only' ORDER BY 1;
-- errors
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, %L)', :t5, 'handled'));
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, %L)', :t6, 'handled'));
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, %L)', :t5, 'done'));
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, %L)', :t5, 'open'));
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, NULL)', :t5));
SELECT * FROM pg_temp.try('SELECT payidem.resolve_diff(-1, ''handled'')');
SELECT * FROM pg_temp.try(format('SELECT payidem.resolve_diff(%s, %L, %L)', :t4 + 1000, 'ignored', repeat('x', 1025)));

-- a re-run keeps handled/ignored differences and does not open them again;
-- an open difference that is gone (the channel re-sent a line) is dropped
INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status)
VALUES ('RECON_WX', '2024-05-01', 'WX-T3', 'PY202405010000000000000319', 1500, 4, 'succeeded');
SELECT * FROM payidem.reconcile('RECON_WX', '2024-05-01');
SELECT diff_type, transaction_id, handle_status, recon_batch_no
  FROM payidem.reconciliation WHERE channel_no = 'RECON_WX' AND bill_date = '2024-05-01'
 ORDER BY diff_type, transaction_id;
SELECT count(*) AS anomalies FROM payidem.anomaly WHERE kind = 'channel_only';

---------------------------------------------------------------- midnight straddle
-- WX-T10 was paid at 23:59:59.5 on 05-01 (ours) and billed on 05-02 (theirs):
-- reconciling 05-02 matches it and auto-resolves the platform_only of 05-01;
-- it is no channel_only of 05-02.
SELECT diff_type, handle_status FROM payidem.reconciliation WHERE transaction_id = 'WX-T10';
COPY payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at) FROM STDIN WITH (FORMAT csv);
RECON_WX,2024-05-02,WX-T10,PY202405010000000000001095,300,1,succeeded,2024-05-02 00:00:01+00
RECON_WX,2024-05-02,WX-T13,PY202405010000000000001386,250,1,succeeded,2024-05-02 10:00:01+00
\.
SELECT * FROM payidem.reconcile('RECON_WX', '2024-05-02');
SELECT bill_date, diff_type, transaction_id, handle_status, handled_by, note
  FROM payidem.reconciliation WHERE transaction_id = 'WX-T10';
SELECT straddled, auto_resolved FROM payidem.recon_batch WHERE recon_batch_no = 'RC-RECON_WX-20240502-001';
-- 05-01 again: WX-T10 is in another day's bill, so no new difference; the
-- auto-resolved row is kept
SELECT * FROM payidem.reconcile('RECON_WX', '2024-05-01');
SELECT bill_date, diff_type, handle_status FROM payidem.reconciliation WHERE transaction_id = 'WX-T10';
SELECT straddled FROM payidem.recon_batch WHERE recon_batch_no = 'RC-RECON_WX-20240501-004';

---------------------------------------------------------------- time zone
SHOW payidem.bill_timezone;
SELECT * FROM pg_temp.try($$SET payidem.bill_timezone = 'Mars/Olympus_Mons'$$);
SELECT * FROM pg_temp.try($$SET payidem.bill_timezone = ''$$);
SET payidem.bill_timezone = 'Asia/Shanghai';
-- Beijing midnight: 00:00:00 opens 05-01, 23:59:59 is the last second of
-- 05-01, 00:00:00 the next day belongs to 05-02
SELECT count(*) AS payments FROM (VALUES
	(pg_temp.paid(20, 'RECON_ALI', 'ALI-T20', 100, '2024-05-01 00:00:00+08')),
	(pg_temp.paid(21, 'RECON_ALI', 'ALI-T21', 200, '2024-05-01 23:59:59+08')),
	(pg_temp.paid(22, 'RECON_ALI', 'ALI-T22', 400, '2024-05-02 00:00:00+08'))
) v(p);
-- bill times without an offset are Beijing wall-clock times
SELECT payidem.load_bill('RECON_ALI', '2024-05-01', E'RECON_ALI,2024-05-01,ALI-T20,,100,0,succeeded,2024-05-01 00:00:00\nRECON_ALI,2024-05-01,ALI-T21,,200,1,succeeded,2024-05-01 23:59:59\n');
SELECT payidem.load_bill('RECON_ALI', '2024-05-02', E'RECON_ALI,2024-05-02,ALI-T22,,400,1,succeeded,2024-05-02 00:00:00\n');
SELECT transaction_id, paid_at FROM payidem.channel_bill WHERE channel_no = 'RECON_ALI' ORDER BY paid_at;
SELECT * FROM payidem.reconcile('RECON_ALI', '2024-05-01');
SELECT * FROM payidem.reconcile('RECON_ALI', '2024-05-02');
-- cut at UTC midnight instead, 05-01 holds other payments: two straddles
RESET payidem.bill_timezone;
SELECT * FROM payidem.reconcile('RECON_ALI', '2024-05-01');
SELECT recon_batch_no, bill_timezone, platform_payments, platform_amount_total, matched, straddled
  FROM payidem.recon_batch WHERE channel_no = 'RECON_ALI' ORDER BY recon_batch_no;
SELECT count(*) AS alipay_differences FROM payidem.reconciliation WHERE channel_no = 'RECON_ALI';

---------------------------------------------------------------- refunded after the day
-- A bill is a picture of its day: a payment refunded the next day is still
-- succeeded in that day's bill (matched); one refunded the same day is not.
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('RECON_UP', 'unionpay', 0.0030);
SELECT count(*) AS payments FROM (VALUES
	(pg_temp.paid(30, 'RECON_UP', 'UP-T30', 3000, '2024-05-03 10:00:00+00', 'refunded')),
	(pg_temp.paid(31, 'RECON_UP', 'UP-T31', 3100, '2024-05-03 11:00:00+00', 'refunded'))
) v(p);
UPDATE payidem.refund
   SET refunded_at = CASE out_refund_no WHEN 'RECON-RF-30' THEN timestamptz '2024-05-04 09:00:00+00'
                                        ELSE timestamptz '2024-05-03 12:00:00+00' END
 WHERE out_refund_no IN ('RECON-RF-30', 'RECON-RF-31');
SELECT payidem.load_bill('RECON_UP', '2024-05-03', E'RECON_UP,2024-05-03,UP-T30,,3000,9,succeeded,2024-05-03 10:00:00\nRECON_UP,2024-05-03,UP-T31,,3100,9,succeeded,2024-05-03 11:00:00\n');
SELECT * FROM payidem.reconcile('RECON_UP', '2024-05-03');
SELECT diff_type, transaction_id, platform_status, channel_status
  FROM payidem.reconciliation WHERE channel_no = 'RECON_UP';

---------------------------------------------------------------- billed twice, no transaction id, a corrected bill
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('RECON_JD', 'epay', 0.0030);
SELECT count(*) AS payments FROM (VALUES
	(pg_temp.paid(40, 'RECON_JD', 'JD-T40', 4000, '2024-05-05 10:00:00+00')),
	(pg_temp.paid(41, 'RECON_JD', NULL,     4100, '2024-05-05 11:00:00+00'))   -- success reported without a transaction id
) v(p);
SELECT payidem.order_no_make('PY', '2024-05-01 00:00:00+00', 0, 41) AS p41 \gset
-- the line that echoes payment 41's number is payment 41 (ours has no
-- transaction id): matched, neither platform_only nor channel_only, no anomaly
SELECT payidem.load_bill('RECON_JD', '2024-05-05',
	format(E'RECON_JD,2024-05-05,JD-T40,,4000,12,succeeded,2024-05-05 18:00:00\n'
		   'RECON_JD,2024-05-05,JD-T41,%s,4100,12,succeeded,2024-05-05 19:00:00\n', :'p41'));
SELECT * FROM payidem.reconcile('RECON_JD', '2024-05-05');
-- 05-06 lists JD-T40 (already billed, and matched, on 05-05) again as
-- succeeded: billed twice, a channel_only difference with its anomaly, like
-- the unknown JD-T42
SELECT payidem.load_bill('RECON_JD', '2024-05-06',
	E'RECON_JD,2024-05-06,JD-T40,,4000,12,succeeded,2024-05-06 10:00:00\n'
	 'RECON_JD,2024-05-06,JD-T42,,500,2,succeeded,2024-05-06 10:00:00\n');
SELECT * FROM payidem.reconcile('RECON_JD', '2024-05-06');
SELECT bill_date, diff_type, transaction_id, platform_status, channel_status, handle_status
  FROM payidem.reconciliation WHERE channel_no = 'RECON_JD' ORDER BY bill_date, transaction_id;
SELECT detail ->> 'transaction_id' AS txn, handle_status FROM payidem.anomaly WHERE channel_no = 'RECON_JD' ORDER BY 1;
-- the channel corrects the 05-06 bill (JD-T40 was listed by mistake): its
-- difference is gone, and its anomaly is closed with it
SELECT payidem.load_bill('RECON_JD', '2024-05-06', E'RECON_JD,2024-05-06,JD-T42,,500,2,succeeded,2024-05-06 10:00:00\n');
SELECT * FROM payidem.reconcile('RECON_JD', '2024-05-06');
SELECT bill_date, diff_type, transaction_id, handle_status
  FROM payidem.reconciliation WHERE channel_no = 'RECON_JD' ORDER BY bill_date, transaction_id;
SELECT detail ->> 'transaction_id' AS txn, handle_status, handled_by, note ~ '^its difference is gone' AS noted
  FROM payidem.anomaly WHERE channel_no = 'RECON_JD' ORDER BY 1;
-- a refund the channel lists on a later day (status refunded) is not billing twice
SELECT payidem.load_bill('RECON_JD', '2024-05-07', E'RECON_JD,2024-05-07,JD-T40,,4000,0,refunded,2024-05-07 09:00:00\n');
SELECT channel_only FROM payidem.reconcile('RECON_JD', '2024-05-07');
-- the 05-06 line of JD-T40 comes back: its difference, and the anomaly the
-- run had closed, are open again
SELECT payidem.load_bill('RECON_JD', '2024-05-06',
	E'RECON_JD,2024-05-06,JD-T40,,4000,12,succeeded,2024-05-06 10:00:00\n'
	 'RECON_JD,2024-05-06,JD-T42,,500,2,succeeded,2024-05-06 10:00:00\n');
SELECT channel_only FROM payidem.reconcile('RECON_JD', '2024-05-06');
SELECT detail ->> 'transaction_id' AS txn, handle_status, handled_by FROM payidem.anomaly
 WHERE channel_no = 'RECON_JD' ORDER BY 1;
-- a straddle billed on the next day and again on the day after: the first
-- line is the match, the later one the repeat, and re-running the first day
-- keeps it so
SELECT pg_temp.paid(43, 'RECON_JD', 'JD-T43', 4300, '2024-05-08 23:59:59+00') IS NOT NULL AS paid;
SELECT payidem.load_bill('RECON_JD', '2024-05-09', E'RECON_JD,2024-05-09,JD-T43,,4300,13,succeeded,2024-05-09 00:00:01\n');
SELECT matched, channel_only FROM payidem.reconcile('RECON_JD', '2024-05-09');
SELECT payidem.load_bill('RECON_JD', '2024-05-10', E'RECON_JD,2024-05-10,JD-T43,,4300,13,succeeded,2024-05-10 00:00:01\n');
SELECT matched, channel_only FROM payidem.reconcile('RECON_JD', '2024-05-10');
SELECT matched, channel_only FROM payidem.reconcile('RECON_JD', '2024-05-09');
-- a payment without a transaction id whose number two lines of its day echo:
-- neither line is trusted
SELECT pg_temp.paid(44, 'RECON_JD', NULL, 4400, '2024-05-11 10:00:00+00') IS NOT NULL AS paid;
SELECT payidem.order_no_make('PY', '2024-05-01 00:00:00+00', 0, 44) AS p44 \gset
SELECT payidem.load_bill('RECON_JD', '2024-05-11',
	format(E'RECON_JD,2024-05-11,JD-T44A,%s,4400,13,succeeded,2024-05-11 10:00:00\n'
		   'RECON_JD,2024-05-11,JD-T44B,%s,4400,13,succeeded,2024-05-11 10:00:01\n', :'p44', :'p44'));
SELECT matched, platform_only, channel_only FROM payidem.reconcile('RECON_JD', '2024-05-11');

---------------------------------------------------------------- sums past bigint
-- two payments of 5e18 on one day, billed as such (19-digit amounts, as
-- create_order takes): the day's totals pass the bigint range and are kept
-- exactly, no overflow error
SELECT pg_temp.paid(60, 'RECON_ALI', 'ALI-T60', 5000000000000000000, '2024-05-20 10:00:00+00') IS NOT NULL AS paid,
       pg_temp.paid(61, 'RECON_ALI', 'ALI-T61', 5000000000000000000, '2024-05-20 11:00:00+00') IS NOT NULL AS paid_too;
SELECT payidem.load_bill('RECON_ALI', '2024-05-20',
	E'RECON_ALI,2024-05-20,ALI-T60,,5000000000000000000,0,succeeded,2024-05-20 10:00:00\n'
	 'RECON_ALI,2024-05-20,ALI-T61,,5000000000000000000,0,succeeded,2024-05-20 11:00:00\n') AS lines;
SELECT matched, platform_only, channel_only, amount_mismatch FROM payidem.reconcile('RECON_ALI', '2024-05-20');
SELECT bill_amount_total, platform_amount_total
  FROM payidem.recon_batch WHERE channel_no = 'RECON_ALI' AND bill_date = '2024-05-20';

---------------------------------------------------------------- no bill, no reconciliation
-- a day without a bill line loaded is not reconciled (every payment would
-- be platform_only); nothing is written
SELECT pg_temp.paid(70, 'RECON_ALI', 'ALI-T70', 700, '2024-05-25 10:00:00+00') IS NOT NULL AS paid;
SELECT * FROM pg_temp.try($$SELECT payidem.reconcile('RECON_ALI', '2024-05-25')$$);
SELECT count(*) AS batches, (SELECT count(*) FROM payidem.reconciliation
                              WHERE channel_no = 'RECON_ALI' AND bill_date = '2024-05-25') AS differences
  FROM payidem.recon_batch WHERE channel_no = 'RECON_ALI' AND bill_date = '2024-05-25';
-- the channel really reported nothing that day: say so
SELECT matched, platform_only, channel_only
  FROM payidem.reconcile('RECON_ALI', '2024-05-25', allow_empty => true);

---------------------------------------------------------------- bad arguments
SELECT * FROM pg_temp.try($$SELECT payidem.reconcile('NO_SUCH', '2024-05-01')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.reconcile(NULL, '2024-05-01')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.reconcile('RECON_WX', 'infinity')$$);

---------------------------------------------------------------- daily report
SELECT channel_no, bill_date, last_batch_no, bill_lines, platform_payments, matched,
       platform_only, channel_only, amount_mismatch, status_mismatch, straddled,
       open_count, open_amount, open_channel_only, handled_count, ignored_count, auto_resolved_count
  FROM payidem.recon_summary ORDER BY channel_no, bill_date;

DROP FUNCTION pg_temp.paid(int, text, text, bigint, timestamptz, text);
DROP FUNCTION pg_temp.try(text);
