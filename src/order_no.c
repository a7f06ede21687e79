/*-------------------------------------------------------------------------
 *
 * order_no.c
 *		gen_order_no(), order_no_valid(), order_no_parse(): order numbers
 *		that never repeat in a database — across concurrent sessions, backend
 *		and server crashes, and a wall clock that moves backwards.
 *
 * The logical (second, seq) pair lives in shared memory.  Each call takes its
 * spinlock once: the next number is (wall second, 0) if the clock moved past
 * the last second issued, else (last second, seq + 1), else — the second's
 * 1,000,000 numbers used up — (last second + 1, 0).  So the time part never
 * lags the clock and runs ahead of it only after a clock rollback or beyond
 * 1,000,000 numbers a second.
 *
 * Durability: each database keeps a high-water mark in its sequence
 * payidem.order_no_hwm.  A number of second S is handed out only once the
 * mark is > S and the WAL record that set it is flushed; reservations reach
 * ORDER_NO_RESERVE_SECONDS ahead, so the I/O happens about once per that many
 * seconds and never under the spinlock.  When shared memory is new (server
 * start, or rebuilt after a crashed backend) the logical second starts at
 * the server-wide mark below; the first call in a database reads its mark,
 * and one the server never wrote moves the logical second past it and
 * payidem.promotion_gap (a promotion, a restored backup), so numbers continue
 * above everything issued before, committed or not.  Every reservation also
 * raises a server-wide mark, the file ORDER_NO_MARK_FILE in the data
 * directory (written and fsynced before any number under it is used), which
 * shared memory starts from: after a crash, a database whose own mark is
 * older, or one whose extension was dropped and created again, still issues
 * above every number of the server.
 *
 * Locking: OrderNoShared.mutex (spinlock) for the (second, seq) state, the
 * counters and the reservation slots — held for a few instructions, never
 * across I/O.  Writing a mark takes a ShareUpdateExclusiveLock (self-
 * conflicting, interruptible) on the database's order_no_hwm sequence, so
 * only one backend per database writes at a time and marks never go down.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <time.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "common/int.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "catalog.h"
#include "errcodes.h"
#include "inval.h"
#include "order_no.h"
#include "order_no_codec.h"
#include "replication.h"
#include "shmem.h"
#include "util.h"

/* payidem.shard_id: the two shard digits of every number issued here */
int			payidem_shard_id = 0;

/* slot of this backend's database in the shared array, -1 = look it up */
static int	my_slot = -1;

/*
 * OID of this database's order_no_hwm as last looked up; InvalidOid once a
 * relcache invalidation says it may have changed (DROP/CREATE EXTENSION).
 * The fast path only uses a slot loaded from this very sequence.
 */
static Oid	my_seqoid = InvalidOid;
static bool callback_registered = false;

static void
hwm_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == my_seqoid)
		my_seqoid = InvalidOid;
}

void
order_no_define_gucs(void)
{
	DefineCustomIntVariable("payidem.shard_id",
							gettext_noop("Shard number written into every order number (00-99)."),
							gettext_noop("Give each database that issues numbers for one platform its own value; "
										 "set it per database with ALTER DATABASE ... SET payidem.shard_id."),
							&payidem_shard_id,
							0, 0, ORDER_NO_SHARD_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}

/*
 * The server-wide mark as ORDER_NO_MARK_FILE holds it, and the timeline it
 * was written on (0 if the file does not say); 0 if there is none yet.  Runs
 * in the postmaster when shared memory is (re)built.
 */
static int64
read_mark_file(uint32 *tli)
{
	FILE	   *f = AllocateFile(ORDER_NO_MARK_FILE, "r");
	char		buf[64];
	char	   *end;
	int64		mark;
	int64		t = 0;

	*tli = 0;
	if (f == NULL)
	{
		if (errno != ENOENT)
			ereport(WARNING,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", ORDER_NO_MARK_FILE),
					 errdetail("Order numbers continue above each database's own mark only.")));
		return 0;
	}
	if (fgets(buf, sizeof(buf), f) == NULL)
		buf[0] = '\0';
	FreeFile(f);
	errno = 0;
	mark = strtoi64(buf, &end, 10);
	if (errno == 0 && end != buf && *end == ' ')
	{
		char	   *tstart = end + 1;

		t = strtoi64(tstart, &end, 10);
		if (end == tstart || t <= 0 || t > PG_UINT32_MAX)
			errno = EINVAL;
	}
	if (errno != 0 || end == buf || (*end != '\n' && *end != '\0') || mark < 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("file \"%s\" does not hold a high-water mark", ORDER_NO_MARK_FILE),
				 errdetail("Order numbers continue above each database's own mark only."),
				 errhint("The next reservation writes the file again.")));
		return 0;
	}
	*tli = (uint32) t;
	return mark;
}

