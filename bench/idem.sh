#!/usr/bin/env bash
# Benchmark: payidem.idem_claim() against
#   raw      — the floor: a bare INSERT ... ON CONFLICT (idem_key) DO NOTHING
#              RETURNING on the same table (no outcome, no mismatch check);
#   plpgsql  — the seed's pattern in PL/pgSQL: SELECT the key, else INSERT in
#              an exception block that catches unique_violation.
# on new keys (every call inserts) and on duplicates (every call hits one of
# 1,000 completed keys), pgbench -M prepared, 1/2/8 clients, with
# synchronous_commit on and off.  Each run starts from the same table
# (bench/idem_reset.sql); the three variants of a point run one after the
# other, RUNS times, and the best run of each counts (the least disturbed by
# whatever else the machine does).
#
# Before that, the cost of one call inside the server, without client round
# trips: a PL/pgSQL loop of N calls of each variant (the raw insert as a
# statement in the loop), new keys and duplicates, median of 3, minus the
# empty loop.
#
# Starts its own throwaway cluster (fsync on) and stops it on exit; prints a
# Markdown report and writes it to bench/out/idem.md.
#
#   SECONDS_PER_RUN (3)  RUNS (2)  N (20000)  CLIENTS ("1 2 8")  SYNC ("on off")
#   QUICK=1 (1 run of 2 s)  SKIP_BUILD=1 to use the payidem already installed.
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
RUNS=${RUNS:-2}
N=${N:-20000}
CLIENTS=${CLIENTS:-"1 2 8"}
SYNC=${SYNC:-"on off"}
if [ "${QUICK:-}" = 1 ]; then SECONDS_PER_RUN=2; RUNS=1; N=5000; fi
VARIANTS=(claim raw plpgsql)
CASES=(new dup)

set_pg_paths
[ "${SKIP_BUILD:-}" = 1 ] || build_and_install
RUN=$(make_run_dir bench-idem)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55700} cluster_start "$RUN" "fsync = on" "full_page_writes = on"
mkdir -p bench/out
OUT=bench/out/idem.md
DB=bench_idem

psql -X -q -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/idem_setup.sql

# run_point VARIANT CASE CLIENTS SYNC -> "tps latency_ms"
run_point() {
	local variant=$1 case=$2 clients=$3 sync=$4 log
	psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/idem_reset.sql >/dev/null
	log=$RUN/pgbench-$variant-$case-$clients-$sync.log
	PGOPTIONS="-c synchronous_commit=$sync" \
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$clients" -T "$SECONDS_PER_RUN" \
		-D n=0 -f "bench/idem_${variant}_${case}.sql" "$DB" >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $variant $case $clients $sync"; }
	if ! grep -q 'number of failed transactions: 0 ' "$log"; then
		cat "$log" >&2
		die "pgbench reported failed transactions: $variant $case $clients $sync"
	fi
	printf '%s %s\n' \
		"$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1)" \
		"$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$log")"
}

# ---------------------------------------------------------------- per call, in the server
# cpu_cost VARIANT CASE -> microseconds per call (median of 3, empty loop subtracted)
cpu_loop() {
	local body=$1
	psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/idem_reset.sql >/dev/null
	psql -X -At -v ON_ERROR_STOP=1 -d "$DB" <<SQL | tail -1
DO \$\$
DECLARE
	t0 timestamptz := clock_timestamp();
	k text;
BEGIN
	FOR i IN 1..$N LOOP
		$body
	END LOOP;
	RAISE NOTICE '%', extract(epoch FROM clock_timestamp() - t0) * 1000000 / $N;
END
\$\$;
SQL
}
cpu_body() {
	local variant=$1 case=$2 key order
	if [ "$case" = new ]; then
		key="'cpu:' || i" order="'PO' || i"
	else
		key="'dup:' || (i % 1000 + 1)" order="'PO' || (i % 1000 + 1)"
	fi
	case $variant in
	empty) echo "k := $key || $order;" ;;
	claim) echo "PERFORM * FROM payidem.idem_claim($key, 'pay', $order, 'WXPAY_001', 100);" ;;
	raw) echo "INSERT INTO payidem.idempotency AS x (idem_key, biz_type, order_no, channel, amount, status, attempts, locked_until) VALUES ($key, 'pay', $order, 'WXPAY_001', 100, 'processing', 1, now() + interval '30 seconds') ON CONFLICT (idem_key) DO NOTHING;" ;;
	plpgsql) echo "PERFORM bench.select_then_insert($key, 'pay', $order, 'WXPAY_001', 100);" ;;
	esac
}
cpu_cost() {
	local variant=$1 case=$2 i vals=()
	for i in 1 2 3; do
		vals+=("$(cpu_loop "$(cpu_body "$variant" "$case")" 2>&1 | sed -n 's/.*NOTICE:  //p')")
	done
	for i in "${vals[@]}"; do [ -n "$i" ] || die "per-call loop failed: $variant $case"; done
	printf '%s\n' "${vals[@]}" | sort -g | sed -n 2p
}
declare -A CPU
for case in "${CASES[@]}"; do
	say "per-call cost in the server, $case keys"
	CPU[empty,$case]=$(cpu_cost empty "$case")
	for variant in "${VARIANTS[@]}"; do
		CPU[$variant,$case]=$(cpu_cost "$variant" "$case")
	done
