/*
 * core/dispatcher.cpp — per-worker delivery pipeline (see dispatcher.hpp).
 */
#include "core/dispatcher.hpp"

#include <cstdio>
#include <cstring>

#include "core/request.hpp"

namespace od {

bool Dispatcher::init(const HttpEngineOptions &opts, uint64_t seed) noexcept {
    rng_.seed(seed);
    return engine_.init(opts);
}

void Dispatcher::set_settings(const DispatcherSettings &s) noexcept {
    try {
        settings_ = s;
    } catch (...) {
        /* keep the previous settings */
    }
}

void Dispatcher::begin_endpoints() noexcept { seen_.clear(); }

bool Dispatcher::add_endpoint(const EndpointConfig &e) noexcept {
    try {
        EndpointState &st = endpoints_[e.name];
        st.cfg = e;
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
            fail_now(m, "endpoint is not configured in this worker yet");
            return true;
        }
        it->second.queue.push_back(std::move(m));
        queued_++;
        return true;
    } catch (...) {
        return false;
    }
}

void Dispatcher::fail_now(const ClaimedMessage &m, const char *why) noexcept {
    try {
        DeliveryOutcome o;
        std::memset(&o, 0, sizeof o);
        o.id = m.id;
        o.lease_version = m.lease_version;
        o.verdict = m.attempts >= settings_.max_attempts ? Verdict::Dead : Verdict::Retry;
        o.delay_ms = full_jitter_ms(m.attempts, settings_.backoff, rng_());
        o.refund = false;
        o.endpoint_tag = m.endpoint_tag;
        o.latency_ms = -1;
        std::snprintf(o.error, sizeof o.error, "not sent: %s", why);
        outcomes_.push_back(o);
    } catch (...) {
        /* the lease will expire and the message be claimed again */
    }
}

void Dispatcher::pump(int64_t now_unix_s) noexcept {
    for (auto &kv : endpoints_) {
        EndpointState &ep = kv.second;
        while (!ep.queue.empty() && ep.in_flight < ep.cfg.max_in_flight) {
            ClaimedMessage &m = ep.queue.front();
            bool ok = false;
            try {
                header_buf_.clear();
                MessageHead head{m.id, m.attempts, m.event_type.c_str(), m.aggregate_type.c_str(),
                                 m.aggregate_id.c_str(), m.created_at_unix_us};
                ok = build_request_headers(head, settings_.source, ep.cfg.header_lines, m.header_lines,
                                           ep.cfg.key.empty() ? nullptr : ep.cfg.key.data(), ep.cfg.key.size(),
                                           now_unix_s, m.body.data(), m.body.size(), header_buf_);
                if (ok) {
                    uint64_t tag = next_tag_++;
                    sent_.emplace(tag, Sent{m.id, m.lease_version, m.attempts, ep.cfg.name, m.endpoint_tag});
                    ok = engine_.submit(tag, ep.cfg.url.c_str(), m.body.data(), m.body.size(), header_buf_,
                                        ep.cfg.timeout_ms);
                    if (ok)
                        ep.in_flight++;
                    else
                        sent_.erase(tag);
                }
            } catch (...) {
                ok = false;
            }
            if (!ok) fail_now(m, engine_.last_error());
            ep.queue.pop_front();
            queued_--;
        }
    }
}

void Dispatcher::collect(int64_t now_unix_s) noexcept {
    completions_.clear();
    engine_.drain(completions_);
    for (const HttpCompletion &c : completions_) {
        auto it = sent_.find(c.tag);
        if (it == sent_.end()) continue;
        const Sent &s = it->second;
        auto ep = endpoints_.find(s.endpoint);
        static const int kNoDefer = 0;
        OutcomePolicy pol{};
        if (ep != endpoints_.end()) {
            ep->second.in_flight--;
            pol.defer_statuses = ep->second.cfg.defer_statuses.empty() ? &kNoDefer : ep->second.cfg.defer_statuses.data();
            pol.n_defer_statuses = ep->second.cfg.defer_statuses.size();
        } else {
            pol.defer_statuses = &kNoDefer;
            pol.n_defer_statuses = 0;
        }
        pol.max_attempts = settings_.max_attempts;
        pol.backoff = settings_.backoff;
        pol.defer_delay_ms = settings_.defer_delay_ms;
        pol.max_retry_after_s = settings_.max_retry_after_s;

        DeliveryResult r{};
        r.transport_error = c.curl_code;
        r.transport_message = c.error[0] ? c.error : nullptr;
        r.http_status = c.status;
        r.retry_after = c.retry_after_len ? c.retry_after : nullptr;
        r.retry_after_len = c.retry_after_len;

        Outcome o = classify(r, pol, s.attempts, now_unix_s, rng_(), c.body, c.body_len);
        try {
            DeliveryOutcome d;
            d.id = s.id;
            d.lease_version = s.lease_version;
            d.verdict = o.verdict;
            d.delay_ms = o.delay_ms;
            d.refund = false;
            d.endpoint_tag = s.endpoint_tag;
            d.http_status = static_cast<int>(c.status);
            d.latency_ms = c.total_ms;
            std::memcpy(d.error, o.error, sizeof d.error);
            outcomes_.push_back(d);
        } catch (...) {
            /* the lease will expire and the message be claimed again */
        }
        sent_.erase(it);
    }
}

void Dispatcher::push_release(int64_t id, int64_t lease_version, int endpoint_tag, const char *why) noexcept {
    try {
        DeliveryOutcome o;
        std::memset(&o, 0, sizeof o);
        o.id = id;
        o.lease_version = lease_version;
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

void Dispatcher::abandon(int64_t now_unix_s, const char *why) noexcept {
    collect(now_unix_s);
    engine_.abort_all();
    for (const auto &kv : sent_) push_release(kv.second.id, kv.second.lease_version, kv.second.endpoint_tag, why);
    sent_.clear();
    for (auto &kv : endpoints_) {
        for (const ClaimedMessage &m : kv.second.queue) push_release(m.id, m.lease_version, m.endpoint_tag, why);
        kv.second.queue.clear();
        kv.second.in_flight = 0;
    }
    queued_ = 0;
}

}  // namespace od
