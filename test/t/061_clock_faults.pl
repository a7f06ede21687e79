# Clock faults.  The workload of 060_crash_under_load.pl (eight pgbench
# clients: new orders and attempts, duplicate results, racing closes, refunds)
# runs on a server whose clock libfaketime moves while it works:
#
#   real time -> one hour back (while running) -> an immediate stop and a
#   start while still an hour back (under load) -> one day forward (while
#   running) -> back to real time, i.e. a day back (while running).
#
# After each step the invariants of 060 are checked (no number issued twice,
# also against every number the clients were told; every acknowledged number
# present; the next number above all; each success applied once; paid iff
# succeeded; refunds <= paid; status_log = current status; no stuck key), and
# each client's numbers strictly increase in the order it got them, across
# all clock moves: order numbers never go backwards with the clock.
# The server's log shows the clock rollbacks, absorbed with a WARNING.
#
# PAYIDEM_SOAK=1: longer phases.  PAYIDEM_SEED=<n>: replay one seed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemWorkload;
use IPC::Run ();
use Time::HiRes ();

my $faketime_lib = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
if (!-e $faketime_lib)
{
	plan skip_all => "libfaketime not found at $faketime_lib (Debian package libfaketime)";
}

my $soak    = $ENV{PAYIDEM_SOAK} ? 1 : 0;
my $seed    = $ENV{PAYIDEM_SEED} // (time() % 1000000);
my $phase   = $soak ? 15 : 2;       # seconds of load per step
my $clients = 8;
srand($seed);
diag("061_clock_faults: seed $seed (PAYIDEM_SEED=$seed replays it), soak=$soak");

# libfaketime re-reads this file at most once a second (FAKETIME_CACHE_DURATION=1).
# Not on every call (FAKETIME_NO_CACHE=1): libfaketime is not async-signal-safe,
# and a re-read (fopen, malloc) interrupted by the server's SIGALRM handler,
# which reads the clock too, can abort the backend — a crash of the test
# harness, not of payidem.  A long deadlock_timeout keeps that timer quiet.
my $faketime_file = PostgreSQL::Test::Utils::tempdir() . '/faketime.rc';

sub set_clock_offset
{
	my ($offset) = @_;
	my $tmp = "$faketime_file.tmp";
	open my $fh, '>', $tmp or die "cannot write $tmp: $!";
	print $fh "$offset\n";
	close $fh or die "cannot close $tmp: $!";
	rename $tmp, $faketime_file or die "cannot rename $tmp: $!";
	note("fake clock offset now $offset");
	return;
}

# the server runs on the fake clock; the test and its clients on the real one
sub start_faked
{
	my ($node) = @_;
	local $ENV{LD_PRELOAD}                    = $faketime_lib;
	local $ENV{FAKETIME_TIMESTAMP_FILE}       = $faketime_file;
	local $ENV{FAKETIME_CACHE_DURATION}       = '1';
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC}  = '1';
	local $ENV{TZ}                            = 'UTC';
	$node->start;
	return;
}

my $t0   = Time::HiRes::time();
my $node = payidem_node('clock_faults', key_byte => '6b', start => 0, conf => q(
max_connections = 40
deadlock_timeout = '10s'
fsync = off
synchronous_commit = on
log_min_messages = warning
));
set_clock_offset('+0');
start_faked($node);

my $logdir = "$PostgreSQL::Test::Utils::log_path/" . ($0 =~ s{.*/}{}r =~ s{\.pl$}{}r) . "_clients";
-d $logdir or mkdir $logdir or die "cannot create $logdir: $!";
unlink glob("$logdir/*");

my @pgbench_files = workload_setup($node, $logdir);

sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $total_checks = 0;



my $total_tx = 0;
my %unexpected;

