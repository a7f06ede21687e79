/*-------------------------------------------------------------------------
 *
 * direct.h
 *		Reads and writes of payidem's tables below SQL (direct.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_DIRECT_H
#define PAYIDEM_DIRECT_H

#include "compat.h"
#include "catalog.h"

/* look-ups by key, and the version of a row at a tid */
extern HeapTuple payidem_fetch_unique(Relation heap, PayidemRelation index, int nkeys, const Datum *keys,
									  Snapshot snapshot);
extern List *payidem_fetch_all_key_where(Relation heap, PayidemRelation index, int nkeys,
										 const Datum *keys, Snapshot snapshot, const char *column,
										 Datum value);
extern List *payidem_fetch_all_by_prefix(Relation heap, PayidemRelation index, int nkeys, const Datum *keys,
										 Snapshot snapshot, bool backward);
extern bool payidem_index_fetch(Relation heap, Relation index, ScanKey skey, int nkeys, Snapshot snapshot,
								TupleTableSlot *slot);
extern bool payidem_lock_row(Relation rel, TupleTableSlot *slot, Snapshot snapshot);
extern bool payidem_lock_row_as_select(Relation rel, TupleTableSlot *slot, Snapshot snapshot,
									   LockTupleMode mode);
extern HeapTuple payidem_fetch_version(Relation heap, ItemPointer tid, Snapshot snapshot);
typedef bool (*PayidemAcceptFunc) (Relation rel, HeapTuple tuple, void *arg);
extern bool payidem_lock_skip_locked(Relation heap, ItemPointer tid, Snapshot snapshot, PayidemAcceptFunc accept,
									 void *arg, TupleTableSlot *slot);
extern bool payidem_lock_first_skip_locked(Relation heap, Relation index, ScanKey skey, int nkeys,
										   Snapshot snapshot, PayidemAcceptFunc accept, void *arg,
										   TupleTableSlot *slot);
extern void payidem_remember_version(Relation heap, ItemPointer tid);
typedef void (*PayidemRowFunc) (Relation rel, HeapTuple tuple, void *arg);
extern void payidem_scan(Relation rel, PayidemRowFunc func, void *arg);

/* inserts (one cache per call site), and the delete of a row found by TID */
typedef struct PayidemInsert PayidemInsert;
extern PayidemInsert *payidem_insert_define(PayidemRelation table, int ncols, const char *const *columns,
											 const Oid *types);
extern void payidem_insert(PayidemInsert *ins, const Datum *values, const bool *nulls);
extern int	payidem_insert_row(PayidemInsert *ins, const Datum *values, const bool *nulls, int arbiter);

/*
 * A row of table whose key columns ref_columns hold the values the insert
 * writes into columns (pairwise): the inserting table's foreign keys from
 * exactly those columns to exactly those need no check of their own for the
 * row.  Either the caller's transaction holds it locked, FOR KEY SHARE or
 * stronger, at its latest version (lock_after NULL: the check would take the
 * same lock on the same row, and it cannot go away before the transaction
 * ends); or lock_after is where the caller found it (with the active
 * snapshot), not locked: the insert locks it FOR KEY SHARE right after
 * writing its row, where the check would, and where it is gone or its key
 * changed, looks the key up as the check does and refuses the row as the
 * check would (23503).
 */
typedef struct PayidemLockedRef
{
	PayidemRelation table;
	int			ncolumns;
	const char *const *columns;
	const char *const *ref_columns;
	ItemPointer lock_after;
} PayidemLockedRef;
#define PAYIDEM_MAX_LOCKED_REFS 4

extern int	payidem_insert_row_refs(PayidemInsert *ins, const Datum *values, const bool *nulls, int arbiter,
									const PayidemLockedRef *refs, int nrefs, const Oid *domain_checked,
									uint64 checked_at);
extern uint64 payidem_domain_generation(void);
extern void payidem_delete_row(Relation rel, ItemPointer tid);

/*
 * INSERT ... ON CONFLICT DO NOTHING of one row, below the executor's
 * statement (speculative insertion), with the table's CHECK constraints
 * compiled once by the caller's cache
 */
typedef struct PayidemChecks
{
	int			n;
	ExprState **states;			/* NULL: not enforced */
	char	  **names;
	ExprContext *econtext;
} PayidemChecks;

extern void payidem_checks_compile(PayidemChecks *checks, Relation rel);
extern void payidem_checks_free(PayidemChecks *checks);
extern int	payidem_insert_new(Relation rel, Oid arbiter, const PayidemChecks *checks, int ncols,
							   const AttrNumber *attnums, const Datum *values, const bool *isnull);

/*
 * A direct update of one row of a table by its tid (payidem_update()): the
 * columns a caller may set (at most PAYIDEM_UPDATE_MAX_COLUMNS), one cache
 * per call site, made once.
 */
#define PAYIDEM_UPDATE_MAX_COLUMNS 8

typedef struct PayidemUpdate PayidemUpdate;
extern PayidemUpdate *payidem_update_define(PayidemRelation table, const char *keycol, int ncolumns,
											const char *const *columns);
extern PayidemUpdate *payidem_update_define_own(PayidemRelation table, const char *keycol, int ncolumns,
												const char *const *columns);
extern bool payidem_update(PayidemUpdate *t, ItemPointer tid, Datum key, const bool *set, Datum *values,
						   const bool *nulls, const Oid *types, const bool *keep_null, bool checked);
extern bool payidem_update_plain(Relation rel);

#endif							/* PAYIDEM_DIRECT_H */
