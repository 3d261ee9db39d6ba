--
-- privileges: nothing for PUBLIC; outbox_producer enqueues, outbox_monitor
-- reads (never signing_secret), outbox_admin does everything else.
--
-- Roles are cluster-wide: the login roles of this test are dropped first
-- (left over by an interrupted run) and again at the end.
--
\set SHOW_CONTEXT never
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_outbox_producer, regress_outbox_monitor,
                    regress_outbox_admin, regress_outbox_nobody;
RESET client_min_messages;

CREATE ROLE regress_outbox_producer LOGIN IN ROLE outbox_producer;
CREATE ROLE regress_outbox_monitor  LOGIN IN ROLE outbox_monitor;
CREATE ROLE regress_outbox_admin    LOGIN IN ROLE outbox_admin;
CREATE ROLE regress_outbox_nobody   LOGIN;

TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url, signing_secret)
VALUES ('default', 'http://127.0.0.1:9/hook', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SELECT outbox.enqueue('order', '1', 'order.created', '{}') AS id;

-- ------------------------------------------------------------------
-- The catalog: no object of the extension grants anything to PUBLIC
-- (functions are EXECUTE-able by PUBLIC unless revoked).
-- ------------------------------------------------------------------
SELECT 'schema' AS objects, count(*) AS public_grants
  FROM pg_namespace AS n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) AS a
 WHERE n.nspname = 'outbox' AND a.grantee = 0
UNION ALL
SELECT 'tables, views, sequences', count(*)
  FROM pg_class AS c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS a
 WHERE c.relnamespace = 'outbox'::regnamespace AND a.grantee = 0
UNION ALL
SELECT 'functions', count(*)
  FROM pg_proc AS p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
 WHERE p.pronamespace = 'outbox'::regnamespace AND a.grantee = 0;

-- What each group role may do, and a role that is in none of them.
SELECT r AS role,
       has_schema_privilege(r, 'outbox', 'USAGE') AS schema,
       has_function_privilege(r, 'outbox.enqueue(text,text,text,jsonb,text,boolean,timestamptz,jsonb)',
                              'EXECUTE') AS enqueue,
       has_function_privilege(r, 'outbox.claim(text,integer,interval,integer)', 'EXECUTE') AS claim,
       has_function_privilege(r, 'outbox.mark_done(bigint,bigint,integer)', 'EXECUTE') AS mark_done,
       has_function_privilege(r, 'outbox.retry(bigint)', 'EXECUTE') AS retry,
       has_function_privilege(r, 'outbox.purge(interval)', 'EXECUTE') AS purge,
       has_table_privilege(r, 'outbox.health', 'SELECT') AS views,
       has_table_privilege(r, 'outbox.worker_stats', 'SELECT') AS worker_stats
  FROM unnest(ARRAY['outbox_producer', 'outbox_monitor', 'outbox_admin', 'regress_outbox_nobody']) AS r
 ORDER BY 1;

SELECT r AS role,
       has_table_privilege(r, 'outbox.messages', 'SELECT') AS read_messages,
       has_column_privilege(r, 'outbox.messages', 'payload', 'INSERT') AS insert_payload,
       has_column_privilege(r, 'outbox.messages', 'status', 'INSERT') AS insert_status,
       has_table_privilege(r, 'outbox.messages', 'UPDATE') AS update_messages,
       has_column_privilege(r, 'outbox.endpoints', 'url', 'SELECT') AS read_url,
       has_column_privilege(r, 'outbox.endpoints', 'signing_secret', 'SELECT') AS read_secret,
       has_table_privilege(r, 'outbox.endpoints', 'INSERT') AS write_endpoints
  FROM unnest(ARRAY['outbox_producer', 'outbox_monitor', 'outbox_admin', 'regress_outbox_nobody']) AS r
 ORDER BY 1;

-- ------------------------------------------------------------------
-- PUBLIC: a role in no group gets nothing.
-- ------------------------------------------------------------------
SET ROLE regress_outbox_nobody;
SELECT count(*) FROM outbox.messages;
SELECT outbox.enqueue('order', '2', 'order.created', '{}');
SELECT * FROM outbox.queue_depth;
RESET ROLE;

