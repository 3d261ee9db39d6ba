
=pod

=head1 NAME

OdNode - a PostgreSQL::Test::Cluster with outbox_dispatcher loaded, and the
helpers every TAP test of the extension needs

=head1 SYNOPSIS

  use lib 'test/tap';
  use OdNode;

  my $node = OdNode->create('delivery', conf => q{
  outbox_dispatcher.workers = 2
  outbox_dispatcher.poll_interval = 100ms
  });                                   # init, preload, start, CREATE EXTENSION
  $node->add_endpoint('default', $sink->url('/hook'), timeout => '5 s');
  my @ids = $node->enqueue_n(100, endpoint => 'default', tag => 'a');
  ok($node->poll(q{SELECT count(*) FROM outbox.messages WHERE status = 'done'}, '100', 30));
  my $pids = $node->worker_pids;        # "123,124"
  my $url = 'http://127.0.0.1:' . OdNode::closed_port() . '/nobody';

=head1 DESCRIPTION

create($name, %opt) makes a node with C<shared_preload_libraries =
'outbox_dispatcher'> plus the text of C<conf> appended to postgresql.conf,
starts it and runs C<CREATE EXTENSION outbox_dispatcher> in database
postgres.  Options: C<conf> (postgresql.conf lines), C<init> (extra initdb
arguments, an array ref), C<streaming> (1: a primary that standbys can
stream from), C<start> (default 1; 0 leaves the node stopped and
the extension not created), C<extension> (default 1; 0 skips CREATE
EXTENSION, a string is used as the statement, e.g. with VERSION).

standby($name, %opt) takes a base backup of this (streaming) node and
returns a started streaming standby of it, an OdNode too (the library
preloaded, as on the primary); C<conf> lines are appended to its
postgresql.conf first.

add_endpoint($name, $url, %columns) inserts an endpoint (other columns of
outbox.endpoints as given, quoted as literals); returns its id.

enqueue_n($n, %opt) enqueues $n messages with outbox.enqueue() in one
statement (endpoint, default 'default'; tag, the aggregate_type and event
prefix, default 'order'; ordered) and returns their ids in order.

poll($sql, $expected, $timeout, $db) is OdTest::poll_until on this node.

worker_pids() returns the pids of the dispatcher workers, comma-separated,
ascending ('' when none runs).

closed_port() (a function) returns a loopback port nobody listens on.

=cut

package OdNode;

use strict;
use warnings;

use parent -norequire, 'PostgreSQL::Test::Cluster';
use PostgreSQL::Test::Cluster;
use IO::Socket::INET;

use OdTest qw(poll_until sql_quote);

sub create
{
	my ($class, $name, %opt) = @_;
	my $node = $class->new($name);
	$node->init(($opt{init} ? (extra => $opt{init}) : ()), ($opt{streaming} ? (allows_streaming => 1) : ()));
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'outbox_dispatcher'\n" . ($opt{conf} // ''));
	return $node if defined $opt{start} && !$opt{start};
	$node->start;
	my $ext = $opt{extension} // 1;
	$node->safe_psql('postgres', $ext eq '1' ? 'CREATE EXTENSION outbox_dispatcher' : $ext) if $ext;
	return $node;
}

sub standby
{
	my ($self, $name, %opt) = @_;
	my $backup = "for_$name";
	$self->backup($backup);
	my $standby = (ref $self)->new($name);
	$standby->init_from_backup($self, $backup, has_streaming => 1);
	$standby->append_conf('postgresql.conf', $opt{conf}) if $opt{conf};
	$standby->start;
	return $standby;
}

sub add_endpoint
{
	my ($self, $name, $url, %cols) = @_;
	my @names = ('name', 'url', sort keys %cols);
	my @values = map { sql_quote($_) } ($name, $url, map { $cols{$_} } sort keys %cols);
	return $self->safe_psql('postgres',
		'INSERT INTO outbox.endpoints (' . join(', ', @names) . ') VALUES (' . join(', ', @values) . ') RETURNING id');
}

sub enqueue_n
{
	my ($self, $n, %opt) = @_;
	my $endpoint = sql_quote($opt{endpoint} // 'default');
	my $tag = $opt{tag} // 'order';
	my $ordered = $opt{ordered} ? 'true' : 'false';
	my $out = $self->safe_psql(
		'postgres', sprintf(
			q{SELECT outbox.enqueue(%s, g::text, %s, jsonb_build_object('n', g), %s, %s)
			    FROM generate_series(1, %d) AS g ORDER BY g},
			sql_quote($tag), sql_quote("$tag.created"), $endpoint, $ordered, $n));
	return split /\n/, $out;
}

sub poll
{
	my ($self, $sql, $expected, $timeout, $db) = @_;
	return poll_until($self, $sql, $expected, $timeout, $db);
}

sub worker_pids
{
	my ($self) = @_;
	return $self->safe_psql('postgres',
		q{SELECT coalesce(string_agg(pid::text, ',' ORDER BY pid), '') FROM pg_stat_activity
		   WHERE backend_type = 'outbox_dispatcher worker'});
}

sub closed_port
{
	my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 1)
	  or die "cannot bind: $!";
	my $port = $s->sockport;
	close $s;
	return $port;
}

1;
