# Copyright: outbox_dispatcher contributors
#
# 012_outcomes.pl — every row of the outcome table (shared/design.md,
# "Outcome of one delivery"), end to end through the background workers.
#
# Proves, one endpoint (sink path) per case, all running concurrently:
#   - 200/201/204 → done after 1 attempt, last_http_status recorded,
#     last_error NULL;
#   - 410 Gone → the endpoint is disabled and the message goes back to
#     pending with its attempt refunded (0.2.0), one request only;
#   - 400/401/404/422 → dead after 1 attempt, one request only,
#     last_http_status and a last_error naming the status and quoting the body;
#   - 503 twice then 200 → done with attempts 3 (X-Outbox-Attempt 1, 2, 3);
#     408, 425, 500, 502, 504 → retried (done with attempts 2); connection
#     reset and empty reply twice, then 200 → done with attempts 3 (each on
#     a sink of its own: see the comment at %case_sink);
#   - 429 with Retry-After: 2 → pending with last_http_status 429, and the
#     next attempt arrives no earlier than 2 s after the 429 (sink arrival
#     times), although the backoff alone would retry within milliseconds;
#   - a status in the endpoint's defer_statuses (409) → pending with the
#     attempt refunded (attempts back to 0 after every defer), available_at
#     postponed by defer_delay (1 s: gaps between the deferred requests are
#     >= 1 s), every deferred request is X-Outbox-Attempt 1; after the sink
#     switches to 200 → done with attempts 1;
#   - a deferred message older than max_defer_age → dead with a last_error
#     saying so;
#   - timeout (sink hangs longer than the endpoint timeout of 1 s) → retried,
#     last_error mentions the timeout, done on the 3rd attempt;
#   - attempts exhausted (always 503, max_attempts = 3) → dead with attempts
#     3 after exactly 3 requests;
#   - connection refused (closed port) → retried, then dead with attempts 3
#     and a connect error;
#   - worker_stats counts delivered, retried, deferred and dead.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;

use OdNode;
use OdSink;
use OdTest qw(poll_until);


# requests the sink recorded for message $id on $path, in arrival order
sub reqs_for
{
	my ($sink, $path, $id) = @_;
	return $sink->requests($path, id => $id);
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'outcomes', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 3
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 1s
outbox_dispatcher.max_defer_age = 3600
});

my $sink = OdSink->start($node->basedir);

# name => [sink script (path added), expected "status|attempts|last_http_status",
#          expected requests, last_error regex or undef for NULL]
my %cases = (
	ok200 => [ { status => 200 }, 'done|1|200', 1, undef ],
	ok201 => [ { status => 201 }, 'done|1|201', 1, undef ],
	ok204 => [ { status => 204 }, 'done|1|204', 1, undef ],
	bad400 => [ { status => 400, body => 'missing field total' }, 'dead|1|400', 1,
		qr/^HTTP 400: missing field total$/ ],
	unauth401 => [ { status => 401, body => 'bad token' }, 'dead|1|401', 1, qr/^HTTP 401: bad token$/ ],
	nf404 => [ { status => 404, body => '{"error":"no such order"}' }, 'dead|1|404', 1,
		qr/^HTTP 404: \{"error":"no such order"\}$/ ],
	gone410 => [ { status => 410 }, 'pending|0|410', 1, qr/^HTTP 410 Gone: the endpoint was disabled$/ ],
	unproc422 => [ { status => 422 }, 'dead|1|422', 1, qr/^HTTP 422/ ],
	flaky503 => [ { fail_first => 2, fail_status => 503, status => 200 }, 'done|3|200', 3, undef ],
	r408 => [ { fail_first => 1, fail_status => 408, status => 200 }, 'done|2|200', 2, undef ],
	r425 => [ { fail_first => 1, fail_status => 425, status => 200 }, 'done|2|200', 2, undef ],
	r500 => [ { fail_first => 1, fail_status => 500, status => 200 }, 'done|2|200', 2, undef ],
	r502 => [ { fail_first => 1, fail_status => 502, status => 200 }, 'done|2|200', 2, undef ],
	r504 => [ { fail_first => 1, fail_status => 504, status => 200 }, 'done|2|200', 2, undef ],
	# reset and empty reply have a sink (host:port) of their own, see below
	reset => [ { fail_first => 2, fail_mode => 'reset', status => 200 }, 'done|3|200', 3, undef ],
	emptyreply => [ { fail_first => 2, fail_mode => 'close', status => 200 }, 'done|3|200', 3, undef ],
	exhausted => [ { status => 503, body => 'down for maintenance' }, 'dead|3|503', 3,
		qr/^HTTP 503 after 3 attempts: down for maintenance$/ ],
	timeout => [ { fail_first => 2, fail_mode => 'hang', status => 200 }, 'done|3|200', 3, undef ],
);

