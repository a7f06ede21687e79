/*-------------------------------------------------------------------------
 *
 * state_machine.c
 *		The order/payment/refund state machines: the constraint trigger
 *		payidem.status_guard() that no UPDATE or INSERT can bypass, the
 *		transit_order/transit_payment/transit_refund() functions (one
 *		conditional UPDATE each, the seeds' optimistic lock), the append-only
 *		guard of payidem.status_log and the per-backend whitelist cache.
 *
 * Whitelist cache: payidem.state and payidem.transition are read once per
 * backend into WhitelistCache (its own memory context under
 * CacheMemoryContext) and kept until a relcache invalidation of one of those
 * tables (or a full reset) arrives.  DML does not send
 * relcache invalidations by itself, so both tables carry a statement-level
 * trigger, payidem.whitelist_changed(), that calls
 * CacheInvalidateRelcacheByRelid(): the change is seen by the next command
 * of the changing transaction (CommandCounterIncrement processes local
 * invalidations), undone locally if it aborts, and broadcast to every other
 * backend at commit.  Each use of the cache first processes the
 * invalidations that arrived (AcceptInvalidationMessages: a read of one flag
 * when there are none), so a transaction that already holds its locks — a
 * PL/pgSQL loop, a prepared UPDATE — sees another session's committed change
 * at its next row too, not only at its next lock.  The cache is read with a fresh snapshot (GetLatestSnapshot),
 * not the transaction snapshot, so a backend in a REPEATABLE READ transaction
 * cannot cache a whitelist older than the invalidations it has processed.
 * The relcache callback only marks the cache stale; memory is released when
 * the next reader rebuilds it, and callers never keep cache pointers across
 * a call that may rebuild it.
 *
 * Plans and writes: the repeated statements (the transit UPDATEs and their
 * follow-up SELECTs, the two whitelist reads) are prepared once per backend
 * with SPI_prepare_cursor(CURSOR_OPT_GENERIC_PLAN) + SPI_keepplan; nothing is
 * parsed or planned per row.  The status_log row is written without SQL at
 * all: a direct executor insert (ExecSimpleRelationInsert, as logical
 * replication's apply worker does), which still checks its constraints and
 * maintains its indexes.
 *
 * Privileges: the whitelist is read as the owner of payidem.state
 * (SetUserIdAndSecContext, as the RI triggers do) and the log row is written
 * by trusted C code with no permission check, so a role that may update
 * "order" needs no right on state, transition or status_log — it cannot
 * forge history.  changed_by records the role that made the change (the
 * caller of a SECURITY DEFINER function, GetOuterUserId).  transit_*() run
 * their UPDATE as the tables' owner, like payidem's SECURITY DEFINER
 * functions: the caller needs EXECUTE only, and row-level policies for
 * reporting roles do not hide rows from them.
 *
 * Locking: transit_*() relies on the row lock its UPDATE takes.  Under READ
 * COMMITTED a concurrent change of the same row makes the UPDATE wait, then
 * re-check the WHERE clause against the committed version (EvalPlanQual);
 * when it no longer matches, a fresh-snapshot SELECT tells "already there"
 * (false) from "illegal" (PI002).  No lock is taken on the whitelist tables
 * beyond the AccessShareLock of reading them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "direct.h"
#include "errcodes.h"
#include "inval.h"
#include "order_no_codec.h"
#include "replication.h"
#include "shmem.h"
#include "util.h"

/* one status of an entity */
typedef struct WhitelistState
{
	char	   *status;
	int			len;
	bool		initial;
	bool		terminal;
	Datum		predecessors;	/* text[] of the statuses that may move here */
} WhitelistState;

/* one allowed change */
typedef struct WhitelistTransition
{
	char	   *from_status;
	int			from_len;
	char	   *to_status;
	int			to_len;
} WhitelistTransition;

/* the state machine of one entity ('order', 'payment', ...) */
typedef struct WhitelistEntity
{
	char	   *name;
	int			nstates;
	WhitelistState *states;
	WhitelistState *initial;	/* NULL if the entity has none */
	int			ntransitions;
	WhitelistTransition *transitions;	/* sorted by from, to (C collation) */
} WhitelistEntity;

typedef struct WhitelistCache
{
	MemoryContext context;
	int			nentities;
	WhitelistEntity *entities;
} WhitelistCache;

static WhitelistCache *whitelist = NULL;	/* NULL = stale, rebuild on use */
static uint64 whitelist_inval_count = 0;	/* bumped by the callback */
static bool callback_registered = false;

/* relations whose invalidation makes the cache stale; found at (re)load */
static Oid	state_relid = InvalidOid;
static Oid	transition_relid = InvalidOid;
static Oid	whitelist_owner = InvalidOid;	/* owner of payidem.state */

/* saved plans */
static SPIPlanPtr load_states_plan = NULL;
static SPIPlanPtr load_transitions_plan = NULL;

