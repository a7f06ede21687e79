/*-------------------------------------------------------------------------
 *
 * order_no.h
 *		The order-number generator (order_no.c): its shared-memory state,
 *		its GUCs, and the notification event ids it issues.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_ORDER_NO_H
#define PAYIDEM_ORDER_NO_H

#include "storage/spin.h"

/*
 * Databases whose reservation shared memory keeps at once (16 bytes each);
 * beyond that the oldest reservation's slot is recycled.  A database that
 * lost its slot reloads its mark, which the server-wide mark covers, and
 * goes on from the logical second.  The
 * slots are looked up under the spinlock by reserve() only (a reservation,
 * about once per 10 s per database, and a backend's first number), from the
 * database's home slot (order_no.c): one or a few are read while fewer
 * databases than slots have issued numbers since the server started, all of
 * them once every slot is taken (a dropped database's slot is not freed).
 * The fast path indexes its slot directly.
 */
#define ORDER_NO_MAX_DATABASES	1024

/* seconds reserved ahead in the durable high-water mark */
#define ORDER_NO_RESERVE_SECONDS	10

/*
 * Notification event ids come from the same logical second as numbers, so
 * they keep every guarantee numbers have, failover included, with a seq of
 * their own: ((second - EVENT_ID_EPOCH) * EVENT_ID_PER_SECOND + seq) * 100 +
 * shard.  Past EVENT_ID_PER_SECOND events in a second, the next moves the
 * logical second on (borrowed, as past 1,000,000 numbers).  The ids stay below 2^53 (a JSON number a JavaScript
 * receiver reads exactly) until 2083; the shard's two digits stay last, where
 * the router finds them.
 */
#define EVENT_ID_EPOCH			INT64CONST(1767225600)	/* 2026-01-01 00:00:00 UTC */
#define EVENT_ID_PER_SECOND		50000

/*
 * The server-wide high-water mark, in the data directory: the highest
 * reservation of any database, read when shared memory is (re)built, and
 * the timeline it was written on ("<mark> <timeline>"; 1.0 wrote the mark
 * alone).  A server whose timeline differs from the file's (a promoted
 * standby, a restored backup: the file came with the base backup, never
 * through WAL) moves its numbers past max(clock, marks) + promotion_gap.
 */
#define ORDER_NO_MARK_FILE		"payidem_order_no.mark"

/*
 * Per-database reservation.  Every number issued in database dboid has a
 * logical second < reserved_until, and reserved_until is durable (WAL-logged
 * and flushed) in that database's sequence payidem.order_no_hwm before any
 * number under it is returned.
 */
typedef struct OrderNoDbSlot
{
	Oid			dboid;			/* InvalidOid = free */
	Oid			seqoid;			/* the database's order_no_hwm when loaded */
	int64		reserved_until; /* first second not covered */
} OrderNoDbSlot;

typedef struct OrderNoShared
{
	slock_t		mutex;			/* protects everything below */
	int64		last_second;	/* logical second of the last number issued */
	int32		last_seq;		/* its seq (-1: none issued in last_second) */
	int64		event_second;	/* second of the last event id (<= last_second) */
	int32		event_seq;		/* its seq, below EVENT_ID_PER_SECOND */
	int64		last_wall;		/* wall-clock second seen by the last call */
	uint64		rollbacks;		/* clock rollbacks absorbed (read to notice one
								 * handled meanwhile; counted in stats() too) */
	int64		server_mark;	/* what ORDER_NO_MARK_FILE durably holds */
	uint32		mark_tli;		/* the timeline it was written on (0: unknown) */
	uint32		checked_tli;	/* timeline last checked for a promotion */
	bool		jumped;			/* this lifetime took a promotion's jump */
	OrderNoDbSlot slots[ORDER_NO_MAX_DATABASES];
} OrderNoShared;

extern void order_no_shmem_init(OrderNoShared *state);
extern int	payidem_shard_id;
extern void order_no_define_gucs(void);
/* a notification event id, unique across failovers as numbers are */
extern int64 order_no_next_event_id(void);

/* payidem.gen_order_no(prefix text), for C callers */
extern Datum payidem_gen_order_no(PG_FUNCTION_ARGS);

#endif							/* PAYIDEM_ORDER_NO_H */
