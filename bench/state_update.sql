-- pgbench: one order pending -> paid by a direct UPDATE (autocommit)
UPDATE payidem."order" SET status = 'paid', paid_at = now(), updated_at = now()
 WHERE order_no = (SELECT 'PO' || lpad(nextval('bench_seq')::text, 24, '0'));
