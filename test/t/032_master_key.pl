# The README's install block, run as written (taken from README.md, so that
# the README and this test cannot drift apart), with /etc/postgresql moved
# into a temporary directory and the cluster named by test values; the
# commands that need root or a Debian cluster are stand-ins (shell functions
# put before the block) that record what they were asked:
#
#   - two clusters of one host, 15 main (the block run by bash) and 17 main
#     (by sh), each get a key of their own: 64 hexadecimal characters, owned
#     by the server's user, mode 0600 -- under a starting umask of 0000, the
#     file is 0600 right after it was made (chown's stand-in looks) and no
#     chmod ever narrows it, the key is drawn under umask 077, and the
#     shell's own umask is left as it was;
#   - the block run for the second cluster leaves the first one's key as it
#     was, and each block run again keeps its key byte for byte (the same
#     file, not rewritten), says so, and fails nothing;
#   - both clusters start with what the block wrote into conf.d, each seals a
#     merchant's secret, and after the restart the block asks for, each opens
#     its own secret (sign() = HMAC-SHA256 with the secret create_merchant
#     returned); the keys differ, and one cluster's secret does not open
#     under the other's key (55000);
#   - scripts/master-key holds the block's lines and keeps a key too;
#   - a cluster set up before 1.1 (conf.d/payidem.conf naming
#     /etc/postgresql/payidem/master.key) is left alone by the block, and
#     docs/security.md's move to the per-cluster path, run as written, keeps
#     every secret; its pg_upgradecluster step gives the new cluster the old
#     key, which the block then keeps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Digest::SHA qw(hmac_sha256_hex);
use IPC::Run;
use PayidemNode;

my $src = $ENV{TESTDIR} // '.';
my $tmp = PostgreSQL::Test::Utils::tempdir();