-- Even with USAGE on the schema, every object is closed to it.
GRANT USAGE ON SCHEMA outbox TO regress_outbox_nobody;
SET ROLE regress_outbox_nobody;
SELECT count(*) FROM outbox.messages;
SELECT name FROM outbox.endpoints;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '2', 'order.created', '{}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}');
SELECT outbox.wake();
SELECT * FROM outbox.claim('nobody', 1, '1 minute');
SELECT outbox.retry(1);
SELECT * FROM outbox.health;
RESET ROLE;
REVOKE USAGE ON SCHEMA outbox FROM regress_outbox_nobody;

-- ------------------------------------------------------------------
-- outbox_producer: enqueue() and INSERT of the producer columns.
-- ------------------------------------------------------------------
SET ROLE regress_outbox_producer;
SELECT outbox.enqueue('order', '2', 'order.created', '{"by": "enqueue"}') AS id;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers,
                             endpoint, ordered, available_at)
VALUES ('order', '3', 'order.paid', '{"by": "insert"}', '{"X-Tenant": "acme"}',
        'default', true, now());
SELECT outbox.wake();

-- The dispatcher's columns cannot be set.
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, status)
VALUES ('order', '4', 'order.created', '{}', 'done');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, attempts)
VALUES ('order', '4', 'order.created', '{}', -100);
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, lease_version)
VALUES ('order', '4', 'order.created', '{}', 99);

-- Messages cannot be read (only their id, which enqueue() returns, also
-- through RETURNING), changed or deleted.
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '4', 'order.created', '{}') RETURNING id;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '4', 'order.created', '{}') RETURNING payload;
SELECT payload FROM outbox.messages;
SELECT status FROM outbox.messages;
UPDATE outbox.messages SET status = 'done';
DELETE FROM outbox.messages;

-- Endpoints: their names and whether they are enabled (what enqueue()
-- checks), nothing else; not writable.
SELECT name, enabled FROM outbox.endpoints;
SELECT url FROM outbox.endpoints;
SELECT headers FROM outbox.endpoints;
SELECT signing_secret FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES ('evil', 'http://evil.example.com/');
UPDATE outbox.endpoints SET url = 'http://evil.example.com/';

-- No worker, operator or monitoring access.
SELECT * FROM outbox.claim('producer', 10, '1 minute');
SELECT outbox.mark_done(1, 1);
SELECT outbox.retry(1);
SELECT outbox.skip(1, 'because');
SELECT outbox.purge('0');
SELECT * FROM outbox.queue_depth;
SELECT * FROM outbox.worker_stats;

-- Validation applies to producers as to everyone.
SELECT outbox.enqueue('order', '4', 'order.created', '{}', endpoint => 'nope');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', '4', 'order.created', '{}', '{"ce-id": "forged"}');
RESET ROLE;

-- The producer's two messages are there, as plain pending messages.
SELECT id, aggregate_id, event_type, payload, headers, ordered, status, attempts, lease_version
  FROM outbox.messages ORDER BY id;

-- ------------------------------------------------------------------
-- outbox_monitor: the views, the messages, the endpoints without their
-- secret.  Nothing else.
-- ------------------------------------------------------------------
SET ROLE regress_outbox_monitor;
SELECT * FROM outbox.queue_depth;
SELECT pending, processing, done, dead, expired_leases, lost_leases IS NOT NULL AS has_lost_leases
  FROM outbox.health;
SELECT * FROM outbox.attempts_histogram;
SELECT count(*) AS dead_letters FROM outbox.dead_letters;
-- (worker_stats reflects the whole cluster's workers: only access is
-- checked.)
SELECT count(*) >= 0 AS worker_stats_readable FROM outbox.worker_stats;
SELECT id, status, attempts FROM outbox.messages ORDER BY id;
SELECT name, url, headers, timeout, max_in_flight, enabled, defer_statuses FROM outbox.endpoints;

