--
-- notifications: the merchant-notification outbox (DESIGN §7).  One event per
-- order.paid, refund.succeeded and order.closed, written in the transaction of
-- the change; its payload byte for byte; its signature recomputed here with
-- pgcrypto's hmac() (in this test only: payidem itself needs no extension);
-- verify_notification() as a receiver uses it.
-- Generated numbers, ids and times are never printed, only compared.
--
CREATE EXTENSION IF NOT EXISTS payidem;
CREATE EXTENSION IF NOT EXISTS pgcrypto;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- a payload with what changes from run to run masked: ids, numbers, times
CREATE FUNCTION pg_temp.masked(payload text)
RETURNS text
LANGUAGE sql AS $$
	SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(payload,
		'"event_id":[0-9]+', '"event_id":<id>'),
		'"M[0-9A-HJKMNP-TV-Z]{15}"', '"<merchant_no>"'),
		'"(PO|PY|RF)[0-9]{24}"', '"\1<number>"', 'g'),
		'"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z"', '"<utc time>"', 'g')
$$;
-- UTC ISO 8601 with microseconds, as a receiver in any language would parse it
CREATE FUNCTION pg_temp.iso(t timestamptz)
RETURNS text
LANGUAGE sql AS $$ SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;
-- what a receiver computes from the raw body and the header's t: v2 is the
-- HMAC of "payidem-notification-v2", a NUL byte, t, a dot and the body; v1
-- (kept for receivers written for 1.0) of t, a dot and the body
CREATE FUNCTION pg_temp.expected_v2(secret text, t text, payload text)
RETURNS text
LANGUAGE sql AS $$
	SELECT encode(hmac(convert_to('payidem-notification-v2', 'UTF8') || '\x00'::bytea
					   || convert_to(t || '.' || payload, 'UTF8'),
					   convert_to(secret, 'UTF8'), 'sha256'), 'hex')
$$;
CREATE FUNCTION pg_temp.expected_v1(secret text, t text, payload text)
RETURNS text
LANGUAGE sql AS $$ SELECT encode(hmac(t || '.' || payload, secret, 'sha256'), 'hex') $$;

-- counters before (stats(): this database and the whole server)
CREATE TEMP TABLE stats_before AS SELECT name, value FROM payidem.stats();

------------------------------------------------------------------------ set-up
SELECT merchant_no AS m, api_key AS k, api_secret AS secret1
  FROM payidem.create_merchant('Notify Tea', 'retail', 0.006) \gset
SELECT payidem.create_channel('NT_WX', 'wechat', 0.002);
SELECT payidem.create_channel('NT_ALI', 'alipay', 0.002);
SELECT payidem.bind_channel(:'m', 'NT_WX');
SELECT payidem.bind_channel(:'m', 'NT_ALI');

---------------------------------------------------------------------- the story
-- an order; a failed attempt; a success on another channel; two partial
-- refunds and a full refund; and a second order, closed unpaid
SELECT payidem.create_order(:'m', 'NT-0001', 10000, 'Tea set "Jade" 茶具', 'https://nt.example/notify') AS o \gset
SELECT count(*) AS events_of_a_new_order FROM payidem.notify_event WHERE order_no = :'o';
SELECT payidem.begin_payment(:'o', 'NT_WX') AS p1 \gset
SELECT payidem.apply_payment_result(:'p1', 'callback', 'failed') AS failed_attempt;
SELECT count(*) AS events_after_a_failure FROM payidem.notify_event WHERE order_no = :'o';
SELECT payidem.begin_payment(:'o', 'NT_ALI') AS p2 \gset
SELECT payidem.apply_payment_result(:'p2', 'callback', 'succeeded', 'ALI-TXN-0001', 10000) AS success;
SELECT payidem.apply_payment_result(:'p2', 'query', 'succeeded', 'ALI-TXN-0001', 10000) AS repeated_success;
SELECT payidem.refund(:'p2', 3000, 'NT-R1', 'one cup broken') AS r1 \gset
SELECT payidem.apply_refund_result(:'r1', 'succeeded', 'ALI-RF-1') AS refund_1;
SELECT payidem.apply_refund_result(:'r1', 'succeeded', 'ALI-RF-1') AS refund_1_again;
SELECT payidem.refund(:'p2', 2000, 'NT-R2') AS r2 \gset
SELECT payidem.apply_refund_result(:'r2', 'succeeded') AS refund_2;
-- a refund that fails is no event
SELECT payidem.refund(:'p2', 5000, 'NT-R3') AS r3 \gset
SELECT payidem.apply_refund_result(:'r3', 'failed') AS refund_3_failed;
SELECT payidem.refund(:'p2', 5000, 'NT-R4') AS r4 \gset
SELECT payidem.apply_refund_result(:'r4', 'succeeded') AS refund_4_full;
SELECT payidem.create_order(:'m', 'NT-0002', 500, 'Sample', 'https://nt.example/notify') AS o2 \gset
SELECT payidem.close_order(:'o2') AS closed;
SELECT payidem.close_order(:'o2') AS closed_again;

