# Copyright: outbox_dispatcher contributors
#
# 055_pg_upgrade.pl — pg_upgrade of a cluster that has the extension, into a
# fresh cluster of the same major.
#
# Proves:
#   - pg_upgrade succeeds with outbox_dispatcher in shared_preload_libraries
#     of both clusters, and the servers it starts in binary-upgrade mode run
#     no worker (their logs show none), so nothing claims or delivers while
#     the databases are dumped and restored;
#   - endpoints (with their ids and secrets), pending, dead and done messages,
#     attempts, errors and the identity sequences survive;
#   - after the upgrade the workers deliver the pending messages, and new
#     messages get ids after the old ones.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use File::Spec;
use File::Find;

use OdSink;
use OdTest qw(poll_until);

my $conf = q{
shared_preload_libraries = 'outbox_dispatcher'
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.max_attempts = 2
};

my $old = PostgreSQL::Test::Cluster->new('old');
$old->init;
$old->append_conf('postgresql.conf', $conf);
$old->start;
my $sink = OdSink->start($old->basedir);
$sink->script({ path => '/dead', status => 404 });
my $url = $sink->url('/hook');
my $dead_url = $sink->url('/dead');
$old->safe_psql(
	'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url, signing_secret)
VALUES ('default', '$url', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'), ('dead', '$dead_url', NULL), ('later', '$url', NULL);
SELECT outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g)) FROM generate_series(1, 5) AS g;
SELECT outbox.enqueue('order', 'd', 'order.created', '{}', 'dead');
});
ok(poll_until($old, q{SELECT string_agg(status, ',' ORDER BY id) FROM outbox.messages},
		'done,done,done,done,done,dead', 20), 'old cluster: 5 done, 1 dead');
$old->safe_psql(
	'postgres', q{
SELECT outbox.pause_endpoint('later');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', 'p' || g, 'order.created', '{}', 'later' FROM generate_series(1, 4) AS g;
});
my $snapshot_sql = q{
SELECT (SELECT string_agg(concat_ws(':', id, endpoint, status, attempts, coalesce(last_http_status, 0)), ',' ORDER BY id)
          FROM outbox.messages)
       || '|' || (SELECT string_agg(concat_ws(':', id, name, enabled, coalesce(signing_secret, '-')), ',' ORDER BY id)
                    FROM outbox.endpoints)
       || '|' || (SELECT last_value FROM outbox.messages_id_seq)};
my $before = $old->safe_psql('postgres', $snapshot_sql);
$old->stop;

# ------------------------------------------------------------------ pg_upgrade
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->append_conf('postgresql.conf', $conf);
my $bindir = $old->config_data('--bindir');
my $workdir = PostgreSQL::Test::Utils::tempdir;
my ($stdout, $stderr);
my $ok = IPC::Run::run(
	[
		"$bindir/pg_upgrade", '--no-sync', '--retain',
		'-b', $bindir, '-B', $bindir,
		'-d', File::Spec->rel2abs($old->data_dir), '-D', File::Spec->rel2abs($new->data_dir),
		'-p', $old->port, '-P', $new->port,
		'-s', $new->host
	],
	'>', \$stdout, '2>', \$stderr,
	init => sub { chdir $workdir or die "chdir: $!" });
ok($ok, 'pg_upgrade succeeds with the library preloaded in both clusters')
  or diag("stdout:\n$stdout\nstderr:\n$stderr");

# the servers pg_upgrade started (binary-upgrade mode) ran no worker
my @server_logs;
File::Find::find(sub { push @server_logs, $File::Find::name if $_ eq 'pg_upgrade_server.log' },
	File::Spec->rel2abs($new->data_dir));
ok(scalar(@server_logs) > 0, 'pg_upgrade kept its server logs');
my $worker_lines = grep { /outbox_dispatcher worker \d|\] (?:LOG|WARNING|ERROR):  outbox_dispatcher: / } map { split /\n/, slurp_file($_) } @server_logs;
is($worker_lines, 0, 'no dispatcher worker ran in the binary-upgrade servers');

# ------------------------------------------------------------------ after
$new->start;
is($new->safe_psql('postgres', $snapshot_sql), $before,
	'endpoints (ids, secrets), messages (status, attempts, last status) and the id sequence survived');
$new->safe_psql('postgres', q{SELECT outbox.resume_endpoint('later')});
ok( poll_until(
		$new, q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'later' AND status = 'done'}, '4', 20),
	'the workers of the upgraded cluster deliver the messages that were pending');
my $id = $new->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'n', 'order.created', '{}')});
is($id, '11', 'a new message gets the next id after the old ones');
ok(poll_until($new, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 20), 'and is delivered');
unlike(slurp_file($new->logfile), qr/\bERROR:/, 'no ERROR in the new cluster\'s log');

$new->stop;
done_testing();
