# Copyright: outbox_dispatcher contributors
#
# 057_plans.pl — the workers' statements keep plans proportional to the
# batch whatever the statistics say, and expired leases are looked for only
# when one can have expired.
#
# auto_explain logs the plan of every statement the workers run.  The
# workers prepare their plans on an empty table (20 single messages), then
# 30,000 done rows are retained and analyzed while nothing is open (the
# statistics say messages_open and messages_leased are empty: the state in
# which 0.2.1 walked messages_open and sorted), then the workers deliver
# 3,000 messages, some of them ordered, take over a lease that an SQL claim
# left to expire and reap one whose attempts are exhausted.  Proves:
#   - no worker plan reads outbox.messages by a sequential or bitmap scan,
#     joins by hash or merge, or sorts messages by a column an index orders;
#   - the expired-lease statements read messages_leased;
#   - claims without a lease check happen, and lease checks are few (each
#     one is due only at a deadline, or 5 s after the last one);
#   - the expired lease is taken over and the exhausted one reaped, each
#     within a few seconds of its deadline;
#   - the finalize reads messages by primary-key probes only (id = ANY) and
#     joins them to its results by hashing, also when its plan was made on
#     a table analyzed empty that then grew (3,000 rows): planned so, a
#     nested loop walked the whole primary key on every finalize.  Both
#     finalize statements: the one for batches of done results only, and
#     the general one (100 messages per phase to an endpoint that answers
#     each message's first request 503 and its retry 200);
#   - the attempt log's retention check ("rows before the cutoff in a kept
#     partition?", after every reload) reads the partition's BRIN summary,
#     not every row of the day.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OdSink;
use OdTest qw(poll_until);

my $node = PostgreSQL::Test::Cluster->new('plans');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'outbox_dispatcher,auto_explain'
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 200ms
auto_explain.log_min_duration = 0
auto_explain.log_nested_statements = on
log_line_prefix = '%m [%p] %b: '
autovacuum = off
});
$node->start;
my $sink = OdSink->start($node->basedir);
my $url = $sink->url('/hook');
# 'flaky' answers each message's first request 503 (its breaker off, so that
# the 503s do not stop it): its retries go through the general finalize, the
# batches of done results only through the other one
$sink->script({ path => '/flaky', status => 200, fail_first => 1, fail_status => 503 });
my $flaky_url = $sink->url('/flaky');
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$url');
INSERT INTO outbox.endpoints (name, url, retry_schedule, breaker_threshold) VALUES ('flaky', '$flaky_url', '{1 second}', 0);
});

# the plans auto_explain logged for the workers' statements on outbox.messages since $offset
sub worker_plans
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	return grep { /\] outbox_dispatcher worker: LOG:  duration: [\d.]+ ms  plan:/ && /outbox\.messages/ }
	  split /\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] )/, $log;
}

# the workers' finalize (UPDATE ... FROM unnest(results)), as auto_explain logs it: the
# general one, or the one for a batch of done results only
sub is_finalize
{
	my ($e) = @_;
	return $e =~ /SET status = (?:CASE r\.status|'done', done_at = now\(\), last_error = r\.error)/;
}

# a finalize plan reads outbox.messages only by probes of the primary key, one per result
# (id = ANY (the results' ids), or id = r.id per result), never by a walk of it
sub finalize_probes_only
{
	my ($e) = @_;
	my @scans = $e =~ /(\w[\w ]*Scan\b[^\n]* on messages m\b[^\n]*\n(?:[^\n]*\n)?)/g;
	return 0 unless @scans;
	for my $s (@scans)
	{
		return 0 unless $s =~ /Index Scan using messages_pkey on messages m/ && $s =~ /Index Cond: \(id = (?:ANY \(|r\.id\))/;
	}
	return 1;
}

sub enqueue_sql
{
	my ($n, $type, $ordered, $endpoint) = @_;
	$endpoint //= 'default';
	return "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, ordered, endpoint)
	        SELECT '$type', (g % 50)::text, 'order.created', jsonb_build_object('n', g), $ordered, '$endpoint'
	          FROM generate_series(1, $n) AS g";
}

# the two finalize statements: every result (CASE r.status per row), or a batch of done results only
sub is_general_finalize { return $_[0] =~ /SET status = CASE r\.status/; }

# 1. plans prepared on an empty table
for my $i (1 .. 20)
{
	$node->safe_psql('postgres', enqueue_sql(1, 'warm', 'false'));
	sleep 0.02;
}
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status <> 'done'}, '0', 30),
	'20 messages delivered on an empty table');

