/*-------------------------------------------------------------------------
 *
 * orders.c
 *		create_order() and begin_payment(), in C: their rows written
 *		directly.
 *
 *   payidem.create_order(merchant_no, out_trade_no, amount, subject, ...)
 *     RETURNS text — a new pending order, or the one an earlier call with
 *     the same out_trade_no made (below).
 *
 *   payidem.begin_payment(order_no, channel_no) RETURNS text — the pending
 *     payment attempt of an order (below).
 *
 * Each acts as the tables' owner itself, with search_path pinned as a SET
 * clause would pin it.  Reads are by key, without SQL.  The rows are
 * written as the statement would — constraints, domains, defaults,
 * indexes, the triggers (status_guard's history row, the expiry queue, the
 * foreign keys) — without a statement: no executor started and stopped, and
 * the CHECK constraints, defaults and index predicates compiled once per
 * session instead of read back from the catalog at every row (direct.c).
 * Where the table has what a direct insert cannot reproduce (a rule, a
 * trigger with a transition table, a BEFORE row trigger before a conflict
 * check, row-level security that applies, no INSERT privilege, a column of
 * another type), the INSERT statement writes the row: the same row either
 * way.  The errors SQL helpers of payidem make (_require(),
 * _invalid_format(), _raise_not_found(), ...) are made by them, called only
 * on the paths that end there.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "direct.h"
#include "errcodes.h"
#include "housekeeping.h"
#include "order_no.h"
#include "util.h"

/*
 * Raise the error an SQL helper of payidem makes (the one place its message
 * is written): sql, with $1 .. $nargs of types, must raise.  Only on a path
 * that ends in that error: the statement is parsed there.
 */
static void
raise_by_sql(const char *sql, int nargs, Oid *types, Datum *values, const char *nulls)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	SPI_execute_with_args(sql, nargs, types, values, nulls, false, 0);
	elog(ERROR, "payidem: \"%s\" raised no error", sql);
}

/* text column name of tuple of rel as a C string (NULL if NULL) */
static char *
text_column(Relation rel, HeapTuple tuple, const char *name)
{
	bool		isnull;
	Datum		d = payidem_getattr(rel, tuple, name, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/* bigint column name of tuple of rel (false if NULL) */
static bool
int8_column(Relation rel, HeapTuple tuple, const char *name, int64 *value)
{
	bool		isnull;
	Datum		d = payidem_getattr(rel, tuple, name, &isnull);

	if (!isnull)
		*value = DatumGetInt64(d);
	return !isnull;
}

/* a bigint limit as format('%s', coalesce(limit::text, 'none')) shows it */
static char *
limit_text(bool set, int64 value)
{
	return set ? psprintf(INT64_FORMAT, value) : pstrdup("none");
}

/* the row of rel (open) by the key of its unique index, as snapshot sees it */
static HeapTuple
fetch_by(Relation rel, PayidemRelation index, int nkeys, Datum *keys)
{
	return payidem_fetch_unique(rel, index, nkeys, keys, GetActiveSnapshot());
}

/*
 * PI004 for a merchant or a channel (what, and What capitalised) whose
 * status is not active: the one wording of that refusal, with hint.
 */
static void
refuse_not_active(const char *what, const char *What, const char *no, const char *status, const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_PAYIDEM_NOT_PERMITTED),
			 errmsg("%s %s is %s", what, no, status),
			 errdetail("%s %s has status %s.", What, no, status),
			 errhint("%s", hint)));
}

/*
 * The row of rel (open) by the one-column key of its unique index, as the
 * active snapshot sees it; if there is none, _raise_not_found()'s PI009 for
 * <what> key, naming table and column.
 */
static HeapTuple
fetch_or_not_found(Relation rel, PayidemRelation index, Datum key, const char *what, const char *column)
{
	HeapTuple	tuple = fetch_by(rel, index, 1, &key);

	if (tuple == NULL)
	{
		Oid			t[4] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID};
		Datum		v[4] = {CStringGetTextDatum(what), key,
			CStringGetTextDatum(psprintf("payidem.%s", RelationGetRelationName(rel))),
		CStringGetTextDatum(column)};

		raise_by_sql("SELECT payidem._raise_not_found($1, $2, $3, $4)", 4, t, v, NULL);
	}
	return tuple;
}

/*
 * The row of rel at tid (found with the active snapshot) locked FOR KEY
 * SHARE as a foreign key's check locks it (the table RowShareLock'ed, the
 * latest version under READ COMMITTED): whether it is then held with column
 * keycol equal to key, so that a foreign key to it from key needs no check
 * of its own (PayidemLockedRef).  False if the row is gone or its key
 * changed: the foreign key's check then runs and decides.
 */
