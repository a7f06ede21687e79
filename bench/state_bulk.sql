-- bench/state_bulk.sql — one UPDATE of every order pending -> paid; prints
-- its wall time (\timing) and records the backend's CPU ticks around it.
SELECT pg_backend_pid() AS pid \gset
\setenv BPID :pid
\! awk '{print $14+$15}' /proc/$BPID/stat > "$CPU_FILE.before"
\timing on
UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now();
\timing off
\! awk '{print $14+$15}' /proc/$BPID/stat > "$CPU_FILE.after"
