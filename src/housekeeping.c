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
 *   there with the functions it calls (an older or foreign installation is
 *   skipped quietly), removes from the expiry queue (payidem.order_expiry)
 *   the orders past their time that are no longer pending, a batch per
 *   transaction (payidem._prune_expiry_queue()), reads up to
 *   HOUSEKEEPING_MAX_CLOSES expired orders with payidem._expired_orders()
 *   from the queue, closes each with
 *   payidem._close_expired_order(order_no) in a transaction of its own, and
 *   purges idempotency keys with payidem._idem_purge_batch() a batch per
 *   transaction until a batch is short.  Each phase stops when its time
 *   budget (HOUSEKEEPING_PHASE_MS) is spent, so a run is short whatever the
 *   backlog; the next run goes on.  Then it counts housekeeping_runs and
 *   exits.  An order past expire_at whose attempt is still pending is left
 *   alone: payidem.query_due() lists it for the application to ask the
 *   channel.
 *
 * Locking: each transaction holds at most one order's row lock (taken with
 * SKIP LOCKED, so a payment call holding the order is never waited on) or
 * one batch of idempotency keys (SKIP LOCKED as well).  lock_timeout
 * (HOUSEKEEPING_LOCK_TIMEOUT, below the default deadlock_timeout) bounds any
 * other wait inside close_order(): a payment call waits on the worker for
 * at most that long, and DDL that meets the worker (DROP EXTENSION) wins
 * the deadlock check, the worker's step fails instead.  The launcher takes
 * no lock beyond a catalog scan of pg_database.
 *
 * Failure modes:
 * - A database dropped between the listing and the connection: the worker
 *   fails to connect (FATAL, logged once), the launcher goes on with the
 *   next database.  DROP DATABASE waits (up to 5 s) for a worker that is
 *   connected, and a run lasts milliseconds, so DROP DATABASE succeeds.
 * - An ERROR in one step (an order a trigger refuses to close, a lock
 *   timeout): logged with the database and the order named, that step
 *   rolled back, the run goes on with the next order and with the purge.
 *   After HOUSEKEEPING_MAX_FAILURES failed steps the run ends (the extension
 *   dropped mid-run fails every step); the launcher does not retry before
 *   the next interval, so a broken database costs a few log entries per
 *   interval, never a loop.
 * - The worker pins the settings its work depends on, whatever the database
 *   or role set: READ COMMITTED, read-write, session_replication_role =
 *   origin (replica would skip the state-machine triggers and the event).
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

#include <ctype.h>
#include <limits.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"	/* get_database_name() up to 18 */
#include "commands/extension.h"
#include "commands/trigger.h"
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
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"		/* get_database_name() from 19 */
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "catalog.h"
#include "direct.h"
#include "compat.h"
#include "errcodes.h"
#include "housekeeping.h"
#include "shmem.h"
#include "util.h"

/* One run in one database: at most this many orders looked at ... */
#define HOUSEKEEPING_MAX_CLOSES			1000
/* ... and at most this many batches of this many keys purged ... */
#define HOUSEKEEPING_PURGE_BATCH		1000
/* rows of the expiry queue looked at per transaction: each of their orders
 * is locked FOR SHARE until it commits, so a payment call on one of them
 * waits for at most this batch */
#define HOUSEKEEPING_PRUNE_BATCH		100
#define HOUSEKEEPING_MAX_PURGE_BATCHES	100
/* ... each phase for at most this long (milliseconds) ... */
#define HOUSEKEEPING_PHASE_MS			1000
/* ... and at most this many failed steps. */
#define HOUSEKEEPING_MAX_FAILURES		10

/*
 * The longest a worker waits for a lock inside a call (lock_timeout): below
 * deadlock_timeout's default (1 s), so a DBA's DDL that meets a run is not
 * the one the deadlock check cancels.
 */
#define HOUSEKEEPING_LOCK_TIMEOUT		"200ms"

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
static SPIPlanPtr list_plan = NULL;
static SPIPlanPtr close_plan = NULL;
static SPIPlanPtr purge_plan = NULL;
static SPIPlanPtr prune_plan = NULL;
static SPIPlanPtr settle_plan = NULL;	/* NULL: the database's payidem has no settle() */
/* worker: its database's name, for the error context; failed steps so far */
static char worker_dbname[NAMEDATALEN];
static int	worker_failures = 0;

