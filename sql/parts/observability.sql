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

-- Since 1.1.  Internal to health(): what only shared memory knows.
CREATE FUNCTION payidem._shared_state(OUT preloaded boolean, OUT housekeeping_running boolean,
	OUT housekeeping_since timestamptz, OUT housekeeping_tracked boolean, OUT housekeeping_last_run timestamptz)
AS 'MODULE_PATHNAME', 'payidem_shared_state'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._shared_state() IS
	'Internal to health(): whether the library is preloaded; whether the housekeeping launcher is alive, and since when; whether this database has counters of its own (beyond the first 63, databases share one and their last run is not known); when the last housekeeping run in this database whose steps all succeeded ended (NULL: none since the server started).';

-- Since 1.1.  One call an application's health check makes (granted by
-- grant_app()): status 'ok', or 'degraded' with the problems a person must
-- fix, each in words; and the figures behind them.  A problem is what stops
-- payidem from doing its work (not preloaded, no master key, housekeeping
-- off, not running or without a successful run in this database for three
-- intervals, writes refused by the replication setting); the queues'
-- figures are reported, not judged: their thresholds are the team's.
CREATE FUNCTION payidem.health()
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	s record;
	r record;
	v_problems text[] := '{}';
	v_key_version integer;
	v_key_problem text;
	v_hk_enabled boolean := coalesce(current_setting('payidem.housekeeping', true), 'on')::boolean;
	v_hk_interval integer := extract(epoch FROM coalesce(current_setting('payidem.housekeeping_interval', true), '10')::interval);
	v_due bigint;
	v_oldest_due timestamptz;
	v_anomalies bigint;
	v_differences bigint;
BEGIN
	SELECT * INTO s FROM payidem._shared_state();
	IF NOT s.preloaded THEN
		v_problems := v_problems || 'payidem is not in shared_preload_libraries: order numbers and payment results fail (55000)'::text;
	END IF;
	BEGIN
		v_key_version := payidem.master_key_version();
	EXCEPTION WHEN object_not_in_prerequisite_state OR insufficient_privilege OR invalid_parameter_value THEN
		v_key_problem := SQLERRM;
		v_problems := v_problems || ('the master key cannot be read: ' || SQLERRM);
	END;
	IF NOT v_hk_enabled THEN
		v_problems := v_problems || 'housekeeping is off (payidem.housekeeping): expired orders are not closed, nothing is settled by itself'::text;
	ELSIF s.preloaded AND NOT s.housekeeping_running THEN
		v_problems := v_problems || 'the housekeeping launcher is not running'::text;
	ELSIF s.preloaded AND s.housekeeping_tracked
		  AND coalesce(s.housekeeping_last_run, s.housekeeping_since) < now() - make_interval(secs => 3 * v_hk_interval + 60) THEN
		-- (no run, or none whose steps all succeeded, for three intervals: no
		-- worker slot free, or a step that fails; the server log says which)
		v_problems := v_problems || CASE WHEN s.housekeeping_last_run IS NULL
			THEN format('no housekeeping run has succeeded in this database since the launcher started at %s (see the server log)',
						payidem._utc(s.housekeeping_since))
			ELSE format('the last housekeeping run that succeeded in this database ended at %s, more than 3 intervals ago (see the server log)',
						payidem._utc(s.housekeeping_last_run)) END;
	END IF;
	SELECT * INTO r FROM payidem.replication_mode();
	IF NOT r.writes_allowed THEN
		v_problems := v_problems || (CASE WHEN r.mode = 'standby' THEN 'this server is a standby: payidem''s writes go to the primary'
									 ELSE 'payidem.require_synchronous_standby is on and no synchronous standby is configured: payidem''s writes are refused (55000)' END);
	END IF;
	SELECT count(*), min(e.next_attempt_at) INTO v_due, v_oldest_due
	  FROM payidem.notify_event e WHERE e.status = 'pending' AND e.next_attempt_at <= now();
	SELECT count(*) INTO v_anomalies FROM payidem.anomaly a WHERE a.handle_status = 'open';
	SELECT count(*) INTO v_differences FROM payidem.reconciliation d WHERE d.handle_status = 'open';
	RETURN jsonb_build_object(
		'status', CASE WHEN cardinality(v_problems) = 0 THEN 'ok' ELSE 'degraded' END,
		'problems', to_jsonb(v_problems),
		'checked_at', payidem._utc(now()),
		'shard_id', current_setting('payidem.shard_id')::integer,
		'library_version', payidem.library_version(),
		'extension_version', (SELECT e.extversion FROM pg_extension e WHERE e.extname = 'payidem'),
		'preloaded', s.preloaded,
		'master_key', jsonb_build_object('readable', v_key_problem IS NULL, 'version', v_key_version),
		'housekeeping', jsonb_build_object('enabled', v_hk_enabled, 'running', s.housekeeping_running,
										   'interval_seconds', v_hk_interval,
										   'running_since', payidem._utc(s.housekeeping_since),
										   'last_run_known', s.housekeeping_tracked,
										   'last_run_at', payidem._utc(s.housekeeping_last_run)),
		'replication', jsonb_build_object('mode', r.mode, 'writes_allowed', r.writes_allowed,
										  'require_synchronous_standby', r.require_synchronous_standby),
		'notifications', jsonb_build_object('due', v_due, 'oldest_due_at', payidem._utc(v_oldest_due),
											'behind_by_seconds',
											round(extract(epoch FROM now() - v_oldest_due))::bigint),
		'open_anomalies', v_anomalies,
		'open_differences', v_differences);
END
$$;
COMMENT ON FUNCTION payidem.health()
	IS 'For an application''s health check: status ok or degraded, the problems in words (not preloaded, master key unreadable, housekeeping off or not running, writes refused by replication), the shard id, the library and extension versions, housekeeping''s last run in this database, the replication mode, the due notifications and the oldest one, the open anomalies and reconciliation differences.';
