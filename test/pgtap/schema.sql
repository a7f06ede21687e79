SET client_min_messages = warning;

-- pgTAP test of the payidem schema (sql/parts/, assembled into payidem--1.0.sql).
--
-- Run in a database where both extensions are installed:
--   CREATE EXTENSION pgtap; CREATE EXTENSION payidem;
--   pg_prove -d <db> test/pgtap/schema.sql
--
-- Everything happens inside one transaction that is rolled back.  payidem
-- objects are always schema-qualified; pgTAP lives in public.
--
-- Conventions of the constraint sections:
--   * the fixtures (section 3) insert one valid row per table, each checked
--     with lives_ok, so that every later failure is for the reason named;
--   * each failing statement is a valid row with ONE value changed, and
--     throws_ok checks both the SQLSTATE and the exact message, which names
--     the constraint;
--   * failed statements leave nothing behind, so the failing rows of one
--     table all reuse the same spare key (...9).
--
-- Fixture keys:
--   merchants  M0123456789ABCDE (M1), M0123456789ABCDF (M2); unknown: MZZZZZZZZZZZZZZZ
--   channels   WXPAY_001 (configured, bound to M1), ALIPAY_001
--   orders     PO...01 (M1, T-0001, paid), PO...02 (M1, T-0002, pending)
--   payments   PY...01 (PO...01, succeeded), PY...02 (PO...02, pending)
--   refund     RF...01 (PY...01, 500)
--   bill day   2024-06-01 of WXPAY_001, batch WXPAY_001-20240601

BEGIN;
SELECT plan(367);

------------------------------------------------------------------------------
-- 1. Structure
------------------------------------------------------------------------------

-- Tables and sequences
SELECT tables_are('payidem', ARRAY[
	'state', 'transition', 'status_log',
	'merchant', 'merchant_secret', 'channel', 'channel_config', 'merchant_channel',
	'order', 'payment', 'refund', 'notify_event', 'query_lease',
	'idempotency', 'anomaly', 'channel_bill', 'recon_batch', 'reconciliation',
	'merchant_role', 'auditor_role', 'order_expiry', 'payment_pending', 'payment_paid',
	'business_day', 'ledger_entry', 'merchant_balance', 'settlement_item', 'settlement_hold',
	'settle_state', 'payout', 'adjustment'
], 'payidem has exactly the 31 expected tables');
SELECT has_table('payidem', 'state',            'table payidem.state exists');
SELECT has_table('payidem', 'transition',       'table payidem.transition exists');
SELECT has_table('payidem', 'status_log',       'table payidem.status_log exists');
SELECT has_table('payidem', 'merchant',         'table payidem.merchant exists');
SELECT has_table('payidem', 'merchant_secret',  'table payidem.merchant_secret exists');
SELECT has_table('payidem', 'channel',          'table payidem.channel exists');
SELECT has_table('payidem', 'channel_config',   'table payidem.channel_config exists');
SELECT has_table('payidem', 'merchant_channel', 'table payidem.merchant_channel exists');
SELECT has_table('payidem', 'order',            'table payidem."order" exists');
SELECT has_table('payidem', 'payment',          'table payidem.payment exists');
SELECT has_table('payidem', 'refund',           'table payidem.refund exists');
SELECT has_table('payidem', 'notify_event',     'table payidem.notify_event exists');
SELECT has_table('payidem', 'query_lease',      'table payidem.query_lease exists');
SELECT has_table('payidem', 'idempotency',      'table payidem.idempotency exists');
SELECT has_table('payidem', 'anomaly',          'table payidem.anomaly exists');
SELECT has_table('payidem', 'channel_bill',     'table payidem.channel_bill exists');
SELECT has_table('payidem', 'recon_batch',      'table payidem.recon_batch exists');
SELECT has_table('payidem', 'reconciliation',   'table payidem.reconciliation exists');
SELECT sequences_are('payidem', ARRAY[
	'status_log_log_id_seq', 'anomaly_anomaly_id_seq', 'reconciliation_recon_id_seq',
	'order_no_hwm', 'notify_event_seq', 'ledger_entry_entry_id_seq'
], 'payidem has exactly the 4 bigserial sequences, the order-number high-water mark and the event sequence');

-- Primary keys
SELECT col_is_pk('payidem', 'state',            ARRAY['entity', 'status'],                   'state: primary key is (entity, status)');
SELECT col_is_pk('payidem', 'transition',       ARRAY['entity', 'from_status', 'to_status'], 'transition: primary key is (entity, from_status, to_status)');
SELECT col_is_pk('payidem', 'status_log',       'log_id',                                    'status_log: primary key is log_id');
SELECT col_is_pk('payidem', 'merchant',         'merchant_no',                               'merchant: primary key is merchant_no');
SELECT col_is_pk('payidem', 'merchant_secret',  ARRAY['merchant_no', 'secret_version'],      'merchant_secret: primary key is (merchant_no, secret_version)');
SELECT col_is_pk('payidem', 'channel',          'channel_no',                                'channel: primary key is channel_no');
SELECT col_is_pk('payidem', 'channel_config',   'channel_no',                                'channel_config: primary key is channel_no');
SELECT col_is_pk('payidem', 'merchant_channel', ARRAY['merchant_no', 'channel_no'],          'merchant_channel: primary key is (merchant_no, channel_no)');
SELECT col_is_pk('payidem', 'order',            'order_no',                                  'order: primary key is order_no');
SELECT col_is_pk('payidem', 'payment',          'payment_no',                                'payment: primary key is payment_no');
SELECT col_is_pk('payidem', 'refund',           'refund_no',                                 'refund: primary key is refund_no');
SELECT col_is_pk('payidem', 'idempotency',      'idem_key',                                  'idempotency: primary key is idem_key');
SELECT col_is_pk('payidem', 'anomaly',          'anomaly_id',                                'anomaly: primary key is anomaly_id');
SELECT col_is_pk('payidem', 'channel_bill',     ARRAY['channel_no', 'bill_date', 'transaction_id'], 'channel_bill: primary key is (channel_no, bill_date, transaction_id)');
SELECT col_is_pk('payidem', 'recon_batch',      'recon_batch_no',                            'recon_batch: primary key is recon_batch_no');
SELECT col_is_pk('payidem', 'reconciliation',   'recon_id',                                  'reconciliation: primary key is recon_id');

-- Money is bigint (minor units)
SELECT col_type_is('payidem', 'order',            'amount',          'payidem', 'minor_amount', 'order: amount is a payidem.minor_amount');
SELECT col_type_is('payidem', 'order',            'refunded_amount', 'bigint', 'order: refunded_amount is bigint');
SELECT col_type_is('payidem', 'payment',          'amount',          'payidem', 'minor_amount', 'payment: amount is a payidem.minor_amount');
SELECT col_type_is('payidem', 'payment',          'fee_amount',      'bigint', 'payment: fee_amount is bigint');
SELECT col_type_is('payidem', 'payment',          'cost_amount',     'bigint', 'payment: cost_amount is bigint');
SELECT col_type_is('payidem', 'payment',          'refunded_amount', 'bigint', 'payment: refunded_amount is bigint');
SELECT col_type_is('payidem', 'refund',           'amount',          'payidem', 'minor_amount', 'refund: amount is a payidem.minor_amount');
SELECT is((SELECT format_type(typbasetype, typtypmod) FROM pg_type WHERE oid = 'payidem.minor_amount'::regtype),
	'bigint', 'payidem.minor_amount is bigint');
SELECT col_type_is('payidem', 'idempotency',      'amount',          'bigint', 'idempotency: amount is bigint');
SELECT col_type_is('payidem', 'anomaly',          'amount',          'bigint', 'anomaly: amount is bigint');
SELECT col_type_is('payidem', 'channel_bill',     'amount',          'bigint', 'channel_bill: amount is bigint');
SELECT col_type_is('payidem', 'channel_bill',     'fee',             'bigint', 'channel_bill: fee is bigint');
SELECT col_type_is('payidem', 'channel',          'single_limit',    'bigint', 'channel: single_limit is bigint');
SELECT col_type_is('payidem', 'channel',          'daily_limit',     'bigint', 'channel: daily_limit is bigint');
SELECT col_type_is('payidem', 'merchant_channel', 'single_limit',    'bigint', 'merchant_channel: single_limit is bigint');
SELECT col_type_is('payidem', 'merchant_channel', 'daily_limit',     'bigint', 'merchant_channel: daily_limit is bigint');
SELECT col_type_is('payidem', 'reconciliation',   'platform_amount', 'bigint', 'reconciliation: platform_amount is bigint');
SELECT col_type_is('payidem', 'reconciliation',   'channel_amount',  'bigint', 'reconciliation: channel_amount is bigint');

-- Rates are numeric(7,6) fractions; currency is an ISO code
SELECT col_type_is('payidem', 'merchant',         'fee_rate', 'numeric(7,6)', 'merchant: fee_rate is numeric(7,6)');
SELECT col_type_is('payidem', 'channel',          'fee_rate', 'numeric(7,6)', 'channel: fee_rate is numeric(7,6)');
SELECT col_type_is('payidem', 'merchant_channel', 'fee_rate', 'numeric(7,6)', 'merchant_channel: fee_rate is numeric(7,6)');
SELECT col_type_is('payidem', 'order',            'currency', 'payidem', 'currency_code', 'order: currency is a payidem.currency_code');
SELECT is((SELECT format_type(typbasetype, typtypmod) FROM pg_type WHERE oid = 'payidem.currency_code'::regtype),
	'character(3)', 'payidem.currency_code is character(3)');
