\set r random(1, 100)
SELECT bench.deliver_payidem(:r <= :dup);
