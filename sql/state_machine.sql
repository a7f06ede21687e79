--
-- state_machine: the whitelist triggers on "order", payment and refund,
-- transit_order/transit_payment/transit_refund(), the append-only status_log,
-- and a DBA's own flow added and removed at run time.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
-- a fresh installation (earlier tests leave theirs behind)
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS payidem CASCADE;
RESET client_min_messages;
CREATE EXTENSION payidem;
-- The whitelist on its own: every pair of statuses is walked here without
-- the bookkeeping a real flow does, so the bookkeeping triggers (tested in
-- books.sql) are off in this file, and back on at its end.
ALTER TABLE payidem."order" DISABLE TRIGGER status_ledger, DISABLE TRIGGER status_ledger_at_commit;
ALTER TABLE payidem.payment DISABLE TRIGGER status_ledger, DISABLE TRIGGER status_ledger_at_commit;
ALTER TABLE payidem.refund DISABLE TRIGGER status_ledger_at_commit;

INSERT INTO payidem.merchant (merchant_no, merchant_name, merchant_type, fee_rate, api_key)
VALUES ('M0123456789ABCDE', 'Corner Shop', 'retail', 0.006, 'ak_0123456789abcdef');
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate)
VALUES ('WXPAY_001', 'wechat', 0.0025);

-- try(sql): run it, answer 'ok' or "SQLSTATE: message | detail | hint"
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	st text; msg text; det text; hnt text;
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
		det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
	RETURN st || ': ' || msg || ' | ' || det || ' | ' || hnt;
END $$;

-- key(entity, n): a valid number of the entity (PO/PY/RF), the n-th of 2024-01-01
CREATE FUNCTION pg_temp.key(entity text, n int) RETURNS text LANGUAGE sql AS $$
	SELECT payidem.order_no_make(CASE entity WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' ELSE 'RF' END,
	                             '2024-01-01 00:00:00+00', 0, n)
$$;

-- make(entity, n): a new row of the entity in its initial status, with the
-- rows it needs (an order for a payment; an order and a payment for a refund)
CREATE FUNCTION pg_temp.make(entity text, n int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at)
	VALUES (pg_temp.key('order', n), 'M0123456789ABCDE', 'T-' || n, 'tea', 1000, now() + interval '1 hour');
	IF entity IN ('payment', 'refund') THEN
		INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
		VALUES (pg_temp.key('payment', n), pg_temp.key('order', n), 'M0123456789ABCDE', 'WXPAY_001', 1000);
	END IF;
	IF entity = 'refund' THEN
		INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount)
		VALUES (pg_temp.key('refund', n), pg_temp.key('payment', n), pg_temp.key('order', n),
		        'M0123456789ABCDE', 'R-' || n, 100);
	END IF;
	RETURN pg_temp.key(entity, n);
END $$;

-- path(entity, status): the shortest chain of allowed statuses from the initial one
CREATE FUNCTION pg_temp.path(e text, target text) RETURNS text[] LANGUAGE sql AS $$
	WITH RECURSIVE p(status, path) AS (
		SELECT status, ARRAY[]::text[] FROM payidem.state WHERE entity = e AND initial
		UNION ALL
		SELECT t.to_status, p.path || t.to_status
		  FROM p JOIN payidem.transition t ON t.entity = e AND t.from_status = p.status
		 WHERE t.to_status <> ALL (p.path) AND cardinality(p.path) < 6)
	SELECT path FROM p WHERE status = target ORDER BY cardinality(path), path LIMIT 1
$$;

