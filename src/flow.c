/*-------------------------------------------------------------------------
 *
 * flow.c
 *		apply_payment_result(), and the two writes of a first successful
 *		payment result: the payment becomes succeeded (with its channel
 *		transaction id, paid_at and fees) and its order paid (whose
 *		order.paid event a row trigger writes).
 *
 * apply_payment_result() (at the end of this file) decides a repeated and a
 * first success itself and passes every other call to the PL/pgSQL
 * _apply_payment_result().  Either decides everything under the row locks
 * it holds (the order, then the payment, as SELECT ... FOR NO KEY UPDATE) and then
 * makes the two writes with the rows' ctids: the C part directly, the
 * PL/pgSQL part through _record_payment_success() and _record_order_paid().
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
 * domains (transaction_id, paid_payment_no)
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

#include "access/genam.h"
#include "access/relation.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_func.h"
#include "replication/logicalworker.h"
#include "rewrite/rewriteHandler.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/syscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "order_no_codec.h"
#include "payment_decision.h"
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
	PayidemExprs exprs;			/* its CHECKs and index predicates (write.c) */
	GeneratedColumnsCompat *generated;	/* for 15's extraUpdatedCols */
	bool		indexes_lazy;	/* indexes opened only if the update is not HOT */
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
	ORD_STATUS, ORD_UPDATED_AT, ORD_PAID_PAYMENT_NO, ORD_PAID_AT
};
static FlowTarget order_target = {
	"order", "order_no",
	{"status", "updated_at", "paid_payment_no", "paid_at"}, 4
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
	/*
	 * What was built before may still be in use by a flow_update() further
	 * up the stack (a trigger that applies another payment): it goes when
	 * the transaction ends, not now.
	 */
	if (t->context != NULL)
		MemoryContextSetParent(t->context, TopTransactionContext);
	t->context = AllocSetContextCreate(CacheMemoryContext, "payidem flow update",
									   ALLOCSET_SMALL_SIZES);
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
	t->generated = GeneratedColumnsOfCompat(rel);
	MemoryContextSwitchTo(oldcxt);
	t->indexes_lazy = payidem_indexes_lazy_ok(rel);
	payidem_exprs_plan(&t->exprs, rel, t->context, 0, NULL);
	/* an invalidation that arrived meanwhile: build again next time */
	t->valid = (before == flow_inval_count);
}

/*
 * May the current user update rel (t's table) row by row, as a SQL UPDATE
 * would?  Not if it has statement-level UPDATE triggers, transition tables,
 * rules or row-level security that applies, or the user lacks UPDATE.
 */
static bool
flow_target_plain(FlowTarget *t, Relation rel)
{
	return !((rel->trigdesc &&
			  (rel->trigdesc->trig_update_before_statement ||
			   rel->trigdesc->trig_update_after_statement ||
			   rel->trigdesc->trig_update_old_table ||
			   rel->trigdesc->trig_update_new_table)) ||
			 rel->rd_rules != NULL ||
			 check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED ||
			 pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_UPDATE) != ACLCHECK_OK);
}

/*
 * Update the row of payidem.<t->relname> at tid, whose key column must equal
 * key: the columns of t with set[i] take values[i]/nulls[i] (of type
 * types[i]: a column of a domain type is checked against its domain unless
 * the value already has that type), the others keep their value.  A column
 * with keep_null[i] is set only to a non-NULL value; the UPDATE names it
 * anyway, as SET col = coalesce(value, col) would.  The caller holds the
 * row's lock (SELECT ... FOR UPDATE in this transaction), so the version at
 * tid is the latest and nobody else can update it first.
 *
 * Returns false, having changed nothing, when the table has what a row-by-row
 * update cannot reproduce (flow_target_plain()), unless the caller checked
 * that already in this transaction (checked): the caller then runs the
 * UPDATE in SQL (which does all that, or refuses).
 */
