--
-- merchant: merchants, secrets (encrypted, signed, rotated), channels, channel
-- configuration, bindings, routing, and the master key file.
-- The test cluster's postgresql.conf names a master key file.
--
CREATE EXTENSION IF NOT EXISTS payidem;
SET client_min_messages = warning;
\set VERBOSITY default
\set SHOW_CONTEXT never

-- a master key file of our own, written by the server (mode 0600, its user)
SELECT current_setting('data_directory') || '/payidem_test_' || pg_backend_pid() AS keydir \gset
SELECT :'keydir' || '_a.key' AS key_a, :'keydir' || '_b.key' AS key_b,
       :'keydir' || '_bad.key' AS key_bad, :'keydir' || '_open.key' AS key_open \gset
COPY (SELECT repeat('0123456789abcdef', 4)) TO :'key_a';
COPY (SELECT repeat('fedcba9876543210', 4)) TO :'key_b';
COPY (SELECT 'not a key') TO :'key_bad';
COPY (SELECT repeat('00', 32)) TO :'key_open';
-- (the server creates files with its own umask: set the modes we want to test;
-- this needs the client on the server's host, as root or the server's user)
\setenv PAYIDEM_KEYDIR :keydir
\! chmod 600 "$PAYIDEM_KEYDIR"_a.key "$PAYIDEM_KEYDIR"_b.key "$PAYIDEM_KEYDIR"_bad.key
\! chmod 644 "$PAYIDEM_KEYDIR"_open.key
SET payidem.master_key_file = :'key_a';
SELECT payidem.master_key_version() > 0 AS key_loaded;

