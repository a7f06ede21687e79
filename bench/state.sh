#!/usr/bin/env bash
# Benchmark of the state-machine guard (a benchmark, never a timed test).
#
#   1. bulk: UPDATE of 200,000 orders pending -> paid in one statement, with
#      no guard, with the C constraint trigger payidem.status_guard(), and with
#      the same logic as a PL/pgSQL constraint trigger (bench/state_plpgsql.sql);
#      median of RUNS runs; overhead = time - no-guard time.
#   2. the same single-row workloads as 3., LOOP_N of them in one backend and
#      one transaction, costed in backend CPU time (/proc/<pid>/stat) — the
#      measure least disturbed by other load on the machine;
#   3. pgbench -M prepared, CLIENTS clients, SECONDS each: single-row UPDATEs
#      under the same three variants, and transit_order() against the same
#      work done as plain SQL by a client with no trigger (conditional UPDATE
#      + status_log INSERT, as one statement and as a 4-statement transaction).
#
# Starts its own throwaway cluster (fsync on) on port 55800; needs payidem
# installed (make install).  Prints a Markdown report and writes it to
# bench/out/state.md.
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ROWS=${ROWS:-200000}
LOOP_N=${LOOP_N:-20000}
PGB_ROWS=${PGB_ROWS:-300000}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-8}

set_pg_paths
RUN=$(make_run_dir bench-state)
PAYIDEM_PORT=55800 cluster_start "$RUN" "fsync = on"
trap cluster_stop EXIT
mkdir -p bench/out
OUT=bench/out/state.md
DB=bench_state
psql -X -q -d postgres -c "CREATE DATABASE $DB"

setup() {	# setup ROWS VARIANT
	psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -v rows="$1" -v variant="$2" -f bench/state_setup.sql >/dev/null
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# ---------------------------------------------------------------- bulk UPDATE
declare -A BULK BULKCPU
for variant in none c plpgsql; do : >"$RUN/bulk_$variant"; : >"$RUN/bulkcpu_$variant"; done
for r in $(seq 1 "$RUNS"); do
	for variant in none c plpgsql; do
		setup "$ROWS" "$variant"
		export CPU_FILE="$RUN/cpu"
		ms=$(psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/state_bulk.sql | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
		cpu=$(( ($(cat "$CPU_FILE.after") - $(cat "$CPU_FILE.before")) * 1000 / $(getconf CLK_TCK) ))
		logged=$(psql -X -qAt -d "$DB" -c "SELECT count(*) FROM payidem.status_log")
		echo "$ms" >>"$RUN/bulk_$variant"
		echo "$cpu" >>"$RUN/bulkcpu_$variant"
		say "bulk run $r $variant: $ms ms wall, $cpu ms backend CPU, $logged log rows"
	done
done
for variant in none c plpgsql; do
	BULK[$variant]=$(median <"$RUN/bulk_$variant")
	BULKCPU[$variant]=$(median <"$RUN/bulkcpu_$variant")
done

# ---------------------------------------------------------------- in-server loop
declare -A LOOPUS
for w in update_none update_c update_plpgsql transit plain_cte; do : >"$RUN/loop_$w"; done
for r in $(seq 1 "$RUNS"); do
	for w in update_none update_c update_plpgsql transit plain_cte; do
		case $w in update_none|plain_cte) v=none ;; update_plpgsql) v=plpgsql ;; *) v=c ;; esac
		setup "$LOOP_N" "$v"
		export CPU_FILE="$RUN/cpu"
		psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -v workload="$w" -v n="$LOOP_N" -f bench/state_loop.sql >/dev/null
		us=$(awk -v a="$(cat "$CPU_FILE.after")" -v b="$(cat "$CPU_FILE.before")" -v n="$LOOP_N" -v hz="$(getconf CLK_TCK)" \
			'BEGIN {printf "%.1f", (a - b) * 1000000 / hz / n}')
		echo "$us" >>"$RUN/loop_$w"
		say "loop run $r $w: $us µs CPU per transition"
	done
done
for w in update_none update_c update_plpgsql transit plain_cte; do LOOPUS[$w]=$(median <"$RUN/loop_$w"); done

