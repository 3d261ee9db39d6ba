# Copyright: outbox_dispatcher contributors
#
# 043_fairness.pl — one endpoint's backlog does not delay another endpoint
# (src/worker_claim.cpp do_claim: per-endpoint quotas, rotating order;
# docs/operations.md "a backlog of any size on one endpoint cannot delay
# another endpoint's messages by more than a cycle").
#
# Proves, with default-ish settings (2 workers, batch_size 100,
# poll_interval 1 s, default backoff):
#   - phase 1, default breaker (threshold 5, cool-down 30 s): endpoint "a"
#     is dead (its port refuses connections) and has a backlog of 100,000
#     pending messages, all due, all older than anything of "b"; endpoint
#     "b" is healthy.  25 messages for "b" are committed one at a time,
#     every 200 ms, starting right after the backlog is committed.  Each
#     one's commit-to-delivery delay (created_at vs the sink's arrival time
#     t) is below 1.5 s (one poll_interval plus slack) and all 25 are
#     delivered; p50 and max are reported with diag.
#     "a"'s messages are not all burnt: its breaker opens, from then on the
#     sum of its attempts stays constant (3 s watched), only a few hundred
#     of the 100,000 were ever tried, none is dead;
#   - phase 2, no breaker: "a"'s breaker takes it out of the claims within
#     its first batch, so phase 1 barely depends on the claim order.  The
#     backlog is moved (outbox.move_messages) to endpoint "c", dead as well,
#     with breaker_threshold 0 and max_in_flight 1000, so that its 100,000
#     due rows compete with "b" in every claim (tens of thousands of
#     attempts while "b" streams).  Again 25 messages for "b", each
#     delivered within 1.5 s.  A claim that takes the oldest due rows
#     whatever their endpoint (0.1.0) fails here: none of "b"'s messages
#     arrives within 15 s (checked by swapping in such a claim).
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

my $BACKLOG = 100_000;
my $N_B = 25;

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fairness', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.batch_size = 100
outbox_dispatcher.poll_interval = 1s
});

my $sink = OdSink->start($node->basedir);
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url) VALUES
  ('a', 'http://127.0.0.1:" . OdNode::closed_port() . "/a'),
  ('b', '" . $sink->url('/b') . "')");

# the backlog of the dead endpoint, all due now
my $t0 = time;
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, created_at, available_at)
SELECT 'order', g::text, 'order.created', jsonb_build_object('n', g), 'a',
       now() - interval '1 minute', now() - interval '1 minute'
  FROM generate_series(1, $BACKLOG) AS g});
note(sprintf('backlog of %d committed in %.2f s', $BACKLOG, time - $t0));

