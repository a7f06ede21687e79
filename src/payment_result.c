/*-------------------------------------------------------------------------
 *
 * payment_result.c
 *		The payment result: apply_payment_result() and its fast path, the two
 *		writes of a first success (the payment succeeded, its order paid) for
 *		both of its paths, and the transaction id's lock.  What a result does
 *		is decided by payment_decision.c.
 *
 * apply_payment_result() (at the end of this file) decides a repeated and a
 * first success itself and passes every other call to the PL/pgSQL
 * _apply_payment_result().  Either decides everything under the row locks
 * it holds (the order, then the payment, as SELECT ... FOR NO KEY UPDATE) and
 * then makes the two writes with the rows' ctids: the C part directly, the
 * PL/pgSQL part through _record_payment_success() and _record_order_paid().
 * Each is a direct update of one locked row (payidem_update(), direct.c),
 * with every trigger, constraint, domain and index as a SQL UPDATE has them;
 * the order.paid event is written by the order's row trigger, as for any
 * writer.  Run by apply_payment_result(), a SECURITY DEFINER function of the
 * extension's owner, as that owner.  When the UPDATE would be anything but a
 * plain row update for that role (payidem_update_plain()), the _record_*()
 * functions do nothing and return false, and the caller runs it in SQL.  Not
 * granted to anyone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "compat.h"
#include "direct.h"
#include "errcodes.h"
#include "inval.h"
#include "ledger.h"
#include "order_no_codec.h"
#include "payment_decision.h"
#include "replication.h"
#include "shmem.h"
#include "util.h"

enum
{
	PAY_STATUS, PAY_UPDATED_AT, PAY_TRANSACTION_ID, PAY_PAID_AT, PAY_FEE, PAY_COST
};
static const char *const payment_columns[] = {
	"status", "updated_at", "transaction_id", "paid_at", "fee_amount", "cost_amount"
};
static PayidemUpdate *payment_target = NULL;
static PayidemUpdate *payment_target_own = NULL;	/* the fast path's first success */

enum
{
	ORD_STATUS, ORD_UPDATED_AT, ORD_PAID_PAYMENT_NO, ORD_PAID_AT
};
static const char *const order_columns[] = {"status", "updated_at", "paid_payment_no", "paid_at"};
static PayidemUpdate *order_target = NULL;
static PayidemUpdate *order_target_own = NULL;

/*
 * The locked payment at tid (key payment_no) becomes succeeded, with paid_at,
 * the fees, updated_at = now() and — unless txn_null — the channel's
 * transaction id txn (of type txn_type).  False: not done (see payidem_update).
 * own: the fast path's first success below, which writes the payment's
 * bookkeeping with it (a transaction id, paid_at, both fees from NOT NULL
 * rates) and the order it pays in the same call: the bookkeeping check at
 * commit is not fired for it (payidem_update_define_own()).  The PL/pgSQL
 * implementation's calls, whose arguments come from SQL, are checked.
 */
static bool
record_payment_success(ItemPointer tid, text *payment_no, Datum txn, bool txn_null, Oid txn_type,
					   TimestampTz paid_at, Datum fee, bool fee_null, Datum cost, bool cost_null,
					   bool checked, bool own)
{
	bool		set[PAYIDEM_UPDATE_MAX_COLUMNS] = {false};
	Datum		values[PAYIDEM_UPDATE_MAX_COLUMNS];
	bool		nulls[PAYIDEM_UPDATE_MAX_COLUMNS] = {false};
	bool		keep_null[PAYIDEM_UPDATE_MAX_COLUMNS] = {false};
	Oid			types[PAYIDEM_UPDATE_MAX_COLUMNS] = {InvalidOid};

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

	if (own)
	{
		if (payment_target_own == NULL)
			payment_target_own = payidem_update_define_own(PAYIDEM_PAYMENT, "payment_no",
														   lengthof(payment_columns), payment_columns);
		return payidem_update(payment_target_own, tid, PointerGetDatum(payment_no), set, values, nulls, types, keep_null,
							  checked);
	}
	if (payment_target == NULL)
		payment_target = payidem_update_define(PAYIDEM_PAYMENT, "payment_no", lengthof(payment_columns),
											   payment_columns);
	return payidem_update(payment_target, tid, PointerGetDatum(payment_no), set, values, nulls, types, keep_null,
						  checked);
}

