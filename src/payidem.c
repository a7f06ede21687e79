/*-------------------------------------------------------------------------
 *
 * payidem.c
 *		Module entry point: _PG_init, the extension's GUCs, small helpers.
 *
 * Each part of payidem contributes its own init function, called from here.
 * Shared memory (the order-number generator, the counters of stats()) exists
 * only when the library is listed in shared_preload_libraries; loaded any
 * other way, _PG_init defines the GUCs and returns quietly, so CREATE
 * EXTENSION, pg_dump and pg_upgrade still work and the functions that need
 * shared memory fail with 55000 and a hint.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/relscan.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "payidem.h"
#include "payment_decision.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * _PG_init
 *		Define GUCs, reserve the "payidem." prefix so that a misspelt setting
 *		is reported instead of silently ignored, and — when preloading —
 *		install the shared-memory hooks.
 */
void
_PG_init(void)
{
	order_no_define_gucs();
	crypto_define_gucs();
	recon_define_gucs();
	replication_define_gucs();
	payment_decision_define_gucs();
	housekeeping_init();		/* its GUCs; its launcher only when preloading */
	MarkGUCPrefixReserved("payidem");

	if (!process_shared_preload_libraries_in_progress)
		return;
	payidem_shmem_init();
}

/* a C0 control character (U+0000 to U+001F) or DEL, as one byte of any server encoding */
static inline bool
is_control_byte(unsigned char c)
{
	return c < 0x20 || c == 0x7f;
}

/*
 * Quote a user-supplied value for an error message: single quotes, at most
 * 64 characters (longer values are cut and marked), never NULL.  A value
 * with a control character is shown escaped, as an E'...' literal writes it
 * (E'tab\there', E'\x01'): an error never carries raw control bytes into
 * a client's terminal or a log line.
 */
char *
payidem_quote_value(const char *value, int len)
{
	StringInfoData buf;
	int			shown = Min(len, 64);
	bool		controls = false;
	int			i;

	/* do not cut a multibyte character in half */
	shown = pg_mbcliplen(value, len, shown);
	for (i = 0; i < shown && !controls; i++)
		controls = is_control_byte((unsigned char) value[i]);
	initStringInfo(&buf);
	if (!controls)
	{
		appendStringInfoChar(&buf, '\'');
		appendBinaryStringInfo(&buf, value, shown);
	}
	else
	{
		appendStringInfoString(&buf, "E'");
		for (i = 0; i < shown; i++)
		{
			unsigned char c = (unsigned char) value[i];

			if (c == '\t')
				appendStringInfoString(&buf, "\\t");
			else if (c == '\n')
				appendStringInfoString(&buf, "\\n");
			else if (c == '\r')
				appendStringInfoString(&buf, "\\r");
			else if (c == '\\' || c == '\'')
			{
				appendStringInfoChar(&buf, '\\');
				appendStringInfoChar(&buf, c);
			}
			else if (is_control_byte(c))
				appendStringInfo(&buf, "\\x%02x", c);
			else
				appendStringInfoChar(&buf, c);
		}
	}
	appendStringInfoChar(&buf, '\'');
	if (shown < len)
		appendStringInfo(&buf, "... (%d bytes)", len);
	return buf.data;
}

/*
 * payidem._check_no_controls(message text, what text, value text)
 *		RETURNS text, IMMUTABLE STRICT
 *		The one rule for a name or a description a person reads (a
 *		merchant's name, an order's subject): no control character (tab,
 *		line break, U+0000 to U+001F, DEL), which would break the lines of a
 *		report, a log or a bill.  22023, the value escaped in DETAIL; the
 *		value itself otherwise.  Every caller checks through this.
 */
