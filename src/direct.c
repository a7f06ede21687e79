/*-------------------------------------------------------------------------
 *
 * direct.c
 *		Every read and write of payidem's tables below SQL: a row fetched by
 *		key (with the hint of a version this transaction wrote), by index or
 *		by tid, a table scanned, a row inserted (the status_log row of
 *		state_machine.c, the notification event of notify.c, the payment
 *		keys' rows), inserted unless its key exists (idem.c), updated by tid
 *		(payment_result.c) or deleted by tid, and the CHECKs, defaults and domains those
 *		writes evaluate.
 *
 * An insert through SPI plans nothing per row but still builds and tears
 * down a whole executor (the plan's nodes, its result relation and indexes,
 * the coercions of its values) for one row.  Here, as the logical
 * replication apply worker does (ExecSimpleRelationInsert), the executor
 * gets only what one row needs, and the executor still does what an INSERT
 * does: NOT NULL and CHECK constraints, every index entry (unique ones
 * checked), stored generated columns, and the table's own triggers,
 * statement and row.  Rules and transition tables, which only an INSERT
 * statement has, are refused, as is a column of another type than the
 * value written (a DBA's ALTER TABLE): a clear error, never a wrong row.
 *
 * What it needs of the table is built once per backend (PayidemInsert):
 * which column gets which of the caller's values; the defaults of the
 * others, planned once, compiled at first use and evaluated per row; the
 * CHECK constraints and the partial indexes' predicates, likewise
 * (PayidemExprs, which the updates use too); and the domains of the
 * columns written, checked per row with their constraints kept up to date by
 * the type cache.  Left to the executor, every CHECK would be read back from
 * the catalog text and planned, and every predicate planned, for each row.
 * A change of the table (its relcache invalidation, or a full reset) or of
 * any function (which a default or CHECK may have inlined) makes it stale;
 * the old memory goes when the transaction ends, never while a row may be
 * being written with it further up the stack.
 *
 * payidem_update() is the UPDATE of one locked row by its ctid (the payment
 * result's two writes, payment_result.c), made the way the apply worker makes it
 * (ExecSimpleRelationUpdate): BEFORE and AFTER row triggers fire -- among
 * them the status_guard constraint trigger, which checks the status change
 * against the whitelist and logs it, and the foreign-key triggers -- NOT NULL
 * and CHECK constraints are checked, stored generated columns computed, every
 * index maintained (opened only when the update is not HOT), unique ones
 * checked, and the columns written that are domains checked against their
 * domain.  What it saves over a SQL UPDATE is the statement: no executor
 * start and stop, no index scan to find the row (its ctid is known and it is
 * locked), the CHECKs planned once per backend.  What a row-by-row update
 * cannot reproduce (statement triggers, transition tables, rules, row-level
 * security that applies, no UPDATE privilege) makes it do nothing and
 * return false: the caller then runs the UPDATE in SQL.
 *
 * payidem_insert_new() is INSERT ... ON CONFLICT DO NOTHING through the
 * executor's speculative insertion, with the CHECKs compiled once by the
 * caller (idem.c's new keys).
 *
 * payidem_delete_row() is the delete of a row found by TID that the payment
 * keys' trigger makes: with the result a DELETE statement gives,
 * 40001 for a row changed after a REPEATABLE READ snapshot.
 *
 * Trusted code writing on the tables' owner's behalf: no privilege is
 * checked, so application roles need no right on the table and cannot write
 * it themselves.  The caller holds nothing but the values.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "catalog.h"
#include "direct.h"
#include "inval.h"
#include "util.h"

/*
 * The expressions a direct write of one table evaluates -- its CHECKs, the
 * defaults of a direct insert and the predicates of its partial indexes --
 * planned once and compiled on first use, in the memory of the cache that
 * holds them.
 */
typedef struct PayidemExprs
{
	MemoryContext context;		/* the holder's; gone with its plans */
	int			ncheck;
	Expr	  **checks;			/* planned, in relcache order (NULL: not enforced) */
	bool	   *check_replan;	/* or raw, to plan at each use (not keepable) */
	int			ndefault;
	Expr	  **defaults;		/* per column, of the holder: planned here, or NULL */
	bool	   *default_replan;	/* or raw, as for the CHECKs */
	bool		keepable;		/* none to plan at each use */
	bool		casts_domain;	/* one casts to a domain: dropped when one may change */
	/* the compiled ones, in compiled (under context) */
	MemoryContext compiled;
	ExprState **check_states;
	ExprState **default_states;
	int			npred;
	Oid		   *pred_index;		/* the partial indexes, by OID */
	ExprState **pred_states;	/* and their predicates */
	bool		in_use;			/* by a write under way further up the stack */
} PayidemExprs;

/* what an update of a table may set, and what it keeps between calls */
struct PayidemUpdate
{
	PayidemRelation table;
	const char *keycol;			/* its key: checked against the caller's */
	const char *const *columns; /* the columns it may set */
	int			ncolumns;
	PayidemUpdate *next;		/* every one made, for the callbacks */

	/* built on first use, dropped by an invalidation of the relation */
	bool		valid;
	Oid			relid;
	MemoryContext context;
	int			natts;
	AttrNumber	keyattno;
	bool		keyint8;		/* the key is a bigint (else text) */
	AttrNumber	attnos[PAYIDEM_UPDATE_MAX_COLUMNS];
	bool		isdomain[PAYIDEM_UPDATE_MAX_COLUMNS];
	void	   *domain_extra[PAYIDEM_UPDATE_MAX_COLUMNS];	/* domain_check()'s cache */
	PayidemExprs exprs;			/* its CHECKs and index predicates */
	GeneratedColumnsCompat *generated;	/* for 15's extraUpdatedCols */
	bool		indexes_lazy;	/* indexes opened only if the update is not HOT */
	bool		own_bookkeeping;	/* payidem_update_define_own(): see there */
	TriggerDesc *trigdesc;		/* and then the triggers it fires */
};

static void exprs_plan(PayidemExprs *x, Relation rel, MemoryContext context, int ndefault,
					   Expr **defaults);
static ExprState **exprs_attach(PayidemExprs *x, ResultRelInfo *rri, EState *estate, bool *attached);
static void exprs_detach(PayidemExprs *x, bool attached);
static void remember_kept_domain(Oid typid);
static bool indexes_lazy_ok(Relation rel);
static void check_conflict_visible(Relation rel, ItemPointer tid, Snapshot snapshot);
static void update_index_entries(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate);

/* what one column of the table gets */
#define COL_NULL		(-1)	/* dropped, generated, or no default: NULL */
#define COL_DEFAULT		(-2)	/* its default */

struct PayidemInsert
{
	PayidemRelation table;
	const char *relname;		/* payidem.<relname> */
	int			ncols;
	const char *const *columns; /* the names the caller's values are for */
	const Oid  *types;			/* and the (base) type of each value */
	/* built on first use; relid InvalidOid when stale */
	Oid			relid;
	MemoryContext context;
	int			natts;
	int		   *source;			/* per column: an index into values[], or COL_* */
	Expr	  **defaults;		/* per column, for COL_DEFAULT (PayidemExprs plans them) */
	Oid		   *domain;			/* per value: its column's domain, or InvalidOid */
	void	  **domain_extra;	/* per value: domain_check()'s state */
	Oid		   *null_domain;	/* per column left NULL: its domain, or InvalidOid */
	void	  **null_domain_extra;	/* and domain_check()'s state */
	PayidemExprs exprs;			/* its CHECKs, defaults and index predicates */
	PayidemInsert *next;
};

static PayidemInsert *inserts = NULL;	/* every one made, for the callbacks */
static PayidemUpdate *updates = NULL;	/* every one used */
static uint64 update_inval_count = 0;	/* bumped by every invalidation of one */
static bool callbacks_registered = false;

/*
 * Bumped by every invalidation a domain's rules may depend on -- of a type,
 * a constraint or a function -- once the callbacks are registered: what a
 * caller that checked a value against a domain itself compares before the
 * insert leaves that check out (payidem_insert_row_refs())
 */
static uint64 domain_generation = 0;

static void
direct_relcache_callback(Datum arg, Oid relid)
{
	PayidemInsert *ins;
	PayidemUpdate *t;

	for (ins = inserts; ins != NULL; ins = ins->next)
		if (relid == InvalidOid || relid == ins->relid)
			ins->relid = InvalidOid;
	for (t = updates; t != NULL; t = t->next)
		if (relid == InvalidOid || relid == t->relid)
		{
			t->valid = false;
			update_inval_count++;
		}
}

/*
 * The call information of the trigger functions the direct writes fire,
 * kept per function for the session (fill_trigger_functions())
 */
#define TRIGGER_FUNCTIONS_KEPT 32
typedef struct TriggerFunction
{
	Oid			fn;
	FmgrInfo	info;
} TriggerFunction;
static TriggerFunction trigger_functions[TRIGGER_FUNCTIONS_KEPT];
static int	n_trigger_functions = 0;

/*
 * a changed function: a default or CHECK may have inlined or folded it, a
 * trigger may call another
 */
static void
direct_proc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	PayidemInsert *ins;
	PayidemUpdate *t;

	n_trigger_functions = 0;
	domain_generation++;
	for (ins = inserts; ins != NULL; ins = ins->next)
		ins->relid = InvalidOid;
	for (t = updates; t != NULL; t = t->next)
		t->valid = false;
	update_inval_count++;
}

/*
 * a domain that may have changed (a constraint's change, or its type's:
 * direct_type_callback()): what casts to a domain is dropped
 */
static void
direct_domain_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	PayidemInsert *ins;
	PayidemUpdate *t;

	domain_generation++;
	for (ins = inserts; ins != NULL; ins = ins->next)
		if (ins->exprs.casts_domain)
			ins->relid = InvalidOid;
	for (t = updates; t != NULL; t = t->next)
		if (t->exprs.casts_domain)
		{
			t->valid = false;
			update_inval_count++;
		}
}

/*
 * a changed type: if it is a domain a kept compiled cast took in the
 * constraints of (remember_kept_domain()), what casts to a domain is dropped
 */
static void direct_type_callback(Datum arg, int cacheid, uint32 hashvalue);

static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	payidem_register_relcache_callback(direct_relcache_callback, (Datum) 0);
	payidem_register_syscache_callback(PROCOID, direct_proc_callback, (Datum) 0);
	payidem_register_syscache_callback(TYPEOID, direct_type_callback, (Datum) 0);
	/* (a domain's constraint dropped changes no pg_type row: any constraint's change) */
	payidem_register_syscache_callback(CONSTROID, direct_domain_callback, (Datum) 0);
	callbacks_registered = true;
}

