------------------------------------------------------------------------------
-- Payment results: apply_payment_result() (C, src/payment_result.c) and the PL/pgSQL
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

-- What a payment result does, decided once (src/payment_decision.c) for
-- apply_payment_result()'s C fast path and for _apply_payment_result() below:
-- the arguments' check, the verdict, the fees.
CREATE FUNCTION payidem._check_payment_result_args(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_check_payment_result_args'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_payment_result_args(text, text, text, text, bigint, timestamptz) IS
	'Internal to apply_payment_result(): raises the error (22023, or PI009/22023 from _check_number) for the first invalid argument.';
CREATE FUNCTION payidem._decide_payment_result(payment_no text, status text, amount bigint,
	transaction_id text, paid_at timestamptz, payment_status text, payment_amount bigint,
	payment_transaction_id text, payment_created_at timestamptz, order_status text,
	transaction_id_taken boolean, OUT verdict text, OUT anomaly_kind text)
RETURNS record
AS 'MODULE_PATHNAME', 'payidem_decide_payment_result'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._decide_payment_result(text, text, bigint, text, timestamptz, text, bigint, text, timestamptz, text, boolean) IS
	'Internal to apply_payment_result(): the verdict on a valid report (applied, anomaly, duplicate, rejected, with the anomaly kind; not_found; read_order or check_transaction_id when that fact, NULL, is needed) from the payment (payment_status NULL: none) and order as read. 22023 for a paid_at outside the attempt''s lifetime.';
CREATE FUNCTION payidem._payment_fees(amount bigint, merchant_rate numeric, binding_rate numeric,
	channel_rate numeric, OUT fee_amount bigint, OUT cost_amount bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'payidem_payment_fees'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._payment_fees(bigint, numeric, numeric, numeric) IS
	'Internal to apply_payment_result(): what the merchant pays (the binding''s rate, else the merchant''s) and what the channel costs on amount, rounded half-up.';

-- The two writes of a first success, as direct executor updates of the rows
-- apply_payment_result() holds locked (src/payment_result.c): triggers, constraints,
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

-- The transaction-level lock two deliveries of one channel transaction id
-- for two payments take (src/payment_result.c, where its key is made for both paths).
CREATE FUNCTION payidem._lock_transaction_id(channel_no text, transaction_id text, wait boolean)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_lock_transaction_id'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._lock_transaction_id(text, text, boolean) IS
	'Internal to apply_payment_result(): take the transaction-level lock on channel_no''s transaction_id; without waiting, false if another transaction holds it.';

-- The contract of apply_payment_result() in full.  apply_payment_result()
-- itself (src/payment_result.c) answers a repeated success and writes the first success
-- of a pending payment of a pending order, and passes every other call here
-- unchanged.  Both read the facts and take _decide_payment_result()'s verdict.
-- Its result is the outcome and, for an anomaly or a refusal, the anomaly
-- that records it (apply_payment_result_ex() returns both).
CREATE FUNCTION payidem._apply_payment_result(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb,
	OUT outcome text, OUT anomaly_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- aliases, not copies: a copy is an expression, set up again in every
	-- transaction
	v_payment_no ALIAS FOR $1;
	v_source ALIAS FOR $2;
	v_status ALIAS FOR $3;
	v_txn ALIAS FOR $4;
	v_amount ALIAS FOR $5;
	v_reported_at ALIAS FOR $6;
	v_paid_at timestamptz;
	v_order_no text;
	v_other text;
	v_taken boolean;
	v_order_status text;
	v_order_paid_by text;
	v_order_row tid;
	v_anomaly bigint;
	v_snapshot_kept constant boolean := current_setting('transaction_isolation') <> 'read committed';
	v_stale boolean;
	v_merchant_rate numeric;
	v_binding_rate numeric;
	v_channel_rate numeric;
	d record;					-- the verdict and the anomaly kind
	f record;					-- the fees
	p record;					-- the payment's columns this function reads
BEGIN
	PERFORM payidem._check_payment_result_args(v_payment_no, v_source, v_status, v_txn, v_amount, v_reported_at);
	-- A repeated success is answered from the committed row, without a lock:
	-- from a paid status, a payment only moves on to other paid statuses,
	-- which answer a success the same way.
	IF v_status = 'succeeded' THEN
		SELECT x.status, x.amount, x.transaction_id, x.created_at INTO p
		  FROM payidem.payment x WHERE x.payment_no = v_payment_no;
		IF FOUND AND (SELECT y.verdict = 'duplicate'
						FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 p.status, p.amount, p.transaction_id, p.created_at,
															 NULL, NULL) y) THEN
			outcome := 'duplicate';
			RETURN;
		END IF;
	END IF;

	SELECT x.order_no INTO v_order_no FROM payidem.payment x WHERE x.payment_no = v_payment_no;
	IF NOT FOUND THEN
		-- a success for a number of this shard: unknown_transaction, one
		-- anomaly per number and transaction id (its unique index: a repeat,
		-- or a delivery at the same moment, adds none)
		SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 NULL, NULL, NULL, NULL, NULL, NULL);
		IF d.verdict = 'rejected' THEN
			INSERT INTO payidem.anomaly AS a (kind, amount, detail)
			VALUES (d.anomaly_kind, v_amount,
					jsonb_build_object('reported_payment_no', v_payment_no, 'transaction_id', v_txn,
									   'reported_amount', v_amount, 'source', v_source,
									   'paid_at', coalesce(v_reported_at, now()),
									   'action', 'ask the channel which payment this is; refund it at the channel if none of ours was made for it',
									   'raw', payidem._flow_raw(raw)))
			ON CONFLICT ((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
				WHERE kind = 'unknown_transaction' DO NOTHING
			RETURNING a.anomaly_id INTO v_anomaly;
			IF v_anomaly IS NULL THEN
				-- recorded before (the index's row, committed: the insert waited for it)
				SELECT a.anomaly_id INTO v_anomaly FROM payidem.anomaly a
				 WHERE a.kind = 'unknown_transaction' AND a.detail ->> 'reported_payment_no' = v_payment_no
				   AND a.detail ->> 'transaction_id' = v_txn;
			END IF;
			outcome := 'rejected';
			anomaly_id := v_anomaly;
			RETURN;
		END IF;
		PERFORM payidem._raise_not_found('payment', v_payment_no, 'payidem.payment', 'payment_no');
	END IF;
	-- The lock order of every flow function (docs/payment-flow.md): the
	-- order, then its payment.  Only a success changes the order; a failure
	-- or close report locks the payment alone.  FOR NO KEY UPDATE, as an
	-- UPDATE that keeps the key locks: the KEY SHARE locks that inserts of
	-- payments, refunds and anomalies take on their order and payment
	-- through the foreign keys do not wait for it (a FOR UPDATE lock would
	-- make refund(), which holds the payment, wait for the order).
	--
	-- Outside READ COMMITTED the snapshot is the transaction's: a delivery
	-- that waited for one of these locks cannot see what the one it waited
	-- for recorded without changing the row (a refusal's anomaly), and would
	-- decide on stale facts.  So it does not wait blind: a lock another
	-- transaction holds is waited for, then the call fails with 40001 (as
	-- the transaction id's lock below), and a retry decides afresh.
	v_stale := false;
	IF v_status = 'succeeded' THEN
		IF v_snapshot_kept THEN
			PERFORM FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE SKIP LOCKED;
			v_stale := NOT FOUND;
		END IF;
		-- the order, locked (its number never changes), and the rates of the fees
		SELECT x.ctid, x.status, x.paid_payment_no, m.fee_rate, b.fee_rate, c.fee_rate
		  INTO v_order_row, v_order_status, v_order_paid_by, v_merchant_rate, v_binding_rate, v_channel_rate
		  FROM payidem."order" x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
		  JOIN payidem.payment y ON y.payment_no = v_payment_no
		  JOIN payidem.channel c ON c.channel_no = y.channel_no
		  LEFT JOIN payidem.merchant_channel b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
		 WHERE x.order_no = v_order_no
		   FOR NO KEY UPDATE OF x;
	END IF;
	IF v_snapshot_kept AND NOT v_stale THEN
		PERFORM FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE SKIP LOCKED;
		v_stale := NOT FOUND;
	END IF;
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
	IF v_stale THEN
		PERFORM payidem._raise('40001', format('payment %s is being applied by another delivery at the same time', p.payment_no),
			format('This transaction (%s) waited for another delivery''s lock on payment %s; its snapshot cannot see that delivery''s outcome.',
				   current_setting('transaction_isolation'), p.payment_no),
			'Retry the transaction, or apply results in READ COMMITTED.');
	END IF;
	SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
														 p.status, p.amount, p.transaction_id, p.created_at,
														 v_order_status, NULL);
	IF d.verdict = 'check_transaction_id' THEN
		-- two deliveries carrying one transaction id for two payments: the
		-- second waits until the first commits, then (READ COMMITTED: a new
		-- snapshot per statement) finds its row below.  The C path of
		-- apply_payment_result() takes the same lock.
		IF NOT payidem._lock_transaction_id(p.channel_no, v_txn, false) THEN
			PERFORM payidem._lock_transaction_id(p.channel_no, v_txn, true);
			IF v_snapshot_kept THEN
				RAISE EXCEPTION 'transaction id % is being applied to another payment at the same time', quote_literal(v_txn) USING
					ERRCODE = 'serialization_failure',
					DETAIL = format('Payment %s waited for another delivery of %s on channel %s; this transaction''s snapshot cannot see its outcome.',
									p.payment_no, quote_literal(v_txn), p.channel_no),
					HINT = 'Retry the transaction, or apply results in READ COMMITTED.';
			END IF;
		END IF;
		SELECT x.payment_no INTO v_other FROM payidem.payment_paid x
		 WHERE x.channel_no = p.channel_no AND x.transaction_id = v_txn AND x.payment_no <> p.payment_no;
		v_taken := FOUND;
		SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 p.status, p.amount, p.transaction_id, p.created_at,
															 v_order_status, v_taken);
	END IF;

	IF d.verdict = 'duplicate' THEN
		outcome := 'duplicate';		-- applied meanwhile, by the delivery we waited for
		RETURN;
	ELSIF d.verdict = 'rejected' THEN
		-- A refusal changes nothing but one anomaly row, and a repeat of the
		-- same refusal adds none (it is answered with the open one).
		IF d.anomaly_kind IS NOT NULL THEN
			SELECT a.anomaly_id INTO v_anomaly FROM payidem.anomaly a
			 WHERE a.payment_no = p.payment_no AND a.kind = d.anomaly_kind AND a.handle_status = 'open'
			   AND a.detail @> jsonb_build_object('reported_status', v_status,
												  'reported_amount', v_amount,
												  'transaction_id', v_txn)
			 ORDER BY a.anomaly_id LIMIT 1;
		END IF;
		IF d.anomaly_kind IS NOT NULL AND v_anomaly IS NULL THEN
			INSERT INTO payidem.anomaly AS a (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN d.anomaly_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)))
			RETURNING a.anomaly_id INTO v_anomaly;
		END IF;
		outcome := 'rejected';
		anomaly_id := v_anomaly;
		RETURN;
	ELSIF d.verdict NOT IN ('applied', 'anomaly') THEN
		RAISE EXCEPTION 'payidem: unexpected verdict % on payment %', d.verdict, p.payment_no;
	ELSIF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		outcome := 'applied';
		RETURN;
	END IF;

	-- The success recorded, and the order paid if it is pending (applied),
	-- else an anomaly asks for the money's refund.  The status and the fields
	-- in one update of the row we hold locked (then the order's): the
	-- status_guard trigger checks each change against the whitelist and logs
	-- it, exactly as for transit_payment(); one new row version each.  A
	-- direct update (src/payment_result.c) unless the table has statement triggers,
	-- rules or row security that applies: then the same UPDATE in SQL.
	v_paid_at := coalesce(v_reported_at, now());
	SELECT * INTO f FROM payidem._payment_fees(p.amount, v_merchant_rate, v_binding_rate, v_channel_rate);
	IF NOT payidem._record_payment_success(p.ctid, p.payment_no, v_txn, v_paid_at, f.fee_amount, f.cost_amount) THEN
		UPDATE payidem.payment x
		   SET status = 'succeeded', updated_at = now(),
			   transaction_id = v_txn, paid_at = v_paid_at,
			   fee_amount = f.fee_amount, cost_amount = f.cost_amount
		 WHERE x.payment_no = p.payment_no;
	END IF;
	IF d.verdict = 'applied' THEN
		IF NOT payidem._record_order_paid(v_order_row, p.order_no, p.payment_no, v_paid_at) THEN
			UPDATE payidem."order" x
			   SET status = 'paid', updated_at = now(),
				   paid_payment_no = p.payment_no, paid_at = v_paid_at
			 WHERE x.order_no = p.order_no;
		END IF;
	ELSE
		INSERT INTO payidem.anomaly AS a (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)))
		RETURNING a.anomaly_id INTO anomaly_id;
	END IF;
	outcome := d.verdict;
END
$$;
COMMENT ON FUNCTION payidem._apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Internal to apply_payment_result() and apply_payment_result_ex(): the whole contract in PL/pgSQL, for every call they do not decide themselves; the outcome and the anomaly that records an anomaly or a refusal.';

CREATE FUNCTION payidem.apply_payment_result(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_apply_payment_result'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION payidem.apply_payment_result(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Apply a channel''s word on a payment (source callback|query|close; status succeeded|failed|closed; a success needs its transaction_id and amount, a paid_at within the attempt''s lifetime) exactly once per payment and status. Returns applied, duplicate, anomaly (a late success of a closed or failed payment whose order is closed or paid otherwise: paid_after_close, duplicate_payment; the payment is recorded succeeded and refund() takes it) or rejected (amount_mismatch, transaction_conflict, conflicting_result, and unknown_transaction for a success of a number of this shard that names no payment: nothing changes but an anomaly row). PI009 for another report of an unknown payment.';

-- The same call, answering also which anomaly records an anomaly or a
-- refusal (for resolve_anomaly(); NULL for the other outcomes and for a
-- refusal that records none).  The same C function decides both.
CREATE FUNCTION payidem.apply_payment_result_ex(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL,
	OUT outcome text, OUT anomaly_id bigint)
AS 'MODULE_PATHNAME', 'payidem_apply_payment_result_ex'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION payidem.apply_payment_result_ex(text, text, text, text, bigint, timestamptz, jsonb) IS
	'apply_payment_result() with the anomaly it names: outcome (applied, duplicate, anomaly, rejected) and, for anomaly and rejected, anomaly_id, the anomaly that records it (the one resolve_anomaly() takes; a repeat of a refusal names the open one). Same arguments, errors and effects.';

