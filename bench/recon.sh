#!/usr/bin/env bash
# Benchmark of reconciliation (a benchmark, never a timed test).
#
#   N paid payments of one channel on one day and the channel's bill of that
#   day (N lines) with differences of every kind, 5 every PERIOD payments
#   (bench/recon_setup.sql; 5000: the 0.1 % of the target):
#   1. import: COPY of the N-line bill file into payidem.channel_bill;
#   2. payidem.reconcile(): the first run of the day (stores the differences,
#      raises the channel_only anomalies; RUNS times, the day cleared before
#      each) and re-runs (keep/replace rule; RUNS times), medians;
#   3. the obvious FULL JOIN written by hand, differences into a table
#      (bench/recon_baseline.sql): the floor, median of 2 x RUNS runs, one
#      right after each run of reconcile() (alternating, so that a slow spell
#      of this shared machine does not fall on one side only; one warm-up run
#      first, not counted);
#   4. payidem.load_bill() of LOAD_N lines given as one CSV text;
#   5. the plan reconcile() used (auto_explain): the day must go through one
#      hash full join.
# The counts reconcile() returns, the differences it stores, its anomalies and
# the floor's rows are checked against what the data set holds; a mismatch
# fails the run.
#
# Starts its own throwaway cluster (fsync on, port PAYIDEM_PORT or 55850) and
# stops it on exit.  Writes bench/out/recon.md (tables), recon.tsv (the bar
# chart: series<TAB>1<TAB>milliseconds) and recon.targets.
#
#   N (1000000)  PERIOD (5000)  LOAD_N (200000)  RUNS (5)  WORK_MEM (64MB)  SKIP_BUILD=1
#   QUICK=1: N 100000, LOAD_N 20000, RUNS 1
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

if [ "${QUICK:-}" = 1 ]; then
	N=${N:-100000} LOAD_N=${LOAD_N:-20000} RUNS=${RUNS:-1}
fi
N=${N:-1000000}
LOAD_N=${LOAD_N:-200000}
RUNS=${RUNS:-5}
PERIOD=${PERIOD:-5000}
WORK_MEM=${WORK_MEM:-64MB}

set_pg_paths
bench_build
RUN=$(make_run_dir bench-recon)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55850} cluster_start "$RUN" "fsync = on" "shared_buffers = 256MB" "max_wal_size = 4GB"
mkdir -p bench/out
OUT=bench/out/recon
rm -f "$OUT.md" "$OUT.tsv" "$OUT.targets"
DB=bench_recon
psql -X -q -d postgres -c "CREATE DATABASE $DB"

