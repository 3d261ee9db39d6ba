--
-- claim: leasing messages, lease expiry and takeover, fencing, reaping.
--
-- The SQL-level scenarios of the lease and fencing test table the project started from.
-- A worker that "crashes" is simulated by claiming and never finalizing.
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('paused', 'http://127.0.0.1:9/paused');

-- ------------------------------------------------------------------
-- 1. Claims in sequence get disjoint rows, and together cover them all.
--    The batch limit is respected.
-- ------------------------------------------------------------------
SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g)))
  FROM generate_series(1, 10) AS g;

CREATE TEMP TABLE claimed_a AS SELECT * FROM outbox.claim('worker-a', 6, '1 minute');
CREATE TEMP TABLE claimed_b AS SELECT * FROM outbox.claim('worker-b', 6, '1 minute');

-- worker-a got a full batch of 6, worker-b the remaining 4.
SELECT 'a' AS worker, count(*) FROM claimed_a
UNION ALL
SELECT 'b', count(*) FROM claimed_b;

-- No id was handed out twice; every message was handed out.
SELECT count(*) AS claimed, count(DISTINCT id) AS distinct_ids,
       (SELECT count(*) FROM outbox.messages) AS messages
  FROM (SELECT id FROM claimed_a UNION ALL SELECT id FROM claimed_b) AS s;

-- What claim() returns: the fencing token, the attempt number and the
-- message itself.
SELECT id, lease_version, attempts, endpoint, aggregate_type, aggregate_id,
       event_type, payload, headers, ordered
  FROM claimed_a
 ORDER BY id;

-- The rows are now processing, leased to their worker for the lease given,
-- with lease_version and attempts incremented.
SELECT lease_owner, count(*) AS messages,
       bool_and(status = 'processing') AS processing,
       bool_and(lease_version = 1) AS version_1,
       bool_and(attempts = 1) AS attempt_1,
       bool_and(lease_until > now() + interval '50 seconds'
                AND lease_until <= now() + interval '1 minute') AS leased_1_minute
  FROM outbox.messages
 GROUP BY lease_owner
 ORDER BY lease_owner;

-- Nothing is left: leased rows are not claimed again.
SELECT count(*) AS claimed FROM outbox.claim('worker-c', 100, '1 minute');

-- A batch of 1 claims exactly one row.
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}'))
  FROM generate_series(1, 3) AS g;
SELECT id FROM outbox.claim('worker-a', 1, '1 minute');
SELECT status, count(*) FROM outbox.messages GROUP BY status ORDER BY status;

-- ------------------------------------------------------------------
-- 2. A crashed worker's lease expires; another worker takes the message
--    over with lease_version + 1 and attempts 2.  The old worker's
--    finalize is fenced off, the new one's succeeds.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '42', 'order.created', '{}') AS id;

CREATE TEMP TABLE lease_a AS SELECT * FROM outbox.claim('worker-a', 10, '1 second');
SELECT id, lease_version, attempts FROM lease_a;

-- While A's lease runs, B gets nothing.
SELECT count(*) AS claimed FROM outbox.claim('worker-b', 10, '30 seconds');

-- A "crashes" (never finalizes); its lease runs out.
SELECT pg_sleep(1.2);

CREATE TEMP TABLE lease_b AS SELECT * FROM outbox.claim('worker-b', 10, '30 seconds');
SELECT b.id = a.id AS same_message,
       b.lease_version = a.lease_version + 1 AS version_bumped,
       b.attempts
  FROM lease_a AS a, lease_b AS b;

-- Every finalize by A now presents a stale lease_version: all refused.
SELECT outbox.mark_done(id, lease_version) AS stale_done FROM lease_a;
SELECT outbox.reschedule(id, lease_version, '1 second', 'stale') AS stale_reschedule FROM lease_a;
SELECT outbox.mark_dead(id, lease_version, 'stale') AS stale_dead FROM lease_a;

-- B still owns the row, untouched by A.
SELECT status, lease_owner, lease_version, attempts, last_error FROM outbox.messages;

-- B's finalize succeeds.
SELECT outbox.mark_done(id, lease_version) AS done FROM lease_b;
SELECT status, lease_owner, lease_until IS NULL AS lease_cleared, lease_version, attempts,
       done_at IS NOT NULL AS has_done_at
  FROM outbox.messages;

