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

#endif							/* PAYIDEM_HOUSEKEEPING_H */
