
# Copyright: outbox_dispatcher contributors
#
# 001_pg_dump.pl — pg_dump / pg_restore keep everything an operator puts in
# outbox_dispatcher's tables: endpoints (headers, signing secret, settings),
# messages in every state (pending, future, rescheduled, processing with its
# lease, done, dead), the identity sequence position, the extension itself,
# its privileges and triggers.
#
# outbox.endpoints, outbox.messages and outbox.messages_id_seq are extension
# configuration objects (pg_extension_config_dump), so their contents are
# dumped although CREATE EXTENSION creates the objects; messages references
# endpoints, so the restore must load endpoints first.
#
# Round trips checked, each into a new database of the same node:
#   custom format   pg_dump -Fc | pg_restore
#   parallel        the same archive with pg_restore -j 2: fails (TODO, a
#                   pg_dump/pg_restore limitation with FKs between extension
#                   configuration tables); passes with session_replication_role
#                   = replica, the workaround to document
#   plain format    pg_dump -Fp | psql
# For each: a deterministic text rendering of every column of every row
# (endpoints by name, messages by id), the sequence state, the extension
# (version, schema, member objects), table and column privileges and the
# triggers are identical to the source; a rolled-back claim returns the same
# ids; a new enqueue gets an id above every restored id; a plain dump of the
# restored database is identical to a plain dump of the source.
#
# Run (as postgres, from a directory where tmp_check/ may be created):
#   PATH=/usr/lib/postgresql/15/bin:$PATH \
#   PG_REGRESS=/usr/lib/postgresql/15/lib/pgxs/src/test/regress/pg_regress \
#   prove -I /usr/lib/postgresql/15/lib/pgxs/src/test/perl test/tap/001_pg_dump.pl
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'outbox_dispatcher'
# No background delivery: message states must change only through this test,
# or the source and the restored copies could not be compared row for row.
outbox_dispatcher.workers = 0
outbox_dispatcher.enabled = off
});
$node->start;

my $tempdir = PostgreSQL::Test::Utils::tempdir;
my $secret  = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

# ------------------------------------------------------------------ source data
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION outbox_dispatcher');

$node->safe_psql(
	'app', qq{
INSERT INTO outbox.endpoints (name, url)
     VALUES ('default', 'http://127.0.0.1:9/outbox');
INSERT INTO outbox.endpoints (name, url, headers, signing_secret, timeout, max_in_flight,
                              enabled, defer_statuses)
     VALUES ('billing', 'https://billing.example.com/hooks/outbox?v=2',
             '{"Authorization": "Bearer t0k3n", "X-Tenant": "acme"}', '$secret',
             interval '5 seconds', 8, true, '{409,503}');
});

# A privilege granted after CREATE EXTENSION must survive too (pg_dump emits it
# as a difference from pg_init_privs).  Roles are cluster-wide: the restores
# below go to the same cluster, so the role exists there.
$node->safe_psql(
	'app', q{
CREATE ROLE tap_reader NOLOGIN;
GRANT outbox_monitor TO tap_reader;
GRANT SELECT ON outbox.dead_letters TO tap_reader;
});

# Each enqueue is its own transaction, so now() (available_at) grows with the id.
my @enqueue = (
	q{SELECT outbox.enqueue('order', '1001', 'order.created', '{"order": 1001, "total": 42.50}')},
	q{SELECT outbox.enqueue('order', '1001', 'order.paid', '{"order": 1001, "paid": true}',
	                        'default', true)},
	q{SELECT outbox.enqueue('invoice', 'A-1', 'invoice.issued',
	                        '{"invoice": "A-1", "lines": [{"sku": "x", "qty": 2}], "note": null}',
	                        'billing', false, now(), '{"X-Trace-Id": "abc-123"}')},
	q{SELECT outbox.enqueue('invoice', 'A-2', 'invoice.issued', '{"invoice": "A-2"}', 'billing')},
	q{SELECT outbox.enqueue('invoice', 'A-3', 'invoice.voided', '{"invoice": "A-3"}', 'billing',
	                        false, now() + interval '1 day')},
	q{SELECT outbox.enqueue('user', 'u-7', 'user.signed_up',
	                        '{"email": "u7@example.com", "quote": "it''s \"quoted\"\ttab"}')},
	q{SELECT outbox.enqueue('order', '1002', 'order.created', '{"order": 1002}')},
	q{SELECT outbox.enqueue('order', '1003', 'order.created', '{"order": 1003}', 'billing')},);
my @ids;
push @ids, $node->safe_psql('app', $_) for @enqueue;
# a plain INSERT is a supported way to enqueue, too
push @ids, $node->safe_psql(
	'app', q{
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, headers)
     VALUES ('user', 'u-8', 'user.deleted', '{"user": "u-8"}', 'billing', '{"X-Reason": "gdpr"}')
  RETURNING id});
is(scalar(grep { /^\d+$/ } @ids), 9, 'nine messages enqueued');

