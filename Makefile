# payidem — PGXS build.
#
#   make                 build the module
#   make install         install it into the PostgreSQL found by $(PG_CONFIG)
#   make installcheck    every suite against the running server libpq's PGHOST/PGPORT
#                        name, which already preloads payidem (after make install)
#   make test            everything, on a throwaway cluster it starts and stops itself
#                        (installs missing packages when run as root); see scripts/test
#   make test PG=17      the same against another major (17, 18, 19), in a Debian
#                        chroot the scripts make once and reuse (root); see scripts/chroot
#   make test-matrix     make test on every major .ci/run tests (15, 17, 18, 19)
#   make demo            the guided tour (examples/demo.sql) on a throwaway cluster
#   make deb             the Debian packages postgresql-<major>-payidem (debian/, pg_buildext)
#   make test-release    each package installed on a clean chroot and tried (root)
#   make dist            the PGXN archive of the release tag v<version>

EXTENSION  = payidem payidem_router
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" payidem.control)

MODULE_big = payidem

# Each part of payidem lists its own objects and tests on its own lines.
OBJS_CORE      = src/payidem.o src/shmem.o src/util.o src/inval.o src/catalog.o src/direct.o src/housekeeping.o
OBJS_ORDER_NO  = src/order_no.o src/order_no_codec.o src/replication.o
OBJS_IDEM      = src/idem.o
OBJS_STATE     = src/state_machine.o src/ledger.o
OBJS_MERCHANT  = src/crypto.o
OBJS_RECON     = src/recon.o
OBJS_SETTLE    = src/journal.o
OBJS_ROUTER    = src/router.o
OBJS_FLOW      = src/orders.o src/payment_result.o src/payment_decision.o src/payment_keys.o src/read_api.o src/notify.o
OBJS = $(OBJS_CORE) $(OBJS_ORDER_NO) $(OBJS_IDEM) $(OBJS_STATE) $(OBJS_MERCHANT) $(OBJS_RECON) $(OBJS_SETTLE) $(OBJS_FLOW) $(OBJS_ROUTER)

# The install script of the version in development is assembled from its
# parts (sql/parts/<part>.sql), in this order: tables before the functions
# whose SQL bodies name them, the privileges last.  A released version's
# install script is frozen in sql/released/ (as its release assembled it) and
# never edited again: each change after it is also written, by hand, into the
# upgrade script sql/payidem--<released>--<next>.sql.
PARTS = header states checks merchant_tables order_tables idempotency_tables \
	reconciliation_tables settlement_tables order_no idempotency state_machine merchant roles \
	orders payment_results refunds payment_keys expiry notifications read_api \
	reconciliation settlement scale_out observability dump privileges
BUILT_SQL = sql/payidem--$(EXTVERSION).sql
ifeq ($(wildcard sql/released/payidem--$(EXTVERSION).sql),)
DATA_built = $(BUILT_SQL)
endif
DATA = $(wildcard sql/released/payidem--*.sql) $(wildcard sql/payidem--*--*.sql) \
	$(wildcard sql/payidem_router--*.sql)

# pg_regress suites: sql/<name>.sql -> expected/<name>.out
REGRESS_CORE     = install privileges
REGRESS_ORDER_NO = order_no
REGRESS_IDEM     = idempotency
REGRESS_STATE    = state_machine
REGRESS_MERCHANT = merchant merchant_security
REGRESS_FLOW     = payment_flow payment_result_paths books notifications generated_columns
REGRESS_RECON    = reconciliation reconciliation_generated
REGRESS_SETTLE   = settlement
REGRESS_RELIABILITY = bad_input
# (last: it reads the lists every merchant's rows are in)
REGRESS_APP      = app_api
REGRESS = $(REGRESS_CORE) $(REGRESS_ORDER_NO) $(REGRESS_IDEM) $(REGRESS_STATE) $(REGRESS_MERCHANT) $(REGRESS_FLOW) $(REGRESS_RECON) $(REGRESS_SETTLE) $(REGRESS_RELIABILITY) $(REGRESS_APP)

# isolation specs: test/specs/<name>.spec -> test/expected/<name>.out
ISOLATION_ORDER_NO = order_no_concurrent
ISOLATION_IDEM     = idem_commit idem_rollback idem_lease_finish idem_three idem_repeatable_read idem_record
ISOLATION_STATE    = state_transit_race state_whitelist_cache state_delete_in_use
ISOLATION_FLOW     = flow_duplicate_callbacks flow_callback_vs_query flow_close_vs_success flow_close_vs_begin flow_two_channels flow_refund_race flow_notify_workers notify_events flow_query_due flow_ddl_meanwhile flow_same_transaction_id flow_rebuild_keys flow_unknown_transaction flow_refusal_repeatable_read notify_result_race create_order_race notify_due_fresh order_fkey_meanwhile flow_domain_change
ISOLATION_RECON    = recon_concurrent
ISOLATION_SETTLE   = settle_twice settle_vs_payment payout_race payout_vs_settle_refund
ISOLATION = $(ISOLATION_ORDER_NO) $(ISOLATION_IDEM) $(ISOLATION_STATE) $(ISOLATION_FLOW) $(ISOLATION_RECON) $(ISOLATION_SETTLE)
ISOLATION_OPTS = --inputdir=test

