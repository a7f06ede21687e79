#!/usr/bin/env bash
# Benchmark of the state-machine guard and transit_order() (a benchmark, never
# a timed test).
#
#   1. bulk: one UPDATE of ROWS orders pending -> paid, with no guard, with
#      the C constraint trigger payidem.status_guard(), and with the same
#      logic as a PL/pgSQL constraint trigger (bench/state_plpgsql.sql); wall
#      time and the backend's CPU time, median of RUNS; an overhead is the
#      median over the runs of the difference from the same run's no-guard
#      time;
#   2. single-row transitions in the server, LOOP_N per workload, in backend
#      CPU time (/proc/self/schedstat, the measure least disturbed by other
#      load on the machine): UPDATE under each guard, transit_order(), and the
#      same work as plain SQL with no trigger (conditional UPDATE + status_log
#      INSERT in one statement).  The five share one set-up and one session
#      per run and take turns in five slices, each slice one statement (one
#      transaction) on orders of its own; median of RUNS (plain SQL /
#      transit_order(): the median of each run's own ratio);
#   3. pgbench -M prepared, -j min(clients, 4), CLIENTS clients, median of
#      RUNS runs of SECONDS_PER_RUN each: the single-row UPDATE under the
#      three guards, and transit_order() against the same work done as plain
#      SQL by a client with no trigger (one statement with a CTE, and
#      BEGIN; UPDATE; INSERT; COMMIT).  Every run starts from fresh pending
#      orders: PGB_ROWS for the first run of a point, then twice as many as
#      its last run used (a run that uses them all up is repeated with twice
#      as many); the six workloads run one after the other, RUNS times.
#      CLIENTS is "8 32" rather than "1 8 32": every run needs fresh tables
#      (about half a second to set up) besides its seconds, and 54 runs would
#      take about three minutes by themselves on a 2-core machine, over this
#      runner's share of the default `make bench`.
#
# Every run is checked: the orders moved and the status_log rows written
# match the work done.  Starts its own throwaway cluster (fsync on,
# autovacuum off, port PAYIDEM_PORT or 55800) and stops it on exit.  Writes
#   bench/out/state.md       the tables of the run (also printed),
#   bench/out/state.tsv      series<TAB>clients<TAB>tps (the pgbench medians),
#   bench/out/state.targets  target<TAB>measured<TAB>yes|no.
#
#   RUNS (3)  ROWS (20000)  LOOP_N (5000)  PGB_ROWS (12000)
#   SECONDS_PER_RUN (2)  CLIENTS ("8 32")
#   QUICK=1 (1 run, 1 s per point, ROWS 10000, LOOP_N 2000, PGB_ROWS 8000)
#   SKIP_BUILD=1 to use the payidem already installed.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

