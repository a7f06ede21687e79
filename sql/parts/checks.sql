------------------------------------------------------------------------------
-- Shared checks of arguments: each rule, its message and its SQLSTATE written
-- once, for every part below (the raise helpers, formats, numbers, durations)
------------------------------------------------------------------------------

-- The one RAISE of the checks: SQLSTATE, message, and DETAIL and HINT unless
-- NULL (RAISE refuses a NULL option).  The message is taken as it is (no %
-- placeholders).
CREATE FUNCTION payidem._raise(state text, message text, detail text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF detail IS NULL AND hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message;
	ELSIF hint IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail;
	ELSIF detail IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, HINT = hint;
	END IF;
	RAISE EXCEPTION USING ERRCODE = state, MESSAGE = message, DETAIL = detail, HINT = hint;
END
$$;
COMMENT ON FUNCTION payidem._raise(text, text, text, text) IS
	'Internal: raise an error with this SQLSTATE and message, and DETAIL and HINT unless NULL.';
-- 22023: a malformed argument; DETAIL says the value and the rule, HINT the fix.
CREATE FUNCTION payidem._raise_invalid(message text, detail text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE sql PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem._raise('22023', message, detail, hint); END;
COMMENT ON FUNCTION payidem._raise_invalid(text, text, text) IS
	'Internal: raise 22023 (invalid_parameter_value) with message, and DETAIL and HINT unless NULL.';
-- PI009 "<what> <value> does not exist": a text value quoted and cut at 64
-- characters as in every message, a number as it is, NULL as NULL; DETAIL
-- "<in_table> has no row with that <by_key>." unless in_table is NULL.
CREATE FUNCTION payidem._raise_not_found(what text, value anyelement, in_table text DEFAULT NULL,
	by_key text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._raise('PI009', format('%s %s does not exist', what,
		CASE WHEN value IS NULL THEN 'NULL' WHEN pg_typeof(value) = 'text'::regtype
			 THEN quote_literal(left(value::text, 64)) ELSE value::text END),
		in_table || ' has no row with that ' || by_key || '.', hint);
END
$$;
COMMENT ON FUNCTION payidem._raise_not_found(text, anyelement, text, text, text) IS
	'Internal: raise PI009 "<what> <value> does not exist", DETAIL naming the table and key searched.';

-- A format's pattern is written once, in its domain; the flow functions test
-- an argument against the domain of the column it goes to (payidem._fits,
-- src/util.c: the domain's own CHECKs, without raising), so they can say
-- which argument is wrong, with the rule in words written once below.
CREATE FUNCTION payidem._fits(value text, domain regtype)
RETURNS boolean
AS 'MODULE_PATHNAME', 'payidem_fits'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._fits(text, regtype) IS
	'Internal: whether value satisfies every CHECK of the text domain (no error raised).';
CREATE FUNCTION payidem._format_rule(domain regtype)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE domain::text
	WHEN 'payidem.merchant_ref' THEN '1 to 64 characters of 0-9, A-Z, a-z and _ . | * @ -'
	WHEN 'payidem.channel_ref' THEN '1 to 64 printable characters without spaces'
	WHEN 'payidem.http_url' THEN 'an http:// or https:// URL without spaces, at most 1024 characters'
	END;
COMMENT ON FUNCTION payidem._format_rule(regtype) IS
	'Internal: the format of a domain that arguments are checked against, in words, for error messages.';
-- 22023 for an argument (what) that is not of its format; DETAIL shows the
-- value (at most 64 characters) and the rule
CREATE FUNCTION payidem._invalid_format(what text, value text, domain regtype, hint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._raise_invalid('invalid ' || what, format('The value was %s; it must be %s.',
		coalesce(quote_literal(left(value, 64)), 'NULL'), payidem._format_rule(domain)), hint);
END
$$;
COMMENT ON FUNCTION payidem._invalid_format(text, text, regtype, text) IS
	'Internal: raise 22023 "invalid <what>" for a value not of the domain''s format.';

CREATE FUNCTION payidem._check_rate(what text, rate numeric)
RETURNS numeric
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF rate IS NULL OR rate < 0 OR rate >= 1 OR rate <> round(rate, 6) THEN
		PERFORM payidem._raise_invalid(format('invalid %s rate', what),
			format('The rate was %s; it must be a fraction from 0 up to but not including 1, with at most 6 decimals.',
				coalesce(rate::text, 'NULL')),
			'Write 0.6% as 0.006.');
	END IF;
	RETURN rate;
END
$$;

CREATE FUNCTION payidem._check_code(what text, value text, pattern text, rule text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._check_no_controls('invalid ' || what, 'The value', value);
	IF value IS NULL OR value !~ pattern THEN
		PERFORM payidem._raise_invalid(format('invalid %s', what),
			format('The value was %s; %s', coalesce(quote_literal(left(value, 64)), 'NULL'), rule));
	END IF;
	RETURN value;
END
$$;

CREATE FUNCTION payidem._check_limit(what text, value bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NOT NULL AND value <= 0 THEN
		PERFORM payidem._raise_invalid(format('invalid %s', what),
			format('The limit was %s; a limit is a positive amount in minor units, or NULL for none.', value));
	END IF;
	RETURN value;
END
$$;

-- A duration argument (an order's expiry, a secret's grace period): not NULL,
-- and now() plus it is after now (or now itself, where allow_zero) and at most
-- now() plus 100 years.  The end is what is checked: PostgreSQL compares
-- intervals counting a month as 30 days, but adds months and days to a time
-- by the calendar ('1 month -29 days' can end before it starts), and a sum past
-- the timestamp range is 22008, so each part is bounded before the sum.
-- 22023 for all of these.  In C (src/util.c, payidem_check_interval),
-- where idem_claim's lease and idem_purge's retention are checked by the same
-- code: the rule is written once.
CREATE FUNCTION payidem._check_duration(message text, what text, value interval,
										allow_zero boolean, hint text)
RETURNS interval
AS 'MODULE_PATHNAME', 'payidem_check_duration'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_duration(text, text, interval, boolean, text) IS
	'Internal: value, if now() plus it is after now() (or now() itself, where allow_zero) and at most 100 years later, each of its parts within 100 years; 22023 with message, the value in DETAIL and hint otherwise.';

-- The one rule for a name or description a person reads (a merchant's name,
-- an order's subject, the codes _check_code checks): no control character
-- (tab, line break, U+0000 to U+001F, DEL).  22023 with the value escaped in
-- DETAIL, never its raw bytes.  In C (src/util.c), as the escaping of
-- values in payidem's C errors is.
CREATE FUNCTION payidem._check_no_controls(message text, what text, value text)
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_check_no_controls'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem._check_no_controls(text, text, text) IS
	'Internal: value, unless it holds a control character (tab, line break, U+0000 to U+001F, DEL): 22023 with message and the value escaped in DETAIL.';

-- The day of a channel's bill (load_bill, reconcile): a calendar day a bill
-- can have, from 1970 to 9999 (so that the next midnight exists too).
CREATE FUNCTION payidem._check_bill_date(bill_date date)
RETURNS date
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT isfinite(bill_date) OR bill_date < date '1970-01-01' OR bill_date > date '9999-12-31' THEN
		PERFORM payidem._raise_invalid('invalid bill date',
			format('The bill date was %s; a bill covers one calendar day from 1970-01-01 to 9999-12-31.',
				CASE WHEN isfinite(bill_date)	-- ISO, whatever DateStyle (to_char stops at 294276)
					THEN format('%s-%s-%s', extract(year FROM bill_date),
								lpad(extract(month FROM bill_date)::text, 2, '0'),
								lpad(extract(day FROM bill_date)::text, 2, '0'))
					ELSE bill_date::text END));
	END IF;
	RETURN bill_date;
END
$$;

-- A missing identifier is malformed input (22023), not "does not exist".
CREATE FUNCTION payidem._require(what text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL THEN
		PERFORM payidem._raise_invalid(what || ' must not be NULL', hint => format('Pass the %s.', what));
	END IF;
	RETURN value;
END
$$;

-- An order, payment, refund or payout number must be one before it is looked
-- up: PO/PY/RF/PT, 24 digits, a real date and matching check digits (a valid
-- number that names no row is PI009).
CREATE FUNCTION payidem._check_number(kind text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'payout' THEN 'PT' ELSE 'RF' END;
	v_detail text;
BEGIN
	IF value IS NULL OR value !~ ('^' || v_prefix || '[0-9]{24}$') THEN
		PERFORM payidem._raise_invalid(format('invalid %s number', kind),
			format('The value was %s; %s %s number is %s followed by 24 digits.',
				coalesce(quote_literal(left(value, 64)) ||
						CASE WHEN length(value) > 64 THEN format('... (%s characters)', length(value)) ELSE '' END,
						'NULL'),
				CASE kind WHEN 'order' THEN 'an' ELSE 'a' END, kind, v_prefix),
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	IF NOT payidem.order_no_valid(value) THEN
		-- only on this error path: order_no_parse() says what is wrong
		BEGIN
			PERFORM payidem.order_no_parse(value);
		EXCEPTION WHEN invalid_parameter_value THEN
			GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
		END;
		PERFORM payidem._raise_invalid(format('invalid %s number %s', kind, quote_literal(value)),
			v_detail,
			'Pass the number payidem returned when it created the ' || kind || '.');
	END IF;
	RETURN value;
END
$$;

-- REPEATABLE READ and the checks that read other sessions' rows after a lock:
-- under READ COMMITTED each statement sees what committed before it, so a sum
-- read after taking a row lock counts the rows of whoever held it; under
-- SERIALIZABLE a race ends in 40001.  A REPEATABLE READ snapshot would miss
-- them (two refunds above the paid amount, a daily limit passed, a pending
-- attempt left on a closed order): refused instead.
CREATE FUNCTION payidem._refuse_repeatable_read(fn text, reads text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF current_setting('transaction_isolation') = 'repeatable read' THEN
		RAISE EXCEPTION '%() cannot run in a REPEATABLE READ transaction', fn USING
			ERRCODE = 'feature_not_supported',
			DETAIL = format('It checks %s after taking a row lock; a REPEATABLE READ snapshot does not show what other sessions committed meanwhile.', reads),
			HINT = 'Call it in READ COMMITTED (the default) or SERIALIZABLE (retry on SQLSTATE 40001).';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._refuse_repeatable_read(text, text) IS
	'Internal to begin_payment(), close_order() and refund(): raises 0A000 inside a REPEATABLE READ transaction.';

-- How a person closes a difference or an anomaly: one rule for both.
CREATE FUNCTION payidem._check_resolution(what text, handle_status text, note text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF handle_status IS NULL OR handle_status NOT IN ('handled', 'ignored') THEN
		PERFORM payidem._raise_invalid('invalid handle status ' || coalesce(quote_literal(left(handle_status, 64)), 'NULL'),
			format('A person resolves %s as handled or ignored.', what));
	END IF;
	IF length(note) > 1024 THEN
		PERFORM payidem._raise_invalid('note too long',
			format('The note has %s characters; at most 1024 are kept.', length(note)));
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_resolution(text, text, text) IS
	'Internal to resolve_diff() and resolve_anomaly(): handle_status handled or ignored, a note of at most 1024 characters (22023).';

-- Since 1.1.  A page of a list (list_orders(), list_anomalies(),
-- list_differences()): 1 to 1000 rows.
CREATE FUNCTION payidem._check_page_size(max_rows integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000 THEN
		PERFORM payidem._raise_invalid('invalid max_rows',
			format('max_rows was %s; a page has 1 to 1000 rows.', coalesce(max_rows::text, 'NULL')),
			'Pass how many rows one page shows, e.g. 100, and page on with the last row''s key.');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_page_size(integer) IS
	'Internal to the lists of the read API: max_rows from 1 to 1000 (22023).';

-- Since 1.1.  A value that must be one of a known few (a status to list by):
-- 22023 naming them.
CREATE FUNCTION payidem._check_one_of(what text, value text, known text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF value IS NULL OR NOT value = ANY (known) THEN
		PERFORM payidem._raise_invalid('invalid ' || what,
			format('The value was %s; it is one of %s.', coalesce(quote_literal(left(value, 64)), 'NULL'),
				   array_to_string(known, ', ')),
			'Pass NULL for all of them.');
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._check_one_of(text, text, text[]) IS
	'Internal: value must be one of known (22023 naming them).';
