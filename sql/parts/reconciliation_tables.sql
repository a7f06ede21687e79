------------------------------------------------------------------------------
-- Anomalies and reconciliation
------------------------------------------------------------------------------

CREATE TABLE payidem.anomaly (
	anomaly_id		bigserial	NOT NULL,
	kind			text		NOT NULL,
	order_no		text,
	payment_no		text,
	channel_no		text,
	amount			bigint,
	detail			jsonb		NOT NULL DEFAULT '{}',
	handle_status	text		NOT NULL DEFAULT 'open',
	handled_by		text,
	handled_at		timestamptz,
	note			text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT anomaly_pkey PRIMARY KEY (anomaly_id),
	CONSTRAINT anomaly_order_fkey FOREIGN KEY (order_no)
		REFERENCES payidem."order" (order_no),
	CONSTRAINT anomaly_payment_fkey FOREIGN KEY (payment_no)
		REFERENCES payidem.payment (payment_no),
	CONSTRAINT anomaly_payment_order_fkey FOREIGN KEY (payment_no, order_no)
		REFERENCES payidem.payment (payment_no, order_no),
	CONSTRAINT anomaly_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT anomaly_kind_format CHECK (kind ~ '^[a-z][a-z0-9_]{1,63}$'),
	CONSTRAINT anomaly_amount_nonnegative CHECK (amount >= 0),
	CONSTRAINT anomaly_detail_object CHECK (pg_catalog.jsonb_typeof(detail) = 'object'),
	CONSTRAINT anomaly_handle_status_known CHECK (handle_status IN ('open', 'handled', 'ignored')),
	CONSTRAINT anomaly_handled_consistent CHECK ((handle_status = 'open') = (handled_at IS NULL))
);
CREATE INDEX anomaly_open ON payidem.anomaly (created_at) WHERE handle_status = 'open';
CREATE INDEX anomaly_order ON payidem.anomaly (order_no);
CREATE INDEX anomaly_payment ON payidem.anomaly (payment_no);
COMMENT ON TABLE payidem.anomaly IS
	'Money that needs a person: paid_after_close, duplicate_payment, amount_mismatch, unknown_transaction, channel_only, ...';
-- A channel_only difference raises one anomaly, never a second one on a re-run.
CREATE UNIQUE INDEX anomaly_channel_only_once ON payidem.anomaly
	(channel_no, (detail ->> 'bill_date'), (detail ->> 'transaction_id'))
	WHERE kind = 'channel_only';
-- A success reported for a payment number that names no payment (lost in an
-- asynchronous failover, or never made here) raises one anomaly per number
-- and transaction id, however often the channel repeats it, also when two
-- deliveries arrive at once.  The number is in detail: payment_no and
-- order_no name rows that exist (foreign keys), and there is none.
CREATE UNIQUE INDEX anomaly_unknown_transaction_once ON payidem.anomaly
	((detail ->> 'reported_payment_no'), (detail ->> 'transaction_id'))
	WHERE kind = 'unknown_transaction';
COMMENT ON COLUMN payidem.anomaly.kind IS
	'What went wrong: paid_after_close, duplicate_payment, amount_mismatch, transaction_conflict, unknown_transaction, channel_only, ...';
COMMENT ON COLUMN payidem.anomaly.amount IS
	'Money concerned, minor units (e.g. the amount to refund).';
COMMENT ON COLUMN payidem.anomaly.handle_status IS
	'open until a person marks it handled or ignored (handled_at/handled_by/note say when, who and why).';

CREATE TABLE payidem.channel_bill (
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	transaction_id	payidem.channel_ref NOT NULL,
	payment_no		text,
	amount			bigint		NOT NULL,
	fee				bigint,
	status			text		NOT NULL,
	paid_at			timestamptz,
	imported_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT channel_bill_pkey PRIMARY KEY (channel_no, bill_date, transaction_id),
	CONSTRAINT channel_bill_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT channel_bill_amount_positive CHECK (amount > 0),
	CONSTRAINT channel_bill_fee_nonnegative CHECK (fee >= 0),
	CONSTRAINT channel_bill_status_known CHECK (status IN ('succeeded', 'refunded'))
);
CREATE INDEX channel_bill_transaction ON payidem.channel_bill (channel_no, transaction_id);
COMMENT ON TABLE payidem.channel_bill IS
	'Channel statement lines as imported (COPY-able: channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at).';
COMMENT ON COLUMN payidem.channel_bill.bill_date IS
	'The channel''s business day, cut at midnight in payidem.bill_timezone.';
COMMENT ON COLUMN payidem.channel_bill.payment_no IS
	'Our payment number as the channel echoes it (not trusted: no foreign key).';
COMMENT ON COLUMN payidem.channel_bill.fee IS
	'What the channel charged for the line, minor units; NULL when the bill reports none (reconcile() then compares no fee).';

