#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "core/schedule.hpp"

namespace {

const int64_t MS = 1000;
const int64_t S = 1000 * MS;
const int64_t NOW = 1700000000LL * S;

/* an active worker holding nothing, with no reason to claim and nothing due */
od::WorkerCycle quiet() {
    od::WorkerCycle c;
    c.now = NOW;
    c.installed = true;
    c.active = true;
    c.pipeline = 100;
    c.held = 0;
    c.next_poll = NOW + 1 * S;
    c.next_refresh = NOW + 1 * S;
    return c;
}

TEST(Schedule, NoReasonNoClaim) {
    EXPECT_EQ(od::claim_now(quiet()), 0);
}

TEST(Schedule, EveryReasonToClaim) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    EXPECT_EQ(od::claim_now(c), 100);

    c = quiet();
    c.last_claim_full = true;
    EXPECT_EQ(od::claim_now(c), 100);

    c = quiet();
    c.next_poll = NOW;
    EXPECT_EQ(od::claim_now(c), 100);

    c = quiet();
    c.next_quota = NOW - 1;
    EXPECT_EQ(od::claim_now(c), 100);
    c.next_quota = NOW + 1;
    EXPECT_EQ(od::claim_now(c), 0);

    c = quiet();
    c.places_released = true; // a request finished ...
    EXPECT_EQ(od::claim_now(c), 0);
    c.claim_quota_full = true; // ... while the quotas had no place left
    EXPECT_EQ(od::claim_now(c), 100);
}

TEST(Schedule, ClaimOnlyWithRoomForHalfThePipeline) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.held = 50;
    EXPECT_EQ(od::claim_now(c), 50);
    EXPECT_TRUE(od::has_claim_room(c));
    c.held = 51;
    EXPECT_EQ(od::claim_now(c), 0);
    EXPECT_FALSE(od::has_claim_room(c));

    // a pipeline of one message still claims one at a time
    c.pipeline = 1;
    c.held = 0;
    EXPECT_EQ(od::claim_now(c), 1);
    c.held = 1;
    EXPECT_EQ(od::claim_now(c), 0);
}

TEST(Schedule, NoClaimWhileInactiveOrBackingOff) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.active = false;
    EXPECT_EQ(od::claim_now(c), 0);

    c.active = true;
    c.backoff_until = NOW + 1;
    EXPECT_EQ(od::claim_now(c), 0);
    c.backoff_until = NOW;
    EXPECT_EQ(od::claim_now(c), 100);
}

TEST(Schedule, FinalizeHalfABatchAtOnce) {
    od::WorkerCycle c = quiet();
    c.results = 49;
    c.in_flight = 10;
    c.oldest_result = NOW;
    EXPECT_FALSE(od::finalize_now(c));
    c.results = 50;
    EXPECT_TRUE(od::finalize_now(c));
}

TEST(Schedule, FinalizeAfterTheFlushDelay) {
    od::WorkerCycle c = quiet();
    c.results = 1;
    c.in_flight = 10;
    c.oldest_result = NOW - 2 * MS + 1;
    EXPECT_FALSE(od::finalize_now(c));
    c.oldest_result = NOW - 2 * MS;
    EXPECT_TRUE(od::finalize_now(c));
}

TEST(Schedule, ResultsWaitForTheNextClaimUnlessNoneCanCome) {
    od::WorkerCycle c = quiet();
    c.results = 1;
    c.in_flight = 0;
    c.oldest_result = NOW;
    EXPECT_FALSE(od::finalize_now(c)); // a claim may come and take them along
    c.active = false;                  // paused or stopping: none will
    EXPECT_TRUE(od::finalize_now(c));
}

TEST(Schedule, NothingToFinalizeOrBackingOff) {
    od::WorkerCycle c = quiet();
    c.active = false;
    EXPECT_FALSE(od::finalize_now(c));
    c.results = 80;
    c.oldest_result = NOW - 1 * S;
    c.backoff_until = NOW + 1;
    EXPECT_FALSE(od::finalize_now(c));
}

