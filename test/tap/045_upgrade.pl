# Copyright: outbox_dispatcher contributors
#
# 045_upgrade.pl — ALTER EXTENSION outbox_dispatcher UPDATE from 0.1.0
# through 0.2.0, 0.2.1 and 0.2.2 to 0.3.0, under running workers
# (sql/outbox_dispatcher--*--*.sql, docs/operations.md "Upgrading").
#
# Proves, with 2 workers running the new library throughout, the support
# policy (src/catalog.h: the library serves its own schema and the previous
# one) and every update step:
#   - on schema 0.1.0 (CREATE EXTENSION ... VERSION '0.1.0'): extversion
#     0.1.0, no 0.2.0 column or function; the workers do not deliver, and
#     each says so once with a hint to ALTER EXTENSION ... UPDATE; producers
#     can still enqueue; outbox.claim() of 0.1.0 raises the same hint;
#   - ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.0': the new columns
#     exist with their defaults on existing rows; outbox.endpoint_health and
#     pause_endpoint, resume_endpoint, replay, move_messages, metrics exist
#     and belong to the extension, with their privileges; messages_ready is
#     on (endpoint, available_at, id) WHERE pending; still no delivery;
#   - UPDATE TO '0.2.1': endpoints get distinct ids, enqueue() is SECURITY
#     INVOKER with a pinned search_path; still no delivery;
#   - UPDATE TO '0.2.2' (the previous schema, served): the workers deliver
#     everything that waited, without a restart; a 410 disables the endpoint
#     and puts the message back; resume_endpoint() of a disabled endpoint
#     delivers its messages; breaker_threshold 2 opens after 2 failures;
#     the library checks 0.2.2's ranges itself (its messages), and reports a
#     missing value without quoting the row;
#   - UPDATE to 0.3.0 while an SQL claim holds a lease: the ranges are
#     domains with named constraints, endpoints_changed is in place, the
#     trigger, pause_endpoint and resume_endpoint are the library's; the
#     workers take the old lease over once it expires and keep delivering;
#   - the upgraded schema is the fresh install's: pg_dump --schema-only
#     --binary-upgrade (which lists an extension's member objects) of this
#     database and of a database where 0.3.0 was installed directly are the
#     same but for oids;
#   - no lost lease and no ERROR in the server log beyond the ones asked for.
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

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'upgrade', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 500ms
outbox_dispatcher.max_attempts = 50
});
my $log_start = -s $node->logfile;
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

# ------------------------------------------------------------------ 0.1.0: not served
sub extversion
{
	return $node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'});
}

sub log_errors
{
	my ($from) = @_;
	return grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, slurp_file($node->logfile, $from);
}

$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(1, 5) AS g});
my $gone_id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'g', 'order.created', '{}', 'gone')});
ok( poll_until(
		$node, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '2', 15),
	'0.1.0: both workers are running');
sleep 1;    # ten poll intervals
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'pending' AND attempts = 0}),
	'6', '0.1.0: producers can enqueue, and nothing is claimed');
is($sink->stats->{total} // 0, 0, '0.1.0: no request reached the sink');
{
	my $log = slurp_file($node->logfile, $log_start);
	my @said = ($log =~ /not delivering: extension version "0\.1\.0" is not served by this library \(0\.3\.0\)\n[^\n]*HINT:  Run ALTER EXTENSION outbox_dispatcher UPDATE/g);
	is(scalar @said, 2, '0.1.0: each worker says once that it does not serve 0.1.0, with the UPDATE hint')
	  or diag($log);
}
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT * FROM outbox.claim('upgrade-test', 1, '1 minute')});
like($err, qr/ERROR:  outbox\.claim\(\) of extension version 0\.1\.0 is not served by library version 0\.3\.0\n.*HINT:  Run ALTER EXTENSION outbox_dispatcher UPDATE\./s,
	'0.1.0: claim() raises the same hint');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status <> 'pending'}), '0', '... and changes nothing');

# ------------------------------------------------------------------ 0.1.0 -> 0.2.0
$node->safe_psql('postgres', q{ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.0'});
is(extversion(), '0.2.0', 'updated to 0.2.0');
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

# ------------------------------------------------------------------ 0.2.0 -> 0.2.1
$node->safe_psql('postgres', q{ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.1'});
is(extversion(), '0.2.1', 'updated to 0.2.1');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) = count(DISTINCT id) AND bool_and(id IS NOT NULL) FROM outbox.endpoints}),
	't', 'existing endpoints got distinct ids');
