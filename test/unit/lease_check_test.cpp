#include <gtest/gtest.h>

#include <cstdint>

#include "core/lease_check.hpp"

namespace {

const int64_t S = 1000 * 1000;
const int64_t NOW = 1700000000LL * S;

TEST(LeaseCheck, NextCheckIsTheEarliestDeadline) {
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW + 2 * S, false), NOW + 2 * S);
}

TEST(LeaseCheck, NoLeaseOutstandingChecksAfterTheLongestGap) {
    EXPECT_EQ(od::next_lease_check(NOW, false, 0, false), NOW + 5 * S);
}

TEST(LeaseCheck, FarDeadlinesAreCappedByTheLongestGap) {
    // a 60 s lease is looked at after 5 s: a lease whose claim committed
    // while the check read the deadlines is noticed at most 5 s late
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW + 60 * S, false), NOW + 5 * S);
    EXPECT_EQ(od::next_lease_check(NOW, true, INT64_MAX, false), NOW + 5 * S);
}

TEST(LeaseCheck, ExpiredLeasesLeftInPlaceAreNotRescannedInALoop) {
    // an expired lease of an endpoint whose breaker is open stays: look again after 100 ms, not at once
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW - 10 * S, false), NOW + 100 * 1000);
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW, false), NOW + 100 * 1000);
    EXPECT_EQ(od::next_lease_check(NOW, true, INT64_MIN, false), NOW + 100 * 1000);
}

TEST(LeaseCheck, AFullReapChecksAgainAtOnce) {
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW + 60 * S, true), NOW);
    EXPECT_EQ(od::next_lease_check(NOW, false, 0, true), NOW);
}

TEST(LeaseCheck, PolicyBoundsAreRespectedAndSaturate) {
    od::LeaseCheckPolicy p;
    p.min_gap_us = 0;
    p.max_gap_us = S;
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW - 1, false, p), NOW);
    EXPECT_EQ(od::next_lease_check(NOW, true, NOW + 2 * S, false, p), NOW + S);
    // a maximum below the minimum: the minimum wins
    p.min_gap_us = 2 * S;
    EXPECT_EQ(od::next_lease_check(NOW, false, 0, false, p), NOW + 2 * S);
    // near the end of the clock: no overflow
    EXPECT_EQ(od::next_lease_check(INT64_MAX - 10, false, 0, false), INT64_MAX);
}

TEST(LeaseCheck, AClaimLowersTheCheckTimeNeverRaisesIt) {
    EXPECT_EQ(od::lower_lease_check(NOW + 5 * S, NOW + 60 * S), NOW + 5 * S);
    EXPECT_EQ(od::lower_lease_check(NOW + 5 * S, NOW + 1 * S), NOW + 1 * S);
    EXPECT_EQ(od::lower_lease_check(0, NOW), 0);
}

} // namespace
