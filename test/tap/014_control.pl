# Copyright: outbox_dispatcher contributors
#
# 014_control.pl — operators steer running workers without a restart.
#
# Proves, with 2 workers:
#   - wake on commit: with poll_interval = 60 s (set before the workers
#     start) and idle workers, a message committed by enqueue() and one
#     committed by a plain INSERT are each delivered within 10 s; a
#     rolled-back transaction delivers nothing;
#   - (then poll_interval = 1 s by reload for the rest)
#   - pause: outbox_dispatcher.enabled = off + reload puts every worker in
#     state 'paused' (outbox.worker_stats) and committed messages stay
#     pending (never claimed) for 3 s although commits wake the workers;
#     enabled = on + reload resumes and all of them are delivered;
#   - batch_size is applied on SIGHUP: with the default (100) a worker holds
#     many slow messages at once; after batch_size = 3 + reload, sampling
#     outbox.messages (a PL/pgSQL loop, a fresh snapshot every statement)
#     while 24 slow (500 ms) deliveries run never shows more than 3 rows
#     processing per lease_owner (6 in all), and 3 is reached;
#   - endpoint changes take effect within one poll_interval (1 s): after the
#     URL is changed to another sink path, every message enqueued more than
#     poll_interval + 1 s later goes to the new path;
#   - endpoints.enabled = false: that endpoint's messages stay pending and
#     unclaimed (attempts 0, lease_version 0, nothing at the sink) while
#     another endpoint's messages are delivered; enqueue() refuses the
#     disabled endpoint; re-enabled, its messages are delivered.
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
use OdTest qw(poll_until wait_workers_cycled);



sub set_guc
{
	my ($node, $name, $value) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox_dispatcher.$name = '$value'");
	$node->reload;
	return poll_until($node, "SELECT current_setting('outbox_dispatcher.$name')", $value, 10)
	  && wait_workers_cycled($node);
}

sub count_where
{
	my ($node, $where) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE $where");
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'control', conf => q{
outbox_dispatcher.workers = 2
# no fallback polling during the wake-on-commit checks (changed to 1s below)
outbox_dispatcher.poll_interval = 60s
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});

my $sink = OdSink->start($node->basedir);
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url) VALUES
  ('default', '" . $sink->url('/hook') . "'),
  ('slow',    '" . $sink->url('/slow') . "'),
  ('moving',  '" . $sink->url('/v1') . "'),
  ('a',       '" . $sink->url('/a') . "'),
  ('b',       '" . $sink->url('/b') . "')");

# ------------------------------------------------------------------ wake on commit
# Workers started before CREATE EXTENSION would only notice it on a wake or
# after poll_interval: restart them so both begin idle with the extension in place.
$node->restart;
is($node->safe_psql('postgres', 'SHOW outbox_dispatcher.poll_interval'), '1min', 'poll_interval is 60 s');
ok(poll_until($node, q{SELECT string_agg(state, ',' ORDER BY worker) FROM outbox.worker_stats}, 'idle,idle', 10),
	'both workers idle');

# a rolled-back transaction delivers nothing
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT outbox.enqueue('order', 'rolled-back', 'order.created', '{"n": "rb"}');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
     VALUES ('order', 'rolled-back', 'order.created', '{"n": "rb2"}');
ROLLBACK;});

# enqueue() commit wakes the workers
my $t = time();
my $wid = $node->safe_psql('postgres',
	q{SELECT outbox.enqueue('order', 'wake1', 'order.created', '{"n": "wake1"}')});
ok($sink->wait_requests(1, path => '/hook', timeout => 10), 'enqueue() commit: delivered within 10 s (poll_interval 60 s)');
my $elapsed = time() - $t;
cmp_ok($elapsed, '<', 10, sprintf('enqueue() commit: delivered after %.2f s', $elapsed));
is(OdSink::header($sink->requests('/hook')->[0], 'Idempotency-Key'), $wid,
	'the first request after the rollback is the committed message');

# plain INSERT commit wakes the workers
$t = time();
my $wid2 = $node->safe_psql('postgres',
	q{INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
	  VALUES ('order', 'wake2', 'order.created', '{"n": "wake2"}') RETURNING id});
ok($sink->wait_requests(2, path => '/hook', timeout => 10), 'INSERT commit: delivered within 10 s (poll_interval 60 s)');
$elapsed = time() - $t;
cmp_ok($elapsed, '<', 10, sprintf('INSERT commit: delivered after %.2f s', $elapsed));

