# A storm of channel results over 2,000 orders: 16 pgbench clients deliver
# every payment result 5 times (as callback or query, at random), in random
# order, while close_order() races the callbacks of some orders.  Some orders
# were closed before their money arrived, some were paid on two channels, some
# attempts fail.  Then 16 clients refund at random, concurrently.
#
# Afterwards: each payment's result had exactly one effect (one applied or
# anomaly, the other deliveries duplicate); an order is paid exactly when one
# of its attempts succeeded and it was not closed first; every other success
# is an anomaly; refunds never exceed what was paid; the status log agrees
# with the current statuses.  pgbench reports no failed transaction.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;

my $clients = 16;
my $orders  = 2000;

my $node = payidem_node('payment_storm', key_byte => '3c', conf => q(
max_connections = 40
fsync = off
synchronous_commit = off
));

# Orders, by i % 10:
#   0     two attempts: WeChat closed by us, then Alipay; both report success
#   5     the order was closed before the success arrived (paid_after_close)
#   3     close_order() races the success callbacks
#   7     the attempt fails
#   else  one attempt that succeeds
$node->safe_psql(
	'postgres', qq(
CREATE EXTENSION payidem;
CREATE TABLE storm_merchant AS SELECT merchant_no FROM payidem.create_merchant('Storm Shop', 'retail', 0.006);
SELECT payidem.create_channel('STORM_WX', 'wechat', 0.002);
SELECT payidem.create_channel('STORM_ALI', 'alipay', 0.0025);
SELECT payidem.bind_channel(merchant_no, 'STORM_WX') FROM storm_merchant;
SELECT payidem.bind_channel(merchant_no, 'STORM_ALI') FROM storm_merchant;

CREATE TABLE storm_order AS
SELECT i, payidem.create_order(m.merchant_no, 'S-' || i, 100 + i, 'storm ' || i, 'https://shop.example/n') AS order_no
  FROM storm_merchant m, generate_series(1, $orders) i;
CREATE TABLE storm_payment (payment_no text PRIMARY KEY, i int, final text);
INSERT INTO storm_payment
SELECT payidem.begin_payment(o.order_no, 'STORM_WX'), o.i, CASE WHEN o.i % 10 = 7 THEN 'failed' ELSE 'succeeded' END
  FROM storm_order o ORDER BY o.i;
SELECT payidem.close_payment(p.payment_no) FROM storm_payment p WHERE p.i % 10 = 0;
INSERT INTO storm_payment
SELECT payidem.begin_payment(o.order_no, 'STORM_ALI'), o.i, 'succeeded' FROM storm_order o WHERE o.i % 10 = 0;
SELECT payidem.close_order(o.order_no) FROM storm_order o WHERE o.i % 10 = 5;

-- each result 5 times, as callback or query, plus one close_order per racing order: shuffled
CREATE TABLE storm_event (event_id int PRIMARY KEY, kind text, ref text, status text);
INSERT INTO storm_event
SELECT row_number() OVER (ORDER BY random()), kind, ref, status FROM (
	SELECT CASE WHEN random() < 0.5 THEN 'callback' ELSE 'query' END AS kind, p.payment_no AS ref, p.final AS status
	  FROM storm_payment p, generate_series(1, 5)
	UNION ALL
	SELECT 'close_order', o.order_no, NULL FROM storm_order o WHERE o.i % 10 = 3) e;
CREATE SEQUENCE storm_next;
CREATE TABLE storm_outcome (event_id int PRIMARY KEY, kind text, ref text, outcome text);

CREATE FUNCTION storm_step() RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
	v_id int := nextval('storm_next');
	e storm_event;
	v_outcome text;
BEGIN
	SELECT * INTO e FROM storm_event WHERE event_id = v_id;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	IF e.kind = 'close_order' THEN
		BEGIN
			v_outcome := payidem.close_order(e.ref)::text;
		EXCEPTION WHEN SQLSTATE 'PI002' THEN
			v_outcome := 'PI002';
		END;
	ELSE
		v_outcome := payidem.apply_payment_result(e.ref, e.kind, e.status,
			CASE WHEN e.status = 'succeeded' THEN 'TX' || e.ref END,
			CASE WHEN e.status = 'succeeded' THEN (SELECT amount FROM payidem.payment WHERE payment_no = e.ref) END);
	END IF;
	INSERT INTO storm_outcome VALUES (e.event_id, e.kind, e.ref, v_outcome);
END
\$\$;

-- a random refund of a random paid payment; PI006 (too much) and PI002 (not
-- refundable) are expected answers; most refunds succeed at once, some fail
CREATE TABLE storm_refund_try (try_id int PRIMARY KEY, payment_no text, amount bigint, answer text);
CREATE SEQUENCE storm_refund_next;
CREATE FUNCTION storm_refund() RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
	v_try int := nextval('storm_refund_next');
	v_payment text;
	v_amount bigint;
	v_refund text;
	v_answer text;
BEGIN
	SELECT payment_no, 1 + (random() * amount * 0.6)::bigint INTO v_payment, v_amount
	  FROM payidem.payment WHERE status IN ('succeeded', 'partially_refunded')
	 ORDER BY payment_no OFFSET (random() * 300)::int LIMIT 1;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	BEGIN
		v_refund := payidem.refund(v_payment, v_amount, 'SR-' || v_try);
		v_answer := payidem.apply_refund_result(v_refund, CASE WHEN random() < 0.85 THEN 'succeeded' ELSE 'failed' END);
	EXCEPTION WHEN SQLSTATE 'PI006' OR SQLSTATE 'PI002' THEN
		v_answer := SQLSTATE;
	END;
	INSERT INTO storm_refund_try VALUES (v_try, v_payment, v_amount, v_answer);
END
\$\$;
));

