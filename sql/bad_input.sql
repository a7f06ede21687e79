--
-- bad_input: a corpus of malformed calls to every API function — NULLs, empty
-- strings, non-positive and overflowing amounts, 10,000-character strings,
-- wrong prefixes, unknown statuses, SQL-injection strings in the text
-- arguments, and order numbers of good format whose check digits are wrong.
-- Each call shows its SQLSTATE, message, detail and hint (random merchant
-- numbers and generated order/payment/refund numbers masked; a call that does
-- not fail shows its result, masked too).  Afterwards the checksum of every
-- payidem table equals the one taken before the corpus: nothing changed.
--
-- The expected file records what the functions do today; the calls whose
-- answer differs from the contract (DESIGN.md §2: 22023 for malformed input)
-- are listed under "Findings" in docs/reliability.md.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- run one SELECT; show its SQLSTATE, message, detail, hint, or (no error) its
-- result row as JSON; numbers masked
CREATE FUNCTION pg_temp.mask(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(t,
		'M[0-9A-HJKMNP-TV-Z]{15}', 'M***', 'g'),
		'(PO|PY|RF)[0-9]{24}', '\1***', 'g'),
		'ak_[0-9A-HJKMNP-TV-Z]{26}', 'ak_***', 'g'),
		'[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9:.+]+', '<time>', 'g')
