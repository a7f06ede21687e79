# A journal written by hand (DESIGN section 11).  The journal's rules -- each
# journal_no sums to 0 per currency, a merchant_balance row moves exactly with
# its merchant_available and merchant_payout entries -- are checked at commit
# for every writer, a superuser's own INSERT or UPDATE too (PI002), over the
# whole transaction (a journal may be written by several statements; what a
# rolled-back savepoint wrote does not count; PREPARE TRANSACTION is checked
# like COMMIT).  session_replication_role = replica skips the check, as it
# skips every ordinary trigger, and a COPY by the tables' owner is taken as
# it is (it is what a restore runs): what is written that way is found by
# verify(), which names the journal or the balance.  UPDATE and DELETE of the
# journal stay refused in replica mode too.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemStory qw(verify_sql);

my $node = payidem_node('journal_tampered', key_byte => '4d', conf => q(
fsync = off
max_prepared_transactions = 2
));
my $q = sub { $node->safe_psql('postgres', shift) };

# books with something in them: a D0 merchant's payment, reconciled and
# settled; a payout
$q->(q{
CREATE EXTENSION payidem;
CREATE TABLE jt_merchant AS SELECT merchant_no FROM payidem.create_merchant('Journal Shop', 'retail', 0.006, 'D0');
SELECT payidem.create_channel('JT_WX', 'wechat', 0.002);
SELECT payidem.bind_channel(merchant_no, 'JT_WX') FROM jt_merchant;
CREATE TABLE jt_payment AS
SELECT payidem.begin_payment(payidem.create_order(merchant_no, 'JT-1', 100000, 'journal'), 'JT_WX') AS payment_no
  FROM jt_merchant;
SELECT payidem.apply_payment_result(payment_no, 'callback', 'succeeded', 'TX-JT-1', 100000) FROM jt_payment;
SELECT payidem.load_bill('JT_WX', (p.paid_at AT TIME ZONE 'UTC')::date,
                         concat_ws(',', '', '', p.transaction_id, p.payment_no, p.amount, p.cost_amount, 'succeeded', ''))
  FROM payidem.payment p;
SELECT count(*) FROM payidem.reconcile('JT_WX', (SELECT (paid_at AT TIME ZONE 'UTC')::date FROM payidem.payment));
SELECT count(*) FROM payidem.settle((SELECT (paid_at AT TIME ZONE 'UTC')::date FROM payidem.payment));
SELECT payidem.request_payout(merchant_no, 50000, 'JT-PAYOUT-1') FROM jt_merchant;
});
my $merchant = $q->(q{SELECT merchant_no FROM jt_merchant});
is($q->(q{SELECT available || ' ' || in_payout FROM payidem.merchant_balance}), '49400 50000',
	'the books: a payment of 1000.00 settled less its fee, half of it in payout');
cmp_ok($q->(q{SELECT count(*) FROM payidem.ledger_entry}), '>=', 6, 'the journal holds the settlement and the payout');
is($q->(verify_sql()), '', 'verify() finds nothing wrong');

# psql's session, verbose errors: (its stdout, its stderr)
sub run
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	return ($out, $err);
}
my $entries = sub { $q->(q{SELECT count(*) FROM payidem.ledger_entry}) };
my $before = $entries->();

