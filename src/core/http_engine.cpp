/*
 * core/http_engine.cpp — libcurl multi socket interface (see http_engine.hpp).
 *
 * Lifecycle of a transfer: submit() takes an easy handle from the idle pool
 * (or creates one), sets every option afresh, adds it to the multi handle
 * and kicks it with a socket_action timeout.  libcurl then tells us through
 * socket_cb/timer_cb what to wait for; the caller waits and calls
 * on_socket()/on_timeout(); collect() reads CURLMSG_DONE messages, fills an
 * HttpCompletion and returns the easy handle to the pool (connections live
 * in the multi handle's pool, so reuse does not depend on the easy handle).
 *
 * Decisions made here:
 *
 *  - A response cut off inside its header section is reported as
 *    CURLE_PARTIAL_FILE (curl's own code for "less arrived than announced")
 *    with status 0 and the error "response ended inside its header
 *    section".  libcurl itself returns CURLE_OK for a status line and some
 *    headers followed by a close, which would let a 200 that never finished
 *    mark a message done.  The header callback sees every header block
 *    (1xx interim responses, then the final one) and the empty line that
 *    ends each; only a block with a final status (>= 200) that ended
 *    counts.
 *
 *  - Local failures: the sockets are opened by our CURLOPT_OPENSOCKETFUNCTION
 *    so that the errno of a failing socket() (EMFILE when the worker is out
 *    of descriptors) is known for certain; CURLINFO_OS_ERRNO covers
 *    connect/send/recv.  That value is never reset by libcurl on a reused
 *    handle, so a handle that recorded one is destroyed instead of pooled:
 *    every pooled handle starts with os_errno 0 and a stale errno cannot
 *    mark a later, unrelated failure as local.
 */
#include "core/http_engine_impl.hpp"

#include "core/ascii.hpp"

#include <curl/curl.h>

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>

