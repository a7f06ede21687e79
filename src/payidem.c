/*-------------------------------------------------------------------------
 *
 * payidem.c
 *		Module entry point: _PG_init and the extension's GUCs.
 *
 * Each part of payidem (order numbers, idempotency, state machines, ...)
 * contributes its own init function, called from here.  Everything that needs
 * shared memory works only when the library is listed in
 * shared_preload_libraries; loaded any other way, _PG_init defines the GUCs
 * and returns quietly, so CREATE EXTENSION, pg_dump and pg_upgrade still work.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "payidem.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * _PG_init
 *		Define GUCs and reserve the "payidem." prefix so that a misspelt
 *		setting is reported instead of silently ignored.
 */
void
_PG_init(void)
{
	MarkGUCPrefixReserved("payidem");
}