static bool
lock_referenced_row(Relation rel, ItemPointer tid, const char *keycol, Datum key)
{
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		held = false;

	LockRelationOid(RelationGetRelid(rel), RowShareLock);
	slot->tts_tid = *tid;
	if (payidem_lock_row_as_select(rel, slot, GetActiveSnapshot(), LockTupleKeyShare))
	{
		bool		should_free;
		bool		isnull;
		HeapTuple	locked = ExecFetchSlotHeapTuple(slot, false, &should_free);
		Datum		d = payidem_getattr(rel, locked, keycol, &isnull);

		held = !isnull && payidem_text_equal(d, key);
		if (should_free)
			heap_freetuple(locked);
	}
	ExecDropSingleTupleTableSlot(slot);
	return held;
}

/*
 * Whether merchant_type is in a channel's allowed_merchant_types, as
 * `merchant_type = ANY (types)` says it: true, false, or (no element equal
 * and one is NULL) unknown, which admits as the PL/pgSQL IF did.  The list
 * as array_to_string(types, ', ') writes it into *list.
 */
static bool
type_admitted(Datum types, const char *merchant_type, char **list)
{
	ArrayType  *arr = DatumGetArrayTypeP(types);
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	bool		any_null = false;
	bool		found = false;
	StringInfoData buf;

	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	initStringInfo(&buf);
	for (i = 0; i < n; i++)
	{
		char	   *e;

		if (nulls[i])
		{
			any_null = true;
			continue;
		}
		e = TextDatumGetCString(elems[i]);
		if (strcmp(e, merchant_type) == 0)
			found = true;
		appendStringInfo(&buf, "%s%s", buf.len > 0 ? ", " : "", e);
	}
	*list = buf.data;
	return found || any_null;
}

/*
 * create_order()'s new order, as INSERT ... ON CONFLICT ON CONSTRAINT
 * order_out_trade_no_key DO NOTHING writes it (the unique constraint decides
 * between concurrent first calls; the loser waits for the winner and finds
 * its row): its number (gen_order_no('PO'); the caller made the read-only
 * check an INSERT makes first), or NULL if the merchant's out_trade_no is
 * taken.  Written directly, or by the statement where the table has what a
 * direct insert cannot reproduce (its RETURNING then says the number stored,
 * which a BEFORE INSERT trigger may have set).  args: merchant_no,
 * out_trade_no, subject, body, amount, notify_url, return_url, expire_at;
 * args_checked: the domain the caller checked each against when the domains
 * stood at checked_at, or InvalidOid (payidem_insert_row_refs()); merchant_tid:
 * the merchant's row as the caller read it, locked once the order is
 * written (the order's foreign key, PayidemLockedRef).
 */
#define ORDER_COLUMNS 9

/*
 * The order's insert, directly or by the statement, with its number (values[0])
 * made known to the expiry queue's trigger, which then writes the order's row
 * without a pre-check (housekeeping.c), and forgotten once the insert is
 * over, also when it fails.
 */
static int
insert_fresh(PayidemInsert *ins, const Datum *values, const bool *nulls, PayidemLockedRef *merchant_ref,
			 const Oid *checked, uint64 checked_at)
{
	volatile int result = -1;

	payidem_expiry_fresh_order(values[0]);
	PG_TRY();
	{
		result = payidem_insert_row_refs(ins, values, nulls, PAYIDEM_ORDER_OUT_TRADE_NO_KEY, merchant_ref, 1,
										 checked, checked_at);
	}
	PG_FINALLY();
	{
		payidem_expiry_fresh_order((Datum) 0);
	}
	PG_END_TRY();
	return result;
}

