-- bench/instructions.sh's lifecycle: payidem's calls and the plain-SQL
-- version a team would write without it, side by side in one database.
--
-- A lifecycle is create_order -> begin_payment -> the first success -> one
-- duplicate of it -> the merchant's notification handed out and reported
-- sent; get_order is measured beside it.  Both sides start with :past
-- lifecycles already run to the end, so no step meets empty tables.
--
-- The plain version (schema plain) keeps the guarantees the seeds give:
-- out_trade_no unique per merchant (a repeated create returns the order),
-- merchant, channel and binding active, at most one pending attempt per
-- order, the state machine as conditional UPDATEs, a payment log with a
-- unique transaction id, fees from the merchant's (or the binding's) and the
-- channel's rates, half up, an outbox row written with the payment and
-- handed out FOR UPDATE SKIP LOCKED.  It leaves out what payidem does on top:
-- the full status history with its whitelist for every writer, the payment's
-- keys, the bookkeeping checks, foreign keys, domains and CHECKs, the
-- signature of every notification (HMAC-SHA256 under the merchant's
-- encrypted secret, in the database), the lease and retry schedule, limits.
-- Each step is one PL/pgSQL function, so its statements are planned once per
-- session, as a driver's prepared statements are (an SQL-language function's
-- would be planned at every call).
CREATE EXTENSION payidem;
CREATE SCHEMA bench;
CREATE TABLE bench.merchant AS SELECT merchant_no FROM payidem.create_merchant('Bench Shop', 'retail', 0.006);
SELECT payidem.create_channel('BENCH_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(merchant_no, 'BENCH_WX') FROM bench.merchant;

CREATE SCHEMA plain;
CREATE TABLE plain.merchant (
	merchant_no text PRIMARY KEY, status text NOT NULL DEFAULT 'active', fee_rate numeric NOT NULL,
	notify_url text);
CREATE TABLE plain.channel (
	channel_no text PRIMARY KEY, status text NOT NULL DEFAULT 'active', fee_rate numeric NOT NULL);
CREATE TABLE plain.binding (
	merchant_no text NOT NULL, channel_no text NOT NULL, status text NOT NULL DEFAULT 'active',
	fee_rate numeric, PRIMARY KEY (merchant_no, channel_no));
CREATE TABLE plain.orders (
	order_no text PRIMARY KEY, merchant_no text NOT NULL, out_trade_no text NOT NULL,
	subject text NOT NULL, amount bigint NOT NULL, status text NOT NULL DEFAULT 'pending',
	notify_url text, expire_at timestamptz NOT NULL, paid_at timestamptz, paid_payment_no text,
	created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
	UNIQUE (merchant_no, out_trade_no));
CREATE TABLE plain.payment (
	payment_no text PRIMARY KEY, order_no text NOT NULL, merchant_no text NOT NULL, channel_no text NOT NULL,
	amount bigint NOT NULL, status text NOT NULL DEFAULT 'pending', transaction_id text,
	fee_amount bigint, cost_amount bigint, paid_at timestamptz,
	created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON plain.payment (order_no);
CREATE UNIQUE INDEX ON plain.payment (order_no) WHERE status = 'pending';
CREATE TABLE plain.payment_log (
	id bigserial PRIMARY KEY, payment_no text NOT NULL, channel_no text NOT NULL, transaction_id text NOT NULL,
	amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (channel_no, transaction_id));
CREATE TABLE plain.outbox (
	id bigserial PRIMARY KEY, order_no text NOT NULL, event text NOT NULL, payload text NOT NULL,
	status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0,
	next_attempt_at timestamptz DEFAULT now(), sent_at timestamptz);
CREATE INDEX ON plain.outbox (next_attempt_at) WHERE status = 'pending';
INSERT INTO plain.merchant (merchant_no, fee_rate) SELECT merchant_no, 0.006 FROM bench.merchant;
INSERT INTO plain.channel VALUES ('BENCH_WX', 'active', 0.002);
INSERT INTO plain.binding (merchant_no, channel_no) SELECT merchant_no, 'BENCH_WX' FROM bench.merchant;

CREATE FUNCTION plain.create_order(p_merchant text, p_out_trade_no text, p_amount bigint, p_subject text,
								   p_notify_url text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_no text;
	o plain.orders;
BEGIN
	IF p_amount IS NULL OR p_amount <= 0 THEN
		RAISE EXCEPTION 'invalid amount %', p_amount USING ERRCODE = '22023';
	END IF;
	PERFORM 1 FROM plain.merchant m WHERE m.merchant_no = p_merchant AND m.status = 'active';
	IF NOT FOUND THEN
		RAISE EXCEPTION 'merchant % cannot take orders', p_merchant;
	END IF;
	INSERT INTO plain.orders (order_no, merchant_no, out_trade_no, subject, amount, notify_url, expire_at)
	VALUES (payidem.gen_order_no('PO'), p_merchant, p_out_trade_no, p_subject, p_amount, p_notify_url,
			now() + interval '2 hours')
	ON CONFLICT (merchant_no, out_trade_no) DO NOTHING
	RETURNING order_no INTO v_no;
	IF v_no IS NOT NULL THEN
		RETURN v_no;
	END IF;
	SELECT * INTO o FROM plain.orders x WHERE x.merchant_no = p_merchant AND x.out_trade_no = p_out_trade_no;
	IF o.amount <> p_amount OR o.subject <> p_subject THEN
		RAISE EXCEPTION 'out_trade_no % used with other terms', p_out_trade_no;
	END IF;
	RETURN o.order_no;
END
$$;

CREATE FUNCTION plain.begin_payment(p_order_no text, p_channel text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	o plain.orders;
	v_no text;
BEGIN
	SELECT * INTO o FROM plain.orders x WHERE x.order_no = p_order_no FOR NO KEY UPDATE;
	IF NOT FOUND OR o.status <> 'pending' OR o.expire_at <= now() THEN
		RAISE EXCEPTION 'order % cannot take a payment', p_order_no;
	END IF;
	PERFORM 1 FROM plain.merchant m JOIN plain.binding b ON b.merchant_no = m.merchant_no
			  JOIN plain.channel c ON c.channel_no = b.channel_no
	 WHERE m.merchant_no = o.merchant_no AND b.channel_no = p_channel
	   AND m.status = 'active' AND b.status = 'active' AND c.status = 'active';
	IF NOT FOUND THEN
		RAISE EXCEPTION 'channel % is not open to merchant %', p_channel, o.merchant_no;
	END IF;
	SELECT payment_no INTO v_no FROM plain.payment p WHERE p.order_no = p_order_no AND p.status = 'pending';
	IF FOUND THEN
		RETURN v_no;
	END IF;
	v_no := payidem.gen_order_no('PY');
	INSERT INTO plain.payment (payment_no, order_no, merchant_no, channel_no, amount)
	VALUES (v_no, p_order_no, o.merchant_no, p_channel, o.amount);
	RETURN v_no;
END
$$;

-- the success: the state machine as conditional updates, the log's unique
-- transaction id, the fees, the outbox row; a repeat finds the payment paid
CREATE FUNCTION plain.pay(p_payment_no text, p_txn text, p_amount bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	p plain.payment;
	v_rate numeric;
	v_cost numeric;
BEGIN
	SELECT * INTO p FROM plain.payment x WHERE x.payment_no = p_payment_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'payment % not found', p_payment_no;
	END IF;
	IF p.status = 'succeeded' AND p.transaction_id = p_txn THEN
		RETURN 'duplicate';
	END IF;
	IF p.status <> 'pending' OR p.amount <> p_amount THEN
		RETURN 'rejected';
	END IF;
	SELECT coalesce(b.fee_rate, m.fee_rate), c.fee_rate INTO v_rate, v_cost
	  FROM plain.merchant m JOIN plain.channel c ON c.channel_no = p.channel_no
	  LEFT JOIN plain.binding b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
	 WHERE m.merchant_no = p.merchant_no;
	UPDATE plain.payment
	   SET status = 'succeeded', transaction_id = p_txn, paid_at = now(), updated_at = now(),
		   fee_amount = round(p.amount * v_rate), cost_amount = round(p.amount * v_cost)
	 WHERE payment_no = p_payment_no AND status = 'pending';
	INSERT INTO plain.payment_log (payment_no, channel_no, transaction_id, amount)
	VALUES (p_payment_no, p.channel_no, p_txn, p.amount);
	UPDATE plain.orders
	   SET status = 'paid', paid_at = now(), paid_payment_no = p_payment_no, updated_at = now()
	 WHERE order_no = p.order_no AND status = 'pending';
	IF FOUND THEN
		INSERT INTO plain.outbox (order_no, event, payload)
		VALUES (p.order_no, 'order.paid',
				json_build_object('event', 'order.paid', 'order_no', p.order_no, 'amount', p.amount,
								  'payment_no', p_payment_no, 'transaction_id', p_txn, 'paid_at', now())::text);
	END IF;
	RETURN 'applied';
END
$$;

CREATE FUNCTION plain.notify_due(p_max int)
RETURNS TABLE (id bigint, order_no text, notify_url text, payload text, attempt int)
LANGUAGE plpgsql AS $$
BEGIN
	-- one due row at a time (a statement with no parameter, planned once: the
	-- same statement with LIMIT p_max would be planned again at every call)
	FOR i IN 1 .. p_max LOOP
		UPDATE plain.outbox x SET attempts = x.attempts + 1, next_attempt_at = now() + interval '60 seconds'
		 WHERE x.id = (SELECT y.id FROM plain.outbox y
						WHERE y.status = 'pending' AND y.next_attempt_at <= now()
						ORDER BY y.next_attempt_at LIMIT 1
						  FOR UPDATE SKIP LOCKED)
		RETURNING x.id, x.order_no, x.payload, x.attempts INTO id, order_no, payload, attempt;
		EXIT WHEN NOT FOUND;
		SELECT o.notify_url INTO notify_url FROM plain.orders o WHERE o.order_no = notify_due.order_no;
		RETURN NEXT;
	END LOOP;
END
$$;

CREATE FUNCTION plain.notify_result(p_id bigint, p_ok boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF p_ok THEN
		UPDATE plain.outbox SET status = 'sent', sent_at = now(), next_attempt_at = NULL
		 WHERE id = p_id AND status = 'pending';
	ELSE
		UPDATE plain.outbox SET next_attempt_at = now() + interval '30 seconds'
		 WHERE id = p_id AND status = 'pending';
	END IF;
END
$$;

CREATE FUNCTION plain.get_order(p_order_no text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
	RETURN (SELECT to_jsonb(o) || jsonb_build_object('payments',
				coalesce((SELECT jsonb_agg(to_jsonb(p) ORDER BY p.created_at) FROM plain.payment p
						   WHERE p.order_no = o.order_no), '[]'))
			  FROM plain.orders o WHERE o.order_no = p_order_no);
END
$$;

-- what each measured lifecycle has made so far (bench/instructions.sh fills it
-- between the steps, outside the counts)
CREATE TABLE bench.lc (side text, k bigint, order_no text, amount bigint, payment_no text, event_id bigint,
					   PRIMARY KEY (side, k));

-- :past lifecycles run to the end on both sides
SELECT count(payidem.begin_payment(payidem.create_order(m.merchant_no, 'PAST-' || i, 1000 + i, 'bench',
			'https://shop.example/notify'), 'BENCH_WX'))
  FROM bench.merchant m, generate_series(1, :past) i;
SELECT count(payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'PASTTX' || p.payment_no, p.amount))
  FROM payidem.payment p;
SELECT count(payidem.notify_result(n.event_id, true, 'ok', n.attempt)) FROM payidem.notify_due(:past) n;
SELECT count(plain.begin_payment(plain.create_order(m.merchant_no, 'PAST-' || i, 1000 + i, 'bench',
			'https://shop.example/notify'), 'BENCH_WX'))
  FROM bench.merchant m, generate_series(1, :past) i;
SELECT count(plain.pay(p.payment_no, 'PASTTX' || p.payment_no, p.amount)) FROM plain.payment p;
SELECT count(plain.notify_result(n.id, true)) FROM plain.notify_due(:past) n;
SELECT 'no past event left due' AS check
 WHERE NOT EXISTS (SELECT 1 FROM payidem.notify_event WHERE status = 'pending')
   AND NOT EXISTS (SELECT 1 FROM plain.outbox WHERE status = 'pending');
VACUUM ANALYZE;
