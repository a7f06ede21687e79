/*-------------------------------------------------------------------------
 *
 * flow.c
 *		The two writes of a first successful payment result, for
 *		apply_payment_result(): the payment becomes succeeded (with its
 *		channel transaction id, paid_at and fees) and its order paid (with the
 *		merchant notification due).
 *
 * apply_payment_result() decides everything under the row locks it holds
 * (SELECT ... FOR UPDATE of the payment, then of the order) and then calls
 * _record_payment_success() and _record_order_paid() with the rows' ctids.
 * Each is one UPDATE of one locked row, made the way logical replication's
 * apply worker makes it (ExecSimpleRelationUpdate): BEFORE and AFTER row
 * triggers fire — among them the status_guard constraint trigger, which
 * checks the status change against the whitelist and logs it, and the
 * foreign-key triggers — NOT NULL and CHECK constraints are checked, stored
 * generated columns computed, every index maintained, unique ones checked.
 * What it saves over a SQL UPDATE is the per-statement work: no executor
 * start and stop, no index scan to find the row (its ctid is known and it
 * is locked), and the table's CHECK constraints read from the catalog and
 * planned once per backend instead of for every statement (PostgreSQL 15
 * does that for each UPDATE); they are compiled per call, as an ExprState
 * may keep state in its query's memory.  The columns written that are
 * domains (transaction_id, paid_payment_no, notify_status, notify_attempts)
 * are checked against their domain, as a SQL UPDATE would.
 *
 * The planned constraints are kept per table and dropped by a relcache
 * invalidation of that table (any ALTER TABLE, a new constraint, ...) and
 * by any change of a function (a CHECK may have inlined a SQL function).
 * Run by apply_payment_result(), a SECURITY DEFINER function of the
 * extension's owner, as that owner.  When the UPDATE would be anything but
 * a plain row update for that role — statement triggers, transition tables,
 * rules, row-level security that applies, no UPDATE privilege — the
 * functions do nothing and return false, and the caller runs it in SQL.
 * Not granted to anyone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/syscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "payidem.h"

#define FLOW_MAX_COLUMNS 8

/* what one of the two functions writes, and what it keeps between calls */
typedef struct FlowTarget
{
	const char *relname;		/* in schema payidem */
	const char *keycol;			/* its key: checked against the caller's */
	const char *columns[FLOW_MAX_COLUMNS];	/* the columns it may set */
	int			ncolumns;

	/* built on first use, dropped by an invalidation of the relation */
	bool		valid;
	Oid			relid;
	MemoryContext context;
	int			natts;
	AttrNumber	keyattno;
	AttrNumber	attnos[FLOW_MAX_COLUMNS];
	bool		isdomain[FLOW_MAX_COLUMNS];
	void	   *domain_extra[FLOW_MAX_COLUMNS];	/* domain_check()'s cache */
	int			ncheck;
	Expr	  **checks;			/* the relation's CHECKs, planned, in relcache
								 * order; compiled per call (an ExprState keeps
								 * state in its query's memory) */
} FlowTarget;

enum
{
	PAY_STATUS, PAY_UPDATED_AT, PAY_TRANSACTION_ID, PAY_PAID_AT, PAY_FEE, PAY_COST
};
static FlowTarget payment_target = {
	"payment", "payment_no",
	{"status", "updated_at", "transaction_id", "paid_at", "fee_amount", "cost_amount"}, 6
};

enum
{
	ORD_STATUS, ORD_UPDATED_AT, ORD_PAID_PAYMENT_NO, ORD_PAID_AT, ORD_NOTIFY_URL,
	ORD_NOTIFY_STATUS, ORD_NEXT_NOTIFY_AT, ORD_NOTIFY_ATTEMPTS
};
static FlowTarget order_target = {
	"order", "order_no",
	{"status", "updated_at", "paid_payment_no", "paid_at", "notify_url",
	 "notify_status", "next_notify_at", "notify_attempts"}, 8
};

static bool callbacks_registered = false;
static uint64 flow_inval_count = 0;	/* bumped by every invalidation below */

static void
flow_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == payment_target.relid ||
		relid == order_target.relid)
	{
		if (relid == InvalidOid || relid == payment_target.relid)
			payment_target.valid = false;
		if (relid == InvalidOid || relid == order_target.relid)
			order_target.valid = false;
		flow_inval_count++;
	}
}

/* a changed function: a CHECK may have inlined or folded it */
static void
flow_proc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	payment_target.valid = false;
	order_target.valid = false;
	flow_inval_count++;
}

