# Copyright: outbox_dispatcher contributors
#
# 050_search_path.pl — nothing a producer plants in schema public ever runs
# inside the extension (docs/security.md, "Classes of attack": the workers run
# with search_path = pg_catalog, pg_temp and every statement of the extension
# is schema-qualified or pinned).
#
# The threat: the extension's SQL (the workers' SPI statements, the SPI
# statements of the C-language SQL functions, the PL/pgSQL and SQL-language
# functions) parsed with a session's search_path ("$user", public).  Where a
# call needs an implicit coercion because pg_catalog has no exact match for
# the argument types (numeric * integer, format(unknown, integer, integer),
# unnest(text[]) against unnest(anyarray), ...), a better-matching object in
# public wins.  In PostgreSQL 15 public belongs to the database owner, and
# here the database owner is the producer role `app`.
#
# Setup: one cluster, 2 workers; `app` (LOGIN, outbox_producer) owns database
# postgres and schema public; `dispatcher` (LOGIN, outbox_admin) is the
# workers' role in the first variant, the bootstrap superuser in the second;
# `ops` (LOGIN, outbox_admin) is an operator.  As `app`, hijack candidates are
# planted in public, generated from the catalogs, not written by hand:
#   - operators: every operator symbol found in the extension's SQL texts
#     (string literals of src/*.cpp, sql/outbox_dispatcher--*.sql), plus a
#     fixed baseline, for every pair of types from a fixed list T where
#     pg_catalog has no exact operator but one reachable through implicit
#     casts (pg_cast castcontext 'i', same type, or a polymorphic match);
#   - functions and aggregates: every pg_catalog function name the texts
#     call as name(...) (plus a baseline), one public overload per
#     combination of argument types from T that implicitly cast to a
#     pg_catalog overload's arguments (up to 3 arguments; variadic "any":
#     1 or 2 arguments from a short list), skipping exact pg_catalog
#     signatures.
# Return types are the ones the parser resolves for the shadowed pg_catalog
# call.  Every planted function is SECURITY INVOKER, VOLATILE, and when it
# runs it leaves evidence that survives a rollback or missing privileges:
# RAISE WARNING 'HIJACK ...' (server log) and an INSERT into public.hijack_log
# (INSERT granted to PUBLIC); it also tries ALTER ROLE app SUPERUSER and to
# copy outbox.endpoints.signing_secret into public.hijack_log.
#
# Then every code path runs with the planted objects in place, once with the
# workers as `dispatcher` and once as the bootstrap superuser: endpoint
# refresh, deliveries (200, signed, endpoint and message headers), retry
# (503 then 200), dead (404), defer (409 in defer_statuses), 410 Gone
# (endpoint disabled, then resume_endpoint), ordered messages, lease expiry
# and reap to dead (a request that hangs past the 2 s lease with
# max_attempts 1), the retention purge of worker 0 (retention 1 s); every SQL
# function of schema outbox and every view, called by a superuser session
# and by an outbox_admin session with the default search_path; enqueue and
# plain INSERT as `app`.
#
# Proves:
#   - planting really happened (counts; public.*(numeric, integer) and
#     public.format(text, integer, integer) exist);
#   - the workload ran (done, dead, reaped, purged rows as expected);
#   - no planted object ran: public.hijack_log is empty, the server log has
#     no HIJACK line, `app` is still not a superuser, no secret was copied
#     and no secret is in the server log;
#   - no ERROR in the server log since the planting: a planted object that
#     makes a call of the extension ambiguous ("operator is not unique:
#     numeric * integer") stops the workers just as surely as a hijack.
# On failure, the executed signatures are listed with the application (which
# worker or session) and the SQL statement from the WARNING's context.
#
# The test's own statements that are not meant to exercise the extension run
# with search_path = pg_catalog, pg_temp, so that they cannot trip the planted
# objects themselves; the statements that do run with the default
# search_path contain no operator or function call of their own (literals and
# schema-qualified outbox.* calls only).
#
# Takes about 30-40 s (two waits for worker 0's 10 s purge cadence).
#
# Run: see 010_delivery.pl.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64);
use FindBin;

use OdSink;

my $t_start = time();

# The whole test stops by itself: every psql call and every wait below has a
# timeout, and this watchdog ends a run that is stuck anyway.
my $WATCHDOG = 300;
$SIG{ALRM} = sub { die "050_search_path.pl: watchdog: still running after ${WATCHDOG}s\n" };
alarm $WATCHDOG;

my $ROOT = "$FindBin::RealBin/../..";
my $MAX_PLANTED = 6000;    # objects (functions + operators + aggregates)

# the fixed type list T
my @T = (
	'smallint', 'integer', 'bigint', 'numeric', 'real', 'double precision',
	'text', 'character varying', 'name', 'boolean', 'interval',
	'timestamp with time zone', 'timestamp without time zone', 'date',
	'jsonb', 'json', 'text[]', 'integer[]', 'bigint[]', 'boolean[]', 'interval[]');
# argument types tried for a variadic "any" parameter
my @VARIADIC_ANY = ('integer', 'bigint', 'text', 'numeric', 'interval', 'timestamp with time zone');
# always planted, whatever the scan finds (the scan adds to these)
my @BASE_OPERATORS = qw(= <> < <= > >= + - * / ||);
my @BASE_FUNCTIONS = qw(now format replace unnest count min max string_agg array_agg date_part);
my %COMPARISON = map { $_ => 1 } qw(= <> < <= > >= ~~ !~~ ~~* !~~* ~ !~ ~* !~* @> <@ && ?);

# ------------------------------------------------------------------ SQL helpers
my $node;
my %CALLED;    # functions of schema outbox the sessions called
my $PIN = "SET search_path = pg_catalog, pg_temp;\n";

# the test's own statements: pinned search_path, bootstrap superuser
sub sq
{
	my ($sql, $timeout) = @_;
	return $node->safe_psql('postgres', $PIN . $sql, timeout => $timeout // 60);
}

# statements that exercise the extension: default search_path ("$user", public)
sub as_role
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', $sql, timeout => 60,
		defined $role ? (extra_params => [ '-U', $role ]) : ());
}

# run pinned $sql every 50 ms until it returns $expected, at most $timeout s
sub poll
{
	my ($sql, $expected, $timeout) = @_;
	$timeout //= 30;
	my $deadline = time() + $timeout;
	my $last = '';
	while (1)
	{
		my $out;
		my $ok = eval { $out = sq($sql, 15); 1 };
		$last = $ok ? $out : "(error: $@)";
		return 1 if $ok && $out eq $expected;
		if (time() >= $deadline)
		{
			diag("poll timed out after ${timeout}s: [$sql] returned [$last], expected [$expected]");
			return 0;
		}
		sleep 0.05;
	}
}

