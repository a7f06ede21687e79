-- bench/router.sh: the hop alone: order_no_valid() of a payment number, a
-- pure function (on the router: RUN ON ANY, through its wrapper), so that
-- what the router adds is the routing, the second backend and the round
-- trip, not a shard's work.
\set i random(1, 1000)
SELECT payidem.order_no_valid(b.payment_no) FROM bench_pay b WHERE b.id = :i;
