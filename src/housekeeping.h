/*-------------------------------------------------------------------------
 *
 * housekeeping.h
 *		The housekeeping worker (housekeeping.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_HOUSEKEEPING_H
#define PAYIDEM_HOUSEKEEPING_H

extern void housekeeping_init(void);

/* the number create_order() drew for the order it inserts next, (Datum) 0 after */
extern void payidem_expiry_fresh_order(Datum order_no);

#endif							/* PAYIDEM_HOUSEKEEPING_H */
