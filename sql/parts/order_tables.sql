------------------------------------------------------------------------------
-- Orders, payment attempts, refunds, notification events, query leases: their
-- domains and tables
------------------------------------------------------------------------------

-- Formats of the values that are written once and never change, as domains
-- rather than table CHECK constraints: a domain's check runs when a value is
-- written to the column (INSERT, or an UPDATE that sets it) from an
-- expression compiled once per backend, while PostgreSQL re-reads and
-- evaluates every table CHECK on every UPDATE of the row, whatever it
-- changes.  Each is text (or char(3)) underneath: clients see the base type.
-- The number domains use built-in operators only (a role writing the tables
-- needs no EXECUTE on payidem's functions): the MOD 97-10 sum, and check
-- digits 02..98 as gen_order_no() writes them -- without it 00, 01 and 99
-- would give a second spelling of some numbers.  They do not check the time
-- part as order_no_valid() does.  "26 characters, the prefix and digits" is
-- written as a length and '[0-9]+', not '[0-9]{24}': PostgreSQL's regular
-- expressions build the states of a counted repetition at every match, about
-- 15,000 instructions for each number written.
CREATE DOMAIN payidem.order_number AS text
	CONSTRAINT order_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PO[0-9]+$' THEN false
		ELSE ('2524' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.order_number IS
	'An order number: PO + 24 digits, MOD 97-10 check digits valid (as payidem.order_no_valid()).';
CREATE DOMAIN payidem.payment_number AS text
	CONSTRAINT payment_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PY[0-9]+$' THEN false
		ELSE ('2534' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.payment_number IS
	'A payment number: PY + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.refund_number AS text
	CONSTRAINT refund_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^RF[0-9]+$' THEN false
		ELSE ('2715' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.refund_number IS
	'A refund number: RF + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.merchant_ref AS text
	CONSTRAINT merchant_ref_format CHECK (VALUE ~ '^[0-9A-Za-z_.|*@-]+$' AND pg_catalog.length(VALUE) <= 64);
COMMENT ON DOMAIN payidem.merchant_ref IS
	'A merchant''s own number (out_trade_no, out_refund_no): 1 to 64 of 0-9 A-Z a-z _ . | * @ -.';
CREATE DOMAIN payidem.channel_ref AS text
	CONSTRAINT channel_ref_format CHECK (VALUE ~ '^[[:graph:]]+$' AND pg_catalog.length(VALUE) <= 64);
COMMENT ON DOMAIN payidem.channel_ref IS
	'A channel''s id (transaction_id, channel_refund_id): 1 to 64 printable characters, no spaces.';
CREATE DOMAIN payidem.http_url AS text
	CONSTRAINT http_url_format CHECK (VALUE ~ '^https?://[^[:space:]]+$' AND pg_catalog.length(VALUE) <= 1024);
COMMENT ON DOMAIN payidem.http_url IS
	'An http or https URL without spaces, at most 1024 characters.';
CREATE DOMAIN payidem.currency_code AS char(3)
	CONSTRAINT currency_code_format CHECK (VALUE ~ '^[A-Z]{3}$');
COMMENT ON DOMAIN payidem.currency_code IS
	'An ISO 4217 currency code: three upper-case letters.';
-- Single-column rules of the order, payment and refund tables: as domains they
-- are checked when the column is written, not on every UPDATE of the row.
CREATE DOMAIN payidem.minor_amount AS bigint
	CONSTRAINT minor_amount_positive CHECK (VALUE > 0);
COMMENT ON DOMAIN payidem.minor_amount IS
	'An amount of money in the currency''s minor unit (fen, cents): a positive bigint.';
CREATE DOMAIN payidem.order_subject AS text
	CONSTRAINT order_subject_length CHECK (pg_catalog.length(pg_catalog.btrim(VALUE)) BETWEEN 1 AND 256);
COMMENT ON DOMAIN payidem.order_subject IS
	'What an order pays for: 1 to 256 characters, not only spaces.';
CREATE DOMAIN payidem.order_body AS text
	CONSTRAINT order_body_length CHECK (pg_catalog.length(VALUE) <= 1024);
COMMENT ON DOMAIN payidem.order_body IS
	'An order''s longer description: at most 1024 characters.';
CREATE DOMAIN payidem.notify_status AS text
	CONSTRAINT notify_status_known CHECK (VALUE IN ('pending', 'sent', 'failed'));
COMMENT ON DOMAIN payidem.notify_status IS
	'Delivery state of a merchant notification event: pending (due at next_attempt_at), sent or failed (gave up).';
CREATE DOMAIN payidem.attempt_count AS integer
	CONSTRAINT attempt_count_nonnegative CHECK (VALUE >= 0);
COMMENT ON DOMAIN payidem.attempt_count IS
	'A number of attempts made so far: zero or more.';
CREATE DOMAIN payidem.refund_reason AS text
	CONSTRAINT refund_reason_length CHECK (pg_catalog.length(VALUE) <= 256);
COMMENT ON DOMAIN payidem.refund_reason IS
	'Why a refund was made: at most 256 characters.';

CREATE TABLE payidem."order" (
	order_no		payidem.order_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_trade_no	payidem.merchant_ref NOT NULL,
	subject			payidem.order_subject NOT NULL,
	body			payidem.order_body,
	amount			payidem.minor_amount NOT NULL,
	currency		payidem.currency_code NOT NULL DEFAULT 'CNY',
	status			text		NOT NULL DEFAULT 'pending',
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	notify_url		payidem.http_url,
	return_url		payidem.http_url,
	expire_at		timestamptz	NOT NULL,
	paid_at			timestamptz,
	paid_payment_no	payidem.payment_number,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT order_pkey PRIMARY KEY (order_no),
	CONSTRAINT order_out_trade_no_key UNIQUE (merchant_no, out_trade_no),
	CONSTRAINT order_merchant_key UNIQUE (merchant_no, order_no),
	CONSTRAINT order_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT order_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount),
	CONSTRAINT order_expire_after_create CHECK (expire_at > created_at)
) WITH (fillfactor = 85);
-- order_merchant_key: the target of payment's and refund's foreign keys
-- (order_no, merchant_no), with merchant_no first (since 1.1) so that it also
-- serves list_orders(): a merchant's orders by number, newest first (an order
-- number grows with the order's issue, on one database), with no index of its
-- own to write.
-- No index of "order" names status, paid_at or paid_payment_no, in its key or
-- its predicate: the update that pays an order is HOT (no index entry
-- written), and the 15 % left free on each page (fillfactor) is where its new
-- version goes.  Which pending orders expire when is kept in order_expiry.
COMMENT ON TABLE payidem."order" IS
	'Merchant orders: one order, possibly several payment attempts.';

-- The orders that may expire, by expiry time: a row is added when an order
-- is inserted pending, becomes pending again, or has its expire_at moved
-- while pending (trigger order_expiry_queue, src/housekeeping.c, for every
-- writer); housekeeping reads it in expire_at order and removes, once their
-- time has passed, the rows of orders no longer pending at that time
-- (_prune_expiry_queue).  So an order is written to it once, a payment
-- writes nothing to it, and it holds about the orders of one expiry period.
-- It is derived data: not dumped; a restore's COPY of "order" makes it again.
CREATE TABLE payidem.order_expiry (
	expire_at		timestamptz	NOT NULL,
	order_no		text		NOT NULL,
	CONSTRAINT order_expiry_pkey PRIMARY KEY (expire_at, order_no)
);
COMMENT ON TABLE payidem.order_expiry IS
	'The pending orders by expiry time, for housekeeping and query_due(); rows of orders no longer pending are removed after their expire_at.';
COMMENT ON COLUMN payidem."order".order_no IS
	'Platform order number, payidem.gen_order_no(''PO'').';
COMMENT ON COLUMN payidem."order".out_trade_no IS
	'The merchant''s own order number; unique per merchant (a repeat with the same amount and subject returns the same order).';
COMMENT ON COLUMN payidem."order".amount IS
	'Amount in the currency''s minor unit (fen, cents).';
COMMENT ON COLUMN payidem."order".status IS
	'Order status, one of payidem.state where entity = ''order''; changes follow payidem.transition.';
COMMENT ON COLUMN payidem."order".refunded_amount IS
	'Sum of succeeded refunds, minor units; never above amount.';
COMMENT ON COLUMN payidem."order".notify_url IS
	'Where the merchant''s notifications of this order go (payidem.notify_event); NULL: none are written.';
COMMENT ON COLUMN payidem."order".paid_payment_no IS
	'The payment attempt that paid the order (its refunds move the order''s refunded_amount).';
COMMENT ON COLUMN payidem."order".expire_at IS
	'No payment may start after this instant.';

CREATE TABLE payidem.payment (
	payment_no		payidem.payment_number NOT NULL,
	order_no		text		NOT NULL,
	merchant_no		text		NOT NULL,
	channel_no		text		NOT NULL,
	amount			payidem.minor_amount NOT NULL,
	status			text		NOT NULL DEFAULT 'pending',
	transaction_id	payidem.channel_ref,
	fee_amount		bigint,
	cost_amount		bigint,
	refunded_amount	bigint		NOT NULL DEFAULT 0,
	paid_at			timestamptz,
	closed_at		timestamptz,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT payment_pkey PRIMARY KEY (payment_no),
	-- the target of the (payment_no, order_no) foreign keys; order_no first,
	-- so that it also finds an order's attempts
	CONSTRAINT payment_order_key UNIQUE (order_no, payment_no),
	CONSTRAINT payment_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no),
	CONSTRAINT payment_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT payment_fee_range CHECK (fee_amount >= 0 AND fee_amount <= amount),
	CONSTRAINT payment_cost_range CHECK (cost_amount >= 0 AND cost_amount <= amount),
	CONSTRAINT payment_refunded_range CHECK (refunded_amount >= 0 AND refunded_amount <= amount)
) WITH (fillfactor = 85);
CREATE INDEX payment_merchant_channel_created ON payidem.payment (merchant_no, channel_no, created_at);
-- No index of payment names status, transaction_id or paid_at, in its key or
-- its predicate: the update that records a success is HOT (no index entry
-- written; the 15 % left free on each page is where its new version goes).
-- The rules and look-ups that need those columns use the payment's keys,
-- below.

-- A payment's keys that change when it is paid or ends, each a table of its
-- own with the payment's unique constraint of old, kept by the trigger
-- status_keys (src/payment_keys.c) for every writer of payment:
--   payment_pending: at most one pending attempt per order (its primary key,
--     payment_one_pending_per_order): a row while an attempt is pending, so
--     two concurrent begin_payment calls can never both leave one behind;
--   payment_paid: a channel's transaction id is one payment
--     (payment_transaction_key), and a channel's payments by the time they
--     were paid, for reconciliation (payment_channel_paid): a row for each
--     payment with a transaction id or a paid_at.
-- Derived data: not dumped; a restore's COPY of payment makes them again, and
-- payidem.rebuild_payment_keys() does after writes with the triggers off.
CREATE TABLE payidem.payment_pending (
	order_no		text		NOT NULL,
	payment_no		text		NOT NULL,
	CONSTRAINT payment_one_pending_per_order PRIMARY KEY (order_no)
);
COMMENT ON TABLE payidem.payment_pending IS
	'The pending payment attempt of each order (at most one), kept from payidem.payment by its trigger status_keys.';
CREATE TABLE payidem.payment_paid (
	payment_no		text		NOT NULL,
	channel_no		text		NOT NULL,
	transaction_id	text,
	paid_at			timestamptz,
	CONSTRAINT payment_transaction_key UNIQUE (channel_no, transaction_id)
);
CREATE INDEX payment_channel_paid ON payidem.payment_paid (channel_no, paid_at);
COMMENT ON TABLE payidem.payment_paid IS
	'Each payment with a transaction id or a paid_at, by channel: one payment per transaction id; reconciliation''s payments of a day. Kept from payidem.payment by its trigger status_keys.';
COMMENT ON TABLE payidem.payment IS
	'Payment attempts: one order may have several (e.g. WeChat failed, then Alipay succeeded); at most one pending.';
COMMENT ON COLUMN payidem.payment.payment_no IS
	'Platform payment number, payidem.gen_order_no(''PY''); sent to the channel as its out_trade_no.';
COMMENT ON COLUMN payidem.payment.status IS
	'Attempt status, one of payidem.state where entity = ''payment''.';
COMMENT ON COLUMN payidem.payment.transaction_id IS
	'The channel''s transaction id; unique per channel.';
COMMENT ON COLUMN payidem.payment.fee_amount IS
	'What the merchant pays for this payment, round(amount * rate) half-up, minor units.';
COMMENT ON COLUMN payidem.payment.cost_amount IS
	'What the channel charges the platform for this payment, minor units.';
COMMENT ON COLUMN payidem.payment.refunded_amount IS
	'Sum of succeeded refunds of this payment, minor units; never above amount.';

CREATE TABLE payidem.refund (
	refund_no			payidem.refund_number NOT NULL,
	payment_no			text		NOT NULL,
	order_no			text		NOT NULL,
	merchant_no			text		NOT NULL,
	out_refund_no		payidem.merchant_ref NOT NULL,
	amount				payidem.minor_amount NOT NULL,
	status				text		NOT NULL DEFAULT 'pending',
	channel_refund_id	payidem.channel_ref,
	reason				payidem.refund_reason,
	refunded_at			timestamptz,
	created_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at			timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT refund_pkey PRIMARY KEY (refund_no),
	CONSTRAINT refund_out_refund_no_key UNIQUE (merchant_no, out_refund_no),
	CONSTRAINT refund_payment_fkey FOREIGN KEY (payment_no, order_no)
		REFERENCES payidem.payment (payment_no, order_no),
	CONSTRAINT refund_order_fkey FOREIGN KEY (order_no, merchant_no)
		REFERENCES payidem."order" (order_no, merchant_no)
);
CREATE INDEX refund_payment ON payidem.refund (payment_no);
CREATE INDEX refund_order ON payidem.refund (order_no);
COMMENT ON TABLE payidem.refund IS
	'Refunds of a payment; pending + succeeded refunds never exceed the payment amount.';
COMMENT ON COLUMN payidem.refund.refund_no IS
	'Platform refund number, payidem.gen_order_no(''RF'').';
COMMENT ON COLUMN payidem.refund.out_refund_no IS
	'The merchant''s own refund number; unique per merchant.';
COMMENT ON COLUMN payidem.refund.status IS
	'Refund status, one of payidem.state where entity = ''refund''.';
COMMENT ON COLUMN payidem.refund.channel_refund_id IS
	'The channel''s id for the refund, once it has one.';

-- The merchant-notification outbox: one row per event, written by a trigger
-- in the transaction of the change it reports (status_notify, below), so an
-- event is delivered if and only if that change committed.  The id carries
-- the shard's two digits (id % 100), as the order numbers do, so the router
-- knows where an event lives.
-- Single-column rules as domains (checked where the column is written; a
-- CHECK constraint would be read from the catalog at every INSERT, which
-- runs on the hot path of a first success).  What ties the columns
-- together -- a refund event names its refund, only a pending event has a
-- next attempt -- is kept by the only writers, the status_notify trigger,
-- notify_due() and notify_result().  No foreign keys: the trigger copies the
-- order's number and merchant (and the refund's number) from the row whose
-- change it reports, in that row's transaction, and orders and refunds are
-- never deleted (keep_money_records); a foreign key would check at every
-- event, at the cost of a query, what the one writer makes true.
CREATE DOMAIN payidem.notify_event_type AS text
	CONSTRAINT notify_event_type_known CHECK (VALUE IN ('order.paid', 'refund.succeeded', 'order.closed',
												'payout.succeeded', 'payout.failed'));
COMMENT ON DOMAIN payidem.notify_event_type IS
	'What a merchant notification reports: order.paid, refund.succeeded, order.closed, payout.succeeded or payout.failed.';
CREATE DOMAIN payidem.notify_response AS text
	CONSTRAINT notify_response_length CHECK (pg_catalog.length(VALUE) <= 256);
COMMENT ON DOMAIN payidem.notify_response IS
	'The start of a merchant''s answer to a failed delivery: at most 256 characters.';
CREATE SEQUENCE payidem.notify_event_seq AS bigint MINVALUE 1 MAXVALUE 92233720368547758 NO CYCLE;
CREATE TABLE payidem.notify_event (
	event_id		bigint		NOT NULL,
	event			payidem.notify_event_type NOT NULL,
	order_no		text,
	merchant_no		text		NOT NULL,
	refund_no		text,
	payload			text		NOT NULL,
	status			payidem.notify_status NOT NULL DEFAULT 'pending',
	attempts		payidem.attempt_count NOT NULL DEFAULT 0,
	next_attempt_at	timestamptz,
	last_attempt_at	timestamptz,
	last_response	payidem.notify_response,
	sent_at			timestamptz,
	created_at		timestamptz	NOT NULL,
	CONSTRAINT notify_event_pkey PRIMARY KEY (event_id)
);
CREATE INDEX notify_event_due ON payidem.notify_event (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notify_event_failed ON payidem.notify_event (created_at) WHERE status = 'failed';
COMMENT ON TABLE payidem.notify_event IS
	'Merchant notifications (outbox): one row per order.paid, refund.succeeded and order.closed event of an order with a notify_url; handed out by notify_due(), answered by notify_result().';
COMMENT ON COLUMN payidem.notify_event.event_id IS
	'The event''s id, unique across shards: a sequence number times 100 plus payidem.shard_id.';
COMMENT ON COLUMN payidem.notify_event.payload IS
	'The JSON text sent, byte for byte what the signature covers; the state of the order at the event.';
COMMENT ON COLUMN payidem.notify_event.next_attempt_at IS
	'When a pending event is due next (also pushed forward while a worker holds it, the lease).';
COMMENT ON COLUMN payidem.notify_event.last_response IS
	'The start (256 characters) of the last failed attempt''s response, as notify_result() reported it.';

-- Leases of expired attempts query_due() handed out (60 s, as notify_due()'s):
-- two callers, or one calling again, never query the same attempt at once.
CREATE TABLE payidem.query_lease (
	payment_no		text		NOT NULL,
	leased_until	timestamptz	NOT NULL,
	CONSTRAINT query_lease_pkey PRIMARY KEY (payment_no)
);
COMMENT ON TABLE payidem.query_lease IS
	'Which expired pending attempts query_due() handed out, until when; query_due() drops the leases of attempts no longer pending.';

