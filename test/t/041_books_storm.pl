# A storm of every function grant_app() hands out, called by an application
# role the way a careless or hostile caller would: 16 pgbench clients, in
# random order, on a small set of shared orders — create_order,
# begin_payment, apply_payment_result (true, repeated, conflicting and
# mismatched results), close_payment, close_order, refund,
# apply_refund_result, transit_order/payment/refund to any status, idem_claim,
# idem_record and idem_finish with keys of the shapes payidem once used for
# its own decisions (payment:<PY…>:succeeded, refund:<RF…>:succeeded),
# notify_due and notify_result, sign.
#
# Afterwards every invariant of DESIGN §5 holds (a paid order names a
# succeeded payment of its own; a success has its transaction id, paid_at and
# fees; refunded amounts are the sums of succeeded refunds, mirrored on the
# order, and statuses follow them); every success the channel reported is a
# succeeded payment or an anomaly; the status log agrees with the rows; and no
# call failed with a deadlock (40P01), a unique violation (23505), an internal
# error (XX000), a lock timeout (55P03) or a serialization failure (40001).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use Time::HiRes ();

my $t0      = Time::HiRes::time();
my $clients = 16;
my $steps   = $ENV{PAYIDEM_SOAK} ? 2000 : 250;    # per client
my $seed    = $ENV{PAYIDEM_SEED} // int(rand(1_000_000));
note("041_books_storm: seed $seed (PAYIDEM_SEED=$seed replays the set-up), $clients clients x $steps steps");

my $node = payidem_node('books_storm', key_byte => '5a', conf => q(
max_connections = 40
fsync = off
synchronous_commit = off
deadlock_timeout = 100ms
));

