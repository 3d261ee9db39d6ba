--
-- validation: every bad input gets a clear error and changes nothing.
--
-- Each group shows the state before, the failing statements, and the same
-- state after.
--
-- Errors raised inside enqueue() carry a CONTEXT line quoting the
-- extension's internal INSERT; it is hidden so that this file does not
-- depend on that statement's text.
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url)
VALUES ('default', 'http://127.0.0.1:9/hook'),
       ('paused', 'http://127.0.0.1:9/paused');
UPDATE outbox.endpoints SET enabled = false WHERE name = 'paused';
SELECT outbox.enqueue('order', '1', 'order.created', '{}') AS id;

-- A fingerprint of both tables, compared before and after each group.
CREATE FUNCTION pg_temp.state() RETURNS TABLE (endpoints bigint, messages bigint, fingerprint text)
LANGUAGE sql AS $$
    SELECT (SELECT count(*) FROM outbox.endpoints),
           (SELECT count(*) FROM outbox.messages),
           md5((SELECT string_agg(e::text, '|' ORDER BY name) FROM outbox.endpoints AS e)
               || (SELECT string_agg(m::text, '|' ORDER BY id) FROM outbox.messages AS m))
$$;
SELECT endpoints, messages FROM pg_temp.state();
SELECT fingerprint AS before FROM pg_temp.state() \gset

-- ==================================================================
-- Endpoints
-- ==================================================================

-- URL: only http:// and https://.
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'ftp://example.com/hook');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'javascript:alert(1)');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'example.com/hook');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'file:///etc/passwd');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', '');
-- URL: whitespace and control characters (header/request-line injection).
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'http://example.com/a b');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', E'http://example.com/\r\nHost: evil');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', E'http://example.com/\x01');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', E'http://example.com/\t');
-- URL: no credentials in it, no fragment.
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'https://user:secret@example.com/hook');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'https://example.com/hook#frag');
-- URL: a host and a sane port are required.
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'http:///path');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'http://example.com:0/');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'http://example.com:65536/');
INSERT INTO outbox.endpoints (name, url) VALUES ('bad', 'http://example.com:80a/');
-- The same checks apply to UPDATE.
UPDATE outbox.endpoints SET url = 'ftp://example.com/' WHERE name = 'default';

-- Endpoint headers: a JSON object of strings ...
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '["a", "b"]');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '"Bearer x"');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '42');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"X-A": {"b": "c"}}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"X-A": 1}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"X-A": null}');
-- ... without CR/LF in names or values (the JSON escapes \r\n decode to
-- real CR and LF characters) ...
INSERT INTO outbox.endpoints (name, url, headers)
VALUES ('bad', 'http://example.com/', '{"X-A": "v\r\nX-Injected: 1"}');
INSERT INTO outbox.endpoints (name, url, headers)
VALUES ('bad', 'http://example.com/', '{"X-A\r\nX-Injected": "v"}');
INSERT INTO outbox.endpoints (name, url, headers)
VALUES ('bad', 'http://example.com/', '{"X-A": "v\u0001"}');
-- ... with valid header names ...
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"X A": "v"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"X-A:": "v"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"": "v"}');
-- ... that are not set by the dispatcher itself (any letter case).
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"Content-Length": "0"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"ce-id": "1"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"CE-Type": "x"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"Host": "evil"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"Idempotency-Key": "1"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"Webhook-Signature": "v1,x"}');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('bad', 'http://example.com/', '{"transfer-encoding": "chunked"}');
UPDATE outbox.endpoints SET headers = '{"Content-Type": "text/plain"}' WHERE name = 'default';