/*
 * Write the server-wide mark and its timeline durably: a new file, fsynced,
 * renamed over the old.
 */
static void
write_mark_file(int64 mark, uint32 tli)
{
	const char *tmp = ORDER_NO_MARK_FILE ".tmp";
	char		buf[48];
	int			len = snprintf(buf, sizeof(buf), INT64_FORMAT " %u\n", mark, tli);
	int			fd = OpenTransientFile(tmp, O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY);

	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not create file \"%s\": %m", tmp)));
	errno = 0;
	if (write(fd, buf, len) != len)
	{
		if (errno == 0)
			errno = ENOSPC;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not write file \"%s\": %m", tmp)));
	}
	if (pg_fsync(fd) != 0)
		ereport(data_sync_elevel(ERROR),
				(errcode_for_file_access(),
				 errmsg("could not fsync file \"%s\": %m", tmp)));
	if (CloseTransientFile(fd) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not close file \"%s\": %m", tmp)));
	(void) durable_rename(tmp, ORDER_NO_MARK_FILE, ERROR);
}

/*
 * Raise the server-wide mark to at least `target` before numbers under it
 * are used, and record the current timeline with it (the first reservation
 * after a promotion writes the file even if its mark is high enough, so a
 * restart does not take the promotion's jump again).  One writer at a time
 * in the whole server: a transaction-level advisory lock of database 0,
 * which no SQL-level advisory lock can take.
 */
static void
raise_server_mark(int64 target)
{
	OrderNoShared *s = &payidem_shared->order_no;
	uint32		tli = (uint32) GetWALInsertionTimeLine();
	LOCKTAG		tag;
	bool		current;

	SpinLockAcquire(&s->mutex);
	current = s->server_mark >= target && s->mark_tli == tli;
	SpinLockRelease(&s->mutex);
	if (current)
		return;

	SET_LOCKTAG_ADVISORY(tag, InvalidOid, 0x70617969, 0x64656d00, 3);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	SpinLockAcquire(&s->mutex);
	current = s->server_mark >= target && s->mark_tli == tli;
	target = Max(target, s->server_mark);
	SpinLockRelease(&s->mutex);
	if (!current)
	{
		write_mark_file(target, tli);
		SpinLockAcquire(&s->mutex);
		if (s->server_mark < target)
			s->server_mark = target;
		s->mark_tli = tli;
		SpinLockRelease(&s->mutex);
	}
	LockRelease(&tag, ExclusiveLock, false);
}

void
order_no_shmem_init(OrderNoShared *state)
{
	uint32		tli;
	int64		mark = read_mark_file(&tli);

	SpinLockInit(&state->mutex);
	/* every number issued before in this data directory is below the mark */
	state->server_mark = mark;
	state->mark_tli = tli;
	state->checked_tli = 0;
	state->jumped = false;
	state->last_second = mark;
	state->last_seq = -1;
	state->event_second = 0;
	state->event_seq = -1;
	state->last_wall = 0;
	state->rollbacks = 0;
	memset(state->slots, 0, sizeof(state->slots));
}

static inline int64
wall_second(void)
{
	return (int64) time(NULL);
}

/*
 * The slots are an open-addressing table: a database's slot is the first
 * free one at or after its home, dboid modulo ORDER_NO_MAX_DATABASES, when
 * it is claimed.  A slot is never freed (only taken over by another
 * database once all are in use), so every slot between a database's home
 * and its own stays in use, and a look-up stops at the first free slot: with
 * fewer databases than slots it reads one or a few, not the whole array,
 * under the spinlock that every number's fast path takes.
 */
