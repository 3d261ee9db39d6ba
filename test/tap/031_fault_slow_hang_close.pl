# Copyright: outbox_dispatcher contributors
#
# 031_fault_slow_hang_close.pl — fault injection, scenario 5 (slow, hanging
# and half-answering endpoints) and the first half of scenario 8 (a poison
# message that always times out), each while other messages keep flowing.
#
# Sub-scenarios run one after the other, each on a clean table and a reset
# sink, and each ends with the invariant (OdInvariant::check_invariant):
#
#  1. slow: the endpoint answers only after 2.5 s (timeout 1 s) until every
#     slow message has timed out once, then answers at once.  The slow
#     phase answers 202 (after the client gave up, so never seen), the fast
#     phase 200: every message is done after >= 2 attempts, with exactly one
#     200 per id, and as many requests as attempts.
#  2. hang: the first two requests of every id are read and never answered
#     (fail_first 2, fail_mode hang) → timeout → retried → done with
#     attempts 3, requests "none none 200".
#  3. close mid-response: the first two requests of every id get a status
#     line (201), headers announcing a longer body, half the body, then the
#     connection closes (fail_mode close_mid_response) → a transport error,
#     not a success → retried → done with attempts 3, requests "201 201 200".
#  4. reset / close: the first two requests of every id get a
#     reset (RST) or a close (FIN) without an answer, on the same sink as the
#     normal traffic (reused keep-alive connections) → retried → done with
#     exactly one 200; libcurl may re-send a request by itself when a reused
#     connection dies before any response (same X-Outbox-Attempt twice,
#     milliseconds apart): that is the duplicate source there.
#  5. poison: messages whose endpoint never answers, max_attempts 4 → dead
#     after exactly 4 timed-out attempts with last_error "timeout after 4
#     attempts: ..." (the only legitimate dead rows), while normal messages
#     enqueued every 100 ms meanwhile are all done at the first attempt and
#     promptly.
#
# In every sub-scenario, normal messages (another endpoint, answered 200 at
# once) are enqueued every 100 ms and must be done with attempts 1.
#
# Duplicates: a request that timed out or was cut off did reach the sink,
# so its retry is a second request with the same id: check_invariant counts
# those, and they are explained by the scripted fault (dup_reason).  What
# must never happen is a second *successful* delivery: for every id the sink
# answered 200 (in time, completely) exactly once for done messages and never
# for dead ones, and (except in 4., see there) the sink saw exactly as many
# requests as attempts were used (no hidden re-sends).
#
# Settings: 2 workers, poll_interval 100ms, backoff_base 50ms, backoff_cap
# 500ms, lease 5s, endpoint timeouts 1s, max_attempts 4.
#
# Run: see 030_fault_endpoint_down.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OdNode;
use OdSink;
use OdInvariant qw(wait_settled check_invariant poll_until);

# ------------------------------------------------------------------ helpers

# enqueue $n messages for $endpoint tagged $tag; returns their ids
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

