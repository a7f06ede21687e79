/*-------------------------------------------------------------------------
 *
 * crypto.c
 *		Secrets at rest and signatures: AES-256-GCM sealing under a master
 *		key read from a file, HMAC-SHA256 signatures, strong random codes.
 *
 * The master key is read by this file from the file named by the
 * superuser-only setting payidem.master_key_file (64 hexadecimal characters,
 * e.g. from `openssl rand -hex 32`) and never passes through SQL: SQL sees
 * only sealed records (key version, nonce, ciphertext, tag).  Every record is
 * sealed with a fresh random 96-bit nonce and its identity (table + key) as
 * associated data, so a ciphertext copied onto another row does not open.
 *
 * For a master-key rotation, payidem.previous_master_key_file names the old
 * key; records are opened with whichever key their key_version names, and
 * payidem.reencrypt_secrets() moves them all to the current key.
 *
 * Keys are cached per backend and re-read when the setting or the file
 * (inode, size, mtime) changes, so a new key file takes effect without a
 * restart.  Plaintext secrets and keys are wiped from memory after use.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <openssl/evp.h>
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#include <openssl/core_names.h>
#include <openssl/params.h>
#endif

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "compat.h"
#include "crypto.h"
#include "errcodes.h"
#include "util.h"

#define MASTER_KEY_LEN	32
#define GCM_NONCE_LEN	12
#define GCM_TAG_LEN		16
#define SHA256_LEN		32

static char *payidem_master_key_file = NULL;
static char *payidem_previous_master_key_file = NULL;
static char *payidem_secret_dir = NULL;

typedef struct MasterKey
{
	bool		loaded;
	char		path[MAXPGPATH];
	struct stat st;
	int32		version;
	uint8		key[MASTER_KEY_LEN];
} MasterKey;

static MasterKey current_key;
static MasterKey previous_key;

void
crypto_define_gucs(void)
{
	DefineCustomStringVariable("payidem.master_key_file",
							   gettext_noop("File holding the 256-bit master key that encrypts secrets at rest (64 hexadecimal characters)."),
							   gettext_noop("Readable only by the server's user. Re-read when the setting or the file changes."),
							   &payidem_master_key_file,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("payidem.previous_master_key_file",
							   gettext_noop("File holding the previous master key, used only to open records not yet re-encrypted after a key rotation."),
							   NULL,
							   &payidem_previous_master_key_file,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("payidem.secret_dir",
							   gettext_noop("Directory from which load_channel_config() and load_merchant_secret() read secrets."),
							   gettext_noop("Its files are read by the server itself, so a secret loaded from one is never "
											"a statement's text or parameter, which logging settings could capture."),
							   &payidem_secret_dir,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
}

static void
key_error(const char *setting, const char *path, const char *problem)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("payidem master key is not available"),
			 errdetail("%s = '%s': %s", setting, path, problem),
			 errhint("Set %s to a file readable only by the server's user holding 64 hexadecimal characters, e.g. made by \"openssl rand -hex 32\".",
					 setting)));
}

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * A key's version: a 31-bit id derived from the key itself, so records say
 * which key sealed them without storing anything about the key.
 */
static int32
key_version_of(const uint8 *key)
{
	static const char label[] = "payidem master key version";
	uint8		mac[SHA256_LEN];
	pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);
	int32		v;

	if (ctx == NULL || pg_hmac_init(ctx, key, MASTER_KEY_LEN) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) label, sizeof(label) - 1) < 0 ||
		pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
		elog(ERROR, "could not compute master key version");
	pg_hmac_free(ctx);
	v = (int32) (((uint32) mac[0] << 24 | (uint32) mac[1] << 16 |
				  (uint32) mac[2] << 8 | mac[3]) & 0x7fffffff);
	return v == 0 ? 1 : v;
}

/*
 * Load (or reuse) the key named by a setting.  Returns NULL when the setting
 * is empty and `required` is false.
 */