CREATE TABLE payidem.recon_batch (
	recon_batch_no	text		NOT NULL,
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	status			text		NOT NULL DEFAULT 'running',
	matched			bigint		NOT NULL DEFAULT 0,
	platform_only	bigint		NOT NULL DEFAULT 0,
	channel_only	bigint		NOT NULL DEFAULT 0,
	amount_mismatch	bigint		NOT NULL DEFAULT 0,
	status_mismatch	bigint		NOT NULL DEFAULT 0,
	started_at		timestamptz	NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	finished_at		timestamptz,
	bill_timezone	text,
	bill_lines		bigint		NOT NULL DEFAULT 0,
	bill_amount_total numeric(38,0) NOT NULL DEFAULT 0,	-- a day's sum may pass bigint
	platform_payments bigint	NOT NULL DEFAULT 0,
	platform_amount_total numeric(38,0) NOT NULL DEFAULT 0,
	straddled		bigint		NOT NULL DEFAULT 0,
	auto_resolved	bigint		NOT NULL DEFAULT 0,
	CONSTRAINT recon_batch_pkey PRIMARY KEY (recon_batch_no),
	CONSTRAINT recon_batch_day_key UNIQUE (recon_batch_no, channel_no, bill_date),
	CONSTRAINT recon_batch_channel_fkey FOREIGN KEY (channel_no)
		REFERENCES payidem.channel (channel_no),
	CONSTRAINT recon_batch_no_format CHECK (recon_batch_no ~ '^[0-9A-Z_-]{1,64}$'),
	CONSTRAINT recon_batch_status_known CHECK (status IN ('running', 'done', 'failed')),
	CONSTRAINT recon_batch_counts_nonnegative CHECK (
		matched >= 0 AND platform_only >= 0 AND channel_only >= 0
		AND amount_mismatch >= 0 AND status_mismatch >= 0),
	CONSTRAINT recon_batch_finished_after_start CHECK (finished_at >= started_at),
	CONSTRAINT recon_batch_finished_when_ended CHECK ((status = 'running') = (finished_at IS NULL)),
	CONSTRAINT recon_batch_totals_nonnegative CHECK (
		bill_lines >= 0 AND bill_amount_total >= 0 AND platform_payments >= 0
		AND platform_amount_total >= 0 AND straddled >= 0 AND auto_resolved >= 0)
);
CREATE INDEX recon_batch_channel_day ON payidem.recon_batch (channel_no, bill_date);
COMMENT ON TABLE payidem.recon_batch IS
	'One reconciliation run of a channel and bill day: counts and timing.';
-- what each run saw, beyond the counts of the contract
COMMENT ON COLUMN payidem.recon_batch.recon_batch_no IS
	'RC-<channel_no>-<YYYYMMDD>-<run>, run = 001, 002, ... per channel and bill day.';
COMMENT ON COLUMN payidem.recon_batch.bill_timezone IS
	'The payidem.bill_timezone the run used to cut the day.';
COMMENT ON COLUMN payidem.recon_batch.bill_lines IS
	'Lines of the channel''s bill of that day.';
COMMENT ON COLUMN payidem.recon_batch.bill_amount_total IS
	'Sum of the amounts of the bill''s lines, minor units.';
COMMENT ON COLUMN payidem.recon_batch.platform_payments IS
	'Platform payments of the channel (succeeded, partially_refunded, refunded) whose paid_at falls on the day.';
COMMENT ON COLUMN payidem.recon_batch.platform_amount_total IS
	'Sum of the amounts of those payments, minor units.';
COMMENT ON COLUMN payidem.recon_batch.straddled IS
	'Midnight straddles: bill lines of the day matched to payments of another day, and payments of the day found in the bill of another day.';
COMMENT ON COLUMN payidem.recon_batch.auto_resolved IS
	'Open platform_only differences of other days that this run found in the day''s bill and marked auto_resolved.';

CREATE TABLE payidem.reconciliation (
	recon_id		bigserial	NOT NULL,
	recon_batch_no	text		NOT NULL,
	channel_no		text		NOT NULL,
	bill_date		date		NOT NULL,
	diff_type		text		NOT NULL,
	transaction_id	text,
	payment_no		text,
	platform_amount	bigint,
	channel_amount	bigint,
	platform_status	text,
	channel_status	text,
	handle_status	text		NOT NULL DEFAULT 'open',
	handled_by		text,
	handled_at		timestamptz,
	note			text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT reconciliation_pkey PRIMARY KEY (recon_id),
	CONSTRAINT reconciliation_batch_fkey FOREIGN KEY (recon_batch_no, channel_no, bill_date)
		REFERENCES payidem.recon_batch (recon_batch_no, channel_no, bill_date),
	CONSTRAINT reconciliation_diff_type_known CHECK (
		diff_type IN ('platform_only', 'channel_only', 'amount_mismatch', 'status_mismatch')),
	CONSTRAINT reconciliation_handle_status_known CHECK (
		handle_status IN ('open', 'handled', 'ignored', 'auto_resolved')),
	CONSTRAINT reconciliation_sides_consistent CHECK (
		CASE diff_type
			WHEN 'platform_only' THEN platform_amount IS NOT NULL AND channel_amount IS NULL
			WHEN 'channel_only' THEN platform_amount IS NULL AND channel_amount IS NOT NULL
			WHEN 'amount_mismatch' THEN platform_amount IS DISTINCT FROM channel_amount
				AND platform_amount IS NOT NULL AND channel_amount IS NOT NULL
			ELSE platform_status IS DISTINCT FROM channel_status
		END),
	CONSTRAINT reconciliation_amounts_nonnegative CHECK (platform_amount >= 0 AND channel_amount >= 0)
);
CREATE INDEX reconciliation_channel_day ON payidem.reconciliation (channel_no, bill_date, handle_status);
CREATE INDEX reconciliation_payment ON payidem.reconciliation (payment_no);
CREATE INDEX reconciliation_transaction ON payidem.reconciliation (channel_no, transaction_id);
COMMENT ON TABLE payidem.reconciliation IS
	'Reconciliation differences only (matched lines are not stored), each followed up by a person.';
COMMENT ON COLUMN payidem.reconciliation.diff_type IS
	'platform_only (we have it, the bill does not), channel_only (money taken, no record of ours), amount_mismatch, status_mismatch.';
COMMENT ON COLUMN payidem.reconciliation.handle_status IS
	'open, handled or ignored by a person, or auto_resolved (a midnight straddle found in the next day''s bill).';

