/*
 * worker_oauth.cpp — OAuth client credentials: keeping the Dispatcher's
 * access tokens current from the endpoints' shared slots, fetching one when
 * this worker is the first to need it, and what happens to messages that
 * cannot get one.  See worker.h; the shared side is in endpoint_state.cpp,
 * the request and its answer in core/oauth.cpp.
 *
 * Nothing here ever logs or stores a token or the client secret: a failed
 * fetch is described by core/oauth.cpp's error text (status, OAuth error
 * code, curl's transport message).
 */
#include "worker.h"

namespace odw {

/* Unix milliseconds of a timestamp: the Dispatcher's clock. */
static int64
unix_ms(TimestampTz ts)
{
    return od_unix_micros(ts) / 1000;
}

uint64
oauth_client_hash(const OdEndpointRow *r)
{
    uint64 h = 0;

    if (r->oauth_token_url == nullptr)
        return 0;
    for (const char *part : { r->oauth_token_url, r->oauth_client_id, r->oauth_client_secret, r->oauth_scope })
    {
        const char *p = part ? part : "";

        /* the length too: ("ab","c") and ("a","bc") differ */
        h = hash_combine64(h, hash_bytes_extended((const unsigned char *) p, (int) strlen(p), (uint64) strlen(p)));
    }
    return h | 1; /* 0 means "no OAuth" */
}

/* The endpoint's messages waiting for a token become retries. */
static void
give_up_waiting(const WorkerEndpoint *w, const char *why)
{
    char msg[300];

    snprintf(msg, sizeof(msg), "no OAuth2 access token: %s", why && *why ? why : "the token request failed");
    try
    {
        W.disp->fail_token_waiters(std::string(w->name), msg);
    }
    catch (...)
    {}
}

/* A token request of ours finished: share the token, or the failure. */
static void
take_token_results(TimestampTz now)
{
    std::vector<od::TokenResult> &res = W.disp->token_results();

    for (od::TokenResult &r : res)
    {
        const WorkerEndpoint *w = nullptr;

        for (int i = 0; i < W.n_wendpoints; i++)
            if (W.wendpoints[i].oauth_client != 0 && r.endpoint == W.wendpoints[i].name)
                w = &W.wendpoints[i];
        if (w == nullptr)
            continue; /* the endpoint went away meanwhile */
        if (r.answer.ok)
        {
            od::TokenTimes t = od::token_times(r.started_unix_ms, r.answer.lifetime_s);
            uint64         gen = od_endpoint_token_store(w->ref, w->oauth_client, r.answer.access_token.data(),
                                                         (int) r.answer.access_token.size(),
                                                         od_from_unix_micros(t.refresh_at_ms * 1000),
                                                         od_from_unix_micros(t.usable_until_ms * 1000));

            if (gen != 0)
                W.disp->set_token(r.endpoint, r.answer.access_token.data(), r.answer.access_token.size(), gen,
                                  t.usable_until_ms);
        }
        else
        {
            od_endpoint_token_failed(w->ref, w->oauth_client, r.answer.error, now);
            give_up_waiting(w, r.answer.error);
        }
        /* workers holding messages for it sleep until told */
        od_wake_workers();
        /* the token is not kept here any longer than needed */
        std::fill(r.answer.access_token.begin(), r.answer.access_token.end(), '\0');
    }
    res.clear();
}

void
step_tokens(TimestampTz now)
{
    int64 now_ms;

    if (W.n_oauth == 0)
    {
        W.disp->token_results().clear(); /* the endpoint stopped using OAuth while its fetch ran */
        return;
    }
    take_token_results(now);
    now_ms = unix_ms(now);
    for (int i = 0; i < W.n_wendpoints; i++)
    {
        WorkerEndpoint *w = &W.wendpoints[i];
        od::TokenState  mine;
        OdTokenView     v;
        int             len;
        bool            copied;
        bool            need;
        std::string     name;

        if (w->oauth_client == 0)
            continue;
        try
        {
            name = w->name;
        }
        catch (...)
        {
            continue;
        }
        if (!W.disp->token_state(name, now_ms, mine))
            continue;
        if (mine.rejected != 0)
        {
            od_endpoint_token_reject(w->ref, mine.rejected);
            W.disp->take_rejected(name);
        }
        copied = od_endpoint_token_read(w->ref, w->oauth_client, mine.generation, &v, W.token_buf, &len);
        if (copied)
        {
            W.disp->set_token(name, W.token_buf, (size_t) len, v.generation, unix_ms(v.usable_until));
            explicit_bzero(W.token_buf, len);
            W.disp->token_state(name, now_ms, mine);
        }
        else if (v.generation != 0 && v.generation == mine.generation)
            W.disp->limit_token(name, v.generation, unix_ms(v.usable_until)); /* another worker's 401 rejected it */
        /* a fetch is due: no token, its refresh time, or a 401 rejected it; only for messages we hold */
        need = v.generation == 0 || now >= v.refresh_at || now >= v.usable_until;
        if (need && mine.busy && !mine.fetching && now >= v.next_fetch &&
            od_endpoint_token_claim(w->ref, now, TimestampTzPlusMilliseconds(now, w->timeout_ms + 1000)))
        {
            if (W.disp->fetch_token(name))
                mine.fetching = true;
            else
            {
                const char *why = "cannot start the token request (out of memory or file descriptors)";

                od_endpoint_token_failed(w->ref, w->oauth_client, why, now);
                give_up_waiting(w, why);
                continue;
            }
        }
        if (!mine.waiting || mine.fetching)
            continue;
        /* nobody fetching and the next fetch backed off: the last one failed */
        if (v.fetch_until <= now && now < v.next_fetch)
            give_up_waiting(w, v.error);
        /* a fetcher that never answered (it exited): do not wait for ever */
        else if (now_ms - mine.waiting_since_ms > w->timeout_ms * 2 + 5000)
            give_up_waiting(w, "the token request did not finish in time");
    }
}

} // namespace odw