/* where the domains stand (domain_generation), the callbacks that move it registered */
uint64
payidem_domain_generation(void)
{
	register_callbacks();
	return domain_generation;
}

/*
 * The cache of an insert into table of values for columns[]
 * (ncols of them), each of types[] (the column's type, or the base type of
 * its domain).  Made once, at the call site's first use, and kept for the
 * backend.
 */
PayidemInsert *
payidem_insert_define(PayidemRelation table, int ncols, const char *const *columns, const Oid *types)
{
	PayidemInsert *ins = MemoryContextAllocZero(TopMemoryContext, sizeof(PayidemInsert));

	register_callbacks();
	ins->table = table;
	ins->relname = payidem_relation_name(table);
	ins->ncols = ncols;
	ins->columns = columns;
	ins->types = types;
	ins->relid = InvalidOid;
	ins->next = inserts;
	inserts = ins;
	return ins;
}

/*
 * The cache of an update of table's row with key column keycol, which may
 * set columns[] (ncolumns of them, constants).  Made once, at the call site's
 * first use, and kept for the backend.
 */
PayidemUpdate *
payidem_update_define(PayidemRelation table, const char *keycol, int ncolumns, const char *const *columns)
{
	PayidemUpdate *t = MemoryContextAllocZero(TopMemoryContext, sizeof(PayidemUpdate));

	Assert(ncolumns <= PAYIDEM_UPDATE_MAX_COLUMNS);
	register_callbacks();
	t->table = table;
	t->keycol = keycol;
	t->columns = columns;
	t->ncolumns = ncolumns;
	t->next = updates;
	updates = t;
	return t;
}

/*
 * An update of payidem's own flow, whose bookkeeping the caller wrote
 * together with the status (the first success of apply_payment_result():
 * the payment succeeded with its transaction id, paid_at and fees, and its
 * own order paid by it, both under lock, in one call).  It fires every
 * trigger of the table but the bookkeeping check at commit
 * (status_ledger_at_commit: payidem.ledger_at_commit()), which would only
 * find again what the caller just wrote: the order names the payment the
 * caller made succeeded, of that order, and status_ledger (which stays:
 * what the row says about itself, no query) refuses an order paid with
 * refunds or a payment with some.  Not while the table has a BEFORE UPDATE
 * row trigger, which may write something else than the caller did: then
 * every trigger fires.  Every other writer of the table, and any later
 * change of these rows, is checked as always.
 */
PayidemUpdate *
payidem_update_define_own(PayidemRelation table, const char *keycol, int ncolumns, const char *const *columns)
{
	PayidemUpdate *t = payidem_update_define(table, keycol, ncolumns, columns);

	t->own_bookkeeping = true;
	return t;
}

/* is trigger tg of rel payidem's bookkeeping check at commit (in rel's schema)? */
static bool
bookkeeping_at_commit(Relation rel, const Trigger *tg)
{
	char	   *name;
	bool		result;

	if (get_func_namespace(tg->tgfoid) != RelationGetNamespace(rel))
		return false;
	name = get_func_name(tg->tgfoid);
	result = name != NULL && strcmp(name, "ledger_at_commit") == 0;
	if (name)
		pfree(name);
	return result;
}

/*
 * The table's triggers without the bookkeeping check at commit, in the
 * current context; NULL for all of them (the table has no trigger, or one
 * BEFORE UPDATE of a row).
 */
static TriggerDesc *
own_bookkeeping_triggers(Relation rel)
{
	TriggerDesc *td;
	int			i;
	int			n = 0;

	if (rel->trigdesc == NULL || rel->trigdesc->trig_update_before_row)
		return NULL;
	/*
	 * A copy, less that trigger; the flags stay those of the whole set (a
	 * flag says a kind of trigger may be there: each trigger's own type is
	 * what the executor goes by).
	 */
	td = CopyTriggerDesc(rel->trigdesc);
	for (i = 0; i < td->numtriggers; i++)
		if (!bookkeeping_at_commit(rel, &td->triggers[i]))
			td->triggers[n++] = td->triggers[i];
	td->numtriggers = n;
	return td;
}

/*
 * (Re)build what ins keeps from rel.  The columns must be there, of the
 * types the caller writes; else an error, or with soft (a table others may
 * change: the caller runs its INSERT statement instead) false, and nothing
 * kept.
 */
static bool
insert_prepare(PayidemInsert *ins, Relation rel, bool soft)
{
	TupleDesc	desc = RelationGetDescr(rel);
	MemoryContext oldcxt;
	int			i;
	int			v;

	if (ins->context != NULL)
		MemoryContextSetParent(ins->context, TopTransactionContext);
	ins->context = AllocSetContextCreate(CacheMemoryContext, "payidem direct insert",
										 ALLOCSET_SMALL_SIZES);
	ins->relid = InvalidOid;

	oldcxt = MemoryContextSwitchTo(ins->context);
	ins->natts = desc->natts;
	ins->source = palloc(sizeof(int) * desc->natts);
	ins->defaults = palloc0(sizeof(Expr *) * desc->natts);
	ins->domain = palloc0(sizeof(Oid) * ins->ncols);
	ins->domain_extra = palloc0(sizeof(void *) * ins->ncols);
	ins->null_domain = palloc0(sizeof(Oid) * desc->natts);
	ins->null_domain_extra = palloc0(sizeof(void *) * desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		ins->source[i] = COL_DEFAULT;
		if (att->attisdropped || att->attgenerated)
		{
			ins->source[i] = COL_NULL;	/* generated: computed by the executor */
			continue;
		}
		for (v = 0; v < ins->ncols; v++)
			if (strcmp(NameStr(att->attname), ins->columns[v]) == 0)
			{
				ins->source[i] = v;
				if (get_typtype(att->atttypid) == TYPTYPE_DOMAIN)
					ins->domain[v] = att->atttypid;
				break;
			}
		if (ins->source[i] == COL_DEFAULT)
		{
			Node	   *def = build_column_default(rel, i + 1);

			if (def != NULL)
				ins->defaults[i] = (Expr *) def;	/* planned by exprs_plan */
			else
			{
				/* an INSERT checks the NULL it puts there against the domain too */
				ins->source[i] = COL_NULL;
				if (get_typtype(att->atttypid) == TYPTYPE_DOMAIN)
					ins->null_domain[i] = att->atttypid;
			}
		}
	}
	/*
	 * The values are put in the row as they are: a column altered to
	 * another type (or given a length), dropped or renamed is refused here,
	 * as are what a direct insert cannot do as an INSERT does (rules,
	 * transition tables).
	 */
	for (v = 0; v < ins->ncols; v++)
	{
		for (i = 0; i < desc->natts; i++)
			if (ins->source[i] == v)
				break;
		if (soft && (i == desc->natts || getBaseType(TupleDescAttr(desc, i)->atttypid) != ins->types[v] ||
					 TupleDescAttr(desc, i)->atttypmod != -1))
		{
			MemoryContextSwitchTo(oldcxt);
			return false;
		}
		if (i == desc->natts)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("column \"%s\" of relation payidem.%s does not exist", ins->columns[v], ins->relname),
					 errhint("payidem writes this table itself; its columns are part of the extension.")));
		if (getBaseType(TupleDescAttr(desc, i)->atttypid) != ins->types[v] ||
			TupleDescAttr(desc, i)->atttypmod != -1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("column \"%s\" of relation payidem.%s is not of the type payidem writes",
							ins->columns[v], ins->relname),
					 errdetail("It is %s; payidem writes %s.",
							   format_type_with_typemod(TupleDescAttr(desc, i)->atttypid,
														TupleDescAttr(desc, i)->atttypmod),
							   format_type_be(ins->types[v])),
					 errhint("payidem writes this table itself; its columns are part of the extension.")));
	}
	if (rel->rd_rules != NULL ||
		(rel->trigdesc != NULL && (rel->trigdesc->trig_insert_new_table)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("payidem.%s cannot have rules or triggers with transition tables", ins->relname),
				 errdetail("payidem appends its rows one at a time, without an INSERT statement."),
				 errhint("Use a FOR EACH ROW trigger without a REFERENCING clause.")));
	MemoryContextSwitchTo(oldcxt);
	exprs_plan(&ins->exprs, rel, ins->context, desc->natts, ins->defaults);
	/*
	 * a column of a domain left NULL: NULL because the domain has no default
	 * now, which an ALTER DOMAIN ... SET DEFAULT changes (its pg_type row)
	 */
	for (i = 0; i < desc->natts; i++)
		if (OidIsValid(ins->null_domain[i]))
		{
			remember_kept_domain(ins->null_domain[i]);
			ins->exprs.casts_domain = true;
		}
	ins->relid = RelationGetRelid(rel);
	return true;
}

/*
 * The expressions of a direct write (PayidemExprs, direct.h).  Left to the
 * executor, a write that builds its ResultRelInfo per row would read every
 * CHECK back from the catalog and plan it, and plan and compile each partial
 * index's predicate, for every row.  Here the CHECKs (and the defaults the
 * caller gives) are planned when the holder's cache is built
 * (exprs_plan, in context, the holder's memory, freed with it), and
 * they and the predicates are compiled at their first use and kept: an
 * ExprState built without a parent keeps nothing of the query that
 * evaluates it (its results go in that query's expression context).
 *
 * What planning and compiling decide is kept only where it holds for every
 * later write, whoever writes, until the table, a function or a domain it
 * casts to changes (not_keepable): a CHECK or default that calls a function
 * other than a built-in one PUBLIC may run (itself or in the checks of a
 * domain it casts to) is planned and compiled at every use, as an INSERT
 * does per statement, and so are all of its table's.  A compilation is
 * made in the writing query's memory and kept only once complete, so one
 * that fails leaves nothing behind.  One write uses them at a time: a write
 * further down the stack while one is under way (a trigger or a function in
 * a CHECK writing the same table) compiles its own.
 */

/*
 * A function any role may run and whose call hides nothing of the catalog
 * that can change without touching the table: a built-in one that PUBLIC
 * may execute.  A change of its rights changes its pg_proc row, which drops
 * the holder's cache (its function callback).
 */
