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
-- version (docs/notifications.md).  The only place a notification is signed.
CREATE FUNCTION payidem._sign_notification(p_merchant_no text, p_payload text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_t text := floor(extract(epoch FROM now()))::bigint::text;
	v_sig text := 't=' || v_t;
	s payidem.merchant_secret;
BEGIN
	FOR s IN SELECT * FROM payidem._secrets_valid_now(p_merchant_no) ORDER BY secret_version DESC LOOP
		v_sig := v_sig || ',v1=' || payidem._hmac_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
														s.key_version, s.nonce, s.ciphertext, s.auth_tag,
														v_t || '.' || p_payload)
					   || ',v2=' || payidem._notify_v2_sign(payidem._secret_aad(s.merchant_no, s.secret_version),
															 s.key_version, s.nonce, s.ciphertext, s.auth_tag,
															 v_t || '.' || p_payload);
	END LOOP;
	RETURN v_sig;
END
$$;
COMMENT ON FUNCTION payidem._sign_notification(text, text) IS
	'Internal: the signature header of a notification payload, signed now: t, then v1 and v2 of each secret valid now (docs/notifications.md).';

CREATE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	v_max_attempts constant integer := 16;		-- notify_result()'s schedule has 15 waits
	v_left integer := max_rows;
	v_given_up bigint := 0;
	v_status text;
	n record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			'Pass how many events one worker takes at a time, e.g. 100.');
	END IF;
	-- The oldest due event no other worker holds, one at a time: each step
	-- is one look-up at the head of notify_event_due, whatever the backlog
	-- behind it (without parameters: planned once per session).  An event
	-- taken here is due no more in this transaction (leased, failed or
	-- waiting), so the next step finds the next one.
	WHILE v_left > 0 LOOP
		SELECT e.event_id, e.order_no, e.merchant_no, e.event, e.payload, e.attempts INTO n
		  FROM payidem.notify_event e
		 WHERE e.status = 'pending' AND e.next_attempt_at <= now()
		 ORDER BY e.next_attempt_at
		 LIMIT 1
		   FOR UPDATE SKIP LOCKED;
		EXIT WHEN NOT FOUND;
		-- an event whose last attempt was handed out and never answered is
		-- given up (failed), not handed out; a closed merchant's is named so
		IF n.attempts >= v_max_attempts THEN
			UPDATE payidem.notify_event e
			   SET status = 'failed', next_attempt_at = NULL,
				   last_response = CASE WHEN EXISTS (SELECT 1 FROM payidem.merchant m
													  WHERE m.merchant_no = e.merchant_no AND m.status = 'closed')
										THEN 'merchant closed' ELSE 'no answer to the last attempt' END
			 WHERE e.event_id = n.event_id;
			v_given_up := v_given_up + 1;
			CONTINUE;
		END IF;
		signature := payidem._sign_notification(n.merchant_no, n.payload);
		IF signature !~ ',v2=' THEN
			-- Nothing to sign with: this is no attempt, and the event is not
			-- sent unsigned.  A closed merchant's key signs nothing more: its
			-- event is given up (failed), takes no place in the batch and
			-- holds up no other; otherwise no secret of the merchant is valid
			-- now and the event waits.
			UPDATE payidem.notify_event e
			   SET status = CASE WHEN m.status = 'closed' THEN 'failed' ELSE e.status END,
				   next_attempt_at = CASE WHEN m.status = 'closed' THEN NULL
										  ELSE now() + interval '5 minutes' END,
				   last_response = CASE WHEN m.status = 'closed' THEN 'merchant closed'
										ELSE 'no valid API secret' END
			  FROM payidem.merchant m
			 WHERE e.event_id = n.event_id AND m.merchant_no = e.merchant_no
			RETURNING e.status INTO v_status;
			IF v_status = 'failed' THEN
				v_given_up := v_given_up + 1;
			ELSE
				v_left := v_left - 1;
			END IF;
			CONTINUE;
		END IF;
		-- Handing an event out is its next attempt (attempts counts
		-- hand-outs; the one handed out is named by attempt, and
		-- notify_result() takes reports of that one only) and leases it: its
		-- next_attempt_at moves ahead, so it is not handed out again after
		-- this transaction ends, until notify_result() or the lease runs out
		-- (a worker that died: that attempt had no answer).
		UPDATE payidem.notify_event e
		   SET next_attempt_at = now() + v_lease, attempts = e.attempts + 1, last_attempt_at = now()
		 WHERE e.event_id = n.event_id;
		v_left := v_left - 1;
		event_id := n.event_id;
		order_no := n.order_no;
		merchant_no := n.merchant_no;
		-- an order's events go to its notify_url, a payout's to the merchant's
		IF n.order_no IS NULL THEN
			SELECT m.notify_url INTO notify_url FROM payidem.merchant m WHERE m.merchant_no = n.merchant_no;
		ELSE
			SELECT x.notify_url INTO notify_url FROM payidem."order" x WHERE x.order_no = n.order_no;
		END IF;
		event := n.event;
		payload := n.payload;
		attempt := n.attempts + 1;
		RETURN NEXT;
	END LOOP;
	IF v_given_up > 0 THEN
		PERFORM payidem._count('notify_failed', v_given_up);
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Hand out up to max_rows due notification events (FOR UPDATE SKIP LOCKED: two workers never get the same one; each hand-out is the event''s next attempt and leases it for 60 s): the payload text to POST as it is and its signature header (t=...,v1=...,v2=...). Report each with notify_result(). Events of a closed merchant, and those whose 16th attempt went unanswered, are given up (failed), not handed out.';

