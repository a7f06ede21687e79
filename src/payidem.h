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
#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/spin.h"

#include "compat.h"
#include "errcodes.h"
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
	/* apply_payment_result() outcomes (flow.c) */
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
} PayidemDbCounters;

typedef struct PayidemShared
{
	OrderNoShared order_no;		/* order-number generator, own spinlock */
	slock_t		slots_mutex;	/* taken only to claim a slot */
	PayidemDbCounters dbs[PAYIDEM_DB_SLOTS];
} PayidemShared;

/* NULL unless payidem is in shared_preload_libraries */
extern PayidemShared *payidem_shared;

/* shmem.c */
extern void payidem_shmem_init(void);
extern void payidem_require_shmem(const char *funcname);
extern void payidem_count(PayidemCounter counter);
extern void payidem_count_n(PayidemCounter counter, uint64 n);

/* housekeeping.c */
extern void housekeeping_init(void);

/* crypto.c */
extern void crypto_define_gucs(void);

/* recon.c */
extern void recon_define_gucs(void);

/* replication.c */
extern bool payidem_require_sync_standby;
extern int	payidem_promotion_gap;
extern void replication_define_gucs(void);
extern void payidem_require_replication(const char *what);
extern void payidem_wait_for_synchronous_standbys(XLogRecPtr lsn);

/* order_no.c: a notification event id, unique across failovers as numbers are */
extern int64 order_no_next_event_id(void);

/* ledger.c */
extern bool payidem_payment_has_paid(Datum status);

/*
 * write.c: direct inserts into payidem's tables (one cache per call site), and
 * the delete of a row found by TID (40001 for one changed after a
 * REPEATABLE READ snapshot)
 */
typedef struct PayidemInsert PayidemInsert;
extern PayidemInsert *payidem_insert_define(const char *relname, int ncols, const char *const *columns,
											 const Oid *types);
extern void payidem_insert(PayidemInsert *ins, const Datum *values, const bool *nulls);
extern void payidem_delete_row(Relation rel, ItemPointer tid);

/*
 * The expressions a direct write of one table evaluates -- its CHECKs, the
 * defaults of a direct insert and the predicates of its partial indexes --
 * planned once and compiled on first use, in the memory of the cache that
 * holds them (write.c).
 */
typedef struct PayidemExprs
{
	MemoryContext context;		/* the holder's; gone with its plans */
	int			ncheck;
	Expr	  **checks;			/* planned, in relcache order (NULL: not enforced) */
	bool	   *check_replan;	/* or raw, to plan at each use (not keepable) */
	int			ndefault;
	Expr	  **defaults;		/* per column, of the holder: planned here, or NULL */
	bool	   *default_replan;	/* or raw, as for the CHECKs */
	bool		keepable;		/* none to plan at each use */
	/* the compiled ones, in compiled (under context) */
	MemoryContext compiled;
	ExprState **check_states;
	ExprState **default_states;
	int			npred;
	Oid		   *pred_index;		/* the partial indexes, by OID */
	ExprState **pred_states;	/* and their predicates */
	bool		in_use;			/* by a write under way further up the stack */
} PayidemExprs;

extern void payidem_exprs_plan(PayidemExprs *x, Relation rel, MemoryContext context, int ndefault,
							   Expr **defaults);
extern ExprState **payidem_exprs_attach(PayidemExprs *x, ResultRelInfo *rri, EState *estate, bool *attached);
extern void payidem_exprs_detach(PayidemExprs *x, bool attached);
extern bool payidem_indexes_lazy_ok(Relation rel);
extern void payidem_update_index_entries(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate);

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
extern void payidem_check_interval(const char *message, const char *what, const Interval *value,
								   bool allow_zero, int max_years, const char *hint);
extern bool payidem_text_equal(Datum a, Datum b);
extern Oid	payidem_relation_owner(Oid relid);
extern Oid	payidem_relid(const char *relname);
typedef struct PayidemAsOwner
{
	Oid			userid;
	int			sec_context;
} PayidemAsOwner;
extern void payidem_begin_as_owner(Oid owner, PayidemAsOwner *save);
extern void payidem_end_as_owner(const PayidemAsOwner *save);
extern int	payidem_attnum(TupleDesc desc, const char *name);
extern HeapTuple payidem_fetch_version(Relation heap, ItemPointer tid, Snapshot snapshot);
extern void payidem_remember_version(Relation heap, ItemPointer tid);
extern HeapTuple payidem_fetch_unique(Relation heap, const char *index, int nkeys, const Datum *keys,
									  Snapshot snapshot);
extern List *payidem_fetch_all_key_where(Relation heap, const char *index, int nkeys, const Datum *keys,
										 Snapshot snapshot, const char *column, Datum value);
extern struct _SPI_plan *payidem_saved_plan(struct _SPI_plan **cache, const char *sql, int nargs, Oid *argtypes);
/* the one relcache callback and one callback per syscache, dispatching to the parts' */
typedef void (*PayidemRelcacheCallback) (Datum arg, Oid relid);
typedef void (*PayidemSyscacheCallback) (Datum arg, int cacheid, uint32 hashvalue);
extern void payidem_register_relcache_callback(PayidemRelcacheCallback func, Datum arg);
extern void payidem_register_syscache_callback(int cacheid, PayidemSyscacheCallback func, Datum arg);

#endif							/* PAYIDEM_H */