# Background traffic: a callback that enqueues $per normal messages at most
# every 100 ms, remembering their ids.
sub traffic
{
	my ($node, $ids, $per) = @_;
	my $next = 0;
	my $i = 0;
	return sub {
		return if time() < $next;
		push @$ids, enqueue($node, 'normal', 'normal' . $i++, $per // 2);
		$next = time() + 0.1;
	};
}

# poll_until with the traffic callback running in between
sub poll_with
{
	my ($node, $tick, $sql, $expected, $timeout) = @_;
	my $deadline = time() + $timeout;
	my $last;
	while (time() < $deadline)
	{
		$tick->();
		$last = $node->safe_psql('postgres', $sql);
		return 1 if $last eq $expected;
		sleep(0.05);
	}
	diag("poll_with timed out: [$sql] returned [$last], expected [$expected]");
	return 0;
}

# id => "status|attempts" of the given messages
sub rows
{
	my ($node, @ids) = @_;
	return { map { split /=/ } split /\n/, $node->safe_psql('postgres',
		q{SELECT id || '=' || status || '|' || attempts FROM outbox.messages WHERE id IN (} . id_list(@ids) . ')') };
}

# Per id: the sink's requests (all paths), in arrival order.
sub requests_by_id
{
	my ($sink) = @_;
	my %by;
	for my $r (@{ $sink->requests })
	{
		my $id = OdSink::header($r, 'Idempotency-Key') // next;
		push @{ $by{$id} }, $r;
	}
	return \%by;
}

# The checks common to every sub-scenario:
#   - every message in @$ids has the expected final status and attempts;
#   - the sink saw exactly `attempts` requests for it, X-Outbox-Attempt 1..n;
#   - successful deliveries (status 200 recorded by the sink: answered in
#     time and complete in these scripts) per id: exactly 1 if done, 0 if dead;
#   - optionally the sequence of recorded statuses.
sub check_messages
{
	my ($node, $sink, $label, $ids, %exp) = @_;
	my $rows = rows($node, @$ids);
	my $by = requests_by_id($sink);
	my (@bad_state, @bad_reqs, @bad_success, @bad_seq);
	for my $id (@$ids)
	{
		my ($status, $attempts) = split /\|/, $rows->{$id} // '?|?';
		my $reqs = $by->{$id} // [];
		push @bad_state, "$id $status/$attempts"
		  unless $status eq $exp{status} && $exp{attempts}->($attempts);
		my @att = map { OdSink::header($_, 'X-Outbox-Attempt') } @$reqs;
		push @bad_reqs, "$id: attempts $attempts, X-Outbox-Attempt [@att]"
		  unless "@att" eq join(' ', 1 .. $attempts);
		my $succ = grep { ($_->{status} // 0) == 200 } @$reqs;
		push @bad_success, "$id: $succ" unless $succ == ($status eq 'done' ? 1 : 0);
		if ($exp{statuses})
		{
			my $st = join(' ', map { $_->{status} // 'none' } @$reqs);
			push @bad_seq, "$id: $st"
			  unless ref $exp{statuses} ? $st =~ $exp{statuses} : $st eq $exp{statuses};
		}
	}
	my $n = scalar @$ids;
	is(scalar @bad_state, 0, "$label: all $n messages $exp{status} with the expected attempts")
	  or diag("@bad_state[0 .. ($#bad_state < 9 ? $#bad_state : 9)]");
	is(scalar @bad_reqs, 0, "$label: the sink saw exactly one request per attempt (X-Outbox-Attempt 1..attempts)")
	  or diag(join("\n", @bad_reqs[0 .. ($#bad_reqs < 9 ? $#bad_reqs : 9)]));
	is(scalar @bad_success, 0, "$label: successful (2xx, in time) deliveries per id: 1 if done, 0 if dead")
	  or diag("@bad_success[0 .. ($#bad_success < 9 ? $#bad_success : 9)]");
	if ($exp{statuses})
	{
		is(scalar @bad_seq, 0, "$label: sink answers per id: $exp{statuses}")
		  or diag(join("\n", @bad_seq[0 .. ($#bad_seq < 9 ? $#bad_seq : 9)]));
	}
	return;
}

# Start a sub-scenario: clean table, clean sink.
sub fresh
{
	my ($node, $sink) = @_;
	ok(wait_settled($node, timeout => 30), 'previous sub-scenario settled');
	$node->safe_psql('postgres', 'DELETE FROM outbox.messages');
	$sink->reset;
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_slow', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.max_attempts = 4
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $sink = OdSink->start($node->basedir);
$node->safe_psql('postgres', 'INSERT INTO outbox.endpoints (name, url, timeout) VALUES '
	  . join(', ', map { "('$_', '" . $sink->url("/$_") . "', interval '1 s')" } qw(normal slow hang cmr reset close poison)));

my $dup_timeout = 'timeouts: the sink received the request but did not answer within the endpoint timeout, '
  . 'so the dispatcher retried (at-least-once); successful deliveries per id are asserted separately';

# ------------------------------------------------------------------ 1. slow
{
	my @normal;
	my $tick = traffic($node, \@normal);
	$sink->script({ path => '/slow', delay_ms => 2500, status => 202 });
	my @slow = enqueue($node, 'slow', 'slow', 10);
	ok( poll_with(
			$node, $tick,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@slow)
			  . q{) AND NOT (attempts >= 1 AND coalesce(last_error, '') ~ '^timeout')},
			'0', 15),
		'slow: every slow message timed out once (last_error "timeout ...")');
	note('slow: last_error: '
		  . $node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $slow[0]"));
	$sink->script({ path => '/slow', status => 200 });
	ok(poll_with($node, $tick,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@slow) . q{) AND status <> 'done'},
			'0', 15),
		'slow: once the endpoint is fast again every slow message is done');
	$tick->() for 1 .. 3;
	ok(wait_settled($node, timeout => 20), 'slow: settled');
	# one or two slow attempts normally (three if the machine is very busy; a
	# fourth would be the last allowed attempt and make the message dead)
	check_messages($node, $sink, 'slow', \@slow, status => 'done', attempts => sub { $_[0] >= 2 && $_[0] <= 4 },
		statuses => qr/^(202 ){1,3}200$/);
	check_messages($node, $sink, 'slow/normal traffic', \@normal, status => 'done', attempts => sub { $_[0] == 1 },
		statuses => '200');
	check_invariant($node, $sink, scenario => 'slow endpoint', dup_reason => $dup_timeout);
}

# ------------------------------------------------------------------ 2. hang
fresh($node, $sink);
{
	my @normal;
	my $tick = traffic($node, \@normal);
	$sink->script({ path => '/hang', fail_first => 2, fail_mode => 'hang', status => 200 });
	my $t0 = time();
	my @hang = enqueue($node, 'hang', 'hang', 10);
	ok( poll_with(
			$node, $tick,
			'SELECT count(*) > 0 FROM outbox.messages WHERE id IN (' . id_list(@hang)
			  . q{) AND status = 'pending' AND last_error ~ '^timeout'},
			't', 10),
		'hang: messages go back to pending after a timeout, last_error "timeout ..."');
	ok(poll_with($node, $tick,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@hang) . q{) AND status <> 'done'},
			'0', 15),
		'hang: every message done after the hangs');
	cmp_ok(time() - $t0, '>=', 1.9, 'hang: two 1 s timeouts were waited out');
	ok(wait_settled($node, timeout => 20), 'hang: settled');
	check_messages($node, $sink, 'hang', \@hang, status => 'done', attempts => sub { $_[0] == 3 },
		statuses => 'none none 200');
	check_messages($node, $sink, 'hang/normal traffic', \@normal, status => 'done', attempts => sub { $_[0] == 1 },
		statuses => '200');
	check_invariant($node, $sink, scenario => 'hanging endpoint', dup_reason => $dup_timeout);
}

# ------------------------------------------------------------------ 3. close mid-response
fresh($node, $sink);
{
	my @normal;
	my $tick = traffic($node, \@normal);
	$sink->script({ path => '/cmr', fail_first => 2, fail_mode => 'close_mid_response', fail_status => 201,
			status => 200 });
	my @cmr = enqueue($node, 'cmr', 'cmr', 10);
	my $seen_err = '';
	ok( poll_with(
			$node,
			sub {
				$tick->();
				$seen_err ||= $node->safe_psql('postgres',
					'SELECT coalesce(min(last_error), \'\') FROM outbox.messages WHERE id IN (' . id_list(@cmr)
					  . q{) AND status = 'pending' AND attempts >= 1});
			},
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@cmr) . q{) AND status <> 'done'},
			'0', 15),
		'close mid-response: every message done');
	note("close mid-response: last_error while retrying: $seen_err");
	like($seen_err, qr/^(transport error \(curl 18\)|connection error|empty reply)/,
		'close mid-response: a cut-off 201 is recorded as a transport error, not a success')
	  if length $seen_err;
	ok(wait_settled($node, timeout => 20), 'close mid-response: settled');
	is($node->safe_psql('postgres',
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@cmr) . ') AND last_http_status <> 200'),
		'0', 'close mid-response: last_http_status 200 (of the complete answer)');
	check_messages($node, $sink, 'close mid-response', \@cmr, status => 'done', attempts => sub { $_[0] == 3 },
		statuses => '201 201 200');
	check_messages($node, $sink, 'close mid-response/normal traffic', \@normal, status => 'done',
		attempts => sub { $_[0] == 1 }, statuses => '200');
	check_invariant($node, $sink, scenario => 'close mid-response',
		dup_reason => 'responses cut off mid-body: the sink received the request but the answer was incomplete, '
		  . 'so the dispatcher retried; successful deliveries per id are asserted separately');
}

# ------------------------------------------------------------------ 4. reset / close on reused connections
# The first two requests of every id are read and then the connection is
# reset (RST) or closed (FIN) without an answer, on the same sink as the
# normal traffic, so the workers' keep-alive connections are reused.  When a
# reused connection dies before any response byte, libcurl re-sends the
# request once by itself on a fresh connection: the sink then sees the same
# X-Outbox-Attempt twice within milliseconds, and the re-send counts towards
# fail_first.  Those re-sends are the duplicate source here (dup_reason).
fresh($node, $sink);
{
	my @normal;
	my $tick = traffic($node, \@normal);
	$sink->script([
		{ path => '/reset', fail_first => 2, fail_mode => 'reset', status => 200 },
		{ path => '/close', fail_first => 2, fail_mode => 'close', status => 200 } ]);
	$tick->() for 1 .. 3;
	my @ids = (enqueue($node, 'reset', 'reset', 10), enqueue($node, 'close', 'close', 10));
	ok(poll_with($node, $tick,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@ids) . q{) AND status <> 'done'},
			'0', 15),
		'reset/close: every message done');
	$tick->() for 1 .. 3;
	ok(wait_settled($node, timeout => 20), 'reset/close: settled');
	my $rows = rows($node, @ids);
	my $by = requests_by_id($sink);
	my (@bad, $resends, $retried);
	$resends = 0;
	$retried = 0;
	for my $id (@ids)
	{
		my ($status, $attempts) = split /\|/, $rows->{$id};
		my @reqs = @{ $by->{$id} // [] };
		my @att = map { OdSink::header($_, 'X-Outbox-Attempt') } @reqs;
		my $succ = grep { ($_->{status} // 0) == 200 } @reqs;
		push @bad, "$id: $status, attempts $attempts, X-Outbox-Attempt [@att], $succ x 200"
		  unless $status eq 'done'
		  && $succ == 1
		  && ($reqs[-1]{status} // 0) == 200
		  && $att[-1] == $attempts
		  && join(' ', do { my %u; grep { !$u{$_}++ } @att }) eq join(' ', 1 .. $attempts);
		$retried++ if $attempts > 1;
		for my $i (1 .. $#reqs)
		{
			next unless $att[$i] == $att[ $i - 1 ];
			$resends++;
			my $gap = $reqs[$i]{t} - $reqs[ $i - 1 ]{t};
			push @bad, sprintf('%s: attempt %d sent twice %.3f s apart (more than a libcurl re-send)', $id, $att[$i], $gap)
			  if $gap > 0.5;
		}
	}
	is(scalar @bad, 0, 'reset/close: done, one 200 each, attempts = last X-Outbox-Attempt, '
		  . 'repeated attempt numbers only as immediate libcurl re-sends')
	  or diag(join("\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]));
	cmp_ok($retried, '>', 0, "reset/close: failures reached the dispatcher and were retried ($retried messages)");
	note("reset/close: $resends libcurl re-sends on reused connections (same X-Outbox-Attempt twice)");
	check_messages($node, $sink, 'reset/close/normal traffic', \@normal, status => 'done',
		attempts => sub { $_[0] == 1 }, statuses => '200');
	check_invariant($node, $sink, scenario => 'reset / close on reused connections',
		dup_reason => 'libcurl re-sends a request by itself when a reused keep-alive connection dies before '
		  . 'any response byte (same X-Outbox-Attempt within milliseconds), plus the retries of the '
		  . 'unanswered attempts; exactly one 200 per id asserted above');
}

# ------------------------------------------------------------------ 5. poison
fresh($node, $sink);
{
	my @normal;
	my $tick = traffic($node, \@normal, 3);
	$sink->script({ path => '/poison', mode => 'hang' });
	my $t0 = time();
	my @poison = enqueue($node, 'poison', 'poison', 3);
	ok( poll_with(
			$node, $tick,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@poison) . q{) AND status = 'dead'},
			'3', 20),
		'poison: the messages whose endpoint never answers are dead');
	my $poison_secs = time() - $t0;
	note(sprintf('poison: dead after %.1f s', $poison_secs));
	cmp_ok($poison_secs, '>=', 3.5, 'poison: four 1 s timeouts were waited out');
	$tick->() for 1 .. 3;
	ok(wait_settled($node, timeout => 20), 'poison: settled');
	my $errs = $node->safe_psql('postgres',
		'SELECT string_agg(DISTINCT regexp_replace(last_error, \':.*\', \'\'), \'; \') FROM outbox.messages WHERE id IN ('
		  . id_list(@poison) . ')');
	is($errs, 'timeout after 4 attempts', 'poison: last_error "timeout after 4 attempts: ..."');
	note('poison: last_error: '
		  . $node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $poison[0]"));
	check_messages($node, $sink, 'poison', \@poison, status => 'dead', attempts => sub { $_[0] == 4 },
		statuses => 'none none none none');
	cmp_ok(scalar(@normal), '>=', 20, 'poison: normal traffic flowed meanwhile (' . scalar(@normal) . ' messages)');
	check_messages($node, $sink, 'poison/normal traffic', \@normal, status => 'done', attempts => sub { $_[0] == 1 },
		statuses => '200');
	my $lat = $node->safe_psql('postgres',
		'SELECT round(extract(epoch FROM max(done_at - created_at))::numeric, 3) FROM outbox.messages WHERE id IN ('
		  . id_list(@normal) . ')');
	cmp_ok($lat, '<', 1.0, "poison: normal messages were not held up by the poison (max latency $lat s < timeout)");
	my %poison = map { $_ => 1 } @poison;
	check_invariant(
		$node, $sink,
		scenario => 'poison message',
		dead_ok => sub { my ($r) = @_; $poison{ $r->{id} } && $r->{last_error} =~ /^timeout after 4 attempts/ },
		dup_reason => 'timeouts: every attempt of a poison message reached the sink and was never answered');
}

$sink->stop;
$node->stop;
done_testing();