static bool
flow_update(FlowTarget *t, ItemPointer tid, text *key,
			const bool *set, Datum *values, const bool *nulls, const Oid *types,
			const bool *keep_null, bool checked)
{
	Relation	rel;
	TupleDesc	desc;
	EState	   *estate;
	ResultRelInfo *rri;
	EPQState	epqstate;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Snapshot	snapshot;
	Bitmapset  *updated = NULL;
	Datum		oldkey;
	bool		isnull;
	bool		attached;
	int			i;

	if (!callbacks_registered)
	{
		payidem_register_relcache_callback(flow_relcache_callback, (Datum) 0);
		payidem_register_syscache_callback(PROCOID, flow_proc_callback, (Datum) 0);
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
	if (!checked && !flow_target_plain(t, rel))
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
	for (i = 0; i < t->ncolumns; i++)
	{
		AttrNumber	attno = t->attnos[i];

		if (!set[i])
			continue;
		/* kept, but named by the UPDATE as well (for UPDATE OF triggers) */
		updated = bms_add_member(updated, attno - FirstLowInvalidHeapAttributeNumber);
		if (keep_null != NULL && keep_null[i] && nulls[i])
			continue;
		/* a value of the column's domain type was checked when it was made */
		if (t->isdomain[i] && types[i] != TupleDescAttr(desc, attno - 1)->atttypid)
			domain_check(values[i], nulls[i], TupleDescAttr(desc, attno - 1)->atttypid,
						 &t->domain_extra[i], t->context);
		newslot->tts_values[attno - 1] = values[i];
		newslot->tts_isnull[attno - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(newslot);
	ItemPointerSetInvalid(&newslot->tts_tid);	/* until the update makes it */

	/*
	 * what a one-row UPDATE of those columns would set up; the updated
	 * columns are for UPDATE OF triggers and the indexes' unchanged hints
	 */
	ExecInitRangeTableOneRelationCompat(estate, rel, RowExclusiveLock, ACL_UPDATE, NULL, updated,
										t->generated);
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	/* the trigger machinery finds it here instead of opening its own */
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
	if (!t->indexes_lazy)
		ExecOpenIndices(rri, false);
	EvalPlanQualInitCompat(&epqstate, estate);

	(void) payidem_exprs_attach(&t->exprs, rri, estate, &attached);
	PG_TRY();
	{
		AfterTriggerBeginQuery();
		ExecSimpleRelationUpdate(rri, estate, &epqstate, oldslot, newslot);
		if (t->indexes_lazy)
			payidem_update_index_entries(rri, newslot, estate);
		/* for the look-ups by key of this transaction's triggers */
		payidem_remember_version(rel, &newslot->tts_tid);
		AfterTriggerEndQuery(estate);	/* the status guard runs here */
	}
	PG_FINALLY();
	{
		payidem_exprs_detach(&t->exprs, attached);
	}
	PG_END_TRY();

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
 * The locked payment at tid (key payment_no) becomes succeeded, with paid_at,
 * the fees, updated_at = now() and — unless txn_null — the channel's
 * transaction id txn (of type txn_type).  False: not done (see flow_update).
 */
static bool
record_payment_success(ItemPointer tid, text *payment_no, Datum txn, bool txn_null, Oid txn_type,
					   TimestampTz paid_at, Datum fee, bool fee_null, Datum cost, bool cost_null,
					   bool checked)
{
	bool		set[FLOW_MAX_COLUMNS] = {false};
	Datum		values[FLOW_MAX_COLUMNS];
	bool		nulls[FLOW_MAX_COLUMNS] = {false};
	bool		keep_null[FLOW_MAX_COLUMNS] = {false};
	Oid			types[FLOW_MAX_COLUMNS] = {InvalidOid};

	set[PAY_STATUS] = true;
	values[PAY_STATUS] = CStringGetTextDatum("succeeded");
	set[PAY_UPDATED_AT] = true;
	values[PAY_UPDATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	/* coalesce(transaction_id, the row's) */
	set[PAY_TRANSACTION_ID] = keep_null[PAY_TRANSACTION_ID] = true;
	nulls[PAY_TRANSACTION_ID] = txn_null;
	values[PAY_TRANSACTION_ID] = txn_null ? (Datum) 0 : txn;
	types[PAY_TRANSACTION_ID] = txn_type;
	set[PAY_PAID_AT] = true;
	values[PAY_PAID_AT] = TimestampTzGetDatum(paid_at);
	set[PAY_FEE] = true;
	values[PAY_FEE] = fee;
	nulls[PAY_FEE] = fee_null;
	set[PAY_COST] = true;
	values[PAY_COST] = cost;
	nulls[PAY_COST] = cost_null;

	return flow_update(&payment_target, tid, payment_no, set, values, nulls, types, keep_null,
					   checked);
}

/*
 * The locked order at tid (key order_no) becomes paid by payment_no (of type
 * payment_no_type) at paid_at (updated_at = now()); its order.paid event is
 * written by the row trigger status_notify, as for any writer.  False:
 * not done (see flow_update).
 */
static bool
record_order_paid(ItemPointer tid, text *order_no, Datum payment_no, Oid payment_no_type,
				  TimestampTz paid_at, bool checked)
{
	bool		set[FLOW_MAX_COLUMNS] = {false};
	Datum		values[FLOW_MAX_COLUMNS];
	bool		nulls[FLOW_MAX_COLUMNS] = {false};
	Oid			types[FLOW_MAX_COLUMNS] = {InvalidOid};
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	set[ORD_STATUS] = true;
	values[ORD_STATUS] = CStringGetTextDatum("paid");
	set[ORD_UPDATED_AT] = true;
	values[ORD_UPDATED_AT] = TimestampTzGetDatum(now);
	set[ORD_PAID_PAYMENT_NO] = true;
	values[ORD_PAID_PAYMENT_NO] = payment_no;
	types[ORD_PAID_PAYMENT_NO] = payment_no_type;
	set[ORD_PAID_AT] = true;
	values[ORD_PAID_AT] = TimestampTzGetDatum(paid_at);

	return flow_update(&order_target, tid, order_no, set, values, nulls, types, NULL,
					   checked);
}

/*
 * payidem._record_payment_success(payment_row tid, payment_no text,
 *     transaction_id text, paid_at timestamptz, fee_amount bigint,
 *     cost_amount bigint) RETURNS boolean
 *
 * record_payment_success() for the PL/pgSQL implementation.  False: not
 * done, make the UPDATE in SQL.
 */
PG_FUNCTION_INFO_V1(payidem_record_payment_success);
Datum
payidem_record_payment_success(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3) || PG_ARGISNULL(4) || PG_ARGISNULL(5))
		elog(ERROR, "payidem._record_payment_success: a required argument is NULL");

	PG_RETURN_BOOL(record_payment_success((ItemPointer) PG_GETARG_POINTER(0), PG_GETARG_TEXT_PP(1),
										  PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2),
										  PG_ARGISNULL(2), get_fn_expr_argtype(fcinfo->flinfo, 2),
										  PG_GETARG_TIMESTAMPTZ(3),
										  PG_GETARG_DATUM(4), false, PG_GETARG_DATUM(5), false,
										  false));
}

/*
 * payidem._record_order_paid(order_row tid, order_no text,
 *     paid_payment_no text, paid_at timestamptz) RETURNS boolean
 *
 * record_order_paid() for the PL/pgSQL implementation.  False: not done,
 * make the UPDATE in SQL.
 */
PG_FUNCTION_INFO_V1(payidem_record_order_paid);
Datum
payidem_record_order_paid(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		elog(ERROR, "payidem._record_order_paid: a required argument is NULL");

	PG_RETURN_BOOL(record_order_paid((ItemPointer) PG_GETARG_POINTER(0), PG_GETARG_TEXT_PP(1),
									 PG_GETARG_DATUM(2), get_fn_expr_argtype(fcinfo->flinfo, 2),
									 PG_GETARG_TIMESTAMPTZ(3), false));
}

/*
 * ---------------------------------------------------------------------------
 * apply_payment_result(): the first success of a pending payment, in C
 *
 * payidem.apply_payment_result() is this C function.  It decides two cases
 * itself, the ones a payment platform sees most:
 *
 *   - a repeated success of a payment that already succeeded (the same
 *     amount and transaction id): 'duplicate', read from the committed row
 *     without a lock;
 *   - the first success of a pending payment whose order is pending, with
 *     the payment's amount, a paid_at payidem_paid_at_acceptable() takes
 *     (or none: the time of the call),
 *     and a transaction id no other payment of the channel has: 'applied' —
 *     the order is locked, then the payment (the lock order of every flow
 *     function, docs/payment-flow.md); the fees are computed from the
 *     rates; the payment becomes succeeded and the order paid by the direct
 *     updates above (status_guard, the bookkeeping triggers, CHECKs,
 *     foreign keys and indexes as for an UPDATE).  The payment's row is the
 *     record of the decision; no idempotency key is written (DESIGN §4: the
 *     application's keys and payidem's decisions never meet).
 *
 * Everything else — a failure or close report, a conflicting result, a
 * refusal, an anomaly, an invalid argument (a success without transaction
 * id or amount among them), a payment or order in any other status, a
 * transaction in REPEATABLE READ or SERIALIZABLE, a table with what the
 * direct updates cannot reproduce (statement triggers, rules, row-level
 * security that applies, missing privileges), an index or column that is
 * not as installed — goes, with the same arguments, to
 * payidem._apply_payment_result(), the PL/pgSQL implementation of the whole
 * contract, before anything is written.  The row locks taken by then are
 * the ones that function takes first anyway (the order, then the payment),
 * so it finds them held.
 *
 * Each step reads with a new snapshot, as a statement of a volatile
 * function would: the look-up, then — after the order's and the payment's
 * locks — the transaction-id check and the rates.  A row is locked the way
 * SELECT ... FOR NO KEY UPDATE locks it in READ COMMITTED: its latest version,
 * waiting for a concurrent writer, and checked again.
 *
 * Not a second implementation to keep in step: the SQL function decides
 * every case with a branch of its own; this one takes the same decisions
 * for the two above only, and the regress, isolation and storm tests run
 * both (a payment whose order is closed, say, goes through both).
 * ---------------------------------------------------------------------------
 */

/* a unique btree index of the fast path, and its key columns */
typedef struct ApplyIndex
{
	const char *name;			/* in schema payidem */
	Oid			relid;
	int			nkeys;
	RegProcedure eqproc[2];		/* the equality of each key column */
	Oid			collation[2];
} ApplyIndex;

/* what the fast path keeps, built on first use, dropped by invalidations */
static struct
{
	bool		valid;
	bool		usable;			/* everything found as installed */
	Oid			payment, order, merchant, channel, binding, paid;
	ApplyIndex	payment_pkey, payment_txn, order_pkey, merchant_pkey, channel_pkey, binding_pkey;
	AttrNumber	p_payment_no, p_order_no, p_channel_no, p_amount, p_status, p_txn, p_created_at;
	Oid			p_payment_no_type;
	AttrNumber	o_order_no, o_merchant_no, o_status;
	AttrNumber	m_fee_rate, c_fee_rate, b_fee_rate;
	AttrNumber	pp_channel_no, pp_txn, pp_payment_no;	/* payment_paid's */
	/* the SQL implementation, for every other case */
	FmgrInfo   *fallback;
	Oid			fallback_oid;
	uint32		fallback_hash;	/* of its pg_proc row, in the syscache */
	bool		fallback_stale; /* that row changed */
	/* the privileges and row security checked for this user */
	Oid			checked_user;
	bool		checked_row_security;
	bool		checked_ok;
}			apply;

static bool apply_callbacks_registered = false;

static void
apply_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == apply.payment || relid == apply.order ||
		relid == apply.merchant || relid == apply.channel || relid == apply.binding ||
		relid == apply.paid || relid == apply.payment_pkey.relid || relid == apply.payment_txn.relid ||
		relid == apply.order_pkey.relid || relid == apply.merchant_pkey.relid ||
		relid == apply.channel_pkey.relid || relid == apply.binding_pkey.relid)
	{
		apply.valid = false;
		apply.checked_user = InvalidOid;
	}
}

