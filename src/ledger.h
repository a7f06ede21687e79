/*-------------------------------------------------------------------------
 *
 * ledger.h
 *		The bookkeeping of orders and payments (ledger.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_LEDGER_H
#define PAYIDEM_LEDGER_H

extern bool payidem_payment_has_paid(Datum status);

#endif							/* PAYIDEM_LEDGER_H */
