/*-------------------------------------------------------------------------
 *
 * recon.c
 *		Reconciliation and limit settings: payidem.bill_timezone,
 *		payidem.limit_timezone.
 *
 * Reconciliation itself is set-based SQL (payidem.reconcile() in the
 * install script).  The only C parts are the settings that say where a
 * channel's bill day, and the day of a daily limit, start and end: the
 * extension reserves the "payidem." prefix, so the settings must be defined
 * here for SET / ALTER DATABASE / postgresql.conf to accept them.  The check
 * hook refuses a value that is not a time zone PostgreSQL knows, so a typo
 * fails at SET time instead of in the middle of the nightly reconciliation.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "pgtime.h"
#include "utils/guc.h"

#include "errcodes.h"
#include "recon.h"

/* payidem.bill_timezone: the zone in which channels cut their bill days */
static char *payidem_bill_timezone = NULL;

/*
 * payidem.limit_timezone: the zone in which begin_payment() cuts the day of a
 * daily limit.  Superuser-only: a risk limit must not move with the caller's
 * session (bill_timezone is set per reconciliation job, by any user).
 */
static char *payidem_limit_timezone = NULL;

/*
 * check_bill_timezone
 *		Accept a time-zone name PostgreSQL can load (as AT TIME ZONE does,
 *		e.g. 'UTC', 'Asia/Shanghai'); refuse empty strings, unknown names and
 *		zones that use leap seconds.
 */
static bool
check_bill_timezone(char **newval, void **extra, GucSource source)
{
	pg_tz	   *tz;

	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errmsg("payidem.bill_timezone must not be empty");
		GUC_check_errhint("Use a time-zone name such as 'UTC' or 'Asia/Shanghai'.");
		return false;
	}
	tz = pg_tzset(*newval);
	if (tz == NULL)
	{
		GUC_check_errmsg("time zone \"%s\" not recognized", *newval);
		GUC_check_errhint("Use a name from pg_timezone_names, e.g. 'UTC' or 'Asia/Shanghai'.");
		return false;
	}
	if (!pg_tz_acceptable(tz))
	{
		GUC_check_errmsg("time zone \"%s\" appears to use leap seconds", *newval);
		GUC_check_errdetail("PostgreSQL does not support leap seconds.");
		return false;
	}
	return true;
}

/*
 * recon_define_gucs
 *		Called from _PG_init before MarkGUCPrefixReserved("payidem").
 */
void
recon_define_gucs(void)
{
	DefineCustomStringVariable("payidem.bill_timezone",
							   gettext_noop("Time zone in which channels cut their bill days (payidem.reconcile)."),
							   gettext_noop("A payment belongs to bill day D when its paid_at falls between midnight "
											"of D and midnight of D + 1 in this zone; Chinese channels use 'Asia/Shanghai'."),
							   &payidem_bill_timezone,
							   "UTC",
							   PGC_USERSET,
							   0,
							   check_bill_timezone, NULL, NULL);
	DefineCustomStringVariable("payidem.limit_timezone",
							   gettext_noop("Time zone in which the day of a daily limit starts (payidem.begin_payment)."),
							   gettext_noop("A merchant's daily limit on a channel counts the attempts created since "
											"midnight in this zone.  Only superusers can change it."),
							   &payidem_limit_timezone,
							   "UTC",
							   PGC_SUSET,
							   0,
							   check_bill_timezone, NULL, NULL);
}
