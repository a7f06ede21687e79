#!/usr/bin/env bash
# Benchmark: gen_order_no() against what a team would use instead —
# nextval() (default cache and CACHE 100), gen_random_uuid(), a PL/pgSQL
# function building the same 26-character number from a sequence, and a
# Redis counter (INCR, the number then formatted by the application).
#
#   1. per-call cost inside the server: SELECT count(f()) FROM
#      generate_series(1, N), minus the same loop without a call; median of
#      RUNS runs, in nanoseconds per call (does not apply to Redis);
#   2. throughput, one round trip per number: pgbench -M prepared of
#      "SELECT f()" and redis-benchmark of INCR (no pipelining), at CLIENTS
#      clients with min(clients, 4) client threads, median of RUNS runs of
#      about SECONDS_PER_RUN seconds each.
#
# Starts its own throwaway cluster (fsync on, port PAYIDEM_PORT or the first
# free one from 55810) and its own redis-server (persistence off: the most
# favourable setting for Redis), stops both on exit.  Both are reached the
# same way, over a Unix socket in the cluster's socket directory
# (redis-server listens on no TCP port).  Prints a Markdown
# report and writes it to bench/out/order_no.md, and the throughput points to
# bench/out/order_no.tsv (series, clients, calls per second; tab-separated,
# no header).
#
#   N (300000)  RUNS (3)  SECONDS_PER_RUN (2)  CLIENTS ("1 8 32")
#   REDIS_N (requests per redis-benchmark run; unset: sized to SECONDS_PER_RUN)
#   SKIP_BUILD=1  QUICK=1 (rough: 1 and 8 clients, about 15 s of measuring)
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

N=${N:-300000}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
CLIENTS=${CLIENTS:-"1 8 32"}
REDIS_N=${REDIS_N:-}
if [ "${QUICK:-}" = 1 ]; then N=200000; RUNS=1; SECONDS_PER_RUN=1; REDIS_N=20000; CLIENTS="1 8"; fi

# Redis is needed by this benchmark only: make test does not install it.
ensure_redis() {
	# ensure_packages reads PACKAGES; a local array shadows the global list
	# for the duration of this call.
	# shellcheck disable=SC2034
	local PACKAGES=(redis-server redis-tools)
	ensure_packages
}

# redis_start: redis-server not daemonized, as a background job of this shell,
# run as the server user, its data directory under the run directory.
# REDIS_PID is its own PID (setpriv execs it: no process in between), the one
# redis_stop ends.
REDIS_PID=
redis_start() {
	local dir=$RUN/redis as=()
	mkdir -p "$dir"
	if is_root; then
		chown postgres: "$dir"
		as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
	fi
	REDIS_SOCK=$CLUSTER_SOCKDIR/redis.sock
	"${as[@]}" redis-server --port 0 --unixsocket "$REDIS_SOCK" --unixsocketperm 700 \
		--save '' --appendonly no --daemonize no \
		--dir "$dir" --logfile "$dir/redis.log" &
	REDIS_PID=$!
	for _ in $(seq 50); do
		if [ "$(redis-cli -s "$REDIS_SOCK" ping 2>/dev/null)" = PONG ]; then
			[ "$(cat "/proc/$REDIS_PID/comm" 2>/dev/null)" = redis-server ] \
				|| die "PID $REDIS_PID is not the redis-server this script started"
			return 0
		fi
		kill -0 "$REDIS_PID" 2>/dev/null || break
		sleep 0.1
	done
	tail -20 "$dir/redis.log" >&2 || true
	die "redis-server did not start on $REDIS_SOCK"
}

redis_stop() {
	[ -n "$REDIS_PID" ] || return 0
	kill "$REDIS_PID" 2>/dev/null || true
	wait "$REDIS_PID" 2>/dev/null || true
	REDIS_PID=
}

cleanup() {
	redis_stop
	cluster_stop
}

set_pg_paths
bench_build
ensure_redis
RUN=$(make_run_dir bench-order-no)
trap cleanup EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55810} cluster_start "$RUN" "fsync = on" "synchronous_commit = on" "max_connections = 100"
redis_start
REDIS_VERSION=$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
say "redis-server $REDIS_VERSION on $REDIS_SOCK (PID $REDIS_PID)"
mkdir -p bench/out
OUT=bench/out/order_no.md
TSV=bench/out/order_no.tsv
DB=bench_order_no

psql -X -q -d postgres -c "CREATE DATABASE $DB"
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" <<'SQL'
CREATE EXTENSION payidem;
CREATE SEQUENCE seq_default;
CREATE SEQUENCE seq_cache100 CACHE 100;
CREATE SEQUENCE seq_plpgsql;

-- The same 26-character format built the plain way: prefix, UTC second,
-- shard, a sequence value modulo 1,000,000, ISO 7064 MOD 97-10 digits.
CREATE FUNCTION plpgsql_order_no(prefix text DEFAULT 'PO') RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	body   text;
	digits text := '';
	ch     text;
