-- bench/state_loop.sql — in-server CPU cost of single-row transitions:
-- with psql variables tag, workload, variant (none|c|plpgsql), first and n
-- set, switches the variant's guard on and runs n operations on orders
-- first .. first + n - 1 in one statement (one transaction, so no commit
-- flush); prints the backend CPU time they took as "cpu_ns TAG NANOSECONDS".
-- bench/state.sh includes it many times in one session.
SELECT bench_variant(:'variant') \gset
SELECT bench_cpu_ns() AS cpu0 \gset
SELECT bench_loop(:'workload', :first, :n);
SELECT 'cpu_ns ' || :'tag' || ' ' || (bench_cpu_ns() - :cpu0);
