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

#include "access/htup_details.h"
#include "catalog/pg_class.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/syscache.h"

#include "payidem.h"

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
	flow_define_gucs();
	housekeeping_init();		/* its GUCs; its launcher only when preloading */
	MarkGUCPrefixReserved("payidem");

	if (!process_shared_preload_libraries_in_progress)
		return;
	payidem_shmem_init();
}

/*
 * Quote a user-supplied value for an error message: single quotes, at most
 * 64 characters (longer values are cut and marked), never NULL.
 */
char *
payidem_quote_value(const char *value, int len)
{
	StringInfoData buf;
	int			shown = Min(len, 64);

	/* do not cut a multibyte character in half */
	shown = pg_mbcliplen(value, len, shown);
	initStringInfo(&buf);
	appendStringInfoChar(&buf, '\'');
	appendBinaryStringInfo(&buf, value, shown);
	appendStringInfoChar(&buf, '\'');
	if (shown < len)
		appendStringInfo(&buf, "... (%d bytes)", len);
	return buf.data;
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