static MasterKey *
load_key(MasterKey *mk, const char *setting, const char *path, bool required)
{
	struct stat st;
	FILE	   *f;
	char		buf[MASTER_KEY_LEN * 2 + 3];
	size_t		n;
	int			i;

	if (path == NULL || path[0] == '\0')
	{
		if (!required)
			return NULL;
		key_error(setting, "", "the setting is empty");
	}
	if (stat(path, &st) != 0)
		key_error(setting, path, "the file does not exist or cannot be read");
	/* checked on every use, also when the key is cached: a chmod counts at once */
	if (!S_ISREG(st.st_mode))
		key_error(setting, path, "it is not a regular file");
	if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
		key_error(setting, path, "the file is accessible to other users (chmod 600 it)");
	/*
	 * The cached key is the file's as long as nothing about the file changed:
	 * same inode and size, and the same modification and status-change times
	 * to the nanosecond (an overwrite in place within one second changes them).
	 */
	if (mk->loaded && strcmp(mk->path, path) == 0 &&
		mk->st.st_ino == st.st_ino && mk->st.st_dev == st.st_dev &&
		mk->st.st_size == st.st_size &&
		mk->st.st_mtim.tv_sec == st.st_mtim.tv_sec && mk->st.st_mtim.tv_nsec == st.st_mtim.tv_nsec &&
		mk->st.st_ctim.tv_sec == st.st_ctim.tv_sec && mk->st.st_ctim.tv_nsec == st.st_ctim.tv_nsec)
		return mk;

	mk->loaded = false;

	f = AllocateFile(path, "r");
	if (f == NULL)
		key_error(setting, path, "the file cannot be opened");
	n = fread(buf, 1, sizeof(buf), f);
	FreeFile(f);

	/* 64 hex characters, optionally one newline (LF or CRLF) */
	if (n > MASTER_KEY_LEN * 2 &&
		!(n == MASTER_KEY_LEN * 2 + 1 && buf[64] == '\n') &&
		!(n == MASTER_KEY_LEN * 2 + 2 && buf[64] == '\r' && buf[65] == '\n'))
	{
		explicit_bzero(buf, sizeof(buf));
		key_error(setting, path, "the file must hold exactly 64 hexadecimal characters");
	}
	if (n < MASTER_KEY_LEN * 2)
	{
		explicit_bzero(buf, sizeof(buf));
		key_error(setting, path, "the file must hold exactly 64 hexadecimal characters");
	}
	for (i = 0; i < MASTER_KEY_LEN; i++)
	{
		int			hi = hex_value(buf[2 * i]);
		int			lo = hex_value(buf[2 * i + 1]);

		if (hi < 0 || lo < 0)
		{
			explicit_bzero(buf, sizeof(buf));
			explicit_bzero(mk->key, sizeof(mk->key));
			key_error(setting, path, "the file must hold exactly 64 hexadecimal characters");
		}
		mk->key[i] = (uint8) (hi << 4 | lo);
	}
	explicit_bzero(buf, sizeof(buf));

	strlcpy(mk->path, path, sizeof(mk->path));
	mk->st = st;
	mk->version = key_version_of(mk->key);
	mk->loaded = true;
	return mk;
}

static MasterKey *
current_master_key(void)
{
	return load_key(&current_key, "payidem.master_key_file", payidem_master_key_file, true);
}

/* the key that sealed a record of this version (current or previous) */
static MasterKey *
master_key_for(int32 version)
{
	MasterKey  *mk = current_master_key();
	MasterKey  *prev;

	if (mk->version == version)
		return mk;
	prev = load_key(&previous_key, "payidem.previous_master_key_file",
					payidem_previous_master_key_file, false);
	if (prev != NULL && prev->version == version)
		return prev;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("no master key of version %d is configured", version),
			 errdetail("The record was sealed with master key version %d; the current key is version %d%s.",
					   version, mk->version,
					   prev ? psprintf(" and the previous key version %d", prev->version) : ""),
			 errhint("Set payidem.previous_master_key_file to the old key file, then run payidem.reencrypt_secrets().")));
	return NULL;				/* keep compiler quiet */
}

/*
 * The AES-256-GCM implementation, fetched from OpenSSL's providers once per
 * backend: OpenSSL 3 otherwise looks it up again at every EVP_CipherInit_ex()
 * of EVP_aes_256_gcm() (about 9,000 instructions per sealed secret opened).
 */
static const EVP_CIPHER *
gcm_cipher(void)
{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	static EVP_CIPHER *fetched = NULL;

	if (fetched == NULL)
		fetched = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
	if (fetched != NULL)
		return fetched;
#endif
	return EVP_aes_256_gcm();
}

/* AES-256-GCM; returns false on authentication failure when decrypting */
static bool
gcm(bool encrypt, const uint8 *key, const uint8 *nonce,
	const uint8 *aad, int aadlen, const uint8 *in, int inlen,
	uint8 *out, uint8 *tag)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int			len;
	bool		ok;

	if (ctx == NULL)
		elog(ERROR, "out of memory creating cipher context");
	ok = EVP_CipherInit_ex(ctx, gcm_cipher(), NULL, NULL, NULL, encrypt ? 1 : 0) == 1 &&
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, GCM_NONCE_LEN, NULL) == 1 &&
		EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, encrypt ? 1 : 0) == 1 &&
		EVP_CipherUpdate(ctx, NULL, &len, aad, aadlen) == 1 &&
		(inlen == 0 || EVP_CipherUpdate(ctx, out, &len, in, inlen) == 1);
	if (ok && !encrypt)
		ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, GCM_TAG_LEN, tag) == 1;
	if (ok)
		ok = EVP_CipherFinal_ex(ctx, out + inlen, &len) == 1;
	if (ok && encrypt)
		ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, GCM_TAG_LEN, tag) == 1;
	EVP_CIPHER_CTX_free(ctx);
	if (!ok && encrypt)
		elog(ERROR, "AES-256-GCM encryption failed");
	return ok;
}

