# Copyright: outbox_dispatcher contributors
#
# 023_fault_takeover_load.pl — fault injection: requests that outlive their
# lease under load, taken over by other claims, with the stale results
# fenced.
#
# Setup: 3 workers; two endpoints created while the lease is 10 s, then the
# lease is lowered to 2 s by ALTER SYSTEM + reload (the timeout check only
# runs when an endpoint row is written):
#   'default'   -> /hook,  every request answered after 200 ms, timeout 1 s;
#   'slowfirst' -> /first, timeout 5 s; the sink never answers the FIRST
#                  request per message id (fail_first 1, fail_mode hang), so
#                  it outlives the 2 s lease and times out after 5 s; later
#                  requests get 200 at once.
# 2000 messages, one in 20 for 'slowfirst', committed in 4 transactions while
# traffic flows.
#
# Proves:
#   - every 'slowfirst' message was taken over after its lease expired
#     (lease_version >= 2) and delivered by the new owner while the first
#     request was still hanging;
#   - the stale finalizes (the 5 s timeouts) are fenced and counted:
#     outbox.health.lost_leases > 0 (at least one per 'slowfirst' message),
#     sum(outbox.worker_stats.lost_leases) > 0 and equal to it, and the
#     server log says "lost lease on message N";
#   - the nothing-is-lost invariant (OdInvariant::check_invariant) over every
#     committed message: done and received by the sink, no dead row (none is
#     legitimate: attempts stay far below max_attempts 12), nothing stuck;
#   - duplicates are allowed (lease takeover), and every duplicate id is
#     explained by a takeover: lease_version >= 2.
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
use OdInvariant qw(wait_settled check_invariant poll_until);
use OdTest qw(wait_workers_cycled);

my $t_start = time();
my $N = 2000;
my $CHUNKS = 4;

# ------------------------------------------------------------------ helpers
# $n messages in one transaction, every 20th for endpoint 'slowfirst'
sub enqueue_chunk
{
	my ($node, $n, $tag) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(outbox.enqueue('order', '$tag-' || g, 'order.$tag',
		                                jsonb_build_object('n', g, 'tag', '$tag'),
		                                CASE WHEN g % 20 = 0 THEN 'slowfirst' ELSE 'default' END))
		     FROM generate_series(1, $n) AS g});
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_takeover', conf => q{
outbox_dispatcher.workers = 3
outbox_dispatcher.lease = 10s
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
log_statement = none
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $sink = OdSink->start($node->basedir);
$sink->script([
	{ path => '/hook',  status => 200, delay_ms => 200 },
	{ path => '/first', status => 200, fail_first => 1, fail_mode => 'hang' } ]);

# the 5 s timeout is accepted while the lease is 10 s ...
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, timeout) VALUES
  ('default',   '" . $sink->url('/hook') . "',  interval '1 s'),
  ('slowfirst', '" . $sink->url('/first') . "', interval '5 s')");
# ... then the lease is lowered below it: first requests to /first outlive their lease
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.lease = '2s'});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.lease', '2s', 10), 'lease lowered to 2 s');
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL}, '3', 20),
	'three workers are running');
ok(wait_workers_cycled($node), 'workers went through their loop after the reload');

# ------------------------------------------------------------------ traffic
my $per = $N / $CHUNKS;
for my $c (1 .. $CHUNKS)
{
	is(enqueue_chunk($node, $per, "c$c"), $per, "chunk $c: $per messages committed");
	$sink->wait_requests($c * $per / 2, timeout => 20) if $c < $CHUNKS;
}
my $n_slow = $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'slowfirst'});
is($n_slow, $N / 20, "$n_slow messages go to the endpoint whose first request per id outlives the lease");

ok($sink->wait_requests($N + $n_slow, timeout => 30),
	'the sink got every message, and every slowfirst message a second time while its first request still hung');
ok(wait_settled($node, timeout => 60), 'every message settled (nothing pending or processing)');

# the hanging first requests time out 5 s after they were sent: wait for their fenced finalizes
ok( poll_until(
		$node, q{SELECT coalesce(sum(in_flight), 0) FROM outbox.worker_stats}, '0', 30),
	'no request left in flight');
ok(poll_until($node, "SELECT lost_leases >= $n_slow FROM outbox.health", 't', 15),
	"outbox.health.lost_leases >= $n_slow (one stale finalize per slowfirst message)");

# ------------------------------------------------------------------ checks
my ($lost_health, $lost_workers) = split /\|/,
  $node->safe_psql('postgres', 'SELECT (SELECT lost_leases FROM outbox.health), (SELECT sum(lost_leases) FROM outbox.worker_stats)');
note("lost leases: health $lost_health, sum(worker_stats) $lost_workers");
cmp_ok($lost_health, '>', 0, "outbox.health.lost_leases > 0 ($lost_health)");
cmp_ok($lost_workers, '>', 0, "sum(outbox.worker_stats.lost_leases) > 0 ($lost_workers)");
is($lost_workers, $lost_health, 'worker_stats and health agree on the lost leases');
like(slurp_file($node->logfile), qr/lost lease on message \d+ \(lease_version \d+\)/,
	'server log: "lost lease on message N"');

is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'slowfirst' AND lease_version >= 2 AND status = 'done'}),
	$n_slow, 'every slowfirst message was taken over (lease_version >= 2) and is done');
{
	my $ids = $sink->ids('/first');
	is(scalar(grep { $_ >= 2 } values %$ids), $n_slow, 'the sink got every slowfirst message at least twice');
	my %t;
	push @{ $t{ OdSink::header($_, 'Idempotency-Key') } }, $_->{t} for @{ $sink->requests('/first') };
	my @late = grep {
		my @x = sort { $a <=> $b } @{ $t{$_} };
		!(@x >= 2 && $x[1] - $x[0] < 5)
	} keys %t;
	is(scalar @late, 0, 'each second request came while the first one still hung (within its 5 s timeout)')
	  or diag('late takeovers: ' . join(',', @late[0 .. ($#late < 9 ? $#late : 9)]));
}

my $r = check_invariant($node, $sink,
	scenario   => 'lease takeover under load',
	dead_ok    => sub { 0 },
	dup_reason => 'lease takeover: a request outlived its lease and a newer claim sent the message again');
is($r->{messages}, $N, "all $N committed messages were checked");
cmp_ok($r->{duplicates}, '>=', $n_slow, 'at least one duplicate per slowfirst message');
{
	my $unexplained = scalar @{ $r->{duplicate_ids} }
	  ? $node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE lease_version < 2 AND id IN ('
		  . join(',', @{ $r->{duplicate_ids} }) . ')')
	  : 0;
	is($unexplained, 0, 'every duplicate id was taken over (lease_version >= 2)');
}

note(sprintf('023_fault_takeover_load: %d messages, %d duplicates, %d lost leases, %.1f s',
		$r->{messages}, $r->{duplicates}, $lost_health, time() - $t_start));
$sink->stop;
$node->stop;
done_testing();