# claim(...) as "id lease_version" pairs, in id order
sub claim
{
	my ($db, $batch, $lease) = @_;
	my $out = $node->safe_psql($db,
		"SELECT id || ' ' || lease_version FROM outbox.claim('tap-worker', $batch, '$lease') ORDER BY id");
	return map { [ split / / ] } grep { length } split /\n/, $out;
}

sub transition
{
	my ($call, $what) = @_;
	is($node->safe_psql('app', "SELECT $call"), 't', $what);
}

# 1st claim of 3: two delivered, one rejected for good
my @c = claim('app', 3, '60 s');
is(scalar @c, 3, 'first claim leases 3 messages');
transition("outbox.mark_done($c[0][0], $c[0][1], 200)", "mark_done $c[0][0]");
transition("outbox.mark_done($c[1][0], $c[1][1], 204)", "mark_done $c[1][0]");
transition("outbox.mark_dead($c[2][0], $c[2][1], 'HTTP 410: gone', 410)", "mark_dead $c[2][0]");
# 2nd claim of 1: retryable failure, back to pending in 5 minutes
@c = claim('app', 1, '60 s');
is(scalar @c, 1, 'second claim leases 1 message');
transition("outbox.reschedule($c[0][0], $c[0][1], interval '5 minutes', 'HTTP 503', false, 503)",
	"reschedule $c[0][0]");
# 3rd claim of 1: left in flight (processing, leased to tap-worker); a long lease, so that
# it cannot expire while the test runs and change what the next claim would take
@c = claim('app', 1, '1 hour');
is(scalar @c, 1, 'third claim leases 1 message');

is( $node->safe_psql('app',
		'SELECT string_agg(DISTINCT status, \',\' ORDER BY status) FROM outbox.messages'),
	'dead,done,pending,processing',
	'source holds messages in every state');
is( $node->safe_psql('app',
		q{SELECT count(*) FROM outbox.messages WHERE status = 'pending' AND available_at > now()}),
	'2', 'source holds two messages scheduled for later (future and rescheduled)');

# ------------------------------------------------------------------ rendering
# Everything compared between the source and a restored copy, as text.
my %render_sql = (
	endpoints => q{SELECT e::text FROM outbox.endpoints AS e ORDER BY e.name},
	messages  => q{SELECT m::text FROM outbox.messages AS m ORDER BY m.id},
	sequence  => q{SELECT format('%s %s', last_value, is_called) FROM outbox.messages_id_seq},
	extension => q{
		SELECT format('%s %s %s', extname, extversion, extnamespace::regnamespace)
		  FROM pg_extension WHERE extname = 'outbox_dispatcher'},
	members => q{
		SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
		  FROM pg_depend AS d JOIN pg_extension AS x ON x.oid = d.refobjid
		 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
		   AND x.extname = 'outbox_dispatcher'
		 ORDER BY 1},
	config => q{
		SELECT format('%s %s', c::regclass, x.extcondition[i])
		  FROM pg_extension AS x, unnest(x.extconfig) WITH ORDINALITY AS u(c, i)
		 WHERE x.extname = 'outbox_dispatcher'
		 ORDER BY 1},
	table_acl => q{
		SELECT format('%s %s', c.relname, c.relacl)
		  FROM pg_class AS c WHERE c.relnamespace = 'outbox'::regnamespace
		 ORDER BY c.relname},
	column_acl => q{
		SELECT format('%s.%s %s', a.attrelid::regclass, a.attname, a.attacl)
		  FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
		 WHERE c.relnamespace = 'outbox'::regnamespace AND a.attacl IS NOT NULL
		 ORDER BY 1},
	function_acl => q{
		SELECT format('%s %s', p.oid::regprocedure, p.proacl)
		  FROM pg_proc AS p WHERE p.pronamespace = 'outbox'::regnamespace
		 ORDER BY 1},
	triggers => q{
		SELECT format('%s %s %s', t.tgrelid::regclass, t.tgname, t.tgenabled)
		  FROM pg_trigger AS t
		 WHERE NOT t.tgisinternal
		   AND t.tgrelid IN ('outbox.messages'::regclass, 'outbox.endpoints'::regclass)
		 ORDER BY 1},
	# what the next claim would take (ready rows in claim order), rolled back
	next_claim => q{
		BEGIN;
		SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.claim('probe', 100, '60 s');
		ROLLBACK;});

sub render
{
	my ($db) = @_;
	return { map { $_ => $node->safe_psql($db, $render_sql{$_}) } keys %render_sql };
}

my $source = render('app');
like($source->{endpoints}, qr/\Q$secret\E/, 'source endpoint carries its signing secret');
my $max_id = $node->safe_psql('app', 'SELECT max(id) FROM outbox.messages');
is($max_id, $ids[-1], 'max id is the last enqueued id');
isnt($source->{next_claim}, '', 'source has messages ready to claim');

# plain dump of the source, the reference for "nothing lost"
$node->command_ok([ 'pg_dump', '-Fp', '-f', "$tempdir/source.sql", '-d', 'app' ],
	'pg_dump -Fp of the source');
