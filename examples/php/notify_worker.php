<?php
// examples/php/notify_worker.php — a merchant-notification (outbox) worker for
// payidem (docs/notifications.md), with PDO (Debian: php-cli php-pgsql) and
// PHP's own http stream wrapper: no other extension, no Composer package.
//
//   PGHOST=/var/run/postgresql PGDATABASE=shop PGUSER=notify_worker php notify_worker.php
//   php notify_worker.php --until-idle      # from cron: deliver what is due, then exit
//
// It loops: takes due events with payidem.notify_due() (its own transaction:
// the lease it writes keeps other workers off those events, so nothing stays
// locked while merchants answer), POSTs each payload to its notify_url as the
// raw body, byte for byte, with the signature header, and reports each answer
// at once with payidem.notify_result(): 2xx is delivered, anything else (another
// status, a redirect, a timeout, a refused connection) is retried on payidem's
// schedule.  A POST is started only while the 60 s lease still covers it to its
// timeout; the rest of the batch is handed out again when the lease ends.
// SIGTERM or SIGINT: the POST under way finishes and is reported, then it exits 0.
// A lost database connection ends it with an error (status 255): run it under a
// supervisor that starts it again (systemd's Restart=always), or from cron.
//
// The role it connects as needs only what payidem.grant_app(role) gives.  Run
// as many workers as you like: notify_due() never hands one event to two.
//
// Configuration (environment):
//   PGHOST PGPORT PGDATABASE PGUSER PGPASSWORD ...  the connection, as for psql
//                                (libpq reads them; PAYIDEM_DSN, default
//                                "pgsql:", may name any of them instead)
//   PAYIDEM_NOTIFY_BATCH         events per notify_due() call    (default 10)
//   PAYIDEM_NOTIFY_TIMEOUT       one POST, in seconds            (default 10)
//   PAYIDEM_NOTIFY_IDLE          pause when nothing was due, s   (default 1)

declare(strict_types=1);

// notify_due() leases what it hands out for this long (docs/notifications.md)
const PAYIDEM_LEASE_SECONDS = 60;
const PAYIDEM_LEASE_MARGIN_SECONDS = 2;

// POST one event: [bool $ok (the answer was 2xx), string $response (a short,
// printable summary: notify_result keeps 256 characters of a failure's)].
function payidem_post_event(array $event, float $timeout): array
{
	$url = (string) $event['notify_url'];
	// fopen() opens files and php:// streams too: only ever a web address
	if (preg_match('~^https?://~i', $url) !== 1) {
		return [false, 'not an http(s) URL'];
	}
	$context = stream_context_create(['http' => [
		'method' => 'POST',
		'header' => implode("\r\n", [
			'Content-Type: application/json',
			'Payidem-Signature: ' . $event['signature'],
			'Payidem-Event: ' . $event['event'],
			'Payidem-Event-Id: ' . $event['event_id'],
			'User-Agent: payidem-notify-worker-php/1.0',
			'Connection: close',
		]),
		'content' => $event['payload'],		// the exact bytes that were signed
		'timeout' => $timeout,				// connect, and each read
		'follow_location' => 0,				// a redirect is no delivery
		'ignore_errors' => true,			// read a 4xx/5xx answer too
	]]);
	$stream = @fopen($url, 'rb', false, $context);
	if ($stream === false) {
		return [false, payidem_printable('error: ' . (error_get_last()['message'] ?? 'no connection'))];
	}
	$text = (string) stream_get_contents($stream, 200);
	$meta = stream_get_meta_data($stream);
	fclose($stream);
	if ($meta['timed_out']) {
		return [false, "timeout after $timeout s"];
	}
	$statusLine = (string) ($meta['wrapper_data'][0] ?? '');
	if (preg_match('~^HTTP/\S+\s+([0-9]{3})~', $statusLine, $m) !== 1) {
		return [false, 'no HTTP answer'];
	}
	$status = (int) $m[1];
	$response = payidem_printable("HTTP $status" . ($text === '' ? '' : ": $text"));
	return [$status >= 200 && $status < 300, $response];
}

// Text PostgreSQL takes: a NUL byte or invalid UTF-8 in a merchant's answer
// would make notify_result() fail (22021), and the attempt never be counted.
function payidem_printable(string $text): string
{
	return trim((string) preg_replace('/[^\x20-\x7e]+/', ' ', $text));
}

