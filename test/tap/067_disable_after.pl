# Copyright: outbox_dispatcher contributors
#
# 067_disable_after.pl — endpoints.disable_after and the announcement of a
# disable, end to end through the background workers.
#
# Proves:
#   - an endpoint every attempt of which fails (connection refused, no
#     breaker) is disabled once that has lasted disable_after (1 minute, the
#     smallest allowed): not before, with a disabled_reason naming the rule,
#     its messages left pending; endpoint_health.failing_since is set while it
#     fails and outbox_endpoint_failing_seconds counts up in metrics();
#   - an endpoint that failed too but then succeeded (its failing_since
#     cleared) is not disabled; resume_endpoint() restarts the measure (the
#     resumed endpoint keeps failing and is not disabled again at once);
#   - every disable is announced on the channel outbox_endpoint_disabled with
#     a JSON payload (endpoint, id, reason, disabled_at, disabled_by) and
#     logged: by disable_after, by a 410 Gone, by pause_endpoint(), by a
#     plain UPDATE; re-enabling or disabling an already disabled endpoint
#     announces nothing.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;
use IPC::Run;

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled);

my $node = OdNode->create(
	'disable_after', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 1000
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 200ms
});
my $sink = OdSink->start($node->basedir);

# a port nothing listens on: every attempt is refused
my $closed = do {
	my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0) or die;
	my $p = $s->sockport;
	close $s;
	$p;
};

# A session listening on the channel for the whole test: psql prints each
# notification after the statement during which it arrived.
# (IPC::Run sends the input only when pumped: pump until the LISTEN is done.)
my ($lin, $lout, $lerr) = ("LISTEN outbox_endpoint_disabled;\nSELECT 'listening';\n", '', '');
my $listener = IPC::Run::start(
	[ 'psql', '-X', '-q', '-A', '-t', '-d', $node->connstr('postgres') ],
	'<', \$lin, '>', \$lout, '2>', \$lerr);
{
	my $deadline = time + 10;
	$listener->pump_nb while ($lout !~ /listening/ && time < $deadline && sleep 0.05);
}
like($lout, qr/listening/, 'a session listens on outbox_endpoint_disabled');
sub notifications
{
	$lin .= "SELECT 1;\n";
	$listener->pump_nb;
	sleep 0.3;
	$listener->pump_nb;
	my @n = ($lout =~ /Asynchronous notification "outbox_endpoint_disabled" with payload "(.*?)" received/g);
	return @n;
}

$sink->script({ path => '/flaky', status => 503 });
$sink->script({ path => '/gone', status => 410 });
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', "
INSERT INTO outbox.endpoints (name, url, breaker_threshold, disable_after) VALUES
  ('down',  'http://127.0.0.1:$closed/hook', 0, '1 minute'),
  ('flaky', '" . $sink->url('/flaky') . "', 0, '1 minute'),
  ('gone',  '" . $sink->url('/gone') . "', 0, NULL),
  ('calm',  '" . $sink->url('/calm') . "', 0, NULL);");
my $t0 = time;
my $down_id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'd', 'order.created', '{}', 'down')});
my $flaky_id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'f', 'order.created', '{}', 'flaky')});

ok(poll_until($node, q{SELECT failing_since IS NOT NULL FROM outbox.endpoint_health WHERE endpoint = 'down'}, 't', 20),
	'down: endpoint_health.failing_since is set once it fails');
like($node->safe_psql('postgres', 'SELECT outbox.metrics()'), qr/^outbox_endpoint_failing_seconds\{endpoint="down"\} [0-9.]+$/m,
	'metrics(): outbox_endpoint_failing_seconds for down');

# flaky fails for 30 s, then succeeds: its failing time starts again
sleep 30;
$sink->script({ path => '/flaky', status => 200 });
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $flaky_id", 'done', 20), 'flaky: delivered once it answers');
is($node->safe_psql('postgres', q{SELECT failing_since IS NULL FROM outbox.endpoint_health WHERE endpoint = 'flaky'}), 't',
	'flaky: failing_since cleared by the success');
my $fail_again = $node->safe_psql('postgres', q{SELECT enabled FROM outbox.endpoints WHERE name = 'down'});
is($fail_again, 't', sprintf('down: still enabled after %.0f s of failures', time - $t0));
$sink->script({ path => '/flaky', status => 503 });
$node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'f2', 'order.created', '{}', 'flaky')});

