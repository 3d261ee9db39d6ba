/*
 * worker.cpp — the dispatcher background workers.
 *
 * outbox_dispatcher.workers workers are registered at preload time
 * (BgWorkerStart_RecoveryFinished: never on a standby; restarted 1 s after
 * a failure).  Each connects to outbox_dispatcher.database as
 * outbox_dispatcher.role and runs one loop:
 *
 *   claim      one short transaction (transitions.cpp od_claim) when there
 *              is room in the pipeline and a reason to look: a commit woke
 *              us (latch), the last claim came back full, or poll_interval
 *              passed.  Rows are copied out and the transaction commits
 *              before anything is sent.
 *   deliver    outside any transaction: the Dispatcher (core/dispatcher.cpp)
 *              sends every claimed message concurrently through the libcurl
 *              multi socket interface.  We wait on curl's sockets, our latch
 *              and postmaster death in one WaitEventSet, so commits, SIGHUP
 *              and SIGTERM are seen while requests are in flight.
 *   finalize   results are batched into one fenced UPDATE per transaction
 *              (od_finalize) as soon as half a batch is ready, everything in
 *              flight is done, or the oldest result waited 2 ms — fast
 *              results never wait for the slowest request, and the next
 *              claim overlaps deliveries still in flight.
 *
 * Errors: an ERROR in a transaction is caught by the sigsetjmp block in the
 * main function, reported, recorded in the worker's slot, and the loop goes
 * on (unfinalized results are kept and finalized again).  No C++ object
 * with a destructor lives in a frame that can longjmp: the Dispatcher is a
 * heap object reached through a static pointer, and every call into it is
 * noexcept.
 *
 * The workers commit with synchronous_commit = off: a claim or finalize lost
 * in a crash is redone after the lease expires (a duplicate, never a loss).
 *
 * SIGTERM (pg_terminate_backend, shutdown): stop claiming, give requests in
 * flight up to one second, finalize what finished, hand the rest back to
 * pending at once (attempt refunded), exit.
 */
#include "outbox_dispatcher.h"
#include "core/dispatcher.hpp"
#include "core/signing.hpp"
#include "core/validate.hpp"

#include <new>

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

PGDLLEXPORT void od_worker_main(Datum arg);
}

/* ---------------------------------------------------------------- state */

static volatile sig_atomic_t got_sigterm = false;

static int            worker_index = -1;
static OdWorkerSlot  *slot = nullptr;
static od::Dispatcher *disp = nullptr;
static MemoryContext  cycle_ctx = nullptr;
static char          *lease_owner = nullptr;
static WaitEventSet  *wait_set = nullptr;
static bool           ext_ready = false;
static bool           ext_missing_logged = false;
static TimestampTz    oldest_outcome_at = 0;
static bool           schema_v2 = false;        /* extension 0.2.0 or later */

/*
 * The endpoints this worker serves (enabled ones, refreshed every
 * poll_interval), with their shared-memory slot and limits.  held/probe
 * track, per slot, what this worker holds: claimed messages not yet
 * answered (their in-flight places) and a half-open probe.  pending_* is
 * the reservation of a claim in progress, returned if its transaction fails.
 */
typedef struct WorkerEndpoint
{
    char            *name;
    int              slot;
    OdEndpointLimits lim;
} WorkerEndpoint;

static MemoryContext    endpoint_ctx = nullptr;
static WorkerEndpoint  *wendpoints = nullptr;
static int              n_wendpoints = 0;
static OdEndpointLimits lim_by_slot[OD_MAX_ENDPOINTS];
static int              held_by_slot[OD_MAX_ENDPOINTS];
static bool             probe_by_slot[OD_MAX_ENDPOINTS];
static int              pending_slots[OD_MAX_ENDPOINTS];
static int              pending_counts[OD_MAX_ENDPOINTS];
static bool             pending_probes[OD_MAX_ENDPOINTS];
static int              n_pending = 0;
static int              claim_rotation = 0;
static TimestampTz      next_quota_at = 0;      /* a refused reservation may succeed then */
static size_t           outcomes_seen = 0;
static bool             places_released = false;  /* a request finished: a quota may have room again */
static bool             claim_quota_full = false; /* the last claim took every place its quotas allowed */

#define FLUSH_AFTER_MS 2

/* ---------------------------------------------------------------- registration */