// One round: take a batch, deliver it, report every answer.  Returns what it
// did: a list of ['event_id', 'event', 'attempt', 'ok', 'response'] (ok null:
// not posted, the lease would not cover it).
function payidem_notify_once(PDO $db, int $batch = 10, float $timeout = 10.0, ?callable $stop = null): array
{
	$handedAt = microtime(true);
	$due = $db->prepare('SELECT * FROM payidem.notify_due(?)');
	$due->bindValue(1, $batch, PDO::PARAM_INT);
	$due->execute();	// autocommit: notify_due() commits at once
	$events = $due->fetchAll(PDO::FETCH_ASSOC);

	$report = $db->prepare('SELECT payidem.notify_result(?, ?, ?, ?)');
	$done = [];
	foreach ($events as $event) {
		$row = ['event_id' => $event['event_id'], 'event' => $event['event'],
			'attempt' => $event['attempt'], 'ok' => null, 'response' => 'not posted'];
		if (($stop !== null && $stop()) ||
			microtime(true) + $timeout > $handedAt + PAYIDEM_LEASE_SECONDS - PAYIDEM_LEASE_MARGIN_SECONDS) {
			$done[] = $row;		// due again when its lease ends
			continue;
		}
		[$ok, $response] = payidem_post_event($event, $timeout);
		$report->bindValue(1, $event['event_id'], PDO::PARAM_INT);
		// PDO sends a PHP bool as a string unless told otherwise: true becomes
		// '1' (a boolean to PostgreSQL) but false becomes '' (not one: 22P02,
		// invalid input syntax for type boolean), so every success would be
		// recorded and every failure would throw.  PDO::PARAM_BOOL sends it as
		// a boolean.  (execute([$id, $ok, ...]) binds everything as a string.)
		$report->bindValue(2, $ok, PDO::PARAM_BOOL);
		$report->bindValue(3, $ok ? null : $response, $ok ? PDO::PARAM_NULL : PDO::PARAM_STR);
		// the attempt it was handed out as: a report that comes after its lease
		// ended, when another worker has the event, changes nothing
		$report->bindValue(4, $event['attempt'], PDO::PARAM_INT);
		try {
			$report->execute();
		} catch (PDOException $e) {
			// not recorded: delivered again when its lease ends
			error_log("notify_worker: notify_result({$event['event_id']}): " . $e->getMessage());
		}
		$done[] = ['ok' => $ok, 'response' => $response] + $row;
	}
	return $done;
}

function payidem_int_env(string $name, int $default, int $min, int $max): int
{
	$raw = getenv($name);
	if ($raw === false || $raw === '') {
		return $default;
	}
	if (preg_match('/^[0-9]+$/D', $raw) !== 1 || (int) $raw < $min || (int) $raw > $max) {
		fwrite(STDERR, "notify_worker: $name must be an integer from $min to $max\n");
		exit(2);
	}
	return (int) $raw;
}

// Run as a program (not included by another script).
if (PHP_SAPI === 'cli' && realpath((string) ($_SERVER['SCRIPT_FILENAME'] ?? '')) === __FILE__) {
	$batch = payidem_int_env('PAYIDEM_NOTIFY_BATCH', 10, 1, 1000);
	$timeout = payidem_int_env('PAYIDEM_NOTIFY_TIMEOUT', 10, 1, 30);
	$idle = payidem_int_env('PAYIDEM_NOTIFY_IDLE', 1, 1, 600);
	$untilIdle = in_array('--until-idle', $argv, true);

	$stopping = false;
	if (function_exists('pcntl_async_signals')) {
		pcntl_async_signals(true);
		$stop = function (int $signal) use (&$stopping): void { $stopping = true; };
		pcntl_signal(SIGTERM, $stop);
		pcntl_signal(SIGINT, $stop);
	}
	$log = fn (string $line) => fwrite(STDOUT, gmdate('Y-m-d\TH:i:s\Z') . " $line\n");
	$db = new PDO(getenv('PAYIDEM_DSN') ?: 'pgsql:', null, null, [
		PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
	]);
	$log("started: batch $batch, timeout $timeout s");
	while (!$stopping) {
		$done = payidem_notify_once($db, $batch, (float) $timeout, function () use (&$stopping): bool {
			return $stopping;
		});
		foreach ($done as $d) {
			$log("{$d['event']} {$d['event_id']} attempt {$d['attempt']} -> {$d['response']}");
		}
		if ($done === []) {
			if ($untilIdle) {
				break;
			}
			sleep($idle);	// a signal ends it early
		}
	}
	$log('stopped');
}