/*
 * The locked order at tid (key order_no) becomes paid by payment_no (of type
 * payment_no_type) at paid_at (updated_at = now()); its order.paid event is
 * written by the row trigger status_notify, as for any writer.  False:
 * not done (see payidem_update).
 */
static bool
record_order_paid(ItemPointer tid, text *order_no, Datum payment_no, Oid payment_no_type,
				  TimestampTz paid_at, bool checked, bool own)
{
	bool		set[PAYIDEM_UPDATE_MAX_COLUMNS] = {false};
	Datum		values[PAYIDEM_UPDATE_MAX_COLUMNS];
	bool		nulls[PAYIDEM_UPDATE_MAX_COLUMNS] = {false};
	Oid			types[PAYIDEM_UPDATE_MAX_COLUMNS] = {InvalidOid};
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

	if (own)
	{
		if (order_target_own == NULL)
			order_target_own = payidem_update_define_own(PAYIDEM_ORDER, "order_no", lengthof(order_columns),
														 order_columns);
		return payidem_update(order_target_own, tid, PointerGetDatum(order_no), set, values, nulls, types, NULL, checked);
	}
	if (order_target == NULL)
		order_target = payidem_update_define(PAYIDEM_ORDER, "order_no", lengthof(order_columns), order_columns);
	return payidem_update(order_target, tid, PointerGetDatum(order_no), set, values, nulls, types, NULL, checked);
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
										  false, false));
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
									 PG_GETARG_TIMESTAMPTZ(3), false, false));
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
 *     (or none: the time of the call), and a transaction id no other
 *     payment of the channel has: 'applied' — the order is locked, then the
 *     payment (the lock order of every flow function, docs/payment-flow.md);
 *     the fees are computed from the rates; the payment becomes succeeded
 *     and the order paid by the direct updates above (payidem_update(),
 *     direct.c: status_guard, the bookkeeping triggers, CHECKs, foreign keys
 *     and indexes as for an UPDATE).  The payment's row is the record of the
 *     decision; no idempotency key is written (DESIGN §4: the application's
 *     keys and payidem's decisions never meet).
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
 * Not a second implementation to keep in step: both paths read the facts
 * and let decide_payment_result() (payment_decision.c) decide; the
 * payment_result_paths test runs every case through both and compares.
 * ---------------------------------------------------------------------------
 */

/* a unique btree index of the fast path, and its key columns */
typedef struct ApplyIndex
{
	Oid			relid;
	LOCKMODE	lockmode;		/* what a look-up locks it in (apply_fetch()) */
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
	bool		fallback_composite;	/* (outcome, anomaly_id); 1.0's: the outcome */
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
apply_index(ApplyIndex *ix, PayidemRelation index, Oid table, AttrNumber col1,
			AttrNumber col2, bool *ok)
{
	Relation	irel;
	int			i;

	ix->relid = payidem_lookup_relation(index, true);
	ix->lockmode = AccessShareLock;
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
		apply.fallback_composite = get_func_rettype(fallback) != TEXTOID;
		apply.fallback_hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(fallback));
		fmgr_info_cxt(fallback, f, TopMemoryContext);
		apply.fallback = f;
	}

	apply.valid = true;			/* an invalidation from here on: again */
	apply.checked_user = InvalidOid;
	apply.payment = payidem_lookup_relation(PAYIDEM_PAYMENT, true);
	apply.order = payidem_lookup_relation(PAYIDEM_ORDER, true);
	apply.merchant = payidem_lookup_relation(PAYIDEM_MERCHANT, true);
	apply.channel = payidem_lookup_relation(PAYIDEM_CHANNEL, true);
	apply.binding = payidem_lookup_relation(PAYIDEM_MERCHANT_CHANNEL, true);
	apply.paid = payidem_lookup_relation(PAYIDEM_PAYMENT_PAID, true);
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
	apply_index(&apply.payment_pkey, PAYIDEM_PAYMENT_PKEY, apply.payment, apply.p_payment_no, 0, &ok);
	apply.pp_channel_no = apply_attno(apply.paid, "channel_no", TEXTOID, &ok);
	apply.pp_txn = apply_attno(apply.paid, "transaction_id", TEXTOID, &ok);
	apply.pp_payment_no = apply_attno(apply.paid, "payment_no", TEXTOID, &ok);
	apply_index(&apply.payment_txn, PAYIDEM_PAYMENT_TRANSACTION_KEY, apply.paid,
				apply.pp_channel_no, apply.pp_txn, &ok);
	/* (the key the success's own row is written to next: step 4 of apply_result()) */
	apply.payment_txn.lockmode = RowExclusiveLock;
	apply_index(&apply.order_pkey, PAYIDEM_ORDER_PKEY, apply.order, apply.o_order_no, 0, &ok);
	apply_index(&apply.merchant_pkey, PAYIDEM_MERCHANT_PKEY, apply.merchant,
				apply_attno(apply.merchant, "merchant_no", TEXTOID, &ok), 0, &ok);
	apply_index(&apply.channel_pkey, PAYIDEM_CHANNEL_PKEY, apply.channel,
				apply_attno(apply.channel, "channel_no", TEXTOID, &ok), 0, &ok);
	apply_index(&apply.binding_pkey, PAYIDEM_MERCHANT_CHANNEL_PKEY, apply.binding,
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

		ok = payidem_update_plain(rel) &&
			pg_class_aclcheck(apply.payment, user, ACL_SELECT) == ACLCHECK_OK;
		table_close(rel, NoLock);
	}
	if (ok)
	{
		Relation	rel = table_open(apply.order, AccessShareLock);

		ok = payidem_update_plain(rel) &&
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
	Relation	irel = try_relation_open(ix->relid, ix->lockmode);
	ScanKeyData skey[2];
	int			found;
	int			i;

	if (irel == NULL)
		return FETCH_STALE;
	if (!apply.valid || irel->rd_rel->relkind != RELKIND_INDEX)
	{
		relation_close(irel, ix->lockmode);
		return FETCH_STALE;
	}

	for (i = 0; i < ix->nkeys; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   ix->collation[i], ix->eqproc[i], keys[i]);
	found = payidem_index_fetch(heap, irel, skey, ix->nkeys, snapshot, slot) ? FETCH_FOUND : FETCH_NONE;
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
	 * NO KEY UPDATE (RowShareLock), updated by payidem_update()
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
		!payidem_text_is(PointerGetDatum(facts.status), "pending"))
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
		!payidem_lock_row(order, oslot, GetActiveSnapshot()) || !apply.valid)
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
	if (!apply.valid || !payidem_lock_row(payment, pslot, GetActiveSnapshot()))
		goto done_order;
	PopActiveSnapshot();
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	p_payment_no = slot_getattr(pslot, apply.p_payment_no, &isnull);
	if (isnull || !payidem_text_equal(p_payment_no, PointerGetDatum(r->payment_no)) ||
		!payment_facts_of(pslot, &facts) || !payidem_text_is(PointerGetDatum(facts.status), "pending"))
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
		/*
		 * (in RowExclusiveLock, the mode of the success's row written here
		 * next, which every success ends up taking: not a second mode once
		 * the lock manager's fast-path slots are full; step 6)
		 */
		paid = apply_open(apply.paid, RowExclusiveLock);
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

		/*
		 * the tables of both updates in their mode, the payment's then the
		 * order's, as the SQL path's updates take them: the lock manager
		 * keeps a backend's first 16 relation locks in fast-path slots (before
		 * 18), which the payment's triggers fill; a mode taken after that
		 * goes to the shared lock table and out of it at commit (about 2,000
		 * instructions)
		 */
		LockRelationOid(apply.payment, RowExclusiveLock);
		LockRelationOid(apply.order, RowExclusiveLock);
		PopActiveSnapshot();
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (!record_payment_success(&payment_tid, r->payment_no, PointerGetDatum(r->txn), false,
									TEXTOID, paid_at, fee, fee_null, cost, cost_null, true, true))
			elog(ERROR, "payidem: payment %s could not be updated directly",
				 text_to_cstring(r->payment_no));
		PopActiveSnapshot();
		PushActiveSnapshot(GetTransactionSnapshot());	/* after payidem_update's CCI */
		/*
		 * the payment's own number, of its column's type (a domain): as SET
		 * paid_payment_no = p.payment_no, not checked again
		 */
		if (!record_order_paid(&order_tid, DatumGetTextPP(p_order_no), p_payment_no,
							   apply.p_payment_no_type, paid_at, true, true))
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
 * The call of both entry points: the outcome, and in *anomaly_id the anomaly
 * that records an anomaly or a refusal (*anomaly_null when there is none).
 * See the section header above; payidem._apply_payment_result() is the
 * contract in full.
 */
