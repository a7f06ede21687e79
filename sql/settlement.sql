--
-- settlement: DESIGN section 11 as one story, every figure exact.
--   1. the calendar: T<n> and D<n> over a weekend, a week of public holidays
--      and a worked Saturday (payidem.business_day);
--   2. payments and refunds of chosen days in the past (bill days in
--      payidem.bill_timezone, UTC here), fees and costs rounded half-up;
--   3. settle(): only what is due, a payment only once its channel's day is
--      reconciled and no open difference or anomaly names it (held, then
--      released and settled by the next run), each item once;
--   4. payouts: more than available (PI010), a repeated request, the same
--      out_payout_no with another amount (PI001), a frozen merchant (PI004),
--      the bank's success and failure, repeated and contradicting results,
--      the signed payout events;
--   5. the days after the holidays: reconcile()'s fee_mismatch and a bill
--      without fees, refunds' fee shares (the last refund taking the
--      remainder), a refund settled after the money was paid out driving the
--      balance negative and the next settlement repaying it, frozen and
--      closed merchants settled too, the reports; a merchant whose balance
--      would leave the bigint range held, the others settled;
--   6. adjust_balance();
--   7. the journal: its entries, append-only, the checks at commit, what
--      replica mode lets past them found by verify();
--   8. roles: the application, a finance role, a merchant's reporting role;
--   9. bad input of every new function.
-- Generated numbers (merchants, payments, payouts ...) are printed as labels,
-- times masked.
--
SET client_min_messages = warning;	-- (before: alone or after install, the same output)
CREATE EXTENSION IF NOT EXISTS payidem;
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, YMD';
SET payidem.bill_timezone = 'UTC';
\set VERBOSITY default
\set SHOW_CONTEXT never

-- the labels the output uses for generated numbers
CREATE TEMP TABLE lbl (no text PRIMARY KEY, label text NOT NULL UNIQUE);
GRANT SELECT ON lbl TO PUBLIC;	-- (the roles of part 8 read the labels too)
CREATE FUNCTION pg_temp.mask(t text) RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
	l record;
BEGIN
	FOR l IN SELECT no, label FROM pg_temp.lbl ORDER BY length(no) DESC LOOP
		t := replace(t, l.no, '<' || l.label || '>');
	END LOOP;
	t := regexp_replace(t, '(PO|PY|RF|PT|AJ)[0-9]{24}', '\1<number>', 'g');
	t := regexp_replace(t, '[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9.]+(\+00|Z)?', '<time>', 'g');
	RETURN t;
END
$$;
CREATE FUNCTION pg_temp.l(no text) RETURNS text LANGUAGE sql STABLE AS $$
	SELECT coalesce((SELECT label FROM pg_temp.lbl WHERE lbl.no = l.no), no)
$$;
-- errors as rows: SQLSTATE, message, detail, hint (masked); no error: the result
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
DECLARE
	v_result text;
BEGIN
	IF stmt ~* '^\s*(SELECT|WITH|UPDATE|DELETE|INSERT)' THEN
		EXECUTE stmt INTO v_result;
	ELSE
		EXECUTE 'SELECT (' || stmt || ')::text' INTO v_result;
	END IF;
	RETURN QUERY SELECT '00000', 'no error', 'result: ' || coalesce(pg_temp.mask(v_result), 'NULL'), NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := pg_temp.mask(err_message);
	err_detail := pg_temp.mask(err_detail);
	err_hint := pg_temp.mask(err_hint);
	RETURN NEXT;
END
$$;

-- verify()'s rows about this story (the other suites of this database leave
-- rows written in replica mode on purpose, e.g. a success without its
-- transaction id in reconciliation), masked
CREATE FUNCTION pg_temp.verify()
RETURNS TABLE (invariant text, subject text, detail text)
LANGUAGE sql AS $$
	SELECT v.invariant, pg_temp.mask(v.subject), pg_temp.mask(v.detail)
	  FROM payidem.verify() v
	 WHERE EXISTS (SELECT 1 FROM pg_temp.lbl WHERE position(lbl.no IN v.subject) > 0)
		OR v.subject LIKE '%TAMPER%'
	 ORDER BY 1, 2
$$;

-- settle() reads the bill days from settle_state.scan_from on (it moves past
-- what is settled); this story's days are in the past: read from the start
UPDATE payidem.settle_state SET scan_from = NULL;

-------------------------------------------------------------- 1. the calendar
-- Autumn 2026: Thursday 1 to Wednesday 7 October are the National Day
-- holidays (with the weekend between), Saturday 10 October is worked.
INSERT INTO payidem.business_day (day, business, note)
SELECT d::date, false, 'National Day' FROM generate_series(date '2026-10-01', date '2026-10-07', '1 day') d
 WHERE extract(isodow FROM d) < 6;
