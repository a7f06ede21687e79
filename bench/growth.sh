#!/usr/bin/env bash
# Cost as work grows (#23): what a first success and reconcile() cost with
# 10 k, 1 M (and, asked for, 10 M) payments already in the tables.
#
# For each size of GROWTH_SIZES, smallest first, the history is filled up to
# that many paid orders with their succeeded payments (four status_log rows
# and one sent order.paid event each, spread over 2025; bulk-loaded with
# session_replication_role = replica, as bench/recon_setup.sql loads its
# data), then measured by callgrind in a single-user backend (as
# bench/instructions.sh measures):
#   - FLOW_N first deliveries of new pending payments (bench/flow_setup.sql's
#     pool; an EXECUTE per transaction), minus the same reads without the call;
#   - reconcile() of a new day of the channel: DAY_N payments paid that day
#     and the matching bill lines, minus an empty statement.
# Target: a delivery at the largest size costs at most 1.2x what it costs at
# the smallest.  Writes bench/out/growth.md and growth.targets.
#
#   GROWTH_SIZES ("10000 1000000"; add 10000000 for the largest, about 20
#   minutes more on a 2-CPU machine)  FLOW_N (500)  DAY_N (1000)  SKIP_BUILD=1
#   QUICK=1: GROWTH_SIZES "10000 100000"
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

[ "${QUICK:-}" = 1 ] && GROWTH_SIZES=${GROWTH_SIZES:-10000 100000}
read -r -a SIZES <<<"${GROWTH_SIZES:-10000 1000000}"
FLOW_N=${FLOW_N:-500}
DAY_N=${DAY_N:-1000}

ensure_valgrind
set_pg_paths
bench_build

RUN=$(make_run_dir bench-growth)
trap cluster_stop EXIT
PAYIDEM_PORT=${PAYIDEM_PORT:-55870} cluster_start "$RUN" "shared_buffers = 256MB" "max_wal_size = 4GB"
mkdir -p bench/out
OUT=bench/out/growth
rm -f "$OUT.md" "$OUT.targets"
DB=bench_growth
psql -X -q -d postgres -c "CREATE DATABASE $DB"
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
sql -v pool="$((FLOW_N * ${#SIZES[@]}))" -v ref_pool=0 -v ref_same_pool=0 -f bench/flow_setup.sql >/dev/null

# history rows a .. b: paid orders, their payments, their log rows and events
fill() {
	sql -v a="$1" -v b="$2" <<-'SQL'
		SET session_replication_role = replica;
		CREATE TEMP TABLE g AS
		SELECT i, payidem.order_no_make('PO', timestamptz '2025-01-01 00:00:00+00' + (i / 1000000) * interval '1 second', 0, i % 1000000) AS o,
		       payidem.order_no_make('PY', timestamptz '2025-01-01 00:00:00+00' + (i / 1000000) * interval '1 second', 0, i % 1000000) AS p,
		       timestamptz '2025-01-01 00:00:00+00' + (i % 10000000) * interval '3 seconds' AS t,
		       1000 + i % 1000 AS amount
		  FROM generate_series(:a, :b) i;
		INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, notify_url, expire_at,
		                             paid_at, paid_payment_no, created_at, updated_at)
		SELECT o, m.merchant_no, 'G-' || i, 'growth', amount, 'paid', 'https://shop.example/notify', t + interval '2 hours',
		       t + interval '1 minute', p, t, t + interval '1 minute'
		  FROM g, bench.merchant m;
		INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id,
		                             paid_at, fee_amount, cost_amount, created_at, updated_at)
		SELECT p, o, m.merchant_no, 'BENCH_WX', amount, 'succeeded', 'G' || i, t + interval '1 minute',
		       round(amount * 0.006), round(amount * 0.002), t, t + interval '1 minute'
		  FROM g, bench.merchant m;
		INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status, changed_at, changed_by, txid)
		SELECT e.entity, e.no, e.f, e.s, t, 'growth', 0
		  FROM g, LATERAL (VALUES ('order', o, NULL, 'pending'), ('payment', p, NULL, 'pending'),
		                          ('payment', p, 'pending', 'succeeded'), ('order', o, 'pending', 'paid')) e(entity, no, f, s);
		INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, payload, status, attempts,
		                                  last_attempt_at, sent_at, created_at)
		SELECT nextval('payidem.notify_event_seq') * 100, 'order.paid', o, m.merchant_no, '{}', 'sent', 1,
		       t + interval '1 minute', t + interval '1 minute', t + interval '1 minute'
		  FROM g, bench.merchant m;
		DROP TABLE g;
		RESET session_replication_role;
	SQL
	sql -c 'VACUUM ANALYZE'
}

# a new day of the channel for reconcile(): DAY_N payments paid that day and
# the same lines in its bill
bill_day() {
	sql -v day="$1" -v n="$DAY_N" -v k="$2" <<-'SQL'
		SET session_replication_role = replica;
		INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status, transaction_id,
		                             paid_at, fee_amount, cost_amount, created_at, updated_at)
		SELECT payidem.order_no_make('PY', timestamptz '2026-03-01 00:00:00+00' + :k * interval '1 second', 0, i),
		       payidem.order_no_make('PO', timestamptz '2026-03-01 00:00:00+00' + :k * interval '1 second', 0, i),
		       m.merchant_no, 'BENCH_WX', 1000 + i, 'succeeded', 'D' || :k || '-' || i,
		       :'day'::timestamptz + i * interval '1 second', 6, 2, :'day'::timestamptz, :'day'::timestamptz
		  FROM generate_series(1, :n) i, bench.merchant m;
		RESET session_replication_role;
		INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
		SELECT 'BENCH_WX', :'day'::date, 'D' || :k || '-' || i,
		       payidem.order_no_make('PY', timestamptz '2026-03-01 00:00:00+00' + :k * interval '1 second', 0, i),
		       1000 + i, 6, 'succeeded', :'day'::timestamptz + i * interval '1 second'
		  FROM generate_series(1, :n) i;
	SQL
}

