-- bench/router.sh: a repeated success callback (already applied: 'duplicate').
\set i random(1, 1000)
SELECT payidem.apply_payment_result(b.payment_no, 'callback', 'succeeded', 'T' || b.payment_no, 100)
  FROM bench_pay b WHERE b.id = :i;
