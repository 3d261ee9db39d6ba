--
-- security: what an untrusted producer can set is bounded and validated, no
-- function of the extension resolves names through the caller's
-- search_path, enqueue() runs with the caller's rights, and secrets are not
-- echoed in errors (docs/security.md).
--
\set SHOW_CONTEXT never
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_sec_producer, regress_sec_other;
RESET client_min_messages;

TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', 'http://127.0.0.1:9/hook');

-- ------------------------------------------------------------------
-- search_path: every function of the extension pins it, except those on
-- the producers' insert path, which run no SQL: three trigger functions and
-- the two functions of the CHECK constraints of outbox.messages (called
-- for every row written: a SET clause would cost a setting's save and
-- restore each time).
-- ------------------------------------------------------------------
SELECT p.proname, p.prosecdef AS security_definer,
       coalesce(array_to_string(p.proconfig, ','), '(none)') AS config
  FROM pg_proc AS p
 WHERE p.pronamespace = 'outbox'::regnamespace
   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
 ORDER BY 1;
SELECT count(*) > 20 AS pinned_functions
  FROM pg_proc AS p
 WHERE p.pronamespace = 'outbox'::regnamespace
   AND 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig);
-- nothing runs with the extension owner's rights
SELECT proname FROM pg_proc WHERE pronamespace = 'outbox'::regnamespace AND prosecdef;

-- ------------------------------------------------------------------
-- enqueue() runs as the caller: row-level security and current_user
-- apply to it as to a plain INSERT.
-- ------------------------------------------------------------------
CREATE ROLE regress_sec_producer LOGIN IN ROLE outbox_producer;
CREATE ROLE regress_sec_other LOGIN IN ROLE outbox_producer;
CREATE TABLE public.sec_audit (who text, aggregate_type text);
GRANT INSERT ON public.sec_audit TO PUBLIC;
CREATE FUNCTION public.sec_audit_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.sec_audit VALUES (current_user, NEW.aggregate_type);
    RETURN NEW;
END $$;
CREATE TRIGGER sec_audit BEFORE INSERT ON outbox.messages
    FOR EACH ROW EXECUTE FUNCTION public.sec_audit_trigger();
ALTER TABLE outbox.messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY sec_own_aggregates ON outbox.messages FOR INSERT TO regress_sec_producer
    WITH CHECK (aggregate_type = 'order');
CREATE POLICY sec_read_ids ON outbox.messages FOR SELECT TO regress_sec_producer USING (true);
SET ROLE regress_sec_producer;
SELECT outbox.enqueue('order', '1', 'order.created', '{}') AS id;
SELECT outbox.enqueue('invoice', '1', 'invoice.created', '{}') AS id;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('invoice', '2', 'invoice.created', '{}');
RESET ROLE;
-- a role without a policy sees no row it may insert
SET ROLE regress_sec_other;
SELECT outbox.enqueue('order', '2', 'order.created', '{}') AS id;
RESET ROLE;
SELECT who, aggregate_type FROM public.sec_audit ORDER BY 1, 2;
SELECT id, aggregate_type FROM outbox.messages ORDER BY id;
DROP POLICY sec_own_aggregates ON outbox.messages;
DROP POLICY sec_read_ids ON outbox.messages;
ALTER TABLE outbox.messages DISABLE ROW LEVEL SECURITY;
DROP TRIGGER sec_audit ON outbox.messages;
DROP FUNCTION public.sec_audit_trigger();
DROP TABLE public.sec_audit;
-- producers read endpoint names, never their URLs, headers or secrets
SELECT has_column_privilege('outbox_producer', 'outbox.endpoints', 'name', 'SELECT') AS name,
       has_column_privilege('outbox_producer', 'outbox.endpoints', 'enabled', 'SELECT') AS enabled,
       has_column_privilege('outbox_producer', 'outbox.endpoints', 'url', 'SELECT') AS url,
       has_column_privilege('outbox_producer', 'outbox.endpoints', 'headers', 'SELECT') AS headers,
       has_column_privilege('outbox_producer', 'outbox.endpoints', 'signing_secret', 'SELECT') AS secret,
       has_column_privilege('outbox_producer', 'outbox.messages', 'payload', 'SELECT') AS payloads;