# ---------------------------------------------------------------- refused at commit
my $unbalanced = q{INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-TAMPER', 'fee_revenue', 'CNY', -7, 'JT-TAMPER');};
my ($out, $err) = run("BEGIN;\n$unbalanced\nSELECT 'inserted';\nCOMMIT;");
like($out, qr/inserted/, 'an unbalanced entry, as a superuser: the INSERT itself goes through');
like($err, qr/ERROR:\s+PI002: journal 'JT-TAMPER' does not balance\nDETAIL:\s+Its entries in CNY written by this transaction sum to -7/,
	'... and the COMMIT is refused with PI002, naming the journal and its sum');
($out, $err) = run($unbalanced);
like($err, qr/ERROR:\s+PI002: journal 'JT-TAMPER' does not balance/, 'the same INSERT on its own: refused at its commit (PI002)');
($out, $err) = run("BEGIN;\n$unbalanced\nPREPARE TRANSACTION 'jt_tamper';");
like($err, qr/ERROR:\s+PI002: journal 'JT-TAMPER' does not balance/, 'PREPARE TRANSACTION of it: refused (PI002)');
is($q->(q{SELECT count(*) FROM pg_prepared_xacts}), '0', '... and nothing is left prepared');
is($entries->(), $before, 'nothing of it was kept');

my $merchant_entry = qq{INSERT INTO payidem.ledger_entry (journal_no, account, merchant_no, currency, amount, source_no)
	VALUES ('JT-GIFT', 'merchant_available', '$merchant', 'CNY', -100, 'JT-GIFT'),
	       ('JT-GIFT', 'adjustment', NULL, 'CNY', 100, 'JT-GIFT');};
($out, $err) = run($merchant_entry);
like($err, qr/ERROR:\s+PI002: the available balance of merchant '$merchant' does not match its journal\nDETAIL:\s+This transaction changed merchant_balance.available \(CNY\) by 0 and wrote merchant_available entries that change it by 100/,
	'a balanced journal crediting a merchant whose balance row does not move: refused (PI002)');
($out, $err) = run(qq{UPDATE payidem.merchant_balance SET available = available + 100, in_payout = in_payout - 1;});
like($err, qr/ERROR:\s+PI002: the available balance of merchant '$merchant' does not match its journal/,
	'a balance moved without entries: refused (PI002)');
my $other = $q->(q{SELECT merchant_no FROM payidem.create_merchant('Other Shop', 'retail', 0.006)});
($out, $err) = run(qq{INSERT INTO payidem.merchant_balance (merchant_no, currency, available) VALUES ('$other', 'CNY', 100);});
like($err, qr/ERROR:\s+PI002: the available balance of merchant '$other' does not match its journal/,
	'a balance row made with money and no entries: refused (PI002)');
($out, $err) = run(qq{DELETE FROM payidem.merchant_balance;});
like($err, qr/ERROR:\s+42501/, 'a DELETE of balances: refused (42501)');
($out, $err) = run(qq{BEGIN;\n$merchant_entry\nUPDATE payidem.merchant_balance SET available = available + 100;\nCOMMIT;});
is($err, '', 'the journal and its balance change, in one transaction by two statements: committed');
($out, $err) = run(qq{BEGIN;
INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-SPLIT', 'fee_revenue', 'CNY', -3, 'JT-SPLIT');
INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-SPLIT', 'adjustment', 'CNY', 3, 'JT-SPLIT');
SAVEPOINT s;
$unbalanced
ROLLBACK TO SAVEPOINT s;
SAVEPOINT t;
INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-SAVED', 'fee_revenue', 'CNY', -2, 'JT-SAVED'), ('JT-SAVED', 'adjustment', 'CNY', 2, 'JT-SAVED');
RELEASE SAVEPOINT t;
COMMIT;});
is($err, '', 'a journal balanced over two statements, an unbalanced one rolled back to a savepoint: committed');
($out, $err) = run(qq{BEGIN;
SAVEPOINT s;
INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-RELEASED', 'fee_revenue', 'CNY', -4, 'JT-RELEASED');
RELEASE SAVEPOINT s;
COMMIT;});
like($err, qr/ERROR:\s+PI002: journal 'JT-RELEASED' does not balance/, 'an unbalanced journal in a released savepoint: refused (PI002)');
is($q->(q{SELECT string_agg(DISTINCT journal_no, ',' ORDER BY journal_no) FROM payidem.ledger_entry WHERE journal_no LIKE 'JT-%'}),
	'JT-GIFT,JT-SAVED,JT-SPLIT', 'the journal holds what was committed, and only that');
is($q->(q{SELECT available || ' ' || in_payout FROM payidem.merchant_balance}), '49500 50000',
	'the balance moved with its journal');
is($q->(verify_sql()), '', 'verify() finds nothing wrong');

# ---------------------------------------------------------------- replica mode: found by verify()
$before = $entries->();
($out, $err) = run("SET session_replication_role = replica;\n$unbalanced");
is($err, '', 'the same unbalanced INSERT with session_replication_role = replica: committed (the check is a trigger)');
is($entries->(), $before + 1, '... the entry is there');
is($q->(verify_sql()), q{journal_balances JT-TAMPER: entries in CNY sum to -7},
	'verify() reports it: journal_balances, the journal and its sum');
($out, $err) = run("SET session_replication_role = replica;\nUPDATE payidem.merchant_balance SET in_payout = in_payout + 1;");
is($err, '', 'an UPDATE of the balance alone in replica mode: committed');
is($q->(q{SELECT string_agg(invariant || ' ' || subject, ', ' ORDER BY invariant) FROM payidem.verify()}),
	"balance_equals_entries $merchant CNY, journal_balances JT-TAMPER",
	'verify() reports the balance too: balance_equals_entries, the merchant and the currency');
like($q->(q{SELECT detail FROM payidem.verify() WHERE invariant = 'balance_equals_entries'}),
	qr/in_payout 50001; the journal says 49500 and 50000/, '... with the row and the journal\'s sums');
for my $change ([ q{UPDATE payidem.ledger_entry SET amount = 7 WHERE journal_no = 'JT-TAMPER'}, 'UPDATE' ],
	[ q{DELETE FROM payidem.ledger_entry WHERE journal_no = 'JT-TAMPER'}, 'DELETE' ],
	[ q{TRUNCATE payidem.ledger_entry}, 'TRUNCATE' ])
{
	($out, $err) = run("SET session_replication_role = replica;\n$change->[0];");
	like($err, qr/ERROR:\s+42501/, "an $change->[1] of the journal in replica mode: refused (42501), the journal is append-only");
}
# the check sums what a transaction writes: the entry that would balance the
# tampered journal is unbalanced in its own transaction, and refused; what
# replica mode broke, replica mode mends
my $mend = q{INSERT INTO payidem.ledger_entry (journal_no, account, currency, amount, source_no)
	VALUES ('JT-TAMPER', 'adjustment', 'CNY', 7, 'JT-TAMPER');};
($out, $err) = run($mend);
like($err, qr/ERROR:\s+PI002: journal 'JT-TAMPER' does not balance/,
	'the entry that would balance the tampered journal, written on its own: refused too (PI002)');
($out, $err) = run("SET session_replication_role = replica;\n$mend\n"
	  . "UPDATE payidem.merchant_balance SET in_payout = in_payout - 1;");
is($err, '', 'mended in replica mode');
is($q->(verify_sql()), '', 'verify() finds nothing wrong again');

# a COPY into the journal by the tables' owner is taken as it is: it is what
# a restore runs (pg_restore copies the journal and the balances, each as
# dumped); what such a COPY breaks, verify() finds
($out, $err) = run("COPY payidem.ledger_entry (journal_no, account, currency, amount, source_no) FROM stdin;\n"
	  . "JT-COPY\tadjustment\tCNY\t9\tJT-COPY\n\\.\n");
is($err, '', 'a COPY of an unbalanced journal by the owner, as a restore runs it: taken as it is');
is($q->(verify_sql()), 'journal_balances JT-COPY: entries in CNY sum to 9', 'verify() finds it');

# ---------------------------------------------------------------- an application role
$q->(q{CREATE ROLE jt_app LOGIN; SELECT payidem.grant_app('jt_app');});
my ($rc, $aout, $aerr) = $node->psql('postgres', "\\set VERBOSITY verbose\n$unbalanced", extra_params => [ '-U', 'jt_app' ]);
like($aerr, qr/ERROR:\s+42501/, 'an application role writes no journal entry by hand (42501)');

$node->stop;
done_testing();
