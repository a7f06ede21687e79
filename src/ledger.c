/*-------------------------------------------------------------------------
 *
 * ledger.c
 *		A status and its bookkeeping never disagree (DESIGN §5), whoever
 *		writes: the flow functions, transit_*(), a DBA's own UPDATE.
 *
 * Two triggers, the one place these rules are written:
 *
 *   payidem.ledger_row() — AFTER INSERT OR UPDATE ... FOR EACH ROW on
 *     "order" and payment (trigger status_ledger, which fires after
 *     status_guard: triggers of one event fire in name order, so a change
 *     the whitelist refuses is reported as that first).  What a row says
 *     about itself: an order keeps its merchant, and the payment that paid
 *     it once it left pending; a paid order has paid_at
 *     and paid_payment_no; a succeeded payment has its transaction id,
 *     paid_at and fees; a status agrees with the refunded amount (partially_refunded exactly when
 *     0 < refunded < amount, refunded exactly when refunded = amount; an
 *     order in any other status, such as a DBA's shipping after paid, may
 *     have refunds only if it names the payment that paid it).
 *     Checked on the trigger tuple, no query.
 *
 *   payidem.ledger_at_commit() — a DEFERRABLE INITIALLY DEFERRED constraint
 *     trigger AFTER UPDATE on "order", payment and refund (trigger
 *     status_ledger_at_commit).  What rows say about each other, once every
 *     row of a flow step is written: a paid order's paid_payment_no names a
 *     payment of that order in a succeeded status; a payment's refunded
 *     amount is the sum of its succeeded refunds and is mirrored on the
 *     order it paid, whatever that order's status.  It compares OLD and
 *     NEW and returns at once unless something those rules read changed;
 *     then look-ups by index, as the
 *     tables' owner: an order's two by key without SQL, a payment's
 *     through saved plans.
 *
 * A change that breaks one is refused with PI002: the message names the
 * invariant, DETAIL the values, HINT the flow function that does the
 * bookkeeping.  Ordinary triggers, like status_guard: a superuser's
 * session_replication_role = replica skips them.  An INSERT is checked by
 * ledger_row() only: status_guard admits new rows in the initial status
 * alone (which have no cross-row bookkeeping), or a restore's rows as
 * dumped.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "direct.h"
#include "errcodes.h"
#include "ledger.h"
#include "util.h"

/* the statuses the rules speak of */
static bool
text_in(Datum d, const char *const *list)
{
	text	   *t = DatumGetTextPP(d);
	int			len = VARSIZE_ANY_EXHDR(t);

	for (; *list; list++)
		if ((int) strlen(*list) == len && memcmp(VARDATA_ANY(t), *list, len) == 0)
			return true;
	return false;
}

static const char *const paid_order[] = {"paid", "partially_refunded", "refunded", NULL};
static const char *const unpaid_order[] = {"pending", NULL};

/*
 * The statuses of a payment whose money arrived: the one list, for the
 * bookkeeping here, for apply_payment_result()'s C part (a repeated success)
 * and, through payidem._paid_payment_statuses(), for the SQL.
 */
static const char *const paid_payment[] = {"succeeded", "partially_refunded", "refunded", NULL};

bool
payidem_payment_has_paid(Datum status)
{
	return text_in(status, paid_payment);
}

/*
 * payidem._paid_payment_statuses() RETURNS text[], IMMUTABLE: the list
 * above.  `status = ANY (payidem._paid_payment_statuses())` is folded into a
 * constant when the query is planned.
 */
PG_FUNCTION_INFO_V1(payidem_paid_payment_statuses);
Datum
payidem_paid_payment_statuses(PG_FUNCTION_ARGS)
{
	Datum		elems[lengthof(paid_payment)];
	int			n = 0;

	for (; paid_payment[n] != NULL; n++)
		elems[n] = CStringGetTextDatum(paid_payment[n]);
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}
static const char *const partly[] = {"partially_refunded", NULL};
static const char *const fully[] = {"refunded", NULL};

/*
 * The tuples a trigger call reads, each taken apart once (a rule reads
 * many of their columns; heap_getattr walks the tuple from its start for
 * every column behind a text).  Emptied when a trigger call starts
 * (trigger_data), so a pointer from an earlier call is never matched; the
 * arrays live in the call's memory.
 */