# Commits $N_B messages for "b", one every 200 ms, and checks each one's
# commit-to-delivery delay (created_at vs the sink's arrival time).
# Returns the max delay.
sub stream_b
{
	my ($label) = @_;
	my @ids;
	my $seen = $sink->stats->{by_path}{'/b'} // 0;
	for my $i (1 .. $N_B)
	{
		my $t = time;
		push @ids, $node->safe_psql('postgres',
			"SELECT outbox.enqueue('order', 'b$i', 'order.created', '{\"i\": $i}', 'b')");
		my $rest = 0.2 - (time - $t);
		sleep $rest if $rest > 0;
	}
	ok($sink->wait_requests($seen + $N_B, path => '/b', timeout => 15), "$label: all $N_B messages of b reached the sink");
	ok( poll_until(
			$node,
			'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . join(',', @ids) . ')',
			$N_B, 10),
		"$label: all $N_B messages of b done");
	my %created = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		'SELECT id || \'|\' || extract(epoch FROM created_at) FROM outbox.messages WHERE id IN (' . join(',', @ids) . ')');
	my %arrived;
	for my $r (@{ $sink->requests('/b') })
	{
		my $id = OdSink::header($r, 'Idempotency-Key');
		$arrived{$id} //= $r->{t};
	}
	my @delays = sort { $a <=> $b } map { ($arrived{$_} // 9**9**9) - $created{$_} } @ids;    # never arrived: infinite
	my ($p50, $max) = ($delays[ int($#delays / 2) ], $delays[-1]);
	diag(sprintf('fairness, %s: commit-to-delivery of b: p50 %.3f s, max %.3f s (%s)',
			$label, $p50, $max, join(' ', map { sprintf '%.3f', $_ } @delays)));
	cmp_ok($max, '<', 1.5, sprintf('%s: worst commit-to-delivery delay of b %.3f s < 1.5 s', $label, $max));
	return $max;
}

# ------------------------------------------------------------------ phase 1: default breaker
# b's messages are committed right after the backlog, while a's first
# claims are failing and before or while its breaker opens
stream_b('default breaker');

# ------------------------------------------------------------------ a: breaker open, attempts stop
ok(poll_until($node, q{SELECT state FROM outbox.endpoint_health WHERE endpoint = 'a'}, 'open', 10),
	'a: breaker open');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.endpoint_health WHERE endpoint = 'a'}),
	qr/connect/i, 'a: last_error is a connect error');
{
	my $sum = q{SELECT sum(attempts) || '|' || count(*) FILTER (WHERE attempts > 0) || '|'
	                   || count(*) FILTER (WHERE status = 'dead') || '|' || count(*) FILTER (WHERE status = 'processing')
	              FROM outbox.messages WHERE endpoint = 'a'};
	# a claim that was already running when the breaker opened finishes first
	ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'a' AND status = 'processing'}, '0', 10),
		'a: nothing in flight');
	my $before = $node->safe_psql('postgres', $sum);
	sleep 3;
	my $after = $node->safe_psql('postgres', $sum);
	is($after, $before, "a: attempts constant over 3 s with the breaker open ($after)");
	my ($attempts, $tried, $dead) = split /\|/, $after;
	diag("a: $tried of $BACKLOG messages were tried ($attempts attempts), $dead dead");
	cmp_ok($tried, '<=', 1000, "a: only $tried of $BACKLOG messages were ever tried");
	is($dead, 0, 'a: no message is dead');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'a' AND status = 'pending'}),
		$BACKLOG, "a: all $BACKLOG messages still pending");
}

# ------------------------------------------------------------------ phase 2: no breaker
# a's breaker takes it out of the claims at once, so phase 1 hardly
# depends on the claim order.  Endpoint "c" is dead too but has no breaker
# (threshold 0) and room for any batch (max_in_flight 1000): move a's
# backlog there and c's 100,000 rows compete with b in every claim.  If
# the claim took the oldest rows first whatever their endpoint, b would
# wait behind them.
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, breaker_threshold, max_in_flight)
	 VALUES ('c', 'http://127.0.0.1:" . OdNode::closed_port() . "/c', 0, 1000)");
is($node->safe_psql('postgres', q{SELECT outbox.move_messages('a', 'c', '{pending}')}), $BACKLOG,
	"move_messages: a's $BACKLOG pending messages moved to c");
ok(poll_until($node, q{SELECT sum(attempts) > 1000 FROM outbox.messages WHERE endpoint = 'c'}, 't', 20),
	'c: its backlog is being claimed and failing (no breaker)');
my $c_before = $node->safe_psql('postgres', q{SELECT sum(attempts) FROM outbox.messages WHERE endpoint = 'c'});
stream_b('no breaker, 100,000 due rows of a dead endpoint in every claim');
my $c_after = $node->safe_psql('postgres', q{SELECT sum(attempts) FROM outbox.messages WHERE endpoint = 'c'});
diag('c: ' . ($c_after - $c_before) . ' attempts while b was streamed');
cmp_ok($c_after - $c_before, '>', 1000, 'c: its backlog kept being claimed meanwhile (the check is not vacuous)');
is($node->safe_psql('postgres', q{SELECT state FROM outbox.endpoint_health WHERE endpoint = 'c'}), 'closed',
	'c: breaker_threshold 0: no breaker');

$sink->stop;
$node->stop;
done_testing();
