/*
 * catalog.cpp — schema-version knowledge and the endpoint rows: which
 * extension versions this library serves, how the workers read
 * outbox.endpoints, and the one existence check and the one enable/disable
 * everything else calls.  See catalog.h for the support policy.
 */
#include "catalog.h"
#include "guard.h"
#include "transitions.h"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
}

/* ---------------------------------------------------------------- versions */

int
od_schema_number(const char *v)
{
    static const struct
    {
        const char *name;
        int         number;
    } known[] = {
        { "0.1.0", 10 }, { "0.2.0", 20 }, { "0.2.1", 21 }, { "0.2.2", OD_SCHEMA_0_2_2 }, { "0.3.0", OD_SCHEMA_0_3_0 },
    };

    for (const auto &k : known)
        if (v && strcmp(v, k.name) == 0)
            return k.number;
    return 0;
}

bool
od_schema_served(int schema)
{
    return schema == OD_SCHEMA_CURRENT || schema == OD_SCHEMA_PREVIOUS;
}

bool
od_schema_announces_endpoint_changes(int schema)
{
    return schema >= OD_SCHEMA_0_3_0;
}

bool
od_schema_records_commit_order(int schema)
{
    return schema >= OD_SCHEMA_0_3_0;
}

bool
od_schema_has_fanout(int schema)
{
    return schema >= OD_SCHEMA_0_3_0;
}

char *
od_installed_version(void)
{
    int rc = SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'outbox_dispatcher'", true, 1);

    if (rc != SPI_OK_SELECT)
        elog(ERROR, "outbox_dispatcher: reading pg_extension failed: %s", SPI_result_code_string(rc));
    if (SPI_processed == 0)
        return nullptr;
    return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

void
od_schema_unserved_error(const char *function, const char *extversion)
{
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("%s of extension version %s is not served by library version %s", function, extversion,
                    OD_LIBRARY_VERSION),
             errhint("Run ALTER EXTENSION outbox_dispatcher UPDATE.")));
}

/* ---------------------------------------------------------------- endpoints as the workers read them */

char *
od_header_lines_text(Datum d)
{
    Jsonb             *jb = DatumGetJsonbP(d);
    JsonbIterator     *it;
    JsonbValue         v;
    JsonbIteratorToken tok;
    StringInfoData     buf;

    initStringInfo(&buf);
    if (!JB_ROOT_IS_OBJECT(jb))
        return buf.data;
    it = JsonbIteratorInit(&jb->root);
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
    {
        if (tok == WJB_KEY)
            appendBinaryStringInfo(&buf, v.val.string.val, v.val.string.len);
        else if (tok == WJB_VALUE && v.type == jbvString)
        {
            appendStringInfoString(&buf, ": ");
            appendBinaryStringInfo(&buf, v.val.string.val, v.val.string.len);
            appendStringInfoChar(&buf, '\n');
        }
    }
    return buf.data;
}

/*
 * The columns in the order od_read_endpoints reads them; conversions happen
 * in C, not in SQL.  [1]: 0.3.0, with the secret a rotation replaced while
 * its grace period lasts, the retry schedule and the attempt limit.
 */
#define SQL_ENDPOINTS_TEXT(rotation) \
    "SELECT e.tableoid, e.id, e.name, e.url, e.headers, e.signing_secret, e.timeout, e.max_in_flight," \
    "       e.defer_statuses, e.rate_limit, e.breaker_threshold, e.breaker_cooldown" rotation \
    "  FROM outbox.endpoints AS e WHERE e.enabled"

static const char *const SQL_ENDPOINTS[2] = {
    SQL_ENDPOINTS_TEXT(""),
    SQL_ENDPOINTS_TEXT(", CASE WHEN e.previous_secret_until > now() THEN e.previous_signing_secret END,"
                       " e.previous_secret_until, e.retry_schedule, e.max_attempts, e.disable_after,"
                       " e.proxy, e.client_cert, e.client_key, e.updated_at,"
                       " e.oauth_token_url, e.oauth_client_id, e.oauth_client_secret, e.oauth_scope")
};

