/*-------------------------------------------------------------------------
 *
 * catalog.c
 *		payidem's catalog: where its tables, sequences and indexes are (each
 *		found by name once per backend, kept by OID until it changes), who
 *		owns them, the one way to act as that owner, and the number of a
 *		column by name.
 *
 * The OIDs and owners are kept in arrays indexed by PayidemRelation (the
 * callers read them inline); an entry is forgotten when its relation changes
 * (its relcache invalidation: a rename, a drop, ALTER ... OWNER), all of them
 * at a full reset or when a schema changes (a rename of payidem).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/guc.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "inval.h"

#define PAYIDEM_RELATION_NAME(id, name) name,
static const char *const relation_names[PAYIDEM_NUM_RELATIONS] = {
	PAYIDEM_RELATIONS(PAYIDEM_RELATION_NAME)
};

Oid			payidem_relids[PAYIDEM_NUM_RELATIONS];
Oid			payidem_owners[PAYIDEM_NUM_RELATIONS];
static bool callbacks_registered = false;

static void
catalog_relcache_callback(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < PAYIDEM_NUM_RELATIONS; i++)
		if (relid == InvalidOid || payidem_relids[i] == relid)
			payidem_relids[i] = payidem_owners[i] = InvalidOid;
}

static void
catalog_namespace_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	catalog_relcache_callback(arg, InvalidOid);
}

#define PAYIDEM_TYPE_NAME(id, name) name,
static const char *const type_names[PAYIDEM_NUM_TYPES] = {
	PAYIDEM_TYPES(PAYIDEM_TYPE_NAME)
};

Oid			payidem_typids[PAYIDEM_NUM_TYPES];
static bool type_callbacks_registered = false;

static void
catalog_type_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	memset(payidem_typids, 0, sizeof(payidem_typids));
}

/* OID of the type payidem.<type>, found by name and kept; a clear error if missing */
Oid
payidem_lookup_type(PayidemType type)
{
	Oid			nsp;
	Oid			typid = InvalidOid;

	if (!type_callbacks_registered)
	{
		payidem_register_syscache_callback(TYPEOID, catalog_type_callback, (Datum) 0);
		payidem_register_syscache_callback(NAMESPACEOID, catalog_type_callback, (Datum) 0);
		type_callbacks_registered = true;
	}
	nsp = get_namespace_oid("payidem", true);
	if (OidIsValid(nsp))
		typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								CStringGetDatum(type_names[type]), ObjectIdGetDatum(nsp));
	if (!OidIsValid(typid))		/* as a cast to the type by name would say */
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type \"payidem.%s\" does not exist", type_names[type])));
	payidem_typids[type] = typid;
	return typid;
}

const char *
payidem_relation_name(PayidemRelation rel)
{
	return relation_names[rel];
}

/*
 * OID of payidem.<rel>, found by name and kept; if it is missing, InvalidOid
 * with missing_ok, else a clear error.
 */
Oid
payidem_lookup_relation(PayidemRelation rel, bool missing_ok)
{
	Oid			nsp;
	Oid			relid = InvalidOid;

	if (!callbacks_registered)
	{
		payidem_register_relcache_callback(catalog_relcache_callback, (Datum) 0);
		payidem_register_syscache_callback(NAMESPACEOID, catalog_namespace_callback, (Datum) 0);
		callbacks_registered = true;
	}
	nsp = get_namespace_oid("payidem", true);
	if (OidIsValid(nsp))
		relid = get_relname_relid(relation_names[rel], nsp);
	if (!OidIsValid(relid) && !missing_ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation payidem.%s does not exist", relation_names[rel]),
				 errhint("Run CREATE EXTENSION payidem in this database.")));
	if (payidem_relids[rel] != relid)
		payidem_owners[rel] = InvalidOid;
	payidem_relids[rel] = relid;
	return relid;
}

/* The owner of payidem.<rel>, from the syscache, kept as its OID is. */
Oid
payidem_lookup_owner(PayidemRelation rel)
{
	Oid			relid = payidem_relation(rel);
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	/* unless an invalidation processed meanwhile made the OID stale */
	if (payidem_relids[rel] == relid)
		payidem_owners[rel] = owner;
	return owner;
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

/* The number of column name of rel, one of payidem's own: 42703 if missing. */
int
payidem_column(Relation rel, const char *name)
{
	int			attnum = payidem_attnum(RelationGetDescr(rel), name);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation payidem.%s does not exist",
						name, RelationGetRelationName(rel))));
	return attnum;
}

/*
 * The output functions of the types payidem_getattr_text() printed, kept
 * for the session (a type's output function never changes; any change of a
 * type or a function forgets them all, so that a type dropped and its
 * number reused is not printed with another's, nor a C function replaced
 * called as it was).
 */
#define OUTPUT_CACHE_SIZE 16
typedef struct OutputCacheEntry
{
	Oid			type;
	FmgrInfo	out;
} OutputCacheEntry;
static OutputCacheEntry output_cache[OUTPUT_CACHE_SIZE];
static int	n_output_cache = 0;

