
=pod

=head1 NAME

OdSink - start and drive test/sink/sink.py (scriptable HTTP sink) from TAP tests

=head1 SYNOPSIS

  use lib 'test/tap';          # or: use FindBin; use lib $FindBin::RealBin;
  use OdSink;

  my $sink = OdSink->start($node->basedir);    # any writable directory
  my $fixed = OdSink->start($dir, name => 'b', port => 20123);   # a given port (host => ... too)
  my $url  = $sink->url('/hook');               # http://127.0.0.1:PORT/hook
  $sink->script({ path => '/hook', fail_first => 2, fail_status => 503,
                  retry_after => '1' });
  ... enqueue messages, let the workers deliver ...
  $sink->wait_requests(10, path => '/hook', timeout => 30) or die;
  my $reqs = $sink->requests('/hook');          # arrayref, arrival order
  is($reqs->[0]{headers_lc}{'idempotency-key'}, $id);
  is(OdSink::header($reqs->[0], 'ce-type'), 'order.created');
  my $stats = $sink->stats;                     # {total, by_path, distinct_ids, duplicates, ...}
  my $ids   = $sink->ids('/hook');              # {idempotency_key => count}
  $sink->reset;
  $sink->stop;                                  # also done by DESTROY / END

=head1 DESCRIPTION

Starts F<test/sink/sink.py> (located relative to this file) with
F</usr/bin/python3> on 127.0.0.1 and a free port, waits up to 10 s for its
port file, and talks to its control API with HTTP::Tiny / JSON::PP (core
modules only).  Files in the directory given to start(): C<NAME.port>,
C<NAME.requests.jsonl> (every recorded request, one JSON object a line) and
C<NAME.log> (the sink's stdout/stderr); NAME defaults to C<sink>.  Options:
name, port (default 0: any free port), host (default 127.0.0.1), log, verbose,
timeout (seconds to wait for the port file).

The sink is started with C<--watch-pid $$>, so it also goes away if the test
process dies without running END blocks.  stop() only acts in the process
that started the sink (forked children, e.g. from IPC::Run, leave it alone).

Recorded request fields: seq, status, path, query, method, headers (names as
received), headers_lc (lower-cased names: use these for lookups), body
(decoded character string), t (arrival, float unix seconds).  See the
docstring of sink.py for every script field and mode.

=cut

package OdSink;

use strict;
use warnings;

use Carp qw(croak);
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use File::Spec;
use HTTP::Tiny;
use JSON::PP;
use POSIX qw(WNOHANG);
use Scalar::Util qw(weaken refaddr);
use Time::HiRes ();

our $PYTHON = '/usr/bin/python3';
our $SINK_PY = File::Spec->catfile(dirname(abs_path(__FILE__)), File::Spec->updir, 'sink', 'sink.py');
$SINK_PY = abs_path($SINK_PY) // $SINK_PY;

my $JSON = JSON::PP->new->utf8->canonical;
my %LIVE;    # refaddr => weak ref to every started sink, for END

# numeric script fields: make sure Perl strings are sent as JSON numbers
my %NUMERIC = map { $_ => 1 } qw(status delay_ms fail_first fail_status body_bytes);

sub start
{
	my ($class, $dir, %opt) = @_;
	croak 'OdSink->start($dir): directory required' unless defined $dir && length $dir;
	make_path($dir) unless -d $dir;
	$dir = abs_path($dir);
	croak "OdSink: $SINK_PY not found" unless -f $SINK_PY;

	my $name = $opt{name} // 'sink';
	my $portfile = "$dir/$name.port";
	my $logfile = exists $opt{log} ? $opt{log} : "$dir/$name.requests.jsonl";
	my $outfile = "$dir/$name.log";
	unlink $portfile;

	my $host = $opt{host} // '127.0.0.1';
	my @cmd = ($PYTHON, $SINK_PY, '--host', $host, '--port', $opt{port} // 0, '--port-file', $portfile,
		'--watch-pid', $$);
	push @cmd, '--log', $logfile if defined $logfile && length $logfile;
	push @cmd, '--verbose' if $opt{verbose};

	my $pid = fork();
	croak "OdSink: fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		# child: never return into the test script (no END blocks, no DESTROY)
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', $outfile) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		{
			no warnings 'exec';
			exec { $cmd[0] } @cmd;
		}
		print STDERR "OdSink: exec $cmd[0] failed: $!\n";
		POSIX::_exit(127);
	}

	my $self = bless {
		pid => $pid,
		owner => $$,
		dir => $dir,
		name => $name,
		port_file => $portfile,
		log_file => $logfile,
		out_file => $outfile,
	}, $class;
	$LIVE{ refaddr $self } = $self;
	weaken($LIVE{ refaddr $self });

	my $deadline = Time::HiRes::time() + ($opt{timeout} // 10);
	my $port;
	while (Time::HiRes::time() < $deadline)
	{
		if (-s $portfile && open(my $fh, '<', $portfile))
		{
			my $line = <$fh>;
			close $fh;
			if (defined $line && $line =~ /^(\d+)\s*$/)
			{
				$port = $1;
				last;
			}
		}
		if (waitpid($pid, WNOHANG) == $pid)
		{
			delete $self->{pid};
			croak "OdSink: sink.py exited during start (status $?): " . _slurp($outfile);
		}
		Time::HiRes::sleep(0.05);
	}
	unless ($port)
	{
		$self->stop;
		croak "OdSink: no port file $portfile after 10 s: " . _slurp($outfile);
	}
	croak "OdSink: sink.py listens on port $port, not $opt{port}" if $opt{port} && $port != $opt{port};
	$self->{port} = $port;
	$self->{base} = "http://$host:$port";
	$self->{http} = HTTP::Tiny->new(
		timeout => 30,
		keep_alive => 1,
		proxy => undef,
		http_proxy => undef,
		https_proxy => undef,
		agent => 'OdSink/1',);
	return $self;
}