/*
 * Open a sealed record into palloc'd memory (caller wipes it).  A record whose
 * identity or bytes were changed fails with data_corrupted.
 */
static uint8 *
open_record(text *aad, int32 version, bytea *nonce, bytea *ciphertext, bytea *tag, int *len)
{
	MasterKey  *mk = master_key_for(version);
	int			n = VARSIZE_ANY_EXHDR(ciphertext);
	uint8	   *plain;

	if (VARSIZE_ANY_EXHDR(nonce) != GCM_NONCE_LEN || VARSIZE_ANY_EXHDR(tag) != GCM_TAG_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("sealed record has a malformed nonce or tag")));
	plain = palloc(n + 16);
	if (!gcm(false, mk->key, (uint8 *) VARDATA_ANY(nonce),
			 (uint8 *) VARDATA_ANY(aad), VARSIZE_ANY_EXHDR(aad),
			 (uint8 *) VARDATA_ANY(ciphertext), n, plain, (uint8 *) VARDATA_ANY(tag)))
	{
		explicit_bzero(plain, n + 16);
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("sealed record does not authenticate"),
				 errdetail("The record for %s was altered, copied from another record, or sealed with another key of the same version.",
						   text_to_cstring(aad))));
	}
	*len = n;
	return plain;
}

static bytea *
make_bytea(const uint8 *data, int len)
{
	bytea	   *b = palloc(VARHDRSZ + len);

	SET_VARSIZE(b, VARHDRSZ + len);
	memcpy(VARDATA(b), data, len);
	return b;
}

/*
 * payidem._seal(aad text, plaintext bytea)
 *		RETURNS TABLE(key_version int, nonce bytea, ciphertext bytea, auth_tag bytea)
 */
PG_FUNCTION_INFO_V1(payidem_seal);
Datum
payidem_seal(PG_FUNCTION_ARGS)
{
	text	   *aad = PG_GETARG_TEXT_PP(0);
	bytea	   *plain = PG_GETARG_BYTEA_PP(1);
	MasterKey  *mk = current_master_key();
	int			n = VARSIZE_ANY_EXHDR(plain);
	uint8		nonce[GCM_NONCE_LEN];
	uint8		tag[GCM_TAG_LEN];
	uint8	   *ct = palloc(n + 16);
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (!pg_strong_random(nonce, sizeof(nonce)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random nonce")));
	gcm(true, mk->key, nonce, (uint8 *) VARDATA_ANY(aad), VARSIZE_ANY_EXHDR(aad),
		(uint8 *) VARDATA_ANY(plain), n, ct, tag);

	values[0] = Int32GetDatum(mk->version);
	values[1] = PointerGetDatum(make_bytea(nonce, GCM_NONCE_LEN));
	values[2] = PointerGetDatum(make_bytea(ct, n));
	values[3] = PointerGetDatum(make_bytea(tag, GCM_TAG_LEN));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}

/*
 * payidem._open(aad text, key_version int, nonce bytea, ciphertext bytea, auth_tag bytea)
 *		RETURNS bytea — the plaintext (for get_channel_config and re-encryption).
 */
PG_FUNCTION_INFO_V1(payidem_open);
Datum
payidem_open(PG_FUNCTION_ARGS)
{
	int			len;
	uint8	   *plain = open_record(PG_GETARG_TEXT_PP(0), PG_GETARG_INT32(1),
									PG_GETARG_BYTEA_PP(2), PG_GETARG_BYTEA_PP(3),
									PG_GETARG_BYTEA_PP(4), &len);
	bytea	   *result = make_bytea(plain, len);

	explicit_bzero(plain, len);
	PG_RETURN_BYTEA_P(result);
}

/*
 * The label of the notification signature's scheme v2 (docs/notifications.md
 * "Signature"): v2 is HMAC-SHA256(secret, label NUL "<t>.<payload>"), the
 * label's terminating NUL byte included.  A text value never holds a NUL byte,
 * so no message sign(), verify_signature() or a notification's v1 takes (a
 * text, as it is) is ever a v2 message: a merchant's signed request can never
 * be presented as a v2-signed notification, nor the other way round.  A later
 * scheme takes another label of the same form (no NUL in it): the NUL ends the
 * label, so two labels never make the same message either.
 */
static const char notify_v2_label[] = "payidem-notification-v2";

/* one message to MAC: prefix (prefix_len bytes, none if 0) followed by msg */
typedef struct HmacMessage
{
	const char *prefix;
	size_t		prefix_len;
	const char *msg;
	size_t		msglen;
} HmacMessage;

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
/*
 * HMAC-SHA256 as OpenSSL 3 provides it, the algorithm and its digest fetched
 * once per backend (a one-shot HMAC looks both up again at every call, about
 * 5,000 instructions each).  A template that never holds a key: each use
 * works on copies of it (hmac_hex_all()).
 */
static EVP_MAC_CTX *
hmac_sha256_ctx(void)
{
	static EVP_MAC_CTX *kept = NULL;

	if (kept == NULL)
	{
		EVP_MAC	   *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
		EVP_MAC_CTX *ctx = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
		OSSL_PARAM	params[2];

		params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *) "SHA256", 0);
		params[1] = OSSL_PARAM_construct_end();
		EVP_MAC_free(mac);		/* (the context keeps its own reference) */
		if (ctx == NULL || EVP_MAC_CTX_set_params(ctx, params) != 1)
		{
			EVP_MAC_CTX_free(ctx);
			elog(ERROR, "could not set up HMAC-SHA256");
		}
		kept = ctx;
	}
	return kept;
}
#endif

