\echo Use "CREATE EXTENSION payidem_router" to load this file. \quit

/*
 * payidem_router 1.0 -- the payidem API on a router database (DESIGN section 9).
 *
 * Every function of DESIGN sections 7-8 exists here with the same name, arguments,
 * defaults and result, as a PL/Proxy function (or a small SQL/plpgsql function
 * over PL/Proxy functions) on the PL/Proxy cluster "payidem":
 *
 *	 CREATE SERVER payidem FOREIGN DATA WRAPPER plproxy
 *		 OPTIONS (p0 'host=... port=... dbname=...', p1 '...', ...);
 *	 CREATE USER MAPPING FOR PUBLIC SERVER payidem OPTIONS (user '...');
 *
 * Partition i is a payidem database with payidem.shard_id = i (see
 * payidem.shard_prepare() on the shards); the partition count is a power of
 * two.  Routing:
 *
 *	 create_order, find_order        merchant_partition(merchant_no): the partition the router
 *	                                 placed the merchant on when it made it (merchant_placement),
 *	                                 kept when partitions are added; a merchant it did not place
 *	                                 (or NULL) by hashtext over today's partitions
 *	 calls keyed by an order,        the shard digits inside the number (characters 17-18),
 *	   payment or refund number      checked first: a malformed number is 22023 here, a
 *	                                 well-formed one naming no partition PI009
 *	 gen_order_no, order_no_valid,   any partition (RUN ON ANY): a number names the shard that
 *	   order_no_parse, order_no_make   issued it; the others are pure functions of their arguments
 *	 idem_claim, idem_record,        idem_partition(idem_key): hashtext(idem_key) over
 *	   idem_finish                   today's partitions, or where the count before a
 *	                                 growth put the key if it is there (partition_growth)
 *	 idem_purge                      all partitions; the router sums the counts
 *	 transit_order, transit_payment, the shard digits inside the number
 *	   transit_refund
 *	 stats                           all partitions, summed (stats_by_shard: each)
 *	 sign, route_channel             hashtext(merchant_no) (any shard would do: same data)
 *	 verify_signature,               hashtext(api_key)
 *	   verify_notification
 *	 get_channel_config              hashtext(channel_no)
 *	 create_merchant                 made on partition 0, then copied to all partitions
 *	 rotate_merchant_secret          rotated on partition 0, then copied to all partitions
 *	 channels, configs, bindings,    RUN ON ALL (idempotent on the shards, so a call
 *	   merchant status                 can be repeated after a shard was down)
 *	 notify_due, query_due           all partitions, max_rows shared out between them
 *	 notify_result                   event_id % 100 (shards number their events so)
 *	 load_bill                       all partitions; each keeps the lines whose payment_no names it
 *	 reconcile                       all partitions; the router sums the counts
 *	 resolve_diff, resolve_anomaly   id / 10^15 (shards number their differences and anomalies so)
 *	 get_order                       the shard digits inside the number

 *
 * PL/Proxy runs each remote call in autocommit: a call that writes on several
 * partitions is not atomic across them; see docs/scale-out.md.
 */

------------------------------------------------------------------------------
-- Cluster: partitions, routing checks
------------------------------------------------------------------------------

-- Number of partitions of server payidem (its p0, p1, ... options).  The
-- options hold connection strings, which only the server's owner may read:
-- SECURITY DEFINER, returning only the count.
--
-- The routing functions are PL/pgSQL, not SQL: PL/pgSQL keeps its plans for
-- the session, where a SQL function that is not inlined (SECURITY DEFINER,
-- SET) is planned again in every statement that calls it, which on
-- PostgreSQL 15-17 cost a tenth of a millisecond per routed call.
CREATE FUNCTION payidem.cluster_partitions()
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RETURN (SELECT count(*)::integer
			  FROM pg_foreign_server s, unnest(s.srvoptions) AS o(opt)
			 WHERE s.srvname = 'payidem' AND o.opt ~ '^p[0-9]+=');
END
$$;
COMMENT ON FUNCTION payidem.cluster_partitions() IS
	'Number of partitions (p0, p1, ... options) of the PL/Proxy server payidem; 0 if it is not defined.';

