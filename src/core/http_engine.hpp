/*
 * core/http_engine.hpp — many HTTP POSTs in flight on one thread, over the
 * libcurl multi "socket" interface, driven by the caller's event loop.
 *
 * Pure C++ (no PostgreSQL headers).  The dispatcher worker owns the wait:
 * the engine keeps every socket libcurl asks about in an epoll set of its
 * own, updated the moment libcurl changes its interest (socket_cb), and
 * exposes that set as one descriptor, poll_fd(), readable whenever one of
 * the sockets is ready.  The worker waits on poll_fd() *and* its latch in
 * one WaitEventSet built once, for as long as timeout_ms() allows, then
 * hands readiness back (on_poll_ready()/on_timeout()).  That keeps the
 * worker responsive to commits, SIGHUP and SIGTERM while requests are in
 * flight, which curl_multi_poll() alone could not, and costs no system call
 * per socket per wait (a WaitEventSet of the sockets themselves had to be
 * rebuilt whenever one changed: epoll_create, one epoll_ctl per socket and
 * a close, about twice per request).  Code without a latch waits with
 * wait().
 *
 * Two transports.  Plain http:// without a proxy (the common case: a
 * webhook receiver or a sidecar on the same network) goes over the
 * engine's own HTTP/1.1 connections (http_direct.cpp): libcurl connects
 * (resolver, egress filter, connect timeout, error texts) and the socket is
 * then the engine's, written with one send() per request (http1::write_post)
 * and read by http1::ResponseParser; idle connections are pooled per
 * origin and stay in the epoll set.  Everything else (https, a proxy, URLs
 * with unusual forms: http1::parse_plain_http_url) is a libcurl transfer,
 * its connections kept alive in the multi handle's pool.  Both report
 * failures with libcurl's codes and texts, so the caller cannot tell them
 * apart but by cost: libcurl's request path (its printf formats headers a
 * byte at a time, it polls each reused connection before and after
 * sending) took 176,301 instructions per request against 39,355 for the
 * own one (test/bench/http_path_bench.sh).  Either pool's connections are
 * reused across submits.  Safety settings on every transfer: no redirects, http/https
 * only, no proxy but the one the transfer names (http_proxy, all_proxy, ...
 * in the environment of the postmaster are ignored: deliveries must not be
 * routed through whatever the server was started with), every connection's
 * resolved address checked against the egress filter (netfilter.hpp: with a
 * proxy, the proxy's), TLS peer and host verification, connect
 * and total timeouts, no signals, response bodies captured up to kBodyCap
 * bytes and the transfer cut off past kBodyAbort bytes (never buffered
 * whole).  A response is a response only once its header section is
 * complete: one cut off inside it is a transport error, whatever status
 * line arrived.
 *
 * Every public method is noexcept: allocation failures are caught inside and
 * reported as a failed submit or a completion with an error, so no C++
 * exception can reach a PostgreSQL frame.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/http1.hpp"
#include "core/netfilter.hpp"

namespace od {

/* Bytes of the response body kept for last_error. */
constexpr std::size_t kBodyCap = 1024;
/* Bytes of response body after which the transfer is cut off. */
constexpr std::size_t kBodyAbort = 64 * 1024;

struct HttpCompletion {
    uint64_t tag;         /* the caller's tag given to submit() */
    int curl_code;        /* CURLcode; 0 = an HTTP response was received */
    long status;          /* HTTP status, 0 if none */
    char error[256];      /* curl's error text for transport errors */
    char retry_after[64]; /* Retry-After header value, "" if none */
    std::size_t retry_after_len;
    char body[kBodyCap]; /* first bytes of the response body */
    std::size_t body_len;
    double total_ms; /* request duration */
    /*
     * The transfer failed because this process ran out of something (file
     * descriptors, memory, socket buffers), not because of the endpoint:
     * curl_code is CURLE_OUT_OF_MEMORY, or the failing socket call set
     * errno to EMFILE, ENFILE, ENOMEM or ENOBUFS.  Only set with a nonzero
     * curl_code.
     */
    bool local_failure;
    int os_errno; /* errno of the failing socket call, 0 if none */
};

/* What one transfer adds to the engine's settings (submit()); nullptr members: none. */
struct TransferOptions {
    const char *proxy = nullptr;    /* proxy URL (CURLOPT_PROXY); nullptr or "": no proxy at all */
    const char *no_proxy = nullptr; /* hosts reached directly despite the proxy (CURLOPT_NOPROXY) */
    const std::string *client_cert = nullptr; /* PEM certificate (chain) for TLS client authentication */
    const std::string *client_key = nullptr;  /* its PEM private key */
    /*
     * Keep up to this many bytes of the response body whole (more than the
     * completion's kBodyCap), for take_body(); 0: none.  Capped at kBodyAbort.
     */
    std::size_t keep_body = 0;
};

