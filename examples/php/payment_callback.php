<?php
// examples/php/payment_callback.php — a payment channel's callback, applied to
// payidem with one call of payidem.apply_payment_result_ex() (docs/payment-flow.md
// "Outcomes"), with PDO (Debian: php-cli php-pgsql).
//
//   PGHOST=/var/run/postgresql PGDATABASE=shop PGUSER=payments_app \
//     php -S 127.0.0.1:8081 payment_callback.php
//
// (php -S is PHP's development server; behind nginx or Apache with PHP-FPM the
// same file answers the callback URL it is mapped to.)
//
// The channel POSTs its word on a payment; here a JSON body
//   {"payment_no": "PY...", "status": "succeeded", "transaction_id": "...",
//    "amount": 2599, "paid_at": "2026-12-02T01:51:34Z"}
// (a real channel has its own field names and its own signature: verify that
// signature first, with the channel's key, which payidem.get_channel_config()
// returns, then map its fields to these; amounts are integer minor units, so
// convert a "25.99" exactly, never through a float).
//
// The answer: every outcome of apply_payment_result (applied, duplicate, anomaly,
// rejected) is recorded, so all are 200 SUCCESS and the channel stops resending;
// an anomaly or rejected result is a person's follow-up, not the channel's: the
// _ex form also names the anomaly that records it (anomaly_id), which the
// support team finds in payidem.list_anomalies() and closes with
// payidem.resolve_anomaly().  An error is answered by its SQLSTATE (payidem_http_status):
// a report that cannot be applied as it is (22xxx, PI009) 4xx, and the channel's
// resends will not change that; a busy or unreachable database 503, so the
// channel resends later.  Errors are logged with their DETAIL and HINT, which
// PDO hands over only inside the text of errorInfo[2] (payidem_pg_error_fields).
//
// The role it connects as needs only what payidem.grant_app(role) gives.
// Connection: libpq's PG* variables, or PAYIDEM_DSN (default "pgsql:").

declare(strict_types=1);

// PDO keeps three things of a PostgreSQL error: errorInfo[0] the SQLSTATE,
// errorInfo[1] libpq's result status (7), errorInfo[2] libpq's text of the
// error, which carries the other fields as labelled lines:
//   ERROR:  a success must carry the channel's transaction id and amount
//   DETAIL:  Payment PY...: transaction_id was NULL and amount was 2599.
//   HINT:  Pass both as the channel reported them: ...
//   CONTEXT:  PL/pgSQL function ...
// A field's own line breaks continue it on lines without a label.  This takes
// the message, DETAIL and HINT back out: ['message' => ..., 'detail' => ?string,
// 'hint' => ?string].  The labels are libpq's, in English unless the PHP process
// runs with another LC_MESSAGES and libpq's translations installed; a field whose
// own text has a line starting with such a label cannot be told apart from it.
function payidem_pg_error_fields(string $text): array
{
	$fields = ['message' => '', 'detail' => null, 'hint' => null];
	$lines = preg_split('/\r?\n/', rtrim($text, "\r\n"));
	// the first line: the severity (the server's word for it) and the message
	$first = (string) array_shift($lines);
	$fields['message'] = preg_match('/^[^:]+:  (.*)$/Ds', $first, $m) === 1 ? $m[1] : $first;
	$current = 'message';
	foreach ($lines as $line) {
		if (preg_match('/^(DETAIL|HINT|QUERY|CONTEXT|LOCATION|[A-Z]+ NAME):  (.*)$/Ds', $line, $m) === 1) {
			$current = strtolower($m[1]);
			$line = $m[2];
		} elseif (preg_match('/^LINE [0-9]+: /', $line) === 1) {
			$current = 'query';		// the statement quoted, and a caret under it
			continue;
		}
		if ($current === 'message' || $current === 'detail' || $current === 'hint') {
			$fields[$current] = $fields[$current] === null ? $line : $fields[$current] . "\n" . $line;
		}
	}
	return $fields;
}

// The HTTP status for an error of apply_payment_result, by SQLSTATE.
function payidem_http_status(string $sqlstate): int
{
	$class = substr($sqlstate, 0, 2);
	if ($sqlstate === 'PI009') {
		return 404;		// a failure or close reported for a payment that does not exist
	}
	if ($class === '22') {
		return 400;		// the report is malformed (22023: DETAIL says what, HINT what to do)
	}
	if (in_array($sqlstate, ['40001', '40P01', '55P03', '57014'], true) ||
		in_array($class, ['08', '53', '57'], true)) {
		return 503;		// a conflict or a database going away: the same report later will do
	}
	return 500;			// anything else: this handler's mistake; the channel resends
}

