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
typedef enum PayidemRelation
{
	PAYIDEM_ORDER,
	PAYIDEM_PAYMENT,
	PAYIDEM_PAYMENT_PENDING,
	PAYIDEM_PAYMENT_PAID,
	PAYIDEM_MERCHANT,
	PAYIDEM_CHANNEL,
	PAYIDEM_MERCHANT_CHANNEL,
	PAYIDEM_IDEMPOTENCY,
	PAYIDEM_ORDER_EXPIRY,
	PAYIDEM_STATE,
	PAYIDEM_TRANSITION,
	PAYIDEM_STATUS_LOG,
	PAYIDEM_NOTIFY_EVENT,
	PAYIDEM_REFUND,
	PAYIDEM_STATUS_LOG_LOG_ID_SEQ,
	PAYIDEM_ORDER_NO_HWM,
	PAYIDEM_ORDER_PKEY,
	PAYIDEM_PAYMENT_PKEY,
	PAYIDEM_PAYMENT_TRANSACTION_KEY,
	PAYIDEM_PAYMENT_ONE_PENDING_PER_ORDER,
	PAYIDEM_PAYMENT_CHANNEL_PAID,
	PAYIDEM_MERCHANT_PKEY,
	PAYIDEM_CHANNEL_PKEY,
	PAYIDEM_MERCHANT_CHANNEL_PKEY,
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

extern int	payidem_attnum(TupleDesc desc, const char *name);
extern int	payidem_column(Relation rel, const char *name);

/* column name of a tuple of rel, one of payidem's own tables */
static inline Datum
payidem_getattr(Relation rel, HeapTuple tuple, const char *name, bool *isnull)
{
	return heap_getattr(tuple, payidem_column(rel, name), RelationGetDescr(rel), isnull);
}

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

#endif							/* PAYIDEM_CATALOG_H */
