# Copyright: outbox_dispatcher contributors
#
# 022_fault_terminate.pl — fault injection: pg_terminate_backend() on a
# dispatcher worker with requests in flight, three times during a flow of
# 3000 messages.
#
# Proves, with 2 workers, lease 3 s, endpoint timeout 2 s, and a sink that
# answers 90 % of the messages (endpoint 'default') after 300 ms and 10 %
# (endpoint 'slow') after 1500 ms — longer than the 1 s a terminated worker
# gives its requests in flight:
#   - each termination hits a worker with requests in flight (worker_stats
#     in_flight > 0, slow rows 'processing' under its lease, sink requests
#     open); the worker logs "shutting down with N request(s) in flight"
#     with N > 0, and the postmaster restarts that worker slot (new pid)
#     while the other worker keeps delivering;
#   - the messages the terminated worker held were handed back at once with
#     the attempt refunded: every one of them that was claimed again
#     (lease_version >= 2) has attempts < lease_version, and they did not
#     wait for the lease to expire;
#   - the nothing-is-lost invariant (OdInvariant::check_invariant) over every
#     committed message: done and received by the sink, no dead row (none is
#     legitimate: attempts stay far below max_attempts 12), nothing stuck;
#   - duplicates are allowed (abandoned requests in flight are sent again),
#     there are some (the fault did hit requests in flight), and each one is
#     explained by a termination: its first request was sent at most one
#     lease before a termination and before the terminated worker exited,
#     the next one after the termination.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Time::Local qw(timegm);

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until);

my $t_start = time();
my $ROUNDS = 3;
my $PER_ROUND = 1000;

# ------------------------------------------------------------------ helpers
# "2026-11-29 20:30:32.580" (log_line_prefix %m, UTC) -> unix seconds
sub log_time
{
	my ($ts) = @_;
	my ($y, $mo, $d, $h, $mi, $s) = $ts =~ /^(\d+)-(\d+)-(\d+) (\d+):(\d+):([\d.]+)$/;
	return timegm(0, $mi, $h, $d, $mo - 1, $y) + $s;
}

# $n messages in one transaction, every 10th for endpoint 'slow'
sub enqueue_round
{
	my ($node, $n, $tag) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(outbox.enqueue('order', '$tag-' || g, 'order.$tag',
		                                jsonb_build_object('n', g, 'tag', '$tag'),
		                                CASE WHEN g % 10 = 0 THEN 'slow' ELSE 'default' END))
		     FROM generate_series(1, $n) AS g});
}

# Wait until a worker holds slow rows and has requests in flight, with
# requests open at the sink; returns (slot, pid, in_flight, sink in_flight).
sub pick_victim
{
	my ($node, $sink, $timeout) = @_;
	my $deadline = time() + ($timeout // 20);
	while (time() < $deadline)
	{
		my $open = $sink->stats->{in_flight} // 0;
		if ($open > 0)
		{
			my $row = $node->safe_psql(
				'postgres', q{
SELECT w.worker, w.pid, w.in_flight
  FROM outbox.worker_stats AS w
  JOIN (SELECT substring(lease_owner FROM 'pid-(\d+)$')::int AS pid, count(*) AS n
          FROM outbox.messages WHERE status = 'processing' AND endpoint = 'slow'
         GROUP BY 1) AS s ON s.pid = w.pid
 WHERE w.in_flight > 0
 ORDER BY s.n DESC LIMIT 1});
			return (split(/\|/, $row), $open) if $row ne '';
		}
		sleep(0.02);
	}
	return ();
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_terminate', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.lease = 3s
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
log_statement = none
log_timezone = 'UTC'
});

my $sink = OdSink->start($node->basedir);
$sink->script([
	{ path => '/hook', status => 200, delay_ms => 300 },
	{ path => '/slow', status => 200, delay_ms => 1500 } ]);
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, timeout) VALUES
  ('default', '" . $sink->url('/hook') . "', interval '2 s'),
  ('slow',    '" . $sink->url('/slow') . "', interval '2 s')");
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL AND state IN ('idle', 'delivering', 'claiming')}, '2', 20),
	'both workers are running');

