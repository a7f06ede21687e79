-- bench/router.sh: run on a shard: :n pending payments of merchant :'merchant'
-- on channel BENCH_WX, orders BENCH-<tag>-<i>, for 100 each.  The rows
-- create_order() and begin_payment() would make, inserted in one statement
-- (the state-machine triggers check and log them as usual); the order and
-- payment numbers are the shard's (gen_order_no()).
WITH o AS (
	INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
	SELECT payidem.gen_order_no('PO'), :'merchant', 'BENCH-' || :'tag' || '-' || i, 'bench', 100, now() + interval '1 day'
	  FROM generate_series(1, :n) i
	RETURNING order_no, merchant_no, amount)
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
SELECT payidem.gen_order_no('PY'), order_no, merchant_no, 'BENCH_WX', amount FROM o;
