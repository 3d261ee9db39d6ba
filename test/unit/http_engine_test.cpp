// Unit tests for src/core/http_engine.cpp and src/core/dispatcher.cpp
// against a small HTTP/1.1 server on loopback, run in a thread of the test.
// The engine is driven the way the worker drives it: a wait on its poll
// descriptor (wait(): poll() on poll_fd(), then on_poll_ready() or
// on_timeout()), drain().
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dispatcher.hpp"
#include "core/http_engine.hpp"
#include "core/outcome.hpp"

namespace {

// A tiny keep-alive HTTP server: the response depends on the request path
// (the query is ignored; an absolute-form target "http://host/path", as
// sent to a proxy, is routed by its path, so the server can stand in for a
// proxy that would forward and answer).
class LoopbackServer {
  public:
    // backlog 0 and accepting false: connects beyond the first ones stay pending until start_accepting()
    explicit LoopbackServer(int backlog = 64, bool accepting = true) : accepting_(accepting) {
        listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = 0;
        ::bind(listen_fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
        ::listen(listen_fd_, backlog);
        socklen_t len = sizeof addr;
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&addr), &len);
        port_ = ntohs(addr.sin_port);
        accept_thread_ = std::thread([this] { accept_loop(); });
    }
    ~LoopbackServer() {
        stop_ = true;
        ::shutdown(listen_fd_, SHUT_RDWR);
        ::close(listen_fd_);
        accept_thread_.join();
        std::lock_guard<std::mutex> g(mu_);
        for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
        for (auto &t : workers_) t.join();
    }
    std::string url(const std::string &path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
    void start_accepting() { accepting_ = true; }
    int port() const { return port_; }
    int connections() const { return accepted_.load(); }
    int open_connections() const { return open_.load(); } // accepted, not yet closed
    int max_concurrent() const { return max_active_.load(); }
    std::vector<std::string> requests() {
        std::lock_guard<std::mutex> g(mu_);
        return requests_;
    }

  private:
    void accept_loop() {
        while (!stop_) {
            if (!accepting_) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                continue;
            }
            int fd = ::accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) return;
            accepted_++;
            open_++;
            std::lock_guard<std::mutex> g(mu_);
            conns_.push_back(fd);
            workers_.emplace_back([this, fd] { serve(fd); });
        }
    }
    void serve(int fd) {
        struct Closed {
            std::atomic<int> &n;
            ~Closed() { --n; }
        } closed{open_};
        std::string buf;
        char tmp[4096];
        for (;;) {
            size_t hdr_end;
            while ((hdr_end = buf.find("\r\n\r\n")) == std::string::npos) {
                ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
                if (n <= 0) {
                    ::close(fd);
                    return;
                }
                buf.append(tmp, static_cast<size_t>(n));
            }
            std::string head = buf.substr(0, hdr_end);
            size_t clen = 0;
            size_t p = head.find("Content-Length: ");
            if (p != std::string::npos) clen = std::stoul(head.substr(p + 16));
            while (buf.size() < hdr_end + 4 + clen) {
                ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
                if (n <= 0) {
                    ::close(fd);
                    return;
                }
                buf.append(tmp, static_cast<size_t>(n));
            }
            std::string request = buf.substr(0, hdr_end + 4 + clen);
            buf.erase(0, hdr_end + 4 + clen);
            {
                std::lock_guard<std::mutex> g(mu_);
                requests_.push_back(request);
            }
            std::string path = head.substr(head.find(' ') + 1);
            path = path.substr(0, path.find(' '));
            if (path.rfind("http://", 0) == 0) {
                size_t slash = path.find('/', 7);
                path = slash == std::string::npos ? "/" : path.substr(slash);
            }
            path = path.substr(0, path.find('?'));
            int now_active = ++active_;
            for (int m = max_active_.load(); now_active > m && !max_active_.compare_exchange_weak(m, now_active);) {
            }
            struct Leave {
                std::atomic<int> &a;
                ~Leave() { --a; }
            } leave{active_};
            std::string resp;
            if (path == "/huge-header") {
                // a 150 KB response header: libcurl gives up with CURLE_OUT_OF_MEMORY
                const std::string h =
                    "HTTP/1.1 200 OK\r\nX-Big: " + std::string(150 * 1024, 'a') + "\r\nContent-Length: 2\r\n\r\n{}";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                ::close(fd);
                return;
            } else if (path == "/cut-headers") {
                // a status line and one header, then the connection closes
                const std::string h = "HTTP/1.1 200 OK\r\nX-A: b\r\n";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                ::close(fd);
                return;
            } else if (path == "/hints-only") {
                // a complete 103 block, then the connection closes before the final response
                const std::string h = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                ::close(fd);
                return;
            } else if (path == "/hints-then-cut") {
                // a complete 103 block, then a final status line and a header, then the close
                const std::string h = "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nX-A: b\r\n";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                ::close(fd);
                return;
            } else if (path == "/early-hints") {
                resp = "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
            } else if (path == "/continue") {
                resp = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
            } else if (path == "/no-content") {
                resp = "HTTP/1.1 204 No Content\r\n\r\n";
            } else if (path == "/chunked-trailer") {
                resp =
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n"
                    "2\r\nok\r\n0\r\nX-T: 1\r\n\r\n";
            } else if (path == "/until-close") {
                // HTTP/1.0, no Content-Length: the body runs to the close
                const std::string h = "HTTP/1.0 200 OK\r\n\r\nbody";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                ::close(fd);
                return;
            } else if (path == "/then-idle-close") {
                // a keep-alive answer, then the server drops the idle connection (its idle timeout)
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                ::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL);
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                ::close(fd);
                return;
            } else if (path == "/slowish") {
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            } else if (path == "/token") {
                // an OAuth token answer larger than the completion's body capture
                const std::string b = "{\"access_token\":\"" + std::string(3000, 't') +
                                      "\",\"token_type\":\"Bearer\",\"expires_in\":3600}";
                resp =
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(b.size()) +
                    "\r\n\r\n" + b;
            } else if (path == "/unauthorized") {
                resp = "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n";
            } else if (path == "/ok") {
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            } else if (path == "/busy") {
                resp = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy";
            } else if (path == "/busy-padded") {
                // any letter case, white space around the value, longer than a completion holds
                resp = "HTTP/1.1 429 Too Many Requests\r\nretry-AFTER: \t Wed, 21 Oct 2026 07:28:00 GMT" +
                       std::string(60, 'x') + " \t\r\nContent-Length: 0\r\n\r\n";
            } else if (path == "/redirect") {
                resp = "HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n";
            } else if (path == "/slow") {
                std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            } else if (path == "/huge") {
                const size_t n = 4 * 1024 * 1024;
                std::string h =
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                std::string chunk(64 * 1024, 'x');
                for (size_t sent = 0; sent < n; sent += chunk.size())
                    if (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) <= 0) break;
                ::close(fd);
                return;
            } else {
                resp = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
            }
            if (::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL) <= 0) {
                ::close(fd);
                return;
            }
        }
    }

    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<bool> accepting_{true};
    std::atomic<int> accepted_{0};
    std::atomic<int> open_{0};
    std::atomic<int> active_{0}; // requests being answered right now
    std::atomic<int> max_active_{0};
    std::thread accept_thread_;
    std::mutex mu_;
    std::vector<int> conns_;
    std::vector<std::thread> workers_;
    std::vector<std::string> requests_;
};

