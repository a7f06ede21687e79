------------------------------------------------------------------------------
-- State machines and the books (C): the whitelist's guards, the status and
-- bookkeeping triggers, transit_order/payment/refund()
------------------------------------------------------------------------------

-- Whitelist cache invalidation: DML does not invalidate anything by itself,
-- so every change of state/transition queues a relcache invalidation that the
-- state-machine code listens for (this session's next command, and every other
-- session's next statement after commit).  ENABLE ALWAYS: also during a
-- restore run with session_replication_role = replica.
CREATE FUNCTION payidem.whitelist_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_whitelist_changed'
LANGUAGE C;
COMMENT ON FUNCTION payidem.whitelist_changed() IS
	'Trigger on payidem.state and payidem.transition: makes every session re-read the whitelist at its next statement.';

CREATE TRIGGER whitelist_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON payidem.state
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.whitelist_changed();
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_changed;
CREATE TRIGGER whitelist_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON payidem.transition
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.whitelist_changed();
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_changed;

-- What the whitelist tables refuse:
--   * changing or deleting a built-in row (payidem's own functions rely on
--     them, and pg_dump does not keep them: CREATE EXTENSION recreates them on
--     restore, so an edit would silently come undone), or making a row
--     built-in;
--   * a transition that leaves a terminal status, and making a status
--     terminal while transitions leave it;
--   * deleting or renaming a status that rows of its entity have (the status
--     triggers refuse a status the whitelist does not know, so the tables
--     need no foreign key to payidem.state: see _status_in_use).
-- ENABLE ALWAYS like whitelist_changed: a restore loads only your own rows.

-- Whether rows of the entity have the status (src/state_machine.c): looked
-- at with the latest snapshot, first without a lock, then under a SHARE
-- lock on the entity's table held to the end of the transaction, which waits
-- for writers that might be giving a row the status and keeps new ones out
-- until the change commits (they then see the whitelist without it).  The
-- guard runs as the owner (SECURITY DEFINER), so whoever may change the
-- whitelist needs no EXECUTE on it.
CREATE FUNCTION payidem._status_in_use(entity text, status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_status_in_use'
LANGUAGE C VOLATILE;

CREATE FUNCTION payidem._whitelist_guard()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_in_use boolean := false;
	v_present boolean;
BEGIN
	IF TG_OP = 'TRUNCATE' THEN
		RAISE EXCEPTION 'payidem.% cannot be truncated', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = 'It holds the built-in state machines that payidem''s functions rely on.',
			HINT = 'Delete your own rows: DELETE FROM payidem.' || TG_TABLE_NAME || ' WHERE NOT builtin.';
	END IF;
	IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.builtin THEN
		RAISE EXCEPTION 'built-in rows of payidem.% cannot be changed or deleted', TG_TABLE_NAME USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s is built in: payidem''s functions rely on it, and CREATE EXTENSION recreates it on a restore.',
							TG_TABLE_NAME, to_jsonb(OLD) - 'builtin'),
			HINT = 'Add statuses and transitions of your own; only rows with builtin = false can be changed or deleted.';
	END IF;
	-- (nested: PL/pgSQL may evaluate every operand of an AND, and a
	-- transition row has no status field)
	IF TG_TABLE_NAME = 'state' AND TG_OP IN ('UPDATE', 'DELETE') THEN
		IF TG_OP = 'DELETE' THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		ELSIF (NEW.entity, NEW.status) IS DISTINCT FROM (OLD.entity, OLD.status) THEN
			v_in_use := payidem._status_in_use(OLD.entity, OLD.status);
		END IF;
	END IF;
	IF v_in_use THEN
		RAISE EXCEPTION 'status % of % is in use', quote_literal(OLD.status), OLD.entity USING
			ERRCODE = 'foreign_key_violation',
			DETAIL = format('Rows of payidem.%s have status %L; the whitelist cannot lose it.',
							CASE OLD.entity WHEN 'order' THEN '"order"' ELSE OLD.entity END, OLD.status),
			HINT = format('Move them to another status first (payidem.transit_%s), or keep the status.', OLD.entity);
	END IF;
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	-- a built-in row that a load in session_replication_role = replica brings
	-- (a logical-replication subscriber's initial copy) and that this
	-- database's own CREATE EXTENSION made already: skipped, not refused
	IF NEW.builtin AND TG_OP = 'INSERT' AND current_setting('session_replication_role') = 'replica' THEN
		EXECUTE format('SELECT EXISTS (SELECT 1 FROM payidem.%I x WHERE to_jsonb(x) = $1)', TG_TABLE_NAME)
			INTO v_present USING to_jsonb(NEW);
		IF v_present THEN
			RETURN NULL;
		END IF;
	END IF;
	IF NEW.builtin THEN
		RAISE EXCEPTION 'only CREATE EXTENSION installs built-in rows' USING
			ERRCODE = 'insufficient_privilege',
			DETAIL = format('%s row %s has builtin = true.', TG_TABLE_NAME, to_jsonb(NEW) - 'builtin'),
			HINT = 'Insert it with builtin = false (the default), so that pg_dump keeps it.';
	END IF;
	IF TG_TABLE_NAME = 'transition' THEN
		IF EXISTS (SELECT 1 FROM payidem.state s
					WHERE s.entity = NEW.entity AND s.status = NEW.from_status AND s.terminal) THEN
			RAISE EXCEPTION 'a transition cannot leave a terminal status' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: ''%s'' is terminal in payidem.state; the transition was ''%s'' -> ''%s''.',
								NEW.entity, NEW.from_status, NEW.from_status, NEW.to_status),
				HINT = 'Leave from a status that is not terminal, or add your own status for the new path.';
		END IF;
	ELSIF NEW.terminal THEN
		IF EXISTS (SELECT 1 FROM payidem.transition t
					WHERE t.entity = NEW.entity AND t.from_status = NEW.status) THEN
			RAISE EXCEPTION 'a status that transitions leave cannot be terminal' USING
				ERRCODE = 'check_violation',
				DETAIL = format('%s: transitions in payidem.transition leave ''%s''.', NEW.entity, NEW.status),
				HINT = 'Delete those transitions first, or keep the status non-terminal.';
		END IF;
	END IF;
	RETURN NEW;
END
$$;
COMMENT ON FUNCTION payidem._whitelist_guard() IS
	'Trigger on payidem.state and payidem.transition: built-in rows are fixed; no transition leaves a terminal status; a status rows have is not deleted or renamed.';

CREATE TRIGGER whitelist_guard
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.state
	FOR EACH ROW EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard_truncate
	BEFORE TRUNCATE ON payidem.state
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard
	BEFORE INSERT OR UPDATE OR DELETE ON payidem.transition
	FOR EACH ROW EXECUTE FUNCTION payidem._whitelist_guard();
CREATE TRIGGER whitelist_guard_truncate
	BEFORE TRUNCATE ON payidem.transition
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._whitelist_guard();
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_guard;
ALTER TABLE payidem.state ENABLE ALWAYS TRIGGER whitelist_guard_truncate;
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_guard;
ALTER TABLE payidem.transition ENABLE ALWAYS TRIGGER whitelist_guard_truncate;

-- The guard: no INSERT in a non-initial status, no status change outside
-- payidem.transition, whoever runs it; every accepted one is logged.
-- Ordinary (ENABLE ORIGIN) triggers: a restore run with
-- session_replication_role = replica (superuser only) loads rows as they were.
CREATE FUNCTION payidem.status_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_guard'
LANGUAGE C;
COMMENT ON FUNCTION payidem.status_guard() IS
	'Constraint trigger (entity, key column): refuses inserts in a non-initial status and status changes not in payidem.transition (PI002); logs accepted ones in status_log.';

CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order', 'order_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('payment', 'payment_no');
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.refund
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('refund', 'refund_no');

-- status_log is append-only, for every role, also under
-- session_replication_role = replica (ENABLE ALWAYS).  No bypass setting.
CREATE FUNCTION payidem.status_log_append_only()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_log_append_only'
LANGUAGE C;
COMMENT ON FUNCTION payidem.status_log_append_only() IS
	'Trigger on payidem.status_log: refuses UPDATE, DELETE and TRUNCATE for every role.';

CREATE TRIGGER status_log_append_only
	BEFORE UPDATE OR DELETE OR TRUNCATE ON payidem.status_log
	FOR EACH STATEMENT EXECUTE FUNCTION payidem.status_log_append_only();
ALTER TABLE payidem.status_log ENABLE ALWAYS TRIGGER status_log_append_only;

-- A status and its bookkeeping never disagree (DESIGN section 5), whoever writes:
-- the flow functions, transit_*(), a DBA's own UPDATE (src/ledger.c, where
-- the rules are written).  What one row says about itself is checked at the
-- end of each statement (status_ledger); what rows say about each other -- an
-- order's paying payment, a payment's refunds -- at commit
-- (status_ledger_at_commit), when every row of a flow step is written.
-- Refused with PI002: the message names the invariant, DETAIL the values,
-- HINT the flow function that does the bookkeeping.  Ordinary triggers, like
-- status_guard: session_replication_role = replica (superuser) skips them.
-- Named status_ledger*: triggers of one event fire in name order, so a
-- change the whitelist refuses is reported as that (status_guard) first.
-- The statuses of a payment whose money arrived (src/ledger.c, the one list,
-- which the bookkeeping triggers and apply_payment_result() read too);
-- IMMUTABLE, so `status = ANY (payidem._paid_payment_statuses())` is a
-- constant once planned.
CREATE FUNCTION payidem._paid_payment_statuses()
RETURNS text[]
AS 'MODULE_PATHNAME', 'payidem_paid_payment_statuses'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._paid_payment_statuses() IS
	'Internal: the payment statuses in which its money has arrived (succeeded, partially_refunded, refunded).';

