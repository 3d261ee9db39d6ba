/*
 * sql_api.cpp — SQL-callable functions of schema outbox.
 *
 * Each function validates its arguments (errors follow the PostgreSQL
 * message style and are raised before anything is changed), connects to
 * SPI and calls the single implementation in transitions.cpp.
 */
#include "catalog.h"
#include "module.h"
#include "guard.h"
#include "transitions.h"
#include "triggers.h"
#include "wake.h"
#include "outbox_dispatcher.h"

extern "C" {
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(od_enqueue_sql);
PG_FUNCTION_INFO_V1(od_claim_sql);
PG_FUNCTION_INFO_V1(od_claim_v022_sql);
PG_FUNCTION_INFO_V1(od_mark_done_sql);
PG_FUNCTION_INFO_V1(od_reschedule_sql);
PG_FUNCTION_INFO_V1(od_mark_dead_sql);
PG_FUNCTION_INFO_V1(od_retry_sql);
PG_FUNCTION_INFO_V1(od_retry_dead_sql);
PG_FUNCTION_INFO_V1(od_skip_sql);
PG_FUNCTION_INFO_V1(od_purge_sql);
PG_FUNCTION_INFO_V1(od_replay_sql);
PG_FUNCTION_INFO_V1(od_recover_sql);
PG_FUNCTION_INFO_V1(od_replay_window_sql);
PG_FUNCTION_INFO_V1(od_move_messages_sql);
PG_FUNCTION_INFO_V1(od_lost_leases_sql);
PG_FUNCTION_INFO_V1(od_pause_endpoint_sql);
PG_FUNCTION_INFO_V1(od_resume_endpoint_sql);
PG_FUNCTION_INFO_V1(od_rotate_secret_sql);
}

static void
require_nonempty_text(FunctionCallInfo fcinfo, int argno, const char *name)
{
    od_require_arg(fcinfo, argno, name);
    if (VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(argno)) == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must not be empty", name)));
}

/* An endpoint of that name (text) exists (*id set unless NULL); "does not exist" otherwise.  Needs SPI. */
static void
require_endpoint(Datum name, int64 *id)
{
    if (od_endpoint_presence(name, id) == OD_ENDPOINT_MISSING)
        ereport(
            ERROR,
            (errcode(ERRCODE_UNDEFINED_OBJECT), errmsg("endpoint \"%s\" does not exist", TextDatumGetCString(name))));
}

static int64
positive_interval_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool allow_zero)
{
    int64 us;

    od_require_arg(fcinfo, argno, name);
    us = od_interval_us(PG_GETARG_INTERVAL_P(argno));
    if (us < 0 || (us == 0 && !allow_zero))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("%s must be %s", name, allow_zero ? "zero or positive" : "positive"),
                 errdetail("The value given is %s.",
                           DatumGetCString(DirectFunctionCall1(interval_out, PG_GETARG_DATUM(argno))))));
    return us;
}

static int
http_status_arg(FunctionCallInfo fcinfo, int argno)
{
    int status;

    if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
        return 0;
    status = PG_GETARG_INT32(argno);
    if (status < 100 || status > 599)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("http_status must be between 100 and 599"),
                 errdetail("The value given is %d.", status)));
    return status;
}

/* ---------------------------------------------------------------- enqueue */

extern "C" Datum
od_enqueue_sql(PG_FUNCTION_ARGS)
{
    Datum values[8];
    bool  nulls[8];
    int64 id;

    od_require_arg(fcinfo, 0, "aggregate_type");
    od_require_arg(fcinfo, 1, "aggregate_id");
    od_require_arg(fcinfo, 2, "event_type");
    od_require_arg(fcinfo, 3, "payload");
    od_require_arg(fcinfo, 4, "endpoint");
    for (int i = 0; i < 8; i++)
    {
        nulls[i] = PG_ARGISNULL(i);
        values[i] = nulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i);
    }
    if (nulls[5])
    {
        nulls[5] = false;
        values[5] = BoolGetDatum(false);
    }

    int level = od_spi_connect();
    id = od_enqueue(values, nulls);
    od_spi_finish(level);
    PG_RETURN_INT64(id);
}

/* ---------------------------------------------------------------- claim */