# libcurl re-sends a request by itself (same X-Outbox-Attempt, up to 5 times)
# when a *reused* keep-alive connection dies before any response byte, so a
# reset or empty reply on a pooled connection may never reach the
# dispatcher.  Connections are pooled per host:port and per worker: a sink
# of its own, whose connections all die, makes every attempt open a fresh
# connection, and each failure reach the outcome classification.
my %case_sink = (
	reset => OdSink->start($node->basedir, name => 'reset_sink'),
	emptyreply => OdSink->start($node->basedir, name => 'close_sink'));

my $refused_url = 'http://127.0.0.1:' . OdNode::closed_port() . '/nobody';

my @endpoints;
for my $name (sort keys %cases)
{
	my $s = $case_sink{$name} // $sink;
	$s->script({ %{ $cases{$name}[0] }, path => "/$name" });
	my $timeout = $name eq 'timeout' ? '1 s' : '10 s';
	push @endpoints, "('$name', '" . $s->url("/$name") . "', interval '$timeout', '{}')";
}
# 429 with Retry-After: 2, then 200
$sink->script({ path => '/ratelimited', fail_first => 1, fail_status => 429, retry_after => '2', status => 200 });
push @endpoints, "('ratelimited', '" . $sink->url('/ratelimited') . "', interval '10 s', '{}')";
# defer: 409 is "not yet"
$sink->script({ path => '/defer', status => 409, body => 'not ready' });
push @endpoints, "('defer', '" . $sink->url('/defer') . "', interval '10 s', '{409}')";
$sink->script({ path => '/defer_old', status => 409, body => 'still not ready' });
push @endpoints, "('defer_old', '" . $sink->url('/defer_old') . "', interval '10 s', '{409}')";
push @endpoints, "('refused', '$refused_url', interval '2 s', '{}')";

$node->safe_psql('postgres',
	'INSERT INTO outbox.endpoints (name, url, timeout, defer_statuses) VALUES ' . join(",\n", @endpoints));

# one message per endpoint, all in one transaction
my %id;
for my $name (sort(keys %cases), qw(ratelimited defer refused))
{
	$id{$name} = $node->safe_psql('postgres',
		"SELECT outbox.enqueue('case', '$name', 'test.$name', '{\"case\": \"$name\"}', '$name')");
}
# a message created two hours ago: past max_defer_age (1 h) at its first defer
$id{defer_old} = $node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, created_at)
     VALUES ('case', 'defer_old', 'test.defer_old', '{"case": "defer_old"}', 'defer_old',
             now() - interval '2 hours')
  RETURNING id});

# ------------------------------------------------------------------ intermediate states
# 429 + Retry-After: 2 → pending, attempt used, for about 2 s
ok( poll_until(
		$node,
		"SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $id{ratelimited}",
		'pending|1|429', 10),
	'429: message is pending with attempts 1 and last_http_status 429');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $id{ratelimited}"),
	qr/^HTTP 429/, '429: last_error names HTTP 429');
{
	my $avail = $node->safe_psql('postgres',
		"SELECT extract(epoch FROM available_at) FROM outbox.messages WHERE id = $id{ratelimited}");
	my $t429 = reqs_for($sink, '/ratelimited', $id{ratelimited})->[0]{t};
	cmp_ok($avail - $t429, '>=', 2.0,
		'429: available_at is at least Retry-After (2 s) after the 429 (not the 10-50 ms backoff)');
}

