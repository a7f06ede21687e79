
# Order numbers under a clock that moves backwards, faked with libfaketime:
# an hour back while running (absorbed, one WARNING, counted in stats), an
# immediate stop + start while still an hour back (numbers continue above the
# stored high-water mark, their time part ahead of the clock), and the clock
# set right again.  Nothing here depends on the real date.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes ();
use POSIX ();

my $t_start = Time::HiRes::time();

my $faketime_lib = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
if (!-e $faketime_lib)
{
	plan skip_all => "libfaketime not found at $faketime_lib (Debian package libfaketime)";
}

# libfaketime reads this file on a process's first clock call of each real
# second (FAKETIME_CACHE_DURATION=0): "+0" = real time, "-1h" = one hour
# behind.  Not on every call (FAKETIME_NO_CACHE=1): libfaketime is not
# async-signal-safe, and its re-read (fopen, malloc) run from the server's
# SIGALRM handler, which reads the clock too, while the backend is itself in
# malloc corrupts the backend's heap: a crash of the test harness, not of
# payidem (seen once in a pgbench phase below).
my $faketime_file = PostgreSQL::Test::Utils::tempdir() . '/faketime.rc';

# Change the server's clock.  Every busy process re-reads the file in the
# first moments of each real second: the file is replaced in the middle of
# one (far from the re-reads, however late this process is scheduled) and
# the next one is waited for, so that every busy server process takes the new
# offset at that second's start, all together, as with one system clock.
# (A process idle since the second began takes it at its first call, maybe
# earlier; the sessions that draw numbers below are busy.)
my $unclean_steps = 0;	# clock steps whose file landed near a second's start

sub set_clock_offset
{
	my ($offset) = @_;
	# write a new file, to be renamed over the old one: no process ever
	# reads a half-written file
	my $tmp = "$faketime_file.tmp";
	open my $fh, '>', $tmp or die "cannot write $tmp: $!";
	print $fh "$offset\n";
	close $fh or die "cannot close $tmp: $!";
	# the middle of a second, checked again after every sleep (a sleep can
	# overshoot on a loaded machine)
	for (;;)
	{
		my $now = Time::HiRes::time();
		my $frac = $now - int($now);
		last if $frac >= 0.3 && $frac <= 0.7;
		Time::HiRes::sleep($frac < 0.5 ? 0.5 - $frac : 1.5 - $frac);
	}
	rename $tmp, $faketime_file or die "cannot rename $tmp: $!";
	my $at = Time::HiRes::time();
	my $frac = $at - int($at);
	if ($frac < 0.2 || $frac > 0.8)
	{
		# stalled between the check and the rename: processes may disagree
		# about the time for the rest of this second
		$unclean_steps++;
		diag(sprintf('clock step to %s landed %.3f s into a second', $offset, $frac));
	}
	Time::HiRes::sleep(int($at) + 1.05 - $at);
	note(sprintf('fake clock offset now %s (file replaced %.3f s into a second)', $offset, $frac));
	return;
}

# Start the node with libfaketime preloaded; the test's own process and the
# psql it runs keep the real clock.
sub start_faked
{
	my ($node) = @_;
	local $ENV{LD_PRELOAD} = $faketime_lib;
	local $ENV{FAKETIME_TIMESTAMP_FILE} = $faketime_file;
	local $ENV{FAKETIME_CACHE_DURATION} = '0';
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	# absolute fake times (written below with gmtime) are read as UTC
	local $ENV{TZ} = 'UTC';
	$node->start;
	return;
}

# server clock minus the test's (real) clock, in whole seconds
sub server_clock_offset
{
	my ($node) = @_;
	my $before = time();
	my $server = $node->safe_psql('postgres',
		'SELECT floor(extract(epoch FROM clock_timestamp()))::bigint');
	return $server - $before;
}

sub core { return substr($_[0], 2, 22); }

my %seen;
my $highest = '';

# Issue $count numbers in one statement.  Returns psql's exit code and
# stderr, the numbers in issue order, and how many of them have a time part
# behind the server clock at the statement's start (lagging) or ahead of the
# server clock read just after they were issued (leading).  The server's
# clock is the faked one.
my ($lagging, $leading);

sub issue
{
	my ($node, $count) = @_;
	my ($rc, $out, $err) = $node->psql(
		'postgres', qq{
		SELECT g.n,
		       (p.issued_at < date_trunc('second', statement_timestamp()))::int,
		       (p.issued_at > clock_timestamp())::int
		FROM (SELECT i, payidem.gen_order_no() AS n
		      FROM generate_series(1, $count) AS i) AS g,
		     LATERAL payidem.order_no_parse(g.n) AS p
		ORDER BY g.i});
	my @nums;
	($lagging, $leading) = (0, 0);
	for my $line (split /\n/, $out)
	{
		my ($n, $lag, $lead) = split /\|/, $line;
		push @nums, $n;
		$lagging += $lag;
		$leading += $lead;
	}
	return ($rc, $err, @nums);
}

