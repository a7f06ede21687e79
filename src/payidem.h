/*-------------------------------------------------------------------------
 *
 * payidem.h
 *		Declarations shared between payidem's C files.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_H
#define PAYIDEM_H

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/spin.h"

#include "compat.h"
#include "errcodes.h"
#include "order_no.h"

/*
 * Counters shown by payidem.stats().  Order-number counters live inside the
 * order-number state (updated under its spinlock, which each call takes
 * anyway); the others are atomics.  Add new ones before PAYIDEM_NUM_COUNTERS
 * and name them in payidem_counter_names (shmem.c).
 */
typedef enum PayidemCounter
{
	/* idempotency (idem.c) */
	PAYIDEM_IDEM_CLAIMED,
	PAYIDEM_IDEM_IN_PROGRESS,
	PAYIDEM_IDEM_REPLAY,
	PAYIDEM_IDEM_RECLAIMED,
	PAYIDEM_IDEM_MISMATCH,
	/* state machines */
	PAYIDEM_TRANSITIONS_APPLIED,
	PAYIDEM_TRANSITIONS_REJECTED,
	PAYIDEM_NUM_COUNTERS
} PayidemCounter;

typedef struct PayidemShared
{
	OrderNoShared order_no;		/* order-number generator, own spinlock */
	pg_atomic_uint64 counters[PAYIDEM_NUM_COUNTERS];
} PayidemShared;

/* NULL unless payidem is in shared_preload_libraries */
extern PayidemShared *payidem_shared;

/* shmem.c */
extern void payidem_shmem_init(void);
extern void payidem_require_shmem(const char *funcname);
extern void payidem_count(PayidemCounter counter);

/* crypto.c */
extern void crypto_define_gucs(void);

/* recon.c */
extern void recon_define_gucs(void);

/* flow.c */
extern void flow_define_gucs(void);
extern bool payidem_paid_at_acceptable(TimestampTz created_at, TimestampTz paid_at);

/* payidem.c */
/* The outcomes of an idempotency claim, as returned and as counted in payidem.stats(). */
typedef enum IdemOutcome
{
	IDEM_CLAIMED,
	IDEM_IN_PROGRESS,
	IDEM_REPLAY,
	IDEM_RECLAIMED
} IdemOutcome;

extern int	payidem_shard_id;
extern char *payidem_quote_value(const char *value, int len);
extern bool payidem_text_equal(Datum a, Datum b);
extern Oid	payidem_relation_owner(Oid relid);

#endif							/* PAYIDEM_H */