namespace od {

namespace {

extern "C" int od_curl_socket_cb(CURL *, curl_socket_t fd, int what, void *userp, void *socketp) {
    return static_cast<HttpEngine *>(userp)->socket_cb(static_cast<int>(fd), what, socketp != nullptr);
}

extern "C" int od_curl_timer_cb(CURLM *, long timeout_ms, void *userp) {
    return static_cast<HttpEngine *>(userp)->timer_cb(timeout_ms);
}

bool global_init_done = false;

extern "C" size_t od_curl_write_cb(char *ptr, size_t size, size_t nmemb, void *userdata) {
    auto *t = static_cast<HttpEngine::Transfer *>(userdata);
    size_t n = size * nmemb;
    if (!engine_detail::take_body_bytes(t->result, t->body_seen, t->body_overflow, t->keep_body, t->kept, ptr, n))
        return 0; /* CURLE_WRITE_ERROR: stop reading an oversized body */
    return n;
}

/* Status code of a status line "HTTP/<version> <3 digits>...", 0 if malformed. */
long status_of_line(const char *p, size_t n) {
    size_t i = 5; /* past "HTTP/" */
    while (i < n && p[i] != ' ') i++;
    while (i < n && p[i] == ' ') i++;
    if (n - i < 3) return 0;
    long v = 0;
    for (size_t k = 0; k < 3; k++) {
        if (p[i + k] < '0' || p[i + k] > '9') return 0;
        v = v * 10 + (p[i + k] - '0');
    }
    return v;
}

extern "C" size_t od_curl_header_cb(char *ptr, size_t size, size_t nitems, void *userdata) {
    auto *t = static_cast<HttpEngine::Transfer *>(userdata);
    size_t n = size * nitems;
    if (n >= 5 && std::memcmp(ptr, "HTTP/", 5) == 0) {
        /* a new header block: an interim (1xx) or the final response */
        t->block_status = status_of_line(ptr, n);
        t->in_block = true;
        return n;
    }
    if ((n == 2 && ptr[0] == '\r' && ptr[1] == '\n') || (n == 1 && ptr[0] == '\n')) {
        /* the empty line ends the block; trailers after the final one change nothing */
        if (t->in_block && t->block_status >= 200) t->headers_complete = true;
        t->in_block = false;
        return n;
    }
    static const char kName[] = "retry-after:";
    if (n > sizeof kName - 1 && ascii_istarts(ptr, n, kName)) {
        const char *v = ptr + (sizeof kName - 1);
        size_t len = n - (sizeof kName - 1);
        while (len > 0 && (v[len - 1] == '\r' || v[len - 1] == '\n')) len--;
        ascii_trim_ows(v, len);
        engine_detail::set_retry_after(t->result, v, len);
    }
    return n;
}

} // namespace

namespace engine_detail {

/*
 * libcurl's own socket() call plus three things: the address is checked
 * against the egress filter first, the errno of a failure is kept for
 * collect(), and the descriptor is close-on-exec (nothing a worker might
 * start should inherit a delivery connection).
 */
extern "C" curl_socket_t od_curl_opensocket_cb(void *clientp, curlsocktype, struct curl_sockaddr *a) {
    auto *t = static_cast<HttpEngine::Transfer *>(clientp);
    /* egress: the resolved address, whatever name led to it */
    if (t->filter && !t->filter->allows(&a->addr, a->addrlen, t->denied_why, sizeof t->denied_why)) {
        t->denied = true;
        return CURL_SOCKET_BAD;
    }
    int type = a->socktype;
#ifdef SOCK_CLOEXEC
    type |= SOCK_CLOEXEC;
#endif
    int fd = ::socket(a->family, type, a->protocol);
    if (fd < 0) {
        t->socket_errno = errno;
        return CURL_SOCKET_BAD;
    }
    return static_cast<curl_socket_t>(fd);
}

/*
 * The proxy URL may carry a password, and libcurl quotes it whole in some
 * errors ("Unsupported proxy syntax in '...'"): every occurrence becomes
 * "<proxy>".
 */
void redact(char *text, std::size_t cap, const std::string &secret) noexcept {
    if (secret.empty()) return;
    try {
        std::string s(text);
        bool changed = false;
        for (std::size_t at; (at = s.find(secret)) != std::string::npos; changed = true)
            s.replace(at, secret.size(), "<proxy>");
        if (changed) std::snprintf(text, cap, "%s", s.c_str());
    } catch (...) {
        std::snprintf(text, cap, "%s", "transport error (message withheld: it may quote the proxy URL)");
    }
}

int64_t steady_us() noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

bool take_body_bytes(HttpCompletion &r, std::size_t &seen, bool &overflow, std::size_t &keep_body, std::string &kept,
                     const char *data, std::size_t n) noexcept {
    if (r.body_len < kBodyCap) {
        std::size_t take = std::min(n, kBodyCap - r.body_len);
        std::memcpy(r.body + r.body_len, data, take);
        r.body_len += take;
    }
    if (keep_body > kept.size()) {
        try {
            kept.append(data, std::min(n, keep_body - kept.size()));
        } catch (...) {
            keep_body = 0; /* out of memory: what was kept stays, cut short (never with a gap) */
        }
    }
    seen += n;
    if (seen > kBodyAbort) {
        overflow = true;
        return false;
    }
    return true;
}

/*
 * A transfer (or an exchange's connect) that libcurl ended with code: the
 * completion's error text (the filter's refusal, ours, or libcurl's with the
 * proxy URL redacted), errno and whether the failure is this process's own.
 */
void describe_failure(HttpEngine::Transfer *t, CURLcode code, const char *why, long os_errno,
                      HttpCompletion &r) noexcept {
    r.curl_code = static_cast<int>(code);
    const char *m = why ? why : t->errbuf[0] ? t->errbuf : curl_easy_strerror(code);
    if (t->denied && code == CURLE_COULDNT_CONNECT)
        std::snprintf(r.error, sizeof r.error, "connection refused by the dispatcher: %s", t->denied_why);
    else
        std::snprintf(r.error, sizeof r.error, "%s", m);
    redact(r.error, sizeof r.error, t->proxy);
    r.status = 0; /* a partial response is a transport failure */
    long err = t->socket_errno != 0 ? t->socket_errno : os_errno;
    r.os_errno = static_cast<int>(err);
    /*
     * Only an errno says "this process": CURLE_OUT_OF_MEMORY is also what
     * libcurl reports for a response header over its 100 KB limit — the
     * endpoint's doing, charged like any transport error.  A refusal by the
     * filter is the configuration's, not a shortage.
     */
    r.local_failure = !t->denied && errno_is_local(err);
}

} // namespace engine_detail

using engine_detail::errno_is_local;
using engine_detail::redact;
using engine_detail::steady_us;

HttpEngine::~HttpEngine() {
    abort_all();
    close_pooled();
    for (Exchange *x : spare_exchanges_) delete x;
    spare_exchanges_.clear();
    for (Transfer *t : idle_) {
        curl_easy_cleanup(t->easy);
        delete t;
    }
    idle_.clear();
    if (multi_) curl_multi_cleanup(multi_);
    if (epfd_ >= 0) ::close(epfd_);
}

bool HttpEngine::init(const HttpEngineOptions &opts) noexcept {
    try {
        if (!global_init_done) {
            CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
            if (rc != CURLE_OK) {
                last_error_ = std::string("curl_global_init failed: ") + curl_easy_strerror(rc);
                return false;
            }
            global_init_done = true;
        }
        if (opts.ca_file && *opts.ca_file) ca_file_ = opts.ca_file;
        user_agent_ = opts.user_agent ? opts.user_agent : "outbox_dispatcher";
        max_connections_ = opts.max_connections;
        own_http1_ = opts.own_http1;
        if (epfd_ < 0) {
            epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
            if (epfd_ < 0) {
                last_error_ = std::string("epoll_create1 failed: ") + std::strerror(errno);
                return false;
            }
        }
        return setup_multi();
    } catch (...) {
        last_error_ = "out of memory";
        return false;
    }
}

bool HttpEngine::setup_multi() noexcept {
    multi_ = curl_multi_init();
    if (!multi_) {
        last_error_ = "curl_multi_init failed";
        return false;
    }
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, od_curl_socket_cb);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, od_curl_timer_cb);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    apply_pool_caps(); /* CURLMOPT_MAXCONNECTS */
    return true;
}

