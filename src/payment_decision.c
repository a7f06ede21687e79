/*-------------------------------------------------------------------------
 *
 * payment_decision.c
 *		What a channel's payment result does, decided once: the check of
 *		apply_payment_result()'s arguments, the verdict on a report from the
 *		payment and order as read, the rule for a reported paid_at, and the
 *		fee and cost of a payment.
 *
 * apply_payment_result() has a C fast path (payment_result.c) and a PL/pgSQL
 * fallback (payidem._apply_payment_result()).  They differ in how they read
 * and write rows, never in what they decide: each reads the facts (the
 * payment, its order, whether another payment has the transaction id) and
 * asks decide_payment_result(), which the SQL reaches as
 * payidem._decide_payment_result(); the fees come from payment_fees()
 * (payidem._payment_fees()); the arguments are checked by
 * payment_result_args_valid() (payidem._check_payment_result_args()).
 * Nothing here reads or writes a table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "errcodes.h"
#include "ledger.h"
#include "order_no.h"
#include "order_no_codec.h"
#include "payment_decision.h"
#include "util.h"

static bool
text_is(const text *t, const char *s)
{
	size_t		len = strlen(s);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), s, len) == 0;
}

static bool
texts_equal(const text *a, const text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

static PaymentDecision
verdict(PaymentVerdict v, const char *anomaly)
{
	PaymentDecision d = {v, anomaly};

	return d;
}

/*
 * The verdict on report r given what was read of its payment and order (f).
 * A caller that has not read a fact the verdict depends on gets
 * VERDICT_READ_ORDER or VERDICT_CHECK_TXN, reads it and asks again; one that
 * read without locks may act only on VERDICT_DUPLICATE (from a paid status a
 * payment moves only to other paid statuses, which answer a success alike).
 */
PaymentDecision
decide_payment_result(const PaymentReport *r, const PaymentFacts *f)
{
	bool		paid;

	if (!f->found)
	{
		OrderNoParts parts;

		/*
		 * A success for a number of this shard that names no payment (lost in
		 * an asynchronous failover, or never made here) is money the channel
		 * holds without a record: refused, with an anomaly.  Any other report
		 * of it is an error.
		 */
		if (r->success &&
			order_no_parse(VARDATA_ANY(r->payment_no), VARSIZE_ANY_EXHDR(r->payment_no), &parts) == ORDER_NO_OK &&
			parts.shard == payidem_shard_id)
			return verdict(VERDICT_REJECTED, "unknown_transaction");
		return verdict(VERDICT_NOT_FOUND, NULL);
	}
	paid = payidem_payment_has_paid(PointerGetDatum(f->status));
	if (r->success)
	{
		bool		same_txn = f->txn != NULL && texts_equal(r->txn, f->txn);

		if (!r->paid_at_null && !payidem_paid_at_acceptable(f->created_at, r->paid_at))
			return verdict(VERDICT_INVALID_PAID_AT, NULL);
		if (paid)
		{
			if (r->amount == f->amount && same_txn)
				return verdict(VERDICT_DUPLICATE, NULL);
			/* another transaction id or amount: a second charge? */
			return verdict(VERDICT_REJECTED, "conflicting_result");
		}
		if (r->amount != f->amount)
			return verdict(VERDICT_REJECTED, "amount_mismatch");
		/* (a transaction id the payment already has is no other's: unique) */
		if (!same_txn)
		{
			if (f->txn_taken == FACT_UNREAD)
				return verdict(VERDICT_CHECK_TXN, NULL);
			if (f->txn_taken)
				return verdict(VERDICT_REJECTED, "transaction_conflict");
		}

		/*
		 * pending, closed or failed -> succeeded: the channel's word wins.  It
		 * pays the order if the order is still pending; otherwise money
		 * arrived where it should not, and an anomaly asks for its refund.
		 */
		if (f->order_status == NULL)
			return verdict(VERDICT_READ_ORDER, NULL);
		if (text_is(f->order_status, "pending"))
			return verdict(VERDICT_APPLIED, NULL);
		return verdict(VERDICT_ANOMALY,
					   text_is(f->order_status, "closed") ? "paid_after_close" : "duplicate_payment");
	}
	/* the channel's word of success stands; a later failure or close contradicts it */
	if (paid)
		return verdict(VERDICT_REJECTED, "conflicting_result");
	if (texts_equal(f->status, r->status))
		return verdict(VERDICT_DUPLICATE, NULL);
	/* a failed attempt is not closed (nor a closed one failed) afterwards */
	if (text_is(f->status, "failed") || text_is(f->status, "closed"))
		return verdict(VERDICT_REJECTED, NULL);
	return verdict(VERDICT_APPLIED, NULL);
}

