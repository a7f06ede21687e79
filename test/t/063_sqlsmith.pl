# Fuzzing with sqlsmith: random queries over a populated payidem database,
# as an unprivileged role that has the application's and the auditor's rights
# (payidem.grant_app + payidem.grant_auditor), so the generated queries call
# payidem's functions and read its tables with arbitrary arguments.  The run
# is bounded (--max-queries, a statement timeout, a wall-clock limit).  Errors
# of the queries are expected; the server must never crash: no "terminated by
# signal", no PANIC in the log, the server still answers, and afterwards the
# state-machine invariants still hold.
#
# Skipped (with a message) when sqlsmith is not installed (Debian: sqlsmith).
# PAYIDEM_SOAK=1: 100,000 queries instead of 4,000.  PAYIDEM_SEED=<n>.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use IPC::Run ();
use Time::HiRes ();

my $sqlsmith = `command -v sqlsmith 2>/dev/null`;
chomp $sqlsmith;
if (!$sqlsmith)
{
	plan skip_all => 'sqlsmith is not installed (Debian package sqlsmith)';
}

my $t0      = Time::HiRes::time();
my $soak    = $ENV{PAYIDEM_SOAK} ? 1 : 0;
# A fixed seed by default, so that make test is repeatable (the same queries
# every run); the soak mode and PAYIDEM_SEED explore others.
my $seed    = $ENV{PAYIDEM_SEED} // ($ENV{PAYIDEM_SOAK} ? time() % 1000000 : 20261129);
my $queries = $soak ? 100000 : 4000;
my $wall    = $soak ? 3000 : 120;    # seconds, hard limit for the sqlsmith process
diag("063_sqlsmith: seed $seed (PAYIDEM_SEED=$seed replays it), max $queries queries");

my $node = payidem_node('sqlsmith', key_byte => '8f', conf => q(
fsync = off
log_min_messages = warning
log_min_error_statement = panic
));

$node->safe_psql('postgres', 'CREATE DATABASE smith');
$node->safe_psql('smith', q{
CREATE EXTENSION payidem;
CREATE TABLE m AS SELECT * FROM payidem.create_merchant('Smith Shop', 'retail', 0.006);
SELECT payidem.create_channel('SM_WX', 'wechat', 0.002);
SELECT payidem.create_channel('SM_ALI', 'alipay', 0.0025);
SELECT payidem.set_channel_config('SM_WX', '{"mch_id": "1"}');
SELECT payidem.bind_channel(merchant_no, 'SM_WX') FROM m;
SELECT payidem.bind_channel(merchant_no, 'SM_ALI') FROM m;
CREATE TABLE o AS SELECT i, payidem.create_order(m.merchant_no, 'SM-' || i, 100 + i, 'smith ' || i, 'https://shop.example/n') AS order_no
  FROM m, generate_series(1, 300) i;
CREATE TABLE p AS SELECT i, payidem.begin_payment(order_no, 'SM_WX') AS payment_no FROM o WHERE i % 5 <> 0;
SELECT payidem.apply_payment_result(payment_no, 'callback', 'succeeded', 'TX' || payment_no, 100 + i) FROM p WHERE i % 5 IN (1, 2);
SELECT payidem.apply_payment_result(payment_no, 'query', 'failed') FROM p WHERE i % 5 = 3;
SELECT payidem.apply_refund_result(payidem.refund(payment_no, 10, 'SMR-' || i), 'succeeded') FROM p WHERE i % 5 = 1;
SELECT payidem.load_bill('SM_WX', current_date, 'SM_WX,,TXORPHAN,,500,1,succeeded,' || to_char(current_date, 'YYYY-MM-DD') || ' 00:00:01');
SELECT * FROM payidem.reconcile('SM_WX', current_date);
DROP TABLE m, o, p;
CREATE ROLE smith LOGIN;
SELECT payidem.grant_app('smith');
SELECT payidem.grant_auditor('smith');
ALTER ROLE smith SET statement_timeout = '2s';
ALTER ROLE smith SET lock_timeout = '1s';
ALTER ROLE smith SET search_path = payidem, public;
});

my $log_offset = -s $node->logfile;
my ($out, $err) = ('', '');
my $connstr = $node->connstr('smith') . ' user=smith';
my @cmd = ($sqlsmith, "--target=$connstr", "--seed=$seed", "--max-queries=$queries", '--exclude-catalog', '--verbose');
my $timed_out = 0;
eval {
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err, IPC::Run::timeout($wall));
	1;
} or do {
	$timed_out = 1;
	note("sqlsmith stopped by the wall-clock limit of $wall s: $@");
};
open(my $sfh, '>', "$PostgreSQL::Test::Utils::log_path/063_sqlsmith_output.log") or die;
print $sfh "---- stdout\n$out\n---- stderr\n$err\n";
close $sfh;

my $queries_done = 0;
($queries_done) = ($err =~ /queries:\s*(\d+)/g)[-1] // 0;
my %errors;
while ($err =~ /^(\d+)\t(.+)$/mg) { $errors{$2} = $1; }

ok($queries_done > 0, "sqlsmith ran ($queries_done queries" . ($timed_out ? ', stopped by the time limit' : '') . ')');
unlike($err, qr/server closed the connection unexpectedly|terminating connection because of crash/i,
	'sqlsmith never lost its connection to a crash');
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/terminated by signal/, 'no backend terminated by a signal');
unlike($log, qr/PANIC/, 'no PANIC');
is($node->safe_psql('smith', 'SELECT 1'), '1', 'the server still answers');

# whatever sqlsmith managed to call, the guards held
is( $node->safe_psql('smith', q{
	SELECT count(*) FROM (
		SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
		UNION ALL SELECT 'order', order_no, status FROM payidem."order"
		UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
	 LEFT JOIN (SELECT DISTINCT ON (entity, entity_no) entity, entity_no, to_status
	              FROM payidem.status_log ORDER BY entity, entity_no, log_id DESC) l
	        ON l.entity = cur.entity AND l.entity_no = cur.no
	 WHERE cur.status IS DISTINCT FROM l.to_status}),
	'0', 'the latest status_log row of every entity is still its current status');
is($node->safe_psql('smith', q{SELECT count(*) FROM payidem.payment WHERE refunded_amount > amount}), '0',
	'no payment refunded above its amount');

my @top = (sort { $errors{$b} <=> $errors{$a} } keys %errors)[0 .. 4];
diag(sprintf('063 figures: seed %d; %d queries generated by sqlsmith as an unprivileged role; '
		  . '%d distinct error kinds (most frequent: %s); no crash; %.1f s',
		$seed, $queries_done, scalar(keys %errors),
		join('; ', map { "$errors{$_}x $_" } grep { defined } @top), Time::HiRes::time() - $t0));

$node->stop;
done_testing();
