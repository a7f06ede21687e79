#!/usr/bin/env bash
# Benchmark: callback throughput through the PL/Proxy router vs direct to one
# shard, in the same run (bench/router_*.sql, pgbench -M prepared, -j at most 4).
#
#   first  the first success callback of a pending payment (state change,
#          idempotency key, order paid), a new payment each transaction
#   dup    a repeated callback of an already-paid payment ('duplicate')
#   hop    order_no_valid() of a payment number: the hop alone (routing,
#          wrapper, second backend, round trip), no shard work to speak of
#   bare   the first success callback through the bare PL/Proxy function
#          (_proxy_apply_payment_result: no error wrapper, no transaction
#          placement); direct: apply_payment_result, through the same
#          one-line SQL function bench_apply() on both sides
#
# "direct" runs pgbench against shard 0's database with a pool of shard 0's
# payments; "router" runs the same script against the router with a pool of
# payments spread over all shards.  Both pools are made directly on the shards
# (the rows create_order + begin_payment make): 1,000 paid payments for the
# repeated callbacks and POOL pending ones each, topped up between runs if
# need be, outside the timed runs (see top_up).  Every transaction first reads
# its payment number from a local table (bench_pay), in both cases.  Every
# point runs RUNS times, round-robin over the points; the medians of tps and
# latency count.
#
# CLIENTS is "1 8", not "1 8 32": the shards, the router and pgbench all share
# this machine's CPUs, and with 32 clients (and a router backend forwarding
# each of them to a shard backend) the run measures the scheduler rather than
# the hop.
#
# Starts its own cluster with scripts/cluster (SHARDS shards + router, its
# ports from 56000, fsync off) and stops it on exit.  Writes
# bench/out/router.md (tables), router.tsv (chart: tps by clients, direct and
# router, first and dup) and router.targets (the overhead per call; the
# project sets no target for it).
#
#   SHARDS (2)  SECONDS_PER_RUN (2)  RUNS (3)  CLIENTS ("1 8")  POOL (6000)
#   SKIP_BUILD=1 (or PAYIDEM_SKIP_BUILD=1)
#   QUICK=1: RUNS 1, 1 s per point, POOL 3000
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

if [ "${QUICK:-}" = 1 ]; then
	SECONDS_PER_RUN=${SECONDS_PER_RUN:-1} RUNS=${RUNS:-1} POOL=${POOL:-3000}
fi
SHARDS=${SHARDS:-2}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
RUNS=${RUNS:-3}
CLIENTS=${CLIENTS:-"1 8"}
POOL=${POOL:-6000}
if [ "${SKIP_BUILD:-}" = 1 ]; then export PAYIDEM_SKIP_BUILD=1; fi
mkdir -p bench/out
OUT=bench/out/router
rm -f "$OUT.md" "$OUT.tsv" "$OUT.targets"

set_pg_paths
bash scripts/cluster start "$SHARDS" >/dev/null
trap 'bash scripts/cluster stop >/dev/null' EXIT

# .run/cluster.state rows: name dir sockdir port
ROUTER_PORT=$(awk '$1 == "router" {print $4}' "$ROOT/.run/cluster.state")
shard_port() { awk -v n="shard$1" '$1 == n {print $4}' "$ROOT/.run/cluster.state"; }
port_of() { if [ "$1" = direct ]; then shard_port 0; else echo "$ROUTER_PORT"; fi; }
# scratch files next to the cluster's data directories
WORK=$(dirname "$(awk '$1 == "shard0" {print $2}' "$ROOT/.run/cluster.state")")

q() { local port=$1; shift; as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d payidem "$@"; }

say "reference data through the router"
M=$(q "$ROUTER_PORT" -Atc "SELECT merchant_no FROM payidem.create_merchant('Bench Shop', 'retail', 0.006)")
q "$ROUTER_PORT" -c "SELECT payidem.create_channel('BENCH_WX', 'wechat', 0.002)" \
	-c "SELECT payidem.bind_channel('$M', 'BENCH_WX')" >/dev/null

# bench_pay and its sequence on shard 0 (direct) and on the router: the first
# 1,000 payments are paid at set-up, for the repeated callbacks
q "$(shard_port 0)" -c 'CREATE TABLE bench_pay (id bigint PRIMARY KEY, payment_no text NOT NULL)' -c 'CREATE SEQUENCE bench_seq START 1001'
q "$ROUTER_PORT" -c 'CREATE TABLE bench_pay (id bigint PRIMARY KEY, payment_no text NOT NULL)' -c 'CREATE SEQUENCE bench_seq START 1001'
for target in direct router; do
	q "$(port_of "$target")" -c "CREATE FUNCTION bench_apply(p text, s text, st text, t text, a bigint) RETURNS text
		LANGUAGE sql RETURN payidem.$([ "$target" = router ] && echo _proxy_)apply_payment_result(p, s, st, t, a)"