/* a changed function (the fallback replaced?) or role: look again */
static void
apply_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	if (cacheid == PROCOID)
	{
		apply.valid = false;
		if (hashvalue == 0 || hashvalue == apply.fallback_hash)
			apply.fallback_stale = true;
	}
	apply.checked_user = InvalidOid;
}

/* a column, which must be of base type basetype */
static AttrNumber
apply_attno(Oid relid, const char *name, Oid basetype, bool *ok)
{
	AttrNumber	attno = get_attnum(relid, name);

	if (attno <= 0 || getBaseType(get_atttype(relid, attno)) != basetype)
		*ok = false;
	return attno;
}

/*
 * Find a unique btree index by name, on the columns expected, without
 * predicate or expressions; its equality procedures and collations.
 */
static void
apply_index(ApplyIndex *ix, const char *name, Oid nsp, Oid table, AttrNumber col1,
			AttrNumber col2, bool *ok)
{
	Relation	irel;
	int			i;

	ix->name = name;
	ix->relid = get_relname_relid(name, nsp);
	if (!OidIsValid(ix->relid) || !*ok)
	{
		*ok = false;
		return;
	}
	irel = index_open(ix->relid, AccessShareLock);
	ix->nkeys = col2 ? 2 : 1;
	if (irel->rd_rel->relam != BTREE_AM_OID || !irel->rd_index->indisunique ||
		!irel->rd_index->indisvalid || !irel->rd_index->indisready || !irel->rd_index->indislive ||
		irel->rd_index->indrelid != table ||
		irel->rd_index->indnkeyatts != ix->nkeys ||
		RelationGetIndexPredicate(irel) != NIL ||
		RelationGetIndexExpressions(irel) != NIL ||
		irel->rd_index->indkey.values[0] != col1 ||
		(col2 && irel->rd_index->indkey.values[1] != col2))
		*ok = false;
	else
	{
		for (i = 0; i < ix->nkeys; i++)
		{
			Oid			op = get_opfamily_member(irel->rd_opfamily[i], irel->rd_opcintype[i],
												 irel->rd_opcintype[i], BTEqualStrategyNumber);

			if (!OidIsValid(op) || irel->rd_opcintype[i] != TEXTOID)
			{
				*ok = false;
				break;
			}
			ix->eqproc[i] = get_opcode(op);
			ix->collation[i] = irel->rd_indcollation[i];
		}
	}
	index_close(irel, AccessShareLock);
}

static void
apply_prepare(void)
{
	Oid			nsp = get_namespace_oid("payidem", false);
	Oid			argtypes[7] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, JSONBOID};
	Oid			fallback;
	bool		ok = true;

	if (!apply_callbacks_registered)
	{
		payidem_register_relcache_callback(apply_relcache_callback, (Datum) 0);
		payidem_register_syscache_callback(PROCOID, apply_syscache_callback, (Datum) 0);
		payidem_register_syscache_callback(AUTHOID, apply_syscache_callback, (Datum) 0);
		payidem_register_syscache_callback(AUTHMEMROLEMEM, apply_syscache_callback, (Datum) 0);
		apply_callbacks_registered = true;
	}

	/*
	 * The SQL implementation must be there, whatever else is not.  Set up
	 * again only when its pg_proc row changed (the old FmgrInfo is left
	 * behind: a call may still be using it).
	 */
	fallback = LookupFuncName(list_make2(makeString("payidem"), makeString("_apply_payment_result")),
							  7, argtypes, false);
	if (apply.fallback == NULL || apply.fallback_stale || fallback != apply.fallback_oid)
	{
		FmgrInfo   *f = MemoryContextAlloc(TopMemoryContext, sizeof(FmgrInfo));

		apply.fallback_stale = false;
		apply.fallback_oid = fallback;
		apply.fallback_hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(fallback));
		fmgr_info_cxt(fallback, f, TopMemoryContext);
		apply.fallback = f;
	}

	apply.valid = true;			/* an invalidation from here on: again */
	apply.checked_user = InvalidOid;
	apply.payment = get_relname_relid("payment", nsp);
	apply.order = get_relname_relid("order", nsp);
	apply.merchant = get_relname_relid("merchant", nsp);
	apply.channel = get_relname_relid("channel", nsp);
	apply.binding = get_relname_relid("merchant_channel", nsp);
	apply.paid = get_relname_relid("payment_paid", nsp);
	if (!OidIsValid(apply.payment) || !OidIsValid(apply.order) || !OidIsValid(apply.merchant) ||
		!OidIsValid(apply.channel) || !OidIsValid(apply.binding) || !OidIsValid(apply.paid))
	{
		apply.usable = false;
		return;
	}
	apply.p_payment_no = apply_attno(apply.payment, "payment_no", TEXTOID, &ok);
	apply.p_payment_no_type = get_atttype(apply.payment, apply.p_payment_no);
	apply.p_order_no = apply_attno(apply.payment, "order_no", TEXTOID, &ok);
	apply.p_channel_no = apply_attno(apply.payment, "channel_no", TEXTOID, &ok);
	apply.p_amount = apply_attno(apply.payment, "amount", INT8OID, &ok);
	apply.p_status = apply_attno(apply.payment, "status", TEXTOID, &ok);
	apply.p_txn = apply_attno(apply.payment, "transaction_id", TEXTOID, &ok);
	apply.p_created_at = apply_attno(apply.payment, "created_at", TIMESTAMPTZOID, &ok);
	apply.o_order_no = apply_attno(apply.order, "order_no", TEXTOID, &ok);
	apply.o_merchant_no = apply_attno(apply.order, "merchant_no", TEXTOID, &ok);
	apply.o_status = apply_attno(apply.order, "status", TEXTOID, &ok);
	apply.m_fee_rate = apply_attno(apply.merchant, "fee_rate", NUMERICOID, &ok);
	apply.c_fee_rate = apply_attno(apply.channel, "fee_rate", NUMERICOID, &ok);
	apply.b_fee_rate = apply_attno(apply.binding, "fee_rate", NUMERICOID, &ok);
	apply_index(&apply.payment_pkey, "payment_pkey", nsp, apply.payment, apply.p_payment_no, 0, &ok);
	apply.pp_channel_no = apply_attno(apply.paid, "channel_no", TEXTOID, &ok);
	apply.pp_txn = apply_attno(apply.paid, "transaction_id", TEXTOID, &ok);
	apply.pp_payment_no = apply_attno(apply.paid, "payment_no", TEXTOID, &ok);
	apply_index(&apply.payment_txn, "payment_transaction_key", nsp, apply.paid,
				apply.pp_channel_no, apply.pp_txn, &ok);
	apply_index(&apply.order_pkey, "order_pkey", nsp, apply.order, apply.o_order_no, 0, &ok);
	apply_index(&apply.merchant_pkey, "merchant_pkey", nsp, apply.merchant,
				apply_attno(apply.merchant, "merchant_no", TEXTOID, &ok), 0, &ok);
	apply_index(&apply.channel_pkey, "channel_pkey", nsp, apply.channel,
				apply_attno(apply.channel, "channel_no", TEXTOID, &ok), 0, &ok);
	apply_index(&apply.binding_pkey, "merchant_channel_pkey", nsp, apply.binding,
				apply_attno(apply.binding, "merchant_no", TEXTOID, &ok),
				apply_attno(apply.binding, "channel_no", TEXTOID, &ok), &ok);
	/* an invalidation while we looked: apply.valid is false again */
	apply.usable = ok;
}