BEGIN
	body := prefix
		|| to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISS')
		|| lpad(current_setting('payidem.shard_id'), 2, '0')
		|| lpad((nextval('seq_plpgsql') % 1000000)::text, 6, '0');
	FOREACH ch IN ARRAY regexp_split_to_array(body, '') LOOP
		IF ch BETWEEN 'A' AND 'Z' THEN
			digits := digits || (ascii(ch) - 55)::text;
		ELSE
			digits := digits || ch;
		END IF;
	END LOOP;
	RETURN body || lpad((98 - ((digits || '00')::numeric % 97))::text, 2, '0');
END
$$;

CREATE FUNCTION bench_ms(query text) RETURNS numeric
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz;
BEGIN
	t0 := clock_timestamp();
	EXECUTE query;
	RETURN extract(epoch FROM clock_timestamp() - t0) * 1000;
END
$$;
SQL

# sanity: the baseline really produces valid numbers of the same shape
psql -X -q -At -d "$DB" -c "SELECT payidem.order_no_valid(plpgsql_order_no())" | grep -qx t \
	|| die "plpgsql_order_no() does not produce valid numbers"

declare -A CALL=(
	[gen_order_no]="payidem.gen_order_no()"
	[nextval]="nextval('seq_default')"
	[nextval_cache100]="nextval('seq_cache100')"
	[gen_random_uuid]="gen_random_uuid()"
	[plpgsql_order_no]="plpgsql_order_no()"
)
ORDER=(gen_order_no nextval nextval_cache100 gen_random_uuid plpgsql_order_no)
# series names in the chart data
declare -A SERIES=(
	[gen_order_no]="gen_order_no()"
	[nextval]="nextval()"
	[nextval_cache100]="nextval() CACHE 100"
	[gen_random_uuid]="gen_random_uuid()"
	[plpgsql_order_no]="plpgsql_order_no()"
	[redis]="redis INCR"
)

threads() { echo $(( $1 < 4 ? $1 : 4 )); }

T0=$SECONDS
say "per-call cost, $N calls, median of $RUNS"
loop_ms() {
	local expr=$1
	for _ in $(seq "$RUNS"); do
		psql -X -q -At -d "$DB" -c "SELECT bench_ms('SELECT count($expr) FROM generate_series(1, $N)')"
	done | median
}
declare -A NS
empty=$(loop_ms "1")
for name in "${ORDER[@]}"; do
	ms=$(loop_ms "${CALL[$name]//\'/\'\'}")
	NS[$name]=$(awk -v a="$ms" -v b="$empty" -v n="$N" 'BEGIN {printf "%.0f", (a - b) * 1e6 / n}')
	echo "  $name: ${NS[$name]} ns/call"
done

# pgbench_tps NAME CLIENTS -> tps of one run
pgbench_tps() {
	local name=$1 c=$2 log tps
	log=$RUN/pgbench-$name-$c.log
	pgbench -n -M prepared -c "$c" -j "$(threads "$c")" -T "$SECONDS_PER_RUN" \
		-f "$RUN/$name.sql" "$DB" >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $name, $c clients"; }
	tps=$(awk '/^tps = / {printf "%.0f\n", $3}' "$log" | tail -1)
	[ -n "$tps" ] || { cat "$log" >&2; die "no tps from pgbench: $name, $c clients"; }
	echo "$tps"
}

say "pgbench -M prepared, ${SECONDS_PER_RUN}s x $RUNS per point, clients: $CLIENTS"
declare -A TPS
for name in "${ORDER[@]}"; do
	echo "SELECT ${CALL[$name]};" >"$RUN/$name.sql"
	for c in $CLIENTS; do
		TPS[$name,$c]=$(for _ in $(seq "$RUNS"); do pgbench_tps "$name" "$c"; done | median)
		echo "  $name, $c clients: ${TPS[$name,$c]} tps"
	done
done

# redis_rps CLIENTS REQUESTS -> requests per second of one run
redis_rps() {
	local c=$1 n=$2 out rps
	out=$(redis-benchmark -s "$REDIS_SOCK" -t incr -P 1 -c "$c" --threads "$(threads "$c")" \
		-n "$n" --csv 2>&1) || { echo "$out" >&2; die "redis-benchmark failed: $c clients"; }
	rps=$(echo "$out" | awk -F'","' '/^"INCR"/ {printf "%.0f\n", $2}')
	[ -n "$rps" ] || { echo "$out" >&2; die "no result from redis-benchmark: $c clients"; }
	echo "$rps"
}

