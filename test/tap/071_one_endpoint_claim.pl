# Copyright: outbox_dispatcher contributors
#
# 071_one_endpoint_claim.pl — the lean claim statement (SQL_CLAIM_ONE in
# transitions.cpp), which the workers run when no lease check is due and a
# single endpoint has a quota, keeps the general claim's rules.
#
# One endpoint, max_in_flight 2, a sink that answers after 300 ms, one
# worker (its finalize and its next claim share a transaction, so the
# claimed rows never outnumber the quota), auto_explain on every
# statement.  Proves:
#   - the workers claim with the lean statement (its plans are logged) and
#     read outbox.messages through messages_ready, never by a sequential
#     or bitmap scan;
#   - a message whose available_at is 3 s ahead is not sent before then;
#   - an ordered message waits for the earlier message of its sequence,
#     which becomes available 3 s later than it: sent after that one's
#     request ended;
#   - the endpoint's quota bounds the claim (LIMIT least(batch, quota)):
#     never more than 2 messages in processing at once (sampled until all
#     are done) nor 2 requests at once (from the attempt log), from 12
#     messages committed together and batch_size 100;
#   - every message is delivered exactly once.
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
	'one_endpoint', conf => q{
shared_preload_libraries = 'outbox_dispatcher,auto_explain'
outbox_dispatcher.workers = 1
outbox_dispatcher.poll_interval = 200ms
auto_explain.log_min_duration = 0
auto_explain.log_nested_statements = on
log_line_prefix = '%m [%p] %b: '
});
my $sink = OdSink->start($node->basedir);
$sink->script(path => '/one', status => 200, delay_ms => 300);
$node->add_endpoint('one', $sink->url('/one'), max_in_flight => 2);
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'idle'}, '1', 30),
	'the worker is idle');
my $log_offset = -s $node->logfile;

# one commit: a message 3 s ahead; an ordered sequence whose head is 3 s
# ahead and whose second message is available now; 12 plain messages
my $ids = $node->safe_psql(
	'postgres', q{
SELECT string_agg(id::text, ',' ORDER BY k) FROM (
  SELECT 1 AS k, outbox.enqueue('later', 'l1', 'later.created', '{}', 'one', false, now() + interval '3 seconds') AS id
  UNION ALL
  SELECT 2, outbox.enqueue('seq', 's1', 'seq.head', '{}', 'one', true, now() + interval '3 seconds')
  UNION ALL
  SELECT 3, outbox.enqueue('seq', 's1', 'seq.next', '{}', 'one', true)
  UNION ALL
  SELECT 3 + g, outbox.enqueue('plain', g::text, 'plain.created', jsonb_build_object('n', g), 'one')
    FROM generate_series(1, 12) AS g) AS x});
my ($later, $head, $next) = split /,/, $ids;

# the most messages in processing at once, sampled until every message is done
my ($max_processing, $open) = (0, -1);
for (my $deadline = time + 60; $open != 0 && time < $deadline;)
{
	my ($processing, $left) = split /\|/,
	  $node->safe_psql('postgres',
		q{SELECT count(*) FILTER (WHERE status = 'processing'), count(*) FILTER (WHERE status <> 'done') FROM outbox.messages});
	$max_processing = $processing if $processing > $max_processing;
	$open = $left;
}
is($open, '0', 'every message delivered');
cmp_ok($max_processing, '<=', 2, "never more than max_in_flight (2) messages in processing ($max_processing at most)");
cmp_ok($max_processing, '>=', 1, 'the sampling saw messages in processing');
is($node->safe_psql('postgres', q{SELECT count(*), count(DISTINCT message_id) FROM outbox.attempts}),
	'15|15', 'one attempt per message');

cmp_ok(
	$node->safe_psql('postgres',
		"SELECT extract(epoch FROM a.started_at - m.available_at) FROM outbox.attempts a
		   JOIN outbox.messages m ON m.id = a.message_id WHERE m.id = $later"),
	'>=', 0, 'the message 3 s ahead was not sent before its available_at');
cmp_ok(
	$node->safe_psql('postgres',
		"SELECT extract(epoch FROM (SELECT started_at FROM outbox.attempts WHERE message_id = $next)
		                        - (SELECT started_at + duration_ms * interval '1 ms' FROM outbox.attempts
		                            WHERE message_id = $head))"),
	'>=', 0, 'the ordered message was sent after the head of its sequence, available 3 s later');

# the most requests in flight at once: for each attempt, the attempts that had started and not yet
# ended when it started (5 ms of slack for the clock reads around a request)
my $overlap = $node->safe_psql(
	'postgres', q{
SELECT max(n) FROM (
  SELECT (SELECT count(*) FROM outbox.attempts b
           WHERE b.started_at <= a.started_at
             AND b.started_at + (b.duration_ms - 5) * interval '1 ms' > a.started_at) AS n
    FROM outbox.attempts a) AS x});
cmp_ok($overlap, '<=', 2, "never more than max_in_flight (2) requests at once ($overlap)");
cmp_ok($overlap, '>=', 1, 'the overlap query sees the requests');

# the plans: the lean statement is the one with LIMIT least(batch, quota)
sleep 0.5;
my @plans = grep { /\] outbox_dispatcher worker: LOG:  duration: [\d.]+ ms  plan:/ && /outbox\.messages/ }
  split /\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] )/, slurp_file($node->logfile, $log_offset);
my @lean = grep { /LIMIT least\(\$2, \$6\)/ } @plans;
cmp_ok(scalar(@lean), '>=', 5, 'the workers claimed with the lean statement (' . scalar(@lean) . ' claims)');
is(scalar(grep { !/Index Scan using messages_ready on messages m/ } @lean), 0,
	'each lean claim reads messages_ready');
my @bad = grep { /Seq Scan on messages|Bitmap Heap Scan on messages/ } @lean;
is(scalar(@bad), 0, 'no lean claim scans outbox.messages sequentially or by bitmap')
  or diag(substr($bad[0], 0, 3000));

$sink->stop;
$node->stop;
done_testing();
