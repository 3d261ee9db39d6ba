/*
 * endpoint_state.cpp — per-endpoint state shared by every worker.
 *
 * Circuit breaker.  Retryable failures (5xx, 408/425/429, transport errors)
 * count up; breaker_threshold consecutive ones open the breaker for
 * breaker_cooldown, doubled for every trip since the last success (capped at
 * one hour).  While open, reservations return 0, so the endpoint's messages
 * are neither claimed nor charged an attempt.  When the cool-down is over the
 * first worker to ask takes the single probe (half-open); a success closes
 * the breaker and resets the count, a failure opens it again for longer.
 *
 * max_in_flight.  Claims reserve places up front (od_endpoint_reserve) and
 * return the unused ones; a place is released when its request finishes.
 * The count is cluster-wide, so the limit holds across all workers.  A worker
 * that exits releases what it still holds (worker.cpp); a crash restart
 * reinitializes shared memory.
 *
 * rate_limit.  A token bucket refilled at rate_limit tokens per second with
 * a capacity of a tenth of a second of tokens (at least one), shared by all
 * workers; one token per claimed message.
 *
 * Slots (see OdEndpointSlot): keyed by (endpoints table oid, endpoint id),
 * outbox_dispatcher.max_endpoints of them, reclaimed from endpoints the
 * workers no longer serve when the table is full; every call presents the
 * generation its reference was made under.
 *
 * OAuth.  One access token per endpoint for all workers, with the hash of
 * the client configuration it was obtained for (a worker whose
 * configuration differs neither uses nor keeps it).  The first worker that
 * needs a fetch (no token, refresh_at passed, or a 401 rejected the
 * current generation) takes it for the endpoint's timeout plus a second;
 * the others keep sending the current token meanwhile, or wait for the new
 * one.  A failed fetch backs the next one off (core/oauth.hpp
 * token_retry_delay_ms) and bumps token_failed_seq, which tells every
 * worker to give up on the messages it holds waiting for a token.
 *
 * Locking: od_shared->endpoint_lock (exclusive) only to assign or reclaim a
 * slot; every other access holds the slot's spinlock for a few instructions
 * and calls nothing while holding it (a token, at most 4 KB, is copied
 * under it only when its generation is new to the reader).
 */
#include "outbox_dispatcher.h"
#include "endpoint_state.h"
#include "module.h"
#include "core/oauth.hpp"

static_assert(OD_MAX_ACCESS_TOKEN == od::kMaxAccessToken, "one token size");

extern "C" {
#include "mb/pg_wchar.h"
#include "storage/lwlock.h"
#include "utils/timestamp.h"
}

#define BREAKER_MAX_COOLDOWN_US (INT64CONST(3600) * USECS_PER_SEC)
#define BUCKET_SECONDS 0.1
/* a refused reservation is looked at again at least this often */
#define MAX_RETRY_WAIT_US (INT64CONST(60) * USECS_PER_SEC)

static inline OdEndpointSlot *
slot_of(OdEndpointRef ref)
{
    if (od_shared == nullptr || ref.slot < 0 || ref.slot >= od_shared->max_endpoints)
        return nullptr;
    return &od_endpoint_slots()[ref.slot];
}

/* Is ref still the owner of its slot?  Caller holds the slot spinlock. */
static inline bool
current(const OdEndpointSlot *e, OdEndpointRef ref)
{
    return e->used && e->generation == ref.generation;
}

/* Drop the slot's access token (token_next_generation keeps counting). */
static void
forget_token(OdEndpointSlot *e)
{
    explicit_bzero(e->token, sizeof(e->token));
    e->token_len = 0;
    e->token_generation = 0;
    e->token_refresh_at = 0;
    e->token_usable_until = 0;
}

