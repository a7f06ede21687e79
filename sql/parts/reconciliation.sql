------------------------------------------------------------------------------
-- Reconciliation
------------------------------------------------------------------------------

-- How it works (docs/reconciliation.md has the operator's guide):
--  * load_bill() (or a plain COPY) fills channel_bill with the channel's lines.
--  * reconcile(channel, day) puts the day's bill lines and the day's paid
--    payments of that channel through ONE hash full join on transaction_id;
--    only what is left over (about 1 % on a normal day) is looked at again,
--    by index, for midnight straddles.  Only differences are stored.
--  * A re-run of a channel+day keeps the recon_id of a difference that is
--    still there, drops open ones that are gone, never re-opens or doubles
--    one a person handled or ignored.  Runs of one channel are serialised by
--    a transaction-level advisory lock (hashtext('payidem.reconcile'),
--    hashtext(channel_no)), which load_bill() takes too.

CREATE FUNCTION payidem._bill_timezone()
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce(nullif(pg_catalog.current_setting('payidem.bill_timezone', true), ''), 'UTC');
COMMENT ON FUNCTION payidem._bill_timezone() IS
	'The setting payidem.bill_timezone (UTC when unset).';

-- One CSV record (RFC 4180 quoting, one physical line); NULL when a double
-- quote is misplaced or not closed.  Lines without quotes never come here.
CREATE FUNCTION payidem._csv_fields(line text)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	fields		text[] := '{}';
	field		text := '';
	ch			text;
	i			integer := 1;
	n			integer := length(line);
	in_quotes	boolean := false;
	was_quoted	boolean := false;
BEGIN
	WHILE i <= n LOOP
		ch := substr(line, i, 1);
		IF in_quotes THEN
			IF ch = '"' THEN
				IF substr(line, i + 1, 1) = '"' THEN
					field := field || '"';
					i := i + 1;
				ELSE
					in_quotes := false;
				END IF;
			ELSE
				field := field || ch;
			END IF;
		ELSIF ch = ',' THEN
			fields := fields || field;
			field := '';
			was_quoted := false;
		ELSIF ch = '"' THEN
			IF field <> '' OR was_quoted THEN
				RETURN NULL;
			END IF;
			in_quotes := true;
			was_quoted := true;
		ELSIF was_quoted THEN
			RETURN NULL;
		ELSE
			field := field || ch;
		END IF;
		i := i + 1;
	END LOOP;
	IF in_quotes THEN
		RETURN NULL;
	END IF;
	RETURN fields || field;
END
$$;
COMMENT ON FUNCTION payidem._csv_fields(text) IS
	'Split one CSV record with double-quoted fields; NULL if the quoting is malformed.';

-- The records of a CSV text: physical line number and fields.  Blank lines,
-- a byte-order mark and a header line (first line starting with channel_no)
-- are skipped; line numbers stay those of the text.
CREATE FUNCTION payidem._bill_lines(csv text)
RETURNS TABLE(line_no bigint, fields text[])
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT t.n,
		   CASE WHEN pg_catalog.strpos(t.line, '"') = 0
				THEN pg_catalog.string_to_array(t.line, ',')
				ELSE payidem._csv_fields(t.line) END
	  FROM (SELECT s.n, pg_catalog.ltrim(pg_catalog.rtrim(s.l, pg_catalog.chr(13)), pg_catalog.chr(65279)) AS line
			  FROM pg_catalog.string_to_table(csv, pg_catalog.chr(10)) WITH ORDINALITY AS s(l, n)) t
	 WHERE pg_catalog.btrim(t.line, ' ' || pg_catalog.chr(9)) <> ''
	   AND NOT (t.n = 1 AND t.line ~* '^"?channel_no"?,');
END;
COMMENT ON FUNCTION payidem._bill_lines(text) IS
	'Records of a channel bill CSV text with their line numbers (blank lines, BOM and header skipped).';

-- A bill time: ISO 8601; without an offset it is a wall-clock time in tz.
CREATE FUNCTION payidem._bill_time(value text, tz text)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE
	WHEN value IS NULL OR value = '' THEN NULL
	WHEN value ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN value::timestamptz
	ELSE pg_catalog.timezone(tz, value::timestamp)
END;
COMMENT ON FUNCTION payidem._bill_time(text, text) IS
	'Read a bill line''s paid_at: with an offset as given, without one as wall-clock time in the given zone.';

CREATE FUNCTION payidem.load_bill(channel_no text, bill_date date, csv text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := load_bill.channel_no;
	v_day		date := load_bill.bill_date;
	v_csv		text := load_bill.csv;
	v_tz		text := payidem._bill_timezone();
	v_day_text	text;
	v_bad		record;
	v_rows		bigint;
	-- the shape of a paid_at; the cast still checks the ranges
	c_time		constant text := '^[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?( ?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?))?$';
	c_hint		constant text := 'Nothing was imported. The layout is channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at (see docs/reconciliation.md); fix the line and load the whole bill again.';
BEGIN
	IF v_channel IS NULL OR v_day IS NULL OR v_csv IS NULL THEN
		PERFORM payidem._raise_invalid('channel_no, bill_date and csv must not be null');
	END IF;
	PERFORM payidem._check_bill_date(v_day);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) v_channel) THEN
		PERFORM payidem._raise_not_found('channel', v_channel, 'payidem.channel', 'channel_no');
	END IF;
	v_day_text := to_char(v_day, 'YYYY-MM-DD');
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	-- the first bad line, if any (field by field, then duplicates)
	SELECT c.line_no, c.problem[1] AS field, c.problem[2] AS value, c.problem[3] AS rule
	  INTO v_bad
	  FROM (SELECT l.line_no,
				   CASE
					WHEN l.f IS NULL THEN
						ARRAY[NULL, NULL, 'a double quote is misplaced or not closed']
					WHEN cardinality(l.f) <> 8 THEN
						ARRAY[NULL, NULL, format('the line has %s fields instead of 8', cardinality(l.f))]
					WHEN l.f[1] NOT IN ('', v_channel) THEN
						ARRAY['channel_no', l.f[1], format('is not the channel of this bill (%s)', v_channel)]
					WHEN l.f[2] <> '' AND l.f[2] !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
						ARRAY['bill_date', l.f[2], 'is not a date written YYYY-MM-DD']
					WHEN l.f[2] <> '' AND l.f[2] <> v_day_text THEN
						ARRAY['bill_date', l.f[2], format('is not the day of this bill (%s)', v_day_text)]
					WHEN NOT payidem._fits(l.f[3], 'payidem.channel_ref') THEN
						ARRAY['transaction_id', l.f[3], 'must be ' || payidem._format_rule('payidem.channel_ref')]
					WHEN l.f[4] <> '' AND NOT payidem._fits(l.f[4], 'payidem.channel_ref') THEN
						ARRAY['payment_no', l.f[4], 'must be empty or ' || payidem._format_rule('payidem.channel_ref')]
					-- at most the bigint maximum, as create_order() takes (compared as text)
					WHEN l.f[5] !~ '^[0-9]+$' OR l.f[5] ~ '^0+$' OR length(ltrim(l.f[5], '0')) > 19
						 OR (length(ltrim(l.f[5], '0')) = 19
							 AND ltrim(l.f[5], '0') COLLATE "C" > '9223372036854775807') THEN
						ARRAY['amount', l.f[5], 'must be a positive integer in minor units (fen, cents)']
					WHEN l.f[6] <> '' AND (l.f[6] !~ '^[0-9]+$' OR length(ltrim(l.f[6], '0')) > 19
						 OR (length(ltrim(l.f[6], '0')) = 19
							 AND ltrim(l.f[6], '0') COLLATE "C" > '9223372036854775807')) THEN
						ARRAY['fee', l.f[6], 'must be empty or a non-negative integer in minor units (fen, cents)']
					WHEN l.f[7] NOT IN ('succeeded', 'refunded') THEN
						ARRAY['status', l.f[7], 'must be succeeded or refunded']
					WHEN l.f[8] <> '' AND l.f[8] !~ c_time THEN
						ARRAY['paid_at', l.f[8], 'is not a time written YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM]']
					WHEN l.first_line <> l.line_no THEN
						ARRAY['transaction_id', l.f[3], format('appears already on line %s', l.first_line)]
				   END AS problem
			  FROM (SELECT b.line_no, b.fields AS f,
						   min(b.line_no) OVER (PARTITION BY b.fields[3]) AS first_line
					  FROM payidem._bill_lines(v_csv) b) l) c
	 WHERE c.problem IS NOT NULL
	 ORDER BY c.line_no
	 LIMIT 1;
	IF FOUND THEN
		IF v_bad.field IS NULL THEN
			PERFORM payidem._raise_invalid(format('invalid line %s in the channel bill', v_bad.line_no),
				format('Line %s: %s.', v_bad.line_no, v_bad.rule),
				c_hint);
		END IF;
		PERFORM payidem._raise_invalid(format('invalid %s on line %s of the channel bill', v_bad.field, v_bad.line_no),
			format('Line %s, field %s: %s %s.', v_bad.line_no, v_bad.field,
				quote_literal(left(v_bad.value, 64)), v_bad.rule),
			c_hint);
	END IF;

	-- a bill loaded again replaces the channel's earlier bill of that day
	DELETE FROM payidem.channel_bill cb
	 WHERE cb.channel_no OPERATOR(pg_catalog.=) v_channel AND cb.bill_date OPERATOR(pg_catalog.=) v_day;
	BEGIN
		INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, payment_no, amount, fee, status, paid_at)
		SELECT v_channel, v_day, b.fields[3], nullif(b.fields[4], ''), b.fields[5]::bigint,
			   nullif(b.fields[6], '')::bigint, b.fields[7],
			   CASE
				WHEN b.fields[8] = '' THEN NULL
				WHEN b.fields[8] ~ '([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN b.fields[8]::timestamptz
				ELSE timezone(v_tz, b.fields[8]::timestamp)
			   END
		  FROM payidem._bill_lines(v_csv) b;
		GET DIAGNOSTICS v_rows = ROW_COUNT;
	EXCEPTION WHEN data_exception THEN
		-- a paid_at of the right shape but out of range (month 13, 25 o'clock):
		-- find its line (only on this error path, line by line)
		FOR v_bad IN SELECT b.line_no, b.fields[8] AS value FROM payidem._bill_lines(v_csv) b ORDER BY b.line_no LOOP
			BEGIN
				PERFORM payidem._bill_time(v_bad.value, v_tz);
			EXCEPTION WHEN data_exception THEN
				PERFORM payidem._raise_invalid(format('invalid paid_at on line %s of the channel bill', v_bad.line_no),
					format('Line %s, field paid_at: %s is not a valid time (%s).', v_bad.line_no,
						quote_literal(left(v_bad.value, 64)), SQLERRM),
					c_hint);
			END;
		END LOOP;
		RAISE;
	END;
	RETURN v_rows;
END
$$;
COMMENT ON FUNCTION payidem.load_bill(text, date, text) IS
	'Import a channel''s bill of one day from CSV text (channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at; channel_no and bill_date may be empty); replaces that day''s earlier bill; all lines or none (22023 naming the line and field); returns the number of lines.';

-- Refunded as far as bill day ending at `day_end` is concerned: a refunded or
-- partially refunded payment whose first succeeded refund (if the refund
-- table knows it) happened before the end of the day.  A refund made after
-- the day is not a difference of that day's bill.
CREATE FUNCTION payidem._refunded_by(payment_no text, payment_status text, day_end timestamptz)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN payment_status IN ('refunded', 'partially_refunded')
	AND NOT EXISTS (SELECT 1 FROM payidem.refund rf
					 WHERE rf.payment_no OPERATOR(pg_catalog.=) _refunded_by.payment_no
					   AND rf.status OPERATOR(pg_catalog.=) 'succeeded'
					HAVING pg_catalog.min(coalesce(rf.refunded_at, rf.updated_at)) >= day_end);
COMMENT ON FUNCTION payidem._refunded_by(text, text, timestamptz) IS
	'Whether a payment counts as refunded for the bill day that ends at day_end.';

-- One row the day's join did not match, as reconcile() carries it from the
-- join to the difference rules (internal).
CREATE TYPE payidem._recon_leftover AS (
	p_no text, p_txn text, p_amount bigint, p_status text,
	b_txn text, b_amount bigint, b_status text, p_cost bigint, b_fee bigint);
COMMENT ON TYPE payidem._recon_leftover IS
	'Internal to reconcile(): a payment and/or bill line the day''s join may not have matched.';

-- The arguments of reconcile(), checked, and how many bill lines of that
-- channel and day are loaded (the router asks every partition the same).
CREATE FUNCTION payidem._bill_day_lines(channel_no text, bill_date date)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF channel_no IS NULL OR bill_date IS NULL THEN
		PERFORM payidem._raise_invalid('channel_no and bill_date must not be null');
	END IF;
	PERFORM payidem._check_bill_date(bill_date);
	IF NOT EXISTS (SELECT 1 FROM payidem.channel c WHERE c.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no) THEN
		PERFORM payidem._raise_not_found('channel', channel_no, 'payidem.channel', 'channel_no');
	END IF;
	RETURN (SELECT count(*) FROM payidem.channel_bill b
			 WHERE b.channel_no OPERATOR(pg_catalog.=) _bill_day_lines.channel_no
			   AND b.bill_date OPERATOR(pg_catalog.=) _bill_day_lines.bill_date);
END
$$;
COMMENT ON FUNCTION payidem._bill_day_lines(text, date) IS
	'Internal to reconcile() (here and on the router): checks its channel and day (22023, PI009) and counts the day''s loaded bill lines.';

CREATE FUNCTION payidem.reconcile(channel_no text, bill_date date, allow_empty boolean DEFAULT false)
RETURNS TABLE(recon_batch_no text, matched bigint, platform_only bigint,
			  channel_only bigint, amount_mismatch bigint, status_mismatch bigint, fee_mismatch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- The planner cannot know how many differences a day has (a CTE, a table
-- just written): a nested-loop anti-join of the day's differences against
-- the stored ones would be quadratic at 10,000+ differences.  Joins here
-- are hash joins; the look-ups that must be nested loops (LATERAL ... LIMIT,
-- subplans, = ANY) are not affected by this setting.  Step 1 alone is
-- planned with nested loops allowed: it reads the day's payments by key
-- from payment_paid, and whether to fetch each payment by its key or to
-- hash the whole table is the planner's to decide from the day's size (a
-- hash join there reads every payment ever made, each day).  The setting
-- also adds a huge "disabled" cost to the plans, which would trigger JIT
-- compilation (about 2 s a statement) on every run: JIT is off here.
SET enable_nestloop = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
	v_channel	text := reconcile.channel_no;
	v_day		date := reconcile.bill_date;
	v_tz		text := payidem._bill_timezone();
	v_from		timestamptz;
	v_to		timestamptz;
	v_batch		text;
	v_run		bigint;
	v_matched	bigint;
	v_bill_lines bigint;
	v_bill_amount numeric;	-- sums of bigint amounts: may pass the bigint range
	v_payments	bigint;
	v_pay_amount numeric;
	v_rows		bigint;
	-- what the join left over (the differences, before the straddle check)
	l_rows		payidem._recon_leftover[];
	n			record;
BEGIN
	-- no bill, no reconciliation: without one every payment of the day would
	-- be reported platform_only
	IF payidem._bill_day_lines(v_channel, v_day) = 0 AND allow_empty IS NOT TRUE THEN
		RAISE EXCEPTION 'no bill of channel % for % is loaded', v_channel, to_char(v_day, 'YYYY-MM-DD') USING
			ERRCODE = 'object_not_in_prerequisite_state',
			DETAIL = format('payidem.channel_bill has no line of channel %s for bill day %s.', v_channel,
							to_char(v_day, 'YYYY-MM-DD')),
			HINT = 'Load the day''s bill with payidem.load_bill() first; if the channel really reported nothing that day, call reconcile(channel_no, bill_date, allow_empty => true).';
	END IF;
	-- the bill day, midnight to midnight in the channel's zone
	v_from := timezone(v_tz, v_day::timestamp);
	v_to := timezone(v_tz, (v_day + 1)::timestamp);

	-- one run per channel at a time (also keeps two runs of a day from
	-- doubling differences, and a straddle update from racing its day)
	PERFORM pg_advisory_xact_lock(hashtext('payidem.reconcile'), hashtext(v_channel));

	SELECT coalesce(max(substring(b.recon_batch_no FROM '-([0-9]{1,9})$')::bigint), 0) + 1
	  INTO v_run
	  FROM payidem.recon_batch b
	 WHERE b.channel_no = v_channel AND b.bill_date = v_day;
	v_batch := format('RC-%s-%s-%s', v_channel, to_char(v_day, 'YYYYMMDD'),
					  CASE WHEN v_run < 1000 THEN lpad(v_run::text, 3, '0') ELSE v_run::text END);
	INSERT INTO payidem.recon_batch (recon_batch_no, channel_no, bill_date, status, bill_timezone)
	VALUES (v_batch, v_channel, v_day, 'running', v_tz);

	PERFORM set_config('enable_nestloop', 'on', true);	-- for step 1 alone (above)
	-- 1. The day: one hash full join of the bill and the platform's payments,
	--    counted in the same pass.  Per row only the test that keeps the rows
	--    that may differ (as cheap as the plain FULL JOIN's WHERE): they are
	--    kept as one array of rows, and what kind of difference each is, is
	--    worked out for them alone (step 2).  A candidate may still match: a
	--    payment refunded after the day's end, billed as succeeded.
	SELECT count(*), count(b.transaction_id), coalesce(sum(b.amount), 0),
		   count(p.payment_no), coalesce(sum(p.amount), 0),
		   array_agg(ROW(p.payment_no, p.transaction_id, p.amount, p.status,
						 b.transaction_id, b.amount, b.status, p.cost_amount, b.fee)::payidem._recon_leftover)
			 FILTER (WHERE p.payment_no IS NULL OR b.transaction_id IS NULL OR p.amount <> b.amount
						OR (b.status = 'refunded') = (p.status = 'succeeded')
						OR b.fee <> p.cost_amount)
	  INTO v_rows, v_bill_lines, v_bill_amount, v_payments, v_pay_amount, l_rows
	  FROM (SELECT pay.payment_no, pay.transaction_id, pay.amount, pay.status, pay.cost_amount
			  FROM payidem.payment_paid pp
			  JOIN payidem.payment pay ON pay.payment_no = pp.payment_no
			 WHERE pp.channel_no = v_channel
			   AND pp.paid_at >= v_from AND pp.paid_at < v_to
			   AND pay.status = ANY (payidem._paid_payment_statuses())) p
	  FULL JOIN
		   -- only what the join needs: the hash of the bill is its biggest
		   -- cost; the payment number the channel echoes is read for the
		   -- bill-only lines alone (bo below)
		   (SELECT cb.transaction_id, cb.amount, cb.status, cb.fee
			  FROM payidem.channel_bill cb
			 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day) b
		ON b.transaction_id = p.transaction_id;
	PERFORM set_config('enable_nestloop', 'off', true);	-- (the function's SET restores it at exit)
	v_matched := v_rows - coalesce(cardinality(l_rows), 0);

	-- 2. The leftovers: straddles, then the day's differences replace its
	--    open ones; one statement, one snapshot.
	WITH r AS MATERIALIZED (
		SELECT u.p_no, u.p_txn, u.p_amount, u.p_status, u.b_txn, u.b_amount, u.b_status, u.p_cost, u.b_fee,
			   CASE
				WHEN u.p_no IS NULL THEN 'bill_only'
				WHEN u.b_txn IS NULL THEN 'platform_only'
				WHEN u.p_amount <> u.b_amount THEN 'amount_mismatch'
				WHEN (u.b_status = 'refunded' AND u.p_status = 'succeeded')
				  OR (u.b_status = 'succeeded' AND u.p_status <> 'succeeded'
					  AND payidem._refunded_by(u.p_no, u.p_status, v_to)) THEN 'status_mismatch'
				-- amount and status agree: the channel's fee against our cost
				WHEN u.b_fee <> u.p_cost THEN 'fee_mismatch'
				ELSE 'matched'
			   END AS kind
		  FROM unnest(l_rows) AS u
	),
	-- a bill line without a payment of the day: ours from another day (a
	-- midnight straddle), ours but not paid, or unknown.  It is ours and paid
	-- (x_paid) when the payment has this transaction id -- or has none, was
	-- paid this bill day, and is the one whose number this line alone of the
	-- day's unmatched lines echoes -- and no earlier day's bill lists the
	-- transaction with the same status (that would be billing it twice; a
	-- later day's line is the repeat, so re-running this day changes nothing).
	bo AS (
		SELECT r.b_txn, bn.b_no, r.b_amount, r.b_status, bn.b_fee,
			   x.payment_no AS x_no, x.order_no AS x_order, x.amount AS x_amount, x.status AS x_status,
			   x.cost_amount AS x_cost,
			   coalesce(x.by_txn AND x.status = ANY (payidem._paid_payment_statuses()), false)
			   AND NOT (coalesce(x.by_no, false)
						AND count(*) OVER (PARTITION BY x.by_no, x.payment_no) > 1)
			   AND NOT EXISTS (SELECT 1 FROM payidem.channel_bill cb
								WHERE cb.channel_no = v_channel AND cb.transaction_id = r.b_txn
								  AND cb.bill_date < v_day AND cb.status = r.b_status) AS x_paid,
			   CASE WHEN x.by_txn THEN payidem._refunded_by(x.payment_no, x.status, v_to) ELSE false END AS x_refunded,
			   coalesce(x.paid_at >= v_from AND x.paid_at < v_to, false) AS x_of_the_day
		  FROM r
		 -- (LIMIT 1, the line is unique: a look-up per line, never a hash
		 -- join against the whole bill)
		 CROSS JOIN LATERAL (
				SELECT cb.payment_no AS b_no, cb.fee AS b_fee
				  FROM payidem.channel_bill cb
				 WHERE cb.channel_no = v_channel AND cb.bill_date = v_day AND cb.transaction_id = r.b_txn
				 LIMIT 1) bn
		  LEFT JOIN LATERAL (
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status, true AS by_txn, false AS by_no,
					   pay.paid_at, pay.cost_amount
				  FROM payidem.payment_paid pp
				 -- the payment by its key (LIMIT: a look-up, never a hash
				 -- of every payment)
				 CROSS JOIN LATERAL (
						SELECT p1.payment_no, p1.order_no, p1.amount, p1.status, p1.paid_at, p1.cost_amount
						  FROM payidem.payment p1
						 WHERE p1.payment_no = pp.payment_no
						 LIMIT 1) pay
				 WHERE pp.channel_no = v_channel AND pp.transaction_id = r.b_txn
				UNION ALL
				-- else the payment number the channel echoes: the same payment
				-- if ours has no transaction id (a success reported without
				-- one) and was paid this bill day, otherwise for the record only
				SELECT pay.payment_no, pay.order_no, pay.amount, pay.status,
					   pay.transaction_id IS NULL AND pay.paid_at >= v_from AND pay.paid_at < v_to,
					   pay.transaction_id IS NULL, pay.paid_at, pay.cost_amount
				  FROM payidem.payment pay
				 WHERE pay.payment_no = bn.b_no AND pay.channel_no = v_channel
				LIMIT 1) x ON true
		 WHERE r.kind = 'bill_only'
	),
	-- a payment of the day missing from the bill: in the bill of another day?
	-- (One without a transaction id is in this bill if a line echoing its
	-- number was matched to it above.)
	po AS (
		SELECT r.p_no, r.p_txn, r.p_amount, r.p_status,
			   EXISTS (SELECT 1 FROM payidem.channel_bill cb
						WHERE cb.channel_no = v_channel AND cb.transaction_id = r.p_txn
						  AND cb.bill_date <> v_day) AS elsewhere
		  FROM r
		 WHERE r.kind = 'platform_only'
		   AND NOT (r.p_txn IS NULL AND EXISTS (SELECT 1 FROM bo WHERE bo.x_no = r.p_no AND bo.x_paid))
	),
	found AS MATERIALIZED (
		SELECT r.kind AS diff_type, r.p_txn AS transaction_id, r.p_no AS payment_no,
			   r.p_amount AS platform_amount, r.b_amount AS channel_amount,
			   r.p_status AS platform_status, r.b_status AS channel_status,
			   CASE WHEN r.kind = 'fee_mismatch' THEN r.p_cost END AS platform_fee,
			   CASE WHEN r.kind = 'fee_mismatch' THEN r.b_fee END AS channel_fee
		  FROM r
		 WHERE r.kind IN ('amount_mismatch', 'status_mismatch', 'fee_mismatch')
		UNION ALL
		SELECT 'platform_only', po.p_txn, po.p_no, po.p_amount, NULL, po.p_status, NULL, NULL, NULL
		  FROM po
		 WHERE NOT po.elsewhere
		UNION ALL
		SELECT s.diff_type, s.b_txn, coalesce(s.x_no, s.b_no),
			   CASE WHEN s.x_paid THEN s.x_amount END, s.b_amount, s.x_status, s.b_status,
			   CASE WHEN s.diff_type = 'fee_mismatch' THEN s.x_cost END,
			   CASE WHEN s.diff_type = 'fee_mismatch' THEN s.b_fee END
		  FROM (SELECT bo.*,
					   CASE
						WHEN NOT bo.x_paid THEN 'channel_only'
						WHEN bo.x_amount <> bo.b_amount THEN 'amount_mismatch'
						WHEN (bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						  OR (bo.b_status = 'succeeded' AND bo.x_refunded) THEN 'status_mismatch'
						-- a line of another day (a midnight straddle): its fee too
						WHEN bo.b_fee <> bo.x_cost THEN 'fee_mismatch'
					   END AS diff_type
				  FROM bo) s
		 WHERE s.diff_type IS NOT NULL
	),
	-- platform_only differences of other days that this bill explains
	auto AS (
		UPDATE payidem.reconciliation rc
		   SET handle_status = 'auto_resolved', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('found in the bill of %s (%s)', to_char(v_day, 'YYYY-MM-DD'), v_batch),
			   updated_at = now()
		 WHERE rc.channel_no = v_channel
		   AND (rc.transaction_id = ANY (ARRAY(SELECT bo.b_txn FROM bo WHERE bo.x_paid))
				OR (rc.transaction_id IS NULL
					AND rc.payment_no = ANY (ARRAY(SELECT bo.x_no FROM bo WHERE bo.x_paid))))
		   AND rc.diff_type = 'platform_only' AND rc.handle_status = 'open'
		   AND rc.bill_date <> v_day
		RETURNING rc.recon_id
	),
	-- open differences found again keep their recon_id, with today's values
	kept AS (
		UPDATE payidem.reconciliation rc
		   SET recon_batch_no = v_batch, payment_no = f.payment_no,
			   platform_amount = f.platform_amount, channel_amount = f.channel_amount,
			   platform_status = f.platform_status, channel_status = f.channel_status,
			   platform_fee = f.platform_fee, channel_fee = f.channel_fee,
			   updated_at = now()
		  FROM found f
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND rc.diff_type = f.diff_type
		   AND (rc.transaction_id IS NULL) = (f.transaction_id IS NULL)
		   AND coalesce(rc.transaction_id, rc.payment_no) = coalesce(f.transaction_id, f.payment_no)
		RETURNING rc.recon_id
	),
	-- open differences not found again are gone (bill corrected, payment fixed)
	dropped AS (
		DELETE FROM payidem.reconciliation rc
		 WHERE rc.channel_no = v_channel AND rc.bill_date = v_day AND rc.handle_status = 'open'
		   AND NOT EXISTS (SELECT 1 FROM found f
							WHERE f.diff_type = rc.diff_type
							  AND (f.transaction_id IS NULL) = (rc.transaction_id IS NULL)
							  AND coalesce(f.transaction_id, f.payment_no) = coalesce(rc.transaction_id, rc.payment_no))
		RETURNING rc.recon_id
	),
	-- the anomaly of a channel_only difference that is gone goes with it
	settled AS (
		UPDATE payidem.anomaly a
		   SET handle_status = 'handled', handled_at = now(), handled_by = 'payidem.reconcile',
			   note = format('its difference is gone in %s (the bill no longer shows it)', v_batch),
			   updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.handle_status = 'open' AND a.channel_no = v_channel
		   AND a.detail ->> 'bill_date' = to_char(v_day, 'YYYY-MM-DD')
		   AND (a.detail ->> 'recon_id')::bigint IN (SELECT d.recon_id FROM dropped d)
		RETURNING a.anomaly_id
	),
	-- new ones; one a person handled or ignored is not opened again
	added AS (
		INSERT INTO payidem.reconciliation AS rc
			(recon_batch_no, channel_no, bill_date, diff_type, transaction_id, payment_no,
			 platform_amount, channel_amount, platform_status, channel_status, platform_fee, channel_fee)
		SELECT v_batch, v_channel, v_day, f.diff_type, f.transaction_id, f.payment_no,
			   f.platform_amount, f.channel_amount, f.platform_status, f.channel_status,
			   f.platform_fee, f.channel_fee
		  FROM found f
		 WHERE NOT EXISTS (SELECT 1 FROM payidem.reconciliation e
							WHERE e.channel_no = v_channel AND e.bill_date = v_day
							  AND e.diff_type = f.diff_type
							  AND (e.transaction_id IS NULL) = (f.transaction_id IS NULL)
							  AND coalesce(e.transaction_id, e.payment_no) = coalesce(f.transaction_id, f.payment_no))
		RETURNING rc.recon_id, rc.diff_type, rc.transaction_id, rc.channel_amount
	),
	-- money taken without a record of ours: an anomaly, once per difference
	alerted AS (
		INSERT INTO payidem.anomaly (kind, order_no, payment_no, channel_no, amount, detail)
		SELECT 'channel_only', bo.x_order, bo.x_no, v_channel, a.channel_amount,
			   jsonb_strip_nulls(jsonb_build_object(
				   'transaction_id', a.transaction_id,
				   'bill_date', to_char(v_day, 'YYYY-MM-DD'),
				   'recon_id', a.recon_id,
				   'recon_batch_no', v_batch,
				   'channel_status', bo.b_status,
				   'channel_payment_no', bo.b_no,
				   'platform_status', bo.x_status))
		  FROM added a
		  JOIN bo ON bo.b_txn = a.transaction_id
		 WHERE a.diff_type = 'channel_only'
		-- one per channel, day and transaction; one that a run closed because
		-- its difference was gone is opened again now that it is back (one a
		-- person handled stays as the person left it)
		ON CONFLICT (channel_no, (detail ->> 'bill_date'), (detail ->> 'transaction_id'))
			WHERE kind = 'channel_only'
			DO UPDATE SET handle_status = 'open', handled_at = NULL, handled_by = NULL, note = NULL,
						  amount = EXCLUDED.amount, detail = EXCLUDED.detail, updated_at = now()
			WHERE anomaly.handled_by = 'payidem.reconcile' AND anomaly.handle_status <> 'open'
		RETURNING anomaly_id
	)
	SELECT (SELECT count(*) FROM r WHERE r.kind = 'matched') AS matched_candidates,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'platform_only') AS platform_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'channel_only') AS channel_only,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'amount_mismatch') AS amount_mismatch,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'status_mismatch') AS status_mismatch,
		   (SELECT count(*) FROM found f WHERE f.diff_type = 'fee_mismatch') AS fee_mismatch,
		   (SELECT count(*) FROM bo
			 WHERE bo.x_paid AND bo.x_amount = bo.b_amount
			   AND NOT ((bo.b_status = 'refunded' AND bo.x_status = 'succeeded')
						OR (bo.b_status = 'succeeded' AND bo.x_refunded))
			   AND NOT coalesce(bo.b_fee <> bo.x_cost, false)) AS matched_across,
		   (SELECT count(*) FROM bo WHERE bo.x_paid AND NOT bo.x_of_the_day)
			 + (SELECT count(*) FROM po WHERE po.elsewhere) AS straddled,
		   (SELECT count(*) FROM auto) AS auto_resolved,
		   (SELECT count(*) FROM kept) + (SELECT count(*) FROM dropped)
			 + (SELECT count(*) FROM alerted) AS touched
	  INTO n;

	UPDATE payidem.recon_batch b
	   SET status = 'done', finished_at = clock_timestamp(),
		   matched = v_matched + n.matched_candidates + n.matched_across,
		   platform_only = n.platform_only, channel_only = n.channel_only,
		   amount_mismatch = n.amount_mismatch, status_mismatch = n.status_mismatch,
		   fee_mismatch = n.fee_mismatch, bill_lines = v_bill_lines, bill_amount_total = v_bill_amount,
		   platform_payments = v_payments, platform_amount_total = v_pay_amount,
		   straddled = n.straddled, auto_resolved = n.auto_resolved
	 WHERE b.recon_batch_no = v_batch;

	RETURN QUERY SELECT v_batch, v_matched + n.matched_candidates + n.matched_across, n.platform_only, n.channel_only,
						n.amount_mismatch, n.status_mismatch, n.fee_mismatch;
END
$$;
COMMENT ON FUNCTION payidem.reconcile(text, date, boolean) IS
	'Reconcile a channel''s bill of one day (cut in payidem.bill_timezone) against the platform''s payments (55000 if no bill line of that day is loaded, unless allow_empty): one hash full join on transaction_id; stores only the differences (platform_only, channel_only, amount_mismatch, status_mismatch, fee_mismatch: the bill line''s fee is not the payment''s cost_amount), replacing the day''s open ones and keeping handled ones; auto-resolves midnight straddles; a channel_only difference also raises an anomaly.';

CREATE FUNCTION payidem.resolve_diff(recon_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
	v_id		bigint := resolve_diff.recon_id;
	v_status	text := resolve_diff.handle_status;
	v_note		text := resolve_diff.note;
	d			payidem.reconciliation;
BEGIN
	PERFORM payidem._require('recon_id', resolve_diff.recon_id::text);
	PERFORM payidem._check_resolution('a difference', v_status, v_note);

	UPDATE payidem.reconciliation rc
	   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
		   note = v_note, updated_at = now()
	 WHERE rc.recon_id = v_id AND rc.handle_status = 'open'
	RETURNING rc.* INTO d;
	IF NOT FOUND THEN
		SELECT rc.* INTO d FROM payidem.reconciliation rc WHERE rc.recon_id = v_id;
		IF NOT FOUND THEN
			PERFORM payidem._raise_not_found('reconciliation difference', v_id);
		END IF;
		RAISE EXCEPTION 'reconciliation difference % is not open', v_id USING
			ERRCODE = 'PI002',
			DETAIL = format('It is already %s%s.', d.handle_status,
							CASE WHEN d.handled_by IS NOT NULL THEN ' by ' || d.handled_by ELSE '' END),
			HINT = 'Only an open difference can be resolved.';
	END IF;

	-- the alarm raised for a channel_only difference is closed with it
	IF d.diff_type = 'channel_only' THEN
		UPDATE payidem.anomaly a
		   SET handle_status = v_status, handled_by = session_user, handled_at = now(),
			   note = v_note, updated_at = now()
		 WHERE a.kind = 'channel_only' AND a.channel_no = d.channel_no
		   AND a.detail ->> 'bill_date' = to_char(d.bill_date, 'YYYY-MM-DD')
		   AND a.detail ->> 'transaction_id' = d.transaction_id
		   AND a.handle_status = 'open';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.resolve_diff(bigint, text, text) IS
	'A person closes an open reconciliation difference as handled or ignored (22023 otherwise; PI009 unknown id; PI002 not open), recording who, when and a note; closes the anomaly of a channel_only difference too.';

-- The daily report: the last run of each channel and day, and what is still open.
CREATE VIEW payidem.recon_summary AS
SELECT b.channel_no, b.bill_date,
	   b.recon_batch_no AS last_batch_no, b.finished_at, b.bill_timezone,
	   b.bill_lines, b.bill_amount_total, b.platform_payments, b.platform_amount_total,
	   b.matched, b.platform_only, b.channel_only, b.amount_mismatch, b.status_mismatch,
	   b.straddled,
	   coalesce(d.open_count, 0) AS open_count,
	   coalesce(d.open_amount, 0) AS open_amount,
	   coalesce(d.open_channel_only, 0) AS open_channel_only,
	   coalesce(d.handled_count, 0) AS handled_count,
	   coalesce(d.ignored_count, 0) AS ignored_count,
	   coalesce(d.auto_resolved_count, 0) AS auto_resolved_count,
	   b.fee_mismatch
  FROM (SELECT DISTINCT ON (rb.channel_no, rb.bill_date) rb.*
		  FROM payidem.recon_batch rb
		 WHERE rb.status = 'done'
		 ORDER BY rb.channel_no, rb.bill_date, rb.started_at DESC,
				  pg_catalog.length(rb.recon_batch_no) DESC, rb.recon_batch_no DESC) b
  LEFT JOIN (SELECT rc.channel_no, rc.bill_date,
					count(*) FILTER (WHERE rc.handle_status = 'open') AS open_count,
					sum(CASE rc.diff_type
						 WHEN 'platform_only' THEN rc.platform_amount
						 WHEN 'channel_only' THEN rc.channel_amount
						 WHEN 'amount_mismatch' THEN pg_catalog.abs(rc.platform_amount - rc.channel_amount)
						 WHEN 'fee_mismatch' THEN pg_catalog.abs(rc.platform_fee - rc.channel_fee)
						 ELSE coalesce(rc.channel_amount, rc.platform_amount)
						END) FILTER (WHERE rc.handle_status = 'open') AS open_amount,
					count(*) FILTER (WHERE rc.handle_status = 'open' AND rc.diff_type = 'channel_only') AS open_channel_only,
					count(*) FILTER (WHERE rc.handle_status = 'handled') AS handled_count,
					count(*) FILTER (WHERE rc.handle_status = 'ignored') AS ignored_count,
					count(*) FILTER (WHERE rc.handle_status = 'auto_resolved') AS auto_resolved_count
			   FROM payidem.reconciliation rc
			  GROUP BY rc.channel_no, rc.bill_date) d
	ON d.channel_no = b.channel_no AND d.bill_date = b.bill_date;
COMMENT ON VIEW payidem.recon_summary IS
	'Daily reconciliation report per channel and bill day: the last run''s counts and totals, and the differences still open (count, money concerned, channel_only among them) or closed by a person or automatically.';
COMMENT ON COLUMN payidem.recon_summary.open_amount IS
	'Money concerned by the open differences, minor units: the amount of a platform_only, channel_only or status_mismatch, the gap of an amount_mismatch or of a fee_mismatch''s fees.';

-- (end of reconciliation functions)

