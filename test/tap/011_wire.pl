# Copyright: outbox_dispatcher contributors
#
# 011_wire.pl — what the workers put on the wire (docs/reference.md §9,
# "Delivery on the wire").
#
# Proves, for requests received by the HTTP sink:
#   - POST to the endpoint URL (path and query string kept);
#   - Content-Type: application/json (exactly one value), Idempotency-Key =
#     id, CloudEvents binary mode: ce-specversion 1.0, ce-id = id, ce-source
#     (default /postgresql/postgres/outbox, then outbox_dispatcher.source
#     after a reload), ce-type = event_type, ce-subject =
#     aggregate_type/aggregate_id, ce-time = created_at in RFC 3339 UTC;
#     X-Outbox-Attempt = the attempt number (1, then 2 on a retry);
#   - the endpoint's and the message's extra headers are sent, for messages
#     from outbox.enqueue() and from a plain INSERT;
#   - the body is byte for byte payload::text (non-ASCII included);
#   - with a signing secret: webhook-id = id, webhook-timestamp = Unix
#     seconds, webhook-signature = v1,base64(HMAC-SHA256(base64decode(secret
#     after "whsec_"), "id.timestamp.body")), recomputed for every attempt;
#     an unsigned endpoint sends no webhook-* header at all;
#   - ce-* values are percent-encoded (CloudEvents HTTP binding 3.1.3.2:
#     non-ASCII, space, '"', '%'), and outbox_dispatcher.message_id_prefix
#     goes before the id in Idempotency-Key, ce-id, webhook-id and the
#     signed content; a prefix with a space is refused;
#   - after rotate_secret(), webhook-signature is "v1,<new> v1,<old>" for
#     the grace period, and only the new one with grace 0;
#   - a traceparent/tracestate set with SET LOCAL in the producer's
#     transaction is sent as traceparent/tracestate and ce-traceparent/
#     ce-tracestate, and not for the next transaction's messages;
#   - redirects are not followed: a 302 with a Location makes the message
#     dead (nothing reaches the Location), and so do 300/301/303/307/308.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64 decode_base64);

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled sql_quote);




# The request bodies are decoded character strings; compare as UTF-8 bytes.
sub body_bytes
{
	my ($req) = @_;
	my $b = $req->{body};
	utf8::encode($b);
	return $b;
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'wire', init => [ '--encoding=UTF8', '--locale=C' ], conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 200ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 100ms
});

my $sink = OdSink->start($node->basedir);

my $key = pack('C*', map { ($_ * 37 + 11) % 256 } 0 .. 31);
my $secret = 'whsec_' . encode_base64($key, '');

my $plain_url = $sink->url('/plain') . '?v=2&tenant=acme';
my $signed_url = $sink->url('/signed');
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.endpoints (name, url, headers)
     VALUES ('plain', '$plain_url', '{"Authorization": "Bearer t0k3n", "X-Tenant": "acme"}');
INSERT INTO outbox.endpoints (name, url, headers, signing_secret)
     VALUES ('signed', '$signed_url', '{"X-Env": "test"}', '$secret');
});

# ------------------------------------------------------------------ unsigned endpoint
# non-ASCII, nested, numbers with trailing zeros, null, booleans: jsonb text
my $payload = '{"order": 1001, "note": "grüße ✓ \"quoted\"", "total": 42.50, '
  . '"items": [{"sku": "x", "qty": 2}], "nested": {"a": null, "b": true}}';
my $id1 = $node->safe_psql(
	'postgres', 'SELECT outbox.enqueue(' . join(', ',
		sql_quote('order'), sql_quote('1001'), sql_quote('order.created'),
		sql_quote($payload) . '::jsonb', sql_quote('plain'), 'false', 'now()',
		sql_quote('{"X-Trace-Id": "abc-123", "X-Request-Source": "checkout"}') . '::jsonb') . ')');
# the same through a plain INSERT with headers
my $id2 = $node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, headers)
     VALUES ('customer', 'c/42', 'customer.updated', '{"name": "Ada", "vip": false}', 'plain',
             '{"X-Trace-Id": "def-456"}')
  RETURNING id});

