/*-------------------------------------------------------------------------
 *
 * util.c
 *		Small helpers every part uses: a user's value quoted for an error
 *		message, the checks of a name and of a duration, whether a text fits
 *		a domain (_fits), the library's version and the saved SPI plans.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "tcop/pquery.h"
#include "utils/acl.h"
#include "utils/portal.h"
#include "utils/rel.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "inval.h"
#include "util.h"

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
 *		value itself otherwise.  Every caller checks through this (C
 *		callers through payidem_check_no_controls_text()).
 */
void
payidem_check_no_controls_text(const char *message, const char *what, text *value)
{
	const char *p = VARDATA_ANY(value);
	int			len = VARSIZE_ANY_EXHDR(value);
	int			i;

	for (i = 0; i < len; i++)
		if (is_control_byte((unsigned char) p[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", message),
					 errdetail("%s was %s; it must not contain control characters (tabs, line breaks and the like).",
							   what, payidem_quote_value(p, len)),
					 errhint("Write it on one line, with spaces in place of tabs and line breaks.")));
}

PG_FUNCTION_INFO_V1(payidem_check_no_controls);
Datum
payidem_check_no_controls(PG_FUNCTION_ARGS)
{
	text	   *value = PG_GETARG_TEXT_PP(2);

	payidem_check_no_controls_text(text_to_cstring(PG_GETARG_TEXT_PP(0)), text_to_cstring(PG_GETARG_TEXT_PP(1)),
								   value);
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

/*
 * Whether a text value satisfies every CHECK of a domain over text (and of
 * the domains it is made from), without raising: the flow functions test an
 * argument with the domain of the column it is written to, so a format's
 * pattern is written once, in its domain, and they can still say which
 * argument is wrong (docs/schema.md, "Formats as domains").  *cache keeps,
 * in a context of its own under mcxt (deleted when another domain takes its
 * place: the extension made again), the type cache's current constraints of the domain and their
 * checks compiled once for that set; a change of the domain's constraints
 * (the type cache gives a new set) compiles them again in place of the old
 * ones.  The one test of a value against a domain: _fits() in SQL, and the
 * C flow functions (create_order()).
 */
typedef struct DomainFit
{
	MemoryContext context;		/* everything below, and the constraints' pin */
	Oid			typid;
	DomainConstraintRef ref;	/* the type cache's constraints, not compiled */
	void	   *compiled_for;	/* ref.constraints when checks were compiled */
	MemoryContext checks_context;	/* what they were compiled into */
	int			nchecks;
	ExprState **checks;
	ExprContext *econtext;
} DomainFit;

static DomainFit *
domain_fit(void **cache, MemoryContext mcxt, Oid typid)
{
	DomainFit  *fit = (DomainFit *) *cache;
	MemoryContext context;
	MemoryContext oldcxt;
	ListCell   *lc;
	int			n;

	if (fit == NULL || fit->typid != typid)
	{
		if (get_typtype(typid) != TYPTYPE_DOMAIN || getBaseType(typid) != TEXTOID)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s is not a domain over text", format_type_be(typid))));
		context = AllocSetContextCreate(mcxt, "payidem domain fit", ALLOCSET_SMALL_SIZES);
		/* another domain in this place (the extension made again): the old one goes */
		if (fit != NULL)
			MemoryContextDelete(fit->context);	/* its constraints unpinned too */
		*cache = NULL;
		oldcxt = MemoryContextSwitchTo(context);
		fit = palloc0(sizeof(DomainFit));
		fit->context = context;
		fit->typid = typid;
		InitDomainConstraintRef(typid, &fit->ref, context, false);
		fit->checks_context = AllocSetContextCreate(context, "payidem domain checks",
													ALLOCSET_SMALL_SIZES);
		fit->econtext = CreateStandaloneExprContext();
		MemoryContextSwitchTo(oldcxt);
		*cache = fit;
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
		/* NOT NULL: the value is not NULL (the callers test NULL themselves) */
	}
	fit->nchecks = n;
	fit->compiled_for = (void *) fit->ref.constraints;
	MemoryContextSwitchTo(oldcxt);
	return fit;
}

bool
payidem_domain_fits(void **cache, MemoryContext mcxt, Oid typid, Datum value)
{
	DomainFit  *fit = domain_fit(cache, mcxt, typid);
	ExprContext *econtext = fit->econtext;
	bool		fits = true;
	int			i;

	econtext->domainValue_datum = value;
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
	return fits;
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

/*
 * payidem._fits(value text, domain regtype) RETURNS boolean, STABLE STRICT
 *		payidem_domain_fits() for SQL, kept per call site (fn_extra, freed
 *		with it).
 */
PG_FUNCTION_INFO_V1(payidem_fits);
Datum
payidem_fits(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(payidem_domain_fits(&fcinfo->flinfo->fn_extra, fcinfo->flinfo->fn_mcxt,
									   PG_GETARG_OID(1), PG_GETARG_DATUM(0)));
}

/*
 * A set-returning function's result in materialize mode, as
 * InitMaterializedSRF() sets it up, but with the row descriptor read from
 * the function's catalog entry once per session (*cache, kept in
 * TopMemoryContext, for the SQL function last called) rather than at every call, where working it out costs
 * about 18,000 instructions.  Every cache is forgotten when any function
 * changes (its OUT parameters may have).  The executor frees setDesc after
 * the call, so it gets a copy.
 */
#define RESULT_DESC_CACHES 4
static PayidemResultDesc *result_desc_caches[RESULT_DESC_CACHES];
static int	n_result_desc_caches = 0;

static void
forget_result_desc(PayidemResultDesc *cache)
{
	if (cache->desc != NULL)
		FreeTupleDesc(cache->desc);
	cache->desc = NULL;
	cache->fn_oid = InvalidOid;
}

static void
result_desc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	int			i;

	for (i = 0; i < n_result_desc_caches; i++)
		forget_result_desc(result_desc_caches[i]);
}

void
payidem_materialized_result(FunctionCallInfo fcinfo, PayidemResultDesc *cache)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext oldcxt;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (!(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("materialize mode required, but it is not allowed in this context")));
	/* (kept for the SQL function called: another may declare other columns) */
	if (cache->desc != NULL && cache->fn_oid != fcinfo->flinfo->fn_oid)
		forget_result_desc(cache);
	if (cache->desc == NULL)
	{
		TupleDesc	desc;
		int			i;

		for (i = 0; i < n_result_desc_caches; i++)
			if (result_desc_caches[i] == cache)
				break;
		if (i == n_result_desc_caches)
		{
			if (n_result_desc_caches >= RESULT_DESC_CACHES)
				elog(ERROR, "payidem: too many cached result descriptors");
			if (n_result_desc_caches == 0)
				payidem_register_syscache_callback(PROCOID, result_desc_callback, (Datum) 0);
			result_desc_caches[n_result_desc_caches++] = cache;
		}
		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		oldcxt = MemoryContextSwitchTo(TopMemoryContext);
		cache->desc = CreateTupleDescCopy(desc);
		cache->fn_oid = fcinfo->flinfo->fn_oid;
		MemoryContextSwitchTo(oldcxt);
	}
	oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	rsinfo->setDesc = CreateTupleDescCopy(cache->desc);
	rsinfo->setResult = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0,
											  false, work_mem);
	rsinfo->returnMode = SFRM_Materialize;
	MemoryContextSwitchTo(oldcxt);
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
 * Is this insert part of a restore?  A restore (pg_restore, psql -f of a
 * plain dump) loads each table with one top-level COPY ... FROM of that very
 * table (status_guard then neither refuses a row in a later status nor logs
 * it again; the journal's checks take the rows as they were dumped).  Only
 * for a role that could disable the table's triggers anyway — its owner, or a superuser — so nothing is
 * opened that was closed: an application's COPY or INSERT is refused as
 * before.  *copying says whether it is such a COPY at all (for the hint of
 * a refusal).
 */
bool
payidem_restoring(Relation rel, bool *copying)
{
	Portal		portal = ActivePortal;
	PlannedStmt *stmt;
	CopyStmt   *copy;

	*copying = false;
	if (portal == NULL || portal->commandTag != CMDTAG_COPY || list_length(portal->stmts) != 1)
		return false;
	stmt = linitial_node(PlannedStmt, portal->stmts);
	if (stmt->commandType != CMD_UTILITY || stmt->utilityStmt == NULL ||
		!IsA(stmt->utilityStmt, CopyStmt))
		return false;
	copy = (CopyStmt *) stmt->utilityStmt;
	if (!copy->is_from || copy->relation == NULL ||
		RangeVarGetRelid(copy->relation, NoLock, true) != RelationGetRelid(rel))
		return false;
	*copying = true;
	return has_privs_of_role(GetUserId(), rel->rd_rel->relowner);
}