PG_FUNCTION_INFO_V1(payidem_check_no_controls);
Datum
payidem_check_no_controls(PG_FUNCTION_ARGS)
{
	text	   *value = PG_GETARG_TEXT_PP(2);
	const char *p = VARDATA_ANY(value);
	int			len = VARSIZE_ANY_EXHDR(value);
	int			i;

	for (i = 0; i < len; i++)
		if (is_control_byte((unsigned char) p[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", text_to_cstring(PG_GETARG_TEXT_PP(0))),
					 errdetail("%s was %s; it must not contain control characters (tabs, line breaks and the like).",
							   text_to_cstring(PG_GETARG_TEXT_PP(1)), payidem_quote_value(p, len)),
					 errhint("Write it on one line, with spaces in place of tabs and line breaks.")));
	PG_RETURN_TEXT_P(value);
}

/*
 * A duration argument (an order's expiry, a secret's grace period, an
 * idempotency lease or retention): not NULL, and now() plus it after now()
 * (or now() itself, where allow_zero) and at most max_years years after it.
 * The end is what is checked: PostgreSQL compares intervals counting a month
 * as 30 days, but adds months and days to a time by the calendar ('1 month
 * -29 days' can end before it starts), and a sum past the timestamp range
 * is 22008.  So each part (months, days, time) is first bounded by
 * max_years on its own ('5000000 years -1799990000 days' compares as 27
 * years, but its years alone leave the range), and only then added.
 * 22023 for all of these, with the value in DETAIL and the caller's message
 * and hint (NULL: none).  The one check of a duration: SQL reaches it as
 * payidem._check_duration().
 */
void
payidem_check_interval(const char *message, const char *what, const Interval *value,
					   bool allow_zero, int max_years, const char *hint)
{
	int64		max_days = (int64) max_years * 36525 / 100;
	bool		ok = false;

	if (value != NULL &&
		value->month >= -max_years * MONTHS_PER_YEAR && value->month <= max_years * MONTHS_PER_YEAR &&
		value->day >= -max_days && value->day <= max_days &&
		value->time >= -max_days * USECS_PER_DAY && value->time <= max_days * USECS_PER_DAY)
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		Interval	longest;
		TimestampTz end;
		TimestampTz limit;

		memset(&longest, 0, sizeof(longest));
		longest.month = max_years * MONTHS_PER_YEAR;
		end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
													  IntervalPGetDatum(value)));
		limit = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
														IntervalPGetDatum(&longest)));
		ok = end > now ? end <= limit : (end == now && allow_zero);
	}
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s", message),
				 errdetail("%s was %s; it must be %s interval of at most %d years.", what,
						   value == NULL ? "NULL" :
						   DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(value))),
						   allow_zero ? "a zero or positive" : "a positive", max_years),
				 hint != NULL ? errhint("%s", hint) : 0));
}

/*
 * payidem._check_duration(message text, what text, value interval,
 *                         allow_zero boolean, hint text) RETURNS interval
 *		payidem_check_interval() for SQL (create_order's expiry,
 *		rotate_merchant_secret's grace period), at most 100 years; the
 *		value if it passes.
 */
PG_FUNCTION_INFO_V1(payidem_check_duration);
Datum
payidem_check_duration(PG_FUNCTION_ARGS)
{
	Interval   *value = PG_ARGISNULL(2) ? NULL : PG_GETARG_INTERVAL_P(2);

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3))
		elog(ERROR, "payidem._check_duration: message, what and allow_zero must not be NULL");
	payidem_check_interval(text_to_cstring(PG_GETARG_TEXT_PP(0)), text_to_cstring(PG_GETARG_TEXT_PP(1)),
						   value, PG_GETARG_BOOL(3), 100,
						   PG_ARGISNULL(4) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(4)));
	PG_RETURN_INTERVAL_P(value);
}

/* Equal as stored bytes (text equality under a deterministic collation). */
bool
payidem_text_equal(Datum a, Datum b)
{
	text	   *ta = DatumGetTextPP(a);
	text	   *tb = DatumGetTextPP(b);
	int			la = VARSIZE_ANY_EXHDR(ta);

	return la == VARSIZE_ANY_EXHDR(tb) &&
		memcmp(VARDATA_ANY(ta), VARDATA_ANY(tb), la) == 0;
}

/*
 * payidem._fits(value text, domain regtype) RETURNS boolean, STABLE STRICT
 *		Whether value satisfies every CHECK of a text domain (and of the
 *		domains it is made from), without raising: the flow functions test
 *		an argument with the domain of the column it is written to, so a
 *		format's pattern is written once, in its domain, and they can still
 *		say which argument is wrong (docs/schema.md, "Formats as domains").
 *		Kept per call site (fn_extra, freed with it): the type cache's
 *		current constraints of the domain, and their checks compiled once
 *		for that set; a change of the domain's constraints (the type cache
 *		gives a new set) compiles them again in place of the old ones.
 */