/*
 * What transit_<entity>() needs to know of its table.  The UPDATE sets the
 * timestamps the target status implies; $1 key, $2 target, $3 the allowed
 * predecessors of the target (text[], from the cache).
 */
typedef struct TransitTarget
{
	const char *entity;
	const char *funcname;
	const char *update_sql;
	const char *select_sql;
	SPIPlanPtr	update_plan;
	SPIPlanPtr	select_plan;
} TransitTarget;

#define EQ " OPERATOR(pg_catalog.=) "

static TransitTarget transit_targets[] = {
	{
		"order", "transit_order",
		"UPDATE payidem.\"order\" SET status = $2, updated_at = pg_catalog.now(),"
		" paid_at = CASE WHEN $2" EQ "'paid' THEN COALESCE(paid_at, pg_catalog.now()) ELSE paid_at END,"
		" closed_at = CASE WHEN $2" EQ "'closed' THEN pg_catalog.now() ELSE closed_at END"
		" WHERE order_no" EQ "$1 AND status" EQ "ANY ($3)",
		"SELECT status FROM payidem.\"order\" WHERE order_no" EQ "$1",
		NULL, NULL
	},
	{
		"payment", "transit_payment",
		"UPDATE payidem.payment SET status = $2, updated_at = pg_catalog.now(),"
		" paid_at = CASE WHEN $2" EQ "'succeeded' THEN COALESCE(paid_at, pg_catalog.now()) ELSE paid_at END,"
		" closed_at = CASE WHEN $2" EQ "'closed' THEN pg_catalog.now() ELSE closed_at END"
		" WHERE payment_no" EQ "$1 AND status" EQ "ANY ($3)",
		"SELECT status FROM payidem.payment WHERE payment_no" EQ "$1",
		NULL, NULL
	},
	{
		"refund", "transit_refund",
		"UPDATE payidem.refund SET status = $2, updated_at = pg_catalog.now(),"
		" refunded_at = CASE WHEN $2" EQ "'succeeded' THEN pg_catalog.now() ELSE refunded_at END"
		" WHERE refund_no" EQ "$1 AND status" EQ "ANY ($3)",
		"SELECT status FROM payidem.refund WHERE refund_no" EQ "$1",
		NULL, NULL
	},
};

#define TRANSIT_ORDER	0
#define TRANSIT_PAYMENT	1
#define TRANSIT_REFUND	2

/* how often transit_*() retries when a concurrent change moved the row */
#define TRANSIT_MAX_RETRIES 3


/*
 * Relcache callback: a change of payidem.state or payidem.transition (or a
 * full reset, relid = InvalidOid) makes the cache
 * stale.  Only flags it: the memory is freed by the next rebuild, because a
 * callback can run in the middle of code that is reading the cache.
 */
static void
whitelist_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == state_relid || relid == transition_relid)
	{
		whitelist_inval_count++;
		whitelist = NULL;
	}
}