CREATE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- wait after the n-th failed attempt; after the 16th attempt: failed
	v_schedule constant interval[] := ARRAY['15 seconds', '15 seconds', '30 seconds', '3 minutes',
		'10 minutes', '20 minutes', '30 minutes', '30 minutes', '30 minutes', '60 minutes',
		'3 hours', '3 hours', '3 hours', '6 hours', '6 hours']::interval[];
	v_status text;
BEGIN
	IF notify_result.event_id IS NULL OR notify_result.event_id <= 0 THEN
		PERFORM payidem._raise_invalid('invalid event_id',
			format('event_id was %s; it must be an id notify_due() handed out.',
				coalesce(notify_result.event_id::text, 'NULL')));
	END IF;
	IF ok IS NULL THEN
		PERFORM payidem._raise_invalid('notification result must not be NULL',
			'ok was NULL.',
			'Pass true if the merchant acknowledged the notification, false otherwise.');
	END IF;
	-- One statement that reports the attempt if it is the one to report: an
	-- event still pending and handed out (else it was sent or given up, or
	-- never handed out: nothing to report), at the attempt named if one is (a
	-- report of an attempt that is not the last one handed out, whose lease
	-- ran out and went to another worker, is stale: it changes nothing).
	IF ok THEN
		UPDATE payidem.notify_event x
		   SET status = 'sent', next_attempt_at = NULL, sent_at = now()
		 WHERE x.event_id = notify_result.event_id AND x.status = 'pending' AND x.attempts > 0
		   AND (notify_result.attempt IS NULL OR x.attempts = notify_result.attempt)
		RETURNING x.status INTO v_status;
	ELSE
		UPDATE payidem.notify_event x
		   SET status = CASE WHEN x.attempts > cardinality(v_schedule) THEN 'failed' ELSE x.status END,
			   next_attempt_at = CASE WHEN x.attempts > cardinality(v_schedule) THEN NULL
									  ELSE now() + v_schedule[x.attempts] END,
			   last_response = left(response, 256)
		 WHERE x.event_id = notify_result.event_id AND x.status = 'pending' AND x.attempts > 0
		   AND (notify_result.attempt IS NULL OR x.attempts = notify_result.attempt)
		RETURNING x.status INTO v_status;
	END IF;
	IF FOUND THEN
		PERFORM payidem._count(CASE v_status WHEN 'sent' THEN 'notify_sent' WHEN 'failed' THEN 'notify_failed'
											 ELSE 'notify_retried' END);
	ELSIF NOT EXISTS (SELECT 1 FROM payidem.notify_event x WHERE x.event_id = notify_result.event_id) THEN
		PERFORM payidem._raise_not_found('notification event', notify_result.event_id,
			'payidem.notify_event', 'event_id');
	END IF;
END
$$;
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