# callgrind_of FILE -> the instructions of one single-user run of FILE
callgrind_of() {
	local file=$1 out="$1.callgrind"
	is_root && chown postgres: "$file"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" --trace-children=no \
		"$PGBIN/postgres" --single -D "$RUN/data" -c shared_preload_libraries=payidem \
		-c fsync=off -c log_min_messages=warning "$DB" <"$file" >"$file.log" 2>"$file.valgrind" ||
		{ tail -20 "$file.valgrind" >&2; die "callgrind run failed for $file"; }
	if grep -q ERROR "$file.log"; then
		grep ERROR "$file.log" | head -3 >&2
		die "$file failed"
	fi
	awk '/^summary:/ {print $2}' "$out"
}

: >"$RUN/results"
have=0
idx=0
for size in "${SIZES[@]}"; do
	say "growth: filling the history up to $size paid payments"
	[ "$size" -gt "$have" ] && fill $((have + 1)) "$size"
	have=$size
	day=$(date -u -d "2026-03-01 + $idx days" +%F)
	bill_day "$day" "$idx"
	cluster_stop

	# deliveries: pool numbers 1001 + idx * FLOW_N ...
	first=$((1001 + idx * FLOW_N))
	{
		echo "PREPARE d(bigint) AS SELECT payidem.apply_payment_result(payment_no, 'callback', 'succeeded', 'TX' || k, amount) FROM bench.pool WHERE k = \$1;"
		seq "$first" $((first + FLOW_N - 1)) | sed 's/.*/EXECUTE d(&);/'
	} >"$RUN/deliver.$size.sql"
	{
		echo "PREPARE d(bigint) AS SELECT payment_no, 'TX' || k, amount FROM bench.pool WHERE k = \$1;"
		seq "$first" $((first + FLOW_N - 1)) | sed 's/.*/EXECUTE d(&);/'
	} >"$RUN/deliver_base.$size.sql"
	echo "SELECT payidem.reconcile('BENCH_WX', '$day');" >"$RUN/reconcile.$size.sql"
	echo "SELECT 1;" >"$RUN/reconcile_base.$size.sql"
	full=$(callgrind_of "$RUN/deliver.$size.sql")
	base=$(callgrind_of "$RUN/deliver_base.$size.sql")
	applied=$(grep -c '= "applied"' "$RUN/deliver.$size.sql.log" || true)
	[ "$applied" -eq "$FLOW_N" ] || die "size $size: $applied of $FLOW_N deliveries were applied"
	delivery=$(( (full - base) / FLOW_N ))
	rfull=$(callgrind_of "$RUN/reconcile.$size.sql")
	rbase=$(callgrind_of "$RUN/reconcile_base.$size.sql")
	recon=$((rfull - rbase))
	printf '%s\t%s\t%s\n' "$size" "$delivery" "$recon" | tee -a "$RUN/results"

	as_pg "$PGBIN/pg_ctl" -D "$RUN/data" -l "$RUN/server.log" -w -t 60 start >/dev/null ||
		die "the server did not start again"
	# reconcile() did the day's work: every payment matched, no difference
	check=$(sql -c "SELECT matched || '/' || (platform_only + channel_only + amount_mismatch + status_mismatch)
	                  FROM payidem.recon_batch WHERE channel_no = 'BENCH_WX' AND bill_date = '$day' AND status = 'done'")
	[ "$check" = "$DAY_N/0" ] || die "size $size: reconcile() of $day gave matched/differences $check, not $DAY_N/0"
	idx=$((idx + 1))
done

thousands() { sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$1"; }
read -r small_size small_delivery small_recon < <(head -1 "$RUN/results")
read -r large_size large_delivery large_recon < <(tail -1 "$RUN/results")
{
	echo "Callgrind in a single-user backend, $(date -u +%Y-%m-%d), PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'):"
	echo "a first success per transaction ($FLOW_N, prepared, the same reads subtracted) and"
	echo "\`reconcile()\` of a day of $DAY_N payments and bill lines, with this many paid payments"
	echo "(and their orders, status_log rows and events) already in the tables."
	echo
	echo "| payments already there | first success, instructions | vs the smallest | reconcile() of a day, instructions | vs the smallest |"
	echo "|---:|---:|---:|---:|---:|"
	while IFS=$'\t' read -r size delivery recon; do
		printf '| %s | %s | %s | %s | %s |\n' "$(thousands "$size")" "$(thousands "$delivery")" \
			"$(ratio "$delivery" "$small_delivery")" "$(thousands "$recon")" "$(ratio "$recon" "$small_recon")"
	done <"$RUN/results"
} >"$OUT.md"
growth=$(ratio "$large_delivery" "$small_delivery")
{
	printf 'a first success with %s payments ≤ 1.2× its cost with %s\t%s×\t%s\n' "$(thousands "$large_size")" \
		"$(thousands "$small_size")" "$growth" "$(awk -v g="$growth" 'BEGIN {print (g <= 1.2) ? "yes" : "no"}')"
	printf 'reconcile() of a day with %s payments, vs %s\t%s×\tn/a\n' "$(thousands "$large_size")" \
		"$(thousands "$small_size")" "$(ratio "$large_recon" "$small_recon")"
} >"$OUT.targets"
cat "$OUT.md"
say "written: $OUT.md, $OUT.targets"