RUNS=${RUNS:-3}
ROWS=${ROWS:-20000}
LOOP_N=${LOOP_N:-5000}
PGB_ROWS=${PGB_ROWS:-12000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
CLIENTS=${CLIENTS:-"8 32"}
if [ "${QUICK:-}" = 1 ]; then RUNS=1; SECONDS_PER_RUN=1; ROWS=10000; LOOP_N=2000; PGB_ROWS=8000; fi

set_pg_paths
bench_build
RUN=$(make_run_dir bench-state)
trap cluster_stop EXIT
# every run starts from freshly vacuumed tables and lasts seconds: autovacuum
# would only wake up at random points of them
PAYIDEM_PORT=${PAYIDEM_PORT:-55800} cluster_start "$RUN" "fsync = on" "autovacuum = off"
mkdir -p bench/out
OUT=bench/out/state.md
TSV=bench/out/state.tsv
TARGETS=bench/out/state.targets
rm -f "$OUT" "$TSV" "$TARGETS"
DB=bench_state
psql -X -q -d postgres -c "CREATE DATABASE $DB"

setup() {	# setup ROWS VARIANT
	psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -v rows="$1" -v variant="$2" -f bench/state_setup.sql >/dev/null
}


# check MOVED LOGGED WHAT: the orders now paid and the status_log rows
check() {
	local got moved logged
	got=$(psql -X -qAt -F ' ' -d "$DB" -c "SELECT (SELECT count(*) FROM payidem.\"order\" WHERE status = 'paid'),
		(SELECT count(*) FROM payidem.status_log)")
	read -r moved logged <<<"$got"
	[ "$moved" = "$1" ] && [ "$logged" = "$2" ] ||
		die "$3: $moved orders paid and $logged status_log rows, expected $1 and $2"
}

# ---------------------------------------------------------------- bulk UPDATE
say "bulk UPDATE of $ROWS orders, median of $RUNS"
declare -A BULK BULKCPU
for variant in none c plpgsql; do : >"$RUN/bulk_$variant"; : >"$RUN/bulkcpu_$variant"; done
for r in $(seq 1 "$RUNS"); do
	for variant in none c plpgsql; do
		setup "$ROWS" "$variant"
		out=$(psql -X -qAt -v ON_ERROR_STOP=1 -d "$DB" -f bench/state_bulk.sql) || die "bulk UPDATE failed: $variant"
		ms=$(sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' <<<"$out")
		cpu=$(sed -n 's/^cpu_ns \([0-9]*\)$/\1/p' <<<"$out" | awk '{printf "%.1f", $1 / 1000000}')
		[ -n "$ms" ] && [ -n "$cpu" ] || die "bulk UPDATE $variant: no timing in: $out"
		check "$ROWS" "$([ "$variant" = none ] && echo 0 || echo "$ROWS")" "bulk UPDATE $variant"
		echo "$ms" >>"$RUN/bulk_$variant"
		echo "$cpu" >>"$RUN/bulkcpu_$variant"
		say "bulk run $r $variant: $ms ms wall, $cpu ms backend CPU"
	done
done
for variant in none c plpgsql; do
	BULK[$variant]=$(median <"$RUN/bulk_$variant")
	BULKCPU[$variant]=$(median <"$RUN/bulkcpu_$variant")
done

# ---------------------------------------------------------------- in-server loop
# One set-up and one session per run: after an untimed slice of WARM_N each,
# the five workloads take turns in SLICES slices of LOOP_N/SLICES, each slice
# on the next orders with its guard switched on just before, so that a change
# of the machine's load during the run falls on all five alike.
SLICES=5
SLICE=$((LOOP_N / SLICES))
WARM_N=200
LOOPS=(update_none update_c update_plpgsql transit plain_cte)
say "single-row transitions in the server: $((SLICES * SLICE)) per workload and run, median of $RUNS"
declare -A LOOPUS
for w in "${LOOPS[@]}"; do : >"$RUN/loop_$w"; done
per_workload=$((WARM_N + SLICES * SLICE))
for r in $(seq 1 "$RUNS"); do
	setup $((per_workload * ${#LOOPS[@]})) none
	first=1
	{
		echo "SET client_min_messages = warning;"
		for ((s = 0; s <= SLICES; s++)); do
			for ((j = 0; j < ${#LOOPS[@]}; j++)); do
				w=${LOOPS[(j + s + r) % ${#LOOPS[@]}]}
				case $w in update_none|plain_cte) v=none ;; update_plpgsql) v=plpgsql ;; *) v=c ;; esac
				n=$SLICE tag=$w
				[ "$s" -gt 0 ] || n=$WARM_N tag=warm-up
				printf '\\set tag %s\n\\set workload %s\n\\set variant %s\n\\set first %s\n\\set n %s\n\\i bench/state_loop.sql\n' \
					"$tag" "$w" "$v" "$first" "$n"
				first=$((first + n))
			done
		done
	} >"$RUN/loop.sql"
	out=$(psql -X -qAt -v ON_ERROR_STOP=1 -d "$DB" -f "$RUN/loop.sql") || die "in-server loops failed (run $r)"
	for w in "${LOOPS[@]}"; do
		us=$(awk -v w="$w" -v n=$((SLICES * SLICE)) '$1 == "cpu_ns" && $2 == w { t += $3; k++ }
			END { if (k) printf "%.2f", t / 1000 / n }' <<<"$out")
		[ -n "$us" ] || die "in-server loop $w: no timing in: $out"
		echo "$us" >>"$RUN/loop_$w"
		say "loop run $r $w: $us µs CPU per transition"
	done
	check $((per_workload * ${#LOOPS[@]})) $((per_workload * (${#LOOPS[@]} - 1))) "in-server loops, run $r"
done
for w in "${LOOPS[@]}"; do LOOPUS[$w]=$(median <"$RUN/loop_$w"); done

# ---------------------------------------------------------------- pgbench
WORKLOADS=(update_none update_c update_plpgsql transit plain_cte plain_tx)
declare -A VARIANT=([update_none]=none [update_c]=c [update_plpgsql]=plpgsql [transit]=c [plain_cte]=none [plain_tx]=none)
declare -A SCRIPT=([update_none]=state_update.sql [update_c]=state_update.sql [update_plpgsql]=state_update.sql
	[transit]=state_transit.sql [plain_cte]=state_plain_cte.sql [plain_tx]=state_plain_tx.sql)
declare -A SERIES=([update_none]="UPDATE, no guard" [update_c]="UPDATE + C guard" [update_plpgsql]="UPDATE + PL/pgSQL guard"
	[transit]="transit_order()" [plain_cte]="plain SQL (CTE)" [plain_tx]="plain SQL (4 statements)")
# pending orders for the next run of a workload at a client count: twice as
# many as its last run used, plus 2,000 (PGB_ROWS the first time); a run that
# uses them all up is repeated with twice as many
declare -A PGB_N

pgb_point() {	# pgb_point WORKLOAD CLIENTS -> POINT_TPS
	local w=$1 clients=$2 rows log rc issued got moved logged
	rows=${PGB_N[$w,$clients]:-$PGB_ROWS}
	log=$RUN/pgbench-$w-$clients.log
	while :; do
		setup "$rows" "${VARIANT[$w]}"
		rc=0
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j $((clients < 4 ? clients : 4)) -T "$SECONDS_PER_RUN" \
			-f "bench/${SCRIPT[$w]}" "$DB" >"$log" 2>&1 || rc=$?
		issued=$(psql -X -qAt -d "$DB" -c "SELECT last_value FROM bench_seq")
		[ "$issued" -gt "$rows" ] || break
		rows=$((rows * 2))
		PGB_N[$w,$clients]=$rows
		say "$w at $clients clients used up its pending orders: again with $rows"
	done
	[ "$rc" = 0 ] || { cat "$log" >&2; die "pgbench failed: $w, $clients clients"; }
	if ! grep -q 'number of failed transactions: 0 ' "$log"; then
		cat "$log" >&2
		die "pgbench reported failed transactions: $w, $clients clients"
	fi
	# every order number issued moves one order and logs it (no log without
	# a guard); a transaction cut off by the end of the run may be missing
	got=$(psql -X -qAt -F ' ' -d "$DB" -c "SELECT (SELECT count(*) FROM payidem.\"order\" WHERE status = 'paid'),
		(SELECT count(*) FROM payidem.status_log)")
	read -r moved logged <<<"$got"
	[ "$moved" -le "$issued" ] && [ "$moved" -ge $((issued - clients)) ] ||
		die "pgbench $w, $clients clients: $moved orders paid for $issued order numbers issued"
	[ "$logged" = "$([ "$w" = update_none ] && echo 0 || echo "$moved")" ] ||
		die "pgbench $w, $clients clients: $logged status_log rows for $moved orders paid"
	PGB_N[$w,$clients]=$((issued * 2 + 2000))
	POINT_TPS=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$log")
	[ -n "$POINT_TPS" ] || die "pgbench $w, $clients clients: no tps in $log"
}

declare -A TPS
for clients in $CLIENTS; do
	for w in "${WORKLOADS[@]}"; do : >"$RUN/tps_$w"; done
	for r in $(seq 1 "$RUNS"); do
		say "pgbench, $clients clients, ${SECONDS_PER_RUN} s per workload: run $r of $RUNS"
		for w in "${WORKLOADS[@]}"; do
			pgb_point "$w" "$clients"
			echo "$POINT_TPS" >>"$RUN/tps_$w"
		done
	done
	for w in "${WORKLOADS[@]}"; do TPS[$w,$clients]=$(median <"$RUN/tps_$w"); done
	say "pgbench, $clients clients (tps): $(for w in "${WORKLOADS[@]}"; do printf '%s %.0f; ' "$w" "${TPS[$w,$clients]}"; done)"
done

# ---------------------------------------------------------------- report
times() { case $1 in n/a) echo "n/a" ;; *) echo "$1×" ;; esac; }
int() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
perrow() { awk -v o="$1" -v n="$ROWS" 'BEGIN { printf "%.2f", o * 1000 / n }'; }
setting() { psql -X -qAt -d "$DB" -c "SHOW $1"; }
yes_if() { awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN { ok = (a != "n/a") && ((op == "<=") ? a + 0 <= b : a + 0 >= b); print ok ? "yes" : "no" }'; }

# overhead FILE BASE DECIMALS: median over the runs of (time - the same run's
# no-guard time)
overhead() { paste "$RUN/$1" "$RUN/$2" | awk '{ print $1 - $2 }' | median | awk -v d="$3" '{ printf "%.*f", d, $1 }'; }
oc=$(overhead bulk_c bulk_none 1)
op=$(overhead bulk_plpgsql bulk_none 1)
cc=$(overhead bulkcpu_c bulkcpu_none 1)
cp=$(overhead bulkcpu_plpgsql bulkcpu_none 1)
guard_cpu=$(ratio "$cc" "$cp")
guard_wall=$(ratio "$oc" "$op")
lc=$(overhead loop_update_c loop_update_none 2)
lp=$(overhead loop_update_plpgsql loop_update_none 2)
guard_loop=$(ratio "$lc" "$lp")
# the two run one after the other in every run: the median of the runs' own
# ratios is steadier than the ratio of the medians
transit_cpu=$(paste "$RUN/loop_plain_cte" "$RUN/loop_transit" | awk '$2 > 0 { print $1 / $2 }' | median |
	awk '{ printf "%.2f", $1 } END { if (!NR) printf "n/a" }')
transit_pgb=$(for clients in $CLIENTS; do
	ratio "${TPS[transit,$clients]}" "${TPS[plain_cte,$clients]}"; echo
	ratio "${TPS[transit,$clients]}" "${TPS[plain_tx,$clients]}"; echo
done | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (lo == hi) print lo; else print lo "–" hi }')

{
	echo "Run of $(date -u '+%Y-%m-%d %H:%M UTC'): $(nproc) CPUs, PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'),"
	echo "fsync $(setting fsync), full_page_writes $(setting full_page_writes); median of $RUNS run(s) per figure:"
	echo "bulk UPDATE of $ROWS rows, $((SLICES * SLICE)) single-row transitions per workload in the server,"
	echo "pgbench -M prepared runs of ${SECONDS_PER_RUN} s, each from fresh pending orders."
	echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "### Bulk UPDATE of $ROWS orders (pending -> paid, one statement)"
	echo
	echo "Medians of $RUNS runs; an overhead is the median over the runs of the difference from the"
	echo "same run's no-guard figure."
	echo
	echo "| guard | wall time (ms) | overhead (ms) | backend CPU (ms) | CPU overhead (ms) | CPU overhead per row (µs) |"
	echo "|---|---:|---:|---:|---:|---:|"
	echo "| none | ${BULK[none]} | — | ${BULKCPU[none]} | — | — |"
	echo "| C constraint trigger (status_guard) | ${BULK[c]} | $oc | ${BULKCPU[c]} | $cc | $(perrow "$cc") |"
	echo "| PL/pgSQL constraint trigger | ${BULK[plpgsql]} | $op | ${BULKCPU[plpgsql]} | $cp | $(perrow "$cp") |"
	echo
	echo "C overhead / PL/pgSQL overhead = **$guard_cpu** in CPU time (target ≤ 0.60), $guard_wall in wall time."
	echo
	echo "### Single-row transitions in the server"
	echo
	echo "Backend CPU time per transition: $((SLICES * SLICE)) per workload in one backend, the five workloads"
	echo "taking turns in slices of $SLICE (one statement each); median of $RUNS runs."
	echo
	echo "| workload | µs CPU |"
	echo "|---|---:|"
	echo "| UPDATE, no guard | ${LOOPUS[update_none]} |"
	echo "| UPDATE, C trigger | ${LOOPUS[update_c]} |"
	echo "| UPDATE, PL/pgSQL trigger | ${LOOPUS[update_plpgsql]} |"
	echo "| transit_order() | ${LOOPUS[transit]} |"
	echo "| plain SQL, no trigger: UPDATE + log INSERT in one statement | ${LOOPUS[plain_cte]} |"
	echo
	echo "Per-row overhead: C $lc µs, PL/pgSQL $lp µs (ratio $guard_loop);"
	echo "plain SQL / transit_order() CPU, median of the runs' own ratios = **$transit_cpu** (transit_order()'s"
	echo "throughput relative to plain SQL, target ≥ 0.90)."
	echo
	echo "### Single-row transitions through pgbench"
	echo
	echo "TPS, median of $RUNS runs of ${SECONDS_PER_RUN} s."
	echo
	printf '| workload |'; for clients in $CLIENTS; do printf ' %s clients |' "$clients"; done; echo
	printf '|---|'; for clients in $CLIENTS; do printf -- '---:|'; done; echo
	for w in "${WORKLOADS[@]}"; do
		case $w in
		update_none) label="UPDATE, no guard" ;;
		update_c) label="UPDATE, C trigger" ;;
		update_plpgsql) label="UPDATE, PL/pgSQL trigger" ;;
		transit) label="transit_order() (C, logs through the trigger)" ;;
		plain_cte) label="plain SQL, no trigger: UPDATE + log INSERT in one statement (CTE)" ;;
		plain_tx) label="plain SQL, no trigger: BEGIN; UPDATE; INSERT; COMMIT" ;;
		esac
		printf '| %s |' "$label"; for clients in $CLIENTS; do printf ' %s |' "$(int "${TPS[$w,$clients]}")"; done; echo
	done
	printf '| transit_order() / plain SQL in one statement |'
	for clients in $CLIENTS; do printf ' %s |' "$(ratio "${TPS[transit,$clients]}" "${TPS[plain_cte,$clients]}")"; done; echo
	printf '| transit_order() / plain SQL as a 4-statement transaction |'
	for clients in $CLIENTS; do printf ' %s |' "$(ratio "${TPS[transit,$clients]}" "${TPS[plain_tx,$clients]}")"; done; echo
} | tee "$OUT"

for w in "${WORKLOADS[@]}"; do
	for clients in $CLIENTS; do
		printf '%s\t%s\t%s\n' "${SERIES[$w]}" "$clients" "$(int "${TPS[$w,$clients]}")"
	done
done >"$TSV"

{
	printf "C guard's overhead ≤ 0.6× the PL/pgSQL trigger's (bulk, CPU)\t%s\t%s\n" \
		"$(times "$guard_cpu") in bulk CPU time ($cc vs $cp ms); $(times "$guard_wall") in wall time; $(times "$guard_loop") per single-row change in the server" \
		"$(yes_if "$guard_cpu" '<=' 0.60)"
	printf 'transit_order() throughput ≥ 0.9× the same work in plain SQL\t%s\t%s\n' \
		"$(times "$transit_cpu") in the server (CPU, against plain SQL in one statement); $(times "$transit_pgb") through pgbench" \
		"$(yes_if "$transit_cpu" '>=' 0.90)"
} >"$TARGETS"
say "written: $OUT, $TSV, $TARGETS"
