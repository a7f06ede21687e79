'use strict';
// test/client/tap.js — what the client tests share: their npm packages
// (test/client/node_modules) on the module path, and their TAP output.

const path = require('path');
const { spawnSync } = require('child_process');

const ROOT = path.resolve(__dirname, '..', '..');
const MODULES = path.join(__dirname, 'node_modules');

// Run the test file again with the packages on NODE_PATH (the examples it
// loads require 'pg' from there); returns only when they already are.
function useModules(file) {
	if ((process.env.NODE_PATH || '').split(path.delimiter).includes(MODULES)) return;
	const env = { ...process.env, NODE_PATH: [MODULES, process.env.NODE_PATH].filter(Boolean).join(path.delimiter) };
	const r = spawnSync(process.execPath, [file, ...process.argv.slice(2)], { stdio: 'inherit', env });
	process.exit(r.status === null ? 1 : r.status);
}

// ok/is print a TAP line each; errorOf(promise) is the error a call raises as
// an application sees it (null if none); done() prints the plan and exits 1
// if a check failed; crashed(err) reports a test that did not run to its end.
function tap() {
	let tests = 0;
	let failures = 0;
	const ok = (cond, name, diag) => {
		tests++;
		console.log(`${cond ? 'ok' : 'not ok'} ${tests} - ${name}`);
		if (!cond) {
			failures++;
			if (diag !== undefined) console.error(`#   ${typeof diag === 'string' ? diag : JSON.stringify(diag)}`);
		}
		return cond;
	};
	const is = (got, want, name) => ok(got === want, name, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
	const errorOf = (promise) => promise.then(() => null, (e) => e);
	const done = () => {
		console.log(`1..${tests}`);
		process.exit(failures ? 1 : 0);
	};
	const crashed = (err) => {
		console.log(`not ok ${tests + 1} - the test ran to its end`);
		console.error(`# ${err.stack}`);
		console.log(`1..${tests + 1}`);
		process.exit(1);
	};
	return { ok, is, errorOf, done, crashed };
}

module.exports = { ROOT, useModules, tap };
