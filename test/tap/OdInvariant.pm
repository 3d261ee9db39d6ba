
=pod

=head1 NAME

OdInvariant - the "nothing is lost" invariant for fault-injection TAP tests

=head1 SYNOPSIS

  use lib 'test/tap';
  use OdSink;
  use OdInvariant qw(wait_settled check_invariant poll_until);

  ok(wait_settled($node, timeout => 60), 'every message settled');
  my $r = check_invariant($node, $sink,
                          scenario   => 'worker SIGKILL',
                          dead_ok    => sub { my ($row) = @_; 0 },   # which dead rows are legitimate
                          dup_reason => 'crash');                     # what may explain duplicates
  # $r = { messages => N, done => N, dead => N, duplicates => N, duplicate_ids => [...] }

=head1 DESCRIPTION

check_invariant() asserts, with Test::More, for every committed message:

=over

=item * status is C<done> and the sink received its id at least once, or

=item * status is C<dead>, C<last_error> is not empty, and the scenario's
C<dead_ok> callback accepts the row (default: no dead row is legitimate);

=item * no message is C<processing> with an expired lease, and none is
C<pending> with C<available_at> in the past (wait_settled() first).

=back

It then reports duplicates (requests beyond the first per Idempotency-Key)
with C<diag>, and asserts that duplicates only occur when the scenario says
what explains them (C<dup_reason>: a crash, a lease takeover, an abandoned
request): a scenario without a reason must have none.

=cut

package OdInvariant;

use strict;
use warnings;

use Exporter 'import';
use Test::More;
use Time::HiRes qw(time sleep);

use OdTest qw(poll_until);

our @EXPORT_OK = qw(wait_settled check_invariant poll_until enqueue_n wait_in_flight);


# Enqueue n messages ('order', '<tag>-<g>', 'order.<tag>') in one statement.
sub enqueue_n
{
	my ($node, $n, $tag) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(outbox.enqueue('order', '$tag-' || g, 'order.$tag',
		                                jsonb_build_object('n', g, 'tag', '$tag')))
		     FROM generate_series(1, $n) AS g});
}

# Wait until the sink has requests open and a worker reports requests in
# flight; returns (worker pid, its in_flight, sink in_flight) or ().
sub wait_in_flight
{
	my ($node, $sink, $timeout) = @_;
	my $deadline = time() + ($timeout // 20);
	while (time() < $deadline)
	{
		my $open = $sink->stats->{in_flight} // 0;
		if ($open > 0)
		{
			my $row = $node->safe_psql('postgres',
				q{SELECT pid, in_flight FROM outbox.worker_stats
				   WHERE pid IS NOT NULL AND in_flight > 0 ORDER BY in_flight DESC LIMIT 1});
			if ($row ne '')
			{
				my ($pid, $n) = split /\|/, $row;
				return ($pid, $n, $open);
			}
		}
		sleep(0.02);
	}
	return ();
}

# Wait until no message is pending (due) or processing.
sub wait_settled
{
	my ($node, %opt) = @_;
	my $timeout = $opt{timeout} // 60;
	return poll_until($node,
		q{SELECT count(*) FROM outbox.messages WHERE status IN ('pending', 'processing')},
		'0', $timeout);
}

sub check_invariant
{
	my ($node, $sink, %opt) = @_;
	my $scenario = $opt{scenario} // 'scenario';
	my $dead_ok = $opt{dead_ok} // sub { 0 };
	my $path = $opt{path};

	my $rows = $node->safe_psql('postgres', q{
		SELECT id, status, attempts, coalesce(last_error, ''), coalesce(last_http_status, 0),
		       (status = 'processing' AND lease_until < now())::int,
		       (status = 'pending' AND available_at <= now())::int
		  FROM outbox.messages ORDER BY id});
	my $ids = $sink->ids($path) // {};

	my %r = (messages => 0, done => 0, dead => 0, pending => 0, processing => 0,
	         duplicates => 0, duplicate_ids => []);
	my (@lost, @bad_dead, @stuck);
	for my $line (split /\n/, $rows)
	{
		my ($id, $status, $attempts, $err, $http, $expired, $due) = split /\|/, $line, 7;
		$r{messages}++;
		$r{$status}++;
		if ($status eq 'done')
		{
			push @lost, $id unless ($ids->{$id} // 0) >= 1;
		}
		elsif ($status eq 'dead')
		{
			my $row = { id => $id, attempts => $attempts, last_error => $err, last_http_status => $http };
			push @bad_dead, "$id ($err)" unless length $err && $dead_ok->($row);
		}
		else
		{
			push @stuck, "$id $status" if $expired || $due || $status eq 'processing';
		}
	}
	for my $id (sort { $a <=> $b } keys %$ids)
	{
		my $extra = $ids->{$id} - 1;
		next unless $extra > 0;
		$r{duplicates} += $extra;
		push @{ $r{duplicate_ids} }, $id;
	}

	ok($r{messages} > 0, "$scenario: messages were committed ($r{messages})");
	is(scalar(@lost), 0, "$scenario: every done message was received by the endpoint")
	  or diag('done but never received: ' . join(', ', @lost[0 .. ($#lost < 9 ? $#lost : 9)]));
	is(scalar(@bad_dead), 0, "$scenario: dead only where the scenario makes it legitimate, always with a reason")
	  or diag('unexpected dead: ' . join('; ', @bad_dead[0 .. ($#bad_dead < 9 ? $#bad_dead : 9)]));
	is(scalar(@stuck), 0, "$scenario: nothing stuck in processing or due-but-pending")
	  or diag('stuck: ' . join(', ', @stuck[0 .. ($#stuck < 9 ? $#stuck : 9)]));
	diag(sprintf('%s: %d messages, %d done, %d dead, %d duplicate deliveries%s',
		$scenario, $r{messages}, $r{done}, $r{dead}, $r{duplicates},
		$r{duplicates} ? ' (ids ' . join(',', @{ $r{duplicate_ids} }[0 .. ($#{ $r{duplicate_ids} } < 9 ? $#{ $r{duplicate_ids} } : 9)]) . ')' : ''));
	if (!$opt{dup_reason})
	{
		is($r{duplicates}, 0, "$scenario: no duplicate deliveries without a crash or takeover to explain them");
	}
	else
	{
		diag("$scenario: duplicates allowed here, explained by: $opt{dup_reason}");
	}
	return \%r;
}

1;