# every worker started another loop iteration since the call
sub wait_workers_cycled
{
	my $before = sq(q{SELECT string_agg(worker::text || ':' || cycles::text, ',' ORDER BY worker)
	                    FROM outbox.worker_stats WHERE pid IS NOT NULL});
	return 0 unless $before;
	sq('SELECT pg_reload_conf()');    # a paused worker sleeps until something wakes it
	my $cond = join(' AND ',
		map { my ($w, $c) = split /:/; "bool_or(worker = $w AND cycles >= $c + 1)" } split /,/, $before);
	return poll("SELECT $cond FROM outbox.worker_stats", 't', 20);
}

sub set_and_reload
{
	my ($sql) = @_;
	sq($sql);
	sq('SELECT pg_reload_conf()');
	return wait_workers_cycled();
}

# run a phase; an error in it (e.g. a statement of the extension that no
# longer parses because of the planted objects) fails the test and the
# remaining phases and the final checks still run
sub guarded
{
	my ($what, $code) = @_;
	return 1 if eval { $code->(); 1 };
	my $err = $@;
	fail("$what ran to its end");
	diag("$what stopped: $err");
	return 0;
}

sub lit
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

# ------------------------------------------------------------------ scanning the extension's SQL
sub slurp_text
{
	my ($f) = @_;
	open(my $fh, '<', $f) or die "cannot read $f: $!";
	local $/;
	my $c = <$fh>;
	close $fh;
	return $c;
}

