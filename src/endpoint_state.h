/*
 * endpoint_state.h — declarations of endpoint_state.cpp: per-endpoint state shared by all workers (breaker, in-flight places, rate limit, statistics).
 */
#ifndef OUTBOX_DISPATCHER_ENDPOINT_STATE_H
#define OUTBOX_DISPATCHER_ENDPOINT_STATE_H

#include "outbox_dispatcher.h"
#include "core/policy.hpp"
#include "module.h"

/* Per-endpoint settings the shared state needs (from outbox.endpoints). */
typedef struct OdEndpointLimits
{
    int    max_in_flight;
    double rate_limit;          /* messages per second; <= 0 = unlimited */
    int    breaker_threshold;   /* consecutive failures that open the breaker */
    int64  breaker_cooldown_us; /* first open period; doubles per trip */
    int64  disable_after_us;    /* disable the endpoint once it has failed for this long; 0 = never */
    TimestampTz changed_at;     /* endpoints.updated_at: a change (resume_endpoint too) restarts that measure */
} OdEndpointLimits;

/*
 * A worker's reference to an endpoint slot: the index and the generation it
 * was assigned under.  Every call checks the generation and does nothing
 * (reserve: grants nothing) when the slot has changed hands since.
 */
typedef struct OdEndpointRef
{
    int    slot; /* -1: none */
    uint32 generation;
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
extern int  od_endpoint_reserve(OdEndpointRef ref, const OdEndpointLimits *lim, int want, TimestampTz now, bool *probe,
                                TimestampTz *retry_at, bool *stale);
/* Is the endpoint's breaker open or half-open? */
extern bool od_endpoint_breaker_open(OdEndpointRef ref);
/* Give back reservations that the claim did not use. */
extern void od_endpoint_unreserve(OdEndpointRef ref, int n, bool probe);
/* A claim took more than it reserved (expired leases): count them in flight; false if stale. */
extern bool od_endpoint_hold(OdEndpointRef ref, int n);
/* A request finished (or was abandoned): release its in-flight place. */
extern void od_endpoint_release(OdEndpointRef ref, int n);

/*
 * Record one result (its breaker signal: core/policy.hpp): statistics and
 * breaker transitions.  Returns since when every breaker signal of the
 * endpoint has been a failure (0: the last one was a success, or none
 * since the slot was taken; also 0 for a stale ref): what disable_after
 * is measured from.
 */
extern TimestampTz od_endpoint_result(OdEndpointRef ref, const OdEndpointLimits *lim, od::EndpointSignal r, int http_status,
                               double latency_ms, const char *error, bool probe, TimestampTz now);

/*
 * OAuth client credentials: the endpoint's shared access token.  client is
 * the hash of the worker's client configuration (token URL, id, secret,
 * scope): a token obtained for another one is not reported.
 */
typedef struct OdTokenView
{
    uint64      generation;   /* of the token held for this client; 0: none */
    TimestampTz refresh_at;   /* fetch a new one from then */
    TimestampTz usable_until; /* and stop sending this one then */
    TimestampTz fetch_until;  /* a worker is fetching until then (if in the future) */
    TimestampTz next_fetch;   /* after failed fetches: none before then */
    uint64      failed_seq;   /* bumped by every failed fetch */
    char        error[200];   /* why the last fetch failed */
} OdTokenView;

/* Read the token state; the token itself (into buf, OD_MAX_ACCESS_TOKEN bytes) only if its generation is not have_generation. */
extern bool   od_endpoint_token_read(OdEndpointRef ref, uint64 client, uint64 have_generation, OdTokenView *v,
                                     char *buf, int *len);
/* Become the worker that fetches, until then; false if another one is. */
extern bool   od_endpoint_token_claim(OdEndpointRef ref, TimestampTz now, TimestampTz until);
/* A fetched token for all workers; returns its generation (0: stale ref). */
extern uint64 od_endpoint_token_store(OdEndpointRef ref, uint64 client, const char *token, int len,
                                      TimestampTz refresh_at, TimestampTz usable_until);
/* A fetch failed (error: no secret in it): back off the next one. */
extern void   od_endpoint_token_failed(OdEndpointRef ref, uint64 client, const char *error, TimestampTz now);
/* A 401 answered a request sent with this generation: refresh it (once, whoever reports it first). */
extern void   od_endpoint_token_reject(OdEndpointRef ref, uint64 generation);

#endif /* OUTBOX_DISPATCHER_ENDPOINT_STATE_H */
