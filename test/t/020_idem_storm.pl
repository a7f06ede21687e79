# A bounded storm of duplicate claims: 16 pgbench clients x 2,000
# transactions over 50 keys.  Each transaction claims a random key and, when
# it wins (claimed or reclaimed), records itself in a winners table and
# finishes the key as completed in the same transaction.  Afterwards there
# must be exactly 50 idempotency rows, all completed after one attempt, and
# exactly one winner per key; pgbench must report no error or failed
# transaction (a unique_violation reaching a client would be one).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $clients      = 16;
my $transactions = 2000;
my $keys         = 50;

my $node = payidem_node('idem_storm', conf => "max_connections = 40\n");

$node->safe_psql(
	'postgres', q(
CREATE EXTENSION payidem;
CREATE TABLE winners (
	winner_id	bigserial PRIMARY KEY,
	idem_key	text NOT NULL,
	client_id	int NOT NULL
);
));

my $script = <<"EOF";
\\set k random(1, $keys)
BEGIN;
SELECT (outcome IN ('claimed', 'reclaimed'))::int AS won
  FROM payidem.idem_claim('storm:pay:PO' || :k || ':callback', 'pay', 'PO' || :k, 'WXPAY_001', 100 * :k) \\gset
\\if :won
INSERT INTO winners (idem_key, client_id) VALUES ('storm:pay:PO' || :k || ':callback', :client_id);
SELECT payidem.idem_finish('storm:pay:PO' || :k || ':callback', 'completed', pg_catalog.jsonb_build_object('client', :client_id));
\\endif
COMMIT;
EOF

my $stats_before = $node->safe_psql('postgres',
	q(SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM payidem.stats() WHERE name LIKE 'idem%'));

$node->pgbench(
	"--no-vacuum --client=$clients --jobs=4 --transactions=$transactions",
	0,
	[
		qr{number of transactions actually processed: @{[ $clients * $transactions ]}/@{[ $clients * $transactions ]}},
		qr{number of failed transactions: 0 \(0\.000%\)}
	],
	[qr{^$}],
	'pgbench storm of duplicate claims ends without errors',
	{ '020_idem_storm' => $script });

is( $node->safe_psql('postgres',
		q(SELECT count(*) FROM payidem.idempotency WHERE idem_key LIKE 'storm:%')),
	$keys, "exactly $keys idempotency rows");

is( $node->safe_psql(
		'postgres',
		q(SELECT count(*) FROM payidem.idempotency
		   WHERE idem_key LIKE 'storm:%' AND status = 'completed' AND attempts = 1
		     AND result IS NOT NULL AND locked_until IS NULL)),
	$keys,
	'every key completed after exactly one attempt');

is($node->safe_psql('postgres', q(SELECT count(*) FROM winners)),
	$keys, "exactly $keys winners in total");

is( $node->safe_psql(
		'postgres',
		q(SELECT count(*) FROM (SELECT idem_key FROM winners GROUP BY idem_key HAVING count(*) = 1) k)),
	$keys,
	'each key was claimed exactly once');

# the stored result names the client that won the key
is( $node->safe_psql(
		'postgres',
		q(SELECT count(*) FROM winners w JOIN payidem.idempotency i USING (idem_key)
		   WHERE (i.result ->> 'client')::int = w.client_id)),
	$keys,
	'each stored result is the winner\'s');

# counters: one claimed per key, the rest answered without running the logic
my $stats_after = $node->safe_psql('postgres',
	q(SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM payidem.stats() WHERE name LIKE 'idem%'));
my %before = map { split /=/ } split /,/, $stats_before;
my %after  = map { split /=/ } split /,/, $stats_after;
is($after{idem_claimed} - $before{idem_claimed}, $keys, "stats: $keys claims counted");
is($after{idem_reclaimed} - $before{idem_reclaimed}, 0, 'stats: no reclaims');
is($after{idem_mismatch} - $before{idem_mismatch}, 0, 'stats: no mismatches');
is( $after{idem_claimed} + $after{idem_in_progress} + $after{idem_replay}
	  - $before{idem_claimed} - $before{idem_in_progress} - $before{idem_replay},
	$clients * $transactions,
	'stats: one outcome counted per claim');

# duplicate claims leave no dead tuples: apart from the 50 inserts and 50
# finishes nothing wrote to the table.  (Two first claims passing the ON
# CONFLICT pre-check at the same instant make PostgreSQL insert and at once
# super-delete the loser's tuple, counted as an insert plus a delete; rare,
# so allowed but bounded.)
$node->safe_psql('postgres', 'SELECT pg_stat_force_next_flush()');
my ($ins, $upd, $del) = split /\|/,
  $node->safe_psql('postgres',
	q(SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables
	   WHERE relid = 'payidem.idempotency'::regclass));
note("idempotency table: $ins inserted, $upd updated, $del deleted");
is($ins - $del, $keys, 'one surviving insert per key');
is($upd, $keys, 'one update (the finish) per key');
cmp_ok($ins, '<', 2 * $keys, 'duplicate claims inserted nothing');

# New keys while the table's cache entry keeps being invalidated: ANALYZE
# sends a relcache invalidation, which a claim may process in the middle of
# its work (any lock it takes accepts invalidations).  Each new key must still
# be claimed exactly once, with no error.
$node->safe_psql('postgres', 'CREATE TABLE new_claims (idem_key text PRIMARY KEY)');
$node->pgbench(
	"--no-vacuum --client=8 --jobs=4 --transactions=600",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[qr{^$}],
	'new keys claimed while ANALYZE invalidates the table\'s cache entry',
	{
		'020_new_keys@20' => q(
\set n random(1, 1000000000)
INSERT INTO new_claims
SELECT 'inval:' || :client_id || ':' || :n FROM payidem.idem_claim('inval:' || :client_id || ':' || :n, 'pay', 'PO1', 'WXPAY_001', 100)
 WHERE outcome = 'claimed'
ON CONFLICT DO NOTHING;
),
		'020_analyze@1' => q(ANALYZE payidem.idempotency;)
	});
is( $node->safe_psql(
		'postgres',
		q(SELECT count(*) FROM new_claims c JOIN payidem.idempotency i USING (idem_key)
		   WHERE i.status = 'processing' AND i.attempts = 1)),
	$node->safe_psql('postgres', q(SELECT count(*) FROM new_claims)),
	'every new key claimed once, its row stored');
cmp_ok($node->safe_psql('postgres', q(SELECT count(*) FROM new_claims)),
	'>', 0, 'new keys were claimed');

$node->stop;

# idem_claim needs no shared memory: without shared_preload_libraries it
# works (only the counters of stats() are missing).  Not preloaded, this
# node has no housekeeping worker either.
my $plain = PostgreSQL::Test::Cluster->new('idem_not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION payidem');
is( $plain->safe_psql(
		'postgres', q(
SELECT string_agg(outcome, ' ') FROM (
  SELECT (payidem.idem_claim('np:1', 'pay', 'PO1', NULL, 1)).outcome
  UNION ALL SELECT (payidem.idem_claim('np:1', 'pay', 'PO1', NULL, 1)).outcome) o;
SELECT payidem.idem_finish('np:1', 'completed');
SELECT outcome FROM payidem.idem_claim('np:1', 'pay', 'PO1', NULL, 1);
)),
	"claimed in_progress\n\nreplay",
	'idem_claim works without shared_preload_libraries');
$plain->stop;

done_testing();
