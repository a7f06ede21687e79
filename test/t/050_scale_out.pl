# Scale-out on PL/Proxy (DESIGN §9): one router + 2 shards, then 1 router + 4.
#
# The whole payment story goes through the router (payidem_router); each order,
# payment and refund is then looked up directly on every shard: its rows live
# only on the shard its number names.  Duplicate callbacks have one effect, a
# merchant's out_trade_no stays idempotent, reference data and merchant
# secrets are the same on all shards, a malformed number is refused by the
# router, reconciliation through the router is the sum of the shards, and a
# shard that is down fails the calls routed to it, not the others.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $key_byte = 0x10;

sub new_node
{
	my ($name) = @_;
	# every shard has its own master key: secrets are sealed per shard
	return payidem_node($name,
		key_byte => sprintf('%02x', $key_byte++),
		conf => "max_connections = 40\nlc_messages = 'C'\n");
}

# psql returning (ok, stdout, stderr)
sub try_sql
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	my $ret = $node->psql('postgres', $sql, stdout => \$out, stderr => \$err,
		on_error_stop => 1);
	return ($ret == 0, $out, $err);
}

# ISO 7064 MOD 97-10 over a string of [A-Z0-9], letters A=10 ... Z=35
sub mod97
{
	my ($s) = @_;
	my $r = 0;
	for my $c (split //, $s)
	{
		my $v = $c =~ /[A-Z]/ ? ord($c) - 55 : $c;
		$r = ($r * 10 + $_) % 97 for split //, $v;
	}
	return $r;
}

sub with_check
{
	my ($s24) = @_;
	return $s24 . sprintf('%02d', 98 - mod97($s24 . '00'));
}

# an error as psql shows it: the ERROR, DETAIL and HINT lines (verbose:
# with the SQLSTATE), not where it was raised
sub error_of
{
	my ($node, $sql) = @_;
	my ($ok, $out, $err) = try_sql($node, "\\set VERBOSITY verbose\n$sql");
	return 'no error' if $ok;
	return join("\n", map { s/^psql:<stdin>:\d+: //r } grep { /^(psql:<stdin>:\d+: )?(ERROR|DETAIL|HINT):/ } split /\n/, $err);
}

sub count_on
{
	my ($node, $table, $col, $value) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM payidem.$table WHERE $col = '$value'");
}

sub run_cluster
{
	my ($n, $tag) = @_;
	my @shards = map { new_node("${tag}_shard$_") } 0 .. $n - 1;
	my $router = new_node("${tag}_router");
	my $user = $router->safe_psql('postgres', 'SELECT current_user');

	for my $i (0 .. $n - 1)
	{
		my $s = $shards[$i];
		$s->safe_psql('postgres', 'CREATE EXTENSION payidem');
		$s->safe_psql('postgres', "SELECT payidem.shard_prepare($i)");
	}
	my $opts = join(', ',
		map { sprintf(q{p%d 'host=%s port=%d dbname=postgres connect_timeout=5'},
				$_, $shards[$_]->host, $shards[$_]->port) } 0 .. $n - 1);
	$router->safe_psql('postgres', qq{
		CREATE EXTENSION plproxy;
		CREATE EXTENSION payidem_router;
		CREATE SERVER payidem FOREIGN DATA WRAPPER plproxy OPTIONS ($opts);
		CREATE USER MAPPING FOR PUBLIC SERVER payidem OPTIONS (user '$user');
	});

	is($router->safe_psql('postgres',
			'SELECT count(*) FILTER (WHERE ok AND shard_id = partition) FROM payidem.cluster_check()'),
		$n, "$tag: cluster_check sees $n shards, each with shard_id = its partition");

	# ---- reference data: merchants until every partition is some merchant's home
	my (%home, @merchants);
	for my $k (1 .. 40)
	{
		my $row = $router->safe_psql('postgres', qq{
			SELECT m.merchant_no || '|' || m.api_key || '|' || (hashtext(m.merchant_no) & ($n - 1))
			  FROM payidem.create_merchant('Shop $k', 'retail', 0.006) m});
		my ($m, $key, $part) = split /\|/, $row;
		push @merchants, { no => $m, key => $key, part => $part };
		$home{$part} //= $merchants[-1];
		last if keys(%home) == $n;
	}
	is(scalar(keys %home), $n, "$tag: merchants whose orders live on each of the $n partitions");

	$router->safe_psql('postgres', q{
		SELECT payidem.create_channel('WX_001', 'wechat', 0.002);
		SELECT payidem.create_channel('AL_001', 'alipay', 0.0015);
		SELECT payidem.set_channel_config('WX_001', '{"app_id": "wx1", "private_key": "k"}');
	});
	# a repeat after a partial failure is accepted where the channel is identical
	my ($ok, $out, $err) = try_sql($router,
		q{SELECT payidem.create_channel('WX_001', 'wechat', 0.002)});
	ok(!$ok && $err =~ /channel WX_001 already exists/, "$tag: creating an existing channel is refused");
	for my $m (values %home)
	{
		$router->safe_psql('postgres', "SELECT payidem.bind_channel('$m->{no}', 'WX_001')");
	}

	my $nm = scalar @merchants;
	# ---- placement: decided when the router makes the merchant, and kept
	is($router->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE partition = hashtext(merchant_no) & ($n - 1)) || '/' || count(*)
		  FROM payidem.merchant_placement}),
		"$nm/$nm", "$tag: every merchant made through the router is placed, spread over the partitions");
	{
		# a merchant placed when the cluster was another shape: its orders
		# follow the placement, not today's hash, and stay idempotent
		my $pm = $router->safe_psql('postgres',
			q{SELECT merchant_no FROM payidem.create_merchant('Placed Shop', 'retail', 0.006)});
		$router->safe_psql('postgres', "SELECT payidem.bind_channel('$pm', 'WX_001')");
		my $placed = $router->safe_psql('postgres', qq{
			UPDATE payidem.merchant_placement SET partition = (partition + 1) % $n
			 WHERE merchant_no = '$pm' RETURNING partition});
		my $po = $router->safe_psql('postgres', "SELECT payidem.create_order('$pm', 'T-PLACED', 900, 'placed')");
		is(substr($po, 16, 2) + 0, $placed, "$tag: create_order goes to the merchant's placement ($placed)");
		is($router->safe_psql('postgres', "SELECT payidem.create_order('$pm', 'T-PLACED', 900, 'placed')"),
			$po, "$tag: ... and a repeat returns the same order");
		is($router->safe_psql('postgres', "SELECT payidem.find_order('$pm', 'T-PLACED') ->> 'order_no'"),
			$po, "$tag: ... which find_order finds there");
		$nm++;
	}
	my $sig0 = $router->safe_psql('postgres', "SELECT payidem.sign('$home{0}{no}', 'payload')");
	for my $i (0 .. $n - 1)
	{
		my $s = $shards[$i];
		is($s->safe_psql('postgres', q{
			SELECT count(*) || '/' || (SELECT count(*) FROM payidem.channel) || '/'
				   || (SELECT count(*) FROM payidem.channel_config)
			  FROM payidem.merchant}),
			"$nm/2/1", "$tag: shard $i holds every merchant, channel and channel config");
		is($s->safe_psql('postgres', "SELECT api_key FROM payidem.merchant WHERE merchant_no = '$home{0}{no}'"),
			$home{0}{key}, "$tag: shard $i has the same api_key");
		is($s->safe_psql('postgres', "SELECT payidem.sign('$home{0}{no}', 'payload')"),
			$sig0, "$tag: shard $i signs with the same merchant secret (sealed with its own key)");
		is($s->safe_psql('postgres', q{SELECT payidem.get_channel_config('WX_001') ->> 'app_id'}),
			'wx1', "$tag: shard $i decrypts the channel config");
	}
	is($router->safe_psql('postgres',
			"SELECT payidem.verify_signature('$home{0}{key}', 'payload', '$sig0')"),
		't', "$tag: verify_signature through the router");

	# ---- the payment story, once per partition; paid now (a reported
	# paid_at lies within the attempt's lifetime), billed on today's UTC day
	my @stories;
	my $paid_at = $router->safe_psql('postgres',
		q{SELECT to_char(date_trunc('second', now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS"+00"')});
	my $day = substr($paid_at, 0, 10);
	for my $part (0 .. $n - 1)
	{
		my $m = $home{$part}{no};
		my $o = $router->safe_psql('postgres', qq{
			SELECT payidem.create_order('$m', 'OUT-$part', 1000, 'Green tea', 'https://shop.example/notify')});
		is(substr($o, 16, 2), sprintf('%02d', $part),
			"$tag: order of a merchant hashed to partition $part carries shard digits $part");
		is($router->safe_psql('postgres',
				"SELECT payidem.create_order('$m', 'OUT-$part', 1000, 'Green tea', 'https://shop.example/notify')"),
			$o, "$tag: same out_trade_no through the router returns the same order_no");
		($ok, $out, $err) = try_sql($router,
			"SELECT payidem.create_order('$m', 'OUT-$part', 999, 'Green tea')");
		ok(!$ok && $err =~ /already used with another amount/,
			"$tag: same out_trade_no with another amount is refused through the router");

		my $p = $router->safe_psql('postgres', "SELECT payidem.begin_payment('$o', 'WX_001')");
		is($router->safe_psql('postgres', "SELECT payidem.begin_payment('$o', 'WX_001')"),
			$p, "$tag: a retried begin_payment returns the same attempt");
		my @outcomes = map {
			$router->safe_psql('postgres',
				"SELECT payidem.apply_payment_result('$p', '$_', 'succeeded', 'TXN-$tag-$part', 1000, '$paid_at')")
		} qw(callback callback query);
		is(join(',', @outcomes), 'applied,duplicate,duplicate',
			"$tag: success callback, duplicate callback and query have one effect");

		my $r = $router->safe_psql('postgres', "SELECT payidem.refund('$p', 300, 'RF-$part')");
		is($router->safe_psql('postgres', "SELECT payidem.refund('$p', 300, 'RF-$part')"),
			$r, "$tag: same out_refund_no returns the same refund_no");
		is(join(',', map {
					$router->safe_psql('postgres', "SELECT payidem.apply_refund_result('$r', 'succeeded', 'CR-$part')")
				} 1 .. 2),
			'applied,duplicate', "$tag: refund result applied once");
		push @stories, { part => $part, o => $o, p => $p, r => $r };
	}

	# ---- rows live only on the shard their number names
	for my $st (@stories)
	{
		my @where;
		for my $i (0 .. $n - 1)
		{
			push @where, join('',
				count_on($shards[$i], '"order"', 'order_no', $st->{o}),
				count_on($shards[$i], 'payment', 'payment_no', $st->{p}),
				count_on($shards[$i], 'refund', 'refund_no', $st->{r}));
		}
		is(join(' ', @where),
			join(' ', map { $_ == $st->{part} ? '111' : '000' } 0 .. $n - 1),
			"$tag: order, payment and refund of partition $st->{part} live only on shard $st->{part}");
		my $home = $shards[ $st->{part} ];
		is($home->safe_psql('postgres', qq{
			SELECT o.status || ' ' || o.refunded_amount || ' ' || p.status || ' '
				   || (SELECT count(*) FROM payidem.status_log l
					    WHERE l.entity_no = p.payment_no AND l.to_status = 'succeeded')
			  FROM payidem."order" o JOIN payidem.payment p USING (order_no)
			 WHERE o.order_no = '$st->{o}'}),
			'partially_refunded 300 partially_refunded 1',
			"$tag: shard $st->{part}: paid once, refunded 300");
		is($home->safe_psql('postgres', "SELECT count(*) FROM payidem.idempotency"),
			0, "$tag: shard $st->{part}: the results wrote no idempotency key (the rows record them)");
	}

	# ---- numbers the cluster cannot place: partition 0 refuses them, in the
	# words of one database (the number's rules are the shard's alone)
	my $good = $stories[0]{o};
	my $bad_check = substr($good, 0, 24) . sprintf('%02d', (substr($good, 24, 2) + 1) % 100);
	my $far_shard = with_check(substr($good, 0, 16) . '99' . substr($good, 18, 6));
	for my $case (
		[ "begin_payment('PO123', 'WX_001')", '22023', 'too short' ],
		[ "begin_payment('$bad_check', 'WX_001')", '22023', 'bad check digits' ],
		[ "apply_payment_result('$good', 'callback', 'succeeded')", '22023', 'order number as payment number' ],
		[ "apply_refund_result(NULL, 'succeeded')", '22023', 'NULL' ],
		[ "close_order('$far_shard')", 'PI009', 'a number of a shard outside the cluster' ],
		[ "get_order('PO123')", '22023', 'get_order of a malformed number' ],
		[ "resolve_anomaly(-5, 'handled')", 'PI009', 'an anomaly id no shard has' ],
		[ "resolve_diff(NULL, 'handled')", '22023', 'a NULL difference id' ],
		[ "notify_result(" . (100 + $n) . ", true)", 'PI009', 'an event id naming no shard' ])
	{
		my $through_router = error_of($router, "SELECT payidem.$case->[0]");
		is($through_router, error_of($shards[0], "SELECT payidem.$case->[0]"),
			"$tag: $case->[2]: refused through the router as by one database");
		like($through_router, qr/^ERROR:  $case->[1]:/, "$tag: ... with $case->[1]");
	}
	# NULL routing keys reach a shard, which words the error (not PL/Proxy's XX000)
	($ok, $out, $err) = try_sql($router, "\\set VERBOSITY verbose\nSELECT payidem.create_order(NULL, 'T-NULL', 100, 's')");
	ok(!$ok && $err =~ /22023/ && $err !~ /Hash function returned NULL/, "$tag: create_order with a NULL merchant is 22023")
	  or diag($err);
	is($router->safe_psql('postgres', "SELECT payidem.verify_signature(NULL, 'x', 'y')"), 'f',
		"$tag: verify_signature with a NULL api_key is false, as on one database");

	# ---- an application role: grant_app() on the router is enough for the API,
	# and gives no administration
	$router->safe_psql('postgres', "DROP ROLE IF EXISTS rt_app; CREATE ROLE rt_app; SELECT payidem.grant_app('rt_app')");
	my $app_order = $router->safe_psql('postgres',
		"SET ROLE rt_app; SELECT payidem.create_order('$home{0}{no}', 'T-APP-$tag', 700, 'app')");
	like($app_order, qr/^PO\d{24}$/, "$tag: the application role creates an order through the router");
	is($router->safe_psql('postgres',
			"SET ROLE rt_app; SELECT payidem.begin_payment('$app_order', 'WX_001') ~ '^PY'"),
		't', "$tag: ... and begins its payment (routed by the number)");
	is($router->safe_psql('postgres', "SET ROLE rt_app; SELECT payidem.close_order('$app_order')"),
		't', "$tag: ... and closes it again");
	for my $admin ("create_merchant('Evil', 'retail', 0)", "load_bill('WX_001', '$day', '')")
	{
		($ok, $out, $err) = try_sql($router, "SET ROLE rt_app;\nSELECT payidem.$admin");
		ok(!$ok && $err =~ /permission denied for function/, "$tag: the application role may not call $admin")
		  or diag($err);
	}
	$router->safe_psql('postgres', "DROP OWNED BY rt_app; DROP ROLE rt_app");
	# the router's grant_app refuses what one database's does
	for my $bad ([ 'NULL', qr/role must not be null/ ], [ "'pg_read_all_data'", qr/is a predefined role/ ])
	{
		($ok, $out, $err) = try_sql($router, "\\set VERBOSITY verbose\nSELECT payidem.grant_app($bad->[0])");
		ok(!$ok && $err =~ /22023/ && $err =~ $bad->[1],
			"$tag: the router's grant_app refuses $bad->[0] with 22023, as one database does")
		  or diag($err);
	}

	# ---- order numbers, idempotency keys, transitions and counters through the router
	my $no = $router->safe_psql('postgres', "SELECT payidem.gen_order_no('PY')");
	like($no, qr/^PY\d{24}$/, "$tag: gen_order_no through the router");
	my $no_shard = $router->safe_psql('postgres', "SELECT shard FROM payidem.order_no_parse('$no')");
	ok($no_shard >= 0 && $no_shard < $n && substr($no, 16, 2) == $no_shard,
		"$tag: ... the number names the shard that issued it ($no_shard)");
	is($router->safe_psql('postgres', "SELECT payidem.order_no_valid('$no') AND NOT payidem.order_no_valid('PY1')"),
		't', "$tag: order_no_valid through the router");
	is($router->safe_psql('postgres',
			"SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 1, 67)"),
		$shards[0]->safe_psql('postgres', "SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 1, 67)"),
		"$tag: order_no_make through the router, as on one database");
	my $key = "rt:key:$tag";
	is($router->safe_psql('postgres',
			"SELECT outcome FROM payidem.idem_claim('$key', 'pay', 'PO1', 'WX_001', 100)"),
		'claimed', "$tag: idem_claim through the router");
	is($router->safe_psql('postgres',
			"SELECT outcome FROM payidem.idem_claim('$key', 'pay', 'PO1', 'WX_001', 100)"),
		'in_progress', "$tag: ... a second claim sees the first");
	$router->safe_psql('postgres', qq{SELECT payidem.idem_finish('$key', 'completed', '{"ok": true}')});
	is($router->safe_psql('postgres',
			"SELECT outcome || ' ' || (result ->> 'ok') FROM payidem.idem_claim('$key', 'pay', 'PO1', 'WX_001', 100)"),
		'replay true', "$tag: ... and after idem_finish it replays");
	my $key_home = $router->safe_psql('postgres', "SELECT hashtext('$key') & ($n - 1)");
	is(join(',', map { count_on($shards[$_], 'idempotency', 'idem_key', $key) } 0 .. $n - 1),
		join(',', map { $_ == $key_home ? 1 : 0 } 0 .. $n - 1),
		"$tag: the key lives on one shard, the one its hash names");
	($ok, $out, $err) = try_sql($router,
		"\\set VERBOSITY verbose\nSELECT * FROM payidem.idem_claim('$key', 'pay', 'PO1', 'WX_001', 999)");
	ok(!$ok && $err =~ /PI001/, "$tag: a key reused with other parameters is PI001 through the router")
	  or diag($err);
	# (no housekeeping worker on these nodes, see PayidemNode: it would purge
	# the backdated key on its own, before the call below)
	$shards[$key_home]->safe_psql('postgres',
		"UPDATE payidem.idempotency SET updated_at = now() - interval '3 days' WHERE idem_key = '$key'");
	is($router->safe_psql('postgres', "SELECT payidem.idem_purge('2 days')"), 1,
		"$tag: idem_purge through the router counts what every shard purged");
	my $tr_order = $router->safe_psql('postgres',
		"SELECT payidem.create_order('$home{$n - 1}{no}', 'T-TR-$tag', 300, 'transit')");
	is($router->safe_psql('postgres', "SELECT payidem.transit_order('$tr_order', 'closed')"), 't',
		"$tag: transit_order through the router, routed by the number");
	is($shards[$n - 1]->safe_psql('postgres', "SELECT status FROM payidem.\"order\" WHERE order_no = '$tr_order'"),
		'closed', "$tag: ... on the order's shard");
	is($router->safe_psql('postgres', q{
		SELECT s.value = (SELECT sum(b.value) FROM payidem.stats_by_shard() b WHERE b.name = s.name)
		       AND s.server_value IS NULL
		  FROM payidem.stats() s WHERE s.name = 'order_nos_issued'}),
		't', "$tag: stats() through the router sums the shards' counters");
	is($router->safe_psql('postgres', 'SELECT count(DISTINCT shard) FROM payidem.stats_by_shard()'), $n,
		"$tag: stats_by_shard() shows each shard");

	# ---- reconciliation: the bill is split by payment number, counts summed
	# (each story's payment was partly refunded the same day: the day's bill
	# shows it refunded)
	my @lines;
	for my $st (@stories)
	{
		my $amount = $st->{part} == $n - 1 ? 1001 : 1000;	# one amount mismatch
		push @lines, "WX_001,$day,TXN-$tag-$st->{part},$st->{p},$amount,2,refunded,$paid_at";
	}
	push @lines, "WX_001,$day,TXN-UNKNOWN,,555,1,succeeded,$paid_at";
	my $csv = join("\n", 'channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at', @lines);
	is($router->safe_psql('postgres', "SELECT payidem.load_bill('WX_001', '$day', \$csv\$$csv\$csv\$)"),
		$n + 1, "$tag: load_bill through the router loads every line once");
	is(join(',', map { $_->safe_psql('postgres', 'SELECT count(*) FROM payidem.channel_bill') } @shards),
		join(',', map { $_ == 0 ? 2 : 1 } 0 .. $n - 1),
		"$tag: each shard keeps the bill lines of its payments (line without payment_no: partition 0)");
	($ok, $out, $err) = try_sql($router,
		"SELECT payidem.load_bill('WX_001', '$day', \$csv\$$csv\nWX_001,$day,TXN-BAD,,-1,1,succeeded,\$csv\$)");
	ok(!$ok && $err =~ /invalid amount on line/, "$tag: a bad bill line is refused");
	is(join(',', map { $_->safe_psql('postgres', 'SELECT count(*) FROM payidem.channel_bill') } @shards),
		join(',', map { $_ == 0 ? 2 : 1 } 0 .. $n - 1),
		"$tag: ... and no shard lost or replaced its part of the bill");

	my $routed = $router->safe_psql('postgres', qq{
		SELECT concat_ws(',', matched, platform_only, channel_only, amount_mismatch, status_mismatch)
		  FROM payidem.reconcile('WX_001', '$day')});
	my @sum = (0) x 5;
	for my $s (@shards)
	{
		my @c = split /,/, $s->safe_psql('postgres', qq{
			SELECT concat_ws(',', matched, platform_only, channel_only, amount_mismatch, status_mismatch)
			  FROM payidem.recon_batch WHERE channel_no = 'WX_001' AND bill_date = '$day'
			 ORDER BY started_at DESC LIMIT 1});
		$sum[$_] += $c[$_] for 0 .. 4;
	}
	is($routed, join(',', @sum), "$tag: reconcile through the router = sum of the shards' batches");
	is($routed, join(',', $n - 1, 0, 1, 1, 0), "$tag: ... " . ($n - 1) . ' matched, 1 channel_only, 1 amount_mismatch');
	# no bill, no reconciliation, on the router as on one database
	($ok, $out, $err) = try_sql($router, "SELECT * FROM payidem.reconcile('WX_001', '2001-01-01')");
	ok(!$ok && $err =~ /no bill of channel WX_001 for 2001-01-01 is loaded/,
		"$tag: reconcile of a day without a bill is refused through the router") or diag($err);
	is($router->safe_psql('postgres',
			"SELECT concat_ws(',', matched, platform_only) FROM payidem.reconcile('WX_001', '2001-01-01', allow_empty => true)"),
		'0,0', "$tag: ... and reconciled as empty when asked");
	($ok, $out, $err) = try_sql($router, "SELECT * FROM payidem.reconcile('NO_SUCH', '2001-01-01')");
	ok(!$ok && $err =~ /channel 'NO_SUCH' does not exist/,
		"$tag: an unknown channel is that, through the router as on one database") or diag($err);

	my $last = $shards[ $n - 1 ];
	my $diff = $last->safe_psql('postgres',
		q{SELECT recon_id FROM payidem.reconciliation WHERE diff_type = 'amount_mismatch'});
	cmp_ok($diff, '>=', ($n - 1) * 1e15, "$tag: difference ids of shard " . ($n - 1) . ' name their shard');
	$router->safe_psql('postgres', "SELECT payidem.resolve_diff($diff, 'handled', 'refunded the cent')");
	is($last->safe_psql('postgres', "SELECT handle_status FROM payidem.reconciliation WHERE recon_id = $diff"),
		'handled', "$tag: resolve_diff through the router reaches the shard of the difference");

	# ---- every API function of the router raises a shard's error in its words:
	# each has its PL/Proxy part, except those that never reach a shard
	is($router->safe_psql('postgres', q{
		SELECT coalesce(string_agg(p.proname, ',' ORDER BY p.proname), '')
		  FROM pg_proc p
		 WHERE p.pronamespace = 'payidem'::regnamespace AND p.proname !~ '^_'
		   AND NOT EXISTS (SELECT 1 FROM pg_proc q WHERE q.pronamespace = p.pronamespace
							  AND q.proname = '_proxy_' || p.proname)}),
		'anomaly_partition,app_functions,check_partition,cluster_check,cluster_partitions,event_partition,'
		. 'grant_app,idem_partition,merchant_partition,order_partition,partition_of,payment_partition,payout_partition,purge_transaction_placement,'
		. 'recon_partition,refund_partition',
		"$tag: every other API function has its PL/Proxy part and raises the shard's errors");

	# ---- errors through the router are the shard's, word for word
	my $unknown_payment = with_check('PY20240101000000' . sprintf('%02d', $n - 1) . '000067');
	my $key2 = "rt:key2:$tag";
	$router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key2', 'pay', 'PO1', 'WX_001', 100)");
	my $key2_home = $router->safe_psql('postgres', "SELECT hashtext('$key2') & ($n - 1)");
	# [call, the shard it reaches]
	for my $case (
		[ "SELECT payidem.refund('$unknown_payment', 100, 'RF-X')", $n - 1 ],
		[ "SELECT payidem.create_order(NULL, 'T-NULL', 100, 's')", 0 ],
		[ "SELECT payidem.create_order('$home{0}{no}', 'T-0', -5, 's')", 0 ],
		[ "SELECT * FROM payidem.idem_claim('$key2', 'pay', 'PO1', 'WX_001', 999)", $key2_home ],
		[ "SELECT payidem.apply_payment_result('$unknown_payment', 'callback', 'paid')", $n - 1 ],
		[ "SELECT payidem.gen_order_no('p0')", 0 ],
		[ "SELECT * FROM payidem.order_no_parse('PO123')", 0 ],
		[ "SELECT payidem.transit_order('$tr_order', 'paid')", $n - 1 ],
		[ "SELECT * FROM payidem.notify_due(0)", 0 ],
		[ "SELECT * FROM payidem.query_due(NULL)", 0 ])
	{
		my ($call, $where) = @$case;
		my $on_shard = error_of($shards[$where], $call);
		isnt($on_shard, 'no error', "$tag: the call fails on one database: $call");
		is(error_of($router, $call), $on_shard, "$tag: ... and through the router with the same words: $call");
	}

	# ---- the read API and anomalies through the router
	my $last_home = $home{$n - 1}{no};
	my $late = $router->safe_psql('postgres',
		"SELECT payidem.create_order('$last_home', 'T-LATE-$tag', 400, 'late')");
	my $late_pay = $router->safe_psql('postgres', "SELECT payidem.begin_payment('$late', 'WX_001')");
	$router->safe_psql('postgres', "SELECT payidem.close_order('$late')");
	is($router->safe_psql('postgres',
			"SELECT payidem.apply_payment_result('$late_pay', 'callback', 'succeeded', 'TX-LATE-$tag', 400)"),
		'anomaly', "$tag: a success after close through the router is an anomaly");
	is($router->safe_psql('postgres', "SELECT payidem.get_order('$late')::text"),
		$shards[$n - 1]->safe_psql('postgres', "SELECT payidem.get_order('$late')::text"),
		"$tag: get_order through the router, as on the order's shard");
	is($router->safe_psql('postgres', "SELECT payidem.find_order('$last_home', 'T-LATE-$tag') ->> 'order_no'"),
		$late, "$tag: find_order through the router, on the merchant's shard");
	my $anomaly = $shards[$n - 1]->safe_psql('postgres',
		"SELECT anomaly_id FROM payidem.anomaly WHERE order_no = '$late'");
	cmp_ok($anomaly, '>', ($n - 1) * 1e15, "$tag: anomaly ids of shard " . ($n - 1) . ' name their shard');
	$router->safe_psql('postgres', "SELECT payidem.resolve_anomaly($anomaly, 'handled', 'refunded')");
	is($shards[$n - 1]->safe_psql('postgres', "SELECT handle_status FROM payidem.anomaly WHERE anomaly_id = $anomaly"),
		'handled', "$tag: resolve_anomaly through the router reaches the anomaly's shard");
	($ok, $out, $err) = try_sql($router, "\\set VERBOSITY verbose\nSELECT payidem.resolve_anomaly(" . ($n * 1e15 + 1) . ", 'handled')");
	ok(!$ok && $err =~ /PI009/ && $err =~ /anomaly \d+ does not exist/,
		"$tag: an anomaly id naming no shard is PI009") or diag($err);

	# ---- notification events from all shards, max_rows shared out
	my $events = 0;
	$events += $_->safe_psql('postgres', q{SELECT count(*) FROM payidem.notify_event WHERE status = 'pending'})
	  for @shards;
	cmp_ok($events, '>=', $n, "$tag: the shards hold their orders' events");
	is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.notify_due(1)'),
		1, "$tag: notify_due(1) hands out one event");
	my $due = $router->safe_psql('postgres', 'SELECT string_agg(event_id::text, \',\') FROM payidem.notify_due(100)');
	my @due = split /,/, $due;
	is(scalar(@due), $events - 1, "$tag: notify_due gathers the others from all shards");
	is(scalar(grep { $_ % 100 >= $n } @due), 0, "$tag: each event id names its shard");
	$router->safe_psql('postgres', "SELECT payidem.notify_result($_, true)") for @due;
	my $sent = 0;
	$sent += $_->safe_psql('postgres', q{SELECT count(*) FROM payidem.notify_event WHERE status = 'sent'})
	  for @shards;
	is($sent, $events - 1, "$tag: notify_result through the router reaches each event's shard");

	return ($router, \@shards, \%home, \@stories);
}

# ---------------------------------------------------------------- 2 shards
my ($router, $shards, $home, $stories) = run_cluster(2, 'two');

# The C calls (gen_order_no, get_order, apply_payment_result) keep one
# connection per shard in a router session, with each call's statement
# prepared there: a session kept open across a shard's restart finds the
# shard down (08006, not a lost call) and then back, without reconnecting
# itself.
my $kept = $router->background_psql('postgres', on_error_stop => 0);
my $order_on_1 = "SELECT payidem.get_order('$stories->[1]{o}')->>'order_no'";
is($kept->query_safe($order_on_1), $stories->[1]{o}, 'kept session: get_order reaches shard 1');
is($kept->query_safe($order_on_1), $stories->[1]{o}, 'kept session: ... and again, prepared');

# what the router keeps per C call is made again when its function changes,
# not piled up: a catalog change of functions in the database drops it
$kept->query_safe(qq{DO \$\$ BEGIN FOR i IN 1..200 LOOP
	EXECUTE format('CREATE OR REPLACE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS %L', 'SELECT ' || i);
	PERFORM payidem.get_order('$stories->[1]{o}'); PERFORM payidem.gen_order_no();
END LOOP; END \$\$});
cmp_ok($kept->query_safe(q{SELECT count(*) FROM pg_backend_memory_contexts WHERE name = 'payidem router call'}),
	'<=', 3, 'kept session: 200 function changes leave one entry per C call, not 200');

# get_order()'s document comes from the shard in its stored form, which the
# router checks before it takes it: a malformed one is refused (08P01), not
# read past its end
# (empty; an object's header alone; an array of two with one entry; a number
# with a 1-byte header, which jsonb's readers take for a 4-byte one; NaN,
# no JSON number; a root scalar holding an object; 0.006 with no decimals
# shown, which would print as 0)
for my $bad (q{'\x'::bytea}, q{'\x01000020'::bytea}, q{'\x0200004000000000'::bytea},
	q{'\x01000020010000000b000010780000001100003000000000'::bytea},
	q{'\x0100002001000000090000106e0000001800000000c0'::bytea},
	q{'\x010000500400005000000020'::bytea},
	q{'\x01000020010000000b0000106e000000200000007f803c00'::bytea})
{
	$shards->[1]->safe_psql('postgres', qq{CREATE OR REPLACE FUNCTION payidem._jsonb_stored(value jsonb)
		RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS \$\$ SELECT $bad \$\$});
	my ($ok, $out, $err) = try_sql($router, "\\set VERBOSITY verbose\nSELECT payidem.get_order('$stories->[1]{o}')");
	ok(!$ok && $err =~ /ERROR:  08P01: shard 1 answered with a malformed jsonb document/,
		"stored form: $bad is refused") or diag($err);
}
$shards->[1]->safe_psql('postgres', q{CREATE OR REPLACE FUNCTION payidem._jsonb_stored(value jsonb)
	RETURNS bytea AS '$libdir/payidem', 'payidem_jsonb_stored' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE});
is($router->safe_psql('postgres', "SELECT payidem.get_order('$stories->[1]{o}')::text"),
	$shards->[1]->safe_psql('postgres', "SELECT payidem.get_order('$stories->[1]{o}')::text"),
	'stored form: get_order() through the router is the shard\'s document');

# a shard that accepts connections but does not answer (its postmaster
# stopped): a new connection to it gives up after its connect_timeout
# (08006), and the call ends, rather than waiting on the shard to cancel
{
	my $pm = (split /\n/, slurp_file($shards->[1]->data_dir . '/postmaster.pid'))[0];
	kill 'STOP', $pm;
	my ($out, $err) = ('', '');
	$router->psql('postgres', "\\set VERBOSITY verbose\nSELECT payidem.get_order('$stories->[1]{o}')",
		stdout => \$out, stderr => \$err, timeout => 60);
	kill 'CONT', $pm;
	like($err, qr/ERROR:  08006: shard 1 \(database "postgres"\) cannot be reached.*DETAIL:  timeout expired/s,
		'hung shard: a new connection gives up after connect_timeout, 08006');
}

# a call lost mid-flight (the shard's backend terminated while it waits on a
# lock) is 08006 in the shard's words, without the shard's internals
{
	my $lost = $router->background_psql('postgres', on_error_stop => 0);
	$lost->query_safe("SELECT payidem.get_order('$stories->[1]{o}') IS NOT NULL");
	my $blocker = $shards->[1]->background_psql('postgres');
	$blocker->query_safe('BEGIN');
	$blocker->query_safe('LOCK TABLE payidem.payment IN ACCESS EXCLUSIVE MODE');
	$lost->query_until(qr/go/, "\\echo go\n\\set VERBOSITY verbose\nSELECT payidem.apply_payment_result('$stories->[1]{p}', 'callback', 'succeeded', 'TXN-two-1', 1000);\n");
	ok($shards->[1]->poll_query_until('postgres', q{
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			 WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT payidem.apply_payment_result%'}),
		'lost call: the shard backend waiting for the lock is terminated');
	$lost->query('SELECT 1');
	like($lost->{stderr}, qr/ERROR:  08006: the connection to shard 1 \(database "postgres"\) was lost during the call\nDETAIL:  terminating connection due to administrator command\n/,
		'lost call: 08006, the DETAIL the shard\'s own words');
	unlike($lost->{stderr}, qr/payidem\.payment|PL\/pgSQL|QUERY:/, 'lost call: ... no internals of the shard');
	$lost->quit;
	$blocker->query_safe('ROLLBACK');
	$blocker->quit;
}

# a shard that is down: calls routed to it fail clearly, the others work
$shards->[1]->stop('fast');
$kept->query("\\set VERBOSITY verbose\n$order_on_1");
like($kept->{stderr}, qr/ERROR:  08006: shard 1 \(database "postgres"\) cannot be reached/,
	'kept session: with the shard down, its idle connection is found closed and the shard unreachable (08006)');
unlike($kept->{stderr}, qr/lost during the call/, 'kept session: ... not a call lost');
$kept->{stderr} = '';	# (BackgroundPsql keeps an error's text for the next query)
my $down_port = $shards->[1]->port;
my ($ok, $out, $err) = try_sql($router, "\\set VERBOSITY verbose\nSELECT payidem.close_payment('$stories->[1]{p}')");
ok(!$ok && $err =~ /ERROR:  08006: shard 1 \(database "postgres"\) cannot be reached/
	  && $err =~ /DETAIL:.*(PGSQL\.|port )$down_port\b.*failed/
	  && $err !~ /REMOTE|PL\/Proxy/,
	'down shard: a call routed to it is 08006 naming the shard and its connection')
  or diag($err);
($ok, $out, $err) = try_sql($router, "SELECT payidem.create_order('$home->{1}{no}', 'OUT-DOWN', 500, 'Tea')");
ok(!$ok && $err =~ /Connection refused|connection to server/, 'down shard: new orders of its merchants fail');
my $o = $router->safe_psql('postgres', "SELECT payidem.create_order('$home->{0}{no}', 'OUT-UP', 500, 'Tea')");
like($o, qr/^PO\d{14}00\d{8}$/, 'down shard: orders of the other shard are still taken');
my $p = $router->safe_psql('postgres', "SELECT payidem.begin_payment('$o', 'WX_001')");
is($router->safe_psql('postgres', "SELECT payidem.apply_payment_result('$p', 'callback', 'succeeded', 'TXN-UP', 500)"),
	'applied', 'down shard: callbacks for the other shard are still applied');
is($router->safe_psql('postgres', 'SELECT string_agg(ok::text, \',\' ORDER BY partition) FROM payidem.cluster_check()'),
	'true,false', 'down shard: cluster_check reports it');
($ok, $out, $err) = try_sql($router, "SELECT * FROM payidem.reconcile('WX_001', '2026-11-28')");
ok(!$ok, 'down shard: reconcile (all shards) fails rather than report partial counts');
$shards->[1]->start;
is($router->safe_psql('postgres', "SELECT payidem.refund('$stories->[1]{p}', 300, 'RF-1')"),
	$stories->[1]{r}, 'shard back: calls routed to it work again');
is($kept->query_safe($order_on_1), $stories->[1]{o}, 'shard back: the kept session reaches it again');

# a call cut off on the router (statement_timeout) while its shard works
# cancels it there and drops its connection; the session's next call works
{
	my $blocker = $shards->[1]->background_psql('postgres');
	$blocker->query_safe('BEGIN');
	$blocker->query_safe('LOCK TABLE payidem.payment IN ACCESS EXCLUSIVE MODE');
	$kept->query("SET statement_timeout = '500ms'");
	$kept->query("SELECT payidem.apply_payment_result('$stories->[1]{p}', 'callback', 'succeeded', 'TXN-two-1', 1000)");
	like($kept->{stderr}, qr/canceling statement due to statement timeout/,
		'cut off: a call waiting on its shard ends with the router\'s statement_timeout');
	$kept->{stderr} = '';
	ok($shards->[1]->poll_query_until('postgres', q{
			SELECT count(*) = 0 FROM pg_stat_activity
			 WHERE wait_event_type = 'Lock' AND query LIKE '%apply_payment_result%'}),
		'cut off: ... and the shard\'s statement is cancelled, not left waiting');
	$blocker->query_safe('ROLLBACK');
	$blocker->quit;
	$kept->query_safe('RESET statement_timeout');
	is($kept->query_safe("SELECT payidem.apply_payment_result('$stories->[1]{p}', 'callback', 'succeeded', 'TXN-two-1', 1000)"),
		'duplicate', 'cut off: the next call of the session works (a paid payment: duplicate)');
}

# ---------------------------------------------------------------- 2 grow to 4
# Orders in flight (made, their payments begun, not paid) when the cluster
# grows; every merchant made before keeps its shard.
my @shards = @$shards;
my $day = $router->safe_psql('postgres', q{SELECT (now() AT TIME ZONE 'UTC')::date});
my $paid_at = $router->safe_psql('postgres',
	q{SELECT to_char(date_trunc('second', now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS"+00"')});
my @before = split /\n/, $router->safe_psql('postgres',
	'SELECT merchant_no || \'|\' || partition FROM payidem.merchant_placement ORDER BY merchant_no');
my @in_flight;
for my $part (0, 1)
{
	my $m = $home->{$part}{no};
	my $fo = $router->safe_psql('postgres', "SELECT payidem.create_order('$m', 'FLIGHT-$part', 800, 'in flight')");
	push @in_flight, { part => $part, m => $m, o => $fo,
		p => $router->safe_psql('postgres', "SELECT payidem.begin_payment('$fo', 'WX_001')") };
}
# merchants whose hash over 4 partitions is not their placement over 2: the
# ones a hash-only router would move
my @movers = grep { my ($m, $part) = split /\|/; $router->safe_psql('postgres', "SELECT hashtext('$m') & 3") != $part } @before;
cmp_ok(scalar(@movers), '>', 0, 'grow: some merchants would hash elsewhere over 4 partitions');

# idempotency keys made before the growth whose hash over 4 partitions is
# not their partition over 2: one still processing, one completed, and one
# first claimed after the growth
my ($key_processing, $key_completed, $key_after, $key_race) = split /,/, $router->safe_psql('postgres', q{
	SELECT string_agg(k, ',' ORDER BY i)
	  FROM (SELECT i, 'grow:key:' || i AS k FROM generate_series(1, 60) i) x
	 WHERE hashtext(k) & 1 <> hashtext(k) & 3});
my %key_home = map { $_ => [ split /\|/, $router->safe_psql('postgres', "SELECT (hashtext('$_') & 1) || '|' || (hashtext('$_') & 3)") ] }
	$key_processing, $key_completed, $key_after, $key_race;
$router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key_processing', 'pay', 'PO1', 'WX_001', 100)");
$router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key_race', 'pay', 'PO1', 'WX_001', 100)");
$router->safe_psql('postgres', qq{SELECT * FROM payidem.idem_record('$key_completed', 'pay', 'PO1', 'WX_001', 100, '{"n": 1}')});

my $bindings = $shards[0]->safe_psql('postgres', 'SELECT count(*) FROM payidem.merchant_channel');
my @new = map { new_node("grow_shard$_") } 2 .. 3;
$_->safe_psql('postgres', 'CREATE EXTENSION payidem') for @new;	# add_shards prepares them
my $conns = join(', ', map { sprintf(q{'host=%s port=%d dbname=postgres connect_timeout=5'}, $_->host, $_->port) } @new);

# add_shards waits for a router transaction that decided a key's partition
# with the count of before
my $claimer = $router->background_psql('postgres');
$claimer->query_safe('BEGIN');
$claimer->query_safe("SELECT * FROM payidem.idem_claim('grow:key:open', 'pay', 'PO1', 'WX_001', 100)");
my ($grew, undef, $grow_err) = try_sql($router, "SET lock_timeout = '500ms'; SELECT * FROM payidem.add_shards($conns)");
ok(!$grew && $grow_err =~ /lock timeout/, 'grow: add_shards() waits for an open transaction that claimed a key')
	or diag($grow_err);
is($router->safe_psql('postgres', 'SELECT payidem.cluster_partitions()'), 2, 'grow: ... and, given up, changed nothing');
$claimer->query_safe('COMMIT');
$claimer->quit;
# the growth itself, with an idempotency claim that comes while add_shards()
# waits for its lock: the claim decides its key's partition after the growth
# committed (today's count, and the look where the count before put the key)
my $waiting = sub {
	my ($n) = @_;
	return $router->poll_query_until('postgres', qq{
		SELECT count(*) = $n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = 'postgres'});
};
$router->safe_psql('postgres', 'CREATE TABLE grow_out (what text PRIMARY KEY, result text)');
my $holder = $router->background_psql('postgres');
$holder->query_safe('BEGIN');
$holder->query_safe('LOCK TABLE payidem.partition_growth IN ACCESS EXCLUSIVE MODE');
my $grower = $router->background_psql('postgres');
$grower->query_until(qr/go/, qq{\\echo go
INSERT INTO grow_out SELECT 'grow', string_agg(partition || ' ' || kind || ' ' || added, ',' ORDER BY partition, kind)
  FROM payidem.add_shards($conns) WHERE partition >= 2;
});
ok($waiting->(1), 'grow: add_shards() waits for the growth lock');
my $racer = $router->background_psql('postgres');
$racer->query_until(qr/go/, qq{\\echo go
INSERT INTO grow_out SELECT 'claim', outcome FROM payidem.idem_claim('$key_race', 'pay', 'PO1', 'WX_001', 100);
});
ok($waiting->(2), 'grow: ... and an idempotency claim waits behind it');
$holder->query_safe('COMMIT');
ok($router->poll_query_until('postgres', 'SELECT count(*) = 2 FROM grow_out'), 'grow: ... both finish once the lock is free');
$_->quit for ($holder, $grower, $racer);
is($router->safe_psql('postgres', "SELECT result FROM grow_out WHERE what = 'grow'"),
	join(',', map { ("$_ bindings $bindings", "$_ channels 2", "$_ configs 1", "$_ merchants " . scalar(@before),
					 "$_ secrets " . scalar(@before)) } 2, 3),
	'grow: add_shards() adds two partitions and copies every merchant, secret, channel, configuration and binding');
is($router->safe_psql('postgres', "SELECT result FROM grow_out WHERE what = 'claim'"), 'in_progress',
	'grow: the claim that waited for the growth finds its key where it was made (in progress), not a new one');
push @shards, @new;
is($router->safe_psql('postgres',
		'SELECT string_agg(shard_id::text, \',\' ORDER BY partition) FILTER (WHERE ok) FROM payidem.cluster_check()'),
	'0,1,2,3', 'grow: cluster_check sees 4 shards in line, each with shard_id = its partition');
is($router->safe_psql('postgres', "SELECT count(*) FROM payidem.add_shards($conns) WHERE added + changed + removed > 0"),
	0, 'grow: add_shards() again adds no partition and changes nothing');
is($router->safe_psql('postgres', 'SELECT payidem.cluster_partitions()'), 4, 'grow: ... the cluster still has 4 partitions');
for my $i (2, 3)
{
	is($shards[$i]->safe_psql('postgres', "SELECT payidem.sign('$home->{0}{no}', 'payload')"),
		$shards[0]->safe_psql('postgres', "SELECT payidem.sign('$home->{0}{no}', 'payload')"),
		"grow: new shard $i signs with the merchant's secret (sealed with its own key)");
	is($shards[$i]->safe_psql('postgres', q{SELECT payidem.get_channel_config('WX_001') ->> 'app_id'}),
		'wx1', "grow: new shard $i decrypts the channel configuration");
}

# idempotency keys made before the growth are found where they are
is($router->safe_psql('postgres', "SELECT outcome FROM payidem.idem_claim('$key_processing', 'pay', 'PO1', 'WX_001', 100)"),
	'in_progress', 'grow: a key still processing from before the growth is in progress, not claimed again');
is($router->safe_psql('postgres', "SELECT outcome || ' ' || (result ->> 'n') FROM payidem.idem_claim('$key_completed', 'pay', 'PO1', 'WX_001', 100)"),
	'replay 1', 'grow: a key completed before the growth replays its result');
like(error_of($router, "SELECT * FROM payidem.idem_claim('$key_completed', 'pay', 'PO1', 'WX_001', 999)"),
	qr/^ERROR:  PI001: idempotency key reused with a different amount/, 'grow: ... and its reuse with another amount is PI001');
is($router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key_after', 'pay', 'PO1', 'WX_001', 100)"),
	'claimed|processing||1', 'grow: a key first claimed after the growth is claimed');
for my $k ($key_processing, $key_completed, $key_after, $key_race)
{
	my $home = $k eq $key_after ? $key_home{$k}[1] : $key_home{$k}[0];
	is(join(',', map { count_on($shards[$_], 'idempotency', 'idem_key', $k) } 0 .. 3),
		join(',', map { $_ == $home ? 1 : 0 } 0 .. 3), "grow: key $k is on partition $home alone");
	is($router->safe_psql('postgres', "SELECT payidem.idem_partition('$k')"), $home,
		"grow: ... and idem_partition() says so");
}
$router->safe_psql('postgres', 'SELECT payidem.idem_purge()');
is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.partition_growth WHERE settled_at IS NULL AND partitions_before = 2 AND partitions_after = 4'),
	1, 'grow: the growth is recorded, and not settled while keys made before it are left');
# once no shard holds a key made before the growth, keys go by today's hash alone
$_->safe_psql('postgres', 'DELETE FROM payidem.idempotency') for @shards;
$router->safe_psql('postgres', "SELECT payidem.idem_purge('0')");
is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.partition_growth WHERE settled_at IS NULL'),
	0, 'grow: idem_purge() settles the growth once no key made before it is left');
$router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key_processing', 'pay', 'PO1', 'WX_001', 100)");
is(join(',', map { count_on($shards[$_], 'idempotency', 'idem_key', $key_processing) } 0 .. 3),
	join(',', map { $_ == $key_home{$key_processing}[1] ? 1 : 0 } 0 .. 3),
	'grow: ... after which a key is claimed where today\'s hash puts it');

# every merchant made before keeps its partition, and its repeated
# create_order returns its original order
is($router->safe_psql('postgres',
		'SELECT string_agg(merchant_no || \'|\' || partition, E\'\\n\' ORDER BY merchant_no) FROM payidem.merchant_placement'),
	join("\n", @before), 'grow: no merchant was moved');
for my $st (@$stories)
{
	my $m = $home->{ $st->{part} }{no};
	is($router->safe_psql('postgres',
			"SELECT payidem.create_order('$m', 'OUT-$st->{part}', 1000, 'Green tea', 'https://shop.example/notify')"),
		$st->{o}, "grow: a repeated create_order of merchant $m returns its original order");
}
for my $f (@in_flight)
{
	is($router->safe_psql('postgres', "SELECT payidem.create_order('$f->{m}', 'FLIGHT-$f->{part}', 800, 'in flight')"),
		$f->{o}, "grow: ... and of its order in flight");
	is($router->safe_psql('postgres',
			"SELECT payidem.apply_payment_result('$f->{p}', 'callback', 'succeeded', 'TXN-FLIGHT-$f->{part}', 800, '$paid_at')"),
		'applied', "grow: the payment in flight on shard $f->{part} is paid after the growth");
	is($shards[ $f->{part} ]->safe_psql('postgres', "SELECT status FROM payidem.\"order\" WHERE order_no = '$f->{o}'"),
		'paid', "grow: ... on its shard");
}

# new merchants spread over all four partitions; a story on each new shard
my %home4;
for my $k (1 .. 60)
{
	my ($m, $part) = split /\|/, $router->safe_psql('postgres', qq{
		SELECT m.merchant_no || '|' || payidem.merchant_partition(m.merchant_no)
		  FROM payidem.create_merchant('Grown Shop $k', 'retail', 0.006) m});
	$home4{$part} //= $m;
	last if keys(%home4) == 4;
}
is(join(',', sort keys %home4), '0,1,2,3', 'grow: new merchants are placed on all four partitions');
my @grown;
for my $part (2, 3)
{
	my $m = $home4{$part};
	$router->safe_psql('postgres', "SELECT payidem.bind_channel('$m', 'WX_001')");
	my $go = $router->safe_psql('postgres', "SELECT payidem.create_order('$m', 'NEW-$part', 2000, 'Oolong')");
	is(substr($go, 16, 2) + 0, $part, "grow: a new merchant placed on partition $part has its orders there");
	my $gp = $router->safe_psql('postgres', "SELECT payidem.begin_payment('$go', 'WX_001')");
	is($router->safe_psql('postgres',
			"SELECT payidem.apply_payment_result('$gp', 'callback', 'succeeded', 'TXN-NEW-$part', 2000, '$paid_at')"),
		'applied', "grow: ... paid through the router");
	is($shards[$part]->safe_psql('postgres', "SELECT status FROM payidem.\"order\" WHERE order_no = '$go'"),
		'paid', "grow: ... on new shard $part");
	push @grown, { part => $part, o => $go, p => $gp };
}
# a router session kept open since before the growth routes its C calls over
# the four partitions (the change of server payidem reached it)
is($kept->query_safe("SELECT payidem.get_order('$grown[-1]{o}')->>'order_no'"), $grown[-1]{o},
	'grow: a router session open since before the growth reaches a new shard (get_order)');
is($kept->query_safe(q{SELECT count(DISTINCT substr(payidem.gen_order_no(), 17, 2)) FROM generate_series(1, 64)}),
	4, 'grow: ... and its gen_order_no() draws from all four partitions');
$kept->quit;

# a half-failed write of reference data is repaired by sync_shards()
$shards[3]->stop('fast');
($ok, $out, $err) = try_sql($router, q{SELECT * FROM payidem.create_merchant('Half Shop', 'retail', 0.006)});
ok(!$ok && $err =~ /was created on partition 0 but not copied to every shard/, 'repair: create_merchant with a shard down fails')
  or diag($err);
my $half = $shards[0]->safe_psql('postgres', q{SELECT merchant_no FROM payidem.merchant WHERE merchant_name = 'Half Shop'});
($ok, $out, $err) = try_sql($router, qq{SELECT payidem.rotate_merchant_secret('$home->{1}{no}')});
ok(!$ok && $err =~ /was made on partition 0 but not copied/, 'repair: rotate_merchant_secret with a shard down fails')
  or diag($err);
$shards[3]->start;
is($router->safe_psql('postgres', q{
	SELECT string_agg(partition || ' ' || kind || ' +' || added, ',' ORDER BY partition, kind)
	  FROM payidem.sync_shards() WHERE added > 0}),
	join(',', map { ("$_ merchants +1", "$_ secrets +2") } 1 .. 3),
	'repair: sync_shards() copies the half-made merchant and the half-rotated secret to the shards that missed them'
	. ' (PL/Proxy wrote them on none when one was down)');
is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.sync_shards() WHERE added + changed + removed > 0'), 0,
	'repair: ... and a second run finds every shard in line');
is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.cluster_check() WHERE NOT ok'), 0,
	'repair: ... and cluster_check is content');
# a merchant closed on one shard only is not reopened by the copy
$shards[2]->safe_psql('postgres', "SELECT payidem.close_merchant('$half')");
is(error_of($router, 'SELECT * FROM payidem.sync_shards()'),
	"ERROR:  PI002: merchant $half is closed\n"
	. "DETAIL:  merchant '$half': 'closed' -> 'active' is not allowed\n"
	. "HINT:  It is closed on shard 2: close it everywhere through the router (payidem.close_merchant('$half')), then repeat.",
	'repair: sync_shards() refuses to reopen a merchant closed on a shard, in the words of set_merchant_status');
$router->safe_psql('postgres', "SELECT payidem.close_merchant('$half')");
is($router->safe_psql('postgres', 'SELECT count(*) FROM payidem.sync_shards() WHERE added + changed + removed > 0'), 0,
	'repair: ... and, once it is closed through the router, every shard is in line');

$router->safe_psql('postgres', "SELECT payidem.rotate_merchant_secret('$home->{1}{no}')");
is(join(',', map { $_->safe_psql('postgres', "SELECT payidem.sign('$home->{1}{no}', 'p')") } @shards),
	join(',', ($shards[0]->safe_psql('postgres', "SELECT payidem.sign('$home->{1}{no}', 'p')")) x 4),
	'repair: ... after which a rotation through the router reaches every shard');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM payidem.merchant WHERE merchant_no = '$half'") } @shards),
	'1,1,1,1', 'repair: the half-made merchant is on every shard');
# ---- a bill with and without our payment numbers: a line without one is
# matched through its transaction id on the shard where its success was
# applied (the router's placement), none is looked up on every shard
my @bill;
for my $st (@$stories)
{
	push @bill, "WX_001,$day,TXN-two-$st->{part},,1000,2,refunded,$paid_at";	# no payment number
}
push @bill, "WX_001,$day,TXN-FLIGHT-$_->{part},$_->{p},800,2,succeeded,$paid_at" for @in_flight;
push @bill, "WX_001,$day,TXN-NEW-$grown[0]{part},$grown[0]{p},2000,4,succeeded,$paid_at";
push @bill, "WX_001,$day,TXN-NEW-$grown[1]{part},,2000,4,succeeded,$paid_at";		# no payment number
push @bill, "WX_001,$day,TXN-UP,,500,1,succeeded,$paid_at";						# paid while shard 1 was down
push @bill, "WX_001,$day,TXN-NOBODY,,555,1,succeeded,$paid_at";					# no such payment
# the success after its order was closed (an anomaly), by number
my ($late_pay, $late_status) = split /\|/, $shards[1]->safe_psql('postgres',
	q{SELECT payment_no || '|' || status FROM payidem.payment WHERE transaction_id = 'TX-LATE-two'});
push @bill, "WX_001,$day,TX-LATE-two,$late_pay,400,1,$late_status,$paid_at";
my $bill = join("\n", 'channel_no,bill_date,transaction_id,payment_no,amount,fee,status,paid_at', @bill);
is($router->safe_psql('postgres', "SELECT payidem.load_bill('WX_001', '$day', \$csv\$$bill\$csv\$)"),
	scalar(@bill), 'bills: load_bill through the router loads every line once');
is(join(',', map { $_->safe_psql('postgres', "SELECT count(*) FROM payidem.channel_bill WHERE bill_date = '$day'") } @shards),
	'4,3,1,1', 'bills: each line reached the shard of its payment, by number or by transaction id (unknown: partition 0)');
is($router->safe_psql('postgres', qq{
	SELECT concat_ws(',', matched, platform_only, channel_only, amount_mismatch, status_mismatch)
	  FROM payidem.reconcile('WX_001', '$day')}),
	'8,0,1,0,0', 'bills: reconcile matches all 8 payments, with or without their numbers; the unknown line is channel_only');
# the views of one database, on the router: every shard's rows, summed where they count
my $sum_of = sub {
	my ($sql) = @_;
	my $t = 0;
	$t += $_->safe_psql('postgres', $sql) for @shards;
	return $t;
};
for my $view ([ 'open_differences', 'count(*)' ], [ 'open_anomalies', 'count(*)' ],
	[ 'notification_backlog', 'coalesce(sum(events), 0)' ],
	[ 'recon_summary', "sum(matched + channel_only) FILTER (WHERE channel_no = 'WX_001' AND bill_date = '$day')" ])
{
	my ($name, $agg) = @$view;
	my $sql = "SELECT $agg FROM payidem.$name";
	my $sum = $sum_of->($sql);
	cmp_ok($sum, '>', 0, "views: the shards have rows for $name");
	is($router->safe_psql('postgres', $sql), $sum,
		"views: $name on the router shows every shard's rows ($agg)");
}
is($router->safe_psql('postgres', qq{
	SELECT concat_ws(',', matched, channel_only, open_count) FROM payidem.recon_summary
	 WHERE channel_no = 'WX_001' AND bill_date = '$day'}),
	'8,1,1', "views: recon_summary on the router: one row for the channel's day, the shards' counts summed");
is($router->safe_psql('postgres', 'SELECT payidem.purge_transaction_placement()'), 0,
	'bills: purge_transaction_placement keeps placements younger than 90 days');
like(error_of($router, q{SELECT payidem.purge_transaction_placement('1 hour')}), qr/^ERROR:  22023: invalid retention/,
	'bills: ... and refuses a retention under a day');

# ---- every API function through the router: the same result, or the same
# error (SQLSTATE, message, DETAIL, HINT, byte for byte), as on the one
# database it reaches
my $n = 4;
my $m0 = $home->{0}{no};
my $unknown = sub { my ($prefix) = @_; with_check($prefix . '20240101000000' . sprintf('%02d', $n - 1) . '000067') };
my ($uo, $up, $ur) = map { $unknown->($_) } qw(PO PY RF);
my $key3 = 'rt:key3';
$router->safe_psql('postgres', "SELECT * FROM payidem.idem_claim('$key3', 'pay', 'PO1', 'WX_001', 100)");
my $key3_home = $router->safe_psql('postgres', "SELECT hashtext('$key3') & 3");
my $m0_hash = $router->safe_psql('postgres', "SELECT hashtext('$m0') & 3");
my $api_key0 = $home->{0}{key};
my $sig = $router->safe_psql('postgres', "SELECT payidem.sign('$m0', 'payload')");
# [call on the router, the shard it reaches, the same call there if it differs]
my @errors = (
	[ "SELECT payidem.apply_payment_result('$up', 'callback', 'paid')", $n - 1 ],
	[ "SELECT payidem.apply_refund_result('$ur', 'succeeded')", $n - 1 ],
	[ "SELECT payidem.begin_payment('$uo', 'WX_001')", $n - 1 ],
	[ "SELECT payidem.bind_channel('$m0', 'NO_SUCH')", 0 ],
	[ "SELECT payidem.close_merchant('nobody')", 0 ],
	[ "SELECT payidem.close_order('$uo')", $n - 1 ],
	[ "SELECT payidem.close_payment('PY123')", 0 ],
	[ "SELECT payidem.create_channel('bad code', 'wechat', 0.1)", 0 ],
	[ "SELECT * FROM payidem.create_merchant('', 'retail', 0.006)", 0 ],
	[ "SELECT payidem.create_order('$m0', 'T-0', -5, 's')", 0 ],
	[ "SELECT payidem.find_order('$m0', NULL)", 0 ],
	[ "SELECT payidem.freeze_merchant(NULL)", 0 ],
	[ "SELECT payidem.unfreeze_merchant('nobody')", 0 ],
	[ "SELECT payidem.set_merchant_status('$m0', 'asleep')", 0 ],
	[ "SELECT payidem.gen_order_no('p0')", 0 ],
	[ "SELECT payidem.gen_order_no_for('$home4{3}', 'p0')", 3, "SELECT payidem.gen_order_no('p0')" ],
	[ "SELECT payidem.get_channel_config('NO_SUCH')", 0 ],
	[ "SELECT payidem.get_order('PO123')", 0 ],
	[ "SELECT * FROM payidem.idem_claim('$key3', 'pay', 'PO1', 'WX_001', 999)", $key3_home ],
	[ "SELECT * FROM payidem.idem_record('$key3', 'pay', 'PO1', 'WX_001', 999, '{}')", $key3_home ],
	[ "SELECT payidem.idem_finish('$key3', 'sleeping')", $key3_home ],
	[ "SELECT payidem.idem_purge(NULL)", 0 ],
	[ "SELECT payidem.load_bill('NO_SUCH', '$day', '')", 0 ],
	[ "SELECT * FROM payidem.notify_due(0)", 0 ],
	[ "SELECT * FROM payidem.notify_due_on(0, 0)", 0, "SELECT * FROM payidem.notify_due(0)" ],
	[ "SELECT payidem.notify_result(" . (123456 * 100 + $n - 1) . ", true)", $n - 1 ],
	[ "SELECT payidem.order_no_make('PO', now(), 100, 1)", 0 ],
	[ "SELECT * FROM payidem.order_no_parse('PO123')", 0 ],
	[ "SELECT * FROM payidem.query_due(NULL)", 0 ],
	[ "SELECT * FROM payidem.reconcile('NO_SUCH', '2001-01-01')", 0 ],
	[ "SELECT payidem.refund('$up', 100, 'RF-X')", $n - 1 ],
	[ "SELECT payidem.resolve_anomaly(-5, 'handled')", 0 ],
	[ "SELECT payidem.resolve_diff(NULL, 'handled')", 0 ],
	[ "SELECT payidem.rotate_merchant_secret('nobody')", 0 ],
	[ "SELECT payidem.route_channel('$m0', 'nosuchtype')", $m0_hash ],
	[ "SELECT payidem.set_channel_config('WX_001', '[]')", 0 ],
	[ "SELECT payidem.set_channel_status('WX_001', 'asleep')", 0 ],
	[ "SELECT payidem.sign('nobody', 'x')", 0 ],
	[ "SELECT payidem.transit_order('$uo', 'paid')", $n - 1 ],
	[ "SELECT payidem.transit_payment('$up', 'closed')", $n - 1 ],
	[ "SELECT payidem.transit_refund('$ur', 'failed')", $n - 1 ],
	[ "SELECT payidem.unbind_channel('$m0', 'NO_SUCH')", 0 ],
	[ "SELECT payidem.verify_notification('$api_key0', 'payload', 'v1=00', NULL)", 0 ],
	[ "SELECT payidem.load_merchant_secret('$m0', '../etc/passwd')", 0 ],
	[ "SELECT payidem.load_channel_config('WX_001', '../etc/passwd')", 0 ],
	# settlement (DESIGN section 11): settle on every partition, a merchant's
	# payouts, adjustments and balance on its own, a payout result on the
	# partition its number names
	[ "SELECT * FROM payidem.settle(NULL)", 0 ],
	[ "SELECT payidem.request_payout('$m0', -1, 'PAY-1')", 0 ],
	[ "SELECT payidem.apply_payout_result('PT123', 'succeeded')", 0 ],
	[ "SELECT payidem.adjust_balance('$m0', 0, 'ADJ-1', 'nothing')", 0 ],
	[ "SELECT * FROM payidem.balance('$m0', 'cny')", 0 ],
	[ "SELECT payidem.set_merchant_notify_url('nobody', NULL)", 0 ],
	# what an application reads and follows up (DESIGN section 7)
	[ "SELECT * FROM payidem.apply_payment_result_ex('$up', 'callback', 'paid')", $n - 1 ],
	[ "SELECT payidem.list_orders('$m0', NULL, 0)", 0 ],
	[ "SELECT payidem.list_orders('nobody')", 0 ],
	[ "SELECT payidem.list_anomalies(NULL, NULL, 0)", 0 ],
	[ "SELECT payidem.list_differences('NO_SUCH')", 0 ]);
like($router->safe_psql('postgres', "SELECT payidem.gen_order_no_for('$home4{3}', 'PY')"), qr/^PY\d{14}03\d{8}$/,
	'api: gen_order_no_for(merchant) issues a number on the shard of the merchant\'s orders');
my @results = (
	[ "SELECT payidem.order_no_valid('$stories->[1]{p}')::text || payidem.order_no_valid('PY1')::text", 0 ],
	[ "SELECT payidem.order_no_make('PO', '2024-01-01 00:00:00+00', 3, 67)", 0 ],
	[ "SELECT row(p.*)::text FROM payidem.order_no_parse('$stories->[1]{o}') p", 0 ],
	[ "SELECT payidem.get_order('$stories->[1]{o}')::text", 1 ],
	[ "SELECT payidem.find_order('$home->{1}{no}', 'OUT-1')::text", 1 ],
	[ "SELECT payidem.sign('$m0', 'payload')", 0 ],
	[ "SELECT payidem.verify_signature('$api_key0', 'payload', '$sig')::text", 0 ],
	[ "SELECT payidem.verify_notification('$api_key0', 'payload', 't=1,v1=00')::text", 0 ],
	[ "SELECT payidem.get_channel_config('WX_001')::text", 0 ],
	[ "SELECT payidem.route_channel('$m0', 'wechat')", 0 ],
	[ "SELECT string_agg(name, ',') FROM payidem.stats()", 0 ],
	[ "SELECT payidem.reencrypt_secrets()", 0 ],
	[ "SELECT string_agg(name, ',') FROM payidem.stats_by_shard() WHERE shard = 0",
	  0, "SELECT string_agg(name, ',') FROM payidem.stats()" ],
	[ "SELECT row(b.*)::text FROM payidem.balance('$m0') b", 0 ],
	[ "SELECT count(*) FROM payidem.verify()", 0 ],
	[ "SELECT row(r.*)::text FROM payidem.apply_payment_result_ex('$stories->[1]{p}', 'query', 'succeeded', 'TXN-two-1', 1000) r", 1 ],
	[ "SELECT string_agg(x ->> 'order_no', ',') FROM payidem.list_orders('$home->{1}{no}', max_rows => 1000) x", 1 ],
	[ "SELECT payidem.health() -> 'shards' -> 2 ->> 'shard_id'", 2, "SELECT payidem.health() ->> 'shard_id'" ]);
for my $case (@errors)
{
	my ($call, $where, $there) = @$case;
	my $on_shard = error_of($shards[$where], $there // $call);
	isnt($on_shard, 'no error', "api: the call fails on one database: " . ($there // $call));
	is(error_of($router, $call), $on_shard, "api: ... and through the router with the same words: $call");
}
for my $case (@results)
{
	my ($call, $where, $there) = @$case;
	is($router->safe_psql('postgres', $call), $shards[$where]->safe_psql('postgres', $there // $call),
		"api: the same result through the router as on one database: $call");
}
# the work queues through the router: every shard's rows, merged by id and
# cut to the page; health() is ok only if every shard is
for my $q ([ 'list_anomalies', 'anomaly_id' ], [ 'list_differences', 'recon_id' ])
{
	my ($fn, $id) = @$q;
	my $ids = "SELECT coalesce(string_agg(x ->> '$id', ',' ORDER BY (x ->> '$id')::bigint), '')"
		. " FROM payidem.$fn(handle_status => NULL, max_rows => 1000) x";
	my @all = sort { $a <=> $b } map { split /,/, $_->safe_psql('postgres', $ids) } @shards;
	cmp_ok(scalar(@all), '>', 1, "api: the shards have rows for $fn");
	is($router->safe_psql('postgres', $ids), join(',', @all), "api: $fn through the router lists every shard's rows");
	is($router->safe_psql('postgres', "SELECT string_agg(x ->> '$id', ',') FROM payidem.$fn(handle_status => NULL, max_rows => 2) x"),
		join(',', @all[0, 1]), "api: ... a page of 2 is the first two ids of them all");
	is($router->safe_psql('postgres',
			"SELECT string_agg(x ->> '$id', ',') FROM payidem.$fn(after => $all[0], handle_status => NULL, max_rows => 1000) x"),
		join(',', @all[1 .. $#all]), "api: ... and the page after the first id the rest");
}
is($router->safe_psql('postgres', q{
	SELECT jsonb_array_length(h -> 'shards') || ' ' || (h ->> 'status')
		   || ' ' || (h ->> 'open_anomalies') FROM payidem.health() h}),
	"$n " . (join('', map { $_->safe_psql('postgres', "SELECT payidem.health() ->> 'status'") } @shards) eq ('ok' x $n)
			 ? 'ok' : 'degraded') . ' ' . $sum_of->(q{SELECT payidem.health() ->> 'open_anomalies'}),
	'api: health() through the router: every shard, ok only if each is, the open anomalies summed');
# the lists cover every API function of the router that reaches a shard
# (sync_shards and add_shards exist on the router only)
my %called = map { $_ => 1 } map { /payidem\.(\w+)\(/g } map { $_->[0] } @errors, @results;
is($router->safe_psql('postgres', q{
	SELECT coalesce(string_agg(p.proname, ',' ORDER BY p.proname), '')
	  FROM pg_proc p
	 WHERE p.pronamespace = 'payidem'::regnamespace AND p.proname !~ '^_'
	   AND p.proname NOT IN ('sync_shards', 'add_shards')
	   AND EXISTS (SELECT 1 FROM pg_proc q WHERE q.pronamespace = p.pronamespace AND q.proname = '_proxy_' || p.proname)}),
	join(',', sort grep { $_ ne 'sync_shards' && $_ ne 'add_shards' } keys %called),
	'api: the calls above cover every API function of the router');

$_->stop for ($router, @shards);

done_testing();
