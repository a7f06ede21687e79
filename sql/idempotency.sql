--
-- idempotency: idem_claim / idem_record / idem_finish / idem_purge (DESIGN section 4).
-- Every outcome, every error with its SQLSTATE, and the row after each step.
-- Keys of this test start with 'rt:'.
--
CREATE EXTENSION IF NOT EXISTS payidem;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- counters before (payidem.stats() needs the preloaded library)
CREATE TEMP TABLE stats_before AS
SELECT name, value FROM payidem.stats() WHERE name LIKE 'idem%';

-- what the table holds for our keys; the lease as none / live / expired
CREATE TEMP VIEW rt_rows AS
SELECT idem_key, biz_type, order_no, channel, amount, fingerprint, status, result, attempts,
       CASE WHEN locked_until IS NULL THEN 'none'
            WHEN locked_until > clock_timestamp() THEN 'live'
            ELSE 'expired' END AS lease,
       updated_at >= created_at AS times_ok
  FROM payidem.idempotency
 WHERE idem_key LIKE 'rt:%'
 ORDER BY idem_key;

--
-- claimed -> in_progress -> finish completed -> replay with the stored result
--
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500);
SELECT * FROM rt_rows;
-- a second caller while the lease is live
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500);
SELECT payidem.idem_finish('rt:pay:PO1:callback', 'completed', '{"answer": "SUCCESS", "payment_no": "PY1"}');
SELECT * FROM rt_rows;
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500);
-- replay with the other optional arguments: channel and lease are not compared
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'ALIPAY_001', 1500, NULL, '5 minutes');
SELECT * FROM rt_rows;

-- a duplicate claim writes nothing: no inserted, updated or deleted tuple
-- (the xact view also counts writes not yet flushed, so compare within one transaction)
BEGIN;
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) AS writes_before
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass \gset
SELECT outcome FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500);
SELECT outcome FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500);
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) - :writes_before AS writes
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass;
-- a new key, for contrast, counts one insert
SELECT outcome FROM payidem.idem_claim('rt:pay:PO0:callback', 'pay', 'PO0', 'WXPAY_001', 1);
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) - :writes_before AS writes
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass;
ROLLBACK;

--
-- failed -> reclaimed (attempts + 1, new lease, earlier result still shown)
--
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, 'sha256:aa');
SELECT payidem.idem_finish('rt:refund:RF1:apply', 'failed', '{"error": "channel timeout"}');
SELECT * FROM rt_rows WHERE idem_key = 'rt:refund:RF1:apply';
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, 'sha256:aa');
SELECT * FROM rt_rows WHERE idem_key = 'rt:refund:RF1:apply';
-- held again: a third caller sees in_progress
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, 'sha256:aa');
SELECT payidem.idem_finish('rt:refund:RF1:apply', 'completed', '{"refund": "ok"}');
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, 'sha256:aa');
SELECT * FROM rt_rows WHERE idem_key = 'rt:refund:RF1:apply';

--
-- lease expiry: a worker that died is recovered after its lease
--
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990, NULL, '1 hour');
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990, NULL, '1 hour');
-- the lease asked for, from the claim's time
SELECT locked_until - updated_at = interval '1 hour' AS one_hour FROM payidem.idempotency WHERE idem_key = 'rt:pay:PO2:query';
-- its time passes (moved, not waited for: a lease of seconds and a pause of
-- the machine between the two claims above would make the second one reclaim
-- it; rt:rec:3 below waits for a real one to run out)
UPDATE payidem.idempotency SET locked_until = clock_timestamp() WHERE idem_key = 'rt:pay:PO2:query';
SELECT lease FROM rt_rows WHERE idem_key = 'rt:pay:PO2:query';
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990);
SELECT * FROM rt_rows WHERE idem_key = 'rt:pay:PO2:query';
-- the new holder's default lease (30 seconds) is live
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990);
-- an expired lease, older than its worker: reclaimed again, attempts 3
UPDATE payidem.idempotency SET locked_until = now() - interval '1 minute'
 WHERE idem_key = 'rt:pay:PO2:query';
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990);
SELECT payidem.idem_finish('rt:pay:PO2:query', 'completed');
SELECT * FROM payidem.idem_claim('rt:pay:PO2:query', 'pay', 'PO2', 'WXPAY_001', 990);

