/*
 * transitions.cpp — the message state machine, implemented once.
 *
 * Every state change of outbox.messages goes through this file, whether it
 * comes from a SQL function (sql_api.cpp) or from a background worker
 * (worker.cpp): same statements, same fencing, same counters.
 *
 * Statements are prepared once per backend with SPI_prepare and kept with
 * SPI_keepplan; the plan cache revalidates them after DDL.  All times are
 * computed by the database (now()), never by the caller's clock.
 *
 * Claim (od_claim), one short transaction.  Only when a lease can have
 * expired (od_lease_check_due; always for the SQL function) does it reap
 * and take over expired leases, and then read the earliest deadline left
 * to set the next check; otherwise it runs the ready arm alone:
 *   1. reap: processing rows whose lease expired with attempts already at
 *      max_attempts become dead (the message crashed its worker, or outlived
 *      its lease, on its last allowed attempt).  At most `batch` rows, with
 *      SKIP LOCKED, walking messages_leased from the oldest deadline.
 *   2. claim: expired leases with attempts left first (oldest deadline
 *      first), then ready rows endpoint by endpoint: for each endpoint of
 *      the quota arrays ($5 names, $6 counts, in the order given; NULL =
 *      every enabled endpoint, up to batch each; a count of 0 still lets
 *      the endpoint's expired leases be taken over, -1 does not: its breaker
 *      is open) up to its count of pending
 *      rows with available_at <= now() (and, for ordered rows, no unfinished
 *      earlier message of the same sequence: see SQL_CLAIM), oldest
 *      available_at first.
 *      Disabled endpoints are skipped.  Every arm is an index scan that
 *      stops after its limit, so the cost is proportional to the batch:
 *      retained done/dead rows are in no partial index, rows scheduled for
 *      later sit beyond now(), and an endpoint that is paused, has its
 *      breaker open or is at its limits gets no quota and is not scanned.
 *      The workers compute the quotas (breaker, cluster-wide max_in_flight,
 *      rate limit; endpoint_state.cpp) and rotate the order for fairness.
 *      Each endpoint's arm reads from (available_at, id) >= its floor ($8
 *      and $9; the workers' per-endpoint floor, core/ready_floor.hpp;
 *      -infinity for the SQL function): the entries of the rows claimed
 *      since the last VACUUM, which no longer match but stay in
 *      messages_ready, are not stepped over again by every claim.
 *      Without a lease check and with one endpoint alone having a quota
 *      (the common case), a lean statement with the same meaning claims
 *      its ready rows (SQL_CLAIM_ONE).
 *      Claimed rows get status processing, the owner, lease_until =
 *      now() + lease, lease_version + 1 and attempts + 1.
 *
 *   Rows are claimed in available_at order, not id order: that is the order
 *   an index can serve without walking the backlog, and the only order users
 *   rely on — per aggregate — is enforced by the head check, not by the
 *   claim order.
 *
 * Finalize (od_finalize): one UPDATE for any number of results, each fenced
 * on (id, status = 'processing', lease_version) and, for the workers, on
 * the claim's lease deadline too.  (id, lease_version) alone repeats over
 * time: after DROP EXTENSION ... CASCADE and CREATE EXTENSION, after a
 * restore into a served database, or after TRUNCATE ... RESTART IDENTITY,
 * a new message 1 claimed once has lease_version 1 again, and a result still
 * held for the old message 1 would land on it.  lease_until is now() of the
 * claim transaction plus the lease: a later claim of any row, in any
 * incarnation of the table, has a later deadline unless the clock steps
 * back to the microsecond — so (id, lease_version, lease_until) names one
 * claim.  The SQL API (mark_done and friends) fences on (id, lease_version),
 * as documented.  The status test is written
 * "(status = 'processing') IS TRUE" (same meaning: status is NOT NULL) so
 * that the planner cannot match it to messages_leased and walk that whole
 * index (and its not-yet-vacuumed entries).  The rows are read by
 * "m.id = ANY ($1)", an index condition on the primary key (one probe per
 * result, whatever the statistics say), and joined to the results by a hash
 * join (see "Plans" below).  A result whose row was not
 * updated lost its lease to a newer claim (or to the reaper): it is counted
 * in shared memory and logged; the newer owner's state stands.  The
 * RETURNING list also says which rows were ordered messages that became
 * done: their successors may lie below the workers' floors.
 */
#include "catalog.h"
#include "transitions.h"
#include "guard.h"
#include "module.h"
#include "outbox_dispatcher.h"
#include "core/lease_check.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
}

/* ---------------------------------------------------------------- plans */

StaticAssertDecl(od::kReadFromFirst == DT_NOBEGIN, "a position of kReadFromFirst must be -infinity to SQL");
StaticAssertDecl(od::kFirstKey.id == PG_INT64_MIN, "the first key's id must be the least bigint");

static SPIPlanPtr plan_reap[2] = { nullptr, nullptr };
static SPIPlanPtr plan_claim[2][2] = { { nullptr, nullptr }, { nullptr, nullptr } };
static SPIPlanPtr plan_next_deadline = nullptr;
static SPIPlanPtr plan_finalize[2] = { nullptr, nullptr };
static SPIPlanPtr plan_finalize_done = nullptr;
static SPIPlanPtr plan_recover = nullptr;
static SPIPlanPtr plan_replay_window = nullptr;
static SPIPlanPtr plan_retry = nullptr;
static SPIPlanPtr plan_retry_dead = nullptr;
static SPIPlanPtr plan_skip = nullptr;
static SPIPlanPtr plan_purge = nullptr;
static SPIPlanPtr plan_replay = nullptr;
static SPIPlanPtr plan_move = nullptr;
static SPIPlanPtr plan_enqueue = nullptr;

/*
 * Expired leases.  Since 0.2.2 the schema indexes leases as messages_leased
 * (lease_until) WHERE lease_until IS NOT NULL (the same rows as status =
 * 'processing', by messages_lease_check) and these statements name no
 * status: then messages_leased is the only index whose predicate they
 * imply, and no statistics can make the planner walk messages_open
 * (status <> 'done', implied by status = 'processing') and sort.
 */