// Apply one report: ['status' => HTTP status, 'body' => the answer to the
// channel, 'outcome' => apply_payment_result's, or null on an error,
// 'anomaly_id' => the anomaly an anomaly or rejected outcome names (else null),
// 'error' => null, or ['sqlstate', 'message', 'detail', 'hint']].
function payidem_apply_callback(PDO $db, array $report, ?string $rawJson = null): array
{
	$amount = $report['amount'] ?? null;
	if (is_string($amount) && preg_match('/^[0-9]{1,18}$/D', $amount) === 1) {
		$amount = (int) $amount;
	}
	$txn = $report['transaction_id'] ?? null;
	$paidAt = $report['paid_at'] ?? null;
	if (!is_string($report['payment_no'] ?? null) || !is_string($report['status'] ?? null) ||
		!(is_string($txn) || $txn === null) || !(is_int($amount) || $amount === null) ||
		!(is_string($paidAt) || $paidAt === null)) {
		return ['status' => 400, 'body' => 'FAIL', 'outcome' => null, 'anomaly_id' => null,
			'error' => ['sqlstate' => null, 'message' => 'malformed report', 'detail' => null, 'hint' => null]];
	}
	try {
		$apply = $db->prepare("SELECT outcome, anomaly_id FROM payidem.apply_payment_result_ex(?, 'callback', ?, ?, ?, ?, ?)");
		$apply->bindValue(1, $report['payment_no']);
		$apply->bindValue(2, $report['status']);
		$apply->bindValue(3, $txn);
		$apply->bindValue(4, $amount, $amount === null ? PDO::PARAM_NULL : PDO::PARAM_INT);
		$apply->bindValue(5, $paidAt);		// NULL: the time of the call
		$apply->bindValue(6, $rawJson);		// kept with an anomaly, without its signature keys
		$apply->execute();
		$row = $apply->fetch(PDO::FETCH_ASSOC);
		$outcome = (string) $row['outcome'];
		$anomalyId = $row['anomaly_id'] === null ? null : (int) $row['anomaly_id'];
	} catch (PDOException $e) {
		$sqlstate = (string) ($e->errorInfo[0] ?? $e->getCode());
		return ['status' => payidem_http_status($sqlstate), 'body' => 'FAIL', 'outcome' => null, 'anomaly_id' => null,
			'error' => ['sqlstate' => $sqlstate] + payidem_pg_error_fields((string) ($e->errorInfo[2] ?? $e->getMessage()))];
	}
	return ['status' => 200, 'body' => 'SUCCESS', 'outcome' => $outcome, 'anomaly_id' => $anomalyId, 'error' => null];
}

// Answer this request (the web server's) and return what payidem_apply_callback
// did.  $connect returns the PDO connection.
function payidem_callback_request(callable $connect): array
{
	$fail = fn (int $status, string $message) => ['status' => $status, 'body' => 'FAIL', 'outcome' => null, 'anomaly_id' => null,
		'error' => ['sqlstate' => null, 'message' => $message, 'detail' => null, 'hint' => null]];
	$raw = (string) file_get_contents('php://input', false, null, 0, 65537);
	$report = null;
	if (($_SERVER['REQUEST_METHOD'] ?? '') !== 'POST') {
		$result = $fail(405, 'POST only');
	} elseif (strlen($raw) > 65536) {
		$result = $fail(413, 'body too large');
	} else {
		// (verify the channel's own signature of $raw here)
		$report = json_decode($raw, true, 8);
		if (!is_array($report)) {
			$result = $fail(400, 'not a JSON object');
		} else {
			try {
				$result = payidem_apply_callback($connect(), $report, $raw);
			} catch (PDOException $e) {		// no connection
				$result = $fail(503, 'database unreachable: ' . $e->getMessage());
			}
		}
	}
	$payment = is_string($report['payment_no'] ?? null) ? $report['payment_no'] : '?';
	if ($result['error'] !== null) {
		$err = $result['error'];
		error_log("payment_callback: $payment: {$result['status']} " . ($err['sqlstate'] ?? '-') . " {$err['message']}" .
			($err['detail'] !== null ? "; DETAIL: {$err['detail']}" : '') .
			($err['hint'] !== null ? "; HINT: {$err['hint']}" : ''));
	} elseif ($result['outcome'] === 'anomaly' || $result['outcome'] === 'rejected') {
		error_log("payment_callback: $payment: {$result['outcome']}" . ($result['anomaly_id'] !== null
			? " (anomaly {$result['anomaly_id']}: payidem.list_anomalies(), payidem.resolve_anomaly())" : ''));
	}
	http_response_code($result['status']);
	if ($result['status'] === 503) {
		header('Retry-After: 30');
	}
	header('Content-Type: text/plain; charset=utf-8');
	echo $result['body'];
	return $result;
}

// Served as a script (not included by another one): the channel's callback URL.
if (realpath((string) ($_SERVER['SCRIPT_FILENAME'] ?? '')) === __FILE__) {
	payidem_callback_request(fn () => new PDO(getenv('PAYIDEM_DSN') ?: 'pgsql:', null, null, [
		PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
	]));
}