// Drive the engine until n completions arrived or the deadline passed.
std::vector<od::HttpCompletion> run_until(od::HttpEngine &e, size_t n, int max_ms = 10000) {
    std::vector<od::HttpCompletion> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_ms);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        e.drain(out);
        if (out.size() >= n) break;
        e.wait(50);
        e.drain(out);
    }
    return out;
}

// Every engine test runs twice: plain http:// over the engine's own
// HTTP/1.1 connections (the default) and everything through libcurl.
class HttpEngineTest : public ::testing::TestWithParam<bool> {
  protected:
    void SetUp() override {
        od::HttpEngineOptions opts;
        opts.own_http1 = GetParam();
        ASSERT_TRUE(engine.init(opts)) << engine.last_error();
    }
    LoopbackServer server;
    od::HttpEngine engine;
};

INSTANTIATE_TEST_SUITE_P(Transports, HttpEngineTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) { return i.param ? "own" : "libcurl"; });

TEST_P(HttpEngineTest, PostsBodyAndHeaders) {
    std::vector<std::string> headers = {"Content-Type: application/json", "Idempotency-Key: 42"};
    const std::string body = R"({"a": 1})";
    ASSERT_TRUE(engine.submit(7, server.url("/ok").c_str(), body.data(), body.size(), headers, 5000));
    EXPECT_EQ(engine.in_flight(), 1u);
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].tag, 7u);
    EXPECT_EQ(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 200);
    EXPECT_EQ(std::string(done[0].body, done[0].body_len), "ok");
    EXPECT_EQ(engine.in_flight(), 0u);
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_EQ(reqs[0].rfind("POST /ok HTTP/1.1\r\n", 0), 0u);
    EXPECT_NE(reqs[0].find("Idempotency-Key: 42\r\n"), std::string::npos);
    EXPECT_EQ(reqs[0].find("Expect:"), std::string::npos);
    EXPECT_EQ(reqs[0].substr(reqs[0].size() - body.size()), body);
}

TEST_P(HttpEngineTest, ManyConcurrentRequestsReuseConnections) {
    const int n = 50;
    std::vector<std::string> headers = {"Content-Type: application/json"};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++)
            ASSERT_TRUE(
                engine.submit(static_cast<uint64_t>(round * n + i), server.url("/ok").c_str(), "{}", 2, headers, 5000));
        auto done = run_until(engine, n);
        ASSERT_EQ(done.size(), static_cast<size_t>(n));
        for (const auto &c : done) EXPECT_EQ(c.status, 200);
    }
    // 150 requests in three waves of 50: connections are kept alive and reused.
    EXPECT_LE(server.connections(), n);
    EXPECT_EQ(server.requests().size(), 150u);
    // A pooled connection is a new socket to libcurl each time a transfer
    // picks it up: it is added to the epoll set, not modified first in vain.
    EXPECT_EQ(engine.poll_set_failures(), 0u);
}