/*
 * outbox.claim() of schemas 0.1.0 to 0.2.1, whose messages_leased index the
 * claim's statements no longer match (catalog.h: not served).
 */
extern "C" Datum
od_claim_sql(PG_FUNCTION_ARGS)
{
    int   level = od_spi_connect();
    char *version = od_installed_version();

    (void) level; /* the ERROR below ends the SPI connection with the transaction */
    od_schema_unserved_error("outbox.claim()", version ? version : "(none)");
}

/*
 * outbox.claim() since 0.2.2: for external relays and tests.  It takes no
 * part in the workers' shared limits (breaker, rate_limit, max_in_flight):
 * those are reservations of the workers' requests in flight, and the
 * caller's requests are not the workers' to count or release.  It always
 * looks for expired leases first: it is the caller's whole cycle.
 */
extern "C" Datum
od_claim_v022_sql(PG_FUNCTION_ARGS)
{
    ReturnSetInfo   *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
    char            *owner;
    int              batch;
    int64            lease_us;
    int              max_attempts;
    MemoryContext    per_query;
    MemoryContext    oldcxt;
    int              level;
    Tuplestorestate *store;
    TupleDesc        tupdesc;

    require_nonempty_text(fcinfo, 0, "owner");
    od_require_arg(fcinfo, 1, "batch");
    batch = PG_GETARG_INT32(1);
    if (batch <= 0)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("batch must be positive"),
                 errdetail("The value given is %d.", batch)));
    lease_us = positive_interval_arg(fcinfo, 2, "lease", false);
    max_attempts = PG_ARGISNULL(3) ? od_max_attempts : PG_GETARG_INT32(3);
    if (max_attempts < 1)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max_attempts must be at least 1"),
                 errdetail("The value given is %d.", max_attempts)));
    owner = text_to_cstring(PG_GETARG_TEXT_PP(0));

    if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || (rsinfo->allowedModes & SFRM_Materialize) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("set-valued function called in context that cannot accept a set")));
    if (get_call_result_type(fcinfo, nullptr, &tupdesc) != TYPEFUNC_COMPOSITE)
        elog(ERROR, "return type must be a row type");

    per_query = rsinfo->econtext->ecxt_per_query_memory;
    oldcxt = MemoryContextSwitchTo(per_query);
    tupdesc = CreateTupleDescCopy(tupdesc);
    store = tuplestore_begin_heap(true, false, work_mem);
    MemoryContextSwitchTo(oldcxt);

    level = od_spi_connect();
    {
        char *version = od_installed_version();
        int   flags = OD_CLAIM_CHECK_LEASES;

        if (version != nullptr && od_schema_records_commit_order(od_schema_number(version)))
            flags |= OD_CLAIM_COMMIT_ORDER;
        od_claim(owner, batch, lease_us, max_attempts, nullptr, nullptr, nullptr, nullptr, -1, flags);
    }
    oldcxt = MemoryContextSwitchTo(per_query);
    {
        /* the claim returns the lease deadline and available_at too (for the workers): OD_CLAIM_NATTS here */
        Datum values[OD_CLAIM_ALL_NATTS];
        bool  isnull[OD_CLAIM_ALL_NATTS];

        if (SPI_processed > 0 && SPI_tuptable->tupdesc->natts != OD_CLAIM_ALL_NATTS)
            elog(ERROR, "outbox_dispatcher: the claim returned %d columns, not %d", SPI_tuptable->tupdesc->natts,
                 OD_CLAIM_ALL_NATTS);
        for (uint64 i = 0; i < SPI_processed; i++)
        {
            heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, values, isnull);
            tuplestore_putvalues(store, tupdesc, values, isnull);
        }
    }
    MemoryContextSwitchTo(oldcxt);
    od_spi_finish(level);

    rsinfo->returnMode = SFRM_Materialize;
    rsinfo->setResult = store;
    rsinfo->setDesc = tupdesc;
    return (Datum) 0;
}

/* ---------------------------------------------------------------- finalize */

static bool
finalize_one(OdFinalize *item)
{
    int   level = od_spi_connect();
    char *version = od_installed_version();

    od_finalize(item, 1, version != nullptr && od_schema_has_fanout(od_schema_number(version)) ? OD_FINALIZE_DEAD_AT : 0);
    od_spi_finish(level);
    return item->applied;
}

