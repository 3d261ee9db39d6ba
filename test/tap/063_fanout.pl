# Copyright: outbox_dispatcher contributors
#
# 063_fanout.pl — fan-out subscriptions, the attempt log and recovery by
# time window (0.3.0: src/fanout.cpp, src/attempt_log.cpp,
# src/transitions.cpp od_recover_window), end to end through 4 background
# workers and a real HTTP sink on loopback.
#
# Proves:
#   - fan-out: endpoints "orders" ({order.*} and {*.paid}), "billing"
#     ({order.paid,invoice.*} with filter {"currency":"EUR"},
#     {invoice.*} with filter {"vip":true}, {refund.*.eu}), "audit" ({*})
#     and "muted" (two disabled subscriptions).  200 events, 170 through
#     outbox.publish() (20 of them in one transaction, some with headers)
#     and 30 through the documented INSERT ... SELECT FROM
#     outbox.subscribers(); which endpoints each event must reach is
#     computed in Perl from the subscriptions (the pattern and @> rules of
#     the spec).  For every event the rows created are exactly the expected
#     endpoints, one each, in endpoint-name order with ascending ids, and
#     publish() returned exactly those ids; subscribers() lists the same
#     names in name order.  Each sink path received exactly the ids of its
#     rows, once each (sets and counts equal); every request's ce-type,
#     ce-subject (aggregate), ce-id, body and extra headers are those of the
#     row whose id is its Idempotency-Key.  An endpoint with two matching
#     subscriptions gets one delivery; "muted" gets no row and no request.
#     With no enabled subscription matching, publish() returns '{}' and
#     writes nothing.  endpoint_health.subscriptions counts enabled ones;
#   - a dead subscriber ("down", a closed port) does not delay the others:
#     55 ship.* events for "down" and "audit" (25 committed one every
#     200 ms); every delivery to "audit" arrives within 10 s of its commit
#     (p50/max reported), while all of "down"'s deliveries are still
#     pending, with attempts used and none done;
#   - per-endpoint ordering under 4 workers: ordered events of aggregates
#     A..D published to "o1", "o2" (and "audit").  "o1" answers 503
#     (Retry-After: 1) while only A1 is due there: "o2" and "audit" deliver
#     all of A meanwhile, "o1" sends nothing of A but A1.  Then "o1" answers
#     200 and more of A, B, C, D are published: on every endpoint, per
#     aggregate, the first arrivals are in ascending id order, each after the
#     successful request of the one before, and all arrive;
#   - recovery by window ("rec", answering 400 → dead): two windows of dead
#     messages; recover(rec, t0, t1) returns the first window's count, those
#     rows become pending (attempts 0, last_error 'recovered by an
#     operator; last: HTTP 400…') and are delivered (X-Outbox-Attempt 1)
#     once the sink answers 200; the second window stays dead and is not
#     sent again.  An ordered aggregate whose head died: the later messages
#     wait on that endpoint (never sent) while "audit" delivers all of them,
#     and go out after the recovered head, in id order; lease_version + 1.
#     replay_window(rec, since, until) on the done messages re-delivers
#     exactly those delivered in the window (attempt 1 again, in order for
#     the ordered aggregate), not the earlier ones.  Argument errors;
#   - the attempt log: for every endpoint the sink serves, the multiset of
#     (Idempotency-Key, X-Outbox-Attempt, status answered) of the sink's
#     request log equals the multiset of (message_id, attempt, http_status)
#     of outbox.attempts, with outcome done/retry/dead matching 2xx/503/400
#     and error_class NULL; A1 on "o1" shows retry (503, retry_after '1')
#     rows then done; 400 answers keep the sanitized response body; "down"
#     has one row per attempt charged, all error_class 'connect',
#     http_status NULL; (message_id, lease_version) is unique.  With
#     attempt_log = 'failures' (ALTER SYSTEM + reload) only the non-2xx
#     attempts of new deliveries are logged; with 'off' none;
#   - attempt-log retention: rows inserted 40, 5, 3, 2 and 1 days back in
#     their day's bucket (and a recent row in the 5-day-old bucket): with
#     retention 7d, after a reload the 40-day-old row's partition is emptied
#     and the others stay; with 2d, the 5- and 3-day-old rows go (the
#     5-day-old bucket keeps its recent row: DELETE, not TRUNCATE), the 2-
#     and 1-day-old rows and today's real rows stay. A 32-day-old row in
#     today's (kept) bucket, left by a turn of the ring that was never
#     emptied, is deleted too.
#   - the log never holds deliveries back: with today's partition detached,
#     deliveries are finalized all the same and a WARNING says what was not
#     logged (the insert runs in a subtransaction);
#   - the workers write the log straight into the day's partition: the WAL
#     (pg_walinspect) between two points shows multi-insert records for it
#     and no single-row insert, and the rows' columns are right; with a
#     trigger on outbox.attempts the rows go through the INSERT, which
#     fires it once per row.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use JSON::PP;

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled sql_quote);

my $JSON = JSON::PP->new->utf8->canonical;
my $T0 = time;

# ------------------------------------------------------------------ setup
my $node = OdNode->create(
	'fanout', conf => q{
outbox_dispatcher.workers = 4
outbox_dispatcher.poll_interval = 200ms
outbox_dispatcher.max_attempts = 30
outbox_dispatcher.backoff_base = 20ms
outbox_dispatcher.backoff_cap = 300ms
});
my $sink = OdSink->start($node->basedir);

sub sql { return $node->safe_psql('postgres', $_[0]); }

