/*
 * outbox_dispatcher 0.1.0 -> 0.2.0: endpoint health and operations.
 *
 *  - outbox.endpoints gains per-endpoint limits: rate_limit (messages per
 *    second, shared by all workers), breaker_threshold and breaker_cooldown
 *    (circuit breaker), and disabled_reason (set when a 410 Gone disables an
 *    endpoint, or by pause_endpoint()).  max_in_flight now holds across all
 *    workers, not per worker.
 *  - messages_ready becomes (endpoint, available_at, id) WHERE pending: the
 *    workers claim endpoint by endpoint with per-endpoint quotas, so an
 *    endpoint that is paused, broken or at its limits is never scanned.
 *  - outbox.endpoint_health, outbox.metrics() (Prometheus text), and the
 *    operator functions pause_endpoint, resume_endpoint, replay,
 *    move_messages.
 *
 * Rebuilding messages_ready locks outbox.messages against writes for the
 * duration of the index build; see docs/operations.md, "Upgrading".
 */

\echo Use "ALTER EXTENSION outbox_dispatcher UPDATE TO '0.2.0'" to load this file. \quit

-- ---------------------------------------------------------------- endpoints
ALTER TABLE @extschema@.endpoints
    ADD COLUMN rate_limit        double precision,
    ADD COLUMN breaker_threshold integer  NOT NULL DEFAULT 5,
    ADD COLUMN breaker_cooldown  interval NOT NULL DEFAULT interval '30 seconds',
    ADD COLUMN disabled_reason   text;

-- max_in_flight now counts all workers together: the new default is above what
-- the default 2 workers x batch_size 100 can hold (existing rows keep their value).
ALTER TABLE @extschema@.endpoints ALTER COLUMN max_in_flight SET DEFAULT 256;

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

GRANT SELECT (rate_limit, breaker_threshold, breaker_cooldown, disabled_reason)
    ON @extschema@.endpoints TO outbox_monitor;

-- ---------------------------------------------------------------- claim index
DROP INDEX @extschema@.messages_ready;
CREATE INDEX messages_ready ON @extschema@.messages (endpoint, available_at, id)
    WHERE status = 'pending';

-- ---------------------------------------------------------------- endpoint health
CREATE FUNCTION @extschema@._endpoint_health(
    OUT endpoint text, OUT state text, OUT consecutive_failures integer, OUT trips integer,
    OUT opened_at timestamptz, OUT next_probe_at timestamptz, OUT in_flight integer,
    OUT last_http_status integer, OUT last_error text, OUT last_success_at timestamptz,
    OUT last_failure_at timestamptz, OUT delivered bigint, OUT failed bigint,
    OUT latency_avg_ms double precision, OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision, OUT latency_max_ms double precision)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'od_endpoint_health_sql'
    LANGUAGE C VOLATILE;

CREATE VIEW @extschema@.endpoint_health AS
SELECT e.name AS endpoint,
       e.enabled,
       CASE WHEN NOT e.enabled THEN e.disabled_reason END AS disabled_reason,
       coalesce(h.state, 'closed') AS state,
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
  LEFT JOIN @extschema@._endpoint_health() AS h ON h.endpoint = e.name
 ORDER BY e.name;

COMMENT ON VIEW @extschema@.endpoint_health IS
    'Per endpoint: circuit breaker, in-flight count, delivery statistics since the server started (shared memory)';

-- ---------------------------------------------------------------- operator functions
CREATE FUNCTION @extschema@.pause_endpoint(name text, reason text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @extschema@.endpoints AS e WHERE e.name = pause_endpoint.name) THEN
        RAISE EXCEPTION 'endpoint "%" does not exist', name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE @extschema@.endpoints AS e
       SET enabled = false,
           disabled_reason = coalesce(pause_endpoint.reason, 'paused by ' || current_user)
     WHERE e.name = pause_endpoint.name AND e.enabled;
    RETURN FOUND;
END
$$;

CREATE FUNCTION @extschema@.resume_endpoint(name text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM @extschema@.endpoints AS e WHERE e.name = resume_endpoint.name) THEN
        RAISE EXCEPTION 'endpoint "%" does not exist', name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE @extschema@.endpoints AS e
       SET enabled = true, disabled_reason = NULL
     WHERE e.name = resume_endpoint.name AND NOT e.enabled;
    IF FOUND THEN
        PERFORM @extschema@.wake();
        RETURN true;
    END IF;
    RETURN false;
END
$$;

CREATE FUNCTION @extschema@.replay(from_id bigint, to_id bigint, endpoint text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_replay_sql'
    LANGUAGE C VOLATILE;

CREATE FUNCTION @extschema@.move_messages(
    from_endpoint text,
    to_endpoint   text,
    statuses      text[] DEFAULT ARRAY['pending', 'dead'])
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'od_move_messages_sql'
    LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.pause_endpoint(text, text) IS
    'Disable an endpoint (its messages wait, pending); false when it was already disabled';
COMMENT ON FUNCTION @extschema@.resume_endpoint(text) IS
    'Enable an endpoint again and wake the workers; false when it was enabled';
COMMENT ON FUNCTION @extschema@.replay(bigint, bigint, text) IS
    'Deliver done messages again: ids from_id..to_id (optionally of one endpoint) go back to pending; returns the count';
COMMENT ON FUNCTION @extschema@.move_messages(text, text, text[]) IS
    'Re-point pending and/or dead messages from one endpoint to another; returns the count';

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
)
SELECT string_agg(txt, E'\n' ORDER BY ord) || E'\n' FROM lines WHERE txt IS NOT NULL
$$;

COMMENT ON FUNCTION @extschema@.metrics() IS
    'Prometheus text exposition of the queue, the workers and the endpoints';

-- ---------------------------------------------------------------- privileges
REVOKE ALL ON FUNCTION @extschema@._endpoint_health(), @extschema@.pause_endpoint(text, text),
    @extschema@.resume_endpoint(text), @extschema@.replay(bigint, bigint, text),
    @extschema@.move_messages(text, text, text[]), @extschema@._prom_label(text),
    @extschema@.metrics() FROM PUBLIC;
GRANT SELECT ON @extschema@.endpoint_health TO outbox_monitor, outbox_admin;
GRANT EXECUTE ON FUNCTION @extschema@._endpoint_health(), @extschema@._prom_label(text),
    @extschema@.metrics() TO outbox_monitor;
GRANT EXECUTE ON FUNCTION @extschema@._endpoint_health(), @extschema@.pause_endpoint(text, text),
    @extschema@.resume_endpoint(text), @extschema@.replay(bigint, bigint, text),
    @extschema@.move_messages(text, text, text[]), @extschema@._prom_label(text),
    @extschema@.metrics() TO outbox_admin;
