# Copyright: outbox_dispatcher contributors
#
# 068_egress.pl — where the workers may connect, through what, and with
# which client certificate, end to end through the background workers.
#
# Proves:
#   - by default (outbox_dispatcher.denied_networks) a delivery to
#     169.254.169.254 (cloud metadata) is refused by the dispatcher before any
#     packet leaves: retried, last_error says which address and which list;
#   - the check is on the resolved address: "localhost" is refused once
#     loopback is denied (a name cannot get around it), nothing reaches the
#     sink, and the keep-alive connection opened before the change is not
#     reused; outbox_dispatcher.allowed_networks refuses what it does not
#     list; back to the defaults, the same messages are delivered;
#   - endpoints.proxy: a delivery to an unresolvable host arrives at the proxy
#     (the sink) in absolute form, with its headers and body;
#     outbox_dispatcher.proxy does the same for every endpoint without one;
#   - endpoints.client_cert/client_key: an nginx requiring a client
#     certificate signed by the test CA answers 200 to the endpoint that
#     presents one (and sees its subject) and 400 to one that does not.
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use File::Path qw(make_path);
use Cwd ();

use OdNode;
use OdSink;
use OdTest qw(poll_until wait_workers_cycled sql_quote);

# ------------------------------------------------------------------ a CA, a server and a client certificate
my $tls = Cwd::abs_path(PostgreSQL::Test::Utils::tempdir('tls'));
sub openssl { system('openssl', @_, '-quiet') == 0 or system('openssl', @_) == 0 or die "openssl @_ failed" }
for my $cmd (
	"req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=outbox-test-ca -keyout $tls/ca.key -out $tls/ca.pem",
	"req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout $tls/server.key -out $tls/server.csr",
	"req -newkey rsa:2048 -nodes -subj /CN=outbox-client -keyout $tls/client.key -out $tls/client.csr")
{
	system("openssl $cmd >/dev/null 2>&1") == 0 or die "openssl $cmd failed";
}
open(my $ext, '>', "$tls/san.ext") or die;
print $ext "subjectAltName=IP:127.0.0.1\n";
close $ext;
system("openssl x509 -req -in $tls/server.csr -CA $tls/ca.pem -CAkey $tls/ca.key -CAcreateserial -days 2 "
	  . "-extfile $tls/san.ext -out $tls/server.pem >/dev/null 2>&1") == 0 or die 'server certificate';
system("openssl x509 -req -in $tls/client.csr -CA $tls/ca.pem -CAkey $tls/ca.key -CAcreateserial -days 2 "
	  . "-out $tls/client.pem >/dev/null 2>&1") == 0 or die 'client certificate';

# ------------------------------------------------------------------ nginx asking for a client certificate
my $ngx = "$tls/nginx";
make_path("$ngx/logs");
my $tls_port = PostgreSQL::Test::Cluster::get_free_port();
open(my $nc, '>', "$tls/nginx.conf") or die;
print $nc <<"CONF";
worker_processes 1;
pid $ngx/nginx.pid;
error_log $ngx/logs/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $ngx/body;
    proxy_temp_path $ngx/proxy;
    fastcgi_temp_path $ngx/fastcgi;
    uwsgi_temp_path $ngx/uwsgi;
    scgi_temp_path $ngx/scgi;
    server {
        listen 127.0.0.1:$tls_port ssl;
        ssl_certificate $tls/server.pem;
        ssl_certificate_key $tls/server.key;
        ssl_client_certificate $tls/ca.pem;
        ssl_verify_client on;
        location / { return 200 "client \$ssl_client_s_dn"; }
    }
}
CONF
close $nc;
system('nginx', '-c', "$tls/nginx.conf", '-p', $ngx, '-e', "$ngx/logs/error.log") == 0 or die 'nginx did not start';

# ------------------------------------------------------------------ the cluster
my $node = OdNode->create(
	'egress', conf => qq{
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.max_attempts = 1000
outbox_dispatcher.backoff_base = 50ms
outbox_dispatcher.backoff_cap = 200ms
outbox_dispatcher.ca_file = '$tls/ca.pem'
});
my $sink = OdSink->start($node->basedir);

sub reload_with
{
	my (%set) = @_;
	for my $k (sort keys %set)
	{
		my $v = $set{$k};
		$node->safe_psql('postgres',
			defined $v ? "ALTER SYSTEM SET outbox_dispatcher.$k = " . sql_quote($v)
			           : "ALTER SYSTEM RESET outbox_dispatcher.$k");
	}
	$node->reload;
	for my $k (sort keys %set)
	{
		poll_until($node, "SELECT current_setting('outbox_dispatcher.$k') = " . sql_quote($set{$k} // ''), 't', 10)
		  if defined $set{$k} || 1;
	}
	ok(wait_workers_cycled($node), 'workers went through their loop after the reload: ' . join(', ', sort keys %set));
}

sub last_error { $node->safe_psql('postgres', "SELECT coalesce(last_error, '') FROM outbox.messages WHERE id = $_[0]") }

# ------------------------------------------------------------------ 1. cloud metadata is refused by default
$node->safe_psql('postgres', q{INSERT INTO outbox.endpoints (name, url, timeout, breaker_threshold)
                               VALUES ('metadata', 'http://169.254.169.254/latest/meta-data/', '2s', 0)});
my $md = $node->safe_psql('postgres', q{SELECT outbox.enqueue('vm', '1', 'probe', '{}', 'metadata')});
ok(poll_until($node, "SELECT attempts >= 2 FROM outbox.messages WHERE id = $md", 't', 20), 'metadata: attempted and retried');
like(last_error($md), qr/connection refused by the dispatcher: 169\.254\.169\.254 is in outbox_dispatcher\.denied_networks/,
	'metadata: refused by denied_networks, and the error says so');
$node->safe_psql('postgres', q{SELECT outbox.pause_endpoint('metadata')});

# ------------------------------------------------------------------ 2. the resolved address is what counts
my $port = $sink->port;
$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url, breaker_threshold)
                               VALUES ('local', 'http://localhost:$port/local', 0)");
my $first = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', '1', 'e', '{}', 'local')});
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $first", 'done', 20),
	'localhost: delivered under the defaults (a keep-alive connection is open now)');
