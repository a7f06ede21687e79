--
-- order_no: gen_order_no(), order_no_valid(), order_no_parse(), shard digits,
-- uniqueness and strict monotonicity within one statement.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET timezone = 'UTC';
\set VERBOSITY default

-- format: 26 characters of [A-Z0-9], the prefix first, valid check digits
SELECT p AS prefix,
       length(n) AS len,
       n ~ '^[A-Z0-9]{26}$' AS charset_ok,
       left(n, 2) = p AS prefix_ok,
       payidem.order_no_valid(n) AS valid
  FROM unnest(ARRAY['PO', 'PY', 'RF', 'A1', '00', 'ZZ']) AS p,
       LATERAL payidem.gen_order_no(p) AS n;
SELECT left(payidem.gen_order_no(), 2) AS default_prefix;

-- the time part is the current UTC second (the clock is not behind here)
SELECT abs(extract(epoch FROM (payidem.order_no_parse(payidem.gen_order_no())).issued_at - now())) < 5
       AS time_is_now;

-- bad prefixes: 22023 with the value and a hint
SELECT payidem.gen_order_no('po');
SELECT payidem.gen_order_no('P');
SELECT payidem.gen_order_no('P-');
SELECT payidem.gen_order_no('');
SELECT payidem.gen_order_no('POX');
SELECT payidem.gen_order_no(repeat('X', 10000));
SELECT payidem.gen_order_no(NULL);
-- the SQLSTATEs
\set VERBOSITY sqlstate
SELECT payidem.gen_order_no('p0');
SELECT payidem.gen_order_no(NULL);
SELECT * FROM payidem.order_no_parse('PO202611292100000000000063');
\set VERBOSITY default

-- parse of a known number (check digits computed independently)
SELECT * FROM payidem.order_no_parse('PO202611292100000000000062');
SELECT * FROM payidem.order_no_parse('RF999912312359599999999966');
SELECT payidem.order_no_valid('PO202611292100000000000062') AS known_valid,
       payidem.order_no_valid('PO202611292100000000005397') AS check_97_valid,
       payidem.order_no_valid('PO202611292100000000005300') AS noncanonical_00,
       payidem.order_no_valid(NULL) IS FALSE AS null_is_not_valid;

-- order_no_make builds a number from its parts: the inverse of order_no_parse
SELECT payidem.order_no_make('PO', '2026-11-29 21:00:00.999+00', 0, 0) AS made,
       payidem.order_no_make('RF', '9999-12-31 23:59:59+00', 99, 999999) AS made_max;
SELECT p.* FROM payidem.order_no_parse(payidem.order_no_make('PY', '1970-01-01 00:00:00+00', 7, 42)) p;

-- invalid numbers: order_no_valid says false, order_no_parse says why
SELECT n, payidem.order_no_valid(n) AS valid
  FROM unnest(ARRAY['', 'PO', 'PO20261129210000000000006', 'PO2026112921000000000000620',
                    'po202611292100000000000062', 'PO20261129210000000000006X',
                    'PO202302290000000000000000', 'PO202611292400000000000000',
                    'PO202611292100000000000063', 'PO 02611292100000000000062']) AS n;
SELECT * FROM payidem.order_no_parse('PO20261129210000000000006');
SELECT * FROM payidem.order_no_parse('PO2026112921000000000000XY');
SELECT * FROM payidem.order_no_parse('PO202302290000000000000000');
SELECT * FROM payidem.order_no_parse('PO202611292100000000000063');
SELECT * FROM payidem.order_no_parse(repeat('9', 5000));

-- every single-character change and every adjacent swap of a fresh number is
-- detected by the check digits (36 characters x 26 positions, 25 swaps)
SELECT payidem.gen_order_no() AS fresh \gset
SELECT count(*) AS single_changes,
       count(*) FILTER (WHERE payidem.order_no_valid(changed)) AS undetected
  FROM generate_series(1, 26) AS pos,
       regexp_split_to_table('0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ', '') AS c,
       LATERAL overlay(:'fresh' PLACING c FROM pos FOR 1) AS changed
 WHERE substr(:'fresh', pos, 1) <> c;
