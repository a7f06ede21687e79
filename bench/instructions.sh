#!/usr/bin/env bash
# Deterministic per-call cost: CPU instructions counted by valgrind's callgrind.
#
# For each measured call, a single-user backend (postgres --single, payidem
# preloaded) runs one statement under callgrind twice: once making N calls and
# once building the same arguments without the call.  The difference divided by
# N is the cost of one call, including everything it makes the server do (SPI,
# triggers, WAL insertion).  Instruction counts do not depend on the machine's load, so CI
# can compare them with the committed baseline.
#
#   bench/instructions.sh             measure, print a table, write bench/out/instructions.txt
#   bench/instructions.sh --check     also fail if a call costs > 20 % more than
#                                     bench/instructions.baseline
#   bench/instructions.sh --update    measure and rewrite the baseline
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

MODE=${1:-}
N=${N:-2000}
TOLERANCE=${TOLERANCE:-1.20}
BASELINE=bench/instructions.baseline

command -v valgrind >/dev/null || {
	is_root || die "valgrind is missing: sudo apt-get install -y valgrind"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
set_pg_paths
build_and_install

RUN=$(make_run_dir bench-instructions)
trap cluster_stop EXIT
cluster_start "$RUN"
DB=bench_instr
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" <<'SQL'
CREATE EXTENSION payidem;
-- fixtures for the calls that need rows
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0000000000BENCH', 'Bench', 'retail', 0.006, 'ak_bench_0000000000000');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('BENCH_WX', 'wechat', 0.002);
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
SELECT payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i), 'M0000000000BENCH', 'B' || i, 'bench', 100,
       now() + interval '1 day'
  FROM generate_series(1, 20000) AS i;
-- duplicate idempotency keys, completed
INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, amount, status, result)
SELECT 'dup:' || i, 'pay', 'PO1', 100, 'completed', '{"ok": true}' FROM generate_series(1, 20000) AS i;
SQL
cluster_stop

# name -> one statement making N calls (:n = N); BASE -> the same statement
# without the call, so the difference is the calls alone
declare -A CALL=(
	[gen_order_no]="SELECT count(payidem.gen_order_no()) FROM generate_series(1, :n) AS i;"
	[idem_claim_new]="SELECT count(c.outcome) FROM generate_series(1, :n) AS i, LATERAL payidem.idem_claim('new:' || i, 'pay', 'PO1', 'BENCH_WX', 100) AS c;"
	[idem_claim_dup]="SELECT count(c.outcome) FROM generate_series(1, :n) AS i, LATERAL payidem.idem_claim('dup:' || i, 'pay', 'PO1', 'BENCH_WX', 100) AS c;"
	[transit_order]="SELECT count(payidem.transit_order(payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i), 'paid')) FROM generate_series(1, :n) AS i;"
)
declare -A BASE=(
	[gen_order_no]="SELECT count(1) FROM generate_series(1, :n) AS i;"
	[idem_claim_new]="SELECT count(c) FROM generate_series(1, :n) AS i, LATERAL (SELECT 'new:' || i) AS c;"
	[idem_claim_dup]="SELECT count(c) FROM generate_series(1, :n) AS i, LATERAL (SELECT 'dup:' || i) AS c;"
	[transit_order]="SELECT count(payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i)) FROM generate_series(1, :n) AS i;"
)
ORDER=(gen_order_no idem_claim_new idem_claim_dup transit_order)

# postgres --single runs one statement per line
instructions() {
	local name=$1 which=$2 out="$RUN/callgrind.$1.$2" stmt
	if [ "$which" = call ]; then stmt=${CALL[$name]}; else stmt=${BASE[$name]}; fi
	printf '%s\n' "${stmt//:n/$N}" >"$RUN/script.$name.$which.sql"
	is_root && chown postgres: "$RUN/script.$name.$which.sql"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" --trace-children=no \
		"$PGBIN/postgres" --single -D "$RUN/data" -c shared_preload_libraries=payidem \
		-c fsync=off -c log_min_messages=warning "$DB" \
		<"$RUN/script.$name.$which.sql" >"$RUN/single.$name.$which.log" 2>"$RUN/valgrind.$name.$which.log" ||
		{ tail -20 "$RUN/valgrind.$name.$which.log" >&2; die "callgrind run failed for $name"; }
	if grep -q ERROR "$RUN/single.$name.$which.log"; then
		grep ERROR "$RUN/single.$name.$which.log" | head -3 >&2
		die "$name failed"
	fi
	awk '/^summary:/ {print $2}' "$out"
}

mkdir -p bench/out
OUT=bench/out/instructions.txt
: >"$OUT"
say "instructions per call (callgrind, N = $N)"
for name in "${ORDER[@]}"; do
	base=$(instructions "$name" base)
	full=$(instructions "$name" call)
	per=$(( (full - base) / N ))
	printf '%-16s %10d\n' "$name" "$per" | tee -a "$OUT"
done

case "$MODE" in
--update)
	{
		echo "# instructions per call (bench/instructions.sh --update); make bench-check fails above ${TOLERANCE}x"
		cat "$OUT"
	} >"$BASELINE"
	say "baseline written to $BASELINE"
	;;
--check)
	[ -f "$BASELINE" ] || die "no baseline: run bench/instructions.sh --update"
	failed=0
	while read -r name per; do
		base=$(awk -v n="$name" '$1 == n {print $2}' "$BASELINE")
		[ -n "$base" ] || { echo "$name: no baseline entry"; continue; }
		verdict=$(awk -v a="$per" -v b="$base" -v t="$TOLERANCE" 'BEGIN {printf "%.2f %s", a / b, (a > b * t) ? "FAIL" : "ok"}')
		echo "$name: $per vs baseline $base = ${verdict}"
		case "$verdict" in *FAIL) failed=$((failed + 1)) ;; esac
	done <"$OUT"
	[ "$failed" -eq 0 ] || die "$failed call(s) cost more than ${TOLERANCE}x their baseline"
	say "all calls within ${TOLERANCE}x of the baseline"
	;;
esac
