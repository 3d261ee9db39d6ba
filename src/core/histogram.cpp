/*
 * core/histogram.cpp — the latency histogram (see histogram.hpp).
 */
#include "core/histogram.hpp"

namespace od {

uint64_t latency_us(double ms) noexcept {
    if (!(ms > 0)) return 0; // negative, zero or NaN
    double us = ms * 1000.0;
    if (us >= 9.2e18) return UINT64_C(9200000000000000000);
    return static_cast<uint64_t>(us);
}

int latency_bucket(uint64_t us) noexcept {
    int b = 0;
    while (b < kLatencyBuckets - 1 && us >= (UINT64_C(1) << b)) b++;
    return b;
}

double latency_percentile_ms(const uint64_t *buckets, uint64_t total, double q) noexcept {
    if (total == 0) return 0;
    uint64_t target = static_cast<uint64_t>(q * static_cast<double>(total));
    uint64_t seen = 0;
    for (int b = 0; b < kLatencyBuckets; b++) {
        seen += buckets[b];
        if (seen > target) return static_cast<double>(UINT64_C(1) << b) / 1000.0;
    }
    return static_cast<double>(UINT64_C(1) << (kLatencyBuckets - 1)) / 1000.0;
}

} // namespace od
