# Copyright: outbox_dispatcher contributors
#
# 062_deliver_after_replication.pl — outbox_dispatcher.deliver_after_replication
# with a synchronous standby (streaming over loopback, both nodes preload
# the library).
#
# Proves:
#   - with the mode on and the standby up, messages are delivered;
#   - with the standby stopped, messages committed on the primary (the
#     producer commits with synchronous_commit = local, so its commit does
#     not wait) are not sent: the sink gets nothing, a worker shows
#     'waiting for replication' in outbox.worker_stats, outbox.health
#     (replication_waiting_workers, replication_wait) and metrics() say so,
#     the server log says why; the held messages are handed back without an
#     attempt charged once the hold limit passes (lease 4 s: 1 s);
#   - the standby started again: every held message is delivered;
#   - a configuration reload is served while a worker waits: turning the
#     mode off delivers what was held at once (and the same traffic with
#     the mode off is delivered with the standby down — the difference this
#     mode makes);
#   - a fast stop while a worker waits finishes promptly;
#   - a crash of the primary (immediate stop) while delivering, then the
#     standby promoted: every message the receiver got exists on the new
#     primary, whose workers deliver the rest (nothing lost).
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
use OdInvariant qw(wait_settled check_invariant poll_until);

my $t_start = time();

my $primary = OdNode->create(
	'dar_primary',
	streaming => 1,
	conf      => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.lease = 4s
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
outbox_dispatcher.deliver_after_replication = on
});
my $sink = OdSink->start($primary->basedir);
$sink->script({ path => '/hook', status => 200 });
$primary->add_endpoint('default', $sink->url('/hook'), timeout => '2 s');

# the standby preloads the library too (same postgresql.conf); once promoted
# it has no standby of its own
my $standby = $primary->standby('dar_standby', conf => "synchronous_standby_names = ''\n");
# synchronous from now on (set earlier, CREATE EXTENSION would have waited for a standby)
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()});
ok( poll_until($primary, q{SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'}, '1', 30),
	'the standby streams synchronously');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}),
	'0', 'no dispatcher worker runs on the standby');

# producers that do not wait for the standby: their messages may exist on the primary only
sub enqueue_local
{
	my ($node, $n, $tag) = @_;
	return $node->safe_psql('postgres', qq{
		SET synchronous_commit = local;
		SELECT count(outbox.enqueue('order', '$tag-' || g, 'order.$tag', jsonb_build_object('n', g)))
		  FROM generate_series(1, $n) AS g});
}

# how many messages of the tag the sink got exactly once
sub delivered_once
{
	my ($node, $tag) = @_;
	my $ids = $sink->ids('/hook') // {};
	return scalar grep { ($ids->{$_} // 0) == 1 }
	  split /\n/, $node->safe_psql('postgres', "SELECT id FROM outbox.messages WHERE event_type = 'order.$tag'");
}

sub done_count
{
	my ($node, $tag) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.$tag' AND status = 'done'");
}

# ------------------------------------------------------------------ standby up: delivered
is(enqueue_local($primary, 200, 'up'), '200', '200 messages committed with the standby up');
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.up' AND status = 'done'", '200', 30),
	'with the standby up every message is delivered');
ok( poll_until($primary, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'waiting for replication'}, '0', 10),
	'no worker waits once the standby has confirmed');
is($primary->safe_psql('postgres', q{SELECT replication_waiting_workers, replication_wait IS NULL FROM outbox.health}),
	'0|t', 'outbox.health: nobody waits for the standby');

