# Copyright: outbox_dispatcher contributors
#
# 070_claim_spacing.pl — outbox_dispatcher.min_claim_interval and
# outbox_dispatcher.worker_nice.
#
# 2 workers, poll_interval 1 h (only commits bring a claim), a sink that
# answers at once.  Proves:
#   - the workers run at the configured nice value (7);
#   - with min_claim_interval = 4 s, a commit made right after a claim is
#     claimed no sooner than 4 s after it (the attempt log's start times
#     of the two messages are at least 3.5 s apart);
#   - a claim that came back full is followed by the next claim at once
#     (batch_size 1, six messages in one commit: all six are sent within
#     4 s, where spacing every claim would take 20 s);
#   - after a reload with min_claim_interval = 0, the same two commits are
#     claimed one right after the other (less than 3.5 s apart);
#   - out-of-range values of both settings are refused.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled);

my $node = OdNode->create(
	'spacing', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 3600s
outbox_dispatcher.min_claim_interval = 4s
outbox_dispatcher.worker_nice = 7
});
my $sink = OdSink->start($node->basedir);
$sink->script(path => '/hook', status => 200);
my $url = $sink->url('/hook');
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$url');
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'idle'}, '2', 30),
	'both workers idle');

# /proc/<pid>/stat: the 19th field is the nice value (the command may hold spaces: split after its ')')
my @pids = split /,/, $node->worker_pids;
is(scalar @pids, 2, 'two workers');
for my $pid (@pids)
{
	open my $fh, '<', "/proc/$pid/stat" or die "cannot read /proc/$pid/stat: $!";
	my $stat = <$fh>;
	close $fh;
	my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
	is($f[16], '7', "worker $pid runs at nice 7");
}

# Enqueue one message, wait until it is done, enqueue another at once: the
# seconds between the two messages' attempt starts.
sub pair_gap
{
	my ($tag) = @_;
	my ($a) = $node->enqueue_n(1, tag => "${tag}a");
	ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $a", 'done', 30), "$tag: first delivered");
	my ($b) = $node->enqueue_n(1, tag => "${tag}b");
	ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $b", 'done', 30), "$tag: second delivered");
	return $node->safe_psql(
		'postgres', qq{
SELECT extract(epoch FROM (SELECT started_at FROM outbox.attempts WHERE message_id = $b)
                        - (SELECT started_at FROM outbox.attempts WHERE message_id = $a))});
}

my $gap = pair_gap('spaced');
cmp_ok($gap, '>=', 3.5, "a commit right after a claim waits for min_claim_interval (${gap}s apart)");

# a full claim: the next one at once
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.batch_size = 1');
ok(wait_workers_cycled($node), 'workers reloaded (batch_size 1)');
my @ids = $node->enqueue_n(6, tag => 'burst');
my $list = join(',', @ids);
ok(poll_until($node, "SELECT count(*) FROM outbox.messages WHERE id IN ($list) AND status = 'done'", '6', 60),
	'six messages delivered');
my $spread = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM max(started_at) - min(started_at)) FROM outbox.attempts WHERE message_id IN ($list)");
cmp_ok($spread, '<', 4, "full claims are not spaced: six one-message claims within ${spread}s");

$node->safe_psql('postgres',
	'ALTER SYSTEM SET outbox_dispatcher.min_claim_interval = 0; ALTER SYSTEM RESET outbox_dispatcher.batch_size');
ok(wait_workers_cycled($node), 'workers reloaded (min_claim_interval 0)');
$gap = pair_gap('unspaced');
cmp_ok($gap, '<', 3.5, "with min_claim_interval 0 a commit is claimed at once (${gap}s apart)");

# out-of-range values are refused and change nothing
for my $bad ("outbox_dispatcher.worker_nice = 20", "outbox_dispatcher.worker_nice = -1",
	"outbox_dispatcher.min_claim_interval = -1", "outbox_dispatcher.min_claim_interval = '10001ms'",
	"outbox_dispatcher.min_claim_interval = 'infinity'")
{
	my ($rc, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET $bad");
	isnt($rc, 0, "ALTER SYSTEM SET $bad is refused");
	like($err, qr/outside the valid range|invalid value/, "... with a clear error");
}
is($node->safe_psql('postgres', 'SHOW outbox_dispatcher.min_claim_interval'), '0', 'the setting is unchanged');

$sink->stop;
$node->stop;
done_testing();