# timeout: the 2nd attempt is made after the 1st timed out, with the reason recorded
ok( poll_until(
		$node,
		"SELECT attempts >= 2 AND last_error ~* 'timeout' FROM outbox.messages WHERE id = $id{timeout}",
		't', 15),
	'timeout: message retried, last_error mentions the timeout');
note('timeout last_error: '
	  . $node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $id{timeout}"));

# connection refused: retried
ok( poll_until(
		$node,
		"SELECT attempts >= 2 AND last_error ~* 'connect' FROM outbox.messages WHERE id = $id{refused}",
		't', 15),
	'connection refused: message retried, last_error is a connect error');

# defer: every 409 sends the message back to pending with attempts 0
ok($sink->wait_requests(3, path => '/defer', timeout => 15), 'defer: at least three deferred requests');
ok( poll_until(
		$node, "SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $id{defer}",
		'pending|0|409', 10),
	'defer: message is pending with attempts refunded to 0 and last_http_status 409');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $id{defer}"),
	qr/^deferred: HTTP 409: not ready$/, 'defer: last_error says deferred, HTTP 409 and quotes the body');
{
	# available_at = finalize time + defer_delay, i.e. >= 1 s after the request that was deferred
	my $reqs = reqs_for($sink, '/defer', $id{defer});
	my $avail = $node->safe_psql('postgres',
		"SELECT extract(epoch FROM available_at) FROM outbox.messages WHERE id = $id{defer}");
	my $sent_before = (grep { $_->{t} < $avail } @$reqs)[-1];
	cmp_ok($avail - $sent_before->{t}, '>=', 1.0,
		'defer: available_at postponed by defer_delay (1 s) after the deferred request');
	my @gaps = map { $reqs->[$_]{t} - $reqs->[ $_ - 1 ]{t} } 1 .. $#$reqs;
	my @short = grep { $_ < 1.0 } @gaps;
	is(scalar @short, 0, 'defer: consecutive deferred requests are >= defer_delay (1 s) apart')
	  or diag('gaps: ' . join(', ', @gaps));
	my @att = map { OdSink::header($_, 'X-Outbox-Attempt') } @$reqs;
	is_deeply([ grep { $_ ne '1' } @att ], [], 'defer: every deferred request is X-Outbox-Attempt 1 (refunded)')
	  or diag("attempt headers: @att");
}
# the endpoint is ready now
my $deferred_before = scalar @{ reqs_for($sink, '/defer', $id{defer}) };
$sink->script({ path => '/defer', status => 200 });
ok(poll_until($node, "SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $id{defer}",
		'done|1|200', 10),
	'defer: after the sink switches to 200 the message is done with attempts 1');
is(scalar @{ reqs_for($sink, '/defer', $id{defer}) }, $deferred_before + 1,
	'defer: exactly one more request after the switch');

# ------------------------------------------------------------------ final states
my @all = grep { $_ ne 'gone410' } sort keys %id;
ok( poll_until($node, q{SELECT enabled || '|' || disabled_reason FROM outbox.endpoints WHERE name = 'gone410'},
		'false|HTTP 410 Gone received by the dispatcher', 30),
	'gone410: the endpoint was disabled, with the reason');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id{gone410}", 'pending', 30),
	'gone410: the message is pending again, not dead');
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . join(',', map { $id{$_} } @all)
		  . q{) AND status IN ('done', 'dead')},
		scalar(@all), 30),
	'every message reached a final state');

