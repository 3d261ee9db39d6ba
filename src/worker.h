/*
 * worker.h — what the parts of a dispatcher worker share: the process's
 * state (OdWorker W) and the steps of its loop.  Included only by the
 * worker_*.cpp files and worker.cpp (the loop, setup and shutdown):
 *
 *   worker.cpp            od_worker_main: setup, error recovery, the loop, shutdown
 *   worker_endpoints.cpp  the installed extension and the endpoints we serve
 *   worker_claim.cpp      reservations, the claim, claimed rows into the Dispatcher
 *   worker_finalize.cpp   outcomes into endpoint accounting and the fenced finalize
 *   worker_wait.cpp       the wait on the latch, postmaster death and the sockets
 *   worker_replication.cpp deliver_after_replication: claimed messages wait for the standbys
 */
#ifndef OUTBOX_DISPATCHER_WORKER_H
#define OUTBOX_DISPATCHER_WORKER_H

#include "catalog.h"
#include "outbox_dispatcher.h"
#include "module.h"
#include "guard.h"
#include "transitions.h"
#include "wake.h"
#include "endpoint_state.h"
#include "pg_compat.h"
#include "core/dispatcher.hpp"
#include "core/ready_floor.hpp"
#include "core/replication_gate.hpp"
#include "core/schedule.hpp"
#include "core/signing.hpp"
#include "core/validate.hpp"

#include <new>

#include <sys/resource.h>