typedef struct DomainFit
{
	Oid			typid;
	DomainConstraintRef ref;	/* the type cache's constraints, not compiled */
	void	   *compiled_for;	/* ref.constraints when checks were compiled */
	MemoryContext checks_context;	/* what they were compiled into */
	int			nchecks;
	ExprState **checks;
	ExprContext *econtext;
} DomainFit;

static DomainFit *
domain_fit(FmgrInfo *flinfo, Oid typid)
{
	DomainFit  *fit = (DomainFit *) flinfo->fn_extra;
	MemoryContext oldcxt;
	ListCell   *lc;
	int			n;

	if (fit == NULL || fit->typid != typid)
	{
		if (get_typtype(typid) != TYPTYPE_DOMAIN || getBaseType(typid) != TEXTOID)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s is not a domain over text", format_type_be(typid))));
		oldcxt = MemoryContextSwitchTo(flinfo->fn_mcxt);
		fit = palloc0(sizeof(DomainFit));
		fit->typid = typid;
		InitDomainConstraintRef(typid, &fit->ref, flinfo->fn_mcxt, false);
		fit->checks_context = AllocSetContextCreate(flinfo->fn_mcxt, "payidem domain checks",
													ALLOCSET_SMALL_SIZES);
		fit->econtext = CreateStandaloneExprContext();
		MemoryContextSwitchTo(oldcxt);
		flinfo->fn_extra = fit;		/* a previous one is left to fn_mcxt */
	}
	UpdateDomainConstraintRef(&fit->ref);
	if (fit->checks != NULL && fit->compiled_for == (void *) fit->ref.constraints)
		return fit;
	MemoryContextReset(fit->checks_context);
	oldcxt = MemoryContextSwitchTo(fit->checks_context);
	fit->checks = palloc0(sizeof(ExprState *) * (list_length(fit->ref.constraints) + 1));
	n = 0;
	foreach(lc, fit->ref.constraints)
	{
		DomainConstraintState *con = (DomainConstraintState *) lfirst(lc);

		if (con->constrainttype == DOM_CONSTRAINT_CHECK)
			fit->checks[n++] = ExecInitExpr(con->check_expr, NULL);
		/* NOT NULL: the value is not NULL (STRICT) */
	}
	fit->nchecks = n;
	fit->compiled_for = (void *) fit->ref.constraints;
	MemoryContextSwitchTo(oldcxt);
	return fit;
}

/*
 * The version this shared library was built as (payidem.control's
 * default_version, passed by the Makefile).  One library serves every SQL
 * version it has an upgrade path from; after a newer build is installed and
 * the server restarted, a database still runs its old SQL until ALTER
 * EXTENSION payidem UPDATE.
 */
#ifndef PAYIDEM_VERSION
#error "PAYIDEM_VERSION is defined by the Makefile (payidem.control's default_version)"
#endif

PG_FUNCTION_INFO_V1(payidem_library_version);
Datum
payidem_library_version(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(PAYIDEM_VERSION));
}

PG_FUNCTION_INFO_V1(payidem_fits);
Datum
payidem_fits(PG_FUNCTION_ARGS)
{
	DomainFit  *fit = domain_fit(fcinfo->flinfo, PG_GETARG_OID(1));
	ExprContext *econtext = fit->econtext;
	bool		fits = true;
	int			i;

	econtext->domainValue_datum = PG_GETARG_DATUM(0);
	econtext->domainValue_isNull = false;
	for (i = 0; i < fit->nchecks; i++)
	{
		bool		isnull;
		Datum		ok = ExecEvalExprSwitchContext(fit->checks[i], econtext, &isnull);

		/* as a CHECK: NULL passes */
		if (!isnull && !DatumGetBool(ok))
		{
			fits = false;
			break;
		}
	}
	ResetExprContext(econtext);
	PG_RETURN_BOOL(fits);
}

