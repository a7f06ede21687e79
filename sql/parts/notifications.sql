------------------------------------------------------------------------------
-- Merchant notifications: one event per order.paid, refund.succeeded and
-- order.closed, written by the status_notify triggers (below) in the
-- transaction of the change, whoever makes it (a flow function, its C fast
-- path, a DBA's transit_order()).  The payload is built once, when the event
-- is written, and never again: it says the state at the event.  Then their
-- signature, notify_due(), notify_result() and verify_notification().
------------------------------------------------------------------------------

-- The event of an order that became paid or closed, or of a refund that
-- succeeded: src/notify.c, the one place an event's row and payload are
-- made and the one place it is decided which changes have one
-- (docs/notifications.md).  Not SECURITY DEFINER: it switches to the tables'
-- owner itself, so that the event is written whoever changed the row,
-- without a setting saved and restored on every call; it reads by key and
-- writes the event directly (src/direct.c), without SQL.
CREATE FUNCTION payidem._status_event()
RETURNS trigger
LANGUAGE c
AS 'MODULE_PATHNAME', 'payidem_status_event';
COMMENT ON FUNCTION payidem._status_event() IS
	'Trigger status_notify on payidem."order" and payidem.refund: the notification event of the change, with its payload (docs/notifications.md).';

-- Named to fire after status_guard and status_ledger (AFTER triggers fire in
-- name order): a change they refuse writes no event.  No WHEN clause: the
-- function returns at once for a change it does not report (a WHEN clause
-- would be read from the catalog and planned at every direct update of the
-- payment flow, which builds its executor state per call).
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem."order"
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem.refund
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();

-- The signature: t=<unix seconds>,v1=<hex>,v2=<hex>, one v1 and v2 per secret
-- of the merchant valid now (two pairs during a rotation's grace period, the
-- current secret's first).  v2 = HMAC-SHA256(secret, "payidem-notification-v2"
-- NUL "<t>.<payload>") (_notify_v2_sign), which no sign() signature can be;
-- v1 = HMAC-SHA256(secret, "<t>.<payload>"), which is sign()'s of that text,
-- is kept for the receivers written for 1.0 and will be retired in a major
-- version (docs/notifications.md).  The only place a notification is signed:
-- src/notify.c, with the secrets _secrets_valid_now() names (each opened once
-- for both MACs).
CREATE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_sign_notification'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION payidem._sign_notification(text, text) IS
	'Internal: the signature header of a notification payload, signed now: t, then v1 and v2 of each secret valid now (docs/notifications.md).';

-- notify_due(): src/notify.c, with the retry schedule notify_result() follows:
-- the one place it is decided what becomes of a due event (handed out and
-- leased, given up, or left to wait).  C, acting as the tables' owner itself,
-- with its statements prepared once per session.
CREATE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
AS 'MODULE_PATHNAME', 'payidem_notify_due'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...,v2=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

-- notify_result(): src/notify.c, beside notify_due() and the retry schedule
-- both follow; under READ COMMITTED a direct update of the event's row, as
-- the one UPDATE it was would have made.
CREATE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_notify_result'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION payidem.notify_result(bigint, boolean, text, integer) IS
	'Report one delivery attempt of an event: ok = sent; not ok = retry after 15s, 15s, 30s, 3m, 10m, 20m, 30m, 30m, 30m, 60m, 3h, 3h, 3h, 6h, 6h, then failed (16 attempts); the start of a failure''s response is kept. No change if the event is no longer pending, or if attempt (as notify_due() handed it out) is given and is not the last one handed out. PI009 unknown event.';

-- The receiver's check, for tests and for merchants running PostgreSQL: a
-- signature header of the payload under a secret of api_key valid now, made
-- at most tolerance ago (or ahead: clocks differ).  Only v2 is checked: v1 is
-- sign()'s HMAC of "<t>.<payload>", which a merchant's own signed request of
-- that shape also is.  Other schemes in the header (v1 too) are ignored, as a
-- receiver should.
CREATE FUNCTION payidem.verify_notification(api_key text, payload text, signature text,
											tolerance interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_part text;
	v_t text;
	v_sigs text[] := '{}';
	v_sig text;
	s payidem.merchant_secret;
	ok boolean := false;
BEGIN
	IF tolerance IS NULL OR tolerance < interval '0' THEN
		PERFORM payidem._raise_invalid('invalid tolerance',
			format('tolerance was %s; it must be zero or more.', coalesce(tolerance::text, 'NULL')),
			'Pass how old a notification may be, e.g. ''5 minutes''.');
	END IF;
	IF api_key IS NULL OR payload IS NULL OR signature IS NULL OR length(signature) > 1024 THEN
		RETURN false;
	END IF;
	FOREACH v_part IN ARRAY string_to_array(signature, ',') LOOP
		IF v_part ~ '^t=[0-9]{1,12}$' THEN
			IF v_t IS NOT NULL THEN
				RETURN false;		-- two timestamps: which one was signed?
			END IF;
			v_t := substr(v_part, 3);
		ELSIF v_part ~ '^v2=[0-9a-f]{64}$' THEN
			v_sigs := v_sigs || substr(v_part, 4);
		END IF;
	END LOOP;
	IF v_t IS NULL OR cardinality(v_sigs) = 0
	   OR abs(floor(extract(epoch FROM now())) - v_t::numeric) > extract(epoch FROM tolerance) THEN
		RETURN false;
	END IF;
	FOR s IN
		SELECT v.* FROM payidem.merchant m, payidem._secrets_valid_now(m.merchant_no) v
		 WHERE m.api_key OPERATOR(pg_catalog.=) verify_notification.api_key
	LOOP
		-- no early exit: the time taken does not say which secret or v2 matched
		FOREACH v_sig IN ARRAY v_sigs LOOP
			ok := payidem._notify_v2_verify(payidem._secret_aad(s.merchant_no, s.secret_version),
											s.key_version, s.nonce, s.ciphertext, s.auth_tag,
											v_t || '.' || payload, v_sig) OR ok;
		END LOOP;
	END LOOP;
	RETURN ok;
END
$$;
COMMENT ON FUNCTION payidem.verify_notification(text, text, text, interval) IS
	'true if a v2 of the signature header (t=...,v1=...,v2=...) signs its t and the payload under a secret of api_key valid now and t is within tolerance of now; false otherwise (a stale t, a changed byte, a rotated-out secret, a closed merchant, a header with no v2: v1 is not checked, since a sign() signature of "<t>.<payload>" is one).';

