-- bench/router.sh: the first delivery of a success callback for a pending
-- payment (a new one each transaction), through the router or direct.
SELECT nextval('bench_seq') AS i \gset
SELECT payidem.apply_payment_result(b.payment_no, 'callback', 'succeeded', 'T' || b.payment_no, 100)
  FROM bench_pay b WHERE b.id = :i;