#define EXPIRED "lease_until < now()"

/*
 * A message's attempt limit.  Before 0.3.0 the GUC's ($n); from 0.3.0 its
 * endpoint's max_attempts, else one more than the length of its
 * retry_schedule, else the GUC's.  One probe of endpoints_pkey per row
 * examined, which only the expired-lease paths do.
 */
#define MAX_ATTEMPTS_030(alias, dflt) \
    "coalesce((SELECT coalesce(e.max_attempts, pg_catalog.array_length(e.retry_schedule, 1) + 1)" \
    "            FROM outbox.endpoints AS e WHERE e.name = " alias ".endpoint), " dflt ")"

#define SQL_REAP_TEXT(expired, dead_at, max_x, max_m) \
    "WITH expired AS (" \
    "  SELECT x.id FROM outbox.messages AS x" \
    "   WHERE x." expired " AND x.attempts >= " max_x \
    "   ORDER BY x.lease_until LIMIT $2" \
    "     FOR UPDATE SKIP LOCKED) " \
    "UPDATE outbox.messages AS m" \
    "   SET status = 'dead', lease_owner = NULL, lease_until = NULL," dead_at \
    "       last_error = 'lease expired on attempt ' || m.attempts::text || ' of ' || (" max_m ")::text" \
    "                    || ' (worker crashed or the request outlived its lease)'" \
    " WHERE m.id = ANY (ARRAY(SELECT id FROM expired))"

/* [0] before 0.3.0, [1] with messages.dead_at and per-endpoint attempt limits (od_schema_has_fanout) */
static const char *const SQL_REAP[2] = {
    SQL_REAP_TEXT(EXPIRED, "", "$1", "$1"),
    SQL_REAP_TEXT(EXPIRED, " dead_at = now(),", MAX_ATTEMPTS_030("x", "$1"), MAX_ATTEMPTS_030("m", "$1"))
};

/* the earliest lease deadline: when the next expired-lease check is due */
static const char *const SQL_NEXT_DEADLINE =
    "SELECT lease_until FROM outbox.messages WHERE lease_until IS NOT NULL ORDER BY lease_until LIMIT 1";

#define SQL_CLAIM_QUOTA \
    "WITH quota AS (" \
    "  SELECT q.endpoint, q.n, q.takeover, q.from_at, q.from_id, q.ord" \
    "    FROM unnest($5::text[], $6::int[], $7::bool[], $8::timestamptz[], $9::bigint[])" \
    "         WITH ORDINALITY AS q(endpoint, n, takeover, from_at, from_id, ord)" \
    "   WHERE q.n >= 0" \
    "     AND EXISTS (SELECT 1 FROM outbox.endpoints AS e WHERE e.name = q.endpoint AND e.enabled)" \
    "  UNION ALL" \
    "  SELECT e.name, $2, true, '-infinity'::timestamptz, '-9223372036854775808'::bigint, 0" \
    "    FROM outbox.endpoints AS e WHERE $5 IS NULL AND e.enabled), "

#define SQL_CLAIM_EXPIRED_ARM(expired, max_m) \
    "  SELECT id FROM (SELECT m.id FROM outbox.messages AS m" \
    "    WHERE m." expired " AND m.attempts < " max_m \
    "      AND m.endpoint IN (SELECT endpoint FROM quota WHERE takeover)" \
    "    ORDER BY m.lease_until LIMIT $2" \
    "      FOR UPDATE OF m SKIP LOCKED) AS expired" \
    "  UNION ALL"

/*
 * An ordered message waits for every earlier message of its sequence (see
 * SQL_CLAIM below).  From 0.3.0 it also waits, whatever the producers
 * lock, for every transaction that could still commit an earlier one: the
 * insert trigger gives each message its id only after its transaction has
 * an xid, and records in ordered_after the next xid as of then, so every
 * transaction holding a lower id has an xid below it.  Once the snapshot's
 * xmin has reached it they have all ended, and their messages are visible
 * to the NOT EXISTS.  A value beyond the snapshot's xmax never came from this
 * cluster's xid counter (a dump restored elsewhere): not waited for.
 */
#define ORDERED_AFTER_OLDER_TRANSACTIONS \
    " AND (m.ordered_after IS NULL OR m.ordered_after <= pg_snapshot_xmin(pg_current_snapshot())" \
    "      OR m.ordered_after > pg_snapshot_xmax(pg_current_snapshot()))"

#define SQL_CLAIM_READY_ARM(commit_order, same_sequence) \
    "  SELECT r.id FROM (SELECT endpoint, n, from_at, from_id FROM quota WHERE n > 0 ORDER BY ord, endpoint) AS q" \
    "   CROSS JOIN LATERAL (" \
    "    SELECT m.id FROM outbox.messages AS m" \
    "     WHERE m.endpoint = q.endpoint AND m.status = 'pending'" \
    "       AND (m.available_at, m.id) >= (q.from_at, q.from_id) AND m.available_at <= now()" \
    "       AND (NOT m.ordered OR (NOT EXISTS (" \
    "             SELECT 1 FROM outbox.messages AS p" \
    "              WHERE p.aggregate_type = m.aggregate_type AND p.aggregate_id = m.aggregate_id" \
    "                AND " same_sequence "p.id < m.id AND p.status <> 'done')" commit_order "))" \
    "     ORDER BY m.available_at, m.id LIMIT q.n" \
    "       FOR UPDATE OF m SKIP LOCKED) AS r" \
    "  LIMIT $2) "

#define SQL_CLAIM_UPDATE \
    "UPDATE outbox.messages AS o" \
    "   SET status = 'processing', lease_owner = $1, lease_until = now() + $3," \
    "       lease_version = o.lease_version + 1, attempts = o.attempts + 1" \
    " WHERE o.id = ANY (ARRAY(SELECT id FROM picked)) " \
    "RETURNING o.id, o.lease_version, o.attempts, o.endpoint, o.aggregate_type, o.aggregate_id," \
    "          o.event_type, o.payload, o.headers, o.ordered, o.created_at, o.lease_until, o.available_at"