$node->safe_psql('postgres', qq(
SELECT setseed($seed / 1000000.0);
CREATE EXTENSION payidem;
CREATE ROLE storm_app LOGIN;
SELECT payidem.grant_app('storm_app');
CREATE TABLE bs_merchant AS SELECT merchant_no FROM payidem.create_merchant('Books Storm', 'retail', 0.006);
SELECT payidem.create_channel('BS_WX', 'wechat', 0.002);
SELECT payidem.create_channel('BS_ALI', 'alipay', 0.0025);
SELECT payidem.bind_channel(merchant_no, 'BS_WX') FROM bs_merchant;
SELECT payidem.bind_channel(merchant_no, 'BS_ALI') FROM bs_merchant;

-- what the application knows: the numbers it was given, the successes the
-- channel reported, and how every call ended
CREATE TABLE bs_order (order_no text PRIMARY KEY, amount bigint);
CREATE TABLE bs_payment (payment_no text PRIMARY KEY, order_no text, amount bigint);
CREATE TABLE bs_refund (refund_no text PRIMARY KEY, payment_no text);
CREATE TABLE bs_success (payment_no text, transaction_id text, amount bigint, outcome text);
CREATE TABLE bs_call (action text, sqlstate text);
CREATE SEQUENCE bs_seq;
GRANT SELECT, INSERT ON bs_merchant, bs_order, bs_payment, bs_refund, bs_success, bs_call TO storm_app;
GRANT USAGE ON SEQUENCE bs_seq TO storm_app;
INSERT INTO bs_order
SELECT payidem.create_order(m.merchant_no, 'BS-' || i, 100 * i, 'storm ' || i, 'https://shop.example/n'), 100 * i
  FROM bs_merchant m, generate_series(1, 24) i;

-- one random call; a deferred check (at commit) is fired inside the call's
-- block, so that its refusal is caught and counted like any other
CREATE FUNCTION bs_step() RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
	v_action text;
	v_r double precision := random();
	o bs_order;
	p bs_payment;
	f bs_refund;
	v_status text;
	v_txn text;
	v_amount bigint;
	v_out text;
	v_key text;
	v_code text := '00000';
	n record;
BEGIN
	SELECT * INTO o FROM bs_order ORDER BY random() LIMIT 1;
	SELECT * INTO p FROM bs_payment ORDER BY random() LIMIT 1;
	SELECT * INTO f FROM bs_refund ORDER BY random() LIMIT 1;
	v_action := CASE
		WHEN v_r < 0.06 THEN 'create_order'
		WHEN v_r < 0.14 THEN 'begin_payment'
		WHEN v_r < 0.42 THEN 'apply_payment_result'
		WHEN v_r < 0.46 THEN 'close_payment'
		WHEN v_r < 0.52 THEN 'close_order'
		WHEN v_r < 0.60 THEN 'refund'
		WHEN v_r < 0.68 THEN 'apply_refund_result'
		WHEN v_r < 0.76 THEN 'transit'
		WHEN v_r < 0.90 THEN 'idem'
		WHEN v_r < 0.96 THEN 'notify'
		ELSE 'sign' END;
	IF p.payment_no IS NULL AND v_action IN ('apply_payment_result', 'close_payment', 'refund', 'idem') THEN
		v_action := 'begin_payment';
	END IF;
	IF f.refund_no IS NULL AND v_action = 'apply_refund_result' THEN
		v_action := 'refund';
	END IF;
	BEGIN
		IF v_action = 'create_order' THEN
			-- a new order, or a repeat (same or other amount) of one of the first
			v_amount := 100 * (1 + floor(random() * 30))::bigint;
			v_out := payidem.create_order((SELECT merchant_no FROM bs_merchant),
										  CASE WHEN random() < 0.6 THEN 'BS-N' || nextval('bs_seq')
											   ELSE 'BS-' || (v_amount / 100) END,
										  v_amount, 'storm ' || (v_amount / 100), 'https://shop.example/n');
			INSERT INTO bs_order VALUES (v_out, v_amount) ON CONFLICT DO NOTHING;
		ELSIF v_action = 'begin_payment' THEN
			v_out := payidem.begin_payment(o.order_no, CASE WHEN random() < 0.5 THEN 'BS_WX' ELSE 'BS_ALI' END);
			INSERT INTO bs_payment VALUES (v_out, o.order_no, o.amount) ON CONFLICT DO NOTHING;
		ELSIF v_action = 'apply_payment_result' THEN
			v_r := random();
			v_status := CASE WHEN v_r < 0.7 THEN 'succeeded' WHEN v_r < 0.85 THEN 'failed' ELSE 'closed' END;
			IF v_status = 'succeeded' THEN
				-- the channel's own id, now and then another one (a second
				-- charge?) or another amount
				v_txn := CASE WHEN random() < 0.9 THEN 'TX' || p.payment_no ELSE 'TY' || nextval('bs_seq') END;
				v_amount := CASE WHEN random() < 0.95 THEN p.amount ELSE p.amount + 1 END;
			END IF;
			v_out := payidem.apply_payment_result(p.payment_no, CASE WHEN random() < 0.5 THEN 'callback' ELSE 'query' END,
												  v_status, v_txn, v_amount);
			IF v_status = 'succeeded' THEN
				INSERT INTO bs_success VALUES (p.payment_no, v_txn, v_amount, v_out);
			END IF;
		ELSIF v_action = 'close_payment' THEN
			v_out := payidem.close_payment(p.payment_no)::text;
		ELSIF v_action = 'close_order' THEN
			v_out := payidem.close_order(o.order_no)::text;
		ELSIF v_action = 'refund' THEN
			v_out := payidem.refund(p.payment_no, 1 + floor(random() * p.amount * 0.5)::bigint, 'BSR-' || nextval('bs_seq'));
			INSERT INTO bs_refund VALUES (v_out, p.payment_no) ON CONFLICT DO NOTHING;
		ELSIF v_action = 'apply_refund_result' THEN
			v_out := payidem.apply_refund_result(f.refund_no, CASE WHEN random() < 0.8 THEN 'succeeded' ELSE 'failed' END,
												 'CR' || f.refund_no);
		ELSIF v_action = 'transit' THEN
			-- any status, by the general tool: the whitelist or the
			-- bookkeeping refuses what a flow function must do
			v_r := random();
			IF v_r < 0.4 THEN
				v_out := payidem.transit_order(o.order_no, (ARRAY['paid', 'closed', 'partially_refunded', 'refunded'])[1 + floor(random() * 4)::int])::text;
			ELSIF v_r < 0.8 THEN
				v_out := payidem.transit_payment(p.payment_no, (ARRAY['succeeded', 'failed', 'closed', 'partially_refunded', 'refunded'])[1 + floor(random() * 5)::int])::text;
			ELSIF f.refund_no IS NOT NULL THEN
				v_out := payidem.transit_refund(f.refund_no, (ARRAY['succeeded', 'failed'])[1 + floor(random() * 2)::int])::text;
			END IF;
		ELSIF v_action = 'idem' THEN
			-- keys of the shapes payidem once used for its own decisions
			v_key := (ARRAY['payment:' || p.payment_no || ':succeeded', 'payment:' || p.payment_no || ':failed',
							'payment:' || p.payment_no || ':closed',
							'refund:' || coalesce(f.refund_no, p.payment_no) || ':succeeded'])[1 + floor(random() * 4)::int];
			v_r := random();
			IF v_r < 0.4 THEN
				SELECT c.outcome INTO v_out FROM payidem.idem_claim(v_key, 'payment_result', p.order_no, NULL, p.amount,
																  lease => '1 hour') c;
			ELSIF v_r < 0.8 THEN
				SELECT c.outcome INTO v_out FROM payidem.idem_record(v_key, 'payment_result', p.order_no, NULL, p.amount,
																   '{"outcome": "applied"}') c;
			ELSE
				PERFORM payidem.idem_finish(v_key, CASE WHEN random() < 0.5 THEN 'completed' ELSE 'failed' END);
			END IF;
		ELSIF v_action = 'notify' THEN
			FOR n IN SELECT * FROM payidem.notify_due(3) LOOP
				PERFORM payidem.notify_result(n.event_id, random() < 0.5);
			END LOOP;
		ELSE
			v_out := payidem.sign((SELECT merchant_no FROM bs_merchant), 'amount=' || o.amount);
		END IF;
		SET CONSTRAINTS ALL IMMEDIATE;
		SET CONSTRAINTS ALL DEFERRED;
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS v_code = RETURNED_SQLSTATE;
	END;
	INSERT INTO bs_call VALUES (v_action, v_code);
END
\$\$;
GRANT EXECUTE ON FUNCTION bs_step() TO storm_app;
));

