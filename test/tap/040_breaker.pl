# Copyright: outbox_dispatcher contributors
#
# 040_breaker.pl — the per-endpoint circuit breaker (src/endpoint_state.cpp,
# docs/operations.md "Circuit breaker, rate limit, max_in_flight and
# fairness"), end to end through the background workers.
#
# Proves, with 2 workers, endpoint "flaky" (sink answers 503,
# breaker_threshold 3, breaker_cooldown 2 s) and endpoint "steady" (200):
#   - one message, three consecutive 503s (X-Outbox-Attempt 1, 2, 3): then
#     outbox.endpoint_health shows state 'open', consecutive_failures 3,
#     trips 1, next_probe_at = opened_at + 2 s, last_http_status 503;
#   - while open, nothing of "flaky" is claimed or charged an attempt: over
#     the cool-down the sink sees no request on /flaky, the message's
#     attempts and lease_version stay put, and four messages enqueued while
#     open stay pending with attempts 0 and lease_version 0; meanwhile the
#     "steady" endpoint delivers every message committed (within 1 s each);
#   - after the cool-down exactly one probe goes out: state 'half_open' with
#     in_flight 1 while the (slow, 700 ms) probe is answered, the sink sees
#     one request, the other messages are not claimed alongside it;
#   - the probe fails (503): the breaker opens again for twice as long
#     (trips 2, next_probe_at = opened_at + 4 s), and during that cool-down
#     again no request goes out and no attempt is charged;
#   - the sink switches to 200: the next probe succeeds, state 'closed',
#     consecutive_failures 0, trips 0, and all five messages are delivered
#     with no duplicate (4 failed requests + 5 successful ones in all);
#   - an endpoint whose port refuses connections (threshold 3, cool-down
#     1 h) opens after 3 connect errors (last_error says so) and its
#     message's attempts stay at 3 from then on.
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

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'breaker', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 50
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/flaky', status => 503, body => 'down' });
my $refused_url = 'http://127.0.0.1:' . OdNode::closed_port() . '/nobody';
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, timeout, breaker_threshold, breaker_cooldown) VALUES
  ('flaky',   '" . $sink->url('/flaky') . "', '5 s', 3, '2 s'),
  ('steady',  '" . $sink->url('/steady') . "', '5 s', 3, '2 s'),
  ('refused', '$refused_url', '5 s', 3, '1 hour')");

sub health
{
	my ($ep, $cols) = @_;
	return $node->safe_psql('postgres', "SELECT $cols FROM outbox.endpoint_health WHERE endpoint = '$ep'");
}

sub flaky_requests { return $sink->stats->{by_path}{'/flaky'} // 0; }

# attempts and lease_version of every flaky message, as one string
sub flaky_rows
{
	return $node->safe_psql('postgres',
		q{SELECT string_agg(id || ':' || status || ':' || attempts || ':' || lease_version, ' ' ORDER BY id)
		    FROM outbox.messages WHERE endpoint = 'flaky'});
}

my $steady_before = 0;    # steady messages delivered by earlier watch_open() calls

# Watch "flaky" until $until (unix time, some margin before next_probe_at):
# no request may reach the sink and no message may change (attempts,
# lease_version, status).  Meanwhile every 0.3 s one message for "steady" is
# committed and must be delivered within 1 s.  Afterwards the sink's arrival
# times must show no /flaky request between $from and $until.  Returns (ok,
# why, samples, steady delays).
sub watch_open
{
	my ($from, $until, $label) = @_;
	my $req0 = flaky_requests();
	my $rows0 = flaky_rows();
	my ($samples, @delays) = (0);
	my $next_steady = time;
	while (time < $until)
	{
		if (time >= $next_steady)
		{
			my $t0 = time;
			my $id = $node->safe_psql('postgres',
				"SELECT outbox.enqueue('steady', 's', 'steady.tick', '{}', 'steady')");
			$sink->wait_requests(scalar(@delays) + 1 + $steady_before, path => '/steady', timeout => 1);
			my $got = $sink->requests('/steady', id => $id);
			return (0, "$label: steady message $id not delivered within 1 s", $samples, @delays) unless @$got;
			push @delays, $got->[0]{t} - $t0;
			$next_steady = time + 0.3;
		}
		last if time >= $until;
		my $req = flaky_requests();
		return (0, "$label: sink received $req requests on /flaky (was $req0)", $samples, @delays)
		  if $req != $req0;
		my $rows = flaky_rows();
		return (0, "$label: messages changed: [$rows0] -> [$rows]", $samples, @delays) if $rows ne $rows0;
		$samples++;
		sleep 0.02;
	}
	my @early = grep { $_->{t} > $from && $_->{t} < $until } @{ $sink->requests('/flaky') };
	return (0, sprintf('%s: %d /flaky request(s) arrived while open, at %s', $label, scalar @early,
			join(' ', map { sprintf '%.3f', $_->{t} - $from } @early)), $samples, @delays)
	  if @early;
	$steady_before += @delays;
	return (1, '', $samples, @delays);
}
# ------------------------------------------------------------------ open after 3 failures
my $m1 = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', '1', 'order.created', '{"n": 1}', 'flaky')});
my $rid = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'r', 'order.created', '{"n": 0}', 'refused')});

