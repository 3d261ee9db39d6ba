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

#include "core/histogram.hpp"
#include "core/outcome.hpp"
#include "core/policy.hpp"

/* The library's version: the newest schema it serves, and the User-Agent. */
#define OD_LIBRARY_VERSION "0.3.0"

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
extern int   od_max_header_bytes;
extern int   od_max_headers;
extern int   od_max_schedule_ahead_s;
extern int   od_max_endpoints;
extern char *od_ca_file;

/* ---------------------------------------------------------------- shared memory (module.cpp) */
#define OD_MAX_WORKERS 64
#define OD_LATENCY_BUCKETS 32       /* core/histogram.hpp: bucket b counts < 2^b microseconds */
static_assert(OD_LATENCY_BUCKETS == od::kLatencyBuckets, "one histogram layout");

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
 * the token bucket behind rate_limit, and delivery statistics.
 *
 * A slot is keyed by the endpoint's stable identity (the oid of the
 * outbox.endpoints table and the row's id), never by its name: renames keep
 * their state, and an endpoint of a re-created extension never inherits a
 * dropped one's.  There are outbox_dispatcher.max_endpoints slots.  A slot
 * is assigned under od_shared->endpoint_lock and reclaimed, when the table
 * is full, from endpoints that no longer exist or are disabled and have
 * nothing in flight; every reuse bumps its generation, and every call below
 * presents the generation its caller saw, so a worker holding a stale
 * reference can never touch the new owner's state.  Everything else is
 * under the slot spinlock.  State lives only in shared memory: a restart
 * closes every breaker.
 */
#define OD_ENDPOINT_LABEL 64       /* display copy of the name (truncated) */

typedef enum OdBreakerState
{
    OD_BREAKER_CLOSED = 0,
    OD_BREAKER_OPEN,
    OD_BREAKER_HALF_OPEN
} OdBreakerState;

typedef struct OdEndpointSlot
{
    slock_t     mutex;
    bool        used;
    uint32      generation;         /* bumped whenever the slot changes hands */
    Oid         relid;              /* outbox.endpoints of this key */
    int64       id;                 /* outbox.endpoints.id (or a name hash on 0.2.0 schemas) */
    char        label[OD_ENDPOINT_LABEL];
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
    double      tokens_cap;         /* its capacity when last refilled */
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
    pg_atomic_uint64 lease_check_at; /* TimestampTz: look for expired leases from then (0 = now) */
    pg_atomic_uint32 endpoints_unserved; /* enabled endpoints the last refresh found no slot for */
    pg_atomic_uint64 endpoints_generation; /* bumped at the commit of every change of outbox.endpoints (0.3.0) */
    int              max_endpoints; /* slots in od_endpoint_slots() */
    OdWorkerSlot     workers[OD_MAX_WORKERS];
    LWLock          *endpoint_lock; /* assigns and reclaims endpoint slots */
} OdShared;

/* Shared memory needed for OdShared and its endpoint slots. */
extern Size od_shared_size(void);
/* NULL unless the library was loaded by shared_preload_libraries. */
extern OdShared *od_shared;

/* The endpoint slots, right after OdShared in the same shared memory chunk. */
static inline OdEndpointSlot *
od_endpoint_slots(void)
{
    return (OdEndpointSlot *) ((char *) od_shared + MAXALIGN(sizeof(OdShared)));
}

/* ---------------------------------------------------------------- search_path (guard.cpp) */

/*
 * Every statement the extension runs is parsed with this search_path, so
 * that no object a producer created (for instance in a public schema it
 * owns) can ever be picked by name resolution.  The workers set it for their
 * whole session; SQL-callable functions pin it around their SPI work.
 */
#define OD_SAFE_SEARCH_PATH "pg_catalog, pg_temp"

/* Pin search_path for the current function; returns the GUC nest level to pass to unpin. */
extern int  od_pin_search_path(void);
extern void od_unpin_search_path(int nestlevel);
/* SPI_connect + pin, and unpin + SPI_finish. */
extern int  od_spi_connect(void);
extern void od_spi_finish(int nestlevel);

/* Saturating interval -> microseconds (months as 30 days; infinite intervals saturate). */
extern int64 od_interval_us(const Interval *iv);

/* ---------------------------------------------------------------- transitions (transitions.cpp) */

/*
 * One delivery's result, as written by od_finalize(); the verdict is
 * od::Verdict (core/outcome.hpp):
 *   Done   processing -> done
 *   Retry  processing -> pending after delay_us (attempt refunded if refund)
 *   Dead   processing -> dead
 *   Defer  processing -> pending after delay_us, attempt refunded; dead once
 *          the message is older than max_defer_age
 */

typedef struct OdFinalize
{
    int64       id;
    int64       lease_version;
    TimestampTz lease_until;    /* the claim's lease deadline, part of the fence; 0 = not checked */
    od::Verdict verdict;
    int64       delay_us;       /* Retry, Defer: delay before the next attempt */
    bool        refund;         /* Retry: give the attempt back */
    const char *error;          /* NULL for none; copied by od_finalize */
    int         http_status;    /* 0 for none */
    bool        applied;        /* out: false = lease lost (fenced) */
} OdFinalize;

