/*-------------------------------------------------------------------------
 *
 * idem.c
 *		idem_claim(), idem_record(), idem_finish(), idem_purge():
 *		idempotency keys whose unique index — never a prior lookup — decides
 *		who runs the business logic.
 *
 * A claim first reads the key (an index lookup: no lock, no write).  If a
 * row is visible, it answers from it: "replay" (completed), "in_progress"
 * (processing under a live lease), or a reclaim (failed, or processing with
 * an expired lease), done by a conditional UPDATE whose WHERE clause repeats
 * the reclaim condition, so two reclaimers cannot both win.  The read never
 * decides that a key is new: if no row is visible the claim runs
 *
 *		INSERT ... ON CONFLICT (idem_key) DO NOTHING RETURNING ...
 *
 * and the unique index decides.  A row back means "claimed"; none means
 * another session's insert won, and the claim reads that row.  So a
 * duplicate of an existing key costs one index lookup and writes nothing (no
 * dead tuple, no WAL, no transaction ID), and no unique_violation ever
 * reaches the caller.
 *
 * What waits on what: the ON CONFLICT pre-check, finding a conflicting row
 * whose inserter has not finished, waits for that transaction.  So N sessions
 * claiming one new key at once get exactly one "claimed"; the others wait
 * until the winner ends, then answer from the row it committed (in_progress
 * or replay), or — if it rolled back — race again for the insert, which
 * again exactly one wins.  A reclaimer waits for the row lock of a reclaim
 * not yet committed; under READ COMMITTED its UPDATE then re-checks the WHERE
 * clause on the winner's row, changes nothing, and the claim reads the row
 * again (in_progress).  A duplicate does not wait for an idem_finish() not
 * yet committed: it answers from the committed row (in_progress).  Under
 * REPEATABLE READ or SERIALIZABLE a claim answers from its snapshot, and a
 * race it loses is a serialization failure (40001) to retry, as for any
 * write conflict there.
 *
 * idem_record() is the same claim for a caller whose business effect
 * commits in the claim's transaction: the new row is inserted completed,
 * with the caller's result (a key taken over is completed in the same
 * call), so the claim and idem_finish() are one write.
 *
 * The lookup probes the primary key index directly (lookup_key(), as a
 * systable scan does: no executor start and stop for the common duplicate),
 * and a new key is inserted through the executor's speculative-insertion
 * steps with the CHECK constraints compiled once (direct_insert(), both
 * through direct.c).  The
 * other writes run through SPI with plans prepared once per backend and kept
 * (SPI_keepplan), always generic, every name schema-qualified.  All run as
 * the owner of payidem.idempotency (the extension's owner), like a SECURITY
 * DEFINER function but without a SET clause: a caller needs only EXECUTE on
 * the function, never a privilege on the table.  Nothing here needs shared
 * memory; the outcome counters of payidem.stats() are skipped when the
 * library is not preloaded.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "storage/lmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "catalog.h"
#include "compat.h"
#include "direct.h"
#include "errcodes.h"
#include "inval.h"
#include "replication.h"
#include "shmem.h"
#include "util.h"

/* longest key, in characters (the table's idempotency_key_length check) */
#define IDEM_KEY_MAX_CHARS		255
/* longest biz_type, in characters (idempotency_biz_type_length) */
#define IDEM_BIZ_TYPE_MAX_CHARS	64
/* a claim whose key keeps vanishing or changing under it gives up after this */
#define IDEM_MAX_TRIES			10
/* a lease longer than this is a mistake (and now + it could overflow) */
#define IDEM_MAX_LEASE_YEARS		100
/* older than any key: now - it cannot underflow */
#define IDEM_MAX_RETENTION_YEARS	1000

/* saved plans, prepared on first use in a backend */
static SPIPlanPtr insert_plan = NULL;
static SPIPlanPtr select_plan = NULL;
static SPIPlanPtr reclaim_plan = NULL;
static SPIPlanPtr finish_plan = NULL;
static SPIPlanPtr purge_plan = NULL;

/* idem_claim()'s result row, built once per backend from its OUT parameters */
static PayidemResultDesc claim_desc;

/* payidem.idempotency as last used; reset by the relcache callback */
static Oid	idem_relid = InvalidOid;
static bool idem_callback_registered = false;
/* bumped by the relcache callback: what is derived from the table's shape
 * (lookup_desc, the direct insert's state) is rebuilt when it moves */
static uint64 idem_generation = 1;

/*
 * The lookup of a key reads the primary key index directly (lookup_key()):
 * its row, cut to these columns in this order, described by lookup_desc.
 * Built from the table's descriptor, again when the table's OID changes.
 */
static const char *const lookup_columns[] = {
	"biz_type", "order_no", "amount", "fingerprint",
	"status", "result", "attempts", "locked_until"
};
static AttrNumber lookup_attnums[lengthof(lookup_columns)];
static TupleDesc lookup_desc = NULL;
static uint64 lookup_desc_generation = 0;

/*
 * A new key is inserted without the executor's statement machinery
 * (direct_insert()): the columns it sets, the table's CHECK constraints
 * planned and compiled once, and whether the table still has the shape this
 * was written for (otherwise the claim falls back to insert_sql).
 */
