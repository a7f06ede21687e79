'use strict';
// test/client/app_api.test.js — what an application reads and follows up
// without table privileges (DESIGN §7), through a real driver (node-postgres),
// connected as a grant_app() role: a merchant's orders paged with
// list_orders() (keyset, newest first), apply_payment_result_ex() naming the
// anomaly of a refused report, that anomaly in get_order() and in the work
// queue list_anomalies(), resolved by the application, health(), and the
// SQLSTATE, DETAIL and HINT of a bad page size.  TAP on stdout; exit 1 on
// failure.
//
// Run by scripts/test (TESTS=app_api); by hand: test/client/run.sh app_api.

const { useModules, tap } = require('./tap.js');

useModules(__filename);

const crypto = require('crypto');
const { Client } = require('pg');
const DB = 'payidem_client_app_api';
const APP_ROLE = 'payidem_app_api_app';
const PASSWORD = crypto.randomBytes(12).toString('hex');

const { ok, is, errorOf, done, crashed } = tap();

async function main() {
	const admin = new Client({ database: 'postgres' });
	await admin.connect();
	await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
	await admin.query(`DROP ROLE IF EXISTS ${APP_ROLE}`);
	await admin.query(`CREATE ROLE ${APP_ROLE} LOGIN PASSWORD '${PASSWORD}'`);
	await admin.query(`CREATE DATABASE ${DB}`);
	await admin.end();

	const su = new Client({ database: DB });
	await su.connect();
	let app;
	try {
		await su.query('CREATE EXTENSION payidem');
		await su.query('SELECT payidem.grant_app($1)', [APP_ROLE]);
		await su.query("SELECT payidem.create_channel('AA_WX', 'wechat', 0.002)");
		const { rows: [m] } = await su.query("SELECT * FROM payidem.create_merchant('App Tea', 'retail', 0.006)");
		await su.query("SELECT payidem.bind_channel($1, 'AA_WX')", [m.merchant_no]);

		app = new Client({ database: DB, user: APP_ROLE, password: PASSWORD });
		await app.connect();
		const e0 = await errorOf(app.query('SELECT count(*) FROM payidem."order"'));
		is(e0 && e0.code, '42501', 'the application role reads no table');

		// ---------------------------------------------------------- orders, paged
		const made = [];
		for (let i = 1; i <= 25; i++) {
			const { rows: [{ o }] } = await app.query(
				'SELECT payidem.create_order($1, $2, $3, $4) AS o', [m.merchant_no, `AA-${i}`, 100 * i, `item ${i}`]);
			made.push(o);
		}
		const seen = [];
		let after = null;
		let pages = 0;
		for (;;) {
			const { rows } = await app.query('SELECT x FROM payidem.list_orders($1, $2, 10) x', [m.merchant_no, after]);
			if (rows.length === 0) break;
			pages++;
			for (const { x } of rows) seen.push(x);
			after = rows[rows.length - 1].x.order_no;
		}
		is(pages, 3, 'list_orders(): 25 orders in pages of 10, 10 and 5');
		is(seen.map((x) => x.order_no).join(','), made.slice().reverse().join(','),
			'... every order once, newest first (each page after the last order_no of the one before)');
		const first = seen[seen.length - 1];
		ok(typeof first === 'object' && first.out_trade_no === 'AA-1' && first.amount === 100 && first.status === 'pending',
			'... each row a JSON object the driver parses (amount a number, status, out_trade_no)', first);
		ok(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/.test(first.created_at), '... times as UTC ISO 8601 text', first.created_at);
		const { rows: pending } = await app.query(
			"SELECT x FROM payidem.list_orders($1, status => 'paid') x", [m.merchant_no]);
		is(pending.length, 0, 'list_orders(status => paid): none yet');

		// ---------------------------------------------------------- a refusal names its anomaly
		const o1 = made[0];
		const { rows: [{ p }] } = await app.query("SELECT payidem.begin_payment($1, 'AA_WX') AS p", [o1]);
		const { rows: [r1] } = await app.query(
			"SELECT * FROM payidem.apply_payment_result_ex($1, 'callback', 'succeeded', 'AA-TXN-1', 99)", [p]);
		ok(r1.outcome === 'rejected' && /^\d+$/.test(r1.anomaly_id),
			'apply_payment_result_ex(): another amount is rejected and names its anomaly (a bigint: a string)', r1);
		const { rows: [r2] } = await app.query(
			"SELECT * FROM payidem.apply_payment_result_ex($1, 'query', 'succeeded', 'AA-TXN-1', 99)", [p]);
		is(`${r2.outcome}|${r2.anomaly_id}`, `rejected|${r1.anomaly_id}`, '... its repeat names the same anomaly');
		const { rows: [r3] } = await app.query(
			"SELECT * FROM payidem.apply_payment_result_ex($1, 'callback', 'succeeded', 'AA-TXN-1', 100)", [p]);
		is(`${r3.outcome}|${r3.anomaly_id}`, 'applied|null', '... the right amount is applied, naming none');
		const { rows: [{ g }] } = await app.query('SELECT payidem.get_order($1) AS g', [o1]);
		is(g.anomalies.map((a) => `${a.anomaly_id} ${a.kind} ${a.handle_status}`).join(','),
			`${r1.anomaly_id} amount_mismatch open`, 'get_order(): the order\'s anomaly, open');
		const { rows: q1 } = await app.query('SELECT x FROM payidem.list_anomalies($1) x', [m.merchant_no]);
		is(q1.map(({ x }) => `${x.anomaly_id} ${x.kind}`).join(','), `${r1.anomaly_id} amount_mismatch`,
			'list_anomalies(): the work queue has it');
		await app.query("SELECT payidem.resolve_anomaly($1, 'ignored', 'the channel resent the right amount')", [r1.anomaly_id]);
		const { rows: q2 } = await app.query('SELECT x FROM payidem.list_anomalies($1) x', [m.merchant_no]);
		is(q2.length, 0, 'resolved by the application: out of the open queue');
		const { rows: q3 } = await app.query(
			"SELECT x FROM payidem.list_anomalies($1, handle_status => 'ignored') x", [m.merchant_no]);
		ok(q3.length === 1 && q3[0].x.handled_by === APP_ROLE && q3[0].x.note === 'the channel resent the right amount',
			'... listed as ignored, by the application role, with its note', q3);
		const { rows: paid } = await app.query("SELECT x FROM payidem.list_orders($1, status => 'paid') x", [m.merchant_no]);
		is(paid.map(({ x }) => x.order_no).join(','), o1, 'list_orders(status => paid): the paid order');

		// ---------------------------------------------------------- health, errors
		const { rows: [{ h }] } = await app.query('SELECT payidem.health() AS h');
		ok(h && ['ok', 'degraded'].includes(h.status) && Array.isArray(h.problems) && h.preloaded === true
			&& typeof h.library_version === 'string' && h.library_version === h.extension_version,
			'health(): a JSON object with status, problems, preloaded and the versions', h);
		is(h.status === 'ok', h.problems.length === 0, '... ok exactly when it names no problem');
		const e1 = await errorOf(app.query('SELECT payidem.list_orders($1, NULL, 0)', [m.merchant_no]));
		ok(e1 && e1.code === '22023' && e1.detail === 'max_rows was 0; a page has 1 to 1000 rows.' && /page on/.test(e1.hint),
			'a page of 0 rows: 22023 with DETAIL and HINT', e1 && { code: e1.code, detail: e1.detail, hint: e1.hint });
		const e2 = await errorOf(app.query('SELECT payidem.list_orders($1)', ['MNOSUCHMERCHANT0']));
		is(e2 && e2.code, 'PI009', 'an unknown merchant: PI009');
	} finally {
		if (app) await app.end();
		await su.end();
		const cleanup = new Client({ database: 'postgres' });
		await cleanup.connect();
		await cleanup.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
		await cleanup.query(`DROP ROLE IF EXISTS ${APP_ROLE}`);
		await cleanup.end();
	}
	done();
}

main().catch(crashed);
