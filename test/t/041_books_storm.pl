# A storm of every function grant_app() and grant_finance() hand out, called
# by an application role the way a careless or hostile caller would: 16
# pgbench clients, in random order, on a small set of shared orders --
# create_order, begin_payment, apply_payment_result (true, repeated,
# conflicting and mismatched results), close_payment, close_order, refund,
# apply_refund_result, transit_order/payment/refund to any status, idem_claim,
# idem_record and idem_finish with keys of the shapes payidem once used for
# its own decisions (payment:<PY…>:succeeded, refund:<RF…>:succeeded),
# notify_due and notify_result, sign -- and the books (DESIGN section 11):
# load_bill and reconcile of past days' bills (now and then a line missing,
# an unknown line or another fee), settle() of days around today,
# request_payout (also above the available balance: PI010; also repeated,
# with the same or another amount; also of a frozen merchant: PI004),
# apply_payout_result (succeeded, failed, repeated, contradicted),
# adjust_balance (credits and debits, also repeated), resolve_anomaly and
# resolve_diff.  Two active merchants (T1 and D1) and a frozen one.
#
# The storm runs on four days: the server is started with its clock three,
# two and one day behind (libfaketime), then on today, so that there are
# past bill days to reconcile and settle while payments go on.
#
# Afterwards every invariant of DESIGN §5 holds (a paid order names a
# succeeded payment of its own; a success has its transaction id, paid_at and
# fees; refunded amounts are the sums of succeeded refunds, mirrored on the
# order, and statuses follow them); every success the channel reported is a
# succeeded payment or an anomaly; the status log agrees with the rows; and no
# call failed with a deadlock (40P01), a unique violation (23505), an internal
# error (XX000), a lock timeout (55P03) or a serialization failure (40001),
# nor any transaction at its commit (the journal's check, PI002).  The books
# (§11): payidem.verify() finds nothing; the balances add up to the journal,
# which sums to 0; no in_payout is negative; each item was settled once (by
# the one settle() run that reported it); each payout's money is where its
# status says, and a merchant's available, in payout and paid out are what
# was settled for it plus its adjustments.  Then the finance team's last
# pass -- every day's bill as the channel has it, the anomalies resolved,
# settle() -- settles every paid payment and succeeded refund, once, and
# the books still hold.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use PayidemNode;
use PayidemStory qw(verify_sql);
use Time::HiRes ();

my $t0      = Time::HiRes::time();
my $clients = 16;
my $steps   = $ENV{PAYIDEM_SOAK} ? 500 : 90;    # per client and day
my $seed    = $ENV{PAYIDEM_SEED} // int(rand(1_000_000));
my $faketime_lib = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
# the days the storm runs on, as the server's clock offset (libfaketime)
my @days = -e $faketime_lib ? (-3, -2, -1, 0) : (0);
note("041_books_storm: seed $seed (PAYIDEM_SEED=$seed replays the set-up), $clients clients x $steps steps x "
	  . scalar(@days) . ' days');
note("libfaketime not found at $faketime_lib: the storm runs on today only") if @days == 1;

my $node = payidem_node('books_storm', key_byte => '5a', start => 0, conf => q(
max_connections = 40
fsync = off
synchronous_commit = off
deadlock_timeout = 100ms
payidem.bill_timezone = 'Asia/Shanghai'
));