-- Numbers, merchant and channel references, URLs and the single-column rules
-- of the hot tables are domains: checked when the value is written, not on
-- every UPDATE of the row
SELECT is((SELECT array_agg(format('%s.%s %s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod))
                            ORDER BY c.relname, a.attname)
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            WHERE c.relnamespace = 'payidem'::regnamespace AND c.relkind = 'r' AND a.attnum > 0
              AND NOT a.attisdropped AND a.atttypid IN (SELECT oid FROM pg_type WHERE typtype = 'd')),
	ARRAY['adjustment.adjust_no payidem.adjust_number', 'adjustment.currency payidem.currency_code',
	      'adjustment.out_adjust_no payidem.merchant_ref',
	      'channel_bill.transaction_id payidem.channel_ref',
	      'ledger_entry.account payidem.ledger_account',
	      'merchant.notify_url payidem.http_url',
	      'merchant_balance.currency payidem.currency_code',
	      'notify_event.attempts payidem.attempt_count', 'notify_event.event payidem.notify_event_type',
	      'notify_event.last_response payidem.notify_response', 'notify_event.status payidem.notify_status',
	      'order.amount payidem.minor_amount', 'order.body payidem.order_body',
	      'order.currency payidem.currency_code', 'order.notify_url payidem.http_url',
	      'order.order_no payidem.order_number', 'order.out_trade_no payidem.merchant_ref',
	      'order.paid_payment_no payidem.payment_number', 'order.return_url payidem.http_url',
	      'order.subject payidem.order_subject',
	      'payment.amount payidem.minor_amount',
	      'payment.payment_no payidem.payment_number', 'payment.transaction_id payidem.channel_ref',
	      'payout.amount payidem.minor_amount', 'payout.bank_ref payidem.channel_ref',
	      'payout.currency payidem.currency_code', 'payout.out_payout_no payidem.merchant_ref',
	      'payout.payout_no payidem.payout_number',
	      'refund.amount payidem.minor_amount',
	      'refund.channel_refund_id payidem.channel_ref', 'refund.out_refund_no payidem.merchant_ref',
	      'refund.reason payidem.refund_reason', 'refund.refund_no payidem.refund_number'],
	'the columns typed by payidem domains');
SELECT is((SELECT array_agg(DISTINCT format_type(typbasetype, typtypmod) ORDER BY format_type(typbasetype, typtypmod))
             FROM pg_type WHERE typnamespace = 'payidem'::regnamespace AND typtype = 'd'),
	ARRAY['bigint', 'character(3)', 'integer', 'text'],
	'every payidem domain is over bigint (money), integer, text or character(3)');

-- Timestamps carry a time zone
SELECT col_type_is('payidem', 'status_log',       'changed_at',     'timestamp with time zone', 'status_log: changed_at is timestamptz');
SELECT col_type_is('payidem', 'merchant',         'created_at',     'timestamp with time zone', 'merchant: created_at is timestamptz');
SELECT col_type_is('payidem', 'merchant',         'updated_at',     'timestamp with time zone', 'merchant: updated_at is timestamptz');
SELECT col_type_is('payidem', 'merchant_secret',  'valid_from',     'timestamp with time zone', 'merchant_secret: valid_from is timestamptz');
SELECT col_type_is('payidem', 'merchant_secret',  'valid_until',    'timestamp with time zone', 'merchant_secret: valid_until is timestamptz');
SELECT col_type_is('payidem', 'merchant_secret',  'created_at',     'timestamp with time zone', 'merchant_secret: created_at is timestamptz');
SELECT col_type_is('payidem', 'channel',          'created_at',     'timestamp with time zone', 'channel: created_at is timestamptz');
SELECT col_type_is('payidem', 'channel',          'updated_at',     'timestamp with time zone', 'channel: updated_at is timestamptz');
SELECT col_type_is('payidem', 'channel_config',   'created_at',     'timestamp with time zone', 'channel_config: created_at is timestamptz');
SELECT col_type_is('payidem', 'channel_config',   'updated_at',     'timestamp with time zone', 'channel_config: updated_at is timestamptz');
SELECT col_type_is('payidem', 'merchant_channel', 'created_at',     'timestamp with time zone', 'merchant_channel: created_at is timestamptz');
SELECT col_type_is('payidem', 'merchant_channel', 'updated_at',     'timestamp with time zone', 'merchant_channel: updated_at is timestamptz');
SELECT col_type_is('payidem', 'notify_event',     'next_attempt_at', 'timestamp with time zone', 'notify_event: next_attempt_at is timestamptz');
SELECT col_type_is('payidem', 'order',            'expire_at',      'timestamp with time zone', 'order: expire_at is timestamptz');
SELECT col_type_is('payidem', 'order',            'paid_at',        'timestamp with time zone', 'order: paid_at is timestamptz');
SELECT col_type_is('payidem', 'order',            'closed_at',      'timestamp with time zone', 'order: closed_at is timestamptz');
SELECT col_type_is('payidem', 'order',            'created_at',     'timestamp with time zone', 'order: created_at is timestamptz');
SELECT col_type_is('payidem', 'order',            'updated_at',     'timestamp with time zone', 'order: updated_at is timestamptz');
SELECT col_type_is('payidem', 'payment',          'paid_at',        'timestamp with time zone', 'payment: paid_at is timestamptz');
SELECT col_type_is('payidem', 'payment',          'closed_at',      'timestamp with time zone', 'payment: closed_at is timestamptz');
SELECT col_type_is('payidem', 'payment',          'created_at',     'timestamp with time zone', 'payment: created_at is timestamptz');
SELECT col_type_is('payidem', 'payment',          'updated_at',     'timestamp with time zone', 'payment: updated_at is timestamptz');
SELECT col_type_is('payidem', 'refund',           'refunded_at',    'timestamp with time zone', 'refund: refunded_at is timestamptz');
SELECT col_type_is('payidem', 'refund',           'created_at',     'timestamp with time zone', 'refund: created_at is timestamptz');
SELECT col_type_is('payidem', 'refund',           'updated_at',     'timestamp with time zone', 'refund: updated_at is timestamptz');
SELECT col_type_is('payidem', 'idempotency',      'locked_until',   'timestamp with time zone', 'idempotency: locked_until is timestamptz');
SELECT col_type_is('payidem', 'idempotency',      'created_at',     'timestamp with time zone', 'idempotency: created_at is timestamptz');
SELECT col_type_is('payidem', 'idempotency',      'updated_at',     'timestamp with time zone', 'idempotency: updated_at is timestamptz');
SELECT col_type_is('payidem', 'anomaly',          'handled_at',     'timestamp with time zone', 'anomaly: handled_at is timestamptz');
SELECT col_type_is('payidem', 'anomaly',          'created_at',     'timestamp with time zone', 'anomaly: created_at is timestamptz');
SELECT col_type_is('payidem', 'anomaly',          'updated_at',     'timestamp with time zone', 'anomaly: updated_at is timestamptz');
SELECT col_type_is('payidem', 'channel_bill',     'paid_at',        'timestamp with time zone', 'channel_bill: paid_at is timestamptz');
SELECT col_type_is('payidem', 'channel_bill',     'imported_at',    'timestamp with time zone', 'channel_bill: imported_at is timestamptz');
SELECT col_type_is('payidem', 'recon_batch',      'started_at',     'timestamp with time zone', 'recon_batch: started_at is timestamptz');
SELECT col_type_is('payidem', 'recon_batch',      'finished_at',    'timestamp with time zone', 'recon_batch: finished_at is timestamptz');
SELECT col_type_is('payidem', 'reconciliation',   'handled_at',     'timestamp with time zone', 'reconciliation: handled_at is timestamptz');
SELECT col_type_is('payidem', 'reconciliation',   'created_at',     'timestamp with time zone', 'reconciliation: created_at is timestamptz');
SELECT col_type_is('payidem', 'reconciliation',   'updated_at',     'timestamp with time zone', 'reconciliation: updated_at is timestamptz');

-- Catch-all for columns added later: no floating point, no unconstrained
-- numeric, no money type, no timestamp without time zone anywhere in payidem.
SELECT is_empty($$
	SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
	FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'payidem' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
	  AND (a.atttypid IN ('real'::regtype, 'double precision'::regtype, 'money'::regtype,
	                      'timestamp without time zone'::regtype)
	       OR (a.atttypid = 'numeric'::regtype AND a.atttypmod = -1))
$$, 'no column in payidem is float, money, bare numeric or timestamp without time zone');

-- Uniques (per merchant / per channel, and the targets of composite foreign keys)
-- (order_merchant_key and payment_order_key contain the primary key, so no
-- INSERT can violate them alone; they are only checked here, structurally.)
SELECT col_is_unique('payidem', 'merchant', ARRAY['api_key'],                     'merchant: api_key is unique');
SELECT col_is_unique('payidem', 'order',    ARRAY['merchant_no', 'out_trade_no'], 'order: (merchant_no, out_trade_no) is unique');
SELECT col_is_unique('payidem', 'order',    ARRAY['merchant_no', 'order_no'],     'order: (merchant_no, order_no) is unique (target of payment/refund foreign keys; list_orders() reads it)');
SELECT col_is_unique('payidem', 'payment_paid', ARRAY['channel_no', 'transaction_id'],'payment_paid: (channel_no, transaction_id) is unique (a channel''s transaction id is one payment)');
SELECT col_is_unique('payidem', 'payment',  ARRAY['order_no', 'payment_no'],      'payment: (order_no, payment_no) is unique (target of the refund and anomaly foreign keys; finds an order''s attempts)');
SELECT col_is_unique('payidem', 'refund',   ARRAY['merchant_no', 'out_refund_no'],'refund: (merchant_no, out_refund_no) is unique');

-- Foreign keys
SELECT has_fk('payidem', 'transition',       'transition has foreign keys');
SELECT has_fk('payidem', 'merchant_secret',  'merchant_secret has a foreign key');
SELECT has_fk('payidem', 'channel_config',   'channel_config has a foreign key');
SELECT has_fk('payidem', 'merchant_channel', 'merchant_channel has foreign keys');
SELECT has_fk('payidem', 'order',            'order has foreign keys');
SELECT has_fk('payidem', 'payment',          'payment has foreign keys');
SELECT has_fk('payidem', 'refund',           'refund has foreign keys');
SELECT has_fk('payidem', 'anomaly',          'anomaly has foreign keys');
SELECT has_fk('payidem', 'channel_bill',     'channel_bill has a foreign key');
SELECT has_fk('payidem', 'recon_batch',      'recon_batch has a foreign key');
SELECT has_fk('payidem', 'reconciliation',   'reconciliation has foreign keys');
SELECT fk_ok('payidem', 'transition', ARRAY['entity', 'from_status'],   'payidem', 'state',   ARRAY['entity', 'status'],
	'transition: (entity, from_status) references state');
SELECT fk_ok('payidem', 'transition', ARRAY['entity', 'to_status'],     'payidem', 'state',   ARRAY['entity', 'status'],
	'transition: (entity, to_status) references state');
SELECT fk_ok('payidem', 'payment',    ARRAY['order_no', 'merchant_no'], 'payidem', 'order',   ARRAY['order_no', 'merchant_no'],
	'payment: (order_no, merchant_no) references order, so the merchant matches the order''s');
SELECT fk_ok('payidem', 'refund',     ARRAY['payment_no', 'order_no'],  'payidem', 'payment', ARRAY['payment_no', 'order_no'],
	'refund: (payment_no, order_no) references payment, so the payment belongs to the order');
SELECT fk_ok('payidem', 'refund',     ARRAY['order_no', 'merchant_no'], 'payidem', 'order',   ARRAY['order_no', 'merchant_no'],
	'refund: (order_no, merchant_no) references order, so the merchant matches the order''s');

-- No generated columns (the status columns need no entity column beside
-- them: no foreign key checks them, the state-machine guard does)
SELECT is_empty($$
	SELECT c.relname, a.attname
	FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'payidem' AND a.attgenerated <> '' AND NOT a.attisdropped
$$, 'no column of payidem is generated');

-- New rows start in the initial status
SELECT col_default_is('payidem', 'order',   'status', 'pending'::text, 'order: status defaults to pending');
SELECT col_default_is('payidem', 'payment', 'status', 'pending'::text, 'payment: status defaults to pending');
SELECT col_default_is('payidem', 'refund',  'status', 'pending'::text, 'refund: status defaults to pending');

-- Partial unique indexes
SELECT has_index('payidem', 'payment_pending', 'payment_one_pending_per_order', 'order_no',
	'payment_pending: index payment_one_pending_per_order on (order_no) exists');
SELECT index_is_unique('payidem', 'payment_pending', 'payment_one_pending_per_order',
	'payment_pending: payment_one_pending_per_order is unique');
SELECT index_is_primary('payidem', 'payment_pending', 'payment_one_pending_per_order',
	'payment_pending: payment_one_pending_per_order is its primary key (one pending attempt per order)');
SELECT has_index('payidem', 'state', 'state_one_initial', 'entity',
	'state: index state_one_initial on (entity) exists');
SELECT index_is_unique('payidem', 'state', 'state_one_initial',
	'state: state_one_initial is unique');
SELECT is((SELECT pg_catalog.pg_get_expr(i.indpred, i.indrelid) FROM pg_catalog.pg_index i
           WHERE i.indexrelid = 'payidem.state_one_initial'::regclass),
	'initial',
	'state: state_one_initial is partial, WHERE initial');

------------------------------------------------------------------------------
-- 2. The built-in state-machine whitelist
------------------------------------------------------------------------------

SELECT is_empty($$SELECT entity, status FROM payidem.state
                  WHERE entity IN ('order', 'payment', 'refund') AND NOT builtin$$,
	'state: every built-in status is marked builtin (left out of pg_dump)');
SELECT is_empty($$SELECT entity, from_status, to_status FROM payidem.transition
                  WHERE entity IN ('order', 'payment', 'refund') AND NOT builtin$$,
	'transition: every built-in transition is marked builtin (left out of pg_dump)');

-- Statuses of each entity
SELECT set_eq($$SELECT status FROM payidem.state WHERE entity = 'order'$$,
	ARRAY['pending', 'paid', 'partially_refunded', 'refunded', 'closed'],
	'state: order statuses are pending, paid, partially_refunded, refunded, closed');
SELECT set_eq($$SELECT status FROM payidem.state WHERE entity = 'payment'$$,
	ARRAY['pending', 'succeeded', 'failed', 'closed', 'partially_refunded', 'refunded'],
	'state: payment statuses are pending, succeeded, failed, closed, partially_refunded, refunded');
SELECT set_eq($$SELECT status FROM payidem.state WHERE entity = 'refund'$$,
	ARRAY['pending', 'succeeded', 'failed'],
	'state: refund statuses are pending, succeeded, failed');
SELECT set_eq($$SELECT entity, status FROM payidem.state WHERE initial$$,
	$$VALUES ('order', 'pending'), ('payment', 'pending'), ('refund', 'pending'), ('payout', 'pending')$$,
	'state: the initial status is pending for order, payment, refund and payout');
SELECT set_eq($$SELECT entity, status FROM payidem.state WHERE terminal$$,
	$$VALUES ('order', 'closed'), ('order', 'refunded'),
	         ('payment', 'refunded'),
	         ('refund', 'succeeded'), ('refund', 'failed'),
	         ('payout', 'succeeded'), ('payout', 'failed')$$,
	'state: terminal statuses are order closed/refunded, payment refunded, refund and payout succeeded/failed');

-- Allowed transitions of each entity
SELECT set_eq($$SELECT from_status, to_status FROM payidem.transition WHERE entity = 'order'$$,
	$$VALUES ('pending', 'paid'), ('pending', 'closed'),
	         ('paid', 'partially_refunded'), ('paid', 'refunded'),
	         ('partially_refunded', 'refunded')$$,
	'transition: order flows exactly as designed');
SELECT set_eq($$SELECT from_status, to_status FROM payidem.transition WHERE entity = 'payment'$$,
	$$VALUES ('pending', 'succeeded'), ('pending', 'failed'), ('pending', 'closed'),
	         ('closed', 'succeeded'), ('failed', 'succeeded'),
	         ('succeeded', 'partially_refunded'), ('succeeded', 'refunded'),
	         ('partially_refunded', 'refunded')$$,
	'transition: payment flows exactly as designed (closed/failed -> succeeded for late payments)');
SELECT set_eq($$SELECT from_status, to_status FROM payidem.transition WHERE entity = 'refund'$$,
	$$VALUES ('pending', 'succeeded'), ('pending', 'failed')$$,
	'transition: refund flows exactly as designed');

-- Consistency of the whitelist itself
SELECT is_empty($$SELECT t.entity, t.from_status, t.to_status
                  FROM payidem.transition t
                  JOIN payidem.state s ON s.entity = t.entity AND s.status = t.from_status
                  WHERE s.terminal$$,
	'transition: no transition leaves a terminal status');
SELECT is_empty($$SELECT s.entity, s.status FROM payidem.state s
                  WHERE NOT s.initial
                    AND NOT EXISTS (SELECT FROM payidem.transition t
                                    WHERE t.entity = s.entity AND t.to_status = s.status)$$,
	'transition: every non-initial status can be reached');

------------------------------------------------------------------------------
-- 3. Fixtures: one valid row per table (each is an assertion)
------------------------------------------------------------------------------

SELECT lives_ok($$INSERT INTO payidem.state (entity, status, initial, terminal) VALUES
	('invoice', 'draft', true, false), ('invoice', 'issued', false, true)$$,
	'state: valid statuses of a new entity are accepted');
SELECT lives_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES
	('invoice', 'draft', 'issued')$$,
	'transition: a valid transition of a new entity is accepted');