INSERT INTO payidem.business_day (day, business, note) VALUES ('2026-10-10', true, 'worked Saturday');
-- each day's settlement day on every cycle the story uses: T<n> is the n-th
-- business day after the day, whatever the day is (Saturday's T1 is the next
-- business day, as Friday's); D<n> n calendar days later; T0 and D0 the day
SELECT d::date AS day, to_char(d, 'Dy') AS dow, payidem._is_business_day(d::date) AS business,
       payidem._settle_day(d::date, 'T0') AS t0, payidem._settle_day(d::date, 'T1') AS t1,
       payidem._settle_day(d::date, 'T2') AS t2, payidem._settle_day(d::date, 'D0') AS d0,
       payidem._settle_day(d::date, 'D1') AS d1
  FROM generate_series(date '2026-09-29', date '2026-10-12', '1 day') d ORDER BY 1;

--------------------------------------------------------------------- 2. set-up
SELECT payidem.create_channel('ST_WX', 'wechat', 0.0025);
SELECT payidem.create_channel('ST_ALI', 'alipay', 0.003);
-- the merchants: T1 (the main story), D0, D1, T2
SELECT merchant_no AS mt, api_key AS mt_key FROM payidem.create_merchant('Tea House', 'retail', 0.005, 'T1') \gset
SELECT merchant_no AS md0 FROM payidem.create_merchant('Noodle Bar', 'retail', 0.006, 'D0') \gset
SELECT merchant_no AS md1 FROM payidem.create_merchant('Book Stall', 'retail', 0.006, 'D1') \gset
SELECT merchant_no AS mt2 FROM payidem.create_merchant('Bike Shop', 'retail', 0.006, 'T2') \gset
INSERT INTO lbl VALUES (:'mt', 'T1 tea'), (:'md0', 'D0 noodles'), (:'md1', 'D1 books'), (:'mt2', 'T2 bikes');
SELECT payidem.bind_channel(:'mt', 'ST_WX'), payidem.bind_channel(:'md0', 'ST_ALI'),
       payidem.bind_channel(:'md1', 'ST_ALI'), payidem.bind_channel(:'mt2', 'ST_ALI');

-- A payment paid at a chosen time in the past: its attempt begun a minute
-- before (created_at moved back, as if made then), the success reported
-- with that paid_at (within the attempt's lifetime).
CREATE FUNCTION pg_temp.pay(p_label text, p_merchant text, p_channel text, p_amount bigint, p_paid_at timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_order text := payidem.create_order(p_merchant, 'ST-' || p_label, p_amount, 'settlement ' || p_label);
	v_pay text := payidem.begin_payment(v_order, p_channel);
BEGIN
	UPDATE payidem.payment SET created_at = p_paid_at - interval '1 minute' WHERE payment_no = v_pay;
	PERFORM payidem.apply_payment_result(v_pay, 'callback', 'succeeded', 'TX-' || p_label, p_amount, p_paid_at);
	INSERT INTO pg_temp.lbl VALUES (v_pay, p_label);
	RETURN v_pay;
END
$$;
-- A refund that succeeded at a chosen time in the past.
CREATE FUNCTION pg_temp.refund(p_label text, p_payment text, p_amount bigint, p_refunded_at timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_refund text := payidem.refund(p_payment, p_amount, 'ST-' || p_label);
BEGIN
	PERFORM payidem.apply_refund_result(v_refund, 'succeeded', 'TXR-' || p_label);
	UPDATE payidem.refund SET refunded_at = p_refunded_at, created_at = p_refunded_at - interval '1 minute'
	 WHERE refund_no = v_refund;
	INSERT INTO pg_temp.lbl VALUES (v_refund, p_label);
	RETURN v_refund;
END
$$;

-- T1 tea (fee 0.5 %) on ST_WX (cost 0.25 %); the others (0.6 %) on ST_ALI (0.3 %)
SELECT pg_temp.pay('P1', :'mt', 'ST_WX', 10000, '2026-09-29 10:00:00+00') AS p1,  -- Tue
       pg_temp.pay('P2', :'mt', 'ST_WX',  1000, '2026-09-30 09:00:00+00') AS p2,  -- Wed, before the holidays
       pg_temp.pay('P3', :'mt', 'ST_WX',  2000, '2026-10-03 12:00:00+00') AS p3,  -- Sat, in the holidays
       pg_temp.pay('P4', :'mt', 'ST_WX',  3000, '2026-10-08 08:00:00+00') AS p4,  -- Thu, first business day
       pg_temp.pay('P5', :'mt', 'ST_WX',  6000, '2026-10-09 18:00:00+00') AS p5,  -- Fri
       pg_temp.pay('P6', :'mt', 'ST_WX',  4000, '2026-10-10 11:00:00+00') AS p6,  -- the worked Saturday
       pg_temp.pay('Q1', :'md0', 'ST_ALI', 1500, '2026-10-03 20:00:00+00') AS q1, -- Sat, D0
       pg_temp.pay('Q2', :'md1', 'ST_ALI', 2500, '2026-09-30 23:59:59+00') AS q2, -- Wed, D1
       pg_temp.pay('Q3', :'mt2', 'ST_ALI', 4000, '2026-09-30 00:00:00+00') AS q3, -- Wed, T2
       pg_temp.pay('Q4', :'mt2', 'ST_ALI', 1000, '2026-10-09 12:00:00+00') AS q4  -- Fri, T2
\gset
-- P1 refunded in full; P2 in three parts, the last completing it
SELECT pg_temp.refund('R1', :'p1', 10000, '2026-10-08 09:00:00+00') AS r1,
       pg_temp.refund('R2a', :'p2', 100, '2026-10-08 10:00:00+00') AS r2a,
       pg_temp.refund('R2b', :'p2', 300, '2026-10-08 11:00:00+00') AS r2b,
       pg_temp.refund('R2c', :'p2', 600, '2026-10-09 10:00:00+00') AS r2c
\gset
-- P4: after its success the channel reports it failed: rejected, an open
-- anomaly names it
SELECT payidem.apply_payment_result(:'p4', 'query', 'failed') AS p4_contradicted;
SELECT kind, pg_temp.l(payment_no) AS payment, handle_status FROM payidem.anomaly WHERE payment_no = :'p4';
SELECT anomaly_id AS p4_anomaly FROM payidem.anomaly WHERE payment_no = :'p4' \gset

-- every payment: its bill day, fee (amount x merchant rate) and cost (amount
-- x channel rate), half-up: 1000 x 0.25 % = 2.5 -> 3, 3000 x 0.25 % = 7.5 -> 8
SELECT pg_temp.l(p.payment_no) AS payment, pg_temp.l(p.merchant_no) AS merchant, p.channel_no,
       (p.paid_at AT TIME ZONE 'UTC')::date AS bill_day, p.amount, p.fee_amount, p.cost_amount,
       p.status, p.refunded_amount
  FROM payidem.payment p JOIN lbl ON lbl.no = p.payment_no ORDER BY 1;
SELECT pg_temp.l(r.refund_no) AS refund, pg_temp.l(r.payment_no) AS payment,
       (r.refunded_at AT TIME ZONE 'UTC')::date AS bill_day, r.amount, r.status
  FROM payidem.refund r JOIN lbl ON lbl.no = r.refund_no ORDER BY 1;

-- what the story reads after each step
CREATE FUNCTION pg_temp.settle(d date)
RETURNS TABLE (merchant text, currency text, items bigint, gross numeric, refunds numeric, fees numeric,
			   net numeric, held bigint)
LANGUAGE sql AS $$
	SELECT pg_temp.l(s.merchant_no), s.currency, s.items, s.gross, s.refunds, s.fees, s.net, s.held
	  FROM payidem.settle(d) s
	 WHERE s.merchant_no IN (SELECT no FROM pg_temp.lbl)
	 ORDER BY 1
$$;
CREATE FUNCTION pg_temp.balances()
RETURNS TABLE (merchant text, currency text, pending numeric, available bigint, in_payout bigint)
LANGUAGE sql AS $$
	SELECT pg_temp.l(b.merchant_no), b.currency, b.pending, b.available, b.in_payout
	  FROM payidem.merchant_balances b
	 WHERE b.merchant_no IN (SELECT no FROM pg_temp.lbl)
	 ORDER BY 1
$$;
CREATE FUNCTION pg_temp.items(d date)
RETURNS TABLE (item text, item_type text, payment text, bill_day date, settle_day date, amount bigint,
			   fee bigint, cost bigint)
LANGUAGE sql AS $$
	SELECT pg_temp.l(si.item_no), si.item_type, pg_temp.l(si.payment_no), si.bill_day, si.settle_day,
		   si.amount, si.fee, si.cost
	  FROM payidem.settlement_item si
	 WHERE si.settle_date = d AND si.merchant_no IN (SELECT no FROM pg_temp.lbl)
	 ORDER BY si.settled_at, 1
$$;
CREATE FUNCTION pg_temp.held()
RETURNS TABLE (payment text)
LANGUAGE sql AS $$
	SELECT pg_temp.l(h.payment_no) FROM payidem.settlement_hold h
	 WHERE h.payment_no IN (SELECT no FROM pg_temp.lbl) ORDER BY 1
$$;

-- before any settlement: everything pending, amounts less fees, refunds
-- less their fee shares.  T1 tea: 9950 + 995 + 1990 + 2985 + 5970 + 3980
-- from its payments, less 9950 + 99 + 299 + 597 for its refunds = 14925.
SELECT * FROM pg_temp.balances();

-------------------------------------------------------------- 3. settlement
-- 30 September: P1 (Tue, T1 = Wed) is due, but its day is not reconciled
SELECT * FROM pg_temp.settle('2026-09-30');
SELECT * FROM pg_temp.held();
-- the day's bill, reconciled
SELECT payidem.load_bill('ST_WX', '2026-09-29', E'ST_WX,2026-09-29,TX-P1,,10000,25,succeeded,2026-09-29 10:00:00\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-09-29');
-- the next run settles it: 10000 less its fee 50
SELECT * FROM pg_temp.settle('2026-09-30');
SELECT * FROM pg_temp.items('2026-09-30');
SELECT * FROM pg_temp.held();
-- again: nothing more (each item once)
SELECT * FROM pg_temp.settle('2026-09-30');
SELECT * FROM payidem.balance(:'mt');

------------------------------------------------------------------ 4. payouts
-- the merchant's own notification URL, where payout events go
SELECT payidem.set_merchant_notify_url(:'mt', 'https://tea.example/payouts');
-- more than available: PI010
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 9951, %L)', :'mt', 'PAY-0'));
-- a payout of 4000; the same request again is the same payout; the same
-- out_payout_no with another amount is PI001
SELECT payidem.request_payout(:'mt', 4000, 'PAY-1') AS pt1 \gset
INSERT INTO lbl VALUES (:'pt1', 'PT1');
SELECT payidem.request_payout(:'mt', 4000, 'PAY-1') = :'pt1' AS same_payout;
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 4500, %L)', :'mt', 'PAY-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 4000, %L, %L)', :'mt', 'PAY-1', 'USD'));
SELECT pg_temp.l(payout_no) AS payout, out_payout_no, amount, currency, status FROM payidem.payout WHERE merchant_no = :'mt';
SELECT * FROM payidem.balance(:'mt');
-- a second payout may take only what is left: 5950
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 5951, %L)', :'mt', 'PAY-2'));
SELECT payidem.request_payout(:'mt', 5950, 'PAY-2') AS pt2 \gset
INSERT INTO lbl VALUES (:'pt2', 'PT2');
SELECT * FROM payidem.balance(:'mt');
-- the bank: PT1 succeeded (again: duplicate; a contradicting failure:
-- rejected, an anomaly, nothing else changes); PT2 failed, its money
-- returns to available
SELECT payidem.apply_payout_result(:'pt1', 'succeeded', 'BANK-1') AS pt1_result;
SELECT payidem.apply_payout_result(:'pt1', 'succeeded', 'BANK-1') AS pt1_again;
SELECT payidem.apply_payout_result(:'pt1', 'succeeded') AS pt1_again_without_ref;
SELECT payidem.apply_payout_result(:'pt1', 'failed', 'BANK-1') AS pt1_contradicted;
SELECT payidem.apply_payout_result(:'pt1', 'succeeded', 'BANK-9') AS pt1_other_ref;
SELECT kind, amount, pg_temp.mask(detail::text) AS detail, handle_status
  FROM payidem.anomaly WHERE kind = 'conflicting_payout_result' AND detail ->> 'merchant_no' = :'mt'
 ORDER BY anomaly_id;
