/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		payidem's shared memory: one PayidemShared struct, requested in
 *		shmem_request_hook and attached in shmem_startup_hook, plus the
 *		payidem.stats() function that reads its counters.
 *
 * Locking: the struct is created under AddinShmemInitLock and initialised
 * only when it did not exist (!found).  The order-number part has its own
 * spinlock (see order_no.c).  The counters are atomics in one slot per
 * database; a backend finds its slot once (a spinlock only to claim a free
 * one) and then counts with one atomic add.
 * After a backend crash the postmaster rebuilds shared memory and the
 * startup hook runs again, so every field starts from its initial state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "shmem.h"

PayidemShared *payidem_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static void (*init_order_no) (OrderNoShared *state) = NULL;

/* names shown by payidem.stats(), in PayidemCounter order */
static const char *const payidem_counter_names[PAYIDEM_NUM_COUNTERS] = {
	"idem_claimed",
	"idem_in_progress",
	"idem_replay",
	"idem_reclaimed",
	"idem_mismatch",
	"order_nos_issued",
	"clock_rollbacks",
	"seconds_borrowed",
	"order_no_reservations",
	"promotion_jumps",
	"transitions_applied",
	"transitions_rejected",
	"payment_applied",
	"payment_duplicate",
	"payment_anomaly",
	"payment_rejected",
	"notify_sent",
	"notify_retried",
	"notify_failed",
	"housekeeping_runs",
	"housekeeping_orders_closed",
	"housekeeping_keys_purged",
};

/* this backend's slot, once found (its database never changes) */
static PayidemDbCounters *my_counters = NULL;

/* Ask for our shared memory (PostgreSQL 15+: only allowed in this hook). */
static void
payidem_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(PayidemShared)));
}

