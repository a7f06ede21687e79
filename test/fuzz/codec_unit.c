/*
 * codec_unit.c — unit test of the order-number codec (src/order_no_codec.c).
 *
 * Known vectors (check digits computed independently with arbitrary-precision
 * arithmetic), round trips, the date/time rules, and the detection promise of
 * the check digits: every single-character change and every swap of two
 * adjacent different characters of a valid number is refused.
 * Prints TAP ("ok N - ...") and exits non-zero on any failure.
 */
#include <stdio.h>
#include <string.h>

#include "order_no_codec.h"

static int	tests = 0;
static int	failures = 0;

static void
check(int cond, const char *what)
{
	tests++;
	if (!cond)
		failures++;
	printf("%s %d - %s\n", cond ? "ok" : "not ok", tests, what);
}

static int
valid(const char *s)
{
	OrderNoParts p;

	return order_no_parse(s, strlen(s), &p) == ORDER_NO_OK;
}

static void
test_vectors(void)
{
	static const char *good[] = {
		"PO202611292100000000000062",
		"PY197001010000000000000058",
		"RF999912312359599999999966",
		"A9202402290000000100000030",	/* 2024-02-29 exists */
	};
	OrderNoParts p;
	char		buf[ORDER_NO_LEN + 1];
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++)
	{
		check(order_no_parse(good[i], ORDER_NO_LEN, &p) == ORDER_NO_OK, good[i]);
		memset(buf, 0, sizeof(buf));
		check(order_no_format(buf, &p) && strcmp(buf, good[i]) == 0,
			  "parse then format gives the same characters");
	}

	order_no_parse("PO202611292100000000000062", ORDER_NO_LEN, &p);
	check(strcmp(p.prefix, "PO") == 0 && p.shard == 0 && p.seq == 0 &&
		  p.epoch == INT64_C(1795986000), "parts of PO2026112921000000000000");
	order_no_parse("RF999912312359599999999966", ORDER_NO_LEN, &p);
	check(p.epoch == ORDER_NO_MAX_EPOCH && p.shard == 99 && p.seq == 999999,
		  "largest time, shard and seq");

	check(order_no_parse("PO20261129210000000000006", 25, &p) == ORDER_NO_BAD_LENGTH, "25 chars");
	check(order_no_parse("PO2026112921000000000000620", 27, &p) == ORDER_NO_BAD_LENGTH, "27 chars");
	check(order_no_parse("", 0, &p) == ORDER_NO_BAD_LENGTH, "empty");
	check(order_no_parse("po202611292100000000000062", 26, &p) == ORDER_NO_BAD_CHARACTER, "lower-case prefix");
	check(order_no_parse("PO2026112921000000000000A2", 26, &p) == ORDER_NO_BAD_CHARACTER, "letter in check digits");
	check(order_no_parse("PO202302290000000000000000", 26, &p) == ORDER_NO_BAD_TIME, "2023-02-29 does not exist");
	check(order_no_parse("PO202611292400000000000000", 26, &p) == ORDER_NO_BAD_TIME, "hour 24");
	check(order_no_parse("PO196912312359590000000000", 26, &p) == ORDER_NO_BAD_TIME, "before 1970");
	check(order_no_parse("PO202611292100000000000063", 26, &p) == ORDER_NO_BAD_CHECK, "wrong check digits");
	check(order_no_parse("PO202611292100000000005397", 26, &p) == ORDER_NO_OK &&
		  order_no_parse("PO202611292100000000005300", 26, &p) == ORDER_NO_BAD_CHECK,
		  "check digits are canonical: 97 valid, 00 (also 1 mod 97) refused");
	check(order_no_parse("PO2026112921000000000000\0" "62", 26, &p) == ORDER_NO_BAD_CHARACTER, "embedded NUL");

	check(order_no_prefix_valid("PO", 2) && order_no_prefix_valid("9Z", 2), "prefixes PO, 9Z");
	check(!order_no_prefix_valid("po", 2) && !order_no_prefix_valid("P-", 2) &&
		  !order_no_prefix_valid("P", 1) && !order_no_prefix_valid("POX", 3) &&
		  !order_no_prefix_valid("", 0), "prefixes po, P-, P, POX, empty refused");

	memset(&p, 0, sizeof(p));
	memcpy(p.prefix, "PO", 3);
	p.seq = ORDER_NO_SEQ_MAX + 1;
	check(!order_no_format(buf, &p), "format refuses seq 1000000");
	p.seq = 0;
	p.shard = 100;
	check(!order_no_format(buf, &p), "format refuses shard 100");
	p.shard = 0;
	p.epoch = -1;
	check(!order_no_format(buf, &p), "format refuses time before 1970");
}

/* every single-character change and adjacent swap of a valid number is refused */
static void
test_detection(const char *number)
{
	static const char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
	char		s[ORDER_NO_LEN + 1];
	int			i;
	int			missed = 0;
	char		what[128];

	for (i = 0; i < ORDER_NO_LEN; i++)
	{
		const char *a;

		for (a = alphabet; *a; a++)
		{
			if (*a == number[i])
				continue;
			strcpy(s, number);
			s[i] = *a;
			if (valid(s))
			{
				printf("# undetected change: %s\n", s);
				missed++;
			}
		}
		if (i + 1 < ORDER_NO_LEN && number[i] != number[i + 1])
		{
			strcpy(s, number);
			s[i] = number[i + 1];
			s[i + 1] = number[i];
			if (valid(s))
			{
				printf("# undetected swap: %s\n", s);
				missed++;
			}
		}
	}
	snprintf(what, sizeof(what), "every single change and adjacent swap of %s is detected", number);
	check(missed == 0, what);
}

static void
test_round_trips(void)
{
	OrderNoParts p,
				q;
	char		buf[ORDER_NO_LEN + 1] = {0};
	int64_t		t;
	int			bad = 0;
	int			y,
				mo,
				d,
				h,
				mi,
				s;

	memcpy(p.prefix, "PO", 3);
	p.shard = 7;
	p.seq = 123456;
	/* every day from 1970 to 9999, at a varying time of day */
	for (t = 0; t <= ORDER_NO_MAX_EPOCH; t += 86400 + 3607)
	{
		p.epoch = t;
		if (!order_no_format(buf, &p) || order_no_parse(buf, ORDER_NO_LEN, &q) != ORDER_NO_OK ||
			q.epoch != t || q.shard != 7 || q.seq != 123456)
			bad++;
	}
	check(bad == 0, "format -> parse round trip from 1970 to 9999");

	order_no_civil_from_epoch(INT64_C(951782400), &y, &mo, &d, &h, &mi, &s);
	check(y == 2000 && mo == 2 && d == 29 && h == 0 && mi == 0 && s == 0, "2000-02-29 (leap century)");
	check(order_no_epoch_from_civil(2100, 3, 1, 0, 0, 0) - order_no_epoch_from_civil(2100, 2, 28, 0, 0, 0) == 86400,
		  "2100 is not a leap year");
}

int
main(void)
{
	test_vectors();
	test_detection("PO202611292100000000000062");
	test_detection("PY197001010000000000000058");
	test_detection("RF999912312359599999999966");
	test_detection("A9202402290000000100000030");
	test_round_trips();
	printf("1..%d\n", tests);
	return failures ? 1 : 0;
}