-- transit(entity, key, to): the transit function of the entity
CREATE FUNCTION pg_temp.transit(e text, k text, target text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	RETURN CASE e WHEN 'order' THEN payidem.transit_order(k, target)
	              WHEN 'payment' THEN payidem.transit_payment(k, target)
	              ELSE payidem.transit_refund(k, target) END;
END $$;

-- bring(entity, n, status): a new row moved along the path to status
CREATE FUNCTION pg_temp.bring(e text, n int, target text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	k text := pg_temp.make(e, n);
	s text;
BEGIN
	FOREACH s IN ARRAY pg_temp.path(e, target) LOOP
		PERFORM pg_temp.transit(e, k, s);
	END LOOP;
	RETURN k;
END $$;

-- direct(entity, key, to): the same change as a plain UPDATE
CREATE FUNCTION pg_temp.direct(e text, k text, target text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format('UPDATE payidem.%I SET status = %L WHERE %I = %L', e, target,
	               CASE e WHEN 'order' THEN 'order_no' WHEN 'payment' THEN 'payment_no' ELSE 'refund_no' END, k);
END $$;

CREATE TEMP TABLE stats_before AS SELECT name, value FROM payidem.stats();

--
-- 1. Every allowed transition of payidem.transition works, through the
--    function and through a direct UPDATE, and each is logged once.
--
CREATE TEMP SEQUENCE n START 100;
CREATE TEMP TABLE allowed AS
SELECT t.entity, t.from_status, t.to_status, via,
       pg_temp.bring(t.entity, nextval('n')::int, t.from_status) AS k
  FROM payidem.transition t, (VALUES ('function'), ('update')) v(via)
 WHERE t.entity IN ('order', 'payment', 'refund')	-- those with a transit_*() (payout: sql/settlement.sql)
 ORDER BY 1, 2, 3, 4;
SELECT entity, from_status, to_status, via,
       CASE via WHEN 'function' THEN pg_temp.try(format('SELECT pg_temp.transit(%L, %L, %L)', entity, k, to_status))
                ELSE pg_temp.try(format('SELECT pg_temp.direct(%L, %L, %L)', entity, k, to_status)) END AS result
  FROM allowed ORDER BY 1, 2, 3, 4;
-- each row is now in to_status, and the last log row of each says so
SELECT a.entity, a.from_status, a.to_status, a.via,
       (SELECT l.from_status || ' -> ' || l.to_status FROM payidem.status_log l
         WHERE l.entity = a.entity AND l.entity_no = a.k ORDER BY l.log_id DESC LIMIT 1) AS last_log
  FROM allowed a ORDER BY 1, 2, 3, 4;
-- a repeat through the function is an idempotent no-op: false, nothing logged
SELECT count(*) AS log_rows_before FROM payidem.status_log \gset
SELECT entity, to_status, bool_or(pg_temp.transit(entity, k, to_status)) AS any_true
  FROM allowed GROUP BY 1, 2 ORDER BY 1, 2;
SELECT count(*) - :log_rows_before AS new_log_rows FROM payidem.status_log;

--
-- 2. Every pair NOT in the whitelist is refused, by the function and by UPDATE
--
CREATE TEMP TABLE forbidden AS
SELECT f.entity, f.status AS from_status, t.status AS to_status
  FROM payidem.state f JOIN payidem.state t ON t.entity = f.entity AND t.status <> f.status
 WHERE f.entity IN ('order', 'payment', 'refund')
   AND NOT EXISTS (SELECT 1 FROM payidem.transition w
                    WHERE w.entity = f.entity AND w.from_status = f.status AND w.to_status = t.status);
ALTER TABLE forbidden ADD k text;
UPDATE forbidden SET k = pg_temp.bring(entity, nextval('n')::int, from_status);
SELECT entity, count(*) AS pairs,
       count(*) FILTER (WHERE pg_temp.try(format('SELECT pg_temp.transit(%L, %L, %L)', entity, k, to_status))
                              LIKE 'PI002:%') AS refused_by_function,
       count(*) FILTER (WHERE pg_temp.try(format('SELECT pg_temp.direct(%L, %L, %L)', entity, k, to_status))
                              LIKE 'PI002:%') AS refused_by_update
  FROM forbidden GROUP BY entity ORDER BY entity;
-- and nothing moved
SELECT count(*) AS moved
  FROM forbidden f
  JOIN LATERAL (SELECT status FROM payidem."order" WHERE order_no = f.k
                UNION ALL SELECT status FROM payidem.payment WHERE payment_no = f.k
                UNION ALL SELECT status FROM payidem.refund WHERE refund_no = f.k) cur ON true
 WHERE cur.status <> f.from_status;

-- what the errors look like: SQLSTATE, message, DETAIL, HINT
SELECT pg_temp.bring('order', 1, 'closed') AS closed_order,
       pg_temp.bring('order', 2, 'pending') AS pending_order,
       pg_temp.bring('payment', 3, 'failed') AS failed_payment,
       pg_temp.bring('refund', 4, 'succeeded') AS succeeded_refund;
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000164', 'paid')$$);
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'paid' WHERE order_no = 'PO202401010000000000000164'$$);
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000261', 'refunded')$$);
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'refunded' WHERE order_no = 'PO202401010000000000000261'$$);
SELECT pg_temp.try($$SELECT payidem.transit_payment('PY202401010000000000000384', 'closed')$$);
SELECT pg_temp.try($$SELECT payidem.transit_refund('RF202401010000000000000486', 'failed')$$);
-- the same, as psql shows it
UPDATE payidem."order" SET status = 'paid' WHERE order_no = 'PO202401010000000000000164';
-- unknown row, unknown status, NULL
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000009961', 'paid')$$);
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000261', 'shipped')$$);
SELECT pg_temp.try($$SELECT payidem.transit_payment('PY202401010000000000000384', 'paid')$$);
SELECT pg_temp.try($$SELECT payidem.transit_order(NULL, 'paid')$$) AS null_key;
SELECT pg_temp.try($$SELECT payidem.transit_payment('PY202611290000000000016333', NULL)$$) AS null_status;

-- terminal statuses are final: nothing leaves closed/refunded (orders), refunded (payments), succeeded/failed (refunds)
SELECT s.entity, s.status,
       (SELECT count(*) FROM payidem.transition t WHERE t.entity = s.entity AND t.from_status = s.status) AS exits,
       (SELECT count(*) FROM forbidden f WHERE f.entity = s.entity AND f.from_status = s.status) AS refused_targets
  FROM payidem.state s WHERE s.terminal ORDER BY 1, 2;
SELECT pg_temp.try($$UPDATE payidem.refund SET status = 'pending' WHERE refund_no = 'RF202401010000000000000486'$$);

-- an UPDATE of other columns, or SET status to the same value, is not a change
UPDATE payidem."order" SET subject = 'green tea' WHERE order_no = 'PO202401010000000000000164';
UPDATE payidem."order" SET status = 'closed' WHERE order_no = 'PO202401010000000000000164';
SELECT count(*) AS log_rows FROM payidem.status_log WHERE entity_no = 'PO202401010000000000000164';

-- a multi-row UPDATE is all or nothing: one illegal row refuses the statement
-- (PO...02 pending -> paid is allowed, PO...01 closed -> paid is not)
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'paid'
                      WHERE order_no IN ('PO202401010000000000000261', 'PO202401010000000000000164')$$);
