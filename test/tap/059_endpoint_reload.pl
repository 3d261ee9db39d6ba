# Copyright: outbox_dispatcher contributors
#
# 059_endpoint_reload.pl — the workers reload their endpoints when a change
# of outbox.endpoints commits (src/wake.cpp: the endpoints_changed statement
# trigger bumps the shared endpoints_generation at commit; src/worker.cpp
# reloads when it moved; core/schedule: refresh_now, refresh_period_us).
#
# Proves, with 2 workers and poll_interval = 1 hour (so that no periodic
# reload can be what makes a test pass):
#   - an endpoint inserted after the workers loaded theirs is delivered to
#     within seconds;
#   - a changed URL is used for the next message;
#   - a change that is rolled back is not: the next message still goes to
#     the URL committed before;
#   - pause_endpoint() stops deliveries (messages inserted meanwhile stay
#     pending, attempts 0) and resume_endpoint() delivers them;
#   - a reload signalled while the workers wait for a lock on
#     outbox.endpoints (a wait that consumes their latch wake) is applied as
#     soon as the lock is released, not at the next deadline;
#   - no ERROR in the server log.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IPC::Run;

use OdNode;
use OdSink;
use OdTest qw(poll_until);

my $node = OdNode->create(
	'reload', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 1h
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});
my $sink = OdSink->start($node->basedir);
my $log_offset = -s $node->logfile;

sub enqueue
{
	my ($endpoint, $key) = @_;
	return $node->safe_psql('postgres', "SELECT outbox.enqueue('order', '$key', 'order.created', '{}', '$endpoint')");
}

sub delivered_to
{
	my ($path) = @_;
	return $sink->stats($path)->{ok_distinct_ids} // 0;
}

$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url) VALUES ('a', '" . $sink->url('/a1') . "')");
my $id = enqueue('a', 'first');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 15), 'the workers deliver to "a"');

# ------------------------------------------------------------------ a new endpoint
$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url) VALUES ('b', '" . $sink->url('/b') . "')");
$id = enqueue('b', 'new');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 10),
	'an endpoint inserted later is delivered to, long before poll_interval');
is(delivered_to('/b'), 1, 'the sink got it at the new endpoint\'s URL');

# ------------------------------------------------------------------ a changed URL
$node->safe_psql('postgres', "UPDATE outbox.endpoints SET url = '" . $sink->url('/a2') . "' WHERE name = 'a'");
$id = enqueue('a', 'moved');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 10), 'delivered after the URL change');
is(delivered_to('/a2'), 1, 'to the new URL');
is(delivered_to('/a1'), 1, 'and not to the old one');

# ------------------------------------------------------------------ a rolled-back change
$node->safe_psql('postgres',
	"BEGIN; UPDATE outbox.endpoints SET url = '" . $sink->url('/a3') . "' WHERE name = 'a'; ROLLBACK;");
$id = enqueue('a', 'rolled-back');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 10), 'delivered after the rollback');
is(delivered_to('/a2'), 2, 'to the committed URL');
is(delivered_to('/a3'), 0, 'never to the rolled-back one');

# ------------------------------------------------------------------ pause and resume
is($node->safe_psql('postgres', q{SELECT outbox.pause_endpoint('b', 'test')}), 't', 'pause_endpoint(b)');
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.paused', '{}', 'b' FROM generate_series(1, 3) AS g});
sleep 1;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'b' AND status = 'pending' AND attempts = 0}),
	'3', 'a paused endpoint gets nothing: its messages wait, attempts 0');
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('b')}), 't', 'resume_endpoint(b)');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'b' AND status = 'done'}, '4', 10),
	'resumed: its messages are delivered');

# ------------------------------------------------------------------ a signal during a lock wait
# A reload makes both workers re-read outbox.endpoints while another session
# holds it locked: they wait for the lock (a wait that consumes their latch
# wakes).  A second reload (enabled = off) arrives during that wait.  Once
# the lock is released they must act on it at once, not sleep until the next
# deadline (the safety poll, 30 s).
my $locker = IPC::Run::start(
	[ 'psql', '-X', '-d', $node->connstr('postgres'), '-c',
	  'BEGIN; LOCK TABLE outbox.endpoints IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;' ],
	'>', \my $lock_out, '2>', \my $lock_err);
ok($node->poll(q{SELECT count(*) FROM pg_locks WHERE relation = 'outbox.endpoints'::regclass AND mode = 'AccessExclusiveLock' AND granted}, '1', 10),
	'another session holds outbox.endpoints locked');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok($node->poll(q{SELECT count(*) FROM pg_locks WHERE relation = 'outbox.endpoints'::regclass AND NOT granted}, '2', 10),
	'both workers wait for the lock to reload their endpoints');
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf();');
$locker->finish;
my $t0 = time;
ok($node->poll(q{SELECT string_agg(state, ',' ORDER BY worker) FROM outbox.worker_stats}, 'paused,paused', 10),
	'the reload that came during the lock wait is applied');
cmp_ok(time - $t0, '<', 3, sprintf('... at once once the lock is released (%.2f s)', time - $t0));
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.enabled = on; SELECT pg_reload_conf();');

{
	my @errors = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, slurp_file($node->logfile, $log_offset);
	is(scalar @errors, 0, 'no ERROR in the server log') or diag(join("\n", @errors));
}

$sink->stop;
$node->stop;
done_testing();
