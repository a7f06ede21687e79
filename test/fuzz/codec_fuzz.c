/*
 * codec_fuzz.c — libFuzzer harness for the order-number codec.
 *
 * For arbitrary bytes: parsing never crashes or reads out of bounds; a number
 * that parses formats back to exactly the same characters; and parts built
 * from the bytes format to a number that parses back to the same parts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "order_no_codec.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	OrderNoParts p,
				q;
	char	   *copy;
	char		out[ORDER_NO_LEN];
	uint64_t	raw = 0;
	size_t		i;

	/* 1. parse arbitrary input (in its own allocation so ASan sees overreads) */
	copy = malloc(size ? size : 1);
	if (size)
		memcpy(copy, data, size);
	if (order_no_parse(copy, size, &p) == ORDER_NO_OK)
	{
		if (!order_no_format(out, &p) || memcmp(out, copy, ORDER_NO_LEN) != 0)
			abort();
	}
	(void) order_no_prefix_valid(copy, size);
	free(copy);

	/* 2. build parts from the bytes, format, parse back */
	if (size < 2)
		return 0;
	p.prefix[0] = (char) data[0];
	p.prefix[1] = (char) data[1];
	p.prefix[2] = '\0';
	for (i = 2; i < size && i < 10; i++)
		raw = raw << 8 | data[i];
	p.epoch = (int64_t) (raw % (uint64_t) (ORDER_NO_MAX_EPOCH + 2));
	p.shard = size > 10 ? data[10] : 0;
	p.seq = size > 13 ? (data[11] << 16 | data[12] << 8 | data[13]) : 0;
	if (order_no_format(out, &p))
	{
		if (order_no_parse(out, ORDER_NO_LEN, &q) != ORDER_NO_OK ||
			q.epoch != p.epoch || q.shard != p.shard || q.seq != p.seq ||
			memcmp(q.prefix, p.prefix, 3) != 0)
			abort();
	}
	return 0;
}
