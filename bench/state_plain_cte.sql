-- pgbench: the same work as transit_order() done by a client in plain SQL,
-- no trigger: conditional UPDATE + status_log INSERT, one statement (one round trip)
WITH k AS (SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, nextval('bench_seq')::int) AS order_no),
     u AS (UPDATE payidem."order" o SET status = 'paid', paid_at = now(), updated_at = now()
             FROM k WHERE o.order_no = k.order_no AND o.status = 'pending'
           RETURNING o.order_no)
INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
SELECT 'order', order_no, 'pending', 'paid' FROM u;
