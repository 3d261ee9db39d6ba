#include <gtest/gtest.h>

#include <cstdint>

#include "core/ready_floor.hpp"

namespace {

const int64_t S = 1000 * 1000;
const int64_t NOW = 850000000LL * S; /* PostgreSQL's epoch: 2026 */
const int64_t LAG = od::kReadyFloorLagUs;

od::ReadyKey key(int64_t at, int64_t id) {
    return od::ReadyKey{ at, id };
}

void expect_key(const od::ReadyKey &got, const od::ReadyKey &want) {
    EXPECT_EQ(got.at_us, want.at_us);
    EXPECT_EQ(got.id, want.id);
}

TEST(ReadyFloor, NothingKnownReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    EXPECT_TRUE(od::ready_key_is_first(od::ready_scan_from(f, NOW)));
}

TEST(ReadyFloor, KeysCompareByTimeThenId) {
    EXPECT_TRUE(od::ready_key_less(key(NOW, 9), key(NOW + 1, 1)));
    EXPECT_TRUE(od::ready_key_less(key(NOW, 1), key(NOW, 2)));
    EXPECT_FALSE(od::ready_key_less(key(NOW, 2), key(NOW, 2)));
    EXPECT_FALSE(od::ready_key_less(key(NOW + 1, 1), key(NOW, 9)));
    EXPECT_TRUE(od::ready_key_less(od::kFirstKey, key(od::kReadFromFirst, INT64_MIN + 1)));
}

TEST(ReadyFloor, ABacklogOlderThanTheLagIsReadFromTheFirstRowTaken) {
    /* one bulk INSERT: every row has the same available_at; the claim took ids 1001..1100 */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 100, key(NOW - 30 * S, 1001));
    EXPECT_TRUE(f.known);
    expect_key(od::ready_scan_from(f, NOW + S / 2), key(NOW - 30 * S, 1001));
    /* the next claim, from there, took 1101..1200: the floor moves on within the same available_at */
    od::ready_floor_claimed(f, NOW + S / 2, key(NOW - 30 * S, 1001), NOW + S / 2, 100, key(NOW - 30 * S, 1101));
    expect_key(od::ready_scan_from(f, NOW + S / 2 + 1), key(NOW - 30 * S, 1101));
}

TEST(ReadyFloor, NearThePresentTheFloorIsTheClaimStartLessTheLag) {
    /* the first row taken is within the lag of the claim's start: a longer-running producer's
       message with an older available_at may still commit, so the floor stays a lag behind */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 100, key(NOW - LAG / 2, 7));
    expect_key(od::ready_scan_from(f, NOW + S / 2), key(NOW - LAG, INT64_MIN));
    /* exactly a lag behind the start is not older than it: the cut again */
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 100, key(NOW - LAG, 7));
    expect_key(od::ready_scan_from(f, NOW + 1), key(NOW - LAG, INT64_MIN));
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 100, key(NOW - LAG - 1, 7));
    expect_key(od::ready_scan_from(f, NOW + 1), key(NOW - LAG - 1, 7));
}

TEST(ReadyFloor, NothingClaimedMovesTheFloorToTheClaimStart) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW - 2000, 0, od::kFirstKey);
    expect_key(od::ready_scan_from(f, NOW + 1000), key(NOW - 2000 - LAG, INT64_MIN));
    /* and a later claim that found nothing from there moves it on */
    od::ready_floor_claimed(f, NOW + 1000, key(NOW - 2000 - LAG, INT64_MIN), NOW + 500, 0, od::kFirstKey);
    expect_key(od::ready_scan_from(f, NOW + 2000), key(NOW + 500 - LAG, INT64_MIN));
}

TEST(ReadyFloor, NeverAboveTheClaimStartLessTheLag) {
    /* a claimed row is available at the claim's start: a later value (clock, bad data) counts as the start */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 5, key(NOW + 60 * S, 3));
    expect_key(od::ready_scan_from(f, NOW + 1), key(NOW - LAG, INT64_MIN));
}

TEST(ReadyFloor, ReadsFromTheFirstEntryAgainAfterTheFullScanPeriod) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 1, key(NOW, 1));
    EXPECT_FALSE(od::ready_key_is_first(od::ready_scan_from(f, NOW + od::kReadyFullScanUs - 1)));
    EXPECT_TRUE(od::ready_key_is_first(od::ready_scan_from(f, NOW + od::kReadyFullScanUs)));
    /* a claim from the floor does not restart the period; one from the first entry does */
    od::ready_floor_claimed(f, NOW + S / 2, key(NOW - LAG, INT64_MIN), NOW + S / 2, 1, key(NOW + S / 2, 2));
    EXPECT_TRUE(od::ready_key_is_first(od::ready_scan_from(f, NOW + od::kReadyFullScanUs)));
    od::ready_floor_claimed(f, NOW + od::kReadyFullScanUs, od::kFirstKey, NOW + od::kReadyFullScanUs, 0,
                            od::kFirstKey);
    EXPECT_FALSE(od::ready_key_is_first(od::ready_scan_from(f, NOW + od::kReadyFullScanUs + 1)));
}

TEST(ReadyFloor, ClockGoingBackReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 1, key(NOW, 1));
    EXPECT_TRUE(od::ready_key_is_first(od::ready_scan_from(f, NOW - 1)));
}

TEST(ReadyFloor, MinusInfinityIsAPositionLikeAnyOther) {
    /* available_at = '-infinity': no overflow; the floor is that row's position */
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 1, key(od::kReadFromFirst, 42));
    EXPECT_TRUE(f.known);
    expect_key(od::ready_scan_from(f, NOW + 1), key(od::kReadFromFirst, 42));
    /* the first key itself (no row has it) leaves no floor */
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 1, od::kFirstKey);
    EXPECT_FALSE(f.known);
}

TEST(ReadyFloor, AClaimStartNearMinusInfinityLeavesNoFloor) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, INT64_MIN + LAG - 1, 0, od::kFirstKey);
    EXPECT_FALSE(f.known);
    od::ready_floor_claimed(f, NOW, od::kFirstKey, INT64_MIN + LAG, 0, od::kFirstKey);
    EXPECT_FALSE(f.known); /* the cut is the first key itself */
    od::ready_floor_claimed(f, NOW, od::kFirstKey, INT64_MIN + LAG + 1, 0, od::kFirstKey);
    EXPECT_TRUE(f.known);
}

TEST(ReadyFloor, ResetReadsFromTheFirstEntry) {
    od::ReadyFloor f{};
    od::ready_floor_claimed(f, NOW, od::kFirstKey, NOW, 1, key(NOW, 1));
    od::ready_floor_reset(f);
    EXPECT_TRUE(od::ready_key_is_first(od::ready_scan_from(f, NOW + 1)));
}

} // namespace