static const char *const insert_columns[] = {
	"idem_key", "biz_type", "order_no", "channel", "amount", "fingerprint",
	"locked_until", "created_at", "status", "attempts", "updated_at", "result"
};
/* columns the insert leaves NULL: no default, nullable */
static const char *const insert_unset_columns[] = {"channel_txn_id"};
static AttrNumber insert_attnums[lengthof(insert_columns)];
static MemoryContext insert_cxt = NULL;
static uint64 insert_generation = 0;
static bool insert_direct = false;
static PayidemChecks insert_checks;

/* columns of select_plan and of lookup_key()'s row */
enum
{
	SEL_BIZ_TYPE = 1,
	SEL_ORDER_NO,
	SEL_AMOUNT,
	SEL_FINGERPRINT,
	SEL_STATUS,
	SEL_RESULT,
	SEL_ATTEMPTS,
	SEL_LOCKED_UNTIL
};

/*
 * $1 key, $2 biz_type, $3 order_no, $4 channel, $5 amount, $6 fingerprint,
 * $7 locked_until, $8 now, $9 status, $10 result
 */
static const char *const insert_sql =
"INSERT INTO payidem.idempotency AS i"
" (idem_key, biz_type, order_no, channel, amount, fingerprint,"
"  status, attempts, locked_until, created_at, updated_at, result)"
" VALUES ($1, $2, $3, $4, $5, $6, $9, 1, $7, $8, $8, $10)"
" ON CONFLICT (idem_key) DO NOTHING"
" RETURNING i.attempts";

/* $1 key */
static const char *const select_sql =
"SELECT i.biz_type, i.order_no, i.amount, i.fingerprint,"
"       i.status, i.result, i.attempts, i.locked_until"
"  FROM payidem.idempotency AS i"
" WHERE i.idem_key OPERATOR(pg_catalog.=) $1";

/* $1 key, $2 new locked_until, $3 now */
static const char *const reclaim_sql =
"UPDATE payidem.idempotency AS i"
"   SET status = 'processing',"
"       attempts = i.attempts OPERATOR(pg_catalog.+) 1,"
"       locked_until = $2,"
"       updated_at = $3"
" WHERE i.idem_key OPERATOR(pg_catalog.=) $1"
"   AND (i.status OPERATOR(pg_catalog.=) 'failed'"
"        OR (i.status OPERATOR(pg_catalog.=) 'processing'"
"            AND i.locked_until OPERATOR(pg_catalog.<=) $3))"
" RETURNING i.result, i.attempts";

/* $1 key, $2 status, $3 result, $4 now */
static const char *const finish_sql =
"UPDATE payidem.idempotency AS i"
"   SET status = $2, result = $3, locked_until = NULL, updated_at = $4"
" WHERE i.idem_key OPERATOR(pg_catalog.=) $1"
"   AND i.status OPERATOR(pg_catalog.=) 'processing'";

/* $1 cutoff, $2 at most (NULL: all) */
/*
 * The purge: finished keys last changed before $1, oldest first, at most $2
 * (NULL: all) per call; a key another transaction holds is left for the
 * next purge, so a purge never waits on a claim, nor a claim on more than
 * the purge's own rows.
 */
static const char *const purge_sql =
"DELETE FROM payidem.idempotency AS i"
" USING (SELECT j.idem_key FROM payidem.idempotency AS j"
"         WHERE j.updated_at OPERATOR(pg_catalog.<) $1"
"           AND (j.status OPERATOR(pg_catalog.=) 'completed'"
"                OR j.status OPERATOR(pg_catalog.=) 'failed')"
"         ORDER BY j.updated_at LIMIT $2"
"         FOR UPDATE SKIP LOCKED) AS old"
" WHERE i.idem_key OPERATOR(pg_catalog.=) old.idem_key";

/* the outcomes of a claim, as returned and as counted in payidem.stats() */
typedef enum IdemOutcome
{
	IDEM_CLAIMED,
	IDEM_IN_PROGRESS,
	IDEM_REPLAY,
	IDEM_RECLAIMED
} IdemOutcome;

static const char *const outcome_names[] = {
	"claimed", "in_progress", "replay", "reclaimed"
};

static const PayidemCounter outcome_counters[] = {
	PAYIDEM_IDEM_CLAIMED, PAYIDEM_IDEM_IN_PROGRESS,
	PAYIDEM_IDEM_REPLAY, PAYIDEM_IDEM_RECLAIMED
};

/* payidem.idempotency changed (ALTER TABLE, DROP EXTENSION), or a full reset */
static void
idem_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == idem_relid)
	{
		idem_relid = InvalidOid;
		idem_generation++;
	}
}

/* a changed function: a compiled CHECK may have inlined or folded it */
static void
idem_proc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	idem_generation++;
}

/*
 * The row of key in payidem.idempotency, as select_sql would return it (the
 * lookup_columns, in a tuple of lookup_desc), or NULL if no row is visible.
 *
 * A claim of an existing key costs this one probe of the primary key index
 * and writes nothing, so it is done without the executor: no plan to start
 * and stop, as systable scans do.  Visibility is what an SPI statement of a
 * volatile function gets: the command counter is advanced and the snapshot
 * is the transaction's (a new one per call under READ COMMITTED).  Runs as
 * the table's owner, inside begin_as_owner(); the row is allocated in the
 * current memory context (the caller's, or SPI's once connected).
 */
