--
-- operations (0.2.0): pause_endpoint, resume_endpoint, replay,
-- move_messages; the per-endpoint settings rate_limit, breaker_threshold,
-- breaker_cooldown and their validation; who may call what.
--
-- The workers of the regression cluster serve database postgres, not this
-- one: nothing here is claimed behind the test's back; claim(), mark_done()
-- and mark_dead() stand in for a worker.
--
-- Errors raised inside the PL/pgSQL functions carry a CONTEXT line; it is
-- hidden so that this file does not depend on the functions' line numbers.
\set SHOW_CONTEXT never
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_ops_producer, regress_ops_monitor, regress_ops_admin;
RESET client_min_messages;
CREATE ROLE regress_ops_producer IN ROLE outbox_producer;
CREATE ROLE regress_ops_monitor  IN ROLE outbox_monitor;
CREATE ROLE regress_ops_admin    IN ROLE outbox_admin;

TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('crm', 'http://127.0.0.1:9/crm'),
       ('spare', 'http://127.0.0.1:9/spare');

-- The new columns and their defaults.
SELECT name, rate_limit, breaker_threshold, breaker_cooldown, disabled_reason
  FROM outbox.endpoints ORDER BY name;

-- ------------------------------------------------------------------
-- pause_endpoint(name, reason): disables the endpoint and records why;
-- false when it was disabled already (the first reason stays).
-- ------------------------------------------------------------------
SELECT outbox.enqueue('order', '1', 'order.created', '{}', 'crm') AS id;
SELECT outbox.pause_endpoint('crm') AS paused;
SELECT name, enabled, disabled_reason = 'paused by ' || current_user AS reason_is_paused_by_me
  FROM outbox.endpoints ORDER BY name;
SELECT outbox.pause_endpoint('crm', 'another reason') AS paused_again;
SELECT name, enabled, disabled_reason = 'paused by ' || current_user AS reason_is_paused_by_me
  FROM outbox.endpoints WHERE name = 'crm';
SELECT outbox.pause_endpoint('spare', 'maintenance until 14:00') AS paused;

-- endpoint_health shows the reason of disabled endpoints.
SELECT endpoint, enabled,
       CASE WHEN disabled_reason = 'paused by ' || current_user THEN 'paused by <current_user>'
            ELSE disabled_reason END AS disabled_reason,
       state
  FROM outbox.endpoint_health ORDER BY endpoint;

-- A paused endpoint's messages wait: claim() skips them, enqueue() refuses
-- new ones.
SELECT count(*) AS claimed FROM outbox.claim('worker', 10, '1 minute');
SELECT id, endpoint, status, attempts FROM outbox.messages;
SELECT outbox.enqueue('order', '2', 'order.created', '{}', 'crm');

-- Unknown endpoint, null name.
SELECT outbox.pause_endpoint('no-such-endpoint');
SELECT outbox.pause_endpoint(NULL);
SELECT outbox.pause_endpoint(NULL, 'why');
SELECT name, enabled, disabled_reason IS NOT NULL AS has_reason FROM outbox.endpoints ORDER BY name;

-- ------------------------------------------------------------------
-- resume_endpoint(name): enables it, clears the reason; false when it
-- was enabled.
-- ------------------------------------------------------------------
SELECT outbox.resume_endpoint('crm') AS resumed;
SELECT outbox.resume_endpoint('crm') AS resumed_again;
SELECT outbox.resume_endpoint('default') AS resumed_enabled;
SELECT outbox.resume_endpoint('no-such-endpoint');
SELECT outbox.resume_endpoint(NULL);
SELECT name, enabled, disabled_reason FROM outbox.endpoints ORDER BY name;

-- The message waited; it is claimable now.
SELECT id, endpoint, attempts FROM outbox.claim('worker', 10, '1 minute');

-- An endpoint disabled by a plain UPDATE (no reason) is resumed too.
UPDATE outbox.endpoints SET enabled = false WHERE name = 'spare';
SELECT outbox.resume_endpoint('spare') AS resumed;
SELECT name, enabled, disabled_reason FROM outbox.endpoints ORDER BY name;