/*
 * [commit order][check]: [1][*] for schemas with messages.ordered_after
 * (0.3.0), [0][*] before; [*][0] with the expired-lease arm, [*][1] ready
 * rows only, for when no lease can have expired yet ($4 and $7 unused:
 * declared parameters need not be referenced).
 */
#define SQL_CLAIM_VARIANTS(order, same_sequence, max_m) \
    { \
        SQL_CLAIM_QUOTA "picked AS (" SQL_CLAIM_EXPIRED_ARM(EXPIRED, max_m) SQL_CLAIM_READY_ARM(order, same_sequence) \
            SQL_CLAIM_UPDATE, \
            SQL_CLAIM_QUOTA "picked AS (" SQL_CLAIM_READY_ARM(order, same_sequence) SQL_CLAIM_UPDATE \
    }
/*
 * From 0.3.0 the sequence of an ordered message is the ordered messages of
 * its aggregate for its endpoint: the deliveries of one published event to
 * several endpoints never wait for each other, a dead subscriber blocks
 * only its own deliveries, and unordered messages are in no sequence, so
 * none of them is ever waited for (messages_open is (aggregate_type,
 * aggregate_id, endpoint, id) WHERE ordered AND status <> 'done' there: an
 * unordered message costs no entry in it, at insert, claim or finalize).
 * Before 0.3.0 every earlier message of the aggregate counts.
 */
static const char *const SQL_CLAIM[2][2] = {
    SQL_CLAIM_VARIANTS("", "", "$4"),
    SQL_CLAIM_VARIANTS(ORDERED_AFTER_OLDER_TRANSACTIONS, "p.endpoint = m.endpoint AND p.ordered AND ",
                       MAX_ATTEMPTS_030("m", "$4"))
};

/*
 * The common case of a claim without a lease check: one endpoint has a
 * quota (one endpoint configured, or the others have no room).  The quota
 * CTE, the lateral join and the expired-lease arm then only add plan nodes
 * (ExecutorStart alone was a third of an idle claim), so this statement
 * claims that endpoint's ready rows directly: $5 the endpoint, $6 its quota
 * (> 0), $7 and $8 its floor.  It selects the same rows as SQL_CLAIM's
 * ready arm would for that endpoint: pending, available, head of its
 * sequence, the endpoint enabled, at most least(batch, quota), oldest
 * available_at first, locked with SKIP LOCKED, and updates them with the
 * same SQL_CLAIM_UPDATE.
 * callgrind, 230 idle single-message claims: 443k -> 344k instructions per
 * claim.  [commit order] as in SQL_CLAIM.
 */
#define SQL_CLAIM_ONE_TEXT(commit_order, same_sequence) \
    "WITH picked AS (" \
    "  SELECT m.id FROM outbox.messages AS m" \
    "   WHERE m.endpoint = $5 AND m.status = 'pending' AND (m.available_at, m.id) >= ($7, $8)" \
    "     AND m.available_at <= now()" \
    "     AND (NOT m.ordered OR (NOT EXISTS (" \
    "           SELECT 1 FROM outbox.messages AS p" \
    "            WHERE p.aggregate_type = m.aggregate_type AND p.aggregate_id = m.aggregate_id" \
    "              AND " same_sequence "p.id < m.id AND p.status <> 'done')" commit_order "))" \
    "     AND EXISTS (SELECT 1 FROM outbox.endpoints AS e WHERE e.name = $5 AND e.enabled)" \
    "   ORDER BY m.available_at, m.id LIMIT least($2, $6)" \
    "     FOR UPDATE OF m SKIP LOCKED) " \
    SQL_CLAIM_UPDATE
static const char *const SQL_CLAIM_ONE[2] = {
    SQL_CLAIM_ONE_TEXT("", ""),
    SQL_CLAIM_ONE_TEXT(ORDERED_AFTER_OLDER_TRANSACTIONS, "p.endpoint = m.endpoint AND p.ordered AND ")
};
static SPIPlanPtr plan_claim_one[2] = { nullptr, nullptr };

/*
 * The finalize's results arrive as parallel arrays, unnested in a select
 * list (a ProjectSet: one element of each per row) rather than as
 * unnest(a, b, ...) in FROM, which is ROWS FROM (unnest(a), unnest(b), ...):
 * a function scan that first copies each array into a tuplestore of its
 * own and then reads the rows back from all of them.  The rows are the
 * same (arrays of one length); the finalize costs 5 % fewer instructions
 * (test/bench/worker_instructions.sh, TOGGLE='od_finalize*').  The
 * attempt log's insert (attempt_log.cpp) is written the same way.
 */
#define SQL_FINALIZE_TEXT(dead_at) \
    "UPDATE outbox.messages AS m" \
    "   SET status = CASE r.status" \
    "                  WHEN 'retry' THEN 'pending'" \
    "                  WHEN 'defer' THEN CASE WHEN m.created_at < now() - $8 THEN 'dead' ELSE 'pending' END" \
    "                  ELSE r.status END," \
    "       done_at = CASE WHEN r.status = 'done' THEN now() END," dead_at \
    "       available_at = CASE WHEN r.status IN ('retry', 'defer') THEN now() + r.delay ELSE m.available_at END," \
    "       attempts = CASE WHEN r.refund THEN greatest(m.attempts - 1, 0) ELSE m.attempts END," \
    "       last_error = CASE WHEN r.status = 'defer' AND m.created_at < now() - $8" \
    "                         THEN 'deferred for longer than outbox_dispatcher.max_defer_age; last: ' || r.error" \
    "                         ELSE r.error END," \
    "       last_http_status = r.http_status," \
    "       lease_owner = NULL, lease_until = NULL" \
    "  FROM (SELECT unnest($1::bigint[]) AS id, unnest($2::bigint[]) AS ver, unnest($3::text[]) AS status," \
    "               unnest($4::interval[]) AS delay, unnest($5::text[]) AS error, unnest($6::int[]) AS http_status," \
    "               unnest($7::bool[]) AS refund, unnest($9::timestamptz[]) AS lease_until) AS r" \
    " WHERE m.id = r.id AND m.lease_version = r.ver AND (m.status = 'processing') IS TRUE" \
    "   AND (r.lease_until IS NULL OR m.lease_until = r.lease_until) AND m.id = ANY ($1::bigint[]) " \
    "RETURNING m.id, m.ordered AND m.status = 'done'"