/*
 * May the current user do the fast path's reads and writes as the SQL
 * function would, with nothing the direct updates cannot reproduce?  Kept
 * per user and row_security setting until an invalidation.
 */
static bool
apply_allowed(void)
{
	Oid			user = GetUserId();
	Oid			reads[4] = {apply.merchant, apply.channel, apply.binding, apply.paid};
	bool		ok = true;
	int			i;

	if (apply.checked_user == user && apply.checked_row_security == row_security)
		return apply.checked_ok;

	for (i = 0; i < 4 && ok; i++)
		ok = check_enable_rls(reads[i], InvalidOid, false) != RLS_ENABLED &&
			pg_class_aclcheck(reads[i], user, ACL_SELECT) == ACLCHECK_OK;
	if (ok)
	{
		Relation	rel = table_open(apply.payment, AccessShareLock);

		ok = flow_target_plain(&payment_target, rel) &&
			pg_class_aclcheck(apply.payment, user, ACL_SELECT) == ACLCHECK_OK;
		table_close(rel, NoLock);
	}
	if (ok)
	{
		Relation	rel = table_open(apply.order, AccessShareLock);

		ok = flow_target_plain(&order_target, rel) &&
			pg_class_aclcheck(apply.order, user, ACL_SELECT) == ACLCHECK_OK;
		table_close(rel, NoLock);
	}
	if (apply.valid)
	{
		apply.checked_user = user;
		apply.checked_row_security = row_security;
		apply.checked_ok = ok;
	}
	return ok;
}

/* the outcomes of a look-up */
#define FETCH_FOUND		1
#define FETCH_NONE		0
#define FETCH_STALE		(-1)	/* what we knew of the tables changed: SQL */

/*
 * The one row of heap visible to snapshot whose key in unique index ix is
 * keys[], into slot (with its tid): FETCH_FOUND, or FETCH_NONE.  FETCH_STALE
 * if the index is gone or an invalidation processed on locking it changed
 * what apply_prepare() found (a concurrent REINDEX CONCURRENTLY, say).
 */
static int
apply_fetch(Relation heap, ApplyIndex *ix, Snapshot snapshot, Datum *keys, TupleTableSlot *slot)
{
	Relation	irel = try_relation_open(ix->relid, AccessShareLock);
	IndexScanDesc scan;
	ScanKeyData skey[2];
	int			found;
	int			i;

	if (irel == NULL)
		return FETCH_STALE;
	if (!apply.valid || irel->rd_rel->relkind != RELKIND_INDEX)
	{
		relation_close(irel, AccessShareLock);
		return FETCH_STALE;
	}

	for (i = 0; i < ix->nkeys; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   ix->collation[i], ix->eqproc[i], keys[i]);
	scan = index_beginscan_compat(heap, irel, snapshot, ix->nkeys);
	index_rescan(scan, skey, ix->nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot) ? FETCH_FOUND : FETCH_NONE;
	index_endscan(scan);
	index_close(irel, NoLock);
	return found;
}

/*
 * Open (and lock) a table of the fast path; NULL, with nothing held, if an
 * invalidation processed on locking it changed what apply_prepare() found.
 */
static Relation
apply_open(Oid relid, LOCKMODE mode)
{
	Relation	rel = table_open(relid, mode);

	if (!apply.valid)
	{
		table_close(rel, mode);
		return NULL;
	}
	return rel;
}

/*
 * SELECT ... FOR NO KEY UPDATE of the row in slot, in READ COMMITTED: its
 * latest version, waiting for a concurrent writer; the slot then holds that
 * version.  False if the row is gone (deleted) or cannot be locked here.
 * The lock of the SQL path, and of an UPDATE that keeps the key: foreign
 * keys' KEY SHARE locks do not wait for it.
 */
static bool
apply_lock(Relation rel, TupleTableSlot *slot, Snapshot snapshot)
{
	ItemPointerData tid = slot->tts_tid;
	TM_FailureData tmfd;

	return table_tuple_lock(rel, &tid, snapshot, slot, GetCurrentCommandId(true),
							LockTupleNoKeyExclusive, LockWaitBlock,
							TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd) == TM_Ok;
}

static bool
text_is(Datum d, const char *s)
{
	text	   *t = DatumGetTextPP(d);
	size_t		len = strlen(s);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), s, len) == 0;
}

/*
 * A rate: column attno of the row of table relid whose key in index ix is
 * keys[], copied out (*isnull if NULL or no row).  FETCH_FOUND, FETCH_NONE
 * or FETCH_STALE as for apply_fetch().
 */
static int
apply_fetch_rate(Oid relid, ApplyIndex *ix, Datum *keys, AttrNumber attno,
				 Datum *value, bool *isnull)
{
	Relation	rel = apply_open(relid, AccessShareLock);
	TupleTableSlot *slot;
	int			found;

	*isnull = true;
	if (rel == NULL)
		return FETCH_STALE;
	slot = table_slot_create(rel, NULL);
	found = apply_fetch(rel, ix, GetActiveSnapshot(), keys, slot);
	if (found == FETCH_FOUND)
	{
		*value = slot_getattr(slot, attno, isnull);
		if (!*isnull)
			*value = datumCopy(*value, false, -1);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return found;
}

typedef enum ApplyFast
{
	APPLY_FALLBACK,				/* not decided here: the SQL function decides */
	APPLY_DUPLICATE,
	APPLY_APPLIED
} ApplyFast;

/*
 * The fast path, with the arguments already found to be of its kind (a
 * valid success report).  Writes nothing unless it returns APPLY_APPLIED.
 */

/*
 * The transaction-level advisory lock on a channel's transaction id, which
 * two deliveries applying one transaction id to two payments take: the one
 * place its key is made (the label's hash and that of channel_no/txn, as
 * pg_advisory_xact_lock(int4, int4) would take them).  Without waiting
 * (false if another delivery holds it), or waiting.
 */
static bool
lock_transaction_id(Datum channel_no, text *txn, bool wait)
{
	static const char label[] = "payidem.transaction_id";
	text	   *channel = DatumGetTextPP(channel_no);
	int			clen = VARSIZE_ANY_EXHDR(channel);
	int			tlen = VARSIZE_ANY_EXHDR(txn);
	char	   *buf = palloc(clen + 1 + tlen);
	int32		key1;
	int32		key2;
	LOCKTAG		tag;
	LockAcquireResult res;

	memcpy(buf, VARDATA_ANY(channel), clen);
	buf[clen] = '/';
	memcpy(buf + clen + 1, VARDATA_ANY(txn), tlen);
	key1 = DatumGetInt32(hash_any((const unsigned char *) label, sizeof(label) - 1));
	key2 = DatumGetInt32(hash_any((const unsigned char *) buf, clen + 1 + tlen));
	pfree(buf);
	/* as pg_advisory_xact_lock(int4, int4) sets it (SET_LOCKTAG_INT32) */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) key1, (uint32) key2, 2);
	res = LockAcquire(&tag, ExclusiveLock, false, !wait);
	return res != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * payidem._lock_transaction_id(channel_no text, transaction_id text,
 *     wait boolean) RETURNS boolean: the lock above, for
 *     _apply_payment_result(); true if taken (always, when waiting).
 */
PG_FUNCTION_INFO_V1(payidem_lock_transaction_id);
Datum
payidem_lock_transaction_id(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		elog(ERROR, "payidem._lock_transaction_id: a required argument is NULL");
	PG_RETURN_BOOL(lock_transaction_id(PG_GETARG_DATUM(0), PG_GETARG_TEXT_PP(1), PG_GETARG_BOOL(2)));
}

/*
 * The facts decide_payment_result() takes from the payment in slot (its
 * order's status and the transaction id's owner still unread); false if a
 * column it needs is NULL (not as installed: the SQL function's).
 */