my $events = $node->safe_psql('postgres', 'SELECT count(*) FROM storm_event');
my $per_client = int(($events + $clients - 1) / $clients);
note "$events events, $per_client transactions per client";

$node->pgbench(
	"--no-vacuum --client=$clients --jobs=4 --transactions=$per_client",
	0,
	[
		qr{number of transactions actually processed: @{[ $clients * $per_client ]}/},
		qr{number of failed transactions: 0 \(0\.000%\)}
	],
	[qr{^$}],
	'results delivered 5 times each, concurrently, without an error',
	{ '040_results' => "SELECT storm_step();\n" });

is($node->safe_psql('postgres', 'SELECT count(*) FROM storm_outcome'), $events, 'every event was delivered');

# one effect per payment result
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM (
	SELECT ref FROM storm_outcome WHERE kind <> 'close_order'
	 GROUP BY ref
	HAVING count(*) FILTER (WHERE outcome IN ('applied', 'anomaly')) <> 1
	    OR count(*) FILTER (WHERE outcome = 'duplicate') <> 4
	    OR count(*) <> 5) x)),
	'0', 'each payment result applied once (applied or anomaly), its 4 repeats duplicate');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem.payment p JOIN storm_payment s USING (payment_no)
	WHERE p.status <> s.final)), '0', 'every payment took its reported status');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem.idempotency)), '0',
	"no idempotency key: payidem's decisions are recorded in the payment rows");
is($node->safe_psql('postgres', q(SELECT count(*) FROM (SELECT entity_no, to_status FROM payidem.status_log
	WHERE entity = 'payment' GROUP BY 1, 2 HAVING count(*) > 1) x)), '0',
	'no payment entered a status twice');

# the orders: paid exactly when a success arrived before any close; every other success an anomaly
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM (
	SELECT o.order_no, o.status, o.paid_payment_no,
	       (SELECT count(*) FROM payidem.payment p WHERE p.order_no = o.order_no
	           AND p.status IN ('succeeded', 'partially_refunded', 'refunded')) AS successes,
	       (SELECT count(*) FROM payidem.anomaly a WHERE a.order_no = o.order_no
	           AND a.kind IN ('paid_after_close', 'duplicate_payment')) AS anomalies
	  FROM payidem."order" o) x
 WHERE NOT (
	(status IN ('paid', 'partially_refunded', 'refunded') AND paid_payment_no IS NOT NULL AND anomalies = successes - 1)
	OR (status = 'closed' AND paid_payment_no IS NULL AND anomalies = successes)
	OR (status = 'pending' AND successes = 0 AND anomalies = 0)))),
	'0', 'an order is paid exactly when it got a success while pending; every other success is an anomaly');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem."order" o JOIN storm_order s USING (order_no)
	WHERE s.i % 10 = 0 AND o.status <> 'paid')), '0', 'orders paid on two channels are paid');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem.anomaly WHERE kind = 'duplicate_payment')),
	$orders / 10, 'one duplicate_payment anomaly per order paid twice');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem."order" o JOIN storm_order s USING (order_no)
	WHERE s.i % 10 = 5 AND o.status <> 'closed')), '0', 'orders closed before the money stay closed');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem.anomaly WHERE kind = 'paid_after_close')),
	$node->safe_psql('postgres', q(SELECT count(*) FROM payidem."order" WHERE status = 'closed')),
	'one paid_after_close anomaly per closed order (all of them got money)');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem."order" o JOIN storm_order s USING (order_no)
	WHERE s.i % 10 = 7 AND o.status <> 'pending')), '0', 'orders whose attempt failed stay pending');