SELECT payidem.apply_payout_result(:'pt2', 'failed', 'BANK-2') AS pt2_result;
SELECT payidem.apply_payout_result(:'pt2', 'failed') AS pt2_again;
SELECT pg_temp.l(payout_no) AS payout, out_payout_no, amount, status, bank_ref, finished_at IS NOT NULL AS finished
  FROM payidem.payout WHERE merchant_no = :'mt' ORDER BY created_at, out_payout_no;
SELECT * FROM payidem.balance(:'mt');
-- frozen: no payout (PI004); a repeat of an earlier request still answers
SELECT payidem.freeze_merchant(:'mt');
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', :'mt', 'PAY-3'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 4000, %L)', :'mt', 'PAY-1'));
SELECT payidem.unfreeze_merchant(:'mt');
-- the rest, 5950, paid out
SELECT payidem.request_payout(:'mt', 5950, 'PAY-3') AS pt3 \gset
INSERT INTO lbl VALUES (:'pt3', 'PT3');
SELECT payidem.apply_payout_result(:'pt3', 'succeeded', 'BANK-3') AS pt3_result;
SELECT * FROM payidem.balance(:'mt');
-- the payout events: one per payout that ended, to the merchant's URL, no
-- order; the payload names the payout; signed, the receiver's check passes
SELECT pg_temp.l(payout_no) AS payout, event, order_no IS NULL AS no_order, status
  FROM payidem.notify_event WHERE merchant_no = :'mt' AND payout_no IS NOT NULL ORDER BY event_id;
