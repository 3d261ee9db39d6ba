/*
 * worker_finalize.cpp — results of deliveries: endpoint accounting
 * (breaker, statistics, places given back), then the fenced finalize
 * (transitions.cpp od_finalize), alone or inside a claim's transaction.
 * See worker.h.
 */
#include "worker.h"

extern "C" {
#include "access/xact.h"
#include "utils/resowner.h"
}
#include "attempt_log.h"
#include "core/attempt_log.hpp"

namespace odw {

/* a prepared finalize in a transaction of its own */
void
finalize_alone(FinalizeBatch *fb)
{
    set_state(OD_STATE_FINALIZING);
    begin_tx("finalizing deliveries");
    finalize_run(fb);
    end_tx();
    finalize_done(fb);
}

/* ---------------------------------------------------------------- results */

/* Endpoint slot s has failed for longer than its disable_after: disable it with the next finalize. */
static void
note_disable(int s, TimestampTz since, int64 after_us)
{
    for (int i = 0; i < W.n_disable; i++)
        if (W.disable_tags[i] == s)
            return;
    if (W.n_disable >= OD_MAX_PENDING_DISABLES)
        return; /* the next failure of that endpoint notes it again */
    W.disable_tags[W.n_disable] = s;
    W.disable_since[W.n_disable] = since;
    W.disable_after_us[W.n_disable] = after_us;
    W.n_disable++;
}

/*
 * For every outcome not seen yet: release its in-flight place and tell the
 * endpoint's shared state how it went (breaker, statistics), and note the
 * endpoints that have failed for longer than their disable_after.
 */
void
process_new_outcomes(void)
{
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();
    TimestampTz                       now = GetCurrentTimestamp();

    for (; W.outcomes_seen < outs.size(); W.outcomes_seen++)
    {
        const od::DeliveryOutcome &o = outs[W.outcomes_seen];
        int                        s = o.endpoint_tag;
        bool                       probe;
        SlotHold                  *h;

        if (s < 0 || s >= W.n_holds)
            continue;
        h = &W.holds[s];
        probe = (h->probe_id != 0 && h->probe_id == o.id);
        if (probe)
            h->probe_id = 0;
        W.places_released = true;
        if (!o.counts_for_endpoint())
        {
            /* never sent, or failed on our side (released at shutdown, not sendable,
             * out of file descriptors): not the endpoint's doing */
            if (probe)
                od_endpoint_unreserve(h->ref, 0, true);
        }
        else
        {
            /* before the place is released: a slot with places held is never reclaimed */
            od::EndpointSignal sig = od::endpoint_signal(o.verdict, o.http_status);
            TimestampTz        failing_since =
                od_endpoint_result(h->ref, &h->lim, sig, o.http_status, o.latency_ms, o.error, probe, now);

            /* failing since the later of the first failure and the endpoint's last change (a resume) */
            if (failing_since > 0 && h->lim.changed_at > failing_since)
                failing_since = h->lim.changed_at;
            /* only a failure disables: a neutral answer (4xx, defer) neither starts nor ends the measure */
            if (sig == od::EndpointSignal::Failure && h->lim.disable_after_us > 0 && failing_since > 0 &&
                now - failing_since >= h->lim.disable_after_us)
                note_disable(s, failing_since, h->lim.disable_after_us);
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

/*
 * The endpoint behind a slot tag, as this worker last loaded it (NULL if
 * none): endpoints are identified by their slot's key, never by a name.
 */
static const WorkerEndpoint *
endpoint_of_tag(int tag)
{
    for (int k = 0; k < W.n_wendpoints; k++)
        if (W.wendpoints[k].ref.slot == tag)
            return &W.wendpoints[k];
    return nullptr;
}

bool
finalize_prepare(FinalizeBatch *fb)
{
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();
    int                               n = (int) outs.size();

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
        OdFinalize                *it = &fb->items[i];

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
        if (od::answer_disables_endpoint(o.http_status) && o.endpoint_tag >= 0)
        {
            od::GoneFinalize g = od::finalize_after_gone(od_defer_delay_ms);

            it->verdict = g.verdict;
            it->refund = g.refund;
            it->delay_us = g.delay_ms * 1000;
            it->error = g.error;
            if (const WorkerEndpoint *w = endpoint_of_tag(o.endpoint_tag))
            {
                fb->gone[fb->n_gone] = MemoryContextStrdup(W.cycle_ctx, w->name);
                fb->gone_id[fb->n_gone] = w->id;
                fb->n_gone++;
            }
        }
    }
    return true;
}

/*
 * The log must never hold the results back: written in a subtransaction,
 * whose failure (a partition detached or locked away, a constraint an
 * operator added) drops these rows with a WARNING — at most one a minute —
 * and lets the finalize commit.
 */
static void
write_attempts(const OdAttempt *rows, int n)
{
    static TimestampTz last_warning = 0;
    MemoryContext      cxt = CurrentMemoryContext;
    ResourceOwner      owner = CurrentResourceOwner;

    if (n <= 0)
        return;
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(cxt);
    PG_TRY();
    {
        od_log_attempts(rows, n);
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(cxt);
        CurrentResourceOwner = owner;
    }
    PG_CATCH();
    {
        ErrorData  *edata;
        TimestampTz now = GetCurrentTimestamp();

        MemoryContextSwitchTo(cxt);
        edata = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(cxt);
        CurrentResourceOwner = owner;
        if (now - last_warning >= 60 * USECS_PER_SEC)
        {
            last_warning = now;
            ereport(WARNING,
                    (errmsg("outbox_dispatcher: %d row(s) of outbox.attempts were not written: %s", n, edata->message),
                     errdetail("The deliveries were finalized; only their attempt log is missing.")));
        }
        FreeErrorData(edata);
    }
    PG_END_TRY();
}

/*
 * One outbox.attempts row per request sent (not for messages released
 * unsent or failed on our side), in the finalize's transaction: the log
 * commits with the results it describes.
 */
static void
log_attempts(FinalizeBatch *fb)
{
    std::vector<od::DeliveryOutcome> &outs = W.disp->outcomes();
    OdAttempt                        *rows;
    int                               n = 0;

    if (od_attempt_log == OD_ATTEMPT_LOG_OFF || !od_schema_has_fanout(W.schema))
        return;
    rows = (OdAttempt *) palloc(sizeof(OdAttempt) * fb->n);
    for (int i = 0; i < fb->n; i++)
    {
        const od::DeliveryOutcome &o = outs[i];
        const OdFinalize          *it = &fb->items[i];
        OdAttempt                 *r = &rows[n];

        if (o.latency_ms < 0 || o.local_failure || o.started_unix_us == 0)
            continue;
        if (od_attempt_log == OD_ATTEMPT_LOG_FAILURES && it->applied && it->verdict == od::Verdict::Done)
            continue;
        r->message_id = o.id;
        r->lease_version = o.lease_version;
        r->attempt = o.attempts;
        {
            const WorkerEndpoint *w = endpoint_of_tag(o.endpoint_tag);

            r->endpoint = w ? w->name : "(unknown)";
        }
        r->worker = W.worker_index;
        r->started_at = od_from_unix_micros(o.started_unix_us);
        r->duration_ms = o.latency_ms;
        r->outcome = it->applied ? od::verdict_name(it->verdict) : "lost"; /* as finalized (410: retry) */
        r->http_status = o.transport_error == 0 && o.http_status >= 100 && o.http_status <= 599 ? o.http_status : 0;
        r->error_class = od::transport_error_class(o.transport_error);
        if (r->error_class == nullptr && r->http_status == 0)
            r->error_class = "protocol"; /* a response that was not HTTP */
        r->retry_after = nullptr;
        if (o.retry_after[0] != '\0')
        {
            char *ra = (char *) palloc(sizeof o.retry_after);

            od::sanitize_text(o.retry_after, strlen(o.retry_after), ra, sizeof o.retry_after);
            r->retry_after = ra[0] ? ra : nullptr;
        }
        r->body = nullptr;
        if (o.body_len > 0)
        {
            char *b = (char *) palloc(od::kBodyCap + 1);

            od::sanitize_text(o.body, o.body_len, b, od::kBodyCap + 1);
            r->body = b[0] ? b : nullptr;
        }
        n++;
    }
    write_attempts(rows, n);
}

/*
 * disable_after: an endpoint every attempt of which has failed for that
 * long is disabled, with the reason, in the finalize's transaction (the
 * endpoints_disabled trigger logs it and notifies at commit).  Several
 * workers may find the same endpoint: the first one disables it.
 */
static void
disable_failing_endpoints(void)
{
    int n = W.n_disable;

    W.n_disable = 0;
    for (int i = 0; i < n; i++)
        if (const WorkerEndpoint *w = endpoint_of_tag(W.disable_tags[i]))
            od_set_endpoint_enabled(
                w->id, false,
                psprintf("every attempt failed for longer than disable_after (%s) since %s",
                         DatumGetCString(DirectFunctionCall1(interval_out, od_us_to_interval(W.disable_after_us[i]))),
                         timestamptz_to_str(W.disable_since[i])));
}

void
finalize_run(FinalizeBatch *fb)
{
    od_finalize(fb->items, fb->n, od_schema_has_fanout(W.schema) ? OD_FINALIZE_DEAD_AT : 0);
    fb->ordered_done = false;
    for (int i = 0; i < fb->n && !fb->ordered_done; i++)
        fb->ordered_done = fb->items[i].ordered_done; /* only ever set for applied rows */
    log_attempts(fb);
    for (int i = 0; i < fb->n_gone; i++)
    {
        if (od_set_endpoint_enabled(fb->gone_id[i], false, "HTTP 410 Gone received by the dispatcher"))
            ereport(LOG,
                    (errmsg("outbox_dispatcher: endpoint \"%s\" answered 410 Gone and was disabled", fb->gone[i]),
                     errhint("Fix the endpoint, then run SELECT outbox.resume_endpoint(%s).",
                             quote_literal_cstr(fb->gone[i]))));
    }
    disable_failing_endpoints();
}

void
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
            case od::Verdict::Done:
                pg_atomic_fetch_add_u64(&W.slot->delivered, 1);
                break;
            case od::Verdict::Retry:
                pg_atomic_fetch_add_u64(&W.slot->retried, 1);
                break;
            case od::Verdict::Defer:
                pg_atomic_fetch_add_u64(&W.slot->deferred, 1);
                break;
            case od::Verdict::Dead:
                pg_atomic_fetch_add_u64(&W.slot->dead, 1);
                break;
        }
        if (it->verdict != od::Verdict::Done && it->error)
            record_error(it->error);
    }
    /* committed: successors of these ordered messages may be below the workers' floors (core/ready_floor.hpp) */
    if (fb->ordered_done && od_shared != nullptr)
        pg_atomic_fetch_add_u64(&od_shared->ordered_done, 1);
    outs.clear();
    W.outcomes_seen = 0;
    W.oldest_outcome_at = 0;
    memset(fb, 0, sizeof(*fb));
}

void
do_finalize(void)
{
    FinalizeBatch fb;

    if (finalize_prepare(&fb))
        finalize_alone(&fb);
}

} // namespace odw
