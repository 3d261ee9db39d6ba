# Copyright: outbox_dispatcher contributors
#
# 024_fault_pause.pl — fault injection: delivery is paused
# (ALTER SYSTEM SET outbox_dispatcher.enabled = off + pg_reload_conf())
# while requests are in flight, then resumed.
#
# Setup: 2 workers, a sink that answers every request after 2 s (500 ms
# from the resume on), 2000 messages committed while traffic flows.  The
# lease is 10 s (endpoint timeout 5 s) rather than the 3 s of the crash
# tests: nothing here waits for a lease to expire, and a takeover caused by
# a slow loaded machine would be a duplicate this scenario must not have.
#
# Proves:
#   - the pause hits requests in flight: after every worker has applied the
#     reload, messages are still 'processing' and the sink has requests open;
#   - those in-flight requests still finish and are finalized: nothing is
#     left 'processing', and every message that was processing at the pause
#     is 'done';
#   - nothing new is claimed while paused: every request the sink receives
#     after the pause took effect belongs to a message that was already
#     processing then (so the request count grows by at most that many);
#     for 3 s afterwards — with 200 more messages committed, whose commits
#     wake the workers — the sink gets no request, worker_stats.claimed does
#     not move, nothing is processing, the workers report 'paused', and the
#     unclaimed messages stay pending with attempts 0 and lease_version 0;
#   - enabled = on + reload: everything is delivered;
#   - the nothing-is-lost invariant (OdInvariant::check_invariant) over every
#     committed message, with NO duplicate delivery (no crash, no takeover:
#     nothing explains one) and no dead row.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until enqueue_n);
use OdTest qw(wait_workers_cycled);

my $t_start = time();

# ------------------------------------------------------------------ helpers

sub set_enabled
{
	my ($node, $value) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox_dispatcher.enabled = $value; SELECT pg_reload_conf();");
	# twice: the signal may land between the reload check at the loop top and
	# the cycle counter, so one more cycle only proves it is being processed
	return poll_until($node, 'SHOW outbox_dispatcher.enabled', $value, 10)
	  && wait_workers_cycled($node) && wait_workers_cycled($node);
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_pause', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.lease = 10s
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
log_statement = none
});

my $sink = OdSink->start($node->basedir);
# Answers take 2 s while the pause is applied, so that what was in flight
# when it took effect is still in flight when the test reads it: applying
# it (ALTER SYSTEM, reloads, two worker cycles) took 0.41 s on a slow
# machine, and with 0.5 s answers the first wave had already been answered
# and finalized by then.  500 ms again from the resume on.
$sink->script({ path => '/hook', status => 200, delay_ms => 2000 });
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('default', '" . $sink->url('/hook') . "', interval '5 s')");
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL AND state IN ('idle', 'delivering', 'claiming')}, '2', 20),
	'both workers are running');

