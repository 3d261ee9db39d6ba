// Unit tests for src/core/http_engine.cpp and src/core/dispatcher.cpp
// against a small HTTP/1.1 server on loopback, run in a thread of the test.
// The engine is driven the way the worker drives it: poll() on the sockets
// it asks for, on_socket()/on_timeout(), drain().
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dispatcher.hpp"
#include "core/http_engine.hpp"

namespace {

// A tiny keep-alive HTTP server: the response depends on the request path.
class LoopbackServer {
public:
    LoopbackServer() {
        listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = 0;
        ::bind(listen_fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
        ::listen(listen_fd_, 64);
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
    int connections() const { return accepted_.load(); }
    std::vector<std::string> requests() {
        std::lock_guard<std::mutex> g(mu_);
        return requests_;
    }

private:
    void accept_loop() {
        while (!stop_) {
            int fd = ::accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) return;
            accepted_++;
            std::lock_guard<std::mutex> g(mu_);
            conns_.push_back(fd);
            workers_.emplace_back([this, fd] { serve(fd); });
        }
    }
    void serve(int fd) {
        std::string buf;
        char tmp[4096];
        for (;;) {
            size_t hdr_end;
            while ((hdr_end = buf.find("\r\n\r\n")) == std::string::npos) {
                ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
                if (n <= 0) { ::close(fd); return; }
                buf.append(tmp, static_cast<size_t>(n));
            }
            std::string head = buf.substr(0, hdr_end);
            size_t clen = 0;
            size_t p = head.find("Content-Length: ");
            if (p != std::string::npos) clen = std::stoul(head.substr(p + 16));
            while (buf.size() < hdr_end + 4 + clen) {
                ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
                if (n <= 0) { ::close(fd); return; }
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
            std::string resp;
            if (path == "/ok") {
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            } else if (path == "/busy") {
                resp = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy";
            } else if (path == "/redirect") {
                resp = "HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n";
            } else if (path == "/slow") {
                std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            } else if (path == "/huge") {
                const size_t n = 4 * 1024 * 1024;
                std::string h = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n";
                ::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
                std::string chunk(64 * 1024, 'x');
                for (size_t sent = 0; sent < n; sent += chunk.size())
                    if (::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) <= 0) break;
                ::close(fd);
                return;
            } else {
                resp = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
            }
            if (::send(fd, resp.data(), resp.size(), MSG_NOSIGNAL) <= 0) { ::close(fd); return; }
        }
    }

    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> accepted_{0};
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
        if (e.timeout_ms() == 0) e.on_timeout();
        e.drain(out);
        if (out.size() >= n) break;
        const auto &socks = e.sockets();
        std::vector<pollfd> pfds;
        for (const auto &s : socks)
            pfds.push_back(pollfd{s.fd, static_cast<short>((s.want_read ? POLLIN : 0) | (s.want_write ? POLLOUT : 0)), 0});
        long t = e.timeout_ms();
        if (t < 0 || t > 50) t = 50;
        int r = ::poll(pfds.data(), pfds.size(), static_cast<int>(t));
        if (r > 0) {
            for (const auto &p : pfds)
                if (p.revents) e.on_socket(p.fd, (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0, (p.revents & POLLOUT) != 0);
        } else if (e.timeout_ms() == 0) {
            e.on_timeout();
        }
        e.drain(out);
    }
    return out;
}

class HttpEngineTest : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_TRUE(engine.init(od::HttpEngineOptions{})) << engine.last_error(); }
    LoopbackServer server;
    od::HttpEngine engine;
};

TEST_F(HttpEngineTest, PostsBodyAndHeaders) {
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

TEST_F(HttpEngineTest, ManyConcurrentRequestsReuseConnections) {
    const int n = 50;
    std::vector<std::string> headers = {"Content-Type: application/json"};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++)
            ASSERT_TRUE(engine.submit(static_cast<uint64_t>(round * n + i), server.url("/ok").c_str(), "{}", 2, headers, 5000));
        auto done = run_until(engine, n);
        ASSERT_EQ(done.size(), static_cast<size_t>(n));
        for (const auto &c : done) EXPECT_EQ(c.status, 200);
    }
    // 150 requests in three waves of 50: connections are kept alive and reused.
    EXPECT_LE(server.connections(), n);
    EXPECT_EQ(server.requests().size(), 150u);
}

