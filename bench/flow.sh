#!/usr/bin/env bash
# Benchmark: payidem.apply_payment_result() end to end against a reference
# handler written the seed 002 way (advisory lock + SELECT ... FOR UPDATE +
# state check in code + idempotency-row insert + payment and order updates +
# status-history inserts, in PL/pgSQL on tables of the same shape), and the
# ceiling of the machine: one small row inserted per commit.
#
# Each pgbench transaction is one delivery of a success result: with DUPS=0%
# always the first delivery for a new pending payment; with 80% mostly a
# repeat for one of 1,000 already-paid payments.  pgbench -M prepared,
# CLIENTS clients, synchronous_commit on and off, fsync on.
#
# Starts its own throwaway cluster and stops it on exit; prints a Markdown
# report and writes it to bench/out/flow.md.
#
#   SECONDS_PER_RUN (5)  CLIENTS ("1 8 32")  DUPS ("0 80")  SYNC ("on off")
#   POOL (450000 pending payments per variant)  SKIP_BUILD=1
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CLIENTS=${CLIENTS:-"1 8 32"}
DUPS=${DUPS:-"0 80"}
SYNC=${SYNC:-"on off"}
POOL=${POOL:-450000}

set_pg_paths
[ "${SKIP_BUILD:-}" = 1 ] || build_and_install
RUN=$(make_run_dir bench-flow)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55760} cluster_start "$RUN" "fsync = on" "full_page_writes = on" "max_connections = 100"
mkdir -p bench/out
OUT=bench/out/flow.md
DB=bench_flow

say "set-up: $POOL pending payments per variant"
psql -X -q -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -v pool="$POOL" -d "$DB" -f bench/flow_setup.sql >/dev/null

# run_point VARIANT DUP CLIENTS SYNC -> tps
run_point() {
	local variant=$1 dup=$2 clients=$3 sync=$4 log
	log=$RUN/pgbench-$variant-$dup-$clients-$sync.log
	psql -X -q -d "$DB" -c CHECKPOINT
	PGOPTIONS="-c synchronous_commit=$sync" \
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$(( clients < 4 ? clients : 4 ))" -T "$SECONDS_PER_RUN" \
		-D dup="$dup" -f "bench/flow_${variant}.sql" "$DB" >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $variant $dup $clients $sync"; }
	grep -q 'number of failed transactions: 0 ' "$log" \
		|| { cat "$log" >&2; die "pgbench reported failed transactions: $variant $dup $clients $sync"; }
	sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1
}

declare -A TPS
for sync in $SYNC; do
	for clients in $CLIENTS; do
		say "synchronous_commit=$sync clients=$clients: ceiling"
		TPS[ceiling,0,$clients,$sync]=$(run_point ceiling 0 "$clients" "$sync")
		for dup in $DUPS; do
			for variant in payidem ref; do
				say "synchronous_commit=$sync clients=$clients duplicates=$dup%: $variant"
				TPS[$variant,$dup,$clients,$sync]=$(run_point "$variant" "$dup" "$clients" "$sync")
			done
		done
	done
done

# the outcomes really were what the workload says
CHECK=$(psql -X -At -d "$DB" -c "
	SELECT (SELECT count(*) FROM payidem.payment WHERE status = 'succeeded') - (SELECT last_value FROM bench.next_payidem),
	       (SELECT count(*) FROM bench.ref_payment WHERE status = 'succeeded') - (SELECT last_value FROM bench.next_ref),
	       (SELECT count(*) FROM payidem.anomaly)")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
int() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
{
	echo "### apply_payment_result() vs the seed-002 reference handler (tps, pgbench -M prepared, ${SECONDS_PER_RUN} s per point)"
	echo
	echo "$(nproc) CPUs, PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), fsync on."
	echo
	echo "| synchronous_commit | clients | duplicates | payidem | reference | payidem / reference | ceiling (1 insert/commit) | payidem / ceiling |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for sync in $SYNC; do
		for clients in $CLIENTS; do
			for dup in $DUPS; do
				p=${TPS[payidem,$dup,$clients,$sync]} r=${TPS[ref,$dup,$clients,$sync]} c=${TPS[ceiling,0,$clients,$sync]}
				echo "| $sync | $clients | $dup% | $(int "$p") | $(int "$r") | $(ratio "$p" "$r") | $(int "$c") | $(ratio "$p" "$c") |"
			done
		done
	done
	echo
	echo "Check (succeeded payments minus first deliveries, payidem | reference | anomalies): $CHECK (expect 0|0|0)."
} | tee "$OUT"