static void
execute_fresh(SPIPlanPtr plan, const Datum *values, const char *nulls)
{
	payidem_expiry_fresh_order(values[0]);
	PG_TRY();
	{
		if (SPI_execute_plan(plan, (Datum *) values, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
			elog(ERROR, "payidem: the insert of an order failed");
	}
	PG_FINALLY();
	{
		payidem_expiry_fresh_order((Datum) 0);
	}
	PG_END_TRY();
}

static Datum
insert_order(const Datum *args, const bool *args_null, const Oid *args_checked, uint64 checked_at,
			 ItemPointer merchant_tid, bool *conflict)
{
	static const char *const merchant_key[1] = {"merchant_no"};
	static const char *const columns[ORDER_COLUMNS] = {
		"order_no", "merchant_no", "out_trade_no", "subject", "body", "amount",
		"notify_url", "return_url", "expire_at"
	};
	static const Oid types[ORDER_COLUMNS] = {
		TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID
	};
	static PayidemInsert *ins = NULL;
	static SPIPlanPtr insert_plan = NULL;
	PayidemLockedRef merchant_ref = {PAYIDEM_MERCHANT, 1, merchant_key, merchant_key, merchant_tid};
	Datum		values[ORDER_COLUMNS];
	bool		nulls[ORDER_COLUMNS];
	Oid			checked[ORDER_COLUMNS];
	char		n[ORDER_COLUMNS];
	Datum		stored = (Datum) 0;
	bool		isnull = true;
	int			i;
	int			result;

	values[0] = DirectFunctionCall1(payidem_gen_order_no, CStringGetTextDatum("PO"));
	nulls[0] = false;
	checked[0] = InvalidOid;
	for (i = 1; i < ORDER_COLUMNS; i++)
	{
		nulls[i] = args_null[i - 1];
		values[i] = nulls[i] ? (Datum) 0 : args[i - 1];
		checked[i] = args_checked[i - 1];
	}
	if (ins == NULL)
		ins = payidem_insert_define(PAYIDEM_ORDER, ORDER_COLUMNS, columns, types);
	result = insert_fresh(ins, values, nulls, &merchant_ref, checked, checked_at);
	*conflict = result == 0;
	if (result >= 0)
		return values[0];
	for (i = 0; i < ORDER_COLUMNS; i++)
		n[i] = nulls[i] ? 'n' : ' ';
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	payidem_saved_plan(&insert_plan,
					   "INSERT INTO payidem.\"order\" AS x (order_no, merchant_no, out_trade_no, subject,"
					   " body, amount, notify_url, return_url, expire_at)"
					   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
					   " ON CONFLICT ON CONSTRAINT order_out_trade_no_key DO NOTHING"
					   " RETURNING x.order_no", ORDER_COLUMNS, (Oid *) types);
	execute_fresh(insert_plan, values, n);
	if (SPI_processed == 1)
		stored = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		stored = SPI_datumTransfer(stored, false, -1);
	SPI_finish();
	*conflict = isnull;
	return stored;
}

/* a text value as quote_literal(left(value, 64)) shows it in a message */
static char *
quoted_start(Datum value)
{
	return TextDatumGetCString(DirectFunctionCall1(quote_literal,
												   DirectFunctionCall2(text_left, value, Int32GetDatum(64))));
}

/* whether value fits payidem.<type> (payidem_domain_fits(), its checks kept per session) */
static bool
fits(PayidemType type, Datum value)
{
	static void *cache[PAYIDEM_NUM_TYPES];

	return payidem_domain_fits(&cache[type], TopMemoryContext, payidem_type(type), value);
}

/* 22023 "invalid <what>" for a value not of its format (_invalid_format()) */
static void
invalid_format(const char *what, Datum value, bool isnull, const char *domain, const char *hint)
{
	Oid			t[4] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		v[4] = {CStringGetTextDatum(what), value, CStringGetTextDatum(domain), CStringGetTextDatum(hint)};

	raise_by_sql("SELECT payidem._invalid_format($1, $2, $3::pg_catalog.regtype, $4)", 4, t, v,
				 isnull ? " n  " : "    ");
}

/*
 * payidem.create_order(merchant_no text, out_trade_no text, amount bigint,
 *		subject text, notify_url text, return_url text, expire_in interval,
 *		body text) RETURNS text
 *
 * A new pending order, or (the same merchant_no and out_trade_no again) the
 * order an earlier call made.  In this order, the first that fails is the
 * error:
 *
 *   - 22023 for a bad argument, each named: merchant_no NULL (_require()),
 *     the amount, the subject (its domain, then no control character), the
 *     out_trade_no (its domain, _invalid_format()), expire_in
 *     (payidem_check_interval()), notify_url and return_url (their domain),
 *     the body (its domain); a format is its domain's CHECK
 *     (payidem_domain_fits()), written once;
 *   - PI009 an unknown merchant (_raise_not_found()), PI004 one not active;
 *   - the order inserted (insert_order()); if the out_trade_no is taken, the
 *     merchant's order with it is read: the same amount and subject return
 *     its number, another amount or subject is PI001.
 *
 * C, acting as the tables' owner itself, with search_path pinned as a
 * SECURITY DEFINER function's SET clause pins it; each read with a new
 * snapshot, as the statements it replaces had; the SQL helpers called only
 * on the paths that end in their error.
 */
PG_FUNCTION_INFO_V1(payidem_create_order);
Datum
payidem_create_order(PG_FUNCTION_ARGS)
{
	PayidemAsOwner as_owner;
	int			guc_level;
	Datum		merchant_no = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	Datum		out_trade_no = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	Datum		subject = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	int64		amount = PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2);
	Datum		args[8];
	bool		args_null[8];
	Oid			args_checked[8];
	uint64		checked_at;
	Relation	rel;
	HeapTuple	tuple;
	ItemPointerData merchant_tid;
	Datum		keys[2];
	bool		isnull;
	bool		conflict;
	Datum		order_no;

	/*
	 * what other sessions committed (an ALTER DOMAIN of a format), as a
	 * statement would see it: the checks below go by it, and the insert does
	 * not check a value again unless a domain's rules may have changed since
	 * (checked_at, payidem_insert_row_refs())
	 */
	AcceptInvalidationMessages();
	checked_at = payidem_domain_generation();
	payidem_become_owner(payidem_owner(PAYIDEM_ORDER), 0, &as_owner);
	guc_level = payidem_pin_search_path();

	/* the arguments, in the order their errors come */
	if (PG_ARGISNULL(0))
	{
		Oid			t[2] = {TEXTOID, TEXTOID};
		Datum		v[2] = {CStringGetTextDatum("merchant_no"), (Datum) 0};

		raise_by_sql("SELECT payidem._require($1, $2)", 2, t, v, " n");
	}
	if (PG_ARGISNULL(2) || amount <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid order amount"),
				 errdetail("The amount was %s; it must be a positive number of minor units (fen, cents).",
						   PG_ARGISNULL(2) ? "NULL" : psprintf(INT64_FORMAT, amount)),
				 errhint("Pass 12.50 CNY as 1250.")));
	if (PG_ARGISNULL(3) || !fits(PAYIDEM_TYPE_ORDER_SUBJECT, subject))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid order subject"),
				 errdetail("The subject was %s; it must have 1 to 256 characters (not only spaces).",
						   PG_ARGISNULL(3) ? "NULL" : quoted_start(subject)),
				 errhint("Describe what is being paid for, e.g. 'Green tea 250 g'.")));
	payidem_check_no_controls_text("invalid order subject", "The subject", DatumGetTextPP(subject));
	if (PG_ARGISNULL(1) || !fits(PAYIDEM_TYPE_MERCHANT_REF, out_trade_no))
		invalid_format("out_trade_no", out_trade_no, PG_ARGISNULL(1), "payidem.merchant_ref",
					   "Use the merchant's own order number, e.g. SHOP-20261129-0001.");
	payidem_check_interval("invalid expiry", "expire_in", PG_ARGISNULL(6) ? NULL : PG_GETARG_INTERVAL_P(6),
						   false, 100, "The default is '2 hours'.");
	if (!PG_ARGISNULL(4) && !fits(PAYIDEM_TYPE_HTTP_URL, PG_GETARG_DATUM(4)))
		invalid_format("notify_url", PG_GETARG_DATUM(4), false, "payidem.http_url",
					   "Pass NULL for no merchant notification.");
	if (!PG_ARGISNULL(5) && !fits(PAYIDEM_TYPE_HTTP_URL, PG_GETARG_DATUM(5)))
		invalid_format("return_url", PG_GETARG_DATUM(5), false, "payidem.http_url", "Pass NULL for none.");
	if (!PG_ARGISNULL(7) && !fits(PAYIDEM_TYPE_ORDER_BODY, PG_GETARG_DATUM(7)))
	{
		text	   *body = PG_GETARG_TEXT_PP(7);

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid order body"),
				 errdetail("The body has %d characters; at most 1024 are allowed.",
						   pg_mbstrlen_with_len(VARDATA_ANY(body), VARSIZE_ANY_EXHDR(body)))));
	}

	/* the merchant, as the next statement would read it: a new snapshot */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(payidem_relation(PAYIDEM_MERCHANT), AccessShareLock);
	tuple = fetch_or_not_found(rel, PAYIDEM_MERCHANT_PKEY, merchant_no, "merchant", "merchant_no");
	merchant_tid = tuple->t_self;
	{
		char	   *status = text_column(rel, tuple, "status");
		char	   *m = TextDatumGetCString(merchant_no);

		if (status != NULL && strcmp(status, "active") != 0)
			refuse_not_active("merchant", "Merchant", m, status, "Only active merchants take orders.");
	}
	table_close(rel, NoLock);

	/*
	 * (the order's foreign key to its merchant: the insert locks the row read
	 * above FOR KEY SHARE right after writing the order, where the key's
	 * check would lock it, and leaves the check out: locking it before the
	 * insert would hold that lock while the insert waits for another call's
	 * order of the same out_trade_no, which a DBA's FOR UPDATE of the
	 * merchant then deadlocks with)
	 */
	PreventCommandIfReadOnly("INSERT");

	/* the order */
	args[0] = merchant_no;
	args[1] = out_trade_no;
	args[2] = subject;
	args[3] = PG_ARGISNULL(7) ? (Datum) 0 : PG_GETARG_DATUM(7);
	args[4] = Int64GetDatum(amount);
	args[5] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);
	args[6] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
	args[7] = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
								  PG_GETARG_DATUM(6));
	memset(args_null, 0, sizeof(args_null));
	args_null[3] = PG_ARGISNULL(7);
	args_null[5] = PG_ARGISNULL(4);
	args_null[6] = PG_ARGISNULL(5);
	/* what fits() checked above */
	memset(args_checked, 0, sizeof(args_checked));
	args_checked[1] = payidem_type(PAYIDEM_TYPE_MERCHANT_REF);
	args_checked[2] = payidem_type(PAYIDEM_TYPE_ORDER_SUBJECT);
	args_checked[3] = payidem_type(PAYIDEM_TYPE_ORDER_BODY);
	args_checked[5] = payidem_type(PAYIDEM_TYPE_HTTP_URL);
	args_checked[6] = payidem_type(PAYIDEM_TYPE_HTTP_URL);
	order_no = insert_order(args, args_null, args_checked, checked_at, &merchant_tid, &conflict);
	PopActiveSnapshot();

	/*
	 * the out_trade_no is taken (a committed row: the insert waited for its
	 * transaction): the merchant's order with it, as the next statement reads
	 */
	if (conflict)
	{
		char	   *o_order_no;
		int64		o_amount = 0;
		Datum		o_subject;

		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		rel = table_open(payidem_relation(PAYIDEM_ORDER), AccessShareLock);
		keys[0] = merchant_no;
		keys[1] = out_trade_no;
		tuple = fetch_by(rel, PAYIDEM_ORDER_OUT_TRADE_NO_KEY, 2, keys);
		/*
		 * (a row that holds the key is committed and never deleted; none is
		 * there if a DBA's BEFORE INSERT trigger dropped or changed the row)
		 */
		if (tuple == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_RAISE_EXCEPTION),
					 errmsg("order %s of merchant %s vanished", TextDatumGetCString(out_trade_no),
							TextDatumGetCString(merchant_no))));
		o_order_no = text_column(rel, tuple, "order_no");
		(void) int8_column(rel, tuple, "amount", &o_amount);
		o_subject = payidem_getattr(rel, tuple, "subject", &isnull);
		if (o_amount != amount)
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_IDEMPOTENCY_MISMATCH),
					 errmsg("out_trade_no %s was already used with another amount", TextDatumGetCString(out_trade_no)),
					 errdetail("Order %s of merchant %s (out_trade_no %s) has amount " INT64_FORMAT "; this call asked for " INT64_FORMAT ".",
							   o_order_no, TextDatumGetCString(merchant_no), TextDatumGetCString(out_trade_no),
							   o_amount, amount),
					 errhint("A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.")));
		if (!isnull && !payidem_text_equal(o_subject, subject))
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_IDEMPOTENCY_MISMATCH),
					 errmsg("out_trade_no %s was already used with another subject", TextDatumGetCString(out_trade_no)),
					 errdetail("Order %s of merchant %s (out_trade_no %s) has subject %s; this call asked for %s.",
							   o_order_no, TextDatumGetCString(merchant_no), TextDatumGetCString(out_trade_no),
							   quoted_start(o_subject), quoted_start(subject)),
					 errhint("A repeated create_order must carry the same amount and subject; use a new out_trade_no for a new order.")));
		order_no = CStringGetTextDatum(o_order_no);
		table_close(rel, NoLock);
		PopActiveSnapshot();
	}
	payidem_unpin_search_path(guc_level);
	payidem_become_caller(&as_owner);
	PG_RETURN_DATUM(order_no);
}

