-- pgbench: one order pending -> paid by a direct UPDATE (autocommit)
UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now()
 WHERE order_no = (SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, nextval('bench_seq')::int));
