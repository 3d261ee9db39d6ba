--
-- fanout: outbox.subscriptions, outbox.publish(), outbox.subscribers(),
-- per-endpoint ordering, dead_at, outbox.recover() and
-- outbox.replay_window(); every bad input is refused and changes nothing.
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES
    ('default', 'http://127.0.0.1:9/hook'),
    ('orders',  'http://127.0.0.1:9/orders'),
    ('billing', 'http://127.0.0.1:9/billing'),
    ('audit',   'http://127.0.0.1:9/audit'),
    ('paused',  'http://127.0.0.1:9/paused');
UPDATE outbox.endpoints SET enabled = false WHERE name = 'paused';

-- ------------------------------------------------------------------
-- Subscriptions and their checks.
-- ------------------------------------------------------------------
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{order.*}');
INSERT INTO outbox.subscriptions (endpoint, event_types, filter)
VALUES ('billing', '{order.paid,invoice.*}', '{"currency": "EUR"}');
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('audit', '{*}');
-- a second subscription of audit that also matches: still one delivery
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('audit', '{order.created}');
-- a disabled subscription delivers nothing; a paused endpoint's deliveries wait
INSERT INTO outbox.subscriptions (endpoint, event_types, enabled) VALUES ('default', '{*}', false);
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('paused', '{invoice.*}');
SELECT id, endpoint, event_types, filter, enabled FROM outbox.subscriptions ORDER BY id;

-- Bad subscriptions: each refused, nothing stored.
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('nowhere', '{*}');
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', NULL);
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{}');
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{{a},{b}}');
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', ARRAY['order.*', NULL]);
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', ARRAY['order.*', '']);
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', ARRAY[E'order\n*']);
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', ARRAY[repeat('x', 257)]);
INSERT INTO outbox.subscriptions (endpoint, event_types)
SELECT 'orders', array_agg('e' || g) FROM generate_series(1, 65) AS g;
INSERT INTO outbox.subscriptions (endpoint, event_types, filter) VALUES ('orders', '{*}', '[1, 2]');
INSERT INTO outbox.subscriptions (endpoint, event_types, filter) VALUES ('orders', '{*}', '"FR"');
INSERT INTO outbox.subscriptions (endpoint, event_types, filter) VALUES ('orders', '{*}', 'null');
INSERT INTO outbox.subscriptions (endpoint, event_types, filter)
VALUES ('orders', '{*}', jsonb_build_object('k', repeat('x', 9000)));
INSERT INTO outbox.subscriptions (endpoint, event_types, enabled) VALUES ('orders', '{*}', NULL);
UPDATE outbox.subscriptions SET event_types = '{}' WHERE endpoint = 'orders';
-- the limits themselves are accepted
BEGIN;
INSERT INTO outbox.subscriptions (endpoint, event_types)
SELECT 'orders', array_agg(repeat('e', 256)) FROM generate_series(1, 64);
ROLLBACK;
SELECT count(*) AS subscriptions FROM outbox.subscriptions;

-- ------------------------------------------------------------------
-- subscribers(): who would get an event.
-- ------------------------------------------------------------------
SELECT outbox.subscribers('order.created', '{}') AS endpoint;
SELECT outbox.subscribers('order.paid', '{"currency": "EUR", "total": 5}') AS endpoint;
SELECT outbox.subscribers('order.paid', '{"currency": "USD"}') AS endpoint;
SELECT outbox.subscribers('invoice.sent', '{"currency": "EUR"}') AS endpoint;
SELECT outbox.subscribers('orders.created', '{}') AS endpoint;    -- 'order.*' does not match 'orders.'
SELECT count(*) AS none FROM outbox.subscribers(NULL, '{}');

-- ------------------------------------------------------------------
-- publish(): one delivery per endpoint, ids ascending in endpoint order.
-- ------------------------------------------------------------------
SELECT outbox.publish('order', '1', 'order.created', '{"currency": "EUR"}') AS ids;
SELECT outbox.publish('order', '1', 'order.paid', '{"currency": "EUR"}', ordered => true,
                      headers => '{"X-Tenant": "acme"}') AS ids;
SELECT outbox.publish('invoice', '7', 'invoice.sent', '{"currency": "EUR"}',
                      available_at => now() + interval '1 hour') AS ids;
