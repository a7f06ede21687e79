--
-- payment_flow: create_order, begin_payment, apply_payment_result,
-- close_payment, close_order, refund, apply_refund_result, notify_due,
-- notify_result, and the seed cases of the payment-flow issue.
-- The test cluster's postgresql.conf names a master key file (sign() needs it).
-- Generated numbers are never printed, only their properties.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- run a statement; show its SQLSTATE, message, detail and hint with random
-- merchant numbers and generated order/payment/refund numbers masked
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := regexp_replace(regexp_replace(err_message, 'M[0-9A-HJKMNP-TV-Z]{15}', 'M***', 'g'),
								  '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	err_detail := regexp_replace(regexp_replace(err_detail, 'M[0-9A-HJKMNP-TV-Z]{15}', 'M***', 'g'),
								 '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	err_detail := regexp_replace(err_detail, 'expired at .*$', 'expired at ***');
	err_hint := regexp_replace(err_hint, '(PO|PY|RF)[0-9]{24}', '\1***', 'g');
	RETURN NEXT;
END
$$;

-- the status history of an order and its payments, in order, numbers masked
CREATE FUNCTION pg_temp.history(p_order_no text)
RETURNS TABLE (entity text, entity_no text, from_status text, to_status text)
LANGUAGE sql AS $$
	SELECT l.entity, regexp_replace(l.entity_no, '[0-9]{24}', '***'), l.from_status, l.to_status
	  FROM payidem.status_log l
	 WHERE l.entity_no = p_order_no
		OR l.entity_no IN (SELECT payment_no FROM payidem.payment WHERE order_no = p_order_no)
		OR l.entity_no IN (SELECT refund_no FROM payidem.refund WHERE order_no = p_order_no)
	 ORDER BY l.log_id
$$;

-- the notification events of an order so far, in order: event (status)
CREATE FUNCTION pg_temp.events(p_order_no text)
RETURNS text
LANGUAGE sql AS $$
	SELECT coalesce(string_agg(e.event || ' (' || e.status || ')', ', ' ORDER BY e.event_id), 'none')
	  FROM payidem.notify_event e WHERE e.order_no = p_order_no
$$;

------------------------------------------------------------------------ set-up
SELECT merchant_no AS m1, api_key AS m1_key FROM payidem.create_merchant('Flow Tea House', 'retail', 0.006) \gset
SELECT merchant_no AS m2 FROM payidem.create_merchant('Flow Noodles', 'catering', 0.0038) \gset
SELECT payidem.create_channel('FLOW_WX', 'wechat', 0.002);
SELECT payidem.create_channel('FLOW_ALI', 'alipay', 0.0025);
SELECT payidem.create_channel('FLOW_UNION', 'unionpay', 0.001);
SELECT payidem.create_channel('FLOW_OFF', 'wechat', 0.002);
SELECT payidem.create_channel('FLOW_FOOD', 'wechat', 0.002, 100, ARRAY['catering']);
SELECT payidem.create_channel('FLOW_LIM', 'epay', 0.002);
SELECT payidem.bind_channel(:'m1', 'FLOW_WX');
SELECT payidem.bind_channel(:'m1', 'FLOW_ALI', 0.0055);		-- merchant rate override
SELECT payidem.bind_channel(:'m1', 'FLOW_OFF');
SELECT payidem.bind_channel(:'m1', 'FLOW_LIM', NULL, 5000, 8000);
SELECT payidem.bind_channel(:'m2', 'FLOW_FOOD');
SELECT payidem.set_channel_status('FLOW_OFF', 'disabled');
-- the channel's own limits (no API yet: set directly)
UPDATE payidem.channel SET single_limit = 3000, daily_limit = 100000 WHERE channel_no = 'FLOW_UNION';
SELECT payidem.bind_channel(:'m1', 'FLOW_UNION');

------------------------------------------------------------------ create_order
SELECT payidem.create_order(:'m1', 'T-0001', 1250, 'Green tea 250 g',
                            'https://shop.example/notify', 'https://shop.example/done') AS o1 \gset
SELECT :'o1' ~ '^PO[0-9]{24}$' AS order_no_format, payidem.order_no_valid(:'o1') AS check_digits_ok,
       (payidem.order_no_parse(:'o1')).prefix AS prefix;
SELECT merchant_no = :'m1' AS merchant, out_trade_no, amount, currency, subject, status, refunded_amount,
       pg_temp.events(order_no) AS events,
       expire_at - created_at AS expires_after, paid_at IS NULL AS unpaid, paid_payment_no
  FROM payidem."order" WHERE order_no = :'o1';
-- seed 4: a double click returns the same order; another amount or subject is PI001
SELECT payidem.create_order(:'m1', 'T-0001', 1250, 'Green tea 250 g') = :'o1' AS same_order_returned;
SELECT count(*) AS orders_for_t0001 FROM payidem."order" WHERE merchant_no = :'m1' AND out_trade_no = 'T-0001';
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 1300, %L)', :'m1', 'T-0001', 'Green tea 250 g'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 1250, %L)', :'m1', 'T-0001', 'Black tea'));
-- the same out_trade_no at another merchant is another order
SELECT payidem.create_order(:'m2', 'T-0001', 1250, 'Noodles') <> :'o1' AS other_merchant_other_order;
-- bad input: 22023 with DETAIL and HINT
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 0, %L)', :'m1', 'T-0002', 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, -5, %L)', :'m1', 'T-0002', 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L)', :'m1', 'T-0002', '   '));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L)', :'m1', 'T-0002', repeat('x', 257)));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L)', :'m1', 'T 0002', 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L)', :'m1', repeat('x', 65), 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L, expire_in => %L)', :'m1', 'T-0002', 'x', '0'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L, %L)', :'m1', 'T-0002', 'x', 'ftp://shop.example/n'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L, return_url => %L)', :'m1', 'T-0002', 'x', 'https://a b'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, NULL, 100, %L)', :'m1', 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, NULL, %L)', :'m1', 'T-0002', 'x'));
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L, body => repeat(%L, 1025))', :'m1', 'T-0002', 'x', 'b'));
SELECT * FROM pg_temp.try('SELECT payidem.create_order(''M000000000000000'', ''T-0002'', 100, ''x'')');
SELECT payidem.freeze_merchant(:'m2');
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 100, %L)', :'m2', 'T-0002', 'x'));
SELECT payidem.unfreeze_merchant(:'m2');
-- nothing was left behind by the refusals
SELECT count(*) AS orders_of_m1 FROM payidem."order" WHERE merchant_no = :'m1';

----------------------------------------------------------------- begin_payment
SELECT payidem.begin_payment(:'o1', 'FLOW_WX') AS p1 \gset
SELECT :'p1' ~ '^PY[0-9]{24}$' AS payment_no_format, payidem.order_no_valid(:'p1') AS check_digits_ok;
SELECT order_no = :'o1' AS of_order, merchant_no = :'m1' AS of_merchant, channel_no, amount, status,
       transaction_id, fee_amount, cost_amount, refunded_amount
  FROM payidem.payment WHERE payment_no = :'p1';
-- a retried call on the same channel returns the same attempt
SELECT payidem.begin_payment(:'o1', 'FLOW_WX') = :'p1' AS same_attempt;
-- seed 5: another channel while one is pending -> PI003, naming it
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o1', 'FLOW_ALI'));
SELECT count(*) AS attempts FROM payidem.payment WHERE order_no = :'o1';
-- refusals
SELECT payidem.create_order(:'m1', 'T-0003', 2000, 'Oolong') AS o3 \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', 'PO202401010000000000000067', 'FLOW_WX'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o3', 'NOPE_X'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o3', 'FLOW_OFF'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o3', 'FLOW_FOOD'));
SELECT payidem.unbind_channel(:'m1', 'FLOW_ALI');
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o3', 'FLOW_ALI'));
SELECT payidem.bind_channel(:'m1', 'FLOW_ALI', 0.0055);
SELECT payidem.freeze_merchant(:'m1');
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o3', 'FLOW_WX'));
SELECT payidem.unfreeze_merchant(:'m1');
-- a channel that does not admit the merchant type
SELECT payidem.create_order(:'m2', 'N-0001', 900, 'Noodles') AS on1 \gset
UPDATE payidem.channel SET allowed_merchant_types = ARRAY['retail'] WHERE channel_no = 'FLOW_FOOD';
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'on1', 'FLOW_FOOD'));
UPDATE payidem.channel SET allowed_merchant_types = ARRAY['catering'] WHERE channel_no = 'FLOW_FOOD';
-- expired: PI008
SELECT payidem.create_order(:'m1', 'T-0004', 100, 'Short-lived', expire_in => '10 milliseconds') AS o4 \gset
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o4', 'FLOW_WX'));
-- limits (PI007): binding single 5000 / daily 8000 on FLOW_LIM; channel single 3000 on FLOW_UNION
SELECT payidem.create_order(:'m1', 'L-0001', 5001, 'Too big') AS l1 \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'l1', 'FLOW_LIM'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'l1', 'FLOW_UNION'));
SELECT payidem.create_order(:'m1', 'L-0002', 5000, 'Limit A') AS l2 \gset
SELECT payidem.create_order(:'m1', 'L-0003', 3000, 'Limit B') AS l3 \gset
SELECT payidem.create_order(:'m1', 'L-0004', 3001, 'Limit C') AS l4 \gset
SELECT payidem.begin_payment(:'l2', 'FLOW_LIM') IS NOT NULL AS first_5000;
SELECT payidem.begin_payment(:'l3', 'FLOW_LIM') IS NOT NULL AS then_3000_makes_8000;
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'l4', 'FLOW_LIM'));
-- a failed attempt no longer counts towards the day
SELECT payidem.apply_payment_result(payidem.begin_payment(:'l2', 'FLOW_LIM'), 'query', 'failed') AS l2_failed;
SELECT payidem.begin_payment(:'l4', 'FLOW_LIM') IS NOT NULL AS fits_again;
-- a daily limit at the bigint maximum: the day's sum would pass bigint, and
-- is still PI007 (not an overflow error); nothing of it stays
BEGIN;
SELECT payidem.create_channel('FLOW_HUGE', 'epay', 0.002);
SELECT payidem.bind_channel(:'m1', 'FLOW_HUGE', NULL, NULL, 9223372036854775807);
SELECT payidem.create_order(:'m1', 'H-0001', 9223372036854775000, 'Huge A') AS h1 \gset
SELECT payidem.create_order(:'m1', 'H-0002', 9223372036854775000, 'Huge B') AS h2 \gset
SELECT payidem.begin_payment(:'h1', 'FLOW_HUGE') IS NOT NULL AS first_fits;
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'h2', 'FLOW_HUGE'));
ROLLBACK;