int
od_read_endpoints(int schema, MemoryContext cxt, OdEndpointRow **out)
{
    OdEndpointRow *rows;
    int            nrows;
    int            rc;

    bool           rotation = od_schema_has_fanout(schema);

    Assert(od_schema_served(schema));
    rc = SPI_execute(SQL_ENDPOINTS[rotation ? 1 : 0], true, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "outbox_dispatcher: loading endpoints failed: %s", SPI_result_code_string(rc));
    nrows = (int) SPI_processed;
    rows = (OdEndpointRow *) MemoryContextAllocZero(cxt, sizeof(OdEndpointRow) * (nrows + 1));
    for (int i = 0; i < nrows; i++)
    {
        HeapTuple      tup = SPI_tuptable->vals[i];
        TupleDesc      desc = SPI_tuptable->tupdesc;
        OdEndpointRow *r = &rows[i];
        bool           isnull;
        Datum          d;
        MemoryContext  old = MemoryContextSwitchTo(cxt);

        r->relid = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
        r->id = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
        r->name = SPI_getvalue(tup, desc, 3);
        r->url = SPI_getvalue(tup, desc, 4);
        d = SPI_getbinval(tup, desc, 5, &isnull);
        r->headers = isnull ? pstrdup("") : od_header_lines_text(d);
        r->secret = SPI_getvalue(tup, desc, 6);
        {
            /* whole milliseconds, rounded up */
            int64 us = od_interval_us(DatumGetIntervalP(SPI_getbinval(tup, desc, 7, &isnull)));

            r->timeout_ms = Max((int64) 1, Min(us, (int64) 86400 * USECS_PER_SEC) / 1000 + (us % 1000 != 0 ? 1 : 0));
        }
        r->max_in_flight = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
        d = SPI_getbinval(tup, desc, 9, &isnull);
        if (!isnull)
        {
            ArrayType *arr = DatumGetArrayTypePCopy(d);
            Datum     *elems;
            bool      *nulls;
            int        n;

            deconstruct_array(arr, INT4OID, 4, true, TYPALIGN_INT, &elems, &nulls, &n);
            r->defer = (int *) palloc(sizeof(int) * (n + 1));
            for (int j = 0; j < n; j++)
                r->defer[r->ndefer++] = nulls[j] ? 0 : DatumGetInt32(elems[j]);
        }
        d = SPI_getbinval(tup, desc, 10, &isnull);
        r->rate_limit = isnull ? 0 : DatumGetFloat8(d);
        r->breaker_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
        r->breaker_cooldown_ms = od_interval_us(DatumGetIntervalP(SPI_getbinval(tup, desc, 12, &isnull))) / 1000;
        if (rotation)
        {
            r->previous_secret = SPI_getvalue(tup, desc, 13);
            d = SPI_getbinval(tup, desc, 14, &isnull);
            r->previous_secret_until = isnull ? 0 : DatumGetTimestampTz(d);
            d = SPI_getbinval(tup, desc, 15, &isnull);
            if (!isnull)
            {
                ArrayType *arr = DatumGetArrayTypePCopy(d);
                Datum     *elems;
                bool      *enulls;
                int        n;

                deconstruct_array(arr, INTERVALOID, sizeof(Interval), false, TYPALIGN_DOUBLE, &elems, &enulls, &n);
                r->retry_schedule_ms = (int64 *) palloc(sizeof(int64) * (n + 1));
                for (int j = 0; j < n; j++)
                    if (!enulls[j]) /* the domain has no nulls */
                        r->retry_schedule_ms[r->n_retry_schedule++] = od_interval_us(DatumGetIntervalP(elems[j])) / 1000;
            }
            d = SPI_getbinval(tup, desc, 16, &isnull);
            r->max_attempts = isnull ? 0 : DatumGetInt32(d);
            d = SPI_getbinval(tup, desc, 17, &isnull);
            r->disable_after_us = isnull ? 0 : od_interval_us(DatumGetIntervalP(d));
            r->proxy = SPI_getvalue(tup, desc, 18);
            r->client_cert = SPI_getvalue(tup, desc, 19);
            r->client_key = SPI_getvalue(tup, desc, 20);
            d = SPI_getbinval(tup, desc, 21, &isnull);
            r->updated_at = isnull ? 0 : DatumGetTimestampTz(d);
            r->oauth_token_url = SPI_getvalue(tup, desc, 22);
            r->oauth_client_id = SPI_getvalue(tup, desc, 23);
            r->oauth_client_secret = SPI_getvalue(tup, desc, 24);
            r->oauth_scope = SPI_getvalue(tup, desc, 25);
        }
        MemoryContextSwitchTo(old);
    }
    *out = rows;
    return nrows;
}

/* ---------------------------------------------------------------- one existence check, one state change */

static SPIPlanPtr        plan_presence[2] = { nullptr, nullptr };
static SPIPlanPtr        plan_set_enabled = nullptr;

/* [0] for enqueue(), which every schema's producers call: no column newer than 0.1.0 */
static const char *const SQL_PRESENCE[2] = { "SELECT e.enabled FROM outbox.endpoints AS e WHERE e.name = $1",
                                             "SELECT e.enabled, e.id FROM outbox.endpoints AS e WHERE e.name = $1" };

OdEndpointPresence
od_endpoint_presence(Datum name, int64 *id)
{
    static const Oid types[1] = { TEXTOID };
    const int        which = id ? 1 : 0;
    bool             isnull;
    HeapTuple        tup;
    int              rc;

    od_prepare(&plan_presence[which], SQL_PRESENCE[which], 1, types);
    rc = SPI_execute_plan(plan_presence[which], &name, nullptr, true, 1);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "outbox_dispatcher: endpoint lookup failed: %s", SPI_result_code_string(rc));
    if (SPI_processed == 0)
        return OD_ENDPOINT_MISSING;
    tup = SPI_tuptable->vals[0];
    if (id)
        *id = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull));
    return DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull)) ? OD_ENDPOINT_ENABLED
                                                                               : OD_ENDPOINT_DISABLED;
}

bool
od_set_endpoint_enabled(int64 id, bool enabled, const char *reason)
{
    static const Oid types[3] = { INT8OID, BOOLOID, TEXTOID };
    Datum            args[3] = { Int64GetDatum(id), BoolGetDatum(enabled), (Datum) 0 };
    char             nulls[3] = { ' ', ' ', 'n' };
    int              rc;

    if (!enabled && reason)
    {
        args[2] = CStringGetTextDatum(reason);
        nulls[2] = ' ';
    }
    od_prepare(&plan_set_enabled,
               "UPDATE outbox.endpoints AS e SET enabled = $2, disabled_reason = $3"
               " WHERE e.id = $1 AND e.enabled IS DISTINCT FROM $2",
               3, types);
    rc = SPI_execute_plan(plan_set_enabled, args, nulls, false, 0);
    if (rc != SPI_OK_UPDATE)
        elog(ERROR, "outbox_dispatcher: changing endpoint %lld failed: %s", (long long) id, SPI_result_code_string(rc));
    return SPI_processed > 0;
}