# ---------------------------------------------------------------- pgbench
declare -A TPS
pgb() {	# pgb NAME VARIANT SCRIPT
	setup "$PGB_ROWS" "$2"
	local out tps moved
	out=$(pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_PER_RUN" -f "bench/$3" "$DB" 2>&1)
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p')
	moved=$(psql -X -qAt -d "$DB" -c "SELECT count(*) FROM payidem.\"order\" WHERE status = 'paid'")
	local issued
	issued=$(psql -X -qAt -d "$DB" -c "SELECT last_value FROM bench_seq")
	[ "$issued" -le "$PGB_ROWS" ] || echo "warning: $1 ran out of pending orders ($issued > $PGB_ROWS)" >&2
	TPS[$1]=$tps
	say "pgbench $1: $tps tps, $moved orders moved"
}
pgb update_none none state_update.sql
pgb update_c c state_update.sql
pgb update_plpgsql plpgsql state_update.sql
pgb transit c state_transit.sql
pgb plain_cte none state_plain_cte.sql
pgb plain_tx none state_plain_tx.sql

# ---------------------------------------------------------------- report
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
oc=$(awk -v c="${BULK[c]}" -v n="${BULK[none]}" 'BEGIN {printf "%.1f", c - n}')
op=$(awk -v p="${BULK[plpgsql]}" -v n="${BULK[none]}" 'BEGIN {printf "%.1f", p - n}')
cc=$(( BULKCPU[c] - BULKCPU[none] ))
cp=$(( BULKCPU[plpgsql] - BULKCPU[none] ))
# per-transaction latency overhead from pgbench (ms/tx at CLIENTS clients)
lat() { awk -v t="$1" -v c="$CLIENTS" 'BEGIN {printf "%.4f", c * 1000 / t}'; }
poc=$(awk -v a="$(lat "${TPS[update_c]}")" -v b="$(lat "${TPS[update_none]}")" 'BEGIN {printf "%.4f", a - b}')
pop=$(awk -v a="$(lat "${TPS[update_plpgsql]}")" -v b="$(lat "${TPS[update_none]}")" 'BEGIN {printf "%.4f", a - b}')
{
	echo "## State machines: guard overhead and transit_order() throughput"
	echo
	echo "PostgreSQL $(pg_config --version | awk '{print $2}'), $(nproc) CPUs, fsync on, full_page_writes off;"
	echo "bulk: $ROWS rows, median of $RUNS runs; pgbench: -M prepared, $CLIENTS clients, ${SECONDS_PER_RUN}s per run."
	echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine disturbs wall-clock numbers; CPU-time numbers much less)."
	echo
	echo "### Bulk UPDATE of $ROWS orders (pending -> paid, one statement)"
	echo
	echo "| guard | time (ms) | overhead vs no guard (ms) | per row (µs) |"
	echo "|---|---:|---:|---:|"
	echo "| none | ${BULK[none]} | — | — |"
	echo "| C constraint trigger (status_guard) | ${BULK[c]} | $oc | $(awk -v o="$oc" -v n="$ROWS" 'BEGIN {printf "%.2f", o * 1000 / n}') |"
	echo "| PL/pgSQL constraint trigger | ${BULK[plpgsql]} | $op | $(awk -v o="$op" -v n="$ROWS" 'BEGIN {printf "%.2f", o * 1000 / n}') |"
	echo
	echo "Backend CPU time (ms): none ${BULKCPU[none]}, C ${BULKCPU[c]}, PL/pgSQL ${BULKCPU[plpgsql]};"
	echo "overhead C $cc ms, PL/pgSQL $cp ms."
	echo
	echo "C overhead / PL/pgSQL overhead = **$(ratio "$oc" "$op")** by wall time, **$(ratio "$cc" "$cp")** by CPU time (target ≤ 0.60)."
	echo
	echo "### Single-row transitions, in-server CPU per transition ($LOOP_N in one backend, median of $RUNS)"
	echo
	echo "| workload | µs CPU |"
	echo "|---|---:|"
	echo "| UPDATE, no guard | ${LOOPUS[update_none]} |"
	echo "| UPDATE, C trigger | ${LOOPUS[update_c]} |"
	echo "| UPDATE, PL/pgSQL trigger | ${LOOPUS[update_plpgsql]} |"
	echo "| transit_order() | ${LOOPUS[transit]} |"
	echo "| plain SQL, no trigger: UPDATE + log INSERT in one statement | ${LOOPUS[plain_cte]} |"
	echo
	lc=$(awk -v a="${LOOPUS[update_c]}" -v b="${LOOPUS[update_none]}" 'BEGIN {printf "%.1f", a - b}')
	lp=$(awk -v a="${LOOPUS[update_plpgsql]}" -v b="${LOOPUS[update_none]}" 'BEGIN {printf "%.1f", a - b}')
	echo "Per-row overhead: C $lc µs, PL/pgSQL $lp µs (ratio **$(ratio "$lc" "$lp")**);"
	echo "plain SQL / transit_order() CPU = **$(ratio "${LOOPUS[plain_cte]}" "${LOOPUS[transit]}")** (transit_order() throughput relative to plain SQL, CPU-bound)."
	echo
	echo "### Single-row transitions, throughput (pgbench, wall clock)"
	echo
	echo "| workload | tps |"
	echo "|---|---:|"
	echo "| UPDATE, no guard | ${TPS[update_none]} |"
	echo "| UPDATE, C trigger | ${TPS[update_c]} |"
	echo "| UPDATE, PL/pgSQL trigger | ${TPS[update_plpgsql]} |"
	echo "| transit_order() (C, logs through the trigger) | ${TPS[transit]} |"
	echo "| plain SQL, no trigger: UPDATE + log INSERT in one statement (CTE) | ${TPS[plain_cte]} |"
	echo "| plain SQL, no trigger: BEGIN; UPDATE; INSERT; COMMIT | ${TPS[plain_tx]} |"
	echo
	echo "Single-row latency overhead per transaction: C $poc ms, PL/pgSQL $pop ms (ratio $(ratio "$poc" "$pop"); at this"
	echo "size a commit's WAL flush dominates, so the ratio is noisy)."
	echo
	echo "transit_order() / plain SQL in one statement = **$(ratio "${TPS[transit]}" "${TPS[plain_cte]}")**;"
	echo "transit_order() / plain SQL as a 4-statement transaction = **$(ratio "${TPS[transit]}" "${TPS[plain_tx]}")** (target ≥ 0.90)."
} | tee "$OUT"
