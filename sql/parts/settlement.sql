------------------------------------------------------------------------------
-- Settlement, merchant balances, payouts and adjustments (DESIGN section 11,
-- docs/settlement.md).  The journal's rules -- every journal balances, a
-- balance equals its entries -- are checked at commit for every writer
-- (src/journal.c); the functions here write journals that keep them.
------------------------------------------------------------------------------

-- Is day a business day?  Monday to Friday, unless payidem.business_day
-- says otherwise.
CREATE FUNCTION payidem._is_business_day(day date)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT b.business FROM payidem.business_day b WHERE b.day = _is_business_day.day),
				extract(isodow FROM day) < 6);
COMMENT ON FUNCTION payidem._is_business_day(date) IS
	'Internal: whether a day is a business day (Monday to Friday unless payidem.business_day overrides it).';

-- The settlement day of an item of bill day `day` on cycle D<n> (n calendar
-- days later) or T<n> (the n-th business day after it, whatever day it is:
-- a Saturday's T1 is Monday, as Friday's is); D0 and T0 are the day itself.
-- The one place the cycle rule is written.
CREATE FUNCTION payidem._settle_day(day date, settle_cycle text)
RETURNS date
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n integer;
	d date := day;
	tries integer := 0;
BEGIN
	IF settle_cycle IS NULL OR settle_cycle !~ '^[TD][0-9]{1,2}$' THEN
		PERFORM payidem._raise_invalid('invalid settlement cycle',
			format('The cycle was %s; it is T<n> (business days) or D<n> (calendar days), n from 0 to 99.',
				coalesce(quote_literal(left(settle_cycle, 64)), 'NULL')));
	END IF;
	n := substr(settle_cycle, 2)::integer;
	IF left(settle_cycle, 1) = 'D' THEN
		RETURN day + n;
	END IF;
	WHILE n > 0 LOOP
		d := d + 1;
		tries := tries + 1;
		IF tries > 3660 THEN
			PERFORM payidem._raise('55000', 'no business day in ten years',
				format('payidem.business_day marks every day after %s as not a business day.', day),
				'Correct payidem.business_day.');
		END IF;
		IF payidem._is_business_day(d) THEN
			n := n - 1;
		END IF;
	END LOOP;
	RETURN d;
END
$$;
COMMENT ON FUNCTION payidem._settle_day(date, text) IS
	'Internal: the settlement day of an item of a bill day on a merchant''s cycle (D<n>: n calendar days later; T<n>: the n-th business day after).';

-- Where settle() reads from: the start of settle_state.scan_from in the zone
-- it was recorded in (scan_timezone: the instant stays the same whatever the
-- session's payidem.bill_timezone), never before settle_from (in the
-- session's zone); -infinity before the first run.
CREATE FUNCTION payidem._scan_start()
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT coalesce(greatest(timezone(coalesce(s.scan_timezone, payidem._bill_timezone()), s.scan_from::timestamp),
								 timezone(payidem._bill_timezone(), s.settle_from::timestamp)),
						'-infinity'::timestamptz)
		  FROM payidem.settle_state s
		UNION ALL SELECT '-infinity'::timestamptz LIMIT 1);
COMMENT ON FUNCTION payidem._scan_start() IS
	'Internal: the instant settle() reads items from (settle_state: scan_from in scan_timezone, not before settle_from).';

-- The bill day of a time: its date in payidem.bill_timezone.  Inlined into
-- the queries that call it, a row at a time (no SET clause: a function with
-- one is called, not inlined); its names are schema-qualified instead.
CREATE FUNCTION payidem._bill_day(t timestamptz, tz text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CAST(pg_catalog.timezone(tz, t) AS pg_catalog.date);
COMMENT ON FUNCTION payidem._bill_day(timestamptz, text) IS
	'Internal: the calendar day of a time in a zone (the bill day, with payidem.bill_timezone).';

-- The items not yet settled: succeeded payments and refunds from the bill
-- day settle() reads from (settle_state.scan_from) on, the payments it holds,
-- and those an open anomaly names.  The one definition of "not settled",
-- for settle(), balance()'s pending and the merchant_balances view.  For
-- a merchant (p_merchant_no), or all (NULL); up to the end of bill day
-- p_until (NULL: no end).  A refund's fee and cost are its share of its
-- payment's, rounded cumulatively: what round(fee * refunded / amount)
-- half-up comes to with this refund, less what the payment's refunds before
-- it returned.  A payment's first refund returns round(fee * refund /
-- amount); together its refunds never return more than its fee and cost, and
-- exactly them once it is fully refunded.  (Each refund rounded on its own
-- would not add up: four refunds of a quarter of a cost of 2 would each
-- return round(0.5) = 1, and the last, taking the remainder, -1.)
CREATE FUNCTION payidem._unsettled_items(p_merchant_no text, p_until date)
RETURNS TABLE (item_no text, item_type text, payment_no text, merchant_no text, channel_no text,
			   currency text, bill_day date, amount bigint, fee bigint, cost bigint, scanned boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text := payidem._bill_timezone();
	v_from timestamptz := payidem._scan_start();
	-- (no payment of a day before settle_from: history paid outside payidem)
	v_floor timestamptz := (SELECT timezone(v_tz, s.settle_from::timestamp) FROM payidem.settle_state s);
	v_to timestamptz := CASE WHEN p_until IS NULL THEN 'infinity'::timestamptz
							 ELSE timezone(v_tz, (p_until + 1)::timestamp) END;
BEGIN
	RETURN QUERY
	WITH pay AS (
		-- the payments of the bill days read: by channel and time, from
		-- payment_paid (the key reconciliation reads), for all merchants ...
		SELECT pp.payment_no, true AS scanned
		  FROM payidem.channel c
		 CROSS JOIN LATERAL (
				SELECT x.payment_no FROM payidem.payment_paid x
				 WHERE x.channel_no = c.channel_no AND x.paid_at >= v_from AND x.paid_at < v_to) pp
		 WHERE p_merchant_no IS NULL
		UNION ALL
		-- ... or by the merchant's own key (merchant, channel, begun), for one
		-- (a payment begins before it is paid; one begun before the scan
		-- point and paid after it is held or named by an anomaly, below, or
		-- read here as long as it began at most 30 days before)
		SELECT p.payment_no, true
		  FROM payidem.merchant_channel mc
		 CROSS JOIN LATERAL (
				SELECT x.payment_no, x.paid_at FROM payidem.payment x
				 WHERE x.merchant_no = mc.merchant_no AND x.channel_no = mc.channel_no
				   AND x.created_at >= v_from - interval '30 days') p
		 WHERE p_merchant_no IS NOT NULL AND mc.merchant_no = p_merchant_no
		   AND p.paid_at >= v_from AND p.paid_at < v_to
		UNION ALL
		SELECT h.payment_no, false FROM payidem.settlement_hold h
		UNION ALL
		SELECT a.payment_no, false FROM payidem.anomaly a
		 WHERE a.handle_status = 'open' AND a.payment_no IS NOT NULL
	),
	-- each payment once (read by its day and held, say)
	each AS (
		SELECT x.payment_no, bool_or(x.scanned) AS scanned FROM pay x GROUP BY x.payment_no
	),
	payments AS (
		SELECT p.payment_no AS item_no, 'payment'::text AS item_type, p.payment_no, p.merchant_no,
			   p.channel_no, o.currency::text AS currency, payidem._bill_day(p.paid_at, v_tz) AS bill_day,
			   p.amount::bigint AS amount, p.fee_amount AS fee, p.cost_amount AS cost, e.scanned
		  FROM each e
		  JOIN payidem.payment p ON p.payment_no = e.payment_no
		  JOIN payidem."order" o ON o.order_no = p.order_no
		 WHERE p.status = ANY (payidem._paid_payment_statuses())
		   AND (p_merchant_no IS NULL OR p.merchant_no = p_merchant_no)
		   AND p.paid_at < v_to AND (v_floor IS NULL OR p.paid_at >= v_floor)
		   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = p.payment_no)
	),
	refunds AS (
		SELECT r.refund_no, r.payment_no, r.merchant_no, r.amount::bigint AS amount, r.refunded_at
		  FROM payidem.merchant m
		 CROSS JOIN LATERAL (
				SELECT x.refund_no, x.payment_no, x.merchant_no, x.amount, x.refunded_at
				  FROM payidem.refund x
				 WHERE x.merchant_no = m.merchant_no AND x.refunded_at >= v_from AND x.refunded_at < v_to
				   AND x.status = 'succeeded') r
		 WHERE p_merchant_no IS NULL OR m.merchant_no = p_merchant_no
	),
	unsettled_refunds AS (
		SELECT r.*
		  FROM refunds r
		 WHERE NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = r.refund_no)
	),
	-- a refund's share: what the payment's refunded amount so far (its
	-- settled refunds, then its unsettled ones in the order they succeeded,
	-- this one included) returns of the fee and cost, round(fee * refunded /
	-- amount) half-up, less what was returned before it (by the settled
	-- refunds, then the unsettled ones before it)
	shares AS (
		SELECT r.refund_no, r.payment_no, r.merchant_no, r.amount, r.refunded_at,
			   p.channel_no, o.currency::text AS currency, p.amount AS p_amount,
			   p.fee_amount, p.cost_amount, st.amount AS s_amount, st.fee AS s_fee, st.cost AS s_cost,
			   sum(r.amount) OVER (PARTITION BY r.payment_no ORDER BY r.refunded_at, r.refund_no) AS upto
		  FROM unsettled_refunds r
		  JOIN payidem.payment p ON p.payment_no = r.payment_no
		  JOIN payidem."order" o ON o.order_no = p.order_no
		 CROSS JOIN LATERAL (
				SELECT coalesce(sum(si.amount), 0) AS amount, coalesce(sum(si.fee), 0) AS fee,
					   coalesce(sum(si.cost), 0) AS cost
				  FROM payidem.refund r2
				  JOIN payidem.settlement_item si ON si.item_no = r2.refund_no
				 WHERE r2.payment_no = r.payment_no) st
	)
	SELECT x.item_no, x.item_type, x.payment_no, x.merchant_no, x.channel_no, x.currency, x.bill_day,
		   x.amount, x.fee, x.cost, x.scanned
	  FROM payments x
	UNION ALL
	SELECT s.refund_no, 'refund', s.payment_no, s.merchant_no, s.channel_no, s.currency,
		   payidem._bill_day(s.refunded_at, v_tz), s.amount,
		   (greatest(round(s.fee_amount::numeric * (s.s_amount + s.upto) / s.p_amount) - s.s_fee, 0)
			- greatest(round(s.fee_amount::numeric * (s.s_amount + s.upto - s.amount) / s.p_amount) - s.s_fee, 0))::bigint,
		   (greatest(round(s.cost_amount::numeric * (s.s_amount + s.upto) / s.p_amount) - s.s_cost, 0)
			- greatest(round(s.cost_amount::numeric * (s.s_amount + s.upto - s.amount) / s.p_amount) - s.s_cost, 0))::bigint,
		   true
	  FROM shares s;