-- signing_secret: Standard Webhooks "whsec_" + base64 of 16..256 bytes.
INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('bad', 'http://example.com/', 'secret123');
INSERT INTO outbox.endpoints (name, url, signing_secret)
VALUES ('bad', 'http://example.com/', 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('bad', 'http://example.com/', 'whsec_');
INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('bad', 'http://example.com/', 'whsec_not*base64!');
INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES ('bad', 'http://example.com/', 'whsec_dG9vc2hvcnQ=');
INSERT INTO outbox.endpoints (name, url, signing_secret)
VALUES ('bad', 'http://example.com/',
        'whsec_' || replace(encode(convert_to(repeat('k', 300), 'UTF8'), 'base64'), E'\n', ''));

-- timeout: positive and shorter than outbox_dispatcher.lease (60s by
-- default), so that a request never outlives its lease.
SHOW outbox_dispatcher.lease;
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://example.com/', '60 seconds');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://example.com/', '5 minutes');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://example.com/', '1 day');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://example.com/', '0');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('bad', 'http://example.com/', '-1 second');
UPDATE outbox.endpoints SET timeout = '61 seconds' WHERE name = 'default';

-- max_in_flight: 1..10000.
INSERT INTO outbox.endpoints (name, url, max_in_flight) VALUES ('bad', 'http://example.com/', 0);
INSERT INTO outbox.endpoints (name, url, max_in_flight) VALUES ('bad', 'http://example.com/', -5);
INSERT INTO outbox.endpoints (name, url, max_in_flight) VALUES ('bad', 'http://example.com/', 10001);

-- defer_statuses: HTTP statuses 300..599, one-dimensional, no NULLs.
INSERT INTO outbox.endpoints (name, url, defer_statuses) VALUES ('bad', 'http://example.com/', '{200}');
INSERT INTO outbox.endpoints (name, url, defer_statuses) VALUES ('bad', 'http://example.com/', '{429,600}');
INSERT INTO outbox.endpoints (name, url, defer_statuses) VALUES ('bad', 'http://example.com/', '{425,NULL}');
INSERT INTO outbox.endpoints (name, url, defer_statuses) VALUES ('bad', 'http://example.com/', '{{425},{429}}');

-- name: not empty, no control characters.
INSERT INTO outbox.endpoints (name, url) VALUES ('', 'http://example.com/');
INSERT INTO outbox.endpoints (name, url) VALUES (E'bad\nname', 'http://example.com/');

-- Nothing changed.
SELECT endpoints, messages, fingerprint = :'before' AS unchanged FROM pg_temp.state();

-- The boundaries that are accepted (then removed again).
BEGIN;
INSERT INTO outbox.endpoints (name, url, headers, signing_secret, timeout, max_in_flight, defer_statuses)
VALUES ('ok-1', 'HTTPS://[::1]:8443/hooks/in?x=1&y=%20', '{"Authorization": "Bearer t", "X-Tab": "a\tb"}',
        'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '59.999 seconds', 1, '{300,425,599}'),
       ('ok-2', 'http://example.com:65535', '{}', NULL, '1 ms', 10000, '{}');
SELECT name, url, headers, timeout, max_in_flight, defer_statuses
  FROM outbox.endpoints WHERE name LIKE 'ok-%' ORDER BY name;
ROLLBACK;

-- ==================================================================
-- Messages: enqueue() and plain INSERT / UPDATE
-- ==================================================================

-- The endpoint must exist and be enabled.
SELECT outbox.enqueue('order', '2', 'order.created', '{}', endpoint => 'nope');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', endpoint => 'paused');

-- Required arguments.
SELECT outbox.enqueue(NULL, '2', 'order.created', '{}');
SELECT outbox.enqueue('order', NULL, 'order.created', '{}');
SELECT outbox.enqueue('order', '2', NULL, '{}');
SELECT outbox.enqueue('order', '2', 'order.created', NULL);
SELECT outbox.enqueue('order', '2', 'order.created', '{}', endpoint => NULL);
-- Empty strings are refused too (they are sent as ce-type / ce-subject).
SELECT outbox.enqueue('', '2', 'order.created', '{}');
SELECT outbox.enqueue('order', '', 'order.created', '{}');
SELECT outbox.enqueue('order', '2', '', '{}');

-- event_type, aggregate_type and aggregate_id end up in HTTP headers:
-- no CR/LF, no control characters.
SELECT outbox.enqueue('order', '2', E'order.created\r\nX-Injected: 1', '{}');
SELECT outbox.enqueue('order', '2', E'order.created\n', '{}');
SELECT outbox.enqueue(E'order\r', '2', 'order.created', '{}');
SELECT outbox.enqueue('order', E'2\n3', 'order.created', '{}');
SELECT outbox.enqueue('order', E'2\x7f', 'order.created', '{}');

-- Message headers: a JSON object of strings ...
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '["X-A", "v"]');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '"v"');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => 'true');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-A": {"nested": "v"}}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-A": 1}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-A": ["v"]}');
-- ... without CR/LF ...
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-A": "v\r\nX-Injected: 1"}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-A\nX-B": "v"}');
-- ... and not the dispatcher's own headers.
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"Content-Length": "10"}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"ce-id": "1"}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"X-Outbox-Attempt": "1"}');
SELECT outbox.enqueue('order', '2', 'order.created', '{}', headers => '{"webhook-id": "1"}');

-- A plain INSERT is checked the same way ...
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', '2', 'order.created', '{}', '{"X-A": 1}');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '2', E'order.created\r\nX-Injected: 1', '{}');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', '2', 'order.created', '{}', '{"ce-source": "evil"}');
-- ... and so is an UPDATE of any column that is sent.
UPDATE outbox.messages SET headers = '{"X-A": "v\r\nX-Injected: 1"}' WHERE id = 1;
UPDATE outbox.messages SET event_type = E'order.created\r\nX-Injected: 1' WHERE id = 1;
UPDATE outbox.messages SET aggregate_id = E'1\n' WHERE id = 1;
UPDATE outbox.messages SET aggregate_type = '' WHERE id = 1;

-- Payload size: at most outbox_dispatcher.max_payload_bytes, measured as
-- the JSON text sent.  '{"k": "<n x>"}' is 9 + n bytes.
SET outbox_dispatcher.max_payload_bytes = 64;
SELECT outbox.enqueue('order', '2', 'order.created', jsonb_build_object('k', repeat('x', 56)));
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '2', 'order.created', jsonb_build_object('k', repeat('x', 1000)));
UPDATE outbox.messages SET payload = jsonb_build_object('k', repeat('x', 56)) WHERE id = 1;