PGDLLEXPORT void payidem_housekeeping_launcher_main(Datum main_arg);
PGDLLEXPORT void payidem_housekeeping_db_main(Datum main_arg);

/* payidem.settle_after: HH:MM, 00:00 to 23:59 */
static char *settle_after = NULL;

static bool
check_settle_after(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;

	if (v != NULL && strlen(v) == 5 && isdigit((unsigned char) v[0]) && isdigit((unsigned char) v[1]) &&
		v[2] == ':' && isdigit((unsigned char) v[3]) && isdigit((unsigned char) v[4]) &&
		(v[0] - '0') * 10 + (v[1] - '0') < 24 && v[3] < '6')
		return true;
	GUC_check_errmsg("invalid value for payidem.settle_after: \"%s\"", v ? v : "");
	GUC_check_errhint("Write a time of day as HH:MM, e.g. 02:00.");
	return false;
}

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

	DefineCustomStringVariable("payidem.settle_after",
							   gettext_noop("Time of day (in payidem.bill_timezone) after which housekeeping settles the day."),
							   gettext_noop("Once a day the worker runs payidem.settle(today) after this time, HH:MM."),
							   &settle_after,
							   "02:00",
							   PGC_SIGHUP,
							   0,
							   check_settle_after, NULL, NULL);

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
	/* (19: CREATE/ALTER/DROP DATABASE of it ends the worker, not wait for it) */
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION |
		BGWORKER_INTERRUPTIBLE_COMPAT;
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
	/* pg_cancel_backend() has nothing to cancel here: not an error exit */
	pqsignal(SIGINT, PG_SIG_IGN_COMPAT);
	BackgroundWorkerUnblockSignals();

	/* no database: shared catalogs only */
	BackgroundWorkerInitializeConnectionByOid(InvalidOid, InvalidOid, 0);
	pgstat_report_appname(HOUSEKEEPING_LAUNCHER_TYPE);
	payidem_note_launcher();
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
		/* the clock stepped back: never wait longer than one interval */
		if (timeout > (long) housekeeping_interval * 1000)
		{
			last_round = GetCurrentTimestamp();
			timeout = (long) housekeeping_interval * 1000;
		}
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

/*
 * A step failed: report the error (its context names the database and the
 * step), roll the step back, and go on.  Called in PG_CATCH.
 */
static void
step_failed(MemoryContext cxt)
{
	MemoryContextSwitchTo(cxt);
	EmitErrorReport();
	FlushErrorState();
	AbortCurrentTransaction();
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(cxt);
	worker_failures++;
}

