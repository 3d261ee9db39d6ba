--
-- retry_policy: endpoints.retry_schedule and endpoints.max_attempts — the
-- ranges, and the attempt limit of the expired-lease paths (reap and
-- takeover), which follow the endpoint: max_attempts, else one more than
-- the retry_schedule has delays, else the caller's (the GUC's) limit; and
-- endpoints.disable_after (default 5 days, its range, endpoint_health).
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url, max_attempts) VALUES ('two', 'http://127.0.0.1:9/two', 2);
INSERT INTO outbox.endpoints (name, url, retry_schedule)
VALUES ('spec', 'http://127.0.0.1:9/spec', '{5s,5min,30min,2h,5h,10h,10h}');
INSERT INTO outbox.endpoints (name, url, retry_schedule, max_attempts)
VALUES ('both', 'http://127.0.0.1:9/both', '{1s}', 3);
INSERT INTO outbox.endpoints (name, url) VALUES ('plain', 'http://127.0.0.1:9/plain');
SELECT name, retry_schedule, max_attempts FROM outbox.endpoints ORDER BY name;

-- bad values: each refused, nothing changed
CREATE TEMP TABLE before_bad AS SELECT * FROM outbox.endpoints;
UPDATE outbox.endpoints SET max_attempts = 0 WHERE name = 'plain';
UPDATE outbox.endpoints SET max_attempts = 1001 WHERE name = 'plain';
UPDATE outbox.endpoints SET max_attempts = -1 WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{0s}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{99 milliseconds}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{-1s}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{8 days}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{1 mon}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = ARRAY['1s', NULL]::interval[] WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = '{{1s},{2s}}' WHERE name = 'plain';
UPDATE outbox.endpoints SET retry_schedule = (SELECT array_agg(interval '1 second') FROM generate_series(1, 101))
 WHERE name = 'plain';
SELECT count(*) AS changed_rows
  FROM (SELECT * FROM outbox.endpoints EXCEPT SELECT * FROM before_bad) AS d;
-- the limits themselves are accepted
UPDATE outbox.endpoints SET retry_schedule = (SELECT array_agg(interval '7 days') FROM generate_series(1, 100)),
                            max_attempts = 1000 WHERE name = 'plain' RETURNING array_length(retry_schedule, 1), max_attempts;
UPDATE outbox.endpoints SET retry_schedule = '{100 milliseconds}', max_attempts = 1 WHERE name = 'plain'
RETURNING retry_schedule, max_attempts;
UPDATE outbox.endpoints SET retry_schedule = NULL, max_attempts = NULL WHERE name = 'plain';

-- expired leases: reaped at the endpoint's limit, whatever limit the claim is given (10)
SELECT outbox.enqueue('order', 'a', 'order.created', '{}', 'two') AS two_id,
       outbox.enqueue('order', 'b', 'order.created', '{}', 'both') AS both_id,
       outbox.enqueue('order', 'c', 'order.created', '{}', 'plain') AS plain_id;
SELECT count(*) AS claimed FROM outbox.claim('crash-1', 10, '100 ms', 10);
SELECT pg_sleep(0.2);
SELECT count(*) AS claimed FROM outbox.claim('crash-2', 10, '100 ms', 10);
SELECT pg_sleep(0.2);
-- 'two' used its 2 attempts: reaped; 'both' (max_attempts 3 wins over its schedule) and 'plain' taken over
SELECT endpoint, count(*) AS claimed FROM outbox.claim('crash-3', 10, '100 ms', 10) GROUP BY endpoint ORDER BY endpoint;
SELECT pg_sleep(0.2);
SELECT endpoint, count(*) AS claimed FROM outbox.claim('crash-4', 10, '100 ms', 10) GROUP BY endpoint ORDER BY endpoint;
SELECT endpoint, status, attempts, last_error FROM outbox.messages ORDER BY id;

-- a schedule alone: one attempt more than it has delays
TRUNCATE outbox.messages RESTART IDENTITY;
UPDATE outbox.endpoints SET retry_schedule = '{1s}' WHERE name = 'spec';
SELECT outbox.enqueue('order', 'd', 'order.created', '{}', 'spec') AS spec_id;
SELECT count(*) AS claimed FROM outbox.claim('crash-1', 10, '100 ms', 10);
SELECT pg_sleep(0.2);
SELECT count(*) AS claimed FROM outbox.claim('crash-2', 10, '100 ms', 10);
SELECT pg_sleep(0.2);
SELECT count(*) AS claimed FROM outbox.claim('crash-3', 10, '100 ms', 10);
SELECT endpoint, status, attempts, last_error FROM outbox.messages ORDER BY id;

-- disable_after: 5 days unless set, null for never, 1 minute to 365 days
SELECT name, disable_after FROM outbox.endpoints ORDER BY name;
UPDATE outbox.endpoints SET disable_after = NULL WHERE name = 'plain' RETURNING disable_after IS NULL AS never;
UPDATE outbox.endpoints SET disable_after = '1 minute' WHERE name = 'plain' RETURNING disable_after;
UPDATE outbox.endpoints SET disable_after = '365 days' WHERE name = 'plain' RETURNING disable_after;
UPDATE outbox.endpoints SET disable_after = '59 seconds' WHERE name = 'plain';
UPDATE outbox.endpoints SET disable_after = '366 days' WHERE name = 'plain';
UPDATE outbox.endpoints SET disable_after = '-1 day' WHERE name = 'plain';
SELECT disable_after FROM outbox.endpoints WHERE name = 'plain';
-- endpoint_health shows it, and since when every attempt has failed (null: not failing)
SELECT endpoint, disable_after, failing_since FROM outbox.endpoint_health ORDER BY endpoint;

-- monitors read the columns
CREATE ROLE regress_rp_monitor IN ROLE outbox_monitor;
SET ROLE regress_rp_monitor;
SELECT name, retry_schedule, max_attempts, disable_after FROM outbox.endpoints ORDER BY name;
RESET ROLE;
DROP ROLE regress_rp_monitor;

TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
