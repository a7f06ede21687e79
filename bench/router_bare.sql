-- bench/router.sh: a first success callback, as router_first.sql, through
-- bench_apply(): on the router the bare PL/Proxy function
-- (payidem._proxy_apply_payment_result: no error wrapper, no transaction
-- placement), on the shard payidem.apply_payment_result itself.
SELECT nextval('bench_seq') AS i \gset
SELECT bench_apply(b.payment_no, 'callback', 'succeeded', 'T' || b.payment_no, 100)
  FROM bench_pay b WHERE b.id = :i;
