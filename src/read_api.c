/*-------------------------------------------------------------------------
 *
 * read_api.c
 *		get_order(), find_order() and the lists (list_orders(),
 *		list_anomalies(), list_differences()): the read API of an application
 *		that has no table privileges (DESIGN §7).
 *
 * They are C only to know who calls: the role current at the call
 * (GetUserId(), which a SECURITY DEFINER wrapper sets to its owner, as it
 * does for a query of the table), and whether row-level security applies
 * to it.  What they answer is SQL (payidem._read_order(), payidem._<list>()),
 * run as the owner of payidem."order"; payidem._check_reader() decides who
 * reads what:
 *
 *   - a caller row-level security does not apply to (the tables' owner, a
 *     superuser, BYPASSRLS), or one without SELECT on "order" (an
 *     application role: grant_app grants functions only) that is mapped to
 *     no merchant, reads every merchant's rows;
 *   - a caller that reads a merchant's rows (mapped itself, or a member of
 *     a mapped role) is refused with 42501: the rest of the API acts for
 *     every merchant, so it would be scoped here and nowhere else
 *     (grant_app and map_merchant_role refuse to make such a role; a GRANT
 *     of membership made later, or a role 1.0 let be both, is caught here);
 *   - any other caller — a role given SELECT on the tables (an auditor, one
 *     whose mapping was removed) — reads exactly the orders its row-level
 *     security shows it (payidem._row_visible(), the policies' own rule):
 *     fail closed.
 *
 * An order the caller may not read is PI009, as one that does not exist.
 *
 * balance() is C for the same reason: it answers by who calls (a role
 * mapped to merchants sees its own only, DESIGN §11), and what it answers is
 * payidem._balance(), in SQL, run as the tables' owner — so the one grant of
 * balance() is all a caller needs (the internal function is granted to no
 * one).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rls.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"

#include "catalog.h"
#include "errcodes.h"
#include "util.h"

static SPIPlanPtr read_plan = NULL;

/*
 * Whether row-level security scopes what caller reads: it applies to it and
 * the caller may read "order" (a role without SELECT on it, an application
 * role, reads through the read API only, every merchant's rows).  The SQL
 * side (payidem._check_reader()) takes it from here, and scopes a role
 * mapped to a merchant whatever its SELECTs.
 */
static bool
caller_scoped(Oid caller)
{
	Oid			order_rel = payidem_relation(PAYIDEM_ORDER);

	return check_enable_rls(order_rel, caller, true) == RLS_ENABLED &&
		pg_class_aclcheck(order_rel, caller, ACL_SELECT) == ACLCHECK_OK;
}