SELECT order_no, status FROM payidem."order"
 WHERE order_no IN ('PO202401010000000000000164', 'PO202401010000000000000261') ORDER BY 1;

--
-- 3. Inserts must use the initial status
--
SELECT pg_temp.try($$INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, status, expire_at)
	VALUES ('PO202401010000000000000552', 'M0123456789ABCDE', 'T-5', 'tea', 1000, 'paid', now() + interval '1 hour')$$);
SELECT pg_temp.try($$INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount, status)
	VALUES ('PY202401010000000000000578', 'PO202401010000000000000261', 'M0123456789ABCDE', 'WXPAY_001', 1000, 'succeeded')$$);
SELECT count(*) AS inserted FROM payidem."order" WHERE order_no = 'PO202401010000000000000552';

--
-- 4. Timestamps set by transit_*()
--
SELECT pg_temp.make('payment', 6) AS k6 \gset
SELECT payidem.transit_payment(:'k6', 'closed');
SELECT payidem.transit_payment(:'k6', 'succeeded');	-- the channel's word wins
SELECT payidem.transit_order('PO202401010000000000000649', 'paid');
SELECT o.status, o.paid_at IS NOT NULL AS order_paid_at, o.closed_at IS NULL AS order_not_closed,
       p.status AS payment_status, p.paid_at IS NOT NULL AS payment_paid_at, p.closed_at IS NOT NULL AS payment_closed_at,
       o.updated_at >= o.created_at AS updated
  FROM payidem."order" o JOIN payidem.payment p USING (order_no) WHERE o.order_no = 'PO202401010000000000000649';
SELECT status, closed_at IS NOT NULL AS closed_at, paid_at IS NULL AS no_paid_at
  FROM payidem."order" WHERE order_no = 'PO202401010000000000000164';
SELECT status, refunded_at IS NOT NULL AS refunded_at FROM payidem.refund WHERE refund_no = 'RF202401010000000000000486';

