
# Order numbers under concurrency and volume: 8 pgbench clients x 2,000
# transactions never get the same number, and each backend sees its numbers
# increase in the order it asked for them; one statement can draw 1,000,000
# distinct numbers, and stats() counts them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes ();

my $t_start = Time::HiRes::time();

my $clients = 8;
my $per_client = 2000;
my $total = $clients * $per_client;

my $node = payidem_node('concurrent', conf => "log_statement = none\n");

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION payidem;
	CREATE SEQUENCE local_seq;
	CREATE TABLE drawn (
		pid      int    NOT NULL,
		local_no bigint NOT NULL,
		order_no text COLLATE "C" NOT NULL
	);
});

sub stat_value
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value FROM payidem.stats() WHERE name = '$name'");
}

############################################################################
# pgbench: 8 clients, 2,000 transactions each
############################################################################

my $issued_before = stat_value('order_nos_issued');

$node->pgbench(
	"--no-vacuum --client=$clients --jobs=$clients --transactions=$per_client",
	0,
	[qr{number of transactions actually processed: $total/$total}],
	[],
	"pgbench: $clients clients x $per_client transactions drawing order numbers",
	{
		'004_draw.sql' => q{
INSERT INTO drawn (pid, local_no, order_no)
VALUES (pg_backend_pid(), nextval('local_seq'), payidem.gen_order_no());
}
	},
	'postgres');

is($node->safe_psql('postgres', 'SELECT count(*) FROM drawn'),
	$total, "all $total rows are there");
is($node->safe_psql('postgres', 'SELECT count(DISTINCT pid) FROM drawn'),
	$clients, "the rows come from $clients backends");
is($node->safe_psql('postgres', 'SELECT count(DISTINCT order_no) FROM drawn'),
	$total, "all $total order numbers are distinct");
is( $node->safe_psql(
		'postgres', q{
		SELECT count(*) FROM (
			SELECT order_no FROM drawn GROUP BY order_no HAVING count(*) > 1) d}),
	0,
	'no order number appears twice');
is( $node->safe_psql(
		'postgres',
		'SELECT count(DISTINCT substr(order_no, 3, 22)) FROM drawn'),
	$total,
	'all (time, shard, seq) parts are distinct too');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM drawn WHERE NOT payidem.order_no_valid(order_no)'),
	0,
	'every number passes order_no_valid');
is( $node->safe_psql(
		'postgres', q{
		SELECT count(*) FROM (
			SELECT order_no,
			       lag(order_no) OVER (PARTITION BY pid ORDER BY local_no) AS prev
			FROM drawn) s
		WHERE prev IS NOT NULL AND NOT order_no > prev}),
	0,
	'within each backend the numbers increase in the order of local_seq');
is( $node->safe_psql(
		'postgres', q{
		SELECT count(*) FROM drawn d
		WHERE (SELECT issued_at FROM payidem.order_no_parse(d.order_no))
		      NOT BETWEEN now() - interval '10 minutes' AND now() + interval '1 minute'}),
	0,
	'the time part of every number is close to the clock (no crash or rollback here)');
cmp_ok(stat_value('order_nos_issued') - $issued_before,
	'>=', $total, "stats: order_nos_issued grew by at least $total");

############################################################################
# 1,000,000 numbers in one statement
############################################################################

my $million = 1_000_000;
$issued_before = stat_value('order_nos_issued');
my $before_max = $node->safe_psql('postgres', 'SELECT max(order_no) FROM drawn');

is( $node->safe_psql(
		'postgres',
		"SELECT count(DISTINCT n) = $million FROM (SELECT payidem.gen_order_no() n FROM generate_series(1, $million)) s"
	),
	't',
	"$million numbers from one statement are all distinct");

cmp_ok(stat_value('order_nos_issued') - $issued_before,
	'>=', $million, "stats: order_nos_issued grew by at least $million");

# and once more, checking their order as issued and their validity
is( $node->safe_psql(
		'postgres', qq{
		WITH g AS MATERIALIZED (
			SELECT i, payidem.gen_order_no() COLLATE "C" AS n
			FROM generate_series(1, $million) AS i)
		SELECT count(*),
		       count(*) FILTER (WHERE n <= prev),
		       min(n) > '$before_max',
		       bool_and(payidem.order_no_valid(n))
		FROM (SELECT n, lag(n) OVER (ORDER BY i) AS prev FROM g) s}),
	"$million|0|t|t",
	"another $million in one statement: strictly increasing as issued, above the pgbench numbers, all valid"
);

note('stats: ' . join(', ', split /\n/,
	$node->safe_psql('postgres', q{SELECT name || '=' || value FROM payidem.stats() WHERE name LIKE 'order%' OR name LIKE '%clock%' OR name LIKE '%borrow%'})));

$node->stop;

note(sprintf('runtime %.1f s', Time::HiRes::time() - $t_start));
done_testing();