static void
init_slot(OdEndpointSlot *e, Oid relid, int64 id, const char *label)
{
    int len = (int) strlen(label);

    e->generation++;
    e->relid = relid;
    e->id = id;
    /* a display copy only: cut at a character boundary */
    len = pg_mbcliplen(label, len, OD_ENDPOINT_LABEL - 1);
    memcpy(e->label, label, len);
    e->label[len] = '\0';
    e->breaker = OD_BREAKER_CLOSED;
    e->consecutive_failures = 0;
    e->trips = 0;
    e->opened_at = 0;
    e->next_probe_at = 0;
    e->probe_taken = false;
    e->in_flight = 0;
    e->tokens = -1; /* filled on first use */
    e->tokens_cap = 0;
    e->tokens_at = 0;
    e->last_status = 0;
    e->last_success_at = 0;
    e->last_failure_at = 0;
    e->failing_since = 0;
    e->last_error[0] = '\0';
    e->delivered = e->failed = 0;
    e->latency_count = e->latency_sum_us = e->latency_max_us = 0;
    memset(e->latency_buckets, 0, sizeof(e->latency_buckets));
    forget_token(e);
    e->token_client = 0;
    e->token_fetch_until = 0;
    e->token_next_fetch = 0;
    e->token_failures = 0;
    e->token_failed_seq = 0;
    e->token_error[0] = '\0';
    e->used = true;
}

static bool
in_keep(int64 id, const int64 *keep, int n_keep)
{
    for (int i = 0; i < n_keep; i++)
        if (keep[i] == id)
            return true;
    return false;
}

/* The slot holding endpoint (relid, id), or -1.  Caller holds endpoint_lock. */
static int
find_slot(const OdEndpointSlot *slots, int n, Oid relid, int64 id)
{
    for (int i = 0; i < n; i++)
        if (slots[i].used && slots[i].relid == relid && slots[i].id == id)
            return i;
    return -1;
}

/* Point ref at slot i as it is now. */
static void
take_ref(OdEndpointSlot *slots, int i, OdEndpointRef *ref)
{
    SpinLockAcquire(&slots[i].mutex);
    ref->slot = i;
    ref->generation = slots[i].generation;
    SpinLockRelease(&slots[i].mutex);
}

bool
od_endpoint_acquire(Oid relid, int64 id, const char *label, const int64 *keep, int n_keep, OdEndpointRef *ref)
{
    OdEndpointSlot *slots;
    int             n;
    int             found;
    int             free_slot = -1;

    ref->slot = -1;
    ref->generation = 0;
    if (od_shared == nullptr)
        return false;
    slots = od_endpoint_slots();
    n = od_shared->max_endpoints;

    /* fast path: already assigned (slots are only assigned under the exclusive lock) */
    LWLockAcquire(od_shared->endpoint_lock, LW_SHARED);
    found = find_slot(slots, n, relid, id);
    if (found >= 0)
        take_ref(slots, found, ref);
    LWLockRelease(od_shared->endpoint_lock);
    if (found >= 0)
        return true;

    LWLockAcquire(od_shared->endpoint_lock, LW_EXCLUSIVE);
    found = find_slot(slots, n, relid, id);
    for (int i = 0; i < n && found < 0 && free_slot < 0; i++)
        if (!slots[i].used)
            free_slot = i;
    if (found < 0 && free_slot < 0)
    {
        /*
         * Full: reclaim the slot of an endpoint that the caller does not
         * serve (deleted, disabled, or of a dropped extension) and that has
         * nothing in flight and no probe out.  Its generation moves on, so
         * a worker still holding a reference sees it as stale.
         */
        for (int i = 0; i < n && free_slot < 0; i++)
        {
            OdEndpointSlot *e = &slots[i];

            SpinLockAcquire(&e->mutex);
            if (e->used && e->in_flight == 0 && !e->probe_taken && (e->relid != relid || !in_keep(e->id, keep, n_keep)))
            {
                e->used = false;
                e->generation++;
                free_slot = i;
            }
            SpinLockRelease(&e->mutex);
        }
    }
    if (found < 0 && free_slot >= 0)
    {
        OdEndpointSlot *e = &slots[free_slot];

        SpinLockAcquire(&e->mutex);
        init_slot(e, relid, id, label);
        SpinLockRelease(&e->mutex);
        found = free_slot;
    }
    if (found >= 0)
        take_ref(slots, found, ref);
    LWLockRelease(od_shared->endpoint_lock);
    return found >= 0;
}