SELECT lives_ok($$INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status) VALUES
	('order', 'PO202401010000000000000164', NULL, 'pending')$$,
	'status_log: a valid history row is accepted');
SELECT lives_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, status, api_key) VALUES
	('M0123456789ABCDE', 'Tea House', 'retail', 0.006000, 'T1', 'active', 'ak_live_0123456789abcdef'),
	('M0123456789ABCDF', 'Book Shop', 'retail', 0.003800, 'D0', 'active', 'ak_live_fedcba9876543210')$$,
	'merchant: valid merchants are accepted');
SELECT lives_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag, valid_until) VALUES
	('M0123456789ABCDE', 1, 1, '\x000000000000000000000000'::bytea, '\x0102030405'::bytea,
	 '\x00000000000000000000000000000000'::bytea, now() + interval '1 day')$$,
	'merchant_secret: a valid encrypted secret is accepted');
SELECT lives_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, status, weight, allowed_merchant_types, single_limit, daily_limit) VALUES
	('WXPAY_001', 'wxpay', 0.002500, 'active', 100, ARRAY['retail', 'catering'], 5000000, 100000000),
	('ALIPAY_001', 'alipay', 0.002000, 'active', 0, NULL, NULL, NULL)$$,
	'channel: valid channels are accepted');
SELECT lives_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('WXPAY_001', 1, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea,
	 '\x00000000000000000000000000000000'::bytea)$$,
	'channel_config: a valid encrypted configuration is accepted');
SELECT lives_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, fee_rate, single_limit, daily_limit, status, weight) VALUES
	('M0123456789ABCDE', 'WXPAY_001', 0.006000, 500000, 5000000, 'active', 100)$$,
	'merchant_channel: a valid binding is accepted');
