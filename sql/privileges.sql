--
-- privileges: nothing is granted to PUBLIC.  A plain role can read or write
-- nothing of payidem's, even when someone grants it USAGE on the schema.
--
\set VERBOSITY terse
CREATE ROLE regress_payidem_plain LOGIN;

SET ROLE regress_payidem_plain;
SELECT count(*) FROM payidem.merchant;
RESET ROLE;

GRANT USAGE ON SCHEMA payidem TO regress_payidem_plain;
SET ROLE regress_payidem_plain;
SELECT count(*) FROM payidem.merchant;
SELECT count(*) FROM payidem.merchant_secret;
SELECT count(*) FROM payidem.channel_config;
SELECT order_no FROM payidem."order";
INSERT INTO payidem.channel (channel_no, channel_type, fee_rate) VALUES ('EVIL_001', 'wechat', 0);
UPDATE payidem.transition SET to_status = 'paid';
DELETE FROM payidem.state;
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'closed', 'paid');
TRUNCATE payidem.status_log;
UPDATE payidem.idempotency SET status = 'completed';
SELECT nextval('payidem.status_log_log_id_seq');
-- the day of a daily limit does not move with the caller's session
SET payidem.limit_timezone = 'Pacific/Kiritimati';
SET payidem.bill_timezone = 'Asia/Shanghai';
RESET payidem.bill_timezone;
RESET ROLE;

-- no ACL entry for PUBLIC (grantee 0) on any table, sequence or function
SELECT c.relname, a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'payidem'::regnamespace AND a.grantee = 0;
-- every table and sequence has an explicit ACL (no default PUBLIC rights)
SELECT relname FROM pg_class
 WHERE relnamespace = 'payidem'::regnamespace AND relkind IN ('r', 'S') AND relacl IS NULL;
-- functions: a NULL proacl means EXECUTE for PUBLIC, so it must not be NULL
SELECT p.oid::regprocedure AS executable_by_public
  FROM pg_proc p
 WHERE p.pronamespace = 'payidem'::regnamespace
   AND (p.proacl IS NULL
        OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                    WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'));
-- the schema itself: no USAGE for PUBLIC
SELECT a.privilege_type FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE n.nspname = 'payidem' AND a.grantee = 0;

REVOKE USAGE ON SCHEMA payidem FROM regress_payidem_plain;
DROP ROLE regress_payidem_plain;