static bool
func_not_keepable(Oid funcid, void *context)
{
	HeapTuple	tp;
	Datum		acl_datum;
	bool		isnull;
	bool		public_may = false;

	if (funcid >= FirstNormalObjectId)
		return true;
	tp = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (!HeapTupleIsValid(tp))
		return true;
	acl_datum = SysCacheGetAttr(PROCOID, tp, Anum_pg_proc_proacl, &isnull);
	if (isnull)
		public_may = true;		/* the default of a function: PUBLIC may run it */
	else
	{
		Acl		   *acl = DatumGetAclP(acl_datum);
		AclItem    *items = ACL_DAT(acl);
		int			i;

		for (i = 0; i < ACL_NUM(acl); i++)
			if (items[i].ai_grantee == ACL_ID_PUBLIC && (ACLITEM_GET_PRIVS(items[i]) & ACL_EXECUTE))
				public_may = true;
	}
	ReleaseSysCache(tp);
	return !public_may;
}

static bool not_keepable(Node *node, void *context);

/*
 * The domains whose casts compiled expressions kept (their pg_type rows'
 * hash values, and those of the domains they are made from): a change of
 * one's pg_type row (ALTER DOMAIN ... NOT NULL, ADD CONSTRAINT) drops what
 * was kept; past the array's size, any type's change does.  A constraint
 * added, dropped or validated changes a pg_constraint row: any such change
 * drops it too.  Only what casts to a domain is dropped
 * (direct_domain_callback()): the other writes keep theirs.
 */
#define KEPT_DOMAINS 16
static uint32 kept_domain_hashes[KEPT_DOMAINS];
static int	n_kept_domains = 0;
static bool kept_domains_overflow = false;

static void
direct_type_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	int			i;

	domain_generation++;
	if (hashvalue == 0 || kept_domains_overflow)
	{
		direct_domain_callback(arg, cacheid, hashvalue);
		return;
	}
	for (i = 0; i < n_kept_domains; i++)
		if (kept_domain_hashes[i] == hashvalue)
		{
			direct_domain_callback(arg, cacheid, hashvalue);
			return;
		}
}

static void
remember_kept_domain(Oid typid)
{
	while (OidIsValid(typid) && get_typtype(typid) == TYPTYPE_DOMAIN)
	{
		uint32		hash = GetSysCacheHashValue1(TYPEOID, ObjectIdGetDatum(typid));
		int			i;

		for (i = 0; i < n_kept_domains; i++)
			if (kept_domain_hashes[i] == hash)
				break;
		if (i == n_kept_domains)
		{
			if (n_kept_domains < KEPT_DOMAINS)
				kept_domain_hashes[n_kept_domains++] = hash;
			else
				kept_domains_overflow = true;
		}
		{
			HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));

			typid = InvalidOid;
			if (HeapTupleIsValid(tup))
			{
				typid = ((Form_pg_type) GETSTRUCT(tup))->typbasetype;	/* the domain it is made from */
				ReleaseSysCache(tup);
			}
		}
	}
}

/*
 * Whether a cast to domain typid compiles in a check that cannot be kept:
 * one of the domain's CHECK constraints (as the type cache has them now)
 * calls a function other than a built-in one PUBLIC may run.
 */
static bool
domain_not_keepable(Oid typid)
{
	MemoryContext tmp = AllocSetContextCreate(CurrentMemoryContext, "payidem domain walk",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext oldcxt = MemoryContextSwitchTo(tmp);
	DomainConstraintRef ref;
	ListCell   *lc;
	bool		result = false;

	InitDomainConstraintRef(typid, &ref, tmp, false);
	foreach(lc, ref.constraints)
	{
		DomainConstraintState *con = (DomainConstraintState *) lfirst(lc);

		if (con->check_expr != NULL && not_keepable((Node *) con->check_expr, NULL))
			result = true;
	}
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(tmp);	/* (which lets the type cache's constraints go) */
	if (!result)
		remember_kept_domain(typid);
	return result;
}

/*
 * May node, compiled once, be kept for every later write, whoever writes?
 * Not if it calls a function other than a built-in one PUBLIC may run:
 * compiling checks the EXECUTE right for the current role, planning inlines
 * a SQL function (and folds an immutable call) with only the planning role's
 * right checked, and an inlined body may hide anything.  A cast to a domain
 * is kept if the domain's checks could be (domain_not_keepable()): compiling
 * takes in the constraints the domain has then, and an ALTER DOMAIN (a
 * change of a type or a constraint) drops what was kept (the callbacks).
 */
static bool
not_keepable(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, CoerceToDomain) && domain_not_keepable(((CoerceToDomain *) node)->resulttype))
		return true;
	if (check_functions_in_node(node, func_not_keepable, context))
		return true;
	return expression_tree_walker(node, not_keepable, context);
}

/* Does node cast to a domain (before planning, which may drop the cast)? */
static bool
has_domain_cast(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, CoerceToDomain))
		return true;
	return expression_tree_walker(node, has_domain_cast, context);
}

/*
 * expr planned, unless it cannot be kept (not_keepable, before or after
 * planning): then as it is (raw), to be planned at each use, as an INSERT
 * plans it per statement.
 */
static Expr *
plan_if_keepable(Expr *expr, bool *replan)
{
	Expr	   *plan;

	*replan = not_keepable((Node *) expr, NULL);
	if (*replan)
		return expr;
	plan = expression_planner(expr);
	*replan = not_keepable((Node *) plan, NULL);
	return *replan ? expr : plan;
}

/* x's expression e (of replan[]) ready to compile, in the current memory */
static Expr *
planned(Expr *e, bool replan)
{
	return replan ? expression_planner((Expr *) copyObject(e)) : e;
}

static void
exprs_plan(PayidemExprs *x, Relation rel, MemoryContext context, int ndefault, Expr **defaults)
{
	TupleDesc	desc = RelationGetDescr(rel);
	MemoryContext oldcxt = MemoryContextSwitchTo(context);
	int			i;

	memset(x, 0, sizeof(PayidemExprs));
	x->context = context;
	x->keepable = true;
	if (desc->constr && desc->constr->num_check > 0)
	{
		ConstrCheck *check = desc->constr->check;

		x->ncheck = desc->constr->num_check;
		x->checks = palloc(sizeof(Expr *) * x->ncheck);
		x->check_replan = palloc0(sizeof(bool) * x->ncheck);
		for (i = 0; i < x->ncheck; i++)
		{
			Expr	   *raw = ConstrCheckIsEnforced(&check[i]) ?
				(Expr *) CheckConstraintExprCompat(rel, &check[i]) : NULL;

			if (raw != NULL && has_domain_cast((Node *) raw, NULL))
				x->casts_domain = true;
			x->checks[i] = raw != NULL ? plan_if_keepable(raw, &x->check_replan[i]) : NULL;
		}
	}
	x->ndefault = ndefault;
	x->defaults = defaults;
	x->default_replan = palloc0(sizeof(bool) * Max(ndefault, 1));
	for (i = 0; i < ndefault; i++)
		if (defaults[i] != NULL)
		{
			if (has_domain_cast((Node *) defaults[i], NULL))
				x->casts_domain = true;
			defaults[i] = plan_if_keepable(defaults[i], &x->default_replan[i]);
		}
	for (i = 0; i < x->ncheck; i++)
		if (x->check_replan[i])
			x->keepable = false;
	for (i = 0; i < ndefault; i++)
		if (x->default_replan[i])
			x->keepable = false;
	MemoryContextSwitchTo(oldcxt);
}

/* Are the compiled predicates those of rri's partial indexes? */
static bool
exprs_cover_indexes(PayidemExprs *x, ResultRelInfo *rri)
{
	int			i;
	int			p;
	int			npartial = 0;

	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		Oid			index = RelationGetRelid(rri->ri_IndexRelationDescs[i]);

		if (rri->ri_IndexRelationInfo[i]->ii_Predicate == NIL)
			continue;
		npartial++;
		for (p = 0; p < x->npred; p++)
			if (x->pred_index[p] == index)
				break;
		if (p == x->npred)
			return false;
	}
	return npartial == x->npred;
}

/*
 * Give rri, whose indexes are open, the compiled CHECKs and predicates, and
 * return the compiled defaults (one per column, NULL where none).  *attached
 * is true if they are x's own, to be given back with exprs_detach
 * once the write is done (also when it fails: the caller's PG_FINALLY).
 */
static ExprState **
exprs_attach(PayidemExprs *x, ResultRelInfo *rri, EState *estate, bool *attached)
{
	bool		own = x->keepable && !x->in_use;
	ExprState **check_states;
	ExprState **default_states;
	Oid		   *pred_index;
	ExprState **pred_states;
	int			npred = 0;
	int			i;
	int			p;

	if (own && x->compiled != NULL && !exprs_cover_indexes(x, rri))
	{
		/* no write uses them (own), and they are stale */
		MemoryContextDelete(x->compiled);
		x->compiled = NULL;
	}
	if (own && x->compiled != NULL)
	{
		check_states = x->check_states;
		default_states = x->default_states;
		npred = x->npred;
		pred_index = x->pred_index;
		pred_states = x->pred_states;
	}
	else
	{
		MemoryContext cxt = AllocSetContextCreate(estate->es_query_cxt, "payidem compiled expressions",
												  ALLOCSET_SMALL_SIZES);
		MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
		bool		keep = own;

		check_states = palloc0(sizeof(ExprState *) * Max(x->ncheck, 1));
		for (i = 0; i < x->ncheck; i++)
			check_states[i] = ExecInitExpr(planned(x->checks[i], x->check_replan[i]), NULL);
		default_states = palloc0(sizeof(ExprState *) * Max(x->ndefault, 1));
		for (i = 0; i < x->ndefault; i++)
			if (x->defaults[i] != NULL)
				default_states[i] = ExecInitExpr(planned(x->defaults[i], x->default_replan[i]), NULL);
		pred_index = palloc(sizeof(Oid) * Max(rri->ri_NumIndices, 1));
		pred_states = palloc(sizeof(ExprState *) * Max(rri->ri_NumIndices, 1));
		for (i = 0; i < rri->ri_NumIndices; i++)
		{
			IndexInfo  *ii = rri->ri_IndexRelationInfo[i];
			Expr	   *pred;

			if (ii->ii_Predicate == NIL)
				continue;
			/*
			 * as ExecInsertIndexTuples() would, per row, with
			 * ExecPrepareQual(); from a copy, as the planner's copy of a
			 * constant points into the original, the executor's memory
			 */
			if (has_domain_cast((Node *) ii->ii_Predicate, NULL))
				x->casts_domain = true;
			pred = expression_planner((Expr *) copyObject(ii->ii_Predicate));
			if (not_keepable((Node *) pred, NULL))
				keep = false;
			pred_index[npred] = RelationGetRelid(rri->ri_IndexRelationDescs[i]);
			pred_states[npred] = ExecInitQual((List *) pred, NULL);
			npred++;
		}
		MemoryContextSwitchTo(oldcxt);
		if (keep)
		{
			MemoryContextSetParent(cxt, x->context);
			x->compiled = cxt;
			x->check_states = check_states;
			x->default_states = default_states;
			x->npred = npred;
			x->pred_index = pred_index;
			x->pred_states = pred_states;
		}
		own = keep;
	}

	/* ExecConstraints() reads and plans the CHECKs only when this is NULL */
	if (x->ncheck > 0)
		ResultRelInfoCheckExprs(rri) = check_states;
	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[i];
		Oid			index = RelationGetRelid(rri->ri_IndexRelationDescs[i]);

		if (ii->ii_Predicate == NIL)
			continue;
		for (p = 0; p < npred; p++)
			if (pred_index[p] == index)
				ii->ii_PredicateState = pred_states[p];
	}
	if (own)
		x->in_use = true;
	*attached = own;
	return default_states;
}