/*
 * A plan prepared once and kept for the rest of the session (SPI_keepplan),
 * always generic: the callers' parameters never change the best plan, so a
 * custom plan would cost planning time at every call.  *cache holds it;
 * PostgreSQL re-plans it when an object it uses changes.  The caller is
 * SPI-connected.  The one place payidem's C parts prepare their SQL.
 */
SPIPlanPtr
payidem_saved_plan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan;

	if (*cache != NULL)
		return *cache;
	plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "payidem: could not prepare \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "payidem: could not keep the plan of \"%s\"", sql);
	*cache = plan;
	return plan;
}

/*
 * The number of column name of desc, or SPI_ERROR_NOATTRIBUTE; as
 * SPI_fnumber, without its walk over every column's name on each call.  The
 * triggers read a dozen columns of each row they see, by names that are
 * string constants: the number found for each is kept, keyed by the
 * constant's address and the row type (one constant may name a column of
 * two tables), and used when the column at that number still has that name
 * (a table altered since just looks again).  A slot another key needs is
 * simply taken over.
 */
#define ATTNUM_CACHE_SIZE 1024	/* a power of two */

int
payidem_attnum(TupleDesc desc, const char *name)
{
	static struct
	{
		const char *name;
		Oid			rowtype;
		int			attnum;
	}			cache[ATTNUM_CACHE_SIZE];
	uint32		h = hash_combine((uint32) ((uintptr_t) name >> 3), desc->tdtypeid) &
		(ATTNUM_CACHE_SIZE - 1);
	int			attnum;

	if (cache[h].name == name && cache[h].rowtype == desc->tdtypeid)
	{
		attnum = cache[h].attnum;
		if (attnum > 0 && attnum <= desc->natts &&
			!TupleDescAttr(desc, attnum - 1)->attisdropped &&
			strcmp(NameStr(TupleDescAttr(desc, attnum - 1)->attname), name) == 0)
			return attnum;
	}
	attnum = SPI_fnumber(desc, name);
	if (attnum > 0)
	{
		cache[h].name = name;
		cache[h].rowtype = desc->tdtypeid;
		cache[h].attnum = attnum;
	}
	return attnum;
}

/*
 * Versions of rows this backend wrote directly in its current transaction
 * (flow.c's updates): where a later look-up by key in the same transaction
 * (the event, the bookkeeping at commit) may find the row without an index
 * descent.  Only a hint: a look-up takes it only if the version at that tid
 * is the one its snapshot sees and has the key asked for -- an MVCC snapshot
 * sees at most one row with a key of a unique index -- and otherwise
 * descends the index.  Kept for the transaction and relfilenode it was
 * written in, and forgotten when the subtransaction that wrote it aborts: so
 * the block exists (a TRUNCATE makes a new file; VACUUM cannot shorten a
 * table while the write's RowExclusiveLock is held, which an aborted
 * subtransaction releases).
 */
#define RECENT_VERSIONS 4
typedef struct RecentVersion
{
	Oid			relid;
	Oid			relfilenode;
	TransactionId xid;
	SubTransactionId subid;		/* of the write, or of the parent it passed to */
	ItemPointerData tid;
} RecentVersion;
static RecentVersion recent_versions[RECENT_VERSIONS];
static int	recent_next;
static bool recent_callback_registered = false;

static void
recent_versions_subxact(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	int			i;

	for (i = 0; i < RECENT_VERSIONS; i++)
	{
		if (recent_versions[i].subid != mySubid || !OidIsValid(recent_versions[i].relid))
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			recent_versions[i].relid = InvalidOid;
		else if (event == SUBXACT_EVENT_COMMIT_SUB)
			recent_versions[i].subid = parentSubid;
	}
}

void
payidem_remember_version(Relation heap, ItemPointer tid)
{
	TransactionId xid = GetTopTransactionIdIfAny();
	RecentVersion *r = NULL;
	int			i;

	if (!TransactionIdIsValid(xid) || !ItemPointerIsValid(tid))
		return;
	if (!recent_callback_registered)
	{
		RegisterSubXactCallback(recent_versions_subxact, NULL);
		recent_callback_registered = true;
	}
	for (i = 0; i < RECENT_VERSIONS && r == NULL; i++)
		if (recent_versions[i].relid == RelationGetRelid(heap))
			r = &recent_versions[i];
	if (r == NULL)
	{
		r = &recent_versions[recent_next];
		recent_next = (recent_next + 1) % RECENT_VERSIONS;
	}
	r->relid = RelationGetRelid(heap);
	r->relfilenode = heap->rd_rel->relfilenode;
	r->xid = xid;
	r->subid = GetCurrentSubTransactionId();
	r->tid = *tid;
}

