# The upgrade path, walked from the first release every time (as
# pg_stat_statements' oldextversions test does):
#
#   1. a database installs payidem 1.0 (its frozen install script) and is
#      filled with the story of every table (PayidemStory);
#   2. ALTER EXTENSION payidem UPDATE TO each version on the path from 1.0 to
#      the default one, one step at a time: after each step the rows of every
#      table are the same (row counts and checksums, in the columns the table
#      had before the step; the whitelist's built-in rows are the empty
#      database's business, below), so is the expiry queue, and
#      the old version's SQL keeps working on the new shared library (a library
#      change that an old version's SQL would call wrongly fails here);
#   3. every guarantee still holds on the upgraded database: the refusals of
#      the state machines, the log and the constraints, a status that agrees with
#      its log, the books' invariants, and the API (a new order paid, an old
#      callback a duplicate, new numbers above the old ones); the history 1.0
#      recorded is reconciled and settled (each paid payment settled or held,
#      each refund settled, verify() clean, a payout of the balance);
#   4. the upgraded schema is compared with a fresh install of the default
#      version: pg_dump --schema-only --binary-upgrade (which, unlike a plain
#      dump, writes every object of the extension), without its OIDs and
#      transaction ids — identical;
#   5. a 1.0 log with a log_id on two rows (a sequence set back) stops the
#      update to 1.1 with what to do; README's renumbering block, run as it is
#      written there, lets it through with every history in order.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemStory;

my $node = payidem_node('upgrade', conf => "fsync = off\n");
my $first = '1.0';
my $default = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'payidem'});
my @path = split /--/, $node->safe_psql('postgres', qq{
	SELECT path FROM pg_extension_update_paths('payidem') WHERE source = '$first' AND target = '$default'});
ok(@path >= 2, "an update path from $first to the default version $default: @path");
is( $node->safe_psql('postgres', qq{
	SELECT string_agg(version, ',' ORDER BY version) FROM pg_available_extension_versions WHERE name = 'payidem'}),
	join(',', sort @path), 'every version there is lies on that path');

# ---------------------------------------------------------------- 1. the first release, with a story
$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
# an application's role and an auditor, granted what 1.0 grants them: what a
# later version grants them reaches them when the grants are run again after
# the update (as CHANGELOG says), never as the extension's own privileges
$node->safe_psql('postgres', 'CREATE ROLE up_app; CREATE ROLE up_auditor');
my $grants = q{SELECT payidem.grant_app('up_app'); SELECT payidem.grant_auditor('up_auditor');};
$node->safe_psql('upgraded', "CREATE EXTENSION payidem VERSION '$first';" . story_sql(300) . $grants);
# and a database updated as soon as it was made, with nothing in it: every row
# the install scripts write (the built-in whitelist) and every sequence as a
# fresh install has them
$node->safe_psql('postgres', 'CREATE DATABASE updated_empty');
$node->safe_psql('updated_empty', "CREATE EXTENSION payidem VERSION '$first'");
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'payidem'}),
	$first, "installed as $first");
my $sums = $node->safe_psql('upgraded', table_sums_sql());
my $queue = $node->safe_psql('upgraded', expiry_queue_sql());
my %rows = map { my @f = split /\|/; ($f[0] => $f[1]) } split /\n/, $sums;
# A step may add columns to a table (read as they were before the step,
# up_columns) and its built-in whitelist rows (compared by the empty database
# below, with a fresh install's); every row the story wrote, the DBA's
# whitelist rows with them, must be what it was.
my %whitelist = (state => 'NOT x.builtin', transition => 'NOT x.builtin');
cmp_ok(scalar(grep { $rows{$_} > 0 } keys %rows), '>=', 14,
	'the story fills the tables (' . scalar(keys %rows) . ' tables)');
my $max_before = $node->safe_psql('upgraded', q{SELECT max(substr(n, 3, 22)) FROM (
	SELECT order_no FROM payidem."order" UNION ALL SELECT payment_no FROM payidem.payment
	UNION ALL SELECT refund_no FROM payidem.refund) x(n)});

