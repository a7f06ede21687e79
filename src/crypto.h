/*-------------------------------------------------------------------------
 *
 * crypto.h
 *		Merchant secrets encrypted at rest (crypto.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_CRYPTO_H
#define PAYIDEM_CRYPTO_H

extern void crypto_define_gucs(void);

#endif							/* PAYIDEM_CRYPTO_H */
