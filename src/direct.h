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
extern bool payidem_index_fetch(Relation heap, Relation index, ScanKey skey, int nkeys, Snapshot snapshot,
								TupleTableSlot *slot);
extern bool payidem_lock_row(Relation rel, TupleTableSlot *slot, Snapshot snapshot);
extern HeapTuple payidem_fetch_version(Relation heap, ItemPointer tid, Snapshot snapshot);
extern void payidem_remember_version(Relation heap, ItemPointer tid);
typedef void (*PayidemRowFunc) (Relation rel, HeapTuple tuple, void *arg);
extern void payidem_scan(Relation rel, PayidemRowFunc func, void *arg);

/* inserts (one cache per call site), and the delete of a row found by TID */
typedef struct PayidemInsert PayidemInsert;
extern PayidemInsert *payidem_insert_define(PayidemRelation table, int ncols, const char *const *columns,
											 const Oid *types);
extern void payidem_insert(PayidemInsert *ins, const Datum *values, const bool *nulls);
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
 * A direct update of one row of a table by its tid (payidem_update()): what
 * the caller may set, and what is built on first use and kept, dropped by
 * an invalidation of the table or of any function.
 */
#define PAYIDEM_UPDATE_MAX_COLUMNS 8

typedef struct PayidemUpdate PayidemUpdate;

/*
 * The expressions a direct write of one table evaluates -- its CHECKs, the
 * defaults of a direct insert and the predicates of its partial indexes --
 * planned once and compiled on first use, in the memory of the cache that
 * holds them.
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

struct PayidemUpdate
{
	PayidemRelation table;
	const char *keycol;			/* its key: checked against the caller's */
	const char *columns[PAYIDEM_UPDATE_MAX_COLUMNS];	/* the columns it may set */
	int			ncolumns;

	/* built on first use, dropped by an invalidation of the relation */
	bool		listed;			/* in direct.c's list, for the callbacks */
	PayidemUpdate *next;
	bool		valid;
	Oid			relid;
	MemoryContext context;
	int			natts;
	AttrNumber	keyattno;
	AttrNumber	attnos[PAYIDEM_UPDATE_MAX_COLUMNS];
	bool		isdomain[PAYIDEM_UPDATE_MAX_COLUMNS];
	void	   *domain_extra[PAYIDEM_UPDATE_MAX_COLUMNS];	/* domain_check()'s cache */
	PayidemExprs exprs;			/* its CHECKs and index predicates */
	GeneratedColumnsCompat *generated;	/* for 15's extraUpdatedCols */
	bool		indexes_lazy;	/* indexes opened only if the update is not HOT */
};

extern bool payidem_update(PayidemUpdate *t, ItemPointer tid, text *key, const bool *set, Datum *values,
						   const bool *nulls, const Oid *types, const bool *keep_null, bool checked);
extern bool payidem_update_plain(Relation rel);

#endif							/* PAYIDEM_DIRECT_H */