# TAP tests (PostgreSQL::Test::Cluster): test/t/*.pl
TAP_TESTS = 1
PROVE_TESTS = $(wildcard test/t/*.pl)

# `make installcheck` is scripts/test against the running server: every suite
# runs even when one fails, and the TAP tests find test/perl (PGXS' own target
# stops at the first failing suite and resets PROVE_FLAGS).
NO_INSTALLCHECK = 1

# the library knows the version it was built as (payidem.library_version())
PG_CPPFLAGS = -I$(srcdir)/src -I$(libpq_srcdir) -DPAYIDEM_VERSION='"$(EXTVERSION)"'
# -Wall comes with PGXS; -Wextra minus the warnings PostgreSQL's own headers trip.
# CI adds -Werror through PG_CFLAGS on the command line (see scripts/test).
override PG_CFLAGS += -Wextra -Wno-unused-parameter -Wno-sign-compare \
	-Wno-missing-field-initializers -Wno-cast-function-type
SHLIB_LINK += -lcrypto
# the router's hot calls reach the shards through libpq (src/router.c)
SHLIB_LINK_INTERNAL = $(libpq)

# rebuild an object when a header it includes changes (.deps/, as PostgreSQL's
# own --enable-depend builds do)
override autodepend = yes

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# the version the library reports is the control file's
src/util.o: payidem.control

$(BUILT_SQL): $(addprefix sql/parts/,$(addsuffix .sql,$(PARTS))) Makefile
	cat $(addprefix sql/parts/,$(addsuffix .sql,$(PARTS))) > $@.tmp
	mv $@.tmp $@

.PHONY: test test-matrix installcheck demo version bench bench-check dist deb test-release
# PG=17 (18, 19): against that major, in its chroot
test:
	@PG="$(PG)" bash scripts/test

test-matrix:
	@bash scripts/matrix

installcheck:
	@INSTALLCHECK=1 PG_CONFIG="$(PG_CONFIG)" PG_MAJOR=$(MAJORVERSION) bash scripts/test

# every benchmark in bench/ (QUICK=1 for a short run); see docs/benchmarks.md
bench:
	@bash bench/run.sh

# instruction counts (valgrind) against bench/instructions.pgNN.baseline, +20 %
# allowed, and the deliveries against seed 002's handler; PG=17: in its chroot
bench-check:
	@PG="$(PG)" bash bench/instructions.sh --check

demo:
	@bash scripts/demo

version:
	@echo $(EXTVERSION)

# make dist: the archive PGXN takes, of a release tag (git archive, as pgvector
# does): payidem-<META.json's version>.zip in DIST_DIR.  DIST_REF=HEAD for a
# snapshot of the last commit.
DIST_REF ?= v$(EXTVERSION)
DIST_DIR ?= .
dist:
	@git rev-parse -q --verify '$(DIST_REF)^{commit}' >/dev/null || \
		{ echo "make dist: no revision $(DIST_REF) (a release is tagged v<version>; DIST_REF=HEAD for a snapshot)" >&2; exit 1; }
	@v=$$(git show '$(DIST_REF):META.json' | sed -n 's/^   "version": "\(.*\)",$$/\1/p'); \
	 [ -n "$$v" ] || { echo "make dist: no version in META.json of $(DIST_REF)" >&2; exit 1; }; \
	 git archive --format=zip --prefix=payidem-$$v/ -o '$(DIST_DIR)'/payidem-$$v.zip '$(DIST_REF)' && \
	 echo '$(DIST_DIR)'/payidem-$$v.zip

# make deb: postgresql-<major>-payidem for every major of debian/pgversions
# (this system's here, the others in their chroots) into debs/; PG=17 for one
deb:
	@bash scripts/package build $(PG)

# make test-release: each package installed on a clean chroot of its suite,
# preloaded, CREATE EXTENSION and the demo, and the update from 1.0 (.ci/run
# tests this system's major; the upgrade test is test/t/070_upgrade.pl)
test-release:
	@bash scripts/package test $(PG)

# make -s print-REGRESS  -> the value of a variable (used by scripts/test)
print-%:
	@echo $($*)
