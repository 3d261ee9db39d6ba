/*
 * worker.cpp — the dispatcher background workers.
 *
 * outbox_dispatcher.workers workers are registered at preload time
 * (BgWorkerStart_RecoveryFinished: never on a standby; restarted 1 s after
 * a failure).  Each connects to outbox_dispatcher.database as
 * outbox_dispatcher.role and runs one loop:
 *
 *   claim      one short transaction (transitions.cpp od_claim) when there
 *              is room in the pipeline and a reason to look (the rules are
 *              core/schedule.cpp): a commit woke us (latch; no sooner than
 *              min_claim_interval after the latest claim of any worker,
 *              unless ours came back full), the last claim came back full,
 *              or poll_interval passed.  Rows are copied
 *              out and the transaction commits before anything is sent.
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
 * heap object reached through the worker's state (W.disp, worker.h), and
 * every call into it is noexcept.
 *
 * The workers commit with synchronous_commit = off: a claim or finalize lost
 * in a crash is redone after the lease expires (a duplicate, never a loss).
 *
 * SIGTERM (pg_terminate_backend, shutdown): stop claiming, give requests in
 * flight up to one second, finalize what finished, hand the rest back to
 * pending at once (attempt refunded), exit.
 */
#include "worker.h"
#include "attempt_log.h"

extern "C" {
PGDLLEXPORT void od_worker_main(Datum arg);
}

using namespace odw;

/* ---------------------------------------------------------------- state */

static volatile sig_atomic_t got_sigterm = false;

/* results wait this long for a claim to share its transaction (core/schedule.hpp) */
#define FLUSH_AFTER_MS 2

OdWorker odw::W;

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

/*
 * outbox_dispatcher.worker_nice: under CPU contention the application's
 * backends go first.  Only ever lowered (a process cannot raise its own
 * priority back), hence a postmaster setting applied once at start.
 */
static void
lower_priority(void)
{
    if (od_worker_nice <= 0)
        return;
    if (setpriority(PRIO_PROCESS, 0, od_worker_nice) != 0)
        ereport(WARNING,
                (errmsg("outbox_dispatcher worker %d: could not set its nice value to %d: %m", W.worker_index,
                        od_worker_nice)));
}

namespace odw {

void
set_state(OdWorkerState st)
{
    pg_atomic_write_u32(&W.slot->state, (uint32) st);
}

void
record_error(const char *msg)
{
    SpinLockAcquire(&W.slot->mutex);
    strlcpy(W.slot->last_error, msg, sizeof(W.slot->last_error));
    W.slot->last_error_at = GetCurrentTimestamp();
    SpinLockRelease(&W.slot->mutex);
}

} // namespace odw

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

namespace odw {

void
begin_tx(const char *activity)
{
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    SPI_connect();
    PushActiveSnapshot(GetTransactionSnapshot());
    pgstat_report_activity(STATE_RUNNING, activity);
}

void
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

} // namespace odw

/* ---------------------------------------------------------------- settings */

static void
apply_settings(void)
{
    od::DispatcherSettings s; /* trivially safe: built and handed over without PG calls */
    char                   srcbuf[NAMEDATALEN + 64];

    if (od_source && od_source[0])
        strlcpy(srcbuf, od_source, sizeof(srcbuf));
    else
        snprintf(srcbuf, sizeof(srcbuf), "/postgresql/%s/outbox", od_database);
    try
    {
        s.wire.source = srcbuf;
        s.wire.id_prefix = od_message_id_prefix ? od_message_id_prefix : "";
    }
    catch (...)
    {}
    try
    {
        /* both were checked when they were set */
        od::parse_networks(od_denied_networks, s.egress.denied);
        od::parse_networks(od_allowed_networks, s.egress.allowed);
        s.proxy = od_proxy ? od_proxy : "";
        s.no_proxy = od_no_proxy ? od_no_proxy : "";
    }
    catch (...)
    {}
    s.max_attempts = od_max_attempts;
    s.backoff.base_ms = od_backoff_base_ms;
    s.backoff.cap_ms = od_backoff_cap_ms;
    s.defer_delay_ms = od_defer_delay_ms;
    s.max_retry_after_s = Max((int64) od_backoff_cap_ms / 1000, (int64) od_max_defer_age_s);
    s.max_transfers = W.transfer_budget;
    /* what one worker can have in flight: every request keeps its connection */
    s.pool_connections = (size_t) od_batch_size * 2;
    W.disp->set_settings(s);
    replication_check_settings();
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
    c.last_claim = (TimestampTz) pg_atomic_read_u64(&od_shared->last_claim_at);
    /* the latest claim of any worker: commits between two claims go in one */
    c.claim_spacing_us = (int64) od_min_claim_interval_ms * 1000;
    c.last_claim_full = W.sched.last_claim_full;
    c.next_poll = W.sched.next_poll;
    c.next_quota = W.next_quota_at;
    c.places_released = W.places_released;
    c.claim_quota_full = W.claim_quota_full;
    c.claims_held = replication_claims_held();
    c.replication_poll = replication_poll_at(now);
    c.results = (int) W.disp->outcomes().size();
    c.in_flight = (int) W.disp->in_flight();
    c.oldest_result = W.oldest_outcome_at;
    c.flush_after_us = (int64) FLUSH_AFTER_MS * 1000;
    c.next_refresh = W.sched.next_refresh;
    /* a committed change of outbox.endpoints, or a slot we referenced changed hands */
    c.endpoints_changed =
        W.endpoints_stale || pg_atomic_read_u64(&od_shared->endpoints_generation) != W.endpoints_generation;
    c.purges = W.worker_index == 0 && W.ext_ready && od_retention_s > 0;
    c.next_purge = W.sched.next_purge;
    return c;
}

