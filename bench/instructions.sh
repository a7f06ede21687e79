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
#
# Also writes bench/out/instructions.md (the table with the baseline next to
# each count) and bench/out/instructions.targets.  N (2000) calls per
# statement, on fixtures of N rows; compare counts only at the same N.
source "$(dirname "$0")/lib.sh"
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
[ "${SKIP_BUILD:-}" = 1 ] || build_and_install

RUN=$(make_run_dir bench-instructions)
trap cluster_stop EXIT
cluster_start "$RUN"
DB=bench_instr
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -v rows="$N" -d "$DB" <<'SQL'
CREATE EXTENSION payidem;
-- fixtures for the calls that need rows
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0000000000BENCH', 'Bench', 'retail', 0.006, 'ak_bench_0000000000000');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('BENCH_WX', 'wechat', 0.002);
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
SELECT payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i), 'M0000000000BENCH', 'B' || i, 'bench', 100,
       now() + interval '1 day'
  FROM generate_series(1, :rows) AS i;
-- pending payments of a bound merchant and channel, for apply_payment_result()
CREATE TABLE bench_merchant AS SELECT merchant_no FROM payidem.create_merchant('Bench Pay', 'retail', 0.006);
SELECT payidem.create_channel('BENCH_PAY', 'wechat', 0.002);
SELECT payidem.bind_channel(merchant_no, 'BENCH_PAY') FROM bench_merchant;
WITH o AS (
	INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at, notify_url)
	SELECT payidem.gen_order_no('PO'), m.merchant_no, 'P' || i, 'bench', 1000, now() + interval '1 day',
	       'https://shop.example/notify'
	  FROM bench_merchant m, generate_series(1, :rows) AS i
	RETURNING order_no, merchant_no, amount)
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
SELECT payidem.gen_order_no('PY'), order_no, merchant_no, 'BENCH_PAY', amount FROM o;
-- duplicate idempotency keys, completed
INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, amount, status, result)
SELECT 'dup:' || i, 'pay', 'PO1', 100, 'completed', '{"ok": true}' FROM generate_series(1, :rows) AS i;
SQL
cluster_stop

# name -> one statement making N calls (:n = N); BASE -> the same statement
# without the call, so the difference is the calls alone
declare -A CALL=(
	[gen_order_no]="SELECT count(payidem.gen_order_no()) FROM generate_series(1, :n) AS i;"
	[idem_claim_new]="SELECT count(c.outcome) FROM generate_series(1, :n) AS i, LATERAL payidem.idem_claim('new:' || i, 'pay', 'PO1', 'BENCH_WX', 100) AS c;"
	[idem_claim_dup]="SELECT count(c.outcome) FROM generate_series(1, :n) AS i, LATERAL payidem.idem_claim('dup:' || i, 'pay', 'PO1', 'BENCH_WX', 100) AS c;"
	[transit_order]="SELECT count(payidem.transit_order(payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i), 'closed')) FROM generate_series(1, :n) AS i;"
	[apply_payment_result]="SELECT count(payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'TX' || p.payment_no, p.amount)) FROM (SELECT payment_no, amount FROM payidem.payment WHERE channel_no = 'BENCH_PAY' ORDER BY payment_no LIMIT :n) AS p;"
)
declare -A BASE=(
	[gen_order_no]="SELECT count(1) FROM generate_series(1, :n) AS i;"
	[idem_claim_new]="SELECT count(c) FROM generate_series(1, :n) AS i, LATERAL (SELECT 'new:' || i) AS c;"
	[idem_claim_dup]="SELECT count(c) FROM generate_series(1, :n) AS i, LATERAL (SELECT 'dup:' || i) AS c;"
	[transit_order]="SELECT count(payidem.order_no_make('PO', '2026-01-01 00:00:00+00', 0, i)) FROM generate_series(1, :n) AS i;"
	[apply_payment_result]="SELECT count('TX' || p.payment_no) FROM (SELECT payment_no, amount FROM payidem.payment WHERE channel_no = 'BENCH_PAY' ORDER BY payment_no LIMIT :n) AS p;"
)
ORDER=(gen_order_no idem_claim_new idem_claim_dup transit_order apply_payment_result)

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

# the report's section and target line, against the committed baseline
{
	echo "Callgrind, one statement of N = $N calls in a single-user backend, minus the same"
	echo "statement without the call; $(date -u +%Y-%m-%d), PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}')."
	echo
	echo "| call | instructions per call | baseline | ratio |"
	echo "|---|---:|---:|---:|"
	while read -r name per; do
		base=$(awk -v n="$name" '$1 == n {print $2}' "$BASELINE" 2>/dev/null)
		printf '| `%s` | %s | %s | %s |\n' "$name" "$per" "${base:-—}" \
			"$(awk -v a="$per" -v b="${base:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "—"}')"
	done <"$OUT"
} >bench/out/instructions.md
worst=$(while read -r name per; do
	awk -v n="$name" -v a="$per" '$1 == n {printf "%.2f %s\n", a / $2, n}' "$BASELINE" 2>/dev/null
done <"$OUT" | sort -gr | head -1)
printf 'every call within %s× of bench/instructions.baseline (make bench-check)\t%s\t%s\n' "$TOLERANCE" \
	"${worst:+highest: ${worst#* } at ${worst%% *}×}" "$(awk -v w="${worst%% *}" -v t="$TOLERANCE" 'BEGIN {print (w != "" && w <= t) ? "yes" : "no"}')" \
	>bench/out/instructions.targets

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
