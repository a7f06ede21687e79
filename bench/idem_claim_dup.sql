\set k random(1, 1000)
SELECT * FROM payidem.idem_claim('dup:' || :k, 'pay', 'PO' || :k, 'WXPAY_001', 100);