--
-- 5. A DBA's own flow (seed 002): paid -> shipping -> delivered -> completed
--
SELECT pg_temp.bring('order', 7, 'paid') AS k7 \gset
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000746', 'shipping')$$);
-- inside a transaction that rolls back, the flow exists only until the rollback
BEGIN;
INSERT INTO payidem.state (entity, status) VALUES ('order', 'shipping');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'shipping');
SELECT payidem.transit_order(:'k7', 'shipping');
ROLLBACK;
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000746', 'shipping')$$);
SELECT status FROM payidem."order" WHERE order_no = :'k7';
-- committed: seen by the next statement
INSERT INTO payidem.state (entity, status, terminal) VALUES
	('order', 'shipping', false), ('order', 'delivered', false), ('order', 'completed', true);
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES
	('order', 'paid', 'shipping'), ('order', 'shipping', 'delivered'), ('order', 'delivered', 'completed');
SELECT payidem.transit_order(:'k7', 'shipping');
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000746', 'completed')$$);
UPDATE payidem."order" SET status = 'delivered' WHERE order_no = :'k7';
SELECT payidem.transit_order(:'k7', 'completed');
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000746', 'refunded')$$);
SELECT from_status, to_status, changed_by FROM payidem.status_log WHERE entity_no = :'k7' ORDER BY log_id;
-- removed: the next statement refuses the flow again
SELECT pg_temp.bring('order', 8, 'paid') AS k8 \gset
DELETE FROM payidem.transition WHERE entity = 'order' AND NOT builtin;
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000843', 'shipping')$$);
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'shipping' WHERE order_no = 'PO202401010000000000000843'$$);
DELETE FROM payidem.state WHERE entity = 'order' AND status IN ('shipping', 'delivered');
SELECT pg_temp.try($$SELECT payidem.transit_order('PO202401010000000000000843', 'shipping')$$);
-- 'completed' stays while an order is in it (the whitelist's guard refuses
-- to delete a status in use), but is a dead end
BEGIN;
DELETE FROM payidem.state WHERE entity = 'order' AND status = 'completed';
COMMIT;
SELECT count(*) AS completed_kept FROM payidem.state WHERE entity = 'order' AND status = 'completed';

--
-- 6. status_log matches the tables, row by row
--
-- every row has exactly one log row per status it took: an insert row first,
-- and its last log row is its current status
WITH cur AS (
	SELECT 'order' AS entity, order_no AS k, status FROM payidem."order"
	UNION ALL SELECT 'payment', payment_no, status FROM payidem.payment
	UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund)
SELECT count(*) AS rows_checked,
       count(*) FILTER (WHERE (SELECT l.to_status FROM payidem.status_log l WHERE l.entity = cur.entity AND l.entity_no = cur.k
                                ORDER BY l.log_id DESC LIMIT 1) IS DISTINCT FROM cur.status) AS last_log_differs,
       count(*) FILTER (WHERE (SELECT l.from_status FROM payidem.status_log l WHERE l.entity = cur.entity AND l.entity_no = cur.k
                                ORDER BY l.log_id LIMIT 1) IS NOT NULL) AS first_log_not_insert,
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM payidem.status_log l1 JOIN payidem.status_log l2
                                        ON l2.entity = l1.entity AND l2.entity_no = l1.entity_no
                                       AND l2.log_id = (SELECT min(l3.log_id) FROM payidem.status_log l3
                                                         WHERE l3.entity = l1.entity AND l3.entity_no = l1.entity_no
                                                           AND l3.log_id > l1.log_id)
                                     WHERE l1.entity = cur.entity AND l1.entity_no = cur.k
                                       AND l2.from_status IS DISTINCT FROM l1.to_status)) AS broken_chain
  FROM cur;
SELECT count(*) AS log_rows_of_unknown_rows FROM payidem.status_log l
 WHERE NOT EXISTS (SELECT 1 FROM payidem."order" WHERE order_no = l.entity_no)
   AND NOT EXISTS (SELECT 1 FROM payidem.payment WHERE payment_no = l.entity_no)
   AND NOT EXISTS (SELECT 1 FROM payidem.refund WHERE refund_no = l.entity_no);
SELECT count(DISTINCT changed_by) AS changed_by_values, min(changed_by) AS changed_by,
       bool_and(changed_at IS NOT NULL AND txid IS NOT NULL) AS stamped
  FROM payidem.status_log;