-- one event per change, in order, each pending and due now
SELECT event, order_no = :'o' AS first_order, refund_no IS NOT NULL AS has_refund, status, attempts,
       next_attempt_at = created_at AS due_at_once, event_id % 100 AS shard
  FROM payidem.notify_event WHERE merchant_no = :'m' ORDER BY event_id;
SELECT refund_no = :'r1' AS r1, refund_no = :'r2' AS r2, refund_no = :'r4' AS r4
  FROM payidem.notify_event WHERE event = 'refund.succeeded' AND merchant_no = :'m' ORDER BY event_id;

-- each payload, byte for byte: JSON text, keys in a fixed order, no spaces,
-- times in UTC, the state at that event (not the order's state now)
SELECT event, pg_temp.masked(payload) AS payload
  FROM payidem.notify_event WHERE merchant_no = :'m' ORDER BY event_id;
-- and the same bytes built here from the rows, field by field
SELECT e.event, e.payload = format(
		'{"event_id":%s,"event":"%s","created_at":"%s","merchant_no":"%s","order_no":"%s","out_trade_no":"%s",'
		'"amount":%s,"currency":"CNY","status":"%s"%s}',
		e.event_id, e.event, pg_temp.iso(e.created_at), :'m', o.order_no, o.out_trade_no, o.amount,
		CASE e.event WHEN 'order.paid' THEN 'paid' WHEN 'order.closed' THEN 'closed'
			 ELSE CASE WHEN r.refund_no = :'r4' THEN 'refunded' ELSE 'partially_refunded' END END,
		CASE WHEN e.event = 'order.closed' THEN ''
			 ELSE format(',"payment_no":"%s","transaction_id":"ALI-TXN-0001","paid_at":"%s"', :'p2', pg_temp.iso(p.paid_at)) END
		|| CASE WHEN r.refund_no IS NULL THEN ''
				ELSE format(',"refund_no":"%s","refund_amount":%s,"refunded_amount":%s', r.refund_no, r.amount,
							(SELECT sum(x.amount) FROM payidem.refund x
							  WHERE x.payment_no = :'p2' AND x.status = 'succeeded' AND x.refund_no <= r.refund_no)) END
	   ) AS byte_for_byte,
	   e.payload::jsonb ->> 'created_at' = pg_temp.iso(e.created_at) AS created_at_utc
  FROM payidem.notify_event e
  JOIN payidem."order" o USING (order_no)
  LEFT JOIN payidem.payment p ON p.payment_no = :'p2' AND e.event <> 'order.closed'
  LEFT JOIN payidem.refund r USING (refund_no)
 WHERE e.merchant_no = :'m' ORDER BY e.event_id;
-- JSON any parser reads, but not the text a parser writes back: sign and
-- verify the raw bytes
SELECT bool_and(payload::jsonb IS NOT NULL) AS all_parse,
       bool_and(payload::jsonb::text <> payload) AS not_jsonb_text
  FROM payidem.notify_event WHERE merchant_no = :'m';

------------------------------------------------------------------ the signature
-- notify_due hands out each event with a header t=<unix seconds>,v1=<hex>,v2=<hex>,
-- v2 = HMAC-SHA256(secret, "payidem-notification-v2" NUL "<t>.<payload>"),
-- v1 = HMAC-SHA256(secret, "<t>.<payload>"), both recomputed here with pgcrypto
CREATE TEMP TABLE handed AS SELECT * FROM payidem.notify_due(100) WHERE merchant_no = :'m';
SELECT count(*) AS handed, count(DISTINCT event_id) AS distinct_events,
       bool_and(signature ~ '^t=[0-9]{10},v1=[0-9a-f]{64},v2=[0-9a-f]{64}$') AS header_shape,
       bool_and(abs(substring(signature FROM '^t=([0-9]+)')::bigint - extract(epoch FROM now())) <= 2) AS t_is_now,
       bool_and(substring(signature FROM 'v2=([0-9a-f]{64})') =
                pg_temp.expected_v2(:'secret1', substring(signature FROM '^t=([0-9]+)'), payload)) AS v2_recomputed,
       bool_and(substring(signature FROM 'v1=([0-9a-f]{64})') =
                pg_temp.expected_v1(:'secret1', substring(signature FROM '^t=([0-9]+)'), payload)) AS v1_recomputed,
       bool_and(payload = (SELECT e.payload FROM payidem.notify_event e WHERE e.event_id = handed.event_id)) AS payload_as_stored,
       bool_and(notify_url = 'https://nt.example/notify' AND attempt = 1) AS url_and_attempt
  FROM handed;
SELECT event FROM handed ORDER BY event_id;

----------------------------------------------------------- verify_notification
SELECT bool_and(payidem.verify_notification(:'k', payload, signature)) AS accepted FROM handed;
SELECT payload AS pl, signature AS sig FROM handed WHERE event = 'order.paid' \gset
SELECT floor(extract(epoch FROM now()))::bigint AS now_t, substring(:'sig' FROM '^t=([0-9]+)')::bigint AS sig_t \gset
-- a changed byte anywhere in the body, the header's t or its v2
SELECT payidem.verify_notification(:'k', replace(:'pl', '10000', '10001'), :'sig') AS amount_changed,
       payidem.verify_notification(:'k', :'pl' || ' ', :'sig') AS trailing_space,
       payidem.verify_notification(:'k', (:'pl'::jsonb)::text, :'sig') AS reserialised_by_a_parser,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', '^t=([0-9]+)', 't=' || (:sig_t + 1))) AS t_changed,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', '.$', 'x')) AS v2_changed,
       payidem.verify_notification('no-such-key', :'pl', :'sig') AS unknown_key;
