// http_path.cpp — the dispatcher's HTTP path alone (src/core: request
// headers, signing, the HTTP engine), without PostgreSQL: N deliveries
// through one od::Dispatcher, batch messages at a time, against the URL
// given (test/bench/http_path_bench.sh starts an nginx answering 200).
//
// MODE "engine" is the engine as the workers use it (an http:// URL: its
// own HTTP/1.1 transport, http_direct.cpp); MODE "curl" the same engine with
// every request a libcurl transfer (HttpEngineOptions::own_http1 = false).
//
// MODE "framing" sends the same deliveries (the same header lines, built
// and signed by src/core/request.cpp) without libcurl: each request written
// by od::http1::write_post and sent with one send() over batch keep-alive
// connections opened first, each answer read with recv() into
// od::http1::ResponseParser.  No resolution, connection management or
// timeouts: the floor of the engine's own transport, measured the same way.
//
// Prints requests/s and this process's CPU per request (user + system,
// getrusage); run under `valgrind --tool=callgrind` (the script's
// CALLGRIND=1) for instructions per request, which do not depend on what
// else the machine is doing.
//
// Usage: http_path URL [N [BATCH [MODE]]]     MODE: engine (default), curl or framing
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

#include "core/dispatcher.hpp"
#include "core/http1.hpp"
#include "core/request.hpp"
#include "core/signing.hpp"

