# Backup and restore.  A populated database — merchants with secrets,
# channels with encrypted configuration, orders in every status, payments,
# refunds, anomalies, idempotency keys, notifications, a channel bill and its
# reconciliation, and a flow a DBA added to the whitelist — is dumped with
# pg_dump -Fc and restored into a fresh cluster with a plain pg_restore, no
# options (the guards load a restore's COPY, run by the tables' owner, as
# dumped):
#
#   pg_restore -d <db> <dump>
#
# Then: every payidem table has the same row count and the same checksum
# (md5 of its rows ordered by primary key) on both sides; the state-machine
# triggers are enabled again; the whitelist (also the DBA's rows), the
# append-only log and the constraints still refuse illegal changes; secrets
# still open under the same master key; the API keeps working and the next
# numbers are above every restored one.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes ();

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
$src->safe_psql('shop', qq{
CREATE EXTENSION payidem;
CREATE TABLE bk_merchant AS SELECT * FROM payidem.create_merchant('Backup Shop', 'retail', 0.006);
SELECT payidem.create_merchant('Frozen Shop', 'catering', 0.0038, 'D0');
SELECT payidem.freeze_merchant(merchant_no) FROM payidem.merchant WHERE merchant_name = 'Frozen Shop';
SELECT payidem.rotate_merchant_secret(merchant_no, '1 hour') FROM bk_merchant;
SELECT payidem.create_channel('BK_WX', 'wechat', 0.002);
SELECT payidem.create_channel('BK_ALI', 'alipay', 0.0025, 50, ARRAY['retail']);
SELECT payidem.set_channel_config('BK_WX', '{"mch_id": "1900000109", "api_v3_key": "k3"}');
SELECT payidem.bind_channel(merchant_no, 'BK_WX') FROM bk_merchant;
SELECT payidem.bind_channel(merchant_no, 'BK_ALI', 0.005, 1000000, 100000000) FROM bk_merchant;
-- a flow a DBA added: paid -> shipping
INSERT INTO payidem.state (entity, status) VALUES ('order', 'shipping');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'shipping');
-- a reporting role mapped to the merchant, then dropped the usual way: its
-- row stays in merchant_role until the next mapping call, and must not reach
-- the dump (its regrole would be written as a bare OID)
CREATE ROLE bk_gone;
SELECT payidem.map_merchant_role('bk_gone', merchant_no) FROM bk_merchant;
DROP OWNED BY bk_gone;
DROP ROLE bk_gone;

CREATE TABLE bk_order AS
SELECT i, payidem.create_order(m.merchant_no, 'BK-' || i, 100 + i, 'backup ' || i,
                               CASE WHEN i % 2 = 0 THEN 'https://shop.example/n' END) AS order_no
  FROM bk_merchant m, generate_series(1, $orders) i;
CREATE TABLE bk_payment AS
SELECT o.i, o.order_no, payidem.begin_payment(o.order_no, CASE WHEN o.i % 3 = 0 THEN 'BK_ALI' ELSE 'BK_WX' END) AS payment_no
  FROM bk_order o WHERE o.i % 10 <> 9 ORDER BY o.i;
-- i % 10: 0..5 paid, 6 failed, 7 closed, 8 close_order then paid (anomaly), 9 no attempt
SELECT payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 <= 5 ORDER BY p.i;
SELECT payidem.apply_payment_result(p.payment_no, 'query', 'failed') FROM bk_payment p WHERE p.i % 10 = 6 ORDER BY p.i;
SELECT payidem.close_order(p.order_no) FROM bk_payment p WHERE p.i % 10 IN (7, 8) ORDER BY p.i;
SELECT payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 = 8 ORDER BY p.i;
-- duplicates
SELECT payidem.apply_payment_result(p.payment_no, 'query', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 = 1 ORDER BY p.i;
-- refunds: partial, full, failed, pending
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 10, 'BKR-' || p.i), 'succeeded')
  FROM bk_payment p WHERE p.i % 10 IN (1, 2) ORDER BY p.i;
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 100 + p.i, 'BKRF-' || p.i), 'succeeded')
  FROM bk_payment p WHERE p.i % 10 = 3 ORDER BY p.i;
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 5, 'BKR-' || p.i), 'failed')
  FROM bk_payment p WHERE p.i % 10 = 4 ORDER BY p.i;