-- ------------------------------------------------------------------
-- replay(from_id, to_id, endpoint): done messages with ids in the range
-- (of one endpoint, if given) go back to pending with attempts 0 and a new
-- lease_version; nothing else is touched.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
-- 1-6 for default, 7-8 for crm.  After the claim: 1-4, 7, 8 done, 5 dead,
-- 6 still processing; 9 is pending (never claimed).
SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g),
                            CASE WHEN g <= 6 THEN 'default' ELSE 'crm' END)) AS enqueued
  FROM generate_series(1, 8) AS g;
CREATE TEMP TABLE leases AS SELECT id, lease_version FROM outbox.claim('worker', 10, '1 minute');
SELECT count(*) FILTER (WHERE CASE id WHEN 5 THEN outbox.mark_dead(id, lease_version, 'HTTP 400: bad', 400)
                                      WHEN 6 THEN true
                                      ELSE outbox.mark_done(id, lease_version, 200) END) AS finalized
  FROM leases;
SELECT outbox.enqueue('order', '9', 'order.created', '{}') AS id;
SELECT id, endpoint, status, attempts, lease_version, done_at IS NOT NULL AS has_done_at,
       last_http_status, last_error
  FROM outbox.messages ORDER BY id;

-- Only crm's done messages.
SELECT outbox.replay(1, 100, 'crm') AS replayed;
-- 2..6 of every endpoint: 2, 3, 4 (5 is dead, 6 processing: untouched).
SELECT outbox.replay(2, 6) AS replayed;
SELECT id, endpoint, status, attempts, lease_version, done_at IS NULL AS no_done_at,
       lease_until IS NULL AS no_lease, available_at <= now() AS due, last_http_status, last_error
  FROM outbox.messages ORDER BY id;

-- Nothing (left) to replay: an empty or already replayed range, another
-- endpoint's ids, an unknown endpoint.
SELECT outbox.replay(2, 6) AS replayed_again,
       outbox.replay(1, 1, 'crm') AS other_endpoint,
       outbox.replay(1, 100, 'no-such-endpoint') AS unknown_endpoint,
       outbox.replay(1000, 2000) AS no_such_ids;
-- A range of one.
SELECT outbox.replay(1, 1) AS replayed;

-- Bad ranges: an error, nothing changed.
SELECT outbox.replay(5, 4);
SELECT outbox.replay(NULL, 4);
SELECT outbox.replay(1, NULL);
SELECT status, count(*) FROM outbox.messages GROUP BY status ORDER BY status;

-- The worker that delivered them before is fenced off by the new
-- lease_version; the replayed messages are claimed again from attempt 1.
SELECT l.id, outbox.mark_done(l.id, l.lease_version) AS stale_done
  FROM leases AS l WHERE l.id IN (1, 2, 7) ORDER BY l.id;
SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute') ORDER BY id;
-- Messages replayed by the claim above are processing now: not done, so
-- replay leaves them alone.
SELECT outbox.replay(1, 100) AS replayed_processing;

-- ------------------------------------------------------------------
-- move_messages(from, to, statuses DEFAULT '{pending,dead}'): re-points
-- messages to another endpoint, with a new lease_version; processing and
-- done messages are never moved.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
-- default: 1 done, 2 dead, 3 processing, 4 and 5 pending; crm: 6 pending.
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}')) AS enqueued
  FROM generate_series(1, 4) AS g;
SELECT count(*) FILTER (WHERE CASE id WHEN 1 THEN outbox.mark_done(id, lease_version)
                                      WHEN 2 THEN outbox.mark_dead(id, lease_version, 'HTTP 404: gone', 404)
                                      ELSE true END) AS finalized
  FROM outbox.claim('worker', 3, '1 minute');
SELECT outbox.enqueue('order', '5', 'order.created', '{}') AS id;
SELECT outbox.enqueue('order', '6', 'order.created', '{}', 'crm') AS id;
SELECT id, endpoint, status, lease_version FROM outbox.messages ORDER BY id;

SELECT outbox.move_messages('default', 'spare') AS moved;
SELECT id, endpoint, status, lease_version FROM outbox.messages ORDER BY id;