static void
exprs_detach(PayidemExprs *x, bool attached)
{
	if (attached)
		x->in_use = false;
}

/*
 * Whether a row of rel can be written by payidem_insert_row() as a one-row
 * INSERT statement would (with an arbiter: INSERT ... ON CONFLICT DO
 * NOTHING): a plain table without rules, triggers with transition tables,
 * stored generated columns or row-level security that applies, into which
 * the current user may insert; with an arbiter, also no BEFORE INSERT row
 * trigger (which the statement fires before its conflict check).
 */
static bool
insert_plain(Relation rel, bool speculative)
{
	TupleDesc	desc = RelationGetDescr(rel);

	return rel->rd_rel->relkind == RELKIND_RELATION && !rel->rd_rel->relispartition &&
		rel->rd_rules == NULL &&
		!(rel->trigdesc != NULL &&
		  (rel->trigdesc->trig_insert_new_table ||
		   (speculative && rel->trigdesc->trig_insert_before_row))) &&
		!(desc->constr != NULL && desc->constr->has_generated_stored) &&
		check_enable_rls(RelationGetRelid(rel), InvalidOid, false) != RLS_ENABLED &&
		pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_INSERT) == ACLCHECK_OK;
}

/*
 * The row in slot inserted as INSERT ... ON CONFLICT (the key of unique
 * index payidem.<arbiter>) DO NOTHING inserts it, through the executor's steps: the
 * row's constraints; the pre-check of the arbiter (waiting for a concurrent
 * inserter of the key); the heap tuple inserted speculatively, its index
 * entries, the tuple confirmed -- or, if another inserter of the key got in
 * between, killed and the pre-check made again; then the AFTER row
 * triggers.  1 if inserted, 0 if a row holds the key.
 */
static int
insert_speculative(ResultRelInfo *rri, EState *estate, TupleTableSlot *slot, PayidemRelation arbiter)
{
	Relation	rel = rri->ri_RelationDesc;
	List	   *arbiters = list_make1_oid(payidem_relation(arbiter));

	if (rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);
	for (;;)
	{
		ItemPointerData conflict_tid;
		TransactionId xid;
		uint32		spec_token;
		bool		spec_conflict = false;
		List	   *recheck;

		CHECK_FOR_INTERRUPTS();
		if (!ExecCheckIndexConstraintsCompat(rri, slot, estate, &conflict_tid, arbiters))
		{
			check_conflict_visible(rel, &conflict_tid, estate->es_snapshot);
			return 0;
		}
		xid = GetCurrentTransactionId();
		spec_token = SpeculativeInsertionLockAcquire(xid);
		table_tuple_insert_speculative(rel, slot, estate->es_output_cid, 0, NULL, spec_token);
		recheck = ExecInsertIndexTuplesNoDupErrCompat(rri, slot, estate, &spec_conflict, arbiters);
		table_tuple_complete_speculative(rel, slot, spec_token, !spec_conflict);
		SpeculativeInsertionLockRelease(xid);
		if (!spec_conflict)
		{
			ExecARInsertTriggers(estate, rri, slot, recheck, NULL);
			list_free(recheck);
			return 1;
		}
		/* killed: the other inserter decides, at the next pre-check */
		list_free(recheck);
	}
}

/*
 * Which of refs foreign key conoid of rel (its check of an inserted row)
 * goes from exactly the columns of, to exactly that ref's columns of its
 * table, pairwise: its index, or -1.
 */
static int
fkey_locked(Relation rel, Oid conoid, const PayidemLockedRef *refs, int nrefs)
{
	ListCell   *lc;

	foreach(lc, RelationGetFKeyList(rel))
	{
		ForeignKeyCacheInfo *fk = lfirst_node(ForeignKeyCacheInfo, lc);
		int			r;

		if (fk->conoid != conoid)
			continue;
		for (r = 0; r < nrefs; r++)
		{
			const PayidemLockedRef *ref = &refs[r];
			int			k;
			int			matched = 0;

			if (fk->confrelid != payidem_relation(ref->table) || fk->nkeys != ref->ncolumns)
				continue;
			for (k = 0; k < fk->nkeys; k++)
			{
				const char *col = NameStr(TupleDescAttr(RelationGetDescr(rel), fk->conkey[k] - 1)->attname);
				char	   *refcol = get_attname(fk->confrelid, fk->confkey[k], true);
				int			j;

				for (j = 0; j < ref->ncolumns; j++)
					if (strcmp(ref->columns[j], col) == 0)
						break;
				if (j < ref->ncolumns && refcol != NULL && strcmp(ref->ref_columns[j], refcol) == 0)
					matched++;
			}
			if (matched == fk->nkeys)
				return r;
		}
		return -1;
	}
	return -1;
}

/* whether trigger tg fires in this session (session_replication_role), as the trigger manager decides */
static bool
trigger_fires(const Trigger *tg)
{
	if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA)
		return tg->tgenabled == TRIGGER_FIRES_ON_REPLICA || tg->tgenabled == TRIGGER_FIRES_ALWAYS;
	return tg->tgenabled == TRIGGER_FIRES_ON_ORIGIN || tg->tgenabled == TRIGGER_FIRES_ALWAYS;
}

/*
 * rri's triggers (InitResultRelInfo()'s copy) without the checks of the
 * foreign keys to the rows refs name (PayidemLockedRef), for the row in slot:
 * the check would lock that row FOR KEY SHARE, which this transaction holds
 * it in already, or (a ref's lock_after) will right after writing the row.
 * A ref to lock after is taken only where its check fires in this session
 * and the row's key has no NULL (which the check would not look up).  Every
 * other trigger stays, the flags too (each trigger's own type is what the
 * executor goes by).  dropped[r]: the constraint whose check was left out
 * for refs[r], or InvalidOid.
 */
static void
drop_locked_fkey_checks(ResultRelInfo *rri, TupleTableSlot *slot, const PayidemLockedRef *refs, int nrefs,
						Oid *dropped)
{
	TriggerDesc *td = rri->ri_TrigDesc;
	int			i;
	int			n = 0;

	for (i = 0; i < nrefs; i++)
		dropped[i] = InvalidOid;
	/*
	 * (not with a BEFORE INSERT row trigger: it may write other keys than
	 * the caller locked, which only the checks themselves would see)
	 */
	if (td == NULL || nrefs == 0 || td->trig_insert_before_row)
		return;
	for (i = 0; i < td->numtriggers; i++)
	{
		Trigger    *tg = &td->triggers[i];

		/* (a deferrable check stays: it may be meant to run at commit) */
		if (tg->tgfoid == F_RI_FKEY_CHECK_INS && OidIsValid(tg->tgconstraint) && !tg->tgdeferrable)
		{
			int			r = fkey_locked(rri->ri_RelationDesc, tg->tgconstraint, refs, nrefs);
			bool		drop = r >= 0;

			if (drop && refs[r].lock_after != NULL)
			{
				int			k;

				drop = trigger_fires(tg);
				for (k = 0; drop && k < refs[r].ncolumns; k++)
					drop = !slot_attisnull(slot, payidem_attnum(RelationGetDescr(rri->ri_RelationDesc), refs[r].columns[k]));
			}
			if (drop)
			{
				/* (a refusal names the first such key, as the checks' order would) */
				if (!OidIsValid(dropped[r]))
					dropped[r] = tg->tgconstraint;
				continue;
			}
		}
		if (n != i)
			td->triggers[n] = *tg;
		n++;
	}
	td->numtriggers = n;
}

/*
 * The look-up of a referenced key a foreign key's check makes (SELECT 1 FROM
 * ONLY <table> x WHERE <key> = $n ... FOR KEY SHARE OF x), its plan saved
 * for each statement (a few: one per foreign key locked after a write).
 */
#define REF_QUERIES 4
static struct
{
	char	   *sql;
	SPIPlanPtr	plan;
}			ref_queries[REF_QUERIES];

static SPIPlanPtr
ref_query(Relation refrel, const PayidemLockedRef *ref, const Oid *types)
{
	StringInfoData sql;
	SPIPlanPtr	plan;
	int			i;
	int			k;

	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT 1 FROM ONLY %s x WHERE ",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(refrel)),
												RelationGetRelationName(refrel)));
	for (k = 0; k < ref->ncolumns; k++)
		appendStringInfo(&sql, "%s%s OPERATOR(pg_catalog.=) $%d", k > 0 ? " AND " : "",
						 quote_identifier(ref->ref_columns[k]), k + 1);
	appendStringInfoString(&sql, " FOR KEY SHARE OF x");
	for (i = 0; i < REF_QUERIES && ref_queries[i].sql != NULL; i++)
		if (strcmp(ref_queries[i].sql, sql.data) == 0)
			return ref_queries[i].plan;
	plan = SPI_prepare(sql.data, ref->ncolumns, (Oid *) types);
	if (plan == NULL)
		elog(ERROR, "payidem: the look-up of a referenced key could not be prepared: %s",
			 SPI_result_code_string(SPI_result));
	if (i == REF_QUERIES)
		return plan;			/* (not kept: SPI_finish frees it) */
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "payidem: SPI_keepplan failed");
	ref_queries[i].sql = MemoryContextStrdup(TopMemoryContext, sql.data);
	ref_queries[i].plan = plan;
	return plan;
}

/*
 * The referenced row of ref (its lock_after) locked FOR KEY SHARE for the
 * row just written into rel (slot), in place of foreign key conoid's check,
 * which would run now: with the snapshot the check's look-up would take
 * now (this transaction's own changes in it), the row locked at its latest
 * version under READ COMMITTED; held with the key the row writes, that is
 * all the check would do.  Otherwise (the row gone, its key changed, or
 * changed by this transaction since the caller read it) the check's own
 * look-up decides, with that snapshot: another row may hold the key; none
 * does, and the row is refused as the check refuses it (23503, its message;
 * under REPEATABLE READ a row changed since the snapshot is the look-up's
 * 40001).
 */