TEST(Schedule, RefreshWhenDueOrWokenWhileNotInstalled) {
    od::WorkerCycle c = quiet();
    EXPECT_FALSE(od::refresh_now(c));
    c.next_refresh = NOW;
    EXPECT_TRUE(od::refresh_now(c));

    c = quiet();
    c.woken = true;
    EXPECT_FALSE(od::refresh_now(c)); // installed: a wake is a commit, not CREATE EXTENSION
    c.installed = false;
    EXPECT_TRUE(od::refresh_now(c));
    c.backoff_until = NOW + 1;
    EXPECT_FALSE(od::refresh_now(c));
}

TEST(Schedule, RefreshOnAnnouncedChangeNotWhileBackingOff) {
    od::WorkerCycle c = quiet();
    c.endpoints_changed = true;
    EXPECT_TRUE(od::refresh_now(c));    // long before next_refresh
    EXPECT_EQ(od::next_wakeup(c), NOW); // and no sleep before it
    c.backoff_until = NOW + 1;
    EXPECT_FALSE(od::refresh_now(c));
}

TEST(Schedule, RefreshPeriodIsTheSafetyPollWhereChangesAreAnnounced) {
    const int64_t poll = 1 * S;
    EXPECT_EQ(od::refresh_period_us(false, poll), poll);
    EXPECT_EQ(od::refresh_period_us(true, poll), od::kEndpointSafetyPollUs);
    EXPECT_EQ(od::refresh_period_us(true, 120 * S), 120 * S); // never more often than poll_interval
}

TEST(Schedule, PurgeOnlyOnThePurgingWorkerWhenDue) {
    od::WorkerCycle c = quiet();
    c.next_purge = NOW;
    EXPECT_FALSE(od::purge_now(c));
    c.purges = true;
    EXPECT_TRUE(od::purge_now(c));
    c.next_purge = NOW + 1;
    EXPECT_FALSE(od::purge_now(c));
    c.next_purge = NOW;
    c.backoff_until = NOW + 1;
    EXPECT_FALSE(od::purge_now(c));
}

TEST(Schedule, WakeupIsTheLeastDeadline) {
    od::WorkerCycle c = quiet();
    c.next_refresh = NOW + 900 * MS;
    c.next_poll = NOW + 800 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 800 * MS);

    c.next_quota = NOW + 300 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 300 * MS);

    c.purges = true;
    c.next_purge = NOW + 200 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 200 * MS);

    c.results = 1;
    c.oldest_result = NOW - 1 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * MS);
}

TEST(Schedule, AFullClaimClaimsAgainAtOnce) {
    od::WorkerCycle c = quiet();
    c.last_claim_full = true;
    EXPECT_EQ(od::next_wakeup(c), NOW);
    EXPECT_EQ(od::wait_ms(c.now, od::next_wakeup(c)), 0);
}

TEST(Schedule, WithoutRoomThePollAndQuotaDoNotWake) {
    od::WorkerCycle c = quiet();
    c.held = 60;
    c.last_claim_full = true;
    c.next_poll = NOW + 10 * MS;
    c.next_quota = NOW + 20 * MS;
    c.next_refresh = NOW + 1 * S;
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S); // the engine's sockets wake it when requests finish
    c.held = 0;
    c.active = false; // paused: only the reload
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S);
}

TEST(Schedule, ResultsNotYetNotedAreDueAtOnce) {
    od::WorkerCycle c = quiet();
    c.results = 3;
    c.oldest_result = 0;
    EXPECT_LE(od::next_wakeup(c), NOW);
}

TEST(Schedule, NeverWakeBeforeTheBackoffEnds) {
    od::WorkerCycle c = quiet();
    c.last_claim_full = true;
    c.results = 5;
    c.oldest_result = 0;
    c.backoff_until = NOW + 1 * S;
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S);
    // a later deadline stays later
    c = quiet();
    c.backoff_until = NOW + 100 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S);
}

