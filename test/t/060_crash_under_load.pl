# Crash under load.  Eight pgbench clients run the payment flow — new orders
# with a payment attempt, channel results delivered several times by several
# clients at once (callback or query), orders closed while their money
# arrives, refunds and their results — while the server is stopped with
# "immediate" at a random moment (seeded; the seed is printed), several times.
# After each restart the invariants that must hold whatever happened:
#
#   - no order/payment/refund number was issued twice: the number cores
#     (time + shard + seq) of every row are distinct across the three tables,
#     and distinct from every number a client received before any crash;
#   - every number a client received (after its COMMIT) is still there;
#   - numbers issued after the restart are above all of them;
#   - each payment's success was applied at most once (outcomes recorded in
#     the same transaction, status log, no idempotency key of payidem's own);
#   - an order is paid iff one attempt succeeded while it was pending; every
#     other success is an anomaly;
#   - refunds never exceed what was paid, per payment and per order;
#   - the latest status_log row of every entity equals its current status;
#   - no idempotency key is left processing past its lease;
#   - payidem.verify() finds nothing wrong (DESIGN section 11).
#
# Then the day's bills are reconciled and settle() of everything is cut by
# one more immediate stop: it settled all or nothing, the books are
# consistent, and the next run settles each item the first did not, once.
#
# How the numbers the clients received are recorded: each pgbench transaction
# returns its numbers with \gset, and only after pgbench got the COMMIT's
# answer does the client run "\shell echo ... >> file": a client-side,
# append-only log outside the database, one file per client.  A crash between
# the COMMIT and the \shell only loses a line (the log is a subset of what was
# acknowledged), never adds one; so every logged number must be in the
# database after the restart (synchronous_commit is on; fsync is off because
# only the server's processes die, never the operating system).
#
# PAYIDEM_SOAK=1: 25 crashes instead of 4, longer runs between them.
# PAYIDEM_SEED=<n>: replay one seed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemWorkload;
use PayidemStory qw(books_sql verify_sql);
use IPC::Run ();
use Time::HiRes ();

my $soak    = $ENV{PAYIDEM_SOAK} ? 1 : 0;
my $seed    = $ENV{PAYIDEM_SEED} // (time() % 1000000);
my $crashes = $soak ? 25 : 4;
my ($min_run, $max_run) = $soak ? (2.0, 12.0) : (1.5, 4.0);    # seconds before the crash
my $clients = 8;
srand($seed);
diag("060_crash_under_load: seed $seed (PAYIDEM_SEED=$seed replays it), $crashes crashes, soak=$soak");

my $t0   = Time::HiRes::time();
my $node = payidem_node('crash_load', key_byte => '5a', start => 0, conf => q(
max_connections = 40
fsync = off
synchronous_commit = on
log_min_messages = warning
));
$node->start;

my $logdir = "$PostgreSQL::Test::Utils::log_path/" . ($0 =~ s{.*/}{}r =~ s{\.pl$}{}r) . "_clients";
-d $logdir or mkdir $logdir or die "cannot create $logdir: $!";
unlink glob("$logdir/*");

my @pgbench_files = workload_setup($node, $logdir);

sub q1 { return $node->safe_psql('postgres', $_[0]); }

my ($total_tx, $total_checks, $total_faults) = (0, 0, 0);
my %unexpected;

sub run_until_crash
{
	my ($cycle, $crash_after) = @_;
	my ($out, $err) = ('', '');
	my @cmd = (
		'pgbench', '--no-vacuum', "--client=$clients", '--jobs=4',
		'--time=120', "--random-seed=" . ($seed + $cycle), @pgbench_files,
		$node->connstr('postgres'));
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err);
	Time::HiRes::sleep($crash_after);
	if (defined $crash_after && $crash_after >= 0)
	{
		$node->stop('immediate');
		$total_faults++;
	}
	$h->finish;
	open(my $efh, ">>", "$PostgreSQL::Test::Utils::log_path/060_pgbench_stderr.log") or die;
	print $efh "---- cycle $cycle\n$err\n$out\n";
	close $efh;
	# pgbench lines about SQL errors other than the crash itself
	for my $line (split /\n/, $err)
	{
		next unless $line =~ /ERROR:\s+(.*)/;
		my $msg = $1;
		next if $msg =~ /terminating connection|shutdown|server closed|could not receive|connection/i;
		$unexpected{$msg}++;
	}
	$total_tx += $1 if $out =~ /number of transactions actually processed: (\d+)/;
	return;
}


my @crash_at;
for my $cycle (1 .. $crashes)
{
	my $after = sprintf('%.2f', $min_run + rand($max_run - $min_run));
	push @crash_at, $after;
	note(sprintf('cycle %d: immediate stop after %.2f s', $cycle, $after));
	run_until_crash($cycle, $after);
	$node->start;
	$total_checks += check_invariants($node, $logdir, "after crash $cycle (at ${after}s)");
}

