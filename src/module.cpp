/*
 * module.cpp — library entry point: GUCs, shared memory, worker registration.
 *
 * outbox_dispatcher must be listed in shared_preload_libraries: _PG_init
 * then registers the GUCs (some are postmaster-level), reserves the shared
 * memory laid out in module.h (global counters, one slot per worker, and
 * outbox_dispatcher.max_endpoints endpoint slots) and registers the
 * background workers (none in binary-upgrade mode).  Loading the library any
 * other way fails with a clear error.
 *
 * Locking (the full map is in src/README.md): worker counters are atomics
 * written by one worker each, a worker's last_error is under its slot
 * spinlock; the endpoint slots, which every claim and every result touch,
 * are under their own spinlocks and are assigned under endpoint_lock.
 */
#include "outbox_dispatcher.h"
#include "module.h"
#include "core/validate.hpp"
#include "core/netfilter.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

void _PG_init(void);
}

char                          *od_database = nullptr;
char                          *od_role = nullptr;
int                            od_workers = 2;
bool                           od_enabled = true;
bool                           od_deliver_after_replication = false;
int                            od_batch_size = 100;
int                            od_lease_ms = 60000;
int                            od_max_attempts = 12;
int                            od_poll_interval_ms = 1000;
int                            od_min_claim_interval_ms = 5;
int                            od_worker_nice = 10;
int                            od_backoff_base_ms = 1000;
int                            od_backoff_cap_ms = 300000;
int                            od_defer_delay_ms = 30000;
int                            od_max_defer_age_s = 86400;
int                            od_retention_s = 7 * 86400;
char                          *od_source = nullptr;
char                          *od_message_id_prefix = nullptr;
char                          *od_traceparent = nullptr;
char                          *od_tracestate = nullptr;
char                          *od_denied_networks = nullptr;
char                          *od_allowed_networks = nullptr;
char                          *od_proxy = nullptr;
char                          *od_no_proxy = nullptr;
int                            od_max_payload_bytes = 1024 * 1024;
int                            od_max_header_bytes = 16384;
int                            od_max_headers = 64;
int                            od_max_schedule_ahead_s = 366 * 86400;
int                            od_max_endpoints = 1024;
char                          *od_ca_file = nullptr;
int                            od_attempt_log = OD_ATTEMPT_LOG_ALL;
int                            od_attempt_log_retention_s = 7 * 86400;

static const struct config_enum_entry attempt_log_options[] = {
    { "all", OD_ATTEMPT_LOG_ALL, false },
    { "failures", OD_ATTEMPT_LOG_FAILURES, false },
    { "off", OD_ATTEMPT_LOG_OFF, false },
    { nullptr, 0, false },
};

OdShared                      *od_shared = nullptr;

static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

Size
od_shared_size(void)
{
    return add_size(MAXALIGN(sizeof(OdShared)), mul_size(sizeof(OdEndpointSlot), (Size) od_max_endpoints));
}

static void
od_shmem_request(void)
{
    if (prev_shmem_request_hook)
        prev_shmem_request_hook();
    RequestAddinShmemSpace(od_shared_size());
    RequestNamedLWLockTranche("outbox_dispatcher", 1);
}

static void
od_shmem_startup(void)
{
    bool found;

    if (prev_shmem_startup_hook)
        prev_shmem_startup_hook();

    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    od_shared = (OdShared *) ShmemInitStruct("outbox_dispatcher", od_shared_size(), &found);
    if (!found)
    {
        memset(od_shared, 0, od_shared_size());
        od_shared->max_endpoints = od_max_endpoints;
        pg_atomic_init_u32(&od_shared->endpoints_unserved, 0);
        pg_atomic_init_u64(&od_shared->endpoints_generation, 0);
        pg_atomic_init_u64(&od_shared->last_claim_at, 0);
        pg_atomic_init_u64(&od_shared->ordered_done, 0);
        pg_atomic_init_u64(&od_shared->lost_leases, 0);
        pg_atomic_init_u64(&od_shared->lease_check_at, 0); /* after a (re)start: check at once */
        for (int i = 0; i < OD_MAX_WORKERS; i++)
        {
            OdWorkerSlot *w = &od_shared->workers[i];

            pg_atomic_init_u32(&w->state, OD_STATE_STOPPED);
            pg_atomic_init_u32(&w->in_flight, 0);
            pg_atomic_init_u32(&w->idle, 0);
            pg_atomic_uint64 *counters[] = { &w->claimed,       &w->delivered,      &w->retried,       &w->deferred,
                                             &w->dead,          &w->reaped,         &w->lost_leases,   &w->cycles,
                                             &w->latency_count, &w->latency_sum_us, &w->latency_max_us };
            for (pg_atomic_uint64 *c : counters)
                pg_atomic_init_u64(c, 0);
            for (int b = 0; b < OD_LATENCY_BUCKETS; b++)
                pg_atomic_init_u64(&w->latency_buckets[b], 0);
            SpinLockInit(&w->mutex);
        }
        od_shared->endpoint_lock = &(GetNamedLWLockTranche("outbox_dispatcher"))->lock;
        for (int i = 0; i < od_max_endpoints; i++)
            SpinLockInit(&od_endpoint_slots()[i].mutex);
    }
    LWLockRelease(AddinShmemInitLock);
}