/* the remembered version of heap with key keys[] in irel, visible to snapshot */
static HeapTuple
fetch_remembered(Relation heap, Relation irel, const ScanKeyData *skey, int nkeys,
				 Snapshot snapshot, TupleTableSlot *slot)
{
	TransactionId xid = GetTopTransactionIdIfAny();
	int			i;
	int			k;

	if (!TransactionIdIsValid(xid) || !IsMVCCSnapshot(snapshot))
		return NULL;
	for (i = 0; i < RECENT_VERSIONS; i++)
	{
		RecentVersion *r = &recent_versions[i];
		bool		same = true;

		if (r->relid != RelationGetRelid(heap) || r->relfilenode != heap->rd_rel->relfilenode ||
			!TransactionIdEquals(r->xid, xid))
			continue;
		if (!table_tuple_fetch_row_version(heap, &r->tid, snapshot, slot))
			return NULL;
		for (k = 0; k < nkeys && same; k++)
		{
			bool		isnull;
			Datum		v = slot_getattr(slot, irel->rd_index->indkey.values[k], &isnull);

			same = !isnull &&
				DatumGetBool(FunctionCall2Coll(unconstify(FmgrInfo *, &skey[k].sk_func),
											   skey[k].sk_collation, v, skey[k].sk_argument));
		}
		return same ? ExecCopySlotHeapTuple(slot) : NULL;
	}
	return NULL;
}

/*
 * The row of heap whose key in heap's btree index payidem.<index> is keys[]
 * (one per key column), visible to snapshot, and -- if filter is a column
 * name -- whose text column filter equals filter_value: a copy, or NULL (and,
 * if all is given, every such row appended to *all).  A
 * look-up by key without SQL, with the index's own equality operators and
 * collations; no plan, and no privilege or row-security check: for code that
 * reads as the tables' owner.  heap is open and locked by the caller.  For a
 * unique index without a filter, a version this transaction wrote and
 * remembered (payidem_remember_version) is tried first.
 */
static HeapTuple
fetch_by_key(Relation heap, const char *index, int nkeys, const Datum *keys, Snapshot snapshot,
			 bool unique, const char *filter, Datum filter_value, List **all)
{
	Relation	irel = index_open(payidem_relid(index), AccessShareLock);
	ScanKeyData skey[INDEX_MAX_KEYS];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	HeapTuple	tuple = NULL;
	int			filter_attnum = 0;
	int			i;

	if (irel->rd_rel->relam != BTREE_AM_OID || (unique && !irel->rd_index->indisunique) ||
		irel->rd_index->indrelid != RelationGetRelid(heap) ||
		IndexRelationGetNumberOfKeyAttributes(irel) != nkeys)
		elog(ERROR, "payidem: index payidem.%s is not the %sbtree index of %d columns of %s expected",
			 index, unique ? "unique " : "", nkeys, RelationGetRelationName(heap));
	if (filter != NULL && (filter_attnum = payidem_attnum(RelationGetDescr(heap), filter)) <= 0)
		elog(ERROR, "payidem: column %s of %s is missing", filter, RelationGetRelationName(heap));
	for (i = 0; i < nkeys; i++)
	{
		Oid			op = get_opfamily_member(irel->rd_opfamily[i], irel->rd_opcintype[i],
											 irel->rd_opcintype[i], BTEqualStrategyNumber);

		if (!OidIsValid(op) || irel->rd_index->indkey.values[i] == 0)
			elog(ERROR, "payidem: no equality operator for column %d of index payidem.%s", i + 1, index);
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   irel->rd_indcollation[i], get_opcode(op), keys[i]);
	}
	slot = table_slot_create(heap, NULL);
	if (unique && filter == NULL)
		tuple = fetch_remembered(heap, irel, skey, nkeys, snapshot, slot);
	if (tuple == NULL)
	{
		scan = index_beginscan_compat(heap, irel, snapshot, nkeys);
		index_rescan(scan, skey, nkeys, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;

			if (filter_attnum > 0 &&
				!(payidem_text_equal(slot_getattr(slot, filter_attnum, &isnull), filter_value) && !isnull))
				continue;
			tuple = ExecCopySlotHeapTuple(slot);
			if (all == NULL)
				break;
			*all = lappend(*all, tuple);	/* and go on */
		}
		index_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(irel, NoLock);	/* locked until the transaction ends, as a query's */
	return tuple;
}

