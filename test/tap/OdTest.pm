
=pod

=head1 NAME

OdTest - small helpers shared by the outbox_dispatcher TAP tests

=head1 SYNOPSIS

  use lib 'test/tap';
  use OdTest qw(poll_until wait_workers_cycled sql_quote);

  ok(poll_until($node, 'SELECT count(*) FROM outbox.messages WHERE status = \'done\'', '100', 30));
  $node->safe_psql('postgres', "ALTER SYSTEM SET outbox_dispatcher.batch_size = 3; SELECT pg_reload_conf()");
  ok(wait_workers_cycled($node), 'every worker went through its loop since');

=head1 DESCRIPTION

poll_until($node, $sql, $expected, $timeout = 30, $db = 'postgres') runs
$sql every 50 ms until it returns $expected (string comparison) and returns
1, or returns 0 after $timeout seconds with a diag() of the last result.
Errors (e.g. while the server restarts after a crash) count as "not yet".

wait_workers_cycled($node) waits until every worker has started another
loop iteration (outbox.worker_stats.cycles went up): a reload signalled
before the call has then been processed.  It signals one more reload
itself (pg_reload_conf(), which sets every worker's latch): a paused or
idle worker sleeps until something wakes it, not every poll_interval.

sql_quote($s) quotes a string as an SQL literal.

=cut

package OdTest;

use strict;
use warnings;

use Exporter 'import';
use Test::More;
use Time::HiRes qw(time sleep);

our @EXPORT_OK = qw(poll_until wait_workers_cycled sql_quote);

sub poll_until
{
	my ($node, $sql, $expected, $timeout, $db) = @_;
	$timeout //= 30;
	$db //= 'postgres';
	my $deadline = time + $timeout;
	my $last = '';
	while (1)
	{
		my $out;
		my $ok = eval { $out = $node->safe_psql($db, $sql); 1 };
		$last = $ok ? $out : "(error: $@)";
		return 1 if $ok && $out eq $expected;
		if (time >= $deadline)
		{
			diag("poll_until timed out after ${timeout}s: [$sql] returned [$last], expected [$expected]");
			return 0;
		}
		sleep 0.05;
	}
}

sub wait_workers_cycled
{
	my ($node) = @_;
	my $before = $node->safe_psql('postgres',
		q{SELECT string_agg(worker || ':' || cycles, ',' ORDER BY worker) FROM outbox.worker_stats});
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
	my $cond = join(' AND ',
		map { my ($w, $c) = split /:/; "bool_or(worker = $w AND cycles >= $c + 1)" }
		  split /,/, $before);
	return poll_until($node, "SELECT $cond FROM outbox.worker_stats", 't', 20);
}

sub sql_quote
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

1;
