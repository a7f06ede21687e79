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

-- (a string body: a parsed one would tie the tables' row types to this
-- function and refuse an ALTER TABLE of them that rewrites the table)
CREATE FUNCTION payidem._order_json(o payidem."order")
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
SELECT jsonb_build_object(
	'order_no', o.order_no, 'merchant_no', o.merchant_no, 'out_trade_no', o.out_trade_no,
	'subject', o.subject, 'body', o.body, 'amount', o.amount, 'currency', o.currency,
	'status', o.status, 'refunded_amount', o.refunded_amount, 'paid_payment_no', o.paid_payment_no,
	'paid_at', payidem._utc(o.paid_at), 'expire_at', payidem._utc(o.expire_at),
	'closed_at', payidem._utc(o.closed_at), 'created_at', payidem._utc(o.created_at),
	'updated_at', payidem._utc(o.updated_at), 'notify_url', o.notify_url, 'return_url', o.return_url,
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
		  FROM payidem.refund r WHERE r.order_no = o.order_no), '[]'))
$$;
COMMENT ON FUNCTION payidem._order_json(payidem."order") IS
	'Internal to get_order() and find_order(): the order, its attempts and its refunds as one JSON object (times in UTC ISO 8601).';

-- Who reads what: a caller row-level security does not apply to, or one
-- without SELECT on "order" (an application role), reads every order; a
-- caller that reads a merchant's rows (mapped itself or as a member of a
-- mapped role: a combination grant_app() and map_merchant_role() refuse, made
-- by a later GRANT of membership or before 1.1) is refused (42501), as the
-- rest of the API would act for every merchant for it; any other reads what
-- its row-level security shows it (the policies' rule, _row_visible): an
-- auditor everything, a role unmapped nothing.
CREATE FUNCTION payidem._read_order(order_no text, merchant_no text, out_trade_no text,
	caller regrole, scoped boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	o payidem."order";
	a record;
BEGIN
	IF scoped THEN
		SELECT * INTO a FROM payidem._app_merchant_roles(caller) LIMIT 1;
		IF FOUND THEN
			PERFORM payidem._refuse_app_merchant_role(a.role, a.mapped_role, a.merchant_no, a.app_function, NULL);
		END IF;
	END IF;
	IF _read_order.merchant_no IS NULL AND _read_order.out_trade_no IS NULL THEN
		PERFORM payidem._check_number('order', _read_order.order_no);
		SELECT * INTO o FROM payidem."order" x WHERE x.order_no = _read_order.order_no;
		-- (an order the caller may not read does not exist for it)
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
			PERFORM payidem._raise_not_found('order', _read_order.order_no, 'payidem."order"', 'order_no');
		END IF;
	ELSE
		PERFORM payidem._require('merchant_no', _read_order.merchant_no);
		PERFORM payidem._require('out_trade_no', _read_order.out_trade_no);
		SELECT * INTO o FROM payidem."order" x
		 WHERE x.merchant_no = _read_order.merchant_no AND x.out_trade_no = _read_order.out_trade_no;
		IF NOT FOUND OR (scoped AND NOT payidem._row_visible(o.merchant_no, caller)) THEN
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
	'The order with its payment attempts and refunds, as JSON (times in UTC ISO 8601). PI009 unknown (or one the caller''s row-level security hides), 22023 malformed number, 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

CREATE FUNCTION payidem.find_order(merchant_no text, out_trade_no text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'payidem_find_order'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION payidem.find_order(text, text) IS
	'The order a merchant created with out_trade_no, as get_order() shows it. PI009 if there is none (or the caller''s row-level security hides it), 42501 for a caller that also reads a merchant''s rows (map_merchant_role).';