--
-- in one transaction with the business write: an abort removes the claim
--
BEGIN;
SELECT * FROM payidem.idem_claim('rt:pay:PO3:callback', 'pay', 'PO3', 'WXPAY_001', 100);
ROLLBACK;
SELECT count(*) AS rows_after_rollback FROM rt_rows WHERE idem_key = 'rt:pay:PO3:callback';
BEGIN;
SELECT * FROM payidem.idem_claim('rt:pay:PO3:callback', 'pay', 'PO3', 'WXPAY_001', 100);
-- the same session claiming again inside its transaction holds the lease itself
SELECT * FROM payidem.idem_claim('rt:pay:PO3:callback', 'pay', 'PO3', 'WXPAY_001', 100);
SAVEPOINT s;
SELECT * FROM payidem.idem_claim('rt:pay:PO3:callback', 'pay', 'PO3', 'WXPAY_001', 101);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT s;
SELECT payidem.idem_finish('rt:pay:PO3:callback', 'completed', '{"answer": "SUCCESS"}');
COMMIT;
SELECT * FROM rt_rows WHERE idem_key = 'rt:pay:PO3:callback';

--
-- PI001: the key reused with other parameters; DETAIL names the field
--
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'refund', 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO9', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', NULL, 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1501);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- fingerprint: compared only when both sides have one
SELECT outcome FROM payidem.idem_claim('rt:pay:PO1:callback', 'pay', 'PO1', 'WXPAY_001', 1500, 'sha256:bb');
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, 'sha256:ab');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT outcome FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, NULL);
-- a long value is cut in the DETAIL
SELECT * FROM payidem.idem_claim('rt:refund:RF1:apply', 'refund', 'RF1', NULL, 700, repeat('f', 100));
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- a mismatch changes nothing
SELECT * FROM rt_rows WHERE idem_key IN ('rt:pay:PO1:callback', 'rt:refund:RF1:apply');