#define DEFORMED_MAX 4

static struct
{
	HeapTuple	tup;
	Datum	   *values;
	bool	   *nulls;
}			deformed[DEFORMED_MAX];
static int	n_deformed = 0;

/* a column of a tuple of rel, by name */
static Datum
col(Relation rel, HeapTuple tup, const char *name, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			attnum = payidem_column(rel, name);
	int			i;

	for (i = 0; i < n_deformed; i++)
		if (deformed[i].tup == tup)
			break;
	if (i == n_deformed)
	{
		if (n_deformed == DEFORMED_MAX)
			return heap_getattr(tup, attnum, desc, isnull);
		deformed[i].tup = tup;
		deformed[i].values = palloc(sizeof(Datum) * desc->natts);
		deformed[i].nulls = palloc(sizeof(bool) * desc->natts);
		heap_deform_tuple(tup, desc, deformed[i].values, deformed[i].nulls);
		n_deformed++;
	}
	*isnull = deformed[i].nulls[attnum - 1];
	return deformed[i].values[attnum - 1];
}

/* a column as text (its type's output), or "NULL" */
static char *
col_text(Relation rel, HeapTuple tup, const char *name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			attnum = payidem_attnum(desc, name);
	char	   *v;

	if (attnum <= 0)
		elog(ERROR, "payidem: column \"%s\" of relation \"%s\" does not exist",
			 name, RelationGetRelationName(rel));
	v = SPI_getvalue(tup, desc, attnum);
	return v ? v : pstrdup("NULL");
}

static bool
col_null(Relation rel, HeapTuple tup, const char *name)
{
	bool		isnull;

	(void) col(rel, tup, name, &isnull);
	return isnull;
}

static int64
col_int8(Relation rel, HeapTuple tup, const char *name)
{
	bool		isnull;
	Datum		d = col(rel, tup, name, &isnull);

	return isnull ? 0 : DatumGetInt64(d);
}

/* do the status and the refunded amount agree? */
static bool
refund_status_agrees(Datum status, int64 refunded, int64 amount)
{
	if (refunded == 0)
		return !text_in(status, partly) && !text_in(status, fully);
	if (refunded < amount)
		return text_in(status, partly);
	return text_in(status, fully);
}

#define refuse(entity, key, invariant, flow, ...) \
	ereport(ERROR, \
			(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION), \
			 errmsg("%s %s would break its bookkeeping: %s", (entity), (key), (invariant)), \
			 errdetail(__VA_ARGS__), \
			 errhint("Use payidem.%s(), which moves the status and its bookkeeping together.", (flow))))

static TriggerData *
trigger_data(FunctionCallInfo fcinfo, const char *fn)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	n_deformed = 0;
	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.%s() must be fired AFTER ... FOR EACH ROW", fn)));
	return trigdata;
}

/* which of payidem's tables: 'o'rder, 'p'ayment, 'r'efund (catalog.c knows them) */
static char
table_kind(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	const char *name = RelationGetRelationName(rel);

	if (relid == payidem_relation(PAYIDEM_ORDER))
		return 'o';
	if (relid == payidem_relation(PAYIDEM_PAYMENT))
		return 'p';
	if (relid == payidem_relation(PAYIDEM_REFUND))
		return 'r';
	ereport(ERROR,
			(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
			 errmsg("payidem's bookkeeping triggers belong to payidem.\"order\", payidem.payment and payidem.refund"),
			 errdetail("One fired on relation \"%s\".", name)));
	return 0;					/* keep the compiler quiet */
}

/*
 * payidem.ledger_row() — what a row of "order" or payment says about itself.
 */