static HeapTuple
lookup_key(Oid relid, text *key, TupleDesc *desc)
{
	Relation	rel;
	Relation	idx;
	Oid			pkey;
	Snapshot	snapshot;
	ScanKeyData skey;
	TupleTableSlot *slot;
	HeapTuple	row = NULL;
	int			i;

	rel = table_open(relid, AccessShareLock);
	pkey = RelationGetPrimaryKeyIndexCompat(rel);
	if (!OidIsValid(pkey))
		elog(ERROR, "payidem.idempotency has no primary key");
	idx = index_open(pkey, AccessShareLock);

	if (lookup_desc == NULL || lookup_desc_generation != idem_generation)
	{
		TupleDesc	tabledesc = RelationGetDescr(rel);
		TupleDesc	newdesc;
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		newdesc = CreateTemplateTupleDesc(lengthof(lookup_columns));
		for (i = 0; i < lengthof(lookup_columns); i++)
		{
			int			attnum = payidem_attnum(tabledesc, lookup_columns[i]);

			if (attnum <= 0)
				elog(ERROR, "payidem.idempotency has no column \"%s\"", lookup_columns[i]);
			lookup_attnums[i] = attnum;
			TupleDescCopyEntry(newdesc, i + 1, tabledesc, attnum);
		}
		MemoryContextSwitchTo(old);
		if (lookup_desc != NULL)
			FreeTupleDesc(lookup_desc);
		lookup_desc = newdesc;
		lookup_desc_generation = idem_generation;
	}

	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(key));
	slot = table_slot_create(rel, NULL);
	if (payidem_index_fetch(rel, idx, &skey, 1, snapshot, slot))
	{
		Datum		values[lengthof(lookup_columns)];
		bool		nulls[lengthof(lookup_columns)];

		slot_getallattrs(slot);
		for (i = 0; i < lengthof(lookup_columns); i++)
		{
			values[i] = slot->tts_values[lookup_attnums[i] - 1];
			nulls[i] = slot->tts_isnull[lookup_attnums[i] - 1];
		}
		row = heap_form_tuple(lookup_desc, values, nulls);
	}
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);

	*desc = lookup_desc;
	return row;
}

/*
 * (Re)build what direct_insert() needs from the table's relcache entry.  The
 * fast path is taken only for the shape the extension creates: exactly the
 * known columns, the ones left unset without default and nullable, the
 * nullable arguments in nullable columns, no trigger, no row security, no
 * generated column.  Anything else (a DBA's ALTER TABLE) makes claims use
 * insert_sql, which the executor handles in full.
 */
static void
prepare_direct_insert(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			live = 0;
	int			i;
	MemoryContext old;

	payidem_checks_free(&insert_checks);
	if (insert_cxt == NULL)
		insert_cxt = AllocSetContextCreate(TopMemoryContext, "payidem idempotency insert",
										   ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(insert_cxt);
	insert_direct = false;
	insert_generation = idem_generation;

	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->trigdesc != NULL ||
		rel->rd_rel->relrowsecurity || TupleDescHasGeneratedColumnsCompat(desc))
		return;
	for (i = 0; i < desc->natts; i++)
		if (!TupleDescAttr(desc, i)->attisdropped)
			live++;
	if (live != lengthof(insert_columns) + lengthof(insert_unset_columns))
		return;
	for (i = 0; i < lengthof(insert_columns); i++)
	{
		int			j = payidem_attnum(desc, insert_columns[i]) - 1;

		if (j < 0)
			return;
		insert_attnums[i] = j + 1;
	}
	for (i = 0; i < lengthof(insert_unset_columns); i++)
	{
		int			j = payidem_attnum(desc, insert_unset_columns[i]) - 1;

		if (j < 0 || TupleDescAttr(desc, j)->atthasdef || TupleDescAttr(desc, j)->attnotnull)
			return;
	}
	/* order_no, channel, amount, fingerprint, locked_until, result may be NULL */
	for (i = 2; i <= 6; i++)
		if (TupleDescAttr(desc, insert_attnums[i] - 1)->attnotnull)
			return;
	if (TupleDescAttr(desc, insert_attnums[11] - 1)->attnotnull)
		return;

	old = MemoryContextSwitchTo(insert_cxt);
	payidem_checks_compile(&insert_checks, rel);
	MemoryContextSwitchTo(old);
	insert_direct = true;
}

/*
 * Insert a new key as INSERT ... ON CONFLICT (idem_key) DO NOTHING would
 * (payidem_insert_new(), with the CHECK constraints compiled once).
 * values[] holds insert_columns in order (isnull likewise).
 *
 * Returns 1 if inserted, 0 if another row holds the key (a conflict), -1 if
 * the table's shape asks for the SPI statement instead.
 */
static int
direct_insert(Oid relid, Datum *values, bool *isnull)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	Oid			pkey;
	int			result = -1;

	if (insert_generation != idem_generation)
		prepare_direct_insert(rel);
	pkey = RelationGetPrimaryKeyIndexCompat(rel);
	if (insert_direct && OidIsValid(pkey))
		result = payidem_insert_new(rel, pkey, &insert_checks, lengthof(insert_columns), insert_attnums,
									values, isnull);
	table_close(rel, NoLock);
	return result;
}

