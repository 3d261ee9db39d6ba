/*
 * core/http_direct.cpp — the engine's own HTTP/1.1 transport for plain
 * http:// without a proxy (see "Two transports" in http_engine.hpp).
 *
 * An exchange is one request: a pooled connection of its origin is taken
 * (newest first) and the request written with one send(); without one,
 * libcurl connects (CURLOPT_CONNECT_ONLY: its resolver, the egress filter
 * in the open-socket callback, its connect timeout and error texts) and
 * the connected socket is taken over as a duplicate descriptor, so that
 * libcurl closing its own (which it does when the connect-only handle
 * leaves the multi handle) leaves the connection open for us.  The
 * response is read by http1::ResponseParser as it arrives; a complete
 * response whose framing allows it returns the connection to the pool.
 *
 * Connections stay in the engine's epoll set while pooled (readable only
 * when the server closes them or sends something unasked: they are closed
 * then), so taking one up and putting it back costs no system call.
 *
 * Decisions made here:
 *
 *  - A pooled connection may have died unnoticed (the server's idle
 *    timeout raced our pick).  A request that fails on a reused
 *    connection before a single byte of response arrived is sent once
 *    more on a fresh connection, as libcurl does; anything else is a
 *    failure of the attempt (the message's retry policy takes over).
 *  - Failures use libcurl's codes and wording where libcurl has them, so
 *    core/outcome.cpp classifies both transports alike: a close before any
 *    byte is CURLE_GOT_NOTHING "Empty reply from server", a close inside
 *    the header section CURLE_PARTIAL_FILE "response ended inside its
 *    header section", a malformed response CURLE_WEIRD_SERVER_REPLY with
 *    the parser's reason, send/recv errors CURLE_SEND_ERROR /
 *    CURLE_RECV_ERROR with errno (local_failure for EMFILE, ENOMEM, ...),
 *    the deadline CURLE_OPERATION_TIMEDOUT.
 *  - A body past kBodyAbort ends the exchange as a response (its status
 *    stands, as with libcurl) and closes the connection.
 *  - Pooled connections idle for more than 118 s (libcurl's
 *    CURLOPT_MAXAGE_CONN default) are closed instead of reused.
 */
#include "core/http_engine_impl.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

