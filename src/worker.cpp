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
 *              (od_finalize) as soon as half a batch is ready or the oldest
 *              result waited 2 ms — fast results never wait for the slowest
 *              request, and the next claim overlaps deliveries still in
 *              flight; a claim within those 2 ms finalizes them first, in
 *              its own transaction.
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
#include "pg_compat.h"
#include "core/dispatcher.hpp"
#include "core/schedule.hpp"
#include "core/signing.hpp"
#include "core/validate.hpp"

#include <new>

#include <sys/resource.h>

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
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

/*
 * The endpoints this worker serves (enabled ones, refreshed every
 * poll_interval), with their shared-memory slot reference and limits.
 */
typedef struct WorkerEndpoint
{
    char            *name;
    int64            id;            /* stable key of the shared state */
    OdEndpointRef    ref;
    OdEndpointLimits lim;
} WorkerEndpoint;

/*
 * What this worker holds in each shared endpoint slot (an array of
 * outbox_dispatcher.max_endpoints entries, indexed by slot): claimed
 * messages not yet answered (their in-flight places, which also keep the
 * slot from being reclaimed) and the id of the message that is the
 * endpoint's half-open probe.  ref/lim are those of the last claim.
 */
typedef struct SlotHold
{
    OdEndpointRef    ref;
    OdEndpointLimits lim;
    int              held;
    int64            probe_id;      /* 0: none */
} SlotHold;

/* The reservation of a claim in progress, returned if its transaction fails. */
typedef struct PendingReservation
{
    OdEndpointRef    ref;
    OdEndpointLimits lim;
    int              count;
    bool             probe;
} PendingReservation;

static int              claim_share(const WorkerEndpoint *w);

#define FLUSH_AFTER_MS 2

/*
 * The loop's own deadlines and reasons to claim.  File-level rather than
 * locals of od_worker_main: the error recovery after sigsetjmp changes them.
 */
typedef struct LoopSchedule
{
    TimestampTz next_poll;          /* the fallback poll */
    TimestampTz next_refresh;       /* reload of the endpoints; 0 = at once */
    TimestampTz next_purge;         /* worker 0's retention purge */
    TimestampTz backoff_until;      /* after an error: no claim or finalize before */
    bool        woken;              /* the latch was set since the last claim */
    bool        last_claim_full;    /* the last claim took all it asked for */
} LoopSchedule;

/*
 * All of this process's state, in one place.  A file-level variable (not a
 * local of od_worker_main) because the error recovery after sigsetjmp
 * reads and changes it.
 */
typedef struct OdWorker
{
    /* who we are */
    int             worker_index;
    OdWorkerSlot   *slot;               /* our slot in shared memory */
    char           *lease_owner;        /* "worker-<n>/pid-<pid>", written into leases */

    /* what we run on */
    od::Dispatcher *disp;               /* the HTTP side: queues, requests in flight, outcomes */
    MemoryContext   cycle_ctx;          /* reset at the top of every loop iteration */
    WaitEventSet   *wait_set;           /* latch, postmaster death and the engine's sockets */
    size_t          transfer_budget;    /* transfers at once (file descriptors); 0 = no cap */

    /* the installed extension */
    bool            ext_ready;          /* installed, a schema we serve, and we may use it */
    bool            ext_missing_logged;
    int             schema_version;     /* 100 = 0.1.0, 200 = 0.2.0, 201 = 0.2.1, 202 = 0.2.2 */
    char           *ext_idle_reason;    /* why the installed extension is not served */
    char           *ext_idle_hint;

    /* the endpoints we serve (enabled ones, refreshed every poll_interval) */
    MemoryContext   endpoint_ctx;
    WorkerEndpoint *wendpoints;
    int             n_wendpoints;
    int             pipeline_cap;       /* messages worth holding at once; 0 = batch_size */
    bool            endpoints_stale;    /* a slot changed hands: refresh */

    /* the ledger: places held in the shared endpoint slots */
    SlotHold       *holds;              /* indexed by slot, n_holds = max_endpoints */
    int             n_holds;
    PendingReservation *pending;        /* the claim in progress (in cycle_ctx), n_pending entries */
    int             n_pending;
    int             claim_rotation;     /* which endpoint a claim asks first */
    TimestampTz     next_quota_at;      /* a refused reservation may succeed then; 0 = none */
    bool            places_released;    /* a request finished: a quota may have room again */
    bool            claim_quota_full;   /* the last claim took every place its quotas allowed */

    /* results waiting to be finalized */
    TimestampTz     oldest_outcome_at;  /* 0 = not noted yet */
    size_t          outcomes_seen;
    bool            stats_pending;      /* committed since the last forced statistics flush */

    LoopSchedule    sched;
} OdWorker;

static OdWorker W;

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

/*
 * File descriptors: every request in flight holds a socket (and a resolver
 * may hold two more while it runs).  Raise the soft limit to the hard limit,
 * as a network server would, and return how many transfers this worker may
 * run at once without starving PostgreSQL's own files
 * (max_files_per_process of them) — 0 for no limit beyond batch_size.
 */
