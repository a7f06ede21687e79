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
 *   payidem._sign_notification(merchant_no, payload) — the signature header
 *     of a payload, signed now: t=<unix seconds>, then ,v1=<hex>,v2=<hex>
 *     for each secret of the merchant valid now, the newest first (two
 *     pairs during a rotation's grace period, none for a closed merchant).
 *     Which secrets are valid now is _secrets_valid_now()'s decision and
 *     the data that binds a sealed secret to its row _secret_aad()'s (one
 *     statement, prepared once per session); the MACs are crypto.c's,
 *     each secret opened once for both.  The only place a notification is
 *     signed.
 *
 *   payidem.notify_due(max_rows) and payidem.notify_result(event_id, ok,
 *     response, attempt) — the hand-out of due events and the report of
 *     an attempt, with the retry schedule both follow: the one place it is
 *     decided what becomes of an event after it was written.
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
#include "access/nbtree.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "catalog.h"
#include "crypto.h"
#include "direct.h"
#include "inval.h"
#include "errcodes.h"
#include "order_no.h"
#include "shmem.h"
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
	status = payidem_getattr_text(rel, new, "status");
	event = strcmp(status, "succeeded") == 0 ? "payout.succeeded" : "payout.failed";
	event_id = order_no_next_event_id();

	initStringInfo(&payload);
	appendStringInfo(&payload, "{\"event_id\":" INT64_FORMAT, event_id);
	add_string(&payload, "event", event);
	add_utc(&payload, "created_at", GetCurrentTransactionStartTimestamp());
	add_string(&payload, "merchant_no", payidem_getattr_text(rel, new, "merchant_no"));
	add_string(&payload, "payout_no", payidem_getattr_text(rel, new, "payout_no"));
	add_string(&payload, "out_payout_no", payidem_getattr_text(rel, new, "out_payout_no"));
	add_number(&payload, "amount", payidem_getattr_text(rel, new, "amount"));
	add_string(&payload, "currency", payidem_getattr_text(rel, new, "currency"));
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
		values[3] = CStringGetTextDatum(payidem_getattr_text(rel, new, "payout_no"));
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
	PayidemRow	order_row;
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

		r_refund_no = payidem_getattr_text(rel, tuple, "refund_no");
		r_amount = payidem_getattr_text(rel, tuple, "amount");
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
		o_refunded_amount = payidem_getattr_text(order_rel, order, "refunded_amount");
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
	payidem_row_deform(&order_row, order_rel, order);
	o_order_no = payidem_row_text(&order_row, "order_no");
	o_merchant_no = payidem_row_text(&order_row, "merchant_no");
	o_status = payidem_row_text(&order_row, "status");
	if (!payment_key_null)
	{
		Relation	payment_rel = table_open(payidem_relation(PAYIDEM_PAYMENT), AccessShareLock);
		HeapTuple	payment = payidem_fetch_unique(payment_rel, PAYIDEM_PAYMENT_PKEY, 1, &payment_key,
												   GetActiveSnapshot());

		if (payment != NULL)
		{
			PayidemRow	payment_row;
			bool		isnull;
			Datum		d;

			payidem_row_deform(&payment_row, payment_rel, payment);
			d = payidem_row_get(&payment_row, "paid_at", &isnull);
			p_payment_no = payidem_row_text(&payment_row, "payment_no");
			p_transaction_id = payidem_row_text(&payment_row, "transaction_id");
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
	add_string(&payload, "out_trade_no", payidem_row_text(&order_row, "out_trade_no"));
	add_number(&payload, "amount", payidem_row_text(&order_row, "amount"));
	add_string(&payload, "currency", payidem_row_text(&order_row, "currency"));
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

/*
 * The API secrets of merchant merchant_no (text) valid now, as snapshot sees
 * them, the newest (highest secret_version) first: none if the merchant is
 * unknown or closed; else each with valid_from at or before now() (the
 * transaction's start) and no valid_until or one after it -- the current
 * secret and, within its grace window, the one it replaced.  The one place
 * this is decided: what a notification is signed with (sign_now()) and what
 * verify_signature() accepts (_secrets_valid_now()).  Copies of the
 * merchant_secret rows (of the table's row type), read by key without SQL,
 * as the tables' owner reads them.
 */
static List *
secrets_valid_now(Relation secret_rel, Datum merchant_no, Snapshot snapshot)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Relation	mrel = table_open(payidem_relation(PAYIDEM_MERCHANT), AccessShareLock);
	HeapTuple	merchant = payidem_fetch_unique(mrel, PAYIDEM_MERCHANT_PKEY, 1, &merchant_no, snapshot);
	List	   *valid = NIL;
	ListCell   *lc;
	bool		isnull;

	if (merchant != NULL)
	{
		Datum		status = payidem_getattr(mrel, merchant, "status", &isnull);

		if (!isnull && !payidem_text_is(status, "closed"))
		{
			foreach(lc, payidem_fetch_all_by_prefix(secret_rel, PAYIDEM_MERCHANT_SECRET_PKEY, 1, &merchant_no,
													snapshot, true))
			{
				HeapTuple	secret = (HeapTuple) lfirst(lc);
				Datum		from = payidem_getattr(secret_rel, secret, "valid_from", &isnull);
				bool		until_null;
				Datum		until;

				if (isnull || DatumGetTimestampTz(from) > now)
					continue;
				until = payidem_getattr(secret_rel, secret, "valid_until", &until_null);
				if (until_null || DatumGetTimestampTz(until) > now)
					valid = lappend(valid, secret);
			}
		}
	}
	table_close(mrel, NoLock);
	return valid;
}

/*
 * No row-level security applying to the current role on merchant or
 * merchant_secret, which secrets_valid_now() reads by key: only a statement
 * could apply it (0A000).
 */
static void
refuse_secrets_under_rls(void)
{
	PayidemRelation tables[2] = {PAYIDEM_MERCHANT, PAYIDEM_MERCHANT_SECRET};
	int			i;

	for (i = 0; i < 2; i++)
	{
		Oid			relid = payidem_relation(tables[i]);

		if (check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("the secrets valid now are not read under row-level security on payidem.%s",
							get_rel_name(relid)),
					 errhint("Read them as the owner of payidem's tables, as payidem's own functions do.")));
	}
}

