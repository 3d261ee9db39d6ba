#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/histogram.hpp"

namespace {

TEST(Histogram, MillisecondsToMicroseconds) {
    EXPECT_EQ(od::latency_us(1.5), 1500u);
    EXPECT_EQ(od::latency_us(0.0004), 0u);
    EXPECT_EQ(od::latency_us(0), 0u);
    EXPECT_EQ(od::latency_us(-3), 0u);
    EXPECT_EQ(od::latency_us(NAN), 0u);
    EXPECT_EQ(od::latency_us(INFINITY), UINT64_C(9200000000000000000));
    EXPECT_EQ(od::latency_us(1e300), UINT64_C(9200000000000000000));
}

TEST(Histogram, BucketBCountsLatenciesBelowTwoToTheB) {
    EXPECT_EQ(od::latency_bucket(0), 0);
    EXPECT_EQ(od::latency_bucket(1), 1);
    EXPECT_EQ(od::latency_bucket(2), 2);
    EXPECT_EQ(od::latency_bucket(3), 2);
    EXPECT_EQ(od::latency_bucket(1023), 10);
    EXPECT_EQ(od::latency_bucket(1024), 11);
    // the last bucket takes everything slower
    EXPECT_EQ(od::latency_bucket(UINT64_C(1) << 31), 31);
    EXPECT_EQ(od::latency_bucket(UINT64_MAX), od::kLatencyBuckets - 1);
}

TEST(Histogram, PercentileIsTheUpperBoundOfItsBucket) {
    uint64_t b[od::kLatencyBuckets] = {};
    EXPECT_EQ(od::latency_percentile_ms(b, 0, 0.5), 0);

    // 90 requests of 0.7 ms (bucket 10: < 1.024 ms), 10 of 40 ms (bucket 16: < 65.536 ms)
    b[od::latency_bucket(od::latency_us(0.7))] += 90;
    b[od::latency_bucket(od::latency_us(40))] += 10;
    EXPECT_DOUBLE_EQ(od::latency_percentile_ms(b, 100, 0.50), 1.024);
    EXPECT_DOUBLE_EQ(od::latency_percentile_ms(b, 100, 0.89), 1.024);
    EXPECT_DOUBLE_EQ(od::latency_percentile_ms(b, 100, 0.90), 65.536);
    EXPECT_DOUBLE_EQ(od::latency_percentile_ms(b, 100, 0.99), 65.536);
}

TEST(Histogram, ATotalAboveTheCountsSaturatesAtTheLastBucket) {
    // read without a lock while a worker adds: the total may run ahead of the buckets
    uint64_t b[od::kLatencyBuckets] = {};
    b[3] = 5;
    EXPECT_DOUBLE_EQ(od::latency_percentile_ms(b, 50, 0.99),
                     static_cast<double>(UINT64_C(1) << (od::kLatencyBuckets - 1)) / 1000.0);
}

} // namespace
