'use strict';
// test/client/settle.test.js — settlement (DESIGN §11) through a real driver
// (node-postgres), as an application and a finance team use it: a paid order,
// its day's bill loaded and reconciled, settle() by a finance role
// (grant_finance), balance() and a payout requested and confirmed by the
// application role (grant_app), the payout.succeeded notification delivered by
// examples/notify_worker.js to examples/notify_receiver.js on 127.0.0.1 and
// verified there, the SQLSTATEs an application catches (PI010, PI001, 22023,
// PI009) with their DETAIL and HINT, and verify() finding nothing.  TAP on
// stdout; exit 1 on failure.
//
// Run by scripts/test (TESTS=settle); by hand: test/client/run.sh settle.

const path = require('path');
const { ROOT, useModules, tap } = require('./tap.js');

useModules(__filename);

const crypto = require('crypto');
const { Client, Pool } = require('pg');
const { createWorker } = require(path.join(ROOT, 'examples', 'notify_worker.js'));
const { verify, createServer } = require(path.join(ROOT, 'examples', 'notify_receiver.js'));
const DB = 'payidem_client_settle';
const APP_ROLE = 'payidem_settle_app';
const FINANCE_ROLE = 'payidem_settle_finance';
const PASSWORD = crypto.randomBytes(12).toString('hex');

const { ok, is, errorOf, done, crashed } = tap();