/*
 * The caller's right to read what secrets_valid_now() reads, as the SQL
 * function it was needed it: SELECT on merchant's merchant_no and status and
 * on every column of merchant_secret (granted on the table or on those
 * columns), 42501 as a statement says it; and no row-level security applying
 * to the caller on either (refuse_secrets_under_rls()).
 */
static void
require_secrets_readable(void)
{
	static const char *const merchant_columns[] = {"merchant_no", "status"};
	PayidemRelation tables[2] = {PAYIDEM_MERCHANT, PAYIDEM_MERCHANT_SECRET};
	Oid			user = GetUserId();
	int			i;

	for (i = 0; i < 2; i++)
	{
		Oid			relid = payidem_relation(tables[i]);
		bool		ok = pg_class_aclcheck(relid, user, ACL_SELECT) == ACLCHECK_OK;

		if (!ok && tables[i] == PAYIDEM_MERCHANT_SECRET)
			ok = pg_attribute_aclcheck_all(relid, user, ACL_SELECT, ACLMASK_ALL) == ACLCHECK_OK;
		else if (!ok)
		{
			Relation	rel = table_open(relid, AccessShareLock);
			int			c;

			ok = true;
			for (c = 0; ok && c < lengthof(merchant_columns); c++)
				ok = pg_attribute_aclcheck(relid, payidem_column(rel, merchant_columns[c]), user,
										   ACL_SELECT) == ACLCHECK_OK;
			table_close(rel, AccessShareLock);
		}
		if (!ok)
			aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_TABLE, get_rel_name(relid));
	}
	refuse_secrets_under_rls();
}

/*
 * payidem._secrets_valid_now(p_merchant_no text) RETURNS SETOF
 *		payidem.merchant_secret (STABLE): secrets_valid_now(), newest first,
 *		with the snapshot of the calling statement, with the caller's right
 *		to read them (require_secrets_readable()).
 */
