/*
 * core/dispatcher.hpp — one worker's delivery pipeline, without PostgreSQL.
 *
 * The background worker (src/worker.cpp) claims messages in a transaction,
 * hands them to a Dispatcher with add(), and then only drives the event
 * loop.  The Dispatcher
 *   - keeps the endpoint configuration (refreshed by the worker every
 *     poll_interval) and a FIFO of claimed messages per endpoint;
 *   - builds each request (src/core/request.cpp) and submits it to the
 *     HttpEngine while the worker is under its max_transfers (one socket
 *     per transfer: the cap keeps a worker inside its descriptor budget).
 *     An endpoint's max_in_flight is not enforced here: the worker claims
 *     no more of an endpoint's messages than the places it reserved in
 *     the endpoint's shared slot (src/endpoint_state.cpp), so whatever it
 *     hands over may be sent at once — one mechanism, cluster-wide;
 *   - turns completions into Results with src/core/outcome.cpp, ready for a
 *     batched fenced finalize.
 *
 * Pure C++: every method is noexcept and catches its own allocation
 * failures, so the worker can call it from PostgreSQL frames.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/http_engine.hpp"
#include "core/oauth.hpp"
#include "core/outcome.hpp"
#include "core/request.hpp"

namespace od {

struct EndpointConfig {
    std::string name;
    std::string url;
    std::vector<std::string> header_lines; /* "Name: value" */
    std::vector<unsigned char> key;        /* decoded signing secret; empty = unsigned */
    /*
     * The secret rotate_secret() replaced, still signed with (after key)
     * until previous_key_until_unix_s; empty = none.
     */
    std::vector<unsigned char> previous_key;
    int64_t previous_key_until_unix_s = 0;
    long timeout_ms = 10000;
    std::vector<int> defer_statuses;
    std::vector<int64_t> retry_schedule_ms; /* delays before each retry; empty = the settings' backoff */
    std::string proxy;                      /* proxy URL; empty = the settings' proxy */
    std::string client_cert;                /* PEM, TLS client authentication; empty = none */
    std::string client_key;
    int max_attempts = 0;                   /* 0 = retry_schedule's length + 1, else the settings' */
    OAuthClient oauth;                      /* client credentials; token_url empty = none */
};

struct ClaimedMessage {
    int64_t id = 0;
    int64_t lease_version = 0;
    int64_t lease_until_us = 0; /* the claim's lease deadline: part of the fence, copied to the outcome */
    int attempts = 0;
    std::string endpoint;
    std::string event_type;
    std::string aggregate_type;
    std::string aggregate_id;
    std::string body;                      /* payload JSON text, sent as is */
    std::vector<std::string> header_lines; /* the message's extra headers */
    int64_t created_at_unix_us = 0;
    int endpoint_tag = -1; /* caller's tag, copied to the outcome */
    bool auth_resent = false; /* OAuth: already sent again after a 401 */
};

/* A finished token request (Dispatcher::fetch_token). */
struct TokenResult {
    std::string endpoint;
    TokenAnswer answer;
    int64_t started_unix_ms; /* when the request went out: the token's lifetime counts from then */
};

/* What a Dispatcher knows of an OAuth endpoint's token (Dispatcher::token_state). */
struct TokenState {
    uint64_t generation = 0;    /* of the token it sends; 0 = none */
    uint64_t rejected = 0;      /* a 401 came back for this generation (0 = none): take_rejected() */
    bool fetching = false;      /* a token request of this Dispatcher is in flight */
    bool busy = false;          /* messages of the endpoint queued or in flight */
    bool waiting = false;       /* some are queued for want of a usable token */
    int64_t waiting_since_ms = 0;
};

