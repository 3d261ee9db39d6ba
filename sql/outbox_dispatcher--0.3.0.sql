/*
 * outbox_dispatcher 0.3.0 - schema, state machine and monitoring surface.
 *
 * The install script of 0.3.0: CREATE EXTENSION outbox_dispatcher runs this
 * file alone, every object created once in its final form.  The update
 * scripts (outbox_dispatcher--0.1.0.sql and the --0.1.0--0.2.0 ...
 * --0.2.2--0.3.0 chain) stay for existing installations; test/tap/045_upgrade.pl
 * compares pg_dump --schema-only --binary-upgrade of a database updated
 * along that chain with one where 0.3.0 was installed directly, so a change
 * here needs the same change in a new update script, and the other way round.
 *
 * Rows of outbox.messages move through
 *
 *     pending --claim--> processing --finalize--> done | pending | dead
 *
 * claim writes the owner, the lease deadline and a new fencing token
 * (lease_version + 1) in one short transaction; every finalize is an UPDATE
 * fenced on (id, status = 'processing', lease_version), so a worker whose
 * lease was taken over can never overwrite the newer owner's result.
 *
 * Every transition is implemented once, in C++ (src/transitions.cpp) with
 * saved SPI plans; the SQL functions below and the background workers call
 * that same code.
 *
 * Every function of the extension runs with search_path pinned to
 * pg_catalog, pg_temp (the C functions also pin it themselves around their
 * SQL; the two trigger functions on the producers' insert path run no SQL
 * and are left without a SET clause, which would cost every row).
 *
 * Indexes are chosen so that claiming costs O(batch), whatever the number of
 * retained done/dead rows, of rows scheduled for later, and of the backlog:
 *   messages_ready   (endpoint, available_at, id) WHERE pending
 *                                                 -- ready rows per endpoint, oldest first
 *   messages_leased  (lease_until) WHERE lease_until IS NOT NULL
 *                                                 -- expired leases / reaping
 *   messages_open    (aggregate_type, aggregate_id, endpoint, id) WHERE ordered AND status <> 'done'
 *                                                 -- ordered head check (per endpoint)
 *   messages_done    (done_at)          WHERE done -- retention purge
 *   messages_dead    (endpoint, id)     WHERE dead -- dead letters, retry_dead
 */

\echo Use "CREATE EXTENSION outbox_dispatcher" to load this file. \quit

-- JSON on the wire is UTF-8 and signatures cover the exact bytes sent: the
-- database must store text as UTF-8 (see docs/security.md).
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'outbox_dispatcher requires a UTF8 database'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('Database "%s" has encoding %s.',
                                             pg_catalog.current_database(), pg_catalog.getdatabaseencoding()),
                  HINT = 'Create the database with ENCODING ''UTF8'' (and TEMPLATE template0), then install the extension there.';
    END IF;
END
$encoding$;

-- ---------------------------------------------------------------- roles
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'outbox_producer') THEN
        CREATE ROLE outbox_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'outbox_monitor') THEN
        CREATE ROLE outbox_monitor NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'outbox_admin') THEN
        CREATE ROLE outbox_admin NOLOGIN;
    END IF;
END
$roles$;

REVOKE ALL ON SCHEMA @extschema@ FROM PUBLIC;

-- ---------------------------------------------------------------- ranges
-- The ranges of outbox.endpoints are named CHECK constraints, on domains:
-- each rule's name says it.  Domains rather than table constraints: a
-- violated domain constraint names its rule and nothing else, while a
-- violated table constraint reports "Failing row contains (...)", which
-- would copy signing_secret and headers into the server log.
CREATE DOMAIN @extschema@.endpoint_max_in_flight AS integer
    CONSTRAINT max_in_flight_between_1_and_10000 CHECK (VALUE OPERATOR(pg_catalog.>=) 1 AND VALUE OPERATOR(pg_catalog.<=) 10000);
COMMENT ON DOMAIN @extschema@.endpoint_max_in_flight IS
    'Requests in flight to one endpoint, cluster-wide: 1 to 10000';

CREATE DOMAIN @extschema@.http_statuses AS integer[]
    CONSTRAINT defer_statuses_are_http_300_to_599 CHECK (
        pg_catalog.array_ndims(VALUE) IS NULL
        OR (pg_catalog.array_ndims(VALUE) OPERATOR(pg_catalog.=) 1
            AND pg_catalog.array_position(VALUE, NULL) IS NULL
            AND 300 OPERATOR(pg_catalog.<=) ALL (VALUE)
            AND 599 OPERATOR(pg_catalog.>=) ALL (VALUE)));
COMMENT ON DOMAIN @extschema@.http_statuses IS
    'A one-dimensional array of HTTP statuses between 300 and 599, without nulls';

CREATE DOMAIN @extschema@.endpoint_rate_limit AS double precision
    CONSTRAINT "rate_limit_between_0.0001_and_1000000" CHECK (VALUE OPERATOR(pg_catalog.>=) 0.0001
                                       AND VALUE OPERATOR(pg_catalog.<=) 1000000);
COMMENT ON DOMAIN @extschema@.endpoint_rate_limit IS
    'Messages per second: 0.0001 to 1000000 (null: no limit)';

CREATE DOMAIN @extschema@.breaker_threshold AS integer
    CONSTRAINT breaker_threshold_between_0_and_1000000 CHECK (VALUE OPERATOR(pg_catalog.>=) 0
                                              AND VALUE OPERATOR(pg_catalog.<=) 1000000);
COMMENT ON DOMAIN @extschema@.breaker_threshold IS
    'Consecutive failures that open the circuit breaker: 0 (no breaker) to 1000000';

CREATE DOMAIN @extschema@.breaker_cooldown AS interval
    CONSTRAINT breaker_cooldown_between_100ms_and_1h CHECK (VALUE OPERATOR(pg_catalog.>=) interval '100 milliseconds'
                                             AND VALUE OPERATOR(pg_catalog.<=) interval '1 hour');
COMMENT ON DOMAIN @extschema@.breaker_cooldown IS
    'How long an open circuit breaker waits before a probe: 100 milliseconds to 1 hour';

REVOKE ALL ON DOMAIN @extschema@.endpoint_max_in_flight, @extschema@.http_statuses,
    @extschema@.endpoint_rate_limit, @extschema@.breaker_threshold, @extschema@.breaker_cooldown FROM PUBLIC;

CREATE DOMAIN @extschema@.retry_schedule AS interval[]
    CONSTRAINT retry_schedule_is_1_to_100_delays_between_100ms_and_7_days CHECK (
        pg_catalog.array_ndims(VALUE) IS NULL
        OR (pg_catalog.array_ndims(VALUE) OPERATOR(pg_catalog.=) 1
            AND pg_catalog.array_length(VALUE, 1) OPERATOR(pg_catalog.<=) 100
            AND pg_catalog.array_position(VALUE, NULL) IS NULL
            AND interval '100 milliseconds' OPERATOR(pg_catalog.<=) ALL (VALUE)
            AND interval '7 days' OPERATOR(pg_catalog.>=) ALL (VALUE)));