PG_FUNCTION_INFO_V1(payidem_secrets_valid_now);
Datum
payidem_secrets_valid_now(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	rel;
	TupleDesc	desc;
	MemoryContext oldcxt;
	ListCell   *lc;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) || !(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	require_secrets_readable();
	rel = table_open(payidem_relation(PAYIDEM_MERCHANT_SECRET), AccessShareLock);
	desc = RelationGetDescr(rel);
	oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setDesc = CreateTupleDescCopy(desc);
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(oldcxt);
	if (!PG_ARGISNULL(0))
	{
		Datum	   *values = palloc(sizeof(Datum) * desc->natts);
		bool	   *nulls = palloc(sizeof(bool) * desc->natts);

		foreach(lc, secrets_valid_now(rel, PG_GETARG_DATUM(0), GetActiveSnapshot()))
		{
			/* (deformed with the table's own descriptor: a column added since has its default) */
			heap_deform_tuple((HeapTuple) lfirst(lc), desc, values, nulls);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	table_close(rel, NoLock);
	return (Datum) 0;
}

/*
 * The signature header of payload (text) for merchant_no (text), signed at
 * now (transaction start): "t=<t>" and, per secret valid now, the newest
 * first, ",v1=<hex>,v2=<hex>", where v1 is HMAC-SHA256(secret,
 * "<t>.<payload>") and v2 the same message under the label
 * "payidem-notification-v2" NUL (crypto.c); t is now in whole Unix seconds,
 * rounded down.  *nsecrets says how many secrets signed (0: none is valid
 * now, or the merchant is closed; the header is then no signature).  The
 * secrets are those secrets_valid_now() gives, with the active snapshot; the
 * result is in the current memory context.
 */
static text *
sign_now(Datum merchant_no, bool merchant_null, text *payload, TimestampTz now, uint64 *nsecrets)
{
	MemoryContext cxt = CurrentMemoryContext;
	MemoryContext old;
	int64		t;
	StringInfoData msg;
	StringInfoData sig;
	char		v1[PAYIDEM_MAC_HEX_LEN + 1];
	char		v2[PAYIDEM_MAC_HEX_LEN + 1];
	text	   *result;

	t = now / USECS_PER_SEC - (now % USECS_PER_SEC < 0 ? 1 : 0) +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
	initStringInfo(&sig);
	appendStringInfo(&sig, "t=" INT64_FORMAT, t);
	initStringInfo(&msg);
	appendStringInfo(&msg, INT64_FORMAT ".", t);
	appendBinaryStringInfo(&msg, VARDATA_ANY(payload), VARSIZE_ANY_EXHDR(payload));

	/* which secrets: secrets_valid_now()'s decision; their associated data: payidem_secret_aad()'s */
	*nsecrets = 0;
	if (!merchant_null)
	{
		Relation	rel = table_open(payidem_relation(PAYIDEM_MERCHANT_SECRET), AccessShareLock);
		ListCell   *lc;

		foreach(lc, secrets_valid_now(rel, merchant_no, GetActiveSnapshot()))
		{
			HeapTuple	secret = (HeapTuple) lfirst(lc);
			static const char *const parts[4] = {"key_version", "nonce", "ciphertext", "auth_tag"};
			Datum		v[4];
			bool		isnull;
			int			k;

			for (k = 0; k < 4; k++)
			{
				v[k] = payidem_getattr(rel, secret, parts[k], &isnull);
				if (isnull)		/* (every part is NOT NULL) */
					elog(ERROR, "payidem: a sealed secret of merchant %s has a NULL part",
						 TextDatumGetCString(merchant_no));
			}
			payidem_notification_macs(payidem_secret_aad(DatumGetTextPP(merchant_no),
														 DatumGetInt32(payidem_getattr(rel, secret, "secret_version",
																					   &isnull))),
									  DatumGetInt32(v[0]), DatumGetByteaPP(v[1]), DatumGetByteaPP(v[2]),
									  DatumGetByteaPP(v[3]), msg.data, msg.len, v1, v2);
			appendStringInfo(&sig, ",v1=%s,v2=%s", v1, v2);
			(*nsecrets)++;
		}
		table_close(rel, NoLock);
	}
	explicit_bzero(v1, sizeof(v1));
	explicit_bzero(v2, sizeof(v2));
	pfree(msg.data);
	old = MemoryContextSwitchTo(cxt);
	result = cstring_to_text_with_len(sig.data, sig.len);
	MemoryContextSwitchTo(old);
	pfree(sig.data);
	return result;
}

/*
 * payidem._sign_notification(merchant_no text, payload text) RETURNS text
 *		The signature header of a payload, signed now (sign_now()).  Not
 *		SECURITY DEFINER: it reads the secrets as its caller, with the
 *		rights the statement it read them by needed: EXECUTE on
 *		_secrets_valid_now() and _secret_aad(), and the former's own
 *		(require_secrets_readable()).
 */
PG_FUNCTION_INFO_V1(payidem_sign_notification);
Datum
payidem_sign_notification(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	MemoryContext old;
	text	   *sig;
	uint64		n;
	static const char *const functions[2] = {"_secrets_valid_now", "_secret_aad"};
	Oid			argtypes[2] = {TEXTOID, INT4OID};
	int			i;

	for (i = 0; i < 2; i++)
	{
		Oid			fn = LookupFuncName(list_make2(makeString("payidem"), makeString((char *) functions[i])),
										i + 1, argtypes, false);
		AclResult	acl = ProcAclCheckCompat(fn, GetUserId(), ACL_EXECUTE);

		if (acl != ACLCHECK_OK)
			aclcheck_error(acl, OBJECT_FUNCTION, functions[i]);
	}
	require_secrets_readable();

	/*
	 * (as the PL/pgSQL function it was: no merchant has no secret, "t=<t>";
	 * a NULL payload has no MAC, and a header with one NULL)
	 */
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	old = MemoryContextSwitchTo(cxt);
	sig = sign_now(PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0), PG_ARGISNULL(0),
				   PG_ARGISNULL(1) ? cstring_to_text("") : PG_GETARG_TEXT_PP(1),
				   GetCurrentTransactionStartTimestamp(), &n);
	MemoryContextSwitchTo(old);
	SPI_finish();
	if (PG_ARGISNULL(1) && n > 0)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(sig);
}

/*
 * The retry schedule of a notification (docs/notifications.md): the wait
 * after the n-th failed attempt, n = 1 .. 15; after the 16th there is no
 * other: the event is given up (failed).  notify_result() waits so long
 * after a failure it is told of (report_decide()), and notify_due() gives up
 * an event whose last attempt it handed out went unanswered: the one place
 * either is decided.
 */
static const int notify_waits[] = {
	15, 15, 30, 3 * 60, 10 * 60, 20 * 60, 30 * 60, 30 * 60, 30 * 60, 60 * 60,
	3 * 3600, 3 * 3600, 3 * 3600, 6 * 3600, 6 * 3600
};

#define NOTIFY_MAX_ATTEMPTS ((int) lengthof(notify_waits) + 1)

/* how long a hand-out leases its event, and an unsignable one waits */
#define NOTIFY_LEASE_SECONDS 60
#define NOTIFY_UNSIGNED_WAIT_SECONDS (5 * 60)

/* one update of an event by notify_due(), every value it writes decided */
static void
notify_update(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *values)
{
	int			rc;

	payidem_saved_plan(plan, sql, nargs, types);
	rc = SPI_execute_plan(*plan, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "payidem: an update of a notification event failed: %s", SPI_result_code_string(rc));
}

#define NOTIFY_GIVE_UP_SQL \
	"UPDATE payidem.notify_event e SET status = 'failed', next_attempt_at = NULL," \
	" last_response = $2 WHERE e.event_id OPERATOR(pg_catalog.=) $1"

/* whether merchant merchant_no (text) is closed */
static bool
merchant_closed(Datum merchant_no)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	bool		isnull;
	bool		closed;

	payidem_saved_plan(&plan,
					   "SELECT m.status OPERATOR(pg_catalog.=) 'closed' FROM payidem.merchant m"
					   " WHERE m.merchant_no OPERATOR(pg_catalog.=) $1", 1, types);
	if (SPI_execute_plan(plan, &merchant_no, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "payidem: the read of a merchant failed");
	closed = SPI_processed > 0 &&
		DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) && !isnull;
	SPI_freetuptable(SPI_tuptable);
	return closed;
}

/* what became of a due event notify_due() took */
typedef enum DueOutcome
{
	DUE_GIVEN_UP,				/* failed, no place in the batch */
	DUE_WAITS,					/* unsignable: due again in 5 minutes */
	DUE_HANDED_OUT				/* leased, a row of the result */
} DueOutcome;

/* the head of the due events, as the look-up locked it */
typedef struct DueEvent
{
	Datum		event_id;
	Datum		order_no;		/* text, or none */
	bool		order_no_null;
	Datum		merchant_no;
	Datum		event;
	Datum		payload;
	int32		attempts;
	ItemPointerData tid;
} DueEvent;

/*
 * One due event, locked by the look-up (due_head()), read with a new
 * snapshot: decided and written; a hand-out is put into rsinfo's result.
 */