/*
 * The same when every result is done (the usual batch): no status, delay
 * or refund per result, no CASE per row — 2 % of a worker's instructions
 * for a drain (test/bench/worker_instructions.sh).  The same columns end
 * the same as in SQL_FINALIZE; dead_at and attempts are not touched by a
 * done result in either.
 */
static const char *const SQL_FINALIZE_DONE =
    "UPDATE outbox.messages AS m"
    "   SET status = 'done', done_at = now(), last_error = r.error, last_http_status = r.http_status,"
    "       lease_owner = NULL, lease_until = NULL"
    "  FROM (SELECT unnest($1::bigint[]) AS id, unnest($2::bigint[]) AS ver, unnest($3::text[]) AS error,"
    "               unnest($4::int[]) AS http_status, unnest($5::timestamptz[]) AS lease_until) AS r"
    " WHERE m.id = r.id AND m.lease_version = r.ver AND (m.status = 'processing') IS TRUE"
    "   AND (r.lease_until IS NULL OR m.lease_until = r.lease_until) AND m.id = ANY ($1::bigint[]) "
    "RETURNING m.id, m.ordered";

/*
 * [0] before 0.3.0, [1] with messages.dead_at: when the row last became
 * dead (what recover() selects by; kept when it is retried).
 */
static const char *const SQL_FINALIZE[2] = {
    SQL_FINALIZE_TEXT(""),
    SQL_FINALIZE_TEXT("       dead_at = CASE WHEN r.status = 'dead' OR (r.status = 'defer'"
                      " AND m.created_at < now() - $8) THEN now() ELSE m.dead_at END,")
};

static const char *const SQL_RETRY = "UPDATE outbox.messages"
                                     "   SET status = 'pending', attempts = 0, available_at = now(),"
                                     "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
                                     " WHERE id = $1 AND status = 'dead'";

static const char *const SQL_RETRY_DEAD =
    "UPDATE outbox.messages"
    "   SET status = 'pending', attempts = 0, available_at = now(),"
    "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
    " WHERE status = 'dead' AND ($1::text IS NULL OR endpoint = $1)"
    "   AND ($2::text IS NULL OR event_type = $2)";

static const char *const SQL_SKIP = "UPDATE outbox.messages"
                                    "   SET status = 'done', done_at = now(), last_error = 'skipped: ' || $2,"
                                    "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
                                    " WHERE id = $1 AND status <> 'done'";

static const char *const SQL_PURGE = "WITH old AS ("
                                     "  SELECT id FROM outbox.messages"
                                     "   WHERE status = 'done' AND done_at < now() - $1"
                                     "   ORDER BY done_at LIMIT $2"
                                     "     FOR UPDATE SKIP LOCKED) "
                                     "DELETE FROM outbox.messages AS m WHERE m.id = ANY (ARRAY(SELECT id FROM old))";

static const char *const SQL_REPLAY =
    "UPDATE outbox.messages"
    "   SET status = 'pending', attempts = 0, available_at = now(), done_at = NULL,"
    "       last_error = 'replayed by an operator', last_http_status = NULL,"
    "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
    " WHERE status = 'done' AND id BETWEEN $1 AND $2 AND ($3::text IS NULL OR endpoint = $3)";

/* recover(): dead messages of an endpoint that died in [since, until) (0.3.0) */
static const char *const SQL_RECOVER =
    "UPDATE outbox.messages"
    "   SET status = 'pending', attempts = 0, available_at = now(),"
    "       last_error = 'recovered by an operator; last: ' || coalesce(last_error, '(none)'),"
    "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
    " WHERE status = 'dead' AND endpoint = $1 AND dead_at >= $2 AND dead_at < $3";

/* replay_window(): done messages of an endpoint delivered in [since, until) */
static const char *const SQL_REPLAY_WINDOW =
    "UPDATE outbox.messages"
    "   SET status = 'pending', attempts = 0, available_at = now(), done_at = NULL,"
    "       last_error = 'replayed by an operator', last_http_status = NULL,"
    "       lease_version = lease_version + 1, lease_owner = NULL, lease_until = NULL"
    " WHERE status = 'done' AND endpoint = $1 AND done_at >= $2 AND done_at < $3";

static const char *const SQL_MOVE = "UPDATE outbox.messages"
                                    "   SET endpoint = $2, lease_version = lease_version + 1"
                                    " WHERE endpoint = $1 AND status = ANY ($3::text[])";

static const char *const SQL_ENQUEUE =
    "INSERT INTO outbox.messages"
    "   (aggregate_type, aggregate_id, event_type, payload, endpoint, ordered, available_at, headers)"
    " VALUES ($1, $2, $3, $4, $5, $6, coalesce($7, now()), $8) RETURNING id";