is_deeply([ sort { $a <=> $b } keys %{ $sink->ids('/hook') } ], [ sort { $a <=> $b } ($wid, $wid2) ],
	'only the two committed messages reached the sink, nothing from the rolled-back transaction');
is(count_where($node, q{aggregate_id = 'rolled-back'}), '0', 'rolled-back messages do not exist');

$sink->reset;
$sink->script({ path => '/slow', status => 200, delay_ms => 500 });
ok(set_guc($node, 'poll_interval', '1s'), 'poll_interval = 1 s reloaded');

# ------------------------------------------------------------------ pause / resume
my $claimed_before = $node->safe_psql('postgres', 'SELECT sum(claimed) FROM outbox.worker_stats');
ok(set_guc($node, 'enabled', 'off'), 'enabled = off reloaded');
ok(poll_until($node, q{SELECT string_agg(state, ',' ORDER BY worker) FROM outbox.worker_stats}, 'paused,paused', 10),
	'worker_stats: both workers paused');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.paused', jsonb_build_object('n', g)))
	    FROM generate_series(1, 20) AS g});
{
	my $deadline = time() + 3;
	my ($ok, $seen) = (1, '');
	while (time() < $deadline)
	{
		$seen = $node->safe_psql('postgres',
			q{SELECT count(*) FILTER (WHERE status = 'pending' AND attempts = 0 AND lease_version = 0)
			   FROM outbox.messages WHERE event_type = 'order.paused'});
		if ($seen ne '20') { $ok = 0; last; }
		sleep(0.2);
	}
	ok($ok, 'paused: all 20 committed messages stay pending and unclaimed for 3 s') or diag("pending: $seen");
}
is($sink->stats->{total}, 0, 'paused: nothing reached the sink');
is($node->safe_psql('postgres', 'SELECT sum(claimed) FROM outbox.worker_stats'), $claimed_before,
	'paused: worker_stats.claimed did not move');

ok(set_guc($node, 'enabled', 'on'), 'enabled = on reloaded');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE event_type = 'order.paused' AND status = 'done'}, '20', 10),
	'resumed: all 20 messages delivered');
is($sink->stats('/hook')->{distinct_ids}, 20, 'resumed: sink received the 20 ids');
ok(poll_until($node, q{SELECT string_agg(state, ',' ORDER BY worker) FROM outbox.worker_stats}, 'idle,idle', 10),
	'worker_stats: both workers idle again');

# ------------------------------------------------------------------ batch_size on SIGHUP
# Samples, as fast as the server can, the number of rows 'processing' per
# lease_owner (each statement of a VOLATILE PL/pgSQL function takes a new
# snapshot) until no message of endpoint 'slow' is left or the timeout
# passes.  Returns "max per owner|max in all|left|samples".
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION sample_processing(timeout_s float8) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    max_owner int := 0;
    max_total int := 0;
    o int;
    t int;
    left_ int;
    n int := 0;
    deadline timestamptz := clock_timestamp() + timeout_s * interval '1 second';
BEGIN
    LOOP
        SELECT coalesce(max(c), 0), coalesce(sum(c), 0) INTO o, t
          FROM (SELECT count(*) AS c FROM outbox.messages
                 WHERE status = 'processing' GROUP BY lease_owner) AS s;
        max_owner := greatest(max_owner, o);
        max_total := greatest(max_total, t);
        n := n + 1;
        SELECT count(*) INTO left_ FROM outbox.messages WHERE endpoint = 'slow' AND status <> 'done';
        EXIT WHEN left_ = 0 OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.0005);
    END LOOP;
    RETURN format('%s|%s|%s|%s', max_owner, max_total, left_, n);
END
$$});

# default batch_size 100: one worker holds many slow messages at once
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.slow', jsonb_build_object('n', g), 'slow'))
	    FROM generate_series(1, 20) AS g});
ok( poll_until(
		$node,
		q{SELECT max(c) > 3 FROM (SELECT count(*) AS c FROM outbox.messages
		   WHERE status = 'processing' GROUP BY lease_owner) AS s},
		't', 10),
	'batch_size 100: a worker holds more than 3 messages at once');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'slow' AND status <> 'done'}, '0', 15),
	'batch_size 100: slow messages delivered');

