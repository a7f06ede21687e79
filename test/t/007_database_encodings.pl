# CREATE EXTENSION payidem in databases of other encodings than UTF8: a DBA
# whose database is EUC_CN (or GBK's server-side sibling, LATIN1, SQL_ASCII)
# installs payidem as anyone else does.  The install script is read as UTF8
# (encoding = UTF8 in the control file) and is plain ASCII, so every
# server-side encoding takes it; text the application sends in its own
# client encoding is stored and read back as it was.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $node = payidem_node('encodings', conf => "lc_messages = 'C'\n");

# [server encoding, a subject in it]
for my $case ([ 'EUC_CN', '奶茶 (milk tea)' ], [ 'LATIN1', 'Café au lait' ], [ 'SQL_ASCII', 'Green tea' ])
{
	my ($enc, $subject) = @$case;
	my $db = 'enc_' . lc $enc;
	$node->safe_psql('postgres',
		"CREATE DATABASE $db ENCODING '$enc' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
	my ($ret, $out, $err) = $node->psql($db, 'CREATE EXTENSION payidem');
	is($ret, 0, "$enc: CREATE EXTENSION payidem") or diag($err);
	my $m = $node->safe_psql($db, q{SELECT merchant_no FROM payidem.create_merchant('Tea Shop', 'retail', 0.006)});
	my $o = $node->safe_psql($db, "SET client_encoding = 'UTF8'; SELECT payidem.create_order('$m', 'T-1', 1250, '$subject')");
	ok($node->safe_psql($db, "SELECT payidem.order_no_valid('$o')") eq 't', "$enc: an order is made ($o)");
	is($node->safe_psql($db, "SET client_encoding = 'UTF8'; SELECT subject FROM payidem.\"order\" WHERE order_no = '$o'"),
		$subject, "$enc: its subject is read back as the application sent it");
	is($node->safe_psql($db, "SELECT current_setting('server_encoding')"), $enc, "$enc: ... in a database of that encoding");
}

$node->stop;
done_testing();
