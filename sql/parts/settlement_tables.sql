------------------------------------------------------------------------------
-- Settlement, merchant balances and payouts: the tables (DESIGN section 11,
-- docs/settlement.md).  The functions are in the part settlement.
------------------------------------------------------------------------------

-- The payout and adjustment numbers, as the order-number domains
-- (order_tables): PT / AJ + 24 digits, MOD 97-10 check digits valid.
CREATE DOMAIN payidem.payout_number AS text
	CONSTRAINT payout_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^PT[0-9]+$' THEN false
		ELSE ('2529' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.payout_number IS
	'A payout number: PT + 24 digits, MOD 97-10 check digits valid.';
CREATE DOMAIN payidem.adjust_number AS text
	CONSTRAINT adjust_number_format CHECK (CASE WHEN pg_catalog.length(VALUE) <> 26 OR VALUE !~ '^AJ[0-9]+$' THEN false
		ELSE ('1019' || substr(VALUE, 3))::numeric % 97 = 1 AND substr(VALUE, 25) BETWEEN '02' AND '98' END);
COMMENT ON DOMAIN payidem.adjust_number IS
	'An adjustment number: AJ + 24 digits, MOD 97-10 check digits valid.';

-- The calendar of T<n> cycles: Monday to Friday are business days, except the
-- days this table says otherwise (public holidays: false; a worked weekend
-- day: true).  Kept by a DBA; a change moves only items not yet settled.
CREATE TABLE payidem.business_day (
	day			date		NOT NULL,
	business	boolean		NOT NULL,
	note		text,
	CONSTRAINT business_day_pkey PRIMARY KEY (day)
);
COMMENT ON TABLE payidem.business_day IS
	'Exceptions to the Monday-to-Friday business week of T<n> settlement cycles: holidays (business false) and worked weekend days (business true).';

-- The fixed chart of accounts (DESIGN section 11), written once: which
-- accounts exist and whose they are.  A merchant's accounts name the
-- merchant, a channel's the channel, the platform's neither.
CREATE DOMAIN payidem.ledger_account AS text
	CONSTRAINT ledger_account_known CHECK (VALUE IN (
		'merchant_available', 'merchant_payout', 'channel_receivable',
		'fee_revenue', 'channel_cost', 'payout_clearing', 'adjustment'));
COMMENT ON DOMAIN payidem.ledger_account IS
	'An account of the chart: merchant_available, merchant_payout (per merchant), channel_receivable (per channel), fee_revenue, channel_cost, payout_clearing, adjustment (the platform''s).';

-- The journal: append-only (ledger_append_only), double entry.  Each
-- journal_no is one business event -- a settled payment or refund (its
-- number), a payout request (the payout's number), its result (the payout's
-- number and /succeeded or /failed), an adjustment (its number) -- and its
-- entries sum to 0 per currency, checked at commit for every writer
-- (src/journal.c).  Debit positive, credit negative; a merchant's available
-- balance is the negated sum of its merchant_available entries.  No index
-- but the key: every read by merchant goes to merchant_balance, every report
-- to settlement_item; verify() reads the journal whole.
CREATE TABLE payidem.ledger_entry (
	entry_id	bigserial		NOT NULL,
	journal_no	text			NOT NULL,
	account		payidem.ledger_account NOT NULL,
	merchant_no	text,
	channel_no	text,
	currency	character(3)	NOT NULL,
	amount		bigint			NOT NULL,
	source_no	text			NOT NULL,
	created_at	timestamptz		NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT ledger_entry_pkey PRIMARY KEY (entry_id),
	CONSTRAINT ledger_entry_amount_nonzero CHECK (amount <> 0),
	CONSTRAINT ledger_entry_journal_format CHECK (pg_catalog.length(journal_no) BETWEEN 1 AND 64),
	CONSTRAINT ledger_entry_owner_length CHECK (pg_catalog.length(merchant_no) <= 64 AND pg_catalog.length(channel_no) <= 64),
	CONSTRAINT ledger_entry_account_owner CHECK (
		CASE
			WHEN account IN ('merchant_available', 'merchant_payout')
				THEN merchant_no IS NOT NULL AND channel_no IS NULL
			WHEN account = 'channel_receivable'
				THEN channel_no IS NOT NULL AND merchant_no IS NULL
			ELSE merchant_no IS NULL AND channel_no IS NULL
		END)
);
COMMENT ON TABLE payidem.ledger_entry IS
	'The double-entry journal of settlements, payouts and adjustments: append-only; each journal_no sums to 0 per currency (checked at commit).';
COMMENT ON COLUMN payidem.ledger_entry.journal_no IS
	'One business event: a settled payment or refund (its number), a payout request (PT...), its result (PT.../succeeded, PT.../failed), an adjustment (AJ...).';
COMMENT ON COLUMN payidem.ledger_entry.currency IS
	'The currency of the business event (a payment''s order''s, a payout''s, an adjustment''s: each checked where it was written; not again per entry).';
COMMENT ON COLUMN payidem.ledger_entry.amount IS
	'Minor units; debit positive, credit negative.';
COMMENT ON COLUMN payidem.ledger_entry.source_no IS
	'The payment, refund, payout or adjustment the entry is for.';

-- A merchant's balances, kept for locking and speed: at every commit equal
-- to the negated sums of its merchant_available and merchant_payout entries
-- (src/journal.c checks the changes of both against each other).  A payout
-- locks and updates this row; settle() updates each merchant's once a run.
CREATE TABLE payidem.merchant_balance (
	merchant_no	text		NOT NULL,
	currency	payidem.currency_code NOT NULL,
	available	bigint		NOT NULL DEFAULT 0,
	in_payout	bigint		NOT NULL DEFAULT 0,
	updated_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_balance_pkey PRIMARY KEY (merchant_no, currency),
	CONSTRAINT merchant_balance_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT merchant_balance_in_payout_nonnegative CHECK (in_payout >= 0)
) WITH (fillfactor = 50);
COMMENT ON TABLE payidem.merchant_balance IS
	'Each merchant''s available and in-payout balance per currency, equal at every commit to its journal entries (merchant_available, merchant_payout).';
COMMENT ON COLUMN payidem.merchant_balance.available IS
	'Settled and not paid out, minor units; negative when refunds settled after the payments were paid out (later settlements repay it first).';
COMMENT ON COLUMN payidem.merchant_balance.in_payout IS
	'Requested payouts the bank has not yet confirmed or refused, minor units.';

-- Each settled item once: its number decides (a payment PY..., a refund
-- RF...).  Its journal is journal_no = item_no.  fee and cost are a
-- payment's fee_amount and cost_amount, or a refund's share of them.
CREATE TABLE payidem.settlement_item (
	item_no		text		NOT NULL,
	item_type	text		NOT NULL,
	payment_no	text		NOT NULL,
	merchant_no	text		NOT NULL,
	channel_no	text		NOT NULL,
	currency	character(3) NOT NULL,
	bill_day	date		NOT NULL,
	settle_day	date		NOT NULL,
	settle_date	date		NOT NULL,
	amount		bigint		NOT NULL,
	fee			bigint		NOT NULL,
	cost		bigint		NOT NULL,
	settled_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT settlement_item_pkey PRIMARY KEY (item_no),
	CONSTRAINT settlement_item_type_known CHECK (item_type IN ('payment', 'refund')),
	CONSTRAINT settlement_item_amounts CHECK (amount > 0 AND fee >= 0 AND cost >= 0
											  AND fee <= amount AND cost <= amount)
);
COMMENT ON TABLE payidem.settlement_item IS
	'Each succeeded payment and refund settled, once: its amount, fee and cost (a refund''s share of its payment''s), its bill day, settlement day and the settle() run that settled it.';
COMMENT ON COLUMN payidem.settlement_item.bill_day IS
	'The day of paid_at (refunded_at) in payidem.bill_timezone.';
COMMENT ON COLUMN payidem.settlement_item.settle_day IS
	'bill_day plus the merchant''s settle_cycle: when the money became due.';
COMMENT ON COLUMN payidem.settlement_item.settle_date IS
	'The date settle() was called with when it settled the item.';

-- Payments that were due but could not be settled (their bill day not
-- reconciled, an open difference or anomaly naming them): each settle()
-- run looks at them again, whatever their day.
CREATE TABLE payidem.settlement_hold (
	payment_no	text		NOT NULL,
	held_since	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT settlement_hold_pkey PRIMARY KEY (payment_no)
);
COMMENT ON TABLE payidem.settlement_hold IS
	'Succeeded payments that were due but held (day not reconciled, open difference or anomaly); settle() settles them once that is resolved.';

-- Where settle() starts looking: every succeeded payment and refund of a
-- bill day before scan_from is settled or held (docs/settlement.md: how it
-- stays true).  One row, made by the first settle() (so that a restore
-- brings it back as dumped); settle() locks it, so runs wait for each other.
CREATE TABLE payidem.settle_state (
	id				boolean		NOT NULL DEFAULT true,
	scan_from		date,
	last_xmax		xid8,
	last_scan_from	date,
	last_run_at		timestamptz,
	last_settle_date date,
	worker_day		date,
	scan_timezone	text,
	settle_from		date,
	CONSTRAINT settle_state_pkey PRIMARY KEY (id),
	CONSTRAINT settle_state_one_row CHECK (id)
);
COMMENT ON COLUMN payidem.settle_state.scan_timezone IS
	'The payidem.bill_timezone scan_from is a day of (a run with another zone reads from the same instant).';
COMMENT ON COLUMN payidem.settle_state.settle_from IS
	'Set by the owner, or NULL: no item of a bill day before it is settled (history paid outside payidem), and settle() never reads before it.';
COMMENT ON TABLE payidem.settle_state IS
	'settle()''s progress: the first bill day it still reads (scan_from), and when it ran; one row, its lock serializes settle() runs.';

-- Payouts: a payout takes money from available into in_payout; the bank's
-- answer moves it on (succeeded) or back (failed).  Entity payout of the
-- whitelist: pending -> succeeded | failed.
CREATE TABLE payidem.payout (
	payout_no		payidem.payout_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_payout_no	payidem.merchant_ref NOT NULL,
	amount			payidem.minor_amount NOT NULL,
	currency		payidem.currency_code NOT NULL,
	status			text		NOT NULL DEFAULT 'pending',
	bank_ref		payidem.channel_ref,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	finished_at		timestamptz,
	available_before bigint,
	CONSTRAINT payout_pkey PRIMARY KEY (payout_no),
	CONSTRAINT payout_out_payout_no_key UNIQUE (merchant_no, out_payout_no),
	CONSTRAINT payout_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no)
);
COMMENT ON TABLE payidem.payout IS
	'Payouts of merchants'' available balance to their bank: request_payout(), apply_payout_result().';
