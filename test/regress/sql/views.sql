--
-- views: queue_depth, health, attempts_histogram, dead_letters.
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('crm', 'http://127.0.0.1:9/crm');

-- ------------------------------------------------------------------
-- Empty queue: queue_depth still lists all four statuses, health is one
-- row of zeros, no age; the other views are empty.
-- ------------------------------------------------------------------
SELECT * FROM outbox.queue_depth;
SELECT pending, processing, done, dead, oldest_pending_age, expired_leases,
       lost_leases IS NOT NULL AS has_lost_leases
  FROM outbox.health;
SELECT * FROM outbox.attempts_histogram;
SELECT count(*) FROM outbox.dead_letters;

-- ------------------------------------------------------------------
-- A queue with every status:
--   1, 2        done
--   3           dead (permanent failure)
--   4           dead (lease expired on its last attempt)
--   5           processing, lease running
--   6           pending, rescheduled once (attempts 1)
--   7           processing, lease expired (a crashed worker)
--   8, 9, 10    pending, never tried
-- ------------------------------------------------------------------
SELECT count(outbox.enqueue('order', g::text, 'order.created', jsonb_build_object('n', g),
                            endpoint => CASE WHEN g = 3 THEN 'crm' ELSE 'default' END))
  FROM generate_series(1, 7) AS g;

-- 1-3: claimed and finalized.
SELECT id,
       CASE WHEN id <= 2 THEN outbox.mark_done(id, lease_version, 200)
            ELSE outbox.mark_dead(id, lease_version, 'HTTP 404 Not Found', 404)
       END AS finalized
  FROM outbox.claim('worker', 3, '1 minute')
 ORDER BY id;
-- 4: a poison message on its last attempt (max_attempts 1) whose worker
-- crashed.  The next claim reaps it to dead, and leases 5.
SELECT id FROM outbox.claim('crasher', 1, '100 ms', 1);
SELECT pg_sleep(0.2);
SELECT id FROM outbox.claim('worker', 1, '1 hour', 1);
-- 6: claimed and rescheduled (a transient failure).
SELECT id, outbox.reschedule(id, lease_version, '1 hour', 'HTTP 503', false, 503) AS rescheduled
  FROM outbox.claim('worker', 1, '1 minute');
-- 7: claimed with a short lease and never finalized.
SELECT id FROM outbox.claim('crashed-worker', 1, '100 ms');
SELECT pg_sleep(0.2);
-- 8-10: fresh.  8 was created an hour ago (the oldest pending message).
SELECT count(outbox.enqueue('order', g::text, 'order.created', '{}'))
  FROM generate_series(8, 10) AS g;
UPDATE outbox.messages SET created_at = now() - interval '1 hour' WHERE id = 8;

SELECT id, status, attempts, lease_until < now() AS lease_expired FROM outbox.messages ORDER BY id;

-- Counts per status, in lifecycle order.
SELECT * FROM outbox.queue_depth;

-- One row: the same counts, the age of the oldest unfinished message,
-- and the processing rows whose lease has expired (7).
SELECT pending, processing, done, dead,
       oldest_pending_age IS NOT NULL AS has_age,
       oldest_pending_age >= interval '1 hour'
           AND oldest_pending_age < interval '2 hours' AS age_is_oldest_pending,
       expired_leases,
       lost_leases IS NOT NULL AS has_lost_leases
  FROM outbox.health;
SELECT count(*) AS rows FROM outbox.health;

-- Attempts of unfinished (pending and processing) messages.
SELECT * FROM outbox.attempts_histogram;

-- Dead letters, with the reason, oldest first.
SELECT id, endpoint, aggregate_type, aggregate_id, event_type, ordered, attempts,
       last_http_status, last_error, payload
  FROM outbox.dead_letters;

-- oldest_pending_age ignores done and dead messages, however old.
UPDATE outbox.messages SET created_at = now() - interval '30 days' WHERE id IN (1, 3);
SELECT oldest_pending_age < interval '2 hours' AS age_ignores_finished FROM outbox.health;
-- ... and counts processing ones (5: its lease running).
UPDATE outbox.messages SET created_at = now() - interval '3 hours' WHERE id = 5;
SELECT oldest_pending_age >= interval '3 hours' AND oldest_pending_age < interval '4 hours'
       AS age_counts_processing
  FROM outbox.health;

-- Once everything is finished, there is no pending age and no histogram.
UPDATE outbox.messages SET status = 'done', done_at = now(), lease_owner = NULL, lease_until = NULL
 WHERE status IN ('pending', 'processing');
SELECT * FROM outbox.queue_depth;
SELECT pending, processing, done, dead, oldest_pending_age, expired_leases FROM outbox.health;
SELECT * FROM outbox.attempts_histogram;

-- ------------------------------------------------------------------
-- The views read partial indexes of the states they count, never the whole
-- table: with sequential scans disabled, every scan of outbox.messages in
-- their plans is of a partial index (messages_ready, messages_leased,
-- messages_done, messages_dead; the planner may also take messages_open
-- for ordered pending rows); a scan of the table, or of a full index such
-- as the primary key, would be named here.
-- ------------------------------------------------------------------
CREATE FUNCTION pg_temp.message_scans(q text, names boolean DEFAULT false) RETURNS SETOF text LANGUAGE plpgsql AS $f$
DECLARE
    l   text;
    idx text;
BEGIN
    FOR l IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
        idx := coalesce(substring(l from ' using (\w+) on messages'), substring(l from 'Bitmap Index Scan on (\w+)'));
        IF l ~ 'Seq Scan on messages' THEN
            RETURN NEXT 'Seq Scan on messages';
        ELSIF idx IS NOT NULL THEN
            RETURN NEXT CASE WHEN (SELECT i.indpred IS NOT NULL FROM pg_catalog.pg_index AS i
                                    WHERE i.indexrelid = ('outbox.' || idx)::regclass)
                             THEN CASE WHEN names THEN idx ELSE 'a partial index' END
                             ELSE 'full index ' || idx END;
        END IF;
    END LOOP;
END
$f$;
SET enable_seqscan = off;
SELECT DISTINCT s AS health_reads FROM pg_temp.message_scans('SELECT * FROM outbox.health') AS s ORDER BY 1;
SELECT DISTINCT s AS queue_depth_reads FROM pg_temp.message_scans('SELECT * FROM outbox.queue_depth') AS s ORDER BY 1;
SELECT DISTINCT s AS attempts_histogram_reads
  FROM pg_temp.message_scans('SELECT * FROM outbox.attempts_histogram') AS s ORDER BY 1;
-- each of the four states by the index of its own
SELECT DISTINCT s AS health_state_indexes
  FROM pg_temp.message_scans('SELECT pending, processing, done, dead FROM outbox.health', true) AS s ORDER BY 1;
RESET enable_seqscan;