void HttpEngine::set_address_filter(const AddressFilter &f) noexcept {
    try {
        if (f == filter_) return;
        filter_ = f;
        retire_pool_ = true;
        generation_++; /* connections in use now are closed when their exchange ends */
        close_pooled();
    } catch (...) {
        /* keep the previous lists */
    }
}

bool HttpEngine::submit(uint64_t tag, const char *url, const char *body, std::size_t body_len,
                        const std::vector<std::string> &header_lines, long timeout_ms,
                        const TransferOptions *options) noexcept {
    bool fresh = false;
    if (retire_pool_) {
        if (running_.empty()) {
            /* nothing in flight: close every pooled connection with the multi handle */
            curl_multi_cleanup(multi_); /* closing a socket also takes it out of epfd_ */
            multi_ = nullptr;
            deadline_us_ = -1;
            if (!setup_multi()) return false;
            retire_pool_ = false;
        } else {
            fresh = true; /* the pool may hold connections the new lists refuse */
        }
    }
    std::size_t keep_body = options ? std::min(options->keep_body, kBodyAbort) : 0;
    if (own_http1_ && !(options && options->proxy && *options->proxy)) {
        if (const http1::PlainUrl *u = plain_url(url))
            return submit_own(tag, *u, url, body, body_len, header_lines, timeout_ms, keep_body);
    }
    if (!curl_transfers_seen_ && own_http1_) {
        curl_transfers_seen_ = true;
        apply_pool_caps();
    }
    Transfer *t = take_transfer(tag, options);
    if (!t) return false;
    try {
        t->body.assign(body, body_len);
        t->url.assign(url);
        t->keep_body = keep_body;

        curl_slist *hl = nullptr;
        for (const std::string &line : header_lines) {
            curl_slist *n = curl_slist_append(hl, line.c_str());
            if (!n) {
                curl_slist_free_all(hl);
                throw std::bad_alloc();
            }
            hl = n;
        }
        /* no "Expect: 100-continue" round trip for larger bodies */
        curl_slist *n = curl_slist_append(hl, "Expect:");
        if (!n) {
            curl_slist_free_all(hl);
            throw std::bad_alloc();
        }
        t->headers = n;

        CURL *e = t->easy;
        curl_easy_setopt(e, CURLOPT_URL, t->url.c_str());
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.data());
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
        /* "" disables proxies even when http_proxy/all_proxy/... are set in the environment */
        if (options && options->proxy && *options->proxy) {
            curl_easy_setopt(e, CURLOPT_PROXY, options->proxy);
            curl_easy_setopt(e, CURLOPT_PROXYTYPE, CURLPROXY_HTTP); /* unless the URL's scheme says otherwise */
            curl_easy_setopt(e, CURLOPT_NOPROXY, options->no_proxy ? options->no_proxy : "");
        } else {
            curl_easy_setopt(e, CURLOPT_PROXY, "");
        }
        if (options && options->client_cert && !options->client_cert->empty() && options->client_key &&
            !options->client_key->empty()) {
            /* blobs are copied by libcurl; connections are reused only for the same certificate */
            curl_blob cert{const_cast<char *>(options->client_cert->data()), options->client_cert->size(),
                           CURL_BLOB_COPY};
            curl_blob key{const_cast<char *>(options->client_key->data()), options->client_key->size(), CURL_BLOB_COPY};
            curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &cert);
            curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
            curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &key);
            curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
        }
        if (fresh) curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
        set_common_options(t, timeout_ms);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
        if (!ca_file_.empty()) {
            curl_easy_setopt(e, CURLOPT_CAINFO, ca_file_.c_str());
            curl_easy_setopt(e, CURLOPT_PROXY_CAINFO, ca_file_.c_str()); /* an https:// proxy too */
        }
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, od_curl_write_cb);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, od_curl_header_cb);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
        curl_easy_setopt(e, CURLOPT_USERAGENT, user_agent_.c_str());

        running_.emplace(e, t);
        CURLMcode mc = curl_multi_add_handle(multi_, e);
        if (mc != CURLM_OK) {
            running_.erase(e);
            last_error_ = std::string("curl_multi_add_handle failed: ") + curl_multi_strerror(mc);
            release(t);
            return false;
        }
        return true;
    } catch (...) {
        last_error_ = "out of memory";
        running_.erase(t->easy);
        release(t);
        return false;
    }
}