/* copy column col of SPI result row into the current memory context */
static char *
spi_text(int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

static WhitelistEntity *
find_entity_in(WhitelistCache *cache, const char *name)
{
	int			i;

	for (i = 0; i < cache->nentities; i++)
		if (strcmp(cache->entities[i].name, name) == 0)
			return &cache->entities[i];
	return NULL;
}

/*
 * Read both whitelist tables into a new cache, as their owner and with the
 * latest snapshot.  The new context hangs under the caller's context until
 * the cache is complete, so an error frees it with the transaction.
 */
static WhitelistCache *
whitelist_load(void)
{
	MemoryContext buildcxt;
	MemoryContext oldcxt;
	WhitelistCache *cache;
	PayidemAsOwner as_owner;
	uint64		nstates;
	uint64		ntrans;
	uint64		i;
	int			e;

	state_relid = payidem_relation(PAYIDEM_STATE);
	transition_relid = payidem_relation(PAYIDEM_TRANSITION);
	whitelist_owner = payidem_owner(PAYIDEM_STATE);

	buildcxt = AllocSetContextCreate(CurrentMemoryContext,
									 "payidem whitelist",
									 ALLOCSET_SMALL_SIZES);
	cache = MemoryContextAllocZero(buildcxt, sizeof(WhitelistCache));
	cache->context = buildcxt;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	payidem_saved_plan(&load_states_plan,
			"SELECT entity, status, initial, terminal FROM payidem.state"
			" ORDER BY entity COLLATE \"C\", status COLLATE \"C\"", 0, NULL);
	payidem_saved_plan(&load_transitions_plan,
			"SELECT entity, from_status, to_status FROM payidem.transition"
			" ORDER BY entity COLLATE \"C\", from_status COLLATE \"C\", to_status COLLATE \"C\"", 0, NULL);

	payidem_become_owner(whitelist_owner, SECURITY_NOFORCE_RLS, &as_owner);

	/* statuses: count the entities first (rows are ordered by entity) */
	if (SPI_execute_snapshot(load_states_plan, NULL, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading payidem.state failed");
	nstates = SPI_processed;
	oldcxt = MemoryContextSwitchTo(buildcxt);
	{
		char	   *prev = NULL;

		cache->entities = palloc0(sizeof(WhitelistEntity) * Max(nstates, 1));
		for (i = 0; i < nstates; i++)
		{
			char	   *entity = spi_text(i, 1);
			WhitelistEntity *ent;
			WhitelistState *st;
			bool		isnull;

			if (prev == NULL || strcmp(prev, entity) != 0)
			{
				ent = &cache->entities[cache->nentities++];
				ent->name = entity;
				ent->states = palloc0(sizeof(WhitelistState) * nstates);
				prev = entity;
			}
			ent = &cache->entities[cache->nentities - 1];
			st = &ent->states[ent->nstates++];
			st->status = spi_text(i, 2);
			st->len = strlen(st->status);
			st->initial = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3, &isnull));
			st->terminal = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 4, &isnull));
			if (st->initial)
				ent->initial = st;
		}
	}
	MemoryContextSwitchTo(oldcxt);

	if (SPI_execute_snapshot(load_transitions_plan, NULL, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading payidem.transition failed");
	ntrans = SPI_processed;
	payidem_become_caller(&as_owner);

	oldcxt = MemoryContextSwitchTo(buildcxt);
	for (e = 0; e < cache->nentities; e++)
		cache->entities[e].transitions = palloc0(sizeof(WhitelistTransition) * Max(ntrans, 1));
	for (i = 0; i < ntrans; i++)
	{
		char	   *entity = spi_text(i, 1);
		WhitelistEntity *ent = find_entity_in(cache, entity);
		WhitelistTransition *tr;

		if (ent == NULL)
			continue;			/* impossible: foreign keys to payidem.state */
		tr = &ent->transitions[ent->ntransitions++];
		tr->from_status = spi_text(i, 2);
		tr->from_len = strlen(tr->from_status);
		tr->to_status = spi_text(i, 3);
		tr->to_len = strlen(tr->to_status);
	}

	/* the allowed predecessors of every status, as the text[] transit_*() binds */
	for (e = 0; e < cache->nentities; e++)
	{
		WhitelistEntity *ent = &cache->entities[e];
		int			s;

		for (s = 0; s < ent->nstates; s++)
		{
			WhitelistState *st = &ent->states[s];
			Datum	   *elems = palloc(sizeof(Datum) * Max(ent->ntransitions, 1));
			int			n = 0;
			int			t;

			for (t = 0; t < ent->ntransitions; t++)
				if (strcmp(ent->transitions[t].to_status, st->status) == 0)
					elems[n++] = CStringGetTextDatum(ent->transitions[t].from_status);
			st->predecessors = PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
		}
	}
	MemoryContextSwitchTo(oldcxt);

	SPI_finish();
	return cache;
}

/*
 * The current whitelist, rebuilt if stale.  The pointer stays valid until the
 * next call of this function; do not keep it across SPI calls that may fire
 * the triggers (they call this function too).
 */
static WhitelistCache *
whitelist_get(void)
{
	static MemoryContext current_context = NULL;

	if (!callback_registered)
	{
		payidem_register_relcache_callback(whitelist_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	AcceptInvalidationMessages();

	while (whitelist == NULL)
	{
		uint64		before = whitelist_inval_count;
		WhitelistCache *fresh = whitelist_load();

		/* keep it beyond this transaction; free the one it replaces */
		MemoryContextSetParent(fresh->context, CacheMemoryContext);
		if (current_context != NULL)
			MemoryContextDelete(current_context);
		current_context = fresh->context;

		/* an invalidation that arrived while reading means: read again */
		if (before == whitelist_inval_count)
			whitelist = fresh;
	}
	return whitelist;
}

static WhitelistState *
find_state(WhitelistEntity *ent, const char *status, int len)
{
	int			i;

	if (ent == NULL)
		return NULL;
	for (i = 0; i < ent->nstates; i++)
		if (ent->states[i].len == len && memcmp(ent->states[i].status, status, len) == 0)
			return &ent->states[i];
	return NULL;
}

static bool
transition_allowed(WhitelistEntity *ent, const char *from, int from_len,
				   const char *to, int to_len)
{
	int			i;

	for (i = 0; i < ent->ntransitions; i++)
	{
		WhitelistTransition *tr = &ent->transitions[i];

		if (tr->from_len == from_len && tr->to_len == to_len &&
			memcmp(tr->from_status, from, from_len) == 0 &&
			memcmp(tr->to_status, to, to_len) == 0)
			return true;
	}
	return false;
}

/*
 * "Allowed from 'x': 'a', 'b'." / "Allowed from 'x': none (terminal status)."
 * — the HINT of an illegal change.
 */
static char *
allowed_hint(WhitelistEntity *ent, const char *from)
{
	StringInfoData buf;
	WhitelistState *st = find_state(ent, from, strlen(from));
	int			n = 0;
	int			i;

	initStringInfo(&buf);
	appendStringInfo(&buf, "Allowed from '%s': ", from);
	if (st != NULL && st->terminal)
	{
		appendStringInfoString(&buf, "none (terminal status).");
		return buf.data;
	}
	for (i = 0; ent != NULL && i < ent->ntransitions; i++)
	{
		if (strcmp(ent->transitions[i].from_status, from) != 0)
			continue;
		appendStringInfo(&buf, "%s'%s'", n > 0 ? ", " : "", ent->transitions[i].to_status);
		n++;
	}
	appendStringInfoString(&buf, n > 0 ? "." : "none.");
	return buf.data;
}

/* the statuses of an entity, quoted and comma-separated (for a HINT) */
static char *
known_statuses(WhitelistEntity *ent)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; ent != NULL && i < ent->nstates; i++)
		appendStringInfo(&buf, "%s'%s'", i > 0 ? ", " : "", ent->states[i].status);
	if (buf.len == 0)
		appendStringInfoString(&buf, "none");
	return buf.data;
}

/* Raise PI002 for a change the whitelist does not allow. */
static void
report_illegal_change(WhitelistEntity *ent, const char *entity, const char *quoted_key,
					  const char *from, const char *to)
{
	payidem_count(PAYIDEM_TRANSITIONS_REJECTED);
	ereport(ERROR,
			(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
			 errmsg("status change not allowed by the %s state machine", entity),
			 errdetail("%s %s: '%s' -> '%s' is not allowed", entity, quoted_key, from, to),
			 errhint("%s", allowed_hint(ent, from))));
}

/* NUL-terminated copy of a text value, and its length */
static char *
text_datum_cstring(Datum d, int *len)
{
	text	   *t = DatumGetTextPP(d);

	*len = VARSIZE_ANY_EXHDR(t);
	return text_to_cstring(t);
}

/*
 * Append one row to payidem.status_log, a direct insert (src/direct.c): NOT
 * NULL and CHECK constraints, index entries (the key ends in log_id) and stored
 * generated columns are handled by the executor, with no SQL, plan or
 * snapshot per row.  The known columns are filled here -- log_id from its
 * sequence, changed_at = now(), changed_by = the acting role (GetOuterUserId:
 * the session's role, not the owner that SECURITY DEFINER code or the
 * transit functions run as), txid = txid_current() -- and any column added
 * later gets its default.  Trusted code writing on the log owner's behalf:
 * no permission check, so application roles need no right on status_log
 * and cannot write it themselves.
 */
static void
append_status_log(const char *entity, Datum entity_no, Datum from_status,
				  bool from_null, Datum to_status)
{
	static const char *const columns[] = {
		"log_id", "entity", "entity_no", "from_status", "to_status", "changed_at", "changed_by", "txid"
	};
	static const Oid types[] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, INT8OID};
	static PayidemInsert *log_insert = NULL;
	Datum		values[lengthof(columns)];
	bool		nulls[lengthof(columns)] = {false, false, false, false, false, false, false, false};

	if (log_insert == NULL)
		log_insert = payidem_insert_define(PAYIDEM_STATUS_LOG, lengthof(columns), columns, types);
	values[0] = Int64GetDatum(nextval_internal(payidem_relation(PAYIDEM_STATUS_LOG_LOG_ID_SEQ), false));
	values[1] = CStringGetTextDatum(entity);
	values[2] = entity_no;
	values[3] = from_status;
	nulls[3] = from_null;
	values[4] = to_status;
	values[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[6] = CStringGetTextDatum(GetUserNameFromId(GetOuterUserId(), false));
	values[7] = Int64GetDatum((int64) U64FromFullTransactionId(GetTopFullTransactionId()));
	payidem_insert(log_insert, values, nulls);
}

/* the text value of a column (by name) of a trigger tuple, as a text Datum */
static Datum
tuple_text_column(Relation rel, HeapTuple tuple, const char *colname, bool *isnull)
{
	TupleDesc	tupdesc = RelationGetDescr(rel);
	int			attnum = payidem_attnum(tupdesc, colname);
	Datum		d;
	Oid			typid;

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist",
						colname, RelationGetRelationName(rel)),
				 errhint("Check the arguments of the status_guard trigger.")));
	d = heap_getattr(tuple, attnum, tupdesc, isnull);
	if (*isnull)
		return (Datum) 0;
	typid = TupleDescAttr(tupdesc, attnum - 1)->atttypid;
	if (typid == TEXTOID || typid == VARCHAROID)
		return d;
	/* a domain over text (the numbers are) is text as it is stored */
	if (payidem_base_type(typid) == TEXTOID)
		return d;
	return CStringGetTextDatum(SPI_getvalue(tuple, tupdesc, attnum));
}

