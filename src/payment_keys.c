/*-------------------------------------------------------------------------
 *
 * payment_keys.c
 *		The payment keys: the status_keys trigger of payidem.payment, which
 *		keeps payidem.payment_pending and payidem.payment_paid in step with
 *		the payments, their rebuild, and their triggers under logical
 *		replication.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "replication/logicalworker.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "compat.h"
#include "direct.h"
#include "util.h"

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

/* (the tuple taken apart once: six columns read one by one each walked it) */
static void
payment_keys_of(Relation rel, HeapTuple tuple, PaymentKeys *k)
{
	PayidemRow	row;
	bool		isnull;
	Datum		status;

	memset(k, 0, sizeof(*k));
	if (tuple == NULL)
		return;
	payidem_row_deform(&row, rel, tuple);
	k->payment_no = payidem_row_get(&row, "payment_no", &isnull);
	if (isnull)
	{
		payidem_row_free(&row);
		return;					/* refused by its NOT NULL */
	}
	k->exists = true;
	k->order_no = payidem_row_get(&row, "order_no", &isnull);
	k->pending = !isnull;
	k->channel_no = payidem_row_get(&row, "channel_no", &isnull);
	k->paid = !isnull;
	status = payidem_row_get(&row, "status", &isnull);
	k->pending = k->pending && !isnull && payidem_text_is(status, "pending");
	k->txn = payidem_row_get(&row, "transaction_id", &k->txn_null);
	k->paid_at = payidem_row_get(&row, "paid_at", &k->paid_at_null);
	k->paid = k->paid && !(k->txn_null && k->paid_at_null);
	payidem_row_free(&row);
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
	Relation	rel = table_open(payidem_relation(PAYIDEM_PAYMENT_PENDING), RowExclusiveLock);
	HeapTuple	tuple = payidem_fetch_unique(rel, PAYIDEM_PAYMENT_ONE_PENDING_PER_ORDER, 1, &order_no,
											 GetActiveSnapshot());
	bool		isnull;
	bool		kept = false;

	if (tuple != NULL && payidem_text_equal(payidem_getattr(rel, tuple, "payment_no", &isnull), payment_no))
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
	Relation	rel = table_open(payidem_relation(PAYIDEM_PAYMENT_PAID), RowExclusiveLock);
	List	   *rows = NIL;
	ListCell   *lc;
	bool		kept = false;

	if (!v->txn_null)
	{
		Datum		keys[2] = {v->channel_no, v->txn};
		HeapTuple	tuple = payidem_fetch_unique(rel, PAYIDEM_PAYMENT_TRANSACTION_KEY, 2, keys, GetActiveSnapshot());
		bool		isnull;

		/* another payment's row: its key, not ours to change */
		if (tuple != NULL && payidem_text_equal(payidem_getattr(rel, tuple, "payment_no", &isnull), v->payment_no))
			rows = list_make1(tuple);
	}
	else
	{
		Datum		keys[2] = {v->channel_no, v->paid_at};

		rows = payidem_fetch_all_key_where(rel, PAYIDEM_PAYMENT_CHANNEL_PAID, 2, keys, GetActiveSnapshot(),
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
		there.payment_no = payidem_getattr(rel, tuple, "payment_no", &isnull);
		there.channel_no = payidem_getattr(rel, tuple, "channel_no", &isnull);
		there.txn = payidem_getattr(rel, tuple, "transaction_id", &there.txn_null);
		there.paid_at = payidem_getattr(rel, tuple, "paid_at", &there.paid_at_null);
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
		pending_insert = payidem_insert_define(PAYIDEM_PAYMENT_PENDING, 2, columns, types);
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
		paid_insert = payidem_insert_define(PAYIDEM_PAYMENT_PAID, 4, columns, types);
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
	if (RelationGetRelid(rel) != payidem_relation(PAYIDEM_PAYMENT))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._payment_keys() is the trigger of payidem.payment only"),
				 errdetail("It was fired on %s.", RelationGetRelationName(rel))));

	payidem_begin_as_owner(payidem_owner(PAYIDEM_PAYMENT_PAID), &as_owner);

	/* the payment as it stands: the event's new version, unless replaced */
	cur_tuple = new_tuple == NULL ? NULL :
		payidem_fetch_version(rel, &new_tuple->t_self, GetActiveSnapshot());
	new_is_current = cur_tuple != NULL;
	if (cur_tuple == NULL)
	{
		payment_no = new.exists ? new.payment_no : old.payment_no;
		cur_tuple = payidem_fetch_unique(rel, PAYIDEM_PAYMENT_PKEY, 1, &payment_no, GetActiveSnapshot());
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

/* a row of a key table removed (as the owner, the caller set up) */
static void
remove_key_row(Relation rel, HeapTuple tuple, void *arg)
{
	payidem_delete_row(rel, &tuple->t_self);
}

/* every row of a key table removed */
static void
empty_key_table(PayidemRelation table)
{
	Relation	rel = table_open(payidem_relation(table), RowExclusiveLock);

	payidem_scan(rel, remove_key_row, NULL);
	table_close(rel, NoLock);
}

typedef struct FillKeys
{
	bool		pending;
	bool		paid;
	int64		added;
} FillKeys;

/* the keys of one payment added */
static void
fill_payment_keys(Relation rel, HeapTuple tuple, void *arg)
{
	FillKeys   *fill = (FillKeys *) arg;
	PaymentKeys k;

	payment_keys_of(rel, tuple, &k);
	if (fill->pending && k.pending)
	{
		add_pending_row(&k);
		fill->added++;
	}
	if (fill->paid && k.paid)
	{
		add_paid_row(&k);
		fill->added++;
	}
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
	Relation	rel = table_open(payidem_relation(PAYIDEM_PAYMENT), AccessShareLock);
	PayidemAsOwner as_owner;
	FillKeys	fill = {pending, paid, 0};

	payidem_begin_as_owner(payidem_owner(PAYIDEM_PAYMENT_PAID), &as_owner);
	if (empty && pending)
		empty_key_table(PAYIDEM_PAYMENT_PENDING);
	if (empty && paid)
		empty_key_table(PAYIDEM_PAYMENT_PAID);
	if (empty)
		CommandCounterIncrement();
	payidem_scan(rel, fill_payment_keys, &fill);
	payidem_end_as_owner(&as_owner);
	table_close(rel, NoLock);
	return fill.added;
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
		(void) fill_keys(relid == payidem_relation(PAYIDEM_PAYMENT_PENDING), relid == payidem_relation(PAYIDEM_PAYMENT_PAID), false);
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
		if (relid != payidem_relation(PAYIDEM_PAYMENT_PENDING) && relid != payidem_relation(PAYIDEM_PAYMENT_PAID))
			ereport(ERROR,
					(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
					 errmsg("payidem._payment_keys_received() is the trigger of payidem.payment_pending and payidem.payment_paid only"),
					 errdetail("It was fired on %s.", RelationGetRelationName(td->tg_relation))));
		return PointerGetDatum(NULL);
	}
	return PointerGetDatum(TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple);
}