----------------------------------------------------------- apply_payment_result
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L)', :'p1', 'webhook', 'succeeded'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L)', :'p1', 'callback', 'paid'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, amount => 0)', :'p1', 'callback', 'succeeded'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L)', :'p1', 'callback', 'succeeded', 'has space'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L)', 'PY202401010000000000000093', 'callback', 'failed'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, paid_at => %L)', :'p1', 'callback', 'succeeded', 'infinity'));
-- a success must carry the transaction id and the amount; paid_at lies
-- between the attempt's start and now (payidem.max_clock_skew either side)
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L)', :'p1', 'callback', 'succeeded', 'WX-T-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, amount => 1250)', :'p1', 'callback', 'succeeded'));
SELECT err_code, err_message, err_hint
  FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1250, %L)', :'p1', 'callback', 'succeeded', 'WX-T-0001', '2099-01-01 00:00:00+00'));
SELECT err_code, err_message
  FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1250, now() - interval ''1 hour'')', :'p1', 'callback', 'succeeded', 'WX-T-0001'));
SELECT status, transaction_id FROM payidem.payment WHERE payment_no = :'p1';

-- amount mismatch: rejected + anomaly, nothing else changes; a repeat adds no second anomaly
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1200,
                                    raw => '{"total_fee": 1200, "sign": "ABCDEF"}') AS wrong_amount;
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1200) AS wrong_amount_again;
SELECT kind, amount, detail - 'raw' AS detail, detail -> 'raw' AS raw_without_sign, handle_status
  FROM payidem.anomaly WHERE payment_no = :'p1' ORDER BY anomaly_id;
SELECT p.status AS payment, o.status AS "order", p.transaction_id,
       (SELECT count(*) FROM payidem.idempotency WHERE idem_key = 'payment:' || :'p1' || ':succeeded') AS idem_keys
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p1';

-- seed 1: duplicate callback delivery -> one applied, the rest duplicate, one notification
SELECT date_trunc('second', now()) AS t_paid \gset
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1250, :'t_paid') AS first_delivery;
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1250, :'t_paid') AS second_delivery;
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1250) AS third_delivery;
-- (a repeat with a paid_at outside the attempt's lifetime is malformed too)
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 1250, %L)',
                                 :'p1', 'callback', 'succeeded', 'WX-T-0001', 'infinity'));
-- seed 2: the active query learns the same thing: no second effect
SELECT payidem.apply_payment_result(:'p1', 'query', 'succeeded', 'WX-T-0001', 1250) AS query_result;
-- payidem's decisions write no idempotency key: the payment row records them
SELECT count(*) AS idem_keys FROM payidem.idempotency WHERE order_no = :'o1';
-- fees: 1250 * 0.006 = 7.5 -> 8 (half-up); cost 1250 * 0.002 = 2.5 -> 3
SELECT status, transaction_id, paid_at = :'t_paid' AS paid_then, fee_amount, cost_amount FROM payidem.payment WHERE payment_no = :'p1';
SELECT status, paid_payment_no = :'p1' AS paid_by_p1, paid_at = :'t_paid' AS paid_then, pg_temp.events(order_no) AS events
  FROM payidem."order" WHERE order_no = :'o1';
SELECT * FROM pg_temp.history(:'o1');
-- a failure or close reported after the success, or a success with another
-- transaction id or amount, contradicts it: rejected with a conflicting_result
-- anomaly (once per report); nothing else changes
SELECT payidem.apply_payment_result(:'p1', 'query', 'failed') AS failed_after_success,
       payidem.apply_payment_result(:'p1', 'close', 'closed') AS closed_after_success,
       payidem.apply_payment_result(:'p1', 'query', 'failed') AS failed_again;
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001-B', 1250) AS second_charge,
       payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'WX-T-0001', 1300) AS other_amount;
SELECT kind, detail ->> 'reported_status' AS reported, detail ->> 'transaction_id' AS txn,
       detail ->> 'reported_amount' AS reported_amount, amount
  FROM payidem.anomaly WHERE payment_no = :'p1' AND kind = 'conflicting_result' ORDER BY anomaly_id;
SELECT status, transaction_id, amount, fee_amount FROM payidem.payment WHERE payment_no = :'p1';

-- transaction_id already used by another payment of the channel: rejected + anomaly
SELECT payidem.begin_payment(:'o3', 'FLOW_WX') AS p3 \gset
SELECT payidem.apply_payment_result(:'p3', 'callback', 'succeeded', 'WX-T-0001', 2000) AS reused_txn;
SELECT payidem.apply_payment_result(:'p3', 'callback', 'succeeded', 'WX-T-0001', 2000) AS reused_txn_again;
SELECT kind, amount, detail ->> 'transaction_id' AS txn, detail ->> 'other_payment_no' = :'p1' AS names_owner
  FROM payidem.anomaly WHERE payment_no = :'p3';
SELECT p.status AS payment, o.status AS "order" FROM payidem.payment p JOIN payidem."order" o USING (order_no)
 WHERE p.payment_no = :'p3';

-- WeChat attempt fails, Alipay attempt succeeds: one order, two payment rows, paid
SELECT payidem.apply_payment_result(:'p3', 'callback', 'failed', raw => '{"err_code": "NOTENOUGH"}') AS wechat_failed;
SELECT payidem.apply_payment_result(:'p3', 'query', 'failed') AS wechat_failed_again;
SELECT payidem.begin_payment(:'o3', 'FLOW_ALI') AS p3b \gset
SELECT payidem.apply_payment_result(:'p3b', 'callback', 'succeeded', 'ALI-0003', 2000) AS alipay_succeeded;
-- 2000 * 0.0055 (binding) = 11; 2000 * 0.0025 = 5
SELECT channel_no, status, fee_amount, cost_amount FROM payidem.payment WHERE order_no = :'o3' ORDER BY created_at, payment_no;
SELECT status, paid_payment_no = :'p3b' AS paid_by_alipay FROM payidem."order" WHERE order_no = :'o3';
-- a success reported for the failed attempt: the channel's word wins (failed
-- -> succeeded), and as the order is paid by the other attempt, an anomaly
-- asks for its refund, which refund() takes
SELECT payidem.apply_payment_result(:'p3', 'query', 'succeeded', 'WX-T-0003', 2000) AS success_after_failure;
SELECT payidem.apply_payment_result(:'p3', 'query', 'succeeded', 'WX-T-0003', 2000) AS success_after_failure_again;
SELECT kind, amount, detail ->> 'transaction_id' AS transaction_id, detail ->> 'payment_status_before' AS was,
       detail ->> 'action' AS action
  FROM payidem.anomaly WHERE payment_no = :'p3' ORDER BY anomaly_id;
SELECT status, transaction_id, fee_amount IS NOT NULL AS has_fees FROM payidem.payment WHERE payment_no = :'p3';
SELECT status, paid_payment_no = :'p3b' AS still_paid_by_alipay FROM payidem."order" WHERE order_no = :'o3';
SELECT * FROM pg_temp.history(:'o3');

