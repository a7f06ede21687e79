/*
 * housekeeping.c
 *		The housekeeping background worker (DESIGN §7): not yet registered.
 */
#include "postgres.h"

#include "payidem.h"

void
housekeeping_init(void)
{
}
