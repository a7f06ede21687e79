#!/usr/bin/env bash
# The CPU the PL/Proxy router adds to a call, in instructions (callgrind): the
# router's backend plus every shard backend that served the call, less the
# same call made directly on the shard, all in one run.
#
# A cluster of SHARDS shards and a router (scripts/cluster) is set up, then
# the router and the shards are started again under valgrind's callgrind,
# every process writing its own count.  Each call is made in a psql session
# as a driver makes it (PREPARE once, then EXECUTE with each call's literal
# argument), N1 times in one session and N2 times in another, both through
# the router and directly on shard 0; a call's cost in a process is the
# difference of the two sessions' counts divided by N2 - N1, so what a
# session costs once (its connection, PL/Proxy's connection to a shard, the
# first plans) is not in it.  The shard backends of a router session are the
# client backends the shards have while it runs (nothing else connects).
#
#   gen_order_no   RUN ON ANY on the router
#   dup            apply_payment_result() of a paid payment (duplicate)
#   get_order      get_order() of an order
#   first          apply_payment_result() of a pending payment (applied)
#
# Called by bench/instructions.sh (PARTS=... router); writes
# $OUT_DIR/instructions.router: call, router backend, shard backends, direct,
# added (router + shards - direct), one line per call.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

SHARDS=${SHARDS:-2}
N1=${ROUTER_N1:-40}
N2=${ROUTER_N2:-240}
OUT_FILE=${1:?usage: router_instructions.sh OUTPUT}
CALLS=(gen_order_no dup get_order first)