static DueOutcome
take_due_event(const DueEvent *due, TimestampTz now, ReturnSetInfo *rsinfo)
{
	static SPIPlanPtr give_up_plan = NULL;
	static SPIPlanPtr wait_plan = NULL;
	static SPIPlanPtr lease_plan = NULL;
	Datum		event_id;
	Datum		order_no;
	Datum		merchant_no;
	Datum		payload;
	int32		attempts;
	bool		order_no_null;
	text	   *signature;
	uint64		nsecrets;
	Datum		values[8];
	bool		nulls[8] = {false, false, false, false, false, false, false, false};
	HeapTuple	address = NULL;

	event_id = due->event_id;
	order_no = due->order_no;
	order_no_null = due->order_no_null;
	merchant_no = due->merchant_no;
	payload = due->payload;
	attempts = due->attempts;

	if (attempts >= NOTIFY_MAX_ATTEMPTS)
	{
		/* its last attempt went unanswered: given up */
		Oid			types[2] = {INT8OID, TEXTOID};
		Datum		args[2];

		args[0] = event_id;
		args[1] = CStringGetTextDatum(merchant_closed(merchant_no) ? "merchant closed"
									  : "no answer to the last attempt");
		notify_update(&give_up_plan, NOTIFY_GIVE_UP_SQL, 2, types, args);
		pfree(DatumGetPointer(args[1]));
		return DUE_GIVEN_UP;
	}

	signature = sign_now(merchant_no, false, DatumGetTextPP(payload), now, &nsecrets);
	if (nsecrets == 0)
	{
		/* nothing signs it: no attempt, never sent unsigned */
		Oid			types[3] = {INT8OID, TEXTOID, TIMESTAMPTZOID};
		Datum		args[3];
		DueOutcome	outcome;

		pfree(signature);
		args[0] = event_id;
		if (merchant_closed(merchant_no))
		{
			args[1] = CStringGetTextDatum("merchant closed");
			notify_update(&give_up_plan, NOTIFY_GIVE_UP_SQL, 2, types, args);
			outcome = DUE_GIVEN_UP;
		}
		else
		{
			args[1] = CStringGetTextDatum("no valid API secret");
			args[2] = TimestampTzGetDatum(now + (int64) NOTIFY_UNSIGNED_WAIT_SECONDS * USECS_PER_SEC);
			notify_update(&wait_plan,
						  "UPDATE payidem.notify_event e SET next_attempt_at = $3, last_response = $2"
						  " WHERE e.event_id OPERATOR(pg_catalog.=) $1",
						  3, types, args);
			outcome = DUE_WAITS;
		}
		pfree(DatumGetPointer(args[1]));
		return outcome;
	}

	/*
	 * handed out: its next attempt, leased; a direct update of the row the
	 * look-up locked, or the same in SQL where the table has what a
	 * row-by-row update cannot reproduce (payidem_update())
	 */
	{
		static const char *const columns[] = {"next_attempt_at", "attempts", "last_attempt_at"};
		static const Oid types[] = {TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
		static const bool set[] = {true, true, true};
		static PayidemUpdate *lease = NULL;
		ItemPointerData tid = due->tid;
		Datum		args[3];
		bool		args_null[3] = {false, false, false};

		args[0] = TimestampTzGetDatum(now + (int64) NOTIFY_LEASE_SECONDS * USECS_PER_SEC);
		args[1] = Int32GetDatum(attempts + 1);
		args[2] = TimestampTzGetDatum(now);
		if (lease == NULL)
			lease = payidem_update_define(PAYIDEM_NOTIFY_EVENT, "event_id", lengthof(columns), columns);
		if (!payidem_update(lease, &tid, event_id, set, args, args_null, types, NULL, false))
		{
			Oid			sql_types[4] = {INT8OID, TIMESTAMPTZOID, INT4OID, TIMESTAMPTZOID};
			Datum		sql_args[4] = {event_id, args[0], args[1], args[2]};

			notify_update(&lease_plan,
						  "UPDATE payidem.notify_event e SET next_attempt_at = $2, attempts = $3,"
						  " last_attempt_at = $4 WHERE e.event_id OPERATOR(pg_catalog.=) $1",
						  4, sql_types, sql_args);
		}
	}

	/* its address: the order's notify_url, or the merchant's for a payout's */
	{
		Relation	rel = table_open(payidem_relation(order_no_null ? PAYIDEM_MERCHANT : PAYIDEM_ORDER),
									 AccessShareLock);

		address = payidem_fetch_unique(rel, order_no_null ? PAYIDEM_MERCHANT_PKEY : PAYIDEM_ORDER_PKEY,
									   1, order_no_null ? &merchant_no : &order_no, GetActiveSnapshot());
		if (address != NULL)
			values[3] = payidem_getattr(rel, address, "notify_url", &nulls[3]);
		else
			nulls[3] = true;
		table_close(rel, NoLock);
	}
	values[0] = event_id;
	values[1] = order_no;
	nulls[1] = order_no_null;
	values[2] = merchant_no;
	values[4] = due->event;
	values[5] = payload;
	values[6] = PointerGetDatum(signature);
	values[7] = Int32GetDatum(attempts + 1);
	/* (the tuplestore copies the row) */
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	pfree(signature);
	if (address != NULL)
		heap_freetuple(address);
	return DUE_HANDED_OUT;
}

/*
 * The head of the due events: what SELECT ... FROM payidem.notify_event
 * WHERE status = 'pending' AND next_attempt_at <= now ORDER BY
 * next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED would take, decided here
 * once -- the oldest due event (due_accept(), in next_attempt_at order) that
 * no other worker holds locked (payidem_lock_skip_locked(), which takes a
 * version changed meanwhile only if due_accept() still does) -- and read by
 * notify_event_due where it is the index this expects (due_index()), else
 * by a scan of the table (a DBA dropped or changed the index: every due
 * event read, then sorted).  With a new snapshot, as a statement's; acting
 * as the table's owner, which row-level security must not filter (refused:
 * only a statement could apply it).  True and *due, or false if none is due.
 */

/* the verdict on notify_event_due (InvalidOid: none yet, or stale) */
static Oid	due_index_checked = InvalidOid;
static bool due_index_ok = false;
static TransactionId due_index_xmin = InvalidTransactionId;	/* its indcheckxmin's */
static bool due_callback_registered = false;

/* the index checked, if this transaction's snapshots may read it */
static Oid
due_index_usable(Oid relid)
{
	if (!due_index_ok)
		return InvalidOid;
	if (TransactionIdIsValid(due_index_xmin) && !TransactionIdPrecedes(due_index_xmin, TransactionXmin))
		return InvalidOid;
	return relid;
}

static void
due_relcache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == due_index_checked)
		due_index_checked = InvalidOid;
}

