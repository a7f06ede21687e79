\set r random(1, 100)
SELECT bench.deliver_ref_same(:r <= :dup);
