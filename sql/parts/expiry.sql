------------------------------------------------------------------------------
-- Expiry.  The queue (payidem.order_expiry): its trigger, on every insert of
-- an order and every change of an order's status or expire_at (src/housekeeping.c:
-- in C, it returns at once unless the order is pending with a time not yet
-- queued; the queue is written as the table's owner, whoever writes the
-- order); housekeeping's closing of expired orders; query_due() for their
-- attempts.
------------------------------------------------------------------------------
CREATE FUNCTION payidem._queue_expiry()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_queue_expiry'
LANGUAGE C;
COMMENT ON FUNCTION payidem._queue_expiry() IS
	'Trigger order_expiry_queue on payidem."order": a pending order''s expire_at into payidem.order_expiry.';
-- (every UPDATE, not UPDATE OF status, expire_at: a BEFORE trigger may change
-- either without the statement naming it)
CREATE TRIGGER order_expiry_queue
	AFTER INSERT OR UPDATE ON payidem."order"
	FOR EACH ROW EXECUTE FUNCTION payidem._queue_expiry();

-- The queue made again from the orders: for pending orders written with the
-- triggers off (session_replication_role = replica, DISABLE TRIGGER), which
-- add no row; how many rows it added.
CREATE FUNCTION payidem.rebuild_expiry_queue()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH added AS (
		INSERT INTO payidem.order_expiry (expire_at, order_no)
		SELECT x.expire_at, x.order_no FROM payidem."order" x WHERE x.status = 'pending'
		ON CONFLICT ON CONSTRAINT order_expiry_pkey DO NOTHING
		RETURNING 1)
	SELECT count(*) FROM added
$$;
COMMENT ON FUNCTION payidem.rebuild_expiry_queue() IS
	'Queue the expiry of every pending order not queued at its expire_at (after pending orders were written with the triggers off); how many rows were added. Reads every order.';

-- Housekeeping (the background worker, src/housekeeping.c): a run first
-- removes from the queue, in batches, the rows whose time has passed and
-- whose order is no longer pending at that time (locking those orders FOR
-- SHARE SKIP LOCKED, so an order a transaction is changing is looked at
-- again next time, and one made pending again meanwhile keeps its row);
-- then reads the expired orders once and closes each in a transaction of
-- its own, so it never holds more than one order's lock, a failure on one
-- order stops only that one, and no call scans again what the ones before
-- it passed.
CREATE FUNCTION payidem._prune_expiry_queue(max_rows integer)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	WITH done AS (
		SELECT q.expire_at, q.order_no
		  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
		 WHERE q.expire_at <= now() AND (x.status <> 'pending' OR x.expire_at <> q.expire_at)
		 ORDER BY q.expire_at, q.order_no
		 LIMIT max_rows
		   FOR SHARE OF x SKIP LOCKED),
	gone AS (
		DELETE FROM payidem.order_expiry q USING done d
		 WHERE q.expire_at = d.expire_at AND q.order_no = d.order_no
		RETURNING 1),
	-- rows whose order does not exist (only a writer of the queue itself
	-- could make one)
	orphans AS (
		DELETE FROM payidem.order_expiry q
		 WHERE q.expire_at <= now()
		   AND NOT EXISTS (SELECT 1 FROM payidem."order" x WHERE x.order_no = q.order_no)
		RETURNING 1)
	SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM orphans)
$$;
COMMENT ON FUNCTION payidem._prune_expiry_queue(integer) IS
	'Internal (housekeeping): remove up to max_rows rows of payidem.order_expiry past their time whose order is no longer pending at it; how many were removed.';

CREATE FUNCTION payidem._expired_orders(max_rows integer)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
	SELECT x.order_no::text
	  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
	 WHERE q.expire_at <= now() AND x.status = 'pending' AND x.expire_at = q.expire_at
	   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
						WHERE p.order_no = x.order_no AND p.status = 'pending')
	 ORDER BY q.expire_at, q.order_no
	 LIMIT max_rows
$$;
COMMENT ON FUNCTION payidem._expired_orders(integer) IS
	'Internal (housekeeping): up to max_rows orders past expire_at with no pending attempt, oldest expiry first; no lock taken.';

