------------------------------------------------------------------------------
-- Payment flow: orders, attempts, results, refunds, notifications
------------------------------------------------------------------------------

-- Lock order, everywhere in this section: payment row(s) first, then the
-- order row, then refund rows.  begin_payment and close_order, which start from
-- an order, take the order's pending attempt first where they lock it.
-- All nine functions run as the extension owner (SECURITY DEFINER): an
-- application role needs only EXECUTE (grant_app); no table is granted.

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

CREATE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no text := create_order.merchant_no;
	v_out_trade_no text := create_order.out_trade_no;
	v_amount bigint := create_order.amount;
	v_subject text := create_order.subject;
	v_status text;
	v_order_no text;
	o payidem."order";
BEGIN
	PERFORM payidem._require('merchant_no', create_order.merchant_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		RAISE EXCEPTION 'invalid order amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be a positive number of minor units (fen, cents).',
							coalesce(v_amount::text, 'NULL')),
			HINT = 'Pass 12.50 CNY as 1250.';
	END IF;
	IF v_subject IS NULL OR NOT payidem._fits(v_subject, 'payidem.order_subject') THEN
		RAISE EXCEPTION 'invalid order subject' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The subject was %s; it must have 1 to 256 characters (not only spaces).',
							coalesce(quote_literal(left(v_subject, 64)), 'NULL')),
			HINT = 'Describe what is being paid for, e.g. ''Green tea 250 g''.';
	END IF;
	PERFORM payidem._check_no_controls('invalid order subject', 'The subject', v_subject);
	IF v_out_trade_no IS NULL OR NOT payidem._fits(v_out_trade_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_trade_no', v_out_trade_no, 'payidem.merchant_ref',
										'Use the merchant''s own order number, e.g. SHOP-20261129-0001.');
	END IF;
	PERFORM payidem._check_duration('invalid expiry', 'expire_in', expire_in, false,
									'The default is ''2 hours''.');
	IF NOT payidem._fits(notify_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('notify_url', notify_url, 'payidem.http_url',
										'Pass NULL for no merchant notification.');
	END IF;
	IF NOT payidem._fits(return_url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('return_url', return_url, 'payidem.http_url', 'Pass NULL for none.');
	END IF;
	IF NOT payidem._fits(body, 'payidem.order_body') THEN
		RAISE EXCEPTION 'invalid order body' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The body has %s characters; at most 1024 are allowed.', length(body));
	END IF;

	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = v_merchant_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % does not exist', coalesce(quote_literal(left(v_merchant_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.merchant has no row with that merchant_no.';
	END IF;
	IF v_status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', v_merchant_no, v_status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', v_merchant_no, v_status),
			HINT = 'Only active merchants take orders.';
	END IF;

	-- the unique constraint decides between concurrent first calls; the loser
	-- waits for the winner's commit, then reads its row below
	INSERT INTO payidem."order" AS x (order_no, merchant_no, out_trade_no, subject, body, amount,
									  notify_url, return_url, expire_at)
	VALUES (payidem.gen_order_no('PO'), v_merchant_no, v_out_trade_no, v_subject, create_order.body, v_amount,
			create_order.notify_url, create_order.return_url, now() + expire_in)
	ON CONFLICT ON CONSTRAINT order_out_trade_no_key DO NOTHING
	RETURNING x.order_no INTO v_order_no;
	IF v_order_no IS NOT NULL THEN
		RETURN v_order_no;
	END IF;

	SELECT * INTO o FROM payidem."order" x
	 WHERE x.merchant_no = v_merchant_no AND x.out_trade_no = v_out_trade_no;
	IF NOT FOUND THEN	-- cannot happen: the conflicting row is committed and never deleted
		RAISE EXCEPTION 'order % of merchant % vanished', v_out_trade_no, v_merchant_no;
	END IF;
	IF o.amount <> v_amount THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another amount', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has amount %s; this call asked for %s.',
							o.order_no, v_merchant_no, v_out_trade_no, o.amount, v_amount),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	IF o.subject <> v_subject THEN
		RAISE EXCEPTION 'out_trade_no % was already used with another subject', v_out_trade_no USING
			ERRCODE = 'PI001',
			DETAIL = format('Order %s of merchant %s (out_trade_no %s) has subject %L; this call asked for %L.',
							o.order_no, v_merchant_no, v_out_trade_no, left(o.subject, 64), left(v_subject, 64)),
			HINT = 'A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.';
	END IF;
	RETURN o.order_no;
END
$$;
COMMENT ON FUNCTION payidem.create_order(text, text, bigint, text, text, text, interval, text) IS
	'New pending order (order_no = gen_order_no(''PO'')). Idempotent on (merchant_no, out_trade_no): the same amount and subject return the existing order_no, others raise PI001. PI009 unknown merchant, PI004 merchant not active, 22023 bad input.';