const char *
payment_verdict_name(PaymentVerdict v)
{
	switch (v)
	{
		case VERDICT_APPLIED:
			return "applied";
		case VERDICT_ANOMALY:
			return "anomaly";
		case VERDICT_DUPLICATE:
			return "duplicate";
		case VERDICT_REJECTED:
			return "rejected";
		case VERDICT_NOT_FOUND:
			return "not_found";
		case VERDICT_INVALID_PAID_AT:
			return "invalid_paid_at";
		case VERDICT_READ_ORDER:
			return "read_order";
		case VERDICT_CHECK_TXN:
			return "check_transaction_id";
	}
	return "?";
}

/*
 * payidem.max_clock_skew: how far a channel's clock may be from ours.  A
 * reported paid_at is taken when it lies between the attempt's start and
 * now, each widened by this much (DESIGN §7): a success dated in 2099 would
 * fall out of every reconciliation, one dated before the attempt was made
 * cannot be its payment.
 */
static int	payidem_max_clock_skew = 300;	/* seconds */

void
payment_decision_define_gucs(void)
{
	DefineCustomIntVariable("payidem.max_clock_skew",
							gettext_noop("How far a channel's reported paid_at may lie outside the payment attempt's lifetime."),
							gettext_noop("apply_payment_result() takes a paid_at between the attempt's creation and now, "
										 "each widened by this much; others are refused with 22023.  Only superusers "
										 "can change it."),
							&payidem_max_clock_skew,
							300, 0, 86400,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

bool
payidem_paid_at_acceptable(TimestampTz created_at, TimestampTz paid_at)
{
	int64		skew = (int64) payidem_max_clock_skew * USECS_PER_SEC;

	return !TIMESTAMP_NOT_FINITE(paid_at) &&
		paid_at >= created_at - skew &&
		paid_at <= GetCurrentTimestamp() + skew;
}

static void
raise_invalid_paid_at(text *payment_no, TimestampTz created_at, TimestampTz paid_at)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid paid_at"),
			 errdetail("Payment %s was started at %s; the reported paid_at %s is not between then and now (allowing %d seconds of clock skew).",
					   text_to_cstring(payment_no),
					   pstrdup(timestamptz_to_str(created_at)), pstrdup(timestamptz_to_str(paid_at)),
					   payidem_max_clock_skew),
			 errhint("Pass the time the channel reports the payment was made, or NULL for now; payidem.max_clock_skew sets the allowance.")));
}

/*
 * The fee (or cost) of an amount at a rate: amount * rate, exact, rounded
 * half-up to minor units (numeric's round, half away from zero, on a
 * positive amount); NULL for a NULL rate.  The one place a fee is computed.
 */
static Datum
fee_at(int64 amount, Datum rate, bool rate_null, bool *isnull)
{
	Datum		product;

	*isnull = rate_null;
	if (rate_null)
		return (Datum) 0;
	product = DirectFunctionCall2(numeric_mul, DirectFunctionCall1(int8_numeric, Int64GetDatum(amount)), rate);
	return DirectFunctionCall1(numeric_int8, DirectFunctionCall2(numeric_round, product, Int32GetDatum(0)));
}

