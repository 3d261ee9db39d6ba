/*
 * outbox_dispatcher 0.2.0 -> 0.2.1: security release (docs/security.md).
 *
 *  - Every function of the extension runs with search_path pinned to
 *    pg_catalog, pg_temp (the C functions also pin it themselves around
 *    their SQL; the two trigger functions on the producers' insert path run
 *    no SQL and are left without a SET clause, which would cost every row).
 *  - enqueue() runs with the caller's rights (SECURITY INVOKER): row-level
 *    security and current_user-based auditing on outbox.messages apply to
 *    it as to a plain INSERT.  Producers may therefore read the name and
 *    enabled columns of outbox.endpoints and the id column of
 *    outbox.messages (what enqueue needs to check the endpoint and to
 *    return the new id).
 *  - outbox.endpoints gains a stable id: the workers key each endpoint's
 *    shared state (breaker, limits, statistics) by it instead of by name.
 *  - endpoint_health joins that state by id and shows enabled endpoints the
 *    workers cannot serve (outbox_dispatcher.max_endpoints) as 'unserved';
 *    metrics() gains outbox_endpoints_unserved.
 *  - The database must be UTF8.
 */

\echo Use "ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.1'" to load this file. \quit

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

-- ---------------------------------------------------------------- search_path
ALTER FUNCTION @extschema@._endpoint_check() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.wake() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.claim(text, integer, interval, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.mark_done(bigint, bigint, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.reschedule(bigint, bigint, interval, text, boolean, integer)
    SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.mark_dead(bigint, bigint, text, integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.retry(bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.retry_dead(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.skip(bigint, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.purge(interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@._lost_leases() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@._worker_stats() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.replay(bigint, bigint, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.move_messages(text, text, text[]) SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------- enqueue with the caller's rights
ALTER FUNCTION @extschema@.enqueue(text, text, text, jsonb, text, boolean, timestamptz, jsonb) SECURITY INVOKER;
GRANT SELECT (name, enabled) ON @extschema@.endpoints TO outbox_producer;
GRANT SELECT (id) ON @extschema@.messages TO outbox_producer;

-- ---------------------------------------------------------------- endpoint ids
ALTER TABLE @extschema@.endpoints
    ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY,
    ADD CONSTRAINT endpoints_id_key UNIQUE (id);
COMMENT ON COLUMN @extschema@.endpoints.id IS
    'Stable identity of the endpoint (kept across renames): the key of its shared state';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.endpoints_id_seq', '');
GRANT SELECT (id) ON @extschema@.endpoints TO outbox_monitor;

-- ---------------------------------------------------------------- endpoint health by id
DROP VIEW @extschema@.endpoint_health;
DROP FUNCTION @extschema@._endpoint_health();

CREATE FUNCTION @extschema@._endpoint_health(
    OUT relid oid, OUT endpoint_id bigint, OUT state text, OUT consecutive_failures integer, OUT trips integer,
    OUT opened_at timestamptz, OUT next_probe_at timestamptz, OUT in_flight integer,
    OUT last_http_status integer, OUT last_error text, OUT last_success_at timestamptz,
    OUT last_failure_at timestamptz, OUT delivered bigint, OUT failed bigint,
    OUT latency_avg_ms double precision, OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision, OUT latency_max_ms double precision)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'od_endpoint_health_v2_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION @extschema@._endpoints_unserved()
    RETURNS integer
    AS 'MODULE_PATHNAME', 'od_endpoints_unserved_sql'
    LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;

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
       e.max_in_flight,
       e.rate_limit,
       h.last_http_status,
       h.last_error,
       h.last_success_at,
       h.last_failure_at,
       coalesce(h.delivered, 0) AS delivered,
       coalesce(h.failed, 0) AS failed,
       h.latency_avg_ms,
       h.latency_p50_ms,
       h.latency_p99_ms,
       h.latency_max_ms
  FROM @extschema@.endpoints AS e
  LEFT JOIN @extschema@._endpoint_health() AS h ON h.relid = e.tableoid AND h.endpoint_id = e.id
 ORDER BY e.name;

COMMENT ON VIEW @extschema@.endpoint_health IS
    'Per endpoint: circuit breaker (state ''unserved'': no shared slot, see outbox_dispatcher.max_endpoints), in-flight count, delivery statistics since the server started (shared memory)';

CREATE OR REPLACE FUNCTION @extschema@.metrics()
    RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
WITH h AS (SELECT * FROM @extschema@.health),
q AS (SELECT * FROM @extschema@.queue_depth),
w AS (SELECT * FROM @extschema@.worker_stats),
e AS (SELECT * FROM @extschema@.endpoint_health),
a AS (SELECT * FROM @extschema@.attempts_histogram),
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
      FROM e
    UNION ALL
    SELECT 7, format(E'# HELP outbox_endpoints_unserved Enabled endpoints the workers cannot serve (outbox_dispatcher.max_endpoints is too low).\n'
                     '# TYPE outbox_endpoints_unserved gauge\noutbox_endpoints_unserved %s',
                     coalesce(@extschema@._endpoints_unserved(), 0))
)
SELECT string_agg(txt, E'\n' ORDER BY ord) || E'\n' FROM lines WHERE txt IS NOT NULL
$$;


-- ---------------------------------------------------------------- privileges
REVOKE ALL ON FUNCTION @extschema@._endpoint_health(), @extschema@._endpoints_unserved() FROM PUBLIC;
GRANT SELECT ON @extschema@.endpoint_health TO outbox_monitor, outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@._endpoint_health(), @extschema@._endpoints_unserved()
    TO outbox_monitor, outbox_admin;