-- the replay window: a header signed 10 minutes ago (or ahead) is refused
-- with the default tolerance of 5 minutes, accepted with 15
SELECT payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t - 600, pg_temp.expected_v2(:'secret1', (:now_t - 600)::text, :'pl'))) AS stale,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t - 600, pg_temp.expected_v2(:'secret1', (:now_t - 600)::text, :'pl')),
           '15 minutes') AS stale_within_15_minutes,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t + 600, pg_temp.expected_v2(:'secret1', (:now_t + 600)::text, :'pl'))) AS ahead,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t - 200, pg_temp.expected_v2(:'secret1', (:now_t - 200)::text, :'pl'))) AS within_5_minutes;
-- the header's grammar: other schemes are ignored (v1 too), one t only, any
-- v2 may match
SELECT payidem.verify_notification(:'k', :'pl', :'sig' || ',v0=abc') AS other_scheme_ignored,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', ',v1=[0-9a-f]{64}', ',v1=' || repeat('0', 64))) AS v1_changed_ignored,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', ',v1=[0-9a-f]{64}', '')) AS without_v1,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s,v2=%s', :now_t, repeat('0', 64), pg_temp.expected_v2(:'secret1', :now_t::text, :'pl'))) AS second_v2_matches,
       payidem.verify_notification(:'k', :'pl', :'sig' || ',t=' || :now_t) AS two_timestamps,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', ',v2=.*$', '')) AS no_v2,
       payidem.verify_notification(:'k', :'pl', regexp_replace(:'sig', '^t=[0-9]+,', '')) AS no_t,
       payidem.verify_notification(:'k', :'pl', upper(:'sig')) AS upper_case;