-- Only some statuses.
SELECT outbox.move_messages('spare', 'default', ARRAY['dead']) AS moved_dead;
SELECT outbox.move_messages('spare', 'crm', ARRAY['pending']) AS moved_pending;
SELECT id, endpoint, status, lease_version FROM outbox.messages ORDER BY id;
-- Nothing to move: an endpoint without messages, an unknown source.
SELECT outbox.move_messages('spare', 'default') AS from_empty,
       outbox.move_messages('no-such-endpoint', 'default') AS from_unknown;

-- Bad arguments: an error, nothing moved.
SELECT outbox.move_messages('crm', 'no-such-endpoint');
SELECT outbox.move_messages('crm', 'crm');
SELECT outbox.move_messages('default', 'crm', ARRAY['done']);
SELECT outbox.move_messages('default', 'crm', ARRAY['pending', 'processing']);
SELECT outbox.move_messages('default', 'crm', ARRAY['delivered']);
SELECT outbox.move_messages('default', 'crm', ARRAY[]::text[]);
SELECT outbox.move_messages('default', 'crm', ARRAY['pending', NULL]);
SELECT outbox.move_messages('default', 'crm', NULL);
SELECT outbox.move_messages(NULL, 'crm');
SELECT outbox.move_messages('default', NULL);
SELECT outbox.move_messages('', 'crm');
SELECT id, endpoint, status, lease_version FROM outbox.messages ORDER BY id;

-- The processing message's worker still finalizes it (not moved, same lease).
SELECT outbox.mark_done(id, lease_version) AS done FROM outbox.messages WHERE id = 3;
-- Moved messages are claimed for their new endpoint.
SELECT id, endpoint FROM outbox.claim('worker', 10, '1 minute') ORDER BY id;

-- Into a paused endpoint: allowed; the messages wait there.
SELECT outbox.pause_endpoint('spare', 'not yet') AS paused;
SELECT outbox.enqueue('order', '7', 'order.created', '{}', 'crm') AS id;
SELECT outbox.move_messages('crm', 'spare') AS moved;
SELECT count(*) AS claimed FROM outbox.claim('worker', 10, '1 minute');
SELECT outbox.resume_endpoint('spare') AS resumed;
SELECT id, endpoint FROM outbox.claim('worker', 10, '1 minute');

-- ------------------------------------------------------------------
-- Validation of the new columns: a clear error, nothing changed.
-- ------------------------------------------------------------------
CREATE FUNCTION pg_temp.settings() RETURNS TABLE (name text, rate_limit float8, breaker_threshold int,
                                                  breaker_cooldown interval)
LANGUAGE sql AS $$
    SELECT name, rate_limit, breaker_threshold, breaker_cooldown FROM outbox.endpoints ORDER BY name
$$;
SELECT * FROM pg_temp.settings();

INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('x', 'http://127.0.0.1:9/x', 0);
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('x', 'http://127.0.0.1:9/x', -1);
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('x', 'http://127.0.0.1:9/x', 'NaN');
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('x', 'http://127.0.0.1:9/x', 'Infinity');
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('x', 'http://127.0.0.1:9/x', 1000001);
INSERT INTO outbox.endpoints (name, url, breaker_threshold) VALUES ('x', 'http://127.0.0.1:9/x', -1);
INSERT INTO outbox.endpoints (name, url, breaker_threshold) VALUES ('x', 'http://127.0.0.1:9/x', 1000001);
-- (not-null violations: reported by the row trigger, without quoting the row)
INSERT INTO outbox.endpoints (name, url, breaker_threshold) VALUES ('x', 'http://127.0.0.1:9/x', NULL);
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', NULL);
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '99 ms');
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '0');
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '-30 s');
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '1 hour 1 ms');
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '1 day');
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('x', 'http://127.0.0.1:9/x', '1 month');
UPDATE outbox.endpoints SET rate_limit = -5 WHERE name = 'default';
UPDATE outbox.endpoints SET breaker_threshold = -1 WHERE name = 'default';
UPDATE outbox.endpoints SET breaker_cooldown = '50 ms' WHERE name = 'default';
-- One bad value among good ones: the whole statement fails.
UPDATE outbox.endpoints SET rate_limit = 10, breaker_threshold = 3, breaker_cooldown = '2 hours';
SELECT * FROM pg_temp.settings();