# numbers of one batch, in issue order: increasing, above every earlier
# number, never seen before
sub check_batch
{
	my ($what, $count, @nums) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;

	is(scalar(@nums), $count, "$what: got $count numbers");
	my $bad_order = 0;
	for my $i (1 .. $#nums)
	{
		$bad_order++ unless core($nums[$i]) gt core($nums[ $i - 1 ]);
	}
	is($bad_order, 0, "$what: numbers strictly increase in issue order");
	ok( core($nums[0]) gt $highest,
		"$what: first number $nums[0] is above every earlier number (highest core $highest)"
	);
	my $dups = grep { exists $seen{ core($_) } } @nums;
	is($dups, 0, "$what: no number repeats an earlier one");
	$seen{ core($_) } = 1 for @nums;
	$highest = core($nums[-1]) if core($nums[-1]) gt $highest;
	return;
}

sub stat_value
{
	my ($node, $name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value FROM payidem.stats() WHERE name = '$name'");
}

sub count_rollback_warnings
{
	my ($node, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my @hits = $log =~ /WARNING:\s+system clock moved backwards/g;
	return scalar @hits;
}

set_clock_offset('+0');

my $node = payidem_node('clock', start => 0);
start_faked($node);
$node->safe_psql('postgres', 'CREATE EXTENSION payidem');

my $offset = server_clock_offset($node);
ok(abs($offset) <= 5,
	"libfaketime loaded with offset +0: server clock matches real clock ($offset s)");

############################################################################
# Clock right
############################################################################

my ($rc, $err, @nums) = issue($node, 1000);
is($rc, 0, 'clock right: numbers issued');
check_batch('clock right', 1000, @nums);
is($lagging, 0, 'clock right: time part never lags the clock');
is($leading, 0, 'clock right: time part never runs ahead of the clock');

############################################################################
# Clock one hour back, server running
############################################################################

my $log_offset = -s $node->logfile;
set_clock_offset('-1h');
$offset = server_clock_offset($node);
ok( $offset <= -3595 && $offset >= -3605,
	"server clock is now one hour back ($offset s)");

($rc, $err, @nums) = issue($node, 1000);
is($rc, 0, 'clock back: gen_order_no() raised no error');
unlike($err, qr/ERROR/, 'clock back: no ERROR reported to the client');
like($err, qr/WARNING:\s+system clock moved backwards/,
	'clock back: the session that noticed it got the WARNING');
check_batch('clock back, same server', 1000, @nums);
is($leading, 1000,
	'clock back, same server: time part of every number is ahead of the clock');

# more sessions, still an hour back: no further warning
for my $round (1 .. 3)
{
	($rc, $err, @nums) = issue($node, 200);
	is($rc, 0, "clock back, session $round: numbers issued");
	unlike($err, qr/system clock moved backwards/,
		"clock back, session $round: no repeated warning to the client");
	check_batch("clock back, session $round", 200, @nums);
	is($leading, 200,
		"clock back, session $round: time part of every number is ahead of the clock");
}

is(count_rollback_warnings($node, $log_offset),
	1, 'exactly one clock-rollback WARNING in the server log');
is(stat_value($node, 'clock_rollbacks'), 1, 'stats: clock_rollbacks = 1');

############################################################################
# Immediate stop and start, still one hour back
############################################################################

$node->stop('immediate');
$log_offset = -s $node->logfile;
start_faked($node);

$offset = server_clock_offset($node);
ok( $offset <= -3595 && $offset >= -3605,
	"after restart the server clock is still one hour back ($offset s)");

($rc, $err, @nums) = issue($node, 1000);
is($rc, 0, 'restart, clock back: numbers issued');
check_batch('restart, clock back', 1000, @nums);
is($leading, 1000,
	'restart, clock back: time part of every number is ahead of the clock');
is( $node->safe_psql(
		'postgres',
		"SELECT p.issued_at > now() FROM payidem.order_no_parse('$nums[0]') p"),
	't',
	'restart, clock back: issued_at of the first number > now()');

($rc, $err, @nums) = issue($node, 300);
check_batch('restart, clock back, second session', 300, @nums);

is(count_rollback_warnings($node, $log_offset),
	1, 'restart, clock back: the rollback is logged once after the restart');
ok( $node->log_contains(qr/stored before the restart/, $log_offset),
	'restart, clock back: the warning tells it was found against the stored mark');
is(stat_value($node, 'clock_rollbacks'),
	1, 'restart, clock back: stats count the rollback once');

############################################################################
# Clock set right again
############################################################################

$log_offset = -s $node->logfile;
set_clock_offset('+0');
$offset = server_clock_offset($node);
ok(abs($offset) <= 5, "server clock is right again ($offset s)");

for my $round (1 .. 3)
{
	($rc, $err, @nums) = issue($node, 500);
	is($rc, 0, "clock right again, session $round: numbers issued");
	check_batch("clock right again, session $round", 500, @nums);
	is($lagging, 0,
		"clock right again, session $round: time part does not lag the clock");
}
is(count_rollback_warnings($node, $log_offset),
	0, 'clock moving forward is not reported as a rollback');
is(stat_value($node, 'clock_rollbacks'),
	1, 'clock right again: clock_rollbacks unchanged');

############################################################################
# Clock jumps forward past the reservation: numbers follow the clock again
############################################################################

set_clock_offset('+1m');
$offset = server_clock_offset($node);
ok($offset >= 55 && $offset <= 65, "server clock one minute ahead ($offset s)");

($rc, $err, @nums) = issue($node, 500);
is($rc, 0, 'clock ahead: numbers issued');
check_batch('clock ahead', 500, @nums);
is($lagging, 0, 'clock ahead: time part does not lag the clock');
is($leading, 0, 'clock ahead: time part follows the clock (no longer ahead of it)');
is(count_rollback_warnings($node, $log_offset),
	0, 'clock ahead: no rollback warning');

############################################################################
# Clock moving back and forth while 16 sessions draw numbers
############################################################################

$node->safe_psql(
	'postgres', q{
	CREATE SEQUENCE local_seq;
	CREATE TABLE drawn (pid int, local_no bigint, order_no text COLLATE "C")});
my $rollbacks_before = stat_value($node, 'clock_rollbacks');
$log_offset = -s $node->logfile;

my $script = $node->basedir . '/002_draw.sql';
PostgreSQL::Test::Utils::append_to_file($script,
	"INSERT INTO drawn VALUES (pg_backend_pid(), nextval('local_seq'), payidem.gen_order_no());\n"
);
my ($bench_out, $bench_err) = ('', '');
my $bench = IPC::Run::start(
	[
		'pgbench', '--no-vacuum', '--client=16', '--jobs=16', '--time=18',
		"--file=$script", '--host=' . $node->host, '--port=' . $node->port,
		'postgres'
	],
	'>', \$bench_out, '2>', \$bench_err);

# each round: one hour back (a rollback), then two minutes ahead, each for
# about a second (set_clock_offset waits for the next real second); the
# first once every session draws numbers
my $rounds = 5;
my $drawing = 0;
for (1 .. 100)
{
	$drawing = $node->safe_psql('postgres', 'SELECT count(DISTINCT pid) FROM drawn');
	last if $drawing >= 16;
	Time::HiRes::sleep(0.1);
}
is($drawing, 16, 'all 16 sessions draw numbers before the clock jumps');
$unclean_steps = 0;
for my $round (1 .. $rounds)
{
	set_clock_offset('-1h');
	set_clock_offset('+2m');
}
ok($bench->finish, 'pgbench drawing numbers while the clock jumps exited successfully');
like($bench_out, qr/number of failed transactions: 0 /,
	'pgbench: no transaction failed while the clock jumped');
note("pgbench:\n$bench_out$bench_err");

my $drawn = $node->safe_psql('postgres', 'SELECT count(*) FROM drawn');
cmp_ok($drawn, '>', 1000, "clock jumping: $drawn numbers drawn by 16 sessions");
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) - count(DISTINCT order_no) FROM drawn'),
	0,
	'clock jumping: no number drawn twice');
is( $node->safe_psql(
		'postgres', q{
		SELECT count(*) FROM (
			SELECT order_no,
			       lag(order_no) OVER (PARTITION BY pid ORDER BY local_no) AS prev
			FROM drawn) s
		WHERE prev IS NOT NULL AND NOT order_no > prev}),
	0,
	'clock jumping: within each session the numbers increase');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM drawn WHERE order_no <= '$nums[-1]'"),
	0,
	'clock jumping: every number is above the numbers issued before');

