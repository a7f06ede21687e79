--
-- reconciliation_generated: 100,000 payments and a bill built with a known
-- number of each difference; reconcile() must report exactly those.
--   i % 400 = 1   platform_only   (payment missing from the bill)
--   i % 400 = 2   amount_mismatch (bill amount + 1)
--   i % 400 = 3   status_mismatch (bill refunded, payment succeeded)
--   i % 400 = 5   status_mismatch (payment refunded, bill succeeded)
--   i % 400 = 6   refunded on both sides (matched)
--   n / 400 extra bill lines: channel_only
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set n 100000
INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M7GENRECQN000001', 'Generated', 'retail', 0.006, 'ak_generated_recon_0001');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('GEN_WX', 'wechat', 0.0025);

-- bulk load as a restore would (replica mode): the rows are built consistent
-- with the state machine, but 100,000 orders are not needed to reconcile
SET session_replication_role = replica;
INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status,
                             transaction_id, refunded_amount, paid_at)
SELECT payidem.order_no_make('PY', '2024-06-01 00:00:00+00', 0, i),
       payidem.order_no_make('PO', '2024-06-01 00:00:00+00', 0, i),
       'M7GENRECQN000001', 'GEN_WX', 1000 + i % 5000,
       CASE WHEN i % 400 IN (5, 6) THEN 'refunded' ELSE 'succeeded' END,
       'G' || i,
       CASE WHEN i % 400 IN (5, 6) THEN 1000 + i % 5000 ELSE 0 END,
       timestamptz '2024-06-01 00:00:00+00' + (i % 86400) * interval '1 second'
  FROM generate_series(1, :n) AS i;
RESET session_replication_role;
INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
SELECT 'GEN_WX', date '2024-06-01', 'G' || i, payidem.order_no_make('PY', '2024-06-01 00:00:00+00', 0, i),
       1000 + i % 5000 + CASE WHEN i % 400 = 2 THEN 1 ELSE 0 END, 3,
       CASE WHEN i % 400 IN (3, 6) THEN 'refunded' ELSE 'succeeded' END,
       timestamptz '2024-06-01 00:00:00+00' + (i % 86400) * interval '1 second'
  FROM generate_series(1, :n) AS i
 WHERE i % 400 <> 1
UNION ALL
SELECT 'GEN_WX', date '2024-06-01', 'GX' || i, NULL, 777, 1, 'succeeded', timestamptz '2024-06-01 12:00:00+00'
  FROM generate_series(1, :n / 400) AS i;
ANALYZE payidem.payment;
ANALYZE payidem.channel_bill;

SET payidem.bill_timezone = 'UTC';
SELECT matched, platform_only, channel_only, amount_mismatch, status_mismatch
  FROM payidem.reconcile('GEN_WX', '2024-06-01');
SELECT diff_type, count(*), sum(platform_amount) AS platform_amount, sum(channel_amount) AS channel_amount
  FROM payidem.reconciliation WHERE channel_no = 'GEN_WX' GROUP BY 1 ORDER BY 1;
SELECT count(*) AS channel_only_anomalies FROM payidem.anomaly WHERE channel_no = 'GEN_WX' AND kind = 'channel_only';
-- a re-run finds the same differences and stores nothing twice
SELECT matched, platform_only, channel_only, amount_mismatch, status_mismatch
  FROM payidem.reconcile('GEN_WX', '2024-06-01');
SELECT count(*) AS stored_differences FROM payidem.reconciliation WHERE channel_no = 'GEN_WX';
SELECT count(*) AS channel_only_anomalies FROM payidem.anomaly WHERE channel_no = 'GEN_WX' AND kind = 'channel_only';

-- clean up what later tests do not expect (money records are kept: only
-- the superuser's replica mode, as for the bulk load, deletes them)
SET session_replication_role = replica;
DELETE FROM payidem.reconciliation WHERE channel_no = 'GEN_WX';
DELETE FROM payidem.recon_batch WHERE channel_no = 'GEN_WX';
DELETE FROM payidem.anomaly WHERE channel_no = 'GEN_WX';
DELETE FROM payidem.channel_bill WHERE channel_no = 'GEN_WX';
DELETE FROM payidem.payment WHERE channel_no = 'GEN_WX';
RESET session_replication_role;