/* An easy handle for a transfer or a connect: pooled (reset) or new; nullptr with last_error_ set. */
HttpEngine::Transfer *HttpEngine::take_transfer(uint64_t tag, const TransferOptions *options) noexcept {
    Transfer *t = nullptr;
    try {
        if (!idle_.empty()) {
            t = idle_.back();
            idle_.pop_back();
            curl_easy_reset(t->easy);
        } else {
            t = new Transfer();
            t->easy = curl_easy_init();
            if (!t->easy) {
                delete t;
                last_error_ = "curl_easy_init failed";
                return nullptr;
            }
        }
        std::memset(&t->result, 0, sizeof t->result);
        t->result.tag = tag;
        t->errbuf[0] = '\0';
        t->body_seen = 0;
        t->body_overflow = false;
        t->block_status = 0;
        t->in_block = false;
        t->headers_complete = false;
        t->socket_errno = 0;
        t->filter = &filter_;
        t->proxy.assign(options && options->proxy ? options->proxy : "");
        t->keep_body = 0;
        t->kept.clear();
        t->denied = false;
        t->denied_why[0] = '\0';
        t->ex = nullptr;
        return t;
    } catch (...) {
        last_error_ = "out of memory";
        if (t) release(t);
        return nullptr;
    }
}

/* What every easy handle gets, transfer or connect. */
void HttpEngine::set_common_options(Transfer *t, long timeout_ms) noexcept {
    CURL *e = t->easy;
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, engine_detail::od_curl_opensocket_cb);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, t);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms, 10000L));
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
    curl_easy_setopt(e, CURLOPT_PRIVATE, t);
}

