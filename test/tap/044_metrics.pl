# Copyright: outbox_dispatcher contributors
#
# 044_metrics.pl — outbox.metrics() is valid Prometheus text exposition
# (format 0.0.4) and agrees with the views.
#
# Proves, with 2 workers and endpoints "plain" (200), `we"ird\name` (200;
# a label value that needs escaping), "bad" (400: a dead message), "down"
# (connection refused, breaker_threshold 1: breaker open, a pending
# message) and "off" (disabled, two pending messages):
#   - the text, fetched byte-exact (base64), passes a strict parser written
#     here: it ends with a newline, has no empty line, and every line is
#     `# HELP name text` (text escapes only \\ and \n), `# TYPE name
#     (counter|gauge|histogram|summary|untyped)` or a sample
#     `name{label="value",...} number` (optional integer timestamp);
#     metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
#     [a-zA-Z_][a-zA-Z0-9_]* (not starting with __), label values escape
#     only \\, \" and \n, nothing else is escaped or unescaped; each
#     sample's metric has its TYPE declared before it, HELP and TYPE at most
#     once per metric (and before its samples), the samples of one metric
#     are contiguous, no metric has the same label set twice, every counter
#     name ends in _total;
#   - the endpoint `we"ird\name` appears as endpoint="we\"ird\\name", and
#     unescaped it is the name again;
#   - values agree with the views: outbox_messages{status} = queue_depth
#     (done 8, dead 1, pending 3, processing 0);
#     outbox_unfinished_messages_by_attempts = attempts_histogram;
#     outbox_expired_leases / outbox_lost_leases_total /
#     outbox_oldest_pending_age_seconds = outbox.health; per worker
#     up/delivered/claimed/dead = worker_stats; per endpoint up (0 for
#     "off"), breaker_open (1 for "down" only), in_flight, delivered_total,
#     failed_total = endpoint_health; every endpoint has a series;
#   - outbox_monitor can call metrics() (same series), outbox_producer
#     cannot (permission denied).
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;
use MIME::Base64 qw(decode_base64);
use Encode qw(decode);

use OdNode;
use OdSink;
use OdTest qw(poll_until sql_quote);

my $WEIRD = 'we"ird\\name';    # we"ird\name

# ------------------------------------------------------------------ the parser
my $NAME_RE = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
my $LABEL_RE = qr/[a-zA-Z_][a-zA-Z0-9_]*/;
my $VALUE_RE = qr/(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN)/;