# ---------------------------------------------------------------- 2. one step at a time
for my $i (1 .. $#path)
{
	my ($from, $to) = @path[ $i - 1, $i ];
	$node->safe_psql('upgraded', columns_sql('up_columns'));
	$sums = $node->safe_psql('upgraded', table_sums_sql(rows => \%whitelist));
	$node->safe_psql($_, "ALTER EXTENSION payidem UPDATE TO '$to'") for qw(upgraded updated_empty);
	is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'payidem'}),
		$to, "updated $from -> $to");
	is($node->safe_psql('upgraded', table_sums_sql(columns_of => 'up_columns', rows => \%whitelist)), $sums,
		"$to: every table of $from has the same rows (in its columns of $from)");
	is($node->safe_psql('upgraded', expiry_queue_sql()), $queue, "$to: the expiry queue is the same");
	# (the SQL of $from ran on this library before the step: the story, and the
	# calls below on the step before) the SQL of this version calls the
	# library: a payment through the C fast path, a claim
	my $o = $node->safe_psql('upgraded', qq{SELECT payidem.create_order(merchant_no, 'UP-$to', 700, 'step $to') FROM bk_merchant});
	my $p = $node->safe_psql('upgraded', qq{SELECT payidem.begin_payment('$o', 'BK_WX')});
	is($node->safe_psql('upgraded', qq{SELECT payidem.apply_payment_result('$p', 'callback', 'succeeded', 'TXUP-$to', 700)}),
		'applied', "$to: a payment is applied");
	is($node->safe_psql('upgraded', qq{SELECT outcome FROM payidem.idem_claim('up:$to', 'test', '$o', 'BK_WX', 700)}),
		'claimed', "$to: a key is claimed");
	# keep the story's expiry queue for the next step
	$queue = $node->safe_psql('upgraded', expiry_queue_sql());
}
# what the CHANGELOG tells a DBA to do after the update: the grants again
# (the update grants nothing: a GRANT of an extension's script would be the
# extension's own, which pg_dump leaves out), so that the roles reach what
# the new version gives them
$node->safe_psql('upgraded', $grants);
is($node->safe_psql('upgraded', 'SELECT payidem.library_version()'), $default,
	'the library is the default version, and the upgraded SQL reaches it');

# ---------------------------------------------------------------- 3. every guarantee on the upgraded database
guards_hold($node, 'upgraded', 'upgraded');
is($node->safe_psql('upgraded', log_disagreements_sql()), '0',
	'upgraded: the latest status_log row of every entity is its current status');
# the books (DESIGN 5): a paid order names a paid payment of its own; a paid
# payment has its bookkeeping; refunded amounts are the sums of the refunds
is( $node->safe_psql('upgraded', q{
	SELECT count(*) FROM payidem."order" o
	 WHERE o.status IN ('paid', 'partially_refunded', 'refunded', 'shipping')
	   AND (o.paid_at IS NULL OR NOT EXISTS (
			SELECT 1 FROM payidem.payment p WHERE p.payment_no = o.paid_payment_no AND p.order_no = o.order_no
			   AND p.status IN ('succeeded', 'partially_refunded', 'refunded')))}),
	'0', 'upgraded: every paid order names a paid payment of its own');
is( $node->safe_psql('upgraded', q{
	SELECT count(*) FROM payidem.payment p
	 WHERE p.status IN ('succeeded', 'partially_refunded', 'refunded')
	   AND (p.transaction_id IS NULL OR p.paid_at IS NULL OR p.fee_amount IS NULL OR p.cost_amount IS NULL)}),
	'0', 'upgraded: every paid payment has its transaction id, paid_at, fee and cost');
is( $node->safe_psql('upgraded', q{
	SELECT count(*) FROM payidem.payment p
	 WHERE p.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
	                              WHERE r.payment_no = p.payment_no AND r.status = 'succeeded')
	    OR (p.status = 'partially_refunded') <> (p.refunded_amount > 0 AND p.refunded_amount < p.amount)
	    OR (p.status = 'refunded') <> (p.refunded_amount = p.amount)}),
	'0', 'upgraded: refunded amounts and statuses agree with the refunds');
