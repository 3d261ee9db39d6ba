--
-- operator: retry, retry_dead, skip, purge.
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('crm', 'http://127.0.0.1:9/crm');

-- Makes every claimable message dead (claim + mark_dead), as a worker
-- would after permanent failures.
CREATE FUNCTION pg_temp.kill_all(reason text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE outbox.mark_dead(id, lease_version, reason, 400))
      FROM outbox.claim('worker', 100, '1 minute')
$$;

-- ------------------------------------------------------------------
-- retry(id): dead -> pending now, attempts reset, new lease_version.
-- ------------------------------------------------------------------
SELECT outbox.enqueue('order', '1', 'order.created', '{}',
                      available_at => now() - interval '1 hour') AS id;
SELECT pg_temp.kill_all('HTTP 400') AS killed;
SELECT id, status, attempts, lease_version FROM outbox.messages;

SELECT outbox.retry(1) AS retried;
SELECT id, status, attempts, lease_version, lease_until IS NULL AS no_lease,
       available_at > now() - interval '1 minute' AND available_at <= now() AS available_now,
       last_error
  FROM outbox.messages;

-- It is claimable again, with a full set of attempts.
SELECT id, lease_version, attempts FROM outbox.claim('worker', 10, '1 minute');

-- retry() of a message that is not dead is refused: processing, pending,
-- done, or missing.
SELECT outbox.retry(1) AS retry_processing;
SELECT outbox.enqueue('order', '2', 'order.created', '{}') AS id;
SELECT outbox.retry(2) AS retry_pending;
SELECT outbox.mark_done(id, lease_version) AS done FROM outbox.messages WHERE id = 1;
SELECT outbox.retry(1) AS retry_done;
SELECT outbox.retry(12345) AS retry_missing;
SELECT id, status, attempts, lease_version FROM outbox.messages ORDER BY id;

-- ------------------------------------------------------------------
-- retry_dead(endpoint, event_type): bulk retry, optionally filtered;
-- returns how many messages it revived.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT count(outbox.enqueue('order', g::text, e.event_type, '{}', endpoint => e.endpoint))
  FROM generate_series(1, 2) AS g,
       (VALUES ('default', 'order.created'), ('default', 'order.paid'),
               ('crm', 'order.created'), ('crm', 'order.paid')) AS e(endpoint, event_type);
SELECT pg_temp.kill_all('HTTP 410') AS killed;
-- One more message that is pending: never touched by retry_dead.
SELECT outbox.enqueue('order', '9', 'order.created', '{}', endpoint => 'crm') AS id;

SELECT endpoint, event_type, status, count(*)
  FROM outbox.messages GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

-- Only endpoint crm and event order.paid.
SELECT outbox.retry_dead('crm', 'order.paid') AS retried;
-- Only event order.created (both endpoints).
SELECT outbox.retry_dead(event_type => 'order.created') AS retried;
-- Only endpoint default (what is left of it: order.paid).
SELECT outbox.retry_dead(endpoint => 'default') AS retried;
-- Nothing left to retry.
SELECT outbox.retry_dead() AS retried;
SELECT outbox.retry_dead('no-such-endpoint') AS retried;

SELECT endpoint, event_type, status, count(*), max(attempts) AS max_attempts
  FROM outbox.messages GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

-- Without filters, every dead message is retried.
SELECT pg_temp.kill_all('HTTP 410') AS killed;
SELECT outbox.retry_dead() AS retried;
SELECT status, count(*) FROM outbox.messages GROUP BY status ORDER BY status;

-- ------------------------------------------------------------------
-- skip(id, reason): an operator marks an unfinished message done without
-- delivering it.  The reason is required and recorded.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', g::text, 'order.created', '{}') AS id
  FROM generate_series(1, 3) AS g;

-- A reason is required.
SELECT outbox.skip(1, '');
SELECT outbox.skip(1, NULL);
SELECT id, status FROM outbox.messages WHERE id = 1;

-- A pending message can be skipped.
SELECT outbox.skip(1, 'duplicate of order 2') AS skipped;
SELECT id, status, done_at IS NOT NULL AS has_done_at, lease_version, last_error
  FROM outbox.messages WHERE id = 1;

-- A processing message can be skipped too; skip bumps lease_version, so the
-- worker that holds the lease is fenced off when it finalizes.
CREATE TEMP TABLE lease2 AS SELECT * FROM outbox.claim('worker', 1, '1 minute');
SELECT id, lease_version FROM lease2;
SELECT outbox.skip(2, 'receiver asked us to drop it') AS skipped;
SELECT id, status, lease_owner, lease_until IS NULL AS lease_cleared, lease_version, last_error
  FROM outbox.messages WHERE id = 2;
SELECT outbox.mark_done(id, lease_version) AS stale_done FROM lease2;
SELECT outbox.reschedule(id, lease_version, '1 minute', 'late 503', false, 503) AS stale_reschedule
  FROM lease2;
SELECT id, status, last_error, last_http_status FROM outbox.messages WHERE id = 2;

-- A dead message can be skipped.
SELECT pg_temp.kill_all('HTTP 400') AS killed;
SELECT outbox.skip(3, 'fixed by hand in the CRM') AS skipped;
SELECT id, status, last_error FROM outbox.messages WHERE id = 3;

-- A done message (or a missing one) cannot be skipped.
SELECT outbox.skip(1, 'again') AS skip_done, outbox.skip(12345, 'missing') AS skip_missing;
SELECT id, status, last_error FROM outbox.messages ORDER BY id;

-- ------------------------------------------------------------------
-- purge(older_than): deletes done messages whose done_at is older than the
-- interval, and nothing else; returns the count.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
-- 1-4 will be done, 5 dead, 6 pending.
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}'))
  FROM generate_series(1, 6) AS g;
SELECT count(*) FILTER (WHERE CASE WHEN id <= 4 THEN outbox.mark_done(id, lease_version)
                                   ELSE outbox.mark_dead(id, lease_version, 'HTTP 400') END) AS finalized
  FROM outbox.claim('worker', 5, '1 minute');
-- Pretend 1 and 2 were delivered 10 days ago, 3 two days ago; 4 just now.
-- The dead one is old too: purge never deletes dead messages.
UPDATE outbox.messages SET done_at = now() - interval '10 days' WHERE id IN (1, 2);
UPDATE outbox.messages SET done_at = now() - interval '2 days' WHERE id = 3;
UPDATE outbox.messages SET created_at = now() - interval '30 days' WHERE id = 5;
SELECT id, status FROM outbox.messages ORDER BY id;

SELECT outbox.purge('7 days') AS purged;
SELECT id, status FROM outbox.messages ORDER BY id;
SELECT outbox.purge('7 days') AS purged_again;
SELECT outbox.purge('1 day') AS purged;
-- A zero interval purges every done message finalized before this
-- transaction began.
SELECT outbox.purge('0') AS purged;
SELECT id, status FROM outbox.messages ORDER BY id;
