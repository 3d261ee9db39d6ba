// Unit tests for src/core/request.cpp: the wire headers of one delivery.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/request.hpp"
#include "core/signing.hpp"

namespace {

od::MessageHead head() {
    // 2026-11-29T19:27:07.801584Z
    return od::MessageHead{42, 3, "OrderPaid", "order", "A-17", 1795980427801584LL};
}

TEST(RequestHeaders, ContractOrderWithoutSecret) {
    std::vector<std::string> out;
    const std::string body = R"({"n": 1})";
    ASSERT_TRUE(od::build_request_headers(head(), "/postgresql/app/outbox", {"Authorization: Bearer t"},
                                          {"X-Tenant: acme"}, nullptr, 0, 1795980500, body.data(), body.size(), out));
    std::vector<std::string> want = {
        "Content-Type: application/json",
        "Idempotency-Key: 42",
        "ce-specversion: 1.0",
        "ce-id: 42",
        "ce-source: /postgresql/app/outbox",
        "ce-type: OrderPaid",
        "ce-subject: order/A-17",
        "ce-time: 2026-11-29T19:27:07.801584Z",
        "X-Outbox-Attempt: 3",
        "Authorization: Bearer t",
        "X-Tenant: acme",
    };
    EXPECT_EQ(out, want);
}

TEST(RequestHeaders, EndpointHeadersWinOverMessageHeaders) {
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(
        head(), "/s", {"Authorization: Bearer t", "X-Tenant: acme"},
        {"authorization: Bearer forged", "X-Trace: 1", "X-TENANT: other", "X-Tenant-Id: 5", "X-Tenan: 6"}, nullptr, 0,
        1795980500, "{}", 2, out));
    ASSERT_EQ(out.size(), 14u);
    std::vector<std::string> tail(out.begin() + 9, out.end());
    std::vector<std::string> want = {
        "Authorization: Bearer t",
        "X-Tenant: acme",
        "X-Trace: 1",     // names of their own are kept, in order
        "X-Tenant-Id: 5", // a longer name is another name
        "X-Tenan: 6",     // so is a shorter one
    };
    EXPECT_EQ(tail, want);
}

TEST(RequestHeaders, MessageHeadersKeptWithoutEndpointHeaders) {
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), "/s", {}, {"Authorization: Bearer m", "X-A: 1"}, nullptr, 0,
                                          1795980500, "{}", 2, out));
    ASSERT_EQ(out.size(), 11u);
    EXPECT_EQ(out[9], "Authorization: Bearer m");
    EXPECT_EQ(out[10], "X-A: 1");
}

TEST(RequestHeaders, SignedOverTheExactBody) {
    unsigned char key[64];
    const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    long keylen = od::decode_webhook_secret(secret.data(), secret.size(), key, sizeof key);
    ASSERT_EQ(keylen, 24);
    const std::string body = R"({"n": 1})";
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), "/s", {}, {}, key, static_cast<size_t>(keylen), 1795980500,
                                          body.data(), body.size(), out));
    ASSERT_EQ(out.size(), 12u);
    EXPECT_EQ(out[9], "webhook-id: 42");
    EXPECT_EQ(out[10], "webhook-timestamp: 1795980500");
    char sig[od::kSignatureSize];
    ASSERT_TRUE(
        od::webhook_signature(key, static_cast<size_t>(keylen), "42", 2, 1795980500, body.data(), body.size(), sig));
    EXPECT_EQ(out[11], std::string("webhook-signature: ") + sig);
    // a different body gives a different signature
    std::vector<std::string> other;
    const std::string body2 = R"({"n":1})";
    ASSERT_TRUE(od::build_request_headers(head(), "/s", {}, {}, key, static_cast<size_t>(keylen), 1795980500,
                                          body2.data(), body2.size(), other));
    EXPECT_NE(other[11], out[11]);
}

} // namespace
