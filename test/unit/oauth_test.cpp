// Unit tests for core/oauth: the client-credentials request, the reading of
// token answers (hostile ones included), and the refresh schedule.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/oauth.hpp"
#include "core/validate.hpp"

using namespace od;

namespace {
TokenAnswer read(long status, const std::string &body) {
    TokenAnswer a;
    read_token_answer(0, nullptr, status, body.data(), body.size(), a);
    return a;
}
std::string b64(const std::string &s) {
    std::string out(4 * ((s.size() + 2) / 3), '\0');
    out.resize(base64_encode(reinterpret_cast<const unsigned char *>(s.data()), s.size(), &out[0]));
    return out;
}
} // namespace

TEST(OAuthRequest, BasicAuthOfFormEncodedCredentialsAndFormBody) {
    OAuthClient c{"https://auth.example/token", "my client", "s3cr&t:x/é", "orders.write audit"};
    std::vector<std::string> h;
    std::string body;
    ASSERT_TRUE(build_token_request(c, h, body));
    ASSERT_EQ(h.size(), 3u);
    EXPECT_EQ(h[0], "Authorization: Basic " + b64("my+client:s3cr%26t%3Ax%2F%C3%A9"));
    EXPECT_EQ(h[1], "Content-Type: application/x-www-form-urlencoded");
    EXPECT_EQ(h[2], "Accept: application/json");
    EXPECT_EQ(body, "grant_type=client_credentials&scope=orders.write+audit");
}

TEST(OAuthRequest, NoScopeNoScopeParameter) {
    OAuthClient c{"https://auth.example/token", "id", "secret", ""};
    std::vector<std::string> h{"stale"};
    std::string body;
    ASSERT_TRUE(build_token_request(c, h, body));
    EXPECT_EQ(body, "grant_type=client_credentials");
    EXPECT_EQ(h.size(), 3u);
}

TEST(OAuthAnswer, AcceptsABearerToken) {
    TokenAnswer a = read(200, R"({"access_token":"eyJ.abc-_~+/=","token_type":"bearer","expires_in":3600,"scope":"x"})");
    ASSERT_TRUE(a.ok) << a.error;
    EXPECT_EQ(a.access_token, "eyJ.abc-_~+/=");
    EXPECT_EQ(a.lifetime_s, 3600);
}

TEST(OAuthAnswer, SkipsNestedMembersAndTakesStringExpiresIn) {
    TokenAnswer a = read(200, " {\"x\":{\"a\":[1,2,{\"b\":null}],\"c\":true},\"access_token\":\"t\\/1\",\"expires_in\":\"90\"} ");
    ASSERT_TRUE(a.ok) << a.error;
    EXPECT_EQ(a.access_token, "t/1");
    EXPECT_EQ(a.lifetime_s, 90);
}

TEST(OAuthAnswer, DefaultAndCappedLifetime) {
    EXPECT_EQ(read(200, R"({"access_token":"t"})").lifetime_s, kDefaultTokenLifetimeS);
    EXPECT_EQ(read(200, R"({"access_token":"t","expires_in":1e300})").lifetime_s, kMaxTokenLifetimeS);
    EXPECT_EQ(read(200, R"({"access_token":"t","expires_in":59.9})").lifetime_s, 59);
    EXPECT_FALSE(read(200, R"({"access_token":"t","expires_in":0})").ok);
    EXPECT_FALSE(read(200, R"({"access_token":"t","expires_in":-5})").ok);
    EXPECT_FALSE(read(200, R"({"access_token":"t","expires_in":1e-20})").ok);
}

