--
-- egress: endpoints.proxy, client_cert and client_key — checked, never
-- quoted in errors, readable by admins only (the certificate by monitors
-- too); outbox_dispatcher.denied_networks / allowed_networks / proxy /
-- no_proxy — checked when set (ALTER SYSTEM runs the checks and writes
-- nothing on error), the proxy hidden from non-superusers.
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url, proxy) VALUES
    ('proxied', 'http://127.0.0.1:9/hook', 'http://user:hunter2@proxy.internal:3128');
INSERT INTO outbox.endpoints (name, url, client_cert, client_key) VALUES
    ('mtls', 'https://127.0.0.1:9/hook',
     E'-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n',
     E'-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n');
SELECT name, proxy IS NOT NULL AS has_proxy, client_cert IS NOT NULL AS has_cert FROM outbox.endpoints ORDER BY name;

-- bad values: each refused without quoting it, nothing changed
CREATE TEMP TABLE before_bad AS SELECT * FROM outbox.endpoints;
UPDATE outbox.endpoints SET proxy = 'ftp://user:hunter2@proxy' WHERE name = 'proxied';
UPDATE outbox.endpoints SET proxy = 'proxy.internal:3128' WHERE name = 'proxied';
UPDATE outbox.endpoints SET proxy = E'http://proxy\r\nX-Evil: 1' WHERE name = 'proxied';
UPDATE outbox.endpoints SET proxy = 'http://' || repeat('a', 2100) WHERE name = 'proxied';
UPDATE outbox.endpoints SET client_key = NULL WHERE name = 'mtls';
UPDATE outbox.endpoints SET client_cert = 'not a certificate' WHERE name = 'mtls';
UPDATE outbox.endpoints SET client_key = E'-----BEGIN CERTIFICATE-----\nhunter2\n-----END CERTIFICATE-----' WHERE name = 'mtls';
INSERT INTO outbox.endpoints (name, url, client_cert) VALUES
    ('half', 'https://127.0.0.1:9/hook', E'-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n');
SELECT count(*) AS changed_rows
  FROM (SELECT * FROM outbox.endpoints EXCEPT SELECT * FROM before_bad) AS d;
SELECT count(*) AS endpoints FROM outbox.endpoints;

-- the settings: checked when set
ALTER SYSTEM SET outbox_dispatcher.denied_networks = '10.0.0.0/33';
ALTER SYSTEM SET outbox_dispatcher.denied_networks = 'example.com';
ALTER SYSTEM SET outbox_dispatcher.allowed_networks = '10.0.0.0/8, nonsense';
ALTER SYSTEM SET outbox_dispatcher.proxy = 'ftp://user:hunter2@proxy';
ALTER SYSTEM SET outbox_dispatcher.no_proxy = E'a\nb';
SHOW outbox_dispatcher.denied_networks;
SHOW outbox_dispatcher.allowed_networks;
SHOW outbox_dispatcher.no_proxy;

-- privileges: the proxy (credentials) and the key are the admins'; monitors see the certificate
CREATE ROLE regress_eg_monitor IN ROLE outbox_monitor;
CREATE ROLE regress_eg_producer IN ROLE outbox_producer;
SELECT r AS role,
       has_column_privilege(r, 'outbox.endpoints', 'proxy', 'SELECT') AS read_proxy,
       has_column_privilege(r, 'outbox.endpoints', 'client_cert', 'SELECT') AS read_cert,
       has_column_privilege(r, 'outbox.endpoints', 'client_key', 'SELECT') AS read_key
  FROM unnest(ARRAY['regress_eg_producer', 'regress_eg_monitor', 'outbox_admin', 'public']) AS r;
SET ROLE regress_eg_monitor;
SELECT name, client_cert IS NOT NULL AS has_cert FROM outbox.endpoints ORDER BY name;
SELECT proxy FROM outbox.endpoints;
-- a superuser-only setting: not shown to others
SELECT count(*) AS proxy_settings_visible FROM pg_settings WHERE name = 'outbox_dispatcher.proxy';
RESET ROLE;
DROP ROLE regress_eg_monitor, regress_eg_producer;
DELETE FROM outbox.endpoints;