static void
fence_args(FunctionCallInfo fcinfo, OdFinalize *item)
{
    memset(item, 0, sizeof(*item));
    od_require_arg(fcinfo, 0, "id");
    od_require_arg(fcinfo, 1, "lease_version");
    item->id = PG_GETARG_INT64(0);
    item->lease_version = PG_GETARG_INT64(1);
}

extern "C" Datum
od_mark_done_sql(PG_FUNCTION_ARGS)
{
    OdFinalize item;

    fence_args(fcinfo, &item);
    item.verdict = od::Verdict::Done;
    item.http_status = http_status_arg(fcinfo, 2);
    PG_RETURN_BOOL(finalize_one(&item));
}

extern "C" Datum
od_reschedule_sql(PG_FUNCTION_ARGS)
{
    OdFinalize item;

    fence_args(fcinfo, &item);
    item.verdict = od::Verdict::Retry;
    item.delay_us = positive_interval_arg(fcinfo, 2, "delay", true);
    item.error = PG_ARGISNULL(3) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(3));
    item.refund = !PG_ARGISNULL(4) && PG_GETARG_BOOL(4);
    item.http_status = http_status_arg(fcinfo, 5);
    PG_RETURN_BOOL(finalize_one(&item));
}

extern "C" Datum
od_mark_dead_sql(PG_FUNCTION_ARGS)
{
    OdFinalize item;

    fence_args(fcinfo, &item);
    require_nonempty_text(fcinfo, 2, "error");
    item.verdict = od::Verdict::Dead;
    item.error = text_to_cstring(PG_GETARG_TEXT_PP(2));
    item.http_status = http_status_arg(fcinfo, 3);
    PG_RETURN_BOOL(finalize_one(&item));
}

/* ---------------------------------------------------------------- operator */

extern "C" Datum
od_retry_sql(PG_FUNCTION_ARGS)
{
    bool ok;

    od_require_arg(fcinfo, 0, "id");
    int level = od_spi_connect();
    ok = od_retry(PG_GETARG_INT64(0));
    od_spi_finish(level);
    if (ok)
        od_wake_at_commit();
    PG_RETURN_BOOL(ok);
}

extern "C" Datum
od_retry_dead_sql(PG_FUNCTION_ARGS)
{
    const char *endpoint = PG_ARGISNULL(0) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(0));
    const char *event_type = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
    uint64      n;

    int         level = od_spi_connect();
    n = od_retry_dead(endpoint, event_type);
    od_spi_finish(level);
    if (n > 0)
        od_wake_at_commit();
    PG_RETURN_INT64((int64) n);
}

extern "C" Datum
od_skip_sql(PG_FUNCTION_ARGS)
{
    bool ok;

    od_require_arg(fcinfo, 0, "id");
    require_nonempty_text(fcinfo, 1, "reason");
    int level = od_spi_connect();
    ok = od_skip(PG_GETARG_INT64(0), text_to_cstring(PG_GETARG_TEXT_PP(1)));
    od_spi_finish(level);
    if (ok)
        od_wake_at_commit(); /* may unblock an ordered aggregate */
    PG_RETURN_BOOL(ok);
}

extern "C" Datum
od_purge_sql(PG_FUNCTION_ARGS)
{
    int64  older_than = positive_interval_arg(fcinfo, 0, "older_than", true);
    uint64 n;

    int    level = od_spi_connect();
    n = od_purge(older_than, 0);
    od_spi_finish(level);
    PG_RETURN_INT64((int64) n);
}

/*
 * replay(from_id, to_id, endpoint): done messages in the id range go back to
 * pending (attempts reset, a new fencing token), e.g. after a consumer lost
 * data.  Wakes the workers at commit.
 */
extern "C" Datum
od_replay_sql(PG_FUNCTION_ARGS)
{
    int64       from_id, to_id;
    const char *endpoint;
    uint64      n;

    od_require_arg(fcinfo, 0, "from_id");
    od_require_arg(fcinfo, 1, "to_id");
    from_id = PG_GETARG_INT64(0);
    to_id = PG_GETARG_INT64(1);
    if (from_id > to_id)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("from_id must not be greater than to_id"),
                 errdetail("The range given is %lld to %lld.", (long long) from_id, (long long) to_id)));
    endpoint = PG_ARGISNULL(2) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(2));
    int level = od_spi_connect();
    n = od_replay(from_id, to_id, endpoint);
    od_spi_finish(level);
    if (n > 0)
        od_wake_at_commit();
    PG_RETURN_INT64((int64) n);
}

