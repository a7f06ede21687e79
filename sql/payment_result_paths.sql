--
-- payment_result_paths: every case of apply_payment_result()'s contract run
-- through both of its paths -- apply_payment_result() as applications call
-- it (its C fast path where it takes the case) and the PL/pgSQL fallback
-- payidem._apply_payment_result() called directly -- each from the same
-- state, rolled back after.  Both take decide_payment_result()'s verdict;
-- this shows the outcome, the effects, and that the two paths agree on both.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never
SET track_functions = 'all';	-- shows which calls the fallback took

SELECT merchant_no AS m FROM payidem.create_merchant('Paths Tea', 'retail', 0.006) \gset
SELECT payidem.create_channel('PATH_WX', 'wechat', 0.002);
SELECT payidem.create_channel('PATH_ALI', 'alipay', 0.0025);
SELECT payidem.bind_channel(:'m', 'PATH_WX', 0.0055);	-- the binding's rate
SELECT payidem.bind_channel(:'m', 'PATH_ALI');			-- the merchant's rate

-- an order of amount with a pending payment on channel: (order_no, payment_no)
CREATE FUNCTION pg_temp.attempt(m text, channel text, amount bigint, OUT po text, OUT py text)
LANGUAGE plpgsql AS $$
BEGIN
	po := payidem.create_order(m, 'T-' || payidem.gen_order_no('XX'), amount, 'tea', 'https://shop.example/notify');
	py := payidem.begin_payment(po, channel);
END
$$;

