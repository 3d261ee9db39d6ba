# Copyright: outbox_dispatcher contributors
#
# 030_fault_endpoint_down.pl — fault injection, scenario 4: the endpoint is
# down (connection refused) while messages keep flowing.
#
# A. Endpoint down, then up again at the same address.
#    The sink listens on a fixed loopback port (chosen below the ephemeral
#    range, see start_sink_on_port).  Messages are enqueued every 100 ms for
#    the whole test.  At a quiet moment (everything sent so far is done, so
#    no request is half-way at the sink) the sink is stopped: for 3 s every
#    attempt is refused (last_error "connect error", status pending).  Then
#    a new sink starts on the same port:
#      - every message is done, none dead;
#      - every message enqueued while the endpoint was down has attempts > 1
#        and arrived with X-Outbox-Attempt = attempts; messages enqueued while
#        it was up have attempts 1;
#      - the backlog drains within poll_interval + backoff_cap (+ slack)
#        after the endpoint is back;
#      - invariant (OdInvariant) over both sinks' receipts: no duplicates
#        (a refused connection never reaches the endpoint).
#
# B. Endpoint misconfigured (URL pointing at a port where nothing listens),
#    messages retrying; an operator fixes it with
#    UPDATE outbox.endpoints SET url = <good sink> while messages keep
#    flowing:
#      - all retrying messages are done within poll_interval + backoff_cap
#        (+ slack) of the UPDATE, with attempts >= 2;
#      - messages enqueued well after the fix are done at the first attempt;
#      - invariant, no duplicates.
#
# Settings: 2 workers, poll_interval 100ms, backoff_base 50ms, backoff_cap
# 1s, lease 5s, endpoint timeout 2s, max_attempts 100 (nothing may die here).
#
# Run (as postgres, from a postgres-owned copy of the tree):
#   PATH=/usr/lib/postgresql/15/bin:$PATH \
#   PG_REGRESS=/usr/lib/postgresql/15/lib/pgxs/src/test/regress/pg_regress \
#   perl -I /usr/lib/postgresql/15/lib/pgxs/src/test/perl -I test/tap \
#        test/tap/030_fault_endpoint_down.pl
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until);

my $POLL_S = 0.1;
my $CAP_S = 1.0;
my $SLACK_S = 2.0;    # two TAP files at once on 2 cores

# ------------------------------------------------------------------ helpers

# A free loopback port below the ephemeral range (32768-60999 on Linux), so
# that no outgoing connection of the workers can take it while the sink is
# down.
sub free_fixed_port
{
	for (1 .. 200)
	{
		my $p = 20000 + int(rand(10000));
		my $s = IO::Socket::INET->new(
			LocalAddr => '127.0.0.1',
			LocalPort => $p,
			Proto => 'tcp',
			Listen => 1,
			ReuseAddr => 1) or next;
		close $s;
		return $p;
	}
	die 'no free port';
}

sub start_sink_on_port
{
	my ($dir, $name, $port) = @_;
	return OdSink->start($dir, name => $name, port => $port);
}

sub port_refuses
{
	my ($port) = @_;
	my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp', Timeout => 1);
	return 0 if $c;
	return 1;
}

# enqueue $n messages for $endpoint tagged $tag; returns their ids
sub enqueue
{
	my ($node, $endpoint, $tag, $n) = @_;
	my $out = $node->safe_psql('postgres', qq{
SELECT string_agg(outbox.enqueue('order', '$tag-' || g, 'order.created',
                                 jsonb_build_object('tag', '$tag', 'n', g), '$endpoint')::text, ',')
  FROM generate_series(1, $n) AS g});
	return split /,/, $out;
}

# enqueue $per messages every 100 ms for $secs seconds; calls $tick->() between batches
sub produce
{
	my ($node, $endpoint, $tag, $secs, $per, $tick) = @_;
	my @ids;
	my $end = time() + $secs;
	my $i = 0;
	while (time() < $end)
	{
		push @ids, enqueue($node, $endpoint, $tag . '-' . $i++, $per);
		$tick->() if $tick;
		sleep(0.1);
	}
	return @ids;
}