is( $node->safe_psql('upgraded', q{
	SELECT count(*) FROM (SELECT payment_no FROM payidem.payment WHERE status = 'pending'
	                      EXCEPT SELECT payment_no FROM payidem.payment_pending) x}),
	'0', "upgraded: the payments' keys are there");

my $old_paid = $node->safe_psql('upgraded', q{SELECT payment_no FROM bk_payment WHERE i = 2});
is( $node->safe_psql('upgraded', qq{SELECT payidem.apply_payment_result('$old_paid', 'callback', 'succeeded',
	'TX$old_paid', (SELECT amount FROM payidem.payment WHERE payment_no = '$old_paid'))}),
	'duplicate', 'upgraded: a callback applied before the upgrade is a duplicate');
is($node->safe_psql('upgraded', q{SELECT outcome FROM payidem.idem_claim('bk:open', 'test', 'BK-1', 'BK_WX', 5)}),
	'in_progress', 'upgraded: a key claimed before the upgrade is still held');
ok($node->safe_psql('upgraded', q{SELECT substr(payidem.gen_order_no('PO'), 3, 22)}) gt $max_before,
	'upgraded: new numbers are above every number from before');

# ---------------------------------------------------------------- the books of what 1.0 recorded
# 1.0 kept no books: the update's settlement starts from its history.  The
# story's payments and refunds (each channel's bill of every day 1.0 made
# payments on, loaded and reconciled) are settled by the first settle(),
# which reads the whole history (settle_state has no scan point yet).
is($node->safe_psql('upgraded', verify_sql()), '', 'upgraded: verify() finds nothing wrong in what 1.0 recorded');
is($node->safe_psql('updated_empty', verify_sql()), '', 'updated with nothing in it: verify() finds nothing');
my $paid_sql = q{p.status IN ('succeeded', 'partially_refunded', 'refunded')};
my ($days, $paid_count, $refund_count) = split /\|/, $node->safe_psql('upgraded', qq{
	SELECT (SELECT count(DISTINCT (p.channel_no, (p.paid_at AT TIME ZONE 'UTC')::date)) FROM payidem.payment p WHERE $paid_sql),
	       (SELECT count(*) FROM payidem.payment p WHERE $paid_sql),
	       (SELECT count(*) FROM payidem.refund WHERE status = 'succeeded')});
$node->safe_psql('upgraded', books_sql());
is($node->safe_psql('upgraded', q{SELECT count(*) FROM payidem.reconciliation
	WHERE handle_status = 'open' AND diff_type <> 'channel_only'}), '0',
	"upgraded: 1.0's payments of $days channel days reconciled against their bills, no difference left but the orphan line");
is($node->safe_psql('upgraded', qq{SELECT count(*) FROM payidem.payment p WHERE $paid_sql
	AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item s WHERE s.item_no = p.payment_no)
	AND NOT EXISTS (SELECT 1 FROM payidem.settlement_hold h WHERE h.payment_no = p.payment_no)}), '0',
	"upgraded: each of 1.0's $paid_count paid payments is settled or held");
my ($held, $held_open) = split /\|/, $node->safe_psql('upgraded', q{
	SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM payidem.anomaly a
	                                                 WHERE a.payment_no = h.payment_no AND a.handle_status = 'open'))
	  FROM payidem.settlement_hold h});
ok($held > 0 && $held == $held_open, "upgraded: the $held held are those an open anomaly names (paid after their order closed)");
is($node->safe_psql('upgraded', q{SELECT count(*) FROM payidem.refund r WHERE r.status = 'succeeded'
	AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item s WHERE s.item_no = r.refund_no)}), '0',
	"upgraded: each of 1.0's $refund_count succeeded refunds is settled");