is( $node->safe_psql(
		'postgres', q{
SELECT p.prosecdef, p.proconfig::text FROM pg_proc AS p
 WHERE p.oid = 'outbox.enqueue(text,text,text,jsonb,text,boolean,timestamptz,jsonb)'::regprocedure}),
	'f|{"search_path=pg_catalog, pg_temp"}', 'enqueue() runs with the caller\'s rights and a pinned search_path');
sleep 0.5;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status <> 'pending'}), '0',
	'0.2.0 and 0.2.1 are not served either');
{
	my @errors = grep { !/outbox\.claim\(\) of extension version 0\.1\.0/ && !/STATEMENT:/ } log_errors($log_offset);
	is(scalar @errors, 0, 'no ERROR in the server log but the claim asked for') or diag(join("\n", @errors));
}

# ------------------------------------------------------------------ 0.2.1 -> 0.2.2: the previous schema, served
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.2'});
is(extversion(), '0.2.2', 'updated to 0.2.2');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '5', 15),
	'0.2.2: the workers deliver what waited, without a restart');
is($sink->stats('/live')->{ok_distinct_ids}, 5, '0.2.2: the sink got the 5 ids');
ok(poll_until($node, q{SELECT enabled, disabled_reason FROM outbox.endpoints WHERE name = 'gone'},
		'f|HTTP 410 Gone received by the dispatcher', 10),
	'0.2.2: a 410 disables the endpoint');
ok(poll_until($node, "SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = $gone_id", 'pending|0|410', 10),
	'0.2.2: the 410 message is pending again with its attempt refunded');
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.later', jsonb_build_object('n', g), 'later' FROM generate_series(1, 5) AS g});
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('later')}), 't', '0.2.2: resume_endpoint(later)');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'later' AND status = 'done'}, '5', 15),
	'0.2.2: the messages of the resumed endpoint are delivered');
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, breaker_threshold, breaker_cooldown)
	 VALUES ('flaky', '" . $sink->url('/flaky') . "', 2, '1 hour')");
my $fid = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'f', 'order.created', '{}', 'flaky')});
ok(poll_until($node, q{SELECT state, consecutive_failures FROM outbox.endpoint_health WHERE endpoint = 'flaky'}, 'open|2', 10),
	'0.2.2: breaker_threshold 2: the breaker opens after 2 failures');
sleep 0.5;
is($sink->stats->{by_path}{'/flaky'}, 2, 'exactly 2 requests reached the failing endpoint');
# the previous schema keeps its rules: the library checks 0.2.2's ranges itself
($rc, $out, $err) = $node->psql('postgres', q{UPDATE outbox.endpoints SET max_in_flight = 0 WHERE name = 'live'});
like($err, qr/ERROR:  max_in_flight must be between 1 and 10000/, '0.2.2: the ranges are checked by the library (no domains yet)');
($rc, $out, $err) = $node->psql('postgres',
	q{INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('x', NULL, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')});
like($err, qr/ERROR:  null value in column "url" of relation "endpoints" violates not-null constraint/,
	'0.2.2: a missing value is reported by the trigger');
unlike($err, qr/Failing row|whsec_/, '... without quoting the row');
{
	my @errors = grep { !/max_in_flight must be between|null value in column "url"|STATEMENT:/ } log_errors($log_offset);
	is(scalar @errors, 0, 'no ERROR in the server log on 0.2.2 but the ones asked for') or diag(join("\n", @errors));
}

# ------------------------------------------------------------------ 0.2.2 -> 0.3.0
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf();});
ok(poll_until($node, q{SELECT bool_and(state = 'paused') FROM outbox.worker_stats}, 't', 30), 'workers paused');
my $held = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'held', 'order.created', '{}', 'live')});
is( $node->safe_psql(
		'postgres', "SELECT count(*) FILTER (WHERE id = $held) FROM outbox.claim('upgrade-test', 100, '2 seconds')"),
	'1', 'an SQL claim holds a lease across the update');
$node->safe_psql('postgres', 'ALTER EXTENSION outbox_dispatcher UPDATE');
is(extversion(), '0.3.0', 'updated to 0.3.0');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod), ' ' ORDER BY a.attnum)
  FROM pg_attribute AS a
 WHERE a.attrelid = 'outbox.endpoints'::regclass
   AND a.attname IN ('max_in_flight', 'defer_statuses', 'rate_limit', 'breaker_threshold', 'breaker_cooldown')}),
	'max_in_flight:outbox.endpoint_max_in_flight defer_statuses:outbox.http_statuses '
	  . 'rate_limit:outbox.endpoint_rate_limit breaker_threshold:outbox.breaker_threshold '
	  . 'breaker_cooldown:outbox.breaker_cooldown',
	'0.3.0: the ranged columns are domains');
