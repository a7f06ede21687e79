-- Benchmark set-up (bench/idem.sh): the seed's PL/pgSQL pattern to compare
-- against, and 1,000 completed keys for the duplicate runs.
CREATE EXTENSION IF NOT EXISTS payidem;
CREATE SCHEMA IF NOT EXISTS bench;

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
