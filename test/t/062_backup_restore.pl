# Backup and restore.  A populated database — merchants with secrets,
# channels with encrypted configuration, orders in every status, payments,
# refunds, anomalies, idempotency keys, notifications, channel bills and their
# reconciliation, a flow a DBA added to the whitelist, and the books (settled
# and held items, their journal, balances, payouts in every status, an
# adjustment) — is dumped with
# pg_dump -Fc and restored into a fresh cluster with a plain pg_restore, no
# options (the guards load a restore's COPY, run by the tables' owner, as
# dumped):
#
#   pg_restore -d <db> <dump>
#
# and again the documented way for a parallel restore (the schema, payidem's
# rows with one job, the rest with 4).
#
# Then: every payidem table has the same row count and the same checksum
# (md5 of its rows in the order of their text) on both sides, the journal, the
# balances and the settled items among them, and verify() finds nothing
# wrong; the state-machine triggers are enabled again; the whitelist (also the
# DBA's rows), the append-only log, the journal's check at commit and the
# constraints still refuse illegal changes; secrets still open under the same
# master key; the API keeps working (settle() settles nothing twice, payouts
# go on) and the next numbers are above every restored one.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemStory;
use Time::HiRes ();
use IPC::Run ();

my $t0 = Time::HiRes::time();
my $soak = $ENV{PAYIDEM_SOAK} ? 1 : 0;
my $orders = $soak ? 20000 : 600;

sub new_node
{
	my ($name) = @_;
	# the same master key on both sides: secrets are sealed with it
	return payidem_node($name, key_byte => '7e', conf => "fsync = off\n");
}

my $src = new_node('backup_src');
$src->safe_psql('postgres', 'CREATE DATABASE shop');
$src->safe_psql('shop', 'CREATE EXTENSION payidem;' . story_sql($orders));
# and its books: bills reconciled, items settled (some held), payouts in each
# status, an adjustment -- the journal, the balances and the items a restore
# loads as dumped
$src->safe_psql('shop', books_sql(payouts => 1));
is($src->safe_psql('shop', verify_sql()), '', 'source: verify() finds nothing wrong');
# what an application adds around payidem and a dump carries: grants to its
# roles, and its own table's foreign key to a payidem table
$src->safe_psql('postgres', 'CREATE ROLE bk_app');
$src->safe_psql('shop', q{SELECT payidem.grant_app('bk_app');
	ALTER TABLE bk_order ADD PRIMARY KEY (i), ADD FOREIGN KEY (order_no) REFERENCES payidem."order" (order_no);});

my $sums_sql = table_sums_sql();
my $queue_sql = expiry_queue_sql();
my $sums_src = $src->safe_psql('shop', $sums_sql);
my %src_rows = map { my @f = split /\|/; ($f[0] => $f[1]) } split /\n/, $sums_src;
my $tables = scalar(keys %src_rows);
my $nonempty = grep { $src_rows{$_} > 0 } keys %src_rows;
cmp_ok($nonempty, '>=', 22, "source: $nonempty of $tables payidem tables hold rows");
ok((grep { ($src_rows{$_} // 0) > 0 } qw(ledger_entry merchant_balance settlement_item settlement_hold payout adjustment))
	== 6, "source: the books hold rows (ledger_entry $src_rows{ledger_entry}, merchant_balance $src_rows{merchant_balance}, "
	  . "settlement_item $src_rows{settlement_item}, settlement_hold $src_rows{settlement_hold}, payout $src_rows{payout}, "
	  . "adjustment $src_rows{adjustment})");
is(scalar(grep { !/^[^|]+\|\d+\|[0-9a-f]{32}$/ } split /\n/, $sums_src), 0, 'source: a row count and an md5 for every table');
my ($statuses) = $src->safe_psql('shop', q{SELECT string_agg(DISTINCT status, ',' ORDER BY status) FROM payidem."order"});
is($statuses, 'closed,paid,partially_refunded,pending,refunded,shipping', "source: orders in every status ($statuses)");
my ($api_key, $api_secret_sig) = split /\|/, $src->safe_psql('shop',
	q{SELECT api_key, payidem.sign(merchant_no, 'amount=1') FROM bk_merchant});

# ---------------------------------------------------------------- dump + restore
my $dump = PostgreSQL::Test::Utils::tempdir() . '/shop.dump';
command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('shop') ], 'pg_dump -Fc of the populated database');

my $dst = new_node('backup_dst');
$dst->safe_psql('postgres', 'CREATE ROLE bk_app');
$dst->safe_psql('postgres', 'CREATE DATABASE shop_restored');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $dst->connstr('shop_restored'), $dump ],
	'a plain pg_restore, no options');