/*
 * HMAC-SHA256 under secret (len bytes) of each of the n messages, as 64
 * lowercase hex at hex[i], the key set once.
 */
static void
hmac_hex_all(const uint8 *secret, int len, int n, const HmacMessage *messages, char **hex)
{
	static const char digits[] = "0123456789abcdef";
	uint8		mac[SHA256_LEN];
	bool		ok = true;
	int			m;

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	/*
	 * the key set once, on a copy of the template: the key's pads are hashed
	 * once for all the messages, each made on a copy of the keyed context
	 * (the last on that context itself); freeing a context wipes its key
	 * state
	 */
	EVP_MAC_CTX *keyed = EVP_MAC_CTX_dup(hmac_sha256_ctx());

	ok = keyed != NULL && EVP_MAC_init(keyed, secret, (size_t) len, NULL) == 1;
	for (m = 0; ok && m < n; m++)
	{
		const HmacMessage *msg = &messages[m];
		EVP_MAC_CTX *ctx = m + 1 < n ? EVP_MAC_CTX_dup(keyed) : keyed;
		size_t		maclen = 0;
		int			i;

		ok = ctx != NULL &&
			(msg->prefix_len == 0 || EVP_MAC_update(ctx, (const uint8 *) msg->prefix, msg->prefix_len) == 1) &&
			EVP_MAC_update(ctx, (const uint8 *) msg->msg, msg->msglen) == 1 &&
			EVP_MAC_final(ctx, mac, &maclen, sizeof(mac)) == 1 && maclen == SHA256_LEN;
		if (ctx != keyed)
			EVP_MAC_CTX_free(ctx);
		for (i = 0; ok && i < SHA256_LEN; i++)
		{
			hex[m][2 * i] = digits[mac[i] >> 4];
			hex[m][2 * i + 1] = digits[mac[i] & 15];
		}
		hex[m][2 * SHA256_LEN] = '\0';
	}
	EVP_MAC_CTX_free(keyed);
#else
	for (m = 0; ok && m < n; m++)
	{
		const HmacMessage *msg = &messages[m];
		pg_hmac_ctx *ctx = pg_hmac_create(PG_SHA256);
		int			i;

		ok = ctx != NULL && pg_hmac_init(ctx, secret, len) >= 0 &&
			(msg->prefix_len == 0 || pg_hmac_update(ctx, (const uint8 *) msg->prefix, msg->prefix_len) >= 0) &&
			pg_hmac_update(ctx, (const uint8 *) msg->msg, msg->msglen) >= 0 &&
			pg_hmac_final(ctx, mac, sizeof(mac)) >= 0;
		if (ctx)
			pg_hmac_free(ctx);
		for (i = 0; ok && i < SHA256_LEN; i++)
		{
			hex[m][2 * i] = digits[mac[i] >> 4];
			hex[m][2 * i + 1] = digits[mac[i] & 15];
		}
		hex[m][2 * SHA256_LEN] = '\0';
	}
#endif
	explicit_bzero(mac, sizeof(mac));
	if (!ok)
		elog(ERROR, "could not compute HMAC-SHA256");
}