/* the key of a row, quoted for a message */
static char *
quote_key(Datum key)
{
	text	   *t = DatumGetTextPP(key);

	return payidem_quote_value(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

/* a NULL status or key: nothing to check a transition against or log under */
static void
guard_null_column(Relation rel, const char *entity, const char *colname)
{
	payidem_count(PAYIDEM_TRANSITIONS_REJECTED);
	ereport(ERROR,
			(errcode(ERRCODE_NOT_NULL_VIOLATION),
			 errmsg("column \"%s\" of relation \"%s\" must not be NULL in the %s state machine",
					colname, RelationGetRelationName(rel), entity),
			 errdetail("payidem.status_guard('%s', ...) checks every status change and logs it under the row's key.",
					   entity),
			 errhint("Declare column \"%s\" NOT NULL.", colname)));
}


/*
 * The built-in entities belong to payidem's own tables: a trigger on another
 * table (made by a role given EXECUTE on status_guard for its own entities)
 * must not write history for real orders, payments or refunds.
 */
/* the table of one of payidem's entities ("order", payment, refund, payout): false for another */
static bool
entity_table(const char *entity, PayidemRelation *table)
{
	if (strcmp(entity, "order") == 0)
		*table = PAYIDEM_ORDER;
	else if (strcmp(entity, "payment") == 0)
		*table = PAYIDEM_PAYMENT;
	else if (strcmp(entity, "refund") == 0)
		*table = PAYIDEM_REFUND;
	else if (strcmp(entity, "payout") == 0)
		*table = PAYIDEM_PAYOUT;
	else
		return false;
	return true;
}

static void
guard_check_table(Relation rel, const char *entity)
{
	PayidemRelation table;

	if (!entity_table(entity, &table))
		return;
	if (RelationGetRelid(rel) != payidem_relation(table))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("entity '%s' is guarded only on table payidem.%s", entity,
						quote_identifier(entity)),
				 errdetail("A status_guard trigger on relation \"%s\" names entity '%s'.",
						   RelationGetRelationName(rel), entity),
				 errhint("Use an entity name of your own for your own table, with its rows in payidem.state and payidem.transition.")));
}

