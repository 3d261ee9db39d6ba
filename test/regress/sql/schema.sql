--
-- schema: CREATE EXTENSION builds the whole public surface of docs/reference.md.
--
-- Runs first: every later test relies on the extension created here.
-- Only catalog queries are used (no \d output, which varies between psql
-- versions).
--

CREATE EXTENSION outbox_dispatcher;

-- The extension can be dropped and created again.  The second CREATE
-- meets the group roles that the first one created (roles are cluster-wide),
-- which must not be an error.
DROP EXTENSION outbox_dispatcher;
CREATE EXTENSION outbox_dispatcher;

-- The extension, its version and its fixed schema.
SELECT e.extname, e.extversion, e.extrelocatable, n.nspname AS schema
  FROM pg_extension AS e
  JOIN pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'outbox_dispatcher';

-- Every object that belongs to the extension (DROP EXTENSION removes these).
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox_dispatcher')
   AND deptype = 'e'
 ORDER BY 1;

-- The three NOLOGIN group roles exist, and none of them is privileged.
SELECT rolname, rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls
  FROM pg_roles
 WHERE rolname IN ('outbox_producer', 'outbox_monitor', 'outbox_admin')
 ORDER BY rolname;

-- Columns of the two tables, with types, nullability, defaults and identity.
SELECT table_name, ordinal_position AS pos, column_name, data_type,
       is_nullable, column_default, is_identity, identity_generation
  FROM information_schema.columns
 WHERE table_schema = 'outbox' AND table_name IN ('messages', 'endpoints')
 ORDER BY table_name, ordinal_position;

-- Constraints: primary keys, the foreign key to endpoints, the status and
-- lease checks.  NOT NULL is checked with the columns above (is_nullable);
-- PostgreSQL 18 also records it in pg_constraint (contype 'n').
SELECT conrelid::regclass AS "table", conname, contype, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE connamespace = 'outbox'::regnamespace AND contype <> 'n'
 ORDER BY 1, 2;

-- Indexes: the partial indexes that keep claim cost proportional to the
-- batch (ready rows, leased rows, open rows of an aggregate) and the ones
-- for purge and dead letters.
SELECT tablename, indexname, indexdef
  FROM pg_indexes
 WHERE schemaname = 'outbox'
 ORDER BY tablename, indexname;

-- Validation triggers on both tables (BEFORE ROW).
SELECT tgrelid::regclass AS "table", tgname, pg_get_triggerdef(oid) AS definition
  FROM pg_trigger
 WHERE tgrelid IN ('outbox.messages'::regclass, 'outbox.endpoints'::regclass)
   AND NOT tgisinternal
 ORDER BY 1, 2;

-- Functions of the public API: argument names and defaults (part of the
-- contract; internal helpers start with "_") ...
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments
  FROM pg_proc AS p
 WHERE p.pronamespace = 'outbox'::regnamespace AND p.proname !~ '^_'
 ORDER BY p.proname;

-- ... and results and attributes of all of them: only enqueue() is
-- SECURITY DEFINER, and it pins its search_path.
SELECT p.proname,
       pg_get_function_result(p.oid) AS result,
       p.prosecdef AS security_definer,
       p.provolatile AS volatility,
       p.proconfig AS config
  FROM pg_proc AS p
 WHERE p.pronamespace = 'outbox'::regnamespace
 ORDER BY p.proname;

-- Views and their columns.
SELECT c.relname AS view, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_class AS c
  JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind = 'v'
 ORDER BY c.relname, a.attnum;

-- pg_dump keeps the users' endpoints, messages and the id sequence
-- (extension-owned tables are otherwise not dumped).
SELECT cfg.relid::regclass AS config_table, cfg.condition
  FROM pg_extension AS e,
       unnest(e.extconfig, e.extcondition) AS cfg(relid, condition)
 WHERE e.extname = 'outbox_dispatcher'
 ORDER BY cfg.relid::regclass::text;

-- The GUCs are registered (the library is preloaded); boot values and
-- contexts as documented.  boot_val, not setting: the cluster's
-- postgresql.conf may override them.
SELECT name, vartype, context, unit, boot_val
  FROM pg_settings
 WHERE name LIKE 'outbox\_dispatcher.%'
 ORDER BY name;

-- Shared memory is attached (the lost-lease counter is readable).
SELECT outbox._lost_leases() IS NOT NULL AS shmem_attached;

-- outbox.claim() says what it is: not the workers' claim, outside their shared limits.
SELECT obj_description('outbox.claim(text,integer,interval,integer)'::regprocedure, 'pg_proc') AS claim_comment;