#define HOME_SLOT(dboid)	((int) ((dboid) % ORDER_NO_MAX_DATABASES))

/* index of dboid's slot, or -1; caller holds the spinlock */
static int
find_slot(OrderNoShared *s, Oid dboid)
{
	int			i;
	int			n;

	for (n = 0, i = HOME_SLOT(dboid); n < ORDER_NO_MAX_DATABASES;
		 n++, i = (i + 1) % ORDER_NO_MAX_DATABASES)
	{
		if (s->slots[i].dboid == dboid)
			return i;
		if (s->slots[i].dboid == InvalidOid)
			break;
	}
	return -1;
}

/*
 * Take a slot for dboid (not in the table): the first free one from its
 * home, else, every slot in use, the one with the oldest reservation (it
 * only caches that database's mark; the database reloads it on next use).
 * Caller holds the spinlock.
 */
static int
claim_slot(OrderNoShared *s, Oid dboid)
{
	int			i;
	int			n;
	int			victim = -1;

	for (n = 0, i = HOME_SLOT(dboid); n < ORDER_NO_MAX_DATABASES;
		 n++, i = (i + 1) % ORDER_NO_MAX_DATABASES)
	{
		if (s->slots[i].dboid == InvalidOid)
		{
			victim = i;
			break;
		}
	}
	if (victim < 0)
	{
		victim = 0;
		for (i = 1; i < ORDER_NO_MAX_DATABASES; i++)
			if (s->slots[i].reserved_until < s->slots[victim].reserved_until)
				victim = i;
	}
	s->slots[victim].dboid = dboid;
	s->slots[victim].seqoid = InvalidOid;
	s->slots[victim].reserved_until = 0;
	return victim;
}

static void
warn_rollback(int64 from, int64 to, bool at_start)
{
	char		frombuf[MAXDATELEN + 1];
	char		tobuf[MAXDATELEN + 1];

	strlcpy(frombuf, timestamptz_to_str(time_t_to_timestamptz((pg_time_t) from)), sizeof(frombuf));
	strlcpy(tobuf, timestamptz_to_str(time_t_to_timestamptz((pg_time_t) to)), sizeof(tobuf));
	ereport(WARNING,
			(errmsg("system clock moved backwards; order numbers continue from the last issued second"),
			 at_start
			 ? errdetail("The clock reads %s, behind the high-water mark %s stored before the restart.",
						 tobuf, frombuf)
			 : errdetail("The clock went from %s back to %s.", frombuf, tobuf),
			 errhint("Numbers stay unique and increasing; their time part runs ahead of the clock until it catches up. Check the server's time synchronisation.")));
}

/*
 * Owner of the sequence; refuses a sequence created by the current
 * transaction: a mark written there would vanish if the transaction rolled
 * back, while the numbers issued under it would not.
 */
static Oid
hwm_owner(Oid seqoid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(seqoid));
	Oid			owner;
	bool		created_here;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", seqoid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	created_here = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tup->t_data));
	ReleaseSysCache(tup);
	if (created_here)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot issue order numbers in the transaction that installed payidem"),
				 errdetail("The durable high-water mark of order numbers would be lost if this transaction rolled back."),
				 errhint("Commit CREATE EXTENSION payidem first.")));
	return owner;
}

/*
 * Numbers from someone else's WAL.  A server that was promoted (or restored
 * from a backup, or a standby started as a primary) may hold less than the
 * old primary issued: the WAL that carried the rest never came (asynchronous
 * replication, a lagging standby, a backup's end), and the old primary's
 * clock may run ahead of ours.  Its numbers then start past base +
 * payidem.promotion_gap, base being the latest second known to have been
 * used elsewhere (the clock, and the marks that arrived): unique while the
 * clocks differ by less than the gap and the old primary is fenced.  Called
 * under the spinlock; true if the logical second moved.
 */
static bool
take_gap(OrderNoShared *s, int64 base)
{
	int64		floor = base + payidem_promotion_gap;

	if (s->last_second >= floor)
		return false;
	s->last_second = floor;
	s->last_seq = -1;
	return true;
}

