#!/usr/bin/env bash
# Benchmark: payidem.idem_claim() against
#   raw      — the floor: a bare INSERT ... ON CONFLICT (idem_key) DO NOTHING
#              RETURNING on the same table (no outcome, no mismatch check);
#   plpgsql  — the seed's pattern in PL/pgSQL: SELECT the key, else INSERT in
#              an exception block that catches unique_violation.
# on new keys (every call inserts) and on duplicates (every call hits one of
# 1,000 completed keys).
#
#   1. the cost of one call inside the server, without client round trips:
#      PL/pgSQL loops of N calls of each variant (the raw insert as a
#      statement in the loop), new keys and duplicates, in the backend's CPU
#      time (from /proc/self/schedstat, so other load on the machine counts
#      little), minus the empty loop.  The loops of a run take turns in ten
#      slices in one block; median of RUNS runs, and the variants' ratios are
#      medians of each run's own ratio;
#   2. pgbench -M prepared, -j min(clients, 4), one claim per transaction, at
#      CLIENTS clients, median of RUNS runs of SECONDS_PER_RUN each.  New keys
#      run under every synchronous_commit setting in SYNC.  A duplicate writes
#      nothing in any variant (no transaction id is assigned, which is checked
#      first), so its commit flushes nothing and synchronous_commit cannot
#      change it: duplicates run once, under the first setting in SYNC.  Every
#      new-key run starts from the same table (bench/idem_reset.sql: 1,000
#      completed keys, then a CHECKPOINT); the duplicate runs of a client count
#      share one reset.  The three variants of a point run one after the
#      other, RUNS times.  After every run the table is checked: one row per
#      new-key transaction, the 1,000 completed keys unchanged.
#
# Starts its own throwaway cluster (fsync and full_page_writes on, port
# PAYIDEM_PORT or 55700) and stops it on exit.  Writes
#   bench/out/idem.md       the tables of the run (also printed),
#   bench/out/idem.tsv      series<TAB>clients<TAB>tps: the pgbench medians of
#                           the first SYNC setting (new keys and duplicates),
#   bench/out/idem.targets  target<TAB>measured<TAB>yes|no.
#
#   RUNS (3)  SECONDS_PER_RUN (2)  N (10000)  CLIENTS ("1 8 32")  SYNC ("on off")
#   QUICK=1 (1 run of 1 s, N 2000, CLIENTS "1 8", SYNC "on")
#   SKIP_BUILD=1 to use the payidem already installed.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
N=${N:-10000}
CLIENTS=${CLIENTS:-"1 8 32"}
SYNC=${SYNC:-"on off"}
if [ "${QUICK:-}" = 1 ]; then RUNS=1; SECONDS_PER_RUN=1; N=2000; CLIENTS="1 8"; SYNC=on; fi
DUP_SYNC=${SYNC%% *}
VARIANTS=(claim raw plpgsql)
CASES=(new dup)
declare -A NAME=([claim]="idem_claim" [raw]="raw ON CONFLICT" [plpgsql]="PL/pgSQL")

set_pg_paths
bench_build
RUN=$(make_run_dir bench-idem)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55700} cluster_start "$RUN" "fsync = on" "full_page_writes = on"
mkdir -p bench/out
OUT=bench/out/idem.md
TSV=bench/out/idem.tsv
TARGETS=bench/out/idem.targets
rm -f "$OUT" "$TSV" "$TARGETS"
DB=bench_idem

psql -X -q -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/idem_setup.sql

reset() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -f bench/idem_reset.sql >/dev/null; }


