# Copyright: outbox_dispatcher contributors
#
# 034_hostile_input.pl — hostile and bad input: a clear error at
# enqueue/endpoint time with nothing changed, or a safe classification at
# delivery time; never a crash.
#
# Every refused statement is checked with like() on its error text and with
# a fingerprint of outbox.endpoints and outbox.messages (count + md5 of every
# row) taken before and after it, on a settled queue.
#
#  1. payload size (outbox_dispatcher.max_payload_bytes = 4096, measured as
#     octet_length(payload::text)): exactly 4096 bytes is accepted and
#     delivered with a byte-identical body, also when made of 2-byte UTF-8
#     characters (2053 characters); 4097 bytes is refused ("payload is too
#     large: 4097 bytes"), through enqueue() and a plain INSERT, and also
#     when it is only 2054 characters (bytes count, not characters).
#  2. deeply nested JSON: 1000 levels of arrays is accepted and delivered
#     byte-identical; 10000 levels (20000 bytes) is refused as too large,
#     and accepted and delivered byte-identical by a session that raised
#     max_payload_bytes; 100000 levels is a clear PostgreSQL error (stack
#     depth) and changes nothing.
#  3. headers: invalid UTF-8 (E'\xff', convert_from) and \u0000 are refused
#     by PostgreSQL itself; header names with a space or a colon, values with
#     CR/LF, LF alone or a control character, are refused for message headers
#     (enqueue() and INSERT) and endpoint headers (INSERT and UPDATE); CR/LF in
#     aggregate_id / event_type (sent as ce-subject / ce-type) is refused;
#     a valid non-ASCII UTF-8 value is accepted and arrives as those bytes.
#  4. URLs: userinfo and fragments are refused (INSERT and UPDATE); an
#     IPv6 literal http://[::1]:PORT/v6 is accepted and delivered (a sink
#     listening on ::1); a 2048-byte URL is accepted and delivered with its
#     full path; 2049 bytes is refused; a host with percent-encoded CR/LF
#     (or another non-host character, or a broken %-escape) is refused.
#     Responses with a 150 KB header line (over libcurl's limit) are a
#     transport error: retried, then dead with a reason (the one
#     legitimate dead message of this file).
#  5. Retry-After on a 503 (then 200): negative, garbage, fractional, empty
#     and a past HTTP-date are ignored (retry after the normal backoff, never
#     later than backoff_cap); a huge value (99999999999999999999) is
#     clamped to max(backoff_cap, max_defer_age) = 1 day (available_at - now()
#     within a minute under 1 day), and the message is done after an operator
#     makes it available; a status outside 100-599 (999) is retried.
#  6. response bodies of 50 MB (status 500 with Retry-After 2, then 200; and
#     200 at once): the 500 is classified as a retry (last_http_status 500,
#     last_error at most ~300 bytes of the body, far below 1 KB), the 200 as
#     done (cut off on purpose, the status counts); the workers' VmRSS grows
#     by less than 20 MB.
#  7. after everything: the server answers, both workers run (same pids, or
#     restarted but present), the log has no "server process ... was
#     terminated" / "terminated by signal" / PANIC, and the invariant
#     (OdInvariant) holds over every delivered message.
#
# Settings: UTF8 database, 2 workers, poll_interval 100ms, backoff_base
# 50ms, backoff_cap 1s, lease 5s, endpoint timeouts 3s, max_attempts 10,
# max_payload_bytes 4096.
#
# Run: see 030_fault_endpoint_down.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until);

my $CAP_S = 1.0;

# ------------------------------------------------------------------ helpers

sub fingerprint
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM outbox.endpoints) || ' endpoints, '
       || (SELECT count(*) FROM outbox.messages) || ' messages, '
       || md5(coalesce((SELECT string_agg(e::text, '|' ORDER BY name) FROM outbox.endpoints AS e), '')
              || coalesce((SELECT string_agg(m::text, '|' ORDER BY id) FROM outbox.messages AS m), ''))});
}

