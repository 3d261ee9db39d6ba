/*
 * module.h — declarations of module.cpp: the GUCs, the shared-memory layout (who writes what is in src/README.md) and the workers' registration.
 */
#ifndef OUTBOX_DISPATCHER_MODULE_H
#define OUTBOX_DISPATCHER_MODULE_H

#include "outbox_dispatcher.h"
#include "core/histogram.hpp"

extern char *od_database;
extern char *od_role;
extern int   od_workers;
extern bool  od_enabled;
extern bool  od_deliver_after_replication;
extern int   od_batch_size;
extern int   od_lease_ms;
extern int   od_max_attempts;
extern int   od_poll_interval_ms;
extern int   od_min_claim_interval_ms;
extern int   od_worker_nice;
extern int   od_backoff_base_ms;
extern int   od_backoff_cap_ms;
extern int   od_defer_delay_ms;
extern int   od_max_defer_age_s;
extern int   od_retention_s;
extern char *od_source;
extern char *od_message_id_prefix;
extern char *od_traceparent; /* set per transaction by producers: captured at enqueue */
extern char *od_tracestate;
extern char *od_denied_networks;  /* egress: core/netfilter.hpp */
extern char *od_allowed_networks;
extern char *od_proxy; /* egress through a proxy (may hold credentials: superuser-only) */
extern char *od_no_proxy;
extern int   od_max_payload_bytes;
extern int   od_max_header_bytes;
extern int   od_max_headers;
extern int   od_max_schedule_ahead_s;
extern int   od_max_endpoints;
extern char *od_ca_file;
/* outbox_dispatcher.attempt_log */
#define OD_ATTEMPT_LOG_ALL 0
#define OD_ATTEMPT_LOG_FAILURES 1
#define OD_ATTEMPT_LOG_OFF 2
extern int   od_attempt_log;
extern int   od_attempt_log_retention_s;

#define OD_MAX_WORKERS 64
#define OD_LATENCY_BUCKETS 32 /* core/histogram.hpp: bucket b counts < 2^b microseconds */
static_assert(OD_LATENCY_BUCKETS == od::kLatencyBuckets, "one histogram layout");

typedef enum OdWorkerState
{
    OD_STATE_STOPPED = 0,
    OD_STATE_STARTING,
    OD_STATE_IDLE,
    OD_STATE_CLAIMING,
    OD_STATE_DELIVERING,
    OD_STATE_FINALIZING,
    OD_STATE_PAUSED,
    OD_STATE_WAITING_REPLICATION /* deliver_after_replication: the synchronous standbys have not confirmed */
} OdWorkerState;

/*
 * One slot per worker.  Counters are written only by the owning worker
 * (atomics so that readers never see torn values); last_error is guarded
 * by the slot's spinlock.
 */
typedef struct OdWorkerSlot
{
    pid_t            pid;   /* 0 = no worker */
    Latch           *latch; /* the worker's process latch, for wakes */
    pg_atomic_uint32 state; /* OdWorkerState */
    pg_atomic_uint32 idle;  /* 1 while waiting with an empty pipeline */
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
    pg_atomic_uint64 replication_wait_since; /* TimestampTz the wait for the standbys began; 0 = none */
    pg_atomic_uint32 replication_held;       /* claimed messages held back meanwhile */
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
#define OD_ENDPOINT_LABEL 64 /* display copy of the name (truncated) */

typedef enum OdBreakerState
{
    OD_BREAKER_CLOSED = 0,
    OD_BREAKER_OPEN,
    OD_BREAKER_HALF_OPEN
} OdBreakerState;

/* core/oauth.hpp kMaxAccessToken */
#define OD_MAX_ACCESS_TOKEN 4096

typedef struct OdEndpointSlot
{
    slock_t     mutex;
    bool        used;
    uint32      generation; /* bumped whenever the slot changes hands */
    Oid         relid;      /* outbox.endpoints of this key */
    int64       id;         /* outbox.endpoints.id (or a name hash on 0.2.0 schemas) */
    char        label[OD_ENDPOINT_LABEL];
    /* circuit breaker */
    int         breaker; /* OdBreakerState */
    int         consecutive_failures;
    int         trips; /* consecutive trips without a success */
    TimestampTz opened_at;
    TimestampTz next_probe_at;
    bool        probe_taken; /* half-open: one worker holds the probe */
    /* limits */
    int         in_flight;  /* claimed by some worker, not yet answered */
    double      tokens;     /* rate limit bucket */
    double      tokens_cap; /* its capacity when last refilled */
    TimestampTz tokens_at;
    /* statistics */
    int         last_status;
    TimestampTz last_success_at;
    TimestampTz last_failure_at;
    TimestampTz failing_since; /* first breaker failure after the last success; 0: none (disable_after) */
    char        last_error[256];
    uint64      delivered;
    uint64      failed;
    uint64      latency_count;
    uint64      latency_sum_us;
    uint64      latency_max_us;
    uint64      latency_buckets[OD_LATENCY_BUCKETS];
    /*
     * OAuth client credentials (endpoint_state.cpp, "OAuth"): the access
     * token all workers send, for the client whose configuration hashes to
     * token_client.
     */
    uint64      token_client;      /* hash of token_url, client_id, client_secret, scope */
    uint64      token_generation;  /* of the token held; 0: none */
    uint64      token_next_generation;
    TimestampTz token_refresh_at;
    TimestampTz token_usable_until;
    TimestampTz token_fetch_until; /* a worker is fetching until then; 0: nobody */
    TimestampTz token_next_fetch;  /* after failed fetches: none before then */
    int         token_failures;    /* consecutive failed fetches */
    uint64      token_failed_seq;  /* bumped by every failed fetch */
    char        token_error[200];  /* why the last fetch failed (never a secret) */
    int         token_len;
    char        token[OD_MAX_ACCESS_TOKEN];
} OdEndpointSlot;

typedef struct OdShared
{
    pg_atomic_uint64 lost_leases;          /* fenced finalizes that updated no row, all backends */
    pg_atomic_uint64 lease_check_at;       /* TimestampTz: look for expired leases from then (0 = now) */
    pg_atomic_uint32 endpoints_unserved;   /* enabled endpoints the last refresh found no slot for */
    pg_atomic_uint64 endpoints_generation; /* bumped at the commit of every change of outbox.endpoints (0.3.0) */
    pg_atomic_uint64 last_claim_at;        /* TimestampTz of the workers' latest claim (claim spacing) */
    pg_atomic_uint64 ordered_done;         /* bumped after the commit of every finalize that made an
                                            * ordered message done: the workers' next claims read
                                            * messages_ready from the first entry (core/ready_floor.hpp) */
    int              max_endpoints;        /* slots in od_endpoint_slots() */
    OdWorkerSlot     workers[OD_MAX_WORKERS];
    LWLock          *endpoint_lock; /* assigns and reclaims endpoint slots */
} OdShared;

/* Shared memory needed for OdShared and its endpoint slots. */
extern Size      od_shared_size(void);
/* NULL unless the library was loaded by shared_preload_libraries. */
extern OdShared *od_shared;

/* The endpoint slots, right after OdShared in the same shared memory chunk. */
static inline OdEndpointSlot *
od_endpoint_slots(void)
{
    return (OdEndpointSlot *) ((char *) od_shared + MAXALIGN(sizeof(OdShared)));
}

extern void od_register_workers(void);

#endif /* OUTBOX_DISPATCHER_MODULE_H */
