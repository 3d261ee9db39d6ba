# Copyright: outbox_dispatcher contributors
#
# 052_endpoint_slots.pl — the workers' per-endpoint shared state is keyed by
# the endpoint's stable id, sized by outbox_dispatcher.max_endpoints,
# reclaimed when endpoints go away, and an endpoint that cannot be served is
# visible instead of silently pending.
#
# Proves, with outbox_dispatcher.max_endpoints = 16 (the minimum):
#   - 300 renames of one endpoint, each followed by a delivery, use one slot
#     (the id is the key): the endpoint is still served afterwards;
#   - 40 endpoints created, used and deleted one after the other (more than
#     there are slots): every one of them is served (slots of deleted
#     endpoints are reclaimed);
#   - two endpoints whose names share their first 200 bytes have separate
#     state: a 410 Gone from one disables that one only, the other keeps
#     delivering, and endpoint_health shows both with their own figures;
#   - with 20 enabled endpoints, 4 cannot be served: endpoint_health shows
#     them as 'unserved', metrics() has outbox_endpoints_unserved 4, the log
#     says so once, the 16 others deliver, and no in-flight place leaks;
#     disabling 4 served endpoints lets the others be served.
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
use OdTest qw(poll_until sql_quote);

my $node = OdNode->create(
	'endpoint_slots', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.max_endpoints = 16
outbox_dispatcher.poll_interval = 20ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});
is($node->safe_psql('postgres', 'SHOW outbox_dispatcher.max_endpoints'), '16', 'max_endpoints is a setting');

my $sink = OdSink->start($node->basedir);
my $url = $sink->url('/hook');

# ------------------------------------------------------------------ renames keep one slot
$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url) VALUES ('ep-0', '$url')");
my $renames_ok = 1;
for my $i (1 .. 300)
{
	my $prev = 'ep-' . ($i - 1);
	$node->safe_psql(
		'postgres', qq{
UPDATE outbox.endpoints SET name = 'ep-$i' WHERE name = '$prev';
SELECT outbox.enqueue('rename', '$i', 'renamed', '{}', endpoint => 'ep-$i');
});
	unless (poll_until($node, qq{SELECT count(*) FROM outbox.messages WHERE aggregate_id = '$i' AND status = 'done'}, '1', 10))
	{
		$renames_ok = 0;
		diag("message after rename $i was not delivered");
		last;
	}
}
ok($renames_ok, 'every one of 300 renames was followed by a delivery');
is($node->safe_psql('postgres', q{SELECT delivered FROM outbox.endpoint_health WHERE endpoint = 'ep-300'}),
	'300', 'the renamed endpoint kept its statistics: one state for all 300 names');

# ------------------------------------------------------------------ create, use, delete: slots are reclaimed
my $churn_ok = 1;
for my $i (1 .. 40)
{
	$node->safe_psql(
		'postgres', qq{
INSERT INTO outbox.endpoints (name, url) VALUES ('churn-$i', '$url');
SELECT outbox.enqueue('churn', '$i', 'churned', '{}', endpoint => 'churn-$i');
});
	unless (poll_until($node, qq{SELECT status FROM outbox.messages WHERE aggregate_type = 'churn' AND aggregate_id = '$i'}, 'done', 10))
	{
		$churn_ok = 0;
		diag("endpoint churn-$i was not served");
		last;
	}
	$node->safe_psql('postgres', qq{
DELETE FROM outbox.messages WHERE endpoint = 'churn-$i';
DELETE FROM outbox.endpoints WHERE name = 'churn-$i';});
}
ok($churn_ok, '40 endpoints created and deleted in turn (16 slots) were all served');
unlike(slurp_file($node->logfile), qr/cannot be served/, 'no endpoint was ever left unserved by the churn');

# ------------------------------------------------------------------ names that share a long prefix
my $prefix = 'p' x 200;
my $gone_url = $sink->url('/gone');
$sink->script({ path => '/gone', status => 410 });
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.endpoints (name, url) VALUES ('${prefix}-fine', '$url');
INSERT INTO outbox.endpoints (name, url) VALUES ('${prefix}-gone', '$gone_url');
SELECT outbox.enqueue('long', '1', 'x', '{}', endpoint => '${prefix}-fine');
});
ok(poll_until($node, q{SELECT status FROM outbox.messages WHERE aggregate_type = 'long'}, 'done', 10),
	'the first long-named endpoint delivers');
