/*
 * worker_endpoints.cpp — what a worker knows about the installed extension
 * (is it there, which schema version, may we use it) and the endpoints it
 * serves: loaded into the Dispatcher, keyed to their shared-memory slots,
 * with the limits a claim reserves against.  See worker.h.
 */
#include "worker.h"

namespace odw {

/* "Name: value\n..." for a jsonb object of strings (validated on write). */
char *
header_lines_text(Datum d)
{
    Jsonb          *jb = DatumGetJsonbP(d);
    JsonbIterator  *it;
    JsonbValue      v;
    JsonbIteratorToken tok;
    StringInfoData  buf;

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

void
split_lines(const char *text, std::vector<std::string> &out) noexcept
{
    try
    {
        const char *p = text;

        while (p && *p)
        {
            const char *nl = strchr(p, '\n');
            size_t      len = nl ? (size_t) (nl - p) : strlen(p);

            if (len > 0)
                out.emplace_back(p, len);
            p = nl ? nl + 1 : nullptr;
        }
    }
    catch (...)
    {
    }
}

/* ---------------------------------------------------------------- endpoints */

typedef struct EndpointRow
{
    Oid     relid;
    int64   id;
    char   *name;
    char   *url;
    char   *headers;
    char   *secret;
    int64   timeout_ms;
    int     max_in_flight;
    int    *defer;
    int     ndefer;
    double  rate_limit;
    int     breaker_threshold;
    int64   breaker_cooldown_ms;
} EndpointRow;

static void
load_endpoint(const EndpointRow *r) noexcept
{
    try
    {
        od::EndpointConfig e;

        e.name = r->name;
        e.url = r->url;
        split_lines(r->headers, e.header_lines);
        if (r->secret)
        {
            unsigned char key[od::kMaxSecretBytes + 8];
            long          n = od::decode_webhook_secret(r->secret, strlen(r->secret), key, sizeof(key));

            if (n > 0)
                e.key.assign(key, key + n);
        }
        e.timeout_ms = (long) r->timeout_ms;
        e.max_in_flight = r->max_in_flight;
        e.defer_statuses.assign(r->defer, r->defer + r->ndefer);
        W.disp->add_endpoint(e);
    }
    catch (...)
    {
    }
}

/*
 * The endpoint columns of each schema version this library serves, in the
 * order EndpointRow reads them.  Conversions happen in C, not in SQL.
 * Schemas before 0.2.1 have no endpoint id: the shared state is keyed by a
 * hash of the name there (negative, so it never equals a real id).
 */
static const char *const SQL_ENDPOINTS_V021 =
    "SELECT e.tableoid, e.id, e.name, e.url, e.headers, e.signing_secret, e.timeout, e.max_in_flight,"
    "       e.defer_statuses, e.rate_limit, e.breaker_threshold, e.breaker_cooldown"
    "  FROM outbox.endpoints AS e WHERE e.enabled";
static const char *const SQL_ENDPOINTS_V020 =
    "SELECT e.tableoid, NULL::bigint, e.name, e.url, e.headers, e.signing_secret, e.timeout, e.max_in_flight,"
    "       e.defer_statuses, e.rate_limit, e.breaker_threshold, e.breaker_cooldown"
    "  FROM outbox.endpoints AS e WHERE e.enabled";
static const char *const SQL_ENDPOINTS_V010 =
    "SELECT e.tableoid, NULL::bigint, e.name, e.url, e.headers, e.signing_secret, e.timeout, e.max_in_flight,"
    "       e.defer_statuses, NULL::float8, 5, interval '30 seconds'"
    "  FROM outbox.endpoints AS e WHERE e.enabled";

static int
parse_version(const char *v)
{
    if (strcmp(v, "0.1.0") == 0)
        return 100;
    if (strcmp(v, "0.2.0") == 0)
        return 200;
    if (strcmp(v, "0.2.1") == 0)
        return 201;
    if (strcmp(v, "0.2.2") == 0)
        return 202;
    return 0;
}

/* Is the installed extension one this library can serve?  Sets ext_ready and schema_version. */
static void
check_extension(void)
{
    int   rc;
    char *version = nullptr;
    Oid   admin;
    MemoryContext old;

    rc = SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'outbox_dispatcher'", true, 1);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "outbox_dispatcher: reading pg_extension failed: %s", SPI_result_code_string(rc));
    W.ext_ready = false;
    W.ext_idle_reason = nullptr;
    W.ext_idle_hint = nullptr;
    if (SPI_processed == 0)
        return;
    /* the reasons outlive the transaction: they are logged after it */
    old = MemoryContextSwitchTo(W.cycle_ctx);
    version = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
    W.schema_version = parse_version(version);
    admin = get_role_oid("outbox_admin", true);
    if (GetDatabaseEncoding() != PG_UTF8)
    {
        W.ext_idle_reason = psprintf("database \"%s\" has encoding %s; outbox_dispatcher needs UTF8 "
                                   "(JSON bodies and signed headers go out as UTF-8)",
                                   od_database, GetDatabaseEncodingName());
        W.ext_idle_hint = pstrdup("Install the extension in a UTF8 database.");
    }
    else if (W.schema_version == 0)
    {
        W.ext_idle_reason = psprintf("extension version \"%s\" is not served by this library (%s)",
                                   version, OD_LIBRARY_VERSION);
        W.ext_idle_hint = pstrdup("Install the library that matches the extension version, or run ALTER EXTENSION outbox_dispatcher UPDATE.");
    }
    else if (!superuser() && (!OidIsValid(admin) || !has_privs_of_role(GetUserId(), admin)))
    {
        /* say it once, instead of a permission error every second */
        const char *me = GetUserNameFromId(GetUserId(), false);

        W.ext_idle_reason = psprintf("role \"%s\" (outbox_dispatcher.role) does not have the privileges of outbox_admin", me);
        W.ext_idle_hint = psprintf("Run GRANT outbox_admin TO %s; the workers start delivering within poll_interval.",
                                 quote_identifier(me));
    }
    else
        W.ext_ready = true;
    MemoryContextSwitchTo(old);
}

void
refresh_endpoints(void)
{
    EndpointRow *rows = nullptr;
    int          nrows = 0;
    int          rc;
    bool         installed;

    begin_tx("loading endpoints");
    check_extension();
    installed = W.ext_ready || W.ext_idle_reason != nullptr;
    if (W.ext_ready)
    {
        rc = SPI_execute(W.schema_version >= 201 ? SQL_ENDPOINTS_V021
                         : W.schema_version >= 200 ? SQL_ENDPOINTS_V020 : SQL_ENDPOINTS_V010, true, 0);
        if (rc != SPI_OK_SELECT)
            elog(ERROR, "outbox_dispatcher: loading endpoints failed: %s", SPI_result_code_string(rc));
        nrows = (int) SPI_processed;
        rows = (EndpointRow *) MemoryContextAllocZero(W.cycle_ctx, sizeof(EndpointRow) * (nrows + 1));
        for (int i = 0; i < nrows; i++)
        {
            HeapTuple     tup = SPI_tuptable->vals[i];
            TupleDesc     desc = SPI_tuptable->tupdesc;
            bool          isnull;
            Datum         d;
            MemoryContext old = MemoryContextSwitchTo(W.cycle_ctx);

            rows[i].relid = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
            rows[i].name = SPI_getvalue(tup, desc, 3);
            d = SPI_getbinval(tup, desc, 2, &isnull);
            if (!isnull)
                rows[i].id = DatumGetInt64(d);
            else
                rows[i].id = (int64) (hash_bytes_extended((const unsigned char *) rows[i].name,
                                                          (int) strlen(rows[i].name), 0) |
                                      (UINT64CONST(1) << 63));
            rows[i].url = SPI_getvalue(tup, desc, 4);
            d = SPI_getbinval(tup, desc, 5, &isnull);
            rows[i].headers = isnull ? pstrdup("") : header_lines_text(d);
            rows[i].secret = SPI_getvalue(tup, desc, 6);
            {
                /* whole milliseconds, rounded up: a sub-millisecond timeout must not become curl's "none" */
                int64 us = od_interval_us(DatumGetIntervalP(SPI_getbinval(tup, desc, 7, &isnull)));

                rows[i].timeout_ms = Max((int64) 1, Min(us, (int64) 86400 * USECS_PER_SEC) / 1000 +
                                                      (us % 1000 != 0 ? 1 : 0));
            }
            rows[i].max_in_flight = DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull));
            d = SPI_getbinval(tup, desc, 9, &isnull);
            if (!isnull)
            {
                ArrayType *arr = DatumGetArrayTypePCopy(d);
                Datum     *elems;
                bool      *nulls;
                int        n;

                deconstruct_array(arr, INT4OID, 4, true, TYPALIGN_INT, &elems, &nulls, &n);
                rows[i].defer = (int *) palloc(sizeof(int) * (n + 1));
                for (int j = 0; j < n; j++)
                    rows[i].defer[rows[i].ndefer++] = nulls[j] ? 0 : DatumGetInt32(elems[j]);
            }
            d = SPI_getbinval(tup, desc, 10, &isnull);
            rows[i].rate_limit = isnull ? 0 : DatumGetFloat8(d);
            rows[i].breaker_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
            rows[i].breaker_cooldown_ms =
                od_interval_us(DatumGetIntervalP(SPI_getbinval(tup, desc, 12, &isnull))) / 1000;
            MemoryContextSwitchTo(old);
        }
    }
    end_tx();