struct HttpEngineOptions {
    const char *ca_file = nullptr;                /* nullptr: the system CA store */
    long max_connections = 256;                   /* size of the keep-alive pool */
    const char *user_agent = "outbox_dispatcher"; /* User-Agent header (copied) */
    /*
     * Send plain http:// requests without a proxy over the engine's own
     * HTTP/1.1 connections (see "Two transports" above); false: everything
     * through libcurl.
     */
    bool own_http1 = true;
};

class HttpEngine {
  public:
    HttpEngine() = default;
    ~HttpEngine();
    HttpEngine(const HttpEngine &) = delete;
    HttpEngine &operator=(const HttpEngine &) = delete;

    /* Returns false (with a message in last_error()) when libcurl cannot start. */
    bool init(const HttpEngineOptions &opts) noexcept;
    const char *last_error() const noexcept { return last_error_.c_str(); }

    /*
     * Start a POST.  header_lines are complete "Name: value" lines; the body
     * is copied.  Returns false if the transfer could not be created; that
     * is always this process's own failure (out of memory, libcurl refusing
     * a handle), never the endpoint's, so callers treat it as local.
     */
    bool submit(uint64_t tag, const char *url, const char *body, std::size_t body_len,
                const std::vector<std::string> &header_lines, long timeout_ms,
                const TransferOptions *options = nullptr) noexcept;

    std::size_t in_flight() const noexcept { return running_.size() - connecting_ + exchanges_.size(); }

    /* Finished transfers waiting for drain(). */
    std::size_t completed() const noexcept { return done_.size(); }

    /*
     * A descriptor that is readable while any socket of a transfer is ready
     * for what libcurl wants of it (an epoll set, level-triggered); -1
     * before init().  It stays the same for the engine's life.
     */
    int poll_fd() const noexcept { return epfd_; }

    /* Milliseconds until the engine needs on_timeout() (0 = now); -1 = no deadline. */
    long timeout_ms() const noexcept;

    /* poll_fd() was readable: let libcurl act on every socket that is ready. */
    void on_poll_ready() noexcept;
    void on_timeout() noexcept;

    /*
     * Wait up to max_ms (less if libcurl's timer is due sooner) for a socket,
     * then act on what is ready or on the timer: the whole wait of a caller
     * that has no latch (tests, benchmarks).
     */
    void wait(long max_ms) noexcept;

    /* Move finished transfers to out (appending); returns how many. */
    std::size_t drain(std::vector<HttpCompletion> &out) noexcept;

    /*
     * The body kept for a finished transfer submitted with keep_body
     * (moved into out, once); false if there is none.  Bodies not taken are
     * dropped at the next drain().
     */
    bool take_body(uint64_t tag, std::string &out) noexcept;

    /* Abandon every transfer in flight (shutdown). */
    void abort_all() noexcept;

    /*
     * Resize the keep-alive pool (CURLMOPT_MAXCONNECTS) after init(); a
     * smaller pool closes idle connections as transfers finish.
     */
    void set_max_connections(long n) noexcept;

    /*
     * The networks connections may go to (checked on the resolved address
     * of every connection opened: core/netfilter.hpp).  A change also
     * retires the keep-alive pool: connections opened under the old lists
     * are closed as soon as nothing is in flight, and until then every new
     * transfer opens a fresh connection.
     */
    void set_address_filter(const AddressFilter &f) noexcept;

    /*
     * epoll_ctl calls that added or changed a socket in the epoll set and
     * failed, a wrong first guess (ADD of a registered number, MOD of an
     * unregistered one) included: each is a wasted system call, and one
     * that fails twice leaves a socket unwatched (its transfers fail).
     */
    uint64_t poll_set_failures() const noexcept { return poll_set_failures_; }

    /*
     * libcurl callbacks (C linkage trampolines call these); `known`: the
     * socket is in the epoll set already (libcurl's per-socket pointer is
     * set once it is added).
     */
    int socket_cb(int fd, int what, bool known) noexcept;
    int timer_cb(long timeout_ms) noexcept;

    struct Transfer; /* one easy handle and its buffers (http_engine_impl.hpp) */
    struct Conn;     /* a connection of the own transport */
    struct Exchange; /* a request of the own transport */