-- What one path does with case c's report, from the state c sets up, as
-- jsonb: the outcome or error, whether the fallback ran, and the effects
-- (generated numbers and times masked).  Everything is rolled back.
CREATE FUNCTION pg_temp.run(c text, path text, m text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	a record;
	b record;
	v_py text;
	v_source text := 'callback';
	v_status text := 'succeeded';
	v_txn text := 'T-' || translate(c, ' ,', '_');
	v_amount bigint := 1000;
	v_paid_at timestamptz;
	v_outcome text;
	v_anomaly bigint;
	v_calls bigint;
	v_result jsonb;
	fallback regprocedure := 'payidem._apply_payment_result(text,text,text,text,bigint,timestamptz,jsonb)';
BEGIN
	BEGIN
		SELECT * INTO a FROM pg_temp.attempt(m, 'PATH_WX', 1000);
		v_py := a.py;
		CASE c
		WHEN 'first success' THEN NULL;
		WHEN 'first success, merchant rate' THEN
			SELECT * INTO a FROM pg_temp.attempt(m, 'PATH_ALI', 1250);
			v_py := a.py;
			v_amount := 1250;
		WHEN 'first success, paid_at given' THEN v_paid_at := now() - interval '1 minute';
		WHEN 'first success, binding rate' THEN
			-- an amount whose fee differs at the binding's rate (55) and the merchant's (60)
			SELECT * INTO a FROM pg_temp.attempt(m, 'PATH_WX', 10000);
			v_py := a.py;
			v_amount := 10000;
		WHEN 'repeated success' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'succeeded', v_txn, 1000);
			v_source := 'query';
		WHEN 'repeated success, partly refunded' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'succeeded', v_txn, 1000);
			PERFORM payidem.apply_refund_result(payidem.refund(v_py, 100, 'R-1'), 'succeeded', 'CR-1');
		WHEN 'success, other transaction id' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'succeeded', 'T-first', 1000);
		WHEN 'success, other amount after success' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'succeeded', v_txn, 1000);
			v_amount := 999;
		WHEN 'success, amount mismatch' THEN v_amount := 1001;
		WHEN 'success, transaction id of another payment' THEN
			SELECT * INTO b FROM pg_temp.attempt(m, 'PATH_WX', 1000);
			PERFORM payidem.apply_payment_result(b.py, 'callback', 'succeeded', v_txn, 1000);
		WHEN 'success after close' THEN
			PERFORM payidem.close_order(a.po);
		WHEN 'success, order paid by another attempt' THEN
			PERFORM payidem.close_payment(v_py);
			PERFORM payidem.apply_payment_result(payidem.begin_payment(a.po, 'PATH_ALI'), 'callback',
												 'succeeded', 'T-other', 1000);
		WHEN 'success after failure' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'failed');
		WHEN 'failure' THEN v_status := 'failed'; v_txn := NULL; v_amount := NULL;
		WHEN 'close' THEN v_status := 'closed'; v_txn := NULL; v_amount := NULL;
		WHEN 'repeated failure' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'failed');
			v_status := 'failed'; v_txn := NULL; v_amount := NULL;
		WHEN 'failure after close' THEN
			PERFORM payidem.apply_payment_result(v_py, 'close', 'closed');
			v_status := 'failed'; v_txn := NULL; v_amount := NULL;
		WHEN 'close after failure' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'failed');
			v_status := 'closed'; v_txn := NULL; v_amount := NULL;
		WHEN 'failure after success' THEN
			PERFORM payidem.apply_payment_result(v_py, 'callback', 'succeeded', v_txn, 1000);
			v_status := 'failed';
		WHEN 'success, unknown payment' THEN v_py := payidem.gen_order_no('PY');
		WHEN 'success, unknown payment of another shard' THEN
			v_py := payidem.order_no_make('PY', now(), 7, 1);
		WHEN 'failure, unknown payment' THEN v_py := payidem.gen_order_no('PY'); v_status := 'failed';
		WHEN 'success, paid_at before the attempt' THEN v_paid_at := now() - interval '1 day';
		WHEN 'success, paid_at after now' THEN v_paid_at := now() + interval '1 hour';
		WHEN 'success, paid_at after now, wider clock skew' THEN
			PERFORM set_config('payidem.max_clock_skew', '2h', true);	-- undone with the case
			v_paid_at := now() + interval '1 hour';
		WHEN 'success, paid_at infinite' THEN v_paid_at := 'infinity';
		WHEN 'success without amount' THEN v_amount := NULL;
		WHEN 'success without transaction id' THEN v_txn := NULL;
		WHEN 'amount zero' THEN v_amount := 0;
		WHEN 'transaction id with a space' THEN v_txn := 'T 1';
		WHEN 'bad source' THEN v_source := 'push';
		WHEN 'bad status' THEN v_status := 'pending';
		WHEN 'bad number' THEN v_py := 'PY123';
		WHEN 'no number' THEN v_py := NULL;
		END CASE;

		v_calls := coalesce(pg_stat_get_xact_function_calls(fallback), 0);
		BEGIN
			-- (the C path through apply_payment_result_ex(), which shares all
			-- of apply_payment_result() and also says which anomaly it names)
			IF path = 'c' THEN
				SELECT r.outcome, r.anomaly_id INTO v_outcome, v_anomaly
				  FROM payidem.apply_payment_result_ex(v_py, v_source, v_status, v_txn, v_amount, v_paid_at,
													   '{"k": 1}') r;
			ELSE
				SELECT r.outcome, r.anomaly_id INTO v_outcome, v_anomaly
				  FROM payidem._apply_payment_result(v_py, v_source, v_status, v_txn, v_amount, v_paid_at,
													 '{"k": 1}') r;
			END IF;
		EXCEPTION WHEN OTHERS THEN
			v_outcome := 'error ' || SQLSTATE || ': ' || SQLERRM;
		END;
		SELECT jsonb_build_object(
				'outcome', v_outcome,
				-- the anomaly the result names: the last one of the payment's
				-- (or the unknown number's) anomalies, which a repeat reuses
				'names', CASE WHEN v_anomaly IS NULL THEN 'none'
							  WHEN v_anomaly = (SELECT max(x.anomaly_id) FROM payidem.anomaly x
												 WHERE x.order_no = a.po OR x.detail ->> 'reported_payment_no' = v_py)
							  THEN 'its anomaly' ELSE 'another anomaly' END,
				'fallback', CASE WHEN path = 'c' THEN coalesce(pg_stat_get_xact_function_calls(fallback), 0) > v_calls END,
				'payment', (SELECT jsonb_build_object('status', status, 'transaction_id', transaction_id,
													  'fee', fee_amount, 'cost', cost_amount,
													  'paid_at', CASE WHEN paid_at = v_paid_at THEN 'as given'
																	  WHEN paid_at IS NOT NULL THEN 'set' END)
							  FROM payidem.payment WHERE payment_no = v_py),
				'order', (SELECT jsonb_build_object('status', status, 'paid_by_it', paid_payment_no = v_py)
							FROM payidem."order" WHERE order_no = a.po),
				'anomalies', (SELECT coalesce(jsonb_agg(jsonb_build_object('kind', kind, 'amount', amount,
																		   'detail', detail - 'paid_at')
														ORDER BY anomaly_id), '[]')
								FROM payidem.anomaly
							   WHERE order_no = a.po OR detail ->> 'reported_payment_no' = v_py),
				'log', (SELECT jsonb_agg(entity || ' ' || coalesce(from_status, '()') || ' -> ' || to_status ORDER BY log_id)
						  FROM payidem.status_log WHERE entity_no IN (a.po, v_py)),
				'events', (SELECT jsonb_agg(event ORDER BY event_id) FROM payidem.notify_event WHERE order_no = a.po))
		  INTO v_result;
		v_result := regexp_replace(v_result::text, '(PO|PY|RF)[0-9]{24}', '\1*', 'g')::jsonb;
		RAISE EXCEPTION USING ERRCODE = 'PITST';
	EXCEPTION WHEN SQLSTATE 'PITST' THEN
		NULL;					-- rolled back
	END;
	RETURN v_result;
END
$$;

CREATE TEMP TABLE cases (n serial, c text);
INSERT INTO cases (c) VALUES
	('first success'), ('first success, merchant rate'), ('first success, paid_at given'),
	('repeated success'), ('repeated success, partly refunded'),
	('success, other transaction id'), ('success, other amount after success'),
	('success, amount mismatch'), ('success, transaction id of another payment'),
	('success after close'), ('success, order paid by another attempt'), ('success after failure'),
	('failure'), ('close'), ('repeated failure'), ('close after failure'), ('failure after success'),
	('success, unknown payment'), ('failure, unknown payment'),
	('success, paid_at before the attempt'), ('success, paid_at infinite'),
	('first success, binding rate'), ('failure after close'), ('success, unknown payment of another shard'),
	('success, paid_at after now'), ('success, paid_at after now, wider clock skew'),
	('success without amount'), ('success without transaction id'), ('amount zero'),
	('transaction id with a space'), ('bad source'), ('bad status'), ('bad number'), ('no number');
CREATE TEMP TABLE runs AS
SELECT n, c, pg_temp.run(c, 'c', :'m') AS c_path, pg_temp.run(c, 'sql', :'m') AS sql_path FROM cases;

-- the outcome of each case and which path apply_payment_result() took
SELECT c AS "case", c_path ->> 'outcome' AS outcome, c_path ->> 'names' AS names_anomaly,
       CASE WHEN c_path ->> 'outcome' LIKE 'error%' THEN '' WHEN (c_path ->> 'fallback')::boolean THEN 'PL/pgSQL' ELSE 'C' END AS decided_in
  FROM runs ORDER BY n;
-- the effects
SELECT c AS "case", c_path -> 'payment' AS payment, c_path -> 'order' AS "order",
       (SELECT jsonb_agg(x ->> 'kind') FROM jsonb_array_elements(c_path -> 'anomalies') x) AS anomalies,
       c_path -> 'log' AS log, c_path -> 'events' AS events
  FROM runs ORDER BY n;
-- an anomaly's detail, of each kind
SELECT DISTINCT ON (x ->> 'kind') x ->> 'kind' AS kind, x -> 'amount' AS amount, x -> 'detail' AS detail
  FROM runs, jsonb_array_elements(c_path -> 'anomalies') x ORDER BY x ->> 'kind';
-- both paths: the same outcome and the same effects, in every case
SELECT count(*) AS cases, count(*) FILTER (WHERE (c_path - 'fallback') = (sql_path - 'fallback')) AS same,
       string_agg(c, ', ') FILTER (WHERE (c_path - 'fallback') <> (sql_path - 'fallback')) AS differ
  FROM runs;

-- A repeated success is answered from the committed row without a lock, by
-- both paths: also in a read-only transaction (a standby's, say), where the
-- locking read of any other case fails
SELECT a.po AS ro_order, a.py AS ro_payment FROM pg_temp.attempt(:'m', 'PATH_WX', 1000) a \gset
SELECT payidem.apply_payment_result(:'ro_payment', 'callback', 'succeeded', 'T-read-only', 1000) AS first;
BEGIN READ ONLY;
SELECT payidem.apply_payment_result(:'ro_payment', 'query', 'succeeded', 'T-read-only', 1000) AS c_path,
       (payidem._apply_payment_result(:'ro_payment', 'query', 'succeeded', 'T-read-only', 1000, NULL, NULL)).outcome AS sql_path;
COMMIT;