$$;
-- the same, and lists of known statuses (a DBA, or another suite, may add some)
-- and reconciliation ids (a sequence shared with other suites)
CREATE FUNCTION pg_temp.mask_all(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT regexp_replace(regexp_replace(pg_temp.mask(t),
		'(Known [a-z]+ statuses: ).*$', '\1...'),
		'difference [0-9]+', 'difference <id>', 'g')
$$;
CREATE FUNCTION pg_temp.mask_row(t text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
	SELECT regexp_replace(pg_temp.mask_all(t), 'Failing row contains \(.*\)\.$', 'Failing row contains (...).')
$$;
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
DECLARE
	v_result text;
BEGIN
	IF stmt ~* '^\s*SELECT' THEN
		EXECUTE 'SELECT row_to_json(x)::text FROM (' || stmt || ') x' INTO v_result;
	ELSIF stmt ~* '^\s*(INSERT|UPDATE|DELETE)' THEN	-- a direct write: how many rows it touched
		EXECUTE 'WITH w AS (' || stmt || ' RETURNING 1) SELECT count(*)::text || '' rows'' FROM w' INTO v_result;
	ELSE
		EXECUTE stmt;
		v_result := 'done';
	END IF;
	RETURN QUERY SELECT '00000', 'no error', 'result: ' || coalesce(pg_temp.mask(v_result), '(no row)'), NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := left(pg_temp.mask_all(err_message), 300);
	err_detail := left(pg_temp.mask_row(err_detail), 300);
	err_hint := left(pg_temp.mask_all(err_hint), 300);
	RETURN NEXT;
END
$$;

-- md5 of every payidem table's rows, ordered by its primary key
CREATE FUNCTION pg_temp.table_sums()
RETURNS TABLE (table_name text, row_count bigint, checksum text)
LANGUAGE plpgsql AS $$
DECLARE
	t record;
	v_order text;
BEGIN
	FOR t IN SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			  WHERE n.nspname = 'payidem' AND c.relkind = 'r' ORDER BY c.relname LOOP
		SELECT string_agg(format('x.%I', a.attname), ', ' ORDER BY k.ord) INTO v_order
		  FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, ord), pg_attribute a
		 WHERE i.indrelid = t.oid AND i.indisprimary AND a.attrelid = t.oid AND a.attnum = k.attnum;
		table_name := t.relname;
		EXECUTE format('SELECT count(*), md5(coalesce(string_agg(x::text, E''\n'' ORDER BY %s), '''')) FROM payidem.%I x',
					   coalesce(v_order, 'x::text'), t.relname)
		   INTO row_count, checksum;
		RETURN NEXT;
	END LOOP;
END
$$;

--------------------------------------------------------------------- set-up
-- one merchant, a channel bound to it, a pending order, a paid order with a
-- succeeded payment and a pending refund, a completed idempotency key, a
-- channel configuration, a bill line and a reconciliation difference
SELECT merchant_no AS m, api_key AS ak FROM payidem.create_merchant('Bad Input Shop', 'retail', 0.006) \gset
SELECT payidem.create_channel('BI_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(:'m', 'BI_WX');
SELECT payidem.set_channel_config('BI_WX', '{"mch_id": "1900000109"}');
SELECT payidem.create_order(:'m', 'BI-1', 1000, 'Tea', 'https://shop.example/n') AS o1 \gset
SELECT payidem.create_order(:'m', 'BI-2', 2000, 'Cup') AS o2 \gset
SELECT payidem.begin_payment(:'o1', 'BI_WX') AS p1 \gset
SELECT payidem.apply_payment_result(:'p1', 'callback', 'succeeded', 'TXBI1', 1000);
SELECT payidem.refund(:'p1', 100, 'BI-R1', 'broken cup') AS r1 \gset
SELECT outcome FROM payidem.idem_claim('bi:done', 'test', 'BI-1', 'BI_WX', 5);
SELECT payidem.idem_finish('bi:done', 'completed', '{"ok": true}');
SELECT payidem.load_bill('BI_WX', current_date - 1,
	'BI_WX,,TXBI_ORPHAN,,500,1,succeeded,' || to_char(current_date - 1, 'YYYY-MM-DD') || ' 12:00:00') AS bill_lines;
SELECT channel_only FROM payidem.reconcile('BI_WX', current_date - 1);
SELECT recon_id AS d1 FROM payidem.reconciliation WHERE channel_no = 'BI_WX' ORDER BY recon_id LIMIT 1 \gset
SELECT payidem.resolve_diff(:d1, 'ignored', 'test');

-- the same numbers with wrong check digits (good format, still 26 characters)
SELECT left(n, 24) || lpad(((right(n, 2)::int + 1) % 100)::text, 2, '0') AS bad
  FROM (VALUES (:'o1')) v(n) \gset o1_
SELECT left(n, 24) || lpad(((right(n, 2)::int + 1) % 100)::text, 2, '0') AS bad
  FROM (VALUES (:'p1')) v(n) \gset p1_
SELECT left(n, 24) || lpad(((right(n, 2)::int + 1) % 100)::text, 2, '0') AS bad
  FROM (VALUES (:'r1')) v(n) \gset r1_
SELECT payidem.order_no_valid(:'o1') AS o1_valid, payidem.order_no_valid(:'o1_bad') AS o1_bad_valid,
       payidem.order_no_valid(:'p1_bad') AS p1_bad_valid, payidem.order_no_valid(:'r1_bad') AS r1_bad_valid,
       length(:'o1_bad') AS len;

-- hostile strings
\set inj '''x''''); DELETE FROM payidem."order"; --'''
\set inj2 '''1 OR 1=1; DROP TABLE payidem.payment --'''
\set inj3 '''$$; TRUNCATE payidem.status_log; SELECT $$'''
\set long 'repeat(''A'', 10000)'
\set longl 'repeat(''a'', 10000)'

CREATE TEMP TABLE sums_before AS SELECT * FROM pg_temp.table_sums();
SELECT count(*) AS tables, count(*) FILTER (WHERE row_count > 0) >= 10 AS populated FROM sums_before;

------------------------------------------------------------- order numbers
SELECT * FROM pg_temp.try('SELECT payidem.gen_order_no(NULL)');
SELECT * FROM pg_temp.try($$SELECT payidem.gen_order_no('')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.gen_order_no('P')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.gen_order_no('po')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.gen_order_no('P-')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.gen_order_no('POX')$$);
SELECT * FROM pg_temp.try(format('SELECT payidem.gen_order_no(%s)', :'long'));
SELECT * FROM pg_temp.try(format('SELECT payidem.gen_order_no(%s)', :'inj'));
SELECT * FROM pg_temp.try('SELECT payidem.order_no_valid(NULL)');
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_valid('')$$);
SELECT * FROM pg_temp.try(format('SELECT payidem.order_no_valid(%L)', :'o1_bad'));
SELECT * FROM pg_temp.try(format('SELECT payidem.order_no_valid(%s)', :'long'));
SELECT * FROM pg_temp.try(format('SELECT payidem.order_no_valid(%s)', :'inj'));
SELECT * FROM pg_temp.try('SELECT * FROM payidem.order_no_parse(NULL)');
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.order_no_parse('')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.order_no_parse('PO202611292100000000000063')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.order_no_parse('po202611292100000000000062')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.order_no_parse('PO202613292100000000000062')$$);
SELECT * FROM pg_temp.try(format('SELECT * FROM payidem.order_no_parse(%s)', :'long'));
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make(NULL, now(), 0, 1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('P', now(), 0, 1)$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.order_no_make(%s, now(), 0, 1)$$, :'inj'));
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('PO', '-infinity', 0, 1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('PO', '1969-12-31 23:59:59+00', 0, 1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('PO', '2026-11-29 00:00:00+00', 100, 1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('PO', '2026-11-29 00:00:00+00', 0, -1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.order_no_make('PO', '2026-11-29 00:00:00+00', 0, 1000000)$$);
SELECT * FROM pg_temp.try(format('SELECT * FROM payidem.order_no_parse(%s)', :'inj2'));

------------------------------------------------------------- idempotency
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim(NULL, 'test', 'X', 'BI_WX', 5)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('', 'test', 'X', 'BI_WX', 5)$$);
SELECT * FROM pg_temp.try(format($$SELECT * FROM payidem.idem_claim(%s, 'test', 'X', 'BI_WX', 5)$$, :'long'));
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', NULL, 'X', 'BI_WX', 5)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', '', 'X', 'BI_WX', 5)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', 0)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', -5)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', 5, NULL, '-1 second')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', 5, NULL, NULL)$$);
-- compared as an interval this looks like 27 years; added to a time it leaves the range
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', 5, lease => '5000000 years -1799990000 days')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:new', 'test', 'X', 'BI_WX', 5, lease => '101 years')$$);
SELECT * FROM pg_temp.try(format('SELECT * FROM payidem.idem_claim(%s, %s, %s, %s, 0, %s)', :'inj', :'inj2', :'inj3', :'inj', :'inj2'));
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.idem_claim('bi:done', 'test', 'BI-1', 'BI_WX', 6)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_finish('bi:unknown', 'completed')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_finish(NULL, 'completed')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_finish('bi:done', 'done')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_finish('bi:done', NULL)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_finish('bi:done', 'completed')$$);
SELECT * FROM pg_temp.try(format('SELECT payidem.idem_finish(%s, %s)', :'inj', :'inj3'));
SELECT * FROM pg_temp.try('SELECT payidem.idem_purge(NULL)');
SELECT * FROM pg_temp.try($$SELECT payidem.idem_purge('-1 day')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_purge('5000000 years -1799990000 days')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.idem_purge('5000000 years')$$);	-- longer than any key has lived: keeps all