COMMENT ON COLUMN payidem.payout.payout_no IS
	'Platform payout number, payidem.gen_order_no(''PT'').';
COMMENT ON COLUMN payidem.payout.out_payout_no IS
	'The requester''s own number for the payout; unique per merchant (a repeated request returns the same payout).';
COMMENT ON COLUMN payidem.payout.available_before IS
	'The merchant''s available balance when the payout was taken (under the balance''s lock): verify() checks the payout took no more.';
COMMENT ON COLUMN payidem.payout.bank_ref IS
	'The bank''s reference of the transfer, as apply_payout_result() reported it.';

-- Adjustments: money credited (positive) or debited (negative) to a
-- merchant against the platform's adjustment account, with a reason.
CREATE TABLE payidem.adjustment (
	adjust_no		payidem.adjust_number NOT NULL,
	merchant_no		text		NOT NULL,
	out_adjust_no	payidem.merchant_ref NOT NULL,
	amount			bigint		NOT NULL,
	currency		payidem.currency_code NOT NULL,
	reason			text		NOT NULL,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	created_by		text		NOT NULL DEFAULT SESSION_USER,
	CONSTRAINT adjustment_pkey PRIMARY KEY (adjust_no),
	CONSTRAINT adjustment_out_adjust_no_key UNIQUE (merchant_no, out_adjust_no),
	CONSTRAINT adjustment_merchant_fkey FOREIGN KEY (merchant_no)
		REFERENCES payidem.merchant (merchant_no),
	CONSTRAINT adjustment_amount_nonzero CHECK (amount <> 0),
	CONSTRAINT adjustment_reason_length CHECK (pg_catalog.length(pg_catalog.btrim(reason)) BETWEEN 1 AND 256)
);
COMMENT ON TABLE payidem.adjustment IS
	'Adjustments of merchants'' balances (chargebacks, fines, corrections): adjust_balance().';

