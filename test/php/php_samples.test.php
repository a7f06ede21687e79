<?php
// test/php/php_samples.test.php — the PHP examples (examples/php/) against a real
// server through PDO, their web side served by PHP's own `php -S` on 127.0.0.1.
//
// As the superuser (PG* variables: the runner's throwaway cluster) it makes a
// database, a merchant, a channel and an application role that has only what
// payidem.grant_app() gives; as that role:
// - pays orders through the callback handler (payment_callback.php, over HTTP
//   and called in-process): applied, a duplicate, a rejected amount, all 200;
//   errors answered by SQLSTATE (22023 400, PI009 404, not JSON 400, GET 405),
//   their message, DETAIL and HINT parsed out of PDO's errorInfo[2] equal to what
//   the server itself says (GET STACKED DIAGNOSTICS), with and without CONTEXT
//   lines, and a DETAIL of two lines;
// - delivers the events with the worker (notify_worker.php) to the receiver
//   (notify_receiver.php): every delivered body is notify_event.payload byte for
//   byte and its header verifies (v2 recomputed here, and
//   payidem.verify_notification()); a payload changed on the way, a signature of
//   another secret and a delivery an hour late are refused (400), reported with
//   notify_result(false) and handed out again (attempt 2, 15 s later), as is a
//   delivery the merchant's handler turns down (500), which the retry delivers;
// - posts to the receiver what no worker sends: a changed byte, a stale or future
//   t, two t, no header, a sign() signature of "<t>.<payload>" as v1 or v2 (which
//   a receiver checking v1 would take), not JSON, too large, GET;
// - a secret rotation: two v1/v2 pairs, the new secret's first; a receiver with
//   either secret accepts;
// - the worker as a program (--until-idle; SIGTERM ends its loop, status 0), and
//   the receiver and the callback handler served as they are;
// - the PDO boolean trap as a fact: execute() sends PHP false as '' (22P02, also
//   with emulated prepares; true as '1', which passes), PDO::PARAM_BOOL works.
// No PHP warning, notice or deprecation anywhere (the servers' logs included).
// Cleans up its database and role.  TAP on stdout; exit 1 on failure.
//
// Run by scripts/test (TESTS=php_samples); by hand: test/php/run.sh php_samples.

declare(strict_types=1);

error_reporting(E_ALL);
set_error_handler(function (int $no, string $str, string $file, int $line): bool {
	if (!(error_reporting() & $no)) {
		return false;		// silenced with @
	}
	throw new ErrorException($str, 0, $no, $file, $line);
});

$ROOT = dirname(__DIR__, 2);
require "$ROOT/examples/php/notify_receiver.php";
require "$ROOT/examples/php/notify_worker.php";
require "$ROOT/examples/php/payment_callback.php";

const DB = 'payidem_php';
const APP_ROLE = 'payidem_php_app';
const V2_PREFIX = "payidem-notification-v2\0";

// ------------------------------------------------------------------ TAP
$TESTS = 0;
$FAILURES = 0;
function ok(bool $cond, string $name, mixed $diag = null): bool
{
	global $TESTS, $FAILURES;
	$TESTS++;
	echo ($cond ? 'ok' : 'not ok') . " $TESTS - $name\n";
	if (!$cond) {
		$FAILURES++;
		if ($diag !== null) {
			$text = is_string($diag) ? $diag : json_encode($diag, JSON_PRETTY_PRINT | JSON_INVALID_UTF8_SUBSTITUTE);
			foreach (array_slice(explode("\n", (string) $text), 0, 40) as $l) {
				fwrite(STDERR, "#   $l\n");
			}
		}
	}
	return $cond;
}
function is(mixed $got, mixed $want, string $name): bool
{
	return ok($got === $want, $name, ['got' => $got, 'want' => $want]);
}
function note(string $text): void
{
	echo "# $text\n";
}

