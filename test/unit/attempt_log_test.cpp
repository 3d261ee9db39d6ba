// Unit tests for src/core/attempt_log.cpp and the attempt log's helpers in
// src/core/outcome.cpp (error classes, sanitised bodies).
#include <gtest/gtest.h>

#include <curl/curl.h>

#include <cstring>
#include <string>

#include "core/attempt_log.hpp"
#include "core/outcome.hpp"

namespace {

constexpr int64_t kDayUs = INT64_C(86400000000);

TEST(AttemptLog, DayIsUtcFloor) {
    EXPECT_EQ(od::attempt_day(0), 0);
    EXPECT_EQ(od::attempt_day(kDayUs - 1), 0);
    EXPECT_EQ(od::attempt_day(kDayUs), 1);
    EXPECT_EQ(od::attempt_day(-1), -1);
    EXPECT_EQ(od::attempt_day(-kDayUs), -1);
    EXPECT_EQ(od::attempt_day(-kDayUs - 1), -2);
    // 2026-12-02 00:00:00 UTC is day 20789
    EXPECT_EQ(od::attempt_day(INT64_C(1796169600) * 1000000), 20789);
}

TEST(AttemptLog, BucketIsDayModuloRing) {
    EXPECT_EQ(od::attempt_bucket(0), 0);
    EXPECT_EQ(od::attempt_bucket(31), 31);
    EXPECT_EQ(od::attempt_bucket(32), 0);
    EXPECT_EQ(od::attempt_bucket(20789), 20789 % 32);
    EXPECT_EQ(od::attempt_bucket(-1), 31);
}

TEST(AttemptLog, KeepsTodayAndRetentionDaysBefore) {
    const int64_t today = 20789;
    int kept = 0;
    for (int b = 0; b < od::kAttemptBuckets; b++) kept += od::attempt_bucket_kept(b, today, 7);
    EXPECT_EQ(kept, 8);
    for (int back = 0; back <= 7; back++) EXPECT_TRUE(od::attempt_bucket_kept(od::attempt_bucket(today - back), today, 7));
    EXPECT_FALSE(od::attempt_bucket_kept(od::attempt_bucket(today - 8), today, 7));
    // tomorrow's partition is never kept, so it is emptied before tomorrow starts
    EXPECT_FALSE(od::attempt_bucket_kept(od::attempt_bucket(today + 1), today, 7));
    EXPECT_FALSE(od::attempt_bucket_kept(od::attempt_bucket(today + 1), today, 1000));
}

TEST(AttemptLog, RetentionIsClamped) {
    const int64_t today = 100;
    int kept0 = 0, keptmax = 0, keptneg = 0;
    for (int b = 0; b < od::kAttemptBuckets; b++) {
        kept0 += od::attempt_bucket_kept(b, today, 0);
        keptmax += od::attempt_bucket_kept(b, today, 1000000);
        keptneg += od::attempt_bucket_kept(b, today, -5);
    }
    EXPECT_EQ(kept0, 1);
    EXPECT_EQ(keptneg, 1);
    EXPECT_EQ(keptmax, od::kMaxAttemptRetentionDays + 1);
    EXPECT_EQ(keptmax, od::kAttemptBuckets - 1);
}

TEST(AttemptLog, TransportErrorClasses) {
    EXPECT_EQ(od::transport_error_class(0), nullptr);
    EXPECT_STREQ(od::transport_error_class(CURLE_OPERATION_TIMEDOUT), "timeout");
    EXPECT_STREQ(od::transport_error_class(CURLE_COULDNT_RESOLVE_HOST), "dns");
    EXPECT_STREQ(od::transport_error_class(CURLE_COULDNT_CONNECT), "connect");
    EXPECT_STREQ(od::transport_error_class(CURLE_PEER_FAILED_VERIFICATION), "tls");
    EXPECT_STREQ(od::transport_error_class(CURLE_SSL_CONNECT_ERROR), "tls");
    EXPECT_STREQ(od::transport_error_class(CURLE_RECV_ERROR), "connection");
    EXPECT_STREQ(od::transport_error_class(CURLE_SEND_ERROR), "connection");
    EXPECT_STREQ(od::transport_error_class(CURLE_GOT_NOTHING), "protocol");
    EXPECT_STREQ(od::transport_error_class(CURLE_WEIRD_SERVER_REPLY), "protocol");
    EXPECT_STREQ(od::transport_error_class(CURLE_UNSUPPORTED_PROTOCOL), "other");
}

std::string sanitize(const std::string &in, std::size_t outsz = 1025) {
    std::string out(outsz, 'X');
    std::size_t n = od::sanitize_text(in.data(), in.size(), &out[0], outsz);
    EXPECT_EQ(std::strlen(out.c_str()), n);
    return std::string(out.c_str());
}

TEST(AttemptLog, SanitizedBody) {
    EXPECT_EQ(sanitize("{\"ok\":true}"), "{\"ok\":true}");
    EXPECT_EQ(sanitize(""), "");
    EXPECT_EQ(sanitize("   \n"), "");
    EXPECT_EQ(sanitize("  line one\r\n\tline two\x01"), "line one line two");
    EXPECT_EQ(sanitize(std::string("a\0b", 3)), "a b");
    EXPECT_EQ(sanitize("caf\xc3\xa9"), "caf\xc3\xa9");
    EXPECT_EQ(sanitize("bad \xff byte"), "bad ? byte");
    // cut to fit, marked, never splitting a character
    std::string longer(2000, 'x');
    std::string s = sanitize(longer, 1025);
    EXPECT_LE(s.size(), 1024u);
    EXPECT_EQ(s.substr(s.size() - 3), "...");
    std::string e = sanitize(std::string(10, 'a') + "\xc3\xa9\xc3\xa9", 16);
    EXPECT_LE(e.size(), 15u);
    EXPECT_EQ(e.find('\xc3') == std::string::npos || e.find("\xc3\xa9") != std::string::npos, true);
    EXPECT_EQ(sanitize("abc", 1), "");
    EXPECT_EQ(sanitize("abc", 2), "");
}

} // namespace