static bool
payment_facts_of(TupleTableSlot *slot, PaymentFacts *f)
{
	bool		status_null;
	bool		amount_null;
	bool		created_null;
	bool		txn_null;
	Datum		txn;

	memset(f, 0, sizeof(*f));
	f->found = true;
	f->txn_taken = FACT_UNREAD;
	f->status = DatumGetTextPP(slot_getattr(slot, apply.p_status, &status_null));
	f->amount = DatumGetInt64(slot_getattr(slot, apply.p_amount, &amount_null));
	f->created_at = DatumGetTimestampTz(slot_getattr(slot, apply.p_created_at, &created_null));
	txn = slot_getattr(slot, apply.p_txn, &txn_null);
	f->txn = txn_null ? NULL : DatumGetTextPP(txn);
	return !status_null && !amount_null && !created_null;
}

/*
 * The fast path, for a valid success report: decides with
 * decide_payment_result() from what it reads, answers a duplicate, and
 * writes a first success of a pending payment of a pending order.  Writes
 * nothing unless it returns APPLY_APPLIED; anything else is the SQL
 * function's.
 */
static ApplyFast
apply_fast(const PaymentReport *r)
{
	Relation	payment;
	Relation	order;
	TupleTableSlot *pslot;
	TupleTableSlot *oslot;
	Datum		keys[2];
	Datum		d;
	bool		isnull;
	Datum		p_payment_no;
	Datum		p_order_no;
	Datum		p_channel_no;
	Datum		merchant_rate = (Datum) 0;
	bool		merchant_rate_null = true;
	Datum		rate = (Datum) 0;
	bool		rate_null = true;
	Datum		cost_rate = (Datum) 0;
	bool		cost_rate_null = true;
	PaymentFacts facts;
	PaymentDecision decision;
	TimestampTz paid_at = r->paid_at_null ? GetCurrentTransactionStartTimestamp() : r->paid_at;
	ItemPointerData payment_tid;
	ItemPointerData order_tid;
	ApplyFast	result = APPLY_FALLBACK;

	/*
	 * 1. the payment as committed, unlocked: a repeat of a success is
	 * answered from it; only the first success of a pending payment goes on.
	 * The payment is read as by a SELECT (AccessShareLock), locked as by FOR
	 * NO KEY UPDATE (RowShareLock), updated by flow_update()
	 * (RowExclusiveLock).
	 */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	payment = apply_open(apply.payment, AccessShareLock);
	if (payment == NULL)
	{
		PopActiveSnapshot();
		return APPLY_FALLBACK;
	}
	pslot = table_slot_create(payment, NULL);
	/* what the SQL function may read, and how: row security, privileges */
	if (!apply_allowed())
		goto done;
	keys[0] = PointerGetDatum(r->payment_no);
	if (apply_fetch(payment, &apply.payment_pkey, GetActiveSnapshot(), keys, pslot) != FETCH_FOUND ||
		!payment_facts_of(pslot, &facts))
		goto done;
	decision = decide_payment_result(r, &facts);
	if (decision.verdict == VERDICT_DUPLICATE)
	{
		result = APPLY_DUPLICATE;
		goto done;
	}
	if ((decision.verdict != VERDICT_READ_ORDER && decision.verdict != VERDICT_CHECK_TXN) ||
		!text_is(PointerGetDatum(facts.status), "pending"))
		goto done;
	p_order_no = datumCopy(slot_getattr(pslot, apply.p_order_no, &isnull), false, -1);

	/*
	 * 2. the lock order of every flow function: the order, then its
	 * payment.  The order, locked.
	 */
	order = apply_open(apply.order, RowShareLock);
	if (order == NULL)
		goto done;
	oslot = table_slot_create(order, NULL);
	keys[0] = p_order_no;
	if (apply_fetch(order, &apply.order_pkey, GetActiveSnapshot(), keys, oslot) != FETCH_FOUND ||
		!apply_lock(order, oslot, GetActiveSnapshot()) || !apply.valid)
		goto done_order;
	d = slot_getattr(oslot, apply.o_order_no, &isnull);
	if (isnull || !payidem_text_equal(d, p_order_no))
		goto done_order;
	d = slot_getattr(oslot, apply.o_status, &isnull);
	if (isnull)
		goto done_order;
	order_tid = oslot->tts_tid;

	/* 3. the payment, locked, still pending; then a new snapshot, as for a next statement */
	LockRelationOid(apply.payment, RowShareLock);
	if (!apply.valid || !apply_lock(payment, pslot, GetActiveSnapshot()))
		goto done_order;
	PopActiveSnapshot();
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	p_payment_no = slot_getattr(pslot, apply.p_payment_no, &isnull);
	if (isnull || !payidem_text_equal(p_payment_no, PointerGetDatum(r->payment_no)) ||
		!payment_facts_of(pslot, &facts) || !text_is(PointerGetDatum(facts.status), "pending"))
		goto done_order;
	facts.order_status = DatumGetTextPP(d);
	payment_tid = pslot->tts_tid;
	slot_getallattrs(pslot);
	p_channel_no = pslot->tts_values[apply.p_channel_no - 1];
	decision = decide_payment_result(r, &facts);

	/*
	 * 4. a transaction id another payment of the channel has.  Under the
	 * lock that the SQL path takes too, read with the latest snapshot: a
	 * delivery of the same id for another payment that committed a moment
	 * ago is seen (not met as a unique violation at the update).  A
	 * delivery still holding the lock goes to SQL, which waits for it.
	 */
	if (decision.verdict == VERDICT_CHECK_TXN)
	{
		Relation	paid;
		TupleTableSlot *xslot;
		Snapshot	latest;
		int			taken;

		if (!lock_transaction_id(p_channel_no, r->txn, false))
			goto done_order;
		paid = apply_open(apply.paid, AccessShareLock);
		if (paid == NULL)
			goto done_order;
		xslot = table_slot_create(paid, NULL);
		keys[0] = p_channel_no;
		keys[1] = PointerGetDatum(r->txn);
		latest = RegisterSnapshot(GetLatestSnapshot());
		taken = apply_fetch(paid, &apply.payment_txn, latest, keys, xslot);
		UnregisterSnapshot(latest);
		if (taken == FETCH_FOUND)
		{
			d = slot_getattr(xslot, apply.pp_payment_no, &isnull);
			if (payidem_text_equal(d, PointerGetDatum(r->payment_no)))
				taken = FETCH_NONE;
		}
		ExecDropSingleTupleTableSlot(xslot);
		table_close(paid, NoLock);
		if (taken == FETCH_STALE)
			goto done_order;
		facts.txn_taken = taken == FETCH_FOUND;
		decision = decide_payment_result(r, &facts);
	}
	if (decision.verdict != VERDICT_APPLIED)
		goto done_order;		/* transaction_conflict, paid_after_close, ... */

	/* 5. the rates of the fees: the merchant's, its binding's to the channel, the channel's */
	{
		Datum		merchant_no = slot_getattr(oslot, apply.o_merchant_no, &isnull);

		keys[0] = merchant_no;
		keys[1] = p_channel_no;
		if (apply_fetch_rate(apply.binding, &apply.binding_pkey, keys, apply.b_fee_rate,
							 &rate, &rate_null) == FETCH_STALE ||
			apply_fetch_rate(apply.merchant, &apply.merchant_pkey, keys, apply.m_fee_rate,
							 &merchant_rate, &merchant_rate_null) != FETCH_FOUND)
			goto done_order;
		keys[0] = p_channel_no;
		if (apply_fetch_rate(apply.channel, &apply.channel_pkey, keys, apply.c_fee_rate,
							 &cost_rate, &cost_rate_null) != FETCH_FOUND)
			goto done_order;
	}

	/*
	 * 6. Decided: applied.  The payment succeeded, the order paid: the
	 * direct updates, each seeing what came before, as a next statement
	 * would.  The payment's row is the record of the decision: a repeat
	 * finds it succeeded (step 1, or the SQL function under the same locks).
	 */
	{
		Datum		fee;
		Datum		cost;
		bool		fee_null;
		bool		cost_null;

		payment_fees(facts.amount, merchant_rate, merchant_rate_null, rate, rate_null,
					 cost_rate, cost_rate_null, &fee, &fee_null, &cost, &cost_null);
		PopActiveSnapshot();
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (!record_payment_success(&payment_tid, r->payment_no, PointerGetDatum(r->txn), false,
									TEXTOID, paid_at, fee, fee_null, cost, cost_null, true))
			elog(ERROR, "payidem: payment %s could not be updated directly",
				 text_to_cstring(r->payment_no));
		PopActiveSnapshot();
		PushActiveSnapshot(GetTransactionSnapshot());	/* after flow_update's CCI */
		/*
		 * the payment's own number, of its column's type (a domain): as SET
		 * paid_payment_no = p.payment_no, not checked again
		 */
		if (!record_order_paid(&order_tid, DatumGetTextPP(p_order_no), p_payment_no,
							   apply.p_payment_no_type, paid_at, true))
			elog(ERROR, "payidem: order %s could not be updated directly",
				 TextDatumGetCString(p_order_no));
	}
	result = APPLY_APPLIED;

done_order:
	ExecDropSingleTupleTableSlot(oslot);
	table_close(order, NoLock);
done:
	ExecDropSingleTupleTableSlot(pslot);
	table_close(payment, NoLock);
	PopActiveSnapshot();
	return result;
}

