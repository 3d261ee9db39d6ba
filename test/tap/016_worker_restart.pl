# Copyright: outbox_dispatcher contributors
#
# 016_worker_restart.pl — retention purge by the workers, and workers that
# are terminated are restarted without losing messages.
#
# Proves, with 2 workers:
#   - retention (outbox_dispatcher.retention, purged by worker 0): with
#     retention = 1 h, done rows whose done_at is back-dated by 2 h are
#     deleted while fresh done rows, dead rows and pending rows stay; after
#     retention = 1 (second) + reload, every done row older than that is
#     deleted (dead and pending rows still stay);
#   - pg_terminate_backend on an idle worker: the postmaster restarts it (a
#     new pid for that worker slot in pg_stat_activity and worker_stats
#     within a few seconds) and delivery continues (100 new messages done);
#   - pg_terminate_backend on a worker with requests in flight (sink delays
#     them 4 s, longer than the 1 s the worker gives them at shutdown): the worker logs that it shuts down with requests in flight,
#     hands its messages back at once with the attempt refunded (they are
#     delivered again long before the 60 s lease could expire, claimed twice
#     — lease_version 2 — but with attempts 1), no lease is lost, every
#     message ends done and the sink has every id.
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
use OdTest qw(poll_until);


# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'restart', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.retention = 3600
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/missing', status => 404 });
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url) VALUES
  ('default', '" . $sink->url('/hook') . "'),
  ('slow',    '" . $sink->url('/slow') . "'),
  ('missing', '" . $sink->url('/missing') . "')");
ok(poll_until($node, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 20),
	'two workers running');

# ------------------------------------------------------------------ retention
$node->safe_psql(
	'postgres', q{
SELECT count(outbox.enqueue('order', g::text, 'order.old', jsonb_build_object('n', g))) FROM generate_series(1, 30) AS g;
SELECT count(outbox.enqueue('order', g::text, 'order.fresh', jsonb_build_object('n', g))) FROM generate_series(1, 10) AS g;
SELECT count(outbox.enqueue('order', g::text, 'order.missing', jsonb_build_object('n', g), 'missing')) FROM generate_series(1, 5) AS g;
SELECT count(outbox.enqueue('order', g::text, 'order.future', jsonb_build_object('n', g), 'default', false,
                            now() + interval '1 day')) FROM generate_series(1, 5) AS g;
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status IN ('done', 'dead')}, '45', 20),
	'40 messages done, 5 dead');
# dead and future rows look old too: only done rows may be purged
$node->safe_psql(
	'postgres', q{
UPDATE outbox.messages SET done_at = now() - interval '2 hours', created_at = now() - interval '3 hours'
 WHERE event_type = 'order.old';
UPDATE outbox.messages SET created_at = now() - interval '3 hours'
 WHERE event_type IN ('order.missing', 'order.future');
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE event_type = 'order.old'}, '0', 20),
	'retention 1 h: done rows back-dated by 2 h are purged');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(event_type || ':' || status || ':' || n, ',' ORDER BY event_type)
		    FROM (SELECT event_type, status, count(*) AS n FROM outbox.messages GROUP BY 1, 2) AS s}),
	'order.fresh:done:10,order.future:pending:5,order.missing:dead:5',
	'retention 1 h: fresh done rows, dead rows and pending rows are kept');

$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.retention = 1');
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.retention', '1s', 10), 'retention = 1 s reloaded');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}, '0', 25),
	'retention 1 s: every done row is purged');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(event_type || ':' || status || ':' || n, ',' ORDER BY event_type)
		    FROM (SELECT event_type, status, count(*) AS n FROM outbox.messages GROUP BY 1, 2) AS s}),
	'order.future:pending:5,order.missing:dead:5',
	'retention 1 s: dead and pending rows are kept');
# no more purging for the rest of the test
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.retention = 0');
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.retention', '0', 10), 'retention = 0 (keep) reloaded');
$node->safe_psql('postgres', q{DELETE FROM outbox.messages});

