--
-- finalize: mark_done, reschedule (transient failure / defer), mark_dead,
-- and the lost-lease counter.
--
-- The SQL functions apply the verdict the caller (a worker) decided on;
-- each one is fenced on (id, status = 'processing', lease_version).
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', 'http://127.0.0.1:9/hook');

-- 1 succeeds, 2 fails transiently until it runs out of attempts.
SELECT outbox.enqueue('order', g::text, 'order.created', '{}') AS id
  FROM generate_series(1, 2) AS g;

CREATE TEMP TABLE leases (id bigint PRIMARY KEY, lease_version bigint, attempts int);
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');
SELECT * FROM leases ORDER BY id;

-- ------------------------------------------------------------------
-- Success: done, with done_at and the HTTP status; the lease is released.
-- ------------------------------------------------------------------
SELECT outbox.mark_done(id, lease_version, 204) AS done FROM leases WHERE id = 1;
SELECT id, status, attempts, lease_owner, lease_until IS NULL AS lease_cleared,
       done_at IS NOT NULL AS has_done_at, last_error, last_http_status
  FROM outbox.messages WHERE id = 1;

-- ------------------------------------------------------------------
-- Transient failure (e.g. 503): back to pending, the attempt is counted,
-- available_at is postponed by the delay, the error is recorded.
-- ------------------------------------------------------------------
SELECT outbox.reschedule(id, lease_version, '30 seconds', 'HTTP 503 Service Unavailable',
                         false, 503) AS rescheduled
  FROM leases WHERE id = 2;
SELECT id, status, attempts, lease_owner, lease_until IS NULL AS lease_cleared,
       available_at > now() + interval '25 seconds' AS postponed,
       available_at <= now() + interval '30 seconds' AS by_the_delay,
       done_at IS NULL AS not_done, last_error, last_http_status
  FROM outbox.messages WHERE id = 2;

-- Not claimable before its time.
SELECT count(*) AS claimed FROM outbox.claim('worker', 10, '1 minute');

-- The seed's "transient failure 3 times with max_attempts 3": each retry
-- uses an attempt; on the third the worker gives up with mark_dead.
-- (available_at is moved to the past to skip the backoff wait.)
UPDATE outbox.messages SET available_at = now() - interval '1 second' WHERE id = 2;
DELETE FROM leases WHERE id = 2;
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');
SELECT * FROM leases WHERE id = 2;
SELECT outbox.reschedule(id, lease_version, '0', 'HTTP 502 Bad Gateway', false, 502) AS rescheduled
  FROM leases WHERE id = 2;
SELECT status, attempts, last_http_status FROM outbox.messages WHERE id = 2;
DELETE FROM leases WHERE id = 2;
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');
SELECT * FROM leases WHERE id = 2;
SELECT outbox.mark_dead(id, lease_version, 'retries exhausted: HTTP 500', 500) AS dead
  FROM leases WHERE id = 2;
SELECT id, status, attempts, lease_owner, lease_until IS NULL AS lease_cleared,
       done_at IS NULL AS not_done, last_error, last_http_status
  FROM outbox.messages WHERE id = 2;

-- ------------------------------------------------------------------
-- Defer (a status in defer_statuses, "not yet"): back to pending,
-- postponed, and the attempt is refunded.  Repeated defers never use up
-- attempts.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
TRUNCATE leases;
-- 1 defer, 2 permanent failure, 3 reschedule without delay or error.
SELECT outbox.enqueue('order', g::text, 'order.created', '{}') AS id
  FROM generate_series(1, 3) AS g;
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');

SELECT outbox.reschedule(id, lease_version, '10 minutes', 'deferred: HTTP 409', true, 409) AS deferred
  FROM leases WHERE id = 1;
SELECT id, status, attempts, lease_until IS NULL AS lease_cleared,
       available_at > now() + interval '9 minutes' AS postponed,
       last_error, last_http_status
  FROM outbox.messages WHERE id = 1;

-- Claimed again when due (attempts 1), deferred again: back to 0.
UPDATE outbox.messages SET available_at = now() - interval '1 second' WHERE id = 1;
DELETE FROM leases WHERE id = 1;
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');
SELECT * FROM leases WHERE id = 1;
SELECT outbox.reschedule(id, lease_version, '10 minutes', 'deferred again', true, 409) AS deferred
  FROM leases WHERE id = 1;
SELECT status, attempts, lease_version FROM outbox.messages WHERE id = 1;

-- ------------------------------------------------------------------
-- Permanent failure (e.g. 400): dead at once, with the reason.
-- ------------------------------------------------------------------
SELECT outbox.mark_dead(id, lease_version, 'HTTP 400 Bad Request: invalid payload', 400) AS dead
  FROM leases WHERE id = 2;
SELECT id, status, attempts, lease_owner, lease_until IS NULL AS lease_cleared,
       done_at IS NULL AS not_done, last_error, last_http_status
  FROM outbox.messages WHERE id = 2;

-- ------------------------------------------------------------------
-- reschedule with a zero delay and no error: due again at once.
-- ------------------------------------------------------------------
SELECT outbox.reschedule(id, lease_version, '0', NULL) AS rescheduled FROM leases WHERE id = 3;
SELECT status, attempts, last_error, last_http_status, available_at <= now() AS due
  FROM outbox.messages WHERE id = 3;
-- It is the only ready message; this time it is delivered.
DELETE FROM leases WHERE id = 3;
INSERT INTO leases SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');
SELECT * FROM leases WHERE id = 3;
SELECT outbox.mark_done(id, lease_version) AS done FROM leases WHERE id = 3;

-- ------------------------------------------------------------------
-- A finalize that updates no row is a lost lease: it returns false,
-- changes nothing and increments outbox.health.lost_leases (a
-- cluster-wide counter in shared memory; only the delta is shown).
-- ------------------------------------------------------------------
SELECT id, status, attempts, lease_version, last_error FROM outbox.messages ORDER BY id;

SELECT lost_leases AS lost_before FROM outbox.health \gset

-- Finalizing again a message that is no longer processing (1 pending,
-- 2 dead, 3 done), even with its latest lease_version: refused.
SELECT id, outbox.mark_dead(id, lease_version, 'again') AS dead_again FROM leases WHERE id = 1;
SELECT id, outbox.reschedule(id, lease_version, '0', 'again') AS rescheduled_again FROM leases WHERE id = 2;
SELECT id, outbox.mark_done(id, lease_version) AS done_again FROM leases WHERE id = 3;
-- A wrong version, and an id that does not exist.
SELECT outbox.mark_done(1, 999) AS wrong_version, outbox.mark_done(999, 1) AS no_such_message;

SELECT lost_leases - :lost_before AS lost_leases_delta FROM outbox.health;

-- Nothing changed.
SELECT id, status, attempts, lease_version, last_error FROM outbox.messages ORDER BY id;

DROP TABLE leases;