# ------------------------------------------------------------------ requests in flight go on while a claim waits
$primary->safe_psql('postgres', q{UPDATE outbox.endpoints SET timeout = interval '3.5 s'});
$sink->script({ path => '/hook', status => 200, delay_ms => 3000 });
is(enqueue_local($primary, 10, 'inflight'), '10', '10 messages committed; the receiver answers after 3 s (timeout 3.5 s)');
{
	my $deadline = time() + 10;
	sleep(0.02) while ($sink->stats->{in_flight} // 0) < 10 && time() < $deadline;
	cmp_ok($sink->stats->{in_flight} // 0, '>=', 10, 'they are in flight at the receiver');
}
$standby->stop('fast');
ok(poll_until($primary, q{SELECT count(*) FROM pg_stat_replication}, '0', 30), 'the standby is gone');
is(enqueue_local($primary, 10, 'behind'), '10', '10 more committed while the standby is down');
ok( poll_until($primary, q{SELECT count(*) > 0 FROM outbox.worker_stats WHERE state = 'waiting for replication'}, 't', 10),
	'a worker waits for the standby with the new claim');
is(done_count($primary, 'inflight'), '0', 'the earlier requests are still in flight then');
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.inflight' AND status = 'done'", '10', 10),
	'meanwhile the requests in flight finished and were finalized');
is(done_count($primary, 'behind'), '0', 'and the waiting claim sent nothing');
$sink->script({ path => '/hook', status => 200 });
# (the standby is down: this commit must not wait for it)
$primary->safe_psql('postgres', q{SET synchronous_commit = local; UPDATE outbox.endpoints SET timeout = interval '2 s'});
$standby->start;
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.behind' AND status = 'done'", '10', 30),
	'the standby back: the waiting claim is delivered');

# ------------------------------------------------------------------ standby down: held
$standby->stop('fast');
ok(poll_until($primary, q{SELECT count(*) FROM pg_stat_replication}, '0', 30), 'the standby is gone');
my $log_offset = -s $primary->logfile;
my $requests_before = scalar @{ $sink->requests('/hook') };
is(enqueue_local($primary, 100, 'held'), '100', '100 messages committed on the primary while the standby is down');
ok( poll_until($primary, q{SELECT count(*) > 0 FROM outbox.worker_stats WHERE state = 'waiting for replication'}, 't', 10),
	"outbox.worker_stats: a worker is 'waiting for replication'");
my $health = $primary->safe_psql('postgres',
	q{SELECT replication_waiting_workers > 0, replication_wait > interval '0' FROM outbox.health});
is($health, 't|t', 'outbox.health: replication_waiting_workers and replication_wait show the wait');
my $metrics = $primary->safe_psql('postgres', 'SELECT outbox.metrics()');
like($metrics, qr/^outbox_replication_waiting_workers [12]$/m, 'metrics(): outbox_replication_waiting_workers');
like($metrics, qr/^# TYPE outbox_replication_held_messages gauge$/m, 'metrics(): outbox_replication_held_messages');
like($metrics, qr/^outbox_replication_wait_seconds [0-9.]+$/m, 'metrics(): outbox_replication_wait_seconds');
sleep(3);
is(scalar @{ $sink->requests('/hook') }, $requests_before, 'nothing was sent while the standby was down (3 s)');
is(done_count($primary, 'held'), '0', 'no held message is done');
ok( poll_until($primary,
		q{SELECT count(*) FILTER (WHERE status = 'pending' AND attempts = 0) FROM outbox.messages WHERE event_type = 'order.held'},
		'100', 10),
	'after the hold limit every held message is pending again with no attempt charged');
{
	my $log = slurp_file($primary->logfile, $log_offset);
	like($log, qr/the synchronous standbys have not confirmed WAL position [0-9A-F]+\/[0-9A-F]+ in 1000 ms; released \d+ message\(s\), no claims until they do/,
		'server log: the wait given up, and why');
}
ok( poll_until($primary, q{SELECT count(*) > 0 FROM outbox.worker_stats WHERE state = 'waiting for replication'}, 't', 5),
	'the workers still wait (no claims until the standby is back)');

# ------------------------------------------------------------------ standby back: delivered
$log_offset = -s $primary->logfile;
$standby->start;
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.held' AND status = 'done'", '100', 30),
	'the standby back: every held message is delivered');
