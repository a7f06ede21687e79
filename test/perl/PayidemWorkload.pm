# PayidemWorkload — the payment workload of the fault tests (crash under load,
# clock faults) and the invariants checked after every fault.
#
#   my @files = workload_setup($node, $logdir);   # SQL objects + pgbench -f files
#   pgbench ... @files ...                         # clients log every number they
#                                                  # were told in $logdir/seen
#   $checks += check_invariants($node, $logdir, 'after crash 3');
#
# The workload: new orders with a first attempt, channel results (success,
# failure, duplicates through callback and query) and close_order racing them,
# refunds with (sometimes repeated) results.  A client logs a number with
# \shell only after pgbench has the COMMIT's answer, so a crash can drop a
# line from the log but never add one.
package PayidemWorkload;

use strict;
use warnings;

use Exporter 'import';
use Test::More;

our @EXPORT = qw(workload_setup client_numbers check_invariants);

sub workload_setup
{
	my ($node, $logdir) = @_;
	$node->safe_psql('postgres', q{
CREATE EXTENSION payidem;
CREATE TABLE crash_merchant AS SELECT merchant_no FROM payidem.create_merchant('Workload Shop', 'retail', 0.006);
SELECT payidem.create_channel('CR_WX', 'wechat', 0.002);
SELECT payidem.create_channel('CR_ALI', 'alipay', 0.0025);
SELECT payidem.bind_channel(merchant_no, 'CR_WX') FROM crash_merchant;
SELECT payidem.bind_channel(merchant_no, 'CR_ALI') FROM crash_merchant;
CREATE SEQUENCE crash_trade;
CREATE SEQUENCE crash_refund_seq;
-- every answer of apply_payment_result/close_order, written in the same
-- transaction as its effect (so it survives exactly when the effect does)
CREATE TABLE crash_outcome (id bigserial PRIMARY KEY, payment_no text, order_no text,
                            kind text, status text, outcome text);

-- a new order and its first attempt
CREATE FUNCTION crash_new_order(OUT o text, OUT p text) LANGUAGE plpgsql AS $$
BEGIN
	o := payidem.create_order((SELECT merchant_no FROM crash_merchant), 'C-' || nextval('crash_trade'),
	                          100 + floor(random() * 9900)::int, 'crash test', 'https://shop.example/n');
	p := payidem.begin_payment(o, CASE WHEN random() < 0.5 THEN 'CR_WX' ELSE 'CR_ALI' END);
END $$;

-- a channel result for one of the 40 newest attempts (so clients collide on
-- the same payments: duplicates), or a close_order racing it.  The channel's
-- final word is fixed per payment (a payment number ending in 7 fails).
CREATE FUNCTION crash_result() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	p payidem.payment;
	v_status text;
	v_out text;
BEGIN
	SELECT * INTO p FROM payidem.payment ORDER BY payment_no DESC LIMIT 1 OFFSET floor(random() * 40)::int;
	IF NOT FOUND THEN
		RETURN 'none';
	END IF;
	IF random() < 0.06 THEN
		BEGIN
			v_out := payidem.close_order(p.order_no)::text;
		EXCEPTION WHEN SQLSTATE 'PI002' THEN
			v_out := 'PI002';
		END;
		INSERT INTO crash_outcome (payment_no, order_no, kind, status, outcome)
		VALUES (p.payment_no, p.order_no, 'close_order', NULL, v_out);
		RETURN v_out;
	END IF;
	v_status := CASE WHEN right(p.payment_no, 1) = '7' THEN 'failed' ELSE 'succeeded' END;
	v_out := payidem.apply_payment_result(p.payment_no, CASE WHEN random() < 0.5 THEN 'callback' ELSE 'query' END,
	                                      v_status,
	                                      CASE WHEN v_status = 'succeeded' THEN 'TX' || p.payment_no END,
	                                      CASE WHEN v_status = 'succeeded' THEN p.amount END);
	INSERT INTO crash_outcome (payment_no, order_no, kind, status, outcome)
	VALUES (p.payment_no, p.order_no, 'result', v_status, v_out);
	RETURN v_out;
END $$;

-- a refund of one of the newest paid payments, and its result (sometimes
-- delivered twice); PI006 (too much) and PI002 (no longer refundable) are
-- expected answers
CREATE FUNCTION crash_refund() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	p payidem.payment;
	v_refund text;
	v_status text := CASE WHEN random() < 0.85 THEN 'succeeded' ELSE 'failed' END;
BEGIN
	SELECT * INTO p FROM payidem.payment WHERE status IN ('succeeded', 'partially_refunded')
	 ORDER BY payment_no DESC LIMIT 1 OFFSET floor(random() * 20)::int;
	IF NOT FOUND THEN
		RETURN 'none';
	END IF;
	BEGIN
		v_refund := payidem.refund(p.payment_no, 1 + floor(random() * p.amount * 0.6)::bigint,
		                           'CR-' || nextval('crash_refund_seq'));
		PERFORM payidem.apply_refund_result(v_refund, v_status, 'CRR' || v_refund);
		IF random() < 0.3 THEN
			PERFORM payidem.apply_refund_result(v_refund, v_status, 'CRR' || v_refund);
		END IF;
	EXCEPTION WHEN SQLSTATE 'PI006' OR SQLSTATE 'PI002' THEN
		RETURN 'none';
	END;
	RETURN v_refund;
END $$;
});

	my @pgbench_files;
	# the pgbench scripts: numbers are logged client-side after the COMMIT
	my %script = (
		'new_order' => "SELECT o, p FROM crash_new_order() \\gset\n"
		  . "\\shell echo :client_id :o :p >> $logdir/seen\n",
		'result' => "SELECT crash_result() AS r \\gset\n",
		'refund' => "SELECT crash_refund() AS rf \\gset\n"
		  . "\\shell echo :client_id :rf >> $logdir/seen\n",
	);
	for my $name (sort keys %script)
	{
		my $file = "$logdir/$name.sql";
		open(my $sfh, '>', $file) or die;
		print $sfh $script{$name};
		close $sfh;
	}
	my %weight = (new_order => 4, result => 8, refund => 2);
	push @pgbench_files, ('-f', "$logdir/$_.sql\@$weight{$_}") for sort keys %weight;
	return @pgbench_files;
}