# load for $secs seconds; after $at seconds run $action (a clock move, a crash)
sub run_phase
{
	my ($step, $secs, $at, $action) = @_;
	my ($out, $err) = ('', '');
	my @cmd = (
		'pgbench', '--no-vacuum', "--client=$clients", '--jobs=4',
		'--time=' . int($secs + 0.999), "--random-seed=" . ($seed + $step), @pgbench_files,
		$node->connstr('postgres'));
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err);
	if ($action)
	{
		Time::HiRes::sleep($at);
		$action->();
	}
	$h->finish;
	open(my $efh, ">>", "$PostgreSQL::Test::Utils::log_path/061_pgbench_stderr.log") or die;
	print $efh "---- step $step\n$err\n$out\n";
	close $efh;
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

sub server_offset
{
	my $before = time();
	return q1('SELECT floor(extract(epoch FROM clock_timestamp()))::bigint') - $before;
}

my $log_offset = 0;

run_phase(1, $phase, undef, undef);
$total_checks += check_invariants($node, $logdir, 'real clock');

run_phase(2, $phase, rand($phase / 2), sub { set_clock_offset('-1h') });
my $off = server_offset();
ok($off < -3500 && $off > -3700, "server clock is one hour behind ($off s)");
$total_checks += check_invariants($node, $logdir, 'clock stepped back 1 h under load');

my $crash_at = sprintf('%.2f', 0.5 + rand($phase - 1));
run_phase(3, $phase, $crash_at, sub { $node->stop('immediate') });
start_faked($node);
$off = server_offset();
ok($off < -3500 && $off > -3700, "after the immediate stop (at ${crash_at}s) and start, still an hour behind ($off s)");
$total_checks += check_invariants($node, $logdir, 'immediate stop + start while 1 h behind');
run_phase(4, $phase, undef, undef);
$total_checks += check_invariants($node, $logdir, 'load while 1 h behind, after the restart');

run_phase(5, $phase, rand($phase / 2), sub { set_clock_offset('+1d') });
$off = server_offset();
ok($off > 86300 && $off < 86500, "server clock is one day ahead ($off s)");
$total_checks += check_invariants($node, $logdir, 'clock stepped forward 1 day under load');

run_phase(6, $phase, rand($phase / 2), sub { set_clock_offset('+0') });
$off = server_offset();
ok(abs($off) < 60, "server clock is back to real time ($off s)");
$total_checks += check_invariants($node, $logdir, 'clock stepped back 1 day (to real time) under load');
run_phase(7, $phase, undef, undef);
$total_checks += check_invariants($node, $logdir, 'load at real time again');

is_deeply(\%unexpected, {}, 'no SQL error other than the crash in any pgbench run')
  or diag(explain \%unexpected);

my $rollbacks = q1(q{SELECT value FROM payidem.stats() WHERE name = 'clock_rollbacks'});
my $log = slurp_file($node->logfile);
my @warnings = $log =~ /WARNING:\s+system clock moved backwards/g;
ok(@warnings >= 1, 'clock rollbacks were absorbed with a WARNING (' . scalar(@warnings) . ' in the log)');
unlike($log, qr/PANIC|terminated by signal/, 'no PANIC, no backend killed by a signal');

my ($orders, $payments, $refunds, $results) = split /\|/, q1(q{
	SELECT (SELECT count(*) FROM payidem."order"), (SELECT count(*) FROM payidem.payment),
	       (SELECT count(*) FROM payidem.refund), (SELECT count(*) FROM crash_outcome)});
my ($lines) = client_numbers($logdir);
ok($orders > 100, 'the workload did real work');
diag(sprintf(
		'061 figures: seed %d; %d pgbench transactions over 7 phases; clock moves -1h, +1d, -1d (to real), '
		  . 'one immediate stop at %ss while 1 h behind; %d orders, %d payments, %d refunds, %d results/closes; '
		  . '%d numbers logged by clients; %d rollback WARNINGs; %d invariant checks passed; %.1f s',
		$seed, $total_tx, $crash_at, $orders, $payments, $refunds, $results, $lines,
		scalar(@warnings), $total_checks, Time::HiRes::time() - $t0));

$node->stop;
done_testing();
