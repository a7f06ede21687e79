#!/usr/bin/env bash
# The README's Quick start, exactly as written: every ```sql block under
# "## Quick start" runs in psql (ON_ERROR_STOP) in a new database with the
# extension, on the server libpq's PGHOST/PGPORT/PGUSER name, and the results
# the README's comments promise are checked.  TAP output; exits non-zero if any
# check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
db=payidem_readme
n=0 bad=0
check() {
	n=$((n + 1))
	if [ "$2" = "$3" ]; then echo "ok $n - $1"; else
		echo "not ok $n - $1"; echo "#   want: $2"; echo "#   got:  $3"; bad=$((bad + 1)); fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
# the sql blocks of the Quick start section
awk '/^## /{ inside = ($0 == "## Quick start") } inside && /^```/{ insql = !insql && /^```sql/; next } inside && insql' \
	README.md >"$tmp/quickstart.sql"
check "the Quick start has sql to run" yes "$([ -s "$tmp/quickstart.sql" ] && echo yes || echo no)"

psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" 2>&1 | grep -v "^NOTICE" || true
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c 'CREATE EXTENSION payidem'
rc=0
psql -X -At -v ON_ERROR_STOP=1 -d "$db" -f "$tmp/quickstart.sql" >"$tmp/out" 2>&1 || rc=$?
check "every line runs as written" 0 "$rc"
[ "$rc" -eq 0 ] || sed 's/^/#   /' "$tmp/out"

out=$(cat "$tmp/out")
check "gen_order_no gives an order number" yes "$(grep -qE '^PO[0-9]{24}$' <<<"$out" && echo yes || echo no)"
check "order_no_valid refuses the altered check digits" f "$(sed -n 4p <<<"$out")"
check "the first delivery is applied, the second a duplicate" "applied duplicate" \
	"$(grep -xE 'applied|duplicate' <<<"$out" | tr '\n' ' ' | sed 's/ $//')"
check "the order is paid" "paid|t" "$(tail -n 1 <<<"$out")"

echo "1..$n"
[ "$bad" -eq 0 ]
