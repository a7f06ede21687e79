# The housekeeping worker (DESIGN §7 "Housekeeping", src/housekeeping.c),
# with payidem.housekeeping_interval = 1 s:
#
# 1. an expired order with no attempt is closed (order.closed event, stats
#    counted) within two intervals of its expiry; an expired order whose
#    attempt is still pending is left pending and listed by query_due();
# 2. idempotency keys past payidem.idem_retention are purged (completed and
#    failed), a key within it and a processing key are kept, and a new
#    retention applies after a reload;
# 3. every database with payidem is housekept, one without it is skipped
#    quietly; the expiry queue lets go of closed and paid orders once their
#    time has passed, and an expiry a DBA moves earlier is the one that counts; DROP EXTENSION in one leaves no error loop in the log and the
#    other goes on; DROP DATABASE works while the worker runs;
# 4. a worker stuck behind a lock shows in pg_stat_activity, gives up at
#    its lock_timeout (one logged error per interval, never a loop) and
#    closes the order once the lock is gone;
# 5. a new interval applies at a reload; payidem.housekeeping = off stops
#    all work until it is turned on again;
# 6. with no background worker slot free this is logged once, not every
#    round; after pg_ctl restart and after a backend crash the launcher is
#    back and work resumes.
#
# Every wait for something to happen polls against a deadline; only the
# checks that nothing happens (housekeeping off, no slot free) wait a fixed
# few intervals.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes qw(time usleep);

my $t_start = time();
my $interval = 1;    # payidem.housekeeping_interval, seconds

my $node = payidem_node('housekeeping', housekeeping => 1, conf => qq{
payidem.housekeeping_interval = ${interval}s
restart_after_crash = on
});

# ---------------------------------------------------------------- helpers

# Poll $sql in $db until it returns 't'; false if $seconds pass first.
sub wait_for
{
	my ($db, $sql, $seconds) = @_;
	my $deadline = time() + $seconds;
	while (1)
	{
		return 1 if $node->safe_psql($db, $sql) eq 't';
		return 0 if time() > $deadline;
		usleep(100_000);
	}
}

# A counter of payidem.stats(): value (this database) or server_value.
sub stat_of
{
	my ($db, $name, $column) = @_;
	$column //= 'value';
	return $node->safe_psql($db,
		"SELECT coalesce($column, 0) FROM payidem.stats() WHERE name = '$name'");
}

# A counter once it has reached $want (or, after 5 s, whatever it is).  The
# worker counts a closed order or a purged batch just after the commit that
# a test sees, and a run once it has ended: read at once, the counter may
# not have caught up with what the test saw.
sub counted
{
	my ($db, $name, $want, $column) = @_;
	$column //= 'value';
	wait_for($db, "SELECT coalesce($column, 0) = $want FROM payidem.stats() WHERE name = '$name'", 5);
	return stat_of($db, $name, $column);
}

# Wait until $n more housekeeping runs have completed in $db.
sub wait_runs
{
	my ($db, $n, $seconds) = @_;
	my $runs = stat_of($db, 'housekeeping_runs');
	return wait_for($db,
		"SELECT value >= $runs + $n FROM payidem.stats() WHERE name = 'housekeeping_runs'",
		$seconds);
}

sub setup_db
{
	my ($db) = @_;
	$node->safe_psql($db, q{
		CREATE EXTENSION payidem;
		CREATE TABLE hk_merchant AS SELECT merchant_no FROM payidem.create_merchant('HK Shop', 'retail', 0.006);
		SELECT payidem.create_channel('HK_WX', 'wechat', 0.002);
		SELECT payidem.bind_channel(merchant_no, 'HK_WX') FROM hk_merchant;
	});
	return;
}

sub new_order
{
	my ($db, $ref, $expire_in) = @_;
	return $node->safe_psql($db, qq{
		SELECT payidem.create_order(merchant_no, '$ref', 100, 'hk $ref', 'https://shop.example/n',
		                            expire_in => '$expire_in')
		  FROM hk_merchant});
}

sub status_of
{
	my ($db, $order_no) = @_;
	return $node->safe_psql($db,
		qq{SELECT status FROM payidem."order" WHERE order_no = '$order_no'});
}

sub closed_sql
{
	my ($order_no) = @_;
	return qq{SELECT status = 'closed' FROM payidem."order" WHERE order_no = '$order_no'};
}