/* the row of heap whose key in its unique btree index payidem.<index> is keys[] */
HeapTuple
payidem_fetch_unique(Relation heap, const char *index, int nkeys, const Datum *keys, Snapshot snapshot)
{
	return fetch_by_key(heap, index, nkeys, keys, snapshot, true, NULL, (Datum) 0, NULL);
}

/* every row of heap with key keys[] in btree index payidem.<index> and text column column = value */
List *
payidem_fetch_all_key_where(Relation heap, const char *index, int nkeys, const Datum *keys,
							Snapshot snapshot, const char *column, Datum value)
{
	List	   *all = NIL;

	(void) fetch_by_key(heap, index, nkeys, keys, snapshot, false, column, value, &all);
	return all;
}

/*
 * The version of a row at tid, if it is the one snapshot sees: a copy, or
 * NULL (a later version, or none, is visible).  An MVCC snapshot sees one
 * version of a row at most, so a version it sees is the row as it stands:
 * a trigger's tuple checked this way costs a page read, not an index
 * descent.
 */
HeapTuple
payidem_fetch_version(Relation heap, ItemPointer tid, Snapshot snapshot)
{
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	HeapTuple	tuple = NULL;

	if (table_tuple_fetch_row_version(heap, tid, snapshot, slot))
		tuple = ExecCopySlotHeapTuple(slot);
	ExecDropSingleTupleTableSlot(slot);
	return tuple;
}

/*
 * A trigger's reads and writes on the tables' behalf: as their owner, with
 * a snapshot that sees every write of the transaction so far (as a next
 * statement would; also the writes of the statement firing it).  Undone by
 * payidem_end_as_owner, or by the (sub)transaction's abort on an error.
 */
void
payidem_begin_as_owner(Oid owner, PayidemAsOwner *save)
{
	GetUserIdAndSecContext(&save->userid, &save->sec_context);
	SetUserIdAndSecContext(owner, save->sec_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
}

void
payidem_end_as_owner(const PayidemAsOwner *save)
{
	PopActiveSnapshot();
	SetUserIdAndSecContext(save->userid, save->sec_context);
}

/* The owner of a relation, from the syscache. */
Oid
payidem_relation_owner(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

/*
 * OID of payidem.<relname>; a clear error if the extension is missing.  The
 * names asked for are kept with their OIDs (a few per backend: the tables
 * and indexes the triggers read and write on every change), and forgotten
 * when that relation changes (a rename, a drop: its relcache invalidation),
 * at a full reset, or when a schema changes (a rename of payidem).
 */
#define RELID_CACHE_SIZE 16

typedef struct RelidEntry
{
	char		name[NAMEDATALEN];
	Oid			relid;
} RelidEntry;

static RelidEntry relid_cache[RELID_CACHE_SIZE];
static int	n_relid_cache = 0;
static bool relid_callbacks_registered = false;

static void
relid_relcache_callback(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < n_relid_cache; i++)
		if (relid == InvalidOid || relid_cache[i].relid == relid)
		{
			n_relid_cache = 0;
			return;
		}
}

static void
relid_namespace_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	n_relid_cache = 0;
}