# a final run without a fault: the workload itself must be clean
{
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			'pgbench', '--no-vacuum', "--client=$clients", '--jobs=4', '--time=' . ($soak ? 20 : 3),
			"--random-seed=$seed", @pgbench_files, $node->connstr('postgres')
		],
		'>', \$out, '2>', \$err);
	like($out, qr/number of failed transactions: 0 \(0\.000%\)/, 'fault-free run: no failed transaction');
	$total_tx += $1 if $out =~ /number of transactions actually processed: (\d+)/;
	unlike($err, qr/ERROR|aborted/, 'fault-free run: no error') or diag($err);
	$total_checks += check_invariants($node, $logdir, 'after the fault-free run');
}

# ---------------------------------------------------------------- settle() cut by a crash
# The day's bills, reconciled; settle() of everything the workload paid and
# refunded, the server stopped with "immediate" while it runs (or just
# after): all of it settled or none, the books consistent; the next run
# settles the rest, each item once.
q1(books_sql(settle => 0));
my $paid_sql = q{p.status IN ('succeeded', 'partially_refunded', 'refunded')};
my $crash_after = sprintf('%.2f', 0.02 + rand(0.4));
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
			'SELECT coalesce(sum(items), 0) FROM payidem.settle(current_date + 7)' ], '>', \$out, '2>', \$err);
	Time::HiRes::sleep($crash_after);
	$node->stop('immediate');
	$h->finish;
	$node->start;
}
my $settled_at_crash = q1(q{SELECT count(*) FROM payidem.settlement_item});
is(q1(verify_sql()), '', "settle() cut by a crash after ${crash_after}s: payidem.verify() finds nothing wrong");
my $settled_now = q1(q{SELECT coalesce(sum(items), 0) FROM payidem.settle(current_date + 7)});
my ($items, $paid, $unsettled, $refunds_unsettled) = split /\|/, q1(qq{
	SELECT (SELECT count(*) FROM payidem.settlement_item),
	       (SELECT count(*) FROM payidem.payment p WHERE $paid_sql),
	       (SELECT count(*) FROM payidem.payment p WHERE $paid_sql
	           AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item s WHERE s.item_no = p.payment_no)
	           AND NOT EXISTS (SELECT 1 FROM payidem.settlement_hold h WHERE h.payment_no = p.payment_no)),
	       (SELECT count(*) FROM payidem.refund r WHERE r.status = 'succeeded'
	           AND NOT EXISTS (SELECT 1 FROM payidem.settlement_item s WHERE s.item_no = r.refund_no))});
ok($settled_at_crash == 0 || ($settled_at_crash == $items && $settled_now == 0),
	"the settle() the crash cut settled all ($items items) or nothing: $settled_at_crash before the next run, which settled $settled_now");
is($settled_at_crash + $settled_now, $items, 'each item was settled by one run');
is("$unsettled $refunds_unsettled", '0 0', "each of the $paid paid payments is settled or held, each succeeded refund settled");
is(q1(verify_sql()), '', 'settled: payidem.verify() finds nothing wrong');

is_deeply(\%unexpected, {}, 'no SQL error other than the crashes themselves in any pgbench run')
  or diag(explain \%unexpected);

my ($orders, $payments, $refunds, $results) = split /\|/, q1(q{
	SELECT (SELECT count(*) FROM payidem."order"), (SELECT count(*) FROM payidem.payment),
	       (SELECT count(*) FROM payidem.refund), (SELECT count(*) FROM crash_outcome)});
my ($lines) = client_numbers($logdir);
my %by = map { split /\|/ } split /\n/, q1(q{SELECT outcome, count(*) FROM crash_outcome GROUP BY 1 ORDER BY 1});
ok($orders > 100 && $results > 100, 'the workload did real work');
my $log = slurp_file($node->logfile);
unlike($log, qr/PANIC|terminated by signal/, 'no PANIC, no backend killed by a signal');
diag(sprintf(
		'060 figures: seed %d; %d pgbench transactions; %d immediate stops at [%s] s; %d orders, %d payments, %d refunds committed; '
		  . '%d payment results/closes recorded (%s); %d numbers logged by clients; %d invariant checks passed; '
		  . '%d items settled, %d of them before the settle() cut at %.2f s; %.1f s',
		$seed, $total_tx, $total_faults, join(', ', @crash_at), $orders, $payments, $refunds, $results,
		join(', ', map { "$_ $by{$_}" } sort keys %by), $lines, $total_checks, $items, $settled_at_crash, $crash_after,
		Time::HiRes::time() - $t0));

$node->stop;
done_testing();
