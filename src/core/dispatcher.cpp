/*
 * core/dispatcher.cpp — per-worker delivery pipeline (see dispatcher.hpp).
 *
 * Local failures (the transfer could not be started, or it failed for want
 * of descriptors or memory in this process) are refunded Retries with a
 * short delay and latency_ms = -1: the message did nothing wrong and the
 * endpoint was maybe never contacted, so neither attempts nor the breaker
 * may be charged; -1 already keeps today's worker from feeding the
 * breaker.  A request that cannot be built stays a charged Retry: its
 * causes (allocation, HMAC) may be permanent for that message, and only a
 * charged attempt lets it end Dead instead of cycling for ever.
 */
#include "core/dispatcher.hpp"

#include <cstdio>
#include <cstring>

#include "core/request.hpp"

#include <algorithm>
#include <chrono>

namespace od {

namespace {
/* wall-clock time for the attempt log's started_at (the server's own clock) */
int64_t unix_now_us() noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
} // namespace

bool Dispatcher::init(const HttpEngineOptions &opts, uint64_t seed) noexcept {
    rng_.seed(seed);
    pool_size_ = opts.max_connections;
    if (!engine_.init(opts)) return false;
    apply_pool_size(); /* settings may have come first */
    return true;
}

void Dispatcher::set_settings(const DispatcherSettings &s) noexcept {
    try {
        settings_ = s;
    } catch (...) {
        /* keep the previous settings */
    }
    engine_.set_address_filter(settings_.egress);
    apply_pool_size();
}

/* Idle connections are sockets too: never keep more than max_transfers of them. */
void Dispatcher::apply_pool_size() noexcept {
    long pool = pool_size_;
    if (pool > 0 && settings_.pool_connections > static_cast<std::size_t>(pool))
        pool = static_cast<long>(settings_.pool_connections);
    std::size_t cap = settings_.max_transfers;
    if (cap > 0 && (pool <= 0 || cap < static_cast<std::size_t>(pool))) pool = static_cast<long>(cap);
    engine_.set_max_connections(pool);
}

bool Dispatcher::below_max_transfers() const noexcept {
    return settings_.max_transfers == 0 || engine_.in_flight() < settings_.max_transfers;
}

void Dispatcher::begin_endpoints() noexcept {
    seen_.clear();
}

namespace {
/* The endpoint's header lines with the Authorization of an access token after them. */
void bearer_headers(const std::vector<std::string> &endpoint_lines, const char *token, std::size_t len,
                    std::vector<std::string> &out) {
    out = endpoint_lines;
    std::string line("Authorization: Bearer ");
    line.append(token, len);
    out.push_back(std::move(line));
}
} // namespace

bool Dispatcher::add_endpoint(const EndpointConfig &e) noexcept {
    try {
        EndpointState &st = endpoints_[e.name];
        bool same_client = st.cfg.oauth == e.oauth;
        bool same_headers = st.cfg.header_lines == e.header_lines;
        st.cfg = e;
        if (!same_client || !e.oauth.enabled()) {
            /* another client (or none): the token held is not its own */
            st.token_gen = 0;
            st.token_until_ms = 0;
            st.auth_headers.clear();
        } else if (!same_headers && st.token_gen != 0) {
            std::string token = st.auth_headers.back().substr(std::strlen("Authorization: Bearer "));
            bearer_headers(e.header_lines, token.data(), token.size(), st.auth_headers);
        }
        seen_[e.name] = true;
        return true;
    } catch (...) {
        return false;
    }
}

void Dispatcher::end_endpoints() noexcept {
    /* Forget endpoints that disappeared, unless they still have work. */
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
        if (seen_.count(it->first) == 0 && it->second.in_flight == 0 && it->second.queue.empty())
            it = endpoints_.erase(it);
        else
            ++it;
    }
    seen_.clear();
}

bool Dispatcher::has_endpoint(const std::string &name) const noexcept {
    return endpoints_.count(name) != 0;
}

bool Dispatcher::add(ClaimedMessage &&m) noexcept {
    try {
        auto it = endpoints_.find(m.endpoint);
        if (it == endpoints_.end()) {
            fail_now(m, nullptr, "endpoint is not configured in this worker yet", false);
            return true;
        }
        it->second.queue.push_back(std::move(m));
        queued_++;
        return true;
    } catch (...) {
        return false;
    }
}

