
# payidem installed on a server that does NOT preload it: the extension can
# still be created and its pure functions work, while the functions that need
# shared memory fail cleanly with SQLSTATE 55000 and a hint that names
# shared_preload_libraries (no crash, the session stays usable).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

my $t_start = Time::HiRes::time();

# ISO 7064 MOD 97-10 as for an IBAN, computed here independently of the C
# codec: letters A=10 .. Z=35, the whole 26 characters must be 1 mod 97.
sub mod97
{
	my ($s) = @_;
	my $digits = join '', map { /[A-Z]/ ? ord($_) - ord('A') + 10 : $_ }
	  split //, $s;
	my $r = 0;
	$r = ($r * 10 + $_) % 97 for split //, $digits;
	return $r;
}

sub with_check
{
	my ($s24) = @_;
	return $s24 . sprintf('%02d', 98 - mod97($s24 . '00'));
}

# 2026-11-29 12:34:56 UTC, shard 07, seq 4711
my $valid = with_check('PO' . '20261129123456' . '07' . '004711');
is(mod97($valid), 1, "self-check: $valid is 1 mod 97");
(my $bad_check = $valid) =~ s/(..)$/sprintf('%02d', ($1 + 1) % 100)/e;
my $bad_date = with_check('PO' . '20261331123456' . '07' . '004711');

my $node = PostgreSQL::Test::Cluster->new('not_preloaded');
$node->init;
# deliberately no shared_preload_libraries (so no housekeeping worker either)
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'', 'server does not preload anything');

my ($rc, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION payidem');
is($rc, 0, 'CREATE EXTENSION payidem works without preloading');
unlike($err, qr/ERROR/, 'CREATE EXTENSION reports no error');

is( $node->safe_psql(
		'postgres',
		"SELECT payidem.order_no_valid('$valid'), payidem.order_no_valid('$bad_check'), "
		  . "payidem.order_no_valid('$bad_date'), payidem.order_no_valid('hello'), "
		  . "payidem.order_no_valid('')"),
	't|f|f|f|f',
	'order_no_valid works: accepts a valid number, rejects bad check digits, a bad date and garbage'
);

is( $node->safe_psql(
		'postgres',
		"SELECT prefix, issued_at AT TIME ZONE 'UTC', shard, seq FROM payidem.order_no_parse('$valid')"
	),
	'PO|2026-11-29 12:34:56|7|4711',
	'order_no_parse works without preloading');

# Run $sql with verbose errors; return psql's exit code and stderr.
sub run_verbose
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql(
		'postgres',
		"\\set VERBOSITY verbose\n$sql",
		on_error_stop => 0);
	return ($rc, $out, $err);
}

for my $call ('payidem.gen_order_no()', q{payidem.gen_order_no('RF')},
	'* FROM payidem.stats()')
{
	my ($rc, $out, $err) = run_verbose("SELECT $call;\nSELECT 'still alive';");
	note("stderr of SELECT $call:\n$err");
	like($err, qr/ERROR:\s+55000:/m, "SELECT $call fails with SQLSTATE 55000");
	like(
		$err,
		qr/^HINT:.*shared_preload_libraries/m,
		"SELECT $call: the HINT mentions shared_preload_libraries");
	unlike($err, qr/server closed the connection|terminated/,
		"SELECT $call: the backend did not crash");
	is($out, 'still alive',
		"SELECT $call: the next statement of the session runs");
}

# the same seen from inside the server
my $caught = $node->safe_psql(
	'postgres', q{
	CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE
		st text;
		hint text;
	BEGIN
		EXECUTE q;
		RETURN 'no error';
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, hint = PG_EXCEPTION_HINT;
		RETURN st || ' ' || (hint LIKE '%shared_preload_libraries%')::text;
	END $$;
	SELECT pg_temp.try('SELECT payidem.gen_order_no()')
	UNION ALL SELECT pg_temp.try('SELECT * FROM payidem.stats()')
	UNION ALL SELECT pg_temp.try('SELECT payidem.order_no_valid(''x'')');
});
is( $caught,
	"55000 true\n55000 true\nno error",
	'caught in PL/pgSQL: gen_order_no() and stats() raise 55000 with the hint; order_no_valid() raises nothing'
);

# after the failures the same session goes on working
is( $node->safe_psql(
		'postgres', q{
	DO $$ BEGIN PERFORM payidem.gen_order_no(); EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; END $$;
	SELECT payidem.order_no_valid('} . $valid . q{');}),
	't',
	'the session keeps working after gen_order_no() failed');

ok(!$node->log_contains(qr/terminated by signal|PANIC/),
	'no backend crashed and no PANIC in the server log');

$node->stop;

note(sprintf('runtime %.1f s', Time::HiRes::time() - $t_start));
done_testing();
