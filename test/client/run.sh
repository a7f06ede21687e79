#!/usr/bin/env bash
# test/client/run.sh [NAME...] — the client tests (test/client/NAME.test.js; all
# when none is named) against the server libpq's variables name (PGHOST, PGPORT,
# PGUSER: a superuser; the server preloads payidem and has it installed), by hand.
# scripts/test runs them on its throwaway cluster (TESTS=NAME).  Installs the npm
# packages of package-lock.json first (npm ci, only when the lock changed).
# Each test makes and drops its own database and role.
source "$(dirname "$0")/../../scripts/lib.sh"
cd "$CLIENT_DIR"
ensure_client_modules || die "npm ci in test/client failed"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for f in *.test.js; do names+=("$(basename "$f" .test.js)"); done
fi
files=()
for n in "${names[@]}"; do
	[ -f "$n.test.js" ] || die "no test/client/$n.test.js"
	files+=("$n.test.js")
done
exec prove --failures --exec node "${files[@]}"
