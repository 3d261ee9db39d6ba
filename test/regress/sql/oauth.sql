--
-- oauth: endpoints.oauth_token_url, oauth_client_id, oauth_client_secret and
-- oauth_scope — set together (the scope optional), checked, never quoted in
-- errors (the token URL's credentials redacted), no Authorization header of
-- the endpoint's own next to them; the secret readable by admins only.
--
\set SHOW_CONTEXT never
TRUNCATE outbox.messages RESTART IDENTITY;
DELETE FROM outbox.subscriptions;
DELETE FROM outbox.endpoints;
INSERT INTO outbox.endpoints (name, url, oauth_token_url, oauth_client_id, oauth_client_secret, oauth_scope) VALUES
    ('oa', 'https://127.0.0.1:9/hook', 'https://auth.example/oauth/token', 'my client', 'hunter2&:x', 'orders.write audit');
INSERT INTO outbox.endpoints (name, url, oauth_token_url, oauth_client_id, oauth_client_secret) VALUES
    ('oa_noscope', 'https://127.0.0.1:9/hook', 'http://127.0.0.1:9/token', 'id', 'hunter2');
SELECT name, oauth_token_url, oauth_client_id, oauth_client_secret IS NOT NULL AS has_secret, oauth_scope
  FROM outbox.endpoints ORDER BY name;

-- bad values: each refused without quoting the id, secret or scope; nothing changed
CREATE TEMP TABLE before_bad AS SELECT * FROM outbox.endpoints;
UPDATE outbox.endpoints SET oauth_client_secret = NULL WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_token_url = NULL WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_token_url = NULL, oauth_client_id = NULL, oauth_client_secret = NULL WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_token_url = 'ftp://user:hunter2@auth.example/token' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_token_url = 'auth.example/token' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_client_id = '' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_client_secret = E'hunter2\r\nX-Evil: 1' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_client_secret = repeat('h', 1001) WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_scope = 'orders."write"' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_scope = 'commandes.payées' WHERE name = 'oa';
UPDATE outbox.endpoints SET oauth_scope = '   ' WHERE name = 'oa';
UPDATE outbox.endpoints SET headers = '{"Authorization": "Bearer hunter2"}' WHERE name = 'oa';
UPDATE outbox.endpoints SET headers = '{"authorization": "Basic aHVudGVyMg=="}' WHERE name = 'oa';
INSERT INTO outbox.endpoints (name, url, oauth_scope) VALUES ('half', 'https://127.0.0.1:9/hook', 'audit');
INSERT INTO outbox.endpoints (name, url, oauth_token_url, oauth_client_id) VALUES
    ('half', 'https://127.0.0.1:9/hook', 'https://auth.example/token', 'id');
SELECT count(*) AS changed_rows
  FROM (SELECT * FROM outbox.endpoints EXCEPT SELECT * FROM before_bad) AS d;
SELECT count(*) AS endpoints FROM outbox.endpoints;

-- without OAuth, an Authorization header of the endpoint's own is fine; turning OAuth off with it too
INSERT INTO outbox.endpoints (name, url, headers) VALUES ('plain', 'https://127.0.0.1:9/hook', '{"Authorization": "Bearer static"}');
UPDATE outbox.endpoints SET oauth_token_url = NULL, oauth_client_id = NULL, oauth_client_secret = NULL,
                            oauth_scope = NULL, headers = '{"Authorization": "Bearer static"}'
 WHERE name = 'oa_noscope';
SELECT name, headers FROM outbox.endpoints WHERE name IN ('plain', 'oa_noscope') ORDER BY name;

-- privileges: the secret is the admins'; monitors see the rest
CREATE ROLE regress_oa_monitor IN ROLE outbox_monitor;
CREATE ROLE regress_oa_producer IN ROLE outbox_producer;
SELECT r AS role,
       has_column_privilege(r, 'outbox.endpoints', 'oauth_token_url', 'SELECT') AS read_url,
       has_column_privilege(r, 'outbox.endpoints', 'oauth_client_id', 'SELECT') AS read_id,
       has_column_privilege(r, 'outbox.endpoints', 'oauth_scope', 'SELECT') AS read_scope,
       has_column_privilege(r, 'outbox.endpoints', 'oauth_client_secret', 'SELECT') AS read_secret
  FROM unnest(ARRAY['regress_oa_producer', 'regress_oa_monitor', 'outbox_admin', 'public']) AS r;
SET ROLE regress_oa_monitor;
SELECT name, oauth_token_url, oauth_client_id, oauth_scope FROM outbox.endpoints WHERE name = 'oa';
SELECT oauth_client_secret FROM outbox.endpoints;
RESET ROLE;
DROP ROLE regress_oa_monitor, regress_oa_producer;
DELETE FROM outbox.endpoints;
