# shellcheck shell=bash
# Shared helpers for scripts/test, scripts/demo and the benchmark runner:
# system packages, build + install, and a throwaway PostgreSQL cluster.
#
# Source it; it sets ROOT (the repository) and PGBIN (the server's binaries).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The PostgreSQL majors payidem supports and the Debian suite that carries each
# (DESIGN §1).  The first is this machine's own (Debian 12); the others run in a
# chroot of their suite (scripts/chroot).  "a+b": suite a, the server from b.
PG_SUITES=(15:bookworm 17:trixie 18:forky 19:sid+experimental)
# The majors .ci/run tests, in order; a failure in any of them fails the run.
PG_MATRIX=(15 17 18 19)
# The majors Debian does not carry every package for yet (OPTIONAL_PACKAGES):
# only there may a test be skipped; elsewhere a missing package is an error.
PG_PARTIAL=(19)

partial_major() {
	local m
	for m in "${PG_PARTIAL[@]}"; do [ "$m" = "$1" ] && return 0; done
	return 1
}

pg_suite() {
	local e
	for e in "${PG_SUITES[@]}"; do
		[ "${e%%:*}" = "$1" ] && { echo "${e#*:}"; return 0; }
	done
	return 1
}
# The major whose suite this system is (empty if none is).
native_major() {
	local codename e
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	for e in "${PG_SUITES[@]}"; do
		[ "${e#*:}" = "$codename" ] && { echo "${e%%:*}"; return 0; }
	done
	echo ""
}
# The major to build and test for: PG_MAJOR, else `make test PG=N`'s N, else this system's.
PG_MAJOR=${PG_MAJOR:-${PG:-$(native_major)}}
PG_MAJOR=${PG_MAJOR:-15}

# The client tests' runtime (test/client: the examples/ programs with real drivers).
CLIENT_PACKAGES=(nodejs npm)
# The PHP tests' runtime (test/php: examples/php/ through PDO, served by php -S),
# installed by ensure_php_packages when a PHP test runs: a suite that cannot
# have them (Debian between two PHP versions) fails those tests, not the run.
PHP_PACKAGES=(php-cli php-pgsql)
# Everything make test / make demo need on a fresh Debian machine, for PG_MAJOR.
PACKAGES=(
	make gcc libc6-dev
	"postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-client-$PG_MAJOR"
	libtap-parser-sourcehandler-pgtap-perl
	libipc-run-perl libssl-dev faketime
	openssl
	clang libclang-rt-dev sqlsmith
	"${CLIENT_PACKAGES[@]}"
)
# Packages Debian may not carry yet for a new major (PG_PARTIAL), each with the
# tests that need it: there, where one has no installation candidate, those
# tests are skipped by name (scripts/test), never counted as passed.  Where it
# has one, and on every other major, it is installed like any other.
OPTIONAL_PACKAGES=(
	"postgresql-$PG_MAJOR-pgtap:pgtap"
	"postgresql-$PG_MAJOR-plproxy:050_scale_out"
)
# Set by ensure_packages: the optional packages that cannot be had here.
UNAVAILABLE_PACKAGES=()

say() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# Run a command as the unprivileged server user when we are root:
# PostgreSQL refuses to run as root.
as_pg() {
	if is_root; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# (the output is read whole: grep -q on a pipe would fail it under pipefail)
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == *'install ok installed'* ]]; }
# Installed, or provided by an installed package (a nodejs from elsewhere than
# Debian may bring its own npm, and conflict with Debian's).
installed_or_provided() {
	installed "$1" && return 0
	local line
	while IFS= read -r line; do
		[[ $line == 'ii '* ]] || continue
		[[ ", ${line#ii }, " == *", $1, "* || ", ${line#ii }, " == *", $1 ("* ]] && return 0
	done < <(dpkg-query -W -f='${db:Status-Abbrev}${Provides}\n' 2>/dev/null)
	return 1
}
has_candidate() { [[ $(LC_ALL=C apt-cache policy "$1" 2>/dev/null) =~ Candidate:\ [^\(] ]]; }

# Install missing Debian packages (root), or print the apt-get line and stop.
# An optional package with no installation candidate goes to UNAVAILABLE_PACKAGES.
ensure_packages() {
	local missing=() optional=() p e
	for p in "${PACKAGES[@]}"; do
		installed_or_provided "$p" || missing+=("$p")
	done
	for e in "${OPTIONAL_PACKAGES[@]}"; do
		installed "${e%%:*}" || optional+=("${e%%:*}")
	done
	[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && return 0
	if is_root; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
	fi
	for p in "${optional[@]}"; do
		if has_candidate "$p"; then
			missing+=("$p")
		elif partial_major "$PG_MAJOR"; then
			UNAVAILABLE_PACKAGES+=("$p")
			say "Debian has no $p yet: the tests that need it are skipped"
		elif is_root; then
			die "Debian has no $p here, and every test must run on PostgreSQL $PG_MAJOR"
		else
			missing+=("$p")		# not known without package lists: root's run will tell
		fi
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if ! is_root; then
		echo "These packages are missing: ${missing[*]}" >&2
		echo "Install them with (as root):" >&2
		echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
	say "installing ${missing[*]}"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The optional package a test needs that cannot be had here (empty: none).
unavailable_for() {
	local e p
	for e in "${OPTIONAL_PACKAGES[@]}"; do
		[ "${e#*:}" = "$1" ] || continue
		for p in "${UNAVAILABLE_PACKAGES[@]}"; do
			[ "$p" = "${e%%:*}" ] && { echo "$p"; return 0; }
		done
	done
	return 0
}

set_pg_paths() {
	PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}
	[ -x "$PG_CONFIG" ] || PG_CONFIG=$(command -v pg_config)
	PGBIN=$("$PG_CONFIG" --bindir)
	# .../lib/pgxs/src/makefiles/pgxs.mk -> .../lib/pgxs
	PGXS_DIR=$(cd "$(dirname "$("$PG_CONFIG" --pgxs)")/../.." && pwd)
	export PG_CONFIG PGBIN PGXS_DIR
	export PATH="$PGBIN:$PATH"
}

# Build warning-free and install into the server's directories.
# In CI (CI=true) warnings are errors.
build_and_install() {
	local flags=()
	[ "${CI:-}" = "true" ] && flags+=("PG_CFLAGS=-Werror")
	say "building payidem"
	make -C "$ROOT" -s -j2 PG_CONFIG="$PG_CONFIG" "${flags[@]}" >/dev/null
	if is_root || [ -w "$("$PG_CONFIG" --pkglibdir)" ]; then
		make -C "$ROOT" -s install PG_CONFIG="$PG_CONFIG" >/dev/null
	else
		die "cannot write $("$PG_CONFIG" --pkglibdir): run 'sudo make install' first, or run this as root"
	fi
}

# A scratch directory the server user can write: .run/ in the repository when
# that user can reach it, else a fresh directory under the system temp dir.
make_run_dir() {
	local name=$1 dir="$ROOT/.run/$1"
	rm -rf "$dir" 2>/dev/null || true
	mkdir -p "$dir"
	if is_root; then
		chown postgres: "$dir"
		if ! runuser -u postgres -- test -w "$dir"; then
			rm -rf "$dir"
			dir=$(mktemp -d "${TMPDIR:-/tmp}/payidem-$name.XXXXXX")
			chown postgres: "$dir"
		fi
	fi
	echo "$dir"
}

port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pick_port() {
	local p=${1:-54320}
	while ! port_free "$p" || [ -e "/tmp/.s.PGSQL.$p" ]; do
		p=$((p + 1))
	done
	echo "$p"
}

# cluster_start DIR [extra postgresql.conf lines...]
#   Creates and starts a cluster in DIR/data, preloading payidem, listening on
#   127.0.0.1 and a socket in DIR.  Sets PGHOST, PGPORT, PGUSER for clients.
cluster_start() {
	CLUSTER_DIR=$1; shift
	local port sockdir
	port=$(pick_port "${PAYIDEM_PORT:-54320}")
	sockdir=$CLUSTER_DIR
	# A Unix socket path is limited to ~107 bytes.
	if [ ${#sockdir} -gt 80 ]; then
		sockdir=$(mktemp -d "${TMPDIR:-/tmp}/payidem-sock.XXXXXX")
		is_root && chown postgres: "$sockdir"
	fi
	CLUSTER_SOCKDIR=$sockdir
	as_pg "$PGBIN/initdb" -D "$CLUSTER_DIR/data" -U postgres --auth=trust \
		-E UTF8 --locale=C --no-sync >"$CLUSTER_DIR/initdb.log" 2>&1 \
		|| { cat "$CLUSTER_DIR/initdb.log" >&2; die "initdb failed"; }
	# a throwaway master key for secrets at rest, readable only by the server user
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | as_pg tee "$CLUSTER_DIR/master.key" >/dev/null
	as_pg chmod 600 "$CLUSTER_DIR/master.key"
	{
		echo "port = $port"
		echo "payidem.master_key_file = '$CLUSTER_DIR/master.key'"
		echo "listen_addresses = '127.0.0.1'"
		echo "unix_socket_directories = '$sockdir'"
		echo "shared_preload_libraries = 'payidem'"
		echo "max_connections = 100"
		echo "fsync = off"
		echo "full_page_writes = off"
		echo "log_min_messages = warning"
		echo "lc_messages = 'C'"
		echo "timezone = 'UTC'"
		# The housekeeping worker is off on every cluster made here:
		# - make test (scripts/test, also pg_regress, isolation and pgTAP):
		#   the suites' results must not depend on when the worker runs.  It
		#   would purge the keys sql/idempotency.sql backdates two days before
		#   its own idem_purge() counts them, and close the order
		#   sql/payment_flow.sql lets expire without an attempt, at a moment
		#   of its own choosing.  make
		#   installcheck asks for the same of the server it is given.  The
		#   worker is tested by test/t/060_housekeeping.pl on a node of its
		#   own (the TAP nodes: test/perl/PayidemNode.pm, off there too).
		# - make demo, scripts/cluster and bench/: what they show or measure
		#   is the statements they run, not a worker's rounds in between;
		#   ALTER SYSTEM SET payidem.housekeeping = on and a reload turn it
		#   on there.
		# A caller's own lines come after this one and may say otherwise.
		echo "payidem.housekeeping = off"
		local line
		for line in "$@"; do echo "$line"; done
	} | as_pg tee -a "$CLUSTER_DIR/data/postgresql.conf" >/dev/null
	# Another run may take the port between pick_port and the bind: then the next one.
	local tries=0
	until as_pg "$PGBIN/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" -w -t 60 start >/dev/null; do
		tries=$((tries + 1))
		if [ $tries -ge 10 ] || ! grep -q 'Address already in use' "$CLUSTER_DIR/server.log"; then
			tail -20 "$CLUSTER_DIR/server.log" >&2
			die "server did not start"
		fi
		port=$(pick_port $((port + 1 + RANDOM % 20)))
		echo "port = $port" | as_pg tee -a "$CLUSTER_DIR/data/postgresql.conf" >/dev/null
		as_pg rm -f "$CLUSTER_DIR/server.log"
	done
	export PGHOST=$sockdir PGPORT=$port PGUSER=postgres
	unset PGDATABASE PGPASSWORD PGSERVICE
}

cluster_stop() {
	[ -n "${CLUSTER_DIR:-}" ] && [ -f "$CLUSTER_DIR/data/postmaster.pid" ] || return 0
	as_pg "$PGBIN/pg_ctl" -D "$CLUSTER_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
	if [ -n "${CLUSTER_SOCKDIR:-}" ] && [ "$CLUSTER_SOCKDIR" != "$CLUSTER_DIR" ]; then
		rm -rf "$CLUSTER_SOCKDIR"
	fi
}

# ---------------------------------------------------------------- result counting
# What scripts/test counts, and how it reads each runner's output
# (test/runner/counting.sh checks these on fixed samples of every format).
reset_counts() {
	PASSED=0 FAILED=0 SKIPPED=0
	FAILED_NAMES=() SKIPPED_NAMES=()
}
pass() { PASSED=$((PASSED + 1)); }
fail() { FAILED=$((FAILED + 1)); FAILED_NAMES+=("$1"); }
skip() { SKIPPED=$((SKIPPED + 1)); SKIPPED_NAMES+=("$1 ($2)"); }

# Count pg_regress/pg_isolation_regress results in log $1, for suite $2, of the
# tests listed in $3...: "test name ... ok" / "name ... FAILED" (up to 15),
# "ok 1 - name" / "not ok 1 + name" (TAP, 16 on).  A listed test with no
# result line fails.
count_regress_log() {
	local log=$1 suite=$2 line name result t
	shift 2
	local -A seen=()
	while IFS= read -r line; do
		name=""
		if [[ $line =~ ^[[:space:]]*(test[[:space:]]+)?([A-Za-z0-9_.-]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed) ]]; then
			name=${BASH_REMATCH[2]}
			result=${BASH_REMATCH[3]}
		elif [[ $line =~ ^(not[[:space:]]+)?ok[[:space:]]+[0-9]+[[:space:]]+[-+][[:space:]]+([A-Za-z0-9_.-]+) ]]; then
			name=${BASH_REMATCH[2]}
			if [ -n "${BASH_REMATCH[1]}" ]; then result=FAILED; else result=ok; fi
		fi
		[ -n "$name" ] || continue
		seen[$name]=1
		if [ "$result" = ok ]; then pass; else fail "$suite/$name"; fi
	done <"$log"
	for t in "$@"; do
		[ -n "${seen[$t]:-}" ] || fail "$suite/$t (no result)"
	done
}

# Count one prove/pg_prove run: its exit status, and whether it skipped itself.
count_prove() {
	local name=$1 log=$2 rc=$3 reason
	reason=$(sed -n 's/^.* \.\. skipped: //p' "$log" | head -1)
	if [ "$rc" -ne 0 ]; then
		fail "$name"
	elif [ -n "$reason" ] || grep -q '^Result: NOTESTS' "$log"; then
		fail "$name (skipped itself: ${reason:-no tests})"
	else
		pass
	fi
}

# ---------------------------------------------------------------- the client tests' npm packages
# test/client/*.test.js run the examples/ programs through real drivers; their npm
# packages are pinned by test/client/package-lock.json and installed by `npm ci`
# into test/client/node_modules, again only when the lock changed.  npm's download
# cache is kept across runs (as root beside the chroots, else npm's own), so that
# after the first run no registry is asked.  The tree copied into a chroot
# (scripts/chroot) carries node_modules along: scripts/test installs it on the host
# before it enters the chroot, where the registry may not be reachable as it is here.
CLIENT_DIR=$ROOT/test/client

# Debian's nodejs and npm when they are missing (root), for a run that has not
# called ensure_packages (the host of a chroot run).
ensure_client_packages() {
	local missing=() p
	for p in "${CLIENT_PACKAGES[@]}"; do
		installed_or_provided "$p" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	is_root || { echo "missing: ${missing[*]} (apt-get install ${missing[*]})" >&2; return 1; }
	say "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# test/client/node_modules as package-lock.json says, or non-zero with npm's words
# on stderr (the caller fails the client tests: a missing package is an error).
ensure_client_modules() {
	local lock=$CLIENT_DIR/package-lock.json stamp=$CLIENT_DIR/node_modules/.payidem-lock.sha256 sum cache log rc
	sum=$(sha256sum "$lock" | cut -d' ' -f1)
	[ "$(cat "$stamp" 2>/dev/null)" = "$sum" ] && return 0
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		echo "node and npm are not installed (Debian: ${CLIENT_PACKAGES[*]})" >&2
		return 1
	fi
	if is_root; then cache=${PAYIDEM_NPM_CACHE:-/var/cache/payidem/npm}; else cache=${PAYIDEM_NPM_CACHE:-$HOME/.npm}; fi
	say "npm ci in test/client (package-lock.json; cache $cache)"
	log=$(mktemp)
	set +e
	(cd "$CLIENT_DIR" && npm ci --cache "$cache" --prefer-offline --ignore-scripts --no-audit --no-fund \
		--loglevel=error) >"$log" 2>&1
	rc=$?
	set -e
	if [ $rc -ne 0 ]; then
		tail -n 20 "$log" >&2
		rm -f "$log"
		return 1
	fi
	rm -f "$log"
	echo "$sum" >"$stamp"
}

# ---------------------------------------------------------------- the PHP tests' runtime
# A php with PDO's PostgreSQL driver, or Debian's php-cli and php-pgsql installed
# for it (root); non-zero with the reason on stderr otherwise (the caller fails
# the PHP tests: a missing package is an error).
php_ready() { command -v php >/dev/null && php -r 'exit(extension_loaded("pdo_pgsql") ? 0 : 1);' >/dev/null 2>&1; }
ensure_php_packages() {
	php_ready && return 0
	if ! is_root; then
		echo "php with pdo_pgsql is missing (as root: apt-get install ${PHP_PACKAGES[*]})" >&2
		return 1
	fi
	say "installing ${PHP_PACKAGES[*]}"
	{ DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PHP_PACKAGES[@]}" >/dev/null; } ||
		{ echo "apt-get install ${PHP_PACKAGES[*]} failed" >&2; return 1; }
	php_ready || { echo "php with pdo_pgsql is still missing after installing ${PHP_PACKAGES[*]}" >&2; return 1; }
}
