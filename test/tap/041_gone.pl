# Copyright: outbox_dispatcher contributors
#
# 041_gone.pl — 410 Gone disables the endpoint instead of killing messages
# (src/worker_finalize.cpp finalize_run, src/catalog.cpp od_set_endpoint_enabled,
# docs/operations.md "410 Gone").
#
# Proves, with 2 workers, endpoint "gone" (sink answers 410) and endpoint
# "other" (200):
#   - three messages committed together for "gone": the endpoint becomes
#     enabled = false with disabled_reason mentioning 410, in outbox.endpoints
#     and in outbox.endpoint_health; the server log has the LOG line saying
#     it was disabled;
#   - none of the messages is dead: each is pending with its attempt
#     refunded (attempts 0), last_http_status 410, a last_error naming 410,
#     and the sink got one request per message at most (nothing more is
#     sent while the endpoint is disabled: 2 s without a request, messages
#     untouched); worker_stats counts no dead message;
#   - 410 is not a breaker failure: the breaker stays closed;
#   - "other" is not affected: its messages are delivered meanwhile;
#   - the sink is fixed (200) and outbox.resume_endpoint('gone') returns
#     true, clears disabled_reason, and all three messages are delivered
#     with attempts 1 (the 410 attempt was refunded); resume_endpoint again
#     returns false;
#   - a second 410 later (a new message) disables the endpoint again; this
#     time re-enabled with a plain UPDATE ... SET enabled = true, the
#     message is delivered;
#   - an endpoint with a 130-byte name (longer than the 127 bytes a
#     shared-memory slot keeps): its 410 disables it (by its full name), it
#     delivers once re-enabled, and it holds one slot — one per endpoint
#     after 20 endpoint refreshes, no "is not served" warning (before the
#     fix every refresh took a new slot until all 256 were gone).
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
	'gone', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 500ms
});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/gone', status => 410, body => 'this hook was removed' });
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url) VALUES
  ('gone',  '" . $sink->url('/gone') . "'),
  ('other', '" . $sink->url('/other') . "')");

my $log_offset = -s $node->logfile;

# the server log from $offset on, once it matches $re (or after 10 s)
sub wait_log
{
	my ($re, $offset) = @_;
	my $deadline = time + 10;
	my $log = '';
	while (time < $deadline)
	{
		$log = slurp_file($node->logfile, $offset);
		last if $log =~ $re;
		sleep 0.1;
	}
	return $log;
}

# ------------------------------------------------------------------ 410 disables the endpoint
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g), 'gone')
  FROM generate_series(1, 3) AS g;
COMMIT;});

ok(poll_until($node, q{SELECT enabled FROM outbox.endpoints WHERE name = 'gone'}, 'f', 10),
	'gone: the endpoint was disabled');
like($node->safe_psql('postgres', q{SELECT disabled_reason FROM outbox.endpoints WHERE name = 'gone'}),
	qr/410/, 'gone: disabled_reason mentions 410');
is($node->safe_psql('postgres', q{SELECT enabled, disabled_reason FROM outbox.endpoint_health WHERE endpoint = 'gone'}),
	'f|HTTP 410 Gone received by the dispatcher', 'gone: endpoint_health shows it disabled, with the reason');
ok( poll_until(
		$node,
		q{SELECT string_agg(status || ':' || attempts || ':' || coalesce(last_http_status::text, '-'), ' ' ORDER BY id)
		    FROM outbox.messages WHERE endpoint = 'gone'},
		'pending:0:410 pending:0:410 pending:0:410', 10),
	'gone: every message is pending again with its attempt refunded and last_http_status 410');
like($node->safe_psql('postgres', q{SELECT string_agg(DISTINCT last_error, ' / ') FROM outbox.messages WHERE endpoint = 'gone'}),
	qr/^HTTP 410 Gone/, 'gone: last_error names the 410');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'dead'}), '0',
	'gone: no message is dead');
is($node->safe_psql('postgres', 'SELECT sum(dead) FROM outbox.worker_stats'), '0', 'worker_stats: nothing counted dead');

# the LOG line
my $log = wait_log(qr/endpoint "gone" answered 410 Gone and was disabled/, $log_offset);
like($log, qr/LOG:\s+outbox_dispatcher: endpoint "gone" answered 410 Gone and was disabled/,
	'server log: endpoint "gone" answered 410 Gone and was disabled');
my @log_lines = ($log =~ /answered 410 Gone and was disabled/g);
is(scalar @log_lines, 1, 'server log: the disabling is logged once');

