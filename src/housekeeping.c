/*-------------------------------------------------------------------------
 *
 * housekeeping.c
 *		The housekeeping background worker: closes expired orders that no
 *		payment attempt keeps open and purges idempotency keys past
 *		payidem.idem_retention, in every database where payidem is
 *		installed (DESIGN §7, "Housekeeping").
 *
 * Two kinds of process:
 *
 * - One launcher, registered by _PG_init while preloading.  It is connected
 *   to no database (it reads the shared catalog pg_database only) and sleeps
 *   on its latch.  Every payidem.housekeeping_interval, when
 *   payidem.housekeeping is on and the server is not in recovery, it lists
 *   the databases that accept connections and are not templates (a
 *   connection to template1 would make CREATE DATABASE fail), and for each
 *   starts a per-database worker and waits for it to exit before it starts
 *   the next.  The interval is counted from the end of a round, so there is
 *   always a full interval between two rounds, whatever the round did.
 *
 * - A per-database worker (dynamic, never restarted), one at a time.  It
 *   connects as the bootstrap superuser, checks that extension payidem is
 *   there with the two functions it calls (an older or foreign installation
 *   is skipped quietly), and then calls, each call in a transaction of its
 *   own, payidem._close_expired_order() until it returns NULL (at most
 *   HOUSEKEEPING_MAX_CLOSES calls) and payidem._idem_purge_batch() until a
 *   batch is short (at most HOUSEKEEPING_MAX_PURGE_BATCHES).  Then it counts
 *   housekeeping_runs and exits.  An order past expire_at whose attempt is
 *   still pending is left alone: payidem.query_due() lists it for the
 *   application to ask the channel.
 *
 * Locking: each transaction holds at most one order's row lock (taken with
 * SKIP LOCKED, so a payment call holding the order is never waited on) or
 * one batch of idempotency keys (SKIP LOCKED as well).  lock_timeout bounds
 * any other wait inside close_order(), so the worker never sits on an order
 * lock that a payment call is waiting for.  The launcher takes no lock
 * beyond a catalog scan of pg_database.
 *
 * Failure modes:
 * - A database dropped between the listing and the connection: the worker
 *   fails to connect (FATAL, logged once), the launcher goes on with the
 *   next database.  DROP DATABASE waits (up to 5 s) for a worker that is
 *   connected, and a run lasts milliseconds, so DROP DATABASE succeeds.
 * - An ERROR inside a database (the extension dropped mid-run, a lock
 *   timeout): the worker logs it and exits with code 1; the launcher does
 *   not retry before the next interval, so a broken database costs one log
 *   entry per interval, never a loop.
 * - No background worker slot free (max_worker_processes): logged once, at
 *   LOG, until a worker starts again; the round ends and the next one tries.
 * - A crash of any backend: the postmaster restarts the launcher
 *   (bgw_restart_time) along with the server; so does an ERROR of the
 *   launcher itself.  SIGTERM ends either process at the next interrupt
 *   check; postmaster death ends the launcher at once.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "payidem.h"

/* One run in one database: at most this many orders looked at ... */
#define HOUSEKEEPING_MAX_CLOSES			1000
/* ... and at most this many batches of this many keys purged. */
#define HOUSEKEEPING_PURGE_BATCH		1000
#define HOUSEKEEPING_MAX_PURGE_BATCHES	100

/* The longest a worker waits for a lock inside a call (lock_timeout). */
#define HOUSEKEEPING_LOCK_TIMEOUT		"1s"

/* How both kinds of process show in pg_stat_activity (backend_type, application_name). */
#define HOUSEKEEPING_LAUNCHER_TYPE		"payidem housekeeping launcher"
#define HOUSEKEEPING_WORKER_TYPE		"payidem housekeeping"

/* The launcher comes back this long after it died (crash restarts: at once). */
#define HOUSEKEEPING_RESTART_SECONDS	10

