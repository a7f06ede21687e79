-- Before each benchmark point: an empty table plus 1,000 completed keys
-- (dup:1 .. dup:1000) that the *_dup scripts claim again.
TRUNCATE payidem.idempotency;
INSERT INTO payidem.idempotency (idem_key, biz_type, order_no, channel, amount, status, result, attempts)
SELECT 'dup:' || g, 'pay', 'PO' || g, 'WXPAY_001', 100, 'completed', '{"answer": "SUCCESS"}', 1
  FROM generate_series(1, 1000) g;
VACUUM ANALYZE payidem.idempotency;
CHECKPOINT;
