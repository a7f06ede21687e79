#!/usr/bin/env bash
# Benchmark: the physical ceiling of commit-per-callback on this machine, so
# every durable figure of the other runners can be read as a fraction of it.
#
#   1. pg_test_fsync on a file next to the cluster's data directory: the
#      "one 8kB write" section (one WAL flush per commit), with the line of
#      the server's wal_sync_method picked out;
#   2. pgbench -M prepared, one small row inserted per commit
#      (bench/flow_ceiling.sql, the same script as flow.sh's ceiling column),
#      fsync, full_page_writes and synchronous_commit on, at CLIENTS clients;
#      then the same with synchronous_commit off, to show how much of the
#      ceiling is the flush.  Median of RUNS runs of SECONDS_PER_RUN each,
#      a CHECKPOINT on an emptied table before every run.
#
# Starts its own throwaway cluster and stops it on exit.  Writes
#   bench/out/ceiling.md   the Markdown section (also printed),
#   bench/out/ceiling.tsv  series<TAB>clients<TAB>tps, one line per point,
#   bench/out/ceiling.env  CEILING_TPS_<clients>=, CEILING_OFF_TPS_<clients>=
#                          and FSYNC_OPS= (integers) for the other runners.
#
#   RUNS (3)  SECONDS_PER_RUN (2)  FSYNC_SECONDS (2)  CLIENTS ("1 8 32")
#   QUICK=1 (1 run of 1 s, pg_test_fsync 1 s per test)  SKIP_BUILD=1
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
FSYNC_SECONDS=${FSYNC_SECONDS:-2}
CLIENTS=${CLIENTS:-"1 8 32"}
if [ "${QUICK:-}" = 1 ]; then RUNS=1; SECONDS_PER_RUN=1; FSYNC_SECONDS=1; fi

set_pg_paths
bench_build
RUN=$(make_run_dir bench-ceiling)
# other work on the machine (a concurrent benchmark, a build) moves both
# figures: the load before the run goes into the report
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)
mkdir -p bench/out
OUT=bench/out/ceiling.md
TSV=bench/out/ceiling.tsv
ENV=bench/out/ceiling.env
DB=bench_ceiling

# --- 1. pg_test_fsync ---------------------------------------------------------
# Only the first section (one 8kB write per flush) is wanted: pg_test_fsync is
# stopped as soon as the next section starts, which saves the other eleven
# tests.  It flushes its output before every test, so the first section is
# complete in the log once the second heading is there.  It runs before the
# cluster starts, so the disk has nothing else of ours to do.
say "pg_test_fsync, ${FSYNC_SECONDS} s per test (one 8kB write per flush)"
FSYNC_LOG=$RUN/pg_test_fsync.log
# as_pg by hand: a backgrounded shell function would be a subshell, and
# stopping it would leave pg_test_fsync running.  runuser passes a SIGTERM on
# to pg_test_fsync, which removes its test file and exits.
FSYNC_CMD=("$PGBIN/pg_test_fsync" -s "$FSYNC_SECONDS" -f "$RUN/pg_test_fsync.tmp")
is_root && FSYNC_CMD=(runuser -u postgres -- "${FSYNC_CMD[@]}")
"${FSYNC_CMD[@]}" >"$FSYNC_LOG" 2>&1 &
fsync_pid=$!
trap 'kill -TERM "$fsync_pid" 2>/dev/null || true' EXIT
while kill -0 "$fsync_pid" 2>/dev/null && ! grep -q 'using two 8kB writes' "$FSYNC_LOG"; do
	sleep 0.2
done
kill -TERM "$fsync_pid" 2>/dev/null || true
wait "$fsync_pid" 2>/dev/null || true

# method<TAB>ops/sec (or n/a), one line per method of the first section
FSYNC_LINES=$(awk '
	/using one 8kB write/ { in_section = 1; next }
	in_section && /^[[:space:]]*$/ { exit }
	in_section && /ops\/sec/ { printf "%s\t%.0f\n", $1, $2 }
	in_section && /n\/a/ { printf "%s\tn/a\n", $1 }
' "$FSYNC_LOG")
[ -n "$FSYNC_LINES" ] || { cat "$FSYNC_LOG" >&2; die "no 'one 8kB write' figures in pg_test_fsync's output"; }
while IFS=$'\t' read -r method ops; do
	[ "$ops" = n/a ] && echo "  $method: n/a" || echo "  $method: $ops ops/s"
done <<<"$FSYNC_LINES"

# --- 2. the cluster and the insert-per-commit points ---------------------------
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55850}
PAYIDEM_PORT=$PAYIDEM_PORT cluster_start "$RUN" "fsync = on" "synchronous_commit = on" "full_page_writes = on"

SYNC_METHOD=$(psql -X -At -d postgres -c "SHOW wal_sync_method")
FSYNC_OPS=$(awk -F'\t' -v m="$SYNC_METHOD" '$1 == m && $2 != "n/a" { print $2 }' <<<"$FSYNC_LINES")
[ -n "$FSYNC_OPS" ] || die "pg_test_fsync has no figure for wal_sync_method = $SYNC_METHOD"
say "wal_sync_method = $SYNC_METHOD: $FSYNC_OPS flushes/s"

