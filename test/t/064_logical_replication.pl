# Logical replication of a whole database: a publication FOR ALL TABLES of a
# populated payidem database (the story of 062_backup_restore: every status,
# refunds, anomalies, a bill, a DBA's own whitelist rows), subscribed by a
# second server with payidem installed and housekeeping off, as
# docs/operations.md describes for an upgrade by logical replication.
#
# The subscriber's CREATE EXTENSION made the built-in whitelist rows, and its
# own trigger makes the payment keys from the payments it receives; the
# publication carries both too.  Every table must reach the ready state, the
# log must hold no error, every payidem table must be the same on both sides
# (row counts and checksums, the keys and the DBA's rows included) after the
# initial copy, after more payments, refunds and a close on the publisher, and
# after the keys are rebuilt (and one key table truncated) there; after the
# switch-over the docs describe (the sequences' values copied), the former
# subscriber's own writes continue above the copied rows, and it still
# refuses what the guards refuse.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemStory;
use IPC::Run ();
use Time::HiRes ();

my $t0 = Time::HiRes::time();
my $orders = 200;

# the same master key on both sides: the secrets arrive sealed with it
# (housekeeping is off on both, as on every node of payidem_node(): on the
# subscriber as docs/operations.md asks, and on the publisher so that
# nothing changes its tables between a catch-up and the comparison)
my $pub = payidem_node('lr_pub', key_byte => '7e', init => { allows_streaming => 'logical' }, conf => "fsync = off\n");
my $sub = payidem_node('lr_sub', key_byte => '7e', conf => "fsync = off\n");

$pub->safe_psql('postgres', 'CREATE DATABASE shop');
$pub->safe_psql('shop', 'CREATE EXTENSION payidem;' . story_sql($orders));
$pub->safe_psql('shop', 'CREATE PUBLICATION shop_all FOR ALL TABLES');

# the subscriber: payidem, and the application's own tables (a subscription
# copies rows, not the schema)
$sub->safe_psql('postgres', 'CREATE DATABASE shop');
$sub->safe_psql('shop', 'CREATE EXTENSION payidem');
my ($schema, $err);
IPC::Run::run([ 'pg_dump', '--schema-only', '--table=public.bk_*', '-d', $pub->connstr('shop') ], '>', \$schema, '2>', \$err)
  or die "pg_dump: $err";
$sub->safe_psql('shop', $schema);

my $log_start = -s $sub->logfile;
(my $conninfo = $pub->connstr('shop')) =~ s/'/''/g;
$sub->safe_psql('shop', "CREATE SUBSCRIPTION shop_all CONNECTION '$conninfo' PUBLICATION shop_all");
ok( $sub->poll_query_until('shop', q{SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')}),
	'every table of the publication reaches the ready state (the built-in whitelist rows and the keys among them)')
  or diag($sub->safe_psql('shop', q{SELECT string_agg(srrelid::regclass::text || ' ' || srsubstate::text, ', ') FROM pg_subscription_rel}));
$pub->wait_for_catchup('shop_all');

my $sums_sql = table_sums_sql();
my $tables = () = $pub->safe_psql('shop', $sums_sql) =~ /\n/g;
$tables++;
is($sub->safe_psql('shop', $sums_sql), $pub->safe_psql('shop', $sums_sql),
	"after the initial copy: all $tables payidem tables the same on both sides (keys, whitelist, the DBA's rows)");

# more work on the publisher: a new order paid and partly refunded, a pending
# one closed, a paid one shipped by the DBA's transition, a second success
# (a duplicate), a payment that fails and the order paid by another channel
$pub->safe_psql('shop', q{
	SELECT payidem.apply_payment_result(payidem.begin_payment(o, 'BK_WX'), 'callback', 'succeeded', 'TX-LR-1', 777)
	  FROM (SELECT payidem.create_order(merchant_no, 'LR-1', 777, 'after the copy') AS o FROM bk_merchant) x;
	SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 77, 'LR-R1'), 'succeeded')
	  FROM payidem.payment p WHERE p.transaction_id = 'TX-LR-1';
	SELECT payidem.apply_payment_result(p.payment_no, 'query', 'succeeded', 'TX-LR-1', 777)
	  FROM payidem.payment p WHERE p.transaction_id = 'TX-LR-1';
	SELECT payidem.close_order(min(order_no)) FROM payidem."order" WHERE status = 'pending';
	SELECT payidem.transit_order(min(order_no), 'shipping') FROM payidem."order" WHERE status = 'paid';
	WITH o AS (SELECT payidem.create_order(merchant_no, 'LR-2', 888, 'second channel') AS o FROM bk_merchant),
	     f AS (SELECT o, payidem.apply_payment_result(payidem.begin_payment(o, 'BK_WX'), 'query', 'failed') FROM o)
	SELECT payidem.apply_payment_result(payidem.begin_payment(o, 'BK_ALI'), 'callback', 'succeeded', 'TX-LR-2', 888) FROM f;
});
$pub->wait_for_catchup('shop_all');
is($sub->safe_psql('shop', $sums_sql), $pub->safe_psql('shop', $sums_sql),
	"after more payments, refunds, a close and a transition: all $tables payidem tables the same on both sides");