-- The order and payment fixtures start in non-initial statuses (paid, succeeded):
-- load them as a restore does, with the state-machine triggers off (see
-- docs/state-machines.md); the state machine itself is tested in sql/state_machine.sql.
SET LOCAL session_replication_role = replica;
SELECT lives_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, body, amount, currency, status,
	                                        refunded_amount, notify_url, return_url, expire_at, paid_at) VALUES
	('PO202401010000000000000164', 'M0123456789ABCDE', 'T-0001', 'Green tea', 'Two cups', 1250, 'CNY', 'paid',
	 0, NULL, NULL, now() + interval '30 minutes', now()),
	('PO202401010000000000000261', 'M0123456789ABCDE', 'T-0002', 'Black tea', NULL, 990, 'CNY', 'pending',
	 0, NULL, NULL, now() + interval '30 minutes', NULL)$$,
	'order: valid orders are accepted');
SELECT lives_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id,
	                                       fee_amount, cost_amount, paid_at) VALUES
	('PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, 'succeeded',
	 '4200000000000000000001', 8, 3, now()),
	('PY202401010000000000000287', 'PO202401010000000000000261', 'M0123456789ABCDE', 'WXPAY_001', 990, 'pending',
	 NULL, NULL, NULL, NULL)$$,
	'payment: valid payment attempts are accepted');
RESET session_replication_role;
SELECT lives_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, reason) VALUES
	('RF202401010000000000000195', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE',
	 'R-0001', 500, 'one cup was cold')$$,
	'refund: a valid refund is accepted');
SELECT lives_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, channel, channel_txn_id, amount, fingerprint,
	                                           status, result, attempts, locked_until) VALUES
	('pay:PO202401010000000000000164:notify', 'pay', 'PO202401010000000000000164', 'WXPAY_001',
	 '4200000000000000000001', 1250, 'sha256:00ff', 'completed', '{"ok": true}', 1, NULL)$$,
	'idempotency: a valid completed key is accepted');
SELECT lives_ok($$INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail) VALUES
	('amount_mismatch', 'PO202401010000000000000164', 'PY202401010000000000000190', 'WXPAY_001', 10, '{"bill": 1260}')$$,
	'anomaly: a valid open anomaly is accepted');
SELECT lives_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000001', 'PY202401010000000000000190', 1250, 3, 'succeeded', now())$$,
	'channel_bill: a valid statement line is accepted');
SELECT lives_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, matched, started_at, finished_at) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'done', 1, now(), now() + interval '1 second')$$,
	'recon_batch: a valid finished batch is accepted');
SELECT lives_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, payment_no, platform_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'platform_only', 'PY202401010000000000000287', 990)$$,
	'reconciliation: a valid difference is accepted');

------------------------------------------------------------------------------
-- 4. Constraints, table by table
------------------------------------------------------------------------------

-- state -----------------------------------------------------------------------
SELECT throws_ok($$INSERT INTO payidem.state (entity, status) VALUES ('order', 'paid')$$,
	'23505', 'duplicate key value violates unique constraint "state_pkey"',
	'state: (entity, status) is unique');
SELECT throws_ok($$INSERT INTO payidem.state (entity, status) VALUES ('order', NULL)$$,
	'23502', 'null value in column "status" of relation "state" violates not-null constraint',
	'state: status cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.state (entity, status) VALUES ('Order', 'draft')$$,
	'23514', 'new row for relation "state" violates check constraint "state_entity_format"',
	'state: entity must be a lower-case identifier');
SELECT throws_ok($$INSERT INTO payidem.state (entity, status) VALUES ('order', 'on hold')$$,
	'23514', 'new row for relation "state" violates check constraint "state_status_format"',
	'state: status must be a lower-case identifier');
SELECT throws_ok($$INSERT INTO payidem.state (entity, status, initial, terminal) VALUES ('voucher', 'draft', true, true)$$,
	'23514', 'new row for relation "state" violates check constraint "state_initial_not_terminal"',
	'state: a status cannot be both initial and terminal');
SELECT throws_ok($$INSERT INTO payidem.state (entity, status, initial) VALUES ('order', 'draft', true)$$,
	'23505', 'duplicate key value violates unique constraint "state_one_initial"',
	'state: at most one initial status per entity');

-- transition ------------------------------------------------------------------
SELECT throws_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'pending', 'paid')$$,
	'23505', 'duplicate key value violates unique constraint "transition_pkey"',
	'transition: (entity, from_status, to_status) is unique');
SELECT throws_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES (NULL, 'pending', 'paid')$$,
	'23502', 'null value in column "entity" of relation "transition" violates not-null constraint',
	'transition: entity cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'paid')$$,
	'23514', 'new row for relation "transition" violates check constraint "transition_not_to_self"',
	'transition: a status cannot transition to itself');
SELECT throws_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'shipped', 'paid')$$,
	'23503', 'insert or update on table "transition" violates foreign key constraint "transition_from_known"',
	'transition: from_status must be a known status of the entity');
SELECT throws_ok($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'succeeded')$$,
	'23503', 'insert or update on table "transition" violates foreign key constraint "transition_to_known"',
	'transition: to_status must be a known status of the same entity');

-- status_log ------------------------------------------------------------------
SELECT throws_ok($$INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status) VALUES
	('order', 'PO202401010000000000000164', 'paid', 'paid')$$,
	'23514', 'new row for relation "status_log" violates check constraint "status_log_changed"',
	'status_log: from_status must differ from to_status');
SELECT throws_ok($$INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status) VALUES
	('order', NULL, NULL, 'pending')$$,
	'23502', 'null value in column "entity_no" of relation "status_log" violates not-null constraint',
	'status_log: entity_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.status_log (log_id, entity, entity_no, to_status)
	SELECT log_id, entity, entity_no, 'paid' FROM payidem.status_log$$,
	'23505', 'duplicate key value violates unique constraint "status_log_pkey"',
	'status_log: a log_id is unique');

-- merchant --------------------------------------------------------------------
-- valid template: ('M0123456789ABCDG', 'Tea House', 'retail', 0.006, 'ak_live_gggggggggggggggg')
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDE', 'Tea House', 'retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23505', 'duplicate key value violates unique constraint "merchant_pkey"',
	'merchant: merchant_no is unique');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 0.006, 'ak_live_0123456789abcdef')$$,
	'23505', 'duplicate key value violates unique constraint "merchant_api_key_key"',
	'merchant: api_key is unique');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	(NULL, 'Tea House', 'retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23502', 'null value in column "merchant_no" of relation "merchant" violates not-null constraint',
	'merchant: merchant_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', NULL, 'ak_live_gggggggggggggggg')$$,
	'23502', 'null value in column "fee_rate" of relation "merchant" violates not-null constraint',
	'merchant: fee_rate cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 0.006, NULL)$$,
	'23502', 'null value in column "api_key" of relation "merchant" violates not-null constraint',
	'merchant: api_key cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDI', 'Tea House', 'retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_no_format"',
	'merchant: merchant_no must be M + 15 Crockford base32 characters (no I)');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M000001', 'Tea House', 'retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_no_format"',
	'merchant: merchant_no must not be a short counter');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', '   ', 'retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_name_length"',
	'merchant: merchant_name must not be blank');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'Retail', 0.006, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_type_format"',
	'merchant: merchant_type must be a lower-case identifier');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', -0.000001, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_fee_rate_range"',
	'merchant: fee_rate cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 1, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_fee_rate_range"',
	'merchant: fee_rate of 1 (100%) is refused');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 1.5, 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_fee_rate_range"',
	'merchant: fee_rate of 1.5 is refused');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 12, 'ak_live_gggggggggggggggg')$$,
	'22003', 'numeric field overflow',
	'merchant: fee_rate of 12 (a percentage by mistake) overflows numeric(7,6)');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, settle_cycle, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 0.006, 'T', 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_settle_cycle_format"',
	'merchant: settle_cycle must be T<n> or D<n>');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, status, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 0.006, 'deleted', 'ak_live_gggggggggggggggg')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_status_known"',
	'merchant: status must be active, frozen or closed');
SELECT throws_ok($$INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key) VALUES
	('M0123456789ABCDG', 'Tea House', 'retail', 0.006, 'short')$$,
	'23514', 'new row for relation "merchant" violates check constraint "merchant_api_key_format"',
	'merchant: api_key must be 16 to 64 URL-safe characters');

-- merchant_secret -------------------------------------------------------------
-- valid template: ('M0123456789ABCDE', 9, 1, <12-byte nonce>, '\x01', <16-byte tag>)
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 1, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23505', 'duplicate key value violates unique constraint "merchant_secret_pkey"',
	'merchant_secret: (merchant_no, secret_version) is unique');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', NULL, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23502', 'null value in column "secret_version" of relation "merchant_secret" violates not-null constraint',
	'merchant_secret: secret_version cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('MZZZZZZZZZZZZZZZ', 9, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23503', 'insert or update on table "merchant_secret" violates foreign key constraint "merchant_secret_merchant_fkey"',
	'merchant_secret: merchant must exist');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 0, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_version_positive"',
	'merchant_secret: secret_version must be positive');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 9, 0, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_key_version_positive"',
	'merchant_secret: key_version must be positive');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 9, 1, '\x0000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_nonce_length"',
	'merchant_secret: nonce must be 12 bytes (11 refused)');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 9, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_tag_length"',
	'merchant_secret: auth_tag must be 16 bytes (15 refused)');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 9, 1, '\x000000000000000000000000'::bytea, ''::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_ciphertext_nonempty"',
	'merchant_secret: ciphertext must not be empty');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag, valid_from, valid_until) VALUES
	('M0123456789ABCDE', 9, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea,
	 now(), now())$$,
	'23514', 'new row for relation "merchant_secret" violates check constraint "merchant_secret_window"',
	'merchant_secret: valid_until must be after valid_from');
