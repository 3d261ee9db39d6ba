# Copyright: outbox_dispatcher contributors
#
# 042_rate_limit.pl — per-endpoint limits shared by all workers
# (src/endpoint_state.cpp: token bucket behind rate_limit, cluster-wide
# in-flight count behind max_in_flight).
#
# Proves, with 4 workers and a lease of 5 s:
#   - rate_limit: endpoint "limited" with rate_limit = 40 messages/s and a
#     backlog of 2000 messages, fast sink.  Over a 5 s window after 1 s of
#     warm-up the sink's arrival times (field t) give a rate within 10 % of
#     40/s (the measured figure is reported with diag), and no 1 s window
#     holds more than 40 + the bucket (4) + 2 of slack — the limit holds
#     across the 4 workers (each on its own would send 40/s, 160 in all).
#     Then rate_limit = NULL: the rest of the backlog drains quickly.
#   - max_in_flight: endpoint "narrow" with max_in_flight = 3, sink path
#     answering after 300 ms, 100 messages (10 s of work at 3 at a time:
#     twice the lease; the lease and the 4 s timeout leave a loaded machine
#     seconds of slack over the 300 ms a request takes).  While they are
#     delivered, sampling many times the sink's own in-flight count
#     (stats.in_flight), outbox.endpoint_health.in_flight and, from the
#     arrival times, the requests that overlap: never more
#     than 3 requests at the sink at once, and 3 is reached (the check is
#     not vacuous).  Every message is delivered once, with attempts 1, no
#     lease is lost (health.lost_leases, worker_stats.lost_leases), no
#     lease expired: a worker never claims more messages of the endpoint
#     than it may send at once.  endpoint_health.in_flight returns to 0
#     (polled: a claim in progress shows its reservation for a moment; how
#     often, once idle, is reported with diag).  When a check of this part
#     fails, the attempts that were not a plain success, the longest pause
#     of this script's own sampling loop (a stalled machine shows there) and
#     the sink's in-flight timeline are reported with diag.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use List::Util qw(min);
use IPC::Run;

use OdNode;
use OdSink;
use OdTest qw(poll_until);

my $RATE = 40;

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'rate_limit', conf => q{
outbox_dispatcher.workers = 4
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
max_worker_processes = 16
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/slow', status => 200, delay_ms => 300 });
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, timeout, rate_limit, max_in_flight) VALUES
  ('limited', '" . $sink->url('/limited') . "', '2 s', $RATE, 64),
  ('narrow',  '" . $sink->url('/slow') . "',    '4 s', NULL, 3)");
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL}, '4', 10), '4 workers running');

# ------------------------------------------------------------------ rate_limit
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.created', jsonb_build_object('n', g), 'limited'
  FROM generate_series(1, 2000) AS g});
ok($sink->wait_requests(1, path => '/limited', timeout => 10), 'limited: delivery started');
my $t_first = $sink->requests('/limited', limit => 1)->[0]{t};
my ($w0, $w1) = ($t_first + 1.0, $t_first + 6.0);
sleep(0.1) while time < $w1 + 0.3;
my @t = map { $_->{t} } @{ $sink->requests('/limited') };
{
	my $n = grep { $_ >= $w0 && $_ < $w1 } @t;
	my $rate = $n / ($w1 - $w0);
	diag(sprintf('rate_limit %d/s: %d arrivals in the 5 s window, %.2f/s (%+.1f %%)',
			$RATE, $n, $rate, 100 * ($rate - $RATE) / $RATE));
	cmp_ok($rate, '>=', $RATE * 0.9, sprintf('limited: measured rate %.2f/s is at least 90 %% of %d/s', $rate, $RATE));
	cmp_ok($rate, '<=', $RATE * 1.1, sprintf('limited: measured rate %.2f/s is at most 110 %% of %d/s', $rate, $RATE));

	# the busiest 1 s window, from the first arrival on
	my ($max, $at) = (0, 0);
	for my $i (0 .. $#t)
	{
		my $c = grep { $_ >= $t[$i] && $_ < $t[$i] + 1.0 } @t[ $i .. $#t ];
		($max, $at) = ($c, $t[$i] - $t_first) if $c > $max;
	}
	diag(sprintf('rate_limit %d/s: busiest 1 s window holds %d arrivals (starting %.2f s after the first)', $RATE, $max, $at));
	cmp_ok($max, '<=', $RATE + 4 + 2, "limited: no 1 s window holds more than rate + bucket + 2 ($max)");
}
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'limited' AND status = 'processing'
		    AND lease_until < now()}),
	'0', 'limited: no expired lease');

