# Copyright: outbox_dispatcher contributors
#
# 015_nonsuperuser.pl — the workers run as a dedicated role that is only a
# member of outbox_admin (shared/design.md, "Privileges").
#
# Proves, with outbox_dispatcher.role = 'dispatcher' (LOGIN NOSUPERUSER,
# member of outbox_admin and nothing else), set in postgresql.conf and
# applied by a restart:
#   - both workers connect as 'dispatcher' (pg_stat_activity.usename) and the
#     "workers run as the bootstrap superuser" warning is gone;
#   - every statement the workers run is allowed: messages are delivered
#     (claim + done), retried (503 then 200), made dead (404), deferred
#     (409 in defer_statuses), signed with the endpoint's secret (reading
#     signing_secret), and done rows are purged by worker 0 (retention);
#   - no "permission denied" or other ERROR from the workers in the log.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64);

use OdNode;
use OdSink;
use OdTest qw(poll_until);


# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'nonsuper', extension => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 200ms
});
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION outbox_dispatcher;
CREATE ROLE dispatcher LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
GRANT outbox_admin TO dispatcher;
});

is( $node->safe_psql(
		'postgres',
		q{SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = 'dispatcher'}),
	'f|f|f|f', 'role dispatcher is an ordinary role');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(b.rolname, ',' ORDER BY b.rolname)
		    FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid
		   WHERE m.member = 'dispatcher'::regrole}),
	'outbox_admin', 'dispatcher is a member of outbox_admin only');

# the role is a postmaster-level setting: restart to apply it
$node->append_conf('postgresql.conf', "outbox_dispatcher.role = 'dispatcher'\n");
my $log_offset = -s $node->logfile;
$node->restart;
is($node->safe_psql('postgres', 'SHOW outbox_dispatcher.role'), 'dispatcher', 'outbox_dispatcher.role = dispatcher');

ok( poll_until(
		$node,
		q{SELECT count(*) FILTER (WHERE usename = 'dispatcher') || '/' || count(*)
		    FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'},
		'2/2', 20),
	'both workers are connected as role dispatcher (pg_stat_activity.usename)');

# ------------------------------------------------------------------ deliveries
my $sink = OdSink->start($node->basedir);
my $key = pack('C*', map { ($_ * 13 + 5) % 256 } 0 .. 31);
my $secret = 'whsec_' . encode_base64($key, '');
$sink->script({ path => '/flaky', fail_first => 1, fail_status => 503, status => 200 });
$sink->script({ path => '/missing', status => 404 });
$sink->script({ path => '/later', fail_first => 1, fail_status => 409, status => 200 });
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, signing_secret, defer_statuses) VALUES
  ('default', '" . $sink->url('/hook') . "', NULL, '{}'),
  ('signed',  '" . $sink->url('/signed') . "', '$secret', '{}'),
  ('flaky',   '" . $sink->url('/flaky') . "', NULL, '{}'),
  ('missing', '" . $sink->url('/missing') . "', NULL, '{}'),
  ('later',   '" . $sink->url('/later') . "', NULL, '{409}')");

$node->safe_psql(
	'postgres', q{
SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g)))
  FROM generate_series(1, 50) AS g;
SELECT outbox.enqueue('order', 's', 'order.signed', '{"n": "signed"}', 'signed');
SELECT outbox.enqueue('order', 'f', 'order.flaky', '{"n": "flaky"}', 'flaky');
SELECT outbox.enqueue('order', 'm', 'order.missing', '{"n": "missing"}', 'missing');
SELECT outbox.enqueue('order', 'l', 'order.later', '{"n": "later"}', 'later');
});

ok( poll_until(
		$node,
		q{SELECT count(*) FROM outbox.messages WHERE status IN ('done', 'dead')}, '54', 20),
	'all 54 messages reached a final state');
is( $node->safe_psql(
		'postgres',
		q{SELECT endpoint || ':' || status || ':' || attempts FROM outbox.messages
		   WHERE endpoint <> 'default' ORDER BY endpoint}),
	"flaky:done:2\nlater:done:1\nmissing:dead:1\nsigned:done:1",
	'retried (503), deferred (409), dead (404) and signed deliveries as the non-superuser role');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'default' AND status = 'done'}),
	'50', 'the 50 plain messages are done');
is($sink->stats('/hook')->{distinct_ids}, 50, 'sink received the 50 plain ids');
is( $node->safe_psql('postgres', 'SELECT sum(delivered), sum(retried), sum(deferred), sum(dead) FROM outbox.worker_stats'),
	'53|1|1|1', 'worker_stats: 53 delivered, 1 retried, 1 deferred, 1 dead');

my ($sreq) = @{ $sink->requests('/signed') };
my $sbody = $sreq->{body};
utf8::encode($sbody);
my $sid = OdSink::header($sreq, 'webhook-id');
my $sts = OdSink::header($sreq, 'webhook-timestamp');
is(OdSink::header($sreq, 'webhook-signature'),
	'v1,' . encode_base64(hmac_sha256("$sid.$sts.$sbody", $key), ''),
	'the workers read the signing secret and sign as the non-superuser role');

# ------------------------------------------------------------------ retention purge by worker 0
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox_dispatcher.retention = 1});
$node->reload;
ok(poll_until($node, 'SHOW outbox_dispatcher.retention', '1s', 10), 'retention = 1 s reloaded');
# back-date the plain messages so they are certainly past retention
$node->safe_psql('postgres',
	q{UPDATE outbox.messages SET done_at = now() - interval '1 minute' WHERE endpoint = 'default'});
ok( poll_until(
		$node, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'default'}, '0', 20),
	'worker 0 purged the done rows past retention as the non-superuser role');

# ------------------------------------------------------------------ the log
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/workers run as the bootstrap superuser/, 'no bootstrap-superuser warning with a dedicated role');
unlike($log, qr/permission denied/, 'no "permission denied" in the server log');
my @errors = grep { /\b(ERROR|FATAL):/ } split /\n/, $log;
is(scalar @errors, 0, 'no ERROR or FATAL in the server log since the restart')
  or diag(join("\n", @errors[ 0 .. ($#errors < 9 ? $#errors : 9) ]));

# ------------------------------------------------------------------ a role without outbox_admin
# (the README's install step that is easiest to miss): one clear warning per
# worker with the fix, not a permission error every second; delivery starts
# once the grant is made, without a restart.
$node->safe_psql('postgres', q{CREATE ROLE lonely LOGIN; ALTER SYSTEM SET outbox_dispatcher.role = 'lonely'});
$log_offset = -s $node->logfile;
$node->restart;
my $lid = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'lonely', 'order.created', '{}')});
sleep 2;
is($node->safe_psql('postgres', "SELECT status FROM outbox.messages WHERE id = $lid"), 'pending',
	'a worker role without outbox_admin delivers nothing');
$log = slurp_file($node->logfile, $log_offset);
my @says = ($log =~ /(role "lonely" \(outbox_dispatcher\.role\) does not have the privileges of outbox_admin)/g);
is(scalar @says, 2, 'each of the 2 workers says so once') or diag($log);
like($log, qr/HINT:  Run GRANT outbox_admin TO lonely;/, 'with the command that fixes it');
unlike($log, qr/permission denied/, 'instead of permission errors');
$node->safe_psql('postgres', 'GRANT outbox_admin TO lonely');
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $lid", 'done', 20),
	'after GRANT outbox_admin the message is delivered, without a restart');

$sink->stop;
$node->stop;
done_testing();
