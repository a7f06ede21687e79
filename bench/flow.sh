#!/usr/bin/env bash
# Benchmark: payidem.apply_payment_result() end to end against a reference
# handler written the seed 002 way (advisory lock + SELECT ... FOR UPDATE +
# state check in code + idempotency-row insert + payment and order updates +
# status-history inserts, in PL/pgSQL on tables with the same columns), the
# same handler on copies of payidem's own tables (every CHECK, index and
# foreign key; none of payidem's triggers: "ref_same"), and the ceiling of the
# machine in the same cluster: one small row inserted per commit
# (bench/flow_ceiling.sql).
#
# Each pgbench transaction is one delivery of a success result: with DUPS=0%
# always the first delivery for a new pending payment; with 80% mostly a
# repeat for one of 1,000 already-paid payments.  pgbench -M prepared,
# CLIENTS clients (-j at most 4), synchronous_commit on and off, fsync on.
# Every point runs RUNS times, round-robin over all points (so that a slow
# spell of the machine does not fall on one point only); the median counts.
#
# First deliveries use up pending payments: each variant has its own pool
# (POOL for payidem, REF_POOL for the reference, REF_SAME_POOL for the
# reference on payidem's tables, made at set-up).  Before each
# run the pool is topped up if need be, outside the timed run, from what the
# runs have used so far (see top_up), so that the pools follow the speed of
# the machine; a run that finds its pool empty does not count, and the point
# runs again.  The check at the end (every first delivery paid exactly one
# payment, no anomaly) fails the run if it does not hold.
#
# Starts its own throwaway cluster and stops it on exit; writes
# bench/out/flow.md (tables), flow.tsv (chart: payidem, reference and ceiling
# for the first DUPS value, by clients) and flow.targets.  If
# bench/out/ceiling.env exists, payidem's synchronous_commit=on throughput is
# also given as a fraction of the machine ceiling measured there.
#
#   SECONDS_PER_RUN (2)  RUNS (3)  CLIENTS ("1 8 32")  DUPS ("0 80")
#   SYNC ("on off")  POOL (20000)  REF_POOL (60000)  REF_SAME_POOL (20000)
#   SKIP_BUILD=1
#   QUICK=1: RUNS 1, 1 s per point, CLIENTS "1 8", DUPS "0" (the points the
#   targets and the chart need, within the time of a quick run), POOL 4000,
#   REF_POOL 10000, REF_SAME_POOL 4000
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

if [ "${QUICK:-}" = 1 ]; then
	SECONDS_PER_RUN=${SECONDS_PER_RUN:-1} RUNS=${RUNS:-1} CLIENTS=${CLIENTS:-"1 8"} DUPS=${DUPS:-0}
	POOL=${POOL:-4000} REF_POOL=${REF_POOL:-10000} REF_SAME_POOL=${REF_SAME_POOL:-4000}
fi
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
RUNS=${RUNS:-3}
CLIENTS=${CLIENTS:-"1 8 32"}
DUPS=${DUPS:-"0 80"}
SYNC=${SYNC:-"on off"}
POOL=${POOL:-20000}
REF_POOL=${REF_POOL:-60000}
REF_SAME_POOL=${REF_SAME_POOL:-20000}

set_pg_paths
bench_build
RUN=$(make_run_dir bench-flow)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55760} cluster_start "$RUN" "fsync = on" "full_page_writes = on" "max_connections = 100"
mkdir -p bench/out
OUT=bench/out/flow
rm -f "$OUT.md" "$OUT.tsv" "$OUT.targets"
DB=bench_flow
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

say "set-up: $POOL pending payments for payidem, $REF_POOL for the reference, $REF_SAME_POOL for it on payidem's tables"
psql -X -q -d postgres -c "CREATE DATABASE $DB"
sql -v pool="$POOL" -v ref_pool="$REF_POOL" -v ref_same_pool="$REF_SAME_POOL" -f bench/flow_setup.sql >/dev/null

# pools: MADE[variant] = pending payments made (with the 1,000 paid ones),
# USED[variant] = taken so far (the sequence changes only while that variant
# runs), MOST[variant] = the most one run has used, USE[variant,point] = what
# the last run of that point used, LOST[variant] = numbers taken past the end
# of the pool (by a run that found it empty)
declare -A MADE USED MOST USE LOST
MADE[payidem]=$((POOL + 1000)) USED[payidem]=1000 MOST[payidem]=0 LOST[payidem]=0
MADE[ref]=$((REF_POOL + 1000)) USED[ref]=1000 MOST[ref]=0 LOST[ref]=0
MADE[ref_same]=$((REF_SAME_POOL + 1000)) USED[ref_same]=1000 MOST[ref_same]=0 LOST[ref_same]=0
used() { sql -c "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM bench.next_$1"; }
# top_up VARIANT POINT: before a run, leave twice what the point used last
# time (and at least the most any run has used), or the first time three
# times the most any run has used (and at least half the initial pool); add a
# run's worth more, so that the next run seldom needs another top-up
top_up() {
	local v=$1 point=$2 left need initial=$POOL
	[ "$v" != ref ] || initial=$REF_POOL
	[ "$v" != ref_same ] || initial=$REF_SAME_POOL
	left=$((MADE[$v] - USED[$v]))
	if [ -n "${USE[$v,$point]:-}" ]; then
		need=$((2 * USE[$v,$point] + 100)); [ "$need" -ge "${MOST[$v]}" ] || need=${MOST[$v]}
	else
		need=$((3 * MOST[$v])); [ "$need" -ge $((initial / 2)) ] || need=$((initial / 2))
	fi
	[ "$left" -lt "$need" ] || return 0
	say "pool of $v: $left left, adding $((need - left + MOST[$v]))"
	sql -c "SELECT bench.refill_$v($((need - left + MOST[$v])))" >/dev/null
	MADE[$v]=$((MADE[$v] + need - left + MOST[$v]))
}