--------------------------------------------------- a success for no payment
-- A success reported for a well-formed number of this shard that names no
-- payment (lost in an asynchronous failover, or never made here): rejected,
-- with one unknown_transaction anomaly per number and transaction id that
-- carries the amount and the report; a repeat (from any source) adds none,
-- another transaction id for the number one more.  Counted as rejected.
CREATE TEMP TABLE rejected_before AS SELECT name, value FROM payidem.stats() WHERE name = 'payment_rejected';
SELECT payidem.order_no_make('PY', date_trunc('second', now()) - interval '1 minute', payidem.shard_id(), 424242) AS px \gset
SELECT payidem.apply_payment_result(:'px', 'callback', 'succeeded', 'WX-LOST-1', 990, now() - interval '30 seconds',
                                    '{"total_fee": 990, "sign": "ABCDEF"}') AS lost_success;
SELECT payidem.apply_payment_result(:'px', 'callback', 'succeeded', 'WX-LOST-1', 990) AS lost_success_again,
       payidem.apply_payment_result(:'px', 'query', 'succeeded', 'WX-LOST-1', 990) AS lost_success_queried,
       payidem.apply_payment_result(:'px', 'callback', 'succeeded', 'WX-LOST-2', 990) AS other_transaction_id;
SELECT kind, order_no, payment_no, channel_no, amount, handle_status,
       detail ->> 'reported_payment_no' = :'px' AS names_the_number, detail ->> 'transaction_id' AS transaction_id,
       detail ->> 'reported_amount' AS reported_amount, detail ->> 'source' AS source,
       (detail ->> 'paid_at')::timestamptz <= now() - interval '30 seconds' AS paid_at_as_reported,
       detail -> 'raw' AS raw_without_sign
  FROM payidem.anomaly WHERE detail ->> 'reported_payment_no' = :'px' ORDER BY anomaly_id;
SELECT s.value - b.value AS rejected_counted FROM payidem.stats() s JOIN rejected_before b USING (name);
-- the work queue shows them, with what to do
SELECT kind, payment_no, amount, action FROM payidem.open_anomalies
 WHERE detail ->> 'reported_payment_no' = :'px' ORDER BY anomaly_id;
-- nothing else is made: no payment, no order
SELECT count(*) AS payments FROM payidem.payment WHERE payment_no = :'px';
SELECT * FROM pg_temp.try(format('SELECT payidem.get_order(%L)',
       (SELECT payidem.order_no_make('PO', n.issued_at, n.shard, n.seq) FROM payidem.order_no_parse(:'px') n)));
-- handled or not, the same report still adds nothing
SELECT payidem.resolve_anomaly(anomaly_id, 'handled', 'refunded at the channel')
  FROM payidem.anomaly WHERE detail ->> 'reported_payment_no' = :'px' AND detail ->> 'transaction_id' = 'WX-LOST-1';
SELECT payidem.apply_payment_result(:'px', 'callback', 'succeeded', 'WX-LOST-1', 990) AS after_handled;
SELECT count(*) AS anomalies FROM payidem.anomaly WHERE detail ->> 'reported_payment_no' = :'px';
-- any other report of an unknown payment is PI009, as is a success for a
-- number of another shard; a malformed number is 22023: no anomaly for them
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L)', :'px', 'query', 'failed'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L)', :'px', 'close', 'closed'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 990)',
       payidem.order_no_make('PY', date_trunc('second', now()), (payidem.shard_id() + 1) % 100, 424242),
       'callback', 'succeeded', 'WX-LOST-3'));
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 990)',
       'PY202401010000000000000094', 'callback', 'succeeded', 'WX-LOST-4'));
SELECT count(*) AS unknown_transaction_anomalies FROM payidem.anomaly WHERE kind = 'unknown_transaction';
DROP TABLE rejected_before;

------------------------------------------------------------------ close_payment
SELECT payidem.create_order(:'m1', 'T-0005', 800, 'Puer') AS o5 \gset
SELECT payidem.begin_payment(:'o5', 'FLOW_WX') AS p5 \gset
SELECT payidem.close_payment(:'p5') AS closed_now, payidem.close_payment(:'p5') AS already_closed;
SELECT status, closed_at IS NOT NULL AS has_closed_at FROM payidem.payment WHERE payment_no = :'p5';
SELECT status FROM payidem."order" WHERE order_no = :'o5';
SELECT * FROM pg_temp.try(format('SELECT payidem.close_payment(%L)', :'p1'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_payment(%L)', :'p3'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_payment(%L)', 'PY202401010000000000000093'));

-------------------------------------------------------------------- close_order
-- seed 3: close races payment: order closed, then the channel reports success
SELECT payidem.create_order(:'m1', 'T-0006', 1500, 'Jasmine') AS o6 \gset
SELECT payidem.begin_payment(:'o6', 'FLOW_WX') AS p6 \gset
SELECT payidem.close_order(:'o6') AS closed_now, payidem.close_order(:'o6') AS already_closed;
SELECT o.status AS "order", o.closed_at IS NOT NULL AS order_closed_at, p.status AS payment
  FROM payidem."order" o JOIN payidem.payment p USING (order_no) WHERE o.order_no = :'o6';
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o6', 'FLOW_WX'));
SELECT payidem.apply_payment_result(:'p6', 'callback', 'succeeded', 'WX-T-0006', 1500,
                                    raw => '{"transaction_id": "WX-T-0006"}') AS late_success;
SELECT payidem.apply_payment_result(:'p6', 'callback', 'succeeded', 'WX-T-0006', 1500) AS late_success_again;
SELECT o.status AS "order", o.paid_payment_no, pg_temp.events(o.order_no) AS events, p.status AS payment, p.transaction_id
  FROM payidem."order" o JOIN payidem.payment p USING (order_no) WHERE o.order_no = :'o6';
SELECT kind, amount, handle_status, detail ->> 'order_status' AS order_status, detail ->> 'action' AS action,
       detail -> 'raw' AS raw
  FROM payidem.anomaly WHERE order_no = :'o6';
SELECT * FROM pg_temp.history(:'o6');
SELECT * FROM pg_temp.try(format('SELECT payidem.close_order(%L)', :'o1'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_order(%L)', 'PO202401010000000000000067'));
-- closing an order without an attempt
SELECT payidem.create_order(:'m1', 'T-0007', 100, 'Sample') AS o7 \gset
SELECT payidem.close_order(:'o7') AS closed_without_attempt;

----------------------------------------------------- seed 5: two channels in parallel
SELECT payidem.create_order(:'m1', 'T-0008', 3000, 'Tea set') AS o8 \gset
SELECT payidem.begin_payment(:'o8', 'FLOW_WX') AS p8a \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o8', 'FLOW_ALI'));
-- the user switches: A is closed (after querying the channel), B begins
SELECT payidem.close_payment(:'p8a') AS a_closed;
SELECT payidem.begin_payment(:'o8', 'FLOW_ALI') AS p8b \gset
-- both were really paid: A's late success pays the order, B's success is a duplicate payment
SELECT payidem.apply_payment_result(:'p8a', 'query', 'succeeded', 'WX-T-0008', 3000) AS a_late_success;
SELECT payidem.apply_payment_result(:'p8b', 'callback', 'succeeded', 'ALI-0008', 3000) AS b_success;
SELECT payidem.apply_payment_result(:'p8b', 'callback', 'succeeded', 'ALI-0008', 3000) AS b_success_again;
SELECT o.status, o.paid_payment_no = :'p8a' AS paid_by_a FROM payidem."order" o WHERE o.order_no = :'o8';
SELECT payment_no = :'p8b' AS is_b, kind, amount, detail ->> 'paid_payment_no' = :'p8a' AS names_a
  FROM payidem.anomaly WHERE order_no = :'o8';
SELECT channel_no, status FROM payidem.payment WHERE order_no = :'o8' ORDER BY channel_no;

------------------------------------------------------------------------- refund
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 0, %L)', :'p1', 'R-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 100, %L)', :'p1', 'R 0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 100, %L, repeat(%L, 257))', :'p1', 'R-0001', 'r'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 100, %L)', 'PY202401010000000000000093', 'R-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 100, %L)', :'p5', 'R-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 1251, %L)', :'p1', 'R-0001'));
-- REPEATABLE READ: refused (its snapshot would not show a concurrent refund);
-- so are begin_payment and close_order
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 100, %L)', :'p1', 'R-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'o1', 'FLOW_WX'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_order(%L)', :'o1'));
ROLLBACK;
-- partial: 250 of 1250
SELECT payidem.refund(:'p1', 250, 'R-0001', 'one box damaged') AS r1 \gset
SELECT :'r1' ~ '^RF[0-9]{24}$' AS refund_no_format, payidem.order_no_valid(:'r1') AS check_digits_ok;
SELECT payment_no = :'p1' AS of_payment, order_no = :'o1' AS of_order, out_refund_no, amount, status, reason
  FROM payidem.refund WHERE refund_no = :'r1';