static void
lock_ref_after(Relation rel, TupleTableSlot *slot, const PayidemLockedRef *ref, Oid conoid)
{
	Relation	refrel = table_open(payidem_relation(ref->table), RowShareLock);
	TupleTableSlot *rslot = table_slot_create(refrel, NULL);
	Datum		values[INDEX_MAX_KEYS];
	Oid			types[INDEX_MAX_KEYS];
	bool		held = false;
	int			k;
	Snapshot	check_snapshot;
	ItemPointerData tid = *ref->lock_after;
	TM_FailureData tmfd;

	Assert(ref->ncolumns <= INDEX_MAX_KEYS);
	for (k = 0; k < ref->ncolumns; k++)
	{
		AttrNumber	att = payidem_attnum(RelationGetDescr(rel), ref->columns[k]);
		bool		isnull;

		values[k] = slot_getattr(slot, att, &isnull);
		types[k] = getBaseType(TupleDescAttr(RelationGetDescr(rel), att - 1)->atttypid);
		if (types[k] != TEXTOID)
			elog(ERROR, "payidem: a foreign key locked after the insert must be of text columns");
	}
	/* (as the look-up's SPI statement would take it: after a command counter increment) */
	CommandCounterIncrement();
	check_snapshot = RegisterSnapshot(IsolationUsesXactSnapshot() ? GetTransactionSnapshot()
									  : GetLatestSnapshot());
	check_snapshot->curcid = GetCurrentCommandId(false);
	if (table_tuple_lock(refrel, &tid, check_snapshot, rslot, GetCurrentCommandId(true), LockTupleKeyShare,
						 LockWaitBlock, TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS |
						 (IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION),
						 &tmfd) == TM_Ok)
	{
		bool		should_free;
		HeapTuple	locked = ExecFetchSlotHeapTuple(rslot, false, &should_free);

		held = true;
		for (k = 0; held && k < ref->ncolumns; k++)
		{
			bool		isnull;
			Datum		d = payidem_getattr(refrel, locked, ref->ref_columns[k], &isnull);

			held = !isnull && payidem_text_equal(d, values[k]);
		}
		if (should_free)
			heap_freetuple(locked);
	}
	ExecDropSingleTupleTableSlot(rslot);
	if (!held)
	{
		uint64		found;

		Oid			save_user;
		int			save_sec;

		/*
		 * (as the check runs it: as the referenced table's owner, whom no
		 * forced row-level security filters)
		 */
		GetUserIdAndSecContext(&save_user, &save_sec);
		SetUserIdAndSecContext(refrel->rd_rel->relowner,
							   save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute_snapshot(ref_query(refrel, ref, types), values, NULL, check_snapshot, InvalidSnapshot,
								 false, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "payidem: the look-up of a referenced key failed");
		found = SPI_processed;
		SPI_finish();
		SetUserIdAndSecContext(save_user, save_sec);
		if (found == 0)
		{
			StringInfoData cols;
			StringInfoData vals;
			char	   *conname = get_constraint_name(conoid);

			initStringInfo(&cols);
			initStringInfo(&vals);
			for (k = 0; k < ref->ncolumns; k++)
			{
				appendStringInfo(&cols, "%s%s", k > 0 ? ", " : "", ref->columns[k]);
				appendStringInfo(&vals, "%s%s", k > 0 ? ", " : "", TextDatumGetCString(values[k]));
			}
			ereport(ERROR,
					(errcode(ERRCODE_FOREIGN_KEY_VIOLATION),
					 errmsg("insert or update on table \"%s\" violates foreign key constraint \"%s\"",
							RelationGetRelationName(rel), conname),
					 errdetail("Key (%s)=(%s) is not present in table \"%s\".", cols.data, vals.data,
							   RelationGetRelationName(refrel)),
					 errtableconstraint(rel, conname)));
		}
	}
	UnregisterSnapshot(check_snapshot);
	table_close(refrel, NoLock);
}

/*
 * rri's trigger functions looked up, as the trigger manager would at the
 * first event of each (fmgr_info()): from the call information kept per
 * function for the session, copied without the function's own cache
 * (fn_extra), which starts empty as after a look-up.  Each direct write has
 * a new result relation, so the trigger manager looked every trigger's
 * function up again at every row (its pg_proc row, its library's symbol:
 * about 650 instructions a trigger, seven in a first success).  Only the
 * triggers of event (TRIGGER_TYPE_INSERT, TRIGGER_TYPE_UPDATE), which are
 * all the write can fire; after the triggers are final
 * (drop_locked_fkey_checks()): they are found by their place in rri's list.
 */
static void
fill_trigger_functions(ResultRelInfo *rri, int16 event)
{
	TriggerDesc *td = rri->ri_TrigDesc;
	int			i;

	if (td == NULL)
		return;
	register_callbacks();
	for (i = 0; i < td->numtriggers; i++)
	{
		Oid			fn = td->triggers[i].tgfoid;
		int			k;

		/* (not one the trigger manager never calls: disabled, or not for this session's role) */
		if ((td->triggers[i].tgtype & event) == 0 || !trigger_fires(&td->triggers[i]) ||
			OidIsValid(rri->ri_TrigFunctions[i].fn_oid))
			continue;
		for (k = 0; k < n_trigger_functions && trigger_functions[k].fn != fn; k++)
			;
		if (k == n_trigger_functions)
		{
			FmgrInfo	info;

			if (k >= TRIGGER_FUNCTIONS_KEPT)
				continue;		/* the trigger manager looks it up */
			fmgr_info_cxt(fn, &info, TopMemoryContext);
			/* (read again: the look-up may have taken in a change that emptied the list) */
			k = n_trigger_functions;
			if (k >= TRIGGER_FUNCTIONS_KEPT)
				continue;
			fmgr_info_copy(&trigger_functions[k].info, &info, TopMemoryContext);
			trigger_functions[k].fn = fn;
			n_trigger_functions = k + 1;
		}
		fmgr_info_copy(&rri->ri_TrigFunctions[i], &trigger_functions[k].info, CurrentMemoryContext);
	}
}

/*
 * The indexes ExecOpenIndices() opened for rri, closed with their
 * RowExclusiveLock kept until the transaction ends, as the table's is.
 * ExecCloseIndices() gives each lock back, and the next write of the
 * transaction to the table takes it again: a release and an acquisition
 * per index (about 5,000 instructions in a first success) that buy
 * nothing, since whatever the index's lock would keep out is kept out by
 * the table's until the transaction ends (REINDEX and CREATE INDEX take a
 * lock on the table that conflicts with it; their concurrent forms and
 * DROP INDEX CONCURRENTLY wait for the transactions holding it).  Marks
 * them closed, so that ExecCloseResultRelations() does not close them again.
 */
static void
close_indices(ResultRelInfo *rri)
{
	int			i;

	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		Relation	irel = rri->ri_IndexRelationDescs[i];

		if (irel == NULL)
			continue;
		IndexInsertCleanupCompat(irel, rri->ri_IndexRelationInfo[i]);
		index_close(irel, NoLock);
		rri->ri_IndexRelationDescs[i] = NULL;
	}
	rri->ri_NumIndices = 0;
}

/*
 * Insert one row: values[i] (NULL if nulls[i]) into column columns[i], every
 * other column its default.  As the executor's INSERT would, but for the
 * privileges: constraints, domains, indexes, generated columns, triggers.
 * With arbiter (a unique index, PayidemRelation) as INSERT ... ON CONFLICT
 * (its key) DO NOTHING would.  checked: first see that the table takes the
 * row as the statement would (insert_plain()), else change nothing and
 * return -1 (the caller runs the statement).  Returns 1 if inserted, 0 if a
 * row holds the arbiter's key.
 */
static int
insert_row(PayidemInsert *ins, const Datum *values, const bool *nulls, int arbiter, bool checked,
		   const PayidemLockedRef *refs, int nrefs, const Oid *domain_checked, uint64 checked_at)
{
	Relation	rel = table_open(payidem_relation(ins->table), RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	MemoryContext oldcxt;
	ExprState **default_states;
	bool		attached;
	int			result = 1;
	int			i;
	Oid			dropped[PAYIDEM_MAX_LOCKED_REFS];

	if (nrefs > PAYIDEM_MAX_LOCKED_REFS)
		elog(ERROR, "payidem: too many locked references");

	/*
	 * what other sessions committed meanwhile (an ALTER DOMAIN): the lock
	 * above processes it only when this transaction did not hold it yet, and
	 * a statement would see it; what this insert keeps compiled may depend
	 * on it (a cast to a domain)
	 */
	AcceptInvalidationMessages();
	if (checked && !insert_plain(rel, arbiter >= 0))
	{
		table_close(rel, NoLock);
		return -1;
	}
	if ((ins->relid != RelationGetRelid(rel) || ins->natts != desc->natts) &&
		!insert_prepare(ins, rel, checked))
	{
		table_close(rel, NoLock);
		return -1;
	}

	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	ExecInitRangeTableOneRelationCompat(estate, rel, RowExclusiveLock, ACL_INSERT, NULL, NULL, NULL);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	/* the AFTER triggers' machinery finds it here instead of opening its own */
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
	estate->es_output_cid = GetCurrentCommandId(true);
	if (arbiter >= 0)
		estate->es_snapshot = RegisterSnapshot(GetTransactionSnapshot());
	ExecOpenIndices(rri, arbiter >= 0);
	slot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsVirtual);
	ExecClearTuple(slot);
	default_states = exprs_attach(&ins->exprs, rri, estate, &attached);
	PG_TRY();
	{
		/*
		 * the domains of the values written, as a cast to the column's type
		 * checks them; but for a value the caller checked against the
		 * column's domain itself, as it stands now
		 */
		for (i = 0; i < ins->ncols; i++)
			if (OidIsValid(ins->domain[i]) &&
				!(domain_checked != NULL && checked_at == domain_generation &&
				  domain_checked[i] == ins->domain[i] && !nulls[i]))
				domain_check(values[i], nulls[i], ins->domain[i], &ins->domain_extra[i], ins->context);

		oldcxt = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
		for (i = 0; i < desc->natts; i++)
		{
			int			src = ins->source[i];

			if (src >= 0)
			{
				slot->tts_values[i] = values[src];
				slot->tts_isnull[i] = nulls[src];
			}
			else if (src == COL_DEFAULT)
				slot->tts_values[i] = ExecEvalExpr(default_states[i],
												   GetPerTupleExprContext(estate), &slot->tts_isnull[i]);
			else
			{
				if (OidIsValid(ins->null_domain[i]))
					domain_check((Datum) 0, true, ins->null_domain[i], &ins->null_domain_extra[i], ins->context);
				slot->tts_values[i] = (Datum) 0;
				slot->tts_isnull[i] = true;
			}
		}
		MemoryContextSwitchTo(oldcxt);
		ExecStoreVirtualTuple(slot);
		drop_locked_fkey_checks(rri, slot, refs, nrefs, dropped);
		fill_trigger_functions(rri, TRIGGER_TYPE_INSERT);

		/* the table's own triggers, statement and row, as for a one-row INSERT */
		AfterTriggerBeginQuery();
		ExecBSInsertTriggers(estate, rri);
		if (arbiter >= 0)
			result = insert_speculative(rri, estate, slot, (PayidemRelation) arbiter);
		else
			ExecSimpleRelationInsert(rri, estate, slot);
		/* the rows to lock after the write, where the checks left out would (first of the AFTER triggers) */
		for (i = 0; result == 1 && i < nrefs; i++)
			if (refs[i].lock_after != NULL && OidIsValid(dropped[i]))
				lock_ref_after(rel, slot, &refs[i], dropped[i]);
		ExecASInsertTriggers(estate, rri, NULL);
		AfterTriggerEndQuery(estate);
	}
	PG_FINALLY();
	{
		exprs_detach(&ins->exprs, attached);
	}
	PG_END_TRY();
	close_indices(rri);
	ExecCloseResultRelations(estate);	/* what the AFTER triggers opened */
	ExecResetTupleTable(estate->es_tupleTable, false);
	if (arbiter >= 0)
	{
		UnregisterSnapshot(estate->es_snapshot);
		estate->es_snapshot = InvalidSnapshot;
	}
	FreeExecutorState(estate);
	table_close(rel, NoLock);
	return result;
}