namespace od {

using engine_detail::errno_is_local;
using engine_detail::steady_us;

namespace {

constexpr int64_t kMaxIdleUs = 118LL * 1000 * 1000;
constexpr std::size_t kUrlCacheMax = 1024;
constexpr std::size_t kSpareExchanges = 1024;
constexpr std::size_t kRecvBuffer = 16 * 1024;

bool body_sink(void *ctx, const char *data, std::size_t n) {
    auto *x = static_cast<HttpEngine::Exchange *>(ctx);
    return engine_detail::take_body_bytes(x->result, x->body_seen, x->body_overflow, x->keep_body, x->kept, data, n);
}

/* Back to "nothing received" (a new exchange, or the same one sent again). */
void clear_response(HttpEngine::Exchange *x) {
    HttpCompletion &r = x->result;
    r.status = 0;
    r.body_len = 0;
    r.retry_after[0] = '\0';
    r.retry_after_len = 0;
    x->kept.clear();
    x->body_seen = 0;
    x->body_overflow = false;
    x->parser.reset(body_sink, x);
}

} // namespace

const http1::PlainUrl *HttpEngine::plain_url(const char *url) noexcept {
    try {
        auto it = urls_.find(url);
        if (it == urls_.end()) {
            if (urls_.size() >= kUrlCacheMax) urls_.clear();
            PlainEntry e;
            e.plain = http1::parse_plain_http_url(url, e.url);
            it = urls_.emplace(url, std::move(e)).first;
        }
        return it->second.plain ? &it->second.url : nullptr;
    } catch (...) {
        return nullptr; /* out of memory: libcurl it is */
    }
}

bool HttpEngine::submit_own(uint64_t tag, const http1::PlainUrl &u, const char *url, const char *body,
                            std::size_t body_len, const std::vector<std::string> &header_lines, long timeout_ms,
                            std::size_t keep_body) noexcept {
    Exchange *x = nullptr;
    try {
        if (!spare_exchanges_.empty()) {
            x = spare_exchanges_.back();
            spare_exchanges_.pop_back();
        } else {
            x = new Exchange();
        }
        std::memset(&x->result, 0, sizeof x->result);
        x->result.tag = tag;
        x->url.assign(url);
        x->key = u.key;
        x->request.clear();
        const char *why =
            http1::write_post(x->request, u.target, u.host_header, user_agent_, header_lines, body, body_len);
        if (why) {
            last_error_ = std::string("could not write the request: ") + why;
            recycle(x);
            return false;
        }
        x->sent = 0;
        x->conn = nullptr;
        x->connecting = nullptr;
        x->start_us = steady_us();
        x->timeout_ms = timeout_ms;
        x->deadline_us = x->start_us + static_cast<int64_t>(timeout_ms) * 1000;
        x->reused = false;
        x->retried = false;
        x->keep_body = keep_body;
        clear_response(x);
        x->slot = exchanges_.size();
        exchanges_.push_back(x);
    } catch (...) {
        last_error_ = "out of memory";
        if (x) recycle(x);
        return false;
    }
    if (own_deadline_ < 0 || x->deadline_us < own_deadline_) own_deadline_ = x->deadline_us;

    if (Conn *c = take_pooled(x->key)) {
        c->ex = x;
        x->conn = c;
        x->reused = true;
        send_more(x); /* a failure here is a completion, not a failed submit */
        return true;
    }
    if (!start_connect(x)) {
        unlist(x);
        recycle(x);
        return false;
    }
    return true;
}

bool HttpEngine::start_connect(Exchange *x) noexcept {
    Transfer *t = take_transfer(x->result.tag, nullptr);
    if (!t) return false;
    t->ex = x;
    CURL *e = t->easy;
    curl_easy_setopt(e, CURLOPT_URL, x->url.c_str());
    curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
    int64_t left_us = x->deadline_us - steady_us();
    set_common_options(t, left_us <= 1000 ? 1L : static_cast<long>((left_us + 999) / 1000));
    try {
        running_.emplace(e, t);
    } catch (...) {
        last_error_ = "out of memory";
        t->ex = nullptr;
        release(t);
        return false;
    }
    CURLMcode mc = curl_multi_add_handle(multi_, e);
    if (mc != CURLM_OK) {
        running_.erase(e);
        last_error_ = std::string("curl_multi_add_handle failed: ") + curl_multi_strerror(mc);
        t->ex = nullptr;
        release(t);
        return false;
    }
    connecting_++;
    x->connecting = t;
    /* the filter that checks this connect's address is the one of now, whatever changes before it ends */
    x->connect_generation = generation_;
    return true;
}

/* libcurl finished the connect of t->ex (t is out of running_ already). */
void HttpEngine::connected(Transfer *t, int code, long os_errno) noexcept {
    Exchange *x = t->ex;
    t->ex = nullptr;
    x->connecting = nullptr;
    int fd = -1, err = 0;
    if (code == CURLE_OK) {
        curl_socket_t s = CURL_SOCKET_BAD;
        if (curl_easy_getinfo(t->easy, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK || s == CURL_SOCKET_BAD)
            err = EBADF;
        else if ((fd = ::fcntl(static_cast<int>(s), F_DUPFD_CLOEXEC, 0)) < 0)
            err = errno;
        else
            ::epoll_ctl(epfd_, EPOLL_CTL_DEL, static_cast<int>(s), nullptr); /* the duplicate must not inherit it */
    } else {
        engine_detail::describe_failure(t, static_cast<CURLcode>(code), nullptr, os_errno, x->result);
    }
    curl_multi_remove_handle(multi_, t->easy); /* closes libcurl's descriptor of a connect-only handle */
    retire_transfer(t, os_errno);
    if (code != CURLE_OK) {
        finish(x);
        return;
    }
    if (fd < 0) {
        char msg[200];
        std::snprintf(msg, sizeof msg, "could not take over the connection: %s", std::strerror(err));
        fail(x, CURLE_COULDNT_CONNECT, msg, err);
        return;
    }
    Conn *c = new (std::nothrow) Conn();
    if (c) {
        try {
            c->key = x->key;
        } catch (...) {
            delete c;
            c = nullptr;
        }
    }
    if (!c) {
        ::close(fd);
        fail(x, CURLE_OUT_OF_MEMORY, "out of memory", ENOMEM);
        return;
    }
    c->fd = fd;
    c->generation = x->connect_generation;
    c->ex = x;
    x->conn = c;
    own_opened_++;
    send_more(x);
}

/* Registers c in the epoll set for events (if that changes anything). */
bool HttpEngine::watch(Conn *c, uint32_t events) noexcept {
    if (c->events == events) return true;
    struct epoll_event ev {};
    ev.events = events;
    ev.data.u64 = engine_detail::kOwnConnBit | static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c));
    if (::epoll_ctl(epfd_, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        poll_set_failures_++;
        return false;
    }
    c->events = events;
    return true;
}

/*
 * Writes what is left of the request.  Returns true while the exchange goes
 * on on its connection; false once it ended (completed, failed or moved to
 * a fresh connection): x and its connection must not be touched then.
 */
bool HttpEngine::send_more(Exchange *x) noexcept {
    Conn *c = x->conn;
    while (x->sent < x->request.size()) {
        ssize_t n =
            ::send(c->fd, x->request.data() + x->sent, x->request.size() - x->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            x->sent += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        int err = errno;
        if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
            if (watch(c, EPOLLIN | EPOLLRDHUP | EPOLLOUT)) return true;
            err = errno;
        } else if (x->reused && !x->retried && resend_fresh(x)) {
            return false;
        }
        char msg[200];
        std::snprintf(msg, sizeof msg, "Send failure: %s", std::strerror(err));
        fail(x, CURLE_SEND_ERROR, msg, err);
        return false;
    }
    if (!watch(c, EPOLLIN | EPOLLRDHUP)) {
        int err = errno;
        char msg[200];
        std::snprintf(msg, sizeof msg, "could not wait for the response: %s", std::strerror(err));
        fail(x, CURLE_RECV_ERROR, msg, err);
        return false;
    }
    return true;
}

void HttpEngine::receive(Exchange *x) noexcept {
    Conn *c = x->conn;
    char buf[kRecvBuffer];
    for (;;) {
        ssize_t n = ::recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            switch (x->parser.feed(buf, static_cast<std::size_t>(n))) {
                case http1::ResponseParser::Result::kDone:
                    complete(x, false);
                    return;
                case http1::ResponseParser::Result::kError:
                    response_error(x, false);
                    return;
                case http1::ResponseParser::Result::kNeedMore:
                    if (static_cast<std::size_t>(n) < sizeof buf) return; /* the rest when it arrives */
                    continue;
            }
        }
        if (n == 0) {
            if (x->parser.finish() == http1::ResponseParser::Result::kDone) {
                complete(x, true);
            } else if (x->parser.received() == 0) {
                if (x->reused && !x->retried && resend_fresh(x)) return;
                fail(x, CURLE_GOT_NOTHING, "Empty reply from server", 0);
            } else {
                response_error(x, true);
            }
            return;
        }
        int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        if (x->parser.received() == 0 && x->reused && !x->retried && resend_fresh(x)) return;
        char msg[200];
        std::snprintf(msg, sizeof msg, "Recv failure: %s", std::strerror(err));
        fail(x, CURLE_RECV_ERROR, msg, err);
        return;
    }
}