ensure_valgrind
set_pg_paths
export PAYIDEM_SKIP_BUILD=1		# bench_build has installed it
bash scripts/cluster start "$SHARDS" >/dev/null
STATE=$ROOT/.run/cluster.state
VG_PIDS=()
stop_all() {
	local name dir
	while read -r name dir _; do
		as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w -t 120 stop >/dev/null 2>&1 || true
	done < <(grep -v '^#' "$STATE")
	for p in "${VG_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	# the counts, for callgrind_annotate (the cluster's directory goes)
	rm -rf "$ROOT/.run/router-callgrind"
	[ -d "${CG:-}" ] && cp -r "$CG" "$ROOT/.run/router-callgrind" && cp "$WORK"/*.pids "$ROOT/.run/router-callgrind/" 2>/dev/null
	bash scripts/cluster stop >/dev/null 2>&1 || true
}
trap stop_all EXIT

row() { awk -v n="$1" '$1 == n' "$STATE"; }
sock_of() { row "$1" | awk '{print $3}'; }
port_of() { row "$1" | awk '{print $4}'; }
dir_of() { row "$1" | awk '{print $2}'; }
q() { local who=$1; shift; as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(sock_of "$who")" -p "$(port_of "$who")" -U postgres -d payidem "$@"; }
WORK=$(dirname "$(dir_of router)")
CG=$WORK/callgrind
mkdir -p "$CG"; is_root && chown postgres: "$CG"

# reference data through the router; pools made directly on shard 0: pending
# payments for the first successes (N1 + N2 each for the router and direct),
# paid ones for the duplicates and get_order
M=$(q router -Atc "SELECT merchant_no FROM payidem.create_merchant('Bench Shop', 'retail', 0.006)")
q router -c "SELECT payidem.create_channel('BENCH_WX', 'wechat', 0.002)" -c "SELECT payidem.bind_channel('$M', 'BENCH_WX')" >/dev/null
for tag in R D P; do
	q shard0 -v merchant="$M" -v tag="$tag" -v n=$((N1 + N2)) -f bench/router_pool.sql >/dev/null
done
# pool TAG -> the payment numbers of orders BENCH-TAG-*, in order
pool() {
	q shard0 -Atc "SELECT p.payment_no FROM payidem.payment p JOIN payidem.\"order\" o USING (order_no)
		WHERE o.out_trade_no LIKE 'BENCH-$1-%' ORDER BY substr(o.out_trade_no, 9)::int"
}
pool R >"$WORK/pool.R"; pool D >"$WORK/pool.D"; pool P >"$WORK/pool.P"
# pool P paid through the router, as an application's first successes are:
# a duplicate finds its transaction id placed
q router -c "SELECT count(payidem.apply_payment_result(p, 'callback', 'succeeded', 'T' || p, 100))
	FROM unnest(string_to_array('$(tr '\n' ' ' <"$WORK/pool.P" | xargs)', ' ')) p" >/dev/null
q shard0 -Atc "SELECT o.order_no FROM payidem.\"order\" o WHERE o.out_trade_no LIKE 'BENCH-P-%' ORDER BY 1" >"$WORK/pool.O"
# a router in service: the placements of 10,000 past successes (so that its
# look-ups go through the index, as they do once the table has grown)
q router -c "INSERT INTO payidem.transaction_placement (transaction_id, partition)
	SELECT 'PAST-' || i, i % $SHARDS FROM generate_series(1, 10000) i" >/dev/null
q router -c 'ANALYZE' >/dev/null; q shard0 -c 'ANALYZE' >/dev/null

# every server again, under callgrind (each process its own file, by pid)
while read -r name dir _; do
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
	as_pg valgrind --tool=callgrind --callgrind-out-file="$CG/cg.%p" --trace-children=no \
		"$PGBIN/postgres" -D "$dir/data" >"$dir/valgrind.log" 2>&1 &
	VG_PIDS+=($!)
done < <(grep -v '^#' "$STATE")
for who in $(grep -v '^#' "$STATE" | awk '{print $1}'); do
	for _ in $(seq 1 240); do
		as_pg "$PGBIN/pg_isready" -q -h "$(sock_of "$who")" -p "$(port_of "$who")" && break
		sleep 0.5
	done
	as_pg "$PGBIN/pg_isready" -q -h "$(sock_of "$who")" -p "$(port_of "$who")" || die "$who did not start under valgrind"
done

# script CALL WHERE N FIRST -> a psql script of N calls from line FIRST of its pool
script() {
	local call=$1 where=$2 n=$3 first=$4 f="$WORK/$1.$2.$3.sql" prep list
	case $call in
	gen_order_no) prep="PREPARE s(text) AS SELECT payidem.gen_order_no(\$1);" list=- ;;
	dup) prep="PREPARE s(text) AS SELECT payidem.apply_payment_result(\$1, 'callback', 'succeeded', 'T' || \$1, 100);" list=$WORK/pool.P ;;
	get_order) prep="PREPARE s(text) AS SELECT payidem.get_order(\$1) IS NOT NULL;" list=$WORK/pool.O ;;
	first) prep="PREPARE s(text) AS SELECT payidem.apply_payment_result(\$1, 'callback', 'succeeded', 'T' || \$1, 100);"
		list=$WORK/pool.$([ "$where" = router ] && echo R || echo D) ;;
	esac
	{
		echo "SELECT 'pid=' || pg_backend_pid();"
		echo "$prep"
		if [ "$list" = - ]; then
			for ((i = 0; i < n; i++)); do echo "EXECUTE s('PO');"; done
		else
			sed -n "${first},$((first + n - 1))p" "$list" | awk '{printf "EXECUTE s(%c%s%c);\n", 39, $1, 39}'
		fi
		# the shards' backends of this session, while it still holds them
		if [ "$where" = router ]; then
			for s in $(grep '^shard' "$STATE" | awk '{print $1}'); do
				echo "\\! $PGBIN/psql -X -At -h $(sock_of "$s") -p $(port_of "$s") -U postgres -d payidem -c \"SELECT 'shardpid=' || pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()\""
			done
		fi
	} >"$f"
	is_root && chown postgres: "$f"
	echo "$f"
}

# count PID -> the instructions of that process (its file is written when it exits)
count() {
	local f=$CG/cg.$1
	for _ in $(seq 1 120); do
		grep -q '^summary:\|^totals:' "$f" 2>/dev/null && break
		sleep 0.5
	done
	awk '/^summary:/ {print $2; exit}' "$f"
}

# quiet: no client backend left on any server (the backends of the session
# before, and PL/Proxy's on the shards, end after it), so that a session's
# shard backends are its own
quiet() {
	local who n
	for who in $(grep -v '^#' "$STATE" | awk '{print $1}'); do
		for _ in $(seq 1 240); do
			n=$(q "$who" -Atc "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
			[ "$n" -eq 0 ] && break
			sleep 0.5
		done
		[ "$n" -eq 0 ] || die "$who still has $n client backend(s)"
	done
}

# session CALL WHERE N FIRST -> "backend shards": the instructions of the
# session's own backend and of the shard backends that served it
session() {
	local call=$1 where=$2 n=$3 first=$4 out pid sp total=0
	quiet
	out=$(q "$where" -At -f "$(script "$call" "$where" "$n" "$first")" 2>&1) || { echo "$out" >&2; die "$call through $where failed"; }
	case $call in
	dup) [ "$(grep -c '^duplicate$' <<<"$out")" -eq "$n" ] || die "$call through $where: not $n duplicates" ;;
	first) [ "$(grep -c '^applied$' <<<"$out")" -eq "$n" ] || die "$call through $where: not $n applied" ;;
	get_order) [ "$(grep -c '^t$' <<<"$out")" -eq "$n" ] || die "$call through $where: not $n orders" ;;
	esac
	pid=$(sed -n 's/^pid=//p' <<<"$out")
	echo "$call $where $n backend $pid shards $(sed -n 's/^shardpid=//p' <<<"$out" | tr '\n' ' ')" >>"$WORK/sessions.pids"
	for sp in $(sed -n 's/^shardpid=//p' <<<"$out"); do
		# (the psql of \! has gone: its backend is not one of them)
		total=$((total + $(count "$sp" || echo 0)))
	done
	# the session's backends end with it
	echo "$(count "$pid") $total"
}

: >"$OUT_FILE"
for call in "${CALLS[@]}"; do
	read -r r1 s1 < <(session "$call" router "$N1" 1)
	read -r r2 s2 < <(session "$call" router "$N2" $((N1 + 1)))
	read -r d1 _ < <(session "$call" shard0 "$N1" 1)
	read -r d2 _ < <(session "$call" shard0 "$N2" $((N1 + 1)))
	n=$((N2 - N1))
	r=$(( (r2 - r1) / n )) s=$(( (s2 - s1) / n )) d=$(( (d2 - d1) / n ))
	printf '%s %d %d %d %d\n' "$call" "$r" "$s" "$d" $((r + s - d)) | tee -a "$OUT_FILE"
done
