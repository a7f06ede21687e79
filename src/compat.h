/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL majors payidem supports
 *	  (15, 16, 17, 18, 19), in one place.
 *
 * Each shim is named by what changed and says in which major; the call sites
 * use the shim and carry no version test of their own.  A shim tests the
 * major only (PG_VERSION_NUM / 10000), never a minor release: a build for a
 * major must load into every minor of it, so nothing here depends on a struct
 * or a field that only some minors have.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_COMPAT_H
#define PAYIDEM_COMPAT_H

#include "postgres.h"

#include "access/genam.h"
#include "access/tableam.h"
#include "access/sysattr.h"
#include "access/tupdesc.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "nodes/parsenodes.h"
#include "optimizer/optimizer.h"
#include "postmaster/bgworker.h"
#include "rewrite/rewriteHandler.h"
#include "utils/rel.h"
#include "utils/relcache.h"

#define PAYIDEM_PG_MAJOR (PG_VERSION_NUM / 10000)

#if PAYIDEM_PG_MAJOR < 15
#error "payidem needs PostgreSQL 15 or later"
#endif

/*
 * The stored generated columns of a relation and the columns each reads
 * (attribute numbers offset by FirstLowInvalidHeapAttributeNumber, as in a
 * range table entry): what 15's planner needs to name the generated columns
 * an UPDATE recomputes (extraUpdatedCols).  Before 15.3 the executor read
 * them from the range table entry; from 15.3 on it works them out itself,
 * and 16 dropped the field, so from 16 on there is nothing to keep (NULL).
 * Built from the catalog: when a cache is built, not per row.
 */
typedef struct GeneratedColumnsCompat
{
	int			n;
	AttrNumber *attnos;
	Bitmapset **reads;
} GeneratedColumnsCompat;

static inline GeneratedColumnsCompat *
GeneratedColumnsOfCompat(Relation rel)
{
#if PAYIDEM_PG_MAJOR < 16
	TupleDesc	desc = RelationGetDescr(rel);
	GeneratedColumnsCompat *gen;
	int			i;

	if (desc->constr == NULL || !desc->constr->has_generated_stored)
		return NULL;
	gen = palloc0(sizeof(GeneratedColumnsCompat));
	gen->attnos = palloc(sizeof(AttrNumber) * desc->natts);
	gen->reads = palloc(sizeof(Bitmapset *) * desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		Bitmapset  *reads = NULL;

		if (TupleDescAttr(desc, i)->attgenerated != ATTRIBUTE_GENERATED_STORED)
			continue;
		pull_varattnos(build_column_default(rel, i + 1), 1, &reads);
		gen->attnos[gen->n] = i + 1;
		gen->reads[gen->n] = reads;
		gen->n++;
	}
	return gen;
#else
	(void) rel;
	return NULL;
#endif
}

/*
 * The range table of a one-relation INSERT or UPDATE made without a plan.
 *
 * 16 moved the permission fields of RangeTblEntry (requiredPerms,
 * insertedCols, updatedCols) into an RTEPermissionInfo of their own, in a
 * list beside the range table: an entry without one (perminfoindex 0) fails
 * when the executor reports a CHECK violation.  18 added the set of range
 * table indexes that survived pruning (here: the one relation).  On 15 the
 * entry also names the stored generated columns (generated, from
 * GeneratedColumnsOfCompat(); NULL for none) that read an updated column,
 * as 15's planner does: every 15 minor has the field, and 15.0-15.2 read it.
 *
 * No permission is checked through these (the caller has); they say what the
 * statement writes, for UPDATE OF triggers, unchanged-index hints and the
 * columns an error may show.
 */
static inline void
ExecInitRangeTableOneRelationCompat(EState *estate, Relation rel, LOCKMODE lockmode,
									AclMode perms, Bitmapset *inserted_cols,
									Bitmapset *updated_cols,
									const GeneratedColumnsCompat *generated)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = lockmode;
#if PAYIDEM_PG_MAJOR >= 16
	(void) generated;
	{
		RTEPermissionInfo *perminfo = makeNode(RTEPermissionInfo);

		perminfo->relid = RelationGetRelid(rel);
		perminfo->requiredPerms = perms;
		perminfo->insertedCols = inserted_cols;
		perminfo->updatedCols = updated_cols;
		rte->perminfoindex = 1;
#if PAYIDEM_PG_MAJOR >= 18
		ExecInitRangeTable(estate, list_make1(rte), list_make1(perminfo), bms_make_singleton(1));
#else
		ExecInitRangeTable(estate, list_make1(rte), list_make1(perminfo));
#endif
	}