int
od_endpoint_reserve(OdEndpointRef ref, const OdEndpointLimits *lim, int want, TimestampTz now, bool *probe,
                    TimestampTz *retry_at, bool *stale)
{
    OdEndpointSlot *e = slot_of(ref);
    int             n = want;

    *probe = false;
    *retry_at = 0;
    *stale = false;
    if (e == nullptr)
        return want;

    SpinLockAcquire(&e->mutex);
    if (!current(e, ref))
    {
        SpinLockRelease(&e->mutex);
        *stale = true;
        return 0;
    }
    if (e->breaker == OD_BREAKER_OPEN)
    {
        if (now < e->next_probe_at)
        {
            *retry_at = e->next_probe_at;
            n = 0;
        }
        else
        {
            e->breaker = OD_BREAKER_HALF_OPEN;
            e->probe_taken = true;
            *probe = true;
            n = Min(n, 1);
        }
    }
    else if (e->breaker == OD_BREAKER_HALF_OPEN)
    {
        if (e->probe_taken)
            n = 0;
        else
        {
            e->probe_taken = true;
            *probe = true;
            n = Min(n, 1);
        }
    }

    if (n > 0 && lim->max_in_flight > 0)
        n = Min(n, Max(0, lim->max_in_flight - e->in_flight));

    if (n > 0 && lim->rate_limit > 0)
    {
        double cap = Max(1.0, lim->rate_limit * BUCKET_SECONDS);

        e->tokens_cap = cap;
        if (e->tokens < 0 || e->tokens_at == 0)
        {
            e->tokens = cap;
            e->tokens_at = now;
        }
        else if (now > e->tokens_at)
        {
            e->tokens = Min(cap, e->tokens + lim->rate_limit * (double) (now - e->tokens_at) / USECS_PER_SEC);
            e->tokens_at = now;
        }
        if (e->tokens < n)
        {
            double wait_us;

            n = (int) e->tokens;
            /*
             * Come back when the bucket is full again rather than for every
             * token; computed in floating point and clamped, so that a tiny
             * rate cannot overflow the deadline into the past.
             */
            wait_us = (cap - e->tokens + n) / lim->rate_limit * USECS_PER_SEC;
            if (!(wait_us < (double) MAX_RETRY_WAIT_US))
                wait_us = (double) MAX_RETRY_WAIT_US;
            *retry_at = now + (int64) wait_us + 1;
        }
        e->tokens -= n;
    }

    if (n <= 0 && *probe)
    {
        /* could not use the probe after all (no room) */
        e->probe_taken = false;
        *probe = false;
    }
    e->in_flight += Max(n, 0);
    SpinLockRelease(&e->mutex);
    return Max(n, 0);
}

bool
od_endpoint_breaker_open(OdEndpointRef ref)
{
    OdEndpointSlot *e = slot_of(ref);
    bool            open;

    if (e == nullptr)
        return false;
    SpinLockAcquire(&e->mutex);
    open = current(e, ref) && (e->breaker != OD_BREAKER_CLOSED);
    SpinLockRelease(&e->mutex);
    return open;
}

void
od_endpoint_unreserve(OdEndpointRef ref, int n, bool probe)
{
    OdEndpointSlot *e = slot_of(ref);

    if (e == nullptr || (n <= 0 && !probe))
        return;
    SpinLockAcquire(&e->mutex);
    if (!current(e, ref))
    {
        SpinLockRelease(&e->mutex);
        return;
    }
    n = Max(n, 0);
    e->in_flight = Max(0, e->in_flight - n);
    /* unused tokens go back, but never above the bucket's capacity */
    if (e->tokens >= 0)
        e->tokens = Min(e->tokens + n, Max(e->tokens_cap, 1.0));
    if (probe)
        e->probe_taken = false; /* nothing was claimed: the next claim may probe */
    SpinLockRelease(&e->mutex);
}

