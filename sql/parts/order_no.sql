------------------------------------------------------------------------------
-- Order numbers and the counters of stats() (C, shared memory)
------------------------------------------------------------------------------

CREATE SEQUENCE payidem.order_no_hwm AS bigint MINVALUE 0 START WITH 0 NO CYCLE;
COMMENT ON SEQUENCE payidem.order_no_hwm IS
	'Durable high-water mark of order numbers: UTC epoch second up to which numbers may have been issued. Written only by gen_order_no().';

CREATE FUNCTION payidem.gen_order_no(prefix text DEFAULT 'PO')
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_gen_order_no'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.gen_order_no(text) IS
	'Next 26-character order number: prefix, UTC second, shard, per-second sequence, ISO 7064 check digits. Never repeats.';

CREATE FUNCTION payidem.order_no_valid(order_no text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_order_no_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem.order_no_valid(text) IS
	'true if the text is a well-formed order number with correct check digits; false otherwise, also for NULL; never raises an error.';

CREATE FUNCTION payidem.order_no_parse(order_no text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
AS 'MODULE_PATHNAME', 'payidem_order_no_parse'
LANGUAGE C IMMUTABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem.order_no_parse(text) IS
	'The parts of an order number; SQLSTATE 22023 if it is not valid or NULL.';

CREATE FUNCTION payidem.order_no_make(prefix text, issued_at timestamptz, shard integer, seq integer)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_order_no_make'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem.order_no_make(text, timestamptz, integer, integer) IS
	'The number with these parts and its check digits (the inverse of order_no_parse). Reserves nothing: gen_order_no() may issue the same number. For fixtures, benchmarks and migrations.';

CREATE FUNCTION payidem.stats()
RETURNS TABLE (name text, value bigint, server_value bigint)
AS 'MODULE_PATHNAME', 'payidem_stats'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.stats() IS
	'Counters from shared memory since the server started: value for the current database, server_value for every database. Order numbers issued, clock rollbacks absorbed, seconds borrowed, claims and payment results by outcome, transitions, notifications, housekeeping (docs/operations.md).';

CREATE FUNCTION payidem._count(counter text, n bigint DEFAULT 1)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_count_sql'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._count(text, bigint) IS
	'Internal: add n to a counter of stats() (for the SQL parts that count).';

CREATE FUNCTION payidem._order_no_mark()
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_order_no_mark'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._order_no_mark() IS
	'Internal: the first second above every order number this server issued (0 if none or not preloaded).';

-- A new installation starts its high-water mark above every number this server
-- has issued, also in an earlier installation dropped from this database.
SELECT pg_catalog.setval('payidem.order_no_hwm', payidem._order_no_mark());