done

# ---------------------------------------------------------------- pgbench
declare -A TPS LAT
for sync in $SYNC; do
	for clients in $CLIENTS; do
		for case in "${CASES[@]}"; do
			for ((r = 1; r <= RUNS; r++)); do
				for variant in "${VARIANTS[@]}"; do
					say "synchronous_commit=$sync clients=$clients $case keys: $variant (run $r)"
					read -r tps lat < <(run_point "$variant" "$case" "$clients" "$sync")
					if [ -z "${TPS[$variant,$case,$clients,$sync]:-}" ] ||
						awk -v a="$tps" -v b="${TPS[$variant,$case,$clients,$sync]}" 'BEGIN { exit !(a > b) }'; then
						TPS[$variant,$case,$clients,$sync]=$tps
						LAT[$variant,$case,$clients,$sync]=$lat
					fi
				done
			done
		done
	done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
int() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }

{
	echo "### Idempotency: idem_claim() vs raw ON CONFLICT insert vs PL/pgSQL select-then-insert"
	echo
	echo "$(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)),"
	echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), fsync on."
	echo
	echo "**Per call inside the server** (µs; PL/pgSQL loop of $N calls, median of 3, empty loop subtracted):"
	echo
	echo "| keys | idem_claim | raw ON CONFLICT | PL/pgSQL select-then-insert | claim/raw | plpgsql/claim |"
	echo "|---|---:|---:|---:|---:|---:|"
	for case in "${CASES[@]}"; do
		e=${CPU[empty,$case]}
		c=$(awk -v a="${CPU[claim,$case]}" -v e="$e" 'BEGIN { printf "%.2f", a - e }')
		r=$(awk -v a="${CPU[raw,$case]}" -v e="$e" 'BEGIN { printf "%.2f", a - e }')
		p=$(awk -v a="${CPU[plpgsql,$case]}" -v e="$e" 'BEGIN { printf "%.2f", a - e }')
		printf '| %s | %s | %s | %s | %s | %s |\n' "$case" "$c" "$r" "$p" "$(ratio "$c" "$r")" "$(ratio "$p" "$c")"
	done
	echo
	echo "**Throughput** (pgbench -M prepared, one claim per transaction, best of $RUNS runs of"
	echo "${SECONDS_PER_RUN} s; TPS, average latency in ms in parentheses). raw/claim = how many times"
	echo "faster the raw insert is (target ≤ 1.10); claim/plpgsql = idem_claim() relative to the"
	echo "PL/pgSQL pattern (target > 1 on duplicates)."
	echo
	echo "| sync commit | clients | keys | idem_claim | raw ON CONFLICT | PL/pgSQL | raw/claim | claim/plpgsql |"
	echo "|---|---:|---|---:|---:|---:|---:|---:|"
	for sync in $SYNC; do
		for clients in $CLIENTS; do
			for case in "${CASES[@]}"; do
				c=${TPS[claim,$case,$clients,$sync]}
				r=${TPS[raw,$case,$clients,$sync]}
				p=${TPS[plpgsql,$case,$clients,$sync]}
				printf '| %s | %s | %s | %s (%s) | %s (%s) | %s (%s) | %s | %s |\n' \
					"$sync" "$clients" "$case" \
					"$(int "$c")" "${LAT[claim,$case,$clients,$sync]}" \
					"$(int "$r")" "${LAT[raw,$case,$clients,$sync]}" \
					"$(int "$p")" "${LAT[plpgsql,$case,$clients,$sync]}" \
					"$(ratio "$r" "$c")" "$(ratio "$c" "$p")"
			done
		done
	done
} | tee "$OUT"
say "report written to $OUT"