/*
 * What the merchant pays (its binding's rate to the channel, else its own)
 * and what the channel costs (the channel's rate) on a payment of amount.
 */
void
payment_fees(int64 amount, Datum merchant_rate, bool merchant_rate_null,
			 Datum binding_rate, bool binding_rate_null,
			 Datum channel_rate, bool channel_rate_null,
			 Datum *fee, bool *fee_null, Datum *cost, bool *cost_null)
{
	if (binding_rate_null)
		*fee = fee_at(amount, merchant_rate, merchant_rate_null, fee_null);
	else
		*fee = fee_at(amount, binding_rate, false, fee_null);
	*cost = fee_at(amount, channel_rate, channel_rate_null, cost_null);
}

/*
 * payidem._payment_fees(amount bigint, merchant_rate numeric, binding_rate
 *     numeric, channel_rate numeric, OUT fee_amount bigint, OUT cost_amount
 *     bigint): payment_fees(), for _apply_payment_result().
 */
PG_FUNCTION_INFO_V1(payidem_payment_fees);
Datum
payidem_payment_fees(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2];

	if (PG_ARGISNULL(0))
		elog(ERROR, "payidem._payment_fees: amount is NULL");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "payidem._payment_fees: return type must be a row type");
	payment_fees(PG_GETARG_INT64(0), PG_GETARG_DATUM(1), PG_ARGISNULL(1), PG_GETARG_DATUM(2), PG_ARGISNULL(2),
				 PG_GETARG_DATUM(3), PG_ARGISNULL(3), &values[0], &nulls[0], &values[1], &nulls[1]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * payidem._decide_payment_result(payment_no text, status text, amount bigint,
 *     transaction_id text, paid_at timestamptz, payment_status text,
 *     payment_amount bigint, payment_transaction_id text, payment_created_at
 *     timestamptz, order_status text, transaction_id_taken boolean,
 *     OUT verdict text, OUT anomaly_kind text)
 *		decide_payment_result() for _apply_payment_result(): payment_status
 *		NULL for no payment, order_status and transaction_id_taken NULL when
 *		not read.  An invalid paid_at is raised here (22023).
 */
PG_FUNCTION_INFO_V1(payidem_decide_payment_result);
Datum
payidem_decide_payment_result(PG_FUNCTION_ARGS)
{
	PaymentReport r;
	PaymentFacts f;
	PaymentDecision d;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		elog(ERROR, "payidem._decide_payment_result: a required argument is NULL");
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "payidem._decide_payment_result: return type must be a row type");
	memset(&r, 0, sizeof(r));
	memset(&f, 0, sizeof(f));
	r.payment_no = PG_GETARG_TEXT_PP(0);
	r.status = PG_GETARG_TEXT_PP(1);
	r.success = text_is(r.status, "succeeded");
	r.amount_null = PG_ARGISNULL(2);
	r.amount = r.amount_null ? 0 : PG_GETARG_INT64(2);
	r.txn = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);
	r.paid_at_null = PG_ARGISNULL(4);
	r.paid_at = r.paid_at_null ? 0 : PG_GETARG_TIMESTAMPTZ(4);
	f.found = !PG_ARGISNULL(5);
	if (f.found)
	{
		if (PG_ARGISNULL(6) || PG_ARGISNULL(8))
			elog(ERROR, "payidem._decide_payment_result: the payment's amount or created_at is NULL");
		f.status = PG_GETARG_TEXT_PP(5);
		f.amount = PG_GETARG_INT64(6);
		f.txn = PG_ARGISNULL(7) ? NULL : PG_GETARG_TEXT_PP(7);
		f.created_at = PG_GETARG_TIMESTAMPTZ(8);
		f.order_status = PG_ARGISNULL(9) ? NULL : PG_GETARG_TEXT_PP(9);
		f.txn_taken = PG_ARGISNULL(10) ? FACT_UNREAD : PG_GETARG_BOOL(10);
	}
	if (r.success && (r.txn == NULL || r.amount_null))
		elog(ERROR, "payidem._decide_payment_result: a success without its transaction id or amount");
	d = decide_payment_result(&r, &f);
	if (d.verdict == VERDICT_INVALID_PAID_AT)
		raise_invalid_paid_at(r.payment_no, f.created_at, r.paid_at);
	values[0] = CStringGetTextDatum(payment_verdict_name(d.verdict));
	if (d.anomaly != NULL)
		values[1] = CStringGetTextDatum(d.anomaly);
	else
		nulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* a transaction id taken without asking the domain: 1 to 64 printable ASCII */
