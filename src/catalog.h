/*-------------------------------------------------------------------------
 *
 * catalog.h
 *		payidem's own tables, sequences and indexes, resolved once per
 *		backend; their owner and the one way to act as it (catalog.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_CATALOG_H
#define PAYIDEM_CATALOG_H

#include "access/htup_details.h"
#include "access/tupdesc.h"
#include "miscadmin.h"
#include "utils/rel.h"

/* the relations payidem's C code reads or writes, in schema payidem */
#define PAYIDEM_RELATIONS(X) \
	X(ORDER, "order") \
	X(PAYMENT, "payment") \
	X(PAYMENT_PENDING, "payment_pending") \
	X(PAYMENT_PAID, "payment_paid") \
	X(MERCHANT, "merchant") \
	X(CHANNEL, "channel") \
	X(MERCHANT_CHANNEL, "merchant_channel") \
	X(MERCHANT_SECRET, "merchant_secret") \
	X(IDEMPOTENCY, "idempotency") \
	X(ORDER_EXPIRY, "order_expiry") \
	X(STATE, "state") \
	X(TRANSITION, "transition") \
	X(STATUS_LOG, "status_log") \
	X(NOTIFY_EVENT, "notify_event") \
	X(REFUND, "refund") \
	X(PAYOUT, "payout") \
	X(STATUS_LOG_LOG_ID_SEQ, "status_log_log_id_seq") \
	X(ORDER_NO_HWM, "order_no_hwm") \
	X(ORDER_PKEY, "order_pkey") \
	X(PAYMENT_PKEY, "payment_pkey") \
	X(PAYMENT_TRANSACTION_KEY, "payment_transaction_key") \
	X(PAYMENT_ONE_PENDING_PER_ORDER, "payment_one_pending_per_order") \
	X(PAYMENT_CHANNEL_PAID, "payment_channel_paid") \
	X(MERCHANT_PKEY, "merchant_pkey") \
	X(CHANNEL_PKEY, "channel_pkey") \
	X(MERCHANT_CHANNEL_PKEY, "merchant_channel_pkey") \
	X(MERCHANT_SECRET_PKEY, "merchant_secret_pkey") \
	X(NOTIFY_EVENT_PKEY, "notify_event_pkey") \
	X(NOTIFY_EVENT_DUE, "notify_event_due") \
	X(ORDER_OUT_TRADE_NO_KEY, "order_out_trade_no_key") \
	X(ORDER_EXPIRY_PKEY, "order_expiry_pkey")

#define PAYIDEM_RELATION_ENUM(id, name) PAYIDEM_##id,
typedef enum PayidemRelation
{
	PAYIDEM_RELATIONS(PAYIDEM_RELATION_ENUM)
	PAYIDEM_NUM_RELATIONS
} PayidemRelation;

/* the OIDs and owners found so far (InvalidOid: not yet, or stale) */
extern Oid	payidem_relids[PAYIDEM_NUM_RELATIONS];
extern Oid	payidem_owners[PAYIDEM_NUM_RELATIONS];

extern Oid	payidem_lookup_relation(PayidemRelation rel, bool missing_ok);
extern Oid	payidem_lookup_owner(PayidemRelation rel);
extern const char *payidem_relation_name(PayidemRelation rel);

/* OID of payidem.<rel>; 55000 if the extension is not installed */
static inline Oid
payidem_relation(PayidemRelation rel)
{
	Oid			relid = payidem_relids[rel];

	return OidIsValid(relid) ? relid : payidem_lookup_relation(rel, false);
}

/* the owner of payidem.<rel> (the extension's owner) */
static inline Oid
payidem_owner(PayidemRelation rel)
{
	Oid			owner = payidem_owners[rel];

	return OidIsValid(owner) ? owner : payidem_lookup_owner(rel);
}

/*
 * The domains of payidem's schema that C checks an argument against (the
 * format is written once, in the domain): payidem_type(PAYIDEM_TYPE_x),
 * found by name and kept, forgotten when a type or a schema changes.
 */
#define PAYIDEM_TYPES(X) \
	X(MERCHANT_REF, "merchant_ref") \
	X(ORDER_SUBJECT, "order_subject") \
	X(ORDER_BODY, "order_body") \
	X(HTTP_URL, "http_url")

#define PAYIDEM_TYPE_ENUM(id, name) PAYIDEM_TYPE_##id,
typedef enum PayidemType
{
	PAYIDEM_TYPES(PAYIDEM_TYPE_ENUM)
	PAYIDEM_NUM_TYPES
} PayidemType;

extern Oid	payidem_typids[PAYIDEM_NUM_TYPES];
extern Oid	payidem_lookup_type(PayidemType type);

static inline Oid
payidem_type(PayidemType type)
{
	Oid			typid = payidem_typids[type];

	return OidIsValid(typid) ? typid : payidem_lookup_type(type);
}

extern int	payidem_attnum(TupleDesc desc, const char *name);
extern int	payidem_column(Relation rel, const char *name);

/* column name of a tuple of rel, one of payidem's own tables */
static inline Datum
payidem_getattr(Relation rel, HeapTuple tuple, const char *name, bool *isnull)
{
	return heap_getattr(tuple, payidem_column(rel, name), RelationGetDescr(rel), isnull);
}

extern char *payidem_getattr_text(Relation rel, HeapTuple tuple, const char *name);

/* a tuple taken apart once for several of its columns (payidem_row_deform()) */
typedef struct PayidemRow
{
	Relation	rel;
	Datum	   *values;
	bool	   *nulls;
} PayidemRow;

extern void payidem_row_deform(PayidemRow *row, Relation rel, HeapTuple tuple);
extern Datum payidem_row_get(const PayidemRow *row, const char *name, bool *isnull);
extern char *payidem_row_text(const PayidemRow *row, const char *name);
extern void payidem_row_free(PayidemRow *row);
extern Oid	payidem_base_type(Oid type);

/* acting as the tables' owner, and back */
typedef struct PayidemAsOwner
{
	Oid			userid;
	int			sec_context;
} PayidemAsOwner;

/*
 * Act as owner (the tables' owner, for a function any role may call), with
 * sec_flags (SECURITY_NOFORCE_RLS, SECURITY_RESTRICTED_OPERATION, or 0)
 * added to the security context; the caller's identity in *save, restored
 * by payidem_become_caller() or by the (sub)transaction's abort on an error.
 * The one way payidem's C code becomes the owner.
 */
static inline void
payidem_become_owner(Oid owner, int sec_flags, PayidemAsOwner *save)
{
	GetUserIdAndSecContext(&save->userid, &save->sec_context);
	SetUserIdAndSecContext(owner, save->sec_context | SECURITY_LOCAL_USERID_CHANGE | sec_flags);
}

static inline void
payidem_become_caller(const PayidemAsOwner *save)
{
	SetUserIdAndSecContext(save->userid, save->sec_context);
}

extern void payidem_begin_as_owner(Oid owner, PayidemAsOwner *save);
extern void payidem_end_as_owner(const PayidemAsOwner *save);

/* search_path pinned while acting as the owner (catalog.c) */
extern int	payidem_pin_search_path(void);
extern void payidem_unpin_search_path(int level);

#endif							/* PAYIDEM_CATALOG_H */