CREATE TEMP TABLE handed AS
	SELECT * FROM payidem.notify_due(10000) WHERE merchant_no IN (SELECT no FROM lbl);
SELECT order_no IS NULL AS no_order, pg_temp.l(merchant_no) AS merchant, notify_url, event,
       regexp_replace(pg_temp.mask(payload), '"event_id":[0-9]+', '"event_id":<id>') AS payload,
       signature ~ '^t=[0-9]+,v1=[0-9a-f]{64},v2=[0-9a-f]{64}$' AS signed, attempt,
       payidem.verify_notification(:'mt_key', payload, signature) AS verifies,
       (payload::jsonb ->> 'event_id')::bigint = event_id AS event_id_in_payload
  FROM handed ORDER BY event_id;
SELECT payidem.notify_result(event_id, true, '200 OK') FROM handed ORDER BY event_id;
SELECT pg_temp.l(payout_no) AS payout, event, status, attempts
  FROM payidem.notify_event WHERE merchant_no = :'mt' AND payout_no IS NOT NULL ORDER BY event_id;

----------------------------------------- 5. the holidays and the week after
-- ST_ALI's Wednesday and Saturday, reconciled (its bill lines carry no fee:
-- no fee is compared)
SELECT payidem.load_bill('ST_ALI', '2026-09-30', E'ST_ALI,2026-09-30,TX-Q2,,2500,,succeeded,\nST_ALI,2026-09-30,TX-Q3,,4000,,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_ALI', '2026-09-30');
SELECT payidem.load_bill('ST_ALI', '2026-10-03', E'ST_ALI,2026-10-03,TX-Q1,,1500,,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_ALI', '2026-10-03');
-- D0 noodles frozen, D1 books closed: they are settled all the same
SELECT payidem.freeze_merchant(:'md0');
SELECT payidem.close_merchant(:'md1');
-- 3 October (Sat): Q1 (D0: the day itself) and Q2 (Wed, D1: 1 October, a
-- holiday; a missed day is caught up); T1 tea's P2 (Wed) is not due before
-- 8 October, T2 bikes' Q3 (Wed) not before 9 October
SELECT * FROM pg_temp.settle('2026-10-03');
SELECT * FROM pg_temp.items('2026-10-03');
-- a frozen or closed merchant is not paid out
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', :'md0', 'NB-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', :'md1', 'BS-1'));