/*
 * Become the table's owner and return the table's OID; the previous identity
 * is left in *save for end_as_owner().  The OID is
 * the caller's to keep for the call: an invalidation processed on the way
 * (any lock taken accepts them) may reset the cached one.  SPI is connected only when a
 * statement needs it (connect_spi()): a claim answered by the index probe or
 * inserted directly runs none.  An error in between is cleaned up by
 * transaction (or subtransaction) abort, which restores the identity and
 * closes SPI.
 */
static Oid
begin_as_owner(PayidemAsOwner *save)
{
	Oid			relid = payidem_relation(PAYIDEM_IDEMPOTENCY);

	if (!idem_callback_registered)
	{
		payidem_register_relcache_callback(idem_relcache_callback, (Datum) 0);
		payidem_register_syscache_callback(PROCOID, idem_proc_callback, (Datum) 0);
		idem_callback_registered = true;
	}
	payidem_become_owner(payidem_owner(PAYIDEM_IDEMPOTENCY), SECURITY_RESTRICTED_OPERATION, save);
	idem_relid = relid;
	return relid;
}

/*
 * Connect to SPI once per call, before the first statement, with
 * search_path pinned (payidem_pin_search_path()): a statement may fire a
 * DBA's trigger on the table, which runs as the owner and must resolve no
 * name in the caller's schemas.  *level: 0 before, the nest level to give
 * back after.
 */
static void
connect_spi(int *level)
{
	if (*level != 0)
		return;
	*level = payidem_pin_search_path();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/* Close SPI if it was connected and become the caller again. */
static void
end_as_owner(const PayidemAsOwner *save, int spi_level)
{
	if (spi_level != 0)
	{
		if (SPI_finish() != SPI_OK_FINISH)
			elog(ERROR, "SPI_finish failed");
		payidem_unpin_search_path(spi_level);
	}
	payidem_become_caller(save);
}

/*
 * The idempotency key argument: not NULL, not empty, at most 255 characters
 * (22023 otherwise, before the table's check constraint could say 23514).
 */
static text *
get_key_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *key;
	int			len;
	int			chars;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must not be NULL"),
				 errhint("Build the key from the business type, the order number and the event, e.g. pay:PO2026...:callback.")));
	key = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(key);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must not be empty"),
				 errhint("Build the key from the business type, the order number and the event, e.g. pay:PO2026...:callback.")));
	chars = pg_mbstrlen_with_len(VARDATA_ANY(key), len);
	if (chars > IDEM_KEY_MAX_CHARS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key is too long"),
				 errdetail("The key %s has %d characters; at most %d are allowed.",
						   payidem_quote_value(VARDATA_ANY(key), len), chars, IDEM_KEY_MAX_CHARS),
				 errhint("Keep the key short (biz_type:order_no:event) and pass a digest of long request parameters as the fingerprint.")));
	return key;
}

/* A text value for an error message: quoted and cut, or NULL. */
static char *
show_text(Datum d, bool isnull)
{
	text	   *t;

	if (isnull)
		return pstrdup("NULL");
	t = DatumGetTextPP(d);
	return payidem_quote_value(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

/* An amount for an error message, or NULL. */
static char *
show_amount(Datum d, bool isnull)
{
	return isnull ? pstrdup("NULL") : psprintf(INT64_FORMAT, DatumGetInt64(d));
}

/*
 * PI001 if the stored row of the key was claimed with other parameters:
 * biz_type, order_no and amount must be equal (NULL equals only NULL);
 * fingerprints are compared only when both sides have one.  Names the first
 * field that differs, with both values.
 */
static void
check_same_request(text *key, Datum *args, bool *argnulls, HeapTuple row, TupleDesc desc)
{
	static const struct
	{
		int			argno;		/* index into args */
		int			column;		/* column of select_plan */
		const char *name;
		bool		is_text;
		bool		nulls_match_any;
	}			fields[] = {
		{1, SEL_BIZ_TYPE, "biz_type", true, false},
		{2, SEL_ORDER_NO, "order_no", true, false},
		{4, SEL_AMOUNT, "amount", false, false},
		{5, SEL_FINGERPRINT, "fingerprint", true, true},
	};
	int			i;

	for (i = 0; i < lengthof(fields); i++)
	{
		bool		stored_null;
		Datum		stored = SPI_getbinval(row, desc, fields[i].column, &stored_null);
		bool		given_null = argnulls[fields[i].argno];
		Datum		given = args[fields[i].argno];
		bool		same;

		if (stored_null || given_null)
			same = fields[i].nulls_match_any || (stored_null && given_null);
		else if (fields[i].is_text)
			same = payidem_text_equal(stored, given);
		else
			same = DatumGetInt64(stored) == DatumGetInt64(given);
		if (same)
			continue;

		payidem_count(PAYIDEM_IDEM_MISMATCH);
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_IDEMPOTENCY_MISMATCH),
				 errmsg("idempotency key reused with a different %s", fields[i].name),
				 errdetail("Key %s was claimed with %s %s; this call passed %s %s.",
						   payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)),
						   fields[i].name,
						   fields[i].is_text ? show_text(stored, stored_null) : show_amount(stored, stored_null),
						   fields[i].name,
						   fields[i].is_text ? show_text(given, given_null) : show_amount(given, given_null)),
				 errhint("A retry must repeat the original request exactly; a different request needs a key of its own.")));
	}
}