CREATE FUNCTION payidem.ledger_row()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_ledger_row'
LANGUAGE C;
COMMENT ON FUNCTION payidem.ledger_row() IS
	'Trigger on payidem."order" and payidem.payment: a paid order names its payment and has paid_at; an order keeps its merchant, and the payment that paid it once it left pending; a succeeded payment has its transaction id, paid_at and fees; a status agrees with the refunded amount, which an order in another status than paid, partially_refunded or refunded (a DBA''s shipping) has only if it names the payment that paid it (PI002).';
CREATE FUNCTION payidem.ledger_at_commit()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_ledger_at_commit'
LANGUAGE C;
COMMENT ON FUNCTION payidem.ledger_at_commit() IS
	'Deferred constraint trigger on payidem."order", payment and refund: at commit, a paid order''s payment is a succeeded payment of it, and refunded amounts add up and are mirrored on the order (PI002). Reads as the tables'' owner.';

CREATE TRIGGER status_ledger
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_row();
CREATE TRIGGER status_ledger
	AFTER INSERT OR UPDATE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_row();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem."order" DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem.payment DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();
CREATE CONSTRAINT TRIGGER status_ledger_at_commit
	AFTER UPDATE ON payidem.refund DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION payidem.ledger_at_commit();

-- Money records are kept (DESIGN section 5): no DELETE or TRUNCATE of orders,
-- payments, refunds or anomalies, for any role.  Ordinary triggers: the
-- superuser's session_replication_role = replica is the one way around.
CREATE FUNCTION payidem._keep_money_records()
RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RAISE EXCEPTION 'rows of payidem.% cannot be deleted', quote_ident(TG_TABLE_NAME) USING
		ERRCODE = 'insufficient_privilege',
		DETAIL = format('payidem.%s holds money records; %s is refused for every role.', quote_ident(TG_TABLE_NAME), TG_OP),
		HINT = CASE TG_TABLE_NAME
				   WHEN 'anomaly' THEN 'Set its handle_status to handled or ignored instead.'
				   WHEN 'order' THEN 'Close a pending order with payidem.close_order(); a paid one is refunded with payidem.refund().'
				   WHEN 'payment' THEN 'Close a pending payment with payidem.close_payment(); a succeeded one is refunded with payidem.refund().'
				   WHEN 'payout' THEN 'A payout ends succeeded or failed through payidem.apply_payout_result().'
				   WHEN 'adjustment' THEN 'Reverse an adjustment with another one: payidem.adjust_balance().'
				   WHEN 'merchant_balance' THEN 'A balance moves only with its journal: settle(), request_payout(), apply_payout_result(), adjust_balance().'
				   WHEN 'settlement_item' THEN 'A settled item is settled for good; correct its money with payidem.adjust_balance().'
				   ELSE 'A refund ends succeeded or failed through payidem.apply_refund_result().' END;
