/*
 * fanout.cpp — outbox.publish() and outbox.subscribers() (0.3.0): one
 * committed event, one delivery per endpoint that subscribed to it.
 *
 * A delivery is an ordinary row of outbox.messages with its endpoint, so
 * claim, fencing, retries, breaker accounting, ordering (per aggregate per
 * endpoint), dead letters, every operator function and every view apply to
 * it unchanged; its Idempotency-Key is its own id.  The payload is stored
 * with each delivery (see docs/reference.md, "Fan-out", for the measured
 * cost of that choice).
 *
 * An endpoint matches an event when at least one of its enabled
 * subscriptions matches: one of the subscription's event_types patterns
 * matches the event type (core/pattern.cpp) and, when it has a filter, the
 * payload contains the filter (jsonb @>).  Two matching subscriptions of
 * one endpoint make one delivery, not two.  An endpoint that is disabled
 * still gets its deliveries: they wait, pending, like every message of a
 * paused endpoint; disable the subscription to stop the fan-out to it.
 *
 * Both functions run with the caller's rights (SECURITY INVOKER, like
 * enqueue): producers read the subscriptions' routing columns and insert
 * the deliveries themselves, so row-level security and auditing on
 * outbox.messages apply as to a plain INSERT.
 */
#include "guard.h"
#include "module.h"
#include "transitions.h"
#include "triggers.h"
#include "outbox_dispatcher.h"
#include "core/pattern.hpp"
#include "core/validate.hpp"

extern "C" {
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(od_publish_sql);
PG_FUNCTION_INFO_V1(od_subscribers_sql);
}

static SPIPlanPtr plan_subscriptions = nullptr;
static SPIPlanPtr plan_publish = nullptr;

static const char *const SQL_SUBSCRIPTIONS = "SELECT endpoint, event_types, filter FROM outbox.subscriptions"
                                             " WHERE enabled ORDER BY endpoint";

/*
 * $1..$7: publish()'s arguments but ordered; $8: the endpoints, in order
 * (their deliveries get ascending ids in that order).
 */
static const char *const SQL_PUBLISH =
    "INSERT INTO outbox.messages"
    "   (aggregate_type, aggregate_id, event_type, payload, endpoint, ordered, available_at, headers)"
    " SELECT $1, $2, $3, $4, u.endpoint, $5, coalesce($6, now()), $7"
    "   FROM unnest($8::text[]) WITH ORDINALITY AS u(endpoint, ord)"
    "  ORDER BY u.ord "
    "RETURNING id";

/* byte equality of two texts (endpoint names are compared as stored) */
static bool
same_text(Datum a, Datum b)
{
    text *x = DatumGetTextPP(a);
    text *y = DatumGetTextPP(b);

    return VARSIZE_ANY_EXHDR(x) == VARSIZE_ANY_EXHDR(y) &&
           memcmp(VARDATA_ANY(x), VARDATA_ANY(y), VARSIZE_ANY_EXHDR(x)) == 0;
}

static bool
any_pattern_matches(ArrayType *patterns, text *event_type)
{
    Datum *elems;
    bool  *enulls;
    int    n;

    deconstruct_array(patterns, TEXTOID, -1, false, TYPALIGN_INT, &elems, &enulls, &n);
    for (int i = 0; i < n; i++)
    {
        text *p;

        if (enulls[i])
            continue;
        p = DatumGetTextPP(elems[i]);
        if (od::event_pattern_matches(VARDATA_ANY(p), VARSIZE_ANY_EXHDR(p), VARDATA_ANY(event_type),
                                      VARSIZE_ANY_EXHDR(event_type)))
            return true;
    }
    return false;
}

/*
 * The endpoints (text Datums, in name order, each once) whose enabled
 * subscriptions match; returns how many.  Needs SPI; the names are
 * allocated in the caller's context (SPI_palloc).
 */
static int
matching_endpoints(Datum event_type, Datum payload, Datum **out)
{
    int    rc;
    int    n = 0;
    Datum *names;
    text  *et = DatumGetTextPP(event_type);

    payload = PointerGetDatum(PG_DETOAST_DATUM(payload)); /* once, not per filter */

    od_prepare(&plan_subscriptions, SQL_SUBSCRIPTIONS, 0, nullptr);
    rc = SPI_execute_plan(plan_subscriptions, nullptr, nullptr, true, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "outbox_dispatcher: reading outbox.subscriptions failed: %s", SPI_result_code_string(rc));
    names = (Datum *) SPI_palloc(sizeof(Datum) * (SPI_processed + 1));
    for (uint64 i = 0; i < SPI_processed; i++)
    {
        HeapTuple tup = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool      isnull;
        Datum     endpoint = SPI_getbinval(tup, desc, 1, &isnull);
        Datum     patterns, filter;

        CHECK_FOR_INTERRUPTS();
        if (isnull)
            continue;
        /* sorted by endpoint: an endpoint already taken needs no second look */
        if (n > 0 && same_text(names[n - 1], endpoint))
            continue;
        patterns = SPI_getbinval(tup, desc, 2, &isnull);
        if (isnull || !any_pattern_matches(DatumGetArrayTypeP(patterns), et))
            continue;
        filter = SPI_getbinval(tup, desc, 3, &isnull);
        if (!isnull && !DatumGetBool(DirectFunctionCall2(jsonb_contains, payload, filter)))
            continue;
        names[n++] = SPI_datumTransfer(endpoint, false, -1);
    }
    SPI_freetuptable(SPI_tuptable);
    *out = names;
    return n;
}