/*
 * notify_event_due, if it is the index the look-up can read in the order of
 * the decision: a valid btree of notify_event on next_attempt_at alone,
 * ascending (timestamptz's own operators), with no predicate or exactly
 * status = 'pending' (a stricter one would hide due events), that this
 * transaction's snapshots may read; else InvalidOid.
 */
static Oid
due_index(Relation heap)
{
	Oid			relid = payidem_relids[PAYIDEM_NOTIFY_EVENT_DUE];
	Relation	irel;
	bool		ok;

	if (!OidIsValid(relid))
		relid = payidem_lookup_relation(PAYIDEM_NOTIFY_EVENT_DUE, true);
	if (!OidIsValid(relid))
		return InvalidOid;
	if (relid == due_index_checked)
		return due_index_usable(relid);
	if (!due_callback_registered)
	{
		payidem_register_relcache_callback(due_relcache_callback, (Datum) 0);
		due_callback_registered = true;
	}
	if (get_rel_relkind(relid) != RELKIND_INDEX)
	{
		/* (something else of that name: a scan reads the events) */
		due_index_checked = relid;
		due_index_ok = false;
		return InvalidOid;
	}
	irel = index_open(relid, AccessShareLock);
	ok = irel->rd_rel->relam == BTREE_AM_OID && irel->rd_index->indrelid == RelationGetRelid(heap) &&
		(irel->rd_indoption[0] & INDOPTION_DESC) == 0 &&
		irel->rd_index->indisvalid && irel->rd_index->indisready && irel->rd_index->indislive &&
		IndexRelationGetNumberOfKeyAttributes(irel) == 1 &&
		irel->rd_index->indkey.values[0] == payidem_attnum(RelationGetDescr(heap), "next_attempt_at") &&
		irel->rd_opcintype[0] == TIMESTAMPTZOID &&
		irel->rd_opfamily[0] == get_opclass_family(GetDefaultOpClass(TIMESTAMPTZOID, BTREE_AM_OID)) &&
		RelationGetIndexExpressions(irel) == NIL;
	if (ok)
	{
		List	   *pred = RelationGetIndexPredicate(irel);

		if (pred != NIL)
		{
			OpExpr	   *op = list_length(pred) == 1 && IsA(linitial(pred), OpExpr) ? linitial(pred) : NULL;
			Node	   *left = op != NULL && list_length(op->args) == 2 ? linitial(op->args) : NULL;
			Node	   *right = op != NULL && list_length(op->args) == 2 ? lsecond(op->args) : NULL;

			while (left != NULL && IsA(left, RelabelType))
				left = (Node *) ((RelabelType *) left)->arg;
			ok = op != NULL && op->opno == TextEqualOperator && left != NULL && IsA(left, Var) &&
				((Var *) left)->varattno == payidem_attnum(RelationGetDescr(heap), "status") &&
				right != NULL && IsA(right, Const) && !((Const *) right)->constisnull &&
				((Const *) right)->consttype == TEXTOID &&
				payidem_text_is(((Const *) right)->constvalue, "pending");
		}
	}
	/*
	 * (an index built while older transactions ran is not for their
	 * snapshots: the planner's rule, per call)
	 */
	due_index_xmin = irel->rd_index->indcheckxmin ? HeapTupleHeaderGetXmin(irel->rd_indextuple->t_data)
		: InvalidTransactionId;
	index_close(irel, NoLock);
	due_index_checked = relid;
	due_index_ok = ok;
	return due_index_usable(relid);
}

/* the decision, on a version of an event: pending, and due at *now */
static bool
due_accept(Relation rel, HeapTuple tuple, void *arg)
{
	TimestampTz now = *(TimestampTz *) arg;
	bool		isnull;
	Datum		d;

	d = payidem_getattr(rel, tuple, "status", &isnull);
	if (isnull || !payidem_text_is(d, "pending"))
		return false;
	d = payidem_getattr(rel, tuple, "next_attempt_at", &isnull);
	return !isnull && DatumGetTimestampTz(d) <= now;
}

/* the due events a scan found, to be tried in the decision's order */
typedef struct DueCandidate
{
	TimestampTz at;
	ItemPointerData tid;
} DueCandidate;

typedef struct DueScan
{
	TimestampTz now;
	DueCandidate *c;
	int			n;
	int			size;
} DueScan;

static void
due_collect(Relation rel, HeapTuple tuple, void *arg)
{
	DueScan    *scan = (DueScan *) arg;
	bool		isnull;

	if (!due_accept(rel, tuple, &scan->now))
		return;
	if (scan->n == scan->size)
	{
		scan->size = scan->size == 0 ? 64 : scan->size * 2;
		scan->c = scan->c == NULL ? palloc(sizeof(DueCandidate) * scan->size)
			: repalloc_huge(scan->c, sizeof(DueCandidate) * scan->size);
	}
	scan->c[scan->n].at = DatumGetTimestampTz(payidem_getattr(rel, tuple, "next_attempt_at", &isnull));
	scan->c[scan->n].tid = tuple->t_self;
	scan->n++;
}

/* next_attempt_at, then the row's place (an index's order for equal keys) */
static int
due_candidate_cmp(const void *a, const void *b)
{
	const DueCandidate *x = (const DueCandidate *) a;
	const DueCandidate *y = (const DueCandidate *) b;

	if (x->at != y->at)
		return x->at < y->at ? -1 : 1;
	return ItemPointerCompare((ItemPointer) &x->tid, (ItemPointer) &y->tid);
}

