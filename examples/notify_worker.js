#!/usr/bin/env node
'use strict';
// examples/notify_worker.js — a merchant-notification (outbox) worker for payidem
// (docs/notifications.md), with the `pg` driver and Node's own http/https only.
//
//   npm install pg@8
//   PGHOST=/var/run/postgresql PGDATABASE=shop PGUSER=payments_app node notify_worker.js
//
// It loops: takes due events with payidem.notify_due(), POSTs each event's payload
// to its notify_url as the raw body, byte for byte, with the signature header,
// and reports each answer with payidem.notify_result(): 2xx is delivered, anything
// else (another status, a timeout, a refused connection) is retried on payidem's
// schedule.  SIGTERM or SIGINT: no new batch is taken and no new POST started;
// the POSTs under way finish and are reported, then it exits 0 (events of the
// batch not yet posted are left to their lease: due again within 60 s); a second
// signal ends it at once.
//
// The role it connects as needs only what payidem.grant_app(role) gives: it
// reads no table.  Run as many workers as you like: notify_due() never hands
// one event to two of them.
//
// Configuration (environment):
//   PGHOST PGPORT PGDATABASE PGUSER PGPASSWORD ...  the connection, as for psql
//   PAYIDEM_NOTIFY_BATCH        events per notify_due() call     (default 20)
//   PAYIDEM_NOTIFY_CONCURRENCY  POSTs in flight at once          (default 8)
//   PAYIDEM_NOTIFY_TIMEOUT_MS   one POST, connect to last byte   (default 10000)
//   PAYIDEM_NOTIFY_IDLE_MS      pause when nothing was due       (default 1000)
//
// Delivery is at least once (a worker killed between a POST and its report
// delivers that event again after the lease): receivers deduplicate by the
// Payidem-Event-Id header (the payload's event_id).

const http = require('http');
const https = require('https');
const { Pool } = require('pg');

// notify_due() leases what it hands out for this long (DESIGN §7): until then no
// other worker gets those events.  A delivery is started only while the lease
// still covers it to its timeout, so an event is never posted by two workers at
// once; one left unstarted is handed out again when its lease ends.
const LEASE_MS = 60000;
const LEASE_MARGIN_MS = 2000;
const RESPONSE_KEEP = 200;	// characters of an answer kept for notify_result (it keeps 256)

function intFromEnv(env, name, fallback, min, max) {
	const raw = env[name];
	if (raw === undefined || raw === '') return fallback;
	const n = Number(raw);
	if (!Number.isInteger(n) || n < min || n > max) {
		throw new Error(`${name} must be an integer from ${min} to ${max}, not ${JSON.stringify(raw)}`);
	}
	return n;
}

function configFromEnv(env = process.env) {
	const config = {
		batch: intFromEnv(env, 'PAYIDEM_NOTIFY_BATCH', 20, 1, 1000),
		concurrency: intFromEnv(env, 'PAYIDEM_NOTIFY_CONCURRENCY', 8, 1, 256),
		timeoutMs: intFromEnv(env, 'PAYIDEM_NOTIFY_TIMEOUT_MS', 10000, 100, 30000),
		idleMs: intFromEnv(env, 'PAYIDEM_NOTIFY_IDLE_MS', 1000, 10, 600000),
	};
	return config;
}