-- The limits themselves are accepted.
INSERT INTO outbox.endpoints (name, url, rate_limit, breaker_threshold, breaker_cooldown)
VALUES ('low', 'http://127.0.0.1:9/low', 0.001, 0, '100 ms'),
       ('high', 'http://127.0.0.1:9/high', 1000000, 1000000, '1 hour');
UPDATE outbox.endpoints SET rate_limit = 2.5, breaker_threshold = 1, breaker_cooldown = '90 s'
 WHERE name = 'default';
SELECT * FROM pg_temp.settings();
-- null: no rate limit.
UPDATE outbox.endpoints SET rate_limit = NULL WHERE name = 'default';
SELECT endpoint, rate_limit FROM outbox.endpoint_health WHERE endpoint = 'default';
DELETE FROM outbox.endpoints WHERE name IN ('low', 'high');

-- ------------------------------------------------------------------
-- Privileges: outbox_admin operates, outbox_monitor only watches,
-- outbox_producer neither.
-- ------------------------------------------------------------------
SELECT r AS role,
       has_function_privilege(r, 'outbox.pause_endpoint(text,text)', 'EXECUTE') AS pause,
       has_function_privilege(r, 'outbox.resume_endpoint(text)', 'EXECUTE') AS resume,
       has_function_privilege(r, 'outbox.replay(bigint,bigint,text)', 'EXECUTE') AS replay,
       has_function_privilege(r, 'outbox.move_messages(text,text,text[])', 'EXECUTE') AS move,
       has_function_privilege(r, 'outbox.metrics()', 'EXECUTE') AS metrics,
       has_table_privilege(r, 'outbox.endpoint_health', 'SELECT') AS endpoint_health,
       has_column_privilege(r, 'outbox.endpoints', 'rate_limit', 'SELECT') AS read_limits,
       has_column_privilege(r, 'outbox.endpoints', 'rate_limit', 'UPDATE') AS set_limits
  FROM unnest(ARRAY['outbox_producer', 'outbox_monitor', 'outbox_admin']) AS r
 ORDER BY 1;

-- done messages for the admin's replay below
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}')) AS enqueued
  FROM generate_series(1, 3) AS g;
SELECT count(*) FILTER (WHERE outbox.mark_done(id, lease_version)) AS done
  FROM outbox.claim('worker', 10, '1 minute');

SET ROLE regress_ops_producer;
SELECT outbox.pause_endpoint('crm');
SELECT outbox.resume_endpoint('crm');
SELECT outbox.replay(1, 10);
SELECT outbox.move_messages('default', 'crm');
SELECT outbox.metrics() IS NOT NULL AS metrics;
SELECT count(*) FROM outbox.endpoint_health;
RESET ROLE;

SET ROLE regress_ops_monitor;
SELECT outbox.pause_endpoint('crm');
SELECT outbox.resume_endpoint('crm');
SELECT outbox.replay(1, 10);
SELECT outbox.move_messages('default', 'crm');
SELECT endpoint, enabled, state, in_flight FROM outbox.endpoint_health ORDER BY endpoint;
SELECT name, rate_limit, breaker_threshold, breaker_cooldown, disabled_reason
  FROM outbox.endpoints ORDER BY name;
SELECT outbox.metrics() LIKE '%outbox_endpoint_up{endpoint="crm"} 1%' AS metrics;
UPDATE outbox.endpoints SET rate_limit = 1 WHERE name = 'crm';
RESET ROLE;

SET ROLE regress_ops_admin;
SELECT outbox.pause_endpoint('crm') AS paused;
SELECT name, enabled, disabled_reason FROM outbox.endpoints WHERE name = 'crm';
SELECT outbox.resume_endpoint('crm') AS resumed;
SELECT outbox.replay(1, 10) AS replayed;
SELECT outbox.move_messages('default', 'crm') AS moved;
UPDATE outbox.endpoints SET rate_limit = 100, breaker_threshold = 10, breaker_cooldown = '1 minute'
 WHERE name = 'crm';
SELECT outbox.metrics() LIKE '%outbox_messages{status="pending"} 3%' AS metrics;
RESET ROLE;
SELECT id, endpoint, status, attempts FROM outbox.messages ORDER BY id;
SELECT * FROM pg_temp.settings();

-- ------------------------------------------------------------------
-- Clean up.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
DROP ROLE regress_ops_producer, regress_ops_monitor, regress_ops_admin;