done
# make_pool PORT TAG COUNT: COUNT pending payments on a shard, orders
# BENCH-<TAG>-<i>
make_pool() {
	q "$1" -v merchant="$M" -v tag="$2" -v n="$3" -f bench/router_pool.sql >/dev/null
}
# add_pool TARGET COUNT: COUNT more payments at the end of TARGET's bench_pay.
# MADE[target] = payments in the pool, USED[target] = taken so far (the
# sequence changes only in 'first' runs of that target), MOST[target] = the
# most one run has used, USE[target,clients] = what the last run used,
# LOST[target] = ids taken past the end of the pool (by a run that found it
# empty)
declare -A MADE USED MOST USE LOST BATCH
for target in direct router; do
	MADE[$target]=0 USED[$target]=1000 MOST[$target]=0 LOST[$target]=0 BATCH[$target]=0
done
add_pool() {
	local target=$1 n=$2 b tag i per_shard
	b=$((BATCH[$target] += 1))
	if [ "$target" = direct ]; then
		tag=D${b}b
		make_pool "$(shard_port 0)" "$tag" "$n"
		q "$(shard_port 0)" -c "INSERT INTO bench_pay SELECT ${MADE[direct]} + row_number() OVER (ORDER BY p.payment_no), p.payment_no
			FROM payidem.payment p JOIN payidem.\"order\" o USING (order_no) WHERE o.out_trade_no LIKE 'BENCH-$tag%'"
	else
		tag=R${b}b per_shard=$(((n + SHARDS - 1) / SHARDS))
		: >"$WORK/router-pool.txt"
		for ((i = 0; i < SHARDS; i++)); do
			make_pool "$(shard_port $i)" "$tag" "$per_shard"
			q "$(shard_port $i)" -Atc "COPY (SELECT p.payment_no FROM payidem.payment p JOIN payidem.\"order\" o USING (order_no)
				WHERE o.out_trade_no LIKE 'BENCH-$tag%') TO STDOUT" >>"$WORK/router-pool.txt"
		done
		n=$((per_shard * SHARDS))
		# interleave the shards' payments so consecutive ids hit different shards
		sort -t '|' -k1.19,1.24 "$WORK/router-pool.txt" | awk -v k="${MADE[router]}" '{print k + NR "\t" $0}' \
			| q "$ROUTER_PORT" -c 'COPY bench_pay FROM STDIN'
	fi
	MADE[$target]=$((MADE[$target] + n))
}
used() { q "$(port_of "$1")" -Atc "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM bench_seq"; }
# top_up TARGET CLIENTS: before a 'first' run, leave twice what the point
# used last time (and at least the most any run has used), or the first time
# three times the most any run has used (and at least half of POOL); add a
# run's worth more, so that the next run seldom needs another top-up
top_up() {
	local target=$1 clients=$2 left need
	left=$((MADE[$target] - USED[$target]))
	if [ -n "${USE[$target,$clients]:-}" ]; then
		need=$((2 * USE[$target,$clients] + 100)); [ "$need" -ge "${MOST[$target]}" ] || need=${MOST[$target]}
	else
		need=$((3 * MOST[$target])); [ "$need" -ge $((POOL / 2)) ] || need=$((POOL / 2))
	fi
	[ "$left" -lt "$need" ] || return 0
	say "pool for $target: $left left, adding $((need - left + MOST[$target]))"
	add_pool "$target" $((need - left + MOST[$target]))
}

say "pools of pending payments ($POOL direct on shard 0, $POOL through the router over $SHARDS shards)"
add_pool direct $((1000 + POOL))
add_pool router $((1000 + POOL))
# the first 1,000 of each pool paid, on the shard that holds them
FIRST=$(q "$ROUTER_PORT" -Atc 'SELECT array_agg(payment_no) FROM bench_pay WHERE id <= 1000')
for ((i = 0; i < SHARDS; i++)); do
	q "$(shard_port $i)" -v list="$FIRST" >/dev/null <<-'SQL'
		SELECT count(payidem.apply_payment_result(p, 'callback', 'succeeded', 'T' || p, 100))
		  FROM unnest(:'list'::text[]) p WHERE EXISTS (SELECT FROM payidem.payment x WHERE x.payment_no = p);
	SQL
done
q "$(shard_port 0)" -c "SELECT count(payidem.apply_payment_result(payment_no, 'callback', 'succeeded', 'T' || payment_no, 100))
	FROM bench_pay WHERE id <= 1000" >/dev/null

run() {	# target script clients -> "tps latency_ms"
	local target=$1 script=$2 clients=$3 log
	log=$WORK/pgbench-$target-$script-$clients.log
	as_pg "$PGBIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$(port_of "$target")" -U postgres \
		-c "$clients" -j "$((clients < 4 ? clients : 4))" -T "$SECONDS_PER_RUN" -f "bench/router_$script.sql" payidem >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $target $script $clients"; }
	grep -q 'number of failed transactions: 0 ' "$log" || { cat "$log" >&2; die "failed transactions: $target $script $clients"; }
	echo "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1) $(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$log")"
}

