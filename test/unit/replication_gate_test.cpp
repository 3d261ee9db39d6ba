#include <gtest/gtest.h>

#include <cstdint>

#include "core/replication_gate.hpp"

namespace {

const int64_t MS = 1000;
const int64_t S = 1000 * MS;
const int64_t NOW = 1700000000LL * S;
const int64_t HOLD = 5 * S;

TEST(ReplicationGate, NothingClaimedSendsAndMayClaim) {
    od::ReplicationGate g;
    EXPECT_EQ(od::gate_step(g, 0, NOW, HOLD), od::GateStep::Send);
    EXPECT_TRUE(od::gate_may_claim(g, 0));
    EXPECT_FALSE(od::gate_waiting(g));
}

TEST(ReplicationGate, AClaimWaitsUntilItsCommitIsConfirmed) {
    od::ReplicationGate g;
    od::gate_claimed(g, 1000, NOW);
    EXPECT_TRUE(od::gate_waiting(g));
    EXPECT_FALSE(od::gate_may_claim(g, 999)); // one claim waits at a time
    EXPECT_EQ(od::gate_step(g, 999, NOW + MS, HOLD), od::GateStep::Hold);
    EXPECT_EQ(od::gate_step(g, 0, NOW + MS, HOLD), od::GateStep::Hold);
    EXPECT_EQ(od::gate_step(g, 1000, NOW + 2 * MS, HOLD), od::GateStep::Send);
    EXPECT_FALSE(od::gate_waiting(g));
    EXPECT_TRUE(od::gate_may_claim(g, 1000));
    // once confirmed, a lower reading later (a standby replaced) changes nothing
    EXPECT_EQ(od::gate_step(g, 10, NOW + 3 * MS, HOLD), od::GateStep::Send);
}

TEST(ReplicationGate, AConfirmationAheadOfTheClaimSendsAtOnce) {
    od::ReplicationGate g;
    od::gate_claimed(g, 1000, NOW);
    EXPECT_TRUE(od::gate_may_claim(g, 5000));
    EXPECT_EQ(od::gate_step(g, 5000, NOW, HOLD), od::GateStep::Send);
}

TEST(ReplicationGate, AnUnconfirmedClaimIsReleasedAfterTheHoldLimitAndClaimsStopUntilTheStandbysPassIt) {
    od::ReplicationGate g;
    od::gate_claimed(g, 1000, NOW);
    EXPECT_EQ(od::gate_step(g, 500, NOW + HOLD - 1, HOLD), od::GateStep::Hold);
    EXPECT_EQ(od::gate_step(g, 500, NOW + HOLD, HOLD), od::GateStep::Release);
    // stalled: nothing queued waits any more, but no new claim either
    EXPECT_TRUE(od::gate_waiting(g));
    EXPECT_FALSE(od::gate_may_claim(g, 500));
    EXPECT_EQ(od::gate_step(g, 500, NOW + 2 * HOLD, HOLD), od::GateStep::Send);
    EXPECT_FALSE(od::gate_may_claim(g, 999));
    // the standby is back and has passed the position given up at
    EXPECT_EQ(od::gate_step(g, 1000, NOW + 3 * HOLD, HOLD), od::GateStep::Send);
    EXPECT_FALSE(od::gate_waiting(g));
    EXPECT_TRUE(od::gate_may_claim(g, 1000));
}

TEST(ReplicationGate, ClearForgetsEverything) {
    od::ReplicationGate g;
    od::gate_claimed(g, 1000, NOW);
    od::gate_step(g, 0, NOW + HOLD, HOLD);
    od::gate_claimed(g, 2000, NOW + HOLD);
    od::gate_clear(g);
    EXPECT_FALSE(od::gate_waiting(g));
    EXPECT_TRUE(od::gate_may_claim(g, 0));
}

TEST(ReplicationGate, AnInvalidPositionWaitsForNothing) {
    od::ReplicationGate g;
    od::gate_claimed(g, 0, NOW); // a claim that wrote nothing
    EXPECT_FALSE(od::gate_waiting(g));
}

TEST(ReplicationGate, HoldLimitIsAQuarterOfTheLeaseWithinBounds) {
    EXPECT_EQ(od::replication_hold_limit_us(60 * S), 5 * S);
    EXPECT_EQ(od::replication_hold_limit_us(8 * S), 2 * S);
    EXPECT_EQ(od::replication_hold_limit_us(100 * MS), 25 * MS);
    EXPECT_EQ(od::replication_hold_limit_us(1), 10 * MS);
    EXPECT_EQ(od::replication_hold_limit_us(0), 10 * MS);
    EXPECT_EQ(od::replication_hold_limit_us(INT64_MAX), 5 * S);
}

} // namespace