/* What every message of the worker says, whatever the log_line_prefix. */
static void
housekeeping_error_context(void *arg)
{
	const char *step = (const char *) arg;

	if (step != NULL)
		errcontext("payidem housekeeping in database \"%s\", %s", worker_dbname, step);
	else
		errcontext("payidem housekeeping in database \"%s\"", worker_dbname);
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
	Oid			int_arg[1] = {INT4OID};
	Oid			text_arg[1] = {TEXTOID};
	Oid			purge_args[2] = {INTERVALOID, INT4OID};
	bool		present;

	begin_step("payidem housekeeping: checking the extension");
	present = OidIsValid(get_extension_oid("payidem", true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_expired_orders"), 1, int_arg, true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_close_expired_order"), 1, text_arg, true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_idem_purge_batch"), 2, purge_args, true)) &&
		OidIsValid(LookupFuncName(payidem_function_name("_prune_expiry_queue"), 1, int_arg, true));
	if (present)
	{
		payidem_saved_plan(&list_plan, "SELECT payidem._expired_orders($1)", 1, int_arg);
		payidem_saved_plan(&close_plan, "SELECT payidem._close_expired_order($1)", 1, text_arg);
		payidem_saved_plan(&purge_plan, "SELECT payidem._idem_purge_batch($1, $2)", 2, purge_args);
		payidem_saved_plan(&prune_plan, "SELECT payidem._prune_expiry_queue($1)", 1, int_arg);
		/* settlement came with 1.1: a database still on 1.0 has none */
		if (OidIsValid(LookupFuncName(payidem_function_name("_settle_if_due"), 0, NULL, true)))
			payidem_saved_plan(&settle_plan, "SELECT payidem._settle_if_due()", 0, NULL);
	}
	end_step();
	return present;
}

/* Whether a phase that started at start has spent its time budget. */
static bool
phase_over(TimestampTz start)
{
	return TimestampDifferenceExceeds(start, GetCurrentTimestamp(), HOUSEKEEPING_PHASE_MS) ||
		worker_failures >= HOUSEKEEPING_MAX_FAILURES;
}

/* Between two steps: SIGTERM, postmaster death. */
static void
between_steps(void)
{
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		proc_exit(1);
}

/*
 * Close expired orders: the list read once, then one order per transaction,
 * until the list is done or the phase's budget spent.  Returns how many
 * were closed (counted once committed: stats() never shows a close that
 * rolled back).
 */
static int
close_expired_orders(MemoryContext cxt)
{
	List	   *volatile orders = NIL;
	ListCell   *lc;
	TimestampTz start = GetCurrentTimestamp();
	volatile int closed = 0;
	ErrorContextCallback step_context;

	step_context.callback = housekeeping_error_context;
	step_context.arg = (void *) "listing the expired orders";
	step_context.previous = error_context_stack;
	error_context_stack = &step_context;
	PG_TRY();
	{
		Datum		max_rows = Int32GetDatum(HOUSEKEEPING_MAX_CLOSES);
		uint64		i;
		int			rc;

		begin_step("SELECT payidem._expired_orders($1)");
		rc = SPI_execute_plan(list_plan, &max_rows, NULL, true, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "payidem._expired_orders() failed: %s", SPI_result_code_string(rc));
		for (i = 0; i < SPI_processed; i++)
		{
			char	   *order_no = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
			MemoryContext oldcxt = MemoryContextSwitchTo(cxt);

			orders = lappend(orders, pstrdup(order_no));
			MemoryContextSwitchTo(oldcxt);
		}
		end_step();
	}
	PG_CATCH();
	{
		step_failed(cxt);
		orders = NIL;
	}
	PG_END_TRY();

	foreach(lc, orders)
	{
		char	   *order_no = (char *) lfirst(lc);
		char		step[64 + NAMEDATALEN];
		volatile bool done = false;

		if (phase_over(start))
			break;
		between_steps();
		snprintf(step, sizeof(step), "closing expired order %s", order_no);
		step_context.arg = (void *) step;
		PG_TRY();
		{
			Datum		arg = CStringGetTextDatum(order_no);
			bool		isnull;
			int			rc;

			begin_step("SELECT payidem._close_expired_order($1)");
			rc = SPI_execute_plan(close_plan, &arg, NULL, false, 1);
			if (rc != SPI_OK_SELECT || SPI_processed != 1)
				elog(ERROR, "payidem._close_expired_order() failed: %s", SPI_result_code_string(rc));
			done = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) &&
				!isnull;
			end_step();
		}
		PG_CATCH();
		{
			step_failed(cxt);
			done = false;
		}
		PG_END_TRY();
		if (done)
		{
			payidem_count(PAYIDEM_HOUSEKEEPING_ORDERS_CLOSED);
			closed++;
		}
	}
	error_context_stack = step_context.previous;
	return closed;
}

/*
 * Run plan (a function of payidem that deletes up to a batch of rows and
 * returns how many) a batch per transaction, until a batch comes back short,
 * the cap of batches, or the phase's budget.  Returns how many were deleted.
 */