ok(poll_until($node, q{SELECT state FROM outbox.endpoint_health WHERE endpoint = 'flaky'}, 'open', 10),
	'flaky: breaker open after consecutive 503s');
my $t_open = time;
is(health('flaky', 'consecutive_failures, trips, last_http_status'), '3|1|503',
	'flaky: consecutive_failures 3, trips 1, last_http_status 503');
is(flaky_requests(), 3, 'flaky: exactly 3 requests before the breaker opened');
is_deeply([ map { OdSink::header($_, 'X-Outbox-Attempt') } @{ $sink->requests('/flaky') } ], [ 1, 2, 3 ],
	'flaky: the three requests were attempts 1, 2, 3');
my ($cool1, $probe_in) = split /\|/, health('flaky',
	q{round(extract(epoch FROM next_probe_at - opened_at), 2),
	  extract(epoch FROM next_probe_at - clock_timestamp())});
my $probe_at = time + $probe_in;
cmp_ok(abs($cool1 - 2), '<', 0.01, "flaky: first cool-down is breaker_cooldown (next_probe_at - opened_at = $cool1 s)");
is($node->safe_psql('postgres', "SELECT status, attempts FROM outbox.messages WHERE id = $m1"), 'pending|3',
	'flaky: the message is pending with 3 attempts used');

# ------------------------------------------------------------------ while open: nothing claimed
# four more messages, enqueued while the breaker is open
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'flaky'))
	    FROM generate_series(2, 5) AS g});
# slow failing answers from now on, so that the probe can be watched
$sink->script({ path => '/flaky', status => 503, body => 'still down', delay_ms => 700 });
{
	my ($ok, $why, $samples, @delays) = watch_open($sink->requests('/flaky')->[-1]{t}, $probe_at - 0.15, 'first cool-down');
	ok($ok, "first cool-down: no request on /flaky, no attempt charged, no claim ($samples samples)")
	  or diag($why);
	cmp_ok(scalar @delays, '>=', 2, 'first cool-down: "steady" delivered ' . scalar(@delays) . ' messages meanwhile');
	note(sprintf('steady delays during the first cool-down: %s', join(' ', map { sprintf '%.3f', $_ } @delays)));
}
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.messages
		   WHERE endpoint = 'flaky' AND status = 'pending' AND attempts = 0 AND lease_version = 0}),
	'4', 'first cool-down: the 4 messages enqueued while open were never claimed');

# ------------------------------------------------------------------ half-open: one probe
ok(poll_until($node, q{SELECT state, in_flight FROM outbox.endpoint_health WHERE endpoint = 'flaky'},
		'half_open|1', 5),
	'flaky: after the cool-down the breaker is half-open with one request in flight');
