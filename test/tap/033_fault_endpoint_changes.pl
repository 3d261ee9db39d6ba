# Copyright: outbox_dispatcher contributors
#
# 033_fault_endpoint_changes.pl — fault injection, scenario 8 (second half):
# operators change endpoints while their messages are in flight.
#
# A. Endpoint disabled mid-flight.  Endpoint "ep" answers after 1 s;
#    batch_size 4, so each worker holds at most 4 of its 24 messages.  While
#    requests are in flight (and other traffic flows to endpoint "other"),
#    UPDATE outbox.endpoints SET enabled = false:
#      - the messages claimed before the change (in flight) complete and are
#        finalized: done, attempts 1 (at most 2 x batch_size more may have
#        been claimed by a claim that raced the UPDATE; they complete too);
#      - every other message of "ep" stays pending and unclaimed for 3 s:
#        attempts 0, lease_version 0, never seen by the sink;
#      - "other" keeps being delivered meanwhile;
#      - re-enabled, every message of "ep" is delivered (attempts 1);
#      - invariant (OdInvariant), no duplicates.
#
# C. Endpoint renamed mid-flight (UPDATE outbox.endpoints SET name = ...,
#    the foreign key cascades to outbox.messages): the requests in flight
#    complete and are finalized, the rest are claimed under the new name;
#    every message done at its first attempt, invariant, no duplicates.
#
# B. Endpoint DELETE while it still has messages.  Endpoint "doomed" has 5
#    delivered (done) messages and 3 scheduled an hour ahead (pending):
#      - DELETE FROM outbox.endpoints is refused with a foreign-key error
#        naming messages, and nothing changes (fingerprint of both tables);
#      - after outbox.purge('0') removed the done rows it is still refused
#        (the pending rows);
#      - after the pending rows are moved to another endpoint (UPDATE
#        outbox.messages SET endpoint = 'other', available_at = now()), the
#        DELETE works, and the moved messages are delivered by "other";
#      - invariant, no duplicates.
#
# Settings: 2 workers, batch_size 4, poll_interval 100ms, backoff_base 50ms,
# backoff_cap 500ms, lease 5s, endpoint timeouts 3s.
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
sub enqueue
{
	my ($node, $endpoint, $tag, $n, $extra) = @_;
	$extra //= '';
	my $out = $node->safe_psql('postgres', qq{
SELECT string_agg(outbox.enqueue('order', '$tag-' || g, 'order.created',
                                 jsonb_build_object('tag', '$tag', 'n', g), '$endpoint' $extra)::text, ',')
  FROM generate_series(1, $n) AS g});
	return split /,/, $out;
}

sub id_list { return join(',', @_) || 'NULL'; }

sub fingerprint
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM outbox.endpoints) || ' endpoints, '
       || (SELECT count(*) FROM outbox.messages) || ' messages, '
       || md5(coalesce((SELECT string_agg(e::text, '|' ORDER BY name) FROM outbox.endpoints AS e), '')
              || coalesce((SELECT string_agg(m::text, '|' ORDER BY id) FROM outbox.messages AS m), ''))});
}

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fault_endpoints', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.batch_size = 4
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 500ms
outbox_dispatcher.lease = 5s
outbox_dispatcher.max_attempts = 10
});
# These faults exercise retries, not the circuit breaker (040_breaker.pl):
# endpoints created here never open one.
$node->safe_psql('postgres', 'ALTER TABLE outbox.endpoints ALTER COLUMN breaker_threshold SET DEFAULT 0');

my $sink = OdSink->start($node->basedir);
$sink->script({ path => '/ep', delay_ms => 1000, status => 200 });
$node->safe_psql('postgres', 'INSERT INTO outbox.endpoints (name, url, timeout) VALUES '
	  . join(', ', map { "('$_', '" . $sink->url("/$_") . "', interval '3 s')" } qw(ep other doomed)));

# ------------------------------------------------------------------ A: disabled mid-flight
my @ep = enqueue($node, 'ep', 'ep', 24);
my @other;
ok(poll_until($node,
		q{SELECT count(*) >= 4 FROM outbox.messages WHERE endpoint = 'ep' AND status = 'processing'}, 't', 10),
	'A: requests of "ep" are in flight');