/*
 * payidem.begin_payment(order_no text, channel_no text) RETURNS text
 *
 * Starts the pending payment attempt of an order on a channel, or returns
 * the one pending on that channel already (a retried call); payment_no =
 * gen_order_no('PY').  In this order, the first that fails is the error:
 *
 *   - 0A000 in a REPEATABLE READ transaction (_refuse_repeatable_read());
 *   - 22023 for a NULL channel, or an order number that is none
 *     (_require(), _check_number()); PI009 for an unknown order;
 *   - the order, locked (FOR NO KEY UPDATE: the lock order of every flow
 *     function, the order first): PI002 if it is not pending, PI008 if it
 *     has expired;
 *   - PI004: the merchant not active; PI009 an unknown channel; PI004 the
 *     channel not active, no active binding of the merchant to it, or the
 *     merchant's type not admitted;
 *   - the order's pending attempt (we hold the order's lock, so it is
 *     stable; payment_pending's key is the final guard): on this channel,
 *     returned; on another, PI003;
 *   - PI007: the amount above the binding's or the channel's single limit;
 *     the day's sum above a daily limit (_check_daily_limit(), under the
 *     binding's lock);
 *   - the attempt inserted (directly, or by the INSERT statement where the
 *     table needs it).
 *
 * C, acting as the tables' owner itself, with search_path pinned as a
 * SECURITY DEFINER function's SET clause pins it (a DBA's trigger on the
 * payment runs as the owner, and resolves no name in the caller's schemas):
 * the look-ups are by key, without SQL; the SQL helpers are called only on
 * the paths that end in their error.
 */
