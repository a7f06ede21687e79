# Cache-invalidation callback slots (DESIGN §1): PostgreSQL gives a backend a
# fixed number of relcache and syscache callback slots, shared by core and
# every extension, and a registration past the last one is FATAL.  payidem
# registers one relcache callback and one per syscache it watches, however
# many of its parts cache, so a backend that has run every one of them still
# has room for other extensions.
#
# The test module test/modules/callback_slots (built and installed by
# scripts/test) registers n no-op callbacks, as another extension would; the
# largest n a fresh backend survives after the story below is what is left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $node = payidem_node('slots');
$node->safe_psql('postgres', q{
	CREATE EXTENSION payidem;
	CREATE FUNCTION register_relcache_callbacks(integer) RETURNS integer
		AS 'callback_slots', 'register_relcache_callbacks' LANGUAGE C STRICT;
	CREATE FUNCTION register_syscache_callbacks(integer) RETURNS integer
		AS 'callback_slots', 'register_syscache_callbacks' LANGUAGE C STRICT;
	CREATE TABLE slot_merchant AS SELECT merchant_no FROM payidem.create_merchant('Slot Shop', 'retail', 0.006);
	SELECT payidem.create_channel('SLOT_WX', 'wechat', 0.002);
	SELECT payidem.bind_channel(merchant_no, 'SLOT_WX') FROM slot_merchant;
	CREATE SEQUENCE slot_trade;
});

# every part of payidem that caches: order numbers (the high-water mark),
# idempotency, the state machine (whitelist, log insert) and both payment
# flow paths (the first success and its duplicate), a refund and a transition
my $story = q{
	SELECT payidem.gen_order_no();
	SELECT * FROM payidem.idem_claim('slots:' || nextval('slot_trade'), 'pay', 'PO1', 'SLOT_WX', 100);
	SELECT payidem.create_order((SELECT merchant_no FROM slot_merchant), 'S-' || nextval('slot_trade'), 1000, 'slots') AS o \gset
	SELECT payidem.begin_payment(:'o', 'SLOT_WX') AS p \gset
	SELECT payidem.apply_payment_result(:'p', 'callback', 'succeeded', 'TX-' || :'p', 1000);
	SELECT payidem.apply_payment_result(:'p', 'callback', 'succeeded', 'TX-' || :'p', 1000);
	SELECT payidem.refund(:'p', 100, 'RF-' || :'p') AS r \gset
	SELECT payidem.apply_refund_result(:'r', 'succeeded', 'TXR-' || :'r');
	SELECT payidem.create_order((SELECT merchant_no FROM slot_merchant), 'S-' || nextval('slot_trade'), 1000, 'slots') AS o2 \gset
	SELECT payidem.transit_order(:'o2', 'closed');
};

# does a fresh backend survive registering n more callbacks of that kind?
sub survives
{
	my ($kind, $n, $warm) = @_;
	my ($out, $err) = ('', '');
	my $ret = $node->psql('postgres', ($warm ? $story : '') . "\nSELECT register_${kind}_callbacks($n);",
		stdout => \$out, stderr => \$err, on_error_stop => 1);
	die "unexpected failure: $err" if $ret != 0 && $err !~ /out of \w+ slots|server closed the connection/;
	return $ret == 0;
}

# the largest n that survives, by bisection between 0 and $max
sub slots_left
{
	my ($kind, $max, $warm) = @_;
	my ($lo, $hi) = (0, $max + 1);
	while ($hi - $lo > 1)
	{
		my $mid = int(($lo + $hi) / 2);
		if (survives($kind, $mid, $warm)) { $lo = $mid } else { $hi = $mid }
	}
	return $lo;
}

ok(survives('relcache', 0, 1), 'the story runs in one backend');
my $rel_cold = slots_left('relcache', 40, 0);
my $rel_warm = slots_left('relcache', 40, 1);
note("relcache callback slots left: $rel_cold in a backend that ran nothing, $rel_warm after every part of payidem ran");
cmp_ok($rel_cold, '<', 40, 'the relcache callback slots run out (the module can tell)');
cmp_ok($rel_cold - $rel_warm, '<=', 3,
	'every part of payidem, and the core caches the story uses, take at most 3 relcache callback slots');
cmp_ok($rel_warm, '>=', 5, 'at least 5 relcache callback slots are left for other extensions');

my $sys_cold = slots_left('syscache', 400, 0);
my $sys_warm = slots_left('syscache', 400, 1);
note("syscache callback slots left: $sys_cold in a backend that ran nothing, $sys_warm after every part of payidem ran");
cmp_ok($sys_cold, '<', 400, 'the syscache callback slots run out (the module can tell)');
# (payidem watches 3 syscaches with one callback each; the core caches the
# story warms take 8 more on 15 and 19, so the difference is not payidem's alone)
cmp_ok($sys_warm, '>=', 24, 'at least 24 syscache callback slots are left for other extensions');

$node->stop;
done_testing();