/* The parser stopped with kError: at_eof, because the server closed the connection. */
void HttpEngine::response_error(Exchange *x, bool at_eof) noexcept {
    const http1::ResponseParser &p = x->parser;
    if (p.sink_stopped() && p.status() > 0) {
        complete(x, true); /* a body past kBodyAbort, cut off on purpose: the status stands */
        return;
    }
    if (!at_eof) {
        fail(x, CURLE_WEIRD_SERVER_REPLY, p.error(), 0);
        return;
    }
    fail(x, CURLE_PARTIAL_FILE, p.headers_complete() ? p.error() : "response ended inside its header section", 0);
}

void HttpEngine::complete(Exchange *x, bool at_eof) noexcept {
    const http1::ResponseParser &p = x->parser;
    HttpCompletion &r = x->result;
    r.curl_code = 0;
    r.status = p.status();
    engine_detail::set_retry_after(r, p.retry_after().data(), p.retry_after().size());
    Conn *c = x->conn;
    x->conn = nullptr;
    if (!at_eof && p.keep_alive() && x->sent == x->request.size() && c->generation == generation_)
        pool_conn(c);
    else
        close_conn(c);
    finish(x);
}

void HttpEngine::fail(Exchange *x, int code, const char *text, int err) noexcept {
    HttpCompletion &r = x->result;
    r.curl_code = code;
    r.status = 0;
    std::snprintf(r.error, sizeof r.error, "%s", text);
    r.os_errno = err;
    r.local_failure = errno_is_local(err);
    if (x->conn) {
        close_conn(x->conn);
        x->conn = nullptr;
    }
    finish(x);
}

