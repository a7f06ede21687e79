#!/usr/bin/env bash
# make bench — run every benchmark runner in bench/ (each starts and stops its
# own throwaway cluster and writes a Markdown section to bench/out/<name>.md),
# then the instruction counts.  QUICK=1 is passed on to the runners that take it.
# The sections are what docs/benchmarks.md is written from.
source "$(dirname "$0")/../scripts/lib.sh"
cd "$ROOT"

RUNNERS=(order_no idem state flow recon router)
failed=()
for r in "${RUNNERS[@]}"; do
	[ -f "bench/$r.sh" ] || continue
	say "benchmark: $r"
	if ! bash "bench/$r.sh"; then
		failed+=("$r")
	fi
done
say "benchmark: instruction counts"
bash bench/instructions.sh || failed+=(instructions)

say "sections written to bench/out/:"
ls -1 bench/out/
[ ${#failed[@]} -eq 0 ] || die "failed: ${failed[*]}"