for my $name (sort keys %cases)
{
	my ($script, $expect, $nreq, $err_re) = @{ $cases{$name} };
	my ($state, $err) = split /\|\|/, $node->safe_psql('postgres',
		"SELECT concat_ws('|', status, attempts, last_http_status) || '||' || coalesce(last_error, '<null>')
		   FROM outbox.messages WHERE id = $id{$name}");
	is($state, $expect, "$name: status|attempts|last_http_status = $expect");
	if (defined $err_re)
	{
		like($err, $err_re, "$name: last_error ($err)");
	}
	else
	{
		is($err, '<null>', "$name: last_error cleared once done");
	}
	my $reqs = reqs_for($case_sink{$name} // $sink, "/$name", $id{$name});
	is(scalar @$reqs, $nreq, "$name: $nreq request(s) received");
	my @att = map { OdSink::header($_, 'X-Outbox-Attempt') } @$reqs;
	is_deeply(\@att, [ 1 .. $nreq ], "$name: X-Outbox-Attempt counts 1..$nreq");
	if ($cases{$name}[0]{fail_mode})
	{
		my @st = map { $_->{status} // 'none' } @$reqs;
		is("@st", 'none none 200', "$name: two transfers failed without an answer, then 200");
	}
}

# timeout: each timed-out attempt lasted the endpoint timeout (1 s) before the next one
{
	my $reqs = reqs_for($sink, '/timeout', $id{timeout});
	my @st = map { $_->{status} // 'none' } @$reqs;
	is("@st", 'none none 200', 'timeout: first two requests were never answered, third got 200');
	# the timeout runs from the start of the transfer, a little before the sink saw it;
	# without it the retry would follow within the 10-50 ms backoff
	cmp_ok($reqs->[1]{t} - $reqs->[0]{t}, '>=', 0.5,
		'timeout: the retry came after the 1 s endpoint timeout, not right away');
}

# 429 + Retry-After: 2
{
	my $reqs = reqs_for($sink, '/ratelimited', $id{ratelimited});
	is(scalar @$reqs, 2, '429: two requests');
	is($reqs->[0]{status}, 429, '429: first request answered 429');
	my $gap = $reqs->[1]{t} - $reqs->[0]{t};
	cmp_ok($gap, '>=', 1.95, "429: next attempt not earlier than Retry-After (2 s) after the 429 (gap $gap s)");
	is( $node->safe_psql('postgres',
			"SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $id{ratelimited}"),
		'done|2|200', '429: done with attempts 2');
}

# connection refused → dead once attempts are used up
{
	my ($state, $err) = split /\|\|/, $node->safe_psql('postgres',
		"SELECT concat_ws('|', status, attempts, coalesce(last_http_status::text, 'null')) || '||' || last_error
		   FROM outbox.messages WHERE id = $id{refused}");
	is($state, 'dead|3|null', 'connection refused: dead with attempts 3, no HTTP status');
	like($err, qr/^connect error after 3 attempts/, "connection refused: last_error ($err)");
}

# max_defer_age
{
	my ($state, $err) = split /\|\|/, $node->safe_psql('postgres',
		"SELECT concat_ws('|', status, attempts, last_http_status) || '||' || last_error
		   FROM outbox.messages WHERE id = $id{defer_old}");
	is($state, 'dead|0|409', 'deferred past max_defer_age: dead (attempt refunded), last_http_status 409');
	like($err, qr/max_defer_age.*HTTP 409/, "deferred past max_defer_age: last_error ($err)");
	is(scalar @{ reqs_for($sink, '/defer_old', $id{defer_old}) }, 1, 'deferred past max_defer_age: one request');
}

# ------------------------------------------------------------------ counters
my ($delivered, $retried, $deferred, $dead) = split /\|/, $node->safe_psql('postgres',
	'SELECT sum(delivered), sum(retried), sum(deferred), sum(dead) FROM outbox.worker_stats');
# done: ok200 ok201 ok204 flaky503 r408 r425 r500 r502 r504 reset emptyreply timeout ratelimited defer = 14
is($delivered, 14, 'worker_stats: 14 delivered');
# dead: 4 x 4xx + exhausted + refused (+ defer_old, finalized as a defer that the database made dead)
cmp_ok($dead, '>=', 6, "worker_stats: dead counted ($dead)");
# every attempt used but the last was a retry (defers refund theirs): flaky503 2,
# 408/425/500/502/504 5, reset and empty reply 4, exhausted 2, timeout 2, 429 1, refused 2
my $expected_retries = $node->safe_psql('postgres',
	'SELECT sum(greatest(attempts - 1, 0)) FROM outbox.messages');
is($expected_retries, 18, 'attempts used beyond the first, over all messages: 18');
# plus the 410, put back (attempt refunded) when its endpoint was disabled
is($retried, $expected_retries + 1, "worker_stats: $expected_retries retries (one per attempt used before the last) + the 410");
cmp_ok($deferred, '>=', 3, "worker_stats: deferrals counted ($deferred)");

$_->stop for ($sink, values %case_sink);
$node->stop;
done_testing();