static bool
due_head(TimestampTz now, DueEvent *due)
{
	Relation	rel = table_open(payidem_relation(PAYIDEM_NOTIFY_EVENT), RowShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	Oid			irelid;
	bool		found = false;
	bool		isnull;

	/* (as the statement's executor refuses it) */
	PreventCommandIfReadOnly("SELECT FOR UPDATE");
	if (check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("notify_due() does not take events under row-level security on payidem.notify_event"),
				 errhint("It reads the outbox as the table's owner; ALTER TABLE payidem.notify_event NO FORCE ROW LEVEL SECURITY.")));
	irelid = due_index(rel);
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (OidIsValid(irelid))
	{
		Relation	irel = index_open(irelid, AccessShareLock);
		ScanKeyData skey;
		Oid			op = get_opfamily_member(irel->rd_opfamily[0], TIMESTAMPTZOID, TIMESTAMPTZOID,
											 BTLessEqualStrategyNumber);

		ScanKeyEntryInitialize(&skey, 0, 1, BTLessEqualStrategyNumber, InvalidOid, irel->rd_indcollation[0],
							   get_opcode(op), TimestampTzGetDatum(now));
		found = payidem_lock_first_skip_locked(rel, irel, &skey, 1, GetActiveSnapshot(), due_accept, &now, slot);
		index_close(irel, NoLock);
	}
	else
	{
		DueScan		scan = {now, NULL, 0, 0};
		int			i;

		payidem_scan(rel, due_collect, &scan);
		if (scan.n > 1)
			qsort(scan.c, scan.n, sizeof(DueCandidate), due_candidate_cmp);
		for (i = 0; !found && i < scan.n; i++)
		{
			CHECK_FOR_INTERRUPTS();
			found = payidem_lock_skip_locked(rel, &scan.c[i].tid, GetActiveSnapshot(), due_accept, &now, slot);
		}
		if (scan.c != NULL)
			pfree(scan.c);
	}
	PopActiveSnapshot();
	if (found)
	{
		HeapTuple	tuple = ExecCopySlotHeapTuple(slot);

		due->event_id = payidem_getattr(rel, tuple, "event_id", &isnull);
		due->order_no = payidem_getattr(rel, tuple, "order_no", &due->order_no_null);
		due->merchant_no = payidem_getattr(rel, tuple, "merchant_no", &isnull);
		due->event = payidem_getattr(rel, tuple, "event", &isnull);
		due->payload = payidem_getattr(rel, tuple, "payload", &isnull);
		due->attempts = DatumGetInt32(payidem_getattr(rel, tuple, "attempts", &isnull));
		due->tid = tuple->t_self;
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return found;
}

/*
 * payidem.notify_due(max_rows integer DEFAULT 100)
 *		RETURNS TABLE (event_id bigint, order_no text, merchant_no text,
 *					   notify_url text, event text, payload text,
 *					   signature text, attempt integer)
 *
 * Hands out up to max_rows due events, the oldest first, one at a time: each
 * step is one look-up at the head of notify_event_due (FOR UPDATE SKIP
 * LOCKED: the oldest due event no other worker holds), whatever the backlog
 * behind it; then, for that event (take_due_event()), read with a new
 * snapshot as the next statement would:
 *
 *   - its last attempt was handed out and went unanswered (the 16th): given
 *     up (failed, 'merchant closed' for a closed merchant's, else 'no answer
 *     to the last attempt'), not handed out;
 *   - nothing signs it (no secret of the merchant is valid now, or the
 *     merchant is closed): no attempt, and never sent unsigned — a closed
 *     merchant's is given up ('merchant closed') and takes no place in the
 *     batch, any other waits 5 minutes ('no valid API secret');
 *   - otherwise handed out: its next attempt (attempts counts hand-outs; the
 *     row's attempt names it, and notify_result() takes reports of that one
 *     only), leased for 60 s (next_attempt_at moves ahead: not handed out
 *     again until notify_result() or the lease runs out — a worker that
 *     died: that attempt had no answer), with the payload as it is, its
 *     signature, and its address: the order's notify_url, or the merchant's
 *     for a payout's event.
 *
 * An event taken is due no more in this call (leased, failed or waiting),
 * so the next step finds the next one.  Each statement is prepared once per
 * session, every name and operator qualified; every value it writes is
 * decided here.  It acts as the tables' owner, as a SECURITY DEFINER
 * function would, switching itself, with search_path pinned as such a
 * function's SET clause pins it (what a DBA's trigger or policy runs as the
 * owner resolves no name in the caller's schemas).  Each step has an SPI
 * connection of its own, and what it allocated goes with it: the memory of a
 * call does not grow with max_rows (the rows handed out are in the result's
 * tuplestore, which spills to disk past work_mem).
 */
/* notify_due()'s rows as its declaration says them (payidem_materialized_result()) */
static PayidemResultDesc due_desc;

PG_FUNCTION_INFO_V1(payidem_notify_due);
Datum
payidem_notify_due(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PayidemAsOwner as_owner;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int32		left;
	uint64		given_up = 0;
	int			guc_level;

	if (PG_ARGISNULL(0) || PG_GETARG_INT32(0) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid max_rows"),
				 errdetail("max_rows was %s; it must be positive.",
						   PG_ARGISNULL(0) ? "NULL" : psprintf("%d", PG_GETARG_INT32(0))),
				 errhint("Pass how many events one worker takes at a time, e.g. 100.")));
	left = PG_GETARG_INT32(0);
	payidem_materialized_result(fcinfo, &due_desc);

	payidem_become_owner(payidem_owner(PAYIDEM_NOTIFY_EVENT), 0, &as_owner);
	guc_level = payidem_pin_search_path();
	/* (what signs reads merchant and merchant_secret as their owner too) */
	refuse_secrets_under_rls();
	while (left > 0)
	{
		DueEvent	due;

		CHECK_FOR_INTERRUPTS();
		/* one SPI connection per event: what a step allocates goes with it */
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (!due_head(now, &due))
		{
			SPI_finish();
			break;
		}
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		switch (take_due_event(&due, now, rsinfo))
		{
			case DUE_GIVEN_UP:
				given_up++;
				break;
			case DUE_WAITS:
			case DUE_HANDED_OUT:
				left--;
				break;
		}
		PopActiveSnapshot();
		SPI_finish();
	}
	payidem_unpin_search_path(guc_level);
	payidem_become_caller(&as_owner);
	if (given_up > 0)
		payidem_count_n(PAYIDEM_NOTIFY_FAILED, given_up);
	return (Datum) 0;
}

