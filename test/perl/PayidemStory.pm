# PayidemStory — a populated payidem database, for the tests that must show
# that nothing was lost or loosened on the way through something (a dump and
# restore, an upgrade): merchants with secrets, channels with encrypted
# configuration, orders in every status, payments, refunds, anomalies,
# idempotency keys, notifications, a channel bill and its reconciliation, and a
# flow a DBA added to the whitelist; then what to compare and what must still
# be refused.
#
#   $node->safe_psql($db, 'CREATE EXTENSION payidem; ' . story_sql(600));
#   $node->safe_psql($db, books_sql(payouts => 1));        # bills, settlement, payouts (1.1)
#   my $sums = $node->safe_psql($db, table_sums_sql());    # relname|rows|md5 per table
#   is($node->safe_psql($db, verify_sql()), '', ...);      # payidem.verify(), a line a row
#   guards_hold($node, $db, 'restored');                   # the refusals, as tests
#   is($node->safe_psql($db, log_disagreements_sql()), '0', ...);
#
# The story needs a master key (PayidemNode) and creates bk_merchant, bk_order
# and bk_payment beside the extension for the tests to find their rows.
package PayidemStory;

use strict;
use warnings;

use Exporter 'import';
use Test::More;

our @EXPORT = qw(story_sql books_sql verify_sql table_sums_sql columns_sql expiry_queue_sql log_disagreements_sql
  refused guards_hold);

# The story with $orders orders (i % 10: 0..5 paid, 6 failed, 7 closed, 8
# closed then paid (an anomaly), 9 no attempt).
sub story_sql
{
	my ($orders) = @_;
	return qq{
CREATE TABLE bk_merchant AS SELECT * FROM payidem.create_merchant('Backup Shop', 'retail', 0.006);
SELECT payidem.create_merchant('Frozen Shop', 'catering', 0.0038, 'D0');
SELECT payidem.freeze_merchant(merchant_no) FROM payidem.merchant WHERE merchant_name = 'Frozen Shop';
SELECT payidem.rotate_merchant_secret(merchant_no, '1 hour') FROM bk_merchant;
SELECT payidem.create_channel('BK_WX', 'wechat', 0.002);
SELECT payidem.create_channel('BK_ALI', 'alipay', 0.0025, 50, ARRAY['retail']);
SELECT payidem.set_channel_config('BK_WX', '{"mch_id": "1900000109", "api_v3_key": "k3"}');
SELECT payidem.bind_channel(merchant_no, 'BK_WX') FROM bk_merchant;
SELECT payidem.bind_channel(merchant_no, 'BK_ALI', 0.005, 1000000, 100000000) FROM bk_merchant;
-- a flow a DBA added: paid -> shipping
INSERT INTO payidem.state (entity, status) VALUES ('order', 'shipping');
INSERT INTO payidem.transition (entity, from_status, to_status) VALUES ('order', 'paid', 'shipping');
-- a reporting role mapped to the merchant, then dropped the usual way: its
-- row stays in merchant_role until the next mapping call, and must not reach
-- the dump (its regrole would be written as a bare OID)
CREATE ROLE bk_gone;
SELECT payidem.map_merchant_role('bk_gone', merchant_no) FROM bk_merchant;
DROP OWNED BY bk_gone;
DROP ROLE bk_gone;

CREATE TABLE bk_order AS
SELECT i, payidem.create_order(m.merchant_no, 'BK-' || i, 100 + i, 'backup ' || i,
                               CASE WHEN i % 2 = 0 THEN 'https://shop.example/n' END) AS order_no
  FROM bk_merchant m, generate_series(1, $orders) i;
CREATE TABLE bk_payment AS
SELECT o.i, o.order_no, payidem.begin_payment(o.order_no, CASE WHEN o.i % 3 = 0 THEN 'BK_ALI' ELSE 'BK_WX' END) AS payment_no
  FROM bk_order o WHERE o.i % 10 <> 9 ORDER BY o.i;
-- i % 10: 0..5 paid, 6 failed, 7 closed, 8 close_order then paid (anomaly), 9 no attempt
SELECT payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 <= 5 ORDER BY p.i;
SELECT payidem.apply_payment_result(p.payment_no, 'query', 'failed') FROM bk_payment p WHERE p.i % 10 = 6 ORDER BY p.i;
SELECT payidem.close_order(p.order_no) FROM bk_payment p WHERE p.i % 10 IN (7, 8) ORDER BY p.i;
SELECT payidem.apply_payment_result(p.payment_no, 'callback', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 = 8 ORDER BY p.i;
-- duplicates
SELECT payidem.apply_payment_result(p.payment_no, 'query', 'succeeded', 'TX' || p.payment_no,
                                    (SELECT amount FROM payidem.payment x WHERE x.payment_no = p.payment_no))
  FROM bk_payment p WHERE p.i % 10 = 1 ORDER BY p.i;
-- refunds: partial, full, failed, pending
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 10, 'BKR-' || p.i), 'succeeded')
  FROM bk_payment p WHERE p.i % 10 IN (1, 2) ORDER BY p.i;
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 100 + p.i, 'BKRF-' || p.i), 'succeeded')
  FROM bk_payment p WHERE p.i % 10 = 3 ORDER BY p.i;