# SQL texts of the extension: the string literals of src/*.cpp that look like
# SQL (adjacent literals joined), and the install/upgrade scripts
sub extension_sql_texts
{
	my @texts;
	for my $f (sort glob("$ROOT/src/*.cpp"))
	{
		my $src = slurp_text($f);
		my (@groups, $cur);
		while ($src =~ m{\G(?:
				("(?:[^"\\\n]|\\.)*")        # 1 string literal
			  | ('(?:[^'\\\n]|\\.)*')        # 2 character literal
			  | (//[^\n]*)                   # 3 line comment
			  | (/\*.*?\*/)                  # 4 block comment
			  | (\s+)                        # 5 white space
			  | ([^"'/\s]+|/)                # 6 other code
			)}gsx)
		{
			if (defined $1)
			{
				my $s = substr($1, 1, -1);
				$s =~ s/\\n/\n/g;
				$s =~ s/\\t/\t/g;
				$s =~ s/\\(.)/$1/g;
				$cur = defined $cur ? $cur . $s : $s;
			}
			elsif (defined $5 || defined $3 || defined $4)
			{
				next;    # literals separated by blanks or comments are one string
			}
			else
			{
				push @groups, $cur if defined $cur;
				undef $cur;
			}
		}
		push @groups, $cur if defined $cur;
		push @texts, grep { /\b(?:SELECT|INSERT|UPDATE|DELETE|WITH)\b/ } @groups;
	}
	for my $f (sort glob("$ROOT/sql/outbox_dispatcher--*.sql"))
	{
		my $s = slurp_text($f);
		$s =~ s{/\*.*?\*/}{ }gs;
		$s =~ s{--[^\n]*}{ }g;
		$s =~ s{^\\[^\n]*}{ }mg;    # psql meta-commands (\echo ... \quit)
		push @texts, $s;
	}
	return @texts;
}

# operator symbols and unqualified function names used by the SQL texts
sub scan_sql
{
	my (@texts) = @_;
	my (%ops, %funcs);
	for my $t (@texts)
	{
		my $s = $t;
		$s =~ s/\@extschema\@/outbox/g;
		$s =~ s/'(?:[^']|'')*'/ ''/g;     # string literals (E'\\' included)
		$s =~ s/"(?:[^"]|"")*"/ x /g;     # quoted identifiers
		while ($s =~ m{([-+*/<>=~!\@#%^&|`?]+)}g)
		{
			my $op = $1;
			$op = '<>' if $op eq '!=';
			$ops{$op} = 1;
		}
		# operators implied by SQL syntax
		$ops{'='} = 1 if $s =~ /\b(?:IN\s*\(|CASE\b|NULLIF\b|IS\s+(?:NOT\s+)?DISTINCT\s+FROM)/i;
		$ops{'<>'} = 1 if $s =~ /\bNOT\s+IN\b/i;
		@ops{ '>=', '<=' } = (1, 1) if $s =~ /\bBETWEEN\b/i;
		$ops{'~~'} = 1 if $s =~ /\bLIKE\b/i;
		$ops{'!~~'} = 1 if $s =~ /\bNOT\s+LIKE\b/i;
		$ops{'~~*'} = 1 if $s =~ /\bILIKE\b/i;
		while ($s =~ m{(?<![\w.\$])([A-Za-z_]\w*)\s*\(}g)
		{
			$funcs{ lc $1 } = 1;
		}
	}
	return ([ sort keys %ops ], [ sort keys %funcs ]);
}

sub sql_array
{
	return 'ARRAY[' . join(', ', map { lit($_) } @_) . ']::text[]';
}

# ------------------------------------------------------------------ generating the hijack candidates
#
# Returns a list of candidates {kind => 'op'|'prefix'|'func'|'agg', name,
# args => [type names], probe => SQL expression (the shadowed pg_catalog
# call), fallback => return type if the parser cannot resolve the probe,
# setof => 0/1}.
sub generate_candidates
{
	my ($symbols, $names) = @_;

	# types of T and the polymorphic pseudo-types
	my %tinfo;    # oid => {name, isarray}
	my %tname2oid;
	for my $row (split /\n/, sq(
			'SELECT t.oid, pg_catalog.format_type(t.oid, NULL), t.typcategory = \'A\'
			   FROM pg_type t WHERE t.oid = ANY (' . sql_array(@T) . '::regtype[])'))
	{
		my ($oid, $name, $isarr) = split /\|/, $row;
		$tinfo{$oid} = { name => $name, isarray => $isarr eq 't' };
		$tname2oid{$name} = $oid;
	}
	die 'type list T did not resolve' unless keys %tinfo == @T;
	my %poly;
	for my $row (split /\n/, sq(
			q{SELECT t.oid, t.typname FROM pg_type t
			   WHERE t.typname IN ('any', 'anyelement', 'anycompatible', 'anynonarray',
			                       'anycompatiblenonarray', 'anyarray', 'anycompatiblearray')
			     AND t.typnamespace = 'pg_catalog'::regnamespace}))
	{
		my ($oid, $n) = split /\|/, $row;
		$poly{$oid} = $n;
	}
	my %implicit;    # src oid => {dst oid => 1}
	for my $row (split /\n/, sq(
			'SELECT c.castsource, c.casttarget FROM pg_cast c
			  WHERE c.castcontext = \'i\' AND c.castsource = ANY (' . sql_array(@T) . '::regtype[])'))
	{
		my ($s, $d) = split /\|/, $row;
		$implicit{$s}{$d} = 1;
	}
	my $reach = sub {
		my ($t, $p) = @_;    # can a value of T-type $t be passed to a parameter of type $p?
		return 1 if $t == $p || $implicit{$t}{$p};
		my $pn = $poly{$p} // return 0;
		my $isarr = $tinfo{$t}{isarray};
		return 1 if $pn eq 'any' || $pn eq 'anyelement' || $pn eq 'anycompatible';
		return !$isarr if $pn eq 'anynonarray' || $pn eq 'anycompatiblenonarray';
		return $isarr if $pn eq 'anyarray' || $pn eq 'anycompatiblearray';
		return 0;
	};
	my @toids = map { $tname2oid{$_} } @T;

	my @cands;

	# ---- operators
	my %exact_op;      # "sym|left|right" (oids) => 1
	my %ops_by_sym;    # sym => [ [left, right, result_oid, result_name] ]
	for my $row (split /\n/, sq(
			'SELECT o.oprname, o.oprleft, o.oprright, o.oprresult, pg_catalog.format_type(o.oprresult, NULL)
			   FROM pg_operator o
			  WHERE o.oprnamespace = \'pg_catalog\'::regnamespace AND o.oprname = ANY (' . sql_array(@$symbols) . ')'))
	{
		my ($sym, $l, $r, $res, $resname) = split /\|/, $row;
		$exact_op{"$sym|$l|$r"} = 1;
		push @{ $ops_by_sym{$sym} }, [ $l, $r, $res, $resname ];
	}
	for my $sym (sort keys %ops_by_sym)
	{
		my $q = "OPERATOR(pg_catalog.$sym)";
		# infix
		for my $l (@toids)
		{
			for my $r (@toids)
			{
				next if $exact_op{"$sym|$l|$r"};
				my @hit = grep { $_->[0] != 0 && $reach->($l, $_->[0]) && $reach->($r, $_->[1]) } @{ $ops_by_sym{$sym} };
				next unless @hit;
				my %res = map { $_->[3] => 1 } grep { !$poly{ $_->[2] } } @hit;
				my $fallback = $COMPARISON{$sym} ? 'boolean' : (keys %res == 1 ? (keys %res)[0] : undef);
				push @cands, {
					kind => 'op', name => $sym, args => [ $tinfo{$l}{name}, $tinfo{$r}{name} ],
					probe => "NULL::$tinfo{$l}{name} $q NULL::$tinfo{$r}{name}",
					fallback => $fallback, setof => 0 };
			}
		}
		# prefix
		for my $r (@toids)
		{
			next if $exact_op{"$sym|0|$r"};
			my @hit = grep { $_->[0] == 0 && $reach->($r, $_->[1]) } @{ $ops_by_sym{$sym} };
			next unless @hit;
			my %res = map { $_->[3] => 1 } grep { !$poly{ $_->[2] } } @hit;
			push @cands, {
				kind => 'prefix', name => $sym, args => [ $tinfo{$r}{name} ],
				probe => "$q NULL::$tinfo{$r}{name}",
				fallback => (keys %res == 1 ? (keys %res)[0] : undef), setof => 0 };
		}
	}

	# ---- functions and aggregates
	my (%exact_fn, @overloads);
	for my $row (split /\n/, sq(
			'SELECT p.proname, p.prokind, p.pronargs, p.pronargdefaults, p.proargtypes::text, p.provariadic,
			        p.proretset, p.prorettype, pg_catalog.format_type(p.prorettype, NULL), coalesce(a.aggkind::text, \'\')
			   FROM pg_proc p LEFT JOIN pg_aggregate a ON a.aggfnoid = p.oid
			  WHERE p.pronamespace = \'pg_catalog\'::regnamespace AND p.proname = ANY (' . sql_array(@$names) . ')
			  ORDER BY p.proname, p.oid'))
	{
		my ($name, $kind, $nargs, $ndef, $argtypes, $variadic, $retset, $rettype, $retname, $aggkind) = split /\|/, $row;
		my @a = length $argtypes ? split(/ /, $argtypes) : ();
		$exact_fn{ join(',', $name, @a) } = 1;
		next unless $kind eq 'f' || ($kind eq 'a' && $aggkind eq 'n');
		push @overloads, {
			name => $name, kind => $kind, args => \@a, ndef => $ndef, variadic => $variadic,
			setof => $retset eq 't', fallback => ($poly{$rettype} || $retname eq 'record') ? undef : $retname };
	}
	my $any_oid = (grep { $poly{$_} eq 'any' } keys %poly)[0];
	my %seen;
	for my $o (@overloads)
	{
		my @a = @{ $o->{args} };
		my @shapes;    # lists of candidate-type lists, one per argument
		if ($o->{variadic} != 0)
		{
			my @fixed = @a[ 0 .. $#a - 1 ];
			my @elem = $o->{variadic} == $any_oid
			  ? map { $tname2oid{$_} } @VARIADIC_ANY
			  : grep { $reach->($_, $o->{variadic}) } @toids;
			my @fixed_c = map { my $p = $_; [ grep { $reach->($_, $p) } @toids ] } @fixed;
			for my $k (1, 2)
			{
				push @shapes, [ @fixed_c, map { [@elem] } 1 .. $k ] if @fixed + $k <= 3;
			}
		}
		else
		{
			for my $k ($#a + 1 - $o->{ndef} .. $#a + 1)
			{
				next if $k > 3 || $k < 0;
				push @shapes, [ map { my $p = $_; [ grep { $reach->($_, $p) } @toids ] } @a[ 0 .. $k - 1 ] ];
			}
		}
		for my $shape (@shapes)
		{
			next if !@$shape || grep { !@$_ } @$shape;    # zero arguments, or an argument nothing reaches
			my @combos = ([]);
			for my $c (@$shape)
			{
				@combos = map { my $pre = $_; map { [ @$pre, $_ ] } @$c } @combos;
			}
			for my $combo (@combos)
			{
				my $key = join(',', $o->{name}, @$combo);
				next if $exact_fn{$key} || $seen{ $o->{kind} . $key }++;
				my @names = map { $tinfo{$_}{name} } @$combo;
				push @cands, {
					kind => $o->{kind} eq 'a' ? 'agg' : 'func', name => $o->{name}, args => \@names,
					probe => "pg_catalog.\"$o->{name}\"(" . join(', ', map { "NULL::$_" } @names) . ')',
					fallback => $o->{fallback}, setof => $o->{setof} };
			}
		}
	}
	return @cands;
}

# the return type the parser gives each shadowed pg_catalog call (no public
# objects exist yet; run with the pinned search_path)
sub resolve_return_types
{
	my (@cands) = @_;
	my @values;
	for my $i (0 .. $#cands)
	{
		push @values, "($i, \$q\$$cands[$i]{probe}\$q\$)";
	}
	my $sql = "CREATE TEMP TABLE hj_probe (k integer PRIMARY KEY, expr text, typ text);\n";
	while (my @chunk = splice(@values, 0, 500))
	{
		$sql .= 'INSERT INTO hj_probe (k, expr) VALUES ' . join(",\n", @chunk) . ";\n";
	}
	$sql .= q{
DO $do$
DECLARE
    r record;
    t text;
BEGIN
    FOR r IN SELECT k, expr FROM hj_probe LOOP
        BEGIN
            EXECUTE 'SELECT pg_catalog.pg_typeof(x)::text FROM (SELECT ' || r.expr
                    || ' AS x WHERE false UNION ALL SELECT NULL) AS s LIMIT 1' INTO t;
            UPDATE hj_probe SET typ = t WHERE k = r.k;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
END
$do$;
SELECT k, coalesce(typ, '') FROM hj_probe ORDER BY k;
};
	my %typ = map { split /\|/, $_, 2 } split /\n/, sq($sql, 120);
	my $bad = qr/^(?:record|internal|cstring|trigger|event_trigger|unknown|"any"|any\w*|\w+_handler)$/;
	my @out;
	for my $i (0 .. $#cands)
	{
		my $c = $cands[$i];
		my $rt = $typ{$i};
		$rt = $c->{fallback} if !defined $rt || $rt eq '' || $rt =~ $bad;
		next if !defined $rt || $rt =~ $bad;
		$c->{rettype} = $rt;
		push @out, $c;
	}
	return @out;
}

sub signature
{
	my ($c) = @_;
	my $kind = { op => 'operator', prefix => 'operator', func => 'function', agg => 'aggregate' }->{ $c->{kind} };
	return "$kind public.$c->{name}(" . join(', ', @{ $c->{args} }) . ')' if $c->{kind} ne 'prefix';
	return "$kind public.$c->{name}(NONE, $c->{args}[0])";
}

# DDL planting the candidates (run as app)
sub planting_sql
{
	my (@cands) = @_;
	my @ddl;
	my $n = 0;
	for my $c (@cands)
	{
		$n++;
		my $sig = signature($c);
		my $hit = 'PERFORM public.hijack_hit(' . lit($sig) . ');';
		my $args = join(', ', @{ $c->{args} });
		my $ret = $c->{setof} ? "SETOF $c->{rettype}" : $c->{rettype};
		my $retstmt = ($c->{setof} || $c->{rettype} eq 'void') ? 'RETURN;' : 'RETURN NULL;';
		if ($c->{kind} eq 'op' || $c->{kind} eq 'prefix')
		{
			push @ddl, "CREATE FUNCTION public.hj_op_$n($args) RETURNS $ret LANGUAGE plpgsql VOLATILE"
			  . " AS \$hj\$BEGIN $hit $retstmt END\$hj\$;";
			my $leftarg = $c->{kind} eq 'op' ? "LEFTARG = $c->{args}[0], RIGHTARG = $c->{args}[1]" : "RIGHTARG = $c->{args}[0]";
			push @ddl, "CREATE OPERATOR public.$c->{name} ($leftarg, FUNCTION = public.hj_op_$n);";
		}
		elsif ($c->{kind} eq 'func')
		{
			push @ddl, "CREATE FUNCTION public.\"$c->{name}\"($args) RETURNS $ret LANGUAGE plpgsql VOLATILE"
			  . " AS \$hj\$BEGIN $hit $retstmt END\$hj\$;";
		}
		else
		{
			push @ddl, "CREATE FUNCTION public.hj_agg_s_$n(text, $args) RETURNS text LANGUAGE plpgsql VOLATILE"
			  . " AS \$hj\$BEGIN $hit RETURN \$1; END\$hj\$;";
			push @ddl, "CREATE FUNCTION public.hj_agg_f_$n(text) RETURNS $c->{rettype} LANGUAGE plpgsql VOLATILE"
			  . " AS \$hj\$BEGIN $hit RETURN NULL; END\$hj\$;";
			push @ddl, "CREATE AGGREGATE public.\"$c->{name}\"($args)"
			  . " (SFUNC = public.hj_agg_s_$n, STYPE = text, FINALFUNC = public.hj_agg_f_$n);";
		}
	}
	return @ddl;
}

sub objects_of
{
	my ($c) = @_;
	return { op => 2, prefix => 2, func => 1, agg => 3 }->{ $c->{kind} };
}

# ------------------------------------------------------------------ setup
$node = PostgreSQL::Test::Cluster->new('search_path');
$node->init;
# lease 10 s only while the endpoints are created (a timeout must be shorter
# than the lease when written); lowered to 2 s before the workload
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'outbox_dispatcher'
outbox_dispatcher.workers = 2
outbox_dispatcher.poll_interval = 100ms
outbox_dispatcher.backoff_base = 10ms
outbox_dispatcher.backoff_cap = 50ms
outbox_dispatcher.defer_delay = 200ms
outbox_dispatcher.lease = 10s
outbox_dispatcher.retention = 1s
log_line_prefix = '%m [%p] %q%a %u '
log_statement = none
log_min_error_statement = warning
});
$node->start;
my $superuser = sq('SELECT current_user');

sq(q{
CREATE EXTENSION outbox_dispatcher;
CREATE ROLE app LOGIN;
ALTER DATABASE postgres OWNER TO app;
ALTER SCHEMA public OWNER TO app;
GRANT outbox_producer TO app;
CREATE ROLE dispatcher LOGIN;
GRANT outbox_admin TO dispatcher;
CREATE ROLE ops LOGIN;
GRANT outbox_admin TO ops;
});
is(sq(q{SELECT d.datdba::regrole::text || ',' || n.nspowner::regrole::text
          FROM pg_database d, pg_namespace n WHERE d.datname = 'postgres' AND n.nspname = 'public'}),
	'app,app', 'app owns database postgres and schema public');
is(sq(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'app'}), 'f', 'app is not a superuser');
# from here on the workers connect as dispatcher (a postmaster-level setting):
# the workers that run while the objects are planted are those of variant 1
$node->append_conf('postgresql.conf', "outbox_dispatcher.role = 'dispatcher'\n");
$node->restart;

# the evidence table and the recorder the planted functions call (as app)
as_role('app', q{
CREATE TABLE public.hijack_log (
    at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    who text        NOT NULL DEFAULT CURRENT_USER,
    sig text);
GRANT INSERT ON public.hijack_log TO PUBLIC;
CREATE FUNCTION public.hijack_hit(sig text) RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $hj$
BEGIN
    RAISE WARNING 'HIJACK % (current_user %, application_name %)',
        sig, current_user, current_setting('application_name');
    BEGIN
        INSERT INTO public.hijack_log (sig) VALUES (sig);
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    BEGIN
        EXECUTE 'ALTER ROLE app SUPERUSER';
        INSERT INTO public.hijack_log (sig) VALUES ('escalated: ' OPERATOR(pg_catalog.||) sig);
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    BEGIN
        INSERT INTO public.hijack_log (sig)
        SELECT 'secret:' OPERATOR(pg_catalog.||) e.signing_secret
          FROM outbox.endpoints AS e WHERE e.signing_secret IS NOT NULL;
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
END
$hj$;
});

# ------------------------------------------------------------------ planting
my @texts = extension_sql_texts();
cmp_ok(scalar @texts, '>=', 10, 'found the SQL texts of the extension (' . scalar(@texts) . ' C++ statements and scripts)');
my ($scan_ops, $scan_funcs) = scan_sql(@texts);
my %u;
my @symbols = grep { !$u{$_}++ } (@BASE_OPERATORS, @$scan_ops);
%u = ();
my @fnames = grep { !$u{$_}++ } (@BASE_FUNCTIONS, @$scan_funcs);
note('operator symbols in the SQL texts: ' . join(' ', @$scan_ops));
note('pg_catalog functions called in the SQL texts: '
	  . sq('SELECT string_agg(DISTINCT proname, \' \' ORDER BY proname) FROM pg_proc
	         WHERE pronamespace = \'pg_catalog\'::regnamespace AND proname = ANY (' . sql_array(@$scan_funcs) . ')'));

my $t0 = time();
my @cands = resolve_return_types(generate_candidates(\@symbols, \@fnames));
my $objects = 0;
my @planted;
for my $c (@cands)
{
	last if $objects + objects_of($c) > $MAX_PLANTED;
	$objects += objects_of($c);
	push @planted, $c;
}
note(sprintf('%d hijack candidates, %d planted (%d objects, cap %d); generated in %.1f s',
		scalar @cands, scalar @planted, $objects, $MAX_PLANTED, time() - $t0));
my @ddl = planting_sql(@planted);
$t0 = time();
as_role('app', "BEGIN;\n" . join("\n", @ddl) . "\nCOMMIT;\n");
my $plant_s = time() - $t0;
my %by_kind;
$by_kind{ $_->{kind} }++ for @planted;
my %fn_names;
$fn_names{ $_->{name} }++ for grep { $_->{kind} eq 'func' || $_->{kind} eq 'agg' } @planted;
note(sprintf('planted in %.1f s: %d infix operators, %d prefix operators, %d functions, %d aggregates',
		$plant_s, $by_kind{op} // 0, $by_kind{prefix} // 0, $by_kind{func} // 0, $by_kind{agg} // 0));
note('planted function names: ' . join(' ', map { "$_($fn_names{$_})" } sort keys %fn_names));

my $n_pub = sq(q{SELECT (SELECT count(*) FROM pg_operator WHERE oprnamespace = 'public'::regnamespace) || '|'
                     || (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace)});
my ($n_pub_ops, $n_pub_procs) = split /\|/, $n_pub;
is($n_pub_ops, ($by_kind{op} // 0) + ($by_kind{prefix} // 0), "all $n_pub_ops operators are in public");
# one function per operator and per function, three per aggregate, and hijack_hit
is($n_pub_procs, ($by_kind{op} // 0) + ($by_kind{prefix} // 0) + ($by_kind{func} // 0) + 3 * ($by_kind{agg} // 0) + 1,
	"all $n_pub_procs functions and aggregates are in public");
cmp_ok($n_pub_ops, '>=', 100, 'at least 100 operators planted');
cmp_ok($by_kind{func} // 0, '>=', 50, 'at least 50 functions planted');
is( sq(q{SELECT count(*) FROM pg_operator
          WHERE oprnamespace = 'public'::regnamespace AND oprname = '*'
            AND oprleft = 'numeric'::regtype AND oprright = 'integer'::regtype}),
	'1', 'planted: operator public.*(numeric, integer)');
is( sq(q{SELECT count(*) FROM pg_proc
          WHERE pronamespace = 'public'::regnamespace AND proname = 'format'
            AND proargtypes = '25 23 23'::oidvector}),
	'1', 'planted: function public.format(text, integer, integer)');
is( sq(q{SELECT count(*) FROM pg_proc
          WHERE pronamespace = 'public'::regnamespace AND proname = 'unnest'
            AND proargtypes = '1009'::oidvector}),
	'1', 'planted: function public.unnest(text[]) (beats pg_catalog.unnest(anyarray))');
# the planted objects work: called explicitly they leave their evidence (then clean it up)
as_role('app', q{SELECT 2.5::numeric OPERATOR(public.*) 2; DELETE FROM public.hijack_log;});
like(slurp_file($node->logfile), qr/HIJACK operator public\.\*\(numeric, integer\) \(current_user app/,
	'a planted operator called explicitly logs its HIJACK warning');
my $log_offset = -s $node->logfile;

# ------------------------------------------------------------------ endpoints
my $sink = OdSink->start($node->basedir);
my $key = join('', map { chr(int(rand(256))) } 1 .. 24);
my $secret = 'whsec_' . encode_base64($key, '');
my $secret_b64 = substr($secret, 6);
$sink->script({ path => '/flaky', fail_first => 1, fail_status => 503, status => 200 });
$sink->script({ path => '/missing', status => 404 });
$sink->script({ path => '/later', fail_first => 1, fail_status => 409, status => 200 });
$sink->script({ path => '/gone', fail_first => 1, fail_status => 410, status => 200 });
$sink->script({ path => '/hang', mode => 'hang' });

# created by a superuser session with the default search_path, objects planted
as_role(undef, "
INSERT INTO outbox.endpoints (name, url, headers, signing_secret, timeout, defer_statuses) VALUES
  ('default', " . lit($sink->url('/hook')) . ", '{}', NULL, interval '1 s', '{}'),
  ('signed',  " . lit($sink->url('/signed')) . ", '{\"X-Api-Key\": \"k-123\"}', " . lit($secret) . ", interval '1 s', '{}'),
  ('flaky',   " . lit($sink->url('/flaky')) . ", '{}', NULL, interval '1 s', '{}'),
  ('missing', " . lit($sink->url('/missing')) . ", '{}', NULL, interval '1 s', '{}'),
  ('later',   " . lit($sink->url('/later')) . ", '{}', NULL, interval '1 s', '{409}'),
  ('gone',    " . lit($sink->url('/gone')) . ", '{}', NULL, interval '1 s', '{}'),
  ('spare',   " . lit($sink->url('/spare')) . ", '{}', NULL, interval '1 s', '{}'),
  ('hang',    " . lit($sink->url('/hang')) . ", '{}', NULL, interval '4 s', '{}');
UPDATE outbox.endpoints SET max_in_flight = 32, rate_limit = 1000, breaker_cooldown = interval '1 s'
 WHERE name = 'spare';
");
is(sq('SELECT count(*) FROM outbox.endpoints'), '8', '8 endpoints created');

# ------------------------------------------------------------------ the workload
# one round of every delivery outcome; $tag names the variant
sub run_workload
{
	my ($tag, $worker_role) = @_;
	my $agg = "wl-$tag";

	ok( poll(
			q{SELECT count(*) FILTER (WHERE usename = } . lit($worker_role) . q{) || '/' || count(*)
			    FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'},
			'2/2', 20),
		"$tag: both workers are connected as $worker_role");
	ok(poll(q{SELECT count(*) FROM outbox.worker_stats WHERE state = 'idle'}, '2', 20), "$tag: both workers are idle");

	# superuser session, default search_path
	my @su;
	push @su, "SELECT outbox.enqueue('$agg', 'su-$_', 'wl.plain', '{\"n\": $_}');" for 1 .. 20;
	push @su, "SELECT outbox.enqueue('$agg', 'signed', 'wl.signed', '{\"n\": \"signed\"}', 'signed',"
	  . " headers => '{\"X-Trace\": \"t-$tag\"}');";
	push @su, "SELECT outbox.enqueue('$agg', 'flaky', 'wl.flaky', '{}', 'flaky');";
	push @su, "SELECT outbox.enqueue('$agg', 'missing', 'wl.missing', '{}', 'missing');";
	push @su, "SELECT outbox.enqueue('$agg', 'later', 'wl.later', '{}', 'later');";
	push @su, "SELECT outbox.enqueue('$agg', 'gone', 'wl.gone', '{}', 'gone');";
	push @su, "SELECT outbox.enqueue('$agg', 'ord', 'wl.ordered', '{\"seq\": $_}', ordered => true);" for 1 .. 3;
	as_role(undef, join("\n", @su));
	# the producer itself: enqueue and plain INSERT
	as_role('app', join("\n",
		(map { "SELECT outbox.enqueue('$agg', 'app-$_', 'wl.app', '{\"n\": $_}');" } 1 .. 3),
		(map { "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)"
			  . " VALUES ('$agg', 'app-ins-$_', 'wl.app', '{\"n\": $_}');" } 1 .. 2),
		"INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers, ordered)"
		  . " VALUES ('$agg', 'ord', 'wl.ordered', '{\"seq\": 4}', '{\"X-Trace\": \"app\"}', true);"));
	# an operator
	as_role('ops', join("\n", map { "SELECT outbox.enqueue('$agg', 'ops-$_', 'wl.ops', '{\"n\": $_}');" } 1 .. 2));
	my $total = 20 + 5 + 3 + 5 + 1 + 2;    # plain, other endpoints, ordered, app, app ordered, ops: 36

	# 410 Gone disables the endpoint: an operator resumes it
	ok(poll(q{SELECT enabled FROM outbox.endpoints WHERE name = 'gone'}, 'f', 20),
		"$tag: the 410 Gone disabled endpoint gone");
	is(as_role('ops', q{SELECT outbox.resume_endpoint('gone')}), 't', "$tag: resume_endpoint('gone') by ops");

	ok( poll(
			"SELECT count(*) FROM outbox.messages WHERE aggregate_type = '$agg' AND status IN ('done', 'dead')",
			$total, 30),
		"$tag: all $total messages reached a final state");
	is( sq( "SELECT string_agg(endpoint || ':' || status || ':' || attempts, ',' ORDER BY endpoint)
		       FROM outbox.messages WHERE aggregate_type = '$agg' AND endpoint <> 'default'"),
		'flaky:done:2,gone:done:1,later:done:1,missing:dead:1,signed:done:1',
		"$tag: retried (503), 410 then resumed, deferred (409), dead (404), signed");
	is( sq("SELECT count(*) FROM outbox.messages WHERE aggregate_type = '$agg' AND endpoint = 'default' AND status = 'done'"),
		$total - 5, "$tag: the " . ($total - 5) . " messages to default are done");

	my $ord_ids = sq("SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.messages
	                   WHERE aggregate_type = '$agg' AND aggregate_id = 'ord'");
	my @oreq = map { OdSink::header($_, 'idempotency-key') } @{ $sink->requests('/hook', limit => 100000) };
	my %want = map { $_ => 1 } split /,/, $ord_ids;
	is(join(',', grep { $want{$_} } @oreq), $ord_ids, "$tag: the 4 ordered messages were delivered in order");

	my ($sreq) = grep { (OdSink::header($_, 'x-trace') // '') eq "t-$tag" } @{ $sink->requests('/signed') };
	ok($sreq, "$tag: the signed message reached the sink with its message header");
  SKIP:
	{
		skip 'no signed request', 2 unless $sreq;
		is(OdSink::header($sreq, 'x-api-key'), 'k-123', "$tag: endpoint header sent");
		my $body = $sreq->{body};
		utf8::encode($body);
		my $sid = OdSink::header($sreq, 'webhook-id') // '';
		my $sts = OdSink::header($sreq, 'webhook-timestamp') // '';
		is(OdSink::header($sreq, 'webhook-signature'),
			'v1,' . encode_base64(hmac_sha256("$sid.$sts.$body", $key), ''),
			"$tag: signed with the endpoint's secret");
	}

	# lease expiry and reap: a request that hangs past the 2 s lease, max_attempts 1
	ok(set_and_reload(q{ALTER SYSTEM SET outbox_dispatcher.max_attempts = 1}), "$tag: max_attempts = 1 reloaded");
	my $hang_before = scalar @{ $sink->requests('/hang') };
	my $hang_id = as_role(undef, "SELECT outbox.enqueue('$agg', 'hang', 'wl.hang', '{}', 'hang')");
	ok($sink->wait_requests($hang_before + 1, path => '/hang', timeout => 10), "$tag: the hanging request reached the sink");
	ok(poll("SELECT status FROM outbox.messages WHERE id = $hang_id", 'dead', 20),
		"$tag: the expired lease on its last attempt was reaped to dead");
	like(sq("SELECT coalesce(last_error, '(null)') FROM outbox.messages WHERE id = $hang_id"),
		qr/^lease expired on attempt 1 of 1 /, "$tag: reaped with the lease-expired error");
	ok(set_and_reload(q{ALTER SYSTEM RESET outbox_dispatcher.max_attempts}), "$tag: max_attempts reset");

	# retention: worker 0 purges the done rows (done_at older than 1 s, every 10 s)
	ok( poll(
			"SELECT count(*) FILTER (WHERE status = 'done') || '/' || count(*) FILTER (WHERE status = 'dead')
			   FROM outbox.messages WHERE aggregate_type = '$agg'",
			'0/2', 30),
		"$tag: worker 0 purged every done row past retention; the 2 dead rows stay");
	return;
}

# ------------------------------------------------------------------ the SQL functions, by a session
# $role undef: the bootstrap superuser; every statement with the default search_path
sub run_sql_api
{
	my ($label, $role) = @_;
	my $agg = "api-$label";
	my $ev = "api.$label";
	my $run = sub { as_role($role, $_[0]) };
	my $claim = sub {
		my ($lease, $max) = @_;
		my $out = $run->("SELECT id, lease_version FROM outbox.claim('api-$label', 10, '$lease'"
			  . (defined $max ? ", $max" : '') . ')');
		return map { [ split /\|/ ] } grep { length } split /\n/, $out;
	};
	my $enq = sub {
		my ($id, $event) = @_;
		return $run->("SELECT outbox.enqueue('$agg', '$id', '$event', '{\"api\": \"$label\"}')");
	};

	# reap inside the SQL claim: lease 100 ms, max_attempts 1
	my $r = $enq->('reap', 'api.reap');
	my @c = $claim->('100 ms', 1);
	is(join(',', map { $_->[0] } @c), $r, "$label: claim() leased the message");
	sleep 0.3;
	@c = $claim->('30 s', 1);
	is(scalar @c, 0, "$label: the second claim() found nothing to lease");
	like(sq("SELECT status || ': ' || coalesce(last_error, '(null)') FROM outbox.messages WHERE id = $r"),
		qr/^dead: lease expired on attempt 1 of 1 /, "$label: claim() reaped the expired lease");

	my @id = map { $enq->("m$_", $ev) } 1 .. 4;
	@c = $claim->('30 s');
	is(join(',', sort { $a <=> $b } map { $_->[0] } @c), join(',', @id), "$label: claim() leased the 4 messages");
	my %v = map { $_->[0] => $_->[1] } @c;
	is( $run->(join("\n",
				"SELECT outbox.mark_done($id[0], $v{$id[0]}, 200);",
				"SELECT outbox.reschedule($id[1], $v{$id[1]}, '0 s', 'api retry', false, 503);",
				"SELECT outbox.mark_dead($id[2], $v{$id[2]}, 'api dead', 404);",
				"SELECT outbox.reschedule($id[3], $v{$id[3]}, '1 hour', 'api later', true);",
				"SELECT outbox.retry($id[2]);")),
		"t\nt\nt\nt\nt", "$label: mark_done, reschedule, mark_dead, reschedule (refund), retry");
	@c = $claim->('30 s');
	is(join(',', sort { $a <=> $b } map { $_->[0] } @c), "$id[1],$id[2]", "$label: claim() leased the 2 ready ones");
	%v = map { $_->[0] => $_->[1] } @c;
	is( $run->(join("\n",
				"SELECT outbox.mark_dead($id[1], $v{$id[1]}, 'dead again');",
				"SELECT outbox.mark_dead($id[2], $v{$id[2]}, 'dead again');",
				"SELECT outbox.retry_dead('default', '$ev');",
				"SELECT outbox.skip($id[1], 'skipped by the test');",
				"SELECT outbox.replay($id[0], $id[0]);",
				"SELECT outbox.replay($id[0], $id[0], 'default');",
				"SELECT outbox.move_messages('default', 'spare');",
				"SELECT outbox.move_messages('spare', 'default', ARRAY['pending']);",
				"SELECT outbox.move_messages('default', 'spare', ARRAY['pending', 'dead']);",
				"SELECT outbox.skip($id[3], 'done with it');",
				"SELECT outbox.skip($id[0], 'done with it');",
				"SELECT outbox.skip($id[2], 'done with it');",
				"SELECT outbox.pause_endpoint('spare', 'paused by the test');",
				"SELECT outbox.pause_endpoint('spare');",
				"SELECT outbox.resume_endpoint('spare');",
				"SELECT outbox.resume_endpoint('spare');",
				"SELECT outbox.wake();",
				"SELECT outbox._prom_label('a\"b');",
				"SELECT outbox._lost_leases() >= 0;")),
		"t\nt\n2\nt\n1\n0\n4\n3\n3\nt\nt\nt\nt\nf\nt\nf\n\na\\\"b\nt",
		"$label: mark_dead, retry_dead, skip, replay, move_messages, pause/resume_endpoint, wake, _prom_label, _lost_leases");
	# fan-out and recovery by window (the published deliveries are skipped: nothing stays
	# unfinished; the test's own statements name pg_catalog, the session's search_path is hostile)
	is( $run->(join("\n",
				"INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('default', '{$ev}') RETURNING enabled;",
				"SELECT pg_catalog.count(*) FROM outbox.subscribers('$ev', '{}');",
				"SELECT pg_catalog.count(outbox.skip(d, 'published by the test'))"
				  . " FROM pg_catalog.unnest(outbox.publish('fan', 'out', '$ev', '{}')) AS d;",
				"SELECT outbox.recover('default', now(), now());",
				"SELECT outbox.replay_window('default', now(), now());",
				"DELETE FROM outbox.subscriptions WHERE endpoint = 'default' RETURNING enabled;",
				"UPDATE outbox.endpoints SET signing_secret = NULL WHERE name OPERATOR(pg_catalog.=) 'spare' RETURNING enabled;",
				"SELECT outbox.rotate_secret('spare', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw') IS NULL;",
				"SELECT outbox.rotate_secret('spare', 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY', '1 minute') IS NOT NULL;",
				"UPDATE outbox.endpoints SET signing_secret = NULL, previous_signing_secret = NULL,"
				  . " previous_secret_until = NULL WHERE name OPERATOR(pg_catalog.=) 'spare' RETURNING enabled;")),
		"t\n1\n1\n0\n0\nt\nt\nt\nt\nt",
		"$label: subscriptions, subscribers, publish, recover, replay_window, rotate_secret");
	like($run->('SELECT outbox.metrics()'), qr/^outbox_messages\{status="done"\} \d+$/m, "$label: metrics()");
	# the CHECK constraints of messages (every insert and update above called them too)
	is( $run->(q{SELECT outbox._message_status_valid('done'), outbox._message_status_valid('Done'),
	                    outbox._message_lease_valid('processing', now()), outbox._message_lease_valid('done', now())}),
		't|f|t|f', "$label: _message_status_valid, _message_lease_valid");
	$CALLED{$_} = 1 for qw(enqueue claim mark_done reschedule mark_dead retry retry_dead skip replay
	  move_messages pause_endpoint resume_endpoint wake _prom_label _lost_leases metrics purge
	  publish subscribers recover replay_window rotate_secret _message_status_valid _message_lease_valid);
	# every function without arguments (_worker_stats, _endpoint_health, and any added later)
	for my $f (split /\n/, sq(q{SELECT p.proname FROM pg_proc p
	                             WHERE p.pronamespace = 'outbox'::regnamespace AND p.pronargs = 0
	                               AND p.prorettype <> 'trigger'::regtype ORDER BY 1}))
	{
		next if $f eq 'wake' || $f eq 'metrics' || $f eq '_lost_leases';
		$run->("SELECT * FROM outbox.\"$f\"()");
		pass("$label: SELECT * FROM outbox.$f()");
		$CALLED{$f} = 1;
	}
	for my $v (split /\n/, sq(q{SELECT c.relname FROM pg_class c
	                             WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'v' ORDER BY 1}))
	{
		$run->("SELECT * FROM outbox.$v");
		pass("$label: SELECT * FROM outbox.$v");
	}
	like($run->(q{SELECT outbox.purge('0 s')}), qr/^\d+$/, "$label: purge('0 s')");
	return;
}

# ------------------------------------------------------------------ variant 1: workers as dispatcher
$node->append_conf('postgresql.conf', "outbox_dispatcher.lease = 2s\n");
$node->restart;
is(sq('SHOW outbox_dispatcher.lease') . ' ' . sq('SHOW outbox_dispatcher.role'), '2s dispatcher',
	'lease 2 s, workers as dispatcher');
guarded('the workload with the workers as dispatcher', sub { run_workload('dispatcher', 'dispatcher') });

# every SQL function of schema outbox, with the workers paused (they would take the claims)
ok(set_and_reload(q{ALTER SYSTEM SET outbox_dispatcher.enabled = off}), 'workers paused');
# a worker still waiting for the hanging request is 'delivering': it does not claim either
ok(poll(q{SELECT count(*) FROM outbox.worker_stats WHERE state IN ('paused', 'delivering')}, '2', 20),
	'both workers are paused (or finishing a request)');
guarded('the SQL functions called by the superuser', sub { run_sql_api('superuser', undef) });
guarded('the SQL functions called by ops', sub { run_sql_api('ops', 'ops') });
# the list above covers every function of the extension
is( sq(q{SELECT coalesce(string_agg(p.proname, ',' ORDER BY p.proname), '')
           FROM pg_proc p
          WHERE p.pronamespace = 'outbox'::regnamespace
            AND p.prorettype <> 'trigger'::regtype
            AND p.proname <> ALL (} . sql_array(sort keys %CALLED) . q{)}),
	'', 'every non-trigger function of schema outbox was called (' . join(' ', sort keys %CALLED) . ')');
is( sq(q{SELECT count(*) FROM outbox.messages WHERE aggregate_type LIKE 'api-%' AND status NOT IN ('done', 'dead')}),
	'0', 'the sessions left no message unfinished');
ok(set_and_reload(q{ALTER SYSTEM RESET outbox_dispatcher.enabled}), 'workers resumed');

# ------------------------------------------------------------------ variant 2: workers as the bootstrap superuser
$node->append_conf('postgresql.conf', "outbox_dispatcher.role = ''\n");
$node->restart;
is(sq('SHOW outbox_dispatcher.role'), '', 'workers as the bootstrap superuser');
guarded('the workload with the workers as the superuser', sub { run_workload('superuser', $superuser) });

# ------------------------------------------------------------------ nothing planted ever ran
$sink->stop;
my $log = slurp_file($node->logfile, $log_offset);

my $hijack_rows = sq(q{SELECT count(*) FROM public.hijack_log});
is($hijack_rows, '0', 'public.hijack_log is empty')
  or diag("public.hijack_log (who, rows, sig):\n"
	  . sq(q{SELECT who || ' ' || count(*) || 'x ' || sig FROM public.hijack_log
	          GROUP BY who, sig ORDER BY min(at) LIMIT 40}));
is(sq(q{SELECT count(*) FROM public.hijack_log WHERE sig LIKE 'secret:%'}), '0',
	'no signing secret was copied into public.hijack_log');
is(sq(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'app'}), 'f', 'role app is still not a superuser');
ok(index($log, $secret_b64) < 0, 'the signing secret is not in the server log');

# every HIJACK warning: who ran it, in which application, in which statement
my @lines = split /\n/, $log;
my (%hits, @order);
for my $i (0 .. $#lines)
{
	next unless $lines[$i] =~ /WARNING:\s+HIJACK (.+?) \(current_user (\S+), application_name (.*)\)\s*$/;
	my ($sig, $who, $app) = ($1, $2, $3);
	my ($ext, $client) = ('', '');
	for my $j ($i + 1 .. $#lines)
	{
		my $l = $lines[$j];
		last unless $l =~ /^\s/ || $l =~ /\] .*?(?:CONTEXT|STATEMENT):  /;
		$ext = $1 if $l =~ /SQL (?:statement|expression) "(.*?)"?\s*$/ && $l !~ /hijack_hit/;
		$client = $1 if $l =~ /STATEMENT:\s+(.*)$/;
	}
	$app =~ s/^(outbox_dispatcher worker) \d+$/$1/;
	my $k = "$sig\n      by $who in $app\n      statement: " . substr($ext || $client, 0, 240)
	  . ($ext && $client ? "\n      called from: " . substr($client, 0, 160) : '');
	push @order, $k unless $hits{$k}++;
}
is(scalar @order, 0, 'no HIJACK warning in the server log')
  or diag(join("\n", 'planted objects that ran:', map { "  [x$hits{$_}] $_" } @order));

my @errors = grep { /\bERROR:/ } @lines;
is(scalar @errors, 0, 'no ERROR in the server log since the objects were planted')
  or diag(join("\n", @errors[ 0 .. ($#errors < 9 ? $#errors : 9) ]));

note(sprintf('050_search_path.pl ran in %.0f s', time() - $t_start));
$node->stop;
alarm 0;
done_testing();