/*
 * What a report of an attempt changes (notify_result()): nothing unless the
 * event is pending and was handed out (attempts > 0), at the attempt named
 * if one is (else the report is stale: its lease ran out and the event went
 * to another worker, or it was never handed out); then sent, or — a
 * failure — due again after the schedule's wait, or given up after the last
 * attempt, the start (256 characters) of the response kept.  values/nulls:
 * status, next_attempt_at, sent_at, last_response; set[] says which the
 * report writes.  The one place a report is decided.
 */
typedef struct NotifyReport
{
	bool		ok;
	bool		attempt_null;
	int32		attempt;
	Datum		response;		/* text, or none */
	bool		response_null;
} NotifyReport;

#define NOTIFY_REPORT_COLUMNS 4

static bool
report_applies(const NotifyReport *r, Datum status, int32 attempts)
{
	return payidem_text_is(status, "pending") && attempts > 0 &&
		(r->attempt_null || attempts == r->attempt);
}

static PayidemCounter
report_decide(const NotifyReport *r, int32 attempts, TimestampTz now,
			  bool *set, Datum *values, bool *nulls)
{
	bool		last = attempts > (int32) lengthof(notify_waits);

	memset(values, 0, sizeof(Datum) * NOTIFY_REPORT_COLUMNS);
	memset(nulls, 0, sizeof(bool) * NOTIFY_REPORT_COLUMNS);
	set[0] = set[1] = true;
	set[2] = r->ok;
	set[3] = !r->ok;
	if (r->ok)
	{
		values[0] = CStringGetTextDatum("sent");
		nulls[1] = true;
		values[2] = TimestampTzGetDatum(now);
		return PAYIDEM_NOTIFY_SENT;
	}
	values[0] = CStringGetTextDatum(last ? "failed" : "pending");
	if (last)
		nulls[1] = true;
	else
		values[1] = TimestampTzGetDatum(now + (int64) notify_waits[attempts - 1] * USECS_PER_SEC);
	if (r->response_null)
		nulls[3] = true;
	else
		values[3] = DirectFunctionCall2(text_left, r->response, Int32GetDatum(256));
	return last ? PAYIDEM_NOTIFY_FAILED : PAYIDEM_NOTIFY_RETRIED;
}

/*
 * The report through SQL, as the one UPDATE it replaces: the event as the
 * statement's snapshot sees it; if the report applies to that version, the
 * row locked FOR UPDATE (waiting for a transaction that holds it; under
 * REPEATABLE READ or SERIALIZABLE, 40001 if it changed since the snapshot)
 * and the report decided again on it, then an update by key with what
 * report_decide() decided.  For what the direct path does not take
 * (REPEATABLE READ and SERIALIZABLE, row security, rules, statement
 * triggers, BEFORE UPDATE row triggers); the same decision.  Returns false
 * if there is no such event.
 */