# nothing more goes out while disabled; the messages are untouched
{
	my $n = $sink->stats->{by_path}{'/gone'};
	cmp_ok($n, '>=', 1, "gone: the sink got $n request(s)");
	cmp_ok($n, '<=', 3, 'gone: at most one request per message');
	my $before = $node->safe_psql('postgres',
		q{SELECT string_agg(id || ':' || status || ':' || attempts || ':' || lease_version, ' ' ORDER BY id)
		    FROM outbox.messages WHERE endpoint = 'gone'});
	# meanwhile the other endpoint delivers
	$node->safe_psql('postgres',
		q{SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}', 'other')) FROM generate_series(1, 5) AS g});
	ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'other' AND status = 'done'}, '5', 10),
		'other: its messages are delivered while "gone" is disabled');
	sleep 2;
	is($sink->stats->{by_path}{'/gone'}, $n, 'gone: no further request in 2 s while disabled');
	is( $node->safe_psql('postgres',
			q{SELECT string_agg(id || ':' || status || ':' || attempts || ':' || lease_version, ' ' ORDER BY id)
			    FROM outbox.messages WHERE endpoint = 'gone'}),
		$before, 'gone: messages untouched while disabled');
}
is($node->safe_psql('postgres', q{SELECT state, consecutive_failures FROM outbox.endpoint_health WHERE endpoint = 'gone'}),
	'closed|0', 'gone: 410 does not count towards the breaker');

# ------------------------------------------------------------------ resume_endpoint
$sink->script({ path => '/gone', status => 200 });
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('gone')}), 't', 'resume_endpoint returns true');
is($node->safe_psql('postgres', q{SELECT enabled, disabled_reason IS NULL FROM outbox.endpoints WHERE name = 'gone'}),
	't|t', 'resume_endpoint: enabled, disabled_reason cleared');
is($node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('gone')}), 'f',
	'resume_endpoint on an enabled endpoint returns false');
ok( poll_until(
		$node,
		q{SELECT string_agg(status || ':' || attempts || ':' || last_http_status, ' ' ORDER BY id)
		    FROM outbox.messages WHERE endpoint = 'gone'},
		'done:1:200 done:1:200 done:1:200', 10),
	'gone: after resume all three messages are delivered with attempts 1');
is($sink->stats('/gone')->{ok_distinct_ids}, 3, 'gone: the sink answered 200 to the 3 ids');

# ------------------------------------------------------------------ again, re-enabled by UPDATE
$sink->script({ path => '/gone', status => 410 });
$log_offset = -s $node->logfile;
my $id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', '4', 'order.created', '{}', 'gone')});
ok(poll_until($node, q{SELECT enabled FROM outbox.endpoints WHERE name = 'gone'}, 'f', 10),
	'second 410: the endpoint was disabled again');
ok(poll_until($node, "SELECT status, attempts FROM outbox.messages WHERE id = $id", 'pending|0', 10),
	'second 410: the message is pending with attempts 0');
$sink->script({ path => '/gone', status => 200 });
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = true WHERE name = 'gone'});
ok(poll_until($node, "SELECT status, attempts FROM outbox.messages WHERE id = $id", 'done|1', 10),
	'UPDATE enabled = true: the message is delivered');
like(wait_log(qr/endpoint "gone" answered 410 Gone and was disabled/, $log_offset),
	qr/endpoint "gone" answered 410 Gone and was disabled/,
	'second 410: logged again');

# ------------------------------------------------------------------ a name longer than a shared-memory slot's
# The shared state keeps the first 127 bytes of a name.  A 130-byte name must
# map to one slot (not take another one at every endpoint refresh until none
# is left), and its 410 must disable it by its full name.
my $long = 'gone-' . ('x' x 125);
$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url) VALUES ('$long', '" . $sink->url('/gone_long') . "')");
$sink->script({ path => '/gone_long', status => 410 });
my $lid = $node->safe_psql('postgres', "SELECT outbox.enqueue('order', '5', 'order.created', '{}', '$long')");
ok(poll_until($node, "SELECT enabled FROM outbox.endpoints WHERE name = '$long'", 'f', 10),
	'130-byte name: the 410 disabled the endpoint');
ok(poll_until($node, "SELECT status, attempts FROM outbox.messages WHERE id = $lid", 'pending|0', 10),
	'130-byte name: its message is pending with attempts 0');
$node->safe_psql('postgres', "UPDATE outbox.endpoints SET enabled = true WHERE name = '$long'");
$sink->script({ path => '/gone_long', status => 200 });
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $lid", 'done', 10),
	'130-byte name: delivered once re-enabled');
sleep 1;    # 10 poll intervals: 20 endpoint refreshes by the 2 workers
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox._endpoint_health()'), '3',
	'one shared-memory slot per endpoint (3), none leaked by the long name');
is(scalar(() = slurp_file($node->logfile) =~ /is not served/g), 0, 'no "endpoint is not served" warning');

$sink->stop;
$node->stop;
done_testing();