static bool
plain_txn(const text *t)
{
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(t);
	int			len = VARSIZE_ANY_EXHDR(t);
	int			i;

	if (len < 1 || len > 64)
		return false;
	for (i = 0; i < len; i++)
		if (p[i] < 0x21 || p[i] > 0x7e)
			return false;
	return true;
}

/* the saved plans of the queries below */
static SPIPlanPtr check_number_plan = NULL;
static SPIPlanPtr fits_plan = NULL;
static SPIPlanPtr invalid_format_plan = NULL;

/*
 * Run a one-parameter query of payidem's own functions (on the error path,
 * and for a transaction id that is not plain ASCII) with its plan saved in
 * *plan; the first column of its row.
 */
static bool
sql_bool(SPIPlanPtr *plan, const char *query, text *arg)
{
	Oid			argtype = TEXTOID;
	Datum		value = PointerGetDatum(arg);
	char		argnull = arg == NULL ? 'n' : ' ';
	bool		result = false;
	bool		isnull;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "payidem: SPI_connect failed");
	if (SPI_execute_plan(payidem_saved_plan(plan, query, 1, &argtype), &value, &argnull, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "payidem: \"%s\" failed", query);
	if (SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		result = !isnull && TupleDescAttr(SPI_tuptable->tupdesc, 0)->atttypid == BOOLOID && DatumGetBool(d);
	}
	SPI_finish();
	return result;
}

static char *
quoted_prefix(text *t)
{
	char	   *s;

	if (t == NULL)
		return "NULL";
	s = text_to_cstring(t);
	s[pg_mbcharcliplen(s, strlen(s), 64)] = '\0';
	return quote_literal_cstr(s);
}

/*
 * The arguments of apply_payment_result(): true if valid; otherwise false
 * or, with raise, the error of the first invalid one (22023; a payment
 * number's is _check_number()'s, a transaction id's _invalid_format()'s).
 */
