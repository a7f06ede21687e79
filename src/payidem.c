/*-------------------------------------------------------------------------
 *
 * payidem.c
 *		Module start-up: _PG_init calls each part's init and nothing else.
 *
 * Each part defines its own GUCs.  Shared memory (the order-number
 * generator, the counters of stats()) exists only when the library is listed
 * in shared_preload_libraries; loaded any other way, _PG_init defines the
 * GUCs and returns quietly, so CREATE EXTENSION, pg_dump and pg_upgrade still
 * work and the functions that need shared memory fail with 55000 and a hint.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "crypto.h"
#include "housekeeping.h"
#include "journal.h"
#include "order_no.h"
#include "payment_decision.h"
#include "recon.h"
#include "replication.h"
#include "shmem.h"

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
	journal_init();				/* its commit check, in every backend */
	housekeeping_init();		/* its GUCs; its launcher only when preloading */
	MarkGUCPrefixReserved("payidem");

	if (!process_shared_preload_libraries_in_progress)
		return;
	payidem_shmem_init(order_no_shmem_init);
}