# 2. a week of history, analyzed while nothing is open
$node->safe_psql(
	'postgres', q{
ALTER TABLE outbox.messages DISABLE TRIGGER USER;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, status, done_at, attempts, lease_version)
SELECT 'history', g::text, 'order.created', jsonb_build_object('note', repeat('x', 200)), 'done',
       now() - (g % 600000) * interval '1 second', 1, 1
  FROM generate_series(1, 30000) AS g;
ALTER TABLE outbox.messages ENABLE TRIGGER USER;
VACUUM ANALYZE outbox.messages;
});
is( $node->safe_psql('postgres',
		q{SELECT reltuples::bigint FROM pg_class WHERE relname IN ('messages_open', 'messages_leased') ORDER BY relname}),
	"0\n0", 'the statistics say the open and leased sets are empty');

my $log_offset = -s $node->logfile;
my $t0 = time;

# 3. with the workers paused: an SQL claim takes one message with a 1 s
# lease and never finalizes it; another one's attempts are exhausted (the
# reaper makes it dead); then 3,000 deliveries, ordered ones included
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf();});
ok(poll_until($node, q{SELECT bool_and(state = 'paused') FROM outbox.worker_stats}, 't', 30), 'workers paused');
$node->safe_psql('postgres', enqueue_sql(1, 'orphan', 'false'));
my $orphan = $node->safe_psql('postgres', q{SELECT id FROM outbox.claim('test-owner', 1, '1 second')});
$node->safe_psql('postgres', enqueue_sql(1, 'exhausted', 'false'));
my $exhausted = $node->safe_psql('postgres', q{SELECT id FROM outbox.claim('test-owner', 1, '1 second')});
$node->safe_psql('postgres', "UPDATE outbox.messages SET attempts = 12 WHERE id = $exhausted");
like($orphan, qr/^\d+$/, 'an SQL claim holds a message with a 1 s lease');
$node->safe_psql('postgres', enqueue_sql(2000, 'order', 'false'));
$node->safe_psql('postgres', enqueue_sql(1000, 'ledger', 'true'));
$node->safe_psql('postgres', enqueue_sql(100, 'flaky', 'false', 'flaky'));
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = on; SELECT pg_reload_conf();});

ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status IN ('pending', 'processing')}, '0', 90),
	'every message finished');
my $elapsed = time - $t0;
is($node->safe_psql('postgres', "SELECT status, lease_version FROM outbox.messages WHERE id = $orphan"),
	'done|2', 'the expired SQL lease was taken over by a worker and delivered');
like($node->safe_psql('postgres', "SELECT status || ': ' || last_error FROM outbox.messages WHERE id = $exhausted"),
	qr/^dead: lease expired on attempt 12/, 'the exhausted expired lease was reaped');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done' AND aggregate_type IN ('order', 'ledger')}),
	'3000', '3,000 messages done');
sleep 0.5;

# ---------------------------------------------------------------- the plans
my @worker_plans = worker_plans($log_offset);
my ($claims, $checked_claims, $reaps, $bad);
$claims = $checked_claims = $reaps = 0;
for my $e (@worker_plans)
{
	my $is_claim = $e =~ /SET status = 'processing'/;
	my $expired = $e =~ /lease_until < now\(\)/;
	$claims++ if $is_claim;
	$checked_claims++ if $is_claim && $expired;
	$reaps++ if $e =~ /SET status = 'dead', lease_owner = NULL/;
	if ($expired && $e !~ /messages_leased/)
	{
		$bad //= "expired-lease statement without messages_leased:\n$e";
	}
	# the finalize joins the batch's results to the rows it probed by hashing (checked below)
	my @shapes = (qr/Seq Scan on messages/, qr/Bitmap Heap Scan on messages/, qr/Merge Join/,
		qr/Sort Key: \S*(?:lease_until|available_at|done_at)/);
	push @shapes, qr/Hash Join/ unless is_finalize($e);
	for my $shape (@shapes)
	{
		$bad //= "plan shape $shape:\n$e" if $e =~ $shape;
	}
}
cmp_ok(scalar(@worker_plans), '>=', 40, 'auto_explain logged the workers\' statements on outbox.messages');
ok(!defined $bad, 'every worker plan reads outbox.messages through an index, in index order')
  or diag(substr($bad, 0, 3000));
cmp_ok($claims, '>=', 20, "the workers claimed ($claims claims)");
cmp_ok($claims - $checked_claims, '>=', 10, 'most claims run without a lease check ('
	  . ($claims - $checked_claims) . " of $claims)");
