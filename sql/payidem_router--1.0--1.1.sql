-- payidem_router 1.0 -> 1.1 (ALTER EXTENSION payidem_router UPDATE TO '1.1').
-- A router installed as 1.1 is 1.0 updated by this script.
\echo Use "ALTER EXTENSION payidem_router UPDATE TO '1.1'" to load this file. \quit

-- #38: a number is placed with payidem's own codec, not with a copy of its
-- check digits.  The codec is C in the payidem library, which the package of
-- this extension installs with it (a router host has it, whether or not it
-- preloads payidem: these functions need no shared memory); payidem's SQL
-- names order_no_valid() and order_no_parse() are the router's own functions
-- here (routed to a shard), so the library's are declared under these names.
CREATE FUNCTION payidem._number_valid(number text)
RETURNS boolean
AS '$libdir/payidem', 'payidem_order_no_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._number_valid(text) IS
	'payidem''s order_no_valid(), run here (the payidem library): a well-formed number with correct check digits; false for NULL.';
CREATE FUNCTION payidem._number_parse(number text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
AS '$libdir/payidem', 'payidem_order_no_parse'
LANGUAGE C IMMUTABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem._number_parse(text) IS
	'payidem''s order_no_parse(), run here (the payidem library): the parts of a valid number; 22023 otherwise.';
REVOKE ALL ON FUNCTION payidem._number_valid(text), payidem._number_parse(text) FROM PUBLIC;

-- The partition that holds the row of an order, payment or refund number:
-- the shard it names, if the number is valid and of that kind and the shard
-- exists.  No lookup table.  SECURITY DEFINER: the codec is granted to no
-- one, and an application role calls this one (grant_app) in every routing.
CREATE OR REPLACE FUNCTION payidem.partition_of(number text, kind text)
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'refund' THEN 'RF' END;
	v_shard  integer;
BEGIN
	IF v_prefix IS NULL THEN
		RAISE EXCEPTION 'unknown kind of number %', coalesce(quote_literal(kind), 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'The kinds are order, payment and refund.';
	END IF;
	-- A number this cluster cannot place -- malformed, of another kind, with
	-- wrong check digits (a mistyped shard digit must not reach another
	-- shard), of a shard it does not have -- goes to partition 0, which
	-- refuses it in the words of one database.
	IF left(number, 2) IS DISTINCT FROM v_prefix OR NOT payidem._number_valid(number) THEN
		RETURN 0;
	END IF;
	SELECT n.shard INTO v_shard FROM payidem._number_parse(number) n;
	IF v_shard >= payidem.cluster_partitions() THEN
		RETURN 0;
	END IF;
	RETURN v_shard;
END
$$;
COMMENT ON FUNCTION payidem.partition_of(text, text) IS
	'Partition holding an order (kind order), payment or refund number: the shard it names (payidem''s codec); 0 for a number the cluster cannot place (invalid, of another kind, a shard outside the cluster), which partition 0 refuses as one database does.';
