// Unit tests for src/core/validate.cpp: URL, header and secret checks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/validate.hpp"

namespace {

const char *url(const std::string &s) {
    return od::check_url(s.data(), s.size());
}
const char *hname(const std::string &s) {
    return od::check_header_name(s.data(), s.size());
}
const char *hvalue(const std::string &s) {
    return od::check_header_value(s.data(), s.size());
}
const char *secret(const std::string &s) {
    return od::check_signing_secret(s.data(), s.size());
}
bool reserved(const std::string &s) {
    return od::header_name_is_reserved(s.data(), s.size());
}

TEST(Url, AcceptsHttpAndHttps) {
    EXPECT_EQ(url("http://example.com"), nullptr);
    EXPECT_EQ(url("https://example.com/hooks/orders?x=1&y=2"), nullptr);
    EXPECT_EQ(url("HTTPS://Example.COM:8443/a"), nullptr);
    EXPECT_EQ(url("http://127.0.0.1:8080/hook"), nullptr);
    EXPECT_EQ(url("http://[::1]:8080/hook"), nullptr);
    EXPECT_EQ(url("http://[2001:db8::1]/"), nullptr);
    EXPECT_EQ(url("http://host/path%20with%20escapes"), nullptr);
}

TEST(Url, RejectsOtherSchemes) {
    EXPECT_NE(url("ftp://example.com/"), nullptr);
    EXPECT_NE(url("file:///etc/passwd"), nullptr);
    EXPECT_NE(url("javascript:alert(1)"), nullptr);
    EXPECT_NE(url("example.com/hook"), nullptr);
    EXPECT_NE(url("http:/example.com"), nullptr);
    EXPECT_NE(url(""), nullptr);
}

TEST(Url, RejectsWhitespaceAndControlCharacters) {
    EXPECT_NE(url("http://example.com/a b"), nullptr);
    EXPECT_NE(url("http://example.com/a\tb"), nullptr);
    EXPECT_NE(url("http://example.com/\r\nHost: evil"), nullptr);
    EXPECT_NE(url(std::string("http://example.com/\0x", 21)), nullptr);
    EXPECT_NE(url("http://example.com/\x7f"), nullptr);
    EXPECT_NE(url(" http://example.com/"), nullptr);
    EXPECT_NE(url("http://exämple.com/"), nullptr);
}

TEST(Url, RejectsUserinfoFragmentsAndBadAuthorities) {
    EXPECT_STREQ(url("http://user:pw@example.com/"),
                 "must not contain user information (put credentials in the endpoint's headers)");
    EXPECT_EQ(url("http://example.com/a@b"), nullptr); // '@' in the path is fine
    EXPECT_STREQ(url("http://example.com/a#frag"), "must not contain a fragment");
    EXPECT_STREQ(url("http:///path"), "has no host");
    EXPECT_STREQ(url("http://:80/"), "has no host");
    EXPECT_STREQ(url("http://example.com:/"), "has an empty port");
    EXPECT_STREQ(url("http://example.com:0/"), "has a port outside 1-65535");
    EXPECT_STREQ(url("http://example.com:65536/"), "has a port outside 1-65535");
    EXPECT_STREQ(url("http://example.com:80a/"), "has a non-numeric port");
    EXPECT_NE(url("http://[::1/"), nullptr);
    EXPECT_NE(url("http://[zz::1]/"), nullptr);
    EXPECT_NE(url("http://[::1]x/"), nullptr);
    EXPECT_NE(url("http://exa<mple.com/"), nullptr);
}

TEST(Url, PercentEncodedHost) {
    // libcurl decodes a percent-encoded host name: it must decode to host characters
    EXPECT_EQ(url("http://ex%41mple.com/"), nullptr);
    EXPECT_EQ(url("http://%31%32%37.0.0.1:8080/"), nullptr);
    EXPECT_STREQ(url("http://127.0.0.1%0d%0aX-Injected%3a%201:80/x"),
                 "has a percent-encoded character not allowed in a host");
    EXPECT_STREQ(url("http://a%00b/"), "has a percent-encoded character not allowed in a host");
    EXPECT_STREQ(url("http://a%2fb/"), "has a percent-encoded character not allowed in a host");
    EXPECT_STREQ(url("http://a%25b/"), "has a percent-encoded character not allowed in a host");
    EXPECT_STREQ(url("http://a%2/"), "has an invalid percent-encoding in its host");
    EXPECT_STREQ(url("http://a%zz/"), "has an invalid percent-encoding in its host");
    EXPECT_STREQ(url("http://a%/"), "has an invalid percent-encoding in its host");
    EXPECT_EQ(url("http://host/path%0d%0a"), nullptr); // the path is sent as is, never decoded
}

TEST(Url, LengthLimit) {
    std::string base = "http://example.com/";
    EXPECT_EQ(url(base + std::string(od::kMaxUrlLength - base.size(), 'a')), nullptr);
    EXPECT_NE(url(base + std::string(od::kMaxUrlLength - base.size() + 1, 'a')), nullptr);
}

TEST(Url, IsHttps) {
    EXPECT_TRUE(od::url_is_https("https://x", 9));
    EXPECT_TRUE(od::url_is_https("HTTPS://x", 9));
    EXPECT_FALSE(od::url_is_https("http://x", 8));
}

TEST(HeaderName, Tokens) {
    EXPECT_EQ(hname("Authorization"), nullptr);
    EXPECT_EQ(hname("X-Api-Key_2"), nullptr);
    EXPECT_EQ(hname("a!#$%&'*+-.^_`|~z"), nullptr);
    EXPECT_STREQ(hname(""), "is empty");
    EXPECT_STREQ(hname("X-A\r\nB"), "contains a carriage return or line feed");
    EXPECT_NE(hname("X A"), nullptr);
    EXPECT_NE(hname("X:A"), nullptr);
    EXPECT_NE(hname("X(A)"), nullptr);
    EXPECT_NE(hname("Xé"), nullptr);
    EXPECT_NE(hname(std::string(257, 'a')), nullptr);
}

TEST(HeaderName, Reserved) {
    EXPECT_TRUE(reserved("Content-Length"));
    EXPECT_TRUE(reserved("content-type"));
    EXPECT_TRUE(reserved("HOST"));
    EXPECT_TRUE(reserved("Idempotency-Key"));
    EXPECT_TRUE(reserved("ce-id"));
    EXPECT_TRUE(reserved("CE-Source"));
    EXPECT_TRUE(reserved("webhook-signature"));
    EXPECT_TRUE(reserved("X-Outbox-Attempt"));
    EXPECT_FALSE(reserved("Authorization"));
    EXPECT_FALSE(reserved("X-Trace"));
    EXPECT_FALSE(reserved("cel"));
}

TEST(HeaderValue, ControlCharacters) {
    EXPECT_EQ(hvalue("Bearer abc.def"), nullptr);
    EXPECT_EQ(hvalue("tab\tok"), nullptr);
    EXPECT_EQ(hvalue("caf\xc3\xa9"), nullptr);
    EXPECT_STREQ(hvalue("a\r\nX-Evil: 1"), "contains a carriage return or line feed");
    EXPECT_STREQ(hvalue("a\nb"), "contains a carriage return or line feed");
    EXPECT_STREQ(hvalue("a\rb"), "contains a carriage return or line feed");
    EXPECT_STREQ(hvalue(std::string("a\0b", 3)), "contains a control character");
    EXPECT_STREQ(hvalue("a\x1b"), "contains a control character");
    EXPECT_STREQ(hvalue("a\x7f"), "contains a control character");
    EXPECT_NE(hvalue(std::string(8193, 'v')), nullptr);
}

TEST(HeaderValue, IsBlank) {
    EXPECT_TRUE(od::is_blank("", 0));
    EXPECT_TRUE(od::is_blank(nullptr, 0));
    EXPECT_TRUE(od::is_blank(" ", 1));
    EXPECT_TRUE(od::is_blank("\t", 1));
    EXPECT_TRUE(od::is_blank(" \t  \t", 5));
    EXPECT_TRUE(od::is_blank("  x", 2)); // only len bytes count
    EXPECT_FALSE(od::is_blank("x", 1));
    EXPECT_FALSE(od::is_blank(" x ", 3));
    EXPECT_FALSE(od::is_blank("\r\n", 2)); // other whitespace is not blank (and is rejected anyway)
    EXPECT_FALSE(od::is_blank("\v", 1));
    EXPECT_FALSE(od::is_blank(std::string(" \0", 2).data(), 2));
    EXPECT_FALSE(od::is_blank("\xc2\xa0", 2)); // U+00A0 is a value byte sequence, not blank
}

TEST(HeaderValue, BlankValuesAreRejected) {
    EXPECT_STREQ(hvalue(""), "must not be blank");
    EXPECT_STREQ(od::check_header_value(nullptr, 0), "must not be blank");
    EXPECT_STREQ(hvalue(" "), "must not be blank");
    EXPECT_STREQ(hvalue("\t"), "must not be blank");
    EXPECT_STREQ(hvalue(" \t \t "), "must not be blank");
    EXPECT_STREQ(hvalue(std::string(8192, ' ')), "must not be blank");
    EXPECT_STREQ(hvalue(std::string(8193, ' ')), "is longer than 8192 bytes");
    // leading and trailing whitespace around a value is fine
    EXPECT_EQ(hvalue(" a"), nullptr);
    EXPECT_EQ(hvalue("a "), nullptr);
    EXPECT_EQ(hvalue("\ta\t"), nullptr);
    EXPECT_EQ(hvalue("0"), nullptr);
    EXPECT_EQ(hvalue("-"), nullptr);
    // control characters are still reported as such
    EXPECT_STREQ(hvalue(" \r\n"), "contains a carriage return or line feed");
    EXPECT_STREQ(hvalue(std::string(" \0", 2)), "contains a control character");
}

// ------------------------------------------------------------ redact_url

std::string redact(const std::string &u, std::size_t outsz = 256) {
    char buf[256];
    std::memset(buf, 'Z', sizeof buf);
    std::size_t n = od::redact_url(u.data(), u.size(), buf, outsz);
    EXPECT_LT(n, outsz);
    EXPECT_EQ(buf[n], '\0');
    return std::string(buf, n);
}

TEST(RedactUrl, UserinfoIsReplaced) {
    EXPECT_EQ(redact("https://user:pw@host/x"), "https://***@host/x");
    EXPECT_EQ(redact("http://user@host"), "http://***@host");
    EXPECT_EQ(redact("http://:pw@host:8080/"), "http://***@host:8080/");
    EXPECT_EQ(redact("HTTPS://U:P@Example.COM?q=1"), "HTTPS://***@Example.COM?q=1");
    EXPECT_EQ(redact("http://u:p@[::1]:80/a"), "http://***@[::1]:80/a");
    EXPECT_EQ(redact("http://@host/"), "http://***@host/");
    EXPECT_EQ(redact("http://user:pw@"), "http://***@");
    // the last '@' of the authority ends the userinfo (an unescaped '@' in a password)
    EXPECT_EQ(redact("http://u:p@ss@w@host/a"), "http://***@host/a");
    // '@' after the authority is not userinfo
    EXPECT_EQ(redact("http://u:p@host/a@b?c@d#e@f"), "http://***@host/a@b?c@d#e@f");
}

TEST(RedactUrl, OtherUrlsAreUnchanged) {
    for (const char *u : {"https://example.com/hooks?x=1", "http://host/a@b", "http://host?who=a@b", "http://host#a@b",
                          "http://[::1]:8080/", "mailto:user@example.com", "user:pw@host/x", "//user:pw@host/x",
                          "/a://u:p@h", "://u:p@h", "", "http://", "http:/u:p@h/"})
        EXPECT_EQ(redact(u), u) << u;
    // control characters are copied as they are (the caller quotes them)
    EXPECT_EQ(redact("http://h/\r\nX: 1"), "http://h/\r\nX: 1");
}

TEST(RedactUrl, MalformedSchemesAreRedactedToo) {
    // rejected URLs are the ones worth echoing in errors
    EXPECT_EQ(redact(" http://u:pw@host/"), " http://***@host/");
    EXPECT_EQ(redact("htp://u:pw@host/"), "htp://***@host/");
    EXPECT_EQ(redact("ftp://u:pw@host/"), "ftp://***@host/");
}

TEST(RedactUrl, LengthIsHonoured) {
    const std::string u = "https://user:pw@host/xyz";
    char buf[64];
    // only the first len bytes are the URL, no NUL needed
    EXPECT_EQ(od::redact_url(u.data(), 19, buf, sizeof buf), 15u); // "https://user:pw@hos"
    EXPECT_STREQ(buf, "https://***@hos");
    EXPECT_EQ(od::redact_url(u.data(), 14, buf, sizeof buf), 14u); // "https://user:p": no '@' yet
    EXPECT_STREQ(buf, "https://user:p");
    EXPECT_EQ(od::redact_url(nullptr, 5, buf, sizeof buf), 0u);
    EXPECT_STREQ(buf, "");
}

TEST(RedactUrl, TruncationNeverShowsTheUserinfo) {
    const std::string u = "https://user:secret@host/x";
    EXPECT_EQ(redact(u, 19), "https://***@host/x"); // exactly fits
    EXPECT_EQ(redact(u, 18), "https://***@host/");
    EXPECT_EQ(redact(u, 12), "https://***");
    EXPECT_EQ(redact(u, 10), "https://*");
    EXPECT_EQ(redact(u, 9), "https://");
    EXPECT_EQ(redact(u, 2), "h");
    EXPECT_EQ(redact(u, 1), "");
    for (std::size_t n = 1; n <= 40; n++) {
        std::string r = redact(u, n);
        EXPECT_EQ(r.find("user"), std::string::npos) << n;
        EXPECT_EQ(r.find("secret"), std::string::npos) << n;
    }
    // outsz 0: nothing written at all
    char buf[4] = {'x', 'y', 'z', '\0'};
    EXPECT_EQ(od::redact_url(u.data(), u.size(), buf, 0), 0u);
    EXPECT_STREQ(buf, "xyz");
    EXPECT_EQ(od::redact_url(u.data(), u.size(), nullptr, 10), 0u);
}

TEST(Base64, RoundTrip) {
    const unsigned char data[] = {0, 1, 2, 250, 251, 252, 253, 254, 255, 42};
    for (std::size_t n = 0; n <= sizeof data; n++) {
        char enc[32];
        unsigned char dec[32];
        std::size_t elen = od::base64_encode(data, n, enc);
        EXPECT_EQ(elen, 4 * ((n + 2) / 3));
        long dlen = od::base64_decode(enc, elen, dec);
        ASSERT_EQ(dlen, static_cast<long>(n));
        EXPECT_EQ(std::memcmp(dec, data, n), 0);
    }
}

TEST(Base64, KnownVectorsAndErrors) {
    char enc[16];
    std::size_t n = od::base64_encode(reinterpret_cast<const unsigned char *>("foobar"), 6, enc);
    EXPECT_EQ(std::string(enc, n), "Zm9vYmFy");
    n = od::base64_encode(reinterpret_cast<const unsigned char *>("fo"), 2, enc);
    EXPECT_EQ(std::string(enc, n), "Zm8=");
    unsigned char out[16];
    EXPECT_EQ(od::base64_decode("Zm8", 3, out), 2); // padding optional
    EXPECT_EQ(od::base64_decode("Z", 1, out), -1);
    EXPECT_EQ(od::base64_decode("Zm9v!", 5, out), -1);
}

TEST(SigningSecret, StandardWebhooksFormat) {
    // The example secret of the Standard Webhooks specification (24 bytes).
    EXPECT_EQ(secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), nullptr);
    EXPECT_STREQ(secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "must start with \"whsec_\"");
    EXPECT_STREQ(secret("whsec_not base64!!"), "is not valid base64 after \"whsec_\"");
    EXPECT_STREQ(secret("whsec_c2hvcnQ="), "is shorter than 16 bytes once decoded");
    EXPECT_NE(secret("whsec_" + std::string(400, 'A')), nullptr);
}

