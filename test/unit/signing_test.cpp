// Unit tests for src/core/signing.cpp: Standard Webhooks secrets and
// signatures, RFC 3339 timestamps.
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <ctime>
#include <string>

#include "core/signing.hpp"
#include "core/validate.hpp"

namespace {

long decode(const std::string &s, unsigned char *key, std::size_t cap) {
    return od::decode_webhook_secret(s.data(), s.size(), key, cap);
}

std::string sign(const unsigned char *key, std::size_t keylen, const std::string &id, int64_t ts,
                 const std::string &body) {
    char out[od::kSignatureSize];
    std::memset(out, 'X', sizeof out);
    bool ok = od::webhook_signature(key, keylen, id.data(), id.size(), ts, body.data(), body.size(), out);
    EXPECT_TRUE(ok);
    EXPECT_EQ(std::strlen(out), od::kSignatureSize - 1);
    return out;
}

std::string hex(const unsigned char *p, std::size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (std::size_t i = 0; i < n; i++) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

std::string rfc3339(int64_t us) {
    char out[od::kRfc3339Size];
    std::memset(out, 'X', sizeof out);
    std::size_t n = od::format_rfc3339(us, out);
    EXPECT_EQ(n, std::strlen(out));
    return std::string(out, n);
}

// ---------------------------------------------------------------- secrets

TEST(Secret, DecodesTheStandardWebhooksExample) {
    unsigned char key[od::kMaxSecretBytes];
    long n = decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, sizeof key);
    ASSERT_EQ(n, 24);
    EXPECT_EQ(hex(key, 24), "31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0");
}

TEST(Secret, PaddingIsOptional) {
    unsigned char key[64];
    // 16 bytes "0123456789abcdef" in base64 is "MDEyMzQ1Njc4OWFiY2RlZg==".
    EXPECT_EQ(decode("whsec_MDEyMzQ1Njc4OWFiY2RlZg==", key, sizeof key), 16);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(key), 16), "0123456789abcdef");
    EXPECT_EQ(decode("whsec_MDEyMzQ1Njc4OWFiY2RlZg", key, sizeof key), 16);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(key), 16), "0123456789abcdef");
}

