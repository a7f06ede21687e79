'use strict';
// test/client/notify.test.js — the merchant notifications (DESIGN §7) through a
// real driver: examples/notify_worker.js (node-postgres) delivering to two
// examples/notify_receiver.js servers on 127.0.0.1, one per merchant (two secrets).
//
// As the superuser (PG* variables: the runner's throwaway cluster) it makes a
// database, two merchants and an application role that has only what
// payidem.grant_app() gives; as that role it makes the events (a paid order, two
// partial refunds and a full refund, a closed order, orders whose receiver answers
// 500 the first time, more paid orders) and runs two workers at once.  Then:
// every event accepted exactly once, by its merchant's receiver, never handed to
// both workers; every body byte for byte notify_event.payload and verified by the
// receiver and by payidem.verify_notification(); each payload the state at its
// event; the retry schedule (pending, attempts 1, next attempt 15 s later, then
// sent); each header's v1 and v2 recomputed here; a secret rotation's two v1/v2
// pairs; the worker's CLI stopping on SIGTERM with every POST it made reported;
// and the receiver refusing a changed byte, a re-serialised body, a stale or
// future t, and a body "<t>.<payload>" signed with payidem.sign() presented as a
// notification (which a receiver checking v1 accepts).  TAP on stdout; exit 1 on failure.
//
// Run by scripts/test (TESTS=notify); by hand: test/client/run.sh notify.

const path = require('path');
const { spawn, spawnSync } = require('child_process');

const ROOT = path.resolve(__dirname, '..', '..');
const MODULES = path.join(__dirname, 'node_modules');

// The examples require('pg') as a developer's program does: give them this
// directory's node_modules (npm ci of package-lock.json), and the worker's CLI too.
if (!(process.env.NODE_PATH || '').split(path.delimiter).includes(MODULES)) {
	const env = { ...process.env, NODE_PATH: [MODULES, process.env.NODE_PATH].filter(Boolean).join(path.delimiter) };
	const r = spawnSync(process.execPath, [__filename, ...process.argv.slice(2)], { stdio: 'inherit', env });
	process.exit(r.status === null ? 1 : r.status);
}

const crypto = require('crypto');
const http = require('http');
const { Client, Pool } = require('pg');
const { createWorker } = require(path.join(ROOT, 'examples', 'notify_worker.js'));
const { verify, createServer } = require(path.join(ROOT, 'examples', 'notify_receiver.js'));

const DB = 'payidem_client';
const APP_ROLE = 'payidem_client_app';
const APP_PASSWORD = crypto.randomBytes(12).toString('hex');