// ------------------------------------------------------------------ database
function pdo(string $db, ?string $user = null, ?string $password = null): PDO
{
	return new PDO("pgsql:dbname=$db", $user, $password, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
}
function rows(PDO $db, string $sql, array $params = []): array
{
	$st = $db->prepare($sql);
	$st->execute($params);
	return $st->fetchAll(PDO::FETCH_ASSOC);
}
function value(PDO $db, string $sql, array $params = []): mixed
{
	$st = $db->prepare($sql);
	$st->execute($params);
	return $st->fetchColumn();
}
// the PDOException a statement raises (null if none)
function pdo_error(callable $f): ?PDOException
{
	try {
		$f();
	} catch (PDOException $e) {
		return $e;
	}
	return null;
}

// ------------------------------------------------------------------ processes
// php -S on a port of 127.0.0.1 that the kernel has free.  Another program may
// take it between the probe and php -S's bind: then php -S says "Failed to
// listen" and exits, and another port is tried.  It is ours once its log says
// it started on that port (printed only after its bind succeeded).
function start_server(string $script, array $env, string $log): array
{
	for ($try = 1; $try <= 20; $try++) {
		$probe = stream_socket_server('tcp://127.0.0.1:0', $errno, $errstr);
		if ($probe === false) {
			throw new RuntimeException("no port on 127.0.0.1: $errstr");
		}
		$name = (string) stream_socket_get_name($probe, false);
		fclose($probe);
		$port = (int) substr($name, strrpos($name, ':') + 1);
		file_put_contents($log, '');
		$proc = proc_open([PHP_BINARY, '-d', 'display_errors=0', '-d', 'log_errors=1', '-d', 'error_reporting=-1',
			'-S', "127.0.0.1:$port", $script],
			[0 => ['file', '/dev/null', 'r'], 1 => ['file', $log, 'a'], 2 => ['file', $log, 'a']],
			$pipes, dirname($script), array_merge(getenv(), $env));
		if ($proc === false) {
			throw new RuntimeException('proc_open php -S failed');
		}
		$deadline = microtime(true) + 15;
		while (microtime(true) < $deadline) {
			if (preg_match('~Development Server \(http://127\.0\.0\.1:' . $port . '\) started~',
				(string) file_get_contents($log)) === 1) {
				return ['proc' => $proc, 'url' => "http://127.0.0.1:$port", 'log' => $log];
			}
			if (process_exit($proc) !== null) {
				break;		// it could not listen there
			}
			usleep(20000);
		}
		stop_process($proc);
		note("php -S on port $port did not start (try $try): " . trim((string) file_get_contents($log)));
	}
	throw new RuntimeException('php -S did not start');
}
// The exit status of a process this test started, once it has ended (else null).
function process_exit($proc): ?int
{
	static $codes = [];
	$key = (int) $proc;
	if (!array_key_exists($key, $codes)) {
		$status = proc_get_status($proc);	// (its exitcode is given only once)
		if ($status['running']) {
			return null;
		}
		$codes[$key] = $status['exitcode'];
	}
	return $codes[$key];
}
function wait_process($proc, float $seconds): ?int
{
	$deadline = microtime(true) + $seconds;
	while (($rc = process_exit($proc)) === null && microtime(true) < $deadline) {
		usleep(20000);
	}
	return $rc;
}
// SIGTERM to a process this test started, SIGKILL if it lingers: its exit status.
function stop_process($proc): int
{
	if (($rc = process_exit($proc)) === null) {
		proc_terminate($proc, 15);
		if (($rc = wait_process($proc, 5)) === null) {
			proc_terminate($proc, 9);
			$rc = wait_process($proc, 5) ?? -1;
		}
	}
	proc_close($proc);
	return $rc;
}
function php_warnings(string $log): array
{
	return preg_grep('/PHP (Warning|Notice|Deprecated|Fatal error|Parse error|Stack trace)/',
		explode("\n", (string) file_get_contents($log)));
}

// ------------------------------------------------------------------ HTTP
function http_request(string $method, string $url, string $body = '', array $headers = []): array
{
	$context = stream_context_create(['http' => [
		'method' => $method,
		'header' => implode("\r\n", array_merge(['Content-Type: application/json', 'Connection: close'], $headers)),
		'content' => $body,
		'timeout' => 10,
		'ignore_errors' => true,
		'follow_location' => 0,
	]]);
	$stream = fopen($url, 'rb', false, $context);
	$text = (string) stream_get_contents($stream);
	$status = (int) (explode(' ', (string) stream_get_meta_data($stream)['wrapper_data'][0])[1] ?? 0);
	fclose($stream);
	return [$status, $text];
}
function post_json(string $url, array $report): array
{
	return http_request('POST', $url, json_encode($report, JSON_THROW_ON_ERROR));
}
// what the web side wrote since the last call
function new_records(string $file): array
{
	static $seen = [];
	$lines = array_values(array_filter(explode("\n", (string) @file_get_contents($file))));
	$new = array_slice($lines, $seen[$file] ?? 0);
	$seen[$file] = count($lines);
	return array_map(fn ($l) => json_decode($l, true, 32, JSON_THROW_ON_ERROR), $new);
}

// v2 of a header, computed here: HMAC-SHA256(secret, label NUL "<t>.<payload>")
function v2_hex(string $secret, string $t, string $payload): string
{
	return hash_hmac('sha256', V2_PREFIX . "$t.$payload", $secret);
}
function v1_hex(string $secret, string $t, string $payload): string
{
	return hash_hmac('sha256', "$t.$payload", $secret);
}

// ------------------------------------------------------------------ the test
$appPassword = bin2hex(random_bytes(12));
$work = sys_get_temp_dir() . '/payidem-php-' . getmypid() . '-' . bin2hex(random_bytes(4));
mkdir($work, 0700);
$servers = [];
$admin = null;
$su = null;
$app = null;

function cleanup(): void
{
	global $servers, $admin, $su, $app, $work;
	foreach ($servers as $s) {
		stop_process($s['proc']);
	}
	$servers = [];
	$su = $app = null;
	if ($admin !== null) {
		try {
			$admin->exec('DROP DATABASE IF EXISTS ' . DB . ' WITH (FORCE)');
			$admin->exec('DROP ROLE IF EXISTS ' . APP_ROLE);
		} catch (PDOException $e) {
			fwrite(STDERR, "# clean-up: {$e->getMessage()}\n");
		}
		$admin = null;
	}
	if (is_dir($work)) {
		array_map('unlink', glob("$work/*") ?: []);
		rmdir($work);
	}
}

try {
	$admin = pdo('postgres');
	$admin->exec('DROP DATABASE IF EXISTS ' . DB . ' WITH (FORCE)');
	$admin->exec('DROP ROLE IF EXISTS ' . APP_ROLE);
	$admin->exec('CREATE ROLE ' . APP_ROLE . " LOGIN PASSWORD '$appPassword'");
	$admin->exec('CREATE DATABASE ' . DB);

	$su = pdo(DB);
	$su->exec('CREATE EXTENSION payidem');
	rows($su, 'SELECT payidem.grant_app(?)', [APP_ROLE]);
	rows($su, "SELECT payidem.create_channel('PHP_WX', 'wechat', 0.002)");
	$m = rows($su, "SELECT * FROM payidem.create_merchant('PHP Tea', 'retail', 0.006)")[0];
	$merchantNo = $m['merchant_no'];
	$secret = $m['api_secret'];
	rows($su, "SELECT payidem.bind_channel(?, 'PHP_WX')", [$merchantNo]);
	// the server's own fields of an error, for comparing with what PHP parses
	$su->exec(<<<'SQL'
		CREATE FUNCTION public.error_fields(statement text,
			OUT e_sqlstate text, OUT e_message text, OUT e_detail text, OUT e_hint text)
		LANGUAGE plpgsql AS $$
		BEGIN
			EXECUTE statement;
			e_sqlstate := 'none';
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS e_sqlstate = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
				e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
		END $$;
		CREATE FUNCTION public.two_line_detail() RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'a message'
				USING ERRCODE = '22023', DETAIL = E'First line.\nSecond line.', HINT = 'A hint.';
		END $$;
		SQL);
	$serverFields = function (string $statement) use ($su): array {
		$r = rows($su, 'SELECT * FROM public.error_fields(?)', [$statement])[0];
		return ['sqlstate' => $r['e_sqlstate'], 'message' => $r['e_message'],
			'detail' => $r['e_detail'] === '' ? null : $r['e_detail'], 'hint' => $r['e_hint'] === '' ? null : $r['e_hint']];
	};

	$record = "$work/record.jsonl";
	$web = start_server("$ROOT/test/php/router.php", [
		'PAYIDEM_API_SECRET' => $secret,
		'PAYIDEM_TEST_RECORD' => $record,
		'PAYIDEM_DSN' => 'pgsql:dbname=' . DB,
		'PGUSER' => APP_ROLE,
		'PGPASSWORD' => $appPassword,
	], "$work/web.log");
	$servers[] = $web;
	$url = $web['url'];
	note("web side on $url");

	// ---------------------------------------------------------------- the application
	$app = pdo(DB, APP_ROLE, $appPassword);
	$denied = pdo_error(fn () => $app->query('SELECT count(*) FROM payidem.notify_event'));
	is($denied?->errorInfo[0], '42501', 'the application role reads no table (grant_app only)');

	$seq = 0;
	$newOrder = function (string $outTradeNo, int $amount, string $path = '/notify') use ($app, $merchantNo, $url): array {
		$o = value($app, 'SELECT payidem.create_order(?, ?, ?, ?, ?)',
			[$merchantNo, $outTradeNo, $amount, "Order $outTradeNo", $url . $path]);
		$p = value($app, "SELECT payidem.begin_payment(?, 'PHP_WX')", [$o]);
		return ['order_no' => $o, 'payment_no' => $p, 'amount' => $amount];
	};
	$paid = function (array $o) use ($app, &$seq): string {
		$r = payidem_apply_callback($app, ['payment_no' => $o['payment_no'], 'status' => 'succeeded',
			'transaction_id' => 'WX-PHP-' . (++$seq), 'amount' => $o['amount']]);
		return (string) $r['outcome'];
	};

	// ---------------------------------------------------------------- callbacks over HTTP
	$ok1 = $newOrder('OK-1', 2599);
	$okReport = ['payment_no' => $ok1['payment_no'], 'status' => 'succeeded', 'transaction_id' => 'WX-OK-1',
		'amount' => 2599, 'paid_at' => gmdate('Y-m-d\TH:i:s\Z')];
	$answers = [post_json("$url/callback", $okReport), post_json("$url/callback", $okReport)];
	$rec = new_records($record);
	is($answers, [[200, 'SUCCESS'], [200, 'SUCCESS']], 'callback: a success and its duplicate both answered 200 SUCCESS');
	is(array_column($rec, 'outcome'), ['applied', 'duplicate'], '... applied, then duplicate');
	is(value($app, 'SELECT payidem.get_order(?)->>\'status\'', [$ok1['order_no']]), 'paid', '... the order is paid');

	$mismatch = $newOrder('MISMATCH', 1000);
	$a = post_json("$url/callback", ['payment_no' => $mismatch['payment_no'], 'status' => 'succeeded',
		'transaction_id' => 'WX-MISMATCH', 'amount' => 999]);
	$rec = new_records($record);
	ok($a === [200, 'SUCCESS'] && ($rec[0]['outcome'] ?? null) === 'rejected',
		'callback: another amount is rejected, answered 200 (an anomaly for a person)', [$a, $rec]);
	is(value($app, 'SELECT payidem.get_order(?)->>\'status\'', [$mismatch['order_no']]), 'pending', '... the order stays pending');
	// the anomaly the result names is the order's, in the application's work queue
	$named = $rec[0]['anomaly_id'] ?? null;
	ok(is_int($named), '... and names its anomaly (apply_payment_result_ex)', $rec);
	is(value($app, "SELECT x->>'kind' FROM payidem.list_anomalies() x WHERE (x->>'anomaly_id')::bigint = ?", [$named]),
		'amount_mismatch', '... which the application role reads in list_anomalies()');
	is(value($app, "SELECT payidem.get_order(?)->'anomalies'->0->>'anomaly_id'", [$mismatch['order_no']]), (string) $named,
		'... and in get_order()');

	// errors: status by SQLSTATE, and message, DETAIL, HINT as the server has them
	$noTxn = $newOrder('NO-TXN', 1500);
	$unknown = (string) value($app, "SELECT payidem.gen_order_no('PY')");
	$future = '2099-01-01T00:00:00Z';
	$errorCases = [
		['a success without its transaction id', ['payment_no' => $noTxn['payment_no'], 'status' => 'succeeded', 'amount' => 1500],
			400, '22023', sprintf("SELECT payidem.apply_payment_result(%s, 'callback', 'succeeded', NULL, 1500)", $su->quote($noTxn['payment_no'])), true],
		['a paid_at in 2099', ['payment_no' => $noTxn['payment_no'], 'status' => 'succeeded', 'transaction_id' => 'WX-F',
			'amount' => 1500, 'paid_at' => $future],
			400, '22023', sprintf("SELECT payidem.apply_payment_result(%s, 'callback', 'succeeded', 'WX-F', 1500, %s)",
				$su->quote($noTxn['payment_no']), $su->quote($future)), true],
		['a malformed payment number (an error with CONTEXT lines)', ['payment_no' => 'PY123', 'status' => 'failed'],
			400, '22023', "SELECT payidem.apply_payment_result('PY123', 'callback', 'failed')", true],
		['a failure of a payment that does not exist', ['payment_no' => $unknown, 'status' => 'failed'],
			404, 'PI009', sprintf("SELECT payidem.apply_payment_result(%s, 'callback', 'failed')", $su->quote($unknown)), false],
	];
	foreach ($errorCases as [$what, $report, $status, $sqlstate, $statement, $hasHint]) {
		$a = post_json("$url/callback", $report);
		$rec = new_records($record);
		$got = $rec[0]['error'] ?? null;
		$want = $serverFields($statement);
		ok($a === [$status, 'FAIL'] && ($got['sqlstate'] ?? null) === $sqlstate,
			"callback: $what is answered $status ($sqlstate)", [$a, $got]);
		is($got, $want, "... its message, DETAIL and HINT parsed from errorInfo[2] are the server's");
		ok($want['detail'] !== null && ($want['hint'] !== null) === $hasHint,
			'... (the server gave a DETAIL' . ($hasHint ? ' and a HINT)' : ', no HINT)'), $want);
	}
	is(value($app, 'SELECT payidem.get_order(?)->>\'status\'', [$noTxn['order_no']]), 'pending', 'the refused reports changed nothing');

	$a = http_request('POST', "$url/callback", '{"payment_no":');
	$rec = new_records($record);
	ok($a === [400, 'FAIL'] && $rec[0]['error']['sqlstate'] === null, 'callback: not JSON is 400, no database call', [$a, $rec]);
	$a = http_request('GET', "$url/callback");
	new_records($record);
	is($a[0], 405, 'callback: GET is 405');

	// the parser on PDO's own text: a DETAIL of two lines, and a statement quoted with LINE and a caret
	$e = pdo_error(fn () => $su->query('SELECT public.two_line_detail()'));
	is(payidem_pg_error_fields((string) $e?->errorInfo[2]),
		['message' => 'a message', 'detail' => "First line.\nSecond line.", 'hint' => 'A hint.'],
		'errorInfo[2] parsed: a DETAIL of two lines, a HINT, the CONTEXT left out');
	is(array_map('payidem_http_status', ['40001', '40P01', '08006', '57P01', '53300', '42501', 'PI002']),
		[503, 503, 503, 503, 503, 500, 500], 'HTTP status: conflicts and an unreachable database 503, the rest 500');

	// ---------------------------------------------------------------- notifications
	$orders = ['OK-1' => $ok1];
	foreach (['OK-2' => '/notify', 'OK-3' => '/notify', 'FLAKY-1' => '/notify', 'MITM-PAYLOAD' => '/mitm/payload',
		'MITM-SIGNATURE' => '/mitm/signature', 'MITM-STALE' => '/mitm/stale'] as $out => $path) {
		$orders[$out] = $newOrder($out, 1000 + count($orders), $path);
		is($paid($orders[$out]), 'applied', "$out paid through payidem_apply_callback() in-process");
	}
	$events = [];	// event_id => row
	foreach (rows($su, 'SELECT e.event_id, e.payload, o.out_trade_no FROM payidem.notify_event e
			JOIN payidem."order" o USING (order_no) ORDER BY e.event_id') as $r) {
		$events[$r['event_id']] = $r;
	}
	is(count($events), 7, 'seven paid orders with a notify_url: seven events');
	$eventOf = fn (string $out) => array_values(array_filter($events, fn ($e) => $e['out_trade_no'] === $out))[0]['event_id'];

	$r1 = payidem_notify_once($app, 50, 5.0);
	$outOf = fn (array $d) => $events[$d['event_id']]['out_trade_no'];
	$byOut = [];
	foreach ($r1 as $d) {
		$byOut[$outOf($d)] = $d;
	}
	ksort($byOut);
	is(count($r1), 7, 'round 1: the worker is handed all seven');
	is(array_map(fn ($d) => [$d['attempt'], $d['ok'], $d['response']], $byOut), [
		'FLAKY-1' => [1, false, 'HTTP 500: not taken'],
		'MITM-PAYLOAD' => [1, false, 'HTTP 400: bad signature'],
		'MITM-SIGNATURE' => [1, false, 'HTTP 400: bad signature'],
		'MITM-STALE' => [1, false, 'HTTP 400: bad signature'],
		'OK-1' => [1, true, 'HTTP 200: ok'],
		'OK-2' => [1, true, 'HTTP 200: ok'],
		'OK-3' => [1, true, 'HTTP 200: ok'],
	], '... OK orders 200, the turned-down one 500, the tampered and the late ones 400');

	$delivered = new_records($record);
	is(count($delivered), 7, '... seven POSTs reached the web side');
	// a delivery's checks: its header is exactly t and a v1/v2 pair per secret
	// (in this order), computed here; it is fresh; verify_notification() and the
	// example's check take it
	$verifies = function (array $d, ?array $secrets = null) use ($app, $m, $secret): array {
		$secrets ??= [$secret];
		$body = base64_decode($d['body']);
		$sig = (string) $d['signature'];
		$t = preg_match('/^t=([0-9]+),/', $sig, $mm) === 1 ? $mm[1] : '0';
		$want = "t=$t";
		foreach ($secrets as $key) {
			$want .= ',v1=' . v1_hex($key, $t, $body) . ',v2=' . v2_hex($key, $t, $body);
		}
		return [
			'header' => $sig === $want,
			'fresh' => abs(time() - (int) $t) <= 60,
			'sql' => (bool) value($app, 'SELECT payidem.verify_notification(?, ?, ?)', [$m['api_key'], $body, $sig]),
			'example' => payidem_verify_notification($secrets, $body, $sig),
		];
	};
	$allGood = ['header' => true, 'fresh' => true, 'sql' => true, 'example' => true];
	$bad = [];
	foreach ($delivered as $d) {
		$body = base64_decode($d['body']);
		$id = json_decode($body, true)['event_id'] ?? null;
		if (!isset($events[$id]) || $events[$id]['payload'] !== $body || $verifies($d) !== $allGood) {
			$bad[] = ['event' => $id, 'checks' => $verifies($d), 'body' => $body];
		}
	}
	is($bad, [], 'every delivered body is its notify_event.payload byte for byte, and its header verifies ' .
		'(v1 and v2 recomputed here, verify_notification(), the example\'s check)');
	$notify = array_values(array_filter($delivered, fn ($d) => $d['path'] === '/notify'));
	ok($notify !== [] && array_reduce($notify, fn ($c, $d) => $c && $d['event_id_header'] ===
		(string) json_decode(base64_decode($d['body']), true)['event_id'] && $d['event_header'] === 'order.paid', true),
		'... with the Payidem-Event-Id and Payidem-Event headers of the payload', $notify);

	$mitm = [];
	foreach ($delivered as $d) {
		if (str_starts_with($d['path'], '/mitm/')) {
			$mitm[$d['path']] = $d;
		}
	}
	$p = $mitm['/mitm/payload'] ?? null;
	ok($p !== null && $p['tampered_body'] !== $p['body'] && !value($app, 'SELECT payidem.verify_notification(?, ?, ?)',
		[$m['api_key'], base64_decode($p['tampered_body']), $p['signature']]),
		'the changed payload differs and verify_notification() refuses it too', $p);
	$s = $mitm['/mitm/signature'] ?? null;
	ok($s !== null && $s['tampered_signature'] !== $s['signature'] && !value($app,
		'SELECT payidem.verify_notification(?, ?, ?)', [$m['api_key'], base64_decode($s['body']), $s['tampered_signature']]),
		'the replaced signature differs and verify_notification() refuses it too', $s);

	$state = function () use ($su): array {
		$out = [];
		foreach (rows($su, 'SELECT o.out_trade_no, e.status, e.attempts, e.last_response,
				extract(epoch FROM e.next_attempt_at - e.last_attempt_at)::int AS wait
			FROM payidem.notify_event e JOIN payidem."order" o USING (order_no) ORDER BY 1') as $r) {
			$out[$r['out_trade_no']] = [$r['status'], $r['attempts'], $r['last_response'], $r['wait']];
		}
		return $out;
	};
	$after1 = $state();
	is(array_filter($after1, fn ($x) => $x[0] !== 'sent'), [
		'FLAKY-1' => ['pending', 1, 'HTTP 500: not taken', 15],
		'MITM-PAYLOAD' => ['pending', 1, 'HTTP 400: bad signature', 15],
		'MITM-SIGNATURE' => ['pending', 1, 'HTTP 400: bad signature', 15],
		'MITM-STALE' => ['pending', 1, 'HTTP 400: bad signature', 15],
	], 'notify_result(false) (PDO::PARAM_BOOL): the refused ones stay pending, attempts 1, retried 15 s later');
	is(count(array_filter($after1, fn ($x) => $x[0] === 'sent')), 3, '... the three accepted ones are sent');
	is(payidem_notify_once($app, 50, 5.0), [], 'not due before their next attempt: nothing handed out');

	rows($su, "UPDATE payidem.notify_event SET next_attempt_at = now() WHERE status = 'pending'");
	$r2 = payidem_notify_once($app, 50, 5.0);
	$got = [];
	foreach ($r2 as $d) {
		$got[$outOf($d)] = [$d['attempt'], $d['ok']];
	}
	ksort($got);
	is($got, ['FLAKY-1' => [2, true], 'MITM-PAYLOAD' => [2, false], 'MITM-SIGNATURE' => [2, false], 'MITM-STALE' => [2, false]],
		'forced due: handed out again as attempt 2; the turned-down one is taken now, the others refused again');
	$after2 = $state();
	ok($after2['FLAKY-1'][0] === 'sent' && $after2['MITM-STALE'] === ['pending', 2, 'HTTP 400: bad signature', 15],
		'... FLAKY-1 sent; the refused ones pending, attempts 2', $after2);
	$rec2 = new_records($record);
	ok(count($rec2) === 4 && $verifies($rec2[0]) === $allGood && $verifies($rec2[3]) === $allGood,
		'... the retries are signed anew and verify', $rec2);

	// ---------------------------------------------------------------- the PDO boolean trap
	$trapId = $eventOf('MITM-PAYLOAD');
	$lastResponse = fn () => value($su, 'SELECT last_response FROM payidem.notify_event WHERE event_id = ?', [$trapId]);
	$e = pdo_error(fn () => $app->prepare('SELECT payidem.notify_result(?, ?, ?, ?)')
		->execute([$trapId, false, 'plain false', 2]));
	is($e?->errorInfo[0], '22P02', 'the trap: notify_result() with PHP false through execute() is 22P02');
	is(payidem_pg_error_fields((string) $e?->errorInfo[2])['message'], 'invalid input syntax for type boolean: ""',
		'... because PDO sent false as \'\' (invalid input syntax for type boolean: "")');
	is($lastResponse(), 'HTTP 400: bad signature', '... and nothing was recorded');
	$st = $app->prepare('SELECT ?::boolean');
	$st->execute([true]);
	is($st->fetchColumn(), true, '... while true through execute() passes (sent as \'1\'): only failures break');
	$st = $app->prepare('SELECT payidem.notify_result(?, ?, ?, ?)');
	$st->bindValue(1, $trapId, PDO::PARAM_INT);
	$st->bindValue(2, false, PDO::PARAM_BOOL);
	$st->bindValue(3, 'PARAM_BOOL false');
	$st->bindValue(4, 2, PDO::PARAM_INT);
	ok(pdo_error(fn () => $st->execute()) === null && $lastResponse() === 'PARAM_BOOL false',
		'PDO::PARAM_BOOL: false reaches notify_result() as a boolean and is recorded', $lastResponse());
	$app->setAttribute(PDO::ATTR_EMULATE_PREPARES, true);
	$e = pdo_error(fn () => $app->prepare('SELECT ?::boolean')->execute([false]));
	$st = $app->prepare('SELECT ?::boolean');
	$st->bindValue(1, false, PDO::PARAM_BOOL);
	$st->execute();
	ok($e?->errorInfo[0] === '22P02' && $st->fetchColumn() === false,
		'the same with emulated prepares: plain false 22P02, PDO::PARAM_BOOL false', $e?->errorInfo);
	$app->setAttribute(PDO::ATTR_EMULATE_PREPARES, false);

	// ---------------------------------------------------------------- the receiver against what no worker sends
	$good = $notify[0];
	$body = base64_decode($good['body']);
	$post = fn (string $b, ?string $sig, string $method = 'POST') =>
		http_request($method, "$url/notify", $b, $sig === null ? [] : ["Payidem-Signature: $sig"])[0];
	$sign = fn (string $t, string $b, string $key) => "t=$t,v1=" . v1_hex($key, $t, $b) . ',v2=' . v2_hex($key, $t, $b);
	$now = time();
	$forged = (string) value($app, 'SELECT payidem.sign(?, ?)', [$merchantNo, "$now.$body"]);
	$cases = [
		'the same delivery again (at least once: 2xx)' => [$post($body, $good['signature']), 200],
		'signed 2 minutes ago (within the tolerance)' => [$post($body, $sign((string) ($now - 120), $body, $secret)), 200],
		'a changed byte' => [$post(str_replace('"status":"paid"', '"status":"pai"', $body), $good['signature']), 400],
		'one space added' => [$post($body . ' ', $good['signature']), 400],
		'another secret' => [$post($body, $sign((string) $now, $body, 'not the secret')), 400],
		't 10 minutes old (a replay)' => [$post($body, $sign((string) ($now - 600), $body, $secret)), 400],
		't 10 minutes ahead' => [$post($body, $sign((string) ($now + 600), $body, $secret)), 400],
		'two t' => [$post($body, "t=$now," . $sign((string) $now, $body, $secret)), 400],
		'no v2 (v1 only)' => [$post($body, "t=$now,v1=" . v1_hex($secret, (string) $now, $body)), 400],
		'a sign() signature of "<t>.<payload>" as v1' => [$post($body, "t=$now,v1=$forged"), 400],
		'... and as v2' => [$post($body, "t=$now,v2=$forged"), 400],
		'no header' => [$post($body, null), 400],
		'signed, but not JSON' => [$post('not json', $sign((string) $now, 'not json', $secret)), 400],
		'70000 bytes' => [$post(str_repeat('x', 70000), $sign((string) $now, str_repeat('x', 70000), $secret)), 413],
		'GET' => [$post('', null, 'GET'), 405],
	];
	foreach ($cases as $what => [$got, $want]) {
		is($got, $want, "receiver: $what: $want");
	}
	is($forged, v1_hex($secret, (string) $now, $body),
		'(a sign() signature of "<t>.<payload>" is a valid v1: why the receiver checks v2 only)');
	new_records($record);

	// ---------------------------------------------------------------- a secret rotation
	$newSecret = (string) value($su, "SELECT payidem.rotate_merchant_secret(?, '1 hour')", [$merchantNo]);
	$rot = $newOrder('ROT-1', 4200);
	$paid($rot);
	$r3 = payidem_notify_once($app, 50, 5.0);
	$rec3 = new_records($record);
	ok(count($r3) === 1 && $r3[0]['ok'] === true, 'after a rotation: the receiver with the old secret accepts the event', $r3);
	$d = $rec3[0] ?? ['body' => '', 'signature' => ''];
	$rb = base64_decode($d['body']);
	$t = (string) (preg_match('/^t=([0-9]+),/', (string) $d['signature'], $mm) === 1 ? $mm[1] : '0');
	is($d['signature'], "t=$t,v1=" . v1_hex($newSecret, $t, $rb) . ',v2=' . v2_hex($newSecret, $t, $rb) .
		',v1=' . v1_hex($secret, $t, $rb) . ',v2=' . v2_hex($secret, $t, $rb),
		'... its header has a v1/v2 pair per valid secret, the new one first');
	is([payidem_verify_notification([$newSecret], $rb, (string) $d['signature']),
		payidem_verify_notification([$secret], $rb, (string) $d['signature']),
		payidem_verify_notification(['not the secret'], $rb, (string) $d['signature'])],
		[true, true, false], '... either secret verifies it, another does not');

	// ---------------------------------------------------------------- the worker as a program
	$cli = [$newOrder('CLI-1', 510), $newOrder('CLI-2', 520)];
	array_map($paid, $cli);
	$workerEnv = array_merge(getenv(), ['PGDATABASE' => DB, 'PGUSER' => APP_ROLE, 'PGPASSWORD' => $appPassword,
		'PAYIDEM_NOTIFY_TIMEOUT' => '5']);
	$cmd = [PHP_BINARY, '-d', 'display_errors=stderr', '-d', 'error_reporting=-1', "$ROOT/examples/php/notify_worker.php"];
	$run = function (array $args) use ($cmd, $workerEnv, $work) {
		file_put_contents("$work/worker.out", '');
		file_put_contents("$work/worker.err", '');
		return proc_open(array_merge($cmd, $args), [0 => ['file', '/dev/null', 'r'],
			1 => ['file', "$work/worker.out", 'a'], 2 => ['file', "$work/worker.err", 'a']], $pipes, $work, $workerEnv);
	};
	$proc = $run(['--until-idle']);
	wait_process($proc, 30);
	$rc = stop_process($proc);
	$out = (string) file_get_contents("$work/worker.out");
	$cliIds = array_map(fn ($o) => value($su, 'SELECT event_id FROM payidem.notify_event WHERE order_no = ?', [$o['order_no']]), $cli);
	ok($rc === 0 && preg_match_all('/ order\.paid (' . implode('|', $cliIds) . ') attempt 1 -> HTTP 200: ok$/m', $out) === 2
		&& str_contains($out, ' stopped'),
		'notify_worker.php --until-idle: delivers the two new events, exits 0',
		['rc' => $rc, 'out' => $out, 'err' => file_get_contents("$work/worker.err")]);
	is(rows($su, "SELECT status FROM payidem.notify_event WHERE event_id IN (?, ?)", $cliIds),
		[['status' => 'sent'], ['status' => 'sent']], '... both sent');
	$rec4 = new_records($record);
	ok(count($rec4) === 2 && $verifies($rec4[0], [$newSecret, $secret]) === $allGood &&
		$verifies($rec4[1], [$newSecret, $secret]) === $allGood,
		'... and their headers verify (two v1/v2 pairs: the rotation\'s grace period)',
		[$rec4, isset($rec4[0]) ? $verifies($rec4[0], [$newSecret, $secret]) : null]);

	$proc = $run([]);
	$deadline = microtime(true) + 15;
	while (!str_contains((string) file_get_contents("$work/worker.out"), ' started') && microtime(true) < $deadline) {
		usleep(20000);
	}
	usleep(300000);		// into its idle pause
	$t0 = microtime(true);
	$rc = stop_process($proc);
	ok($rc === 0 && str_contains((string) file_get_contents("$work/worker.out"), ' stopped') && microtime(true) - $t0 < 4,
		'notify_worker.php: SIGTERM ends its loop, status 0',
		['rc' => $rc, 'out' => file_get_contents("$work/worker.out"), 'err' => file_get_contents("$work/worker.err")]);
	is(trim((string) file_get_contents("$work/worker.err")), '', '... nothing on stderr (no PHP warning)');

	// ---------------------------------------------------------------- the examples served as they are
	$receiver = start_server("$ROOT/examples/php/notify_receiver.php",
		['PAYIDEM_API_SECRET' => "$newSecret,$secret"], "$work/receiver.log");
	$servers[] = $receiver;
	$rawPost = fn (string $u, string $b, ?string $sig, string $method = 'POST') =>
		http_request($method, $u, $b, $sig === null ? [] : ["Payidem-Signature: $sig"]);
	$fresh = $sign((string) time(), $rb, $newSecret);
	is([$rawPost($receiver['url'], $rb, $fresh), $rawPost($receiver['url'], $rb . ' ', $fresh)[0],
		$rawPost($receiver['url'], '', null, 'GET')[0]], [[200, "ok\n"], 400, 405],
		'notify_receiver.php served by php -S: a signed event 200 ok, a changed one 400, GET 405');
	ok(str_contains((string) file_get_contents($receiver['log']),
		'notify_receiver: order.paid ' . json_decode($rb, true)['event_id'] . ': order ' . $rot['order_no'] . ' (ROT-1) is paid'),
		'... its handler logged the event', file_get_contents($receiver['log']));

	$callback = start_server("$ROOT/examples/php/payment_callback.php",
		['PGDATABASE' => DB, 'PGUSER' => APP_ROLE, 'PGPASSWORD' => $appPassword], "$work/callback.log");
	$servers[] = $callback;
	$cb = $newOrder('CB-1', 777);
	$report = ['payment_no' => $cb['payment_no'], 'status' => 'succeeded', 'transaction_id' => 'WX-CB-1', 'amount' => 777];
	is([post_json($callback['url'], $report), post_json($callback['url'], $report),
		post_json($callback['url'], ['payment_no' => $noTxn['payment_no'], 'status' => 'succeeded', 'amount' => 1500])],
		[[200, 'SUCCESS'], [200, 'SUCCESS'], [400, 'FAIL']],
		'payment_callback.php served by php -S: a success and its duplicate 200, one without a transaction id 400');
	is(value($app, 'SELECT payidem.get_order(?)->>\'status\'', [$cb['order_no']]), 'paid', '... the order is paid');
	$want = $serverFields(sprintf("SELECT payidem.apply_payment_result(%s, 'callback', 'succeeded', NULL, 1500)",
		$su->quote($noTxn['payment_no'])));
	ok(str_contains((string) file_get_contents($callback['log']),
		"payment_callback: {$noTxn['payment_no']}: 400 22023 {$want['message']}; DETAIL: {$want['detail']}; HINT: {$want['hint']}"),
		'... and logged the refusal with its DETAIL and HINT', file_get_contents($callback['log']));

	foreach ($servers as $s) {
		is(array_values(php_warnings($s['log'])), [], 'no PHP warning in the log of ' . basename($s['log']));
	}
} catch (Throwable $e) {
	ok(false, 'the test ran to its end', (string) $e);
} finally {
	cleanup();
}

echo "1..$TESTS\n";
exit($FAILURES > 0 ? 1 : 0);