SELECT lives_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 2, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'merchant_secret: a current secret (no end) beside one in its grace window is accepted');
SELECT throws_ok($$INSERT INTO payidem.merchant_secret (merchant_no, secret_version, key_version, nonce, ciphertext, auth_tag) VALUES
	('M0123456789ABCDE', 3, 1, '\x000000000000000000000000'::bytea, '\x01'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23505', 'duplicate key value violates unique constraint "merchant_secret_one_current"',
	'merchant_secret: at most one current secret per merchant');

-- channel ---------------------------------------------------------------------
-- valid template: ('UNIONPAY_001', 'unionpay', 0.002)
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('WXPAY_001', 'wxpay', 0.002)$$,
	'23505', 'duplicate key value violates unique constraint "channel_pkey"',
	'channel: channel_no is unique');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES (NULL, 'unionpay', 0.002)$$,
	'23502', 'null value in column "channel_no" of relation "channel" violates not-null constraint',
	'channel: channel_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('UNIONPAY_001', 'unionpay', NULL)$$,
	'23502', 'null value in column "fee_rate" of relation "channel" violates not-null constraint',
	'channel: fee_rate cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('wxpay_001', 'wxpay', 0.002)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_no_format"',
	'channel: channel_no must be upper case (wxpay_001 refused)');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('UNIONPAY_001', 'UnionPay', 0.002)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_type_format"',
	'channel: channel_type must be a lower-case identifier');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('UNIONPAY_001', 'unionpay', 1)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_fee_rate_range"',
	'channel: fee_rate of 1 is refused');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, status) VALUES ('UNIONPAY_001', 'unionpay', 0.002, 'paused')$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_status_known"',
	'channel: status must be active or disabled');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, weight) VALUES ('UNIONPAY_001', 'unionpay', 0.002, 10001)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_weight_range"',
	'channel: weight must be between 0 and 10000');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, allowed_merchant_types) VALUES ('UNIONPAY_001', 'unionpay', 0.002, '{}')$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_allowed_types_valid"',
	'channel: allowed_merchant_types must not be an empty array (NULL means all)');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, allowed_merchant_types) VALUES ('UNIONPAY_001', 'unionpay', 0.002, ARRAY['retail', NULL])$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_allowed_types_valid"',
	'channel: allowed_merchant_types must not contain NULL');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, single_limit) VALUES ('UNIONPAY_001', 'unionpay', 0.002, 0)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_single_limit_positive"',
	'channel: single_limit must be positive');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, daily_limit) VALUES ('UNIONPAY_001', 'unionpay', 0.002, -1)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_daily_limit_positive"',
	'channel: daily_limit must be positive');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, single_limit, daily_limit) VALUES ('UNIONPAY_001', 'unionpay', 0.002, 10, 5)$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_limits_ordered"',
	'channel: single_limit cannot exceed daily_limit');
SELECT throws_ok($$INSERT INTO payidem.channel (channel_no, channel_type, fee_rate, allowed_merchant_types) VALUES ('UNIONPAY_001', 'unionpay', 0.002, ARRAY['retail', 'Big Shops'])$$,
	'23514', 'new row for relation "channel" violates check constraint "channel_allowed_types_valid"',
	'channel: allowed_merchant_types entries must be merchant-type codes');

-- channel_config --------------------------------------------------------------
-- valid template: ('ALIPAY_001', 1, <12-byte nonce>, '\x7b7d', <16-byte tag>)
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('WXPAY_001', 1, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23505', 'duplicate key value violates unique constraint "channel_config_pkey"',
	'channel_config: one configuration per channel');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	(NULL, 1, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23502', 'null value in column "channel_no" of relation "channel_config" violates not-null constraint',
	'channel_config: channel_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('NOPE_001', 1, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23503', 'insert or update on table "channel_config" violates foreign key constraint "channel_config_channel_fkey"',
	'channel_config: channel must exist');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('ALIPAY_001', 0, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "channel_config" violates check constraint "channel_config_key_version_positive"',
	'channel_config: key_version must be positive');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('ALIPAY_001', 1, '\x00000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "channel_config" violates check constraint "channel_config_nonce_length"',
	'channel_config: nonce must be 12 bytes (13 refused)');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('ALIPAY_001', 1, '\x000000000000000000000000'::bytea, '\x7b7d'::bytea, '\x0000000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "channel_config" violates check constraint "channel_config_tag_length"',
	'channel_config: auth_tag must be 16 bytes (17 refused)');
SELECT throws_ok($$INSERT INTO payidem.channel_config (channel_no, key_version, nonce, ciphertext, auth_tag) VALUES
	('ALIPAY_001', 1, '\x000000000000000000000000'::bytea, ''::bytea, '\x00000000000000000000000000000000'::bytea)$$,
	'23514', 'new row for relation "channel_config" violates check constraint "channel_config_ciphertext_nonempty"',
	'channel_config: ciphertext must not be empty');

-- merchant_channel ------------------------------------------------------------
-- valid template: ('M0123456789ABCDE', 'ALIPAY_001')
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no) VALUES ('M0123456789ABCDE', 'WXPAY_001')$$,
	'23505', 'duplicate key value violates unique constraint "merchant_channel_pkey"',
	'merchant_channel: one binding per merchant and channel');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no) VALUES ('M0123456789ABCDE', NULL)$$,
	'23502', 'null value in column "channel_no" of relation "merchant_channel" violates not-null constraint',
	'merchant_channel: channel_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no) VALUES ('MZZZZZZZZZZZZZZZ', 'ALIPAY_001')$$,
	'23503', 'insert or update on table "merchant_channel" violates foreign key constraint "merchant_channel_merchant_fkey"',
	'merchant_channel: merchant must exist');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no) VALUES ('M0123456789ABCDE', 'NOPE_001')$$,
	'23503', 'insert or update on table "merchant_channel" violates foreign key constraint "merchant_channel_channel_fkey"',
	'merchant_channel: channel must exist');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, fee_rate) VALUES ('M0123456789ABCDE', 'ALIPAY_001', 1)$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_fee_rate_range"',
	'merchant_channel: fee_rate of 1 is refused');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, single_limit) VALUES ('M0123456789ABCDE', 'ALIPAY_001', 0)$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_single_limit_positive"',
	'merchant_channel: single_limit must be positive');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, daily_limit) VALUES ('M0123456789ABCDE', 'ALIPAY_001', 0)$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_daily_limit_positive"',
	'merchant_channel: daily_limit must be positive');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, single_limit, daily_limit) VALUES ('M0123456789ABCDE', 'ALIPAY_001', 1000, 999)$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_limits_ordered"',
	'merchant_channel: single_limit cannot exceed daily_limit');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, status) VALUES ('M0123456789ABCDE', 'ALIPAY_001', 'frozen')$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_status_known"',
	'merchant_channel: status must be active or disabled');
SELECT throws_ok($$INSERT INTO payidem.merchant_channel (merchant_no, channel_no, weight) VALUES ('M0123456789ABCDE', 'ALIPAY_001', -1)$$,
	'23514', 'new row for relation "merchant_channel" violates check constraint "merchant_channel_weight_range"',
	'merchant_channel: weight must be between 0 and 10000');

-- order -----------------------------------------------------------------------
-- valid template: ('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + 30 min)
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000164', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23505', 'duplicate key value violates unique constraint "order_pkey"',
	'order: order_no is unique');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0001', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23505', 'duplicate key value violates unique constraint "order_out_trade_no_key"',
	'order: out_trade_no is unique per merchant');
SELECT lives_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000358', 'M0123456789ABCDF', 'T-0001', 'A novel', 4200, now() + interval '30 minutes')$$,
	'order: another merchant may reuse the same out_trade_no');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	(NULL, 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23502', 'null value in column "order_no" of relation "order" violates not-null constraint',
	'order: order_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', NULL, 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23502', 'null value in column "merchant_no" of relation "order" violates not-null constraint',
	'order: merchant_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', NULL, 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23502', 'null value in column "out_trade_no" of relation "order" violates not-null constraint',
	'order: out_trade_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', NULL, now() + interval '30 minutes')$$,
	'23502', 'null value in column "amount" of relation "order" violates not-null constraint',
	'order: amount cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, NULL, now() + interval '30 minutes')$$,
	'23502', 'null value in column "status" of relation "order" violates not-null constraint',
	'order: status cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, NULL)$$,
	'23502', 'null value in column "expire_at" of relation "order" violates not-null constraint',
	'order: expire_at cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', '12.50', now() + interval '30 minutes')$$,
	'22P02', 'invalid input syntax for type bigint: "12.50"',
	'order: a decimal amount as text (12.50) is refused, amounts are minor units');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'MZZZZZZZZZZZZZZZ', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23503', 'insert or update on table "order" violates foreign key constraint "order_merchant_fkey"',
	'order: merchant must exist');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 'shipped', now() + interval '30 minutes')$$,
	'PI002', 'a new order must start in status ''pending''',
	'order: an unknown status is refused');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 'succeeded', now() + interval '30 minutes')$$,
	'PI002', 'a new order must start in status ''pending''',
	'order: a status of another entity (payment succeeded) is refused');
SELECT is((SELECT count(*)::integer FROM pg_constraint
			WHERE confrelid = 'payidem.state'::regclass AND conrelid <> 'payidem.transition'::regclass),
	0, 'no foreign key checks a status a second time: the state-machine guard is the one check');
-- a status rows have stays in the whitelist (the guard of payidem.state)
INSERT INTO payidem.state (entity, status) VALUES ('order', 'on_hold');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES
	('order', 'pending', 'on_hold'), ('order', 'on_hold', 'pending');