static size_t
raise_fd_limit(void)
{
    struct rlimit rl;
    long          spare;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max)
    {
        struct rlimit raised = rl;

        raised.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            rl = raised;
    }
    if (rl.rlim_cur == RLIM_INFINITY)
        return 0;
    spare = (long) rl.rlim_cur - (long) max_files_per_process - 64;
    return (size_t) Max(8L, spare / 3);
}

static void
set_state(OdWorkerState st)
{
    pg_atomic_write_u32(&W.slot->state, (uint32) st);
}

static void
record_error(const char *msg)
{
    SpinLockAcquire(&W.slot->mutex);
    strlcpy(W.slot->last_error, msg, sizeof(W.slot->last_error));
    W.slot->last_error_at = GetCurrentTimestamp();
    SpinLockRelease(&W.slot->mutex);
}

static void
release_pending_reservation(void)
{
    for (int i = 0; i < W.n_pending; i++)
        od_endpoint_unreserve(W.pending[i].ref, W.pending[i].count, W.pending[i].probe);
    W.n_pending = 0;
}

static void
od_worker_exit(int code, Datum arg)
{
    release_pending_reservation();
    for (int i = 0; i < W.n_holds; i++)
    {
        if (W.holds[i].held > 0)
            od_endpoint_release(W.holds[i].ref, W.holds[i].held);
        if (W.holds[i].probe_id != 0)
            od_endpoint_unreserve(W.holds[i].ref, 0, true);
        W.holds[i].held = 0;
        W.holds[i].probe_id = 0;
    }
    if (W.slot)
    {
        W.slot->latch = nullptr;
        W.slot->pid = 0;
        set_state(OD_STATE_STOPPED);
        pg_atomic_write_u32(&W.slot->in_flight, 0);
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
    /*
     * Table statistics (n_tup_upd, n_dead_tup, ...) reach the shared stats
     * only when a backend reports them: without this, autovacuum and every
     * monitoring tool would not see the workers' updates and deletes until
     * a worker exits.  Not forced: flushed at most once a second here, and
     * for sure when the worker goes idle (see the main loop).
     */
    pgstat_report_stat(false);
    W.stats_pending = true;
    pgstat_report_activity(STATE_IDLE, NULL);
    MemoryContextSwitchTo(W.cycle_ctx);
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

/*
 * Why a message's headers cannot be sent, or NULL: more than
 * outbox_dispatcher.max_headers of them, or more than max_header_bytes of
 * names and values.  The trigger refuses such rows; this catches rows
 * written before a limit was lowered, before the limits existed, or by a
 * superuser with the trigger disabled — without building the text first.
 */
static const char *
message_headers_problem(Datum d)
{
    Jsonb          *jb = DatumGetJsonbP(d);
    JsonbIterator  *it;
    JsonbValue      v;
    JsonbIteratorToken tok;
    int64           bytes = 0;
    int             count = 0;

    if (!JB_ROOT_IS_OBJECT(jb))
        return nullptr;
    it = JsonbIteratorInit(&jb->root);
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
    {
        if (tok == WJB_KEY)
        {
            count++;
            bytes += v.val.string.len;
        }
        else if (tok == WJB_VALUE && v.type == jbvString)
            bytes += v.val.string.len;
    }
    if (count > od_max_headers)
        return psprintf("not sent: the message has %d headers; outbox_dispatcher.max_headers is %d",
                        count, od_max_headers);
    if (bytes > od_max_header_bytes)
        return psprintf("not sent: the message's headers have %lld bytes; outbox_dispatcher.max_header_bytes is %d",
                        (long long) bytes, od_max_header_bytes);
    return nullptr;
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
    s.max_transfers = W.transfer_budget;
    /* what one worker can have in flight: every request keeps its connection */
    s.pool_connections = (size_t) od_batch_size * 2;
    W.disp->set_settings(s);
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

static void
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
static int
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
static int
pipeline_size(void)
{
    return (W.pipeline_cap > 0 && W.pipeline_cap < od_batch_size) ? W.pipeline_cap : od_batch_size;
}

/* What the schedule (core/schedule.hpp) decides from, as of now. */
static od::WorkerCycle
observe(TimestampTz now)
{
    od::WorkerCycle c;

    c.now = now;
    c.installed = W.ext_ready;
    c.active = W.ext_ready && od_enabled && !got_sigterm;
    c.backoff_until = W.sched.backoff_until;
    c.pipeline = pipeline_size();
    /* everything we hold is still 'processing': queued, in flight, or
     * finished but not yet finalized */
    c.held = (int) (W.disp->outstanding() + W.disp->outcomes().size());
    c.woken = W.sched.woken;
    c.last_claim_full = W.sched.last_claim_full;
    c.next_poll = W.sched.next_poll;
    c.next_quota = W.next_quota_at;
    c.places_released = W.places_released;
    c.claim_quota_full = W.claim_quota_full;
    c.results = (int) W.disp->outcomes().size();
    c.in_flight = (int) W.disp->in_flight();
    c.oldest_result = W.oldest_outcome_at;
    c.flush_after_us = (int64) FLUSH_AFTER_MS * 1000;
    c.next_refresh = W.sched.next_refresh;
    c.purges = W.worker_index == 0 && W.ext_ready && od_retention_s > 0;
    c.next_purge = W.sched.next_purge;
    return c;
}

typedef struct ClaimRow
{
    int64       id;
    int64       lease_version;
    TimestampTz lease_until;
    int         attempts;
    char       *endpoint;
    char       *aggregate_type;
    char       *aggregate_id;
    char       *event_type;
    char       *payload;
    char       *headers;
    const char *reject;         /* not sendable (limits): made dead in the claim transaction */
    int64       created_at_us;
    int         endpoint_slot;
} ClaimRow;

static bool
queue_claimed(const ClaimRow *r) noexcept
{
    try
    {
        od::ClaimedMessage m;

        m.id = r->id;
        m.lease_version = r->lease_version;
        m.lease_until_us = r->lease_until;
        m.attempts = r->attempts;
        m.endpoint = r->endpoint;
        m.aggregate_type = r->aggregate_type;
        m.aggregate_id = r->aggregate_id;
        m.event_type = r->event_type;
        m.body = r->payload;
        split_lines(r->headers, m.header_lines);
        m.created_at_unix_us = r->created_at_us;
        m.endpoint_tag = r->endpoint_slot;
        return W.disp->add(std::move(m));
    }
    catch (...)
    {
        return false;
    }
}

typedef struct FinalizeBatch
{
    OdFinalize  *items;
    int          n;
    const char **gone;          /* endpoints that answered 410, by name and id */
    int64       *gone_id;
    int          n_gone;
} FinalizeBatch;

static bool finalize_prepare(FinalizeBatch *fb);
static void finalize_run(FinalizeBatch *fb);
static void finalize_done(FinalizeBatch *fb);

/* a prepared finalize in a transaction of its own */
static void
finalize_alone(FinalizeBatch *fb)
{
    set_state(OD_STATE_FINALIZING);
    begin_tx("finalizing deliveries");
    finalize_run(fb);
    end_tx();
    finalize_done(fb);
}

/*
 * Claim up to capacity messages.  Each endpoint's share is reserved in
 * shared memory first (breaker, cluster-wide max_in_flight, rate limit);
 * the order of the endpoints rotates from claim to claim, so that one
 * endpoint's backlog cannot starve the others.  An endpoint whose
 * reservation is the half-open probe gets exactly one ready message and no
 * expired-lease takeovers, so one request tests it.  with_finalize:
 * finalize the results so far in the same transaction first (one commit
 * instead of two; a finalized ordered head frees its successor for this
 * very claim).
 */
static int
do_claim(int capacity, bool with_finalize)
{
    ClaimRow    *rows;
    int          n;
    uint64       reaped;
    bool         unknown_endpoint = false;
    const char **names;
    int         *quotas;
    bool        *takeover;
    int         *got;
    int         *quota_of;
    int         *slot_of_quota;
    int          m = W.n_wendpoints;
    int          n_rejected = 0;
    bool         check_leases;
    bool         any_quota = false;
    TimestampTz  now;
    FinalizeBatch fb;
    /* before reserving: the results release their places first */
    bool         fin = with_finalize && finalize_prepare(&fb);

    now = GetCurrentTimestamp();
    names = (const char **) MemoryContextAllocZero(W.cycle_ctx, sizeof(char *) * (m + 1));
    quotas = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    takeover = (bool *) MemoryContextAllocZero(W.cycle_ctx, sizeof(bool) * (m + 1));
    got = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    slot_of_quota = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    W.pending = (PendingReservation *) MemoryContextAllocZero(W.cycle_ctx, sizeof(PendingReservation) * (m + 1));
    W.next_quota_at = 0;
    W.n_pending = 0;
    for (int k = 0; k < m; k++)
    {
        WorkerEndpoint *w = &W.wendpoints[(W.claim_rotation + k) % m];
        bool            probe;
        bool            stale;
        TimestampTz     retry_at;
        int             want = Min(capacity, claim_share(w));
        int             q;

        q = od_endpoint_reserve(w->ref, &w->lim, want, now, &probe, &retry_at, &stale);

        names[k] = w->name;
        if (stale)
            W.endpoints_stale = true;
        /* 0 still lets the endpoint's expired leases be taken over; -1 (breaker open, or stale) does not */
        quotas[k] = (stale || (q == 0 && !probe && od_endpoint_breaker_open(w->ref))) ? -1 : q;
        takeover[k] = !probe && quotas[k] >= 0;
        if (q == 0 && retry_at != 0 && (W.next_quota_at == 0 || retry_at < W.next_quota_at))
            W.next_quota_at = retry_at;
        W.pending[W.n_pending].ref = w->ref;
        W.pending[W.n_pending].count = q;
        W.pending[W.n_pending].probe = probe;
        W.pending[W.n_pending].lim = w->lim;
        W.n_pending++;
    }
    W.claim_rotation = m > 0 ? (W.claim_rotation + 1) % m : 0;
    W.places_released = false;
    if (m == 0)
    {
        if (fin)
            finalize_alone(&fb);
        return 0;               /* no enabled endpoint */
    }
    /* expired leases are looked for only once one can have expired (od_lease_check_due) */
    check_leases = od_lease_check_due(now);
    for (int k = 0; k < m && !any_quota; k++)
        any_quota = quotas[k] > 0;
    if (!any_quota && !check_leases)
    {
        /* nothing to take: no claim at all */
        release_pending_reservation();
        W.claim_quota_full = false;
        if (fin)
            finalize_alone(&fb);
        return 0;
    }
    /* with every quota at 0 the claim still takes over expired leases */

    set_state(OD_STATE_CLAIMING);
    begin_tx(fin ? "finalizing deliveries and claiming messages" : "claiming messages");
    if (fin)
        finalize_run(&fb);
    reaped = od_claim(W.lease_owner, capacity, (int64) od_lease_ms * 1000, od_max_attempts, names, quotas,
                      takeover, m,
                      (check_leases ? OD_CLAIM_CHECK_LEASES : 0) | (W.schema_version >= 202 ? OD_CLAIM_SCHEMA_V022 : 0));
    n = (int) SPI_processed;
    rows = (ClaimRow *) MemoryContextAllocZero(W.cycle_ctx, sizeof(ClaimRow) * (n + 1));
    for (int i = 0; i < n; i++)
    {
        HeapTuple     tup = SPI_tuptable->vals[i];
        TupleDesc     desc = SPI_tuptable->tupdesc;
        bool          isnull;
        Datum         d;
        MemoryContext old = MemoryContextSwitchTo(W.cycle_ctx);

        rows[i].id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
        rows[i].lease_version = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
        rows[i].attempts = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
        rows[i].endpoint = SPI_getvalue(tup, desc, 4);
        rows[i].aggregate_type = SPI_getvalue(tup, desc, 5);
        rows[i].aggregate_id = SPI_getvalue(tup, desc, 6);
        rows[i].event_type = SPI_getvalue(tup, desc, 7);
        rows[i].payload = SPI_getvalue(tup, desc, 8);
        d = SPI_getbinval(tup, desc, 9, &isnull);
        /* checked again here: rows written before the limits were lowered, or by a superuser */
        rows[i].reject = isnull ? nullptr : message_headers_problem(d);
        rows[i].headers = (isnull || rows[i].reject) ? pstrdup("") : header_lines_text(d);
        rows[i].created_at_us = unix_micros(DatumGetTimestampTz(SPI_getbinval(tup, desc, 11, &isnull)));
        rows[i].lease_until = DatumGetTimestampTz(SPI_getbinval(tup, desc, 12, &isnull));
        if (rows[i].reject)
            n_rejected++;
        MemoryContextSwitchTo(old);
    }
    if (n_rejected > 0)
    {
        /* not sendable: dead at once, with the reason, in the claim's own transaction */
        OdFinalize *items = (OdFinalize *) MemoryContextAllocZero(W.cycle_ctx, sizeof(OdFinalize) * n_rejected);
        int         k = 0;

        for (int i = 0; i < n; i++)
            if (rows[i].reject)
            {
                items[k].id = rows[i].id;
                items[k].lease_version = rows[i].lease_version;
                items[k].lease_until = rows[i].lease_until;
                items[k].verdict = od::Verdict::Dead;
                items[k].error = rows[i].reject;
                k++;
            }
        od_finalize(items, n_rejected);
        pg_atomic_fetch_add_u64(&W.slot->dead, n_rejected);
    }
    end_tx();
    if (fin)
        finalize_done(&fb);

    /* settle the reservation: keep what was claimed, return the rest */
    quota_of = (int *) MemoryContextAlloc(W.cycle_ctx, sizeof(int) * (n + 1));
    for (int i = 0; i < n; i++)
    {
        quota_of[i] = -1;
        for (int k = 0; k < m; k++)
            if (strcmp(names[k], rows[i].endpoint) == 0)
            {
                got[k]++;
                quota_of[i] = k;
                break;
            }
    }
    for (int k = 0; k < m; k++)
    {
        OdEndpointRef ref = W.pending[k].ref;
        int           q = Max(quotas[k], 0);
        bool          counted = true;

        if (got[k] < q)
            od_endpoint_unreserve(ref, q - got[k], W.pending[k].probe && got[k] == 0);
        else if (got[k] > q)
            counted = od_endpoint_hold(ref, got[k] - q);    /* expired leases taken over */
        if (!counted)
        {
            /* the slot changed hands meanwhile: these messages go out without shared accounting */
            W.endpoints_stale = true;
            od_endpoint_release(ref, q);
        }
        slot_of_quota[k] = (counted && ref.slot >= 0 && ref.slot < W.n_holds) ? ref.slot : -1;
        if (slot_of_quota[k] >= 0 && got[k] > 0)
        {
            SlotHold *h = &W.holds[ref.slot];

            h->ref = ref;
            h->lim = W.pending[k].lim;
            h->held += got[k];
        }
    }
    for (int i = 0; i < n; i++)
    {
        int k = quota_of[i];

        rows[i].endpoint_slot = k >= 0 ? slot_of_quota[k] : -1;
        if (k >= 0 && W.pending[k].probe && rows[i].endpoint_slot >= 0)
            W.holds[rows[i].endpoint_slot].probe_id = rows[i].id;
    }
    W.n_pending = 0;
    /* an endpoint used its whole quota: it may have more to claim */
    W.claim_quota_full = false;
    for (int k = 0; k < m; k++)
        if (quotas[k] > 0 && got[k] >= quotas[k])
            W.claim_quota_full = true;

    pg_atomic_fetch_add_u64(&W.slot->claimed, n);
    pg_atomic_fetch_add_u64(&W.slot->reaped, reaped);
    pg_atomic_fetch_add_u64(&W.slot->dead, reaped);

    for (int i = 0; i < n && !unknown_endpoint; i++)
        unknown_endpoint = !rows[i].reject && !W.disp->has_endpoint(rows[i].endpoint);
    if (unknown_endpoint)
        refresh_endpoints();    /* an endpoint created since the last refresh */
    for (int i = 0; i < n; i++)
    {
        if (rows[i].reject)
        {
            /* already final: give its place back */
            if (rows[i].endpoint_slot >= 0)
            {
                SlotHold *h = &W.holds[rows[i].endpoint_slot];

                od_endpoint_release(h->ref, 1);
                h->held = Max(0, h->held - 1);
                if (h->probe_id == rows[i].id)
                {
                    od_endpoint_unreserve(h->ref, 0, true);
                    h->probe_id = 0;
                }
            }
            continue;
        }
        if (!queue_claimed(&rows[i]))
            record_error("out of memory while queueing a claimed message");
    }
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
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();
    TimestampTz now = GetCurrentTimestamp();

    for (; W.outcomes_seen < outs.size(); W.outcomes_seen++)
    {
        const od::DeliveryOutcome &o = outs[W.outcomes_seen];
        int         s = o.endpoint_tag;
        bool        probe;
        SlotHold   *h;
        OdEndpointResult r;

        if (s < 0 || s >= W.n_holds)
            continue;
        h = &W.holds[s];
        probe = (h->probe_id != 0 && h->probe_id == o.id);
        if (probe)
            h->probe_id = 0;
        W.places_released = true;
        if (o.latency_ms < 0 || o.local_failure)
        {
            /* never sent, or failed on our side (released at shutdown, not sendable,
             * out of file descriptors): not the endpoint's doing */
            if (probe)
                od_endpoint_unreserve(h->ref, 0, true);
        }
        else
        {
            if (o.verdict == od::Verdict::Done)
                r = OD_RESULT_SUCCESS;
            else if (o.verdict == od::Verdict::Retry || (o.verdict == od::Verdict::Dead && o.http_status == 0))
                r = OD_RESULT_FAILURE;      /* retryable, or retries exhausted on a transport error */
            else if (o.verdict == od::Verdict::Dead && o.http_status >= 500)
                r = OD_RESULT_FAILURE;      /* retries exhausted on 5xx */
            else
                r = OD_RESULT_NEUTRAL;
            /* before the place is released: a slot with places held is never reclaimed */
            od_endpoint_result(h->ref, &h->lim, r, o.http_status, o.latency_ms, o.error, probe, now);
        }
        od_endpoint_release(h->ref, 1);
        if (h->held > 0)
            h->held--;
    }
}

/* ---------------------------------------------------------------- finalize */

static void
note_latency(double ms)
{
    uint64 us = od::latency_us(ms);

    pg_atomic_fetch_add_u64(&W.slot->latency_buckets[od::latency_bucket(us)], 1);
    pg_atomic_fetch_add_u64(&W.slot->latency_count, 1);
    pg_atomic_fetch_add_u64(&W.slot->latency_sum_us, us);
    if (us > pg_atomic_read_u64(&W.slot->latency_max_us))
        pg_atomic_write_u64(&W.slot->latency_max_us, us);
}

/*
 * A finalize in three parts, so that it can share the claim's transaction
 * (do_claim): prepare (the results so far, before any transaction), run
 * (inside one), done (after its commit: counters, results dropped).  An
 * ERROR in the transaction leaves the results in place: they are
 * finalized again.
 */

static bool
finalize_prepare(FinalizeBatch *fb)
{
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();
    int          n = (int) outs.size();

    memset(fb, 0, sizeof(*fb));
    if (n == 0)
        return false;
    process_new_outcomes();
    fb->gone = (const char **) MemoryContextAllocZero(W.cycle_ctx, sizeof(char *) * n);
    fb->gone_id = (int64 *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int64) * n);
    fb->items = (OdFinalize *) MemoryContextAllocZero(W.cycle_ctx, sizeof(OdFinalize) * n);
    fb->n = n;
    for (int i = 0; i < n; i++)
    {
        const od::DeliveryOutcome &o = outs[i];
        OdFinalize *it = &fb->items[i];

        it->id = o.id;
        it->lease_version = o.lease_version;
        it->lease_until = o.lease_until_us;
        it->verdict = o.verdict;
        it->delay_us = o.delay_ms * 1000;
        it->refund = o.refund;
        it->error = o.error[0] ? MemoryContextStrdup(W.cycle_ctx, o.error) : nullptr;
        it->http_status = (o.http_status >= 100 && o.http_status <= 599) ? o.http_status : 0;

        /*
         * 410 Gone: the endpoint says it is gone for good.  Disable it (an
         * operator re-enables it) and put the message back, attempt refunded,
         * instead of killing it.
         */
        if (o.http_status == 410 && o.endpoint_tag >= 0)
        {
            it->verdict = od::Verdict::Retry;
            it->refund = true;
            it->delay_us = (int64) od_defer_delay_ms * 1000;
            it->error = "HTTP 410 Gone: the endpoint was disabled";
            /* the endpoint is identified by its slot's key, never by a name prefix */
            for (int k = 0; k < W.n_wendpoints; k++)
                if (W.wendpoints[k].ref.slot == o.endpoint_tag)
                {
                    fb->gone[fb->n_gone] = MemoryContextStrdup(W.cycle_ctx, W.wendpoints[k].name);
                    fb->gone_id[fb->n_gone] = W.wendpoints[k].id;
                    fb->n_gone++;
                    break;
                }
        }
    }
    return true;
}

static void
finalize_run(FinalizeBatch *fb)
{
    od_finalize(fb->items, fb->n);
    for (int i = 0; i < fb->n_gone; i++)
    {
        Oid   types[3] = {TEXTOID, TEXTOID, INT8OID};
        Datum args[3] = {CStringGetTextDatum(fb->gone[i]),
                         CStringGetTextDatum("HTTP 410 Gone received by the dispatcher"),
                         Int64GetDatum(fb->gone_id[i])};
        int   rc = SPI_execute_with_args(W.schema_version >= 201
                                         ? "UPDATE outbox.endpoints SET enabled = false, disabled_reason = $2"
                                           " WHERE id = $3 AND enabled AND $1 IS NOT NULL"
                                         : W.schema_version >= 200
                                         ? "UPDATE outbox.endpoints SET enabled = false, disabled_reason = $2"
                                           " WHERE name = $1 AND enabled AND $3 IS NOT NULL"
                                         : "UPDATE outbox.endpoints SET enabled = false"
                                           " WHERE name = $1 AND enabled AND $2 IS NOT NULL AND $3 IS NOT NULL",
                                         3, types, args, nullptr, false, 0);

        if (rc != SPI_OK_UPDATE)
            elog(ERROR, "outbox_dispatcher: disabling endpoint \"%s\" failed: %s", fb->gone[i],
                 SPI_result_code_string(rc));
        if (SPI_processed > 0)
            ereport(LOG,
                    (errmsg("outbox_dispatcher: endpoint \"%s\" answered 410 Gone and was disabled", fb->gone[i]),
                     errhint("Fix the endpoint, then run SELECT outbox.resume_endpoint('%s').", fb->gone[i])));
    }
}

static void
finalize_done(FinalizeBatch *fb)
{
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();

    for (int i = 0; i < fb->n; i++)
    {
        const OdFinalize *it = &fb->items[i];

        if (outs[i].latency_ms >= 0)
            note_latency(outs[i].latency_ms);
        if (!it->applied)
        {
            pg_atomic_fetch_add_u64(&W.slot->lost_leases, 1);
            continue;
        }
        switch (it->verdict)
        {
            case od::Verdict::Done: pg_atomic_fetch_add_u64(&W.slot->delivered, 1); break;
            case od::Verdict::Retry: pg_atomic_fetch_add_u64(&W.slot->retried, 1); break;
            case od::Verdict::Defer: pg_atomic_fetch_add_u64(&W.slot->deferred, 1); break;
            case od::Verdict::Dead: pg_atomic_fetch_add_u64(&W.slot->dead, 1); break;
        }
        if (it->verdict != od::Verdict::Done && it->error)
            record_error(it->error);
    }
    outs.clear();
    W.outcomes_seen = 0;
    W.oldest_outcome_at = 0;
    memset(fb, 0, sizeof(*fb));
}

static void
do_finalize(void)
{
    FinalizeBatch fb;

    if (finalize_prepare(&fb))
        finalize_alone(&fb);
}

/* ---------------------------------------------------------------- waiting */

static void
rebuild_wait_set(void)
{
    const std::vector<od::HttpSocket> &socks = W.disp->engine().sockets();

    WaitEventSet *old = W.wait_set;
    WaitEventSet *set;

    /*
     * Build the new set completely before letting go of the old one: an
     * ERROR while building leaves wait_set pointing at a valid set (the
     * half-built one is released with its memory at the next rebuild).
     */
    set = od_create_wait_event_set((int) socks.size() + 2);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    for (const od::HttpSocket &s : socks)
    {
        uint32 ev = (s.want_read ? WL_SOCKET_READABLE : 0) | (s.want_write ? WL_SOCKET_WRITEABLE : 0);

        AddWaitEventToSet(set, ev, s.fd, nullptr, nullptr);
    }
    W.wait_set = set;
    if (old)
        FreeWaitEventSet(old);
}

/* Wait up to timeout_ms for sockets or the latch; returns true if the latch was set. */
static bool
wait_for_events(long timeout_ms)
{
    WaitEvent events[64];
    int       nev;
    bool      woken = false;
    long      curl_ms = W.disp->engine().timeout_ms();

    if (curl_ms == 0)
    {
        W.disp->engine().on_timeout();
        curl_ms = W.disp->engine().timeout_ms();
    }
    if (curl_ms >= 0 && (timeout_ms < 0 || curl_ms < timeout_ms))
        timeout_ms = curl_ms;
    if (W.disp->engine().completed() > 0)
        timeout_ms = 0;     /* transfers finished while being kicked: do not sleep on them */
    if (W.disp->engine().sockets_changed() || W.wait_set == nullptr)
        rebuild_wait_set();

    nev = WaitEventSetWait(W.wait_set, timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);

    for (int i = 0; i < nev; i++)
    {
        if (events[i].events & WL_LATCH_SET)
        {
            ResetLatch(MyLatch);
            woken = true;
        }
        else if (events[i].events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
            W.disp->engine().on_socket(events[i].fd, (events[i].events & WL_SOCKET_READABLE) != 0,
                                     (events[i].events & WL_SOCKET_WRITEABLE) != 0);
    }
    if (W.disp->engine().timeout_ms() == 0)
        W.disp->engine().on_timeout();
    return woken;
}

/* ---------------------------------------------------------------- shutdown */

static void
shutdown_worker(void)
{
    TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);

    ereport(LOG, (errmsg("outbox_dispatcher worker %d: shutting down with %zu request(s) in flight",
                         W.worker_index, W.disp->in_flight())));
    while (W.disp->in_flight() > 0 && GetCurrentTimestamp() < deadline)
    {
        wait_for_events(50);
        W.disp->collect(unix_seconds(GetCurrentTimestamp()));
    }
    W.disp->abandon(unix_seconds(GetCurrentTimestamp()),
                  "worker stopped before delivery finished; released for another worker");
    process_new_outcomes();
    if (W.ext_ready)
        do_finalize();
    proc_exit(1);   /* non-zero: the postmaster restarts us unless it is shutting down */
}

/* ---------------------------------------------------------------- main */

extern "C" void
od_worker_main(Datum arg)
{
    sigjmp_buf  local_sigjmp_buf;

    W.worker_index = DatumGetInt32(arg);
    W.sched.woken = true;       /* look once at start */
    if (IsBinaryUpgrade)
        proc_exit(0);           /* never registered then; step aside all the same */
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, od_sigterm);
    BackgroundWorkerUnblockSignals();

    if (od_shared == nullptr || W.worker_index < 0 || W.worker_index >= OD_MAX_WORKERS)
        ereport(FATAL, (errmsg("outbox_dispatcher: shared memory is not initialized")));
    W.slot = &od_shared->workers[W.worker_index];
    W.slot->pid = MyProcPid;
    W.slot->latch = MyLatch;
    W.slot->started_at = GetCurrentTimestamp();
    set_state(OD_STATE_STARTING);
    before_shmem_exit(od_worker_exit, (Datum) 0);

    if (od_role == nullptr || od_role[0] == '\0')
    {
        if (W.worker_index == 0)
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
    /*
     * Nothing a producer created may ever run with the workers' rights: every
     * statement of this session resolves names in pg_catalog only (see
     * guard.cpp).  PGC_S_OVERRIDE wins over ALTER ROLE/DATABASE settings.
     */
    SetConfigOption("search_path", OD_SAFE_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("application_name", MyBgworkerEntry->bgw_name, PGC_USERSET, PGC_S_OVERRIDE);
    /* plans that statistics cannot degrade (transitions.cpp) */
    od_fix_plan_shapes();

    W.lease_owner = MemoryContextStrdup(TopMemoryContext,
                                      psprintf("worker-%d/pid-%d", W.worker_index, MyProcPid));
    W.cycle_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher cycle", ALLOCSET_DEFAULT_SIZES);
    W.endpoint_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher endpoints", ALLOCSET_SMALL_SIZES);
    W.n_holds = od_shared->max_endpoints;
    W.holds = (SlotHold *) MemoryContextAllocZero(TopMemoryContext, sizeof(SlotHold) * W.n_holds);
    W.transfer_budget = raise_fd_limit();

    W.disp = new (std::nothrow) od::Dispatcher();
    if (W.disp == nullptr)
        ereport(FATAL, (errmsg("outbox_dispatcher: out of memory")));
    {
        od::HttpEngineOptions opts;

        opts.ca_file = (od_ca_file && od_ca_file[0]) ? od_ca_file : nullptr;
        opts.user_agent = "outbox_dispatcher/" OD_LIBRARY_VERSION;
        if (!W.disp->init(opts, (uint64) MyProcPid * 6364136223846793005ULL ^ (uint64) GetCurrentTimestamp()))
            ereport(FATAL, (errmsg("outbox_dispatcher: cannot initialize libcurl: %s", W.disp->last_error())));
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
        W.sched.backoff_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);
        W.sched.next_refresh = 0;
    }
    PG_exception_stack = &local_sigjmp_buf;

    for (;;)
    {
        TimestampTz now;
        long        timeout;

        MemoryContextSwitchTo(W.cycle_ctx);
        MemoryContextReset(W.cycle_ctx);

        if (got_sigterm)
            shutdown_worker();
        if (ConfigReloadPending)
        {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
            apply_settings();
            W.sched.next_refresh = 0;
            W.sched.woken = true;
        }

        now = GetCurrentTimestamp();
        pg_atomic_fetch_add_u64(&W.slot->cycles, 1);
        if (W.endpoints_stale)
            W.sched.next_refresh = 0;   /* a slot we referenced changed hands */
        if (od::refresh_now(observe(now)))
        {
            refresh_endpoints();
            W.sched.next_refresh = TimestampTzPlusMilliseconds(now, od_poll_interval_ms);
        }

        /* claim when there is room and a reason to look */
        {
            int room = od::claim_now(observe(now));

            if (room > 0)
            {
                int n;

                W.sched.woken = false;
                n = do_claim(room, !W.disp->outcomes().empty());
                W.sched.last_claim_full = (n == room) || W.claim_quota_full;
                if (n > 0 && W.sched.last_claim_full)
                    od_wake_idle_peer(W.worker_index);    /* there may be more: share it */
                W.sched.next_poll = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), od_poll_interval_ms);
            }
        }
        if (W.ext_ready && !od_enabled)
            set_state(OD_STATE_PAUSED);

        now = GetCurrentTimestamp();
        if (!got_sigterm)       /* stopping: send nothing new */
            W.disp->pump(unix_seconds(now));
        pg_atomic_write_u32(&W.slot->in_flight, (uint32) W.disp->in_flight());

        /* finalize (in its own transaction) when the schedule says so */
        if (!W.disp->outcomes().empty() && now >= W.sched.backoff_until && W.oldest_outcome_at == 0)
            W.oldest_outcome_at = now;
        if (od::finalize_now(observe(now)))
            do_finalize();

        /* retention: worker 0 purges old done rows in small batches */
        if (od::purge_now(observe(now)))
        {
            uint64 purged;

            begin_tx("purging done messages");
            purged = od_purge((int64) od_retention_s * USECS_PER_SEC, 1000);
            end_tx();
            W.sched.next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), purged == 1000 ? 100 : 10000);
        }

        /* how long may we sleep? */
        now = GetCurrentTimestamp();
        if (W.disp->in_flight() > 0)
            set_state(OD_STATE_DELIVERING);
        else if (od_enabled)
            set_state(OD_STATE_IDLE);
        else if (W.ext_ready)
            set_state(OD_STATE_PAUSED);     /* not "finalizing" while it sleeps after a finalize */
        timeout = od::wait_ms(now, od::next_wakeup(observe(now)));

        /*
         * idle: nothing queued or in flight — wakes may pick us alone (results
         * waiting to be finalized go with the claim the wake brings)
         */
        if (timeout != 0 && W.disp->outstanding() == 0)
        {
            if (W.stats_pending && W.disp->outcomes().empty())
            {
                pgstat_report_stat(true);   /* going idle: what we changed is visible now */
                W.stats_pending = false;
            }
            pg_atomic_write_u32(&W.slot->idle, 1);
        }
        if (wait_for_events(timeout))
            W.sched.woken = true;
        pg_atomic_write_u32(&W.slot->idle, 0);
        CHECK_FOR_INTERRUPTS();
        W.disp->collect(unix_seconds(GetCurrentTimestamp()));
        process_new_outcomes();
    }
}