// A pooled connection the server closed while idle must not keep the poll
// descriptor readable (the worker would spin on it): libcurl's pool is not
// in the set at all; the own transport's is, and the first on_poll_ready()
// closes what ended.  The next request replaces that connection.
TEST_P(HttpEngineTest, PollDescriptorIgnoresIdlePooledConnections) {
    const int fd = engine.poll_fd();
    ASSERT_GE(fd, 0);
    std::vector<std::string> headers;
    for (int i = 0; i < 3; i++)
        ASSERT_TRUE(
            engine.submit(static_cast<uint64_t>(i), server.url("/then-idle-close").c_str(), "{}", 2, headers, 5000));
    auto done = run_until(engine, 3);
    ASSERT_EQ(done.size(), 3u);
    for (const auto &c : done) EXPECT_EQ(c.status, 200);
    // the server closes the three idle connections 100 ms after answering
    for (int i = 0; i < 100 && server.open_connections() > 0; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(server.open_connections(), 0);
    pollfd p{fd, POLLIN, 0};
    if (GetParam()) {
        EXPECT_EQ(::poll(&p, 1, 1000), 1) << "the own pool did not see its connections end";
        engine.on_poll_ready();
    }
    EXPECT_EQ(::poll(&p, 1, 50), 0) << "an idle connection's end keeps the poll descriptor readable";
    EXPECT_EQ(engine.timeout_ms(), -1); // nothing to do, no timer either
    ASSERT_TRUE(engine.submit(9, server.url("/ok").c_str(), "{}", 2, headers, 5000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 200);
    EXPECT_EQ(engine.poll_fd(), fd); // one descriptor for the engine's life
}

TEST_P(HttpEngineTest, CapturesRetryAfterAndDoesNotFollowRedirects) {
    std::vector<std::string> headers;
    ASSERT_TRUE(engine.submit(1, server.url("/busy").c_str(), "{}", 2, headers, 5000));
    ASSERT_TRUE(engine.submit(2, server.url("/redirect").c_str(), "{}", 2, headers, 5000));
    ASSERT_TRUE(engine.submit(3, server.url("/busy-padded").c_str(), "{}", 2, headers, 5000));
    auto done = run_until(engine, 3);
    ASSERT_EQ(done.size(), 3u);
    for (const auto &c : done) {
        if (c.tag == 1) {
            EXPECT_EQ(c.status, 503);
            EXPECT_EQ(std::string(c.retry_after, c.retry_after_len), "7");
        } else if (c.tag == 3) {
            EXPECT_EQ(c.status, 429);
            const std::string v = "Wed, 21 Oct 2026 07:28:00 GMT" + std::string(60, 'x');
            EXPECT_EQ(std::string(c.retry_after, c.retry_after_len), v.substr(0, sizeof c.retry_after - 1));
            EXPECT_EQ(std::strlen(c.retry_after), c.retry_after_len);
        } else {
            EXPECT_EQ(c.status, 302); // reported, not followed
        }
    }
    EXPECT_EQ(server.requests().size(), 3u); // no request to /ok
}

TEST_P(HttpEngineTest, TimeoutIsATransportError) {
    std::vector<std::string> headers;
    ASSERT_TRUE(engine.submit(1, server.url("/slow").c_str(), "{}", 2, headers, 300));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_EQ(done[0].curl_code, 28); // CURLE_OPERATION_TIMEDOUT
    EXPECT_NE(std::string(done[0].error).find("timed out"), std::string::npos) << done[0].error;
}

TEST_P(HttpEngineTest, ConnectionRefused) {
    // bind a port, then close it: nothing listens there
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
    int port = ntohs(addr.sin_port);
    ::close(fd);
    std::string url = "http://127.0.0.1:" + std::to_string(port) + "/x";
    ASSERT_TRUE(engine.submit(1, url.c_str(), "{}", 2, {}, 2000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_NE(done[0].curl_code, 0);
}

TEST_P(HttpEngineTest, EgressFilterChecksTheResolvedAddressAndRetiresThePool) {
    std::string url = server.url("/ok");
    ASSERT_TRUE(engine.submit(1, url.c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 200);
    int before = server.connections();

    od::AddressFilter deny;
    ASSERT_EQ(od::parse_networks("127.0.0.0/8, ::1", deny.denied), nullptr);
    engine.set_address_filter(deny);
    // the pooled connection is not reused: it was opened under the old lists
    ASSERT_TRUE(engine.submit(2, url.c_str(), "{}", 2, {}, 5000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_FALSE(done[0].local_failure);
    EXPECT_NE(std::string(done[0].error)
                  .find("connection refused by the dispatcher: 127.0.0.1 is in "
                        "outbox_dispatcher.denied_networks"),
              std::string::npos)
        << done[0].error;
    EXPECT_EQ(server.connections(), before); // nothing reached the server

    od::AddressFilter only_elsewhere;
    ASSERT_EQ(od::parse_networks("10.0.0.0/8", only_elsewhere.allowed), nullptr);
    engine.set_address_filter(only_elsewhere);
    ASSERT_TRUE(engine.submit(3, url.c_str(), "{}", 2, {}, 5000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_NE(std::string(done[0].error).find("is not in outbox_dispatcher.allowed_networks"), std::string::npos);

    engine.set_address_filter(od::AddressFilter{});
    ASSERT_TRUE(engine.submit(4, url.c_str(), "{}", 2, {}, 5000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 200);
}

TEST_P(HttpEngineTest, ProxyUrlNeverReachesTheErrorText) {
    // a proxy URL libcurl cannot use is quoted whole in its error: the engine replaces it
    const std::string proxy = "http://user:hunter2@[::1";
    od::TransferOptions opts;
    opts.proxy = proxy.c_str();
    ASSERT_TRUE(engine.submit(1, server.url("/ok").c_str(), "{}", 2, {}, 2000, &opts));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(std::string(done[0].error).find("hunter2"), std::string::npos) << done[0].error;
    // and a usable one routes the request: the loopback server answers as the proxy
    const std::string via = server.url("");
    opts.proxy = via.c_str();
    ASSERT_TRUE(engine.submit(2, "http://target.invalid/ok", "{}", 2, {}, 2000, &opts));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 200);
    auto reqs = server.requests();
    ASSERT_FALSE(reqs.empty());
    EXPECT_EQ(reqs.back().rfind("POST http://target.invalid/ok HTTP/1.1\r\n", 0), 0u) << reqs.back().substr(0, 80);
}

TEST_P(HttpEngineTest, HugeBodyIsCappedNotBuffered) {
    ASSERT_TRUE(engine.submit(1, server.url("/huge").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].curl_code, 0); // cut off on purpose, still a response
    EXPECT_EQ(done[0].status, 500);
    EXPECT_EQ(done[0].body_len, od::kBodyCap);
}

// A pooled connection the server has closed, picked before anyone noticed:
// the request is sent once more on a fresh connection, not failed.
TEST_P(HttpEngineTest, AReusedConnectionThatDiedIsSentAgainOnAFreshOne) {
    ASSERT_TRUE(engine.submit(1, server.url("/then-idle-close").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 200);
    for (int i = 0; i < 100 && server.open_connections() > 0; i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(server.open_connections(), 0); // closed by the server, not yet seen by the engine
    ASSERT_TRUE(engine.submit(2, server.url("/ok").c_str(), "{}", 2, {}, 5000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].curl_code, 0) << done[0].error;
    EXPECT_EQ(done[0].status, 200);
    EXPECT_EQ(server.connections(), 2);
    EXPECT_EQ(engine.own_connections_opened(), GetParam() ? 2u : 0u);
}

// A response that ends the connection (Connection: close, HTTP/1.0, a body
// delimited by the close) is complete, and the next request opens anew.
TEST_P(HttpEngineTest, AResponseDelimitedByTheCloseIsCompleteAndNotReused) {
    for (uint64_t tag = 1; tag <= 2; tag++) {
        ASSERT_TRUE(engine.submit(tag, server.url("/until-close").c_str(), "{}", 2, {}, 5000));
        auto done = run_until(engine, 1);
        ASSERT_EQ(done.size(), 1u);
        EXPECT_EQ(done[0].curl_code, 0) << done[0].error;
        EXPECT_EQ(done[0].status, 200);
        EXPECT_EQ(std::string(done[0].body, done[0].body_len), "body");
    }
    EXPECT_EQ(server.connections(), 2);
}

// A connect whose address was checked under the old egress lists, ending
// after they changed: its connection serves that one request and is not
// kept (the next request connects anew, under the new lists, and is refused).
TEST_P(HttpEngineTest, AConnectPendingAcrossAFilterChangeIsNotPooled) {
    LoopbackServer slow(0, false);
    std::vector<int> fillers; // fill the accept queue: the engine's connect then waits
    for (int i = 0; i < 2; i++) {
        int f = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(slow.port()));
        ::connect(f, reinterpret_cast<sockaddr *>(&a), sizeof a);
        fillers.push_back(f);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string url = slow.url("/ok");
    ASSERT_TRUE(engine.submit(1, url.c_str(), "{}", 2, {}, 8000));
    for (int i = 0; i < 5; i++) engine.wait(10); // the socket is opened (and its address allowed) now
    ASSERT_EQ(slow.connections(), 0) << "the connect was not held back";
    od::AddressFilter deny;
    ASSERT_EQ(od::parse_networks("127.0.0.0/8", deny.denied), nullptr);
    engine.set_address_filter(deny);
    for (int f : fillers) ::close(f);
    slow.start_accepting();
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    ASSERT_TRUE(engine.submit(2, url.c_str(), "{}", 2, {}, 3000));
    done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0) << "a request under the new lists reached a denied address over a kept connection";
    EXPECT_NE(std::string(done[0].error).find("refused by the dispatcher"), std::string::npos) << done[0].error;
}

// The two transports put the same request on the wire (header order aside).
TEST(HttpEngineTransports, SendTheSameRequest) {
    LoopbackServer server;
    const std::vector<std::string> headers = {"Content-Type: application/json", "webhook-id: m-1",
                                              "Authorization: Bearer abc", "Accept:", "X-Empty: "};
    const std::string body = R"({"n":1})";
    for (bool own : {true, false}) {
        od::HttpEngine e;
        od::HttpEngineOptions opts;
        opts.own_http1 = own;
        opts.user_agent = "agent/1";
        ASSERT_TRUE(e.init(opts));
        ASSERT_TRUE(e.submit(1, server.url("/ok?x=1").c_str(), body.data(), body.size(), headers, 5000));
        auto done = run_until(e, 1);
        ASSERT_EQ(done.size(), 1u);
        EXPECT_EQ(done[0].status, 200);
        EXPECT_EQ(e.own_connections_opened(), own ? 1u : 0u);
    }
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 2u);
    auto lines = [](const std::string &r) {
        std::vector<std::string> v;
        size_t head_end = r.find("\r\n\r\n");
        for (size_t at = 0; at < head_end;) {
            size_t eol = r.find("\r\n", at);
            v.push_back(r.substr(at, eol - at));
            at = eol + 2;
        }
        std::sort(v.begin() + 1, v.end());
        v.push_back(r.substr(head_end + 4));
        return v;
    };
    EXPECT_EQ(lines(reqs[0]), lines(reqs[1])) << reqs[0] << "\n----\n" << reqs[1];
}

TEST_P(HttpEngineTest, OnlyHttpAndHttps) {
    ASSERT_TRUE(engine.submit(1, "file:///etc/passwd", "{}", 2, {}, 2000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 0);
}

TEST(Dispatcher, ClassifiesOutcomes) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 42));
    od::DispatcherSettings s;
    s.wire.source = "/test";
    s.max_attempts = 3;
    d.set_settings(s);
    od::EndpointConfig ok;
    ok.name = "ok";
    ok.url = server.url("/ok");
    ok.timeout_ms = 5000;
    od::EndpointConfig busy = ok;
    busy.name = "busy";
    busy.url = server.url("/busy");
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ok));
    ASSERT_TRUE(d.add_endpoint(busy));
    d.end_endpoints();

    for (int i = 1; i <= 5; i++) {
        od::ClaimedMessage m;
        m.id = i;
        m.lease_version = 1;
        m.attempts = 1;
        m.endpoint = (i == 5) ? "busy" : "ok";
        m.event_type = "E";
        m.aggregate_type = "a";
        m.aggregate_id = std::to_string(i);
        m.body = "{}";
        ASSERT_TRUE(d.add(std::move(m)));
    }
    od::ClaimedMessage unknown;
    unknown.id = 6;
    unknown.lease_version = 1;
    unknown.attempts = 1;
    unknown.endpoint = "nope";
    ASSERT_TRUE(d.add(std::move(unknown)));

    d.pump(1700000000);
    EXPECT_EQ(d.in_flight(), 5u); // 4 for "ok", 1 for "busy"; "nope" failed at once
    EXPECT_EQ(d.queued(), 0u);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (d.outcomes().size() < 6 && std::chrono::steady_clock::now() < deadline) {
        d.engine().wait(20);
        d.collect(1700000000);
        d.pump(1700000000);
    }
    ASSERT_EQ(d.outcomes().size(), 6u);
    std::map<int64_t, od::DeliveryOutcome> by_id;
    for (const auto &o : d.outcomes()) by_id[o.id] = o;
    for (int i = 1; i <= 4; i++) {
        EXPECT_EQ(by_id[i].verdict, od::Verdict::Done) << i;
        EXPECT_EQ(by_id[i].http_status, 200);
        EXPECT_TRUE(by_id[i].counts_for_endpoint()) << i;
    }
    EXPECT_EQ(by_id[5].verdict, od::Verdict::Retry);
    EXPECT_GE(by_id[5].delay_ms, 7000); // never sooner than Retry-After: 7
    EXPECT_EQ(by_id[5].http_status, 503);
    EXPECT_EQ(by_id[6].verdict, od::Verdict::Retry); // unknown endpoint: not sent, retried
    EXPECT_EQ(by_id[6].latency_ms, -1);

    // what the attempt log records: the attempt sent, when it started, the raw answer
    const int64_t now_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    for (int i = 1; i <= 5; i++) {
        EXPECT_EQ(by_id[i].attempts, 1) << i;
        EXPECT_GT(by_id[i].started_unix_us, now_us - 60 * INT64_C(1000000)) << i;
        EXPECT_LE(by_id[i].started_unix_us, now_us) << i;
        EXPECT_EQ(by_id[i].transport_error, 0) << i;
    }
    EXPECT_EQ(std::string(by_id[5].retry_after), "7");
    EXPECT_EQ(by_id[1].retry_after[0], '\0');
    EXPECT_EQ(std::string(by_id[5].body, by_id[5].body_len), "busy");
    EXPECT_EQ(std::string(by_id[1].body, by_id[1].body_len), "ok");
    EXPECT_EQ(by_id[6].started_unix_us, 0); // never sent: nothing to log

    // each request carried the contract headers
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 5u);
    for (const auto &r : reqs) {
        EXPECT_NE(r.find("ce-source: /test\r\n"), std::string::npos);
        EXPECT_NE(r.find("X-Outbox-Attempt: 1\r\n"), std::string::npos);
    }
}

TEST(Dispatcher, AbandonReleasesQueuedAndInFlight) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 1));
    od::DispatcherSettings s;
    s.max_transfers = 1; // one in flight, two queued
    d.set_settings(s);
    od::EndpointConfig slow;
    slow.name = "slow";
    slow.url = server.url("/slow");
    slow.timeout_ms = 5000;
    d.begin_endpoints();
    d.add_endpoint(slow);
    d.end_endpoints();
    for (int i = 1; i <= 3; i++) {
        od::ClaimedMessage m;
        m.id = i;
        m.lease_version = 4;
        m.attempts = 2;
        m.endpoint = "slow";
        m.event_type = "E";
        m.aggregate_type = "a";
        m.aggregate_id = "1";
        m.body = "{}";
        d.add(std::move(m));
    }
    d.pump(0);
    EXPECT_EQ(d.in_flight(), 1u);
    d.abandon(1700000000, "stopping");
    EXPECT_EQ(d.outstanding(), 0u);
    ASSERT_EQ(d.outcomes().size(), 3u);
    for (const auto &o : d.outcomes()) {
        EXPECT_EQ(o.verdict, od::Verdict::Retry);
        EXPECT_TRUE(o.refund);
        EXPECT_EQ(o.delay_ms, 0);
        EXPECT_EQ(o.lease_version, 4);
    }
}

// ------------------------------------------------------------ no proxies

// Sets the proxy variables libcurl reads for the lifetime of the object,
// clearing no_proxy so that loopback is not exempt, and puts every one of
// them back afterwards.
class ProxyEnvironment {
  public:
    explicit ProxyEnvironment(const std::string &proxy_url) {
        for (const char *name : kNames) {
            const char *v = std::getenv(name);
            saved_.emplace_back(name, v != nullptr, v ? v : "");
        }
        for (const char *name : {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"})
            ::setenv(name, proxy_url.c_str(), 1);
        ::unsetenv("no_proxy");
        ::unsetenv("NO_PROXY");
    }
    ~ProxyEnvironment() {
        for (const auto &v : saved_) {
            if (std::get<1>(v))
                ::setenv(std::get<0>(v), std::get<2>(v).c_str(), 1);
            else
                ::unsetenv(std::get<0>(v));
        }
    }

  private:
    static constexpr const char *kNames[] = {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                                             "all_proxy",  "ALL_PROXY",  "no_proxy",    "NO_PROXY"};
    std::vector<std::tuple<const char *, bool, std::string>> saved_;
};

TEST_P(HttpEngineTest, EnvironmentProxiesAreIgnored) {
    LoopbackServer proxy; // would forward and answer 200 if it were used
    ProxyEnvironment env(proxy.url(""));
    ASSERT_TRUE(engine.submit(1, server.url("/ok").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].curl_code, 0) << done[0].error;
    EXPECT_EQ(done[0].status, 200);
    EXPECT_EQ(server.requests().size(), 1u); // reached the real server ...
    EXPECT_EQ(proxy.connections(), 0);       // ... and nothing else
}

// --------------------------------------------------- incomplete header section

TEST_P(HttpEngineTest, ResponseCutInsideHeadersIsATransportError) {
    ASSERT_TRUE(engine.submit(1, server.url("/cut-headers").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].curl_code, CURLE_PARTIAL_FILE);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_STREQ(done[0].error, "response ended inside its header section");
    EXPECT_FALSE(done[0].local_failure);

    // and the outcome table makes it a Retry, never a Done
    od::DeliveryResult r{};
    r.transport_error = done[0].curl_code;
    r.transport_message = done[0].error;
    r.http_status = done[0].status;
    od::OutcomePolicy p{};
    p.max_attempts = 12;
    p.backoff = od::BackoffPolicy{1000, 60000};
    od::Outcome o = od::classify(r, p, 1, 1700000000, 0, done[0].body, done[0].body_len);
    EXPECT_EQ(o.verdict, od::Verdict::Retry);
    EXPECT_FALSE(o.local_failure);
    EXPECT_STREQ(o.error, "transport error (curl 18): response ended inside its header section");
}

TEST_P(HttpEngineTest, HugeResponseHeaderIsTheEndpointsFailureNotALocalOne) {
    // libcurl reports "Out of memory" for it, but this process is fine: the
    // attempt is charged (else such an endpoint would be retried forever)
    ASSERT_TRUE(engine.submit(1, server.url("/huge-header").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_FALSE(done[0].local_failure);
}

TEST_P(HttpEngineTest, AnEndedInterimBlockDoesNotCompleteTheHeaders) {
    // the 103 block ended, the final one did not
    ASSERT_TRUE(engine.submit(1, server.url("/hints-then-cut").c_str(), "{}", 2, {}, 5000));
    // and a 103 alone is no response either
    ASSERT_TRUE(engine.submit(2, server.url("/hints-only").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 2);
    ASSERT_EQ(done.size(), 2u);
    for (const auto &c : done) {
        EXPECT_NE(c.curl_code, 0) << c.tag;
        EXPECT_EQ(c.status, 0) << c.tag;
        if (c.tag == 1) {
            EXPECT_STREQ(c.error, "response ended inside its header section");
        }
    }
}

TEST_P(HttpEngineTest, CompleteResponsesAreStillResponses) {
    const char *paths[] = {"/ok", "/early-hints", "/continue", "/no-content", "/chunked-trailer", "/until-close"};
    const long want_status[] = {200, 200, 201, 204, 200, 200};
    const char *want_body[] = {"ok", "{}", "", "", "ok", "body"};
    for (uint64_t i = 0; i < 6; i++) ASSERT_TRUE(engine.submit(i, server.url(paths[i]).c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 6);
    ASSERT_EQ(done.size(), 6u);
    for (const auto &c : done) {
        EXPECT_EQ(c.curl_code, 0) << paths[c.tag] << ": " << c.error;
        EXPECT_EQ(c.status, want_status[c.tag]) << paths[c.tag];
        EXPECT_EQ(std::string(c.body, c.body_len), want_body[c.tag]) << paths[c.tag];
    }
}

// --------------------------------------------------- local resource failures

// Run fn in a forked child (rlimits stay there) under a watchdog; returns
// its exit status, or 128 + the signal that killed it.  The child leaves
// with _exit: the parent's threads (the servers) do not exist in it, so no
// destructor may run there.
int in_child(const std::function<int()> &fn) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        ::alarm(30);
        int rc = 126;
        try {
            rc = fn();
        } catch (...) {
        }
        ::_exit(rc);
    }
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

// Allow exactly `spare` more descriptors: RLIMIT_NOFILE bounds descriptor
// numbers, and new ones take the lowest free numbers, so the limit goes
// just past the spare-th free number (holes below inherited descriptors
// such as a high-numbered pipe count as free).
bool limit_descriptors(int spare) {
    std::vector<bool> open;
    DIR *d = ::opendir("/proc/self/fd");
    if (d == nullptr) return false;
    int dfd = ::dirfd(d);
    while (dirent *e = ::readdir(d)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        int fd = std::atoi(e->d_name);
        if (fd == dfd) continue;
        if (static_cast<size_t>(fd) >= open.size()) open.resize(static_cast<size_t>(fd) + 1, false);
        open[static_cast<size_t>(fd)] = true;
    }
    ::closedir(d);
    int free_seen = 0;
    size_t limit = 0;
    while (free_seen < spare) {
        if (limit >= open.size() || !open[limit]) free_seen++;
        limit++;
    }
    rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
    rl.rlim_cur = static_cast<rlim_t>(limit);
    return ::setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

TEST(LocalFailure, OutOfDescriptorsIsLocalAndNeverCharged) {
    LoopbackServer server;
    const std::string url = server.url("/ok");
    int rc = in_child([&url]() -> int {
        od::HttpEngine e;
        if (!e.init(od::HttpEngineOptions{})) return 10;
        if (!limit_descriptors(6)) return 11;
        size_t submitted = 0;
        for (uint64_t i = 0; i < 30; i++)
            if (e.submit(i, url.c_str(), "{}", 2, {}, 5000)) submitted++;
        if (submitted != 30) return 12; // the engine never needs a descriptor to submit
        auto done = run_until(e, submitted, 20000);
        if (done.size() != submitted) return 13;
        od::OutcomePolicy p{};
        p.max_attempts = 1; // any charged failure would be Dead
        p.backoff = od::BackoffPolicy{1000, 60000};
        int local = 0, ok = 0;
        for (const auto &c : done) {
            if (c.curl_code == 0 && c.status == 200) {
                ok++;
                continue;
            }
            if (!c.local_failure || c.os_errno != EMFILE) return 14; // a failure charged to the endpoint
            od::DeliveryResult r{};
            r.transport_error = c.curl_code;
            r.transport_message = c.error;
            r.local_failure = c.local_failure;
            r.os_errno = c.os_errno;
            od::Outcome o = od::classify(r, p, 1, 1700000000, UINT64_MAX, nullptr, 0);
            if (o.verdict != od::Verdict::Retry || !o.local_failure) return 15;
            if (o.delay_ms < 500 || o.delay_ms > 1000) return 16;
            if (std::strstr(o.error,
                            "local resource failure in the dispatcher (Too many open files); "
                            "attempt not counted") != o.error)
                return 17;
            local++;
        }
        if (local == 0) return 18; // the limit did not bite
        if (ok == 0) return 19;    // nothing at all got through: not the test intended
        return 0;
    });
    EXPECT_EQ(rc, 0) << "child failed at check " << rc;
}

// Drive a Dispatcher the way the worker does until want outcomes exist.
void drive(od::Dispatcher &d, size_t want, int max_ms, const std::function<void()> &after_pump = {}) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_ms);
    d.pump(1700000000);
    if (after_pump) after_pump();
    while (d.outcomes().size() < want && std::chrono::steady_clock::now() < deadline) {
        d.engine().wait(20);
        d.collect(1700000000);
        d.pump(1700000000);
        if (after_pump) after_pump();
    }
}

od::ClaimedMessage message(int64_t id, const std::string &endpoint, int attempts) {
    od::ClaimedMessage m;
    m.id = id;
    m.lease_version = 1;
    m.attempts = attempts;
    m.endpoint = endpoint;
    m.event_type = "E";
    m.aggregate_type = "a";
    m.aggregate_id = std::to_string(id);
    m.body = "{}";
    m.endpoint_tag = 3;
    return m;
}

TEST(LocalFailure, DispatcherRefundsOutOfDescriptors) {
    LoopbackServer server;
    const std::string url = server.url("/ok");
    int rc = in_child([&url]() -> int {
        od::Dispatcher d;
        if (!d.init(od::HttpEngineOptions{}, 7)) return 10;
        od::DispatcherSettings s;
        s.wire.source = "/test";
        s.max_attempts = 1; // a charged failure at attempt 1 would be Dead
        s.backoff = od::BackoffPolicy{1000, 60000};
        d.set_settings(s);
        od::EndpointConfig ep;
        ep.name = "ep";
        ep.url = url;
        d.begin_endpoints();
        d.add_endpoint(ep);
        d.end_endpoints();
        for (int i = 1; i <= 30; i++) d.add(message(i, "ep", 1));
        if (!limit_descriptors(6)) return 11;
        drive(d, 30, 20000);
        if (d.outcomes().size() != 30) return 12;
        int local = 0;
        for (const auto &o : d.outcomes()) {
            if (o.verdict == od::Verdict::Done) continue;
            if (o.verdict != od::Verdict::Retry || !o.refund || !o.local_failure) return 13;
            if (o.latency_ms >= 0) return 14; // today's worker feeds the breaker otherwise
            if (o.delay_ms < 500 || o.delay_ms > 1000) return 15;
            if (std::strstr(o.error, "local resource failure") == nullptr) return 16;
            local++;
        }
        return local > 0 ? 0 : 17;
    });
    EXPECT_EQ(rc, 0) << "child failed at check " << rc;
}

TEST(LocalFailure, SubmitFailureIsRefundedNotDead) {
    // An engine whose multi handle was never created: every submit fails in
    // curl_multi_add_handle, the way it does when this process is out of memory.
    od::Dispatcher d;
    od::DispatcherSettings s;
    s.max_attempts = 3;
    s.backoff = od::BackoffPolicy{2000, 60000};
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "ep";
    ep.url = "http://127.0.0.1:9/x";
    d.begin_endpoints();
    d.add_endpoint(ep);
    d.end_endpoints();
    ASSERT_TRUE(d.add(message(1, "ep", 3)));  // attempts == max_attempts
    ASSERT_TRUE(d.add(message(2, "ep", 99))); // beyond it
    d.pump(1700000000);
    EXPECT_EQ(d.queued(), 0u);
    EXPECT_EQ(d.in_flight(), 0u);
    ASSERT_EQ(d.outcomes().size(), 2u);
    for (const auto &o : d.outcomes()) {
        EXPECT_EQ(o.verdict, od::Verdict::Retry) << o.id;
        EXPECT_TRUE(o.refund) << o.id;
        EXPECT_TRUE(o.local_failure) << o.id;
        EXPECT_EQ(o.latency_ms, -1) << o.id;
        EXPECT_FALSE(o.counts_for_endpoint()) << o.id;
        EXPECT_EQ(o.endpoint_tag, 3) << o.id;
        EXPECT_GE(o.delay_ms, 1000) << o.id;
        EXPECT_LE(o.delay_ms, 2000) << o.id;
        EXPECT_EQ(std::string(o.error).rfind(
                      "not sent: local resource failure in the dispatcher (curl_multi_add_handle failed", 0),
                  0u)
            << o.error;
        EXPECT_NE(std::string(o.error).find("); attempt not counted"), std::string::npos) << o.error;
    }
}

TEST(LocalFailure, UnknownEndpointIsStillCharged) {
    od::Dispatcher d;
    od::DispatcherSettings s;
    s.max_attempts = 3;
    d.set_settings(s);
    ASSERT_TRUE(d.add(message(1, "nope", 3)));
    ASSERT_EQ(d.outcomes().size(), 1u);
    EXPECT_EQ(d.outcomes()[0].verdict, od::Verdict::Dead);
    EXPECT_FALSE(d.outcomes()[0].refund);
    EXPECT_FALSE(d.outcomes()[0].local_failure);
}

// ------------------------------------------------------------ max_transfers

TEST(Dispatcher, MaxTransfersCapsTransfersAcrossTheWorker) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 5));
    od::DispatcherSettings s;
    s.wire.source = "/test";
    s.max_transfers = 3;
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "slow";
    ep.url = server.url("/slowish");
    ep.timeout_ms = 5000;
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ep));
    d.end_endpoints();
    for (int i = 1; i <= 10; i++) ASSERT_TRUE(d.add(message(i, "slow", 1)));

    size_t max_seen = 0;
    drive(d, 10, 20000, [&] { max_seen = std::max(max_seen, d.in_flight()); });
    ASSERT_EQ(d.outcomes().size(), 10u);
    for (const auto &o : d.outcomes()) EXPECT_EQ(o.verdict, od::Verdict::Done) << o.id << ": " << o.error;
    EXPECT_EQ(max_seen, 3u);
    EXPECT_LE(server.max_concurrent(), 3);
    EXPECT_LE(server.connections(), 3); // the pool never needed more
    // FIFO within the endpoint: requests went out in id order
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 10u);
    std::vector<int> order;
    for (const auto &r : reqs) {
        size_t p = r.find("Idempotency-Key: ");
        order.push_back(std::atoi(r.c_str() + p + 17));
    }
    // three at a time may arrive in any order; waves never overtake each other
    for (size_t i = 0; i < order.size(); i++) EXPECT_LE(std::abs(order[i] - static_cast<int>(i + 1)), 2) << i;
}