sub reload_with
{
	my (@settings) = @_;
	$node->safe_psql('postgres', join(';', @settings, 'SELECT pg_reload_conf()'));
	return;
}

# Log lines from $offset on that match $re.
sub log_lines
{
	my ($offset, $re) = @_;
	my $log = slurp_file($node->logfile, $offset);
	return scalar(grep { /$re/ } split /\n/, $log);
}

# Housekeeping's own failures: a worker's ERROR or FATAL, or a worker that
# exited with an error (the postmaster's line names it).
my $worker_failure = qr/(?:ERROR|FATAL):.*|payidem housekeeping.*exited with exit code [1-9]/;
sub worker_errors
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	return scalar(grep { /$worker_failure/ && /payidem housekeeping/ } split /\n/, $log);
}

sub launcher_pid
{
	return $node->safe_psql('postgres', q{
		SELECT pid FROM pg_stat_activity
		 WHERE backend_type = 'payidem housekeeping launcher'
		   AND application_name = 'payidem housekeeping launcher'});
}

# ---------------------------------------------------------------- set-up
setup_db('postgres');
# a database without payidem, visited every round and skipped quietly
$node->safe_psql('postgres', 'CREATE DATABASE hk_plain');
my $log_start = -s $node->logfile;

like(launcher_pid(), qr/^\d+$/, 'one launcher runs, connected to no database');
is($node->safe_psql('postgres', q{
	SELECT datname IS NULL FROM pg_stat_activity WHERE backend_type = 'payidem housekeeping launcher'}),
	't', '... it shows without a database');
ok(wait_for('postgres', q{
	SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE backend_type = 'payidem housekeeping launcher'}, 5),
	'... and waits for the next round on its latch');
ok(wait_runs('postgres', 1, 10), 'the worker has run in the database');

# health(): the launcher alive and the database's last run known; the
# launcher gone (SIGTERM), a problem in words, until the postmaster starts
# it again
my $hk_health = q{SELECT (h -> 'housekeeping' ->> 'running') || ' ' || (h -> 'housekeeping' ->> 'last_run_at' IS NOT NULL)
					|| ' ' || (h -> 'problems' @> '["the housekeeping launcher is not running"]')
					FROM payidem.health() h};
is($node->safe_psql('postgres', $hk_health), 'true true false', 'health(): housekeeping running, its last run known');
my $first_launcher = launcher_pid();
is(kill('TERM', $first_launcher), 1, 'the launcher is ended (SIGTERM)');
ok(wait_for('postgres', "SELECT ($hk_health) = 'false true true'", 5),
	'... health() says it is not running, and why');
ok(wait_for('postgres', "SELECT ($hk_health) = 'true true false'", 30), '... until it is back');
isnt(launcher_pid(), $first_launcher, '... as a new process');
# (the launcher's end was logged as FATAL: the checks of errors start here)
$log_start = -s $node->logfile;

# ---------------------------------------------------------------- 1. expired orders
note(sprintf('1. expired orders at %.1f s', time() - $t_start));
# (counted before order A exists: the run that closes it ends after this)
my $runs_before = stat_of('postgres', 'housekeeping_runs');
my $order_a = new_order('postgres', 'HK-A', '1 second');
my $made_a = time();
# the order and its attempt in one transaction: both see the same now(), so
# the attempt begins before the expiry however slow the machine (as two
# calls it would fail with PI008, or the worker close the order first, after
# a pause of two seconds between them)
my ($order_b, $pay_b) = split /\n/, $node->safe_psql('postgres', q{
	BEGIN;
	SELECT payidem.create_order(merchant_no, 'HK-B', 100, 'hk HK-B', 'https://shop.example/n',
	                            expire_in => '2 seconds') AS o FROM hk_merchant \gset
	SELECT :'o';
	SELECT payidem.begin_payment(:'o', 'HK_WX');
	COMMIT;
});
like($pay_b, qr/^PY\d{24}$/, 'an attempt began on the second order before it expired');

# expiry (1 s) + two intervals, and a second for a slow machine
ok(wait_for('postgres', closed_sql($order_a), 1 + 2 * $interval + 1),
	'an expired order without an attempt is closed within two intervals');
note(sprintf('closed %.1f s after it was created', time() - $made_a));
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM payidem.notify_event WHERE order_no = '$order_a' AND event = 'order.closed'}),
	'1', '... with its order.closed event');