($rc, $out, $err) = $node->psql('postgres', q{UPDATE outbox.endpoints SET max_in_flight = 0 WHERE name = 'live'});
like($err, qr/violates check constraint "max_in_flight_between_1_and_10000"/, '0.3.0: the domain names the rule');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(p.proname || ':' || p.prosrc, ' ' ORDER BY p.proname) FROM pg_proc AS p
 WHERE p.pronamespace = 'outbox'::regnamespace
   AND p.proname IN ('_endpoint_check', '_endpoints_changed', 'pause_endpoint', 'resume_endpoint')}),
	'_endpoint_check:od_endpoint_check_v030 _endpoints_changed:od_endpoints_changed_trigger '
	  . 'pause_endpoint:od_pause_endpoint_sql resume_endpoint:od_resume_endpoint_sql',
	'0.3.0: the trigger functions, pause and resume are the library\'s');
is( $node->safe_psql(
		'postgres', q{
SELECT has_function_privilege('outbox_admin', 'outbox.pause_endpoint(text,text)', 'EXECUTE')
   AND NOT has_function_privilege('outbox_monitor', 'outbox.pause_endpoint(text,text)', 'EXECUTE')
   AND has_table_privilege('outbox_monitor', 'outbox.endpoint_health', 'SELECT')}),
	't', '0.3.0: pause keeps its privileges, the recreated view its grants');
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.enabled = on; SELECT pg_reload_conf();});
ok(poll_until($node, "SELECT status || '/' || lease_version FROM outbox.messages WHERE id = $held", 'done/2', 20),
	'the workers took the lease set before the update over and delivered the message');
$node->safe_psql('postgres',
	q{SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'live'))
	    FROM generate_series(21, 25) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'live' AND status = 'done'}, '11', 15),
	'the workers deliver on 0.3.0 without a restart');
$sink->script({ path => '/gone', status => 200 });
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('gone')}), 't', '0.3.0: resume_endpoint(gone)');
ok(poll_until($node, "SELECT status, attempts FROM outbox.messages WHERE id = $gone_id", 'done|1', 15),
	'the message put back by the 410 on 0.2.2 is delivered');
is($node->safe_psql('postgres', q{SELECT outbox.pause_endpoint('later')}), 't', '0.3.0: pause_endpoint(later)');
is($node->safe_psql('postgres', q{SELECT enabled, disabled_reason FROM outbox.endpoints WHERE name = 'later'}),
	'f|paused by ' . $node->safe_psql('postgres', 'SELECT current_user'), '... records who paused it');
is($node->safe_psql('postgres', 'SELECT lost_leases FROM outbox.health'), '0', 'no lost lease');
{
	my @errors = grep { !/violates check constraint "max_in_flight_between_1_and_10000"/ && !/STATEMENT:/ } log_errors($log_offset);
	is(scalar @errors, 0, 'no ERROR in the server log on 0.3.0 but the one asked for') or diag(join("\n", @errors));
}

# ------------------------------------------------------------------ upgraded = installed
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION outbox_dispatcher');
is($node->safe_psql('fresh', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'}), '0.3.0',
	'a fresh install is 0.3.0');
sub schema_dump
{
	my ($db) = @_;
	my $dump = '';
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade',
			'-d', $node->connstr($db) ], '>', \$dump)
	  or die "pg_dump $db failed";
	# oids, transaction ids, sequence positions, the dump's random \restrict
	# key and the database's own name are all that may differ
	my @lines = grep {
		!/binary_upgrade_set_next_|relfrozenxid|^-- Dumped|^SET |^SELECT pg_catalog\.set_config|^SELECT pg_catalog\.setval|^\\(un)?restrict /
	} split /\n/, $dump;
	for (@lines)
	{
		s/'\d+'::pg_catalog\.oid/OID/g;
		s/\boid = '\d+'/oid = OID/g;
		s/pg_toast_\d+/pg_toast_OID/g;
		s/\b\d+\b/OID/g if /binary_upgrade_create_empty_extension/;    # the config tables' oids
	}
	s/\b(postgres|fresh)\b/DB/g for @lines;
	return join("\n", @lines);
}
my ($upgraded, $fresh) = (schema_dump('postgres'), schema_dump('fresh'));
like($upgraded, qr/CREATE DOMAIN outbox\.endpoint_max_in_flight/, 'the dump lists the member objects');
is($upgraded, $fresh, 'pg_dump --schema-only --binary-upgrade: the upgraded schema is the fresh install\'s');

$sink->stop;
$node->stop;
done_testing();