# one check when the workers start on the new state, one per deadline that passed (2 here), one per
# 5 s while leases are outstanding; each due check may be run by both workers
my $allowed = 2 * (3 + int($elapsed / 5) + 1);
cmp_ok($checked_claims, '<=', $allowed, "lease checks are few ($checked_claims in ${\ sprintf('%.1f', $elapsed)} s)");
cmp_ok($reaps, '<=', $allowed, "reaps run only with a lease check ($reaps)");

my @finalizes = grep { is_finalize($_) } @worker_plans;
cmp_ok(scalar(@finalizes), '>=', 5, 'finalize plans logged (' . scalar(@finalizes) . ')');
cmp_ok(scalar(grep { is_general_finalize($_) } @finalizes), '>=', 1, 'the general finalize among them (retries)');
cmp_ok(scalar(grep { !is_general_finalize($_) } @finalizes), '>=', 1, 'the done-only finalize among them');
is(scalar(grep { !finalize_probes_only($_) } @finalizes), 0,
	'every finalize reads outbox.messages by primary-key probes only');

# 4. statistics taken on an empty table, then the table grows without an
# ANALYZE (a drained queue analyzed, or TRUNCATE and VACUUM ANALYZE): the
# workers replan on the empty table, where a walk of the whole primary key
# looks as cheap as one probe per result; the finalize must still probe
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf();});
ok(poll_until($node, q{SELECT bool_and(state = 'paused') FROM outbox.worker_stats}, 't', 30), 'workers paused');
$node->safe_psql('postgres', q{TRUNCATE outbox.messages; VACUUM ANALYZE outbox.messages;});
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = on; SELECT pg_reload_conf();});
for my $i (1 .. 10)
{
	$node->safe_psql('postgres', enqueue_sql(1, 'empty', 'false'));
	sleep 0.05;
}
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status <> 'done'}, '0', 30),
	'10 messages delivered on a table analyzed empty');
# no ANALYZE, no DDL from here on: the plans made above stay
my $lsn0 = $node->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
$node->safe_psql('postgres', enqueue_sql(3000, 'grown', 'false'));
$node->safe_psql('postgres', enqueue_sql(100, 'grown-flaky', 'false', 'flaky'));
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status <> 'done'}, '0', 60),
	'3,000 more messages delivered on the grown table');
my $lsn1 = $node->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');

# row locks written to the WAL: the claim's FOR UPDATE SKIP LOCKED, one per
# message (and one before each update that moves the row to another page);
# none for the finalize, which no BEFORE ROW UPDATE trigger makes lock first
my ($stats) = run_command([ 'pg_waldump', '-p', $node->data_dir . '/pg_wal', '-s', $lsn0, '-e', $lsn1, '--stats=record' ]);
my ($locks) = $stats =~ /^Heap\/LOCK\s+(\d+)/m;
$locks //= 0;
cmp_ok($locks / 3000, '<', 1.5, sprintf('%.2f row-lock WAL records per delivered message (claim only, not finalize)', $locks / 3000));
sleep 0.5;
@finalizes = grep { is_finalize($_) } worker_plans($log_offset);
cmp_ok(scalar(@finalizes), '>=', 10, 'finalize plans logged since the empty ANALYZE (' . scalar(@finalizes) . ')');
cmp_ok(scalar(grep { is_general_finalize($_) } @finalizes), '>=', 1, 'the general finalize among them');
my @walks = grep { !finalize_probes_only($_) } @finalizes;
is(scalar(@walks), 0, 'planned on a table analyzed empty, the finalize still reads messages by primary-key probes only')
  or diag(substr($walks[0], 0, 3000));

# 5. a reload makes worker 0 check the kept partitions of the attempt log
# for rows older than the retention: through the BRIN summary of
# started_at, never a sequential scan of the day's attempts
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my @checks;
for (my $deadline = time + 30; time < $deadline; sleep 0.1)
{
	@checks = grep { /\] outbox_dispatcher worker: LOG:  duration: [\d.]+ ms  plan:/ && /FROM outbox\.attempts_\d+ WHERE started_at < / }
	  split /\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] )/, slurp_file($node->logfile, $log_offset);
	last if @checks;
}
ok(scalar(@checks) > 0,
	'the retention check of the attempt log ran after the reload');
my @seq = grep { /Seq Scan on attempts_/ || !/Bitmap Index Scan on attempts_\d+_started_at_idx/ } @checks;
is(scalar(@seq), 0, 'the retention check reads the BRIN summary of started_at (' . scalar(@checks) . ' checks)')
  or diag(substr($seq[0], 0, 2000));

$sink->stop;
$node->stop;
done_testing();