TEST(OAuthAnswer, ErrorsNeverQuoteTheBodyOrTheToken) {
    TokenAnswer a = read(401, R"({"error":"invalid_client","error_description":"secret hunter2 is wrong"})");
    EXPECT_FALSE(a.ok);
    EXPECT_STREQ(a.error, "token endpoint answered 401 (invalid_client)");
    a = read(503, "<html>secret hunter2</html>");
    EXPECT_STREQ(a.error, "token endpoint answered 503");
    a = read(400, R"({"error":"bad code with spaces"})");
    EXPECT_STREQ(a.error, "token endpoint answered 400");
    a = read(200, R"({"token_type":"Bearer"})");
    EXPECT_STREQ(a.error, "token endpoint answered 200 without an access_token");
    a = read(200, R"({"access_token":"hunter2","token_type":"mac"})");
    EXPECT_FALSE(a.ok);
    EXPECT_EQ(std::string(a.error).find("hunter2"), std::string::npos);
    EXPECT_TRUE(a.access_token.empty());
}

TEST(OAuthAnswer, RejectsMalformedAndUnsendableTokens) {
    for (const char *bad : {"", "[]", "{", "{\"access_token\":\"t\"", "{\"access_token\":\"t\"} x",
                            "{\"access_token\":\"t\",}", "{\"access_token\":\"a\\u0000b\"}",
                            "{\"access_token\":\"a b\"}", "{\"access_token\":\"a\\r\\nX-Evil: 1\"}",
                            "{\"access_token\":\"caf\\u00e9\"}", "{\"access_token\":\"\"}",
                            "{\"access_token\":123}", "{\"access_token\":\"t\",\"n\":01x}"}) {
        TokenAnswer a = read(200, bad);
        EXPECT_FALSE(a.ok) << bad;
        EXPECT_TRUE(a.error[0] != '\0') << bad;
    }
    std::string big = "{\"access_token\":\"" + std::string(kMaxAccessToken + 1, 'a') + "\"}";
    EXPECT_STREQ(read(200, big).error, "access token is longer than 4096 bytes");
    std::string fits = "{\"access_token\":\"" + std::string(kMaxAccessToken, 'a') + "\"}";
    EXPECT_TRUE(read(200, fits).ok);
    /* deep nesting is refused, not recursed into without bound */
    std::string deep = "{\"x\":" + std::string(10000, '[') + std::string(10000, ']') + ",\"access_token\":\"t\"}";
    EXPECT_FALSE(read(200, deep).ok);
}

TEST(OAuthAnswer, TransportErrorSaysWhat) {
    TokenAnswer a;
    read_token_answer(7, "Failed to connect to 127.0.0.1 port 1", 0, nullptr, 0, a);
    EXPECT_FALSE(a.ok);
    EXPECT_STREQ(a.error, "token request failed: Failed to connect to 127.0.0.1 port 1");
}

TEST(OAuthTimes, RefreshBeforeExpiryAndStopShortlyBefore) {
    TokenTimes t = token_times(1000, 3600);
    EXPECT_EQ(t.refresh_at_ms, 1000 + 3600000 - 60000);
    EXPECT_EQ(t.usable_until_ms, 1000 + 3600000 - 5000);
    t = token_times(0, 4); /* short-lived: a quarter and a tenth */
    EXPECT_EQ(t.refresh_at_ms, 3000);
    EXPECT_EQ(t.usable_until_ms, 3600);
    EXPECT_LT(t.refresh_at_ms, t.usable_until_ms);
    t = token_times(0, 1);
    EXPECT_EQ(t.refresh_at_ms, 750);
    EXPECT_EQ(t.usable_until_ms, 900);
    t = token_times(0, INT64_MAX);
    EXPECT_EQ(t.usable_until_ms, kMaxTokenLifetimeS * 1000 - 5000);
}

TEST(OAuthTimes, FailedFetchesBackOff) {
    EXPECT_EQ(token_retry_delay_ms(0), 1000);
    EXPECT_EQ(token_retry_delay_ms(1), 1000);
    EXPECT_EQ(token_retry_delay_ms(2), 2000);
    EXPECT_EQ(token_retry_delay_ms(6), 32000);
    EXPECT_EQ(token_retry_delay_ms(7), 60000);
    EXPECT_EQ(token_retry_delay_ms(1000000), 60000);
}
