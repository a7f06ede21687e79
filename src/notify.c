/*-------------------------------------------------------------------------
 *
 * notify.c
 *		The merchant-notification events (docs/notifications.md): the one
 *		place an event's row and payload are made, and the one place a
 *		timestamp is written as the UTC text payloads and the read API use.
 *
 *   payidem._status_event() — trigger status_notify, AFTER UPDATE ... FOR
 *     EACH ROW on "order" (an order that became paid or closed and has a
 *     notify_url) and refund (a refund that succeeded).  It appends one row
 *     to payidem.notify_event in the transaction of the change it reports,
 *     so an event is delivered if and only if that change committed:
 *     order.paid (with the paying payment), order.closed, or
 *     refund.succeeded (with the order as the statement left it); and on
 *     payout, payout.succeeded or payout.failed to the merchant's own
 *     notify_url (the event names the payout, no order).  The
 *     payload is the JSON text the merchant receives, byte for byte what
 *     the signature covers: its keys in a fixed order, those that do not
 *     apply to the event (the payment's, when there is none) left out.
 *     Which changes are reported is decided here too (reported(), below),
 *     not in a WHEN clause.
 *
 *   payidem._utc(timestamptz) — 2026-11-30T07:33:36.463208Z.
 *
 * The trigger acts as the tables' owner (the event is written whoever
 * changed the row), switching to it itself rather than being SECURITY
 * DEFINER: no settings to save and restore on every call.  It reads the
 * payment (and, for a refund, the order) by key (payidem_fetch_unique) and
 * writes the event with a direct insert (payidem_insert): no SQL at all, so
 * no search_path can change what it does.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "direct.h"
#include "errcodes.h"
#include "order_no.h"
#include "util.h"

/* n as `width` decimal digits (n >= 0, < 10^width) at out */
static void
put_digits(char *out, int n, int width)
{
	while (width-- > 0)
	{
		out[width] = '0' + n % 10;
		n /= 10;
	}
}

/*
 * t as UTC ISO 8601 text into buf: what to_char(t AT TIME ZONE 'UTC',
 * 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') gives.  false (and nothing written) for
 * an infinite t, which that gives as NULL.
 */
static bool
append_utc(StringInfo buf, TimestampTz t)
{
	struct pg_tm tm;
	fsec_t		fsec;
	char		out[sizeof("2026-11-30T07:33:36.463208Z")];

	if (TIMESTAMP_NOT_FINITE(t))
		return false;
	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	if (tm.tm_year < 1 || tm.tm_year > 9999)
	{
		/* to_char's YYYY: the year without its era, at least four digits */
		appendStringInfo(buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
						 tm.tm_year <= 0 ? -(tm.tm_year - 1) : tm.tm_year,
						 tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
						 (int) fsec);
		return true;
	}
	/* the same, without a format to parse: events write two per payment */
	put_digits(out, tm.tm_year, 4);
	out[4] = '-';
	put_digits(out + 5, tm.tm_mon, 2);
	out[7] = '-';
	put_digits(out + 8, tm.tm_mday, 2);
	out[10] = 'T';
	put_digits(out + 11, tm.tm_hour, 2);
	out[13] = ':';
	put_digits(out + 14, tm.tm_min, 2);
	out[16] = ':';
	put_digits(out + 17, tm.tm_sec, 2);
	out[19] = '.';
	put_digits(out + 20, (int) fsec, 6);
	out[26] = 'Z';
	appendBinaryStringInfo(buf, out, 27);
	return true;
}

PG_FUNCTION_INFO_V1(payidem_utc);