/* ---------------------------------------------------------------- shutdown */

static void
shutdown_worker(void)
{
    TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);

    ereport(LOG,
            (errmsg("outbox_dispatcher worker %d: shutting down with %zu request(s) in flight", W.worker_index,
                    W.disp->in_flight())));
    while (W.disp->in_flight() > 0 && GetCurrentTimestamp() < deadline)
    {
        wait_for_events(50);
        W.disp->collect(od_unix_seconds(GetCurrentTimestamp()));
    }
    W.disp->abandon(od_unix_seconds(GetCurrentTimestamp()),
                    "worker stopped before delivery finished; released for another worker");
    process_new_outcomes();
    if (W.ext_ready)
        do_finalize();
    proc_exit(1); /* non-zero: the postmaster restarts us unless it is shutting down */
}

/* ---------------------------------------------------------------- the loop's steps */

/* SIGHUP: the new settings, a reload of the endpoints, and a claim's look. */
static void
reload_configuration(void)
{
    ConfigReloadPending = false;
    ProcessConfigFile(PGC_SIGHUP);
    apply_settings();
    W.sched.next_refresh = 0;
    W.sched.next_attempt_expiry = 0;
    W.sched.woken = true;
}

/* The extension's state and the endpoints, and when to look again. */
static void
step_reload_endpoints(TimestampTz now)
{
    /* read before the reload: a change committed during it is seen next time */
    W.endpoints_generation = pg_atomic_read_u64(&od_shared->endpoints_generation);
    W.endpoints_stale = false;
    refresh_endpoints();
    W.sched.next_refresh = now +
        od::refresh_period_us(W.ext_ready && od_schema_announces_endpoint_changes(W.schema),
                              (int64) od_poll_interval_ms * 1000);
}

/* Claim up to room rows (with the waiting results in the same transaction). */
static void
step_claim(int room)
{
    int n;

    W.sched.woken = false;
    pg_atomic_write_u64(&od_shared->last_claim_at, (uint64) GetCurrentTimestamp());
    n = do_claim(room, !W.disp->outcomes().empty());
    W.sched.last_claim_full = (n == room) || W.claim_quota_full;
    if (n > 0 && W.sched.last_claim_full)
        od_wake_idle_peer(W.worker_index); /* there may be more: share it */
    W.sched.next_poll = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), od_poll_interval_ms);
}

/* Send what is queued (nothing new once stopping), and note when results started waiting. */
static void
step_pump(TimestampTz now)
{
    if (!got_sigterm && replication_may_send(now))
        W.disp->pump(od_unix_seconds(now));
    pg_atomic_write_u32(&W.slot->in_flight, (uint32) W.disp->in_flight());
    if (!W.disp->outcomes().empty() && now >= W.sched.backoff_until && W.oldest_outcome_at == 0)
        W.oldest_outcome_at = now;
}

/* Retention (worker 0): old done rows, in small batches. */
static void
step_purge(void)
{
    uint64 purged;

    begin_tx("purging done messages");
    purged = od_purge((int64) od_retention_s * USECS_PER_SEC, 1000);
    end_tx();
    W.sched.next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), purged == 1000 ? 100 : 10000);
}