is(counted('postgres', 'housekeeping_orders_closed', 1), '1', '... counted in housekeeping_orders_closed');
ok(wait_for('postgres', "SELECT value > $runs_before FROM payidem.stats() WHERE name = 'housekeeping_runs'", 5),
	'housekeeping_runs grows');

ok(wait_for('postgres', qq{SELECT expire_at < now() FROM payidem."order" WHERE order_no = '$order_b'}, 5),
	'the order with a pending attempt has expired');
ok(wait_runs('postgres', 2, 5), 'two more runs since');
is(status_of('postgres', $order_b), 'pending', 'an expired order whose attempt is pending is not closed');
is($node->safe_psql('postgres', "SELECT status FROM payidem.payment WHERE payment_no = '$pay_b'"),
	'pending', '... nor its attempt');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM payidem.query_due(100) WHERE order_no = '$order_b' AND payment_no = '$pay_b'}),
	'1', '... it is listed by query_due() for the application to query the channel');
is(stat_of('postgres', 'housekeeping_orders_closed'), '1', 'only the one order was closed');

# ---------------------------------------------------------------- 2. idempotency keys
note(sprintf('2. idempotency keys at %.1f s', time() - $t_start));
$node->safe_psql('postgres', q{
	SELECT payidem.idem_claim('hk:old-completed', 'hk', NULL, NULL, 1);
	SELECT payidem.idem_finish('hk:old-completed', 'completed');
	SELECT payidem.idem_claim('hk:old-failed', 'hk', NULL, NULL, 1);
	SELECT payidem.idem_finish('hk:old-failed', 'failed');
	SELECT payidem.idem_claim('hk:recent', 'hk', NULL, NULL, 1);
	SELECT payidem.idem_finish('hk:recent', 'completed');
	SELECT payidem.idem_claim('hk:old-processing', 'hk', NULL, NULL, 1, NULL, '1 day');
	UPDATE payidem.idempotency SET created_at = now() - interval '10 minutes', updated_at = now() - interval '10 minutes'
	 WHERE idem_key IN ('hk:old-completed', 'hk:old-failed', 'hk:old-processing');
	UPDATE payidem.idempotency SET created_at = now() - interval '20 seconds', updated_at = now() - interval '20 seconds'
	 WHERE idem_key = 'hk:recent';
});
my $keys_sql = q{SELECT string_agg(idem_key, ',' ORDER BY idem_key) FROM payidem.idempotency WHERE idem_key LIKE 'hk:%'};
ok(wait_runs('postgres', 2, 5), 'two runs with the default retention');
is($node->safe_psql('postgres', $keys_sql), 'hk:old-completed,hk:old-failed,hk:old-processing,hk:recent',
	'the default retention (24 h) keeps keys 10 minutes old');
is(stat_of('postgres', 'housekeeping_keys_purged'), '0', '... none counted as purged');

reload_with(q{ALTER SYSTEM SET payidem.idem_retention = '60s'});
ok(wait_for('postgres', q{SELECT count(*) = 0 FROM payidem.idempotency WHERE idem_key IN ('hk:old-completed', 'hk:old-failed')}, 5),
	'with payidem.idem_retention = 60s the completed and failed keys 10 minutes old are purged');
is($node->safe_psql('postgres', $keys_sql), 'hk:old-processing,hk:recent',
	'a key within the retention and a processing key are kept');
is(counted('postgres', 'housekeeping_keys_purged', 2), '2', '... and housekeeping_keys_purged counts the two');
# back to the default: keys made early in this test must not age out under it
reload_with(q{ALTER SYSTEM RESET payidem.idem_retention});

# ---------------------------------------------------------------- 3. several databases
note(sprintf('3. several databases at %.1f s', time() - $t_start));
$node->safe_psql('postgres', 'CREATE DATABASE hk_other');
setup_db('hk_other');
my $order_c = new_order('hk_other', 'HK-C', '1 second');
ok(wait_for('hk_other', closed_sql($order_c), 1 + 2 * $interval + 1), 'an expired order in a second database is closed');
is(counted('hk_other', 'housekeeping_orders_closed', 1), '1', '... counted for that database');
is(counted('hk_other', 'housekeeping_orders_closed', 2, 'server_value'), '2', '... and in the server total');
is(worker_errors($log_start), 0, 'no housekeeping error so far (the database without payidem is skipped quietly)');

