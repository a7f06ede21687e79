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
 *     refund.succeeded (with the order as the statement left it).  The
 *     payload is the JSON text the merchant receives, byte for byte what
 *     the signature covers: its keys in a fixed order, those that do not
 *     apply to the event (the payment's, when there is none) left out.  The trigger's WHEN clause (in SQL) says which
 *     changes are reported; this decides only what the event says.
 *
 *   payidem._utc(timestamptz) — 2026-11-30T07:33:36.463208Z.
 *
 * The trigger is SECURITY DEFINER (the event is written whoever changed
 * the row), with its own search_path, and reads and writes through three
 * saved plans whose names and operators are all schema-qualified.  The plans are kept for the session (SPI_keepplan); PostgreSQL
 * re-plans them when a table they use changes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "payidem.h"

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

	if (TIMESTAMP_NOT_FINITE(t))
		return false;
	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	/* to_char's YYYY: the year without its era, at least four digits */
	appendStringInfo(buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
					 tm.tm_year <= 0 ? -(tm.tm_year - 1) : tm.tm_year,
					 tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
					 (int) fsec);
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

/* the saved plans */
static SPIPlanPtr payment_plan = NULL;
static SPIPlanPtr order_plan = NULL;
static SPIPlanPtr insert_plan = NULL;

/* the columns the two look-ups return, in this order */
enum
{
	P_PAYMENT_NO, P_TRANSACTION_ID, P_PAID_AT
};
enum
{
	O_ORDER_NO, O_MERCHANT_NO, O_OUT_TRADE_NO, O_AMOUNT, O_CURRENCY, O_STATUS,
	O_NOTIFY_URL, O_REFUNDED_AMOUNT
};
#define O_NCOLS 8

/* one row by its key through plan, or false; read-write, so it sees what this statement wrote */
static bool
fetch_one(SPIPlanPtr plan, Datum key)
{
	Datum		args[1] = {key};
	int			rc = SPI_execute_plan(plan, args, NULL, false, 1);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "payidem: event look-up failed: %s", SPI_result_code_string(rc));
	return SPI_processed == 1;
}

/* a column of the current SPI result's row as a C string, or NULL */
static char *
spi_col(int col)
{
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col + 1);
}