struct DeliveryOutcome {
    int64_t id;
    int64_t lease_version;
    int64_t lease_until_us; /* the message's lease_until_us */
    Verdict verdict;
    int64_t delay_ms;
    bool refund; /* Retry: give the attempt back */
    /*
     * Retry (refunded) because this process ran out of descriptors or
     * memory, or could not start the transfer: not the endpoint's doing, so
     * no breaker or endpoint statistics.  latency_ms is then < 0 as well.
     */
    bool local_failure;
    /*
     * Not sent for the endpoint's own failure (its OAuth token endpoint
     * gave no token): a charged Retry/Dead that the breaker and
     * disable_after hear of, with latency_ms < 0 so no latency statistic
     * counts a request that was never made.
     */
    bool unsent_endpoint_failure;
    int endpoint_tag;  /* the message's endpoint_tag */
    int http_status;   /* 0 = none */
    double latency_ms; /* < 0: not sent (see unsent_endpoint_failure), or a local failure */
    char error[kOutcomeErrorSize];
    /* for the attempt log (outbox.attempts) */
    int attempts;             /* the message's attempt count, this one included */
    int64_t started_unix_us;  /* when the request was submitted; 0 = never sent */
    int transport_error;      /* CURLcode, 0 = an HTTP response */
    char retry_after[64];     /* the response's Retry-After, "" if none */
    std::size_t body_len;     /* bytes of body */
    char body[kBodyCap];      /* first bytes of the response body, raw */

    /* The endpoint's doing, for its breaker and disable_after: an answer or a transport failure
     * of a request made, or an unsent_endpoint_failure; never a local failure. */
    bool counts_for_endpoint() const noexcept {
        return !local_failure && (latency_ms >= 0 || unsent_endpoint_failure);
    }
};

struct DispatcherSettings {
    WireSettings wire; /* ce-source, id prefix */
    AddressFilter egress; /* networks connections may (not) go to */
    std::string proxy;    /* every endpoint's proxy unless it names its own; empty = none */
    std::string no_proxy; /* hosts reached directly all the same */
    int max_attempts = 12;
    BackoffPolicy backoff{1000, 300000};
    int64_t defer_delay_ms = 30000;
    int64_t max_retry_after_s = 86400;
    /*
     * Transfers (sockets) this worker has in flight at most, across all
     * endpoints; 0 = unlimited.  Messages beyond it stay queued, in order,
     * until transfers finish.  It also bounds the keep-alive pool.
     */
    std::size_t max_transfers = 0;
    /*
     * Idle keep-alive connections kept for reuse, at least; 0 = the
     * engine's own size (HttpEngineOptions::max_connections).  Set it to
     * what one claim can put in flight, or every request beyond the pool
     * reconnects.  Never more than max_transfers.
     */
    std::size_t pool_connections = 0;
};

class Dispatcher {
  public:
    bool init(const HttpEngineOptions &opts, uint64_t seed) noexcept;
    const char *last_error() const noexcept { return engine_.last_error(); }

    void set_settings(const DispatcherSettings &s) noexcept;

    /* Replace the endpoint configuration (in-flight counts are kept by name). */
    void begin_endpoints() noexcept;
    bool add_endpoint(const EndpointConfig &e) noexcept;
    void end_endpoints() noexcept;
    bool has_endpoint(const std::string &name) const noexcept;

    /* Queue a claimed message; false on allocation failure. */
    bool add(ClaimedMessage &&m) noexcept;

    /*
     * Submit queued messages while their endpoint has room and fewer than
     * max_transfers are in flight, one message per endpoint in turn (so
     * that under the cap no endpoint takes every free place).  A message
     * whose endpoint is unknown, or whose request cannot be built, becomes
     * a Retry outcome at once; one whose transfer cannot be started becomes
     * a refunded local-failure Retry.  now_unix_s: webhook-timestamp.
     */
    void pump(int64_t now_unix_s) noexcept;

    /*
     * OAuth endpoints.  The token to send (Authorization: Bearer) and until
     * when (Unix milliseconds); generation identifies it (a 401 names the
     * generation it rejected).  A message of an OAuth endpoint is sent only
     * with a usable token; until then it stays queued.  A 401 answer is not
     * an outcome the first time: the message is queued again (its attempt
     * not used twice) for a token newer than the one rejected.
     */
    void set_token(const std::string &endpoint, const char *token, std::size_t len, uint64_t generation,
                   int64_t usable_until_ms) noexcept;
    bool token_state(const std::string &endpoint, int64_t now_ms, TokenState &out) const noexcept;
    /* The token of that generation is not sent after until_ms (earlier than set_token said: rejected). */
    void limit_token(const std::string &endpoint, uint64_t generation, int64_t until_ms) noexcept;
    void take_rejected(const std::string &endpoint) noexcept;
    /* Start a token request for the endpoint; false (why in last_error()) if it cannot start. */
    bool fetch_token(const std::string &endpoint) noexcept;
    std::vector<TokenResult> &token_results() noexcept { return token_results_; }
    /*
     * The endpoint's messages queued for want of a token become Retry
     * outcomes (their attempt used: a token endpoint that fails is the
     * endpoint failing), with "not sent: <why>" as the error.
     */
    void fail_token_waiters(const std::string &endpoint, const char *why) noexcept;

