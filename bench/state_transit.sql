-- pgbench: one order pending -> paid through transit_order() (C trigger logs it)
SELECT payidem.transit_order('PO' || lpad(nextval('bench_seq')::text, 24, '0'), 'paid');
