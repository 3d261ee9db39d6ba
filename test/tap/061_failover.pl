# Copyright: outbox_dispatcher contributors
#
# 061_failover.pl — failover and switchover with a streaming standby
# (asynchronous replication over loopback; both nodes preload the library,
# same settings; outbox_dispatcher.deliver_after_replication off, the
# default).
#
# Proves:
#   - no dispatcher worker runs on a standby (BgWorkerStart_RecoveryFinished),
#     and outbox.worker_stats there shows none running;
#   - failover: the primary is crashed (immediate stop) with thousands of
#     messages queued and requests in flight; the standby is promoted; its
#     workers start and every message committed on the old primary and
#     replayed on the standby ends done and received (the nothing-lost
#     invariant over the new primary's rows); duplicates are counted and
#     each one was sent before the crash and again after the promotion
#     (requests in flight, and claims or finalizes that had not reached the
#     standby: the workers commit asynchronously and so is replication);
#     received messages the standby never got are counted (the gap that
#     deliver_after_replication closes, 062);
#   - planned switchover: the primary stopped with a fast shutdown while
#     delivering (the workers finish what is in flight and hand the rest
#     back; the shutdown waits for the standby to have all WAL), the standby
#     promoted: every message delivered exactly once — zero duplicates.
# Figures (messages, in flight at the crash, duplicates, seconds from
# promotion to the first delivery) are printed as notes; docs/operations.md
# quotes them.
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
use OdInvariant qw(wait_settled check_invariant poll_until wait_in_flight);

my $t_start = time();
my $conf = q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.lease = 3s
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
};

my $sink = OdSink->start(PostgreSQL::Test::Utils::tempdir());
$sink->script({ path => '/hook', status => 200, delay_ms => 50 });

sub enqueue_tag
{
	my ($node, $n, $tag) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(outbox.enqueue('order', '$tag-' || g, 'order.$tag', jsonb_build_object('n', g)))
		  FROM generate_series(1, $n) AS g});
}

sub ids_of
{
	my ($node, $tag) = @_;
	return split /\n/, $node->safe_psql('postgres', "SELECT id FROM outbox.messages WHERE event_type = 'order.$tag' ORDER BY id");
}

sub wait_workers
{
	my ($node, $n) = @_;
	return poll_until($node, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'},
		$n, 30);
}

# seconds from $t until the sink has more than $before requests
sub first_request_after
{
	my ($t, $before, $timeout) = @_;
	while (time() - $t < $timeout)
	{
		return time() - $t if scalar @{ $sink->requests('/hook') } > $before;
		sleep(0.02);
	}
	return undef;
}

# ------------------------------------------------------------------ a primary and its standby
my $primary = OdNode->create('fo_primary', streaming => 1, conf => $conf);
$primary->add_endpoint('default', $sink->url('/hook'), timeout => '2 s');
ok(wait_workers($primary, 2), 'two workers run on the primary');
my $standby = $primary->standby('fo_standby');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
sleep(1); # time for a wrongly started worker to show up
is($standby->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}),
	'0', 'no dispatcher worker runs on the standby');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM outbox.worker_stats WHERE pid IS NOT NULL}),
	'0', 'outbox.worker_stats on the standby: no worker running');

