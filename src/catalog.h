/*
 * catalog.h — the only code that knows what the installed schema looks like:
 * which extension versions this library serves, the columns of
 * outbox.endpoints as the workers read them, and the endpoint lookups and
 * state changes every caller shares (catalog.cpp).
 *
 * Support policy: the library serves its own schema (OD_SCHEMA_CURRENT) and
 * the one before it (OD_SCHEMA_PREVIOUS), so that a rolling ALTER EXTENSION
 * ... UPDATE never stops delivery.  On anything older the workers log once,
 * with a hint to run ALTER EXTENSION outbox_dispatcher UPDATE, and idle; the
 * SQL functions of such a schema that depend on its layout raise the same
 * hint.  The statements in transitions.cpp name only what both served
 * schemas have (outbox.endpoints name and enabled; outbox.messages as
 * indexed since 0.2.2).
 */
#ifndef OUTBOX_DISPATCHER_CATALOG_H
#define OUTBOX_DISPATCHER_CATALOG_H

#include "outbox_dispatcher.h"

/* Extension versions, as major * 100 + minor * 10 + patch (0 = unknown). */
#define OD_SCHEMA_0_2_2 22
#define OD_SCHEMA_0_3_0 30
#define OD_SCHEMA_CURRENT OD_SCHEMA_0_3_0
#define OD_SCHEMA_PREVIOUS OD_SCHEMA_0_2_2

/* The schema number of an extversion string; 0 for one this library never shipped. */
extern int               od_schema_number(const char *extversion);
/* Does this library serve that schema (the support policy above)? */
extern bool              od_schema_served(int schema);

/*
 * Does the schema tell the workers when outbox.endpoints changes (the
 * endpoints_changed trigger bumps od_shared->endpoints_generation at
 * commit)?  Without it they re-read the table every poll_interval.
 */
extern bool              od_schema_announces_endpoint_changes(int schema);

/*
 * The installed extension's version (palloc'd in the current context), or
 * NULL when it is not installed in this database.  Needs SPI.
 */
extern char             *od_installed_version(void);

/*
 * Does the schema record, per message, the transactions an ordered message
 * must wait for (messages.ordered_after, set by the insert trigger; 0.3.0)?
 * Before, ordered delivery relied on producers locking the aggregate.
 */
extern bool              od_schema_records_commit_order(int schema);

/*
 * Does the schema have fan-out and the attempt log (0.3.0):
 * outbox.subscriptions, outbox.attempts, messages.dead_at, and ordering
 * per aggregate per endpoint (messages_open covers the endpoint), and
 * secret rotation (endpoints.previous_signing_secret)?
 */
extern bool              od_schema_has_fanout(int schema);

/*
 * An error for SQL functions of a schema this library does not serve:
 * "function X of extension version V is not served by library L".
 */
[[noreturn]] extern void od_schema_unserved_error(const char *function, const char *extversion);

/*
 * Stored headers (a jsonb object of strings, validated on write, in
 * outbox.endpoints.headers and outbox.messages.headers) as "Name: value\n"
 * lines, palloc'd.
 */
extern char             *od_header_lines_text(Datum d);

/* outbox.endpoints as the workers read it: one enabled endpoint. */
typedef struct OdEndpointRow
{
    Oid    relid; /* outbox.endpoints' oid: part of the shared-state key */
    int64  id;
    char  *name;
    char  *url;
    char  *headers;    /* "Name: value\n..." lines */
    char  *secret;     /* NULL for unsigned */
    char  *previous_secret;        /* the one rotate_secret() replaced, while its grace lasts; NULL: none */
    TimestampTz previous_secret_until; /* when previous_secret stops signing */
    int64 *retry_schedule_ms;          /* 0.3.0: delays before each retry; n_retry_schedule 0 = the GUCs' backoff */
    int    n_retry_schedule;
    int    max_attempts;               /* 0.3.0: 0 = not set */
    int64  disable_after_us;           /* 0.3.0: 0 = never */
    TimestampTz updated_at;            /* 0.3.0: the row's last change */
    char  *proxy;                      /* 0.3.0: NULL = outbox_dispatcher.proxy */
    char  *client_cert;                /* 0.3.0: PEM; NULL = none */
    char  *client_key;
    char  *oauth_token_url;            /* 0.3.0: OAuth client credentials; NULL = none */
    char  *oauth_client_id;
    char  *oauth_client_secret;
    char  *oauth_scope;
    int64  timeout_ms; /* >= 1: a sub-millisecond timeout must not become curl's "none" */
    int    max_in_flight;
    int   *defer;
    int    ndefer;
    double rate_limit; /* messages per second; 0 = none */
    int    breaker_threshold;
    int64  breaker_cooldown_ms;
} OdEndpointRow;

/*
 * The enabled endpoints of a served schema, into rows allocated in cxt;
 * returns how many.  Needs SPI, inside a transaction.
 */
extern int od_read_endpoints(int schema, MemoryContext cxt, OdEndpointRow **rows);

/*
 * Does an endpoint of that name exist, and is it enabled?  Sets *id when it
 * exists (id may be NULL).  The one existence check of enqueue(),
 * move_messages(), pause_endpoint() and resume_endpoint().  Needs SPI.
 */
typedef enum OdEndpointPresence
{
    OD_ENDPOINT_MISSING = 0,
    OD_ENDPOINT_DISABLED,
    OD_ENDPOINT_ENABLED
} OdEndpointPresence;
extern OdEndpointPresence od_endpoint_presence(Datum name, int64 *id);

/*
 * Disable (reason: the disabled_reason to record) or enable (reason NULL)
 * the endpoint with this id, if it is not so already; true if it changed.
 * The only code that writes outbox.endpoints.enabled: the workers' 410
 * handling and outbox.pause_endpoint()/resume_endpoint().  Needs SPI.
 */
extern bool               od_set_endpoint_enabled(int64 id, bool enabled, const char *reason);

#endif