/* one row of payidem's own tables (insert_row()) */
void
payidem_insert(PayidemInsert *ins, const Datum *values, const bool *nulls)
{
	(void) insert_row(ins, values, nulls, -1, false, NULL, 0, NULL, 0);
}

/*
 * One row of a table others may change too ("order", payment): as the
 * one-row INSERT statement would write it (with arbiter >= 0, a unique index:
 * ... ON CONFLICT (its key) DO NOTHING): 1 inserted, 0 a row holds the key,
 * -1 nothing done: the table has what a direct insert cannot reproduce (the
 * caller runs the statement).
 */
int
payidem_insert_row(PayidemInsert *ins, const Datum *values, const bool *nulls, int arbiter)
{
	return insert_row(ins, values, nulls, arbiter, true, NULL, 0, NULL, 0);
}

/*
 * payidem_insert_row(), the caller holding locked the rows refs name (or
 * having them locked right after the write: their lock_after): the foreign
 * keys to them are not checked again (drop_locked_fkey_checks()).  And
 * domain_checked (NULL, or one per value): the domain the caller checked
 * values[i] against itself (payidem_domain_fits()), or InvalidOid, when
 * payidem_domain_generation() said checked_at: where that is the column's
 * domain, the value is not NULL, and no invalidation a domain's rules depend
 * on was taken in since (the insert first takes in what others committed,
 * as a statement would), the value is not checked again -- it was, by the
 * rules the insert would use.
 */
int
payidem_insert_row_refs(PayidemInsert *ins, const Datum *values, const bool *nulls, int arbiter,
						const PayidemLockedRef *refs, int nrefs, const Oid *domain_checked, uint64 checked_at)
{
	return insert_row(ins, values, nulls, arbiter, true, refs, nrefs, domain_checked, checked_at);
}

/*
 * Versions of rows this backend wrote directly in its current transaction
 * (payment_result.c's updates): where a later look-up by key in the same transaction
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
fetch_by_key(Relation heap, PayidemRelation index, int nkeys, const Datum *keys, Snapshot snapshot,
			 bool unique, const char *filter, Datum filter_value, List **all, ScanDirection dir)
{
	Relation	irel = index_open(payidem_relation(index), AccessShareLock);
	ScanKeyData skey[INDEX_MAX_KEYS];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	HeapTuple	tuple = NULL;
	int			filter_attnum = 0;
	int			i;

	if (irel->rd_rel->relam != BTREE_AM_OID || (unique && !irel->rd_index->indisunique) ||
		irel->rd_index->indrelid != RelationGetRelid(heap) ||
		(unique ? IndexRelationGetNumberOfKeyAttributes(irel) != nkeys
		 : IndexRelationGetNumberOfKeyAttributes(irel) < nkeys))
		elog(ERROR, "payidem: index payidem.%s is not the %sbtree index of %d columns of %s expected",
			 payidem_relation_name(index), unique ? "unique " : "", nkeys, RelationGetRelationName(heap));
	if (filter != NULL && (filter_attnum = payidem_attnum(RelationGetDescr(heap), filter)) <= 0)
		elog(ERROR, "payidem: column %s of %s is missing", filter, RelationGetRelationName(heap));
	for (i = 0; i < nkeys; i++)
	{
		Oid			op = get_opfamily_member(irel->rd_opfamily[i], irel->rd_opcintype[i],
											 irel->rd_opcintype[i], BTEqualStrategyNumber);

		if (!OidIsValid(op) || irel->rd_index->indkey.values[i] == 0)
			elog(ERROR, "payidem: no equality operator for column %d of index payidem.%s", i + 1,
				 payidem_relation_name(index));
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
		while (index_getnext_slot(scan, dir, slot))
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
payidem_fetch_unique(Relation heap, PayidemRelation index, int nkeys, const Datum *keys, Snapshot snapshot)
{
	return fetch_by_key(heap, index, nkeys, keys, snapshot, true, NULL, (Datum) 0, NULL, ForwardScanDirection);
}

/* every row of heap with key keys[] in btree index payidem.<index> and text column column = value */
List *
payidem_fetch_all_key_where(Relation heap, PayidemRelation index, int nkeys, const Datum *keys,
							Snapshot snapshot, const char *column, Datum value)
{
	List	   *all = NIL;

	(void) fetch_by_key(heap, index, nkeys, keys, snapshot, false, column, value, &all, ForwardScanDirection);
	return all;
}

/*
 * every row of heap whose first nkeys key columns in btree index
 * payidem.<index> are keys[], in the index's order of the others, descending
 * if backward
 */
List *
payidem_fetch_all_by_prefix(Relation heap, PayidemRelation index, int nkeys, const Datum *keys,
							Snapshot snapshot, bool backward)
{
	List	   *all = NIL;

	(void) fetch_by_key(heap, index, nkeys, keys, snapshot, false, NULL, (Datum) 0, &all,
						backward ? BackwardScanDirection : ForwardScanDirection);
	return all;
}

/*
 * The executor's row lock (SELECT ... FOR <mode> [SKIP LOCKED]) of the row of
 * rel at slot's tid, found with snapshot, with the executor's outcomes: under
 * READ COMMITTED its latest version (*traversed if that is a later one than
 * the tid's), into slot; under REPEATABLE READ or SERIALIZABLE a row that a
 * transaction which committed after the snapshot changed or removed is a
 * serialization failure (40001).  False if the row is gone (deleted, or
 * changed by a later command of this transaction) or, skipping, held by
 * another transaction.  The one place these outcomes are decided.
 */
static bool
lock_as_select(Relation rel, TupleTableSlot *slot, Snapshot snapshot, LockTupleMode mode, LockWaitPolicy wait,
			   bool *traversed)
{
	ItemPointerData tid = slot->tts_tid;
	TM_FailureData tmfd;
	int			flags = TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS;
	TM_Result	result;

	*traversed = false;
	if (!IsolationUsesXactSnapshot())
		flags |= TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	result = table_tuple_lock(rel, &tid, snapshot, slot, GetCurrentCommandId(true), mode, wait, flags, &tmfd);
	switch (result)
	{
		case TM_Ok:
			*traversed = tmfd.traversed;
			return true;
		case TM_WouldBlock:
		case TM_SelfModified:
			return false;
		case TM_Updated:
		case TM_Deleted:
			/* (as the executor's row lock says it, for a row changed or removed) */
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			return false;
		default:
			elog(ERROR, "payidem: unexpected result %d locking a row of %s", (int) result,
				 RelationGetRelationName(rel));
			return false;		/* keep compiler quiet */
	}
}

/* whether accept takes the version of a row in slot */
static bool
slot_accepted(Relation heap, TupleTableSlot *slot, PayidemAcceptFunc accept, void *arg)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	bool		taken = accept(heap, tuple, arg);

	if (should_free)
		heap_freetuple(tuple);
	return taken;
}

/*
 * The row of heap at tid, one the query SELECT ... WHERE <accept> ... FOR
 * UPDATE SKIP LOCKED found with snapshot, locked as the executor locks it
 * there: FOR UPDATE without waiting -- a row another transaction holds or is
 * changing is skipped, as is one this transaction changed since the
 * snapshot; under READ COMMITTED a row changed since the snapshot is locked
 * at its latest version and taken only if accept takes that version (the
 * re-check of the query's conditions, its index keys' too: accept's to
 * make); under REPEATABLE READ or SERIALIZABLE a row that a transaction
 * which committed after the snapshot changed or removed is a serialization
 * failure (40001).  Locked and taken: true, the version in slot.
 */
bool
payidem_lock_skip_locked(Relation heap, ItemPointer tid, Snapshot snapshot, PayidemAcceptFunc accept, void *arg,
						 TupleTableSlot *slot)
{
	bool		traversed;

	slot->tts_tid = *tid;
	if (!lock_as_select(heap, slot, snapshot, LockTupleExclusive, LockWaitSkip, &traversed))
		return false;
	/* a later version: taken if it still answers the query */
	return !traversed || slot_accepted(heap, slot, accept, arg);
}

/*
 * SELECT ... FROM heap WHERE <skey on index> AND <accept> ORDER BY <index>
 * LIMIT 1 FOR UPDATE SKIP LOCKED, as the executor runs it: the rows snapshot
 * sees, in the order of btree index (open, forward), that accept takes, each
 * locked as payidem_lock_skip_locked() locks it, until one is.  The first row
 * locked, into slot (its tid with it): true; false if none.
 */