// One POST of the payload, as it is: a Buffer of its UTF-8 bytes (the database's
// text, which node-postgres decodes from UTF-8, its client_encoding), never
// JSON.parse()d and written again — the signature is over these bytes.
// Resolves to { ok, response } and never rejects: every way of failing is a
// not-ok answer to report.  Redirects are not followed (a 3xx is not ok).
function post(event, { timeoutMs, agents }) {
	return new Promise((resolve) => {
		let url;
		try {
			url = new URL(event.notify_url);
		} catch (err) {
			resolve({ ok: false, response: `invalid notify_url: ${err.message}` });
			return;
		}
		const lib = url.protocol === 'https:' ? https : http;
		const body = Buffer.from(event.payload, 'utf8');
		let settled = false;
		const finish = (ok, response) => {
			if (settled) return;
			settled = true;
			clearTimeout(timer);
			resolve({ ok, response: String(response).slice(0, RESPONSE_KEEP) });
		};
		const req = lib.request(url, {
			method: 'POST',
			agent: agents[url.protocol] || undefined,
			headers: {
				'Content-Type': 'application/json',
				'Content-Length': body.length,
				'Payidem-Signature': event.signature,
				'Payidem-Event': event.event,
				'Payidem-Event-Id': String(event.event_id),
				'User-Agent': 'payidem-notify-worker/1.0',
			},
		}, (res) => {
			// read a little of the answer for last_response, then let it go
			const chunks = [];
			let kept = 0;
			res.on('data', (chunk) => {
				if (kept < RESPONSE_KEEP) {
					chunks.push(chunk);
					kept += chunk.length;
				}
			});
			res.on('end', () => {
				const ok = res.statusCode >= 200 && res.statusCode < 300;
				// text PostgreSQL takes: a NUL (or an invalid UTF-8 byte) in a
				// merchant's answer would make notify_result() fail, and the event
				// be handed out again after every lease, never counted
				const text = Buffer.concat(chunks).toString('utf8')
					.replace(/[\u0000-\u001f\u007f-\u009f\s]+/g, ' ').trim();
				finish(ok, `HTTP ${res.statusCode}${text ? ': ' + text : ''}`);
			});
			res.on('error', (err) => finish(false, `response error: ${err.code || err.message}`));
		});
		// the whole exchange, connect to last byte, within timeoutMs
		const timer = setTimeout(() => {
			finish(false, `timeout after ${timeoutMs} ms`);
			req.destroy(new Error('timeout'));
		}, timeoutMs);
		req.on('error', (err) => finish(false, `error: ${err.code || err.message}`));
		req.end(body);
	});
}

// Run fn over items, at most `limit` at once.
async function eachLimited(items, limit, fn) {
	let next = 0;
	const lanes = [];
	for (let i = 0; i < Math.min(limit, items.length); i++) {
		lanes.push((async () => {
			while (next < items.length) {
				const item = items[next++];
				await fn(item);
			}
		})());
	}
	await Promise.all(lanes);
}

// One round: take a batch, deliver it, report every answer.  Returns what it did:
// { events: [rows handed out], results: [{ event_id, ok, response }], skipped: [event_id] }.
//
// Why notify_due() is committed before any POST (it is one statement in
// autocommit: its own transaction): the lease it writes (next_attempt_at moved
// 60 s ahead) is what keeps other workers off those events, not a row lock, so
// nothing needs to stay locked while merchants answer.  Holding the transaction
// open over the network would keep a connection idle in transaction and the rows
// locked for as long as the slowest merchant, and a crash would undo the lease.
// Each result is then reported in a statement of its own, as soon as it is
// known: one slow merchant delays no other's report, and a worker that dies
// mid-batch loses only the unreported ones (delivered again after the lease).
// Keeping it short also keeps the header's t (the time notify_due() signed) fresh.
async function runOnce(pool, options = {}) {
	const config = { ...configFromEnv({}), ...options };
	const agents = config.agents || { 'http:': undefined, 'https:': undefined };
	const shouldStop = config.shouldStop || (() => false);
	const handedAt = Date.now();
	const { rows } = await pool.query('SELECT * FROM payidem.notify_due($1)', [config.batch]);
	const results = [];
	const skipped = [];
	// node-postgres returns bigint as a string: event_id stays one (exact, and
	// what notify_result() takes back)
	await eachLimited(rows, config.concurrency, async (event) => {
		if (shouldStop() || Date.now() + config.timeoutMs > handedAt + LEASE_MS - LEASE_MARGIN_MS) {
			skipped.push(event.event_id);	// not attempted: due again when its lease ends
			return;
		}
		const { ok, response } = await post(event, { timeoutMs: config.timeoutMs, agents });
		let reported = true;
		try {
			// with the attempt handed out: a report that comes too late (the
			// event was handed out again) changes nothing
			await pool.query('SELECT payidem.notify_result($1, $2, $3, $4)',
				[event.event_id, ok, ok ? null : response, event.attempt]);
		} catch (err) {
			// not recorded: the event is delivered again when its lease ends
			reported = false;
			if (config.log) config.log(`notify_result(${event.event_id}) failed: ${err.message}`);
		}
		results.push({ event_id: event.event_id, ok, response, reported });
		if (config.log) config.log(`${event.event} ${event.event_id} attempt ${event.attempt} -> ${response}`);
	});
	return { events: rows, results, skipped };
}