SELECT payidem.apply_refund_result(payidem.refund(p.payment_no, 5, 'BKR-' || p.i), 'failed')
  FROM bk_payment p WHERE p.i % 10 = 4 ORDER BY p.i;
SELECT payidem.refund(p.payment_no, 7, 'BKR-' || p.i) FROM bk_payment p WHERE p.i % 10 = 5 ORDER BY p.i;
SELECT payidem.transit_order(o.order_no, 'shipping') FROM bk_order o WHERE o.i % 20 = 0;
-- notifications handed out, some answered
SELECT payidem.notify_result(d.event_id, d.event_id % 200 = 0) FROM payidem.notify_due(50) d;
SELECT * FROM payidem.idem_claim('bk:open', 'test', 'BK-1', 'BK_WX', 5, NULL, '1 hour');
-- a bill with one line we do not know, and its reconciliation
SELECT payidem.load_bill('BK_WX', current_date,
	'BK_WX,,TXBK_ORPHAN,,500,1,succeeded,' || to_char(current_date, 'YYYY-MM-DD') || ' 00:00:01');
SELECT * FROM payidem.reconcile('BK_WX', current_date);
};
}

# The books of the story (1.1, DESIGN section 11): each channel's bill of
# every bill day its payments were paid on (in payidem.bill_timezone) --
# every paid payment with its transaction id, amount, cost as the fee, and
# refunded once it is, plus the lines the day's bill already had that name
# no payment of ours (the story's orphan) -- loaded and reconciled; then
# settle() of every item due within a week (unless settle => 0).  The
# payments closed before they were paid stay held (their paid_after_close
# anomaly is open).  With payouts => 1 also (the story's merchant): its
# notification URL, a payout that succeeded, one that failed, one pending,
# and an adjustment.
sub books_sql
{
	my (%opt) = @_;
	my $sql = q{
DO $books$
DECLARE
	d record;
	v_tz text := coalesce(nullif(current_setting('payidem.bill_timezone', true), ''), 'UTC');
BEGIN
	FOR d IN SELECT p.channel_no, (p.paid_at AT TIME ZONE v_tz)::date AS day
	           FROM payidem.payment p
	          WHERE p.status IN ('succeeded', 'partially_refunded', 'refunded')
	          GROUP BY 1, 2 ORDER BY 2, 1 LOOP
		PERFORM payidem.load_bill(d.channel_no, d.day, (
			SELECT string_agg(l.line, E'\n' ORDER BY l.line) FROM (
				SELECT concat_ws(',', d.channel_no, to_char(d.day, 'YYYY-MM-DD'), p.transaction_id, p.payment_no,
				                 p.amount, p.cost_amount,
				                 CASE WHEN p.status = 'succeeded' THEN 'succeeded' ELSE 'refunded' END,
				                 to_char(p.paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || 'Z') AS line
				  FROM payidem.payment p
				 WHERE p.channel_no = d.channel_no AND p.status IN ('succeeded', 'partially_refunded', 'refunded')
				   AND (p.paid_at AT TIME ZONE v_tz)::date = d.day
				UNION ALL
				SELECT concat_ws(',', b.channel_no, to_char(b.bill_date, 'YYYY-MM-DD'), b.transaction_id,
				                 coalesce(b.payment_no, ''), b.amount, coalesce(b.fee::text, ''), b.status,
				                 coalesce(to_char(b.paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || 'Z', ''))
				  FROM payidem.channel_bill b
				 WHERE b.channel_no = d.channel_no AND b.bill_date = d.day
				   AND NOT EXISTS (SELECT 1 FROM payidem.payment p
				                    WHERE p.channel_no = b.channel_no AND p.transaction_id = b.transaction_id)) l));
		PERFORM payidem.reconcile(d.channel_no, d.day);
	END LOOP;
END
$books$;
};
	$sql .= q{SELECT count(*) FROM payidem.settle(current_date + 7);
} if $opt{settle} // 1;
	$sql .= q{
SELECT payidem.set_merchant_notify_url(merchant_no, 'https://shop.example/payouts') FROM bk_merchant;
SELECT payidem.apply_payout_result(payidem.request_payout(merchant_no, 1000, 'BK-PAYOUT-1'), 'succeeded', 'BANK-1')
  FROM bk_merchant;
SELECT payidem.apply_payout_result(payidem.request_payout(merchant_no, 500, 'BK-PAYOUT-2'), 'failed', 'BANK-2')
  FROM bk_merchant;
SELECT payidem.request_payout(merchant_no, 200, 'BK-PAYOUT-3') FROM bk_merchant;
SELECT payidem.adjust_balance(merchant_no, -300, 'BK-ADJ-1', 'a fine') FROM bk_merchant;
} if $opt{payouts};
	return $sql;
}

# payidem.verify(): one line per violation ("invariant subject: detail"), none
# when the books are right.
sub verify_sql
{
	return q{SELECT coalesce(string_agg(invariant || ' ' || subject || ': ' || detail, E'\n'
	                                    ORDER BY invariant, subject), '')
	           FROM payidem.verify()};
}

# Per payidem table: its name, its row count and the md5 of its rows in
# the order of their text (not of a key, which an update may change:
# status_log's did in 1.1; merchant_role holds OIDs, order_expiry is derived: see
# expiry_queue_sql).
#
# columns_of => a table (relname, attname, attnum) of the payidem tables and
# columns as they were before an update (columns_sql): only those tables,
# each row as the record of those columns (which reads as the row itself,
# x::text, while the table has no other column); rows => { relname =>
# condition on x }: only those rows of that table.
sub table_sums_sql
{
	my (%opt) = @_;
	my $cols = $opt{columns_of};
	my $rows = $opt{rows} // {};
	my $where = join(' ', map {
			my $cond = $rows->{$_} =~ s/'/''/gr;
			"WHEN '$_' THEN ' WHERE $cond'" } sort keys %$rows);
	$where = $where ? "CASE c.relname $where ELSE '' END" : "''";
	my $record = $cols
	  ? "coalesce((SELECT 'ROW(' || string_agg(format('x.%I', o.attname), ', ' ORDER BY o.attnum) || ')'
	                 FROM $cols o WHERE o.relname = c.relname), 'x')"
	  : "'x'";
	my $only = $cols ? "AND c.relname IN (SELECT o.relname FROM $cols o)" : '';
	return qq{
	SELECT c.relname, (xpath('/table/row/n/text()', x))[1]::text, (xpath('/table/row/s/text()', x))[1]::text
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
	  LATERAL query_to_xml(format('SELECT count(*) AS n, md5(coalesce(string_agg(%s::text, E''\\n'' ORDER BY %s::text COLLATE "C"), '''')) AS s FROM payidem.%I x%s',
	                              $record, $record, c.relname, $where), false, false, '') x
	 WHERE n.nspname = 'payidem' AND c.relkind = 'r' AND c.relname NOT IN ('merchant_role', 'order_expiry') $only
	 ORDER BY c.relname};
}

# The payidem tables and their columns now, as a table $name (for
# table_sums_sql(columns_of => $name) after an update).
sub columns_sql
{
	my ($name) = @_;
	return qq{DROP TABLE IF EXISTS $name;
	CREATE TABLE $name AS
	SELECT c.relname, a.attname, a.attnum::int AS attnum
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid
	 WHERE n.nspname = 'payidem' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped};
}

# The expiry queue is derived data, not dumped: what it must hold is a row per
# pending order at its expire_at (a source may also hold rows of orders
# settled since, which housekeeping removes after their time).
sub expiry_queue_sql
{
	return q{
	SELECT count(*) || ' ' || md5(coalesce(string_agg(q.order_no || '@' || q.expire_at, ',' ORDER BY q.expire_at, q.order_no), ''))
	  FROM payidem.order_expiry q JOIN payidem."order" x ON x.order_no = q.order_no
	 WHERE x.status = 'pending' AND x.expire_at = q.expire_at};
}

# How many orders, payments and refunds have a status other than their latest
# status_log row's.
sub log_disagreements_sql
{
	return q{
	SELECT count(*) FROM (
		SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
		UNION ALL SELECT 'order', order_no, status FROM payidem."order"
		UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
	 LEFT JOIN (SELECT DISTINCT ON (entity, entity_no) entity, entity_no, to_status
	              FROM payidem.status_log ORDER BY entity, entity_no, log_id DESC) l
	        ON l.entity = cur.entity AND l.entity_no = cur.no
	 WHERE cur.status IS DISTINCT FROM l.to_status};
}

# refused($node, $db, $sql, $sqlstate, $what): $sql fails with $sqlstate
sub refused
{
	my ($node, $db, $sql, $sqlstate, $what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($rc, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\n$sql");
	like($err, qr/ERROR:\s+$sqlstate/, "$what: refused with $sqlstate") or diag("rc $rc out $out err $err");
	return;
}

# The story's database still refuses what the state machines, the append-only
# log and the constraints refuse ($tag names the copy in the test names).
sub guards_hold
{
	my ($node, $db, $tag) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $pending = $node->safe_psql($db, q{SELECT min(order_no) FROM payidem."order" WHERE status = 'pending'});
	my $paid = $node->safe_psql($db, q{SELECT min(order_no) FROM payidem."order" WHERE status = 'paid'});
	my @cases = (
		[ qq{UPDATE payidem."order" SET status = 'refunded' WHERE order_no = '$pending'}, 'PI002',
			'direct UPDATE pending -> refunded' ],
		[ qq{UPDATE payidem."order" SET status = 'pending' WHERE order_no = '$paid'}, 'PI002',
			'direct UPDATE paid -> pending' ],
		[ q{UPDATE payidem.payment SET status = 'pending' WHERE status = 'failed'}, 'PI002',
			'direct UPDATE of a failed payment back to pending' ],
		[ qq{INSERT INTO payidem.refund (refund_no, payment_no, order_no, merchant_no, out_refund_no, amount, status)
	SELECT payidem.gen_order_no('RF'), payment_no, order_no, merchant_no, 'BK-DIRECT', 1, 'succeeded'
	  FROM payidem.payment WHERE status = 'succeeded' LIMIT 1}, 'PI002', 'direct INSERT of a refund as succeeded' ],
		[ q{UPDATE payidem.status_log SET to_status = 'paid' WHERE log_id = (SELECT min(log_id) FROM payidem.status_log)},
			'42501', 'UPDATE of status_log' ],
		[ q{DELETE FROM payidem.status_log WHERE log_id = (SELECT min(log_id) FROM payidem.status_log)},
			'42501', 'DELETE of status_log' ],
		[ q{TRUNCATE payidem.status_log}, '42501', 'TRUNCATE of status_log' ],
		[ qq{UPDATE payidem."order" SET amount = -1 WHERE order_no = '$pending'}, '23514', 'a negative order amount' ],
		[ q{UPDATE payidem.payment SET refunded_amount = amount + 1 WHERE status = 'succeeded'}, '23514',
			'refunded above the payment amount' ],
		[ q{INSERT INTO payidem.channel_bill (channel_no, bill_date, transaction_id, amount, fee, status, paid_at)
	VALUES ('BK_WX', current_date, 'TXNEG', -5, 0, 'succeeded', now())}, '23514', 'a negative bill amount' ],
		[ q{UPDATE payidem.merchant SET status = 'deleted'}, '23514', 'an unknown merchant status' ],
		[ qq{DELETE FROM payidem."order" WHERE order_no = '$pending'}, '42501', 'DELETE of an order' ],
		[ q{TRUNCATE payidem.refund CASCADE}, '42501', 'TRUNCATE of refunds (and of their events)' ],
		[ q{UPDATE payidem.payment SET transaction_id = (SELECT min(transaction_id) FROM payidem.payment WHERE channel_no = 'BK_WX')
	 WHERE payment_no = (SELECT max(payment_no) FROM payidem.payment WHERE status = 'succeeded' AND channel_no = 'BK_WX')}, '23505',
			'a transaction id given to a second payment of its channel' ],
		[ q{INSERT INTO payidem.payment (payment_no, order_no, merchant_no, channel_no, amount)
	SELECT payidem.gen_order_no('PY'), o.order_no, o.merchant_no, 'BK_WX', o.amount
	  FROM (SELECT x.* FROM payidem."order" x
	         WHERE x.status = 'pending' AND NOT EXISTS (SELECT 1 FROM payidem.payment p WHERE p.order_no = x.order_no)
	         LIMIT 1) o, generate_series(1, 2)}, '23505', 'two pending attempts of one order' ]);
	refused($node, $db, $_->[0], $_->[1], "$tag: $_->[2]") for @cases;
	return;
}

1;
