/*-------------------------------------------------------------------------
 *
 * order_no_codec.h
 *		Pure-C codec of payidem order numbers: format, ISO 7064 MOD 97-10
 *		check digits, parse.  No PostgreSQL headers, so it can be unit-tested
 *		and fuzzed on its own (test/fuzz).
 *
 * An order number is 26 characters of [A-Z0-9]:
 *
 *		PP YYYYMMDDHHMMSS SS NNNNNN CC
 *		prefix(2) time(14, UTC) shard(2) seq(6) check(2)
 *
 * The check digits make the whole string, letters mapped A=10 ... Z=35 and
 * read as one decimal number, congruent to 1 modulo 97 (as in an IBAN).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_ORDER_NO_CODEC_H
#define PAYIDEM_ORDER_NO_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORDER_NO_LEN		26
#define ORDER_NO_SEQ_MAX	999999
#define ORDER_NO_SHARD_MAX	99

/* Range of seconds the 14-digit time part can hold: 1970-01-01 .. 9999-12-31. */
#define ORDER_NO_MIN_EPOCH	INT64_C(0)
#define ORDER_NO_MAX_EPOCH	INT64_C(253402300799)

typedef struct OrderNoParts
{
	char		prefix[3];		/* two characters + NUL */
	int64_t		epoch;			/* UTC seconds since 1970-01-01 */
	int			shard;			/* 0 .. 99 */
	int			seq;			/* 0 .. 999999 */
} OrderNoParts;

typedef enum OrderNoError
{
	ORDER_NO_OK = 0,
	ORDER_NO_BAD_LENGTH,		/* not 26 characters */
	ORDER_NO_BAD_CHARACTER,		/* outside [A-Z0-9], or a letter where a digit belongs */
	ORDER_NO_BAD_TIME,			/* no such date or time of day */
	ORDER_NO_BAD_CHECK			/* check digits do not match */
} OrderNoError;

/* true if p[0..1] is a valid prefix ([A-Z0-9]{2}) and len == 2 */
extern bool order_no_prefix_valid(const char *p, size_t len);

/*
 * Write the 26 characters (no NUL) of the number for the given parts into out.
 * Returns false, writing nothing, if a part is out of range.
 */
extern bool order_no_format(char *out, const OrderNoParts *parts);

/* Parse s[0..len-1]; fills *parts on ORDER_NO_OK. Never reads past len. */
extern OrderNoError order_no_parse(const char *s, size_t len, OrderNoParts *parts);

/* A sentence describing an error, for messages. */
extern const char *order_no_error_text(OrderNoError err);

/* Two check digits (0..98) for the first 24 characters, which must be [A-Z0-9]. */
extern int	order_no_check_value(const char *s24);

/* Civil date/time <-> epoch seconds (proleptic Gregorian, UTC). */
extern int64_t order_no_epoch_from_civil(int year, int month, int day,
										 int hour, int minute, int second);
extern void order_no_civil_from_epoch(int64_t epoch, int *year, int *month, int *day,
									  int *hour, int *minute, int *second);

#endif							/* PAYIDEM_ORDER_NO_CODEC_H */
