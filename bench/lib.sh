# shellcheck shell=bash
# What the benchmark runners share; sources scripts/lib.sh (clusters,
# packages, build) for them.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

# The median of the numbers on standard input (any number per line).
median() {
	tr -s ' \t' '\n\n' | grep -v '^$' | sort -g |
		awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

# a / b to two decimals; n/a when b is not positive.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

# Build and install payidem for PG_MAJOR, installing first what a build needs
# on a fresh machine (the server, its headers); SKIP_BUILD=1 uses what is installed.
bench_build() {
	[ "${SKIP_BUILD:-}" = 1 ] && return 0
	ensure_packages
	build_and_install
}

# valgrind, for the instruction counts (installed if missing, as root)
ensure_valgrind() {
	command -v valgrind >/dev/null && return 0
	is_root || die "valgrind is missing: sudo apt-get install -y valgrind"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