TEST(Dispatcher, MaxTransfersSharesPlacesBetweenEndpoints) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 5));
    od::DispatcherSettings s;
    s.max_transfers = 1;
    d.set_settings(s);
    od::EndpointConfig a;
    a.name = "a";
    a.url = server.url("/ok?ep=a");
    od::EndpointConfig b = a;
    b.name = "b";
    b.url = server.url("/ok?ep=b");
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(a));
    ASSERT_TRUE(d.add_endpoint(b));
    d.end_endpoints();
    for (int i = 1; i <= 4; i++) ASSERT_TRUE(d.add(message(i, "a", 1)));
    for (int i = 5; i <= 8; i++) ASSERT_TRUE(d.add(message(i, "b", 1)));
    drive(d, 8, 10000);
    ASSERT_EQ(d.outcomes().size(), 8u);
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 8u);
    // one place, handed to each endpoint in turn
    for (size_t i = 1; i < reqs.size(); i++) EXPECT_NE(reqs[i].substr(0, 20), reqs[i - 1].substr(0, 20)) << i;
}

TEST(Dispatcher, ZeroMaxTransfersIsUnlimited) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 5));
    od::DispatcherSettings s;
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "ok";
    ep.url = server.url("/ok");
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ep));
    d.end_endpoints();
    for (int i = 1; i <= 100; i++) ASSERT_TRUE(d.add(message(i, "ok", 1)));
    d.pump(1700000000);
    // every message handed over goes out at once: an endpoint's max_in_flight
    // is the worker's reservation in the shared slot, not a second gate here
    EXPECT_EQ(d.in_flight(), 100u);
    EXPECT_EQ(d.queued(), 0u);
    d.abandon(1700000000, "test over");
}

