------------------------------------------------------------------------------
-- pg_dump keeps the rows of every data table (built-in whitelist rows are
-- recreated by CREATE EXTENSION, so they are left out of the dump).
------------------------------------------------------------------------------

SELECT pg_catalog.pg_extension_config_dump('payidem.state', 'WHERE NOT builtin');
SELECT pg_catalog.pg_extension_config_dump('payidem.transition', 'WHERE NOT builtin');
SELECT pg_catalog.pg_extension_config_dump('payidem.status_log', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.status_log_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_secret', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel_config', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_channel', '');
SELECT pg_catalog.pg_extension_config_dump('payidem."order"', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.payment', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.refund', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.notify_event', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.notify_event_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.query_lease', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.idempotency', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.anomaly_anomaly_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.channel_bill', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.recon_batch', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.reconciliation_recon_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.order_no_hwm', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.business_day', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.ledger_entry', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.ledger_entry_entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_balance', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settlement_item', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settlement_hold', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.settle_state', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.payout', '');
SELECT pg_catalog.pg_extension_config_dump('payidem.adjustment', '');
-- (rows of roles that no longer exist are left out: pg_dump would write their
-- regrole as a bare OID, which in another cluster may be some other role)
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_role',
	'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)');
SELECT pg_catalog.pg_extension_config_dump('payidem.auditor_role',
	'WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles u WHERE u.oid = role::oid)');