-- errors whose messages name a random merchant number or a path: show them masked
CREATE FUNCTION pg_temp.try(stmt text)
RETURNS TABLE (err_code text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN QUERY SELECT '00000', 'no error', NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS err_code = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
		err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
	err_message := regexp_replace(err_message, 'M[0-9A-HJKMNP-TV-Z]{15}', 'M***', 'g');
	err_detail := regexp_replace(err_detail, 'M[0-9A-HJKMNP-TV-Z]{15}', 'M***', 'g');
	err_detail := regexp_replace(err_detail, '''.*/payidem_test_[0-9]+_', '''.../', 'g');
	RETURN NEXT;
END
$$;

--------------------------------------------------------------------- merchants
SELECT * FROM payidem.create_merchant('Tea House', 'retail', 0.006) \gset
SELECT :'merchant_no' ~ '^M[0-9A-HJKMNP-TV-Z]{15}$' AS merchant_no_format,
       :'api_key' ~ '^ak_[0-9A-HJKMNP-TV-Z]{26}$' AS api_key_format,
       :'api_secret' ~ '^[0-9a-f]{64}$' AS secret_is_64_hex;
SELECT merchant_name, merchant_type, fee_rate, settle_cycle, status
  FROM payidem.merchant WHERE merchant_no = :'merchant_no';
-- the secret is stored sealed: one record, version 1, current key, nonce 12 + tag 16
SELECT secret_version, key_version = payidem.master_key_version() AS current_key,
       length(nonce) AS nonce_bytes, length(auth_tag) AS tag_bytes, length(ciphertext) AS ciphertext_bytes,
       valid_until IS NULL AS is_current
  FROM payidem.merchant_secret WHERE merchant_no = :'merchant_no';
-- numbers are random, not counters
SELECT count(DISTINCT merchant_no) AS distinct_merchants, count(DISTINCT api_key) AS distinct_keys
  FROM (SELECT (payidem.create_merchant('Shop ' || i, 'catering', 0.0038, 'D0')).* FROM generate_series(1, 20) i) s;

SELECT payidem.create_merchant('', 'retail', 0.006);
SELECT payidem.create_merchant(repeat('x', 129), 'retail', 0.006);
SELECT payidem.create_merchant('Shop', 'Retail', 0.006);
SELECT payidem.create_merchant('Shop', 'retail', 1);
SELECT payidem.create_merchant('Shop', 'retail', -0.001);
SELECT payidem.create_merchant('Shop', 'retail', 0.0000001);
SELECT payidem.create_merchant('Shop', 'retail', NULL);
SELECT payidem.create_merchant('Shop', 'retail', 0.006, 'X1');

----------------------------------------------------------- signatures
SELECT payidem.sign(:'merchant_no', 'amount=1250&order=PO1') AS sig \gset
SELECT :'sig' ~ '^[0-9a-f]{64}$' AS sig_format;
-- the same HMAC-SHA256 any client computes with the secret (checked with openssl)
\setenv PAYIDEM_SECRET :api_secret
\set openssl_sig `printf '%s' 'amount=1250&order=PO1' | openssl dgst -sha256 -hmac "$PAYIDEM_SECRET" | sed 's/^.*= //'`
SELECT :'sig' = :'openssl_sig' AS same_as_openssl;
SELECT payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', :'sig') AS good,
       payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', upper(:'sig')) AS upper_hex,
       payidem.verify_signature(:'api_key', 'amount=9250&order=PO1', :'sig') AS tampered_payload,
       payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', left(:'sig', 63) || 'x') AS tampered_sig,
       payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', left(:'sig', 63)) AS short_sig,
       payidem.verify_signature('ak_UNKNOWN00000000000000000000', 'amount=1250&order=PO1', :'sig') AS unknown_key,
       payidem.verify_signature(:'api_key', NULL, :'sig') AS null_payload;
SELECT payidem.sign('M000000000000000', 'x');
SELECT payidem.sign(:'merchant_no', NULL);

------------------------------------------------------------- secret rotation
SELECT payidem.rotate_merchant_secret(:'merchant_no', '1 hour') AS secret2 \gset
SELECT :'secret2' <> :'api_secret' AS new_secret;
SELECT payidem.sign(:'merchant_no', 'p') = payidem.sign(:'merchant_no', 'p') AS sign_is_deterministic;
SELECT payidem.sign(:'merchant_no', 'amount=1250&order=PO1') <> :'sig' AS signs_with_new_secret;
SELECT payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', :'sig') AS previous_within_grace;
SELECT payidem.sign(:'merchant_no', 'amount=1250&order=PO1') AS sig2 \gset
SELECT payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', :'sig2') AS current_valid;
-- a second rotation: only current + previous are valid, the first secret is gone
SELECT payidem.rotate_merchant_secret(:'merchant_no') IS NOT NULL AS rotated_again;
SELECT payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', :'sig') AS first_secret,
       payidem.verify_signature(:'api_key', 'amount=1250&order=PO1', :'sig2') AS second_secret;
SELECT secret_version, valid_until IS NULL AS is_current, valid_until > now() AS in_grace
  FROM payidem.merchant_secret WHERE merchant_no = :'merchant_no' ORDER BY secret_version;
-- after the grace window the previous secret is refused
SELECT payidem.sign(:'merchant_no', 'late') AS sig3 \gset
-- (the rotation and the check inside its second in one transaction: one
-- now(), however long the machine pauses between them)
BEGIN;
SELECT payidem.rotate_merchant_secret(:'merchant_no', '1 second') IS NOT NULL AS rotated_short;
SELECT payidem.verify_signature(:'api_key', 'late', :'sig3') AS within_one_second;
COMMIT;
SELECT pg_sleep(1.2);
SELECT payidem.verify_signature(:'api_key', 'late', :'sig3') AS after_grace;
SELECT payidem.rotate_merchant_secret(:'merchant_no', '-1 hour');
SELECT payidem.rotate_merchant_secret('M000000000000000');

---------------------------------------------------------------- merchant status
SELECT * FROM payidem.create_merchant('Frozen Shop', 'retail', 0.006) \gset frozen_
SELECT payidem.freeze_merchant(:'frozen_merchant_no');
SELECT status FROM payidem.merchant WHERE merchant_no = :'frozen_merchant_no';
SELECT payidem.unfreeze_merchant(:'frozen_merchant_no');
SELECT payidem.sign(:'frozen_merchant_no', 'before close') AS closing_sig \gset
SELECT payidem.verify_signature(:'frozen_api_key', 'before close', :'closing_sig') AS verifies_before_close;
SELECT payidem.close_merchant(:'frozen_merchant_no');
-- a closed merchant's key no longer signs or verifies
SELECT * FROM pg_temp.try(format('SELECT payidem.sign(%L, %L)', :'frozen_merchant_no', 'after close'));
SELECT payidem.verify_signature(:'frozen_api_key', 'before close', :'closing_sig') AS verifies_after_close;
SELECT * FROM pg_temp.try(format('SELECT payidem.unfreeze_merchant(%L)', :'frozen_merchant_no'));
SELECT payidem.set_merchant_status(:'frozen_merchant_no', 'sleeping');
SELECT payidem.freeze_merchant('M000000000000000');

---------------------------------------------------------------------- channels
SELECT payidem.create_channel('WECHAT_A', 'wechat', 0.002);
SELECT payidem.create_channel('WECHAT_B', 'wechat', 0.0025, 300);
SELECT payidem.create_channel('WECHAT_C', 'wechat', 0.002, 100, ARRAY['catering']);
SELECT payidem.create_channel('WECHAT_OFF', 'wechat', 0.002);
SELECT payidem.create_channel('ALIPAY_A', 'alipay', 0.006);
SELECT channel_no, channel_type, fee_rate, weight, allowed_merchant_types, status
  FROM payidem.channel WHERE channel_no IN ('WECHAT_A', 'WECHAT_B', 'WECHAT_C', 'WECHAT_OFF', 'ALIPAY_A')
 ORDER BY channel_no;
SELECT payidem.create_channel('WECHAT_A', 'wechat', 0.002);
SELECT payidem.create_channel('wechat_z', 'wechat', 0.002);
SELECT payidem.create_channel('WECHAT_Z', 'WeChat', 0.002);
-- closed is final: a closed merchant gets no new API secret, no channel and
-- no reporting role (PI004), and nothing is written
CREATE ROLE regress_closed_reader;
SELECT * FROM pg_temp.try(format('SELECT payidem.rotate_merchant_secret(%L)', :'frozen_merchant_no'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.bind_channel(%L, 'WECHAT_A')$$, :'frozen_merchant_no'));
SELECT * FROM pg_temp.try(format($$SELECT payidem.map_merchant_role('regress_closed_reader', %L)$$, :'frozen_merchant_no'));
SELECT (SELECT count(*) FROM payidem.merchant_secret WHERE merchant_no = :'frozen_merchant_no') AS secrets,
       (SELECT count(*) FROM payidem.merchant_channel WHERE merchant_no = :'frozen_merchant_no') AS bindings,
       (SELECT count(*) FROM payidem.merchant_role WHERE merchant_no = :'frozen_merchant_no') AS roles;
DROP ROLE regress_closed_reader;
SELECT payidem.create_channel('WECHAT_Z', 'wechat', 1.5);
SELECT payidem.create_channel('WECHAT_Z', 'wechat', 0.002, -1);
SELECT payidem.create_channel('WECHAT_Z', 'wechat', 0.002, 100, '{}');
SELECT payidem.create_channel('WECHAT_Z', 'wechat', 0.002, 100, ARRAY['Retail']);
SELECT payidem.set_channel_status('WECHAT_OFF', 'disabled');
SELECT payidem.set_channel_status('WECHAT_OFF', 'broken');
SELECT payidem.set_channel_status('NOPE_X', 'disabled');

--------------------------------------------------------- channel configuration
SELECT payidem.set_channel_config('WECHAT_A', '{"app_id": "wx01", "api_v3_key": "k-111"}');
SELECT payidem.set_channel_config('WECHAT_B', '{"app_id": "wx02", "api_v3_key": "k-222"}');
SELECT payidem.get_channel_config('WECHAT_A');
SELECT payidem.set_channel_config('WECHAT_A', '{"app_id": "wx01", "api_v3_key": "k-333"}');
SELECT payidem.get_channel_config('WECHAT_A') ->> 'api_v3_key' AS replaced;
SELECT payidem.set_channel_config('WECHAT_A', '["not", "an", "object"]');
SELECT payidem.set_channel_config('WECHAT_A', NULL);
SELECT payidem.set_channel_config('NOPE_X', '{}');
SELECT payidem.get_channel_config('ALIPAY_A');
-- a sealed record is bound to its row: copied onto another channel it does not open
UPDATE payidem.channel_config AS t
   SET nonce = s.nonce, ciphertext = s.ciphertext, auth_tag = s.auth_tag
  FROM payidem.channel_config s
 WHERE t.channel_no = 'WECHAT_B' AND s.channel_no = 'WECHAT_A';
SELECT payidem.get_channel_config('WECHAT_B');
SELECT payidem.set_channel_config('WECHAT_B', '{"app_id": "wx02", "api_v3_key": "k-222"}');

---------------------------------------------------------------------- bindings
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_A');
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_B', 0.005, 100000, 1000000);
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_OFF');
SELECT * FROM pg_temp.try(format('SELECT payidem.bind_channel(%L, %L)', :'merchant_no', 'WECHAT_C'));
SELECT payidem.bind_channel(:'merchant_no', 'NOPE_X');
SELECT payidem.bind_channel('M000000000000000', 'WECHAT_A');
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_A', 2);
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_A', NULL, 0);
SELECT payidem.bind_channel(:'merchant_no', 'WECHAT_A', NULL, 5000, 100);
SELECT channel_no, fee_rate, single_limit, daily_limit, status
  FROM payidem.merchant_channel WHERE merchant_no = :'merchant_no' ORDER BY channel_no;

----------------------------------------------------------------------- routing
-- eligible: WECHAT_A (weight 100) and WECHAT_B (weight 300); never WECHAT_OFF
-- (disabled), WECHAT_C (does not admit retail) or ALIPAY_A (other type)
SELECT setseed(0.25);
CREATE TEMP TABLE routed AS
  SELECT payidem.route_channel(:'merchant_no', 'wechat') AS channel_no FROM generate_series(1, 4000);
SELECT channel_no, count(*) > 0 AS chosen FROM routed GROUP BY 1 ORDER BY 1;
SELECT round(count(*) FILTER (WHERE channel_no = 'WECHAT_B')::numeric
             / count(*) FILTER (WHERE channel_no = 'WECHAT_A'), 1) BETWEEN 2.6 AND 3.4 AS follows_weights
  FROM routed;
-- the same seed gives the same choices
SELECT setseed(0.25);
SELECT count(*) AS same_choices FROM (
  SELECT row_number() OVER () AS i, payidem.route_channel(:'merchant_no', 'wechat') AS c
    FROM generate_series(1, 200)) a
  JOIN (SELECT row_number() OVER () AS i, channel_no FROM (SELECT channel_no FROM routed LIMIT 200) x) b
    USING (i) WHERE a.c = b.channel_no;
SELECT payidem.unbind_channel(:'merchant_no', 'WECHAT_B');
SELECT DISTINCT payidem.route_channel(:'merchant_no', 'wechat') FROM generate_series(1, 50);
SELECT * FROM pg_temp.try(format('SELECT payidem.unbind_channel(%L, %L)', :'merchant_no', 'ALIPAY_A'));
SELECT * FROM pg_temp.try(format('SELECT payidem.route_channel(%L, %L)', :'merchant_no', 'alipay'));
SELECT * FROM pg_temp.try(format('SELECT payidem.route_channel(%L, %L)', :'merchant_no', 'unionpay'));
SELECT payidem.freeze_merchant(:'merchant_no');
SELECT * FROM pg_temp.try(format('SELECT payidem.route_channel(%L, %L)', :'merchant_no', 'wechat'));
SELECT payidem.unfreeze_merchant(:'merchant_no');
SELECT payidem.route_channel('M000000000000000', 'wechat');

------------------------------------------------------------------ master key
SELECT payidem.sign(:'merchant_no', 'x') AS sig_a \gset
SET payidem.master_key_file = '/nonexistent/payidem.key';
SELECT payidem.sign(:'merchant_no', 'x');
SET payidem.master_key_file = '';
SELECT payidem.get_channel_config('WECHAT_A');
SET payidem.master_key_file = :'key_bad';
SELECT * FROM pg_temp.try('SELECT payidem.create_merchant(''Shop'', ''retail'', 0.006)');
SET payidem.master_key_file = :'key_open';
SELECT * FROM pg_temp.try('SELECT payidem.master_key_version()');
RESET payidem.master_key_file;
SET payidem.master_key_file = :'key_a';
-- rotation: a new current key; records sealed under the old key need it as "previous"
SET payidem.master_key_file = :'key_b';
SELECT payidem.sign(:'merchant_no', 'x');
SET payidem.previous_master_key_file = :'key_a';
SELECT payidem.sign(:'merchant_no', 'x') = :'sig_a' AS old_records_open;
SELECT payidem.reencrypt_secrets() > 0 AS reencrypted;
SELECT count(*) AS records_under_old_key
  FROM (SELECT key_version FROM payidem.merchant_secret UNION ALL SELECT key_version FROM payidem.channel_config) k
 WHERE key_version <> payidem.master_key_version();
SELECT payidem.reencrypt_secrets() AS nothing_left;
RESET payidem.previous_master_key_file;
SELECT payidem.sign(:'merchant_no', 'x') = :'sig_a' AS same_signature_new_key,
       payidem.get_channel_config('WECHAT_A') ->> 'app_id' AS config_opens;

------------------------------------------------------------------ canary scan
-- No table of payidem holds a secret in plaintext: search every column of every
-- table (as text) for a channel-config canary and for the merchant API secrets.
SELECT payidem.set_channel_config('ALIPAY_A', '{"private_key": "CANARY-7f3a9c1e"}');
SELECT * FROM payidem.create_merchant('Canary Shop', 'retail', 0.006) \gset canary_
CREATE TEMP TABLE needles (needle text);
INSERT INTO needles VALUES ('CANARY-7f3a9c1e'), (:'canary_api_secret'), (:'secret2'), (:'api_secret'),
       (encode(convert_to('CANARY-7f3a9c1e', 'UTF8'), 'hex'));
DO $$
DECLARE
	t record;
	hits bigint;
	total bigint := 0;
BEGIN
	FOR t IN SELECT c.relname FROM pg_class c
	          WHERE c.relnamespace = 'payidem'::regnamespace AND c.relkind = 'r' ORDER BY 1 LOOP
		EXECUTE format('SELECT count(*) FROM payidem.%I AS r, pg_temp.needles n
		                 WHERE strpos(r::text, n.needle) > 0', t.relname) INTO hits;
		total := total + hits;
		IF hits > 0 THEN
			RAISE WARNING 'table % holds a secret in plaintext', t.relname;
		END IF;
	END LOOP;
	RAISE WARNING 'plaintext secrets found in payidem tables: %', total;
END
$$;
SELECT payidem.get_channel_config('ALIPAY_A') ->> 'private_key' AS canary_still_opens;

RESET payidem.master_key_file;
\! rm -f "$PAYIDEM_KEYDIR"_a.key "$PAYIDEM_KEYDIR"_b.key "$PAYIDEM_KEYDIR"_bad.key "$PAYIDEM_KEYDIR"_open.key