sub id_list { return join(',', @_) || 'NULL'; }

# requests recorded by any of the given sinks/snapshots, merged {id => count}
{

	package MergedIds;

	sub new { my ($class, @parts) = @_; return bless { parts => \@parts }, $class; }

	sub ids
	{
		my ($self) = @_;
		my %m;
		for my $p (@{ $self->{parts} })
		{
			my $h = ref $p eq 'HASH' ? $p : $p->ids;
			$m{$_} += $h->{$_} for keys %$h;
		}
		return \%m;
	}
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_down', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 1000ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.max_attempts = 100
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $dir = $node->basedir;
my $port = free_fixed_port();
my $s1 = start_sink_on_port($dir, 'up1', $port);
my $url = "http://127.0.0.1:$port/down";
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('down', '$url', interval '2 s')");

# ------------------------------------------------------------------ A: down, then up
my @up1 = produce($node, 'down', 'up1', 1.0, 5);
ok(wait_settled($node, timeout => 20), 'A: messages sent while the endpoint is up are settled');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE status = 'done'"),
	scalar(@up1), 'A: all ' . scalar(@up1) . ' messages done before the outage');
my $s1_ids = $s1->ids;
is($s1->stats->{in_flight}, 0, 'A: nothing in flight at the sink when it is stopped');
$s1->stop;
ok(port_refuses($port), "A: endpoint down: port $port refuses connections");

my $t_down = time();
my $saw_connect_error = 0;
my @down = produce(
	$node, 'down', 'down', 3.0, 5,
	sub {
		$saw_connect_error ||= $node->safe_psql('postgres', q{
SELECT count(*) > 0 FROM outbox.messages
 WHERE status = 'pending' AND attempts >= 1 AND last_error ~ '^connect error'}) eq 't';
	});
ok($saw_connect_error, 'A: while down, messages are pending with last_error "connect error ..."');
note('A: last_error while down: '
	  . $node->safe_psql('postgres',
		q{SELECT last_error FROM outbox.messages WHERE last_error IS NOT NULL ORDER BY id DESC LIMIT 1}));
# every message of the outage has been tried at least once against the closed port
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@down) . ') AND attempts = 0',
		'0', 10),
	'A: every message enqueued during the outage was attempted while the endpoint was down');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@down) . q{) AND status IN ('done', 'dead')}),
	'0', 'A: none of them is done or dead while the endpoint is down');

my $s2 = start_sink_on_port($dir, 'up2', $port);
my $t_up = time();
note(sprintf('A: endpoint was down for %.1f s', $t_up - $t_down));
my $drained_at;
my @up2 = produce(
	$node, 'down', 'up2', 1.0, 5,
	sub {
		$drained_at //= time() if $node->safe_psql('postgres',
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@down) . q{) AND status <> 'done'}) eq '0';
	});
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@down) . q{) AND status <> 'done'},
		'0', 20),
	'A: the backlog of the outage is delivered once the endpoint is back');
$drained_at //= time();
my $drain = $drained_at - $t_up;
cmp_ok($drain, '<=', $POLL_S + $CAP_S + $SLACK_S,
	sprintf('A: backlog drained %.2f s after the endpoint came back (<= poll_interval + backoff_cap + %.0f s slack)',
		$drain, $SLACK_S));
ok(wait_settled($node, timeout => 30), 'A: everything settled');

is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE status <> 'done'"),
	'0', 'A: every message is done, none dead');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@down) . ') AND attempts < 2'),
	'0', 'A: every message enqueued during the outage has attempts > 1 (' . scalar(@down) . ' messages)');