/*
 * Sends x again on a fresh connection (its reused one died).  Always takes
 * the exchange over: when no connect can start, that is this process's
 * failure (out of memory, libcurl refusing a handle), reported as local.
 */
bool HttpEngine::resend_fresh(Exchange *x) noexcept {
    x->retried = true;
    x->reused = false;
    close_conn(x->conn);
    x->conn = nullptr;
    x->sent = 0;
    clear_response(x);
    if (!start_connect(x)) {
        char msg[200];
        std::snprintf(msg, sizeof msg, "could not open a new connection: %s", last_error_.c_str());
        fail(x, CURLE_OUT_OF_MEMORY, msg, ENOMEM);
    }
    return true;
}

void HttpEngine::finish(Exchange *x) noexcept {
    HttpCompletion &r = x->result;
    r.total_ms = static_cast<double>(steady_us() - x->start_us) / 1000.0;
    try {
        if (x->keep_body > 0) kept_bodies_[r.tag].swap(x->kept);
        done_.push_back(r);
    } catch (...) {
        /* cannot report it: the lease will expire and the message be retried */
    }
    unlist(x);
    recycle(x);
}

/* Takes x out of exchanges_ (the last one moves to its slot). */
void HttpEngine::unlist(Exchange *x) noexcept {
    exchanges_[x->slot] = exchanges_.back();
    exchanges_[x->slot]->slot = x->slot;
    exchanges_.pop_back();
    if (x->deadline_us <= own_deadline_) own_deadline_stale_ = true;
}

void HttpEngine::recycle(Exchange *x) noexcept {
    x->conn = nullptr;
    x->connecting = nullptr;
    x->kept.clear();
    if (x->request.capacity() > 64 * 1024) std::string().swap(x->request);
    if (x->kept.capacity() > 64 * 1024) std::string().swap(x->kept);
    try {
        if (spare_exchanges_.size() < kSpareExchanges) {
            spare_exchanges_.push_back(x);
            return;
        }
    } catch (...) {
    }
    delete x;
}

void HttpEngine::on_conn(Conn *c, uint32_t events) noexcept {
    Exchange *x = c->ex;
    if (x == nullptr) {
        /* pooled: the server closed it (or sent what nobody asked for) */
        auto it = pool_.find(c->key);
        if (it != pool_.end()) {
            auto &v = it->second;
            auto pos = std::find(v.begin(), v.end(), c);
            if (pos != v.end()) {
                v.erase(pos);
                pooled_--;
            }
        }
        close_conn(c);
        return;
    }
    if ((events & EPOLLOUT) && x->sent < x->request.size() && !send_more(x)) return;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) receive(x);
}