/*
 * pg_database.datconnlimit of a database that a DROP DATABASE left half
 * done (DATCONNLIMIT_INVALID_DB, defined from 15.4 on; earlier minors never
 * store it).  Such a database refuses connections.
 */
#define HOUSEKEEPING_INVALID_DB_CONNLIMIT (-2)

/* GUCs */
static bool housekeeping_enabled = true;
static int	housekeeping_interval = 10;		/* seconds */
static int	idem_retention = 86400;		/* seconds */

/* A database the launcher will visit. */
typedef struct HousekeepingDb
{
	Oid			oid;
	NameData	name;
} HousekeepingDb;

/* launcher: the list of a round lives here, reset at each round */
static MemoryContext round_context = NULL;
/* launcher: "no slot free" was logged and no worker has started since */
static bool slots_exhausted_logged = false;

/* worker: plans prepared once per process, kept across transactions */
static SPIPlanPtr close_plan = NULL;
static SPIPlanPtr purge_plan = NULL;

PGDLLEXPORT void payidem_housekeeping_launcher_main(Datum main_arg);
PGDLLEXPORT void payidem_housekeeping_db_main(Datum main_arg);

/*
 * housekeeping_init
 *		Define the GUCs (every load) and, while preloading, register the
 *		launcher.  Called from _PG_init before the prefix is reserved.
 */
