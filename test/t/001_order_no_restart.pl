
# Order numbers survive crashes: after an immediate stop, a killed backend
# (shared memory rebuilt) and the promotion of a streaming standby, every new
# number is greater than every number issued before -- including numbers that
# were handed out inside a transaction that never committed -- and no number
# is ever issued twice.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes qw(time);

my $t_start = time();

# Numbers are compared on their (time, shard, seq) part, characters 3-24:
# the guarantees are about that part whatever the prefix, and for one shard
# it orders as plain text.
sub core { return substr($_[0], 2, 22); }

# Every number seen in this test (by its core), with the phase that produced it.
my %seen;
my @everything;
my $duplicates = 0;

# Highest core of all phases so far, and the full number that has it.
my $highest = '';
my $highest_full = '';

# Issue $count numbers in one statement of a new session; returned in issue order.
sub issue
{
	my ($node, $count, $prefix) = @_;
	$prefix = 'PO' unless defined $prefix;
	my $out = $node->safe_psql('postgres',
		"SELECT payidem.gen_order_no('$prefix') FROM generate_series(1, $count)"
	);
	return split /\n/, $out;
}

# The same in another database of the server.
sub issue_in
{
	my ($node, $db, $count) = @_;
	my $out = $node->safe_psql($db,
		"SELECT payidem.gen_order_no() FROM generate_series(1, $count)");
	return split /\n/, $out;
}

# Same through an open background psql session (no commit implied).
sub issue_bg
{
	my ($session, $count) = @_;
	my $out = $session->query_safe(
		"SELECT payidem.gen_order_no() FROM generate_series(1, $count)");
	return split /\n/, $out;
}