bool
od_endpoint_hold(OdEndpointRef ref, int n)
{
    OdEndpointSlot *e = slot_of(ref);
    bool            ok;

    if (n <= 0 || e == nullptr)
        return true; /* nothing to count, or no shared state for it */
    SpinLockAcquire(&e->mutex);
    ok = current(e, ref);
    if (ok)
        e->in_flight += n;
    SpinLockRelease(&e->mutex);
    return ok;
}

void
od_endpoint_release(OdEndpointRef ref, int n)
{
    OdEndpointSlot *e = slot_of(ref);

    if (e == nullptr || n <= 0)
        return;
    SpinLockAcquire(&e->mutex);
    if (current(e, ref))
        e->in_flight = Max(0, e->in_flight - n);
    SpinLockRelease(&e->mutex);
}

TimestampTz
od_endpoint_result(OdEndpointRef ref, const OdEndpointLimits *lim, od::EndpointSignal r, int http_status,
                   double latency_ms, const char *error, bool probe, TimestampTz now)
{
    OdEndpointSlot *e = slot_of(ref);
    uint64          us = od::latency_us(latency_ms);
    int             b = od::latency_bucket(us);

    TimestampTz     failing_since;

    if (e == nullptr)
        return 0;

    SpinLockAcquire(&e->mutex);
    if (!current(e, ref))
    {
        SpinLockRelease(&e->mutex);
        return 0;
    }
    if (http_status > 0)
        e->last_status = http_status;
    if (latency_ms >= 0)
    {
        e->latency_count++;
        e->latency_sum_us += us;
        e->latency_buckets[b]++;
        if (us > e->latency_max_us)
            e->latency_max_us = us;
    }
    if (r == od::EndpointSignal::Success)
    {
        e->delivered++;
        e->last_success_at = now;
        e->failing_since = 0;
        e->consecutive_failures = 0;
        e->trips = 0;
        e->breaker = OD_BREAKER_CLOSED;
        e->probe_taken = false;
    }
    else if (r == od::EndpointSignal::Failure)
    {
        e->failed++;
        e->last_failure_at = now;
        if (e->failing_since == 0)
            e->failing_since = now;
        e->consecutive_failures++;
        if (error)
            strlcpy(e->last_error, error, sizeof(e->last_error));
        if (probe || e->breaker == OD_BREAKER_HALF_OPEN ||
            (e->breaker == OD_BREAKER_CLOSED && lim->breaker_threshold > 0 &&
             e->consecutive_failures >= lim->breaker_threshold))
        {
            int64 cooldown = Max(lim->breaker_cooldown_us, (int64) USECS_PER_SEC / 10);

            for (int i = 0; i < e->trips && cooldown < BREAKER_MAX_COOLDOWN_US; i++)
                cooldown *= 2;
            cooldown = Min(cooldown, BREAKER_MAX_COOLDOWN_US);
            e->breaker = OD_BREAKER_OPEN;
            e->trips++;
            e->opened_at = now;
            e->next_probe_at = now + cooldown;
            e->probe_taken = false;
        }
    }
    else
    {
        if (error)
            strlcpy(e->last_error, error, sizeof(e->last_error));
        if (probe)
        {
            /* the endpoint answered: it is up, the breaker closes */
            e->breaker = OD_BREAKER_CLOSED;
            e->consecutive_failures = 0;
            e->trips = 0;
            e->probe_taken = false;
        }
    }
    failing_since = e->failing_since;
    SpinLockRelease(&e->mutex);
    return failing_since;
}