# run_point VARIANT DUP CLIENTS SYNC -> tps; exit status 3 if the pool ran out
run_point() {
	local variant=$1 dup=$2 clients=$3 sync=$4 log
	log=$RUN/pgbench-$variant-$dup-$clients-$sync.log
	sql -c CHECKPOINT
	if ! PGOPTIONS="-c synchronous_commit=$sync" \
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$((clients < 4 ? clients : 4))" -T "$SECONDS_PER_RUN" \
		-D dup="$dup" -f "bench/flow_${variant}.sql" "$DB" >"$log" 2>&1; then
		grep -q 'bench pool exhausted' "$log" && return 3
		cat "$log" >&2
		die "pgbench failed: $variant $dup $clients $sync"
	fi
	grep -q 'number of failed transactions: 0 ' "$log" \
		|| { cat "$log" >&2; die "pgbench reported failed transactions: $variant $dup $clients $sync"; }
	sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1
}

# measure VARIANT DUP CLIENTS SYNC: one run of a point into TPS; a run that
# found its pool empty (the machine was faster than the last runs said) does
# not count: the pool gets twice what it used and the point runs again
declare -A TPS
measure() {
	local v=$1 dup=$2 clients=$3 sync=$4 point="$2,$3,$4" tps n rc
	for _ in 1 2 3; do
		top_up "$v" "$point"
		rc=0
		tps=$(run_point "$v" "$dup" "$clients" "$sync") || rc=$?
		n=$(($(used "$v") - USED[$v]))
		USED[$v]=$((USED[$v] + n)) USE[$v,$point]=$((2 * n))
		[ "$n" -le "${MOST[$v]}" ] || MOST[$v]=$n
		[ "$rc" -eq 3 ] || break
		say "pool of $v ran out after $n; running the point again"
		LOST[$v]=$((LOST[$v] + USED[$v] - MADE[$v]))
	done
	[ "$rc" -eq 0 ] || die "pgbench failed: $v $dup $clients $sync"
	USE[$v,$point]=$n
	TPS[$v,$point]+=" $tps"
}

# TPS[variant,dup,clients,sync] = the tps of every run, space-separated
for ((r = 1; r <= RUNS; r++)); do
	for sync in $SYNC; do
		for clients in $CLIENTS; do
			say "run $r/$RUNS, synchronous_commit=$sync, $clients client(s): ceiling"
			TPS[ceiling,0,$clients,$sync]+=" $(run_point ceiling 0 "$clients" "$sync")"
			for dup in $DUPS; do
				for variant in payidem ref ref_same; do
					say "run $r/$RUNS, synchronous_commit=$sync, $clients client(s), $dup% duplicates: $variant"
					measure "$variant" "$dup" "$clients" "$sync"
				done
			done
		done
	done
done