--
-- 22023: bad input to idem_claim
--
SELECT * FROM payidem.idem_claim(NULL, 'pay', 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('', 'pay', 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:' || repeat('k', 253), 'pay', 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- 255 characters is the limit, counted in characters, not bytes
SELECT outcome, length(idem_key) FROM payidem.idem_claim('rt:' || repeat('键', 252), 'pay', 'PO1', 'WXPAY_001', 1500)
 CROSS JOIN (SELECT 'rt:' || repeat('键', 252) AS idem_key) k;
SELECT * FROM payidem.idem_claim(NULL::text, NULL, NULL, NULL, NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', NULL, 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', '', 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', repeat('b', 65), 'PO1', 'WXPAY_001', 1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', 'pay', 'PO1', 'WXPAY_001', 0);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', 'pay', 'PO1', 'WXPAY_001', -1500);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', 'pay', 'PO1', 'WXPAY_001', 1500, NULL, '0 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', 'pay', 'PO1', 'WXPAY_001', 1500, NULL, '-5 seconds');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_claim('rt:x', 'pay', 'PO1', 'WXPAY_001', 1500, NULL, NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- none of these left a row
SELECT count(*) AS rt_x_rows FROM rt_rows WHERE idem_key = 'rt:x';
-- an amount may be left out (events without money); NULL matches only NULL
SELECT * FROM payidem.idem_claim('rt:notify:PO1:sent', 'notify', 'PO1', NULL, NULL);
SELECT outcome FROM payidem.idem_claim('rt:notify:PO1:sent', 'notify', 'PO1', NULL, NULL);

--
-- idem_finish errors: PI009 unknown key, PI002 not processing, 22023 bad status
--
SELECT payidem.idem_finish('rt:never-claimed', 'completed');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish('rt:pay:PO1:callback', 'completed', '{"answer": "AGAIN"}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_claim('rt:pay:PO4:callback', 'pay', 'PO4', 'WXPAY_001', 1);
SELECT payidem.idem_finish('rt:pay:PO4:callback', 'failed');
SELECT payidem.idem_finish('rt:pay:PO4:callback', 'failed');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish('rt:pay:PO4:callback', 'completed');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish('rt:notify:PO1:sent', 'processing');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish('rt:notify:PO1:sent', 'COMPLETED');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish('rt:notify:PO1:sent', NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish(NULL, 'completed');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_finish(repeat('k', 256), 'completed');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- the errors changed nothing
SELECT idem_key, status, result, attempts, lease FROM rt_rows
 WHERE idem_key IN ('rt:pay:PO1:callback', 'rt:pay:PO4:callback', 'rt:notify:PO1:sent');

--
-- idem_purge: only finished keys older than the cutoff, never a processing one
--
SELECT payidem.idem_claim('rt:purge:old-completed', 'purge', NULL, NULL, 1);
SELECT payidem.idem_finish('rt:purge:old-completed', 'completed');
SELECT payidem.idem_claim('rt:purge:old-failed', 'purge', NULL, NULL, 1);
SELECT payidem.idem_finish('rt:purge:old-failed', 'failed');
SELECT payidem.idem_claim('rt:purge:new-completed', 'purge', NULL, NULL, 1);
SELECT payidem.idem_finish('rt:purge:new-completed', 'completed');
SELECT payidem.idem_claim('rt:purge:old-live', 'purge', NULL, NULL, 1, NULL, '3 days');
SELECT payidem.idem_claim('rt:purge:old-expired', 'purge', NULL, NULL, 1);
UPDATE payidem.idempotency SET created_at = now() - interval '2 days', updated_at = now() - interval '2 days'
 WHERE idem_key IN ('rt:purge:old-completed', 'rt:purge:old-failed', 'rt:purge:old-live', 'rt:purge:old-expired');
UPDATE payidem.idempotency SET locked_until = now() - interval '2 days' + interval '30 seconds'
 WHERE idem_key = 'rt:purge:old-expired';
SELECT idem_key, status, lease FROM rt_rows WHERE idem_key LIKE 'rt:purge:%';
SELECT payidem.idem_purge('1 day') AS purged;
SELECT idem_key, status, lease FROM rt_rows WHERE idem_key LIKE 'rt:purge:%';
-- the default retention (24 hours): the fresh key stays
SELECT payidem.idem_purge() AS purged;
SELECT payidem.idem_purge('-1 day');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_purge(NULL);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- a purged key is new again
SELECT outcome, attempts FROM payidem.idem_claim('rt:purge:old-completed', 'purge', NULL, NULL, 1);
-- the expired processing key is not purged but reclaimed
SELECT outcome, attempts FROM payidem.idem_claim('rt:purge:old-expired', 'purge', NULL, NULL, 1);

--
-- privileges: a role with EXECUTE only can claim and finish (the functions
-- act as the table's owner) but still cannot touch the table
--
CREATE ROLE regress_payidem_app;
GRANT USAGE ON SCHEMA payidem TO regress_payidem_app;
SET ROLE regress_payidem_app;
SELECT * FROM payidem.idem_claim('rt:app:1', 'pay', 'PO1', NULL, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION payidem.idem_claim(text, text, text, text, bigint, text, interval),
                          payidem.idem_finish(text, text, jsonb)
   TO regress_payidem_app;
SET ROLE regress_payidem_app;
SELECT * FROM payidem.idem_claim('rt:app:1', 'pay', 'PO1', NULL, 1);
SELECT payidem.idem_finish('rt:app:1', 'completed', '{"ok": true}');
SELECT * FROM payidem.idem_claim('rt:app:1', 'pay', 'PO1', NULL, 1);
SELECT count(*) FROM payidem.idempotency;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
UPDATE payidem.idempotency SET status = 'failed' WHERE idem_key = 'rt:app:1';
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_purge('0');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
RESET ROLE;
-- what a DBA's trigger on the table runs while the functions act as its
-- owner resolves no name in the caller's schemas (search_path is pinned for
-- the statements they run): the role's own now() is not called as the owner
BEGIN;
CREATE SCHEMA rt_app AUTHORIZATION regress_payidem_app;
CREATE TABLE public.rt_audit (at timestamptz, idem_key text);
CREATE FUNCTION public.rt_audit_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO public.rt_audit VALUES (now(), NEW.idem_key); RETURN NEW; END $$;
CREATE TRIGGER rt_audit AFTER INSERT OR UPDATE ON payidem.idempotency
  FOR EACH ROW EXECUTE FUNCTION public.rt_audit_row();
SET LOCAL ROLE regress_payidem_app;
CREATE FUNCTION rt_app.now() RETURNS timestamptz LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked: the caller''s now() ran as the owner'; END $$;
SET LOCAL search_path = rt_app, pg_catalog;
SELECT outcome FROM payidem.idem_claim('rt:app:2', 'pay', 'PO1', NULL, 1);
SELECT payidem.idem_finish('rt:app:2', 'completed', '{"ok": true}');
RESET ROLE;
RESET search_path;
SELECT count(*) AS audited, bool_and(at = now()) AS at_now FROM public.rt_audit;
ROLLBACK;
-- nothing of ours is executable by PUBLIC
SELECT p.oid::regprocedure AS idem_function, has_function_privilege('public', p.oid, 'EXECUTE') AS public_can_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'payidem'::regnamespace AND p.proname LIKE 'idem\_%'
 ORDER BY 1::text;
REVOKE ALL ON FUNCTION payidem.idem_claim(text, text, text, text, bigint, text, interval),
                       payidem.idem_finish(text, text, jsonb)
  FROM regress_payidem_app;
REVOKE USAGE ON SCHEMA payidem FROM regress_payidem_app;
DROP ROLE regress_payidem_app;

--
-- a table altered by hand: a CHECK constraint added is enforced by the next
-- claim (the compiled constraints are rebuilt); with a trigger on the table,
-- claims insert through the executor, so the trigger fires
--
BEGIN;
ALTER TABLE payidem.idempotency ADD CONSTRAINT idempotency_regress_no_x CHECK (order_no <> 'PO-X');
SELECT * FROM payidem.idem_claim('rt:alter:1', 'pay', 'PO-X', NULL, 1);
ROLLBACK;
\echo SQLSTATE :LAST_ERROR_SQLSTATE
BEGIN;
CREATE TABLE public.rt_seen (idem_key text);
CREATE FUNCTION rt_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.rt_seen VALUES (NEW.idem_key);
	RETURN NEW;
END $$;
CREATE TRIGGER rt_note BEFORE INSERT ON payidem.idempotency FOR EACH ROW EXECUTE FUNCTION rt_note();
SELECT outcome FROM payidem.idem_claim('rt:alter:2', 'pay', 'PO1', NULL, 1);
SELECT outcome FROM payidem.idem_claim('rt:alter:2', 'pay', 'PO1', NULL, 1);
SELECT * FROM rt_seen;
ROLLBACK;
-- and without them again, the direct path
SELECT outcome FROM payidem.idem_claim('rt:alter:3', 'pay', 'PO-X', NULL, 1);
-- a long IN list (evaluated through a hash table the expression keeps
-- between claims) checked on claim after claim
BEGIN;
ALTER TABLE payidem.idempotency ADD CONSTRAINT idempotency_regress_channels
	CHECK (channel IN ('C01', 'C02', 'C03', 'C04', 'C05', 'C06', 'C07', 'C08', 'C09', 'C10', 'WXPAY_001'));
SELECT string_agg(c.outcome, ' ') AS outcomes
  FROM generate_series(1, 5) AS i,
       LATERAL payidem.idem_claim('rt:alter:in:' || i, 'pay', 'PO1', CASE WHEN i % 2 = 0 THEN 'C0' || i ELSE 'WXPAY_001' END, 1) AS c;
SELECT * FROM payidem.idem_claim('rt:alter:in:9', 'pay', 'PO1', 'ALIPAY', 1);
ROLLBACK;
\echo SQLSTATE :LAST_ERROR_SQLSTATE

--
-- idem_record: idem_claim() and idem_finish(completed) in one write, for a
-- business effect committed in the same transaction
--
SELECT * FROM payidem.idem_record('rt:rec:1', 'pay', 'PO1', 'WXPAY_001', 1500, '{"outcome": "applied"}');
SELECT * FROM rt_rows WHERE idem_key LIKE 'rt:rec:%';
-- a duplicate replays what the first stored, and writes nothing; a new key
-- is one insert and no update
BEGIN;
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) AS writes_before
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass \gset
SELECT * FROM payidem.idem_record('rt:rec:1', 'pay', 'PO1', 'WXPAY_001', 1500, '{"outcome": "other"}');
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) - :writes_before AS writes
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass;
SELECT outcome FROM payidem.idem_record('rt:rec:0', 'pay', 'PO0', NULL, 1, '{}');
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del + n_tup_hot_upd), 0) - :writes_before AS writes
  FROM pg_stat_xact_user_tables WHERE relid = 'payidem.idempotency'::regclass;
ROLLBACK;
-- idem_claim() sees the same completed key
SELECT * FROM payidem.idem_claim('rt:rec:1', 'pay', 'PO1', 'WXPAY_001', 1500);
-- PI001: other parameters
SELECT * FROM payidem.idem_record('rt:rec:1', 'pay', 'PO1', 'WXPAY_001', 1600, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
-- in_progress: the key is held under a live lease by an idem_claim()
SELECT outcome FROM payidem.idem_claim('rt:rec:2', 'pay', 'PO1', NULL, 1);
SELECT * FROM payidem.idem_record('rt:rec:2', 'pay', 'PO1', NULL, 1, '{"outcome": "x"}');
-- failed: reclaimed and completed at once (attempts 2)
SELECT payidem.idem_finish('rt:rec:2', 'failed', '{"error": "timeout"}');
SELECT * FROM payidem.idem_record('rt:rec:2', 'pay', 'PO1', NULL, 1, '{"outcome": "retried"}');
-- an expired lease likewise
SELECT outcome FROM payidem.idem_claim('rt:rec:3', 'pay', 'PO1', NULL, 1, NULL, '1 millisecond');
SELECT pg_sleep(0.01);
SELECT * FROM payidem.idem_record('rt:rec:3', 'pay', 'PO1', NULL, 1, NULL);
SELECT * FROM rt_rows WHERE idem_key LIKE 'rt:rec:%';
-- rolled back with the effect: the key is gone too
BEGIN;
SELECT outcome FROM payidem.idem_record('rt:rec:4', 'pay', 'PO1', NULL, 1, '{}');
ROLLBACK;
SELECT count(*) AS rolled_back_keys FROM payidem.idempotency WHERE idem_key = 'rt:rec:4';
-- with a trigger on the table the row goes through the SQL insert, completed as well
BEGIN;
CREATE TABLE public.rt_seen (idem_key text, status text);
CREATE FUNCTION rt_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.rt_seen VALUES (NEW.idem_key, NEW.status);
	RETURN NEW;
END $$;
CREATE TRIGGER rt_note BEFORE INSERT ON payidem.idempotency FOR EACH ROW EXECUTE FUNCTION rt_note();
SELECT * FROM payidem.idem_record('rt:rec:5', 'pay', 'PO1', NULL, 1, '{"outcome": "applied"}');
SELECT * FROM rt_seen;
ROLLBACK;
-- 22023: the checks of idem_claim()
SELECT * FROM payidem.idem_record(NULL, 'pay', 'PO1', NULL, 1, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_record('rt:rec:6', NULL, 'PO1', NULL, 1, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT * FROM payidem.idem_record('rt:rec:6', 'pay', 'PO1', NULL, 0, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_input_keys FROM payidem.idempotency WHERE idem_key = 'rt:rec:6';

--
-- counters in payidem.stats(), as deltas over this test
--
SELECT s.name, s.value - b.value AS delta
  FROM payidem.stats() s JOIN stats_before b USING (name)
 ORDER BY s.name;

--
-- read-only transactions: a recorded key is answered, a new one is not written
--
SELECT outcome FROM payidem.idem_record('rt:ro:1', 'pay', 'PO1', NULL, 1, '{"ok": 1}');
BEGIN READ ONLY;
SELECT outcome, status, result FROM payidem.idem_claim('rt:ro:1', 'pay', 'PO1', NULL, 1);
SELECT * FROM payidem.idem_claim('rt:ro:2', 'pay', 'PO1', NULL, 1);
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM payidem.idem_record('rt:ro:3', 'pay', 'PO1', NULL, 1, '{}');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS read_only_keys_written FROM payidem.idempotency WHERE idem_key IN ('rt:ro:2', 'rt:ro:3');

--
-- a lease or a retention beyond any timestamp
--
SELECT * FROM payidem.idem_claim('rt:lease:1', 'pay', 'PO1', NULL, 1, NULL, '1000 years');
\echo SQLSTATE :LAST_ERROR_SQLSTATE
SELECT payidem.idem_purge('7000 years') AS purged_beyond_any_key;

DELETE FROM payidem.idempotency WHERE idem_key LIKE 'rt:%';
DROP VIEW rt_rows;
DROP TABLE stats_before;