SELECT ok(payidem.transit_order('PO202401010000000000000261', 'on_hold'), 'order: a status of the DBA''s own, taken');
SELECT throws_ok($$DELETE FROM payidem.state WHERE entity = 'order' AND status = 'on_hold'$$,
	'23503', 'status ''on_hold'' of order is in use',
	'state: a status rows have cannot be deleted');
SELECT throws_ok($$UPDATE payidem.state SET status = 'held' WHERE entity = 'order' AND status = 'on_hold'$$,
	'23503', 'status ''on_hold'' of order is in use',
	'state: ... nor renamed');
SELECT ok(payidem.transit_order('PO202401010000000000000261', 'pending'), 'order: back to pending');
SELECT lives_ok($$DELETE FROM payidem.transition WHERE entity = 'order' AND 'on_hold' IN (from_status, to_status);
	DELETE FROM payidem.state WHERE entity = 'order' AND status = 'on_hold'$$,
	'state: ... and once no row has it, it can be deleted');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO12345', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.order_number violates check constraint "order_number_format"',
	'order: order_no must be PO + 24 digits');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000941', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.order_number violates check constraint "order_number_format"',
	'order: order_no must carry its check digits');
-- check digits 01 where gen_order_no() writes 98: the MOD 97-10 sum holds, but
-- it is a second spelling of a number; the domain refuses it as order_no_valid() does
SELECT is((SELECT bool_or(payidem.order_no_valid(n)) FROM (
	SELECT 'PO' || b || '01' AS n FROM (SELECT '202401010000000000' || lpad(i::text, 4, '0') AS b
	                                      FROM generate_series(1, 500) i) x
	 WHERE ('2524' || b || '00')::numeric % 97 = 0 LIMIT 1) y), false,
	'order_no_valid() refuses check digits 01 where 98 is canonical');
SELECT throws_ok(format($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	(%L, 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	(SELECT 'PO' || b || '01' FROM (SELECT '202401010000000000' || lpad(i::text, 4, '0') AS b
	                                  FROM generate_series(1, 500) i) x
	  WHERE ('2524' || b || '00')::numeric % 97 = 0 LIMIT 1)),
	'23514', 'value for domain payidem.order_number violates check constraint "order_number_format"',
	'order: order_no check digits are the canonical 02..98');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T 0009', 'Green tea', 1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.merchant_ref violates check constraint "merchant_ref_format"',
	'order: out_trade_no must not contain spaces');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', '  ', 1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.order_subject violates check constraint "order_subject_length"',
	'order: subject must not be blank');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, body, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', repeat('x', 1025), 1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.order_body violates check constraint "order_body_length"',
	'order: body is at most 1024 characters');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 0, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.minor_amount violates check constraint "minor_amount_positive"',
	'order: amount must be positive (0 refused)');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', -1250, now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.minor_amount violates check constraint "minor_amount_positive"',
	'order: amount must be positive (negative refused)');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, currency, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 'cny', now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.currency_code violates check constraint "currency_code_format"',
	'order: currency must be three upper-case letters');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, refunded_amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 1251, now() + interval '30 minutes')$$,
	'23514', 'new row for relation "order" violates check constraint "order_refunded_range"',
	'order: refunded_amount cannot exceed amount');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, refunded_amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, -1, now() + interval '30 minutes')$$,
	'23514', 'new row for relation "order" violates check constraint "order_refunded_range"',
	'order: refunded_amount cannot be negative');
SELECT throws_ok($$UPDATE payidem."order" SET refunded_amount = amount + 1 WHERE order_no = 'PO202401010000000000000164'$$,
	'23514', 'new row for relation "order" violates check constraint "order_refunded_range"',
	'order: an UPDATE cannot refund more than the amount either');
-- URLs: http(s), no white space, at most 1024 characters
SELECT lives_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, notify_url, return_url, expire_at) VALUES
	('PO202401010000000000000455', 'M0123456789ABCDE', 'T-0004', 'Green tea', 1250,
	 'https://shop.example/notify', 'https://shop.example/return', now() + interval '30 minutes')$$,
	'order: https notify_url and return_url are accepted');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, notify_url, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 'ftp://shop.example/notify', now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.http_url violates check constraint "http_url_format"',
	'order: notify_url must be http(s)');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, return_url, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, 'javascript:alert(1)', now() + interval '30 minutes')$$,
	'23514', 'value for domain payidem.http_url violates check constraint "http_url_format"',
	'order: return_url must be http(s)');
SELECT throws_ok($$INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, payload, status, next_attempt_at, created_at)
	VALUES (100, 'order.paid', 'PO202401010000000000000164', 'M0123456789ABCDE', '{}', 'queued', now(), now())$$,
	'23514', 'value for domain payidem.notify_status violates check constraint "notify_status_known"',
	'notify_event: status must be pending, sent or failed');
SELECT throws_ok($$INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, payload, attempts, next_attempt_at, created_at)
	VALUES (100, 'order.paid', 'PO202401010000000000000164', 'M0123456789ABCDE', '{}', -1, now(), now())$$,
	'23514', 'value for domain payidem.attempt_count violates check constraint "attempt_count_nonnegative"',
	'notify_event: attempts cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, payload, next_attempt_at, created_at)
	VALUES (100, 'order.shipped', 'PO202401010000000000000164', 'M0123456789ABCDE', '{}', now(), now())$$,
	'23514', 'value for domain payidem.notify_event_type violates check constraint "notify_event_type_known"',
	'notify_event: only the three event types');
SELECT throws_ok($$INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, payload, next_attempt_at, created_at, last_response)
	VALUES (100, 'order.paid', 'PO202401010000000000000164', 'M0123456789ABCDE', '{}', now(), now(), repeat('x', 257))$$,
	'23514', 'value for domain payidem.notify_response violates check constraint "notify_response_length"',
	'notify_event: a kept response is at most 256 characters');
-- no foreign keys: the status_notify trigger, its one writer, copies the
-- order's number and merchant from the row it reports (docs/schema.md)
SELECT hasnt_fk('payidem', 'notify_event', 'notify_event has no foreign keys: its one writer copies the order it reports');
SELECT throws_ok($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at) VALUES
	('PO202401010000000000000940', 'M0123456789ABCDE', 'T-0009', 'Green tea', 1250, now())$$,
	'23514', 'new row for relation "order" violates check constraint "order_expire_after_create"',
	'order: expire_at must be after created_at');

-- payment ---------------------------------------------------------------------
-- valid template: ('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250)
-- (PO...01 has no pending attempt, so the template's default pending status is valid)
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250)$$,
	'23505', 'duplicate key value violates unique constraint "payment_pkey"',
	'payment: payment_no is unique');
-- (as pending: the state machine admits a new row in its initial status only,
-- and the payment's keys are written after its check)
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, transaction_id) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, '4200000000000000000001')$$,
	'23505', 'duplicate key value violates unique constraint "payment_transaction_key"',
	'payment: transaction_id is unique per channel');
-- (inserted as failed: loaded with the state-machine triggers off, as in section 3)
SET LOCAL session_replication_role = replica;
SELECT lives_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id) VALUES
	('PY202401010000000000000384', 'PO202401010000000000000164', 'M0123456789ABCDE', 'ALIPAY_001', 1250, 'failed', '4200000000000000000001')$$,
	'payment: the same transaction_id on another channel is allowed');
RESET session_replication_role;
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000261', 'M0123456789ABCDE', 'ALIPAY_001', 990)$$,
	'23505', 'duplicate key value violates unique constraint "payment_one_pending_per_order"',
	'payment: a second pending attempt for one order is refused');
-- (inserted as failed: loaded with the state-machine triggers off, as in section 3)
SET LOCAL session_replication_role = replica;
SELECT lives_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status) VALUES
	('PY202401010000000000000481', 'PO202401010000000000000261', 'M0123456789ABCDE', 'ALIPAY_001', 990, 'failed')$$,
	'payment: a failed second attempt next to the pending one is allowed');
RESET session_replication_role;
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	(NULL, 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250)$$,
	'23502', 'null value in column "payment_no" of relation "payment" violates not-null constraint',
	'payment: payment_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', NULL, 'M0123456789ABCDE', 'WXPAY_001', 1250)$$,
	'23502', 'null value in column "order_no" of relation "payment" violates not-null constraint',
	'payment: order_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', NULL, 1250)$$,
	'23502', 'null value in column "channel_no" of relation "payment" violates not-null constraint',
	'payment: channel_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', NULL)$$,
	'23502', 'null value in column "amount" of relation "payment" violates not-null constraint',
	'payment: amount cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000940', 'M0123456789ABCDE', 'WXPAY_001', 1250)$$,
	'23503', 'insert or update on table "payment" violates foreign key constraint "payment_order_fkey"',
	'payment: order must exist');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDF', 'WXPAY_001', 1250)$$,
	'23503', 'insert or update on table "payment" violates foreign key constraint "payment_order_fkey"',
	'payment: merchant must be the order''s merchant');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'NOPE_001', 1250)$$,
	'23503', 'insert or update on table "payment" violates foreign key constraint "payment_channel_fkey"',
	'payment: channel must exist');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, 'authorised')$$,
	'PI002', 'a new payment must start in status ''pending''',
	'payment: an unknown status is refused');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, 'paid')$$,
	'PI002', 'a new payment must start in status ''pending''',
	'payment: a status of another entity (order paid) is refused');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY9', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250)$$,
	'23514', 'value for domain payidem.payment_number violates check constraint "payment_number_format"',
	'payment: payment_no must be PY + 24 digits');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', -1)$$,
	'23514', 'value for domain payidem.minor_amount violates check constraint "minor_amount_positive"',
	'payment: amount must be positive');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, transaction_id) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, '4200 0001')$$,
	'23514', 'value for domain payidem.channel_ref violates check constraint "channel_ref_format"',
	'payment: transaction_id must be printable without spaces');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, fee_amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, -1)$$,
	'23514', 'new row for relation "payment" violates check constraint "payment_fee_range"',
	'payment: fee_amount cannot be negative');