/*
 * payidem.status_guard(entity, key_column) — constraint trigger
 *		AFTER INSERT OR UPDATE ... FOR EACH ROW on "order", payment and
 *		refund.  An insert must use the entity's initial status; a status
 *		change must be a row of payidem.transition; the key (the row's number)
 *		never changes.  Anything else is PI002.  It fires for every updated
 *		row, not only for UPDATE OF status: a BEFORE trigger may change the
 *		status of a row whose UPDATE did not name it.  Every accepted insert
 *		or change appends one row to status_log.  Runs on the cached
 *		whitelist: no query per row except the log insert.
 */
PG_FUNCTION_INFO_V1(payidem_status_guard);
Datum
payidem_status_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	const char *entity;
	const char *keycol;
	WhitelistCache *cache;
	WhitelistEntity *ent;
	Relation	rel;
	HeapTuple	newtuple;
	Datum		key;
	Datum		new_status;
	int			new_len;
	char	   *new_s;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_guard() was not called by trigger manager")));
	payidem_require_replication("a status change");
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_guard() must be fired AFTER ... FOR EACH ROW")));
	if (!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) &&
		!TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_guard() must be fired for INSERT or UPDATE")));
	trigger = trigdata->tg_trigger;
	if (trigger->tgnargs != 2)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_guard() needs two arguments: the entity and the key column"),
				 errhint("For example: EXECUTE FUNCTION payidem.status_guard('order', 'order_no').")));
	entity = trigger->tgargs[0];
	keycol = trigger->tgargs[1];
	rel = trigdata->tg_relation;
	guard_check_table(rel, entity);

	newtuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)
		? trigdata->tg_newtuple : trigdata->tg_trigtuple;
	new_status = tuple_text_column(rel, newtuple, "status", &isnull);
	if (isnull)
		guard_null_column(rel, entity, "status");
	key = tuple_text_column(rel, newtuple, keycol, &isnull);
	if (isnull)
		guard_null_column(rel, entity, keycol);
	new_s = text_datum_cstring(new_status, &new_len);

	cache = whitelist_get();
	ent = find_entity_in(cache, entity);

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
	{
		bool		copying;

		if (payidem_restoring(rel, &copying))
			return PointerGetDatum(NULL);	/* as it was, history and all */
		if (ent == NULL || ent->initial == NULL ||
			ent->initial->len != new_len || memcmp(ent->initial->status, new_s, new_len) != 0)
		{
			char	   *quoted = quote_key(key);

			payidem_count(PAYIDEM_TRANSITIONS_REJECTED);
			if (copying && ent != NULL && ent->initial != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
						 errmsg("a new %s must start in status '%s'", entity, ent->initial->status),
						 errdetail("%s %s: copied in as '%s', which is not the initial status.",
								   entity, quoted, new_s),
						 errhint("If this is a restore, run it as the owner of payidem.%s or a superuser: their COPY loads rows as they were dumped.",
								 quote_identifier(RelationGetRelationName(rel)))));
			if (ent == NULL || ent->initial == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
						 errmsg("the %s state machine has no initial status", entity),
						 errdetail("%s %s: inserted as '%s'; payidem.state has no initial status for entity '%s'.",
								   entity, quoted, new_s, entity),
						 errhint("Mark one status of entity '%s' as initial in payidem.state.", entity)));
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
					 errmsg("a new %s must start in status '%s'", entity, ent->initial->status),
					 errdetail("%s %s: inserted as '%s', which is not the initial status.",
							   entity, quoted, new_s),
					 errhint("Insert it as '%s', then change its status through the allowed transitions.",
							 ent->initial->status)));
		}
		append_status_log(entity, key, (Datum) 0, true, new_status);
	}
	else
	{
		Datum		old_status;
		Datum		old_key;
		char	   *old_s;
		int			old_len;

		/*
		 * The number is the row's identity in status_log: renaming it would
		 * move a status (and its history) to another number without any
		 * transition — two renames swap a failed and a succeeded payment.
		 */
		old_key = tuple_text_column(rel, trigdata->tg_trigtuple, keycol, &isnull);
		if (isnull || !payidem_text_equal(old_key, key))
		{
			payidem_count(PAYIDEM_TRANSITIONS_REJECTED);
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
					 errmsg("%s %s cannot be renumbered", entity, isnull ? "NULL" : quote_key(old_key)),
					 errdetail("The update sets %s to %s; a row's status and its status_log history belong to its number.",
							   keycol, quote_key(key)),
					 errhint("Create a new %s instead.", entity)));
		}
		old_status = tuple_text_column(rel, trigdata->tg_trigtuple, "status", &isnull);
		if (isnull)
			guard_null_column(rel, entity, "status");
		old_s = text_datum_cstring(old_status, &old_len);
		if (old_len == new_len && memcmp(old_s, new_s, new_len) == 0)
			return PointerGetDatum(NULL);	/* an update that leaves the status as it is */

		if (ent == NULL || !transition_allowed(ent, old_s, old_len, new_s, new_len))
			report_illegal_change(ent, entity, quote_key(key), old_s, new_s);
		append_status_log(entity, key, old_status, false, new_status);
	}
	payidem_count(PAYIDEM_TRANSITIONS_APPLIED);
	return PointerGetDatum(NULL);
}