/*
 * HMAC-SHA256 under secret (len bytes) of prefix (prefix_len bytes, none if
 * 0) followed by msg (msglen bytes), as 64 lowercase hex at hex.
 */
static void
hmac_hex(const uint8 *secret, int len, const char *prefix, size_t prefix_len,
		 const char *msg, size_t msglen, char *hex)
{
	HmacMessage message = {prefix, prefix_len, msg, msglen};

	hmac_hex_all(secret, len, 1, &message, &hex);
}

/*
 * HMAC-SHA256 under the sealed secret (arguments 0 to 4) of prefix
 * (prefix_len bytes, none if 0) followed by payload (argument 5), as 64
 * lowercase hex.
 */
static void
hmac_sealed(FunctionCallInfo fcinfo, const char *prefix, size_t prefix_len, char *hex)
{
	text	   *payload = PG_GETARG_TEXT_PP(5);
	int			len;
	uint8	   *secret = open_record(PG_GETARG_TEXT_PP(0), PG_GETARG_INT32(1),
									 PG_GETARG_BYTEA_PP(2), PG_GETARG_BYTEA_PP(3),
									 PG_GETARG_BYTEA_PP(4), &len);

	PG_TRY();
	{
		hmac_hex(secret, len, prefix, prefix_len, VARDATA_ANY(payload), VARSIZE_ANY_EXHDR(payload), hex);
	}
	PG_FINALLY();
	{
		explicit_bzero(secret, len);
	}
	PG_END_TRY();
}

/*
 * "merchant_secret:<merchant_no>:<version>": the associated data that binds
 * a merchant's sealed API secret to its row (its number and version), so
 * that a sealed secret copied to another row does not open.  The one place
 * it is written: payidem._secret_aad() in SQL, the notification's signature
 * in C.
 */
text *
payidem_secret_aad(text *merchant_no, int32 version)
{
	StringInfoData buf;
	text	   *result;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "merchant_secret:");
	appendBinaryStringInfo(&buf, VARDATA_ANY(merchant_no), VARSIZE_ANY_EXHDR(merchant_no));
	appendStringInfo(&buf, ":%d", version);
	result = cstring_to_text_with_len(buf.data, buf.len);
	pfree(buf.data);
	return result;
}

/*
 * payidem._secret_aad(p_merchant_no text, p_version integer) RETURNS text
 *		(IMMUTABLE STRICT): payidem_secret_aad().
 */
PG_FUNCTION_INFO_V1(payidem_secret_aad_sql);
Datum
payidem_secret_aad_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(payidem_secret_aad(PG_GETARG_TEXT_PP(0), PG_GETARG_INT32(1)));
}

/*
 * A notification's v1 and v2 (_hmac_sign()'s and _notify_v2_sign()'s of
 * msg, "<t>.<payload>", msglen bytes) under one sealed secret, opened once,
 * as 64 lowercase hex each at v1 and v2: what _sign_notification() (notify.c)
 * puts in the header for each secret valid now.
 */
void
payidem_notification_macs(text *aad, int32 key_version, bytea *nonce, bytea *ciphertext, bytea *tag,
						  const char *msg, size_t msglen, char *v1, char *v2)
{
	int			len;
	uint8	   *secret = open_record(aad, key_version, nonce, ciphertext, tag, &len);

	PG_TRY();
	{
		HmacMessage messages[2] = {
			{NULL, 0, msg, msglen},
			{notify_v2_label, sizeof(notify_v2_label), msg, msglen}
		};
		char	   *hex[2] = {v1, v2};

		hmac_hex_all(secret, len, 2, messages, hex);
	}
	PG_FINALLY();
	{
		explicit_bzero(secret, len);
	}
	PG_END_TRY();
}

/*
 * Whether signature (argument 6) is hmac_sealed()'s hex of the same message;
 * compared in constant time (for a signature of the right length).
 */
static bool
hmac_sealed_matches(FunctionCallInfo fcinfo, const char *prefix, size_t prefix_len)
{
	text	   *sig = PG_GETARG_TEXT_PP(6);
	const char *s = VARDATA_ANY(sig);
	char		hex[2 * SHA256_LEN + 1];
	unsigned int diff = 0;
	int			i;

	if (VARSIZE_ANY_EXHDR(sig) != 2 * SHA256_LEN)
		return false;
	hmac_sealed(fcinfo, prefix, prefix_len, hex);
	for (i = 0; i < 2 * SHA256_LEN; i++)
	{
		/* accept upper-case hex: fold A-F to a-f without branching on secret data */
		unsigned char c = (unsigned char) s[i];

		c |= (unsigned char) (((c >= 'A') & (c <= 'F')) << 5);
		diff |= (unsigned int) (c ^ (unsigned char) hex[i]);
	}
	explicit_bzero(hex, sizeof(hex));
	return diff == 0;
}

