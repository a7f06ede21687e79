-- Benchmark set-up (bench/idem.sh): the seed's PL/pgSQL pattern to compare
-- against, and the clock of the per-call loops.
CREATE EXTENSION IF NOT EXISTS payidem;
CREATE SCHEMA IF NOT EXISTS bench;

-- CPU time this backend has used so far, in nanoseconds (Linux: the first
-- field of /proc/self/schedstat), so that a loop's cost does not count the
-- time other processes on the machine held the CPU.  The kernel brings a
-- running task's count up to date only at a timer tick or a context switch:
-- a 1 ms sleep first makes the reading exact instead of up to a tick old.
CREATE OR REPLACE FUNCTION bench.cpu_ns() RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.001);
	RETURN split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint;
END
$$;

-- The seed's pattern, in PL/pgSQL: look the key up; if absent insert it and
-- treat a unique_violation (a concurrent first claim) as a duplicate.  Each
-- call with a new key enters an exception block (a subtransaction).
CREATE OR REPLACE FUNCTION bench.select_then_insert(p_key text, p_biz_type text, p_order_no text,
                                                    p_channel text, p_amount bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	v_status text;
BEGIN
	SELECT i.status INTO v_status FROM payidem.idempotency i WHERE i.idem_key = p_key;
	IF FOUND THEN
		RETURN v_status;
	END IF;
	BEGIN
		INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, channel, amount,
		                                 status, attempts, locked_until)
		VALUES (p_key, p_biz_type, p_order_no, p_channel, p_amount,
		        'processing', 1, now() + interval '30 seconds');
		RETURN 'claimed';
	EXCEPTION WHEN unique_violation THEN
		RETURN 'duplicate';
	END;
END
$$;