# the outcomes really were what the workload says: every first delivery paid
# exactly one payment, no anomaly
CHECK=$(sql -c "
	SELECT (SELECT count(*) FROM payidem.payment WHERE status = 'succeeded') - $((USED[payidem] - LOST[payidem])),
	       (SELECT count(*) FROM bench.ref_payment WHERE status = 'succeeded') - $((USED[ref] - LOST[ref])),
	       (SELECT count(*) FROM bench.same_payment WHERE status = 'succeeded') - $((USED[ref_same] - LOST[ref_same])),
	       (SELECT count(*) FROM payidem.anomaly)")
[ "$CHECK" = "0|0|0|0" ] \
	|| die "check failed: succeeded payments minus first deliveries (payidem|reference|reference on payidem's tables) and anomalies are $CHECK, not 0|0|0|0"

med() { median <<<"${TPS[$1]}"; }
int() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
# range LIST -> "min–max×" (or "x×" when they are equal)
range() { tr ' ' '\n' | grep . | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf (lo == hi) ? "%s×" : "%s–%s×", lo, hi}'; }

has_sync() { [[ " $SYNC " == *" $1 "* ]]; }
# the ratios behind the targets
OFF_RATIOS="" ON_RATIOS="" SAME_RATIOS=""
for clients in $CLIENTS; do
	for dup in $DUPS; do
		if has_sync off; then
			OFF_RATIOS+=" $(ratio "$(med "payidem,$dup,$clients,off")" "$(med "ref,$dup,$clients,off")")"
			SAME_RATIOS+=" $(ratio "$(med "payidem,$dup,$clients,off")" "$(med "ref_same,$dup,$clients,off")")"
		fi
		if has_sync on; then
			ON_RATIOS+=" $(ratio "$(med "payidem,$dup,$clients,on")" "$(med "ceiling,0,$clients,on")")"
		fi
	done
done
PGVER=$("$PGBIN/postgres" --version | awk '{print $3}')
SETTINGS=$(sql -c "SELECT string_agg(name || ' ' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('fsync', 'full_page_writes', 'shared_buffers')")
{
	echo "$(date -u +%Y-%m-%d), $(nproc) CPUs, PostgreSQL $PGVER ($SETTINGS); pgbench -M prepared,"
	echo "median of $RUNS run(s) of ${SECONDS_PER_RUN} s per point; tps."
	echo
	echo "| synchronous_commit | clients | duplicates | payidem | reference | payidem / reference | reference on payidem's tables | payidem / that | ceiling (1 insert/commit) | payidem / ceiling |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for sync in $SYNC; do
		for clients in $CLIENTS; do
			for dup in $DUPS; do
				p=$(med "payidem,$dup,$clients,$sync") r=$(med "ref,$dup,$clients,$sync") c=$(med "ceiling,0,$clients,$sync")
				t=$(med "ref_same,$dup,$clients,$sync")
				echo "| $sync | $clients | $dup% | $(int "$p") | $(int "$r") | $(ratio "$p" "$r") | $(int "$t") | $(ratio "$p" "$t") | $(int "$c") | $(ratio "$p" "$c") |"
			done
		done
	done
	echo
	echo "Checked after the runs: every first delivery paid exactly one payment (payidem and both references), no anomaly."
	if [ -n "$OFF_RATIOS" ]; then
		echo
		echo "payidem / reference with synchronous_commit off: $(range <<<"$OFF_RATIOS") (reported; #7's target of ≥ 1.3× is superseded)."
		echo
		echo "payidem / the reference on payidem's tables with synchronous_commit off: $(range <<<"$SAME_RATIOS")."
	fi
	if [ -n "$ON_RATIOS" ]; then
		echo
		echo "payidem / ceiling with synchronous_commit on: $(range <<<"$ON_RATIOS") (target ≥ 0.9×)."
	fi
	if [ -f bench/out/ceiling.env ] && has_sync on; then
		line=""
		for clients in $CLIENTS; do
			c=$(sed -n "s/^CEILING_TPS_$clients=\([0-9.]*\).*/\1/p" bench/out/ceiling.env | tail -1)
			[ -n "$c" ] || continue
			sep=" "
			line+="${line:+; }$clients client(s):"
			for dup in $DUPS; do
				line+="$sep$(ratio "$(med "payidem,$dup,$clients,on")" "$c") at $dup% duplicates" sep=", "
			done
		done
		if [ -n "$line" ]; then
			echo
			echo "payidem with synchronous_commit on as a fraction of the machine ceiling (bench/out/ceiling.env): $line."
		fi
	fi
} | tee "$OUT.md"

# the chart: the first DUPS value (first deliveries by default) and the ceiling
dup=${DUPS%% *}
for sync in $SYNC; do
	for series in "payidem payidem, sync $sync, $dup% dup" "ref reference, sync $sync, $dup% dup" \
		"ref_same reference on payidem's tables, sync $sync, $dup% dup" "ceiling ceiling, sync $sync"; do
		variant=${series%% *} d=$dup
		[ "$variant" != ceiling ] || d=0
		for clients in $CLIENTS; do
			printf '%s\t%s\t%s\n' "${series#* }" "$clients" "$(int "$(med "$variant,$d,$clients,$sync")")"
		done
	done
done >"$OUT.tsv"

# Reported, not gated: issue #7's throughput targets are superseded by the
# per-delivery targets of bench/instructions.sh (instructions and backend CPU
# against the reference handler, in the same run), which this noisy machine can
# measure; the commit-on ceiling is CPU-bound here (its disk flushes in ~0.1 ms).
{
	if [ -n "$OFF_RATIOS" ]; then
		printf '%s\t%s\t%s\n' "apply_payment_result() / the reference handler (seed 002's with payidem's guarantees), throughput with synchronous_commit off (reported; the targets are per delivery, see instructions)" \
			"$(range <<<"$OFF_RATIOS")" n/a
		printf '%s\t%s\t%s\n' "the same, against the reference handler on payidem's own tables" \
			"$(range <<<"$SAME_RATIOS")" n/a
	fi
	if [ -n "$ON_RATIOS" ]; then
		printf '%s\t%s\t%s\n' "apply_payment_result() / the one-insert-per-commit ceiling with synchronous_commit on (reported)" \
			"$(range <<<"$ON_RATIOS")" n/a
	fi
} >"$OUT.targets"
say "written: $OUT.md, $OUT.tsv, $OUT.targets"