BackoffPolicy Dispatcher::backoff_for(const EndpointConfig *cfg) const noexcept {
    BackoffPolicy b = settings_.backoff;
    if (cfg != nullptr && !cfg->retry_schedule_ms.empty()) {
        b.schedule_ms = cfg->retry_schedule_ms.data();
        b.n_schedule = cfg->retry_schedule_ms.size();
    }
    return b;
}

int Dispatcher::max_attempts_for(const EndpointConfig *cfg) const noexcept {
    if (cfg != nullptr && cfg->max_attempts > 0) return cfg->max_attempts;
    if (cfg != nullptr && !cfg->retry_schedule_ms.empty()) return static_cast<int>(cfg->retry_schedule_ms.size()) + 1;
    return settings_.max_attempts;
}

void Dispatcher::fail_now(const ClaimedMessage &m, const EndpointConfig *cfg, const char *why, bool local) noexcept {
    try {
        DeliveryOutcome o;
        std::memset(&o, 0, sizeof o);
        o.id = m.id;
        o.lease_version = m.lease_version;
        o.lease_until_us = m.lease_until_us;
        o.endpoint_tag = m.endpoint_tag;
        o.latency_ms = -1;
        if (local) {
            /* never Dead for this: the attempt is given back */
            o.verdict = Verdict::Retry;
            o.delay_ms = local_failure_delay_ms(settings_.backoff, rng_());
            o.refund = true;
            o.local_failure = true;
            std::snprintf(o.error, sizeof o.error,
                          "not sent: local resource failure in the dispatcher (%s); attempt not counted",
                          why && *why ? why : "cannot start the transfer");
        } else {
            o.verdict = m.attempts >= max_attempts_for(cfg) ? Verdict::Dead : Verdict::Retry;
            o.delay_ms = full_jitter_ms(m.attempts, backoff_for(cfg), rng_());
            o.refund = false;
            std::snprintf(o.error, sizeof o.error, "not sent: %s", why);
        }
        outcomes_.push_back(o);
    } catch (...) {
        /* the lease will expire and the message be claimed again */
    }
}

/* Build and submit the first queued message of ep (or fail it at once). */
void Dispatcher::send_front(EndpointState &ep, int64_t now_unix_s) noexcept {
    ClaimedMessage &m = ep.queue.front();
    bool built = false;
    bool started = false;
    bool oom = false;
    try {
        header_buf_.clear();
        MessageHead head{m.id,
                         m.attempts,
                         m.event_type.c_str(),
                         m.aggregate_type.c_str(),
                         m.aggregate_id.c_str(),
                         m.created_at_unix_us};
        SigningKey keys[2];
        std::size_t nkeys = 0;
        if (!ep.cfg.key.empty()) {
            keys[nkeys++] = SigningKey{ep.cfg.key.data(), ep.cfg.key.size()};
            /* during a rotation's grace period the replaced secret signs too, after the new one */
            if (!ep.cfg.previous_key.empty() && now_unix_s < ep.cfg.previous_key_until_unix_s)
                keys[nkeys++] = SigningKey{ep.cfg.previous_key.data(), ep.cfg.previous_key.size()};
        }
        /* OAuth: the token's Authorization is one of the endpoint's lines (a message's own is dropped) */
        const bool oauth = ep.cfg.oauth.enabled();
        built = build_request_headers(head, settings_.wire, oauth ? ep.auth_headers : ep.cfg.header_lines,
                                      m.header_lines, keys, nkeys, now_unix_s, m.body.data(), m.body.size(),
                                      header_buf_);
        if (built) {
            uint64_t tag = next_tag_++;
            sent_.emplace(tag, Sent{m.id, m.lease_version, m.lease_until_us, m.attempts, ep.cfg.name, m.endpoint_tag,
                                    unix_now_us(), oauth ? ep.token_gen : 0, ClaimedMessage()});
            TransferOptions opts;
            const std::string &proxy = ep.cfg.proxy.empty() ? settings_.proxy : ep.cfg.proxy;
            opts.proxy = proxy.c_str();
            opts.no_proxy = settings_.no_proxy.c_str();
            opts.client_cert = &ep.cfg.client_cert;
            opts.client_key = &ep.cfg.client_key;
            started = engine_.submit(tag, ep.cfg.url.c_str(), m.body.data(), m.body.size(), header_buf_,
                                     ep.cfg.timeout_ms, &opts);
            if (started) {
                ep.in_flight++;
                /* kept to be sent again after a 401 (the engine copied the body) */
                if (oauth && !m.auth_resent) sent_[tag].keep = std::move(m);
            } else
                sent_.erase(tag);
        }
    } catch (...) {
        oom = true; /* around the submit (sent_): as local as a failed submit */
    }
    if (!built)
        fail_now(m, &ep.cfg, "cannot build the request headers (out of memory or signing failure)", false);
    else if (!started)
        fail_now(m, &ep.cfg, oom ? "out of memory" : engine_.last_error(), true);
    ep.queue.pop_front();
    queued_--;
}