#else
	rte->requiredPerms = perms;
	rte->insertedCols = inserted_cols;
	rte->updatedCols = updated_cols;
	if (generated != NULL)
	{
		int			i;

		for (i = 0; i < generated->n; i++)
			if (bms_overlap(generated->reads[i], updated_cols) ||
				bms_is_member(InvalidAttrNumber - FirstLowInvalidHeapAttributeNumber,
							  generated->reads[i]))
				rte->extraUpdatedCols =
					bms_add_member(rte->extraUpdatedCols,
								   generated->attnos[i] - FirstLowInvalidHeapAttributeNumber);
	}
	ExecInitRangeTable(estate, list_make1(rte));
#endif
}

/* 16 added the result relations that an EvalPlanQual recheck may lock. */
#if PAYIDEM_PG_MAJOR >= 16
#define EvalPlanQualInitCompat(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1, NIL)
#else
#define EvalPlanQualInitCompat(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1)
#endif

/*
 * The index entries of a newly inserted row (never a HOT update: every index,
 * not only the summarizing ones), checking the arbiter indexes for a
 * conflict instead of raising a unique violation.
 *
 * 16 added onlySummarizing (true: only BRIN-like indexes, after a HOT
 * update).  19 folded update, noDupErr and onlySummarizing into flags.
 */
#if PAYIDEM_PG_MAJOR >= 19
#define ExecInsertIndexTuplesNoDupErrCompat(rri, slot, estate, spec_conflict, arbiters) \
	ExecInsertIndexTuples((rri), (estate), EIIT_NO_DUPE_ERROR, (slot), (arbiters), (spec_conflict))
#elif PAYIDEM_PG_MAJOR >= 16
#define ExecInsertIndexTuplesNoDupErrCompat(rri, slot, estate, spec_conflict, arbiters) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, true, (spec_conflict), (arbiters), false)
#else
#define ExecInsertIndexTuplesNoDupErrCompat(rri, slot, estate, spec_conflict, arbiters) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, true, (spec_conflict), (arbiters))
#endif

/* The index entries of an updated row that was not a HOT update (every index). */
#if PAYIDEM_PG_MAJOR >= 19
#define ExecInsertIndexTuplesUpdateCompat(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (estate), EIIT_IS_UPDATE, (slot), NIL, NULL)
#elif PAYIDEM_PG_MAJOR >= 16
#define ExecInsertIndexTuplesUpdateCompat(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), true, false, NULL, NIL, false)
#else
#define ExecInsertIndexTuplesUpdateCompat(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), true, false, NULL, NIL)
#endif

/*
 * Whether a row to insert conflicts in one of the arbiter indexes (false:
 * the conflicting row's tid in *conflict_tid).  18 added the tid of a row
 * just inserted, to leave out of the check (conflict detection in logical
 * replication); a check before the insert has none.
 */
#if PAYIDEM_PG_MAJOR >= 18
#define ExecCheckIndexConstraintsCompat(rri, slot, estate, conflict_tid, arbiters) \
	ExecCheckIndexConstraints((rri), (slot), (estate), (conflict_tid), NULL, (arbiters))
#else
#define ExecCheckIndexConstraintsCompat(rri, slot, estate, conflict_tid, arbiters) \
	ExecCheckIndexConstraints((rri), (slot), (estate), (conflict_tid), (arbiters))
#endif

/*
 * An index scan with keys and no ordering.  18 added the instrumentation a
 * scan may report to EXPLAIN (none here); 19 added flags (none).
 */
#if PAYIDEM_PG_MAJOR >= 19
#define index_beginscan_compat(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), 0, SO_NONE)
#elif PAYIDEM_PG_MAJOR >= 18
#define index_beginscan_compat(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), 0)
#else
#define index_beginscan_compat(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), 0)
#endif

/* A plain sequential scan of a table; 19 added flags (none). */
#if PAYIDEM_PG_MAJOR >= 19
#define table_beginscan_compat(rel, snapshot) \
	table_beginscan((rel), (snapshot), 0, NULL, SO_NONE)
#else
#define table_beginscan_compat(rel, snapshot) \
	table_beginscan((rel), (snapshot), 0, NULL)
#endif

/*
 * The table's primary key index, InvalidOid if it has none that is checked
 * immediately.  18 made a deferrable primary key visible here on request;
 * before, one was never returned.
 */
#if PAYIDEM_PG_MAJOR >= 18
#define RelationGetPrimaryKeyIndexCompat(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define RelationGetPrimaryKeyIndexCompat(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * The CHECK constraints of a result relation, compiled, one per entry of the
 * relation's TupleConstr check array: the executor compiles them from the
 * catalog only while this is NULL.  18 renamed the field
 * (ri_CheckConstraintExprs) and added NOT ENFORCED constraints, which are
 * never evaluated and have a NULL entry.
 */
