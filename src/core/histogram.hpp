/*
 * core/histogram.hpp — the request-latency histogram kept per worker (in
 * outbox.worker_stats) and per endpoint (in outbox.endpoint_health).
 *
 * Power-of-two buckets: bucket b counts latencies below 2^b microseconds
 * (bucket 0: below 1 microsecond; the last bucket also counts everything
 * slower), so a percentile read from it is an upper bound within a factor
 * of 2; the count, sum and maximum kept next to it are exact.
 */
#pragma once

#include <cstdint>

namespace od {

constexpr int kLatencyBuckets = 32;

/* A latency in milliseconds as whole microseconds (negative or NaN: 0; saturates). */
uint64_t latency_us(double ms) noexcept;

/* The bucket that counts a latency of `us` microseconds. */
int latency_bucket(uint64_t us) noexcept;

/*
 * The q-quantile (0..1) of `total` latencies counted in `buckets`
 * (kLatencyBuckets of them), in milliseconds: the upper bound of the bucket
 * it falls in; 0 when nothing was counted.
 */
double latency_percentile_ms(const uint64_t *buckets, uint64_t total, double q) noexcept;

} // namespace od