COMMENT ON DOMAIN @extschema@.retry_schedule IS
    'Delays before each retry: 1 to 100 intervals between 100 milliseconds and 7 days, without nulls';

CREATE DOMAIN @extschema@.endpoint_max_attempts AS integer
    CONSTRAINT max_attempts_between_1_and_1000 CHECK (VALUE OPERATOR(pg_catalog.>=) 1 AND VALUE OPERATOR(pg_catalog.<=) 1000);
COMMENT ON DOMAIN @extschema@.endpoint_max_attempts IS
    'Attempts a message of the endpoint gets at most: 1 to 1000';

REVOKE ALL ON DOMAIN @extschema@.retry_schedule, @extschema@.endpoint_max_attempts FROM PUBLIC;

CREATE DOMAIN @extschema@.endpoint_disable_after AS interval
    CONSTRAINT disable_after_between_1min_and_365_days CHECK (VALUE OPERATOR(pg_catalog.>=) interval '1 minute'
                                                AND VALUE OPERATOR(pg_catalog.<=) interval '365 days');
COMMENT ON DOMAIN @extschema@.endpoint_disable_after IS
    'How long every attempt may fail before the endpoint is disabled: 1 minute to 365 days (null: never)';
REVOKE ALL ON DOMAIN @extschema@.endpoint_disable_after FROM PUBLIC;

-- ---------------------------------------------------------------- endpoints
-- max_in_flight and rate_limit hold across all workers; the default
-- max_in_flight is above what the default 2 workers x batch_size 100 can
-- hold.  id is the stable identity of an endpoint (kept across renames): the
-- workers key each endpoint's shared state (breaker, limits, statistics) by it.
CREATE TABLE @extschema@.endpoints (
    name              text        PRIMARY KEY,
    url               text        NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    signing_secret    text,
    timeout           interval    NOT NULL DEFAULT interval '10 seconds',
    max_in_flight     @extschema@.endpoint_max_in_flight NOT NULL DEFAULT 256,
    enabled           boolean     NOT NULL DEFAULT true,
    defer_statuses    @extschema@.http_statuses NOT NULL DEFAULT '{}'::integer[],
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    rate_limit        @extschema@.endpoint_rate_limit,
    breaker_threshold @extschema@.breaker_threshold NOT NULL DEFAULT 5,
    breaker_cooldown  @extschema@.breaker_cooldown NOT NULL DEFAULT interval '30 seconds',
    disabled_reason   text,
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    previous_signing_secret text,
    previous_secret_until   timestamptz,
    retry_schedule          @extschema@.retry_schedule,
    max_attempts            @extschema@.endpoint_max_attempts,
    disable_after           @extschema@.endpoint_disable_after DEFAULT interval '5 days',
    proxy                   text,
    client_cert             text,
    client_key              text,
    oauth_token_url         text,
    oauth_client_id         text,
    oauth_client_secret     text,
    oauth_scope             text,
    CONSTRAINT endpoints_id_key UNIQUE (id)
);

COMMENT ON TABLE @extschema@.endpoints IS
    'HTTP endpoints that outbox messages are delivered to';
COMMENT ON COLUMN @extschema@.endpoints.signing_secret IS
    'Standard Webhooks secret (whsec_<base64>); readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.defer_statuses IS
    'HTTP statuses meaning "not yet": rescheduled without using an attempt';
COMMENT ON COLUMN @extschema@.endpoints.max_in_flight IS
    'Requests in flight to this endpoint at most, across all workers';
COMMENT ON COLUMN @extschema@.endpoints.rate_limit IS
    'Messages per second at most, across all workers (null: no limit)';
COMMENT ON COLUMN @extschema@.endpoints.breaker_threshold IS
    'Consecutive retryable failures that open the circuit breaker (0: no breaker)';
COMMENT ON COLUMN @extschema@.endpoints.breaker_cooldown IS
    'How long an open breaker waits before one probe; doubled for each trip without a success';
COMMENT ON COLUMN @extschema@.endpoints.disabled_reason IS
    'Why the endpoint was disabled (410 Gone, pause_endpoint)';
COMMENT ON COLUMN @extschema@.endpoints.id IS
    'Stable identity of the endpoint (kept across renames): the key of its shared state';
COMMENT ON COLUMN @extschema@.endpoints.previous_signing_secret IS
    'The signing secret rotate_secret() replaced, still signed with until previous_secret_until; readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.previous_secret_until IS
    'When previous_signing_secret stops being sent (the end of the rotation''s grace period)';
COMMENT ON COLUMN @extschema@.endpoints.retry_schedule IS
    'Delays before the 1st, 2nd, ... retry (each jittered by up to 10 % either way; the last one repeats); null: outbox_dispatcher.backoff_base/backoff_cap';
COMMENT ON COLUMN @extschema@.endpoints.max_attempts IS
    'Attempts a message gets at most; null: one more than the retry_schedule has delays, or outbox_dispatcher.max_attempts';
COMMENT ON COLUMN @extschema@.endpoints.disable_after IS
    'Disable the endpoint once every attempt (every breaker failure, no success) has failed for this long; null: never';
COMMENT ON COLUMN @extschema@.endpoints.proxy IS
    'Proxy URL (http://, https://, socks5://, socks5h://; may hold credentials) for this endpoint; null: outbox_dispatcher.proxy; readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.client_cert IS
    'PEM certificate (chain) the workers present for TLS client authentication (mTLS), with client_key';
COMMENT ON COLUMN @extschema@.endpoints.client_key IS
    'PEM private key of client_cert; readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.oauth_token_url IS
    'OAuth 2.0 token endpoint (http:// or https://): deliveries carry a client-credentials access token as Authorization: Bearer; with oauth_client_id and oauth_client_secret';
COMMENT ON COLUMN @extschema@.endpoints.oauth_client_id IS
    'OAuth 2.0 client id (sent with the secret as HTTP Basic authentication to oauth_token_url)';
COMMENT ON COLUMN @extschema@.endpoints.oauth_client_secret IS
    'OAuth 2.0 client secret; readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.oauth_scope IS
    'Space-separated scopes asked for in the token request; null: none';

-- The row checks that need code (URL, header names and values, secret
-- format, timeout shorter than the lease; the domains above check the
-- ranges).  It also reports a missing required value itself, before the
-- NOT NULL constraint would, whose message would copy the row.
CREATE FUNCTION @extschema@._endpoint_check()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_endpoint_check_v030'
    LANGUAGE C
    SET search_path = pg_catalog, pg_temp;

CREATE TRIGGER endpoints_check
    BEFORE INSERT OR UPDATE ON @extschema@.endpoints
    FOR EACH ROW EXECUTE FUNCTION @extschema@._endpoint_check();

