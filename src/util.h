/*-------------------------------------------------------------------------
 *
 * util.h
 *		Small helpers every part uses (util.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_UTIL_H
#define PAYIDEM_UTIL_H

#include "access/htup_details.h"	/* the varlena macros (varatt.h from 16 on) */
#include "datatype/timestamp.h"
#include "access/tupdesc.h"
#include "fmgr.h"
#include "utils/palloc.h"

struct _SPI_plan;
struct RelationData;

extern bool payidem_restoring(struct RelationData *rel, bool *copying);
extern char *payidem_quote_value(const char *value, int len);
extern void payidem_check_no_controls_text(const char *message, const char *what, text *value);
extern void payidem_check_interval(const char *message, const char *what, const Interval *value,
								   bool allow_zero, int max_years, const char *hint);
extern bool payidem_domain_fits(void **cache, MemoryContext mcxt, Oid typid, Datum value);
/* a set-returning function's cached row descriptor (payidem_materialized_result()) */
typedef struct PayidemResultDesc
{
	Oid			fn_oid;			/* the SQL function it is the result of */
	TupleDesc	desc;
} PayidemResultDesc;

extern void payidem_materialized_result(FunctionCallInfo fcinfo, PayidemResultDesc *cache);
extern struct _SPI_plan *payidem_saved_plan(struct _SPI_plan **cache, const char *sql, int nargs,
											Oid *argtypes);

/* Equal as stored bytes (text equality under a deterministic collation). */
static inline bool
payidem_text_equal(Datum a, Datum b)
{
	text	   *ta = DatumGetTextPP(a);
	text	   *tb = DatumGetTextPP(b);
	int			la = VARSIZE_ANY_EXHDR(ta);

	return la == VARSIZE_ANY_EXHDR(tb) &&
		memcmp(VARDATA_ANY(ta), VARDATA_ANY(tb), la) == 0;
}

/* a text datum equal to the C string s */
static inline bool
payidem_text_is(Datum d, const char *s)
{
	text	   *t = DatumGetTextPP(d);
	size_t		len = strlen(s);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), s, len) == 0;
}

#endif							/* PAYIDEM_UTIL_H */
