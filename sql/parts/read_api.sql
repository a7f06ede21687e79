------------------------------------------------------------------------------
-- The read API: an order with its attempts and refunds, as an application
-- reads it (it has no table privileges).  get_order() and find_order() are
-- C (src/read_api.c) only to know who calls and whether row-level security
-- applies to it; _read_order() decides, run as the tables' owner.
------------------------------------------------------------------------------

-- A point in time as an application reads it, whatever its session's
-- DateStyle and TimeZone: UTC, ISO 8601, microseconds.
-- C (src/notify.c), where the events' payloads are written with the same
-- code: the format is written once.
CREATE FUNCTION payidem._utc(t timestamptz)
RETURNS text
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
AS 'MODULE_PATHNAME', 'payidem_utc';
COMMENT ON FUNCTION payidem._utc(timestamptz) IS
	'Internal: a timestamp as UTC ISO 8601 text (2026-11-30T07:33:36.463208Z), for payloads and the read API.';

-- An order's own fields as the read API shows them: the top of get_order()
-- and each row of list_orders().  Every name schema-qualified and no SET
-- clause, so that a query calling it can inline it.  (A string body: a
-- parsed one would tie the tables' row types to these functions and refuse
-- an ALTER TABLE of them that rewrites the table.)
CREATE FUNCTION payidem._order_fields(o payidem."order")
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'order_no', o.order_no, 'merchant_no', o.merchant_no, 'out_trade_no', o.out_trade_no,
	'subject', o.subject, 'body', o.body, 'amount', o.amount, 'currency', o.currency,
	'status', o.status, 'refunded_amount', o.refunded_amount, 'paid_payment_no', o.paid_payment_no,
	'paid_at', payidem._utc(o.paid_at), 'expire_at', payidem._utc(o.expire_at),
	'closed_at', payidem._utc(o.closed_at), 'created_at', payidem._utc(o.created_at),
	'updated_at', payidem._utc(o.updated_at), 'notify_url', o.notify_url, 'return_url', o.return_url)
$$;
COMMENT ON FUNCTION payidem._order_fields(payidem."order") IS
	'Internal to the read API: an order''s own fields as JSON (times in UTC ISO 8601).';

-- An anomaly and a reconciliation difference as the read API shows them
-- (get_order(), list_anomalies(), list_differences()).
CREATE FUNCTION payidem._anomaly_fields(a payidem.anomaly)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'anomaly_id', a.anomaly_id, 'kind', a.kind, 'order_no', a.order_no, 'payment_no', a.payment_no,
	'channel_no', a.channel_no, 'amount', a.amount, 'action', a.detail OPERATOR(pg_catalog.->>) 'action',
	'detail', a.detail, 'handle_status', a.handle_status, 'handled_by', a.handled_by,
	'handled_at', payidem._utc(a.handled_at), 'note', a.note, 'created_at', payidem._utc(a.created_at))
$$;
COMMENT ON FUNCTION payidem._anomaly_fields(payidem.anomaly) IS
	'Internal to the read API: an anomaly as JSON (times in UTC ISO 8601).';
CREATE FUNCTION payidem._difference_fields(r payidem.reconciliation)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
SELECT pg_catalog.jsonb_build_object(
	'recon_id', r.recon_id, 'recon_batch_no', r.recon_batch_no, 'channel_no', r.channel_no,
	'bill_date', r.bill_date, 'diff_type', r.diff_type, 'transaction_id', r.transaction_id,
	'payment_no', r.payment_no, 'platform_amount', r.platform_amount, 'channel_amount', r.channel_amount,
	'platform_status', r.platform_status, 'channel_status', r.channel_status,
	'platform_fee', r.platform_fee, 'channel_fee', r.channel_fee, 'handle_status', r.handle_status,
	'handled_by', r.handled_by, 'handled_at', payidem._utc(r.handled_at), 'note', r.note,
	'created_at', payidem._utc(r.created_at))
$$;
COMMENT ON FUNCTION payidem._difference_fields(payidem.reconciliation) IS
	'Internal to the read API: a reconciliation difference as JSON (times in UTC ISO 8601).';

