# Order numbers in many databases of one server.  Shared memory keeps each
# database's reservation in a slot; a database whose slot was taken by
# another reloads its mark from its sequence and, not knowing the mark was
# its own, moves the logical second up to it: the time part of every number
# of the server then runs up to 10 seconds ahead of the clock, and the next
# reload can report a clock rollback that never happened.  With more
# databases than the old 64 slots, called in turn (each twice), every number must stay
# unique and increasing in the order it was issued, its time part never
# ahead of the clock read after it, and no rollback be reported.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes ();

my $t_start = Time::HiRes::time();
my $databases = 72;
my $rounds = 2;

my $node = payidem_node('databases', conf => "fsync = off\n");

# a template that never issued a number: its clones start without a mark
$node->safe_psql('postgres', 'CREATE DATABASE tpl');
$node->safe_psql('tpl', 'CREATE EXTENSION payidem');
$node->safe_psql('postgres', join('', map { "CREATE DATABASE db$_ TEMPLATE tpl STRATEGY FILE_COPY;\n" } 1 .. $databases));

my $log_start = -s $node->logfile;
my @issued;    # [ db, number, issued second, seq, clock second after it ]
for my $round (1 .. $rounds)
{
	for my $db (1 .. $databases)
	{
		my $row = $node->safe_psql("db$db", q{
			WITH g AS MATERIALIZED (SELECT payidem.gen_order_no() AS n)
			SELECT n, extract(epoch FROM p.issued_at)::bigint, p.seq,
			       floor(extract(epoch FROM clock_timestamp()))::bigint
			  FROM g, payidem.order_no_parse(g.n) p});
		push @issued, [ $db, split /\|/, $row ];
	}
}
is(scalar(@issued), $databases * $rounds, "$databases databases x $rounds rounds: a number each time");

my %seen;
my $dups = grep { $seen{ $_->[1] }++ } @issued;
is($dups, 0, 'no number issued twice');

my $out_of_order = 0;
for my $i (1 .. $#issued)
{
	my ($a, $b) = ($issued[ $i - 1 ], $issued[$i]);
	$out_of_order++ unless $b->[2] > $a->[2] || ($b->[2] == $a->[2] && $b->[3] > $a->[3]);
}
is($out_of_order, 0, 'each number above the one issued before it, in whichever database');

my @ahead = grep { $_->[2] > $_->[4] } @issued;
is(scalar(@ahead), 0, 'no number\'s time part ahead of the clock read after it')
  or diag(sprintf('%d ahead, by up to %d s, e.g. %s in db%d', scalar(@ahead),
		(sort { $b <=> $a } map { $_->[2] - $_->[4] } @ahead)[0], $ahead[0][1], $ahead[0][0]));

my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/system clock moved backwards/, 'no clock rollback reported');
is($node->safe_psql('db1', q{SELECT sum(server_value) FROM payidem.stats() WHERE name IN ('clock_rollbacks', 'seconds_borrowed')}),
	'0', 'stats(), every database: no rollback counted and no second borrowed');

diag(sprintf('008 figures: %d databases, %d numbers; %.1f s', $databases, scalar(@issued), Time::HiRes::time() - $t_start));
$node->stop;
done_testing();