--
-- 7. status_log is append-only, for the owner and superusers too, and also
--    with session_replication_role = replica
--
UPDATE payidem.status_log SET to_status = 'paid';
SELECT pg_temp.try('UPDATE payidem.status_log SET to_status = ''paid''');
SELECT pg_temp.try('DELETE FROM payidem.status_log');
SELECT pg_temp.try('TRUNCATE payidem.status_log');
SELECT pg_temp.try('INSERT INTO payidem.status_log (entity, entity_no, to_status) VALUES (''order'', ''PO202401010000000000000164'', ''paid'') ON CONFLICT ON CONSTRAINT status_log_pkey DO UPDATE SET to_status = ''x''');
SET session_replication_role = replica;
SELECT pg_temp.try('UPDATE payidem.status_log SET to_status = ''paid''');
SELECT pg_temp.try('DELETE FROM payidem.status_log');
SELECT pg_temp.try('TRUNCATE payidem.status_log');
-- (replica is how a restore runs: the state guard is an ordinary trigger and
--  does not fire then; only a superuser can set it)
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'pending' WHERE order_no = 'PO202401010000000000000164'$$);
RESET session_replication_role;
UPDATE payidem."order" SET status = 'closed' WHERE order_no = 'PO202401010000000000000164';
SELECT tgrelid::regclass AS "table", tgname, tgenabled, tgconstraint <> 0 AS is_constraint
  FROM pg_trigger WHERE tgrelid IN ('payidem."order"'::regclass, 'payidem.payment'::regclass, 'payidem.refund'::regclass,
                                    'payidem.status_log'::regclass, 'payidem.state'::regclass, 'payidem.transition'::regclass)
   AND NOT tgisinternal ORDER BY 1, 2;

-- The log row is written with the log's CHECKs and defaults compiled once per
-- backend; a change of the table rebuilds them: a CHECK added later is
-- enforced, a column added later gets its default, and a rollback undoes both.
SELECT pg_temp.bring('order', 900, 'pending') AS k9, pg_temp.bring('order', 901, 'pending') AS k10 \gset
SELECT payidem.transit_order(:'k9', 'paid') AS compiled_before;
BEGIN;
ALTER TABLE payidem.status_log ADD CONSTRAINT status_log_no_refunded CHECK (to_status <> 'refunded') NOT VALID;
SELECT split_part(pg_temp.try(format('SELECT payidem.transit_order(%L, %L)', :'k9', 'refunded')), ' | ', 1)
	AS refused_by_new_check;
ROLLBACK;
BEGIN;
ALTER TABLE payidem.status_log ADD COLUMN note text, ALTER COLUMN note SET DEFAULT 'added later';
SELECT payidem.transit_order(:'k10', 'closed') AS with_new_column;
SELECT to_status, note FROM payidem.status_log WHERE entity_no = :'k10' ORDER BY log_id;
ROLLBACK;
SELECT payidem.transit_order(:'k9', 'refunded') AS after_rollback;
SELECT from_status, to_status FROM payidem.status_log WHERE entity_no = :'k9' ORDER BY log_id;

--
-- 8. An application role: UPDATE on "order" is enough; it cannot write the
--    log itself, nor switch the guard off
--
-- (BYPASSRLS: this is about the state machine, not the row-level policies)
CREATE ROLE regress_payidem_app BYPASSRLS;
GRANT USAGE ON SCHEMA payidem TO regress_payidem_app;
GRANT SELECT, INSERT, UPDATE ON payidem."order" TO regress_payidem_app;
GRANT EXECUTE ON FUNCTION payidem.transit_order(text, text) TO regress_payidem_app;
SELECT pg_temp.make('order', 9) AS k9 \gset
SET ROLE regress_payidem_app;
SELECT payidem.transit_order(:'k9', 'paid');
SELECT pg_temp.try($$UPDATE payidem."order" SET status = 'closed' WHERE order_no = 'PO202401010000000000000940'$$);
SELECT pg_temp.try($$INSERT INTO payidem.status_log (entity, entity_no, to_status) VALUES ('order', 'PO202401010000000000000940', 'closed')$$);
SELECT pg_temp.try('SET session_replication_role = replica');
RESET ROLE;
SELECT from_status, to_status, changed_by FROM payidem.status_log WHERE entity_no = :'k9' ORDER BY log_id;
REVOKE ALL ON payidem."order" FROM regress_payidem_app;
REVOKE ALL ON FUNCTION payidem.transit_order(text, text) FROM regress_payidem_app;
REVOKE USAGE ON SCHEMA payidem FROM regress_payidem_app;
DROP ROLE regress_payidem_app;

