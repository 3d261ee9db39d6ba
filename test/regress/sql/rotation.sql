--
-- rotation: outbox.rotate_secret() — the replaced secret is kept for the
-- grace period (admin-only, like signing_secret); every bad input is
-- refused and changes nothing.
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url, signing_secret) VALUES
    ('signed',   'http://127.0.0.1:9/signed', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'),
    ('unsigned', 'http://127.0.0.1:9/unsigned', NULL);

-- rotate: the returned time is when the old secret stops being sent
-- (called once: BETWEEN would evaluate a volatile call twice)
SELECT r.until - now() AS grace_24h
  FROM (SELECT outbox.rotate_secret('signed', 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY') AS until OFFSET 0) AS r;
SELECT signing_secret, previous_signing_secret,
       previous_secret_until - now() BETWEEN interval '23 hours 59 minutes' AND interval '24 hours' AS grace_about_24h
  FROM outbox.endpoints WHERE name = 'signed';

-- rotating again within the grace period keeps only the one just replaced
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0', interval '1 hour') - now() AS grace;
SELECT signing_secret, previous_signing_secret FROM outbox.endpoints WHERE name = 'signed';

-- grace 0: the old secret is dropped at once
SELECT outbox.rotate_secret('signed', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '0 seconds') AS until;
SELECT signing_secret, previous_signing_secret, previous_secret_until FROM outbox.endpoints WHERE name = 'signed';

-- an unsigned endpoint becomes signed: there is nothing to keep
SELECT outbox.rotate_secret('unsigned', 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY') AS until;
SELECT signing_secret, previous_signing_secret, previous_secret_until FROM outbox.endpoints WHERE name = 'unsigned';

-- bad input: each refused, nothing changed
CREATE TEMP TABLE before_bad AS SELECT * FROM outbox.endpoints;
SELECT outbox.rotate_secret(NULL, 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY');
SELECT outbox.rotate_secret('signed', NULL);
SELECT outbox.rotate_secret('signed', 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY', NULL);
SELECT outbox.rotate_secret('nowhere', 'whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY');
SELECT outbox.rotate_secret('signed', 'not-a-secret');
SELECT outbox.rotate_secret('signed', 'whsec_c2hvcnQ=');
SELECT outbox.rotate_secret('signed', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0', interval '-1 second');
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0', interval '31 days');
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0', interval '2 months');
-- a malformed replaced secret written by hand is refused by the row check
UPDATE outbox.endpoints SET previous_signing_secret = 'whsec_!!' WHERE name = 'signed';
SELECT count(*) AS changed_rows
  FROM (SELECT * FROM outbox.endpoints EXCEPT SELECT * FROM before_bad) AS d;

-- privileges: admins rotate; monitors see when a grace period ends, never a secret;
-- producers see neither
CREATE ROLE regress_rot_producer IN ROLE outbox_producer;
CREATE ROLE regress_rot_monitor  IN ROLE outbox_monitor;
CREATE ROLE regress_rot_admin    IN ROLE outbox_admin;
SELECT r AS role,
       has_function_privilege(r, 'outbox.rotate_secret(text, text, interval)', 'EXECUTE') AS rotate,
       has_column_privilege(r, 'outbox.endpoints', 'previous_signing_secret', 'SELECT') AS read_previous,
       has_column_privilege(r, 'outbox.endpoints', 'previous_secret_until', 'SELECT') AS read_until
  FROM unnest(ARRAY['regress_rot_producer', 'regress_rot_monitor', 'regress_rot_admin', 'public']) AS r;
SET ROLE regress_rot_monitor;
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0');
SELECT name, previous_secret_until IS NULL AS no_grace FROM outbox.endpoints ORDER BY name;
RESET ROLE;
SET ROLE regress_rot_admin;
SELECT outbox.rotate_secret('signed', 'whsec_MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0', '1 minute') IS NOT NULL AS rotated;
RESET ROLE;
DROP ROLE regress_rot_producer, regress_rot_monitor, regress_rot_admin;
DELETE FROM outbox.endpoints;