/* A finished easy handle: destroyed if it recorded an errno (its CURLINFO_OS_ERRNO would outlive this transfer), else pooled. */
void HttpEngine::retire_transfer(Transfer *t, long os_errno) noexcept {
    if (os_errno != 0)
        destroy(t);
    else
        release(t);
}

void HttpEngine::destroy(Transfer *t) noexcept {
    if (t->headers) curl_slist_free_all(t->headers);
    curl_easy_cleanup(t->easy);
    delete t;
}

void HttpEngine::release(Transfer *t) noexcept {
    if (t->headers) {
        curl_slist_free_all(t->headers);
        t->headers = nullptr;
    }
    try {
        t->body.clear();
        t->body.shrink_to_fit();
        idle_.push_back(t);
    } catch (...) {
        curl_easy_cleanup(t->easy);
        delete t;
    }
}

/*
 * libcurl says what it wants of a socket: the epoll set follows at once,
 * one epoll_ctl per change.  Level-triggered, so readiness nobody acted on
 * is reported again.  libcurl keeps a pointer per socket for us (and drops
 * it with the socket, at REMOVE): set once the socket is added, so a
 * socket libcurl has not told us about is ADDed and a known one MODified
 * without trying the other first — every pooled connection is new to
 * libcurl's socket hash each time a transfer picks it up, so guessing MOD
 * first failed once per request.  A socket libcurl closes leaves the set
 * by itself (REMOVE comes first anyway); an ADD that finds the number still
 * registered (reused) becomes a MOD, a MOD that finds none an ADD.
 */
int HttpEngine::socket_cb(int fd, int what, bool known) noexcept {
    if (what == CURL_POLL_REMOVE) {
        ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); /* ENOENT/EBADF: already gone */
        return 0;
    }
    struct epoll_event ev {};
    ev.events = ((what == CURL_POLL_IN || what == CURL_POLL_INOUT) ? EPOLLIN : 0u) |
                ((what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ? EPOLLOUT : 0u);
    ev.data.fd = fd;
    bool ok = ::epoll_ctl(epfd_, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) == 0;
    if (!ok) {
        poll_set_failures_++;
        if (errno == (known ? ENOENT : EEXIST))
            ok = ::epoll_ctl(epfd_, known ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) == 0;
        if (!ok) {
            poll_set_failures_++;
            return -1; /* libcurl fails the transfers on this socket */
        }
    }
    if (!known) curl_multi_assign(multi_, static_cast<curl_socket_t>(fd), this); /* any non-null pointer */
    return 0;
}

int HttpEngine::timer_cb(long timeout_ms) noexcept {
    deadline_us_ = timeout_ms < 0 ? -1 : steady_us() + static_cast<int64_t>(timeout_ms) * 1000;
    return 0;
}

long HttpEngine::timeout_ms() const noexcept {
    int64_t d = deadline_us_, own = own_deadline_us();
    if (own >= 0 && (d < 0 || own < d)) d = own;
    if (d < 0) return -1;
    int64_t left = d - steady_us();
    return left <= 0 ? 0 : static_cast<long>((left + 999) / 1000);
}

void HttpEngine::on_socket(int fd, int ev_bitmask) noexcept {
    curl_multi_socket_action(multi_, static_cast<curl_socket_t>(fd), ev_bitmask, &still_running_);
    collect();
}

void HttpEngine::on_poll_ready() noexcept {
    struct epoll_event evs[64];
    int n = ::epoll_wait(epfd_, evs, 64, 0);
    for (int i = 0; i < n; i++) {
        uint32_t e = evs[i].events;
        if (evs[i].data.u64 & engine_detail::kOwnConnBit) {
            on_conn(reinterpret_cast<Conn *>(static_cast<uintptr_t>(evs[i].data.u64 & ~engine_detail::kOwnConnBit)), e);
            continue;
        }
        /* a hang-up or error is read (libcurl then sees the end or the error) */
        int bits =
            ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) ? CURL_CSELECT_IN : 0) | ((e & EPOLLOUT) ? CURL_CSELECT_OUT : 0);
        on_socket(evs[i].data.fd, bits);
    }
    /* more than 64 ready: the rest stay ready (level-triggered) and are seen at the next wait */
}