my $t_probe = time;
cmp_ok($t_probe - $t_open, '>=', 1.7, sprintf('flaky: the probe came after the cool-down (%.2f s after open)', $t_probe - $t_open));
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'flaky' AND status = 'processing'}),
	'1', 'half-open: exactly one message claimed (the probe)');
ok(poll_until($node, q{SELECT state, trips FROM outbox.endpoint_health WHERE endpoint = 'flaky'}, 'open|2', 5),
	'flaky: the failed probe opened the breaker again (trips 2)');
my $t_open2 = time;
is(flaky_requests(), 4, 'flaky: exactly one probe request was sent');
my ($cool2, $cf2, $probe_in2) = split /\|/, health('flaky',
	q{round(extract(epoch FROM next_probe_at - opened_at), 2), consecutive_failures,
	  extract(epoch FROM next_probe_at - clock_timestamp())});
my $probe_at2 = time + $probe_in2;
cmp_ok(abs($cool2 - 4), '<', 0.01, "flaky: second cool-down doubled (next_probe_at - opened_at = $cool2 s)");
is($cf2, 4, 'flaky: consecutive_failures 4');
is( $node->safe_psql('postgres', q{SELECT sum(attempts) FROM outbox.messages WHERE endpoint = 'flaky'}),
	'4', 'flaky: the probe charged one attempt (3 + 1), nothing else was charged');

# the probe is answered 200 from now on; still nothing may go out before next_probe_at
$sink->script({ path => '/flaky', status => 200 });
{
	my ($ok, $why, $samples, @delays) = watch_open($sink->requests('/flaky')->[-1]{t}, $probe_at2 - 0.15, 'second cool-down');
	ok($ok, "second cool-down: no request on /flaky, no attempt charged ($samples samples)") or diag($why);
	cmp_ok(scalar @delays, '>=', 4, 'second cool-down: "steady" delivered ' . scalar(@delays) . ' messages meanwhile');
}

# ------------------------------------------------------------------ probe succeeds: closed
ok( poll_until(
		$node,
		q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'flaky' AND status = 'done'}, '5', 10),
	'flaky: all five messages delivered after the successful probe');
my $t_done = time;
cmp_ok($t_done - $t_open2, '>=', 3.5, sprintf('flaky: not before the second cool-down (%.2f s after it opened)', $t_done - $t_open2));
is(health('flaky', 'state, consecutive_failures, trips, opened_at IS NULL, next_probe_at IS NULL'), 'closed|0|0|t|t',
	'flaky: breaker closed, consecutive_failures 0, trips 0, no open/probe times');
{
	my $st = $sink->stats('/flaky');
	is($st->{by_path}{'/flaky'}, 9, 'flaky: 9 requests in all (3 failures, 1 failed probe, 5 deliveries)');
	is($st->{ok_distinct_ids}, 5, 'flaky: 5 distinct ids answered 200');
	is($st->{ok_duplicates}, 0, 'flaky: no message delivered twice');
}
is(health('flaky', 'delivered, failed'), '5|4', 'flaky: endpoint_health counts 5 delivered, 4 failed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'steady' AND status <> 'done'}),
	'0', 'steady: every message delivered');
is(health('steady', 'state, consecutive_failures, trips'), 'closed|0|0', 'steady: breaker closed throughout');

# ------------------------------------------------------------------ connection refused
is(health('refused', 'state, consecutive_failures, trips'), 'open|3|1',
	'refused: breaker open after 3 connection failures');
like(health('refused', 'last_error'), qr/connect/i, 'refused: last_error is a connect error');
{
	my $before = $node->safe_psql('postgres', "SELECT status, attempts, lease_version FROM outbox.messages WHERE id = $rid");
	is($before, 'pending|3|3', 'refused: the message is pending with 3 attempts');
	sleep 1;
	is($node->safe_psql('postgres', "SELECT status, attempts, lease_version FROM outbox.messages WHERE id = $rid"),
		$before, 'refused: one second later the message is untouched (no claim while open)');
}

$sink->stop;
$node->stop;
done_testing();