-- The state columns (only administrators and the workers write them):
-- status is pending, processing, done or dead (messages_status_check), and
-- lease_until is set exactly when status is processing
-- (messages_lease_check).  Terse: the errors' detail quotes the row.
\set VERBOSITY terse
UPDATE outbox.messages SET status = 'retry' WHERE id = 1;
UPDATE outbox.messages SET status = 'Done' WHERE id = 1;
UPDATE outbox.messages SET status = 'done ' WHERE id = 1;
UPDATE outbox.messages SET status = '' WHERE id = 1;
UPDATE outbox.messages SET status = 'processing' WHERE id = 1;
UPDATE outbox.messages SET lease_until = now() + interval '1 minute' WHERE id = 1;
UPDATE outbox.messages SET status = 'done', lease_until = now() WHERE id = 1;
\set VERBOSITY default
-- The functions behind them, as the SQL they stand for: NULL in, NULL out.
SELECT outbox._message_status_valid(NULL) AS status_null,
       outbox._message_lease_valid(NULL, now()) AS lease_status_null,
       outbox._message_lease_valid('processing', NULL) AS processing_without_lease,
       outbox._message_lease_valid('pending', NULL) AS pending_without_lease;

-- Nothing changed.
SELECT endpoints, messages, fingerprint = :'before' AS unchanged FROM pg_temp.state();

-- The boundary is accepted: exactly 64 bytes (rolled back).
BEGIN;
SELECT outbox.enqueue('order', '2', 'order.created', jsonb_build_object('k', repeat('x', 55))) IS NOT NULL AS accepted;
SELECT length(payload::text) AS payload_bytes FROM outbox.messages WHERE aggregate_id = '2';
ROLLBACK;
RESET outbox_dispatcher.max_payload_bytes;

-- A lease with status processing, and no lease otherwise, is accepted (rolled back).
BEGIN;
UPDATE outbox.messages SET status = 'processing', lease_until = now() + interval '1 minute' WHERE id = 1
RETURNING status, lease_until IS NOT NULL AS leased;
UPDATE outbox.messages SET status = 'dead', lease_until = NULL WHERE id = 1
RETURNING status, lease_until IS NOT NULL AS leased;
ROLLBACK;

-- ==================================================================
-- Worker and operator functions
-- ==================================================================
SELECT id, status, attempts, lease_version FROM outbox.messages ORDER BY id;

-- claim: owner, batch, lease and max_attempts.
SELECT * FROM outbox.claim(NULL, 10, '1 minute');
SELECT * FROM outbox.claim('', 10, '1 minute');
SELECT * FROM outbox.claim('w', 0, '1 minute');
SELECT * FROM outbox.claim('w', -1, '1 minute');
SELECT * FROM outbox.claim('w', NULL, '1 minute');
SELECT * FROM outbox.claim('w', 10, '0');
SELECT * FROM outbox.claim('w', 10, '-1 second');
SELECT * FROM outbox.claim('w', 10, NULL);
SELECT * FROM outbox.claim('w', 10, '1 minute', 0);

-- Nothing was claimed.
SELECT id, status, attempts, lease_version FROM outbox.messages ORDER BY id;

-- finalize: id and lease_version are required, the delay cannot be
-- negative, the http_status must be a real status, mark_dead needs a reason.
CREATE TEMP TABLE lease AS SELECT * FROM outbox.claim('w', 10, '1 minute');
SELECT outbox.mark_done(NULL, 1);
SELECT outbox.mark_done(id, NULL) FROM lease;
SELECT outbox.mark_done(id, lease_version, 99) FROM lease;
SELECT outbox.mark_done(id, lease_version, 600) FROM lease;
SELECT outbox.reschedule(id, lease_version, '-1 second', 'HTTP 503') FROM lease;
SELECT outbox.reschedule(id, lease_version, NULL, 'HTTP 503') FROM lease;
SELECT outbox.reschedule(id, lease_version, '1 second', 'HTTP 503', false, 0) FROM lease;
SELECT outbox.mark_dead(id, lease_version, NULL) FROM lease;
SELECT outbox.mark_dead(id, lease_version, '') FROM lease;
SELECT outbox.mark_dead(id, lease_version, 'HTTP 400', 1000) FROM lease;

-- The message is still processing under the same lease.
SELECT m.id, m.status, m.attempts, m.lease_version = l.lease_version AS same_lease
  FROM outbox.messages AS m JOIN lease AS l USING (id);
SELECT outbox.mark_done(id, lease_version) AS done FROM lease;

-- Operator functions.
SELECT outbox.purge('-1 day');
SELECT outbox.purge(NULL);
SELECT outbox.retry(NULL);
SELECT outbox.skip(NULL, 'reason');
SELECT outbox.skip(1, '');
SELECT id, status FROM outbox.messages ORDER BY id;

DROP TABLE lease;
