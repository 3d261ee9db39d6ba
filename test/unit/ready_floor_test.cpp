#include <gtest/gtest.h>

#include <cstdint>

#include "core/ready_floor.hpp"

namespace {

const int64_t S = 1000 * 1000;
const int64_t NOW = 850000000LL * S; /* PostgreSQL's epoch: 2026 */

TEST(ReadyFloor, NothingKnownReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    EXPECT_EQ(od::ready_scan_from(f, NOW), od::kReadFromFirst);
}

TEST(ReadyFloor, FloorIsTheOldestClaimedLessTheLag) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 100, NOW - 3 * S);
    EXPECT_TRUE(f.known);
    EXPECT_EQ(od::ready_scan_from(f, NOW + S / 2), NOW - 3 * S - od::kReadyFloorLagUs);
}

TEST(ReadyFloor, NothingClaimedMovesTheFloorToTheClaimStart) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW - 2000, 0, 0);
    EXPECT_EQ(od::ready_scan_from(f, NOW + 1000), NOW - 2000 - od::kReadyFloorLagUs);
    /* and a later claim that found nothing from there moves it on */
    od::ready_floor_claimed(f, NOW + 1000, NOW - 2000 - od::kReadyFloorLagUs, NOW + 500, 0, 0);
    EXPECT_EQ(od::ready_scan_from(f, NOW + 2000), NOW + 500 - od::kReadyFloorLagUs);
}

TEST(ReadyFloor, NeverAboveTheClaimStart) {
    /* a claimed row is available at the claim's start: a later value (clock, bad data) counts as the start */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 5, NOW + 60 * S);
    EXPECT_EQ(od::ready_scan_from(f, NOW + 1), NOW - od::kReadyFloorLagUs);
}

TEST(ReadyFloor, ReadsFromTheFirstEntryAgainAfterTheFullScanPeriod) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, NOW);
    EXPECT_NE(od::ready_scan_from(f, NOW + od::kReadyFullScanUs - 1), od::kReadFromFirst);
    EXPECT_EQ(od::ready_scan_from(f, NOW + od::kReadyFullScanUs), od::kReadFromFirst);
    /* a claim from the floor does not restart the period; one from the first entry does */
    od::ready_floor_claimed(f, NOW + S / 2, NOW - od::kReadyFloorLagUs, NOW + S / 2, 1, NOW + S / 2);
    EXPECT_EQ(od::ready_scan_from(f, NOW + od::kReadyFullScanUs), od::kReadFromFirst);
    od::ready_floor_claimed(f, NOW + od::kReadyFullScanUs, od::kReadFromFirst, NOW + od::kReadyFullScanUs, 0, 0);
    EXPECT_NE(od::ready_scan_from(f, NOW + od::kReadyFullScanUs + 1), od::kReadFromFirst);
}

TEST(ReadyFloor, ClockGoingBackReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, NOW);
    EXPECT_EQ(od::ready_scan_from(f, NOW - 1), od::kReadFromFirst);
}

TEST(ReadyFloor, MinusInfinityAvailableAtLeavesNoFloor) {
    /* available_at = '-infinity' (or near it): no overflow, nothing to skip */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, INT64_MIN);
    EXPECT_FALSE(f.known);
    EXPECT_EQ(od::ready_scan_from(f, NOW), od::kReadFromFirst);
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, INT64_MIN + od::kReadyFloorLagUs - 1);
    EXPECT_FALSE(f.known);
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, INT64_MIN + od::kReadyFloorLagUs);
    EXPECT_TRUE(f.known);
    EXPECT_EQ(f.floor_us, INT64_MIN);
}

TEST(ReadyFloor, ResetReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kReadFromFirst, NOW, 1, NOW);
    od::ready_floor_reset(f);
    EXPECT_EQ(od::ready_scan_from(f, NOW + 1), od::kReadFromFirst);
}

} // namespace