# Parses exposition text.  Returns (\@errors, \%series, \%types): %series maps
# "name{l1=v1,l2=v2}" (labels sorted, values unescaped) to the value,
# %types maps metric name to its type.
sub parse_exposition
{
	my ($text) = @_;
	my (@err, %series, %type, %help, %family_done, %has_samples);
	my $current;    # family of the previous sample line
	push @err, 'the text does not end with a newline' unless $text =~ /\n\z/;
	my @lines = split /\n/, $text, -1;
	pop @lines if @lines && $lines[-1] eq '';    # after the final newline
	my $ln = 0;
	for my $line (@lines)
	{
		$ln++;
		my $where = "line $ln [$line]";
		if ($line eq '')
		{
			push @err, "$where: empty line";
			next;
		}
		if ($line =~ /^#/)
		{
			if ($line =~ /^# HELP ($NAME_RE) (.*)$/)
			{
				my ($name, $doc) = ($1, $2);
				push @err, "$where: second HELP for $name" if $help{$name}++;
				push @err, "$where: HELP for $name after its samples" if $has_samples{$name};
				(my $unescaped = $doc) =~ s/\\[\\n]//g;
				push @err, "$where: bad escape in HELP text" if $unescaped =~ /\\/;
			}
			elsif ($line =~ /^# TYPE ($NAME_RE) (counter|gauge|histogram|summary|untyped)$/)
			{
				my ($name, $t) = ($1, $2);
				push @err, "$where: second TYPE for $name" if exists $type{$name};
				push @err, "$where: TYPE for $name after its samples" if $has_samples{$name};
				push @err, "$where: counter $name does not end in _total" if $t eq 'counter' && $name !~ /_total$/;
				$type{$name} = $t;
			}
			else
			{
				push @err, "$where: a comment that is neither HELP nor TYPE";
			}
			next;
		}

		# a sample: name, optional labels, value, optional timestamp
		my $rest = $line;
		unless ($rest =~ s/^($NAME_RE)//)
		{
			push @err, "$where: no metric name";
			next;
		}
		my $name = $1;
		my %labels;
		my $ok = 1;
		if ($rest =~ s/^\{//)
		{
			until ($rest =~ s/^\}//)
			{
				unless ($rest =~ s/^($LABEL_RE)="//)
				{
					push @err, "$where: bad label name or missing =\"";
					$ok = 0;
					last;
				}
				my $lname = $1;
				push @err, "$where: reserved label name $lname" if $lname =~ /^__/;
				my $v = '';
				my $closed = 0;
				while (length $rest)
				{
					my $c = substr($rest, 0, 1, '');
					if ($c eq '\\')
					{
						my $e = substr($rest, 0, 1, '');
						if ($e eq '\\') { $v .= '\\' }
						elsif ($e eq '"') { $v .= '"' }
						elsif ($e eq 'n') { $v .= "\n" }
						else
						{
							push @err, "$where: bad escape \\$e in label $lname";
							$ok = 0;
							last;
						}
					}
					elsif ($c eq '"') { $closed = 1; last; }
					else { $v .= $c; }
				}
				unless ($ok && $closed)
				{
					push @err, "$where: unterminated value of label $lname" if $ok;
					$ok = 0;
					last;
				}
				push @err, "$where: label $lname twice" if exists $labels{$lname};
				$labels{$lname} = $v;
				next if $rest =~ s/^,(?=[a-zA-Z_])//;    # another label follows
				unless ($rest =~ /^\}/)
				{
					push @err, "$where: expected , or } after label $lname";
					$ok = 0;
					last;
				}
			}
		}
		next unless $ok;
		unless ($rest =~ /^ ($VALUE_RE)(?: (-?[0-9]+))?$/)
		{
			push @err, "$where: expected ' value [timestamp]' after the name and labels, got [$rest]";
			next;
		}
		my $value = $1;

		# the metric family: the name itself, or for histograms and summaries the name without its suffix
		my $family = $name;
		unless (exists $type{$name})
		{
			for my $suffix (qw(_bucket _sum _count))
			{
				(my $base = $name) =~ s/\Q$suffix\E$// or next;
				if (exists $type{$base} && ($type{$base} eq 'histogram' || ($type{$base} eq 'summary' && $suffix ne '_bucket')))
				{
					$family = $base;
					last;
				}
			}
		}
		push @err, "$where: no TYPE declared for $name before its first sample" unless exists $type{$family};
		if (!defined $current || $current ne $family)
		{
			push @err, "$where: samples of $family are not contiguous" if $family_done{$family};
			$family_done{$current} = 1 if defined $current;
			$current = $family;
		}
		$has_samples{$family} = 1;
		my $key = $name . '{' . join(',', map { "$_=$labels{$_}" } sort keys %labels) . '}';
		push @err, "$where: duplicate series $key" if exists $series{$key};
		$series{$key} = $value;
	}
	return (\@err, \%series, \%type);
}

# a self-check of the parser on bad input: each must be refused
{
	my @bad = (
		"# TYPE m gauge\nm 1",                                  # no final newline
		"m 1\n",                                                # no TYPE
		"# TYPE m gauge\nm{a=\"x\\q\"} 1\n",                    # bad escape
		"# TYPE m gauge\nm{a=\"x\"y\"} 1\n",                    # unescaped quote
		"# TYPE m gauge\nm{a=\"x\"} 1\nm{a=\"x\"} 2\n",          # duplicate label set
		"# TYPE m gauge\n# TYPE n gauge\nm 1\nn 1\nm{a=\"1\"} 1\n", # not contiguous
		"# TYPE m counter\nm 1\n",                              # counter without _total
		"# TYPE m gauge\n# TYPE m gauge\nm 1\n",                # TYPE twice
		"# HELP m x\n# HELP m y\n# TYPE m gauge\nm 1\n",        # HELP twice
		"# TYPE m gauge\nm 1\n# TYPE m gauge\n",                # TYPE after samples
		"# TYPE m gauge\nm 1.2.3\n",                            # bad number
		"# TYPE m gauge\nm{1a=\"x\"} 1\n",                      # bad label name
		"# TYPE 1m gauge\n",                                    # bad metric name
		"# TYPE m gauge\n\nm 1\n",                              # empty line
		"# a comment\n",                                        # other comment
		"# TYPE m gauge\nm{a=\"x\",} 1\n",                      # trailing comma
		"# TYPE m gauge\nm  1\n",                               # two spaces
		"# HELP m a \\ b\n# TYPE m gauge\nm 1\n",               # bad escape in HELP
	);
	my @good = ("# HELP m a \\\\ b\\n c\n# TYPE m gauge\nm{a=\"x\\\"y\\\\z\\n\",b=\"\"} -1.5e3\nm 1 1700000000000\n"
		  . "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n# TYPE c_total counter\nc_total NaN\n");
	my $refused = grep { @{ (parse_exposition($_))[0] } > 0 } @bad;
	is($refused, scalar @bad, 'parser self-check: every malformed sample text is refused');
	my ($e) = parse_exposition($good[0]);
	is_deeply($e, [], 'parser self-check: a well-formed text is accepted');
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'metrics', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
});
$node->safe_psql(
	'postgres', q{
CREATE ROLE metrics_monitor LOGIN IN ROLE outbox_monitor;
CREATE ROLE metrics_producer LOGIN IN ROLE outbox_producer;});

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/bad', status => 400, body => 'no' });
my $weird_q = sql_quote($WEIRD);
$node->safe_psql(
	'postgres', "
INSERT INTO outbox.endpoints (name, url, breaker_threshold, breaker_cooldown, enabled) VALUES
  ('plain',  '" . $sink->url('/plain') . "', 5, '30 s', true),
  ($weird_q, '" . $sink->url('/weird') . "', 5, '30 s', true),
  ('bad',    '" . $sink->url('/bad') . "', 5, '30 s', true),
  ('down',   'http://127.0.0.1:" . OdNode::closed_port() . "/down', 1, '1 hour', true),
  ('off',    '" . $sink->url('/off') . "', 5, '30 s', false)");
$node->safe_psql(
	'postgres', qq{
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}', 'plain')) FROM generate_series(1, 5) AS g;
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}', $weird_q)) FROM generate_series(1, 3) AS g;
SELECT outbox.enqueue('order', 'x', 'order.created', '{}', 'bad');
SELECT outbox.enqueue('order', 'y', 'order.created', '{}', 'down');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', g::text, 'order.created', '{}', 'off' FROM generate_series(1, 2) AS g;});

ok( poll_until(
		$node, q{SELECT string_agg(status || '=' || count, ' ' ORDER BY status) FROM outbox.queue_depth},
		'dead=1 done=8 pending=3 processing=0', 15),
	'messages settled: 8 done, 1 dead, 3 pending');
ok(poll_until($node, q{SELECT state FROM outbox.endpoint_health WHERE endpoint = 'down'}, 'open', 10),
	'"down": breaker open');
# stop claiming, so that counters stop moving and no claim holds a
# reservation (a claim in progress counts its reserved places in in_flight)
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox_dispatcher.enabled = off; SELECT pg_reload_conf()');
ok(poll_until($node, q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'paused'}, '2', 10), 'workers paused');
ok(poll_until($node, q{SELECT sum(in_flight) FROM outbox.endpoint_health}, '0', 10), 'no place held or reserved');

# metrics() byte-exact, as $role (undef: the superuser); returns (text, stderr)
sub fetch_metrics
{
	my ($role) = @_;
	my ($stdout, $stderr);
	$node->psql(
		'postgres',
		q{SELECT encode(convert_to(outbox.metrics(), 'UTF8'), 'base64')},
		stdout => \$stdout,
		stderr => \$stderr,
		extra_params => (defined $role ? [ '-U', $role ] : []));
	return (undef, $stderr) if !defined $stdout || $stdout eq '';
	return (decode('UTF-8', decode_base64($stdout)), $stderr);
}

# ------------------------------------------------------------------ format
my ($text) = fetch_metrics(undef);
ok(defined $text && length $text, 'metrics() returns text');
note($text);
my ($errors, $series, $types) = parse_exposition($text);
is_deeply($errors, [], 'metrics(): strict Prometheus text 0.0.4 parse without an error')
  or diag(join("\n", @$errors));
cmp_ok(scalar keys %$series, '>=', 30, scalar(keys %$series) . ' series');

# the label value that needs escaping
like($text, qr/^outbox_endpoint_up\{endpoint="we\\"ird\\\\name"\} 1$/m,
	'endpoint we"ird\\name is written as endpoint="we\\"ird\\\\name"');
ok(exists $series->{"outbox_endpoint_up{endpoint=$WEIRD}"}, '... and parses back to the endpoint name');

# ------------------------------------------------------------------ values agree with the views
sub series_value
{
	my ($name, %labels) = @_;
	my $key = $name . '{' . join(',', map { "$_=$labels{$_}" } sort keys %labels) . '}';
	return $series->{$key};
}

for my $row (split /\n/, $node->safe_psql('postgres', 'SELECT status, count FROM outbox.queue_depth'))
{
	my ($status, $count) = split /\|/, $row;
	is(series_value('outbox_messages', status => $status), $count, "outbox_messages{status=\"$status\"} = $count");
}
{
	my %hist = map { split /\|/ } split /\n/, $node->safe_psql('postgres', 'SELECT attempts, count FROM outbox.attempts_histogram');
	my %got = map { /attempts=(\d+)\}$/ ? ($1 => $series->{$_}) : () }
	  grep { /^outbox_unfinished_messages_by_attempts\{/ } keys %$series;
	is_deeply(\%got, \%hist, 'outbox_unfinished_messages_by_attempts = attempts_histogram ('
		  . join(' ', map { "$_:$hist{$_}" } sort keys %hist) . ')');
}
{
	my ($expired, $lost, $age) = split /\|/, $node->safe_psql('postgres',
		'SELECT expired_leases, coalesce(lost_leases, 0), extract(epoch FROM oldest_pending_age) FROM outbox.health');
	is(series_value('outbox_expired_leases'), $expired, "outbox_expired_leases = health.expired_leases ($expired)");
	is(series_value('outbox_lost_leases_total'), $lost, "outbox_lost_leases_total = health.lost_leases ($lost)");
	my $m_age = series_value('outbox_oldest_pending_age_seconds');
	cmp_ok(abs($m_age - $age), '<', 5, "outbox_oldest_pending_age_seconds ($m_age) = health.oldest_pending_age ($age)");
	cmp_ok($m_age, '>', 0, 'outbox_oldest_pending_age_seconds is positive (pending messages exist)');
}
for my $row (split /\n/, $node->safe_psql('postgres',
		'SELECT worker, (pid IS NOT NULL)::int, delivered, claimed, dead, retried, in_flight FROM outbox.worker_stats ORDER BY worker'))
{
	my ($w, $up, $delivered, $claimed, $dead, $retried, $in_flight) = split /\|/, $row;
	is( join('|',
			map { series_value($_, worker => $w) // 'missing' }
			  qw(outbox_worker_up outbox_worker_delivered_total outbox_worker_claimed_total
			  outbox_worker_dead_total outbox_worker_retried_total outbox_worker_in_flight)),
		"$up|$delivered|$claimed|$dead|$retried|$in_flight",
		"worker $w: up, delivered, claimed, dead, retried, in_flight = worker_stats");
}
is($node->safe_psql('postgres', 'SELECT sum(delivered) FROM outbox.worker_stats'), '8', 'worker_stats: 8 delivered in all');
{
	my @rows = split /\n/, $node->safe_psql('postgres',
		'SELECT endpoint, enabled::int, (state <> \'closed\')::int, in_flight, delivered, failed FROM outbox.endpoint_health');
	is(scalar @rows, 5, 'endpoint_health has the 5 endpoints');
	for my $row (@rows)
	{
		my ($ep, @want) = split /\|/, $row;
		is( join('|',
				map { series_value($_, endpoint => $ep) // 'missing' }
				  qw(outbox_endpoint_up outbox_endpoint_breaker_open outbox_endpoint_in_flight
				  outbox_endpoint_delivered_total outbox_endpoint_failed_total)),
			join('|', @want), "endpoint $ep: up, breaker_open, in_flight, delivered, failed = endpoint_health (@want)");
	}
}
is(series_value('outbox_endpoint_up', endpoint => 'off'), 0, 'disabled endpoint "off": outbox_endpoint_up 0');
is(series_value('outbox_endpoint_breaker_open', endpoint => 'down'), 1, '"down": outbox_endpoint_breaker_open 1');
is(series_value('outbox_endpoint_delivered_total', endpoint => $WEIRD), 3, 'we"ird\\name: 3 delivered');
is(series_value('outbox_endpoint_failed_total', endpoint => 'down'), 1, '"down": 1 failure');
is(scalar(grep { /^outbox_endpoint_breaker_open\{/ && $series->{$_} == 1 } keys %$series), 1,
	'only one endpoint has its breaker open');

# ------------------------------------------------------------------ privileges
{
	my ($mtext, $err) = fetch_metrics('metrics_monitor');
	ok(defined $mtext, 'outbox_monitor can call metrics()') or diag($err);
	my ($merr, $mseries) = parse_exposition($mtext // '');
	is_deeply($merr, [], "outbox_monitor's metrics() parses too");
	is_deeply([ sort keys %$mseries ], [ sort keys %$series ], 'outbox_monitor sees the same series');
	my ($ptext, $perr) = fetch_metrics('metrics_producer');
	ok(!defined $ptext, 'outbox_producer cannot call metrics()');
	like($perr, qr/permission denied for function metrics/, 'outbox_producer: permission denied');
}

$sink->stop;
$node->stop;
done_testing();