-- idempotent on out_refund_no; another amount or payment is PI001
SELECT payidem.refund(:'p1', 250, 'R-0001') = :'r1' AS same_refund_returned;
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 300, %L)', :'p1', 'R-0001'));
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 250, %L)', :'p3b', 'R-0001'));
-- pending refunds count: 250 pending + 1001 > 1250
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 1001, %L)', :'p1', 'R-0002'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_refund_result(%L, %L)', :'r1', 'done'));
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_refund_result(%L, %L)', 'RF202401010000000000000098', 'succeeded'));
SELECT payidem.apply_refund_result(:'r1', 'succeeded', 'WXR-0001') AS r1_applied;
SELECT payidem.apply_refund_result(:'r1', 'succeeded', 'WXR-0001') AS r1_duplicate;
SELECT payidem.apply_refund_result(:'r1', 'failed') AS r1_failed_too_late;
SELECT status, channel_refund_id, refunded_at IS NOT NULL AS has_refunded_at FROM payidem.refund WHERE refund_no = :'r1';
SELECT p.status AS payment, p.refunded_amount AS payment_refunded, o.status AS "order", o.refunded_amount AS order_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p1';
-- a failed refund frees its amount again
SELECT payidem.refund(:'p1', 1000, 'R-0002') AS r2 \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 1, %L)', :'p1', 'R-0003'));
SELECT payidem.apply_refund_result(:'r2', 'failed') AS r2_failed;
SELECT payidem.apply_refund_result(:'r2', 'succeeded') AS r2_success_too_late;
SELECT kind, amount FROM payidem.anomaly WHERE kind = 'refund_success_after_failure' AND payment_no = :'p1';
-- the rest, in full: payment and order refunded
SELECT payidem.refund(:'p1', 1000, 'R-0003') AS r3 \gset
SELECT payidem.apply_refund_result(:'r3', 'succeeded') AS r3_applied;
SELECT p.status AS payment, p.refunded_amount AS payment_refunded, o.status AS "order", o.refunded_amount AS order_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p1';
SELECT * FROM pg_temp.try(format('SELECT payidem.refund(%L, 1, %L)', :'p1', 'R-0004'));
SELECT payidem.refund(:'p1', 1000, 'R-0003') = :'r3' AS repeat_after_full_refund;
SELECT * FROM pg_temp.history(:'o1');
-- refunds of the after-close and the duplicate payment move only the payment
SELECT payidem.refund(:'p6', 1500, 'R-0006') AS r6 \gset
SELECT payidem.apply_refund_result(:'r6', 'succeeded') AS r6_applied;
SELECT payidem.refund(:'p8b', 3000, 'R-0008') AS r8 \gset
SELECT payidem.apply_refund_result(:'r8', 'succeeded') AS r8_applied;
SELECT o.out_trade_no, o.status AS "order", o.refunded_amount AS order_refunded,
       p.channel_no, p.status AS payment, p.refunded_amount AS payment_refunded
  FROM payidem.payment p JOIN payidem."order" o USING (order_no)
 WHERE p.payment_no IN (:'p6', :'p8a', :'p8b') ORDER BY o.out_trade_no, p.channel_no;

---------------------------------------------------------- notify_due / notify_result
-- (payloads and signatures byte for byte: the notifications test)
-- only an order with a notify_url gets events: of the paid ones only T-0001
-- has one (paid, then refunded in two parts: three events)
SELECT count(*) AS pending_events FROM payidem.notify_event WHERE merchant_no = :'m1' AND status = 'pending';
SELECT payidem.create_order(:'m1', 'T-0009', 990, 'Matcha', 'http://shop.example/n') AS o9 \gset
SELECT date_trunc('second', now()) AS t9 \gset
SELECT payidem.apply_payment_result(payidem.begin_payment(:'o9', 'FLOW_ALI'), 'callback', 'succeeded', 'ALI-0009', 990,
                                    :'t9') AS o9_paid;
SELECT event_id AS e9 FROM payidem.notify_event WHERE order_no = :'o9' \gset
-- (times in the payload are UTC ISO 8601 whatever the worker's DateStyle and TimeZone)
SET datestyle = 'SQL, DMY';
SET timezone = 'Asia/Shanghai';
CREATE TEMP TABLE handed AS SELECT * FROM payidem.notify_due(100) WHERE merchant_no = :'m1';
RESET datestyle;
RESET timezone;
SELECT order_no = :'o1' AS is_o1, order_no = :'o9' AS is_o9, notify_url, event, attempt,
       payload::jsonb - 'event_id' - 'order_no' - 'merchant_no' - 'payment_no' - 'refund_no' - 'paid_at' - 'created_at' AS payload,
       payload::jsonb ->> 'event_id' = event_id::text AS payload_event_id,
       payload::jsonb ->> 'order_no' = order_no AS payload_order,
       payload::jsonb ->> 'paid_at' = (SELECT to_char(o.paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                                         FROM payidem."order" o WHERE o.order_no = handed.order_no) AS payload_paid_at_utc,
       payload::jsonb ->> 'merchant_no' = :'m1' AS payload_merchant,
       payidem.verify_notification(:'m1_key', payload, signature) AS merchant_can_verify
  FROM handed ORDER BY payload::jsonb ->> 'out_trade_no';
-- handed out events are leased: not handed out again at once
SELECT count(*) AS handed_again FROM payidem.notify_due(100) WHERE merchant_no = :'m1';
SELECT count(*) FILTER (WHERE next_attempt_at > now() + interval '50 seconds') AS leased
  FROM payidem.notify_event WHERE order_no IN (:'o1', :'o9');
-- ok -> sent; a repeated or late report changes nothing
SELECT payidem.notify_result(:e9, true);
SELECT payidem.notify_result(:e9, false, 'HTTP 500');
SELECT status, attempts, next_attempt_at, sent_at IS NOT NULL AS sent_at_set, last_response
  FROM payidem.notify_event WHERE event_id = :e9;
-- failures follow the schedule, then failed after the 16th attempt; the
-- start of the last failure's response is kept
CREATE TEMP TABLE schedule (attempt int, status text, wait interval, response text);
DO $$
DECLARE
	v_event bigint := (SELECT e.event_id FROM payidem.notify_event e JOIN payidem."order" o USING (order_no)
						WHERE o.out_trade_no = 'T-0001' AND e.event = 'order.paid'
						  AND o.merchant_no = (SELECT merchant_no FROM payidem.merchant WHERE merchant_name = 'Flow Tea House'));
	i int;
BEGIN
	FOR i IN 1..17 LOOP
		-- as notify_due() hands it out once it is due (each hand-out is an attempt)
		UPDATE payidem.notify_event e SET attempts = e.attempts + 1, next_attempt_at = now() + interval '60 seconds'
		 WHERE e.event_id = v_event AND e.status = 'pending' AND i > 1;
		PERFORM payidem.notify_result(v_event, false, 'HTTP 502 ' || i || repeat('.', 300), attempt => i);
		INSERT INTO schedule SELECT i, e.status, e.next_attempt_at - now(), left(e.last_response, 12) || '... (' || length(e.last_response) || ')'
		  FROM payidem.notify_event e WHERE e.event_id = v_event;
	END LOOP;
END
$$;
SELECT * FROM schedule ORDER BY attempt;
SELECT event, attempts, status FROM payidem.notify_event WHERE order_no = :'o1' ORDER BY event_id;
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(867, true)');
SELECT * FROM pg_temp.try(format('SELECT payidem.notify_result(%s, NULL)', :e9));
SELECT * FROM pg_temp.try('SELECT payidem.notify_due(0)');
-- a due event comes back after its retry wait
UPDATE payidem.notify_event SET status = 'pending', attempts = 3, next_attempt_at = now() - interval '1 second',
       sent_at = NULL
 WHERE event_id = :e9;
SELECT order_no = :'o9' AS is_o9, attempt FROM payidem.notify_due(100) WHERE merchant_no = :'m1';
-- a report naming another attempt than the current one (4) is stale: nothing changes
SELECT payidem.notify_result(:e9, false, 'HTTP 504', attempt => 3);
SELECT payidem.notify_result(:e9, true, attempt => 5);
SELECT status, attempts FROM payidem.notify_event WHERE event_id = :e9;
SELECT payidem.notify_result(:e9, true, attempt => 4);
SELECT status, attempts FROM payidem.notify_event WHERE event_id = :e9;

------------------------------------------------------------- seed 6: numbers
SELECT count(*) AS orders, count(*) FILTER (WHERE order_no !~ '^PO[0-9]{24}$' OR NOT payidem.order_no_valid(order_no)) AS bad_orders
  FROM payidem."order" WHERE merchant_no IN (:'m1', :'m2');
SELECT count(*) AS payments, count(*) FILTER (WHERE payment_no !~ '^PY[0-9]{24}$' OR NOT payidem.order_no_valid(payment_no)) AS bad_payments
  FROM payidem.payment WHERE merchant_no IN (:'m1', :'m2');
SELECT count(*) AS refunds, count(*) FILTER (WHERE refund_no !~ '^RF[0-9]{24}$' OR NOT payidem.order_no_valid(refund_no)) AS bad_refunds
  FROM payidem.refund WHERE merchant_no IN (:'m1', :'m2');

------------------------------------------------------------ overall invariants
-- refunded never above paid; an order is paid (or refunded) exactly when one of its payments paid it
SELECT count(*) AS over_refunded FROM payidem.payment p
 WHERE p.merchant_no IN (:'m1', :'m2') AND (p.refunded_amount > p.amount
    OR (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
         WHERE r.payment_no = p.payment_no AND r.status IN ('pending', 'succeeded')) > p.amount);
SELECT count(*) AS inconsistent_orders FROM payidem."order" o
 WHERE o.merchant_no IN (:'m1', :'m2')
   AND (o.status IN ('paid', 'partially_refunded', 'refunded')) IS DISTINCT FROM
       (o.paid_payment_no IS NOT NULL AND EXISTS (
			SELECT 1 FROM payidem.payment p WHERE p.payment_no = o.paid_payment_no
			   AND p.status IN ('succeeded', 'partially_refunded', 'refunded')));
-- every current status is the last one logged
SELECT count(*) AS log_mismatches FROM (
	SELECT 'payment' AS entity, payment_no AS no, status, merchant_no FROM payidem.payment
	UNION ALL SELECT 'order', order_no, status, merchant_no FROM payidem."order"
	UNION ALL SELECT 'refund', refund_no, status, merchant_no FROM payidem.refund) cur
 WHERE cur.merchant_no IN (:'m1', :'m2') AND cur.status IS DISTINCT FROM (SELECT l.to_status FROM payidem.status_log l
									 WHERE l.entity = cur.entity AND l.entity_no = cur.no
									 ORDER BY l.log_id DESC LIMIT 1);

------------------------------------------------ what a first success goes through
-- apply_payment_result() writes a first success as direct updates of the two
-- rows it holds locked; they go through everything an UPDATE goes through.
SELECT payidem.create_order(:'m1', 'T-0020', 700, 'Oolong', 'https://shop.example/notify') AS o20 \gset
SELECT payidem.begin_payment(:'o20', 'FLOW_WX') AS p20 \gset
-- the whitelist: without pending -> succeeded for payments, the success is PI002
BEGIN;
ALTER TABLE payidem.transition DISABLE TRIGGER whitelist_guard;  -- built-in rows are fixed otherwise
DELETE FROM payidem.transition WHERE entity = 'payment' AND from_status = 'pending' AND to_status = 'succeeded';
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                 :'p20', 'callback', 'succeeded', 'WX-T-0020'));
ROLLBACK;
-- a CHECK added later (700 * 0.006 = 4.2: fee 4), on the payment and on the order
BEGIN;
ALTER TABLE payidem.payment ADD CONSTRAINT payment_fee_below_4 CHECK (fee_amount < 4) NOT VALID;
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                 :'p20', 'callback', 'succeeded', 'WX-T-0020'));
ROLLBACK;
BEGIN;
ALTER TABLE payidem."order" ADD CONSTRAINT order_never_paid CHECK (status <> 'paid') NOT VALID;
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                 :'p20', 'callback', 'succeeded', 'WX-T-0020'));
ROLLBACK;
-- stored generated columns added later: one reading a column the success
-- sets, one reading none
BEGIN;
ALTER TABLE payidem.payment ADD COLUMN fee_basis_points bigint
	GENERATED ALWAYS AS (fee_amount * 10000 / amount) STORED;
