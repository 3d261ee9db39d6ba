# Copyright: outbox_dispatcher contributors
#
# 021_fault_immediate_stop.pl — fault injection: the whole server is stopped
# with `pg_ctl stop -m immediate` while requests are in flight, then started
# again.
#
# Proves, with 2 workers, lease 3 s, endpoint timeout 2 s and a sink that
# answers every request after 300 ms:
#   - the fault really hits requests in flight: before the stop the sink has
#     requests open, outbox.worker_stats shows requests in flight and rows
#     are 'processing';
#   - an immediate stop gives the workers no chance to hand anything back
#     (no "shutting down with N request(s) in flight" line); the next start
#     runs crash recovery ("database system was not properly shut down") and
#     both workers come back;
#   - messages committed before the stop and after the start are all
#     delivered; the rows held at the stop stay 'processing' only until their
#     lease expires, then are taken over (lease_version >= 2);
#   - the nothing-is-lost invariant (OdInvariant::check_invariant) over every
#     committed message: done and received by the sink, no dead row (none is
#     legitimate here: attempts stay far below max_attempts 12), nothing
#     stuck;
#   - duplicates are allowed (the crash explains them); there are some (the
#     fault hit requests in flight), and every duplicate was first sent
#     before the stop and again after the start.  (The workers commit
#     asynchronously, so a claim or finalize made just before the stop may be
#     lost: such a message is claimed again with the same lease_version, or
#     taken over after its lease — still a crash-explained duplicate, never a
#     loss.)
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
use OdInvariant qw(wait_settled check_invariant poll_until enqueue_n wait_in_flight);

my $t_start = time();

# ------------------------------------------------------------------ helpers


# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_immediate', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.lease = 3s
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
log_statement = none
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/hook', status => 200, delay_ms => 300 });
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('default', '" . $sink->url('/hook') . "', interval '2 s')");
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL AND state IN ('idle', 'delivering', 'claiming')}, '2', 20),
	'both workers are running');

# ------------------------------------------------------------------ traffic, then immediate stop in flight
is(enqueue_n($node, 1500, 'before'), '1500', '1500 messages committed before the fault');
ok($sink->wait_requests(200, path => '/hook', timeout => 20), 'traffic is flowing (200 requests seen)');
is(enqueue_n($node, 500, 'before2'), '500', '500 more committed while traffic flows');

my ($busy, $busy_in_flight, $sink_open) = wait_in_flight($node, $sink, 20);
ok(defined $busy, 'a worker has requests in flight');
$busy_in_flight //= 0;
$sink_open //= 0;
my $held = $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'processing'});
my $log_offset = -s $node->logfile;
my $t_stop = time();
$node->stop('immediate');
note("at the stop: busiest worker in_flight $busy_in_flight, sink in_flight $sink_open, rows processing $held");
cmp_ok($busy_in_flight, '>', 0, "a worker had requests in flight ($busy_in_flight)");
cmp_ok($sink_open, '>', 0, "the sink had requests open ($sink_open)");
cmp_ok($held, '>', 0, "rows were processing at the stop ($held)");
{
	my $log = slurp_file($node->logfile, $log_offset);
	like($log, qr/received immediate shutdown request/, 'server log: immediate shutdown');
	unlike($log, qr/shutting down with \d+ request/, 'server log: the workers had no chance to hand messages back');
}

# ------------------------------------------------------------------ start again
sleep(0.5);
my $t_restart = time();
$log_offset = -s $node->logfile;
$node->start;
ok( poll_until(
		$node,
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'},
		'2', 30),
	'after the start two workers run');
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL}, '2', 10),
	'worker_stats shows both workers running');
note(sprintf('server back %.1f s after the stop', time() - $t_stop));
{
	my $log = slurp_file($node->logfile, $log_offset);
	like($log, qr/database system was not properly shut down; automatic recovery in progress/,
		'server log: crash recovery at the start');
}
# traffic continues after the restart
is(enqueue_n($node, 500, 'after'), '500', '500 messages committed after the restart');

# ------------------------------------------------------------------ settle and check
ok(wait_settled($node, timeout => 60), 'every message settled (nothing pending or processing)');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE event_type = 'order.after' AND status = 'done'}, '500', 10),
	'the messages committed after the restart were delivered');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE lease_version >= 2}),
	'>', 0, 'rows held at the stop were taken over after their lease expired (lease_version >= 2)');

my $r = check_invariant($node, $sink,
	scenario   => 'immediate stop',
	dead_ok    => sub { 0 },
	dup_reason => 'crash: requests in flight at the immediate stop were sent again after the lease takeover');
is($r->{messages}, 2500, 'all 2500 committed messages were checked');

# every duplicate: first request before the restart, a later one after it
{
	my @bad;
	for my $id (@{ $r->{duplicate_ids} })
	{
		my $reqs = $sink->requests('/hook', id => $id);
		my @t = sort { $a <=> $b } map { $_->{t} } @$reqs;
		push @bad, $id unless @t >= 2 && $t[0] < $t_restart && $t[1] >= $t_restart;
	}
	is(scalar @bad, 0, 'every duplicate was sent first before the stop and again after the restart (explained by the crash)')
	  or diag('unexplained duplicates: ' . join(',', @bad[0 .. ($#bad < 9 ? $#bad : 9)]));
	# The workers commit asynchronously: a claim or finalize not yet flushed
	# when the server went down is lost, so such a message is claimed again
	# with the same lease_version (lost claim) or taken over after its lease
	# (lost finalize).  Both are crash-explained duplicates; show how many.
	my $lv1 = scalar @{ $r->{duplicate_ids} }
	  ? $node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE lease_version < 2 AND id IN ('
		  . join(',', @{ $r->{duplicate_ids} }) . ')')
	  : 0;
	note(scalar(@{ $r->{duplicate_ids} }) . " duplicate ids, $lv1 of them with lease_version 1 (claim lost with the crash)");
	cmp_ok($r->{duplicates}, '>', 0, 'requests in flight at the stop were sent again after it (the fault hit them)');
}

note(sprintf('021_fault_immediate_stop: %d messages, %d duplicates, %.1f s', $r->{messages}, $r->{duplicates}, time() - $t_start));
$sink->stop;
$node->stop;
done_testing();
