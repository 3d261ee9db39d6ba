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
 * Locking: od_shared->endpoint_lock (exclusive) only to assign a slot to a
 * new endpoint name; every other access holds the slot's spinlock for a few
 * instructions and calls nothing while holding it.
 */
#include "outbox_dispatcher.h"

extern "C" {
#include "storage/lwlock.h"
#include "utils/timestamp.h"
}

#define BREAKER_MAX_COOLDOWN_US (INT64CONST(3600) * USECS_PER_SEC)
#define BUCKET_SECONDS 0.1

/*
 * A slot keeps the first OD_ENDPOINT_NAME - 1 bytes of the name: longer names
 * are looked up by that prefix too (comparing the whole name would never
 * match the truncated copy, and every refresh would take another slot until
 * none is left).  Endpoints whose names share those bytes share one state.
 */
int
od_endpoint_slot(const char *name)
{
    int free_slot = -1;
    int found = -1;

    if (od_shared == nullptr)
        return -1;
    LWLockAcquire(od_shared->endpoint_lock, LW_SHARED);
    for (int i = 0; i < OD_MAX_ENDPOINTS; i++)
    {
        OdEndpointSlot *e = &od_shared->endpoints[i];

        if (e->used && strncmp(e->name, name, OD_ENDPOINT_NAME - 1) == 0)
        {
            found = i;
            break;
        }
    }
    LWLockRelease(od_shared->endpoint_lock);
    if (found >= 0)
        return found;

    LWLockAcquire(od_shared->endpoint_lock, LW_EXCLUSIVE);
    for (int i = 0; i < OD_MAX_ENDPOINTS; i++)
    {
        OdEndpointSlot *e = &od_shared->endpoints[i];

        if (e->used && strncmp(e->name, name, OD_ENDPOINT_NAME - 1) == 0)
        {
            found = i;
            break;
        }
        if (!e->used && free_slot < 0)
            free_slot = i;
    }
    if (found < 0 && free_slot >= 0)
    {
        OdEndpointSlot *e = &od_shared->endpoints[free_slot];

        SpinLockAcquire(&e->mutex);
        strlcpy(e->name, name, OD_ENDPOINT_NAME);
        e->breaker = OD_BREAKER_CLOSED;
        e->consecutive_failures = 0;
        e->trips = 0;
        e->opened_at = 0;
        e->next_probe_at = 0;
        e->probe_taken = false;
        e->in_flight = 0;
        e->tokens = -1;         /* filled on first use */
        e->tokens_at = 0;
        e->last_status = 0;
        e->last_success_at = 0;
        e->last_failure_at = 0;
        e->last_error[0] = '\0';
        e->delivered = e->failed = 0;
        e->latency_count = e->latency_sum_us = e->latency_max_us = 0;
        memset(e->latency_buckets, 0, sizeof(e->latency_buckets));
        e->used = true;
        SpinLockRelease(&e->mutex);
        found = free_slot;
    }
    LWLockRelease(od_shared->endpoint_lock);
    return found;
}

int
od_endpoint_reserve(int slot, const OdEndpointLimits *lim, int want, TimestampTz now,
                    bool *probe, TimestampTz *retry_at)
{
    OdEndpointSlot *e;
    int         n = want;

    *probe = false;
    *retry_at = 0;
    if (slot < 0 || od_shared == nullptr)
        return want;
    e = &od_shared->endpoints[slot];

    SpinLockAcquire(&e->mutex);
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
        if ((int) e->tokens < n)
        {
            n = (int) e->tokens;
            /* come back when the bucket is full again rather than for every token */
            *retry_at = now + (int64) ((cap - e->tokens + n) / lim->rate_limit * USECS_PER_SEC) + 1;
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
od_endpoint_breaker_open(int slot)
{
    OdEndpointSlot *e;
    bool        open;

    if (slot < 0 || od_shared == nullptr)
        return false;
    e = &od_shared->endpoints[slot];
    SpinLockAcquire(&e->mutex);
    open = (e->breaker != OD_BREAKER_CLOSED);
    SpinLockRelease(&e->mutex);
    return open;
}

void
od_endpoint_unreserve(int slot, int n, bool probe)
{
    OdEndpointSlot *e;

    if (slot < 0 || od_shared == nullptr || (n <= 0 && !probe))
        return;
    e = &od_shared->endpoints[slot];
    SpinLockAcquire(&e->mutex);
    n = Max(n, 0);
    e->in_flight = Max(0, e->in_flight - n);
    if (e->tokens >= 0)
        e->tokens += n;
    if (probe)
        e->probe_taken = false;     /* nothing was claimed: the next claim may probe */
    SpinLockRelease(&e->mutex);
}

void
od_endpoint_hold(int slot, int n)
{
    OdEndpointSlot *e;

    if (slot < 0 || od_shared == nullptr || n <= 0)
        return;
    e = &od_shared->endpoints[slot];
    SpinLockAcquire(&e->mutex);
    e->in_flight += n;
    SpinLockRelease(&e->mutex);
}

void
od_endpoint_release(int slot, int n)
{
    OdEndpointSlot *e;

    if (slot < 0 || od_shared == nullptr || n <= 0)
        return;
    e = &od_shared->endpoints[slot];
    SpinLockAcquire(&e->mutex);
    e->in_flight = Max(0, e->in_flight - n);
    SpinLockRelease(&e->mutex);
}

void
od_endpoint_result(int slot, const OdEndpointLimits *lim, OdEndpointResult r, int http_status,
                   double latency_ms, const char *error, bool probe, TimestampTz now)
{
    OdEndpointSlot *e;
    uint64      us = latency_ms <= 0 ? 0 : (uint64) (latency_ms * 1000.0);
    int         b = 0;

    if (slot < 0 || od_shared == nullptr)
        return;
    while (b < OD_LATENCY_BUCKETS - 1 && us >= (UINT64CONST(1) << b))
        b++;
    e = &od_shared->endpoints[slot];

    SpinLockAcquire(&e->mutex);
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
    if (r == OD_RESULT_SUCCESS)
    {
        e->delivered++;
        e->last_success_at = now;
        e->consecutive_failures = 0;
        e->trips = 0;
        e->breaker = OD_BREAKER_CLOSED;
        e->probe_taken = false;
    }
    else if (r == OD_RESULT_FAILURE)
    {
        e->failed++;
        e->last_failure_at = now;
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
    SpinLockRelease(&e->mutex);
}
