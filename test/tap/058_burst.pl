# Copyright: outbox_dispatcher contributors
#
# 058_burst.pl — a burst committed at once spreads over the workers, also
# when batch_size exceeds a worker's share of the endpoint's max_in_flight.
#
# 2 workers, batch_size 500, poll_interval 1 h (so only wakes can bring a
# worker in), an endpoint with max_in_flight 64 whose answers take 30 ms:
# one commit of 3,000 messages wakes one worker.  Proves:
#   - every message is delivered (long before any poll);
#   - both workers delivered a real part of them (at least 20% each): a
#     worker whose claim comes back full wakes an idle peer, and a claim
#     reserves at most its worker's share of the 64 places (32), so the
#     first worker cannot take them all and leave the other with nothing;
#   - the endpoint never had more than 64 requests in flight (the sink's
#     in-flight maximum), and no lease was lost.
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
	'burst', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.batch_size = 500
outbox_dispatcher.poll_interval = 3600s
});
my $sink = OdSink->start($node->basedir);
$sink->script(path => '/slow', status => 200, delay_ms => 30);
my $url = $sink->url('/slow');
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url, max_in_flight) VALUES ('default', '$url', 64);
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'idle'}, '2', 30),
	'both workers idle');

$node->safe_psql('postgres',
	"INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
	 SELECT 'order', g::text, 'order.created', jsonb_build_object('n', g) FROM generate_series(1, $N) AS g");
my ($max_in_flight, $samples, $done) = (0, 0, 0);
my $deadline = time + 300;
while (time < $deadline)
{
	my $st = $sink->stats('/slow');
	$max_in_flight = $st->{in_flight} if $st->{in_flight} > $max_in_flight;
	$samples++;
	$done = $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done'});
	last if $done == $N;
	sleep 0.02;
}
is($done, $N, "all $N messages delivered");

my @delivered = split /\n/,
  $node->safe_psql('postgres', 'SELECT delivered FROM outbox.worker_stats ORDER BY worker');
is(scalar @delivered, 2, 'two workers');
for my $w (0, 1)
{
	cmp_ok($delivered[$w], '>=', $N * 0.2, "worker $w delivered a real part of the burst ($delivered[$w])");
}
cmp_ok($max_in_flight, '<=', 64,
	"the endpoint never had more than max_in_flight requests at once (max $max_in_flight in $samples samples)");
cmp_ok($max_in_flight, '>=', 33, 'both workers had requests in flight at once (more than one share of 32)');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'no lost lease');

$sink->stop;
$node->stop;
done_testing();