PG_FUNCTION_INFO_V1(payidem_ledger_row);
Datum
payidem_ledger_row(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = trigger_data(fcinfo, "ledger_row");
	Relation	rel = trigdata->tg_relation;
	HeapTuple	tup = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)
		? trigdata->tg_newtuple : trigdata->tg_trigtuple;
	char		kind = table_kind(rel);
	bool		isnull;
	Datum		status = col(rel, tup, "status", &isnull);
	int64		refunded = col_int8(rel, tup, "refunded_amount");
	int64		amount = col_int8(rel, tup, "amount");

	if (isnull)
		return PointerGetDatum(NULL);	/* status_guard refuses it */
	if (kind == 'p')
	{
		if (text_in(status, paid_payment) &&
			(col_null(rel, tup, "transaction_id") || col_null(rel, tup, "paid_at") ||
			 col_null(rel, tup, "fee_amount") || col_null(rel, tup, "cost_amount")))
		{
			char	   *txn = col_text(rel, tup, "transaction_id");

			refuse("payment", col_text(rel, tup, "payment_no"),
				   "a success without its transaction id, paid_at and fees", "apply_payment_result",
				   "Payment %s would be %s with transaction_id %s, paid_at %s, fee_amount %s, cost_amount %s; a succeeded payment has all four.",
				   col_text(rel, tup, "payment_no"), TextDatumGetCString(status),
				   col_null(rel, tup, "transaction_id") ? "NULL" : quote_literal_cstr(txn),
				   col_null(rel, tup, "paid_at") ? "NULL" : "set",
				   col_text(rel, tup, "fee_amount"), col_text(rel, tup, "cost_amount"));
		}
		if (!refund_status_agrees(status, refunded, amount))
			refuse("payment", col_text(rel, tup, "payment_no"),
				   "a status that disagrees with its refunded amount", "apply_refund_result",
				   "Payment %s would be %s with " INT64_FORMAT " of " INT64_FORMAT " refunded.",
				   col_text(rel, tup, "payment_no"), TextDatumGetCString(status), refunded, amount);
	}
	else if (kind == 'o')
	{
		/*
		 * An order's merchant is where its money, fees and signed events
		 * belong: it never changes (its payments, refunds and events name
		 * it too).
		 */
		if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
			!payidem_text_equal(col(rel, trigdata->tg_trigtuple, "merchant_no", &isnull),
								col(rel, tup, "merchant_no", &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
					 errmsg("order %s would break its bookkeeping: a move to another merchant",
							col_text(rel, tup, "order_no")),
					 errdetail("Order %s belongs to merchant %s; it would move to %s.",
							   col_text(rel, tup, "order_no"),
							   col_text(rel, trigdata->tg_trigtuple, "merchant_no"),
							   col_text(rel, tup, "merchant_no")),
					 errhint("An order stays with the merchant that created it; create the other merchant's own with payidem.create_order().")));
		/*
		 * The payment that paid an order never changes once the order left
		 * pending: the other successes of the order are anomalies to refund,
		 * and naming one of them instead would leave the real paying payment
		 * a success with no anomaly.
		 */
		if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) &&
			!col_null(rel, trigdata->tg_trigtuple, "paid_payment_no") &&
			!text_in(col(rel, trigdata->tg_trigtuple, "status", &isnull), unpaid_order) &&
			(col_null(rel, tup, "paid_payment_no") ||
			 !payidem_text_equal(col(rel, trigdata->tg_trigtuple, "paid_payment_no", &isnull),
								 col(rel, tup, "paid_payment_no", &isnull))))
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
					 errmsg("order %s would break its bookkeeping: a change of the payment that paid it",
							col_text(rel, tup, "order_no")),
					 errdetail("Order %s (%s) was paid by payment %s; it would name %s.",
							   col_text(rel, tup, "order_no"),
							   col_text(rel, trigdata->tg_trigtuple, "status"),
							   col_text(rel, trigdata->tg_trigtuple, "paid_payment_no"),
							   col_text(rel, tup, "paid_payment_no")),
					 errhint("The payment that paid an order stays its paying payment; refund another success of the order with payidem.refund() and resolve its anomaly.")));
		if (text_in(status, paid_order))
		{
			if (col_null(rel, tup, "paid_at") || col_null(rel, tup, "paid_payment_no"))
				refuse("order", col_text(rel, tup, "order_no"),
					   "paid without its payment", "apply_payment_result",
					   "Order %s would be %s with paid_payment_no %s and paid_at %s; a paid order names the succeeded payment that paid it.",
					   col_text(rel, tup, "order_no"), TextDatumGetCString(status),
					   col_text(rel, tup, "paid_payment_no"),
					   col_null(rel, tup, "paid_at") ? "NULL" : "set");
			if (!refund_status_agrees(status, refunded, amount))
				refuse("order", col_text(rel, tup, "order_no"),
					   "a status that disagrees with its refunded amount", "apply_refund_result",
					   "Order %s would be %s with " INT64_FORMAT " of " INT64_FORMAT " refunded.",
					   col_text(rel, tup, "order_no"), TextDatumGetCString(status), refunded, amount);
		}
		else if (refunded != 0 && col_null(rel, tup, "paid_payment_no"))
		{
			/*
			 * Any other status (pending, closed, or one a DBA added, such as
			 * shipping after paid) keeps what refunds the payment that paid
			 * the order had: a refund the channel completed is recorded
			 * whatever the order's status (apply_refund_result moves it only
			 * where the whitelist allows).  Without such a payment, none.
			 */
			refuse("order", col_text(rel, tup, "order_no"),
				   "a refunded amount without the payment that paid it", "apply_refund_result",
				   "Order %s would be %s with " INT64_FORMAT " of " INT64_FORMAT " refunded and paid_payment_no NULL; only the refunds of the payment that paid an order are its refunded amount.",
				   col_text(rel, tup, "order_no"), TextDatumGetCString(status), refunded, amount);
		}
	}
	return PointerGetDatum(NULL);
}

