-- pgbench: one order pending -> paid through transit_order() (C trigger logs it)
SELECT payidem.transit_order(payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 0, nextval('bench_seq')::int), 'paid');
