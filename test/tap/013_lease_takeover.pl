# Copyright: outbox_dispatcher contributors
#
# 013_lease_takeover.pl — lease expiry, takeover by another worker, and the
# fencing of the stale worker's finalize.
#
# Proves, with 2 workers and batch_size = 1 (a worker with one message in
# flight has no room to claim, so only the *other* worker can take over):
#   - a request that outlives its lease (sink answers the first request per
#     id after 4 s; endpoint timeout 5 s; lease lowered to 1 s after the
#     endpoint was created) does not block delivery: the other worker claims
#     the expired lease (lease_version 2, attempts 2, a different
#     lease_owner) and delivers it; the sink sees both deliveries of the id
#     (X-Outbox-Attempt 1 and 2);
#   - the first worker's late 200 is fenced: the row stays as the new owner
#     left it (done, lease_version 2), the lost lease is counted in
#     outbox.health.lost_leases and in outbox.worker_stats (on the worker
#     that lost it), and the server log says "lost lease";
#   - each worker claimed the message once, and it was delivered once per
#     the counters (the stale success is not counted as a delivery).
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



# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'lease', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.batch_size = 1
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'idle'}, '2', 20),
	'both workers are up and idle');

my $sink = OdSink->start($node->basedir);
# the first request is answered after 4 s; later ones at once (the script in
# force when a request arrives decides its answer)
$sink->script({ path => '/slow', status => 200, delay_ms => 4000 });

# timeout 5 s is accepted while the lease is the default 60 s ...
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('default', '"
	  . $sink->url('/slow') . "', interval '5 s')");
# ... then the lease is lowered below it: a request can now outlive its lease
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.lease = '1s'});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.lease', '1s', 10), 'lease lowered to 1 s');
ok(wait_workers_cycled($node), 'workers went through their loop after the reload');

# ------------------------------------------------------------------ first claim
my $id = $node->safe_psql('postgres',
	q{SELECT outbox.enqueue('order', '7', 'order.created', '{"order": 7}')});
ok($sink->wait_requests(1, path => '/slow', timeout => 10), 'first request reached the sink');
$sink->script({ path => '/slow', status => 200, delay_ms => 0 });

my ($owner1, $ver1, $att1) = split /\|/, $node->safe_psql('postgres',
	"SELECT lease_owner, lease_version, attempts
	   FROM outbox.messages WHERE id = $id AND status = 'processing'");
is("$ver1|$att1", '1|1', 'first claim: lease_version 1, attempts 1');
like($owner1 // '', qr/^worker-\d+\/pid-\d+$/, "first claim owned by a worker ($owner1)");

# ------------------------------------------------------------------ takeover
ok( poll_until(
		$node, "SELECT status, lease_version, attempts FROM outbox.messages WHERE id = $id",
		'done|2|2', 10),
	'after the lease expired another claim took the message over and delivered it (done, lease_version 2, attempts 2)');
ok($sink->wait_requests(2, path => '/slow', timeout => 10), 'second delivery reached the sink');

# the stale worker's 200 arrives ~4 s after its request and must be fenced
ok(poll_until($node, 'SELECT lost_leases >= 1 FROM outbox.health', 't', 15),
	'outbox.health.lost_leases >= 1 after the stale finalize');
cmp_ok($node->safe_psql('postgres', 'SELECT sum(lost_leases) FROM outbox.worker_stats'),
	'>=', 1, 'sum(worker_stats.lost_leases) >= 1');

my $reqs = $sink->requests('/slow', id => $id);
is(scalar @$reqs, 2, 'sink saw exactly two deliveries of the message');
is_deeply([ map { OdSink::header($_, 'X-Outbox-Attempt') } @$reqs ], [ 1, 2 ],
	'deliveries carry X-Outbox-Attempt 1 and 2');
# the lease runs from the claim, a little before the sink saw the first request;
# the backoff alone would have allowed a second request within 50 ms
cmp_ok($reqs->[1]{t} - $reqs->[0]{t}, '>=', 0.5, 'second delivery came after the 1 s lease expired');
cmp_ok($reqs->[1]{t} - $reqs->[0]{t}, '<', 4, 'second delivery did not wait for the slow first request');

# the row is as the new owner left it
is( $node->safe_psql(
		'postgres',
		"SELECT status, lease_version, attempts, last_http_status, lease_owner IS NULL, lease_until IS NULL,
		        last_error IS NULL
		   FROM outbox.messages WHERE id = $id"),
	'done|2|2|200|t|t|t',
	'final state: done, lease_version 2, attempts 2, lease cleared');

# the takeover was by the other worker; the loser counted the lost lease
my $stats = $node->safe_psql('postgres',
	'SELECT string_agg(format(\'%s:%s:%s:%s:%s\', worker, pid, claimed, delivered, lost_leases), \',\' ORDER BY worker)
	   FROM outbox.worker_stats');
note("worker_stats worker:pid:claimed:delivered:lost_leases = $stats");
my %w = map { my @f = split /:/; ($f[1] => { worker => $f[0], claimed => $f[2], delivered => $f[3], lost => $f[4] }) }
  split /,/, $stats;
my ($pid1) = $owner1 =~ /pid-(\d+)/;
ok(exists $w{$pid1}, "the first owner (pid $pid1) is a running worker");
my ($other) = grep { $_ != $pid1 } keys %w;
is($w{$pid1}{claimed}, 1, 'first owner claimed the message once');
is($w{$pid1}{lost}, 1, 'first owner counted one lost lease');
is($w{$pid1}{delivered}, 0, 'the fenced success is not counted as a delivery');
is($w{$other}{claimed}, 1, 'the other worker claimed the expired lease');
is($w{$other}{delivered}, 1, 'the other worker delivered it');
is($w{$other}{lost}, 0, 'the other worker lost no lease');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '1',
	'outbox.health.lost_leases = 1');

my $log = slurp_file($node->logfile);
like($log, qr/lost lease on message $id \(lease_version 1\)/, 'server log: "lost lease" for the stale finalize');
ok($log !~ /lost lease on message $id \(lease_version 2\)/, 'server log: the new owner did not lose its lease');

$sink->stop;
$node->stop;
done_testing();