is($node->safe_psql('upgraded', q{
	SELECT b.available = (SELECT sum(CASE s.item_type WHEN 'payment' THEN s.amount - s.fee ELSE s.fee - s.amount END)
	                        FROM payidem.settlement_item s WHERE s.merchant_no = m.merchant_no)
	       AND b.available > 0 AND b.in_payout = 0
	       AND b.pending = (SELECT sum(p.amount - p.fee_amount) FROM payidem.settlement_hold h
	                          JOIN payidem.payment p USING (payment_no) WHERE p.merchant_no = m.merchant_no)
	  FROM bk_merchant m, payidem.balance(m.merchant_no) b}), 't',
	'upgraded: the merchant\'s balance() is what was settled (available) and what is held (pending)');
is($node->safe_psql('upgraded', verify_sql()), '', 'upgraded and settled: verify() finds nothing wrong');
is($node->safe_psql('upgraded', q{SELECT coalesce(sum(items), 0) FROM payidem.settle(current_date + 7)}), '0',
	'upgraded: settle() again settles nothing again');
my $available = $node->safe_psql('upgraded', q{SELECT b.available FROM bk_merchant m, payidem.balance(m.merchant_no) b});
refused($node, 'upgraded', qq{SELECT payidem.request_payout(merchant_no, $available + 1, 'UP-PAYOUT-0') FROM bk_merchant},
	'PI010', 'upgraded: a payout of more than the settled balance');
is($node->safe_psql('upgraded', qq{SELECT payidem.apply_payout_result(payidem.request_payout(merchant_no, $available, 'UP-PAYOUT-1'),
	'succeeded') FROM bk_merchant}), 'applied', 'upgraded: the whole settled balance is paid out');
is($node->safe_psql('upgraded', verify_sql()), '', 'upgraded, settled and paid out: verify() finds nothing wrong');

# a role 1.0 let be both an application role and a merchant's reporting role:
# the update refuses nothing retroactively, names it in a WARNING, and
# get_order() refuses it from then on (42501)
$node->safe_psql('postgres', 'CREATE DATABASE both_roles');
$node->safe_psql('postgres', 'CREATE ROLE up_both');
$node->safe_psql('both_roles', qq{CREATE EXTENSION payidem VERSION '$first';
	SELECT count(*) FROM payidem.create_merchant('Both', 'retail', 0.006);
	SELECT payidem.grant_app('up_both');
	SELECT payidem.map_merchant_role('up_both', (SELECT merchant_no FROM payidem.merchant));});
my ($both_rc, $both_out, $both_err) = $node->psql('both_roles', 'ALTER EXTENSION payidem UPDATE');
is($both_rc, 0, 'a role that is both: the update goes through');
like($both_err, qr/WARNING:  role up_both is both an application role and a reporting role of a merchant\nDETAIL:  Role up_both reads the rows of merchant '[^']+' and may execute payidem\.\w+\(/,
	'... and names the role in a WARNING');
is($node->safe_psql('both_roles', q{SELECT count(*) FROM payidem.merchant_role WHERE role = 'up_both'::regrole}),
	'1', '... whose mapping it keeps');
my $both_order = $node->safe_psql('both_roles',
	q{SELECT payidem.create_order(merchant_no, 'BOTH-1', 100, 'both') FROM payidem.merchant});
($both_rc, $both_out, $both_err) = $node->psql('both_roles',
	qq{\\set VERBOSITY verbose\nSET ROLE up_both;\nSELECT payidem.get_order('$both_order');});
like($both_err, qr/ERROR:  42501: role up_both cannot be both an application role and a reporting role of a merchant/,
	'... and get_order() refuses it');

# ---------------------------------------------------------------- 4. the same schema as a fresh install
$node->safe_psql('upgraded', 'DROP TABLE bk_merchant, bk_order, bk_payment, up_columns');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION payidem');
is($node->safe_psql('updated_empty', table_sums_sql()), $node->safe_psql('fresh', table_sums_sql()),
	'updated with nothing in it: every table holds what a fresh install holds (the built-in whitelist)');
# the tables whose rows pg_dump dumps (pg_extension_config_dump), and which rows
my $config_sql = q{SELECT string_agg(c::regclass::text || ' ' || coalesce(nullif(w, ''), 'all rows'), E'\n' ORDER BY c::regclass::text)
	  FROM pg_extension e, unnest(e.extconfig, e.extcondition) u(c, w) WHERE e.extname = 'payidem'};
