/*
 * core/schedule.hpp — what a dispatcher worker does next: claim now? finalize
 * now? sleep until when?
 *
 * The worker loop (worker.cpp) fills a WorkerCycle from its state at each
 * decision point and asks these functions; they hold every rule of the
 * schedule, so that the rules are unit-tested without a backend.  Times are
 * microseconds on the database's clock (TimestampTz values pass unchanged);
 * 0 means "no such deadline" wherever the field says so.
 *
 * The rules:
 *  - Claim only with room for at least half of what the worker may hold
 *    (a claim for a few rows costs almost as much as one for a batch), and
 *    only with a reason: a wake (a commit, a reload), the last claim came
 *    back full (there may be more), the fallback poll is due, a refused
 *    reservation may succeed now, or a request finished while the last
 *    claim had taken every place its quotas allowed.
 *  - A wake claims no sooner than claim_spacing_us after the latest claim
 *    of any worker, unless this worker's last claim came back full (a
 *    backlog is claimed at once): under a steady stream of commits, the
 *    commits in between are claimed together in one transaction instead
 *    of one each.  After a quiet spell the first commit is claimed at once;
 *    so is every commit while the latest claim lies further ahead than the
 *    spacing (the clock was set back).
 *  - Finalize when half a batch of results is waiting, when the oldest
 *    result has waited flush_after_us (a claim within that time finalizes
 *    them in its own transaction; a wake's claim held back by the spacing
 *    is waited for if it comes within claim_spacing_us of the oldest, at
 *    most 20 ms), or when nothing is in flight and no claim can come to
 *    share the transaction.
 *  - Reload the endpoints when a committed change says so (schema 0.3.0
 *    announces them), when the reload period is over, or on a wake while
 *    the extension is missing; the period is poll_interval where changes
 *    are not announced, a slow safety poll (kEndpointSafetyPollUs, or
 *    poll_interval if longer) where they are.
 *  - deliver_after_replication: no claim while one waits for the
 *    synchronous standbys (or after one they did not confirm, until they
 *    pass it); the worker looks at their position again at replication_poll.
 *  - Nothing is reloaded, claimed, finalized or purged before backoff_until
 *    (an error); the sleep deadline is the least of the named deadlines,
 *    but never before backoff_until.
 */
#pragma once

#include <cstdint>

namespace od {

struct WorkerCycle {
    int64_t now = 0;
    /* the extension is installed in the worker's database */
    bool installed = false;
    /* installed, delivery is enabled, and no stop was asked */
    bool active = false;
    /* no claim or finalize before this (after an error); 0 = none */
    int64_t backoff_until = 0;

    /* messages worth holding at once, and those held now: queued, in
     * flight, or finished and not yet finalized (all still 'processing') */
    int pipeline = 0;
    int held = 0;

    /* reasons to claim */
    bool woken = false;            /* the latch was set since the last claim */
    int64_t last_claim = 0;        /* when the last claim ran; 0 = never */
    int64_t claim_spacing_us = 0;  /* a wake claims no sooner than this after a claim that was not full */
    bool last_claim_full = false;  /* the last claim took all it asked for */
    int64_t next_poll = 0;         /* the fallback poll */
    int64_t next_quota = 0;        /* a refused reservation may succeed then; 0 = none */
    bool places_released = false;  /* a request finished since the last claim */
    bool claim_quota_full = false; /* the last claim took every place its quotas allowed */
    bool claims_held = false;      /* deliver_after_replication: no claim now (core/replication_gate.hpp) */

    /* deliver_after_replication: look at the standbys' confirmed position then; 0 = nothing waits */
    int64_t replication_poll = 0;

    /* results waiting to be finalized */
    int results = 0;
    int in_flight = 0;
    int64_t oldest_result = 0; /* when the oldest was noted; 0 = not yet (due at once) */
    int64_t flush_after_us = 2000;

    /* other deadlines */
    int64_t next_refresh = 0; /* reload of the endpoints */
    bool endpoints_changed =
        false;           /* a committed change of outbox.endpoints since the last reload, or a slot changed hands */
    bool purges = false; /* this worker runs the retention purge */
    int64_t next_purge = 0;
};

/*
 * A worker's share of an endpoint's cluster-wide max_in_flight (0 = no
 * limit: INT_MAX), ceil(max_in_flight / workers), at least 1, for any
 * number of workers: it caps one claim of the endpoint's messages (with a
 * batch above it, the first worker to claim would take every place and the
 * others would sit until the next poll) and, summed over the worker's
 * endpoints, what the worker can usefully hold (pipeline_size).
 */
int endpoint_share(int max_in_flight, int workers) noexcept;

/*
 * What a worker can usefully hold at once: batch_size, or the sum of its
 * endpoints' shares when that is less (none: batch_size).  The claim and
 * finalize thresholds are half of it, so a batch_size above what the
 * endpoints let the worker hold does not make each claim wait until
 * nearly every place is taken and then ask for the few left.
 */
int pipeline_size(int64_t shares, int batch_size) noexcept;

/* Room for a claim: at least half of what the worker may hold (at least 1). */
bool has_claim_room(const WorkerCycle &c) noexcept;

/* Rows to ask for if a claim is due now, else 0. */
int claim_now(const WorkerCycle &c) noexcept;

/* Whether the waiting results are finalized now (in a transaction of their own). */
bool finalize_now(const WorkerCycle &c) noexcept;

/* Whether the endpoints are reloaded now (a wake while the extension is
 * missing may mean CREATE EXTENSION just committed). */
bool refresh_now(const WorkerCycle &c) noexcept;

/* The slow safety poll of the endpoints where changes are announced. */
constexpr int64_t kEndpointSafetyPollUs = 30 * 1000000LL;

/* Microseconds from one reload of the endpoints to the next when nothing changes. */
int64_t refresh_period_us(bool changes_announced, int64_t poll_interval_us) noexcept;

/* Whether the retention purge runs now. */
bool purge_now(const WorkerCycle &c) noexcept;

/* The time to wake up at when nothing else happens first (may be <= now). */
int64_t next_wakeup(const WorkerCycle &c) noexcept;

/* Milliseconds to wait until `until` from `now`, rounded up; 0 if it has passed. */
long wait_ms(int64_t now, int64_t until) noexcept;

} // namespace od