/*
 * payidem._hmac_sign(aad, key_version, nonce, ciphertext, auth_tag, payload text) RETURNS text
 *		HMAC-SHA256(secret, payload): sign(), and a notification's v1.
 */
PG_FUNCTION_INFO_V1(payidem_hmac_sign);
Datum
payidem_hmac_sign(PG_FUNCTION_ARGS)
{
	char		hex[2 * SHA256_LEN + 1];

	hmac_sealed(fcinfo, NULL, 0, hex);
	PG_RETURN_TEXT_P(cstring_to_text(hex));
}

/*
 * payidem._hmac_verify(aad, key_version, nonce, ciphertext, auth_tag, payload text,
 *                      signature text) RETURNS boolean
 *		Compares in constant time (for a signature of the right length).
 */
PG_FUNCTION_INFO_V1(payidem_hmac_verify);
Datum
payidem_hmac_verify(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(hmac_sealed_matches(fcinfo, NULL, 0));
}

/*
 * payidem._notify_v2_sign(aad, key_version, nonce, ciphertext, auth_tag, message text) RETURNS text
 *		A notification's v2: HMAC-SHA256(secret, "payidem-notification-v2" NUL message),
 *		message being "<t>.<payload>".
 */
PG_FUNCTION_INFO_V1(payidem_notify_v2_sign);
Datum
payidem_notify_v2_sign(PG_FUNCTION_ARGS)
{
	char		hex[2 * SHA256_LEN + 1];

	hmac_sealed(fcinfo, notify_v2_label, sizeof(notify_v2_label), hex);
	PG_RETURN_TEXT_P(cstring_to_text(hex));
}

/*
 * payidem._notify_v2_verify(aad, key_version, nonce, ciphertext, auth_tag, message text,
 *                           signature text) RETURNS boolean
 *		Whether signature is message's v2; compared in constant time.
 */
PG_FUNCTION_INFO_V1(payidem_notify_v2_verify);
Datum
payidem_notify_v2_verify(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(hmac_sealed_matches(fcinfo, notify_v2_label, sizeof(notify_v2_label)));
}

/*
 * payidem._random_code(prefix text, len int) RETURNS text
 *		prefix + len characters of Crockford base32 from pg_strong_random.
 */
PG_FUNCTION_INFO_V1(payidem_random_code);
Datum
payidem_random_code(PG_FUNCTION_ARGS)
{
	static const char alphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
	text	   *prefix = PG_GETARG_TEXT_PP(0);
	int			len = PG_GETARG_INT32(1);
	int			plen = VARSIZE_ANY_EXHDR(prefix);
	uint8		rnd[64];
	char	   *out;
	int			i;

	if (len < 1 || len > 64)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("random code length must be between 1 and 64")));
	if (!pg_strong_random(rnd, len))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random bytes")));
	out = palloc(plen + len + 1);
	memcpy(out, VARDATA_ANY(prefix), plen);
	/* 256 is a multiple of 32: taking 5 bits of a uniform byte stays uniform */
	for (i = 0; i < len; i++)
		out[plen + i] = alphabet[rnd[i] & 31];
	out[plen + len] = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(out));
}

/*
 * payidem._random_secret() RETURNS text — 32 random bytes as 64 lowercase hex.
 */