// ------------------------------------------------------------------ TAP
let tests = 0;
let failures = 0;
function ok(cond, name, diag) {
	tests++;
	if (cond) {
		console.log(`ok ${tests} - ${name}`);
	} else {
		failures++;
		console.log(`not ok ${tests} - ${name}`);
		if (diag !== undefined) {
			const text = typeof diag === 'string' ? diag : JSON.stringify(diag, null, 1);
			for (const line of text.split('\n').slice(0, 40)) console.error(`#   ${line}`);
		}
	}
	return cond;
}
function is(got, want, name) {
	return ok(got === want, name, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}
function note(text) {
	console.log(`# ${text}`);
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ------------------------------------------------------------------ receivers
// One per merchant: createServer() of the example, recording what it took
// (verified and 2xx), what its handler turned down (500) and what it refused.
function startReceiver(name, secret) {
	const r = { name, secret, accepted: [], turnedDown: [], refused: [], seen: new Map() };
	r.server = createServer(secret, async (n) => {
		r.seen.set(n.eventId, (r.seen.get(n.eventId) || 0) + 1);
		const record = {
			eventId: n.eventId, event: n.event, body: n.body, rawBody: n.rawBody, signature: n.signature,
			headers: n.headers, at: Date.now(),
		};
		// the retry path: these orders' merchant fails the first time
		if (n.body.out_trade_no.startsWith('FLAKY-') && r.seen.get(n.eventId) === 1) {
			r.turnedDown.push(record);
			// FLAKY-2's answer has a NUL byte, which no PostgreSQL text can hold
			throw Object.assign(new Error(n.body.out_trade_no === 'FLAKY-2' ? 'database busy\u0000, try again'
				: 'database busy, try again'), { expose: true });
		}
		// a slow merchant, for the SIGTERM case: the POST is still under way
		if (n.body.out_trade_no.startsWith('SLOW-')) {
			r.onSlow && r.onSlow();
			await sleep(600);
		} else {
			await sleep(3);		// long enough for the two workers' batches to overlap
		}
		r.accepted.push(record);
	}, { onRefused: (x) => r.refused.push(x) });
	return new Promise((resolve, reject) => {
		r.server.on('error', reject);
		r.server.listen(0, '127.0.0.1', () => {
			r.url = `http://127.0.0.1:${r.server.address().port}/payidem/notify`;
			resolve(r);
		});
	});
}

// A raw POST, for what no worker would send.
function postRaw(url, body, headers) {
	return new Promise((resolve, reject) => {
		const buf = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
		const req = http.request(url, {
			method: 'POST',
			headers: { 'Content-Type': 'application/json', 'Content-Length': buf.length, ...headers },
		}, (res) => {
			res.resume();
			res.on('end', () => resolve(res.statusCode));
		});
		req.setTimeout(5000, () => req.destroy(new Error('timeout')));
		req.on('error', reject);
		req.end(buf);
	});
}

// a header's v1 (payidem 1.0's scheme, which sign() of "<t>.<body>" also is)
// and v2 (what a receiver checks), computed here independently of the example
const hmacHex = (secret, t, body) =>
	crypto.createHmac('sha256', secret).update(`${t}.`).update(body).digest('hex');
const v2Hex = (secret, t, body) =>
	crypto.createHmac('sha256', secret).update('payidem-notification-v2').update(Buffer.from([0]))
		.update(`${t}.`).update(body).digest('hex');

// ------------------------------------------------------------------ the test
async function main() {
	const admin = new Client({ database: 'postgres' });
	await admin.connect();
	// (FORCE: payidem's housekeeping worker may be connected to a database left over)
	await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
	await admin.query(`DROP ROLE IF EXISTS ${APP_ROLE}`);
	await admin.query(`CREATE ROLE ${APP_ROLE} LOGIN PASSWORD '${APP_PASSWORD}'`);
	await admin.query(`CREATE DATABASE ${DB}`);
	await admin.end();

	const su = new Client({ database: DB });
	await su.connect();
	const servers = [];
	const pools = [];
	let app;
	try {
		await su.query('CREATE EXTENSION payidem');
		await su.query('SELECT payidem.grant_app($1)', [APP_ROLE]);
		await su.query("SELECT payidem.create_channel('NJ_WX', 'wechat', 0.002)");
		const merchants = [];
		for (const name of ['Client Tea', 'Client Coffee']) {
			const { rows: [m] } = await su.query(
				"SELECT * FROM payidem.create_merchant($1, 'retail', 0.006)", [name]);
			await su.query("SELECT payidem.bind_channel($1, 'NJ_WX')", [m.merchant_no]);
			merchants.push(m);
		}
		is(new Set(merchants.map((m) => m.api_secret)).size, 2, 'two merchants, two secrets');

		const receivers = [];
		for (const [i, m] of merchants.entries()) {
			const r = await startReceiver(`receiver ${i + 1}`, m.api_secret);
			r.merchant = m;
			receivers.push(r);
			servers.push(r.server);
		}
		const receiverOf = (merchantNo) => receivers.find((r) => r.merchant.merchant_no === merchantNo);

		// ---------------------------------------------------------- the application
		const appConfig = { database: DB, user: APP_ROLE, password: APP_PASSWORD };
		app = new Client(appConfig);
		await app.connect();
		const denied = await app.query('SELECT count(*) FROM payidem.notify_event').then(() => null, (e) => e.code);
		is(denied, '42501', 'the application role reads no table (grant_app only)');

		// a channel id that JSON must escape (one per merchant: a transaction id is the channel's, once)
		const txnOf = (m) => `WX"42"\\00/${m.merchant_no}`;
		let seq = 0;
		async function paidOrder(m, outTradeNo, amount, transactionId = `TXN-${++seq}`) {
			const { rows: [{ o }] } = await app.query(
				'SELECT payidem.create_order($1, $2, $3, $4, $5) AS o',
				[m.merchant_no, outTradeNo, amount, `Order ${outTradeNo}`, receiverOf(m.merchant_no).url]);
			const { rows: [{ p }] } = await app.query("SELECT payidem.begin_payment($1, 'NJ_WX') AS p", [o]);
			const { rows: [{ r }] } = await app.query(
				"SELECT payidem.apply_payment_result($1, 'callback', 'succeeded', $2, $3) AS r", [p, transactionId, amount]);
			if (r !== 'applied') throw new Error(`apply_payment_result: ${r}`);
			return { o, p };
		}
		async function refund(p, amount, outRefundNo) {
			const { rows: [{ rf }] } = await app.query('SELECT payidem.refund($1, $2, $3) AS rf', [p, amount, outRefundNo]);
			await app.query("SELECT payidem.apply_refund_result($1, 'succeeded')", [rf]);
			return rf;
		}
		async function closedOrder(m, outTradeNo) {
			const { rows: [{ o }] } = await app.query(
				'SELECT payidem.create_order($1, $2, 500, $3, $4) AS o',
				[m.merchant_no, outTradeNo, `Order ${outTradeNo}`, receiverOf(m.merchant_no).url]);
			await app.query('SELECT payidem.close_order($1)', [o]);
			return o;
		}

		const story = new Map();	// merchant_no -> { a, b }
		for (const m of merchants) {
			const a = await paidOrder(m, 'A-1', 10000, txnOf(m));
			const refunds = [await refund(a.p, 3000, 'A-1-R1'), await refund(a.p, 2000, 'A-1-R2'),
				await refund(a.p, 5000, 'A-1-R3')];
			const b = await closedOrder(m, 'B-1');
			for (let i = 1; i <= 2; i++) await paidOrder(m, `FLAKY-${i}`, 800);
			for (let i = 1; i <= 12; i++) await paidOrder(m, `BULK-${String(i).padStart(2, '0')}`, 100 * i);
			story.set(m.merchant_no, { a: a.o, refunds, b });
		}
		const { rows: made } = await su.query(
			'SELECT event_id::text, event, order_no, merchant_no, payload FROM payidem.notify_event ORDER BY event_id');
		is(made.length, 2 * (4 + 1 + 2 + 12), 'one event per change: 19 per merchant');

		// ---------------------------------------------------------- two workers at once
		const workerOptions = { batch: 4, concurrency: 3, timeoutMs: 5000 };
		// pool.end() resolves once its clients are told to end, before their
		// connections are closed: the clean-up's DROP DATABASE ... WITH (FORCE)
		// can terminate one still closing, whose error no pool listens to any
		// more (an unhandled 'error' event ends the process).  Each client gets
		// a listener of its own for that moment, and so does the pool, which
		// passes on the error of a client it holds idle.
		const newPool = () => {
			const pool = new Pool({ ...appConfig, max: 4 });
			pool.on('connect', (client) => client.on('error', () => {}));
			pool.on('error', () => {});
			pools.push(pool);
			return pool;
		};
		const poolA = newPool();
		const poolB = newPool();
		async function twoWorkers() {
			const w = [createWorker(poolA, workerOptions), createWorker(poolB, workerOptions)];
			await Promise.all(w.map((x) => x.start({ untilIdle: true })));
			return w;
		}
		let started = Date.now();
		const round1 = await twoWorkers();
		note(`round 1: ${made.length} events in ${Date.now() - started} ms, ` +
			`worker A ${round1[0].handed.length}, worker B ${round1[1].handed.length}`);
		const inBoth = round1[0].handed.filter((id) => round1[1].handed.includes(id));
		is(inBoth.length, 0, 'two workers at once: no event handed to both');
		ok(round1[0].handed.length > 0 && round1[1].handed.length > 0, 'both workers delivered some',
			round1.map((x) => x.handed.length));
		is(new Set([...round1[0].handed, ...round1[1].handed]).size, made.length, 'every event handed out once');
		const e0 = round1[0].events[0];
		ok(typeof e0.event_id === 'string' && /^[0-9]+$/.test(e0.event_id) && typeof e0.attempt === 'number' &&
			typeof e0.payload === 'string' && typeof e0.signature === 'string',
			'node-postgres types: event_id (bigint) a string, attempt a number, payload and signature strings',
			{ event_id: typeof e0.event_id, attempt: typeof e0.attempt });

		// ---------------------------------------------------------- the retry path
		const flaky = made.filter((e) => JSON.parse(e.payload).out_trade_no.startsWith('FLAKY-'));
		const turnedDown = receivers.flatMap((r) => r.turnedDown.map((x) => x.eventId));
		is(JSON.stringify(turnedDown.sort()), JSON.stringify(flaky.map((e) => e.event_id).sort()),
			'each FLAKY order\'s first POST was answered 500');
		const { rows: pend } = await su.query(
			`SELECT event_id::text, status, attempts, next_attempt_at - last_attempt_at AS wait,
			        next_attempt_at > now() AS later, last_response
			   FROM payidem.notify_event WHERE status <> 'sent' ORDER BY event_id`);
		is(JSON.stringify(pend.map((e) => e.event_id)), JSON.stringify(flaky.map((e) => e.event_id).sort()),
			'after round 1 only the FLAKY events are not sent');
		ok(pend.every((e) => e.status === 'pending' && e.attempts === 1), 'they stay pending, attempts = 1', pend);
		ok(pend.every((e) => e.wait && e.wait.seconds === 15 && !e.wait.minutes && !e.wait.hours && e.later),
			'next attempt 15 s after the failed one', pend.map((e) => e.wait));
		ok(pend.every((e) => /^HTTP 500: not taken: database busy ?, try again$/.test(e.last_response)),
			'the merchant\'s answer is kept in last_response (a NUL byte in it too, as a space)',
			pend.map((e) => e.last_response));
		const early = await twoWorkers();
		is(early[0].handed.length + early[1].handed.length, 0, 'not due before its next attempt: nothing handed out');

		// force them due, as the clock would in 15 s
		await su.query("UPDATE payidem.notify_event SET next_attempt_at = now() WHERE status = 'pending'");
		const round2 = await twoWorkers();
		const retried = [...round2[0].events, ...round2[1].events];
		is(JSON.stringify(retried.map((e) => e.event_id).sort()), JSON.stringify(flaky.map((e) => e.event_id).sort()),
			'forced due: the FLAKY events are handed out again, once each');
		ok(retried.every((e) => e.attempt === 2), 'with attempt = 2', retried.map((e) => e.attempt));

		// ---------------------------------------------------------- a secret rotation
		// merchant 2 rotates with an hour's grace; its receiver still has the old
		// secret (it is told the new one later): the header carries a v1 and a v2
		// of each, the new secret's first
		const m2 = merchants[1];
		const { rows: [{ secret }] } = await su.query(
			"SELECT payidem.rotate_merchant_secret($1, '1 hour') AS secret", [m2.merchant_no]);
		const rotated = await closedOrder(m2, 'ROT-1');
		const round3 = await twoWorkers();
		const rotEvents = [...round3[0].events, ...round3[1].events];
		is(rotEvents.length, 1, 'after the rotation: the new event handed out');
		const rot = rotEvents[0] || { signature: '', payload: '' };
		const rotT = (/^t=([0-9]+)/.exec(rot.signature) || [])[1];
		is(rot.signature, `t=${rotT},v1=${hmacHex(secret, rotT, rot.payload)},v2=${v2Hex(secret, rotT, rot.payload)}` +
			`,v1=${hmacHex(m2.api_secret, rotT, rot.payload)},v2=${v2Hex(m2.api_secret, rotT, rot.payload)}`,
		'during the grace period: a v1/v2 pair per secret, the new one first');
		ok(verify(secret, rot.payload, rot.signature) && verify(m2.api_secret, rot.payload, rot.signature) &&
			!verify(merchants[0].api_secret, rot.payload, rot.signature),
			'either secret verifies it, another merchant\'s does not');
		ok(receiverOf(m2.merchant_no).accepted.some((x) => x.body.order_no === rotated),
			'the receiver with the old secret accepted it');

		// ---------------------------------------------------------- the CLI and SIGTERM
		// six slow deliveries, two at a time; SIGTERM while the first two are under way
		const m1 = merchants[0];
		const r1 = receiverOf(m1.merchant_no);
		const slow = [];
		for (let i = 1; i <= 6; i++) slow.push(await closedOrder(m1, `SLOW-${i}`));
		const acceptedBefore = r1.accepted.length;
		const cli = spawn(process.execPath, [path.join(ROOT, 'examples', 'notify_worker.js')], {
			env: {
				...process.env, PGDATABASE: DB, PGUSER: APP_ROLE, PGPASSWORD: APP_PASSWORD,
				PAYIDEM_NOTIFY_BATCH: '6', PAYIDEM_NOTIFY_CONCURRENCY: '2', PAYIDEM_NOTIFY_IDLE_MS: '100',
			},
			stdio: ['ignore', 'pipe', 'pipe'],
		});
		let cliOut = '';
		cli.stdout.on('data', (d) => { cliOut += d; });
		cli.stderr.on('data', (d) => { cliOut += d; });
		const exited = new Promise((resolve) => cli.on('exit', (code, signal) => resolve({ code, signal })));
		const firstSlow = new Promise((resolve) => { r1.onSlow = resolve; });
		const gotOne = await Promise.race([firstSlow.then(() => true), sleep(15000).then(() => false)]);
		ok(gotOne, 'the CLI worker (PG* environment, the application role) posts', cliOut);
		const termAt = Date.now();
		cli.kill('SIGTERM');
		const exit = await Promise.race([exited, sleep(15000).then(() => ({ code: 'still running' }))]);
		if (exit.code === 'still running') cli.kill('SIGKILL');
		r1.onSlow = null;
		is(exit.code, 0, 'SIGTERM: the CLI exits 0');
		ok(Date.now() - termAt < 5000 && /SIGTERM: finishing/.test(cliOut) && /stopped/.test(cliOut),
			'after finishing the POSTs under way (not waiting for the rest of its batch)', cliOut);
		const byCli = r1.accepted.slice(acceptedBefore).map((x) => x.body.order_no);
		const { rows: slowRows } = await su.query(
			'SELECT order_no, status, attempts FROM payidem.notify_event WHERE order_no = ANY($1) ORDER BY event_id', [slow]);
		ok(byCli.length >= 1 && byCli.length <= 2, 'it had at most its concurrency (2) under way', byCli);
		ok(slowRows.every((e) => byCli.includes(e.order_no) ? e.status === 'sent' && e.attempts === 1
			: e.status === 'pending' && e.attempts === 1),
		'each POST it made is reported sent; the ones it did not start are pending (their hand-out was attempt 1)', slowRows);
		// those are leased for 60 s: force them due rather than wait
		await su.query("UPDATE payidem.notify_event SET next_attempt_at = now() WHERE status = 'pending'");
		const round4 = await twoWorkers();
		is(round4[0].handed.length + round4[1].handed.length, 6 - byCli.length, 'the rest delivered by the next workers');

		// ---------------------------------------------------------- what the receivers got
		const { rows: events } = await su.query(
			`SELECT e.event_id::text, e.event, e.order_no, e.merchant_no, e.payload, e.status, e.attempts,
			        o.status AS order_status_now
			   FROM payidem.notify_event e JOIN payidem."order" o USING (order_no) ORDER BY e.event_id`);
		is(events.length, made.length + 1 + 6, 'every event of the run, in notify_event');
		ok(events.every((e) => e.status === 'sent'), 'all events end sent',
			events.filter((e) => e.status !== 'sent'));
		const accepted = receivers.flatMap((r) => r.accepted.map((x) => ({ ...x, receiver: r })));
		const counts = new Map();
		for (const x of accepted) counts.set(x.eventId, (counts.get(x.eventId) || 0) + 1);
		ok(events.every((e) => counts.get(e.event_id) === 1) && accepted.length === events.length,
			'every event accepted exactly once', events.filter((e) => counts.get(e.event_id) !== 1)
				.map((e) => [e.event_id, counts.get(e.event_id) || 0]));
		is(receivers.reduce((n, r) => n + r.refused.length, 0), 0, 'no delivery refused: every signature verified');
		const payloadOf = new Map(events.map((e) => [e.event_id, e]));
		ok(accepted.every((x) => x.rawBody.equals(Buffer.from(payloadOf.get(x.eventId).payload, 'utf8'))),
			'each body byte for byte notify_event.payload',
			accepted.filter((x) => !x.rawBody.equals(Buffer.from(payloadOf.get(x.eventId).payload, 'utf8')))
				.map((x) => x.rawBody.toString()).slice(0, 3));
		ok(accepted.every((x) => x.receiver.merchant.merchant_no === payloadOf.get(x.eventId).merchant_no &&
			x.body.merchant_no === x.receiver.merchant.merchant_no), 'each at its own merchant\'s receiver');
		ok(accepted.every((x) => x.headers['payidem-event-id'] === x.eventId &&
			x.headers['payidem-event'] === x.body.event && x.headers['content-type'] === 'application/json' &&
			Number(x.headers['content-length']) === x.rawBody.length),
		'headers: Payidem-Event-Id, Payidem-Event, Content-Type application/json, Content-Length');
		ok(accepted.every((x) => verify(x.receiver.secret, x.rawBody, x.signature)),
			'verify() of the example accepts each as received');
		// each header as notify_due() made it: t=<t>, then v1=<hex>,v2=<hex> of each
		// secret valid then (the rotated merchant's new and old one for ROT-1),
		// both recomputed here
		const wrongHeaders = accepted.filter((x) => {
			const [, ht] = /^t=([0-9]{10}),/.exec(x.signature) || [];
			const secrets = x.body.order_no === rotated ? [secret, m2.api_secret] : [x.receiver.secret];
			return x.signature !== `t=${ht}` + secrets.map((k) =>
				`,v1=${hmacHex(k, ht, x.rawBody)},v2=${v2Hex(k, ht, x.rawBody)}`).join('');
		});
		is(wrongHeaders.length, 0, 'each header is t, then v1 = HMAC(secret, "<t>.<body>") and v2 = HMAC(secret, "payidem-notification-v2" NUL "<t>.<body>") per secret, recomputed here');

		// the same check in SQL, as a merchant running PostgreSQL makes it (the application role)
		const { rows: [sqlCheck] } = await app.query(
			`SELECT count(*) FILTER (WHERE payidem.verify_notification(k, b, h))::int AS accepted, count(*)::int AS n
			   FROM unnest($1::text[], $2::text[], $3::text[]) AS x(k, b, h)`,
			[accepted.map((x) => x.receiver.merchant.api_key), accepted.map((x) => x.rawBody.toString('utf8')),
				accepted.map((x) => x.signature)]);
		ok(sqlCheck.accepted === sqlCheck.n && sqlCheck.n === events.length,
			'payidem.verify_notification(api_key, body, header) accepts every body and header received', sqlCheck);

		// the state at each event, whatever the order's state now
		for (const m of merchants) {
			const { a, refunds, b } = story.get(m.merchant_no);
			const got = receiverOf(m.merchant_no).accepted.map((x) => x.body);
			const ofA = got.filter((x) => x.order_no === a).sort((x, y) => x.event_id - y.event_id);
			const want = [
				{ event: 'order.paid', status: 'paid' },
				{ event: 'refund.succeeded', status: 'partially_refunded', refund_no: refunds[0], refund_amount: 3000, refunded_amount: 3000 },
				{ event: 'refund.succeeded', status: 'partially_refunded', refund_no: refunds[1], refund_amount: 2000, refunded_amount: 5000 },
				{ event: 'refund.succeeded', status: 'refunded', refund_no: refunds[2], refund_amount: 5000, refunded_amount: 10000 },
			];
			ok(ofA.length === 4 && want.every((w, i) => Object.entries(w).every(([k, v]) => ofA[i][k] === v)) &&
				ofA.every((x) => x.amount === 10000 && x.currency === 'CNY' && x.transaction_id === txnOf(m) &&
					x.out_trade_no === 'A-1' && typeof x.payment_no === 'string' && typeof x.paid_at === 'string'),
			`${m.merchant_no}: paid, partially refunded twice, refunded: each event says its own state`, ofA);
			ok(ofA[0] && !('refund_no' in ofA[0]) && events.find((e) => e.order_no === a).order_status_now === 'refunded',
				`${m.merchant_no}: order.paid says paid though the order is refunded now`);
			const ofB = got.filter((x) => x.order_no === b);
			ok(ofB.length === 1 && ofB[0].event === 'order.closed' && ofB[0].status === 'closed' &&
				!('payment_no' in ofB[0]) && ofB[0].amount === 500, `${m.merchant_no}: order.closed says closed`, ofB);
		}
		const utc = /^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$/;
		ok(accepted.every((x) => utc.test(x.body.created_at) && String(x.body.event_id) === x.eventId),
			'created_at UTC ISO 8601, event_id as in the header');

		// ---------------------------------------------------------- what the receiver refuses
		const sample = accepted.find((x) => x.body.event === 'refund.succeeded' && x.body.transaction_id === txnOf(x.receiver.merchant));
		const { secret: sampleSecret, merchant: sampleMerchant } = sample.receiver;
		const t = Number(/^t=([0-9]+)/.exec(sample.signature)[1]);
		let changedAccepted = 0;
		for (let i = 0; i < sample.rawBody.length; i++) {
			const b = Buffer.from(sample.rawBody);
			b[i] ^= 0x01;
			if (verify(sampleSecret, b, sample.signature, 300, t)) changedAccepted++;
		}
		is(changedAccepted, 0, `one byte changed, at each of its ${sample.rawBody.length} places: refused`);
		ok(!verify(sampleSecret, Buffer.concat([sample.rawBody, Buffer.from('\n')]), sample.signature, 300, t),
			'a trailing newline: refused');

		// re-serialised: the bytes a JSON library writes back are not the bytes signed
		const obj = JSON.parse(sample.rawBody.toString('utf8'));
		const { rows: [{ jsonb }] } = await su.query('SELECT $1::jsonb::text AS jsonb', [sample.rawBody.toString('utf8')]);
		const reserialised = {
			'pretty-printed (JSON.stringify(x, null, 2))': JSON.stringify(obj, null, 2),
			'Python json.dumps separators (", " and ": ")': '{' +
				Object.entries(obj).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(', ') + '}',
			'keys sorted (a Go map, JSON.stringify with a key list)': JSON.stringify(obj, Object.keys(obj).sort()),
			'jsonb text (payload::jsonb::text)': jsonb,
		};
		for (const [how, text] of Object.entries(reserialised)) {
			ok(text !== sample.rawBody.toString('utf8') && !verify(sampleSecret, text, sample.signature, 300, t),
				`re-serialised, ${how}: refused`);
		}
		// JSON.parse + JSON.stringify: refused exactly when the bytes change
		let same = 0;
		let wrong = 0;
		for (const x of accepted) {
			const back = JSON.stringify(JSON.parse(x.rawBody.toString('utf8')));
			const sameBytes = back === x.rawBody.toString('utf8');
			if (sameBytes) same++;
			if (verify(x.receiver.secret, back, x.signature, 300, Number(/^t=([0-9]+)/.exec(x.signature)[1])) !== sameBytes) wrong++;
		}
		is(wrong, 0, 'JSON.parse + JSON.stringify of each body: accepted only where the bytes come back the same');
		note(`JSON.stringify(JSON.parse(body)) gave back the same bytes for ${same} of ${accepted.length} bodies`);

		// the replay window, with verify()'s now
		ok(verify(sampleSecret, sample.rawBody, sample.signature, 300, t + 300) &&
			verify(sampleSecret, sample.rawBody, sample.signature, 300, t - 300),
		'up to 5 minutes from its t (either way): accepted');
		ok(!verify(sampleSecret, sample.rawBody, sample.signature, 300, t + 301), 'replayed 5 minutes and 1 s later: refused');
		ok(!verify(sampleSecret, sample.rawBody, sample.signature, 300, t - 301), 'a t 5 minutes and 1 s ahead: refused');
		// and a header signed 10 minutes ago with the right secret
		const now = Math.floor(Date.now() / 1000);
		const stale = `t=${now - 600},v2=${v2Hex(sampleSecret, now - 600, sample.rawBody)}`;
		const fresh = `t=${now},v2=${v2Hex(sampleSecret, now, sample.rawBody)}`;
		ok(!verify(sampleSecret, sample.rawBody, stale) && verify(sampleSecret, sample.rawBody, fresh),
			'signed 10 minutes ago: refused; the same signed now: accepted');
		const { rows: [sqlRefuse] } = await app.query(
			`SELECT payidem.verify_notification($1, $2, $3) AS stale, payidem.verify_notification($1, $4, $5) AS changed,
			        payidem.verify_notification($1, $2, $5) AS fresh`,
			[sampleMerchant.api_key, sample.rawBody.toString('utf8'), stale,
				sample.rawBody.toString('utf8').replace('"amount":10000', '"amount":10001'), fresh]);
		ok(!sqlRefuse.stale && !sqlRefuse.changed && sqlRefuse.fresh,
			'verify_notification in SQL agrees: stale and changed refused, fresh accepted', sqlRefuse);
		// the header's grammar
		const [, v1] = /v1=([0-9a-f]{64})/.exec(sample.signature);
		const [, v2] = /v2=([0-9a-f]{64})/.exec(sample.signature);
		ok(!verify(sampleSecret, sample.rawBody, undefined) && !verify(sampleSecret, sample.rawBody, `t=${t}`) &&
			!verify(sampleSecret, sample.rawBody, `v2=${v2}`) &&
			!verify(sampleSecret, sample.rawBody, `t=${t},v1=${v1}`, 300, t) &&
			!verify(sampleSecret, sample.rawBody, `t=${t},t=${t},v2=${v2}`, 300, t) &&
			!verify(sampleSecret, sample.rawBody, sample.signature.toUpperCase(), 300, t) &&
			verify(sampleSecret, sample.rawBody, `${sample.signature},v3=abc`, 300, t) &&
			verify(sampleSecret, sample.rawBody, `t=${t},v1=${'0'.repeat(64)},v2=${v2}`, 300, t) &&
			verify(sampleSecret, sample.rawBody, `t=${t},v2=${'0'.repeat(64)},v2=${v2}`, 300, t),
		'header: no header, no t, two t, upper case, only v1 refused; v1 and v3 ignored, any v2 may match');

		// sign() and a notification apart: a request body "<t>.<payload>" the
		// merchant's secret signed with payidem.sign() is a valid v1 of that payload
		// (a receiver written for 1.0 takes it), never a valid v2
		const forgedT = Math.floor(Date.now() / 1000);
		const forgedBody = sample.rawBody.toString('utf8').replace('"amount":10000', '"amount":1');
		const { rows: [{ signed }] } = await app.query('SELECT payidem.sign($1, $2) AS signed',
			[sampleMerchant.merchant_no, `${forgedT}.${forgedBody}`]);
		is(signed, hmacHex(sampleSecret, forgedT, forgedBody), 'sign() of "<t>.<body>" is that body\'s v1');
		ok(!verify(sampleSecret, forgedBody, `t=${forgedT},v1=${signed}`) &&
			!verify(sampleSecret, forgedBody, `t=${forgedT},v2=${signed}`) &&
			!verify(sampleSecret, forgedBody, `t=${forgedT},v1=${signed},v2=${signed}`),
		'verify() of the example refuses it as v1, as v2 and as both');
		const { rows: [sqlForged] } = await app.query(
			`SELECT payidem.verify_notification($1, $2, format('t=%s,v1=%s', $3::text, $4::text)) AS as_v1,
			        payidem.verify_notification($1, $2, format('t=%s,v2=%s', $3::text, $4::text)) AS as_v2`,
			[sampleMerchant.api_key, forgedBody, forgedT, signed]);
		ok(!sqlForged.as_v1 && !sqlForged.as_v2, 'verify_notification in SQL refuses it too', sqlForged);
		ok(!verify(receivers.find((r) => r !== sample.receiver).secret, sample.rawBody, sample.signature, 300, t),
			'another merchant\'s secret: refused');

		// the live server: 400, and the handler never sees it
		const live = sample.receiver;
		const takenBefore = live.accepted.length + live.turnedDown.length;
		const tampered = Buffer.from(sample.rawBody.toString('utf8').replace('"amount":10000', '"amount":10001'));
		const h = (sig) => ({ 'Payidem-Signature': sig, 'Payidem-Event': sample.body.event, 'Payidem-Event-Id': sample.eventId });
		const statuses = [
			await postRaw(live.url, tampered, h(fresh)),
			await postRaw(live.url, JSON.stringify(obj, null, 2), h(fresh)),
			await postRaw(live.url, sample.rawBody, h(stale)),
			await postRaw(live.url, sample.rawBody, {}),
		];
		ok(statuses.every((s) => s === 400) && live.accepted.length + live.turnedDown.length === takenBefore &&
			live.refused.length === 4, 'the receiver answers 400 to a changed byte, a re-serialised body, a stale t, no header',
		statuses);
		is(await postRaw(live.url, sample.rawBody, h(fresh)), 200, 'and 200 to the body as signed (a replay within the window: dedupe by event_id)');
		is(live.seen.get(sample.eventId), 2, 'which its handler sees as the same event_id again');
	} finally {
		if (app) await app.end().catch(() => {});
		for (const p of pools) await p.end().catch(() => {});
		for (const s of servers) s.close();
		await su.end().catch(() => {});
		const admin2 = new Client({ database: 'postgres' });
		try {
			await admin2.connect();
			await admin2.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
			await admin2.query(`DROP ROLE IF EXISTS ${APP_ROLE}`);
		} catch (err) {
			ok(false, `clean-up: ${err.message}`);
		} finally {
			await admin2.end().catch(() => {});
		}
	}
}

const deadline = setTimeout(() => {
	ok(false, 'finished within 120 s');
	console.log(`1..${tests}`);
	process.exit(1);
}, 120000);
deadline.unref();

main().then(() => {
	console.log(`1..${tests}`);
	process.exit(failures ? 1 : 0);
}, (err) => {
	ok(false, `no error: ${String(err && err.message).split('\n')[0]}`, err && err.stack);
	console.log(`1..${tests}`);
	process.exit(1);
});