--
-- 9. Trigger protocol: the guard refuses to run as anything but an AFTER ROW trigger
--
CREATE TEMP TABLE wrong (k text, status text);
CREATE TRIGGER wrong_before BEFORE INSERT ON wrong FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order', 'k');
SELECT pg_temp.try($$INSERT INTO wrong VALUES ('a', 'pending')$$);
DROP TRIGGER wrong_before ON wrong;
CREATE TRIGGER wrong_stmt AFTER INSERT ON wrong FOR EACH STATEMENT EXECUTE FUNCTION payidem.status_guard('order', 'k');
SELECT pg_temp.try($$INSERT INTO wrong VALUES ('a', 'pending')$$);
DROP TRIGGER wrong_stmt ON wrong;
CREATE TRIGGER wrong_args AFTER INSERT ON wrong FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order');
SELECT pg_temp.try($$INSERT INTO wrong VALUES ('a', 'pending')$$);
DROP TRIGGER wrong_args ON wrong;
CREATE TRIGGER wrong_log AFTER INSERT ON wrong FOR EACH ROW EXECUTE FUNCTION payidem.status_log_append_only();
SELECT pg_temp.try($$INSERT INTO wrong VALUES ('a', 'pending')$$);
DROP TABLE wrong;

--
-- 10. Counters in payidem.stats()
--
SELECT a.name, a.value > b.value AS increased
  FROM payidem.stats() a JOIN stats_before b USING (name)
 WHERE a.name LIKE 'transitions%' ORDER BY 1;

--
-- 11. Around the guard: a number that changes, a BEFORE trigger, the
--     whitelist's own rules, NULLs and other tables
--
-- The number is the row's identity: renaming it would move a status without a
-- transition (two renames swap a failed and a succeeded payment).
SELECT pg_temp.bring('order', 20, 'closed') AS k20 \gset
SELECT pg_temp.try(format($$UPDATE payidem."order" SET order_no = %L WHERE order_no = %L$$,
                          pg_temp.key('order', 99), :'k20'));
SELECT pg_temp.bring('payment', 21, 'failed') AS k21 \gset
SELECT pg_temp.try(format($$UPDATE payidem.payment SET payment_no = %L WHERE payment_no = %L$$,
                          pg_temp.key('payment', 99), :'k21'));
-- A BEFORE trigger may change the status of an UPDATE that does not name it:
-- checked (closed -> paid is PI002) and logged (pending -> paid) all the same.
CREATE FUNCTION pg_temp.sneak() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.status := 'paid'; RETURN NEW; END $$;
CREATE TRIGGER sneak BEFORE UPDATE ON payidem."order" FOR EACH ROW WHEN (NEW.subject = 'sneak')
  EXECUTE FUNCTION pg_temp.sneak();
