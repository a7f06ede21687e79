# Channel keys and merchant secrets loaded the documented way — from files
# in payidem.secret_dir, with load_channel_config() and
# load_merchant_secret() — never reach the server log or
# pg_stat_statements, with every setting that logs statements turned up:
# log_statement = all, log_min_duration_statement = 0, parameters logged in
# full, auto_explain of every statement, nested ones included, with
# log_verbose (the plan's Output line), debug_print_plan, and
# pg_stat_statements tracking nested statements.  Refusals (a file that is
# not JSON, not a JSON object, readable by others, a bad name) do not quote
# the file either; a FIFO is refused at once, not waited on.
#
# The control: the same keys passed to set_channel_config() as a bound
# parameter do reach the log (auto_explain's Output line), which is why the
# file path exists.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Digest::SHA qw(hmac_sha256_hex);
use Fcntl qw(O_WRONLY O_NONBLOCK);
use POSIX qw(mkfifo);
use PayidemNode;

sub canary { return 'CANARY' . $_[0] . join('', map { sprintf('%02x', int(rand(256))) } 1 .. 12) }
my %canary = map { $_ => canary($_) } qw(KEY SECRET BADJSON ARRAY PERM CONTROL);

my $dir = PostgreSQL::Test::Utils::tempdir();
sub put
{
	my ($name, $text, $mode) = @_;
	open(my $fh, '>', "$dir/$name") or die "cannot write $dir/$name: $!";
	print $fh $text;
	close($fh);
	chmod($mode // 0600, "$dir/$name") or die "cannot chmod $dir/$name: $!";
	return;
}
put('wx.json', qq({"mch_id": "1900000109",\n "private_key": "-----BEGIN PRIVATE KEY-----\\n$canary{KEY}\\n-----END PRIVATE KEY-----"}\n));
put('merchant.secret', "$canary{SECRET}\n");
put('broken.json', qq({"private_key": "$canary{BADJSON}"));
put('array.json', qq(["$canary{ARRAY}"]));
put('open.json', qq({"private_key": "$canary{PERM}"}), 0644);

my $node = payidem_node('secret_files', conf => qq{
shared_preload_libraries = 'payidem,auto_explain,pg_stat_statements'
payidem.secret_dir = '$dir'
log_statement = 'all'
log_min_duration_statement = 0
log_parameter_max_length = -1
log_parameter_max_length_on_error = -1
log_min_error_statement = debug5
debug_print_plan = on
auto_explain.log_min_duration = 0
auto_explain.log_verbose = on
auto_explain.log_nested_statements = on
pg_stat_statements.track = all
});
$node->safe_psql('postgres', q{
	CREATE EXTENSION payidem;
	CREATE EXTENSION pg_stat_statements;
	SELECT payidem.create_channel('LOG_WX', 'wechat', 0.002);
	SELECT payidem.create_channel('LOG_CTRL', 'wechat', 0.002);
	CREATE TABLE log_merchant AS SELECT merchant_no FROM payidem.create_merchant('Log Shop', 'retail', 0.006);
});
my $merchant = $node->safe_psql('postgres', 'SELECT merchant_no FROM log_merchant');

# ---------------------------------------------------------------- the documented path
$node->safe_psql('postgres', q{SELECT payidem.load_channel_config('LOG_WX', 'wx.json')});
like($node->safe_psql('postgres', q{SELECT payidem.get_channel_config('LOG_WX') ->> 'private_key'}),
	qr/\Q$canary{KEY}\E/, 'load_channel_config stored the file\'s keys');
is($node->safe_psql('postgres', qq{SELECT payidem.load_merchant_secret('$merchant', 'merchant.secret')}),
	'rotated', 'load_merchant_secret made the file\'s secret current');
is($node->safe_psql('postgres', qq{SELECT payidem.load_merchant_secret('$merchant', 'merchant.secret')}),
	'present', '... and a repeat changes nothing');
is($node->safe_psql('postgres', qq{SELECT payidem.sign('$merchant', 'amount=100')}),
	hmac_sha256_hex('amount=100', $canary{SECRET}), 'the merchant now signs with the file\'s secret (final newline dropped)');

# ---------------------------------------------------------------- refusals
sub refused
{
	my ($sql, $pattern, $what) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql);
	isnt($ret, 0, "$what: refused");
	like($err, $pattern, "$what: $pattern");
	unlike($err, qr/CANARY/, "$what: the error does not quote the file");
	return;
}
refused(q{SELECT payidem.load_channel_config('LOG_WX', 'broken.json')},
	qr/ERROR:  secret file 'broken\.json' does not hold valid JSON/, 'a file that is not JSON');
refused(q{SELECT payidem.load_channel_config('LOG_WX', 'array.json')},
	qr/ERROR:  channel configuration must be a JSON object/, 'a JSON array');
refused(q{SELECT payidem.load_channel_config('LOG_WX', 'open.json')},
	qr/ERROR:  secret file 'open\.json' is accessible to other users/, 'a file others can read');
refused(q{SELECT payidem.load_channel_config('LOG_WX', '../wx.json')},
	qr/ERROR:  invalid secret file name/, 'a name with a directory');
refused(q{SELECT payidem.load_channel_config('LOG_WX', 'missing.json')},
	qr/ERROR:  secret file 'missing\.json' does not exist/, 'a missing file');
refused(q{SET payidem.secret_dir = ''; SELECT payidem.load_channel_config('LOG_WX', 'wx.json')},
	qr/ERROR:  payidem\.secret_dir is not set/, 'no secret directory');
# a loader is no way around the EXECUTE right on what it calls
$node->safe_psql('postgres', q{
	CREATE ROLE log_ops;
	GRANT USAGE ON SCHEMA payidem TO log_ops;
	GRANT EXECUTE ON FUNCTION payidem.load_channel_config(text, text),
	                          payidem.load_merchant_secret(text, text, interval) TO log_ops;
});
refused(q{SET ROLE log_ops; SELECT payidem.load_channel_config('LOG_WX', 'wx.json')},
	qr/ERROR:  permission denied for function set_channel_config/, 'a role without EXECUTE on set_channel_config');
refused(qq{SET ROLE log_ops; SELECT payidem.load_merchant_secret('$merchant', 'merchant.secret')},
	qr/ERROR:  permission denied for function import_merchant_secret/, 'a role without EXECUTE on import_merchant_secret');
symlink("$dir/wx.json", "$dir/link.json") or die "symlink: $!";
refused(q{SELECT payidem.load_channel_config('LOG_WX', 'link.json')},
	qr/ERROR:  secret file 'link\.json' is a symbolic link/, 'a symbolic link');
# a FIFO: refused at once.  Opened as a file is, it would wait for a writer,
# in a system call no statement_timeout, cancel or terminate ends; so the call
# runs under a timeout, and a call still waiting is let go by opening the FIFO
# for writing, so that a regression fails here instead of hanging the test.
mkfifo("$dir/pipe.json", 0600) or die "mkfifo: $!";
{
	my $timed_out = 0;
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT payidem.load_channel_config('LOG_WX', 'pipe.json')",
		timeout => 30, timed_out => \$timed_out);
	if ($timed_out)
	{
		my $writer;
		sysopen($writer, "$dir/pipe.json", O_WRONLY | O_NONBLOCK) and close($writer);
	}
	ok(!$timed_out, 'a FIFO: the call returns at once, it does not wait for a writer');
	isnt($ret, 0, 'a FIFO: refused');
	like($err, qr/ERROR:  22023: secret file 'pipe\.json' is not a regular file/, 'a FIFO: 22023, not a regular file');
	like($err, qr/DETAIL:  'pipe\.json' in payidem\.secret_dir = '\Q$dir\E' is a FIFO \(named pipe\); only a regular file is read\./,
		'a FIFO: DETAIL names the file and what it is');
}
like($node->safe_psql('postgres', q{SELECT payidem.get_channel_config('LOG_WX') ->> 'private_key'}),
	qr/\Q$canary{KEY}\E/, 'the refusals changed nothing');