/*
 * outbox_dispatcher.source goes into every request as the ce-source header:
 * the same rules as any header value (no CR, LF or other control
 * character, not blank), checked when the configuration is read, so that
 * postgresql.conf cannot inject a header either.
 */
static bool
od_check_source(char **newval, void **extra, GucSource source)
{
    const char *problem;

    if (*newval == nullptr || (*newval)[0] == '\0')
        return true; /* empty: the default /postgresql/<database>/outbox */
    problem = od::check_header_value(*newval, strlen(*newval));
    if (problem)
    {
        GUC_check_errmsg("outbox_dispatcher.source %s", problem);
        GUC_check_errdetail("It is sent in the ce-source header of every request.");
        return false;
    }
    return true;
}

/* outbox_dispatcher.traceparent and .tracestate: W3C Trace Context, see od::check_traceparent. */
static bool
od_check_trace_guc(char **newval, const char *name, const char *(*check)(const char *, std::size_t) noexcept)
{
    const char *problem;

    if (*newval == nullptr || (*newval)[0] == '\0')
        return true;
    problem = check(*newval, strlen(*newval));
    if (problem)
    {
        GUC_check_errmsg("%s %s", name, problem);
        GUC_check_errdetail("It is stored with every message enqueued while it is set and sent as the %s header.",
                            strchr(name, '.') + 1);
        return false;
    }
    return true;
}

static bool
od_check_traceparent(char **newval, void **extra, GucSource source)
{
    return od_check_trace_guc(newval, "outbox_dispatcher.traceparent", od::check_traceparent);
}

static bool
od_check_tracestate(char **newval, void **extra, GucSource source)
{
    return od_check_trace_guc(newval, "outbox_dispatcher.tracestate", od::check_tracestate);
}

/* outbox_dispatcher.denied_networks and .allowed_networks: lists of networks (core/netfilter.hpp). */
static bool
od_check_networks(char **newval, const char *name)
{
    std::vector<od::NetRange> ranges;
    const char               *problem = nullptr;

    try
    {
        problem = od::parse_networks(*newval, ranges);
    }
    catch (...)
    {
        problem = "could not be parsed (out of memory)";
    }
    if (problem)
    {
        GUC_check_errmsg("%s %s", name, problem);
        GUC_check_errdetail("Give networks as address/prefix (for instance 169.254.0.0/16 or fe80::/10), "
                            "separated by commas.");
        return false;
    }
    return true;
}

static bool
od_check_denied_networks(char **newval, void **extra, GucSource source)
{
    return od_check_networks(newval, "outbox_dispatcher.denied_networks");
}

static bool
od_check_allowed_networks(char **newval, void **extra, GucSource source)
{
    return od_check_networks(newval, "outbox_dispatcher.allowed_networks");
}

/* outbox_dispatcher.proxy: see od::check_proxy_url (the value is never quoted: it may hold a password). */
static bool
od_check_proxy(char **newval, void **extra, GucSource source)
{
    const char *problem;

    if (*newval == nullptr || (*newval)[0] == '\0')
        return true;
    problem = od::check_proxy_url(*newval, strlen(*newval));
    if (problem)
    {
        GUC_check_errmsg("outbox_dispatcher.proxy %s", problem);
        return false;
    }
    return true;
}

/* outbox_dispatcher.no_proxy: a header-safe host list (libcurl's CURLOPT_NOPROXY syntax). */
static bool
od_check_no_proxy(char **newval, void **extra, GucSource source)
{
    if (*newval == nullptr || (*newval)[0] == '\0')
        return true;
    for (const char *p = *newval; *p; p++)
        if ((unsigned char) *p < 0x20 || *p == 0x7f)
        {
            GUC_check_errmsg("outbox_dispatcher.no_proxy contains a control character");
            return false;
        }
    if (strlen(*newval) > 4096)
    {
        GUC_check_errmsg("outbox_dispatcher.no_proxy is longer than 4096 bytes");
        return false;
    }
    return true;
}