ALTER TABLE payidem.payment ADD COLUMN row_kind text
	GENERATED ALWAYS AS ('payment'::text) STORED;
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_with_generated;
SELECT fee_amount, fee_basis_points, row_kind FROM payidem.payment WHERE payment_no = :'p20';
ROLLBACK;
-- a unique index added later
BEGIN;
CREATE UNIQUE INDEX payment_one_fee_of_4 ON payidem.payment ((fee_amount = 4)) WHERE fee_amount = 4;
SELECT payidem.create_order(:'m1', 'T-0021', 700, 'Oolong') AS o21 \gset
SELECT payidem.begin_payment(:'o21', 'FLOW_WX') AS p21 \gset
SELECT payidem.apply_payment_result(:'p21', 'callback', 'succeeded', 'WX-T-0021', 700) AS first_fee_4;
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                 :'p20', 'callback', 'succeeded', 'WX-T-0020'));
ROLLBACK;
-- a domain constraint added later (transaction_id is a payidem.channel_ref)
BEGIN;
ALTER DOMAIN payidem.channel_ref ADD CONSTRAINT channel_ref_not_x CHECK (VALUE !~ '^X') NOT VALID;
SELECT * FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                 :'p20', 'callback', 'succeeded', 'X-0020'));
ROLLBACK;
-- a CHECK that calls a function sees the function as it is now (a SQL
-- function is inlined into the compiled CHECK: replacing it must count), and
-- one on the whole row works from one delivery to the next
BEGIN;
CREATE FUNCTION public.flow_fee_ok(fee bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;
CREATE FUNCTION public.flow_row_ok(p payidem.payment) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	RETURN p.amount > 0;
END
$$;
ALTER TABLE payidem.payment ADD CONSTRAINT payment_fee_ok CHECK (public.flow_fee_ok(fee_amount)) NOT VALID,
	ADD CONSTRAINT payment_row_ok CHECK (public.flow_row_ok(payment)) NOT VALID;
SELECT payidem.create_order(:'m1', 'T-0023', 700, 'Oolong') AS o23 \gset
SELECT payidem.begin_payment(:'o23', 'FLOW_WX') AS p23 \gset
SELECT payidem.create_order(:'m1', 'T-0024', 700, 'Oolong') AS o24 \gset
SELECT payidem.begin_payment(:'o24', 'FLOW_WX') AS p24 \gset
SELECT payidem.apply_payment_result(:'p23', 'callback', 'succeeded', 'WX-T-0023', 700) AS fee_ok_yet;
CREATE OR REPLACE FUNCTION public.flow_fee_ok(fee bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT fee < 4 $$;
SELECT err_code, err_message FROM pg_temp.try(format('SELECT payidem.apply_payment_result(%L, %L, %L, %L, 700)',
                                                      :'p24', 'callback', 'succeeded', 'WX-T-0024'));
CREATE OR REPLACE FUNCTION public.flow_fee_ok(fee bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;
SELECT payidem.apply_payment_result(:'p24', 'callback', 'succeeded', 'WX-T-0024', 700) AS fee_ok_again;
ROLLBACK;
-- triggers of the application's own: BEFORE may change the row, AFTER UPDATE OF
-- status sees the change
BEGIN;
CREATE TABLE pg_temp.seen (tg text, old_status text, new_status text, fee bigint, note text);
CREATE FUNCTION pg_temp.before_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.updated_at := '2026-01-01 00:00:00+00';
	RETURN NEW;
END
$$;
CREATE FUNCTION pg_temp.after_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO pg_temp.seen VALUES (TG_TABLE_NAME, OLD.status, NEW.status,
		(to_jsonb(NEW) ->> 'fee_amount')::bigint, pg_temp.events(to_jsonb(NEW) ->> 'order_no'));
	RETURN NULL;
END
$$;
CREATE TRIGGER app_before BEFORE UPDATE ON payidem.payment FOR EACH ROW EXECUTE FUNCTION pg_temp.before_payment();
CREATE TRIGGER app_after AFTER UPDATE OF status ON payidem.payment FOR EACH ROW EXECUTE FUNCTION pg_temp.after_status();
CREATE TRIGGER app_after AFTER UPDATE OF status ON payidem."order" FOR EACH ROW EXECUTE FUNCTION pg_temp.after_status();
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_with_triggers;
SELECT tg, old_status, new_status, fee, note FROM pg_temp.seen ORDER BY tg DESC;
SELECT updated_at = '2026-01-01 00:00:00+00' AS before_trigger_applied, status, transaction_id, fee_amount, cost_amount
  FROM payidem.payment WHERE payment_no = :'p20';
ROLLBACK;
-- an application's trigger that writes the payment again after the success:
-- the order.paid event, and the bookkeeping at commit, read the payment as it
-- stands, not the version the direct update wrote
BEGIN;
CREATE FUNCTION pg_temp.retag_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE payidem.payment SET transaction_id = 'WX-T-0020-RETAGGED' WHERE payment_no = NEW.payment_no;
	RETURN NULL;
END
$$;
CREATE TRIGGER app_retag AFTER UPDATE OF status ON payidem.payment FOR EACH ROW
	WHEN (NEW.status = 'succeeded' AND NEW.transaction_id = 'WX-T-0020') EXECUTE FUNCTION pg_temp.retag_payment();
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_then_retagged;
SELECT e.event, e.payload::jsonb ->> 'transaction_id' AS event_transaction_id
  FROM payidem.notify_event e WHERE e.order_no = :'o20';
SET CONSTRAINTS ALL IMMEDIATE;
SELECT transaction_id FROM payidem.payment WHERE payment_no = :'p20';
ROLLBACK;
-- an index on a column the success sets: the order's update is then not HOT,
-- and every index of the order has an entry for the new version (amcheck
-- finds each row of the table in each index)
BEGIN;
CREATE EXTENSION IF NOT EXISTS amcheck;
CREATE INDEX order_paid_at_check ON payidem."order" (paid_at);
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_not_hot;
SELECT i.indexrelid::regclass AS index, public.bt_index_check(i.indexrelid, true) IS NOT NULL AS checked
  FROM pg_index i WHERE i.indrelid = 'payidem."order"'::regclass ORDER BY 1::text;
ROLLBACK;
-- a statement-level trigger (and a transition table): the same writes are
-- made by a SQL UPDATE, which fires them
BEGIN;
CREATE TABLE pg_temp.stmt_seen (tg text, rows_changed bigint);
CREATE FUNCTION pg_temp.after_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO pg_temp.stmt_seen SELECT TG_TABLE_NAME, count(*) FROM changed;
	RETURN NULL;
END
$$;
CREATE TRIGGER app_statement AFTER UPDATE ON payidem.payment REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.after_statement();
CREATE TRIGGER app_statement AFTER UPDATE ON payidem."order" REFERENCING NEW TABLE AS changed
	FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.after_statement();
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_by_sql_update;
SELECT tg, rows_changed FROM pg_temp.stmt_seen ORDER BY tg DESC;
SELECT p.status, p.transaction_id, p.fee_amount, o.status AS order_status, pg_temp.events(o.order_no) AS events
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p20';
SELECT * FROM pg_temp.history(:'o20');
ROLLBACK;
-- in REPEATABLE READ, and with an index the C path relies on renamed, the
-- success is written by the SQL implementation: the same writes
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_in_repeatable_read;
SELECT p.status, p.transaction_id, p.fee_amount, p.cost_amount, o.status AS order_status, pg_temp.events(o.order_no) AS events
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p20';
SELECT * FROM pg_temp.history(:'o20');
ROLLBACK;
BEGIN;
ALTER INDEX payidem.payment_transaction_key RENAME TO payment_transaction_key_renamed;
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied_without_the_index_name;
SELECT payidem.apply_payment_result(:'p20', 'query', 'succeeded', 'WX-T-0020', 700) AS then_a_duplicate;
SELECT p.status, p.transaction_id, p.fee_amount, p.cost_amount, o.status AS order_status, pg_temp.events(o.order_no) AS events
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p20';
ROLLBACK;
-- and without them: the payment and its order, the log, the order.paid event
SELECT payidem.apply_payment_result(:'p20', 'callback', 'succeeded', 'WX-T-0020', 700) AS applied;
SELECT p.status, p.transaction_id, p.fee_amount, p.cost_amount, p.paid_at = o.paid_at AS same_paid_at,
       p.updated_at = p.paid_at AS payment_updated_then, o.updated_at = o.paid_at AS order_updated_then,
       o.status AS order_status, o.paid_payment_no = :'p20' AS paid_by,
       pg_temp.events(o.order_no) AS events,
       (SELECT e.next_attempt_at = o.paid_at AND e.created_at = o.paid_at FROM payidem.notify_event e
         WHERE e.order_no = o.order_no) AS event_due_then
  FROM payidem.payment p JOIN payidem."order" o USING (order_no) WHERE p.payment_no = :'p20';
SELECT * FROM pg_temp.history(:'o20');
-- an order without a notify_url is paid with no event written
SELECT payidem.create_order(:'m1', 'T-0022', 300, 'Sample', notify_url => NULL) AS o22 \gset
SELECT payidem.begin_payment(:'o22', 'FLOW_WX') AS p22 \gset
SELECT payidem.apply_payment_result(:'p22', 'query', 'succeeded', 'WX-T-0022', 300) AS applied_without_notify_url;
SELECT o.status, pg_temp.events(o.order_no) AS events,
       p.transaction_id, p.fee_amount, p.cost_amount
  FROM payidem."order" o JOIN payidem.payment p USING (order_no) WHERE o.order_no = :'o22';

------------------------------------------------- query_due: expired attempts
-- seed 000, case 3: an order whose attempt is still pending when it expires
-- is not closed by anyone; query_due() lists it for the application to ask
-- the channel, and the answer is reported as a query (or close) result.
-- (Made, begun and looked at in one transaction: one now(), so the attempt
-- begins and query_due() looks before the expiry, however long the machine
-- pauses between the statements.)
BEGIN;
SELECT payidem.create_order(:'m1', 'T-0030', 400, 'Slow payer', expire_in => '1 second') AS o30 \gset
SELECT payidem.begin_payment(:'o30', 'FLOW_WX') AS p30 \gset
SELECT payidem.create_order(:'m1', 'T-0031', 400, 'Expired, no attempt', expire_in => '1 second') AS o31 \gset
SELECT payidem.create_order(:'m1', 'T-0032', 400, 'Not expired') AS o32 \gset
SELECT payidem.begin_payment(:'o32', 'FLOW_WX') AS p32 \gset
SELECT count(*) AS due_before_expiry FROM payidem.query_due(100) WHERE order_no IN (:'o30', :'o31', :'o32');
COMMIT;
SELECT pg_sleep(1.1);
CREATE TEMP TABLE qdue AS SELECT * FROM payidem.query_due(100);
SELECT payment_no = :'p30' AS is_p30, order_no = :'o30' AS is_o30, channel_no,
       expire_at = (SELECT o.expire_at FROM payidem."order" o WHERE o.order_no = :'o30') AS its_expiry
  FROM qdue WHERE order_no IN (:'o30', :'o31', :'o32');
-- leased for 60 s: not listed again meanwhile, also not to a second caller
SELECT count(*) AS listed_again FROM payidem.query_due(100) WHERE order_no = :'o30';
SELECT leased_until > now() + interval '50 seconds' AS leased FROM payidem.query_lease WHERE payment_no = :'p30';
-- a lease that ran out: listed again
UPDATE payidem.query_lease SET leased_until = now() - interval '1 second' WHERE payment_no = :'p30';
SELECT count(*) AS listed_after_lease FROM payidem.query_due(100) WHERE order_no = :'o30';
-- the channel says it was paid after all: the query result pays the order
SELECT payidem.apply_payment_result(:'p30', 'query', 'succeeded', 'WX-T-0030', 400) AS query_result;
SELECT status, pg_temp.events(order_no) AS events FROM payidem."order" WHERE order_no = :'o30';
UPDATE payidem.query_lease SET leased_until = now() - interval '1 second' WHERE payment_no = :'p30';
SELECT count(*) AS listed_once_paid FROM payidem.query_due(100) WHERE order_no = :'o30';
SELECT count(*) AS lease_dropped FROM payidem.query_lease WHERE payment_no = :'p30';

------------------------------------------------------------ what a success writes
-- The updates that pay an order and record the payment's success are HOT: no
-- index of "order" or payment names a column they change (status, paid_at,
-- paid_payment_no; transaction_id, the fees), so no index entry is written;
-- the expiry queue gets one row per order, at its creation, none at its
-- payment; the payment's keys trade its pending row for its paid one.  (The
-- backend's counts of earlier transactions are flushed first, so the
-- transaction's own are read.)
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT payidem.create_order(:'m1', 'HOT-0001', 700, 'Tea leaves') AS o_hot \gset
SELECT payidem.begin_payment(:'o_hot', 'FLOW_WX') AS p_hot \gset
SELECT count(*) AS queued_at_creation FROM payidem.order_expiry WHERE order_no = :'o_hot';
SELECT payidem.apply_payment_result(:'p_hot', 'callback', 'succeeded', 'WX-HOT-0001', 700) AS paid;
SELECT pg_stat_get_xact_tuples_updated('payidem."order"'::regclass) AS order_updates,
       pg_stat_get_xact_tuples_hot_updated('payidem."order"'::regclass) AS order_hot_updates,
       pg_stat_get_xact_tuples_updated('payidem.payment'::regclass) AS payment_updates,
       pg_stat_get_xact_tuples_hot_updated('payidem.payment'::regclass) AS payment_hot_updates;
SELECT count(*) AS queued_after_payment FROM payidem.order_expiry WHERE order_no = :'o_hot';
SELECT (SELECT count(*) FROM payidem.payment_pending WHERE order_no = :'o_hot') AS pending_keys,
       (SELECT transaction_id FROM payidem.payment_paid WHERE payment_no = :'p_hot') AS paid_key;
COMMIT;
-- an order written with the triggers off is not queued until the queue is
-- made again from the orders
SET session_replication_role = replica;
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (payidem.gen_order_no('PO'), :'m1', 'HOT-0002', 'Tea leaves', 700, now() + interval '1 hour')
RETURNING order_no AS o_off \gset
RESET session_replication_role;
SELECT count(*) AS queued_with_triggers_off FROM payidem.order_expiry WHERE order_no = :'o_off';
SELECT payidem.rebuild_expiry_queue() >= 1 AS rebuilt;
SELECT count(*) AS queued_after_rebuild FROM payidem.order_expiry WHERE order_no = :'o_off';
SELECT payidem.rebuild_expiry_queue() AS rebuilt_again;
-- an order's expire_at moved while pending queues the new time, and moved
-- back to a time already queued finds that row (ON CONFLICT DO NOTHING)
UPDATE payidem."order" SET expire_at = expire_at + interval '1 hour' WHERE order_no = :'o_off';
UPDATE payidem."order" SET expire_at = expire_at - interval '1 hour' WHERE order_no = :'o_off';
SELECT count(*) AS queued_after_moves FROM payidem.order_expiry WHERE order_no = :'o_off';
-- create_order()'s own order, with a number just drawn, is queued without that
-- pre-check (no queue row can hold a new number); any other insert of an
-- order keeps it: a queue row already there for the number (left here by
-- hand, as a reload after rows were removed under replica leaves them) is
-- the row, and the order is written
SELECT payidem.gen_order_no('PO') AS o_again \gset
INSERT INTO payidem.order_expiry (expire_at, order_no)
VALUES (date_trunc('hour', now()) + interval '3 hours', :'o_again');
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
VALUES (:'o_again', :'m1', 'HOT-0003', 'Tea leaves', 700, date_trunc('hour', now()) + interval '3 hours');
SELECT (SELECT count(*) FROM payidem."order" WHERE order_no = :'o_again') AS order_written,
       (SELECT count(*) FROM payidem.order_expiry WHERE order_no = :'o_again') AS queued_once;

-- The payment's keys follow every write of a payment, the flow's and a
-- DBA's own, and are what rebuild_payment_keys() makes from the payments
BEGIN;
SELECT payidem.create_order(:'m1', 'KEYS-0001', 700, 'Tea leaves') AS o_keys \gset
SELECT payidem.begin_payment(:'o_keys', 'FLOW_WX') AS p_keys \gset
SELECT count(*) AS pending_key FROM payidem.payment_pending WHERE order_no = :'o_keys' AND payment_no = :'p_keys';
SELECT * FROM pg_temp.try(format($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
                                   VALUES (payidem.gen_order_no('PY'), %L, %L, 'FLOW_WX', 700)$$, :'o_keys', :'m1'));
UPDATE payidem.payment SET status = 'closed', closed_at = now() WHERE payment_no = :'p_keys';
SELECT count(*) AS pending_keys_after_close FROM payidem.payment_pending WHERE order_no = :'o_keys';
SELECT payidem.apply_payment_result(:'p_keys', 'callback', 'succeeded', 'WX-KEYS-0001', 700) AS late_success;
SELECT transaction_id, paid_at IS NOT NULL AS has_paid_at FROM payidem.payment_paid WHERE payment_no = :'p_keys';
UPDATE payidem.payment SET transaction_id = 'WX-KEYS-0001-B' WHERE payment_no = :'p_keys';
SELECT transaction_id FROM payidem.payment_paid WHERE payment_no = :'p_keys';
SELECT * FROM pg_temp.try(format('UPDATE payidem.payment SET transaction_id = %L WHERE payment_no = %L',
                                 'WX-KEYS-0001-B', :'p_hot'));
-- an application's trigger that writes the payment again, firing before
-- status_keys (by name): the keys are those of the payment as it stands
CREATE FUNCTION pg_temp.touch_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
		UPDATE payidem.payment SET updated_at = clock_timestamp() WHERE payment_no = NEW.payment_no;
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER app_touch AFTER INSERT OR UPDATE ON payidem.payment FOR EACH ROW EXECUTE FUNCTION pg_temp.touch_payment();
SELECT payidem.create_order(:'m1', 'KEYS-0002', 700, 'Tea leaves') AS o_touch \gset
SELECT payidem.begin_payment(:'o_touch', 'FLOW_WX') AS p_touch \gset
SELECT count(*) AS pending_key_touched FROM payidem.payment_pending WHERE order_no = :'o_touch' AND payment_no = :'p_touch';
SELECT * FROM pg_temp.try(format($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
                                   VALUES (payidem.gen_order_no('PY'), %L, %L, 'FLOW_WX', 700)$$, :'o_touch', :'m1'));
SELECT payidem.apply_payment_result(:'p_touch', 'callback', 'succeeded', 'WX-KEYS-0002', 700) AS touched_success;
SELECT (SELECT count(*) FROM payidem.payment_pending WHERE order_no = :'o_touch') AS pending_keys_touched,
       (SELECT transaction_id FROM payidem.payment_paid WHERE payment_no = :'p_touch') AS paid_key_touched;
SELECT payidem.create_order(:'m1', 'KEYS-0003', 700, 'Tea leaves') AS o_touch2 \gset
SELECT payidem.begin_payment(:'o_touch2', 'FLOW_WX') AS p_touch2 \gset
SELECT payidem.apply_payment_result(:'p_touch2', 'callback', 'succeeded', 'WX-KEYS-0002', 700) AS same_txn_elsewhere;
DROP TRIGGER app_touch ON payidem.payment;
-- an application's trigger that gives the payment back the keys a statement
-- took from it (its own event comes before the statement's): one row each,
-- and the payment's own key is not taken for another's
CREATE FUNCTION pg_temp.restore_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.paid_at IS NOT NULL AND NEW.paid_at IS NULL THEN
		UPDATE payidem.payment SET paid_at = OLD.paid_at WHERE payment_no = NEW.payment_no;
	END IF;
	IF OLD.transaction_id IS NOT NULL AND NEW.transaction_id IS NULL THEN
		UPDATE payidem.payment SET transaction_id = OLD.transaction_id WHERE payment_no = NEW.payment_no;
	END IF;
	RETURN NULL;
END
$$;
SELECT payidem.create_order(:'m1', 'KEYS-0004', 700, 'Tea leaves') AS o_restore \gset
SELECT payidem.begin_payment(:'o_restore', 'FLOW_WX') AS p_restore \gset
SELECT payidem.create_order(:'m1', 'KEYS-0005', 700, 'Tea leaves') AS o_restore2 \gset
SELECT payidem.begin_payment(:'o_restore2', 'FLOW_WX') AS p_restore2 \gset
UPDATE payidem.payment SET paid_at = '2026-12-03 10:00:00+00' WHERE payment_no = :'p_restore';
UPDATE payidem.payment SET transaction_id = 'WX-KEYS-0005' WHERE payment_no = :'p_restore2';
CREATE TRIGGER a_restore AFTER UPDATE ON payidem.payment FOR EACH ROW EXECUTE FUNCTION pg_temp.restore_keys();
UPDATE payidem.payment SET paid_at = NULL WHERE payment_no = :'p_restore';
UPDATE payidem.payment SET transaction_id = NULL WHERE payment_no = :'p_restore2';
DROP TRIGGER a_restore ON payidem.payment;
SELECT payment_no = :'p_restore' AS first, transaction_id, paid_at FROM payidem.payment_paid
 WHERE payment_no IN (:'p_restore', :'p_restore2') ORDER BY 1 DESC;
-- a payment whose row both its old and its new keys find: replaced once
UPDATE payidem.payment SET paid_at = '2026-12-03 11:00:00+00' WHERE payment_no = :'p_restore2';
UPDATE payidem.payment SET paid_at = '2026-12-03 12:00:00+00' WHERE payment_no = :'p_restore2';
UPDATE payidem.payment SET transaction_id = NULL WHERE payment_no = :'p_restore2';
SELECT transaction_id, paid_at FROM payidem.payment_paid WHERE payment_no = :'p_restore2';
CREATE TEMP TABLE keys_before AS
	SELECT 'paid' AS k, channel_no, transaction_id, paid_at, payment_no FROM payidem.payment_paid
	UNION ALL SELECT 'pending', order_no, NULL, NULL, payment_no FROM payidem.payment_pending;
SELECT payidem.rebuild_payment_keys() = (SELECT count(*) FROM keys_before) AS rebuilt_all;
SELECT count(*) AS differences FROM (
	(SELECT * FROM keys_before
	 EXCEPT SELECT 'paid', channel_no, transaction_id, paid_at, payment_no FROM payidem.payment_paid
	 EXCEPT SELECT 'pending', order_no, NULL, NULL, payment_no FROM payidem.payment_pending)
	UNION ALL
	(SELECT 'paid', channel_no, transaction_id, paid_at, payment_no FROM payidem.payment_paid
	 UNION ALL SELECT 'pending', order_no, NULL, NULL, payment_no FROM payidem.payment_pending
	 EXCEPT SELECT * FROM keys_before)) d;
ROLLBACK;
-- a TRUNCATE of the payments (refused but in replica mode, where the
-- money-record guard stands aside) empties their keys too
BEGIN;
SELECT (SELECT count(*) FROM payidem.payment_pending) > 0 AS pending_keys,
       (SELECT count(*) FROM payidem.payment_paid) > 0 AS paid_keys;
SET LOCAL session_replication_role = replica;
TRUNCATE payidem.payment CASCADE;
RESET session_replication_role;
SELECT (SELECT count(*) FROM payidem.payment_pending) AS pending_keys_left,
       (SELECT count(*) FROM payidem.payment_paid) AS paid_keys_left;
ROLLBACK;

------------------------------------------------------------------- privileges
-- an application role reaches the flow only through the functions
CREATE ROLE flow_app;
SELECT payidem.grant_app('flow_app');
SELECT count(*) AS flow_functions_granted FROM payidem.app_functions() f
 WHERE f::text ~ '^payidem\.(create_order|begin_payment|apply_payment_result|close_payment|close_order|refund|apply_refund_result|notify_due|notify_result)\('
   AND has_function_privilege('flow_app', f, 'EXECUTE');
SELECT p.proname, p.prosecdef AS security_definer, p.proconfig AS settings
  FROM pg_proc p WHERE p.pronamespace = 'payidem'::regnamespace
   AND p.proname IN ('create_order', 'begin_payment', 'apply_payment_result', 'close_payment', 'close_order',
                     'refund', 'apply_refund_result', 'notify_due', 'notify_result')
 ORDER BY p.proname;
SET ROLE flow_app;
SELECT payidem.create_order(:'m2', 'N-0002', 500, 'Noodles to go') ~ '^PO' AS app_creates_orders;
SELECT payidem.begin_payment(payidem.create_order(:'m2', 'N-0003', 500, 'Noodles to go'), 'FLOW_FOOD') ~ '^PY'
       AS app_begins_payments;
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem."order"');
-- an application role gets begin_payment's own errors, not the helpers' privileges
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, NULL)',
							  payidem.create_order(:'m2', 'N-0005', 500, 'Noodles to go')));
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'on1', 'FLOW_FOOD'));
ROLLBACK;
-- and create_order's (a missing merchant_no, a bad out_trade_no, an unknown
-- merchant, another amount for a taken out_trade_no)
SELECT * FROM pg_temp.try('SELECT payidem.create_order(NULL, ''N-9'', 500, ''Noodles'')');
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 500, %L)', :'m2', 'N 9', 'Noodles'));
SELECT * FROM pg_temp.try('SELECT payidem.create_order(''M_NONE'', ''N-9'', 500, ''Noodles'')');
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 501, %L)', :'m2', 'N-0002', 'Noodles to go'));
-- a read-only transaction (a hot standby's too) refuses each write as its
-- statement would
BEGIN READ ONLY;
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 500, %L)', :'m2', 'N-RO', 'Noodles'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'on1', 'FLOW_FOOD'));
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.notify_due(10)');
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(1, true)');
ROLLBACK;
RESET ROLE;