# Check one phase's numbers, given in issue order: well formed, strictly
# increasing, all above every number of the earlier phases, never seen before.
sub check_phase
{
	my ($phase, $expected_count, @nums) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;

	is(scalar(@nums), $expected_count, "$phase: got $expected_count numbers");
	is(scalar(grep { !/^(PO|PY|RF)[0-9]{24}$/ } @nums),
		0, "$phase: every number is 26 characters of the expected shape");

	my $not_increasing = 0;
	for my $i (1 .. $#nums)
	{
		next if core($nums[$i]) gt core($nums[ $i - 1 ]);
		$not_increasing++;
		diag("$phase: $nums[$i] does not follow $nums[$i - 1]")
		  if $not_increasing <= 5;
	}
	is($not_increasing, 0,
		"$phase: numbers strictly increase in issue order");

	my ($min, $max) = (sort map { core($_) } @nums)[ 0, -1 ];
	ok($min gt $highest,
		"$phase: smallest new number ($min) is above every earlier number (highest $highest)"
	);

	my $dup_here = 0;
	for my $n (@nums)
	{
		if (exists $seen{ core($n) })
		{
			$dup_here++;
			diag("$phase: $n repeats a number of phase $seen{core($n)}");
		}
		$seen{ core($n) } = $phase;
		push @everything, $n;
	}
	$duplicates += $dup_here;
	is($dup_here, 0, "$phase: no number repeats one seen earlier");

	if ($max gt $highest)
	{
		$highest = $max;
		($highest_full) = grep { core($_) eq $max } @nums;
	}
	return;
}

# The durable high-water mark (an epoch second in payidem.order_no_hwm) must
# be above the second of every number issued so far.
sub check_mark
{
	my ($node, $phase) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($mark, $second) = split /\|/, $node->safe_psql(
		'postgres', qq{
		SELECT (SELECT last_value FROM payidem.order_no_hwm),
		       extract(epoch FROM issued_at)::bigint
		FROM payidem.order_no_parse('$highest_full')});
	cmp_ok($mark, '>', $second,
		"$phase: stored high-water mark $mark is above the second of the highest number ($second)"
	);
	return;
}

sub stat_value
{
	my ($node, $name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value FROM payidem.stats() WHERE name = '$name'");
}

# Let a background session go; its server may be gone already.
sub drop_session
{
	my ($session) = @_;
	eval { $session->quit; };
	return;
}

# a killed backend must make the postmaster rebuild shared memory, not stop
my $node = payidem_node('primary', init => { allows_streaming => 1 },
	conf => "restart_after_crash = on\nmax_connections = 20\n");

$node->safe_psql('postgres', 'CREATE EXTENSION payidem');
$node->safe_psql('postgres',
	'CREATE TABLE kept (n text COLLATE "C" NOT NULL, phase text NOT NULL)');

is(stat_value($node, 'order_no_reservations'),
	0, 'fresh server: no reservation made yet');

# a second database, whose own mark is written now and never again until
# phase 5b: numbers there must still continue above every later phase's
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION payidem');
my @p0 = issue_in($node, 'other', 50);
check_phase('phase 0 (another database, at the start)', 50, @p0);

############################################################################
# Phase 1: numbers in a transaction that never commits, then an immediate stop
############################################################################

my $bg = $node->background_psql('postgres');
$bg->query_safe('BEGIN');
# the first number of this server: the reservation is made inside this
# transaction, which will never commit
my @p1_open = issue_bg($bg, 500);
ok(stat_value($node, 'order_no_reservations') >= 1,
	'phase 1: the first numbers made a reservation (inside the open transaction)'
);
$bg->query_safe(
	q{INSERT INTO kept SELECT payidem.gen_order_no(), 'never committed' FROM generate_series(1, 200) RETURNING n}
);
my @p1_open_rows = split /\n/,
  $bg->query_safe(q{SELECT n FROM kept WHERE phase = 'never committed' ORDER BY n});

my @p1_committed = issue($node, 300);
$node->safe_psql('postgres',
	q{INSERT INTO kept SELECT payidem.gen_order_no('PY'), 'committed' FROM generate_series(1, 100)}
);
my @p1_committed_rows = split /\n/,
  $node->safe_psql('postgres',
	q{SELECT n FROM kept WHERE phase = 'committed' ORDER BY n});

# more from the open transaction, after the committed ones
my @p1_open_late = issue_bg($bg, 250);

# in issue order: the batches ran one after another
check_phase('phase 1 (before immediate stop)', 1350,
	@p1_open, @p1_open_rows, @p1_committed, @p1_committed_rows,
	@p1_open_late);

check_mark($node, 'phase 1 (before immediate stop)');

my $log_offset = -s $node->logfile;
$node->stop('immediate');
drop_session($bg);
$node->start;

is( $node->safe_psql('postgres', q{SELECT count(*) FROM kept WHERE phase = 'never committed'}),
	0,
	'after immediate stop: rows of the uncommitted transaction are gone');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM kept WHERE phase = 'committed'}),
	100,
	'after immediate stop: committed rows are kept');

############################################################################
# Phase 2: after the immediate stop + start
############################################################################

$bg = $node->background_psql('postgres');
$bg->query_safe('BEGIN');
my @p2_open = issue_bg($bg, 400);
my @p2 = issue($node, 600);
check_phase('phase 2 (after immediate stop and start)',
	1000, @p2_open, @p2);

ok( !$node->log_contains(
		qr/system clock moved backwards/, $log_offset),
	'no clock-rollback warning after an ordinary restart');

############################################################################
# Phase 3: a backend is killed with SIGKILL; shared memory is rebuilt
############################################################################

# a few more from the still-open transaction, then kill its backend
my @p3_open = issue_bg($bg, 300);
check_phase('phase 3 (open transaction, before the backend is killed)',
	300, @p3_open);
check_mark($node, 'phase 3 (before the backend is killed)');

my $victim = $bg->query_safe('SELECT pg_backend_pid()');
chomp $victim;
like($victim, qr/^\d+$/, 'got the pid of the backend to kill');

$log_offset = -s $node->logfile;
is(kill('KILL', $victim), 1, "sent SIGKILL to backend $victim");
$node->wait_for_log(
	qr/all server processes terminated; reinitializing/, $log_offset);
ok($node->poll_query_until('postgres', 'SELECT true'),
	'server accepts connections again after the backend crash');
drop_session($bg);

is(stat_value($node, 'order_nos_issued'),
	0, 'shared memory was rebuilt (stats start again from zero)');

my @p4 = issue($node, 500);
check_phase('phase 4 (after the killed backend)', 500, @p4);