void
housekeeping_init(void)
{
	BackgroundWorker worker;

	DefineCustomBoolVariable("payidem.housekeeping",
							 gettext_noop("Runs the housekeeping worker: closes expired orders and purges old idempotency keys."),
							 gettext_noop("Off: the worker stays idle until this is turned on again and the configuration reloaded. "
										  "Needs payidem in shared_preload_libraries."),
							 &housekeeping_enabled,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("payidem.housekeeping_interval",
							gettext_noop("Time between two housekeeping rounds over the databases of the cluster."),
							gettext_noop("Counted from the end of a round; a new value applies to the wait under way."),
							&housekeeping_interval,
							10,
							1,
							86400,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("payidem.idem_retention",
							gettext_noop("How long housekeeping keeps completed and failed idempotency keys."),
							gettext_noop("A purged key can be claimed afresh, so this must outlast every retry of a request, "
										 "channel callbacks included (they may be retried for a day or more)."),
							&idem_retention,
							86400,
							60,
							INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	if (!process_shared_preload_libraries_in_progress)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = HOUSEKEEPING_RESTART_SECONDS;
	snprintf(worker.bgw_library_name, sizeof(worker.bgw_library_name), "payidem");
	snprintf(worker.bgw_function_name, sizeof(worker.bgw_function_name),
			 "payidem_housekeeping_launcher_main");
	snprintf(worker.bgw_name, sizeof(worker.bgw_name), HOUSEKEEPING_LAUNCHER_TYPE);
	snprintf(worker.bgw_type, sizeof(worker.bgw_type), HOUSEKEEPING_LAUNCHER_TYPE);
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}

/* ---------------------------------------------------------------- launcher */

/* Apply a pending SIGHUP: the new settings count from here on. */
static void
reload_if_pending(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/*
 * The databases to visit, from pg_database (a shared catalog, readable
 * without a database): those that accept connections and are not
 * templates.  The list is allocated in round_context.
 */
static List *
databases_to_visit(void)
{
	List	   *dbs = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database datform = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext oldcxt;
		HousekeepingDb *db;

		if (!datform->datallowconn || datform->datistemplate ||
			datform->datconnlimit == HOUSEKEEPING_INVALID_DB_CONNLIMIT)
			continue;
		oldcxt = MemoryContextSwitchTo(round_context);
		db = palloc(sizeof(HousekeepingDb));
		db->oid = datform->oid;
		db->name = datform->datname;
		dbs = lappend(dbs, db);
		MemoryContextSwitchTo(oldcxt);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return dbs;
}

/*
 * Start the worker for one database and wait until it has exited.  false
 * when no worker could be started (no slot free): the round stops there.
 */
static bool
visit_database(const HousekeepingDb *db)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, sizeof(worker.bgw_library_name), "payidem");
	snprintf(worker.bgw_function_name, sizeof(worker.bgw_function_name),
			 "payidem_housekeeping_db_main");
	/* 25 characters and a name of at most NAMEDATALEN - 1: never cut */
	snprintf(worker.bgw_name, sizeof(worker.bgw_name), "payidem housekeeping for %s",
			 NameStr(db->name));
	snprintf(worker.bgw_type, sizeof(worker.bgw_type), HOUSEKEEPING_WORKER_TYPE);
	worker.bgw_main_arg = ObjectIdGetDatum(db->oid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		if (!slots_exhausted_logged)
			ereport(LOG,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("payidem housekeeping could not start a worker for database \"%s\"",
							NameStr(db->name)),
					 errdetail("No background worker slot is free; housekeeping tries again every payidem.housekeeping_interval."),
					 errhint("Raise max_worker_processes (one slot for the launcher, one for its worker).")));
		slots_exhausted_logged = true;
		return false;
	}
	slots_exhausted_logged = false;

	if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	pfree(handle);
	return true;
}

/*
 * One round: every database in turn, one worker at a time.  Stops early if
 * housekeeping is turned off meanwhile or no worker can be started.
 */
static void
run_round(void)
{
	List	   *dbs;
	ListCell   *lc;

	MemoryContextReset(round_context);
	dbs = databases_to_visit();
	MemoryContextSwitchTo(round_context);
	foreach(lc, dbs)
	{
		CHECK_FOR_INTERRUPTS();
		reload_if_pending();
		if (!housekeeping_enabled || !visit_database((HousekeepingDb *) lfirst(lc)))
			break;
	}
	MemoryContextSwitchTo(TopMemoryContext);
}

/*
 * payidem_housekeeping_launcher_main
 *		Entry point of the launcher: a round every interval, for ever.  Never
 *		exits 0 (that would unregister it); SIGTERM and postmaster death end it.
 */
void
payidem_housekeeping_launcher_main(Datum main_arg)
{
	TimestampTz last_round;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* no database: shared catalogs only */
	BackgroundWorkerInitializeConnectionByOid(InvalidOid, InvalidOid, 0);
	pgstat_report_appname(HOUSEKEEPING_LAUNCHER_TYPE);
	round_context = AllocSetContextCreate(TopMemoryContext,
										  "payidem housekeeping round",
										  ALLOCSET_DEFAULT_SIZES);
	elog(DEBUG1, "payidem housekeeping launcher started");

	/* the first round one interval after the start, like every later one */
	last_round = GetCurrentTimestamp();
	for (;;)
	{
		TimestampTz next_round;
		long		timeout;

		CHECK_FOR_INTERRUPTS();
		reload_if_pending();

		/* the interval as it is now: a reload shortens or lengthens this wait */
		next_round = TimestampTzPlusMilliseconds(last_round,
												 (int64) housekeeping_interval * 1000);
		timeout = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_round);
		if (timeout <= 0)
		{
			if (housekeeping_enabled && !RecoveryInProgress())
				run_round();
			last_round = GetCurrentTimestamp();
			continue;
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ---------------------------------------------------------------- per-database worker */

/* Start one step: a transaction of its own, SPI, a snapshot. */
static void
begin_step(const char *activity)
{
	SetCurrentStatementStartTimestamp();	/* so that now() moves on */
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/* End one step: commit. */
static void
end_step(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* A schema-qualified function name for LookupFuncName. */
static List *
payidem_function_name(const char *name)
{
	return list_make2(makeString(pstrdup("payidem")), makeString(pstrdup(name)));
}

/*
 * Whether this database has extension payidem with the functions the
 * worker calls; if so, prepare and keep their plans.  In a transaction of
 * its own.
 */
static bool
prepare_housekeeping(void)
{
	Oid			no_args[1] = {InvalidOid};
	Oid			purge_args[2] = {INTERVALOID, INT4OID};
	bool		present;

	begin_step("payidem housekeeping: checking the extension");
	present = OidIsValid(get_extension_oid("payidem", true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_close_expired_order"),
								  0, no_args, true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_idem_purge_batch"),
								  2, purge_args, true));
	if (present)
	{
		close_plan = SPI_prepare("SELECT payidem._close_expired_order()", 0, NULL);
		if (close_plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		purge_plan = SPI_prepare("SELECT payidem._idem_purge_batch($1, $2)", 2, purge_args);
		if (purge_plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(close_plan) != 0 || SPI_keepplan(purge_plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
	}
	end_step();
	return present;
}

/*
 * Close expired orders, one per transaction, until none is due (or the cap).
 * Returns how many orders were looked at (closed, or found to have an
 * attempt begun meanwhile; the SQL function counts the closed ones).
 */
static int
close_expired_orders(void)
{
	int			looked_at = 0;

	while (looked_at < HOUSEKEEPING_MAX_CLOSES)
	{
		bool		none_due;
		int			rc;

		CHECK_FOR_INTERRUPTS();
		begin_step("SELECT payidem._close_expired_order()");
		rc = SPI_execute_plan(close_plan, NULL, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "payidem._close_expired_order() failed: %s", SPI_result_code_string(rc));
		(void) SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &none_due);
		end_step();
		if (none_due)
			break;
		looked_at++;
	}
	return looked_at;
}

/*
 * Purge idempotency keys past the retention, a batch per transaction, until
 * a batch comes back short (or the cap).  Returns how many were deleted.
 */
static int64
purge_idempotency_keys(void)
{
	int64		purged = 0;
	int			batch;
	Interval	retention;
	Datum		values[2];

	memset(&retention, 0, sizeof(retention));
	retention.time = (int64) idem_retention * USECS_PER_SEC;
	values[0] = IntervalPGetDatum(&retention);
	values[1] = Int32GetDatum(HOUSEKEEPING_PURGE_BATCH);

	for (batch = 0; batch < HOUSEKEEPING_MAX_PURGE_BATCHES; batch++)
	{
		bool		isnull;
		int64		deleted;
		int			rc;

		CHECK_FOR_INTERRUPTS();
		begin_step("SELECT payidem._idem_purge_batch($1, $2)");
		rc = SPI_execute_plan(purge_plan, values, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "payidem._idem_purge_batch() failed: %s", SPI_result_code_string(rc));
		deleted = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		if (isnull)
			deleted = 0;
		end_step();

		/* counted once committed: stats() never shows a purge rolled back */
		payidem_count_n(PAYIDEM_HOUSEKEEPING_KEYS_PURGED, (uint64) deleted);
		purged += deleted;
		if (deleted < HOUSEKEEPING_PURGE_BATCH)
			break;
	}
	return purged;
}

/*
 * payidem_housekeeping_db_main
 *		Entry point of a per-database worker (bgw_main_arg: the database's
 *		OID): one run, then exit.  Exits 0 when done or when the database has
 *		nothing to housekeep; an ERROR exits 1 after it is logged.
 */
void
payidem_housekeeping_db_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	int			looked_at;
	int64		purged;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* FATAL (and exit) if the database was dropped meanwhile */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	pgstat_report_appname(HOUSEKEEPING_WORKER_TYPE);
	/* never sit on an order's lock behind another lock for long */
	SetConfigOption("lock_timeout", HOUSEKEEPING_LOCK_TIMEOUT, PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * _close_expired_order() re-reads the order's attempts after taking its
	 * lock, which only READ COMMITTED shows; whatever the server's default.
	 */
	SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);

	if (!prepare_housekeeping())
		proc_exit(0);

	looked_at = close_expired_orders();
	purged = purge_idempotency_keys();
	payidem_count(PAYIDEM_HOUSEKEEPING_RUNS);
	elog(DEBUG1, "payidem housekeeping in database %u: %d expired orders looked at, " INT64_FORMAT " idempotency keys purged",
		 dboid, looked_at, purged);
	proc_exit(0);
}
