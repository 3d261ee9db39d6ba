/*
 * outbox_dispatcher 0.1.0 - schema, state machine and monitoring surface.
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
 * Indexes are chosen so that claiming costs O(batch), whatever the number of
 * retained done/dead rows, of rows scheduled for later, and of the backlog:
 *   messages_ready   (available_at, id) WHERE pending    -- ready rows, oldest first
 *   messages_leased  (lease_until)      WHERE processing -- expired leases / reaping
 *   messages_open    (aggregate_type, aggregate_id, id) WHERE status <> 'done'
 *                                                        -- ordered head check
 *   messages_done    (done_at)          WHERE done       -- retention purge
 *   messages_dead    (endpoint, id)     WHERE dead       -- dead letters, retry_dead
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

-- ---------------------------------------------------------------- endpoints
CREATE TABLE @extschema@.endpoints (
    name            text        PRIMARY KEY,
    url             text        NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    signing_secret  text,
    timeout         interval    NOT NULL DEFAULT interval '10 seconds',
    max_in_flight   integer     NOT NULL DEFAULT 64,
    enabled         boolean     NOT NULL DEFAULT true,
    defer_statuses  integer[]   NOT NULL DEFAULT '{}'::integer[],
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE @extschema@.endpoints IS
    'HTTP endpoints that outbox messages are delivered to';
COMMENT ON COLUMN @extschema@.endpoints.signing_secret IS
    'Standard Webhooks secret (whsec_<base64>); readable by outbox_admin only';
COMMENT ON COLUMN @extschema@.endpoints.defer_statuses IS
    'HTTP statuses meaning "not yet": rescheduled without using an attempt';

CREATE FUNCTION @extschema@._endpoint_check()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_endpoint_check'
    LANGUAGE C;

CREATE TRIGGER endpoints_check
    BEFORE INSERT OR UPDATE ON @extschema@.endpoints
    FOR EACH ROW EXECUTE FUNCTION @extschema@._endpoint_check();

-- ---------------------------------------------------------------- messages
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
                     CHECK (status IN ('pending', 'processing', 'done', 'dead')),
    available_at     timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_until      timestamptz,
    lease_version    bigint      NOT NULL DEFAULT 0,
    last_error       text,
    last_http_status integer,
    done_at          timestamptz,
    CONSTRAINT messages_lease_check
        CHECK ((status = 'processing') = (lease_until IS NOT NULL))
);

-- A queue table: every claim and finalize leaves dead row versions and dead
-- entries at the head of messages_ready.  Vacuum after a fixed number of
-- changes rather than after 20% of a table that is mostly retained done rows.
ALTER TABLE @extschema@.messages SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.02);

COMMENT ON TABLE @extschema@.messages IS
    'Transactional outbox: one row per message, delivered at least once';
COMMENT ON COLUMN @extschema@.messages.lease_version IS
    'Fencing token: incremented by every claim; finalizes must present it';

CREATE INDEX messages_ready  ON @extschema@.messages (available_at, id)
    WHERE status = 'pending';
CREATE INDEX messages_leased ON @extschema@.messages (lease_until)
    WHERE status = 'processing';
CREATE INDEX messages_open   ON @extschema@.messages (aggregate_type, aggregate_id, id)
    WHERE status <> 'done';
CREATE INDEX messages_done   ON @extschema@.messages (done_at)
    WHERE status = 'done';
CREATE INDEX messages_dead   ON @extschema@.messages (endpoint, id)
    WHERE status = 'dead';

CREATE FUNCTION @extschema@._message_check()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_message_check'
    LANGUAGE C;

-- Validates headers and payload size of every new row, whether it comes
-- from enqueue() or from a plain INSERT by the application, and of every
-- update of a column that ends up on the wire.
CREATE TRIGGER messages_check
    BEFORE INSERT OR UPDATE OF aggregate_type, aggregate_id, event_type, headers, payload
    ON @extschema@.messages
    FOR EACH ROW EXECUTE FUNCTION @extschema@._message_check();

CREATE FUNCTION @extschema@._wake_trigger()
    RETURNS trigger
    AS 'MODULE_PATHNAME', 'od_wake_trigger'
    LANGUAGE C;

-- Wake the workers when a transaction that inserted messages commits.
CREATE TRIGGER messages_wake
    AFTER INSERT ON @extschema@.messages
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._wake_trigger();

-- Keep users' messages and endpoints in pg_dump output.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.endpoints', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.messages', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.messages_id_seq', '');

-- ---------------------------------------------------------------- producer API
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
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.enqueue(text, text, text, jsonb, text, boolean, timestamptz, jsonb) IS
    'Insert an outbox message in the current transaction; returns its id';

CREATE FUNCTION @extschema@.wake()
    RETURNS void
    AS 'MODULE_PATHNAME', 'od_wake_sql'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.wake() IS
    'Wake the dispatcher workers when the current transaction commits (inserts into outbox.messages do this by themselves)';

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
    AS 'MODULE_PATHNAME', 'od_claim_sql'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.claim(text, integer, interval, integer) IS
    'Reap exhausted expired leases, then lease up to batch ready messages (max_attempts defaults to outbox_dispatcher.max_attempts)';

CREATE FUNCTION @extschema@.mark_done(
    id            bigint,
    lease_version bigint,
    http_status   integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_mark_done_sql'
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.reschedule(
    id             bigint,
    lease_version  bigint,
    delay          interval,
    error          text,
    refund_attempt boolean DEFAULT false,
    http_status    integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_reschedule_sql'
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.mark_dead(
    id            bigint,
    lease_version bigint,
    error         text,
    http_status   integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_mark_dead_sql'
    LANGUAGE C VOLATILE;

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
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.retry_dead(
    endpoint   text DEFAULT NULL,
    event_type text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_retry_dead_sql'
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.skip(id bigint, reason text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'od_skip_sql'
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.purge(older_than interval)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_purge_sql'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.retry(bigint) IS
    'dead -> pending now, attempts reset; false when the message is not dead';
COMMENT ON FUNCTION @extschema@.retry_dead(text, text) IS
    'retry() every dead message, optionally of one endpoint and/or event type; returns the count';
COMMENT ON FUNCTION @extschema@.skip(bigint, text) IS
    'Mark an unfinished message done without delivering it (unblocks an ordered aggregate)';
COMMENT ON FUNCTION @extschema@.purge(interval) IS
    'Delete done messages whose done_at is older than the interval; returns the count';

CREATE FUNCTION @extschema@._lost_leases()
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_lost_leases_sql'
    LANGUAGE C STABLE;

CREATE FUNCTION @extschema@._worker_stats(
    OUT worker integer, OUT pid integer, OUT state text, OUT started_at timestamptz,
    OUT claimed bigint, OUT delivered bigint, OUT retried bigint, OUT deferred bigint,
    OUT dead bigint, OUT reaped bigint, OUT lost_leases bigint, OUT in_flight integer,
    OUT cycles bigint, OUT latency_avg_ms double precision, OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision, OUT latency_max_ms double precision,
    OUT last_error text, OUT last_error_at timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'od_worker_stats_sql'
    LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------- views
CREATE VIEW @extschema@.queue_depth AS
SELECT s.status, count(m.id) AS count
  FROM unnest(ARRAY['pending', 'processing', 'done', 'dead']) WITH ORDINALITY AS s(status, ord)
  LEFT JOIN @extschema@.messages AS m ON m.status = s.status
 GROUP BY s.status, s.ord
 ORDER BY s.ord;

CREATE VIEW @extschema@.health AS
SELECT count(*) FILTER (WHERE status = 'pending')                          AS pending,
       count(*) FILTER (WHERE status = 'processing')                       AS processing,
       count(*) FILTER (WHERE status = 'done')                             AS done,
       count(*) FILTER (WHERE status = 'dead')                             AS dead,
       now() - min(created_at) FILTER (WHERE status IN ('pending', 'processing'))
                                                                           AS oldest_pending_age,
       count(*) FILTER (WHERE status = 'processing' AND lease_until < now()) AS expired_leases,
       @extschema@._lost_leases()                                          AS lost_leases
  FROM @extschema@.messages;

CREATE VIEW @extschema@.attempts_histogram AS
SELECT attempts, count(*) AS count
  FROM @extschema@.messages
 WHERE status IN ('pending', 'processing')
 GROUP BY attempts
 ORDER BY attempts;

CREATE VIEW @extschema@.dead_letters AS
SELECT id, endpoint, aggregate_type, aggregate_id, event_type, ordered, attempts,
       last_http_status, last_error, created_at, payload
  FROM @extschema@.messages
 WHERE status = 'dead'
 ORDER BY id;

CREATE VIEW @extschema@.worker_stats AS
SELECT * FROM @extschema@._worker_stats();

COMMENT ON VIEW @extschema@.queue_depth IS 'Messages per status';
COMMENT ON VIEW @extschema@.worker_stats IS
    'One row per dispatcher worker, from shared memory (counters since the server started; latency p50/p99 are power-of-two upper bounds)';
COMMENT ON VIEW @extschema@.health IS 'One-row summary for alerting';
COMMENT ON VIEW @extschema@.attempts_histogram IS 'Attempts of unfinished messages (retries building up)';
COMMENT ON VIEW @extschema@.dead_letters IS 'Messages that need an operator';

-- ---------------------------------------------------------------- privileges
-- Nothing for PUBLIC.  Functions are EXECUTE-able by PUBLIC by default.
REVOKE ALL ON ALL TABLES    IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;

GRANT USAGE ON SCHEMA @extschema@ TO outbox_producer, outbox_monitor, outbox_admin;

-- producers: enqueue, or INSERT the producer columns (never status/lease columns)
GRANT INSERT (aggregate_type, aggregate_id, event_type, payload, headers,
              endpoint, ordered, available_at)
    ON @extschema@.messages TO outbox_producer;
GRANT EXECUTE ON FUNCTION @extschema@.enqueue(text, text, text, jsonb, text, boolean, timestamptz, jsonb),
                          @extschema@.wake()
    TO outbox_producer;

-- monitors: the views, the messages, endpoints without their secret
GRANT SELECT ON @extschema@.queue_depth, @extschema@.health,
                @extschema@.attempts_histogram, @extschema@.dead_letters,
                @extschema@.worker_stats, @extschema@.messages
    TO outbox_monitor;
GRANT SELECT (name, url, headers, timeout, max_in_flight, enabled, defer_statuses,
              created_at, updated_at)
    ON @extschema@.endpoints TO outbox_monitor;
GRANT EXECUTE ON FUNCTION @extschema@._lost_leases(), @extschema@._worker_stats() TO outbox_monitor;

-- admins: everything, including the workers' claim/finalize API
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.endpoints, @extschema@.messages TO outbox_admin;
GRANT SELECT ON @extschema@.queue_depth, @extschema@.health,
                @extschema@.attempts_histogram, @extschema@.dead_letters,
                @extschema@.worker_stats
    TO outbox_admin;
GRANT USAGE, SELECT ON SEQUENCE @extschema@.messages_id_seq TO outbox_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA @extschema@ TO outbox_admin;