/* the jump is counted once in the life of shared memory; logged each time */
static void
report_gap(bool first, int64 floor, const char *detail)
{
	char		floorbuf[MAXDATELEN + 1];

	if (first)
		payidem_count(PAYIDEM_PROMOTION_JUMPS);
	strlcpy(floorbuf, timestamptz_to_str(time_t_to_timestamptz((pg_time_t) floor)), sizeof(floorbuf));
	ereport(LOG,
			(errmsg("order numbers and event ids of this promoted server start at %s", floorbuf),
			 errdetail_internal("%s", detail),
			 errhint("Numbers stay unique while the old primary is stopped and the hosts' clocks differ by less than payidem.promotion_gap (%d s).",
					 payidem_promotion_gap)));
}

/*
 * Once per timeline in the life of shared memory: a server on another
 * timeline than the one its mark file was written on was promoted (or
 * restored by archive recovery): its numbers start past max(clock, every
 * mark it holds) + the gap.  Timeline 1 with no timeline in the file is a
 * server that was never promoted.
 */
static void
check_promotion(void)
{
	OrderNoShared *s = &payidem_shared->order_no;
	uint32		tli = (uint32) GetWALInsertionTimeLine();
	int64		now = wall_second();
	int64		base = 0;
	uint32		file_tli = 0;
	bool		promoted = false;
	bool		first = false;

	SpinLockAcquire(&s->mutex);
	if (s->checked_tli != tli)
	{
		s->checked_tli = tli;
		file_tli = s->mark_tli;
		if (tli > 1 && file_tli != tli)
		{
			promoted = true;
			base = Max(Max(now, s->server_mark), s->last_second);
			(void) take_gap(s, base);
			first = !s->jumped;
			s->jumped = true;
		}
	}
	SpinLockRelease(&s->mutex);
	if (promoted)
	{
		char		basebuf[MAXDATELEN + 1];

		strlcpy(basebuf, timestamptz_to_str(time_t_to_timestamptz((pg_time_t) base)), sizeof(basebuf));
		report_gap(first, base + payidem_promotion_gap,
				   psprintf("The server is on timeline %u, its high-water mark was written on timeline %u: "
							"numbers continue past the later of the clock and the marks (%s) plus payidem.promotion_gap.",
							tli, file_tli, basebuf));
	}
}

/*
 * Make sure this database's slot is loaded and its reservation covers
 * second `wanted`.  Does the I/O: reads the stored mark when the slot is
 * new, writes and flushes a new mark when the reservation runs out.
 */