------------------------------------------------------------- state machines
SELECT * FROM pg_temp.try($$SELECT payidem.transit_order(NULL, 'paid')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.transit_order('', 'paid')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_order(%L, 'closed')$$, :'o1_bad'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_order(%L, 'shipped')$$, :'o2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_order(%L, 'PAID')$$, :'o2'));
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_order(%L, NULL)', :'o2'));
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_order(%L, %s)', :'o2', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_order(%s, 'closed')$$, :'inj2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_order(%L, 'refunded')$$, :'o2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_payment(%L, 'succeeded')$$, :'p1_bad'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_payment(%L, 'settled')$$, :'p1'));
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_payment(%s, %s)', :'inj', :'inj3'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_refund(%L, 'done')$$, :'r1'));
SELECT * FROM pg_temp.try(format('SELECT payidem.transit_refund(%L, NULL)', :'r1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.transit_refund(%s, 'failed')$$, :'long'));

------------------------------------------------------------- merchants
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant(NULL, 'retail', 0.006)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('', 'retail', 0.006)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('   ', 'retail', 0.006)$$);
-- control characters in a name: refused, shown escaped
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant(E'\t\n', 'retail', 0.006)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant(E'Good\x01Shop\x7f', 'retail', 0.006)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('Shop', E'retail\n', 0.006)$$);
SELECT * FROM pg_temp.try(format($$SELECT * FROM payidem.create_merchant(%s, 'retail', 0.006)$$, :'long'));
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('Shop', NULL, 0.006)$$);
SELECT * FROM pg_temp.try(format($$SELECT * FROM payidem.create_merchant('Shop', %s, 0.006)$$, :'inj'));
SELECT * FROM pg_temp.try(format('SELECT * FROM payidem.create_merchant(%s, %s, 1.5)', :'inj2', :'inj3'));
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('Shop', 'retail', 99999999)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('Shop', 'retail', 'NaN')$$);
SELECT * FROM pg_temp.try(format($$SELECT * FROM payidem.create_merchant('Shop', 'retail', 0.006, %s)$$, :'inj'));
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.create_merchant('Shop', 'retail', 0.006, NULL)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.rotate_merchant_secret(NULL)$$);
SELECT * FROM pg_temp.try(format('SELECT payidem.rotate_merchant_secret(%s)', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.rotate_merchant_secret(%L, '-1 hour')$$, :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.rotate_merchant_secret(%L, NULL)', :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.rotate_merchant_secret(%L, '101 years')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.rotate_merchant_secret(%L, '178000000 years')$$, :'m'));
SELECT * FROM pg_temp.try($$SELECT payidem.sign(NULL, 'x')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.sign(%s, 'x')$$, :'inj2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.sign(%s, 'x')$$, :'long'));
SELECT * FROM pg_temp.try($$SELECT payidem.verify_signature(NULL, 'x', 'ab')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.verify_signature(%s, %s, %s)$$, :'inj', :'inj2', :'inj3'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.verify_signature(%L, 'x', %s)$$, :'ak', :'long'));
SELECT * FROM pg_temp.try(format('SELECT payidem.verify_signature(%L, %L, NULL)', :'ak', 'x'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.set_merchant_status(%L, 'suspended')$$, :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.set_merchant_status(%L, NULL)', :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.set_merchant_status(%L, %s)', :'m', :'inj'));
SELECT * FROM pg_temp.try($$SELECT payidem.set_merchant_status('M000000000000000', 'frozen')$$);
SELECT * FROM pg_temp.try('SELECT payidem.freeze_merchant(NULL)');
SELECT * FROM pg_temp.try(format('SELECT payidem.unfreeze_merchant(%s)', :'inj3'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_merchant(%s)', :'long'));

------------------------------------------------------------- channels
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel(NULL, 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('', 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('wxpay_002', 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel(E'\t\n', 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel(E'BI_\x1b[2J', 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_channel(%s, 'wechat', 0.002)$$, :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_channel(%s, 'wechat', 0.002)$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_channel('BI_NEW', %s, 0.002)$$, :'inj2'));
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_NEW', 'wechat', -0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_NEW', 'wechat', NULL)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_NEW', 'wechat', 0.002, -1)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_NEW', 'wechat', 0.002, 2147483647)$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_channel('BI_NEW', 'wechat', 0.002, 100, ARRAY[%s])$$, :'inj3'));
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_NEW', 'wechat', 0.002, 100, '{}')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_channel('BI_WX', 'wechat', 0.002)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.set_channel_status('BI_WX', 'paused')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.set_channel_status('BI_WX', NULL)$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.set_channel_status(%s, 'disabled')$$, :'inj'));
SELECT * FROM pg_temp.try($$SELECT payidem.set_channel_config('BI_WX', '[1, 2]')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.set_channel_config('BI_WX', '"text"')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.set_channel_config('BI_WX', NULL)$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.set_channel_config(%s, '{}')$$, :'inj2'));
-- secret files: the names the loaders take (a directory that does not exist)
SET payidem.secret_dir = '/nonexistent-payidem-secrets';
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', NULL)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', '../../etc/passwd')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', '.hidden')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', '')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_channel_config('BI_WX', %s)$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_channel_config('BI_WX', %s)$$, :'long'));
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', 'missing.json')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_merchant_secret(%L, NULL)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_merchant_secret(%L, 'a/b')$$, :'m'));
RESET payidem.secret_dir;
SELECT * FROM pg_temp.try($$SELECT payidem.load_channel_config('BI_WX', 'wx.json')$$);
SELECT * FROM pg_temp.try('SELECT payidem.get_channel_config(NULL)');
SELECT * FROM pg_temp.try(format('SELECT payidem.get_channel_config(%s)', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%s, 'BI_WX')$$, :'inj'));
SELECT * FROM pg_temp.try(format('SELECT payidem.bind_channel(%L, %s)', :'m', :'inj3'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'BI_WX', 2)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'BI_WX', NULL, 0)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'BI_WX', NULL, NULL, -1)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'BI_WX', NULL, 500, 100)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'BI_WX', NULL, '9223372036854775808')$$, :'m'));
SELECT * FROM pg_temp.try($$SELECT payidem.unbind_channel(NULL, 'BI_WX')$$);
SELECT * FROM pg_temp.try(format('SELECT payidem.unbind_channel(%L, %s)', :'m', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.route_channel(%L, 'bitcoin')$$, :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.route_channel(%L, NULL)', :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.route_channel(%s, 'wechat')$$, :'inj2'));
SELECT * FROM pg_temp.try(format('SELECT payidem.route_channel(%L, %s)', :'m', :'long'));

------------------------------------------------------------- roles
CREATE ROLE regress_bi_plain;		-- an ordinary role (roles are not payidem's tables)
SELECT * FROM pg_temp.try($$SELECT payidem.grant_app('no_such_role_bi')$$);
SELECT * FROM pg_temp.try('SELECT payidem.grant_app(NULL)');
SELECT * FROM pg_temp.try($$SELECT payidem.grant_auditor('postgres')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.map_merchant_role('regress_bi_plain', %s)$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.map_merchant_role('pg_monitor', %L)$$, :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.unmap_merchant_role(NULL, %L)', :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.unmap_merchant_role('pg_monitor', %L)$$, :'m'));
SELECT * FROM pg_temp.try(format('SELECT payidem.map_merchant_role(NULL, %L)', :'m'));
SELECT * FROM pg_temp.try('SELECT payidem.grant_auditor(NULL)');
SELECT * FROM pg_temp.try($$SELECT payidem.grant_app('pg_read_all_data')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.grant_auditor('pg_database_owner')$$);
SELECT * FROM pg_temp.try('SELECT payidem.revoke_auditor(NULL)');
DROP ROLE regress_bi_plain;

------------------------------------------------------------- create_order
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 0, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', -1, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', NULL, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', -9223372036854775808, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', '9223372036854775808', 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', '12.5', 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, NULL)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, '')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, '   ')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, %s)$$, :'m', :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, NULL, 100, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, '', 100, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, repeat('9', 65), 100, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, %s, 100, 'Tea')$$, :'m', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 0, %s, %s, %s, '1 hour', %s)$$, :'m', :'inj2', :'inj3', :'inj', :'inj2'));
SELECT * FROM pg_temp.try($$SELECT payidem.create_order(NULL, 'BI-9', 100, 'Tea')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.create_order('', 'BI-9', 100, 'Tea')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%s, 'BI-9', 100, 'Tea')$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%s, 'BI-9', 100, 'Tea')$$, :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', 'ftp://shop.example/n')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', 'javascript:alert(1)')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', 'https://x/' || %s)$$, :'m', :'longl'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, 'https://shop .example/')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '-1 hour')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '0')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, NULL)$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '101 years')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '1000000 years')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '178000000 years')$$, :'m'));
-- compared as an interval (a month is 30 days) this looks short; added to a time it is not
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '5000000 years -1799990000 days')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, 'Tea', NULL, NULL, '1 hour', %s)$$, :'m', :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-1', 1001, 'Tea')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, E'Tea\x01')$$, :'m'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.create_order(%L, 'BI-9', 100, E'Green tea\r\n250 g')$$, :'m'));

------------------------------------------------------------- read API
SELECT * FROM pg_temp.try('SELECT payidem.find_order(NULL, NULL)');
SELECT * FROM pg_temp.try(format('SELECT payidem.find_order(%L, NULL)', :'m'));
SELECT * FROM pg_temp.try($$SELECT payidem.find_order(NULL, 'BI-1')$$);
SELECT * FROM pg_temp.try('SELECT payidem.get_order(NULL)');

------------------------------------------------------------- begin_payment
SELECT * FROM pg_temp.try($$SELECT payidem.begin_payment(NULL, 'BI_WX')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.begin_payment('', 'BI_WX')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%L, 'BI_WX')$$, :'o1_bad'));	-- good format, bad check digits
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%L, 'BI_WX')$$, 'PY' || substr(:'o2', 3)));	-- wrong prefix
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%s, 'BI_WX')$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%s, 'BI_WX')$$, :'long'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, NULL)', :'o2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%L, '')$$, :'o2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%L, 'bi_wx')$$, :'o2'));
SELECT * FROM pg_temp.try(format('SELECT payidem.begin_payment(%L, %s)', :'o2', :'inj2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.begin_payment(%L, 'BI_WX')$$, :'o1'));

------------------------------------------------------------- apply_payment_result
SELECT * FROM pg_temp.try($$SELECT payidem.apply_payment_result(NULL, 'callback', 'succeeded')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded')$$, :'p1_bad'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%s, 'callback', 'succeeded')$$, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'webhook', 'succeeded')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, NULL, 'succeeded')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, %s, 'succeeded')$$, :'p1', :'inj2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'paid')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'SUCCEEDED')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', NULL)$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', %s)$$, :'p1', :'inj3'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded', 'TX', 0)$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded', 'TX', -1000)$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded', '')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded', %s)$$, :'p1', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'callback', 'succeeded', %s)$$, :'p1', :'long'));
-- a success must carry its transaction id and amount (p1 succeeded with
-- TXBI1 and 1000)
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'query', 'succeeded')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'query', 'succeeded', 'TXBI1')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_payment_result(%L, 'query', 'succeeded', amount => 1000)$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.close_payment(%L)$$, :'p1_bad'));
SELECT * FROM pg_temp.try('SELECT payidem.close_payment(NULL)');
SELECT * FROM pg_temp.try(format('SELECT payidem.close_payment(%s)', :'inj2'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_payment(%L)', :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.close_order(%L)$$, :'o1_bad'));
SELECT * FROM pg_temp.try('SELECT payidem.close_order(NULL)');
SELECT * FROM pg_temp.try(format('SELECT payidem.close_order(%s)', :'inj3'));
SELECT * FROM pg_temp.try(format('SELECT payidem.close_order(%L)', :'o1'));

------------------------------------------------------------- refunds
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 0, 'BI-R9')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, -100, 'BI-R9')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, NULL, 'BI-R9')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 9223372036854775807, 'BI-R9')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 901, 'BI-R9')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, NULL)$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, '')$$, :'p1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, %s)$$, :'p1', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, %s)$$, :'p1', :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, 'BI-R9', %s)$$, :'p1', :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 0, 'BI-R9', %s)$$, :'p1', :'inj2'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 200, 'BI-R1')$$, :'p1'));
SELECT * FROM pg_temp.try($$SELECT payidem.refund(NULL, 100, 'BI-R9')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%L, 100, 'BI-R9')$$, :'p1_bad'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.refund(%s, 100, 'BI-R9')$$, :'inj3'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, 'done')$$, :'r1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, NULL)$$, :'r1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, %s)$$, :'r1', :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, 'succeeded', '')$$, :'r1'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, 'succeeded', %s)$$, :'r1', :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%L, 'succeeded')$$, :'r1_bad'));
SELECT * FROM pg_temp.try($$SELECT payidem.apply_refund_result(NULL, 'succeeded')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.apply_refund_result(%s, 'failed')$$, :'inj2'));