/*
 * recover(endpoint, since, until) and replay_window(endpoint, since,
 * until): the endpoint's dead messages that died in [since, until), or its
 * done messages delivered then, back to pending with attempts reset (0.3.0).
 * Ordered messages keep their order: the head check sees every recovered
 * row of an aggregate as pending and releases them in id order.
 */
static Datum
recover_window(FunctionCallInfo fcinfo, bool dead)
{
    TimestampTz since, until;
    uint64      n;
    int         level;

    od_require_arg(fcinfo, 0, "endpoint");
    od_require_arg(fcinfo, 1, "since");
    od_require_arg(fcinfo, 2, "until");
    since = PG_GETARG_TIMESTAMPTZ(1);
    until = PG_GETARG_TIMESTAMPTZ(2);
    if (since > until)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("since must not be later than until"),
                 errdetail("The window given is %s to %s.",
                           DatumGetCString(DirectFunctionCall1(timestamptz_out, PG_GETARG_DATUM(1))),
                           DatumGetCString(DirectFunctionCall1(timestamptz_out, PG_GETARG_DATUM(2))))));
    level = od_spi_connect();
    require_endpoint(PG_GETARG_DATUM(0), nullptr);
    n = od_recover_window(dead, TextDatumGetCString(PG_GETARG_DATUM(0)), since, until);
    od_spi_finish(level);
    if (n > 0)
        od_wake_at_commit();
    PG_RETURN_INT64((int64) n);
}

extern "C" Datum
od_recover_sql(PG_FUNCTION_ARGS)
{
    return recover_window(fcinfo, true);
}

extern "C" Datum
od_replay_window_sql(PG_FUNCTION_ARGS)
{
    return recover_window(fcinfo, false);
}

/*
 * move_messages(from_endpoint, to_endpoint, statuses): re-point pending
 * and/or dead messages to another endpoint.  Messages in flight
 * (processing) and delivered ones (done) are never moved.
 */
extern "C" Datum
od_move_messages_sql(PG_FUNCTION_ARGS)
{
    char      *from, *to;
    ArrayType *arr;
    Datum     *elems;
    bool      *enulls;
    int        nelems;
    uint64     n;

    require_nonempty_text(fcinfo, 0, "from_endpoint");
    require_nonempty_text(fcinfo, 1, "to_endpoint");
    od_require_arg(fcinfo, 2, "statuses");
    from = text_to_cstring(PG_GETARG_TEXT_PP(0));
    to = text_to_cstring(PG_GETARG_TEXT_PP(1));
    if (strcmp(from, to) == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("from_endpoint and to_endpoint must differ")));
    arr = PG_GETARG_ARRAYTYPE_P(2);
    deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &enulls, &nelems);
    if (nelems == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("statuses must not be empty")));
    for (int i = 0; i < nelems; i++)
    {
        char *st = enulls[i] ? nullptr : TextDatumGetCString(elems[i]);

        if (st == nullptr || (strcmp(st, "pending") != 0 && strcmp(st, "dead") != 0))
            ereport(
                ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("only pending and dead messages can be moved"),
                 errdetail("The statuses given include %s.", st ? quote_literal_cstr(st) : "NULL"),
                 errhint(
                     "Messages in flight (processing) finish first; delivered ones (done) stay where they were delivered.")));
    }

    int level = od_spi_connect();
    require_endpoint(CStringGetTextDatum(to), nullptr);
    n = od_move(from, to, PointerGetDatum(arr));
    od_spi_finish(level);
    if (n > 0)
        od_wake_at_commit();
    PG_RETURN_INT64((int64) n);
}

/* ---------------------------------------------------------------- pause and resume (0.3.0) */

/* The id of the endpoint named by argument 0; errors if it is null or does not exist. */
static int64
endpoint_id_arg(FunctionCallInfo fcinfo)
{
    int64 id = 0;

    od_require_arg(fcinfo, 0, "name");
    require_endpoint(PG_GETARG_DATUM(0), &id);
    return id;
}

