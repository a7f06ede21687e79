------------------------------------------------------------------------------
-- Payment results: apply_payment_result() (C, src/flow.c) and the PL/pgSQL
-- contract behind it, with the C helpers both paths share
------------------------------------------------------------------------------

-- What an anomaly row records of a channel's raw message: never a signature or key.
CREATE FUNCTION payidem._flow_raw(raw jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN raw IS NULL THEN NULL
			WHEN pg_catalog.jsonb_typeof(raw) OPERATOR(pg_catalog.=) 'object'
			THEN raw OPERATOR(pg_catalog.-) ARRAY['sign', 'signature', 'paySign', 'key', 'secret',
												  'api_secret', 'private_key', 'password', 'token']
			ELSE raw END;
COMMENT ON FUNCTION payidem._flow_raw(jsonb) IS
	'Internal: a channel message as recorded in anomaly.detail, without top-level signature/key/secret fields.';
-- The argument checks of apply_payment_result(), run only when its one-expression
-- test finds something wrong: each raises its own error.
CREATE FUNCTION payidem._check_payment_result_args(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF payment_no IS NULL OR left(payment_no, 2) <> 'PY' OR NOT payidem.order_no_valid(payment_no) THEN
		PERFORM payidem._check_number('payment', payment_no);
	END IF;
	IF source IS NULL OR source NOT IN ('callback', 'query', 'close') THEN
		RAISE EXCEPTION 'invalid result source' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The source was %s; it must be callback, query or close.',
							coalesce(quote_literal(left(source, 64)), 'NULL'));
	END IF;
	IF status IS NULL OR status NOT IN ('succeeded', 'failed', 'closed') THEN
		RAISE EXCEPTION 'invalid payment result status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be succeeded, failed or closed.',
							coalesce(quote_literal(left(status, 64)), 'NULL'));
	END IF;
	IF amount IS NOT NULL AND amount <= 0 THEN
		RAISE EXCEPTION 'invalid reported amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be positive.', amount),
			HINT = 'Pass the amount the channel reports, in minor units.';
	END IF;
	IF NOT payidem._fits(transaction_id, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('transaction_id', transaction_id, 'payidem.channel_ref');
	END IF;
	IF NOT isfinite(paid_at) THEN
		RAISE EXCEPTION 'invalid paid_at' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The value was %s; it must be a real point in time, or NULL for now.', paid_at),
			HINT = 'Pass the time the channel reports the payment was made.';
	END IF;
	IF status = 'succeeded' AND (transaction_id IS NULL OR amount IS NULL) THEN
		RAISE EXCEPTION 'a success must carry the channel''s transaction id and amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('Payment %s: transaction_id was %s and amount was %s.', payment_no,
							coalesce(quote_literal(transaction_id), 'NULL'), coalesce(amount::text, 'NULL')),
			HINT = 'Pass both as the channel reported them: a success without them can be neither reconciled nor refunded.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_payment_result_args(text, text, text, text, bigint, timestamptz) IS
	'Internal to apply_payment_result(): raises the error (22023, or PI009/22023 from _check_number) for the first invalid argument.';