-- REPEATABLE READ and the checks that read other sessions' rows after a lock:
-- under READ COMMITTED each statement sees what committed before it, so a sum
-- read after taking a row lock counts the rows of whoever held it; under
-- SERIALIZABLE a race ends in 40001.  A REPEATABLE READ snapshot would miss
-- them (two refunds above the paid amount, a daily limit passed, a pending
-- attempt left on a closed order): refused instead.
CREATE FUNCTION payidem._refuse_repeatable_read(fn text, reads text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		RAISE EXCEPTION '%() cannot run in a REPEATABLE READ transaction', fn USING
			ERRCODE = 'feature_not_supported',
			DETAIL = format('It checks %s after taking a row lock; a REPEATABLE READ snapshot does not show what other sessions committed meanwhile.', reads),
			HINT = 'Call it in READ COMMITTED (the default) or SERIALIZABLE (retry on SQLSTATE 40001).';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._refuse_repeatable_read(text, text) IS
	'Internal to begin_payment(), close_order() and refund(): raises 0A000 inside a REPEATABLE READ transaction.';

CREATE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text := begin_payment.order_no;
	v_channel_no text := begin_payment.channel_no;
	o payidem."order";
	m payidem.merchant;
	c payidem.channel;
	b payidem.merchant_channel;
	p payidem.payment;
	v_tz text;
	v_day_start timestamptz;
	v_used numeric;		-- a day's sum may pass the bigint range
	v_payment_no text;
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		PERFORM payidem._refuse_repeatable_read('begin_payment', 'the order''s pending attempt and the daily limit');
	END IF;
	PERFORM payidem._require('channel_no', begin_payment.channel_no);
	PERFORM payidem._check_number('order', begin_payment.order_no);
	SELECT * INTO o FROM payidem."order" x WHERE x.order_no = v_order_no FOR NO KEY UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'order % does not exist', coalesce(quote_literal(left(v_order_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem."order" has no row with that order_no.';
	END IF;
	IF o.status <> 'pending' THEN
		RAISE EXCEPTION 'order % cannot take a payment', o.order_no USING
			ERRCODE = 'PI002',
			DETAIL = format('Order %s is %s; only a pending order takes a payment.', o.order_no, o.status),
			HINT = CASE WHEN o.status = 'closed' THEN 'Create a new order (with a new out_trade_no).'
						ELSE 'The order is already paid.' END;
	END IF;
	IF o.expire_at <= now() THEN
		RAISE EXCEPTION 'order % has expired', o.order_no USING
			ERRCODE = 'PI008',
			DETAIL = format('Order %s expired at %s.', o.order_no, o.expire_at),
			HINT = 'Close it with payidem.close_order() and create a new order.';
	END IF;

	SELECT * INTO m FROM payidem.merchant x WHERE x.merchant_no = o.merchant_no;
	IF m.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is %', m.merchant_no, m.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Merchant %s has status %s.', m.merchant_no, m.status),
			HINT = 'Only active merchants take payments.';
	END IF;
	SELECT * INTO c FROM payidem.channel x WHERE x.channel_no = v_channel_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % does not exist', coalesce(quote_literal(left(v_channel_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.channel has no row with that channel_no.';
	END IF;
	IF c.status <> 'active' THEN
		RAISE EXCEPTION 'channel % is %', c.channel_no, c.status USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s has status %s.', c.channel_no, c.status),
			HINT = 'Route the payment to an active channel (payidem.route_channel()).';
	END IF;
	SELECT * INTO b FROM payidem.merchant_channel x
	 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no;
	IF NOT FOUND OR b.status <> 'active' THEN
		RAISE EXCEPTION 'merchant % is not bound to channel %', m.merchant_no, c.channel_no USING
			ERRCODE = 'PI004',
			DETAIL = CASE WHEN FOUND THEN format('The binding is %s.', b.status) ELSE 'There is no binding.' END,
			HINT = 'Bind the channel with payidem.bind_channel().';
	END IF;
	IF c.allowed_merchant_types IS NOT NULL AND NOT m.merchant_type = ANY (c.allowed_merchant_types) THEN
		RAISE EXCEPTION 'channel % does not admit merchants of type %', c.channel_no, m.merchant_type USING
			ERRCODE = 'PI004',
			DETAIL = format('Channel %s admits %s; merchant %s is %s.', c.channel_no,
							array_to_string(c.allowed_merchant_types, ', '), m.merchant_no, m.merchant_type);
	END IF;

	-- at most one pending attempt per order (we hold the order's lock, so
	-- this read is stable; the partial unique index is the final guard)
	SELECT * INTO p FROM payidem.payment x WHERE x.order_no = o.order_no AND x.status = 'pending';
	IF FOUND THEN
		IF p.channel_no = c.channel_no THEN
			RETURN p.payment_no;			-- a retried call: the same attempt
		END IF;
		RAISE EXCEPTION 'order % has a payment in progress on channel %', o.order_no, p.channel_no USING
			ERRCODE = 'PI003',
			DETAIL = format('Payment %s of order %s is pending on channel %s; this call asked for channel %s.',
							p.payment_no, o.order_no, p.channel_no, c.channel_no),
			HINT = format('Query channel %s, then close payment %s with payidem.close_payment() before starting another.',
						  p.channel_no, p.payment_no);
	END IF;

	IF o.amount > b.single_limit OR o.amount > c.single_limit THEN
		RAISE EXCEPTION 'amount exceeds the single-payment limit' USING
			ERRCODE = 'PI007',
			DETAIL = format('Order %s is for %s; the single limit is %s for merchant %s on channel %s and %s for the channel.',
							o.order_no, o.amount, coalesce(b.single_limit::text, 'none'), m.merchant_no,
							c.channel_no, coalesce(c.single_limit::text, 'none')),
			HINT = 'Use another channel, or raise the limit with payidem.bind_channel().';
	END IF;
	IF b.daily_limit IS NOT NULL OR c.daily_limit IS NOT NULL THEN
		-- serialize the day's sum of this merchant on this channel
		PERFORM 1 FROM payidem.merchant_channel x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no FOR UPDATE;
		v_tz := coalesce(nullif(current_setting('payidem.limit_timezone', true), ''), 'UTC');
		v_day_start := date_trunc('day', now() AT TIME ZONE v_tz) AT TIME ZONE v_tz;
		SELECT coalesce(sum(x.amount), 0) INTO v_used FROM payidem.payment x
		 WHERE x.merchant_no = m.merchant_no AND x.channel_no = c.channel_no
		   AND x.created_at >= v_day_start
		   AND (x.status = 'pending' OR x.status = ANY (payidem._paid_payment_statuses()));
		IF v_used + o.amount > b.daily_limit OR v_used + o.amount > c.daily_limit THEN
			RAISE EXCEPTION 'amount exceeds the daily limit' USING
				ERRCODE = 'PI007',
				DETAIL = format('Merchant %s has %s pending or paid on channel %s today (%s); with %s more the daily limit (merchant %s, channel %s) would be exceeded.',
								m.merchant_no, v_used, c.channel_no, v_tz, o.amount,
								coalesce(b.daily_limit::text, 'none'), coalesce(c.daily_limit::text, 'none')),
				HINT = 'Use another channel, or try again tomorrow.';
		END IF;
	END IF;

	v_payment_no := payidem.gen_order_no('PY');
	INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
	VALUES (v_payment_no, o.order_no, m.merchant_no, c.channel_no, o.amount);
	RETURN v_payment_no;
END
$$;
COMMENT ON FUNCTION payidem.begin_payment(text, text) IS
	'Start (or, on the same channel, return again) the pending payment attempt of an order; payment_no = gen_order_no(''PY''). PI009, PI002 (order not pending), PI008 (expired), PI004 (merchant/channel/binding/type), PI003 (pending on another channel), PI007 (limits).';

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

-- The transaction-level lock two deliveries of one channel transaction id
-- for two payments take (src/flow.c, where its key is made for both paths).
CREATE FUNCTION payidem._lock_transaction_id(channel_no text, transaction_id text, wait boolean)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_lock_transaction_id'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._lock_transaction_id(text, text, boolean) IS
	'Internal to apply_payment_result(): take the transaction-level lock on channel_no''s transaction_id; without waiting, false if another transaction holds it.';

-- The contract of apply_payment_result() in full.  apply_payment_result()
-- itself (src/flow.c) answers a repeated success and writes the first success
-- of a pending payment of a pending order, and passes every other call here
-- unchanged.  Both read the facts and take _decide_payment_result()'s verdict.
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
	v_reported_at ALIAS FOR $6;
	v_paid_at timestamptz;
	v_order_no text;
	v_other text;
	v_taken boolean;
	v_order_status text;
	v_order_paid_by text;
	v_order_row tid;
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
			RETURN 'duplicate';
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
			INSERT INTO payidem.anomaly (kind, amount, detail)
			VALUES (d.anomaly_kind, v_amount,
					jsonb_build_object('reported_payment_no', v_payment_no, 'transaction_id', v_txn,
									   'reported_amount', v_amount, 'source', v_source,
									   'paid_at', coalesce(v_reported_at, now()),
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
	SELECT x.ctid, x.payment_no, x.order_no, x.channel_no, x.amount, x.status, x.transaction_id,
		   x.created_at INTO p
	  FROM payidem.payment x WHERE x.payment_no = v_payment_no FOR NO KEY UPDATE;
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
		v_taken := FOUND;
		SELECT * INTO d FROM payidem._decide_payment_result(v_payment_no, v_status, v_amount, v_txn, v_reported_at,
															 p.status, p.amount, p.transaction_id, p.created_at,
															 v_order_status, v_taken);
	END IF;

	IF d.verdict = 'duplicate' THEN
		RETURN 'duplicate';		-- applied meanwhile, by the delivery we waited for
	ELSIF d.verdict = 'rejected' THEN
		-- A refusal changes nothing but one anomaly row, and a repeat of the
		-- same refusal adds none.
		IF d.anomaly_kind IS NOT NULL AND NOT EXISTS (
				SELECT 1 FROM payidem.anomaly a
				 WHERE a.payment_no = p.payment_no AND a.kind = d.anomaly_kind AND a.handle_status = 'open'
				   AND a.detail @> jsonb_build_object('reported_status', v_status,
													  'reported_amount', v_amount,
													  'transaction_id', v_txn)) THEN
			INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
			VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, coalesce(v_amount, p.amount),
					jsonb_build_object('reported_status', v_status, 'reported_amount', v_amount,
									   'transaction_id', v_txn, 'source', v_source,
									   'payment_status', p.status, 'payment_amount', p.amount,
									   'payment_transaction_id', p.transaction_id,
									   'other_payment_no', CASE WHEN d.anomaly_kind = 'transaction_conflict' THEN v_other END,
									   'raw', payidem._flow_raw(raw)));
		END IF;
		RETURN 'rejected';
	ELSIF d.verdict NOT IN ('applied', 'anomaly') THEN
		RAISE EXCEPTION 'payidem: unexpected verdict % on payment %', d.verdict, p.payment_no;
	ELSIF v_status <> 'succeeded' THEN
		-- failed or closed of a pending payment
		PERFORM payidem.transit_payment(p.payment_no, v_status);
		RETURN 'applied';
	END IF;

	-- The success recorded, and the order paid if it is pending (applied),
	-- else an anomaly asks for the money's refund.  The status and the fields
	-- in one update of the row we hold locked (then the order's): the
	-- status_guard trigger checks each change against the whitelist and logs
	-- it, exactly as for transit_payment(); one new row version each.  A
	-- direct update (src/flow.c) unless the table has statement triggers,
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
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		VALUES (d.anomaly_kind, p.order_no, p.payment_no, p.channel_no, p.amount,
				jsonb_build_object('transaction_id', v_txn, 'source', v_source, 'paid_at', v_paid_at,
								   'payment_status_before', p.status,
								   'order_status', v_order_status, 'paid_payment_no', v_order_paid_by,
								   'action', 'refund this payment with payidem.refund()',
								   'raw', payidem._flow_raw(raw)));
	END IF;
	RETURN d.verdict;
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
		RAISE EXCEPTION 'order % does not exist', coalesce(quote_literal(left(v_order_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem."order" has no row with that order_no.';
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

-- The payment's keys (payidem.payment_pending, payidem.payment_paid): its
-- trigger, on every write of a payment (src/flow.c: in C, it returns at once
-- unless the payment became or stopped being pending, or its channel,
-- transaction id or paid_at changed; the keys are written as their owner,
-- whoever writes the payment).  status_keys fires after status_guard, so a
-- change the whitelist refuses is reported as that first.  ENABLE ALWAYS:
-- also in session_replication_role = replica (a restore or a replication
-- apply loading payments), where the other triggers stand aside; only a
-- DISABLE TRIGGER leaves the keys behind (rebuild_payment_keys(), below).
CREATE FUNCTION payidem._payment_keys()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys() IS
	'Trigger status_keys on payidem.payment: its pending attempt per order and its transaction id and paid_at per channel into payidem.payment_pending and payidem.payment_paid.';
CREATE TRIGGER status_keys
	AFTER INSERT OR UPDATE OR DELETE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys;
CREATE FUNCTION payidem._payment_keys_truncate()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	TRUNCATE payidem.payment_pending, payidem.payment_paid;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION payidem._payment_keys_truncate() IS
	'Trigger status_keys_truncate on payidem.payment: a TRUNCATE of the payments empties their keys too.';
CREATE TRIGGER status_keys_truncate
	AFTER TRUNCATE ON payidem.payment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncate();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys_truncate;
-- The keys a logical-replication worker receives (a publication FOR ALL
-- TABLES or TABLES IN SCHEMA payidem includes them): skipped, as the
-- subscriber's status_keys makes them from the payments it receives
-- (src/flow.c).  ENABLE REPLICA: it fires in session_replication_role =
-- replica only, where such a worker writes.
CREATE FUNCTION payidem._payment_keys_received()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_received'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys_received() IS
	'Trigger keys_received on payidem.payment_pending and payidem.payment_paid: a logical-replication worker''s rows are skipped; the subscriber''s status_keys makes its keys from its payments.';
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_pending
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_received;
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_paid
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_received;
-- A TRUNCATE of a key table such a worker applies: the table made again from
-- the subscriber's payments (src/flow.c).
CREATE FUNCTION payidem._payment_keys_truncated()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_truncated'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys_truncated() IS
	'Trigger keys_truncated on payidem.payment_pending and payidem.payment_paid: a TRUNCATE a logical-replication worker applies is followed by the keys of the subscriber''s payments.';
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_pending
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_truncated;
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_paid
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_truncated;
-- No replica identity: the rows go only where payidem's C code (the trigger,
-- the rebuild) writes them, below the executor, and a publication that
-- includes the tables then sends their inserts (which a subscriber skips)
-- and no delete (which it would not find: its own trigger removed the row).
ALTER TABLE payidem.payment_pending REPLICA IDENTITY NOTHING;
ALTER TABLE payidem.payment_paid REPLICA IDENTITY NOTHING;

-- The keys made again from the payments: after payments were written with
-- the triggers off (session_replication_role = replica, DISABLE TRIGGER);
-- how many rows they hold.  Refused (23505, naming the constraint) if the
-- payments break a rule the keys carry: two pending attempts of one order,
-- one transaction id on two payments of a channel.
CREATE FUNCTION payidem._payment_keys_fill()
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_payment_keys_fill'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem._payment_keys_fill() IS
	'Internal (rebuild_payment_keys): payidem.payment_pending and payidem.payment_paid emptied and made again from every payment, as trigger status_keys makes them; how many rows.';
CREATE FUNCTION payidem.rebuild_payment_keys()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.payment IN SHARE MODE;
	RETURN payidem._payment_keys_fill();
END
$$;
COMMENT ON FUNCTION payidem.rebuild_payment_keys() IS
	'Make payidem.payment_pending and payidem.payment_paid again from the payments (after payments were written with the triggers off); how many rows they hold. Reads every payment under a SHARE lock.';

-- The expiry queue (payidem.order_expiry): its trigger, on every insert of an
-- order and every change of an order's status or expire_at (src/housekeeping.c:
-- in C, it returns at once unless the order is pending with a time not yet
-- queued; the queue is written as the table's owner, whoever writes the order).
CREATE FUNCTION payidem._queue_expiry()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_queue_expiry'
LANGUAGE C;
COMMENT ON FUNCTION payidem._queue_expiry() IS
	'Trigger order_expiry_queue on payidem."order": a pending order''s expire_at into payidem.order_expiry.';
-- (every UPDATE, not UPDATE OF status, expire_at: a BEFORE trigger may change
-- either without the statement naming it)
CREATE TRIGGER order_expiry_queue
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem._queue_expiry();

-- The queue made again from the orders: for pending orders written with the
-- triggers off (session_replication_role = replica, DISABLE TRIGGER), which
-- add no row; how many rows it added.
CREATE FUNCTION payidem.rebuild_expiry_queue()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH added AS (
		INSERT INTO payidem.order_expiry (expire_at, order_no)
		SELECT x.expire_at, x.order_no FROM payidem."order" x WHERE x.status = 'pending'
		ON CONFLICT ON CONSTRAINT order_expiry_pkey DO NOTHING
		RETURNING 1)
	SELECT count(*) FROM added
$$;
COMMENT ON FUNCTION payidem.rebuild_expiry_queue() IS
	'Queue the expiry of every pending order not queued at its expire_at (after pending orders were written with the triggers off); how many rows were added. Reads every order.';

-- Housekeeping (the background worker, src/housekeeping.c): a run first
-- removes from the queue, in batches, the rows whose time has passed and
-- whose order is no longer pending at that time (locking those orders FOR
-- SHARE SKIP LOCKED, so an order a transaction is changing is looked at
-- again next time, and one made pending again meanwhile keeps its row);
-- then reads the expired orders once and closes each in a transaction of
-- its own, so it never holds more than one order's lock, a failure on one
-- order stops only that one, and no call scans again what the ones before
-- it passed.
CREATE FUNCTION payidem._prune_expiry_queue(max_rows integer)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH done AS (
		SELECT q.expire_at, q.order_no
		  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
		 WHERE q.expire_at <= now() AND (x.status <> 'pending' OR x.expire_at <> q.expire_at)
		 ORDER BY q.expire_at, q.order_no
		 LIMIT max_rows
		   FOR SHARE OF x SKIP LOCKED),
	gone AS (
		DELETE FROM payidem.order_expiry q USING done d
		 WHERE q.expire_at = d.expire_at AND q.order_no = d.order_no
		RETURNING 1),
	-- rows whose order does not exist (only a writer of the queue itself
	-- could make one)
	orphans AS (
		DELETE FROM payidem.order_expiry q
		 WHERE q.expire_at <= now()
		   AND NOT EXISTS (SELECT 1 FROM payidem."order" x WHERE x.order_no = q.order_no)
		RETURNING 1)
	SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM orphans)
$$;
COMMENT ON FUNCTION payidem._prune_expiry_queue(integer) IS
	'Internal (housekeeping): remove up to max_rows rows of payidem.order_expiry past their time whose order is no longer pending at it; how many were removed.';

CREATE FUNCTION payidem._expired_orders(max_rows integer)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	SELECT x.order_no::text
	  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
	 WHERE q.expire_at <= now() AND x.status = 'pending' AND x.expire_at = q.expire_at
	   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
						WHERE p.order_no = x.order_no AND p.status = 'pending')
	 ORDER BY q.expire_at, q.order_no
	 LIMIT max_rows
$$;
COMMENT ON FUNCTION payidem._expired_orders(integer) IS
	'Internal (housekeeping): up to max_rows orders past expire_at with no pending attempt, oldest expiry first; no lock taken.';

-- Close one of them as close_order() closes it, if it still is one: its lock
-- is taken with SKIP LOCKED (an order a payment call holds is left for the
-- next run), and its attempts are read once the lock is ours (an attempt
-- begin_payment() committed meanwhile is the channel's to decide).  true:
-- closed now.
CREATE FUNCTION payidem._close_expired_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text;
BEGIN
	SELECT x.order_no INTO v_order_no FROM payidem."order" x
	 WHERE x.order_no = _close_expired_order.order_no AND x.status = 'pending' AND x.expire_at <= now()
	   FOR NO KEY UPDATE SKIP LOCKED;
	IF v_order_no IS NULL
	   OR EXISTS (SELECT 1 FROM payidem.payment p WHERE p.order_no = v_order_no AND p.status = 'pending') THEN
		RETURN false;
	END IF;
	RETURN payidem.close_order(v_order_no);
END
$$;
COMMENT ON FUNCTION payidem._close_expired_order(text) IS
	'Internal (housekeeping): close this order if it is still pending, expired, free (SKIP LOCKED) and without a pending attempt; true if closed now.';

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
		RAISE EXCEPTION 'invalid refund amount' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The amount was %s; it must be a positive number of minor units.', coalesce(v_amount::text, 'NULL'));
	END IF;
	IF v_out_refund_no IS NULL OR NOT payidem._fits(v_out_refund_no, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_refund_no', v_out_refund_no, 'payidem.merchant_ref',
										'Use the merchant''s own refund number.');
	END IF;
	IF NOT payidem._fits(reason, 'payidem.refund_reason') THEN
		RAISE EXCEPTION 'invalid refund reason' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The reason has %s characters; at most 256 are allowed.', length(reason));
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
		RAISE EXCEPTION 'payment % does not exist', coalesce(quote_literal(left(v_payment_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.payment has no row with that payment_no.';
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
		RAISE EXCEPTION 'invalid refund result status' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The status was %s; it must be succeeded or failed.',
							coalesce(quote_literal(left(v_status, 64)), 'NULL'));
	END IF;
	IF NOT payidem._fits(v_crid, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('channel_refund_id', v_crid, 'payidem.channel_ref');
	END IF;

	-- the lock order of every flow function: the order (a success moves
	-- it), then the payment, then the refund; their numbers never change
	SELECT x.payment_no, x.order_no INTO v_payment_no, v_order_no FROM payidem.refund x WHERE x.refund_no = v_refund_no;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'refund % does not exist', coalesce(quote_literal(left(v_refund_no, 64)), 'NULL') USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.refund has no row with that refund_no.';
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
	IF o.status <> v_order_status AND NOT EXISTS (
			SELECT 1 FROM payidem.transition t
			 WHERE t.entity = 'order' AND t.from_status = o.status AND t.to_status = v_order_status) THEN
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

-- Merchant notifications: one event per order.paid, refund.succeeded and
-- order.closed, written by the status_notify triggers (below) in the
-- transaction of the change, whoever makes it (a flow function, its C fast
-- path, a DBA's transit_order()).  The payload is built once, when the event
-- is written, and never again: it says the state at the event.

-- The event of an order that became paid or closed, or of a refund that
-- succeeded: src/notify.c, the one place an event's row and payload are
-- made and the one place it is decided which changes have one
-- (docs/notifications.md).  Not SECURITY DEFINER: it switches to the tables'
-- owner itself, so that the event is written whoever changed the row,
-- without a setting saved and restored on every call; it reads by key and
-- writes the event directly (src/write.c), without SQL.
CREATE FUNCTION payidem._status_event()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'payidem_status_event';
COMMENT ON FUNCTION payidem._status_event() IS
	'Trigger status_notify on payidem."order" and payidem.refund: the notification event of the change, with its payload (docs/notifications.md).';

-- Named to fire after status_guard and status_ledger (AFTER triggers fire in
-- name order): a change they refuse writes no event.  No WHEN clause: the
-- function returns at once for a change it does not report (a WHEN clause
-- would be read from the catalog and planned at every direct update of the
-- payment flow, which builds its executor state per call).
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem."order"
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem.refund
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();

-- The signature: t=<unix seconds>,v1=<hex>,v2=<hex>, one v1 and v2 per secret
-- of the merchant valid now (two pairs during a rotation's grace period, the
-- current secret's first).  v2 = HMAC-SHA256(secret, "payidem-notification-v2"
-- NUL "<t>.<payload>") (_notify_v2_sign), which no sign() signature can be;
-- v1 = HMAC-SHA256(secret, "<t>.<payload>"), which is sign()'s of that text,
-- is kept for the receivers written for 1.0 and will be retired in a major
-- version (docs/notifications.md).  The only place a notification is signed.
CREATE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_t text := floor(extract(epoch FROM now()))::bigint::text;
	v_sig text := 't=' || v_t;
	s payidem.merchant_secret;
BEGIN
	FOR s IN SELECT * FROM payidem._secrets_valid_now(p_merchant_no) ORDER BY secret_version DESC LOOP
		v_sig := v_sig || ',v1=' || payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
														s.key_version, s.nonce, s.ciphertext, s.auth_tag,
														v_t || '.' || p_payload)
					   || ',v2=' || payidem._notify_v2_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
															 s.key_version, s.nonce, s.ciphertext, s.auth_tag,
															 v_t || '.' || p_payload);
	END LOOP;
	RETURN v_sig;
END
$$;
COMMENT ON FUNCTION payidem._sign_notification(text, text) IS
	'Internal: the signature header of a notification payload, signed now: t, then v1 and v2 of each secret valid now (docs/notifications.md).';

CREATE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	v_max_attempts constant integer := 16;		-- notify_result()'s schedule has 15 waits
	v_given_up bigint;
	n record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		RAISE EXCEPTION 'invalid max_rows' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			HINT = 'Pass how many events one worker takes at a time, e.g. 100.';
	END IF;
	-- a closed merchant's key signs nothing more: its due events are given
	-- up (failed), not handed out, and never hold up the others; so is an
	-- event whose last attempt was handed out and never answered
	WITH gone AS (
		SELECT e.event_id,
			   CASE WHEN m.status = 'closed' THEN 'merchant closed' ELSE 'no answer to the last attempt' END AS why
		  FROM payidem.notify_event e JOIN payidem.merchant m ON m.merchant_no = e.merchant_no
		 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
		   AND (m.status = 'closed' OR e.attempts >= v_max_attempts)
		   FOR UPDATE OF e SKIP LOCKED)
	UPDATE payidem.notify_event e
	   SET status = 'failed', next_attempt_at = NULL, last_response = gone.why
	  FROM gone WHERE e.event_id = gone.event_id;
	GET DIAGNOSTICS v_given_up = ROW_COUNT;
	IF v_given_up > 0 THEN
		PERFORM payidem._count('notify_failed', v_given_up);
	END IF;
	-- Events another worker holds are skipped.  Handing an event out is its
	-- next attempt (attempts counts hand-outs; the one handed out is named by
	-- attempt, and notify_result() takes reports of that one only) and
	-- leases it: its next_attempt_at moves ahead, so it is not handed out
	-- again after this transaction ends, until notify_result() or the lease
	-- runs out (a worker that died: that attempt had no answer).
	FOR n IN
		WITH due AS (
			SELECT e.event_id FROM payidem.notify_event e
			 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
			   AND e.attempts < v_max_attempts
			   AND NOT EXISTS (SELECT 1 FROM payidem.merchant m
								WHERE m.merchant_no = e.merchant_no AND m.status = 'closed')
			 ORDER BY e.next_attempt_at
			 LIMIT max_rows
			 FOR UPDATE SKIP LOCKED)
		UPDATE payidem.notify_event e
		   SET next_attempt_at = now() + v_lease, attempts = e.attempts + 1, last_attempt_at = now()
		  FROM due WHERE e.event_id = due.event_id
		RETURNING e.event_id, e.order_no, e.merchant_no, e.event, e.payload, e.attempts
	LOOP
		signature := payidem._sign_notification(n.merchant_no, n.payload);
		IF signature !~ ',v2=' THEN
			-- no secret of the merchant is valid now: nothing to sign with; the
			-- event waits (this was no attempt) and is not sent unsigned
			UPDATE payidem.notify_event e
			   SET attempts = e.attempts - 1, next_attempt_at = now() + interval '5 minutes',
				   last_response = 'no valid API secret'
			 WHERE e.event_id = n.event_id;
			CONTINUE;
		END IF;
		event_id := n.event_id;
		order_no := n.order_no;
		merchant_no := n.merchant_no;
		SELECT x.notify_url INTO notify_url FROM payidem."order" x WHERE x.order_no = n.order_no;
		event := n.event;
		payload := n.payload;
		attempt := n.attempts;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...,v2=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

CREATE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- wait after the n-th failed attempt; after the 16th attempt: failed
	v_schedule constant interval[] := ARRAY['15 seconds', '15 seconds', '30 seconds', '3 minutes',
		'10 minutes', '20 minutes', '30 minutes', '30 minutes', '30 minutes', '60 minutes',
		'3 hours', '3 hours', '3 hours', '6 hours', '6 hours']::interval[];
	e payidem.notify_event;
BEGIN
	IF notify_result.event_id IS NULL OR notify_result.event_id <= 0 THEN
		RAISE EXCEPTION 'invalid event_id' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('event_id was %s; it must be an id notify_due() handed out.',
							coalesce(notify_result.event_id::text, 'NULL'));
	END IF;
	IF ok IS NULL THEN
		RAISE EXCEPTION 'notification result must not be NULL' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'ok was NULL.',
			HINT = 'Pass true if the merchant acknowledged the notification, false otherwise.';
	END IF;
	SELECT * INTO e FROM payidem.notify_event x WHERE x.event_id = notify_result.event_id FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'notification event % does not exist', notify_result.event_id USING
			ERRCODE = 'PI009',
			DETAIL = 'payidem.notify_event has no row with that event_id.';
	END IF;
	IF e.status <> 'pending' OR e.attempts = 0 THEN
		RETURN;			-- already sent or given up, or never handed out: nothing to report
	END IF;
	-- a report of an attempt that is not the last one handed out (its lease
	-- ran out and the event went to another worker) is stale: it changes nothing
	IF notify_result.attempt IS NOT NULL AND notify_result.attempt <> e.attempts THEN
		RETURN;
	END IF;
	IF ok THEN
		UPDATE payidem.notify_event x
		   SET status = 'sent', next_attempt_at = NULL, sent_at = now()
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_sent');
	ELSIF e.attempts > cardinality(v_schedule) THEN
		UPDATE payidem.notify_event x
		   SET status = 'failed', next_attempt_at = NULL, last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_failed');
	ELSE
		UPDATE payidem.notify_event x
		   SET next_attempt_at = now() + v_schedule[e.attempts], last_response = left(response, 256)
		 WHERE x.event_id = e.event_id;
		PERFORM payidem._count('notify_retried');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.notify_result(bigint, boolean, text, integer) IS
	'Report one delivery attempt of an event: ok = sent; not ok = retry after 15s, 15s, 30s, 3m, 10m, 20m, 30m, 30m, 30m, 60m, 3h, 3h, 3h, 6h, 6h, then failed (16 attempts); the start of a failure''s response is kept. No change if the event is no longer pending, or if attempt (as notify_due() handed it out) is given and is not the last one handed out. PI009 unknown event.';

-- The receiver's check, for tests and for merchants running PostgreSQL: a
-- signature header of the payload under a secret of api_key valid now, made
-- at most tolerance ago (or ahead: clocks differ).  Only v2 is checked: v1 is
-- sign()'s HMAC of "<t>.<payload>", which a merchant's own signed request of
-- that shape also is.  Other schemes in the header (v1 too) are ignored, as a
-- receiver should.
CREATE FUNCTION payidem.verify_notification(api_key text, payload text, signature text,
											tolerance interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_part text;
	v_t text;
	v_sigs text[] := '{}';
	v_sig text;
	s payidem.merchant_secret;
	ok boolean := false;
BEGIN
	IF tolerance IS NULL OR tolerance < interval '0' THEN
		RAISE EXCEPTION 'invalid tolerance' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('tolerance was %s; it must be zero or more.', coalesce(tolerance::text, 'NULL')),
			HINT = 'Pass how old a notification may be, e.g. ''5 minutes''.';
	END IF;
	IF api_key IS NULL OR payload IS NULL OR signature IS NULL OR length(signature) > 1024 THEN
		RETURN false;
	END IF;
	FOREACH v_part IN ARRAY string_to_array(signature, ',') LOOP
		IF v_part ~ '^t=[0-9]{1,12}$' THEN
			IF v_t IS NOT NULL THEN
				RETURN false;		-- two timestamps: which one was signed?
			END IF;
			v_t := substr(v_part, 3);
		ELSIF v_part ~ '^v2=[0-9a-f]{64}$' THEN
			v_sigs := v_sigs || substr(v_part, 4);
		END IF;
	END LOOP;
	IF v_t IS NULL OR cardinality(v_sigs) = 0
	   OR abs(floor(extract(epoch FROM now())) - v_t::numeric) > extract(epoch FROM tolerance) THEN
		RETURN false;
	END IF;
	FOR s IN
		SELECT v.* FROM payidem.merchant m, payidem._secrets_valid_now(m.merchant_no) v
		 WHERE m.api_key OPERATOR(pg_catalog.=) verify_notification.api_key
	LOOP
		-- no early exit: the time taken does not say which secret or v2 matched
		FOREACH v_sig IN ARRAY v_sigs LOOP
			ok := payidem._notify_v2_verify(payidem._secret_aad(s.merchant_no, s.secret_version),
											s.key_version, s.nonce, s.ciphertext, s.auth_tag,
											v_t || '.' || payload, v_sig) OR ok;
		END LOOP;
	END LOOP;
	RETURN ok;
END
$$;
COMMENT ON FUNCTION payidem.verify_notification(text, text, text, interval) IS
	'true if a v2 of the signature header (t=...,v1=...,v2=...) signs its t and the payload under a secret of api_key valid now and t is within tolerance of now; false otherwise (a stale t, a changed byte, a rotated-out secret, a closed merchant, a header with no v2: v1 is not checked, since a sign() signature of "<t>.<payload>" is one).';

-- Attempts past their order's expiry: the application asks the channel and
-- reports with apply_payment_result(..., 'query' | 'close', ...).  A lease
-- per attempt (60 s, as notify_due()'s) keeps two callers, or one calling
-- again, from querying the same attempt at once.
CREATE TABLE payidem.query_lease (
	payment_no		text		NOT NULL,
	leased_until	timestamptz	NOT NULL,
	CONSTRAINT query_lease_pkey PRIMARY KEY (payment_no)
);
COMMENT ON TABLE payidem.query_lease IS
	'Which expired pending attempts query_due() handed out, until when; query_due() drops the leases of attempts no longer pending.';

CREATE FUNCTION payidem.query_due(max_rows integer DEFAULT 100)
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	-- the advisory-lock space of query_due() (the first key of the pair)
	v_lock_class constant integer := hashtext('payidem.query_due');
	v_taken integer := 0;
	c record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		RAISE EXCEPTION 'invalid max_rows' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			HINT = 'Pass how many attempts one worker queries at a time, e.g. 100.';
	END IF;
	-- the leases of attempts that are no longer pending are dropped (they can
	-- never be handed out again, so no caller writes them meanwhile); one
	-- another caller is dropping is left to it
	DELETE FROM payidem.query_lease l
	 WHERE l.payment_no IN (SELECT x.payment_no FROM payidem.query_lease x
							 WHERE x.leased_until <= now()
							   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
												WHERE p.payment_no = x.payment_no AND p.status = 'pending')
							   FOR UPDATE SKIP LOCKED);
	-- Two callers never get the same attempt, and neither waits for the other.
	-- The candidates are read in expiry order and taken one at a time, until
	-- max_rows are had: an attempt another caller is handing out (its
	-- transaction-scoped advisory lock) is skipped, as SKIP LOCKED skips a
	-- row; one whose lease that caller committed after this query's snapshot
	-- is refused by the lease write itself (the upsert decides on the latest
	-- row).  Only the attempts handed out are locked (a lock per candidate
	-- read, never per pending attempt), and the attempts' rows not at all, so
	-- a payment result never waits for query_due().
	FOR c IN
		SELECT p.payment_no::text AS payment_no, p.order_no, p.channel_no, o.expire_at
		  FROM payidem.order_expiry q
		  JOIN payidem."order" o ON o.order_no = q.order_no AND o.expire_at = q.expire_at
		  JOIN payidem.payment p ON p.order_no = o.order_no AND p.status = 'pending'
		 WHERE q.expire_at <= now() AND o.status = 'pending'
		   AND NOT EXISTS (SELECT 1 FROM payidem.query_lease l
							WHERE l.payment_no = p.payment_no AND l.leased_until > now())
		 ORDER BY o.expire_at, p.payment_no
	LOOP
		CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_lock_class, hashtext(c.payment_no));
		INSERT INTO payidem.query_lease AS l (payment_no, leased_until)
		VALUES (c.payment_no, now() + v_lease)
		ON CONFLICT ON CONSTRAINT query_lease_pkey DO UPDATE SET leased_until = excluded.leased_until
		 WHERE l.leased_until <= now();
		CONTINUE WHEN NOT FOUND;
		payment_no := c.payment_no;
		order_no := c.order_no;
		channel_no := c.channel_no;
		expire_at := c.expire_at;
		RETURN NEXT;
		v_taken := v_taken + 1;
		EXIT WHEN v_taken >= max_rows;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.query_due(integer) IS
	'Up to max_rows pending payment attempts whose order has expired, oldest expiry first, each leased for 60 s (two callers never get the same one, and never wait for each other): query the channel, then report with apply_payment_result(payment_no, ''query'' or ''close'', ...).';

-- The read API: an order with its attempts and refunds, as an application
-- reads it (it has no table privileges).  get_order() and find_order() are
-- C (src/read_api.c) only to know who calls and whether row-level security
-- applies to it; _read_order() decides, run as the tables' owner.
-- (a string body: a parsed one would tie the tables' row types to this
-- function and refuse an ALTER TABLE of them that rewrites the table)
CREATE FUNCTION payidem._order_json(o payidem."order")
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
SELECT jsonb_build_object(
	'order_no', o.order_no, 'merchant_no', o.merchant_no, 'out_trade_no', o.out_trade_no,
	'subject', o.subject, 'body', o.body, 'amount', o.amount, 'currency', o.currency,
	'status', o.status, 'refunded_amount', o.refunded_amount, 'paid_payment_no', o.paid_payment_no,
	'paid_at', payidem._utc(o.paid_at), 'expire_at', payidem._utc(o.expire_at),
	'closed_at', payidem._utc(o.closed_at), 'created_at', payidem._utc(o.created_at),
	'updated_at', payidem._utc(o.updated_at), 'notify_url', o.notify_url, 'return_url', o.return_url,
	'payments', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'payment_no', p.payment_no, 'channel_no', p.channel_no, 'amount', p.amount,
					'status', p.status, 'transaction_id', p.transaction_id, 'fee_amount', p.fee_amount,
					'cost_amount', p.cost_amount, 'refunded_amount', p.refunded_amount,
					'paid_at', payidem._utc(p.paid_at), 'closed_at', payidem._utc(p.closed_at),
					'created_at', payidem._utc(p.created_at)) ORDER BY p.created_at, p.payment_no)
		  FROM payidem.payment p WHERE p.order_no = o.order_no), '[]'),
	'refunds', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'refund_no', r.refund_no, 'payment_no', r.payment_no, 'out_refund_no', r.out_refund_no,
					'amount', r.amount, 'status', r.status, 'channel_refund_id', r.channel_refund_id,
					'reason', r.reason, 'refunded_at', payidem._utc(r.refunded_at),
					'created_at', payidem._utc(r.created_at)) ORDER BY r.created_at, r.refund_no)
		  FROM payidem.refund r WHERE r.order_no = o.order_no), '[]'))
