/*
 * transitions.h — declarations of transitions.cpp: every state change of outbox.messages, with saved SPI plans.
 */
#ifndef OUTBOX_DISPATCHER_TRANSITIONS_H
#define OUTBOX_DISPATCHER_TRANSITIONS_H

#include "outbox_dispatcher.h"
#include "core/outcome.hpp"
#include "core/ready_floor.hpp"

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
    TimestampTz lease_until; /* the claim's lease deadline, part of the fence; 0 = not checked */
    od::Verdict verdict;
    int64       delay_us;    /* Retry, Defer: delay before the next attempt */
    bool        refund;      /* Retry: give the attempt back */
    const char *error;       /* NULL for none; copied by od_finalize */
    int         http_status; /* 0 for none */
    bool        applied;     /* out: false = lease lost (fenced) */
    bool        ordered_done; /* out: an ordered message became done (its successor may be claimed) */
} OdFinalize;

/* Prepare sql once into *slot (kept across transactions; the plan cache decides generic or custom). */
extern SPIPlanPtr od_prepare(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes);

/* A one-dimensional array of n elements of elemtype (nulls may be NULL), palloc'd. */
extern ArrayType *od_build_array(Datum *elems, bool *nulls, int n, Oid elemtype);

/*
 * Columns returned by od_claim(), in this order (those of outbox.claim());
 * then, for the workers, lease_until (OD_CLAIM_NATTS + 1) and available_at
 * (OD_CLAIM_NATTS + 2): OD_CLAIM_ALL_NATTS in all.
 */
#define OD_CLAIM_NATTS 11
#define OD_CLAIM_ALL_NATTS (OD_CLAIM_NATTS + 2)

/*
 * For the workers' sessions: disable the plan shapes the workers'
 * statements never want (sequential and bitmap scans, hash and merge joins,
 * sorts) and keep their plans generic; see transitions.cpp.
 */
extern void od_fix_plan_shapes(void);

/* A plan setting for one statement of a worker (od_plan_shapes_push, od_plan_shapes_pop). */
typedef struct OdPlanShape
{
    const char *name;
    const char *value;
} OdPlanShape;

extern int  od_plan_shapes_push(const OdPlanShape *shapes, int n);
extern void od_plan_shapes_pop(int nest);

/* od_claim flags */
#define OD_CLAIM_CHECK_LEASES 0x01 /* reap and take over expired leases first */
/*
 * the schema is 0.3.0's: messages.ordered_after (od_schema_records_commit_order),
 * messages.dead_at, order per aggregate per endpoint (od_schema_has_fanout)
 */
#define OD_CLAIM_COMMIT_ORDER 0x02

/*
 * With OD_CLAIM_CHECK_LEASES, reap exhausted expired leases and take over
 * the others (of endpoints[i] only where takeover[i]; NULL: everywhere),
 * then set the shared time of the next check (od_lease_check_due); lease
 * up to batch ready messages, taking at most quotas[i] of endpoints[i],
 * those with (available_at, id) >= from[i] (from NULL: all;
 * core/ready_floor.hpp) (n_endpoints < 0: every enabled
 * endpoint, up to batch each, all of them).
 * Must be called inside a transaction, connected to SPI; the claimed rows
 * are left in SPI_tuptable (SPI_processed of them).  Returns the number of
 * rows reaped to dead.
 */
extern uint64 od_claim(const char *owner, int batch, int64 lease_us, int max_attempts, const char *const *endpoints,
                       const int *quotas, const bool *takeover, const od::ReadyKey *from, int n_endpoints,
                       int flags);

/*
 * Can a lease have expired by `now`?  Every claim lowers the shared check
 * time to the deadlines it set; every check raises it to the earliest
 * deadline left (at most 5 s ahead; core/lease_check.hpp).  Always true
 * without shared memory.
 */
extern bool   od_lease_check_due(TimestampTz now);

/*
 * Apply n fenced finalizes in one statement.  Sets items[i].applied; lost
 * leases are counted in shared memory and logged once each.  Must be
 * connected to SPI.  Returns the number applied.
 */
extern int    od_finalize(OdFinalize *items, int n, int flags);
/* od_finalize flags */
#define OD_FINALIZE_DEAD_AT 0x01 /* the schema has messages.dead_at (od_schema_has_fanout) */

extern bool   od_retry(int64 id);
extern uint64 od_retry_dead(const char *endpoint, const char *event_type);
extern bool   od_skip(int64 id, const char *reason);
extern uint64 od_purge(int64 older_than_us, int limit);
extern uint64 od_replay(int64 from_id, int64 to_id, const char *endpoint);
/*
 * dead: recover() — dead messages of the endpoint with dead_at in [since,
 * until) go back to pending, attempts reset; else replay_window() — done
 * messages with done_at in it.  Returns the count.
 */
extern uint64 od_recover_window(bool dead, const char *endpoint, TimestampTz since, TimestampTz until);
extern uint64 od_move(const char *from_endpoint, const char *to_endpoint, Datum statuses);
extern int64  od_enqueue(Datum *values, bool *nulls);

#endif /* OUTBOX_DISPATCHER_TRANSITIONS_H */