is(delivered_once($primary, 'held'), 100, 'the sink got each held message once');
{
	my $log = slurp_file($primary->logfile, $log_offset);
	like($log, qr/the synchronous standbys confirmed WAL position [0-9A-F]+\/[0-9A-F]+; claiming again/, 'server log: claiming again');
}
ok(poll_until($primary, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'waiting for replication'}, '0', 10),
	'no worker waits any more');

# ------------------------------------------------------------------ a reload while waiting
$standby->stop('fast');
ok(poll_until($primary, q{SELECT count(*) FROM pg_stat_replication}, '0', 30), 'the standby is gone again');
is(enqueue_local($primary, 50, 'reload'), '50', '50 messages committed while the standby is down');
ok( poll_until($primary, q{SELECT count(*) > 0 FROM outbox.worker_stats WHERE state = 'waiting for replication'}, 't', 10),
	'a worker waits for the standby');
sleep(1.5);
is(done_count($primary, 'reload'), '0', 'nothing delivered while waiting');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.deliver_after_replication = off; SELECT pg_reload_conf()});
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.reload' AND status = 'done'", '50', 20),
	'the mode turned off by a reload: what was held is delivered');
is(enqueue_local($primary, 50, 'off'), '50', 'with the mode off, 50 more committed while the standby is down');
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.off' AND status = 'done'", '50', 20),
	'with the mode off they are delivered although no standby has them');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.deliver_after_replication = on; SELECT pg_reload_conf()});

# ------------------------------------------------------------------ a fast stop while waiting
OdTest::wait_workers_cycled($primary);
is(enqueue_local($primary, 20, 'stop'), '20', '20 messages committed while the standby is down, mode on');
ok( poll_until($primary, q{SELECT count(*) > 0 FROM outbox.worker_stats WHERE state = 'waiting for replication'}, 't', 10),
	'a worker waits for the standby');
my $t0 = time();
$primary->stop('fast');
my $stop_s = time() - $t0;
cmp_ok($stop_s, '<', 10, sprintf('a fast stop while waiting finishes (%.1f s)', $stop_s));
$primary->start;
$standby->start;
ok(poll_until($primary, "SELECT count(*) FROM outbox.messages WHERE event_type = 'order.stop' AND status = 'done'", '20', 30),
	'after the restart, with the standby back, they are delivered');

# ------------------------------------------------------------------ crash and promote
ok( poll_until($primary, q{SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'}, '1', 30),
	'the standby streams synchronously again');
$sink->script({ path => '/hook', status => 200, delay_ms => 20 });
is(enqueue_local($primary, 3000, 'crash'), '3000', '3000 messages committed (synchronous_commit = local)');
ok($sink->wait_requests(500, path => '/hook', timeout => 30), 'traffic flows');
$primary->stop('immediate');
my $received = $sink->ids('/hook') // {};
$standby->promote;
ok( poll_until($standby, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 30),
	'the promoted standby runs two workers');
my %on_new = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT id FROM outbox.messages');
my @missing = grep { !$on_new{$_} } keys %$received;
is(scalar @missing, 0, sprintf('every message the receiver got (%d ids) exists on the new primary', scalar keys %$received))
  or diag('missing: ' . join(',', (sort { $a <=> $b } @missing)[0 .. ($#missing < 9 ? $#missing : 9)]));
ok(wait_settled($standby, timeout => 60), 'the new primary settles everything');
my $r = check_invariant($standby, $sink,
	scenario   => 'crash and promotion, deliver_after_replication',
	path       => '/hook',
	dead_ok    => sub { 0 },
	dup_reason => 'crash: requests in flight or finalizes not yet replicated at the crash were sent again by the new primary');
note(sprintf('crash and promotion: %d messages, %d duplicates', $r->{messages}, $r->{duplicates}));

note(sprintf('062_deliver_after_replication: %.1f s', time() - $t_start));
$sink->stop;
$standby->stop;
done_testing();