# ------------------------------------------------------------------ failover: crash in flight, promote
for my $k (1 .. 6)
{
	is(enqueue_tag($primary, 1000, "crash$k"), '1000', "1000 messages committed (crash$k)");
}
ok($sink->wait_requests(800, path => '/hook', timeout => 30), 'traffic flows');
my ($busy, $busy_in_flight, $sink_open) = wait_in_flight($primary, $sink, 20);
ok(defined $busy, 'requests are in flight');
my $processing = $primary->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'processing'});
my $done_before = $primary->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done'});
my $t_crash = time();
$primary->stop('immediate');
my $received_at_crash = $sink->ids('/hook') // {};
my $requests_at_crash = scalar @{ $sink->requests('/hook') };
note("at the crash: $processing rows processing, $done_before done, sink in flight " . ($sink_open // 0)
	  . ', ' . scalar(keys %$received_at_crash) . ' ids received');
cmp_ok($processing, '>', 0, "rows were processing at the crash ($processing)");
cmp_ok($done_before, '<', 6000, 'messages were still queued at the crash');

my $t_promote = time();
$standby->promote;
ok(wait_workers($standby, 2), 'the promoted standby runs two workers');
my $first = first_request_after($t_promote, $requests_at_crash, 30);
ok(defined $first, 'the new primary delivers');
note(sprintf('seconds from promotion to the first delivery: %.2f', $first // -1));

my %on_new = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT id FROM outbox.messages');
my @not_replicated = grep { !$on_new{$_} } keys %$received_at_crash;
note(scalar(@not_replicated) . ' messages the receiver got before the crash are not on the new primary (asynchronous replication)');
is(scalar(keys %on_new), 6000, 'every committed message reached the standby (the producers committed synchronously, long before)');

ok(wait_settled($standby, timeout => 90), 'the new primary settles every message');
my $r = check_invariant($standby, $sink,
	scenario   => 'failover',
	path       => '/hook',
	dead_ok    => sub { 0 },
	dup_reason => 'failover: requests in flight at the crash, and claims or finalizes not yet on the standby, were sent again');
is($r->{messages}, 6000, 'all 6000 messages checked on the new primary');
{
	my @bad;
	for my $id (@{ $r->{duplicate_ids} })
	{
		my @t = sort { $a <=> $b } map { $_->{t} } @{ $sink->requests('/hook', id => $id) };
		push @bad, $id unless @t >= 2 && $t[0] < $t_promote && $t[-1] >= $t_promote;
	}
	is(scalar @bad, 0, 'every duplicate was sent before the crash and again by the new primary')
	  or diag('unexplained duplicates: ' . join(',', @bad[0 .. ($#bad < 9 ? $#bad : 9)]));
}
note(sprintf('failover: %d messages, %d rows processing at the crash, %d duplicates, %.2f s from promotion to the first delivery',
		$r->{messages}, $processing, $r->{duplicates}, $first // -1));

# ------------------------------------------------------------------ planned switchover: fast stop, promote
my $new_primary = $standby;
$new_primary->append_conf('postgresql.conf', "wal_level = replica\nmax_wal_senders = 10\n");
$new_primary->restart;
ok(wait_workers($new_primary, 2), 'two workers on the primary after the failover');
my $standby2 = $new_primary->standby('fo_standby2');
$new_primary->wait_for_catchup($standby2);
$sink->script({ path => '/hook', status => 200, delay_ms => 20 });
is(enqueue_tag($new_primary, 4000, 'switch'), '4000', '4000 messages committed for the switchover');
my @switch_ids = ids_of($new_primary, 'switch');
ok( poll_until($new_primary,
		q{SELECT count(*) > 500 FROM outbox.messages WHERE event_type = 'order.switch' AND status = 'done'}, 't', 30),
	'delivering');
my $t_switch = time();
$new_primary->stop('fast');
note(sprintf('fast stop took %.2f s', time() - $t_switch));
my $requests_at_switch = scalar @{ $sink->requests('/hook') };
my $t_promote2 = time();
$standby2->promote;
ok(wait_workers($standby2, 2), 'the promoted standby runs two workers');
my $first2 = first_request_after($t_promote2, $requests_at_switch, 30);
ok(poll_until($standby2, q{SELECT count(*) FROM outbox.messages WHERE event_type = 'order.switch' AND status = 'done'}, '4000', 60),
	'every switchover message is done on the new primary');
my $ids = $sink->ids('/hook') // {};
my @dups = grep { ($ids->{$_} // 0) > 1 } @switch_ids;
my @never = grep { ($ids->{$_} // 0) == 0 } @switch_ids;
is(scalar @never, 0, 'the receiver got every switchover message');
is(scalar @dups, 0, 'planned switchover: zero duplicates')
  or diag('duplicates: ' . join(',', @dups[0 .. ($#dups < 9 ? $#dups : 9)]));
note(sprintf('switchover: 4000 messages, %d duplicates, %s s from promotion to the first delivery',
		scalar @dups, defined $first2 ? sprintf('%.2f', $first2) : 'n/a (nothing left to send)'));

note(sprintf('061_failover: %.1f s', time() - $t_start));
$sink->stop;
$standby2->stop;
done_testing();
