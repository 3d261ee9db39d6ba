// http_path.cpp — the dispatcher's HTTP path alone (src/core: request
// headers, signing, the libcurl engine), without PostgreSQL: N deliveries
// through one od::Dispatcher, batch messages at a time, against the URL
// given (test/bench/http_path_bench.sh starts an nginx answering 200).
//
// Prints requests/s and this process's CPU per request (user + system,
// getrusage); run under `valgrind --tool=callgrind` (the script's
// CALLGRIND=1) for instructions per request, which do not depend on what
// else the machine is doing.
//
// Usage: http_path URL [N [BATCH]]
#include <poll.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

#include "core/dispatcher.hpp"
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

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s URL [N [BATCH]]\n", argv[0]);
        return 2;
    }
    const std::string url = argv[1];
    const long n = argc > 2 ? std::atol(argv[2]) : 20000;
    const long batch = argc > 3 ? std::atol(argv[3]) : 100;

    od::Dispatcher d;
    od::HttpEngineOptions opts;
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
    std::printf("requests %ld  ok %ld  batch %ld  %.0f req/s  cpu %.2f us/request\n", n, ok, batch, n / wall,
                cpu * 1e6 / n);
    return ok == n ? 0 : 1;
}