/*
 * Plans.  Every statement here is written as index probes whose cost is
 * proportional to the batch: the claim's arms read partial indexes in key
 * order up to their limits, the reap and the next-deadline probe read
 * messages_leased from its lowest deadline, the finalize probes the primary
 * key once per result.  Statistics cannot be trusted to agree: ANALYZE
 * taken while nothing is open says the open set is empty, a plan made on an
 * empty table thinks a scan of it is free, and a generic plan estimates
 * LIMIT $n as a tenth of the table.
 *
 * In the workers' sessions (od_fix_plan_shapes) the plan shapes these
 * statements never want are disabled: sequential and bitmap scans, hash
 * and merge joins, sorts (and JIT, which those penalties would trigger).
 * The planner is left with the index paths whatever the statistics say, so
 * every statement is planned once, on whatever the table holds then, and
 * kept (a generic plan: no planning per claim).  The finalize is the one
 * join: planned on a table the statistics say is empty, a nested loop
 * reading messages as its outer side by a whole walk of the primary key
 * (one row, the planner thinks) cost less than probing it once per result,
 * and that plan then walked every retained row on every finalize (65 % of
 * the workers' CPU under a sustained load).  So the finalize reads
 * messages only by "m.id = ANY ($1)" (probes, the only index path it has)
 * and is planned with nested loops off and hash joins on: the results and
 * the rows read are joined by hashing either side, linear in the batch.
 * (Reading them by the ctids the claims returned, a TID scan, costs 2 % fewer
 * instructions but more WAL: an index fetch prunes the page it visits, a TID
 * scan does not, and without that room more updates moved the row to
 * another page, +130 B of WAL per message; CHANGELOG 0.3.0, "Tried and
 * dropped".)
 * In other sessions (the SQL functions) the caller's settings stand, so
 * the statements whose best plan depends on the batch and the table (claim,
 * reap, purge: ORDER BY ... LIMIT $n) and the finalize are planned with
 * their actual parameters every time (custom plans): a generic plan cached while the queue was empty
 * once took 13.7 s per claim once the table had grown.
 */
static bool plan_shapes_fixed = false;

void
od_fix_plan_shapes(void)
{
    static const char *const off[] = { "enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin",
                                       "enable_sort" };

    for (const char *name : off)
        SetConfigOption(name, "off", PGC_USERSET, PGC_S_OVERRIDE);
    /*
     * And no JIT: these statements run in a millisecond, and before
     * PostgreSQL 18 a disabled plan shape adds its penalty to the cost,
     * which would put even a one-row scan of outbox.endpoints above
     * jit_above_cost (tens of milliseconds of compilation per statement).
     */
    SetConfigOption("jit", "off", PGC_USERSET, PGC_S_OVERRIDE);
    plan_shapes_fixed = true;
}

/*
 * Other shapes for one statement of a worker: the settings are set as a
 * function's SET clause sets them (PGC_S_SESSION, GUC_ACTION_SAVE; the
 * session's own values, PGC_S_OVERRIDE, which would change them for good,
 * come back at od_plan_shapes_pop or at the transaction's abort).  Outside
 * the workers (the caller's settings stand) it does nothing and returns 0.
 */
int
od_plan_shapes_push(const OdPlanShape *shapes, int n)
{
    int nest;

    if (!plan_shapes_fixed)
        return 0;
    nest = NewGUCNestLevel();
    for (int i = 0; i < n; i++)
        (void) set_config_option(shapes[i].name, shapes[i].value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                                 false);
    return nest;
}

void
od_plan_shapes_pop(int nest)
{
    if (nest > 0)
        AtEOXact_GUC(true, nest);
}

static SPIPlanPtr
od_prepare_opts(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes, int cursor_options)
{
    if (*slot == nullptr)
    {
        SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, const_cast<Oid *>(argtypes), cursor_options);

        if (plan == nullptr)
            elog(ERROR, "outbox_dispatcher: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0)
            elog(ERROR, "outbox_dispatcher: SPI_keepplan failed");
        *slot = plan;
    }
    return *slot;
}

/* operator transitions: one row or a few, by key; the plan cache decides */
SPIPlanPtr
od_prepare(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes)
{
    return od_prepare_opts(slot, sql, nargs, argtypes, 0);
}

/* the hot path: generic plans where the shapes are fixed, custom plans elsewhere */
static SPIPlanPtr
od_prepare_hot(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes)
{
    return od_prepare_opts(slot, sql, nargs, argtypes,
                           plan_shapes_fixed ? CURSOR_OPT_GENERIC_PLAN : CURSOR_OPT_CUSTOM_PLAN);
}

/* ---------------------------------------------------------------- claim */

ArrayType *
od_build_array(Datum *elems, bool *nulls, int n, Oid elemtype)
{
    int16 typlen;
    bool  typbyval;
    char  typalign;
    int   dims[1] = { n };
    int   lbs[1] = { 1 };

    get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
    return construct_md_array(elems, nulls, 1, dims, lbs, elemtype, typlen, typbyval, typalign);
}

/* ---------------------------------------------------------------- lease checks */

bool
od_lease_check_due(TimestampTz now)
{
    if (od_shared == nullptr)
        return true;
    return now >= (TimestampTz) pg_atomic_read_u64(&od_shared->lease_check_at);
}

/* a claim set leases ending at `deadline`: check no later than that */
static void
note_lease_deadline(TimestampTz deadline)
{
    uint64 cur;

    if (od_shared == nullptr || deadline < 0)
        return;
    cur = pg_atomic_read_u64(&od_shared->lease_check_at);
    while ((uint64) od::lower_lease_check((int64) cur, deadline) != cur)
        if (pg_atomic_compare_exchange_u64(&od_shared->lease_check_at, &cur, (uint64) deadline))
            break;
}

