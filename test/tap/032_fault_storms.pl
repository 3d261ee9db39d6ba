# Copyright: outbox_dispatcher contributors
#
# 032_fault_storms.pl — fault injection, scenario 6: 429 and 503 storms, with
# and without Retry-After, while normal traffic flows.
#
# Five endpoints (sink paths) answer the first N requests of every id with
# a retryable status, then 200; messages for all of them (and for a sixth,
# healthy endpoint) are enqueued in waves over one second:
#   r429ra   429 + Retry-After: 1            x3, then 200
#   r503ra   503 + Retry-After: 2 (> backoff_cap)  x3, then 200
#   r503     503 without Retry-After         x3, then 200
#   r429     429 without Retry-After         x3, then 200
#   rdate    503 + Retry-After: <HTTP-date 3-4 s ahead>  x2, then 200
#   ok       200
# Proves:
#   - while the storm lasts, messages are pending with last_http_status
#     429/503 and last_error "HTTP 429 ..."/"HTTP 503 ...";
#   - every message ends done, none dead, with attempts = N + 1 (each 429
#     and 503 uses an attempt, outcome table), and the sink saw exactly N + 1
#     requests per id, X-Outbox-Attempt 1..N+1, answers "429 429 429 200" etc.
#     — no request beyond the scripted failures;
#   - successful deliveries per id (requests the sink answered 2xx): exactly
#     1 for every message;
#   - Retry-After is honoured, by sink arrival times: after a response with
#     Retry-After: S the next request of that id comes no sooner than S
#     seconds later (also when S exceeds backoff_cap), and no sooner than an
#     HTTP-date Retry-After; without Retry-After the retries follow the
#     (short) backoff;
#   - worker_stats: delivered = messages, retried = attempts used before the
#     last one;
#   - invariant (OdInvariant): the failed attempts are requests that the
#     sink answered with a failure, so the sink's per-id request count
#     exceeds 1; they are scripted, not duplicates of a success (see above).
#
# Settings: 2 workers, poll_interval 100ms, backoff_base 50ms, backoff_cap
# 1s, lease 5s, endpoint timeouts 2s, max_attempts 10.
#
# Run: see 030_fault_endpoint_down.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use POSIX qw(strftime ceil);

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until);

# ------------------------------------------------------------------ helpers
sub enqueue
{
	my ($node, $endpoint, $tag, $n) = @_;
	my $out = $node->safe_psql('postgres', qq{
SELECT string_agg(outbox.enqueue('order', '$tag-' || g, 'order.created',
                                 jsonb_build_object('tag', '$tag', 'n', g), '$endpoint')::text, ',')
  FROM generate_series(1, $n) AS g});
	return split /,/, $out;
}

sub id_list { return join(',', @_) || 'NULL'; }

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_storms', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 1000ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.max_attempts = 10
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $sink = OdSink->start($node->basedir);

# an HTTP-date 3-4 s ahead (whole seconds)
my $date_epoch = ceil(time()) + 4;
my $http_date = strftime('%a, %d %b %Y %H:%M:%S GMT', gmtime($date_epoch));

# name => [script, failures per id, Retry-After seconds (undef: none), failing status]
my %case = (
	r429ra => [ { fail_first => 3, fail_status => 429, retry_after => '1' }, 3, 1, 429 ],
	r503ra => [ { fail_first => 3, fail_status => 503, retry_after => '2' }, 3, 2, 503 ],
	r503 => [ { fail_first => 3, fail_status => 503 }, 3, undef, 503 ],
	r429 => [ { fail_first => 3, fail_status => 429 }, 3, undef, 429 ],
	rdate => [ { fail_first => 2, fail_status => 503, retry_after => $http_date }, 2, 'date', 503 ],
	ok => [ {}, 0, undef, 200 ],
);
for my $name (sort keys %case)
{
	$sink->script({ %{ $case{$name}[0] }, path => "/$name", status => 200 });
}
$node->safe_psql('postgres', 'INSERT INTO outbox.endpoints (name, url, timeout) VALUES '
	  . join(', ', map { "('$_', '" . $sink->url("/$_") . "', interval '2 s')" } sort keys %case));
note("rdate: Retry-After: $http_date");

# ------------------------------------------------------------------ the storm
my %ids;
my $saw = '';
for my $wave (1 .. 5)
{
	for my $name (sort keys %case)
	{
		push @{ $ids{$name} }, enqueue($node, $name, "$name-w$wave", 5);
	}
	sleep(0.2);
}
# intermediate state: pending after a 429 / 503, attempt used
ok( poll_until(
		$node,
		q{SELECT count(*) > 0 FROM outbox.messages
		   WHERE status = 'pending' AND attempts >= 1 AND last_http_status = 429 AND last_error ~ '^HTTP 429'},
		't', 10),
	'storm: messages pending with last_http_status 429, last_error "HTTP 429 ..."');
ok( poll_until(
		$node,
		q{SELECT count(*) > 0 FROM outbox.messages
		   WHERE status = 'pending' AND attempts >= 1 AND last_http_status = 503 AND last_error ~ '^HTTP 503'},
		't', 10),
	'storm: messages pending with last_http_status 503, last_error "HTTP 503 ..."');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'dead'}),
	'0', 'storm: nothing dead during the storm');
