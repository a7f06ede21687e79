\set n :n + 1
SELECT * FROM payidem.idem_claim('new:' || :client_id || ':' || :n, 'pay', 'PO' || :n, 'WXPAY_001', 100);