$node->safe_psql('postgres', qq{SELECT outbox.enqueue('long', '2', 'x', '{}', endpoint => '${prefix}-gone')});
ok( poll_until(
		$node, qq{SELECT enabled FROM outbox.endpoints WHERE name = '${prefix}-gone'}, 'f', 10),
	'the endpoint that answered 410 Gone was disabled');
is($node->safe_psql('postgres', qq{SELECT enabled FROM outbox.endpoints WHERE name = '${prefix}-fine'}),
	't', 'the other endpoint with the same 200-byte prefix is still enabled');
$node->safe_psql('postgres', qq{SELECT outbox.enqueue('long', '3', 'x', '{}', endpoint => '${prefix}-fine')});
ok( poll_until(
		$node, q{SELECT status FROM outbox.messages WHERE aggregate_type = 'long' AND aggregate_id = '3'}, 'done', 10),
	'and it still delivers');
is( $node->safe_psql(
		'postgres',
		qq{SELECT string_agg(right(endpoint, 5) || ':' || delivered || ':' || coalesce(last_http_status, 0), ',' ORDER BY endpoint)
		     FROM outbox.endpoint_health WHERE endpoint LIKE '${prefix}%'}),
	'-fine:2:200,-gone:0:410',
	'endpoint_health keeps separate figures for both');
$node->safe_psql('postgres', q{DELETE FROM outbox.messages WHERE aggregate_type = 'long';
	DELETE FROM outbox.endpoints WHERE name LIKE 'ppp%'});

# ------------------------------------------------------------------ more enabled endpoints than slots
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.endpoints (name, url) SELECT 'many-' || lpad(g::text, 2, '0'), '$url' FROM generate_series(1, 19) AS g;
});
# with ep-300 that makes 20 enabled endpoints for 16 slots
ok( poll_until(
		$node, q{SELECT count(*) FROM outbox.endpoint_health WHERE state = 'unserved'}, '4', 10),
	'endpoint_health shows the 4 endpoints without a slot as unserved');
like($node->safe_psql('postgres', 'SELECT outbox.metrics()'), qr/^outbox_endpoints_unserved 4$/m,
	'metrics() reports outbox_endpoints_unserved 4');
$node->safe_psql(
	'postgres', q{
SELECT outbox.enqueue('many', e.name, 'x', '{}', endpoint => e.name) FROM outbox.endpoints AS e WHERE e.name LIKE 'many-%';
});
ok( poll_until(
		$node,
		q{SELECT count(*) FROM outbox.messages AS m JOIN outbox.endpoint_health AS h ON h.endpoint = m.endpoint
		   WHERE m.aggregate_type = 'many' AND m.status = 'done' AND h.state <> 'unserved'},
		$node->safe_psql('postgres', q{SELECT count(*) FROM outbox.endpoint_health WHERE endpoint LIKE 'many-%' AND state <> 'unserved'}),
		15),
	'every served endpoint delivered its message');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM outbox.messages AS m JOIN outbox.endpoint_health AS h ON h.endpoint = m.endpoint
		   WHERE m.aggregate_type = 'many' AND m.status = 'pending' AND h.state = 'unserved'}),
	'4', 'the messages of the unserved endpoints wait, pending');
# a claim reserves its quota for every served endpoint and returns what it did
# not use at its end: a read during one of the workers' claims sees up to
# 16 x batch_size places for a moment (1,600 once, on PostgreSQL 17); a leaked
# place never comes back, so the count must return to 0
ok(poll_until($node, 'SELECT sum(in_flight) FROM outbox.endpoint_health', '0', 10),
	'no in-flight place leaked');
my @warnings = (slurp_file($node->logfile) =~ /(enabled endpoint\(s\) cannot be served)/g);
is(scalar(@warnings), 1, 'the log says so once');

# free 4 slots: the waiting endpoints get served
$node->safe_psql(
	'postgres', q{
UPDATE outbox.endpoints SET enabled = false
 WHERE name IN (SELECT endpoint FROM outbox.endpoint_health WHERE state <> 'unserved' AND endpoint LIKE 'many-%' ORDER BY endpoint LIMIT 4);
});
ok( poll_until(
		$node, q{SELECT count(*) FROM outbox.messages WHERE aggregate_type = 'many' AND status = 'done'}, '19', 15),
	'with 4 endpoints disabled, the 4 that were waiting are served and deliver');
ok(poll_until($node, q{SELECT count(*) FROM outbox.endpoint_health WHERE state = 'unserved'}, '0', 10),
	'nothing is unserved any more');
like(slurp_file($node->logfile), qr/every enabled endpoint is served again/, 'and the log says so');

$node->stop;
done_testing();