PG_FUNCTION_INFO_V1(payidem_random_secret);
Datum
payidem_random_secret(PG_FUNCTION_ARGS)
{
	static const char digits[] = "0123456789abcdef";
	uint8		rnd[32];
	char		hex[65];
	text	   *result;
	int			i;

	if (!pg_strong_random(rnd, sizeof(rnd)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random bytes")));
	for (i = 0; i < 32; i++)
	{
		hex[2 * i] = digits[rnd[i] >> 4];
		hex[2 * i + 1] = digits[rnd[i] & 15];
	}
	hex[64] = '\0';
	result = cstring_to_text(hex);
	explicit_bzero(rnd, sizeof(rnd));
	explicit_bzero(hex, sizeof(hex));
	PG_RETURN_TEXT_P(result);
}

/*
 * payidem.master_key_version() RETURNS int — version of the current master
 * key (55000 if it is not configured).  Says nothing about the key itself.
 */
PG_FUNCTION_INFO_V1(payidem_master_key_version);
Datum
payidem_master_key_version(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(current_master_key()->version);
}

/*
 * ---------------------------------------------------------------------------
 * Secrets from files only the server reads
 *
 * set_channel_config() and import_merchant_secret() take the secret as an
 * argument, so it is part of the calling statement: its text, or a bound
 * parameter, which log_statement, log_min_duration_statement,
 * auto_explain.log_verbose (the plan's Output line), debug_print_plan and
 * the like may write to the server log.  load_channel_config() and
 * load_merchant_secret() read it from a file in payidem.secret_dir and hand
 * it to those same functions by a direct call, not a statement: inside them
 * the secret is only ever in PL/pgSQL expressions evaluated without the
 * executor, and only sealed records reach their statements.  The rules of
 * what a configuration or a secret must be stay in those functions.
 * ---------------------------------------------------------------------------
 */

#define SECRET_FILE_MAX (1024 * 1024)

/* payidem.secret_dir/<name>, read whole; NUL-terminated, *len bytes */
static char *
read_secret_file(text *file_name, int *len)
{
	char	   *name;
	char		path[MAXPGPATH];
	struct stat st;
	int			fd;
	char	   *buf;
	size_t		n;
	int			i;

	if (payidem_secret_dir == NULL || payidem_secret_dir[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("payidem.secret_dir is not set"),
				 errhint("Set payidem.secret_dir (superuser) to a directory only the server's user can read, and put the file there.")));
	if (file_name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid secret file name"),
				 errdetail("The file name was NULL.")));
	name = text_to_cstring(file_name);
	n = strlen(name);
	for (i = 0; i < (int) n; i++)
		if (!((name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= 'a' && name[i] <= 'z') ||
			  (name[i] >= '0' && name[i] <= '9') || name[i] == '.' || name[i] == '_' || name[i] == '-'))
			break;
	if (n == 0 || n > 255 || i < (int) n || name[0] == '.')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid secret file name"),
				 errdetail("The file name was %s; it must be a plain name of letters, digits, '.', '_' and '-' (not starting with '.'), of a file in payidem.secret_dir.",
						   payidem_quote_value(name, n))));
	snprintf(path, sizeof(path), "%s/%s", payidem_secret_dir, name);
	/*
	 * The file itself, as the directory holds it: no symbolic link followed.
	 * O_NONBLOCK: the open of a FIFO would otherwise wait for a writer, in a
	 * system call that no statement_timeout, cancel or terminate ends; so it
	 * opens at once and is refused below, as anything but a regular file is.
	 */
	fd = OpenTransientFile(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | PG_BINARY);
	if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_NOT_FOUND),
				 errmsg("secret file %s does not exist", payidem_quote_value(name, n)),
				 errdetail("payidem.secret_dir = '%s' has no file of that name.", payidem_secret_dir)));
	if (fd < 0 && errno == ELOOP)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret file %s is a symbolic link", payidem_quote_value(name, n)),
				 errhint("Copy the secret into a plain file in payidem.secret_dir.")));
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not open secret file %s: %m", payidem_quote_value(name, n))));
	/* checked on the open file: what is read is what was checked */
	if (fstat(fd, &st) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not stat secret file %s: %m", payidem_quote_value(name, n))));
	if (!S_ISREG(st.st_mode))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret file %s is not a regular file", payidem_quote_value(name, n)),
				 errdetail("%s in payidem.secret_dir = '%s' is %s; only a regular file is read.",
						   payidem_quote_value(name, n), payidem_secret_dir,
						   S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)" :
						   S_ISDIR(st.st_mode) ? "a directory" :
						   S_ISSOCK(st.st_mode) ? "a socket" :
						   S_ISCHR(st.st_mode) ? "a character device" :
						   S_ISBLK(st.st_mode) ? "a block device" : "a special file"),
				 errhint("Copy the secret into a plain file in payidem.secret_dir.")));
	/* a regular file: its reads do not block anyway, but read it as any other */
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read secret file %s: %m", payidem_quote_value(name, n))));
	if (st.st_uid != geteuid() || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("secret file %s is accessible to other users", payidem_quote_value(name, n)),
				 errhint("Make it owned by the server's user and chmod 600 it.")));
	if (st.st_size > SECRET_FILE_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret file %s is too large", payidem_quote_value(name, n)),
				 errdetail("It has %lld bytes; at most %d are read.", (long long) st.st_size, SECRET_FILE_MAX)));
	buf = palloc(SECRET_FILE_MAX + 2);
	*len = 0;
	for (;;)
	{
		ssize_t		got = read(fd, buf + *len, SECRET_FILE_MAX + 1 - *len);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
		{
			explicit_bzero(buf, SECRET_FILE_MAX + 2);
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not read secret file %s: %m", payidem_quote_value(name, n))));
		}
		if (got == 0 || *len + got > SECRET_FILE_MAX)
		{
			*len += (int) got;
			break;
		}
		*len += (int) got;
	}
	CloseTransientFile(fd);
	if (*len > SECRET_FILE_MAX || memchr(buf, '\0', *len) != NULL)
	{
		explicit_bzero(buf, SECRET_FILE_MAX + 2);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret file %s is not a text file of at most %d bytes", payidem_quote_value(name, n),
						SECRET_FILE_MAX)));
	}
	buf[*len] = '\0';
	return buf;
}