# redis-benchmark counts requests, not seconds: unless REDIS_N is given, a
# short warm-up run at each client count sizes the measured runs to about
# SECONDS_PER_RUN seconds.
say "redis-benchmark INCR, no pipelining, ${REDIS_N:-~${SECONDS_PER_RUN}s worth of} requests x $RUNS per point, clients: $CLIENTS"
for c in $CLIENTS; do
	if [ -n "$REDIS_N" ]; then
		n=$REDIS_N
	else
		n=$(( $(redis_rps "$c" 10000) * SECONDS_PER_RUN ))
		[ "$n" -ge 10000 ] || n=10000
	fi
	TPS[redis,$c]=$(for _ in $(seq "$RUNS"); do redis_rps "$c" "$n"; done | median)
	echo "  redis INCR, $c clients: ${TPS[redis,$c]} requests/s ($n requests per run)"
done
redis_stop
say "measured in $((SECONDS - T0)) s"

for name in "${ORDER[@]}" redis; do
	for c in $CLIENTS; do
		printf '%s\t%s\t%s\n' "${SERIES[$name]}" "$c" "${TPS[$name,$c]}"
	done
done >"$TSV"

LAST=$(echo "$CLIENTS" | awk '{print $NF}')
# the backquotes in the report are Markdown, not command substitutions
# shellcheck disable=SC2016
{
	echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
		"PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), fsync on, N = $N, median of $RUNS;" \
		"Redis $REDIS_VERSION, persistence off."
	echo
	echo "Calls per second: pgbench -M prepared tps of \`SELECT f()\`, or redis-benchmark requests/s of" \
		"\`INCR\` without pipelining — one round trip per number in both, over a Unix socket," \
		"min(clients, 4) client threads, ${SECONDS_PER_RUN} s per run, client and server on the same machine."
	echo
	echo "| function | ns per call (in-server loop) | vs gen_order_no |$(for c in $CLIENTS; do printf ' calls/s, %s client(s) |' "$c"; done)"
	echo "|---|---:|---:|$(for c in $CLIENTS; do printf -- '---:|'; done)"
	for name in "${ORDER[@]}"; do
		printf '| `%s` | %s | %s |' "${CALL[$name]}" "${NS[$name]}" "$(ratio "${NS[$name]}" "${NS[gen_order_no]}")"
		for c in $CLIENTS; do printf ' %s |' "${TPS[$name,$c]}"; done
		echo
	done
	printf '| Redis `INCR` + formatting in the application | n/a | n/a |'
	for c in $CLIENTS; do printf ' %s |' "${TPS[redis,$c]}"; done
	echo
	echo
	echo "Targets: per-call cost <= nextval()'s: $(ratio "${NS[gen_order_no]}" "${NS[nextval]}")x;" \
		"PL/pgSQL / gen_order_no: $(ratio "${NS[plpgsql_order_no]}" "${NS[gen_order_no]}")x (target >= 3);" \
		"pgbench gen_order_no / nextval at $LAST clients:" \
		"$(ratio "${TPS[gen_order_no,$LAST]}" "${TPS[nextval,$LAST]}")x (target >= 1)."
	echo
	echo "gen_order_no() / Redis INCR:$(for c in $CLIENTS; do
		printf ' %sx at %s client(s);' "$(ratio "${TPS[gen_order_no,$c]}" "${TPS[redis,$c]}")" "$c"
	done | sed 's/;$/./')" \
		"The Redis figure is an upper bound per number, not an end-to-end order insert:" \
		"persistence is off (a counter that can go back after a restart), the formatting in the" \
		"application is not counted, and the order row still needs its own round trip to PostgreSQL," \
		"while gen_order_no() is evaluated inside the INSERT that stores the order."
} | tee "$OUT"

# the targets of the order-number design, for the report's summary
met() { awk -v a="$1" -v b="$2" -v op="$3" 'BEGIN {if (b <= 0) print "no"; else if (op == "le") print (a <= b) ? "yes" : "no"; else print (a / b >= op) ? "yes" : "no"}'; }
{
	printf 'gen_order_no() costs no more than nextval() per call (in the server)\t%s vs %s ns (%s×)\t%s\n' \
		"${NS[gen_order_no]}" "${NS[nextval]}" "$(ratio "${NS[gen_order_no]}" "${NS[nextval]}")" \
		"$(met "${NS[gen_order_no]}" "${NS[nextval]}" le)"
	printf 'gen_order_no() at least 3× faster than the same format in PL/pgSQL\t%s×\t%s\n' \
		"$(ratio "${NS[plpgsql_order_no]}" "${NS[gen_order_no]}")" "$(met "${NS[plpgsql_order_no]}" "${NS[gen_order_no]}" 3)"
	printf 'gen_order_no() throughput at least nextval()'"'"'s at %s clients (pgbench)\t%s×\t%s\n' "$LAST" \
		"$(ratio "${TPS[gen_order_no,$LAST]}" "${TPS[nextval,$LAST]}")" "$(met "${TPS[gen_order_no,$LAST]}" "${TPS[nextval,$LAST]}" 1)"
} >bench/out/order_no.targets