-- a DBA who changed a column's type (a length on body, on channel_no): the
-- direct writes of create_order and begin_payment leave the row to their
-- INSERT statement, which casts as it always did
BEGIN;
ALTER TABLE payidem."order" ALTER COLUMN body TYPE varchar(2000);
ALTER TABLE payidem.payment ALTER COLUMN channel_no TYPE varchar(64);
SELECT payidem.begin_payment(payidem.create_order(:'m2', 'N-0004', 500, 'Noodles', body => 'extra chili'), 'FLOW_FOOD')
       ~ '^PY' AS still_begins;
SELECT o.body, p.channel_no FROM payidem."order" o JOIN payidem.payment p USING (order_no)
 WHERE o.out_trade_no = 'N-0004';
ROLLBACK;
-- a DBA's new rule on a format is create_order's rule for the argument at
-- once, with its own message, and is gone with its rollback
BEGIN;
ALTER DOMAIN payidem.merchant_ref ADD CONSTRAINT merchant_ref_no_z CHECK (VALUE !~ 'Z') NOT VALID;
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 500, %L)', :'m2', 'NZ-1', 'Noodles'));
ROLLBACK;
SELECT payidem.create_order(:'m2', 'NZ-1', 500, 'Noodles') ~ '^PO' AS created_after_the_rollback;
-- the order's defaults are compiled once and kept (currency's is a cast to a
-- domain): a DBA's new rule on that domain holds for the next order at once,
-- and goes with its rollback (from another session:
-- test/specs/flow_domain_change.spec)
BEGIN;
ALTER DOMAIN payidem.currency_code ADD CONSTRAINT currency_code_not_cny CHECK (VALUE <> 'CNY') NOT VALID;
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 500, %L)', :'m2', 'CUR-1', 'Noodles'));
ROLLBACK;
SELECT payidem.create_order(:'m2', 'CUR-1', 500, 'Noodles') ~ '^PO' AS created_in_cny_again;
-- create_order and begin_payment lock the rows their foreign keys reference
-- and leave those keys' checks out (test/specs/order_fkey_meanwhile.spec); a
-- DBA's own foreign key from the same columns is still checked
BEGIN;
CREATE TABLE public.allowed_merchant (merchant_no text PRIMARY KEY);
CREATE TABLE public.allowed_channel (channel_no text PRIMARY KEY);
ALTER TABLE payidem."order" ADD CONSTRAINT order_allowed_fkey
	FOREIGN KEY (merchant_no) REFERENCES public.allowed_merchant NOT VALID;