-- Tell the workers, at commit, that the endpoints changed: they reload
-- then, instead of re-reading the table every poll_interval.
CREATE FUNCTION @extschema@._endpoints_changed()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_endpoints_changed_trigger'
    LANGUAGE C
    SET search_path = pg_catalog, pg_temp;

CREATE TRIGGER endpoints_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._endpoints_changed();

-- A disable (410 Gone, disable_after, pause_endpoint, an UPDATE) is logged
-- and announced at commit on the channel outbox_endpoint_disabled.
CREATE FUNCTION @extschema@._endpoint_disabled()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_endpoint_disabled_trigger'
    LANGUAGE C
    SET search_path = pg_catalog, pg_temp;

CREATE TRIGGER endpoints_disabled
    AFTER UPDATE OF enabled ON @extschema@.endpoints
    FOR EACH ROW WHEN (OLD.enabled AND NOT NEW.enabled)
    EXECUTE FUNCTION @extschema@._endpoint_disabled();

-- ---------------------------------------------------------------- messages
-- The two CHECK constraints of messages are C functions of the columns
-- rather than SQL expressions: PostgreSQL keeps a CHECK constraint as the
-- text of its expression tree and parses and prepares it again for every
-- statement that inserts or updates the table.  The SQL forms
-- (status IN (...), (status = 'processing') = (lease_until IS NOT NULL))
-- are 1.8 kB of such text, read for every producer INSERT and for every
-- claim and finalize of the workers; a function call is a few hundred bytes.
-- Same rule as the SQL expressions (src/core/validate.cpp): a NULL status
-- gives NULL (status is NOT NULL anyway).  Whoever inserts or updates rows
-- needs EXECUTE on them (outbox_producer, outbox_admin; see privileges).
CREATE FUNCTION @extschema@._message_status_valid(status text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_message_status_valid'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@._message_status_valid(text) IS
    'messages_status_check: status is pending, processing, done or dead';
CREATE FUNCTION @extschema@._message_lease_valid(status text, lease_until timestamptz)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_message_lease_valid'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@._message_lease_valid(text, timestamptz) IS
    'messages_lease_check: lease_until is set exactly when status is processing';

CREATE TABLE @extschema@.messages (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    event_type       text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb,
    endpoint         text        NOT NULL DEFAULT 'default'
                     REFERENCES @extschema@.endpoints (name) ON UPDATE CASCADE,
    ordered          boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    status           text        NOT NULL DEFAULT 'pending'
                     CONSTRAINT messages_status_check
                     CHECK (@extschema@._message_status_valid(status)),
    available_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_until      timestamptz,
    lease_version    bigint      NOT NULL DEFAULT 0,
    last_error       text,
    last_http_status integer,
    done_at          timestamptz,
    ordered_after    xid8,
    dead_at          timestamptz,
    CONSTRAINT messages_lease_check
        CHECK (@extschema@._message_lease_valid(status, lease_until))
);

-- A queue table: every claim and finalize leaves dead row versions and dead
-- entries at the head of messages_ready.  Vacuum after a fixed number of
-- changes rather than after 20% of a table that is mostly retained done rows.
--
-- fillfactor 50: room on each page for the new versions a claim and a
-- finalize write, which then stay on the row's page and are WAL-logged as
-- the bytes that changed instead of the whole row (payload included),
-- without the extra row-lock record an update to another page writes.
-- Measured (20,000 ~250-byte messages, 2 workers): 1,478 B of WAL per
-- delivered message at fillfactor 100, 923 at 60, 800 at 50, 758 at 40; and
-- the table is smaller after the drain at 50 (2,266 pages) than at 100
-- (2,912), since versions no longer migrate.
ALTER TABLE @extschema@.messages SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.02,
    fillfactor = 50);

COMMENT ON TABLE @extschema@.messages IS
    'Transactional outbox: one row per message, delivered at least once';
COMMENT ON COLUMN @extschema@.messages.ordered_after IS
    'Ordered messages: claimed only once every transaction id below this has ended (set at insert; so a lower id committed later is delivered first)';
COMMENT ON COLUMN @extschema@.messages.dead_at IS
    'When the message last became dead (kept when it is retried): what recover() selects by';
COMMENT ON COLUMN @extschema@.messages.lease_version IS
    'Fencing token: incremented by every claim; finalizes must present it';

-- The workers claim endpoint by endpoint with per-endpoint quotas, so an
-- endpoint that is paused, broken or at its limits is never scanned.
CREATE INDEX messages_ready  ON @extschema@.messages (endpoint, available_at, id)
    WHERE status = 'pending';
-- The same rows as WHERE status = 'processing' (messages_lease_check ties
-- lease_until to it), but the reaper, the expired-lease arm of the claim and
-- the workers' next-deadline probe name no status, so this is the only index
-- whose predicate they imply: statistics taken while nothing was open cannot
-- make the planner walk messages_open and sort.
CREATE INDEX messages_leased ON @extschema@.messages (lease_until)
    WHERE lease_until IS NOT NULL;
-- The ordered head check: an earlier unfinished ordered message of the
-- same aggregate for the same endpoint (ordering is per aggregate per
-- endpoint, among its ordered messages).  Unordered messages are in no
-- sequence and so in this index at no point: neither the producer's insert
-- nor the claim and finalize of an unordered message touch it.
CREATE INDEX messages_open   ON @extschema@.messages (aggregate_type, aggregate_id, endpoint, id)
    WHERE ordered AND status <> 'done';
CREATE INDEX messages_done   ON @extschema@.messages (done_at)
    WHERE status = 'done';
CREATE INDEX messages_dead   ON @extschema@.messages (endpoint, id)
    WHERE status = 'dead';

CREATE FUNCTION @extschema@._message_check()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_message_check'
    LANGUAGE C;

-- Validates headers and payload size of every new row, whether it comes
-- from enqueue() or from a plain INSERT by the application (BEFORE: it also
-- completes the row), and of every update of a column that ends up on the
-- wire (AFTER, so that the workers' updates, which name none of them, lock
-- no row for it: a BEFORE ROW UPDATE trigger of any column list would).
CREATE TRIGGER messages_check
    BEFORE INSERT
    ON @extschema@.messages
    FOR EACH ROW EXECUTE FUNCTION @extschema@._message_check();
CREATE TRIGGER messages_check_update
    AFTER UPDATE OF aggregate_type, aggregate_id, event_type, headers, payload
    ON @extschema@.messages
    FOR EACH ROW EXECUTE FUNCTION @extschema@._message_check();

CREATE FUNCTION @extschema@._message_xid_first()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_message_xid_first'
    LANGUAGE C;

-- The inserting transaction gets its xid before the statement draws a
-- message id, so ordered_after (set by messages_check) covers every
-- transaction that holds a lower id.
CREATE TRIGGER messages_xid_first
    BEFORE INSERT ON @extschema@.messages
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._message_xid_first();

CREATE FUNCTION @extschema@._wake_trigger()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_wake_trigger'
    LANGUAGE C;