INSERT INTO payidem.state (entity, status, initial, terminal, builtin) VALUES
	('payout', 'pending',   true,  false, true),
	('payout', 'succeeded', false, true,  true),
	('payout', 'failed',    false, true,  true);
INSERT INTO payidem.transition (entity, from_status, to_status, builtin) VALUES
	('payout', 'pending', 'succeeded', true),
	('payout', 'pending', 'failed',    true);

-- What settlement adds to tables of 1.0, written as the update from 1.0
-- writes it, so that a new install and an updated one have the same tables.
-- A merchant's own notification URL (payout events belong to no order).
ALTER TABLE payidem.merchant ADD COLUMN notify_url payidem.http_url;
COMMENT ON COLUMN payidem.merchant.notify_url IS
	'Where notifications that belong to no order go (payout.succeeded, payout.failed): set_merchant_notify_url().';
-- A payout's events name the payout, not an order.
ALTER TABLE payidem.notify_event ALTER COLUMN order_no DROP NOT NULL;
ALTER TABLE payidem.notify_event ADD COLUMN payout_no text;
ALTER TABLE payidem.notify_event ADD CONSTRAINT notify_event_subject
	CHECK ((order_no IS NULL) <> (payout_no IS NULL));
COMMENT ON COLUMN payidem.notify_event.payout_no IS
	'The payout of a payout.succeeded or payout.failed event (order_no is then NULL).';