static int64
delete_in_batches(MemoryContext cxt, SPIPlanPtr plan, Datum *values, const char *sql,
				  const char *what, int batch_size, int counter)
{
	volatile int64 total = 0;
	volatile int batch;
	TimestampTz start = GetCurrentTimestamp();
	ErrorContextCallback step_context;

	step_context.callback = housekeeping_error_context;
	step_context.arg = (void *) what;
	step_context.previous = error_context_stack;
	error_context_stack = &step_context;
	for (batch = 0; batch < HOUSEKEEPING_MAX_PURGE_BATCHES && !phase_over(start); batch++)
	{
		volatile int64 deleted = 0;
		volatile bool failed = false;

		between_steps();
		PG_TRY();
		{
			bool		isnull;
			int			rc;

			begin_step(sql);
			rc = SPI_execute_plan(plan, values, NULL, false, 1);
			if (rc != SPI_OK_SELECT || SPI_processed != 1)
				elog(ERROR, "%s failed: %s", sql, SPI_result_code_string(rc));
			deleted = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
			if (isnull)
				deleted = 0;
			end_step();
		}
		PG_CATCH();
		{
			step_failed(cxt);
			failed = true;
		}
		PG_END_TRY();
		if (failed)
			break;

		/* counted once committed: stats() never shows a deletion rolled back */
		if (counter >= 0)
			payidem_count_n((PayidemCounter) counter, (uint64) deleted);
		total += deleted;
		if (deleted < batch_size)
			break;
	}
	error_context_stack = step_context.previous;
	return total;
}

/* Idempotency keys past the retention. */
static int64
purge_idempotency_keys(MemoryContext cxt)
{
	Interval	retention;
	Datum		values[2];

	memset(&retention, 0, sizeof(retention));
	retention.time = (int64) idem_retention * USECS_PER_SEC;
	values[0] = IntervalPGetDatum(&retention);
	values[1] = Int32GetDatum(HOUSEKEEPING_PURGE_BATCH);
	return delete_in_batches(cxt, purge_plan, values, "SELECT payidem._idem_purge_batch($1, $2)",
							 "purging idempotency keys", HOUSEKEEPING_PURGE_BATCH,
							 PAYIDEM_HOUSEKEEPING_KEYS_PURGED);
}

/*
 * The day's settlement: settle(today) once the day's payidem.settle_after
 * has passed in payidem.bill_timezone, once a day (payidem._settle_if_due()
 * decides and records it).  One transaction.
 */
static bool
settle_if_due(MemoryContext cxt)
{
	volatile bool ran = false;
	ErrorContextCallback step_context;

	if (settle_plan == NULL)
		return false;
	step_context.callback = housekeeping_error_context;
	step_context.arg = (void *) "settling the day";
	step_context.previous = error_context_stack;
	error_context_stack = &step_context;
	between_steps();
	PG_TRY();
	{
		bool		isnull;
		int			rc;

		begin_step("SELECT payidem._settle_if_due()");
		rc = SPI_execute_plan(settle_plan, NULL, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "payidem._settle_if_due() failed: %s", SPI_result_code_string(rc));
		ran = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) && !isnull;
		end_step();
	}
	PG_CATCH();
	{
		step_failed(cxt);
	}
	PG_END_TRY();
	error_context_stack = step_context.previous;
	return ran;
}

/* The rows of the expiry queue whose time has passed and whose order is no longer pending. */
static int64
prune_expiry_queue(MemoryContext cxt)
{
	Datum		values[1] = {Int32GetDatum(HOUSEKEEPING_PRUNE_BATCH)};

	return delete_in_batches(cxt, prune_plan, values, "SELECT payidem._prune_expiry_queue($1)",
							 "removing settled orders from the expiry queue", HOUSEKEEPING_PRUNE_BATCH, -1);
}

/*
 * payidem_housekeeping_db_main
 *		Entry point of a per-database worker (bgw_main_arg: the database's
 *		OID): one run, then exit.  Exits 0 when done or when the database has
 *		nothing to housekeep, 1 when a step failed (each failure is logged).
 */
