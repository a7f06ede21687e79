# PayidemNode — a PostgreSQL::Test::Cluster node set up for payidem: the
# library preloaded and a master key file of its own (64 hex characters,
# mode 0600, beside the data directory).
#
#   my $node = payidem_node('name');                      # initialised and started
#   my $node = payidem_node('shard0', key_byte => '10',   # another key
#                           conf => "max_connections = 40\n",
#                           start => 0);                  # not started yet
#   my $node = payidem_node('hk', housekeeping => 1);     # the worker runs
#   my $node = payidem_node('dba', key_file => $path);    # a key file made by the
#                                                         # caller, none of its own
#
# The housekeeping worker (payidem.housekeeping) is off unless the caller
# asks for it with housekeeping => 1.  With it on, a node closes expired
# orders and purges idempotency keys on its own every
# payidem.housekeeping_interval, at a moment no test chooses: a test that
# backdates a key and then calls idem_purge(), or expires an order and then
# looks at it, would find the worker got there first (or not, depending on
# the timing).  Only a test of the worker itself turns it on, and then says
# so where it makes the node.  Every TAP node that preloads payidem is made
# here, so this is the one place where that is decided.
package PayidemNode;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;

our @EXPORT = qw(payidem_node);

sub payidem_node
{
	my ($name, %opt) = @_;
	die "payidem_node($name): ask for the worker with housekeeping => 1, not in conf\n"
	  if ($opt{conf} // '') =~ /^\s*payidem\.housekeeping\s*=/m;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opt{init} // {} });

	my $keyfile = $opt{key_file};
	unless (defined $keyfile)
	{
		$keyfile = $node->data_dir . '/../master.key';
		open(my $fh, '>', $keyfile) or die "cannot write $keyfile: $!";
		print $fh (($opt{key_byte} // '5a') x 32), "\n";
		close($fh);
		chmod(0600, $keyfile) or die "cannot chmod $keyfile: $!";
	}

	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'payidem'\n"
		  . "payidem.master_key_file = '$keyfile'\n"
		  . 'payidem.housekeeping = ' . ($opt{housekeeping} ? 'on' : 'off') . "\n"
		  . ($opt{conf} // ''));
	$node->start if $opt{start} // 1;
	return $node;
}

1;