/* ---------------------------------------------------------------- OAuth */

bool
od_endpoint_token_read(OdEndpointRef ref, uint64 client, uint64 have_generation, OdTokenView *v, char *buf,
                       int *len)
{
    OdEndpointSlot *e = slot_of(ref);
    bool            copied = false;

    memset(v, 0, sizeof(*v));
    *len = 0;
    if (e == nullptr)
        return false;
    SpinLockAcquire(&e->mutex);
    if (current(e, ref))
    {
        bool mine = e->token_client == client;

        v->generation = mine ? e->token_generation : 0;
        v->refresh_at = mine ? e->token_refresh_at : 0;
        v->usable_until = mine ? e->token_usable_until : 0;
        v->fetch_until = e->token_fetch_until;
        v->next_fetch = mine ? e->token_next_fetch : 0;
        v->failed_seq = e->token_failed_seq;
        memcpy(v->error, e->token_error, sizeof(v->error));
        if (v->generation != 0 && v->generation != have_generation)
        {
            memcpy(buf, e->token, e->token_len);
            *len = e->token_len;
            copied = true;
        }
    }
    SpinLockRelease(&e->mutex);
    return copied;
}

bool
od_endpoint_token_claim(OdEndpointRef ref, TimestampTz now, TimestampTz until)
{
    OdEndpointSlot *e = slot_of(ref);
    bool            taken = false;

    if (e == nullptr)
        return false;
    SpinLockAcquire(&e->mutex);
    if (current(e, ref) && e->token_fetch_until <= now)
    {
        e->token_fetch_until = until;
        taken = true;
    }
    SpinLockRelease(&e->mutex);
    return taken;
}

uint64
od_endpoint_token_store(OdEndpointRef ref, uint64 client, const char *token, int len, TimestampTz refresh_at,
                        TimestampTz usable_until)
{
    OdEndpointSlot *e = slot_of(ref);
    uint64          gen = 0;

    if (e == nullptr || len <= 0 || len > OD_MAX_ACCESS_TOKEN)
        return 0;
    SpinLockAcquire(&e->mutex);
    if (current(e, ref))
    {
        forget_token(e);
        memcpy(e->token, token, len);
        e->token_len = len;
        e->token_client = client;
        e->token_generation = gen = ++e->token_next_generation;
        e->token_refresh_at = refresh_at;
        e->token_usable_until = usable_until;
        e->token_fetch_until = 0;
        e->token_next_fetch = 0;
        e->token_failures = 0;
        e->token_error[0] = '\0';
    }
    SpinLockRelease(&e->mutex);
    return gen;
}

void
od_endpoint_token_failed(OdEndpointRef ref, uint64 client, const char *error, TimestampTz now)
{
    OdEndpointSlot *e = slot_of(ref);

    if (e == nullptr)
        return;
    SpinLockAcquire(&e->mutex);
    if (current(e, ref))
    {
        if (e->token_client != client)
        {
            forget_token(e); /* another client's token: not ours to keep */
            e->token_client = client;
            e->token_failures = 0;
        }
        e->token_failures = Min(e->token_failures + 1, 1000);
        e->token_next_fetch = now + od::token_retry_delay_ms(e->token_failures) * 1000;
        e->token_fetch_until = 0;
        e->token_failed_seq++;
        strlcpy(e->token_error, error, sizeof(e->token_error));
    }
    SpinLockRelease(&e->mutex);
}

void
od_endpoint_token_reject(OdEndpointRef ref, uint64 generation)
{
    OdEndpointSlot *e = slot_of(ref);

    if (e == nullptr)
        return;
    SpinLockAcquire(&e->mutex);
    /* only the generation rejected: a 401 for an older token does not drop a newer one */
    if (current(e, ref) && e->token_generation == generation)
    {
        e->token_refresh_at = 0;
        e->token_usable_until = 0;
    }
    SpinLockRelease(&e->mutex);
}