$$;
COMMENT ON FUNCTION payidem._order_json(payidem."order") IS
	'Internal to get_order() and find_order(): the order, its attempts and its refunds as one JSON object (times in UTC ISO 8601).';

-- Who reads what: a caller row-level security does not apply to, or one
-- without SELECT on "order" (an application role), reads every order; a
-- caller that reads a merchant's rows (mapped itself or as a member of a
-- mapped role: a combination grant_app() and map_merchant_role() refuse, made
-- by a later GRANT of membership or before 1.1) is refused (42501), as the
-- rest of the API would act for every merchant for it; any other reads what
-- its row-level security shows it (the policies' rule, _row_visible): an
-- auditor everything, a role unmapped nothing.
CREATE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
	a record;
BEGIN
	IF scoped THEN
		SELECT * INTO a FROM payidem._app_merchant_roles(caller) LIMIT 1;
		IF FOUND THEN
			PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function, NULL);
		END IF;
	END IF;
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		PERFORM payidem._check_number('order', _read_order.order_no);
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it)
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'order % does not exist', quote_literal(_read_order.order_no) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that order_no.';
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			RAISE EXCEPTION 'merchant % has no order %', quote_literal(left(_read_order.merchant_no, 64)),
				quote_literal(left(_read_order.out_trade_no, 64)) USING
				ERRCODE = 'PI009',
				DETAIL = 'payidem."order" has no row with that merchant_no and out_trade_no.';
		END IF;
	END IF;
	RETURN payidem._order_json(o);
END
$$;
COMMENT ON FUNCTION payidem._read_order(text, text, text, regrole, boolean) IS
	'Internal to get_order() and find_order() (src/read_api.c): the order as JSON, if the caller may read it; PI009 otherwise.';

CREATE FUNCTION payidem.get_order(order_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_get_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.get_order(text) IS
	'The order with its payment attempts and refunds, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number, 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

CREATE FUNCTION payidem.find_order(merchant_no text, out_trade_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_find_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.find_order(text, text) IS
	'The order a merchant created with out_trade_no, as get_order() shows it. PI009 if there is none (or the caller''s row-level security hides it), 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

-- (end of payment-flow functions)