SELECT payidem.refund(p.payment_no, 7, 'BKR-' || p.i) FROM bk_payment p WHERE p.i % 10 = 5 ORDER BY p.i;
SELECT payidem.transit_order(o.order_no, 'shipping') FROM bk_order o WHERE o.i % 20 = 0;
-- notifications handed out, some answered
SELECT payidem.notify_result(d.event_id, d.event_id % 200 = 0) FROM payidem.notify_due(50) d;
SELECT * FROM payidem.idem_claim('bk:open', 'test', 'BK-1', 'BK_WX', 5, NULL, '1 hour');
-- a bill with one line we do not know, and its reconciliation
SELECT payidem.load_bill('BK_WX', current_date,
	'BK_WX,,TXBK_ORPHAN,,500,1,succeeded,' || to_char(current_date, 'YYYY-MM-DD') || ' 00:00:01');
SELECT * FROM payidem.reconcile('BK_WX', current_date);
});

# md5 of each payidem table's rows in primary-key order, and its row count
my $sums_sql = q{
	SELECT c.relname, (xpath('/table/row/n/text()', x))[1]::text, (xpath('/table/row/s/text()', x))[1]::text
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
	  LATERAL (SELECT string_agg(format('x.%I', a.attname), ', ' ORDER BY k.ord) AS pk
	             FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, ord), pg_attribute a
	            WHERE i.indrelid = c.oid AND i.indisprimary AND a.attrelid = c.oid AND a.attnum = k.attnum) p,
	  LATERAL query_to_xml(format('SELECT count(*) AS n, md5(coalesce(string_agg(x::text, E''\n'' ORDER BY %s), '''')) AS s FROM payidem.%I x',
	                              coalesce(p.pk, 'x::text'), c.relname), false, false, '') x
	 WHERE n.nspname = 'payidem' AND c.relkind = 'r' AND c.relname NOT IN ('merchant_role', 'order_expiry')
	 ORDER BY c.relname};
# the expiry queue is derived data, not dumped: what it must hold is a row per
# pending order at its expire_at (the source may also hold rows of orders
# settled since, which housekeeping removes after their time)
my $queue_sql = q{
	SELECT count(*) || ' ' || md5(coalesce(string_agg(q.order_no || '@' || q.expire_at, ',' ORDER BY q.expire_at, q.order_no), ''))
	  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
	 WHERE x.status = 'pending' AND x.expire_at = q.expire_at};
my $sums_src = $src->safe_psql('shop', $sums_sql);
my %src_rows = map { my @f = split /\|/; ($f[0] => $f[1]) } split /\n/, $sums_src;
my $tables = scalar(keys %src_rows);
my $nonempty = grep { $src_rows{$_} > 0 } keys %src_rows;
cmp_ok($nonempty, '>=', 14, "source: $nonempty of $tables payidem tables hold rows");
is(scalar(grep { !/^[^|]+\|\d+\|[0-9a-f]{32}$/ } split /\n/, $sums_src), 0, 'source: a row count and an md5 for every table');
my ($statuses) = $src->safe_psql('shop', q{SELECT string_agg(DISTINCT status, ',' ORDER BY status) FROM payidem."order"});
is($statuses, 'closed,paid,partially_refunded,pending,refunded,shipping', "source: orders in every status ($statuses)");
my ($api_key, $api_secret_sig) = split /\|/, $src->safe_psql('shop',
	q{SELECT api_key, payidem.sign(merchant_no, 'amount=1') FROM bk_merchant});

# ---------------------------------------------------------------- dump + restore
my $dump = PostgreSQL::Test::Utils::tempdir() . '/shop.dump';
command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('shop') ], 'pg_dump -Fc of the populated database');

my $dst = new_node('backup_dst');
$dst->safe_psql('postgres', 'CREATE DATABASE shop_restored');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $dst->connstr('shop_restored'), $dump ],
	'a plain pg_restore, no options');

my $sums_dst = $dst->safe_psql('shop_restored', $sums_sql);
is($src->safe_psql('shop', q{SELECT count(*) FROM payidem.merchant_role}), '1',
	'source: the dropped role is still mapped (by OID)');
is($dst->safe_psql('shop_restored', q{SELECT count(*) FROM payidem.merchant_role}), '0',
	'restored: the dropped role\'s mapping was left out of the dump');
is($sums_dst, $sums_src, "all $tables payidem tables: same row counts and checksums after the restore");
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

# ---------------------------------------------------------------- guards still on
is( $dst->safe_psql('shop_restored', q{
	SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE n.nspname = 'payidem' AND NOT t.tgisinternal AND t.tgenabled NOT IN ('O', 'A')}),
	'0', 'every payidem trigger is enabled again after the restore (origin or always)');

sub refused
{
	my ($sql, $sqlstate, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err) = $dst->psql('shop_restored', "\\set VERBOSITY verbose\n$sql");
	like($err, qr/ERROR:\s+$sqlstate/, "$what: refused with $sqlstate") or diag("rc $rc out $out err $err");
	return;
}
my $pending = $dst->safe_psql('shop_restored', q{SELECT min(order_no) FROM payidem."order" WHERE status = 'pending'});
my $paid = $dst->safe_psql('shop_restored', q{SELECT min(order_no) FROM payidem."order" WHERE status = 'paid'});
refused(qq{UPDATE payidem."order" SET status = 'refunded' WHERE order_no = '$pending'}, 'PI002',
	'direct UPDATE pending -> refunded');
refused(qq{UPDATE payidem."order" SET status = 'pending' WHERE order_no = '$paid'}, 'PI002',
	'direct UPDATE paid -> pending');
refused(q{UPDATE payidem.payment SET status = 'pending' WHERE status = 'failed'}, 'PI002',
	'direct UPDATE of a failed payment back to pending');
refused(qq{INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status)
	SELECT payidem.gen_order_no('RF'), payment_no, order_no, merchant_no, 'BK-DIRECT', 1, 'succeeded'
	  FROM payidem.payment WHERE status = 'succeeded' LIMIT 1}, 'PI002', 'direct INSERT of a refund as succeeded');
refused(q{UPDATE payidem.status_log SET to_status = 'paid' WHERE log_id = (SELECT min(log_id) FROM payidem.status_log)},
	'42501', 'UPDATE of status_log');
refused(q{DELETE FROM payidem.status_log WHERE log_id = (SELECT min(log_id) FROM payidem.status_log)},
	'42501', 'DELETE of status_log');
refused(q{TRUNCATE payidem.status_log}, '42501', 'TRUNCATE of status_log');
refused(qq{UPDATE payidem."order" SET amount = -1 WHERE order_no = '$pending'}, '23514', 'a negative order amount');
refused(q{UPDATE payidem.payment SET refunded_amount = amount + 1 WHERE status = 'succeeded'}, '23514',
	'refunded above the payment amount');
refused(q{INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, fee, status, paid_at)
	VALUES ('BK_WX', current_date, 'TXNEG', -5, 0, 'succeeded', now())}, '23514', 'a negative bill amount');
refused(q{UPDATE payidem.merchant SET status = 'deleted'}, '23514', 'an unknown merchant status');
refused(qq{DELETE FROM payidem."order" WHERE order_no = '$pending'}, '42501', 'DELETE of an order');
refused(q{TRUNCATE payidem.refund CASCADE}, '42501', 'TRUNCATE of refunds (and of their events)');
# the rows a restore loads, written by an application: refused, by INSERT and
# by COPY (only the tables' owner or a superuser loads them as dumped)
refused(qq{INSERT INTO payidem."order" (order_no, merchant_no, out_trade_no, subject, amount, expire_at, status, paid_at)
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
refused(qq{UPDATE payidem."order" SET status = 'pending' WHERE order_no = '$paid'}, 'PI002',
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
is( $dst->safe_psql('shop_restored', q{
	SELECT count(*) FROM (
		SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
		UNION ALL SELECT 'order', order_no, status FROM payidem."order"
		UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
	 WHERE cur.status IS DISTINCT FROM (SELECT l.to_status FROM payidem.status_log l
	                                     WHERE l.entity = cur.entity AND l.entity_no = cur.no
	                                     ORDER BY l.log_id DESC LIMIT 1)}),
	'0', 'restored copy: the latest status_log row of every entity is its current status');
# a replayed callback from before the backup is still a duplicate
my $old_paid_payment = $dst->safe_psql('shop_restored',
	q{SELECT payment_no FROM bk_payment WHERE i = 2});
is($dst->safe_psql('shop_restored', qq{SELECT payidem.apply_payment_result('$old_paid_payment', 'callback', 'succeeded',
	'TX$old_paid_payment', (SELECT amount FROM payidem.payment WHERE payment_no = '$old_paid_payment'))}),
	'duplicate', 'a callback applied before the backup is a duplicate after the restore');

my $total_rows = 0;
$total_rows += $_ for values %src_rows;
diag(sprintf('062 figures: %d orders; %d rows in %d payidem tables dumped and restored with equal checksums; %.1f s',
		$orders, $total_rows, $tables, Time::HiRes::time() - $t0));

$src->stop;
$dst->stop;
done_testing();