sub port      { $_[0]{port} }
sub pid       { $_[0]{pid} }
sub base_url  { $_[0]{base} }
sub log_file  { $_[0]{log_file} }
sub url       { my ($self, $path) = @_; $path //= '/'; return $self->{base} . $path; }

# $sink->script({path => '/p', status => 500, ...}) or ->script(path => '/p', ...)
# or ->script([{...}, {...}]).  Returns the normalised script(s).
sub script
{
	my $self = shift;
	my $arg = @_ == 1 ? $_[0] : {@_};
	my @docs = ref $arg eq 'ARRAY' ? @$arg : ($arg);
	for my $d (@docs)
	{
		croak 'OdSink->script: hashref with a path required' unless ref $d eq 'HASH' && defined $d->{path};
		$d = {%$d};
		for my $k (keys %$d)
		{
			$d->{$k} += 0 if $NUMERIC{$k} && defined $d->{$k};
			$d->{$k} = "$d->{$k}" if $k eq 'retry_after' && defined $d->{$k};
		}
	}
	my $r = $self->_call(POST => '/_control/script', ref $arg eq 'ARRAY' ? \@docs : $docs[0]);
	return $r->{script};
}

sub reset     { $_[0]->_call(POST => '/_control/reset', {}); return 1; }
sub requests  { my ($self, $path, %q) = @_; return $self->_call(GET => '/_control/requests', undef, { path => $path, %q }); }
sub stats     { my ($self, $path) = @_; return $self->_call(GET => '/_control/stats', undef, { path => $path }); }
sub ids       { my ($self, $path) = @_; return $self->_call(GET => '/_control/ids', undef, { path => $path }); }
sub scripts   { $_[0]->_call(GET => '/_control/scripts'); }

# Block until at least $count requests (to path => $p, if given) were
# recorded, or timeout => $s (default 10) passes.  Returns true when reached;
# in list context also the current count.
sub wait_requests
{
	my ($self, $count, %opt) = @_;
	my $timeout = $opt{timeout} // 10;
	my $http = $self->{http};
	my $old = $http->timeout;
	$http->timeout($timeout + 30);
	my $r = eval {
		$self->_call(GET => '/_control/wait', undef,
			{ count => $count, path => $opt{path}, timeout => $timeout });
	};
	my $err = $@;
	$http->timeout($old);
	die $err if $err;
	return wantarray ? ($r->{ok} ? 1 : 0, $r->{count}) : ($r->{ok} ? 1 : 0);
}

# OdSink::header($request, 'Idempotency-Key'): case-insensitive header lookup
sub header
{
	my ($req, $name) = @_;
	return $req->{headers_lc}{ lc $name };
}

sub stop
{
	my ($self) = @_;
	local ($?, $!, $@);
	my $pid = delete $self->{pid};
	return unless $pid && ($self->{owner} // 0) == $$;
	delete $self->{http};
	if (kill('TERM', $pid))
	{
		my $deadline = Time::HiRes::time() + 5;
		while (Time::HiRes::time() < $deadline)
		{
			my $w = waitpid($pid, WNOHANG);
			last if $w == $pid || $w == -1;
			Time::HiRes::sleep(0.02);
		}
		if (kill(0, $pid) && waitpid($pid, WNOHANG) == 0)
		{
			kill('KILL', $pid);
			waitpid($pid, 0);
		}
	}
	unlink $self->{port_file};
	return 1;
}

sub DESTROY
{
	my ($self) = @_;
	delete $LIVE{ refaddr $self };
	$self->stop;
}

END
{
	local $?;
	for my $s (grep { defined } values %LIVE)
	{
		$s->stop;
	}
}

sub _call
{
	my ($self, $method, $path, $body, $query) = @_;
	croak 'OdSink: sink is not running' unless $self->{http} && $self->{pid};
	my $url = $self->{base} . $path;
	if ($query)
	{
		my @q = map { "$_=" . _uri_escape($query->{$_}) } grep { defined $query->{$_} } sort keys %$query;
		$url .= '?' . join('&', @q) if @q;
	}
	my %o;
	if (defined $body)
	{
		$o{content} = $JSON->encode($body);
		$o{headers} = { 'Content-Type' => 'application/json' };
	}
	my $res = $self->{http}->request($method, $url, \%o);
	unless ($res->{success})
	{
		my $why = $res->{status} == 599 ? $res->{content} : "$res->{status} $res->{reason}: $res->{content}";
		croak "OdSink: $method $path failed: $why";
	}
	my $out = eval { $JSON->decode($res->{content}) };
	croak "OdSink: $method $path: invalid JSON answer: $@" if $@;
	return $out;
}

sub _uri_escape
{
	my ($s) = @_;
	utf8::encode($s) if utf8::is_utf8($s);
	$s =~ s/([^A-Za-z0-9\-._~\/])/sprintf('%%%02X', ord $1)/ge;
	return $s;
}

sub _slurp
{
	my ($f) = @_;
	open(my $fh, '<', $f) or return '';
	local $/;
	my $c = <$fh>;
	close $fh;
	return $c // '';
}

1;
