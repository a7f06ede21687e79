#!/usr/bin/env node
'use strict';
// examples/notify_receiver.js — the merchant's side of payidem's notifications
// (docs/notifications.md "The receiver's check"), with Node's own http and crypto.
//
//   PAYIDEM_API_SECRET=... PORT=8080 node notify_receiver.js
//
// It reads the raw request body as bytes, checks the Payidem-Signature header
// against them (its v2: HMAC-SHA256, with the merchant's API secret, of
// "payidem-notification-v2", a NUL byte, t, a dot and the body; compared in
// constant time, any v2 may match: during a secret rotation there is one per
// valid secret), refuses a t more than 5 minutes from now (a replay), and only
// then parses the JSON.  The header's v1 (the scheme of payidem 1.0, which a
// request the merchant signed with payidem.sign() can pass) is not checked.  A good notification is answered 200 once your
// handler has taken it (a handler that throws is answered 500: payidem retries);
// a bad one 400.  Deduplicate by event_id in your handler: delivery is at least
// once.
//
// Configuration (environment): PAYIDEM_API_SECRET (the secret create_merchant or
// rotate_merchant_secret showed; during a rotation's grace period both may be
// given, separated by a comma), PORT (default 8080), HOST (default 127.0.0.1).

const crypto = require('crypto');
const http = require('http');

const DEFAULT_TOLERANCE_SECONDS = 300;
const MAX_BODY_BYTES = 64 * 1024;
// what v2 signs before "<t>.<body>": the scheme's name and a NUL byte
const V2_PREFIX = Buffer.from('payidem-notification-v2\0', 'utf8');

// Parse "t=<unix seconds>,v1=<hex>,v2=<hex>[,v1=<hex>,v2=<hex>...]": null unless
// there is exactly one t and at least one v2.  Other schemes (v1, and any a
// later version adds) are ignored.
function parseSignature(header) {
	if (typeof header !== 'string' || header.length > 1024) return null;
	let t = null;
	const v2 = [];
	for (const part of header.split(',')) {
		const eq = part.indexOf('=');
		if (eq < 0) continue;
		const key = part.slice(0, eq);
		const value = part.slice(eq + 1);
		if (key === 't') {
			if (t !== null || !/^[0-9]{1,12}$/.test(value)) return null;
			t = value;
		} else if (key === 'v2' && /^[0-9a-f]{64}$/.test(value)) {
			v2.push(Buffer.from(value, 'hex'));
		}
	}
	if (t === null || v2.length === 0) return null;
	return { t, v2 };
}

// true if header signs rawBody (a Buffer, or a string taken as UTF-8) under
// secret (a string, or an array of them: any may match), and its t lies within
// toleranceSeconds of now (Unix seconds; default: the clock).
function verify(secret, rawBody, header, toleranceSeconds = DEFAULT_TOLERANCE_SECONDS,
	now = Date.now() / 1000) {
	const sig = parseSignature(header);
	if (!sig) return false;
	if (!(Math.abs(now - Number(sig.t)) <= toleranceSeconds)) return false;
	const body = Buffer.isBuffer(rawBody) ? rawBody : Buffer.from(String(rawBody), 'utf8');
	const secrets = (Array.isArray(secret) ? secret : [secret]).filter((s) => typeof s === 'string' && s !== '');
	let ok = false;
	for (const s of secrets) {
		const mac = crypto.createHmac('sha256', s).update(V2_PREFIX).update(sig.t + '.', 'utf8')
			.update(body).digest();
		// every comparison is made, whichever matches
		for (const candidate of sig.v2) {
			if (crypto.timingSafeEqual(candidate, mac)) ok = true;
		}
	}
	return ok;
}

// An http.Server that calls onEvent(notification) for each verified one:
//   { event, eventId, body (the JSON parsed), rawBody (Buffer), signature, headers }
// onEvent may be async; once it resolves the answer is 200, if it throws 500
// (payidem retries later).
// Anything unverified is answered 400 and never reaches onEvent.
function createServer(secret, onEvent, { toleranceSeconds = DEFAULT_TOLERANCE_SECONDS,
	maxBodyBytes = MAX_BODY_BYTES, onRefused = null } = {}) {
	return http.createServer((req, res) => {
		const answer = (status, text) => {
			res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', Connection: 'keep-alive' });
			res.end(text + '\n');
		};
		const refuse = (status, reason) => {
			if (onRefused) onRefused({ status, reason, headers: req.headers });
			answer(status, reason);
		};
		if (req.method !== 'POST') {
			res.setHeader('Allow', 'POST');
			refuse(405, 'POST only');
			req.resume();
			return;
		}
		const chunks = [];
		let size = 0;
		let tooLarge = false;
		req.on('data', (chunk) => {
			size += chunk.length;
			if (size > maxBodyBytes) tooLarge = true;
			else chunks.push(chunk);
		});
		req.on('error', () => res.destroy());
		req.on('end', async () => {
			if (tooLarge) return refuse(413, 'body too large');
			const rawBody = Buffer.concat(chunks);
			const signature = req.headers['payidem-signature'];
			if (!verify(secret, rawBody, signature, toleranceSeconds)) {
				return refuse(400, 'bad signature');
			}
			let body;
			try {
				body = JSON.parse(rawBody.toString('utf8'));
			} catch (err) {
				return refuse(400, 'not JSON');		// signed but unreadable: never from payidem
			}
			try {
				await onEvent({
					event: body.event, eventId: String(body.event_id), body, rawBody, signature,
					headers: req.headers,
				});
			} catch (err) {
				// the handler's words only if it says they may be shown (err.expose, as
				// http-errors has it): payidem keeps the start of the answer
				return answer(500, err && err.expose ? `not taken: ${err.message}` : 'not taken');
			}
			answer(200, 'ok');
		});
	});
}

module.exports = { verify, parseSignature, createServer, DEFAULT_TOLERANCE_SECONDS };

if (require.main === module) {
	const secrets = String(process.env.PAYIDEM_API_SECRET || '').split(',').filter(Boolean);
	if (secrets.length === 0) {
		console.error('notify_receiver: set PAYIDEM_API_SECRET to the merchant\'s API secret');
		process.exit(2);
	}
	const seen = new Set();		// a real receiver keeps this in its database
	const server = createServer(secrets, ({ event, eventId, body }) => {
		if (seen.has(eventId)) return;		// a repeated delivery: already taken
		seen.add(eventId);
		if (body.payout_no) {
			// payout.succeeded / payout.failed: a payout, no order
			console.log(`${event} ${eventId}: payout ${body.payout_no} (${body.out_payout_no}) of ${body.amount} is ${body.status}`);
		} else {
			console.log(`${event} ${eventId}: order ${body.order_no} (${body.out_trade_no}) is ${body.status}`);
		}
	}, {
		onRefused: ({ status, reason }) => console.log(`refused (${status}): ${reason}`),
	});
	const port = Number(process.env.PORT || 8080);
	const host = process.env.HOST || '127.0.0.1';
	server.listen(port, host, () => console.log(`listening on http://${host}:${server.address().port}/`));
	const stop = () => server.close(() => process.exit(0));
	process.once('SIGTERM', stop);
	process.once('SIGINT', stop);
}
