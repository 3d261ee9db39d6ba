--
-- tracecontext: W3C trace context captured at enqueue/publish from
-- outbox_dispatcher.traceparent / .tracestate (SET LOCAL per transaction)
-- or given as the message's own traceparent / tracestate headers;
-- malformed values are refused and nothing is stored.
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', 'http://127.0.0.1:9/hook'), ('audit', 'http://127.0.0.1:9/audit');
INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('default', '{order.*}'), ('audit', '{*}');

-- captured for the transaction only
BEGIN;
SET LOCAL outbox_dispatcher.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL outbox_dispatcher.tracestate = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
SELECT outbox.enqueue('order', '1', 'order.created', '{}') AS id;
SELECT outbox.publish('order', '1', 'order.paid', '{}') AS ids;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', '1', 'order.shipped', '{}', '{"X-A": "1"}') RETURNING id;
COMMIT;
SELECT outbox.enqueue('order', '2', 'order.created', '{}') AS id;
SELECT id, event_type, endpoint, headers FROM outbox.messages ORDER BY id;

-- the message's own traceparent wins over the transaction's (and takes no tracestate from it)
BEGIN;
SET LOCAL outbox_dispatcher.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL outbox_dispatcher.tracestate = 'congo=t61rcWkgMzE';
SELECT outbox.enqueue('order', '3', 'order.created', '{}', 'default', false, now(),
                      '{"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}') AS id \gset
COMMIT;
SELECT headers FROM outbox.messages WHERE id = :id;

-- a tracestate alone is not captured
BEGIN;
SET LOCAL outbox_dispatcher.tracestate = 'congo=t61rcWkgMzE';
SELECT outbox.enqueue('order', '4', 'order.created', '{}') AS id \gset
COMMIT;
SELECT headers IS NULL AS no_headers FROM outbox.messages WHERE id = :id;

-- malformed values: refused when set, or when the message is written; nothing stored
CREATE TEMP TABLE before_bad AS SELECT id FROM outbox.messages;
SET outbox_dispatcher.traceparent = 'garbage';
SET outbox_dispatcher.traceparent = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01';
SET outbox_dispatcher.traceparent = '00-00000000000000000000000000000000-00f067aa0ba902b7-01';
SET outbox_dispatcher.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01';
SET outbox_dispatcher.traceparent = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET outbox_dispatcher.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra';
SET outbox_dispatcher.tracestate = 'Congo=x';
SET outbox_dispatcher.tracestate = 'congo';
SELECT outbox.enqueue('order', '5', 'order.created', '{}', 'default', false, now(),
                      '{"traceparent": "00-abc"}');
SELECT outbox.enqueue('order', '5', 'order.created', '{}', 'default', false, now(),
                      '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b=c"}');
SELECT outbox.publish('order', '5', 'order.created', '{}', false, now(), '{"TRACEPARENT": "x"}');
SELECT outbox.publish('nothing', '5', 'matches', '{}', false, now(), '{"traceparent": "x"}');
SELECT count(*) AS new_rows FROM outbox.messages WHERE id NOT IN (SELECT id FROM before_bad);
SHOW outbox_dispatcher.traceparent;
SHOW outbox_dispatcher.tracestate;

TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.endpoints;
