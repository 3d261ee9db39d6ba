/*
 * core/http1.hpp — HTTP/1.1 message framing without libcurl: a POST
 * request written into one buffer (write_post) and a response read by an
 * incremental parser (ResponseParser), for a transport that owns its
 * keep-alive sockets.
 *
 * Why: libcurl (7.88 to 8.14 at least) formats every request header
 * through its printf one byte at a time and polls each reused connection
 * before and after sending, which makes its request path several times the
 * cost of writing the same request with one send() and reading the answer
 * with one recv().  This file is the framing half of such a path, pure and
 * unit-tested (test/unit/http1_test.cpp); connecting, pooling and timeouts
 * belong to the engine that uses it.
 *
 * The parser is strict where framing is at stake and lenient where libcurl
 * is lenient: bare LF line ends, obsolete line folding and reason phrases
 * of any text are accepted; a status line that is not HTTP/1.x, a header
 * name with white space before its colon, a malformed or conflicting
 * Content-Length, a malformed chunk size or a header section above
 * kMaxHeaderSection are errors (the connection is then closed, never
 * reused: a response whose end is uncertain could be read as the next
 * one's beginning).
 *
 * Every function is noexcept: an allocation failure is an error of the
 * request (write_post says so) or of the response (kError).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace od {
namespace http1 {

/* Bytes of the header section (status line and header lines of every block, 1xx included). */
constexpr std::size_t kMaxHeaderSection = 100 * 1024;
/* Bytes of one chunk-size line, extensions included. */
constexpr std::size_t kMaxChunkLine = 4096;

/*
 * Append a POST request to out: the request line for target (origin form,
 * "/path?query"), Host: host_header, User-Agent: user_agent, Accept: * / *,
 * the caller's header lines in their order, Content-Length and the body.
 * As with libcurl: a caller line whose name is Host, User-Agent or Accept
 * replaces the built-in one, a line with a blank value ("Accept:") sends
 * nothing and removes the built-in of that name, a line without a colon
 * is not sent, and without a Content-Type line the body is sent as
 * application/x-www-form-urlencoded.  Content-Length and
 * Transfer-Encoding lines of the caller are not sent: the framing is this
 * function's.  Returns nullptr, or why nothing was appended: a target,
 * host or header line holding a line break (which would let it write
 * headers or requests of its own), or memory running out.
 */
const char *write_post(std::string &out, const std::string &target, const std::string &host_header,
                       const std::string &user_agent, const std::vector<std::string> &header_lines, const char *body,
                       std::size_t body_len) noexcept;

/*
 * An http:// URL simple enough to be sent without libcurl's URL handling:
 * scheme http (any case), a host of letters, digits, '.', '-' and '_' or an
 * IPv6 literal without a zone (IP literals only in the form libcurl
 * writes them: "127.0.0.1", "[::1]"), an optional port 1-65535, and a path and
 * query of visible ASCII without a dot segment ("/./", "/../", which
 * libcurl removes), user information, a fragment or a percent sign in the
 * host.  Anything else (https, credentials, unusual forms) returns false
 * and is left to libcurl, which then sends it exactly as before.
 */
struct PlainUrl {
    std::string key;         /* "host:port" with the host in lower case: the keep-alive pool's key */
    std::string host_header; /* the Host value libcurl sends: the host as written, ":port" unless 80 */
    std::string target;      /* origin form: the path ("/" when empty) and "?query" */
};
bool parse_plain_http_url(const char *url, PlainUrl &out) noexcept;

/*
 * One response, fed as it arrives.  reset() before each response; the
 * body goes to the sink given there, in the order received, with chunked
 * framing removed.
 */
class ResponseParser {
  public:
    enum class Result {
        kNeedMore, /* the response has not ended: feed more, or finish() at end of file */
        kDone,     /* the response is complete */
        kError     /* malformed, cut short, or stopped by the sink: see error() */
    };
    /* Receives body bytes; returning false stops the response (kError, sink_stopped()). */
    using BodySink = bool (*)(void *ctx, const char *data, std::size_t len);