# the expiry queue (payidem.order_expiry): a closed order's row goes once
# its time has passed; so does a paid one's, and the payment wrote none; an
# expiry a DBA moves earlier is the one that counts
my $queued = sub {
	my ($order_no) = @_;
	return qq{SELECT (SELECT count(*) FROM payidem.order_expiry WHERE order_no = '$order_no')};
};
ok(wait_for('hk_other', $queued->($order_c) . ' = 0', 2 * $interval + 2),
	'the expiry queue lets go of the closed order');
# made, begun and paid in one transaction (one now()), before its expiry
# however slow the machine
my ($order_paid, $applied_paid) = split /\n/, $node->safe_psql('hk_other', q{
	BEGIN;
	SELECT payidem.create_order(merchant_no, 'HK-Q1', 100, 'hk HK-Q1', 'https://shop.example/n',
	                            expire_in => '1 second') AS o FROM hk_merchant \gset
	SELECT :'o';
	SELECT payidem.apply_payment_result(payidem.begin_payment(:'o', 'HK_WX'), 'callback', 'succeeded', 'TX-HK-Q1', 100);
	COMMIT;
});
is($applied_paid, 'applied', 'an order paid before its expiry');
is($node->safe_psql('hk_other', $queued->($order_paid)), '1', '... is still queued, once: its payment wrote nothing there');
ok(wait_for('hk_other', $queued->($order_paid) . ' = 0', 1 + 2 * $interval + 2),
	'... and leaves the queue once its time has passed');
is(status_of('hk_other', $order_paid), 'paid', '... still paid');
my $order_moved = new_order('hk_other', 'HK-Q2', '1 hour');
$node->safe_psql('hk_other', qq{UPDATE payidem."order" SET expire_at = now() + interval '1 second' WHERE order_no = '$order_moved'});
is($node->safe_psql('hk_other', $queued->($order_moved)), '2', 'an expiry moved earlier is queued at its new time too');
ok(wait_for('hk_other', closed_sql($order_moved), 1 + 2 * $interval + 2),
	'... and the order is closed at that time, not an hour later');
ok(wait_for('hk_other', $queued->($order_moved) . ' = 1', 2 * $interval + 2),
	'... its row at that time leaves the queue; the one of its old time waits for that time');

my $offset = -s $node->logfile;
$node->safe_psql('hk_other', 'DROP EXTENSION payidem CASCADE');
my $order_d = new_order('postgres', 'HK-D', '1 second');
ok(wait_for('postgres', closed_sql($order_d), 1 + 2 * $interval + 1),
	'after DROP EXTENSION in the other database this one is still housekept');
ok(wait_runs('postgres', 1, 3), 'one more round since');
# the worker may have been inside the other database at the very moment of
# the drop (one error); a loop would log one per round
cmp_ok(worker_errors($offset), '<=', 1, 'no error loop for the database without the extension any more');

# DROP DATABASE waits up to 5 s for a connected worker: it should just work
for my $db ('hk_other', 'hk_plain')
{
	my $dropped = 0;
	my $drop_error = '';
	my $drop_deadline = time() + 20;
	while (!$dropped && time() < $drop_deadline)
	{
		my ($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE $db");
		$dropped = $rc == 0;
		$drop_error = $err;
	}
	ok($dropped, "DROP DATABASE $db, a housekept database, succeeds") or diag($drop_error);
}
my $order_e = new_order('postgres', 'HK-E', '1 second');
ok(wait_for('postgres', closed_sql($order_e), 1 + 2 * $interval + 1), '... and housekeeping carries on');
cmp_ok(log_lines($offset, qr/FATAL:.*database \d+ does not exist/), '<=', 2,
	'at most one failed connection per dropped database');
cmp_ok(worker_errors($offset), '<=', 3, 'no error loop after the drops');

# ---------------------------------------------------------------- 4. behind a lock
note(sprintf('4. behind a lock at %.1f s', time() - $t_start));
# A session holds status_log so that closing an order must wait: the worker
# shows in pg_stat_activity, gives up at lock_timeout (200 ms) and exits 1; the
# launcher starts the next one only after an interval, so the log gets one
# error per round, never a loop.
# (the order is made first: making one writes status_log too.  It expires
# only once the lock is held: made to expire in a second, a pause of a second
# before the LOCK would let the worker close it first.  Moving its expire_at
# writes no status_log row.)
my $order_f = new_order('postgres', 'HK-F', '1 hour');
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN');
$locker->query_safe('LOCK TABLE payidem.status_log IN SHARE MODE');
$offset = -s $node->logfile;
$node->safe_psql('postgres', qq{UPDATE payidem."order" SET expire_at = now() WHERE order_no = '$order_f'});
ok(wait_for('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'payidem housekeeping' AND application_name = 'payidem housekeeping'
	   AND datname = current_database() AND state = 'active' AND wait_event_type = 'Lock'
	   AND query LIKE '%_close_expired_order%'}, 6),
	'a worker waiting for a lock shows in pg_stat_activity as payidem housekeeping');

