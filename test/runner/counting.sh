#!/usr/bin/env bash
# The result counting of scripts/test (scripts/lib.sh), on fixed samples of what
# each runner prints on each major: pg_regress and pg_isolation_regress up to 15
# ("test name ... ok") and from 16 (TAP: "ok 1 - name"), a parallel group, a
# failure, a test that reported nothing, and prove runs that passed, failed or
# skipped themselves.  TAP output; exits non-zero if any check fails.
source "$(dirname "$0")/../../scripts/lib.sh"

n=0 bad=0
check() {
	local what=$1 want=$2 got=$3
	n=$((n + 1))
	if [ "$want" = "$got" ]; then
		echo "ok $n - $what"
	else
		echo "not ok $n - $what"
		echo "#   want: $want"
		echo "#   got:  $got"
		bad=$((bad + 1))
	fi
}
counts() { echo "$PASSED passed, $FAILED failed, $SKIPPED skipped: ${FAILED_NAMES[*]:-}"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/pg15.log" <<'EOF'
============== running regression test queries        ==============
test install                      ... ok          631 ms
test privileges                   ... FAILED       16 ms
parallel group (2 tests):  order_no idempotency
     order_no                     ... ok         1975 ms
     idempotency                  ... ok         2258 ms

======================
 1 of 4 tests failed.
======================
EOF
reset_counts
count_regress_log "$tmp/pg15.log" regress install privileges order_no idempotency
check "15's format: three ok, one FAILED" "3 passed, 1 failed, 0 skipped: regress/privileges" "$(counts)"

cat >"$tmp/pg17.log" <<'EOF'
# using postmaster on /tmp/x, port 54320
ok 1         - install                                   631 ms
not ok 2     - privileges                                 16 ms
# parallel group (2 tests):  order_no idempotency
ok 3         + order_no                                 1975 ms
ok 4         + idempotency                              2258 ms
1..4
# 1 of 4 tests failed.
EOF
reset_counts
count_regress_log "$tmp/pg17.log" regress install privileges order_no idempotency
check "16+'s TAP format: three ok, one not ok" "3 passed, 1 failed, 0 skipped: regress/privileges" "$(counts)"

cat >"$tmp/short.log" <<'EOF'
ok 1         - install                                   631 ms
# (test process exited with exit code 2)
EOF
reset_counts
count_regress_log "$tmp/short.log" regress install privileges
check "a listed test with no result line fails" "1 passed, 1 failed, 0 skipped: regress/privileges (no result)" "$(counts)"

reset_counts
count_regress_log "$tmp/short.log" isolation
check "lines that are not results are not counted" "1 passed, 0 failed, 0 skipped: " "$(counts)"

printf 't/001_x.pl .. ok\nAll tests successful.\nResult: PASS\n' >"$tmp/prove-ok.log"
printf 't/002_x.pl .. skipped: libfaketime not found\nFiles=1, Tests=0\nResult: NOTESTS\n' >"$tmp/prove-skip.log"
printf 't/003_x.pl .. Dubious, test returned 1\nResult: FAIL\n' >"$tmp/prove-fail.log"
reset_counts
count_prove tap/001_x.pl "$tmp/prove-ok.log" 0
count_prove tap/002_x.pl "$tmp/prove-skip.log" 0
count_prove tap/003_x.pl "$tmp/prove-fail.log" 1
check "prove: a pass, a test that skipped itself, a failure" \
	"1 passed, 2 failed, 0 skipped: tap/002_x.pl (skipped itself: libfaketime not found) tap/003_x.pl" "$(counts)"

OPTIONAL_PACKAGES=("postgresql-19-plproxy:050_scale_out" "postgresql-19-pgtap:pgtap")
UNAVAILABLE_PACKAGES=("postgresql-19-pgtap")
check "a test whose package Debian lacks" "postgresql-19-pgtap" "$(unavailable_for pgtap)"
check "a test whose package is there" "" "$(unavailable_for 050_scale_out)"

echo "1..$n"
[ "$bad" -eq 0 ]