# check_table NEW_ROWS_MIN NEW_ROWS_MAX WHAT: the table holds the 1,000
# completed keys, unchanged, plus between MIN and MAX other rows
check_table() {
	local got extra kept
	got=$(psql -X -qAt -F ' ' -d "$DB" -c "SELECT count(*) - 1000,
		count(*) FILTER (WHERE idem_key LIKE 'dup:%' AND status = 'completed' AND attempts = 1)
		FROM payidem.idempotency")
	read -r extra kept <<<"$got"
	[ "$kept" = 1000 ] || die "$3: $kept of the 1,000 completed keys left unchanged"
	[ "$extra" -ge "$1" ] && [ "$extra" -le "$2" ] ||
		die "$3: $extra new rows in the table, expected $1 to $2"
}

# ---------------------------------------------------------------- per call, in the server
# One PL/pgSQL block per run and case: the four loops (the empty one and the
# three variants) take turns in slices of N/SLICES calls, after one untimed
# slice each, so that a change of the machine's load during the run falls on
# all four alike.
SLICES=10
SLICE=$((N / SLICES))
cpu_body() {	# cpu_body VARIANT CASE -> one call, on key i
	local variant=$1 case=$2 key order
	if [ "$case" = new ]; then
		key="'cpu:$variant:' || i" order="'PO' || i"
	else
		key="'dup:' || (i % 1000 + 1)" order="'PO' || (i % 1000 + 1)"
	fi
	case $variant in
	empty) echo "k := $key || $order;" ;;
	claim) echo "PERFORM * FROM payidem.idem_claim($key, 'pay', $order, 'WXPAY_001', 100);" ;;
	raw) echo "INSERT INTO payidem.idempotency AS x (idem_key, biz_type, order_no, channel, amount, status, attempts, locked_until) VALUES ($key, 'pay', $order, 'WXPAY_001', 100, 'processing', 1, now() + interval '30 seconds') ON CONFLICT (idem_key) DO NOTHING;" ;;
	# each variant as the statement a client sends (SELECT * FROM f(...)):
	# PERFORM f() alone would let PL/pgSQL skip the statement (a simple
	# expression), which no application calling the pattern gets
	plpgsql) echo "PERFORM * FROM bench.select_then_insert($key, 'pay', $order, 'WXPAY_001', 100);" ;;
	esac
}
# cpu_run CASE -> "empty claim raw plpgsql": microseconds per call
cpu_run() {
	local case=$1 loops=(empty "${VARIANTS[@]}") body="" s j v out
	for ((s = 0; s <= SLICES; s++)); do
		for ((j = 0; j < ${#loops[@]}; j++)); do
			v=${loops[(j + s) % ${#loops[@]}]}
			body+="	t0 := bench.cpu_ns();
	FOR i IN $((s * SLICE + 1))..$(((s + 1) * SLICE)) LOOP
		$(cpu_body "$v" "$case")
	END LOOP;
"
			[ "$s" = 0 ] || body+="	cpu_$v := cpu_$v + (bench.cpu_ns() - t0);
"
		done
	done
	[ "$case" = new ] && reset
	out=$(psql -X -q -v ON_ERROR_STOP=1 -d "$DB" 2>&1 <<SQL | sed -n 's/.*NOTICE:  //p'
DO \$\$
DECLARE
	t0 bigint;
	k text;
	cpu_empty bigint := 0;
	cpu_claim bigint := 0;
	cpu_raw bigint := 0;
	cpu_plpgsql bigint := 0;
BEGIN
$body
	RAISE NOTICE '% % % %', round(cpu_empty / 1000.0 / $((SLICES * SLICE)), 3),
		round(cpu_claim / 1000.0 / $((SLICES * SLICE)), 3), round(cpu_raw / 1000.0 / $((SLICES * SLICE)), 3),
		round(cpu_plpgsql / 1000.0 / $((SLICES * SLICE)), 3);
END
\$\$;
SQL
	) || true
	[ "$(wc -w <<<"$out")" = 4 ] || die "per-call loops failed ($case keys): $out"
	if [ "$case" = new ]; then
		check_table $((3 * (SLICES + 1) * SLICE)) $((3 * (SLICES + 1) * SLICE)) "per-call loops, $case keys"
	else
		check_table 0 0 "per-call loops, $case keys"
	fi
	echo "$out"
}
declare -A CPU
for case in "${CASES[@]}"; do
	say "per-call cost in the server, $case keys: $((SLICES * SLICE)) calls of each, median of $RUNS"
	[ "$case" = dup ] && reset
	for variant in empty "${VARIANTS[@]}"; do : >"$RUN/cpu-$variant-$case"; done
	for ((r = 1; r <= RUNS; r++)); do
		read -r e c w p <<<"$(cpu_run "$case")"
		[ -n "$p" ] || die "per-call loops failed ($case keys)"
		echo "$e" >>"$RUN/cpu-empty-$case"
		echo "$c" >>"$RUN/cpu-claim-$case"
		echo "$w" >>"$RUN/cpu-raw-$case"
		echo "$p" >>"$RUN/cpu-plpgsql-$case"
	done
	for variant in empty "${VARIANTS[@]}"; do
		CPU[$variant,$case]=$(median <"$RUN/cpu-$variant-$case")
	done
done

# ---------------------------------------------------------------- pgbench
# A duplicate must not assign a transaction id (then its commit writes and
# flushes nothing): that is why duplicates run under one SYNC setting only.
reset
for variant in "${VARIANTS[@]}"; do
	xid=$({
		echo "BEGIN;"
		sed '/^\\set/d' "bench/idem_${variant}_dup.sql"
		echo "SELECT 'xid ' || (pg_current_xact_id_if_assigned() IS NULL);"
		echo "COMMIT;"
	} | psql -X -qAt -v ON_ERROR_STOP=1 -v k=1 -d "$DB") || die "duplicate $variant claim failed"
	grep -qx 'xid true' <<<"$xid" ||
		die "a duplicate $variant claim assigns a transaction id: duplicates must run under every SYNC setting"
done

# run_point VARIANT CASE CLIENTS SYNC -> "tps latency_ms"
run_point() {
	local variant=$1 case=$2 clients=$3 sync=$4 log processed
	[ "$case" = new ] && reset
	log=$RUN/pgbench-$variant-$case-$clients-$sync.log
	PGOPTIONS="-c synchronous_commit=$sync" \
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j $((clients < 4 ? clients : 4)) -T "$SECONDS_PER_RUN" \
		-D n=0 -f "bench/idem_${variant}_${case}.sql" "$DB" >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $variant $case $clients $sync"; }
	if ! grep -q 'number of failed transactions: 0 ' "$log"; then
		cat "$log" >&2
		die "pgbench reported failed transactions: $variant $case $clients $sync"
	fi
	processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
	if [ "$case" = new ]; then
		# a transaction cut off by the end of the run may have committed
		check_table "$processed" $((processed + clients)) "pgbench $variant $case $clients $sync"
	else
		check_table 0 0 "pgbench $variant $case $clients $sync"
	fi
	printf '%s %s\n' \
		"$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1)" \
		"$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$log")"
}

declare -A TPS LAT
POINTS=()	# "sync clients case", in the order they ran
for sync in $SYNC; do
	for clients in $CLIENTS; do
		for case in "${CASES[@]}"; do
			[ "$case" = new ] || [ "$sync" = "$DUP_SYNC" ] || continue
			POINTS+=("$sync $clients $case")
			[ "$case" = dup ] && reset
			for variant in "${VARIANTS[@]}"; do : >"$RUN/tps-$variant"; : >"$RUN/lat-$variant"; done
			for ((r = 1; r <= RUNS; r++)); do
				say "synchronous_commit=$sync, clients=$clients, $case keys: run $r of $RUNS"
				for variant in "${VARIANTS[@]}"; do
					read -r tps lat < <(run_point "$variant" "$case" "$clients" "$sync")
					[ -n "$tps" ] && [ -n "$lat" ] || die "no result from pgbench: $variant $case $clients $sync"
					echo "$tps" >>"$RUN/tps-$variant"
					echo "$lat" >>"$RUN/lat-$variant"
				done
			done
			for variant in "${VARIANTS[@]}"; do
				TPS[$variant,$case,$clients,$sync]=$(median <"$RUN/tps-$variant")
				LAT[$variant,$case,$clients,$sync]=$(median <"$RUN/lat-$variant")
			done
		done
	done
done

# ---------------------------------------------------------------- report
times() { case $1 in n/a) echo "n/a" ;; *) echo "$1×" ;; esac; }
int() { awk -v a="$1" 'BEGIN { printf "%.0f", a }'; }
net() { awk -v a="${CPU[$1,$2]}" -v e="${CPU[empty,$2]}" 'BEGIN { printf "%.2f", a - e }'; }
# span CASE A B: "min–max" of TPS[A]/TPS[B] over the pgbench points of CASE
span() {
	local p sync clients case
	for p in "${POINTS[@]}"; do
		read -r sync clients case <<<"$p"
		[ "$case" = "$1" ] || continue
		ratio "${TPS[$2,$case,$clients,$sync]}" "${TPS[$3,$case,$clients,$sync]}"
		echo
	done | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (lo == hi) print lo; else print lo "–" hi }'
}
setting() { psql -X -qAt -d "$DB" -c "SHOW $1"; }

declare -A NET
for case in "${CASES[@]}"; do
	for variant in "${VARIANTS[@]}"; do NET[$variant,$case]=$(net "$variant" "$case"); done
done
# cpu_ratio A B CASE: median over the runs of (A - empty) / (B - empty), the
# loops of a run having taken turns in one block
cpu_ratio() {
	paste "$RUN/cpu-$1-$3" "$RUN/cpu-$2-$3" "$RUN/cpu-empty-$3" | awk '$2 > $3 { print ($1 - $3) / ($2 - $3) }' |
		median | awk '{ printf "%.2f", $1 } END { if (!NR) printf "n/a" }'
}
declare -A CPURATIO
for case in "${CASES[@]}"; do
	CPURATIO[claim_raw,$case]=$(cpu_ratio claim raw "$case")
	CPURATIO[plpgsql_claim,$case]=$(cpu_ratio plpgsql claim "$case")
done
claim_raw_new=${CPURATIO[claim_raw,new]}
claim_raw_dup=${CPURATIO[claim_raw,dup]}
plpgsql_claim_dup=${CPURATIO[plpgsql_claim,dup]}
pgb_new=$(span new raw claim)
pgb_dup=$(span dup raw claim)
pgb_pl=$(span dup claim plpgsql)
yes_if() { awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN { ok = (a != "n/a") && ((op == "<=") ? a + 0 <= b : a + 0 > b); print ok ? "yes" : "no" }'; }

{
	echo "Run of $(date -u '+%Y-%m-%d %H:%M UTC'): $(nproc) CPUs, PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'),"
	echo "fsync $(setting fsync), full_page_writes $(setting full_page_writes); median of $RUNS run(s) per point:"
	echo "loops of $((SLICES * SLICE)) calls in the server, pgbench -M prepared runs of ${SECONDS_PER_RUN} s."
	echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "### Per call inside the server"
	echo
	echo "Backend CPU time per call in µs: PL/pgSQL loops of $((SLICES * SLICE)) calls of each variant, taking turns"
	echo "in slices of $SLICE in one block, minus the empty loop ($(awk -v a="${CPU[empty,new]}" 'BEGIN { printf "%.2f", a }') µs for new keys, $(awk -v a="${CPU[empty,dup]}" 'BEGIN { printf "%.2f", a }') µs"
	echo "for duplicates); median of $RUNS runs, the ratios the median of each run's own ratio."
	echo "Each call is a statement, as a client sends it: \`PERFORM * FROM f(...)\` for both functions."
	echo
	echo "| keys | idem_claim | raw ON CONFLICT | PL/pgSQL select-then-insert | claim/raw | plpgsql/claim |"
	echo "|---|---:|---:|---:|---:|---:|"
	for case in "${CASES[@]}"; do
		c=${NET[claim,$case]} r=${NET[raw,$case]} p=${NET[plpgsql,$case]}
		printf '| %s | %s | %s | %s | %s | %s |\n' "$case" "$c" "$r" "$p" "${CPURATIO[claim_raw,$case]}" "${CPURATIO[plpgsql_claim,$case]}"
	done
	echo
	echo "### Throughput"
	echo
	echo "pgbench -M prepared, one claim per transaction; TPS, median of $RUNS, average latency in ms"
	echo "in parentheses. raw/claim = how many times faster the raw insert is; claim/plpgsql ="
	echo "idem_claim()'s throughput relative to the PL/pgSQL pattern's. Duplicates write nothing, so"
	echo "they run under synchronous_commit = $DUP_SYNC only."
	echo
	echo "| sync commit | clients | keys | idem_claim | raw ON CONFLICT | PL/pgSQL | raw/claim | claim/plpgsql |"
	echo "|---|---:|---|---:|---:|---:|---:|---:|"
	for p in "${POINTS[@]}"; do
		read -r sync clients case <<<"$p"
		c=${TPS[claim,$case,$clients,$sync]}
		r=${TPS[raw,$case,$clients,$sync]}
		pl=${TPS[plpgsql,$case,$clients,$sync]}
		printf '| %s | %s | %s | %s (%s) | %s (%s) | %s (%s) | %s | %s |\n' \
			"$sync" "$clients" "$case" \
			"$(int "$c")" "${LAT[claim,$case,$clients,$sync]}" \
			"$(int "$r")" "${LAT[raw,$case,$clients,$sync]}" \
			"$(int "$pl")" "${LAT[plpgsql,$case,$clients,$sync]}" \
			"$(ratio "$r" "$c")" "$(ratio "$c" "$pl")"
	done
	echo
	echo "### Against the targets"
	echo
	echo "- idem_claim/raw per call in the server: new keys **$claim_raw_new**, duplicates **$claim_raw_dup**"
	echo "  (target ≤ 1.10); through pgbench raw/claim $pgb_new on new keys, $pgb_dup on duplicates."
	echo "- PL/pgSQL/idem_claim per call on duplicates in the server: **$plpgsql_claim_dup** (target > 1);"
	echo "  through pgbench claim/plpgsql $pgb_pl."
} | tee "$OUT"

# chart: the first SYNC setting, new keys and duplicates
for case in "${CASES[@]}"; do
	for variant in "${VARIANTS[@]}"; do
		for clients in $CLIENTS; do
			printf '%s %s, sync %s\t%s\t%s\n' "${NAME[$variant]}" "$case" "$DUP_SYNC" "$clients" \
				"$(int "${TPS[$variant,$case,$clients,$DUP_SYNC]}")"
		done
	done
done >"$TSV"

{
	printf 'idem_claim() within 1.1× of the raw INSERT … ON CONFLICT (new keys)\t%s\t%s\n' \
		"$(times "$claim_raw_new") in the server; $(times "$pgb_new") through pgbench" "$(yes_if "$claim_raw_new" '<=' 1.10)"
	printf 'idem_claim() within 1.1× of the raw INSERT … ON CONFLICT (duplicates)\t%s\t%s\n' \
		"$(times "$claim_raw_dup") in the server; $(times "$pgb_dup") through pgbench" "$(yes_if "$claim_raw_dup" '<=' 1.10)"
	printf 'idem_claim() faster than the PL/pgSQL pattern on duplicates\t%s\t%s\n' \
		"idem_claim ${NET[claim,dup]} vs PL/pgSQL ${NET[plpgsql,dup]} µs per call in the server ($(times "$plpgsql_claim_dup") as fast); $(times "$pgb_pl") the throughput through pgbench" \
		"$(yes_if "$plpgsql_claim_dup" '>' 1)"
} >"$TARGETS"
say "written: $OUT, $TSV, $TARGETS"