-- The two writes of a first success, as direct executor updates of the rows
-- apply_payment_result() holds locked (src/flow.c): triggers, constraints,
-- domains and indexes as for an UPDATE, without its per-statement work.
CREATE FUNCTION payidem._record_payment_success(payment_row tid, payment_no text,
	transaction_id payidem.channel_ref, paid_at timestamptz, fee_amount bigint, cost_amount bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_record_payment_success'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._record_payment_success(tid, text, payidem.channel_ref, timestamptz, bigint, bigint) IS
	'Internal to apply_payment_result(): the payment at payment_row (locked by the caller, key payment_no) becomes succeeded with paid_at, the fees and, unless NULL, transaction_id. False (nothing done) if the table has statement-level UPDATE triggers, transition tables, rules or row-level security that applies to the caller, or the caller may not update it: the caller then runs the UPDATE in SQL.';
CREATE FUNCTION payidem._record_order_paid(order_row tid, order_no text,
	paid_payment_no payidem.payment_number, paid_at timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_record_order_paid'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._record_order_paid(tid, text, payidem.payment_number, timestamptz) IS
	'Internal to apply_payment_result(): the order at order_row (locked by the caller, key order_no) becomes paid by paid_payment_no at paid_at (its order.paid event is written by the status_notify trigger). False (nothing done) as for _record_payment_success().';

-- The fee of an amount at a rate, exact and rounded half-up (src/flow.c: the
-- one place a fee is computed, which the C path of apply_payment_result()
-- uses too).
CREATE FUNCTION payidem._fee(amount bigint, rate numeric)
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_fee'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._fee(bigint, numeric) IS
	'Internal: amount * rate in minor units, rounded half-up (exact numeric arithmetic).';

-- The transaction-level lock two deliveries of one channel transaction id
-- for two payments take (src/flow.c, where its key is made for both paths).
CREATE FUNCTION payidem._lock_transaction_id(channel_no text, transaction_id text, wait boolean)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_lock_transaction_id'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._lock_transaction_id(text, text, boolean) IS
	'Internal to apply_payment_result(): take the transaction-level lock on channel_no''s transaction_id; without waiting, false if another transaction holds it.';

-- The one rule for a reported paid_at (src/flow.c, payidem.max_clock_skew),
-- which the C path of apply_payment_result() applies too.
CREATE FUNCTION payidem._check_paid_at(payment_no text, created_at timestamptz, paid_at timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_check_paid_at'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_paid_at(text, timestamptz, timestamptz) IS
	'Internal to apply_payment_result(): 22023 unless paid_at lies between the attempt''s creation and now, each widened by payidem.max_clock_skew.';
CREATE FUNCTION payidem._paid_at_ok(created_at timestamptz, paid_at timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_paid_at_ok'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._paid_at_ok(timestamptz, timestamptz) IS
	'Internal to apply_payment_result(): the rule of _check_paid_at(), as a test.';

-- The contract of apply_payment_result() in full.  apply_payment_result()
-- itself (src/flow.c) decides a repeated success and the first success of a
-- pending payment of a pending order, and passes every other call here
-- unchanged.
CREATE FUNCTION payidem._apply_payment_result(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- aliases, not copies: a copy is an expression, set up again in every
	-- transaction
	v_payment_no ALIAS FOR $1;
	v_source ALIAS FOR $2;
	v_status ALIAS FOR $3;
	v_txn ALIAS FOR $4;
	v_amount ALIAS FOR $5;
	v_paid_at timestamptz;
	v_outcome text;
	v_other text;
	v_kind text;
	v_rate numeric;
	v_cost_rate numeric;
	v_order_status text;
	v_order_paid_by text;
	v_order_row tid;
	p record;					-- the payment's columns this function reads
BEGIN
	-- A repeated success of a payment that already succeeded (the same amount
	-- and transaction id) is answered from the committed row, without a
	-- lock: from succeeded, a payment only moves on to refunded states,
	-- which answer a success the same way.  Such a repeat's arguments are
	-- valid: the row vouches for all but the source and paid_at, which are
	-- checked here.
	IF v_status = 'succeeded' AND v_source IN ('callback', 'query', 'close') THEN
		SELECT x.status, x.amount, x.transaction_id, x.created_at INTO p
		  FROM payidem.payment x WHERE x.payment_no = v_payment_no;
		IF FOUND AND p.status = ANY (payidem._paid_payment_statuses())
			AND v_amount = p.amount AND v_txn = p.transaction_id
			AND (_apply_payment_result.paid_at IS NULL OR payidem._paid_at_ok(p.created_at, _apply_payment_result.paid_at)) THEN
			RETURN 'duplicate';
		END IF;
	END IF;

	-- The arguments: valid ones pass one expression; the checks of
	-- _check_payment_result_args() word the error.
	IF v_payment_no IS NULL OR left(v_payment_no, 2) <> 'PY' OR NOT payidem.order_no_valid(v_payment_no)
		OR v_source IS NULL OR v_source NOT IN ('callback', 'query', 'close')
		OR v_status IS NULL OR v_status NOT IN ('succeeded', 'failed', 'closed')
		OR (v_status = 'succeeded' AND (v_txn IS NULL OR v_amount IS NULL))
		OR v_amount <= 0 OR NOT payidem._fits(v_txn, 'payidem.channel_ref')
		OR NOT isfinite(_apply_payment_result.paid_at) THEN
		PERFORM payidem._check_payment_result_args(v_payment_no, v_source, v_status, v_txn, v_amount,
												   _apply_payment_result.paid_at);
	END IF;

	SELECT x.order_no INTO v_other FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF NOT FOUND THEN
		-- A success for a number of this shard that names no payment (lost in
		-- an asynchronous failover, or never made here) is money the channel
		-- holds without a record: refused, with one anomaly per number and
		-- transaction id (its unique index: a repeat, or a delivery at the
		-- same moment, adds none), not an error the channel's retries hit
		-- until they give up.  Any other report of it is an error.
		IF v_status = 'succeeded'
		   AND (SELECT n.shard FROM payidem.order_no_parse(v_payment_no) n) = payidem.shard_id() THEN
			INSERT INTO payidem.anomaly (kind, amount, detail)
			VALUES ('unknown_transaction', v_amount,
					jsonb_build_object('reported_payment_no', v_payment_no, 'transaction_id', v_txn,
									   'reported_amount', v_amount, 'source', v_source,
									   'paid_at', coalesce(_apply_payment_result.paid_at, now()),
									   'action', 'ask the channel which payment this is; refund it at the channel if none of ours was made for it',
									   'raw', payidem._flow_raw(raw)))
			ON CONFLICT ((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
				WHERE kind = 'unknown_transaction' DO NOTHING;
			RETURN 'rejected';
		END IF;
		RAISE EXCEPTION 'payment % does not exist', coalesce(quote_literal(left(v_payment_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.payment has no row with that payment_no.';
	END IF;
	-- The lock order of every flow function (docs/payment-flow.md): the
	-- order, then its payment.  Only a success changes the order; a failure
	-- or close report locks the payment alone.  FOR NO KEY UPDATE, as an
	-- UPDATE that keeps the key locks: the KEY SHARE locks that inserts of
	-- payments, refunds and anomalies take on their order and payment
	-- through the foreign keys do not wait for it (a FOR UPDATE lock would
	-- make refund(), which holds the payment, wait for the order).
	IF v_status = 'succeeded' THEN
		-- the order, locked (its number never changes), and the rates of the fees
		SELECT x.ctid, x.status, x.paid_payment_no, coalesce(b.fee_rate, m.fee_rate), c.fee_rate
		  INTO v_order_row, v_order_status, v_order_paid_by, v_rate, v_cost_rate
		  FROM payidem."order" x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
		  JOIN payidem.payment y ON y.payment_no = v_payment_no
		  JOIN payidem.channel c ON c.channel_no = y.channel_no
		  LEFT JOIN payidem.merchant_channel b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
		 WHERE x.order_no = v_other
		   FOR NO KEY UPDATE OF x;
	END IF;
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;

	IF v_status = 'succeeded' THEN
		v_paid_at := coalesce(_apply_payment_result.paid_at, now());
		IF _apply_payment_result.paid_at IS NOT NULL THEN
			PERFORM payidem._check_paid_at(p.payment_no, p.created_at, v_paid_at);
		END IF;
		IF p.status = ANY (payidem._paid_payment_statuses()) THEN
			IF v_amount = p.amount AND v_txn = p.transaction_id THEN
				RETURN 'duplicate';		-- applied meanwhile, by the delivery we waited for
			END IF;
			v_kind := 'conflicting_result';		-- another transaction id or amount: a second charge?
		END IF;
		IF v_kind IS NOT NULL THEN
			-- decided above
		ELSIF v_amount <> p.amount THEN
			v_kind := 'amount_mismatch';
		ELSIF v_txn IS DISTINCT FROM p.transaction_id THEN
			-- (a transaction id the payment already has is no other's: unique)
			-- two deliveries carrying one transaction id for two payments:
			-- the second waits until the first commits, then (READ
			-- COMMITTED: a new snapshot per statement) finds its row below.
			-- The C path of apply_payment_result() takes the same lock.
			IF NOT payidem._lock_transaction_id(p.channel_no, v_txn, false) THEN
				PERFORM payidem._lock_transaction_id(p.channel_no, v_txn, true);
				IF current_setting('transaction_isolation') <> 'read committed' THEN
					RAISE EXCEPTION 'transaction id % is being applied to another payment at the same time', quote_literal(v_txn) USING
						ERRCODE = 'serialization_failure',
						DETAIL = format('Payment %s waited for another delivery of %s on channel %s; this transaction''s snapshot cannot see its outcome.',
										p.payment_no, quote_literal(v_txn), p.channel_no),
						HINT = 'Retry the transaction, or apply results in READ COMMITTED.';
				END IF;
			END IF;
			SELECT x.payment_no INTO v_other FROM payidem.payment_paid x
			 WHERE x.channel_no = p.channel_no AND x.transaction_id = v_txn AND x.payment_no <> p.payment_no;
			IF FOUND THEN
				v_kind := 'transaction_conflict';
			END IF;
		END IF;
	ELSIF p.status = ANY (payidem._paid_payment_statuses()) THEN
		-- the channel's word of success stands; a later failure/close report
		-- contradicts it
		v_kind := 'conflicting_result';
	ELSIF p.status = v_status THEN
		RETURN 'duplicate';
	ELSIF p.status IN ('failed', 'closed') THEN
		-- a failed attempt is not closed (nor a closed one failed) afterwards
		RETURN 'rejected';
	END IF;

	-- A refusal changes nothing but one anomaly row, and a repeat of the
	-- same refusal adds none.
	IF v_kind IS NOT NULL THEN
		IF NOT EXISTS (SELECT 1 FROM payidem.anomaly a
						WHERE a.payment_no = p.payment_no AND a.kind = v_kind AND a.handle_status = 'open'
						  AND a.detail @> jsonb_build_object('reported_status', v_status,
															 'reported_amount', v_amount,
															 'transaction_id', v_txn)) THEN
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (v_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN v_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)));
		END IF;
		RETURN 'rejected';
	END IF;

	IF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		RETURN 'applied';
	END IF;

	-- pending, closed or failed -> succeeded: the channel's word wins.  It
	-- pays the order if the order is still pending; otherwise money arrived
	-- where it should not, and an anomaly asks for its refund.
	-- The status and the fields in one update of the row we hold locked
	-- (then the order's): the status_guard trigger checks each change
	-- against the whitelist and logs it, exactly as for transit_payment();
	-- one new row version each.  A direct update (src/flow.c) unless the
	-- table has statement triggers, rules or row security that applies:
	-- then the same UPDATE in SQL.
	v_outcome := CASE WHEN v_order_status = 'pending' THEN 'applied' ELSE 'anomaly' END;
	IF NOT payidem._record_payment_success(p.ctid, p.payment_no, v_txn, v_paid_at,
											payidem._fee(p.amount, v_rate),
											payidem._fee(p.amount, v_cost_rate)) THEN
		UPDATE payidem.payment x
		   SET status = 'succeeded', updated_at = now(),
			   transaction_id = v_txn, paid_at = v_paid_at,
			   fee_amount = payidem._fee(p.amount, v_rate),
			   cost_amount = payidem._fee(p.amount, v_cost_rate)
		 WHERE x.payment_no = p.payment_no;
	END IF;
	IF v_order_status = 'pending' THEN
		IF NOT payidem._record_order_paid(v_order_row, p.order_no, p.payment_no, v_paid_at) THEN
			UPDATE payidem."order" x
			   SET status = 'paid', updated_at = now(),
				   paid_payment_no = p.payment_no, paid_at = v_paid_at
			 WHERE x.order_no = p.order_no;
		END IF;
	ELSE
		v_kind := CASE WHEN v_order_status = 'closed' THEN 'paid_after_close' ELSE 'duplicate_payment' END;
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (v_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)));
	END IF;
	RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Internal to apply_payment_result(): the whole contract in PL/pgSQL, for every call apply_payment_result() does not decide itself.';

CREATE FUNCTION payidem.apply_payment_result(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_apply_payment_result'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION payidem.apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Apply a channel''s word on a payment (source callback|query|close; status succeeded|failed|closed; a success needs its transaction_id and amount, a paid_at within the attempt''s lifetime) exactly once per payment and status. Returns applied, duplicate, anomaly (a late success of a closed or failed payment whose order is closed or paid otherwise: paid_after_close, duplicate_payment; the payment is recorded succeeded and refund() takes it) or rejected (amount_mismatch, transaction_conflict, conflicting_result, and unknown_transaction for a success of a number of this shard that names no payment: nothing changes but an anomaly row). PI009 for another report of an unknown payment.';

