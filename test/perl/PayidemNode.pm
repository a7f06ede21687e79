# PayidemNode — a PostgreSQL::Test::Cluster node set up for payidem: the
# library preloaded and a master key file of its own (64 hex characters,
# mode 0600, beside the data directory).
#
#   my $node = payidem_node('name');                      # initialised and started
#   my $node = payidem_node('shard0', key_byte => '10',   # another key
#                           conf => "max_connections = 40\n",
#                           start => 0);                  # not started yet
package PayidemNode;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;

our @EXPORT = qw(payidem_node);

sub payidem_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opt{init} // {} });

	my $keyfile = $node->data_dir . '/../master.key';
	open(my $fh, '>', $keyfile) or die "cannot write $keyfile: $!";
	print $fh (($opt{key_byte} // '5a') x 32), "\n";
	close($fh);
	chmod(0600, $keyfile) or die "cannot chmod $keyfile: $!";

	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'payidem'\n"
		  . "payidem.master_key_file = '$keyfile'\n"
		  . ($opt{conf} // ''));
	$node->start if $opt{start} // 1;
	return $node;
}

1;
