\set k random(1, 1000)
SELECT bench.select_then_insert('dup:' || :k, 'pay', 'PO' || :k, 'WXPAY_001', 100);