ok(poll_until($node, q{SELECT enabled FROM outbox.endpoints WHERE name = 'down'}, 'f', 60),
	'down: disabled by disable_after');
my $elapsed = time - $t0;
cmp_ok($elapsed, '>=', 59, sprintf('down: disabled %.1f s after its first attempt, not before a minute', $elapsed));
my ($reason, $status) = split /\|/, $node->safe_psql('postgres',
	"SELECT e.disabled_reason, m.status FROM outbox.endpoints e, outbox.messages m WHERE e.name = 'down' AND m.id = $down_id");
like($reason, qr/^every attempt failed for longer than disable_after \(00:01:00\) since \d{4}-/,
	"down: disabled_reason names the rule ($reason)");
is($status, 'pending', 'down: its message waits, pending');
is($node->safe_psql('postgres', q{SELECT enabled FROM outbox.endpoints WHERE name = 'flaky'}), 't',
	'flaky: not disabled (it succeeded within the minute)');
like(slurp_file($node->logfile, $log_offset), qr/LOG:\s+outbox_dispatcher: endpoint "down" disabled: every attempt failed/,
	'server log: the disable is logged');

# resume_endpoint() starts the measure again: the next failures do not disable it at once
$node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('down')});
ok(poll_until($node, q{SELECT attempts > 0 AND status <> 'processing' FROM outbox.messages WHERE endpoint = 'down'}, 't', 10),
	'down: resumed, its message is attempted again');
my $fails_before = $node->safe_psql('postgres', q{SELECT failed FROM outbox.endpoint_health WHERE endpoint = 'down'});
ok(poll_until($node, "SELECT failed > $fails_before + 3 FROM outbox.endpoint_health WHERE endpoint = 'down'", 't', 20),
	'down: failing again after the resume');
is($node->safe_psql('postgres', q{SELECT enabled FROM outbox.endpoints WHERE name = 'down'}), 't',
	'down: still enabled: the resume restarted the disable_after measure');
$node->safe_psql('postgres', q{SELECT outbox.pause_endpoint('down', 'done with it')});

# 410 Gone, pause_endpoint(), a plain UPDATE: each announced
my $gone_id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'g', 'order.created', '{}', 'gone')});
ok(poll_until($node, q{SELECT enabled FROM outbox.endpoints WHERE name = 'gone'}, 'f', 20), 'gone: disabled by its 410');
$node->safe_psql('postgres', q{SELECT outbox.pause_endpoint('calm', 'maintenance window')});
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = false, disabled_reason = 'by hand' WHERE name = 'flaky'});
# nothing for: re-enabling, disabling what is disabled, a rolled-back disable
$node->safe_psql('postgres', q{SELECT outbox.resume_endpoint('calm')});
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET disabled_reason = 'still by hand' WHERE name = 'flaky'});
$node->safe_psql('postgres', q{BEGIN; SELECT outbox.pause_endpoint('calm'); ROLLBACK;});

my @n;
my $deadline = time + 10;
do { @n = notifications() } while (@n < 5 && time < $deadline);
is(scalar @n, 5, 'five notifications on outbox_endpoint_disabled (down twice)') or diag($lout, $lerr);
my %by;
for my $payload (@n)
{
	my ($ep) = $payload =~ /"endpoint": "([^"]+)"/;
	$by{$ep // '?'} //= $payload;    # the first of each
}
like($by{down} // '', qr/"id": \d+, "reason": "every attempt failed for longer than disable_after/, 'down: payload has id and reason');
like($by{down} // '', qr/"disabled_at": "\d{4}-\d\d-\d\d [^"]+", "disabled_by": "[^"]+"\}$/, 'down: payload has disabled_at and disabled_by');
like($by{gone} // '', qr/"reason": "HTTP 410 Gone received by the dispatcher"/, 'gone: announced with its reason');
like($by{calm} // '', qr/"reason": "maintenance window"/, 'pause_endpoint: announced with its reason');
like($by{flaky} // '', qr/"reason": "by hand"/, 'a plain UPDATE: announced');

$lin .= "\\q\n";
$listener->finish;
$sink->stop;
$node->stop;
done_testing();
