#!/usr/bin/env bash
# Benchmark of list_orders() (a benchmark, never a timed test): a page of 100
# of a merchant with N orders, newest first, against the plain index scan
# an application would write on the same table and index (the same rows, in
# the same order; as rows, and as JSON with to_jsonb), pgbench -M prepared,
# one client, alternating, RUNS of each, medians:
#   first page  list_orders(m)                      / ORDER BY order_no DESC LIMIT 100
#   deep page   list_orders(m, after => <the N/2-th>)  / ... AND order_no < <the N/2-th>
#   status      list_orders(m, status => 'pending')  / ... AND status = 'pending'
# Each side's page is checked against the other's once (the same order
# numbers), and the plain scan's plan is a backward index scan; a mismatch
# fails the run.  Starts its own throwaway cluster (port
# PAYIDEM_PORT or 55880).  Writes bench/out/lists.md, lists.tsv,
# lists.targets.
#
#   N (1000000)  RUNS (3)  SECONDS_PER_RUN (5)  SKIP_BUILD=1  QUICK=1: N 100000, RUNS 1, 2 s
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

if [ "${QUICK:-}" = 1 ]; then
	N=${N:-100000} RUNS=${RUNS:-1} SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
fi
N=${N:-1000000}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}

set_pg_paths
bench_build
RUN=$(make_run_dir bench-lists)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55880} cluster_start "$RUN" "shared_buffers = 256MB"
mkdir -p bench/out
OUT=bench/out/lists
rm -f "$OUT.md" "$OUT.tsv" "$OUT.targets"
DB=bench_lists
psql -X -q -d postgres -c "CREATE DATABASE $DB"
sqlrun() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
sqlrun -c "CREATE EXTENSION payidem"
say "set-up: $N orders of one merchant, $((N / 10)) of another"
t0=$(date +%s)
sqlrun -v n="$N" -f bench/lists_setup.sql >/dev/null
say "set-up took $(($(date +%s) - t0)) s"
M=M900000000000001
# the cursor of the deep page: the merchant's N/2-th newest order
AFTER=$(sqlrun -At -c "SELECT order_no FROM payidem.\"order\" WHERE merchant_no = '$M' ORDER BY order_no DESC OFFSET $((N / 2)) LIMIT 1")
[ -n "$AFTER" ] || die "no order at $((N / 2))"

# the three pages, each as list_orders(), as plain rows and as plain JSON
cols="o.order_no, o.merchant_no, o.out_trade_no, o.subject, o.amount, o.status, o.closed_at, o.created_at"
plain_where() {
	case $1 in
	first) echo "o.merchant_no = '$M'" ;;
	deep) echo "o.merchant_no = '$M' AND o.order_no < '$AFTER'" ;;
	status) echo "o.merchant_no = '$M' AND o.status = 'pending'" ;;
	esac
}
api_call() {
	case $1 in
	first) echo "payidem.list_orders('$M')" ;;
	deep) echo "payidem.list_orders('$M', '$AFTER')" ;;
	status) echo "payidem.list_orders('$M', status => 'pending')" ;;
	esac
}
for page in first deep status; do
	echo "SELECT x FROM $(api_call $page) x;" >"$RUN/$page.api.sql"
	echo "SELECT $cols FROM payidem.\"order\" o WHERE $(plain_where $page) ORDER BY o.order_no DESC LIMIT 100;" >"$RUN/$page.rows.sql"
	echo "SELECT to_jsonb(o) FROM payidem.\"order\" o WHERE $(plain_where $page) ORDER BY o.order_no DESC LIMIT 100;" >"$RUN/$page.json.sql"
	a=$(sqlrun -At -c "SELECT string_agg(x ->> 'order_no', ',') FROM $(api_call $page) x")
	b=$(sqlrun -At -c "SELECT string_agg(order_no, ',') FROM ($(sed 's/;$//' "$RUN/$page.rows.sql")) p")
	[ -n "$a" ] && [ "$a" = "$b" ] || die "the $page page differs: list_orders() and the plain scan do not return the same orders"
	[ "$(tr ',' '\n' <<<"$a" | wc -l)" = 100 ] || die "the $page page does not have 100 orders"
	sqlrun -c "EXPLAIN $(cat "$RUN/$page.rows.sql")" | grep -q "Index.* Scan Backward" ||
		die "the plain $page scan is not a backward index scan"
done

tps_of() { sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | tail -1; }
for page in first deep status; do
	for side in api rows json; do : >"$RUN/$page.$side.tps"; done
done
for ((r = 1; r <= RUNS; r++)); do
	for page in first deep status; do
		for side in api rows json; do
			tps=$(pgbench -n -M prepared -c 1 -T "$SECONDS_PER_RUN" -f "$RUN/$page.$side.sql" "$DB" 2>&1 | tps_of)
			[ -n "$tps" ] || die "pgbench of $page.$side failed"
			echo "$tps" >>"$RUN/$page.$side.tps"
			say "$page page, $side $r/$RUNS: $tps pages/s"
		done
	done
done

thousands() { sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$1"; }
: >"$OUT.tsv"
: >"$OUT.targets"
met() { awk -v x="$1" -v t="$2" 'BEGIN { print (x != "n/a" && x <= t) ? "yes" : "no" }'; }
{
	echo "A page of 100 orders of a merchant with $(thousands "$N") orders (another merchant's $(thousands "$((N / 10))") in the same index); pgbench -M prepared, 1 client, medians of $RUNS runs of ${SECONDS_PER_RUN} s each, alternating; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| page (pages per second) | list_orders() | plain index scan, rows | plain, to_jsonb | list_orders() cost / rows | / to_jsonb |"
	echo "|---|---:|---:|---:|---:|---:|"
	for page in first deep status; do
		api=$(median <"$RUN/$page.api.tps")
		rows=$(median <"$RUN/$page.rows.tps")
		json=$(median <"$RUN/$page.json.tps")
		x_rows=$(ratio "$rows" "$api")
		x_json=$(ratio "$json" "$api")
		case $page in
		first) label="first page" ;;
		deep) label="after the $(thousands "$((N / 2))")-th (keyset)" ;;
		status) label="status pending (1 in 5)" ;;
		esac
		echo "| $label | $(thousands "$(printf '%.0f' "$api")") | $(thousands "$(printf '%.0f' "$rows")") | $(thousands "$(printf '%.0f' "$json")") | ${x_rows}× | ${x_json}× |"
		printf '%s\t1\t%s\n' "list_orders(), $label" "$api" >>"$OUT.tsv"
		printf '%s\t1\t%s\n' "plain rows, $label" "$rows" >>"$OUT.tsv"
		printf '%s\t%s\t%s\n' "list_orders(), $label: a page ≤ 2× the plain index scan's cost, the scan writing the same JSON (to_jsonb)" "${x_json}×" "$(met "$x_json" 2)" >>"$OUT.targets"
		printf '%s\t%s\t%s\n' "list_orders(), $label, against the plain scan's bare rows (reported: the contract's JSON is most of it)" "${x_rows}×" "n/a" >>"$OUT.targets"
	done
	echo
	echo "Cost is the inverse of pages per second, so list_orders() / rows is the plain scan's rate over list_orders()'s."
} | tee "$OUT.md"
say "written: $OUT.md, $OUT.tsv, $OUT.targets"