/* ---------------------------------------------------------------- at commit */

static SPIPlanPtr payment_plan = NULL;	/* a payment and its succeeded refunds */
static SPIPlanPtr own_order_plan = NULL;	/* the order it paid, if it is its own */
static SPIPlanPtr other_orders_plan = NULL; /* orders of other numbers naming it */

static SPIPlanPtr
saved_plan(SPIPlanPtr *plan, const char *sql, int nargs)
{
	Oid			types[2] = {TEXTOID, TEXTOID};

	return payidem_saved_plan(plan, sql, nargs, types);
}

static void
run(SPIPlanPtr plan, Datum a, Datum b)
{
	Datum		values[2] = {a, b};

	if (SPI_execute_plan(plan, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "payidem: a bookkeeping look-up failed");
}

static Datum
res(int col_no, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col_no, isnull);
}

static char *
res_text(int col_no)
{
	char	   *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col_no);

	return v ? v : pstrdup("NULL");
}

/*
 * A payment's refunded amount is the sum of its succeeded refunds; the order
 * it paid (its own, by number) mirrors it and is paid by a succeeded
 * payment; with moved, no order of another number names it.
 */
static void
check_payment(Datum payment_no, bool moved)
{
	bool		isnull;
	int64		refunded;
	int64		refunds;
	char	   *status;
	Datum		order_no;

	run(saved_plan(&payment_plan,
				   "SELECT p.refunded_amount, p.status, p.order_no,"
				   " (SELECT pg_catalog.sum(r.amount) FROM payidem.refund r"
				   "   WHERE r.payment_no OPERATOR(pg_catalog.=) p.payment_no"
				   "     AND r.status OPERATOR(pg_catalog.=) 'succeeded')::bigint"
				   " FROM payidem.payment p WHERE p.payment_no OPERATOR(pg_catalog.=) $1", 1),
		payment_no, (Datum) 0);
	if (SPI_processed == 0)
		return;
	refunded = DatumGetInt64(res(1, &isnull));
	status = res_text(2);
	order_no = datumCopy(res(3, &isnull), false, -1);
	refunds = DatumGetInt64(res(4, &isnull));
	if (isnull)
		refunds = 0;
	if (refunds != refunded)
		refuse("payment", TextDatumGetCString(payment_no),
			   "a refunded amount that is not the sum of its succeeded refunds", "apply_refund_result",
			   "Payment %s has refunded_amount " INT64_FORMAT "; its succeeded refunds add up to " INT64_FORMAT ".",
			   TextDatumGetCString(payment_no), refunded, refunds);

	run(saved_plan(&own_order_plan,
				   "SELECT o.order_no, o.status, o.refunded_amount FROM payidem.\"order\" o"
				   " WHERE o.order_no OPERATOR(pg_catalog.=) $2 AND o.paid_payment_no OPERATOR(pg_catalog.=) $1", 2),
		payment_no, order_no);
	if (SPI_processed > 0)
	{
		int64		order_refunded;

		if (text_in(res(2, &isnull), paid_order) && !text_in(CStringGetTextDatum(status), paid_payment))
			refuse("order", res_text(1), "paid without its payment", "apply_payment_result",
				   "Order %s is %s; its paid_payment_no %s is a payment in status %s.",
				   res_text(1), res_text(2), TextDatumGetCString(payment_no), status);
		order_refunded = DatumGetInt64(res(3, &isnull));
		if (order_refunded != refunded)
			refuse("order", res_text(1), "a refunded amount that is not its paying payment's", "apply_refund_result",
				   "Order %s has refunded_amount " INT64_FORMAT "; payment %s, which paid it, has " INT64_FORMAT ".",
				   res_text(1), order_refunded, TextDatumGetCString(payment_no), refunded);
	}
	if (moved)
	{
		/* (no index on paid_payment_no: only for a payment moved to another order) */
		run(saved_plan(&other_orders_plan,
					   "SELECT o.order_no FROM payidem.\"order\" o"
					   " WHERE o.paid_payment_no OPERATOR(pg_catalog.=) $1 AND o.order_no OPERATOR(pg_catalog.<>) $2"
					   " LIMIT 1", 2),
			payment_no, order_no);
		if (SPI_processed > 0)
			refuse("order", res_text(1), "paid without its payment", "apply_payment_result",
				   "Order %s is paid by payment %s, which now belongs to order %s.",
				   res_text(1), TextDatumGetCString(payment_no), TextDatumGetCString(order_no));
	}
}