extern "C" {
#include "access/xact.h"
#include "access/xlogdefs.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

namespace odw {

/*
 * The endpoints this worker serves (enabled ones, refreshed every
 * poll_interval), with their shared-memory slot reference and limits.
 */
typedef struct WorkerEndpoint
{
    char            *name;
    int64            id; /* stable key of the shared state */
    OdEndpointRef    ref;
    OdEndpointLimits lim;
    uint64           oauth_client; /* hash of its OAuth client configuration; 0: no OAuth */
    int64            timeout_ms;   /* its request timeout (the token request's too) */
    od::ReadyFloor   floor;        /* where the claim reads its ready messages from (zeroed: the first) */
} WorkerEndpoint;

/*
 * What this worker holds in each shared endpoint slot (an array of
 * outbox_dispatcher.max_endpoints entries, indexed by slot): claimed
 * messages not yet answered (their in-flight places, which also keep the
 * slot from being reclaimed) and the id of the message that is the
 * endpoint's half-open probe.  ref/lim are those of the last claim.
 */
typedef struct SlotHold
{
    OdEndpointRef    ref;
    OdEndpointLimits lim;
    int              held;
    int64            probe_id; /* 0: none */
} SlotHold;

/* The reservation of a claim in progress, returned if its transaction fails. */
typedef struct PendingReservation
{
    OdEndpointRef    ref;
    OdEndpointLimits lim;
    int              count;
    bool             probe;
} PendingReservation;

/* The loop's own deadlines and reasons to claim (read by core/schedule.cpp). */
typedef struct LoopSchedule
{
    TimestampTz next_poll;       /* the fallback poll */
    TimestampTz next_refresh;    /* reload of the endpoints; 0 = at once */
    TimestampTz next_purge;      /* worker 0's retention purge */
    TimestampTz next_attempt_expiry; /* worker 0's attempt-log retention; 0 = at once */
    TimestampTz backoff_until;   /* after an error: no claim or finalize before */
    bool        woken;           /* the latch was set since the last claim */
    bool        last_claim_full; /* the last claim took all it asked for */
} LoopSchedule;

/*
 * All of this process's state, in one place.  A file-level variable (not a
 * local of od_worker_main) because the error recovery after sigsetjmp
 * reads and changes it.
 */
typedef struct OdWorker
{
    /* who we are */
    int                 worker_index;
    OdWorkerSlot       *slot;        /* our slot in shared memory */
    char               *lease_owner; /* "worker-<n>/pid-<pid>", written into leases */

    /* what we run on */
    od::Dispatcher     *disp;            /* the HTTP side: queues, requests in flight, outcomes */
    MemoryContext       cycle_ctx;       /* reset at the top of every loop iteration */
    WaitEventSet       *wait_set;        /* latch, postmaster death and the engine's poll descriptor */
    size_t              transfer_budget; /* transfers at once (file descriptors); 0 = no cap */

    /* the installed extension */
    bool                ext_ready;       /* installed, a schema we serve, and we may use it */
    uint32              ext_idle_logged; /* hash of the idle state last logged (| 1); 0 = none */
    int                 schema;          /* the installed schema (catalog.h: OD_SCHEMA_*) */
    char               *ext_idle_reason; /* why the installed extension is not served */
    char               *ext_idle_hint;

    /* the endpoints we serve (enabled ones, reloaded on a committed change or every poll_interval) */
    MemoryContext       endpoint_ctx;
    WorkerEndpoint     *wendpoints;
    int                 n_wendpoints;
    int                 pipeline_cap;         /* the endpoints' shares summed (od::pipeline_size); 0 = none */
    bool                endpoints_stale;      /* a slot changed hands: refresh */
    int                 n_oauth;              /* of them with OAuth client credentials */
    char                token_buf[OD_MAX_ACCESS_TOKEN]; /* a token on its way from the shared slot */
    uint64              endpoints_generation; /* od_shared->endpoints_generation at the last reload */

    /* the ledger: places held in the shared endpoint slots */
    SlotHold           *holds; /* indexed by slot, n_holds = max_endpoints */
    int                 n_holds;
    PendingReservation *pending; /* the claim in progress (in cycle_ctx), n_pending entries */
    int                 n_pending;
    int                 claim_rotation;   /* which endpoint a claim asks first */
    uint64              ordered_done_seen; /* od_shared->ordered_done as of the last claim */
    TimestampTz         next_quota_at;    /* a refused reservation may succeed then; 0 = none */
    bool                places_released;  /* a request finished: a quota may have room again */
    bool                claim_quota_full; /* the last claim took every place its quotas allowed */

    /* results waiting to be finalized */
    TimestampTz         oldest_outcome_at; /* 0 = not noted yet */
    size_t              outcomes_seen;
    /* endpoints found failing for longer than their disable_after: disabled by the next finalize */
#define OD_MAX_PENDING_DISABLES 16
    int                 disable_tags[OD_MAX_PENDING_DISABLES]; /* endpoint slots */
    TimestampTz         disable_since[OD_MAX_PENDING_DISABLES];
    int64               disable_after_us[OD_MAX_PENDING_DISABLES];
    int                 n_disable;
    bool                stats_pending; /* committed since the last forced statistics flush */

    /* deliver_after_replication (worker_replication.cpp) */
    od::ReplicationGate gate;
    TimestampTz         replication_wait_began; /* 0 = not waiting */

    LoopSchedule        sched;
} OdWorker;

typedef struct FinalizeBatch
{
    OdFinalize  *items;
    int          n;
    const char **gone; /* endpoints that answered 410, by name and id */
    int64       *gone_id;
    int          n_gone;
    bool         ordered_done; /* set by finalize_run: an ordered message became done (core/ready_floor.hpp) */
} FinalizeBatch;

extern OdWorker W;

/* ---------------------------------------------------------------- worker.cpp */
void            set_state(OdWorkerState st);
void            record_error(const char *msg);
void            begin_tx(const char *activity);
void            end_tx(void);

/* ---------------------------------------------------------------- worker_endpoints.cpp */
/* The extension's state and the endpoints we serve: reloaded now. */
void            refresh_endpoints(void);
/* At most this worker's share of an endpoint's cluster-wide max_in_flight. */
int             claim_share(const WorkerEndpoint *w);
/* Messages worth holding at once. */
int             pipeline_size(void);
/* Header lines: "Name: value\n..." text (od_header_lines_text) back into lines. */
void            split_lines(const char *text, std::vector<std::string> &out) noexcept;

/* ---------------------------------------------------------------- worker_oauth.cpp */
/* Hash of an endpoint's OAuth client configuration; 0: none. */
uint64          oauth_client_hash(const OdEndpointRow *r);
/* Tokens: finished fetches shared, tokens copied from the slots, fetches started, waiters failed. */
void            step_tokens(TimestampTz now);

/* ---------------------------------------------------------------- worker_claim.cpp */
/* Claim up to capacity rows (finalizing waiting results in the same transaction); returns how many. */
int             do_claim(int capacity, bool with_finalize);
/* Give back the places of a claim whose transaction failed. */
void            release_pending_reservation(void);
void            reset_ready_floors(void);

/* ---------------------------------------------------------------- worker_finalize.cpp */
void            process_new_outcomes(void);
bool            finalize_prepare(FinalizeBatch *fb);
void            finalize_run(FinalizeBatch *fb);
void            finalize_done(FinalizeBatch *fb);
/* Finalize fb in a transaction of its own. */
void            finalize_alone(FinalizeBatch *fb);
void            do_finalize(void);

/* ---------------------------------------------------------------- worker_replication.cpp */
/* After a (re)load of the settings: warn if the mode cannot apply; stop waiting if it no longer does. */
void            replication_check_settings(void);
/* A claim that took rows committed with this end position: flush it and hold its messages. */
void            replication_claimed(XLogRecPtr commit_end);
/* Whether queued messages may be sent now (releases them after the hold limit). */
bool            replication_may_send(TimestampTz now);
/* Whether claims wait for the standbys now. */
bool            replication_claims_held(void);
/* When to look at the standbys' position again; 0 = nothing waits. */
TimestampTz     replication_poll_at(TimestampTz now);
/* Whether this worker waits for the standbys (a claim, or after one they did not confirm). */
bool            replication_waiting(void);

/* ---------------------------------------------------------------- worker_wait.cpp */
/* Wait up to timeout_ms for sockets or the latch; returns true if the latch was set. */
bool            wait_for_events(long timeout_ms);

} // namespace odw

#endif
