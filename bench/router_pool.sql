-- bench/router.sh: run on a shard: :n pending payments of merchant :'m' on
-- channel BENCH_WX, orders BENCH-<tag>-<i>.
DO $$
DECLARE
	m text := current_setting('bench.merchant');
	tag text := current_setting('bench.tag');
BEGIN
	FOR i IN 1 .. current_setting('bench.n')::int LOOP
		PERFORM payidem.begin_payment(
			payidem.create_order(m, 'BENCH-' || tag || '-' || i, 100, 'bench', NULL, NULL, '1 day'), 'BENCH_WX');
	END LOOP;
END
$$;