-- 8 October (Thu, first business day): P2 (Wed) and P3 (Sat) are due, their
-- days are not reconciled: both held
SELECT * FROM pg_temp.settle('2026-10-08');
SELECT * FROM pg_temp.held();
-- Wednesday's bill matches; Saturday's charges P3 a fee of 6 where its cost
-- is 5: fee_mismatch
SELECT payidem.load_bill('ST_WX', '2026-09-30', E'ST_WX,2026-09-30,TX-P2,,1000,3,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-09-30');
SELECT payidem.load_bill('ST_WX', '2026-10-03', E'ST_WX,2026-10-03,TX-P3,,2000,6,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-10-03');
SELECT diff_type, pg_temp.l(payment_no) AS payment, platform_amount, channel_amount, platform_fee, channel_fee,
       handle_status
  FROM payidem.reconciliation WHERE channel_no = 'ST_WX' ORDER BY bill_date, recon_id;
SELECT recon_id AS p3_diff FROM payidem.reconciliation WHERE payment_no = :'p3' \gset
-- P2 settled: 1000 less its fee 5; P3 still held
SELECT * FROM pg_temp.settle('2026-10-08');
SELECT * FROM pg_temp.held();
-- the difference resolved (the channel owes the fen back): P3 settled by
-- the next run, 2000 less 10
SELECT payidem.resolve_diff(:p3_diff, 'handled', 'channel overcharged 1 fen, claimed back');
SELECT * FROM pg_temp.settle('2026-10-08');
SELECT * FROM pg_temp.items('2026-10-08');
SELECT * FROM pg_temp.held();
SELECT * FROM payidem.balance(:'mt');

-- 9 October (Fri): Thursday's items are due.  Thursday's bill (its line
-- without a fee: nothing compared) matches P4, but the open anomaly of P4
-- holds it.  The refunds are never held: R1 returns all of P1 (paid out long
-- ago) with its whole fee 50 and cost 25; R2a and R2b their shares of P2's
-- fee 5 and cost 3: the fee (cost) of the refunded amount so far less that of
-- the amount before, each rounded half-up (R2a: 100/1000 x 5 = 0.5 -> 1,
-- x 3 = 0.3 -> 0; R2b: 400/1000 x 5 = 2 less 1 = 1, x 3 = 1.2 -> 1 less 0 = 1).  T2 bikes' Q3 (Wed, T2: Thu, Fri).
SELECT payidem.load_bill('ST_WX', '2026-10-08', E'ST_WX,2026-10-08,TX-P4,,3000,,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-10-08');
SELECT * FROM pg_temp.settle('2026-10-09');
SELECT * FROM pg_temp.items('2026-10-09');
SELECT * FROM pg_temp.held();
-- T1 tea's available balance is negative: 2985 - 10348; no payout until
-- it is positive again
SELECT * FROM payidem.balance(:'mt');
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 1, %L)', :'mt', 'PAY-4'));

-- 10 October (the worked Saturday): the anomaly resolved, Friday's bills
-- reconciled: P4 (Thu), P5 (Fri, T1: the worked Saturday) and R2c, the
-- refund that completes P2, taking what is left of its fee and cost (5 - 2 =
-- 3; 3 - 1 = 2): P2's refunds return exactly its fee and cost.  The settlement repays the negative balance.
SELECT payidem.resolve_anomaly(:p4_anomaly, 'handled', 'the failure report was stale');
SELECT payidem.load_bill('ST_WX', '2026-10-09', E'ST_WX,2026-10-09,TX-P5,,6000,15,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-10-09');
SELECT payidem.load_bill('ST_ALI', '2026-10-09', E'ST_ALI,2026-10-09,TX-Q4,,1000,3,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_ALI', '2026-10-09');
SELECT * FROM pg_temp.settle('2026-10-10');
SELECT * FROM pg_temp.items('2026-10-10');
SELECT pg_temp.l(payment_no) AS payment, count(*) AS refunds, sum(amount) AS refunded, sum(fee) AS fee_returned,
       sum(cost) AS cost_returned
  FROM payidem.settlement_item WHERE item_type = 'refund' AND payment_no IN (:'p1', :'p2') GROUP BY payment_no ORDER BY 1;
SELECT * FROM pg_temp.held();
-- what is left pending: P6 (Sat, T1: Monday), Q4 (Fri, T2: Sat, Mon)
SELECT * FROM pg_temp.balances();
SELECT * FROM payidem.balance(:'mt');