END
$$;
COMMENT ON FUNCTION payidem._unsettled_items(text, date) IS
	'Internal: succeeded payments and refunds not yet settled (of one merchant or all, up to a bill day), with their fee and cost (a refund''s share); the one definition settle(), balance() and merchant_balances use.';

-- settle(d): every item whose settlement day is on or before d and that may
-- be settled, exactly once (settlement_item's key decides); a payment only
-- once its channel's bill day is reconciled and no open difference or
-- anomaly names it (else held, and looked at again by every run).  One run
-- at a time: the row of settle_state is locked to the end of the
-- transaction (a second run waits, then finds the first's items settled).
-- Everything in one statement, set-based: the items, their journals, the
-- balances, the holds.
CREATE FUNCTION payidem.settle(settle_date date DEFAULT CURRENT_DATE)
RETURNS TABLE (merchant_no text, currency text, items bigint, gross numeric, refunds numeric,
			   fees numeric, net numeric, held bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
	v_d date := settle.settle_date;
	v_tz text := payidem._bill_timezone();
	st payidem.settle_state;
	v_today date;
	v_pending_from date;
BEGIN
	IF v_d IS NULL OR NOT isfinite(v_d) OR v_d < date '1970-01-01' OR v_d > date '9999-12-30' THEN
		PERFORM payidem._raise_invalid('invalid settlement date',
			format('The date was %s; settle() takes a day from 1970-01-01 to 9999-12-30.', coalesce(v_d::text, 'NULL')),
			'Pass the day to settle up to, e.g. current_date.');
	END IF;
	-- (runs wait for each other on settle_state's row, then read what the
	-- one before settled: READ COMMITTED shows it, REPEATABLE READ would not)
	PERFORM payidem._refuse_repeatable_read('settle', 'the items other runs settled');
	INSERT INTO payidem.settle_state (id) VALUES (true) ON CONFLICT DO NOTHING;
	SELECT * INTO st FROM payidem.settle_state s FOR UPDATE;
	-- a run in another payidem.bill_timezone than the one scan_from is a day
	-- of: the day of this zone that holds the same instant (reading a little
	-- more, never less)
	IF st.scan_from IS NOT NULL AND st.scan_timezone IS DISTINCT FROM v_tz THEN
		UPDATE payidem.settle_state s
		   SET scan_from = (timezone(coalesce(st.scan_timezone, v_tz), st.scan_from::timestamp) AT TIME ZONE v_tz)::date,
			   scan_timezone = v_tz
		 WHERE s.id
		RETURNING * INTO st;
	END IF;
	-- the first bill day a pending order may still bring a payment of: its
	-- attempts may succeed at any time, with a paid_at as early as the order
	-- was made (less the clock skew a channel is allowed), and commit after
	-- this run has read.  Read before the run reads (an earlier snapshot): an
	-- order paid in between is paid in what the run reads.
	SELECT payidem._bill_day(min(o.created_at)
							 - coalesce(nullif(current_setting('payidem.max_clock_skew', true), '')::interval,
										interval '1 day'), v_tz)
	  INTO v_pending_from
	  FROM payidem.order_expiry q JOIN payidem."order" o ON o.order_no = q.order_no
	 WHERE o.status = 'pending';

	v_today := (now() AT TIME ZONE v_tz)::date;
	RETURN QUERY
	WITH u AS MATERIALIZED (
		SELECT x.*, m.settle_cycle
		  FROM payidem._unsettled_items(NULL, v_d) x
		  JOIN payidem.merchant m ON m.merchant_no = x.merchant_no
	),
	-- the cycle rule once per bill day and cycle, not per item
	d AS MATERIALIZED (
		SELECT y.bill_day, y.settle_cycle, payidem._settle_day(y.bill_day, y.settle_cycle) AS settle_day
		  FROM (SELECT DISTINCT u.bill_day, u.settle_cycle FROM u) y
	),
	-- each item: due (its settlement day reached), and allowed (a refund
	-- always; a payment once its channel's bill day is reconciled and no
	-- open difference or anomaly names it)
	-- the channel days reconciled, once each (not a look-up per item)
	reconciled AS MATERIALIZED (
		SELECT c.channel_no, c.bill_day
		  FROM (SELECT DISTINCT u.channel_no, u.bill_day FROM u WHERE u.item_type = 'payment') c
		 WHERE EXISTS (SELECT 1 FROM payidem.recon_batch b
						WHERE b.channel_no = c.channel_no AND b.bill_date = c.bill_day AND b.status = 'done')
	),
	-- the payments an open anomaly or an open difference names (their
	-- partial indexes of open ones)
	flagged AS MATERIALIZED (
		SELECT a.payment_no FROM payidem.anomaly a
		 WHERE a.handle_status = 'open' AND a.payment_no IS NOT NULL
		UNION
		SELECT rc.payment_no FROM payidem.reconciliation rc
		 WHERE rc.handle_status = 'open' AND rc.payment_no IS NOT NULL
	),
	run0 AS MATERIALIZED (
		SELECT u.item_no, u.item_type, u.payment_no, u.merchant_no, u.channel_no, u.currency, u.bill_day,
			   d.settle_day, u.amount, u.fee, u.cost, u.scanned,
			   d.settle_day <= v_d AS due,
			   u.item_type = 'refund'
			   OR (rd.channel_no IS NOT NULL AND fl.payment_no IS NULL) AS allowed
		  FROM u
		  JOIN d ON d.bill_day = u.bill_day AND d.settle_cycle = u.settle_cycle
		  LEFT JOIN reconciled rd ON rd.channel_no = u.channel_no AND rd.bill_day = u.bill_day
		  LEFT JOIN flagged fl ON fl.payment_no = u.payment_no
	),
	-- a merchant whose available balance this run would take out of the
	-- bigint range (amounts up to the bigint maximum are accepted) is not
	-- settled: its due items are held, and the other merchants are settled
	beyond AS (
		SELECT x.merchant_no, x.currency
		  FROM (SELECT r.merchant_no, r.currency,
					   sum(CASE WHEN r.item_type = 'payment' THEN r.amount - r.fee ELSE r.fee - r.amount END) AS moves
				  FROM run0 r
				 WHERE r.due AND r.allowed
				 GROUP BY r.merchant_no, r.currency) x
		  LEFT JOIN payidem.merchant_balance b ON b.merchant_no = x.merchant_no AND b.currency = x.currency
		 WHERE (coalesce(b.available, 0) + x.moves NOT BETWEEN -9223372036854775808 AND 9223372036854775807
				OR x.moves NOT BETWEEN -9223372036854775808 AND 9223372036854775807)
		   -- (looked at only when some merchant could: the run's amounts and
		   -- the largest balance together pass the range)
		   AND (SELECT coalesce(sum(r.amount), 0) FROM run0 r WHERE r.due AND r.allowed)
			   + (SELECT coalesce(max(greatest(b2.available, -b2.available)), 0) FROM payidem.merchant_balance b2)
			   > 9223372036854775807
	),
	run AS MATERIALIZED (
		SELECT x.item_no, x.item_type, x.payment_no, x.merchant_no, x.channel_no, x.currency, x.bill_day,
			   x.settle_day, x.amount, x.fee, x.cost, x.scanned, x.due,
			   x.allowed AND NOT EXISTS (SELECT 1 FROM beyond o
										  WHERE o.merchant_no = x.merchant_no AND o.currency = x.currency) AS allowed
		  FROM run0 x
	),
	settled AS (
		INSERT INTO payidem.settlement_item AS si
			(item_no, item_type, payment_no, merchant_no, channel_no, currency, bill_day, settle_day,
			 settle_date, amount, fee, cost)
		SELECT r.item_no, r.item_type, r.payment_no, r.merchant_no, r.channel_no, r.currency, r.bill_day,
			   r.settle_day, v_d, r.amount, r.fee, r.cost
		  FROM run r
		 WHERE r.due AND r.allowed
		ON CONFLICT (item_no) DO NOTHING
		RETURNING si.item_no, si.item_type, si.merchant_no, si.channel_no, si.currency::text AS currency,
				  si.amount, si.fee, si.cost
	),
	sums AS (
		SELECT s.merchant_no, s.currency, count(*) AS items,
			   coalesce(sum(s.amount) FILTER (WHERE s.item_type = 'payment'), 0) AS gross,
			   coalesce(sum(s.amount) FILTER (WHERE s.item_type = 'refund'), 0) AS refunds,
			   coalesce(sum(s.fee) FILTER (WHERE s.item_type = 'payment'), 0)
				 - coalesce(sum(s.fee) FILTER (WHERE s.item_type = 'refund'), 0) AS fees
		  FROM settled s
		 GROUP BY s.merchant_no, s.currency
	),
	-- each merchant's balance row moves by what its items bring, locked in
	-- the order of merchant_no
	balances AS (
		INSERT INTO payidem.merchant_balance AS b (merchant_no, currency, available)
		SELECT x.merchant_no, x.currency, (x.gross - x.refunds - x.fees)::bigint
		  FROM sums x
		 ORDER BY x.merchant_no, x.currency
		ON CONFLICT (merchant_no, currency) DO UPDATE
		   SET available = b.available + EXCLUDED.available, updated_at = now()
		RETURNING 1
	),
	-- each item's journal (journal_no = its number): a payment credits the
	-- merchant its amount less its fee and the platform the fee, and debits
	-- the channel what it remits less its cost and the cost; a refund the
	-- reverse of its share.  Written once every balance row is locked (the
	-- join with balances: no entry before all of its rows): a merchant's
	-- entries are written in the order its balance moved (_post too), the
	-- order verify() replays them in.
	entries AS (
		INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
		SELECT s.item_no, e.account, e.merchant_no, e.channel_no, s.currency, e.amount * e.sign, s.item_no
		  FROM settled s
		 CROSS JOIN (SELECT count(*) FROM balances) locked
		 CROSS JOIN LATERAL (
				SELECT CASE WHEN s.item_type = 'payment' THEN 1 ELSE -1 END AS sign) g
		 CROSS JOIN LATERAL (VALUES
				('channel_receivable'::text, NULL::text, s.channel_no, s.amount - s.cost, g.sign),
				('channel_cost', NULL, NULL, s.cost, g.sign),
				('merchant_available', s.merchant_no, NULL, -(s.amount - s.fee), g.sign),
				('fee_revenue', NULL, NULL, -s.fee, g.sign)) e(account, merchant_no, channel_no, amount, sign)
		 WHERE e.amount <> 0
		RETURNING 1
	),
	unheld AS (
		DELETE FROM payidem.settlement_hold h
		 WHERE h.payment_no IN (SELECT s.item_no FROM settled s WHERE s.item_type = 'payment')
		RETURNING 1
	),
	blocked AS (
		SELECT r.merchant_no, r.currency, count(*) AS held
		  FROM run r
		 WHERE r.due AND NOT r.allowed
		 GROUP BY r.merchant_no, r.currency
	),
	-- held: the payments due but blocked, and those found only through an
	-- open anomaly that are not settled now (once it is resolved, nothing
	-- else would find them)
	holds AS (
		INSERT INTO payidem.settlement_hold (payment_no)
		SELECT r.payment_no FROM run r
		 WHERE r.item_type = 'payment' AND ((r.due AND NOT r.allowed) OR (NOT r.scanned AND NOT r.allowed)
											OR (NOT r.scanned AND NOT r.due))
		ON CONFLICT (payment_no) DO NOTHING
		RETURNING 1
	),
	-- where the next run starts reading: the first bill day with an item
	-- read but not yet due (or a refund held, which settlement_hold does not
	-- keep), but never past yesterday (a payment of yesterday
	-- may still be committed), nor past d + 1 (later days were not read),
	-- nor past the first day a pending order may still bring a payment of
	-- (its success may commit after this run read; a success for an order no
	-- longer pending is an anomaly, which names it); not moved while a
	-- transaction older than the last run is still open (it may commit an
	-- item of a day already passed); never back but for a pending order
	progress AS (
		UPDATE payidem.settle_state s
		   SET scan_from = CASE
				WHEN st.scan_from IS NOT NULL AND st.last_xmax IS NOT NULL
					 AND pg_snapshot_xmin(pg_current_snapshot()) < st.last_xmax THEN st.scan_from
				WHEN st.scan_from IS NULL AND NOT EXISTS (SELECT 1 FROM run) THEN NULL
				ELSE least(greatest(least(coalesce((SELECT min(r.bill_day) FROM run r
													 WHERE r.scanned AND (NOT r.due OR (NOT r.allowed AND r.item_type = 'refund'))),
												   v_d + 1),
										  v_d + 1, v_today - 1),
									st.scan_from),
						   greatest(v_pending_from, st.settle_from))
			   END,
			   scan_timezone = v_tz,
			   last_scan_from = st.scan_from,
			   last_xmax = pg_snapshot_xmax(pg_current_snapshot()),
			   last_run_at = now(), last_settle_date = v_d
		 WHERE s.id
		RETURNING 1
	),
	touched AS (
		SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM balances)
			   + (SELECT count(*) FROM unheld) + (SELECT count(*) FROM holds)
			   + (SELECT count(*) FROM progress) AS n
	)
	SELECT coalesce(x.merchant_no, k.merchant_no), coalesce(x.currency, k.currency),
		   coalesce(x.items, 0), coalesce(x.gross, 0)::numeric, coalesce(x.refunds, 0)::numeric,
		   coalesce(x.fees, 0)::numeric, coalesce(x.gross - x.refunds - x.fees, 0)::numeric,
		   coalesce(k.held, 0)
	  FROM sums x
	  FULL JOIN blocked k ON k.merchant_no = x.merchant_no AND k.currency = x.currency
	 CROSS JOIN touched
	 WHERE touched.n >= 0
	 ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION payidem.settle(date) IS
	'Settle every succeeded payment and refund whose settlement day (bill day plus the merchant''s settle_cycle) is on or before settle_date, each once: payments only once their channel''s bill day is reconciled and no open difference or anomaly names them (held otherwise; so is every item of a merchant whose balance would leave the bigint range). One row per merchant and currency with items settled or held.';

-- The worker's daily run: settle(today in payidem.bill_timezone) once the
-- day's payidem.settle_after has passed, once a day (settle_state.worker_day).
-- Returns whether it ran.
CREATE FUNCTION payidem._settle_if_due()
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_tz text := payidem._bill_timezone();
	v_local timestamp := now() AT TIME ZONE v_tz;
	v_after time := coalesce(nullif(current_setting('payidem.settle_after', true), ''), '02:00')::time;
	v_day date;
BEGIN
	IF v_local::time < v_after THEN
		RETURN false;
	END IF;
	SELECT s.worker_day INTO v_day FROM payidem.settle_state s;
	IF v_day >= v_local::date THEN
		RETURN false;
	END IF;
	PERFORM count(*) FROM payidem.settle(v_local::date);
	UPDATE payidem.settle_state s SET worker_day = v_local::date WHERE s.id;
	RETURN true;
END
$$;
COMMENT ON FUNCTION payidem._settle_if_due() IS
	'Internal to the housekeeping worker: settle(today) once a day, after payidem.settle_after in payidem.bill_timezone.';

------------------------------------------------------------------------------
-- Payouts and adjustments
------------------------------------------------------------------------------

-- A currency argument: three upper-case letters (22023).
CREATE FUNCTION payidem._check_currency(currency text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF currency IS NULL OR currency !~ '^[A-Z]{3}$' THEN
		PERFORM payidem._raise_invalid('invalid currency',
			format('The currency was %s; it is an ISO 4217 code of three upper-case letters.',
				coalesce(quote_literal(left(currency, 64)), 'NULL')),
			'For example ''CNY''.');
	END IF;
	RETURN currency;
END
$$;

-- The merchant of a payout or adjustment: PI009 if there is none; its status.
CREATE FUNCTION payidem._merchant_status(merchant_no text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_status text;
BEGIN
	PERFORM payidem._require('merchant_no', merchant_no);
	SELECT m.status INTO v_status FROM payidem.merchant m WHERE m.merchant_no = _merchant_status.merchant_no;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('merchant', merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
	RETURN v_status;
END
$$;

-- Two entries of one journal, against a merchant's balance: the one way the
-- payout and adjustment functions post.  d_available / d_in_payout: how the
-- merchant's balances move (the merchant accounts' entries are their
-- negation); other_account takes what balances the journal.  The balance
-- row (made at 0 if missing) moves first, which locks it, then the entries
-- are written: every writer of a merchant's entries holds its balance row
-- while it writes them, so their order (entry_id) is the order the balance
-- moved in (verify() replays it).
CREATE FUNCTION payidem._post(p_journal text, p_source text, p_merchant_no text, p_currency text,
	d_available bigint, d_in_payout bigint, other_account text)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_other bigint := d_available + d_in_payout;
BEGIN
	-- (an update, the row made at 0 first if missing: an upsert would check
	-- the row it proposes, a negative in_payout, before finding the old one)
	UPDATE payidem.merchant_balance b
	   SET available = b.available + d_available, in_payout = b.in_payout + d_in_payout, updated_at = now()
	 WHERE b.merchant_no = p_merchant_no AND b.currency = p_currency;
	IF NOT FOUND THEN
		INSERT INTO payidem.merchant_balance (merchant_no, currency) VALUES (p_merchant_no, p_currency)
		ON CONFLICT DO NOTHING;
		UPDATE payidem.merchant_balance b
		   SET available = b.available + d_available, in_payout = b.in_payout + d_in_payout, updated_at = now()
		 WHERE b.merchant_no = p_merchant_no AND b.currency = p_currency;
	END IF;
	-- (the entries after the balance's lock: their order is the order in
	-- which the merchant's balance moved)
	INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, channel_no, currency, amount, source_no)
	SELECT p_journal, e.account, e.merchant_no, NULL, p_currency, e.amount, p_source
	  FROM (VALUES ('merchant_available'::text, p_merchant_no, -d_available),
				   ('merchant_payout', p_merchant_no, -d_in_payout),
				   (other_account, NULL, v_other)) e(account, merchant_no, amount)
	 WHERE e.amount <> 0;
END
$$;
COMMENT ON FUNCTION payidem._post(text, text, text, text, bigint, bigint, text) IS
	'Internal: one journal moving a merchant''s available and in-payout balances, balanced by other_account; the balance row moves with it.';

CREATE FUNCTION payidem.request_payout(merchant_no text, amount bigint, out_payout_no text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_merchant_no text := request_payout.merchant_no;
	v_amount bigint := request_payout.amount;
	v_out text := request_payout.out_payout_no;
	v_currency text := request_payout.currency;
	v_status text;
	v_payout_no text;
	v_available bigint;
	p payidem.payout;
BEGIN
	PERFORM payidem._require('merchant_no', v_merchant_no);
	IF v_amount IS NULL OR v_amount <= 0 THEN
		PERFORM payidem._raise_invalid('invalid payout amount',
			format('The amount was %s; it must be a positive number of minor units (fen, cents).',
				coalesce(v_amount::text, 'NULL')),
			'Pass 12.50 CNY as 1250.');
	END IF;
	IF v_out IS NULL OR NOT payidem._fits(v_out, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_payout_no', v_out, 'payidem.merchant_ref',
										'Use your own number for the payout, e.g. PAYOUT-20261207-0001.');
	END IF;
	PERFORM payidem._check_currency(v_currency);
	v_status := payidem._merchant_status(v_merchant_no);

	-- a repeated request: the same payout, or PI001
	SELECT * INTO p FROM payidem.payout x WHERE x.merchant_no = v_merchant_no AND x.out_payout_no = v_out;
	IF NOT FOUND THEN
		IF v_status <> 'active' THEN
			RAISE EXCEPTION 'merchant % is %', v_merchant_no, v_status USING
				ERRCODE = 'PI004',
				DETAIL = format('Merchant %s has status %s.', v_merchant_no, v_status),
				HINT = 'Only active merchants are paid out; what a closed merchant is owed is paid with adjust_balance().';
		END IF;
		-- never more than is available: the balance row's lock orders
		-- concurrent payouts of the merchant, each sees what the one before
		-- left, and the payout records what it saw
		SELECT b.available INTO v_available FROM payidem.merchant_balance b
		 WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency
		   FOR NO KEY UPDATE;
		-- the unique constraint decides between concurrent first calls: the
		-- loser waits for the winner's commit and answers as a repeat
		INSERT INTO payidem.payout AS x (payout_no, merchant_no, out_payout_no, amount, currency, available_before)
		VALUES (payidem.gen_order_no('PT'), v_merchant_no, v_out, v_amount, v_currency, coalesce(v_available, 0))
		ON CONFLICT ON CONSTRAINT payout_out_payout_no_key DO NOTHING
		RETURNING x.payout_no INTO v_payout_no;
		IF v_payout_no IS NOT NULL THEN
			IF coalesce(v_available, 0) < v_amount THEN
				RAISE EXCEPTION 'insufficient balance for a payout of % %', v_amount, v_currency USING
					ERRCODE = 'PI010',
					DETAIL = format('Merchant %s has %s %s available; the payout asked for %s.',
									v_merchant_no, coalesce(v_available, 0), v_currency, v_amount),
					HINT = 'Request at most the available balance (payidem.balance()); settled payments add to it.';
			END IF;
			PERFORM payidem._post(v_payout_no, v_payout_no, v_merchant_no, v_currency,
								  -v_amount, v_amount, 'payout_clearing');
			RETURN v_payout_no;
		END IF;
		SELECT * INTO p FROM payidem.payout x WHERE x.merchant_no = v_merchant_no AND x.out_payout_no = v_out;
	END IF;
	IF p.amount <> v_amount OR p.currency <> v_currency THEN
		RAISE EXCEPTION 'out_payout_no % was already used with different parameters', v_out USING
			ERRCODE = 'PI001',
			DETAIL = format('Payout %s of merchant %s is %s %s; this request is %s %s.',
							p.payout_no, v_merchant_no, p.amount, p.currency, v_amount, v_currency),
			HINT = 'Use a new out_payout_no for a new payout.';
	END IF;
	RETURN p.payout_no;
END
$$;
COMMENT ON FUNCTION payidem.request_payout(text, bigint, text, text) IS
	'Pay out part of a merchant''s available balance: returns the payout number (PT...). PI010 above the available balance (also under concurrency), PI004 unless the merchant is active, PI001 for an out_payout_no reused with another amount; a repeat returns the same payout.';

CREATE FUNCTION payidem.apply_payout_result(payout_no text, status text, bank_ref text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_payout_no text := apply_payout_result.payout_no;
	v_status text := apply_payout_result.status;
	v_ref text := apply_payout_result.bank_ref;
	p payidem.payout;
BEGIN
	PERFORM payidem._check_number('payout', v_payout_no);
	IF v_status IS NULL OR v_status NOT IN ('succeeded', 'failed') THEN
		PERFORM payidem._raise_invalid('invalid payout status ' || coalesce(quote_literal(left(v_status, 64)), 'NULL'),
			'A payout ends succeeded or failed.', 'Report what the bank answered: succeeded or failed.');
	END IF;
	IF v_ref IS NOT NULL AND NOT payidem._fits(v_ref, 'payidem.channel_ref') THEN
		PERFORM payidem._invalid_format('bank_ref', v_ref, 'payidem.channel_ref', 'Pass the bank''s reference, or NULL.');
	END IF;
	-- lock order: the payout, then its merchant's balance (_post)
	SELECT * INTO p FROM payidem.payout x WHERE x.payout_no = v_payout_no FOR UPDATE;
	IF NOT FOUND THEN
		PERFORM payidem._raise_not_found('payout', v_payout_no, 'payidem.payout', 'payout_no');
	END IF;
	IF p.status = v_status AND (v_ref IS NULL OR p.bank_ref IS NULL OR v_ref = p.bank_ref) THEN
		IF p.bank_ref IS NULL AND v_ref IS NOT NULL THEN
			-- the bank's reference, first given with a repeat
			UPDATE payidem.payout x SET bank_ref = v_ref, updated_at = now() WHERE x.payout_no = v_payout_no;
		END IF;
		RETURN 'duplicate';
	END IF;
	IF p.status <> 'pending' THEN
		-- the bank contradicts what was applied: a person looks at it
		INSERT INTO payidem.anomaly (kind, amount, detail)
		VALUES ('conflicting_payout_result', p.amount,
				jsonb_strip_nulls(jsonb_build_object('payout_no', p.payout_no, 'merchant_no', p.merchant_no,
					'applied_status', p.status, 'applied_bank_ref', p.bank_ref,
					'reported_status', v_status, 'reported_bank_ref', v_ref)));
		RETURN 'rejected';
	END IF;
	UPDATE payidem.payout x
	   SET status = v_status, bank_ref = coalesce(v_ref, x.bank_ref), finished_at = now(), updated_at = now()
	 WHERE x.payout_no = v_payout_no;
	IF v_status = 'succeeded' THEN
		PERFORM payidem._post(v_payout_no || '/succeeded', v_payout_no, p.merchant_no, p.currency,
							  0, -p.amount, 'payout_clearing');
	ELSE
		PERFORM payidem._post(v_payout_no || '/failed', v_payout_no, p.merchant_no, p.currency,
							  p.amount, -p.amount, 'payout_clearing');
	END IF;
	RETURN 'applied';
END
$$;
COMMENT ON FUNCTION payidem.apply_payout_result(text, text, text) IS
	'Record the bank''s answer to a payout: succeeded (the money left) or failed (it returns to the available balance). applied, duplicate (the same answer again), or rejected (a contradicting answer: an anomaly conflicting_payout_result, nothing else changes).';

CREATE FUNCTION payidem.adjust_balance(merchant_no text, amount bigint, out_adjust_no text, reason text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_merchant_no text := adjust_balance.merchant_no;
	v_amount bigint := adjust_balance.amount;
	v_out text := adjust_balance.out_adjust_no;
	v_currency text := adjust_balance.currency;
	v_adjust_no text;
	a payidem.adjustment;
BEGIN
	PERFORM payidem._require('merchant_no', v_merchant_no);
	-- (the smallest bigint has no opposite: its entry could not be written)
	IF v_amount IS NULL OR v_amount = 0 OR v_amount = -9223372036854775807 - 1 THEN
		PERFORM payidem._raise_invalid('invalid adjustment amount',
			format('The amount was %s; it is a non-zero number of minor units, from -9223372036854775807 up: positive credits the merchant, negative debits it.',
				coalesce(v_amount::text, 'NULL')));
	END IF;
	IF v_out IS NULL OR NOT payidem._fits(v_out, 'payidem.merchant_ref') THEN
		PERFORM payidem._invalid_format('out_adjust_no', v_out, 'payidem.merchant_ref',
										'Use your own number for the adjustment, e.g. ADJ-20261207-0001.');
	END IF;
	IF reason IS NULL OR length(btrim(reason)) NOT BETWEEN 1 AND 256 THEN
		PERFORM payidem._raise_invalid('an adjustment needs a reason',
			format('The reason was %s; it must have 1 to 256 characters (not only spaces).',
				coalesce(quote_literal(left(reason, 64)), 'NULL')),
			'Say why, e.g. ''chargeback of PY...''.');
	END IF;
	PERFORM payidem._check_no_controls('invalid adjustment reason', 'The reason', reason);
	PERFORM payidem._check_currency(v_currency);
	PERFORM payidem._merchant_status(v_merchant_no);	-- any status: a closed merchant is still owed
	-- a balance that would leave the bigint range: refused, nothing written
	IF (SELECT b.available::numeric + v_amount FROM payidem.merchant_balance b
		 WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency)
	   NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
		PERFORM payidem._raise_invalid('adjustment out of range',
			format('Merchant %s has %s %s available; adding %s would pass the range of a bigint.',
				   v_merchant_no, (SELECT b.available FROM payidem.merchant_balance b
								   WHERE b.merchant_no = v_merchant_no AND b.currency = v_currency),
				   v_currency, v_amount));
	END IF;

	INSERT INTO payidem.adjustment AS x (adjust_no, merchant_no, out_adjust_no, amount, currency, reason)
	VALUES (payidem.gen_order_no('AJ'), v_merchant_no, v_out, v_amount, v_currency, reason)
	ON CONFLICT ON CONSTRAINT adjustment_out_adjust_no_key DO NOTHING
	RETURNING x.adjust_no INTO v_adjust_no;
	IF v_adjust_no IS NOT NULL THEN
		PERFORM payidem._post(v_adjust_no, v_adjust_no, v_merchant_no, v_currency, v_amount, 0, 'adjustment');
		RETURN v_adjust_no;
	END IF;
	SELECT * INTO a FROM payidem.adjustment x WHERE x.merchant_no = v_merchant_no AND x.out_adjust_no = v_out;
	IF a.amount <> v_amount OR a.currency <> v_currency THEN
		RAISE EXCEPTION 'out_adjust_no % was already used with different parameters', v_out USING
			ERRCODE = 'PI001',
			DETAIL = format('Adjustment %s of merchant %s is %s %s; this request is %s %s.',
							a.adjust_no, v_merchant_no, a.amount, a.currency, v_amount, v_currency),
			HINT = 'Use a new out_adjust_no for a new adjustment.';
	END IF;
	RETURN a.adjust_no;
END
$$;
COMMENT ON FUNCTION payidem.adjust_balance(text, bigint, text, text, text) IS
	'Credit (positive amount) or debit (negative) a merchant''s available balance against the platform''s adjustment account, with a reason: returns the adjustment number (AJ...); a repeat with the same out_adjust_no and amount returns the same one, another amount is PI001.';

CREATE FUNCTION payidem.set_merchant_notify_url(merchant_no text, url text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._merchant_status(merchant_no);
	IF NOT payidem._fits(url, 'payidem.http_url') THEN
		PERFORM payidem._invalid_format('notify_url', url, 'payidem.http_url',
										'Pass NULL for no notifications of payouts.');
	END IF;
	UPDATE payidem.merchant m SET notify_url = url, updated_at = now()
	 WHERE m.merchant_no = set_merchant_notify_url.merchant_no;
END
$$;
COMMENT ON FUNCTION payidem.set_merchant_notify_url(text, text) IS
	'Where a merchant''s notifications that belong to no order go (payout.succeeded, payout.failed); NULL for none.';

------------------------------------------------------------------------------
-- Reads: balance(), the views, verify()
------------------------------------------------------------------------------

-- Pending (earned, not yet settled: amounts less fees, refunds less their
-- fee shares; may be negative), available and in payout, per merchant and
-- currency.  NULL merchant: all.  As the owner: the view merchant_balances
-- calls it with its reader's privileges (grant_auditor grants EXECUTE on it),
-- and what it reads needs more than an auditor's SELECTs.
CREATE FUNCTION payidem._balances(p_merchant_no text)
RETURNS TABLE (merchant_no text, currency text, pending numeric, available bigint, in_payout bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT coalesce(b.merchant_no, u.merchant_no), coalesce(b.currency::text, u.currency),
		   coalesce(u.pending, 0), coalesce(b.available, 0), coalesce(b.in_payout, 0)
	  FROM (SELECT x.merchant_no, x.currency, x.available, x.in_payout FROM payidem.merchant_balance x
			 WHERE p_merchant_no IS NULL OR x.merchant_no = p_merchant_no) b
	  FULL JOIN (SELECT i.merchant_no, i.currency,
						sum(CASE WHEN i.item_type = 'payment' THEN i.amount - i.fee ELSE i.fee - i.amount END) AS pending
				   FROM payidem._unsettled_items(p_merchant_no, NULL) i
				  GROUP BY i.merchant_no, i.currency) u
		ON u.merchant_no = b.merchant_no AND u.currency = b.currency::text
	 ORDER BY 1, 2;
END;
COMMENT ON FUNCTION payidem._balances(text) IS
	'Internal: pending, available and in-payout balances of a merchant (or all) per currency.';

-- The caller's view, decided as for the read API (_check_reader): a role
-- that reads a merchant's rows (map_merchant_role) sees its own merchants
-- only (another is PI009, as if it did not exist), and one that may also
-- execute the rest of the API is refused (42501); the application
-- (grant_app) and auditors see every merchant.  caller is
-- the role current at the call of balance() (src/read_api.c, which runs
-- this as the owner: no one else may execute it).
CREATE FUNCTION payidem._balance(p_merchant_no text, p_currency text, caller regrole)
RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._require('merchant_no', p_merchant_no);
	PERFORM payidem._check_currency(p_currency);
	-- (scoped: a role mapped to merchants, the read API's rule; an auditor
	-- sees every balance)
	PERFORM payidem._check_readable_merchant(p_merchant_no, caller, payidem._check_reader(caller, false));
	RETURN QUERY
	SELECT coalesce(max(b.pending), 0), coalesce(max(b.available), 0)::bigint, coalesce(max(b.in_payout), 0)::bigint
	  FROM payidem._balances(p_merchant_no) b WHERE b.currency = p_currency;
END
$$;
COMMENT ON FUNCTION payidem._balance(text, text, regrole) IS
	'Internal to balance(): the balances of a merchant the caller may see (PI009 otherwise).';

-- (C, as get_order(): to know who calls while the caller needs EXECUTE on
-- this function alone; src/read_api.c)
CREATE FUNCTION payidem.balance(merchant_no text, currency text DEFAULT 'CNY')
RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
AS 'MODULE_PATHNAME', 'payidem_balance'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.balance(text, text) IS
	'A merchant''s balances in a currency: pending (earned, not yet settled, net of fees; may be negative), available (settled, may be paid out) and in_payout (requested, not yet confirmed). A role mapped to merchants (map_merchant_role) sees only its own: another is PI009.';

CREATE VIEW payidem.merchant_balances AS
	SELECT b.merchant_no, b.currency, b.pending, b.available, b.in_payout
	  FROM payidem._balances(NULL) b;
COMMENT ON VIEW payidem.merchant_balances IS
	'Every merchant''s pending, available and in-payout balance per currency.';

CREATE VIEW payidem.settlement_summary AS
	SELECT si.settle_day, si.merchant_no, si.currency::text AS currency, count(*) AS items,
		   coalesce(sum(si.amount) FILTER (WHERE si.item_type = 'payment'), 0)::numeric AS gross,
		   coalesce(sum(si.amount) FILTER (WHERE si.item_type = 'refund'), 0)::numeric AS refunds,
		   (coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS fees,
		   (coalesce(sum(si.amount - si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.amount - si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS net
	  FROM payidem.settlement_item si
	 GROUP BY si.settle_day, si.merchant_no, si.currency;
COMMENT ON VIEW payidem.settlement_summary IS
	'What was settled per settlement day (each item''s bill day plus its merchant''s cycle), merchant and currency: items, gross (payments), refunds, fees (less the refunds'' shares), net = gross - refunds - fees.';

CREATE VIEW payidem.platform_margin AS
	SELECT si.bill_day, si.channel_no, si.currency::text AS currency,
		   (coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS fee_revenue,
		   (coalesce(sum(si.cost) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.cost) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS channel_cost,
		   (coalesce(sum(si.fee - si.cost) FILTER (WHERE si.item_type = 'payment'), 0)
			- coalesce(sum(si.fee - si.cost) FILTER (WHERE si.item_type = 'refund'), 0))::numeric AS margin
	  FROM payidem.settlement_item si
	 GROUP BY si.bill_day, si.channel_no, si.currency;
COMMENT ON VIEW payidem.platform_margin IS
	'What the platform earned on settled items per bill day, channel and currency: fee revenue less channel cost, net of the refunds'' shares.';

-- verify(): the invariants of DESIGN sections 5 and 11, re-derived from the
-- tables, one row per violation; none when the books are right.  Read-only
-- (it runs on a standby), for every writer's rows, including what
-- session_replication_role = replica let past the triggers.
CREATE FUNCTION payidem.verify()
RETURNS TABLE (invariant text, subject text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	-- every journal balances, per currency
	SELECT 'journal_balances', e.journal_no,
		   format('entries in %s sum to %s', e.currency, sum(e.amount))
	  FROM payidem.ledger_entry e
	 GROUP BY e.journal_no, e.currency
	HAVING sum(e.amount) <> 0
	UNION ALL
	-- each balance equals its entries
	SELECT 'balance_equals_entries', coalesce(b.merchant_no, e.merchant_no) || ' ' || coalesce(b.currency::text, e.currency::text),
		   format('available %s, in_payout %s; the journal says %s and %s',
				  coalesce(b.available, 0), coalesce(b.in_payout, 0), coalesce(e.available, 0), coalesce(e.in_payout, 0))
	  FROM payidem.merchant_balance b
	  FULL JOIN (SELECT x.merchant_no, x.currency,
						-sum(x.amount) FILTER (WHERE x.account = 'merchant_available') AS available,
						-sum(x.amount) FILTER (WHERE x.account = 'merchant_payout') AS in_payout
				   FROM payidem.ledger_entry x
				  WHERE x.account IN ('merchant_available', 'merchant_payout')
				  GROUP BY x.merchant_no, x.currency) e
		ON e.merchant_no = b.merchant_no AND e.currency = b.currency
	 WHERE coalesce(b.available, 0) <> coalesce(e.available, 0)
		OR coalesce(b.in_payout, 0) <> coalesce(e.in_payout, 0)
	UNION ALL
	-- each settled payment is a paid payment, settled with the amounts of its row
	SELECT 'settled_as_recorded', si.item_no,
		   format('settled %s (fee %s, cost %s) for merchant %s; the payment is %s (fee %s, cost %s) of merchant %s, %s',
				  si.amount, si.fee, si.cost, si.merchant_no, p.amount, p.fee_amount, p.cost_amount,
				  p.merchant_no, coalesce(p.status, 'missing'))
	  FROM payidem.settlement_item si
	  LEFT JOIN payidem.payment p ON p.payment_no = si.item_no
	 WHERE si.item_type = 'payment'
	   AND (p.payment_no IS NULL OR p.status <> ALL (payidem._paid_payment_statuses())
			OR p.amount <> si.amount OR p.fee_amount IS DISTINCT FROM si.fee
			OR p.cost_amount IS DISTINCT FROM si.cost OR p.merchant_no <> si.merchant_no)
	UNION ALL
	-- each settled refund is a succeeded refund, with its amount; its shares
	-- are within its payment's fee and cost
	SELECT 'settled_as_recorded', si.item_no,
		   format('settled %s (fee share %s, cost share %s); the refund is %s, %s',
				  si.amount, si.fee, si.cost, r.amount, coalesce(r.status, 'missing'))
	  FROM payidem.settlement_item si
	  LEFT JOIN payidem.refund r ON r.refund_no = si.item_no
	 WHERE si.item_type = 'refund'
	   AND (r.refund_no IS NULL OR r.status <> 'succeeded' OR r.amount <> si.amount
			OR r.payment_no <> si.payment_no)
	UNION ALL
	-- a payment's refunds return at most its fee and cost, exactly them once
	-- it is fully refunded and every refund is settled
	SELECT 'refund_shares_add_up', p.payment_no,
		   format('refunds settled %s of %s refunded return fee %s of %s and cost %s of %s',
				  s.refunded, p.amount, s.fee, p.fee_amount, s.cost, p.cost_amount)
	  FROM (SELECT si.payment_no, sum(si.amount) AS refunded, sum(si.fee) AS fee, sum(si.cost) AS cost
			  FROM payidem.settlement_item si WHERE si.item_type = 'refund'
			 GROUP BY si.payment_no) s
	  JOIN payidem.payment p ON p.payment_no = s.payment_no
	 WHERE s.fee > p.fee_amount OR s.cost > p.cost_amount OR s.refunded > p.amount
		OR (s.refunded = p.amount AND (s.fee <> p.fee_amount OR s.cost <> p.cost_amount))
	UNION ALL
	-- a settled item's journal says what the item says
	SELECT 'item_journal', si.item_no,
		   format('its journal moves the merchant by %s; the item says %s', coalesce(j.merchant, 0),
				  CASE WHEN si.item_type = 'payment' THEN si.amount - si.fee ELSE si.fee - si.amount END)
	  FROM payidem.settlement_item si
	  LEFT JOIN (SELECT x.journal_no, -sum(x.amount) AS merchant FROM payidem.ledger_entry x
				  WHERE x.account = 'merchant_available' GROUP BY x.journal_no) j ON j.journal_no = si.item_no
	 WHERE coalesce(j.merchant, 0) <> CASE WHEN si.item_type = 'payment' THEN si.amount - si.fee ELSE si.fee - si.amount END
	UNION ALL
	-- no payout took more than was available: what the merchant had when the
	-- payout was taken (recorded under the balance's lock)
	SELECT 'payout_within_available', p.payout_no,
		   format('%s %s paid out of %s available', p.amount, p.currency, coalesce(p.available_before::text, 'unrecorded'))
	  FROM payidem.payout p
	 WHERE p.available_before IS NULL OR p.amount > p.available_before
	UNION ALL
	-- every succeeded payment of a bill day settle() no longer reads is
	-- settled or held (else no run would find it: a DBA puts it in
	-- settlement_hold)
	SELECT 'settled_or_held', p.payment_no,
		   format('paid at %s, before the day settle() reads from (%s), neither settled nor held',
				  p.paid_at, st.scan_from)
	  FROM payidem.settle_state st
	  JOIN payidem.payment p
		ON p.paid_at < payidem._scan_start()
	   AND (st.settle_from IS NULL OR p.paid_at >= pg_catalog.timezone(payidem._bill_timezone(), st.settle_from::timestamp))
	 WHERE p.status = ANY (payidem._paid_payment_statuses())
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = p.payment_no)
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_hold h WHERE h.payment_no = p.payment_no)
	   AND NOT EXISTS (SELECT 1 FROM payidem.anomaly a
						WHERE a.payment_no = p.payment_no AND a.handle_status = 'open')
	UNION ALL
	SELECT 'settled_or_held', r.refund_no,
		   format('refunded at %s, before the day settle() reads from (%s), not settled', r.refunded_at, st.scan_from)
	  FROM payidem.settle_state st
	  JOIN payidem.refund r
		ON r.refunded_at < payidem._scan_start()
	   AND (st.settle_from IS NULL OR r.refunded_at >= pg_catalog.timezone(payidem._bill_timezone(), st.settle_from::timestamp))
	 WHERE r.status = 'succeeded'
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = r.refund_no)
	UNION ALL
	-- a payout's journals agree with its status
	SELECT 'payout_journals', p.payout_no,
		   format('status %s; journals: request %s, succeeded %s, failed %s', p.status,
				  coalesce(j.request, 0), coalesce(j.succeeded, 0), coalesce(j.failed, 0))
	  FROM payidem.payout p
	  LEFT JOIN (SELECT x.source_no,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no AND x.account = 'merchant_payout') AS request,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no || '/succeeded' AND x.account = 'merchant_payout') AS succeeded,
						sum(x.amount) FILTER (WHERE x.journal_no = x.source_no || '/failed' AND x.account = 'merchant_payout') AS failed
				   FROM payidem.ledger_entry x WHERE x.source_no ~ '^PT' GROUP BY x.source_no) j
		ON j.source_no = p.payout_no
	 WHERE coalesce(j.request, 0) <> -p.amount
		OR coalesce(j.succeeded, 0) <> CASE WHEN p.status = 'succeeded' THEN p.amount ELSE 0 END
		OR coalesce(j.failed, 0) <> CASE WHEN p.status = 'failed' THEN p.amount ELSE 0 END
	UNION ALL
	-- DESIGN section 5: a paid order names one paying payment of its own
	SELECT 'paid_order_has_payment', o.order_no,
		   format('order %s, paid_at %s, paid_payment_no %s; that payment: %s', o.status,
				  coalesce(o.paid_at::text, 'NULL'), coalesce(o.paid_payment_no, 'NULL'),
				  coalesce(p.status || ' of order ' || p.order_no, 'missing'))
	  FROM payidem."order" o
	  LEFT JOIN payidem.payment p ON p.payment_no = o.paid_payment_no
	 WHERE o.status IN ('paid', 'partially_refunded', 'refunded')
	   AND (o.paid_at IS NULL OR p.payment_no IS NULL OR p.order_no <> o.order_no
			OR p.status <> ALL (payidem._paid_payment_statuses()))
	UNION ALL
	-- a paid payment has its transaction id, paid_at and fees
	SELECT 'paid_payment_complete', p.payment_no,
		   format('%s without %s', p.status,
				  concat_ws(', ', CASE WHEN p.transaction_id IS NULL THEN 'transaction_id' END,
							CASE WHEN p.paid_at IS NULL THEN 'paid_at' END,
							CASE WHEN p.fee_amount IS NULL THEN 'fee_amount' END,
							CASE WHEN p.cost_amount IS NULL THEN 'cost_amount' END))
	  FROM payidem.payment p
	 WHERE p.status = ANY (payidem._paid_payment_statuses())
	   AND (p.transaction_id IS NULL OR p.paid_at IS NULL OR p.fee_amount IS NULL OR p.cost_amount IS NULL)
	UNION ALL
	-- refunded amounts add up: a payment's is the sum of its succeeded
	-- refunds, its status agrees, and the order it paid mirrors it
	SELECT 'refunds_add_up', p.payment_no,
		   format('refunded_amount %s of %s, status %s; its succeeded refunds sum to %s; its order says %s',
				  p.refunded_amount, p.amount, p.status, coalesce(r.total, 0),
				  coalesce(o.refunded_amount::text, '-'))
	  FROM payidem.payment p
	  LEFT JOIN (SELECT x.payment_no, sum(x.amount) AS total FROM payidem.refund x
				  WHERE x.status = 'succeeded' GROUP BY x.payment_no) r ON r.payment_no = p.payment_no
	  LEFT JOIN payidem."order" o ON o.paid_payment_no = p.payment_no
	 WHERE p.refunded_amount <> coalesce(r.total, 0)
		OR (p.status = ANY (payidem._paid_payment_statuses())
			AND (p.status = 'partially_refunded') <> (p.refunded_amount > 0 AND p.refunded_amount < p.amount))
		OR (p.status = ANY (payidem._paid_payment_statuses())
			AND (p.status = 'refunded') <> (p.refunded_amount = p.amount))
		OR (o.order_no IS NOT NULL AND o.refunded_amount <> p.refunded_amount)
	UNION ALL
	-- pending and succeeded refunds never exceed the payment
	SELECT 'refunds_within_payment', p.payment_no,
		   format('refunds pending and succeeded %s of %s', r.total, p.amount)
	  FROM payidem.payment p
	  JOIN (SELECT x.payment_no, sum(x.amount) AS total FROM payidem.refund x
			 WHERE x.status IN ('pending', 'succeeded') GROUP BY x.payment_no) r ON r.payment_no = p.payment_no
	 WHERE r.total > p.amount;
END;
COMMENT ON FUNCTION payidem.verify() IS
	'Re-derive the books'' invariants (journals balance, balances equal their entries, items settled as recorded and at most once, refund shares, payouts within the available balance, payout journals, paid orders and payments complete, refunded amounts add up): one row per violation, none when the books are right. Read-only; runs on a standby.';

------------------------------------------------------------------------------
-- The triggers of the settlement tables
------------------------------------------------------------------------------

-- The journal's rules at commit (src/journal.c): what each statement adds to
-- ledger_entry and changes in merchant_balance is summed; a transaction whose
-- journals do not balance, or whose balances moved otherwise than their
-- entries, is refused at commit (PI002).
CREATE FUNCTION payidem._journal_capture()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_journal_capture'
LANGUAGE C;
COMMENT ON FUNCTION payidem._journal_capture() IS
	'Trigger journal_check on payidem.ledger_entry: the statement''s entries, for the check at commit that every journal balances and every balance moves with its entries.';
CREATE FUNCTION payidem._balance_capture()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_balance_capture'
LANGUAGE C;
COMMENT ON FUNCTION payidem._balance_capture() IS
	'Triggers balance_check_* on payidem.merchant_balance: the statement''s changes, for the check at commit that they equal the journal entries written with them.';
CREATE TRIGGER journal_check
	AFTER INSERT ON payidem.ledger_entry
	REFERENCING NEW TABLE AS new_entries
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._journal_capture();
CREATE TRIGGER balance_check_insert
	AFTER INSERT ON payidem.merchant_balance
	REFERENCING NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._balance_capture();
CREATE TRIGGER balance_check_update
	AFTER UPDATE ON payidem.merchant_balance
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._balance_capture();

-- The journal is append-only, for every role, also under
-- session_replication_role = replica (ENABLE ALWAYS), as status_log.
CREATE FUNCTION payidem._ledger_append_only()
RETURNS trigger
AS 'MODULE_PATHNAME', 'payidem_status_log_append_only'
LANGUAGE C;
COMMENT ON FUNCTION payidem._ledger_append_only() IS
	'Trigger on payidem.ledger_entry: refuses UPDATE, DELETE and TRUNCATE for every role.';
CREATE TRIGGER ledger_append_only
	BEFORE UPDATE OR DELETE OR TRUNCATE ON payidem.ledger_entry
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._ledger_append_only();
ALTER TABLE payidem.ledger_entry ENABLE ALWAYS TRIGGER ledger_append_only;

-- Payouts are guarded by the whitelist (entity payout) and logged in
-- status_log; their end is notified (src/notify.c).
CREATE CONSTRAINT TRIGGER status_guard
	AFTER INSERT OR UPDATE ON payidem.payout
	FOR EACH ROW EXECUTE FUNCTION payidem.status_guard('payout', 'payout_no');
CREATE TRIGGER status_notify
	AFTER UPDATE ON payidem.payout
	FOR EACH ROW
	EXECUTE FUNCTION payidem._status_event();

-- Money records are kept: no DELETE or TRUNCATE of payouts, adjustments,
-- balances or settled items, for any role.
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.payout
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.payout
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.adjustment
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.adjustment
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.merchant_balance
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.merchant_balance
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records
	BEFORE DELETE ON payidem.settlement_item
	FOR EACH ROW EXECUTE FUNCTION payidem._keep_money_records();
CREATE TRIGGER keep_money_records_truncate
	BEFORE TRUNCATE ON payidem.settlement_item
	FOR EACH STATEMENT EXECUTE FUNCTION payidem._keep_money_records();

-- A payment an anomaly or a difference named, once that is resolved, is held
-- for settlement: settle() found it through the open anomaly (or difference)
-- while it was open, and after a late success that is the only way it would
-- be found (docs/settlement.md, section 4).  For every writer of the two
-- tables (resolve_anomaly(), resolve_diff(), reconcile(), a DBA).
CREATE FUNCTION payidem._hold_resolved()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM payidem.payment p
				WHERE p.payment_no = NEW.payment_no AND p.status = ANY (payidem._paid_payment_statuses()))
	   AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item si WHERE si.item_no = NEW.payment_no) THEN
		INSERT INTO payidem.settlement_hold (payment_no) VALUES (NEW.payment_no) ON CONFLICT DO NOTHING;
	END IF;
	RETURN NULL;
END
$$;
COMMENT ON FUNCTION payidem._hold_resolved() IS
	'Trigger settlement_hold_on_resolve on payidem.anomaly and payidem.reconciliation: the paid, unsettled payment a resolved anomaly or difference names is held for settle().';
CREATE TRIGGER settlement_hold_on_resolve
	AFTER UPDATE OF handle_status ON payidem.anomaly
	FOR EACH ROW
	WHEN (OLD.handle_status = 'open' AND NEW.handle_status <> 'open' AND NEW.payment_no IS NOT NULL)
	EXECUTE FUNCTION payidem._hold_resolved();
CREATE TRIGGER settlement_hold_on_resolve
	AFTER UPDATE OF handle_status ON payidem.reconciliation
	FOR EACH ROW
	WHEN (OLD.handle_status = 'open' AND NEW.handle_status <> 'open' AND NEW.payment_no IS NOT NULL)
	EXECUTE FUNCTION payidem._hold_resolved();