void Dispatcher::pump(int64_t now_unix_s) noexcept {
    /*
     * Rounds of one message per endpoint, the next call starting after the
     * endpoint served last: with max_transfers, the places freed by
     * finished transfers go to each endpoint in turn instead of always to
     * the one that happens to come first in the map.  Without the cap every
     * queued message is sent at once.
     */
    if (!below_max_transfers()) return;
    ready_.clear();
    const int64_t now_ms = unix_now_us() / 1000;
    try {
        for (auto &kv : endpoints_) {
            EndpointState &ep = kv.second;
            if (ep.queue.empty()) continue;
            if (ep.cfg.oauth.enabled() && !ep.token_usable(now_ms)) {
                /* waits for a token (token_state() tells the worker) */
                if (ep.waiting_since_ms == 0) ep.waiting_since_ms = now_ms;
                continue;
            }
            ep.waiting_since_ms = 0;
            ready_.push_back(&ep);
        }
    } catch (...) {
        /* out of memory: the endpoints collected so far are served, the rest next time */
    }
    const std::size_t n = ready_.size();
    if (n == 0) return;
    const std::size_t first = next_first_ % n;
    bool progress = true;
    while (progress && below_max_transfers()) {
        progress = false;
        for (std::size_t i = 0; i < n && below_max_transfers(); i++) {
            std::size_t k = (first + i) % n;
            EndpointState &ep = *ready_[k];
            if (ep.queue.empty()) continue;
            send_front(ep, now_unix_s);
            next_first_ = k + 1;
            progress = true;
        }
    }
}

void Dispatcher::collect(int64_t now_unix_s) noexcept {
    completions_.clear();
    engine_.drain(completions_);
    for (const HttpCompletion &c : completions_) {
        auto ft = token_fetches_.find(c.tag);
        if (ft != token_fetches_.end()) {
            finish_token_fetch(c, ft->second.first, ft->second.second);
            token_fetches_.erase(ft);
            continue;
        }
        auto it = sent_.find(c.tag);
        if (it == sent_.end()) continue;
        Sent &s = it->second;
        auto ep = endpoints_.find(s.endpoint);
        if (ep != endpoints_.end() && c.curl_code == 0 && c.status == 401 && s.token_gen != 0 &&
            ep->second.cfg.oauth.enabled() && !s.keep.auth_resent && s.keep.id == s.id) {
            /* 401 with an access token: once, send it again with a newer token */
            EndpointState &st = ep->second;
            st.in_flight--;
            if (s.token_gen > st.rejected_gen) st.rejected_gen = s.token_gen;
            if (st.token_gen == s.token_gen) st.token_until_ms = 0; /* never sent with it again */
            try {
                s.keep.auth_resent = true;
                st.queue.push_front(std::move(s.keep));
                queued_++;
                sent_.erase(it);
                continue;
            } catch (...) {
                st.in_flight++; /* out of memory: the 401 is the outcome after all */
            }
        }
        static const int kNoDefer = 0;
        OutcomePolicy pol{};
        if (ep != endpoints_.end()) {
            ep->second.in_flight--;
            pol.defer_statuses =
                ep->second.cfg.defer_statuses.empty() ? &kNoDefer : ep->second.cfg.defer_statuses.data();
            pol.n_defer_statuses = ep->second.cfg.defer_statuses.size();
        } else {
            pol.defer_statuses = &kNoDefer;
            pol.n_defer_statuses = 0;
        }
        const EndpointConfig *cfg = ep != endpoints_.end() ? &ep->second.cfg : nullptr;
        pol.max_attempts = max_attempts_for(cfg);
        pol.backoff = backoff_for(cfg);
        pol.defer_delay_ms = settings_.defer_delay_ms;
        pol.max_retry_after_s = settings_.max_retry_after_s;

        DeliveryResult r{};
        r.transport_error = c.curl_code;
        r.transport_message = c.error[0] ? c.error : nullptr;
        r.http_status = c.status;
        r.retry_after = c.retry_after_len ? c.retry_after : nullptr;
        r.retry_after_len = c.retry_after_len;

        r.local_failure = c.local_failure;
        r.os_errno = c.os_errno;

        Outcome o = classify(r, pol, s.attempts, now_unix_s, rng_(), c.body, c.body_len);
        try {
            DeliveryOutcome d;
            d.id = s.id;
            d.lease_version = s.lease_version;
            d.lease_until_us = s.lease_until_us;
            d.verdict = o.verdict;
            d.delay_ms = o.delay_ms;
            d.refund = o.local_failure;
            d.local_failure = o.local_failure;
            d.endpoint_tag = s.endpoint_tag;
            d.http_status = static_cast<int>(c.status);
            d.latency_ms = o.local_failure ? -1 : c.total_ms;
            std::memcpy(d.error, o.error, sizeof d.error);
            d.attempts = s.attempts;
            d.started_unix_us = s.started_unix_us;
            d.transport_error = c.curl_code;
            std::size_t ra = c.retry_after_len < sizeof d.retry_after ? c.retry_after_len : sizeof d.retry_after - 1;
            std::memcpy(d.retry_after, c.retry_after, ra);
            d.retry_after[ra] = '\0';
            d.body_len = c.body_len < sizeof d.body ? c.body_len : sizeof d.body;
            std::memcpy(d.body, c.body, d.body_len);
            outcomes_.push_back(d);
        } catch (...) {
            /* the lease will expire and the message be claimed again */
        }
        sent_.erase(it);
    }
}