ALTER TABLE payidem.payment ADD CONSTRAINT payment_allowed_fkey
	FOREIGN KEY (channel_no) REFERENCES public.allowed_channel NOT VALID;
SELECT * FROM pg_temp.try(format('SELECT payidem.create_order(%L, %L, 500, %L)', :'m2', 'FK-DBA-1', 'Noodles'));
INSERT INTO public.allowed_merchant VALUES (:'m2');
SELECT payidem.create_order(:'m2', 'FK-DBA-1', 500, 'Noodles') AS fk_order \gset
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)', :'fk_order', 'FLOW_FOOD'));
INSERT INTO public.allowed_channel VALUES ('FLOW_FOOD');
SELECT payidem.begin_payment(:'fk_order', 'FLOW_FOOD') ~ '^PY' AS begins_once_allowed;
ROLLBACK;
-- ... and a DBA's BEFORE INSERT trigger that writes another channel than the
-- one begin_payment locked: payidem's own foreign key is checked on the row
-- as written
BEGIN;
CREATE FUNCTION public.reroute() RETURNS trigger LANGUAGE plpgsql AS
	$$ BEGIN NEW.channel_no := 'NO_SUCH_CHANNEL'; RETURN NEW; END $$;
CREATE TRIGGER reroute BEFORE INSERT ON payidem.payment FOR EACH ROW EXECUTE FUNCTION public.reroute();
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %L)',
							  payidem.create_order(:'m2', 'FK-DBA-2', 500, 'Noodles'), 'FLOW_FOOD'));