-- Wake the workers when a transaction that inserted messages commits.
CREATE TRIGGER messages_wake
    AFTER INSERT ON @extschema@.messages
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._wake_trigger();

-- ---------------------------------------------------------------- subscriptions (fan-out)
-- publish() creates one delivery (a row of outbox.messages) per endpoint
-- with at least one enabled subscription matching the event: one of its
-- event_types patterns matches the event type ('*' matches any run of
-- characters) and, when it has a filter, the payload contains the filter
-- (jsonb @>).  Deleting an endpoint deletes its subscriptions.
CREATE TABLE @extschema@.subscriptions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint    text        NOT NULL
                REFERENCES @extschema@.endpoints (name) ON UPDATE CASCADE ON DELETE CASCADE,
    event_types text[]      NOT NULL,
    filter      jsonb,
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX subscriptions_endpoint ON @extschema@.subscriptions (endpoint);

COMMENT ON TABLE @extschema@.subscriptions IS
    'Which events publish() delivers to which endpoint';
COMMENT ON COLUMN @extschema@.subscriptions.event_types IS
    'Event type patterns (1 to 64, each 1 to 256 bytes); * matches any run of characters, e.g. {order.*}';
COMMENT ON COLUMN @extschema@.subscriptions.filter IS
    'Null, or a JSON object the payload must contain (jsonb @>), e.g. {"country": "FR"}';

-- Patterns and filter are checked in code: a violated table constraint
-- would copy the row into the server log.
CREATE FUNCTION @extschema@._subscription_check()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_subscription_check'
    LANGUAGE C
    SET search_path = pg_catalog, pg_temp;

CREATE TRIGGER subscriptions_check
    BEFORE INSERT OR UPDATE ON @extschema@.subscriptions
    FOR EACH ROW EXECUTE FUNCTION @extschema@._subscription_check();

SELECT pg_catalog.pg_extension_config_dump('@extschema@.subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.subscriptions_id_seq', '');

-- ---------------------------------------------------------------- attempt log
-- One row per HTTP request the workers made, written in their finalize
-- transaction (outbox_dispatcher.attempt_log: all, failures or off).  A ring
-- of 32 partitions, one per UTC day modulo 32 (bucket): the workers keep
-- today and the attempt_log_retention days before it and TRUNCATE every
-- other partition, so old days go without dead rows or vacuum, and the
-- workers never run DDL.  Not dumped by pg_dump (a log, like the
-- statistics views).  response_body: the first 1 KB of the answer,
-- sanitized like last_error (readable by outbox_monitor and outbox_admin).
CREATE TABLE @extschema@.attempts (
    message_id    bigint           NOT NULL,
    lease_version bigint           NOT NULL,
    attempt       integer          NOT NULL,
    endpoint      text             NOT NULL,
    worker        integer          NOT NULL,
    started_at    timestamptz      NOT NULL,
    duration_ms   double precision NOT NULL,
    outcome       text             NOT NULL,
    http_status   integer,
    error_class   text,
    retry_after   text,
    response_body text,
    bucket        smallint         NOT NULL
) PARTITION BY LIST (bucket);

DO $partitions$
BEGIN
    FOR b IN 0..31 LOOP
        EXECUTE pg_catalog.format('CREATE TABLE @extschema@.%I PARTITION OF @extschema@.attempts FOR VALUES IN (%s)',
                                  'attempts_' || pg_catalog.lpad(b::text, 2, '0'), b);
    END LOOP;
END
$partitions$;

CREATE INDEX attempts_message ON @extschema@.attempts (message_id, lease_version);
CREATE INDEX attempts_started ON @extschema@.attempts USING brin (started_at) WITH (autosummarize = on);

COMMENT ON TABLE @extschema@.attempts IS
    'One row per HTTP attempt of the workers (outbox_dispatcher.attempt_log), kept outbox_dispatcher.attempt_log_retention';
COMMENT ON COLUMN @extschema@.attempts.lease_version IS
    'The claim that made the attempt (the fencing token): with message_id, one row per request';
COMMENT ON COLUMN @extschema@.attempts.attempt IS
    'X-Outbox-Attempt as sent (a deferred attempt is refunded, so the next request repeats the number)';
COMMENT ON COLUMN @extschema@.attempts.outcome IS
    'done, retry, defer or dead as the worker decided; lost when the lease had been taken over';
COMMENT ON COLUMN @extschema@.attempts.error_class IS
    'Null when an HTTP response came; else timeout, dns, connect, tls, connection, protocol or other';
COMMENT ON COLUMN @extschema@.attempts.bucket IS
    'UTC day number modulo 32: the partition (attempts_00 .. attempts_31)';

-- Keep users' messages and endpoints in pg_dump output.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.endpoints', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.messages', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.messages_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.endpoints_id_seq', '');