# lift the limit: the backlog drains
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET rate_limit = NULL WHERE name = 'limited'});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'limited' AND status <> 'done'}, '0', 30),
	'limited: rate_limit = NULL, the rest of the 2000 messages drains');
{
	my $st = $sink->stats('/limited');
	is($st->{ok_distinct_ids}, 2000, 'limited: 2000 distinct ids delivered');
	is($st->{ok_duplicates}, 0, 'limited: no duplicates');
}

# ------------------------------------------------------------------ max_in_flight across workers
# Samples, in the database, endpoint_health.in_flight and the processing rows
# of "narrow" until none of its messages is left or the timeout passes.
# Returns "max in_flight|max processing|left|samples".
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION sample_narrow(timeout_s float8) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    max_if int := 0;
    max_proc int := 0;
    i int;
    p int;
    left_ int;
    n int := 0;
    deadline timestamptz := clock_timestamp() + timeout_s * interval '1 second';
BEGIN
    LOOP
        SELECT in_flight INTO i FROM outbox.endpoint_health WHERE endpoint = 'narrow';
        SELECT count(*) INTO p FROM outbox.messages WHERE endpoint = 'narrow' AND status = 'processing';
        max_if := greatest(max_if, i);
        max_proc := greatest(max_proc, p);
        n := n + 1;
        SELECT count(*) INTO left_ FROM outbox.messages WHERE endpoint = 'narrow' AND status <> 'done';
        EXIT WHEN left_ = 0 OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.002);
    END LOOP;
    RETURN format('%s|%s|%s|%s', max_if, max_proc, left_, n);
END
$$});

$sink->reset;
$sink->script({ path => '/slow', status => 200, delay_ms => 300 });
my $N = 100;
my ($sampler_out, $sampler_err) = ('', '');
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.slow', jsonb_build_object('n', g), 'narrow'
  FROM generate_series(1, $N) AS g});
my $sampler = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-d', $node->connstr('postgres'), '-c', 'SELECT sample_narrow(60)' ],
	'>', \$sampler_out, '2>', \$sampler_err);