------------------------------------------------------------- notifications
SELECT * FROM pg_temp.try('SELECT * FROM payidem.notify_due(0)');
SELECT * FROM pg_temp.try('SELECT * FROM payidem.notify_due(-1)');
SELECT * FROM pg_temp.try('SELECT * FROM payidem.notify_due(NULL)');
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.notify_due('2147483648')$$);
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(100, NULL)');
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(0, false)');
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(-100, false)');
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(9223372036854775807, false)');
SELECT * FROM pg_temp.try(format('SELECT payidem.notify_result(%L, false)', :'o1'));
SELECT * FROM pg_temp.try(format('SELECT payidem.notify_result(%s, true, %s)', :'inj', :'inj2'));
SELECT * FROM pg_temp.try('SELECT payidem.notify_result(NULL, true)');
SELECT * FROM pg_temp.try($$SELECT payidem.verify_notification('k', 'p', 't=1,v1=00', NULL)$$);
SELECT * FROM pg_temp.try($$SELECT payidem.verify_notification('k', 'p', 't=1,v1=00', '-1 second')$$);
SELECT payidem.verify_notification(NULL, 'p', 't=1') AS null_key,
       payidem.verify_notification('k', NULL, 't=1') AS null_payload,
       payidem.verify_notification('k', 'p', NULL) AS null_signature,
       payidem.verify_notification('k', 'p', '') AS empty_signature,
       payidem.verify_notification('k', 'p', repeat('v1=00,', 1000)) AS long_signature,
       payidem.verify_notification('k', 'p', :'inj') AS injection;