bool
payidem_lock_first_skip_locked(Relation heap, Relation index, ScanKey skey, int nkeys, Snapshot snapshot,
							   PayidemAcceptFunc accept, void *arg, TupleTableSlot *slot)
{
	IndexScanDesc scan = index_beginscan_compat(heap, index, snapshot, nkeys);
	TupleTableSlot *seen = table_slot_create(heap, NULL);
	bool		found = false;

	index_rescan(scan, skey, nkeys, NULL, 0);
	while (!found && index_getnext_slot(scan, ForwardScanDirection, seen))
	{
		CHECK_FOR_INTERRUPTS();
		if (slot_accepted(heap, seen, accept, arg))
			found = payidem_lock_skip_locked(heap, &seen->tts_tid, snapshot, accept, arg, slot);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(seen);
	return found;
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
 * The CHECK constraints of rel compiled for payidem_insert_new(), in the
 * current memory context (the caller's cache), with the context they are
 * evaluated in: standalone and as long lived as they are, because some steps
 * keep data in the "per-query" memory of the context they first ran in (a
 * hashed IN list, for one).
 */
void
payidem_checks_compile(PayidemChecks *checks, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	memset(checks, 0, sizeof(PayidemChecks));
	if (desc->constr == NULL || desc->constr->num_check == 0)
		return;
	checks->n = desc->constr->num_check;
	checks->states = palloc(sizeof(ExprState *) * checks->n);
	checks->names = palloc(sizeof(char *) * checks->n);
	for (i = 0; i < checks->n; i++)
	{
		ConstrCheck *check = &desc->constr->check[i];
		Expr	   *expr = ConstrCheckIsEnforced(check) ?
			expression_planner((Expr *) CheckConstraintExprCompat(rel, check)) : NULL;

		checks->states[i] = ExecInitExpr(expr, NULL);
		checks->names[i] = pstrdup(check->ccname);
	}
	checks->econtext = CreateStandaloneExprContext();
}

/* the evaluation context of checks; their memory is the caller's to free */
void
payidem_checks_free(PayidemChecks *checks)
{
	if (checks->econtext != NULL)
		FreeExprContext(checks->econtext, true);
	memset(checks, 0, sizeof(PayidemChecks));
}

/*
 * The first row of heap visible to snapshot whose key in index (open) is
 * skey[], into slot (with its tid): true, or false if none.
 */
bool
payidem_index_fetch(Relation heap, Relation index, ScanKey skey, int nkeys, Snapshot snapshot,
					TupleTableSlot *slot)
{
	IndexScanDesc scan = index_beginscan_compat(heap, index, snapshot, nkeys);
	bool		found;

	index_rescan(scan, skey, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/*
 * Under REPEATABLE READ or SERIALIZABLE, a conflicting row this transaction
 * cannot see is a serialization failure, as for INSERT ... ON CONFLICT.
 */
static void
check_conflict_visible(Relation rel, ItemPointer tid, Snapshot snapshot)
{
	TupleTableSlot *slot;
	bool		isnull;

	if (!IsolationUsesXactSnapshot())
		return;
	slot = table_slot_create(rel, NULL);
	if (!table_tuple_fetch_row_version(rel, tid, SnapshotAny, slot))
		elog(ERROR, "failed to fetch the conflicting row of %s", RelationGetRelationName(rel));
	if (!table_tuple_satisfies_snapshot(rel, slot, snapshot))
	{
		TransactionId xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
																   &isnull));

		if (!TransactionIdIsCurrentTransactionId(xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update")));
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * Insert a row as INSERT ... ON CONFLICT (the key of unique index arbiter)
 * DO NOTHING would, through the same steps as the executor's speculative
 * insertion: check the row's constraints, pre-check the unique index
 * (waiting for a concurrent inserter of the key), insert the heap tuple
 * speculatively, insert the index entries, and confirm or kill the tuple.
 * What it saves is the statement: no executor start and stop, and the CHECK
 * constraints are not read back from the catalog text on every call
 * (PostgreSQL 15 does that per statement).  Column attnums[i] gets
 * values[i] (NULL if isnull[i]), every other column NULL; rel is open and
 * locked (RowExclusiveLock) and has no trigger, no row security and no
 * generated column (the caller checked).
 *
 * Returns 1 if inserted, 0 if another row holds the key (a conflict).
 */
int
payidem_insert_new(Relation rel, Oid arbiter, const PayidemChecks *checks, int ncols,
				   const AttrNumber *attnums, const Datum *values, const bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(rel);
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	ExprContext *econtext;
	ItemPointerData conflict_tid;
	List	   *arbiters;
	bool		spec_conflict = false;
	uint32		spec_token;
	TransactionId xid;
	int			result;
	int			i;

	estate = CreateExecutorState();
	estate->es_output_cid = GetCurrentCommandId(true);
	estate->es_snapshot = RegisterSnapshot(GetTransactionSnapshot());
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, true);

	slot = ExecInitExtraTupleSlot(estate, desc, table_slot_callbacks(rel));
	ExecClearTuple(slot);
	for (i = 0; i < desc->natts; i++)
	{
		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
	}
	for (i = 0; i < ncols; i++)
	{
		slot->tts_values[attnums[i] - 1] = values[i];
		slot->tts_isnull[attnums[i] - 1] = isnull[i];
	}
	ExecStoreVirtualTuple(slot);

	/* the row's CHECK constraints, with PostgreSQL's message */
	econtext = checks->econtext;
	for (i = 0; i < checks->n; i++)
	{
		bool		ok;

		econtext->ecxt_scantuple = slot;
		ok = ExecCheck(checks->states[i], econtext);
		econtext->ecxt_scantuple = NULL;
		ResetExprContext(econtext);
		if (!ok)
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("new row for relation \"%s\" violates check constraint \"%s\"",
							RelationGetRelationName(rel), checks->names[i]),
					 errtableconstraint(rel, checks->names[i])));
	}

	arbiters = list_make1_oid(arbiter);
	if (!ExecCheckIndexConstraintsCompat(rri, slot, estate, &conflict_tid, arbiters))
	{
		check_conflict_visible(rel, &conflict_tid, estate->es_snapshot);
		result = 0;
	}
	else
	{
		xid = GetCurrentTransactionId();
		spec_token = SpeculativeInsertionLockAcquire(xid);
		table_tuple_insert_speculative(rel, slot, estate->es_output_cid, 0, NULL, spec_token);
		list_free(ExecInsertIndexTuplesNoDupErrCompat(rri, slot, estate, &spec_conflict, arbiters));
		table_tuple_complete_speculative(rel, slot, spec_token, !spec_conflict);
		SpeculativeInsertionLockRelease(xid);
		/* lost a race after the pre-check: like a conflict, read the winner */
		result = spec_conflict ? 0 : 1;
	}

	close_indices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	UnregisterSnapshot(estate->es_snapshot);
	estate->es_snapshot = InvalidSnapshot;
	FreeExecutorState(estate);
	return result;
}

/* every row of rel the active snapshot sees, to func in turn */
void
payidem_scan(Relation rel, PayidemRowFunc func, void *arg)
{
	TableScanDesc scan = table_beginscan_compat(rel, GetActiveSnapshot());
	TupleTableSlot *slot = table_slot_create(rel, NULL);

	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

		CHECK_FOR_INTERRUPTS();
		func(rel, tuple, arg);
		if (should_free)
			heap_freetuple(tuple);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * SELECT ... FOR NO KEY UPDATE of the row in slot, in READ COMMITTED: its
 * latest version, waiting for a concurrent writer; the slot then holds that
 * version.  False if the row is gone (deleted) or cannot be locked here.
 * The lock of the SQL path, and of an UPDATE that keeps the key: foreign
 * keys' KEY SHARE locks do not wait for it.
 */
bool
payidem_lock_row(Relation rel, TupleTableSlot *slot, Snapshot snapshot)
{
	ItemPointerData tid = slot->tts_tid;
	TM_FailureData tmfd;

	return table_tuple_lock(rel, &tid, snapshot, slot, GetCurrentCommandId(true),
							LockTupleNoKeyExclusive, LockWaitBlock,
							TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd) == TM_Ok;
}

/*
 * SELECT ... FOR <mode> of the row in slot, found with snapshot, as the
 * executor locks it: waiting for a transaction that holds it;
 * under READ COMMITTED its latest version, into slot; under REPEATABLE READ
 * or SERIALIZABLE a row that a transaction which committed after the
 * snapshot changed or removed is a serialization failure (40001).  False if
 * the row is gone (deleted, or changed by a later command of this
 * transaction).
 */
bool
payidem_lock_row_as_select(Relation rel, TupleTableSlot *slot, Snapshot snapshot, LockTupleMode mode)
{
	bool		traversed;

	return lock_as_select(rel, slot, snapshot, mode, LockWaitBlock, &traversed);
}

/*
 * Delete one row that the active snapshot sees, by its TID, as a DELETE
 * statement would.  A row that a transaction which committed after this
 * one's snapshot changed or removed is, under REPEATABLE READ or
 * SERIALIZABLE, a serialization failure (40001): the transaction is to be
 * retried, and then sees the row as it is.  Anything else (a row the caller
 * found under a lock that keeps other writers out) is an internal error, as
 * in simple_table_tuple_delete().
 */
void
payidem_delete_row(Relation rel, ItemPointer tid)
{
	TM_FailureData tmfd;
	TM_Result	result = TableTupleDeleteCompat(rel, tid, GetCurrentCommandId(true), GetActiveSnapshot(),
												true, &tmfd);

	switch (result)
	{
		case TM_Ok:
			return;
		case TM_Updated:
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update"),
						 errdetail("A row of payidem.%s that this transaction's snapshot sees was changed by a transaction that committed after the snapshot was taken.",
								   RelationGetRelationName(rel)),
						 errhint("Retry the transaction.")));
			elog(ERROR, "tuple concurrently %s", result == TM_Updated ? "updated" : "deleted");
			break;
		case TM_SelfModified:
			elog(ERROR, "tuple already updated by self");
			break;
		default:
			elog(ERROR, "unexpected table_tuple_delete status: %d", (int) result);
			break;
	}
}

/* (re)build what t keeps, from the relation as it is now (we hold a lock) */
static void
update_prepare(PayidemUpdate *t, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	uint64		before = update_inval_count;
	MemoryContext oldcxt;
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("payidem.%s is not a plain table", payidem_relation_name(t->table)),
				 errhint("apply_payment_result() writes payidem.%s row by row; it cannot be partitioned or replaced by a view.",
						 payidem_relation_name(t->table))));
	/*
	 * What was built before may still be in use by a payidem_update() further
	 * up the stack (a trigger that applies another payment): it goes when
	 * the transaction ends, not now.
	 */
	if (t->context != NULL)
		MemoryContextSetParent(t->context, TopTransactionContext);
	t->context = AllocSetContextCreate(CacheMemoryContext, "payidem direct update",
									   ALLOCSET_SMALL_SIZES);
	t->valid = false;

	oldcxt = MemoryContextSwitchTo(t->context);
	t->natts = desc->natts;
	t->keyattno = payidem_column(rel, t->keycol);
	t->keyint8 = TupleDescAttr(desc, t->keyattno - 1)->atttypid == INT8OID;
	for (i = 0; i < t->ncolumns; i++)
	{
		Oid			typid;

		t->attnos[i] = payidem_column(rel, t->columns[i]);
		typid = TupleDescAttr(desc, t->attnos[i] - 1)->atttypid;
		t->isdomain[i] = get_typtype(typid) == TYPTYPE_DOMAIN;
		t->domain_extra[i] = NULL;
	}
	t->generated = GeneratedColumnsOfCompat(rel);
	MemoryContextSwitchTo(oldcxt);
	t->indexes_lazy = indexes_lazy_ok(rel);
	if (t->own_bookkeeping)
	{
		oldcxt = MemoryContextSwitchTo(t->context);
		t->trigdesc = own_bookkeeping_triggers(rel);
		MemoryContextSwitchTo(oldcxt);
	}
	exprs_plan(&t->exprs, rel, t->context, 0, NULL);
	/* an invalidation that arrived meanwhile: build again next time */
	t->valid = (before == update_inval_count);
}

/*
 * May the current user update rel row by row, as a SQL UPDATE
 * would?  Not if it has statement-level UPDATE triggers, transition tables,
 * rules or row-level security that applies, or the user lacks UPDATE.
 */
bool
payidem_update_plain(Relation rel)
{
	return !((rel->trigdesc &&
			  (rel->trigdesc->trig_update_before_statement ||
			   rel->trigdesc->trig_update_after_statement ||
			   rel->trigdesc->trig_update_old_table ||
			   rel->trigdesc->trig_update_new_table)) ||
			 rel->rd_rules != NULL ||
			 check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED ||
			 pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_UPDATE) != ACLCHECK_OK);
}