void HttpEngine::wait(long max_ms) noexcept {
    if (timeout_ms() == 0) on_timeout();
    long t = timeout_ms();
    if (t < 0 || t > max_ms) t = max_ms;
    struct pollfd p {
        epfd_, POLLIN, 0
    };
    if (::poll(&p, 1, static_cast<int>(t)) > 0)
        on_poll_ready();
    else if (timeout_ms() == 0)
        on_timeout();
}

void HttpEngine::on_timeout() noexcept {
    if (deadline_us_ >= 0 && deadline_us_ <= steady_us()) {
        deadline_us_ = -1;
        curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &still_running_);
        collect();
    }
    expire_own();
}

void HttpEngine::collect() noexcept {
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(multi_, &left)) != nullptr) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL *e = msg->easy_handle;
        auto it = running_.find(e);
        if (it == running_.end()) continue;
        Transfer *t = it->second;
        CURLcode code = msg->data.result;
        if (t->ex) {
            /* the connect of an exchange of the own transport */
            long os_errno = 0;
            curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &os_errno);
            running_.erase(it);
            connecting_--;
            connected(t, code, os_errno);
            continue;
        }
        HttpCompletion &r = t->result;
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        double total = 0;
        curl_easy_getinfo(e, CURLINFO_TOTAL_TIME, &total);
        r.total_ms = total * 1000.0;
        r.status = status;
        long os_errno = 0;
        curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &os_errno);
        const char *why = nullptr;
        if (code == CURLE_WRITE_ERROR && t->body_overflow && status > 0)
            code = CURLE_OK; /* we cut off an oversized body on purpose */
        if (code == CURLE_OK && !t->headers_complete) {
            code = CURLE_PARTIAL_FILE; /* libcurl said OK, but no final response ever completed */
            why = "response ended inside its header section";
        }
        r.curl_code = static_cast<int>(code);
        if (code != CURLE_OK) engine_detail::describe_failure(t, code, why, os_errno, r);
        curl_multi_remove_handle(multi_, e);
        running_.erase(it);
        try {
            if (t->keep_body > 0) kept_bodies_[r.tag].swap(t->kept);
            done_.push_back(r);
        } catch (...) {
            /* cannot report it: the lease will expire and the message be retried */
        }
        retire_transfer(t, os_errno);
    }
}

std::size_t HttpEngine::drain(std::vector<HttpCompletion> &out) noexcept {
    std::size_t n = done_.size();
    try {
        out.insert(out.end(), done_.begin(), done_.end());
    } catch (...) {
        return 0;
    }
    done_.clear();
    drained_bodies_.clear();
    drained_bodies_.swap(kept_bodies_);
    return n;
}

bool HttpEngine::take_body(uint64_t tag, std::string &out) noexcept {
    auto it = drained_bodies_.find(tag);
    if (it == drained_bodies_.end()) return false;
    out.swap(it->second);
    drained_bodies_.erase(it);
    return true;
}

void HttpEngine::abort_all() noexcept {
    for (auto &kv : running_) {
        curl_multi_remove_handle(multi_, kv.first);
        destroy(kv.second); /* a connect's exchange is dropped by abort_own() */
    }
    running_.clear();
    connecting_ = 0;
    abort_own();
}

void HttpEngine::set_max_connections(long n) noexcept {
    max_connections_ = n;
    apply_pool_caps();
}

/* libcurl's pool gets what the own one does not (own_pool_cap()). */
void HttpEngine::apply_pool_caps() noexcept {
    std::size_t own = own_pool_cap();
    long curl = curl_transfers_seen_ ? pool_budget() - static_cast<long>(own) : max_connections_;
    if (multi_) curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, curl);
    trim_pool(own);
}

} // namespace od