/*
 * payidem.whitelist_changed() — trigger AFTER INSERT OR UPDATE OR DELETE OR
 *		TRUNCATE ... FOR EACH STATEMENT on payidem.state and payidem.transition.
 *		Queues a relcache invalidation of the table: this backend's next
 *		command and, after commit, every other backend's next statement
 *		rebuild their whitelist cache.
 */
PG_FUNCTION_INFO_V1(payidem_whitelist_changed);
Datum
payidem_whitelist_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.whitelist_changed() was not called by trigger manager")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.whitelist_changed() must be fired AFTER ... FOR EACH STATEMENT")));

	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}

/*
 * Whether payidem.<table> has a row with this status, looked at with the
 * latest snapshot (not the transaction's: under REPEATABLE READ a row
 * committed while the caller waited for its lock would be invisible) and as
 * the table's owner, row-level security not forced (it must see every row).
 */
static bool
status_rows_exist(PayidemRelation table, Datum status)
{
	Oid			relid = payidem_relation(table);
	StringInfoData query;
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	SPIPlanPtr	plan;
	PayidemAsOwner as_owner;
	bool		found;

	initStringInfo(&query);
	appendStringInfo(&query,
					 "SELECT 1 FROM %s t WHERE t.status OPERATOR(pg_catalog.=) $1 LIMIT 1",
					 quote_qualified_identifier("payidem", get_rel_name(relid)));
	values[0] = status;
	payidem_become_owner(payidem_owner(table), SECURITY_NOFORCE_RLS, &as_owner);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(query.data, 1, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_execute_snapshot(plan, values, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading payidem.%s failed", get_rel_name(relid));
	found = SPI_processed > 0;
	SPI_finish();
	payidem_become_caller(&as_owner);
	pfree(query.data);
	return found;
}

/*
 * payidem._status_in_use(entity text, status text) RETURNS boolean
 *		For the whitelist's guard (a status rows have is not deleted or
 *		renamed, there being no foreign key to payidem.state): whether rows
 *		of the entity's table ("order", payment, refund) have the status.
 *		First a look without a lock, which answers a status in use at once;
 *		if it saw none, the table is locked in SHARE mode to the end of the
 *		transaction — waiting for the writers that might be giving a row the
 *		status, keeping new ones out until the change commits, after which
 *		they see the whitelist without it — and looked at again.  An entity
 *		of a DBA's own has no table here: false.
 */
PG_FUNCTION_INFO_V1(payidem_status_in_use);
Datum
payidem_status_in_use(PG_FUNCTION_ARGS)
{
	char	   *entity;
	PayidemRelation table;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_BOOL(false);
	entity = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!entity_table(entity, &table))
		PG_RETURN_BOOL(false);
	if (status_rows_exist(table, PG_GETARG_DATUM(1)))
		PG_RETURN_BOOL(true);
	LockRelationOid(payidem_relation(table), ShareLock);
	PG_RETURN_BOOL(status_rows_exist(table, PG_GETARG_DATUM(1)));
}

/*
 * payidem.status_log_append_only() — trigger BEFORE UPDATE OR DELETE OR
 *		TRUNCATE ... FOR EACH STATEMENT on payidem.status_log (and, as
 *		payidem._ledger_append_only(), on payidem.ledger_entry), created
 *		ENABLE ALWAYS so that session_replication_role cannot switch it off.
 *		Refuses the statement, for every role including the owner and
 *		superusers.
 */
PG_FUNCTION_INFO_V1(payidem_status_log_append_only);
Datum
payidem_status_log_append_only(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const char *what;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_log_append_only() was not called by trigger manager")));
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("payidem.status_log_append_only() must be fired BEFORE")));

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		what = "UPDATE";
	else if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		what = "DELETE";
	else if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
		what = "TRUNCATE";
	else
		return PointerGetDatum(NULL);	/* INSERT: the log grows */

	if (strcmp(RelationGetRelationName(trigdata->tg_relation), "ledger_entry") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("payidem.ledger_entry is append-only"),
				 errdetail("%s of journal entries is refused for every role, including the owner and superusers.", what),
				 errhint("A correction is a new journal: payidem.adjust_balance().")));
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("payidem.status_log is append-only"),
			 errdetail("%s of status history is refused for every role, including the owner and superusers.", what),
			 errhint("Rows are only ever added, by the state-machine triggers.")));
	PG_RETURN_NULL();			/* keep the compiler quiet */
}