void HttpEngine::close_conn(Conn *c) noexcept {
    if (c->events) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    delete c;
}

void HttpEngine::pool_conn(Conn *c) noexcept {
    c->ex = nullptr;
    if (pooled_ >= own_pool_cap()) {
        close_conn(c);
        return;
    }
    c->idle_since_us = steady_us();
    try {
        pool_[c->key].push_back(c);
        pooled_++;
    } catch (...) {
        close_conn(c);
    }
}

HttpEngine::Conn *HttpEngine::take_pooled(const std::string &key) noexcept {
    auto it = pool_.find(key);
    if (it == pool_.end()) return nullptr;
    auto &v = it->second;
    int64_t now = steady_us();
    while (!v.empty()) {
        Conn *c = v.back();
        v.pop_back();
        pooled_--;
        if (now - c->idle_since_us > kMaxIdleUs) {
            close_conn(c);
            continue;
        }
        return c;
    }
    return nullptr;
}

/*
 * The idle connections this pool may keep: pool_budget(), half of it
 * once libcurl transfers have run too, libcurl's pool keeping the other half: together never more
 * than the caller's budget.
 */
std::size_t HttpEngine::own_pool_cap() const noexcept {
    std::size_t n = static_cast<std::size_t>(pool_budget());
    return curl_transfers_seen_ ? n / 2 : n;
}

void HttpEngine::trim_pool(std::size_t keep) noexcept {
    for (auto &kv : pool_) {
        auto &v = kv.second;
        std::size_t drop = 0;
        while (pooled_ > keep && drop < v.size()) {
            close_conn(v[drop++]); /* oldest first */
            pooled_--;
        }
        v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(drop));
    }
}

void HttpEngine::close_pooled() noexcept {
    trim_pool(0);
    pool_.clear();
}

int64_t HttpEngine::own_deadline_us() const noexcept {
    if (own_deadline_stale_) {
        own_deadline_ = -1;
        for (const Exchange *x : exchanges_)
            if (own_deadline_ < 0 || x->deadline_us < own_deadline_) own_deadline_ = x->deadline_us;
        own_deadline_stale_ = false;
    }
    return own_deadline_;
}

void HttpEngine::timed_out(Exchange *x) noexcept {
    char msg[200];
    if (x->connecting) {
        Transfer *t = x->connecting;
        x->connecting = nullptr;
        t->ex = nullptr;
        curl_multi_remove_handle(multi_, t->easy);
        running_.erase(t->easy);
        connecting_--;
        destroy(t);
        std::snprintf(msg, sizeof msg, "Connection timed out after %ld milliseconds", x->timeout_ms);
    } else {
        std::snprintf(msg, sizeof msg, "Operation timed out after %ld milliseconds with %llu bytes received",
                      x->timeout_ms, static_cast<unsigned long long>(x->parser.received()));
    }
    fail(x, CURLE_OPERATION_TIMEDOUT, msg, 0);
}

void HttpEngine::expire_own() noexcept {
    int64_t first = own_deadline_us();
    if (first < 0) return;
    int64_t now = steady_us();
    if (first > now) return;
    for (std::size_t i = 0; i < exchanges_.size();) {
        if (exchanges_[i]->deadline_us <= now)
            timed_out(exchanges_[i]); /* the last one moves to slot i */
        else
            i++;
    }
    own_deadline_stale_ = true;
}

void HttpEngine::abort_own() noexcept {
    for (Exchange *x : exchanges_) {
        if (x->conn) close_conn(x->conn);
        x->conn = nullptr;
        recycle(x);
    }
    exchanges_.clear();
    own_deadline_ = -1;
    own_deadline_stale_ = false;
}

} // namespace od