#if PAYIDEM_PG_MAJOR >= 18
#define ResultRelInfoCheckExprs(rri) ((rri)->ri_CheckConstraintExprs)
#define ConstrCheckIsEnforced(check) ((check)->ccenforced)
#else
#define ResultRelInfoCheckExprs(rri) ((rri)->ri_ConstraintExprs)
#define ConstrCheckIsEnforced(check) ((void) (check), true)
#endif

/* Whether a table has generated columns of any kind (18 added virtual ones). */
#if PAYIDEM_PG_MAJOR >= 18
#define TupleDescHasGeneratedColumnsCompat(desc) \
	((desc)->constr && ((desc)->constr->has_generated_stored || (desc)->constr->has_generated_virtual))
#else
#define TupleDescHasGeneratedColumnsCompat(desc) \
	((desc)->constr && (desc)->constr->has_generated_stored)
#endif

/*
 * A CHECK constraint of rel as the executor evaluates it (not yet planned).
 * 18 added virtual generated columns, stored as NULL: a CHECK that reads
 * one is evaluated with the column's expression in its place.
 */
static inline Node *
CheckConstraintExprCompat(Relation rel, ConstrCheck *check)
{
	Node	   *expr = stringToNode(check->ccbin);

#if PAYIDEM_PG_MAJOR >= 18
	expr = expand_generated_columns_in_expr(expr, rel, 1);
#endif
	return expr;
}

/*
 * EXECUTE (or another right) on a function: 16 folded the per-kind ACL
 * checks into object_aclcheck().
 */
#if PAYIDEM_PG_MAJOR >= 16
#define ProcAclCheckCompat(proc, role, mode) object_aclcheck(ProcedureRelationId, (proc), (role), (mode))
#else
#define ProcAclCheckCompat(proc, role, mode) pg_proc_aclcheck((proc), (role), (mode))
#endif

/*
 * USAGE (or another right) on a foreign server: the same fold in 16.
 */
#if PAYIDEM_PG_MAJOR >= 16
#define ForeignServerAclCheckCompat(server, role, mode) object_aclcheck(ForeignServerRelationId, (server), (role), (mode))
#else
#define ForeignServerAclCheckCompat(server, role, mode) pg_foreign_server_aclcheck((server), (role), (mode))
#endif

/*
 * 19: pqsignal() takes a handler of two arguments (SIGNAL_ARGS), and
 * SIG_IGN is passed as PG_SIG_IGN.
 */
#if PAYIDEM_PG_MAJOR >= 19
#define PG_SIG_IGN_COMPAT PG_SIG_IGN
#else
#define PG_SIG_IGN_COMPAT SIG_IGN
#endif

/*
 * 19: a background worker flag, BGWORKER_INTERRUPTIBLE, makes CREATE, ALTER
 * and DROP DATABASE of the worker's database end the worker instead of
 * waiting (up to 5 s) for it to leave.  Before 19 there is no such flag:
 * the housekeeping worker's short runs are what keeps those commands from
 * failing.
 */
#if PAYIDEM_PG_MAJOR >= 19
#define BGWORKER_INTERRUPTIBLE_COMPAT BGWORKER_INTERRUPTIBLE
#else
#define BGWORKER_INTERRUPTIBLE_COMPAT 0
#endif

/*
 * 19: table_tuple_delete() takes a bitmask of options (the changing-partition
 * flag among them) before the snapshot, in place of a last boolean.  Here:
 * no crosscheck snapshot, not a move to another partition.
 */
static inline TM_Result
TableTupleDeleteCompat(Relation rel, ItemPointer tid, CommandId cid, Snapshot snapshot,
					   bool wait, TM_FailureData *tmfd)
{
#if PAYIDEM_PG_MAJOR >= 19
	return table_tuple_delete(rel, tid, cid, 0, snapshot, InvalidSnapshot, wait, tmfd);
#else
	return table_tuple_delete(rel, tid, cid, snapshot, InvalidSnapshot, wait, tmfd, false);
#endif
}

/*
 * 17: an index AM may keep state across the inserts of a statement (BRIN
 * does), which index_insert_cleanup() ends before the index is closed.
 */
#if PAYIDEM_PG_MAJOR >= 17
#define IndexInsertCleanupCompat(irel, info) index_insert_cleanup((irel), (info))
#else
#define IndexInsertCleanupCompat(irel, info) ((void) (irel), (void) (info))
#endif

#endif							/* PAYIDEM_COMPAT_H */