my $config = $node->safe_psql('fresh', $config_sql);
like($config, qr/payidem\.state WHERE NOT builtin/, 'the config tables of a fresh install are read');
is($node->safe_psql('upgraded', $config_sql), $config, 'upgraded: the same tables dumped, with the same conditions');
my $fresh_bare = schema_of('fresh', 1);
$node->safe_psql('fresh', $grants);
is($node->safe_psql('fresh', q{SELECT extversion FROM pg_extension WHERE extname = 'payidem'}), $default,
	"fresh install at $default");

# every object of the extension, without what differs between any two
# databases: OIDs, relfilenodes, frozen xids (binary-upgrade lines), where the
# sequences stand (unless $sequences, but for order_no_hwm), pg_dump's own header (the story's own
# tables are gone)
sub schema_of
{
	my ($db, $sequences) = @_;
	my ($out, $err);
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump of $db failed: $err";
	my @keep;
	for my $line (split /\n/, $out)
	{
		# (binary_upgrade_set_record_init_privs stays: it tells a privilege the
		# extension's scripts recorded from one given later)
		next if $line =~ /^SELECT pg_catalog\.binary_upgrade_(set_next_|create_empty_extension\(|set_missing_value\()|^-- For binary upgrade, |^SET relfrozenxid = |^WHERE oid = '\d+';$|^-- Dumped (from|by) |^\\(un)?restrict /;
		# (order_no_hwm is a time: the second of the last number issued)
		next if (!$sequences || $line =~ /'payidem\.order_no_hwm'/)
		  && $line =~ /^SELECT pg_catalog\.setval\('payidem\.[a-z0-9_"]+', -?\d+, (true|false)\);$/;
		push @keep, $line;
	}
	my $text = join("\n", @keep);
	$text =~ s/\n{3,}/\n\n/g;
	return $text;
}
# same_schema(got, want, name): equal, or fail showing the difference
sub same_schema
{
	my ($got, $want, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return pass($name) if $got eq $want;
	fail($name);
	my $dir = PostgreSQL::Test::Utils::tempdir();
	for ([ 'want', $want ], [ 'got', $got ])
	{
		open(my $fh, '>', "$dir/$_->[0].sql") or die;
		print $fh $_->[1];
		close $fh;
	}
	IPC::Run::run([ 'diff', '-u', "$dir/want.sql", "$dir/got.sql" ], '>', \my $d);
	diag(substr($d // '', 0, 6000));
	return 0;
}
same_schema(schema_of('updated_empty', 1), $fresh_bare,
	'updated with nothing in it: the fresh schema, where every sequence stands too');
my $upgraded = schema_of('upgraded');
my $fresh = schema_of('fresh');
like($fresh, qr/CREATE FUNCTION payidem\.apply_payment_result/, 'the dump writes the extension\'s objects');
like($fresh, qr/ALTER EXTENSION payidem ADD/, '... as members of the extension');
my $objects = () = $fresh =~ /ALTER EXTENSION payidem ADD/g;
same_schema($upgraded, $fresh, "the upgraded schema is the fresh $default schema ($objects objects)");

# ---------------------------------------------------------------- 5. a log_id used twice
# 1.1 keys status_log by log_id alone.  Under 1.0 a sequence set back (a copy
# or switch-over without its setval) made payidem write log_ids already used,
# for other entities, which the old key let in: the update stops with what to
# do, and goes through once README's block (run here as it is written there)
# has renumbered the rows, each entity's history in the order it was written
# and the log's guard as it must stand.
$node->safe_psql('postgres', 'CREATE DATABASE dup_log');
$node->safe_psql('dup_log', "CREATE EXTENSION payidem VERSION '$first'");
my $log_row = sub {
	my ($no, $from, $to) = @_;
	$node->safe_psql('dup_log', "INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
		VALUES ('order', '$no', " . ($from ? "'$from'" : 'NULL') . ", '$to')");
};
$log_row->('PO-A', undef, 'pending');
$log_row->('PO-A', 'pending', 'paid');
$log_row->('PO-A', 'paid', 'refunded');
# (a number used by a transaction rolled back: the set-back's first row takes it)
$node->safe_psql('dup_log', q{BEGIN; SELECT nextval('payidem.status_log_log_id_seq'); ROLLBACK});
$log_row->('PO-B', undef, 'pending');
$log_row->('PO-B', 'pending', 'paid');
$node->safe_psql('dup_log', q{SELECT setval('payidem.status_log_log_id_seq', 3)});
my $set_back_at = $node->safe_psql('dup_log', q{SELECT clock_timestamp()});
$log_row->('PO-B', 'paid', 'refunded');
$log_row->('PO-C', undef, 'pending');
# a transaction that began before another's rows and wrote after them
my $early = $node->background_psql('dup_log');
$early->query_safe('BEGIN; SELECT txid_current()');
$log_row->('PO-D', undef, 'pending');
$early->query_safe(q{INSERT INTO payidem.status_log (entity, entity_no, from_status, to_status)
	VALUES ('order', 'PO-D', 'pending', 'paid'); COMMIT});
$early->quit;
my ($rc, $out, $err) = $node->psql('dup_log', 'ALTER EXTENSION payidem UPDATE', on_error_stop => 1,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($rc, 0, 'a log_id on two rows: the update is refused');
like($err, qr/ERROR:  23505: payidem\.status_log has rows that share a log_id/, '... with 23505 and what is wrong');
like($err, qr/DETAIL:  Key \(log_id\)=\(\d+\) is duplicated\. Rows share a log_id when written after/, '... the log_id in DETAIL');
like($err, qr/HINT:  Renumber the rows written since the sequence was set back as README\.md shows/, '... and what to do in HINT');
is($node->safe_psql('dup_log', q{SELECT extversion FROM pg_extension WHERE extname = 'payidem'}), $first,
	'... and the extension is left as it was');
my $readme = slurp_file(($ENV{TESTDIR} // ".") . "/README.md");
my ($renumber) = $readme =~ /<!-- status_log renumbering[^\n]*-->\n```sql\n(.*?)```/s;
ok(defined $renumber, "README's renumbering block is found");
$node->safe_psql('dup_log', $renumber =~ s/^\\set set_back_at .*$/\\set set_back_at '$set_back_at'/mr);
is($node->safe_psql('dup_log', q{SELECT extversion FROM pg_extension WHERE extname = 'payidem'}), $default,
	'renumbered as README shows: the update goes through');
is($node->safe_psql('dup_log', q{SELECT string_agg(entity_no || ':' || to_status, ' ' ORDER BY log_id)
	FROM payidem.status_log}), 'PO-A:pending PO-A:paid PO-A:refunded PO-B:pending PO-B:paid PO-B:refunded PO-C:pending PO-D:pending PO-D:paid',
	'... every history in the order it was written');
is($node->safe_psql('dup_log', q{SELECT tgenabled FROM pg_trigger WHERE tgname = 'status_log_append_only'}), 'A',
	'... the log\'s guard enabled ALWAYS, as before');
is($node->safe_psql('dup_log', q{SELECT nextval('payidem.status_log_log_id_seq') > max(log_id) FROM payidem.status_log}), 't',
	'... and the sequence past every log_id');

# a sequence behind the log with no repeat yet: the update puts it past the log
$node->safe_psql('postgres', 'CREATE DATABASE behind_log');
$node->safe_psql('behind_log', "CREATE EXTENSION payidem VERSION '$first'");
$node->safe_psql('behind_log', q{INSERT INTO payidem.status_log (entity, entity_no, to_status)
	SELECT 'order', 'PO-' || i, 'pending' FROM generate_series(1, 5) i;
	SELECT setval('payidem.status_log_log_id_seq', 2)});
$node->safe_psql('behind_log', 'ALTER EXTENSION payidem UPDATE');
is($node->safe_psql('behind_log', q{SELECT nextval('payidem.status_log_log_id_seq')}), '6',
	'a sequence behind the log: the update puts it past the last log_id');

$node->stop;
done_testing();