# The ```sh blocks of a section of a file (up to the next heading of its level
# or above) that contain $needle: there must be exactly one.
sub sh_block
{
	my ($file, $heading, $needle) = @_;
	my $text = slurp_file("$src/$file");
	my ($level) = $heading =~ /^(#+) /;
	my $n = length $level;
	my ($section) = $text =~ /^\Q$heading\E\n(.*?)(?=^#{1,$n} |\z)/ms;
	die "$file has no section '$heading'\n" unless defined $section;
	my @blocks = grep { index($_, $needle) >= 0 } $section =~ /^```sh\n(.*?)^```$/msg;
	(my $name = $heading) =~ s/^#+ //;
	is(scalar(@blocks), 1, "$file, section '$name': one sh block with '$needle'");
	return $blocks[0] // '';
}

# A block as this test runs it: /etc/postgresql in $root, and the cluster's
# major and name (the block's first line) replaced when given.
sub for_test
{
	my ($text, $root, $major, $cluster) = @_;
	$text =~ s{/etc/postgresql}{$root}g;
	$text =~ s/^major=\S+ cluster=\S+/major=$major cluster=$cluster/m
	  or die "the block does not start by naming the cluster\n"
	  if defined $major;
	return $text;
}

# The stand-ins: chown (to the server's user, which this test runs as; it
# records the file's mode as it finds it), chmod and install (recorded: the
# key is never to need them), openssl (recorded with the umask it runs
# under), pg_ctlcluster (recorded, the test does what it was asked).  The
# block starts under umask 0000, the worst a root shell could have.
my $stubs = <<'SH';
log=$PAYIDEM_STUB_LOG
chown() {
	echo "chown $* mode=$(stat -c %a "$2")" >>"$log"
	[ "$1" = postgres: ] || return 1
	command chown "$(id -un):" "$2"
}
chmod() { echo "chmod $*" >>"$log"; command chmod "$@"; }
install() { echo "install $*" >>"$log"; command install "$@"; }
openssl() { echo "openssl $* umask=$(umask)" >>"$log"; command openssl "$@"; }
pg_ctlcluster() { echo "pg_ctlcluster $*" >>"$log"; }
umask 0000
SH

# Run a block in $shell after the stand-ins; returns (exit status, stdout,
# stderr, what the stand-ins recorded).
my $runs = 0;
sub run_block
{
	my ($shell, $text) = @_;
	$runs++;
	my $file = "$tmp/run$runs.sh";
	my $log = "$tmp/run$runs.log";
	open(my $fh, '>', $file) or die "cannot write $file: $!";
	print $fh $stubs, $text, qq{echo "umask after=\$(umask)" >>"\$log"\n};
	close($fh);
	open($fh, '>', $log) or die "cannot write $log: $!";
	close($fh);
	local $ENV{PAYIDEM_STUB_LOG} = $log;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $shell, $file ], '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err, slurp_file($log));
}

sub file_id
{
	my @st = stat($_[0]) or return '';
	return join(':', @st[ 0, 1, 9 ]);    # device, inode, mtime
}

my $install = sh_block('README.md', '## Install', 'payidem.master_key_file');
my $etc = "$tmp/etc-postgresql";
mkdir($etc) or die "mkdir $etc: $!";
my %cluster = (
	a => { major => 15, name => 'main', shell => 'bash' },
	b => { major => 17, name => 'main', shell => 'sh' });
for my $c (values %cluster)
{
	$c->{dir} = "$etc/$c->{major}/$c->{name}";
	$c->{key} = "$c->{dir}/payidem.key";
	$c->{conf} = "$c->{dir}/conf.d/payidem.conf";
	# what pg_createcluster leaves
	mkdir($_) or die "mkdir $_: $!" for "$etc/$c->{major}", $c->{dir}, "$c->{dir}/conf.d";
}

# ---------------------------------------------------------------- the first run for a cluster
sub first_run
{
	my ($c) = @_;
	my $what = "$c->{major} $c->{name}, first run ($c->{shell})";
	my ($rc, $out, $err, $log) =
	  run_block($c->{shell}, for_test($install, $etc, $c->{major}, $c->{name}));
	is($rc, 0, "$what: exit status 0");
	is($err, '', "$what: nothing on stderr");
	like($out, qr/^made \Q$c->{key}\E$/m, "$what: says it made the key");
	my $key = slurp_file($c->{key});
	like($key, qr/\A[0-9a-f]{64}\n\z/, "$what: the key is 64 hexadecimal characters and a newline");
	my @st = stat($c->{key});
	is(sprintf('%04o', $st[2] & 07777), '0600', "$what: mode 0600");
	is($st[4], $>, "$what: owned by the server's user");
	like($log, qr/^chown postgres: \Q$c->{key}\E mode=600$/m,
		"$what: handed to postgres, and 0600 when it was, right after it was made");
	unlike($log, qr/^(chmod|install) /m, "$what: no chmod or install: the file was made 0600");
	like($log, qr/^openssl rand -hex 32 umask=0077$/m, "$what: the key is drawn under umask 077");
	like($log, qr/^umask after=0+$/m, "$what: the shell's own umask is left as it was");
	is(slurp_file($c->{conf}),
		"shared_preload_libraries = 'payidem'\npayidem.master_key_file = '$c->{key}'\n",
		"$what: conf.d/payidem.conf preloads payidem and names the key");
	like($log, qr/^pg_ctlcluster $c->{major} $c->{name} restart$/m, "$what: restarts the cluster");
	$c->{bytes} = $key;
	$c->{id} = file_id($c->{key});
	return;
}

# ---------------------------------------------------------------- a run again
sub run_again
{
	my ($c) = @_;
	my $what = "$c->{major} $c->{name}, run again ($c->{shell})";
	my $conf = slurp_file($c->{conf});
	my ($rc, $out, $err, $log) =
	  run_block($c->{shell}, for_test($install, $etc, $c->{major}, $c->{name}));
	is($rc, 0, "$what: exit status 0");
	is($err, '', "$what: nothing on stderr");
	like($out, qr/^kept\b.*\bkey\b/m, "$what: says it kept the key");
	unlike($out, qr/^made /m, "$what: makes nothing");
	is(slurp_file($c->{key}), $c->{bytes}, "$what: the key is byte for byte the same");
	is(file_id($c->{key}), $c->{id}, "$what: the same file, not rewritten");
	is(slurp_file($c->{conf}), $conf, "$what: conf.d/payidem.conf unchanged");
	unlike($log, qr/^(chown|openssl) /m, "$what: no key drawn, no file handed over");
	like($log, qr/^pg_ctlcluster $c->{major} $c->{name} restart$/m, "$what: restarts the cluster");
	return;
}

# A node that starts with what the block wrote into the cluster's conf.d.
sub start_node
{
	my ($label, $c) = @_;
	my $node = payidem_node("key_$label", key_file => $c->{key},
		conf => "include_dir = '$c->{dir}/conf.d'\n");
	is($node->safe_psql('postgres',
			q{SELECT setting || ' from ' || sourcefile FROM pg_settings WHERE name = 'payidem.master_key_file'}),
		"$c->{key} from $c->{conf}", "node $label: the key named by the block's conf.d/payidem.conf");
	my $row = $node->safe_psql('postgres', qq{
		CREATE EXTENSION payidem;
		SELECT merchant_no || '|' || api_secret FROM payidem.create_merchant('Key Shop $label', 'retail', 0.006)});
	($c->{merchant}, $c->{secret}) = split /\|/, $row;
	$c->{node} = $node;
	$c->{version} = $node->safe_psql('postgres', 'SELECT payidem.master_key_version()');
	is($node->safe_psql('postgres',
			"SELECT key_version FROM payidem.merchant_secret WHERE merchant_no = '$c->{merchant}'"),
		$c->{version}, "node $label: the merchant's secret is sealed with that key");
	return;
}

sub opens
{
	my ($label, $c, $when) = @_;
	is($c->{node}->safe_psql('postgres', "SELECT payidem.sign('$c->{merchant}', 'amount=100')"),
		hmac_sha256_hex('amount=100', $c->{secret}), "node $label, $when: its secret opens");
	return;
}

my ($first, $second) = @cluster{qw(a b)};
first_run($first);
start_node('a', $first);
opens('a', $first, 'made');
# the second cluster of the host: the step that used to write over the first key
first_run($second);
is(slurp_file($first->{key}), $first->{bytes}, "the run for 17 main left 15 main's key as it was");
is(file_id($first->{key}), $first->{id}, '... the same file');
start_node('b', $second);
opens('b', $second, 'made');
isnt($first->{bytes}, $second->{bytes}, 'the two clusters have different keys');
isnt($first->{version}, $second->{version}, '... and different key versions');

# the DBA follows the README again, for both; the restart it asks for
run_again($first);
run_again($second);
$_->{node}->restart for $first, $second;
opens('a', $first, 'after the block again and a restart');
opens('b', $second, 'after the block again and a restart');
{
	my ($ret, $out, $err) = $first->{node}->psql('postgres',
		"\\set VERBOSITY verbose\nSET payidem.master_key_file = '$second->{key}';\n"
		  . "SELECT payidem.sign('$first->{merchant}', 'amount=100')");
	isnt($ret, 0, "15 main's secret does not open under 17 main's key");
	like($err, qr/ERROR:  55000: /, '... 55000');
}

# ---------------------------------------------------------------- scripts/master-key
{
	my $script = slurp_file("$src/scripts/master-key");
	my @lines = split /\n/, $install;
	my $middle = join("\n", @lines[ 1 .. $#lines - 1 ]) . "\n";
	like($lines[-1], qr/^pg_ctlcluster /, "the README's block ends with the restart");
	ok(index($script, $middle) >= 0, "scripts/master-key holds the README's block (but its first and last lines)");

	my $copy = "$tmp/master-key";
	open(my $fh, '>', $copy) or die "cannot write $copy: $!";
	print $fh for_test($script, $etc);
	close($fh);
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'sh', $copy, 15, 'main' ], '<', \'', '>', \$out, '2>', \$err);
	is($? >> 8, 0, 'scripts/master-key 15 main: exit status 0');
	like($out, qr/^kept\b/m, '... keeps the key');
	like($out, qr/^to load it: pg_ctlcluster 15 main restart$/m, '... and says how to load it');
	is(slurp_file($first->{key}), $first->{bytes}, '... byte for byte');
	IPC::Run::run([ 'sh', $copy ], '<', \'', '>', \$out, '2>', \$err);
	is($? >> 8, 2, 'scripts/master-key without a cluster: exit status 2');
	like($err, qr/^scripts\/master-key MAJOR CLUSTER/, '... and its usage');
	IPC::Run::run([ 'sh', $copy, 16, 'nothere' ], '<', \'', '>', \$out, '2>', \$err);
	is($? >> 8, 1, 'scripts/master-key of no cluster: exit status 1');
	ok(!-e "$etc/16", '... and makes nothing');
}

# ---------------------------------------------------------------- a set-up from before 1.1
{
	my $old = "$tmp/etc-old";
	my $c = { major => 15, name => 'main', dir => "$old/15/main" };
	$c->{conf} = "$c->{dir}/conf.d/payidem.conf";
	my $old_key = "$old/payidem/master.key";
	mkdir($_) or die "mkdir $_: $!" for $old, "$old/payidem", "$old/15", $c->{dir}, "$c->{dir}/conf.d";
	open(my $fh, '>', $old_key) or die;
	print $fh ('3e' x 32), "\n";
	close($fh);
	chmod(0600, $old_key) or die;
	my $conf = "shared_preload_libraries = 'payidem'\npayidem.master_key_file = '$old_key'\n";
	open($fh, '>', $c->{conf}) or die;
	print $fh $conf;
	close($fh);

	my ($rc, $out, $err, $log) = run_block('bash', for_test($install, $old, 15, 'main'));
	is($rc, 0, 'before 1.1: the block runs');
	is($err, '', '... nothing on stderr');
	like($out, qr/^kept: \Q$c->{conf}\E names the cluster's key$/m, '... says it keeps the cluster as it is');
	ok(!-e "$c->{dir}/payidem.key", '... makes no key');
	is(slurp_file($c->{conf}), $conf, '... conf.d/payidem.conf unchanged');

	$c->{key} = $old_key;
	start_node('old', $c);
	opens('old', $c, 'with the key from before 1.1');

	# docs/security.md: the move to the cluster's own path
	my $move = sh_block('docs/security.md', '### A key set up before 1.1', 'ln /');
	($rc, $out, $err, $log) = run_block('bash', for_test($move, $old));
	is($rc, 0, 'the move of docs/security.md runs');
	is($err, '', '... nothing on stderr');
	like($log, qr/^pg_ctlcluster 15 main reload$/m, '... and asks for a reload');
	$c->{node}->reload;
	$c->{node}->poll_query_until('postgres',
		"SELECT current_setting('payidem.master_key_file') = '$c->{dir}/payidem.key'")
	  or die "the reload did not take the new name\n";
	my $new_key = "$c->{dir}/payidem.key";
	ok(!-e $old_key, '... the old name is gone');
	is(slurp_file($new_key), ('3e' x 32) . "\n", '... the key is under the new name');
	is(sprintf('%04o', (stat($new_key))[2] & 07777), '0600', '... mode 0600');
	is($c->{node}->safe_psql('postgres', 'SHOW payidem.master_key_file'), $new_key, '... the cluster names it');
	is($c->{node}->safe_psql('postgres', 'SELECT payidem.master_key_version()'), $c->{version},
		'... the same key version');
	opens('old', $c, 'moved');

	# its pg_upgradecluster step, then the block for the new cluster
	mkdir($_) or die "mkdir $_: $!" for "$old/17", "$old/17/main", "$old/17/main/conf.d";
	my $upgrade = sh_block('docs/security.md', '### A cluster made by `pg_upgradecluster`', 'ln /');
	($rc, $out, $err) = run_block('bash', for_test($upgrade, $old));
	is($rc, 0, 'the pg_upgradecluster step of docs/security.md runs');
	($rc, $out, $err, $log) = run_block('bash', for_test($install, $old, 17, 'main'));
	is($rc, 0, '... then the block for 17 main');
	like($out, qr/^kept \Q$old\E\/17\/main\/payidem\.key: /m, '... keeps the key it was given');
	is(slurp_file("$old/17/main/payidem.key"), ('3e' x 32) . "\n", '... the old cluster\'s key');
	is(slurp_file("$old/17/main/conf.d/payidem.conf"),
		"shared_preload_libraries = 'payidem'\npayidem.master_key_file = '$old/17/main/payidem.key'\n",
		'... and names it in conf.d/payidem.conf');
}

done_testing();
