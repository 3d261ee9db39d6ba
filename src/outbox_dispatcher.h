/*
 * outbox_dispatcher.h — declarations shared by the PostgreSQL-facing files.
 *
 * Include this (it pulls in postgres.h inside extern "C") from the files in src/
 * only; files under src/core/ are pure C++ and must not include it.
 *
 * Conventions for every file that includes it:
 *   - code between SPI_connect and SPI_finish, or anything that may
 *     ereport(ERROR), keeps no C++ object with a destructor on its stack;
 *     an ERROR is a longjmp and would skip destructors;
 *   - calls into src/core/ are noexcept by contract (they return error
 *     strings), so no C++ exception can cross a PostgreSQL frame.
 */
#ifndef OUTBOX_DISPATCHER_H
#define OUTBOX_DISPATCHER_H

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
}

/* ---------------------------------------------------------------- GUCs (module.cpp) */
extern char *od_database;
extern char *od_role;
extern int   od_workers;
extern bool  od_enabled;
extern int   od_batch_size;
extern int   od_lease_ms;
extern int   od_max_attempts;
extern int   od_poll_interval_ms;
extern int   od_backoff_base_ms;
extern int   od_backoff_cap_ms;
extern int   od_defer_delay_ms;
extern int   od_max_defer_age_s;
extern int   od_retention_s;
extern char *od_source;
extern int   od_max_payload_bytes;
extern char *od_ca_file;

/* ---------------------------------------------------------------- shared memory (module.cpp) */
#define OD_MAX_WORKERS 64
#define OD_LATENCY_BUCKETS 32       /* bucket b counts latencies < 2^b microseconds */

typedef enum OdWorkerState
{
    OD_STATE_STOPPED = 0,
    OD_STATE_STARTING,
    OD_STATE_IDLE,
    OD_STATE_CLAIMING,
    OD_STATE_DELIVERING,
    OD_STATE_FINALIZING,
    OD_STATE_PAUSED
} OdWorkerState;

/*
 * One slot per worker.  Counters are written only by the owning worker
 * (atomics so that readers never see torn values); last_error is guarded
 * by the slot's spinlock.
 */
typedef struct OdWorkerSlot
{
    pid_t            pid;           /* 0 = no worker */
    Latch           *latch;         /* the worker's process latch, for wakes */
    pg_atomic_uint32 state;         /* OdWorkerState */
    pg_atomic_uint32 idle;          /* 1 while waiting with an empty pipeline */
    pg_atomic_uint32 in_flight;
    TimestampTz      started_at;
    pg_atomic_uint64 claimed;
    pg_atomic_uint64 delivered;
    pg_atomic_uint64 retried;
    pg_atomic_uint64 deferred;
    pg_atomic_uint64 dead;
    pg_atomic_uint64 reaped;
    pg_atomic_uint64 lost_leases;
    pg_atomic_uint64 cycles;
    pg_atomic_uint64 latency_count;
    pg_atomic_uint64 latency_sum_us;
    pg_atomic_uint64 latency_max_us;
    pg_atomic_uint64 latency_buckets[OD_LATENCY_BUCKETS];
    slock_t          mutex;
    TimestampTz      last_error_at;
    char             last_error[256];
} OdWorkerSlot;

/*
 * Per-endpoint state shared by all workers (endpoint_state.cpp): the
 * circuit breaker, the cluster-wide in-flight count behind max_in_flight,
 * the token bucket behind rate_limit, and delivery statistics.  Slots are
 * assigned by name under od_shared->endpoint_lock (taken only when a worker
 * refreshes its endpoint list); everything else is under the slot spinlock.
 * State lives only in shared memory: a restart closes every breaker.
 */
#define OD_MAX_ENDPOINTS 256
#define OD_ENDPOINT_NAME 128

typedef enum OdBreakerState
{
    OD_BREAKER_CLOSED = 0,
    OD_BREAKER_OPEN,
    OD_BREAKER_HALF_OPEN
} OdBreakerState;

typedef struct OdEndpointSlot
{
    bool        used;
    char        name[OD_ENDPOINT_NAME];
    slock_t     mutex;
    /* circuit breaker */
    int         breaker;            /* OdBreakerState */
    int         consecutive_failures;
    int         trips;              /* consecutive trips without a success */
    TimestampTz opened_at;
    TimestampTz next_probe_at;
    bool        probe_taken;        /* half-open: one worker holds the probe */
    /* limits */
    int         in_flight;          /* claimed by some worker, not yet answered */
    double      tokens;             /* rate limit bucket */
    TimestampTz tokens_at;
    /* statistics */
    int         last_status;
    TimestampTz last_success_at;
    TimestampTz last_failure_at;
    char        last_error[256];
    uint64      delivered;
    uint64      failed;
    uint64      latency_count;
    uint64      latency_sum_us;
    uint64      latency_max_us;
    uint64      latency_buckets[OD_LATENCY_BUCKETS];
} OdEndpointSlot;

typedef struct OdShared
{
    pg_atomic_uint64 lost_leases;   /* fenced finalizes that updated no row, all backends */
    pg_atomic_uint32 wake_next;     /* where the next wake starts looking for an idle worker */
    OdWorkerSlot     workers[OD_MAX_WORKERS];
    LWLock          *endpoint_lock; /* assigns endpoint slots */
    OdEndpointSlot   endpoints[OD_MAX_ENDPOINTS];
} OdShared;

