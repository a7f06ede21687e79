-- bench/flow.sh set-up: a merchant and channel, the reference handlers'
-- tables, and functions that add pending payments to the pools the
-- benchmark uses up (bench.refill_payidem(n), bench.refill_ref(n),
-- bench.refill_ref_same(n)).  flow.sh makes :pool pending payments for
-- payidem, :ref_pool for the reference and :ref_same_pool for the reference
-- on payidem's tables here, pays the first 1,000 of each for the duplicate
-- deliveries, and tops the pools up between runs.
CREATE EXTENSION payidem;
CREATE SCHEMA bench;
CREATE TABLE bench.merchant AS SELECT merchant_no FROM payidem.create_merchant('Bench Shop', 'retail', 0.006);
SELECT payidem.create_channel('BENCH_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(merchant_no, 'BENCH_WX') FROM bench.merchant;

-- n pending payments, each of a new order, in orders/payments (payidem's
-- tables or copies of them), numbered in pool after the ones it has
CREATE FUNCTION bench.refill(orders regclass, payments regclass, pool regclass, n int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format($q$
		WITH o AS (
			INSERT INTO %1$s (order_no, merchant_no, out_trade_no, subject, amount, expire_at, notify_url)
			SELECT payidem.gen_order_no('PO'), m.merchant_no, 'B-' || (k0 + i), 'bench', 1000 + (k0 + i) %% 1000,
				   now() + interval '1 day', 'https://shop.example/notify'
			  FROM bench.merchant m, generate_series(1, $1) i, (SELECT coalesce(max(k), 0) AS k0 FROM %3$s) k
			RETURNING order_no, merchant_no, amount),
		p AS (
			INSERT INTO %2$s (payment_no, order_no, merchant_no, channel_no, amount)
			SELECT payidem.gen_order_no('PY'), order_no, merchant_no, 'BENCH_WX', amount FROM o
			RETURNING payment_no, amount)
		INSERT INTO %3$s
		SELECT (SELECT coalesce(max(k), 0) FROM %3$s) + row_number() OVER (ORDER BY payment_no), payment_no, amount
		  FROM p$q$, orders, payments, pool) USING n;
END
$$;

-- payidem: orders and attempts inserted in their initial status (the
-- state-machine triggers check and log them as usual); bench.pool numbers
-- them 1, 2, ...
CREATE TABLE bench.pool (k bigint PRIMARY KEY, payment_no text NOT NULL, amount bigint NOT NULL);
CREATE FUNCTION bench.refill_payidem(n int) RETURNS void LANGUAGE sql
BEGIN ATOMIC
	SELECT bench.refill('payidem."order"', 'payidem.payment', 'bench.pool', n);
END;
SELECT bench.refill_payidem(1000 + :pool);
SELECT count(*) AS paid_for_duplicates
  FROM (SELECT payidem.apply_payment_result(payment_no, 'callback', 'succeeded', 'TX' || k, amount)
		  FROM bench.pool WHERE k <= 1000) x;
CREATE SEQUENCE bench.next_payidem START 1001;

-- the reference: seed 002's handler in PL/pgSQL on tables of the same shape
CREATE TABLE bench.ref_order (
	order_no text PRIMARY KEY, merchant_no text NOT NULL, amount bigint NOT NULL, status text NOT NULL,
	paid_payment_no text, paid_at timestamptz, notify_status text NOT NULL DEFAULT 'none',
	next_notify_at timestamptz, notify_attempts int NOT NULL DEFAULT 0, updated_at timestamptz);
CREATE INDEX ON bench.ref_order (next_notify_at) WHERE notify_status = 'pending';
CREATE TABLE bench.ref_payment (
	payment_no text PRIMARY KEY, order_no text NOT NULL REFERENCES bench.ref_order, channel_no text NOT NULL,
	amount bigint NOT NULL, status text NOT NULL, transaction_id text, paid_at timestamptz,
	fee_amount bigint, cost_amount bigint, updated_at timestamptz, UNIQUE (channel_no, transaction_id));
CREATE UNIQUE INDEX ON bench.ref_payment (order_no) WHERE status = 'pending';
CREATE TABLE bench.ref_idem (idem_key text PRIMARY KEY, order_no text, result text, created_at timestamptz DEFAULT now());
CREATE TABLE bench.ref_history (
	id bigserial PRIMARY KEY, entity text, entity_no text, from_status text, to_status text,
	changed_at timestamptz DEFAULT now());
CREATE TABLE bench.ref_rate (merchant_rate numeric, channel_rate numeric);
INSERT INTO bench.ref_rate VALUES (0.006, 0.002);
-- its pool: payment RP<k> of order RO<k>, numbered in bench.ref_pool as above
CREATE TABLE bench.ref_pool (k bigint PRIMARY KEY, payment_no text NOT NULL, amount bigint NOT NULL);
CREATE FUNCTION bench.refill_ref(n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	k0 bigint := (SELECT coalesce(max(k), 0) FROM bench.ref_pool);
BEGIN
	INSERT INTO bench.ref_order (order_no, merchant_no, amount, status)
	SELECT 'RO' || (k0 + i), 'M', 1000 + (k0 + i) % 1000, 'pending' FROM generate_series(1, n) i;
	INSERT INTO bench.ref_payment (payment_no, order_no, channel_no, amount, status)
	SELECT 'RP' || (k0 + i), 'RO' || (k0 + i), 'BENCH_WX', 1000 + (k0 + i) % 1000, 'pending' FROM generate_series(1, n) i;
	INSERT INTO bench.ref_pool SELECT k0 + i, 'RP' || (k0 + i), 1000 + (k0 + i) % 1000 FROM generate_series(1, n) i;
END
$$;
SELECT bench.refill_ref(1000 + :ref_pool);

CREATE FUNCTION bench.ref_apply(p_payment_no text, p_status text, p_txn text, p_amount bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	p bench.ref_payment;
	o bench.ref_order;
	r bench.ref_rate;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtext(p_payment_no));
	SELECT * INTO p FROM bench.ref_payment WHERE payment_no = p_payment_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'payment % not found', p_payment_no;
	END IF;
	IF p.status = p_status THEN
		RETURN 'duplicate';
	END IF;
	IF p.status <> 'pending' OR p_amount <> p.amount THEN
		RETURN 'rejected';
	END IF;
	INSERT INTO bench.ref_idem (idem_key, order_no, result)
	VALUES ('pay:' || p_payment_no || ':' || p_status, p.order_no, 'applied') ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RETURN 'duplicate';
	END IF;
	SELECT * INTO r FROM bench.ref_rate;
	SELECT * INTO o FROM bench.ref_order WHERE order_no = p.order_no FOR UPDATE;
	UPDATE bench.ref_payment
	   SET status = p_status, transaction_id = p_txn, paid_at = now(),
		   fee_amount = round(p.amount * r.merchant_rate), cost_amount = round(p.amount * r.channel_rate),
		   updated_at = now()
	 WHERE payment_no = p_payment_no;
	INSERT INTO bench.ref_history (entity, entity_no, from_status, to_status)
	VALUES ('payment', p_payment_no, p.status, p_status);
	IF o.status = 'pending' THEN
		UPDATE bench.ref_order
		   SET status = 'paid', paid_payment_no = p_payment_no, paid_at = now(), notify_status = 'pending',
			   next_notify_at = now(), updated_at = now()
		 WHERE order_no = o.order_no;
		INSERT INTO bench.ref_history (entity, entity_no, from_status, to_status)
		VALUES ('order', o.order_no, o.status, 'paid');
	END IF;
	RETURN 'applied';
END
$$;
SELECT count(*) AS ref_paid_for_duplicates
  FROM (SELECT bench.ref_apply(payment_no, 'succeeded', 'TX' || k, amount) FROM bench.ref_pool WHERE k <= 1000) x;
CREATE SEQUENCE bench.next_ref START 1001;

-- Seed 002's handler as the article writes it, in PL/pgSQL on the tables it
-- names: the order locked by its payment id, the transition checked in code
-- (pending -> paid), the order's status and paid_at set, a payment log row
-- whose unique index refuses a second one.  No idempotency row, no fees, no
-- payment row of its own and no history: bench.ref_apply above is this
-- handler with the guarantees payidem gives, the reference the targets name.
CREATE TABLE bench.lit_order (
	id bigserial PRIMARY KEY, payment_id text NOT NULL UNIQUE, amount bigint NOT NULL,
	status text NOT NULL, paid_at timestamptz);
CREATE TABLE bench.lit_payment_log (
	id bigserial PRIMARY KEY, payment_id text NOT NULL UNIQUE, amount bigint NOT NULL, channel text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench.lit_pool (k bigint PRIMARY KEY, payment_no text NOT NULL, amount bigint NOT NULL);
INSERT INTO bench.lit_order (payment_id, amount, status)
SELECT 'LP' || i, 1000 + i % 1000, 'pending' FROM generate_series(1, 1000 + :ref_pool) i;
INSERT INTO bench.lit_pool SELECT i, 'LP' || i, 1000 + i % 1000 FROM generate_series(1, 1000 + :ref_pool) i;
CREATE FUNCTION bench.seed002_literal(p_payment_id text, p_amount bigint, p_channel text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	o bench.lit_order;
BEGIN
	SELECT * INTO o FROM bench.lit_order WHERE payment_id = p_payment_id FOR UPDATE;
	IF NOT (o.status = 'pending' OR o.status = 'failed') THEN	-- canTransition(status, 'paid')
		RETURN 'duplicate';
	END IF;
	UPDATE bench.lit_order SET status = 'paid', paid_at = now() WHERE id = o.id;
	INSERT INTO bench.lit_payment_log (payment_id, amount, channel) VALUES (p_payment_id, p_amount, p_channel);
	RETURN 'applied';
END
$$;
SELECT count(*) AS literal_paid_for_duplicates
  FROM (SELECT bench.seed002_literal(payment_no, amount, 'BENCH_WX') FROM bench.lit_pool WHERE k <= 1000) x;

-- The same handler on payidem's own tables: bench.same_order, same_payment,
-- same_idem, same_log and same_event are copies of "order", payment,
-- idempotency, status_log and notify_event with every column type, default,
-- CHECK and index (LIKE ... INCLUDING ALL), plus the foreign keys, and the
-- rules payidem keeps in the payment's keys (payment_pending, payment_paid)
-- as the indexes a hand-written schema would give the payment itself; none of
-- payidem's triggers.  It writes what apply_payment_result() writes for a
-- first delivery (and an idempotency row, as seed 002 does), checking the
-- state in code as seed 002 does.
CREATE TABLE bench.same_order (LIKE payidem."order" INCLUDING ALL);
ALTER TABLE bench.same_order
	ADD FOREIGN KEY (merchant_no) REFERENCES payidem.merchant;
CREATE TABLE bench.same_payment (LIKE payidem.payment INCLUDING ALL);
CREATE UNIQUE INDEX ON bench.same_payment (order_no) WHERE status = 'pending';
CREATE UNIQUE INDEX ON bench.same_payment (channel_no, transaction_id);
CREATE INDEX ON bench.same_payment (channel_no, paid_at);
ALTER TABLE bench.same_payment
	ADD FOREIGN KEY (order_no, merchant_no) REFERENCES bench.same_order (order_no, merchant_no),
	ADD FOREIGN KEY (channel_no) REFERENCES payidem.channel;
CREATE TABLE bench.same_idem (LIKE payidem.idempotency INCLUDING ALL);
CREATE TABLE bench.same_log (LIKE payidem.status_log INCLUDING ALL);
CREATE TABLE bench.same_event (LIKE payidem.notify_event INCLUDING ALL);
ALTER TABLE bench.same_event
	ADD FOREIGN KEY (order_no, merchant_no) REFERENCES bench.same_order (order_no, merchant_no);
CREATE SEQUENCE bench.same_event_seq;
CREATE TABLE bench.ref_same_pool (k bigint PRIMARY KEY, payment_no text NOT NULL, amount bigint NOT NULL);
CREATE FUNCTION bench.refill_ref_same(n int) RETURNS void LANGUAGE sql
BEGIN ATOMIC
	SELECT bench.refill('bench.same_order', 'bench.same_payment', 'bench.ref_same_pool', n);
END;
SELECT bench.refill_ref_same(1000 + :ref_same_pool);

CREATE FUNCTION bench.ref_same_apply(p_payment_no text, p_status text, p_txn text, p_amount bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	p bench.same_payment;
	o bench.same_order;
	v_rate numeric;
	v_cost_rate numeric;
	v_id bigint;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtext(p_payment_no));
	SELECT * INTO p FROM bench.same_payment WHERE payment_no = p_payment_no FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'payment % not found', p_payment_no;
	END IF;
	IF p.status = p_status THEN
		RETURN 'duplicate';
	END IF;
	IF p.status <> 'pending' OR p_amount <> p.amount THEN
		RETURN 'rejected';
	END IF;
	INSERT INTO bench.same_idem (idem_key, biz_type, order_no, channel, amount, status, result)
	VALUES ('payment:' || p_payment_no || ':' || p_status, 'payment_result', p.order_no, p.channel_no, p.amount,
			'completed', '{"outcome": "applied"}') ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RETURN 'duplicate';
	END IF;
	-- the fee rates of the merchant (or its binding) and the channel
	SELECT coalesce(b.fee_rate, m.fee_rate), c.fee_rate INTO v_rate, v_cost_rate
	  FROM payidem.merchant m
	  JOIN payidem.channel c ON c.channel_no = p.channel_no
	  LEFT JOIN payidem.merchant_channel b ON b.merchant_no = m.merchant_no AND b.channel_no = c.channel_no
	 WHERE m.merchant_no = p.merchant_no;
	SELECT * INTO o FROM bench.same_order WHERE order_no = p.order_no FOR UPDATE;
	UPDATE bench.same_payment
	   SET status = p_status, transaction_id = p_txn, paid_at = now(),
		   fee_amount = round(p.amount * v_rate), cost_amount = round(p.amount * v_cost_rate),
		   updated_at = now()
	 WHERE payment_no = p_payment_no;
	INSERT INTO bench.same_log (entity, entity_no, from_status, to_status)
	VALUES ('payment', p_payment_no, p.status, p_status);
	IF o.status = 'pending' THEN
		UPDATE bench.same_order
		   SET status = 'paid', paid_payment_no = p_payment_no, paid_at = now(), updated_at = now()
		 WHERE order_no = o.order_no;
		INSERT INTO bench.same_log (entity, entity_no, from_status, to_status)
		VALUES ('order', o.order_no, o.status, 'paid');
		-- the merchant's notification, as payidem's order.paid event
		v_id := nextval('bench.same_event_seq') * 100;
		INSERT INTO bench.same_event (event_id, event, order_no, merchant_no, payload, status, attempts,
									  next_attempt_at, created_at)
		VALUES (v_id, 'order.paid', o.order_no, o.merchant_no,
				json_build_object('event_id', v_id, 'event', 'order.paid', 'created_at', now(),
								  'merchant_no', o.merchant_no, 'order_no', o.order_no,
								  'out_trade_no', o.out_trade_no, 'amount', o.amount, 'currency', o.currency,
								  'status', 'paid', 'payment_no', p_payment_no, 'transaction_id', p_txn,
								  'paid_at', now())::text,
				'pending', 0, now(), now());
	END IF;
	RETURN 'applied';
END
$$;
SELECT count(*) AS ref_same_paid_for_duplicates
  FROM (SELECT bench.ref_same_apply(payment_no, 'succeeded', 'TX' || k, amount)
		  FROM bench.ref_same_pool WHERE k <= 1000) x;
CREATE SEQUENCE bench.next_ref_same START 1001;

-- one delivery: a duplicate of one of the 1,000 paid payments, or the first
-- delivery for the next pending one
CREATE FUNCTION bench.deliver_payidem(dup boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_k bigint := CASE WHEN dup THEN 1 + (random() * 999)::bigint ELSE nextval('bench.next_payidem') END;
	b bench.pool;
BEGIN
	SELECT * INTO b FROM bench.pool WHERE k = v_k;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'bench pool exhausted (k = %): raise POOL', v_k;
	END IF;
	RETURN payidem.apply_payment_result(b.payment_no, 'callback', 'succeeded', 'TX' || b.k, b.amount);
END
$$;
CREATE FUNCTION bench.deliver_ref(dup boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_k bigint := CASE WHEN dup THEN 1 + (random() * 999)::bigint ELSE nextval('bench.next_ref') END;
	b bench.ref_pool;
BEGIN
	SELECT * INTO b FROM bench.ref_pool WHERE k = v_k;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'bench pool exhausted (k = %): raise REF_POOL', v_k;
	END IF;
	RETURN bench.ref_apply(b.payment_no, 'succeeded', 'TX' || b.k, b.amount);
END
$$;

CREATE FUNCTION bench.deliver_ref_same(dup boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	v_k bigint := CASE WHEN dup THEN 1 + (random() * 999)::bigint ELSE nextval('bench.next_ref_same') END;
	b bench.ref_same_pool;
BEGIN
	SELECT * INTO b FROM bench.ref_same_pool WHERE k = v_k;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'bench pool exhausted (k = %): raise REF_SAME_POOL', v_k;
	END IF;
	RETURN bench.ref_same_apply(b.payment_no, 'succeeded', 'TX' || b.k, b.amount);
END
$$;

-- the ceiling: one small row per commit
CREATE TABLE bench.ceiling (id bigserial PRIMARY KEY, v int, created_at timestamptz DEFAULT now());
VACUUM ANALYZE;