/* outbox_dispatcher.message_id_prefix: see od::check_id_prefix. */
static bool
od_check_message_id_prefix(char **newval, void **extra, GucSource source)
{
    const char *problem;

    if (*newval == nullptr)
        return true;
    problem = od::check_id_prefix(*newval, strlen(*newval));
    if (problem)
    {
        GUC_check_errmsg("outbox_dispatcher.message_id_prefix %s", problem);
        GUC_check_errdetail("It is sent before the message id in the Idempotency-Key, ce-id and webhook-id headers.");
        return false;
    }
    return true;
}

static void
od_define_gucs(void)
{
    DefineCustomStringVariable("outbox_dispatcher.database", "Database the dispatcher workers connect to.", NULL,
                               &od_database, "postgres", PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.role",
                               "Role the dispatcher workers connect as (empty: the bootstrap superuser).",
                               "A dedicated role that is a member of outbox_admin is recommended.", &od_role, "",
                               PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.workers", "Number of dispatcher background workers.", NULL, &od_workers,
                            2, 0, 64, PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomBoolVariable("outbox_dispatcher.enabled",
                             "Whether the dispatcher workers claim messages (off pauses them).", NULL, &od_enabled,
                             true, PGC_SIGHUP, 0, NULL, NULL, NULL);
    DefineCustomBoolVariable("outbox_dispatcher.deliver_after_replication",
                             "Send a claimed message only once the synchronous standbys have flushed its commit.",
                             "The standbys are those synchronous_standby_names names; without any, this has no effect.",
                             &od_deliver_after_replication, false, PGC_SIGHUP, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.batch_size", "Maximum number of messages one worker claims per cycle.",
                            NULL, &od_batch_size, 100, 1, 10000, PGC_SIGHUP, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.lease", "How long a claimed message belongs to its worker.",
                            "Must be longer than every endpoint's timeout.", &od_lease_ms, 60000, 100, INT_MAX,
                            PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_attempts",
                            "Attempts after which a retryable failure makes a message dead.", NULL, &od_max_attempts,
                            12, 1, 1000, PGC_SIGHUP, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.poll_interval",
                            "Fallback polling interval of idle workers (commits wake them at once).", NULL,
                            &od_poll_interval_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.min_claim_interval",
                            "Shortest time between two claims that commits trigger, after a claim that was not full.",
                            "Commits in between are claimed together, in fewer and larger transactions; 0 claims at "
                            "every commit.",
                            &od_min_claim_interval_ms, 5, 0, 10000, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.worker_nice",
                            "Scheduling priority (nice value) the dispatcher workers give themselves at start.",
                            "Higher values yield the CPU to the application's backends under contention; 0 keeps "
                            "the postmaster's priority.",
                            &od_worker_nice, 10, 0, 19, PGC_POSTMASTER, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.backoff_base",
                            "Base of the full-jitter exponential backoff between attempts.", NULL, &od_backoff_base_ms,
                            1000, 1, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.backoff_cap", "Upper bound of the backoff between attempts.", NULL,
                            &od_backoff_cap_ms, 300000, 1, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.defer_delay",
                            "Delay after a defer status when the response has no Retry-After.", NULL,
                            &od_defer_delay_ms, 30000, 1, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_defer_age",
                            "Age after which a message that is still deferred becomes dead.", NULL, &od_max_defer_age_s,
                            86400, 1, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.retention",
                            "How long done messages are kept before the workers purge them (0 keeps them).", NULL,
                            &od_retention_s, 7 * 86400, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
    DefineCustomEnumVariable("outbox_dispatcher.attempt_log",
                             "Which delivery attempts the workers record in outbox.attempts: all, failures (every "
                             "attempt not answered 2xx) or off.",
                             NULL, &od_attempt_log, OD_ATTEMPT_LOG_ALL, attempt_log_options, PGC_SIGHUP, 0, NULL, NULL,
                             NULL);
    DefineCustomIntVariable("outbox_dispatcher.attempt_log_retention",
                            "How long rows of outbox.attempts are kept (1 to 30 days, rounded up to whole days; a day is dropped whole).",
                            NULL, &od_attempt_log_retention_s, 7 * 86400, 86400, 30 * 86400, PGC_SIGHUP, GUC_UNIT_S,
                            NULL, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.source",
                               "CloudEvents source attribute (empty: /postgresql/<database>/outbox).", NULL, &od_source,
                               "", PGC_SIGHUP, 0, od_check_source, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.message_id_prefix",
                               "Sent before the message id in Idempotency-Key, ce-id and webhook-id (empty: the bare id).",
                               "Makes ids unique across databases that feed one receiver.", &od_message_id_prefix, "",
                               PGC_SIGHUP, 0, od_check_message_id_prefix, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.denied_networks",
                               "Networks the workers never connect to, checked on the resolved address of every connection.",
                               "Address/prefix list; the default covers 0.0.0.0/8 and link-local addresses (cloud metadata).",
                               &od_denied_networks, od::kDefaultDeniedNetworks, PGC_SIGHUP, 0, od_check_denied_networks,
                               NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.allowed_networks",
                               "If not empty, the only networks the workers connect to (outside denied_networks).", NULL,
                               &od_allowed_networks, "", PGC_SIGHUP, 0, od_check_allowed_networks, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.proxy",
                               "Proxy every delivery goes through unless its endpoint names its own (empty: none).",
                               "http://, https://, socks5:// or socks5h:// URL; the environment's http_proxy and the "
                               "like are never used.",
                               &od_proxy, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY, od_check_proxy, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.no_proxy",
                               "Hosts reached directly despite a proxy (comma-separated names, domains or addresses; * for all).",
                               NULL, &od_no_proxy, "", PGC_SIGHUP, 0, od_check_no_proxy, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.traceparent",
                               "W3C traceparent stored with the messages enqueued while it is set (SET LOCAL per transaction).",
                               "Sent as the traceparent header and the CloudEvents traceparent attribute of every attempt.",
                               &od_traceparent, "", PGC_USERSET, GUC_NOT_IN_SAMPLE, od_check_traceparent, NULL, NULL);
    DefineCustomStringVariable("outbox_dispatcher.tracestate",
                               "W3C tracestate stored with the messages enqueued while it and outbox_dispatcher.traceparent are set.",
                               NULL, &od_tracestate, "", PGC_USERSET, GUC_NOT_IN_SAMPLE, od_check_tracestate, NULL,
                               NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_payload_bytes",
                            "Largest payload accepted, measured as the JSON text sent.", NULL, &od_max_payload_bytes,
                            1024 * 1024, 1, 1024 * 1024 * 1024, PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_header_bytes",
                            "Largest total size of one message's extra headers (names and values).", NULL,
                            &od_max_header_bytes, 16384, 0, 1024 * 1024, PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_headers", "Largest number of extra headers one message may carry.",
                            NULL, &od_max_headers, 64, 0, 1000, PGC_SUSET, 0, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_schedule_ahead",
                            "How far in the future a message's available_at may be when it is enqueued.", NULL,
                            &od_max_schedule_ahead_s, 366 * 86400, 1, INT_MAX, PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
    DefineCustomIntVariable("outbox_dispatcher.max_endpoints",
                            "Endpoints whose shared state (breaker, limits, statistics) the workers can keep.",
                            "Enabled endpoints beyond this number are not served.", &od_max_endpoints, 1024, 16, 100000,
                            PGC_POSTMASTER, 0, NULL, NULL, NULL);

    DefineCustomStringVariable("outbox_dispatcher.ca_file",
                               "CA bundle used to verify endpoints' TLS certificates (empty: the system store).", NULL,
                               &od_ca_file, "", PGC_SIGHUP, 0, NULL, NULL, NULL);

    MarkGUCPrefixReserved("outbox_dispatcher");
}

extern "C" void
_PG_init(void)
{
    if (!process_shared_preload_libraries_in_progress)
        ereport(
            ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("outbox_dispatcher must be loaded via shared_preload_libraries"),
             errhint("Add outbox_dispatcher to shared_preload_libraries in postgresql.conf and restart the server.")));

    od_define_gucs();

    prev_shmem_request_hook = shmem_request_hook;
    shmem_request_hook = od_shmem_request;
    prev_shmem_startup_hook = shmem_startup_hook;
    shmem_startup_hook = od_shmem_startup;

    /*
     * pg_upgrade starts the servers in binary-upgrade mode with the same
     * shared_preload_libraries: no worker may touch the database then.
     */
    if (!IsBinaryUpgrade)
        od_register_workers();
}
