# Copyright: outbox_dispatcher contributors
#
# 035_fault_slow_queue_lease.pl — fault injection, scenario 5 (slow
# endpoint), the case where the endpoint is healthy but narrow: it answers
# every request 200 after 400 ms, and its max_in_flight is 1.
#
# Nothing fails here: no crash, no timeout (timeout 2 s), no error status.
# The invariant must therefore hold without any duplicate and without any
# dead message: every message done, received exactly once, attempts 1.
#
# What can break it: a worker claims a whole batch of the endpoint's
# messages (lease 3 s) but may only send one at a time, so a message that
# waits in the worker's queue longer than the lease is taken over by the
# other worker's claim (lease_version + 1, attempts + 1) while the first
# worker still sends it later: duplicate deliveries, lost leases, attempts
# burnt, and with max_attempts 3 the reaper turns healthy messages dead
# ("lease expired on attempt 3 of 3").  Found while writing 031; see the
# report of the fault-injection work.  Expected to pass once claims take
# no more messages of an endpoint than it can have in flight (the
# cluster-wide max_in_flight reservations in progress).
#
# Settings: 2 workers, poll_interval 100ms, backoff_base 50ms, backoff_cap
# 500ms, lease 3s, endpoint timeout 2s, max_in_flight 1, max_attempts 3.
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

my $node = OdNode->create(
	'fault_narrow', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
outbox_dispatcher.lease = 3s
outbox_dispatcher.max_attempts = 3
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/narrow', delay_ms => 400, status => 200 });
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout, max_in_flight) VALUES ('narrow', '"
	  . $sink->url('/narrow') . "', interval '2 s', 1)");

my $n = 20;
$node->safe_psql('postgres',
	"SELECT outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'narrow') FROM generate_series(1, $n) g");
my $t0 = time();
ok(wait_settled($node, timeout => 40), 'every message settled');
note(sprintf('settled after %.1f s (%d x 400 ms one at a time = %.1f s)', time() - $t0, $n, $n * 0.4));
note('status|attempts|count: '
	  . join(' ', split /\n/, $node->safe_psql('postgres',
		q{SELECT status || '|' || attempts || '|' || count(*) FROM outbox.messages GROUP BY status, attempts ORDER BY 1}))
);

is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done' AND attempts = 1}),
	$n, "all $n messages done at their first attempt (the endpoint never failed)");
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'),
	'0', 'no lease was lost (no message waited in a worker longer than its lease)');
{
	my $dead = $node->safe_psql('postgres',
		q{SELECT string_agg(id || ': ' || last_error, E'\n') FROM outbox.messages WHERE status = 'dead'});
	is($dead, '', 'no healthy message reaped to dead');
}
check_invariant($node, $sink, scenario => 'healthy narrow endpoint (max_in_flight 1, 400 ms)');

$sink->stop;
$node->stop;
done_testing();