-- 12 October (Mon): the last ones, once the worked Saturday is reconciled
SELECT payidem.load_bill('ST_WX', '2026-10-10', E'ST_WX,2026-10-10,TX-P6,,4000,10,succeeded,\n') AS lines;
SELECT * FROM payidem.reconcile('ST_WX', '2026-10-10');
SELECT * FROM pg_temp.settle('2026-10-12');
SELECT * FROM pg_temp.items('2026-10-12');
-- nothing left: a run of any later day adds nothing
SELECT * FROM pg_temp.settle('2026-12-31');
SELECT * FROM pg_temp.balances();

-- the reports: the items per settlement day (P4, due on the 9th and held
-- until the 10th, counts on the 9th), the platform's margin per bill day
SELECT pg_temp.l(merchant_no) AS merchant, settle_day, currency, items, gross, refunds, fees, net
  FROM payidem.settlement_summary WHERE merchant_no IN (SELECT no FROM lbl) ORDER BY settle_day, 1;
SELECT bill_day, channel_no, currency, fee_revenue, channel_cost, margin
  FROM payidem.platform_margin WHERE channel_no IN ('ST_WX', 'ST_ALI') ORDER BY bill_day, channel_no;

-- a merchant whose balance would leave the bigint range (amounts up to the
-- bigint maximum are accepted) is held whole, and the others are settled
BEGIN;
SELECT payidem.create_channel('ST_BIG', 'epay', 0);
SELECT merchant_no AS mh FROM payidem.create_merchant('Huge Deals', 'retail', 0, 'D0') \gset
SELECT merchant_no AS ms FROM payidem.create_merchant('Small Deals', 'retail', 0.006, 'D0') \gset
INSERT INTO lbl VALUES (:'mh', 'D0 huge'), (:'ms', 'D0 small');
SELECT payidem.bind_channel(:'mh', 'ST_BIG'), payidem.bind_channel(:'ms', 'ST_BIG');
SELECT payidem.apply_payment_result(payidem.begin_payment(payidem.create_order(:'mh', 'BIG-' || i, 5000000000000000000, 'big'), 'ST_BIG'),
                                    'callback', 'succeeded', 'TX-BIG-' || i, 5000000000000000000, now()) AS big
  FROM generate_series(1, 2) i;
SELECT payidem.apply_payment_result(payidem.begin_payment(payidem.create_order(:'ms', 'BIG-3', 1000, 'small'), 'ST_BIG'),
                                    'callback', 'succeeded', 'TX-BIG-3', 1000, now()) AS small;
SELECT payidem.load_bill('ST_BIG', current_date, E',,TX-BIG-1,,5000000000000000000,,succeeded,\n'
                         ',,TX-BIG-2,,5000000000000000000,,succeeded,\n,,TX-BIG-3,,1000,,succeeded,\n') AS lines;
SELECT matched FROM payidem.reconcile('ST_BIG', current_date);
SELECT * FROM pg_temp.settle(current_date);
SELECT * FROM pg_temp.balances();
ROLLBACK;

-------------------------------------------------------------- 6. adjustments
-- a credit, the same again (the same adjustment), the same number with
-- another amount (PI001); a debit; a closed merchant's balance paid out by
-- an adjustment
SELECT payidem.adjust_balance(:'mt', 500, 'ADJ-1', 'goodwill credit for a late payout') AS aj1 \gset
INSERT INTO lbl VALUES (:'aj1', 'AJ1');
SELECT payidem.adjust_balance(:'mt', 500, 'ADJ-1', 'goodwill credit for a late payout') = :'aj1' AS same_adjustment;
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 600, %L, %L)', :'mt', 'ADJ-1', 'goodwill'));
SELECT payidem.adjust_balance(:'mt', -120, 'ADJ-2', 'chargeback fee of P5') AS aj2 \gset
INSERT INTO lbl VALUES (:'aj2', 'AJ2');
SELECT payidem.adjust_balance(:'md1', -2485, 'ADJ-1', 'paid out by bank transfer after closing') AS aj3 \gset
INSERT INTO lbl VALUES (:'aj3', 'AJ3');
SELECT pg_temp.l(adjust_no) AS adjustment, pg_temp.l(merchant_no) AS merchant, out_adjust_no, amount, currency, reason
  FROM payidem.adjustment WHERE merchant_no IN (SELECT no FROM lbl) ORDER BY created_at, adjust_no;
SELECT * FROM pg_temp.balances();

--------------------------------------------------------------- 7. the journal
-- a settled payment, a refund's share, a payout and its result, an adjustment
SELECT pg_temp.mask(journal_no) AS journal, account, pg_temp.l(merchant_no) AS merchant, channel_no, amount
  FROM payidem.ledger_entry
 WHERE journal_no IN (:'p2', :'r2c', :'pt2', :'pt2' || '/failed', :'pt1' || '/succeeded', :'aj2')
 ORDER BY entry_id;