/*
 * A paid order's paying payment is a succeeded payment of it, mirrored (an
 * order in another status that names its paying payment: mirrored).  The
 * order as it stands (the version the trigger fired for, when no later one
 * replaced it) and its payment by key, without SQL (the first success of
 * every payment comes here), with the snapshot the deferred triggers fire
 * under.
 */
static void
check_order(Datum order_no, ItemPointer tid)
{
	Relation	orel = table_open(payidem_relation(PAYIDEM_ORDER), AccessShareLock);
	/* the version the trigger fired for, if it still stands; else by key */
	HeapTuple	o = payidem_fetch_version(orel, tid, GetActiveSnapshot());
	Relation	prel;
	HeapTuple	q = NULL;
	Datum		paid_payment_no;
	bool		isnull;
	bool		paid;
	bool		own;

	if (o == NULL)
		o = payidem_fetch_unique(orel, PAYIDEM_ORDER_PKEY, 1, &order_no, GetActiveSnapshot());
	paid = o != NULL && text_in(col(orel, o, "status", &isnull), paid_order);
	if (o == NULL || (!paid && col_null(orel, o, "paid_payment_no")))
	{
		table_close(orel, NoLock);
		return;
	}
	prel = table_open(payidem_relation(PAYIDEM_PAYMENT), AccessShareLock);
	paid_payment_no = col(orel, o, "paid_payment_no", &isnull);
	if (!isnull)
		q = payidem_fetch_unique(prel, PAYIDEM_PAYMENT_PKEY, 1, &paid_payment_no, GetActiveSnapshot());
	own = q != NULL && payidem_text_equal(col(prel, q, "order_no", &isnull), order_no);
	if (paid && (!own || !text_in(col(prel, q, "status", &isnull), paid_payment)))
		refuse("order", TextDatumGetCString(order_no), "paid without its payment", "apply_payment_result",
			   "Order %s is %s; its paid_payment_no %s is %s.", TextDatumGetCString(order_no),
			   col_text(orel, o, "status"), col_text(orel, o, "paid_payment_no"),
			   q == NULL ? "no payment"
			   : !own
			   ? psprintf("a payment of order %s", col_text(prel, q, "order_no"))
			   : psprintf("a payment in status %s", col_text(prel, q, "status")));

	/*
	 * Its refunded amount is its paying payment's, in every status (one a
	 * DBA added after paid keeps it too); none if it names no payment of
	 * its own.
	 */
	if (!own && col_int8(orel, o, "refunded_amount") != 0)
		refuse("order", TextDatumGetCString(order_no), "a refunded amount without the payment that paid it",
			   "apply_refund_result",
			   "Order %s (%s) has refunded_amount %s; its paid_payment_no %s is %s.",
			   TextDatumGetCString(order_no), col_text(orel, o, "status"),
			   col_text(orel, o, "refunded_amount"), col_text(orel, o, "paid_payment_no"),
			   q == NULL ? "no payment" : psprintf("a payment of order %s", col_text(prel, q, "order_no")));
	if (own && col_int8(orel, o, "refunded_amount") != col_int8(prel, q, "refunded_amount"))
		refuse("order", TextDatumGetCString(order_no), "a refunded amount that is not its paying payment's",
			   "apply_refund_result",
			   "Order %s has refunded_amount %s; payment %s, which paid it, has %s.",
			   TextDatumGetCString(order_no), col_text(orel, o, "refunded_amount"),
			   col_text(orel, o, "paid_payment_no"), col_text(prel, q, "refunded_amount"));
	table_close(prel, NoLock);
	table_close(orel, NoLock);
}