TEST(Dispatcher, MaxTransfersShrinksTheKeepAlivePool) {
    // Without a cap, eight requests at once leave eight idle connections in
    // the pool.  Lowering max_transfers to 2 lowers the pool to 2 as well:
    // as the next transfers finish, the surplus idle connections are closed.
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 5));
    od::DispatcherSettings s;
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "ok";
    ep.url = server.url("/slowish");
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ep));
    d.end_endpoints();
    for (int i = 1; i <= 8; i++) ASSERT_TRUE(d.add(message(i, "ok", 1)));
    drive(d, 8, 10000);
    ASSERT_EQ(d.outcomes().size(), 8u);
    EXPECT_EQ(server.open_connections(), 8); // all kept alive

    s.max_transfers = 2;
    d.set_settings(s);
    ep.url = server.url("/ok");
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ep));
    d.end_endpoints();
    for (int i = 9; i <= 16; i++) ASSERT_TRUE(d.add(message(i, "ok", 1)));
    drive(d, 16, 10000);
    ASSERT_EQ(d.outcomes().size(), 16u);
    for (const auto &o : d.outcomes()) EXPECT_EQ(o.verdict, od::Verdict::Done) << o.id << ": " << o.error;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (server.open_connections() > 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_LE(server.open_connections(), 2);
    EXPECT_EQ(server.connections(), 8); // and no new ones were needed
}

