/*-------------------------------------------------------------------------
 *
 * recon.h
 *		Reconciliation (recon.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_RECON_H
#define PAYIDEM_RECON_H

extern void recon_define_gucs(void);

#endif							/* PAYIDEM_RECON_H */
