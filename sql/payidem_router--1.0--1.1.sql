-- payidem_router 1.0 -> 1.1 (ALTER EXTENSION payidem_router UPDATE TO '1.1').
-- A router installed as 1.1 is 1.0 updated by this script.
\echo Use "ALTER EXTENSION payidem_router UPDATE TO '1.1'" to load this file. \quit

-- #38: a number is placed with payidem's own codec, not with a copy of its
-- check digits.  The codec is C in the payidem library, which the package of
-- this extension installs with it (a router host has it, whether or not it
-- preloads payidem: these functions need no shared memory); payidem's SQL
-- names order_no_valid() and order_no_parse() are the router's own functions
-- here (routed to a shard), so the library's are declared under these names.
CREATE FUNCTION payidem._number_valid(number text)
RETURNS boolean
AS '$libdir/payidem', 'payidem_order_no_valid'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._number_valid(text) IS
	'payidem''s order_no_valid(), run here (the payidem library): a well-formed number with correct check digits; false for NULL.';
CREATE FUNCTION payidem._number_parse(number text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
AS '$libdir/payidem', 'payidem_order_no_parse'
LANGUAGE C IMMUTABLE PARALLEL SAFE ROWS 1;
COMMENT ON FUNCTION payidem._number_parse(text) IS
	'payidem''s order_no_parse(), run here (the payidem library): the parts of a valid number; 22023 otherwise.';
REVOKE ALL ON FUNCTION payidem._number_valid(text), payidem._number_parse(text) FROM PUBLIC;

-- The partition that holds the row of an order, payment or refund number:
-- the shard it names, if the number is valid and of that kind and the shard
-- exists.  No lookup table.  SECURITY DEFINER: the codec is granted to no
-- one, and an application role calls this one (grant_app) in every routing.
CREATE OR REPLACE FUNCTION payidem.partition_of(number text, kind text)
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'refund' THEN 'RF' END;
	v_shard  integer;
BEGIN
	IF v_prefix IS NULL THEN
		RAISE EXCEPTION 'unknown kind of number %', coalesce(quote_literal(kind), 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'The kinds are order, payment and refund.';
	END IF;
	-- A number this cluster cannot place -- malformed, of another kind, with
	-- wrong check digits (a mistyped shard digit must not reach another
	-- shard), of a shard it does not have -- goes to partition 0, which
	-- refuses it in the words of one database.
	IF left(number, 2) IS DISTINCT FROM v_prefix OR NOT payidem._number_valid(number) THEN
		RETURN 0;
	END IF;
	SELECT n.shard INTO v_shard FROM payidem._number_parse(number) n;
	IF v_shard >= payidem.cluster_partitions() THEN
		RETURN 0;
	END IF;
	RETURN v_shard;
END
$$;
COMMENT ON FUNCTION payidem.partition_of(text, text) IS
	'Partition holding an order (kind order), payment or refund number: the shard it names (payidem''s codec); 0 for a number the cluster cannot place (invalid, of another kind, a shard outside the cluster), which partition 0 refuses as one database does.';

------------------------------------------------------------------------------
-- Settlement (DESIGN section 11): settle and verify on every shard; payouts,
-- adjustments and balance() on the merchant's partition (payout results by
-- the shard digits of the payout number); the views of the books summed.
-- reconcile() reports fee_mismatch too.
------------------------------------------------------------------------------

-- A payout number names its shard, as an order number does.
CREATE OR REPLACE FUNCTION payidem.partition_of(number text, kind text)
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'refund' THEN 'RF'
							   WHEN 'payout' THEN 'PT' END;
	v_shard  integer;
BEGIN
	IF v_prefix IS NULL THEN
		RAISE EXCEPTION 'unknown kind of number %', coalesce(quote_literal(kind), 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'The kinds are order, payment, refund and payout.';
	END IF;
	IF left(number, 2) IS DISTINCT FROM v_prefix OR NOT payidem._number_valid(number) THEN
		RETURN 0;
	END IF;
	SELECT n.shard INTO v_shard FROM payidem._number_parse(number) n;
	IF v_shard >= payidem.cluster_partitions() THEN
		RETURN 0;
	END IF;
	RETURN v_shard;
END
$$;
COMMENT ON FUNCTION payidem.partition_of(text, text) IS
	'Partition holding an order (kind order), payment, refund or payout number: the shard it names (payidem''s codec); 0 for a number the cluster cannot place (invalid, of another kind, a shard outside the cluster), which partition 0 refuses as one database does.';
CREATE FUNCTION payidem.payout_partition(payout_no text) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem.partition_of(payout_no, 'payout');

-- Each function below that reaches a shard is wrapped as the install wraps
-- the others: the PL/Proxy (or SQL) part kept as _proxy_<name>, and a
-- PL/pgSQL function of the API's name and arguments that calls it and raises
-- what a shard raised as the shard raised it (payidem._shard_error).
CREATE FUNCTION payidem._wrap_shard_call(fn regprocedure, volatility text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $wrap$
DECLARE
	f record;
	v_call text;
	v_body text;
BEGIN
	SELECT p.oid, p.proname, p.proretset, p.prorettype, p.pronargs, p.prosrc, l.lanname,
		   pg_catalog.pg_get_function_arguments(p.oid) AS args,
		   pg_catalog.pg_get_function_identity_arguments(p.oid) AS idargs,
		   pg_catalog.pg_get_function_result(p.oid) AS result,
		   pg_catalog.obj_description(p.oid, 'pg_proc') AS comment
	  INTO f
	  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
	 WHERE p.oid = fn;
	EXECUTE format('ALTER FUNCTION payidem.%I(%s) RENAME TO %I', f.proname, f.idargs, '_proxy_' || f.proname);
	IF f.lanname = 'plproxy' AND f.prosrc !~* '\mselect\M' THEN
		EXECUTE format('CREATE OR REPLACE FUNCTION payidem.%I(%s) RETURNS %s LANGUAGE plproxy AS %L',
					   '_proxy_' || f.proname, f.args, f.result,
					   f.prosrc || format(E'\tTARGET payidem.%I;\n', f.proname));
	END IF;
	v_call := format('payidem.%I(%s)', '_proxy_' || f.proname,
					 (SELECT coalesce(string_agg('$' || i, ', ' ORDER BY i), '')
						FROM generate_series(1, f.pronargs) i));
	IF f.proretset THEN
		v_body := format('RETURN QUERY SELECT * FROM %s;', v_call);
	ELSIF f.prorettype = 'void'::regtype THEN
		v_body := format('PERFORM %s;', v_call);
	ELSE
		v_body := format('RETURN %s;', v_call);
	END IF;
	EXECUTE format($f$
		CREATE FUNCTION payidem.%I(%s) RETURNS %s
		LANGUAGE plpgsql %s SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $body$
		DECLARE
			v_state text; v_message text; v_detail text; v_hint text;
		BEGIN
			%s
		EXCEPTION WHEN OTHERS OR query_canceled THEN
			GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
				v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
			PERFORM payidem._shard_error(v_state, v_message, nullif(v_detail, ''), nullif(v_hint, ''));
		END
		$body$$f$, f.proname, f.args, f.result, volatility, v_body);
	IF f.comment IS NOT NULL THEN
		EXECUTE format('COMMENT ON FUNCTION payidem.%I(%s) IS %L', f.proname, f.idargs, f.comment);
	END IF;
END
$wrap$;
COMMENT ON FUNCTION payidem._wrap_shard_call(regprocedure, text) IS
	'Router, internal to its install and updates: keep a function that reaches a shard as _proxy_<name> and put the API''s function in its place, raising what a shard raised as the shard raised it.';

-- reconcile() with fee_mismatch: its three parts made again; the roles that
-- could execute it are named in a WARNING
SELECT pg_catalog.set_config('payidem_update.reconcile_grantees',
		coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(u.rolname), ','), ''), true)
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles u
 WHERE p.oid = 'payidem.reconcile(text, date, boolean)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee = u.oid AND a.grantee <> p.proowner;
DROP FUNCTION payidem.reconcile(text, date, boolean);
DROP FUNCTION payidem._proxy_reconcile(text, date, boolean);
DROP FUNCTION payidem._reconcile_all(text, date, boolean);
CREATE FUNCTION payidem._reconcile_all(channel_no text, bill_date date, allow_empty boolean)
RETURNS TABLE (recon_batch_no text, matched bigint, platform_only bigint,
			   channel_only bigint, amount_mismatch bigint, status_mismatch bigint, fee_mismatch bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT r.recon_batch_no, r.matched, r.platform_only, r.channel_only, r.amount_mismatch, r.status_mismatch,
		   r.fee_mismatch
	  FROM payidem.reconcile(channel_no, bill_date, allow_empty) r;
$$;
CREATE FUNCTION payidem.reconcile(channel_no text, bill_date date, allow_empty boolean DEFAULT false)
RETURNS TABLE(recon_batch_no text, matched bigint, platform_only bigint,
			  channel_only bigint, amount_mismatch bigint, status_mismatch bigint, fee_mismatch bigint)
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT pg_catalog.string_agg(DISTINCT r.recon_batch_no, ','),
		   pg_catalog.sum(r.matched)::bigint, pg_catalog.sum(r.platform_only)::bigint,
		   pg_catalog.sum(r.channel_only)::bigint, pg_catalog.sum(r.amount_mismatch)::bigint,
		   pg_catalog.sum(r.status_mismatch)::bigint, pg_catalog.sum(r.fee_mismatch)::bigint
	  FROM payidem._reconcile_all(channel_no, bill_date,
			   allow_empty IS TRUE
			   OR (SELECT pg_catalog.sum(n) FROM payidem._bill_lines_all(channel_no, bill_date) n) > 0) r;
END;
COMMENT ON FUNCTION payidem.reconcile(text, date, boolean) IS
	'Router: reconcile the channel''s day on every partition and return the summed counts (55000 if no partition holds a bill line of that day, unless allow_empty). recon_batch_no is the shards'' batch number (they agree when every run went through the router), else their distinct numbers joined with commas.';
SELECT payidem._wrap_shard_call('payidem.reconcile(text, date, boolean)', 'VOLATILE');
DO $$
BEGIN
	IF current_setting('payidem_update.reconcile_grantees') <> '' THEN
		RAISE WARNING 'reconcile() was made again with a new result column (fee_mismatch): roles % no longer may execute it',
			current_setting('payidem_update.reconcile_grantees') USING
			HINT = 'Run payidem.grant_app() for them again.';
	END IF;
END
$$;

-- settle() and verify() on every partition
CREATE FUNCTION payidem._settle_all(settle_date date)
RETURNS TABLE (merchant_no text, currency text, items bigint, gross numeric, refunds numeric,
			   fees numeric, net numeric, held bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT s.merchant_no, s.currency, s.items, s.gross, s.refunds, s.fees, s.net, s.held
	  FROM payidem.settle(settle_date) s;
$$;
CREATE FUNCTION payidem.settle(settle_date date DEFAULT CURRENT_DATE)
RETURNS TABLE (merchant_no text, currency text, items bigint, gross numeric, refunds numeric,
			   fees numeric, net numeric, held bigint)
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT s.* FROM payidem._settle_all(settle_date) s ORDER BY s.merchant_no, s.currency;
END;
COMMENT ON FUNCTION payidem.settle(date) IS
	'Router: settle(settle_date) on every partition (a merchant''s items are all on its own); one row per merchant and currency with items settled or held.';
CREATE FUNCTION payidem.verify()
RETURNS TABLE (invariant text, subject text, detail text)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
$$;
COMMENT ON FUNCTION payidem.verify() IS
	'Router: verify() on every partition: one row per violation of the books'' invariants found on any shard, none when the books are right.';

-- a merchant's payouts, adjustments and balances: on its partition
CREATE FUNCTION payidem.request_payout(merchant_no text, amount bigint, out_payout_no text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;
COMMENT ON FUNCTION payidem.request_payout(text, bigint, text, text) IS
	'Router: request_payout() on the merchant''s partition (merchant_partition()); the payout number names that shard.';
CREATE FUNCTION payidem.apply_payout_result(payout_no text, status text, bank_ref text DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payout_partition(payout_no);
$$;
COMMENT ON FUNCTION payidem.apply_payout_result(text, text, text) IS
	'Router: apply_payout_result() on the partition the payout number names.';
CREATE FUNCTION payidem.adjust_balance(merchant_no text, amount bigint, out_adjust_no text, reason text,
	currency text DEFAULT 'CNY')
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;
COMMENT ON FUNCTION payidem.adjust_balance(text, bigint, text, text, text) IS
	'Router: adjust_balance() on the merchant''s partition.';
CREATE FUNCTION payidem.balance(merchant_no text, currency text DEFAULT 'CNY')
RETURNS TABLE (pending numeric, available bigint, in_payout bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;
COMMENT ON FUNCTION payidem.balance(text, text) IS
	'Router: balance() on the merchant''s partition: pending, available and in-payout balances.';
-- a merchant's notification URL is reference data: on every partition
CREATE FUNCTION payidem._set_merchant_notify_url_all(merchant_no text, url text)
RETURNS SETOF void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.set_merchant_notify_url(merchant_no, url);
$$;
CREATE FUNCTION payidem.set_merchant_notify_url(merchant_no text, url text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._set_merchant_notify_url_all(merchant_no, url);
END
$$;
COMMENT ON FUNCTION payidem.set_merchant_notify_url(text, text) IS
	'Router: set the merchant''s notification URL (payout events) on every partition.';

-- the views' parts
CREATE FUNCTION payidem._merchant_balances_all()
RETURNS TABLE (merchant_no text, currency text, pending numeric, available bigint, in_payout bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.merchant_no, v.currency, v.pending, v.available, v.in_payout FROM payidem.merchant_balances v;
$$;
CREATE FUNCTION payidem._settlement_summary_all()
RETURNS TABLE (settle_day date, merchant_no text, currency text, items bigint, gross numeric,
			   refunds numeric, fees numeric, net numeric)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.settle_day, v.merchant_no, v.currency, v.items, v.gross, v.refunds, v.fees, v.net
	  FROM payidem.settlement_summary v;
$$;
CREATE FUNCTION payidem._platform_margin_all()
RETURNS TABLE (bill_day date, channel_no text, currency text, fee_revenue numeric, channel_cost numeric,
			   margin numeric)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.bill_day, v.channel_no, v.currency, v.fee_revenue, v.channel_cost, v.margin
	  FROM payidem.platform_margin v;
$$;

SELECT payidem._wrap_shard_call(f::regprocedure, v)
  FROM (VALUES ('payidem.settle(date)', 'VOLATILE'), ('payidem.verify()', 'STABLE'),
			   ('payidem.request_payout(text, bigint, text, text)', 'VOLATILE'),
			   ('payidem.apply_payout_result(text, text, text)', 'VOLATILE'),
			   ('payidem.adjust_balance(text, bigint, text, text, text)', 'VOLATILE'),
			   ('payidem.balance(text, text)', 'STABLE'),
			   ('payidem.set_merchant_notify_url(text, text)', 'VOLATILE'),
			   ('payidem._merchant_balances_all()', 'VOLATILE'),
			   ('payidem._settlement_summary_all()', 'VOLATILE'),
			   ('payidem._platform_margin_all()', 'VOLATILE')) w(f, v);

-- The views, summed over the partitions (a merchant's rows are on one; the
-- platform's accounts are per shard)
CREATE VIEW payidem.merchant_balances AS
SELECT b.merchant_no, b.currency, pg_catalog.sum(b.pending) AS pending,
	   pg_catalog.sum(b.available)::bigint AS available, pg_catalog.sum(b.in_payout)::bigint AS in_payout
  FROM payidem._merchant_balances_all() b
 GROUP BY b.merchant_no, b.currency;
COMMENT ON VIEW payidem.merchant_balances IS
	'Router: every merchant''s pending, available and in-payout balance per currency, from every shard.';
CREATE VIEW payidem.settlement_summary AS
SELECT s.settle_day, s.merchant_no, s.currency, pg_catalog.sum(s.items)::bigint AS items,
	   pg_catalog.sum(s.gross) AS gross, pg_catalog.sum(s.refunds) AS refunds, pg_catalog.sum(s.fees) AS fees,
	   pg_catalog.sum(s.net) AS net
  FROM payidem._settlement_summary_all() s
 GROUP BY s.settle_day, s.merchant_no, s.currency;
COMMENT ON VIEW payidem.settlement_summary IS
	'Router: what was settled per settlement day, merchant and currency, from every shard.';
CREATE VIEW payidem.platform_margin AS
SELECT m.bill_day, m.channel_no, m.currency, pg_catalog.sum(m.fee_revenue) AS fee_revenue,
	   pg_catalog.sum(m.channel_cost) AS channel_cost, pg_catalog.sum(m.margin) AS margin
  FROM payidem._platform_margin_all() m
 GROUP BY m.bill_day, m.channel_no, m.currency;
COMMENT ON VIEW payidem.platform_margin IS
	'Router: what the platform earned on settled items per bill day, channel and currency, every shard''s summed.';

-- what an application reads and follows up (DESIGN section 7)
-- apply_payment_result_ex(): on the payment's partition, its transaction id
-- placed as apply_payment_result() places it
CREATE FUNCTION payidem._proxy_apply_payment_result_ex(payment_no text, source text, status text,
	transaction_id text, amount bigint, paid_at timestamptz, raw jsonb,
	OUT outcome text, OUT anomaly_id bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payment_partition(payment_no);
	TARGET payidem.apply_payment_result_ex;
$$;
CREATE FUNCTION payidem.apply_payment_result_ex(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL,
	OUT outcome text, OUT anomaly_id bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $$
DECLARE
	v_state text; v_message text; v_detail text; v_hint text;
BEGIN
	SELECT r.outcome, r.anomaly_id INTO outcome, anomaly_id
	  FROM payidem._proxy_apply_payment_result_ex($1, $2, $3, $4, $5, $6, $7) r;
	outcome := payidem._place_transaction(outcome, $1, $3, $4);
EXCEPTION WHEN OTHERS OR query_canceled THEN
	GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
		v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
	PERFORM payidem._shard_error(v_state, v_message, nullif(v_detail, ''), nullif(v_hint, ''));
END
$$;
COMMENT ON FUNCTION payidem.apply_payment_result_ex(text, text, text, text, bigint, timestamptz, jsonb) IS
	'Router: apply_payment_result_ex() on the partition the payment number names: the outcome and the anomaly it names (resolve_anomaly() through the router takes its id).';

-- a merchant's orders: on its partition
CREATE FUNCTION payidem.list_orders(merchant_no text, after text DEFAULT NULL, max_rows integer DEFAULT 100,
	status text DEFAULT NULL)
RETURNS SETOF jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;
COMMENT ON FUNCTION payidem.list_orders(text, text, integer, text) IS
	'Router: list_orders() on the merchant''s partition, where its orders are.';
SELECT payidem._wrap_shard_call('payidem.list_orders(text, text, integer, text)', 'STABLE');

-- the work queues: every partition's page, merged by id (the ids of the
-- shards never collide) and cut to max_rows
CREATE FUNCTION payidem._list_anomalies_all(merchant_no text, after bigint, max_rows integer, handle_status text)
RETURNS SETOF jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT x FROM payidem.list_anomalies(merchant_no, after, max_rows, handle_status) x;
$$;
CREATE FUNCTION payidem.list_anomalies(merchant_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT x FROM payidem._list_anomalies_all(merchant_no, after, max_rows, handle_status) x
	 ORDER BY (x OPERATOR(pg_catalog.->>) 'anomaly_id')::bigint
	 LIMIT GREATEST(max_rows, 1);	-- (a LIMIT 0 would not ask the shards, which refuse it)
END;
COMMENT ON FUNCTION payidem.list_anomalies(text, bigint, integer, text) IS
	'Router: list_anomalies() on every partition, one page of them all, oldest first by anomaly_id.';
SELECT payidem._wrap_shard_call('payidem.list_anomalies(text, bigint, integer, text)', 'STABLE');
CREATE FUNCTION payidem._list_differences_all(channel_no text, after bigint, max_rows integer, handle_status text)
RETURNS SETOF jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT x FROM payidem.list_differences(channel_no, after, max_rows, handle_status) x;
$$;
CREATE FUNCTION payidem.list_differences(channel_no text DEFAULT NULL, after bigint DEFAULT NULL,
	max_rows integer DEFAULT 100, handle_status text DEFAULT 'open')
RETURNS SETOF jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT x FROM payidem._list_differences_all(channel_no, after, max_rows, handle_status) x
	 ORDER BY (x OPERATOR(pg_catalog.->>) 'recon_id')::bigint
	 LIMIT GREATEST(max_rows, 1);	-- (a LIMIT 0 would not ask the shards, which refuse it)
END;
COMMENT ON FUNCTION payidem.list_differences(text, bigint, integer, text) IS
	'Router: list_differences() on every partition, one page of them all, oldest first by recon_id.';
SELECT payidem._wrap_shard_call('payidem.list_differences(text, bigint, integer, text)', 'STABLE');

-- health(): every shard's, and ok only if each is
CREATE FUNCTION payidem._health_all()
RETURNS SETOF jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.health();
$$;
CREATE FUNCTION payidem.health()
RETURNS jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	WITH s AS MATERIALIZED (SELECT h FROM payidem._health_all() h)
	SELECT jsonb_build_object(
		'status', CASE WHEN bool_and(s.h OPERATOR(pg_catalog.->>) 'status' = 'ok') THEN 'ok' ELSE 'degraded' END,
		'problems', coalesce((SELECT jsonb_agg(format('shard %s: %s', t.h OPERATOR(pg_catalog.->>) 'shard_id', p.p)
											   ORDER BY (t.h OPERATOR(pg_catalog.->>) 'shard_id')::integer, p.n)
								FROM s t, jsonb_array_elements_text(t.h OPERATOR(pg_catalog.->) 'problems')
										  WITH ORDINALITY p(p, n)), '[]'::jsonb),
		'checked_at', min(s.h OPERATOR(pg_catalog.->>) 'checked_at'),
		'open_anomalies', sum((s.h OPERATOR(pg_catalog.->>) 'open_anomalies')::bigint),
		'open_differences', sum((s.h OPERATOR(pg_catalog.->>) 'open_differences')::bigint),
		'shards', jsonb_agg(s.h ORDER BY (s.h OPERATOR(pg_catalog.->>) 'shard_id')::integer))
	  FROM s;
END;
COMMENT ON FUNCTION payidem.health() IS
	'Router: health() of every shard: status ok only if every shard is ok, their problems each prefixed with its shard, the open anomalies and differences summed, and each shard''s health() in shards.';
SELECT payidem._wrap_shard_call('payidem.health()', 'VOLATILE');

-- the application's API gains the payout functions and balance()
CREATE OR REPLACE FUNCTION payidem.app_functions()
RETURNS SETOF regprocedure
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	WITH api(name) AS (
		SELECT unnest(ARRAY['gen_order_no', 'gen_order_no_for', 'order_no_valid', 'order_no_parse', 'stats', 'stats_by_shard',
						 'idem_claim', 'idem_record', 'idem_finish', 'idem_partition', '_partitions_before', '_growth_share_lock',
						 '_idem_key_held_on',
						 'transit_order', 'transit_payment', 'transit_refund',
						 'sign', 'verify_signature', 'route_channel', 'get_channel_config',
						 'create_order', 'begin_payment', 'apply_payment_result', 'close_payment',
						 'close_order', 'refund', 'apply_refund_result', 'notify_due', 'notify_due_on',
						 'notify_result', 'verify_notification', 'query_due', 'reconcile', 'resolve_diff',
						 'cluster_partitions', 'check_partition', 'partition_of', 'order_partition',
						 'payment_partition', 'refund_partition', 'recon_partition', 'event_partition',
						 'anomaly_partition', '_id_partition', 'get_order', 'find_order', 'resolve_anomaly',
						 'merchant_partition', '_place_transaction',
						 '_split_rows', '_notify_due_split', '_query_due_split', '_reconcile_all', '_bill_lines_all',
						 'request_payout', 'apply_payout_result', 'balance', 'payout_partition',
						 'apply_payment_result_ex', 'list_orders', 'list_anomalies', 'list_differences', 'health',
						 '_list_anomalies_all', '_list_differences_all', '_health_all']))
	SELECT p.oid::regprocedure
	  FROM pg_catalog.pg_proc p
	 WHERE p.pronamespace = 'payidem'::regnamespace
	   AND (p.proname IN (SELECT a.name FROM api a)
			OR p.proname IN (SELECT '_proxy_' || a.name FROM api a)
			OR p.proname IN ('_shard_error', '_shard_error_parts', '_partition_in', '_shard_failure'));
END;

------------------------------------------------------------------------------
-- #41: the router's hot calls without PL/Proxy's per-call costs.
-- gen_order_no(), get_order() and apply_payment_result() are C (router.c in
-- the payidem library): each goes to its shard over a connection this
-- backend keeps, as a statement the shard keeps prepared, and raises what
-- the shard raised as the shard raised it, with no exception block.  The
-- cluster is still PL/Proxy's (server payidem and its user mappings); the
-- other functions stay PL/Proxy functions.  The routing decisions -- the
-- partition count, a partition that exists, a number's partition -- are C
-- too, taken once for both kinds of function; the partition count is read
-- again only when server payidem changes.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION payidem.cluster_partitions()
RETURNS integer
AS '$libdir/payidem', 'payidem_router_cluster_partitions'
LANGUAGE C STABLE;

CREATE OR REPLACE FUNCTION payidem.check_partition(partition integer)
RETURNS integer
AS '$libdir/payidem', 'payidem_router_check_partition'
LANGUAGE C STABLE;

CREATE OR REPLACE FUNCTION payidem.partition_of(number text, kind text)
RETURNS integer
AS '$libdir/payidem', 'payidem_router_partition_of'
LANGUAGE C STABLE;

CREATE OR REPLACE FUNCTION payidem.gen_order_no(prefix text DEFAULT 'PO')
RETURNS text
AS '$libdir/payidem', 'payidem_router_call'
LANGUAGE C VOLATILE;

CREATE OR REPLACE FUNCTION payidem.get_order(order_no text)
RETURNS jsonb
AS '$libdir/payidem', 'payidem_router_call'
LANGUAGE C STABLE;

CREATE OR REPLACE FUNCTION payidem.apply_payment_result(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL)
RETURNS text
AS '$libdir/payidem', 'payidem_router_call'
LANGUAGE C VOLATILE;

-- A success's transaction id placed for bills, in C (the rule and the
-- write: router.c's place_transaction()); apply_payment_result() calls it
-- there, apply_payment_result_ex() through this function.
CREATE OR REPLACE FUNCTION payidem._place_transaction(outcome text, payment_no text, status text, transaction_id text)
RETURNS text
AS '$libdir/payidem', 'payidem_router_place_transaction'
LANGUAGE C VOLATILE;

-- A shard that cannot be reached, or was lost during a call, in the words
-- the C calls use (08006), for the PL/Proxy functions' error wrapper too.
CREATE FUNCTION payidem._shard_failure(lost boolean, partition integer, database text, reason text,
	OUT state text, OUT message text, OUT detail text, OUT hint text)
AS '$libdir/payidem', 'payidem_router_shard_failure'
LANGUAGE C STABLE;
COMMENT ON FUNCTION payidem._shard_failure(boolean, integer, text, text) IS
	'Router: 08006 for a shard that cannot be reached (lost false) or whose connection was lost during a call, naming its partition (NULL: not known) and database, with what libpq or the shard said as DETAIL.';

CREATE OR REPLACE FUNCTION payidem._shard_error_parts(INOUT state text, INOUT message text, INOUT detail text, INOUT hint text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- (the database is the one capturing group: 1.0 took the optional
	-- prefix's group for it, naming no database)
	v_remote constant text := '^(?:PL/Proxy function )?[^ ]+\([0-9]+\): \[([^]]*)\] REMOTE (?:ERROR|FATAL): ';
	v_local constant text := '^PL/Proxy function [^ ]+\([0-9]+\): \[([^]]*)\] ';
	v_db text;
	v_lost boolean;
BEGIN
	IF message ~ v_remote THEN
		v_db := substring(message FROM v_remote);
		message := regexp_replace(message, v_remote, '');
		detail := nullif(regexp_replace(detail, '^Remote detail: ', ''), '');
		hint := nullif(regexp_replace(hint, '^Remote hint: ', ''), '');
		IF state !~ '^57P0' THEN
			RETURN;
		END IF;
		-- the shard ended the session (shut down, terminated): the call was lost
		v_lost := true;
		detail := message;
	ELSIF message ~ v_local AND message ~* 'connect|connection' THEN
		v_db := substring(message FROM v_local);
		v_lost := message !~ '\] PQconnect';
		detail := regexp_replace(message, v_local || '(PQ[A-Za-z]+: )?', '');
	ELSE
		RETURN;
	END IF;
	SELECT f.state, f.message, f.detail, f.hint INTO state, message, detail, hint
	  FROM payidem._shard_failure(v_lost, payidem._partition_in(detail), v_db, detail) f;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;

-- Application roles made before the update are granted nothing here (a
-- GRANT made by an extension's script is recorded as the extension's own,
-- which pg_dump leaves out): run grant_app() for them again after the update.