async function main() {
	const admin = new Client({ database: 'postgres' });
	await admin.connect();
	await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
	for (const r of [APP_ROLE, FINANCE_ROLE]) {
		await admin.query(`DROP ROLE IF EXISTS ${r}`);
		await admin.query(`CREATE ROLE ${r} LOGIN PASSWORD '${PASSWORD}'`);
	}
	await admin.query(`CREATE DATABASE ${DB}`);
	await admin.end();

	const su = new Client({ database: DB });
	await su.connect();
	let app;
	let finance;
	let server;
	const pools = [];
	try {
		await su.query('CREATE EXTENSION payidem');
		await su.query('SELECT payidem.grant_app($1)', [APP_ROLE]);
		await su.query('SELECT payidem.grant_finance($1)', [FINANCE_ROLE]);
		await su.query("SELECT payidem.create_channel('ST_WX', 'wechat', 0.002)");
		// cycle D0: a payment is due the day it was paid
		const { rows: [m] } = await su.query("SELECT * FROM payidem.create_merchant('Settle Tea', 'retail', 0.006, 'D0')");
		await su.query("SELECT payidem.bind_channel($1, 'ST_WX')", [m.merchant_no]);

		// the merchant's receiver, for the payout's notification
		const received = [];
		const refused = [];
		server = createServer(m.api_secret, async (n) => { received.push(n); }, { onRefused: (x) => refused.push(x) });
		await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
		const url = `http://127.0.0.1:${server.address().port}/payidem/notify`;

		app = new Client({ database: DB, user: APP_ROLE, password: PASSWORD });
		await app.connect();
		finance = new Client({ database: DB, user: FINANCE_ROLE, password: PASSWORD });
		await finance.connect();
		await finance.query('SELECT payidem.set_merchant_notify_url($1, $2)', [m.merchant_no, url]);

		// ---------------------------------------------------------- a paid order
		const { rows: [{ o }] } = await app.query(
			"SELECT payidem.create_order($1, 'ST-1', 10000, 'green tea') AS o", [m.merchant_no]);
		const { rows: [{ p }] } = await app.query("SELECT payidem.begin_payment($1, 'ST_WX') AS p", [o]);
		const { rows: [{ r }] } = await app.query(
			"SELECT payidem.apply_payment_result($1, 'callback', 'succeeded', 'ST-TXN-1', 10000) AS r", [p]);
		is(r, 'applied', 'the payment is applied');
		const { rows: [bal0] } = await app.query('SELECT * FROM payidem.balance($1)', [m.merchant_no]);
		is(`${bal0.pending}|${bal0.available}|${bal0.in_payout}`, '9940|0|0',
			'balance(): 99.40 pending (100.00 less the 0.6 % fee), nothing available yet');

		// ---------------------------------------------------------- settle, held then released
		const { rows: [{ day }] } = await su.query(
			"SELECT to_char(paid_at AT TIME ZONE payidem._bill_timezone(), 'YYYY-MM-DD') AS day FROM payidem.payment WHERE payment_no = $1", [p]);
		let { rows: s1 } = await finance.query('SELECT * FROM payidem.settle($1::date)', [day]);
		is(s1.length === 1 && `${s1[0].items}|${s1[0].held}`, '0|1', 'settle(): the payment is due but held (its day not reconciled)');
		await su.query(`SELECT payidem.load_bill('ST_WX', $1::date, $2)`, [day, `ST_WX,${day},ST-TXN-1,${p},10000,20,succeeded,`]);
		const { rows: [rc] } = await app.query('SELECT * FROM payidem.reconcile($1, $2::date)', ['ST_WX', day]);
		is(`${rc.matched}|${rc.fee_mismatch}`, '1|0', 'reconcile(): matched, the channel charged the cost we expect');
		({ rows: s1 } = await finance.query('SELECT * FROM payidem.settle($1::date)', [day]));
		is(s1.length === 1 && `${s1[0].items}|${s1[0].gross}|${s1[0].fees}|${s1[0].net}|${s1[0].held}`, '1|10000|60|9940|0',
			'settle(): settled once reconciled (numeric sums arrive as strings)');
		({ rows: s1 } = await finance.query('SELECT * FROM payidem.settle($1::date)', [day]));
		is(s1.length, 0, 'settle() again: nothing more');

		const { rows: [bal1] } = await app.query('SELECT * FROM payidem.balance($1)', [m.merchant_no]);
		is(`${bal1.pending}|${bal1.available}|${bal1.in_payout}`, '0|9940|0', 'balance(): 99.40 available');
		is(typeof bal1.available, 'string', 'available is a bigint: node-postgres gives it as a string (exact)');

		// ---------------------------------------------------------- payouts
		const { rows: [{ pt }] } = await app.query("SELECT payidem.request_payout($1, 9000, 'OUT-1') AS pt", [m.merchant_no]);
		ok(/^PT\d{24}$/.test(pt), 'request_payout(): a payout number', pt);
		const { rows: [{ again }] } = await app.query("SELECT payidem.request_payout($1, 9000, 'OUT-1') AS again", [m.merchant_no]);
		is(again, pt, 'the same request again: the same payout (idempotent on out_payout_no)');
		let e = await errorOf(app.query("SELECT payidem.request_payout($1, 8000, 'OUT-1')", [m.merchant_no]));
		is(e && e.code, 'PI001', 'another amount under the same out_payout_no: PI001');
		e = await errorOf(app.query("SELECT payidem.request_payout($1, 1000, 'OUT-2')", [m.merchant_no]));
		is(e && e.code, 'PI010', 'more than is available: PI010');
		ok(e && /has 940 CNY available; the payout asked for 1000/.test(e.detail) && /balance\(\)/.test(e.hint),
			'... with the available balance in DETAIL and a HINT', e && { detail: e.detail, hint: e.hint });
		e = await errorOf(app.query("SELECT payidem.request_payout($1, 0, 'OUT-3')", [m.merchant_no]));
		is(e && e.code, '22023', 'a payout of 0: 22023');
		e = await errorOf(app.query("SELECT payidem.apply_payout_result('PT202601010000000000000123', 'succeeded')"));
		ok(e && (e.code === '22023' || e.code === 'PI009'), 'a payout number that names nothing: refused', e && e.code);

		const { rows: [{ res }] } = await app.query("SELECT payidem.apply_payout_result($1, 'succeeded', 'BANK-1') AS res", [pt]);
		is(res, 'applied', 'apply_payout_result(succeeded): applied');
		const { rows: [{ dup }] } = await app.query("SELECT payidem.apply_payout_result($1, 'succeeded', 'BANK-1') AS dup", [pt]);
		is(dup, 'duplicate', '... and a repeat is a duplicate');
		const { rows: [bal2] } = await app.query('SELECT * FROM payidem.balance($1)', [m.merchant_no]);
		is(`${bal2.available}|${bal2.in_payout}`, '940|0', 'balance(): 9.40 left, nothing in payout');

		// ---------------------------------------------------------- the notification
		const pool = new Pool({ database: DB, user: APP_ROLE, password: PASSWORD, max: 2 });
		// (the clean-up's DROP DATABASE ... WITH (FORCE) may terminate a
		// connection pool.end() is still closing: its error goes nowhere)
		pool.on('connect', (client) => client.on('error', () => {}));
		pool.on('error', () => {});
		pools.push(pool);
		const worker = createWorker(pool, { batch: 10, concurrency: 2, timeoutMs: 5000 });
		await worker.start({ untilIdle: true });
		const payoutEvents = worker.events.filter((x) => x.event === 'payout.succeeded');
		is(payoutEvents.length, 1, 'notify_due() handed out one payout.succeeded');
		is(payoutEvents[0] && payoutEvents[0].order_no, null, '... with no order (order_no NULL)');
		is(payoutEvents[0] && payoutEvents[0].notify_url, url, "... to the merchant's own notify URL");
		const got = received.find((n) => n.event === 'payout.succeeded');
		ok(got, 'the receiver took the payout.succeeded, its signature verified');
		if (got) {
			is(`${got.body.payout_no}|${got.body.out_payout_no}|${got.body.amount}|${got.body.currency}|${got.body.status}`,
				`${pt}|OUT-1|9000|CNY|succeeded`, 'its payload names the payout, the merchant\'s number, amount, currency and status');
			is(got.body.merchant_no, m.merchant_no, '... and the merchant');
			ok(verify(m.api_secret, got.rawBody, got.signature), 'verify() of the example accepts it');
			const tampered = Buffer.from(got.rawBody.toString('utf8').replace('"amount":9000', '"amount":9900'));
			ok(!verify(m.api_secret, tampered, got.signature), 'a tampered body is refused');
		}
		is(refused.length, 0, 'the receiver refused nothing the worker sent');

		// ---------------------------------------------------------- the books
		const { rows: bad } = await finance.query('SELECT * FROM payidem.verify()');
		is(bad.length, 0, 'verify(): the books are right', bad);
		const { rows: [{ n }] } = await finance.query(
			"SELECT count(*) AS n FROM payidem.ledger_entry WHERE source_no = $1", [pt]);
		is(n, '4', 'the payout: two journals of two entries (request, success)');
	} finally {
		for (const pool of pools) await pool.end();
		if (server) await new Promise((resolve) => server.close(resolve));
		if (app) await app.end();
		if (finance) await finance.end();
		await su.end();
		const cleanup = new Client({ database: 'postgres' });
		await cleanup.connect();
		await cleanup.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
		for (const r of [APP_ROLE, FINANCE_ROLE]) await cleanup.query(`DROP ROLE IF EXISTS ${r}`);
		await cleanup.end();
	}
	done();
}

main().catch(crashed);
