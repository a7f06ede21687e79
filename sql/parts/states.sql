------------------------------------------------------------------------------
-- State machines: the data-driven whitelist and the append-only log
------------------------------------------------------------------------------

CREATE TABLE payidem.state (
	entity		text	NOT NULL,
	status		text	NOT NULL,
	initial		boolean	NOT NULL DEFAULT false,
	terminal	boolean	NOT NULL DEFAULT false,
	builtin		boolean	NOT NULL DEFAULT false,
	CONSTRAINT state_pkey PRIMARY KEY (entity, status),
	CONSTRAINT state_entity_format CHECK (entity ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT state_status_format CHECK (status ~ '^[a-z][a-z0-9_]{0,31}$'),
	CONSTRAINT state_initial_not_terminal CHECK (NOT (initial AND terminal))
);
CREATE UNIQUE INDEX state_one_initial ON payidem.state (entity) WHERE initial;
COMMENT ON TABLE payidem.state IS
	'State-machine whitelist: the statuses of each entity (order, payment, refund, or one a DBA adds).';
COMMENT ON COLUMN payidem.state.initial IS
	'The status a new row must be inserted with; exactly one per entity.';
COMMENT ON COLUMN payidem.state.terminal IS
	'No transition may leave a terminal status.';
COMMENT ON COLUMN payidem.state.builtin IS
	'Row installed by the extension (not dumped by pg_dump; CREATE EXTENSION recreates it).';

CREATE TABLE payidem.transition (
	entity		text	NOT NULL,
	from_status	text	NOT NULL,
	to_status	text	NOT NULL,
	builtin		boolean	NOT NULL DEFAULT false,
	CONSTRAINT transition_pkey PRIMARY KEY (entity, from_status, to_status),
	CONSTRAINT transition_from_known FOREIGN KEY (entity, from_status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT transition_to_known FOREIGN KEY (entity, to_status)
		REFERENCES payidem.state (entity, status),
	CONSTRAINT transition_not_to_self CHECK (from_status <> to_status)
);
CREATE INDEX transition_to ON payidem.transition (entity, to_status);
COMMENT ON TABLE payidem.transition IS
	'State-machine whitelist: the allowed status changes. Insert rows to add a flow; the triggers see it in the next statement.';
COMMENT ON COLUMN payidem.transition.builtin IS
	'Row installed by the extension (not dumped by pg_dump; CREATE EXTENSION recreates it).';

INSERT INTO payidem.state (entity, status, initial, terminal, builtin) VALUES
	('order',   'pending',            true,  false, true),
	('order',   'paid',               false, false, true),
	('order',   'partially_refunded', false, false, true),
	('order',   'refunded',           false, true,  true),
	('order',   'closed',             false, true,  true),
	('payment', 'pending',            true,  false, true),
	('payment', 'succeeded',          false, false, true),
	('payment', 'failed',             false, false, true),
	('payment', 'closed',             false, false, true),
	('payment', 'partially_refunded', false, false, true),
	('payment', 'refunded',           false, true,  true),
	('refund',  'pending',            true,  false, true),
	('refund',  'succeeded',          false, true,  true),
	('refund',  'failed',             false, true,  true);

INSERT INTO payidem.transition (entity, from_status, to_status, builtin) VALUES
	('order',   'pending',            'paid',               true),
	('order',   'pending',            'closed',             true),
	('order',   'paid',               'partially_refunded', true),
	('order',   'paid',               'refunded',           true),
	('order',   'partially_refunded', 'refunded',           true),
	('payment', 'pending',            'succeeded',          true),
	('payment', 'pending',            'failed',             true),
	('payment', 'pending',            'closed',             true),
	('payment', 'closed',             'succeeded',          true),
	('payment', 'failed',             'succeeded',          true),
	('payment', 'succeeded',          'partially_refunded', true),
	('payment', 'succeeded',          'refunded',           true),
	('payment', 'partially_refunded', 'refunded',           true),
	('refund',  'pending',            'succeeded',          true),
	('refund',  'pending',            'failed',             true);

CREATE TABLE payidem.status_log (
	log_id		bigserial	NOT NULL,
	entity		text		NOT NULL,
	entity_no	text		NOT NULL,
	from_status	text,
	to_status	text		NOT NULL,
	changed_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	changed_by	text		NOT NULL DEFAULT CURRENT_USER,
	txid		bigint		NOT NULL DEFAULT pg_catalog.txid_current(),
	-- the one index a logged change writes: log_id comes from its sequence,
	-- so each entry goes to the right end of the index, where a btree insert
	-- does not descend from its root (since 1.1: the key was (entity,
	-- entity_no, log_id), a descent and text comparisons for every status
	-- change, for a look-up no payidem function makes; docs/schema.md says
	-- which index to add for looking up one entity's history often)
	CONSTRAINT status_log_pkey PRIMARY KEY (log_id),
	CONSTRAINT status_log_changed CHECK (from_status IS DISTINCT FROM to_status)
);
COMMENT ON TABLE payidem.status_log IS
	'Append-only history of every status an order, payment or refund took (insert = from_status NULL).';
COMMENT ON COLUMN payidem.status_log.entity_no IS
	'order_no, payment_no or refund_no of the row that changed.';
COMMENT ON COLUMN payidem.status_log.txid IS
	'Transaction that made the change (txid_current()), to group changes made together.';

