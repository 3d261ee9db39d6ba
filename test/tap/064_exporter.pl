# Copyright: outbox_dispatcher contributors
#
# 064_exporter.pl — docs/monitoring/postgres_exporter_queries.yaml run by the
# real postgres_exporter (Debian's prometheus-postgres-exporter) serves the
# figures of outbox.metrics(), under the same names and types, and both
# texts pass `promtool check metrics` (its lint included).
#
# Setup: 2 workers, max_attempts 2, endpoints "plain" (200: 5 done), "bad"
# (400: 1 dead, a non-retryable answer), "refused" (connection refused: 3
# dead after their 2 attempts), "down" (connection refused, breaker_threshold
# 1: breaker open, 1 pending with 1 attempt) and "off" (disabled: 2 pending
# with 0 attempts); then the workers are paused so nothing moves.  A role
# in outbox_monitor, as the file's header says, is the exporter's and
# metrics()'s connection.  The exporter listens on a free loopback port
# with --extend.query-path and DATA_SOURCE_NAME on the cluster's unix
# socket.
#
# Proves:
#   - promtool lints: a gauge named *_count is refused (the check below
#     would catch the old outbox_messages_count);
#   - the exporter's outbox_* lines pass `promtool check metrics`, and so
#     does SELECT outbox.metrics() (byte-exact);
#   - the exporter loaded the file and ran every query without an error
#     (pg_up 1, pg_exporter_user_queries_load_error 0,
#     pg_exporter_last_scrape_error 0);
#   - every metric the file declares (<query key>_<column>, LABEL columns
#     excepted) is served with the TYPE its usage says; no outbox_* metric is
#     untyped (a column missing from its query's metrics: list is), and
#     only the *_total ones are counters;
#   - the exporter's families are those of metrics() with the same TYPE,
#     but for the one documented rename (outbox_messages in metrics() is
#     outbox_queue_messages); each of its series (label server="host:port"
#     aside) is a series of metrics() with the value metrics() had just
#     before or just after the scrape;
#   - values agree with SQL: the dead count (4) and the worker dead
#     counters' sum (4, every death was a worker's), the attempts histogram
#     (outbox_unfinished_messages_by_attempts{attempts="0"} 2, {"1"} 1 =
#     outbox.attempts_histogram), the breaker of "down" only, both workers up;
#   - every metric name the alert rules' expressions use is served by both
#     the exporter and metrics().
#
# Binaries: /usr/bin/prometheus-postgres-exporter and promtool on PATH
# (test/install_deps.sh installs them); OD_POSTGRES_EXPORTER and
# OD_PROMTOOL name others (e.g. another release's, to check it).
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use HTTP::Tiny;
use IPC::Run;
use FindBin;
use Cwd qw(abs_path);
use MIME::Base64 qw(decode_base64);
use Encode qw(decode);

use OdNode;
use OdSink;
use OdTest qw(poll_until);

my $ROOT = abs_path("$FindBin::RealBin/../..");
my $QUERIES = "$ROOT/docs/monitoring/postgres_exporter_queries.yaml";
my $RULES = "$ROOT/docs/monitoring/outbox_alerts.rules.yml";
my $EXPORTER = $ENV{OD_POSTGRES_EXPORTER} // '/usr/bin/prometheus-postgres-exporter';
my $PROMTOOL = $ENV{OD_PROMTOOL} // 'promtool';

# metrics() name => the exporter's name, where they differ (the file's header says so)
my %EXPORTER_NAME = (outbox_messages => 'outbox_queue_messages');
my %METRICS_NAME = reverse %EXPORTER_NAME;