# ---------------------------------------------------------------- the storm
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$steps --username=storm_app",
	0,
	[ qr{number of transactions actually processed: @{[ $clients * $steps ]}/}, qr{number of failed transactions: 0 \(0\.000%\)} ],
	[qr{^$}],
	'every grant_app() function, at random, by 16 clients on shared orders',
	{ '041_books_storm' => q{SELECT bs_step();} });

my $q = sub { $node->safe_psql('postgres', shift) };

my $calls = $q->(q{SELECT string_agg(action || ' ' || sqlstate || ' ' || n, ', ' ORDER BY action, sqlstate)
	FROM (SELECT action, sqlstate, count(*) n FROM bs_call GROUP BY 1, 2) x});
note("calls: $calls");
is($q->(q{SELECT count(*) FROM bs_call}), $clients * $steps, 'every call was counted');
is($q->(q{SELECT coalesce(string_agg(DISTINCT sqlstate, ','), 'none') FROM bs_call
	WHERE sqlstate IN ('40P01', '23505', 'XX000', '55P03', '40001')}), 'none',
	'no deadlock, unique violation, internal error, lock timeout or serialization failure');
is($q->(q{SELECT coalesce(string_agg(DISTINCT sqlstate, ','), 'none') FROM bs_call
	WHERE sqlstate <> '00000' AND sqlstate NOT IN ('PI001', 'PI002', 'PI003', 'PI006', 'PI008', 'PI009', '22023')}), 'none',
	'every refusal is one of the documented business errors');
cmp_ok($q->(q{SELECT count(*) FROM bs_call WHERE action = 'transit' AND sqlstate = 'PI002'}), '>', 0,
	'transit_* moves that skip the bookkeeping were tried, and refused');
cmp_ok($q->(q{SELECT count(*) FROM bs_success WHERE outcome = 'applied'}), '>', 0, 'successes were applied');
cmp_ok($q->(q{SELECT count(*) FROM bs_call WHERE action = 'apply_refund_result' AND sqlstate = '00000'}), '>', 0,
	'refund results were applied');

