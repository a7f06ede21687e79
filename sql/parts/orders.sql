------------------------------------------------------------------------------
-- Orders and their payment attempts: create_order, begin_payment,
-- close_payment, close_order.  The lock order of every flow function
-- (docs/payment-flow.md): the order, then its payments, then refunds.  The API
-- functions run as the extension owner (SECURITY DEFINER, or those in C as the
-- owner themselves): an application role needs only EXECUTE (grant_app); no
-- table is granted.
------------------------------------------------------------------------------

-- create_order(): src/orders.c, the arguments checked against the domains of
-- their columns (payidem_domain_fits(), as _fits()), the merchant read by key
-- and the order written without an INSERT statement (no executor per row; the
-- CHECKs, defaults and index predicates compiled once per session), or with
-- it where the table has what a direct insert cannot reproduce (a rule, a
-- transition-table or BEFORE row trigger, row-level security, no INSERT
-- privilege, a column of another type); the unique constraint on
-- (merchant_no, out_trade_no) decides between concurrent first calls: the
-- loser waits for the winner's commit, then reads its row.  The errors of the
-- checks above (_require, _invalid_format, _raise_not_found) made by them, on
-- the paths that end there.
CREATE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_create_order'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.create_order(text, text, bigint, text, text, text, interval, text) IS
	'New pending order (order_no = gen_order_no(''PO'')). Idempotent on (merchant_no, out_trade_no): the same amount and subject return the existing order_no, others raise PI001. PI009 unknown merchant, PI004 merchant not active, 22023 bad input.';
-- A merchant's sum of a day on a channel against its daily limits (the
-- binding's, the channel's; NULL: none), under the binding's lock: PI007 if
-- amount more would pass one.  The day is payidem.limit_timezone's (UTC by
-- default); pending and paid attempts count.  Internal to begin_payment(),
-- called only where a daily limit is set.
CREATE FUNCTION payidem._check_daily_limit(p_merchant_no text, p_channel_no text, p_amount bigint,
	p_binding_limit bigint, p_channel_limit bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text;
	v_day_start timestamptz;
	v_used numeric;		-- a day's sum may pass the bigint range
BEGIN
	-- serialize the day's sum of this merchant on this channel
	PERFORM 1 FROM payidem.merchant_channel x
	 WHERE x.merchant_no = p_merchant_no AND x.channel_no = p_channel_no FOR UPDATE;
	v_tz := coalesce(nullif(current_setting('payidem.limit_timezone', true), ''), 'UTC');
	v_day_start := date_trunc('day', now() AT TIME ZONE v_tz) AT TIME ZONE v_tz;
	SELECT coalesce(sum(x.amount), 0) INTO v_used FROM payidem.payment x
	 WHERE x.merchant_no = p_merchant_no AND x.channel_no = p_channel_no
	   AND x.created_at >= v_day_start
	   AND (x.status = 'pending' OR x.status = ANY (payidem._paid_payment_statuses()));
	IF v_used + p_amount > p_binding_limit OR v_used + p_amount > p_channel_limit THEN
		RAISE EXCEPTION 'amount exceeds the daily limit' USING
			ERRCODE = 'PI007',
			DETAIL = format('Merchant %s has %s pending or paid on channel %s today (%s); with %s more the daily limit (merchant %s, channel %s) would be exceeded.',
							p_merchant_no, v_used, p_channel_no, v_tz, p_amount,
							coalesce(p_binding_limit::text, 'none'), coalesce(p_channel_limit::text, 'none')),
			HINT = 'Use another channel, or try again tomorrow.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_daily_limit(text, text, bigint, bigint, bigint) IS
	'Internal to begin_payment(): PI007 if amount more would pass the merchant''s daily limit on the channel (binding''s or channel''s), under the binding''s lock.';

-- begin_payment(): src/orders.c, the order locked and everything read by key
-- without SQL; the errors of the checks above (_require, _check_number,
-- _raise_not_found, _refuse_repeatable_read, _check_daily_limit) made by
-- them, on the paths that end there.
CREATE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_begin_payment'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.begin_payment(text, text) IS
	'Start (or, on the same channel, return again) the pending payment attempt of an order; payment_no = gen_order_no(''PY''). PI009, PI002 (order not pending), PI008 (expired), PI004 (merchant/channel/binding/type), PI003 (pending on another channel), PI007 (limits).';
CREATE FUNCTION payidem.close_payment(payment_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_outcome text;
	v_status text;
BEGIN
	PERFORM payidem._check_number('payment', close_payment.payment_no);
	v_outcome := payidem.apply_payment_result(close_payment.payment_no, 'close', 'closed');
	IF v_outcome = 'applied' THEN
		RETURN true;
	ELSIF v_outcome = 'duplicate' THEN
		RETURN false;
	END IF;
	SELECT x.status INTO v_status FROM payidem.payment x WHERE x.payment_no = close_payment.payment_no;
	RAISE EXCEPTION 'payment % cannot be closed', close_payment.payment_no USING
		ERRCODE = 'PI002',
		DETAIL = format('Payment %s is %s; only a pending payment can be closed.', close_payment.payment_no, v_status),
		HINT = CASE WHEN v_status = 'failed' THEN 'A failed payment needs no closing.'
					ELSE 'The payment succeeded: refund it with payidem.refund() instead.' END;
END
$$;
COMMENT ON FUNCTION payidem.close_payment(text) IS
	'Close a pending payment attempt (after the channel confirmed it is closed): true = closed now, false = already closed; PI002 if it succeeded or failed, PI009 if unknown.';

CREATE FUNCTION payidem.close_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := close_order.order_no;
	v_pending text;
	o payidem."order";
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('close_order', 'for a pending attempt of the order');
	END IF;
	PERFORM payidem._check_number('order', close_order.order_no);
	-- the lock order of every flow function: the order, then its payments
	-- (an attempt begin_payment() is committing is seen once the order's
	-- lock is ours: it held that lock)
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('order', v_order_no, 'payidem."order"', 'order_no');
	END IF;
	IF o.status = 'closed' THEN
		RETURN false;
	ELSIF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot be closed', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order can be closed.', o.order_no, o.status),
			HINT = 'A paid order is refunded, not closed: see payidem.refund().';
	END IF;
	-- with the order locked no new attempt can start; close the pending one
	SELECT x.payment_no INTO v_pending FROM payidem.payment x
	 WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF v_pending IS NOT NULL THEN
		PERFORM payidem.apply_payment_result(v_pending, 'close', 'closed');
	END IF;
	PERFORM payidem.transit_order(o.order_no, 'closed');
	RETURN true;
END
$$;
COMMENT ON FUNCTION payidem.close_order(text) IS
	'Close a pending order and its pending payment attempt (query and close it at the channel first): true = closed now, false = already closed; PI002 if paid or refunded, PI009 if unknown. A success arriving later is recorded as anomaly paid_after_close.';

