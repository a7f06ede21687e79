/*-------------------------------------------------------------------------
 *
 * errcodes.h
 *		payidem's own SQLSTATEs (class PI), as listed in DESIGN section 2.
 *
 * Standard conditions (22023 invalid_parameter_value, 55000
 * object_not_in_prerequisite_state) use PostgreSQL's ERRCODE_* names directly.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_ERRCODES_H
#define PAYIDEM_ERRCODES_H

#include "utils/elog.h"

/* idempotency key / out_trade_no / out_refund_no reused with other parameters */
#define ERRCODE_PAYIDEM_IDEMPOTENCY_MISMATCH	MAKE_SQLSTATE('P','I','0','0','1')
/* status change not in the whitelist (function or direct UPDATE/INSERT) */
#define ERRCODE_PAYIDEM_ILLEGAL_TRANSITION		MAKE_SQLSTATE('P','I','0','0','2')
/* another attempt of the order is pending on a different channel */
#define ERRCODE_PAYIDEM_PAYMENT_IN_PROGRESS		MAKE_SQLSTATE('P','I','0','0','3')
/* merchant inactive, channel disabled/unbound, merchant type not allowed */
#define ERRCODE_PAYIDEM_NOT_PERMITTED			MAKE_SQLSTATE('P','I','0','0','4')
/* pending + succeeded refunds would exceed the paid amount */
#define ERRCODE_PAYIDEM_REFUND_EXCEEDS_PAID		MAKE_SQLSTATE('P','I','0','0','6')
/* merchant/channel single or daily limit exceeded */
#define ERRCODE_PAYIDEM_LIMIT_EXCEEDED			MAKE_SQLSTATE('P','I','0','0','7')
/* payment started on an order past expire_at */
#define ERRCODE_PAYIDEM_ORDER_EXPIRED			MAKE_SQLSTATE('P','I','0','0','8')
/* unknown order/payment/refund/merchant/channel/idempotency key */
#define ERRCODE_PAYIDEM_NOT_FOUND				MAKE_SQLSTATE('P','I','0','0','9')
#define ERRCODE_PAYIDEM_INSUFFICIENT_BALANCE	MAKE_SQLSTATE('P','I','0','1','0')

#endif							/* PAYIDEM_ERRCODES_H */
