------------------------------------------------------------------------------
-- What a person should look at (DESIGN section 10)
------------------------------------------------------------------------------

CREATE FUNCTION payidem.resolve_anomaly(anomaly_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	a payidem.anomaly;
BEGIN
	PERFORM payidem._require('anomaly_id', resolve_anomaly.anomaly_id::text);
	PERFORM payidem._check_resolution('an anomaly', resolve_anomaly.handle_status, resolve_anomaly.note);
	UPDATE payidem.anomaly x
	   SET handle_status = resolve_anomaly.handle_status, handled_by = session_user, handled_at = now(),
		   note = resolve_anomaly.note, updated_at = now()
	 WHERE x.anomaly_id = resolve_anomaly.anomaly_id AND x.handle_status = 'open'
	RETURNING x.* INTO a;
	IF NOT FOUND THEN
		SELECT x.* INTO a FROM payidem.anomaly x WHERE x.anomaly_id = resolve_anomaly.anomaly_id;
		IF NOT FOUND THEN
			PERFORM payidem._raise_not_found('anomaly', resolve_anomaly.anomaly_id,
				'payidem.anomaly', 'anomaly_id');
		END IF;
		RAISE EXCEPTION 'anomaly % is not open', a.anomaly_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s.', a.handle_status),
			HINT = 'Only an open anomaly can be resolved.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.resolve_anomaly(bigint, text, text) IS
	'Close an open anomaly as handled (e.g. refunded through refund()) or ignored, with a note; records the session user and the time. PI009 unknown, PI002 not open, 22023 bad status or note.';

-- Views of what is open, oldest first.  security_invoker: a merchant-scoped
-- role sees its merchant's rows only (the tables' row-level security).
CREATE VIEW payidem.open_anomalies WITH (security_invoker = true) AS
SELECT a.anomaly_id, a.kind, a.order_no, a.payment_no, a.channel_no, a.amount, a.created_at,
	   pg_catalog.now() - a.created_at AS open_for, a.detail ->> 'action' AS action, a.detail
  FROM payidem.anomaly a
 WHERE a.handle_status = 'open'
 ORDER BY a.created_at, a.anomaly_id;
COMMENT ON VIEW payidem.open_anomalies IS
	'Open anomalies (money that needs a person), oldest first; resolve each with payidem.resolve_anomaly().';
CREATE VIEW payidem.open_differences WITH (security_invoker = true) AS
SELECT r.recon_id, r.channel_no, r.bill_date, r.diff_type, r.transaction_id, r.payment_no,
	   r.platform_amount, r.channel_amount, r.platform_status, r.channel_status, r.created_at,
	   pg_catalog.now() - r.created_at AS open_for, r.platform_fee, r.channel_fee
  FROM payidem.reconciliation r
 WHERE r.handle_status = 'open'
 ORDER BY r.bill_date, r.recon_id;
COMMENT ON VIEW payidem.open_differences IS
	'Open reconciliation differences, oldest bill day first; resolve each with payidem.resolve_diff().';
-- The notification backlog: events not delivered, by state and by how many
-- attempts they have had; the oldest due one says how far behind the
-- workers are.  Sent events are not read (the partial indexes on pending and
-- failed events serve it).
CREATE VIEW payidem.notification_backlog AS
SELECT e.status, e.attempts, pg_catalog.count(*) AS events,
	   pg_catalog.count(*) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS due_now,
	   pg_catalog.min(e.next_attempt_at) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS oldest_due_at,
	   pg_catalog.now() - pg_catalog.min(e.next_attempt_at) FILTER (WHERE e.next_attempt_at <= pg_catalog.now()) AS behind_by,
	   pg_catalog.min(e.created_at) AS oldest_event_at
  FROM (SELECT x.status, x.attempts, x.next_attempt_at, x.created_at
		  FROM payidem.notify_event x WHERE x.status = 'pending'
		UNION ALL
		SELECT x.status, x.attempts, x.next_attempt_at, x.created_at
		  FROM payidem.notify_event x WHERE x.status = 'failed') e
 GROUP BY e.status, e.attempts
 ORDER BY e.status DESC, e.attempts;
COMMENT ON VIEW payidem.notification_backlog IS
	'Undelivered notification events by status (pending, failed) and attempts so far: how many, how many due now, the oldest due and how far behind it is.';


-- Since 1.1.  Which version the loaded shared library is: after a newer
-- build is installed and the server restarted (the library is preloaded), a
-- database runs its old SQL (pg_extension.extversion) on the new library
-- until ALTER EXTENSION payidem UPDATE.  STABLE, as version() is: it changes
-- at a restart.
CREATE FUNCTION payidem.library_version()
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_library_version'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.library_version() IS
	'The version the loaded payidem library was built as; pg_extension.extversion is the version of the SQL objects, which ALTER EXTENSION payidem UPDATE brings up to it.';

-- Since 1.1.  The replication payidem sees (DESIGN section 12), for
-- monitoring: 'synchronous' only when every order-number reservation and
-- every commit waits for the synchronous standbys' flush.
CREATE FUNCTION payidem.replication_mode()
RETURNS TABLE (mode text, synchronous_standby_names text, synchronous_commit text,
			   require_synchronous_standby boolean, writes_allowed boolean, timeline integer)
AS 'MODULE_PATHNAME', 'payidem_replication_mode'
LANGUAGE C STABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem.replication_mode() IS
	'The replication payidem sees in this session: mode standby (in recovery), synchronous (synchronous_standby_names set and synchronous_commit on or remote_apply) or asynchronous; the two settings; payidem.require_synchronous_standby; whether payidem''s writes are allowed; the WAL timeline (NULL on a standby).';