my $before = scalar @{ $sink->requests('/local') };

reload_with(denied_networks => '127.0.0.0/8, ::1/128');
my $denied = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', '2', 'e', '{}', 'local')});
ok(poll_until($node, "SELECT attempts >= 2 FROM outbox.messages WHERE id = $denied", 't', 20), 'localhost denied: retried');
like(last_error($denied), qr/connection refused by the dispatcher: (127\.0\.0\.1|::1) is in outbox_dispatcher\.denied_networks/,
	'localhost denied: the resolved loopback address is refused, whatever the name');
is(scalar @{ $sink->requests('/local') }, $before, 'localhost denied: nothing reached the sink (the old connection was not reused)');

reload_with(denied_networks => undef, allowed_networks => '10.0.0.0/8');
my $not_allowed = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', '3', 'e', '{}', 'local')});
ok(poll_until($node, "SELECT last_error LIKE '%is not in outbox_dispatcher.allowed_networks%' FROM outbox.messages WHERE id = $not_allowed",
		't', 20), 'allowed_networks: an address it does not list is refused');
is(scalar @{ $sink->requests('/local') }, $before, 'allowed_networks: nothing reached the sink');

reload_with(allowed_networks => undef);
ok(poll_until($node, "SELECT count(*) FROM outbox.messages WHERE id IN ($denied, $not_allowed) AND status = 'done'", '2', 20),
	'back to the defaults: the refused messages are delivered');

# ------------------------------------------------------------------ 3. through a proxy
$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url, proxy, breaker_threshold)
                               VALUES ('proxied', 'http://target.invalid:8080/hook?x=1', '" . $sink->url('') . "', 0)");
my $px = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', 'p', 'order.proxied', '{"via": "proxy"}', 'proxied')});
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $px", 'done', 20), 'proxied: delivered');
my ($preq) = @{ $sink->requests('/hook', id => $px) };
is($preq->{target} // '', 'http://target.invalid:8080/hook?x=1', 'proxied: the proxy got the request in absolute form');
is(OdSink::header($preq, 'ce-type'), 'order.proxied', 'proxied: with its headers');
is($preq->{body}, '{"via": "proxy"}', 'proxied: and its body');

reload_with(proxy => $sink->url(''));
$node->safe_psql('postgres', q{INSERT INTO outbox.endpoints (name, url, breaker_threshold)
                               VALUES ('global', 'http://global.invalid/viaglobal', 0)});
my $gx = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', 'g', 'e', '{}', 'global')});
ok(poll_until($node, "SELECT status FROM outbox.messages WHERE id = $gx", 'done', 20), 'outbox_dispatcher.proxy: delivered');
my ($greq) = @{ $sink->requests('/viaglobal', id => $gx) };
is($greq->{target} // '', 'http://global.invalid/viaglobal', 'outbox_dispatcher.proxy: through the proxy');
reload_with(proxy => undef);

# ------------------------------------------------------------------ 4. TLS client certificates
my $cert = slurp_file("$tls/client.pem");
my $key = slurp_file("$tls/client.key");
$node->safe_psql('postgres', "INSERT INTO outbox.endpoints (name, url, client_cert, client_key, breaker_threshold) VALUES
  ('mtls', 'https://127.0.0.1:$tls_port/in', " . sql_quote($cert) . ', ' . sql_quote($key) . ", 0),
  ('nocert', 'https://127.0.0.1:$tls_port/in', NULL, NULL, 0)");
my $m1 = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', 'm', 'e', '{}', 'mtls')});
my $m2 = $node->safe_psql('postgres', q{SELECT outbox.enqueue('o', 'n', 'e', '{}', 'nocert')});
ok(poll_until($node, "SELECT status || ' ' || last_http_status FROM outbox.messages WHERE id = $m1", 'done 200', 20),
	'mtls: the client certificate was accepted (200)');
ok(poll_until($node, "SELECT status || ' ' || last_http_status FROM outbox.messages WHERE id = $m2", 'dead 400', 20),
	'nocert: refused by the server without a client certificate (400, dead)');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox.messages WHERE id = $m2"), qr/No required SSL certificate/,
	'nocert: the server said why');
# (the test's own INSERT is in the log: the test setup logs every statement)
my @worker_lines = grep { /outbox_dispatcher/ && !/ statement: / } split /\n/, slurp_file($node->logfile);
ok(!grep({ /PRIVATE KEY|CERTIFICATE-----/ } @worker_lines), 'no line the dispatcher logged holds the key or the certificate');

system('nginx', '-c', "$tls/nginx.conf", '-p', $ngx, '-s', 'stop');
$sink->stop;
$node->stop;
done_testing();