/* A jsonb value fetched from SPI, flattened so it outlives the row. */
static Datum
flat_jsonb(Datum d)
{
	return PointerGetDatum(PG_DETOAST_DATUM_PACKED(d));
}

/*
 * The checks idem_claim() and idem_record() share: biz_type required and at
 * most IDEM_BIZ_TYPE_MAX_CHARS characters, amount positive if given.
 * args[] are the claim's key, biz_type, order_no, channel, amount and
 * fingerprint, text arguments already detoasted.
 */
static void
check_claim_args(Datum *args, bool *argnulls)
{
	if (argnulls[1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("biz_type must not be NULL"),
				 errhint("Pass the business type of the request, such as pay, refund or recharge.")));
	else
	{
		text	   *biz = DatumGetTextPP(args[1]);
		int			len = VARSIZE_ANY_EXHDR(biz);
		int			chars = pg_mbstrlen_with_len(VARDATA_ANY(biz), len);

		if (chars < 1 || chars > IDEM_BIZ_TYPE_MAX_CHARS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("biz_type must have 1 to %d characters", IDEM_BIZ_TYPE_MAX_CHARS),
					 errdetail("The biz_type was %s, %d characters.",
							   payidem_quote_value(VARDATA_ANY(biz), len), chars),
					 errhint("Pass the business type of the request, such as pay, refund or recharge.")));
	}
	if (!argnulls[4] && DatumGetInt64(args[4]) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("amount must be positive"),
				 errdetail("The amount was " INT64_FORMAT ".", DatumGetInt64(args[4])),
				 errhint("Amounts are integers in the currency's minor unit (fen, cents), greater than zero.")));
}

/* A text argument, detoasted, or 0 if NULL. */
static Datum
text_arg(FunctionCallInfo fcinfo, int argno, bool *isnull)
{
	*isnull = PG_ARGISNULL(argno);
	return *isnull ? (Datum) 0 : PointerGetDatum(PG_GETARG_TEXT_PP(argno));
}

/*
 * The claim's arguments, as claim_key() takes them: key,
 * biz_type, order_no, channel and amount are arguments 0 to 4 of both
 * functions, the fingerprint is argument fingerprint_argno.  Checked.
 */
static void
get_claim_args(FunctionCallInfo fcinfo, int fingerprint_argno, Datum *args, bool *argnulls)
{
	args[0] = PointerGetDatum(get_key_arg(fcinfo, 0));
	argnulls[0] = false;
	args[1] = text_arg(fcinfo, 1, &argnulls[1]);
	args[2] = text_arg(fcinfo, 2, &argnulls[2]);
	args[3] = text_arg(fcinfo, 3, &argnulls[3]);
	argnulls[4] = PG_ARGISNULL(4);
	args[4] = argnulls[4] ? (Datum) 0 : PG_GETARG_DATUM(4);
	args[5] = text_arg(fcinfo, fingerprint_argno, &argnulls[5]);
	check_claim_args(args, argnulls);
}

/*
 * The claim itself, for idem_claim() and idem_record(): args[] as for
 * check_claim_args(), already checked.  A new key is inserted as processing
 * with the lease, or — complete — as completed with result and no lease; a
 * key taken over (failed, or its lease expired) is likewise left processing,
 * or completed at once.  Returns the outcome and, if rsinfo is not NULL, puts
 * the one result row in its tuplestore (set up by payidem_materialized_result()).
 */