ok(set_guc($node, 'batch_size', '3'), 'batch_size = 3 reloaded');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.slow', jsonb_build_object('n', g), 'slow'))
	    FROM generate_series(101, 124) AS g});
{
	my ($max_owner, $max_total, $left, $samples) = split /\|/,
	  $node->safe_psql('postgres', 'SELECT sample_processing(30)');
	note("batch_size 3: $samples samples, max per owner $max_owner, max total $max_total");
	is($left, 0, 'batch_size 3: all 24 slow messages delivered');
	cmp_ok($max_owner, '<=', 3, "batch_size 3: never more than 3 messages processing per worker (max seen $max_owner)");
	cmp_ok($max_total, '<=', 6, "batch_size 3: never more than 6 processing in all (max seen $max_total)");
	is($max_owner, 3, 'batch_size 3: a worker did hold 3 at once (the check is not vacuous)');
}
ok(set_guc($node, 'batch_size', '100'), 'batch_size back to 100');

# ------------------------------------------------------------------ endpoint URL change
$node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'm0', 'order.moved', '{"n": 0}', 'moving')});
ok($sink->wait_requests(1, path => '/v1', timeout => 10), 'endpoint "moving" delivers to /v1');

my $t_update = time();
$node->safe_psql('postgres',
	"UPDATE outbox.endpoints SET url = '" . $sink->url('/v2') . "' WHERE name = 'moving'");
# a message every 200 ms until the first one arrives at /v2 (at most 5 s), and 1 s past
# poll_interval (1 s) + 1 s of margin, so that some are enqueued after the switch must be done
my @stream;    # [id, enqueued at]
my $switched_at;
while (time() - $t_update < 5)
{
	my $n = scalar(@stream) + 1;
	my $id = $node->safe_psql('postgres',
		"SELECT outbox.enqueue('order', 'm$n', 'order.moved', '{\"n\": $n}', 'moving')");
	push @stream, [ $id, time() ];
	$switched_at //= time() if ($sink->stats->{by_path}{'/v2'} // 0) > 0;
	last if defined $switched_at && time() - $t_update > 3;
	sleep(0.2);
}
ok(defined $switched_at, 'after the URL change messages reach /v2');
ok( poll_until(
		$node,
		"SELECT count(*) FROM outbox.messages WHERE endpoint = 'moving' AND status <> 'done'",
		'0', 10),
	'all messages of the moved endpoint delivered');
{
	my $v1 = $sink->ids('/v1');
	my $v2 = $sink->ids('/v2');
	my @late = grep { $_->[1] > $t_update + 2 } @stream;
	my @late_v1 = grep { $v1->{ $_->[0] } } @late;
	cmp_ok(scalar @late, '>', 0, 'some messages were enqueued more than poll_interval + 1 s after the change');
	is(scalar @late_v1, 0, 'every message enqueued more than poll_interval + 1 s after the change went to /v2')
	  or diag('still at /v1: ' . join(',', map { $_->[0] } @late_v1));
	is(scalar(grep { $v2->{ $_->[0] } } @late), scalar @late, '... and all of them arrived at /v2');
	is(scalar(keys %$v1) + scalar(keys %$v2), scalar(@stream) + 1, 'every message of the stream arrived once');
}

# ------------------------------------------------------------------ endpoint enabled = false
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = false WHERE name = 'b'});
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT outbox.enqueue('order', 'x', 'order.created', '{}', 'b')});
isnt($rc, 0, 'enqueue() refuses a disabled endpoint');
like($err, qr/endpoint "b" is disabled/, 'the error names the disabled endpoint');
# b's messages first (older), then a's, in one transaction
$node->safe_psql(
	'postgres', q{
BEGIN;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', 'b' || g, 'order.created', jsonb_build_object('n', g), 'b' FROM generate_series(1, 5) AS g;
SELECT count(outbox.enqueue('order', 'a' || g, 'order.created', jsonb_build_object('n', g), 'a'))
  FROM generate_series(1, 5) AS g;
COMMIT;});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'a' AND status = 'done'}, '5', 10),
	'messages of the enabled endpoint "a" delivered');
# the claims that took a's messages skipped b's, which are older (claimed first when claimable)
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FILTER (WHERE status = 'pending' AND attempts = 0 AND lease_version = 0)
		   FROM outbox.messages WHERE endpoint = 'b'}),
	'5', 'messages of the disabled endpoint "b" stay pending, never claimed');
is($sink->stats->{by_path}{'/b'} // 0, 0, 'nothing was sent to the disabled endpoint');

$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = true WHERE name = 'b'});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'b' AND status = 'done'}, '5', 10),
	're-enabled endpoint "b": its messages are delivered');
is($sink->stats('/b')->{distinct_ids}, 5, 're-enabled endpoint "b": sink received its 5 ids');

$sink->stop;
$node->stop;
done_testing();