    ResponseParser() noexcept { reset(nullptr, nullptr); }

    void reset(BodySink sink, void *ctx) noexcept;

    /*
     * Parse up to len bytes.  *consumed (if not null) is set to the bytes
     * that belong to this response: less than len only with kDone, when
     * bytes follow the end of the response (the server sent more than one
     * answer: the connection must not be reused).  After kDone or kError
     * nothing more is read.
     */
    Result feed(const char *data, std::size_t len, std::size_t *consumed = nullptr) noexcept;

    /*
     * The connection was closed by the server: ends a body delimited by the
     * close (kDone); anywhere else the response is cut short (kError).
     */
    Result finish() noexcept;

    Result result() const noexcept { return result_; }
    /* Final status (200-599; interim 1xx responses are skipped), 0 until its header section has ended. */
    int status() const noexcept { return status_; }
    /* The final response's header section has ended (what makes it a response rather than a transport error). */
    bool headers_complete() const noexcept { return state_ > State::kHead; }
    /* The connection may carry the next request once this response is kDone. */
    bool keep_alive() const noexcept { return result_ == Result::kDone && keep_alive_ && !extra_bytes_; }
    /* Retry-After of the final response, white space trimmed ("" if none). */
    const std::string &retry_after() const noexcept { return retry_after_; }
    /* Bytes fed so far (0: the server answered nothing at all). */
    std::uint64_t received() const noexcept { return received_; }
    /* Body bytes passed to the sink so far. */
    std::uint64_t body_bytes() const noexcept { return body_bytes_; }
    /* The sink asked to stop. */
    bool sink_stopped() const noexcept { return sink_stopped_; }
    /* Why kError, in the style of an error message detail; "" otherwise. */
    const char *error() const noexcept { return error_; }

  private:
    enum class State { kHead, kLength, kChunkSize, kChunkData, kChunkDataEnd, kTrailers, kClose, kEnd };

    Result fail(const char *why) noexcept;
    void clear_block() noexcept;
    bool store(std::string &dst, bool append, const char *s, std::size_t len) noexcept;
    bool head_line(const char *line, std::size_t len) noexcept;
    bool status_line(const char *line, std::size_t len) noexcept;
    bool header_line(const char *line, std::size_t len) noexcept;
    bool header_field(const char *name, std::size_t nlen, const char *value, std::size_t vlen) noexcept;
    bool end_of_head() noexcept;
    bool chunk_size_line(const char *line, std::size_t len) noexcept;
    bool body(const char *data, std::size_t len) noexcept;
    /* The next complete line of data (without CR LF) into line/len, buffering a partial one. */
    bool take_line(const char *&p, const char *end, std::size_t limit, const char *&line, std::size_t &len,
                   bool &complete) noexcept;

    BodySink sink_ = nullptr;
    void *ctx_ = nullptr;
    State state_ = State::kHead;
    Result result_ = Result::kNeedMore;
    std::string partial_; /* an incomplete line carried between feeds */
    std::string line_;    /* a line completed from partial_ */
    std::string field_;   /* the header line being folded (obsolete line folding) */
    std::size_t head_bytes_ = 0;
    std::size_t trailer_bytes_ = 0;
    int status_ = 0;
    int block_status_ = 0; /* status of the block being read (1xx or final) */
    int minor_ = 1;        /* HTTP/1.<minor> of the final response */
    bool have_length_ = false;
    std::uint64_t length_ = 0;
    bool chunked_ = false;
    bool te_other_ = false; /* a Transfer-Encoding that does not end in chunked: delimited by the close */
    bool conn_close_ = false;
    bool conn_keep_alive_ = false;
    bool keep_alive_ = false;
    bool extra_bytes_ = false;
    bool sink_stopped_ = false;
    std::uint64_t remaining_ = 0; /* of the body (kLength) or of the chunk (kChunkData) */
    std::uint64_t received_ = 0;
    std::uint64_t body_bytes_ = 0;
    std::string retry_after_;
    const char *error_ = "";
};

} // namespace http1
} // namespace od
