// Unit tests for src/core/policy.cpp: what an answered delivery means for
// its endpoint, row by row against the outcome table (README "What happens
// to a delivery"), with the verdict each answer gets from classify().
#include <gtest/gtest.h>

#include <cstring>

#include <curl/curl.h>

#include "core/outcome.hpp"
#include "core/policy.hpp"

namespace {

using od::EndpointSignal;
using od::Verdict;

const int kDefer[] = {409};

od::OutcomePolicy policy() {
    od::OutcomePolicy p;
    p.defer_statuses = kDefer;
    p.n_defer_statuses = 1;
    p.max_attempts = 3;
    p.backoff = od::BackoffPolicy{1000, 300000};
    p.defer_delay_ms = 30000;
    p.max_retry_after_s = 3600;
    return p;
}

// the signal for an answer, through classification as the workers do it
EndpointSignal signal_of(long status, int attempts = 1, int transport_error = 0) {
    od::DeliveryResult r;
    r.transport_error = transport_error;
    r.transport_message = transport_error ? "connection refused" : nullptr;
    r.http_status = status;
    r.retry_after = nullptr;
    r.retry_after_len = 0;
    od::Outcome o = od::classify(r, policy(), attempts, 1795980427, 0, nullptr, 0);
    return od::endpoint_signal(o.verdict, status);
}

TEST(Policy, TwoHundredsAreSuccesses) {
    EXPECT_EQ(signal_of(200), EndpointSignal::Success);
    EXPECT_EQ(signal_of(204), EndpointSignal::Success);
    EXPECT_EQ(signal_of(299, 3), EndpointSignal::Success);
}

TEST(Policy, RetryableAnswersAreFailures) {
    for (long s : {408L, 425L, 429L, 500L, 502L, 503L, 599L}) EXPECT_EQ(signal_of(s), EndpointSignal::Failure) << s;
    // and still when the attempts ran out on a 5xx or a transport error (dead)
    EXPECT_EQ(signal_of(503, 3), EndpointSignal::Failure);
    EXPECT_EQ(signal_of(0, 1, CURLE_COULDNT_CONNECT), EndpointSignal::Failure);
    EXPECT_EQ(signal_of(0, 3, CURLE_OPERATION_TIMEDOUT), EndpointSignal::Failure);
}

TEST(Policy, OtherDeadAnswersAndDefersAreNeutral) {
    for (long s : {301L, 400L, 401L, 404L, 410L, 422L}) EXPECT_EQ(signal_of(s), EndpointSignal::Neutral) << s;
    EXPECT_EQ(signal_of(409), EndpointSignal::Neutral); // a defer status of this endpoint
}

TEST(Policy, ExhaustedRetryableFourHundredsStayNeutral) {
    // 429 with its attempts used up is dead with a 4xx status: the rule reads the verdict and the status
    EXPECT_EQ(od::endpoint_signal(Verdict::Dead, 429), EndpointSignal::Neutral);
    EXPECT_EQ(od::endpoint_signal(Verdict::Dead, 0), EndpointSignal::Failure);
    EXPECT_EQ(od::endpoint_signal(Verdict::Dead, 500), EndpointSignal::Failure);
    EXPECT_EQ(od::endpoint_signal(Verdict::Defer, 503), EndpointSignal::Neutral);
}

TEST(Policy, GoneDisablesTheEndpointAndPutsTheMessageBack) {
    EXPECT_TRUE(od::answer_disables_endpoint(410));
    for (long s : {0L, 200L, 404L, 409L, 451L, 500L}) EXPECT_FALSE(od::answer_disables_endpoint(s)) << s;
    od::GoneFinalize g = od::finalize_after_gone(30000);
    EXPECT_EQ(g.verdict, Verdict::Retry);
    EXPECT_EQ(g.delay_ms, 30000);
    EXPECT_TRUE(g.refund);
    EXPECT_STREQ(g.error, "HTTP 410 Gone: the endpoint was disabled");
}

} // namespace
