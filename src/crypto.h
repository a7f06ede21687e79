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

/* the associated data of a merchant's sealed API secret (payidem._secret_aad()) */
extern text *payidem_secret_aad(text *merchant_no, int32 version);

/* a notification's v1 and v2 under one sealed secret (64 hex each) */
#define PAYIDEM_MAC_HEX_LEN 64
extern void payidem_notification_macs(text *aad, int32 key_version, bytea *nonce, bytea *ciphertext,
									  bytea *tag, const char *msg, size_t msglen, char *v1, char *v2);

#endif							/* PAYIDEM_CRYPTO_H */
