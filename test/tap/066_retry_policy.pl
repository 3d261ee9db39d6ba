# Copyright: outbox_dispatcher contributors
#
# 066_retry_policy.pl — per-endpoint retry schedules and attempt limits
# (endpoints.retry_schedule, endpoints.max_attempts), end to end through the
# background workers against the HTTP sink.
#
# Proves:
#   - retry_schedule {1s,2s} on an endpoint always answering 503: 3 requests
#     (one more than the schedule has delays), the gaps between them at
#     least 1 s and 2 s less 10 % (the jitter; no upper bound is asserted:
#     a loaded machine only adds to a gap), then dead with attempts 3 — while
#     the GUC backoff
#     (10–50 ms) and max_attempts (10) would have retried at once, 10 times;
#   - max_attempts 2 with the same schedule: dead after 2 requests;
#   - max_attempts 1 without a schedule: dead after the first 503;
#   - an endpoint with neither keeps the GUCs: 10 requests, tens of ms apart;
#   - a change of retry_schedule is picked up by the workers at commit.
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

my $node = OdNode->create(
	'retry_policy', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 10
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});
my $sink = OdSink->start($node->basedir);

for my $p (qw(/sched /capped /one /gucs /later))
{
	$sink->script({ path => $p, status => 503 });
}
# breaker_threshold 0: no breaker, so only the schedule spaces the attempts
$node->safe_psql('postgres', "
INSERT INTO outbox.endpoints (name, url, retry_schedule, max_attempts, breaker_threshold) VALUES
  ('sched',  '" . $sink->url('/sched') . "',  '{1s,2s}', NULL, 0),
  ('capped', '" . $sink->url('/capped') . "', '{1s,2s}', 2,    0),
  ('one',    '" . $sink->url('/one') . "',    NULL,      1,    0),
  ('gucs',   '" . $sink->url('/gucs') . "',   NULL,      NULL, 0),
  ('later',  '" . $sink->url('/later') . "',  NULL,      NULL, 0);");
ok(wait_workers_cycled($node), 'workers loaded the endpoints');

my %id;
for my $ep (qw(sched capped one gucs))
{
	$id{$ep} = $node->safe_psql('postgres',
		"SELECT outbox.enqueue('order', '$ep', 'order.created', '{}', '$ep')");
}
ok(poll_until($node,
		"SELECT count(*) FROM outbox.messages WHERE id IN ($id{sched}, $id{capped}, $id{one}, $id{gucs}) AND status = 'dead'",
		'4', 30),
	'all four messages end dead');

my %want = (sched => 3, capped => 2, one => 1, gucs => 10);
for my $ep (sort keys %want)
{
	my ($st, $att) = split /\|/, $node->safe_psql('postgres',
		"SELECT status, attempts FROM outbox.messages WHERE id = $id{$ep}");
	is("$st $att", "dead $want{$ep}", "$ep: dead after $want{$ep} attempts");
	is(scalar @{ $sink->requests("/$ep", id => $id{$ep}) }, $want{$ep}, "$ep: $want{$ep} requests reached the sink");
}

# the gaps follow the schedule: 1 s then 2 s, less at most 10 % of jitter
my @t = map { $_->{t} } @{ $sink->requests('/sched', id => $id{sched}) };
if (@t == 3)
{
	my ($g1, $g2) = ($t[1] - $t[0], $t[2] - $t[1]);
	cmp_ok($g1, '>=', 0.9, sprintf('sched: first gap %.3f s >= 0.9 s', $g1));
	cmp_ok($g2, '>=', 1.8, sprintf('sched: second gap %.3f s >= 1.8 s', $g2));
}
else
{
	fail('sched: three requests to measure the gaps of');
}
my @tc = map { $_->{t} } @{ $sink->requests('/capped', id => $id{capped}) };
cmp_ok(@tc == 2 ? $tc[1] - $tc[0] : 0, '>=', 0.9, 'capped: its one retry waited the schedule\'s first delay');
my @tg = map { $_->{t} } @{ $sink->requests('/gucs', id => $id{gucs}) };
cmp_ok($tg[-1] - $tg[0], '<', 5, 'gucs: ten attempts within the GUC backoff (well under the schedule)');

# a schedule set later is picked up at commit
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET retry_schedule = '{1500ms}', max_attempts = 2 WHERE name = 'later'});
ok(wait_workers_cycled($node), 'workers reloaded the endpoints');
my $lid = $node->safe_psql('postgres', "SELECT outbox.enqueue('order', 'later', 'order.created', '{}', 'later')");
ok(poll_until($node, "SELECT status || ' ' || attempts FROM outbox.messages WHERE id = $lid", 'dead 2', 20),
	'later: dead after the 2 attempts its new max_attempts allows');
my @tl = map { $_->{t} } @{ $sink->requests('/later', id => $lid) };
cmp_ok(@tl == 2 ? $tl[1] - $tl[0] : 0, '>=', 1.35, 'later: the retry waited the new schedule (1.5 s - 10 %)');

$sink->stop;
$node->stop;
done_testing();