ok(poll_until($node, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'}, '4', 30),
	'4 dispatcher workers run');

# every subscription created, for the Perl model of the routing
my @SUBS;

sub add_subscription
{
	my ($endpoint, $types, $filter, $enabled) = @_;
	$enabled //= 1;
	push @SUBS, { endpoint => $endpoint, types => $types, filter => $filter, enabled => $enabled };
	sql(sprintf(
		'INSERT INTO outbox.subscriptions (endpoint, event_types, filter, enabled) VALUES (%s, ARRAY[%s]::text[], %s, %s)',
		sql_quote($endpoint), join(', ', map { sql_quote($_) } @$types),
		defined $filter ? sql_quote($JSON->encode($filter)) . '::jsonb' : 'NULL', $enabled ? 'true' : 'false'));
}

# the spec's pattern rule: '*' matches any run of bytes, anything else itself
sub pattern_matches
{
	my ($pattern, $type) = @_;
	my $re = join('.*', map { quotemeta } split(/\*/, $pattern, -1));
	return $type =~ /\A$re\z/s;
}

# jsonb @> for a flat filter of strings and booleans
sub json_eq
{
	my ($a, $b) = @_;
	return 0 unless defined $a && defined $b;
	my ($ab, $bb) = (JSON::PP::is_bool($a), JSON::PP::is_bool($b));
	return ($ab && $bb && !!$a == !!$b) if $ab || $bb;
	return !ref $a && !ref $b && $a eq $b;
}

sub filter_matches
{
	my ($filter, $payload) = @_;
	return 1 unless defined $filter;
	for my $k (keys %$filter)
	{
		return 0 unless exists $payload->{$k} && json_eq($payload->{$k}, $filter->{$k});
	}
	return 1;
}

# endpoint name => number of its enabled subscriptions matching the event
sub matching_subscriptions
{
	my ($type, $payload) = @_;
	my %m;
	for my $s (grep { $_->{enabled} } @SUBS)
	{
		next unless grep { pattern_matches($_, $type) } @{ $s->{types} };
		next unless filter_matches($s->{filter}, $payload);
		$m{ $s->{endpoint} }++;
	}
	return \%m;
}

# Events: { key, agg_type, agg_id, type, payload (hash), ordered, headers, via }.
# Publishes them (via 'publish' or 'insert'), in the given order, each in its
# own transaction unless listed in $tx (arrayref of [first, last] index
# ranges committed together).  Sets ev->{expected} (endpoint names sorted) and
# ev->{returned} (publish()'s ids) / ev->{subscribers}.
sub publish_events
{
	my ($events, $tx) = @_;
	my %tx_first = map { $_->[0] => 1 } @{ $tx // [] };
	my %tx_last = map { $_->[1] => 1 } @{ $tx // [] };
	my @sql;
	for my $i (0 .. $#$events)
	{
		my $ev = $events->[$i];
		$ev->{payload}{ev} = $ev->{key};
		$ev->{expected} = [ sort keys %{ matching_subscriptions($ev->{type}, $ev->{payload}) } ];
		my $p = sql_quote($JSON->encode($ev->{payload})) . '::jsonb';
		push @sql, 'BEGIN;' if $tx_first{$i};
		if (($ev->{via} // 'publish') eq 'publish')
		{
			push @sql, sprintf('SELECT %d, outbox.publish(%s, %s, %s, %s, %s, now(), %s);',
				$i, sql_quote($ev->{agg_type}), sql_quote($ev->{agg_id}), sql_quote($ev->{type}), $p,
				$ev->{ordered} ? 'true' : 'false',
				$ev->{headers} ? sql_quote($JSON->encode($ev->{headers})) . '::jsonb' : 'NULL');
		}
		else
		{
			push @sql, sprintf(
				q{SELECT %d, coalesce((SELECT string_agg(s, ',' ORDER BY o) FROM outbox.subscribers(%s, %s) WITH ORDINALITY AS x(s, o)), '');},
				$i, sql_quote($ev->{type}), $p);
			push @sql, sprintf(
				'INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint, ordered)'
				  . ' SELECT %s, %s, %s, v.p, s, %s FROM (SELECT %s AS p) AS v, outbox.subscribers(%s, v.p) AS s;',
				sql_quote($ev->{agg_type}), sql_quote($ev->{agg_id}), sql_quote($ev->{type}),
				$ev->{ordered} ? 'true' : 'false', $p, sql_quote($ev->{type}));
		}
		push @sql, 'COMMIT;' if $tx_last{$i};
	}
	my $out = sql(join("\n", @sql));
	for my $line (split /\n/, $out)
	{
		my ($i, $v) = split /\|/, $line, 2;
		my $ev = $events->[$i];
		if (($ev->{via} // 'publish') eq 'publish')
		{
			$v =~ s/^\{|\}$//g;
			$ev->{returned} = [ split /,/, $v ];
		}
		else
		{
			$ev->{subscribers} = [ split /,/, $v ];
		}
	}
	return $events;
}

# id => { endpoint, event_type, agg, status, attempts, ev } for the events' rows;
# also sets ev->{rows} (ids ascending) and ev->{row_endpoints}
my %ROW;

sub load_rows
{
	my ($events) = @_;
	my %by_key = map { $_->{key} => $_ } @$events;
	$_->{rows} = [] for @$events;
	$_->{row_endpoints} = [] for @$events;
	my $keys = join(', ', map { sql_quote($_) } sort keys %by_key);
	for my $line (split /\n/, sql(
			"SELECT id, endpoint, event_type, aggregate_type || '/' || aggregate_id, status, attempts, payload->>'ev'
			   FROM outbox.messages WHERE payload->>'ev' IN ($keys) ORDER BY id"))
	{
		my ($id, $ep, $type, $agg, $status, $attempts, $key) = split /\|/, $line;
		my $ev = $by_key{$key};
		$ROW{$id} = { id => $id, endpoint => $ep, event_type => $type, agg => $agg, status => $status,
			attempts => $attempts, ev => $ev };
		push @{ $ev->{rows} }, $id;
		push @{ $ev->{row_endpoints} }, $ep;
	}
}

sub ids_of { my ($events, $ep) = @_; return [ map { my $e = $_; grep { $ROW{$_}{endpoint} eq $ep } @{ $e->{rows} } } @$events ]; }
sub first10 { return join(',', grep { defined } @_[ 0 .. ($#_ < 9 ? $#_ : 9) ]); }
sub in_list { return join(',', @{ $_[0] }) || 'NULL'; }

# Every request on $path for an id of @$ids: headers and body are those of
# the row named by its Idempotency-Key.  Returns the number of bad requests.
sub check_requests
{
	my ($path, $ids, $label) = @_;
	my %want = map { $_ => 1 } @$ids;
	my @bad;
	my $n = 0;
	for my $r (@{ $sink->requests($path) })
	{
		my $key = OdSink::header($r, 'Idempotency-Key') // '';
		next unless $want{$key};
		$n++;
		my $row = $ROW{$key};
		my $body = eval { $JSON->decode(do { my $b = $r->{body}; utf8::encode($b); $b }) } // {};
		my @why;
		push @why, 'endpoint ' . $row->{endpoint} if "/$row->{endpoint}" ne $path;
		push @why, 'ce-type ' . (OdSink::header($r, 'ce-type') // 'none')
		  if (OdSink::header($r, 'ce-type') // '') ne $row->{event_type};
		push @why, 'ce-subject ' . (OdSink::header($r, 'ce-subject') // 'none')
		  if (OdSink::header($r, 'ce-subject') // '') ne $row->{agg};
		push @why, 'ce-id ' . (OdSink::header($r, 'ce-id') // 'none') if (OdSink::header($r, 'ce-id') // '') ne $key;
		push @why, 'body ev ' . ($body->{ev} // 'none') if ($body->{ev} // '') ne $row->{ev}{key};
		for my $h (sort keys %{ $row->{ev}{headers} // {} })
		{
			push @why, "header $h" if (OdSink::header($r, $h) // '') ne $row->{ev}{headers}{$h};
		}
		push @bad, "$key: " . join(', ', @why) if @why;
	}
	is(scalar @bad, 0, "$label: every request to $path carries its row's ce-type, ce-subject, ce-id, body and headers ($n checked)")
	  or diag(join("\n", @bad[ 0 .. ($#bad < 9 ? $#bad : 9) ]));
	return scalar @bad;
}

# The sink's ids on $path (restricted to the ids of rows of @$events) are
# exactly @$ids, each received $times times.
sub check_received
{
	my ($path, $ids, $events, $label, $times) = @_;
	$times //= 1;
	my %ours = map { $_ => 1 } map { @{ $_->{rows} } } @$events;
	my $got = $sink->ids($path) // {};
	my %got = map { $_ => $got->{$_} } grep { $ours{$_} } keys %$got;
	my %want = map { $_ => $times } @$ids;
	is_deeply(\%got, \%want, sprintf('%s: %s received exactly its %d deliveries, %d time(s) each', $label, $path, scalar @$ids, $times))
	  or diag(sprintf('got %d ids (%d requests), want %d; missing: %s; extra: %s', scalar(keys %got),
			eval { my $s = 0; $s += $_ for values %got; $s }, scalar @$ids,
			first10(grep { !$got{$_} } @$ids), first10(grep { !$want{$_} } keys %got)));
}

# ------------------------------------------------------------------ 1. fan-out
for my $ep (qw(orders billing audit muted))
{
	$node->add_endpoint($ep, $sink->url("/$ep"));
}
add_subscription('orders', ['order.*']);
add_subscription('orders', ['*.paid']);
add_subscription('billing', [ 'order.paid', 'invoice.*' ], { currency => 'EUR' });
add_subscription('billing', ['invoice.*'], { vip => JSON::PP::true });
add_subscription('billing', ['refund.*.eu']);
add_subscription('audit', ['*']);
add_subscription('muted', ['*'], undef, 0);
add_subscription('muted', ['order.*'], undef, 0);

is( sql(q{SELECT string_agg(endpoint || '=' || subscriptions, ',' ORDER BY endpoint) FROM outbox.endpoint_health}),
	'audit=1,billing=3,muted=0,orders=2',
	'endpoint_health.subscriptions counts the enabled subscriptions');

my @TYPES = qw(order.created order.paid order.shipped invoice.issued invoice.paid refund.card.eu refund.eu
  refund..eu Order.paid order user.signup);
my @p1;
for my $i (1 .. 200)
{
	my %payload = (n => $i);
	$payload{currency} = $i % 3 == 0 ? 'EUR' : 'USD' if $i % 3 != 2;
	$payload{vip} = JSON::PP::true if $i % 5 == 0;
	$payload{vip} = 'true' if $i % 5 == 1;    # a string: does not contain {"vip": true}
	$payload{vip} = JSON::PP::false if $i % 5 == 2;
	push @p1, {
		key => "p1-$i",
		agg_type => 'ev',
		agg_id => "e$i",
		type => $TYPES[ $i % @TYPES ],
		payload => \%payload,
		via => $i > 170 ? 'insert' : 'publish',
		($i % 10 == 0 && $i <= 170 ? (headers => { 'X-Tenant' => "t$i" }) : ()),
	};
}
publish_events(\@p1, [ [ 40, 59 ] ]);    # events 41..60 in one transaction
my $n_p1 = 0;
$n_p1 += @{ $_->{expected} } for @p1;
my @double = grep { my $m = matching_subscriptions($_->{type}, $_->{payload}); grep { $_ > 1 } values %$m } @p1;
note(sprintf('phase 1: %d events, %d deliveries expected, %d events with an endpoint matched twice', scalar @p1, $n_p1, scalar @double));
cmp_ok(scalar @double, '>=', 10, 'some events match two subscriptions of one endpoint (the check below is not vacuous)');
ok(!(grep { grep { $_ eq 'muted' } @{ $_->{expected} } } @p1), 'the model routes nothing to muted');

ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE payload->>'ev' LIKE 'p1-%' AND status = 'done'}, $n_p1, 60),
	"phase 1: all $n_p1 deliveries done");
load_rows(\@p1);
is(sql(q{SELECT count(*) FROM outbox.messages WHERE payload->>'ev' LIKE 'p1-%'}), $n_p1, "phase 1: $n_p1 rows, no more");
{
	my (@bad_rows, @bad_ret, @bad_subs);
	for my $ev (@p1)
	{
		my $want = join(',', @{ $ev->{expected} });
		push @bad_rows, "$ev->{key} ($ev->{type}): rows for " . join(',', @{ $ev->{row_endpoints} }) . ", want $want"
		  if join(',', @{ $ev->{row_endpoints} }) ne $want;
		if ($ev->{via} eq 'publish')
		{
			push @bad_ret, "$ev->{key}: returned {" . join(',', @{ $ev->{returned} // [] }) . '}, rows ' . join(',', @{ $ev->{rows} })
			  if join(',', @{ $ev->{returned} // [] }) ne join(',', @{ $ev->{rows} });
		}
		else
		{
			push @bad_subs, "$ev->{key}: subscribers() " . join(',', @{ $ev->{subscribers} // [] }) . ", want $want"
			  if join(',', @{ $ev->{subscribers} // [] }) ne $want;
		}
	}
	is(scalar @bad_rows, 0, 'every event has one row per expected endpoint, in endpoint-name order of ascending ids (two matching subscriptions: one row)')
	  or diag(join("\n", @bad_rows[ 0 .. ($#bad_rows < 9 ? $#bad_rows : 9) ]));
	is(scalar @bad_ret, 0, 'publish() returned exactly the ids of the rows it created, ascending')
	  or diag(join("\n", @bad_ret[ 0 .. ($#bad_ret < 9 ? $#bad_ret : 9) ]));
	is(scalar @bad_subs, 0, 'subscribers() lists the expected endpoints in name order')
	  or diag(join("\n", @bad_subs[ 0 .. ($#bad_subs < 9 ? $#bad_subs : 9) ]));
}
for my $ep (qw(orders billing audit))
{
	my $ids = ids_of(\@p1, $ep);
	cmp_ok(scalar @$ids, '>', 0, "phase 1: $ep has deliveries");
	ok($sink->wait_requests(scalar @$ids, path => "/$ep", timeout => 10), "phase 1: /$ep saw its requests");
	check_received("/$ep", $ids, \@p1, 'phase 1');
	check_requests("/$ep", $ids, 'phase 1');
}
{
	my @d = map { my $e = $_; grep { $ROW{$_}{endpoint} ne 'audit' } @{ $e->{rows} } } @double;
	my $ids = $sink->ids;
	is(scalar(grep { ($ids->{$_} // 0) != 1 } @d), 0,
		sprintf('phase 1: the %d deliveries of events matching two subscriptions of one endpoint each arrived once', scalar @d));
}
is(sql(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'muted'}), '0', 'muted: no row (its subscriptions are disabled)');
is($sink->stats->{by_path}{'/muted'} // 0, 0, 'muted: no request');
is($sink->stats->{by_path}{'/audit'}, scalar @p1, 'audit ({*}) got every event once');

# no enabled subscription matches: '{}', nothing written
sql(q{UPDATE outbox.subscriptions SET enabled = false WHERE endpoint = 'audit'});
is(sql(q{SELECT outbox.publish('ev', 'none', 'nothing.matches', '{"ev": "p1-none"}')}), '{}',
	'publish() with no matching enabled subscription returns {}');
is(sql(q{SELECT count(*) FROM outbox.subscribers('nothing.matches', '{}')}), '0', 'subscribers() returns no row then');
is(sql(q{SELECT count(*) FROM outbox.messages WHERE payload->>'ev' = 'p1-none'}), '0', '... and nothing was written');
sql(q{UPDATE outbox.subscriptions SET enabled = true WHERE endpoint = 'audit'});

# ------------------------------------------------------------------ 2. a dead subscriber
$node->add_endpoint('down', 'http://127.0.0.1:' . OdNode::closed_port() . '/down');
add_subscription('down', ['ship.*']);
my @p2;
for my $i (1 .. 30)
{
	push @p2, { key => "p2-$i", agg_type => 'shipment', agg_id => "s$i", type => 'ship.created', payload => { n => $i } };
}
publish_events(\@p2);
for my $i (31 .. 55)
{
	my $ev = { key => "p2-$i", agg_type => 'shipment', agg_id => "s$i", type => 'ship.sent', payload => { n => $i } };
	push @p2, $ev;
	my $t = time;
	publish_events([$ev]);
	my $rest = 0.2 - (time - $t);
	sleep $rest if $rest > 0;
}
is(scalar(grep { join(',', @{ $_->{expected} }) ne 'audit,down' } @p2), 0, 'phase 2: every ship.* event goes to audit and down');
load_rows(\@p2);
my $p2_audit = ids_of(\@p2, 'audit');
my $p2_down = ids_of(\@p2, 'down');
is(scalar @$p2_audit, 55, 'phase 2: 55 deliveries to audit');
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list($p2_audit) . ')', '55', 30),
	'phase 2: all of audit\'s deliveries done');
{
	my %created = map { split /\|/ } split /\n/,
	  sql('SELECT id || \'|\' || extract(epoch FROM created_at) FROM outbox.messages WHERE id IN (' . in_list($p2_audit) . ')');
	my %arrived;
	for my $r (@{ $sink->requests('/audit') })
	{
		my $id = OdSink::header($r, 'Idempotency-Key');
		$arrived{$id} //= $r->{t};
	}
	my @delays = sort { $a <=> $b } map { ($arrived{$_} // 9**9**9) - $created{$_} } @$p2_audit;
	diag(sprintf('dead subscriber: commit-to-arrival at audit: p50 %.3f s, max %.3f s', $delays[ int($#delays / 2) ], $delays[-1]));
	cmp_ok($delays[-1], '<', 10, sprintf('phase 2: every delivery to audit arrived within 10 s of its commit (max %.3f s)', $delays[-1]));
}
check_received('/audit', $p2_audit, \@p2, 'phase 2');
ok(poll_until($node, 'SELECT sum(attempts) > 0 FROM outbox.messages WHERE id IN (' . in_list($p2_down) . ')', 't', 20),
	'phase 2: down\'s deliveries were attempted');
is( sql(q{SELECT count(*) FILTER (WHERE status IN ('pending', 'processing')) || '|' || count(*) FILTER (WHERE status = 'done')
            FROM outbox.messages WHERE id IN (} . in_list($p2_down) . ')'),
	'55|0', 'phase 2: all 55 of down\'s deliveries still pending or retrying, none done');
like(sql(q{SELECT last_error FROM outbox.messages WHERE attempts > 0 AND id IN (} . in_list($p2_down) . ') ORDER BY id LIMIT 1'),
	qr/connect/i, 'phase 2: down fails with a connect error');

# ------------------------------------------------------------------ 3. ordering per endpoint, 4 workers
$node->add_endpoint('o1', $sink->url('/o1'), breaker_threshold => 0);
$node->add_endpoint('o2', $sink->url('/o2'));
add_subscription('o1', ['seq.*']);
add_subscription('o2', ['seq.*']);
$sink->script({ path => '/o1', status => 503, retry_after => '1', body => 'not now' });

my (%p3_by_agg, @p3);
sub seq_event
{
	my ($agg, $k) = @_;
	my $ev = { key => "p3-$agg$k", agg_type => 'acct', agg_id => $agg, type => 'seq.step', payload => { agg => $agg, k => $k },
		ordered => 1 };
	push @{ $p3_by_agg{$agg} }, $ev;
	push @p3, $ev;
	return $ev;
}
my @p3a = map { seq_event('A', $_) } 1 .. 8;
publish_events(\@p3a);
load_rows(\@p3a);
my $a1_o1 = ids_of([ $p3a[0] ], 'o1')->[0];
my $a_rest_o1 = ids_of([ @p3a[ 1 .. 7 ] ], 'o1');
ok($sink->wait_requests(3, path => '/o1', timeout => 20), 'phase 3: o1 answered A1 with 503 three times');
ok( poll_until(
		$node,
		'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN ('
		  . in_list([ @{ ids_of(\@p3a, 'o2') }, @{ ids_of(\@p3a, 'audit') } ]) . ')',
		'16', 20),
	'phase 3: o2 and audit delivered all 8 of A while o1 retries A1');
{
	my @o1 = @{ $sink->requests('/o1') };
	is(scalar(grep { (OdSink::header($_, 'Idempotency-Key') // '') ne $a1_o1 || $_->{status} != 503 } @o1), 0,
		'phase 3: o1 was sent nothing but A1 (all answered 503) meanwhile');
	isnt(sql("SELECT status FROM outbox.messages WHERE id = $a1_o1"), 'done', 'phase 3: A1 on o1 is not done');
	is(sql('SELECT count(*) FROM outbox.messages WHERE status = \'pending\' AND attempts = 0 AND id IN (' . in_list($a_rest_o1) . ')'),
		'7', 'phase 3: A2..A8 wait on o1, never attempted');
}
$sink->script({ path => '/o1', status => 200 });
my @p3b;
for my $k (1 .. 12)
{
	push @p3b, seq_event('A', 8 + $k) if $k <= 6;
	push @p3b, map { seq_event($_, $k) } qw(B C D);
}
publish_events(\@p3b);
load_rows(\@p3);
my $n_p3 = 0;
$n_p3 += @{ $_->{rows} } for @p3;
is($n_p3, 3 * scalar @p3, 'phase 3: every seq event went to audit, o1 and o2');
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE payload->>'ev' LIKE 'p3-%' AND status = 'done'}, $n_p3, 60),
	"phase 3: all $n_p3 deliveries done");

# On $path, for the ids (ascending), with requests of seq > $since only:
# every id arrived, first arrivals in id order, each after the previous id's
# 2xx request.
sub check_order
{
	my ($path, $ids, $label, $since) = @_;
	my %want = map { $_ => 1 } @$ids;
	my (%first, %ok);
	for my $r (@{ $sink->requests($path, since => $since // 0) })
	{
		my $id = OdSink::header($r, 'Idempotency-Key') // '';
		next unless $want{$id};
		$first{$id} //= $r->{seq};
		$ok{$id} //= $r->{seq} if defined $r->{status} && $r->{status} >= 200 && $r->{status} < 300;
	}
	my @missing = grep { !defined $ok{$_} } @$ids;
	my @by_arrival = sort { $first{$a} <=> $first{$b} } grep { defined $first{$_} } @$ids;
	my @early = grep { $first{ $ids->[$_] } < $ok{ $ids->[ $_ - 1 ] } } grep { defined $first{ $ids->[$_] } && defined $ok{ $ids->[ $_ - 1 ] } } 1 .. $#$ids;
	ok(!@missing && join(',', @by_arrival) eq join(',', @$ids) && !@early,
		"$label: on $path all " . scalar(@$ids) . ' arrived, first arrivals in id order, each after the previous one succeeded')
	  or diag("ids: @$ids; by first arrival: @by_arrival; missing: @missing; sent before the previous succeeded: @{$ids}[@early]");
}
for my $agg (qw(A B C D))
{
	for my $ep (qw(o1 o2 audit))
	{
		check_order("/$ep", ids_of($p3_by_agg{$agg}, $ep), "phase 3, aggregate $agg");
	}
}
for my $ep (qw(o1 o2))
{
	check_received("/$ep", ids_of(\@p3, $ep), \@p3, 'phase 3') unless $ep eq 'o1';
	check_requests("/$ep", ids_of(\@p3, $ep), 'phase 3');
}
{
	my $o1 = $sink->ids('/o1');
	my $n503 = $o1->{$a1_o1} - 1;
	cmp_ok($n503, '>=', 3, "phase 3: A1 on o1 was answered 503 $n503 times, then 200");
	is(scalar(grep { ($o1->{$_} // 0) != 1 } grep { $_ != $a1_o1 } @{ ids_of(\@p3, 'o1') }), 0, 'phase 3: every other o1 delivery was sent once');
}
diag('phase 3: workers that made the attempts: '
	  . sql(q{SELECT string_agg(worker || ':' || n, ' ' ORDER BY worker) FROM (SELECT worker, count(*) AS n FROM outbox.attempts
	           WHERE endpoint IN ('o1', 'o2') GROUP BY worker) AS w}));

# ------------------------------------------------------------------ 6. recovery by window
$node->add_endpoint('rec', $sink->url('/rec'), breaker_threshold => 0);
add_subscription('rec', ['rec.*']);
sub rec_events
{
	my ($tag, $n, %o) = @_;
	return [ map { +{ key => "p6-$tag-$_", agg_type => $o{agg_type} // 'rec', agg_id => $o{agg_id} // "$tag$_",
				type => "rec.$tag", payload => { n => $_ }, ordered => $o{ordered} } } 1 .. $n ];
}
sub clock { return sql('SELECT clock_timestamp()'); }
sub rec_ids { my ($evs) = @_; return ids_of($evs, 'rec'); }

# batch 0: delivered before anything dies
my $b0 = rec_events('b0', 10);
publish_events($b0);
load_rows($b0);
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list(rec_ids($b0)) . ')', '10', 30),
	'phase 6: batch 0 delivered');
sleep 0.05;
my $t0 = clock();
sleep 0.05;

# batch 1 (window 1): 15 unordered + an ordered aggregate X1..X4; answered 400
$sink->script({ path => '/rec', status => 400, body => "bad\r\n\tinput   here" });
my $b1 = rec_events('b1', 15);
my $bx = rec_events('x', 4, agg_type => 'ledger', agg_id => 'X', ordered => 1);
publish_events([ @$b1, @$bx ]);
load_rows([ @$b1, @$bx ]);
my ($x1, @x_rest) = @{ rec_ids($bx) };
ok( poll_until(
		$node, 'SELECT count(*) FROM outbox.messages WHERE status = \'dead\' AND id IN (' . in_list([ @{ rec_ids($b1) }, $x1 ]) . ')',
		'16', 30),
	'phase 6: window 1: 15 messages and the head X1 dead (400)');
is(sql('SELECT count(*) FROM outbox.messages WHERE status = \'pending\' AND attempts = 0 AND id IN (' . in_list(\@x_rest) . ')'),
	'3', 'phase 6: X2..X4 wait behind their dead head, never attempted');
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list(ids_of($bx, 'audit')) . ')', '4', 30),
	'phase 6: audit delivered all of X meanwhile (the dead head on rec holds only rec\'s deliveries)');
sleep 0.05;
my $t1 = clock();
sleep 0.05;

# batch 2 (window 2): 10 more die
my $b2 = rec_events('b2', 10);
publish_events($b2);
load_rows($b2);
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'dead\' AND id IN (' . in_list(rec_ids($b2)) . ')', '10', 30),
	'phase 6: window 2: 10 messages dead');
is(sql(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'rec' AND status = 'dead' AND dead_at IS NULL}), '0',
	'phase 6: dead rows have dead_at');

# argument errors
{
	my ($rc, $out, $err) = $node->psql('postgres', "SELECT outbox.recover('rec', '$t1', '$t0')");
	like($err, qr/since must not be later than until/, 'recover: since > until is refused');
	($rc, $out, $err) = $node->psql('postgres', "SELECT outbox.recover('nope', '$t0')");
	like($err, qr/endpoint "nope" does not exist/, 'recover: unknown endpoint is refused');
	($rc, $out, $err) = $node->psql('postgres', "SELECT outbox.replay_window('rec', NULL)");
	like($err, qr/since must not be null/, 'replay_window: null since is refused');
}

$sink->script({ path => '/rec', status => 200 });
my $w1 = [ sort { $a <=> $b } @{ rec_ids($b1) }, $x1 ];
my $seq_before_recover = $sink->stats->{total};
my $lv = sql('SELECT string_agg(id || \':\' || (lease_version + 1), \',\' ORDER BY id) FROM outbox.messages WHERE id IN (' . in_list($w1) . ')');
my $t_rec = clock();
is( sql("BEGIN;
SELECT outbox.recover('rec', '$t0', '$t1');
SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.messages
 WHERE status = 'pending' AND attempts = 0 AND last_error LIKE 'recovered by an operator; last: HTTP 400%' AND endpoint = 'rec';
SELECT string_agg(id || ':' || lease_version, ',' ORDER BY id) FROM outbox.messages WHERE id IN (" . in_list($w1) . ");
COMMIT;"),
	"16\n" . join(',', @$w1) . "\n$lv",
	'phase 6: recover(rec, t0, t1) returns 16 and makes exactly window 1 pending, attempts 0, last_error kept, lease_version + 1');
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list([ @$w1, @x_rest ]) . ')', '19', 30),
	'phase 6: window 1 and X2..X4 delivered');
my $t_rec_done = clock();
is(sql('SELECT count(*) FROM outbox.messages WHERE status = \'dead\' AND id IN (' . in_list(rec_ids($b2)) . ')'), '10',
	'phase 6: window 2 still dead');
{
	my $after = $sink->requests('/rec', since => $seq_before_recover);
	my %n;
	my @bad;
	for my $r (@$after)
	{
		my $id = OdSink::header($r, 'Idempotency-Key');
		$n{$id}++;
		push @bad, $id if OdSink::header($r, 'X-Outbox-Attempt') ne '1' || $r->{status} != 200;
	}
	is_deeply(\%n, { map { $_ => 1 } @$w1, @x_rest }, 'phase 6: after recover the sink saw window 1 and X2..X4 once each, nothing of window 2 or batch 0');
	is(scalar @bad, 0, 'phase 6: each with X-Outbox-Attempt 1, answered 200');
}
check_order('/rec', [ $x1, @x_rest ], 'phase 6, recovered ordered aggregate X', $seq_before_recover);

# replay_window: the done messages delivered in [t_rec, t_rec_done)
my $seq_before_replay = $sink->stats->{total};
is( sql("BEGIN;
SELECT outbox.replay_window('rec', '$t_rec', '$t_rec_done');
SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.messages
 WHERE status = 'pending' AND attempts = 0 AND done_at IS NULL AND endpoint = 'rec';
COMMIT;"),
	"19\n" . join(',', sort { $a <=> $b } @$w1, @x_rest),
	'phase 6: replay_window returns 19 and makes exactly the messages done in the window pending again');
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list([ @$w1, @x_rest ]) . ')', '19', 30),
	'phase 6: replayed messages delivered again');
{
	my $after = $sink->requests('/rec', since => $seq_before_replay);
	my %n;
	my @bad;
	for my $r (@$after)
	{
		my $id = OdSink::header($r, 'Idempotency-Key');
		$n{$id}++;
		push @bad, $id if OdSink::header($r, 'X-Outbox-Attempt') ne '1' || $r->{status} != 200;
	}
	is_deeply(\%n, { map { $_ => 1 } @$w1, @x_rest }, 'phase 6: the replay re-sent exactly those 19, once each');
	is(scalar @bad, 0, 'phase 6: replayed with X-Outbox-Attempt 1');
}
check_order('/rec', [ $x1, @x_rest ], 'phase 6, replayed ordered aggregate X', $seq_before_replay);
{
	my $ids = $sink->ids('/rec');
	is(scalar(grep { ($ids->{$_} // 0) != 1 } @{ rec_ids($b0) }, @{ rec_ids($b2) }), 0,
		'phase 6: batch 0 and window 2 were each sent once in all');
}

# ------------------------------------------------------------------ 4. the attempt log
# everything settled but down's retries
ok(poll_until($node, q{SELECT count(*) FROM outbox.messages WHERE status = 'processing' AND endpoint <> 'down'}, '0', 30),
	'attempt log: nothing in flight');
my %OUTCOME_OF = (200 => 'done', 503 => 'retry', 400 => 'dead');
for my $ep (qw(orders billing audit o1 o2 rec))
{
	my (%sink_m, %db_m);
	for my $r (@{ $sink->requests("/$ep") })
	{
		my $k = join('|', OdSink::header($r, 'Idempotency-Key'), OdSink::header($r, 'X-Outbox-Attempt'), $r->{status},
			$OUTCOME_OF{ $r->{status} } // '?', '');
		$sink_m{$k}++;
	}
	for my $line (split /\n/, sql("SELECT message_id, attempt, coalesce(http_status::text, 'NULL'), outcome, coalesce(error_class, '')
	                                 FROM outbox.attempts WHERE endpoint = '$ep'"))
	{
		$db_m{$line}++;
	}
	my $n = 0;
	$n += $_ for values %sink_m;
	cmp_ok($n, '>', 0, "attempt log, $ep: the sink saw $n requests");
	is_deeply(\%db_m, \%sink_m, "attempt log, $ep: one row per request the sink saw, (id, attempt, http_status, outcome) equal, error_class NULL")
	  or diag(join("\n", 'only in outbox.attempts: ' . join(' ', grep { ($sink_m{$_} // 0) != $db_m{$_} } sort keys %db_m),
			'only in the sink: ' . join(' ', grep { ($db_m{$_} // 0) != $sink_m{$_} } sort keys %sink_m)));
}
{
	my $o1 = $sink->ids('/o1');
	my $n503 = $o1->{$a1_o1} - 1;
	is(sql("SELECT string_agg(attempt || ':' || outcome || ':' || http_status || ':' || coalesce(retry_after, '-'), ',' ORDER BY attempt)
	          FROM outbox.attempts WHERE message_id = $a1_o1"),
		join(',', (map { "$_:retry:503:1" } 1 .. $n503), ($n503 + 1) . ':done:200:-'),
		"attempt log: A1 on o1: $n503 retry rows (503, retry_after 1), then done");
}
is(sql('SELECT DISTINCT response_body FROM outbox.attempts WHERE outcome = \'dead\' AND endpoint = \'rec\''), 'bad input here',
	'attempt log: the 400 answers\' body is kept, sanitized');
ok( poll_until(
		$node, q{SELECT count(*) = (SELECT sum(attempts) FROM outbox.messages WHERE endpoint = 'down')
		             AND NOT EXISTS (SELECT FROM outbox.messages WHERE endpoint = 'down' AND status = 'processing')
		           FROM outbox.attempts WHERE endpoint = 'down'}, 't', 30),
	'attempt log, down: one row per attempt charged');
is( sql(q{SELECT count(*) > 0, bool_and(error_class = 'connect' AND http_status IS NULL AND outcome = 'retry')
            FROM outbox.attempts WHERE endpoint = 'down'}),
	't|t', "attempt log, down: error_class 'connect', http_status NULL, outcome retry");
is(sql('SELECT count(*) - count(DISTINCT (message_id, lease_version)) FROM outbox.attempts'), '0',
	'attempt log: (message_id, lease_version) identifies each row');
is(sql('SELECT bool_and(worker BETWEEN 0 AND 3 AND duration_ms >= 0 AND started_at <= now()) FROM outbox.attempts'), 't',
	'attempt log: worker, duration and start are plausible');

# attempt_log = failures: only the non-2xx attempts of new deliveries
$node->add_endpoint('flaky', $sink->url('/flaky'), breaker_threshold => 0);
add_subscription('flaky', ['flaky.*']);
$sink->script({ path => '/flaky', fail_first => 1, fail_status => 503, status => 200 });
sql(q{ALTER SYSTEM SET outbox_dispatcher.attempt_log = 'failures'; SELECT pg_reload_conf()});
ok(wait_workers_cycled($node), 'attempt_log = failures: every worker reloaded');
my $pf = [ map { +{ key => "p4-f$_", agg_type => 'fl', agg_id => "f$_", type => 'flaky.x', payload => { n => $_ } } } 1 .. 20 ];
publish_events($pf);
load_rows($pf);
my $pf_ids = [ map { @{ $_->{rows} } } @$pf ];
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list($pf_ids) . ')', '40', 30),
	'attempt_log = failures: 40 deliveries (flaky and audit) done');
is($sink->stats->{by_path}{'/flaky'}, 40, 'attempt_log = failures: flaky saw 40 requests (20 x 503, then 200)');
is( sql('SELECT count(*) || \'|\' || count(*) FILTER (WHERE endpoint = \'flaky\' AND attempt = 1 AND http_status = 503 AND outcome = \'retry\')
           FROM outbox.attempts WHERE message_id IN (' . in_list($pf_ids) . ')'),
	'20|20', 'attempt_log = failures: only the 20 503 attempts were logged, no 2xx one (flaky\'s 200s, audit\'s)');

sql(q{ALTER SYSTEM SET outbox_dispatcher.attempt_log = 'off'; SELECT pg_reload_conf()});
ok(wait_workers_cycled($node), 'attempt_log = off: every worker reloaded');
my $po = [ map { +{ key => "p4-o$_", agg_type => 'fl', agg_id => "o$_", type => 'flaky.y', payload => { n => $_ } } } 1 .. 5 ];
publish_events($po);
load_rows($po);
my $po_ids = [ map { @{ $_->{rows} } } @$po ];
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list($po_ids) . ')', '10', 30),
	'attempt_log = off: 10 deliveries done');
is($sink->stats->{by_path}{'/flaky'}, 50, 'attempt_log = off: flaky saw 10 more requests');
is(sql('SELECT count(*) FROM outbox.attempts WHERE message_id IN (' . in_list($po_ids) . ')'), '0',
	'attempt_log = off: nothing logged');
sql(q{ALTER SYSTEM SET outbox_dispatcher.attempt_log = 'all'; SELECT pg_reload_conf()});
ok(wait_workers_cycled($node), 'attempt_log = all: every worker reloaded');

# The log never holds deliveries back: with today's partition detached the
# log's insert fails; the deliveries are finalized all the same and a
# WARNING says what was not written.
my $today_part = sprintf('outbox.attempts_%02d', sql('SELECT mod(floor(extract(epoch FROM now()) / 86400)::bigint, 32)'));
my $log_pos = -s $node->logfile;
sql("ALTER TABLE outbox.attempts DETACH PARTITION $today_part");
my $pd = [ map { +{ key => "p4-d$_", agg_type => 'fl', agg_id => "d$_", type => 'flaky.z', payload => { n => $_ } } } 1 .. 5 ];
publish_events($pd);
load_rows($pd);
my $pd_ids = [ map { @{ $_->{rows} } } @$pd ];
ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\' AND id IN (' . in_list($pd_ids) . ')', '10', 30),
	'attempt log failing (partition detached): the 10 deliveries are done all the same');
my $log_text = PostgreSQL::Test::Utils::slurp_file($node->logfile, $log_pos);
like($log_text, qr/WARNING:  outbox_dispatcher: \d+ row\(s\) of outbox.attempts were not written: no partition of relation "attempts" found for row/,
	'attempt log failing: a WARNING names what was not written');
is(sql('SELECT count(*) FROM outbox.attempts WHERE message_id IN (' . in_list($pd_ids) . ')'), '0',
	'attempt log failing: nothing of them logged');
sql("ALTER TABLE outbox.attempts ATTACH PARTITION $today_part FOR VALUES IN ("
	  . sql('SELECT mod(floor(extract(epoch FROM now()) / 86400)::bigint, 32)') . ')');

# The workers write a batch's log rows straight into the day's partition, as
# COPY does (one WAL record per page, not one per row); a trigger on the
# table sends them through the INSERT instead, which fires it.
#
# $n flaky.<tag> events (to flaky and audit); true once their 2 * $n
# deliveries are done and logged, one row per attempt.  Their ids in @$ids.
sub deliver_logged
{
	my ($tag, $n, $ids) = @_;
	my $events = [ map { +{ key => "p4-$tag$_", agg_type => 'fl', agg_id => "$tag$_", type => "flaky.$tag", payload => { n => $_ } } } 1 .. $n ];
	publish_events($events);
	load_rows($events);
	@$ids = map { @{ $_->{rows} } } @$events;
	my $in = in_list($ids);
	return poll_until($node, "SELECT count(*) FROM outbox.messages WHERE status = 'done' AND id IN ($in)", 2 * $n, 30)
	  && poll_until($node, "SELECT count(*) = (SELECT sum(attempts) FROM outbox.messages WHERE id IN ($in))
	                          FROM outbox.attempts WHERE message_id IN ($in)", 't', 30);
}
sql('CREATE EXTENSION pg_walinspect');
my $wal_from = sql('SELECT pg_current_wal_insert_lsn()');
my $pm_ids = [];
ok(deliver_logged('m', 10, $pm_ids), 'attempt log, direct: 20 deliveries done, one row per attempt');
sql('SELECT pg_current_xact_id()');    # a synchronous commit: the WAL read below is flushed
my $wal_to = sql('SELECT pg_current_wal_flush_lsn()');
is( sql(qq{SELECT count(*) FILTER (WHERE record_type LIKE 'MULTI_INSERT%') > 0,
                  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'INSERT%')
             FROM pg_get_wal_records_info('$wal_from', '$wal_to')
            WHERE block_ref ~ ('/' || pg_relation_filenode('$today_part') || '([^0-9]|\$)')}),
	't|0', 'attempt log, direct: the partition got multi-insert records and no single-row insert');
is( sql('SELECT count(*) FILTER (WHERE endpoint = \'flaky\' AND attempt = 1 AND http_status = 503 AND outcome = \'retry\')
              || \'|\' || count(*) FILTER (WHERE http_status = 200 AND outcome = \'done\' AND error_class IS NULL
                                             AND bucket = mod(floor(extract(epoch FROM started_at) / 86400)::bigint, 32))
           FROM outbox.attempts WHERE message_id IN (' . in_list($pm_ids) . ')'),
	'10|20', 'attempt log, direct: flaky\'s 503s and the 20 successes with their columns');

sql(q{CREATE TABLE public.attempts_seen (message_id bigint, outcome text);
CREATE FUNCTION public.attempts_seen() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN INSERT INTO public.attempts_seen VALUES (NEW.message_id, NEW.outcome); RETURN NEW; END $$;
CREATE TRIGGER attempts_seen BEFORE INSERT ON outbox.attempts FOR EACH ROW EXECUTE FUNCTION public.attempts_seen();});
my $pt_ids = [];
ok(deliver_logged('t', 5, $pt_ids), 'attempt log, with a trigger on the table: 10 deliveries done, one row per attempt');
is( sql('SELECT (SELECT count(*) FROM public.attempts_seen WHERE message_id IN (' . in_list($pt_ids) . '))
              = (SELECT count(*) FROM outbox.attempts WHERE message_id IN (' . in_list($pt_ids) . '))'),
	't', 'attempt log, with a trigger on the table: it fired for every row (the INSERT wrote them)');
sql('DROP TRIGGER attempts_seen ON outbox.attempts; DROP FUNCTION public.attempts_seen(); DROP TABLE public.attempts_seen;'
	  . ' DROP EXTENSION pg_walinspect');

# ------------------------------------------------------------------ 5. attempt-log retention
# rows at noon UTC of past days, in their day's bucket; message_id < 0 marks them
my $real_rows = sql('SELECT count(*) FROM outbox.attempts WHERE message_id > 0');
cmp_ok($real_rows, '>', 0, 'retention: today\'s real rows exist');
sql(q{
INSERT INTO outbox.attempts (message_id, lease_version, attempt, endpoint, worker, started_at, duration_ms, outcome, bucket)
SELECT id, 1, 1, 'audit', 0, t, 1, 'done', (floor(extract(epoch FROM b) / 86400)::bigint % 32)::smallint
  FROM (VALUES (-40, 40, 40), (-5, 5, 5), (-50, 0, 5), (-3, 3, 3), (-2, 2, 2), (-1, 1, 1)) AS v(id, days, bucket_days),
       LATERAL (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day0) AS d,
       LATERAL (SELECT CASE WHEN days = 0 THEN now() - interval '1 hour' ELSE day0 - days * interval '1 day' + interval '12 hours' END AS t,
                       day0 - bucket_days * interval '1 day' + interval '12 hours' AS b) AS x});
my $buckets = sql(q{SELECT string_agg(message_id || ':' || bucket, ' ' ORDER BY message_id) FROM outbox.attempts WHERE message_id < 0});
my $today_bucket = sql(q{SELECT floor(extract(epoch FROM now()) / 86400)::bigint % 32});
note("retention: test rows (id:bucket) $buckets, today's bucket $today_bucket");
is(sql(q{SELECT count(DISTINCT bucket) FROM outbox.attempts WHERE message_id IN (-40, -5, -3, -2, -1)}), '5',
	'retention: the five days are in five different buckets');

# what is left of the test rows, after waiting up to $timeout s for $expected
sub wait_rows
{
	my ($expected, $timeout) = @_;
	my $deadline = time + $timeout;
	my $got;
	while (1)
	{
		$got = sql(q{SELECT string_agg(message_id::text, ',' ORDER BY message_id) FROM outbox.attempts WHERE message_id < 0});
		return $got if $got eq $expected || time >= $deadline;
		sleep 0.5;    # the TRUNCATE needs a moment without readers
	}
}

sql(q{ALTER SYSTEM SET outbox_dispatcher.attempt_log_retention = '7d'; SELECT pg_reload_conf()});
is(wait_rows('-50,-5,-3,-2,-1', 30), '-50,-5,-3,-2,-1',
	'retention 7d, after a reload: the 40-day-old row\'s partition is emptied, the 5..1-day-old rows stay');
sql(q{ALTER SYSTEM SET outbox_dispatcher.attempt_log_retention = '2d'; SELECT pg_reload_conf()});
is(wait_rows('-50,-2,-1', 30), '-50,-2,-1',
	'retention 2d, after a reload: the 5- and 3-day-old rows go; the recent row in the 5-day-old bucket, the 2- and 1-day-old rows stay');
cmp_ok(sql('SELECT count(*) FROM outbox.attempts WHERE message_id > 0'), '>=', $real_rows, 'retention: today\'s real rows all stay');

# A row older than the cutoff in a partition that is kept (today's bucket:
# 32 days ago, e.g. left there because the expiry did not run on the day that
# bucket left the retention window).  The spec: "A partition that also has
# newer rows loses only the rows older than the cutoff (DELETE)": every kept
# partition is checked once a day, and again after each reload
# (src/attempt_log.cpp od_expire_attempts).
sql(q{
INSERT INTO outbox.attempts (message_id, lease_version, attempt, endpoint, worker, started_at, duration_ms, outcome, bucket)
SELECT -32, 1, 1, 'audit', 0, t, 1, 'done', (floor(extract(epoch FROM t) / 86400)::bigint % 32)::smallint
  FROM (SELECT now() - interval '32 days' AS t) AS v});
is(sql('SELECT bucket FROM outbox.attempts WHERE message_id = -32'), $today_bucket, 'retention: a 32-day-old row is in today\'s bucket');
sql(q{SELECT pg_reload_conf()});
is(wait_rows('-50,-2,-1', 10), '-50,-2,-1', 'retention 2d, after a reload: a 32-day-old row in today\'s (kept) bucket is deleted');

diag(sprintf('063_fanout: %.1f s', time - $T0));
$sink->stop;
$node->stop;
done_testing();