/* a column of a trigger tuple by name, as text, or NULL */
static char *
tuple_col(Relation rel, HeapTuple tuple, const char *name)
{
	int			attnum = SPI_fnumber(RelationGetDescr(rel), name);

	if (attnum <= 0)
		elog(ERROR, "payidem: column %s of %s is missing", name, RelationGetRelationName(rel));
	return SPI_getvalue(tuple, RelationGetDescr(rel), attnum);
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

/* ,"name":"<UTC text>"; nothing for an infinite time */
static void
add_utc(StringInfo buf, const char *name, TimestampTz t)
{
	StringInfoData v;

	initStringInfo(&v);
	if (!append_utc(&v, t))
		return;
	add_string(buf, name, v.data);
	pfree(v.data);
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
	char	   *o[O_NCOLS];
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
	Oid			text1[1] = {TEXTOID};

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		elog(ERROR, "payidem._status_event() must be an AFTER UPDATE ... FOR EACH ROW trigger");
	rel = trigdata->tg_relation;
	tuple = trigdata->tg_newtuple;
	is_refund = strcmp(RelationGetRelationName(rel), "refund") == 0;

	SPI_connect();
	if (is_refund)
	{
		Datum		order_no;
		bool		isnull;
		int			i;

		r_refund_no = tuple_col(rel, tuple, "refund_no");
		r_amount = tuple_col(rel, tuple, "amount");
		order_no = SPI_getbinval(tuple, RelationGetDescr(rel),
								 SPI_fnumber(RelationGetDescr(rel), "order_no"), &isnull);
		/* at the end of the statement: the order with this refund counted */
		payidem_saved_plan(&order_plan,
				  "SELECT order_no::pg_catalog.text, merchant_no, out_trade_no::pg_catalog.text,"
				  " amount::pg_catalog.int8, currency::pg_catalog.text, status, notify_url::pg_catalog.text,"
				  " refunded_amount FROM payidem.\"order\""
				  " WHERE order_no OPERATOR(pg_catalog.=) $1",
				  1, text1);
		if (isnull || !fetch_one(order_plan, order_no))
		{
			SPI_finish();
			return PointerGetDatum(NULL);
		}
		for (i = 0; i < O_NCOLS; i++)
			o[i] = spi_col(i);
		if (o[O_NOTIFY_URL] == NULL)
		{
			SPI_finish();
			return PointerGetDatum(NULL);
		}
		payment_key = SPI_getbinval(tuple, RelationGetDescr(rel),
									SPI_fnumber(RelationGetDescr(rel), "payment_no"), &payment_key_null);
		event = "refund.succeeded";
	}
	else
	{
		o[O_ORDER_NO] = tuple_col(rel, tuple, "order_no");
		o[O_MERCHANT_NO] = tuple_col(rel, tuple, "merchant_no");
		o[O_OUT_TRADE_NO] = tuple_col(rel, tuple, "out_trade_no");
		o[O_AMOUNT] = tuple_col(rel, tuple, "amount");
		o[O_CURRENCY] = tuple_col(rel, tuple, "currency");
		o[O_STATUS] = tuple_col(rel, tuple, "status");
		o[O_NOTIFY_URL] = NULL;
		o[O_REFUNDED_AMOUNT] = NULL;
		if (o[O_STATUS] != NULL && strcmp(o[O_STATUS], "paid") == 0)
		{
			payment_key = SPI_getbinval(tuple, RelationGetDescr(rel),
										SPI_fnumber(RelationGetDescr(rel), "paid_payment_no"),
										&payment_key_null);
			event = "order.paid";
		}
		else
			event = "order.closed";
	}
	if (!payment_key_null)
	{
		payidem_saved_plan(&payment_plan,
				  "SELECT payment_no::pg_catalog.text, transaction_id::pg_catalog.text, paid_at"
				  " FROM payidem.payment WHERE payment_no OPERATOR(pg_catalog.=) $1",
				  1, text1);
		if (fetch_one(payment_plan, payment_key))
		{
			bool		isnull;
			Datum		d;

			p_payment_no = spi_col(P_PAYMENT_NO);
			p_transaction_id = spi_col(P_TRANSACTION_ID);
			d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, P_PAID_AT + 1, &isnull);
			if (!isnull)
			{
				have_paid_at = true;
				p_paid_at = DatumGetTimestampTz(d);
			}
		}
	}

	/* the shard's two digits last, as in every number payidem makes */
	if (pg_mul_s64_overflow(nextval_internal(payidem_relid("notify_event_seq"), true), 100, &event_id) ||
		pg_add_s64_overflow(event_id, payidem_shard_id, &event_id))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range"),
				 errdetail("The next notification event id of shard %d is past the largest bigint.",
						   payidem_shard_id)));

	initStringInfo(&payload);
	appendStringInfo(&payload, "{\"event_id\":" INT64_FORMAT, event_id);
	add_string(&payload, "event", event);
	add_utc(&payload, "created_at", GetCurrentTransactionStartTimestamp());
	add_string(&payload, "merchant_no", o[O_MERCHANT_NO]);
	add_string(&payload, "order_no", o[O_ORDER_NO]);
	add_string(&payload, "out_trade_no", o[O_OUT_TRADE_NO]);
	add_number(&payload, "amount", o[O_AMOUNT]);
	add_string(&payload, "currency", o[O_CURRENCY]);
	add_string(&payload, "status", o[O_STATUS]);
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
		add_number(&payload, "refunded_amount", o[O_REFUNDED_AMOUNT]);
	}
	appendStringInfoChar(&payload, '}');

	{
		Oid			types[6] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID};
		Datum		args[6];
		char		nulls[6] = {' ', ' ', ' ', ' ', r_refund_no ? ' ' : 'n', ' '};
		int			rc;

		payidem_saved_plan(&insert_plan,
				  "INSERT INTO payidem.notify_event (event_id, event, order_no, merchant_no, refund_no, payload,"
				  " status, attempts, next_attempt_at, created_at)"
				  " VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, pg_catalog.now(), pg_catalog.now())",
				  6, types);
		args[0] = Int64GetDatum(event_id);
		args[1] = CStringGetTextDatum(event);
		args[2] = CStringGetTextDatum(o[O_ORDER_NO]);
		args[3] = CStringGetTextDatum(o[O_MERCHANT_NO]);
		args[4] = r_refund_no ? CStringGetTextDatum(r_refund_no) : (Datum) 0;
		args[5] = PointerGetDatum(cstring_to_text_with_len(payload.data, payload.len));
		rc = SPI_execute_plan(insert_plan, args, nulls, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "payidem: writing the event failed: %s", SPI_result_code_string(rc));
	}
	SPI_finish();
	return PointerGetDatum(NULL);
}