TEST(Dispatcher, PoolConnectionsGrowsTheKeepAlivePool) {
    // An engine pool of 4 closes 4 of 8 connections once they go idle, and
    // the next 8 requests reconnect; with pool_connections 8 (what a claim
    // can put in flight) all 8 are kept and reused.
    for (std::size_t pool : {std::size_t(0), std::size_t(8)}) {
        LoopbackServer server;
        od::Dispatcher d;
        od::HttpEngineOptions opts;
        opts.max_connections = 4;
        ASSERT_TRUE(d.init(opts, 6));
        od::DispatcherSettings s;
        s.pool_connections = pool;
        d.set_settings(s);
        od::EndpointConfig ep;
        ep.name = "ok";
        ep.url = server.url("/slowish");
        d.begin_endpoints();
        ASSERT_TRUE(d.add_endpoint(ep));
        d.end_endpoints();
        for (int round = 0; round < 2; round++) {
            for (int i = 1; i <= 8; i++) ASSERT_TRUE(d.add(message(round * 8 + i, "ok", 1)));
            drive(d, (round + 1) * 8, 10000);
        }
        ASSERT_EQ(d.outcomes().size(), 16u);
        for (const auto &o : d.outcomes()) EXPECT_EQ(o.verdict, od::Verdict::Done) << o.id << ": " << o.error;
        if (pool == 0)
            EXPECT_GE(server.connections(), 12) << "the default pool kept only 4";
        else
            EXPECT_EQ(server.connections(), 8) << "pool_connections 8 keeps every connection";
    }
}

