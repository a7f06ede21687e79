#!/usr/bin/env bash
# Benchmark of reconciliation (a benchmark, never a timed test).
#
#   N paid payments of one channel on one day and the channel's bill of that
#   day (N lines) with about 1 % differences of every kind (bench/recon_setup.sql):
#   1. import: COPY of the N-line bill file into payidem.channel_bill;
#   2. payidem.reconcile(): the first run (stores the differences, raises the
#      channel_only anomalies) and re-runs (keep/replace rule), RUNS runs;
#   3. the obvious FULL JOIN written by hand, differences into a table
#      (bench/recon_baseline.sql), RUNS runs;
#   4. payidem.load_bill() of LOAD_N lines given as one CSV text;
#   5. the plan reconcile() used (auto_explain): the day must go through one
#      hash full join.
#
# Starts its own throwaway cluster (fsync on) on port 55850; needs payidem
# installed (make install).  Prints a Markdown report and writes it to
# bench/out/recon.md.
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

N=${N:-1000000}
LOAD_N=${LOAD_N:-200000}
RUNS=${RUNS:-3}
WORK_MEM=${WORK_MEM:-64MB}

set_pg_paths
RUN=$(make_run_dir bench-recon)
PAYIDEM_PORT=55850 cluster_start "$RUN" "fsync = on" "shared_buffers = 256MB" "max_wal_size = 4GB"
trap cluster_stop EXIT
mkdir -p bench/out
OUT=bench/out/recon.md
DB=bench_recon
psql -X -q -d postgres -c "CREATE DATABASE $DB"

ms_of() { sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
sqlrun() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

say "setup: $N payments and a $N-line bill file"
t0=$(date +%s)
as_pg true
sqlrun -v n="$N" -v billfile="$RUN/bill.csv" -f bench/recon_setup.sql >/dev/null
say "setup took $(( $(date +%s) - t0 )) s"

# ---------------------------------------------------------------- 1. COPY
COPY_MS=$(printf '%s\n' '\timing on' \
	"COPY payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at) FROM '$RUN/bill.csv' WITH (FORMAT csv);" \
	| sqlrun | ms_of)
BILL_LINES=$(sqlrun -At -c "SELECT count(*) FROM payidem.channel_bill")
sqlrun -c "VACUUM ANALYZE payidem.channel_bill" >/dev/null
say "COPY of $BILL_LINES lines: $COPY_MS ms"

# ---------------------------------------------------------------- 2. reconcile
: >"$RUN/rerun"
for r in $(seq 1 "$RUNS"); do
	out=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" '\timing on' '\pset format unaligned' '\pset tuples_only on' \
		"SELECT * FROM payidem.reconcile('BENCH_WX', '2024-05-01');" | sqlrun)
	ms=$(echo "$out" | ms_of)
	counts=$(echo "$out" | grep '^RC-' | head -1)
	if [ "$r" -eq 1 ]; then FIRST_MS=$ms; COUNTS=$counts; else echo "$ms" >>"$RUN/rerun"; fi
	say "reconcile run $r: $ms ms ($counts)"
done
RERUN_MS=$(median <"$RUN/rerun")
DIFFS=$(sqlrun -At -c "SELECT count(*) FROM payidem.reconciliation")
ANOMALIES=$(sqlrun -At -c "SELECT count(*) FROM payidem.anomaly WHERE kind = 'channel_only'")

# ---------------------------------------------------------------- 3. baseline
: >"$RUN/base"
for r in $(seq 1 "$RUNS"); do
	ms=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" '\timing on' '\i bench/recon_baseline.sql' | sqlrun | ms_of)
	echo "$ms" >>"$RUN/base"
	say "baseline run $r: $ms ms"
done
BASE_MS=$(median <"$RUN/base")
BASE_ROWS=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" '\i bench/recon_baseline.sql' 'SELECT count(*) FROM baseline_diffs;' | sqlrun -At | tail -1)

# ---------------------------------------------------------------- 4. load_bill
LOAD_MS=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" \
	"CREATE TEMP TABLE csvtext AS SELECT string_agg(format('BENCH_WX,2024-05-02,L%s,,%s,1,succeeded,2024-05-02 10:00:00', i, 1000 + i % 5000), E'\\n') AS csv FROM generate_series(1, $LOAD_N) i;" \
	'\timing on' "SELECT payidem.load_bill('BENCH_WX', '2024-05-02', csv) FROM csvtext;" | sqlrun | ms_of)
say "load_bill of $LOAD_N lines: $LOAD_MS ms"

# ---------------------------------------------------------------- 5. the plan
printf '%s\n' "SET work_mem = '$WORK_MEM';" "LOAD 'auto_explain';" \
	"SET auto_explain.log_min_duration = 0;" "SET auto_explain.log_nested_statements = on;" \
	"SET auto_explain.log_level = 'warning';" \
	"SELECT * FROM payidem.reconcile('BENCH_WX', '2024-05-01');" | sqlrun >/dev/null  2>&1
PLAN=$(awk '/Query Text: SELECT count\(\*\) FILTER/ {on=1; next}
	on && /^[0-9][0-9][0-9][0-9]-/ {exit}
	on && /^\t *(Aggregate|->|Hash Cond|Index Cond)/' "$RUN/server.log" \
	| sed -E 's/^\t//; s/  \(cost=[^)]*\)//' | head -12 || true)
PGVER=$(psql -X -At -d "$DB" -c "SHOW server_version")
{
	echo "## Reconciliation: reconcile() at $N payments / bill lines"
	echo
	echo "PostgreSQL $PGVER, $(nproc) CPUs, fsync on, shared_buffers 256MB, work_mem $WORK_MEM;"
	echo "one channel, one day: $N paid payments, a bill of $BILL_LINES lines; differences:"
	echo "0.25 % platform_only, 0.25 % amount_mismatch, 0.5 % status_mismatch (both directions), 0.25 % channel_only."
	echo "Median of $((RUNS - 1)) re-runs; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| step | time (ms) |"
	echo "|---|---:|"
	echo "| COPY of the $BILL_LINES-line bill file | $COPY_MS |"
	echo "| reconcile(), first run (stores $DIFFS differences, $ANOMALIES anomalies) | $FIRST_MS |"
	echo "| reconcile(), re-run (keeps the same rows) | $RERUN_MS |"
	echo "| obvious FULL JOIN into a table ($BASE_ROWS rows), median of $RUNS | $BASE_MS |"
	echo "| load_bill() of $LOAD_N lines as one CSV text | $LOAD_MS |"
	echo
	echo "reconcile() returned: \`$COUNTS\` (batch|matched|platform_only|channel_only|amount_mismatch|status_mismatch)."
	echo
	echo "reconcile() / baseline: first run **$(awk -v a="$FIRST_MS" -v b="$BASE_MS" 'BEGIN {printf "%.2f", a / b}')**, re-run **$(awk -v a="$RERUN_MS" -v b="$BASE_MS" 'BEGIN {printf "%.2f", a / b}')**."
	echo
	echo "Plan of the day's join inside reconcile() (auto_explain):"
	echo
	echo '```'
	echo "$PLAN"
	echo '```'
} | tee "$OUT"