static AttrNumber
column_attno(Relation rel, const char *name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0)
			return i + 1;
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_COLUMN),
			 errmsg("column \"%s\" of relation payidem.%s does not exist",
					name, RelationGetRelationName(rel))));
	return InvalidAttrNumber;	/* keep the compiler quiet */
}

/* (re)build what t keeps, from the relation as it is now (we hold a lock) */
static void
flow_target_prepare(FlowTarget *t, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	uint64		before = flow_inval_count;
	MemoryContext oldcxt;
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("payidem.%s is not a plain table", t->relname),
				 errhint("apply_payment_result() writes payidem.%s row by row; it cannot be partitioned or replaced by a view.",
						 t->relname)));
	if (t->context == NULL)
		t->context = AllocSetContextCreate(CacheMemoryContext, "payidem flow update",
										   ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(t->context);
	t->valid = false;

	oldcxt = MemoryContextSwitchTo(t->context);
	t->natts = desc->natts;
	t->keyattno = column_attno(rel, t->keycol);
	for (i = 0; i < t->ncolumns; i++)
	{
		Oid			typid;

		t->attnos[i] = column_attno(rel, t->columns[i]);
		typid = TupleDescAttr(desc, t->attnos[i] - 1)->atttypid;
		t->isdomain[i] = get_typtype(typid) == TYPTYPE_DOMAIN;
		t->domain_extra[i] = NULL;
	}
	t->ncheck = 0;
	t->checks = NULL;
	if (desc->constr && desc->constr->num_check > 0)
	{
		ConstrCheck *check = desc->constr->check;

		t->checks = palloc(sizeof(Expr *) * desc->constr->num_check);
		for (i = 0; i < desc->constr->num_check; i++)
			t->checks[i] = expression_planner((Expr *) stringToNode(check[i].ccbin));
		t->ncheck = desc->constr->num_check;
	}
	MemoryContextSwitchTo(oldcxt);
	/* an invalidation that arrived meanwhile: build again next time */
	t->valid = (before == flow_inval_count);
}

/*
 * Update the row of payidem.<t->relname> at tid, whose key column must equal
 * key: the columns of t with set[i] take values[i]/nulls[i] (of type
 * types[i]: a column of a domain type is checked against its domain unless
 * the value already has that type), the others keep their value.  A column
 * with only_if[i] is set only if column t->columns[cond] of the row is not
 * NULL, one with keep_null[i] only to a non-NULL value; either way the
 * UPDATE names it, as SET col = CASE ... ELSE col END would.  The caller holds the row's lock (SELECT ... FOR UPDATE in this
 * transaction), so the version at tid is the latest and nobody else can
 * update it first.
 *
 * Returns false, having changed nothing, when the table has what a row-by-row
 * update cannot reproduce — statement-level UPDATE triggers, transition
 * tables, rules, row-level security that applies to the current user — or
 * the user may not update it: the caller then runs the UPDATE in SQL (which
 * does all that, or refuses).
 */
