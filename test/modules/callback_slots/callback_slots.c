/*
 * callback_slots — a test module: how many cache-invalidation callback slots
 * a backend has left for other extensions.
 *
 * PostgreSQL gives each backend a fixed number of relcache and syscache
 * callback slots, shared by core and every loaded extension; a registration
 * past the last one is FATAL.  register_relcache_callbacks(n) and
 * register_syscache_callbacks(n) register n callbacks that do nothing, as
 * another extension would; test/t/005_callback_slots.pl finds the largest n
 * a backend survives after every part of payidem that caches has run.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/inval.h"
#include "utils/syscache.h"

PG_MODULE_MAGIC;

static void
noop_relcache(Datum arg, Oid relid)
{
}

static void
noop_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
}

PG_FUNCTION_INFO_V1(register_relcache_callbacks);
Datum
register_relcache_callbacks(PG_FUNCTION_ARGS)
{
	int32		n = PG_GETARG_INT32(0);
	int32		i;

	for (i = 0; i < n; i++)
		CacheRegisterRelcacheCallback(noop_relcache, (Datum) 0);
	PG_RETURN_INT32(n);
}

PG_FUNCTION_INFO_V1(register_syscache_callbacks);
Datum
register_syscache_callbacks(PG_FUNCTION_ARGS)
{
	int32		n = PG_GETARG_INT32(0);
	int32		i;

	for (i = 0; i < n; i++)
		CacheRegisterSyscacheCallback(TYPEOID, noop_syscache, (Datum) 0);
	PG_RETURN_INT32(n);
}