# ------------------------------------------------------------------ terminate an idle worker
my ($w1pid) = $node->safe_psql('postgres', 'SELECT pid FROM outbox.worker_stats WHERE worker = 1');
my ($w0pid) = $node->safe_psql('postgres', 'SELECT pid FROM outbox.worker_stats WHERE worker = 0');
like($w1pid, qr/^\d+$/, "worker 1 runs as pid $w1pid");
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($w1pid)"), 't', 'pg_terminate_backend(worker 1)');
ok( poll_until(
		$node,
		qq{SELECT count(*) FROM pg_stat_activity
		    WHERE backend_type = 'outbox_dispatcher worker' AND pid NOT IN ($w0pid, $w1pid)},
		'1', 10),
	'a new worker process appears in pg_stat_activity');
ok( poll_until(
		$node, q{SELECT pid IS NOT NULL AND state = 'idle' FROM outbox.worker_stats WHERE worker = 1}, 't', 10),
	'worker slot 1 is running again');
my $new_w1pid = $node->safe_psql('postgres', 'SELECT pid FROM outbox.worker_stats WHERE worker = 1');
isnt($new_w1pid, $w1pid, "worker 1 restarted with a new pid ($w1pid -> $new_w1pid)");
is($node->safe_psql('postgres', 'SELECT pid FROM outbox.worker_stats WHERE worker = 0'), $w0pid,
	'worker 0 was not disturbed');
is($node->worker_pids, join(',', sort { $a <=> $b } ($w0pid, $new_w1pid)),
	'pg_stat_activity lists exactly the two current workers');

$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.after_restart', jsonb_build_object('n', g)))
	    FROM generate_series(1, 100) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}, '100', 20),
	'delivery continues after the restart: 100 messages done');

# ------------------------------------------------------------------ terminate a worker with requests in flight
$sink->reset;
$sink->script({ path => '/slow', status => 200, delay_ms => 4000 });
my $log_offset = -s $node->logfile;
my $ids = $node->safe_psql('postgres',
	q{SELECT string_agg(outbox.enqueue('order', g::text, 'order.slow', jsonb_build_object('n', g), 'slow')::text, ',')
	    FROM generate_series(1, 10) AS g});
ok($sink->wait_requests(10, path => '/slow', timeout => 10), 'all 10 slow requests are in flight');
my ($victim, $held) = split /\|/, $node->safe_psql(
	'postgres', q{
SELECT substring(lease_owner FROM 'pid-(\d+)'), count(*) FROM outbox.messages
 WHERE status = 'processing' GROUP BY lease_owner ORDER BY count(*) DESC, lease_owner LIMIT 1});
cmp_ok($held, '>=', 1, "worker pid $victim holds $held message(s) in flight");
my @victim_ids = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM outbox.messages WHERE status = 'processing' AND lease_owner LIKE '%/pid-$victim' ORDER BY id");
# later requests are answered at once
$sink->script({ path => '/slow', status => 200, delay_ms => 0 });
my $t_kill = time();
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($victim)"), 't', 'pg_terminate_backend(worker in flight)');

ok( poll_until(
		$node,
		"SELECT count(*) FROM outbox.messages WHERE id IN ($ids) AND status = 'done'", '10', 20),
	'all 10 messages are done after the terminate');
cmp_ok(time() - $t_kill, '<', 30, 'the released messages did not wait for the 60 s lease to expire');
my $vlist = join(',', @victim_ids);
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(DISTINCT lease_version || '/' || attempts, ',') FROM outbox.messages WHERE id IN ($vlist)"),
	'2/1', "the terminated worker's messages were claimed again (lease_version 2) with the attempt refunded (attempts 1)");
my $seen = $sink->ids('/slow');
is(scalar(grep { ($seen->{$_} // 0) >= 2 } @victim_ids), scalar(@victim_ids),
	"the sink got every released message again");
is(scalar(grep { $seen->{$_} } split /,/, $ids), 10, 'the sink got all 10 ids');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'no lease was lost');
ok( poll_until(
		$node,
		qq{SELECT count(*) FROM pg_stat_activity
		    WHERE backend_type = 'outbox_dispatcher worker' AND pid <> $victim},
		'2', 10),
	'the terminated worker was replaced: two workers running again');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/outbox_dispatcher worker \d+: shutting down with \d+ request\(s\) in flight/,
	'server log: the worker shut down with requests in flight');
unlike($log, qr/lost lease/, 'server log: no lost lease');

$sink->stop;
$node->stop;
done_testing();