static Datum
apply_result(FunctionCallInfo fcinfo, Datum *anomaly_id, bool *anomaly_null)
{
	LOCAL_FCINFO(sql, 7);
	Datum		result;
	int			i;
	PaymentReport r;

	*anomaly_id = (Datum) 0;
	*anomaly_null = true;
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
	r.success = payidem_text_is(PointerGetDatum(r.status), "succeeded");
	if (!apply.valid)
		apply_prepare();

	/* a success, in READ COMMITTED */
	if (apply.usable && r.success && !IsolationUsesXactSnapshot() && !XactReadOnly)
	{
		ApplyFast	fast = apply_fast(&r);

		if (fast == APPLY_DUPLICATE)
		{
			payidem_count(PAYIDEM_PAYMENT_DUPLICATE);
			return PointerGetDatum(cstring_to_text("duplicate"));
		}
		if (fast == APPLY_APPLIED)
		{
			payidem_count(PAYIDEM_PAYMENT_APPLIED);
			return PointerGetDatum(cstring_to_text("applied"));
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
		elog(ERROR, "payidem: _apply_payment_result() returned NULL");
	if (apply.fallback_composite)
	{
		HeapTupleHeader row = DatumGetHeapTupleHeader(result);
		bool		isnull;

		*anomaly_id = GetAttributeByNum(row, 2, anomaly_null);
		result = GetAttributeByNum(row, 1, &isnull);
		if (isnull)
			elog(ERROR, "payidem: _apply_payment_result() returned no outcome");
	}
	/* the outcome, counted in stats() as the fast path counts its own */
	if (payidem_text_is(result, "applied"))
		payidem_count(PAYIDEM_PAYMENT_APPLIED);
	else if (payidem_text_is(result, "duplicate"))
		payidem_count(PAYIDEM_PAYMENT_DUPLICATE);
	else if (payidem_text_is(result, "anomaly"))
		payidem_count(PAYIDEM_PAYMENT_ANOMALY);
	else if (payidem_text_is(result, "rejected"))
		payidem_count(PAYIDEM_PAYMENT_REJECTED);
	return result;
}

/*
 * payidem.apply_payment_result(payment_no text, source text, status text,
 *     transaction_id text, amount bigint, paid_at timestamptz, raw jsonb)
 *     RETURNS text
 */
PG_FUNCTION_INFO_V1(payidem_apply_payment_result);
Datum
payidem_apply_payment_result(PG_FUNCTION_ARGS)
{
	Datum		anomaly_id;
	bool		anomaly_null;

	PG_RETURN_DATUM(apply_result(fcinfo, &anomaly_id, &anomaly_null));
}

/*
 * payidem.apply_payment_result_ex(the same arguments,
 *     OUT outcome text, OUT anomaly_id bigint)
 */
PG_FUNCTION_INFO_V1(payidem_apply_payment_result_ex);
Datum
payidem_apply_payment_result_ex(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "payidem: apply_payment_result_ex() must return a row");
	values[0] = apply_result(fcinfo, &values[1], &nulls[1]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