SELECT pg_temp.try(format($$UPDATE payidem."order" SET subject = 'sneak' WHERE order_no = %L$$, :'k20'));
SELECT pg_temp.make('order', 22) AS k22 \gset
UPDATE payidem."order" SET subject = 'sneak' WHERE order_no = :'k22';
SELECT from_status, to_status FROM payidem.status_log WHERE entity_no = :'k22' ORDER BY log_id;
DROP TRIGGER sneak ON payidem."order";
-- Built-in whitelist rows are fixed (payidem's functions rely on them, and a
-- restore recreates them); only CREATE EXTENSION makes rows built in.
SELECT pg_temp.try($$DELETE FROM payidem.transition WHERE entity = 'order' AND from_status = 'pending' AND to_status = 'closed'$$);
SELECT pg_temp.try($$UPDATE payidem.state SET terminal = false WHERE entity = 'order' AND status = 'closed'$$);
SELECT pg_temp.try($$TRUNCATE payidem.transition$$);
SELECT pg_temp.try($$INSERT INTO payidem.state (entity, status, builtin) VALUES ('order', 'lost', true)$$);
-- No transition leaves a terminal status, built in or not.
SELECT pg_temp.try($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'refunded', 'paid')$$);
SELECT pg_temp.try($$INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'completed', 'paid')$$);
INSERT INTO payidem.state (entity, status) VALUES ('order', 'on_hold');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'on_hold'), ('order', 'on_hold', 'paid');
SELECT pg_temp.try($$UPDATE payidem.state SET terminal = true WHERE entity = 'order' AND status = 'on_hold'$$);
DELETE FROM payidem.transition WHERE entity = 'order' AND from_status = 'on_hold';
SELECT pg_temp.try($$UPDATE payidem.state SET terminal = true WHERE entity = 'order' AND status = 'on_hold'$$);
DELETE FROM payidem.transition WHERE entity = 'order' AND to_status = 'on_hold';
DELETE FROM payidem.state WHERE entity = 'order' AND status = 'on_hold';
-- A table of your own: its key and status must not be NULL (nothing to log
-- them under, nothing to check a change against).
INSERT INTO payidem.state (entity, status, initial, terminal) VALUES
	('ticket', 'open', true, false), ('ticket', 'done', false, true);
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('ticket', 'open', 'done');
CREATE TABLE public.ticket (ticket_no text, status text DEFAULT 'open');
CREATE CONSTRAINT TRIGGER status_guard AFTER INSERT OR UPDATE ON ticket
  FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('ticket', 'ticket_no');
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES (NULL)$$);
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no, status) VALUES ('T-1', NULL)$$);
INSERT INTO ticket (ticket_no) VALUES ('T-1');
SELECT pg_temp.try($$UPDATE ticket SET status = NULL$$);
UPDATE ticket SET status = 'done';
SELECT from_status, to_status FROM payidem.status_log WHERE entity = 'ticket' ORDER BY log_id;
-- The log rows are written directly, without an INSERT statement: a change a
-- DBA made to status_log that such a write cannot honour is refused with a
-- clear error, and the change of status with it.
BEGIN;
ALTER TABLE payidem.status_log ALTER COLUMN to_status TYPE varchar(40);
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
BEGIN;
ALTER TABLE payidem.status_log RENAME COLUMN changed_by TO who;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
BEGIN;
ALTER TABLE payidem.status_log ALTER COLUMN txid TYPE numeric;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
BEGIN;
CREATE RULE status_log_echo AS ON INSERT TO payidem.status_log DO ALSO NOTIFY status_log;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
BEGIN;
CREATE FUNCTION pg_temp.nothing() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER status_log_batch AFTER INSERT ON payidem.status_log
  REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.nothing();
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
-- a column added without a default gets NULL, checked against its domain as an
-- INSERT checks it
BEGIN;
CREATE DOMAIN public.reviewer AS text;
ALTER TABLE payidem.status_log ADD COLUMN reviewer public.reviewer;
ALTER DOMAIN public.reviewer ADD CONSTRAINT reviewer_named CHECK (VALUE IS NOT NULL) NOT VALID;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-2')$$);
ROLLBACK;
-- What compiling a default or a CHECK decides is not kept past what changes
-- it: a domain's constraints (ALTER DOMAIN does not touch the table) ...
BEGIN;
CREATE DOMAIN public.log_note AS text;
ALTER TABLE payidem.status_log ADD COLUMN note2 public.log_note DEFAULT 'x';
INSERT INTO ticket (ticket_no) VALUES ('T-3');
ALTER DOMAIN public.log_note ADD CONSTRAINT log_note_not_x CHECK (VALUE <> 'x') NOT VALID;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
ALTER DOMAIN public.log_note DROP CONSTRAINT log_note_not_x;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
ROLLBACK;
-- ... and its default: a column of a domain the insert leaves NULL takes the
-- default the domain is given later
BEGIN;
CREATE DOMAIN public.log_tag AS text;
ALTER TABLE payidem.status_log ADD COLUMN tag public.log_tag;
INSERT INTO ticket (ticket_no) VALUES ('T-5');
ALTER DOMAIN public.log_tag SET DEFAULT 'tagged';
INSERT INTO ticket (ticket_no) VALUES ('T-6');
SELECT entity_no, tag FROM payidem.status_log WHERE entity_no IN ('T-5', 'T-6') ORDER BY entity_no;
ROLLBACK;
-- ... and the right to run a function in them, which is the writing role's
BEGIN;
CREATE FUNCTION public.log_allowed(text) RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RETURN true; END$$;
REVOKE EXECUTE ON FUNCTION public.log_allowed(text) FROM PUBLIC;
ALTER TABLE payidem.status_log ADD CONSTRAINT log_allowed CHECK (public.log_allowed(entity_no)) NOT VALID;
CREATE ROLE payidem_log_writer;
GRANT INSERT ON ticket TO payidem_log_writer;
INSERT INTO ticket (ticket_no) VALUES ('T-3');
SET ROLE payidem_log_writer;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
RESET ROLE;
-- also when the function is SQL the planner would inline, and when the role
-- had the right through a role it is no longer a member of
CREATE FUNCTION public.log_allowed_sql(text) RETURNS boolean LANGUAGE sql AS $$SELECT $1 IS NOT NULL$$;
REVOKE EXECUTE ON FUNCTION public.log_allowed_sql(text) FROM PUBLIC;
ALTER TABLE payidem.status_log DROP CONSTRAINT log_allowed,
  ADD CONSTRAINT log_allowed_sql CHECK (public.log_allowed_sql(entity_no)) NOT VALID;
