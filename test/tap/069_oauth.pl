# Copyright: outbox_dispatcher contributors
#
# 069_oauth.pl — OAuth2 client credentials per endpoint
# (endpoints.oauth_token_url, oauth_client_id, oauth_client_secret,
# oauth_scope), end to end through the background workers against the HTTP
# sink, which plays both the token endpoint and the receiver.
#
# Proves:
#   - one token for all: 200 messages of an endpoint, delivered by both
#     workers, cost exactly one token request, a POST with
#     grant_type=client_credentials and the form-urlencoded scope, HTTP Basic
#     credentials built from the form-urlencoded id and secret (RFC 6749
#     2.3.1: "my client" / "s3cr&t:x" -> my+client:s3cr%26t%3Ax), a
#     form-urlencoded Content-Type and Accept: application/json; every
#     delivery carries "Authorization: Bearer <that token>";
#   - a 401 is answered by one token refresh and one resend with the new
#     token, which does not use an attempt (done, attempts 1);
#   - a changed client configuration (the scope) fetches its own token
#     before the next delivery; the old client's is never sent again;
#   - an endpoint that always answers 401: each message is sent twice (the
#     old token, then the new one) and ends dead with attempts 1, and the
#     five rejections of the same token cost one refresh (2 token requests);
#   - a token with expires_in 4 is refreshed before it runs out: over a 10 s
#     trickle of messages at least 3 tokens are fetched and no delivery
#     carries a token issued 4 s or more before it;
#   - a token endpoint answering 503, then 200 without an access_token: the
#     messages are retried (pending, attempts charged, last_error "not sent:
#     no OAuth2 access token ..."), nothing reaches the receiver, the token
#     requests are backed off (not one per retry); once the token endpoint
#     answers, the messages are delivered with its token;
#   - secrets stay secret: neither the client secret (raw or encoded), nor the
#     Basic credentials, nor any access token is in the server log, in
#     messages or in the attempt log; outbox_monitor can read
#     oauth_token_url but not oauth_client_secret.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use JSON::PP ();
use MIME::Base64 qw(encode_base64);

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled sql_quote);

# batch_size 10: the 200 messages of section 1 go out in many batches, so
# that both workers take part and the one token fetch has to serve both
my $node = OdNode->create(
	'oauth', conf => q{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.batch_size = 10
outbox_dispatcher.max_attempts = 1000
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 200ms
});
my $sink = OdSink->start($node->basedir);

my $SECRET = 's3cr&t:x';
my $SECRET_ENCODED = 's3cr%26t%3Ax';

# a token endpoint handing out tok-<seq of the token request> per request
sub token_script
{
	my ($path, %opt) = @_;
	my $expires = delete $opt{expires_in} // 3600;
	$sink->script({
		path => $path, status => 200, body_seq => JSON::PP::true,
		body => qq({"access_token":"tok-%SEQ%","token_type":"Bearer","expires_in":$expires}), %opt });
}

# An OAuth2 endpoint, inserted as superuser.  The statement holds the client
# secret: it is kept out of the server log (PostgreSQL::Test::Cluster sets
# log_statement = all; psql -f sends the SET and the INSERT separately), so
# that section 6 can check the whole log for it, not only the workers' lines.
sub add_oauth_endpoint
{
	my ($name, $path, $token_path, %cols) = @_;
	my %all = (
		name => $name, url => $sink->url($path), oauth_token_url => $sink->url($token_path),
		oauth_client_id => "$name-client", oauth_client_secret => $SECRET, breaker_threshold => 0, %cols);
	my @k = sort keys %all;
	$node->safe_psql('postgres', "SET log_statement = 'none';\n"
		  . 'INSERT INTO outbox.endpoints (' . join(', ', @k) . ') VALUES (' . join(', ', map { sql_quote($all{$_}) } @k) . ");\n");
	ok(wait_workers_cycled($node), "$name: the workers loaded the endpoint");
}

