# Copyright: outbox_dispatcher contributors
#
# 065_conformance.pl — deliveries as the official SDKs see them: every
# request is checked by test/conformance/receiver.mjs with the npm packages
# `standardwebhooks` (new Webhook(secret).verify(rawBody, headers)) and
# `cloudevents` (HTTP.toEvent({headers, body})), pinned in
# test/conformance/package-lock.json (npm ci --prefix test/conformance;
# test/install_deps.sh does it).
#
# Proves, for an endpoint with a signing secret:
#   1. every request verifies with the endpoint's secret and not with another
#      one; the CloudEvents SDK parses it; ce-id = id, ce-specversion 1.0, the
#      data is the payload, the body is payload::text; the ce-id, ce-type,
#      ce-source and ce-subject values on the wire are printable US-ASCII with
#      no space, '"' or bare '%' (CloudEvents HTTP binding 3.1.3.2), and
#      decode to the event type and aggregate_type/aggregate_id exactly, byte
#      for byte: non-ASCII (commande.payée), a trailing space, '%' and '"',
#      a value that looks percent-encoded (x.%41), a double-quoted one.
#      The SDK does not percent-decode header values (it passes them through:
#      node_modules/cloudevents/dist/message/http/headers.js, every binary
#      parser is a PassThroughParser), so the decoding of 3.1.3.2 is done by
#      receiver.mjs (ce_decoded) and checked here.
#   2. outbox.rotate_secret(endpoint, new_secret, grace): during the grace
#      the request carries one signature per valid secret, newest first, and
#      verifies with the old and the new secret; after a rotation with grace
#      '0 seconds', and once a short grace (5 s) has passed, only with the newest.
#   3. outbox_dispatcher.message_id_prefix: webhook-id, Idempotency-Key and
#      ce-id are prefix || id, and the signature (over the prefixed id) still
#      verifies.
#   4. a trace context set with SET LOCAL outbox_dispatcher.traceparent/
#      .tracestate reaches the SDK as the distributed-tracing extension
#      attributes and arrives as the W3C headers.
# Parts 2 to 4 fail (not skip) when the function or parameter is missing.
#
# Run: see 010_delivery.pl; needs node and test/conformance/node_modules.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64);
use JSON::PP;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use List::Util qw(shuffle);
use POSIX qw(WNOHANG);

use OdNode;
use OdTest qw(poll_until wait_workers_cycled sql_quote);

my $CONF_DIR = abs_path(dirname(abs_path(__FILE__)) . '/../conformance');
my $RECEIVER = "$CONF_DIR/receiver.mjs";
# everything stays UTF-8 bytes: the literals here, psql's output and the
# receiver's log (decoded without ->utf8), as in 011_wire.pl
my $JSON = JSON::PP->new->canonical;

# ------------------------------------------------------------------ prerequisites
my $node_version = `node --version 2>/dev/null` // '';
chomp $node_version;
my $have = $node_version =~ /^v\d+/
  && -d "$CONF_DIR/node_modules/standardwebhooks"
  && -d "$CONF_DIR/node_modules/cloudevents";
ok($have, "node ($node_version) and test/conformance/node_modules are there (test/install_deps.sh installs them)")
  or do { done_testing(); exit 0; };

# ------------------------------------------------------------------ secrets
sub secret_of { my ($seed) = @_; my $k = pack('C*', map { ($_ * $seed + 7) % 256 } 0 .. 31); return ($k, 'whsec_' . encode_base64($k, '')); }
my (@key, @secret);
($key[$_], $secret[$_]) = secret_of(11 + 2 * $_) for 0 .. 4;
# 0: the endpoint's first secret, 1-3: the rotations, 4: never the endpoint's
my $WRONG = 4;

# ------------------------------------------------------------------ the receiver
my $node = OdNode->create(
	'conformance', init => [ '--encoding=UTF8', '--locale=C' ], conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 200ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 100ms
});
my $dir = $node->basedir;
my $log = "$dir/receiver.jsonl";
open(my $sfh, '>', "$dir/receiver.secrets.json") or die $!;
print $sfh $JSON->encode({ '/signed' => \@secret });
close $sfh;