-- every account of the story's merchants and channels, summed
SELECT account, pg_temp.l(merchant_no) AS merchant, channel_no, sum(amount) AS total
  FROM payidem.ledger_entry
 WHERE merchant_no IN (SELECT no FROM lbl) OR channel_no IN ('ST_WX', 'ST_ALI')
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
-- the story's journals, account by account: they balance (debit positive,
-- credit negative)
SELECT coalesce(account, 'total') AS account, sum(amount) AS total
  FROM payidem.ledger_entry WHERE source_no IN (SELECT no FROM lbl)
 GROUP BY ROLLUP (account) ORDER BY account IS NULL, account;
-- the journal is append-only
SELECT * FROM pg_temp.try('UPDATE payidem.ledger_entry SET amount = amount');
SELECT * FROM pg_temp.try('DELETE FROM payidem.ledger_entry');
-- a payout's status follows the whitelist (pending -> succeeded | failed)
SELECT * FROM pg_temp.try(format('UPDATE payidem.payout SET status = %L WHERE payout_no = %L', 'pending', :'pt1'));
SELECT * FROM pg_temp.try(format('UPDATE payidem.payout SET status = %L WHERE payout_no = %L', 'failed', :'pt1'));
-- a journal that does not balance, a balance moved without its entries:
-- refused at commit (PI002)
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M7SETTAMPER00001', 'Tamper Test', 'retail', 0.006, 'ak_settlement_tamper_01');
BEGIN;
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
VALUES ('TAMPER-1', 'merchant_available', 'M7SETTAMPER00001', 'CNY', -100, 'TAMPER-1');
COMMIT;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
BEGIN;
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
VALUES ('TAMPER-2', 'merchant_available', 'M7SETTAMPER00001', 'CNY', -100, 'TAMPER-2'),
       ('TAMPER-2', 'adjustment', NULL, 'CNY', 100, 'TAMPER-2');
COMMIT;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
BEGIN;
INSERT INTO payidem.merchant_balance (merchant_no, currency, available) VALUES ('M7SETTAMPER00001', 'CNY', 100);
COMMIT;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- both in one transaction, each written alone: the rules hold at commit
BEGIN;
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
VALUES ('TAMPER-3', 'merchant_available', 'M7SETTAMPER00001', 'CNY', -100, 'TAMPER-3');
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
VALUES ('TAMPER-3', 'adjustment', NULL, 'CNY', 100, 'TAMPER-3');
INSERT INTO payidem.merchant_balance (merchant_no, currency, available) VALUES ('M7SETTAMPER00001', 'CNY', 100);
SELECT * FROM pg_temp.verify();
ROLLBACK;
-- what replica mode lets past the triggers, verify() finds
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
VALUES ('TAMPER-4', 'merchant_available', 'M7SETTAMPER00001', 'CNY', -100, 'TAMPER-4');
UPDATE payidem.merchant_balance SET available = available + 1 WHERE merchant_no = :'mt2';
UPDATE payidem.settlement_item SET fee = fee + 1 WHERE item_no = :'r2a';
SELECT * FROM pg_temp.verify();
ROLLBACK;
SET session_replication_role = replica;
DELETE FROM payidem.merchant WHERE merchant_no = 'M7SETTAMPER00001';
RESET session_replication_role;
-- the books are right
SELECT * FROM pg_temp.verify();

------------------------------------------------------------------ 8. roles
-- the application (grant_app): payouts and balance(), of every merchant; a
-- finance role (grant_finance): settle(), adjust_balance(),
-- set_merchant_notify_url() and the auditor's reads; a merchant's reporting
-- role (map_merchant_role) given balance(): its own merchant only
CREATE ROLE regress_settle_app;
SELECT payidem.grant_app('regress_settle_app');
CREATE ROLE regress_settle_finance;
SELECT payidem.grant_finance('regress_settle_finance');
CREATE ROLE regress_settle_report;
SELECT payidem.map_merchant_role('regress_settle_report', :'mt');
GRANT EXECUTE ON FUNCTION payidem.balance(text, text) TO regress_settle_report;
SELECT r AS role, f AS function, has_function_privilege(r, f, 'EXECUTE') AS may
  FROM unnest(ARRAY['regress_settle_app', 'regress_settle_finance', 'regress_settle_report']) r,
       unnest(ARRAY['payidem.settle(date)', 'payidem.request_payout(text,bigint,text,text)',
                    'payidem.apply_payout_result(text,text,text)', 'payidem.balance(text,text)',
                    'payidem.adjust_balance(text,bigint,text,text,text)',
                    'payidem.set_merchant_notify_url(text,text)', 'payidem.verify()']) f
 ORDER BY 1, 2;