-- ------------------------------------------------------------------
-- available_at: finite, at most max_schedule_ahead ahead (an ordered
-- message scheduled for 'infinity' would block its aggregate for good).
-- ------------------------------------------------------------------
SELECT count(*) AS before FROM outbox.messages;
SELECT outbox.enqueue('order', '9', 'order.created', '{}', ordered => true, available_at => 'infinity');
SELECT outbox.enqueue('order', '9', 'order.created', '{}', available_at => '-infinity');
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, available_at)
VALUES ('order', '9', 'order.created', '{}', '9999-12-31');
SET outbox_dispatcher.max_schedule_ahead = '1h';
SELECT outbox.enqueue('order', '9', 'order.created', '{}', available_at => '2100-01-01');
SELECT outbox.enqueue('order', '9', 'order.created', '{}', available_at => now() + interval '30 minutes') > 0 AS ok;
RESET outbox_dispatcher.max_schedule_ahead;
-- the past is fine: the message is due at once
SELECT outbox.enqueue('order', '9', 'order.created', '{}', available_at => '2000-01-01') > 0 AS ok;
SELECT count(*) AS after FROM outbox.messages;

-- ------------------------------------------------------------------
-- Message headers: bounded in count and total bytes, values not blank.
-- ------------------------------------------------------------------
SELECT outbox.enqueue('order', '1', 'order.created', '{}',
                      headers => (SELECT jsonb_object_agg('X-H' || i, 'v') FROM generate_series(1, 65) AS i));
SELECT outbox.enqueue('order', '1', 'order.created', '{}',
                      headers => (SELECT jsonb_object_agg('X-H' || i, 'v') FROM generate_series(1, 64) AS i)) > 0 AS ok;
-- 3 values of 8000 bytes each: each is a valid header, together they exceed 16 KB
SELECT outbox.enqueue('order', '1', 'order.created', '{}',
                      headers => (SELECT jsonb_object_agg('X-H' || i, repeat('a', 8000)) FROM generate_series(1, 3) AS i));
SET outbox_dispatcher.max_header_bytes = 100;
-- names and values count: 3 + 98 bytes is over, 3 + 97 is exactly the limit
SELECT outbox.enqueue('order', '1', 'order.created', '{}', headers => jsonb_build_object('X-A', repeat('a', 98)));
SELECT outbox.enqueue('order', '1', 'order.created', '{}', headers => jsonb_build_object('X-A', repeat('a', 97))) > 0 AS ok;
RESET outbox_dispatcher.max_header_bytes;
SELECT outbox.enqueue('order', '1', 'order.created', '{}', headers => '{"X-Blank": ""}');
SELECT outbox.enqueue('order', '1', 'order.created', '{}', headers => '{"X-Blank": "  \t "}');
-- event_type goes out as ce-type, which CloudEvents requires: never blank
SELECT outbox.enqueue('order', '1', '   ', '{}');
SELECT outbox.enqueue('order', '1', E'\t', '{}');
SELECT outbox.enqueue(' ', '1', 'order.created', '{}');
-- non-superusers cannot raise the limits
SET ROLE regress_sec_producer;
SET outbox_dispatcher.max_header_bytes = 1000000;
SET outbox_dispatcher.max_schedule_ahead = '100 years';
RESET ROLE;