static bool
changed(Relation rel, TriggerData *td, const char *name)
{
	bool		old_null;
	bool		new_null;
	Datum		o = col(rel, td->tg_trigtuple, name, &old_null);
	Datum		n = col(rel, td->tg_newtuple, name, &new_null);
	Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), payidem_attnum(RelationGetDescr(rel), name) - 1);

	if (old_null || new_null)
		return old_null != new_null;
	return !datumIsEqual(o, n, att->attbyval, att->attlen);
}

/*
 * payidem.ledger_at_commit() — what rows say about each other, at commit.
 */
PG_FUNCTION_INFO_V1(payidem_ledger_at_commit);
Datum
payidem_ledger_at_commit(PG_FUNCTION_ARGS)
{
	TriggerData *td = trigger_data(fcinfo, "ledger_at_commit");
	Relation	rel = td->tg_relation;
	char		kind = table_kind(rel);
	bool		isnull;
	PayidemAsOwner as_owner;

	if (!TRIGGER_FIRED_BY_UPDATE(td->tg_event))
		return PointerGetDatum(NULL);

	/* nothing the rules read changed: done, without a query */
	if (kind == 'o')
	{
		/* paid, or in another status naming the payment that paid it */
		if (!(text_in(col(rel, td->tg_newtuple, "status", &isnull), paid_order) ||
			  !col_null(rel, td->tg_newtuple, "paid_payment_no")) ||
			!(changed(rel, td, "status") || changed(rel, td, "paid_payment_no") ||
			  changed(rel, td, "refunded_amount")))
			return PointerGetDatum(NULL);
	}
	else if (kind == 'p')
	{
		/*
		 * refunds moved it, it left the succeeded statuses (a DBA's own flow)
		 * or another order: not a first success, which changes none of that
		 */
		if (!(changed(rel, td, "refunded_amount") || changed(rel, td, "order_no") ||
			  (changed(rel, td, "status") &&
			   (text_in(col(rel, td->tg_trigtuple, "status", &isnull), paid_payment) ||
				text_in(col(rel, td->tg_newtuple, "status", &isnull), partly) ||
				text_in(col(rel, td->tg_newtuple, "status", &isnull), fully)))))
			return PointerGetDatum(NULL);
	}
	else
	{
		Datum		os = col(rel, td->tg_trigtuple, "status", &isnull);
		Datum		ns = col(rel, td->tg_newtuple, "status", &isnull);
		static const char *const succeeded[] = {"succeeded", NULL};

		if (!(text_in(os, succeeded) || text_in(ns, succeeded)) ||
			!(changed(rel, td, "status") || changed(rel, td, "amount") || changed(rel, td, "payment_no")))
			return PointerGetDatum(NULL);
	}

	/*
	 * As the tables' owner (the committing role may not read them), seeing
	 * every statement so far: at commit, and also when SET CONSTRAINTS ...
	 * IMMEDIATE fires this at the end of the statement that wrote the rows,
	 * whose own snapshot does not see its writes.
	 */
	payidem_begin_as_owner(rel->rd_rel->relowner, &as_owner);
	if (kind == 'o')
		check_order(col(rel, td->tg_newtuple, "order_no", &isnull), &td->tg_newtuple->t_self);
	else
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (kind == 'p')
			check_payment(col(rel, td->tg_newtuple, "payment_no", &isnull), changed(rel, td, "order_no"));
		else
		{
			check_payment(col(rel, td->tg_newtuple, "payment_no", &isnull), false);
			if (changed(rel, td, "payment_no"))
				check_payment(col(rel, td->tg_trigtuple, "payment_no", &isnull), false);
		}
		SPI_finish();
	}
	payidem_end_as_owner(&as_owner);
	return PointerGetDatum(NULL);
}
