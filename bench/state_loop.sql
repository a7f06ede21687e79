-- bench/state_loop.sql — in-server CPU cost of one single-row transition:
-- psql -v workload=... -v n=N: N operations in one backend (one transaction,
-- so no commit flush), timing the backend's own CPU from /proc.
SELECT pg_backend_pid() AS pid \gset
\setenv BPID :pid
\! awk '{print $14+$15}' /proc/$BPID/stat > "$CPU_FILE.before"
SELECT bench_loop(:'workload', :n);
\! awk '{print $14+$15}' /proc/$BPID/stat > "$CPU_FILE.after"
