# shellcheck shell=bash
# Shared helpers for scripts/test, scripts/demo and the benchmark runner:
# system packages, build + install, and a throwaway PostgreSQL cluster.
#
# Source it; it sets ROOT (the repository) and PGBIN (the server's binaries).

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_MAJOR=${PG_MAJOR:-15}

# Everything make test / make demo need on a fresh Debian 12 machine.
PACKAGES=(
	make gcc libc6-dev
	"postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-client-$PG_MAJOR"
	"postgresql-$PG_MAJOR-pgtap" libtap-parser-sourcehandler-pgtap-perl
	libipc-run-perl libssl-dev faketime "postgresql-$PG_MAJOR-plproxy"
	clang-14 libclang-rt-14-dev sqlsmith
)

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

# Install missing Debian packages (root), or print the apt-get line and stop.
ensure_packages() {
	local missing=() p
	for p in "${PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$p")
		fi
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if ! is_root; then
		echo "These packages are missing: ${missing[*]}" >&2
		echo "Install them with:" >&2
		echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
		local line
		for line in "$@"; do echo "$line"; done
	} | as_pg tee -a "$CLUSTER_DIR/data/postgresql.conf" >/dev/null
	as_pg "$PGBIN/pg_ctl" -D "$CLUSTER_DIR/data" -l "$CLUSTER_DIR/server.log" -w -t 60 start >/dev/null \
		|| { tail -20 "$CLUSTER_DIR/server.log" >&2; die "server did not start"; }
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