uint64
od_claim(const char *owner, int batch, int64 lease_us, int max_attempts, const char *const *endpoints,
         const int *quotas, const bool *takeover, const od::ReadyKey *from, int n_endpoints, int flags)
{
    static const Oid reap_types[2] = { INT4OID, INT4OID };
    static const Oid claim_types[9] = { TEXTOID,      INT4OID,      INTERVALOID,  INT4OID,
                                         TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID, TIMESTAMPTZARRAYOID,
                                         INT8ARRAYOID };
    static const Oid one_types[8] = { TEXTOID, INT4OID, INTERVALOID,    INT4OID,
                                      TEXTOID, INT4OID, TIMESTAMPTZOID, INT8OID };
    const bool     check = (flags & OD_CLAIM_CHECK_LEASES) != 0;
    const int      which = check ? 0 : 1;
    const int      order = (flags & OD_CLAIM_COMMIT_ORDER) != 0 ? 1 : 0;
    Datum          args[9];
    char           nulls[9] = { ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ' };
    uint64         reaped = 0;
    int            rc;
    SPITupleTable *claimed;
    uint64         nclaimed;
    TimestampTz    earliest = -1;
    int            one = -1; /* the only endpoint with a quota, -2 several */

    if (check)
    {
        od_prepare_hot(&plan_reap[order], SQL_REAP[order], 2, reap_types);
        args[0] = Int32GetDatum(max_attempts);
        args[1] = Int32GetDatum(batch);
        rc = SPI_execute_plan(plan_reap[order], args, nullptr, false, 0);
        if (rc != SPI_OK_UPDATE)
            elog(ERROR, "outbox_dispatcher: reap failed: %s", SPI_result_code_string(rc));
        reaped = SPI_processed;
    }
    /* without a lease check, one endpoint with a quota: the lean statement (SQL_CLAIM_ONE) */
    for (int k = 0; !check && k < n_endpoints && one != -2; k++)
        if (quotas[k] > 0)
            one = one == -1 ? k : -2;
    if (one >= 0)
        od_prepare_hot(&plan_claim_one[order], SQL_CLAIM_ONE[order], 8, one_types);
    else
        od_prepare_hot(&plan_claim[order][which], SQL_CLAIM[order][which], 9, claim_types);

    args[0] = CStringGetTextDatum(owner);
    args[1] = Int32GetDatum(batch);
    args[2] = od_us_to_interval(lease_us);
    args[3] = Int32GetDatum(max_attempts);
    if (n_endpoints < 0)
    {
        /* every enabled endpoint, up to batch each (the SQL function) */
        nulls[4] = nulls[5] = nulls[6] = nulls[7] = nulls[8] = 'n';
        args[4] = args[5] = args[6] = args[7] = args[8] = (Datum) 0;
    }
    else if (one >= 0)
    {
        const od::ReadyKey f = from ? from[one] : od::kFirstKey;

        args[4] = CStringGetTextDatum(endpoints[one]);
        args[5] = Int32GetDatum(quotas[one]);
        args[6] = TimestampTzGetDatum(f.at_us);
        args[7] = Int64GetDatum(f.id);
    }
    else
    {
        Datum *names = (Datum *) palloc(sizeof(Datum) * (n_endpoints + 1));
        Datum *ns = (Datum *) palloc(sizeof(Datum) * (n_endpoints + 1));
        Datum *tk = (Datum *) palloc(sizeof(Datum) * (n_endpoints + 1));
        Datum *fa = (Datum *) palloc(sizeof(Datum) * (n_endpoints + 1));
        Datum *fi = (Datum *) palloc(sizeof(Datum) * (n_endpoints + 1));

        for (int i = 0; i < n_endpoints; i++)
        {
            const od::ReadyKey f = from ? from[i] : od::kFirstKey;

            names[i] = CStringGetTextDatum(endpoints[i]);
            ns[i] = Int32GetDatum(quotas[i]);
            tk[i] = BoolGetDatum(takeover == nullptr || takeover[i]);
            fa[i] = TimestampTzGetDatum(f.at_us);
            fi[i] = Int64GetDatum(f.id);
        }
        args[4] = PointerGetDatum(od_build_array(names, nullptr, n_endpoints, TEXTOID));
        args[5] = PointerGetDatum(od_build_array(ns, nullptr, n_endpoints, INT4OID));
        args[6] = PointerGetDatum(od_build_array(tk, nullptr, n_endpoints, BOOLOID));
        args[7] = PointerGetDatum(od_build_array(fa, nullptr, n_endpoints, TIMESTAMPTZOID));
        args[8] = PointerGetDatum(od_build_array(fi, nullptr, n_endpoints, INT8OID));
    }
    rc = SPI_execute_plan(one >= 0 ? plan_claim_one[order] : plan_claim[order][which], args, nulls, false, 0);
    if (rc != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "outbox_dispatcher: claim failed: %s", SPI_result_code_string(rc));
    claimed = SPI_tuptable;
    nclaimed = SPI_processed;

    /* the leases just set: the next check is due at their deadline at the latest */
    for (uint64 i = 0; i < nclaimed; i++)
    {
        bool        isnull;
        TimestampTz until =
            DatumGetTimestampTz(SPI_getbinval(claimed->vals[i], claimed->tupdesc, OD_CLAIM_NATTS + 1, &isnull));

        if (!isnull && (earliest < 0 || until < earliest))
            earliest = until;
    }
    if (earliest >= 0)
        note_lease_deadline(earliest);

    if (check && od_shared != nullptr)
    {
        /* when can the next lease expire?  (one probe of messages_leased) */
        TimestampTz now = GetCurrentTimestamp();
        bool        has = false;
        TimestampTz first = 0;

        od_prepare_hot(&plan_next_deadline, SQL_NEXT_DEADLINE, 0, nullptr);
        rc = SPI_execute_plan(plan_next_deadline, nullptr, nullptr, true, 1);
        if (rc != SPI_OK_SELECT)
            elog(ERROR, "outbox_dispatcher: reading the next lease deadline failed: %s", SPI_result_code_string(rc));
        if (SPI_processed == 1)
        {
            bool isnull;

            first = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
            has = !isnull;
        }
        SPI_freetuptable(SPI_tuptable);
        pg_atomic_write_u64(&od_shared->lease_check_at,
                            (uint64) od::next_lease_check(now, has, first, reaped >= (uint64) batch));
        /* the claimed rows stay the result, as documented */
        SPI_tuptable = claimed;
        SPI_processed = nclaimed;
    }
    return reaped;
}

/* ---------------------------------------------------------------- finalize */

static int
cmp_int64(const void *a, const void *b)
{
    int64 x = *(const int64 *) a;
    int64 y = *(const int64 *) b;

    return (x > y) - (x < y);
}

int
od_finalize(OdFinalize *items, int n, int flags)
{
    const int        v = (flags & OD_FINALIZE_DEAD_AT) != 0 ? 1 : 0;
    static const Oid types[9] = { INT8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID, INTERVALARRAYOID,   TEXTARRAYOID,
                                  INT4ARRAYOID, BOOLARRAYOID, INTERVALOID,  TIMESTAMPTZARRAYOID };
    static const Oid done_types[5] = { INT8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID };
    Datum           *ids, *vers, *errors, *https, *untils;
    bool            *err_nulls, *http_nulls, *until_nulls;
    bool             all_done = true;
    Datum            args[9];
    Datum            error_arr, http_arr, until_arr;
    SPIPlanPtr       plan;
    int64           *applied_ids;
    int64           *freed_ids; /* ordered messages that became done */
    int              napplied;
    int              nfreed = 0;
    int              rc;
    static const OdPlanShape finalize_shapes[] = { { "enable_nestloop", "off" }, { "enable_hashjoin", "on" } };
    int              nest;

    if (n <= 0)
        return 0;

    ids = (Datum *) palloc(sizeof(Datum) * n);
    vers = (Datum *) palloc(sizeof(Datum) * n);
    errors = (Datum *) palloc(sizeof(Datum) * n);
    https = (Datum *) palloc(sizeof(Datum) * n);
    err_nulls = (bool *) palloc(sizeof(bool) * n);
    http_nulls = (bool *) palloc(sizeof(bool) * n);
    untils = (Datum *) palloc(sizeof(Datum) * n);
    until_nulls = (bool *) palloc(sizeof(bool) * n);
    for (int i = 0; i < n; i++)
    {
        const OdFinalize *it = &items[i];

        ids[i] = Int64GetDatum(it->id);
        vers[i] = Int64GetDatum(it->lease_version);
        err_nulls[i] = (it->error == nullptr);
        errors[i] = it->error ? CStringGetTextDatum(it->error) : (Datum) 0;
        http_nulls[i] = (it->http_status == 0);
        https[i] = Int32GetDatum(it->http_status);
        untils[i] = TimestampTzGetDatum(it->lease_until);
        until_nulls[i] = (it->lease_until == 0);
        all_done = all_done && it->verdict == od::Verdict::Done;
    }
    /* the arrays both statements take (at their own positions) */
    args[0] = PointerGetDatum(od_build_array(ids, nullptr, n, INT8OID));
    args[1] = PointerGetDatum(od_build_array(vers, nullptr, n, INT8OID));
    error_arr = PointerGetDatum(od_build_array(errors, err_nulls, n, TEXTOID));
    http_arr = PointerGetDatum(od_build_array(https, http_nulls, n, INT4OID));
    until_arr = PointerGetDatum(od_build_array(untils, until_nulls, n, TIMESTAMPTZOID));
    if (all_done)
    {
        plan = od_prepare_hot(&plan_finalize_done, SQL_FINALIZE_DONE, 5, done_types);
        args[2] = error_arr;
        args[3] = http_arr;
        args[4] = until_arr;
    }
    else
    {
        Datum *statuses = (Datum *) palloc(sizeof(Datum) * n);
        Datum *delays = (Datum *) palloc(sizeof(Datum) * n);
        Datum *refunds = (Datum *) palloc(sizeof(Datum) * n);

        plan = od_prepare_hot(&plan_finalize[v], SQL_FINALIZE[v], 9, types);
        for (int i = 0; i < n; i++)
        {
            const OdFinalize *it = &items[i];

            statuses[i] = CStringGetTextDatum(od::verdict_name(it->verdict));
            delays[i] = od_us_to_interval(
                (it->verdict == od::Verdict::Retry || it->verdict == od::Verdict::Defer) ? it->delay_us : 0);
            refunds[i] =
                BoolGetDatum(it->verdict == od::Verdict::Defer || (it->verdict == od::Verdict::Retry && it->refund));
        }
        args[2] = PointerGetDatum(od_build_array(statuses, nullptr, n, TEXTOID));
        args[3] = PointerGetDatum(od_build_array(delays, nullptr, n, INTERVALOID));
        args[4] = error_arr;
        args[5] = http_arr;
        args[6] = PointerGetDatum(od_build_array(refunds, nullptr, n, BOOLOID));
        args[7] = od_us_to_interval((int64) od_max_defer_age_s * USECS_PER_SEC);
        args[8] = until_arr;
    }

    /* any replanning happens inside the execution: the join shape for it (see "Plans") */
    nest = od_plan_shapes_push(finalize_shapes, lengthof(finalize_shapes));
    rc = SPI_execute_plan(plan, args, nullptr, false, 0);
    od_plan_shapes_pop(nest);
    if (rc != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "outbox_dispatcher: finalize failed: %s", SPI_result_code_string(rc));

    napplied = (int) SPI_processed;
    applied_ids = (int64 *) palloc(sizeof(int64) * (napplied + 1));
    freed_ids = (int64 *) palloc(sizeof(int64) * (napplied + 1));
    for (int i = 0; i < napplied; i++)
    {
        bool isnull;

        applied_ids[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
        if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull)) && !isnull)
            freed_ids[nfreed++] = applied_ids[i];
    }
    qsort(applied_ids, napplied, sizeof(int64), cmp_int64);
    qsort(freed_ids, nfreed, sizeof(int64), cmp_int64);

    for (int i = 0; i < n; i++)
    {
        OdFinalize *it = &items[i];

        it->applied = bsearch(&it->id, applied_ids, napplied, sizeof(int64), cmp_int64) != nullptr;
        it->ordered_done = nfreed > 0 && bsearch(&it->id, freed_ids, nfreed, sizeof(int64), cmp_int64) != nullptr;
        if (!it->applied)
        {
            if (od_shared)
                pg_atomic_fetch_add_u64(&od_shared->lost_leases, 1);
            ereport(
                LOG,
                (errmsg("outbox_dispatcher: lost lease on message %lld (lease_version %lld); result \"%s\" discarded",
                        (long long) it->id, (long long) it->lease_version, od::verdict_name(it->verdict)),
                 errdetail("Another claim took the message over, or it is no longer processing.")));
        }
    }
    return napplied;
}