TEST(Schedule, NoClaimWhileAClaimWaitsForTheStandbys) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.last_claim_full = true;
    c.claims_held = true;
    EXPECT_EQ(od::claim_now(c), 0);
    // and neither the full claim nor the poll wakes it: the standbys' position does
    c.replication_poll = NOW + 1 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * MS);
    c.claims_held = false;
    EXPECT_EQ(od::claim_now(c), 100);
}

TEST(Schedule, TheReplicationPollIsADeadline) {
    od::WorkerCycle c = quiet();
    c.replication_poll = NOW + 3 * MS;
    EXPECT_EQ(od::next_wakeup(c), NOW + 3 * MS);
    c.replication_poll = 0; // nothing waits
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S);
}

TEST(Schedule, AWakeClaimsNoSoonerThanTheSpacingAfterTheLastClaim) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.claim_spacing_us = 5 * MS;
    c.last_claim = NOW - 5 * MS + 1; // a claim (of any worker) 5 ms ago, less 1 us
    EXPECT_EQ(od::claim_now(c), 0);
    EXPECT_EQ(od::next_wakeup(c), NOW + 1); // the wait ends when the spacing does
    c.last_claim = NOW - 5 * MS;
    EXPECT_EQ(od::claim_now(c), 100);

    c.last_claim = NOW - 1 * MS;
    c.woken = false; // no commit since: the spacing sets no deadline
    EXPECT_EQ(od::next_wakeup(c), NOW + 1 * S);
    c.woken = true;
    c.last_claim_full = true; // a backlog: claim again at once
    EXPECT_EQ(od::claim_now(c), 100);
    c.last_claim_full = false;
    c.next_poll = NOW; // the poll is no wake: not spaced
    EXPECT_EQ(od::claim_now(c), 100);
}

TEST(Schedule, WithoutSpacingOrAnyClaimYetAWakeClaimsAtOnce) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.last_claim = NOW + 10; // another worker's claim noted after our clock was read
    c.claim_spacing_us = 0;
    EXPECT_EQ(od::claim_now(c), 100);
    EXPECT_EQ(od::next_wakeup(c), NOW);
    c.claim_spacing_us = 5 * MS;
    c.last_claim = 0;
    EXPECT_EQ(od::claim_now(c), 100);
}

TEST(Schedule, ResultsWaitForASpacedClaimWithinTheSpacing) {
    od::WorkerCycle c = quiet();
    c.results = 3;
    c.in_flight = 10;
    c.claim_spacing_us = 5 * MS;
    c.last_claim = NOW - 2 * MS; // the spaced claim comes at NOW + 3 ms
    c.oldest_result = NOW - 2 * MS;
    EXPECT_TRUE(od::finalize_now(c)); // no commit is waiting: the flush delay holds
    c.woken = true;
    EXPECT_FALSE(od::finalize_now(c)); // they go with the claim
    EXPECT_EQ(od::next_wakeup(c), NOW + 3 * MS);
    c.oldest_result = NOW - 2 * MS - 1; // the claim would come more than 5 ms after the oldest
    EXPECT_TRUE(od::finalize_now(c));
    c.oldest_result = NOW - 2 * MS;
    c.held = 60; // no room for a claim: none will come
    EXPECT_TRUE(od::finalize_now(c));
}

TEST(Schedule, ResultsAreHeldForASpacedClaimAtMost20ms) {
    od::WorkerCycle c = quiet();
    c.results = 3;
    c.in_flight = 10;
    c.woken = true;
    c.claim_spacing_us = 1 * S;
    c.oldest_result = NOW - 3 * MS;
    c.last_claim = NOW - 1 * S + 17 * MS; // the spaced claim comes 20 ms after the oldest result
    EXPECT_FALSE(od::finalize_now(c));
    EXPECT_EQ(od::next_wakeup(c), NOW + 17 * MS);
    c.last_claim += 1; // 20 ms and 1 us: not waited for
    EXPECT_TRUE(od::finalize_now(c));
    EXPECT_EQ(od::claim_now(c), 0); // the claim itself stays spaced
}