my ($race_paid, $race_closed) = split /\|/, $node->safe_psql('postgres', q(
	SELECT count(*) FILTER (WHERE o.status = 'paid'), count(*) FILTER (WHERE o.status = 'closed')
	  FROM payidem."order" o JOIN storm_order s USING (order_no) WHERE s.i % 10 = 3));
is($race_paid + $race_closed, $orders / 10, "close racing success: each order paid ($race_paid) or closed ($race_closed)");
is($node->safe_psql('postgres', q(SELECT count(*) FROM storm_outcome e JOIN payidem."order" o ON o.order_no = e.ref
	WHERE e.kind = 'close_order' AND (e.outcome = 'true') <> (o.status = 'closed'))), '0',
	'close_order answered true exactly where it closed the order');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem."order" o
	WHERE o.status = 'paid' AND (SELECT count(*) FROM payidem.notify_event e
								  WHERE e.order_no = o.order_no AND e.event = 'order.paid' AND e.status = 'pending') <> 1)), '0',
	'every paid order has exactly one order.paid event due');
is($node->safe_psql('postgres', q(SELECT count(*) FROM payidem.notify_event e JOIN payidem."order" o USING (order_no)
	WHERE (e.event = 'order.paid') <> (o.paid_payment_no IS NOT NULL) OR (e.event = 'order.closed') <> (o.status = 'closed'))), '0',
	'an order.paid event exactly for a paid order, an order.closed one exactly for a closed order');

# concurrent refunds
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=4 --transactions=200",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[qr{^$}],
	'random refunds, concurrently, without an unexpected error',
	{ '040_refunds' => "SELECT storm_refund();\n" });
my ($refunded, $too_much) = split /\|/, $node->safe_psql('postgres', q(
	SELECT count(*) FILTER (WHERE answer = 'applied'), count(*) FILTER (WHERE answer = 'PI006') FROM storm_refund_try));
ok($refunded > 100, "refunds applied ($refunded; $too_much refused with PI006)");
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM payidem.payment p
 WHERE p.refunded_amount > p.amount
    OR p.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
                              WHERE r.payment_no = p.payment_no AND r.status = 'succeeded')
    OR (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
         WHERE r.payment_no = p.payment_no AND r.status IN ('pending', 'succeeded')) > p.amount
    OR (p.status = 'refunded') <> (p.refunded_amount = p.amount AND p.refunded_amount > 0)
    OR (p.status = 'partially_refunded') <> (p.refunded_amount BETWEEN 1 AND p.amount - 1))),
	'0', 'refunded never above paid; payment amounts and statuses follow the refunds');
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM payidem."order" o
 WHERE o.refunded_amount > o.amount
    OR o.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
                              WHERE r.payment_no = o.paid_payment_no AND r.status = 'succeeded'))),
	'0', 'order refunded amounts are the refunds of the payment that paid it');

# the status log agrees with the current statuses, and nothing moved twice
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM (
	SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
	UNION ALL SELECT 'order', order_no, status FROM payidem."order"
	UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
 LEFT JOIN (SELECT DISTINCT ON (entity, entity_no) entity, entity_no, to_status
              FROM payidem.status_log ORDER BY entity, entity_no, log_id DESC) l
        ON l.entity = cur.entity AND l.entity_no = cur.no
 WHERE cur.status IS DISTINCT FROM l.to_status)),
	'0', 'the last logged status of every row is its current status');
is( $node->safe_psql(
		'postgres', q(
SELECT count(*) FROM (SELECT entity, entity_no, to_status FROM payidem.status_log
                       GROUP BY 1, 2, 3 HAVING count(*) > 1) x)),
	'0', 'no row entered the same status twice');

$node->stop;
done_testing();