/* ---------------------------------------------------------------- operator transitions */

bool
od_retry(int64 id)
{
    static const Oid types[1] = { INT8OID };
    Datum            args[1] = { Int64GetDatum(id) };
    int              rc;

    od_prepare(&plan_retry, SQL_RETRY, 1, types);
    rc = SPI_execute_plan(plan_retry, args, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: retry failed: %s", SPI_result_code_string(rc));
    return SPI_processed == 1;
}

uint64
od_retry_dead(const char *endpoint, const char *event_type)
{
    static const Oid types[2] = { TEXTOID, TEXTOID };
    Datum            args[2];
    char             nulls[2];
    int              rc;

    args[0] = endpoint ? CStringGetTextDatum(endpoint) : (Datum) 0;
    nulls[0] = endpoint ? ' ' : 'n';
    args[1] = event_type ? CStringGetTextDatum(event_type) : (Datum) 0;
    nulls[1] = event_type ? ' ' : 'n';
    od_prepare(&plan_retry_dead, SQL_RETRY_DEAD, 2, types);
    rc = SPI_execute_plan(plan_retry_dead, args, nulls, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: retry_dead failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

bool
od_skip(int64 id, const char *reason)
{
    static const Oid types[2] = { INT8OID, TEXTOID };
    Datum            args[2] = { Int64GetDatum(id), CStringGetTextDatum(reason) };
    int              rc;

    od_prepare(&plan_skip, SQL_SKIP, 2, types);
    rc = SPI_execute_plan(plan_skip, args, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: skip failed: %s", SPI_result_code_string(rc));
    return SPI_processed == 1;
}

uint64
od_purge(int64 older_than_us, int limit)
{
    static const Oid types[2] = { INTERVALOID, INT4OID };
    Datum            args[2] = { od_us_to_interval(older_than_us), Int32GetDatum(limit) };
    char             nulls[2] = { ' ', limit > 0 ? ' ' : 'n' };
    int              rc;

    od_prepare_hot(&plan_purge, SQL_PURGE, 2, types);
    rc = SPI_execute_plan(plan_purge, args, nulls, false, 0);
    if (rc != SPI_OK_DELETE)
        elog(ERROR, "outbox_dispatcher: purge failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

uint64
od_replay(int64 from_id, int64 to_id, const char *endpoint)
{
    static const Oid types[3] = { INT8OID, INT8OID, TEXTOID };
    Datum            args[3] = { Int64GetDatum(from_id), Int64GetDatum(to_id),
                      endpoint ? CStringGetTextDatum(endpoint) : (Datum) 0 };
    char             nulls[3] = { ' ', ' ', endpoint ? ' ' : 'n' };
    int              rc;

    od_prepare(&plan_replay, SQL_REPLAY, 3, types);
    rc = SPI_execute_plan(plan_replay, args, nulls, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: replay failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

/* recover() (dead = true) and replay_window() (done): the rows of one endpoint in [since, until) */
uint64
od_recover_window(bool dead, const char *endpoint, TimestampTz since, TimestampTz until)
{
    static const Oid types[3] = { TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID };
    Datum            args[3] = { CStringGetTextDatum(endpoint), TimestampTzGetDatum(since),
                      TimestampTzGetDatum(until) };
    SPIPlanPtr       plan;
    int              rc;

    plan = dead ? od_prepare(&plan_recover, SQL_RECOVER, 3, types)
                : od_prepare(&plan_replay_window, SQL_REPLAY_WINDOW, 3, types);
    rc = SPI_execute_plan(plan, args, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: %s failed: %s", dead ? "recover" : "replay_window",
             SPI_result_code_string(rc));
    return SPI_processed;
}

uint64
od_move(const char *from_endpoint, const char *to_endpoint, Datum statuses)
{
    static const Oid types[3] = { TEXTOID, TEXTOID, TEXTARRAYOID };
    Datum            args[3] = { CStringGetTextDatum(from_endpoint), CStringGetTextDatum(to_endpoint), statuses };
    int              rc;

    od_prepare(&plan_move, SQL_MOVE, 3, types);
    rc = SPI_execute_plan(plan_move, args, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: move failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

/* ---------------------------------------------------------------- enqueue */

/*
 * values/nulls are enqueue()'s eight arguments in order.  The endpoint must
 * exist and be enabled; headers and payload are checked by the
 * messages_check trigger, which plain INSERTs go through as well.
 */
int64
od_enqueue(Datum *values, bool *nulls)
{
    static const Oid ins_types[8] = { TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, BOOLOID, TIMESTAMPTZOID, JSONBOID };
    char             cnulls[8];
    bool             isnull;
    int              rc;
    OdEndpointPresence presence;

    presence = od_endpoint_presence(values[4], nullptr);
    if (presence == OD_ENDPOINT_MISSING)
        ereport(ERROR,
                (errcode(ERRCODE_UNDEFINED_OBJECT),
                 errmsg("endpoint \"%s\" does not exist", TextDatumGetCString(values[4])),
                 errhint("Create it with INSERT INTO outbox.endpoints (name, url) VALUES (...).")));
    if (presence == OD_ENDPOINT_DISABLED)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                 errmsg("endpoint \"%s\" is disabled", TextDatumGetCString(values[4])),
                 errhint("Enable it with UPDATE outbox.endpoints SET enabled = true.")));

    for (int i = 0; i < 8; i++)
        cnulls[i] = nulls[i] ? 'n' : ' ';
    od_prepare(&plan_enqueue, SQL_ENQUEUE, 8, ins_types);
    /* tcount 0: with a row limit the executor would stop before the
     * ModifyTable node ends and the AFTER STATEMENT wake trigger would not fire */
    rc = SPI_execute_plan(plan_enqueue, values, cnulls, false, 0);
    if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
        elog(ERROR, "outbox_dispatcher: enqueue failed: %s", SPI_result_code_string(rc));
    return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}