TEST(Schedule, ALastClaimFromAClockSetBackDoesNotHoldWakes) {
    od::WorkerCycle c = quiet();
    c.woken = true;
    c.claim_spacing_us = 5 * MS;
    c.last_claim = NOW + 5 * MS; // within the spacing: another worker's claim, a clock read apart
    EXPECT_EQ(od::claim_now(c), 0);
    EXPECT_EQ(od::next_wakeup(c), NOW + 10 * MS);
    c.last_claim = NOW + 5 * MS + 1; // further ahead: the clock was set back since
    EXPECT_EQ(od::claim_now(c), 100);
    c.last_claim = NOW + 3600 * S;
    EXPECT_EQ(od::claim_now(c), 100);
    EXPECT_EQ(od::next_wakeup(c), NOW);
}

TEST(Schedule, WaitRoundsUpAndSaturates) {
    EXPECT_EQ(od::wait_ms(NOW, NOW - 5), 0);
    EXPECT_EQ(od::wait_ms(NOW, NOW), 0);
    EXPECT_EQ(od::wait_ms(NOW, NOW + 1), 1);
    EXPECT_EQ(od::wait_ms(NOW, NOW + 1000), 1);
    EXPECT_EQ(od::wait_ms(NOW, NOW + 1001), 2);
    EXPECT_EQ(od::wait_ms(0, INT64_MAX), 0x7fffffffL);
}

TEST(Schedule, AnEndpointsShareIsItsLimitOverTheWorkersRoundedUp) {
    EXPECT_EQ(od::endpoint_share(256, 1), 256); /* one worker: the whole limit, not unbounded */
    EXPECT_EQ(od::endpoint_share(256, 2), 128);
    EXPECT_EQ(od::endpoint_share(256, 3), 86);
    EXPECT_EQ(od::endpoint_share(1, 4), 1); /* never 0: every worker can claim */
    EXPECT_EQ(od::endpoint_share(INT_MAX, 1), INT_MAX);
    EXPECT_EQ(od::endpoint_share(INT_MAX, 2), INT_MAX / 2 + 1);
    EXPECT_EQ(od::endpoint_share(0, 2), INT_MAX);  /* no limit */
    EXPECT_EQ(od::endpoint_share(-1, 2), INT_MAX); /* no limit */
    EXPECT_EQ(od::endpoint_share(10, 0), 10);      /* no worker count yet: as one */
}

TEST(Schedule, ThePipelineIsTheBatchOrTheSharesWhenLess) {
    EXPECT_EQ(od::pipeline_size(0, 500), 500); /* no endpoint */
    EXPECT_EQ(od::pipeline_size(256, 500), 256);
    EXPECT_EQ(od::pipeline_size(256, 100), 100);
    EXPECT_EQ(od::pipeline_size(500, 500), 500);
    EXPECT_EQ(od::pipeline_size(INT_MAX, 500), 500);
    EXPECT_EQ(od::pipeline_size((int64_t) INT_MAX * 3, 500), 500);
}

TEST(Schedule, OneWorkerWithABatchAboveTheLimitClaimsHalfTheLimit) {
    /* batch_size 500, one endpoint with max_in_flight 256, one worker: the
     * claim threshold is half of 256, not half of 500 (which only 6 of the
     * 256 places could ever fill) */
    od::WorkerCycle c = quiet();
    c.pipeline = od::pipeline_size(od::endpoint_share(256, 1), 500);
    c.woken = true;
    c.held = 128;
    EXPECT_EQ(od::claim_now(c), 128);
    c.held = 129;
    EXPECT_EQ(od::claim_now(c), 0);
}

} // namespace
