\set r random(1, 100)
INSERT INTO bench.ceiling (v) VALUES (:r);