note('A: attempts of the outage messages (attempts:count): '
	  . $node->safe_psql('postgres',
		"SELECT string_agg(a || ':' || c, ' ' ORDER BY a) FROM (SELECT attempts a, count(*) c FROM outbox.messages WHERE id IN ("
		  . id_list(@down) . ') GROUP BY 1) s'));
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@up1, @up2) . ') AND attempts <> 1'),
	'0', 'A: messages enqueued while the endpoint was up: attempts 1');
{
	# what the new sink saw for the outage messages: one request each, attempt number = attempts
	my %att = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		'SELECT id, attempts FROM outbox.messages WHERE id IN (' . id_list(@down) . ')');
	my $reqs = $s2->requests('/down');
	my (%n, @bad);
	for my $r (@$reqs)
	{
		my $id = OdSink::header($r, 'Idempotency-Key');
		next unless exists $att{$id};
		$n{$id}++;
		my $a = OdSink::header($r, 'X-Outbox-Attempt');
		push @bad, "$id: X-Outbox-Attempt $a, attempts $att{$id}" unless $a == $att{$id};
	}
	is(scalar(grep { ($n{$_} // 0) != 1 } keys %att), 0, 'A: the restarted sink got each outage message exactly once');
	is(scalar(@bad), 0, 'A: each arrived with X-Outbox-Attempt = attempts') or diag(join("\n", @bad[0 .. 9]));
}
my $ra = check_invariant($node, MergedIds->new($s1_ids, $s2), scenario => 'endpoint down then up');
is($ra->{done}, scalar(@up1) + scalar(@down) + scalar(@up2), 'A: every committed message accounted for');

# ------------------------------------------------------------------ B: operator fixes the URL
$s2->stop;
$node->safe_psql('postgres', 'DELETE FROM outbox.messages');
my $sink = OdSink->start($dir, name => 'fixed');
my $bad_url = 'http://127.0.0.1:' . OdNode::closed_port() . '/nowhere';
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('misconf', '$bad_url', interval '2 s')");

my @before = enqueue($node, 'misconf', 'b0', 20);
push @before, produce($node, 'misconf', 'b', 1.0, 3);
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@before)
		  . q{) AND NOT (attempts >= 2 AND coalesce(last_error, '') ~ '^connect error')},
		'0', 15),
	'B: every message is retrying against the wrong URL (attempts >= 2, connect error)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status IN ('done', 'dead')}),
	'0', 'B: nothing done or dead before the fix');

my $good_url = $sink->url('/fixed');
$node->safe_psql('postgres', "UPDATE outbox.endpoints SET url = '$good_url' WHERE name = 'misconf'");
my $t_fix = time();
my $fixed_at;
my @during = produce(
	$node, 'misconf', 'c', 1.0, 3,
	sub {
		$fixed_at //= time() if $node->safe_psql('postgres',
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@before) . q{) AND status <> 'done'}) eq '0';
	});
sleep(0.5);
my @after = produce($node, 'misconf', 'd', 1.0, 3);
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@before) . q{) AND status <> 'done'},
		'0', 20),
	'B: every retrying message is delivered after the URL fix');
$fixed_at //= time();
my $fix_delay = $fixed_at - $t_fix;
cmp_ok($fix_delay, '<=', $POLL_S + $CAP_S + $SLACK_S,
	sprintf('B: all retrying messages done %.2f s after the UPDATE (<= poll_interval + backoff_cap + %.0f s slack)',
		$fix_delay, $SLACK_S));
ok(wait_settled($node, timeout => 30), 'B: everything settled');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.messages WHERE status <> 'done'"),
	'0', 'B: every message done, none dead');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@before) . ') AND attempts < 2'),
	'0', 'B: messages that were retrying before the fix have attempts >= 2');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@after) . ') AND attempts <> 1'),
	'0', 'B: messages enqueued 0.5 s+ after the fix are done at the first attempt (' . scalar(@after) . ')');
is($sink->stats('/fixed')->{distinct_ids}, scalar(@before) + scalar(@during) + scalar(@after),
	'B: the good URL received every message');
my $rb = check_invariant($node, $sink, scenario => 'URL fixed by an operator');

$sink->stop;
$node->stop;
done_testing();