SELECT throws_ok($$UPDATE payidem.payment SET fee_amount = amount + 1 WHERE payment_no = 'PY202401010000000000000190'$$,
	'23514', 'new row for relation "payment" violates check constraint "payment_fee_range"',
	'payment: fee_amount cannot exceed the amount');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, cost_amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, -1)$$,
	'23514', 'new row for relation "payment" violates check constraint "payment_cost_range"',
	'payment: cost_amount cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, refunded_amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, 1251)$$,
	'23514', 'new row for relation "payment" violates check constraint "payment_refunded_range"',
	'payment: refunded_amount cannot exceed amount');
SELECT throws_ok($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, refunded_amount) VALUES
	('PY202401010000000000000966', 'PO202401010000000000000164', 'M0123456789ABCDE', 'WXPAY_001', 1250, -1)$$,
	'23514', 'new row for relation "payment" violates check constraint "payment_refunded_range"',
	'payment: refunded_amount cannot be negative');

-- refund ----------------------------------------------------------------------
-- valid template: ('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000195', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)$$,
	'23505', 'duplicate key value violates unique constraint "refund_pkey"',
	'refund: refund_no is unique');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0001', 100)$$,
	'23505', 'duplicate key value violates unique constraint "refund_out_refund_no_key"',
	'refund: out_refund_no is unique per merchant');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	(NULL, 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)$$,
	'23502', 'null value in column "refund_no" of relation "refund" violates not-null constraint',
	'refund: refund_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', NULL, 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)$$,
	'23502', 'null value in column "payment_no" of relation "refund" violates not-null constraint',
	'refund: payment_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', NULL)$$,
	'23502', 'null value in column "amount" of relation "refund" violates not-null constraint',
	'refund: amount cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000287', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)$$,
	'23503', 'insert or update on table "refund" violates foreign key constraint "refund_payment_fkey"',
	'refund: the payment must belong to the refunded order');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDF', 'R-0009', 100)$$,
	'23503', 'insert or update on table "refund" violates foreign key constraint "refund_order_fkey"',
	'refund: merchant must be the order''s merchant');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100, 'cancelled')$$,
	'PI002', 'a new refund must start in status ''pending''',
	'refund: an unknown status is refused');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100, 'refunded')$$,
	'PI002', 'a new refund must start in status ''pending''',
	'refund: a status of another entity (payment refunded) is refused');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF0009', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100)$$,
	'23514', 'value for domain payidem.refund_number violates check constraint "refund_number_format"',
	'refund: refund_no must be RF + 24 digits');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', '', 100)$$,
	'23514', 'value for domain payidem.merchant_ref violates check constraint "merchant_ref_format"',
	'refund: out_refund_no must not be empty');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', -100)$$,
	'23514', 'value for domain payidem.minor_amount violates check constraint "minor_amount_positive"',
	'refund: amount must be positive');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, channel_refund_id) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100, '')$$,
	'23514', 'value for domain payidem.channel_ref violates check constraint "channel_ref_format"',
	'refund: channel_refund_id must not be empty');
SELECT throws_ok($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, reason) VALUES
	('RF202401010000000000000971', 'PY202401010000000000000190', 'PO202401010000000000000164', 'M0123456789ABCDE', 'R-0009', 100, repeat('x', 257))$$,
	'23514', 'value for domain payidem.refund_reason violates check constraint "refund_reason_length"',
	'refund: reason is at most 256 characters');

-- idempotency -----------------------------------------------------------------
-- valid template: ('k-0009', 'pay', 'processing', now() + 30 s)
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('pay:PO202401010000000000000164:notify', 'pay', 'processing', now() + interval '30 seconds')$$,
	'23505', 'duplicate key value violates unique constraint "idempotency_pkey"',
	'idempotency: idem_key is unique (the second caller loses)');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	(NULL, 'pay', 'processing', now() + interval '30 seconds')$$,
	'23502', 'null value in column "idem_key" of relation "idempotency" violates not-null constraint',
	'idempotency: idem_key cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('k-0009', NULL, 'processing', now() + interval '30 seconds')$$,
	'23502', 'null value in column "biz_type" of relation "idempotency" violates not-null constraint',
	'idempotency: biz_type cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('', 'pay', 'processing', now() + interval '30 seconds')$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_key_length"',
	'idempotency: idem_key must not be empty');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('k-0009', repeat('b', 65), 'processing', now() + interval '30 seconds')$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_biz_type_length"',
	'idempotency: biz_type is at most 64 characters');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, amount, status, locked_until) VALUES
	('k-0009', 'pay', 0, 'processing', now() + interval '30 seconds')$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_amount_positive"',
	'idempotency: amount must be positive');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('k-0009', 'pay', 'done', now() + interval '30 seconds')$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_status_known"',
	'idempotency: status must be processing, completed or failed');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, attempts, locked_until) VALUES
	('k-0009', 'pay', 'processing', 0, now() + interval '30 seconds')$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_attempts_positive"',
	'idempotency: attempts must be positive');
SELECT throws_ok($$INSERT INTO payidem.idempotency (idem_key, biz_type, status, locked_until) VALUES
	('k-0009', 'pay', 'processing', NULL)$$,
	'23514', 'new row for relation "idempotency" violates check constraint "idempotency_lease_when_processing"',
	'idempotency: a processing claim needs a lease (locked_until)');

-- anomaly ---------------------------------------------------------------------
-- valid template: (kind 'amount_mismatch', everything else default)
SELECT throws_ok($$INSERT INTO payidem.anomaly (anomaly_id, kind) SELECT anomaly_id, 'duplicate_payment' FROM payidem.anomaly$$,
	'23505', 'duplicate key value violates unique constraint "anomaly_pkey"',
	'anomaly: anomaly_id is unique');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind) VALUES (NULL)$$,
	'23502', 'null value in column "kind" of relation "anomaly" violates not-null constraint',
	'anomaly: kind cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, order_no) VALUES ('amount_mismatch', 'PO202401010000000000000940')$$,
	'23503', 'insert or update on table "anomaly" violates foreign key constraint "anomaly_order_fkey"',
	'anomaly: order, when given, must exist');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, payment_no) VALUES ('amount_mismatch', 'PY202401010000000000000966')$$,
	'23503', 'insert or update on table "anomaly" violates foreign key constraint "anomaly_payment_fkey"',
	'anomaly: payment, when given, must exist');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, order_no, payment_no) VALUES ('amount_mismatch', 'PO202401010000000000000261', 'PY202401010000000000000190')$$,
	'23503', 'insert or update on table "anomaly" violates foreign key constraint "anomaly_payment_order_fkey"',
	'anomaly: payment and order, when both given, belong together');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, channel_no) VALUES ('amount_mismatch', 'NOPE_001')$$,
	'23503', 'insert or update on table "anomaly" violates foreign key constraint "anomaly_channel_fkey"',
	'anomaly: channel, when given, must exist');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind) VALUES ('Amount Mismatch')$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_kind_format"',
	'anomaly: kind must be a lower-case identifier');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, amount) VALUES ('amount_mismatch', -1)$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_amount_nonnegative"',
	'anomaly: amount cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, detail) VALUES ('amount_mismatch', '[1, 2]')$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_detail_object"',
	'anomaly: detail must be a JSON object');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, handle_status, handled_at) VALUES ('amount_mismatch', 'closed', now())$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_handle_status_known"',
	'anomaly: handle_status must be open, handled or ignored');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, handle_status) VALUES ('amount_mismatch', 'handled')$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_handled_consistent"',
	'anomaly: a handled anomaly needs handled_at');
SELECT throws_ok($$INSERT INTO payidem.anomaly (kind, handled_at) VALUES ('amount_mismatch', now())$$,
	'23514', 'new row for relation "anomaly" violates check constraint "anomaly_handled_consistent"',
	'anomaly: an open anomaly has no handled_at');

-- channel_bill ----------------------------------------------------------------
-- valid template: ('WXPAY_001', '2024-06-01', '4200000000000000000009', 100, 'succeeded')
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000001', 1250, 'succeeded')$$,
	'23505', 'duplicate key value violates unique constraint "channel_bill_pkey"',
	'channel_bill: one line per channel, day and transaction');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', NULL, 100, 'succeeded')$$,
	'23502', 'null value in column "transaction_id" of relation "channel_bill" violates not-null constraint',
	'channel_bill: transaction_id cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000009', NULL, 'succeeded')$$,
	'23502', 'null value in column "amount" of relation "channel_bill" violates not-null constraint',
	'channel_bill: amount cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('NOPE_001', '2024-06-01', '4200000000000000000009', 100, 'succeeded')$$,
	'23503', 'insert or update on table "channel_bill" violates foreign key constraint "channel_bill_channel_fkey"',
	'channel_bill: channel must exist');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', '4200 0009', 100, 'succeeded')$$,
	'23514', 'value for domain payidem.channel_ref violates check constraint "channel_ref_format"',
	'channel_bill: transaction_id must be printable without spaces');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000009', 0, 'succeeded')$$,
	'23514', 'new row for relation "channel_bill" violates check constraint "channel_bill_amount_positive"',
	'channel_bill: amount must be positive');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, fee, status) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000009', 100, -1, 'succeeded')$$,
	'23514', 'new row for relation "channel_bill" violates check constraint "channel_bill_fee_nonnegative"',
	'channel_bill: fee cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, status) VALUES
	('WXPAY_001', '2024-06-01', '4200000000000000000009', 100, 'failed')$$,
	'23514', 'new row for relation "channel_bill" violates check constraint "channel_bill_status_known"',
	'channel_bill: status must be succeeded or refunded');

