\set k random(1, 1000)
INSERT INTO payidem.idempotency AS i (idem_key, biz_type, order_no, channel, amount, status, attempts, locked_until)
VALUES ('dup:' || :k, 'pay', 'PO' || :k, 'WXPAY_001', 100, 'processing', 1, now() + interval '30 seconds')
ON CONFLICT (idem_key) DO NOTHING
RETURNING i.status, i.attempts;
