/*-------------------------------------------------------------------------
 *
 * replication.h
 *		The replication guarantees: synchronous standbys, promotion (replication.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_REPLICATION_H
#define PAYIDEM_REPLICATION_H

#include "access/xlogdefs.h"

extern int	payidem_promotion_gap;
extern void replication_define_gucs(void);
extern void payidem_require_replication(const char *what);
extern void payidem_wait_for_synchronous_standbys(XLogRecPtr lsn);

#endif							/* PAYIDEM_REPLICATION_H */