static IdemOutcome
claim_key(ReturnSetInfo *rsinfo, Datum *args, bool *argnulls, Interval *lease,
		  bool complete, Datum result, bool result_isnull)
{
	text	   *key = DatumGetTextPP(args[0]);
	Datum		params[10];
	char		paramnulls[10];
	Oid			insert_types[10] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, JSONBOID};
	Oid			reclaim_types[3] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Oid			finish_types[4] = {TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID};
	Datum		status_value = CStringGetTextDatum(complete ? "completed" : "processing");
	PayidemAsOwner as_owner;
	IdemOutcome outcome = IDEM_CLAIMED;
	Oid			relid;
	int			spi = 0;		/* connected: search_path's nest level */
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	int			tries;
	int			i;

	relid = begin_as_owner(&as_owner);

	for (i = 0; i < 6; i++)
	{
		params[i] = args[i];
		paramnulls[i] = argnulls[i] ? 'n' : ' ';
	}
	paramnulls[6] = complete ? 'n' : ' ';
	paramnulls[7] = ' ';
	params[8] = status_value;
	paramnulls[8] = ' ';
	params[9] = result;
	paramnulls[9] = complete && !result_isnull ? ' ' : 'n';

	for (tries = 0;; tries++)
	{
		TimestampTz now;
		int			rc;
		HeapTuple	row;
		TupleDesc	desc;
		bool		isnull;
		Datum		status;
		Datum		rparams[3];

		if (tries >= IDEM_MAX_TRIES)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not claim idempotency key because of concurrent changes"),
					 errdetail("Key %s was deleted or changed by other sessions %d times in a row.",
							   payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)), tries),
					 errhint("Retry the transaction.")));

		/* 1. an existing key is answered from its row: no lock, no write */
		row = lookup_key(relid, key, &desc);
		if (row == NULL)
		{
			/*
			 * 2. not visible: the unique index decides.  ON CONFLICT waits
			 * for a concurrent inserter; if it committed, nothing is
			 * inserted and the loop reads its row.
			 */
			int			inserted;

			/*
			 * The direct insert below bypasses the executor's read-only
			 * check: make it here (a key already recorded is still answered
			 * in a read-only transaction and on a standby).
			 */
			if (RecoveryInProgress())
				ereport(ERROR,
						(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
						 errmsg("cannot record a new idempotency key during recovery"),
						 errdetail("Key %s is not recorded yet; recording it writes a row, which a standby cannot do.",
								   payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))),
						 errhint("Claim new keys on the primary.")));
			if (XactReadOnly)
				ereport(ERROR,
						(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
						 errmsg("cannot record a new idempotency key in a read-only transaction"),
						 errdetail("Key %s is not recorded yet; recording it writes a row.",
								   payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))),
						 errhint("Claim keys in a read-write transaction.")));

			now = GetCurrentTimestamp();
			params[6] = complete ? (Datum) 0 :
				DirectFunctionCall2(timestamptz_pl_interval,
									TimestampTzGetDatum(now), IntervalPGetDatum(lease));
			params[7] = TimestampTzGetDatum(now);
			{
				/*
				 * insert_columns: the first 8 parameters, then status,
				 * attempts, updated_at, result
				 */
				Datum		v[lengthof(insert_columns)];
				bool		n[lengthof(insert_columns)];
				int			j;

				for (j = 0; j < 8; j++)
				{
					v[j] = params[j];
					n[j] = paramnulls[j] == 'n';
				}
				v[8] = status_value;
				n[8] = false;
				v[9] = Int32GetDatum(1);
				n[9] = false;
				v[10] = params[7];
				n[10] = false;
				v[11] = params[9];
				n[11] = paramnulls[9] == 'n';
				inserted = direct_insert(relid, v, n);
			}
			if (inserted < 0)
			{
				connect_spi(&spi);
				rc = SPI_execute_plan(payidem_saved_plan(&insert_plan, insert_sql, 10, insert_types),
									  params, paramnulls, false, 1);
				if (rc != SPI_OK_INSERT_RETURNING)
					elog(ERROR, "idempotency insert failed: %s", SPI_result_code_string(rc));
				inserted = SPI_processed == 1;
			}
			if (inserted)
			{
				outcome = IDEM_CLAIMED;
				values[1] = status_value;
				values[2] = params[9];
				nulls[2] = paramnulls[9] == 'n';
				values[3] = Int32GetDatum(1);
				break;
			}
			continue;
		}

		check_same_request(key, args, argnulls, row, desc);

		status = SPI_getbinval(row, desc, SEL_STATUS, &isnull);
		now = GetCurrentTimestamp();
		if (payidem_text_equal(status, CStringGetTextDatum("completed")))
			outcome = IDEM_REPLAY;
		else
		{
			Datum		until = SPI_getbinval(row, desc, SEL_LOCKED_UNTIL, &isnull);

			outcome = payidem_text_equal(status, CStringGetTextDatum("processing")) &&
				!isnull && DatumGetTimestampTz(until) > now
				? IDEM_IN_PROGRESS : IDEM_RECLAIMED;
		}

		if (outcome != IDEM_RECLAIMED)
		{
			Datum		d;

			values[1] = status;
			d = SPI_getbinval(row, desc, SEL_RESULT, &nulls[2]);
			if (!nulls[2])
				values[2] = flat_jsonb(d);
			values[3] = SPI_getbinval(row, desc, SEL_ATTEMPTS, &isnull);
			break;
		}

		/*
		 * 3. failed, or its lease expired: take it over.  The UPDATE repeats
		 * the condition, so of two reclaimers the second waits for the first
		 * and, once it committed, updates nothing; the loop then reads the
		 * row again.
		 */
		rparams[0] = PointerGetDatum(key);
		rparams[1] = complete ? TimestampTzGetDatum(now) :
			DirectFunctionCall2(timestamptz_pl_interval,
								TimestampTzGetDatum(now), IntervalPGetDatum(lease));
		rparams[2] = TimestampTzGetDatum(now);
		connect_spi(&spi);
		rc = SPI_execute_plan(payidem_saved_plan(&reclaim_plan, reclaim_sql, 3, reclaim_types),
							  rparams, NULL, false, 1);
		if (rc != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "idempotency reclaim failed: %s", SPI_result_code_string(rc));
		if (SPI_processed == 1)
		{
			Datum		d;

			row = SPI_tuptable->vals[0];
			desc = SPI_tuptable->tupdesc;
			values[1] = CStringGetTextDatum("processing");
			d = SPI_getbinval(row, desc, 1, &nulls[2]);
			if (!nulls[2])
				values[2] = flat_jsonb(d);
			values[3] = SPI_getbinval(row, desc, 2, &isnull);
			if (complete)
			{
				/* ... and finish it in the same transaction */
				Datum		fparams[4] = {PointerGetDatum(key), status_value, result, rparams[2]};
				char		fnulls[4] = {' ', ' ', result_isnull ? 'n' : ' ', ' '};

				rc = SPI_execute_plan(payidem_saved_plan(&finish_plan, finish_sql, 4, finish_types),
									  fparams, fnulls, false, 0);
				if (rc != SPI_OK_UPDATE || SPI_processed != 1)
					elog(ERROR, "idempotency finish after reclaim failed: %s",
						 SPI_result_code_string(rc));
				values[1] = status_value;
				values[2] = result;
				nulls[2] = result_isnull;
			}
			break;
		}
	}

	if (rsinfo != NULL)
	{
		values[0] = CStringGetTextDatum(outcome_names[outcome]);
		/* copies the values out of SPI's memory */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	end_as_owner(&as_owner, spi);

	payidem_count(outcome_counters[outcome]);
	return outcome;
}