/*
 * payidem.apply_payment_result(payment_no text, source text, status text,
 *     transaction_id text, amount bigint, paid_at timestamptz, raw jsonb)
 *     RETURNS text
 *
 * See the section header above; payidem._apply_payment_result() is the
 * contract in full.
 */
PG_FUNCTION_INFO_V1(payidem_apply_payment_result);
Datum
payidem_apply_payment_result(PG_FUNCTION_ARGS)
{
	LOCAL_FCINFO(sql, 7);
	Datum		result;
	int			i;
	PaymentReport r;

	payidem_require_replication("apply_payment_result()");
	memset(&r, 0, sizeof(r));
	r.payment_no = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	r.status = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	r.txn = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	r.amount_null = PG_ARGISNULL(4);
	r.amount = r.amount_null ? 0 : PG_GETARG_INT64(4);
	r.paid_at_null = PG_ARGISNULL(5);
	r.paid_at = r.paid_at_null ? 0 : PG_GETARG_TIMESTAMPTZ(5);
	payment_result_args_valid(r.payment_no, PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1), r.status, r.txn,
							  r.amount_null, r.amount, r.paid_at_null, r.paid_at, true);
	r.success = text_is(PointerGetDatum(r.status), "succeeded");
	if (!apply.valid)
		apply_prepare();

	/* a success, in READ COMMITTED */
	if (apply.usable && r.success && !IsolationUsesXactSnapshot() && !XactReadOnly)
	{
		ApplyFast	fast = apply_fast(&r);

		if (fast == APPLY_DUPLICATE)
		{
			payidem_count(PAYIDEM_PAYMENT_DUPLICATE);
			PG_RETURN_TEXT_P(cstring_to_text("duplicate"));
		}
		if (fast == APPLY_APPLIED)
		{
			payidem_count(PAYIDEM_PAYMENT_APPLIED);
			PG_RETURN_TEXT_P(cstring_to_text("applied"));
		}
	}

	/* every other case: the SQL function, with the same arguments */
	if (!apply.valid)
		apply_prepare();
	InitFunctionCallInfoData(*sql, apply.fallback, 7, PG_GET_COLLATION(), NULL, NULL);
	for (i = 0; i < 7; i++)
	{
		sql->args[i].value = PG_GETARG_DATUM(i);
		sql->args[i].isnull = PG_ARGISNULL(i);
	}
	result = FunctionCallInvoke(sql);
	if (sql->isnull)
		PG_RETURN_NULL();
	/* the outcome, counted in stats() as the fast path counts its own */
	if (text_is(result, "applied"))
		payidem_count(PAYIDEM_PAYMENT_APPLIED);
	else if (text_is(result, "duplicate"))
		payidem_count(PAYIDEM_PAYMENT_DUPLICATE);
	else if (text_is(result, "anomaly"))
		payidem_count(PAYIDEM_PAYMENT_ANOMALY);
	else if (text_is(result, "rejected"))
		payidem_count(PAYIDEM_PAYMENT_REJECTED);
	PG_RETURN_DATUM(result);
}

/*
 * payidem._payment_keys() -- trigger status_keys, AFTER INSERT OR UPDATE OR
 * DELETE ... FOR EACH ROW on payment: the payment's keys that change when it
 * is paid or ends, kept beside it so that no index of payment names status,
 * transaction_id or paid_at (the update that records a success is HOT).
 *
 *   payidem.payment_pending (order_no, payment_no): a row while the attempt
 *     is pending; its primary key is the one-pending-attempt-per-order rule.
 *   payidem.payment_paid (payment_no, channel_no, transaction_id, paid_at):
 *     a row while the payment has a transaction id or a paid_at; its unique
 *     key is the transaction id's uniqueness per channel, its other index
 *     reconciliation's look-up by the time paid (and the trigger's, for a
 *     payment without a transaction id).
 *
 * An event whose old and new versions have the same keys changes nothing.
 * Any other makes the keys those of the payment as it stands now -- not of
 * the event's new version, which a later write may have replaced already (a
 * trigger of the application that updated the payment again, whose own
 * event came first): the payment's rows under the keys of the event's old
 * and new versions and of the current one are removed unless they are the
 * current version's, which are then added where missing.  A row left under
 * a key of another version is removed by that version's own event (every
 * version but the last is the old one of an event), so in whatever order
 * the events come, once all have come the keys are those of the last
 * version; and a key of the current version is looked for before it is
 * added, so a row of the payment itself is never taken for another's.  Written as the keys' owner, with direct
 * inserts and deletes (no SQL), seeing what the statement wrote; a key
 * another payment holds is the unique violation its constraint names.
 */
typedef struct PaymentKeys
{
	bool		exists;
	bool		pending;		/* a payment_pending row is needed */
	bool		paid;			/* a payment_paid row is needed */
	Datum		payment_no;
	Datum		order_no;
	Datum		channel_no;
	Datum		txn;
	bool		txn_null;
	Datum		paid_at;
	bool		paid_at_null;
} PaymentKeys;

static Datum
payment_col(Relation rel, HeapTuple tuple, const char *name, bool *isnull)
{
	int			attnum = payidem_attnum(RelationGetDescr(rel), name);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation payidem.%s does not exist",
						name, RelationGetRelationName(rel))));
	return heap_getattr(tuple, attnum, RelationGetDescr(rel), isnull);
}

static void
payment_keys_of(Relation rel, HeapTuple tuple, PaymentKeys *k)
{
	bool		isnull;
	Datum		status;

	memset(k, 0, sizeof(*k));
	if (tuple == NULL)
		return;
	k->payment_no = payment_col(rel, tuple, "payment_no", &isnull);
	if (isnull)
		return;					/* refused by its NOT NULL */
	k->exists = true;
	k->order_no = payment_col(rel, tuple, "order_no", &isnull);
	k->pending = !isnull;
	k->channel_no = payment_col(rel, tuple, "channel_no", &isnull);
	k->paid = !isnull;
	status = payment_col(rel, tuple, "status", &isnull);
	k->pending = k->pending && !isnull && text_is(status, "pending");
	k->txn = payment_col(rel, tuple, "transaction_id", &k->txn_null);
	k->paid_at = payment_col(rel, tuple, "paid_at", &k->paid_at_null);
	k->paid = k->paid && !(k->txn_null && k->paid_at_null);
}