SELECT * FROM pg_temp.try('SELECT * FROM payidem.query_due(0)');
SELECT * FROM pg_temp.try('SELECT * FROM payidem.query_due(NULL)');

------------------------------------------------------------- reconciliation
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill(NULL, '2026-01-01', '')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('NO_SUCH', '2026-01-01', 'x')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_bill(%s, '2026-01-01', 'x')$$, :'inj'));
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', 'infinity', 'x')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '5874897-12-31', 'x')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '1969-12-31', 'x')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,-5,0,succeeded,2026-01-01 10:00:00')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,500,0,settled,2026-01-01 10:00:00')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,500,0,succeeded,yesterday-ish')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.load_bill('BI_WX', '2026-01-01', %s)$$, :'inj2'));
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,99999999999999999999,0,succeeded,2026-01-01 10:00:00')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,9223372036854775808,0,succeeded,2026-01-01 10:00:00')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.load_bill('BI_WX', '2026-01-01', 'BI_WX,2026-01-01,TX1,,500,9223372036854775808,succeeded,2026-01-01 10:00:00')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.reconcile(NULL, '2026-01-01')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.reconcile('BI_WX', NULL)$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.reconcile('BI_WX', '-infinity')$$);
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.reconcile('BI_WX', '5874897-12-31')$$);
SELECT * FROM pg_temp.try(format($$SELECT * FROM payidem.reconcile(%s, '2026-01-01')$$, :'inj3'));
-- a day with no bill loaded is not reconciled
SELECT * FROM pg_temp.try($$SELECT * FROM payidem.reconcile('BI_WX', '2001-01-01')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.resolve_diff(-1, 'handled')$$);
SELECT * FROM pg_temp.try($$SELECT payidem.resolve_diff(NULL, 'handled')$$);
SELECT * FROM pg_temp.try(format($$SELECT payidem.resolve_diff(%s, 'done')$$, :d1));
SELECT * FROM pg_temp.try(format($$SELECT payidem.resolve_diff(%s, %s)$$, :d1, :'inj'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.resolve_diff(%s, 'handled', %s)$$, :d1, :'long'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.resolve_diff(%s, 'handled')$$, :d1));