/*
 * Update the row of t's table at tid, whose key column (text or bigint)
 * must equal key: the columns of t with set[i] take values[i]/nulls[i] (of type
 * types[i]: a column of a domain type is checked against its domain unless
 * the value already has that type), the others keep their value.  A column
 * with keep_null[i] is set only to a non-NULL value; the UPDATE names it
 * anyway, as SET col = coalesce(value, col) would.  The caller holds the
 * row's lock (SELECT ... FOR UPDATE in this transaction), so the version at
 * tid is the latest and nobody else can update it first.
 *
 * Returns false, having changed nothing, when the table has what a row-by-row
 * update cannot reproduce (payidem_update_plain()), unless the caller checked
 * that already in this transaction (checked): the caller then runs the
 * UPDATE in SQL (which does all that, or refuses).
 */
bool
payidem_update(PayidemUpdate *t, ItemPointer tid, Datum key,
			const bool *set, Datum *values, const bool *nulls, const Oid *types,
			const bool *keep_null, bool checked)
{
	Relation	rel;
	TupleDesc	desc;
	EState	   *estate;
	ResultRelInfo *rri;
	EPQState	epqstate;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Snapshot	snapshot;
	Bitmapset  *updated = NULL;
	Datum		oldkey;
	bool		isnull;
	bool		attached;
	int			i;

	if (!t->valid)
		t->relid = payidem_relation(t->table);
	rel = table_open(t->relid, RowExclusiveLock);
	/* what others committed meanwhile, as in insert_row() */
	AcceptInvalidationMessages();
	if (!t->valid || t->natts != RelationGetDescr(rel)->natts)
		update_prepare(t, rel);
	desc = RelationGetDescr(rel);
	if (!checked && !payidem_update_plain(rel))
	{
		table_close(rel, NoLock);
		return false;
	}

	estate = CreateExecutorState();
	estate->es_output_cid = GetCurrentCommandId(true);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	estate->es_snapshot = snapshot;

	/* the row, and that it is the one the caller means */
	oldslot = table_slot_create(rel, &estate->es_tupleTable);
	if (!table_tuple_fetch_row_version(rel, tid, snapshot, oldslot))
		elog(ERROR, "payidem: the locked row of payidem.%s at (%u,%u) is gone",
			 payidem_relation_name(t->table), ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
	oldkey = slot_getattr(oldslot, t->keyattno, &isnull);
	if (isnull || (t->keyint8 ? DatumGetInt64(oldkey) != DatumGetInt64(key) :
				   !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, oldkey, key))))
		elog(ERROR, "payidem: the row of payidem.%s at (%u,%u) is not %s",
			 payidem_relation_name(t->table), ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid),
			 t->keyint8 ? psprintf(INT64_FORMAT, DatumGetInt64(key)) : TextDatumGetCString(key));

	/* the new version: the old one with the columns set */
	newslot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsVirtual);
	ExecClearTuple(newslot);
	slot_getallattrs(oldslot);
	memcpy(newslot->tts_values, oldslot->tts_values, sizeof(Datum) * desc->natts);
	memcpy(newslot->tts_isnull, oldslot->tts_isnull, sizeof(bool) * desc->natts);
	for (i = 0; i < t->ncolumns; i++)
	{
		AttrNumber	attno = t->attnos[i];

		if (!set[i])
			continue;
		/* kept, but named by the UPDATE as well (for UPDATE OF triggers) */
		updated = bms_add_member(updated, attno - FirstLowInvalidHeapAttributeNumber);
		if (keep_null != NULL && keep_null[i] && nulls[i])
			continue;
		/* a value of the column's domain type was checked when it was made */
		if (t->isdomain[i] && types[i] != TupleDescAttr(desc, attno - 1)->atttypid)
			domain_check(values[i], nulls[i], TupleDescAttr(desc, attno - 1)->atttypid,
						 &t->domain_extra[i], t->context);
		newslot->tts_values[attno - 1] = values[i];
		newslot->tts_isnull[attno - 1] = nulls[i];
	}
	ExecStoreVirtualTuple(newslot);
	ItemPointerSetInvalid(&newslot->tts_tid);	/* until the update makes it */

	/*
	 * what a one-row UPDATE of those columns would set up; the updated
	 * columns are for UPDATE OF triggers and the indexes' unchanged hints
	 */
	ExecInitRangeTableOneRelationCompat(estate, rel, RowExclusiveLock, ACL_UPDATE, NULL, updated,
										t->generated);
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	/* (sized for all of them, the trigger function caches fit the fewer) */
	if (t->own_bookkeeping && t->trigdesc != NULL)
		rri->ri_TrigDesc = t->trigdesc;
	fill_trigger_functions(rri, TRIGGER_TYPE_UPDATE);
	/* the trigger machinery finds it here instead of opening its own */
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
	if (!t->indexes_lazy)
		ExecOpenIndices(rri, false);
	EvalPlanQualInitCompat(&epqstate, estate);

	(void) exprs_attach(&t->exprs, rri, estate, &attached);
	PG_TRY();
	{
		AfterTriggerBeginQuery();
		ExecSimpleRelationUpdate(rri, estate, &epqstate, oldslot, newslot);
		if (t->indexes_lazy)
			update_index_entries(rri, newslot, estate);
		/* for the look-ups by key of this transaction's triggers */
		payidem_remember_version(rel, &newslot->tts_tid);
		AfterTriggerEndQuery(estate);	/* the status guard runs here */
	}
	PG_FINALLY();
	{
		exprs_detach(&t->exprs, attached);
	}
	PG_END_TRY();

	EvalPlanQualEnd(&epqstate);
	close_indices(rri);
	ExecCloseResultRelations(estate);	/* what the AFTER triggers opened */
	ExecCloseRangeTableRelations(estate);
	ExecResetTupleTable(estate->es_tupleTable, false);
	UnregisterSnapshot(snapshot);
	FreeExecutorState(estate);
	table_close(rel, NoLock);

	/* what runs next sees the new version, as after a statement */
	CommandCounterIncrement();
	return true;
}

/*
 * An update's index entries, made only when it needs them.  A HOT update
 * (no indexed column changed, and the new version fits on the old one's
 * page) writes no index entry, so opening the table's indexes for it is
 * wasted; whether it is HOT is known only after the heap update.  For a
 * table whose indexes are all immediate btrees on plain columns (no deferred
 * uniqueness to recheck, no exclusion constraint, nothing summarizing, no
 * predicate or expression to compile), the caller updates
 * with no index open and then calls this: if the new version at tid is not
 * heap-only, the indexes are opened and its entries made, as the executor
 * would have (with the "unchanged key" hints of an update).
 */
static bool
indexes_lazy_ok(Relation rel)
{
	List	   *indexes;
	ListCell   *lc;
	bool		ok = rel->rd_rel->relam == HEAP_TABLE_AM_OID;

	if (!ok || !rel->rd_rel->relhasindex)
		return ok;
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		Relation	irel = index_open(lfirst_oid(lc), AccessShareLock);

		if (irel->rd_rel->relam != BTREE_AM_OID || !irel->rd_index->indimmediate ||
			irel->rd_index->indisexclusion || RelationGetIndexPredicate(irel) != NIL ||
			RelationGetIndexExpressions(irel) != NIL)
			ok = false;
		index_close(irel, NoLock);
	}
	list_free(indexes);
	return ok;
}

static void
update_index_entries(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate)
{
	Relation	rel = rri->ri_RelationDesc;
	ItemPointer tid = &slot->tts_tid;
	Buffer		buf;
	Page		page;
	bool		heap_only = false;

	if (!rel->rd_rel->relhasindex || !ItemPointerIsValid(tid))
		return;					/* no index, or no new version (a BEFORE trigger said no) */
	buf = ReadBuffer(rel, ItemPointerGetBlockNumber(tid));
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	if (ItemPointerGetOffsetNumber(tid) <= PageGetMaxOffsetNumber(page))
	{
		ItemId		lp = PageGetItemId(page, ItemPointerGetOffsetNumber(tid));

		heap_only = ItemIdIsNormal(lp) &&
			HeapTupleHeaderIsHeapOnly((HeapTupleHeader) PageGetItem(page, lp));
	}
	UnlockReleaseBuffer(buf);
	if (heap_only)
		return;
	if (rri->ri_IndexRelationDescs == NULL)
		ExecOpenIndices(rri, false);
	/* immediate btrees only: nothing to recheck at the end of the statement */
	list_free(ExecInsertIndexTuplesUpdateCompat(rri, slot, estate));
}
