<?php
// test/php/router.php — the web side of test/php/php_samples.test.php, served by
// `php -S 127.0.0.1:<port> router.php`: the examples' own request functions,
// with a record of every answer for the test to read.
//
//   GET  /ping              PAYIDEM_TEST_NONCE (the test knows it is its own server)
//   POST /callback          examples/php/payment_callback.php, as the app role
//   POST /notify            examples/php/notify_receiver.php with PAYIDEM_API_SECRET;
//                           an order whose out_trade_no starts with FLAKY- is turned
//                           down (500) the first time
//   POST /mitm/payload      the receiver, after a byte of the amount was changed on the way
//   POST /mitm/signature    ... after each v2 was replaced by one of another secret
//   POST /mitm/stale        ... an hour after it was signed (a replay)
//
// Each request appends one JSON line to PAYIDEM_TEST_RECORD.

declare(strict_types=1);

require __DIR__ . '/../../examples/php/notify_receiver.php';
require __DIR__ . '/../../examples/php/payment_callback.php';

$record = function (array $line): void {
	file_put_contents((string) getenv('PAYIDEM_TEST_RECORD'), json_encode($line, JSON_THROW_ON_ERROR) . "\n",
		FILE_APPEND | LOCK_EX);
};
$path = (string) parse_url($_SERVER['REQUEST_URI'] ?? '/', PHP_URL_PATH);
$method = $_SERVER['REQUEST_METHOD'] ?? '';

if ($path === '/ping') {
	echo getenv('PAYIDEM_TEST_NONCE');
	return;
}

if ($path === '/callback') {
	$result = payidem_callback_request(fn () => new PDO((string) getenv('PAYIDEM_DSN'), null, null, [
		PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
	]));
	$record(['path' => $path] + $result);
	return;
}

$secrets = array_values(array_filter(explode(',', (string) getenv('PAYIDEM_API_SECRET'))));
$taken = null;
// a real handler writes the event to its database; this one notes it, and turns
// down a FLAKY order's first delivery (a state file per event id)
$onEvent = function (array $n) use (&$taken): void {
	$taken = $n['event_id'];
	$state = dirname((string) getenv('PAYIDEM_TEST_RECORD')) . '/seen-' . $n['event_id'];
	$first = @fopen($state, 'x') !== false;
	if ($first && str_starts_with((string) ($n['body']['out_trade_no'] ?? ''), 'FLAKY-')) {
		throw new RuntimeException('database busy');
	}
};

if ($path === '/notify') {
	payidem_receive($secrets, $onEvent);
	$record(['path' => $path, 'status' => http_response_code(), 'taken' => $taken,
		'body' => base64_encode((string) file_get_contents('php://input')),
		'signature' => $_SERVER['HTTP_PAYIDEM_SIGNATURE'] ?? null,
		'event_id_header' => $_SERVER['HTTP_PAYIDEM_EVENT_ID'] ?? null,
		'event_header' => $_SERVER['HTTP_PAYIDEM_EVENT'] ?? null]);
	return;
}

if (str_starts_with($path, '/mitm/')) {
	$raw = (string) file_get_contents('php://input');
	$header = $_SERVER['HTTP_PAYIDEM_SIGNATURE'] ?? null;
	$body = $raw;
	$sig = $header;
	$now = null;
	switch ($path) {
		case '/mitm/payload':
			$body = (string) preg_replace('/"amount":([0-9])/', '"amount":9$1', $raw, 1);
			break;
		case '/mitm/signature':
			$sig = (string) preg_replace_callback('/v2=[0-9a-f]{64}/',
				fn ($m) => 'v2=' . hash_hmac('sha256', "payidem-notification-v2\0" . 'x.' . $raw, 'another secret'),
				(string) $header);
			break;
		case '/mitm/stale':
			$now = time() + 3600;
			break;
	}
	[$status, $text] = payidem_handle_notification($secrets, $method, $body, $sig, $onEvent, 300, $now);
	payidem_answer($status, $text);
	$record(['path' => $path, 'status' => $status, 'text' => $text, 'taken' => $taken,
		'body' => base64_encode($raw), 'signature' => $header,
		'tampered_body' => base64_encode($body), 'tampered_signature' => $sig]);
	return;
}

payidem_answer(404, 'no such path');
