#!/usr/bin/env bash
# test/php/run.sh [NAME...] — the PHP tests (test/php/NAME.test.php; all when none
# is named) against the server libpq's variables name (PGHOST, PGPORT, PGUSER: a
# superuser; the server preloads payidem and has it installed), by hand.
# scripts/test runs them on its throwaway cluster (TESTS=NAME).  Needs php with
# pdo_pgsql (Debian: php-cli php-pgsql; installed when run as root).  Each test
# makes and drops its own database and role.
source "$(dirname "$0")/../../scripts/lib.sh"
cd "$ROOT/test/php"
ensure_php_packages || die "no php with pdo_pgsql"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for f in *.test.php; do names+=("$(basename "$f" .test.php)"); done
fi
files=()
for n in "${names[@]}"; do
	[ -f "$n.test.php" ] || die "no test/php/$n.test.php"
	files+=("$n.test.php")
done
exec prove --failures --exec php "${files[@]}"