/* Prepare sql once into *slot (kept across transactions; the plan cache decides generic or custom). */
extern SPIPlanPtr od_prepare(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes);

/* Columns returned by od_claim(), in this order. */
#define OD_CLAIM_NATTS 11

/*
 * For the workers' sessions: disable the plan shapes the workers'
 * statements never want (sequential and bitmap scans, hash and merge joins,
 * sorts) and keep their plans generic; see transitions.cpp.
 */
extern void od_fix_plan_shapes(void);

/* od_claim flags */
#define OD_CLAIM_CHECK_LEASES 0x01  /* reap and take over expired leases first */

/*
 * With OD_CLAIM_CHECK_LEASES, reap exhausted expired leases and take over
 * the others (of endpoints[i] only where takeover[i]; NULL: everywhere),
 * then set the shared time of the next check (od_lease_check_due); lease
 * up to batch ready messages, taking at most quotas[i] of endpoints[i]
 * (n_endpoints < 0: every enabled endpoint, up to batch each).
 * Must be called inside a transaction, connected to SPI; the claimed rows
 * are left in SPI_tuptable (SPI_processed of them).  Returns the number of
 * rows reaped to dead.
 */
extern uint64 od_claim(const char *owner, int batch, int64 lease_us, int max_attempts,
                       const char *const *endpoints, const int *quotas, const bool *takeover,
                       int n_endpoints, int flags);

/*
 * Can a lease have expired by `now`?  Every claim lowers the shared check
 * time to the deadlines it set; every check raises it to the earliest
 * deadline left (at most 5 s ahead; core/lease_check.hpp).  Always true
 * without shared memory.
 */
extern bool od_lease_check_due(TimestampTz now);

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
/* At commit: bump endpoints_generation and set every worker's latch (the endpoints changed). */
extern void od_endpoints_changed_at_commit(void);
/* Wake the workers now. */
extern void od_wake_workers(void);
/* Wake one idle worker other than worker `self` (its claim came back full). */
extern void od_wake_idle_peer(int self);

/* ---------------------------------------------------------------- endpoint state (endpoint_state.cpp) */

/* Per-endpoint settings the shared state needs (from outbox.endpoints). */
typedef struct OdEndpointLimits
{
    int     max_in_flight;
    double  rate_limit;             /* messages per second; <= 0 = unlimited */
    int     breaker_threshold;      /* consecutive failures that open the breaker */
    int64   breaker_cooldown_us;    /* first open period; doubles per trip */
} OdEndpointLimits;

/*
 * A worker's reference to an endpoint slot: the index and the generation it
 * was assigned under.  Every call checks the generation and does nothing
 * (reserve: grants nothing) when the slot has changed hands since.
 */
typedef struct OdEndpointRef
{
    int     slot;                   /* -1: none */
    uint32  generation;
} OdEndpointRef;

/*
 * Find or assign the slot of endpoint (relid, id); label is a display name.
 * When every slot is taken, slots whose key is not in keep (the caller's
 * current list of enabled endpoint ids of the same relid, n_keep of them)
 * and that have nothing in flight are reclaimed first.  Returns false when
 * no slot can be had.
 */
extern bool od_endpoint_acquire(Oid relid, int64 id, const char *label, const int64 *keep, int n_keep,
                                OdEndpointRef *ref);

/*
 * How many messages of this endpoint a worker may claim now (0..want), and
 * reserve them: breaker (open: 0; cool-down over: one probe), cluster-wide
 * max_in_flight, and the rate-limit bucket.  *probe is set when the
 * reservation is the half-open probe.  *retry_at is set to when a refused
 * reservation could succeed (0 = unknown).  *stale is set when the slot
 * changed hands (refresh the endpoint list).
 */
extern int  od_endpoint_reserve(OdEndpointRef ref, const OdEndpointLimits *lim, int want, TimestampTz now,
                                bool *probe, TimestampTz *retry_at, bool *stale);
/* Is the endpoint's breaker open or half-open? */
extern bool od_endpoint_breaker_open(OdEndpointRef ref);
/* Give back reservations that the claim did not use. */
extern void od_endpoint_unreserve(OdEndpointRef ref, int n, bool probe);
/* A claim took more than it reserved (expired leases): count them in flight; false if stale. */
extern bool od_endpoint_hold(OdEndpointRef ref, int n);
/* A request finished (or was abandoned): release its in-flight place. */
extern void od_endpoint_release(OdEndpointRef ref, int n);

/* Record one result (its breaker signal: core/policy.hpp): statistics and breaker transitions. */
extern void od_endpoint_result(OdEndpointRef ref, const OdEndpointLimits *lim, od::EndpointSignal r,
                               int http_status, double latency_ms, const char *error, bool probe,
                               TimestampTz now);

/* ---------------------------------------------------------------- workers (worker.cpp) */
extern void od_register_workers(void);

#endif /* OUTBOX_DISPATCHER_H */
