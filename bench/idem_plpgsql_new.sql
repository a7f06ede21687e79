\set n :n + 1
SELECT bench.select_then_insert('new:' || :client_id || ':' || :n, 'pay', 'PO' || :n, 'WXPAY_001', 100);