# the server, with its clock $offset days behind (0: the real clock)
sub start_on_day
{
	my ($offset) = @_;
	local $ENV{LD_PRELOAD} = $offset ? $faketime_lib : ($ENV{LD_PRELOAD} // '');
	local $ENV{FAKETIME} = $offset ? "${offset}d" : '';
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	$node->start;
	return;
}
start_on_day($days[0]);

$node->safe_psql('postgres', qq(
SELECT setseed($seed / 1000000.0);
CREATE EXTENSION payidem;
CREATE ROLE storm_app LOGIN;
SELECT payidem.grant_app('storm_app');
-- the finance team's functions (settle, adjust_balance), the auditor's reads
-- and the bill's import, through a role of its own
CREATE ROLE storm_finance;
SELECT payidem.grant_finance('storm_finance');
GRANT EXECUTE ON FUNCTION payidem.load_bill(text, date, text) TO storm_finance;
GRANT storm_finance TO storm_app;
CREATE TABLE bs_merchant (merchant_no text PRIMARY KEY, active boolean);
INSERT INTO bs_merchant SELECT merchant_no, true FROM payidem.create_merchant('Books Storm', 'retail', 0.006);
INSERT INTO bs_merchant SELECT merchant_no, true FROM payidem.create_merchant('Books Storm Two', 'retail', 0.0045, 'D1');
INSERT INTO bs_merchant SELECT merchant_no, false FROM payidem.create_merchant('Books Storm Frozen', 'retail', 0.006);
SELECT payidem.freeze_merchant(merchant_no) FROM bs_merchant WHERE NOT active;
SELECT payidem.set_merchant_notify_url(merchant_no, 'https://shop.example/payouts') FROM bs_merchant;
SELECT payidem.create_channel('BS_WX', 'wechat', 0.002);
SELECT payidem.create_channel('BS_ALI', 'alipay', 0.0025);
SELECT payidem.bind_channel(merchant_no, 'BS_WX') FROM bs_merchant WHERE active;
SELECT payidem.bind_channel(merchant_no, 'BS_ALI') FROM bs_merchant WHERE active;
-- a holiday (T1 skips it)
INSERT INTO payidem.business_day VALUES (current_date - ($days[0]) + 1, false, 'storm holiday');

-- what the application knows: the numbers it was given, the successes the
-- channel reported, and how every call ended; the day (phase) of the storm
CREATE TABLE bs_phase (phase int);
INSERT INTO bs_phase VALUES (0);
CREATE TABLE bs_order (order_no text PRIMARY KEY, amount bigint, phase int);
CREATE TABLE bs_payment (payment_no text PRIMARY KEY, order_no text, amount bigint, phase int);
CREATE TABLE bs_refund (refund_no text PRIMARY KEY, payment_no text);
CREATE TABLE bs_success (payment_no text, transaction_id text, amount bigint, outcome text);
CREATE TABLE bs_call (action text, sqlstate text);
-- the books: what settle() reported, the payouts and their results, the adjustments
CREATE TABLE bs_settle (settle_date date, merchant_no text, currency text, items bigint, gross numeric,
                        refunds numeric, fees numeric, net numeric, held bigint);
CREATE TABLE bs_payout (payout_no text PRIMARY KEY, merchant_no text, out_payout_no text, amount bigint);
CREATE TABLE bs_payout_result (payout_no text, status text, outcome text);
CREATE TABLE bs_adjust (adjust_no text PRIMARY KEY, merchant_no text, out_adjust_no text, amount bigint);
CREATE SEQUENCE bs_seq;
GRANT SELECT ON bs_phase TO storm_app;
GRANT SELECT, INSERT ON bs_merchant, bs_order, bs_payment, bs_refund, bs_success, bs_call,
	bs_settle, bs_payout, bs_payout_result, bs_adjust TO storm_app;
GRANT USAGE ON SEQUENCE bs_seq TO storm_app;

-- one random call; a deferred check (at commit) is fired inside the call's
-- block, so that its refusal is caught and counted like any other (the
-- journal's check at commit is not: a refusal fails the transaction)
CREATE FUNCTION bs_step() RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
	v_action text;
	v_r double precision := random();
	v_phase int := (SELECT phase FROM bs_phase);
	v_tz text := current_setting('payidem.bill_timezone');
	v_today date := (now() AT TIME ZONE current_setting('payidem.bill_timezone'))::date;
	m bs_merchant;
	o bs_order;
	p bs_payment;
	f bs_refund;
	po bs_payout;
	aj bs_adjust;
	v_status text;
	v_txn text;
	v_amount bigint;
	v_out text;
	v_key text;
	v_day date;
	v_channel text;
	v_csv text;
	v_id bigint;
	v_code text := '00000';
	n record;
BEGIN
	SELECT * INTO m FROM bs_merchant WHERE active ORDER BY random() LIMIT 1;
	SELECT * INTO o FROM bs_order WHERE phase = v_phase ORDER BY random() LIMIT 1;
	IF random() < 0.7 THEN
		SELECT * INTO p FROM bs_payment WHERE phase = v_phase ORDER BY random() LIMIT 1;
	END IF;
	IF p.payment_no IS NULL THEN
		SELECT * INTO p FROM bs_payment ORDER BY random() LIMIT 1;
	END IF;
	SELECT * INTO f FROM bs_refund ORDER BY random() LIMIT 1;
	v_action := CASE
		WHEN v_r < 0.048 THEN 'create_order'
		WHEN v_r < 0.112 THEN 'begin_payment'
		WHEN v_r < 0.336 THEN 'apply_payment_result'
		WHEN v_r < 0.368 THEN 'close_payment'
		WHEN v_r < 0.416 THEN 'close_order'
		WHEN v_r < 0.480 THEN 'refund'
		WHEN v_r < 0.544 THEN 'apply_refund_result'
		WHEN v_r < 0.608 THEN 'transit'
		WHEN v_r < 0.720 THEN 'idem'
		WHEN v_r < 0.768 THEN 'notify'
		WHEN v_r < 0.800 THEN 'sign'
		WHEN v_r < 0.830 THEN 'bill'
		WHEN v_r < 0.870 THEN 'settle'
		WHEN v_r < 0.920 THEN 'payout'
		WHEN v_r < 0.960 THEN 'payout_result'
		WHEN v_r < 0.980 THEN 'adjust'
		ELSE 'resolve' END;
	IF p.payment_no IS NULL AND v_action IN ('apply_payment_result', 'close_payment', 'refund', 'idem') THEN
		v_action := 'begin_payment';
	END IF;
	IF f.refund_no IS NULL AND v_action = 'apply_refund_result' THEN
		v_action := 'refund';
	END IF;
	SELECT * INTO po FROM bs_payout ORDER BY random() LIMIT 1;
	IF po.payout_no IS NULL AND v_action = 'payout_result' THEN
		v_action := 'payout';
	END IF;
	BEGIN
		IF v_action = 'create_order' THEN
			-- a new order, or a repeat (same or other amount) of one of the day's first
			v_amount := 100 * (1 + floor(random() * 30))::bigint;
			v_out := payidem.create_order(m.merchant_no,
										  CASE WHEN random() < 0.6 THEN 'BS-N' || nextval('bs_seq')
											   ELSE 'BS-' || v_phase || '-' || (v_amount / 100) END,
										  v_amount, 'storm ' || (v_amount / 100), 'https://shop.example/n');
			INSERT INTO bs_order VALUES (v_out, v_amount, v_phase) ON CONFLICT DO NOTHING;
		ELSIF v_action = 'begin_payment' THEN
			v_out := payidem.begin_payment(o.order_no, CASE WHEN random() < 0.5 THEN 'BS_WX' ELSE 'BS_ALI' END);
			INSERT INTO bs_payment VALUES (v_out, o.order_no, o.amount, v_phase) ON CONFLICT DO NOTHING;
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
		ELSIF v_action = 'sign' THEN
			v_out := payidem.sign(m.merchant_no, 'amount=' || o.amount);
		ELSIF v_action = 'bill' THEN
			-- a channel's bill of one of the three days before today (in the
			-- bill's zone): the day's paid payments, now and then with its
			-- first line's fee off by one, its first line missing, or a line
			-- of a transaction nobody knows; loaded and reconciled
			v_day := v_today - (1 + floor(random() * 3))::int;
			v_channel := CASE WHEN random() < 0.5 THEN 'BS_WX' ELSE 'BS_ALI' END;
			v_r := random();
			SELECT string_agg(l.line, E'\\n' ORDER BY l.payment_no) INTO v_csv
			  FROM (SELECT x.payment_no,
						   concat_ws(',', '', '', x.transaction_id, x.payment_no, x.amount,
									 x.cost_amount + CASE WHEN v_r < 0.1 AND x.rn = 1 THEN 1 ELSE 0 END,
									 CASE WHEN x.status = 'succeeded' THEN 'succeeded' ELSE 'refunded' END,
									 to_char(x.paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || 'Z') AS line
					  FROM (SELECT y.*, row_number() OVER (ORDER BY y.payment_no) AS rn
							  FROM payidem.payment y
							 WHERE y.channel_no = v_channel AND y.status IN ('succeeded', 'partially_refunded', 'refunded')
							   AND y.paid_at >= timezone(v_tz, v_day::timestamp)
							   AND y.paid_at < timezone(v_tz, (v_day + 1)::timestamp)) x
					 WHERE NOT (v_r >= 0.1 AND v_r < 0.2 AND x.rn = 1)) l;
			IF v_r >= 0.2 AND v_r < 0.3 THEN
				v_csv := concat_ws(E'\\n', v_csv, ',,TXUNKNOWN' || nextval('bs_seq') || ',,500,1,succeeded,');
			END IF;
			PERFORM payidem.load_bill(v_channel, v_day, coalesce(v_csv, ''));
			SELECT r.recon_batch_no INTO v_out FROM payidem.reconcile(v_channel, v_day, allow_empty => true) r;
		ELSIF v_action = 'settle' THEN
			-- a day from two days before today to two after (a finance team
			-- settling ahead of a holiday, a missed run caught up)
			v_day := v_today + (floor(random() * 5) - 2)::int;
			INSERT INTO bs_settle SELECT v_day, s.* FROM payidem.settle(v_day) s;
		ELSIF v_action = 'payout' THEN
			v_r := random();
			IF v_r < 0.15 AND po.payout_no IS NOT NULL THEN
				-- a repeat: the same amount is the same payout, another PI001
				v_out := payidem.request_payout(po.merchant_no, po.amount + CASE WHEN random() < 0.7 THEN 0 ELSE 1 END,
												po.out_payout_no);
				IF v_out IS DISTINCT FROM po.payout_no THEN
					RAISE EXCEPTION 'a repeated payout request returned % instead of %', v_out, po.payout_no
						USING ERRCODE = 'BS001';
				END IF;
			ELSE
				-- of any merchant (the frozen one: PI004): half of the time
				-- more than its available balance (PI010), else some of it
				SELECT * INTO m FROM bs_merchant ORDER BY random() LIMIT 1;
				SELECT b.available INTO v_amount FROM payidem.balance(m.merchant_no) b;
				v_amount := CASE WHEN v_r < 0.55 THEN greatest(v_amount, 0) + 1 + floor(random() * 500)::bigint
								 ELSE greatest(1, floor(random() * v_amount * 0.6)::bigint) END;
				v_key := 'BSP-' || nextval('bs_seq');
				v_out := payidem.request_payout(m.merchant_no, v_amount, v_key);
				INSERT INTO bs_payout VALUES (v_out, m.merchant_no, v_key, v_amount);
			END IF;
		ELSIF v_action = 'payout_result' THEN
			-- the bank's answer, now and then again, or contradicted
			v_status := CASE WHEN random() < 0.6 THEN 'succeeded' ELSE 'failed' END;
			v_out := payidem.apply_payout_result(po.payout_no, v_status,
												 CASE WHEN random() < 0.9 THEN 'BANK-' || po.payout_no
													  ELSE 'BANK-X' || nextval('bs_seq') END);
			INSERT INTO bs_payout_result VALUES (po.payout_no, v_status, v_out);
		ELSIF v_action = 'adjust' THEN
			-- credits and debits of any merchant (a frozen one's too), now
			-- and then an earlier adjustment again (another amount: PI001)
			SELECT * INTO aj FROM bs_adjust ORDER BY random() LIMIT 1;
			IF random() < 0.1 AND aj.adjust_no IS NOT NULL THEN
				v_out := payidem.adjust_balance(aj.merchant_no, aj.amount + CASE WHEN random() < 0.5 THEN 0 ELSE 1 END,
												aj.out_adjust_no, 'storm adjustment again');
				IF v_out IS DISTINCT FROM aj.adjust_no THEN
					RAISE EXCEPTION 'a repeated adjustment returned % instead of %', v_out, aj.adjust_no
						USING ERRCODE = 'BS001';
				END IF;
			ELSE
				SELECT * INTO m FROM bs_merchant ORDER BY random() LIMIT 1;
				v_amount := floor(random() * 4000)::bigint - 1500;
				v_amount := CASE WHEN v_amount = 0 THEN 1 ELSE v_amount END;
				v_key := 'BSA-' || nextval('bs_seq');
				v_out := payidem.adjust_balance(m.merchant_no, v_amount, v_key, 'storm adjustment ' || v_key);
				INSERT INTO bs_adjust VALUES (v_out, m.merchant_no, v_key, v_amount);
			END IF;
		ELSE
			-- a person looks at an open anomaly or reconciliation difference
			IF random() < 0.5 THEN
				SELECT a.anomaly_id INTO v_id FROM payidem.anomaly a
				 WHERE a.handle_status = 'open' ORDER BY random() LIMIT 1;
				IF v_id IS NOT NULL THEN
					PERFORM payidem.resolve_anomaly(v_id, 'handled', 'storm: looked at');
				END IF;
			ELSE
				SELECT rc.recon_id INTO v_id FROM payidem.reconciliation rc
				 WHERE rc.handle_status = 'open' ORDER BY random() LIMIT 1;
				IF v_id IS NOT NULL THEN
					PERFORM payidem.resolve_diff(v_id, CASE WHEN random() < 0.5 THEN 'handled' ELSE 'ignored' END,
												 'storm: looked at');
				END IF;
			END IF;
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

my $q = sub { $node->safe_psql('postgres', shift) };

# ---------------------------------------------------------------- the storm, day by day
my $phase = 0;
for my $day (@days)
{
	if ($phase > 0)
	{
		$node->stop;
		start_on_day($day);
	}
	# the day's first orders
	$q->(qq{UPDATE bs_phase SET phase = $phase;
		INSERT INTO bs_order
		SELECT payidem.create_order(m.merchant_no, 'BS-$phase-' || i, 100 * i, 'storm ' || i, 'https://shop.example/n'),
		       100 * i, $phase
		  FROM bs_merchant m, generate_series(1, 12) i WHERE m.active});
	my $today = $q->(q{SELECT (now() AT TIME ZONE current_setting('payidem.bill_timezone'))::date});
	$node->pgbench(
		"--no-vacuum --client=$clients --jobs=2 --transactions=$steps --username=storm_app",
		0,
		[ qr{number of transactions actually processed: @{[ $clients * $steps ]}/}, qr{number of failed transactions: 0 \(0\.000%\)} ],
		[qr{^$}],
		"day $today (clock $day days): every grant_app() and grant_finance() function, at random, by 16 clients",
		{ "041_books_storm_day$phase" => q{SELECT bs_step();} });
	$phase++;
}

my $calls = $q->(q{SELECT string_agg(action || ' ' || sqlstate || ' ' || n, ', ' ORDER BY action, sqlstate)
	FROM (SELECT action, sqlstate, count(*) n FROM bs_call GROUP BY 1, 2) x});
note("calls: $calls");
is($q->(q{SELECT count(*) FROM bs_call}), $clients * $steps * @days, 'every call was counted');
is($q->(q{SELECT coalesce(string_agg(DISTINCT sqlstate, ','), 'none') FROM bs_call
	WHERE sqlstate IN ('40P01', '23505', 'XX000', '55P03', '40001')}), 'none',
	'no deadlock, unique violation, internal error, lock timeout or serialization failure');
is($q->(q{SELECT coalesce(string_agg(DISTINCT action || ' ' || sqlstate, ', '), 'none') FROM bs_call
	WHERE sqlstate <> '00000' AND sqlstate NOT IN ('PI001', 'PI002', 'PI003', 'PI004', 'PI006', 'PI008', 'PI009', 'PI010', '22023')}), 'none',
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
		UNION ALL SELECT 'refund', refund_no, status FROM payidem.refund
		UNION ALL SELECT 'payout', payout_no, status FROM payidem.payout) cur
	LEFT JOIN (SELECT DISTINCT ON (entity, entity_no) entity, entity_no, to_status
	             FROM payidem.status_log ORDER BY entity, entity_no, log_id DESC) l
	       ON l.entity = cur.entity AND l.entity_no = cur.no
	WHERE cur.status IS DISTINCT FROM l.to_status}), '0',
	'the latest status_log row of every row (payouts too) is its status');

# ---------------------------------------------------------------- DESIGN §11: what the storm did to the books
my %did = map { split /\|/ } split /\n/, $q->(q{
	SELECT 'bills', count(*) FROM bs_call WHERE action = 'bill' AND sqlstate = '00000'
	UNION ALL SELECT 'settled', coalesce(sum(items), 0) FROM bs_settle
	UNION ALL SELECT 'held', coalesce(sum(held), 0) FROM bs_settle
	UNION ALL SELECT 'payouts', count(*) FROM bs_payout
	UNION ALL SELECT 'PI010', count(*) FROM bs_call WHERE action = 'payout' AND sqlstate = 'PI010'
	UNION ALL SELECT 'PI004', count(*) FROM bs_call WHERE action = 'payout' AND sqlstate = 'PI004'
	UNION ALL SELECT 'succeeded', count(*) FROM bs_payout_result WHERE outcome = 'applied' AND status = 'succeeded'
	UNION ALL SELECT 'failed', count(*) FROM bs_payout_result WHERE outcome = 'applied' AND status = 'failed'
	UNION ALL SELECT 'rejected', count(*) FROM bs_payout_result WHERE outcome = 'rejected'
	UNION ALL SELECT 'adjustments', count(*) FROM bs_adjust
	UNION ALL SELECT 'resolved', count(*) FROM bs_call WHERE action = 'resolve' AND sqlstate = '00000'});
note('books: ' . join(', ', map { "$_ $did{$_}" } sort keys %did));
SKIP:
{
	skip 'the storm ran on one day: no past day to reconcile and settle', 2 if @days == 1;
	cmp_ok($did{settled}, '>', 0, "settle() settled items during the storm ($did{settled}, after $did{bills} bills)");
	cmp_ok($did{held}, '>', 0, "... and held some ($did{held} times an item was due but held)");
}
cmp_ok($did{PI010}, '>', 0, "payouts above the available balance were refused with PI010 ($did{PI010})");
cmp_ok($did{PI004}, '>', 0, "payouts of the frozen merchant were refused with PI004 ($did{PI004})");
ok($did{payouts} > 0 && $did{succeeded} > 0 && $did{failed} > 0,
	"payouts were requested ($did{payouts}), and succeeded ($did{succeeded}) and failed ($did{failed})");
cmp_ok($did{adjustments}, '>', 0, "balances were adjusted ($did{adjustments})");

# the books' checks, after the storm and again after the last pass
sub books_hold
{
	my ($when) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	is($q->(verify_sql()), '', "$when: payidem.verify() finds nothing wrong");
	is($q->(q{SELECT coalesce(string_agg(currency || ' ' || s, ', '), 'none')
		FROM (SELECT currency, sum(amount) s FROM payidem.ledger_entry GROUP BY 1) x WHERE s <> 0}), 'none',
		"$when: the whole journal sums to 0 in each currency");
	is($q->(q{SELECT (SELECT coalesce(sum(available), 0) || ' ' || coalesce(sum(in_payout), 0) FROM payidem.merchant_balance)
		= (SELECT coalesce(-sum(amount) FILTER (WHERE account = 'merchant_available'), 0) || ' '
		       || coalesce(-sum(amount) FILTER (WHERE account = 'merchant_payout'), 0) FROM payidem.ledger_entry)}), 't',
		"$when: the merchants' balances add up to their accounts in the journal");
	is($q->(q{SELECT count(*) FROM payidem.merchant_balance WHERE in_payout < 0}), '0', "$when: no in_payout is negative");
	is($q->(q{SELECT count(*) - count(DISTINCT item_no) FROM payidem.settlement_item}), '0',
		"$when: no item settled twice");
	is($q->(q{SELECT count(*) FROM (SELECT e.journal_no FROM payidem.ledger_entry e
		WHERE e.account = 'merchant_available' AND e.journal_no ~ '^(PY|RF)' GROUP BY 1 HAVING count(*) > 1) x}), '0',
		"$when: no item's journal credits its merchant twice");
	is($q->(q{SELECT count(*) FROM (SELECT DISTINCT journal_no FROM payidem.ledger_entry WHERE journal_no ~ '^(PY|RF)') j
		WHERE NOT EXISTS (SELECT 1 FROM payidem.settlement_item s WHERE s.item_no = j.journal_no)}), '0',
		"$when: every settlement journal is a settled item's");
	is($q->(q{SELECT (SELECT coalesce(sum(items), 0) FROM bs_settle) = (SELECT count(*) FROM payidem.settlement_item)
	          AND (SELECT coalesce(sum(net), 0) FROM bs_settle)
	              = (SELECT coalesce(sum(CASE item_type WHEN 'payment' THEN amount - fee ELSE fee - amount END), 0)
	                   FROM payidem.settlement_item)}), 't',
		"$when: each settled item was reported by the one settle() that settled it, with its net");
	is($q->(q{SELECT count(*) FROM payidem.payout p
		WHERE (SELECT count(*) FROM bs_payout_result r WHERE r.payout_no = p.payout_no AND r.outcome = 'applied') > 1
		   OR p.status <> coalesce((SELECT r.status FROM bs_payout_result r
		                             WHERE r.payout_no = p.payout_no AND r.outcome = 'applied'), 'pending')}), '0',
		"$when: each payout has the one result applied to it");
	# what a merchant was given is what was settled for it and adjusted
	is($q->(q{SELECT count(*) FROM bs_merchant m
		 LEFT JOIN payidem.merchant_balance b ON b.merchant_no = m.merchant_no
		WHERE coalesce(b.available, 0) + coalesce(b.in_payout, 0)
		      + (SELECT coalesce(sum(amount), 0) FROM payidem.payout WHERE merchant_no = m.merchant_no AND status = 'succeeded')
		   <> (SELECT coalesce(sum(CASE item_type WHEN 'payment' THEN amount - fee ELSE fee - amount END), 0)
		         FROM payidem.settlement_item WHERE merchant_no = m.merchant_no)
		      + (SELECT coalesce(sum(amount), 0) FROM payidem.adjustment WHERE merchant_no = m.merchant_no)
		   OR coalesce(b.in_payout, 0)
		      <> (SELECT coalesce(sum(amount), 0) FROM payidem.payout WHERE merchant_no = m.merchant_no AND status = 'pending')}),
		'0', "$when: each merchant's available + in payout + paid out = settled + adjusted; in payout = its pending payouts");
	return;
}
books_hold('after the storm');

# ---------------------------------------------------------------- the last pass
# every day's bill as the channel has it, reconciled; the anomalies resolved;
# settle(): every paid payment and succeeded refund is settled, once
my $bills_sql = q{
DO $bills$
DECLARE
	d record;
	v_tz text := current_setting('payidem.bill_timezone');
BEGIN
	FOR d IN SELECT p.channel_no, (p.paid_at AT TIME ZONE v_tz)::date AS day
	           FROM payidem.payment p
	          WHERE p.status IN ('succeeded', 'partially_refunded', 'refunded')
	          GROUP BY 1, 2 ORDER BY 2, 1 LOOP
		PERFORM payidem.load_bill(d.channel_no, d.day, (
			SELECT string_agg(concat_ws(',', '', '', p.transaction_id, p.payment_no, p.amount, p.cost_amount,
			                            CASE WHEN p.status = 'succeeded' THEN 'succeeded' ELSE 'refunded' END, ''),
			                  E'\n')
			  FROM payidem.payment p
			 WHERE p.channel_no = d.channel_no AND p.status IN ('succeeded', 'partially_refunded', 'refunded')
			   AND (p.paid_at AT TIME ZONE v_tz)::date = d.day));
		PERFORM payidem.reconcile(d.channel_no, d.day);
	END LOOP;
END
$bills$;
};
$q->($bills_sql . q{
SELECT count(*) FROM (SELECT payidem.resolve_anomaly(a.anomaly_id, 'handled', 'the last pass')
                        FROM payidem.anomaly a WHERE a.handle_status = 'open') x;
INSERT INTO bs_settle SELECT current_date + 10, s.* FROM payidem.settle(current_date + 10) s;
});
is($q->(q{SELECT count(*) FROM payidem.reconciliation WHERE handle_status = 'open' AND payment_no IS NOT NULL}), '0',
	'last pass: no open difference names a payment');
is($q->(q{SELECT (SELECT count(*) FROM payidem.payment WHERE status IN ('succeeded', 'partially_refunded', 'refunded'))
	    || ' ' || (SELECT count(*) FROM payidem.refund WHERE status = 'succeeded')}),
	$q->(q{SELECT count(*) FILTER (WHERE item_type = 'payment') || ' ' || count(*) FILTER (WHERE item_type = 'refund')
	         FROM payidem.settlement_item}),
	'last pass: every paid payment and every succeeded refund is settled');
is($q->(q{SELECT count(*) FROM payidem.settlement_hold}), '0', 'last pass: nothing is held');
is($q->(q{SELECT count(*) FROM payidem.merchant_balances WHERE pending <> 0}), '0', 'last pass: nothing is pending');
books_hold('after the last pass');

# ---------------------------------------------------------------- a payment refunded in quarters
# 900 at the D1 merchant's fee of 0.45 % (4) and the channel's cost of 0.2 %
# (2), refunded in four quarters of 225, two settled by one run and two by
# the next: each refund returns what the payment's refunded amount so far
# returns, round(fee * refunded / 900), less what the refunds before it
# returned -- together exactly the fee and the cost (each quarter rounded on
# its own would return round(0.5) = 1 of the cost, 3 for the first three)
my $quarters = $q->(q{
	SELECT payidem.begin_payment(payidem.create_order(merchant_no, 'BS-QUARTERS', 900, 'quarters'), 'BS_WX')
	  FROM bs_merchant WHERE merchant_no = (SELECT m.merchant_no FROM payidem.merchant m WHERE m.merchant_name = 'Books Storm Two')});
my $refund_quarters = sub {
	my @n = @_;
	$q->(join('', map { qq{SELECT payidem.apply_refund_result(payidem.refund('$quarters', 225, 'BS-QUARTER-$_'), 'succeeded');} } @n));
};
$q->(qq{SELECT payidem.apply_payment_result('$quarters', 'callback', 'succeeded', 'TX-QUARTERS', 900)});
$refund_quarters->(1, 2);
$q->($bills_sql . q{INSERT INTO bs_settle SELECT current_date + 10, s.* FROM payidem.settle(current_date + 10) s;});
$refund_quarters->(3, 4);
$q->(q{INSERT INTO bs_settle SELECT current_date + 10, s.* FROM payidem.settle(current_date + 10) s;});
my $shares_sql = qq{
	SELECT p.fee_amount || '/' || p.cost_amount || ': '
	       || string_agg(si.fee || '/' || si.cost, ' ' ORDER BY r.refunded_at, r.refund_no)
	  FROM payidem.payment p JOIN payidem.refund r USING (payment_no) JOIN payidem.settlement_item si ON si.item_no = r.refund_no
	 WHERE p.payment_no = '$quarters' GROUP BY p.fee_amount, p.cost_amount};
is($q->($shares_sql), '4/2: 1/1 1/0 1/1 1/0',
	'a payment refunded in four quarters, settled in two runs: the refunds return 1, 1, 1, 1 of its fee of 4 and 1, 0, 1, 0 of its cost of 2');
books_hold('after the quarters');

my %books = map { split /\|/ } split /\n/, $q->(q{
	SELECT 'items', count(*) FROM payidem.settlement_item
	UNION ALL SELECT 'entries', count(*) FROM payidem.ledger_entry
	UNION ALL SELECT 'bills', count(*) FROM payidem.recon_batch});
diag(sprintf('041 figures: seed %d; %d calls by %d clients on %d days; %s orders, %s payments, %s refunds, %s anomalies; '
		. '%s reconciliations, %s items settled (%s by the storm), %s payouts (%s PI010), %s adjustments, %s journal entries; %.1f s',
		$seed, $clients * $steps * @days, $clients, scalar(@days),
		$q->(q{SELECT count(*) FROM payidem."order"}), $q->(q{SELECT count(*) FROM payidem.payment}),
		$q->(q{SELECT count(*) FROM payidem.refund}), $q->(q{SELECT count(*) FROM payidem.anomaly}),
		$books{bills}, $books{items}, $did{settled}, $did{payouts}, $did{PI010}, $did{adjustments}, $books{entries},
		Time::HiRes::time() - $t0));

$node->stop;
done_testing();
