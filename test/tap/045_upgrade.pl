# Copyright: outbox_dispatcher contributors
#
# 045_upgrade.pl — ALTER EXTENSION outbox_dispatcher UPDATE from 0.1.0 to
# 0.2.0, then to 0.2.1, then to 0.2.2, under running workers
# (sql/outbox_dispatcher--0.1.0--0.2.0.sql, sql/outbox_dispatcher--0.2.0--0.2.1.sql,
# sql/outbox_dispatcher--0.2.1--0.2.2.sql, docs/endpoints.md "Upgrading").
#
# Proves, with 2 workers running the new library throughout:
#   - on schema 0.1.0 (CREATE EXTENSION ... VERSION '0.1.0'): extversion
#     0.1.0, no 0.2.0 column or function; the workers deliver (5 messages
#     done), with no error in the server log; a 410 disables the endpoint and
#     puts the message back (the 0.1.0 table has no disabled_reason);
#   - messages of a disabled endpoint are pending at upgrade time (inserted
#     while it is disabled);
#   - ALTER EXTENSION outbox_dispatcher UPDATE: extversion 0.2.0; the new
#     columns exist with their defaults (rate_limit NULL, breaker_threshold
#     5, breaker_cooldown 30 s, disabled_reason NULL) on existing rows;
#     outbox.endpoint_health and the functions pause_endpoint,
#     resume_endpoint, replay, move_messages, metrics exist and belong to
#     the extension; outbox_monitor may read the new columns and the view;
#     messages_ready is now on (endpoint, available_at, id) WHERE pending;
#   - resume_endpoint() of the disabled endpoint: its pending messages are
#     delivered; new messages are delivered as well;
#   - the workers read the 0.2.0 settings without a restart: an endpoint
#     given breaker_threshold 2 after the update opens its breaker after
#     exactly 2 failures (0.1.0 defaults: 5);
#   - the outcome: every message done but the 503 ones, no lost lease, no
#     error in the server log;
#   - ALTER EXTENSION ... UPDATE to 0.2.1: endpoints get distinct ids,
#     enqueue() is SECURITY INVOKER with a pinned search_path, the workers
#     keep delivering and endpoint_health finds their state by id.
#   - ALTER EXTENSION ... UPDATE to 0.2.2 while an SQL claim holds a lease:
#     messages_leased is keyed by lease_until IS NOT NULL, the table has
#     fillfactor 50, claim() is bound to the 0.2.2 entry point; the workers
#     take the old lease over once it expires and keep delivering.
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

# ------------------------------------------------------------------ setup
my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'outbox_dispatcher'
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 500ms
outbox_dispatcher.max_attempts = 50
});
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION outbox_dispatcher VERSION '0.1.0'});
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'}),
	'0.1.0', 'installed at 0.1.0');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM pg_attribute
 WHERE attrelid = 'outbox.endpoints'::regclass
   AND attname IN ('rate_limit', 'breaker_threshold', 'breaker_cooldown', 'disabled_reason')}),
	'0', '0.1.0: no 0.2.0 column');
is($node->safe_psql('postgres', q{SELECT to_regclass('outbox.endpoint_health') IS NULL AND to_regproc('outbox.metrics') IS NULL}),
	't', '0.1.0: no endpoint_health, no metrics()');
my $old_index = $node->safe_psql('postgres', q{SELECT pg_get_indexdef('outbox.messages_ready'::regclass)});
note("0.1.0 messages_ready: $old_index");

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/gone', status => 410 });
$sink->script({ path => '/flaky', status => 503 });
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, enabled) VALUES
  ('live',  '" . $sink->url('/live') . "', true),
  ('later', '" . $sink->url('/later') . "', false),
  ('gone',  '" . $sink->url('/gone') . "', true)");
my $log_offset = -s $node->logfile;

# ------------------------------------------------------------------ workers on 0.1.0
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(1, 5) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '5', 15),
	'0.1.0: the workers deliver');
is($sink->stats('/live')->{ok_distinct_ids}, 5, '0.1.0: the sink got the 5 ids');
my $gone_id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'g', 'order.created', '{}', 'gone')});
ok(poll_until($node, q{SELECT enabled FROM outbox.endpoints WHERE name = 'gone'}, 'f', 10),
	'0.1.0: a 410 disables the endpoint');
ok(poll_until($node, "SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $gone_id", 'pending|0|410', 10),
	'0.1.0: the 410 message is pending again with its attempt refunded');
{
	my @errors = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, slurp_file($node->logfile, $log_offset);
	is(scalar @errors, 0, '0.1.0: no ERROR in the server log') or diag(join("\n", @errors));
}

# pending at upgrade time: inserted while the endpoint is disabled
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.later', jsonb_build_object('n', g), 'later' FROM generate_series(1, 5) AS g});
sleep 0.5;
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'later' AND status = 'pending' AND attempts = 0}),
	'5', 'the 5 messages of the disabled endpoint are pending');