# measure TARGET SCRIPT CLIENTS: one run of a point into TPS and LAT.  A
# 'first' run that found its pool empty (the machine was faster than the last
# runs said; a missing payment makes the SELECT return no row, not an error)
# does not count (its no-op transactions made it look fast): the pool is
# topped up from what it used and the point runs again.
declare -A TPS LAT
measure() {
	local target=$1 script=$2 clients=$3 res n
	for _ in 1 2 3; do
		[ "$script" = dup ] || [ "$script" = hop ] || top_up "$target" "$clients"
		res=$(run "$target" "$script" "$clients")
		[ "$script" = first ] || [ "$script" = bare ] || break
		n=$(($(used "$target") - USED[$target]))
		USED[$target]=$((USED[$target] + n)) USE[$target,$clients]=$n
		if [ "${USED[$target]}" -le "${MADE[$target]}" ]; then
			[ "$n" -le "${MOST[$target]}" ] || MOST[$target]=$n
			break
		fi
		say "pool for $target ran out; running the point again"
		LOST[$target]=$((LOST[$target] + USED[$target] - MADE[$target]))
		res=""
	done
	[ -n "$res" ] || die "pool for $target ran out three times"
	read -r t l <<<"$res"
	TPS[$target,$script,$clients]+=" $t" LAT[$target,$script,$clients]+=" $l"
}

# TPS / LAT [target,script,clients] = the values of every run, space-separated
for ((r = 1; r <= RUNS; r++)); do
	for clients in $CLIENTS; do
		for script in first bare dup hop; do
			for target in direct router; do
				say "run $r/$RUNS: $script, $clients client(s), $target"
				measure "$target" "$script" "$clients"
			done
		done
	done
done
# every first callback paid exactly one payment of its pool (orders BENCH-D...
# on shard 0, BENCH-R... on all shards)
paid() {	# tag port...
	local tag=$1 port n=0; shift
	for port in "$@"; do
		n=$((n + $(q "$port" -Atc "SELECT count(*) FROM payidem.payment p JOIN payidem.\"order\" o USING (order_no)
			WHERE o.out_trade_no LIKE 'BENCH-$tag%' AND p.status = 'succeeded'")))
	done
	echo "$n"
}
SHARD_PORTS=$(for ((i = 0; i < SHARDS; i++)); do shard_port $i; done)
# shellcheck disable=SC2086
for check in "direct $(paid D "$(shard_port 0)")" "router $(paid R $SHARD_PORTS)"; do
	read -r target n <<<"$check"
	[ "$n" -eq $((USED[$target] - LOST[$target])) ] \
		|| die "check failed: $n payments of the $target pool paid, $((USED[$target] - LOST[$target])) first callbacks made"
done

tps() { median <<<"${TPS[$1,$2,$3]}"; }
lat() { median <<<"${LAT[$1,$2,$3]}"; }
added() { awk -v r="$(lat router "$1" "$2")" -v d="$(lat direct "$1" "$2")" 'BEGIN {printf "%.3f", r - d}'; }
OVERHEAD=$(for clients in $CLIENTS; do for script in first bare dup hop; do added "$script" "$clients"; echo; done; done \
	| sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf (lo == hi) ? "%s" : "%s–%s", lo, hi}')
{
	echo "$(date -u +%Y-%m-%d), $(nproc) CPUs, PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), PL/Proxy $(q "$ROUTER_PORT" -Atc "SELECT extversion FROM pg_extension WHERE extname = 'plproxy'");"
	echo "$SHARDS shards + 1 router, all on this one machine (scripts/cluster: fsync off); pgbench -M prepared,"
	echo "median of $RUNS run(s) of ${SECONDS_PER_RUN} s per point."
	echo
	echo "| workload | clients | direct tps | router tps | direct latency ms | router latency ms | added per call ms |"
	echo "|---|---:|---:|---:|---:|---:|---:|"
	for clients in $CLIENTS; do
		for script in first bare dup hop; do
			printf '| %s | %s | %.0f | %.0f | %.3f | %.3f | %s |\n' "$script" "$clients" \
				"$(tps direct "$script" "$clients")" "$(tps router "$script" "$clients")" \
				"$(lat direct "$script" "$clients")" "$(lat router "$script" "$clients")" "$(added "$script" "$clients")"
		done
	done
	echo
	echo "Added per call (router latency minus direct latency): $OVERHEAD ms."
} | tee "$OUT.md"

for script in first bare dup hop; do
	for target in direct router; do
		for clients in $CLIENTS; do
			printf '%s %s\t%s\t%.0f\n' "$target" "$script" "$clients" "$(tps "$target" "$script" "$clients")"
		done
	done
done >"$OUT.tsv"
printf '%s\t%s\t%s\n' "router overhead per call (ms)" "$OVERHEAD" "n/a" >"$OUT.targets"
say "written: $OUT.md, $OUT.tsv, $OUT.targets"