static bool
report_in_sql(Datum event_id, const NotifyReport *r, TimestampTz now, PayidemCounter *counter, bool *changed)
{
	static SPIPlanPtr look_plan = NULL;
	static SPIPlanPtr read_plan = NULL;
	static SPIPlanPtr sent_plan = NULL;
	static SPIPlanPtr failed_plan = NULL;
	Oid			read_types[1] = {INT8OID};
	Oid			types[4] = {INT8OID, TEXTOID, TIMESTAMPTZOID, InvalidOid};
	bool		set[NOTIFY_REPORT_COLUMNS];
	Datum		values[NOTIFY_REPORT_COLUMNS];
	bool		nulls[NOTIFY_REPORT_COLUMNS];
	Datum		args[4];
	char		args_null[4] = {' ', ' ', ' ', ' '};
	Datum		status;
	int32		attempts;
	bool		isnull;
	int			rc;

	payidem_saved_plan(&look_plan,
					   "SELECT x.status::pg_catalog.text, x.attempts::pg_catalog.int4 FROM payidem.notify_event x"
					   " WHERE x.event_id OPERATOR(pg_catalog.=) $1", 1, read_types);
	if (SPI_execute_plan(look_plan, &event_id, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "payidem: the read of a notification event failed");
	if (SPI_processed == 0)
		return false;
	status = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (!report_applies(r, status, attempts))
		return true;			/* nothing to report: no lock taken, as the UPDATE's */
	payidem_saved_plan(&read_plan,
					   "SELECT x.status::pg_catalog.text, x.attempts::pg_catalog.int4 FROM payidem.notify_event x"
					   " WHERE x.event_id OPERATOR(pg_catalog.=) $1 FOR UPDATE", 1, read_types);
	if (SPI_execute_plan(read_plan, &event_id, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "payidem: the read of a notification event failed");
	if (SPI_processed == 0)
		return true;			/* gone meanwhile: nothing to report */
	status = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (!report_applies(r, status, attempts))
		return true;
	*counter = report_decide(r, attempts, now, set, values, nulls);
	args[0] = event_id;
	args[1] = values[0];
	args[2] = values[1];
	args_null[2] = nulls[1] ? 'n' : ' ';
	if (r->ok)
	{
		types[3] = TIMESTAMPTZOID;
		args[3] = values[2];
		payidem_saved_plan(&sent_plan,
						   "UPDATE payidem.notify_event x SET status = $2, next_attempt_at = $3, sent_at = $4"
						   " WHERE x.event_id OPERATOR(pg_catalog.=) $1", 4, types);
	}
	else
	{
		types[3] = TEXTOID;
		args[3] = values[3];
		args_null[3] = nulls[3] ? 'n' : ' ';
		payidem_saved_plan(&failed_plan,
						   "UPDATE payidem.notify_event x SET status = $2, next_attempt_at = $3, last_response = $4"
						   " WHERE x.event_id OPERATOR(pg_catalog.=) $1", 4, types);
	}
	rc = SPI_execute_plan(r->ok ? sent_plan : failed_plan, args, args_null, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "payidem: an update of a notification event failed: %s", SPI_result_code_string(rc));
	/* (a DBA's BEFORE UPDATE trigger may have said no: then nothing is counted) */
	*changed = SPI_processed > 0;
	return true;
}

/*
 * payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT
 *		NULL, attempt integer DEFAULT NULL) RETURNS void
 *
 * Reports one delivery attempt (report_decide()).  Under READ COMMITTED it
 * does what the one UPDATE it replaces did, below SQL: the event as a new
 * snapshot sees it; if the report applies to that version, the row locked
 * (waiting for a worker that holds it) and the report decided again on its
 * latest version, then a direct update by its tid (payidem_update()).
 * Anything else goes through SQL (report_in_sql()).  PI009 for an event that
 * does not exist.  It acts as the tables' owner, switching itself, with
 * search_path pinned as notify_due() pins it.
 */
PG_FUNCTION_INFO_V1(payidem_notify_result);
Datum
payidem_notify_result(PG_FUNCTION_ARGS)
{
	static const char *const columns[] = {"status", "next_attempt_at", "sent_at", "last_response"};
	static const Oid types[] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID};
	static PayidemUpdate *report = NULL;
	NotifyReport r;
	Datum		event_id;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	PayidemAsOwner as_owner;
	PayidemCounter counter = PAYIDEM_NOTIFY_SENT;
	bool		changed = false;
	bool		exists = true;
	bool		done = false;
	int			guc_level;
	Relation	rel;

	if (PG_ARGISNULL(0) || PG_GETARG_INT64(0) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid event_id"),
				 errdetail("event_id was %s; it must be an id notify_due() handed out.",
						   PG_ARGISNULL(0) ? "NULL" : psprintf(INT64_FORMAT, PG_GETARG_INT64(0)))));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("notification result must not be NULL"),
				 errdetail("ok was NULL."),
				 errhint("Pass true if the merchant acknowledged the notification, false otherwise.")));
	/* a report is an UPDATE: refused where one is (a read-only transaction, a standby) */
	PreventCommandIfReadOnly("UPDATE");
	event_id = PG_GETARG_DATUM(0);
	r.ok = PG_GETARG_BOOL(1);
	r.response_null = PG_ARGISNULL(2);
	r.response = r.response_null ? (Datum) 0 : PG_GETARG_DATUM(2);
	r.attempt_null = PG_ARGISNULL(3);
	r.attempt = r.attempt_null ? 0 : PG_GETARG_INT32(3);

	payidem_become_owner(payidem_owner(PAYIDEM_NOTIFY_EVENT), 0, &as_owner);
	guc_level = payidem_pin_search_path();
	rel = table_open(payidem_relation(PAYIDEM_NOTIFY_EVENT), RowExclusiveLock);
	if (!IsolationUsesXactSnapshot() && payidem_update_plain(rel) &&
		!(rel->trigdesc != NULL && rel->trigdesc->trig_update_before_row))
	{
		TupleTableSlot *slot = table_slot_create(rel, NULL);
		HeapTuple	tuple;

		/* as a next statement would: after what came before, a new snapshot */
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		tuple = payidem_fetch_unique(rel, PAYIDEM_NOTIFY_EVENT_PKEY, 1, &event_id, GetActiveSnapshot());
		if (tuple == NULL)
		{
			exists = false;
			done = true;
		}
		else
		{
			bool		isnull;
			Datum		status = payidem_getattr(rel, tuple, "status", &isnull);
			int32		attempts = DatumGetInt32(payidem_getattr(rel, tuple, "attempts", &isnull));

			if (!report_applies(&r, status, attempts))
				done = true;	/* nothing to report: no lock taken, as the UPDATE's */
			else
			{
				slot->tts_tid = tuple->t_self;
				if (payidem_lock_row(rel, slot, GetActiveSnapshot()))
				{
					/* the latest version, locked: decided again on it */
					status = slot_getattr(slot, payidem_column(rel, "status"), &isnull);
					attempts = DatumGetInt32(slot_getattr(slot, payidem_column(rel, "attempts"), &isnull));
					done = true;
					if (report_applies(&r, status, attempts))
					{
						bool		set[NOTIFY_REPORT_COLUMNS];
						Datum		values[NOTIFY_REPORT_COLUMNS];
						bool		nulls[NOTIFY_REPORT_COLUMNS];

						counter = report_decide(&r, attempts, now, set, values, nulls);
						if (report == NULL)
							report = payidem_update_define(PAYIDEM_NOTIFY_EVENT, "event_id", lengthof(columns),
														   columns);
						/* (checked: payidem_update_plain() above) */
						(void) payidem_update(report, &slot->tts_tid, event_id, set, values, nulls, types, NULL,
											  true);
						changed = true;
					}
				}
				/* else gone, or changed by this transaction: SQL says which */
			}
		}
		PopActiveSnapshot();
		ExecDropSingleTupleTableSlot(slot);
	}
	table_close(rel, NoLock);
	if (!done)
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		exists = report_in_sql(event_id, &r, now, &counter, &changed);
		SPI_finish();
	}
	if (!exists)
	{
		/* PI009 as every "does not exist" is made (payidem._raise_not_found()) */
		static SPIPlanPtr not_found_plan = NULL;
		Oid			nf_types[1] = {INT8OID};

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		payidem_saved_plan(&not_found_plan,
						   "SELECT payidem._raise_not_found('notification event', $1,"
						   " 'payidem.notify_event', 'event_id')", 1, nf_types);
		SPI_execute_plan(not_found_plan, &event_id, NULL, false, 0);
		elog(ERROR, "payidem: notification event " INT64_FORMAT " does not exist", DatumGetInt64(event_id));
	}
	payidem_unpin_search_path(guc_level);
	payidem_become_caller(&as_owner);
	if (changed)
		payidem_count(counter);
	PG_RETURN_VOID();
}