# the time each lock timeout appears in the log
sub wait_timeouts
{
	my ($n, $seconds) = @_;
	my $deadline = time() + $seconds;
	while (log_lines($offset, qr/ERROR:.*canceling statement due to lock timeout/) < $n)
	{
		return undef if time() > $deadline;
		usleep(50_000);
	}
	return time();
}
my $first = wait_timeouts(1, 5);
ok(defined $first, '... gives up at its lock_timeout');
my $second = wait_timeouts(2, 8);
ok(defined $second, '... and the next round tries again');
cmp_ok(($second // 0) - ($first // 0), '>=', $interval - 0.2,
	'... an interval later, not at once');
is(status_of('postgres', $order_f), 'pending', 'the order stays pending while the lock is held');
is(log_lines($offset, qr/payidem housekeeping.*exited with exit code 1/), 2,
	'each attempt was one worker that exited with code 1');
$locker->query_safe('COMMIT');
$locker->quit;
ok(wait_for('postgres', closed_sql($order_f), 2 * $interval + 3), '... and is closed once the lock is gone');

# ---------------------------------------------------------------- 4b. an order that cannot be closed
note(sprintf('4b. an order that cannot be closed at %.1f s', time() - $t_start));
# A trigger of the DBA's refuses to close one order.  The error is logged,
# naming the database and the order; the other expired orders are closed in
# the same rounds and the keys purged: one bad order stops only itself.
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.hk_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF NEW.out_trade_no = 'HK-BAD' AND NEW.status = 'closed' THEN
			RAISE EXCEPTION 'HK-BAD may not be closed';
		END IF;
		RETURN NEW;
	END $$;
	CREATE TRIGGER hk_refuse BEFORE UPDATE ON payidem."order" FOR EACH ROW EXECUTE FUNCTION public.hk_refuse();
});
$offset = -s $node->logfile;
my $order_bad = new_order('postgres', 'HK-BAD', '1 second');
my $order_good = new_order('postgres', 'HK-GOOD', '2 seconds');
ok(wait_for('postgres', closed_sql($order_good), 2 + 2 * $interval + 2),
	'an order expiring after one that cannot be closed is closed');
is(status_of('postgres', $order_bad), 'pending', 'the one that cannot be closed stays pending');
cmp_ok(log_lines($offset, qr/HK-BAD may not be closed/), '>=', 1, 'its error is logged');
my $log_tail = slurp_file($node->logfile, $offset);
like($log_tail, qr/CONTEXT:.*?payidem housekeeping in database "postgres", closing expired order \Q$order_bad\E/s,
	'... naming the database and the order');
$node->safe_psql('postgres', 'DROP TRIGGER hk_refuse ON payidem."order"; DROP FUNCTION public.hk_refuse()');
ok(wait_for('postgres', closed_sql($order_bad), 2 * $interval + 2), '... and it is closed once it can be');

# ---------------------------------------------------------------- 5. interval and on/off
note(sprintf('5. interval and on/off at %.1f s', time() - $t_start));
# The time at which the next run completes in this database.
sub next_run_at
{
	my ($seconds) = @_;
	my $runs = stat_of('postgres', 'housekeeping_runs');
	my $deadline = time() + $seconds;
	while (stat_of('postgres', 'housekeeping_runs') == $runs)
	{
		return undef if time() > $deadline;
		usleep(50_000);
	}
	return time();
}
reload_with(q{ALTER SYSTEM SET payidem.housekeeping_interval = '2s'});
my $run1 = next_run_at(4);
my $run2 = next_run_at(4);
ok(defined $run1 && defined $run2, 'after a reload to 2 s, runs go on');
# Rounds 2 s apart: the runs counted between two reads of the counter all
# completed within the time from before the first read to after the second,
# and rounds start a full interval after the previous one ended; a run
# completes a little after its round starts (a worker is started for it), so
# at most that time / 2 + 2 of them (at a 1 s interval, about twice as many).
# A bound the test's own lateness cannot break (timing two runs from here
# could: a read that returns late makes them look closer than they were; 1.74 s
# was once measured so).
my $w0 = time();
my $c0 = stat_of('postgres', 'housekeeping_runs');
usleep(7_000_000);
my $c1 = stat_of('postgres', 'housekeeping_runs');
my $window = time() - $w0;
cmp_ok($c1 - $c0, '<=', int($window / 2) + 2,
	sprintf('... %d runs in %.1f s: at least 2 s apart', $c1 - $c0, $window));
