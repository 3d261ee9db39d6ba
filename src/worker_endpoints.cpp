/*
 * worker_endpoints.cpp — what a worker knows about the installed extension
 * (is it there, which schema version, may we use it) and the endpoints it
 * serves: loaded into the Dispatcher, keyed to their shared-memory slots,
 * with the limits a claim reserves against.  See worker.h.
 */
#include "worker.h"

namespace odw {

void
split_lines(const char *text, std::vector<std::string> &out) noexcept
{
    try
    {
        const char *p = text;

        while (p && *p)
        {
            const char *nl = strchr(p, '\n');
            size_t      len = nl ? (size_t) (nl - p) : strlen(p);

            if (len > 0)
                out.emplace_back(p, len);
            p = nl ? nl + 1 : nullptr;
        }
    }
    catch (...)
    {}
}

/* ---------------------------------------------------------------- endpoints */

static void
load_endpoint(const OdEndpointRow *r) noexcept
{
    try
    {
        od::EndpointConfig e;

        e.name = r->name;
        e.url = r->url;
        split_lines(r->headers, e.header_lines);
        if (r->secret)
        {
            unsigned char key[od::kMaxSecretBytes + 8];
            long          n = od::decode_webhook_secret(r->secret, strlen(r->secret), key, sizeof(key));

            if (n > 0)
                e.key.assign(key, key + n);
        }
        if (r->secret && r->previous_secret)
        {
            unsigned char key[od::kMaxSecretBytes + 8];
            long          n = od::decode_webhook_secret(r->previous_secret, strlen(r->previous_secret), key, sizeof(key));

            if (n > 0)
            {
                e.previous_key.assign(key, key + n);
                e.previous_key_until_unix_s = od_unix_seconds(r->previous_secret_until);
            }
        }
        e.timeout_ms = (long) r->timeout_ms;
        e.defer_statuses.assign(r->defer, r->defer + r->ndefer);
        e.retry_schedule_ms.assign(r->retry_schedule_ms, r->retry_schedule_ms + r->n_retry_schedule);
        e.max_attempts = r->max_attempts;
        if (r->proxy)
            e.proxy = r->proxy;
        if (r->client_cert && r->client_key)
        {
            e.client_cert = r->client_cert;
            e.client_key = r->client_key;
        }
        if (r->oauth_token_url && r->oauth_client_id && r->oauth_client_secret)
        {
            e.oauth.token_url = r->oauth_token_url;
            e.oauth.client_id = r->oauth_client_id;
            e.oauth.client_secret = r->oauth_client_secret;
            if (r->oauth_scope)
                e.oauth.scope = r->oauth_scope;
        }
        W.disp->add_endpoint(e);
    }
    catch (...)
    {}
}

/* Is the installed extension one this library can serve?  Sets ext_ready and schema. */
static void
check_extension(void)
{
    char         *version;
    Oid           admin;
    MemoryContext old;

    W.ext_ready = false;
    W.ext_idle_reason = nullptr;
    W.ext_idle_hint = nullptr;
    /* the reasons outlive the transaction: they are logged after it */
    old = MemoryContextSwitchTo(W.cycle_ctx);
    version = od_installed_version();
    if (version == nullptr)
    {
        MemoryContextSwitchTo(old);
        return;
    }
    W.schema = od_schema_number(version);
    admin = get_role_oid("outbox_admin", true);
    if (GetDatabaseEncoding() != PG_UTF8)
    {
        W.ext_idle_reason = psprintf("database \"%s\" has encoding %s; outbox_dispatcher needs UTF8 "
                                     "(JSON bodies and signed headers go out as UTF-8)",
                                     od_database, GetDatabaseEncodingName());
        W.ext_idle_hint = pstrdup("Install the extension in a UTF8 database.");
    }
    else if (!od_schema_served(W.schema))
    {
        W.ext_idle_reason =
            psprintf("extension version \"%s\" is not served by this library (%s)", version, OD_LIBRARY_VERSION);
        W.ext_idle_hint = W.schema != 0 && W.schema < OD_SCHEMA_PREVIOUS
            ? pstrdup(
                  "Run ALTER EXTENSION outbox_dispatcher UPDATE; the workers start delivering within poll_interval.")
            : pstrdup(
                  "Install the library that matches the extension version, or run ALTER EXTENSION outbox_dispatcher UPDATE.");
    }
    else if (!superuser() && (!OidIsValid(admin) || !has_privs_of_role(GetUserId(), admin)))
    {
        /* say it once, instead of a permission error every second */
        const char *me = GetUserNameFromId(GetUserId(), false);

        W.ext_idle_reason =
            psprintf("role \"%s\" (outbox_dispatcher.role) does not have the privileges of outbox_admin", me);
        W.ext_idle_hint = psprintf("Run GRANT outbox_admin TO %s; the workers start delivering within poll_interval.",
                                   quote_identifier(me));
    }
    else
        W.ext_ready = true;
    MemoryContextSwitchTo(old);
}

void
refresh_endpoints(void)
{
    OdEndpointRow *rows = nullptr;
    int            nrows = 0;
    bool           installed;

    begin_tx("loading endpoints");
    check_extension();
    installed = W.ext_ready || W.ext_idle_reason != nullptr;
    if (W.ext_ready)
        nrows = od_read_endpoints(W.schema, W.cycle_ctx, &rows);
    end_tx();

    if (!W.ext_ready)
    {
        /* once per state: not installed, then (say) installed at a schema we do not serve */
        const char *why = installed ? W.ext_idle_reason : "";
        uint32      said = hash_bytes((const unsigned char *) why, (int) strlen(why)) | 1;

        if (said != W.ext_idle_logged)
        {
            if (installed)
                ereport(WARNING,
                        (errmsg("outbox_dispatcher: not delivering: %s", W.ext_idle_reason),
                         errhint("%s", W.ext_idle_hint)));
            else
                ereport(
                    LOG,
                    (errmsg("outbox_dispatcher: extension is not installed in database \"%s\"; waiting", od_database),
                     errhint("Run CREATE EXTENSION outbox_dispatcher in that database.")));
        }
        W.ext_idle_logged = said;
        return;
    }
    W.ext_idle_logged = 0;
    W.disp->begin_endpoints();
    for (int i = 0; i < nrows; i++)
        load_endpoint(&rows[i]);
    W.disp->end_endpoints();

    /* the shared-state slots and limits of the endpoints we serve */
    {
        int64         *keep = (int64 *) MemoryContextAllocZero(W.cycle_ctx, sizeof(int64) * (nrows + 1));
        int            unserved = 0;
        StringInfoData names;
        uint32         before;

        initStringInfo(&names);
        for (int i = 0; i < nrows; i++)
            keep[i] = rows[i].id;
        MemoryContextReset(W.endpoint_ctx);
        W.wendpoints = (WorkerEndpoint *) MemoryContextAllocZero(W.endpoint_ctx, sizeof(WorkerEndpoint) * (nrows + 1));
        W.n_wendpoints = 0;
        W.n_oauth = 0;
        for (int i = 0; i < nrows; i++)
        {
            WorkerEndpoint *w = &W.wendpoints[W.n_wendpoints];

            if (!od_endpoint_acquire(rows[i].relid, rows[i].id, rows[i].name, keep, nrows, &w->ref))
            {
                if (unserved < 5)
                    appendStringInfo(&names, "%s\"%s\"", unserved > 0 ? ", " : "", rows[i].name);
                unserved++;
                continue;
            }
            w->name = MemoryContextStrdup(W.endpoint_ctx, rows[i].name);
            w->id = rows[i].id;
            w->lim.max_in_flight = rows[i].max_in_flight;
            w->lim.rate_limit = rows[i].rate_limit;
            w->lim.breaker_threshold = rows[i].breaker_threshold;
            w->lim.breaker_cooldown_us = rows[i].breaker_cooldown_ms * 1000;
            w->lim.disable_after_us = rows[i].disable_after_us;
            w->lim.changed_at = rows[i].updated_at;
            w->oauth_client = oauth_client_hash(&rows[i]);
            w->timeout_ms = rows[i].timeout_ms;
            if (w->oauth_client != 0)
                W.n_oauth++;
            W.n_wendpoints++;
        }
        W.endpoints_stale = false;
        {
            int64 cap = 0;

            for (int i = 0; i < W.n_wendpoints; i++)
                cap = Min((int64) INT_MAX, cap + claim_share(&W.wendpoints[i]));
            W.pipeline_cap = (int) cap;
        }

        /* say so once per change, cluster-wide: the worker that changes the count logs it */
        before = pg_atomic_exchange_u32(&od_shared->endpoints_unserved, (uint32) unserved);
        if (unserved > 0 && before != (uint32) unserved)
            ereport(
                WARNING,
                (errmsg("outbox_dispatcher: %d enabled endpoint(s) cannot be served: all %d endpoint slots are in use",
                        unserved, od_shared->max_endpoints),
                 errdetail("Not served: %s%s.", names.data, unserved > 5 ? ", ..." : ""),
                 errhint(
                     "Raise outbox_dispatcher.max_endpoints (needs a restart), or disable endpoints that are not needed.")));
        else if (unserved == 0 && before > 0)
            ereport(LOG, (errmsg("outbox_dispatcher: every enabled endpoint is served again")));
    }
}

/* ---------------------------------------------------------------- claim */

/* This worker's share of the endpoint's max_in_flight (core/schedule.hpp). */
int
claim_share(const WorkerEndpoint *w)
{
    return od::endpoint_share(w->lim.max_in_flight, od_workers);
}

/* What this worker can usefully hold at once (core/schedule.hpp). */
int
pipeline_size(void)
{
    return od::pipeline_size(W.pipeline_cap, od_batch_size);
}

} // namespace odw
