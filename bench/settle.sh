#!/usr/bin/env bash
# Benchmark of settlement (a benchmark, never a timed test).
#
#   1. settle() of one day of N items (succeeded payments) over MERCHANTS
#      merchants, the day reconciled, OLD_SMALL older settled payments in the
#      tables, against the floor written by hand in plain SQL on plain tables
#      (bench/settle_floor.sql: INSERT ... SELECT of the items and their
#      balanced entries), alternating, RUNS of each, medians.  Each run is
#      two-phase committed (PREPARE TRANSACTION, which runs the journal's
#      checks at commit, then ROLLBACK PREPARED), so every run settles the
#      same day from the same state.
#   2. cost growth: the same settle() with OLD older settled payments.
#   3. a payout request (request_payout()) against a plain UPDATE ... SET
#      balance = balance - x WHERE balance >= x, pgbench, one client,
#      alternating, synchronous_commit off on both sides (the CPU, not the
#      disk's flush); then 8 clients requesting payouts of one merchant
#      beyond its balance: every request either paid out or refused with
#      PI010, the balance never below 0, verify() empty.
# The items settled, their sums and verify() are checked; a mismatch fails
# the run.  Starts its own throwaway cluster (port PAYIDEM_PORT or 55870).
# Writes bench/out/settle.md, settle.tsv, settle.targets.
#
#   N (1000000)  MERCHANTS (10000)  OLD_SMALL (10000)  OLD (1000000; 10000000 as the issue's figure)
#   RUNS (3)  SECONDS_PER_RUN (10)  SKIP_BUILD=1  QUICK=1: N 100000, OLD 100000, RUNS 1, 3 s
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

if [ "${QUICK:-}" = 1 ]; then
	N=${N:-100000} OLD=${OLD:-100000} RUNS=${RUNS:-1} SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
fi
N=${N:-1000000}
MERCHANTS=${MERCHANTS:-10000}
OLD_SMALL=${OLD_SMALL:-10000}
OLD=${OLD:-1000000}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}

set_pg_paths
bench_build
RUN=$(make_run_dir bench-settle)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55870} cluster_start "$RUN" "fsync = on" "shared_buffers = 512MB" "max_wal_size = 8GB" \
	"max_prepared_transactions = 4" "work_mem = 64MB"
mkdir -p bench/out
OUT=bench/out/settle
rm -f "$OUT.md" "$OUT.tsv" "$OUT.targets"
DB=bench_settle
psql -X -q -d postgres -c "CREATE DATABASE $DB"
sqlrun() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
sqlrun -c "CREATE EXTENSION payidem"
# the sum of the Time: lines of a psql run (the statement and its PREPARE)
ms_sum() { sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | awk '{s += $1} END {printf "%.1f", s}'; }

say "set-up: $N payments of one day over $MERCHANTS merchants, $OLD_SMALL older ones settled"
t0=$(date +%s)
sqlrun -v n="$N" -v merchants="$MERCHANTS" -f bench/settle_setup.sql >/dev/null
sqlrun -v old="$OLD_SMALL" -v from="$N" -v merchants="$MERCHANTS" -f bench/settle_older.sql >/dev/null
say "set-up took $(($(date +%s) - t0)) s"
X_NET=$(sqlrun -At -c "SELECT sum(amount - fee_amount) FROM payidem.payment WHERE paid_at >= '2026-01-05' AND paid_at < '2026-01-06'")