void Dispatcher::finish_token_fetch(const HttpCompletion &c, const std::string &endpoint, int64_t started_ms) noexcept {
    try {
        token_body_.clear();
        engine_.take_body(c.tag, token_body_);
        TokenResult r;
        r.endpoint = endpoint;
        r.started_unix_ms = started_ms;
        read_token_answer(c.curl_code, c.error, c.status, token_body_.data(), token_body_.size(), r.answer);
        std::fill(token_body_.begin(), token_body_.end(), '\0');
        auto ep = endpoints_.find(endpoint);
        if (ep != endpoints_.end() && ep->second.fetch_tag == c.tag) ep->second.fetch_tag = 0;
        token_results_.push_back(std::move(r));
    } catch (...) {
        auto ep = endpoints_.find(endpoint);
        if (ep != endpoints_.end() && ep->second.fetch_tag == c.tag) ep->second.fetch_tag = 0;
    }
}

void Dispatcher::set_token(const std::string &endpoint, const char *token, std::size_t len, uint64_t generation,
                           int64_t usable_until_ms) noexcept {
    auto it = endpoints_.find(endpoint);
    if (it == endpoints_.end() || !it->second.cfg.oauth.enabled()) return;
    EndpointState &ep = it->second;
    try {
        bearer_headers(ep.cfg.header_lines, token, len, ep.auth_headers);
        ep.token_gen = generation;
        ep.token_until_ms = usable_until_ms;
    } catch (...) {
        ep.token_gen = 0; /* out of memory: no token for now */
        ep.token_until_ms = 0;
    }
}

bool Dispatcher::token_state(const std::string &endpoint, int64_t now_ms, TokenState &out) const noexcept {
    auto it = endpoints_.find(endpoint);
    if (it == endpoints_.end() || !it->second.cfg.oauth.enabled()) return false;
    const EndpointState &ep = it->second;
    out.generation = ep.token_gen;
    out.rejected = ep.rejected_gen;
    out.fetching = ep.fetch_tag != 0;
    out.busy = !ep.queue.empty() || ep.in_flight > 0;
    out.waiting = !ep.queue.empty() && !ep.token_usable(now_ms);
    out.waiting_since_ms = out.waiting ? (ep.waiting_since_ms ? ep.waiting_since_ms : now_ms) : 0;
    return true;
}

void Dispatcher::limit_token(const std::string &endpoint, uint64_t generation, int64_t until_ms) noexcept {
    auto it = endpoints_.find(endpoint);
    if (it != endpoints_.end() && it->second.token_gen == generation && until_ms < it->second.token_until_ms)
        it->second.token_until_ms = until_ms;
}

void Dispatcher::take_rejected(const std::string &endpoint) noexcept {
    auto it = endpoints_.find(endpoint);
    if (it != endpoints_.end()) it->second.rejected_gen = 0;
}