sub auth { OdSink::header($_[0] // {}, 'authorization') // '' }

# ------------------------------------------------------------------ 1. one token, shared by both workers
token_script('/token');
# each delivery takes 50 ms: one worker alone (10 in flight) needs a second
# for the 200, so the other one, polling every 100 ms, always claims some too
# (answered at once, one worker could deliver all 200 before the other woke)
$sink->script({ path => '/hook', status => 200, delay_ms => 50 });
add_oauth_endpoint('oa', '/hook', '/token', oauth_client_id => 'my client', oauth_scope => 'orders.write audit');
$node->enqueue_n(200, endpoint => 'oa', tag => 'oa');
ok($node->poll(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa' AND status = 'done'}, '200', 30),
	'oa: all 200 messages delivered');
my $tokens = $sink->requests('/token');
is(scalar @$tokens, 1, 'oa: exactly one token request for 200 deliveries by 2 workers');
my $tr = $tokens->[0] // { seq => -1 };
is($tr->{method} // '', 'POST', 'token request: a POST');
is(auth($tr), 'Basic ' . encode_base64("my+client:$SECRET_ENCODED", ''),
	'token request: Basic credentials of the form-urlencoded id and secret (RFC 6749 2.3.1)');
is($tr->{body} // '', 'grant_type=client_credentials&scope=orders.write+audit',
	'token request: grant_type=client_credentials and the form-urlencoded scope');
like(OdSink::header($tr, 'content-type') // '', qr{^application/x-www-form-urlencoded\s*(;.*)?$}i,
	'token request: Content-Type application/x-www-form-urlencoded');
like(OdSink::header($tr, 'accept') // '', qr{application/json}, 'token request: Accept: application/json');
my $tok1 = "tok-$tr->{seq}";
my $hooks = $sink->requests('/hook');
is(scalar @$hooks, 200, 'oa: 200 deliveries, none repeated');
my @wrong = grep { auth($_) ne "Bearer $tok1" } @$hooks;
is(scalar @wrong, 0, "oa: every delivery carries Authorization: Bearer $tok1")
  or diag('e.g. [' . auth($wrong[0]) . ']');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.worker_stats WHERE delivered > 0'), '2',
	'oa: both workers delivered (the one token served both)');

# ------------------------------------------------------------------ 2. a 401: one refresh, one free resend
$sink->script({ path => '/hook', status => 200, fail_first => 1, fail_status => 401 });
my ($id401) = $node->enqueue_n(1, endpoint => 'oa', tag => 'oa401');
ok($node->poll("SELECT status || ' ' || attempts FROM outbox.messages WHERE id = $id401", 'done 1', 20),
	'401 once: delivered, the resend used no attempt (attempts 1)');
my $r401 = $sink->requests('/hook', id => $id401);
is(scalar @$r401, 2, '401 once: two requests for its Idempotency-Key');
is($r401->[0]{status} // 0, 401, '401 once: the first answered 401');
$tokens = $sink->requests('/token');
is(scalar @$tokens, 2, '401 once: exactly one more token request');
my $tok2 = 'tok-' . ($tokens->[1]{seq} // -1);
is(auth($r401->[0]), "Bearer $tok1", '401 once: the first request carried the old token');
is(auth($r401->[1] // {}), "Bearer $tok2", '401 once: the resend carried the new one');

# ------------------------------------------------------------------ 2b. another client: its own token
# a changed client configuration (here the scope) never sends the old client's
# token: the next delivery fetches one for the new configuration first
$sink->script({ path => '/hook', status => 200 });
$node->safe_psql('postgres', q{UPDATE outbox.endpoints SET oauth_scope = 'orders.read' WHERE name = 'oa'});
ok(wait_workers_cycled($node), 'oa: the workers reloaded the changed client');
my ($idnew) = $node->enqueue_n(1, endpoint => 'oa', tag => 'oanew');
ok($node->poll("SELECT status FROM outbox.messages WHERE id = $idnew", 'done', 20),
	'changed client: delivered');
$tokens = $sink->requests('/token');
is(scalar @$tokens, 3, 'changed client: one more token request');
is($tokens->[2]{body} // '', 'grant_type=client_credentials&scope=orders.read', 'changed client: with the new scope');
my $rnew = $sink->requests('/hook', id => $idnew);
is(auth($rnew->[0] // {}), 'Bearer tok-' . ($tokens->[2]{seq} // -1), 'changed client: sent with the new token only');

# ------------------------------------------------------------------ 3. always 401: one refresh for all rejections
# (the token endpoint answers after 300 ms: every message claimed with the
# first batch is still waiting for the first token when it comes)
token_script('/token2', delay_ms => 300);
$sink->script({ path => '/deny', status => 401 });
add_oauth_endpoint('oa_deny', '/deny', '/token2');
my @deny = $node->enqueue_n(5, endpoint => 'oa_deny', tag => 'deny');
ok($node->poll(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa_deny' AND status = 'dead'}, '5', 20),
	'oa_deny: all 5 messages dead');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa_deny' AND attempts = 1 AND last_http_status = 401}),
	'5', 'oa_deny: each dead after one attempt, on its second 401');
ok(wait_workers_cycled($node), 'oa_deny: the workers went on (no token request still to come)');
is_deeply($sink->ids('/deny'), { map { $_ => 2 } @deny }, 'oa_deny: exactly 2 requests per Idempotency-Key');
my $tokens2 = $sink->requests('/token2');
is(scalar @$tokens2, 2, 'oa_deny: 2 token requests (the first fetch, one refresh for the 5 rejections)');
my @want = map { 'Bearer tok-' . ($_->{seq} // -1) } @$tokens2;
my @order = grep {
	my $r = $sink->requests('/deny', id => $_);
	@$r != 2 || auth($r->[0]) ne ($want[0] // '') || auth($r->[1]) ne ($want[1] // '')
} @deny;
is(scalar @order, 0, 'oa_deny: each message sent with the first token, then with the refreshed one');

# ------------------------------------------------------------------ 4. expiry: refreshed before it runs out
# expires_in 4: refreshed from 3 s on, not used from 3.6 s on
token_script('/token3', expires_in => 4);
add_oauth_endpoint('oa_short', '/hook3', '/token3');
my $t0 = time;
for my $i (0 .. 49)
{
	my $at = $t0 + 0.2 * $i;    # pacing of the trickle, not an assertion
	sleep($at - time) if $at > time;
	$node->safe_psql('postgres', "SELECT outbox.enqueue('short', '$i', 'short.tick', '{}', 'oa_short')");
}
ok($node->poll(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa_short' AND status = 'done'}, '50', 20),
	'oa_short: all 50 messages of the 10 s trickle delivered');
my %issued = map { ($_->{seq} => $_->{t}) } @{ $sink->requests('/token3') };
cmp_ok(scalar keys %issued, '>=', 3, 'oa_short: at least 3 token requests in 10 s (' . scalar(keys %issued) . ')');
my $hooks3 = $sink->requests('/hook3');
is(scalar @$hooks3, 50, 'oa_short: 50 deliveries');
my (@stale, %used);
for my $h (@$hooks3)
{
	my ($seq) = auth($h) =~ /^Bearer tok-(\d+)$/;
	$used{ $seq // '?' } = 1;
	my $age = defined $seq && defined $issued{$seq} ? $h->{t} - $issued{$seq} : undef;
	push @stale, sprintf('seq %d: [%s] age %s', $h->{seq}, auth($h), defined $age ? sprintf('%.3f s', $age) : 'not a /token3 token')
	  unless defined $age && $age >= 0 && $age < 4;
}
is(scalar @stale, 0, 'oa_short: every delivery carried a /token3 token issued less than 4 s before it')
  or diag(join("\n", @stale[ 0 .. ($#stale < 9 ? $#stale : 9) ]));
cmp_ok(scalar keys %used, '>=', 3, 'oa_short: the deliveries used at least 3 different tokens (' . scalar(keys %used) . ')');

# ------------------------------------------------------------------ 5. the token endpoint fails, then recovers
# retry_schedule {500ms}: retries come fast, yet each leaves the messages
# pending long enough to be seen so; a schedule alone would also mean
# 2 attempts at most: max_attempts 1000.  No breaker (add_oauth_endpoint).
$sink->script({ path => '/token4', status => 503 });
add_oauth_endpoint('oa_down', '/hook4', '/token4', retry_schedule => '{500ms}', max_attempts => 1000);
my @down = $node->enqueue_n(3, endpoint => 'oa_down', tag => 'down');
my $waiting = q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa_down' AND status = 'pending' AND attempts >= 1
                  AND last_error LIKE 'not sent: no OAuth2 access token%'};
ok($node->poll($waiting, '3', 20), 'oa_down: token endpoint 503: the 3 messages are retries (pending, attempted, "not sent: no OAuth2 access token")');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $down[0]"), qr/\b503\b/,
	'oa_down: last_error says what the token endpoint answered (503)');
# the endpoint's failures, yet no request was made: endpoint_health counts them, no latency
is($node->safe_psql('postgres', q{SELECT failed >= 3, latency_avg_ms IS NULL, latency_max_ms IS NULL
                                    FROM outbox.endpoint_health WHERE endpoint = 'oa_down'}), 't|t|t',
	'oa_down: endpoint_health counts the failures (failed >= 3) but no latency for requests never made');
ok(scalar $sink->wait_requests(2, path => '/token4', timeout => 10), 'oa_down: the token request is tried again');
my @tt = map { $_->{t} } @{ $sink->requests('/token4') };
cmp_ok(($tt[1] // 0) - ($tt[0] // 0), '>=', 0.8, sprintf('oa_down: backed off: %.3f s between the first two token requests, not one per retry', ($tt[1] // 0) - ($tt[0] // 0)));

# a 200 without an access_token is a failure too
# (counted after the script is set: every request recorded later got the new answer)
$sink->script({ path => '/token4', status => 200, body => '{"token_type":"Bearer","expires_in":3600}' });
my $n_before = scalar @{ $sink->requests('/token4') };
ok(scalar $sink->wait_requests($n_before + 1, path => '/token4', timeout => 15), 'oa_down: a token request answered 200 without access_token');
ok($node->poll($waiting . q{ AND last_error NOT LIKE '%503%'}, '3', 20),
	'oa_down: 200 without access_token: still retries, "not sent: no OAuth2 access token" (no longer for a 503)');
is(scalar @{ $sink->requests('/hook4') }, 0, 'oa_down: nothing reached the receiver without a token');

token_script('/token4');
my $n_failed = scalar @{ $sink->requests('/token4') };
ok($node->poll(q{SELECT count(*) FROM outbox.messages WHERE endpoint = 'oa_down' AND status = 'done'}, '3', 40),
	'oa_down: token endpoint healthy: all 3 delivered');
my $tokens4 = $sink->requests('/token4');
is(scalar @$tokens4, $n_failed + 1, 'oa_down: one token request once it answers');
my $tok4 = 'tok-' . ($tokens4->[-1]{seq} // -1);
my $hooks4 = $sink->requests('/hook4');
is(scalar @$hooks4, 3, 'oa_down: 3 deliveries');
is(scalar(grep { auth($_) eq "Bearer $tok4" } @$hooks4), 3, "oa_down: each with the new token ($tok4)");

# ------------------------------------------------------------------ 6. secrets
# (read the log first: the queries below name what they look for)
my $log = slurp_file($node->logfile);
my $basic = encode_base64("my+client:$SECRET_ENCODED", '');
ok(index($log, $SECRET) < 0, 'server log: no client secret');
ok(index($log, $SECRET_ENCODED) < 0, 'server log: no form-urlencoded client secret');
ok(index($log, $basic) < 0, 'server log: no Basic credentials');
ok(index($log, 'tok-') < 0, 'server log: no access token');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE last_error LIKE '%tok-%'}), '0',
	'messages.last_error: no access token');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.messages m WHERE m::text LIKE '%tok-%' OR m::text LIKE '%s3cr%'}), '0',
	'messages: no access token and no secret in any column');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.attempts a WHERE a::text LIKE '%tok-%' OR a::text LIKE '%s3cr%'}), '0',
	'attempt log: no access token and no secret');

$node->safe_psql('postgres', 'CREATE ROLE oauth_monitor LOGIN IN ROLE outbox_monitor');
my ($out, $err) = ('', '');
my $rc = $node->psql('postgres', q{SELECT oauth_client_secret FROM outbox.endpoints},
	stdout => \$out, stderr => \$err, extra_params => [ '-U', 'oauth_monitor' ]);
isnt($rc, 0, 'outbox_monitor: SELECT oauth_client_secret fails');
like($err, qr/permission denied/, 'outbox_monitor: permission denied for oauth_client_secret');
is($out, '', 'outbox_monitor: and got no secret');
($out, $err) = ('', '');
$rc = $node->psql('postgres', q{SELECT oauth_token_url FROM outbox.endpoints WHERE name = 'oa'},
	stdout => \$out, stderr => \$err, extra_params => [ '-U', 'oauth_monitor' ]);
is("$rc $out", '0 ' . $sink->url('/token'), 'outbox_monitor: can read oauth_token_url') or diag($err);

$sink->stop;
$node->stop;
done_testing();