# all numbers any client was ever told, with where they came from
sub client_numbers
{
	my ($logdir) = @_;
	my %seen;
	my $lines = 0;
	if (open(my $in, '<', "$logdir/seen"))
	{
		while (my $l = <$in>)
		{
			my (undef, @nums) = split ' ', $l;    # client id, numbers
			for my $n (@nums)
			{
				next if $n eq 'none';
				$lines++;
				$seen{$n}++;
			}
		}
		close $in;
	}
	return ($lines, \%seen);
}

sub check_invariants
{
	my ($node, $logdir, $what) = @_;
	my $q1 = sub { return $node->safe_psql('postgres', $_[0]); };
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $checks = 0;

	# 1. numbers: one core (time + shard + seq) per row across all three tables
	my ($rows, $cores) = split /\|/, $q1->(q{
		SELECT count(*), count(DISTINCT substr(n, 3, 22)) FROM (
			SELECT order_no FROM payidem."order" UNION ALL
			SELECT payment_no FROM payidem.payment UNION ALL
			SELECT refund_no FROM payidem.refund) x(n)});
	is($cores, $rows, "$what: $rows numbers in the tables, no core issued twice"); $checks++;

	# 2. what the clients were told: each once, each still there
	my ($lines, $seen) = client_numbers($logdir);
	my $twice = grep { $seen->{$_} > 1 } keys %$seen;
	is($twice, 0, "$what: no number handed to two clients (or twice) among $lines logged answers"); $checks++;
	my %core_seen;
	$core_seen{ substr($_, 2, 22) }++ for keys %$seen;
	is(scalar(grep { $core_seen{$_} > 1 } keys %core_seen), 0,
		"$what: no core handed out twice, whatever the prefix"); $checks++;
	my $in_db = $q1->(q{SELECT string_agg(n, ' ') FROM (
			SELECT order_no FROM payidem."order" UNION ALL
			SELECT payment_no FROM payidem.payment UNION ALL
			SELECT refund_no FROM payidem.refund) x(n)});
	my %db = map { $_ => 1 } split ' ', $in_db;
	my @lost = grep { !$db{$_} } keys %$seen;
	is(scalar(@lost), 0, "$what: every acknowledged number is in the database"
		  . (@lost ? " (lost: @lost[0..($#lost < 4 ? $#lost : 4)])" : '')); $checks++;

	# each client issues one transaction after another: the numbers it was
	# told, in the order it was told them, strictly increase (whatever the prefix)
	my $backwards = 0;
	my %prev;
	if (open(my $in, '<', "$logdir/seen"))
	{
		while (my $l = <$in>)
		{
			my ($client, @nums) = split ' ', $l;
			for my $n (@nums)
			{
				next if $n eq 'none';
				$backwards++ unless substr($n, 2, 22) gt ($prev{$client} // '');
				$prev{$client} = substr($n, 2, 22);
			}
		}
		close $in;
	}
	is($backwards, 0, "$what: each client's numbers strictly increase in the order it got them"); $checks++;

	# 3. the next number is above every number ever handed out
	my $next = $q1->(q{SELECT payidem.gen_order_no('ZZ')});
	my ($max_db) = $q1->(q{SELECT max(substr(n, 3, 22)) FROM (
			SELECT order_no FROM payidem."order" UNION ALL
			SELECT payment_no FROM payidem.payment UNION ALL
			SELECT refund_no FROM payidem.refund) x(n)});
	my ($max_seen) = sort { $b cmp $a } keys %core_seen;
	$max_seen //= '';
	ok(substr($next, 2, 22) gt $max_db && substr($next, 2, 22) gt $max_seen,
		"$what: the next number is above all issued ones"); $checks++;

	# 4. each payment's result applied at most once
	is($q1->(q{SELECT count(*) FROM (SELECT payment_no, status FROM crash_outcome WHERE kind = 'result'
	          GROUP BY 1, 2 HAVING count(*) FILTER (WHERE outcome IN ('applied', 'anomaly')) > 1) x}),
		'0', "$what: no payment result applied twice"); $checks++;
	is($q1->(q{SELECT count(*) FROM (SELECT entity, entity_no, to_status FROM payidem.status_log
	          GROUP BY 1, 2, 3 HAVING count(*) > 1) x}),
		'0', "$what: no row entered the same status twice (status_log)"); $checks++;
	is($q1->(q{SELECT count(*) FROM payidem.idempotency}),
		'0', "$what: payidem's decisions wrote no idempotency key (the payment rows record them)"); $checks++;
	is($q1->(q{SELECT count(*) FROM payidem.payment p
	         WHERE p.status IN ('succeeded', 'partially_refunded', 'refunded')
	           AND (p.transaction_id IS NULL OR p.paid_at IS NULL OR p.fee_amount IS NULL OR p.cost_amount IS NULL)}),
		'0', "$what: every succeeded payment has its transaction id, paid_at and fees"); $checks++;

	# 5. order paid iff a success arrived while it was pending; other successes are anomalies
	is($q1->(q{
		SELECT count(*) FROM (
			SELECT o.status, o.paid_payment_no,
			       (SELECT count(*) FROM payidem.payment p WHERE p.order_no = o.order_no
			           AND p.status IN ('succeeded', 'partially_refunded', 'refunded')) AS successes,
			       (SELECT count(*) FROM payidem.anomaly a WHERE a.order_no = o.order_no
			           AND a.kind IN ('paid_after_close', 'duplicate_payment')) AS anomalies
			  FROM payidem."order" o) x
		 WHERE NOT (
			(status IN ('paid', 'partially_refunded', 'refunded') AND paid_payment_no IS NOT NULL AND anomalies = successes - 1)
			OR (status = 'closed' AND paid_payment_no IS NULL AND anomalies = successes)
			OR (status = 'pending' AND successes = 0 AND anomalies = 0))}),
		'0', "$what: order paid iff it has a succeeded payment (or an anomaly explains it)"); $checks++;
	is($q1->(q{SELECT count(*) FROM payidem."order" o WHERE o.paid_payment_no IS NOT NULL AND NOT EXISTS
	          (SELECT 1 FROM payidem.payment p WHERE p.payment_no = o.paid_payment_no
	              AND p.status IN ('succeeded', 'partially_refunded', 'refunded'))}),
		'0', "$what: the paying payment of every paid order succeeded"); $checks++;

	# 6. refunds never above paid
	is($q1->(q{
		SELECT count(*) FROM payidem.payment p
		 WHERE p.refunded_amount > p.amount
		    OR p.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
		                              WHERE r.payment_no = p.payment_no AND r.status = 'succeeded')
		    OR (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
		         WHERE r.payment_no = p.payment_no AND r.status IN ('pending', 'succeeded')) > p.amount
		    OR (p.status = 'refunded') <> (p.refunded_amount = p.amount AND p.refunded_amount > 0)
		    OR (p.status = 'partially_refunded') <> (p.refunded_amount BETWEEN 1 AND p.amount - 1)}),
		'0', "$what: refunded <= paid per payment, and statuses follow"); $checks++;
	is($q1->(q{
		SELECT count(*) FROM payidem."order" o
		 WHERE o.refunded_amount > o.amount
		    OR o.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
		                              WHERE r.payment_no = o.paid_payment_no AND r.status = 'succeeded')}),
		'0', "$what: refunded <= paid per order"); $checks++;

	# 7. the status log agrees with the rows
	is($q1->(q{
		SELECT count(*) FROM (
			SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
			UNION ALL SELECT 'order', order_no, status FROM payidem."order"
			UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
		 LEFT JOIN (SELECT DISTINCT ON (entity, entity_no) entity, entity_no, to_status
		              FROM payidem.status_log ORDER BY entity, entity_no, log_id DESC) l
		        ON l.entity = cur.entity AND l.entity_no = cur.no
		 WHERE cur.status IS DISTINCT FROM l.to_status}),
		'0', "$what: latest status_log row of every entity = its current status"); $checks++;
	is($q1->(q{SELECT count(*) FROM payidem.status_log l WHERE NOT EXISTS (
	          SELECT 1 FROM payidem.payment WHERE payment_no = l.entity_no
	          UNION ALL SELECT 1 FROM payidem."order" WHERE order_no = l.entity_no
	          UNION ALL SELECT 1 FROM payidem.refund WHERE refund_no = l.entity_no)}),
		'0', "$what: no status_log row for a row that does not exist (rolled back work left no trace)"); $checks++;

	# 8. idempotency keys
	is($q1->(q{SELECT count(*) FROM payidem.idempotency WHERE status = 'processing' AND locked_until < now()}),
		'0', "$what: no idempotency key stuck processing past its lease"); $checks++;

	# 9. the books' own check (DESIGN section 11): journals, balances, settled
	# items, payouts, paid orders and refunded amounts, re-derived from the
	# tables
	is($q1->(q{SELECT coalesce(string_agg(invariant || ' ' || subject || ': ' || detail, E'\n'
	                                      ORDER BY invariant, subject), '') FROM payidem.verify()}),
		'', "$what: payidem.verify() finds nothing wrong"); $checks++;

	return $checks;
}

1;
