/*-------------------------------------------------------------------------
 *
 * order_no_codec.c
 *		Format, check digits and parse of payidem order numbers.
 *
 * Pure C with no PostgreSQL headers and no allocation: every function works
 * on caller-provided buffers and never reads past the length it is given, so
 * the file is unit-tested and fuzzed alone (test/fuzz).  See order_no_codec.h
 * for the layout.
 *
 *-------------------------------------------------------------------------
 */
#include "order_no_codec.h"

/* offsets of the parts inside the 26 characters */
#define OFF_PREFIX	0
#define OFF_TIME	2
#define OFF_SHARD	16
#define OFF_SEQ		18
#define OFF_CHECK	24

static inline bool
is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static inline bool
is_upper(char c)
{
	return c >= 'A' && c <= 'Z';
}

/*
 * Fold one character into a running remainder modulo 97: a digit appends
 * one decimal digit, a letter A..Z appends the two digits 10..35.
 */
static inline int
mod97_step(int rem, char c)
{
	if (is_digit(c))
		return (rem * 10 + (c - '0')) % 97;
	return (rem * 100 + (c - 'A' + 10)) % 97;
}

bool
order_no_prefix_valid(const char *p, size_t len)
{
	return len == 2 &&
		(is_digit(p[0]) || is_upper(p[0])) &&
		(is_digit(p[1]) || is_upper(p[1]));
}

int
order_no_check_value(const char *s24)
{
	int			rem = 0;
	int			i;

	for (i = 0; i < OFF_CHECK; i++)
		rem = mod97_step(rem, s24[i]);
	/* append "00", then choose the digits that bring the total to 1 mod 97 */
	rem = (rem * 100) % 97;
	return 98 - rem;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's method). */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
	int64_t		era;
	int64_t		yoe;
	int64_t		doy;
	int64_t		doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

int64_t
order_no_epoch_from_civil(int year, int month, int day,
						  int hour, int minute, int second)
{
	return days_from_civil(year, month, day) * 86400 +
		hour * 3600 + minute * 60 + second;
}

void
order_no_civil_from_epoch(int64_t epoch, int *year, int *month, int *day,
						  int *hour, int *minute, int *second)
{
	int64_t		days = epoch / 86400;
	int64_t		secs = epoch % 86400;
	int64_t		era;
	int64_t		doe;
	int64_t		yoe;
	int64_t		doy;
	int64_t		mp;
	int64_t		y;

	if (secs < 0)
	{
		secs += 86400;
		days -= 1;
	}
	days += 719468;
	era = (days >= 0 ? days : days - 146096) / 146097;
	doe = days - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	y = yoe + era * 400;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	*day = (int) (doy - (153 * mp + 2) / 5 + 1);
	*month = (int) (mp < 10 ? mp + 3 : mp - 9);
	*year = (int) (y + (*month <= 2));
	*hour = (int) (secs / 3600);
	*minute = (int) (secs / 60 % 60);
	*second = (int) (secs % 60);
}

static bool
is_leap(int y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int
days_in_month(int y, int m)
{
	static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

	return (m == 2 && is_leap(y)) ? 29 : days[m - 1];
}

/* write v as exactly n decimal digits (v must fit) */
static void
put_digits(char *out, int64_t v, int n)
{
	while (n-- > 0)
	{
		out[n] = (char) ('0' + v % 10);
		v /= 10;
	}
}

/* read n decimal digits; caller has checked they are digits */
static int
get_digits(const char *s, int n)
{
	int			v = 0;

	while (n-- > 0)
		v = v * 10 + (*s++ - '0');
	return v;
}

bool
order_no_format(char *out, const OrderNoParts *parts)
{
	int			y,
				mo,
				d,
				h,
				mi,
				s;

	if (!order_no_prefix_valid(parts->prefix, 2) ||
		parts->epoch < ORDER_NO_MIN_EPOCH || parts->epoch > ORDER_NO_MAX_EPOCH ||
		parts->shard < 0 || parts->shard > ORDER_NO_SHARD_MAX ||
		parts->seq < 0 || parts->seq > ORDER_NO_SEQ_MAX)
		return false;

	order_no_civil_from_epoch(parts->epoch, &y, &mo, &d, &h, &mi, &s);
	out[OFF_PREFIX] = parts->prefix[0];
	out[OFF_PREFIX + 1] = parts->prefix[1];
	put_digits(out + OFF_TIME, y, 4);
	put_digits(out + OFF_TIME + 4, mo, 2);
	put_digits(out + OFF_TIME + 6, d, 2);
	put_digits(out + OFF_TIME + 8, h, 2);
	put_digits(out + OFF_TIME + 10, mi, 2);
	put_digits(out + OFF_TIME + 12, s, 2);
	put_digits(out + OFF_SHARD, parts->shard, 2);
	put_digits(out + OFF_SEQ, parts->seq, 6);
	put_digits(out + OFF_CHECK, order_no_check_value(out), 2);
	return true;
}

OrderNoError
order_no_parse(const char *s, size_t len, OrderNoParts *parts)
{
	int			i;
	int			y,
				mo,
				d,
				h,
				mi,
				sec;

	if (len != ORDER_NO_LEN)
		return ORDER_NO_BAD_LENGTH;
	if (!order_no_prefix_valid(s, 2))
		return ORDER_NO_BAD_CHARACTER;
	for (i = OFF_TIME; i < ORDER_NO_LEN; i++)
		if (!is_digit(s[i]))
			return ORDER_NO_BAD_CHARACTER;

	y = get_digits(s + OFF_TIME, 4);
	mo = get_digits(s + OFF_TIME + 4, 2);
	d = get_digits(s + OFF_TIME + 6, 2);
	h = get_digits(s + OFF_TIME + 8, 2);
	mi = get_digits(s + OFF_TIME + 10, 2);
	sec = get_digits(s + OFF_TIME + 12, 2);
	if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) ||
		h > 23 || mi > 59 || sec > 59)
		return ORDER_NO_BAD_TIME;

	/*
	 * Compare with the canonical check digits (02..98) rather than only
	 * testing "== 1 mod 97": 00 and 01 would satisfy that too for some
	 * numbers, and then two spellings of one number would both pass.
	 */
	if (get_digits(s + OFF_CHECK, 2) != order_no_check_value(s))
		return ORDER_NO_BAD_CHECK;

	parts->prefix[0] = s[0];
	parts->prefix[1] = s[1];
	parts->prefix[2] = '\0';
	parts->epoch = order_no_epoch_from_civil(y, mo, d, h, mi, sec);
	parts->shard = get_digits(s + OFF_SHARD, 2);
	parts->seq = get_digits(s + OFF_SEQ, 6);
	return ORDER_NO_OK;
}

const char *
order_no_error_text(OrderNoError err)
{
	switch (err)
	{
		case ORDER_NO_OK:
			return "The order number is valid.";
		case ORDER_NO_BAD_LENGTH:
			return "An order number has exactly 26 characters.";
		case ORDER_NO_BAD_CHARACTER:
			return "An order number is a 2-character prefix of [A-Z0-9] followed by 24 digits.";
		case ORDER_NO_BAD_TIME:
			return "Its time part YYYYMMDDHHMMSS is not a valid UTC date and time.";
		case ORDER_NO_BAD_CHECK:
			return "Its check digits do not match (ISO 7064 MOD 97-10).";
	}
	return "Unknown error.";
}