/* Create or attach the struct; initialise it only when it is new. */
static void
payidem_shmem_startup(void)
{
	bool		found;
	int			i;
	int			j;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	payidem_shared = ShmemInitStruct("payidem", sizeof(PayidemShared), &found);
	if (!found)
	{
		init_order_no(&payidem_shared->order_no);
		SpinLockInit(&payidem_shared->slots_mutex);
		pg_atomic_init_u32(&payidem_shared->launcher_pid, 0);
		pg_atomic_init_u64(&payidem_shared->launcher_started, 0);
		for (i = 0; i < PAYIDEM_DB_SLOTS; i++)
		{
			pg_atomic_init_u32(&payidem_shared->dbs[i].dboid, InvalidOid);
			pg_atomic_init_u64(&payidem_shared->dbs[i].housekeeping_last_run, 0);
			for (j = 0; j < PAYIDEM_NUM_COUNTERS; j++)
				pg_atomic_init_u64(&payidem_shared->dbs[i].counters[j], 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Install the hooks; called from _PG_init only while preloading, with the
 * order-number generator's initialiser of its part of the struct.
 */
void
payidem_shmem_init(void (*order_no_init) (OrderNoShared *state))
{
	init_order_no = order_no_init;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = payidem_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = payidem_shmem_startup;
}

/*
 * Fail clearly when the library was not preloaded: the function needs shared
 * memory that only shared_preload_libraries can provide.
 */
void
payidem_require_shmem(const char *funcname)
{
	if (payidem_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("payidem is not loaded through shared_preload_libraries"),
				 errdetail("%s() needs payidem's shared memory, which exists only when the server preloads the library.",
						   funcname),
				 errhint("Add payidem to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * The counters of this backend's database: its slot, or a free one claimed
 * now, or (all taken) the last slot, which counts for every database beyond
 * the others.  NULL outside a database (e.g. the housekeeping launcher).
 */
static PayidemDbCounters *
db_counters(Oid dboid, bool claim)
{
	PayidemDbCounters *slots = payidem_shared->dbs;
	PayidemDbCounters *found = NULL;
	int			i;

	for (i = 0; i < PAYIDEM_DB_SLOTS - 1; i++)
		if (pg_atomic_read_u32(&slots[i].dboid) == dboid)
			return &slots[i];
	if (!claim)
		return NULL;
	SpinLockAcquire(&payidem_shared->slots_mutex);
	for (i = 0; i < PAYIDEM_DB_SLOTS - 1 && found == NULL; i++)
	{
		Oid			o = pg_atomic_read_u32(&slots[i].dboid);

		if (o == dboid)
			found = &slots[i];
		else if (o == InvalidOid)
		{
			pg_atomic_write_u32(&slots[i].dboid, dboid);
			found = &slots[i];
		}
	}
	SpinLockRelease(&payidem_shared->slots_mutex);
	return found ? found : &slots[PAYIDEM_DB_SLOTS - 1];
}

void
payidem_count_n(PayidemCounter counter, uint64 n)
{
	if (payidem_shared == NULL || !OidIsValid(MyDatabaseId))
		return;
	if (my_counters == NULL)
		my_counters = db_counters(MyDatabaseId, true);
	pg_atomic_fetch_add_u64(&my_counters->counters[counter], n);
}

void
payidem_count(PayidemCounter counter)
{
	payidem_count_n(counter, 1);
}

/* A housekeeping run in this database has ended now (for health()). */
void
payidem_note_housekeeping_run(void)
{
	if (payidem_shared == NULL || !OidIsValid(MyDatabaseId))
		return;
	if (my_counters == NULL)
		my_counters = db_counters(MyDatabaseId, true);
	pg_atomic_write_u64(&my_counters->housekeeping_last_run, (uint64) GetCurrentTimestamp());
}

/* The launcher is gone: no pid is left for another process to reuse. */
static void
forget_launcher(int code, Datum arg)
{
	pg_atomic_write_u32(&payidem_shared->launcher_pid, 0);
}

/* This process is the housekeeping launcher, from now on (for health()). */
void
payidem_note_launcher(void)
{
	if (payidem_shared == NULL)
		return;
	pg_atomic_write_u64(&payidem_shared->launcher_started, (uint64) GetCurrentTimestamp());
	pg_atomic_write_u32(&payidem_shared->launcher_pid, (uint32) MyProcPid);
	before_shmem_exit(forget_launcher, (Datum) 0);
}

/*
 * payidem._shared_state() RETURNS TABLE(preloaded boolean,
 *     housekeeping_running boolean, housekeeping_since timestamptz,
 *     housekeeping_tracked boolean, housekeeping_last_run timestamptz)
 *		For health(): whether the library was preloaded (shared memory
 *		exists); whether the housekeeping launcher is alive (the process that
 *		said it is one is a live server process) and since when; whether this
 *		database has counters of its own (the first PAYIDEM_DB_SLOTS - 1 to
 *		count; the others share one, and their last run is not known); and
 *		when the last housekeeping run in this database whose steps all
 *		succeeded ended since the server started (NULL: none).
 */
PG_FUNCTION_INFO_V1(payidem_shared_state);
Datum
payidem_shared_state(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {false, false, true, false, true};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "payidem: _shared_state() must return a row");
	values[0] = BoolGetDatum(payidem_shared != NULL);
	values[1] = BoolGetDatum(false);
	values[3] = BoolGetDatum(false);
	if (payidem_shared != NULL)
	{
		uint32		pid = pg_atomic_read_u32(&payidem_shared->launcher_pid);
		uint64		started = pg_atomic_read_u64(&payidem_shared->launcher_started);
		PayidemDbCounters *mine = db_counters(MyDatabaseId, true);
		bool		tracked = mine != &payidem_shared->dbs[PAYIDEM_DB_SLOTS - 1];
		uint64		last = tracked ? pg_atomic_read_u64(&mine->housekeeping_last_run) : 0;

		values[1] = BoolGetDatum(pid != 0 && BackendPidGetProc((int) pid) != NULL);
		if (started != 0)
		{
			values[2] = TimestampTzGetDatum((TimestampTz) started);
			nulls[2] = false;
		}
		values[3] = BoolGetDatum(tracked);
		if (last != 0)
		{
			values[4] = TimestampTzGetDatum((TimestampTz) last);
			nulls[4] = false;
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * payidem.stats() RETURNS TABLE(name text, value bigint, server_value bigint)
 *		One row per counter since the server started (or shared memory was
 *		last rebuilt after a crash): value counts the current database,
 *		server_value every database (value is NULL for a database beyond the
 *		first PAYIDEM_DB_SLOTS - 1 to count, which share one slot).  Reads a few words per counter, takes
 *		no lock; cheap to call.
 */
PG_FUNCTION_INFO_V1(payidem_stats);
Datum
payidem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PayidemDbCounters *mine;
	bool		shared_slot;
	int			i;
	int			j;

	payidem_require_shmem("stats");
	InitMaterializedSRF(fcinfo, 0);
	mine = db_counters(MyDatabaseId, false);
	/* no slot of its own, and none free: it counts in the shared last slot */
	shared_slot = mine == NULL &&
		pg_atomic_read_u32(&payidem_shared->dbs[PAYIDEM_DB_SLOTS - 2].dboid) != InvalidOid;

	for (i = 0; i < PAYIDEM_NUM_COUNTERS; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};
		uint64		server = 0;

		for (j = 0; j < PAYIDEM_DB_SLOTS; j++)
			server += pg_atomic_read_u64(&payidem_shared->dbs[j].counters[i]);
		values[0] = CStringGetTextDatum(payidem_counter_names[i]);
		values[1] = Int64GetDatum(mine ? (int64) pg_atomic_read_u64(&mine->counters[i]) : 0);
		nulls[1] = shared_slot;
		values[2] = Int64GetDatum((int64) server);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * payidem._count(counter text, n bigint DEFAULT 1) RETURNS void
 *		Add n to a counter of stats() from SQL (notify_result()); not granted
 *		to anyone.  Does nothing when the library was not preloaded, as the
 *		C callers' counting does.
 */
PG_FUNCTION_INFO_V1(payidem_count_sql);
Datum
payidem_count_sql(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int64		n = PG_GETARG_INT64(1);
	int			i;

	for (i = 0; i < PAYIDEM_NUM_COUNTERS; i++)
		if (strcmp(payidem_counter_names[i], name) == 0)
			break;
	if (i == PAYIDEM_NUM_COUNTERS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown payidem counter \"%s\"", name)));
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a counter only grows"),
				 errdetail("n was " INT64_FORMAT ".", n)));
	payidem_count_n((PayidemCounter) i, (uint64) n);
	PG_RETURN_VOID();
}