my $sums_dst = $dst->safe_psql('shop_restored', $sums_sql);
is($src->safe_psql('shop', q{SELECT count(*) FROM payidem.merchant_role}), '1',
	'source: the dropped role is still mapped (by OID)');
is($dst->safe_psql('shop_restored', q{SELECT count(*) FROM payidem.merchant_role}), '0',
	'restored: the dropped role\'s mapping was left out of the dump');
is($sums_dst, $sums_src, "all $tables payidem tables: same row counts and checksums after the restore");
my %dst_sums = map { my @f = split /\|/; ($f[0] => "$f[1] $f[2]") } split /\n/, $sums_dst;
my %src_sums = map { my @f = split /\|/; ($f[0] => "$f[1] $f[2]") } split /\n/, $sums_src;
is($dst_sums{$_}, $src_sums{$_}, "restored: $_ round-trips ($src_rows{$_} rows, same checksum)")
  for qw(merchant_balance ledger_entry settlement_item);
is($dst->safe_psql('shop_restored', verify_sql()), '', 'restored: verify() finds nothing wrong');
my $queue_src = $src->safe_psql('shop', $queue_sql);
like($queue_src, qr/^[1-9]\d* /, "source: pending orders in the expiry queue ($queue_src)");
is($dst->safe_psql('shop_restored', $queue_sql), $queue_src,
	'restored: the expiry queue made again, a row per pending order at its expire_at');
is($dst->safe_psql('shop_restored', q{SELECT count(*) FROM payidem.order_expiry}),
	$src->safe_psql('shop', q{SELECT count(*) FROM payidem."order" WHERE status = 'pending'}),
	'... and nothing else');
if ($sums_dst ne $sums_src)
{
	my %d = map { my @f = split /\|/; ($f[0] => "$f[1] $f[2]") } split /\n/, $sums_dst;
	for (split /\n/, $sums_src)
	{
		my @f = split /\|/;
		diag("differs: $f[0] source $f[1] rows, restored $d{$f[0]}") if ($d{ $f[0] } // '') ne "$f[1] $f[2]";
	}
}
is($dst->safe_psql('shop_restored', q{SELECT count(*) FROM bk_order}), $orders, 'the application table came along');

# ---------------------------------------------------------------- a parallel restore
# A plain `pg_restore -j N` loads payidem's tables side by side, and their
# foreign keys exist from CREATE EXTENSION on, so a table can load before the
# table it references (a PostgreSQL limitation for every extension whose
# tables have foreign keys).  The documented way (docs/state-machines.md):
# the schema first, payidem's rows with one job, the rest with N.
$dst->safe_psql('postgres', 'CREATE DATABASE shop_parallel');
my $par = $dst->connstr('shop_parallel');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $par, '--section=pre-data', $dump ],
	'parallel restore, 1/4: the schema and its grants (pre-data)');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $par, '--section=data', '--schema=payidem', $dump ],
	'parallel restore, 2/4: payidem\'s rows with one job');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $par, '--section=data', '--exclude-schema=payidem', '--jobs=4', $dump ],
	'parallel restore, 3/4: every other row with 4 jobs');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $par, '--section=post-data', '--jobs=4', $dump ],
	'parallel restore, 4/4: indexes and constraints with 4 jobs');
is($dst->safe_psql('shop_parallel', $sums_sql), $sums_src,
	"parallel restore: all $tables payidem tables have the same row counts and checksums");
is($dst->safe_psql('shop_parallel', $queue_sql), $src->safe_psql('shop', $queue_sql),
	'parallel restore: the expiry queue made again');
is($dst->safe_psql('shop_parallel', log_disagreements_sql()), '0',
	'parallel restore: the latest status_log row of every entity is its current status');
is($dst->safe_psql('shop_parallel', verify_sql()), '', 'parallel restore: verify() finds nothing wrong');
my @schema_dump = ('pg_dump', '--schema-only');
my ($plain_schema, $par_schema, $err1, $err2);
IPC::Run::run([ @schema_dump, '-d', $dst->connstr('shop_restored') ], '>', \$plain_schema, '2>', \$err1)
  or die "pg_dump: $err1";
IPC::Run::run([ @schema_dump, '-d', $par ], '>', \$par_schema, '2>', \$err2)
  or die "pg_dump: $err2";
like($plain_schema, qr/GRANT ALL ON FUNCTION payidem\.create_order\(.*\) TO bk_app;/,
	'the plain restore kept grant_app()\'s grants');
like($plain_schema, qr/FOREIGN KEY \(order_no\) REFERENCES payidem\."order"\(order_no\)/,
	'... and the application\'s foreign key to payidem."order"');