ok($sink->wait_requests(2, path => '/ep', timeout => 10), 'A: the sink is answering (slowly) requests of "ep"');

my $out = $node->safe_psql('postgres', q{
BEGIN;
UPDATE outbox.endpoints SET enabled = false WHERE name = 'ep';
SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.messages WHERE endpoint = 'ep' AND status <> 'pending';
COMMIT;});
my @claimed_at_disable = split /,/, $out;
my $t_disable = time();
note('A: claimed when the endpoint was disabled: ' . scalar(@claimed_at_disable) . " (@claimed_at_disable)");
cmp_ok(scalar(@claimed_at_disable), '>=', 4, 'A: messages were in flight when the endpoint was disabled');

# other traffic flows while the in-flight requests of "ep" finish
while (time() < $t_disable + 0.5)
{
	push @other, enqueue($node, 'other', 'other-a' . scalar(@other), 2);
	sleep(0.1);
}
my @claimed = split /,/, $node->safe_psql('postgres',
	q{SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.messages WHERE endpoint = 'ep' AND (status <> 'pending' OR attempts > 0)});
my %claimed = map { $_ => 1 } @claimed;
is(scalar(grep { !$claimed{$_} } @claimed_at_disable), 0,
	'A: everything claimed before the change is still accounted as claimed');
cmp_ok(scalar(@claimed) - scalar(@claimed_at_disable), '<=', 8,
	'A: at most 2 x batch_size claimed by claims racing the UPDATE ('
	  . (scalar(@claimed) - scalar(@claimed_at_disable)) . ')');
my @unclaimed = grep { !$claimed{$_} } @ep;
cmp_ok(scalar(@unclaimed), '>=', 8, 'A: some messages of "ep" were not claimed yet (' . scalar(@unclaimed) . ')');

while (time() < $t_disable + 3.0)
{
	push @other, enqueue($node, 'other', 'other-b' . scalar(@other), 2);
	sleep(0.1);
}
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@claimed) . q{) AND NOT (status = 'done' AND attempts = 1)}),
	'0', 'A: the in-flight messages completed and were finalized: done, attempts 1 (' . scalar(@claimed) . ')');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@unclaimed)
		  . q{) AND NOT (status = 'pending' AND attempts = 0 AND lease_version = 0 AND lease_owner IS NULL)}),
	'0', 'A: the rest stayed pending and unclaimed for 3 s (attempts 0, lease_version 0)');
{
	my $ids = $sink->ids('/ep');
	is(scalar(grep { $ids->{$_} } @unclaimed), 0, 'A: the sink never saw an unclaimed message');
	is(scalar(grep { ($ids->{$_} // 0) != 1 } @claimed), 0, 'A: the sink saw each in-flight message once');
}
ok(poll_until($node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@other) . q{) AND status <> 'done'}, '0', 10),
	'A: endpoint "other" kept delivering meanwhile (' . scalar(@other) . ' messages)');
{
	my ($rc, undef, $err) = $node->psql('postgres', q{SELECT outbox.enqueue('order', 'x', 'order.created', '{}', 'ep')});
	isnt($rc, 0, 'A: enqueue() to the disabled endpoint is refused');
	my ($line) = $err =~ /(ERROR:.*)/;
	like($err, qr/ERROR:\s+endpoint "ep" is disabled/, 'A: ... with an error saying so (' . ($line // $err) . ')');
}

$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET enabled = true WHERE name = 'ep'});
ok(poll_until($node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@ep) . q{) AND status <> 'done'}, '0', 20),
	'A: re-enabled, every message of "ep" is delivered');
ok(wait_settled($node, timeout => 20), 'A: settled');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages WHERE attempts <> 1'),
	'0', 'A: every message done at its first attempt');
is($sink->stats('/ep')->{distinct_ids}, scalar(@ep), 'A: the sink received all ' . scalar(@ep) . ' messages of "ep"');
check_invariant($node, $sink, scenario => 'endpoint disabled mid-flight');

