# Copyright: outbox_dispatcher contributors
#
# 056_dump_across_versions.pl — a pg_dump taken on one PostgreSQL major is
# restored into another, keeps messages, endpoints and the identity
# sequences, and the workers deliver from it.
#
# Two halves, run by different majors of the same CI run
# (test/test_all_versions.sh):
#   - with OD_CROSS_DUMP set (the PostgreSQL 15 run): build a database with
#     endpoints and done, dead and pending messages, and write
#     pg_dump --format=custom to $OD_CROSS_DUMP, with the expected snapshot
#     next to it ($OD_CROSS_DUMP.expected);
#   - when test/cross_dump/pg15.dump exists (copied into the tree of the 17
#     and 18 runs by test/pgversions.sh): restore it with this major's
#     pg_restore into a fresh cluster, compare the snapshot, and check that
#     the pending messages are delivered and new ids follow the old ones.
# Without either, the test is skipped.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(dirname);
use File::Spec;
use Cwd qw(abs_path);

use OdSink;
use OdTest qw(poll_until);

my $in = File::Spec->catfile(dirname(abs_path(__FILE__)), '..', 'cross_dump', 'pg15.dump');
my $out = $ENV{OD_CROSS_DUMP};
plan skip_all => 'neither OD_CROSS_DUMP nor test/cross_dump/pg15.dump'
  unless ($out || -f $in);

my $conf = q{
shared_preload_libraries = 'outbox_dispatcher'
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 1
};
my $snapshot_sql = q{
SELECT (SELECT string_agg(concat_ws(':', id, endpoint, status, attempts, coalesce(last_http_status, 0),
                                    payload->>'n'), ',' ORDER BY id) FROM outbox.messages)
       || '|' || (SELECT string_agg(concat_ws(':', id, name, enabled, coalesce(signing_secret, '-')), ',' ORDER BY id)
                    FROM outbox.endpoints)
       || '|' || (SELECT last_value FROM outbox.messages_id_seq)
       || '|' || (SELECT last_value FROM outbox.endpoints_id_seq)};

my $node = PostgreSQL::Test::Cluster->new('cross');
$node->init;
$node->append_conf('postgresql.conf', $conf);
$node->start;
my $sink = OdSink->start($node->basedir);
my $major = $node->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int / 10000});

if ($out)
{
	$sink->script({ path => '/dead', status => 404 });
	my ($url, $dead) = ($sink->url('/hook'), $sink->url('/dead'));
	$node->safe_psql(
		'postgres', qq{
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url, signing_secret)
VALUES ('default', '$url', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'), ('dead', '$dead', NULL);
SELECT outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g)) FROM generate_series(1, 3) AS g;
SELECT outbox.enqueue('order', 'd', 'order.created', '{"n": 4}', 'dead');
});
	ok(poll_until($node, q{SELECT string_agg(status, ',' ORDER BY id) FROM outbox.messages}, 'done,done,done,dead', 20),
		"PostgreSQL $major: 3 done, 1 dead");
	$node->safe_psql(
		'postgres', q{
SELECT outbox.pause_endpoint('default');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'p' || g, 'order.created', jsonb_build_object('n', 10 + g) FROM generate_series(1, 3) AS g;
});
	my $snapshot = $node->safe_psql('postgres', $snapshot_sql);
	$node->command_ok([ 'pg_dump', '--format=custom', '-f', $out, '-d', $node->connstr('postgres') ],
		"pg_dump on PostgreSQL $major");
	open(my $fh, '>', "$out.expected") or die "$out.expected: $!";
	print $fh $snapshot;
	close $fh;
	ok(-s $out, "dump written to $out");
}

if (-f $in)
{
	my $expected = slurp_file("$in.expected");
	my $url = $sink->url('/hook');
	$node->command_ok(
		[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('postgres'), $in ],
		"pg_restore on PostgreSQL $major of a PostgreSQL 15 dump");
	is($node->safe_psql('postgres', $snapshot_sql), $expected,
		'messages, endpoints (ids, secrets) and both identity sequences are as they were dumped');
	$node->safe_psql('postgres', qq{UPDATE outbox.endpoints SET url = '$url' WHERE name = 'default';
		SELECT outbox.resume_endpoint('default')});
	ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}, '6', 20),
		'the workers deliver the restored pending messages');
	my $id = $node->safe_psql('postgres', q{SELECT outbox.enqueue('order', 'new', 'order.created', '{}')});
	is($id, '8', 'a new message gets the id after the restored ones');
	ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $id", 'done', 20), 'and is delivered');
}

$node->stop;
done_testing();