PG_FUNCTION_INFO_V1(payidem_begin_payment);
Datum
payidem_begin_payment(PG_FUNCTION_ARGS)
{
	static const char *const columns[] = {"payment_no", "order_no", "merchant_no", "channel_no", "amount"};
	static const Oid types[] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID};
	static PayidemInsert *ins = NULL;
	static SPIPlanPtr daily_plan = NULL;
	static SPIPlanPtr insert_plan = NULL;
	static const char *const order_key[] = {"order_no", "merchant_no"};
	static const char *const channel_key[] = {"channel_no"};
	static const PayidemLockedRef order_ref = {PAYIDEM_ORDER, 2, order_key, order_key};
	static const PayidemLockedRef channel_ref = {PAYIDEM_CHANNEL, 1, channel_key, channel_key};
	PayidemLockedRef refs[2];
	int			nrefs;
	ItemPointerData c_tid;
	PayidemAsOwner as_owner;
	int			guc_level;
	Datum		order_no_arg = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	Datum		channel_no_arg = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	Relation	order_rel;
	Relation	rel;
	TupleTableSlot *oslot;
	HeapTuple	o;
	HeapTuple	m;
	HeapTuple	c;
	HeapTuple	b;
	Datum		keys[2];
	bool		isnull;
	char	   *o_order_no;
	char	   *o_status;
	char	   *o_merchant_no;
	int64		o_amount = 0;
	TimestampTz o_expire_at;
	char	   *m_status;
	char	   *c_channel_no;
	char	   *c_status;
	int64		b_single = 0;
	int64		c_single = 0;
	bool		b_single_set;
	bool		c_single_set;
	int64		b_daily = 0;
	int64		c_daily = 0;
	bool		b_daily_set;
	bool		c_daily_set;
	Datum		payment_no;
	Datum		values[lengthof(columns)];
	bool		nulls[lengthof(columns)] = {false, false, false, false, false};

	/* the owner from the start: the SQL helpers are not the caller's to run */
	payidem_become_owner(payidem_owner(PAYIDEM_ORDER), 0, &as_owner);
	guc_level = payidem_pin_search_path();
	if (XactIsoLevel == XACT_REPEATABLE_READ)
	{
		Oid			t[2] = {TEXTOID, TEXTOID};
		Datum		v[2] = {CStringGetTextDatum("begin_payment"),
		CStringGetTextDatum("the order's pending attempt and the daily limit")};

		raise_by_sql("SELECT payidem._refuse_repeatable_read($1, $2)", 2, t, v, NULL);
	}
	if (PG_ARGISNULL(1))
	{
		Oid			t[2] = {TEXTOID, TEXTOID};
		Datum		v[2] = {CStringGetTextDatum("channel_no"), (Datum) 0};

		raise_by_sql("SELECT payidem._require($1, $2)", 2, t, v, " n");
	}

	/* the order's lock is a write: refused where a SELECT ... FOR NO KEY UPDATE is */
	PreventCommandIfReadOnly("SELECT FOR NO KEY UPDATE");
	/* as the next statement would: after what came before, a new snapshot */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());

	/* the order, locked */
	order_rel = table_open(payidem_relation(PAYIDEM_ORDER), RowShareLock);
	oslot = table_slot_create(order_rel, NULL);
	o = NULL;
	if (!PG_ARGISNULL(0))
	{
		keys[0] = order_no_arg;
		o = fetch_by(order_rel, PAYIDEM_ORDER_PKEY, 1, keys);
		if (o != NULL)
		{
			oslot->tts_tid = o->t_self;
			if (payidem_lock_row_as_select(order_rel, oslot, GetActiveSnapshot(), LockTupleNoKeyExclusive))
			{
				bool		should_free;

				o = ExecFetchSlotHeapTuple(oslot, true, &should_free);
				/* (the latest version: still the order asked for) */
				if (!DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID,
														  payidem_getattr(order_rel, o, "order_no", &isnull),
														  order_no_arg)))
					o = NULL;
			}
			else
				o = NULL;
		}
	}
	if (o == NULL)
	{
		/* (a number that is not one is 22023; a stored order's number always is one) */
		Oid			t[1] = {TEXTOID};
		Datum		v[1] = {order_no_arg};

		raise_by_sql("SELECT payidem._check_number('order', $1),"
					 " payidem._raise_not_found('order', $1, 'payidem.\"order\"', 'order_no')",
					 1, t, v, PG_ARGISNULL(0) ? "n" : " ");
	}
	/*
	 * what follows reads with a new snapshot, as the next statement would:
	 * whatever the transaction that held the order's lock committed (its
	 * attempt, its day's sum) is seen
	 */
	PopActiveSnapshot();
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	o_order_no = text_column(order_rel, o, "order_no");
	o_status = text_column(order_rel, o, "status");
	o_merchant_no = text_column(order_rel, o, "merchant_no");
	(void) int8_column(order_rel, o, "amount", &o_amount);
	o_expire_at = DatumGetTimestampTz(payidem_getattr(order_rel, o, "expire_at", &isnull));
	if (strcmp(o_status, "pending") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
				 errmsg("order %s cannot take a payment", o_order_no),
				 errdetail("Order %s is %s; only a pending order takes a payment.", o_order_no, o_status),
				 errhint("%s", strcmp(o_status, "closed") == 0 ? "Create a new order (with a new out_trade_no)."
						 : "The order is already paid.")));
	if (o_expire_at <= GetCurrentTransactionStartTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_ORDER_EXPIRED),
				 errmsg("order %s has expired", o_order_no),
				 errdetail("Order %s expired at %s.", o_order_no,
						   DatumGetCString(DirectFunctionCall1(timestamptz_out, TimestampTzGetDatum(o_expire_at)))),
				 errhint("Close it with payidem.close_order() and create a new order.")));

	/* the merchant, the channel and the binding */
	rel = table_open(payidem_relation(PAYIDEM_MERCHANT), AccessShareLock);
	keys[0] = CStringGetTextDatum(o_merchant_no);
	m = fetch_by(rel, PAYIDEM_MERCHANT_PKEY, 1, keys);
	if (m == NULL)				/* (its foreign key: cannot happen) */
		elog(ERROR, "payidem: merchant %s of order %s is missing", o_merchant_no, o_order_no);
	m_status = text_column(rel, m, "status");
	if (strcmp(m_status, "active") != 0)
		refuse_not_active("merchant", "Merchant", o_merchant_no, m_status, "Only active merchants take payments.");
	{
		char	   *merchant_type = text_column(rel, m, "merchant_type");

		table_close(rel, NoLock);
		rel = table_open(payidem_relation(PAYIDEM_CHANNEL), AccessShareLock);
		c = fetch_or_not_found(rel, PAYIDEM_CHANNEL_PKEY, channel_no_arg, "channel", "channel_no");
		c_channel_no = text_column(rel, c, "channel_no");
		c_status = text_column(rel, c, "status");
		c_tid = c->t_self;
		if (strcmp(c_status, "active") != 0)
			refuse_not_active("channel", "Channel", c_channel_no, c_status,
							  "Route the payment to an active channel (payidem.route_channel()).");
		c_single_set = int8_column(rel, c, "single_limit", &c_single);
		c_daily_set = int8_column(rel, c, "daily_limit", &c_daily);
		{
			Datum		admitted = payidem_getattr(rel, c, "allowed_merchant_types", &isnull);
			Relation	brel = table_open(payidem_relation(PAYIDEM_MERCHANT_CHANNEL), AccessShareLock);
			char	   *b_status;

			keys[0] = CStringGetTextDatum(o_merchant_no);
			keys[1] = channel_no_arg;
			b = fetch_by(brel, PAYIDEM_MERCHANT_CHANNEL_PKEY, 2, keys);
			b_status = b != NULL ? text_column(brel, b, "status") : NULL;
			if (b == NULL || strcmp(b_status, "active") != 0)
				ereport(ERROR,
						(errcode(ERRCODE_PAYIDEM_NOT_PERMITTED),
						 errmsg("merchant %s is not bound to channel %s", o_merchant_no, c_channel_no),
						 b != NULL ? errdetail("The binding is %s.", b_status) : errdetail("There is no binding."),
						 errhint("Bind the channel with payidem.bind_channel().")));
			b_single_set = int8_column(brel, b, "single_limit", &b_single);
			b_daily_set = int8_column(brel, b, "daily_limit", &b_daily);
			table_close(brel, NoLock);
			if (!isnull)
			{
				char	   *list;

				if (!type_admitted(admitted, merchant_type, &list))
					ereport(ERROR,
							(errcode(ERRCODE_PAYIDEM_NOT_PERMITTED),
							 errmsg("channel %s does not admit merchants of type %s", c_channel_no, merchant_type),
							 errdetail("Channel %s admits %s; merchant %s is %s.", c_channel_no, list,
									   o_merchant_no, merchant_type)));
			}
		}
		table_close(rel, NoLock);
	}

	/* the order's pending attempt (at most one: payment_pending's key) */
	{
		Relation	prel = table_open(payidem_relation(PAYIDEM_PAYMENT_PENDING), AccessShareLock);
		HeapTuple	pending;

		keys[0] = CStringGetTextDatum(o_order_no);
		pending = fetch_by(prel, PAYIDEM_PAYMENT_ONE_PENDING_PER_ORDER, 1, keys);
		if (pending != NULL)
		{
			Relation	payrel = table_open(payidem_relation(PAYIDEM_PAYMENT), AccessShareLock);
			HeapTuple	p;

			keys[0] = payidem_getattr(prel, pending, "payment_no", &isnull);
			p = isnull ? NULL : fetch_by(payrel, PAYIDEM_PAYMENT_PKEY, 1, keys);
			if (p != NULL)
			{
				char	   *p_payment_no = text_column(payrel, p, "payment_no");
				char	   *p_channel_no = text_column(payrel, p, "channel_no");
				char	   *p_status = text_column(payrel, p, "status");
				char	   *p_order_no = text_column(payrel, p, "order_no");

				if (strcmp(p_status, "pending") == 0 && strcmp(p_order_no, o_order_no) == 0)
				{
					if (strcmp(p_channel_no, c_channel_no) == 0)
					{
						/* a retried call: the same attempt */
						table_close(payrel, NoLock);
						table_close(prel, NoLock);
						table_close(order_rel, NoLock);
						ExecDropSingleTupleTableSlot(oslot);
						PopActiveSnapshot();
						payidem_unpin_search_path(guc_level);
						payidem_become_caller(&as_owner);
						PG_RETURN_TEXT_P(cstring_to_text(p_payment_no));
					}
					ereport(ERROR,
							(errcode(ERRCODE_PAYIDEM_PAYMENT_IN_PROGRESS),
							 errmsg("order %s has a payment in progress on channel %s", o_order_no, p_channel_no),
							 errdetail("Payment %s of order %s is pending on channel %s; this call asked for channel %s.",
									   p_payment_no, o_order_no, p_channel_no, c_channel_no),
							 errhint("Query channel %s, then close payment %s with payidem.close_payment() before starting another.",
									 p_channel_no, p_payment_no)));
				}
			}
			table_close(payrel, NoLock);
		}
		table_close(prel, NoLock);
	}

	/* the limits */
	if ((b_single_set && o_amount > b_single) || (c_single_set && o_amount > c_single))
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_LIMIT_EXCEEDED),
				 errmsg("amount exceeds the single-payment limit"),
				 errdetail("Order %s is for " INT64_FORMAT "; the single limit is %s for merchant %s on channel %s and %s for the channel.",
						   o_order_no, o_amount, limit_text(b_single_set, b_single), o_merchant_no, c_channel_no,
						   limit_text(c_single_set, c_single)),
				 errhint("Use another channel, or raise the limit with payidem.bind_channel().")));
	if (b_daily_set || c_daily_set)
	{
		Oid			t[5] = {TEXTOID, TEXTOID, INT8OID, INT8OID, INT8OID};
		Datum		v[5] = {CStringGetTextDatum(o_merchant_no), CStringGetTextDatum(c_channel_no),
		Int64GetDatum(o_amount), Int64GetDatum(b_daily), Int64GetDatum(c_daily)};
		char		n[6] = {' ', ' ', ' ', b_daily_set ? ' ' : 'n', c_daily_set ? ' ' : 'n', '\0'};

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		payidem_saved_plan(&daily_plan, "SELECT payidem._check_daily_limit($1, $2, $3, $4, $5)", 5, t);
		if (SPI_execute_plan(daily_plan, v, n, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "payidem: the check of a daily limit failed");
		SPI_finish();
	}

	/*
	 * the attempt's foreign keys, checked as their checks would: the order's
	 * row this call holds locked (FOR NO KEY UPDATE, its latest version, the
	 * values written are that version's); the channel's row locked FOR KEY
	 * SHARE, its latest version.  Where that row is gone or its key changed
	 * meanwhile, the foreign key's own check decides (and refuses).
	 */
	nrefs = 0;
	refs[nrefs++] = order_ref;
	{
		Relation	crel = table_open(payidem_relation(PAYIDEM_CHANNEL), AccessShareLock);

		/* (in replica mode the foreign keys' checks do not fire: nothing to lock for) */
		if (SessionReplicationRole != SESSION_REPLICATION_ROLE_REPLICA &&
			lock_referenced_row(crel, &c_tid, "channel_no", CStringGetTextDatum(c_channel_no)))
			refs[nrefs++] = channel_ref;
		table_close(crel, NoLock);
	}

	/* the attempt */
	payment_no = DirectFunctionCall1(payidem_gen_order_no, CStringGetTextDatum("PY"));
	values[0] = payment_no;
	values[1] = CStringGetTextDatum(o_order_no);
	values[2] = CStringGetTextDatum(o_merchant_no);
	values[3] = CStringGetTextDatum(c_channel_no);
	values[4] = Int64GetDatum(o_amount);
	if (ins == NULL)
		ins = payidem_insert_define(PAYIDEM_PAYMENT, lengthof(columns), columns, types);
	if (payidem_insert_row_refs(ins, values, nulls, -1, refs, nrefs, NULL, 0) < 0)
	{
		Oid			t[5] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID};

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		payidem_saved_plan(&insert_plan,
						   "INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)"
						   " VALUES ($1, $2, $3, $4, $5)", 5, t);
		if (SPI_execute_plan(insert_plan, values, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "payidem: the insert of a payment attempt failed");
		SPI_finish();
	}
	table_close(order_rel, NoLock);
	ExecDropSingleTupleTableSlot(oslot);
	PopActiveSnapshot();
	payidem_unpin_search_path(guc_level);
	payidem_become_caller(&as_owner);
	PG_RETURN_DATUM(payment_no);
}