SELECT count(*) > 0 AS has_swaps,
       count(*) FILTER (WHERE payidem.order_no_valid(swapped)) AS undetected
  FROM generate_series(1, 25) AS pos,
       LATERAL overlay(:'fresh' PLACING substr(:'fresh', pos + 1, 1) || substr(:'fresh', pos, 1)
                       FROM pos FOR 2) AS swapped
 WHERE substr(:'fresh', pos, 1) <> substr(:'fresh', pos + 1, 1);

-- shard digits follow payidem.shard_id (superuser; settable per database)
SHOW payidem.shard_id;
SET payidem.shard_id = 42;
SELECT substr(n, 17, 2) AS shard_digits, (payidem.order_no_parse(n)).shard
  FROM payidem.gen_order_no() AS n;
SET payidem.shard_id = 7;
SELECT substr(payidem.gen_order_no('PY'), 17, 2) AS shard_digits;
SET payidem.shard_id = 100;
SET payidem.shard_id = -1;
RESET payidem.shard_id;
CREATE ROLE regress_payidem_shard;
SET ROLE regress_payidem_shard;
SET payidem.shard_id = 3;
RESET ROLE;
DROP ROLE regress_payidem_shard;
-- a misspelt payidem setting is refused: the prefix is reserved
SET payidem.shardid = 1;

-- 1,000,000 numbers in one statement: all distinct, strictly increasing in
-- issue order as (time, seq), whatever the prefix
SELECT (stats.value) AS issued_before FROM payidem.stats() AS stats WHERE name = 'order_nos_issued' \gset
CREATE TEMP TABLE issued AS
  SELECT i, payidem.gen_order_no(CASE WHEN i % 3 = 0 THEN 'PY' ELSE 'PO' END) AS n
    FROM generate_series(1, 1000000) AS i;
SELECT count(*) AS numbers,
       count(DISTINCT n) AS distinct_numbers,
       count(DISTINCT substr(n, 3, 22)) AS distinct_time_shard_seq
  FROM issued;
SELECT count(*) AS out_of_order
  FROM (SELECT substr(n, 3, 22) AS key,
               lag(substr(n, 3, 22)) OVER (ORDER BY i) AS prev
          FROM issued) s
 WHERE key <= prev;
SELECT count(*) FILTER (WHERE NOT payidem.order_no_valid(n)) AS invalid FROM issued;
SELECT value - :issued_before >= 1000000 AS stats_counted
  FROM payidem.stats() WHERE name = 'order_nos_issued';
DROP TABLE issued;

-- stats() names
SELECT name FROM payidem.stats() ORDER BY name;

-- Replication (DESIGN section 12): a server without standbys is asynchronous;
-- with payidem.require_synchronous_standby on, numbers, event ids,
-- idempotency claims, payment results and status changes are refused (55000)
-- and change nothing.
SELECT mode, synchronous_standby_names, synchronous_commit, require_synchronous_standby,
       writes_allowed, timeline > 0 AS has_timeline
  FROM payidem.replication_mode();
SET payidem.require_synchronous_standby = on;
SELECT mode, require_synchronous_standby, writes_allowed FROM payidem.replication_mode();
SELECT (value) AS issued_before FROM payidem.stats() WHERE name = 'order_nos_issued' \gset
SELECT payidem.gen_order_no();
SELECT * FROM payidem.idem_claim('repl:refused', 'payment', 'PO1', 'alipay', 100);
DO $$
BEGIN
	PERFORM payidem.gen_order_no('PY');
EXCEPTION WHEN object_not_in_prerequisite_state THEN
	RAISE NOTICE 'refused with 55000';
END
$$;
SELECT value = :issued_before AS nothing_issued FROM payidem.stats() WHERE name = 'order_nos_issued';
SELECT count(*) AS keys FROM payidem.idempotency WHERE idem_key = 'repl:refused';
RESET payidem.require_synchronous_standby;
SELECT payidem.order_no_valid(payidem.gen_order_no()) AS issues_again;
-- the gap a promoted server's numbers jump: superuser, seconds, 0 to a day
SHOW payidem.promotion_gap;
SET payidem.promotion_gap = '2min';
SHOW payidem.promotion_gap;
SET payidem.promotion_gap = '2 days';
RESET payidem.promotion_gap;
