/*-------------------------------------------------------------------------
 *
 * payment_decision.h
 *		What a channel's payment result does, decided once (payment_decision.c)
 *		for apply_payment_result()'s C fast path and its PL/pgSQL fallback.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYMENT_DECISION_H
#define PAYMENT_DECISION_H

#include "fmgr.h"
#include "datatype/timestamp.h"

/* a reported result, its arguments found valid by payment_result_args_valid() */
typedef struct PaymentReport
{
	text	   *payment_no;
	text	   *status;			/* succeeded, failed or closed */
	bool		success;		/* status is succeeded */
	bool		amount_null;
	int64		amount;
	text	   *txn;			/* the channel's transaction id, or NULL */
	bool		paid_at_null;	/* none reported: the time of the call */
	TimestampTz paid_at;
} PaymentReport;

/* a fact a caller has not read (yet) */
#define FACT_UNREAD (-1)

/* the payment and order as a caller read them (locked or not) */
typedef struct PaymentFacts
{
	bool		found;			/* the payment exists; nothing below otherwise */
	text	   *status;
	int64		amount;
	text	   *txn;			/* NULL if none */
	TimestampTz created_at;
	text	   *order_status;	/* NULL: not read */
	int			txn_taken;		/* another payment of the channel has the
								 * transaction id: 1, 0, or FACT_UNREAD */
} PaymentFacts;

typedef enum PaymentVerdict
{
	/* outcomes, as apply_payment_result() returns them */
	VERDICT_APPLIED,			/* record the reported status (and pay the order) */
	VERDICT_ANOMALY,			/* record the success; the order is not pending */
	VERDICT_DUPLICATE,			/* already recorded: nothing to do */
	VERDICT_REJECTED,			/* nothing changes but the anomaly, if one */
	/* errors */
	VERDICT_NOT_FOUND,			/* PI009 */
	VERDICT_INVALID_PAID_AT,	/* 22023 (payment_raise_invalid_paid_at) */
	/* a fact is missing: read it and decide again */
	VERDICT_READ_ORDER,			/* the order's status, locked */
	VERDICT_CHECK_TXN			/* whether another payment has the transaction id */
} PaymentVerdict;

typedef struct PaymentDecision
{
	PaymentVerdict verdict;
	const char *anomaly;		/* the anomaly kind, or NULL */
} PaymentDecision;

extern PaymentDecision decide_payment_result(const PaymentReport *r, const PaymentFacts *f);
extern const char *payment_verdict_name(PaymentVerdict v);

/* the arguments' check: true if valid, else (raise) the error of the first invalid one */
extern bool payment_result_args_valid(text *payment_no, text *source, text *status, text *txn,
									  bool amount_null, int64 amount, bool paid_at_null,
									  TimestampTz paid_at, bool raise);

/* a reported paid_at: between the attempt's start and now, widened by payidem.max_clock_skew */
extern void payment_decision_define_gucs(void);
extern bool payidem_paid_at_acceptable(TimestampTz created_at, TimestampTz paid_at);

/* the fee and the cost of a payment: which rates apply, rounded half-up */
extern void payment_fees(int64 amount, Datum merchant_rate, bool merchant_rate_null,
						 Datum binding_rate, bool binding_rate_null,
						 Datum channel_rate, bool channel_rate_null,
						 Datum *fee, bool *fee_null, Datum *cost, bool *cost_null);

#endif							/* PAYMENT_DECISION_H */