/*
 * publish(aggregate_type, aggregate_id, event_type, payload, ordered,
 * available_at, headers) -> bigint[]: the ids of the deliveries, ascending
 * ('{}' when no subscription matches; the input is checked all the same).
 */
extern "C" Datum
od_publish_sql(PG_FUNCTION_ARGS)
{
    static const Oid types[8] = { TEXTOID, TEXTOID, TEXTOID, JSONBOID, BOOLOID, TIMESTAMPTZOID, JSONBOID, TEXTARRAYOID };
    Datum            args[8];
    char             nulls[8] = { ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ' };
    Datum           *endpoints;
    Datum           *ids;
    int64           *idvals;
    int              n;
    int              level;
    int              rc;
    int              nids = 0;
    ArrayType       *result;

    od_require_arg(fcinfo, 0, "aggregate_type");
    od_require_arg(fcinfo, 1, "aggregate_id");
    od_require_arg(fcinfo, 2, "event_type");
    od_require_arg(fcinfo, 3, "payload");
    args[0] = PG_GETARG_DATUM(0);
    args[1] = PG_GETARG_DATUM(1);
    args[2] = PG_GETARG_DATUM(2);
    args[3] = PG_GETARG_DATUM(3);
    args[4] = BoolGetDatum(!PG_ARGISNULL(4) && PG_GETARG_BOOL(4));
    args[5] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
    nulls[5] = PG_ARGISNULL(5) ? 'n' : ' ';
    args[6] = PG_ARGISNULL(6) ? (Datum) 0 : PG_GETARG_DATUM(6);
    nulls[6] = PG_ARGISNULL(6) ? 'n' : ' ';

    /* matched against every pattern: bounded first, as the insert trigger would */
    od_check_header_safe_value(args[2], "event_type", false);
    level = od_spi_connect();
    n = matching_endpoints(args[2], args[3], &endpoints);
    if (n == 0)
    {
        /* nothing is written: refuse bad input as the insert trigger would */
        od_check_message_values(args[0], args[1], args[2], args[3], args[6], nulls[6] == 'n', args[5],
                                nulls[5] == 'n');
        idvals = nullptr;
    }
    else
    {
        args[7] = PointerGetDatum(od_build_array(endpoints, nullptr, n, TEXTOID));
        od_prepare(&plan_publish, SQL_PUBLISH, 8, types);
        /* tcount 0: the AFTER STATEMENT wake trigger must fire (see od_enqueue) */
        rc = SPI_execute_plan(plan_publish, args, nulls, false, 0);
        if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != (uint64) n)
            elog(ERROR, "outbox_dispatcher: publish failed: %s", SPI_result_code_string(rc));
        idvals = (int64 *) SPI_palloc(sizeof(int64) * n);
        for (uint64 i = 0; i < SPI_processed; i++)
        {
            bool isnull;

            idvals[nids++] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
        }
    }
    od_spi_finish(level);
    /* Datums made here, not taken from SPI's tuples (an int8 Datum is a pointer on 32-bit builds) */
    ids = (Datum *) palloc(sizeof(Datum) * (nids + 1));
    for (int i = 0; i < nids; i++)
        ids[i] = Int64GetDatum(idvals[i]);

    /* RETURNING follows the insert order, which is the ids' order */
    result = construct_array(ids, nids, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
    PG_RETURN_ARRAYTYPE_P(result);
}

/*
 * subscribers(event_type, payload) -> SETOF text: the endpoints publish()
 * would create deliveries for, in name order — also the way to fan out
 * with a plain INSERT ... SELECT (docs/reference.md, "Fan-out").
 */
extern "C" Datum
od_subscribers_sql(PG_FUNCTION_ARGS)
{
    ReturnSetInfo   *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
    Tuplestorestate *store;
    TupleDesc        tupdesc;
    MemoryContext    oldcxt;
    Datum           *endpoints;
    int              n = 0;
    int              level;

    if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || (rsinfo->allowedModes & SFRM_Materialize) == 0)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("set-valued function called in context that cannot accept a set")));
    oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
    tupdesc = CreateTemplateTupleDesc(1);
    TupleDescInitEntry(tupdesc, (AttrNumber) 1, "subscribers", TEXTOID, -1, 0);
    store = tuplestore_begin_heap(true, false, work_mem);
    MemoryContextSwitchTo(oldcxt);

    if (!PG_ARGISNULL(0) && !PG_ARGISNULL(1))
    {
        od_check_header_safe_value(PG_GETARG_DATUM(0), "event_type", false);
        level = od_spi_connect();
        n = matching_endpoints(PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), &endpoints);
        oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
        for (int i = 0; i < n; i++)
        {
            bool isnull = false;

            tuplestore_putvalues(store, tupdesc, &endpoints[i], &isnull);
        }
        MemoryContextSwitchTo(oldcxt);
        od_spi_finish(level);
    }
    rsinfo->returnMode = SFRM_Materialize;
    rsinfo->setResult = store;
    rsinfo->setDesc = tupdesc;
    return (Datum) 0;
}