-------------------------------------------- sign() and a notification apart
-- v1 is sign()'s HMAC of "<t>.<payload>": a request body of that shape a
-- merchant had signed with sign() (or anyone able to call sign()) is a valid
-- v1.  verify_notification() checks v2 only, so it is refused: as v1, as v2,
-- in a header with both; and a notification's v2 is no sign() signature of
-- its "<t>.<payload>" either.
SELECT payidem.sign(:'m', :now_t || '.' || :'pl') AS signed_body \gset
SELECT :'signed_body' = pg_temp.expected_v1(:'secret1', :now_t::text, :'pl') AS sign_is_a_v1,
       payidem.verify_notification(:'k', :'pl', format('t=%s,v1=%s', :now_t, :'signed_body')) AS sign_as_v1,
       payidem.verify_notification(:'k', :'pl', format('t=%s,v2=%s', :now_t, :'signed_body')) AS sign_as_v2,
       payidem.verify_notification(:'k', :'pl', format('t=%s,v1=%s,v2=%s', :now_t, :'signed_body', :'signed_body')) AS sign_as_both,
       payidem.verify_notification(:'k', :'pl', format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret1', :now_t::text, :'pl'))) AS real_v2,
       payidem.verify_signature(:'k', :sig_t || '.' || :'pl', substring(:'sig' FROM 'v2=([0-9a-f]{64})')) AS v2_as_sign;

-------------------------------------------------------------- a secret rotation
-- during the grace period the header carries a v1 and a v2 for each secret
-- valid now, the new secret's first: a receiver that has either secret accepts it
SELECT payidem.rotate_merchant_secret(:'m', '1 hour') AS secret2 \gset
UPDATE payidem.notify_event SET next_attempt_at = now() WHERE event_id = (SELECT event_id FROM handed WHERE event = 'order.paid');
SELECT signature AS sig2 FROM payidem.notify_due(100) WHERE merchant_no = :'m' \gset
SELECT :'sig2' ~ '^t=[0-9]{10}(,v1=[0-9a-f]{64},v2=[0-9a-f]{64}){2}$' AS two_pairs,
       split_part(:'sig2', ',', 2) = 'v1=' || pg_temp.expected_v1(:'secret2', substring(:'sig2' FROM '^t=([0-9]+)'), :'pl') AND
       split_part(:'sig2', ',', 3) = 'v2=' || pg_temp.expected_v2(:'secret2', substring(:'sig2' FROM '^t=([0-9]+)'), :'pl') AS new_secret_first,
       split_part(:'sig2', ',', 4) = 'v1=' || pg_temp.expected_v1(:'secret1', substring(:'sig2' FROM '^t=([0-9]+)'), :'pl') AND
       split_part(:'sig2', ',', 5) = 'v2=' || pg_temp.expected_v2(:'secret1', substring(:'sig2' FROM '^t=([0-9]+)'), :'pl') AS old_secret_second,
       payidem.verify_notification(:'k', :'pl', :'sig2') AS accepted;
-- a header from either secret alone is accepted during the grace period
SELECT payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret1', :now_t::text, :'pl'))) AS old_secret_in_grace,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret2', :now_t::text, :'pl'))) AS new_secret;
-- rotated again without grace: the first secret has ended, the second too
SELECT payidem.rotate_merchant_secret(:'m', '0 seconds') AS secret3 \gset
SELECT payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret1', :now_t::text, :'pl'))) AS rotated_out_secret,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret2', :now_t::text, :'pl'))) AS secret_with_no_grace,
       payidem.verify_notification(:'k', :'pl',
           format('t=%s,v2=%s', :now_t, pg_temp.expected_v2(:'secret3', :now_t::text, :'pl'))) AS current_secret;
