/*-------------------------------------------------------------------------
 *
 * inval.c
 *		The invalidation dispatch: payidem's one relcache callback and one
 *		callback per syscache it watches, calling the parts' own.
 *
 * A backend has room for only a few relcache and syscache callbacks, shared
 * with every other extension (DESIGN §1), so payidem registers one of each
 * kind in all and each part's callback is called from there.  The parts
 * register on first use; registering the same function twice is a no-op.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/inval.h"

#include "inval.h"

#define PAYIDEM_MAX_CALLBACKS 12
#define PAYIDEM_MAX_SYSCACHES 10

typedef struct RelcacheEntry
{
	PayidemRelcacheCallback func;
	Datum		arg;
} RelcacheEntry;

typedef struct SyscacheEntry
{
	PayidemSyscacheCallback func;
	Datum		arg;
} SyscacheEntry;

static RelcacheEntry relcache_callbacks[PAYIDEM_MAX_CALLBACKS];
static int	n_relcache_callbacks = 0;

typedef struct SyscacheCallbacks
{
	int			cacheid;
	int			n;
	SyscacheEntry entries[PAYIDEM_MAX_CALLBACKS];
} SyscacheCallbacks;

static SyscacheCallbacks syscache_callbacks[PAYIDEM_MAX_SYSCACHES];
static int	n_syscaches = 0;

static void
dispatch_relcache(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < n_relcache_callbacks; i++)
		relcache_callbacks[i].func(relcache_callbacks[i].arg, relid);
}

static void
dispatch_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
	SyscacheCallbacks *sc = &syscache_callbacks[DatumGetInt32(arg)];
	int			i;

	for (i = 0; i < sc->n; i++)
		sc->entries[i].func(sc->entries[i].arg, cacheid, hashvalue);
}

void
payidem_register_relcache_callback(PayidemRelcacheCallback func, Datum arg)
{
	int			i;

	for (i = 0; i < n_relcache_callbacks; i++)
		if (relcache_callbacks[i].func == func && relcache_callbacks[i].arg == arg)
			return;
	if (n_relcache_callbacks >= PAYIDEM_MAX_CALLBACKS)
		elog(ERROR, "payidem: too many relcache callbacks");
	if (n_relcache_callbacks == 0)
		CacheRegisterRelcacheCallback(dispatch_relcache, (Datum) 0);
	relcache_callbacks[n_relcache_callbacks].func = func;
	relcache_callbacks[n_relcache_callbacks].arg = arg;
	n_relcache_callbacks++;
}

void
payidem_register_syscache_callback(int cacheid, PayidemSyscacheCallback func, Datum arg)
{
	SyscacheCallbacks *sc = NULL;
	int			i;

	for (i = 0; i < n_syscaches; i++)
		if (syscache_callbacks[i].cacheid == cacheid)
			sc = &syscache_callbacks[i];
	if (sc == NULL)
	{
		if (n_syscaches >= PAYIDEM_MAX_SYSCACHES)
			elog(ERROR, "payidem: too many syscaches watched");
		sc = &syscache_callbacks[n_syscaches];
		sc->cacheid = cacheid;
		sc->n = 0;
		CacheRegisterSyscacheCallback(cacheid, dispatch_syscache, Int32GetDatum(n_syscaches));
		n_syscaches++;
	}
	for (i = 0; i < sc->n; i++)
		if (sc->entries[i].func == func && sc->entries[i].arg == arg)
			return;
	if (sc->n >= PAYIDEM_MAX_CALLBACKS)
		elog(ERROR, "payidem: too many callbacks on syscache %d", cacheid);
	sc->entries[sc->n].func = func;
	sc->entries[sc->n].arg = arg;
	sc->n++;
}
