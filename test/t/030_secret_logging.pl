# Secrets never reach the server log through payidem.
#
# With every statement logged (log_statement = 'all') and the API called with
# bound parameters and log_parameter_max_length = 0 (what docs/security.md
# recommends), a channel-configuration canary and merchant API secrets appear
# nowhere in the log: not in payidem's messages, not in errors on bad input,
# not in a failed decryption.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $node = payidem_node('secrets', conf => q{
log_statement = 'all'
log_parameter_max_length = 0
log_parameter_max_length_on_error = 0
log_min_messages = debug1
log_min_error_statement = error
});
$node->safe_psql('postgres', 'CREATE EXTENSION payidem');
$node->safe_psql('postgres', q{SELECT payidem.create_channel('LOG_WX', 'wechat', 0.002)});

my $canary = 'CANARY-' . join('', map { sprintf('%02x', int(rand(256))) } 1 .. 12);

# the API with bound parameters (pgbench -M extended), including bad input
$node->pgbench(
	'--no-vacuum --client=1 --transactions=3 -M extended'
	  . " -D chan=LOG_WX -D canary=$canary",
	0,
	[qr{processed: 3/3}],
	[qr{^$}],
	'API called with bound parameters',
	{
		'secret_api' => q{
SELECT payidem.set_channel_config(:chan, ('{"private_key": "' || :canary || '"}')::jsonb);
SELECT payidem.get_channel_config(:chan);
SELECT length(api_secret) FROM payidem.create_merchant('Log Shop', 'retail', 0.006);
}
	});
my ($ret, $out, $err) = $node->psql('postgres',
	qq{SELECT payidem.set_channel_config('LOG_WX', '["$canary"]'::jsonb)},
	extended => 0);
# (that one is a literal in the statement text on purpose: see below)
isnt($ret, 0, 'a non-object configuration is refused');
unlike($err, qr/\Q$canary\E/, 'the refusal does not repeat the configuration');

# merchant secrets, created, used and rotated
my $secrets = $node->safe_psql('postgres', q{
	SELECT api_secret FROM payidem.create_merchant('Log Two', 'retail', 0.006);
});
my $merchant = $node->safe_psql('postgres', q{SELECT merchant_no FROM payidem.merchant WHERE merchant_name = 'Log Two'});
my $rotated = $node->safe_psql('postgres', qq{SELECT payidem.rotate_merchant_secret('$merchant')});
$node->safe_psql('postgres', qq{SELECT payidem.sign('$merchant', 'payload')});
$node->safe_psql('postgres', q{
	SELECT payidem.verify_signature(api_key, 'payload', repeat('0', 64)) FROM payidem.merchant
});
# a tampered record fails to open: the error names the record, not its content
($ret, $out, $err) = $node->psql('postgres', q{
	UPDATE payidem.channel_config SET auth_tag = '\x00000000000000000000000000000000';
	SELECT payidem.get_channel_config('LOG_WX');
});
like($err, qr/sealed record does not authenticate/, 'a tampered record is refused');

$node->stop;
my $log = slurp_file($node->logfile);
like($log, qr/payidem\.set_channel_config\(\$1/, 'statements were logged (with placeholders)');
like($log, qr/\Q$canary\E/, 'the literal written into a statement on purpose is logged by PostgreSQL');

# Everything but that deliberately literal statement: remove the lines PostgreSQL
# logged for it (its statement text), then no canary may remain anywhere.
my @lines = grep { !/set_channel_config\('LOG_WX', '\["\Q$canary\E"\]'/ } split /\n/, $log;
my $rest = join("\n", @lines);
unlike($rest, qr/\Q$canary\E/, 'channel-config canary never appears in the log otherwise');
chomp $secrets;
chomp $rotated;
like($secrets, qr/^[0-9a-f]{64}$/, 'a merchant secret was created');
unlike($log, qr/\Q$secrets\E/, 'merchant API secret never appears in the log');
unlike($log, qr/\Q$rotated\E/, 'rotated API secret never appears in the log');
unlike($log, qr/5a5a5a5a5a5a5a5a/, 'the master key never appears in the log');

done_testing();