ok($sink->wait_requests(2, path => '/plain', timeout => 20), 'two requests reached /plain');
ok(poll_until($node, "SELECT count(*) FROM outbox.messages WHERE id IN ($id1, $id2) AND status = 'done'",
		'2', 20), 'both unsigned messages are done');

my %row;
for my $id ($id1, $id2)
{
	my ($et, $at, $ag, $created, $body) = split /\|/, $node->safe_psql(
		'postgres', qq{
SELECT event_type, aggregate_type, aggregate_id,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
       payload::text
  FROM outbox.messages WHERE id = $id}), 5;
	$row{$id} = { event_type => $et, aggregate_type => $at, aggregate_id => $ag,
		ce_time => $created, body => $body };
}

my $plain = $sink->requests('/plain');
is(scalar @$plain, 2, 'exactly two requests on /plain (no retry, no duplicate)');
my %req_by_id = map { (OdSink::header($_, 'Idempotency-Key') // '') => $_ } @$plain;
ok($req_by_id{$id1} && $req_by_id{$id2}, "Idempotency-Key values are the ids $id1 and $id2");

for my $id ($id1, $id2)
{
	my $r = $req_by_id{$id} or next;
	my $m = $row{$id};
	my $h = sub { OdSink::header($r, $_[0]) };
	is($r->{method}, 'POST', "$id: method POST");
	is($r->{query}, 'v=2&tenant=acme', "$id: query string of the endpoint URL kept");
	is($h->('Content-Type'), 'application/json', "$id: Content-Type application/json (one value)");
	is($h->('Idempotency-Key'), $id, "$id: Idempotency-Key = id");
	is($h->('ce-specversion'), '1.0', "$id: ce-specversion 1.0");
	is($h->('ce-id'), $id, "$id: ce-id = id");
	is($h->('ce-source'), '/postgresql/postgres/outbox', "$id: ce-source default /postgresql/postgres/outbox");
	is($h->('ce-type'), $m->{event_type}, "$id: ce-type = event_type ($m->{event_type})");
	is($h->('ce-subject'), "$m->{aggregate_type}/$m->{aggregate_id}",
		"$id: ce-subject = aggregate_type/aggregate_id");
	like($h->('ce-time') // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/,
		"$id: ce-time is RFC 3339");
	is($h->('ce-time'), $m->{ce_time}, "$id: ce-time = created_at ($m->{ce_time})");
	is($h->('X-Outbox-Attempt'), '1', "$id: X-Outbox-Attempt 1");
	is($h->('Authorization'), 'Bearer t0k3n', "$id: endpoint header Authorization sent");
	is($h->('X-Tenant'), 'acme', "$id: endpoint header X-Tenant sent");
	ok(body_bytes($r) eq $m->{body}, "$id: body is exactly payload::text")
	  or diag("body: " . body_bytes($r) . "\npayload::text: $m->{body}");
	my @wh = grep { /^webhook-/ } keys %{ $r->{headers_lc} };
	is(scalar @wh, 0, "$id: unsigned endpoint sends no webhook-* header") or diag("@wh");
}
is(OdSink::header($req_by_id{$id1}, 'X-Trace-Id'), 'abc-123', "$id1: message header X-Trace-Id sent (enqueue)");
is(OdSink::header($req_by_id{$id1}, 'X-Request-Source'), 'checkout', "$id1: message header X-Request-Source sent");
is(OdSink::header($req_by_id{$id2}, 'X-Trace-Id'), 'def-456', "$id2: message header X-Trace-Id sent (plain INSERT)");
like(body_bytes($req_by_id{$id1}), qr/grüße ✓/, "$id1: non-ASCII payload text arrives as UTF-8");

# ------------------------------------------------------------------ signed endpoint
# first attempt fails (503), the second succeeds: both must be signed, each
# with its own timestamp, and carry their attempt number
$sink->script({ path => '/signed', fail_first => 1, fail_status => 503, status => 200 });
my $spayload = '{"amount": 12.30, "currency": "EUR", "memo": "naïve café"}';
my $id3 = $node->safe_psql('postgres', 'SELECT outbox.enqueue(' . join(', ',
		sql_quote('invoice'), sql_quote('A-1'), sql_quote('invoice.issued'),
		sql_quote($spayload) . '::jsonb', sql_quote('signed')) . ')');
ok($sink->wait_requests(2, path => '/signed', timeout => 20), 'two attempts reached /signed');
ok(poll_until($node, "SELECT status || ' ' || attempts FROM outbox.messages WHERE id = $id3", 'done 2', 20),
	'signed message done after 2 attempts');
my $sbody = $node->safe_psql('postgres', "SELECT payload::text FROM outbox.messages WHERE id = $id3");
my $screated = $node->safe_psql('postgres',
	qq{SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') FROM outbox.messages WHERE id = $id3});

my $signed = $sink->requests('/signed');
is(scalar @$signed, 2, 'exactly two requests on /signed');
my $attempt = 0;
for my $r (@$signed)
{
	$attempt++;
	my $h = sub { OdSink::header($r, $_[0]) };
	my $what = "signed attempt $attempt";
	is($h->('Idempotency-Key'), $id3, "$what: Idempotency-Key = id");
	is($h->('X-Outbox-Attempt'), $attempt, "$what: X-Outbox-Attempt $attempt");
	is($h->('ce-time'), $screated, "$what: ce-time = created_at");
	is($h->('X-Env'), 'test', "$what: endpoint header sent");
	ok(body_bytes($r) eq $sbody, "$what: body is exactly payload::text");
	is($h->('webhook-id'), $id3, "$what: webhook-id = id");
	my $ts = $h->('webhook-timestamp') // '';
	like($ts, qr/^\d+$/, "$what: webhook-timestamp is integer Unix seconds");
	cmp_ok(abs($ts - $r->{t}), '<=', 30, "$what: webhook-timestamp ($ts) is the send time (arrival $r->{t})");
	my $expected = 'v1,' . encode_base64(hmac_sha256("$id3.$ts." . body_bytes($r), $key), '');
	is($h->('webhook-signature'), $expected,
		"$what: webhook-signature = v1,base64(HMAC-SHA256(key, id.timestamp.body))");
	# the key is the base64-decoded secret, not the secret string itself
	isnt($h->('webhook-signature'),
		'v1,' . encode_base64(hmac_sha256("$id3.$ts." . body_bytes($r), $secret), ''),
		"$what: signature is not keyed with the literal secret string");
}
is($signed->[0]{status}, 503, 'first signed attempt was answered 503');

# ------------------------------------------------------------------ ce-source from the GUC
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.source = 'urn:example:orders'});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.source', 'urn:example:orders', 10),
	'outbox_dispatcher.source reloaded');
ok(wait_workers_cycled($node), 'workers went through their loop after the reload');
my $id4 = $node->safe_psql('postgres',
	q{SELECT outbox.enqueue('order', '1002', 'order.created', '{"order": 1002}', 'plain')});
ok($sink->wait_requests(3, path => '/plain', timeout => 20), 'message after the reload delivered');
my ($r4) = grep { (OdSink::header($_, 'Idempotency-Key') // '') eq $id4 } @{ $sink->requests('/plain') };
is(OdSink::header($r4, 'ce-source'), 'urn:example:orders', 'ce-source follows outbox_dispatcher.source after reload');

# ------------------------------------------------------------------ percent-encoded ce-* values, id prefix
# CloudEvents HTTP binding 3.1.3.2: in ce-* values every byte outside
# U+0021..U+007E, and space, '"' and '%', is sent as %XX of its UTF-8 bytes;
# outbox_dispatcher.message_id_prefix goes before the id in every id header
# and in the signed content.
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.message_id_prefix = 'db1:'});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.message_id_prefix', 'db1:', 10), 'message_id_prefix reloaded');
ok(wait_workers_cycled($node), 'workers went through their loop after the reload');
$sink->script({ path => '/signed', status => 200 });
my $n_signed = scalar @{ $sink->requests('/signed') };
my $id5 = $node->safe_psql('postgres', 'SELECT outbox.enqueue(' . join(', ',
		sql_quote('ordre "x"'), sql_quote('é 100%'), sql_quote('commande.payée '),
		sql_quote('{"k": 1}') . '::jsonb', sql_quote('signed')) . ')');
ok($sink->wait_requests($n_signed + 1, path => '/signed', timeout => 20), 'the encoded message was delivered');
my ($r5) = grep { (OdSink::header($_, 'webhook-id') // '') eq "db1:$id5" } @{ $sink->requests('/signed') };
ok($r5, "webhook-id is db1:$id5");
is(OdSink::header($r5, 'Idempotency-Key'), "db1:$id5", 'Idempotency-Key carries the prefix');
is(OdSink::header($r5, 'ce-id'), "db1:$id5", 'ce-id carries the prefix');
is(OdSink::header($r5, 'ce-type'), 'commande.pay%C3%A9e%20', 'ce-type: é and the trailing space percent-encoded');
is(OdSink::header($r5, 'ce-subject'), 'ordre%20%22x%22/%C3%A9%20100%25', 'ce-subject: space, ", é and % percent-encoded');
is(OdSink::header($r5, 'ce-source'), 'urn:example:orders', 'ce-source without such bytes is unchanged');
{
	my $ts = OdSink::header($r5, 'webhook-timestamp') // '';
	is(OdSink::header($r5, 'webhook-signature'),
		'v1,' . encode_base64(hmac_sha256("db1:$id5.$ts." . body_bytes($r5), $key), ''),
		'the signature covers the prefixed id');
}
my ($bad) = $node->psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.message_id_prefix = 'db 1'});
isnt($bad, 0, 'a prefix with a space is refused');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox_dispatcher.message_id_prefix});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.message_id_prefix', '', 10), 'message_id_prefix reset');