Oid
payidem_relid(const char *relname)
{
	Oid			nsp;
	Oid			relid = InvalidOid;
	int			i;

	for (i = 0; i < n_relid_cache; i++)
		if (strcmp(relid_cache[i].name, relname) == 0)
			return relid_cache[i].relid;
	if (!relid_callbacks_registered)
	{
		payidem_register_relcache_callback(relid_relcache_callback, (Datum) 0);
		payidem_register_syscache_callback(NAMESPACEOID, relid_namespace_callback, (Datum) 0);
		relid_callbacks_registered = true;
	}
	nsp = get_namespace_oid("payidem", true);
	if (OidIsValid(nsp))
		relid = get_relname_relid(relname, nsp);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation payidem.%s does not exist", relname),
				 errhint("Run CREATE EXTENSION payidem in this database.")));
	if (n_relid_cache < RELID_CACHE_SIZE && strlen(relname) < NAMEDATALEN)
	{
		strlcpy(relid_cache[n_relid_cache].name, relname, NAMEDATALEN);
		relid_cache[n_relid_cache].relid = relid;
		n_relid_cache++;
	}
	return relid;
}

/*
 * Cache invalidation callbacks.  A backend has room for only a few relcache
 * and syscache callbacks, shared with every other extension (DESIGN §1), so
 * payidem registers one of each kind in all — one relcache callback, one per
 * syscache it watches — and each part's callback is called from there.
 * The parts register on first use; registering the same function twice is
 * a no-op.
 */
#define PAYIDEM_MAX_CALLBACKS 12
#define PAYIDEM_MAX_SYSCACHES 6

typedef struct RelcacheEntry
{
	PayidemRelcacheCallback func;
	Datum		arg;
} RelcacheEntry;

typedef struct SyscacheEntry
{
	PayidemSyscacheCallback func;
	Datum		arg;
} SyscacheEntry;

static RelcacheEntry relcache_callbacks[PAYIDEM_MAX_CALLBACKS];
static int	n_relcache_callbacks = 0;

typedef struct SyscacheCallbacks
{
	int			cacheid;
	int			n;
	SyscacheEntry entries[PAYIDEM_MAX_CALLBACKS];
} SyscacheCallbacks;

static SyscacheCallbacks syscache_callbacks[PAYIDEM_MAX_SYSCACHES];
static int	n_syscaches = 0;

static void
dispatch_relcache(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < n_relcache_callbacks; i++)
		relcache_callbacks[i].func(relcache_callbacks[i].arg, relid);
}

static void
dispatch_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
	SyscacheCallbacks *sc = &syscache_callbacks[DatumGetInt32(arg)];
	int			i;

	for (i = 0; i < sc->n; i++)
		sc->entries[i].func(sc->entries[i].arg, cacheid, hashvalue);
}

void
payidem_register_relcache_callback(PayidemRelcacheCallback func, Datum arg)
{
	int			i;

	for (i = 0; i < n_relcache_callbacks; i++)
		if (relcache_callbacks[i].func == func && relcache_callbacks[i].arg == arg)
			return;
	if (n_relcache_callbacks >= PAYIDEM_MAX_CALLBACKS)
		elog(ERROR, "payidem: too many relcache callbacks");
	if (n_relcache_callbacks == 0)
		CacheRegisterRelcacheCallback(dispatch_relcache, (Datum) 0);
	relcache_callbacks[n_relcache_callbacks].func = func;
	relcache_callbacks[n_relcache_callbacks].arg = arg;
	n_relcache_callbacks++;
}

void
payidem_register_syscache_callback(int cacheid, PayidemSyscacheCallback func, Datum arg)
{
	SyscacheCallbacks *sc = NULL;
	int			i;

	for (i = 0; i < n_syscaches; i++)
		if (syscache_callbacks[i].cacheid == cacheid)
			sc = &syscache_callbacks[i];
	if (sc == NULL)
	{
		if (n_syscaches >= PAYIDEM_MAX_SYSCACHES)
			elog(ERROR, "payidem: too many syscaches watched");
		sc = &syscache_callbacks[n_syscaches];
		sc->cacheid = cacheid;
		sc->n = 0;
		CacheRegisterSyscacheCallback(cacheid, dispatch_syscache, Int32GetDatum(n_syscaches));
		n_syscaches++;
	}
	for (i = 0; i < sc->n; i++)
		if (sc->entries[i].func == func && sc->entries[i].arg == arg)
			return;
	if (sc->n >= PAYIDEM_MAX_CALLBACKS)
		elog(ERROR, "payidem: too many callbacks on syscache %d", cacheid);
	sc->entries[sc->n].func = func;
	sc->entries[sc->n].arg = arg;
	sc->n++;
}