# pg_dump fences a plain dump with a random \restrict key of its own
s/^\\(?:un)?restrict \S+$//mg for $plain_schema, $par_schema;
is($par_schema, $plain_schema,
	'parallel restore: the same schema, grants and constraints as the plain restore (pg_dump --schema-only)');
is($dst->safe_psql('shop_parallel', q{SELECT count(*) FROM bk_order}), $orders,
	'parallel restore: the application table came along');

# ---------------------------------------------------------------- guards still on
my $triggers_sql = q{
	SELECT string_agg(c.relname || '.' || t.tgname || ' ' || t.tgenabled::text, ', ' ORDER BY c.relname, t.tgname)
	  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'payidem' AND NOT t.tgisinternal};
is($dst->safe_psql('shop_restored', q{
	SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'payidem' AND NOT t.tgisinternal AND t.tgenabled = 'D'}),
	'0', 'no payidem trigger is disabled after the restore');
is($dst->safe_psql('shop_restored', $triggers_sql), $src->safe_psql('shop', $triggers_sql),
	'every payidem trigger fires as on the source (origin, always or replica)');

guards_hold($dst, 'shop_restored', 'restored');
my $pending = $dst->safe_psql('shop_restored', q{SELECT min(order_no) FROM payidem."order" WHERE status = 'pending'});
my $paid = $dst->safe_psql('shop_restored', q{SELECT min(order_no) FROM payidem."order" WHERE status = 'paid'});
sub refused_here { refused($dst, 'shop_restored', @_); }
# the rows a restore loads, written by an application: refused, by INSERT and
# by COPY (only the tables' owner or a superuser loads them as dumped)
refused_here(qq{INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at, status, paid_at)
	SELECT payidem.gen_order_no('PO'), merchant_no, 'BK-INS', 'x', 100, now() + interval '1 hour', 'paid', now()
	  FROM bk_merchant}, 'PI002', 'an INSERT of a paid order, as a superuser');
$dst->safe_psql('shop_restored', q{CREATE ROLE bk_writer BYPASSRLS;
	GRANT USAGE ON SCHEMA payidem TO bk_writer;
	GRANT INSERT ON payidem.refund TO bk_writer;});
my $copy_line = $dst->safe_psql('shop_restored', q{
	SELECT concat_ws(E'\t', payidem.gen_order_no('RF'), payment_no, order_no, merchant_no, 'BK-COPY', 1, 'succeeded')
	  FROM payidem.payment WHERE status = 'succeeded' LIMIT 1});
my ($copy_rc, $copy_out, $copy_err) = $dst->psql('shop_restored',
	"SET ROLE bk_writer;\nCOPY payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status) FROM stdin;\n$copy_line\n\\.\n");
like($copy_err, qr/ERROR:.*must start in status 'pending'.*HINT:.*If this is a restore, run it as the owner/s,
	'a COPY of a succeeded refund by an application role: refused, with a hint at restores');

# the DBA's flow survived: paid -> shipping allowed, shipping -> pending not
is($dst->safe_psql('shop_restored', qq{SELECT payidem.transit_order('$paid', 'shipping')}), 't',
	'the DBA-added transition paid -> shipping works after the restore');
refused_here(qq{UPDATE payidem."order" SET status = 'pending' WHERE order_no = '$paid'}, 'PI002',
	'shipping -> pending is still refused');
is( $dst->safe_psql('shop_restored', qq{
	SELECT to_status FROM payidem.status_log WHERE entity_no = '$paid' ORDER BY log_id DESC LIMIT 1}),
	'shipping', 'the change was logged');

# ---------------------------------------------------------------- the API on the restored copy
is($dst->safe_psql('shop_restored', q{SELECT payidem.get_channel_config('BK_WX')->>'mch_id'}), '1900000109',
	'channel configuration still opens under the same master key');
is($dst->safe_psql('shop_restored', qq{SELECT payidem.verify_signature('$api_key', 'amount=1', '$api_secret_sig')}), 't',
	'a signature made before the backup still verifies');
my $max_restored = $dst->safe_psql('shop_restored', q{SELECT max(substr(n, 3, 22)) FROM (
	SELECT order_no FROM payidem."order" UNION ALL SELECT payment_no FROM payidem.payment
	UNION ALL SELECT refund_no FROM payidem.refund) x(n)});
my ($new_order, $new_payment, $applied) = split /\|/, $dst->safe_psql('shop_restored', q{
	WITH o AS (SELECT payidem.create_order(merchant_no, 'BK-AFTER', 4321, 'after restore') AS o FROM bk_merchant),
	     p AS (SELECT o, payidem.begin_payment(o, 'BK_WX') AS p FROM o)
	SELECT o, p, payidem.apply_payment_result(p, 'callback', 'succeeded', 'TXAFTER', 4321) FROM p});