-- ---------------------------------------------------------------- producer API
-- enqueue() runs with the caller's rights (SECURITY INVOKER): row-level
-- security and current_user-based auditing on outbox.messages apply to it
-- as to a plain INSERT.  Producers may therefore read the name and enabled
-- columns of outbox.endpoints and the id column of outbox.messages (what
-- enqueue needs to check the endpoint and to return the new id).
CREATE FUNCTION @extschema@.enqueue(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    endpoint       text        DEFAULT 'default',
    ordered        boolean     DEFAULT false,
    available_at   timestamptz DEFAULT now(),
    headers        jsonb       DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_enqueue_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.enqueue(text, text, text, jsonb, text, boolean, timestamptz, jsonb) IS
    'Insert an outbox message in the current transaction; returns its id';

CREATE FUNCTION @extschema@.wake()
    RETURNS void
    AS 'MODULE_PATHNAME', 'od_wake_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.wake() IS
    'Wake the dispatcher workers when the current transaction commits (inserts into outbox.messages do this by themselves)';

-- ---------------------------------------------------------------- fan-out
-- publish() and subscribers() run with the caller's rights, like enqueue():
-- producers read the routing columns of outbox.subscriptions.
CREATE FUNCTION @extschema@.publish(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    ordered        boolean     DEFAULT false,
    available_at   timestamptz DEFAULT now(),
    headers        jsonb       DEFAULT NULL)
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'od_publish_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.subscribers(event_type text, payload jsonb)
    RETURNS SETOF text
    AS 'MODULE_PATHNAME', 'od_subscribers_sql'
    LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.publish(text, text, text, jsonb, boolean, timestamptz, jsonb) IS
    'Insert one delivery per endpoint subscribed to the event, in the current transaction; returns their ids (empty when none matches)';
COMMENT ON FUNCTION @extschema@.subscribers(text, jsonb) IS
    'The endpoints publish() would deliver this event to (for INSERT ... SELECT fan-out)';

-- ---------------------------------------------------------------- worker API
CREATE FUNCTION @extschema@.claim(
    owner        text,
    batch        integer,
    lease        interval,
    max_attempts integer DEFAULT NULL)
    RETURNS TABLE (
        id             bigint,
        lease_version  bigint,
        attempts       integer,
        endpoint       text,
        aggregate_type text,
        aggregate_id   text,
        event_type     text,
        payload        jsonb,
        headers        jsonb,
        ordered        boolean,
        created_at     timestamptz)
    AS 'MODULE_PATHNAME', 'od_claim_v022_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.claim(text, integer, interval, integer) IS
    'Lease up to batch ready messages for an external relay or a test. Not the workers'' claim: it takes no part in their shared limits (circuit breaker, rate_limit, max_in_flight) and its leases are not counted in endpoint_health.in_flight';

CREATE FUNCTION @extschema@.mark_done(
    id            bigint,
    lease_version bigint,
    http_status   integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_mark_done_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.reschedule(
    id             bigint,
    lease_version  bigint,
    delay          interval,
    error          text,
    refund_attempt boolean DEFAULT false,
    http_status    integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_reschedule_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.mark_dead(
    id            bigint,
    lease_version bigint,
    error         text,
    http_status   integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_mark_dead_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.mark_done(bigint, bigint, integer) IS
    'Fenced: processing -> done; false when the lease was lost';
COMMENT ON FUNCTION @extschema@.reschedule(bigint, bigint, interval, text, boolean, integer) IS
    'Fenced: processing -> pending after delay, optionally refunding the attempt; false when the lease was lost';
COMMENT ON FUNCTION @extschema@.mark_dead(bigint, bigint, text, integer) IS
    'Fenced: processing -> dead; false when the lease was lost';

-- ---------------------------------------------------------------- operator API
CREATE FUNCTION @extschema@.retry(id bigint)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_retry_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.retry_dead(
    endpoint   text DEFAULT NULL,
    event_type text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_retry_dead_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.skip(id bigint, reason text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_skip_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.purge(older_than interval)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_purge_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.retry(bigint) IS
    'dead -> pending now, attempts reset; false when the message is not dead';
COMMENT ON FUNCTION @extschema@.retry_dead(text, text) IS
    'retry() every dead message, optionally of one endpoint and/or event type; returns the count';
COMMENT ON FUNCTION @extschema@.skip(bigint, text) IS
    'Mark an unfinished message done without delivering it (unblocks an ordered aggregate)';
COMMENT ON FUNCTION @extschema@.purge(interval) IS
    'Delete done messages whose done_at is older than the interval; returns the count';

-- pause and resume are the library's: the same code that disables an
-- endpoint answering 410 Gone.
CREATE FUNCTION @extschema@.pause_endpoint(name text, reason text DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_pause_endpoint_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.resume_endpoint(name text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_resume_endpoint_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.replay(from_id bigint, to_id bigint, endpoint text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_replay_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.move_messages(
    from_endpoint text,
    to_endpoint   text,
    statuses      text[] DEFAULT ARRAY['pending', 'dead'])
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_move_messages_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.pause_endpoint(text, text) IS
    'Disable an endpoint (its messages wait, pending); false when it was already disabled';
COMMENT ON FUNCTION @extschema@.resume_endpoint(text) IS
    'Enable an endpoint again and wake the workers; false when it was enabled';
COMMENT ON FUNCTION @extschema@.replay(bigint, bigint, text) IS
    'Deliver done messages again: ids from_id..to_id (optionally of one endpoint) go back to pending; returns the count';
COMMENT ON FUNCTION @extschema@.move_messages(text, text, text[]) IS
    'Re-point pending and/or dead messages from one endpoint to another; returns the count';

-- recovery by time window: what died (dead_at) or was delivered (done_at) in [since, until)
CREATE FUNCTION @extschema@.recover(endpoint text, since timestamptz, until timestamptz DEFAULT now())
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_recover_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@.replay_window(endpoint text, since timestamptz, until timestamptz DEFAULT now())
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_replay_window_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.recover(text, timestamptz, timestamptz) IS
    'Dead messages of the endpoint that died in [since, until) go back to pending, attempts reset; returns the count';
COMMENT ON FUNCTION @extschema@.replay_window(text, timestamptz, timestamptz) IS
    'Done messages of the endpoint delivered in [since, until) are delivered again (back to pending, attempts reset); returns the count';

-- secret rotation: the replaced secret keeps signing (after the new one) for the grace period
CREATE FUNCTION @extschema@.rotate_secret(endpoint text, new_secret text, grace interval DEFAULT interval '24 hours')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'od_rotate_secret_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.rotate_secret(text, text, interval) IS
    'Make new_secret the endpoint''s signing secret; until the grace period ends deliveries carry a signature with the replaced one too; returns when that ends (null: no grace)';

-- ---------------------------------------------------------------- shared-memory state
CREATE FUNCTION @extschema@._lost_leases()
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_lost_leases_sql'
    LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@._worker_stats(
    OUT worker integer, OUT pid integer, OUT state text, OUT started_at timestamptz,
    OUT claimed bigint, OUT delivered bigint, OUT retried bigint, OUT deferred bigint,
    OUT dead bigint, OUT reaped bigint, OUT lost_leases bigint, OUT in_flight integer,
    OUT cycles bigint, OUT latency_avg_ms double precision, OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision, OUT latency_max_ms double precision,
    OUT last_error text, OUT last_error_at timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'od_worker_stats_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

-- Each endpoint's shared state, keyed by (the table's oid, endpoints.id).
CREATE FUNCTION @extschema@._endpoint_health(
    OUT relid oid, OUT endpoint_id bigint, OUT state text, OUT consecutive_failures integer, OUT trips integer,
    OUT opened_at timestamptz, OUT next_probe_at timestamptz, OUT in_flight integer,
    OUT last_http_status integer, OUT last_error text, OUT last_success_at timestamptz,
    OUT last_failure_at timestamptz, OUT delivered bigint, OUT failed bigint,
    OUT latency_avg_ms double precision, OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision, OUT latency_max_ms double precision,
    OUT failing_since timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'od_endpoint_health_v3_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

-- Enabled endpoints the workers cannot serve (outbox_dispatcher.max_endpoints).
CREATE FUNCTION @extschema@._endpoints_unserved()
    RETURNS integer
    AS 'MODULE_PATHNAME', 'od_endpoints_unserved_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

-- deliver_after_replication: workers holding claimed messages until the
-- synchronous standbys confirm them, how many, and since when.
CREATE FUNCTION @extschema@._replication_wait(
    OUT waiting_workers integer, OUT held_messages bigint, OUT waiting_since timestamptz)
    RETURNS record
    AS 'MODULE_PATHNAME', 'od_replication_wait_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------- views
-- By status, each count as in outbox.health (its subqueries match the partial indexes).
CREATE VIEW @extschema@.queue_depth AS
SELECT v.status, v.count
  FROM (VALUES (1, 'pending'::text, (SELECT count(*) FROM @extschema@.messages WHERE status = 'pending')),
               (2, 'processing', (SELECT count(*) FROM @extschema@.messages
                                   WHERE status = 'processing' AND lease_until IS NOT NULL)),
               (3, 'done', (SELECT count(*) FROM @extschema@.messages WHERE status = 'done')),
               (4, 'dead', (SELECT count(*) FROM @extschema@.messages WHERE status = 'dead')))
       AS v(ord, status, count)
 ORDER BY v.ord;

-- Each figure is its own subquery, written so that its condition implies the
-- predicate of one partial index (messages_ready, messages_leased,
-- messages_done, messages_dead): a look costs what the open messages cost,
-- plus an index-only count of the done ones, not a scan of the whole table
-- with its payloads (health: 840 -> 304 ms with 1,000,000 retained rows).  lease_until is
-- set exactly when the status is processing (messages_lease_check).  One
-- statement: every subquery reads the same snapshot.
CREATE VIEW @extschema@.health AS
SELECT (SELECT count(*) FROM @extschema@.messages WHERE status = 'pending')  AS pending,
       (SELECT count(*) FROM @extschema@.messages
         WHERE status = 'processing' AND lease_until IS NOT NULL)          AS processing,
       (SELECT count(*) FROM @extschema@.messages WHERE status = 'done')     AS done,
       (SELECT count(*) FROM @extschema@.messages WHERE status = 'dead')     AS dead,
       now() - least((SELECT min(created_at) FROM @extschema@.messages WHERE status = 'pending'),
                     (SELECT min(created_at) FROM @extschema@.messages
                       WHERE status = 'processing' AND lease_until IS NOT NULL))
                                                                           AS oldest_pending_age,
       (SELECT count(*) FROM @extschema@.messages
         WHERE status = 'processing' AND lease_until < now())              AS expired_leases,
       @extschema@._lost_leases()                                          AS lost_leases,
       (SELECT r.waiting_workers FROM @extschema@._replication_wait() AS r) AS replication_waiting_workers,
       now() - (SELECT r.waiting_since FROM @extschema@._replication_wait() AS r) AS replication_wait,
       (SELECT count(*) FROM @extschema@.messages
         WHERE status = 'pending' AND ordered
           AND ordered_after > pg_snapshot_xmin(pg_current_snapshot())
           AND ordered_after <= pg_snapshot_xmax(pg_current_snapshot()))  AS ordered_waiting_on_transactions,
       (SELECT now() - min(a.xact_start) FROM pg_catalog.pg_stat_activity AS a WHERE a.backend_xid IS NOT NULL)
                                                                           AS oldest_transaction_age;

-- Open messages only: the two partial indexes of the open states, never the done rows.
CREATE VIEW @extschema@.attempts_histogram AS
SELECT u.attempts, count(*) AS count
  FROM (SELECT attempts FROM @extschema@.messages WHERE status = 'pending'
        UNION ALL
        SELECT attempts FROM @extschema@.messages WHERE status = 'processing' AND lease_until IS NOT NULL) AS u
 GROUP BY u.attempts
 ORDER BY u.attempts;

CREATE VIEW @extschema@.dead_letters AS
SELECT id, endpoint, aggregate_type, aggregate_id, event_type, ordered, attempts,
       last_http_status, last_error, created_at, payload, dead_at
  FROM @extschema@.messages
 WHERE status = 'dead'
 ORDER BY id;

CREATE VIEW @extschema@.worker_stats AS
SELECT * FROM @extschema@._worker_stats();

-- Joins the shared state by id; enabled endpoints without a shared slot
-- show as 'unserved'.  max_in_flight and rate_limit are shown as their base
-- types, not as the domains of the table.
CREATE VIEW @extschema@.endpoint_health AS
SELECT e.name AS endpoint,
       e.enabled,
       CASE WHEN NOT e.enabled THEN e.disabled_reason END AS disabled_reason,
       coalesce(h.state,
                CASE WHEN e.enabled AND @extschema@._endpoints_unserved() > 0 THEN 'unserved' ELSE 'closed' END)
           AS state,
       coalesce(h.consecutive_failures, 0) AS consecutive_failures,
       coalesce(h.trips, 0) AS trips,
       h.opened_at,
       h.next_probe_at,
       coalesce(h.in_flight, 0) AS in_flight,
       e.max_in_flight::integer AS max_in_flight,
       e.rate_limit::double precision AS rate_limit,
       h.last_http_status,
       h.last_error,
       h.last_success_at,
       h.last_failure_at,
       coalesce(h.delivered, 0) AS delivered,
       coalesce(h.failed, 0) AS failed,
       h.latency_avg_ms,
       h.latency_p50_ms,
       h.latency_p99_ms,
       h.latency_max_ms,
       (SELECT count(*) FROM @extschema@.subscriptions AS s WHERE s.endpoint = e.name AND s.enabled)::integer
           AS subscriptions,
       h.failing_since,
       e.disable_after::interval AS disable_after
  FROM @extschema@.endpoints AS e
  LEFT JOIN @extschema@._endpoint_health() AS h ON h.relid = e.tableoid AND h.endpoint_id = e.id
 ORDER BY e.name;

-- The attempt log's last minute, per endpoint and outcome: reads only the
-- partitions of today and of a minute ago, and in them only the block
-- ranges of that minute (attempts_started is a BRIN index).
-- The bucket of a UTC day is the day number modulo 32, as od::attempt_bucket()
-- (src/core/attempt_log.cpp) computes it for the rows the workers insert:
-- the two must agree, or this view misses rows.
CREATE VIEW @extschema@.attempt_stats AS
SELECT a.endpoint,
       a.outcome,
       count(*) AS attempts,
       avg(a.duration_ms) AS duration_avg_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY a.duration_ms) AS duration_p50_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY a.duration_ms) AS duration_p99_ms,
       max(a.duration_ms) AS duration_max_ms
  FROM @extschema@.attempts AS a
 WHERE a.started_at >= now() - interval '1 minute'
   AND a.bucket IN (mod(floor(extract(epoch FROM now()) / 86400)::bigint, 32)::smallint,
                    mod(floor(extract(epoch FROM now() - interval '1 minute') / 86400)::bigint, 32)::smallint)
 GROUP BY a.endpoint, a.outcome
 ORDER BY a.endpoint, a.outcome;

COMMENT ON VIEW @extschema@.queue_depth IS 'Messages per status';
COMMENT ON VIEW @extschema@.worker_stats IS
    'One row per dispatcher worker, from shared memory (counters since the server started; latency p50/p99 are power-of-two upper bounds)';
COMMENT ON VIEW @extschema@.health IS 'One-row summary for alerting';
COMMENT ON VIEW @extschema@.attempts_histogram IS 'Attempts of unfinished messages (retries building up)';
COMMENT ON VIEW @extschema@.dead_letters IS 'Messages that need an operator';
COMMENT ON VIEW @extschema@.attempt_stats IS
    'HTTP attempts of the last minute per endpoint and outcome, from outbox.attempts (duration in milliseconds)';
COMMENT ON VIEW @extschema@.endpoint_health IS
    'Per endpoint: circuit breaker (state ''unserved'': no shared slot, see outbox_dispatcher.max_endpoints), in-flight count, delivery statistics since the server started (shared memory)';

-- ---------------------------------------------------------------- metrics
CREATE FUNCTION @extschema@._prom_label(value text)
    RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT replace(replace(replace(value, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n')
$$;

CREATE FUNCTION @extschema@.metrics()
    RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
WITH h AS (SELECT * FROM @extschema@.health),
-- queue_depth's four counts, taken from health's (one count of each state, not two)
q AS (SELECT s.status, s.count
        FROM h CROSS JOIN LATERAL (VALUES ('pending', h.pending), ('processing', h.processing),
                                          ('done', h.done), ('dead', h.dead)) AS s(status, count)),
w AS (SELECT * FROM @extschema@.worker_stats),
e AS (SELECT * FROM @extschema@.endpoint_health),
a AS (SELECT * FROM @extschema@.attempts_histogram),
t AS (SELECT endpoint, outcome, attempts, duration_avg_ms FROM @extschema@.attempt_stats),
lines AS (
    SELECT 1 AS ord, E'# HELP outbox_messages Messages in outbox.messages by status.\n# TYPE outbox_messages gauge\n'
                     || string_agg(format('outbox_messages{status="%s"} %s', status, count), E'\n' ORDER BY status) AS txt
      FROM q
    UNION ALL
    SELECT 2, format(E'# HELP outbox_oldest_pending_age_seconds Age of the oldest pending or processing message.\n'
                     '# TYPE outbox_oldest_pending_age_seconds gauge\noutbox_oldest_pending_age_seconds %s\n'
                     '# HELP outbox_expired_leases Processing messages whose lease has expired.\n'
                     '# TYPE outbox_expired_leases gauge\noutbox_expired_leases %s\n'
                     '# HELP outbox_lost_leases_total Fenced finalizes that found their lease taken over, since the server started.\n'
                     '# TYPE outbox_lost_leases_total counter\noutbox_lost_leases_total %s',
                     coalesce(extract(epoch FROM oldest_pending_age), 0), expired_leases, coalesce(lost_leases, 0))
      FROM h
    UNION ALL
    SELECT 3, E'# HELP outbox_unfinished_messages_by_attempts Pending and processing messages by attempts used.\n'
              '# TYPE outbox_unfinished_messages_by_attempts gauge'
              || coalesce(E'\n' || string_agg(format('outbox_unfinished_messages_by_attempts{attempts="%s"} %s', attempts, count),
                                               E'\n' ORDER BY attempts), '')
      FROM a
    UNION ALL
    SELECT 4, string_agg(m.block, E'\n' ORDER BY m.k)
      FROM (SELECT k, format(E'# HELP outbox_worker_%s_total %s\n# TYPE outbox_worker_%s_total counter\n', name, help, name)
                      || string_agg(format('outbox_worker_%s_total{worker="%s"} %s', name, w.worker, val), E'\n' ORDER BY w.worker) AS block
              FROM w, LATERAL (VALUES
                  (1, 'claimed', 'Messages claimed by the worker.', w.claimed),
                  (2, 'delivered', 'Messages delivered (2xx) by the worker.', w.delivered),
                  (3, 'retried', 'Messages rescheduled after a retryable failure.', w.retried),
                  (4, 'deferred', 'Messages deferred by a defer status.', w.deferred),
                  (5, 'dead', 'Messages that became dead.', w.dead),
                  (6, 'lost_leases', 'Results discarded because the lease was lost.', w.lost_leases)) AS v(k, name, help, val)
             GROUP BY k, name, help) AS m
    UNION ALL
    SELECT 5, E'# HELP outbox_worker_up Whether the worker is running.\n# TYPE outbox_worker_up gauge\n'
              || string_agg(format('outbox_worker_up{worker="%s"} %s', worker, (pid IS NOT NULL)::int), E'\n' ORDER BY worker)
              || E'\n# HELP outbox_worker_in_flight Requests in flight.\n# TYPE outbox_worker_in_flight gauge\n'
              || string_agg(format('outbox_worker_in_flight{worker="%s"} %s', worker, in_flight), E'\n' ORDER BY worker)
              || E'\n# HELP outbox_worker_http_latency_avg_seconds Mean HTTP request duration.\n# TYPE outbox_worker_http_latency_avg_seconds gauge\n'
              || string_agg(format('outbox_worker_http_latency_avg_seconds{worker="%s"} %s', worker, coalesce(latency_avg_ms, 0) / 1000.0), E'\n' ORDER BY worker)
      FROM w
    UNION ALL
    SELECT 6, E'# HELP outbox_endpoint_up Whether the endpoint is enabled.\n# TYPE outbox_endpoint_up gauge\n'
              || string_agg(format('outbox_endpoint_up{endpoint="%s"} %s', @extschema@._prom_label(endpoint), enabled::int), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_breaker_open Whether the circuit breaker is open or half-open.\n# TYPE outbox_endpoint_breaker_open gauge\n'
              || string_agg(format('outbox_endpoint_breaker_open{endpoint="%s"} %s', @extschema@._prom_label(endpoint), (state <> 'closed')::int), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_in_flight Requests in flight to the endpoint, all workers.\n# TYPE outbox_endpoint_in_flight gauge\n'
              || string_agg(format('outbox_endpoint_in_flight{endpoint="%s"} %s', @extschema@._prom_label(endpoint), in_flight), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_delivered_total Deliveries answered 2xx, since the server started.\n# TYPE outbox_endpoint_delivered_total counter\n'
              || string_agg(format('outbox_endpoint_delivered_total{endpoint="%s"} %s', @extschema@._prom_label(endpoint), delivered), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_failed_total Retryable failures, since the server started.\n# TYPE outbox_endpoint_failed_total counter\n'
              || string_agg(format('outbox_endpoint_failed_total{endpoint="%s"} %s', @extschema@._prom_label(endpoint), failed), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_subscriptions Enabled subscriptions of the endpoint (fan-out).\n# TYPE outbox_endpoint_subscriptions gauge\n'
              || string_agg(format('outbox_endpoint_subscriptions{endpoint="%s"} %s', @extschema@._prom_label(endpoint), subscriptions), E'\n' ORDER BY endpoint)
              || E'\n# HELP outbox_endpoint_failing_seconds How long every attempt to the endpoint has failed (0: the last one succeeded); disable_after is measured by it.\n# TYPE outbox_endpoint_failing_seconds gauge\n'
              || string_agg(format('outbox_endpoint_failing_seconds{endpoint="%s"} %s', @extschema@._prom_label(endpoint),
                                   coalesce(extract(epoch FROM now() - failing_since), 0)), E'\n' ORDER BY endpoint)
      FROM e
    UNION ALL
    SELECT 7, format(E'# HELP outbox_endpoints_unserved Enabled endpoints the workers cannot serve (outbox_dispatcher.max_endpoints is too low).\n'
                     '# TYPE outbox_endpoints_unserved gauge\noutbox_endpoints_unserved %s',
                     coalesce(@extschema@._endpoints_unserved(), 0))
    UNION ALL
    SELECT 8, format(E'# HELP outbox_replication_waiting_workers Workers holding claimed messages until the synchronous standbys confirm them (deliver_after_replication).\n'
                     '# TYPE outbox_replication_waiting_workers gauge\noutbox_replication_waiting_workers %s\n'
                     '# HELP outbox_replication_held_messages Claimed messages not sent until the synchronous standbys confirm them.\n'
                     '# TYPE outbox_replication_held_messages gauge\noutbox_replication_held_messages %s\n'
                     '# HELP outbox_replication_wait_seconds How long the oldest wait for the synchronous standbys has lasted.\n'
                     '# TYPE outbox_replication_wait_seconds gauge\noutbox_replication_wait_seconds %s',
                     r.waiting_workers, r.held_messages, coalesce(extract(epoch FROM now() - r.waiting_since), 0))
      FROM @extschema@._replication_wait() AS r
    UNION ALL
    SELECT 9, format(E'# HELP outbox_ordered_waiting_on_transactions Ordered messages held back until older transactions end.\n'
                     '# TYPE outbox_ordered_waiting_on_transactions gauge\noutbox_ordered_waiting_on_transactions %s\n'
                     '# HELP outbox_oldest_transaction_age_seconds Age of the oldest transaction with an xid (ordered messages wait for it; needs pg_read_all_stats).\n'
                     '# TYPE outbox_oldest_transaction_age_seconds gauge\noutbox_oldest_transaction_age_seconds %s',
                     ordered_waiting_on_transactions, coalesce(extract(epoch FROM oldest_transaction_age), 0))
      FROM h
    UNION ALL
    SELECT 10, E'# HELP outbox_attempts_last_minute HTTP attempts of the last minute by endpoint and outcome (outbox.attempts).\n'
               '# TYPE outbox_attempts_last_minute gauge'
               || coalesce(E'\n' || string_agg(format('outbox_attempts_last_minute{endpoint="%s",outcome="%s"} %s',
                                                         @extschema@._prom_label(endpoint), outcome, attempts),
                                                  E'\n' ORDER BY endpoint, outcome), '')
               || E'\n# HELP outbox_attempt_duration_avg_seconds Mean HTTP attempt duration of the last minute by endpoint and outcome (outbox.attempts; percentiles: view outbox.attempt_stats).\n'
               '# TYPE outbox_attempt_duration_avg_seconds gauge'
               || coalesce(E'\n' || string_agg(format('outbox_attempt_duration_avg_seconds{endpoint="%s",outcome="%s"} %s',
                                                         @extschema@._prom_label(endpoint), outcome, duration_avg_ms / 1000.0),
                                                  E'\n' ORDER BY endpoint, outcome), '')
      FROM t
)
SELECT string_agg(txt, E'\n' ORDER BY ord) || E'\n' FROM lines WHERE txt IS NOT NULL
$$;

COMMENT ON FUNCTION @extschema@.metrics() IS
    'Prometheus text exposition of the queue, the workers and the endpoints';

-- ---------------------------------------------------------------- privileges
-- Nothing for PUBLIC.  Functions are EXECUTE-able by PUBLIC by default.
-- (endpoints_id_seq, the identity of endpoints.id, keeps its default ACL:
-- owner only.)
REVOKE ALL ON ALL TABLES    IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.messages_id_seq FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;

GRANT USAGE ON SCHEMA @extschema@ TO outbox_producer, outbox_monitor, outbox_admin;

-- monitors: the views, the messages, endpoints without their secret
GRANT SELECT ON @extschema@.queue_depth, @extschema@.health,
                @extschema@.attempts_histogram, @extschema@.dead_letters,
                @extschema@.worker_stats, @extschema@.endpoint_health, @extschema@.messages,
                @extschema@.subscriptions, @extschema@.attempts, @extschema@.attempt_stats
    TO outbox_monitor;
GRANT SELECT (name, url, headers, timeout, max_in_flight, enabled, defer_statuses,
              created_at, updated_at, rate_limit, breaker_threshold, breaker_cooldown,
              disabled_reason, id, previous_secret_until, retry_schedule, max_attempts, disable_after,
              client_cert, oauth_token_url, oauth_client_id, oauth_scope)
    ON @extschema@.endpoints TO outbox_monitor;
GRANT EXECUTE ON FUNCTION @extschema@._lost_leases(), @extschema@._worker_stats(),
    @extschema@._endpoint_health(), @extschema@._endpoints_unserved(),
    @extschema@._replication_wait(),
    @extschema@._prom_label(text), @extschema@.metrics()
    TO outbox_monitor;

-- producers: enqueue, or INSERT the producer columns (never status/lease
-- columns); enqueue runs with their rights and reads what it checks and returns
GRANT INSERT (aggregate_type, aggregate_id, event_type, payload, headers,
              endpoint, ordered, available_at)
    ON @extschema@.messages TO outbox_producer;
GRANT SELECT (id) ON @extschema@.messages TO outbox_producer;
GRANT SELECT (name, enabled) ON @extschema@.endpoints TO outbox_producer;
GRANT SELECT (endpoint, event_types, filter, enabled) ON @extschema@.subscriptions TO outbox_producer;
GRANT EXECUTE ON FUNCTION @extschema@.enqueue(text, text, text, jsonb, text, boolean, timestamptz, jsonb),
                          @extschema@.publish(text, text, text, jsonb, boolean, timestamptz, jsonb),
                          @extschema@.subscribers(text, jsonb),
                          @extschema@.wake(),
                          @extschema@._message_status_valid(text),
                          @extschema@._message_lease_valid(text, timestamptz)
    TO outbox_producer;
GRANT EXECUTE ON FUNCTION @extschema@.subscribers(text, jsonb) TO outbox_monitor;

-- admins: everything, including the workers' claim/finalize API
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.endpoints, @extschema@.messages,
                                       @extschema@.subscriptions TO outbox_admin;
GRANT SELECT ON @extschema@.queue_depth, @extschema@.health,
                @extschema@.attempts_histogram, @extschema@.dead_letters,
                @extschema@.worker_stats, @extschema@.endpoint_health, @extschema@.attempt_stats
    TO outbox_admin;
-- the workers write the attempt log and empty its old partitions
GRANT SELECT, INSERT, DELETE, TRUNCATE ON @extschema@.attempts TO outbox_admin;
DO $attempt_grants$
BEGIN
    FOR b IN 0..31 LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, DELETE, TRUNCATE ON @extschema@.%I TO outbox_admin',
                                  'attempts_' || pg_catalog.lpad(b::text, 2, '0'));
    END LOOP;
END
$attempt_grants$;
GRANT USAGE, SELECT ON SEQUENCE @extschema@.messages_id_seq TO outbox_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA @extschema@ TO outbox_admin;