static bool
flow_update(FlowTarget *t, ItemPointer tid, text *key,
			const bool *set, Datum *values, const bool *nulls, const Oid *types,
			const bool *keep_null, int cond, const bool *only_if)
{
	Relation	rel;
	TupleDesc	desc;
	EState	   *estate;
	RangeTblEntry *rte;
	ResultRelInfo *rri;
	EPQState	epqstate;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Snapshot	snapshot;
	Bitmapset  *updated = NULL;
	Datum		oldkey;
	bool		isnull;
	bool		cond_null = true;
	int			i;

	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(flow_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, flow_proc_callback, (Datum) 0);
		callbacks_registered = true;
	}
	if (!t->valid)
	{
		t->relid = get_relname_relid(t->relname, get_namespace_oid("payidem", false));
		if (!OidIsValid(t->relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("relation payidem.%s does not exist", t->relname)));
	}
	rel = table_open(t->relid, RowExclusiveLock);
	/* the lock has processed any pending invalidation */
	if (!t->valid || t->natts != RelationGetDescr(rel)->natts)
		flow_target_prepare(t, rel);
	desc = RelationGetDescr(rel);
	if ((rel->trigdesc &&
		 (rel->trigdesc->trig_update_before_statement ||
		  rel->trigdesc->trig_update_after_statement ||
		  rel->trigdesc->trig_update_old_table ||
		  rel->trigdesc->trig_update_new_table)) ||
		rel->rd_rules != NULL ||
		check_enable_rls(t->relid, InvalidOid, false) == RLS_ENABLED ||
		pg_class_aclcheck(t->relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK)
	{
		table_close(rel, NoLock);
		return false;
	}

	estate = CreateExecutorState();
	estate->es_output_cid = GetCurrentCommandId(true);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	estate->es_snapshot = snapshot;

	/* the row, and that it is the one the caller means */
	oldslot = table_slot_create(rel, &estate->es_tupleTable);
	if (!table_tuple_fetch_row_version(rel, tid, snapshot, oldslot))
		elog(ERROR, "payidem: the locked row of payidem.%s at (%u,%u) is gone",
			 t->relname, ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
	oldkey = slot_getattr(oldslot, t->keyattno, &isnull);
	if (isnull || !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, oldkey, PointerGetDatum(key))))
		elog(ERROR, "payidem: the row of payidem.%s at (%u,%u) is not %s",
			 t->relname, ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid),
			 text_to_cstring(key));

	/* the new version: the old one with the columns set */
	newslot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsVirtual);
	ExecClearTuple(newslot);
	slot_getallattrs(oldslot);
	memcpy(newslot->tts_values, oldslot->tts_values, sizeof(Datum) * desc->natts);
	memcpy(newslot->tts_isnull, oldslot->tts_isnull, sizeof(bool) * desc->natts);
	if (cond >= 0)
		cond_null = oldslot->tts_isnull[t->attnos[cond] - 1];
	for (i = 0; i < t->ncolumns; i++)
	{
		AttrNumber	attno = t->attnos[i];

		if (!set[i])
			continue;
		/* kept, but named by the UPDATE as well (for UPDATE OF triggers) */
		updated = bms_add_member(updated, attno - FirstLowInvalidHeapAttributeNumber);
		if ((only_if != NULL && only_if[i] && cond_null) || (keep_null != NULL && keep_null[i] && nulls[i]))
			continue;
		/* a value of the column's domain type was checked when it was made */
		if (t->isdomain[i] && types[i] != TupleDescAttr(desc, attno - 1)->atttypid)
			domain_check(values[i], nulls[i], TupleDescAttr(desc, attno - 1)->atttypid,
						 &t->domain_extra[i], t->context);
		newslot->tts_values[attno - 1] = values[i];
		newslot->tts_isnull[attno - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(newslot);

	/* what a one-row UPDATE of those columns would set up */
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = t->relid;
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	/* updatedCols: for UPDATE OF triggers and the indexes' unchanged hints */
#if PG_VERSION_NUM >= 160000
	{
		RTEPermissionInfo *perminfo = makeNode(RTEPermissionInfo);

		perminfo->relid = t->relid;
		perminfo->requiredPerms = ACL_UPDATE;
		perminfo->updatedCols = updated;
		rte->perminfoindex = 1;
		ExecInitRangeTable(estate, list_make1(rte), list_make1(perminfo));
	}
#else
	rte->updatedCols = updated;
	ExecInitRangeTable(estate, list_make1(rte));
#endif
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	/* the trigger machinery finds it here instead of opening its own */
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
	/*
	 * ExecConstraints() reads the CHECKs from the catalog and plans them
	 * only when this is NULL; we compile the planned ones kept above.
	 */
	if (t->ncheck > 0)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(estate->es_query_cxt);

		rri->ri_ConstraintExprs = palloc(sizeof(ExprState *) * t->ncheck);
		for (i = 0; i < t->ncheck; i++)
			rri->ri_ConstraintExprs[i] = ExecInitExpr(t->checks[i], NULL);
		MemoryContextSwitchTo(oldcxt);
	}
	ExecOpenIndices(rri, false);
	EvalPlanQualInit(&epqstate, estate, NULL, NIL, -1);

	AfterTriggerBeginQuery();
	ExecSimpleRelationUpdate(rri, estate, &epqstate, oldslot, newslot);
	AfterTriggerEndQuery(estate);	/* the status guard runs here */

	EvalPlanQualEnd(&epqstate);
	ExecCloseResultRelations(estate);	/* its indexes, and any a trigger opened */
	ExecCloseRangeTableRelations(estate);
	ExecResetTupleTable(estate->es_tupleTable, false);
	UnregisterSnapshot(snapshot);
	FreeExecutorState(estate);
	table_close(rel, NoLock);

	/* what runs next sees the new version, as after a statement */
	CommandCounterIncrement();
	return true;
}

/*
 * payidem._record_payment_success(payment_row tid, payment_no text,
 *     transaction_id text, paid_at timestamptz, fee_amount bigint,
 *     cost_amount bigint) RETURNS boolean
 *
 * The locked payment becomes succeeded, with paid_at, the fees, updated_at =
 * now() and — unless NULL — the channel's transaction id.  False: not done
 * (see flow_update), make the UPDATE in SQL.
 */
