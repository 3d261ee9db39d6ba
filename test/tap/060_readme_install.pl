# Copyright: outbox_dispatcher contributors
#
# 060_readme_install.pl — the README's "Install" section works as written,
# on a Debian service cluster (pg_createcluster, /etc/postgresql/N/NAME).
#
# The three steps are read from README.md itself (the code blocks after the
# <!-- install:role -->, <!-- install:conf --> and <!-- install:sql -->
# markers), so the test follows what users read:
#   1. the role command (run as the cluster's superuser);
#   2. the postgresql.conf lines, appended to the service cluster's
#      postgresql.conf, then a restart with pg_ctlcluster;
#   3. the SQL, run in database app (which, like the roles app_user and
#      grafana that the README grants to, is the user's own: created first),
#      with the endpoint URL replaced by a local sink.
# Proves: the workers run as outbox_dispatcher, a message enqueued by
# app_user is delivered, and the log has no ERROR and no permission error.
#
# Skipped where pg_createcluster is missing (not a Debian postgresql-common
# system).  Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use PostgreSQL::Test::Cluster;
use Test::More;
use File::Basename qw(dirname);
use File::Spec;
use Cwd qw(abs_path);
use Time::HiRes qw(time sleep);

use OdSink;

plan skip_all => 'pg_createcluster (postgresql-common) is not available'
  unless -x '/usr/bin/pg_createcluster';

my $readme = slurp_file(File::Spec->catfile(dirname(abs_path(__FILE__)), '..', '..', 'README.md'));
sub block
{
	my ($marker) = @_;
	$readme =~ /<!-- install:$marker -->\s*```[a-z]*\n(.*?)```/s
	  or die "README.md has no code block after <!-- install:$marker -->";
	return $1;
}
my $role_cmd = block('role');
my $conf = block('conf');
my $sql = block('sql');

# the PostgreSQL major of the binaries under test, and a free port
my $bindir = `pg_config --bindir`;
chomp $bindir;
my ($major) = `$bindir/postgres --version` =~ /(\d+)/;
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $name = "odreadme$$";
my $sockdir = PostgreSQL::Test::Utils::tempdir_short;

sub run_ok
{
	my ($cmd, $what) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '>', \$out, '2>', \$err);
	ok($ok, $what) or diag("@$cmd\nstdout: $out\nstderr: $err");
	return $out;
}

run_ok(
	[
		'pg_createcluster', $major, $name, '--port', $port, '--socketdir', $sockdir,
		'--', '--auth-local=trust'
	],
	"pg_createcluster $major $name");
my $confdir = "/etc/postgresql/$major/$name";
ok(-f "$confdir/postgresql.conf", "service-style configuration in $confdir");
END { system('pg_dropcluster', '--stop', $major, $name) if defined $major && $name; }

run_ok([ 'pg_ctlcluster', $major, $name, 'start' ], 'the cluster starts');
my @psql = ("$bindir/psql", '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $sockdir, '-p', $port, '-U', 'postgres');

# the user's own objects: the application database and roles the README grants to
run_ok([ @psql, '-d', 'postgres', '-c', 'CREATE DATABASE app' ], 'the application database exists');
run_ok([ @psql, '-d', 'postgres', '-c', 'CREATE ROLE app_user LOGIN; CREATE ROLE grafana LOGIN' ],
	'the application and monitoring roles exist');

# step 1: the role command, as written (sudo -u postgres is who runs it here)
my ($role_sql) = $role_cmd =~ /psql -c '([^']+)'/ or die "no psql -c '...' in the role step";
run_ok([ @psql, '-d', 'postgres', '-c', $role_sql ], "step 1: $role_sql");

# step 2: postgresql.conf and a restart
open(my $fh, '>>', "$confdir/postgresql.conf") or die "$confdir/postgresql.conf: $!";
print $fh "\n# README.md, Install, step 2\n$conf";
close $fh;
run_ok([ 'pg_ctlcluster', $major, $name, 'restart' ], 'step 2: postgresql.conf lines added, cluster restarted');

# step 3: the SQL, with the endpoint pointing at a local sink
my $sink = OdSink->start($sockdir);
my $url = $sink->url('/orders');
(my $step3 = $sql) =~ s{https://hooks\.example\.com/orders}{$url};
isnt($step3, $sql, 'the example endpoint URL was replaced by the local sink');
run_ok([ @psql, '-d', 'app', '-c', $step3 ], 'step 3: the README SQL runs as written');

# a producer enqueues; the workers deliver
run_ok(
	[ @psql[0 .. $#psql - 2], '-U', 'app_user', '-d', 'app', '-c',
		q{SELECT outbox.enqueue('order', '42', 'order.paid', '{"order_id": 42}')} ],
	'app_user enqueues a message');
my $deadline = time + 20;
my $status = '';
while (time < $deadline)
{
	$status = `@psql -d app -Atc "SELECT status FROM outbox.messages WHERE aggregate_id = '42'"`;
	chomp $status;
	last if $status eq 'done';
	sleep 0.1;
}
is($status, 'done', 'the message was delivered');
ok($sink->wait_requests(1, path => '/orders', timeout => 5), 'the endpoint received it');
my $who = `@psql -d app -Atc "SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'"`;
chomp $who;
is($who, 'outbox_dispatcher', 'the workers run as the dedicated role');

my $log = slurp_file("/var/log/postgresql/postgresql-$major-$name.log");
unlike($log, qr/permission denied/, 'no permission error in the server log');
my @errors = grep { /\b(ERROR|FATAL):/ } split /\n/, $log;
is(scalar @errors, 0, 'no ERROR or FATAL in the server log') or diag(join("\n", @errors));

run_ok([ 'pg_ctlcluster', $major, $name, 'stop' ], 'the cluster stops');
$sink->stop;
done_testing();
