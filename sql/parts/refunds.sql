------------------------------------------------------------------------------
-- Refunds: refund(), apply_refund_result()
------------------------------------------------------------------------------

CREATE FUNCTION payidem.refund(payment_no text, amount bigint, out_refund_no text, reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_payment_no text := refund.payment_no;
	v_amount bigint := refund.amount;
	v_out_refund_no text := refund.out_refund_no;
	v_refund_no text;
	v_order_no text;
	v_committed bigint;
	p payidem.payment;
	r payidem.refund;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('refund', 'the refunded total of the payment');
	END IF;
	PERFORM payidem._check_number('payment', refund.payment_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		PERFORM payidem._raise_invalid('invalid refund amount',
			format('The amount was %s; it must be a positive number of minor units.', coalesce(v_amount::text, 'NULL')));
	END IF;
	IF v_out_refund_no IS NULL OR NOT payidem._fits(v_out_refund_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_refund_no', v_out_refund_no, 'payidem.merchant_ref',
										'Use the merchant''s own refund number.');
	END IF;
	IF NOT payidem._fits(reason, 'payidem.refund_reason') THEN
		PERFORM payidem._raise_invalid('invalid refund reason',
			format('The reason has %s characters; at most 256 are allowed.', length(reason)));
	END IF;

	-- serializes the refunds of one payment; in the lock order of every flow
	-- function, the order first (its number never changes), so a refund and
	-- its result in one transaction cannot deadlock with a payment result
	SELECT x.order_no INTO v_order_no FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF FOUND THEN
		PERFORM 1 FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('payment', v_payment_no, 'payidem.payment', 'payment_no');
	END IF;

	<<attempt>>
	LOOP
		SELECT * INTO r FROM payidem.refund x
		 WHERE x.merchant_no = p.merchant_no AND x.out_refund_no = v_out_refund_no;
		IF FOUND THEN
			IF r.payment_no <> p.payment_no OR r.amount <> v_amount THEN
				RAISE EXCEPTION 'out_refund_no % was already used for another refund', v_out_refund_no USING
					ERRCODE = 'PI001',
					DETAIL = CASE WHEN r.payment_no <> p.payment_no
							 THEN format('Refund %s (out_refund_no %s) is for payment %s; this call names payment %s.',
										 r.refund_no, v_out_refund_no, r.payment_no, p.payment_no)
							 ELSE format('Refund %s (out_refund_no %s) is for amount %s; this call asked for %s.',
										 r.refund_no, v_out_refund_no, r.amount, v_amount) END,
					HINT = 'A repeated refund must carry the same payment and amount; use a new out_refund_no for a new refund.';
			END IF;
			RETURN r.refund_no;
		END IF;

		IF p.status NOT IN ('succeeded', 'partially_refunded') THEN
			RAISE EXCEPTION 'payment % cannot be refunded', p.payment_no USING
				ERRCODE = 'PI002',
				DETAIL = format('Payment %s is %s; only a succeeded or partially refunded payment can be refunded.',
								p.payment_no, p.status);
		END IF;
		SELECT coalesce(sum(x.amount), 0) INTO v_committed FROM payidem.refund x
		 WHERE x.payment_no = p.payment_no AND x.status IN ('pending', 'succeeded');
		-- (compared as amount - committed: v_committed + v_amount could overflow)
		IF v_amount > p.amount - v_committed THEN
			RAISE EXCEPTION 'refund exceeds the paid amount' USING
				ERRCODE = 'PI006',
				DETAIL = format('Payment %s is for %s; %s is already refunded or being refunded, so at most %s more can be refunded, not %s.',
								p.payment_no, p.amount, v_committed, p.amount - v_committed, v_amount);
		END IF;

		-- a concurrent refund of another payment of this merchant may take the
		-- same out_refund_no: then read its row and decide as above
		INSERT INTO payidem.refund AS x (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, reason)
		VALUES (payidem.gen_order_no('RF'), p.payment_no, p.order_no, p.merchant_no, v_out_refund_no, v_amount, reason)
		ON CONFLICT ON CONSTRAINT refund_out_refund_no_key DO NOTHING
		RETURNING x.refund_no INTO v_refund_no;
		IF v_refund_no IS NOT NULL THEN
			RETURN v_refund_no;
		END IF;
	END LOOP attempt;
END
$$;
COMMENT ON FUNCTION payidem.refund(text, bigint, text, text) IS
	'Start a refund of a succeeded or partially refunded payment (refund_no = gen_order_no(''RF''), pending). Idempotent on (merchant, out_refund_no): same payment and amount return the existing refund_no, else PI001. PI006 if pending + succeeded refunds would exceed the payment amount, PI002 wrong payment status, PI009 unknown payment.';

CREATE FUNCTION payidem.apply_refund_result(refund_no text, status text, channel_refund_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_refund_no text := apply_refund_result.refund_no;
	v_status text := apply_refund_result.status;
	v_crid text := apply_refund_result.channel_refund_id;
	v_payment_no text;
	v_order_no text;
	v_refunded bigint;
	v_order_refunded bigint;
	v_order_status text;
	p payidem.payment;
	r payidem.refund;
	o payidem."order";
BEGIN
	PERFORM payidem._check_number('refund', apply_refund_result.refund_no);
	IF v_status IS NULL OR v_status NOT IN ('succeeded', 'failed') THEN
		PERFORM payidem._raise_invalid('invalid refund result status',
			format('The status was %s; it must be succeeded or failed.',
				coalesce(quote_literal(left(v_status, 64)), 'NULL')));
	END IF;
	IF NOT payidem._fits(v_crid, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('channel_refund_id', v_crid, 'payidem.channel_ref');
	END IF;

	-- the lock order of every flow function: the order (a success moves
	-- it), then the payment, then the refund; their numbers never change
	SELECT x.payment_no, x.order_no INTO v_payment_no, v_order_no FROM payidem.refund x WHERE x.refund_no = v_refund_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('refund', v_refund_no, 'payidem.refund', 'refund_no');
	END IF;
	IF v_status = 'succeeded' THEN
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	END IF;
	SELECT * INTO p FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	SELECT * INTO r FROM payidem.refund x WHERE x.refund_no = v_refund_no FOR NO KEY UPDATE;

	IF r.status NOT IN ('pending', v_status) THEN
		-- succeeded and failed are both final: the other word comes too late
		IF v_status = 'succeeded' AND NOT EXISTS (
				SELECT 1 FROM payidem.anomaly a
				 WHERE a.payment_no = p.payment_no AND a.kind = 'refund_success_after_failure'
				   AND a.handle_status = 'open' AND a.detail @> jsonb_build_object('refund_no', r.refund_no)) THEN
			-- the channel says money went back on a refund we recorded as failed
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES ('refund_success_after_failure', p.order_no, p.payment_no, p.channel_no, r.amount,
					jsonb_build_object('refund_no', r.refund_no, 'channel_refund_id', v_crid));
		END IF;
		RETURN 'rejected';
	END IF;

	-- a repeat is answered from the refund's row, which we hold locked: it
	-- is the record of the decision (no idempotency key: DESIGN section 4)
	IF r.status = v_status THEN
		RETURN 'duplicate';
	END IF;

	IF v_status = 'failed' THEN
		PERFORM payidem.transit_refund(r.refund_no, 'failed');
		RETURN 'applied';
	END IF;

	-- The refund, its payment and (only if that payment paid it) the order,
	-- each row's status with its refunded amount, in one statement: the
	-- bookkeeping checks across rows see all three written also when they
	-- run at the end of each statement (SET CONSTRAINTS ... IMMEDIATE).
	-- status_guard checks and logs each status change.  The order's
	-- refunded amount always moves: a refund the channel completed is
	-- recorded whatever the order's status.  Its status becomes
	-- partially_refunded or refunded where the whitelist allows the move
	-- (always from paid and partially_refunded); an order in a status a DBA
	-- added after paid (shipping) without such a transition keeps it.
	v_refunded := p.refunded_amount + r.amount;
	v_order_refunded := o.refunded_amount + r.amount;
	v_order_status := CASE WHEN v_order_refunded >= o.amount THEN 'refunded' ELSE 'partially_refunded' END;
	IF o.status <> v_order_status AND NOT payidem._transition_allowed('order', o.status, v_order_status) THEN
		v_order_status := o.status;
	END IF;
	WITH refund_done AS (
		UPDATE payidem.refund x
		   SET status = 'succeeded', refunded_at = now(), updated_at = now(),
			   channel_refund_id = coalesce(v_crid, x.channel_refund_id)
		 WHERE x.refund_no = r.refund_no
		RETURNING x.refund_no),
	payment_done AS (
		UPDATE payidem.payment x
		   SET refunded_amount = v_refunded, updated_at = now(),
			   status = CASE WHEN v_refunded >= p.amount THEN 'refunded' ELSE 'partially_refunded' END
		 WHERE x.payment_no = p.payment_no
		RETURNING x.payment_no)
	UPDATE payidem."order" x
	   SET refunded_amount = v_order_refunded, updated_at = now(), status = v_order_status
	 WHERE x.order_no = o.order_no AND o.paid_payment_no = p.payment_no;
	RETURN 'applied';
END
$$;
COMMENT ON FUNCTION payidem.apply_refund_result(text, text, text) IS
	'Apply a channel''s refund result (succeeded|failed) exactly once: succeeded moves the refunded amounts and statuses of the payment and, if that payment paid the order, of the order (an order in a status of a DBA''s, such as shipping, keeps it unless the whitelist allows its move to partially_refunded/refunded; its refunded amount moves). Returns applied, duplicate or rejected (the other final word came first).';