# ------------------------------------------------------------------ the tools
sub which
{
	my ($prog) = @_;
	return -x $prog ? $prog : undef if $prog =~ m{/};
	for my $dir (split /:/, $ENV{PATH} // '')
	{
		return "$dir/$prog" if -x "$dir/$prog";
	}
	return undef;
}
my $promtool = which($PROMTOOL);
my $exporter = which($EXPORTER);
ok($promtool, "promtool found ($PROMTOOL)") or diag('install Debian package prometheus (bookworm) or promtool: test/install_deps.sh');
ok($exporter, "postgres_exporter found ($EXPORTER)") or diag('install Debian package prometheus-postgres-exporter: test/install_deps.sh');
unless ($promtool && $exporter)
{
	done_testing();
	exit 0;
}
for my $bin ($promtool, $exporter)
{
	my $v = `$bin --version 2>&1`;
	note(($v =~ /^(.*version \S+)/m)[0] // $v);
}

# `promtool check metrics` on $text: (exit code, what it printed)
sub promtool_check
{
	my ($text) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \$text, '>', \$out, '2>', \$err);
	return ($? >> 8, $out . $err);
}

{
	my ($rc, $msg) = promtool_check("# HELP x_messages_count Messages.\n# TYPE x_messages_count gauge\nx_messages_count{status=\"dead\"} 3\n");
	isnt($rc, 0, 'promtool check metrics refuses a gauge named *_count');
	like($msg, qr/_count/, '... and says why') or diag($msg);
	($rc, $msg) = promtool_check("# HELP x_messages Messages.\n# TYPE x_messages gauge\nx_messages{status=\"dead\"} 3\n");
	is($rc, 0, '... and accepts the same gauge named otherwise') or diag($msg);
}

# ------------------------------------------------------------------ exposition text
# Returns (\%series, \%type): %series maps "name{l1=v1,l2=v2}" (labels sorted,
# values unescaped) to the value, %type a metric name to its TYPE.  Only the
# lines of metrics whose name matches $only; the strict check is promtool's
# (and 044_metrics.pl's).
sub parse_text
{
	my ($text, $only) = @_;
	my (%series, %type);
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^# TYPE (\S+) (\S+)$/)
		{
			my ($name, $t) = ($1, $2);
			$type{$name} = $t if $name =~ $only;
			next;
		}
		next if $line =~ /^#/ || $line eq '';
		$line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: -?\d+)?$/ or die "unparsable sample line [$line]";
		my ($name, $labels, $value) = ($1, $2 // '', $3);
		next unless $name =~ $only;
		my %l;
		while ($labels =~ /\G([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/gc)
		{
			my ($k, $v) = ($1, $2);
			$v =~ s/\\(.)/$1 eq 'n' ? "\n" : $1/ge;
			$l{$k} = $v;
		}
		die "unparsable labels [$labels]" if (pos($labels) // 0) != length $labels;
		$series{ $name . '{' . join(',', map { "$_=$l{$_}" } sort keys %l) . '}' } = $value;
	}
	return (\%series, \%type);
}

sub family_of { my ($key) = @_; return ($key =~ /^([^{]+)/)[0]; }

# ------------------------------------------------------------------ the file's declarations
# The queries file's metrics: query key => [ [column, usage], ... ] (its layout: top-level
# keys, then "- column:" entries with usage inline or on the next line).
my %declared;
{
	open my $fh, '<', $QUERIES or die "$QUERIES: $!";
	my ($key, $col);
	while (my $line = <$fh>)
	{
		next if $line =~ /^\s*#/;
		if ($line =~ /^([a-zA-Z_][a-zA-Z0-9_]*):\s*$/) { $key = $1; $declared{$key} = []; next; }
		if ($line =~ /^\s+-\s+([a-zA-Z_][a-zA-Z0-9_]*):\s*(?:\{.*usage:\s*"(\w+)")?/)
		{
			$col = $1;
			push @{ $declared{$key} }, [ $col, $2 ] if defined $2;
			next;
		}
		if (defined $col && $line =~ /^\s+usage:\s*"(\w+)"/)
		{
			push @{ $declared{$key} }, [ $col, $1 ];
			undef $col;
		}
	}
}
my %expected_type;    # exporter metric name => counter|gauge
for my $key (sort keys %declared)
{
	for my $c (@{ $declared{$key} })
	{
		my ($col, $usage) = @$c;
		next if $usage eq 'LABEL';
		$expected_type{"${key}_$col"} = { COUNTER => 'counter', GAUGE => 'gauge' }->{$usage} // "unexpected usage $usage";
	}
}
cmp_ok(scalar keys %declared, '>=', 7, 'queries file: ' . scalar(keys %declared) . ' queries, '
	  . scalar(keys %expected_type) . ' metrics declared');

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'exporter', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.max_attempts = 2
});
$node->safe_psql('postgres', 'CREATE ROLE exporter_monitor LOGIN IN ROLE outbox_monitor');

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/bad', status => 400, body => 'no' });
my $closed = OdNode::closed_port();
$node->add_endpoint('plain', $sink->url('/plain'));
$node->add_endpoint('bad', $sink->url('/bad'));
$node->add_endpoint('refused', "http://127.0.0.1:$closed/refused", breaker_threshold => 100);
$node->add_endpoint('down', "http://127.0.0.1:$closed/down", breaker_threshold => 1, breaker_cooldown => '1 hour');
$node->add_endpoint('off', $sink->url('/off'), enabled => 'false');
$node->enqueue_n(5, endpoint => 'plain');
$node->enqueue_n(1, endpoint => 'bad');
$node->enqueue_n(3, endpoint => 'refused');
$node->enqueue_n(1, endpoint => 'down');
$node->safe_psql('postgres', q{INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.created', '{}', 'off' FROM generate_series(1, 2) AS g});    # enqueue() refuses a disabled endpoint

ok( $node->poll(
		q{SELECT string_agg(status || '=' || count, ' ' ORDER BY status) FROM outbox.queue_depth},
		'dead=4 done=5 pending=3 processing=0', 30),
	'messages settled: 5 done, 4 dead, 3 pending');
ok($node->poll(q{SELECT state FROM outbox.endpoint_health WHERE endpoint = 'down'}, 'open', 10), '"down": breaker open');
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf()');
ok($node->poll(q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'paused'}, '2', 10), 'workers paused');
ok($node->poll(q{SELECT sum(in_flight) FROM outbox.endpoint_health}, '0', 10), 'nothing in flight or reserved');

# metrics() byte-exact, as the exporter's role
sub fetch_metrics
{
	my $b64 = $node->safe_psql('postgres', q{SELECT encode(convert_to(outbox.metrics(), 'UTF8'), 'base64')},
		extra_params => [ '-U', 'exporter_monitor' ]);
	return decode('UTF-8', decode_base64($b64));
}

# ------------------------------------------------------------------ the exporter
my $http_port = OdNode::closed_port();
my $url = "http://127.0.0.1:$http_port/metrics";
my $server = $node->host . ':' . $node->port;
my $exporter_log = $node->basedir . '/exporter.log';
my $h;
{
	local $ENV{DATA_SOURCE_NAME} =
	  'host=' . $node->host . ' port=' . $node->port . ' user=exporter_monitor dbname=postgres sslmode=disable';
	my $dir = $node->basedir;    # newer exporters look for postgres_exporter.yml in their directory
	$h = IPC::Run::start(
		[
			$exporter, "--web.listen-address=127.0.0.1:$http_port",
			"--extend.query-path=$QUERIES", '--disable-default-metrics',
			'--disable-settings-metrics'
		],
		'<', \undef, '>&', $exporter_log,
		init => sub { chdir $dir or die "chdir $dir: $!" });
}
END { $h->kill_kill(grace => 5) if $h && $h->pumpable; }    # also when the test dies
my $ua = HTTP::Tiny->new(timeout => 10);
sub scrape { my $r = $ua->get($url); return $r->{success} ? $r->{content} : undef; }

my $scraped;
{
	my $deadline = time + 30;
	while (time < $deadline)
	{
		$scraped = scrape();
		last if defined $scraped && $scraped =~ /^pg_up 1$/m && $scraped =~ /^outbox_/m;
		sleep 0.2;
	}
}
ok(defined $scraped && $scraped =~ /^outbox_/m, "the exporter serves outbox_* metrics on $url")
  or diag(slurp_file($exporter_log));

my $m1 = fetch_metrics();
my $text = scrape() // '';
my $m2 = fetch_metrics();
note($text =~ /^((?:# (?:HELP|TYPE) )?outbox_.*\n)/mg);

# ------------------------------------------------------------------ the exporter ran the file
like($text, qr/^pg_up 1$/m, 'pg_up 1: the exporter reached the database');
like($text, qr/^pg_exporter_user_queries_load_error\{[^}]*filename="\Q$QUERIES\E"[^}]*\} 0$/m,
	'pg_exporter_user_queries_load_error 0: the queries file loaded');
like($text, qr/^pg_exporter_last_scrape_error 0$/m, 'pg_exporter_last_scrape_error 0: every query ran')
  or diag(slurp_file($exporter_log));

# ------------------------------------------------------------------ promtool check metrics
my $outbox_lines = join('', $text =~ /^((?:# (?:HELP|TYPE) )?outbox_.*\n)/mg);
{
	my ($rc, $msg) = promtool_check($outbox_lines);
	is($rc, 0, "promtool check metrics: the exporter's outbox_* lines pass") or diag($msg);
	($rc, $msg) = promtool_check($m1);
	is($rc, 0, 'promtool check metrics: SELECT outbox.metrics() passes') or diag($msg);
}

# ------------------------------------------------------------------ names and types
my ($e_series, $e_type) = parse_text($text, qr/^outbox_/);
my ($m1_series, $m1_type) = parse_text($m1, qr/^outbox_/);
my ($m2_series) = parse_text($m2, qr/^outbox_/);

for my $name (sort keys %expected_type)
{
	is($e_type->{$name} // 'missing', $expected_type{$name}, "exporter: $name has TYPE $expected_type{$name}");
}
is_deeply([ grep { $e_type->{$_} eq 'untyped' } sort keys %$e_type ], [], 'exporter: no outbox_* metric is untyped');
is_deeply([ grep { ($e_type->{$_} eq 'counter') != ($_ =~ /_total$/) } sort keys %$e_type ], [],
	'exporter: the counters are exactly the *_total metrics');
is_deeply([ grep { !exists $expected_type{$_} } sort keys %$e_type ], [],
	'exporter: no outbox_* metric the file does not declare');

# the exporter's families under metrics()'s names, and their series without the server label
my (%e_fam_type, %e_by_m);
my @bad_server;
for my $f (keys %$e_type)
{
	$e_fam_type{ $METRICS_NAME{$f} // $f } = $e_type->{$f};
}
for my $key (keys %$e_series)
{
	my $k = $key;
	push @bad_server, $key unless $k =~ s/(?<=[{,])server=\Q$server\E(?:,|(?=\}))//;
	$k =~ s/,\}$/}/;
	my $f = family_of($k);
	$k =~ s/^\Q$f\E/$METRICS_NAME{$f}/ if exists $METRICS_NAME{$f};
	$e_by_m{$k} = $e_series->{$key};
}
is_deeply(\@bad_server, [], "exporter: every outbox_* series has server=\"$server\"");

my %m_fam_with_samples = map { (family_of($_) => 1) } keys %$m1_series, keys %$m2_series;
my %e_fam_with_samples = map { (family_of($_) => 1) } keys %e_by_m;
is_deeply([ sort keys %e_fam_with_samples ], [ sort keys %m_fam_with_samples ],
	'the exporter has the families of metrics() (' . scalar(keys %m_fam_with_samples)
	  . '), outbox_messages as outbox_queue_messages, and no other');
for my $f (sort keys %m_fam_with_samples)
{
	is($e_fam_type{$f} // 'missing', $m1_type->{$f}, ($EXPORTER_NAME{$f} // $f) . ": the TYPE of metrics()' $f ($m1_type->{$f})");
}

# ------------------------------------------------------------------ values agree with metrics()
{
	my (%bad, %n);
	my %all = map { ($_ => 1) } keys %$m1_series, keys %$m2_series, keys %e_by_m;
	for my $k (sort keys %all)
	{
		my $f = family_of($k);
		$n{$f}++;
		my ($v1, $v2, $e) = ($m1_series->{$k}, $m2_series->{$k}, $e_by_m{$k});
		if (!defined $e)
		{
			# a series metrics() had only once (it came or went between the two calls) may be missing
			push @{ $bad{$f} }, "$k missing (metrics(): " . ($v1 // "-") . " / " . ($v2 // "-") . ")" if defined $v1 && defined $v2;
			next;
		}
		if (!defined $v1 && !defined $v2)
		{
			push @{ $bad{$f} }, "$k = $e: not in metrics()";
			next;
		}
		my @v = grep { defined } ($v1, $v2);
		my ($lo, $hi) = (sort { $a <=> $b } @v)[ 0, -1 ];
		my $tol = 1e-9 * (1 + abs($hi));
		push @{ $bad{$f} }, "$k = $e, metrics(): " . join(' / ', @v) unless $e >= $lo - $tol && $e <= $hi + $tol;
	}
	for my $f (sort keys %n)
	{
		is_deeply($bad{$f} // [], [], ($EXPORTER_NAME{$f} // $f) . ": $n{$f} series agree with metrics()");
	}
}

# ------------------------------------------------------------------ values agree with SQL
sub e_value
{
	my ($name, %labels) = @_;
	$labels{server} = $server;
	return $e_series->{ $name . '{' . join(',', map { "$_=$labels{$_}" } sort keys %labels) . '}' };
}
{
	my $dead = $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'dead'});
	is($dead, 4, 'SQL: 4 dead messages');
	is(e_value('outbox_queue_messages', status => 'dead') // 'missing', $dead, "outbox_queue_messages{status=\"dead\"} = $dead");
	for my $row (split /\n/, $node->safe_psql('postgres', 'SELECT status, count FROM outbox.queue_depth'))
	{
		my ($status, $count) = split /\|/, $row;
		is(e_value('outbox_queue_messages', status => $status) // 'missing', $count,
			"outbox_queue_messages{status=\"$status\"} = queue_depth ($count)");
	}
	my $wdead = $node->safe_psql('postgres', 'SELECT sum(dead) FROM outbox.worker_stats');
	is($wdead, $dead, 'SQL: the workers made every dead message dead (sum of worker_stats.dead)');
	my $sum = 0;
	$sum += $e_series->{$_} for grep { /^outbox_worker_dead_total\{/ } keys %$e_series;
	is($sum, $wdead, "sum(outbox_worker_dead_total) = sum(worker_stats.dead) ($wdead)");

	my %hist = map { split /\|/ } split /\n/, $node->safe_psql('postgres', 'SELECT attempts, count FROM outbox.attempts_histogram');
	is_deeply(\%hist, { 0 => 2, 1 => 1 }, 'SQL: attempts_histogram 0:2 1:1');
	my %got = map { /attempts=(\d+)[,}]/ ? ($1 => $e_series->{$_}) : () }
	  grep { /^outbox_unfinished_messages_by_attempts\{/ } keys %$e_series;
	is_deeply(\%got, \%hist, 'outbox_unfinished_messages_by_attempts{attempts} = attempts_histogram (the histogram series exist)');

	for my $ep (qw(plain bad refused down off))
	{
		is(e_value('outbox_endpoint_breaker_open', endpoint => $ep) // 'missing', $ep eq 'down' ? 1 : 0,
			"outbox_endpoint_breaker_open{endpoint=\"$ep\"}");
	}
	is(e_value('outbox_endpoint_up', endpoint => 'off') // 'missing', 0, 'outbox_endpoint_up{endpoint="off"} 0');
	is(e_value('outbox_worker_up', worker => $_) // 'missing', 1, "outbox_worker_up{worker=\"$_\"} 1") for 0, 1;
	is(e_value('outbox_endpoint_delivered_total', endpoint => 'plain') // 'missing', 5, 'outbox_endpoint_delivered_total{endpoint="plain"} 5');
}

# ------------------------------------------------------------------ the alert rules' names
{
	open my $fh, '<', $RULES or die "$RULES: $!";
	my %used;
	while (my $line = <$fh>)
	{
		next unless $line =~ /^\s*expr:\s*(.*)$/;
		$used{$_} = 1 for $1 =~ /\b(outbox_[a-zA-Z0-9_]+)/g;
	}
	my %e_served = map { (family_of($_) => 1) } keys %$e_series;
	cmp_ok(scalar keys %used, '>=', 6, 'alert rules: ' . join(', ', sort keys %used));
	for my $name (sort keys %used)
	{
		ok($e_served{$name}, "alert rules: $name is served by the exporter");
		ok($m_fam_with_samples{$name}, "alert rules: $name is served by metrics()");
	}
}

$h->kill_kill(grace => 5);
$sink->stop;
$node->stop;
done_testing();