/*
 * An order, payment or refund number must be one (PO/PY/RF, 24 digits, a real
 * date and matching check digits) before it is looked up: anything else is
 * malformed input (22023), not "not found".
 */
static void
check_number_format(TransitTarget *target, text *key)
{
	const char *prefix = strcmp(target->entity, "order") == 0 ? "PO" :
		strcmp(target->entity, "payment") == 0 ? "PY" : "RF";
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	bool		ok = len == 26 && k[0] == prefix[0] && k[1] == prefix[1];
	OrderNoParts parts;
	OrderNoError err;
	int			i;

	for (i = 2; ok && i < len; i++)
		ok = k[i] >= '0' && k[i] <= '9';
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s number %s", target->entity, payidem_quote_value(k, len)),
				 errdetail("A%s %s number is %s followed by 24 digits.",
						   target->entity[0] == 'o' ? "n" : "", target->entity, prefix),
				 errhint("Pass the number payidem returned when it created the %s.", target->entity)));
	err = order_no_parse(k, len, &parts);
	if (err != ORDER_NO_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid %s number %s", target->entity, payidem_quote_value(k, len)),
				 errdetail_internal("%s", order_no_error_text(err)),
				 errhint("Pass the number payidem returned when it created the %s.", target->entity)));
}

/*
 * transit_<entity>(key, to_status): the one conditional UPDATE of the contract.
 *		true  — the row moved to to_status;
 *		false — it already was in to_status (an idempotent repeat);
 *		PI009 — no such row; PI002 — its current status cannot move there;
 *		22023 — to_status is not a status of the entity.
 */