    /* Connections the own transport opened (each through libcurl's connect), for tests. */
    uint64_t own_connections_opened() const noexcept { return own_opened_; }

  private:
    /* libcurl's half (http_engine.cpp) */
    void collect() noexcept;
    void on_socket(int fd, int ev_bitmask) noexcept;
    void release(Transfer *t) noexcept;
    void destroy(Transfer *t) noexcept;
    void retire_transfer(Transfer *t, long os_errno) noexcept;
    bool setup_multi() noexcept;
    Transfer *take_transfer(uint64_t tag, const TransferOptions *options) noexcept;
    void set_common_options(Transfer *t, long timeout_ms) noexcept;

    /* the own transport's half (http_direct.cpp) */
    bool submit_own(uint64_t tag, const http1::PlainUrl &u, const char *url, const char *body, std::size_t body_len,
                    const std::vector<std::string> &header_lines, long timeout_ms, std::size_t keep_body) noexcept;
    bool start_connect(Exchange *x) noexcept;
    void connected(Transfer *t, int code, long os_errno) noexcept;
    bool send_more(Exchange *x) noexcept;
    void receive(Exchange *x) noexcept;
    void on_conn(Conn *c, uint32_t events) noexcept;
    bool watch(Conn *c, uint32_t events) noexcept;
    void complete(Exchange *x, bool at_eof) noexcept;
    void fail(Exchange *x, int code, const char *text, int err) noexcept;
    bool resend_fresh(Exchange *x) noexcept;
    void finish(Exchange *x) noexcept;
    void recycle(Exchange *x) noexcept;
    void unlist(Exchange *x) noexcept;
    void timed_out(Exchange *x) noexcept;
    void response_error(Exchange *x, bool at_eof) noexcept;
    void close_conn(Conn *c) noexcept;
    void pool_conn(Conn *c) noexcept;
    Conn *take_pooled(const std::string &key) noexcept;
    void close_pooled() noexcept;
    void trim_pool(std::size_t keep) noexcept;
    std::size_t own_pool_cap() const noexcept;
    /* max_connections_, or libcurl's default of 256 when it is not positive */
    long pool_budget() const noexcept { return max_connections_ > 0 ? max_connections_ : 256; }
    void apply_pool_caps() noexcept;
    void expire_own() noexcept;
    int64_t own_deadline_us() const noexcept;
    void abort_own() noexcept;
    const http1::PlainUrl *plain_url(const char *url) noexcept;

    void *multi_ = nullptr; /* CURLM * */
    std::string ca_file_;
    std::string user_agent_ = "outbox_dispatcher";
    std::string last_error_;
    std::unordered_map<void *, Transfer *> running_; /* CURL * -> transfer */
    std::vector<Transfer *> idle_;                   /* reusable easy handles */
    std::vector<HttpCompletion> done_;
    std::unordered_map<uint64_t, std::string> kept_bodies_; /* tag -> body (keep_body) */
    std::unordered_map<uint64_t, std::string> drained_bodies_; /* those of the last drain() */
    int epfd_ = -1; /* epoll set of the transfers' sockets (poll_fd()) */
    int64_t deadline_us_ = -1; /* steady clock; -1 = none */
    int still_running_ = 0;
    uint64_t poll_set_failures_ = 0;
    long max_connections_ = 256;
    AddressFilter filter_;
    bool retire_pool_ = false; /* the filter changed: the pool's connections predate it */

    bool own_http1_ = true;
    bool curl_transfers_seen_ = false; /* the two pools share max_connections_ from then on */
    std::size_t connecting_ = 0;        /* transfers in running_ that are connects for exchanges */
    std::vector<Exchange *> exchanges_; /* in flight (Exchange::slot is the index) */
    std::vector<Exchange *> spare_exchanges_;
    std::unordered_map<std::string, std::vector<Conn *>> pool_; /* idle connections by origin, newest last */
    std::size_t pooled_ = 0;
    struct PlainEntry {
        bool plain = false; /* false: left to libcurl */
        http1::PlainUrl url;
    };
    std::unordered_map<std::string, PlainEntry> urls_; /* the URLs submitted, parsed once */
    uint64_t generation_ = 0;                               /* of the address filter */
    uint64_t own_opened_ = 0;
    mutable int64_t own_deadline_ = -1; /* earliest deadline of exchanges_ on a connection; -1 none */
    mutable bool own_deadline_stale_ = false;
};

} // namespace od