psql -X -q -d postgres -c "CREATE DATABASE $DB"
# the same table as flow.sh's ceiling, so bench/flow_ceiling.sql runs unchanged
psql -X -q -v ON_ERROR_STOP=1 -d "$DB" <<'SQL'
CREATE SCHEMA bench;
CREATE TABLE bench.ceiling (id bigserial PRIMARY KEY, v int, created_at timestamptz DEFAULT now());
SQL


# run_point CLIENTS SYNC RUN_NO -> tps of one run
run_point() {
	local clients=$1 sync=$2 n=$3 log
	log=$RUN/pgbench-$clients-$sync-$n.log
	psql -X -q -d "$DB" -c "TRUNCATE bench.ceiling" -c CHECKPOINT
	PGOPTIONS="-c synchronous_commit=$sync" \
		"$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$(( clients < 4 ? clients : 4 ))" -T "$SECONDS_PER_RUN" \
		-f bench/flow_ceiling.sql "$DB" >"$log" 2>&1 \
		|| { cat "$log" >&2; die "pgbench failed: $clients clients, synchronous_commit $sync"; }
	grep -q 'number of failed transactions: 0 ' "$log" \
		|| { cat "$log" >&2; die "pgbench reported failed transactions: $clients clients, synchronous_commit $sync"; }
	sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | tail -1
}

declare -A TPS
for sync in on off; do
	for clients in $CLIENTS; do
		say "insert per commit, synchronous_commit=$sync, $clients client(s): ${SECONDS_PER_RUN} s x $RUNS"
		TPS[$clients,$sync]=$(for n in $(seq "$RUNS"); do run_point "$clients" "$sync" "$n"; done \
			| median | awk '{ printf "%.0f", $1 }')
		echo "  ${TPS[$clients,$sync]} tps"
	done
done

# --- 3. the outputs -----------------------------------------------------------
{
	echo "$(date -u +%Y-%m-%d), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)," \
		"PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), file system $(df --output=fstype "$RUN" | tail -1), load average $LOAD_BEFORE before the run;" \
		"fsync, full_page_writes and synchronous_commit on; median of $RUNS run(s) of ${SECONDS_PER_RUN} s per point."
	echo
	echo "\`pg_test_fsync -s $FSYNC_SECONDS\`, one 8kB write per flush (the server's \`wal_sync_method\` in bold):"
	echo
	while IFS=$'\t' read -r method ops; do
		[ "$ops" = n/a ] && line="n/a" || line="$ops ops/s"
		if [ "$method" = "$SYNC_METHOD" ]; then
			echo "- **$method: $line**"
		else
			echo "- $method: $line"
		fi
	done <<<"$FSYNC_LINES"
	echo
	echo "One small row inserted per commit (\`bench/flow_ceiling.sql\`), pgbench \`-M prepared\`, tps:"
	echo
	echo "| clients | tps sync on | tps sync off | sync on / $SYNC_METHOD ops/s |"
	echo "|---:|---:|---:|---:|"
	for clients in $CLIENTS; do
		echo "| $clients | ${TPS[$clients,on]} | ${TPS[$clients,off]} | $(ratio "${TPS[$clients,on]}" "$FSYNC_OPS") |"
	done
	# c clients share at most one flush between c commits: more than that
	# means the disk was not the same during both measurements
	for clients in $CLIENTS; do
		if awk -v t="${TPS[$clients,on]}" -v c="$clients" -v f="$FSYNC_OPS" 'BEGIN { exit !(t > 1.2 * c * f) }'; then
			echo
			echo "Warning: at $clients client(s), \"sync on\" is more than $clients commit(s) per $SYNC_METHOD flush" \
				"measured by pg_test_fsync, which group commit cannot do: the disk was busier during pg_test_fsync" \
				"than during pgbench (other work on the machine?); run again on a quiet machine."
			break
		fi
	done
	echo
	echo "How to read it: with one client every commit waits for its own WAL flush, so" \
		"\"sync on\" at 1 client is at most the $SYNC_METHOD rate of pg_test_fsync (a fraction" \
		"up to 1; what it lacks of 1 is the insert and the round trip). With more clients," \
		"group commit lets the commits that are waiting at the same moment share one flush," \
		"so with several clients tps can exceed the single-flush rate (a fraction above 1)." \
		"\"sync off\" does not wait for the flush at all: the gap between the two columns is" \
		"what durability costs on this disk, and \"sync off\" is the ceiling of the CPUs."
} | tee "$OUT"

for sync in on off; do
	for clients in $CLIENTS; do
		printf 'insert, sync %s\t%s\t%s\n' "$sync" "$clients" "${TPS[$clients,$sync]}"
	done
done >"$TSV"

{
	echo "# commit ceiling of this machine (bench/ceiling.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)):"
	echo "# one-row insert per commit, tps; FSYNC_OPS from pg_test_fsync, wal_sync_method = $SYNC_METHOD"
	for clients in $CLIENTS; do echo "CEILING_TPS_$clients=${TPS[$clients,on]}"; done
	for clients in $CLIENTS; do echo "CEILING_OFF_TPS_$clients=${TPS[$clients,off]}"; done
	echo "FSYNC_OPS=$FSYNC_OPS"
} >"$ENV"
say "wrote $OUT, $TSV and $ENV"