# one settle() of 2026-01-06 (cycle D1: the day's items are due), prepared
# and rolled back; checks what it settled
settle_once() {
	local out items net
	out=$(printf '%s\n' 'BEGIN;' '\timing on' \
		"SELECT sum(s.items), sum(s.net), sum(s.held) FROM payidem.settle('2026-01-06') s;" \
		"PREPARE TRANSACTION 'bench_settle';" '\timing off' "ROLLBACK PREPARED 'bench_settle';" | sqlrun -At)
	read -r items net <<<"$(echo "$out" | grep '^[0-9]*|' | head -1 | awk -F'|' '{print $1, $2}')"
	[ "$items" = "$N" ] && [ "$net" = "$X_NET" ] || die "settle() settled '$items' items, net '$net'; expected $N, $X_NET"
	echo "$out" | ms_sum
}
floor_once() {
	printf '%s\n' 'BEGIN;' '\timing on' '\i bench/settle_floor.sql' "PREPARE TRANSACTION 'bench_floor';" '\timing off' \
		"ROLLBACK PREPARED 'bench_floor';" | sqlrun -At | ms_sum
}
# RUNS rounds of settle(), then the floor (one warm-up of each first)
measure() {
	local tag=$1 r ms
	: >"$RUN/$tag.settle"
	: >"$RUN/$tag.floor"
	settle_once >/dev/null
	floor_once >/dev/null
	for ((r = 1; r <= RUNS; r++)); do
		ms=$(settle_once)
		echo "$ms" >>"$RUN/$tag.settle"
		say "$tag: settle() $r/$RUNS: $ms ms"
		ms=$(floor_once)
		echo "$ms" >>"$RUN/$tag.floor"
		say "$tag: floor $r/$RUNS: $ms ms"
	done
}
measure small
SETTLE_MS=$(median <"$RUN/small.settle")
FLOOR_MS=$(median <"$RUN/small.floor")

say "growth: $OLD more older settled payments"
t0=$(date +%s)
sqlrun -v old="$OLD" -v from="$((N + OLD_SMALL))" -v merchants="$MERCHANTS" -f bench/settle_older.sql >/dev/null
say "growth set-up took $(($(date +%s) - t0)) s"
measure big
BIG_MS=$(median <"$RUN/big.settle")
BIG_FLOOR_MS=$(median <"$RUN/big.floor")

# ---------------------------------------------------------------- payouts
# the day settled for good: every merchant has a balance to pay out from
sqlrun -c "SELECT count(*) FROM payidem.settle('2026-01-06')" >/dev/null
sqlrun -c "CREATE TABLE plain_balance (merchant_no text PRIMARY KEY, balance bigint NOT NULL) WITH (fillfactor = 50)" \
	-c "INSERT INTO plain_balance SELECT merchant_no, available FROM payidem.merchant_balance" -c "VACUUM ANALYZE" >/dev/null
cat >"$RUN/payout.sql" <<SQL
\set m random(1, $MERCHANTS)
SELECT payidem.request_payout('M' || lpad(:m::text, 15, '0'), 1, 'P' || txid_current());
SQL
cat >"$RUN/plain.sql" <<SQL
\set m random(1, $MERCHANTS)
UPDATE plain_balance SET balance = balance - 1 WHERE merchant_no = 'M' || lpad(:m::text, 15, '0') AND balance >= 1;
SQL
tps_of() { sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | tail -1; }
: >"$RUN/payout.tps"
: >"$RUN/plain.tps"
for ((r = 1; r <= RUNS; r++)); do
	for side in payout plain; do
		tps=$(PGOPTIONS='-c synchronous_commit=off' pgbench -n -M prepared -c 1 -T "$SECONDS_PER_RUN" -f "$RUN/$side.sql" "$DB" 2>&1 | tps_of)
		[ -n "$tps" ] || die "pgbench of $side failed"
		echo "$tps" >>"$RUN/$side.tps"
		say "$side $r/$RUNS: $tps tps"
	done
done
PAYOUT_TPS=$(median <"$RUN/payout.tps")
PLAIN_TPS=$(median <"$RUN/plain.tps")
# 8 clients, one merchant, 400 requests each of a 250th of its balance: more
# than it has
AVAILABLE_BEFORE=$(sqlrun -At -c "SELECT available FROM payidem.merchant_balance WHERE merchant_no = 'M000000000000001'")
EACH=$((AVAILABLE_BEFORE / 250))
[ "$EACH" -gt 0 ] || die "merchant M000000000000001 has nothing to pay out ($AVAILABLE_BEFORE)"
sqlrun >/dev/null <<SQL
CREATE FUNCTION bench_payout(out_no text) RETURNS integer LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM payidem.request_payout('M000000000000001', $EACH, out_no);
	RETURN 1;
EXCEPTION WHEN SQLSTATE 'PI010' THEN
	RETURN 0;