-- ------------------------------------------------------------------
-- 3. A lease that expired but that nobody took over still finalizes:
--    correctness depends on the generation, not on the clock.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '43', 'order.created', '{}') AS id;
CREATE TEMP TABLE lease_late AS SELECT * FROM outbox.claim('worker-a', 10, '200 ms');
SELECT pg_sleep(0.3);
SELECT outbox.mark_done(id, lease_version) AS done FROM lease_late;
SELECT status, lease_version, attempts FROM outbox.messages;

-- ------------------------------------------------------------------
-- 4. A message claimed and never finalized max_attempts times (a poison
--    message that crashes its worker every time) is reaped to dead by the
--    next claim, with a reason, and is never claimed again.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '44', 'order.created', '{"poison": true}') AS id;

SELECT id, lease_version, attempts FROM outbox.claim('crash-1', 10, '200 ms', 3);
SELECT pg_sleep(0.3);
SELECT id, lease_version, attempts FROM outbox.claim('crash-2', 10, '200 ms', 3);
SELECT pg_sleep(0.3);
CREATE TEMP TABLE lease_last AS SELECT * FROM outbox.claim('crash-3', 10, '200 ms', 3);
SELECT id, lease_version, attempts FROM lease_last;
SELECT pg_sleep(0.3);

-- The third lease expired with attempts = max_attempts: this claim reaps it.
SELECT count(*) AS claimed FROM outbox.claim('worker-d', 10, '1 minute', 3);
SELECT status, attempts, lease_owner, lease_until, lease_version, last_error
  FROM outbox.messages;

-- The last worker's late finalize is refused: the row is no longer processing.
SELECT outbox.mark_done(id, lease_version) AS late_done FROM lease_last;

-- Dead rows are never claimed, whatever max_attempts the caller uses.
SELECT count(*) AS claimed FROM outbox.claim('worker-e', 10, '1 minute', 100);
SELECT status, attempts FROM outbox.messages;

-- An expired lease with attempts left is taken over rather than reaped.
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '45', 'order.created', '{}') AS id;
SELECT attempts FROM outbox.claim('crash-1', 10, '200 ms', 3);
SELECT pg_sleep(0.3);
SELECT attempts, lease_version FROM outbox.claim('worker-f', 10, '1 minute', 3);

-- ------------------------------------------------------------------
-- 5. Messages scheduled for later are not claimed until they are due.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '50', 'order.created', '{}',
                      available_at => now() + interval '1 hour') AS id;
SELECT count(*) AS claimed FROM outbox.claim('worker-a', 10, '1 minute');
-- Once due (moved to the past here), it is claimed.
UPDATE outbox.messages SET available_at = now() - interval '1 second';
SELECT id, attempts FROM outbox.claim('worker-a', 10, '1 minute');

-- Among ready messages, the one available the longest is claimed first.
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '51', 'order.created', '{}') AS id;
SELECT outbox.enqueue('order', '52', 'order.created', '{}',
                      available_at => now() - interval '1 minute') AS id;
SELECT id FROM outbox.claim('worker-a', 1, '1 minute');

-- ------------------------------------------------------------------
-- 6. Messages of a disabled endpoint are not claimed (they wait);
--    other endpoints are unaffected.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', '60', 'order.created', '{}', endpoint => 'paused') AS id;
SELECT outbox.enqueue('order', '61', 'order.created', '{}', endpoint => 'default') AS id;
UPDATE outbox.endpoints SET enabled = false WHERE name = 'paused';

SELECT id, endpoint FROM outbox.claim('worker-a', 10, '1 minute') ORDER BY id;
SELECT count(*) AS claimed FROM outbox.claim('worker-a', 10, '1 minute');

-- Enabled again, its messages flow.
UPDATE outbox.endpoints SET enabled = true WHERE name = 'paused';
SELECT id, endpoint FROM outbox.claim('worker-a', 10, '1 minute') ORDER BY id;

-- An expired lease on a disabled endpoint is not taken over either.
UPDATE outbox.endpoints SET enabled = false WHERE name = 'paused';
UPDATE outbox.messages SET lease_until = now() - interval '1 second' WHERE id = 1;
SELECT count(*) AS claimed FROM outbox.claim('worker-b', 10, '1 minute');
SELECT id, status, lease_owner FROM outbox.messages WHERE id = 1;
UPDATE outbox.endpoints SET enabled = true WHERE name = 'paused';
SELECT id, lease_version, attempts FROM outbox.claim('worker-b', 10, '1 minute');

DROP TABLE claimed_a, claimed_b, lease_a, lease_b, lease_late, lease_last;