void
od_register_workers(void)
{
    BackgroundWorker bgw;

    if (od_workers > OD_MAX_WORKERS)
        od_workers = OD_MAX_WORKERS;
    for (int i = 0; i < od_workers; i++)
    {
        memset(&bgw, 0, sizeof(bgw));
        bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
        bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
        bgw.bgw_restart_time = 1;
        snprintf(bgw.bgw_library_name, BGW_MAXLEN, "outbox_dispatcher");
        snprintf(bgw.bgw_function_name, BGW_MAXLEN, "od_worker_main");
        snprintf(bgw.bgw_name, BGW_MAXLEN, "outbox_dispatcher worker %d", i);
        snprintf(bgw.bgw_type, BGW_MAXLEN, "outbox_dispatcher worker");
        bgw.bgw_main_arg = Int32GetDatum(i);
        bgw.bgw_notify_pid = 0;
        RegisterBackgroundWorker(&bgw);
    }
}

/* ---------------------------------------------------------------- helpers */

static void
od_sigterm(SIGNAL_ARGS)
{
    int save_errno = errno;

    got_sigterm = true;
    SetLatch(MyLatch);
    errno = save_errno;
}

static void
set_state(OdWorkerState st)
{
    pg_atomic_write_u32(&slot->state, (uint32) st);
}

static void
record_error(const char *msg)
{
    SpinLockAcquire(&slot->mutex);
    strlcpy(slot->last_error, msg, sizeof(slot->last_error));
    slot->last_error_at = GetCurrentTimestamp();
    SpinLockRelease(&slot->mutex);
}

static void
release_pending_reservation(void)
{
    for (int i = 0; i < n_pending; i++)
        od_endpoint_unreserve(pending_slots[i], pending_counts[i], pending_probes[i]);
    n_pending = 0;
}

static void
od_worker_exit(int code, Datum arg)
{
    release_pending_reservation();
    for (int i = 0; i < OD_MAX_ENDPOINTS; i++)
    {
        if (held_by_slot[i] > 0)
            od_endpoint_release(i, held_by_slot[i]);
        if (probe_by_slot[i])
            od_endpoint_unreserve(i, 0, true);
        held_by_slot[i] = 0;
        probe_by_slot[i] = false;
    }
    if (slot)
    {
        slot->latch = nullptr;
        slot->pid = 0;
        set_state(OD_STATE_STOPPED);
        pg_atomic_write_u32(&slot->in_flight, 0);
    }
}

