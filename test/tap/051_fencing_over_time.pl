# Copyright: outbox_dispatcher contributors
#
# 051_fencing_over_time.pl — a fencing token names one claim, over the whole
# life of the table, not just (id, lease_version).
#
# Proves: a worker holds the result of a slow request for message 1 while
# the extension is dropped and created again (as a restore into a served
# database would do) and a *new* message 1 is claimed — with lease_version 1
# again — and sent to an endpoint that answers 500 slowly.  When the old
# request's 200 arrives, its finalize must not touch the new message 1: it is
# discarded as a lost lease, and the new message 1 gets its own answer
# (the 500: pending again, attempt 1, last_http_status 500), never `done`.
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

my $node = OdNode->create(
	'fencing_time', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.lease = 60s
outbox_dispatcher.backoff_base = 30s
outbox_dispatcher.backoff_cap = 60s
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/old', status => 200, delay_ms => 3000 });
$sink->script({ path => '/new', status => 500, delay_ms => 5000 });

sub install
{
	my ($path) = @_;
	my $url = $sink->url($path);
	$node->safe_psql(
		'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('default', '$url', '20 s');
});
}

# ------------------------------------------------------------------ old message 1, in flight
install('/old');
is($node->safe_psql('postgres', q{SELECT outbox.enqueue('order', '1', 'order.created', '{"v": "old"}')}),
	'1', 'the first message has id 1');
ok($sink->wait_requests(1, path => '/old', timeout => 20), 'its request reached the (slow) endpoint');
is( $node->safe_psql('postgres', q{SELECT status || ' ' || lease_version FROM outbox.messages WHERE id = 1}),
	'processing 1', 'old message 1 is processing with lease_version 1');

# ------------------------------------------------------------------ re-created: a new message 1
$node->safe_psql('postgres', 'DROP EXTENSION outbox_dispatcher CASCADE');
install('/new');
is($node->safe_psql('postgres', q{SELECT outbox.enqueue('order', '1', 'order.created', '{"v": "new"}')}),
	'1', 'the re-created table gives the new message id 1 again');
ok($sink->wait_requests(1, path => '/new', timeout => 10), 'the new message 1 was claimed and sent');
is( $node->safe_psql('postgres', q{SELECT status || ' ' || lease_version FROM outbox.messages WHERE id = 1}),
	'processing 1', 'new message 1 is processing with lease_version 1 too: (id, lease_version) collide');

# ------------------------------------------------------------------ the old 200 arrives
my $lost_before = $node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health');
ok( poll_until(
		$node, q{SELECT coalesce(lost_leases, 0) > } . ($lost_before || 0) . q{ FROM outbox.health}, 't', 15),
	"the old message's result was discarded as a lost lease");
isnt($node->safe_psql('postgres', 'SELECT status FROM outbox.messages WHERE id = 1'),
	'done', "the old message's 200 did not mark the new message 1 done");

# ------------------------------------------------------------------ the new message gets its own answer
ok( poll_until(
		$node, q{SELECT status || ' ' || attempts || ' ' || last_http_status FROM outbox.messages WHERE id = 1},
		'pending 1 500', 15),
	'the new message 1 was finalized by its own result: the 500 (pending, attempt 1)');
is($node->safe_psql('postgres', q{SELECT payload->>'v' FROM outbox.messages WHERE id = 1}),
	'new', 'it is still the new message');
like(slurp_file($node->logfile), qr/lost lease on message 1 \(lease_version 1\); result "done" discarded/,
	'the discarded result is logged');

$node->stop;
done_testing();