/* the base types payidem_base_type() gave, kept the same way */
typedef struct BaseTypeEntry
{
	Oid			type;
	Oid			base;
} BaseTypeEntry;
static BaseTypeEntry base_cache[OUTPUT_CACHE_SIZE];
static int	n_base_cache = 0;
static bool type_facts_registered = false;

static void
type_cache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	n_output_cache = 0;
	n_base_cache = 0;
}

static void
register_type_facts_callbacks(void)
{
	if (type_facts_registered)
		return;
	payidem_register_syscache_callback(TYPEOID, type_cache_callback, (Datum) 0);
	/* (a C output function replaced under the same number) */
	payidem_register_syscache_callback(PROCOID, type_cache_callback, (Datum) 0);
	type_facts_registered = true;
}

/*
 * getBaseType(type), kept for the session: a domain's base type never
 * changes (forgotten with any change of a type, as the output functions are).
 */
Oid
payidem_base_type(Oid type)
{
	Oid			base;
	int			i;

	for (i = 0; i < n_base_cache; i++)
		if (base_cache[i].type == type)
			return base_cache[i].base;
	register_type_facts_callbacks();
	base = getBaseType(type);
	/* (the count read only now: the look-up may have emptied the cache) */
	i = n_base_cache;
	if (i < OUTPUT_CACHE_SIZE)
	{
		base_cache[i].type = type;
		base_cache[i].base = base;
		n_base_cache = i + 1;
	}
	return base;
}

/* value d of type as the type's output writes it, palloc'd (the output function kept) */
static char *
datum_text(Oid type, Datum d)
{
	Oid			fn;
	bool		varlena;
	FmgrInfo	out;
	int			i;

	for (i = 0; i < n_output_cache; i++)
		if (output_cache[i].type == type)
			return OutputFunctionCall(&output_cache[i].out, d);
	register_type_facts_callbacks();
	getTypeOutputInfo(type, &fn, &varlena);
	fmgr_info_cxt(fn, &out, TopMemoryContext);
	/*
	 * (the cache's count read only now: the look-up of the function may
	 * have taken in an invalidation that emptied it)
	 */
	i = n_output_cache;
	if (i >= OUTPUT_CACHE_SIZE)
		return OutputFunctionCall(&out, d);
	fmgr_info_copy(&output_cache[i].out, &out, TopMemoryContext);
	output_cache[i].type = type;
	n_output_cache = i + 1;
	return OutputFunctionCall(&output_cache[i].out, d);
}

/*
 * Column name of a tuple of rel (one of payidem's own tables) as its type's
 * output writes it, palloc'd, or NULL: what SPI_getvalue() gives, without
 * looking the output function up again at every call.
 */
char *
payidem_getattr_text(Relation rel, HeapTuple tuple, const char *name)
{
	int			attnum = payidem_column(rel, name);
	bool		isnull;
	Datum		d = heap_getattr(tuple, attnum, RelationGetDescr(rel), &isnull);

	return isnull ? NULL : datum_text(TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid, d);
}

/*
 * A tuple of rel (one of payidem's own tables) taken apart once, for
 * several of its columns: read one by one, each column after a
 * variable-length one walks the tuple from its start again.  The values
 * point into the tuple, which must outlive them.
 */
void
payidem_row_deform(PayidemRow *row, Relation rel, HeapTuple tuple)
{
	TupleDesc	desc = RelationGetDescr(rel);

	row->rel = rel;
	row->values = palloc(sizeof(Datum) * desc->natts);
	row->nulls = palloc(sizeof(bool) * desc->natts);
	heap_deform_tuple(tuple, desc, row->values, row->nulls);
}

/* the arrays of a row taken apart (its values still point into the tuple) */
void
payidem_row_free(PayidemRow *row)
{
	pfree(row->values);
	pfree(row->nulls);
}

/* column name of a row taken apart (payidem_getattr()'s value) */
Datum
payidem_row_get(const PayidemRow *row, const char *name, bool *isnull)
{
	int			a = payidem_column(row->rel, name) - 1;

	*isnull = row->nulls[a];
	return row->values[a];
}

/* column name of a row taken apart as text, or NULL (payidem_getattr_text()'s) */
char *
payidem_row_text(const PayidemRow *row, const char *name)
{
	int			a = payidem_column(row->rel, name) - 1;

	return row->nulls[a] ? NULL :
		datum_text(TupleDescAttr(RelationGetDescr(row->rel), a)->atttypid, row->values[a]);
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
	payidem_become_owner(owner, SECURITY_NOFORCE_RLS, save);
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
}

void
payidem_end_as_owner(const PayidemAsOwner *save)
{
	PopActiveSnapshot();
	payidem_become_caller(save);
}

/*
 * Pin search_path to pg_catalog, pg_temp, as a SECURITY DEFINER function's
 * SET clause does, until payidem_unpin_search_path(level) or the
 * (sub)transaction's end: for a C function that acts as the tables' owner
 * and writes or reads rows a DBA's trigger or policy may run code for, so
 * that this code, run as the owner, resolves no name in a schema of the
 * caller's search_path.  Returns the nest level to give back.
 */
int
payidem_pin_search_path(void)
{
	int			level = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

void
payidem_unpin_search_path(int level)
{
	AtEOXact_GUC(true, level);
}