/*
 * payidem.idem_claim(idem_key text, biz_type text, order_no text,
 *                    channel text, amount bigint, fingerprint text DEFAULT NULL,
 *                    lease interval DEFAULT '30 seconds')
 *		RETURNS TABLE(outcome text, status text, result jsonb, attempts int)
 *
 * One row: claimed | in_progress | replay | reclaimed (see the file header),
 * the key's status after the call, the stored result and the attempt count.
 * PI001 when the key was claimed with other parameters; 22023 for bad input.
 */
PG_FUNCTION_INFO_V1(payidem_idem_claim);
Datum
payidem_idem_claim(PG_FUNCTION_ARGS)
{
	Interval   *lease = PG_ARGISNULL(6) ? NULL : PG_GETARG_INTERVAL_P(6);
	Datum		args[6];
	bool		argnulls[6];

	payidem_require_replication("idem_claim()");
	get_claim_args(fcinfo, 5, args, argnulls);
	payidem_check_interval("invalid lease", "The lease", lease, false, IDEM_MAX_LEASE_YEARS,
						   "Pass how long the claim is held before another caller may reclaim it, e.g. '30 seconds'.");

	payidem_materialized_result(fcinfo, &claim_desc);
	claim_key((ReturnSetInfo *) fcinfo->resultinfo, args, argnulls, lease, false, (Datum) 0, true);
	return (Datum) 0;
}

/*
 * payidem.idem_record(idem_key text, biz_type text, order_no text,
 *                     channel text, amount bigint, result jsonb,
 *                     fingerprint text DEFAULT NULL)
 *		RETURNS TABLE(outcome text, status text, result jsonb, attempts int)
 *
 * idem_claim() and idem_finish(key, 'completed', result) in one write, for a
 * caller whose business effect commits in the same transaction as the claim:
 * a new key is inserted completed (outcome claimed, status completed), so a
 * concurrent duplicate waits on the unique index for this transaction and
 * then replays; a failed or expired key is reclaimed and completed at once.
 * replay and in_progress as for idem_claim(): the caller does nothing.
 */
PG_FUNCTION_INFO_V1(payidem_idem_record);
Datum
payidem_idem_record(PG_FUNCTION_ARGS)
{
	Datum		args[6];
	bool		argnulls[6];
	bool		result_isnull = PG_ARGISNULL(5);
	Datum		result = result_isnull ? (Datum) 0 : PG_GETARG_DATUM(5);

	payidem_require_replication("idem_record()");

	get_claim_args(fcinfo, 6, args, argnulls);
	payidem_materialized_result(fcinfo, &claim_desc);
	claim_key((ReturnSetInfo *) fcinfo->resultinfo, args, argnulls, NULL, true, result, result_isnull);
	return (Datum) 0;
}

/*
 * payidem.idem_finish(idem_key text, status text, result jsonb DEFAULT NULL)
 *		RETURNS void
 *
 * processing -> completed | failed, storing result (replayed to later claims
 * of a completed key) and ending the lease.  PI009 for an unknown key, PI002
 * for a key that is not processing, 22023 for any other status.
 */