# ------------------------------------------------------------------ ALTER EXTENSION UPDATE
$node->safe_psql('postgres', q{ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.0'});
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'}),
	'0.2.0', 'updated to 0.2.0');
is( $node->safe_psql(
		'postgres', q{
SELECT concat_ws('|', coalesce(rate_limit::text, 'null'), breaker_threshold, breaker_cooldown,
                 coalesce(disabled_reason, 'null'))
  FROM outbox.endpoints WHERE name = 'later'}),
	'null|5|00:00:30|null', 'existing endpoint rows get the defaults of the new columns');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(f, ',' ORDER BY f) FROM unnest(ARRAY[
    'outbox.pause_endpoint(text,text)', 'outbox.resume_endpoint(text)', 'outbox.replay(bigint,bigint,text)',
    'outbox.move_messages(text,text,text[])', 'outbox.metrics()']) AS f
 WHERE to_regprocedure(f) IS NOT NULL}),
	'outbox.metrics(),outbox.move_messages(text,text,text[]),outbox.pause_endpoint(text,text),'
	  . 'outbox.replay(bigint,bigint,text),outbox.resume_endpoint(text)',
	'the new functions exist');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM pg_depend AS d, pg_extension AS x
 WHERE x.extname = 'outbox_dispatcher' AND d.refobjid = x.oid AND d.deptype = 'e'
   AND (d.objid = 'outbox.endpoint_health'::regclass
        OR d.objid IN ('outbox.pause_endpoint(text,text)'::regprocedure, 'outbox.resume_endpoint(text)'::regprocedure,
                       'outbox.replay(bigint,bigint,text)'::regprocedure,
                       'outbox.move_messages(text,text,text[])'::regprocedure, 'outbox.metrics()'::regprocedure))}),
	'6', 'the view and the functions are members of the extension');
is( $node->safe_psql(
		'postgres', q{
SELECT has_column_privilege('outbox_monitor', 'outbox.endpoints', 'rate_limit', 'SELECT')
   AND has_column_privilege('outbox_monitor', 'outbox.endpoints', 'disabled_reason', 'SELECT')
   AND has_table_privilege('outbox_monitor', 'outbox.endpoint_health', 'SELECT')
   AND has_function_privilege('outbox_monitor', 'outbox.metrics()', 'EXECUTE')
   AND NOT has_function_privilege('outbox_monitor', 'outbox.replay(bigint,bigint,text)', 'EXECUTE')
   AND has_function_privilege('outbox_admin', 'outbox.replay(bigint,bigint,text)', 'EXECUTE')}),
	't', 'privileges on the new objects: monitor reads, admin operates');
my $new_index = $node->safe_psql('postgres', q{SELECT pg_get_indexdef('outbox.messages_ready'::regclass)});
is($new_index,
	q{CREATE INDEX messages_ready ON outbox.messages USING btree (endpoint, available_at, id) WHERE (status = 'pending'::text)},
	'messages_ready is on (endpoint, available_at, id) WHERE pending');
isnt($new_index, $old_index, '... which it was not on 0.1.0');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.endpoint_health}), '3', 'endpoint_health lists the 3 endpoints');

# ------------------------------------------------------------------ deliveries after the update
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('later')}), 't', 'resume_endpoint(later)');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'later' AND status = 'done'}, '5', 15),
	'the messages pending at upgrade time are delivered');
is($sink->stats('/later')->{ok_distinct_ids}, 5, 'the sink got them');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(6, 10) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '10', 15),
	'new messages are delivered after the update');
$sink->script({ path => '/gone', status => 200 });
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('gone')}), 't', 'resume_endpoint(gone)');
ok(poll_until($node, "SELECT status, attempts FROM outbox.messages WHERE id = $gone_id", 'done|1', 15),
	'the message put back by the 410 on 0.1.0 is delivered');

# the workers use the 0.2.0 settings: breaker_threshold 2 (0.1.0 defaults: 5)
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, breaker_threshold, breaker_cooldown)
	 VALUES ('flaky', '" . $sink->url('/flaky') . "', 2, '1 hour')");
my $fid = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'f', 'order.created', '{}', 'flaky')});
ok(poll_until($node, q{SELECT state, consecutive_failures FROM outbox.endpoint_health WHERE endpoint = 'flaky'}, 'open|2', 10),
	'breaker_threshold 2: the breaker opens after 2 failures');
sleep 0.5;
is($sink->stats->{by_path}{'/flaky'}, 2, 'exactly 2 requests reached the failing endpoint');
is($node->safe_psql('postgres', "SELECT status, attempts FROM outbox.messages WHERE id = $fid"), 'pending|2',
	'its message waits, pending, with 2 attempts');