UPDATE payidem.notify_event SET next_attempt_at = now() WHERE event_id = (SELECT event_id FROM handed WHERE event = 'order.paid');
SELECT signature ~ '^t=[0-9]{10},v1=[0-9a-f]{64},v2=[0-9a-f]{64}$' AS one_pair_again,
       substring(signature FROM 'v2=([0-9a-f]{64})') = pg_temp.expected_v2(:'secret3', substring(signature FROM '^t=([0-9]+)'), payload) AND
       substring(signature FROM 'v1=([0-9a-f]{64})') = pg_temp.expected_v1(:'secret3', substring(signature FROM '^t=([0-9]+)'), payload) AS signed_with_current
  FROM payidem.notify_due(100) WHERE merchant_no = :'m';

------------------------------------------------------- only what was committed
-- an event written in a transaction that rolls back does not exist
BEGIN;
SELECT payidem.create_order(:'m', 'NT-0003', 800, 'Rolled back', 'https://nt.example/notify') AS o3 \gset
SELECT payidem.close_order(:'o3') AS closed_in_transaction;
SELECT count(*) AS events_inside FROM payidem.notify_event WHERE order_no = :'o3';
ROLLBACK;
SELECT count(*) AS events_after_rollback FROM payidem.notify_event WHERE order_no = :'o3';
-- a change any writer makes is notified: a DBA's transit_order()
SELECT payidem.create_order(:'m', 'NT-0004', 800, 'Closed by a DBA', 'https://nt.example/notify') AS o4 \gset
SELECT payidem.transit_order(:'o4', 'closed') AS dba_closed;
SELECT event, pg_temp.masked(payload) AS payload FROM payidem.notify_event WHERE order_no = :'o4';
-- an order without a notify_url has no events
SELECT payidem.create_order(:'m', 'NT-0005', 800, 'Silent') AS o5 \gset
SELECT payidem.close_order(:'o5') AS closed;
SELECT count(*) AS events_without_notify_url FROM payidem.notify_event WHERE order_no = :'o5';