is($applied, 'applied', 'a new order is created, started and paid on the restored copy');
ok(substr($new_order, 2, 22) gt $max_restored && substr($new_payment, 2, 22) gt $max_restored,
	'new numbers are above every restored number');
is( $dst->safe_psql('shop_restored', log_disagreements_sql()),
	'0', 'restored copy: the latest status_log row of every entity is its current status');
# a replayed callback from before the backup is still a duplicate
my $old_paid_payment = $dst->safe_psql('shop_restored',
	q{SELECT payment_no FROM bk_payment WHERE i = 2});
is($dst->safe_psql('shop_restored', qq{SELECT payidem.apply_payment_result('$old_paid_payment', 'callback', 'succeeded',
	'TX$old_paid_payment', (SELECT amount FROM payidem.payment WHERE payment_no = '$old_paid_payment'))}),
	'duplicate', 'a callback applied before the backup is a duplicate after the restore');

# ---------------------------------------------------------------- the books on the restored copy
# the journal's rules hold again for every writer but the restore's COPY
refused_here(q{INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('BK-TAMPER-1', 'adjustment', 'CNY', 1, 'BK-TAMPER-1')}, 'PI002',
	'an unbalanced journal entry, as a superuser');
refused_here(q{UPDATE payidem.merchant_balance SET available = available + 1}, 'PI002',
	'a balance moved without its entries, as a superuser');
$dst->safe_psql('shop_restored', q{GRANT INSERT ON payidem.ledger_entry TO bk_writer;
	GRANT USAGE ON SEQUENCE payidem.ledger_entry_entry_id_seq TO bk_writer;});
my ($jrc, $jout, $jerr) = $dst->psql('shop_restored',
	"\\set VERBOSITY verbose\nSET ROLE bk_writer;\nCOPY payidem.ledger_entry (journal_no, account, currency, amount, source_no) FROM stdin;\n"
	  . "BK-TAMPER-2\tadjustment\tCNY\t5\tBK-TAMPER-2\n\\.\n");
like($jerr, qr/ERROR:\s+PI002: journal \S*BK-TAMPER-2\S* does not balance/,
	'a COPY of an unbalanced journal by an application role: refused at commit (PI002)');
# (the payment made on the restored copy above is of a bill day already
# reconciled, with no difference or anomaly naming it: settled by contract)
is($dst->safe_psql('shop_restored', q{SELECT coalesce(sum(items), 0) FROM payidem.settle(current_date + 8)})
	  . ' ' . $dst->safe_psql('shop_restored', q{SELECT string_agg(item_no, ',') FROM payidem.settlement_item
	                                             WHERE settle_date = current_date + 8}),
	"1 $new_payment", 'restored: settle() settles the payment made after the restore, nothing from before the backup again');
my $pending_payout = $dst->safe_psql('shop_restored',
	q{SELECT payout_no FROM payidem.payout WHERE out_payout_no = 'BK-PAYOUT-3'});
is($dst->safe_psql('shop_restored', qq{SELECT payidem.apply_payout_result('$pending_payout', 'succeeded', 'BANK-3')}),
	'applied', 'restored: the payout pending at the backup gets its result');
is($dst->safe_psql('shop_restored', q{SELECT payidem.apply_payout_result(payout_no, 'succeeded', 'BANK-1')
	FROM payidem.payout WHERE out_payout_no = 'BK-PAYOUT-1'}), 'duplicate',
	'restored: a payout result applied before the backup is a duplicate');
is($dst->safe_psql('shop_restored', q{SELECT payidem.request_payout(merchant_no, 1000, 'BK-PAYOUT-1') =
	(SELECT payout_no FROM payidem.payout WHERE out_payout_no = 'BK-PAYOUT-1') FROM bk_merchant}), 't',
	'restored: a payout requested before the backup, requested again, is the same payout');
is($dst->safe_psql('shop_restored', q{SELECT payidem.apply_payout_result(payidem.request_payout(merchant_no, 100, 'BK-PAYOUT-4'),
	'succeeded') FROM bk_merchant}), 'applied', 'restored: a new payout of the restored balance');
is($dst->safe_psql('shop_restored', verify_sql()), '', 'restored and used: verify() finds nothing wrong');

my $total_rows = 0;
$total_rows += $_ for values %src_rows;
diag(sprintf('062 figures: %d orders; %d rows in %d payidem tables dumped and restored with equal checksums; %.1f s',
		$orders, $total_rows, $tables, Time::HiRes::time() - $t0));

$src->stop;
$dst->stop;
done_testing();