# and once more: kill an idle backend that never issued a number
$bg = $node->background_psql('postgres');
$victim = $bg->query_safe('SELECT pg_backend_pid()');
chomp $victim;
my @p4_more = issue($node, 100);
check_phase('phase 4b (before second kill)', 100, @p4_more);
$log_offset = -s $node->logfile;
is(kill('KILL', $victim), 1, "sent SIGKILL to idle backend $victim");
$node->wait_for_log(
	qr/all server processes terminated; reinitializing/, $log_offset);
ok($node->poll_query_until('postgres', 'SELECT true'),
	'server accepts connections again after the second backend crash');
drop_session($bg);

my @p5 = issue($node, 500, 'RF');
check_phase('phase 5 (after the second killed backend, prefix RF)', 500,
	@p5);
check_mark($node, 'phase 5');

############################################################################
# Phase 5b: after a crash, another database is used first, then the
# extension is dropped and created again (a new, empty mark)
############################################################################

# Kill an idle backend and wait until the server is back.
sub crash
{
	my ($node, $what) = @_;
	my $session = $node->background_psql('postgres');
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	chomp $pid;
	my $offset = -s $node->logfile;
	kill('KILL', $pid);
	$node->wait_for_log(
		qr/all server processes terminated; reinitializing/, $offset);
	ok($node->poll_query_until('postgres', 'SELECT true'),
		"server accepts connections again after $what");
	drop_session($session);
	return;
}

crash($node, 'the crash before phase 5b');
# the numbers of phase 5 ran ahead of the clock (the logical second started
# at the mark after the crash before them); 'other' only knows its old mark
my @p5b_other = issue_in($node, 'other', 300);
check_phase('phase 5b (another database, first after a crash)', 300, @p5b_other);

$node->safe_psql('postgres', 'DROP EXTENSION payidem');
crash($node, 'a crash with the extension dropped');
$node->safe_psql('postgres', 'CREATE EXTENSION payidem');
my @p5b_new = issue($node, 300);
check_phase('phase 5b (extension created again after a crash)', 300, @p5b_new);
check_mark($node, 'phase 5b (new extension)');
ok(-s $node->data_dir . '/payidem_order_no.mark',
	'the server-wide mark file is in the data directory');

############################################################################
# Phase 6: streaming standby, promoted after the primary stops abruptly
############################################################################

$node->backup('onobackup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'onobackup', has_streaming => 1);
$standby->start;

my @p6 = issue($node, 400);
$bg = $node->background_psql('postgres');
$bg->query_safe('BEGIN');
my @p6_open = issue_bg($bg, 400);
check_phase('phase 6 (primary, standby streaming)', 800, @p6, @p6_open);

check_mark($node, 'phase 6 (primary)');
$node->wait_for_catchup($standby, 'replay');

my ($rc, $out, $err) =
  $standby->psql('postgres', 'SELECT payidem.gen_order_no()');
isnt($rc, 0, 'standby in recovery refuses to issue numbers');
like(
	$err,
	qr/cannot issue order numbers during recovery/,
	'standby in recovery says why it refuses');

$node->stop('immediate');
drop_session($bg);

$standby->promote;
ok( $standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
	'standby promoted');

my @p7 = issue($standby, 500);
check_phase('phase 7 (promoted standby)', 500, @p7);
check_mark($standby, 'phase 7 (promoted standby)');

############################################################################
# Everything together
############################################################################

is($duplicates, 0, 'no number was issued twice across all phases');

# all numbers seen, checked by the server too
my @all = @everything;
$standby->safe_psql('postgres',
	'CREATE TABLE seen_all (n text COLLATE "C")');
$standby->safe_psql('postgres',
	'INSERT INTO seen_all VALUES ' . join(',', map { "('$_')" } @all));
is( $standby->safe_psql(
		'postgres',
		'SELECT count(*), count(DISTINCT substr(n, 3, 22)), bool_and(payidem.order_no_valid(n)) FROM seen_all'
	),
	scalar(@all) . '|' . scalar(@all) . '|t',
	'server agrees: all ' . scalar(@all) . ' numbers are distinct and valid');

$standby->stop;

note(sprintf('runtime %.1f s', time() - $t_start));
done_testing();