is($sub->safe_psql('shop', q{SELECT count(*) FROM payidem.payment_paid WHERE transaction_id IN ('TX-LR-1', 'TX-LR-2')}),
	'2', 'the subscriber\'s keys hold the new transaction ids (made once, by its own trigger)');
is($sub->safe_psql('shop', log_disagreements_sql()), '0',
	'subscriber: the latest status_log row of every entity is its current status');

# the keys rebuilt on the publisher, and one key table truncated there and
# rebuilt: the subscriber keeps (or makes again) the keys of its payments.
# payment_paid has rows (payment_pending, the story's attempts all ended,
# has none): without keys_truncated the subscriber's would stay empty, as
# the publisher's rebuilt rows are skipped there.
my $paid_keys = $pub->safe_psql('shop', 'SELECT count(*) FROM payidem.payment_paid');
cmp_ok($paid_keys, '>', 0, "the publisher's payment_paid has rows to truncate ($paid_keys)");
$pub->safe_psql('shop', 'SELECT payidem.rebuild_payment_keys()');
$pub->safe_psql('shop', 'TRUNCATE payidem.payment_paid');
$pub->safe_psql('shop', 'SELECT payidem.rebuild_payment_keys()');
$pub->wait_for_catchup('shop_all');
is($sub->safe_psql('shop', 'SELECT count(*) FROM payidem.payment_paid'), $paid_keys,
	'the subscriber made its payment_paid again after the replicated TRUNCATE');
is($sub->safe_psql('shop', $sums_sql), $pub->safe_psql('shop', $sums_sql),
	"after rebuild_payment_keys() and a TRUNCATE of payment_paid on the publisher: all $tables tables the same");

my $log = slurp_file($sub->logfile, $log_start);
my @errors = $log =~ /^.*(?:ERROR|conflict detected).*$/mg;
is(scalar(@errors), 0, 'the subscriber logged no error and no conflict')
  or diag(join("\n", @errors[ 0 .. ($#errors < 9 ? $#errors : 9) ]));

# the switch-over as docs/operations.md writes it: the sequences' values
# from the publisher, the subscription dropped; then the subscriber's own
# writes continue above the copied rows
my $setvals = $pub->safe_psql('shop', q{
	SELECT format('SELECT pg_catalog.setval(%L, %s);', format('%I.%I', schemaname, sequencename), last_value)
	  FROM pg_sequences WHERE last_value IS NOT NULL});
$sub->safe_psql('shop', $setvals);
$sub->safe_psql('shop', 'DROP SUBSCRIPTION shop_all');
my $max_log = $pub->safe_psql('shop', 'SELECT max(log_id) FROM payidem.status_log');
my $max_no = $pub->safe_psql('shop', q{SELECT max(substr(n, 3, 22)) FROM (
	SELECT order_no FROM payidem."order" UNION ALL SELECT payment_no FROM payidem.payment) x(n)});
my ($new_order, $applied) = split /\|/, $sub->safe_psql('shop', q{
	WITH o AS (SELECT payidem.create_order(merchant_no, 'LR-AFTER', 999, 'on the new server') AS o FROM bk_merchant)
	SELECT o, payidem.apply_payment_result(payidem.begin_payment(o, 'BK_WX'), 'callback', 'succeeded', 'TX-LR-AFTER', 999) FROM o});
is($applied, 'applied', 'after the switch-over: an order created and paid on the former subscriber');
ok(substr($new_order, 2, 22) gt $max_no, 'its number is above every copied one');
is($sub->safe_psql('shop', qq{SELECT count(*) FROM payidem.status_log WHERE log_id <= $max_log AND entity_no = '$new_order'}),
	'0', 'its status_log rows come after the copied ones');
is($sub->safe_psql('shop', log_disagreements_sql()), '0',
	'... and the latest status_log row of every entity is still its current status');

# the subscriber still refuses what the guards refuse, its keys included
guards_hold($sub, 'shop', 'subscriber');

diag(sprintf('064 figures: %d orders; %d payidem tables replicated FOR ALL TABLES, equal on both sides; %.1f s',
		$orders, $tables, Time::HiRes::time() - $t0));
$sub->stop;
$pub->stop;
done_testing();