void
payidem_housekeeping_db_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	MemoryContext run_context;
	ErrorContextCallback db_context;
	int			closed;
	int64		purged;
	int64		pruned;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* FATAL (and exit) if the database was dropped meanwhile */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	/* application_name, so that log_line_prefix's %a names the worker too */
	SetConfigOption("application_name", HOUSEKEEPING_WORKER_TYPE, PGC_USERSET, PGC_S_OVERRIDE);
	pgstat_report_appname(HOUSEKEEPING_WORKER_TYPE);
	/* never sit on an order's lock behind another lock for long */
	SetConfigOption("lock_timeout", HOUSEKEEPING_LOCK_TIMEOUT, PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * What the work depends on, whatever the database or role settings say:
	 * _close_expired_order() re-reads the order's attempts after taking its
	 * lock, which only READ COMMITTED shows; it writes; and with
	 * session_replication_role = replica the state-machine triggers (the
	 * status log, the order.closed event) would not fire.
	 */
	SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("session_replication_role", "origin", PGC_SUSET, PGC_S_OVERRIDE);

	run_context = AllocSetContextCreate(TopMemoryContext, "payidem housekeeping run",
										ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(run_context);
	StartTransactionCommand();
	{
		char	   *name = get_database_name(dboid);

		strlcpy(worker_dbname, name ? name : "?", sizeof(worker_dbname));
	}
	CommitTransactionCommand();
	MemoryContextSwitchTo(run_context);
	db_context.callback = housekeeping_error_context;
	db_context.arg = NULL;
	db_context.previous = error_context_stack;
	error_context_stack = &db_context;

	if (!prepare_housekeeping())
		proc_exit(0);

	pruned = prune_expiry_queue(run_context);
	closed = close_expired_orders(run_context);
	purged = purge_idempotency_keys(run_context);
	if (settle_if_due(run_context))
		elog(LOG, "payidem housekeeping in database \"%s\": settled the day", worker_dbname);
	payidem_count(PAYIDEM_HOUSEKEEPING_RUNS);
	if (worker_failures == 0)
		payidem_note_housekeeping_run();
	elog(DEBUG1, "payidem housekeeping: " INT64_FORMAT " settled orders left the expiry queue, %d expired orders closed, "
		 INT64_FORMAT " idempotency keys purged, %d steps failed",
		 pruned, closed, purged, worker_failures);
	proc_exit(worker_failures > 0 ? 1 : 0);
}

/*
 * payidem._queue_expiry() — trigger order_expiry_queue, AFTER INSERT OR
 * UPDATE ON payidem."order" FOR EACH ROW.  A pending order's expire_at into
 * payidem.order_expiry, when it is not queued at that time yet: an order
 * inserted pending (a restore's COPY too: the queue is derived data, not
 * dumped), one made pending again, one whose expire_at moved while pending.
 * Every other change (the payment of an order, its close) returns before
 * any work, so a payment writes nothing to the queue.  The row is written as the
 * queue's owner (an application writes orders through payidem's functions;
 * whoever else may write them need not be able to write the queue), as
 * INSERT ... ON CONFLICT DO NOTHING, a time queued twice being the same row
 * (but create_order()'s, with a number just drawn: see fresh_order()):
 * directly (payidem_insert_row(), no statement per order), or through a
 * saved, schema-qualified plan of that statement where the queue has what a
 * direct insert cannot reproduce.
 */
static SPIPlanPtr queue_plan = NULL;

/* the status and expire_at of an order's row */
static bool
order_pending(Relation rel, HeapTuple tuple, TimestampTz *expire_at)
{
	bool		isnull;
	Datum		d;
	text	   *status;

	d = payidem_getattr(rel, tuple, "status", &isnull);
	if (isnull)
		return false;
	status = DatumGetTextPP(d);
	if (VARSIZE_ANY_EXHDR(status) != 7 || memcmp(VARDATA_ANY(status), "pending", 7) != 0)
		return false;
	d = payidem_getattr(rel, tuple, "expire_at", &isnull);
	if (isnull)
		return false;
	*expire_at = DatumGetTimestampTz(d);
	return true;
}

/*
 * The number create_order() drew from the generator for the order it is
 * inserting, "" when none (payidem_expiry_fresh_order()).  The generator
 * never gives a number twice, so no queue row holds that number yet: the
 * order's row is queued as a plain insert, without ON CONFLICT's pre-check
 * and speculative insertion (about 14,000 instructions of every
 * create_order).  Every other insert of an order -- a DBA's, a reload's
 * COPY after rows were removed under session_replication_role = replica,
 * which leaves their queue rows -- keeps ON CONFLICT DO NOTHING.  (A DBA's
 * own AFTER INSERT trigger on "order" that sorts before order_expiry_queue
 * and queues the new order itself, by rebuild_expiry_queue() or by moving
 * its expire_at and back, would make create_order() fail with the queue's
 * 23505: the one way a fresh number meets a queue row.)
 */
static char fresh_order_no[64] = "";

void
payidem_expiry_fresh_order(Datum order_no)
{
	text	   *t;
	int			len;

	fresh_order_no[0] = '\0';
	if (order_no == (Datum) 0)
		return;
	t = DatumGetTextPP(order_no);
	len = VARSIZE_ANY_EXHDR(t);
	if (len <= 0 || len >= (int) sizeof(fresh_order_no))
		return;
	memcpy(fresh_order_no, VARDATA_ANY(t), len);
	fresh_order_no[len] = '\0';
}

/* whether the order row the trigger fired for is create_order()'s, with its fresh number */
static bool
fresh_order(TriggerData *td, Datum order_no)
{
	text	   *t;

	if (!TRIGGER_FIRED_BY_INSERT(td->tg_event) || fresh_order_no[0] == '\0')
		return false;
	t = DatumGetTextPP(order_no);
	return VARSIZE_ANY_EXHDR(t) == strlen(fresh_order_no) &&
		memcmp(VARDATA_ANY(t), fresh_order_no, VARSIZE_ANY_EXHDR(t)) == 0;
}

PG_FUNCTION_INFO_V1(payidem_queue_expiry);
Datum
payidem_queue_expiry(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	tuple;
	TimestampTz expire_at;
	TimestampTz old_expire_at;
	PayidemAsOwner as_owner;
	static const char *const queue_columns[] = {"expire_at", "order_no"};
	static const Oid queue_types[] = {TIMESTAMPTZOID, TEXTOID};
	static PayidemInsert *queue_insert = NULL;
	Oid			types[2] = {TIMESTAMPTZOID, TEXTOID};
	Datum		values[2];
	bool		nulls[2] = {false, false};
	bool		isnull;
	int			rc;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(td->tg_event) || TRIGGER_FIRED_BY_UPDATE(td->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._queue_expiry() must be an AFTER INSERT OR UPDATE ... FOR EACH ROW trigger")));
	rel = td->tg_relation;
	tuple = TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple;
	if (!order_pending(rel, tuple, &expire_at))
		return PointerGetDatum(NULL);
	if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
	{
		if (order_pending(rel, td->tg_trigtuple, &old_expire_at) && old_expire_at == expire_at)
			return PointerGetDatum(NULL);	/* queued at that time already */
	}
	/* (checked only before a write: a payment's update returns above, no look-up) */
	if (RelationGetRelid(rel) != payidem_relation(PAYIDEM_ORDER))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._queue_expiry() is the trigger of payidem.\"order\" only"),
				 errdetail("It was fired on %s.", RelationGetRelationName(rel))));

	values[0] = TimestampTzGetDatum(expire_at);
	values[1] = payidem_getattr(rel, tuple, "order_no", &isnull);
	if (isnull)
		return PointerGetDatum(NULL);	/* refused by its NOT NULL */
	payidem_become_owner(payidem_owner(PAYIDEM_ORDER_EXPIRY), 0, &as_owner);
	/* directly, as the statement below would; the statement where the table needs it */
	if (queue_insert == NULL)
		queue_insert = payidem_insert_define(PAYIDEM_ORDER_EXPIRY, lengthof(queue_columns), queue_columns,
											 queue_types);
	if (payidem_insert_row(queue_insert, values, nulls,
						   fresh_order(td, values[1]) ? -1 : PAYIDEM_ORDER_EXPIRY_PKEY) < 0)
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		payidem_saved_plan(&queue_plan,
						   "INSERT INTO payidem.order_expiry (expire_at, order_no) VALUES ($1, $2)"
						   " ON CONFLICT ON CONSTRAINT order_expiry_pkey DO NOTHING",
						   2, types);
		rc = SPI_execute_plan(queue_plan, values, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "payidem: queueing the expiry of an order failed: %s", SPI_result_code_string(rc));
		SPI_finish();
	}
	payidem_become_caller(&as_owner);
	return PointerGetDatum(NULL);
}