-- PL/pgSQL, not SQL: its one expression is planned once per session (an SQL
-- function with a SET clause is parsed and planned again at every call)
CREATE FUNCTION payidem._order_json(o payidem."order")
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
RETURN payidem._order_fields(o) || jsonb_build_object(
	'payments', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'payment_no', p.payment_no, 'channel_no', p.channel_no, 'amount', p.amount,
					'status', p.status, 'transaction_id', p.transaction_id, 'fee_amount', p.fee_amount,
					'cost_amount', p.cost_amount, 'refunded_amount', p.refunded_amount,
					'paid_at', payidem._utc(p.paid_at), 'closed_at', payidem._utc(p.closed_at),
					'created_at', payidem._utc(p.created_at)) ORDER BY p.created_at, p.payment_no)
		  FROM payidem.payment p WHERE p.order_no = o.order_no), '[]'),
	'refunds', coalesce((
		SELECT jsonb_agg(jsonb_build_object(
					'refund_no', r.refund_no, 'payment_no', r.payment_no, 'out_refund_no', r.out_refund_no,
					'amount', r.amount, 'status', r.status, 'channel_refund_id', r.channel_refund_id,
					'reason', r.reason, 'refunded_at', payidem._utc(r.refunded_at),
					'created_at', payidem._utc(r.created_at)) ORDER BY r.created_at, r.refund_no)
		  FROM payidem.refund r WHERE r.order_no = o.order_no), '[]'),
	'anomalies', coalesce((
		SELECT jsonb_agg(payidem._anomaly_fields(a) ORDER BY a.created_at, a.anomaly_id)
		  FROM payidem.anomaly a WHERE a.order_no = o.order_no), '[]'));
END
$$;
COMMENT ON FUNCTION payidem._order_json(payidem."order") IS
	'Internal to get_order() and find_order(): the order, its attempts, its refunds and its anomalies as one JSON object (times in UTC ISO 8601).';

-- Who reads what (get_order(), find_order(), list_orders(), list_anomalies(),
-- list_differences()).  src/read_api.c says whether row-level security
-- scopes the caller (scoped: it applies to the caller, which may read the
-- tables); a caller that reads a merchant's rows (mapped itself or as a
-- member of a mapped role) is scoped too, whatever its SELECTs (a REVOKE
-- never widens what it reads).  A scoped caller that may also execute the
-- rest of the API (a combination grant_app() and map_merchant_role() refuse,
-- made by a later GRANT of membership or before 1.1) is refused (42501), as
-- the rest would act for every merchant for it; any other scoped caller
-- reads what its row-level security shows it (the policies' rule,
-- _row_visible): an auditor everything, a reporting role its merchants', a
-- role unmapped nothing.  A caller not scoped (the tables' owner, a
-- superuser, an application role: functions only) reads every merchant's.
-- Returns whether the caller is scoped.
CREATE FUNCTION payidem._check_reader(caller regrole, scoped boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	a record;
	v_scoped boolean := scoped;
BEGIN
	IF NOT v_scoped THEN
		-- the caller and the roles it is a member of, up the memberships (by
		-- index: the few roles above the caller, not every mapping; a member
		-- that does not inherit counts too, which only scopes more)
		v_scoped := EXISTS (
				WITH RECURSIVE up(r) AS (
					SELECT caller::oid
					UNION
					SELECT am.roleid FROM pg_auth_members am JOIN up ON am.member = up.r)
				SELECT 1 FROM up, LATERAL (SELECT 1 FROM payidem.merchant_role m
											WHERE m.role = up.r::regrole LIMIT 1) x)
			AND NOT EXISTS (SELECT 1 FROM pg_roles u
							 WHERE u.oid = caller::oid AND (u.rolsuper OR u.rolbypassrls));
	END IF;
	IF v_scoped THEN
		SELECT * INTO a FROM payidem._app_merchant_roles(caller) LIMIT 1;
		IF FOUND THEN
			PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function, NULL);
		END IF;
	END IF;
	RETURN v_scoped;
END
$$;
COMMENT ON FUNCTION payidem._check_reader(regrole, boolean) IS
	'Internal to the read API: whether the caller''s reads are scoped to the merchants its row-level security shows it (also a mapped role without SELECTs); refuses (42501) a scoped caller that may also execute the API functions that are not scoped to a merchant.';