# ---------------------------------------------------------------- the control
$node->pgbench(
	"--no-vacuum --client=1 --transactions=1 -M extended -D key=$canary{CONTROL}",
	0, [qr{processed: 1/1}], [qr{^$}],
	'set_channel_config with the keys as a bound parameter',
	{ '031_control' => q{SELECT payidem.set_channel_config('LOG_CTRL', ('{"private_key": "' || :key || '"}')::jsonb);} });

my $statements = $node->safe_psql('postgres', q{SELECT string_agg(query, E'\n') FROM pg_stat_statements});
like($statements, qr/load_channel_config/, 'pg_stat_statements tracked the loads');
unlike($statements, qr/CANARY/, 'pg_stat_statements holds no secret');

$node->stop;
my $log = slurp_file($node->logfile);
like($log, qr/load_channel_config\('LOG_WX', 'wx\.json'\)/, 'the loads were logged');
like($log, qr/Query Text: .*load_merchant_secret/, 'auto_explain logged them');
for my $c (qw(KEY SECRET BADJSON ARRAY PERM))
{
	unlike($log, qr/\Q$canary{$c}\E/, "the $c canary appears nowhere in the log");
}
like($log, qr/\Q$canary{CONTROL}\E/,
	'control: keys passed as a bound parameter do reach the log, as docs/security.md warns');

done_testing();
