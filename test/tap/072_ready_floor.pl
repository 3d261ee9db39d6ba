# Copyright: outbox_dispatcher contributors
#
# 072_ready_floor.pl — a worker's claim reads an endpoint's ready messages
# from its floor (src/core/ready_floor.hpp), not over the index entries of
# every message claimed since the last VACUUM, and what becomes ready
# below the floor is delivered all the same.
#
# Two workers, autovacuum off (the entries of claimed messages stay in
# messages_ready until a VACUUM), one endpoint.  Proves:
#   - a backlog of 10,000 messages whose available_at lie 20 s apart in
#     all (500 per second, as a backlog accrues while an endpoint is down)
#     is drained reading messages_ready at most 10 pages per index scan on
#     average: without the floor each claim stepped over the entries of
#     every message claimed before it (20 pages on average here with
#     the code before the floor, which fails this check), the more the
#     larger the backlog;
#   - after that drain, a message given an available_at an hour in the past
#     (below every floor) is delivered;
#   - an ordered sequence whose second message waits longer than the
#     floor's lag (1 s) for its head, which the sink answers after 1.5 s, is
#     delivered in order, each message once;
#   - a backlog of 20,000 messages inserted by one statement, which all have
#     the same available_at, is drained reading messages_ready at most 10
#     pages per index scan on average: the floor is a position (available_at,
#     id), so the claims do not step over the entries claimed before them in
#     that one available_at (34 pages on average with the floor of
#     available_at alone, which fails this check).
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OdNode;
use OdSink;
use OdTest qw(poll_until);

my $node = OdNode->create(
	'ready_floor', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 200ms
autovacuum = off
});
my $sink = OdSink->start($node->basedir);
$sink->script(path => '/slow', status => 200, delay_ms => 1500);
$node->add_endpoint('sink', $sink->url('/hook'));
$node->add_endpoint('slow', $sink->url('/slow'));

sub set_enabled
{
	my ($on) = @_;
	$node->safe_psql('postgres',
		'ALTER SYSTEM SET outbox_dispatcher.enabled = ' . ($on ? 'on' : 'off') . '; SELECT pg_reload_conf()');
	ok( poll_until(
			$node,
			q{SELECT count(*) FROM outbox.worker_stats WHERE state } . ($on ? '<>' : '=') . q{ 'paused'}, '2',
			30),
		'the workers are ' . ($on ? 'delivering' : 'paused'));
}

# pages read and index scans of messages_ready so far, as the statistics have them
sub ready_reads
{
	return split /\|/, $node->safe_psql(
		'postgres', q{
SELECT pg_stat_clear_snapshot();
SELECT s.idx_blks_hit + s.idx_blks_read, i.idx_scan
  FROM pg_statio_user_indexes AS s JOIN pg_stat_user_indexes AS i USING (indexrelid)
 WHERE s.indexrelname = 'messages_ready'});
}

set_enabled(0);
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, available_at)
SELECT 'order', g::text, 'order.created', jsonb_build_object('n', g), 'sink',
       now() - interval '30 seconds' + (g / 500) * interval '1 second'
  FROM generate_series(1, 10000) AS g});
# the statistics so far (the insert's own reads are not the workers')
sleep 1.5;
my ($pages0, $scans0) = ready_reads();
set_enabled(1);
# counted from shared memory: no query of the test reads messages_ready meanwhile
ok(poll_until($node, q{SELECT sum(delivered) FROM outbox.worker_stats}, '10000', 180), 'the backlog is delivered');
# the workers report their statistics within a second
sleep 2;
my ($pages1, $scans1) = ready_reads();
my $scans = $scans1 - $scans0;
my $per_scan = ($pages1 - $pages0) / ($scans || 1);
cmp_ok($scans, '>=', 20, "the workers claimed in many statements ($scans index scans)");
cmp_ok($per_scan, '<=', 10, sprintf('messages_ready pages read per index scan: %.1f', $per_scan));

# below every floor: an hour in the past
my $past = $node->safe_psql('postgres',
	q{SELECT outbox.enqueue('late', 'l1', 'late.created', '{}', 'sink', false, now() - interval '1 hour')});
ok(poll_until($node, qq{SELECT status FROM outbox.messages WHERE id = $past}, 'done', 60),
	'a message made available an hour in the past after the drain is delivered');

# an ordered sequence whose second message waits 1.5 s for its head
my $ids = $node->safe_psql(
	'postgres', q{
SELECT string_agg(outbox.enqueue('seq', 's1', 'seq.step', jsonb_build_object('step', g), 'slow', true)::text, ','
                  ORDER BY g)
  FROM generate_series(1, 3) AS g});
my @seq = split /,/, $ids;
ok( poll_until(
		$node, qq{SELECT count(*) FROM outbox.messages WHERE id IN ($ids) AND status = 'done'},
		'3', 60),
	'the ordered sequence behind a slow head is delivered');
is( $node->safe_psql(
		'postgres', qq{
SELECT string_agg(message_id::text, ',' ORDER BY started_at), count(*) = count(DISTINCT message_id)
  FROM outbox.attempts WHERE message_id IN ($ids)}),
	join(',', @seq) . '|t',
	'in order, each message once');

# one statement's backlog: every message has the same available_at
set_enabled(0);
$node->safe_psql('postgres', 'VACUUM outbox.messages');    # the dead entries of the drains above
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, available_at)
SELECT 'bulk', g::text, 'bulk.created', jsonb_build_object('n', g), 'sink', now() - interval '5 seconds'
  FROM generate_series(1, 20000) AS g});
sleep 1.5;
($pages0, $scans0) = ready_reads();
my $delivered0 = $node->safe_psql('postgres', q{SELECT sum(delivered) FROM outbox.worker_stats});
set_enabled(1);
ok( poll_until(
		$node, q{SELECT sum(delivered) FROM outbox.worker_stats},
		$delivered0 + 20000, 180),
	'the one-statement backlog is delivered');
sleep 2;
($pages1, $scans1) = ready_reads();
$scans = $scans1 - $scans0;
$per_scan = ($pages1 - $pages0) / ($scans || 1);
cmp_ok($scans, '>=', 40, "the workers claimed it in many statements ($scans index scans)");
cmp_ok($per_scan, '<=', 10,
	sprintf('one available_at: messages_ready pages read per index scan: %.1f', $per_scan));

$sink->stop;
$node->stop;
done_testing();