static int64
unix_seconds(TimestampTz ts)
{
    return (int64) (ts / USECS_PER_SEC) + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

static int64
unix_micros(TimestampTz ts)
{
    return ts + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

static void
begin_tx(const char *activity)
{
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
}

static void
end_tx(void)
{
    SPI_finish();
    PopActiveSnapshot();
    CommitTransactionCommand();
    pgstat_report_activity(STATE_IDLE, NULL);
    MemoryContextSwitchTo(cycle_ctx);
}

/* "Name: value\n..." for a jsonb object of strings (validated on write). */
static char *
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

static void
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

/* ---------------------------------------------------------------- settings */

static void
apply_settings(void)
{
    od::DispatcherSettings s;   /* trivially safe: built and handed over without PG calls */
    char                   srcbuf[NAMEDATALEN + 64];

    if (od_source && od_source[0])
        strlcpy(srcbuf, od_source, sizeof(srcbuf));
    else
        snprintf(srcbuf, sizeof(srcbuf), "/postgresql/%s/outbox", od_database);
    try
    {
        s.source = srcbuf;
    }
    catch (...)
    {
    }
    s.max_attempts = od_max_attempts;
    s.backoff.base_ms = od_backoff_base_ms;
    s.backoff.cap_ms = od_backoff_cap_ms;
    s.defer_delay_ms = od_defer_delay_ms;
    s.max_retry_after_s = Max((int64) od_backoff_cap_ms / 1000, (int64) od_max_defer_age_s);
    disp->set_settings(s);
}

/* ---------------------------------------------------------------- endpoints */

typedef struct EndpointRow
{
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
        disp->add_endpoint(e);
    }
    catch (...)
    {
    }
}

static void
refresh_endpoints(void)
{
    EndpointRow *rows = nullptr;
    int          nrows = 0;
    int          rc;

    begin_tx("loading endpoints");
    rc = SPI_execute("SELECT extversion <> '0.1.0' FROM pg_catalog.pg_extension WHERE extname = 'outbox_dispatcher'",
                     true, 1);
    ext_ready = (rc == SPI_OK_SELECT && SPI_processed == 1);
    if (ext_ready)
    {
        bool isnull;

        schema_v2 = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
        /* 0.1.0 (before ALTER EXTENSION ... UPDATE) has no limits columns: use the defaults */
        rc = SPI_execute(schema_v2
                         ? "SELECT name, url, headers, signing_secret,"
                           "       (extract(epoch FROM timeout) * 1000)::bigint, max_in_flight, defer_statuses,"
                           "       coalesce(rate_limit, 0)::float8, breaker_threshold,"
                           "       (extract(epoch FROM breaker_cooldown) * 1000)::bigint"
                           "  FROM outbox.endpoints WHERE enabled"
                         : "SELECT name, url, headers, signing_secret,"
                           "       (extract(epoch FROM timeout) * 1000)::bigint, max_in_flight, defer_statuses,"
                           "       0::float8, 5, 30000::bigint"
                           "  FROM outbox.endpoints WHERE enabled", true, 0);
        if (rc != SPI_OK_SELECT)
            elog(ERROR, "outbox_dispatcher: loading endpoints failed: %s", SPI_result_code_string(rc));
        nrows = (int) SPI_processed;
        rows = (EndpointRow *) MemoryContextAllocZero(cycle_ctx, sizeof(EndpointRow) * (nrows + 1));
        for (int i = 0; i < nrows; i++)
        {
            HeapTuple     tup = SPI_tuptable->vals[i];
            TupleDesc     desc = SPI_tuptable->tupdesc;
            bool          isnull;
            Datum         d;
            MemoryContext old = MemoryContextSwitchTo(cycle_ctx);

            rows[i].name = SPI_getvalue(tup, desc, 1);
            rows[i].url = SPI_getvalue(tup, desc, 2);
            d = SPI_getbinval(tup, desc, 3, &isnull);
            rows[i].headers = isnull ? pstrdup("") : header_lines_text(d);
            rows[i].secret = SPI_getvalue(tup, desc, 4);
            rows[i].timeout_ms = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
            rows[i].max_in_flight = DatumGetInt32(SPI_getbinval(tup, desc, 6, &isnull));
            d = SPI_getbinval(tup, desc, 7, &isnull);
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
            rows[i].rate_limit = DatumGetFloat8(SPI_getbinval(tup, desc, 8, &isnull));
            rows[i].breaker_threshold = DatumGetInt32(SPI_getbinval(tup, desc, 9, &isnull));
            rows[i].breaker_cooldown_ms = DatumGetInt64(SPI_getbinval(tup, desc, 10, &isnull));
            MemoryContextSwitchTo(old);
        }
    }
    end_tx();

    if (!ext_ready)
    {
        if (!ext_missing_logged)
            ereport(LOG,
                    (errmsg("outbox_dispatcher: extension is not installed in database \"%s\"; waiting", od_database),
                     errhint("Run CREATE EXTENSION outbox_dispatcher in that database.")));
        ext_missing_logged = true;
        return;
    }
    ext_missing_logged = false;
    disp->begin_endpoints();
    for (int i = 0; i < nrows; i++)
        load_endpoint(&rows[i]);
    disp->end_endpoints();

    /* the shared-state slots and limits of the endpoints we serve */
    MemoryContextReset(endpoint_ctx);
    wendpoints = (WorkerEndpoint *) MemoryContextAllocZero(endpoint_ctx, sizeof(WorkerEndpoint) * (nrows + 1));
    n_wendpoints = 0;
    for (int i = 0; i < nrows; i++)
    {
        WorkerEndpoint *w = &wendpoints[n_wendpoints];

        w->slot = od_endpoint_slot(rows[i].name);
        if (w->slot < 0)
        {
            ereport(WARNING,
                    (errmsg("outbox_dispatcher: more than %d endpoints; endpoint \"%s\" is not served",
                            OD_MAX_ENDPOINTS, rows[i].name)));
            continue;
        }
        w->name = MemoryContextStrdup(endpoint_ctx, rows[i].name);
        w->lim.max_in_flight = rows[i].max_in_flight;
        w->lim.rate_limit = rows[i].rate_limit;
        w->lim.breaker_threshold = rows[i].breaker_threshold;
        w->lim.breaker_cooldown_us = rows[i].breaker_cooldown_ms * 1000;
        lim_by_slot[w->slot] = w->lim;
        n_wendpoints++;
    }
}


/* ---------------------------------------------------------------- claim */

typedef struct ClaimRow
{
    int64   id;
    int64   lease_version;
    int     attempts;
    char   *endpoint;
    char   *aggregate_type;
    char   *aggregate_id;
    char   *event_type;
    char   *payload;
    char   *headers;
    int64   created_at_us;
    int     endpoint_slot;
} ClaimRow;

static bool
queue_claimed(const ClaimRow *r) noexcept
{
    try
    {
        od::ClaimedMessage m;

        m.id = r->id;
        m.lease_version = r->lease_version;
        m.attempts = r->attempts;
        m.endpoint = r->endpoint;
        m.aggregate_type = r->aggregate_type;
        m.aggregate_id = r->aggregate_id;
        m.event_type = r->event_type;
        m.body = r->payload;
        split_lines(r->headers, m.header_lines);
        m.created_at_unix_us = r->created_at_us;
        m.endpoint_tag = r->endpoint_slot;
        return disp->add(std::move(m));
    }
    catch (...)
    {
        return false;
    }
}

/*
 * Claim up to capacity messages.  Each endpoint's share is reserved in
 * shared memory first (breaker, cluster-wide max_in_flight, rate limit);
 * the order of the endpoints rotates from claim to claim, so that one
 * endpoint's backlog cannot starve the others.
 */
static int
do_claim(int capacity)
{
    ClaimRow    *rows;
    int          n;
    uint64       reaped;
    bool         unknown_endpoint = false;
    const char **names;
    int         *quotas;
    int         *got;
    int          m = n_wendpoints;
    int          total = 0;
    TimestampTz  now = GetCurrentTimestamp();

    names = (const char **) MemoryContextAllocZero(cycle_ctx, sizeof(char *) * (m + 1));
    quotas = (int *) MemoryContextAllocZero(cycle_ctx, sizeof(int) * (m + 1));
    got = (int *) MemoryContextAllocZero(cycle_ctx, sizeof(int) * (m + 1));
    next_quota_at = 0;
    n_pending = 0;
    for (int k = 0; k < m; k++)
    {
        WorkerEndpoint *w = &wendpoints[(claim_rotation + k) % m];
        bool            probe;
        TimestampTz     retry_at;
        int             q = od_endpoint_reserve(w->slot, &w->lim, capacity, now, &probe, &retry_at);

        names[k] = w->name;
        /* 0 still lets the endpoint's expired leases be taken over; -1 (breaker open) does not */
        quotas[k] = (q == 0 && !probe && od_endpoint_breaker_open(w->slot)) ? -1 : q;
        total += q;
        if (q == 0 && retry_at != 0 && (next_quota_at == 0 || retry_at < next_quota_at))
            next_quota_at = retry_at;
        pending_slots[n_pending] = w->slot;
        pending_counts[n_pending] = q;
        pending_probes[n_pending] = probe;
        n_pending++;
    }
    claim_rotation = m > 0 ? (claim_rotation + 1) % m : 0;
    places_released = false;
    if (m == 0)
        return 0;               /* no enabled endpoint */
    /* with every quota at 0 the claim still takes over expired leases */

    set_state(OD_STATE_CLAIMING);
    begin_tx("claiming messages");
    reaped = od_claim(lease_owner, capacity, (int64) od_lease_ms * 1000, od_max_attempts, names, quotas, m);
    n = (int) SPI_processed;
    rows = (ClaimRow *) MemoryContextAllocZero(cycle_ctx, sizeof(ClaimRow) * (n + 1));
    for (int i = 0; i < n; i++)
    {
        HeapTuple     tup = SPI_tuptable->vals[i];
        TupleDesc     desc = SPI_tuptable->tupdesc;
        bool          isnull;
        Datum         d;
        MemoryContext old = MemoryContextSwitchTo(cycle_ctx);

        rows[i].id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
        rows[i].lease_version = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
        rows[i].attempts = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
        rows[i].endpoint = SPI_getvalue(tup, desc, 4);
        rows[i].aggregate_type = SPI_getvalue(tup, desc, 5);
        rows[i].aggregate_id = SPI_getvalue(tup, desc, 6);
        rows[i].event_type = SPI_getvalue(tup, desc, 7);
        rows[i].payload = SPI_getvalue(tup, desc, 8);
        d = SPI_getbinval(tup, desc, 9, &isnull);
        rows[i].headers = isnull ? pstrdup("") : header_lines_text(d);
        rows[i].created_at_us = unix_micros(DatumGetTimestampTz(SPI_getbinval(tup, desc, 11, &isnull)));
        MemoryContextSwitchTo(old);
    }
    end_tx();

    /* settle the reservation: keep what was claimed, return the rest */
    for (int i = 0; i < n; i++)
    {
        rows[i].endpoint_slot = -1;
        for (int k = 0; k < m; k++)
            if (strcmp(names[k], rows[i].endpoint) == 0)
            {
                got[k]++;
                rows[i].endpoint_slot = pending_slots[k];
                break;
            }
    }
    for (int k = 0; k < m; k++)
    {
        int s = pending_slots[k];

        int q = Max(quotas[k], 0);

        if (got[k] < q)
            od_endpoint_unreserve(s, q - got[k], pending_probes[k] && got[k] == 0);
        else if (got[k] > q)
            od_endpoint_hold(s, got[k] - q);            /* expired leases taken over */
        held_by_slot[s] += got[k];
        if (pending_probes[k] && got[k] > 0)
            probe_by_slot[s] = true;
    }
    n_pending = 0;
    /* an endpoint used its whole quota: it may have more to claim */
    claim_quota_full = false;
    for (int k = 0; k < m; k++)
        if (quotas[k] > 0 && got[k] >= quotas[k])
            claim_quota_full = true;

    pg_atomic_fetch_add_u64(&slot->claimed, n);
    pg_atomic_fetch_add_u64(&slot->reaped, reaped);
    pg_atomic_fetch_add_u64(&slot->dead, reaped);

    for (int i = 0; i < n && !unknown_endpoint; i++)
        unknown_endpoint = !disp->has_endpoint(rows[i].endpoint);
    if (unknown_endpoint)
        refresh_endpoints();    /* an endpoint created since the last refresh */
    for (int i = 0; i < n; i++)
        if (!queue_claimed(&rows[i]))
            record_error("out of memory while queueing a claimed message");
    return n;
}

/* ---------------------------------------------------------------- results */

/*
 * For every outcome not seen yet: release its in-flight place and tell the
 * endpoint's shared state how it went (breaker, statistics).
 */
static void
process_new_outcomes(void)
{
    std::vector<od::DeliveryOutcome> &outs = disp->outcomes();
    TimestampTz now = GetCurrentTimestamp();

    for (; outcomes_seen < outs.size(); outcomes_seen++)
    {
        const od::DeliveryOutcome &o = outs[outcomes_seen];
        int         s = o.endpoint_tag;
        bool        probe;
        OdEndpointResult r;

        if (s < 0 || s >= OD_MAX_ENDPOINTS)
            continue;
        od_endpoint_release(s, 1);
        places_released = true;
        if (held_by_slot[s] > 0)
            held_by_slot[s]--;
        probe = probe_by_slot[s];
        probe_by_slot[s] = false;
        if (o.latency_ms < 0)
        {
            /* never sent (released at shutdown, or not sendable): not the endpoint's doing */
            if (probe)
                od_endpoint_unreserve(s, 0, true);
            continue;
        }
        if (o.verdict == od::Verdict::Done)
            r = OD_RESULT_SUCCESS;
        else if (o.verdict == od::Verdict::Retry || (o.verdict == od::Verdict::Dead && o.http_status == 0))
            r = OD_RESULT_FAILURE;      /* retryable, or retries exhausted on a transport error */
        else if (o.verdict == od::Verdict::Dead && o.http_status >= 500)
            r = OD_RESULT_FAILURE;      /* retries exhausted on 5xx */
        else
            r = OD_RESULT_NEUTRAL;
        od_endpoint_result(s, &lim_by_slot[s], r, o.http_status, o.latency_ms, o.error, probe, now);
    }
}

/* ---------------------------------------------------------------- finalize */

static void
note_latency(double ms)
{
    uint64 us = ms <= 0 ? 0 : (uint64) (ms * 1000.0);
    int    b = 0;

    while (b < OD_LATENCY_BUCKETS - 1 && us >= (UINT64CONST(1) << b))
        b++;
    pg_atomic_fetch_add_u64(&slot->latency_buckets[b], 1);
    pg_atomic_fetch_add_u64(&slot->latency_count, 1);
    pg_atomic_fetch_add_u64(&slot->latency_sum_us, us);
    if (us > pg_atomic_read_u64(&slot->latency_max_us))
        pg_atomic_write_u64(&slot->latency_max_us, us);
}

static void
do_finalize(void)
{
    std::vector<od::DeliveryOutcome> &outs = disp->outcomes();
    int          n = (int) outs.size();
    OdFinalize  *items;
    const char **gone;
    int          n_gone = 0;

    if (n == 0)
        return;
    process_new_outcomes();
    gone = (const char **) MemoryContextAllocZero(cycle_ctx, sizeof(char *) * n);
    items = (OdFinalize *) MemoryContextAllocZero(cycle_ctx, sizeof(OdFinalize) * n);
    for (int i = 0; i < n; i++)
    {
        const od::DeliveryOutcome &o = outs[i];
        OdFinalize *it = &items[i];

        it->id = o.id;
        it->lease_version = o.lease_version;
        switch (o.verdict)
        {
            case od::Verdict::Done: it->verdict = OD_DONE; break;
            case od::Verdict::Retry: it->verdict = OD_RETRY; break;
            case od::Verdict::Defer: it->verdict = OD_DEFER; break;
            case od::Verdict::Dead: it->verdict = OD_DEAD; break;
        }
        it->delay_us = o.delay_ms * 1000;
        it->refund = o.refund;
        it->error = o.error[0] ? MemoryContextStrdup(cycle_ctx, o.error) : nullptr;
        it->http_status = (o.http_status >= 100 && o.http_status <= 599) ? o.http_status : 0;

        /*
         * 410 Gone: the endpoint says it is gone for good.  Disable it (an
         * operator re-enables it) and put the message back, attempt refunded,
         * instead of killing it.
         */
        if (o.http_status == 410 && o.endpoint_tag >= 0 && o.endpoint_tag < OD_MAX_ENDPOINTS)
        {
            it->verdict = OD_RETRY;
            it->refund = true;
            it->delay_us = (int64) od_defer_delay_ms * 1000;
            it->error = "HTTP 410 Gone: the endpoint was disabled";
            /* the full name: the slot keeps only its first OD_ENDPOINT_NAME - 1 bytes */
            gone[n_gone] = od_shared->endpoints[o.endpoint_tag].name;
            for (int k = 0; k < n_wendpoints; k++)
                if (wendpoints[k].slot == o.endpoint_tag)
                {
                    gone[n_gone] = wendpoints[k].name;
                    break;
                }
            gone[n_gone] = MemoryContextStrdup(cycle_ctx, gone[n_gone]);
            n_gone++;
        }
    }

    set_state(OD_STATE_FINALIZING);
    begin_tx("finalizing deliveries");
    od_finalize(items, n);
    for (int i = 0; i < n_gone; i++)
    {
        Oid   types[2] = {TEXTOID, TEXTOID};
        Datum args[2] = {CStringGetTextDatum(gone[i]),
                         CStringGetTextDatum("HTTP 410 Gone received by the dispatcher")};
        int   rc = SPI_execute_with_args(schema_v2
                                         ? "UPDATE outbox.endpoints SET enabled = false, disabled_reason = $2"
                                           " WHERE name = $1 AND enabled"
                                         : "UPDATE outbox.endpoints SET enabled = false"
                                           " WHERE name = $1 AND enabled AND $2 IS NOT NULL",
                                         2, types, args, nullptr, false, 0);

        if (rc != SPI_OK_UPDATE)
            elog(ERROR, "outbox_dispatcher: disabling endpoint \"%s\" failed: %s", gone[i],
                 SPI_result_code_string(rc));
        if (SPI_processed > 0)
            ereport(LOG,
                    (errmsg("outbox_dispatcher: endpoint \"%s\" answered 410 Gone and was disabled", gone[i]),
                     errhint("Fix the endpoint, then run SELECT outbox.resume_endpoint('%s').", gone[i])));
    }
    end_tx();

    for (int i = 0; i < n; i++)
    {
        const OdFinalize *it = &items[i];

        if (outs[i].latency_ms >= 0)
            note_latency(outs[i].latency_ms);
        if (!it->applied)
        {
            pg_atomic_fetch_add_u64(&slot->lost_leases, 1);
            continue;
        }
        switch (it->verdict)
        {
            case OD_DONE: pg_atomic_fetch_add_u64(&slot->delivered, 1); break;
            case OD_RETRY: pg_atomic_fetch_add_u64(&slot->retried, 1); break;
            case OD_DEFER: pg_atomic_fetch_add_u64(&slot->deferred, 1); break;
            case OD_DEAD: pg_atomic_fetch_add_u64(&slot->dead, 1); break;
        }
        if (it->verdict != OD_DONE && it->error)
            record_error(it->error);
    }
    outs.clear();
    outcomes_seen = 0;
    oldest_outcome_at = 0;
}

/* ---------------------------------------------------------------- waiting */

static void
rebuild_wait_set(void)
{
    const std::vector<od::HttpSocket> &socks = disp->engine().sockets();

    if (wait_set)
        FreeWaitEventSet(wait_set);
    wait_set = CreateWaitEventSet(TopMemoryContext, (int) socks.size() + 2);
    AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    for (const od::HttpSocket &s : socks)
    {
        uint32 ev = (s.want_read ? WL_SOCKET_READABLE : 0) | (s.want_write ? WL_SOCKET_WRITEABLE : 0);

        AddWaitEventToSet(wait_set, ev, s.fd, nullptr, nullptr);
    }
}

/* Wait up to timeout_ms for sockets or the latch; returns true if the latch was set. */
static bool
wait_for_events(long timeout_ms)
{
    WaitEvent events[64];
    int       nev;
    bool      woken = false;
    long      curl_ms = disp->engine().timeout_ms();

    if (curl_ms == 0)
    {
        disp->engine().on_timeout();
        curl_ms = disp->engine().timeout_ms();
    }
    if (curl_ms >= 0 && (timeout_ms < 0 || curl_ms < timeout_ms))
        timeout_ms = curl_ms;
    if (disp->engine().completed() > 0)
        timeout_ms = 0;     /* transfers finished while being kicked: do not sleep on them */
    if (disp->engine().sockets_changed() || wait_set == nullptr)
        rebuild_wait_set();

    nev = WaitEventSetWait(wait_set, timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);

    for (int i = 0; i < nev; i++)
    {
        if (events[i].events & WL_LATCH_SET)
        {
            ResetLatch(MyLatch);
            woken = true;
        }
        else if (events[i].events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
            disp->engine().on_socket(events[i].fd, (events[i].events & WL_SOCKET_READABLE) != 0,
                                     (events[i].events & WL_SOCKET_WRITEABLE) != 0);
    }
    if (disp->engine().timeout_ms() == 0)
        disp->engine().on_timeout();
    return woken;
}

/* ---------------------------------------------------------------- shutdown */

static void
shutdown_worker(void)
{
    TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);

    ereport(LOG, (errmsg("outbox_dispatcher worker %d: shutting down with %zu request(s) in flight",
                         worker_index, disp->in_flight())));
    while (disp->in_flight() > 0 && GetCurrentTimestamp() < deadline)
    {
        wait_for_events(50);
        disp->collect(unix_seconds(GetCurrentTimestamp()));
    }
    disp->abandon(unix_seconds(GetCurrentTimestamp()),
                  "worker stopped before delivery finished; released for another worker");
    process_new_outcomes();
    if (ext_ready)
        do_finalize();
    proc_exit(1);   /* non-zero: the postmaster restarts us unless it is shutting down */
}

/* ---------------------------------------------------------------- main */

extern "C" void
od_worker_main(Datum arg)
{
    sigjmp_buf  local_sigjmp_buf;
    TimestampTz next_poll = 0;
    TimestampTz next_refresh = 0;
    TimestampTz next_purge = 0;
    TimestampTz retry_not_before = 0;
    bool        woken = true;
    bool        last_claim_full = false;

    worker_index = DatumGetInt32(arg);
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, od_sigterm);
    BackgroundWorkerUnblockSignals();

    if (od_shared == nullptr || worker_index < 0 || worker_index >= OD_MAX_WORKERS)
        ereport(FATAL, (errmsg("outbox_dispatcher: shared memory is not initialized")));
    slot = &od_shared->workers[worker_index];
    slot->pid = MyProcPid;
    slot->latch = MyLatch;
    slot->started_at = GetCurrentTimestamp();
    set_state(OD_STATE_STARTING);
    before_shmem_exit(od_worker_exit, (Datum) 0);

    if (od_role == nullptr || od_role[0] == '\0')
    {
        if (worker_index == 0)
            ereport(WARNING,
                    (errmsg("outbox_dispatcher: workers run as the bootstrap superuser"),
                     errhint("Set outbox_dispatcher.role to a dedicated role that is a member of outbox_admin.")));
        BackgroundWorkerInitializeConnection(od_database, nullptr, 0);
    }
    else
        BackgroundWorkerInitializeConnection(od_database, od_role, 0);

    /*
     * The workers' own commits need not wait for the WAL flush: losing the
     * last claims or finalizes in a server crash only means those messages
     * are delivered again after their lease expires (at least once holds);
     * no committed message can be lost, since producers' commits are theirs.
     */
    SetConfigOption("synchronous_commit", "off", PGC_USERSET, PGC_S_OVERRIDE);
    SetConfigOption("application_name", MyBgworkerEntry->bgw_name, PGC_USERSET, PGC_S_OVERRIDE);

    lease_owner = MemoryContextStrdup(TopMemoryContext,
                                      psprintf("worker-%d/pid-%d", worker_index, MyProcPid));
    cycle_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher cycle", ALLOCSET_DEFAULT_SIZES);
    endpoint_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher endpoints", ALLOCSET_SMALL_SIZES);

    disp = new (std::nothrow) od::Dispatcher();
    if (disp == nullptr)
        ereport(FATAL, (errmsg("outbox_dispatcher: out of memory")));
    {
        od::HttpEngineOptions opts;

        opts.ca_file = (od_ca_file && od_ca_file[0]) ? od_ca_file : nullptr;
        if (!disp->init(opts, (uint64) MyProcPid * 6364136223846793005ULL ^ (uint64) GetCurrentTimestamp()))
            ereport(FATAL, (errmsg("outbox_dispatcher: cannot initialize libcurl: %s", disp->last_error())));
    }
    apply_settings();

    if (sigsetjmp(local_sigjmp_buf, 1) != 0)
    {
        ErrorData *edata;

        error_context_stack = NULL;
        HOLD_INTERRUPTS();
        MemoryContextSwitchTo(TopMemoryContext);
        edata = CopyErrorData();
        record_error(edata->message);
        EmitErrorReport();
        AbortOutOfAnyTransaction();
        release_pending_reservation();
        FlushErrorState();
        FreeErrorData(edata);
        pgstat_report_activity(STATE_IDLE, NULL);
        RESUME_INTERRUPTS();
        /* back off one second before the next claim or finalize */
        retry_not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);
        next_refresh = 0;
    }
    PG_exception_stack = &local_sigjmp_buf;

    for (;;)
    {
        TimestampTz now;
        long        timeout = -1;
        int         batch;

        MemoryContextSwitchTo(cycle_ctx);
        MemoryContextReset(cycle_ctx);

        if (got_sigterm)
            shutdown_worker();
        if (ConfigReloadPending)
        {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            apply_settings();
            next_refresh = 0;
            woken = true;
        }

        now = GetCurrentTimestamp();
        pg_atomic_fetch_add_u64(&slot->cycles, 1);
        /* a wake while the extension is missing may mean CREATE EXTENSION just committed */
        if (now >= retry_not_before && (now >= next_refresh || (woken && !ext_ready)))
        {
            refresh_endpoints();
            next_refresh = TimestampTzPlusMilliseconds(now, od_poll_interval_ms);
        }

        /* claim when there is room and a reason to look */
        batch = od_batch_size;
        if (ext_ready && od_enabled && now >= retry_not_before && !got_sigterm)
        {
            /* everything we hold is still 'processing': queued, in flight, or
             * finished but not yet finalized */
            int outstanding = (int) (disp->outstanding() + disp->outcomes().size());
            int room = batch - outstanding;

            if (room >= Max(1, batch / 2) &&
                (woken || last_claim_full || now >= next_poll || (next_quota_at != 0 && now >= next_quota_at) ||
                 (places_released && claim_quota_full)))
            {
                int n;

                woken = false;
                n = do_claim(room);
                last_claim_full = (n == room) || claim_quota_full;
                next_poll = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), od_poll_interval_ms);
            }
        }
        else if (ext_ready && !od_enabled)
            set_state(OD_STATE_PAUSED);

        now = GetCurrentTimestamp();
        if (!got_sigterm)       /* stopping: send nothing new */
            disp->pump(unix_seconds(now));
        pg_atomic_write_u32(&slot->in_flight, (uint32) disp->in_flight());

        /* finalize: half a batch ready, nothing left in flight, or results waiting too long */
        if (!disp->outcomes().empty() && now >= retry_not_before)
        {
            if (oldest_outcome_at == 0)
                oldest_outcome_at = now;
            if ((int) disp->outcomes().size() >= Max(1, batch / 2) || disp->in_flight() == 0 ||
                now >= TimestampTzPlusMilliseconds(oldest_outcome_at, FLUSH_AFTER_MS))
                do_finalize();
        }

        /* retention: worker 0 purges old done rows in small batches */
        if (worker_index == 0 && ext_ready && od_retention_s > 0 && now >= next_purge && now >= retry_not_before)
        {
            uint64 purged;

            begin_tx("purging done messages");
            purged = od_purge((int64) od_retention_s * USECS_PER_SEC, 1000);
            end_tx();
            next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), purged == 1000 ? 100 : 10000);
        }

        /* how long may we sleep? */
        now = GetCurrentTimestamp();
        if (disp->in_flight() > 0)
            set_state(OD_STATE_DELIVERING);
        else if (od_enabled)
            set_state(OD_STATE_IDLE);
        {
            bool can_claim = ext_ready && od_enabled &&
                (od_batch_size - (int) (disp->outstanding() + disp->outcomes().size())) >= Max(1, od_batch_size / 2);
            TimestampTz until = next_refresh;

            if (can_claim)
                until = Min(until, last_claim_full ? now : next_poll);
            if (can_claim && next_quota_at != 0)
                until = Min(until, next_quota_at);
            if (!disp->outcomes().empty())
                until = Min(until, TimestampTzPlusMilliseconds(oldest_outcome_at, FLUSH_AFTER_MS));
            if (worker_index == 0 && ext_ready && od_retention_s > 0)
                until = Min(until, next_purge);
            if (now < retry_not_before)
                until = Max(until, retry_not_before);
            timeout = until <= now ? 0 : (long) ((until - now + 999) / 1000);
        }

        /* idle: nothing queued, in flight or to finalize — wakes may pick us alone */
        if (timeout != 0 && disp->outstanding() == 0 && disp->outcomes().empty())
            pg_atomic_write_u32(&slot->idle, 1);
        if (wait_for_events(timeout))
            woken = true;
        pg_atomic_write_u32(&slot->idle, 0);
        CHECK_FOR_INTERRUPTS();
        disp->collect(unix_seconds(GetCurrentTimestamp()));
        process_new_outcomes();
    }
}