// A worker: runOnce() in a loop until stop() (or `rounds` rounds, or — with
// untilIdle — the first round that finds nothing due).  start() resolves when
// the loop has ended and every delivery under way has been reported.
function createWorker(pool, options = {}) {
	const config = { ...configFromEnv({}), ...options };
	const agents = {
		'http:': new http.Agent({ keepAlive: true, maxSockets: config.concurrency }),
		'https:': new https.Agent({ keepAlive: true, maxSockets: config.concurrency }),
	};
	let stopping = false;
	let wake = null;
	const worker = {
		handed: [],		// every event_id this worker was handed, in order
		events: [],		// the rows themselves
		results: [],	// { event_id, ok, response, reported } per POST
		stop() {
			stopping = true;
			if (wake) wake();
		},
		async start({ rounds = Infinity, untilIdle = false } = {}) {
			try {
				for (let round = 0; round < rounds && !stopping; round++) {
					let done;
					try {
						done = await runOnce(pool, { ...config, agents, shouldStop: () => stopping });
					} catch (err) {
						// the database went away or refused: wait, then try again
						if (config.log) config.log(`notify_due/notify_result failed: ${err.message}`);
						if (untilIdle) throw err;
						done = { events: [] };
					}
					for (const e of done.events) {
						worker.handed.push(e.event_id);
						worker.events.push(e);
					}
					if (done.results) worker.results.push(...done.results);
					if (done.events.length === 0) {
						if (untilIdle) break;
						await new Promise((resolve) => {
							wake = resolve;
							setTimeout(resolve, config.idleMs);
						});
						wake = null;
					}
				}
			} finally {
				agents['http:'].destroy();
				agents['https:'].destroy();
			}
			return worker;
		},
	};
	return worker;
}

module.exports = { runOnce, createWorker, post, configFromEnv, LEASE_MS };

if (require.main === module) {
	let config;
	try {
		config = configFromEnv();
	} catch (err) {
		console.error(`notify_worker: ${err.message}`);
		process.exit(2);
	}
	const log = (line) => console.log(`${new Date().toISOString()} ${line}`);
	// max: one connection for notify_due, the rest for reports in flight
	const pool = new Pool({ max: Math.min(config.concurrency + 1, 10), application_name: 'payidem-notify-worker' });
	pool.on('error', (err) => log(`idle connection error: ${err.message}`));
	const worker = createWorker(pool, { ...config, log });
	let signals = 0;
	const stop = (signal) => {
		if (++signals > 1) {
			log(`${signal} again: exiting now (the events under way are delivered again after their lease)`);
			process.exit(1);
		}
		log(`${signal}: finishing the deliveries under way`);
		worker.stop();
	};
	process.on('SIGTERM', () => stop('SIGTERM'));
	process.on('SIGINT', () => stop('SIGINT'));
	log(`started: batch ${config.batch}, concurrency ${config.concurrency}, timeout ${config.timeoutMs} ms`);
	worker.start()
		.then(() => pool.end())
		.then(() => {
			log('stopped');
			process.exit(0);
		}, (err) => {
			console.error(`notify_worker: ${err.stack || err}`);
			process.exit(1);
		});
}