ok(wait_settled($node, timeout => 40), 'storm: every message settled');

# ------------------------------------------------------------------ results
my $total = 0;
$total += scalar @{ $ids{$_} } for keys %ids;
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}),
	$total, "all $total messages done, none dead");

my %by;
for my $r (@{ $sink->requests })
{
	my $id = OdSink::header($r, 'Idempotency-Key') // next;
	push @{ $by{$id} }, $r;
}
my %att = map { split /\|/ } split /\n/,
  $node->safe_psql('postgres', 'SELECT id, attempts FROM outbox.messages');

for my $name (sort keys %case)
{
	my (undef, $fails, $ra, $fst) = @{ $case{$name} };
	my $want_seq = join(' ', ($fst) x $fails, 200);
	my (@bad_att, @bad_seq, @bad_hdr, @bad_succ, @early, @gaps);
	for my $id (@{ $ids{$name} })
	{
		my $reqs = $by{$id} // [];
		push @bad_att, "$id: $att{$id}" unless $att{$id} == $fails + 1;
		my $seq = join(' ', map { $_->{status} // 'none' } @$reqs);
		push @bad_seq, "$id: $seq" unless $seq eq $want_seq;
		my $hdr = join(' ', map { OdSink::header($_, 'X-Outbox-Attempt') } @$reqs);
		push @bad_hdr, "$id: $hdr" unless $hdr eq join(' ', 1 .. $fails + 1);
		my $succ = grep { ($_->{status} // 0) >= 200 && $_->{status} < 300 } @$reqs;
		push @bad_succ, "$id: $succ" unless $succ == 1;
		for my $i (1 .. $#$reqs)
		{
			my $gap = $reqs->[$i]{t} - $reqs->[ $i - 1 ]{t};
			push @gaps, $gap;
			next unless defined $ra;
			if ($ra eq 'date')
			{
				# not before the HTTP-date (once it is in the past it means "now")
				push @early, sprintf('%s: attempt %d at %.3f < %d', $id, $i + 1, $reqs->[$i]{t}, $date_epoch)
				  if $reqs->[$i]{t} < $date_epoch - 0.01;
			}
			elsif ($gap < $ra - 0.01)
			{
				push @early, sprintf('%s: attempt %d only %.3f s after the %s', $id, $i + 1, $gap,
					$reqs->[ $i - 1 ]{status});
			}
		}
	}
	my $n = scalar @{ $ids{$name} };
	is(scalar @bad_att, 0, "$name: all $n messages done with attempts " . ($fails + 1))
	  or diag("@bad_att[0 .. ($#bad_att < 9 ? $#bad_att : 9)]");
	is(scalar @bad_seq, 0, "$name: sink answers per id: $want_seq (no request beyond the scripted failures)")
	  or diag(join("\n", @bad_seq[0 .. ($#bad_seq < 9 ? $#bad_seq : 9)]));
	is(scalar @bad_hdr, 0, "$name: X-Outbox-Attempt 1.." . ($fails + 1))
	  or diag(join("\n", @bad_hdr[0 .. ($#bad_hdr < 9 ? $#bad_hdr : 9)]));
	is(scalar @bad_succ, 0, "$name: exactly one successful (2xx) delivery per id")
	  or diag("@bad_succ[0 .. ($#bad_succ < 9 ? $#bad_succ : 9)]");
	next unless @gaps;
	my @sorted = sort { $a <=> $b } @gaps;
	my $desc = sprintf('gaps between attempts: min %.3f s, median %.3f s, max %.3f s',
		$sorted[0], $sorted[ $#sorted / 2 ], $sorted[-1]);
	if (defined $ra)
	{
		is(scalar @early, 0,
			"$name: no retry sooner than Retry-After ("
			  . ($ra eq 'date' ? $http_date : "$ra s") . "); $desc")
		  or diag(join("\n", @early[0 .. ($#early < 9 ? $#early : 9)]));
	}
	else
	{
		# full jitter after attempts 1..3 is at most 100, 200, 400 ms
		cmp_ok($sorted[-1], '<', 1.5, "$name: without Retry-After the retries follow the short backoff; $desc");
	}
}

my ($delivered, $retried, $dead) = split /\|/,
  $node->safe_psql('postgres', 'SELECT sum(delivered), sum(retried), sum(dead) FROM outbox.worker_stats');
is($delivered, $total, "worker_stats: $total delivered");
my $used = $node->safe_psql('postgres', 'SELECT sum(attempts - 1) FROM outbox.messages');
is($retried, $used, "worker_stats: $used retries (every 429/503 counted as a used attempt)");
is($dead, 0, 'worker_stats: nothing dead');

check_invariant($node, $sink, scenario => '429/503 storms',
	dup_reason => 'scripted failures: every id is answered 429/503 N times before its 200; '
	  . 'those are failed attempts, not duplicates of a success (exactly one 2xx per id asserted above)');

$sink->stop;
$node->stop;
done_testing();