static bool
datum_same(Datum a, bool a_null, Datum b, bool b_null, bool is_text)
{
	if (a_null || b_null)
		return a_null && b_null;
	return is_text ? payidem_text_equal(a, b) : DatumGetTimestampTz(a) == DatumGetTimestampTz(b);
}

static bool
same_pending_key(const PaymentKeys *a, const PaymentKeys *b)
{
	if (!a->pending || !b->pending)
		return a->pending == b->pending;
	return payidem_text_equal(a->order_no, b->order_no) && payidem_text_equal(a->payment_no, b->payment_no);
}

static bool
same_paid_key(const PaymentKeys *a, const PaymentKeys *b)
{
	if (!a->paid || !b->paid)
		return a->paid == b->paid;
	return payidem_text_equal(a->payment_no, b->payment_no) &&
		payidem_text_equal(a->channel_no, b->channel_no) &&
		datum_same(a->txn, a->txn_null, b->txn, b->txn_null, true) &&
		datum_same(a->paid_at, a->paid_at_null, b->paid_at, b->paid_at_null, false);
}

/*
 * Payment payment_no's pending row under order order_no: removed unless cur
 * (the payment as it stands) is pending under that order; true if it is
 * there and stays.
 */
static bool
sync_pending_row(Datum order_no, Datum payment_no, const PaymentKeys *cur)
{
	Relation	rel = table_open(payidem_relid("payment_pending"), RowExclusiveLock);
	HeapTuple	tuple = payidem_fetch_unique(rel, "payment_one_pending_per_order", 1, &order_no,
											 GetActiveSnapshot());
	bool		isnull;
	bool		kept = false;

	if (tuple != NULL && payidem_text_equal(payment_col(rel, tuple, "payment_no", &isnull), payment_no))
	{
		if (cur->pending && payidem_text_equal(cur->order_no, order_no) &&
			payidem_text_equal(cur->payment_no, payment_no))
			kept = true;
		else
			payidem_delete_row(rel, &tuple->t_self);
	}
	table_close(rel, NoLock);
	return kept;
}

/*
 * The paid rows of the payment whose keys v holds, found by those keys (its
 * transaction id: one row at most; else its paid_at: every row of the
 * payment there): removed, but for one that is cur's (the payment as it
 * stands); true if one is there and stays.
 */
typedef struct SeenRows
{
	int			n;
	ItemPointerData tid[8];		/* rows kept or removed by this event */
} SeenRows;

static bool
sync_paid_row(const PaymentKeys *v, const PaymentKeys *cur, SeenRows *seen)
{
	Relation	rel = table_open(payidem_relid("payment_paid"), RowExclusiveLock);
	List	   *rows = NIL;
	ListCell   *lc;
	bool		kept = false;

	if (!v->txn_null)
	{
		Datum		keys[2] = {v->channel_no, v->txn};
		HeapTuple	tuple = payidem_fetch_unique(rel, "payment_transaction_key", 2, keys, GetActiveSnapshot());
		bool		isnull;

		/* another payment's row: its key, not ours to change */
		if (tuple != NULL && payidem_text_equal(payment_col(rel, tuple, "payment_no", &isnull), v->payment_no))
			rows = list_make1(tuple);
	}
	else
	{
		Datum		keys[2] = {v->channel_no, v->paid_at};

		rows = payidem_fetch_all_key_where(rel, "payment_channel_paid", 2, keys, GetActiveSnapshot(),
										   "payment_no", v->payment_no);
	}
	foreach(lc, rows)
	{
		HeapTuple	tuple = (HeapTuple) lfirst(lc);
		PaymentKeys there;
		bool		isnull;
		int			i;

		/*
		 * a row an earlier look-up of this event kept or removed (one
		 * removed by this command is still visible to its snapshot)
		 */
		for (i = 0; i < seen->n; i++)
			if (ItemPointerEquals(&seen->tid[i], &tuple->t_self))
				break;
		if (i < seen->n)
			continue;
		if (seen->n == lengthof(seen->tid))
			elog(ERROR, "payidem: payment %s has more than %d rows in payidem.payment_paid",
				 TextDatumGetCString(v->payment_no), (int) lengthof(seen->tid));
		seen->tid[seen->n++] = tuple->t_self;
		memset(&there, 0, sizeof(there));
		there.paid = true;
		there.payment_no = payment_col(rel, tuple, "payment_no", &isnull);
		there.channel_no = payment_col(rel, tuple, "channel_no", &isnull);
		there.txn = payment_col(rel, tuple, "transaction_id", &there.txn_null);
		there.paid_at = payment_col(rel, tuple, "paid_at", &there.paid_at_null);
		if (!kept && same_paid_key(&there, cur))
			kept = true;
		else
			payidem_delete_row(rel, &tuple->t_self);
	}
	table_close(rel, NoLock);
	return kept;
}

/*
 * True while add_pending_row() or add_paid_row() writes a key row in a
 * logical-replication worker: what payidem._payment_keys_received() lets
 * through there.  Reset however the write ends: an error a trigger catches does not
 * end the worker.
 */
static bool keys_writing = false;

/* a key row inserted; flagged only where the flag is read, off the hot path */
static void
insert_key_row(PayidemInsert *ins, const Datum *values, const bool *nulls)
{
	bool		was_writing = keys_writing;

	if (!IsLogicalWorker())
	{
		payidem_insert(ins, values, nulls);
		return;
	}
	keys_writing = true;
	PG_TRY();
	{
		payidem_insert(ins, values, nulls);
	}
	PG_FINALLY();
	{
		/* as it was: this write may be nested in another key row's (a DBA's trigger) */
		keys_writing = was_writing;
	}
	PG_END_TRY();
}

/* the rows of the keys k holds (the payment as it stands), added */
static void
add_pending_row(const PaymentKeys *k)
{
	static const char *const columns[] = {"order_no", "payment_no"};
	static const Oid types[] = {TEXTOID, TEXTOID};
	static PayidemInsert *pending_insert = NULL;
	Datum		values[2] = {k->order_no, k->payment_no};
	bool		nulls[2] = {false, false};

	if (pending_insert == NULL)
		pending_insert = payidem_insert_define("payment_pending", 2, columns, types);
	insert_key_row(pending_insert, values, nulls);
}