SET ROLE regress_settle_app;
SELECT * FROM payidem.balance(:'mt');
SELECT * FROM payidem.balance(:'mt2');
SELECT payidem.request_payout(:'mt', 5000, 'PAY-5') AS pt5 \gset
SELECT * FROM payidem.balance(:'mt');
SELECT payidem.apply_payout_result(:'pt5', 'succeeded', 'BANK-5') AS pt5_result;
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.settle(''2026-12-31'')');
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L)', :'mt', 'ADJ-APP', 'why'));
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.ledger_entry');
RESET ROLE;
INSERT INTO lbl VALUES (:'pt5', 'PT5');
SET ROLE regress_settle_report;
SELECT * FROM payidem.balance(:'mt');
SELECT * FROM pg_temp.try(format('SELECT b::text FROM payidem.balance(%L) b', :'mt2'));
SELECT * FROM pg_temp.try(format('SELECT b::text FROM payidem.balance(%L) b', 'M0000000000000000'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 1, %L)', :'mt', 'PAY-REP'));
RESET ROLE;
SET ROLE regress_settle_finance;
SELECT count(*) AS settled_again FROM payidem.settle('2026-12-31') WHERE merchant_no IN (SELECT no FROM lbl);
SELECT payidem.adjust_balance(:'mt2', 6, 'BK-ADJ-1', 'fee refund') IS NOT NULL AS adjusted;
SELECT payidem.set_merchant_notify_url(:'mt2', 'https://bikes.example/payouts');
SELECT * FROM pg_temp.balances();
SELECT pg_temp.l(merchant_no) AS merchant, settle_day, items, net
  FROM payidem.settlement_summary WHERE merchant_no = :'mt2' ORDER BY settle_day;
SELECT bill_day, fee_revenue, channel_cost, margin FROM payidem.platform_margin
 WHERE channel_no = 'ST_ALI' ORDER BY bill_day;
SELECT count(*) AS tea_entries FROM payidem.ledger_entry WHERE merchant_no = :'mt';
SELECT count(*) AS violations FROM pg_temp.verify();
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 1, %L)', :'mt', 'PAY-FIN'));
SELECT * FROM pg_temp.try(format('SELECT b::text FROM payidem.balance(%L) b', :'mt'));
RESET ROLE;
DROP OWNED BY regress_settle_app, regress_settle_finance, regress_settle_report;
DROP ROLE regress_settle_app, regress_settle_finance, regress_settle_report;

---------------------------------------------------------------- 9. bad input
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.settle(NULL)');
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.settle(''infinity'')');
SELECT * FROM pg_temp.try('SELECT count(*) FROM payidem.settle(''1969-12-31'')');
SELECT * FROM pg_temp.try('payidem.request_payout(NULL, 100, ''X-1'')');
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 0, %L)', :'mt', 'X-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, -5, %L)', :'mt', 'X-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, NULL, %L)', :'mt', 'X-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, NULL)', :'mt'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', :'mt', 'has space'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', :'mt', repeat('x', 65)));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L, %L)', :'mt', 'X-1', 'cny'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L, NULL)', :'mt', 'X-1'));
SELECT * FROM pg_temp.try(format('payidem.request_payout(%L, 100, %L)', 'M0000000000000000', 'X-1'));
SELECT * FROM pg_temp.try('payidem.apply_payout_result(NULL, ''succeeded'')');
SELECT * FROM pg_temp.try('payidem.apply_payout_result(''PT123'', ''succeeded'')');
SELECT * FROM pg_temp.try(format('payidem.apply_payout_result(%L, %L)', :'pt1', 'done'));
SELECT * FROM pg_temp.try(format('payidem.apply_payout_result(%L, NULL)', :'pt1'));
SELECT * FROM pg_temp.try(format('payidem.apply_payout_result(%L, %L, %L)', :'pt1', 'succeeded', 'has space'));
SELECT * FROM pg_temp.try(format('payidem.apply_payout_result(%L, %L)', payidem.order_no_make('PT', '2026-10-01 00:00:00+00', 0, 1), 'succeeded'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 0, %L, %L)', :'mt', 'X-1', 'why'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, NULL, %L, %L)', :'mt', 'X-1', 'why'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, NULL, %L)', :'mt', 'why'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, NULL)', :'mt', 'X-1'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L)', :'mt', 'X-1', '   '));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L)', :'mt', 'X-1', repeat('r', 257)));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L)', :'mt', 'X-1', E'line\nbreak'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L, %L)', :'mt', 'X-1', 'why', 'EURO'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(NULL, 1, %L, %L)', 'X-1', 'why'));
SELECT * FROM pg_temp.try(format('payidem.adjust_balance(%L, 1, %L, %L)', 'M0000000000000000', 'X-1', 'why'));
SELECT * FROM pg_temp.try(format('payidem.set_merchant_notify_url(%L, %L)', :'mt', 'ftp://tea.example/x'));
SELECT * FROM pg_temp.try(format('payidem.set_merchant_notify_url(%L, %L)', :'mt', 'not a url'));
SELECT * FROM pg_temp.try(format('payidem.set_merchant_notify_url(%L, %L)', 'M0000000000000000', 'https://x.example/'));
SELECT * FROM pg_temp.try('payidem.set_merchant_notify_url(NULL, ''https://x.example/'')');
SELECT * FROM pg_temp.try(format('payidem.set_merchant_notify_url(%L, NULL)', :'md0'));
SELECT * FROM pg_temp.try('SELECT b::text FROM payidem.balance(NULL) b');
SELECT * FROM pg_temp.try(format('SELECT b::text FROM payidem.balance(%L, %L) b', :'mt', 'yuan'));
SELECT * FROM pg_temp.try(format('SELECT b::text FROM payidem.balance(%L) b', 'M0000000000000000'));
-- nothing of that changed the books
SELECT * FROM pg_temp.balances();
SELECT count(*) AS violations FROM pg_temp.verify();

