--
-- ordering: an ordered message is claimed only when no earlier ordered
-- message of its (aggregate_type, aggregate_id) for its endpoint is
-- pending, processing or dead.
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', 'http://127.0.0.1:9/hook');

-- A helper that claims everything claimable, finalizes it as done, and
-- reports what it delivered (ids in order), one "round" of a worker.
CREATE FUNCTION pg_temp.deliver_round() RETURNS bigint[]
LANGUAGE sql AS $$
    WITH c AS (SELECT id, lease_version FROM outbox.claim('worker', 100, '1 minute')),
         d AS (SELECT id, outbox.mark_done(id, lease_version) AS ok FROM c)
    SELECT coalesce(array_agg(id ORDER BY id) FILTER (WHERE ok), '{}') FROM d
$$;

-- ------------------------------------------------------------------
-- Aggregate X has 3 ordered messages, Y has 2, interleaved.
-- ------------------------------------------------------------------
SELECT outbox.enqueue('order', 'X', 'order.created', '{"n": 1}', ordered => true) AS x1,
       outbox.enqueue('order', 'Y', 'order.created', '{"n": 1}', ordered => true) AS y1;
SELECT outbox.enqueue('order', 'X', 'order.paid',    '{"n": 2}', ordered => true) AS x2,
       outbox.enqueue('order', 'Y', 'order.paid',    '{"n": 2}', ordered => true) AS y2;
SELECT outbox.enqueue('order', 'X', 'order.shipped', '{"n": 3}', ordered => true) AS x3;

-- The first claim gets only the head of each aggregate.
CREATE TEMP TABLE heads AS SELECT * FROM outbox.claim('worker', 100, '1 minute');
SELECT id, aggregate_id, event_type FROM heads ORDER BY id;

-- While the heads are processing, nothing else of X or Y is claimable.
SELECT count(*) AS claimed FROM outbox.claim('worker', 100, '1 minute');

-- Once X's head is done, X's next message is claimable; Y still waits.
SELECT outbox.mark_done(id, lease_version) AS done FROM heads WHERE aggregate_id = 'X';
SELECT id, aggregate_id, event_type FROM outbox.claim('worker', 100, '1 minute') ORDER BY id;
-- (finish Y's head and X's second message)
SELECT outbox.mark_done(m.id, m.lease_version) AS done
  FROM outbox.messages AS m WHERE m.status = 'processing' ORDER BY m.id;

-- Delivering round after round: every round delivers at most one message
-- per aggregate, in id order within the aggregate.
SELECT pg_temp.deliver_round() AS round_1;
SELECT pg_temp.deliver_round() AS round_2;
SELECT status, count(*) FROM outbox.messages GROUP BY status ORDER BY status;

-- ------------------------------------------------------------------
-- Ordering is per (aggregate_type, aggregate_id): the same id under
-- another aggregate_type is a different aggregate.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order',   '7', 'order.created',   '{}', ordered => true) AS id;
SELECT outbox.enqueue('order',   '7', 'order.paid',      '{}', ordered => true) AS id;
SELECT outbox.enqueue('invoice', '7', 'invoice.created', '{}', ordered => true) AS id;
SELECT id, aggregate_type, aggregate_id FROM outbox.claim('worker', 100, '1 minute') ORDER BY id;

-- ------------------------------------------------------------------
-- Unordered messages are never blocked, even behind an unfinished ordered
-- head of the same aggregate.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', 'Z', 'order.created',  '{}', ordered => true) AS id;
SELECT outbox.enqueue('order', 'Z', 'order.viewed',   '{}') AS id;
SELECT outbox.enqueue('order', 'Z', 'order.viewed',   '{}') AS id;
SELECT id, event_type, ordered FROM outbox.claim('worker', 100, '1 minute') ORDER BY id;

-- Nor do unordered messages hold back an ordered one: the sequence of an
-- ordered message is the ordered messages of its aggregate (and endpoint).
-- The first claim takes the pending unordered message and the first
-- ordered one together (the second ordered one waits for the first); the
-- unordered one then dies, and the second ordered one is delivered all
-- the same.
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', 'Z', 'order.viewed',  '{}') AS id;
SELECT outbox.enqueue('order', 'Z', 'order.paid',    '{}', ordered => true) AS id;
SELECT outbox.enqueue('order', 'Z', 'order.shipped', '{}', ordered => true) AS id;
CREATE TEMP TABLE unordered_head AS SELECT * FROM outbox.claim('worker', 100, '1 minute');
SELECT id, event_type, ordered FROM unordered_head ORDER BY id;
SELECT outbox.mark_dead(id, lease_version, 'HTTP 422', 422) AS dead FROM unordered_head WHERE NOT ordered;
SELECT outbox.mark_done(id, lease_version) AS done FROM unordered_head WHERE ordered;
SELECT pg_temp.deliver_round() AS delivered;
SELECT id, ordered, status FROM outbox.messages ORDER BY id;

-- ------------------------------------------------------------------
-- A dead head blocks its aggregate until an operator retries or skips it;
-- other aggregates keep flowing.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', 'W', 'order.created', '{}', ordered => true) AS w1;
SELECT outbox.enqueue('order', 'W', 'order.paid',    '{}', ordered => true) AS w2;
SELECT outbox.enqueue('order', 'V', 'order.created', '{}', ordered => true) AS v1;
SELECT outbox.enqueue('order', 'V', 'order.paid',    '{}', ordered => true) AS v2;

-- First round: W's head fails permanently, V's head is delivered.
SELECT id, aggregate_id,
       CASE aggregate_id
            WHEN 'W' THEN outbox.mark_dead(id, lease_version, 'HTTP 422', 422)
            ELSE outbox.mark_done(id, lease_version)
       END AS finalized
  FROM outbox.claim('worker', 100, '1 minute')
 ORDER BY id;
SELECT id, aggregate_id, status FROM outbox.messages ORDER BY id;

-- W2 stays blocked behind the dead head, V flows on.
SELECT pg_temp.deliver_round() AS delivered;
SELECT pg_temp.deliver_round() AS delivered;
SELECT id, aggregate_id, status FROM outbox.messages ORDER BY id;

-- retry: the head is pending again and is claimed first; W2 still waits
-- until it is done.
SELECT outbox.retry(1) AS retried;
SELECT pg_temp.deliver_round() AS delivered;
SELECT pg_temp.deliver_round() AS delivered;

-- The same with skip: the operator gives up on the dead head.
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.enqueue('order', 'W', 'order.created', '{}', ordered => true) AS w1;
SELECT outbox.enqueue('order', 'W', 'order.paid',    '{}', ordered => true) AS w2;
SELECT outbox.mark_dead(id, lease_version, 'HTTP 422', 422) AS dead
  FROM outbox.claim('worker', 100, '1 minute');
SELECT pg_temp.deliver_round() AS delivered;
SELECT outbox.skip(1, 'payload rejected by the receiver; superseded by id 2') AS skipped;
SELECT id, status, last_error FROM outbox.messages WHERE id = 1;
SELECT pg_temp.deliver_round() AS delivered;

DROP TABLE heads, unordered_head;
