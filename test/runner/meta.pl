# META.json, as the PGXN Meta Spec 1.0.0 (https://pgxn.org/spec/) defines
# it, and the archive `make dist` makes of it for PGXN.  No server (scripts/test
# runs it with prove, from anywhere).
#
# The spec's rules checked here: the required keys (name, abstract,
# maintainer, license, provides, version, meta-spec) and their types; every
# version a semantic version (major.minor.patch); a license PGXN knows;
# release_status one of stable, testing, unstable; provides naming each
# extension's file (which must exist in the distribution) and version; the
# prereqs' phases and relations; no key outside the spec but an x_ one.  And
# that META.json says what the control files say: an extension per control
# file, at its default_version (1.0 is 1.0.0; a version in development is a
# pre-release of it, 1.1.0-dev, not stable); and that a released version's
# frozen install script is what its parts assemble into.
use strict;
use warnings;

use Cwd ();
use File::Basename ();
use File::Temp ();
use IO::Uncompress::Unzip qw($UnzipError);
use JSON::PP;
use Test::More;

my $root = Cwd::abs_path(File::Basename::dirname($0) . '/../..');
chdir $root or die "cannot chdir to $root: $!";

sub slurp
{
	my ($file) = @_;
	open(my $fh, '<', $file) or die "cannot read $file: $!";
	local $/;
	return scalar <$fh>;
}

my $meta = eval { JSON::PP->new->decode(slurp('META.json')) };
ok($meta, 'META.json is JSON') or BAIL_OUT("META.json: $@");

my $semver = qr/^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$/;
my %license = map { $_ => 1 } qw(agpl_3 apache_1_1 apache_2_0 artistic_1 artistic_2 bsd freebsd gfdl_1_2
  gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0 mit mozilla_1_0 mozilla_1_1 openssl perl_5 postgresql
  qpl_1_0 ssleay sun zlib open_source restricted unrestricted unknown);
my %top = map { $_ => 1 } qw(name abstract description version maintainer license prereqs provides
  release_status generated_by no_index resources tags meta-spec);

for my $key (qw(name abstract version maintainer license provides meta-spec))
{
	ok(exists $meta->{$key}, "required key $key");
}
is_deeply([ grep { !$top{$_} && !/^x_/i } sort keys %$meta ], [], 'no key outside the spec (but x_ ones)');
like($meta->{name}, qr/^[A-Za-z0-9][A-Za-z0-9_-]*$/, 'name: letters, digits, - and _');
ok(!ref $meta->{abstract} && length $meta->{abstract}, 'abstract: a string');
like($meta->{version}, $semver, "version $meta->{version}: a semantic version");
my @maintainers = ref $meta->{maintainer} ? @{ $meta->{maintainer} } : ($meta->{maintainer});
ok(@maintainers && !grep({ ref || !length } @maintainers), 'maintainer: a string or a list of strings');
my @licenses = ref $meta->{license} eq 'ARRAY' ? @{ $meta->{license} }
  : ref $meta->{license} eq 'HASH' ? () : ($meta->{license});
ok(ref $meta->{license} eq 'HASH' || (@licenses && !grep { !$license{$_} } @licenses),
	'license: one PGXN knows (' . join(',', @licenses) . ')');
