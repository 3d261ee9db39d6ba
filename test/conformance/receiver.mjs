// Copyright: outbox_dispatcher contributors
//
// receiver.mjs — an HTTP endpoint that checks every delivery with the
// official SDKs: `standardwebhooks` (Standard Webhooks signature) and
// `cloudevents` (CloudEvents 1.0, HTTP binary mode).  Used by
// test/tap/065_conformance.pl; install with `npm ci --prefix test/conformance`.
//
//   node receiver.mjs --port PORT --log FILE [--secrets FILE] [--port-file FILE] [--watch-pid PID]
//
// --secrets names a JSON file {"/path": ["whsec_...", ...], ...} (or set
// OD_RECEIVER_SECRETS to that JSON text): a request to /path is verified
// against each of the path's secrets.  Port 0 picks a free port.  Once
// listening, the port is written to --port-file and to stdout.
//
// Every POST is answered 200 (/status/NNN: NNN) after one JSON line is
// appended to the log:
//   path, webhook_id,
//   verified      {secret index: true|false}  new Webhook(secret).verify(rawBody, headers)
//   verify_error  {secret index: message}     for the false ones
//   ce            HTTP.toEvent({headers, body}): id type source subject time specversion data
//                 traceparent tracestate (the distributed-tracing extension attributes)
//   ce_error      message when the SDK could not parse the request
//   ce_decoded    id type source subject after the header-value decoding of the
//                 CloudEvents HTTP binding 3.1.3.2 (the SDK does not do it: it
//                 passes header values through unchanged)
//   ce_decode_error {attribute: message} for values that do not decode
//   raw_headers   {lower-case name: value, or [values] when repeated}, the
//                 bytes as sent read as UTF-8 (not the SDK's view)
//   body          the raw body read as UTF-8
// Node's HTTP parser hands header values over as latin1 (one char a byte):
// that is what the SDKs get, as any Node receiver gives them.

import fs from 'node:fs';
import http from 'node:http';
import { Webhook } from 'standardwebhooks';
import { HTTP } from 'cloudevents';

function args(argv)
{
	const out = {};
	for (let i = 0; i < argv.length; i += 2)
	{
		if (!argv[i].startsWith('--') || i + 1 >= argv.length)
			throw new Error(`bad argument ${argv[i]}`);
		out[argv[i].slice(2)] = argv[i + 1];
	}
	return out;
}

const opt = args(process.argv.slice(2));
if (opt.port === undefined || !opt.log)
{
	console.error('usage: node receiver.mjs --port PORT --log FILE [--secrets FILE] [--port-file FILE] [--watch-pid PID]');
	process.exit(2);
}
const secrets = opt.secrets ? JSON.parse(fs.readFileSync(opt.secrets, 'utf8'))
	: JSON.parse(process.env.OD_RECEIVER_SECRETS || '{}');

const latin1ToUtf8 = (s) => Buffer.from(s, 'latin1').toString('utf8');
const utf8 = new TextDecoder('utf-8', { fatal: true });

// CloudEvents HTTP binding 3.1.3.2, receiving side: unescape a
// double-quoted string (RFC 7230 3.2.6), then one round of percent-decoding;
// byte sequences that are not valid UTF-8 are rejected.  `value` is a header
// value as Node gives it (latin1: one char per byte on the wire).
function decodeHeaderValue(value)
{
	let s = value;
	if (s.length >= 2 && s.startsWith('"') && s.endsWith('"'))
		s = s.slice(1, -1).replace(/\\(.)/gs, '$1');
	const bytes = [];
	for (let i = 0; i < s.length; i++)
	{
		if (s[i] === '%')
		{
			const hex = s.slice(i + 1, i + 3);
			if (!/^[0-9A-Fa-f]{2}$/.test(hex))
				throw new Error(`"%" not followed by two hex digits at offset ${i}`);
			bytes.push(parseInt(hex, 16));
			i += 2;
		}
		else
			bytes.push(s.charCodeAt(i) & 0xff);
	}
	return utf8.decode(Uint8Array.from(bytes));
}

function handle(req, body)
{
	const url = new URL(req.url, 'http://receiver');
	const rec = { path: url.pathname, webhook_id: req.headers['webhook-id'] ?? null };

	rec.verified = {};
	rec.verify_error = {};
	(secrets[url.pathname] || []).forEach((secret, i) => {
		try
		{
			new Webhook(secret).verify(body, req.headers);
			rec.verified[i] = true;
		}
		catch (e)
		{
			rec.verified[i] = false;
			rec.verify_error[i] = String(e.message || e);
		}
	});

	try
	{
		const ev = HTTP.toEvent({ headers: req.headers, body: body.toString('utf8') });
		rec.ce = {};
		for (const k of ['id', 'type', 'source', 'subject', 'time', 'specversion', 'data', 'traceparent', 'tracestate'])
			rec.ce[k] = ev[k] ?? null;
		rec.ce_error = null;
	}
	catch (e)
	{
		rec.ce = null;
		rec.ce_error = String(e.message || e);
	}

	rec.ce_decoded = {};
	rec.ce_decode_error = {};
	for (const k of ['id', 'type', 'source', 'subject'])
	{
		const v = req.headers[`ce-${k}`];
		if (v === undefined)
			continue;
		try
		{
			rec.ce_decoded[k] = decodeHeaderValue(v);
		}
		catch (e)
		{
			rec.ce_decoded[k] = null;
			rec.ce_decode_error[k] = String(e.message || e);
		}
	}

	rec.raw_headers = {};
	for (let i = 0; i < req.rawHeaders.length; i += 2)
	{
		const name = req.rawHeaders[i].toLowerCase();
		const value = latin1ToUtf8(req.rawHeaders[i + 1]);
		const seen = rec.raw_headers[name];
		rec.raw_headers[name] = seen === undefined ? value : [].concat(seen, value);
	}
	rec.body = body.toString('utf8');
	return rec;
}

const server = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', () => {
		if (req.method !== 'POST')
		{
			res.writeHead(405).end();
			return;
		}
		let status = 200;
		try
		{
			const rec = handle(req, Buffer.concat(chunks));
			const m = /^\/status\/([1-5]\d\d)$/.exec(rec.path);
			if (m)
				status = Number(m[1]);
			rec.status = status;
			fs.appendFileSync(opt.log, JSON.stringify(rec) + '\n');
		}
		catch (e)
		{
			status = 500;
			fs.appendFileSync(opt.log, JSON.stringify({ path: req.url, internal_error: String(e.stack || e) }) + '\n');
		}
		res.writeHead(status, { 'Content-Type': 'text/plain' }).end('ok\n');
	});
});

server.on('error', (e) => {
	console.error(`receiver: ${e.code || ''} ${e.message}`);
	process.exit(e.code === 'EADDRINUSE' ? 98 : 1);
});

server.listen(Number(opt.port), '127.0.0.1', () => {
	const port = server.address().port;
	if (opt['port-file'])
		fs.writeFileSync(opt['port-file'], `${port}\n`);
	console.log(`receiver listening on 127.0.0.1:${port}`);
});

// go away with the test that started us, even if it could not stop us
if (opt['watch-pid'])
{
	const pid = Number(opt['watch-pid']);
	setInterval(() => {
		try
		{
			process.kill(pid, 0);
		}
		catch
		{
			process.exit(0);
		}
	}, 500).unref();
}
process.on('SIGTERM', () => process.exit(0));