TEST(Dispatcher, ReleaseQueuedKeepsTransfersInFlight) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 1));
    od::DispatcherSettings s;
    s.max_transfers = 1; // one in flight, two queued
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "e";
    ep.url = server.url("/ok");
    ep.timeout_ms = 5000;
    d.begin_endpoints();
    d.add_endpoint(ep);
    d.end_endpoints();
    for (int i = 1; i <= 3; i++) {
        od::ClaimedMessage m = message(i, "e", 1);
        m.lease_version = 7;
        d.add(std::move(m));
    }
    d.pump(0);
    ASSERT_EQ(d.in_flight(), 1u);
    d.release_queued("held");
    EXPECT_EQ(d.queued(), 0u);
    EXPECT_EQ(d.in_flight(), 1u); // the request in flight goes on
    ASSERT_EQ(d.outcomes().size(), 2u);
    for (const auto &o : d.outcomes()) {
        EXPECT_NE(o.id, 1); // the one sent first is not released
        EXPECT_EQ(o.verdict, od::Verdict::Retry);
        EXPECT_TRUE(o.refund);
        EXPECT_EQ(o.delay_ms, 0);
        EXPECT_EQ(o.lease_version, 7);
        EXPECT_STREQ(o.error, "held");
    }
    drive(d, 3, 10000); // nothing left to send; the one in flight finishes
    EXPECT_EQ(d.in_flight(), 0u);
    ASSERT_EQ(d.outcomes().size(), 3u);
    EXPECT_EQ(d.outcomes()[2].id, 1);
    EXPECT_EQ(d.outcomes()[2].verdict, od::Verdict::Done);
}

} // namespace

