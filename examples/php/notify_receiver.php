<?php
// examples/php/notify_receiver.php — the merchant's side of payidem's
// notifications (docs/notifications.md "The receiver's check"), in plain PHP
// (hash and json only: no extension to install).
//
//   PAYIDEM_API_SECRET=... php -S 127.0.0.1:8080 notify_receiver.php
//
// (php -S is PHP's development server; behind nginx or Apache with PHP-FPM the
// same file answers the notify_url it is mapped to.)
//
// It reads the raw request body as bytes, checks the Payidem-Signature header
// against them: its v2 is the lowercase hex HMAC-SHA256, with the merchant's API
// secret, of "payidem-notification-v2", a NUL byte, t, a dot and the body;
// compared with hash_equals() (constant time); any v2 may match (during a
// secret rotation there is one per valid secret).  It refuses a t more than 5
// minutes from now (a replay) and only then parses the JSON.  The header's v1
// (payidem 1.0's scheme, which a request the merchant signed with payidem.sign()
// can pass) is never checked, not even as a fallback.  A verified notification
// is answered 200 once your handler has taken it (a handler that throws is
// answered 500: payidem retries); anything else 4xx.  Delivery is at least once:
// deduplicate by event_id in your handler.
//
// Configuration (environment): PAYIDEM_API_SECRET, the secret create_merchant or
// rotate_merchant_secret showed; during a rotation's grace period both may be
// given, separated by a comma.

declare(strict_types=1);

const PAYIDEM_TOLERANCE_SECONDS = 300;
const PAYIDEM_MAX_BODY_BYTES = 65536;
// what v2 signs before "<t>.<body>": the scheme's name and a NUL byte
const PAYIDEM_V2_PREFIX = "payidem-notification-v2\0";

// Parse "t=<unix seconds>,v1=<hex>,v2=<hex>[,v1=...,v2=...]": ['t' => string,
// 'v2' => [hex, ...]], or null unless there is exactly one t and at least one
// v2.  v1 and any key a later version adds are ignored.
function payidem_parse_signature(string $header): ?array
{
	if (strlen($header) > 1024) {
		return null;
	}
	$t = null;
	$v2 = [];
	foreach (explode(',', $header) as $part) {
		$kv = explode('=', $part, 2);
		if (count($kv) !== 2) {
			continue;
		}
		[$key, $value] = $kv;
		if ($key === 't') {
			if ($t !== null || preg_match('/^[0-9]{1,12}$/D', $value) !== 1) {
				return null;
			}
			$t = $value;
		} elseif ($key === 'v2' && preg_match('/^[0-9a-f]{64}$/D', $value) === 1) {
			$v2[] = $value;
		}
	}
	return ($t === null || $v2 === []) ? null : ['t' => $t, 'v2' => $v2];
}

// true if $header signs $rawBody (the bytes as received) under one of $secrets
// and its t lies within $tolerance seconds of $now (default: the clock).
function payidem_verify_notification(array $secrets, string $rawBody, string $header,
	int $tolerance = PAYIDEM_TOLERANCE_SECONDS, ?int $now = null): bool
{
	$sig = payidem_parse_signature($header);
	if ($sig === null || abs(($now ?? time()) - (int) $sig['t']) > $tolerance) {
		return false;
	}
	$ok = false;
	foreach ($secrets as $secret) {
		if (!is_string($secret) || $secret === '') {
			continue;
		}
		$mac = hash_hmac('sha256', PAYIDEM_V2_PREFIX . $sig['t'] . '.' . $rawBody, $secret);
		foreach ($sig['v2'] as $candidate) {
			// every comparison is made, whichever matches
			$ok = hash_equals($mac, $candidate) || $ok;
		}
	}
	return $ok;
}

// The answer to one request, without touching PHP's globals (so that it can be
// called from a framework's controller too): [HTTP status, text].  $onEvent gets
// the verified notification, ['event' => ..., 'event_id' => int, 'body' => the
// JSON decoded, 'raw_body' => string, 'signature' => string]; if it throws, the
// answer is 500 and payidem delivers the event again later.
function payidem_handle_notification(array $secrets, string $method, string $rawBody,
	?string $header, callable $onEvent, int $tolerance = PAYIDEM_TOLERANCE_SECONDS,
	?int $now = null): array
{
	if ($method !== 'POST') {
		return [405, 'POST only'];
	}
	if (strlen($rawBody) > PAYIDEM_MAX_BODY_BYTES) {
		return [413, 'body too large'];
	}
	if ($header === null || !payidem_verify_notification($secrets, $rawBody, $header, $tolerance, $now)) {
		return [400, 'bad signature'];
	}
	try {
		$body = json_decode($rawBody, true, 16, JSON_THROW_ON_ERROR);
	} catch (JsonException $e) {
		return [400, 'not JSON'];	// signed but unreadable: never from payidem
	}
	if (!is_array($body) || !is_int($body['event_id'] ?? null) || !is_string($body['event'] ?? null)) {
		return [400, 'not a payidem event'];
	}
	try {
		$onEvent(['event' => $body['event'], 'event_id' => $body['event_id'], 'body' => $body,
			'raw_body' => $rawBody, 'signature' => $header]);
	} catch (Throwable $e) {
		error_log('notify_receiver: event ' . $body['event_id'] . ' not taken: ' . $e->getMessage());
		return [500, 'not taken'];
	}
	return [200, 'ok'];
}

// Answer this request (the web server's): read the raw body and the header,
// decide, reply.
function payidem_receive(array $secrets, callable $onEvent, int $tolerance = PAYIDEM_TOLERANCE_SECONDS): void
{
	// one byte past the limit is enough to know it is too large
	$rawBody = (string) file_get_contents('php://input', false, null, 0, PAYIDEM_MAX_BODY_BYTES + 1);
	[$status, $text] = payidem_handle_notification($secrets, $_SERVER['REQUEST_METHOD'] ?? '',
		$rawBody, $_SERVER['HTTP_PAYIDEM_SIGNATURE'] ?? null, $onEvent, $tolerance);
	payidem_answer($status, $text);
}

function payidem_answer(int $status, string $text): void
{
	http_response_code($status);
	if ($status === 405) {
		header('Allow: POST');
	}
	header('Content-Type: text/plain; charset=utf-8');
	echo $text, "\n";
}

// Served as a script (not included by another one): the merchant's endpoint.
if (realpath((string) ($_SERVER['SCRIPT_FILENAME'] ?? '')) === __FILE__) {
	$secrets = array_values(array_filter(explode(',', (string) getenv('PAYIDEM_API_SECRET'))));
	if ($secrets === []) {
		error_log('notify_receiver: set PAYIDEM_API_SECRET to the merchant\'s API secret');
		payidem_answer(500, 'not configured');
		return;
	}
	payidem_receive($secrets, function (array $n): void {
		// Your business here, in one transaction with a record of the event id,
		// so that a repeated delivery is taken once, e.g. with PDO:
		//   INSERT INTO received_event (event_id) VALUES (?) ON CONFLICT DO NOTHING
		// and only if that inserted a row, mark the order paid, refunded, closed.
		// Throw to answer 500 (payidem retries on its schedule).
		$b = $n['body'];
		$what = isset($b['payout_no'])
			? "payout {$b['payout_no']} ({$b['out_payout_no']}) of {$b['amount']} is {$b['status']}"
			: "order {$b['order_no']} ({$b['out_trade_no']}) is {$b['status']}";
		error_log("notify_receiver: {$n['event']} {$n['event_id']}: $what");
	});
}