# ------------------------------------------------------------------ secret rotation
# rotate_secret(): during the grace period one webhook-signature header
# carries a signature per valid secret, the new one first; grace 0 drops
# the old one at once.
my $key2 = pack('C*', map { ($_ * 53 + 7) % 256 } 0 .. 31);
my $secret2 = 'whsec_' . encode_base64($key2, '');
my $key3 = pack('C*', map { ($_ * 91 + 3) % 256 } 0 .. 31);
my $secret3 = 'whsec_' . encode_base64($key3, '');
sub signed_once
{
	my ($what) = @_;
	my $n = scalar @{ $sink->requests('/signed') };
	my $id = $node->safe_psql('postgres',
		"SELECT outbox.enqueue('invoice', 'rot', 'invoice.issued', '{\"r\": \"$what\"}', 'signed')");
	ok($sink->wait_requests($n + 1, path => '/signed', timeout => 20), "$what: delivered");
	my ($r) = grep { (OdSink::header($_, 'webhook-id') // '') eq $id } @{ $sink->requests('/signed') };
	my $ts = OdSink::header($r, 'webhook-timestamp') // '';
	my $sig = sub { 'v1,' . encode_base64(hmac_sha256("$id.$ts." . body_bytes($r), $_[0]), '') };
	return (OdSink::header($r, 'webhook-signature') // '', $sig);
}
like($node->safe_psql('postgres', "SELECT outbox.rotate_secret('signed', '$secret2', '1 hour') - now()"),
	qr/^01:00:00/, 'rotate_secret returns the end of the grace period');
ok(wait_workers_cycled($node), 'workers went through their loop after the rotation');
{
	my ($header, $sig) = signed_once('rotation');
	is($header, $sig->($key2) . ' ' . $sig->($key), 'during the grace period: new signature, space, old signature');
}
$node->safe_psql('postgres', "SELECT outbox.rotate_secret('signed', '$secret3', '0 seconds')");
ok(wait_workers_cycled($node), 'workers went through their loop after the second rotation');
{
	my ($header, $sig) = signed_once('no grace');
	is($header, $sig->($key3), 'grace 0: only the new secret signs');
}
$node->safe_psql('postgres', "UPDATE outbox.endpoints SET signing_secret = '$secret' WHERE name = 'signed'");

# ------------------------------------------------------------------ trace context
# SET LOCAL outbox_dispatcher.traceparent/.tracestate in the producer's
# transaction: stored with the message, sent on every attempt as
# traceparent/tracestate and as the CloudEvents attributes ce-traceparent/
# ce-tracestate (percent-encoded like every ce-* value).
{
	my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
	my $n = scalar @{ $sink->requests('/plain') };
	my $tid = $node->safe_psql('postgres', qq{
BEGIN;
SET LOCAL outbox_dispatcher.traceparent = '$tp';
SET LOCAL outbox_dispatcher.tracestate = 'congo=t61rcWkgMzE, rojo=00f0';
SELECT outbox.enqueue('order', 'traced', 'order.created', '{}', 'plain');
COMMIT;});
	ok($sink->wait_requests($n + 1, path => '/plain', timeout => 20), 'traced message delivered');
	my ($r) = grep { (OdSink::header($_, 'Idempotency-Key') // '') eq $tid } @{ $sink->requests('/plain') };
	is(OdSink::header($r, 'traceparent'), $tp, 'traceparent header sent');
	is(OdSink::header($r, 'tracestate'), 'congo=t61rcWkgMzE, rojo=00f0', 'tracestate header sent');
	is(OdSink::header($r, 'ce-traceparent'), $tp, 'ce-traceparent (CloudEvents distributed tracing)');
	is(OdSink::header($r, 'ce-tracestate'), 'congo=t61rcWkgMzE,%20rojo=00f0', 'ce-tracestate, percent-encoded');
	my $untraced = $node->safe_psql('postgres',
		q{SELECT outbox.enqueue('order', 'untraced', 'order.created', '{}', 'plain')});
	ok($sink->wait_requests($n + 2, path => '/plain', timeout => 20), 'next message delivered');
	my ($u) = grep { (OdSink::header($_, 'Idempotency-Key') // '') eq $untraced } @{ $sink->requests('/plain') };
	ok($u, 'the untraced request was received');
	ok(!defined OdSink::header($u, 'traceparent') && !defined OdSink::header($u, 'ce-traceparent'),
		'SET LOCAL ended with the transaction: the next message carries no trace context');
}

# ------------------------------------------------------------------ redirects are not followed
my $elsewhere = $sink->url('/elsewhere');
my @redirects = (302, 300, 301, 303, 307, 308);
for my $st (@redirects)
{
	$sink->script({ path => "/r$st", status => $st, location => $elsewhere, body => 'moved' });
	$node->safe_psql('postgres',
		"INSERT INTO outbox.endpoints (name, url) VALUES ('r$st', '" . $sink->url("/r$st") . "')");
}
my %rid;
for my $st (@redirects)
{
	$rid{$st} = $node->safe_psql('postgres',
		"SELECT outbox.enqueue('order', 'redir-$st', 'order.created', '{\"s\": $st}', 'r$st')");
}
my $rids = join(',', values %rid);
ok(poll_until($node, "SELECT count(*) FROM outbox.messages WHERE id IN ($rids) AND status = 'dead'",
		scalar(@redirects), 20),
	'every 3xx answer makes its message dead');
for my $st (@redirects)
{
	my ($status, $attempts, $http, $err) = split /\|/, $node->safe_psql('postgres',
		"SELECT status, attempts, last_http_status, last_error FROM outbox.messages WHERE id = $rid{$st}");
	is("$status $attempts $http", "dead 1 $st", "HTTP $st: dead after 1 attempt, last_http_status $st");
	like($err, qr/\b$st\b/, "HTTP $st: last_error names the status ($err)");
	is($sink->stats("/r$st")->{by_path}{"/r$st"}, 1, "HTTP $st: exactly one request sent");
}
is($sink->stats->{by_path}{'/elsewhere'} // 0, 0, 'no request followed a Location header to /elsewhere');

$sink->stop;
$node->stop;
done_testing();
