#!/usr/bin/env bash
# Benchmark: gen_order_no() against what a team would use instead —
# nextval() (default cache and CACHE 100), gen_random_uuid(), and a PL/pgSQL
# function building the same 26-character number from a sequence.
#
#   1. per-call cost inside the server: SELECT count(f()) FROM
#      generate_series(1, N), minus the same loop without a call; median of
#      RUNS runs, in nanoseconds per call;
#   2. pgbench -M prepared throughput of "SELECT f()" at 1, 2 and 8 clients,
#      median of RUNS runs of SECONDS each.
#
# Starts its own throwaway cluster (fsync on), prints a Markdown report and
# writes it to bench/out/order_no.md.  QUICK=1 for a fast, rough run.
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

N=${N:-1000000}
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CLIENTS=${CLIENTS:-"1 2 8"}
if [ "${QUICK:-}" = 1 ]; then N=200000; RUNS=1; SECONDS_PER_RUN=2; fi

set_pg_paths
build_and_install
RUN=$(make_run_dir bench-order-no)
trap cluster_stop EXIT
cluster_start "$RUN" "fsync = on" "synchronous_commit = on"
mkdir -p bench/out
OUT=bench/out/order_no.md
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

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

say "per-call cost, $N calls, median of $RUNS"
loop_ms() {
	local expr=$1 r
	for r in $(seq "$RUNS"); do
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

say "pgbench -M prepared, ${SECONDS_PER_RUN}s x $RUNS per point"
declare -A TPS
for name in "${ORDER[@]}"; do
	echo "SELECT ${CALL[$name]};" >"$RUN/$name.sql"
	for c in $CLIENTS; do
		TPS[$name,$c]=$(for r in $(seq "$RUNS"); do
			pgbench -n -M prepared -c "$c" -j "$c" -T "$SECONDS_PER_RUN" -f "$RUN/$name.sql" "$DB" 2>/dev/null |
				awk '/^tps = / {printf "%.0f\n", $3}'
		done | median)
		echo "  $name, $c clients: ${TPS[$name,$c]} tps"
	done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
{
	echo "### Order numbers: gen_order_no() vs the usual alternatives"
	echo
	echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
		"PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), fsync on, N = $N, median of $RUNS."
	echo
	echo "| function | ns per call (in-server loop) | vs gen_order_no |$(for c in $CLIENTS; do printf ' tps %s client(s) |' "$c"; done)"
	echo "|---|---:|---:|$(for c in $CLIENTS; do printf -- '---:|'; done)"
	for name in "${ORDER[@]}"; do
		printf '| `%s` | %s | %s |' "${CALL[$name]}" "${NS[$name]}" "$(ratio "${NS[$name]}" "${NS[gen_order_no]}")"
		for c in $CLIENTS; do printf ' %s |' "${TPS[$name,$c]}"; done
		echo
	done
	echo
	echo "Targets: per-call cost <= nextval()'s: $(ratio "${NS[gen_order_no]}" "${NS[nextval]}")x;" \
		"PL/pgSQL / gen_order_no: $(ratio "${NS[plpgsql_order_no]}" "${NS[gen_order_no]}")x (target >= 3);" \
		"pgbench gen_order_no / nextval at $(echo "$CLIENTS" | awk '{print $NF}') clients:" \
		"$(c=$(echo "$CLIENTS" | awk '{print $NF}'); ratio "${TPS[gen_order_no,$c]}" "${TPS[nextval,$c]}")x (target >= 1)."
} | tee "$OUT"