// Drive a Dispatcher until pred() holds or the deadline passed.
static void drive(od::Dispatcher &d, const std::function<bool()> &pred, int max_ms = 10000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_ms);
    while (!pred() && std::chrono::steady_clock::now() < deadline) {
        d.engine().wait(20);
        d.collect(1700000000);
        d.pump(1700000000);
    }
}

static int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

TEST(DispatcherOAuth, TokenFetchedWholeThenA401IsSentAgainOnceWithANewerToken) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 7));
    od::DispatcherSettings s;
    s.wire.source = "/test";
    s.max_attempts = 5;
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "oa";
    ep.url = server.url("/unauthorized");
    ep.timeout_ms = 5000;
    ep.oauth = od::OAuthClient{server.url("/token"), "id", "secret", "s1"};
    d.begin_endpoints();
    ASSERT_TRUE(d.add_endpoint(ep));
    d.end_endpoints();

    od::ClaimedMessage m;
    m.id = 1;
    m.lease_version = 1;
    m.attempts = 1;
    m.endpoint = "oa";
    m.event_type = "E";
    m.aggregate_type = "a";
    m.aggregate_id = "1";
    m.body = "{}";
    m.header_lines = {"Authorization: Bearer planted-by-the-producer"};
    ASSERT_TRUE(d.add(std::move(m)));

    // no token yet: nothing is sent, the message waits
    d.pump(1700000000);
    EXPECT_EQ(d.in_flight(), 0u);
    od::TokenState ts;
    ASSERT_TRUE(d.token_state("oa", wall_ms(), ts));
    EXPECT_TRUE(ts.waiting);
    EXPECT_TRUE(ts.busy);
    EXPECT_EQ(ts.generation, 0u);

    // the token request: its 3 KB answer is read whole
    ASSERT_TRUE(d.fetch_token("oa"));
    ASSERT_TRUE(d.token_state("oa", wall_ms(), ts));
    EXPECT_TRUE(ts.fetching);
    drive(d, [&] { return !d.token_results().empty(); });
    ASSERT_EQ(d.token_results().size(), 1u);
    const od::TokenAnswer &a = d.token_results()[0].answer;
    ASSERT_TRUE(a.ok) << a.error;
    EXPECT_EQ(a.access_token, std::string(3000, 't'));
    EXPECT_EQ(a.lifetime_s, 3600);
    auto reqs = server.requests();
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_NE(reqs[0].find("Authorization: Basic aWQ6c2VjcmV0\r\n"), std::string::npos); // id:secret
    EXPECT_NE(reqs[0].find("\r\n\r\ngrant_type=client_credentials&scope=s1"), std::string::npos);
    d.token_results().clear();

    // generation 1: sent, 401 -> not an outcome, queued again for a newer token
    d.set_token("oa", "tok-one", 7, 1, wall_ms() + 60000);
    drive(d, [&] {
        od::TokenState t;
        return d.token_state("oa", wall_ms(), t) && t.rejected != 0;
    });
    EXPECT_TRUE(d.outcomes().empty());
    ASSERT_TRUE(d.token_state("oa", wall_ms(), ts));
    EXPECT_EQ(ts.rejected, 1u);
    EXPECT_TRUE(ts.waiting); // the rejected token is never sent again
    d.take_rejected("oa");
    ASSERT_TRUE(d.token_state("oa", wall_ms(), ts));
    EXPECT_EQ(ts.rejected, 0u);

    // generation 2: sent again, 401 again -> the usual outcome (4xx: dead), attempt not used twice
    d.set_token("oa", "tok-two", 7, 2, wall_ms() + 60000);
    drive(d, [&] { return !d.outcomes().empty(); });
    ASSERT_EQ(d.outcomes().size(), 1u);
    EXPECT_EQ(d.outcomes()[0].verdict, od::Verdict::Dead);
    EXPECT_EQ(d.outcomes()[0].http_status, 401);
    EXPECT_EQ(d.outcomes()[0].attempts, 1);
    reqs = server.requests();
    ASSERT_EQ(reqs.size(), 3u);
    EXPECT_NE(reqs[1].find("Authorization: Bearer tok-one\r\n"), std::string::npos);
    EXPECT_NE(reqs[2].find("Authorization: Bearer tok-two\r\n"), std::string::npos);
    for (const std::string &r : reqs) EXPECT_EQ(r.find("planted-by-the-producer"), std::string::npos);
    d.outcomes().clear();

    // a token past its usable time is not sent; waiters given up on are charged retries that feed the breaker
    d.set_token("oa", "tok-old", 7, 3, wall_ms() - 1);
    od::ClaimedMessage m2;
    m2.id = 2;
    m2.lease_version = 1;
    m2.attempts = 1;
    m2.endpoint = "oa";
    m2.body = "{}";
    ASSERT_TRUE(d.add(std::move(m2)));
    d.pump(1700000000);
    EXPECT_EQ(d.in_flight(), 0u);
    d.fail_token_waiters("oa", "no OAuth2 access token: token endpoint answered 503");
    ASSERT_EQ(d.outcomes().size(), 1u);
    EXPECT_EQ(d.outcomes()[0].verdict, od::Verdict::Retry);
    EXPECT_FALSE(d.outcomes()[0].refund);
    EXPECT_LT(d.outcomes()[0].latency_ms, 0);             // no request made: no latency statistic counts it
    EXPECT_TRUE(d.outcomes()[0].unsent_endpoint_failure); // but the breaker hears of it
    EXPECT_FALSE(d.outcomes()[0].local_failure);
    EXPECT_TRUE(d.outcomes()[0].counts_for_endpoint());
    EXPECT_STREQ(d.outcomes()[0].error, "not sent: no OAuth2 access token: token endpoint answered 503");
    EXPECT_EQ(d.queued(), 0u);
    EXPECT_EQ(server.requests().size(), 3u);
}
