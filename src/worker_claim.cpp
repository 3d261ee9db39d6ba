/*
 * worker_claim.cpp — one claim: places reserved in the shared endpoint
 * slots (breaker, cluster-wide max_in_flight, rate limit), the claim
 * statement (transitions.cpp od_claim), the reservation settled against
 * what came back, and the claimed rows copied into the Dispatcher.  See
 * worker.h.
 */
#include "worker.h"

namespace odw {

/* The next claim reads every endpoint's ready messages from the first entry (core/ready_floor.hpp). */
void
reset_ready_floors(void)
{
    for (int k = 0; k < W.n_wendpoints; k++)
        od::ready_floor_reset(W.wendpoints[k].floor);
}

void
release_pending_reservation(void)
{
    for (int i = 0; i < W.n_pending; i++)
        od_endpoint_unreserve(W.pending[i].ref, W.pending[i].count, W.pending[i].probe);
    W.n_pending = 0;
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
    Jsonb             *jb = DatumGetJsonbP(d);
    JsonbIterator     *it;
    JsonbValue         v;
    JsonbIteratorToken tok;
    int64              bytes = 0;
    int                count = 0;

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
        return psprintf("not sent: the message has %d headers; outbox_dispatcher.max_headers is %d", count,
                        od_max_headers);
    if (bytes > od_max_header_bytes)
        return psprintf("not sent: the message's headers have %lld bytes; outbox_dispatcher.max_header_bytes is %d",
                        (long long) bytes, od_max_header_bytes);
    return nullptr;
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
    const char *reject; /* not sendable (limits): made dead in the claim transaction */
    int64       created_at_us;
    int         endpoint_slot;
    od::ReadyKey position; /* (available_at, id) in messages_ready */
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
int
do_claim(int capacity, bool with_finalize)
{
    ClaimRow     *rows;
    int           n;
    uint64        reaped;
    bool          unknown_endpoint = false;
    const char  **names;
    int          *quotas;
    bool         *takeover;
    int          *got;
    int          *quota_of;
    int          *slot_of_quota;
    int           m = W.n_wendpoints;
    int           n_rejected = 0;
    bool          check_leases;
    bool          any_quota = false;
    TimestampTz   now;
    TimestampTz   claim_start;
    WorkerEndpoint **wk;   /* the endpoint of each quota */
    od::ReadyKey *from;    /* where each endpoint's ready messages are read from */
    od::ReadyKey *first;   /* the first row claimed of each, in index order */
    FinalizeBatch fb;
    /* before reserving: the results release their places first */
    bool          fin = with_finalize && finalize_prepare(&fb);

    now = GetCurrentTimestamp();
    names = (const char **) MemoryContextAllocZero(W.cycle_ctx, sizeof(char *) * (m + 1));
    quotas = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    takeover = (bool *) MemoryContextAllocZero(W.cycle_ctx, sizeof(bool) * (m + 1));
    got = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    slot_of_quota = (int *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int) * (m + 1));
    W.pending = (PendingReservation *) MemoryContextAllocZero(W.cycle_ctx, sizeof(PendingReservation) * (m + 1));
    wk = (WorkerEndpoint **) MemoryContextAllocZero(W.cycle_ctx, sizeof(WorkerEndpoint *) * (m + 1));
    from = (od::ReadyKey *) MemoryContextAllocZero(W.cycle_ctx, sizeof(od::ReadyKey) * (m + 1));
    first = (od::ReadyKey *) MemoryContextAllocZero(W.cycle_ctx, sizeof(od::ReadyKey) * (m + 1));
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
        wk[k] = w;
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
        return 0; /* no enabled endpoint */
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
    {
        finalize_run(&fb);
        /* an ordered message done in this very transaction may free its successor for this claim */
        if (fb.ordered_done)
            reset_ready_floors();
    }
    claim_start = GetCurrentTransactionStartTimestamp();
    /* read before the claim's snapshot is taken: a finalize that bumped it has committed */
    if (od_shared != nullptr)
    {
        uint64 seen = pg_atomic_read_u64(&od_shared->ordered_done);

        if (seen != W.ordered_done_seen)
        {
            reset_ready_floors();
            W.ordered_done_seen = seen;
        }
    }
    for (int k = 0; k < m; k++)
        from[k] = od::ready_scan_from(wk[k]->floor, now);
    reaped = od_claim(W.lease_owner, capacity, (int64) od_lease_ms * 1000, od_max_attempts, names, quotas, takeover,
                      from, m,
                      (check_leases ? OD_CLAIM_CHECK_LEASES : 0) |
                          (od_schema_records_commit_order(W.schema) ? OD_CLAIM_COMMIT_ORDER : 0));
    n = (int) SPI_processed;
    rows = (ClaimRow *) MemoryContextAllocZero(W.cycle_ctx, sizeof(ClaimRow) * (n + 1));
    if (n > 0 && SPI_tuptable->tupdesc->natts != OD_CLAIM_ALL_NATTS)
        elog(ERROR, "outbox_dispatcher: the claim returned %d columns, not %d", SPI_tuptable->tupdesc->natts,
             OD_CLAIM_ALL_NATTS);
    for (int i = 0; i < n; i++)
    {
        /*
         * Each row is taken apart once: reading its columns one by one
         * (SPI_getbinval, SPI_getvalue) walks it from the start for each
         * column after the first text one, and looks up the output function
         * of each text column again.  The columns are those of
         * SQL_CLAIM_UPDATE's RETURNING list, all NOT NULL but headers.
         */
        Datum         v[OD_CLAIM_ALL_NATTS];
        bool          isnull[OD_CLAIM_ALL_NATTS];
        MemoryContext old = MemoryContextSwitchTo(W.cycle_ctx);

        heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, v, isnull);
        rows[i].id = DatumGetInt64(v[0]);
        rows[i].lease_version = DatumGetInt64(v[1]);
        rows[i].attempts = DatumGetInt32(v[2]);
        rows[i].endpoint = TextDatumGetCString(v[3]);
        rows[i].aggregate_type = TextDatumGetCString(v[4]);
        rows[i].aggregate_id = TextDatumGetCString(v[5]);
        rows[i].event_type = TextDatumGetCString(v[6]);
        rows[i].payload = DatumGetCString(DirectFunctionCall1(jsonb_out, v[7]));
        /* checked again here: rows written before the limits were lowered, or by a superuser */
        rows[i].reject = isnull[8] ? nullptr : message_headers_problem(v[8]);
        rows[i].headers = (isnull[8] || rows[i].reject) ? pstrdup("") : od_header_lines_text(v[8]);
        rows[i].created_at_us = od_unix_micros(DatumGetTimestampTz(v[10]));
        rows[i].lease_until = DatumGetTimestampTz(v[OD_CLAIM_NATTS]);
        rows[i].position.at_us = DatumGetTimestampTz(v[OD_CLAIM_NATTS + 1]);
        rows[i].position.id = rows[i].id;
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
        od_finalize(items, n_rejected, od_schema_has_fanout(W.schema) ? OD_FINALIZE_DEAD_AT : 0);
        pg_atomic_fetch_add_u64(&W.slot->dead, n_rejected);
    }
    end_tx();
    if (n > 0)
        replication_claimed(XactLastCommitEnd); /* deliver_after_replication: its messages wait for the standbys */
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
                if (got[k] == 0 || od::ready_key_less(rows[i].position, first[k]))
                    first[k] = rows[i].position;
                got[k]++;
                quota_of[i] = k;
                break;
            }
    }
    /* the floors, now that the claim has committed */
    for (int k = 0; k < m; k++)
        if (quotas[k] > 0)
            od::ready_floor_claimed(wk[k]->floor, now, from[k], claim_start, got[k], first[k]);
    for (int k = 0; k < m; k++)
    {
        OdEndpointRef ref = W.pending[k].ref;
        int           q = Max(quotas[k], 0);
        bool          counted = true;

        if (got[k] < q)
            od_endpoint_unreserve(ref, q - got[k], W.pending[k].probe && got[k] == 0);
        else if (got[k] > q)
            counted = od_endpoint_hold(ref, got[k] - q); /* expired leases taken over */
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
        refresh_endpoints(); /* an endpoint created since the last refresh */
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

} // namespace odw