-- Reconciliation compares fees: a bill line's fee with the payment's
-- cost_amount (fee_mismatch).
ALTER TABLE payidem.recon_batch ADD COLUMN fee_mismatch bigint NOT NULL DEFAULT 0;
ALTER TABLE payidem.reconciliation ADD COLUMN platform_fee bigint;
ALTER TABLE payidem.reconciliation ADD COLUMN channel_fee bigint;
COMMENT ON COLUMN payidem.reconciliation.platform_fee IS
	'fee_mismatch: the payment''s cost_amount (what we expect the channel to charge).';
COMMENT ON COLUMN payidem.reconciliation.channel_fee IS
	'fee_mismatch: the fee the channel''s bill line charged.';
ALTER TABLE payidem.reconciliation DROP CONSTRAINT reconciliation_diff_type_known;
ALTER TABLE payidem.reconciliation ADD CONSTRAINT reconciliation_diff_type_known CHECK (
	diff_type IN ('platform_only', 'channel_only', 'amount_mismatch', 'status_mismatch', 'fee_mismatch'));
ALTER TABLE payidem.reconciliation DROP CONSTRAINT reconciliation_sides_consistent;
ALTER TABLE payidem.reconciliation ADD CONSTRAINT reconciliation_sides_consistent CHECK (
	CASE diff_type
		WHEN 'platform_only' THEN platform_amount IS NOT NULL AND channel_amount IS NULL
		WHEN 'channel_only' THEN platform_amount IS NULL AND channel_amount IS NOT NULL
		WHEN 'amount_mismatch' THEN platform_amount IS DISTINCT FROM channel_amount
			AND platform_amount IS NOT NULL AND channel_amount IS NOT NULL
		WHEN 'fee_mismatch' THEN platform_fee IS DISTINCT FROM channel_fee
			AND platform_fee IS NOT NULL AND channel_fee IS NOT NULL
		ELSE platform_status IS DISTINCT FROM channel_status
	END);
ALTER TABLE payidem.recon_batch ADD CONSTRAINT recon_batch_fee_mismatch_nonnegative CHECK (fee_mismatch >= 0);
COMMENT ON COLUMN payidem.reconciliation.diff_type IS
	'platform_only (we have it, the bill does not), channel_only (money taken, no record of ours), amount_mismatch, status_mismatch, fee_mismatch (the bill''s fee is not the payment''s cost_amount).';
-- Settlement holds a payment an open difference names: the open ones, by
-- payment (a difference is written by reconcile(), not on a payment's path).
CREATE INDEX reconciliation_open_payment ON payidem.reconciliation (payment_no) WHERE handle_status = 'open';
-- Settlement finds a merchant's refunds by the time they succeeded.
CREATE INDEX refund_merchant_refunded ON payidem.refund (merchant_no, refunded_at);