static void
reserve(int64 wanted)
{
	OrderNoShared *s = &payidem_shared->order_no;
	Oid			seqoid;
	PayidemAsOwner as_owner;
	int			slot;
	bool		loaded;
	int64		now;
	int64		mark = 0;
	int64		target;
	int64		covered;
	int64		needed;
	bool		rolled_back = false;
	bool		foreign = false;
	bool		foreign_first = false;

	if (!callback_registered)
	{
		payidem_register_relcache_callback(hwm_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	check_promotion();

	/*
	 * One writer per database; waits are interruptible and deadlock-checked.
	 * Look the sequence up again once locked: a concurrent DROP EXTENSION may
	 * have replaced it while we waited.
	 */
	for (;;)
	{
		seqoid = payidem_relation(PAYIDEM_ORDER_NO_HWM);
		LockRelationOid(seqoid, ShareUpdateExclusiveLock);
		if (payidem_relation(PAYIDEM_ORDER_NO_HWM) == seqoid)
			break;
		UnlockRelationOid(seqoid, ShareUpdateExclusiveLock);
	}
	/* the sequence belongs to the extension's owner, not to the caller */
	payidem_become_owner(hwm_owner(seqoid), SECURITY_RESTRICTED_OPERATION, &as_owner);

	/* a slot loaded from another sequence (extension re-created) must reload */
	SpinLockAcquire(&s->mutex);
	slot = find_slot(s, MyDatabaseId);
	loaded = slot >= 0 && s->slots[slot].seqoid == seqoid;
	SpinLockRelease(&s->mutex);

	if (!loaded)
	{
		Datum		last;
		LOCAL_FCINFO(fcinfo, 1);

		/* pg_sequence_last_value() returns NULL for a never-set sequence */
		InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
		fcinfo->args[0].value = ObjectIdGetDatum(seqoid);
		fcinfo->args[0].isnull = false;
		last = pg_sequence_last_value(fcinfo);
		mark = fcinfo->isnull ? 0 : DatumGetInt64(last);

		now = wall_second();
		SpinLockAcquire(&s->mutex);
		slot = find_slot(s, MyDatabaseId);
		if (slot < 0 || s->slots[slot].seqoid != seqoid)
		{
			if (slot < 0)
				slot = claim_slot(s, MyDatabaseId);
			s->slots[slot].seqoid = seqoid;
			s->slots[slot].reserved_until = mark;
			/*
			 * Every earlier number of this database is below its mark.  A
			 * mark this server's mark file covers needs no move: the numbers
			 * of this lifetime are below the logical second, those of earlier
			 * ones below the file's mark it started from (this database's own
			 * reservation when its slot was recycled, a database cloned from
			 * another, a new installation's first mark).  A mark above
			 * everything the file ever held was not written here (each
			 * reservation raises the file before it is used): it came with
			 * WAL or a backup from a server that may have gone on past it (a
			 * promoted standby, a restored backup, a standby started as a
			 * primary without archive recovery, a dump restored on another
			 * server), so numbers go on past it and the promotion's gap.
			 */
			if (mark > s->server_mark)
			{
				foreign = take_gap(s, Max(mark, now));
				if (foreign)
				{
					foreign_first = !s->jumped;
					s->jumped = true;
				}
			}
			/* behind even the start of the last reservation: a rollback */
			if (!foreign && mark > 0 && now < mark - ORDER_NO_RESERVE_SECONDS)
			{
				s->rollbacks++;
				rolled_back = true;
			}
			if (s->last_wall < now)
				s->last_wall = now;
		}
		SpinLockRelease(&s->mutex);
		if (foreign)
		{
			char		markbuf[MAXDATELEN + 1];

			strlcpy(markbuf, timestamptz_to_str(time_t_to_timestamptz((pg_time_t) mark)), sizeof(markbuf));
			report_gap(foreign_first, Max(mark, now) + payidem_promotion_gap,
					   psprintf("Database \"%s\" holds the high-water mark %s, which this server did not write "
								"(a promoted standby, a restored backup): numbers continue past it plus payidem.promotion_gap.",
								get_database_name(MyDatabaseId), markbuf));
		}
		else if (rolled_back)
		{
			payidem_count(PAYIDEM_CLOCK_ROLLBACKS);
			warn_rollback(mark - ORDER_NO_RESERVE_SECONDS, now, true);
		}
	}

	/* the next number's second is at most max(wanted, clock, last second) */
	now = wall_second();
	SpinLockAcquire(&s->mutex);
	covered = s->slots[slot].reserved_until;
	needed = Max(Max(wanted, now), s->last_second);
	SpinLockRelease(&s->mutex);
	/*
	 * Reserve ahead of the clock, not of the logical second: after a crash
	 * the logical second starts at the old mark, ahead of the clock, and a
	 * reservation measured from it would push each later mark (and the lead
	 * after the next crash) further ahead.
	 */
	target = Max(needed + 1, now + ORDER_NO_RESERVE_SECONDS);

	if (covered <= needed)
	{
		/*
		 * setval() WAL-logs at once; flush before any number under it is
		 * used, and wait for the synchronous standbys to have it too: other
		 * sessions draw from the reservation at once, whether or not their
		 * own transaction ever commits (replication.c).
		 */
		DirectFunctionCall2(setval_oid, ObjectIdGetDatum(seqoid), Int64GetDatum(target));
		XLogFlush(XactLastRecEnd);
		payidem_wait_for_synchronous_standbys(XactLastRecEnd);
		raise_server_mark(target);

		SpinLockAcquire(&s->mutex);
		if (s->slots[slot].dboid == MyDatabaseId && s->slots[slot].reserved_until < target)
			s->slots[slot].reserved_until = target;
		SpinLockRelease(&s->mutex);
		payidem_count(PAYIDEM_ORDER_NO_RESERVATIONS);
	}

	payidem_become_caller(&as_owner);
	UnlockRelationOid(seqoid, ShareUpdateExclusiveLock);
	my_slot = slot;
	my_seqoid = seqoid;
}

/*
 * Issue the next (second, seq) of a number, or of an event id (for_event):
 * both in the logical second, each with a seq of its own.  Fast path: one
 * spinlock round trip, no I/O.
 */
static void
next_number(bool for_event, int64 *second_out, int *seq_out)
{
	OrderNoShared *s = &payidem_shared->order_no;

	for (;;)
	{
		uint64		rollbacks_seen;
		int64		now;
		int64		second = 0;
		int			seq = 0;
		bool		usable;
		bool		rolled_back = false;
		bool		borrowed = false;
		int64		rolled_from = 0;

		/*
		 * The clock is read outside the spinlock.  If another backend handled
		 * a rollback between our reading and our taking the lock, our reading
		 * may predate the rollback: read again under the lock, or we would
		 * move last_wall forward and make the next caller report the same
		 * rollback again.
		 */
		rollbacks_seen = *((volatile uint64 *) &s->rollbacks);
		pg_read_barrier();
		now = wall_second();

		SpinLockAcquire(&s->mutex);
		usable = my_slot >= 0 && OidIsValid(my_seqoid) &&
			s->slots[my_slot].dboid == MyDatabaseId &&
			s->slots[my_slot].seqoid == my_seqoid;
		if (usable)
		{
			if (s->rollbacks != rollbacks_seen)
				now = wall_second();
			if (now < s->last_wall)
			{
				/* our reading may just be stale: look again before calling it a rollback */
				now = wall_second();
				if (now < s->last_wall)
				{
					rolled_back = true;
					rolled_from = s->last_wall;
				}
			}

			if (for_event)
			{
				/* event_second <= last_second: a later second starts at 0 */
				int64		base = Max(now, s->last_second);

				if (base > s->event_second)
				{
					second = base;
					seq = 0;
				}
				else if (s->event_seq < EVENT_ID_PER_SECOND - 1)
				{
					second = s->event_second;
					seq = s->event_seq + 1;
				}
				else
				{
					second = s->event_second + 1;
					seq = 0;
				}
			}
			else if (now > s->last_second)
			{
				second = now;
				seq = 0;
			}
			else if (s->last_seq < ORDER_NO_SEQ_MAX)
			{
				second = s->last_second;
				seq = s->last_seq + 1;
			}
			else
			{
				second = s->last_second + 1;
				seq = 0;
			}

			if (second < s->slots[my_slot].reserved_until)
			{
				borrowed = second > now && second > s->last_second && (for_event || seq == 0);
				if (rolled_back)
					s->rollbacks++;
				if (now != s->last_wall)
					s->last_wall = now;
				if (for_event)
				{
					s->event_second = second;
					s->event_seq = seq;
					if (second > s->last_second)
					{
						s->last_second = second;
						s->last_seq = -1;
					}
				}
				else
				{
					s->last_second = second;
					s->last_seq = seq;
				}
			}
			else
			{
				usable = false;
				rolled_back = false;	/* seen again after the reservation */
			}
		}
		SpinLockRelease(&s->mutex);

		if (rolled_back)
			warn_rollback(rolled_from, now, false);
		if (usable)
		{
			if (rolled_back)
				payidem_count(PAYIDEM_CLOCK_ROLLBACKS);
			if (borrowed)
				payidem_count(PAYIDEM_SECONDS_BORROWED);
			*second_out = second;
			*seq_out = seq;
			return;
		}
		reserve(second);
	}
}

static text *
check_prefix(FunctionCallInfo fcinfo)
{
	text	   *prefix;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("order-number prefix must not be NULL"),
				 errhint("Use a two-character business prefix such as PO (orders), PY (payments) or RF (refunds).")));
	prefix = PG_GETARG_TEXT_PP(0);
	if (!order_no_prefix_valid(VARDATA_ANY(prefix), VARSIZE_ANY_EXHDR(prefix)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid order-number prefix"),
				 errdetail("The prefix was %s; it must be exactly two characters of A-Z or 0-9.",
						   payidem_quote_value(VARDATA_ANY(prefix), VARSIZE_ANY_EXHDR(prefix))),
				 errhint("Use an upper-case business prefix such as PO (orders), PY (payments) or RF (refunds).")));
	return prefix;
}

