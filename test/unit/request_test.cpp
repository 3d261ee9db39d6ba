// Unit tests for src/core/request.cpp: the wire headers of one delivery.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/request.hpp"
#include "core/signing.hpp"

namespace {

od::WireSettings wire(const char *source, const char *prefix = "") {
    return od::WireSettings{source, prefix};
}

od::MessageHead head() {
    // 2026-11-29T19:27:07.801584Z
    return od::MessageHead{42, 3, "OrderPaid", "order", "A-17", 1795980427801584LL};
}

TEST(RequestHeaders, ContractOrderWithoutSecret) {
    std::vector<std::string> out;
    const std::string body = R"({"n": 1})";
    ASSERT_TRUE(od::build_request_headers(head(), wire("/postgresql/app/outbox"), {"Authorization: Bearer t"},
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
        head(), wire("/s"), {"Authorization: Bearer t", "X-Tenant: acme"},
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
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {"Authorization: Bearer m", "X-A: 1"}, nullptr, 0,
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
    od::SigningKey sk{key, static_cast<size_t>(keylen)};
    const std::string body = R"({"n": 1})";
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {}, &sk, 1, 1795980500,
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
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {}, &sk, 1, 1795980500,
                                          body2.data(), body2.size(), other));
    EXPECT_NE(other[11], out[11]);
}

TEST(RequestHeaders, CloudEventsValuesArePercentEncoded) {
    // CloudEvents HTTP binding 3.1.3.2: bytes outside U+0021..U+007E, space, '"' and '%'
    od::MessageHead m{7, 1, "commande.pay\xc3\xa9" "e ", "ordre \"x\"", "100%", 1795980427801584LL};
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(m, wire("/src of\tme"), {}, {}, nullptr, 0, 1795980500, "{}", 2, out));
    EXPECT_EQ(out[3], "ce-id: 7");
    EXPECT_EQ(out[4], "ce-source: /src%20of%09me");
    EXPECT_EQ(out[5], "ce-type: commande.pay%C3%A9e%20");
    EXPECT_EQ(out[6], "ce-subject: ordre%20%22x%22/100%25");
    // printable ASCII other than space, '"' and '%' is kept as it is
    std::string kept;
    const std::string printable = "a-Z_0~!#$&'()*+,/:;<=>?@[\\]^`{|}";
    od::append_ce_encoded(kept, printable.data(), printable.size());
    EXPECT_EQ(kept, printable);
    std::string edge;
    od::append_ce_encoded(edge, "\x7f\x80\xff", 3);
    EXPECT_EQ(edge, "%7F%80%FF");
}

TEST(RequestHeaders, IdPrefixInEveryIdAndInTheSignedContent) {
    unsigned char key[64];
    const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    long keylen = od::decode_webhook_secret(secret.data(), secret.size(), key, sizeof key);
    ASSERT_EQ(keylen, 24);
    od::SigningKey sk{key, static_cast<size_t>(keylen)};
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s", "db1:"), {}, {}, &sk, 1, 1795980500, "{}", 2, out));
    EXPECT_EQ(out[1], "Idempotency-Key: db1:42");
    EXPECT_EQ(out[3], "ce-id: db1:42");
    EXPECT_EQ(out[9], "webhook-id: db1:42");
    char sig[od::kSignatureSize];
    ASSERT_TRUE(od::webhook_signature(key, sk.len, "db1:42", 6, 1795980500, "{}", 2, sig));
    EXPECT_EQ(out[11], std::string("webhook-signature: ") + sig);
}

TEST(RequestHeaders, OneSignaturePerKeyNewestFirst) {
    unsigned char k1[64], k2[64];
    const std::string s1 = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const std::string s2 = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY";
    long n1 = od::decode_webhook_secret(s1.data(), s1.size(), k1, sizeof k1);
    long n2 = od::decode_webhook_secret(s2.data(), s2.size(), k2, sizeof k2);
    ASSERT_GT(n1, 0);
    ASSERT_GT(n2, 0);
    od::SigningKey keys[2] = {{k2, static_cast<size_t>(n2)}, {k1, static_cast<size_t>(n1)}};
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {}, keys, 2, 1795980500, "{}", 2, out));
    char a[od::kSignatureSize], b[od::kSignatureSize];
    ASSERT_TRUE(od::webhook_signature(k2, keys[0].len, "42", 2, 1795980500, "{}", 2, a));
    ASSERT_TRUE(od::webhook_signature(k1, keys[1].len, "42", 2, 1795980500, "{}", 2, b));
    ASSERT_EQ(out.size(), 12u);
    EXPECT_EQ(out[11], std::string("webhook-signature: ") + a + " " + b);
}

TEST(RequestHeaders, TraceContextAlsoAsCloudEventsExtension) {
    const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    std::vector<std::string> out;
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {"X-A: 1", "Traceparent: " + tp, "tracestate: congo=t61rcWkgMzE, rojo=00f0"},
                                          nullptr, 0, 1795980500, "{}", 2, out));
    std::vector<std::string> want = {
        "Content-Type: application/json",
        "Idempotency-Key: 42",
        "ce-specversion: 1.0",
        "ce-id: 42",
        "ce-source: /s",
        "ce-type: OrderPaid",
        "ce-subject: order/A-17",
        "ce-time: 2026-11-29T19:27:07.801584Z",
        "ce-traceparent: " + tp,
        "ce-tracestate: congo=t61rcWkgMzE,%20rojo=00f0",
        "X-Outbox-Attempt: 3",
        "X-A: 1",
        "Traceparent: " + tp,
        "tracestate: congo=t61rcWkgMzE, rojo=00f0",
    };
    EXPECT_EQ(out, want);
    // a header of the endpoint's wins, and is no trace context of the message
    out.clear();
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {"traceparent: " + tp}, {"traceparent: 00-x"}, nullptr, 0,
                                          1795980500, "{}", 2, out));
    for (const std::string &h : out) EXPECT_NE(h.rfind("ce-trace", 0), 0u) << h;
    // a longer or shorter name is another header
    out.clear();
    ASSERT_TRUE(od::build_request_headers(head(), wire("/s"), {}, {"traceparents: a", "tracestat: b"}, nullptr, 0,
                                          1795980500, "{}", 2, out));
    EXPECT_EQ(out.size(), 11u);
}

} // namespace