# ------------------------------------------------------------------ rounds
my $log_offset = -s $node->logfile;
my (@t_term, @victims, %held);
for my $round (1 .. $ROUNDS)
{
	is(enqueue_round($node, $PER_ROUND, "r$round"), $PER_ROUND, "round $round: $PER_ROUND messages committed");
	my ($slot, $victim, $in_flight, $open) = pick_victim($node, $sink, 20);
	ok(defined $victim, "round $round: a worker holds slow messages with requests in flight");
	next unless defined $victim;
	# what it holds now (it may claim a little more before the signal lands)
	$held{$_} = 1 for split /\n/, $node->safe_psql('postgres',
		"SELECT id FROM outbox.messages WHERE status = 'processing' AND lease_owner LIKE '%/pid-$victim'");
	my $other = $node->safe_psql('postgres', "SELECT pid FROM outbox.worker_stats WHERE worker <> $slot");
	push @victims, $victim;
	my $t0 = time();
	is($node->safe_psql('postgres', "SELECT pg_terminate_backend($victim)"), 't',
		"round $round: pg_terminate_backend(worker $slot, pid $victim, in_flight $in_flight, sink open $open)");
	push @t_term, [ $t0, time() ];
	ok( poll_until(
			$node,
			"SELECT pid IS NOT NULL AND pid <> $victim FROM outbox.worker_stats WHERE worker = $slot",
			't', 15),
		"round $round: worker slot $slot was restarted with a new pid");
	is($node->safe_psql('postgres', "SELECT pid FROM outbox.worker_stats WHERE worker <> $slot"), $other,
		"round $round: the other worker was not disturbed");
}

# ------------------------------------------------------------------ settle and check
ok(wait_settled($node, timeout => 60), 'every message settled (nothing pending or processing)');
ok(poll_until($node, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 10),
	'two workers running at the end');

my @win;
{
	my $log = slurp_file($node->logfile, $log_offset);
	for my $i (0 .. $#victims)
	{
		my $v = $victims[$i];
		my ($n) = $log =~ /\[$v\] LOG:  outbox_dispatcher worker \d+: shutting down with (\d+) request\(s\) in flight/;
		ok(defined $n && $n > 0,
			"termination " . ($i + 1) . ": server log says worker pid $v was shutting down with " . ($n // '?') . ' request(s) in flight');
		my ($ts) = $log =~ /^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC \[\d+\] LOG:  background worker "outbox_dispatcher worker" \(PID $v\) exited with exit code 1/m;
		ok(defined $ts, "termination " . ($i + 1) . ": server log says worker pid $v exited (exit code 1: restarted)");
		# the window in which that worker's requests may have been abandoned
		push @win, [ $t_term[$i][0], defined $ts ? log_time($ts) : $t_term[$i][1] ];
	}
}

# handed back with the attempt refunded
my $held_list = join(',', sort { $a <=> $b } keys %held) || '0';
my ($reclaimed, $not_refunded) = split /\|/, $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE lease_version >= 2), count(*) FILTER (WHERE lease_version >= 2 AND attempts >= lease_version)
	   FROM outbox.messages WHERE id IN ($held_list)");
note(scalar(keys %held) . " messages held by the victims, $reclaimed of them claimed again");
cmp_ok($reclaimed, '>', 0, 'messages held by terminated workers were handed back and claimed again');
is($not_refunded, 0, 'every handed-back message had its attempt refunded (attempts < lease_version)');

my $r = check_invariant($node, $sink,
	scenario   => 'pg_terminate_backend x3',
	dead_ok    => sub { 0 },
	dup_reason => 'abandoned in-flight requests of a terminated worker are handed back and resent');
is($r->{messages}, $ROUNDS * $PER_ROUND, "all " . ($ROUNDS * $PER_ROUND) . " committed messages were checked");
cmp_ok($r->{duplicates}, '>', 0, 'the terminations did abandon requests in flight (some messages were resent)');

# every duplicate is explained by a termination: its first request was sent
# by a terminated worker (at most one lease before the termination, and
# before that worker exited: a worker busy in its loop when SIGTERM lands may
# still start requests until it reaches its shutdown), the next one after
# the termination
{
	my @bad;
	for my $id (@{ $r->{duplicate_ids} })
	{
		my @t = sort { $a <=> $b } map { $_->{t} } @{ $sink->requests(undef, id => $id) };
		push @bad, $id
		  unless @t >= 2 && grep { $t[0] >= $_->[0] - 3 && $t[0] <= $_->[1] + 0.2 && $t[1] >= $_->[0] } @win;
	}
	is(scalar @bad, 0, 'every duplicate was sent by a terminated worker and resent after the termination')
	  or diag('unexplained duplicates: ' . join(',', @bad[0 .. ($#bad < 9 ? $#bad : 9)]));
}
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0',
	'no lease was lost (handed-back messages did not wait for a takeover)');

note(sprintf('022_fault_terminate: %d messages, %d duplicates, %.1f s', $r->{messages}, $r->{duplicates}, time() - $t_start));
$sink->stop;
$node->stop;
done_testing();