/* outbox.pause_endpoint(name, reason): true if it was enabled */
extern "C" Datum
od_pause_endpoint_sql(PG_FUNCTION_ARGS)
{
    int   level = od_spi_connect();
    int64 id = endpoint_id_arg(fcinfo);
    char *reason = PG_ARGISNULL(1) ? psprintf("paused by %s", GetUserNameFromId(GetUserId(), false))
                                   : text_to_cstring(PG_GETARG_TEXT_PP(1));
    bool  changed = od_set_endpoint_enabled(id, false, reason);

    od_spi_finish(level);
    PG_RETURN_BOOL(changed);
}

/* outbox.resume_endpoint(name): true if it was disabled; wakes the workers at commit */
extern "C" Datum
od_resume_endpoint_sql(PG_FUNCTION_ARGS)
{
    int   level = od_spi_connect();
    int64 id = endpoint_id_arg(fcinfo);
    bool  changed = od_set_endpoint_enabled(id, true, nullptr);

    od_spi_finish(level);
    if (changed)
        od_wake_at_commit();
    PG_RETURN_BOOL(changed);
}

/* ---------------------------------------------------------------- counters */

extern "C" Datum
od_lost_leases_sql(PG_FUNCTION_ARGS)
{
    if (od_shared == nullptr)
        PG_RETURN_NULL();
    PG_RETURN_INT64((int64) pg_atomic_read_u64(&od_shared->lost_leases));
}

/*
 * outbox.rotate_secret(endpoint, new_secret, grace): new_secret signs from
 * now on; the replaced secret keeps signing too (after the new one, in the
 * same webhook-signature header) until now() + grace, so that receivers can
 * switch at any time within it.  One replaced secret is kept: rotating again
 * within the grace period drops the oldest.  Returns when the replaced
 * secret stops being sent (null: grace 0 or no secret before).  The workers
 * reload the endpoint at commit (the endpoints_changed trigger).
 */
#define OD_MAX_ROTATION_GRACE_US ((int64) 30 * USECS_PER_DAY)

extern "C" Datum
od_rotate_secret_sql(PG_FUNCTION_ARGS)
{
    static SPIPlanPtr plan = nullptr;
    static const Oid  types[3] = { TEXTOID, TEXTOID, INTERVALOID };
    Datum             args[3];
    int               level;
    int64             grace_us;
    int               rc;
    bool              isnull;
    TimestampTz       until;

    od_require_arg(fcinfo, 0, "endpoint");
    od_require_arg(fcinfo, 1, "new_secret");
    od_check_secret_value(PG_GETARG_DATUM(1), "new_secret");
    grace_us = positive_interval_arg(fcinfo, 2, "grace", true);
    if (grace_us > OD_MAX_ROTATION_GRACE_US)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("grace must be at most 30 days"),
                 errdetail("The value given is %s.",
                           DatumGetCString(DirectFunctionCall1(interval_out, PG_GETARG_DATUM(2))))));
    args[0] = PG_GETARG_DATUM(0);
    args[1] = PG_GETARG_DATUM(1);
    args[2] = PG_GETARG_DATUM(2);

    level = od_spi_connect();
    require_endpoint(args[0], nullptr);
    od_prepare(&plan,
               "UPDATE outbox.endpoints AS e"
               "   SET previous_signing_secret = CASE WHEN $3 > interval '0' THEN e.signing_secret END,"
               "       previous_secret_until = CASE WHEN $3 > interval '0' AND e.signing_secret IS NOT NULL"
               "                                    THEN now() + $3 END,"
               "       signing_secret = $2"
               " WHERE e.name = $1 AND e.signing_secret IS DISTINCT FROM $2"
               " RETURNING e.previous_secret_until",
               3, types);
    rc = SPI_execute_plan(plan, args, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE_RETURNING)
        elog(ERROR, "outbox_dispatcher: rotating the secret failed: %s", SPI_result_code_string(rc));
    if (SPI_processed == 0)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                 errmsg("new_secret is already the signing secret of endpoint \"%s\"", TextDatumGetCString(args[0]))));
    until = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    od_spi_finish(level);
    if (isnull)
        PG_RETURN_NULL();
    PG_RETURN_TIMESTAMPTZ(until);
}