ms_of() { sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1; }
sqlrun() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
# pct K -> K / PERIOD as a percentage
pct() { awk -v k="$1" -v p="$PERIOD" 'BEGIN { printf "%g %%", 100 * k / p }'; }
thousands() { sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$1"; }

# what the data set holds (bench/recon_setup.sql): payments i = 1 .. N with
# i % PERIOD = 1 missing from the bill, 2 amount off, 3 and 5 status off;
# N / PERIOD bill lines without a payment
of_period() { [ "$N" -ge "$1" ] && echo $(((N - $1) / PERIOD + 1)) || echo 0; }
X_PLATFORM=$(of_period 1) X_AMOUNT=$(of_period 2) X_STATUS=$(($(of_period 3) + $(of_period 5))) X_CHANNEL=$((N / PERIOD))
X_MATCHED=$((N - X_PLATFORM - X_AMOUNT - X_STATUS))
X_DIFFS=$((X_PLATFORM + X_AMOUNT + X_STATUS + X_CHANNEL))
EXPECT="$X_MATCHED|$X_PLATFORM|$X_CHANNEL|$X_AMOUNT|$X_STATUS"

say "set-up: $N payments and a $N-line bill file"
t0=$(date +%s)
sqlrun -v n="$N" -v period="$PERIOD" -v billfile="$RUN/bill.csv" -f bench/recon_setup.sql >/dev/null
say "set-up took $(($(date +%s) - t0)) s"

# ---------------------------------------------------------------- 1. COPY
COPY_MS=$(printf '%s\n' '\timing on' \
	"COPY payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at) FROM '$RUN/bill.csv' WITH (FORMAT csv);" \
	| sqlrun | ms_of)
BILL_LINES=$(sqlrun -At -c "SELECT count(*) FROM payidem.channel_bill")
sqlrun -c "VACUUM ANALYZE payidem.channel_bill" >/dev/null
say "COPY of $BILL_LINES lines: $COPY_MS ms"

# ---------------------------------------------------------------- 2. and 3.
# RUNS rounds of: a first run of reconcile() on a day cleared of its
# differences, the floor, a re-run, the floor again -- alternating, so that a
# slow spell of the machine falls on both sides alike; medians of each
reconcile_once() {
	local out counts
	out=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" '\timing on' '\pset format unaligned' '\pset tuples_only on' \
		"SELECT * FROM payidem.reconcile('BENCH_WX', '2024-05-01');" | sqlrun)
	counts=$(echo "$out" | grep '^RC-' | head -1)
	[ "${counts#*|}" = "$EXPECT" ] \
		|| die "reconcile() returned '$counts', expected '<batch>|$EXPECT' (matched|platform_only|channel_only|amount_mismatch|status_mismatch)"
	echo "$(echo "$out" | ms_of) $counts"
}
# the floor: bench/recon_baseline.sql, the differences into a table
floor_once() {
	local out rows
	out=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" '\timing on' '\i bench/recon_baseline.sql' '\timing off' \
		'SELECT count(*) FROM baseline_diffs;' | sqlrun -At)
	rows=$(echo "$out" | tail -1)
	[ "$rows" = "$X_DIFFS" ] || die "the FULL JOIN found $rows differences, expected $X_DIFFS"
	echo "$out" | ms_of
}
# the day as if never reconciled: its differences, batches and channel_only
# anomalies deleted (outside the timing)
clear_day() {
	sqlrun -c "SET session_replication_role = replica" -c "DELETE FROM payidem.anomaly WHERE kind = 'channel_only'" \
		-c "DELETE FROM payidem.reconciliation" -c "DELETE FROM payidem.recon_batch" >/dev/null
}
floor_once >/dev/null	# warm-up, not counted: both sides start from the same cache
: >"$RUN/first"
: >"$RUN/rerun"
: >"$RUN/base"
# reconcile_then_floor KIND ROUND: one run of reconcile() into $RUN/KIND
# (first or rerun), then one of the floor into $RUN/base
reconcile_then_floor() {
	local ms
	read -r ms COUNTS <<<"$(reconcile_once)"
	echo "$ms" >>"$RUN/$1"
	say "reconcile(), $1 $2/$RUNS: $ms ms ($COUNTS)"
	ms=$(floor_once)
	echo "$ms" >>"$RUN/base"
	say "FULL JOIN: $ms ms"
}
for ((r = 1; r <= RUNS; r++)); do
	clear_day
	reconcile_then_floor first "$r"
	reconcile_then_floor rerun "$r"
done
FIRST_MS=$(median <"$RUN/first")
RERUN_MS=$(median <"$RUN/rerun")
BASE_MS=$(median <"$RUN/base")
BASE_ROWS=$X_DIFFS
DIFFS=$(sqlrun -At -c "SELECT count(*) FROM payidem.reconciliation")
ANOMALIES=$(sqlrun -At -c "SELECT count(*) FROM payidem.anomaly WHERE kind = 'channel_only'")
[ "$DIFFS" = "$X_DIFFS" ] || die "reconcile() stored $DIFFS differences, expected $X_DIFFS"
[ "$ANOMALIES" = "$X_CHANNEL" ] || die "reconcile() raised $ANOMALIES channel_only anomalies, expected $X_CHANNEL"

# ---------------------------------------------------------------- 4. load_bill
LOAD_MS=$(printf '%s\n' "SET work_mem = '$WORK_MEM';" \
	"CREATE TEMP TABLE csvtext AS SELECT string_agg(format('BENCH_WX,2024-05-02,L%s,,%s,1,succeeded,2024-05-02 10:00:00', i, 1000 + i % 5000), E'\\n') AS csv FROM generate_series(1, $LOAD_N) i;" \
	'\timing on' "SELECT payidem.load_bill('BENCH_WX', '2024-05-02', csv) FROM csvtext;" | sqlrun | ms_of)
say "load_bill of $LOAD_N lines: $LOAD_MS ms"

# ---------------------------------------------------------------- 5. the plan
printf '%s\n' "SET work_mem = '$WORK_MEM';" "LOAD 'auto_explain';" \
	"SET auto_explain.log_min_duration = 0;" "SET auto_explain.log_nested_statements = on;" \
	"SET auto_explain.log_level = 'warning';" \
	"SELECT * FROM payidem.reconcile('BENCH_WX', '2024-05-01');" | sqlrun >/dev/null 2>&1
PLAN=$(awk '/Query Text: SELECT count\(\*\)/ {on=1; next}
	on && /^[0-9][0-9][0-9][0-9]-/ {exit}
	on && /^\t *(Aggregate|->|Hash Cond|Index Cond)/' "$RUN/server.log" \
	| sed -E 's/^\t//; s/  \(cost=[^)]*\)//' | head -12 || true)
grep -q 'Hash Full Join' <<<"$PLAN" || die "reconcile() did not join the day with a hash full join: ${PLAN:-no plan in the server log}"

FIRST_X=$(ratio "$FIRST_MS" "$BASE_MS") RERUN_X=$(ratio "$RERUN_MS" "$BASE_MS")
PGVER=$("$PGBIN/postgres" --version | awk '{print $3}')
{
	echo "$(date -u +%Y-%m-%d), $(nproc) CPUs, PostgreSQL $PGVER, fsync on, shared_buffers 256MB, work_mem $WORK_MEM;"
	echo "one channel, one day: $(thousands "$N") paid payments, a bill of $(thousands "$BILL_LINES") lines; differences:"
	echo "$(pct 1) platform_only, $(pct 1) amount_mismatch, $(pct 2) status_mismatch (both directions), $(pct 1) channel_only ($(pct 5) in all)."
	echo "First runs (the day cleared before each) and re-runs: median of $RUNS each; the FULL JOIN: median of $((2 * RUNS)), alternating with them; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| step | time (ms) |"
	echo "|---|---:|"
	echo "| COPY of the $(thousands "$BILL_LINES")-line bill file | $COPY_MS |"
	echo "| reconcile(), first run (stores $DIFFS differences, $ANOMALIES anomalies) | $FIRST_MS |"
	echo "| reconcile(), re-run (keeps the same rows) | $RERUN_MS |"
	echo "| the FULL JOIN floor, into a table ($BASE_ROWS rows) | $BASE_MS |"
	echo "| load_bill() of $(thousands "$LOAD_N") lines as one CSV text | $LOAD_MS |"
	echo
	echo "reconcile() returned: \`$COUNTS\` (batch|matched|platform_only|channel_only|amount_mismatch|status_mismatch), as the data set says."
	echo
	echo "reconcile() / FULL JOIN floor: first run ${FIRST_X}×, re-run ${RERUN_X}× (target ≤ 1.2×)."
	echo
	echo "Plan of the day's join inside reconcile() (auto_explain):"
	echo
	echo '```'
	echo "$PLAN"
	echo '```'
} | tee "$OUT.md"

# the bar chart: milliseconds
{
	printf 'reconcile() first run\t1\t%.0f\n' "$FIRST_MS"
	printf 'reconcile() re-run\t1\t%.0f\n' "$RERUN_MS"
	printf 'FULL JOIN floor\t1\t%.0f\n' "$BASE_MS"
} >"$OUT.tsv"

MEASURED="first run ${FIRST_X}×, re-run ${RERUN_X}×"
[ "$N" -eq 1000000 ] || MEASURED+=" (at $(thousands "$N") rows)"
[ "$PERIOD" -eq 5000 ] || MEASURED+=" (with $(pct 5) differences)"
MET=$(awk -v a="$FIRST_X" -v b="$RERUN_X" 'BEGIN {print (a <= 1.2 && b <= 1.2) ? "yes" : "no"}')
printf '%s\t%s\t%s\n' "reconcile() ≤ 1.2× the FULL JOIN floor (1,000,000 rows, 0.1 % differences)" "$MEASURED" "$MET" >"$OUT.targets"
say "written: $OUT.md, $OUT.tsv, $OUT.targets"