# meanwhile, the sink's own count of requests being answered, and the
# longest pause of this loop (5 ms sleeps: seconds mean the machine stalled)
my ($sink_max, $sink_samples, $gap_max) = (0, 0, 0);
my @sink_timeline;    # [time, in_flight] whenever the count changes
my $deadline = time + 60;
my $last = time;
while (time < $deadline)
{
	my $st = $sink->stats;
	my $now = time;
	$gap_max = $now - $last if $now - $last > $gap_max;
	$last = $now;
	push @sink_timeline, [ $now, $st->{in_flight} ]
	  if !@sink_timeline || $sink_timeline[-1][1] != $st->{in_flight};
	$sink_max = $st->{in_flight} if $st->{in_flight} > $sink_max;
	$sink_samples++;
	last if ($st->{ok_distinct_ids} // 0) >= $N && $st->{in_flight} == 0;
	sleep 0.005;
}
$sampler->finish;
chomp $sampler_out;
my ($db_max_if, $db_max_proc, $left, $db_samples) = split /\|/, $sampler_out;
diag("max_in_flight 3: sink in_flight max $sink_max ($sink_samples samples, longest pause between two "
	  . sprintf('%.0f ms', 1000 * $gap_max) . "); endpoint_health.in_flight max "
	  . ($db_max_if // '?') . ", processing rows max " . ($db_max_proc // '?') . " ($db_samples samples)");
my $narrow_ok = 1;
$narrow_ok &= is($sampler_err, '', 'sampler ran without error');
$narrow_ok &= is($left, 0, "narrow: all $N messages delivered");
$narrow_ok &= cmp_ok($sink_max, '<=', 3, "narrow: the sink never had more than 3 requests in flight (max $sink_max)");
$narrow_ok &= is($sink_max, 3, 'narrow: the sink did have 3 in flight at once (the check is not vacuous)');
$narrow_ok &= cmp_ok($db_max_if, '<=', 3, "narrow: endpoint_health.in_flight never above 3 (max $db_max_if)");

# overlap from arrival times: a request occupies the sink for 300 ms after it arrived
{
	my @t = sort { $a <=> $b } map { $_->{t} } @{ $sink->requests('/slow') };
	my $max = 0;
	for my $i (0 .. $#t)
	{
		my $c = grep { $_ > $t[$i] - 0.29 && $_ <= $t[$i] } @t;
		$max = $c if $c > $max;
	}
	$narrow_ok &= cmp_ok($max, '<=', 3, "narrow: arrival times show at most 3 overlapping requests (max $max)");
	my $span = $t[-1] - $t[0];
	diag(sprintf('max_in_flight 3: %d requests of 300 ms over %.2f s (ideal %.1f s)', $N, $span, (int(($N + 2) / 3) - 1) * 0.3));
}
{
	my $st = $sink->stats('/slow');
	$narrow_ok &= is($st->{by_path}{'/slow'}, $N, "narrow: exactly $N requests");
	$narrow_ok &= is($st->{ok_distinct_ids}, $N, "narrow: $N distinct ids");
}
$narrow_ok &= is(
	$node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'narrow' AND attempts <> 1}),
	'0', 'narrow: every message delivered on its first attempt');
$narrow_ok &= is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'health.lost_leases is 0');
$narrow_ok &=
  is($node->safe_psql('postgres', 'SELECT sum(lost_leases) FROM outbox.worker_stats'), '0', 'worker_stats: no lost lease');
unless ($narrow_ok)
{
	# what happened: the attempts that were not a plain success, or slow
	diag("narrow attempts other than a success within 1 s (message, attempt, worker, started, ms, outcome, error):\n"
		  . $node->safe_psql(
			'postgres', q{
SELECT message_id, attempt, worker, to_char(started_at, 'HH24:MI:SS.MS'), round(duration_ms::numeric, 1),
       outcome, coalesce(error_class, '') || ' ' || coalesce(http_status::text, '')
  FROM outbox.attempts WHERE endpoint = 'narrow' AND (outcome <> 'done' OR duration_ms > 1000)
 ORDER BY started_at LIMIT 40}));
	diag('sink in_flight timeline (s from the first sample: count): '
		  . join(' ', map { sprintf('%.3f:%d', $_->[0] - $sink_timeline[0][0], $_->[1]) } @sink_timeline[0 .. min(80, $#sink_timeline)]));
}
# nothing is in flight any more: the places are all given back (a claim in
# progress holds a reservation for a moment, hence the poll)
ok(poll_until($node, q{SELECT in_flight FROM outbox.endpoint_health WHERE endpoint = 'narrow'}, '0', 5),
	'narrow: endpoint_health.in_flight back to 0');
{
	# how often a claim in progress shows its reservation, once idle
	$node->safe_psql('postgres', q{
CREATE FUNCTION sample_idle(n int) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v int;
    hist int[] := '{0,0,0,0,0}';
BEGIN
    FOR k IN 1 .. n LOOP
        SELECT in_flight INTO v FROM outbox.endpoint_health WHERE endpoint = 'narrow';
        hist[least(v, 4) + 1] := hist[least(v, 4) + 1] + 1;
        PERFORM pg_sleep(0.001);
    END LOOP;
    RETURN array_to_string(hist, ' ');
END $$});
	my $hist = $node->safe_psql('postgres', 'SELECT sample_idle(2000)');
	diag("narrow idle: endpoint_health.in_flight histogram (0 1 2 3 4+) over 2000 samples: $hist");
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.worker_stats WHERE claimed > 0}), '4',
	'all 4 workers took part');

$sink->stop;
$node->stop;
done_testing();