/*
 * payidem.gen_order_no(prefix text DEFAULT 'PO') RETURNS text
 */
PG_FUNCTION_INFO_V1(payidem_gen_order_no);
Datum
payidem_gen_order_no(PG_FUNCTION_ARGS)
{
	text	   *prefix = check_prefix(fcinfo);
	OrderNoParts parts;
	char		buf[ORDER_NO_LEN];
	int64		second;
	int			seq;

	payidem_require_shmem("gen_order_no");
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot issue order numbers during recovery"),
				 errdetail("New numbers must be recorded durably, which a standby cannot do."),
				 errhint("Issue order numbers on the primary.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot issue order numbers in a read-only transaction"),
				 errdetail("Issuing numbers records a durable high-water mark from time to time."),
				 errhint("Call gen_order_no() in a read-write transaction on the primary.")));
	payidem_require_replication("issuing an order number");
	next_number(false, &second, &seq);
	payidem_count(PAYIDEM_ORDER_NOS_ISSUED);

	memcpy(parts.prefix, VARDATA_ANY(prefix), 2);
	parts.prefix[2] = '\0';
	parts.epoch = second;
	parts.shard = payidem_shard_id;
	parts.seq = seq;
	if (!order_no_format(buf, &parts))
		elog(ERROR, "order number out of range: second " INT64_FORMAT ", seq %d", second, seq);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf, ORDER_NO_LEN));
}