static Datum
transit(FunctionCallInfo fcinfo, int which)
{
	TransitTarget *target = &transit_targets[which];
	text	   *key;
	text	   *to;
	char	   *to_s;
	int			to_len;
	WhitelistCache *cache;
	WhitelistEntity *ent;
	WhitelistState *st;
	Datum		predecessors;
	Datum		values[3];
	char	   *current = NULL;
	int			attempt;
	PayidemAsOwner as_owner;

	/* not STRICT: a NULL argument is an error, never a silent NULL result */
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("arguments of %s() must not be NULL", target->funcname),
				 errdetail("Pass the %s's number and the status to move it to.", target->entity)));
	key = PG_GETARG_TEXT_PP(0);
	to = PG_GETARG_TEXT_PP(1);
	to_s = text_to_cstring(to);
	to_len = VARSIZE_ANY_EXHDR(to);
	check_number_format(target, key);

	cache = whitelist_get();
	ent = find_entity_in(cache, target->entity);
	st = find_state(ent, to_s, to_len);
	if (st == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown %s status %s", target->entity, payidem_quote_value(to_s, to_len)),
				 errdetail("payidem.state has no such status for entity '%s'.", target->entity),
				 errhint("Known %s statuses: %s.", target->entity, known_statuses(ent))));
	/* a private copy: running the UPDATE may rebuild the cache */
	predecessors = datumCopy(st->predecessors, false, -1);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (target->update_plan == NULL)
	{
		Oid			types[3] = {TEXTOID, TEXTOID, TEXTARRAYOID};

		payidem_saved_plan(&target->update_plan, target->update_sql, 3, types);
	}
	if (target->select_plan == NULL)
	{
		Oid			types[1] = {TEXTOID};

		payidem_saved_plan(&target->select_plan, target->select_sql, 1, types);
	}

	values[0] = PointerGetDatum(key);
	values[1] = PointerGetDatum(to);
	values[2] = predecessors;

	/*
	 * Run as the tables' owner (the extension's owner), like a SECURITY
	 * DEFINER function without the cost of a SET clause: an application role
	 * needs EXECUTE on this function, not rights on the tables, and row-level
	 * security for reporting roles does not hide rows from it.  The status
	 * log still records the calling role (GetOuterUserId).  An error restores
	 * the identity with the transaction.
	 */
	payidem_become_owner(whitelist_owner, SECURITY_NOFORCE_RLS, &as_owner);

	for (attempt = 0;; attempt++)
	{
		int			rc;
		bool		may_retry = false;
		ArrayType  *arr;
		Datum	   *elems;
		int			nelems;
		int			i;

		rc = SPI_execute_plan(target->update_plan, values, NULL, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "%s: UPDATE failed: %s", target->funcname, SPI_result_code_string(rc));
		if (SPI_processed > 0)
		{
			payidem_become_caller(&as_owner);
			SPI_finish();
			PG_RETURN_BOOL(true);
		}

		/* not moved: find out why, with a fresh snapshot */
		rc = SPI_execute_plan(target->select_plan, values, NULL, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "%s: SELECT failed: %s", target->funcname, SPI_result_code_string(rc));
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_PAYIDEM_NOT_FOUND),
					 errmsg("%s %s not found", target->entity,
							payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key))),
					 errdetail("payidem.%s has no row with that key.",
							   which == TRANSIT_ORDER ? "\"order\"" : target->entity)));
		current = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (strcmp(current, to_s) == 0)
		{
			payidem_become_caller(&as_owner);
			SPI_finish();
			PG_RETURN_BOOL(false);
		}

		/*
		 * A concurrent transaction may have moved the row between our UPDATE
		 * and this SELECT into a status from which the change is allowed.
		 */
		arr = DatumGetArrayTypeP(predecessors);
		deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &nelems);
		for (i = 0; i < nelems; i++)
		{
			char	   *p = TextDatumGetCString(elems[i]);

			if (strcmp(p, current) == 0)
				may_retry = true;
		}
		if (!may_retry || attempt >= TRANSIT_MAX_RETRIES)
			break;
	}
	payidem_become_caller(&as_owner);

	cache = whitelist_get();
	ent = find_entity_in(cache, target->entity);
	report_illegal_change(ent, target->entity,
						  payidem_quote_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key)),
						  current, to_s);
	PG_RETURN_NULL();			/* not reached */
}

/* payidem.transit_order(order_no text, to_status text) RETURNS boolean */
PG_FUNCTION_INFO_V1(payidem_transit_order);
Datum
payidem_transit_order(PG_FUNCTION_ARGS)
{
	return transit(fcinfo, TRANSIT_ORDER);
}

/* payidem.transit_payment(payment_no text, to_status text) RETURNS boolean */
PG_FUNCTION_INFO_V1(payidem_transit_payment);
Datum
payidem_transit_payment(PG_FUNCTION_ARGS)
{
	return transit(fcinfo, TRANSIT_PAYMENT);
}

/* payidem.transit_refund(refund_no text, to_status text) RETURNS boolean */
PG_FUNCTION_INFO_V1(payidem_transit_refund);
Datum
payidem_transit_refund(PG_FUNCTION_ARGS)
{
	return transit(fcinfo, TRANSIT_REFUND);
}

/*
 * payidem._transition_allowed(entity text, from_status text, to_status text)
 *     RETURNS boolean, STRICT
 *		Whether the whitelist status_guard enforces allows the move, read from
 *		the same cache: for a caller that chooses a status (apply_refund_result()
 *		keeps an order's status a DBA added after paid).
 */
PG_FUNCTION_INFO_V1(payidem_transition_allowed);
Datum
payidem_transition_allowed(PG_FUNCTION_ARGS)
{
	text	   *from = PG_GETARG_TEXT_PP(1);
	text	   *to = PG_GETARG_TEXT_PP(2);
	WhitelistEntity *ent = find_entity_in(whitelist_get(), text_to_cstring(PG_GETARG_TEXT_PP(0)));

	PG_RETURN_BOOL(ent != NULL &&
				   transition_allowed(ent, VARDATA_ANY(from), VARSIZE_ANY_EXHDR(from),
									  VARDATA_ANY(to), VARSIZE_ANY_EXHDR(to)));
}