/* forget a secret read from a file */
static void
forget_secret(char *buf)
{
	explicit_bzero(buf, SECRET_FILE_MAX + 2);
	pfree(buf);
}

/*
 * payidem.<name>(args) by a direct call, not a statement; NULL arguments as
 * given.  *isnull for a NULL result.  The caller needs EXECUTE on it, as
 * for a call in SQL.
 */
static Datum
call_payidem(const char *name, int nargs, Oid *argtypes, Datum *values, bool *nulls, bool *isnull)
{
	Oid			fn = LookupFuncName(list_make2(makeString("payidem"), makeString(pstrdup(name))),
									nargs, argtypes, false);
	FmgrInfo	flinfo;
	LOCAL_FCINFO(call, FUNC_MAX_ARGS);
	Datum		result;
	int			i;

	/* what the caller could not call, it cannot have called for it */
	if (ProcAclCheckCompat(fn, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, get_func_name(fn));
	fmgr_info(fn, &flinfo);
	InitFunctionCallInfoData(*call, &flinfo, nargs, InvalidOid, NULL, NULL);
	for (i = 0; i < nargs; i++)
	{
		call->args[i].value = values[i];
		call->args[i].isnull = nulls[i];
	}
	result = FunctionCallInvoke(call);
	*isnull = call->isnull;
	return result;
}

/*
 * payidem.load_channel_config(channel_no text, file_name text) RETURNS void
 *		set_channel_config(channel_no, <the file's JSON object>).
 */
PG_FUNCTION_INFO_V1(payidem_load_channel_config);
Datum
payidem_load_channel_config(PG_FUNCTION_ARGS)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Oid			argtypes[2] = {TEXTOID, JSONBOID};
	Datum		values[2];
	bool		nulls[2] = {PG_ARGISNULL(0), false};
	bool		isnull;
	int			len;
	char	   *buf;
	volatile Datum config = (Datum) 0;
	volatile bool parsed = true;

	buf = read_secret_file(PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1), &len);

	/*
	 * jsonb_in's errors quote the text they could not parse: caught, and
	 * replaced by one that names only the file (a subtransaction, as a
	 * PL/pgSQL exception block, undoes what the failed call left).
	 */
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		config = DirectFunctionCall1(jsonb_in, CStringGetDatum(buf));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		parsed = false;
	}
	PG_END_TRY();
	forget_secret(buf);
	if (!parsed)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret file %s does not hold valid JSON",
						payidem_quote_value(VARDATA_ANY(PG_GETARG_TEXT_PP(1)), VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(1)))),
				 errdetail("Its text is not shown: it holds a secret."),
				 errhint("It must hold one JSON object, e.g. {\"app_id\": \"...\", \"private_key\": \"...\"}.")));
	values[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	values[1] = config;
	(void) call_payidem("set_channel_config", 2, argtypes, values, nulls, &isnull);
	PG_RETURN_VOID();
}

/*
 * payidem.load_merchant_secret(merchant_no text, file_name text,
 *     grace interval DEFAULT '24 hours') RETURNS text
 *		import_merchant_secret(merchant_no, <the file's text, one final line
 *		end dropped>, grace).
 */
PG_FUNCTION_INFO_V1(payidem_load_merchant_secret);
Datum
payidem_load_merchant_secret(PG_FUNCTION_ARGS)
{
	Oid			argtypes[3] = {TEXTOID, TEXTOID, INTERVALOID};
	Datum		values[3];
	bool		nulls[3] = {PG_ARGISNULL(0), false, PG_ARGISNULL(2)};
	bool		isnull;
	int			len;
	char	   *buf;
	text	   *secret;
	Datum		result;

	buf = read_secret_file(PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1), &len);
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	if (len > 0 && buf[len - 1] == '\r')
		len--;
	secret = cstring_to_text_with_len(buf, len);
	forget_secret(buf);

	values[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	values[1] = PointerGetDatum(secret);
	values[2] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	result = call_payidem("import_merchant_secret", 3, argtypes, values, nulls, &isnull);
	explicit_bzero(VARDATA(secret), VARSIZE(secret) - VARHDRSZ);
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