TEST(Secret, RejectsMalformedSecrets) {
    unsigned char key[od::kMaxSecretBytes + 16];
    EXPECT_EQ(decode("", key, sizeof key), -1);
    EXPECT_EQ(decode("whsec_", key, sizeof key), -1);
    EXPECT_EQ(decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, sizeof key), -1);        // no prefix
    EXPECT_EQ(decode("WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, sizeof key), -1);  // prefix is case-sensitive
    EXPECT_EQ(decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa!w", key, sizeof key), -1);  // not base64
    EXPECT_EQ(decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwA", key, sizeof key), -1); // 4n+1 characters
    EXPECT_EQ(decode("whsec_MDEyMzQ1Njc4OWFiY2Rl", key, sizeof key), -1);              // 15 bytes: too short
    EXPECT_EQ(decode("whsec_" + std::string(344, 'A'), key, sizeof key), -1);          // 258 bytes: too long
    EXPECT_EQ(decode("whsec_" + std::string(4000, 'A'), key, sizeof key), -1);         // far too long
    EXPECT_EQ(od::decode_webhook_secret(nullptr, 10, key, sizeof key), -1);
    EXPECT_EQ(od::decode_webhook_secret("whsec_MDEyMzQ1Njc4OWFiY2RlZg==", 30, nullptr, 64), -1);
}

TEST(Secret, LargestSecretDecodes) {
    unsigned char raw[od::kMaxSecretBytes];
    for (std::size_t i = 0; i < sizeof raw; i++) raw[i] = static_cast<unsigned char>(i * 7 + 1);
    char b64[4 * ((od::kMaxSecretBytes + 2) / 3)];
    std::size_t n = od::base64_encode(raw, sizeof raw, b64);
    std::string secret = "whsec_" + std::string(b64, n);
    unsigned char key[od::kMaxSecretBytes];
    ASSERT_EQ(decode(secret, key, sizeof key), static_cast<long>(od::kMaxSecretBytes));
    EXPECT_EQ(std::memcmp(key, raw, sizeof raw), 0);
}

TEST(Secret, RespectsKeyCapacity) {
    unsigned char key[32];
    std::memset(key, 0xee, sizeof key);
    EXPECT_EQ(decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, 23), -1);
    for (unsigned char b : key) EXPECT_EQ(b, 0xee); // nothing written when it does not fit
    EXPECT_EQ(decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, 24), 24);
    EXPECT_EQ(key[24], 0xee);
}

// ------------------------------------------------------------- signatures

TEST(Signature, StandardWebhooksTestVector) {
    // The example of the Standard Webhooks specification (also the svix
    // libraries' TestWebhookSign); cross-checked with
    //   printf 'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}' |
    //     openssl dgst -sha256 -mac HMAC -macopt hexkey:31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0 -binary |
    //     base64
    unsigned char key[64];
    long n = decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", key, sizeof key);
    ASSERT_EQ(n, 24);
    EXPECT_EQ(
        sign(key, static_cast<std::size_t>(n), "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, "{\"test\": 2432232314}"),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

TEST(Signature, MoreVectors) {
    // Expected values computed with Python 3.11 when this test was written:
    //   "v1," + base64.b64encode(hmac.new(key, f"{id}.{ts}.".encode() + body, hashlib.sha256).digest())
    unsigned char k32[32];
    for (int i = 0; i < 32; i++) k32[i] = static_cast<unsigned char>(i); // bytes(range(32))
    EXPECT_EQ(sign(k32, 32, "evt_1", -5, std::string("a\0b", 3)), "v1,tqo2iZCqlU1xRteQVgJULz7YOtipEEL1VrIFUyjvUi4=");
    EXPECT_EQ(sign(k32, 32, "", INT64_MAX, ""), "v1,sL6TeP4S+tqxoD02Xr39Ep9IflZordgIb3I75fO2s2U=");
    EXPECT_EQ(sign(k32, 32, "id", INT64_MIN, "{}"), "v1,gI3Xv6mo+efwvRX+yNDO9sk1tGBf/Y2htPz2FgD6xNk=");
    // An empty key is still a key (HMAC pads it with zeros).
    EXPECT_EQ(sign(nullptr, 0, "m", 0, ""), "v1,TDMrqlhMHNpfFcI+fefY/xl0IfGlXGhntyvT01UD4iY=");
}

TEST(Signature, MatchesOneShotHmacForLargeBodiesAndKeys) {
    // keys shorter than, as long as and longer than the SHA-256 block (a longer one is hashed first)
    for (std::size_t keylen : {std::size_t{16}, std::size_t{40}, std::size_t{64}, std::size_t{65}, std::size_t{256}}) {
        unsigned char key[256];
        for (std::size_t i = 0; i < keylen; i++) key[i] = static_cast<unsigned char>(0xa5 ^ i);
        for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                                std::size_t{4096}, std::size_t{1} << 20}) {
            std::string body(len, '\0');
            for (std::size_t i = 0; i < len; i++) body[i] = static_cast<char>((i * 131) & 0xff);
            std::string id = "01J8Z3M0X6K9Q2R5T7V1W3Y5A7";
            int64_t ts = 1795980427;
            std::string msg = id + "." + std::to_string(ts) + "." + body;
            unsigned char mac[32];
            unsigned int maclen = 0;
            ASSERT_NE(HMAC(EVP_sha256(), key, static_cast<int>(keylen),
                           reinterpret_cast<const unsigned char *>(msg.data()), msg.size(), mac, &maclen),
                      nullptr);
            ASSERT_EQ(maclen, 32u);
            char b64[45];
            std::size_t n = od::base64_encode(mac, 32, b64);
            EXPECT_EQ(sign(key, keylen, id, ts, body), "v1," + std::string(b64, n)) << len << " " << keylen;
        }
    }
}

TEST(Signature, EveryInputMatters) {
    unsigned char key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    std::string base = sign(key, 16, "msg_1", 1000, "{}");
    EXPECT_NE(sign(key, 15, "msg_1", 1000, "{}"), base);
    EXPECT_NE(sign(key, 16, "msg_2", 1000, "{}"), base);
    EXPECT_NE(sign(key, 16, "msg_1", 1001, "{}"), base);
    EXPECT_NE(sign(key, 16, "msg_1", 1000, "{ }"), base);
    // The separators are part of the message: "a.1" + "0.x" differs from "a.10" + ".x".
    EXPECT_NE(sign(key, 16, "msg_1.1", 0, "{}"), sign(key, 16, "msg_1", 10, "{}"));
    EXPECT_EQ(sign(key, 16, "msg_1", 1000, "{}"), base); // deterministic
}

TEST(Signature, NullBodyWithZeroLength) {
    unsigned char key[16] = {};
    char out[od::kSignatureSize];
    ASSERT_TRUE(od::webhook_signature(key, 16, "m", 1, 0, nullptr, 0, out));
    EXPECT_EQ(std::string(out), sign(key, 16, "m", 0, ""));
}

// ---------------------------------------------------------------- RFC 3339

TEST(Rfc3339, KnownInstants) {
    EXPECT_EQ(rfc3339(0), "1970-01-01T00:00:00.000000Z");
    EXPECT_EQ(rfc3339(1), "1970-01-01T00:00:00.000001Z");
    EXPECT_EQ(rfc3339(1795980427801584), "2026-11-29T19:27:07.801584Z"); // the header's example
    EXPECT_EQ(rfc3339(951782400000123), "2000-02-29T00:00:00.000123Z");
    EXPECT_EQ(rfc3339(INT64_C(1709208000) * 1000000 + 999999), "2024-02-29T12:00:00.999999Z");
    EXPECT_EQ(rfc3339(INT64_C(4102444799) * 1000000), "2099-12-31T23:59:59.000000Z");
}

TEST(Rfc3339, BeforeTheEpochUsesFloorDivision) {
    EXPECT_EQ(rfc3339(-1), "1969-12-31T23:59:59.999999Z");
    EXPECT_EQ(rfc3339(-1000000), "1969-12-31T23:59:59.000000Z");
    EXPECT_EQ(rfc3339(-1000001), "1969-12-31T23:59:58.999999Z");
    EXPECT_EQ(rfc3339(-86400 * INT64_C(1000000)), "1969-12-31T00:00:00.000000Z");
    EXPECT_EQ(rfc3339(-14182939500000), "1969-07-20T20:17:40.500000Z");
    EXPECT_EQ(rfc3339(-94608000000000), "1967-01-02T00:00:00.000000Z");
    EXPECT_EQ(rfc3339(INT64_C(-62135596800) * 1000000), "0001-01-01T00:00:00.000000Z");
}

TEST(Rfc3339, OutOfRangeIsClamped) {
    EXPECT_EQ(rfc3339(INT64_C(253402300799) * 1000000 + 999999), "9999-12-31T23:59:59.999999Z");
    EXPECT_EQ(rfc3339(INT64_C(253402300800) * 1000000), "9999-12-31T23:59:59.999999Z");
    EXPECT_EQ(rfc3339(INT64_MAX), "9999-12-31T23:59:59.999999Z");
    EXPECT_EQ(rfc3339(INT64_C(-62167219200) * 1000000), "0000-01-01T00:00:00.000000Z");
    EXPECT_EQ(rfc3339(INT64_C(-62167219200) * 1000000 - 1), "0000-01-01T00:00:00.000000Z");
    EXPECT_EQ(rfc3339(INT64_MIN), "0000-01-01T00:00:00.000000Z");
}

TEST(Rfc3339, AgreesWithGmtime) {
    // Every 3 days + 7h 11m 13s from 1901 to 2200, microseconds varying.
    int64_t step = 3 * 86400 + 7 * 3600 + 11 * 60 + 13;
    int i = 0;
    for (int64_t t = INT64_C(-2145916800); t < INT64_C(7258118400); t += step, i++) {
        std::time_t tt = static_cast<std::time_t>(t);
        std::tm tm;
        ASSERT_NE(gmtime_r(&tt, &tm), nullptr);
        char want[40];
        std::strftime(want, sizeof want, "%Y-%m-%dT%H:%M:%S", &tm);
        int us = (i * 7919) % 1000000;
        char frac[16];
        std::snprintf(frac, sizeof frac, ".%06dZ", us);
        ASSERT_EQ(rfc3339(t * 1000000 + us), std::string(want) + frac);
    }
}

} // namespace
