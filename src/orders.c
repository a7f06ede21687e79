/*-------------------------------------------------------------------------
 *
 * orders.c
 *		The rows create_order() and begin_payment() write, written directly.
 *
 *   payidem._insert_order(...) RETURNS boolean — create_order()'s new
 *     order, as INSERT ... ON CONFLICT ON CONSTRAINT order_out_trade_no_key
 *     DO NOTHING writes it (the unique constraint decides between
 *     concurrent first calls; the loser waits for the winner and finds its
 *     row): true if inserted, false if the merchant's out_trade_no is taken.
 *
 *   payidem._insert_payment(...) RETURNS boolean — begin_payment()'s new
 *     attempt, as its INSERT writes it: true.
 *
 * Both are what the statement does — constraints, domains, defaults,
 * indexes, the triggers (status_guard's history row, the expiry queue, the
 * foreign keys) — without a statement: no executor started and stopped, and
 * the CHECK constraints, defaults and index predicates compiled once per
 * session instead of read back from the catalog at every row (direct.c).
 * Where the table has what a direct insert cannot reproduce (a rule, a
 * trigger with a transition table, a BEFORE row trigger before a conflict
 * check, row-level security that applies, no INSERT privilege), they write
 * nothing and return NULL, and the caller runs its INSERT statement: the
 * same row either way.  Everything the row holds is decided by the caller.
 * Internal: nobody is granted them; the flow functions call them as the
 * tables' owner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"

#include "catalog.h"
#include "direct.h"

/*
 * payidem._insert_order(order_no text, merchant_no text, out_trade_no text,
 *		subject text, body text, amount bigint, notify_url text,
 *		return_url text, expire_at timestamptz) RETURNS boolean
 */
PG_FUNCTION_INFO_V1(payidem_insert_order);
Datum
payidem_insert_order(PG_FUNCTION_ARGS)
{
	static const char *const columns[] = {
		"order_no", "merchant_no", "out_trade_no", "subject", "body", "amount",
		"notify_url", "return_url", "expire_at"
	};
	static const Oid types[] = {
		TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID
	};
	static PayidemInsert *ins = NULL;
	Datum		values[lengthof(columns)];
	bool		nulls[lengthof(columns)];
	int			i;
	int			result;

	for (i = 0; i < lengthof(columns); i++)
	{
		nulls[i] = PG_ARGISNULL(i);
		values[i] = nulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	if (ins == NULL)
		ins = payidem_insert_define(PAYIDEM_ORDER, lengthof(columns), columns, types);
	result = payidem_insert_row(ins, values, nulls, PAYIDEM_ORDER_OUT_TRADE_NO_KEY);
	if (result < 0)
		PG_RETURN_NULL();
	PG_RETURN_BOOL(result == 1);
}

/*
 * payidem._insert_payment(payment_no text, order_no text, merchant_no text,
 *		channel_no text, amount bigint) RETURNS boolean
 */
PG_FUNCTION_INFO_V1(payidem_insert_payment);
Datum
payidem_insert_payment(PG_FUNCTION_ARGS)
{
	static const char *const columns[] = {"payment_no", "order_no", "merchant_no", "channel_no", "amount"};
	static const Oid types[] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID};
	static PayidemInsert *ins = NULL;
	Datum		values[lengthof(columns)];
	bool		nulls[lengthof(columns)];
	int			i;

	for (i = 0; i < lengthof(columns); i++)
	{
		nulls[i] = PG_ARGISNULL(i);
		values[i] = nulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	if (ins == NULL)
		ins = payidem_insert_define(PAYIDEM_PAYMENT, lengthof(columns), columns, types);
	if (payidem_insert_row(ins, values, nulls, -1) < 0)
		PG_RETURN_NULL();
	PG_RETURN_BOOL(true);
}