------------------------------------------------------------- direct writes
-- the constraints and triggers answer the same corpus on direct SQL
SELECT * FROM pg_temp.try(format($$UPDATE payidem."order" SET status = 'shipped' WHERE order_no = %L$$, :'o2'));
SELECT * FROM pg_temp.try(format($$UPDATE payidem."order" SET status = 'refunded' WHERE order_no = %L$$, :'o2'));
SELECT * FROM pg_temp.try(format($$UPDATE payidem."order" SET amount = -1 WHERE order_no = %L$$, :'o2'));
SELECT * FROM pg_temp.try(format($$UPDATE payidem.payment SET refunded_amount = amount + 1 WHERE payment_no = %L$$, :'p1'));
SELECT * FROM pg_temp.try(format($$INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status) VALUES (payidem.gen_order_no('RF'), %L, %L, %L, 'BI-DIRECT', 10, 'succeeded')$$, :'p1', :'o1', :'m'));
SELECT * FROM pg_temp.try($$UPDATE payidem.status_log SET to_status = 'paid'$$);
SELECT * FROM pg_temp.try($$DELETE FROM payidem.status_log$$);
SELECT * FROM pg_temp.try($$TRUNCATE payidem.status_log$$);

------------------------------------------------------------- nothing changed
SELECT a.table_name, a.row_count AS rows_before, b.row_count AS rows_after
  FROM sums_before a FULL JOIN pg_temp.table_sums() b USING (table_name)
 WHERE a.checksum IS DISTINCT FROM b.checksum;
SELECT count(*) AS tables_unchanged FROM sums_before a JOIN pg_temp.table_sums() b USING (table_name)
 WHERE a.checksum = b.checksum AND a.row_count = b.row_count;