-- Close one of them as close_order() closes it, if it still is one: its lock
-- is taken with SKIP LOCKED (an order a payment call holds is left for the
-- next run), and its attempts are read once the lock is ours (an attempt
-- begin_payment() committed meanwhile is the channel's to decide).  true:
-- closed now.
CREATE FUNCTION payidem._close_expired_order(order_no text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_order_no text;
BEGIN
	SELECT x.order_no INTO v_order_no FROM payidem."order" x
	 WHERE x.order_no = _close_expired_order.order_no AND x.status = 'pending' AND x.expire_at <= now()
	   FOR NO KEY UPDATE SKIP LOCKED;
	IF v_order_no IS NULL
	   OR EXISTS (SELECT 1 FROM payidem.payment p WHERE p.order_no = v_order_no AND p.status = 'pending') THEN
		RETURN false;
	END IF;
	RETURN payidem.close_order(v_order_no);
END
$$;
COMMENT ON FUNCTION payidem._close_expired_order(text) IS
	'Internal (housekeeping): close this order if it is still pending, expired, free (SKIP LOCKED) and without a pending attempt; true if closed now.';
-- Attempts past their order's expiry: the application asks the channel and
-- reports with apply_payment_result(..., 'query' | 'close', ...).  A lease
-- per attempt (60 s, as notify_due()'s) keeps two callers, or one calling
-- again, from querying the same attempt at once.
CREATE FUNCTION payidem.query_due(max_rows integer DEFAULT 100)
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_lease constant interval := '60 seconds';
	-- the advisory-lock space of query_due() (the first key of the pair)
	v_lock_class constant integer := hashtext('payidem.query_due');
	v_taken integer := 0;
	c record;
BEGIN
	IF max_rows IS NULL OR max_rows <= 0 THEN
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; it must be positive.', coalesce(max_rows::text, 'NULL')),
			'Pass how many attempts one worker queries at a time, e.g. 100.');
	END IF;
	-- the leases of attempts that are no longer pending are dropped (they can
	-- never be handed out again, so no caller writes them meanwhile); one
	-- another caller is dropping is left to it
	DELETE FROM payidem.query_lease l
	 WHERE l.payment_no IN (SELECT x.payment_no FROM payidem.query_lease x
							 WHERE x.leased_until <= now()
							   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
												WHERE p.payment_no = x.payment_no AND p.status = 'pending')
							   FOR UPDATE SKIP LOCKED);
	-- Two callers never get the same attempt, and neither waits for the other.
	-- The candidates are read in expiry order and taken one at a time, until
	-- max_rows are had: an attempt another caller is handing out (its
	-- transaction-scoped advisory lock) is skipped, as SKIP LOCKED skips a
	-- row; one whose lease that caller committed after this query's snapshot
	-- is refused by the lease write itself (the upsert decides on the latest
	-- row).  Only the attempts handed out are locked (a lock per candidate
	-- read, never per pending attempt), and the attempts' rows not at all, so
	-- a payment result never waits for query_due().
	FOR c IN
		SELECT p.payment_no::text AS payment_no, p.order_no, p.channel_no, o.expire_at
		  FROM payidem.order_expiry q
		  JOIN payidem."order" o ON o.order_no = q.order_no AND o.expire_at = q.expire_at
		  JOIN payidem.payment p ON p.order_no = o.order_no AND p.status = 'pending'
		 WHERE q.expire_at <= now() AND o.status = 'pending'
		   AND NOT EXISTS (SELECT 1 FROM payidem.query_lease l
							WHERE l.payment_no = p.payment_no AND l.leased_until > now())
		 ORDER BY o.expire_at, p.payment_no
	LOOP
		CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_lock_class, hashtext(c.payment_no));
		INSERT INTO payidem.query_lease AS l (payment_no, leased_until)
		VALUES (c.payment_no, now() + v_lease)
		ON CONFLICT ON CONSTRAINT query_lease_pkey DO UPDATE SET leased_until = excluded.leased_until
		 WHERE l.leased_until <= now();
		CONTINUE WHEN NOT FOUND;
		payment_no := c.payment_no;
		order_no := c.order_no;
		channel_no := c.channel_no;
		expire_at := c.expire_at;
		RETURN NEXT;
		v_taken := v_taken + 1;
		EXIT WHEN v_taken >= max_rows;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.query_due(integer) IS
	'Up to max_rows pending payment attempts whose order has expired, oldest expiry first, each leased for 60 s (two callers never get the same one, and never wait for each other): query the channel, then report with apply_payment_result(payment_no, ''query'' or ''close'', ...).';