/*
 * The id of a new notification event (notify.c): drawn from the order-number
 * generator, so an id is never handed out twice, across crashes, clock steps
 * and failovers (EVENT_ID_EPOCH in order_no.h has the layout).  Called in the
 * writing transaction of the event.
 */
int64
order_no_next_event_id(void)
{
	int64		second;
	int			seq;
	int64		id;

	payidem_require_shmem("notification events of");
	payidem_require_replication("recording a notification event");
	next_number(true, &second, &seq);
	if (pg_mul_s64_overflow(second - EVENT_ID_EPOCH, EVENT_ID_PER_SECOND, &id) ||
		pg_add_s64_overflow(id, seq, &id) ||
		pg_mul_s64_overflow(id, 100, &id) ||
		pg_add_s64_overflow(id, payidem_shard_id, &id) || id <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("notification event id out of range"),
				 errdetail("The order-number clock reads second " INT64_FORMAT ", outside the range event ids cover.",
						   second)));
	return id;
}

/*
 * payidem.order_no_valid(order_no text) RETURNS boolean
 *		Format and check digits; never raises an error, and NULL is not a
 *		valid number (false), so WHERE NOT order_no_valid(x) finds NULLs too.
 */
PG_FUNCTION_INFO_V1(payidem_order_no_valid);
Datum
payidem_order_no_valid(PG_FUNCTION_ARGS)
{
	text	   *s;
	OrderNoParts parts;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);
	s = PG_GETARG_TEXT_PP(0);

	PG_RETURN_BOOL(order_no_parse(VARDATA_ANY(s), VARSIZE_ANY_EXHDR(s), &parts) == ORDER_NO_OK);
}

/*
 * payidem.order_no_parse(order_no text)
 *		RETURNS TABLE(prefix text, issued_at timestamptz, shard int, seq int)
 *		One row; 22023 with the reason if the number is not valid or NULL.
 */
