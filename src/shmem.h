/*-------------------------------------------------------------------------
 *
 * shmem.h
 *		payidem's shared memory and the counters of payidem.stats()
 *		(shmem.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_SHMEM_H
#define PAYIDEM_SHMEM_H

#include "port/atomics.h"
#include "storage/spin.h"

#include "order_no.h"

/*
 * Counters shown by payidem.stats(), each kept per database (a slot of
 * PayidemDbCounters) and summed over the slots for the server.  Add new
 * ones before PAYIDEM_NUM_COUNTERS and name them in payidem_counter_names
 * (shmem.c).
 */
typedef enum PayidemCounter
{
	/* idempotency (idem.c) */
	PAYIDEM_IDEM_CLAIMED,
	PAYIDEM_IDEM_IN_PROGRESS,
	PAYIDEM_IDEM_REPLAY,
	PAYIDEM_IDEM_RECLAIMED,
	PAYIDEM_IDEM_MISMATCH,
	/* order numbers (order_no.c) */
	PAYIDEM_ORDER_NOS_ISSUED,
	PAYIDEM_CLOCK_ROLLBACKS,
	PAYIDEM_SECONDS_BORROWED,
	PAYIDEM_ORDER_NO_RESERVATIONS,
	PAYIDEM_PROMOTION_JUMPS,
	/* state machines */
	PAYIDEM_TRANSITIONS_APPLIED,
	PAYIDEM_TRANSITIONS_REJECTED,
	/* apply_payment_result() outcomes (payment_result.c) */
	PAYIDEM_PAYMENT_APPLIED,
	PAYIDEM_PAYMENT_DUPLICATE,
	PAYIDEM_PAYMENT_ANOMALY,
	PAYIDEM_PAYMENT_REJECTED,
	/* merchant notifications: notify_result() */
	PAYIDEM_NOTIFY_SENT,
	PAYIDEM_NOTIFY_RETRIED,
	PAYIDEM_NOTIFY_FAILED,
	/* housekeeping (housekeeping.c) */
	PAYIDEM_HOUSEKEEPING_RUNS,
	PAYIDEM_HOUSEKEEPING_ORDERS_CLOSED,
	PAYIDEM_HOUSEKEEPING_KEYS_PURGED,
	PAYIDEM_NUM_COUNTERS
} PayidemCounter;

/*
 * Per-database counters: a slot is taken by the first count in a database
 * and kept until shared memory is rebuilt (a restart or a crash).  Beyond
 * PAYIDEM_DB_SLOTS databases the last slot (database InvalidOid) counts for
 * every other one, so the server's totals stay exact.
 */
#define PAYIDEM_DB_SLOTS 64

typedef struct PayidemDbCounters
{
	pg_atomic_uint32 dboid;		/* InvalidOid: free (or, last slot, the rest) */
	pg_atomic_uint64 counters[PAYIDEM_NUM_COUNTERS];
	pg_atomic_uint64 housekeeping_last_run;	/* TimestampTz; 0: none yet */
} PayidemDbCounters;

typedef struct PayidemShared
{
	OrderNoShared order_no;		/* order-number generator, own spinlock */
	slock_t		slots_mutex;	/* taken only to claim a slot */
	pg_atomic_uint32 launcher_pid;	/* the housekeeping launcher's, 0: none */
	pg_atomic_uint64 launcher_started;	/* TimestampTz: when it started */
	PayidemDbCounters dbs[PAYIDEM_DB_SLOTS];
} PayidemShared;

/* NULL unless payidem is in shared_preload_libraries */
extern PayidemShared *payidem_shared;

extern void payidem_shmem_init(void (*order_no_init) (OrderNoShared *state));
extern void payidem_require_shmem(const char *funcname);
extern void payidem_count(PayidemCounter counter);
extern void payidem_count_n(PayidemCounter counter, uint64 n);
extern void payidem_note_housekeeping_run(void);
extern void payidem_note_launcher(void);

#endif							/* PAYIDEM_SHMEM_H */