# pg_dump >= 15.14 brackets plain dumps with \restrict <random key> / \unrestrict
sub normalized_dump
{
	my ($file) = @_;
	my $text = slurp_file($file);
	$text =~ s/^\\restrict \S+$/\\restrict KEY/mg;
	$text =~ s/^\\unrestrict \S+$/\\unrestrict KEY/mg;
	return $text;
}
my $source_dump = normalized_dump("$tempdir/source.sql");
like($source_dump, qr/pg_catalog\.setval\('outbox\.messages_id_seq', $max_id, true\)/,
	'plain dump sets the identity sequence to the max id');

# ------------------------------------------------------------------ checks of a restored copy
sub check_restored
{
	my ($db, $how) = @_;
	my $copy = render($db);

	for my $k (sort keys %render_sql)
	{
		is($copy->{$k}, $source->{$k}, "$how: $k identical");
	}

	# the restored copy dumps exactly like the source
	$node->command_ok([ 'pg_dump', '-Fp', '-f', "$tempdir/$db.sql", '-d', $db ],
		"$how: pg_dump -Fp of the restored database");
	my $copy_dump = normalized_dump("$tempdir/$db.sql");
	ok($copy_dump eq $source_dump, "$how: plain dump identical to the source's")
	  or diag(`diff -u '$tempdir/source.sql' '$tempdir/$db.sql' | head -40`);

	# identity sequence position kept: new rows get ids above every restored id
	my $new_id = $node->safe_psql($db,
		q{SELECT outbox.enqueue('order', '2001', 'order.created', '{"order": 2001}')});
	cmp_ok($new_id, '>', $max_id, "$how: enqueue after restore gets id $new_id > max restored id $max_id");
	my $insert_id = $node->safe_psql($db,
		q{INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
		  VALUES ('order', '2002', 'order.created', '{}') RETURNING id});
	cmp_ok($insert_id, '>', $new_id, "$how: plain INSERT after restore gets the next id");

	# the extension's triggers are live in the copy
	my ($rc, $out, $err) = $node->psql($db,
		q{INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'ftp://example.com/')});
	isnt($rc, 0, "$how: endpoint validation trigger active (ftp:// URL rejected)");
	like($err, qr/URL/, "$how: rejection names the URL");

	# the restored leased message is still fenced by its lease_version
	my ($leased) = split /\n/, $node->safe_psql($db,
		q{SELECT id || ' ' || lease_version FROM outbox.messages WHERE status = 'processing'});
	my ($lid, $lver) = split / /, $leased;
	is($node->safe_psql($db, "SELECT outbox.mark_done($lid, $lver - 1)"), 'f',
		"$how: stale lease_version still rejected on message $lid");
	is($node->safe_psql($db, "SELECT outbox.mark_done($lid, $lver)"), 't',
		"$how: current lease_version accepted on message $lid");
}

# custom format, pg_restore
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tempdir/app.dump", '-d', 'app' ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', 'restored', "$tempdir/app.dump" ],
	'pg_restore of the custom archive');
check_restored('restored', 'pg_restore');

# custom format, parallel pg_restore.  Known limitation (PostgreSQL, not this
# extension): pg_dump orders the data of extension configuration tables by
# their foreign keys, which a serial restore follows, but the archive's TABLE
# DATA entries only depend on their own table, so pg_restore -j may COPY
# messages while endpoints are still loading, and messages_endpoint_fkey
# (created by CREATE EXTENSION, i.e. before the data) rejects the rows.
$node->safe_psql('postgres', 'CREATE DATABASE restored_jobs');
TODO:
{
	local $TODO = 'pg_restore -j ignores the FK order of extension configuration table data';
	$node->command_ok(
		[ 'pg_restore', '--exit-on-error', '-j', '2', '-d', 'restored_jobs', "$tempdir/app.dump" ],
		'pg_restore -j 2 of the custom archive');
}

# The workaround to document: a superuser restore with session_replication_role
# = replica, which does not fire the FK (or any ordinary) triggers while loading.
$node->safe_psql('postgres', 'CREATE DATABASE restored_parallel');
{
	local $ENV{PGOPTIONS} = '-c session_replication_role=replica';
	$node->command_ok(
		[ 'pg_restore', '--exit-on-error', '-j', '2', '-d', 'restored_parallel', "$tempdir/app.dump" ],
		'pg_restore -j 2 with session_replication_role = replica');
}
check_restored('restored_parallel', 'pg_restore -j 2 (replica role)');

# plain format, psql
$node->safe_psql('postgres', 'CREATE DATABASE restored_plain');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'restored_plain', '-f', "$tempdir/source.sql" ],
	'psql restore of the plain dump');
check_restored('restored_plain', 'plain dump');

# the source is untouched by all this
is(render('app')->{messages}, $source->{messages}, 'source messages unchanged');

$node->stop;
done_testing();
