# Copyright: outbox_dispatcher contributors
#
# 053_limits.pl — limits that hold inside the workers, whatever the
# environment or old rows say.
#
# Proves:
#   - the postmaster's http_proxy / https_proxy / all_proxy (and upper-case)
#     environment is ignored: deliveries go straight to the endpoint, the
#     "proxy" sees nothing;
#   - the workers raise their soft file-descriptor limit to the hard limit;
#   - a message whose headers exceed outbox_dispatcher.max_header_bytes
#     (lowered after it was written) is not sent: it becomes dead with the
#     reason, and the next message goes out;
#   - an endpoint timeout below a millisecond (a row written before the
#     check existed) still times requests out instead of letting them hang;
#   - a tiny rate_limit does not make the workers spin: their loop count
#     stays low while the bucket is empty;
#   - outbox_dispatcher.source with CR/LF in postgresql.conf is rejected at
#     reload, so no header can be injected.
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
	'limits', start => 0, conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.lease = 30s
});

my $sink = OdSink->start($node->basedir);
my $proxy = OdSink->start($node->basedir, name => 'proxy');
my $url = $sink->url('/hook');

# the server inherits this environment
my $proxy_url = $proxy->url('/');
local $ENV{http_proxy} = $proxy_url;
local $ENV{HTTP_PROXY} = $proxy_url;
local $ENV{https_proxy} = $proxy_url;
local $ENV{HTTPS_PROXY} = $proxy_url;
local $ENV{all_proxy} = $proxy_url;
local $ENV{ALL_PROXY} = $proxy_url;
$node->start;
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$url');
});

# ------------------------------------------------------------------ environment proxies
$node->safe_psql('postgres',
	q{SELECT outbox.enqueue('order', g::text, 'order.created', '{}') FROM generate_series(1, 5) AS g});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}, '5', 20),
	'5 messages delivered with proxy variables in the server environment');
is($sink->stats->{total}, 5, 'the endpoint received all 5 directly');
is($proxy->stats->{total}, 0, 'the proxy nobody configured received nothing');

# ------------------------------------------------------------------ file descriptors
my @pids = split /\n/,
  $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'});
is(scalar(@pids), 2, 'two workers');
for my $pid (@pids)
{
	my ($soft, $hard) = slurp_file("/proc/$pid/limits") =~ /^Max open files\s+(\S+)\s+(\S+)/m;
	is($soft, $hard, "worker $pid runs with its soft open-files limit raised to the hard limit ($hard)");
}

# ------------------------------------------------------------------ header bytes of old rows
$node->safe_psql(
	'postgres', q{
SELECT outbox.pause_endpoint('default');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('big', '1', 'x', '{}', jsonb_build_object('X-A', repeat('a', 300))), ('big', '2', 'x', '{}', NULL);
ALTER SYSTEM SET outbox_dispatcher.max_header_bytes = 100;
SELECT pg_reload_conf();
});
sleep 0.5;
$node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('default')});
ok( poll_until(
		$node, q{SELECT string_agg(status, ',' ORDER BY aggregate_id) FROM outbox.messages WHERE aggregate_type = 'big'},
		'dead,done', 20),
	'the message with 303 header bytes became dead, the next one was delivered');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.messages WHERE aggregate_type = 'big' AND aggregate_id = '1'}),
	qr/max_header_bytes is 100/, 'last_error says which limit');
is(scalar(grep { ($_->{headers_lc}{'x-a'} // '') ne '' } @{ $sink->requests('/hook') }), 0,
	'the oversized headers were never sent');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox_dispatcher.max_header_bytes; SELECT pg_reload_conf()});

# ------------------------------------------------------------------ sub-millisecond timeout of an old row
my $hang_url = $sink->url('/hang');
$sink->script({ path => '/hang', mode => 'hang' });
$node->safe_psql(
	'postgres', qq{
ALTER TABLE outbox.endpoints DISABLE TRIGGER endpoints_check;
INSERT INTO outbox.endpoints (name, url, timeout, breaker_threshold) VALUES ('tiny', '$hang_url', '0.4 ms', 0);
ALTER TABLE outbox.endpoints ENABLE TRIGGER endpoints_check;
SELECT outbox.enqueue('tiny', '1', 'x', '{}', endpoint => 'tiny');
});
ok( poll_until(
		$node, q{SELECT attempts >= 3 AND last_error IS NOT NULL FROM outbox.messages WHERE aggregate_type = 'tiny'}, 't', 20),
	'a 0.4 ms timeout still times requests out (attempts go up; nothing hangs until the 30 s lease)');
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = false WHERE name = 'tiny'});

# ------------------------------------------------------------------ tiny rate limit
$node->safe_psql(
	'postgres', qq{
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('slow', '$url', 0.0001);
SELECT outbox.enqueue('slow', g::text, 'x', '{}', endpoint => 'slow') FROM generate_series(1, 5) AS g;
});
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE aggregate_type = 'slow' AND status = 'done'}, '1', 20),
	'the rate-limited endpoint got its one token');
my $c0 = $node->safe_psql('postgres', 'SELECT sum(cycles) FROM outbox.worker_stats');
sleep 2;
my $c1 = $node->safe_psql('postgres', 'SELECT sum(cycles) FROM outbox.worker_stats');
cmp_ok($c1 - $c0, '<', 200, "the workers do not spin on an empty bucket (@{[ $c1 - $c0 ]} loops in 2 s)");
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE aggregate_type = 'slow' AND status = 'done'}),
	'1', 'and send nothing more');

# ------------------------------------------------------------------ source with CR/LF in postgresql.conf
$node->append_conf('postgresql.conf', q{outbox_dispatcher.source = '/x\r\nX-Injected: 1'});
$node->reload;
ok( poll_until(
		$node, q{SELECT 1}, '1', 5),
	'server still up after the reload');
sleep 0.5;
like(slurp_file($node->logfile), qr/outbox_dispatcher\.source contains a carriage return or line feed/,
	'the reload rejects the value');
$node->safe_psql('postgres', q{SELECT outbox.enqueue('src', '1', 'x', '{}')});
ok(poll_until($node, q{SELECT status FROM outbox.messages WHERE aggregate_type = 'src'}, 'done', 20), 'delivered');
my ($last) = grep { ($_->{headers_lc}{'ce-subject'} // '') eq 'src/1' } @{ $sink->requests('/hook') };
ok(defined $last, 'the request arrived');
is($last->{headers_lc}{'x-injected'}, undef, 'no header was injected');
is($last->{headers_lc}{'ce-source'}, '/postgresql/postgres/outbox', 'ce-source kept its previous value');

$node->stop;
done_testing();