    if (!W.ext_ready)
    {
        if (!W.ext_missing_logged)
        {
            if (installed)
                ereport(WARNING,
                        (errmsg("outbox_dispatcher: not delivering: %s", W.ext_idle_reason),
                         errhint("%s", W.ext_idle_hint)));
            else
                ereport(LOG,
                        (errmsg("outbox_dispatcher: extension is not installed in database \"%s\"; waiting", od_database),
                         errhint("Run CREATE EXTENSION outbox_dispatcher in that database.")));
        }
        W.ext_missing_logged = true;
        return;
    }
    W.ext_missing_logged = false;
    W.disp->begin_endpoints();
    for (int i = 0; i < nrows; i++)
        load_endpoint(&rows[i]);
    W.disp->end_endpoints();

    /* the shared-state slots and limits of the endpoints we serve */
    {
        int64      *keep = (int64 *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int64) * (nrows + 1));
        int         unserved = 0;
        StringInfoData names;
        uint32      before;

        initStringInfo(&names);
        for (int i = 0; i < nrows; i++)
            keep[i] = rows[i].id;
        MemoryContextReset(W.endpoint_ctx);
        W.wendpoints = (WorkerEndpoint *) MemoryContextAllocZero(W.endpoint_ctx, sizeof(WorkerEndpoint) * (nrows + 1));
        W.n_wendpoints = 0;
        for (int i = 0; i < nrows; i++)
        {
            WorkerEndpoint *w = &W.wendpoints[W.n_wendpoints];

            if (!od_endpoint_acquire(rows[i].relid, rows[i].id, rows[i].name, keep, nrows, &w->ref))
            {
                if (unserved < 5)
                    appendStringInfo(&names, "%s\"%s\"", unserved > 0 ? ", " : "", rows[i].name);
                unserved++;
                continue;
            }
            w->name = MemoryContextStrdup(W.endpoint_ctx, rows[i].name);
            w->id = rows[i].id;
            w->lim.max_in_flight = rows[i].max_in_flight;
            w->lim.rate_limit = rows[i].rate_limit;
            w->lim.breaker_threshold = rows[i].breaker_threshold;
            w->lim.breaker_cooldown_us = rows[i].breaker_cooldown_ms * 1000;
            W.n_wendpoints++;
        }
        W.endpoints_stale = false;
        {
            int64 cap = 0;

            for (int i = 0; i < W.n_wendpoints; i++)
                cap = Min((int64) INT_MAX, cap + claim_share(&W.wendpoints[i]));
            W.pipeline_cap = (int) cap;
        }