static Datum
read_order(FunctionCallInfo fcinfo, Datum order_no, bool order_no_null,
		   Datum merchant_no, bool merchant_no_null, Datum out_trade_no, bool out_trade_no_null)
{
	Oid			caller = GetUserId();
	bool		scoped = caller_scoped(caller);
	PayidemAsOwner as_owner;
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	Oid			types[5] = {TEXTOID, TEXTOID, TEXTOID, REGROLEOID, BOOLOID};
	Datum		result;
	bool		isnull;

	values[0] = order_no;
	nulls[0] = order_no_null ? 'n' : ' ';
	values[1] = merchant_no;
	nulls[1] = merchant_no_null ? 'n' : ' ';
	values[2] = out_trade_no;
	nulls[2] = out_trade_no_null ? 'n' : ' ';
	values[3] = ObjectIdGetDatum(caller);
	values[4] = BoolGetDatum(scoped);

	payidem_become_owner(payidem_owner(PAYIDEM_ORDER), SECURITY_NOFORCE_RLS, &as_owner);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	payidem_saved_plan(&read_plan, "SELECT payidem._read_order($1, $2, $3, $4, $5)", 5, types);
	if (SPI_execute_plan(read_plan, values, nulls, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "payidem: the read of an order failed");
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	result = isnull ? (Datum) 0 : SPI_datumTransfer(result, false, -1);
	SPI_finish();
	payidem_become_caller(&as_owner);
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

/* payidem.get_order(order_no text) RETURNS jsonb */
PG_FUNCTION_INFO_V1(payidem_get_order);
Datum
payidem_get_order(PG_FUNCTION_ARGS)
{
	return read_order(fcinfo, PG_GETARG_DATUM(0), PG_ARGISNULL(0), (Datum) 0, true, (Datum) 0, true);
}

/*
 * payidem._jsonb_stored(value jsonb) RETURNS bytea
 *		A jsonb value in its stored form: the bytes of its binary format,
 *		the same in every major since 9.4.  The router asks a shard for
 *		get_order()'s document so, and takes it without parsing its text
 *		again (it checks the form: router.c).
 */
PG_FUNCTION_INFO_V1(payidem_jsonb_stored);
Datum
payidem_jsonb_stored(PG_FUNCTION_ARGS)
{
	PG_RETURN_BYTEA_P((bytea *) PG_DETOAST_DATUM(PG_GETARG_DATUM(0)));
}

/*
 * payidem.find_order(merchant_no text, out_trade_no text) RETURNS jsonb
 *		Both are needed: _read_order() takes NULL for both as get_order()'s
 *		call, so a NULL here is refused first, saying which.
 */
PG_FUNCTION_INFO_V1(payidem_find_order);
Datum
payidem_find_order(PG_FUNCTION_ARGS)
{
	int			i;

	for (i = 0; i < 2; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not be NULL", i == 0 ? "merchant_no" : "out_trade_no"),
					 errhint("Pass the %s.", i == 0 ? "merchant_no" : "out_trade_no")));
	return read_order(fcinfo, (Datum) 0, true, PG_GETARG_DATUM(0), PG_ARGISNULL(0),
					  PG_GETARG_DATUM(1), PG_ARGISNULL(1));
}

/*
 * payidem.balance(merchant_no text, currency text DEFAULT 'CNY')
 *		RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
 *		payidem._balance(merchant_no, currency, <the caller>) as the owner: its
 *		checks (22023, PI009 for a merchant the caller may not see) and its row.
 */
static SPIPlanPtr balance_plan = NULL;

PG_FUNCTION_INFO_V1(payidem_balance);
Datum
payidem_balance(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PayidemAsOwner as_owner;
	Datum		args[3];
	char		argnulls[3] = {' ', ' ', ' '};
	Oid			types[3] = {TEXTOID, TEXTOID, REGROLEOID};
	uint64		i;

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < 2; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		argnulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	args[2] = ObjectIdGetDatum(GetUserId());

	payidem_become_owner(payidem_owner(PAYIDEM_ORDER), SECURITY_NOFORCE_RLS, &as_owner);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	payidem_saved_plan(&balance_plan,
					   "SELECT b.pending, b.available, b.in_payout FROM payidem._balance($1, $2, $3) b",
					   3, types);
	if (SPI_execute_plan(balance_plan, args, argnulls, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "payidem: the read of a balance failed");
	/* (the tuplestore copies each row: it outlives the SPI connection) */
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[3];
		bool		nulls[3];
		int			j;

		for (j = 0; j < 3; j++)
			values[j] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, j + 1, &nulls[j]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	payidem_become_caller(&as_owner);
	return (Datum) 0;
}

/*
 * The lists of the read API (list_orders(), list_anomalies(),
 * list_differences(): SETOF jsonb): payidem._<name>(the arguments, the
 * caller, whether it is scoped) as the owner.  C for the reason get_order()
 * is: to know who calls.  One plan per list is kept for the session, by the
 * list's name: a list made again (DROP and CREATE EXTENSION, an update) has
 * a new oid, and its slot is prepared again.
 */
#define READ_LISTS 8
static struct
{
	char		name[NAMEDATALEN];
	Oid			fn;
	SPIPlanPtr	plan;
}			list_plans[READ_LISTS];

PG_FUNCTION_INFO_V1(payidem_read_for_caller);
Datum
payidem_read_for_caller(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			fn = fcinfo->flinfo->fn_oid;
	Oid			caller = GetUserId();
	int			nargs = PG_NARGS();
	PayidemAsOwner as_owner;
	Datum		args[FUNC_MAX_ARGS];
	char		argnulls[FUNC_MAX_ARGS];
	SPIPlanPtr *plan = NULL;
	char	   *name;
	uint64		i;
	int			k;

	if (nargs + 2 > FUNC_MAX_ARGS)
		elog(ERROR, "payidem: too many arguments for a read");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	for (k = 0; k < nargs; k++)
	{
		args[k] = PG_ARGISNULL(k) ? (Datum) 0 : PG_GETARG_DATUM(k);
		argnulls[k] = PG_ARGISNULL(k) ? 'n' : ' ';
	}
	args[nargs] = ObjectIdGetDatum(caller);
	argnulls[nargs] = ' ';
	args[nargs + 1] = BoolGetDatum(caller_scoped(caller));
	argnulls[nargs + 1] = ' ';

	name = get_func_name(fn);
	if (name == NULL)
		elog(ERROR, "payidem: function %u of a read does not exist", fn);
	for (k = 0; k < READ_LISTS && plan == NULL; k++)
		if (list_plans[k].name[0] == '\0' || strcmp(list_plans[k].name, name) == 0)
		{
			if (list_plans[k].fn != fn)
			{
				/* new, or made again: prepared below */
				if (list_plans[k].plan != NULL)
					SPI_freeplan(list_plans[k].plan);
				list_plans[k].plan = NULL;
				list_plans[k].fn = fn;
				strlcpy(list_plans[k].name, name, NAMEDATALEN);
			}
			plan = &list_plans[k].plan;
		}
	if (plan == NULL)
		elog(ERROR, "payidem: more than %d lists of the read API", READ_LISTS);

	payidem_become_owner(payidem_owner(PAYIDEM_ORDER), SECURITY_NOFORCE_RLS, &as_owner);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (*plan == NULL)
	{
		Oid		   *argtypes;
		int			declared;
		Oid			types[FUNC_MAX_ARGS];
		StringInfoData sql;

		get_func_signature(fn, &argtypes, &declared);
		initStringInfo(&sql);
		appendStringInfo(&sql, "SELECT r FROM payidem.%s(", quote_identifier(psprintf("_%s", name)));
		for (k = 0; k < nargs + 2; k++)
		{
			types[k] = k < nargs ? argtypes[k] : k == nargs ? REGROLEOID : BOOLOID;
			appendStringInfo(&sql, "%s$%d", k > 0 ? ", " : "", k + 1);
		}
		appendStringInfoString(&sql, ") r");
		payidem_saved_plan(plan, sql.data, nargs + 2, types);
	}
	if (SPI_execute_plan(*plan, args, argnulls, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "payidem: a read of the read API failed");
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		value;
		bool		isnull;

		value = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &isnull);
	}
	SPI_finish();
	payidem_become_caller(&as_owner);
	return (Datum) 0;
}
