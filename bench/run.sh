#!/usr/bin/env bash
# make bench — build and install payidem once, run every benchmark runner in
# bench/ (each starts and stops its own throwaway cluster and leaves its
# results in bench/out/), then write docs/benchmarks.md and the charts in
# docs/img/ (bench/report.sh).  See bench/README.md.
#
#   QUICK=1     a rough run of under two minutes (passed on to every runner;
#               the instruction counts are left to make bench-check)
#   RUNNERS="idem flow"   run only these (the report still lists the others)
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

ALL=(ceiling order_no idem state flow recon settle lists router instructions growth)
# the instruction counts do not depend on the run's length, and valgrind is
# slow: a QUICK run leaves them to make bench-check
[ "${QUICK:-}" = 1 ] && ALL=("${ALL[@]/instructions/}")
read -r -a RUNNERS <<<"${RUNNERS:-${ALL[*]}}"
export QUICK=${QUICK:-} SKIP_BUILD=1
start=$(date +%s)

set_pg_paths
SKIP_BUILD=0 bench_build	# (the runners after it skip theirs)
mkdir -p bench/out
# the report shows this run only: a runner left out is listed as not run
for r in ceiling order_no idem state flow recon settle lists router instructions growth; do
	rm -f "bench/out/$r".{md,tsv,targets}
done
rm -f bench/out/ceiling.env

failed=()
i=0
for r in "${RUNNERS[@]}"; do
	i=$((i + 1))
	[ -f "bench/$r.sh" ] || { failed+=("$r (no bench/$r.sh)"); continue; }
	say "benchmark $i/${#RUNNERS[@]}: $r ($(( $(date +%s) - start )) s so far)"
	if ! bash "bench/$r.sh"; then
		failed+=("$r")
	fi
done

bash bench/report.sh "$(( $(date +%s) - start ))"
say "done in $(( $(date +%s) - start )) s"
[ ${#failed[@]} -eq 0 ] || die "failed: ${failed[*]}"
