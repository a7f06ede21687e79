-- bench/state_bulk.sql — one UPDATE of every order pending -> paid; prints
-- its wall time (\timing) and the backend CPU time it took ("cpu_ns N").
SELECT bench_cpu_ns() AS cpu0 \gset
\timing on
UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now();
\timing off
SELECT 'cpu_ns ' || (bench_cpu_ns() - :cpu0);
