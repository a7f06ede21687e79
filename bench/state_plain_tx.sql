-- pgbench: the same work in plain SQL as an application usually sends it:
-- BEGIN; conditional UPDATE; status_log INSERT; COMMIT (four round trips)
SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, nextval('bench_seq')::int) AS k \gset
BEGIN;
UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now()
 WHERE order_no = :k AND status = 'pending';
INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
VALUES ('order', :k, 'pending', 'paid');
COMMIT;
