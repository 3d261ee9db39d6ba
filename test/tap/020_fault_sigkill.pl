# Copyright: outbox_dispatcher contributors
#
# 020_fault_sigkill.pl — fault injection: a dispatcher worker is killed with
# SIGKILL while its requests are in flight.
#
# Proves, with 2 workers, lease 3 s, endpoint timeout 2 s and a sink that
# answers every request after 300 ms:
#   - the fault really hits requests in flight: before the kill the sink has
#     requests open and outbox.worker_stats shows the victim with
#     in_flight > 0 (and rows 'processing');
#   - the postmaster treats the SIGKILL as a crash and reinitializes
#     ("terminated by signal 9", "all server processes terminated;
#     reinitializing"); connections work again and both workers come back
#     with new pids;
#   - traffic goes on: messages committed after the restart are delivered
#     too;
#   - the rows the dead workers held stay 'processing' only until their
#     lease expires, then are taken over (lease_version >= 2) and delivered;
#   - the nothing-is-lost invariant (OdInvariant::check_invariant) over every
#     committed message: done and received by the sink, no dead row (none is
#     legitimate here: attempts stay far below max_attempts 12), nothing
#     stuck;
#   - duplicates are allowed (the crash explains them); there are some (the
#     fault hit requests in flight), and every duplicate was first sent by
#     the old workers (before the server was back) and again after the
#     kill.  (The workers commit asynchronously, so a claim or finalize made
#     just before the crash may be lost: such a message is claimed again
#     with the same lease_version, or taken over after its lease — still a
#     crash-explained duplicate, never a loss.)
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
	'fault_sigkill', conf => q{
restart_after_crash = on
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

# ------------------------------------------------------------------ traffic, then SIGKILL in flight
is(enqueue_n($node, 1500, 'before'), '1500', '1500 messages committed before the fault');
ok($sink->wait_requests(200, path => '/hook', timeout => 20), 'traffic is flowing (200 requests seen)');
is(enqueue_n($node, 500, 'before2'), '500', '500 more committed while traffic flows');

my ($victim, $victim_in_flight, $sink_open) = wait_in_flight($node, $sink, 20);
ok(defined $victim, 'a worker has requests in flight');
$victim //= 0;
my $held = $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'processing'});
my $old_pids = $node->safe_psql('postgres',
	q{SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'});
my $log_offset = -s $node->logfile;
my $t_kill = time();
ok($victim && kill('KILL', $victim), "SIGKILL sent to worker pid $victim");
note("at the kill: victim in_flight $victim_in_flight, sink in_flight $sink_open, rows processing $held");
cmp_ok($victim_in_flight, '>', 0, "the victim had requests in flight ($victim_in_flight)");
cmp_ok($sink_open, '>', 0, "the sink had requests open ($sink_open)");
cmp_ok($held, '>', 0, "rows were processing at the kill ($held)");

# ------------------------------------------------------------------ crash restart
ok( poll_until(
		$node,
		qq{SELECT count(*) FROM pg_stat_activity
		    WHERE backend_type = 'outbox_dispatcher worker' AND pid NOT IN ($old_pids)},
		'2', 30),
	'after the crash restart the server accepts connections and two new workers run');
ok( poll_until(
		$node,
		qq{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL AND pid NOT IN ($old_pids)},
		'2', 10),
	'worker_stats shows both workers with new pids');
my $t_back = time();
note(sprintf('server back %.1f s after the kill', $t_back - $t_kill));
{
	my $log = slurp_file($node->logfile, $log_offset);
	like($log, qr/\(PID $victim\) was terminated by signal 9/, 'server log: the worker was terminated by signal 9');
	like($log, qr/all server processes terminated; reinitializing/, 'server log: the postmaster reinitialized');
}

# traffic continues after the restart
is(enqueue_n($node, 500, 'after'), '500', '500 messages committed after the restart');

# ------------------------------------------------------------------ settle and check
ok(wait_settled($node, timeout => 60), 'every message settled (nothing pending or processing)');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE event_type = 'order.after' AND status = 'done'}, '500', 10),
	'the messages committed after the restart were delivered');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE lease_version >= 2}),
	'>', 0, 'rows held at the crash were taken over after their lease expired (lease_version >= 2)');

my $r = check_invariant($node, $sink,
	scenario   => 'worker SIGKILL',
	dead_ok    => sub { 0 },
	dup_reason => 'crash: requests in flight at the SIGKILL were sent again after the lease takeover');
is($r->{messages}, 2500, 'all 2500 committed messages were checked');

# every duplicate: first request by the old workers (before the server was
# back; the other worker may still send for a few ms after the kill until the
# postmaster stops it), a later one after the kill
{
	my @bad;
	for my $id (@{ $r->{duplicate_ids} })
	{
		my $reqs = $sink->requests('/hook', id => $id);
		my @t = sort { $a <=> $b } map { $_->{t} } @$reqs;
		push @bad, $id unless @t >= 2 && $t[0] < $t_back && $t[1] >= $t_kill;
	}
	is(scalar @bad, 0, 'every duplicate was sent first before the crash restart and again after the kill (explained by the crash)')
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
	cmp_ok($r->{duplicates}, '>', 0, 'requests in flight at the kill were sent again after it (the fault hit them)');
}

note(sprintf('020_fault_sigkill: %d messages, %d duplicates, %.1f s', $r->{messages}, $r->{duplicates}, time() - $t_start));
$sink->stop;
$node->stop;
done_testing();
