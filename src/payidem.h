/*-------------------------------------------------------------------------
 *
 * payidem.h
 *		Declarations shared between payidem's C files.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_H
#define PAYIDEM_H

#include "errcodes.h"

#endif							/* PAYIDEM_H */