reload_with(q{ALTER SYSTEM RESET payidem.housekeeping_interval});
my $reset_at = time();
my $run3 = next_run_at(3);
my $run4 = next_run_at(3);
ok(defined $run3 && defined $run4, 'back to 1 s');
cmp_ok(($run3 // 99) - $reset_at, '<', 2, '... the wait under way shortened at once');
cmp_ok(($run4 // 99) - ($run3 // 0), '<', 2, sprintf('... runs %.1f s apart again', ($run4 // 99) - ($run3 // 0)));

reload_with(q{ALTER SYSTEM SET payidem.housekeeping = off});
# a worker under way when the reload arrived may still finish
usleep(1_000_000);
my $runs_off = stat_of('postgres', 'housekeeping_runs');
my $order_g = new_order('postgres', 'HK-G', '1 second');
usleep(2_500_000);
is(status_of('postgres', $order_g), 'pending', 'payidem.housekeeping = off: an expired order stays pending for several intervals');
is(stat_of('postgres', 'housekeeping_runs'), $runs_off, '... and no run happens');
like(launcher_pid(), qr/^\d+$/, '... while the launcher keeps running');
reload_with(q{ALTER SYSTEM RESET payidem.housekeeping});
ok(wait_for('postgres', closed_sql($order_g), 2 * $interval + 2), 'turned on again: the order is closed');

# ---------------------------------------------------------------- 6. restart and crash
note(sprintf('6. restart and crash at %.1f s', time() - $t_start));
# First without a free worker slot: the launcher holds the only one.
$node->append_conf('postgresql.conf', "max_worker_processes = 1\nmax_logical_replication_workers = 0\n");
$node->restart;
$offset = -s $node->logfile;
my $no_slot = qr/payidem housekeeping could not start a worker/;
ok($node->wait_for_log($no_slot, $offset), 'no worker slot free: logged');
my $order_slots = new_order('postgres', 'HK-SLOTS', '1 second');
usleep(2_500_000);
is(log_lines($offset, $no_slot), 1, '... once, not at every round');
is(status_of('postgres', $order_slots), 'pending', '... and nothing is closed');
$node->append_conf('postgresql.conf', "max_worker_processes = 8\nmax_logical_replication_workers = 4\n");

my $pid_before = launcher_pid();
$node->restart;
ok(wait_for('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'payidem housekeeping launcher'}, 5),
	'after pg_ctl restart the launcher is back');
isnt(launcher_pid(), $pid_before, '... as a new process');
my $order_h = new_order('postgres', 'HK-H', '1 second');
ok(wait_for('postgres', closed_sql($order_h), 1 + 2 * $interval + 1), '... and closes expired orders');
is(status_of('postgres', $order_slots), 'closed', '... also the one left while no slot was free');

$pid_before = launcher_pid();
my $victim = $node->background_psql('postgres');
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
chomp $victim_pid;
$offset = -s $node->logfile;
is(kill('KILL', $victim_pid), 1, "killed backend $victim_pid with SIGKILL");
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
eval { $victim->quit; };
ok($node->poll_query_until('postgres', 'SELECT true'), 'the server accepts connections again after the crash');
ok(wait_for('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'payidem housekeeping launcher'}, 15),
	'after the crash the launcher is back');
isnt(launcher_pid(), $pid_before, '... as a new process');
my $order_i = new_order('postgres', 'HK-I', '1 second');
ok(wait_for('postgres', closed_sql($order_i), 1 + 2 * $interval + 1), '... and work resumes');
is(counted('postgres', 'housekeeping_orders_closed', 1), '1', '... counted afresh in the rebuilt shared memory');

$node->stop;
my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/PANIC/, 'no PANIC');
note(sprintf('060_housekeeping took %.1f s', time() - $t_start));
done_testing();