        /* say so once per change, cluster-wide: the worker that changes the count logs it */
        before = pg_atomic_exchange_u32(&od_shared->endpoints_unserved, (uint32) unserved);
        if (unserved > 0 && before != (uint32) unserved)
            ereport(WARNING,
                    (errmsg("outbox_dispatcher: %d enabled endpoint(s) cannot be served: all %d endpoint slots are in use",
                            unserved, od_shared->max_endpoints),
                     errdetail("Not served: %s%s.", names.data, unserved > 5 ? ", ..." : ""),
                     errhint("Raise outbox_dispatcher.max_endpoints (needs a restart), or disable endpoints that are not needed.")));
        else if (unserved == 0 && before > 0)
            ereport(LOG, (errmsg("outbox_dispatcher: every enabled endpoint is served again")));
    }
}

/* ---------------------------------------------------------------- claim */

/*
 * At most this worker's share of an endpoint's cluster-wide max_in_flight
 * per claim: with a batch above it, the first worker to claim would take
 * every place, and the others (their quota 0, nothing of their own in
 * flight to release) would sit until the next poll — one worker delivering
 * at a time (batch_size 500 drained at 57% of batch_size 100 with 2 workers
 * and 256 places).
 */
int
claim_share(const WorkerEndpoint *w)
{
    if (w->lim.max_in_flight > 0 && od_workers > 1)
        return Max(1, (w->lim.max_in_flight + od_workers - 1) / od_workers);
    return INT_MAX;
}

/*
 * What this worker can usefully hold at once: batch_size, or less when the
 * endpoints' shares add up to less.  The claim and finalize thresholds (half
 * of it) follow, so that a batch_size larger than the shares does not make
 * every finalize wait for results that cannot come.
 */
int
pipeline_size(void)
{
    return (W.pipeline_cap > 0 && W.pipeline_cap < od_batch_size) ? W.pipeline_cap : od_batch_size;
}

}  // namespace odw