-- ------------------------------------------------------------------
-- Endpoints: credentials in a URL are never echoed; limits that would
-- break the arithmetic are refused.
-- ------------------------------------------------------------------
INSERT INTO outbox.endpoints (name, url) VALUES ('creds', 'https://alice:s3cr3t-token@example.com/hook');
INSERT INTO outbox.endpoints (name, url) VALUES ('creds', 'http://user@example.com:8080/x?y=1');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('tiny', 'http://127.0.0.1:9/', '0.4 ms');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('tiny', 'http://127.0.0.1:9/', '1 ms');
INSERT INTO outbox.endpoints (name, url, timeout) VALUES ('huge', 'http://127.0.0.1:9/', '178000000 years');
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('slow', 'http://127.0.0.1:9/', 1e-20);
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('slow', 'http://127.0.0.1:9/', 'infinity');
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('slow', 'http://127.0.0.1:9/', 'NaN');
INSERT INTO outbox.endpoints (name, url, rate_limit) VALUES ('slow', 'http://127.0.0.1:9/', 0.0001);
INSERT INTO outbox.endpoints (name, url, breaker_cooldown) VALUES ('cool', 'http://127.0.0.1:9/', '178000000 years');
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('blank', 'http://127.0.0.1:9/', '{"Authorization": " "}');
SELECT name, timeout, rate_limit FROM outbox.endpoints ORDER BY name;
-- ids are stable across renames (the key of the shared state)
SELECT id AS tiny_id FROM outbox.endpoints WHERE name = 'tiny' \gset
UPDATE outbox.endpoints SET name = 'tiny-renamed' WHERE name = 'tiny';
SELECT id = :tiny_id AS same_id FROM outbox.endpoints WHERE name = 'tiny-renamed';
DELETE FROM outbox.endpoints WHERE name IN ('tiny-renamed', 'slow');

-- ------------------------------------------------------------------
-- A rejected endpoint or message row is never quoted in the error: the
-- server log would get its signing_secret, headers or payload.  Required
-- values are reported by the row triggers before the NOT NULL constraint
-- (whose DETAIL is "Failing row contains (...)"); ranges are domain
-- constraints, whose errors name the rule only.
-- ------------------------------------------------------------------
INSERT INTO outbox.endpoints (name, url, signing_secret, headers)
VALUES ('leaky', NULL, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '{"Authorization": "Bearer s3cr3t"}');
INSERT INTO outbox.endpoints (name, url, signing_secret, max_in_flight)
VALUES ('leaky', 'http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 0);
INSERT INTO outbox.endpoints (name, url, signing_secret, breaker_cooldown)
VALUES ('leaky', 'http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', NULL);
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
VALUES ('order', '1', NULL, '{"card": "4111 1111 1111 1111"}');
SELECT count(*) AS leaky_rows FROM outbox.endpoints WHERE name = 'leaky';

-- The domains are the extension's and nobody else's to use.
SELECT t.typname, t.typacl IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM aclexplode(t.typacl) AS a WHERE a.grantee = 0) AS not_public
  FROM pg_type AS t
 WHERE t.typnamespace = 'outbox'::regnamespace AND t.typtype = 'd'
 ORDER BY 1;

-- ------------------------------------------------------------------
-- outbox_dispatcher.source becomes the ce-source header of every request.
-- ------------------------------------------------------------------
ALTER SYSTEM SET outbox_dispatcher.source = E'/ok\x01X-Injected: 1';
ALTER SYSTEM SET outbox_dispatcher.source = E'/ok\tthen';
ALTER SYSTEM RESET outbox_dispatcher.source;

-- ------------------------------------------------------------------
-- The extension needs a UTF8 database (JSON on the wire is UTF-8).
-- ------------------------------------------------------------------
CREATE DATABASE regress_sec_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
CREATE DATABASE regress_sec_eucjp ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
\c regress_sec_latin1
CREATE EXTENSION outbox_dispatcher;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'outbox_dispatcher';
\c regress_sec_eucjp
CREATE EXTENSION outbox_dispatcher;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'outbox_dispatcher';
\c contrib_regression
DROP DATABASE regress_sec_latin1;
DROP DATABASE regress_sec_eucjp;

TRUNCATE outbox.messages RESTART IDENTITY;
DROP ROLE regress_sec_producer, regress_sec_other;
