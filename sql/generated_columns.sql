--
-- generated_columns: a generated column a DBA adds, and a CHECK that reads it,
-- hold for payidem's direct writes as for an UPDATE or INSERT in SQL — the
-- payment's success (apply_payment_result) and the status_log insert — and for
-- an idempotency claim (which, on a table with a column added, takes the SQL
-- insert).  Stored columns on every major; virtual ones (the default
-- from PostgreSQL 18 on, stored as NULL and computed when read) on 18 and later.
-- Each case runs in a transaction that is rolled back.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS payidem;
\set VERBOSITY terse
\set SHOW_CONTEXT never

-- run a statement; its SQLSTATE and message (errors raised in an included
-- file would carry the file's path)
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT;
	RETURN NEXT;
END
$$;

SELECT merchant_no AS m1 FROM payidem.create_merchant('Generated Tea', 'retail', 0.006) \gset
SELECT payidem.create_channel('GENCOL_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(:'m1', 'GENCOL_WX');
SELECT payidem.create_order(:'m1', 'G-0001', 700, 'Oolong') AS o1 \gset
SELECT payidem.begin_payment(:'o1', 'GENCOL_WX') AS p1 \gset

-- the cases, once per kind (pg_regress names its input directory)
\getenv abs_srcdir PG_ABS_SRCDIR
\set cases :abs_srcdir '/sql/generated_columns.inc'

-- the stored kind, on every major
\set kind STORED
\i :cases

-- the virtual kind, from PostgreSQL 18 on
SELECT current_setting('server_version_num')::int >= 180000 AS has_virtual \gset
\if :has_virtual
\set kind VIRTUAL
\i :cases
\else
\echo 'virtual generated columns: PostgreSQL 18 and later'
\endif

-- nothing of the above stayed
SELECT status, fee_amount FROM payidem.payment WHERE payment_no = :'p1';
SELECT count(*) AS keys FROM payidem.idempotency WHERE idem_key LIKE 'gen:%';
