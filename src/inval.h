/*-------------------------------------------------------------------------
 *
 * inval.h
 *		The one relcache callback and one callback per syscache (inval.c),
 *		dispatching to the parts' callbacks.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_INVAL_H
#define PAYIDEM_INVAL_H

typedef void (*PayidemRelcacheCallback) (Datum arg, Oid relid);
typedef void (*PayidemSyscacheCallback) (Datum arg, int cacheid, uint32 hashvalue);
extern void payidem_register_relcache_callback(PayidemRelcacheCallback func, Datum arg);
extern void payidem_register_syscache_callback(int cacheid, PayidemSyscacheCallback func, Datum arg);

#endif							/* PAYIDEM_INVAL_H */