# ------------------------------------------------------------------ the outcome
is( $node->safe_psql('postgres',
		q{SELECT string_agg(endpoint || ':' || status || ':' || n, ' ' ORDER BY endpoint, status)
		    FROM (SELECT endpoint, status, count(*) AS n FROM outbox.messages GROUP BY 1, 2) AS s}),
	'flaky:pending:1 gone:done:1 later:done:5 live:done:10', 'every message delivered but the failing one');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'no lost lease');
{
	my $log = slurp_file($node->logfile, $log_offset);
	my @errors = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, $log;
	is(scalar @errors, 0, 'no ERROR in the server log') or diag(join("\n", @errors));
}

# ------------------------------------------------------------------ 0.2.0 -> 0.2.1 (security release)
$node->safe_psql('postgres', q{ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.1'});
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'}),
	'0.2.1', 'updated to 0.2.1');
# the workers re-read the endpoints every poll_interval (100 ms): from then on
# their shared state is keyed by the new ids (the 0.2.0 name-hash slots are left behind)
ok( poll_until(
		$node, q{
SELECT count(*) FROM outbox._endpoint_health() AS h
  JOIN outbox.endpoints AS e ON h.relid = e.tableoid AND h.endpoint_id = e.id
 WHERE e.name = 'live'}, '1', 15),
	'the workers keyed the endpoint state by its new id');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) = count(DISTINCT id) AND bool_and(id IS NOT NULL) FROM outbox.endpoints}),
	't', 'existing endpoints got distinct ids');
is( $node->safe_psql(
		'postgres', q{
SELECT p.prosecdef, p.proconfig::text FROM pg_proc AS p
 WHERE p.oid = 'outbox.enqueue(text,text,text,jsonb,text,boolean,timestamptz,jsonb)'::regprocedure}),
	'f|{"search_path=pg_catalog, pg_temp"}', 'enqueue() runs with the caller\'s rights and a pinned search_path');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(11, 15) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '15', 15),
	'the workers deliver on 0.2.1 without a restart');
ok( poll_until(
		$node, q{SELECT delivered > 0 FROM outbox.endpoint_health WHERE endpoint = 'live'}, 't', 15),
	'endpoint_health finds the shared state by endpoint id');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'still no lost lease');
{
	my $log = slurp_file($node->logfile, $log_offset);
	my @errors = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, $log;
	is(scalar @errors, 0, 'no ERROR in the server log after the second update') or diag(join("\n", @errors));
}

# ------------------------------------------------------------------ 0.2.1 -> 0.2.2 (performance)
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf();});
ok(poll_until($node, q{SELECT bool_and(state = 'paused') FROM outbox.worker_stats}, 't', 30), 'workers paused');
my $held = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'held', 'order.created', '{}', 'live')});
is( $node->safe_psql(
		'postgres', "SELECT count(*) FILTER (WHERE id = $held) FROM outbox.claim('upgrade-test', 100, '2 seconds')"),
	'1', 'an SQL claim holds a lease across the update');
$node->safe_psql('postgres', 'ALTER EXTENSION outbox_dispatcher UPDATE');
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'}),
	'0.2.2', 'updated to 0.2.2');
is($node->safe_psql('postgres', q{SELECT pg_get_indexdef('outbox.messages_leased'::regclass)}),
	'CREATE INDEX messages_leased ON outbox.messages USING btree (lease_until) WHERE (lease_until IS NOT NULL)',
	'messages_leased is keyed by lease_until IS NOT NULL');
is($node->safe_psql('postgres', q{SELECT reloptions::text FROM pg_class WHERE oid = 'outbox.messages'::regclass}),
	'{autovacuum_vacuum_scale_factor=0.0,autovacuum_vacuum_threshold=10000,autovacuum_analyze_scale_factor=0.02,fillfactor=50}',
	'outbox.messages has fillfactor 50');
is( $node->safe_psql(
		'postgres', q{
SELECT p.prosrc, p.proconfig::text FROM pg_proc AS p
 WHERE p.oid = 'outbox.claim(text,integer,interval,integer)'::regprocedure}),
	'od_claim_v022_sql|{"search_path=pg_catalog, pg_temp"}', 'claim() is bound to the 0.2.2 entry point');
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = on; SELECT pg_reload_conf();});
ok(poll_until($node, "SELECT status || '/' || lease_version FROM outbox.messages WHERE id = $held", 'done/2', 20),
	'the workers took the lease set before the update over and delivered the message');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(21, 25) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '21', 15),
	'the workers deliver on 0.2.2 without a restart');
is( $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.claim('upgrade-test', 1, '1 minute') WHERE false}),
	'0', 'claim() of 0.2.2 runs');
{
	my $log = slurp_file($node->logfile, $log_offset);
	my @errors = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, $log;
	is(scalar @errors, 0, 'no ERROR in the server log after the third update') or diag(join("\n", @errors));
}

$sink->stop;
$node->stop;
done_testing();