# $sql must fail with an error matching $re, and change nothing.
sub refused
{
	my ($node, $label, $sql, $re) = @_;
	wait_settled($node, timeout => 30);
	my $before = fingerprint($node);
	my ($rc, $out, $err) = $node->psql('postgres', $sql);
	my ($line) = ($err // '') =~ /(ERROR:.*)/;
	isnt($rc, 0, "$label: refused");
	like($err, $re, "$label: error: " . ($line // '(none)'));
	is(fingerprint($node), $before, "$label: nothing changed");
	return;
}

# $sql (returning one message id) must succeed; returns the id
sub accepted
{
	my ($node, $label, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql);
	is($rc, 0, "$label: accepted") or diag($err);
	return $out;
}

sub enqueue_sql
{
	my ($endpoint, $payload_sql, $headers_sql) = @_;
	return "SELECT outbox.enqueue('test', 'x', 'test.event', $payload_sql, '$endpoint'"
	  . (defined $headers_sql ? ", headers => $headers_sql" : '') . ')';
}

# request bodies are decoded character strings; compare as UTF-8 bytes
sub body_bytes
{
	my ($req) = @_;
	my $b = $req->{body};
	utf8::encode($b);
	return $b;
}

sub wait_done
{
	my ($node, $id, $timeout) = @_;
	return poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', $timeout // 15);
}

sub vmrss_kb
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return undef;
	while (my $l = <$fh>) { return $1 if $l =~ /^VmRSS:\s+(\d+)\s+kB/; }
	return undef;
}

# A sink on ::1.  OdSink starts sink.py on 127.0.0.1 only; a wrapper in place
# of python3 loads sink.py with an AF_INET6 server and --host ::1, and the
# control API is then reached at http://[::1]:PORT.
sub start_sink_v6
{
	my ($dir) = @_;
	my $wrapper = "$dir/python_v6.py";
	open(my $fh, '>', $wrapper) or die "$wrapper: $!";
	print $fh <<'PY';
#!/usr/bin/python3
import importlib.util, socket, sys
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("od_sink_v6", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.SinkServer.address_family = socket.AF_INET6
sys.argv = [path] + sys.argv[2:] + ["--host", "::1"]
mod.main()
PY
	close $fh;
	chmod 0755, $wrapper;
	local $OdSink::PYTHON = $wrapper;
	my $s = OdSink->start($dir, name => 'sink_v6');
	$s->{base} = 'http://[::1]:' . $s->port;
	return $s;
}

{

	package MergedIds;

	sub new { my ($class, @parts) = @_; return bless { parts => \@parts }, $class; }

	sub ids
	{
		my ($self) = @_;
		my %m;
		for my $p (@{ $self->{parts} })
		{
			my $h = $p->ids;
			$m{$_} += $h->{$_} for keys %$h;
		}
		return \%m;
	}
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'hostile', init => [ '--encoding=UTF8', '--locale=C' ], conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 1000ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.max_attempts = 10
outbox_dispatcher.max_payload_bytes = 4096
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $sink = OdSink->start($node->basedir);
my $main_url = $sink->url('/main');
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('main', '$main_url', interval '3 s')");
ok(poll_until($node,
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 20),
	'two workers running');
my $pids_before = $node->worker_pids;
note("worker pids: $pids_before");

# one delivered request for message $id (on any path of $s)
sub delivered_request
{
	my ($s, $id) = @_;
	my $reqs = $s->requests(undef, id => $id);
	is(scalar @$reqs, 1, "message $id: exactly one request received");
	return $reqs->[0];
}

# ------------------------------------------------------------------ 1. payload size
{
	my $exact = q{('{"p": "' || repeat('x', 4087) || '"}')::jsonb};
	my $over = q{('{"p": "' || repeat('x', 4088) || '"}')::jsonb};
	my $exact_mb = q{('{"p": "' || repeat('é', 2043) || 'x"}')::jsonb};
	my $over_mb = q{('{"p": "' || repeat('é', 2043) || 'xx"}')::jsonb};
	is($node->safe_psql('postgres', "SELECT octet_length(($exact)::text), octet_length(($over)::text)"),
		'4096|4097', 'payload: the test payloads are 4096 and 4097 bytes as payload::text');
	is( $node->safe_psql('postgres',
			"SELECT octet_length(($exact_mb)::text), length(($exact_mb)::text), octet_length(($over_mb)::text), length(($over_mb)::text)"),
		'4096|2053|4097|2054', 'payload: the UTF-8 test payloads are 4096/4097 bytes, 2053/2054 characters');

	my $id = accepted($node, 'payload of exactly 4096 bytes', enqueue_sql('main', $exact));
	my $id_mb = accepted($node, 'payload of exactly 4096 bytes in 2053 characters', enqueue_sql('main', $exact_mb));
	refused($node, 'payload of 4097 bytes (enqueue)', enqueue_sql('main', $over),
		qr/payload is too large: 4097 bytes.*\n.*max_payload_bytes is 4096 bytes/);
	refused($node, 'payload of 4097 bytes (INSERT)',
		"INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint) VALUES ('t', 'x', 'e', $over, 'main')",
		qr/payload is too large: 4097 bytes/);
	refused($node, 'payload of 4097 bytes in 2054 characters', enqueue_sql('main', $over_mb),
		qr/payload is too large: 4097 bytes/);
	for my $m ([ $id, 'ASCII' ], [ $id_mb, 'UTF-8' ])
	{
		ok(wait_done($node, $m->[0]), "payload 4096 bytes ($m->[1]): delivered");
		my $r = delivered_request($sink, $m->[0]);
		my $want = $node->safe_psql('postgres', "SELECT payload::text FROM outbox.messages WHERE id = $m->[0]");
		is(length(body_bytes($r)), 4096, "payload 4096 bytes ($m->[1]): body is 4096 bytes");
		ok(body_bytes($r) eq $want, "payload 4096 bytes ($m->[1]): body byte-identical to payload::text");
	}
}

# ------------------------------------------------------------------ 2. deep nesting
{
	my $nest = sub { my ($n) = @_; return "(repeat('[', $n) || repeat(']', $n))::jsonb" };
	my $id = accepted($node, 'JSON nested 1000 levels', enqueue_sql('main', $nest->(1000)));
	ok(wait_done($node, $id), 'nested 1000: delivered');
	my $r = delivered_request($sink, $id);
	ok(body_bytes($r) eq ('[' x 1000) . (']' x 1000), 'nested 1000: body byte-identical (2000 bytes)');

	refused($node, 'JSON nested 10000 levels (20000 bytes)', enqueue_sql('main', $nest->(10000)),
		qr/payload is too large: 20000 bytes/);
	my $id2 = accepted($node, 'JSON nested 10000 levels, max_payload_bytes raised by the session',
		"SET outbox_dispatcher.max_payload_bytes = '1MB'; " . enqueue_sql('main', $nest->(10000)));
	ok(wait_done($node, $id2), 'nested 10000: delivered');
	$r = delivered_request($sink, $id2);
	ok(body_bytes($r) eq ('[' x 10000) . (']' x 10000), 'nested 10000: body byte-identical (20000 bytes)');
	refused($node, 'JSON nested 100000 levels',
		"SET outbox_dispatcher.max_payload_bytes = '1MB'; " . enqueue_sql('main', $nest->(100000)),
		qr/stack depth limit exceeded|exceeds the maximum/);
}

# ------------------------------------------------------------------ 3. headers
{
	my $ins = sub {
		my ($h) = @_;
		return "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, headers) "
		  . "VALUES ('t', 'x', 'e', '{}', 'main', $h)";
	};
	refused($node, 'header value with byte 0xff (literal)', enqueue_sql('main', q{'{}'}, q{E'{"X-A": "\xff"}'::jsonb}),
		qr/invalid byte sequence for encoding "UTF8": 0xff/);
	refused($node, 'header value with byte 0xff (convert_from)',
		enqueue_sql('main', q{'{}'}, q{jsonb_build_object('X-A', convert_from('\xff'::bytea, 'UTF8'))}),
		qr/invalid byte sequence for encoding "UTF8": 0xff/);
	refused($node, 'header value with \u0000', enqueue_sql('main', q{'{}'}, q{'{"X-A": "a\u0000b"}'::jsonb}),
		qr/unsupported Unicode escape sequence/);
	refused($node, 'header value with \u0001', enqueue_sql('main', q{'{}'}, q{'{"X-A": "a\u0001b"}'::jsonb}),
		qr/message headers: value of header "X-A" contains a control character/);
	refused($node, 'header value with DEL', enqueue_sql('main', q{'{}'}, q{'{"X-A": "a\u007fb"}'::jsonb}),
		qr/message headers: value of header "X-A" contains a control character/);
	refused($node, 'header name with a space (enqueue)', enqueue_sql('main', q{'{}'}, q{'{"X Bad": "v"}'::jsonb}),
		qr/message headers: header name "X Bad" contains a character not allowed in an HTTP header name/);
	refused($node, 'header name with a colon (enqueue)', enqueue_sql('main', q{'{}'}, q{'{"X-Bad:": "v"}'::jsonb}),
		qr/message headers: header name "X-Bad:" contains a character not allowed in an HTTP header name/);
	refused($node, 'header name with a colon (INSERT)', $ins->(q{'{"X-Bad: 1": "v"}'}),
		qr/header name "X-Bad: 1" contains a character not allowed/);
	refused($node, 'header value with CR/LF (enqueue)',
		enqueue_sql('main', q{'{}'}, q{'{"X-A": "v\r\nX-Injected: 1"}'::jsonb}),
		qr/message headers: value of header "X-A" contains a carriage return or line feed/);
	refused($node, 'header value with LF (INSERT)', $ins->(q{'{"X-A": "v\nX-Injected: 1"}'}),
		qr/value of header "X-A" contains a carriage return or line feed/);
	refused($node, 'header name with CR/LF', $ins->(q{'{"X-A\r\nX-Injected": "v"}'}),
		qr/header name "X-A\\r\\nX-Injected" contains a carriage return or line feed/);
	refused($node, 'endpoint header value with CR/LF (INSERT)',
		q{INSERT INTO outbox.endpoints (name, url, timeout, headers) VALUES ('bad', 'http://127.0.0.1:9/', '1 s', '{"X-A": "v\r\nX-B: 1"}')},
		qr/endpoint headers: value of header "X-A" contains a carriage return or line feed/);
	refused($node, 'endpoint header name with a space (UPDATE)',
		q{UPDATE outbox.endpoints SET headers = '{"X Y": "v"}' WHERE name = 'main'},
		qr/endpoint headers: header name "X Y" contains a character not allowed/);
	refused($node, 'aggregate_id with CR/LF (ce-subject)',
		q{SELECT outbox.enqueue('t', E'x\r\nX-Injected: 1', 'e', '{}', 'main')},
		qr/aggregate_id contains a carriage return or line feed/);
	refused($node, 'event_type with LF (ce-type)', q{SELECT outbox.enqueue('t', 'x', E'e\nX: 1', '{}', 'main')},
		qr/event_type contains a carriage return or line feed/);

	# valid UTF-8 outside ASCII is not a control character: sent as those bytes
	my $id = accepted($node, 'header value with non-ASCII UTF-8',
		enqueue_sql('main', q{'{}'}, q{'{"X-Note": "café ✓"}'::jsonb}));
	ok(wait_done($node, $id), 'non-ASCII header value: delivered');
	my $r = delivered_request($sink, $id);
	# the sink decodes header bytes as latin-1: one character per byte
	is(OdSink::header($r, 'X-Note') // '', "caf\xc3\xa9 \xe2\x9c\x93",
		'non-ASCII header value: arrives as its UTF-8 bytes');
}

# ------------------------------------------------------------------ 4. URLs
my $sink6 = start_sink_v6($node->basedir);
{
	my $port = $sink->port;
	refused($node, 'URL with userinfo',
		qq{INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://user:pw\@127.0.0.1:$port/x', '1 s')},
		qr/endpoint URL must not contain user information/);
	refused($node, 'URL with user only (UPDATE)',
		qq{UPDATE outbox.endpoints SET url = 'http://user\@127.0.0.1:$port/x' WHERE name = 'main'},
		qr/endpoint URL must not contain user information/);
	refused($node, 'URL with a fragment',
		qq{INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://127.0.0.1:$port/x#frag', '1 s')},
		qr/endpoint URL must not contain a fragment/);
	refused($node, 'URL with a fragment (UPDATE)',
		qq{UPDATE outbox.endpoints SET url = 'http://127.0.0.1:$port/x#' WHERE name = 'main'},
		qr/endpoint URL must not contain a fragment/);

	# IPv6 literal
	my $url6 = 'http://[::1]:' . $sink6->port . '/v6';
	is($node->psql('postgres', "INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('v6', '$url6', '3 s')"),
		0, "IPv6 literal URL $url6: accepted");
	my $id = accepted($node, 'message to the IPv6 endpoint', enqueue_sql('v6', q{'{"v": 6}'}));
	ok(wait_done($node, $id), 'IPv6 endpoint: delivered');
	my $reqs = $sink6->requests('/v6', id => $id);
	is(scalar @$reqs, 1, 'IPv6 endpoint: the sink on ::1 received it once');
	is($reqs->[0]{body} // '', '{"v": 6}', 'IPv6 endpoint: body');

	# 2048 bytes exactly, and one more
	my $base = $sink->url('/long/');
	my $long = $base . ('a' x (2048 - length($base)));
	is(length($long), 2048, 'long URL is 2048 bytes');
	is($node->psql('postgres', "INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('long', '$long', '3 s')"),
		0, 'URL of exactly 2048 bytes: accepted');
	refused($node, 'URL of 2049 bytes',
		"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('toolong', '${long}b', '1 s')",
		qr/endpoint URL is longer than 2048 bytes/);
	refused($node, 'URL of 2049 bytes (UPDATE)', "UPDATE outbox.endpoints SET url = '${long}b' WHERE name = 'long'",
		qr/endpoint URL is longer than 2048 bytes/);
	$id = accepted($node, 'message to the 2048-byte URL', enqueue_sql('long', q{'{}'}));
	ok(wait_done($node, $id), '2048-byte URL: delivered');
	my $r = delivered_request($sink, $id);
	is('http://127.0.0.1:' . $sink->port . $r->{path}, $long, '2048-byte URL: the full path arrived');
}

# ------------------------------------------------------------------ 4b. percent-encoded host, oversized response header
# - a host with percent-encoded CR/LF: RFC 3986 allows pct-encoded reg-names
#   and libcurl decodes them (it then rejects control characters with curl
#   error 3, so the Host header never carries them); the endpoint check
#   refuses a percent-encoding that does not decode to a host character,
#   rather than letting every message to it retry until dead.
# - responses with a 150 KB header line: libcurl refuses headers over
#   100 KB, a transport error, retried (max_attempts 10) while the next
#   sections run, then dead with a reason; nothing may crash.
my %undeliverable;
{
	my $port = $sink->port;
	refused($node, 'percent-encoded CR/LF in the host',
		"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('pct_host', 'http://127.0.0.1%0d%0aX-Injected%3a%201:$port/pct', '3 s')",
		qr/endpoint URL has a percent-encoded character not allowed in a host/);
	refused($node, 'percent-encoded slash in the host (UPDATE)',
		"UPDATE outbox.endpoints SET url = 'http://127.0.0.1%2f:$port/pct' WHERE name = 'main'",
		qr/endpoint URL has a percent-encoded character not allowed in a host/);
	refused($node, 'broken percent-encoding in the host',
		"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('pct_host', 'http://127.0.0.1%g0:$port/pct', '3 s')",
		qr/endpoint URL has an invalid percent-encoding in its host/);
	$sink->script({ path => '/bighdr', status => 503, headers => { 'X-Big' => 'a' x 150_000 } });
	$node->safe_psql('postgres',
		"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bighdr', '" . $sink->url('/bighdr') . "', '3 s')");
	$undeliverable{ $node->safe_psql('postgres', enqueue_sql('bighdr', q{'{"bighdr": 1}'})) } =
	  qr/after 10 attempts/;
}

# ------------------------------------------------------------------ 5. Retry-After
my %ra_case = (
	ra_negative => '-5',
	ra_garbage => 'soon, maybe',
	ra_fraction => '1.5',
	ra_exponent => '1e9',
	ra_empty => '',
	ra_past => 'Wed, 21 Oct 2015 07:28:00 GMT',
	ra_huge => '99999999999999999999',
);
my %ra_id;
{
	my @values;
	for my $name (sort keys %ra_case)
	{
		$sink->script({ path => "/$name", fail_first => 1, fail_status => 503, retry_after => $ra_case{$name},
				status => 200 });
		push @values, "('$name', '" . $sink->url("/$name") . "', '3 s')";
	}
	$sink->script({ path => '/status999', fail_first => 1, fail_status => 999, status => 200 });
	push @values, "('status999', '" . $sink->url('/status999') . "', '3 s')";
	$node->safe_psql('postgres', 'INSERT INTO outbox.endpoints (name, url, timeout) VALUES ' . join(', ', @values));
	for my $name (sort(keys %ra_case), 'status999')
	{
		$ra_id{$name} = $node->safe_psql('postgres',
			"SELECT outbox.enqueue('test', '$name', 'test.ra', '{\"case\": \"$name\"}', '$name')");
	}

	# huge: clamped to max(backoff_cap, max_defer_age) = 1 day
	ok( poll_until(
			$node,
			"SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $ra_id{ra_huge}",
			'pending|1|503', 15),
		'Retry-After huge: pending after the 503');
	my $delay = $node->safe_psql('postgres',
		"SELECT extract(epoch FROM available_at - now())::bigint FROM outbox.messages WHERE id = $ra_id{ra_huge}");
	cmp_ok($delay, '<=', 86400 + 5, "Retry-After huge: clamped to at most 1 day (+ slack): $delay s");
	cmp_ok($delay, '>=', 86400 - 60, 'Retry-After huge: honoured up to the clamp (about 1 day), not ignored');
	# an operator brings it forward
	$node->safe_psql('postgres',
		"UPDATE outbox.messages SET available_at = now() WHERE id = $ra_id{ra_huge} AND status = 'pending'");
	$node->safe_psql('postgres', 'SELECT outbox.wake()');

	for my $name (sort(keys %ra_case), 'status999')
	{
		ok(wait_done($node, $ra_id{$name}), "$name: done");
		my $reqs = $sink->requests("/$name", id => $ra_id{$name});
		is(join(' ', map { $_->{status} } @$reqs), ($name eq 'status999' ? '999' : '503') . ' 200',
			"$name: two requests (failure, then 200)");
		is($node->safe_psql('postgres', "SELECT attempts FROM outbox.messages WHERE id = $ra_id{$name}"),
			'2', "$name: attempts 2");
		next if $name eq 'ra_huge' || @$reqs < 2;
		my $gap = $reqs->[1]{t} - $reqs->[0]{t};
		cmp_ok($gap, '<=', $CAP_S + 0.5,
			sprintf('%s: retried after %.3f s, not later than backoff_cap (1 s) + slack',
				($name eq 'status999' ? 'status 999' : qq{$name (Retry-After: "$ra_case{$name}")}), $gap));
	}
}

# ------------------------------------------------------------------ 6. huge response bodies
{
	my $big = 50 * 1024 * 1024;
	$sink->script({ path => '/huge', fail_first => 1, fail_status => 500, fail_mode => 'huge_body',
			body_bytes => $big, retry_after => '2', status => 200 });
	$sink->script({ path => '/huge_ok', mode => 'huge_body', body_bytes => $big, status => 200 });
	$node->safe_psql('postgres',
		"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('huge', '" . $sink->url('/huge')
		  . "', '3 s'), ('huge_ok', '" . $sink->url('/huge_ok') . "', '3 s')");
	my @pids = split /,/, $node->worker_pids;
	my %rss_before = map { $_ => vmrss_kb($_) } @pids;
	note('VmRSS before (kB): ' . join(', ', map { "$_=" . ($rss_before{$_} // '?') } @pids));

	my @huge = split /,/, $node->safe_psql('postgres',
		q{SELECT string_agg(outbox.enqueue('test', 'huge' || g, 'test.huge', '{}', 'huge')::text, ',') FROM generate_series(1, 6) g});
	my @huge_ok = split /,/, $node->safe_psql('postgres',
		q{SELECT string_agg(outbox.enqueue('test', 'hugeok' || g, 'test.huge', '{}', 'huge_ok')::text, ',') FROM generate_series(1, 4) g});
	my $list = join(',', @huge);
	ok( poll_until(
			$node,
			"SELECT count(*) FROM outbox.messages WHERE id IN ($list) AND status = 'pending' AND attempts = 1 AND last_http_status = 500",
			scalar(@huge), 20),
		'huge body 500: classified as a retry (pending, attempts 1, last_http_status 500)');
	my ($maxlen, $err) = split /\|/, $node->safe_psql('postgres',
		"SELECT max(octet_length(last_error)), min(last_error) FROM outbox.messages WHERE id IN ($list)");
	cmp_ok($maxlen, '<=', 1024, "huge body 500: last_error holds at most 1 KB ($maxlen bytes)");
	like($err, qr/^HTTP 500: x+\.\.\.$/, 'huge body 500: last_error quotes a truncated prefix of the body');
	ok( poll_until(
			$node, "SELECT count(*) FROM outbox.messages WHERE id IN ($list, " . join(',', @huge_ok) . ") AND status = 'done'",
			scalar(@huge) + scalar(@huge_ok), 20),
		'huge bodies: every message done');
	is($node->safe_psql('postgres', "SELECT string_agg(DISTINCT attempts::text, ',') FROM outbox.messages WHERE id IN ($list)"),
		'2', 'huge body 500 then 200: attempts 2');
	is($node->safe_psql('postgres',
			'SELECT string_agg(DISTINCT attempts || \'/\' || last_http_status, \',\') FROM outbox.messages WHERE id IN ('
			  . join(',', @huge_ok) . ')'),
		'1/200', 'huge body 200: done at once (body cut off on purpose, the status counts)');
	my %rss_after = map { $_ => vmrss_kb($_) } @pids;
	note('VmRSS after (kB): ' . join(', ', map { "$_=" . ($rss_after{$_} // '?') } @pids));
	for my $pid (@pids)
	{
		next unless defined $rss_before{$pid} && defined $rss_after{$pid};
		cmp_ok($rss_after{$pid} - $rss_before{$pid}, '<', 20 * 1024,
			"worker $pid: VmRSS grew by less than 20 MB after 10 responses of 50 MB");
	}
}

# ------------------------------------------------------------------ 4b. (results)
for my $id (sort keys %undeliverable)
{
	ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'dead', 30),
		"undeliverable message $id: dead once its attempts are used up");
	my ($att, $err) = split /\|/, $node->safe_psql('postgres',
		"SELECT attempts, last_error FROM outbox.messages WHERE id = $id"), 2;
	is($att, 10, "undeliverable message $id: attempts 10");
	like($err, $undeliverable{$id}, "undeliverable message $id: last_error ($err)");
}
{
	my @inj = grep { exists $_->{headers_lc}{'x-injected'} } @{ $sink->requests };
	is(scalar @inj, 0, 'no request ever carried an injected header');
}

# ------------------------------------------------------------------ 7. still alive
ok(wait_settled($node, timeout => 30), 'everything settled');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server answers');
ok(poll_until($node,
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 10),
	'both workers are running');
my $pids_after = $node->worker_pids;
is($pids_after, $pids_before, "worker pids unchanged ($pids_after): no worker crashed or restarted");
my $log = slurp_file($node->logfile);
unlike($log, qr/server process .* was terminated|terminated by signal|PANIC/, 'no crash in the server log');
{
	my %wp = map { $_ => 1 } split /,/, "$pids_before,$pids_after";
	my @worker_errors = grep { /\[(\d+)\]/ && $wp{$1} } $log =~ /^(.*\b(?:ERROR|FATAL|PANIC):.*)$/mg;
	is(scalar @worker_errors, 0, 'no ERROR/FATAL from the workers in the log')
	  or diag(join("\n", @worker_errors[0 .. ($#worker_errors < 4 ? $#worker_errors : 4)]));
}

check_invariant($node, MergedIds->new($sink, $sink6),
	scenario => 'hostile input',
	dead_ok => sub { my ($r) = @_; $undeliverable{ $r->{id} } && $r->{last_error} =~ $undeliverable{ $r->{id} } },
	dup_reason => 'scripted failures (a 503/999/500 before the 200 for the Retry-After and huge-body cases, '
	  . 'and every attempt of the undeliverable 150 KB-header message); not duplicates of a success');

# successful deliveries per id: exactly one 2xx per message
{
	my %succ;
	for my $s ($sink, $sink6)
	{
		for my $r (@{ $s->requests })
		{
			my $id = OdSink::header($r, 'Idempotency-Key') // next;
			$succ{$id}++ if ($r->{status} // 0) >= 200 && $r->{status} < 300;
		}
	}
	my @ids = split /\n/, $node->safe_psql('postgres', 'SELECT id FROM outbox.messages ORDER BY id');
	my @bad = grep { ($succ{$_} // 0) != ($undeliverable{$_} ? 0 : 1) } @ids;
	is(scalar @bad, 0, 'exactly one successful (2xx) delivery per delivered message, none for the dead ('
		  . scalar(@ids) . ' messages)')
	  or diag("@bad");
}

$sink6->stop;
$sink->stop;
$node->stop;
done_testing();