-- The secret is column-protected: naming it, or *, is refused.
SELECT name, signing_secret FROM outbox.endpoints;
SELECT * FROM outbox.endpoints;

-- Read-only.
SELECT outbox.enqueue('order', '5', 'order.created', '{}');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5', 'order.created', '{}');
UPDATE outbox.messages SET status = 'dead';
UPDATE outbox.endpoints SET enabled = false;
SELECT * FROM outbox.claim('monitor', 10, '1 minute');
SELECT outbox.retry(1);
SELECT outbox.retry_dead();
SELECT outbox.skip(1, 'because');
SELECT outbox.purge('0');
RESET ROLE;

-- ------------------------------------------------------------------
-- outbox_admin: endpoints (with their secret), the workers' claim /
-- finalize API, the operator functions and the views.  The dispatcher
-- role needs nothing more.
-- ------------------------------------------------------------------
SET ROLE regress_outbox_admin;
INSERT INTO outbox.endpoints (name, url, signing_secret, defer_statuses)
VALUES ('crm', 'https://crm.example.com/hook', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '{409}');
UPDATE outbox.endpoints SET enabled = false WHERE name = 'crm';
SELECT name, url, signing_secret, enabled, defer_statuses FROM outbox.endpoints ORDER BY name;
-- Validation applies to admins too.
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'ftp://example.com/');

-- Claim and finalize, as a worker: 1 done, 2 rescheduled, 3 dead.
SELECT id,
       CASE id
            WHEN 1 THEN outbox.mark_done(id, lease_version, 200)
            WHEN 2 THEN outbox.reschedule(id, lease_version, '1 hour', 'HTTP 503', false, 503)
            ELSE outbox.mark_dead(id, lease_version, 'HTTP 400', 400)
       END AS finalized
  FROM outbox.claim('admin-worker', 10, '1 minute')
 ORDER BY id;

-- Operator functions.
SELECT id, aggregate_id, last_error FROM outbox.dead_letters;
SELECT outbox.retry(3) AS retried;
SELECT outbox.retry_dead() AS retried;
SELECT outbox.skip(2, 'not needed any more') AS skipped;
SELECT outbox.purge('0') AS purged;
SELECT * FROM outbox.queue_depth;
SELECT count(*) >= 0 AS worker_stats_readable FROM outbox.worker_stats;
SELECT id, status FROM outbox.messages ORDER BY id;
SELECT outbox.wake();

DELETE FROM outbox.endpoints WHERE name = 'crm';
SELECT name FROM outbox.endpoints ORDER BY name;
RESET ROLE;

-- ------------------------------------------------------------------
-- A role given INSERT on the table directly, instead of membership in
-- outbox_producer, also needs EXECUTE on the two functions of the table's
-- CHECK constraints (messages_status_check, messages_lease_check).
-- ------------------------------------------------------------------
GRANT USAGE ON SCHEMA outbox TO regress_outbox_nobody;
GRANT INSERT (aggregate_type, aggregate_id, event_type, payload) ON outbox.messages TO regress_outbox_nobody;
SET ROLE regress_outbox_nobody;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5', 'order.created', '{}');
RESET ROLE;
GRANT EXECUTE ON FUNCTION outbox._message_status_valid(text),
                          outbox._message_lease_valid(text, timestamptz) TO regress_outbox_nobody;
SET ROLE regress_outbox_nobody;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '5', 'order.created', '{}');
RESET ROLE;
SELECT aggregate_id, status FROM outbox.messages WHERE aggregate_id = '5';
REVOKE ALL ON FUNCTION outbox._message_status_valid(text),
                       outbox._message_lease_valid(text, timestamptz) FROM regress_outbox_nobody;
REVOKE ALL ON outbox.messages FROM regress_outbox_nobody;
REVOKE USAGE ON SCHEMA outbox FROM regress_outbox_nobody;

-- ------------------------------------------------------------------
-- Clean up the login roles.
-- ------------------------------------------------------------------
DROP ROLE regress_outbox_producer, regress_outbox_monitor,
          regress_outbox_admin, regress_outbox_nobody;
