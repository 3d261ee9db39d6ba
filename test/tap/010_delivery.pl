# Copyright: outbox_dispatcher contributors
#
# 010_delivery.pl — the background workers deliver every committed message.
#
# Proves, with 2 workers and a healthy HTTP sink:
#   - 10,000 messages, enqueued three supported ways (INSERT ... SELECT
#     generate_series, single-row plain INSERTs, outbox.enqueue()), all end
#     `done`; none is left pending, processing or dead;
#   - the sink received every message id (its distinct Idempotency-Keys are
#     exactly the ids in outbox.messages), with no duplicate in this healthy
#     run;
#   - outbox.worker_stats.delivered sums to 10,000 and claimed to at least
#     that, and both workers took part;
#   - the workers show up in pg_stat_activity with backend_type
#     'outbox_dispatcher worker', connected to the configured database.
#
# Run (as postgres, from a directory where tmp_check/ may be created):
#   PATH=/usr/lib/postgresql/15/bin:$PATH \
#   PG_REGRESS=/usr/lib/postgresql/15/lib/pgxs/src/test/regress/pg_regress \
#   perl -I /usr/lib/postgresql/15/lib/pgxs/src/test/perl -I test/tap test/tap/010_delivery.pl
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OdNode;
use OdSink;
use OdTest qw(poll_until);

my $N = 10_000;


# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'delivery', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 200ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 200ms
});

my $sink = OdSink->start($node->basedir);
my $url = $sink->url('/hook');
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$url')");

# ------------------------------------------------------------------ workers are running
ok( poll_until(
		$node,
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'},
		'2', 20),
	'two backends with backend_type "outbox_dispatcher worker" in pg_stat_activity');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(DISTINCT datname, ',') FROM pg_stat_activity
		   WHERE backend_type = 'outbox_dispatcher worker'}),
	'postgres',
	'workers are connected to outbox_dispatcher.database (postgres)');

# ------------------------------------------------------------------ enqueue 10,000 messages
# 9,000 in three INSERT ... SELECT generate_series statements (three transactions)
for my $chunk (0 .. 2)
{
	my $lo = $chunk * 3000 + 1;
	my $hi = $lo + 2999;
	$node->safe_psql(
		'postgres', qq{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', g::text, 'order.created', jsonb_build_object('n', g, 'path', 'bulk')
  FROM generate_series($lo, $hi) AS g});
}
# 500 single-row plain INSERTs, in one psql session (autocommit: 500 transactions)
my $inserts = join("\n",
	map {
		"INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload) "
		  . "VALUES ('order', '$_', 'order.paid', '{\"n\": $_, \"path\": \"insert\"}');"
	} (9001 .. 9500));
$node->safe_psql('postgres', $inserts);
# 500 through outbox.enqueue()
$node->safe_psql(
	'postgres', q{
SELECT count(outbox.enqueue('invoice', g::text, 'invoice.issued',
                            jsonb_build_object('n', g, 'path', 'enqueue')))
  FROM generate_series(9501, 10000) AS g});

is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	$N, "$N messages enqueued");
is( $node->safe_psql(
		'postgres',
		q{SELECT count(DISTINCT payload->>'n') FROM outbox.messages}),
	$N, 'every payload is distinct');

# ------------------------------------------------------------------ all delivered
my $t0 = time();
ok( poll_until(
		$node, q{SELECT count(*) FROM outbox.messages WHERE status = 'done'},
		$N, 45),
	"all $N messages reach status done");
note(sprintf('delivered %d messages in %.1f s', $N, time() - $t0));

is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM outbox.messages WHERE status IN ('pending', 'processing', 'dead')}),
	'0', 'no message left pending, processing or dead');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM outbox.messages
		   WHERE status = 'done' AND (done_at IS NULL OR lease_until IS NOT NULL
		                              OR lease_owner IS NOT NULL)}),
	'0', 'done rows have done_at set and no lease');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM outbox.messages WHERE last_http_status = 200}),
	$N, 'last_http_status 200 recorded for every message');
is( $node->safe_psql(
		'postgres', q{SELECT pending, processing, done, dead FROM outbox.health}),
	"0|0|$N|0", 'outbox.health agrees (0 pending, 0 processing, all done, 0 dead)');

# the sink's view
my $stats = $sink->stats;
is($stats->{distinct_ids}, $N, "sink saw $N distinct Idempotency-Keys");
is($stats->{duplicates}, 0, 'no message was delivered twice in this healthy run');
is($stats->{by_path}{'/hook'}, $N, "all $N requests went to /hook");

my $ids = $sink->ids('/hook');
my %db_ids = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', 'SELECT id FROM outbox.messages ORDER BY id');
my @missing = grep { !$ids->{$_} } sort { $a <=> $b } keys %db_ids;
my @extra = grep { !$db_ids{$_} } keys %$ids;
is(scalar @missing, 0, 'sink received every message id')
  or diag('missing ids (first 10): ' . join(',', @missing[ 0 .. ($#missing < 9 ? $#missing : 9) ]));
is(scalar @extra, 0, 'sink received no id that is not in outbox.messages')
  or diag('extra ids: ' . join(',', @extra[ 0 .. ($#extra < 9 ? $#extra : 9) ]));

# the three enqueue paths all went out
my $reqs = $sink->requests('/hook', limit => 100000);
my %by_path_kind;
for my $r (@$reqs)
{
	my $kind = ($r->{body} =~ /"path": "(\w+)"/) ? $1 : 'unparsed';
	$by_path_kind{$kind}++;
}
is_deeply(\%by_path_kind, { bulk => 9000, insert => 500, enqueue => 500 },
	'bodies of all three enqueue paths reached the sink (9000 bulk, 500 INSERT, 500 enqueue)');

# ------------------------------------------------------------------ worker_stats
is($node->safe_psql('postgres', 'SELECT sum(delivered) FROM outbox.worker_stats'),
	$N, "sum(worker_stats.delivered) = $N");
cmp_ok($node->safe_psql('postgres', 'SELECT sum(claimed) FROM outbox.worker_stats'),
	'>=', $N, "sum(worker_stats.claimed) >= $N");
is( $node->safe_psql(
		'postgres', 'SELECT sum(retried) + sum(dead) + sum(lost_leases) FROM outbox.worker_stats'),
	'0', 'no retries, dead letters or lost leases counted');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.worker_stats'),
	'2', 'worker_stats has one row per worker');
is( $node->safe_psql(
		'postgres', 'SELECT count(*) FROM outbox.worker_stats WHERE delivered > 0'),
	'2', 'both workers delivered messages');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM outbox.worker_stats w
		    JOIN pg_stat_activity a ON a.pid = w.pid
		   WHERE a.backend_type = 'outbox_dispatcher worker'}),
	'2', 'worker_stats pids are the outbox_dispatcher worker backends');

$sink->stop;
$node->stop;
done_testing();