/*
 * Attempt-log retention (worker 0): empty the days older than
 * attempt_log_retention, every minute and after a reload.
 */
static void
step_expire_attempts(void)
{
    bool recheck = W.sched.next_attempt_expiry == 0;

    /* set first: an ERROR below waits for the next minute, not the next second */
    W.sched.next_attempt_expiry = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 60000);
    begin_tx("expiring the attempt log");
    od_expire_attempts((od_attempt_log_retention_s + 86399) / 86400, recheck);
    end_tx();
}

/* Sleep until the least of the schedule's deadlines, a socket, the latch or postmaster death. */
static void
step_wait(void)
{
    TimestampTz now = GetCurrentTimestamp();
    long        timeout;

    if (replication_waiting())
        set_state(OD_STATE_WAITING_REPLICATION);
    else if (W.disp->in_flight() > 0)
        set_state(OD_STATE_DELIVERING);
    else if (od_enabled)
        set_state(OD_STATE_IDLE);
    else if (W.ext_ready)
        set_state(OD_STATE_PAUSED); /* not "finalizing" while it sleeps after a finalize */
    timeout = od::wait_ms(now, od::next_wakeup(observe(now)));
    /*
     * A signal whose latch wake was consumed by a wait inside PostgreSQL
     * during this iteration (a lock wait, for one) would otherwise sleep
     * until the next deadline: handle it first.
     */
    if (ConfigReloadPending || got_sigterm)
        timeout = 0;
    /*
     * idle: nothing queued or in flight — wakes may pick us alone (results
     * waiting to be finalized go with the claim the wake brings)
     */
    if (timeout != 0 && W.disp->outstanding() == 0)
    {
        if (W.stats_pending && W.disp->outcomes().empty())
        {
            pgstat_report_stat(true); /* going idle: what we changed is visible now */
            W.stats_pending = false;
        }
        pg_atomic_write_u32(&W.slot->idle, 1);
    }
    if (wait_for_events(timeout))
        W.sched.woken = true;
    pg_atomic_write_u32(&W.slot->idle, 0);
    CHECK_FOR_INTERRUPTS();
}

/* ---------------------------------------------------------------- main */

extern "C" void
od_worker_main(Datum arg)
{
    sigjmp_buf local_sigjmp_buf;

    W.worker_index = DatumGetInt32(arg);
    W.sched.woken = true; /* look once at start */
    if (IsBinaryUpgrade)
        proc_exit(0); /* never registered then; step aside all the same */
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

    W.lease_owner = MemoryContextStrdup(TopMemoryContext, psprintf("worker-%d/pid-%d", W.worker_index, MyProcPid));
    W.cycle_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher cycle", ALLOCSET_DEFAULT_SIZES);
    W.endpoint_ctx = AllocSetContextCreate(TopMemoryContext, "outbox_dispatcher endpoints", ALLOCSET_SMALL_SIZES);
    W.n_holds = od_shared->max_endpoints;
    W.holds = (SlotHold *) MemoryContextAllocZero(TopMemoryContext, sizeof(SlotHold) * W.n_holds);
    W.transfer_budget = raise_fd_limit();
    lower_priority();

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
        int         room;

        MemoryContextSwitchTo(W.cycle_ctx);
        MemoryContextReset(W.cycle_ctx);
        if (got_sigterm)
            shutdown_worker();
        if (ConfigReloadPending)
            reload_configuration();
        pg_atomic_fetch_add_u64(&W.slot->cycles, 1);

        now = GetCurrentTimestamp();
        if (od::refresh_now(observe(now)))
            step_reload_endpoints(now);
        if ((room = od::claim_now(observe(now))) > 0)
            step_claim(room);
        if (W.ext_ready && !od_enabled)
            set_state(OD_STATE_PAUSED);

        now = GetCurrentTimestamp();
        step_tokens(now);
        step_pump(now);
        if (od::finalize_now(observe(now)))
            do_finalize();
        if (od::purge_now(observe(now)))
            step_purge();
        if (W.worker_index == 0 && W.ext_ready && od_schema_has_fanout(W.schema) &&
            now >= W.sched.next_attempt_expiry && now >= W.sched.backoff_until)
            step_expire_attempts();

        step_wait();
        W.disp->collect(od_unix_seconds(GetCurrentTimestamp()));
        if (W.n_oauth > 0)
        {
            /* a 401 queued a message again, or a token arrived: send before sleeping */
            now = GetCurrentTimestamp();
            step_tokens(now);
            step_pump(now);
        }
        process_new_outcomes();
    }
}