bool Dispatcher::fetch_token(const std::string &endpoint) noexcept {
    auto it = endpoints_.find(endpoint);
    if (it == endpoints_.end() || !it->second.cfg.oauth.enabled()) return false;
    EndpointState &ep = it->second;
    if (ep.fetch_tag != 0) return true;
    try {
        std::vector<std::string> lines;
        std::string body;
        if (!build_token_request(ep.cfg.oauth, lines, body)) return false;
        uint64_t tag = next_tag_++;
        TransferOptions opts;
        const std::string &proxy = ep.cfg.proxy.empty() ? settings_.proxy : ep.cfg.proxy;
        opts.proxy = proxy.c_str();
        opts.no_proxy = settings_.no_proxy.c_str();
        opts.client_cert = &ep.cfg.client_cert;
        opts.client_key = &ep.cfg.client_key;
        opts.keep_body = kTokenAnswerCap;
        token_fetches_.emplace(tag, std::make_pair(endpoint, unix_now_us() / 1000));
        bool ok = engine_.submit(tag, ep.cfg.oauth.token_url.c_str(), body.data(), body.size(), lines,
                                 ep.cfg.timeout_ms, &opts);
        for (std::string &l : lines) std::fill(l.begin(), l.end(), '\0');
        if (!ok) {
            token_fetches_.erase(tag);
            return false;
        }
        ep.fetch_tag = tag;
        return true;
    } catch (...) {
        return false;
    }
}

void Dispatcher::fail_token_waiters(const std::string &endpoint, const char *why) noexcept {
    auto it = endpoints_.find(endpoint);
    if (it == endpoints_.end()) return;
    EndpointState &ep = it->second;
    while (!ep.queue.empty()) {
        const ClaimedMessage &m = ep.queue.front();
        try {
            DeliveryOutcome o;
            std::memset(&o, 0, sizeof o);
            o.id = m.id;
            o.lease_version = m.lease_version;
            o.lease_until_us = m.lease_until_us;
            o.endpoint_tag = m.endpoint_tag;
            o.attempts = m.attempts;
            o.verdict = m.attempts >= max_attempts_for(&ep.cfg) ? Verdict::Dead : Verdict::Retry;
            o.delay_ms = full_jitter_ms(m.attempts, backoff_for(&ep.cfg), rng_());
            o.latency_ms = -1; /* no request made: no latency */
            o.unsent_endpoint_failure = true; /* but the endpoint's failure: its breaker hears of it */
            std::snprintf(o.error, sizeof o.error, "not sent: %s", why);
            outcomes_.push_back(o);
        } catch (...) {
            /* the lease will expire and the message be claimed again */
        }
        ep.queue.pop_front();
        queued_--;
    }
    ep.waiting_since_ms = 0;
}

void Dispatcher::push_release(int64_t id, int64_t lease_version, int64_t lease_until_us, int endpoint_tag,
                              const char *why) noexcept {
    try {
        DeliveryOutcome o;
        std::memset(&o, 0, sizeof o);
        o.id = id;
        o.lease_version = lease_version;
        o.lease_until_us = lease_until_us;
        o.verdict = Verdict::Retry;
        o.delay_ms = 0;
        o.refund = true;
        o.endpoint_tag = endpoint_tag;
        o.latency_ms = -1;
        std::snprintf(o.error, sizeof o.error, "%s", why);
        outcomes_.push_back(o);
    } catch (...) {
        /* the lease will expire and the message be claimed again */
    }
}

void Dispatcher::release_queued(const char *why) noexcept {
    for (auto &kv : endpoints_) {
        for (const ClaimedMessage &m : kv.second.queue)
            push_release(m.id, m.lease_version, m.lease_until_us, m.endpoint_tag, why);
        kv.second.queue.clear();
    }
    queued_ = 0;
}

void Dispatcher::abandon(int64_t now_unix_s, const char *why) noexcept {
    collect(now_unix_s);
    engine_.abort_all();
    token_fetches_.clear();
    for (auto &kv : endpoints_) kv.second.fetch_tag = 0;
    for (const auto &kv : sent_)
        push_release(kv.second.id, kv.second.lease_version, kv.second.lease_until_us, kv.second.endpoint_tag, why);
    sent_.clear();
    for (auto &kv : endpoints_) kv.second.in_flight = 0;
    release_queued(why);
}

} // namespace od