TEST_F(HttpEngineTest, CapturesRetryAfterAndDoesNotFollowRedirects) {
    std::vector<std::string> headers;
    ASSERT_TRUE(engine.submit(1, server.url("/busy").c_str(), "{}", 2, headers, 5000));
    ASSERT_TRUE(engine.submit(2, server.url("/redirect").c_str(), "{}", 2, headers, 5000));
    auto done = run_until(engine, 2);
    ASSERT_EQ(done.size(), 2u);
    for (const auto &c : done) {
        if (c.tag == 1) {
            EXPECT_EQ(c.status, 503);
            EXPECT_EQ(std::string(c.retry_after, c.retry_after_len), "7");
        } else {
            EXPECT_EQ(c.status, 302);  // reported, not followed
        }
    }
    EXPECT_EQ(server.requests().size(), 2u);  // no request to /ok
}

TEST_F(HttpEngineTest, TimeoutIsATransportError) {
    std::vector<std::string> headers;
    ASSERT_TRUE(engine.submit(1, server.url("/slow").c_str(), "{}", 2, headers, 300));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 0);
    EXPECT_EQ(done[0].curl_code, 28);  // CURLE_OPERATION_TIMEDOUT
    EXPECT_NE(std::string(done[0].error).find("timed out"), std::string::npos) << done[0].error;
}

TEST_F(HttpEngineTest, ConnectionRefused) {
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

TEST_F(HttpEngineTest, HugeBodyIsCappedNotBuffered) {
    ASSERT_TRUE(engine.submit(1, server.url("/huge").c_str(), "{}", 2, {}, 5000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].curl_code, 0);       // cut off on purpose, still a response
    EXPECT_EQ(done[0].status, 500);
    EXPECT_EQ(done[0].body_len, od::kBodyCap);
}

TEST_F(HttpEngineTest, OnlyHttpAndHttps) {
    ASSERT_TRUE(engine.submit(1, "file:///etc/passwd", "{}", 2, {}, 2000));
    auto done = run_until(engine, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(done[0].curl_code, 0);
    EXPECT_EQ(done[0].status, 0);
}

TEST(Dispatcher, ClassifiesAndRespectsMaxInFlight) {
    LoopbackServer server;
    od::Dispatcher d;
    ASSERT_TRUE(d.init(od::HttpEngineOptions{}, 42));
    od::DispatcherSettings s;
    s.source = "/test";
    s.max_attempts = 3;
    d.set_settings(s);
    od::EndpointConfig ok;
    ok.name = "ok";
    ok.url = server.url("/ok");
    ok.max_in_flight = 2;
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
    EXPECT_EQ(d.in_flight(), 3u);  // 2 for "ok" (max_in_flight), 1 for "busy"
    EXPECT_EQ(d.queued(), 2u);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (d.outcomes().size() < 6 && std::chrono::steady_clock::now() < deadline) {
        const auto &socks = d.engine().sockets();
        std::vector<pollfd> pfds;
        for (const auto &sk : socks)
            pfds.push_back(pollfd{sk.fd, static_cast<short>((sk.want_read ? POLLIN : 0) | (sk.want_write ? POLLOUT : 0)), 0});
        if (d.engine().timeout_ms() == 0) d.engine().on_timeout();
        if (::poll(pfds.data(), pfds.size(), 20) > 0)
            for (const auto &p : pfds)
                if (p.revents) d.engine().on_socket(p.fd, (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0, (p.revents & POLLOUT) != 0);
        d.collect(1700000000);
        d.pump(1700000000);
    }
    ASSERT_EQ(d.outcomes().size(), 6u);
    std::map<int64_t, od::DeliveryOutcome> by_id;
    for (const auto &o : d.outcomes()) by_id[o.id] = o;
    for (int i = 1; i <= 4; i++) {
        EXPECT_EQ(by_id[i].verdict, od::Verdict::Done) << i;
        EXPECT_EQ(by_id[i].http_status, 200);
    }
    EXPECT_EQ(by_id[5].verdict, od::Verdict::Retry);
    EXPECT_GE(by_id[5].delay_ms, 7000);  // never sooner than Retry-After: 7
    EXPECT_EQ(by_id[5].http_status, 503);
    EXPECT_EQ(by_id[6].verdict, od::Verdict::Retry);  // unknown endpoint: not sent, retried
    EXPECT_EQ(by_id[6].latency_ms, -1);

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
    od::EndpointConfig slow;
    slow.name = "slow";
    slow.url = server.url("/slow");
    slow.max_in_flight = 1;
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

}  // namespace