namespace {

double cpu_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Drive the engine until every transfer in flight finished.
void drain(od::Dispatcher &d, int64_t now) {
    while (d.in_flight() > 0) {
        d.engine().wait(100);
        d.collect(now);
    }
}

// The deliveries of `run` below without libcurl (MODE framing): same header
// lines, same body, same key; one connection per request in flight.
long run_framing(const std::string &url, long n, long batch, const std::vector<std::string> &endpoint_headers,
                 const od::SigningKey &key, const std::string &body, int64_t now) {
    // http://A.B.C.D:PORT/PATH (a benchmark URL: an IPv4 literal and a port)
    std::string rest = url.substr(std::strlen("http://"));
    std::size_t slash = rest.find('/');
    std::string authority = rest.substr(0, slash);
    std::string target = slash == std::string::npos ? "/" : rest.substr(slash);
    std::size_t colon = authority.find(':');
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(colon == std::string::npos ? 80 : std::atoi(authority.c_str() + colon + 1)));
    if (url.compare(0, 7, "http://") != 0 || inet_pton(AF_INET, authority.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
        std::fprintf(stderr, "framing: the URL must be http://<IPv4>:<port>/<path>\n");
        return -1;
    }
    const int ep = epoll_create1(0);
    std::vector<int> fds(static_cast<std::size_t>(batch));
    for (long i = 0; i < batch; i++) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
            std::perror("framing: connect");
            return -1;
        }
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = static_cast<uint64_t>(i);
        ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        fds[static_cast<std::size_t>(i)] = fd;
    }
    std::vector<od::http1::ResponseParser> parsers(static_cast<std::size_t>(batch));
    const od::WireSettings wire{"/postgresql/bench/outbox", ""};
    const std::vector<std::string> no_headers;
    std::vector<std::string> lines;
    std::string req;
    char buf[16384];
    long sent = 0, ok = 0;
    while (sent < n) {
        long k = std::min(batch, n - sent);
        for (long i = 0; i < k; i++) {
            std::string aggregate_id = std::to_string(sent + i + 1);
            od::MessageHead m{sent + i + 1, 1, "order.created", "order", aggregate_id.c_str(), now * 1000000};
            lines.clear();
            req.clear();
            if (!od::build_request_headers(m, wire, endpoint_headers, no_headers, &key, 1, now, body.data(),
                                           body.size(), lines) ||
                od::http1::write_post(req, target, authority, "outbox_dispatcher", lines, body.data(), body.size()) !=
                    nullptr ||
                ::send(fds[static_cast<std::size_t>(i)], req.data(), req.size(), MSG_NOSIGNAL) !=
                    static_cast<ssize_t>(req.size())) {
                std::fprintf(stderr, "framing: request %ld not sent\n", sent + i + 1);
                return -1;
            }
            parsers[static_cast<std::size_t>(i)].reset(nullptr, nullptr);
        }
        sent += k;
        for (long left = k; left > 0;) {
            epoll_event evs[64];
            int ne = ::epoll_wait(ep, evs, 64, 10000);
            if (ne <= 0) {
                std::fprintf(stderr, "framing: no answer within 10 s\n");
                return -1;
            }
            for (int j = 0; j < ne; j++) {
                std::size_t c = static_cast<std::size_t>(evs[j].data.u64);
                ssize_t r = ::recv(fds[c], buf, sizeof buf, 0);
                od::http1::ResponseParser &p = parsers[c];
                od::http1::ResponseParser::Result res = r > 0 ? p.feed(buf, static_cast<std::size_t>(r)) : p.finish();
                if (res == od::http1::ResponseParser::Result::kNeedMore) continue;
                if (res == od::http1::ResponseParser::Result::kDone && p.status() == 200 && p.keep_alive()) ok++;
                left--;
            }
        }
    }
    for (int fd : fds) ::close(fd);
    ::close(ep);
    return ok;
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s URL [N [BATCH [engine|curl|framing]]]\n", argv[0]);
        return 2;
    }
    const std::string url = argv[1];
    const long n = argc > 2 ? std::atol(argv[2]) : 20000;
    const long batch = argc > 3 ? std::atol(argv[3]) : 100;
    const std::string mode = argc > 4 ? argv[4] : "engine";
    if (n < 1 || batch < 1 || (mode != "engine" && mode != "curl" && mode != "framing")) {
        std::fprintf(stderr, "usage: %s URL [N [BATCH [engine|curl|framing]]]\n", argv[0]);
        return 2;
    }

    od::Dispatcher d;
    od::HttpEngineOptions opts;
    opts.own_http1 = mode != "curl";
    if (!d.init(opts, 1)) {
        std::fprintf(stderr, "init: %s\n", d.last_error());
        return 1;
    }
    od::DispatcherSettings s;
    s.wire.source = "/postgresql/bench/outbox";
    s.pool_connections = static_cast<std::size_t>(batch) * 2;
    d.set_settings(s);
    od::EndpointConfig ep;
    ep.name = "default";
    ep.url = url;
    ep.timeout_ms = 10000;
    ep.header_lines = {"X-Tenant: bench"};
    unsigned char key[64];
    const char *secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    long klen = od::decode_webhook_secret(secret, std::strlen(secret), key, sizeof key);
    ep.key.assign(key, key + (klen > 0 ? klen : 0));
    d.begin_endpoints();
    d.add_endpoint(ep);
    d.end_endpoints();

    // a ~250-byte payload, as in the drain benchmarks
    const std::string body =
        "{\"order_id\": 123456, \"customer\": {\"id\": 987, \"name\": \"Ada Lovelace\", \"tier\": \"gold\"}, "
        "\"lines\": [{\"sku\": \"A-1\", \"qty\": 2, \"price\": 19.99}, {\"sku\": \"B-7\", \"qty\": 1, \"price\": 5.5}], "
        "\"total\": 45.48, \"currency\": \"EUR\", \"note\": \"benchmark payload\"}";
    const int64_t now = 1796200000;
    long sent = 0, ok = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    if (mode == "framing") {
        const od::SigningKey k{ep.key.data(), ep.key.size()};
        ok = run_framing(url, n, batch, ep.header_lines, k, body, now);
        sent = n;
    }
    while (sent < n) {
        long k = std::min(batch, n - sent);
        for (long i = 0; i < k; i++) {
            od::ClaimedMessage m;
            m.id = sent + i + 1;
            m.lease_version = 1;
            m.attempts = 1;
            m.endpoint = "default";
            m.event_type = "order.created";
            m.aggregate_type = "order";
            m.aggregate_id = std::to_string(sent + i + 1);
            m.body = body;
            m.created_at_unix_us = now * 1000000;
            d.add(std::move(m));
        }
        sent += k;
        d.pump(now);
        drain(d, now);
        for (const auto &o : d.outcomes())
            if (o.verdict == od::Verdict::Done) ok++;
        d.outcomes().clear();
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - c0;
    std::printf("%-7s requests %ld  ok %ld  batch %ld  %.0f req/s  cpu %.2f us/request\n", mode.c_str(), n, ok, batch,
                n / wall, cpu * 1e6 / n);
    return ok == n ? 0 : 1;
}