-- A partition number as PL/Proxy's RUN ON takes it, after checking that it
-- names a partition (PL/Proxy itself would mask it silently).
CREATE FUNCTION payidem.check_partition(partition integer)
RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n integer := payidem.cluster_partitions();
BEGIN
	IF n = 0 THEN
		RAISE EXCEPTION 'the PL/Proxy cluster payidem is not defined' USING
			ERRCODE = 'object_not_in_prerequisite_state',
			HINT = 'CREATE SERVER payidem FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ''...'', p1 ''...''), see docs/scale-out.md.';
	END IF;
	IF partition IS NULL OR partition < 0 OR partition >= n THEN
		RAISE EXCEPTION 'partition % does not exist', coalesce(partition::text, 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The cluster has %s partitions, 0 to %s.', n, n - 1);
	END IF;
	RETURN partition;
END
$$;
COMMENT ON FUNCTION payidem.check_partition(integer) IS
	'The partition number itself if the cluster has it; 22023 otherwise (55000 if server payidem is missing).';

-- The partition that holds the row of an order, payment or refund number:
-- the shard digits inside it, after checking the number's format, its check
-- digits and that the shard exists.  No lookup table.
CREATE FUNCTION payidem.partition_of(number text, kind text)
RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_prefix text := CASE kind WHEN 'order' THEN 'PO' WHEN 'payment' THEN 'PY' WHEN 'refund' THEN 'RF' END;
	v_shard  integer;
	v_digits text;
	c        text;
BEGIN
	IF v_prefix IS NULL THEN
		RAISE EXCEPTION 'unknown kind of number %', coalesce(quote_literal(kind), 'NULL') USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'The kinds are order, payment and refund.';
	END IF;
	-- A number this cluster cannot place -- malformed, of another kind, with
	-- wrong check digits, of a shard it does not have -- goes to partition 0,
	-- which refuses it in the words of one database (one implementation of
	-- the number's rules: the shard's).
	IF number IS NULL OR number !~ '^[A-Z0-9]{2}[0-9]{24}$' OR left(number, 2) <> v_prefix THEN
		RETURN 0;
	END IF;
	-- ISO 7064 MOD 97-10 over the whole number, letters A=10 ... Z=35: a
	-- number whose shard digits were mistyped must not reach another shard
	v_digits := '';
	FOREACH c IN ARRAY ARRAY[substr(number, 1, 1), substr(number, 2, 1)] LOOP
		v_digits := v_digits || CASE WHEN c ~ '[A-Z]' THEN (ascii(c) - 55)::text ELSE c END;
	END LOOP;
	IF (v_digits || substr(number, 3))::numeric % 97 <> 1 THEN
		RETURN 0;
	END IF;
	v_shard := substr(number, 17, 2)::integer;
	IF v_shard >= payidem.cluster_partitions() THEN
		RETURN 0;
	END IF;
	RETURN v_shard;
END
$$;
COMMENT ON FUNCTION payidem.partition_of(text, text) IS
	'Partition holding an order (kind order), payment or refund number: its shard digits (characters 17-18); 0 for a number the cluster cannot place (malformed, wrong prefix or check digits, a shard outside the cluster), which partition 0 refuses as one database does.';

-- (inlined into the caller: no SET clause, every name qualified)
CREATE FUNCTION payidem.order_partition(order_no text) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem.partition_of(order_no, 'order');
CREATE FUNCTION payidem.payment_partition(payment_no text) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem.partition_of(payment_no, 'payment');
CREATE FUNCTION payidem.refund_partition(refund_no text) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem.partition_of(refund_no, 'refund');

-- Reconciliation differences and anomalies are numbered from shard * 10^15
-- on each shard (payidem.shard_prepare()): the partition of such an id.
CREATE FUNCTION payidem._id_partition(id bigint)
RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	-- an id no partition has (NULL, not positive, beyond the cluster) goes
	-- to partition 0, which refuses it as one database does
	RETURN CASE WHEN id > 0 AND id / 1000000000000000 < payidem.cluster_partitions()
				THEN (id / 1000000000000000)::integer ELSE 0 END;
END
$$;
CREATE FUNCTION payidem.recon_partition(recon_id bigint) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem._id_partition(recon_id);
CREATE FUNCTION payidem.anomaly_partition(anomaly_id bigint) RETURNS integer
LANGUAGE sql STABLE
RETURN payidem._id_partition(anomaly_id);

-- Notification events are numbered sequence * 100 + shard on each shard
-- (payidem._status_event()).
CREATE FUNCTION payidem.event_partition(event_id bigint)
RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	-- (an id no partition has goes to partition 0, which refuses it)
	RETURN CASE WHEN event_id > 0 AND event_id % 100 < payidem.cluster_partitions()
				THEN (event_id % 100)::integer ELSE 0 END;
END
$$;

-- What each partition says about itself.
CREATE FUNCTION payidem._shard_info_on(partition integer,
	OUT shard_id integer, OUT database name, OUT master_key_version integer,
	OUT merchants bigint, OUT channels bigint, OUT orders bigint)
RETURNS record
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.check_partition(partition);
	SELECT i.shard_id, i.database, i.master_key_version, i.merchants, i.channels, i.orders
	  FROM payidem.shard_info() i;
$$;

-- The partition count, checked: server payidem defined, a power of two.
CREATE FUNCTION payidem._cluster_size()
RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n integer := payidem.cluster_partitions();
BEGIN
	IF n = 0 OR n & (n - 1) <> 0 THEN
		RAISE EXCEPTION 'server payidem has % partitions', n USING
			ERRCODE = 'object_not_in_prerequisite_state',
			HINT = 'Define p0 ... p<N-1> on server payidem, N a power of two (docs/scale-out.md).';
	END IF;
	RETURN n;
END
$$;

CREATE FUNCTION payidem.cluster_check()
RETURNS TABLE (partition integer, shard_id integer, database name, master_key_version integer,
			   merchants bigint, channels bigint, orders bigint, ok boolean, problem text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n integer := payidem._cluster_size();
	r record;
	v_merchants bigint;
	v_channels bigint;
BEGIN
	FOR i IN 0 .. n - 1 LOOP
		partition := i;
		shard_id := NULL; database := NULL; master_key_version := NULL;
		merchants := NULL; channels := NULL; orders := NULL;
		BEGIN
			SELECT * INTO r FROM payidem._shard_info_on(i);
			shard_id := r.shard_id; database := r.database; master_key_version := r.master_key_version;
			merchants := r.merchants; channels := r.channels; orders := r.orders;
			IF i = 0 THEN
				v_merchants := r.merchants;
				v_channels := r.channels;
			END IF;
			IF r.shard_id <> i THEN
				ok := false;
				problem := format('payidem.shard_id is %s, not the partition number %s', r.shard_id, i);
			ELSIF r.merchants IS DISTINCT FROM v_merchants OR r.channels IS DISTINCT FROM v_channels THEN
				ok := false;
				problem := format('reference data differs from partition 0 (%s merchants, %s channels)',
								  v_merchants, v_channels);
			ELSE
				ok := true;
				problem := NULL;
			END IF;
		EXCEPTION WHEN OTHERS THEN
			ok := false;
			problem := SQLERRM;
		END;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.cluster_check() IS
	'One row per partition: its payidem.shard_id (must equal the partition number), database, master key version, counts of merchants, channels (must equal partition 0''s) and orders; ok and the problem otherwise, including a shard that cannot be reached.';

------------------------------------------------------------------------------
-- Growing the cluster: reference data in line on every partition
------------------------------------------------------------------------------

CREATE FUNCTION payidem._shard_prepare_on(partition integer)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.check_partition(partition);
	SELECT payidem.shard_prepare(partition);
$$;

CREATE FUNCTION payidem._export_reference_on(partition integer)
RETURNS jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.check_partition(partition);
	SELECT payidem.export_reference();
$$;

CREATE FUNCTION payidem._import_reference_on(partition integer, reference jsonb)
RETURNS TABLE (kind text, added bigint, changed bigint, removed bigint, left_alone bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.check_partition(partition);
	SELECT i.kind, i.added, i.changed, i.removed, i.left_alone FROM payidem.import_reference(reference) i;
$$;

-- Every partition made the shard its place says, and given partition 0's
-- reference data: merchants, secrets (sealed there with its own master key),
-- channels, channel configurations, bindings.  Safe to re-run; it is also
-- how a half-failed create_merchant(), rotate_merchant_secret() or channel
-- call is repaired once every shard is up.
CREATE FUNCTION payidem.sync_shards()
RETURNS TABLE (partition integer, kind text, added bigint, changed bigint, removed bigint, left_alone bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n     integer;
	r     record;
	v_ref jsonb;
BEGIN
	-- no reference data is written meanwhile (see _reference_write_lock)
	PERFORM payidem._reference_write_lock(true);
	n := payidem._cluster_size();
	-- a partition is the shard its number says; a new, empty one becomes it
	FOR i IN 0 .. n - 1 LOOP
		SELECT * INTO r FROM payidem._shard_info_on(i);
		CONTINUE WHEN r.shard_id = i;
		IF r.orders > 0 THEN
			RAISE EXCEPTION 'partition % is shard %', i, r.shard_id USING
				ERRCODE = 'object_not_in_prerequisite_state',
				DETAIL = format('Database "%s" at partition %s has payidem.shard_id = %s and holds %s orders, whose numbers name shard %s.',
								r.database, i, r.shard_id, r.orders, r.shard_id),
				HINT = 'Correct the order of the connection strings in server payidem; nothing was copied.';
		END IF;
		PERFORM payidem._shard_prepare_on(i);
	END LOOP;
	v_ref := payidem._export_reference_on(0);
	PERFORM payidem._place_merchants(v_ref, n);
	FOR i IN 1 .. n - 1 LOOP
		RETURN QUERY SELECT i, x.kind, x.added, x.changed, x.removed, x.left_alone
					   FROM payidem._import_reference_on(i, v_ref) x;
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.sync_shards() IS
	'Router: make every partition the shard its number says (shard_prepare() on a new, empty one) and give it partition 0''s reference data (merchants, secrets, channels, configurations, bindings); one row per partition and kind with what changed. Safe to re-run; repairs a half-failed write of reference data.';

-- The connection strings of these that server payidem does not have yet,
-- each once, in the order given.
CREATE FUNCTION payidem._new_connections(connections text[])
RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT array_agg(d.c ORDER BY d.o)
		  FROM (SELECT DISTINCT ON (u.c) u.c, u.o FROM unnest(connections) WITH ORDINALITY AS u(c, o)
				 WHERE u.c IS NOT NULL ORDER BY u.c, u.o) d
		 WHERE NOT EXISTS (SELECT 1 FROM pg_foreign_server s, unnest(s.srvoptions) AS x(opt)
							WHERE s.srvname = 'payidem' AND x.opt ~ '^p[0-9]+='
							  AND substr(x.opt, strpos(x.opt, '=') + 1) = d.c));

-- Add partitions to server payidem and bring them in line, in one
-- transaction of the router: other sessions route to the new partitions
-- only once their reference data is there.  Connection strings already in
-- the server are skipped, so a repeat only syncs.
CREATE FUNCTION payidem.add_shards(VARIADIC connections text[])
RETURNS TABLE (partition integer, kind text, added bigint, changed bigint, removed bigint, left_alone bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n       integer;
	v_new   text[];
	v_opts  text;
BEGIN
	-- idempotency calls wait for a growth only (the growth lock first, then
	-- the reference-data one; a repeat that adds nothing only syncs); the new
	-- strings are decided again once the locks are held
	IF cardinality(payidem._new_connections(connections)) > 0 THEN
		PERFORM payidem._growth_lock();
	END IF;
	PERFORM payidem._reference_write_lock(true);
	n := payidem.cluster_partitions();
	IF n = 0 THEN
		PERFORM payidem.check_partition(0);		-- its error: server payidem is missing
	END IF;
	IF connections IS NULL OR cardinality(connections) = 0 OR array_position(connections, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'no connection strings' USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Name each new shard: payidem.add_shards(''host=... dbname=...'', ''host=... dbname=...'').';
	END IF;
	v_new := payidem._new_connections(connections);
	IF coalesce(cardinality(v_new), 0) > 0 THEN
		IF (n + cardinality(v_new)) & (n + cardinality(v_new) - 1) <> 0 THEN
			RAISE EXCEPTION 'a cluster of % partitions is not possible', n + cardinality(v_new) USING
				ERRCODE = 'invalid_parameter_value',
				DETAIL = format('Server payidem has %s partitions and %s new connection strings were given; PL/Proxy needs a power of two.',
								n, cardinality(v_new)),
				HINT = format('Add %s shards.', n);
		END IF;
		-- merchants not yet placed keep the partition today's hash gives them
		PERFORM payidem._place_merchants(payidem._export_reference_on(0), n);
		SELECT string_agg(format('ADD p%s %L', n + o - 1, c), ', ' ORDER BY o) INTO v_opts
		  FROM unnest(v_new) WITH ORDINALITY AS u(c, o);
		EXECUTE 'ALTER SERVER payidem OPTIONS (' || v_opts || ')';
		PERFORM payidem._record_growth(n, n + cardinality(v_new));
	END IF;
	RETURN QUERY SELECT * FROM payidem.sync_shards();
END
$$;
COMMENT ON FUNCTION payidem.add_shards(text[]) IS
	'Router: add the shards at these connection strings as the next partitions of server payidem (the count stays a power of two; strings already there are skipped) and sync_shards(), in one transaction. Placed merchants stay where they are; new merchants spread over all partitions.';

------------------------------------------------------------------------------
-- Merchants (made on partition 0, copied to all) and channels (all partitions)
------------------------------------------------------------------------------

CREATE FUNCTION payidem._create_merchant_first(name text, merchant_type text, fee_rate numeric, settle_cycle text)
RETURNS TABLE (merchant_no text, api_key text, api_secret text)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON 0;
	SELECT m.merchant_no, m.api_key, m.api_secret
	  FROM payidem.create_merchant(name, merchant_type, fee_rate, settle_cycle) m;
$$;

CREATE FUNCTION payidem._import_merchant_all(merchant_no text, name text, merchant_type text, fee_rate numeric,
	settle_cycle text, api_key text, api_secret text)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.import_merchant(merchant_no, name, merchant_type, fee_rate, settle_cycle, api_key, api_secret);
$$;

-- Re-raise a failure of the copy step with what the operator needs to know.
CREATE FUNCTION payidem._copy_failed(what text, merchant_no text, sqlstate text, message text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	-- what the shard said, as it said it (08006 for one that was not reached)
	e record := payidem._shard_error_parts(sqlstate, message, NULL, NULL);
BEGIN
	RAISE EXCEPTION '%', CASE what
			WHEN 'merchant' THEN format('merchant %s was created on partition 0 but not copied to every shard', merchant_no)
			ELSE format('the new secret of merchant %s was made on partition 0 but not copied to every shard', merchant_no) END USING
		ERRCODE = e.state,
		DETAIL = e.message || coalesce(': ' || e.detail, ''),
		HINT = CASE what
			WHEN 'merchant' THEN 'The secret is not handed out: once all shards are up, run payidem.sync_shards(), then hand out a secret with payidem.rotate_merchant_secret() (or close the merchant).'
			ELSE 'The new secret is not handed out: once all shards are up, run payidem.sync_shards(), then rotate again.' END;
END
$$;

-- Where each merchant's orders live: decided once, when the router makes the
-- merchant, and kept.  Adding partitions later moves no existing merchant
-- (its repeated create_order still finds its order on the shard that has
-- it); new merchants spread over all partitions of the day.
CREATE TABLE payidem.merchant_placement (
	merchant_no	text		NOT NULL,
	partition	integer		NOT NULL,
	placed_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT merchant_placement_pkey PRIMARY KEY (merchant_no),
	CONSTRAINT merchant_placement_partition_nonnegative CHECK (partition >= 0)
);
COMMENT ON TABLE payidem.merchant_placement IS
	'Router: the partition each merchant''s orders live on, written by create_merchant() and never changed by adding partitions.';
SELECT pg_catalog.pg_extension_config_dump('payidem.merchant_placement', '');

-- The partition of a merchant's orders: its placement; for a merchant the
-- router did not place (made on the shards directly, or unknown, which the
-- shard refuses), the hash of its number over today's partitions.
CREATE FUNCTION payidem.merchant_partition(merchant_no text)
RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RETURN coalesce((SELECT p.partition FROM payidem.merchant_placement p
					  WHERE p.merchant_no = merchant_partition.merchant_no),
					hashtext(coalesce(merchant_no, '')) & (payidem.cluster_partitions() - 1));
END
$$;
COMMENT ON FUNCTION payidem.merchant_partition(text) IS
	'Router: the partition a merchant''s orders live on (payidem.merchant_placement).';

-- Writers of reference data and sync_shards()/add_shards() exclude each
-- other: a merchant, channel or binding written while a shard is added
-- reaches the new shard too.  Taking the lock also makes this session see a
-- server payidem that add_shards() changed meanwhile.
CREATE FUNCTION payidem._reference_write_lock(exclusive boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF exclusive THEN
		LOCK TABLE payidem.merchant_placement IN EXCLUSIVE MODE;
	ELSE
		LOCK TABLE payidem.merchant_placement IN ROW EXCLUSIVE MODE;
	END IF;
END
$$;

-- Merchants of partition 0 the router has not placed (a create_merchant
-- whose copy step failed, a merchant made on the shards directly): placed
-- now, by the hash over n partitions, so that adding partitions does not
-- move them either.
CREATE FUNCTION payidem._place_merchants(reference jsonb, n integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	INSERT INTO payidem.merchant_placement (merchant_no, partition)
	SELECT e ->> 'merchant_no', hashtext(e ->> 'merchant_no') & (n - 1)
	  FROM jsonb_array_elements(reference -> 'merchants') e
	ON CONFLICT DO NOTHING;
END
$$;

CREATE FUNCTION payidem.create_merchant(name text, merchant_type text, fee_rate numeric,
	settle_cycle text DEFAULT 'T1')
RETURNS TABLE (merchant_no text, api_key text, api_secret text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	r         record;
	v_state   text;
	v_message text;
BEGIN
	PERFORM payidem._reference_write_lock();
	SELECT * INTO r FROM payidem._create_merchant_first(name, merchant_type, fee_rate, settle_cycle);
	-- its orders' home, spread over the partitions it is made on, for good
	INSERT INTO payidem.merchant_placement (merchant_no, partition)
	VALUES (r.merchant_no, hashtext(r.merchant_no) & (payidem.cluster_partitions() - 1));
	BEGIN
		PERFORM FROM payidem._import_merchant_all(r.merchant_no, name, merchant_type, fee_rate, settle_cycle,
												  r.api_key, r.api_secret);
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
		PERFORM payidem._copy_failed('merchant', r.merchant_no, v_state, v_message);
	END;
	merchant_no := r.merchant_no;
	api_key := r.api_key;
	api_secret := r.api_secret;
	RETURN NEXT;
END
$$;
COMMENT ON FUNCTION payidem.create_merchant(text, text, numeric, text) IS
	'Router: create the merchant on partition 0 (random merchant_no, api_key, secret), then copy it to every partition (each seals the secret with its own master key). The secret is returned once.';

CREATE FUNCTION payidem._rotate_merchant_secret_first(merchant_no text, grace interval)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON 0;
	SELECT payidem.rotate_merchant_secret(merchant_no, grace);
$$;

CREATE FUNCTION payidem._import_merchant_secret_all(merchant_no text, api_secret text, grace interval)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.import_merchant_secret(merchant_no, api_secret, grace);
$$;

CREATE FUNCTION payidem.rotate_merchant_secret(merchant_no text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_secret  text;
	v_state   text;
	v_message text;
BEGIN
	PERFORM payidem._reference_write_lock();
	v_secret := payidem._rotate_merchant_secret_first(merchant_no, grace);
	BEGIN
		PERFORM FROM payidem._import_merchant_secret_all(merchant_no, v_secret, grace);
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
		PERFORM payidem._copy_failed('secret', merchant_no, v_state, v_message);
	END;
	RETURN v_secret;
END
$$;
COMMENT ON FUNCTION payidem.rotate_merchant_secret(text, interval) IS
	'Router: rotate on partition 0, then make the new secret current on every partition with the same grace window. Returned once.';

CREATE FUNCTION payidem.sign(merchant_no text, payload text)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON hashtext(coalesce(merchant_no, ''));
$$;

CREATE FUNCTION payidem.verify_signature(api_key text, payload text, signature text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON hashtext(coalesce(api_key, ''));
$$;

CREATE FUNCTION payidem._set_merchant_status_all(merchant_no text, status text)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT 'done'::text FROM payidem.set_merchant_status(merchant_no, status) AS x;
$$;
CREATE FUNCTION payidem.set_merchant_status(merchant_no text, status text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._set_merchant_status_all(merchant_no, status);
END
$$;
COMMENT ON FUNCTION payidem.set_merchant_status IS
	'Router: set a merchant''s status on every partition.';
CREATE FUNCTION payidem.freeze_merchant(merchant_no text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'frozen'); END;
CREATE FUNCTION payidem.unfreeze_merchant(merchant_no text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'active'); END;
CREATE FUNCTION payidem.close_merchant(merchant_no text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC SELECT payidem.set_merchant_status(merchant_no, 'closed'); END;

CREATE FUNCTION payidem._import_channel_all(channel_no text, channel_type text, fee_rate numeric,
	weight integer, allowed_merchant_types text[])
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.import_channel(channel_no, channel_type, fee_rate, weight, allowed_merchant_types);
$$;

CREATE FUNCTION payidem.create_channel(channel_no text, channel_type text, fee_rate numeric,
	weight integer DEFAULT 100, allowed_merchant_types text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	-- every partition creates it, or finds the identical channel (a repeat
	-- after a shard was down); a different channel of that code is an error
	IF NOT EXISTS (SELECT 1 FROM payidem._import_channel_all(channel_no, channel_type, fee_rate, weight,
															allowed_merchant_types) r(outcome)
					WHERE r.outcome = 'created') THEN
		RAISE EXCEPTION 'channel % already exists', channel_no USING
			ERRCODE = 'duplicate_object',
			HINT = 'Choose another channel code, or change the existing channel.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem.create_channel(text, text, numeric, integer, text[]) IS
	'Router: create the channel on every partition. Repeating the call after a shard was down creates it there (duplicate_object only if every partition had it already, or one has a different channel of that code).';

CREATE FUNCTION payidem._set_channel_status_all(channel_no text, status text)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT 'done'::text FROM payidem.set_channel_status(channel_no, status) AS x;
$$;
CREATE FUNCTION payidem.set_channel_status(channel_no text, status text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._set_channel_status_all(channel_no, status);
END
$$;
COMMENT ON FUNCTION payidem.set_channel_status IS
	'Router: set a channel''s status on every partition.';

CREATE FUNCTION payidem._set_channel_config_all(channel_no text, config jsonb)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT 'done'::text FROM payidem.set_channel_config(channel_no, config) AS x;
$$;
CREATE FUNCTION payidem.set_channel_config(channel_no text, config jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._set_channel_config_all(channel_no, config);
END
$$;
COMMENT ON FUNCTION payidem.set_channel_config IS
	'Router: store the channel configuration on every partition (each encrypts it with its own master key).';

CREATE FUNCTION payidem.get_channel_config(channel_no text)
RETURNS jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON hashtext(coalesce(channel_no, ''));
$$;

CREATE FUNCTION payidem._bind_channel_all(merchant_no text, channel_no text, fee_rate numeric, single_limit bigint, daily_limit bigint)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT 'done'::text FROM payidem.bind_channel(merchant_no, channel_no, fee_rate, single_limit, daily_limit) AS x;
$$;
CREATE FUNCTION payidem.bind_channel(merchant_no text, channel_no text, fee_rate numeric DEFAULT NULL,
	single_limit bigint DEFAULT NULL, daily_limit bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._bind_channel_all(merchant_no, channel_no, fee_rate, single_limit, daily_limit);
END
$$;
COMMENT ON FUNCTION payidem.bind_channel IS
	'Router: bind (or re-bind) the merchant to the channel on every partition.';

CREATE FUNCTION payidem._unbind_channel_all(merchant_no text, channel_no text)
RETURNS SETOF text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT 'done'::text FROM payidem.unbind_channel(merchant_no, channel_no) AS x;
$$;
CREATE FUNCTION payidem.unbind_channel(merchant_no text, channel_no text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock();
	PERFORM FROM payidem._unbind_channel_all(merchant_no, channel_no);
END
$$;
COMMENT ON FUNCTION payidem.unbind_channel IS
	'Router: disable the binding on every partition.';

CREATE FUNCTION payidem.route_channel(merchant_no text, channel_type text)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON hashtext(coalesce(merchant_no, ''));
$$;

------------------------------------------------------------------------------
-- Payment flow: routed by merchant (new orders) or by the number's shard digits
------------------------------------------------------------------------------

CREATE FUNCTION payidem.create_order(merchant_no text, out_trade_no text, amount bigint, subject text,
	notify_url text DEFAULT NULL, return_url text DEFAULT NULL,
	expire_in interval DEFAULT '2 hours', body text DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;

CREATE FUNCTION payidem.begin_payment(order_no text, channel_no text)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.order_partition(order_no);
$$;

CREATE FUNCTION payidem.apply_payment_result(payment_no text, source text, status text,
	transaction_id text DEFAULT NULL, amount bigint DEFAULT NULL,
	paid_at timestamptz DEFAULT NULL, raw jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payment_partition(payment_no);
$$;

CREATE FUNCTION payidem.close_payment(payment_no text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payment_partition(payment_no);
$$;

CREATE FUNCTION payidem.close_order(order_no text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.order_partition(order_no);
$$;

CREATE FUNCTION payidem.refund(payment_no text, amount bigint, out_refund_no text, reason text DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payment_partition(payment_no);
$$;

CREATE FUNCTION payidem.apply_refund_result(refund_no text, status text, channel_refund_id text DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.refund_partition(refund_no);
$$;

-- Each partition gets its own share of max_rows (SPLIT sends element i of
-- both arrays to partition partitions[i]).
CREATE FUNCTION payidem._notify_due_split(partitions integer[], max_rows integer[])
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	SPLIT partitions, max_rows;
	RUN ON partitions;
	SELECT d.event_id, d.order_no, d.merchant_no, d.notify_url, d.event, d.payload, d.signature, d.attempt
	  FROM unnest(max_rows) AS s(n), payidem.notify_due(s.n) d;
$$;

-- A queue's max_rows shared out between the partitions: max_rows / n each,
-- the remainder one by one from a random partition on, so that small
-- batches do not always come from the same shards.
CREATE FUNCTION payidem._split_rows(max_rows integer, OUT partitions integer[], OUT shares integer[])
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n        integer := payidem.cluster_partitions();
	v_first  integer;
BEGIN
	PERFORM payidem.check_partition(0);
	IF max_rows IS NULL OR max_rows <= 0 THEN
		-- partition 0 refuses it, in the words of one database
		partitions := ARRAY[0];
		shares := ARRAY[max_rows];
		RETURN;
	END IF;
	v_first := floor(random() * n)::integer;
	SELECT array_agg(p.i ORDER BY p.i), array_agg(p.share ORDER BY p.i)
	  INTO partitions, shares
	  FROM (SELECT i, max_rows / n + CASE WHEN (i - v_first + n) % n < max_rows % n THEN 1 ELSE 0 END AS share
			  FROM generate_series(0, n - 1) i) p
	 WHERE p.share > 0;
END
$$;

CREATE FUNCTION payidem.notify_due(max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT d.* FROM payidem._split_rows(max_rows) s, payidem._notify_due_split(s.partitions, s.shares) d;
END;
COMMENT ON FUNCTION payidem.notify_due(integer) IS
	'Router: due merchant notification events from all partitions, at most max_rows in all (shared out between the partitions). A worker per shard can use notify_due_on(partition, max_rows) instead.';

CREATE FUNCTION payidem.notify_due_on(partition integer, max_rows integer DEFAULT 100)
RETURNS TABLE (event_id bigint, order_no text, merchant_no text, notify_url text,
			   event text, payload text, signature text, attempt integer)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.check_partition(partition);
	SELECT d.event_id, d.order_no, d.merchant_no, d.notify_url, d.event, d.payload, d.signature, d.attempt
	  FROM payidem.notify_due(max_rows) d;
$$;
COMMENT ON FUNCTION payidem.notify_due_on(integer, integer) IS
	'Router: due merchant notifications of one partition (a notification worker per shard keeps working while another shard is down).';

CREATE FUNCTION payidem._query_due_split(partitions integer[], max_rows integer[])
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	SPLIT partitions, max_rows;
	RUN ON partitions;
	SELECT d.payment_no, d.order_no, d.channel_no, d.expire_at
	  FROM unnest(max_rows) AS s(n), payidem.query_due(s.n) d;
$$;

CREATE FUNCTION payidem.query_due(max_rows integer DEFAULT 100)
RETURNS TABLE (payment_no text, order_no text, channel_no text, expire_at timestamptz)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT d.* FROM payidem._split_rows(max_rows) s, payidem._query_due_split(s.partitions, s.shares) d;
END;
COMMENT ON FUNCTION payidem.query_due(integer) IS
	'Router: expired pending payment attempts from all partitions, at most max_rows in all (shared out between the partitions).';

CREATE FUNCTION payidem.verify_notification(api_key text, payload text, signature text,
											tolerance interval DEFAULT '5 minutes')
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON hashtext(coalesce(api_key, ''));
$$;

CREATE FUNCTION payidem.notify_result(event_id bigint, ok boolean, response text DEFAULT NULL,
									 attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.event_partition(event_id);
$$;

------------------------------------------------------------------------------
-- Order numbers, idempotency keys, state machines, counters
------------------------------------------------------------------------------

-- A new number from any shard: it names the shard that issued it, as every
-- number does, and never repeats there.
CREATE FUNCTION payidem.gen_order_no(prefix text DEFAULT 'PO')
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ANY;
$$;

-- A new number from the shard of a merchant's orders, for an application
-- that numbers its own records of that merchant beside its orders.
CREATE FUNCTION payidem.gen_order_no_for(merchant_no text, prefix text DEFAULT 'PO')
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
	SELECT payidem.gen_order_no(prefix);
$$;
COMMENT ON FUNCTION payidem.gen_order_no_for(text, text) IS
	'Router: gen_order_no(prefix) on the partition of the merchant''s orders (merchant_partition()); the number names that shard.';

CREATE FUNCTION payidem.order_no_valid(order_no text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ANY;
$$;

CREATE FUNCTION payidem.order_no_parse(order_no text)
RETURNS TABLE (prefix text, issued_at timestamptz, shard integer, seq integer)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ANY;
$$;

CREATE FUNCTION payidem.order_no_make(prefix text, issued_at timestamptz, shard integer, seq integer)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ANY;
$$;

-- An idempotency key lives on the shard its hash names over the partitions
-- of the day it was made (a NULL key reaches a shard as '', which refuses it
-- as one database does).  Adding partitions moves no key: until every key
-- is where today's count puts it (the growth settled), a key whose home a
-- growth changed is first looked for where the count before it put it.
CREATE TABLE payidem.partition_growth (
	grown_at			timestamptz	NOT NULL,
	partitions_before	integer		NOT NULL,
	partitions_after	integer		NOT NULL,
	settled_at			timestamptz,
	CONSTRAINT partition_growth_pkey PRIMARY KEY (grown_at),
	CONSTRAINT partition_growth_grows CHECK (partitions_before >= 1 AND partitions_after > partitions_before)
);
COMMENT ON TABLE payidem.partition_growth IS
	'Router: each add_shards() that added partitions; until settled_at (set by idem_purge() once every idempotency key is where today''s partition count puts it), keys are also looked for where partitions_before put them.';
COMMENT ON COLUMN payidem.partition_growth.settled_at IS
	'When idem_purge() found no idempotency key on any shard that today''s partition count puts elsewhere.';
SELECT pg_catalog.pg_extension_config_dump('payidem.partition_growth', '');

-- The lock an idempotency call holds to the end of its transaction, which
-- add_shards() waits for (and which waits for add_shards()): a key's
-- partition is never decided with a partition count that is about to change.
-- Its own statement, before the reads: a statement that waited for the lock
-- would read with the snapshot it took before waiting, from before the growth.
CREATE FUNCTION payidem._growth_share_lock()
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.partition_growth IN ACCESS SHARE MODE;
END
$$;

-- The partition counts before the growths that still matter (PL/pgSQL: a
-- SQL function with SET is planned again at every call on 15-17, and this
-- one is on every idempotency call's path).
CREATE FUNCTION payidem._partitions_before()
RETURNS integer[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	RETURN ARRAY(SELECT DISTINCT g.partitions_before FROM payidem.partition_growth g WHERE g.settled_at IS NULL);
END
$$;

-- add_shards() takes this lock first and holds it to its end, so that
-- idempotency calls (which read the table) wait for it, and records the
-- growth when it commits.
CREATE FUNCTION payidem._growth_lock()
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	LOCK TABLE payidem.partition_growth IN ACCESS EXCLUSIVE MODE;
END
$$;

CREATE FUNCTION payidem._record_growth(partitions_before integer, partitions_after integer)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	INSERT INTO payidem.partition_growth (grown_at, partitions_before, partitions_after)
	VALUES (pg_catalog.clock_timestamp(), partitions_before, partitions_after);
END;

CREATE FUNCTION payidem._idem_key_held_on(partition integer, idem_key text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON partition;
	SELECT payidem._idem_key_held(idem_key);
$$;

CREATE FUNCTION payidem.idem_partition(idem_key text)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	h constant integer := hashtext(coalesce(idem_key, ''));
	v_before integer[];
	p integer;
	q integer;
BEGIN
	PERFORM payidem._growth_share_lock();
	-- (each statement from here reads with a snapshot taken after the lock)
	v_before := payidem._partitions_before();
	p := h & (payidem.cluster_partitions() - 1);
	IF cardinality(v_before) > 0 THEN
		FOREACH q IN ARRAY ARRAY(SELECT DISTINCT h & (b - 1) FROM unnest(v_before) b) LOOP
			IF q <> p AND payidem._idem_key_held_on(q, idem_key) THEN
				RETURN q;
			END IF;
		END LOOP;
	END IF;
	RETURN p;
END
$$;
COMMENT ON FUNCTION payidem.idem_partition(text) IS
	'Router: the partition an idempotency key lives on: hashtext(idem_key) over today''s partitions, or over the partitions before a growth not yet settled if the key is there (payidem.partition_growth).';

-- The API functions (idem_claim, idem_record, idem_finish) call these with
-- the partition idem_partition() decided (see the wrappers below).
CREATE FUNCTION payidem.idem_claim(partition integer, idem_key text, biz_type text, order_no text,
                                   channel text, amount bigint,
                                   fingerprint text DEFAULT NULL,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON partition;
	SELECT * FROM payidem.idem_claim(idem_key, biz_type, order_no, channel, amount, fingerprint, lease);
$$;

CREATE FUNCTION payidem.idem_record(partition integer, idem_key text, biz_type text, order_no text,
                                    channel text, amount bigint, result jsonb,
                                    fingerprint text DEFAULT NULL)
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON partition;
	SELECT * FROM payidem.idem_record(idem_key, biz_type, order_no, channel, amount, result, fingerprint);
$$;

CREATE FUNCTION payidem.idem_finish(partition integer, idem_key text, status text, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON partition;
	SELECT payidem.idem_finish(idem_key, status, result);
$$;

CREATE FUNCTION payidem._idem_purge_all(older_than interval)
RETURNS SETOF bigint
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.idem_purge(older_than);
$$;

CREATE FUNCTION payidem._idem_keys_misplaced_all(partitions integer)
RETURNS SETOF boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem._idem_keys_misplaced(partitions);
$$;

-- The growths are settled once no shard holds a key that is not where
-- today's partition count puts it: from then on keys go by today's hash
-- alone.  By the hash, not by when a key was made, so neither a clock nor a
-- key made again on its old partition (found there, purged, claimed anew)
-- settles them early.  The look that settles is made again under the
-- growth lock, exclusively: no idempotency call is between its look-aside
-- and its write meanwhile (they wait, once per growth, for one look).  Keys
-- still processing are never purged, so they keep the growths open.
CREATE FUNCTION payidem._settle_growth()
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM payidem.partition_growth WHERE settled_at IS NULL)
	   OR EXISTS (SELECT 1 FROM payidem._idem_keys_misplaced_all(payidem.cluster_partitions()) AS misplaced
				   WHERE misplaced) THEN
		RETURN;
	END IF;
	PERFORM payidem._growth_lock();
	IF NOT EXISTS (SELECT 1 FROM payidem._idem_keys_misplaced_all(payidem.cluster_partitions()) AS misplaced
				    WHERE misplaced) THEN
		UPDATE payidem.partition_growth SET settled_at = now() WHERE settled_at IS NULL;
	END IF;
END
$$;

CREATE FUNCTION payidem.idem_purge(older_than interval DEFAULT '24 hours')
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_deleted bigint;
BEGIN
	SELECT coalesce(sum(n), 0)::bigint INTO v_deleted FROM payidem._idem_purge_all(older_than) AS n;
	PERFORM payidem._settle_growth();
	RETURN v_deleted;
END
$$;
COMMENT ON FUNCTION payidem.idem_purge(interval) IS
	'Router: idem_purge on every partition; the number of keys deleted in all. Also settles the growths (payidem.partition_growth) once every key is where today''s partition count puts it.';

-- A transition is routed by the number, as every call keyed by one.
CREATE FUNCTION payidem.transit_order(order_no text, to_status text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.order_partition(order_no);
$$;

CREATE FUNCTION payidem.transit_payment(payment_no text, to_status text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.payment_partition(payment_no);
$$;

CREATE FUNCTION payidem.transit_refund(refund_no text, to_status text)
RETURNS boolean
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.refund_partition(refund_no);
$$;

-- Every shard's counters, and their sums.
CREATE FUNCTION payidem.stats_by_shard()
RETURNS TABLE (shard integer, name text, value bigint, server_value bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.shard_id() AS shard, s.name, s.value, s.server_value FROM payidem.stats() s;
$$;
COMMENT ON FUNCTION payidem.stats_by_shard() IS
	'Router: stats() of every partition, with its shard number (server_value: the server that shard runs on).';

CREATE FUNCTION payidem.stats()
RETURNS TABLE (name text, value bigint, server_value bigint)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	WITH s AS (SELECT b.*, row_number() OVER () AS rn FROM payidem.stats_by_shard() b)
	SELECT s.name, sum(s.value)::bigint, NULL::bigint
	  FROM s GROUP BY s.name ORDER BY min(s.rn);
END;
COMMENT ON FUNCTION payidem.stats() IS
	'Router: each counter summed over the partitions'' databases (value); server_value is NULL here, as shards may share a server: stats_by_shard() shows each shard''s.';

-- The read API and anomalies.  The router has no row-level security: what
-- the shards show the PL/Proxy connection's role (see docs/scale-out.md).
CREATE FUNCTION payidem.get_order(order_no text)
RETURNS jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.order_partition(order_no);
$$;

-- (a merchant's orders live where create_order() puts them)
CREATE FUNCTION payidem.find_order(merchant_no text, out_trade_no text)
RETURNS jsonb
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.merchant_partition(merchant_no);
$$;

CREATE FUNCTION payidem.resolve_anomaly(anomaly_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.anomaly_partition(anomaly_id);
$$;

------------------------------------------------------------------------------
-- Reconciliation: bills split by the payment numbers in them, counts summed
------------------------------------------------------------------------------

-- Where a channel's transaction id lives: the partition of the payment a
-- success with that id was applied to through the router.  A bill line that
-- does not carry our payment number is sent there (one look-up per bill
-- here, none on the shards); without a placement it goes to partition 0.
CREATE TABLE payidem.transaction_placement (
	transaction_id	text		NOT NULL,
	partition		integer		NOT NULL,
	placed_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT transaction_placement_pkey PRIMARY KEY (transaction_id),
	CONSTRAINT transaction_placement_partition_nonnegative CHECK (partition >= 0)
);
COMMENT ON TABLE payidem.transaction_placement IS
	'Router: the partition of the payment each channel transaction id was reported for (apply_payment_result with status succeeded), so that bill lines without our payment number reach that shard.';
SELECT pg_catalog.pg_extension_config_dump('payidem.transaction_placement', '');

-- apply_payment_result's outcome, after placing the transaction id of a
-- success on the payment's partition (a first placement is kept: a repeat,
-- or the same id reported for another payment, changes nothing).  Called
-- once the shard has answered, so no lock is held across the call.  A
-- placement is a routing hint for bills, not money: the router's commit of
-- a new one does not wait for its WAL flush (synchronous_commit off for
-- that transaction).  A router that crashes may lose the last few; their
-- bill lines then go to partition 0 and show as differences there.
CREATE FUNCTION payidem._place_transaction(outcome text, payment_no text, status text, transaction_id text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	IF status = 'succeeded' AND transaction_id IS NOT NULL AND outcome IN ('applied', 'duplicate', 'anomaly') THEN
		-- (a repeated report finds its placement: one index probe)
		PERFORM FROM payidem.transaction_placement t WHERE t.transaction_id = _place_transaction.transaction_id;
		IF NOT FOUND THEN
			INSERT INTO payidem.transaction_placement (transaction_id, partition)
			VALUES (transaction_id, payidem.payment_partition(payment_no))
			ON CONFLICT DO NOTHING;
			IF FOUND THEN
				PERFORM set_config('synchronous_commit', 'off', true);
			END IF;
		END IF;
	END IF;
	RETURN outcome;
END
$$;

CREATE FUNCTION payidem.purge_transaction_placement(older_than interval DEFAULT '90 days')
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	n bigint;
BEGIN
	IF older_than IS NULL OR older_than < interval '1 day' THEN
		RAISE EXCEPTION 'invalid retention' USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = format('The retention was %s; it must be at least 1 day.', coalesce(older_than::text, 'NULL')),
			HINT = 'Keep placements as long as a channel may still send a bill for the day (e.g. 90 days).';
	END IF;
	DELETE FROM payidem.transaction_placement t WHERE t.placed_at < now() - older_than;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n;
END
$$;
COMMENT ON FUNCTION payidem.purge_transaction_placement(interval) IS
	'Router: forget transaction placements older than older_than (at least 1 day, default 90 days); a later bill line without our payment number for such a transaction goes to partition 0. Returns the number removed.';

CREATE FUNCTION payidem._bill_unplaced_lines_on0(channel_no text, bill_date date, csv text, partitions integer)
RETURNS TABLE (line_no bigint, transaction_id text)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON 0;
	SELECT u.line_no, u.transaction_id FROM payidem.bill_unplaced_lines(channel_no, bill_date, csv, partitions) u;
$$;

CREATE FUNCTION payidem._load_bill_all(channel_no text, bill_date date, csv text, partitions integer,
	placed_lines bigint[], placed_partitions integer[])
RETURNS SETOF bigint
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.load_bill_part(channel_no, bill_date, csv, partitions, placed_lines, placed_partitions);
$$;

-- Partition 0 checks the bill and names the lines no payment number
-- places; the router places those by transaction id; every partition then
-- checks the bill again and keeps its lines.
CREATE FUNCTION payidem.load_bill(channel_no text, bill_date date, csv text)
RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	WITH n AS (SELECT payidem._cluster_size() AS partitions),
	placed AS (
		SELECT pg_catalog.array_agg(u.line_no ORDER BY u.line_no) AS lines,
			   pg_catalog.array_agg(t.partition ORDER BY u.line_no) AS partitions
		  FROM n, payidem._bill_unplaced_lines_on0(channel_no, bill_date, csv, n.partitions) u
		  JOIN payidem.transaction_placement t ON t.transaction_id OPERATOR(pg_catalog.=) u.transaction_id
		 WHERE t.partition OPERATOR(pg_catalog.<) n.partitions)
	SELECT pg_catalog.sum(l.n)::bigint
	  FROM n, placed, payidem._load_bill_all(channel_no, bill_date, csv, n.partitions, placed.lines, placed.partitions) AS l(n);
END;
COMMENT ON FUNCTION payidem.load_bill(text, date, text) IS
	'Router: every partition checks the whole bill and keeps the lines whose payment_no names it, and the lines without one whose transaction id the router placed there (payidem.transaction_placement); the rest go to partition 0. Returns the number of lines loaded in all.';

CREATE FUNCTION payidem._bill_lines_all(channel_no text, bill_date date)
RETURNS SETOF bigint
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem._bill_day_lines($1, $2);
$$;
COMMENT ON FUNCTION payidem._bill_lines_all(text, date) IS
	'Router, internal to reconcile(): the partitions check the arguments and count the day''s bill lines (payidem._bill_day_lines).';

CREATE FUNCTION payidem._reconcile_all(channel_no text, bill_date date, allow_empty boolean)
RETURNS TABLE (recon_batch_no text, matched bigint, platform_only bigint,
			   channel_only bigint, amount_mismatch bigint, status_mismatch bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT r.recon_batch_no, r.matched, r.platform_only, r.channel_only, r.amount_mismatch, r.status_mismatch
	  FROM payidem.reconcile(channel_no, bill_date, allow_empty) r;
$$;

-- No bill, no reconciliation, decided by the partitions as on one database:
-- the bill is split between them (a partition may hold none of its lines),
-- so each reconciles with allow_empty when the others hold lines; when no
-- partition holds one, each refuses the day itself.
CREATE FUNCTION payidem.reconcile(channel_no text, bill_date date, allow_empty boolean DEFAULT false)
RETURNS TABLE (recon_batch_no text, matched bigint, platform_only bigint,
			   channel_only bigint, amount_mismatch bigint, status_mismatch bigint)
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT pg_catalog.string_agg(DISTINCT r.recon_batch_no, ','),
		   pg_catalog.sum(r.matched)::bigint, pg_catalog.sum(r.platform_only)::bigint,
		   pg_catalog.sum(r.channel_only)::bigint, pg_catalog.sum(r.amount_mismatch)::bigint,
		   pg_catalog.sum(r.status_mismatch)::bigint
	  FROM payidem._reconcile_all(channel_no, bill_date,
			   allow_empty IS TRUE
			   OR (SELECT pg_catalog.sum(n) FROM payidem._bill_lines_all(channel_no, bill_date) n) > 0) r;
END;
COMMENT ON FUNCTION payidem.reconcile(text, date, boolean) IS
	'Router: reconcile the channel''s day on every partition and return the summed counts (55000 if no partition holds a bill line of that day, unless allow_empty). recon_batch_no is the shards'' batch number (they agree when every run went through the router), else their distinct numbers joined with commas.';

CREATE FUNCTION payidem.resolve_diff(recon_id bigint, handle_status text, note text DEFAULT NULL)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON payidem.recon_partition(recon_id);
$$;

------------------------------------------------------------------------------
-- What a person should look at (DESIGN section 10): the shards' views, gathered
------------------------------------------------------------------------------

-- Each view of one database, on the router: its rows from every partition
-- (a PL/Proxy function per view, wrapped like the API so that a shard that
-- is down is 08006), ordered and, where the view counts, summed as one
-- database would show them.
CREATE FUNCTION payidem._open_anomalies_all()
RETURNS TABLE (anomaly_id bigint, kind text, order_no text, payment_no text, channel_no text, amount bigint,
			   created_at timestamptz, open_for interval, action text, detail jsonb)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.anomaly_id, v.kind, v.order_no, v.payment_no, v.channel_no, v.amount, v.created_at, v.open_for,
		   v.action, v.detail
	  FROM payidem.open_anomalies v;
$$;

CREATE FUNCTION payidem._open_differences_all()
RETURNS TABLE (recon_id bigint, channel_no text, bill_date date, diff_type text, transaction_id text,
			   payment_no text, platform_amount bigint, channel_amount bigint, platform_status text,
			   channel_status text, created_at timestamptz, open_for interval)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.recon_id, v.channel_no, v.bill_date, v.diff_type, v.transaction_id, v.payment_no, v.platform_amount,
		   v.channel_amount, v.platform_status, v.channel_status, v.created_at, v.open_for
	  FROM payidem.open_differences v;
$$;

CREATE FUNCTION payidem._recon_summary_all()
RETURNS TABLE (channel_no text, bill_date date, last_batch_no text, finished_at timestamptz, bill_timezone text,
			   bill_lines bigint, bill_amount_total numeric, platform_payments bigint,
			   platform_amount_total numeric, matched bigint, platform_only bigint, channel_only bigint,
			   amount_mismatch bigint, status_mismatch bigint, straddled bigint, open_count bigint,
			   open_amount numeric, open_channel_only bigint, handled_count bigint, ignored_count bigint,
			   auto_resolved_count bigint)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.channel_no, v.bill_date, v.last_batch_no, v.finished_at, v.bill_timezone, v.bill_lines,
		   v.bill_amount_total, v.platform_payments, v.platform_amount_total, v.matched, v.platform_only,
		   v.channel_only, v.amount_mismatch, v.status_mismatch, v.straddled, v.open_count, v.open_amount,
		   v.open_channel_only, v.handled_count, v.ignored_count, v.auto_resolved_count
	  FROM payidem.recon_summary v;
$$;

CREATE FUNCTION payidem._notification_backlog_all()
RETURNS TABLE (status text, attempts integer, events bigint, due_now bigint, oldest_due_at timestamptz,
			   oldest_event_at timestamptz)
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT v.status::text, v.attempts::integer, v.events, v.due_now, v.oldest_due_at, v.oldest_event_at
	  FROM payidem.notification_backlog v;
$$;

-- Administration that one database does on its own, for every shard.
CREATE FUNCTION payidem._reencrypt_secrets_all()
RETURNS SETOF bigint
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON ALL;
	SELECT payidem.reencrypt_secrets();
$$;
CREATE FUNCTION payidem.reencrypt_secrets()
RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT coalesce(sum(n), 0)::bigint FROM payidem._reencrypt_secrets_all() AS n;
END;
COMMENT ON FUNCTION payidem.reencrypt_secrets() IS
	'Router: reencrypt_secrets() on every shard (each under its own current master key); the number of records resealed in all.';

-- A secret or configuration from a file: partition 0 reads it from its
-- payidem.secret_dir (so it never appears in a statement), then
-- sync_shards() copies it to every shard.
CREATE FUNCTION payidem._load_merchant_secret_first(merchant_no text, file_name text, grace interval)
RETURNS text
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON 0;
	SELECT payidem.load_merchant_secret(merchant_no, file_name, grace);
$$;
CREATE FUNCTION payidem.load_merchant_secret(merchant_no text, file_name text, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_outcome text;
BEGIN
	PERFORM payidem._reference_write_lock(true);	-- sync_shards() takes it so
	v_outcome := payidem._load_merchant_secret_first(merchant_no, file_name, grace);
	PERFORM FROM payidem.sync_shards();
	RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION payidem.load_merchant_secret(text, text, interval) IS
	'Router: load_merchant_secret() on partition 0 (the file is read from its payidem.secret_dir), then sync_shards() makes it the current secret on every shard.';

CREATE FUNCTION payidem._load_channel_config_first(channel_no text, file_name text)
RETURNS void
LANGUAGE plproxy AS $$
	CLUSTER 'payidem';
	RUN ON 0;
	SELECT payidem.load_channel_config(channel_no, file_name);
$$;
CREATE FUNCTION payidem.load_channel_config(channel_no text, file_name text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	PERFORM payidem._reference_write_lock(true);	-- sync_shards() takes it so
	PERFORM payidem._load_channel_config_first(channel_no, file_name);
	PERFORM FROM payidem.sync_shards();
END
$$;
COMMENT ON FUNCTION payidem.load_channel_config(text, text) IS
	'Router: load_channel_config() on partition 0 (the file is read from its payidem.secret_dir), then sync_shards() copies the configuration to every shard.';

------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  An application role needs EXECUTE on the
-- API functions and on the routing functions they call, USAGE on schema
-- payidem and on FOREIGN SERVER payidem, and a user mapping
-- (docs/scale-out.md): grant_app() gives the first three.
------------------------------------------------------------------------------

-- The application's API on the router, as on a single database (no merchant,
-- channel or secret administration, no load_bill), plus the routing
-- functions those call as the caller.
CREATE FUNCTION payidem.app_functions()
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
						 '_split_rows', '_notify_due_split', '_query_due_split', '_reconcile_all', '_bill_lines_all']))
	SELECT p.oid::regprocedure
	  FROM pg_catalog.pg_proc p
	 WHERE p.pronamespace = 'payidem'::regnamespace
	   AND (p.proname IN (SELECT a.name FROM api a)
			-- each API function's PL/Proxy part, and how its errors are raised
			OR p.proname IN (SELECT '_proxy_' || a.name FROM api a)
			OR p.proname IN ('_shard_error', '_shard_error_parts', '_partition_in'));
END;
COMMENT ON FUNCTION payidem.app_functions() IS
	'Router: the functions grant_app() lets an application role execute (the API and the routing functions it calls).';

CREATE FUNCTION payidem.grant_app(role regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	r pg_catalog.pg_roles;
	f regprocedure;
BEGIN
	-- the refusals of payidem._check_role() on one database that apply here
	-- (the router has no row-level security, and no shard schema to call)
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING
			ERRCODE = 'invalid_parameter_value',
			HINT = 'Name an existing role, e.g. ''shop_app''.';
	END IF;
	SELECT * INTO r FROM pg_catalog.pg_roles u WHERE u.oid = role;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'role does not exist' USING
			ERRCODE = 'undefined_object',
			DETAIL = format('No role has OID %s (it was dropped).', role::oid);
	END IF;
	IF r.rolname ~ '^pg_' THEN
		RAISE EXCEPTION 'role % is a predefined role', r.rolname USING
			ERRCODE = 'invalid_parameter_value',
			DETAIL = 'Predefined roles are shared by every database of the server, and some are members of others.',
			HINT = 'Create a role of its own for the application and name that one.';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_foreign_server s WHERE s.srvname = 'payidem') THEN
		RAISE EXCEPTION 'the PL/Proxy cluster payidem is not defined' USING
			ERRCODE = 'object_not_in_prerequisite_state',
			HINT = 'CREATE SERVER payidem FOREIGN DATA WRAPPER plproxy OPTIONS (p0 ''...'', ...) first, see docs/scale-out.md.';
	END IF;
	EXECUTE format('GRANT USAGE ON SCHEMA payidem TO %I', r.rolname);
	EXECUTE format('GRANT USAGE ON FOREIGN SERVER payidem TO %I', r.rolname);
	FOR f IN SELECT * FROM payidem.app_functions() LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, r.rolname);
	END LOOP;
END
$$;
COMMENT ON FUNCTION payidem.grant_app(regrole) IS
	'Router: let an application role call the payidem API through the router (USAGE on schema and server, EXECUTE on payidem.app_functions()); it still needs a user mapping for server payidem.';

------------------------------------------------------------------------------
-- Errors as one database raises them (DESIGN section 9)
------------------------------------------------------------------------------

-- PL/Proxy re-raises a shard's error with its SQLSTATE but rewords it:
-- "payidem.refund(4): [db] REMOTE ERROR: <message>", "Remote detail: ...",
-- "Remote hint: ...", and a shard it cannot reach is its XX000.  Raise the
-- error again as the shard raised it: the same SQLSTATE, message, DETAIL and
-- HINT; a shard that cannot be reached is 08006 naming it and its
-- connection (libpq's words: host and port, never a password).
-- Which partition a libpq message is about: the one whose connection string
-- names the port (and host) the message names.  The options hold connection
-- strings, which only the server's owner may read: SECURITY DEFINER,
-- returning only the number.
CREATE FUNCTION payidem._partition_in(message text)
RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN (SELECT substring(o.opt FROM '^p([0-9]+)=')::integer
		  FROM pg_catalog.pg_foreign_server s, pg_catalog.unnest(s.srvoptions) AS o(opt)
		 WHERE s.srvname OPERATOR(pg_catalog.=) 'payidem' AND o.opt ~ '^p[0-9]+='
		   AND o.opt ~ 'port=[0-9]+'
		   AND (pg_catalog.strpos(message, 'port ' || substring(o.opt FROM 'port=([0-9]+)')) > 0
				OR pg_catalog.strpos(message, '.s.PGSQL.' || substring(o.opt FROM 'port=([0-9]+)')) > 0)
		   AND (o.opt !~ 'host=' OR pg_catalog.strpos(message, substring(o.opt FROM 'host=([^ ]+)')) > 0)
		 ORDER BY 1 LIMIT 1);

-- A shard's error as the shard raised it: SQLSTATE, message, DETAIL, HINT.
-- A shard that cannot be reached, or whose connection was lost during the
-- call, is 08006, naming its partition and database.
CREATE FUNCTION payidem._shard_error_parts(INOUT state text, INOUT message text, INOUT detail text, INOUT hint text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	v_remote constant text := '^(PL/Proxy function )?[^ ]+\([0-9]+\): \[([^]]*)\] REMOTE (ERROR|FATAL): ';
	v_local constant text := '^PL/Proxy function [^ ]+\([0-9]+\): \[([^]]*)\] ';
	v_db text;
	v_what text;
	v_partition integer;
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
		v_what := 'lost';
		detail := message;
	ELSIF message ~ v_local AND message ~* 'connect|connection' THEN
		v_db := substring(message FROM v_local);
		v_what := CASE WHEN message ~ '\] PQconnect' THEN 'unreachable' ELSE 'lost' END;
		detail := btrim(regexp_replace(regexp_replace(message, v_local || '(PQ[A-Za-z]+: )?', ''), '\s+', ' ', 'g'));
	ELSE
		RETURN;
	END IF;
	v_partition := payidem._partition_in(detail);
	v_db := CASE WHEN v_partition IS NULL THEN format('(database "%s")', v_db)
				 ELSE format('%s (database "%s")', v_partition, v_db) END;
	state := '08006';
	IF v_what = 'unreachable' THEN
		message := format('shard %s cannot be reached', v_db);
		hint := 'Start that shard''s server, or correct its connection in server payidem; payidem.cluster_check() shows every partition. Calls routed to the other shards go on working.';
	ELSE
		message := format('the connection to shard %s was lost during the call', v_db);
		hint := 'The call may have been applied on that shard: repeat it once the shard is back (payidem''s calls are idempotent). payidem.cluster_check() shows every partition.';
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._shard_error_parts(text, text, text, text) IS
	'Router: a shard''s error, as PL/Proxy passed it on, in the words the shard gave it (08006 for a shard that cannot be reached or was lost).';

CREATE FUNCTION payidem._shard_error(state text, message text, detail text, hint text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
	e record;
BEGIN
	e := payidem._shard_error_parts(state, message, detail, hint);
	IF e.detail IS NOT NULL AND e.hint IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = e.state, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	ELSIF e.detail IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = e.state, MESSAGE = e.message, DETAIL = e.detail;
	ELSIF e.hint IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = e.state, MESSAGE = e.message, HINT = e.hint;
	ELSE
		RAISE EXCEPTION USING ERRCODE = e.state, MESSAGE = e.message;
	END IF;
END
$$;
COMMENT ON FUNCTION payidem._shard_error(text, text, text, text) IS
	'Router: raise an error a shard raised through PL/Proxy as the shard raised it (08006 for a shard that cannot be reached).';

-- Every API function of the router that reaches a shard is a PL/pgSQL function
-- of the same name and arguments that calls the PL/Proxy (or SQL) function,
-- kept as _proxy_<name>, and raises what it raised through _shard_error().
-- Made here, from the catalog, so that no function is left out and none is
-- written twice.  A function returning TABLE returns a row type of the same
-- columns (PL/pgSQL refuses an argument and a column of one name, which
-- idem_record() has).  client_min_messages = warning keeps PL/Proxy's
-- "dropping stale conn" notice from the application.
DO $wrap$
DECLARE
	f record;
	v_keyed boolean;
	v_args text;
	v_idargs text;
	v_call text;
	v_result text;
	v_body text;
BEGIN
	FOR f IN
		SELECT p.oid, p.proname, p.proretset, p.prorettype, p.provariadic,
			   pg_catalog.pg_get_function_arguments(p.oid) AS args,
			   pg_catalog.pg_get_function_identity_arguments(p.oid) AS idargs,
			   pg_catalog.pg_get_function_result(p.oid) AS result,
			   p.pronargs, p.prosrc, l.lanname,
			   (SELECT count(*) <> count(DISTINCT n) FROM unnest(p.proargnames) n) AS dup_names,
			   -- as one database declares them: pure, or reading only
			   CASE WHEN p.proname IN ('order_no_valid', 'order_no_parse', 'order_no_make') THEN 'IMMUTABLE'
					WHEN p.proname IN ('get_order', 'find_order', 'sign', 'verify_signature',
									   'verify_notification', 'get_channel_config') THEN 'STABLE'
					ELSE 'VOLATILE' END AS volatility,
			   pg_catalog.obj_description(p.oid, 'pg_proc') AS comment
		  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
		 WHERE p.pronamespace = 'payidem'::regnamespace
		   AND ((p.proname !~ '^_' AND l.lanname = 'plproxy')
				OR p.proname IN ('notify_due', 'query_due', 'idem_purge', 'stats', 'create_merchant',
								 'rotate_merchant_secret', 'create_channel', 'set_channel_status',
								 'set_channel_config', 'bind_channel', 'unbind_channel', 'set_merchant_status',
								 'freeze_merchant', 'unfreeze_merchant', 'close_merchant', 'load_bill', 'reconcile',
								 'sync_shards', 'add_shards', 'reencrypt_secrets', 'load_merchant_secret',
								 'load_channel_config')
				-- the views' PL/Proxy parts, so that a shard that is down is 08006 there too
				OR p.proname IN ('_open_anomalies_all', '_open_differences_all', '_recon_summary_all',
								 '_notification_backlog_all'))
	LOOP
		EXECUTE format('ALTER FUNCTION payidem.%I(%s) RENAME TO %I', f.proname, f.idargs, '_proxy_' || f.proname);
		-- a PL/Proxy function calls its own name on the shard unless told
		-- otherwise: the shard's function keeps the API's name
		IF f.lanname = 'plproxy' AND f.prosrc !~* '\mselect\M' THEN
			EXECUTE format('CREATE OR REPLACE FUNCTION payidem.%I(%s) RETURNS %s LANGUAGE plproxy AS %L',
						   '_proxy_' || f.proname, f.args, f.result,
						   f.prosrc || format(E'\tTARGET payidem.%I;\n', f.proname));
		END IF;
		-- an idempotency call's PL/Proxy part takes the partition first, which
		-- idem_partition() decides before the call (it may ask a partition
		-- itself, and PL/Proxy calls do not nest); the API has no such argument
		v_keyed := f.proname ~ '^idem_' AND f.args ~ '^partition integer, ';
		v_args := CASE WHEN v_keyed THEN regexp_replace(f.args, '^partition integer, ', '') ELSE f.args END;
		v_idargs := CASE WHEN v_keyed THEN regexp_replace(f.idargs, '^partition integer, ', '') ELSE f.idargs END;
		v_call := format('payidem.%I(%s%s)', '_proxy_' || f.proname,
						 CASE WHEN v_keyed THEN 'payidem.idem_partition($1), ' ELSE '' END,
						 (SELECT coalesce(string_agg(CASE WHEN i = f.pronargs AND f.provariadic <> 0 THEN 'VARIADIC ' ELSE '' END
													 || '$' || i, ', ' ORDER BY i), '')
							FROM generate_series(1, f.pronargs - CASE WHEN v_keyed THEN 1 ELSE 0 END) i));
		-- a success's transaction id is placed on the payment's partition,
		-- for bill lines that do not carry our payment number
		IF f.proname = 'apply_payment_result' THEN
			v_call := format('payidem._place_transaction(%s, $1, $3, $4)', v_call);
		END IF;
		v_result := f.result;
		-- (only where an argument and a column share a name: idem_record's result)
		IF f.result ~ '^TABLE\(' AND f.dup_names THEN
			EXECUTE format('CREATE TYPE payidem.%I AS (%s)', '_row_' || f.proname,
						   substring(f.result FROM '^TABLE\((.*)\)$'));
			v_result := format('SETOF payidem.%I', '_row_' || f.proname);
			v_body := format('RETURN QUERY SELECT * FROM %s;', v_call);
		ELSIF f.proretset THEN
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
			$body$$f$, f.proname, v_args, v_result, f.volatility, v_body);
		IF f.comment IS NOT NULL THEN
			EXECUTE format('COMMENT ON FUNCTION payidem.%I(%s) IS %L', f.proname, v_idargs, f.comment);
		END IF;
	END LOOP;
END
$wrap$;

-- The views of one database, over the wrapped PL/Proxy functions (made
-- after them, so that they call the wrappers).
CREATE VIEW payidem.open_anomalies AS
SELECT a.* FROM payidem._open_anomalies_all() a ORDER BY a.created_at, a.anomaly_id;
COMMENT ON VIEW payidem.open_anomalies IS
	'Router: open anomalies of every shard, oldest first (anomaly ids name their shard); resolve each with payidem.resolve_anomaly().';

CREATE VIEW payidem.open_differences AS
SELECT d.* FROM payidem._open_differences_all() d ORDER BY d.bill_date, d.recon_id;
COMMENT ON VIEW payidem.open_differences IS
	'Router: open reconciliation differences of every shard, oldest bill day first; resolve each with payidem.resolve_diff().';

-- one row per channel and day: the shards' counts and totals summed; the
-- batch number as reconcile() on the router gives it
CREATE VIEW payidem.recon_summary AS
SELECT s.channel_no, s.bill_date,
	   pg_catalog.string_agg(DISTINCT s.last_batch_no, ',') AS last_batch_no,
	   pg_catalog.max(s.finished_at) AS finished_at,
	   pg_catalog.string_agg(DISTINCT s.bill_timezone, ',') AS bill_timezone,
	   pg_catalog.sum(s.bill_lines)::bigint AS bill_lines,
	   pg_catalog.sum(s.bill_amount_total) AS bill_amount_total,
	   pg_catalog.sum(s.platform_payments)::bigint AS platform_payments,
	   pg_catalog.sum(s.platform_amount_total) AS platform_amount_total,
	   pg_catalog.sum(s.matched)::bigint AS matched, pg_catalog.sum(s.platform_only)::bigint AS platform_only,
	   pg_catalog.sum(s.channel_only)::bigint AS channel_only,
	   pg_catalog.sum(s.amount_mismatch)::bigint AS amount_mismatch,
	   pg_catalog.sum(s.status_mismatch)::bigint AS status_mismatch,
	   pg_catalog.sum(s.straddled)::bigint AS straddled, pg_catalog.sum(s.open_count)::bigint AS open_count,
	   pg_catalog.sum(s.open_amount) AS open_amount,
	   pg_catalog.sum(s.open_channel_only)::bigint AS open_channel_only,
	   pg_catalog.sum(s.handled_count)::bigint AS handled_count,
	   pg_catalog.sum(s.ignored_count)::bigint AS ignored_count,
	   pg_catalog.sum(s.auto_resolved_count)::bigint AS auto_resolved_count
  FROM payidem._recon_summary_all() s
 GROUP BY s.channel_no, s.bill_date;
COMMENT ON VIEW payidem.recon_summary IS
	'Router: the daily reconciliation report per channel and bill day, every shard''s counts, totals and open differences summed.';

CREATE VIEW payidem.notification_backlog AS
SELECT b.status, b.attempts, pg_catalog.sum(b.events)::bigint AS events,
	   pg_catalog.sum(b.due_now)::bigint AS due_now, pg_catalog.min(b.oldest_due_at) AS oldest_due_at,
	   pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(b.oldest_due_at) AS behind_by,
	   pg_catalog.min(b.oldest_event_at) AS oldest_event_at
  FROM payidem._notification_backlog_all() b
 GROUP BY b.status, b.attempts
 ORDER BY b.status DESC, b.attempts;
COMMENT ON VIEW payidem.notification_backlog IS
	'Router: undelivered notification events of every shard by status and attempts so far (counts summed, oldest times the earliest).';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON SCHEMA payidem FROM PUBLIC;