-- recon_batch -----------------------------------------------------------------
-- valid template: ('WXPAY_001-20240602', 'WXPAY_001', '2024-06-02')
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01')$$,
	'23505', 'duplicate key value violates unique constraint "recon_batch_pkey"',
	'recon_batch: recon_batch_no is unique');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date) VALUES
	('WXPAY_001-20240602', NULL, '2024-06-02')$$,
	'23502', 'null value in column "channel_no" of relation "recon_batch" violates not-null constraint',
	'recon_batch: channel_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date) VALUES
	('NOPE_001-20240602', 'NOPE_001', '2024-06-02')$$,
	'23503', 'insert or update on table "recon_batch" violates foreign key constraint "recon_batch_channel_fkey"',
	'recon_batch: channel must exist');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date) VALUES
	('wxpay 20240602', 'WXPAY_001', '2024-06-02')$$,
	'23514', 'new row for relation "recon_batch" violates check constraint "recon_batch_no_format"',
	'recon_batch: recon_batch_no must be upper case without spaces');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, finished_at) VALUES
	('WXPAY_001-20240602', 'WXPAY_001', '2024-06-02', 'stopped', clock_timestamp() + interval '1 hour')$$,
	'23514', 'new row for relation "recon_batch" violates check constraint "recon_batch_status_known"',
	'recon_batch: status must be running, done or failed');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status) VALUES
	('WXPAY_001-20240602', 'WXPAY_001', '2024-06-02', 'done')$$,
	'23514', 'new row for relation "recon_batch" violates check constraint "recon_batch_finished_when_ended"',
	'recon_batch: a done or failed batch has finished_at, a running one does not');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status_mismatch) VALUES
	('WXPAY_001-20240602', 'WXPAY_001', '2024-06-02', -1)$$,
	'23514', 'new row for relation "recon_batch" violates check constraint "recon_batch_counts_nonnegative"',
	'recon_batch: counts cannot be negative');
SELECT throws_ok($$INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, started_at, finished_at) VALUES
	('WXPAY_001-20240602', 'WXPAY_001', '2024-06-02', now(), now() - interval '1 second')$$,
	'23514', 'new row for relation "recon_batch" violates check constraint "recon_batch_finished_after_start"',
	'recon_batch: finished_at cannot be before started_at');

-- reconciliation --------------------------------------------------------------
-- valid template: ('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'platform_only', platform_amount 990)
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_id, recon_batch_no, channel_no, bill_date, diff_type, platform_amount)
	SELECT recon_id, recon_batch_no, channel_no, bill_date, diff_type, platform_amount FROM payidem.reconciliation$$,
	'23505', 'duplicate key value violates unique constraint "reconciliation_pkey"',
	'reconciliation: recon_id is unique');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	(NULL, 'WXPAY_001', '2024-06-01', 'platform_only', 990)$$,
	'23502', 'null value in column "recon_batch_no" of relation "reconciliation" violates not-null constraint',
	'reconciliation: recon_batch_no cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', NULL, 990)$$,
	'23502', 'null value in column "diff_type" of relation "reconciliation" violates not-null constraint',
	'reconciliation: diff_type cannot be NULL');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	('WXPAY_001-20240699', 'WXPAY_001', '2024-06-01', 'platform_only', 990)$$,
	'23503', 'insert or update on table "reconciliation" violates foreign key constraint "reconciliation_batch_fkey"',
	'reconciliation: batch must exist');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	('WXPAY_001-20240601', 'ALIPAY_001', '2024-06-01', 'platform_only', 990)$$,
	'23503', 'insert or update on table "reconciliation" violates foreign key constraint "reconciliation_batch_fkey"',
	'reconciliation: channel must be that of its batch');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-02', 'platform_only', 990)$$,
	'23503', 'insert or update on table "reconciliation" violates foreign key constraint "reconciliation_batch_fkey"',
	'reconciliation: bill_date must be that of its batch');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'missing', 990)$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_diff_type_known"',
	'reconciliation: diff_type must be one of the four kinds');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount, handle_status) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'platform_only', 990, 'closed')$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_handle_status_known"',
	'reconciliation: handle_status must be open, handled, ignored or auto_resolved');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount, channel_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'platform_only', 990, 990)$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_sides_consistent"',
	'reconciliation: platform_only has no channel amount');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount, channel_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'channel_only', NULL, NULL)$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_sides_consistent"',
	'reconciliation: channel_only needs the channel amount');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount, channel_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'amount_mismatch', 990, 990)$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_sides_consistent"',
	'reconciliation: amount_mismatch needs two different amounts');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_status, channel_status) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'status_mismatch', 'succeeded', 'succeeded')$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_sides_consistent"',
	'reconciliation: status_mismatch needs two different statuses');
SELECT throws_ok($$INSERT INTO payidem.reconciliation (recon_batch_no, channel_no, bill_date, diff_type, platform_amount, channel_amount) VALUES
	('WXPAY_001-20240601', 'WXPAY_001', '2024-06-01', 'amount_mismatch', -1, 990)$$,
	'23514', 'new row for relation "reconciliation" violates check constraint "reconciliation_amounts_nonnegative"',
	'reconciliation: amounts cannot be negative');

------------------------------------------------------------------------------
-- 5. pg_dump: every table and sequence is an extension configuration object
------------------------------------------------------------------------------

SELECT set_eq($$
	SELECT c.relname::text, cfg.cond
	FROM pg_catalog.pg_extension e,
	     unnest(e.extconfig, e.extcondition) AS cfg(reloid, cond)
	JOIN pg_catalog.pg_class c ON c.oid = cfg.reloid
	WHERE e.extname = 'payidem'
$$, $$ VALUES
	('state', 'WHERE NOT builtin'), ('transition', 'WHERE NOT builtin'),
	('status_log', ''), ('status_log_log_id_seq', ''),
	('merchant', ''), ('merchant_secret', ''), ('channel', ''), ('channel_config', ''), ('merchant_channel', ''),
	('order', ''), ('payment', ''), ('refund', ''),
	('notify_event', ''), ('notify_event_seq', ''), ('query_lease', ''),
	('idempotency', ''), ('anomaly', ''), ('anomaly_anomaly_id_seq', ''),
	('channel_bill', ''), ('recon_batch', ''), ('reconciliation', ''), ('reconciliation_recon_id_seq', ''), ('order_no_hwm', ''),
	('business_day', ''), ('ledger_entry', ''), ('ledger_entry_entry_id_seq', ''), ('merchant_balance', ''),
	('settlement_item', ''), ('settlement_hold', ''), ('settle_state', ''), ('payout', ''), ('adjustment', ''),
	('merchant_role', 'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)'), ('auditor_role', 'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)')
$$, 'extconfig lists the 28 tables and 6 sequences, with their dump conditions (not order_expiry: derived, made again by a restore)');
SELECT set_eq($$
	SELECT c.relname::text, cfg.cond
	FROM pg_catalog.pg_extension e,
	     unnest(e.extconfig, e.extcondition) AS cfg(reloid, cond)
	JOIN pg_catalog.pg_class c ON c.oid = cfg.reloid
	WHERE e.extname = 'payidem' AND cfg.cond <> ''
$$, $$ VALUES ('state', 'WHERE NOT builtin'), ('transition', 'WHERE NOT builtin'),
	('merchant_role', 'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)'), ('auditor_role', 'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)') $$,
	'extconfig: only the built-in whitelist rows and the mappings of dropped roles are left out');
SELECT is_empty($$
	SELECT c.relname
	FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'payidem' AND c.relkind IN ('r', 'p', 'S')
	  AND c.oid <> ALL (SELECT unnest(extconfig) FROM pg_catalog.pg_extension WHERE extname = 'payidem')
	  AND c.relname NOT IN ('order_expiry', 'payment_pending', 'payment_paid')
$$, 'extconfig: no table or sequence of payidem is left out of pg_dump but order_expiry, payment_pending and payment_paid (derived: a restore makes them again)');

------------------------------------------------------------------------------
-- 6. Privileges: nothing for PUBLIC
------------------------------------------------------------------------------

SELECT is((SELECT count(*)
           FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
                aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) a
           WHERE n.nspname = 'payidem' AND a.grantee = 0),
	0::bigint,
	'no privilege on any payidem table or sequence is granted to PUBLIC');
SELECT is((SELECT count(*) FROM information_schema.role_table_grants
           WHERE table_schema = 'payidem' AND grantee = 'PUBLIC'),
	0::bigint,
	'information_schema shows no payidem table grant to PUBLIC');
SELECT is((SELECT count(*)
           FROM pg_catalog.pg_namespace n,
                aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
           WHERE n.nspname = 'payidem' AND a.grantee = 0),
	0::bigint,
	'no privilege on schema payidem is granted to PUBLIC');
SELECT is((SELECT count(*)
           FROM pg_catalog.pg_proc p
           JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace,
                aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
           WHERE n.nspname = 'payidem' AND a.grantee = 0),
	0::bigint,
	'no payidem function is executable by PUBLIC');

------------------------------------------------------------------------------
-- 7. Every table is documented
------------------------------------------------------------------------------

SELECT is_empty($$
	SELECT c.relname
	FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = 'payidem' AND c.relkind IN ('r', 'p')
	  AND pg_catalog.obj_description(c.oid, 'pg_class') IS NULL
$$, 'every payidem table has a COMMENT');

SELECT * FROM finish();
ROLLBACK;