static void
add_paid_row(const PaymentKeys *k)
{
	static const char *const columns[] = {"payment_no", "channel_no", "transaction_id", "paid_at"};
	static const Oid types[] = {TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	static PayidemInsert *paid_insert = NULL;
	Datum		values[4] = {k->payment_no, k->channel_no, k->txn, k->paid_at};
	bool		nulls[4] = {false, false, k->txn_null, k->paid_at_null};

	if (paid_insert == NULL)
		paid_insert = payidem_insert_define("payment_paid", 4, columns, types);
	insert_key_row(paid_insert, values, nulls);
}

PG_FUNCTION_INFO_V1(payidem_payment_keys);

Datum
payidem_payment_keys(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	old_tuple = NULL;
	HeapTuple	new_tuple = NULL;
	HeapTuple	cur_tuple;
	PaymentKeys old;
	PaymentKeys new;
	PaymentKeys cur;
	Datum		payment_no;
	bool		pending_there = false;
	bool		paid_there = false;
	bool		new_is_current;
	SeenRows	seen = {0};
	PayidemAsOwner as_owner;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._payment_keys() must be an AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW trigger")));
	rel = td->tg_relation;
	if (TRIGGER_FIRED_BY_INSERT(td->tg_event))
		new_tuple = td->tg_trigtuple;
	else if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
	{
		old_tuple = td->tg_trigtuple;
		new_tuple = td->tg_newtuple;
	}
	else if (TRIGGER_FIRED_BY_DELETE(td->tg_event))
		old_tuple = td->tg_trigtuple;
	payment_keys_of(rel, old_tuple, &old);
	payment_keys_of(rel, new_tuple, &new);
	if (same_pending_key(&old, &new) && same_paid_key(&old, &new))
		return PointerGetDatum(NULL);	/* nothing the keys hold changed */
	if (RelationGetRelid(rel) != payidem_relid("payment"))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._payment_keys() is the trigger of payidem.payment only"),
				 errdetail("It was fired on %s.", RelationGetRelationName(rel))));

	payidem_begin_as_owner(payidem_relation_owner(payidem_relid("payment_paid")), &as_owner);

	/* the payment as it stands: the event's new version, unless replaced */
	cur_tuple = new_tuple == NULL ? NULL :
		payidem_fetch_version(rel, &new_tuple->t_self, GetActiveSnapshot());
	new_is_current = cur_tuple != NULL;
	if (cur_tuple == NULL)
	{
		payment_no = new.exists ? new.payment_no : old.payment_no;
		cur_tuple = payidem_fetch_unique(rel, "payment_pkey", 1, &payment_no, GetActiveSnapshot());
	}
	payment_keys_of(rel, cur_tuple, &cur);

	/* its pending rows under the order numbers the event names */
	if (old.exists)
		pending_there = sync_pending_row(old.order_no, old.payment_no, &cur);
	if (new.exists && !(old.exists && payidem_text_equal(old.order_no, new.order_no)))
		pending_there = sync_pending_row(new.order_no, new.payment_no, &cur) || pending_there;
	if (cur.pending && !pending_there &&
		!(old.exists && payidem_text_equal(old.order_no, cur.order_no)) &&
		!(new.exists && payidem_text_equal(new.order_no, cur.order_no)))
		pending_there = sync_pending_row(cur.order_no, cur.payment_no, &cur);

	/*
	 * its paid rows under the keys the event's versions and the current one
	 * have (a row another payment holds under the current keys is left: the
	 * insert below is then the unique violation)
	 */
	if (old.paid)
		paid_there = sync_paid_row(&old, &cur, &seen);
	/*
	 * Not looked for when the event gave paid keys to a payment whose old
	 * version had none and was written by an earlier transaction, and
	 * nothing replaced the new version since (a first success): every event
	 * of that transaction came before it ended, so the payment has no paid
	 * row.  An old version of this transaction may be a nested write's,
	 * whose outer event, with the payment's earlier keys, is still to come.
	 */
	if (new.paid && !same_paid_key(&old, &new) &&
		(old.paid || !new_is_current || !old.exists ||
		 TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(old_tuple->t_data))))
		paid_there = sync_paid_row(&new, &cur, &seen) || paid_there;
	if (cur.paid && !paid_there && !same_paid_key(&cur, &old) && !same_paid_key(&cur, &new))
		paid_there = sync_paid_row(&cur, &cur, &seen);

	if (cur.pending && !pending_there)
		add_pending_row(&cur);
	if (cur.paid && !paid_there)
		add_paid_row(&cur);
	payidem_end_as_owner(&as_owner);
	return PointerGetDatum(NULL);
}

/* every row of a key table removed (as the owner, the caller set up) */
static void
empty_key_table(const char *relname)
{
	Relation	rel = table_open(payidem_relid(relname), RowExclusiveLock);
	TableScanDesc scan = table_beginscan_compat(rel, GetActiveSnapshot());
	TupleTableSlot *slot = table_slot_create(rel, NULL);

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		CHECK_FOR_INTERRUPTS();
		payidem_delete_row(rel, &slot->tts_tid);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
}

/*
 * The keys of every payment, as the trigger makes them, added to
 * payment_pending (pending) and payment_paid (paid), each emptied first if
 * empty; how many rows were added.  The rows are removed below the executor
 * (payidem_delete_row), as the trigger removes them: a publication that
 * includes the key tables, which have no replica identity, sends no DELETE
 * for them and refuses none.
 */
static int64
fill_keys(bool pending, bool paid, bool empty)
{
	Relation	rel = table_open(payidem_relid("payment"), AccessShareLock);
	TableScanDesc scan;
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	PayidemAsOwner as_owner;
	int64		added = 0;

	payidem_begin_as_owner(payidem_relation_owner(payidem_relid("payment_paid")), &as_owner);
	if (empty && pending)
		empty_key_table("payment_pending");
	if (empty && paid)
		empty_key_table("payment_paid");
	if (empty)
		CommandCounterIncrement();
	scan = table_beginscan_compat(rel, GetActiveSnapshot());
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		PaymentKeys k;

		CHECK_FOR_INTERRUPTS();
		payment_keys_of(rel, tuple, &k);
		if (pending && k.pending)
		{
			add_pending_row(&k);
			added++;
		}
		if (paid && k.paid)
		{
			add_paid_row(&k);
			added++;
		}
		if (should_free)
			heap_freetuple(tuple);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	payidem_end_as_owner(&as_owner);
	table_close(rel, NoLock);
	return added;
}

/*
 * payidem._payment_keys_fill() RETURNS bigint (rebuild_payment_keys()):
 * payment_pending and payment_paid emptied and made again from every
 * payment; how many rows they hold.
 */
PG_FUNCTION_INFO_V1(payidem_payment_keys_fill);

Datum
payidem_payment_keys_fill(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(fill_keys(true, true, true));
}

/*
 * payidem._payment_keys_truncated(): the AFTER TRUNCATE trigger
 * keys_truncated of payment_pending and payment_paid, ENABLE REPLICA.  A
 * logical-replication worker that applies a TRUNCATE of a key table (a
 * publication with the key tables, a TRUNCATE of them on the publisher)
 * would leave the subscriber's payments without their keys, and its rules
 * unenforced: the truncated table is made again from the subscriber's
 * payments at once, in the same transaction.  (With the payments truncated
 * too, the AFTER triggers fire once all are empty, and nothing is added.)
 */
PG_FUNCTION_INFO_V1(payidem_payment_keys_truncated);

Datum
payidem_payment_keys_truncated(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	Oid			relid;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_BY_TRUNCATE(td->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._payment_keys_truncated() must be an AFTER TRUNCATE trigger")));
	if (IsLogicalWorker())
	{
		relid = RelationGetRelid(td->tg_relation);
		(void) fill_keys(relid == payidem_relid("payment_pending"), relid == payidem_relid("payment_paid"), false);
	}
	return PointerGetDatum(NULL);
}

/*
 * payidem._payment_keys_received(): the BEFORE row trigger keys_received of
 * payment_pending and payment_paid, ENABLE REPLICA (outside
 * session_replication_role = replica the executor only checks that it does
 * not fire).  A logical-replication worker
 * that applies a publication naming these tables (FOR ALL TABLES, TABLES IN
 * SCHEMA payidem) would write keys that the subscriber's own status_keys
 * makes from the payments it receives: the same rows twice, a unique
 * violation, and the apply stopped.  Its changes of the key tables are
 * skipped (its initial copy too), so that the keys stay what the
 * subscriber's payments make them.  Every other writer in replica mode (a
 * restore's load, a DBA) writes as usual.
 */
PG_FUNCTION_INFO_V1(payidem_payment_keys_received);

Datum
payidem_payment_keys_received(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._payment_keys_received() must be a BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW trigger")));
	if (IsLogicalWorker() && !keys_writing)
	{
		Oid			relid = RelationGetRelid(td->tg_relation);

		/* nothing but the keys is skipped, whatever a trigger is attached to */
		if (relid != payidem_relid("payment_pending") && relid != payidem_relid("payment_paid"))
			ereport(ERROR,
					(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
					 errmsg("payidem._payment_keys_received() is the trigger of payidem.payment_pending and payidem.payment_paid only"),
					 errdetail("It was fired on %s.", RelationGetRelationName(td->tg_relation))));
		return PointerGetDatum(NULL);
	}
	return PointerGetDatum(TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple);
}