Datum
payidem_utc(PG_FUNCTION_ARGS)
{
	StringInfoData buf;

	initStringInfo(&buf);
	if (!append_utc(&buf, PG_GETARG_TIMESTAMPTZ(0)))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

/* a column of a tuple by name, as text (its type's output), or NULL */
static char *
tuple_col(Relation rel, HeapTuple tuple, const char *name)
{
	return SPI_getvalue(tuple, RelationGetDescr(rel), payidem_column(rel, name));
}

/* whether text column name of tuple is one of the NULL-ended list */
static bool
tuple_text_in(Relation rel, HeapTuple tuple, const char *name, const char *const *list)
{
	bool		isnull;
	Datum		d = payidem_getattr(rel, tuple, name, &isnull);
	text	   *t;

	if (isnull)
		return false;
	t = DatumGetTextPP(d);
	for (; *list; list++)
		if (VARSIZE_ANY_EXHDR(t) == strlen(*list) && memcmp(VARDATA_ANY(t), *list, strlen(*list)) == 0)
			return true;
	return false;
}

/*
 * Which changes are reported: an order that became paid or closed and has a
 * notify_url, a refund that became succeeded.  Here, not in the triggers'
 * WHEN: the flow's direct updates build their executor state per call, and
 * a WHEN clause is read back from the catalog and planned for each.
 */
static bool
reported(Relation rel, bool is_refund, HeapTuple old, HeapTuple new)
{
	static const char *const order_reported[] = {"paid", "closed", NULL};
	static const char *const succeeded[] = {"succeeded", NULL};
	bool		old_null;
	bool		new_null;
	Datum		os;
	Datum		ns;

	if (is_refund)
		return tuple_text_in(rel, new, "status", succeeded) && !tuple_text_in(rel, old, "status", succeeded);
	if (!tuple_text_in(rel, new, "status", order_reported))
		return false;
	(void) payidem_getattr(rel, new, "notify_url", &new_null);
	if (new_null)
		return false;
	os = payidem_getattr(rel, old, "status", &old_null);
	ns = payidem_getattr(rel, new, "status", &new_null);
	return old_null || !payidem_text_equal(os, ns);
}

/*
 * ,"name":"value" (a JSON string) or ,"name":value (a JSON number, as given).
 * Every column these write is NOT NULL; a NULL would be written as null.
 */
static void
add_string(StringInfo buf, const char *name, const char *value)
{
	appendStringInfo(buf, ",\"%s\":", name);
	if (value == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, value);
}

static void
add_number(StringInfo buf, const char *name, const char *value)
{
	appendStringInfo(buf, ",\"%s\":%s", name, value ? value : "null");
}

/* ,"name":"<UTC text>"; nothing for an infinite time (the text needs no escaping) */
static void
add_utc(StringInfo buf, const char *name, TimestampTz t)
{
	if (TIMESTAMP_NOT_FINITE(t))
		return;
	appendStringInfo(buf, ",\"%s\":\"", name);
	(void) append_utc(buf, t);
	appendStringInfoChar(buf, '"');
}

/*
 * A payout that became succeeded or failed: payout.succeeded /
 * payout.failed, to the merchant's own notify_url (set_merchant_notify_url;
 * none set, no event).  The event names the payout, no order.
 */
static void
payout_event(Relation rel, HeapTuple old, HeapTuple new)
{
	static const char *const ended[] = {"succeeded", "failed", NULL};
	Relation	merchant_rel;
	HeapTuple	merchant;
	Datum		merchant_no;
	bool		isnull;
	int64		event_id;
	char	   *status;
	const char *event;
	StringInfoData payload;
	PayidemAsOwner as_owner;

	if (!tuple_text_in(rel, new, "status", ended) || tuple_text_in(rel, old, "status", ended))
		return;
	merchant_no = payidem_getattr(rel, new, "merchant_no", &isnull);
	if (isnull)
		return;
	payidem_begin_as_owner(rel->rd_rel->relowner, &as_owner);
	merchant_rel = table_open(payidem_relation(PAYIDEM_MERCHANT), AccessShareLock);
	merchant = payidem_fetch_unique(merchant_rel, PAYIDEM_MERCHANT_PKEY, 1, &merchant_no, GetActiveSnapshot());
	if (merchant != NULL)
		(void) payidem_getattr(merchant_rel, merchant, "notify_url", &isnull);
	table_close(merchant_rel, NoLock);
	if (merchant == NULL || isnull)
	{
		payidem_end_as_owner(&as_owner);
		return;
	}
	status = tuple_col(rel, new, "status");
	event = strcmp(status, "succeeded") == 0 ? "payout.succeeded" : "payout.failed";
	event_id = order_no_next_event_id();

	initStringInfo(&payload);
	appendStringInfo(&payload, "{\"event_id\":" INT64_FORMAT, event_id);
	add_string(&payload, "event", event);
	add_utc(&payload, "created_at", GetCurrentTransactionStartTimestamp());
	add_string(&payload, "merchant_no", tuple_col(rel, new, "merchant_no"));
	add_string(&payload, "payout_no", tuple_col(rel, new, "payout_no"));
	add_string(&payload, "out_payout_no", tuple_col(rel, new, "out_payout_no"));
	add_number(&payload, "amount", tuple_col(rel, new, "amount"));
	add_string(&payload, "currency", tuple_col(rel, new, "currency"));
	add_string(&payload, "status", status);
	{
		Datum		d = payidem_getattr(rel, new, "finished_at", &isnull);

		add_utc(&payload, "finished_at", isnull ? GetCurrentTransactionStartTimestamp() : DatumGetTimestampTz(d));
	}
	appendStringInfoChar(&payload, '}');

	{
		static const char *const columns[] = {
			"event_id", "event", "merchant_no", "payout_no", "payload",
			"status", "attempts", "next_attempt_at", "created_at"
		};
		static const Oid types[] = {
			INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID
		};
		static PayidemInsert *payout_insert = NULL;
		Datum		values[lengthof(columns)];
		bool		nulls[lengthof(columns)] = {false};
		TimestampTz now = GetCurrentTransactionStartTimestamp();

		if (payout_insert == NULL)
			payout_insert = payidem_insert_define(PAYIDEM_NOTIFY_EVENT, lengthof(columns), columns, types);
		values[0] = Int64GetDatum(event_id);
		values[1] = CStringGetTextDatum(event);
		values[2] = merchant_no;
		values[3] = CStringGetTextDatum(tuple_col(rel, new, "payout_no"));
		values[4] = PointerGetDatum(cstring_to_text_with_len(payload.data, payload.len));
		values[5] = CStringGetTextDatum("pending");
		values[6] = Int32GetDatum(0);
		values[7] = TimestampTzGetDatum(now);
		values[8] = TimestampTzGetDatum(now);
		payidem_insert(payout_insert, values, nulls);
	}
	payidem_end_as_owner(&as_owner);
}

PG_FUNCTION_INFO_V1(payidem_status_event);

Datum
payidem_status_event(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	tuple;
	bool		is_refund;
	const char *event;
	/* the order, as the event reports it */
	Relation	order_rel;
	HeapTuple	order;
	char	   *o_order_no,
			   *o_merchant_no,
			   *o_status,
			   *o_refunded_amount = NULL;
	/* the payment, if any */
	char	   *p_payment_no = NULL,
			   *p_transaction_id = NULL;
	bool		have_paid_at = false;
	TimestampTz p_paid_at = 0;
	/* the refund, for refund.succeeded */
	char	   *r_refund_no = NULL,
			   *r_amount = NULL;
	Datum		payment_key = (Datum) 0;
	bool		payment_key_null = true;
	int64		event_id;
	StringInfoData payload;
	PayidemAsOwner as_owner;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem._status_event() must be an AFTER UPDATE ... FOR EACH ROW trigger")));
	rel = trigdata->tg_relation;
	tuple = trigdata->tg_newtuple;
	if (strcmp(RelationGetRelationName(rel), "payout") == 0)
	{
		payout_event(rel, trigdata->tg_trigtuple, tuple);
		return PointerGetDatum(NULL);
	}
	is_refund = strcmp(RelationGetRelationName(rel), "refund") == 0;
	if (!reported(rel, is_refund, trigdata->tg_trigtuple, tuple))
		return PointerGetDatum(NULL);

	/*
	 * As the tables' owner: the event is written whoever changed the row
	 * (application roles have no right on notify_event).  Every look-up
	 * below is by key and the insert is direct: no SQL, so no search_path
	 * matters.  The look-ups see what this statement wrote.
	 */
	payidem_begin_as_owner(rel->rd_rel->relowner, &as_owner);
	if (is_refund)
	{
		bool		isnull;
		Datum		order_no = payidem_getattr(rel, tuple, "order_no", &isnull);

		r_refund_no = tuple_col(rel, tuple, "refund_no");
		r_amount = tuple_col(rel, tuple, "amount");
		/* at the end of the statement: the order with this refund counted */
		order_rel = table_open(payidem_relation(PAYIDEM_ORDER), AccessShareLock);
		order = isnull ? NULL :
			payidem_fetch_unique(order_rel, PAYIDEM_ORDER_PKEY, 1, &order_no, GetActiveSnapshot());
		if (order != NULL)
			(void) payidem_getattr(order_rel, order, "notify_url", &isnull);
		if (order == NULL || isnull)
		{
			table_close(order_rel, NoLock);
			payidem_end_as_owner(&as_owner);
			return PointerGetDatum(NULL);
		}
		o_refunded_amount = tuple_col(order_rel, order, "refunded_amount");
		payment_key = payidem_getattr(rel, tuple, "payment_no", &payment_key_null);
		event = "refund.succeeded";
	}
	else
	{
		order_rel = rel;
		order = tuple;
		if (tuple_text_in(rel, tuple, "status", (const char *const[]) {"paid", NULL}))
		{
			payment_key = payidem_getattr(rel, tuple, "paid_payment_no", &payment_key_null);
			event = "order.paid";
		}
		else
			event = "order.closed";
	}
	o_order_no = tuple_col(order_rel, order, "order_no");
	o_merchant_no = tuple_col(order_rel, order, "merchant_no");
	o_status = tuple_col(order_rel, order, "status");
	if (!payment_key_null)
	{
		Relation	payment_rel = table_open(payidem_relation(PAYIDEM_PAYMENT), AccessShareLock);
		HeapTuple	payment = payidem_fetch_unique(payment_rel, PAYIDEM_PAYMENT_PKEY, 1, &payment_key,
												   GetActiveSnapshot());

		if (payment != NULL)
		{
			bool		isnull;
			Datum		d = payidem_getattr(payment_rel, payment, "paid_at", &isnull);

			p_payment_no = tuple_col(payment_rel, payment, "payment_no");
			p_transaction_id = tuple_col(payment_rel, payment, "transaction_id");
			if (!isnull)
			{
				have_paid_at = true;
				p_paid_at = DatumGetTimestampTz(d);
			}
		}
		table_close(payment_rel, NoLock);
	}

	/* from the order-number generator: never reused, failovers included */
	event_id = order_no_next_event_id();

	initStringInfo(&payload);
	appendStringInfo(&payload, "{\"event_id\":" INT64_FORMAT, event_id);
	add_string(&payload, "event", event);
	add_utc(&payload, "created_at", GetCurrentTransactionStartTimestamp());
	add_string(&payload, "merchant_no", o_merchant_no);
	add_string(&payload, "order_no", o_order_no);
	add_string(&payload, "out_trade_no", tuple_col(order_rel, order, "out_trade_no"));
	add_number(&payload, "amount", tuple_col(order_rel, order, "amount"));
	add_string(&payload, "currency", tuple_col(order_rel, order, "currency"));
	add_string(&payload, "status", o_status);
	if (p_payment_no != NULL)
		add_string(&payload, "payment_no", p_payment_no);
	if (p_transaction_id != NULL)
		add_string(&payload, "transaction_id", p_transaction_id);
	if (have_paid_at)
		add_utc(&payload, "paid_at", p_paid_at);
	if (r_refund_no != NULL)
	{
		add_string(&payload, "refund_no", r_refund_no);
		add_number(&payload, "refund_amount", r_amount);
		add_number(&payload, "refunded_amount", o_refunded_amount);
	}
	appendStringInfoChar(&payload, '}');

	{
		static const char *const columns[] = {
			"event_id", "event", "order_no", "merchant_no", "refund_no", "payload",
			"status", "attempts", "next_attempt_at", "created_at"
		};
		static const Oid types[] = {
			INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID
		};
		static PayidemInsert *event_insert = NULL;
		Datum		values[lengthof(columns)];
		bool		nulls[lengthof(columns)] = {false, false, false, false, r_refund_no == NULL,
		false, false, false, false, false};
		TimestampTz now = GetCurrentTransactionStartTimestamp();

		if (event_insert == NULL)
			event_insert = payidem_insert_define(PAYIDEM_NOTIFY_EVENT, lengthof(columns), columns, types);
		values[0] = Int64GetDatum(event_id);
		values[1] = CStringGetTextDatum(event);
		values[2] = CStringGetTextDatum(o_order_no);
		values[3] = CStringGetTextDatum(o_merchant_no);
		values[4] = r_refund_no ? CStringGetTextDatum(r_refund_no) : (Datum) 0;
		values[5] = PointerGetDatum(cstring_to_text_with_len(payload.data, payload.len));
		values[6] = CStringGetTextDatum("pending");
		values[7] = Int32GetDatum(0);
		values[8] = TimestampTzGetDatum(now);
		values[9] = TimestampTzGetDatum(now);
		payidem_insert(event_insert, values, nulls);
	}
	if (order_rel != rel)
		table_close(order_rel, NoLock);
	payidem_end_as_owner(&as_owner);
	return PointerGetDatum(NULL);
}