    /* Turn finished transfers into outcomes (appended to outcomes()). */
    void collect(int64_t now_unix_s) noexcept;

    std::vector<DeliveryOutcome> &outcomes() noexcept { return outcomes_; }
    std::size_t queued() const noexcept { return queued_; }
    std::size_t in_flight() const noexcept { return engine_.in_flight(); }
    std::size_t outstanding() const noexcept { return queued_ + engine_.in_flight(); }

    HttpEngine &engine() noexcept { return engine_; }

    /*
     * Shutdown: abort every transfer in flight and turn it, and every queued
     * message, into a Retry outcome with the attempt refunded and no delay,
     * so another worker can take it at once instead of waiting for the lease.
     */
    void abandon(int64_t now_unix_s, const char *why) noexcept;

    /*
     * Turn every queued (not yet sent) message into a Retry outcome with the
     * attempt refunded and no delay; transfers in flight go on.  For a worker
     * that must not send what it holds (deliver_after_replication).
     */
    void release_queued(const char *why) noexcept;

  private:
    struct EndpointState {
        EndpointConfig cfg;
        int in_flight = 0;
        std::deque<ClaimedMessage> queue;
        /* OAuth: the endpoint's header lines with the Authorization of the token */
        std::vector<std::string> auth_headers;
        uint64_t token_gen = 0;
        int64_t token_until_ms = 0;
        uint64_t rejected_gen = 0;
        uint64_t fetch_tag = 0;         /* token request in flight; 0 = none */
        int64_t waiting_since_ms = 0;   /* first queued message seen without a usable token; 0 = none */
        bool token_usable(int64_t now_ms) const noexcept { return token_gen != 0 && now_ms < token_until_ms; }
    };
    struct Sent {
        int64_t id;
        int64_t lease_version;
        int64_t lease_until_us;
        int attempts;
        std::string endpoint;
        int endpoint_tag;
        int64_t started_unix_us;
        uint64_t token_gen;  /* OAuth: the token sent (0: none) */
        ClaimedMessage keep; /* OAuth: the message, to send again after a 401 */
    };
    void finish_token_fetch(const HttpCompletion &c, const std::string &endpoint, int64_t started_ms) noexcept;
    void push_release(int64_t id, int64_t lease_version, int64_t lease_until_us, int endpoint_tag,
                      const char *why) noexcept;

    /* cfg: the message's endpoint (its retry schedule and attempt limit), nullptr if unknown */
    void fail_now(const ClaimedMessage &m, const EndpointConfig *cfg, const char *why, bool local) noexcept;
    /* The retry delays and the attempt limit for a message of cfg (nullptr: the settings'). */
    BackoffPolicy backoff_for(const EndpointConfig *cfg) const noexcept;
    int max_attempts_for(const EndpointConfig *cfg) const noexcept;
    void send_front(EndpointState &ep, int64_t now_unix_s) noexcept;
    bool below_max_transfers() const noexcept;
    void apply_pool_size() noexcept;

    HttpEngine engine_;
    DispatcherSettings settings_;
    std::unordered_map<std::string, EndpointState> endpoints_;
    std::unordered_map<std::string, bool> seen_; /* during begin/end_endpoints */
    std::unordered_map<uint64_t, Sent> sent_;    /* tag -> message */
    std::unordered_map<uint64_t, std::pair<std::string, int64_t>> token_fetches_; /* tag -> endpoint, start (ms) */
    std::vector<TokenResult> token_results_;
    std::string token_body_;
    std::vector<DeliveryOutcome> outcomes_;
    std::vector<HttpCompletion> completions_;
    std::vector<std::string> header_buf_;
    std::vector<EndpointState *> ready_; /* pump(): endpoints with work and room */
    std::size_t next_first_ = 0;         /* pump(): which of them goes first */
    long pool_size_ = 256;               /* HttpEngineOptions::max_connections */
    std::mt19937_64 rng_;
    uint64_t next_tag_ = 1;
    std::size_t queued_ = 0;
};

} // namespace od