ok(-f 'LICENSE', 'the license is in the distribution (LICENSE)');
is($meta->{'meta-spec'}{version}, '1.0.0', 'meta-spec version 1.0.0');
like($meta->{'meta-spec'}{url} // '', qr{^https?://}, 'meta-spec url');
like($meta->{release_status} // 'stable', qr/^(stable|testing|unstable)$/, 'release_status');
if (my $tags = $meta->{tags})
{
	ok(ref $tags eq 'ARRAY' && !grep({ ref || length > 255 || !length } @$tags), 'tags: a list of short strings');
}
if (my $prereqs = $meta->{prereqs})
{
	my @bad;
	for my $phase (keys %$prereqs)
	{
		push @bad, "phase $phase" unless $phase =~ /^(configure|build|test|runtime|develop)$/;
		for my $rel (keys %{ $prereqs->{$phase} })
		{
			push @bad, "relation $rel" unless $rel =~ /^(requires|recommends|suggests|conflicts)$/;
			for my $v (values %{ $prereqs->{$phase}{$rel} })
			{
				push @bad, "version $v" unless $v =~ /^(0|(>=|<=|==|!=|<|>)?\s*\d+\.\d+\.\d+)(\s*,\s*(>=|<=|==|!=|<|>)?\s*\d+\.\d+\.\d+)*$/;
			}
		}
	}
	is_deeply(\@bad, [], 'prereqs: phases, relations and version ranges of the spec');
}

# provides: one entry per control file, at its default version
my %control;
for my $file (glob '*.control')
{
	my ($name) = $file =~ /^(.*)\.control$/;
	my ($v) = slurp($file) =~ /^default_version\s*=\s*'([^']+)'/m;
	$control{$name} = $v;
}
is_deeply([ sort keys %{ $meta->{provides} } ], [ sort keys %control ], 'provides: every extension of a control file');
for my $ext (sort keys %{ $meta->{provides} })
{
	my $p = $meta->{provides}{$ext};
	ok(defined $p->{file} && -f $p->{file}, "$ext: its file $p->{file} exists");
	like($p->{version} // '', $semver, "$ext: version $p->{version}: a semantic version");
	(my $want = $control{$ext} // '') =~ s/^(\d+\.\d+)$/$1.0/;
	like($p->{version}, qr/^\Q$want\E(-[0-9A-Za-z.-]+)?$/,
		"$ext: the version of its control file ($control{$ext}), or a pre-release of it");
	ok(!defined $p->{docfile} || -f $p->{docfile}, "$ext: its docfile exists");
}
(my $dist_version = $control{payidem}) =~ s/^(\d+\.\d+)$/$1.0/;
is($meta->{version}, $meta->{provides}{payidem}{version}, "the distribution's version is payidem's");
like($meta->{version}, qr/^\Q$dist_version\E(-[0-9A-Za-z.-]+)?$/, "... that of payidem.control ($control{payidem})");
# a version in development is a pre-release (1.1.0-dev): PGXN never takes a
# version twice, so a snapshot must not use the release's
if ($meta->{version} =~ /-/)
{
	isnt($meta->{release_status} // 'stable', 'stable', "a pre-release ($meta->{version}) is not stable");
}
else
{
	is($meta->{release_status} // 'stable', 'stable', "a release ($meta->{version}) is stable");
}

# a released version's install script is frozen: the parts, while the control
# file names that version, must assemble into it (an edit of sql/parts/ made
# after the release would otherwise be installed nowhere)
SKIP:
{
	my $frozen = "sql/released/payidem--$control{payidem}.sql";
	skip "$control{payidem} is in development (no $frozen)", 1 unless -f $frozen;
	my @parts = split ' ', `make -s print-PARTS`;
	my $assembled = join('', map { slurp("sql/parts/$_.sql") } @parts);
	ok(@parts && $assembled eq slurp($frozen), "the parts assemble into the frozen $frozen");
}

# a released version's frozen script is the one its tag holds (never edited)
SKIP:
{
	skip 'not a git checkout', 1 unless -d '.git' || -f '.git';
	my @changed;
	for my $frozen (glob 'sql/released/payidem--*.sql')
	{
		my ($v) = $frozen =~ /payidem--([^-]+)\.sql$/;
		next unless system("git rev-parse -q --verify 'refs/tags/v$v' >/dev/null 2>&1") == 0;
		push @changed, $frozen if system("git diff --quiet 'v$v' -- '$frozen'") != 0;
	}
	is_deeply(\@changed, [], 'every frozen script is as its release tag holds it (where the tag is here)');
}

# make dist: the zip PGXN takes, one directory name-version/ with META.json at its top
SKIP:
{
	skip 'not a git checkout (make dist archives a git revision)', 4 unless -d '.git' || -f '.git';
	my $out = File::Temp::tempdir(CLEANUP => 1);
	my $log = `make -s dist DIST_REF=HEAD DIST_DIR=$out 2>&1`;
	is($?, 0, 'make dist DIST_REF=HEAD') or diag($log);
	# (named by the version in the last commit's META.json, which is this
	# one's once it is committed)
	my @zips = glob "$out/$meta->{name}-*.zip";
	is(scalar(@zips), 1, 'it writes one ' . "$meta->{name}-<version>.zip");
	my $zip = $zips[0] // '';
	my ($zipped) = $zip =~ m{/(\Q$meta->{name}\E-[^/]+)\.zip$};
	my @names;
	if (-f $zip)
	{
		my $u = IO::Uncompress::Unzip->new($zip) or die "cannot open $zip: $UnzipError";
		my $status;
		for ($status = 1; $status > 0; $status = $u->nextStream)
		{
			push @names, $u->getHeaderInfo->{Name};
		}
	}
	my $prefix = ($zipped // 'none') . '/';
	is(scalar(grep { index($_, $prefix) != 0 } @names), 0, "every file under $prefix");
	my %in = map { $_ => 1 } @names;
	is_deeply([ grep { !$in{"$prefix$_"} } 'META.json', 'LICENSE', 'Makefile', 'payidem.control', 'README.md',
			map { $meta->{provides}{$_}{file} } sort keys %{ $meta->{provides} } ],
		[], 'META.json, LICENSE, the Makefile, the control file and the provided files are in it');
}

done_testing();