PG_FUNCTION_INFO_V1(payidem_idem_finish);
Datum
payidem_idem_finish(PG_FUNCTION_ARGS)
{
	text	   *key = get_key_arg(fcinfo, 0);
	text	   *status;
	int			status_len;
	Datum		params[4];
	char		paramnulls[4] = {' ', ' ', ' ', ' '};
	Oid			finish_types[4] = {TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID};
	Oid			select_types[1] = {TEXTOID};
	PayidemAsOwner as_owner;
	int			spi = 0;		/* connected: search_path's nest level */
	int			rc;

	payidem_require_replication("idem_finish()");

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency status must not be NULL"),
				 errhint("Finish a key as completed or failed.")));
	status = PG_GETARG_TEXT_PP(1);
	status_len = VARSIZE_ANY_EXHDR(status);
	if (!((status_len == 9 && memcmp(VARDATA_ANY(status), "completed", 9) == 0) ||
		  (status_len == 6 && memcmp(VARDATA_ANY(status), "failed", 6) == 0)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid idempotency status %s",
						payidem_quote_value(VARDATA_ANY(status), status_len)),
				 errdetail("A key can be finished only as completed or failed; the status given was %s.",
						   payidem_quote_value(VARDATA_ANY(status), status_len)),
				 errhint("Finish a key as completed (later claims replay its result) or failed (the next claim reclaims it).")));

	params[0] = PointerGetDatum(key);
	params[1] = PointerGetDatum(status);
	if (PG_ARGISNULL(2))
	{
		params[2] = (Datum) 0;
		paramnulls[2] = 'n';
	}
	else
		params[2] = PG_GETARG_DATUM(2);
	params[3] = TimestampTzGetDatum(GetCurrentTimestamp());

	(void) begin_as_owner(&as_owner);
	connect_spi(&spi);
	rc = SPI_execute_plan(payidem_saved_plan(&finish_plan, finish_sql, 4, finish_types),
						  params, paramnulls, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "idempotency finish failed: %s", SPI_result_code_string(rc));

	if (SPI_processed == 0)
	{
		char	   *shown = payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
		bool		isnull;

		rc = SPI_execute_plan(payidem_saved_plan(&select_plan, select_sql, 1, select_types),
							  params, NULL, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "idempotency lookup failed: %s", SPI_result_code_string(rc));
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_NOT_FOUND),
					 errmsg("idempotency key not found"),
					 errdetail("No key %s exists: it was never claimed, its claim was rolled back, or it was purged.",
							   shown),
					 errhint("Finish only a key that idem_claim() returned as claimed or reclaimed.")));
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
				 errmsg("idempotency key is not being processed"),
				 errdetail("Key %s has status %s; only a key in status processing can be finished.",
						   shown,
						   TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc,
															 SEL_STATUS, &isnull))),
				 errhint("A finished key stays finished; to try a failed key again, claim it (the claim reclaims it).")));
	}
	end_as_owner(&as_owner, spi);
	PG_RETURN_VOID();
}

/*
 * Delete up to max_rows (-1: all) completed and failed keys last changed
 * before now - older_than; returns how many.  Never touches a processing
 * key, live or expired.  A purged key can be claimed afresh, so the
 * retention must outlast every retry of the request (a channel's callback
 * retries last a day or more).
 */
static int64
purge(FunctionCallInfo fcinfo, int64 max_rows)
{
	Interval   *older_than;
	Interval	max;
	Datum		params[2];
	char		nulls[2] = {' ', ' '};
	Oid			purge_types[2] = {TIMESTAMPTZOID, INT8OID};
	PayidemAsOwner as_owner;
	int			spi = 0;		/* connected: search_path's nest level */
	int			rc;
	int64		deleted;

	older_than = PG_ARGISNULL(0) ? NULL : PG_GETARG_INTERVAL_P(0);
	/* no key is older than this: a longer retention keeps everything */
	memset(&max, 0, sizeof(max));
	max.month = IDEM_MAX_RETENTION_YEARS * MONTHS_PER_YEAR;
	if (older_than != NULL &&
		DatumGetBool(DirectFunctionCall2(interval_gt, IntervalPGetDatum(older_than), IntervalPGetDatum(&max))))
		return 0;
	/* and one whose parts leave the timestamp range is no retention */
	payidem_check_interval("invalid retention interval", "The retention interval", older_than, true,
						   IDEM_MAX_RETENTION_YEARS, "Pass how long finished keys are kept, e.g. '7 days'.");
	params[0] = DirectFunctionCall2(timestamptz_mi_interval,
									TimestampTzGetDatum(GetCurrentTimestamp()),
									IntervalPGetDatum(older_than));
	params[1] = Int64GetDatum(max_rows);
	if (max_rows < 0)
		nulls[1] = 'n';

	(void) begin_as_owner(&as_owner);
	connect_spi(&spi);
	rc = SPI_execute_plan(payidem_saved_plan(&purge_plan, purge_sql, 2, purge_types),
						  params, nulls, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "idempotency purge failed: %s", SPI_result_code_string(rc));
	deleted = (int64) SPI_processed;
	end_as_owner(&as_owner, spi);
	return deleted;
}

/*
 * payidem.idem_purge(older_than interval DEFAULT '24 hours') RETURNS bigint
 *		Every finished key past the retention (see purge()).
 */
PG_FUNCTION_INFO_V1(payidem_idem_purge);
Datum
payidem_idem_purge(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(purge(fcinfo, -1));
}

/*
 * payidem._idem_purge_batch(older_than interval, max_rows integer) RETURNS bigint
 *		At most max_rows of them, for the housekeeping worker: a batch per
 *		transaction, so it holds few row locks at a time.
 */
PG_FUNCTION_INFO_V1(payidem_idem_purge_batch);
Datum
payidem_idem_purge_batch(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(1) || PG_GETARG_INT32(1) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid max_rows"),
				 PG_ARGISNULL(1) ? errdetail("max_rows was NULL; it must be positive.") :
				 errdetail("max_rows was %d; it must be positive.", PG_GETARG_INT32(1))));
	PG_RETURN_INT64(purge(fcinfo, PG_GETARG_INT32(1)));
}
