------------------------------------------------------------------------------
-- The payment's keys (payidem.payment_pending, payidem.payment_paid): its
-- trigger, on every write of a payment (src/payment_keys.c: in C, it returns at once
-- unless the payment became or stopped being pending, or its channel,
-- transaction id or paid_at changed; the keys are written as their owner,
-- whoever writes the payment).  status_keys fires after status_guard, so a
-- change the whitelist refuses is reported as that first.  ENABLE ALWAYS:
-- also in session_replication_role = replica (a restore or a replication
-- apply loading payments), where the other triggers stand aside; only a
-- DISABLE TRIGGER leaves the keys behind (rebuild_payment_keys(), below).
------------------------------------------------------------------------------
CREATE FUNCTION payidem._payment_keys()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys() IS
	'Trigger status_keys on payidem.payment: its pending attempt per order and its transaction id and paid_at per channel into payidem.payment_pending and payidem.payment_paid.';
CREATE TRIGGER status_keys
	AFTER INSERT OR UPDATE OR DELETE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys;
CREATE FUNCTION payidem._payment_keys_truncate()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	TRUNCATE payidem.payment_pending, payidem.payment_paid;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION payidem._payment_keys_truncate() IS
	'Trigger status_keys_truncate on payidem.payment: a TRUNCATE of the payments empties their keys too.';
CREATE TRIGGER status_keys_truncate
	AFTER TRUNCATE ON payidem.payment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncate();
ALTER TABLE payidem.payment ENABLE ALWAYS TRIGGER status_keys_truncate;
-- The keys a logical-replication worker receives (a publication FOR ALL
-- TABLES or TABLES IN SCHEMA payidem includes them): skipped, as the
-- subscriber's status_keys makes them from the payments it receives
-- (src/payment_keys.c).  ENABLE REPLICA: it fires in session_replication_role =
-- replica only, where such a worker writes.
CREATE FUNCTION payidem._payment_keys_received()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_received'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys_received() IS
	'Trigger keys_received on payidem.payment_pending and payidem.payment_paid: a logical-replication worker''s rows are skipped; the subscriber''s status_keys makes its keys from its payments.';
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_pending
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_received;
CREATE TRIGGER keys_received
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.payment_paid
	FOR EACH ROW EXECUTE FUNCTION payidem._payment_keys_received();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_received;
-- A TRUNCATE of a key table such a worker applies: the table made again from
-- the subscriber's payments (src/payment_keys.c).
CREATE FUNCTION payidem._payment_keys_truncated()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_payment_keys_truncated'
LANGUAGE C;
COMMENT ON FUNCTION payidem._payment_keys_truncated() IS
	'Trigger keys_truncated on payidem.payment_pending and payidem.payment_paid: a TRUNCATE a logical-replication worker applies is followed by the keys of the subscriber''s payments.';
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_pending
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_pending ENABLE REPLICA TRIGGER keys_truncated;
CREATE TRIGGER keys_truncated
	AFTER TRUNCATE ON payidem.payment_paid
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._payment_keys_truncated();
ALTER TABLE payidem.payment_paid ENABLE REPLICA TRIGGER keys_truncated;
-- No replica identity: the rows go only where payidem's C code (the trigger,
-- the rebuild) writes them, below the executor, and a publication that
-- includes the tables then sends their inserts (which a subscriber skips)
-- and no delete (which it would not find: its own trigger removed the row).
ALTER TABLE payidem.payment_pending REPLICA IDENTITY NOTHING;
ALTER TABLE payidem.payment_paid REPLICA IDENTITY NOTHING;

-- The keys made again from the payments: after payments were written with
-- the triggers off (session_replication_role = replica, DISABLE TRIGGER);
-- how many rows they hold.  Refused (23505, naming the constraint) if the
-- payments break a rule the keys carry: two pending attempts of one order,
-- one transaction id on two payments of a channel.
CREATE FUNCTION payidem._payment_keys_fill()
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_payment_keys_fill'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem._payment_keys_fill() IS
	'Internal (rebuild_payment_keys): payidem.payment_pending and payidem.payment_paid emptied and made again from every payment, as trigger status_keys makes them; how many rows.';
CREATE FUNCTION payidem.rebuild_payment_keys()
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.payment IN SHARE MODE;
	RETURN payidem._payment_keys_fill();
END
$$;
COMMENT ON FUNCTION payidem.rebuild_payment_keys() IS
	'Make payidem.payment_pending and payidem.payment_paid again from the payments (after payments were written with the triggers off); how many rows they hold. Reads every payment under a SHARE lock.';