my ($receiver_pid, $port);
END { kill('TERM', $receiver_pid) if $receiver_pid; }
# a free port in 54600-54799: the receiver exits 98 when its port is taken
for my $try (shuffle(54600 .. 54799))
{
	unlink "$dir/receiver.port";
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', "$dir/receiver.out") or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec('node', $RECEIVER, '--port', $try, '--log', $log, '--secrets', "$dir/receiver.secrets.json",
			'--port-file', "$dir/receiver.port", '--watch-pid', getppid()) or POSIX::_exit(127);
	}
	my $deadline = time + 15;
	while (time < $deadline && !-s "$dir/receiver.port")
	{
		last if waitpid($pid, WNOHANG) == $pid;
		sleep 0.05;
	}
	if (-s "$dir/receiver.port") { ($receiver_pid, $port) = ($pid, $try); last; }
	waitpid($pid, 0) if kill(0, $pid) && kill('KILL', $pid);
	last unless ($? >> 8) == 98;
}
ok($port, "receiver.mjs listens on 127.0.0.1:" . ($port // '?'))
  or do { diag(`cat $dir/receiver.out`); done_testing(); exit 0; };

$node->safe_psql('postgres',
	"INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('signed', 'http://127.0.0.1:$port/signed', "
	  . sql_quote($secret[0]) . ')');

# ------------------------------------------------------------------ helpers
sub psql { return $node->safe_psql('postgres', $_[0]); }

sub receiver_log
{
	open(my $fh, '<:raw', $log) or return [];
	my @r = map { $JSON->decode($_) } grep { /\S/ } <$fh>;
	close $fh;
	return \@r;
}

# enqueue [aggregate_type, aggregate_id, event_type, payload] rows to 'signed';
# returns the messages as stored (id, event_type, subject, payload, created)
sub enqueue
{
	my @ids;
	push @ids, psql('SELECT outbox.enqueue(' . join(', ',
		sql_quote($_->[0]), sql_quote($_->[1]), sql_quote($_->[2]), sql_quote($_->[3]) . '::jsonb',
		q{'signed'}) . ')') for @_;
	my $in = join(',', @ids);
	my $out = $node->safe_psql('postgres', qq{
SELECT json_build_object('id', id::text, 'event_type', event_type,
                         'subject', aggregate_type || '/' || aggregate_id, 'payload', payload::text,
                         'created', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS'))
  FROM outbox.messages WHERE id IN ($in) ORDER BY id});
	return map { $JSON->decode($_) } split /\n/, $out;
}

# wait until the messages are done; return their requests, keyed by id
sub delivered
{
	my ($prefix, @msgs) = @_;
	my $in = join(',', map { $_->{id} } @msgs);
	ok(poll_until($node, "SELECT count(*) FROM outbox.messages WHERE id IN ($in) AND status = 'done'",
			scalar(@msgs), 30), scalar(@msgs) . " messages ($in) delivered");
	my %by;
	for my $r (@{ receiver_log() })
	{
		diag("receiver error: $r->{internal_error}") if $r->{internal_error};
		my $k = $r->{raw_headers}{'idempotency-key'} // next;
		push @{ $by{$k} }, $r;
	}
	my %req;
	for my $m (@msgs)
	{
		my $rs = $by{ $prefix . $m->{id} } // [];
		is(scalar @$rs, 1, "$m->{id}: one request with Idempotency-Key $prefix$m->{id}");
		$req{ $m->{id} } = $rs->[0] // {};
	}
	return \%req;
}

sub sig { my ($k, $id, $ts, $body) = @_; return 'v1,' . encode_base64(hmac_sha256("$id.$ts.$body", $k), ''); }

# the request verifies with exactly the secrets @valid (newest first), and its
# webhook-signature is one signature per valid secret, in that order
sub check_signatures
{
	my ($what, $r, $id, @valid) = @_;
	my %ok = map { $_ => 1 } @valid;
	for my $i (0 .. $#secret)
	{
		if ($ok{$i})
		{
			ok($r->{verified}{$i}, "$what: standardwebhooks verifies with secret $i")
			  or diag("verify error: " . ($r->{verify_error}{$i} // '?'));
		}
		else
		{
			ok(defined $r->{verified}{$i} && !$r->{verified}{$i}, "$what: standardwebhooks rejects secret $i");
		}
	}
	my $h = $r->{raw_headers} // {};
	is($h->{'webhook-signature'}, join(' ', map { sig($key[$_], $id, $h->{'webhook-timestamp'} // '', $r->{body} // '') } @valid),
		"$what: webhook-signature has " . scalar(@valid) . ' signature(s), newest secret first');
}

# ------------------------------------------------------------------ 1. the SDKs' view
my @cases = (
	[ 'order',    '1001',          'order.created',      '{"n": 1}' ],
	[ 'commande', 'cmd-été-7',     'commande.payée',     '{"montant": 12.5, "note": "reçu ✓ grüße", "emoji": "😀"}' ],
	[ 'order',    '1002',          'order.paid ',        '{"n": 2, "memo": "trailing space in the type"}' ],
	[ 'weird',    'a "b" 50%',     'a%b"c',              '{"quote": "\"", "pct": "100%"}' ],
	[ 'x',        '%41',           'x.%41',              '{"looks": "percent-encoded"}' ],
	[ 'q',        'c/42',          '"quoted"',           '{"n": 3}' ],
	[ 'user',     'ü😀',           'user.ünïcødé 😀',    '{"name": "Zoë", "city": "Łódź"}' ],
);
my @m1 = enqueue(@cases);
my $req = delivered('', @m1);
for my $m (@m1)
{
	my $r = $req->{ $m->{id} };
	my $id = $m->{id};
	my $what = "$id ($m->{event_type})";
	my $h = $r->{raw_headers} // {};
	my $ce = $r->{ce} // {};
	my $dec = $r->{ce_decoded} // {};
	check_signatures($what, $r, $id, 0);
	is($r->{webhook_id}, $id, "$what: webhook-id = id");
	ok(!defined $r->{ce_error}, "$what: the CloudEvents SDK parses the request")
	  or diag("HTTP.toEvent: $r->{ce_error}");
	is($ce->{specversion}, '1.0', "$what: ce.specversion 1.0");
	is($ce->{id}, $id, "$what: ce.id = id");
	like($ce->{time} // '', qr/^\Q$m->{created}\E/, "$what: ce.time = created_at ($m->{created})");
	is_deeply($ce->{data}, JSON::PP->new->decode($m->{payload}), "$what: ce.data = payload");
	is($r->{body}, $m->{payload}, "$what: body = payload::text");
	my @bad = grep { defined $h->{$_} && $h->{$_} !~ /^(?:[\x21\x23\x24\x26-\x7E]|%[0-9A-Fa-f]{2})*$/ }
	  qw(ce-id ce-type ce-source ce-subject);
	is("@bad", '', "$what: ce-id/type/source/subject are printable US-ASCII, space, '\"' and '%' percent-encoded (3.1.3.2)")
	  or diag(join("\n", map { "$_: [$h->{$_}]" } @bad));
	is($dec->{type}, $m->{event_type}, "$what: ce-type decodes to the event type exactly")
	  or diag("on the wire: [" . ($h->{'ce-type'} // '') . "]; SDK ce.type: [" . ($ce->{type} // '') . "]"
		  . ($r->{ce_decode_error}{type} ? "; $r->{ce_decode_error}{type}" : ''));
	is($dec->{subject}, $m->{subject}, "$what: ce-subject decodes to aggregate_type/aggregate_id exactly")
	  or diag("on the wire: [" . ($h->{'ce-subject'} // '') . "]");
	is($dec->{id}, $id, "$what: ce-id decodes to the id");
	is($dec->{source}, '/postgresql/postgres/outbox', "$what: ce-source decodes to the default source");
}

# ------------------------------------------------------------------ 2. secret rotation
my @current = (0);   # the secrets the endpoint signs with, newest first
my $rotate = psql(q{SELECT to_regprocedure('outbox.rotate_secret(text,text,interval)') IS NOT NULL});
if (ok($rotate eq 't', 'outbox.rotate_secret(text, text, interval) exists'))
{
	my @more = (
		[ 'commande', 'cmd-é-8', 'commande.payée', '{"montant": 1.5}' ],
		[ 'order',    '2001',    'order.paid ',    '{"n": 4}' ],
		[ 'weird',    '%',       'a%b"c',          '{"n": 5}' ],
	);
	my $round = sub {
		my ($what, @valid) = @_;
		ok(wait_workers_cycled($node), "$what: the workers went through their loop");
		my @m = enqueue(@more);
		my $rq = delivered('', @m);
		for my $m (@m)
		{
			my $r = $rq->{ $m->{id} };
			check_signatures("$what, $m->{id}", $r, $m->{id}, @valid);
			is($r->{ce_decoded}{type}, $m->{event_type}, "$what, $m->{id}: ce-type decodes to the event type");
		}
	};

	psql('SELECT outbox.rotate_secret(' . sql_quote('signed') . ', ' . sql_quote($secret[1]) . ')');
	$round->('rotated to secret 1 (grace 24 hours)', 1, 0);

	psql('SELECT outbox.rotate_secret(' . sql_quote('signed') . ', ' . sql_quote($secret[2]) . q{, '0 seconds')});
	$round->('rotated to secret 2 with grace 0 seconds', 2);

	# a short grace: both secrets within it (the round takes well under a
	# second), only the new one once it has passed
	my $t0 = time;
	psql('SELECT outbox.rotate_secret(' . sql_quote('signed') . ', ' . sql_quote($secret[3]) . q{, '5 seconds')});
	$round->('rotated to secret 3 with grace 5 seconds, within the grace', 3, 2);
	sleep(0.1) while time < $t0 + 6.5;
	$round->('rotated to secret 3, the 5 seconds of grace passed', 3);
	@current = (3);
}

# ------------------------------------------------------------------ 3. message id prefix
my $has_prefix = psql(q{SELECT current_setting('outbox_dispatcher.message_id_prefix', true) IS NOT NULL});
if (ok($has_prefix eq 't', 'parameter outbox_dispatcher.message_id_prefix exists'))
{
	psql(q{ALTER SYSTEM SET outbox_dispatcher.message_id_prefix = 'db1-'});
	$node->reload;
	ok(poll_until($node, 'SHOW outbox_dispatcher.message_id_prefix', 'db1-', 10), 'message_id_prefix reloaded');
	ok(wait_workers_cycled($node), 'the workers went through their loop after the reload');
	my @m = enqueue([ 'commande', 'cmd-é-9', 'commande.payée', '{"montant": 2}' ], [ 'order', '3001', 'order.created', '{"n": 6}' ]);
	my $rq = delivered('db1-', @m);
	for my $m (@m)
	{
		my $r = $rq->{ $m->{id} };
		my $what = "prefix db1-, $m->{id}";
		my $pid = "db1-$m->{id}";
		is($r->{webhook_id}, $pid, "$what: webhook-id = $pid");
		is($r->{raw_headers}{'idempotency-key'}, $pid, "$what: Idempotency-Key = $pid");
		is($r->{ce}{id}, $pid, "$what: ce.id (SDK) = $pid");
		is($r->{ce_decoded}{id}, $pid, "$what: ce-id decodes to $pid");
		check_signatures($what, $r, $pid, @current);
		is($r->{ce_decoded}{type}, $m->{event_type}, "$what: ce-type decodes to the event type");
	}
	psql('ALTER SYSTEM RESET outbox_dispatcher.message_id_prefix');
	$node->reload;
}

# ------------------------------------------------------------------ 4. trace context
# SET LOCAL outbox_dispatcher.traceparent/.tracestate in the producer's
# transaction: the SDK sees them as the distributed-tracing extension
# attributes, and the W3C headers arrive as they were set.
my $has_trace = psql(q{SELECT current_setting('outbox_dispatcher.traceparent', true) IS NOT NULL});
if (ok($has_trace eq 't', 'parameter outbox_dispatcher.traceparent exists'))
{
	my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
	my $ts = 'congo=t61rcWkgMzE, rojo=00f067aa0ba902b7';
	my $id = psql(qq{BEGIN;
SET LOCAL outbox_dispatcher.traceparent = '$tp';
SET LOCAL outbox_dispatcher.tracestate = '$ts';
SELECT outbox.enqueue('order', '4001', 'order.traced', '{"n": 7}', 'signed');
COMMIT;});
	my $rq = delivered('', { id => $id });
	my $r = $rq->{$id};
	is($r->{ce}{traceparent}, $tp, "$id: the SDK reads the traceparent extension attribute");
	is($r->{raw_headers}{traceparent}, $tp, "$id: traceparent header");
	is($r->{raw_headers}{tracestate}, $ts, "$id: tracestate header");
	is($r->{raw_headers}{'ce-tracestate'}, 'congo=t61rcWkgMzE,%20rojo=00f067aa0ba902b7',
		"$id: ce-tracestate percent-encoded on the wire");
	check_signatures("trace context, $id", $r, $id, @current);
}

kill('TERM', $receiver_pid);
waitpid($receiver_pid, 0);
$receiver_pid = undef;
$node->stop;
done_testing();
