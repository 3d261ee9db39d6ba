// Unit tests for src/core/http1.cpp: the request writer and the response
// parser, fed whole, split at every byte, and cut short.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/http1.hpp"

namespace {

using od::http1::ResponseParser;
using Result = ResponseParser::Result;

bool collect(void *ctx, const char *data, std::size_t len) {
    static_cast<std::string *>(ctx)->append(data, len);
    return true;
}

bool refuse_after_4(void *ctx, const char *data, std::size_t len) {
    auto *s = static_cast<std::string *>(ctx);
    s->append(data, len);
    return s->size() <= 4;
}

// Parses `wire` fed in pieces of `step` bytes (0: whole); body into *body.
Result parse(ResponseParser &p, const std::string &wire, std::string *body, std::size_t step = 0, bool eof = false) {
    body->clear();
    p.reset(collect, body);
    Result r = Result::kNeedMore;
    if (step == 0) step = wire.size() == 0 ? 1 : wire.size();
    for (std::size_t i = 0; i < wire.size() && r == Result::kNeedMore; i += step)
        r = p.feed(wire.data() + i, std::min(step, wire.size() - i));
    if (eof && r == Result::kNeedMore) r = p.finish();
    return r;
}

// ---------------------------------------------------------------- write_post

TEST(Http1Write, WritesTheRequestLineBuiltInHeadersCallerLinesAndBody) {
    std::string out;
    const char *err = od::http1::write_post(out, "/hook?a=1", "example.com:8080", "outbox_dispatcher/0.3.0",
                                            {"Content-Type: application/json", "Idempotency-Key: 42"}, "{\"n\":1}", 7);
    ASSERT_EQ(err, nullptr);
    EXPECT_EQ(out,
              "POST /hook?a=1 HTTP/1.1\r\n"
              "Host: example.com:8080\r\n"
              "User-Agent: outbox_dispatcher/0.3.0\r\n"
              "Accept: */*\r\n"
              "Content-Type: application/json\r\n"
              "Idempotency-Key: 42\r\n"
              "Content-Length: 7\r\n"
              "\r\n"
              "{\"n\":1}");
}

TEST(Http1Write, CallerLinesReplaceOrRemoveBuiltInsAndNeverFrame) {
    std::string out;
    const char *err =
        od::http1::write_post(out, "/", "h", "ua",
                              {"user-agent: mine", "Accept:", "Content-Length: 999", "Transfer-Encoding: chunked",
                               "no colon here", ": no name", "X-Blank:   ", "X-Kept: v"},
                              "ab", 2);
    ASSERT_EQ(err, nullptr);
    EXPECT_EQ(out,
              "POST / HTTP/1.1\r\n"
              "Host: h\r\n"
              "user-agent: mine\r\n"
              "X-Kept: v\r\n"
              "Content-Type: application/x-www-form-urlencoded\r\n"
              "Content-Length: 2\r\n"
              "\r\n"
              "ab");
}

TEST(Http1Write, AppendsAfterWhatIsThereAndSendsAnEmptyBody) {
    std::string out = "earlier";
    ASSERT_EQ(od::http1::write_post(out, "/", "h", "", {"Content-Type: text/plain"}, "", 0), nullptr);
    EXPECT_EQ(out,
              "earlierPOST / HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nContent-Type: text/plain\r\n"
              "Content-Length: 0\r\n\r\n");
}

TEST(Http1Write, RefusesLineBreaksAndLeavesTheBufferAlone) {
    std::string out = "kept";
    EXPECT_NE(od::http1::write_post(out, "/", "h", "ua", {"X-A: 1\r\nX-Injected: 2"}, "", 0), nullptr);
    EXPECT_NE(od::http1::write_post(out, "/", "h", "ua", {"X-A: 1\nX-B: 2"}, "", 0), nullptr);
    EXPECT_NE(od::http1::write_post(out, "/ HTTP/1.1\r\nX: y", "h", "ua", {}, "", 0), nullptr);
    EXPECT_NE(od::http1::write_post(out, "/", "h\r\nX: y", "ua", {}, "", 0), nullptr);
    EXPECT_NE(od::http1::write_post(out, "/", "h", "ua\n", {}, "", 0), nullptr);
    EXPECT_EQ(out, "kept");
}

// ---------------------------------------------------------------- responses

TEST(Http1Url, PlainHttpUrlsAreSplitAsLibcurlSendsThem) {
    od::http1::PlainUrl u;
    ASSERT_TRUE(od::http1::parse_plain_http_url("http://Sink.Example:8080/hooks/a?x=1&y=/./", u));
    EXPECT_EQ(u.key, "sink.example:8080");
    EXPECT_EQ(u.host_header, "Sink.Example:8080");
    EXPECT_EQ(u.target, "/hooks/a?x=1&y=/./"); // dot segments in the query are not path segments
    ASSERT_TRUE(od::http1::parse_plain_http_url("HTTP://10.0.0.1", u));
    EXPECT_EQ(u.key, "10.0.0.1:80");
    EXPECT_EQ(u.host_header, "10.0.0.1");
    EXPECT_EQ(u.target, "/");
    ASSERT_TRUE(od::http1::parse_plain_http_url("http://h:80?q", u)); // port 80 is left out of Host
    EXPECT_EQ(u.host_header, "h");
    EXPECT_EQ(u.target, "/?q");
    ASSERT_TRUE(od::http1::parse_plain_http_url("http://[::1]:9000/.well-known/x", u));
    EXPECT_EQ(u.key, "[::1]:9000");
    EXPECT_EQ(u.host_header, "[::1]:9000");
    EXPECT_EQ(u.target, "/.well-known/x");
    ASSERT_TRUE(od::http1::parse_plain_http_url("http://1e100.net/", u)); // a name, not a number
    EXPECT_EQ(u.host_header, "1e100.net");
}

TEST(Http1Url, AnythingUnusualIsLeftToLibcurl) {
    od::http1::PlainUrl u;
    for (const char *url :
         {"https://h/", "ftp://h/", "http://", "http:///x", "http://u:p@h/", "http://h/a#f", "http://h/a b",
          "http://h/./a", "http://h/a/..", "http://h/a/../b", "http://h%41/", "http://h:0/", "http://h:65536/",
          "http://h:/", "http://h:8x/", "http://[::1%25eth0]/", "http://[::1/", "http://[]/", "http://h\\x/",
          "http://h/\x01", "http://h/\xc3\xa9",
          // IP literals libcurl writes in another form (Host: 127.0.0.1, [::1])
          "http://127.1/", "http://0x7f.0.0.1/", "http://2130706433/", "http://0177.0.0.1/", "http://1.2.3.4.5/",
          "http://[0:0:0:0:0:0:0:1]/", "http://[::0001]/", "http://[::ABCD]/"}) {
        EXPECT_FALSE(od::http1::parse_plain_http_url(url, u)) << url;
    }
    EXPECT_FALSE(od::http1::parse_plain_http_url(nullptr, u));
}

TEST(Http1Parse, ContentLengthBodyAndKeepAlive) {
    ResponseParser p;
    std::string body;
    const std::string wire = "HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 2\r\n\r\nok";
    std::size_t consumed = 0;
    p.reset(collect, &body);
    EXPECT_EQ(p.feed(wire.data(), wire.size(), &consumed), Result::kDone);
    EXPECT_EQ(consumed, wire.size());
    EXPECT_EQ(p.status(), 200);
    EXPECT_TRUE(p.headers_complete());
    EXPECT_TRUE(p.keep_alive());
    EXPECT_EQ(body, "ok");
    EXPECT_EQ(p.body_bytes(), 2u);
    EXPECT_EQ(p.received(), wire.size());
    EXPECT_STREQ(p.error(), "");
    // feeding after the end reads nothing
    EXPECT_EQ(p.feed("x", 1, &consumed), Result::kDone);
    EXPECT_EQ(consumed, 0u);
}

// Everything a response may carry at once, whole and split at every point.
TEST(Http1Parse, SameResultWhereverTheBytesAreSplit) {
    const std::string wire =
        "\r\n" // a stray empty line before the status line
        "HTTP/1.1 100 Continue\r\nRetry-After: 1\r\n\r\n"
        "HTTP/1.1 503 Service Unavailable\n" // a bare LF
        "retry-after:   120 \r\n"
        "X-Folded: a\r\n"
        "   b\r\n"
        "Transfer-Encoding: chunked\r\n"
        "\r\n"
        "5;ext=1\r\nhello\r\n"
        "A \r\n, world!!!\r\n"
        "0\r\n"
        "Trailer-Field: t\r\n"
        "\r\n";
    for (std::size_t step = 0; step <= wire.size(); step++) {
        ResponseParser p;
        std::string body;
        ASSERT_EQ(parse(p, wire, &body, step), Result::kDone) << "step " << step << ": " << p.error();
        EXPECT_EQ(p.status(), 503);
        EXPECT_EQ(p.retry_after(), "120");
        EXPECT_EQ(body, "hello, world!!!");
        EXPECT_TRUE(p.keep_alive());
    }
}

TEST(Http1Parse, NoBodyFor204And304AndContentLengthZero) {
    for (const char *wire : {"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
                             "HTTP/1.1 304 Not Modified\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}) {
        ResponseParser p;
        std::string body;
        EXPECT_EQ(parse(p, wire, &body), Result::kDone) << wire;
        EXPECT_TRUE(p.keep_alive()) << wire;
        EXPECT_EQ(body, "");
    }
}

TEST(Http1Parse, BodyDelimitedByTheCloseEndsOnlyAtEndOfFile) {
    for (const char *wire :
         {"HTTP/1.1 200 OK\r\n\r\nuntil the end", // no length at all
          "HTTP/1.0 200 OK\r\n\r\nuntil the end", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nuntil the end"}) {
        ResponseParser p;
        std::string body;
        EXPECT_EQ(parse(p, wire, &body), Result::kNeedMore) << wire;
        EXPECT_TRUE(p.headers_complete());
        EXPECT_EQ(p.finish(), Result::kDone) << wire;
        EXPECT_EQ(body, "until the end");
        EXPECT_FALSE(p.keep_alive()) << wire;
    }
}

TEST(Http1Parse, KeepAliveFollowsVersionAndConnection) {
    struct Case {
        const char *wire;
        bool keep;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true},
        {"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n", false},
        {"HTTP/1.1 200 OK\r\nConnection: upgrade, close\r\nContent-Length: 0\r\n\r\n", false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false},
        {"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", true},
        // Transfer-Encoding and Content-Length together: the chunks count, the connection is not reused
        {"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
    };
    for (const Case &c : cases) {
        ResponseParser p;
        std::string body;
        EXPECT_EQ(parse(p, c.wire, &body), Result::kDone) << c.wire;
        EXPECT_EQ(p.keep_alive(), c.keep) << c.wire;
    }
}

TEST(Http1Parse, BytesAfterTheResponseAreNotConsumedAndForbidReuse) {
    ResponseParser p;
    std::string body;
    const std::string wire = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n";
    std::size_t consumed = 0;
    p.reset(collect, &body);
    EXPECT_EQ(p.feed(wire.data(), wire.size(), &consumed), Result::kDone);
    EXPECT_EQ(consumed, wire.find("okHTTP") + 2);
    EXPECT_EQ(body, "ok");
    EXPECT_FALSE(p.keep_alive());
}

TEST(Http1Parse, InterimResponsesAreSkippedButSwitchingProtocolsIsAnError) {
    ResponseParser p;
    std::string body;
    EXPECT_EQ(parse(p,
                    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nContent-Length: 5\r\n\r\n"
                    "HTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx",
                    &body),
              Result::kDone);
    EXPECT_EQ(p.status(), 201);
    EXPECT_EQ(body, "x");
    EXPECT_EQ(p.retry_after(), "");

    EXPECT_EQ(parse(p, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", &body), Result::kError);
    EXPECT_FALSE(p.headers_complete());
    EXPECT_NE(std::string(p.error()).find("101"), std::string::npos);
}

TEST(Http1Parse, MalformedFramingIsAnError) {
    const char *bad[] = {
        "HTTP/2 200\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 20x OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 099 Low\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        "HTTP/1.1 200 OK\r\n folded first\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    };
    for (const char *wire : bad) {
        ResponseParser p;
        std::string body;
        EXPECT_EQ(parse(p, wire, &body), Result::kError) << wire;
        EXPECT_STRNE(p.error(), "") << wire;
        EXPECT_FALSE(p.keep_alive()) << wire;
    }
    // a two-digit-or-less status code, too short for a status line
    ResponseParser p;
    std::string body;
    EXPECT_EQ(parse(p, "HTTP/1.1 20\r\n\r\n", &body), Result::kError);
}

TEST(Http1Parse, ChunkedDuplicateAndWellFormedCasesStillParse) {
    ResponseParser p;
    std::string body;
    // the same Content-Length twice is one length; upper-case hex and a chunk split over feeds
    EXPECT_EQ(parse(p, "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\ncontent-length: 3\r\n\r\nabc", &body),
              Result::kDone);
    EXPECT_EQ(body, "abc");
    EXPECT_EQ(
        parse(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n",
              &body, 3),
        Result::kDone);
    EXPECT_EQ(body, "abcdefghijklmnopqrstuvwxyz");
    // white space before the colon of a header that is not framing: read past, as libcurl does
    EXPECT_EQ(parse(p, "HTTP/1.1 200 OK\r\nX-A : b\r\nContent-Length: 2\r\n\r\nok", &body), Result::kDone);
    EXPECT_EQ(p.status(), 200);
    EXPECT_EQ(body, "ok");
    EXPECT_EQ(parse(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding\t: chunked\r\nContent-Length: 2\r\n\r\nok", &body),
              Result::kError);
}

TEST(Http1Parse, HeaderSectionAndChunkLinesAreBounded) {
    ResponseParser p;
    std::string body;
    std::string big = "HTTP/1.1 200 OK\r\n";
    while (big.size() <= od::http1::kMaxHeaderSection) big += "X-Padding: " + std::string(100, 'p') + "\r\n";
    big += "\r\n";
    EXPECT_EQ(parse(p, big, &body), Result::kError);
    EXPECT_EQ(parse(p, big, &body, 7), Result::kError); // the same in small pieces
    // one endless header line, never ended
    EXPECT_EQ(parse(p, "HTTP/1.1 200 OK\r\nX: " + std::string(od::http1::kMaxHeaderSection, 'a'), &body, 4096),
              Result::kError);
    // a chunk-size line without end
    EXPECT_EQ(
        parse(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + std::string(od::http1::kMaxChunkLine, 'e'),
              &body),
        Result::kError);
    // a long line arriving in pieces counts once: 80 KiB of one header in 4 KiB reads is accepted
    EXPECT_EQ(parse(p, "HTTP/1.1 200 OK\r\nX-Long: " + std::string(80 * 1024, 'l') + "\r\nContent-Length: 0\r\n\r\n",
                    &body, 4096),
              Result::kDone)
        << p.error();
    // trailers count like headers
    std::string trailers = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
    while (trailers.size() <= 2 * od::http1::kMaxHeaderSection) trailers += "T: " + std::string(100, 't') + "\r\n";
    EXPECT_EQ(parse(p, trailers, &body), Result::kError);
}

TEST(Http1Parse, ACloseBeforeTheEndIsAnError) {
    struct Case {
        const char *wire;
        const char *says;
    } cases[] = {
        {"", "without answering"},
        {"HTTP/1.1 200 OK\r\nContent-Len", "header section"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "end of the response body"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "last chunk"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: x\r\n", "last chunk"},
    };
    for (const Case &c : cases) {
        ResponseParser p;
        std::string body;
        EXPECT_EQ(parse(p, c.wire, &body, 0, true), Result::kError) << c.wire;
        EXPECT_NE(std::string(p.error()).find(c.says), std::string::npos) << c.wire << ": " << p.error();
        EXPECT_FALSE(p.keep_alive());
    }
}

TEST(Http1Parse, ASinkThatRefusesStopsTheResponse) {
    ResponseParser p;
    std::string body;
    const std::string wire = "HTTP/1.1 500 Oops\r\nContent-Length: 10\r\n\r\n0123456789";
    p.reset(refuse_after_4, &body);
    EXPECT_EQ(p.feed(wire.data(), 45), Result::kNeedMore); // "0123": accepted
    EXPECT_EQ(p.feed(wire.data() + 45, wire.size() - 45), Result::kError);
    EXPECT_TRUE(p.sink_stopped());
    EXPECT_TRUE(p.headers_complete());
    EXPECT_EQ(p.status(), 500);
    EXPECT_FALSE(p.keep_alive());
}

TEST(Http1Parse, OneParserReadsResponseAfterResponse) {
    ResponseParser p;
    std::string body;
    ASSERT_EQ(
        parse(p, "HTTP/1.1 429 Too Many\r\nRetry-After: 5\r\nConnection: close\r\nContent-Length: 1\r\n\r\na", &body),
        Result::kDone);
    EXPECT_EQ(p.retry_after(), "5");
    EXPECT_FALSE(p.keep_alive());
    ASSERT_EQ(parse(p, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb", &body), Result::kDone);
    EXPECT_EQ(p.status(), 200);
    EXPECT_EQ(p.retry_after(), "");
    EXPECT_TRUE(p.keep_alive());
    EXPECT_EQ(body, "b");
    EXPECT_EQ(p.received(), 39u);
}

} // namespace
