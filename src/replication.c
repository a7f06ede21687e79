/*-------------------------------------------------------------------------
 *
 * replication.c
 *		What payidem knows of streaming replication (DESIGN §3.5, §12): the
 *		wait for the synchronous standbys before an order-number reservation
 *		is used, the settings payidem.require_synchronous_standby and
 *		payidem.promotion_gap, and payidem.replication_mode().
 *
 * A reservation (order_no.c) is WAL-logged by setval() outside any commit,
 * and numbers under it are handed out at once, also by sessions whose own
 * transaction writes nothing: the commit-time wait of synchronous
 * replication never covers them.  So the reserving backend waits itself,
 * with the server's own queue (SyncRepWaitForLSN), for the synchronous
 * standbys to have flushed the reservation's WAL; a promoted standby then
 * always holds every reservation a number was drawn from.
 *
 * The wait does not depend on the reserving session's synchronous_commit
 * (a reservation serves every session).  SyncRepWaitForLSN() cannot raise
 * an error: a query cancel or a terminate only ends the wait with a WARNING
 * (whose DETAIL, written for a commit, says the transaction committed
 * locally).  After it returns, the position the
 * synchronous standbys confirmed is read (WalSndCtl, under SyncRepLock) and
 * a reservation they do not hold yet is refused, so no number is drawn from
 * it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/tuplestore.h"

#include "errcodes.h"
#include "replication.h"

/* payidem.require_synchronous_standby: refuse writes without sync replication */
static bool payidem_require_sync_standby = false;

/* payidem.promotion_gap (seconds): how far a promoted server's numbers jump */
int			payidem_promotion_gap = 60;

void
replication_define_gucs(void)
{
	DefineCustomBoolVariable("payidem.require_synchronous_standby",
							 gettext_noop("Refuse payidem's writes while no synchronous standby is configured."),
							 gettext_noop("With it on, numbers, event ids, idempotency claims, payment results and "
										  "status changes fail with 55000 unless synchronous_standby_names is set "
										  "and synchronous_commit is on or remote_apply."),
							 &payidem_require_sync_standby,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("payidem.promotion_gap",
							gettext_noop("How far ahead of the clock and the stored mark a promoted server's order numbers and event ids start."),
							gettext_noop("Numbers stay unique after an asynchronous failover while the hosts' clocks differ by less than this."),
							&payidem_promotion_gap,
							60, 0, 86400,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

/*
 * Are synchronous standbys configured for the server (named, and WAL
 * senders allowed)?  synchronous_standby_names is set for the whole server
 * (postgresql.conf), never per session.
 */
static bool
standbys_defined(void)
{
	return SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0' && max_wal_senders > 0;
}

/*
 * Is synchronous replication in force for this session's commits: standbys
 * configured and synchronous_commit on or remote_apply (remote_write confirms
 * a write, not a flush, that a standby's crash can lose)?
 */
static bool
synchronous_configured(void)
{
	return standbys_defined() && synchronous_commit >= SYNCHRONOUS_COMMIT_REMOTE_FLUSH;
}

/*
 * Refuse a write when payidem.require_synchronous_standby is on and no
 * synchronous standby is configured.  One test of a boolean otherwise.
 */
void
payidem_require_replication(const char *what)
{
	if (likely(!payidem_require_sync_standby) || synchronous_configured())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s needs a synchronous standby", what),
			 errdetail("payidem.require_synchronous_standby is on, but synchronous_standby_names is \"%s\" and synchronous_commit is %s.",
					   SyncRepStandbyNames ? SyncRepStandbyNames : "",
					   GetConfigOption("synchronous_commit", false, false)),
			 errhint("Set synchronous_standby_names and synchronous_commit = on (or remote_apply), "
					 "or turn payidem.require_synchronous_standby off.")));
}

/*
 * Wait until the synchronous standbys have flushed WAL up to lsn (a
 * reservation's).  Returns at once when the server has no synchronous
 * standbys.  The session's own synchronous_commit does not matter: a
 * reservation serves every session, and one made by a session running with
 * synchronous_commit = off (a batch job, a role's setting) must be on the
 * standbys before the others draw from it; so the wait runs with
 * synchronous_commit = on for its duration (a GUC nest level, undone after
 * it or by the transaction's abort).  An error if the wait ended without
 * their confirmation (a cancel, the standbys dropped from the configuration
 * meanwhile): the caller must not use what the WAL holds.
 */
void
payidem_wait_for_synchronous_standbys(XLogRecPtr lsn)
{
	XLogRecPtr	confirmed;
	int			nest = -1;

	if (!standbys_defined())
		return;
	if (synchronous_commit < SYNCHRONOUS_COMMIT_REMOTE_FLUSH)
	{
		nest = NewGUCNestLevel();
		(void) set_config_option("synchronous_commit", "on", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	/*
	 * commit = false: their flush is waited for (a promotion replays it), not
	 * their apply.  Interrupts are held, as at a commit: the wait itself
	 * watches for a cancel or a terminate and ends on either.
	 */
	HOLD_INTERRUPTS();
	SyncRepWaitForLSN(lsn, false);
	RESUME_INTERRUPTS();
	if (nest >= 0)
		AtEOXact_GUC(true, nest);
	/* a terminate request ended the wait: leave now */
	CHECK_FOR_INTERRUPTS();

	LWLockAcquire(SyncRepLock, LW_SHARED);
	confirmed = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH];
	LWLockRelease(SyncRepLock);
	if (confirmed >= lsn || !standbys_defined())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("canceled the wait for synchronous standbys to record an order-number reservation"),
			 errdetail("The reservation up to %X/%X is not confirmed by the synchronous standbys; no number is issued from it.",
					   LSN_FORMAT_ARGS(lsn)),
			 errhint("Retry; numbers are issued once the synchronous standbys have the reservation.")));
}

/*
 * payidem.replication_mode()
 *		RETURNS TABLE(mode text, synchronous_standby_names text,
 *					  synchronous_commit text, require_synchronous_standby boolean,
 *					  writes_allowed boolean, timeline integer)
 *		mode: 'standby' (in recovery), 'synchronous' (standbys named and
 *		synchronous_commit on or remote_apply: every acknowledged commit and
 *		every order-number reservation is on them), 'asynchronous'.  For
 *		monitoring; as this session sees the settings.
 */
PG_FUNCTION_INFO_V1(payidem_replication_mode);
Datum
payidem_replication_mode(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		standby = RecoveryInProgress();
	bool		sync = synchronous_configured();
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, false, false};

	InitMaterializedSRF(fcinfo, 0);
	values[0] = CStringGetTextDatum(standby ? "standby" : sync ? "synchronous" : "asynchronous");
	values[1] = CStringGetTextDatum(SyncRepStandbyNames ? SyncRepStandbyNames : "");
	values[2] = CStringGetTextDatum(GetConfigOption("synchronous_commit", false, false));
	values[3] = BoolGetDatum(payidem_require_sync_standby);
	values[4] = BoolGetDatum(!standby && (sync || !payidem_require_sync_standby));
	if (standby)
		nulls[5] = true;
	else
		values[5] = Int32GetDatum((int32) GetWALInsertionTimeLine());
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}