---------------------------------------------------------------------- backlog
-- (the other tests' events set aside, in a transaction rolled back)
BEGIN;
UPDATE payidem.notify_event SET status = 'sent', next_attempt_at = NULL WHERE merchant_no <> :'m';
UPDATE payidem.notify_event SET status = 'failed', next_attempt_at = NULL, attempts = 16
 WHERE order_no = :'o2';
UPDATE payidem.notify_event SET attempts = 2, next_attempt_at = now() - interval '90 seconds'
 WHERE order_no = :'o'  AND event = 'order.paid';
SELECT status, attempts, events, due_now, oldest_due_at IS NOT NULL AS has_due,
       behind_by >= interval '90 seconds' AS behind_90s, oldest_event_at IS NOT NULL AS has_oldest
  FROM payidem.notification_backlog;
ROLLBACK;

------------------------------------------------------------- nothing unsigned
-- a merchant with no API secret valid now (here: ended by hand) gets no
-- unsigned delivery: the event waits 5 minutes, this was no attempt
BEGIN;
UPDATE payidem.merchant_secret SET valid_until = valid_from + interval '1 microsecond'
 WHERE merchant_no = :'m' AND valid_until IS NULL;
UPDATE payidem.notify_event SET next_attempt_at = now() - interval '1 second' WHERE order_no = :'o2';
SELECT count(*) AS handed_out FROM payidem.notify_due(100) WHERE merchant_no = :'m';
SELECT status, attempts, next_attempt_at > now() + interval '4 minutes' AS waits, last_response
  FROM payidem.notify_event WHERE order_no = :'o2';
ROLLBACK;
-- an application role (EXECUTE only: grant_app) takes events as the tables'
-- owner, and a session whose search_path puts look-alike operators and types
-- first changes nothing in what notify_due() reads, decides or signs
BEGIN;
CREATE ROLE regress_nt_app;
SELECT count(*) > 0 AS app_granted FROM payidem.grant_app('regress_nt_app');
CREATE FUNCTION public.nt_evil(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked: a look-alike operator was called'; END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, PROCEDURE = public.nt_evil);
CREATE FUNCTION public.nt_evil_ts(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked: a look-alike operator was called'; END $$;
CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, PROCEDURE = public.nt_evil_ts);
CREATE DOMAIN public.text AS pg_catalog.varchar(1) CHECK (false);
UPDATE payidem.notify_event SET next_attempt_at = now() - interval '1 second' WHERE order_no = :'o2';
SET LOCAL search_path = public, pg_catalog;
SET LOCAL ROLE regress_nt_app;
-- (the test's own comparison names pg_catalog's operator: its search_path is hostile too)
CREATE TEMP TABLE handed_as_app AS
  SELECT * FROM payidem.notify_due(100) WHERE order_no OPERATOR(pg_catalog.=) :'o2';
RESET ROLE;
RESET search_path;
SELECT count(*) AS handed_out, bool_and(attempt = 2) AS second_attempt,
       bool_and(payidem.verify_notification(:'k', payload, signature)) AS verifies
  FROM handed_as_app;
ROLLBACK;
-- what a DBA's trigger on notify_event runs while notify_due() and
-- notify_result() act as the tables' owner resolves no name in the caller's
-- schemas: search_path is pinned as a SECURITY DEFINER function's SET clause
-- pins it (an application role's own now() would otherwise run as the owner)
BEGIN;
CREATE ROLE regress_nt_app3;
SELECT count(*) > 0 AS app_granted FROM payidem.grant_app('regress_nt_app3');
CREATE SCHEMA nt_app3 AUTHORIZATION regress_nt_app3;
CREATE TABLE public.nt_audit (at timestamptz, status text);
CREATE FUNCTION public.nt_audit_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO public.nt_audit VALUES (now(), NEW.status); RETURN NEW; END $$;
CREATE TRIGGER nt_audit AFTER UPDATE ON payidem.notify_event
  FOR EACH ROW EXECUTE FUNCTION public.nt_audit_row();
UPDATE payidem.notify_event SET next_attempt_at = now() - interval '1 second' WHERE order_no = :'o2';
SET LOCAL ROLE regress_nt_app3;
CREATE FUNCTION nt_app3.now() RETURNS timestamptz LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'hijacked: the caller''s now() ran as the owner'; END $$;
SET LOCAL search_path = nt_app3, pg_catalog;
SELECT count(*) AS handed_out, count(payidem.notify_result(event_id, false, 'HTTP 502', attempt)) AS reported
  FROM payidem.notify_due(100) WHERE order_no OPERATOR(pg_catalog.=) :'o2';
RESET ROLE;
RESET search_path;
-- (the set-up's update, the lease and the report; each trigger run saw pg_catalog's now())
SELECT count(*) AS audited_updates, bool_and(at = now()) AS at_now FROM public.nt_audit;
ROLLBACK;
-- a DBA's BEFORE UPDATE trigger that keeps an event as it is: the report
-- changes nothing and counts nothing
BEGIN;
CREATE FUNCTION public.nt_keep() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
SELECT e.event_id AS kept_event, e.attempts AS kept_attempt FROM payidem.notify_event e
 WHERE e.order_no = :'o2' AND e.status = 'pending' \gset
CREATE TEMP TABLE nt_sent_before AS SELECT value FROM payidem.stats() WHERE name = 'notify_sent';
CREATE TRIGGER nt_keep BEFORE UPDATE ON payidem.notify_event FOR EACH ROW EXECUTE FUNCTION public.nt_keep();
SELECT count(payidem.notify_result(:kept_event, true)) AS reported;
SELECT e.status, (SELECT s.value - b.value FROM payidem.stats() s, nt_sent_before b WHERE s.name = 'notify_sent') AS sent_counted
  FROM payidem.notify_event e WHERE e.event_id = :kept_event;
ROLLBACK;
-- a closed merchant's due event is given up, not handed out, and takes no
-- place in the batch: an older event of a closed merchant ahead of another
-- merchant's does not stop that one from being handed out with max_rows 1
BEGIN;
SELECT merchant_no AS m_closed FROM payidem.create_merchant('Closing Shop', 'retail', 0.006) \gset
SELECT payidem.bind_channel(:'m_closed', 'NT_WX') IS NULL AS bound;
SELECT payidem.apply_payment_result(payidem.begin_payment(
		payidem.create_order(:'m_closed', 'NT-CLOSED-' || i, 100, 'Closed', 'https://closing.example/notify'),
		'NT_WX'), 'callback', 'succeeded', 'TX-NT-CLOSED-' || i, 100) AS closed_shop_paid
  FROM generate_series(1, 2) i;
-- (the second's 16th attempt was handed out a minute ago and never answered)
UPDATE payidem.notify_event e SET next_attempt_at = now() - interval '2 seconds' WHERE merchant_no = :'m_closed';
UPDATE payidem.notify_event e SET attempts = 16, last_attempt_at = now() - interval '1 minute'
  FROM payidem."order" o WHERE o.order_no = e.order_no AND o.out_trade_no = 'NT-CLOSED-2';
UPDATE payidem.notify_event SET next_attempt_at = now() - interval '1 second' WHERE order_no = :'o2';
SELECT payidem.close_merchant(:'m_closed') IS NULL AS closed;
SELECT order_no = :'o2' AS handed_out_o2 FROM payidem.notify_due(1);
SELECT o.out_trade_no, e.status, e.attempts, e.next_attempt_at,
       coalesce((now() - e.last_attempt_at)::text, 'never handed out') AS last_attempt, e.last_response
  FROM payidem.notify_event e JOIN payidem."order" o USING (order_no)
 WHERE e.merchant_no = :'m_closed' ORDER BY o.out_trade_no;
ROLLBACK;
-- the 16th attempt handed out and never answered (its worker died): given up
-- when its lease ends, not handed out a 17th time
BEGIN;
UPDATE payidem.notify_event SET attempts = 16, next_attempt_at = now() - interval '1 second' WHERE order_no = :'o2';
SELECT count(*) AS handed_out FROM payidem.notify_due(100) WHERE order_no = :'o2';
SELECT status, attempts, next_attempt_at, last_response FROM payidem.notify_event WHERE order_no = :'o2';
ROLLBACK;

-- notify_due() reads the head of the due events by notify_event_due where
-- that index is the one it expects, and by a scan where a DBA changed it: the
-- same events in the same order, the oldest due first -- also where a
-- stricter predicate would hide some (an index read as it is would miss the
-- events on their third attempt here), or a descending one would give the
-- newest first
BEGIN;
-- (every one at a time of its own, in another order than the events': the
-- order of equal times is left open, as the statement's ORDER BY left it)
UPDATE payidem.notify_event e SET next_attempt_at = now() - (r.n * 7919 % 100003 + 1) * interval '1 millisecond'
  FROM (SELECT event_id, row_number() OVER (ORDER BY event_id) AS n
          FROM payidem.notify_event WHERE status = 'pending') r
 WHERE e.event_id = r.event_id;
UPDATE payidem.notify_event SET attempts = 2 WHERE status = 'pending' AND event_id % 2 = 0;
SELECT count(*) >= 4 AS enough_due, count(*) FILTER (WHERE attempts = 2) > 0 AS some_on_third,
       count(DISTINCT next_attempt_at) = count(*) AS times_distinct
  FROM payidem.notify_event WHERE status = 'pending';
CREATE TEMP TABLE nt_due_order AS
SELECT array_agg(event_id ORDER BY next_attempt_at) AS expected
  FROM payidem.notify_event WHERE status = 'pending' AND next_attempt_at <= now();
SAVEPOINT before_due;
SELECT array_agg(d.event_id ORDER BY d.n) IS NOT DISTINCT FROM (SELECT expected FROM nt_due_order) AS direct_in_order
  FROM payidem.notify_due(100) WITH ORDINALITY AS d(event_id, order_no, merchant_no, notify_url, event,
                                                     payload, signature, attempt, n);
ROLLBACK TO SAVEPOINT before_due;
DROP INDEX payidem.notify_event_due;
SELECT array_agg(d.event_id ORDER BY d.n) IS NOT DISTINCT FROM (SELECT expected FROM nt_due_order) AS without_index_in_order
  FROM payidem.notify_due(100) WITH ORDINALITY AS d(event_id, order_no, merchant_no, notify_url, event,
                                                     payload, signature, attempt, n);
ROLLBACK TO SAVEPOINT before_due;
DROP INDEX payidem.notify_event_due;
CREATE INDEX notify_event_due ON payidem.notify_event (next_attempt_at) WHERE status = 'pending' AND attempts < 2;
SELECT array_agg(d.event_id ORDER BY d.n) IS NOT DISTINCT FROM (SELECT expected FROM nt_due_order) AS stricter_index_in_order
  FROM payidem.notify_due(100) WITH ORDINALITY AS d(event_id, order_no, merchant_no, notify_url, event,
                                                     payload, signature, attempt, n);
ROLLBACK TO SAVEPOINT before_due;
DROP INDEX payidem.notify_event_due;
CREATE INDEX notify_event_due ON payidem.notify_event (next_attempt_at DESC) WHERE status = 'pending';
SELECT array_agg(d.event_id ORDER BY d.n) IS NOT DISTINCT FROM (SELECT expected FROM nt_due_order) AS descending_index_in_order
  FROM payidem.notify_due(100) WITH ORDINALITY AS d(event_id, order_no, merchant_no, notify_url, event,
                                                     payload, signature, attempt, n);
ROLLBACK TO SAVEPOINT before_due;
DROP INDEX payidem.notify_event_due;
CREATE VIEW payidem.notify_event_due AS SELECT 1 AS one;
SELECT array_agg(d.event_id ORDER BY d.n) IS NOT DISTINCT FROM (SELECT expected FROM nt_due_order) AS not_an_index_in_order
  FROM payidem.notify_due(100) WITH ORDINALITY AS d(event_id, order_no, merchant_no, notify_url, event,
                                                     payload, signature, attempt, n);
ROLLBACK;

---------------------------------------------------------------------- counters
-- one answer of each kind, then what stats() counted over this test: payment
-- results by outcome (a repeated callback is a payment_duplicate), deliveries
-- by answer; this database's count never exceeds the server's
SELECT count(*) AS handed_out FROM payidem.notify_due(100) WHERE order_no = :'o4';
SELECT payidem.notify_result(event_id, true) FROM payidem.notify_event WHERE order_no = :'o4';
SELECT payidem.notify_result(event_id, false, 'HTTP 503') FROM payidem.notify_event
 WHERE order_no = :'o2' AND event = 'order.closed';
SELECT s.name, s.value - b.value AS delta
  FROM payidem.stats() s JOIN stats_before b USING (name)
 WHERE s.name ~ '^(payment|notify)_' ORDER BY s.name;
SELECT count(*) AS counters, count(*) FILTER (WHERE value IS NULL OR value > server_value) AS inconsistent
  FROM payidem.stats();

-- Event ids come from the order-number generator (they survive a failover as
-- numbers do): the shard's two digits last, then the per-second sequence
-- (0 to 49,999), then the second since 2026-01-01 UTC; below 2^53, so a
-- JavaScript receiver reads them exactly from the payload.
SELECT count(*) > 0 AS has_events,
       bool_and(event_id % 100 = current_setting('payidem.shard_id')::int) AS shard_last,
       bool_and(to_timestamp(1767225600 + event_id / 100 / 50000)
                BETWEEN date_trunc('second', created_at) - interval '1 second' AND created_at + interval '1 minute') AS second_of_creation,
       bool_and(event_id < 2::bigint ^ 53) AS exact_in_json,
       count(DISTINCT event_id) = count(*) AS distinct_ids
  FROM payidem.notify_event;