PG_FUNCTION_INFO_V1(payidem_order_no_parse);
Datum
payidem_order_no_parse(PG_FUNCTION_ARGS)
{
	text	   *s;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OrderNoParts parts;
	OrderNoError err;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("order number must not be NULL"),
				 errhint("Pass a number returned by payidem.gen_order_no().")));
	s = PG_GETARG_TEXT_PP(0);
	err = order_no_parse(VARDATA_ANY(s), VARSIZE_ANY_EXHDR(s), &parts);
	if (err != ORDER_NO_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid order number %s",
						payidem_quote_value(VARDATA_ANY(s), VARSIZE_ANY_EXHDR(s))),
				 errdetail_internal("%s", order_no_error_text(err))));

	InitMaterializedSRF(fcinfo, 0);
	values[0] = CStringGetTextDatum(parts.prefix);
	values[1] = TimestampTzGetDatum(time_t_to_timestamptz((pg_time_t) parts.epoch));
	values[2] = Int32GetDatum(parts.shard);
	values[3] = Int32GetDatum(parts.seq);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * payidem.order_no_make(prefix text, issued_at timestamptz, shard int, seq int)
 *		RETURNS text
 *		The inverse of order_no_parse(): the number with these parts and its
 *		check digits (issued_at truncated to the second).  It reserves nothing,
 *		so gen_order_no() may issue the same number: it is for fixtures,
 *		benchmarks and migrating numbers kept elsewhere.  22023 on a NULL or
 *		out-of-range part.
 */
PG_FUNCTION_INFO_V1(payidem_order_no_make);
Datum
payidem_order_no_make(PG_FUNCTION_ARGS)
{
	static const char *const names[] = {"prefix", "issued_at", "shard", "seq"};
	text	   *prefix;
	TimestampTz issued_at;
	OrderNoParts parts;
	char		buf[ORDER_NO_LEN];
	int64		usecs;
	int			i;

	for (i = 0; i < 4; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("order_no_make(): %s must not be NULL", names[i])));
	prefix = check_prefix(fcinfo);
	issued_at = PG_GETARG_TIMESTAMPTZ(1);
	memcpy(parts.prefix, VARDATA_ANY(prefix), 2);
	parts.prefix[2] = '\0';
	parts.shard = PG_GETARG_INT32(2);
	parts.seq = PG_GETARG_INT32(3);
	parts.epoch = 0;
	if (!TIMESTAMP_NOT_FINITE(issued_at))
	{
		/* floor to the second, also before 2000-01-01 */
		usecs = issued_at + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
		parts.epoch = usecs / USECS_PER_SEC - (usecs % USECS_PER_SEC < 0 ? 1 : 0);
	}
	if (TIMESTAMP_NOT_FINITE(issued_at) ||
		parts.epoch < ORDER_NO_MIN_EPOCH || parts.epoch > ORDER_NO_MAX_EPOCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("order_no_make(): issued_at is out of range"),
				 errdetail("The value was %s; an order number holds a UTC time from 1970-01-01 to 9999-12-31.",
						   DatumGetCString(DirectFunctionCall1(timestamptz_out, TimestampTzGetDatum(issued_at))))));
	if (parts.shard < 0 || parts.shard > ORDER_NO_SHARD_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("order_no_make(): shard is out of range"),
				 errdetail("The value was %d; a shard is 0 to %d.", parts.shard, ORDER_NO_SHARD_MAX)));
	if (parts.seq < 0 || parts.seq > ORDER_NO_SEQ_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("order_no_make(): seq is out of range"),
				 errdetail("The value was %d; a per-second sequence is 0 to %d.", parts.seq, ORDER_NO_SEQ_MAX),
				 parts.seq > ORDER_NO_SEQ_MAX ?
				 errhint("Move to the next second for more than %d numbers.", ORDER_NO_SEQ_MAX + 1) : 0));
	if (!order_no_format(buf, &parts))
		elog(ERROR, "order_no_make(): parts out of range");
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf, ORDER_NO_LEN));
}

/*
 * payidem._order_no_mark() RETURNS bigint
 *		Called by the install script to start a new order_no_hwm above every
 *		number this server has issued (in any database, including one where
 *		payidem was just dropped): the first second not yet used.  0 when the
 *		library is not preloaded or nothing was issued since the start.
 */
PG_FUNCTION_INFO_V1(payidem_order_no_mark);
Datum
payidem_order_no_mark(PG_FUNCTION_ARGS)
{
	OrderNoShared *s;
	int64		mark;

	if (payidem_shared == NULL)
		PG_RETURN_INT64(0);
	s = &payidem_shared->order_no;
	SpinLockAcquire(&s->mutex);
	mark = s->last_second > 0 ? s->last_second + 1 : 0;
	SpinLockRelease(&s->mutex);
	PG_RETURN_INT64(mark);
}