# ---------------------------------------------------------------- DESIGN §5
is($q->(q{SELECT count(*) FROM payidem."order" o
	WHERE o.status IN ('paid', 'partially_refunded', 'refunded')
	  AND (o.paid_at IS NULL OR NOT EXISTS (
			SELECT 1 FROM payidem.payment p
			 WHERE p.payment_no = o.paid_payment_no AND p.order_no = o.order_no
			   AND p.status IN ('succeeded', 'partially_refunded', 'refunded')))}), '0',
	'every paid order has paid_at and names a succeeded payment of its own');
is($q->(q{SELECT count(*) FROM payidem.payment p
	WHERE p.status IN ('succeeded', 'partially_refunded', 'refunded')
	  AND (p.transaction_id IS NULL OR p.paid_at IS NULL OR p.fee_amount IS NULL OR p.cost_amount IS NULL)}), '0',
	'every succeeded payment has its transaction id, paid_at and fees');
is($q->(q{SELECT count(*) FROM payidem.payment p
	WHERE p.refunded_amount <> (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
	                             WHERE r.payment_no = p.payment_no AND r.status = 'succeeded')
	   OR (p.status = 'partially_refunded') <> (p.refunded_amount > 0 AND p.refunded_amount < p.amount)
	   OR (p.status = 'refunded') <> (p.refunded_amount = p.amount)
	   OR (SELECT coalesce(sum(r.amount), 0) FROM payidem.refund r
	        WHERE r.payment_no = p.payment_no AND r.status IN ('pending', 'succeeded')) > p.amount}), '0',
	'every payment: refunded amount = its succeeded refunds, never above the amount, status follows');
is($q->(q{SELECT count(*) FROM payidem."order" o
	WHERE o.refunded_amount <> coalesce((SELECT p.refunded_amount FROM payidem.payment p
	                                      WHERE p.payment_no = o.paid_payment_no), 0)
	   OR (o.status = 'partially_refunded') <> (o.refunded_amount > 0 AND o.refunded_amount < o.amount)
	   OR (o.status = 'refunded') <> (o.refunded_amount = o.amount)}), '0',
	'every order mirrors its paying payment\'s refunds');
is($q->(q{SELECT count(*) FROM (SELECT DISTINCT payment_no FROM bs_success) s
	JOIN payidem.payment p USING (payment_no)
	WHERE p.status NOT IN ('succeeded', 'partially_refunded', 'refunded')
	  AND NOT EXISTS (SELECT 1 FROM payidem.anomaly a WHERE a.payment_no = s.payment_no)}), '0',
	'every success the channel reported is a succeeded payment or an anomaly');
is($q->(q{SELECT count(*) FROM bs_success s JOIN payidem.payment p USING (payment_no)
	WHERE s.outcome IN ('applied', 'anomaly') AND (p.transaction_id <> s.transaction_id OR p.amount <> s.amount)}), '0',
	'a success was applied only with its own transaction id and amount');
is($q->(q{SELECT count(*) FROM (
		SELECT 'payment' AS entity, payment_no AS no, status FROM payidem.payment
		UNION ALL SELECT 'order', order_no, status FROM payidem."order"
		UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund) cur
	WHERE cur.status IS DISTINCT FROM (SELECT l.to_status FROM payidem.status_log l
	                                    WHERE l.entity = cur.entity AND l.entity_no = cur.no
	                                    ORDER BY l.log_id DESC LIMIT 1)}), '0',
	'the latest status_log row of every row is its status');

diag(sprintf('041 figures: seed %d; %d calls by %d clients; %s orders, %s payments, %s refunds, %s anomalies; %.1f s',
		$seed, $clients * $steps, $clients,
		$q->(q{SELECT count(*) FROM payidem."order"}), $q->(q{SELECT count(*) FROM payidem.payment}),
		$q->(q{SELECT count(*) FROM payidem.refund}), $q->(q{SELECT count(*) FROM payidem.anomaly}),
		Time::HiRes::time() - $t0));

$node->stop;
done_testing();