bool
payment_result_args_valid(text *payment_no, text *source, text *status, text *txn,
						  bool amount_null, int64 amount, bool paid_at_null,
						  TimestampTz paid_at, bool raise)
{
	OrderNoParts parts;

	if (payment_no == NULL || VARSIZE_ANY_EXHDR(payment_no) < 2 ||
		memcmp(VARDATA_ANY(payment_no), "PY", 2) != 0 ||
		order_no_parse(VARDATA_ANY(payment_no), VARSIZE_ANY_EXHDR(payment_no), &parts) != ORDER_NO_OK)
	{
		if (raise)
			sql_bool(&check_number_plan, "SELECT payidem._check_number('payment', $1) IS NULL", payment_no);
		return false;
	}
	if (source == NULL ||
		!(text_is(source, "callback") || text_is(source, "query") || text_is(source, "close")))
	{
		if (raise)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid result source"),
					 errdetail("The source was %s; it must be callback, query or close.", quoted_prefix(source))));
		return false;
	}
	if (status == NULL ||
		!(text_is(status, "succeeded") || text_is(status, "failed") || text_is(status, "closed")))
	{
		if (raise)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid payment result status"),
					 errdetail("The status was %s; it must be succeeded, failed or closed.", quoted_prefix(status))));
		return false;
	}
	if (!amount_null && amount <= 0)
	{
		if (raise)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid reported amount"),
					 errdetail("The amount was " INT64_FORMAT "; it must be positive.", amount),
					 errhint("Pass the amount the channel reports, in minor units.")));
		return false;
	}
	/*
	 * the domain of the column it is written to, asked only for an id that is
	 * not plain ASCII: the installed channel_ref takes every plain one (a
	 * domain a DBA narrows still refuses it where it is written, 23514)
	 */
	if (txn != NULL && !plain_txn(txn) &&
		!sql_bool(&fits_plan, "SELECT payidem._fits($1, 'payidem.channel_ref')", txn))
	{
		if (raise)
			sql_bool(&invalid_format_plan,
					 "SELECT payidem._invalid_format('transaction_id', $1, 'payidem.channel_ref') IS NULL", txn);
		return false;
	}
	if (!paid_at_null && TIMESTAMP_NOT_FINITE(paid_at))
	{
		if (raise)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid paid_at"),
					 errdetail("The value was %s; it must be a real point in time, or NULL for now.",
							   timestamptz_to_str(paid_at)),
					 errhint("Pass the time the channel reports the payment was made.")));
		return false;
	}
	if (text_is(status, "succeeded") && (txn == NULL || amount_null))
	{
		if (raise)
		{
			char		amount_text[32];

			if (amount_null)
				strcpy(amount_text, "NULL");
			else
				snprintf(amount_text, sizeof(amount_text), INT64_FORMAT, amount);
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a success must carry the channel's transaction id and amount"),
					 errdetail("Payment %s: transaction_id was %s and amount was %s.",
							   text_to_cstring(payment_no),
							   txn == NULL ? "NULL" : quote_literal_cstr(text_to_cstring(txn)), amount_text),
					 errhint("Pass both as the channel reported them: a success without them can be neither reconciled nor refunded.")));
		}
		return false;
	}
	return true;
}

/*
 * payidem._check_payment_result_args(payment_no text, source text, status
 *     text, transaction_id text, amount bigint, paid_at timestamptz)
 *     RETURNS void: payment_result_args_valid(), raising.
 */
PG_FUNCTION_INFO_V1(payidem_check_payment_result_args);
Datum
payidem_check_payment_result_args(PG_FUNCTION_ARGS)
{
	payment_result_args_valid(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0),
							  PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1),
							  PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2),
							  PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3),
							  PG_ARGISNULL(4), PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4),
							  PG_ARGISNULL(5), PG_ARGISNULL(5) ? 0 : PG_GETARG_TIMESTAMPTZ(5),
							  true);
	PG_RETURN_VOID();
}

/*
 * Functions of 1.0's SQL (_fee, _check_paid_at, _paid_at_ok), which the
 * library serves as long as a database can still run 1.0 or update from it.
 */
PG_FUNCTION_INFO_V1(payidem_fee);
Datum
payidem_fee(PG_FUNCTION_ARGS)
{
	bool		isnull;

	return fee_at(PG_GETARG_INT64(0), PG_GETARG_DATUM(1), false, &isnull);
}

PG_FUNCTION_INFO_V1(payidem_paid_at_ok);
Datum
payidem_paid_at_ok(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(payidem_paid_at_acceptable(PG_GETARG_TIMESTAMPTZ(0), PG_GETARG_TIMESTAMPTZ(1)));
}

PG_FUNCTION_INFO_V1(payidem_check_paid_at);
Datum
payidem_check_paid_at(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		elog(ERROR, "payidem._check_paid_at: a required argument is NULL");
	if (!payidem_paid_at_acceptable(PG_GETARG_TIMESTAMPTZ(1), PG_GETARG_TIMESTAMPTZ(2)))
		raise_invalid_paid_at(PG_GETARG_TEXT_PP(0), PG_GETARG_TIMESTAMPTZ(1), PG_GETARG_TIMESTAMPTZ(2));
	PG_RETURN_VOID();
}
