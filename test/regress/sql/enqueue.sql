--
-- enqueue: outbox.enqueue() and plain INSERTs create pending messages.
--
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;

INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('billing', 'https://billing.example.com/hooks?v=1');

-- Endpoint defaults.
SELECT name, url, headers, signing_secret, timeout, max_in_flight, enabled, defer_statuses
  FROM outbox.endpoints
 ORDER BY name;

-- enqueue() returns the id of the new message.
SELECT outbox.enqueue('order', '1', 'order.created', '{"total": 10}') AS id;

-- Every optional argument, by name.
SELECT outbox.enqueue('order', '1', 'order.paid', '{"total": 10}',
                      endpoint => 'billing',
                      ordered => true,
                      available_at => now() + interval '1 hour',
                      headers => '{"X-Tenant": "acme"}') AS id;

-- NULL for ordered / available_at means the default.
SELECT outbox.enqueue('order', '2', 'order.created', '{}', 'default', NULL, NULL, NULL) AS id;

-- Defaults: status pending, attempts 0, endpoint 'default', not ordered,
-- no lease, lease_version 0, available now.
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, endpoint, ordered,
       status, attempts, lease_owner, lease_until IS NULL AS no_lease, lease_version,
       last_error, last_http_status, done_at IS NULL AS not_done,
       available_at <= now() AS available_now
  FROM outbox.messages
 ORDER BY id;

-- available_at given in the future is stored as given.
SELECT id, available_at > now() + interval '50 minutes' AS in_an_hour
  FROM outbox.messages
 WHERE id = 2;

-- The message is part of the caller's transaction: a rollback leaves nothing.
BEGIN;
SELECT outbox.enqueue('order', '3', 'order.created', '{}') IS NOT NULL AS enqueued;
ROLLBACK;
SELECT count(*) AS messages FROM outbox.messages;

-- A plain INSERT is a supported way to enqueue: same defaults.
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('customer', 'c-7', 'customer.created', '{"name": "Ada"}')
RETURNING id, endpoint, ordered, status, attempts, lease_version, available_at <= now() AS available_now;

-- Plain INSERTs go through the same validation trigger as enqueue():
-- headers must be a JSON object of strings ...
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('customer', 'c-7', 'customer.updated', '{}', '["X-Tenant", "acme"]');
-- ... event_type is sent as ce-type, so CR/LF is refused ...
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('customer', 'c-7', E'customer.updated\r\nX-Injected: 1', '{}');
-- ... and the endpoint must exist (foreign key).
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
VALUES ('customer', 'c-7', 'customer.updated', '{}', 'nowhere');
-- The state columns belong to the dispatcher: id cannot be chosen.
INSERT INTO outbox.messages (id, aggregate_type, aggregate_id, event_type, payload)
VALUES (1000, 'customer', 'c-7', 'customer.updated', '{}');

-- Nothing was added by the failed inserts.
SELECT count(*) AS messages FROM outbox.messages;

-- ids keep increasing across enqueue() and INSERT (the failed inserts
-- above used up ids 6-8: sequences are not transactional).
SELECT outbox.enqueue('customer', 'c-8', 'customer.created', '{}') AS id;

-- wake() is callable (it only takes effect at commit).
SELECT outbox.wake();