my $rollbacks = stat_value($node, 'clock_rollbacks') - $rollbacks_before;
my $warnings = count_rollback_warnings($node, $log_offset);
# Each backward step lasts about a second of sixteen sessions drawing
# numbers: every one is seen, and none is counted twice (a session whose
# clock reading predates another's handling of the step must not report it
# again).
if ($unclean_steps == 0)
{
	is($rollbacks, $rounds,
		"clock jumping: each of the $rounds rollbacks counted exactly once");
}
else
{
	# a step that landed near a second's start may be seen twice, or late
	ok(abs($rollbacks - $rounds) <= $unclean_steps,
		"clock jumping: $rollbacks rollbacks counted for $rounds ($unclean_steps steps not clean)");
}
is($warnings, $rollbacks,
	"clock jumping: each counted rollback is logged exactly once ($warnings warnings)");

is($node->safe_psql('postgres', 'SELECT 1'), 1, 'server still healthy');

$node->stop;

############################################################################
# A clock standing still across an immediate stop + start, after an
# installation of the extension that was rolled back
############################################################################

# a new server: its own numbers
%seen = ();
$highest = '';

# absolute, frozen fake time
sub freeze_clock_at
{
	my ($epoch) = @_;
	set_clock_offset(POSIX::strftime('%Y-%m-%d %H:%M:%S', gmtime($epoch)));
	return;
}