INSERT INTO ticket (ticket_no) VALUES ('T-3b');
SET ROLE payidem_log_writer;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
RESET ROLE;
CREATE ROLE payidem_log_checkers;
GRANT EXECUTE ON FUNCTION public.log_allowed_sql(text) TO payidem_log_checkers;
GRANT payidem_log_checkers TO payidem_log_writer;
SET ROLE payidem_log_writer;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
RESET ROLE;
REVOKE payidem_log_checkers FROM payidem_log_writer;
SET ROLE payidem_log_writer;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4b')$$);
RESET ROLE;
ALTER TABLE payidem.status_log DROP CONSTRAINT log_allowed_sql,
  ADD CONSTRAINT log_allowed CHECK (public.log_allowed(entity_no)) NOT VALID;
-- a compilation that fails leaves nothing behind in the backend's memory
SET ROLE payidem_log_writer;
DO $$BEGIN
	FOR i IN 1..200 LOOP
		BEGIN
			INSERT INTO ticket (ticket_no) VALUES ('T-5');
		EXCEPTION WHEN insufficient_privilege THEN NULL;
		END;
	END LOOP;
END$$;
RESET ROLE;
SELECT sum(total_bytes) < 65536 AS direct_insert_memory_bounded
  FROM pg_backend_memory_contexts
 WHERE name IN ('payidem direct insert', 'payidem compiled expressions');
ROLLBACK;
-- a cast to a domain in the body of a SQL function the planner inlines
BEGIN;
CREATE DOMAIN public.log_entity_no AS text;
CREATE FUNCTION public.log_entity_no_ok(text) RETURNS boolean LANGUAGE sql AS $$SELECT $1::public.log_entity_no IS NOT NULL$$;
ALTER TABLE payidem.status_log ADD CONSTRAINT log_entity_no_ok CHECK (public.log_entity_no_ok(entity_no)) NOT VALID;
INSERT INTO ticket (ticket_no) VALUES ('T-3');
ALTER DOMAIN public.log_entity_no ADD CONSTRAINT log_entity_no_not_t4 CHECK (VALUE <> 'T-4') NOT VALID;
SELECT pg_temp.try($$INSERT INTO ticket (ticket_no) VALUES ('T-4')$$);
ROLLBACK;
-- and once the table is as payidem made it, the same write goes through
INSERT INTO ticket (ticket_no) VALUES ('T-2');
SELECT entity_no, from_status, to_status FROM payidem.status_log WHERE entity = 'ticket' AND entity_no = 'T-2';
-- The built-in entities are guarded on payidem's own tables only: a trigger
-- elsewhere cannot write history for a real order.
CREATE TABLE public.fake_order (order_no text, status text);
CREATE CONSTRAINT TRIGGER status_guard AFTER INSERT OR UPDATE ON fake_order
  FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('order', 'order_no');
SELECT pg_temp.try(format($$INSERT INTO fake_order VALUES (%L, 'pending')$$, :'k20'));
SELECT count(*) AS k20_log_rows FROM payidem.status_log WHERE entity_no = :'k20';
DROP TABLE ticket, fake_order;

-- DROP EXTENSION still works (no trigger stands in the way)
DROP EXTENSION payidem;
CREATE EXTENSION payidem;
SELECT count(*) AS log_rows_after_recreate FROM payidem.status_log;

-- the bookkeeping triggers, on again
ALTER TABLE payidem."order" ENABLE TRIGGER status_ledger, ENABLE TRIGGER status_ledger_at_commit;
ALTER TABLE payidem.payment ENABLE TRIGGER status_ledger, ENABLE TRIGGER status_ledger_at_commit;
ALTER TABLE payidem.refund ENABLE TRIGGER status_ledger_at_commit;
SELECT tgrelid::regclass AS tbl, tgname, tgenabled FROM pg_trigger
 WHERE tgname IN ('status_ledger', 'status_ledger_at_commit') ORDER BY 1, 2;