-- nothing subscribed (audit's '*' switched off for now): an empty array, nothing written
UPDATE outbox.subscriptions SET enabled = false WHERE endpoint = 'audit';
SELECT outbox.publish('user', '1', 'user.created', '{}') AS ids;
SELECT id, endpoint, aggregate_type, aggregate_id, event_type, payload, headers, ordered, status,
       available_at > now() AS later
  FROM outbox.messages ORDER BY id;

-- Bad input is refused even when no subscription matches (nothing is written).
SELECT outbox.publish(NULL, '1', 'user.created', '{}');
SELECT outbox.publish('user', NULL, 'user.created', '{}');
SELECT outbox.publish('user', '1', NULL, '{}');
SELECT outbox.publish('user', '1', 'user.created', NULL);
SELECT outbox.publish('user', '1', E'user.created\r\nX-Evil: 1', '{}');
SELECT outbox.publish('user', '', 'user.created', '{}');
SELECT outbox.publish('user', '1', 'user.created', '{}', headers => '["x"]');
SELECT outbox.publish('user', '1', 'user.created', '{}', headers => '{"Content-Type": "text/plain"}');
SELECT outbox.publish('user', '1', 'user.created', '{}', available_at => 'infinity');
SET outbox_dispatcher.max_payload_bytes = 100;
SELECT outbox.publish('user', '1', 'user.created', jsonb_build_object('x', repeat('y', 200)));
SELECT outbox.publish('order', '1', 'order.created', jsonb_build_object('x', repeat('y', 200)));
RESET outbox_dispatcher.max_payload_bytes;
SELECT count(*) AS messages FROM outbox.messages;
UPDATE outbox.subscriptions SET enabled = true WHERE endpoint = 'audit';

-- The plain-INSERT way to fan out.
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', '2', 'order.created', p, s
  FROM (SELECT '{"currency": "EUR"}'::jsonb AS p) AS e, outbox.subscribers('order.created', e.p) AS s
RETURNING id, endpoint;

-- ------------------------------------------------------------------
-- Ordering is per aggregate per endpoint: a dead head for one endpoint
-- does not hold back the same aggregate's deliveries to another.
-- ------------------------------------------------------------------
TRUNCATE outbox.messages RESTART IDENTITY;
SELECT outbox.publish('cart', '9', 'order.created', '{}', ordered => true) AS first;
SELECT outbox.publish('cart', '9', 'order.updated', '{}', ordered => true) AS second;
-- the first event's deliveries are claimed, the second's wait (same endpoint, earlier unfinished)
SELECT id, endpoint, event_type FROM outbox.claim('w', 100, '1 minute') ORDER BY id;
-- orders' head dies; audit's head is delivered
SELECT outbox.mark_dead(id, lease_version, 'rejected') AS dead
  FROM outbox.messages WHERE endpoint = 'orders' AND status = 'processing';
SELECT outbox.mark_done(id, lease_version) AS done
  FROM outbox.messages WHERE endpoint = 'audit' AND status = 'processing';
-- audit's second delivery is claimable; orders' waits behind its dead head
SELECT id, endpoint, event_type FROM outbox.claim('w', 100, '1 minute') ORDER BY id;
SELECT id, endpoint, status, dead_at IS NOT NULL AS has_dead_at FROM outbox.messages ORDER BY id;

-- ------------------------------------------------------------------
-- recover(): dead messages that died in a window; replay_window(): done ones.
-- ------------------------------------------------------------------
-- (dead_at and done_at set back in time to make two windows)
UPDATE outbox.messages SET dead_at = now() - interval '2 hours' WHERE status = 'dead';
SELECT outbox.recover('orders', now() - interval '1 hour') AS recovered_outside_window;
SELECT outbox.recover('audit', now() - interval '3 hours') AS other_endpoint;
SELECT outbox.recover('orders', now() - interval '3 hours', now() - interval '90 minutes') AS recovered;
SELECT id, endpoint, status, attempts, last_error FROM outbox.messages WHERE endpoint = 'orders' ORDER BY id;
-- the recovered head comes first, then the rest of its aggregate, in order
SELECT id, endpoint, event_type FROM outbox.claim('w', 100, '1 minute') ORDER BY id;

UPDATE outbox.messages SET done_at = now() - interval '2 days' WHERE status = 'done';
SELECT outbox.replay_window('audit', now() - interval '1 day') AS replayed_outside_window;
SELECT outbox.replay_window('audit', now() - interval '3 days', now() - interval '1 day') AS replayed;
SELECT id, endpoint, status, attempts, done_at, last_error FROM outbox.messages WHERE endpoint = 'audit' ORDER BY id;

-- Bad arguments: clear errors, nothing changes.
SELECT outbox.recover('nowhere', now() - interval '1 day');
SELECT outbox.recover(NULL, now() - interval '1 day');
SELECT outbox.recover('orders', NULL);
SELECT outbox.recover('orders', now(), NULL);
SELECT outbox.recover('orders', '2026-02-01', '2026-01-01');
SELECT outbox.replay_window('nowhere', now() - interval '1 day');
SELECT outbox.replay_window('audit', '2026-02-01', '2026-01-01');
-- infinite windows are allowed
SELECT outbox.recover('orders', '-infinity', 'infinity') AS none_left;

-- Deleting an endpoint deletes its subscriptions.
DELETE FROM outbox.messages WHERE endpoint = 'billing';
DELETE FROM outbox.endpoints WHERE name = 'billing';
SELECT endpoint FROM outbox.subscriptions ORDER BY id;
-- Renaming one carries them along.
UPDATE outbox.endpoints SET name = 'paused2' WHERE name = 'paused';
SELECT endpoint FROM outbox.subscriptions ORDER BY id;

-- endpoint_health counts enabled subscriptions.
SELECT endpoint, subscriptions FROM outbox.endpoint_health ORDER BY endpoint;

-- The attempt log: 32 daily partitions, empty until a worker sends.
SELECT count(*) AS partitions FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass;
SELECT count(*) AS attempts FROM outbox.attempts;
SELECT * FROM outbox.attempt_stats;

-- ------------------------------------------------------------------
-- Privileges: producers publish (with their own rights) and may see who
-- subscribes, never the attempt log; monitors read subscriptions and the
-- attempt log, never change them; recover/replay_window are admins'.
-- ------------------------------------------------------------------
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_fanout_producer, regress_fanout_monitor, regress_fanout_admin;
RESET client_min_messages;
CREATE ROLE regress_fanout_producer IN ROLE outbox_producer;
CREATE ROLE regress_fanout_monitor  IN ROLE outbox_monitor;
CREATE ROLE regress_fanout_admin    IN ROLE outbox_admin;

SET ROLE regress_fanout_producer;
SELECT array_length(outbox.publish('order', '5', 'order.created', '{}'), 1) AS deliveries;
SELECT outbox.subscribers('order.created', '{}') AS endpoint;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', '6', 'order.created', '{}', s FROM outbox.subscribers('order.created', '{}') AS s;
SELECT count(*) FROM outbox.attempts;
SELECT response_body FROM outbox.attempts_00;
SELECT * FROM outbox.attempt_stats;
SELECT id FROM outbox.subscriptions;
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{*}');
SELECT outbox.recover('orders', '-infinity');
SELECT outbox.replay_window('orders', '-infinity');
RESET ROLE;

SET ROLE regress_fanout_monitor;
SELECT count(*) >= 0 AS reads_attempts FROM outbox.attempts;
SELECT count(*) AS subscriptions FROM outbox.subscriptions;
SELECT count(*) >= 0 AS reads_stats FROM outbox.attempt_stats;
SELECT outbox.subscribers('order.created', '{}') AS endpoint;
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{*}');
UPDATE outbox.subscriptions SET enabled = false;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.attempts;
SELECT outbox.publish('order', '5', 'order.created', '{}');
SELECT outbox.recover('orders', '-infinity');
RESET ROLE;

SET ROLE regress_fanout_admin;
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('orders', '{x.*}') RETURNING endpoint, event_types;
SELECT outbox.recover('orders', '-infinity') AS recovered;
SELECT outbox.replay_window('orders', '-infinity') AS replayed;
RESET ROLE;

DROP ROLE regress_fanout_producer, regress_fanout_monitor, regress_fanout_admin;