END
\$\$;
CREATE TABLE race_outcome (paid integer);
SQL
echo "INSERT INTO race_outcome SELECT bench_payout('R' || txid_current());" >"$RUN/race.sql"
pgbench -n -c 8 -j 4 -t 50 -f "$RUN/race.sql" "$DB" >"$RUN/race.log" 2>&1 || die "the payout race failed: $(tail -3 "$RUN/race.log")"
read -r PAID REFUSED AVAILABLE_AFTER <<<"$(sqlrun -At -F ' ' -c "SELECT (SELECT sum(paid) FROM race_outcome), (SELECT count(*) - sum(paid) FROM race_outcome), (SELECT available FROM payidem.merchant_balance WHERE merchant_no = 'M000000000000001')")"
[ "$AVAILABLE_AFTER" -ge 0 ] || die "the race overdrew the balance: $AVAILABLE_AFTER"
[ $((AVAILABLE_BEFORE - PAID * EACH)) = "$AVAILABLE_AFTER" ] || die "the race paid $PAID × $EACH from $AVAILABLE_BEFORE, leaving $AVAILABLE_AFTER"
[ "$AVAILABLE_AFTER" -lt "$EACH" ] || die "the race refused payouts that fitted: $PAID paid, $AVAILABLE_AFTER left, $EACH each"
VIOLATIONS=$(sqlrun -At -c "SELECT count(*) FROM payidem.verify()")
[ "$VIOLATIONS" = 0 ] || die "verify() found $VIOLATIONS violations"
say "race: $PAID paid, $REFUSED refused (PI010), $AVAILABLE_BEFORE -> $AVAILABLE_AFTER available; verify() empty"

SETTLE_X=$(ratio "$SETTLE_MS" "$FLOOR_MS")
GROWTH_X=$(ratio "$BIG_MS" "$SETTLE_MS")
PAYOUT_X=$(ratio "$PLAIN_TPS" "$PAYOUT_TPS")
thousands() { sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$1"; }
{
	echo "$(thousands "$N") items of one day over $(thousands "$MERCHANTS") merchants; medians of $RUNS runs each, alternating; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| run | settle() | floor (plain SQL) | settle() / floor |"
	echo "|---|---:|---:|---:|"
	echo "| $(thousands "$OLD_SMALL") older payments | $SETTLE_MS ms | $FLOOR_MS ms | ${SETTLE_X}× |"
	echo "| $(thousands "$((OLD_SMALL + OLD))") older payments | $BIG_MS ms | $BIG_FLOOR_MS ms | $(ratio "$BIG_MS" "$BIG_FLOOR_MS")× |"
	echo
	echo "Cost growth: settle() with $(thousands "$((OLD_SMALL + OLD))") older payments is ${GROWTH_X}× its cost with $(thousands "$OLD_SMALL")."
	echo
	echo "| call (1 client, synchronous_commit off) | tps | plain UPDATE / call |"
	echo "|---|---:|---:|"
	echo "| request_payout() | $PAYOUT_TPS | ${PAYOUT_X}× |"
	echo "| UPDATE … SET balance = balance - x WHERE balance >= x | $PLAIN_TPS | 1.00× |"
	echo
	echo "8 clients, 400 requests of $(thousands "$EACH") from one merchant's $(thousands "$AVAILABLE_BEFORE"): $PAID paid out, $REFUSED refused with PI010, $(thousands "$AVAILABLE_AFTER") left; verify() found nothing."
} | tee "$OUT.md"
printf 'settle() (1 M items)\t%s\nfloor\t%s\n' "$SETTLE_MS" "$FLOOR_MS" | sed 's/\t/\t1\t/' >"$OUT.tsv"
met() { awk -v x="$1" -v t="$2" 'BEGIN { print (x != "n/a" && x <= t) ? "yes" : "no" }'; }
{
	printf '%s\t%s\t%s\n' "settle() of a day ≤ 1.3× the plain-SQL floor" "${SETTLE_X}×" "$(met "$SETTLE_X" 1.3)"
	printf '%s\t%s\t%s\n' "settle() with $(thousands "$((OLD_SMALL + OLD))") older payments ≤ 1.2× with $(thousands "$OLD_SMALL")" "${GROWTH_X}×" "$(met "$GROWTH_X" 1.2)"
	printf '%s\t%s\t%s\n' "request_payout() ≤ 2× a plain UPDATE" "${PAYOUT_X}×" "$(met "$PAYOUT_X" 2)"
} >"$OUT.targets"
say "written: $OUT.md, $OUT.tsv, $OUT.targets"
