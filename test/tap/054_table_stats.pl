# Copyright: outbox_dispatcher contributors
#
# 054_table_stats.pl — the workers report their table statistics, so
# pg_stat_user_tables and autovacuum see what they do.
#
# Proves, while 2 workers deliver 3,000 messages (a claim and a finalize
# UPDATE each) and worker 0's retention (1 s) deletes the done rows:
#   - n_tup_upd of outbox.messages reaches at least 6,000 and n_tup_del
#     rises while the workers are still running (not only when one exits);
#   - n_dead_tup rose above 0 at some point;
#   - autovacuum (naptime 1 s, the table's threshold lowered to 500)
#     processes outbox.messages under that load.
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

my $N = 3000;

my $node = OdNode->create(
	'table_stats', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.retention = 1s
autovacuum_naptime = 1s
});
my $sink = OdSink->start($node->basedir);
my $url = $sink->url('/hook');
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
ALTER TABLE outbox.messages SET (autovacuum_vacuum_threshold = 500, autovacuum_analyze_threshold = 500);
INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$url');
});
my @pids_before = split /\n/,
  $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker' ORDER BY pid});

my $saw_dead = 0;
for my $chunk (1 .. 10)
{
	$node->safe_psql('postgres',
		"INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
		 SELECT 'order', g::text, 'order.created', '{}' FROM generate_series(1, " . ($N / 10) . ") AS g");
	sleep 0.2;
	$saw_dead ||= $node->safe_psql('postgres',
		q{SELECT n_dead_tup > 0 FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass}) eq 't';
}
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status <> 'done'}, '0', 60), "all $N messages done");

ok( poll_until(
		$node,
		"SELECT n_tup_upd >= " . (2 * $N) . " FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass",
		't', 20),
	'n_tup_upd counts the workers\' claim and finalize updates (>= 2 per message)');
ok( poll_until(
		$node, q{SELECT n_tup_del > 0 FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass}, 't', 30),
	'n_tup_del counts the retention deletes');
for (1 .. 50)
{
	last if $saw_dead;
	$saw_dead = $node->safe_psql('postgres',
		q{SELECT n_dead_tup > 0 OR autovacuum_count > 0 FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass}) eq 't';
	sleep 0.1;
}
ok($saw_dead, 'n_dead_tup rose (or autovacuum already cleaned them)');
ok( poll_until(
		$node, q{SELECT autovacuum_count > 0 FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass}, 't', 60),
	'autovacuum processed outbox.messages');
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(pid::text, E'\n' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}),
	join("\n", @pids_before),
	'the same workers are still running: the statistics came from running workers');

$node->stop;
done_testing();