ROLLBACK;
-- ... and a DBA's statement trigger on "order" that changes the merchant's row
-- between create_order's read of it and the insert: the merchant, as this
-- transaction left it, is still the order's (no internal error)
BEGIN;
CREATE FUNCTION public.touch_merchant() RETURNS trigger LANGUAGE plpgsql AS
	$$ BEGIN UPDATE payidem.merchant SET updated_at = clock_timestamp(); RETURN NULL; END $$;
CREATE TRIGGER touch_merchant BEFORE INSERT ON payidem."order" FOR EACH STATEMENT
	EXECUTE FUNCTION public.touch_merchant();
SELECT payidem.create_order(:'m2', 'FK-DBA-3', 500, 'Noodles') ~ '^PO' AS created_after_own_change;
ROLLBACK;
-- ... and a trigger a DBA disabled whose function can no longer be called
-- (its C symbol gone from the library, as after an upgrade of it; made so
-- here by editing the catalog): the direct writes never look up the function
-- of a trigger that does not fire, as the trigger manager does not
BEGIN;
CREATE FUNCTION public.gone_trigger() RETURNS trigger LANGUAGE c AS '$libdir/payidem', 'payidem_status_guard';
UPDATE pg_catalog.pg_proc SET prosrc = 'payidem_no_such_function' WHERE oid = 'public.gone_trigger()'::regprocedure;
CREATE TRIGGER gone AFTER INSERT OR UPDATE ON payidem.payment FOR EACH ROW EXECUTE FUNCTION public.gone_trigger();
CREATE TRIGGER gone AFTER INSERT OR UPDATE ON payidem."order" FOR EACH ROW EXECUTE FUNCTION public.gone_trigger();
ALTER TABLE payidem.payment DISABLE TRIGGER gone;
ALTER TABLE payidem."order" DISABLE TRIGGER gone;
SELECT payidem.create_order(:'m2', 'GONE-1', 500, 'Noodles') AS gone_order \gset
SELECT payidem.begin_payment(:'gone_order', 'FLOW_FOOD') AS gone_payment \gset
SELECT payidem.apply_payment_result(:'gone_payment', 'callback', 'succeeded', 'GONE-TX-1', 500) AS applied_past_disabled;
SELECT status FROM payidem."order" WHERE order_no = :'gone_order';
ROLLBACK;
REVOKE ALL ON SCHEMA payidem FROM flow_app;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM flow_app;
DROP ROLE flow_app;