TEST(IdPrefix, LettersDigitsAndFewPunctuation) {
    auto check = [](const std::string &p) { return od::check_id_prefix(p.data(), p.size()); };
    EXPECT_EQ(check(""), nullptr);
    EXPECT_EQ(check("db1-"), nullptr);
    EXPECT_EQ(check("eu.orders_2:"), nullptr);
    EXPECT_EQ(check(std::string(64, 'a')), nullptr);
    EXPECT_STREQ(check(std::string(65, 'a')), "is longer than 64 bytes");
    EXPECT_NE(check("db 1"), nullptr);
    EXPECT_NE(check("db/1"), nullptr);
    EXPECT_NE(check("d\xc3\xa9"), nullptr);
    EXPECT_NE(check("a%b"), nullptr);
    EXPECT_NE(check(std::string("a\0b", 3)), nullptr);
}

TEST(TraceContext, Traceparent) {
    auto tp = [](const std::string &v) { return od::check_traceparent(v.data(), v.size()); };
    const std::string good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    EXPECT_EQ(tp(good), nullptr);
    EXPECT_EQ(tp("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), nullptr);
    EXPECT_NE(tp(""), nullptr);
    EXPECT_NE(tp(good + "-x"), nullptr);                                       // version 00 is exactly 55 bytes
    EXPECT_EQ(tp("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"), nullptr); // later versions may extend
    EXPECT_NE(tp("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra"), nullptr);
    EXPECT_STREQ(tp("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "has the invalid version ff");
    EXPECT_NE(tp("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), nullptr); // upper case
    EXPECT_STREQ(tp("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), "has an all-zero trace-id");
    EXPECT_STREQ(tp("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), "has an all-zero parent-id");
    EXPECT_NE(tp("00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01"), nullptr);
    EXPECT_NE(tp("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01"), nullptr);
    EXPECT_NE(tp(std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n")), nullptr);
    EXPECT_STREQ(tp("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + std::string(500, 'a')),
                 "is longer than 512 bytes");
}

TEST(TraceContext, Tracestate) {
    auto ts = [](const std::string &v) { return od::check_tracestate(v.data(), v.size()); };
    EXPECT_EQ(ts("congo=t61rcWkgMzE"), nullptr);
    EXPECT_EQ(ts("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"), nullptr);
    EXPECT_EQ(ts("tenant@vendor=x y,,  a=b\t"), nullptr); // spaces inside a value, empty members
    EXPECT_EQ(ts(""), nullptr);
    EXPECT_NE(ts("Congo=x"), nullptr);  // keys are lower case
    EXPECT_NE(ts("congo"), nullptr);    // no value
    EXPECT_NE(ts("congo="), nullptr);   // empty value
    EXPECT_NE(ts("=x"), nullptr);       // empty key
    EXPECT_NE(ts("a=b=c"), nullptr);    // '=' in a value
    EXPECT_NE(ts("a=\xc3\xa9"), nullptr); // non-ASCII
    EXPECT_NE(ts("a=b\nc=d"), nullptr);
    std::string many;
    for (int i = 0; i < 33; i++) many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=v";
    EXPECT_STREQ(ts(many), "has more than 32 members");
    EXPECT_STREQ(ts("a=" + std::string(511, 'x')), "is longer than 512 bytes");
}

TEST(Egress, ProxyUrl) {
    auto px = [](const std::string &v) { return od::check_proxy_url(v.data(), v.size()); };
    EXPECT_EQ(px("http://proxy.internal:3128"), nullptr);
    EXPECT_EQ(px("HTTPS://user:secret@proxy:443"), nullptr);
    EXPECT_EQ(px("socks5h://127.0.0.1:1080"), nullptr);
    EXPECT_EQ(px("socks5://[::1]:1080"), nullptr);
    EXPECT_NE(px("ftp://proxy"), nullptr);
    EXPECT_NE(px("proxy:3128"), nullptr);
    EXPECT_NE(px("http://"), nullptr);
    EXPECT_NE(px("http://a b"), nullptr);
    EXPECT_NE(px("http://a\r\nX: y"), nullptr);
    EXPECT_STREQ(px("http://" + std::string(2100, 'a')), "is longer than 2048 bytes");
    // what libcurl could not use is refused here, not quoted in a later error
    EXPECT_STREQ(px("http://user:hunter2@proxy:99999"), "is not a valid URL (host, port)");
    EXPECT_STREQ(px("http://user:hunter2@[::1"), "is not a valid URL (host, port)");
    EXPECT_EQ(px("http://user:hunter2@proxy:3128"), nullptr);
    // never quotes the value
    const char *p = px("gopher://user:hunter2@x");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(std::string(p).find("hunter2"), std::string::npos);
}

TEST(Egress, Pem) {
    const std::string cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const std::string key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
    const std::string eckey = "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n";
    EXPECT_EQ(od::check_pem(cert.data(), cert.size(), false), nullptr);
    EXPECT_EQ(od::check_pem(key.data(), key.size(), true), nullptr);
    EXPECT_EQ(od::check_pem(eckey.data(), eckey.size(), true), nullptr);
    EXPECT_NE(od::check_pem(key.data(), key.size(), false), nullptr);
    EXPECT_NE(od::check_pem(cert.data(), cert.size(), true), nullptr);
    EXPECT_NE(od::check_pem("MIIB", 4, false), nullptr);
    const std::string enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIF\n-----END ENCRYPTED PRIVATE KEY-----\n";
    const std::string legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: x\n\nMIIE\n-----END RSA PRIVATE KEY-----\n";
    EXPECT_STREQ(od::check_pem(enc.data(), enc.size(), true), "must not be encrypted (there is no passphrase setting)");
    EXPECT_STREQ(od::check_pem(legacy.data(), legacy.size(), true), "must not be encrypted (there is no passphrase setting)");
    std::string nul = cert;
    nul[5] = '\0';
    EXPECT_STREQ(od::check_pem(nul.data(), nul.size(), false), "contains a NUL byte");
    std::string big(70000, 'A');
    EXPECT_STREQ(od::check_pem(big.data(), big.size(), false), "is longer than 64 KB");
}

} // namespace

TEST(Validate, OAuthValues) {
    EXPECT_EQ(od::check_oauth_value("my client", 9, false), nullptr);
    EXPECT_EQ(od::check_oauth_value("s3cr&t:x/é", std::strlen("s3cr&t:x/é"), false), nullptr);
    EXPECT_STREQ(od::check_oauth_value("", 0, false), "must not be empty");
    EXPECT_STREQ(od::check_oauth_value("a\r\nb", 4, false), "contains a control character");
    std::string big(1001, 'a');
    EXPECT_STREQ(od::check_oauth_value(big.data(), big.size(), false), "is longer than 1000 bytes");
    EXPECT_EQ(od::check_oauth_value(big.data(), 1000, true), nullptr);
    EXPECT_EQ(od::check_oauth_value("orders.write audit https://api/x", 32, true), nullptr);
    EXPECT_NE(od::check_oauth_value("a\"b", 3, true), nullptr);
    EXPECT_NE(od::check_oauth_value("a\\b", 3, true), nullptr);
    EXPECT_NE(od::check_oauth_value("payé", std::strlen("payé"), true), nullptr);
    EXPECT_NE(od::check_oauth_value("a\tb", 3, true), nullptr);
    EXPECT_STREQ(od::check_oauth_value("   ", 3, true), "must not be blank");
}

TEST(Validate, MessageStatus) {
    for (const char *s : { "pending", "processing", "done", "dead" })
        EXPECT_TRUE(od::message_status_is_valid(s, std::strlen(s))) << s;
    for (const char *s : { "", "Pending", "DONE", "done ", " done", "pend", "pendings", "processin", "retry", "defer" })
        EXPECT_FALSE(od::message_status_is_valid(s, std::strlen(s))) << s;
    EXPECT_FALSE(od::message_status_is_valid(nullptr, 0));
    /* the length counts, not a terminating NUL */
    EXPECT_FALSE(od::message_status_is_valid("done\0x", 6));
    EXPECT_TRUE(od::message_status_is_valid("donexyz", 4));
}

TEST(Validate, MessageLease) {
    EXPECT_TRUE(od::message_lease_is_consistent("processing", 10, true));
    EXPECT_FALSE(od::message_lease_is_consistent("processing", 10, false));
    for (const char *s : { "pending", "done", "dead" }) {
        EXPECT_TRUE(od::message_lease_is_consistent(s, std::strlen(s), false)) << s;
        EXPECT_FALSE(od::message_lease_is_consistent(s, std::strlen(s), true)) << s;
    }
    EXPECT_FALSE(od::message_lease_is_consistent("Processing", 10, true));
    EXPECT_TRUE(od::message_lease_is_consistent("Processing", 10, false));
}