-- An order, by number or by merchant and out_trade_no, if the caller may
-- read it (_check_reader).
CREATE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it; a number
		-- that is not one is 22023, checked only here: a stored order's is one)
		IF NOT FOUND OR (v_scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			PERFORM payidem._check_number('order', _read_order.order_no);
			PERFORM payidem._raise_not_found('order', _read_order.order_no, 'payidem."order"', 'order_no');
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (v_scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			PERFORM payidem._raise('PI009', format('merchant %s has no order %s',
				quote_literal(left(_read_order.merchant_no, 64)), quote_literal(left(_read_order.out_trade_no, 64))),
				'payidem."order" has no row with that merchant_no and out_trade_no.');
		END IF;
	END IF;
	RETURN payidem._order_json(o);
END
$$;
COMMENT ON FUNCTION payidem._read_order(text, text, text, regrole, boolean) IS
	'Internal to get_order() and find_order() (src/read_api.c): the order as JSON, if the caller may read it; PI009 otherwise.';

CREATE FUNCTION payidem.get_order(order_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_get_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.get_order(text) IS
	'The order with its payment attempts, refunds and anomalies, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number, 42501 for a caller that also reads a merchant''s rows and may execute the rest of the API (map_merchant_role).';

CREATE FUNCTION payidem.find_order(merchant_no text, out_trade_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_find_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.find_order(text, text) IS
	'The order a merchant created with out_trade_no, as get_order() shows it. PI009 if there is none (or the caller''s row-level security hides it), 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';


-- Since 1.1.  A merchant named to a read the caller may make: it exists and,
-- for a scoped caller, is one of those its row-level security shows it
-- (another is PI009, as if it did not exist).
CREATE FUNCTION payidem._check_readable_merchant(merchant_no text, caller regrole, scoped boolean)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM payidem.merchant m WHERE m.merchant_no = _check_readable_merchant.merchant_no)
	   OR (scoped AND NOT payidem._row_visible(merchant_no, caller)) THEN
		PERFORM payidem._raise_not_found('merchant', merchant_no, 'payidem.merchant', 'merchant_no');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_readable_merchant(text, regrole, boolean) IS
	'Internal to the read API: PI009 for a merchant that does not exist or the caller may not read.';

-- Since 1.1.  A merchant's orders, newest first, a page at a time, by order
-- number: on one database a number grows with each order issued, the issue
-- second first (gen_order_no: never backwards, also across a clock step);
-- after is the last order_no of the page before, a position only (keyset
-- pagination: a page costs the same however deep it is, and an order created
-- meanwhile never shifts one).  order_merchant_key (merchant_no, order_no)
-- serves it.
CREATE FUNCTION payidem._list_orders(merchant_no text, after text, max_rows integer, status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._require('merchant_no', v_merchant_no);
	PERFORM payidem._check_page_size(v_max_rows);
	PERFORM payidem._check_readable_merchant(v_merchant_no, caller, v_scoped);
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('order status', v_status,
			ARRAY(SELECT s.status FROM payidem.state s WHERE s.entity = 'order' ORDER BY s.status));
	END IF;
	IF v_after IS NULL THEN
		RETURN QUERY
		SELECT payidem._order_fields(o) FROM payidem."order" o
		 WHERE o.merchant_no = v_merchant_no AND (v_status IS NULL OR o.status = v_status)
		 ORDER BY o.order_no DESC
		 LIMIT v_max_rows;
		RETURN;
	END IF;
	PERFORM payidem._check_number('order', v_after);
	RETURN QUERY
	SELECT payidem._order_fields(o) FROM payidem."order" o
	 WHERE o.merchant_no = v_merchant_no AND o.order_no < v_after
	   AND (v_status IS NULL OR o.status = v_status)
	 ORDER BY o.order_no DESC
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_orders(text, text, integer, text, regrole, boolean) IS
	'Internal to list_orders() (src/read_api.c): a page of a merchant''s orders the caller may read.';

CREATE FUNCTION payidem.list_orders(merchant_no text, after text DEFAULT NULL, max_rows integer DEFAULT 100,
	status text DEFAULT NULL)
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_orders(text, text, integer, text) IS
	'A merchant''s orders, newest first (by order number), max_rows (1 to 1000) at a time, each as get_order() shows the order itself (without attempts, refunds and anomalies); only those of status if given. The next page: after = the last order_no of this one. PI009 unknown merchant (or one the caller''s row-level security hides), 22023 bad max_rows, status or order number.';

-- Since 1.1.  The work queues a support team follows up: anomalies (money
-- that needs a person; resolve_anomaly()) and reconciliation differences
-- (resolve_diff()), oldest first by id, a page at a time: after is the last
-- id of the page before, a position only (any number; a row resolved
-- meanwhile moves no page), so that pages of several shards merge by id
-- (the router).  Open ones by default; handle_status NULL lists all.  A
-- scoped caller sees the anomalies of its merchants' orders (the rule of
-- anomaly's row-level security) and the differences of its merchants'
-- payments.
CREATE FUNCTION payidem._list_anomalies(merchant_no text, after bigint, max_rows integer, handle_status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_merchant_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._check_page_size(v_max_rows);
	IF v_merchant_no IS NOT NULL THEN
		PERFORM payidem._check_readable_merchant(v_merchant_no, caller, v_scoped);
	END IF;
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('handle status', v_status, ARRAY['open', 'handled', 'ignored']);
	END IF;
	RETURN QUERY
	SELECT payidem._anomaly_fields(a)
	  FROM payidem.anomaly a
	  LEFT JOIN payidem."order" o ON o.order_no = a.order_no
	 WHERE a.anomaly_id > coalesce(v_after, -1)
	   AND (v_status IS NULL OR a.handle_status = v_status)
	   AND (v_merchant_no IS NULL OR o.merchant_no = v_merchant_no)
	   AND (NOT v_scoped OR payidem._row_visible(o.merchant_no, caller))
	 ORDER BY a.anomaly_id
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_anomalies(text, bigint, integer, text, regrole, boolean) IS
	'Internal to list_anomalies() (src/read_api.c): a page of the anomalies the caller may read.';

CREATE FUNCTION payidem.list_anomalies(merchant_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_anomalies(text, bigint, integer, text) IS
	'Anomalies (money that needs a person), oldest first (by anomaly_id), max_rows (1 to 1000) at a time: open ones unless handle_status says otherwise (NULL: all), of one merchant''s orders if merchant_no is given. Each with its anomaly_id (for resolve_anomaly()), kind, amount, its detail and the action it asks for where it names one. The next page: after = the last anomaly_id of this one.';

CREATE FUNCTION payidem._list_differences(channel_no text, after bigint, max_rows integer, handle_status text,
	caller regrole, scoped boolean)
RETURNS SETOF jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_channel_no ALIAS FOR $1;
	v_after ALIAS FOR $2;
	v_max_rows ALIAS FOR $3;
	v_status ALIAS FOR $4;
	v_scoped boolean;
BEGIN
	v_scoped := payidem._check_reader(caller, scoped);
	PERFORM payidem._check_page_size(v_max_rows);
	IF v_channel_no IS NOT NULL AND NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no = v_channel_no) THEN
		PERFORM payidem._raise_not_found('channel', v_channel_no, 'payidem.channel', 'channel_no');
	END IF;
	IF v_status IS NOT NULL THEN
		PERFORM payidem._check_one_of('handle status', v_status, ARRAY['open', 'handled', 'ignored', 'auto_resolved']);
	END IF;
	RETURN QUERY
	SELECT payidem._difference_fields(r)
	  FROM payidem.reconciliation r
	  LEFT JOIN payidem.payment p ON p.payment_no = r.payment_no
	 WHERE r.recon_id > coalesce(v_after, -1)
	   AND (v_status IS NULL OR r.handle_status = v_status)
	   AND (v_channel_no IS NULL OR r.channel_no = v_channel_no)
	   AND (NOT v_scoped OR payidem._row_visible(p.merchant_no, caller))
	 ORDER BY r.recon_id
	 LIMIT v_max_rows;
END
$$;
COMMENT ON FUNCTION payidem._list_differences(text, bigint, integer, text, regrole, boolean) IS
	'Internal to list_differences() (src/read_api.c): a page of the reconciliation differences the caller may read.';

CREATE FUNCTION payidem.list_differences(channel_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'payidem_read_for_caller'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.list_differences(text, bigint, integer, text) IS
	'Reconciliation differences, oldest first (by recon_id), max_rows (1 to 1000) at a time: open ones unless handle_status says otherwise (NULL: all), of one channel if channel_no is given. Each with its recon_id (for resolve_diff()), type, both sides'' amounts, statuses and fees. The next page: after = the last recon_id of this one.';

-- A jsonb value in its stored form, for the router (get_order()'s document
-- reaches it without being printed and parsed again).
CREATE FUNCTION payidem._jsonb_stored(value jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'payidem_jsonb_stored'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._jsonb_stored(jsonb) IS
	'Internal to the router: a jsonb value''s stored (binary) form, as bytea.';