/* NULL unless the library was loaded by shared_preload_libraries. */
extern OdShared *od_shared;

/* ---------------------------------------------------------------- transitions (transitions.cpp) */

/* Result kinds of one delivery, as written by od_finalize(). */
typedef enum OdVerdict
{
    OD_DONE,            /* processing -> done */
    OD_RETRY,           /* processing -> pending after delay */
    OD_DEAD,            /* processing -> dead */
    OD_DEFER            /* processing -> pending after delay, attempt refunded;
                         * dead once the message is older than max_defer_age */
} OdVerdict;

typedef struct OdFinalize
{
    int64       id;
    int64       lease_version;
    OdVerdict   verdict;
    int64       delay_us;       /* OD_RETRY: delay before the next attempt */
    bool        refund;         /* OD_RETRY: give the attempt back */
    const char *error;          /* NULL for none; copied by od_finalize */
    int         http_status;    /* 0 for none */
    bool        applied;        /* out: false = lease lost (fenced) */
} OdFinalize;

/* Columns returned by od_claim(), in this order. */
#define OD_CLAIM_NATTS 11

/*
 * Reap exhausted expired leases, then lease up to batch ready messages,
 * taking at most quotas[i] of endpoints[i] (n_endpoints < 0: every enabled
 * endpoint, up to batch each).
 * Must be called inside a transaction, connected to SPI; the claimed rows
 * are left in SPI_tuptable (SPI_processed of them).  Returns the number of
 * rows reaped to dead.
 */
extern uint64 od_claim(const char *owner, int batch, int64 lease_us, int max_attempts,
                       const char *const *endpoints, const int *quotas, int n_endpoints);

/*
 * Apply n fenced finalizes in one statement.  Sets items[i].applied; lost
 * leases are counted in shared memory and logged once each.  Must be
 * connected to SPI.  Returns the number applied.
 */
extern int od_finalize(OdFinalize *items, int n);

extern bool   od_retry(int64 id);
extern uint64 od_retry_dead(const char *endpoint, const char *event_type);
extern bool   od_skip(int64 id, const char *reason);
extern uint64 od_purge(int64 older_than_us, int limit);
extern uint64 od_replay(int64 from_id, int64 to_id, const char *endpoint);
extern uint64 od_move(const char *from_endpoint, const char *to_endpoint, Datum statuses);
extern int64  od_enqueue(Datum *values, bool *nulls);

/* ---------------------------------------------------------------- wake (wake.cpp) */

/* Wake the workers when the current transaction commits. */
extern void od_wake_at_commit(void);
/* Wake the workers now. */
extern void od_wake_workers(void);

/* ---------------------------------------------------------------- endpoint state (endpoint_state.cpp) */

/* Per-endpoint settings the shared state needs (from outbox.endpoints). */
typedef struct OdEndpointLimits
{
    int     max_in_flight;
    double  rate_limit;             /* messages per second; <= 0 = unlimited */
    int     breaker_threshold;      /* consecutive failures that open the breaker */
    int64   breaker_cooldown_us;    /* first open period; doubles per trip */
} OdEndpointLimits;

/* Find or create the slot of an endpoint; -1 when the table is full. */
extern int  od_endpoint_slot(const char *name);

/*
 * How many messages of this endpoint a worker may claim now (0..want), and
 * reserve them: breaker (open: 0; cool-down over: one probe), cluster-wide
 * max_in_flight, and the rate-limit bucket.  *probe is set when the
 * reservation is the half-open probe.  *retry_at is set to when a refused
 * reservation could succeed (0 = unknown).
 */
extern int  od_endpoint_reserve(int slot, const OdEndpointLimits *lim, int want, TimestampTz now,
                                bool *probe, TimestampTz *retry_at);
/* Is the endpoint's breaker open or half-open? */
extern bool od_endpoint_breaker_open(int slot);
/* Give back reservations that the claim did not use. */
extern void od_endpoint_unreserve(int slot, int n, bool probe);
/* A claim took more than it reserved (expired leases): count them in flight. */
extern void od_endpoint_hold(int slot, int n);
/* A request finished (or was abandoned): release its in-flight place. */
extern void od_endpoint_release(int slot, int n);

typedef enum OdEndpointResult
{
    OD_RESULT_SUCCESS,              /* 2xx */
    OD_RESULT_FAILURE,              /* retryable: counts towards the breaker */
    OD_RESULT_NEUTRAL               /* answered, but neither (4xx dead, defer) */
} OdEndpointResult;

/* Record one result: statistics and breaker transitions. */
extern void od_endpoint_result(int slot, const OdEndpointLimits *lim, OdEndpointResult r,
                               int http_status, double latency_ms, const char *error, bool probe,
                               TimestampTz now);

/* ---------------------------------------------------------------- workers (worker.cpp) */
extern void od_register_workers(void);

/* Interval -> microseconds (months counted as 30 days, like interval_cmp). */
extern int64 od_interval_us(const Interval *iv);

#endif /* OUTBOX_DISPATCHER_H */
