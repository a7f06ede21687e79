/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		payidem's shared memory: one PayidemShared struct, requested in
 *		shmem_request_hook and attached in shmem_startup_hook, plus the
 *		payidem.stats() function that reads its counters.
 *
 * Locking: the struct is created under AddinShmemInitLock and initialised
 * only when it did not exist (!found).  The order-number part has its own
 * spinlock (see order_no.c); the other counters are atomics and need none.
 * After a backend crash the postmaster rebuilds shared memory and the
 * startup hook runs again, so every field starts from its initial state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "payidem.h"

PayidemShared *payidem_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* names shown by payidem.stats(), in PayidemCounter order */
static const char *const payidem_counter_names[PAYIDEM_NUM_COUNTERS] = {
	"idem_claimed",
	"idem_in_progress",
	"idem_replay",
	"idem_reclaimed",
	"idem_mismatch",
	"transitions_applied",
	"transitions_rejected",
};

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

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	payidem_shared = ShmemInitStruct("payidem", sizeof(PayidemShared), &found);
	if (!found)
	{
		order_no_shmem_init(&payidem_shared->order_no);
		for (i = 0; i < PAYIDEM_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&payidem_shared->counters[i], 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Install the hooks; called from _PG_init only while preloading. */
void
payidem_shmem_init(void)
{
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

void
payidem_count(PayidemCounter counter)
{
	if (payidem_shared)
		pg_atomic_fetch_add_u64(&payidem_shared->counters[counter], 1);
}

static void
put_counter(ReturnSetInfo *rsinfo, const char *name, uint64 value)
{
	Datum		values[2];
	bool		nulls[2] = {false, false};

	values[0] = CStringGetTextDatum(name);
	values[1] = Int64GetDatum((int64) value);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * payidem.stats() RETURNS TABLE(name text, value bigint)
 *		One row per counter since the server started (or shared memory was
 *		last rebuilt after a crash).  Reads a few words; cheap to call.
 */
PG_FUNCTION_INFO_V1(payidem_stats);
Datum
payidem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OrderNoShared *on;
	uint64		issued,
				rollbacks,
				borrowed,
				reservations;
	int			i;

	payidem_require_shmem("stats");
	InitMaterializedSRF(fcinfo, 0);

	on = &payidem_shared->order_no;
	SpinLockAcquire(&on->mutex);
	issued = on->issued;
	rollbacks = on->rollbacks;
	borrowed = on->borrowed;
	reservations = on->reservations;
	SpinLockRelease(&on->mutex);

	put_counter(rsinfo, "order_nos_issued", issued);
	put_counter(rsinfo, "clock_rollbacks", rollbacks);
	put_counter(rsinfo, "seconds_borrowed", borrowed);
	put_counter(rsinfo, "order_no_reservations", reservations);
	for (i = 0; i < PAYIDEM_NUM_COUNTERS; i++)
		put_counter(rsinfo, payidem_counter_names[i],
					pg_atomic_read_u64(&payidem_shared->counters[i]));
	return (Datum) 0;
}
