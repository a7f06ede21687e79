-- bench/state_plpgsql.sql — the state-machine guard written in PL/pgSQL, for
-- comparison only (never installed by the extension).  Same logic as the C
-- trigger payidem.status_guard(): insert must use the initial status; a change
-- must be a row of payidem.transition (one indexed lookup per row, no cache);
-- every accepted one appends to status_log.  Written to be fast: the key
-- column is hard-coded (order_no) instead of being looked up dynamically, and
-- the statements are plain static SQL, so PL/pgSQL caches their plans.
CREATE OR REPLACE FUNCTION bench_plpgsql_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		PERFORM 1 FROM payidem.state
		 WHERE entity = TG_ARGV[0] AND status = NEW.status AND initial;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'a new % must start in its initial status', TG_ARGV[0]
				USING ERRCODE = 'PI002';
		END IF;
		INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
		VALUES (TG_ARGV[0], NEW.order_no, NULL, NEW.status);
	ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
		PERFORM 1 FROM payidem.transition
		 WHERE entity = TG_ARGV[0] AND from_status = OLD.status AND to_status = NEW.status;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'status change not allowed by the % state machine', TG_ARGV[0]
				USING ERRCODE = 'PI002',
				      DETAIL = format('%s %L: %L -> %L is not allowed', TG_ARGV[0], NEW.order_no, OLD.status, NEW.status);
		END IF;
		INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
		VALUES (TG_ARGV[0], NEW.order_no, OLD.status, NEW.status);
	END IF;
	RETURN NULL;
END $$;

-- bench_variant('none' | 'c' | 'plpgsql'): which guard is active on "order"
CREATE OR REPLACE FUNCTION bench_variant(v text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	DROP TRIGGER IF EXISTS bench_plpgsql_guard ON payidem."order";
	IF v = 'c' THEN
		ALTER TABLE payidem."order" ENABLE TRIGGER status_guard;
	ELSE
		ALTER TABLE payidem."order" DISABLE TRIGGER status_guard;
	END IF;
	IF v = 'plpgsql' THEN
		CREATE CONSTRAINT TRIGGER bench_plpgsql_guard
			AFTER INSERT OR UPDATE ON payidem."order"
			FOR EACH ROW EXECUTE FUNCTION bench_plpgsql_guard('order');
	END IF;
	RETURN v;
END $$;

-- bench_cpu_ns(): CPU time this backend has used so far, in nanoseconds
-- (Linux: the first field of /proc/self/schedstat), which other load on the
-- machine disturbs much less than wall time.  The kernel brings a running
-- task's count up to date only at a timer tick or a context switch: a 1 ms
-- sleep first makes the reading exact instead of up to a tick old.
CREATE OR REPLACE FUNCTION bench_cpu_ns() RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.001);
	RETURN split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint;
END $$;

-- bench_loop(workload, first, n): n single-row pending -> paid transitions,
-- one statement each, orders first .. first + n - 1
CREATE OR REPLACE FUNCTION bench_loop(workload text, first int, n int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	k text;
BEGIN
	FOR i IN first..first + n - 1 LOOP
		k := payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, i);
		IF workload = 'transit' THEN
			PERFORM payidem.transit_order(k, 'paid');
		ELSIF workload = 'plain_cte' THEN
			WITH u AS (UPDATE payidem."order" o SET status = 'paid', paid_at = now(), updated_at = now()
			            WHERE o.order_no = k AND o.status = 'pending'
			           RETURNING o.order_no)
			INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
			SELECT 'order', order_no, 'pending', 'paid' FROM u;
		ELSE
			UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now()
			 WHERE order_no = k;
		END IF;
	END LOOP;
END $$;