# ------------------------------------------------------------------ C: renamed mid-flight
{
	my @ids = enqueue($node, 'ep', 'ren', 16);
	ok(poll_until($node,
			'SELECT count(*) >= 4 FROM outbox.messages WHERE id IN (' . id_list(@ids) . q{) AND status = 'processing'},
			't', 10),
		'C: requests of "ep" are in flight');
	my $inflight = $node->safe_psql('postgres', q{
BEGIN;
UPDATE outbox.endpoints SET name = 'ep_renamed' WHERE name = 'ep';
SELECT count(*) FROM outbox.messages WHERE endpoint = 'ep_renamed' AND status = 'processing';
COMMIT;});
	note("C: $inflight in flight when the endpoint was renamed");
	is($node->safe_psql('postgres',
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@ids) . q{) AND endpoint <> 'ep_renamed'}),
		'0', 'C: the rename cascaded to every message of the endpoint');
	ok(poll_until($node,
			'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@ids) . q{) AND status <> 'done'}, '0', 20),
		'C: every message delivered across the rename');
	ok(wait_settled($node, timeout => 20), 'C: settled');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages WHERE attempts <> 1'),
		'0', 'C: every message done at its first attempt');
	my $sids = $sink->ids('/ep');
	is(scalar(grep { ($sids->{$_} // 0) == 1 } @ids), scalar(@ids), 'C: the sink received each message once');
	check_invariant($node, $sink, scenario => 'endpoint renamed mid-flight');
}

# ------------------------------------------------------------------ B: DELETE with messages
my @doomed_done = enqueue($node, 'doomed', 'doomed', 5);
ok(wait_settled($node, timeout => 20), 'B: the 5 messages of "doomed" are delivered');
my @doomed_later = enqueue($node, 'doomed', 'later', 3, q{, available_at => now() + interval '1 hour'});
sleep(0.3);    # let the workers look (and leave the future rows alone)
my $before = fingerprint($node);
note("B: before: $before");

my ($rc, $stdout, $stderr) = $node->psql('postgres', q{DELETE FROM outbox.endpoints WHERE name = 'doomed'});
isnt($rc, 0, 'B: DELETE of an endpoint with messages fails');
like($stderr,
	qr/update or delete on table "endpoints" violates foreign key constraint "\w+" on table "messages"/,
	'B: with a foreign-key error naming outbox.messages');
like($stderr, qr/Key \(name\)=\(doomed\) is still referenced from table "messages"/,
	'B: the error detail names the endpoint');
is(fingerprint($node), $before, 'B: nothing changed (both tables identical)');

my $purged = $node->safe_psql('postgres', q{SELECT outbox.purge('0')});
cmp_ok($purged, '>=', 5, "B: purge('0') removed the done rows ($purged)");
($rc, $stdout, $stderr) = $node->psql('postgres', q{DELETE FROM outbox.endpoints WHERE name = 'doomed'});
isnt($rc, 0, 'B: DELETE is still refused while pending messages reference the endpoint');
like($stderr, qr/violates foreign key constraint/, 'B: again a foreign-key error');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.endpoints WHERE name = 'doomed'}), '1',
	'B: the endpoint is still there');

is($node->safe_psql('postgres', q{
WITH moved AS (UPDATE outbox.messages SET endpoint = 'other', available_at = now()
                WHERE endpoint = 'doomed' RETURNING 1)
SELECT count(*) FROM moved}), '3', 'B: the 3 pending messages moved to endpoint "other"');
is($node->safe_psql('postgres', q{WITH d AS (DELETE FROM outbox.endpoints WHERE name = 'doomed' RETURNING 1) SELECT count(*) FROM d}),
	'1', 'B: now the DELETE works');
ok(poll_until($node,
		'SELECT count(*) FROM outbox.messages WHERE id IN (' . id_list(@doomed_later) . q{) AND status = 'done'},
		'3', 10),
	'B: the moved messages are delivered');
{
	my $ids = $sink->ids('/other');
	is(scalar(grep { ($ids->{$_} // 0) == 1 } @doomed_later), 3, 'B: ... to the URL of "other", once each');
}
ok(wait_settled($node, timeout => 20), 'B: settled');
check_invariant($node, $sink, scenario => 'endpoint delete refused, then allowed');

$sink->stop;
$node->stop;
done_testing();