# ------------------------------------------------------------------ traffic, then pause in flight
is(enqueue_n($node, 1000, 'before'), '1000', '1000 messages committed');
ok($sink->wait_requests(150, timeout => 20), 'traffic is flowing (150 requests seen)');
is(enqueue_n($node, 1000, 'before2'), '1000', '1000 more committed while traffic flows');
ok( poll_until(
		$node, q{SELECT coalesce(sum(in_flight), 0) > 0 FROM outbox.worker_stats}, 't', 10)
	  && ($sink->stats->{in_flight} // 0) > 0,
	'requests are in flight (worker_stats and sink)');

ok(set_enabled($node, 'off'), 'enabled = off + pg_reload_conf(): every worker applied it');
# what was claimed before the pause took effect, then what the sink had by then
my %at_pause = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', q{SELECT id FROM outbox.messages WHERE status = 'processing'});
my $st = $sink->stats;
my ($seq_at_pause, $open_at_pause) = ($st->{total}, $st->{in_flight} // 0);
my $n_at_pause = scalar keys %at_pause;
note("at the pause: $n_at_pause messages processing, sink total $seq_at_pause, sink in_flight $open_at_pause");
cmp_ok($n_at_pause, '>', 0, "messages were processing when the pause took effect ($n_at_pause)");
cmp_ok($open_at_pause, '>', 0, "the sink had requests open when the pause took effect ($open_at_pause)");

# ------------------------------------------------------------------ in-flight requests finish and are finalized
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'processing'}, '0', 20),
	'paused: the requests in flight finished and were finalized (nothing processing)');
{
	my $list = join(',', sort { $a <=> $b } keys %at_pause) || '0';
	is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE id IN ($list) AND status = 'done'"),
		$n_at_pause, 'paused: every message that was processing at the pause is done');
}
my $after = $sink->requests(undef, since => $seq_at_pause);
my @foreign = grep { !$at_pause{ OdSink::header($_, 'Idempotency-Key') // '' } } @$after;
is(scalar @foreign, 0, 'paused: every request after the pause belongs to a message already processing then')
  or diag('not processing at the pause: ' . join(',', map { OdSink::header($_, 'Idempotency-Key') } @foreign[0 .. ($#foreign < 9 ? $#foreign : 9)]));
cmp_ok(scalar @$after, '<=', $n_at_pause,
	'paused: the sink request count grew by at most the number of messages processing at the pause ('
	  . scalar(@$after) . " <= $n_at_pause)");

# ------------------------------------------------------------------ nothing is claimed while paused
my $total_paused = $sink->stats->{total};
my $claimed_paused = $node->safe_psql('postgres', 'SELECT sum(claimed) FROM outbox.worker_stats');
is(enqueue_n($node, 200, 'paused'), '200', '200 messages committed while paused (the commits wake the workers)');
{
	my $deadline = time() + 3;
	my ($ok, $why) = (1, '');
	while (time() < $deadline)
	{
		my ($processing, $claimed, $states) = split /\|/, $node->safe_psql(
			'postgres', q{
SELECT (SELECT count(*) FROM outbox.messages WHERE status = 'processing'),
       (SELECT sum(claimed) FROM outbox.worker_stats),
       (SELECT string_agg(state, ',' ORDER BY worker) FROM outbox.worker_stats)});
		my $total = $sink->stats->{total};
		if ($processing ne '0' || $claimed ne $claimed_paused || $total != $total_paused || $states ne 'paused,paused')
		{
			$ok = 0;
			$why = "processing $processing, claimed $claimed (was $claimed_paused), sink $total (was $total_paused), states $states";
			last;
		}
		sleep(0.1);
	}
	ok($ok, 'paused for 3 s: nothing claimed, nothing sent, workers paused') or diag($why);
}
{
	my ($pending, $untouched, $done) = split /\|/, $node->safe_psql(
		'postgres', q{
SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'pending' AND attempts = 0 AND lease_version = 0),
       count(*) FILTER (WHERE status = 'done')
  FROM outbox.messages});
	cmp_ok($pending, '>', 200, "paused: messages wait pending ($pending, $done done)");
	is($untouched, $pending, 'paused: every pending message is unclaimed (attempts 0, lease_version 0)');
}

# ------------------------------------------------------------------ resume
$sink->script({ path => '/hook', status => 200, delay_ms => 500 });
ok(set_enabled($node, 'on'), 'enabled = on + pg_reload_conf(): every worker applied it');
ok(wait_settled($node, timeout => 60), 'resumed: every message settled (nothing pending or processing)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}), '2200',
	'resumed: all 2200 messages delivered');

my $r = check_invariant($node, $sink,
	scenario   => 'pause while in flight',
	dead_ok    => sub { 0 },
	dup_reason => undef);
is($r->{messages}, 2200, 'all 2200 committed messages were checked');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'no lease was lost');

note(sprintf('024_fault_pause: %d messages, %d duplicates, %.1f s', $r->{messages}, $r->{duplicates}, time() - $t_start));
$sink->stop;
$node->stop;
done_testing();