PG_FUNCTION_INFO_V1(payidem_record_payment_success);
Datum
payidem_record_payment_success(PG_FUNCTION_ARGS)
{
	bool		set[FLOW_MAX_COLUMNS] = {false};
	Datum		values[FLOW_MAX_COLUMNS];
	bool		nulls[FLOW_MAX_COLUMNS] = {false};
	bool		keep_null[FLOW_MAX_COLUMNS] = {false};
	Oid			types[FLOW_MAX_COLUMNS] = {InvalidOid};

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3) || PG_ARGISNULL(4) || PG_ARGISNULL(5))
		elog(ERROR, "payidem._record_payment_success: a required argument is NULL");

	set[PAY_STATUS] = true;
	values[PAY_STATUS] = CStringGetTextDatum("succeeded");
	set[PAY_UPDATED_AT] = true;
	values[PAY_UPDATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	/* coalesce(transaction_id, the row's) */
	set[PAY_TRANSACTION_ID] = keep_null[PAY_TRANSACTION_ID] = true;
	nulls[PAY_TRANSACTION_ID] = PG_ARGISNULL(2);
	values[PAY_TRANSACTION_ID] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	types[PAY_TRANSACTION_ID] = get_fn_expr_argtype(fcinfo->flinfo, 2);
	set[PAY_PAID_AT] = true;
	values[PAY_PAID_AT] = PG_GETARG_DATUM(3);
	set[PAY_FEE] = true;
	values[PAY_FEE] = PG_GETARG_DATUM(4);
	set[PAY_COST] = true;
	values[PAY_COST] = PG_GETARG_DATUM(5);

	PG_RETURN_BOOL(flow_update(&payment_target, (ItemPointer) PG_GETARG_POINTER(0),
							   PG_GETARG_TEXT_PP(1), set, values, nulls, types, keep_null,
							   -1, NULL));
}

/*
 * payidem._record_order_paid(order_row tid, order_no text,
 *     paid_payment_no text, paid_at timestamptz) RETURNS boolean
 *
 * The locked order becomes paid by that payment at paid_at (updated_at =
 * now()); if it has a notify_url, its merchant notification is due now
 * (notify_status pending, next_notify_at now(), no attempts yet).  False: not
 * done (see flow_update), make the UPDATE in SQL.
 */
PG_FUNCTION_INFO_V1(payidem_record_order_paid);
Datum
payidem_record_order_paid(PG_FUNCTION_ARGS)
{
	bool		set[FLOW_MAX_COLUMNS] = {false};
	Datum		values[FLOW_MAX_COLUMNS];
	bool		nulls[FLOW_MAX_COLUMNS] = {false};
	bool		only_if[FLOW_MAX_COLUMNS] = {false};
	Oid			types[FLOW_MAX_COLUMNS] = {InvalidOid};
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		elog(ERROR, "payidem._record_order_paid: a required argument is NULL");

	set[ORD_STATUS] = true;
	values[ORD_STATUS] = CStringGetTextDatum("paid");
	set[ORD_UPDATED_AT] = true;
	values[ORD_UPDATED_AT] = TimestampTzGetDatum(now);
	set[ORD_PAID_PAYMENT_NO] = true;
	values[ORD_PAID_PAYMENT_NO] = PG_GETARG_DATUM(2);
	types[ORD_PAID_PAYMENT_NO] = get_fn_expr_argtype(fcinfo->flinfo, 2);
	set[ORD_PAID_AT] = true;
	values[ORD_PAID_AT] = PG_GETARG_DATUM(3);
	/* the notification, only for an order with a notify_url */
	set[ORD_NOTIFY_STATUS] = only_if[ORD_NOTIFY_STATUS] = true;
	values[ORD_NOTIFY_STATUS] = CStringGetTextDatum("pending");
	set[ORD_NEXT_NOTIFY_AT] = only_if[ORD_NEXT_NOTIFY_AT] = true;
	values[ORD_NEXT_NOTIFY_AT] = TimestampTzGetDatum(now);
	set[ORD_NOTIFY_ATTEMPTS] = only_if[ORD_NOTIFY_ATTEMPTS] = true;
	values[ORD_NOTIFY_ATTEMPTS] = Int32GetDatum(0);

	PG_RETURN_BOOL(flow_update(&order_target, (ItemPointer) PG_GETARG_POINTER(0),
							   PG_GETARG_TEXT_PP(1), set, values, nulls, types, NULL,
							   ORD_NOTIFY_URL, only_if));
}