sub hwm
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		'SELECT last_value FROM payidem.order_no_hwm');
}

sub second_of
{
	my ($node, $n) = @_;
	return $node->safe_psql('postgres',
		"SELECT extract(epoch FROM issued_at)::bigint FROM payidem.order_no_parse('$n')"
	);
}

set_clock_offset('+0');
my $node2 = payidem_node('frozen', start => 0);
start_faked($node2);
$node2->safe_psql('postgres', 'CREATE EXTENSION payidem');

# tomorrow, whatever today is
my $frozen = time() + 86400;
freeze_clock_at($frozen);
is( $node2->safe_psql(
		'postgres', 'SELECT extract(epoch FROM clock_timestamp())::bigint'),
	$frozen,
	'frozen clock: the server reads the frozen time');

($rc, $err, @nums) = issue($node2, 100);
check_batch('frozen clock', 100, @nums);
cmp_ok(hwm($node2), '>', second_of($node2, $nums[-1]),
	'frozen clock: the stored mark is above the second of every number');

# control: same frozen second before and after an immediate stop
$node2->stop('immediate');
start_faked($node2);
($rc, $err, @nums) = issue($node2, 100);
is($rc, 0, 'frozen clock, after immediate stop: numbers issued');
check_batch('frozen clock, after immediate stop', 100, @nums);
cmp_ok(hwm($node2), '>', second_of($node2, $nums[-1]),
	'frozen clock, after immediate stop: the stored mark is above every number');

# move the frozen clock past the stored mark; reinstall the extension in a
# transaction that rolls back, trying to draw a number in it: refused, since a
# mark written into a sequence of that transaction would vanish with it
freeze_clock_at(hwm($node2) + 2);
($rc, my $out, $err) = $node2->psql('postgres',
	'BEGIN; DROP EXTENSION payidem; CREATE EXTENSION payidem; SELECT payidem.gen_order_no(); ROLLBACK;'
);
like($err, qr/cannot issue order numbers in the transaction that installed payidem/,
	'rolled-back reinstall: no number is issued in the installing transaction');
is(scalar(grep { /^PO/ } split /\n/, $out), 0,
	'rolled-back reinstall: no number came out of it');

($rc, $err, @nums) = issue($node2, 100);
is($rc, 0, 'after the rolled-back reinstall: numbers issued');
check_batch('after the rolled-back reinstall', 100, @nums);
cmp_ok(hwm($node2), '>', second_of($node2, $nums[-1]),
	'after the rolled-back reinstall: the stored mark is above every number issued');

$node2->stop('immediate');
start_faked($node2);
($rc, $err, @nums) = issue($node2, 100);
check_batch('after the rolled-back reinstall and an immediate stop', 100, @nums);

# a committed reinstall: the new mark starts above every number issued before,
# even with a crash before the next number
freeze_clock_at(hwm($node2) + 2);
$node2->safe_psql('postgres', 'DROP EXTENSION payidem; CREATE EXTENSION payidem;');
cmp_ok(hwm($node2), '>', second_of($node2, $nums[-1]),
	'committed reinstall: the new mark starts above every earlier number');
$node2->stop('immediate');
start_faked($node2);
($rc, $err, @nums) = issue($node2, 100);
check_batch('after a committed reinstall and an immediate stop', 100, @nums);

set_clock_offset('+0');
$node2->stop;

note(sprintf('runtime %.1f s', Time::HiRes::time() - $t_start));
done_testing();