END
$$;
COMMENT ON FUNCTION payidem._keep_money_records() IS
	'Trigger on payidem."order", payment, refund, anomaly, payout, adjustment, merchant_balance and settlement_item: refuses DELETE and TRUNCATE.';

CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem."order"
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.payment
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.payment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.refund
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.refund
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.anomaly
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.anomaly
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();

-- The transition functions: one conditional UPDATE each (optimistic lock).
CREATE FUNCTION payidem.transit_order(order_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_order'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_order(text, text) IS
	'Move an order to to_status if payidem.transition allows it from its current status: true = moved, false = already there, PI009 = no such order, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_payment(payment_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_payment'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_payment(text, text) IS
	'Move a payment attempt to to_status if payidem.transition allows it: true = moved, false = already there, PI009 = no such payment, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem.transit_refund(refund_no text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transit_refund'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.transit_refund(text, text) IS
	'Move a refund to to_status if payidem.transition allows it: true = moved, false = already there, PI009 = no such refund, PI002 = not allowed, 22023 = unknown status.';

CREATE FUNCTION payidem._transition_allowed(entity text, from_status text, to_status text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_transition_allowed'
LANGUAGE C STABLE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem._transition_allowed(text, text, text) IS
	'Internal: whether the whitelist allows entity''s move from from_status to to_status (the cache status_guard checks with).';

-- (end of state-machine functions)

