-- bench/lists.sh's data set: merchant M900000000000001 with :n orders, one
-- every 20 ms from 2026-01-01 (UTC), and merchant M900000000000002 with a
-- tenth as many in the same index; four in five closed, the rest pending;
-- numbers in the order they are made (order_no_make: one second, 50 numbers).
-- Written directly (the triggers off, as a restore loads rows).
\set ON_ERROR_STOP 1
SET session_replication_role = replica;
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M900000000000001', 'bench lists 1', 'retail', 0.006, 'benchlistkey0000000000001'),
	   ('M900000000000002', 'bench lists 2', 'retail', 0.006, 'benchlistkey0000000000002');
INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, closed_at,
							 expire_at, created_at)
SELECT payidem.order_no_make('PO', g.t, 0, g.i % 50), g.m, 'L-' || g.i, 'bench', 1000 + g.i % 9000,
	   CASE WHEN g.i % 5 = 0 THEN 'pending' ELSE 'closed' END,
	   CASE WHEN g.i % 5 <> 0 THEN g.t + interval '2 hours' END, g.t + interval '2 hours', g.t
  FROM (SELECT i, CASE WHEN i % 11 = 10 THEN 'M900000000000002' ELSE 'M900000000000001' END AS m,
			   timestamptz '2026-01-01 00:00:00+00' + (i / 50) * interval '1 second' AS t
		  FROM generate_series(0, (:n * 11) / 10 - 1) i) g;
RESET session_replication_role;
VACUUM ANALYZE payidem."order";
