/*
 * core/http1.cpp — HTTP/1.1 request writing and response parsing; see
 * http1.hpp.
 */
#include "core/http1.hpp"

#include <arpa/inet.h>

#include <cstring>

#include "core/ascii.hpp"

namespace od {
namespace http1 {

namespace {

bool has_line_break(const char *s, std::size_t len) {
    return std::memchr(s, '\r', len) != nullptr || std::memchr(s, '\n', len) != nullptr;
}

/*
 * An IPv4 literal libcurl would write differently ("127.1", "0x7f.0.0.1",
 * "2130706433", "0177.0.0.1": it normalizes every numeric form to a dotted
 * quad): true for a host that starts with a digit and has only hex digits,
 * 'x' and dots unless it is a dotted quad already in canonical form.
 */
bool noncanonical_ipv4(const char *h, std::size_t n) {
    if (n == 0 || h[0] < '0' || h[0] > '9') return false;
    for (std::size_t i = 0; i < n; i++) {
        char c = ascii_lower(h[i]);
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == 'x' || c == '.')) return false;
    }
    char text[16], back[16];
    in_addr a;
    if (n >= sizeof text) return true;
    std::memcpy(text, h, n);
    text[n] = '\0';
    return inet_pton(AF_INET, text, &a) != 1 || inet_ntop(AF_INET, &a, back, sizeof back) == nullptr ||
           std::strcmp(text, back) != 0;
}

/* An IPv6 literal (between the brackets) in the form libcurl writes it: inet_ntop's. */
bool canonical_ipv6(const char *h, std::size_t n) {
    char text[64], back[64];
    in6_addr a;
    if (n == 0 || n >= sizeof text) return false;
    std::memcpy(text, h, n);
    text[n] = '\0';
    return inet_pton(AF_INET6, text, &a) == 1 && inet_ntop(AF_INET6, &a, back, sizeof back) != nullptr &&
           std::strcmp(text, back) == 0;
}

} // namespace

bool parse_plain_http_url(const char *url, PlainUrl &out) noexcept {
    if (url == nullptr) return false;
    std::size_t len = std::strlen(url);
    if (!ascii_istarts(url, len, "http://")) return false;
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(url[i]);
        if (c <= 0x20 || c >= 0x7f || c == '#' || c == '\\') return false;
    }
    std::size_t pos = 7, end = pos;
    while (end < len && url[end] != '/' && url[end] != '?') end++;
    std::size_t host_end; /* one past the host (the ']' of an IPv6 literal included) */
    if (end > pos && url[pos] == '[') {
        const char *close = static_cast<const char *>(std::memchr(url + pos, ']', end - pos));
        if (close == nullptr) return false;
        host_end = static_cast<std::size_t>(close - url) + 1;
        /* a zone ("%25eth0"), upper case, leading zeros, "::" not where inet_ntop puts it: libcurl's */
        if (!canonical_ipv6(url + pos + 1, host_end - pos - 2)) return false;
    } else {
        host_end = pos;
        while (host_end < end && url[host_end] != ':') {
            char c = url[host_end];
            bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
                      c == '-' || c == '_';
            if (!ok) return false;
            host_end++;
        }
        if (host_end == pos || host_end - pos > 253) return false;
        if (noncanonical_ipv4(url + pos, host_end - pos)) return false;
    }
    unsigned long port = 80;
    if (host_end < end) {
        if (url[host_end] != ':' || end - host_end < 2 || end - host_end > 6) return false;
        port = 0;
        for (std::size_t i = host_end + 1; i < end; i++) {
            if (url[i] < '0' || url[i] > '9') return false;
            port = port * 10 + static_cast<unsigned long>(url[i] - '0');
        }
        if (port < 1 || port > 65535) return false;
    }
    /* the path runs to the query; a dot segment would be rewritten by libcurl */
    std::size_t q = end;
    while (q < len && url[q] != '?') q++;
    for (std::size_t i = end; i < q; i++) {
        if (url[i] != '.' || url[i - 1] != '/') continue;
        std::size_t j = i + 1;
        if (j < q && url[j] == '.') j++;
        if (j == q || url[j] == '/') return false;
    }
    try {
        std::string port_text = std::to_string(port);
        out.key.assign(url + pos, host_end - pos);
        for (char &c : out.key) c = ascii_lower(c);
        out.key += ':';
        out.key += port_text;
        out.host_header.assign(url + pos, host_end - pos);
        if (port != 80) {
            out.host_header += ':';
            out.host_header += port_text;
        }
        if (end == len || url[end] == '?') out.target.assign("/");
        else out.target.clear();
        out.target.append(url + end, len - end);
    } catch (...) {
        return false;
    }
    return true;
}

const char *write_post(std::string &out, const std::string &target, const std::string &host_header,
                       const std::string &user_agent, const std::vector<std::string> &header_lines, const char *body,
                       std::size_t body_len) noexcept {
    bool has_host = false, has_agent = false, has_accept = false, has_type = false;
    std::size_t header_bytes = 0;

    if (has_line_break(target.data(), target.size()) || has_line_break(host_header.data(), host_header.size()) ||
        has_line_break(user_agent.data(), user_agent.size()))
        return "the request target, host or user agent contains a line break";
    for (const std::string &line : header_lines) {
        std::size_t colon = line.find(':');
        if (has_line_break(line.data(), line.size())) return "a header line contains a line break";
        if (colon == std::string::npos || colon == 0) continue;
        const char *name = line.data();
        has_host |= ascii_iequals(name, colon, "host");
        has_agent |= ascii_iequals(name, colon, "user-agent");
        has_accept |= ascii_iequals(name, colon, "accept");
        has_type |= ascii_iequals(name, colon, "content-type");
        header_bytes += line.size() + 2;
    }

    const std::size_t before = out.size();
    try {
        out.reserve(before + 128 + target.size() + host_header.size() + user_agent.size() + header_bytes + body_len);
        out += "POST ";
        out += target;
        out += " HTTP/1.1\r\n";
        if (!has_host) {
            out += "Host: ";
            out += host_header;
            out += "\r\n";
        }
        if (!has_agent && !user_agent.empty()) {
            out += "User-Agent: ";
            out += user_agent;
            out += "\r\n";
        }
        if (!has_accept) out += "Accept: */*\r\n";
        for (const std::string &line : header_lines) {
            std::size_t colon = line.find(':');
            if (colon == std::string::npos || colon == 0) continue;
            if (ascii_iequals(line.data(), colon, "content-length") ||
                ascii_iequals(line.data(), colon, "transfer-encoding"))
                continue;
            const char *v = line.data() + colon + 1;
            std::size_t vlen = line.size() - colon - 1;
            ascii_trim_ows(v, vlen);
            if (vlen == 0) continue; /* blank: removes the built-in of that name, sends nothing */
            out += line;
            out += "\r\n";
        }
        if (!has_type) out += "Content-Type: application/x-www-form-urlencoded\r\n";
        out += "Content-Length: ";
        out += std::to_string(body_len);
        out += "\r\n\r\n";
        out.append(body, body_len);
    } catch (...) {
        out.resize(before);
        return "out of memory";
    }
    return nullptr;
}

/* ---------------------------------------------------------------- ResponseParser */

void ResponseParser::reset(BodySink sink, void *ctx) noexcept {
    sink_ = sink;
    ctx_ = ctx;
    state_ = State::kHead;
    result_ = Result::kNeedMore;
    partial_.clear();
    field_.clear();
    head_bytes_ = 0;
    trailer_bytes_ = 0;
    status_ = 0;
    block_status_ = 0;
    minor_ = 1;
    clear_block();
    keep_alive_ = false;
    extra_bytes_ = false;
    sink_stopped_ = false;
    remaining_ = 0;
    received_ = 0;
    body_bytes_ = 0;
    error_ = "";
}

/* What one header block says (a status line starts a new one: an interim response's headers do not carry over). */
void ResponseParser::clear_block() noexcept {
    have_length_ = false;
    length_ = 0;
    chunked_ = false;
    te_other_ = false;
    conn_close_ = false;
    conn_keep_alive_ = false;
    retry_after_.clear();
}

ResponseParser::Result ResponseParser::fail(const char *why) noexcept {
    result_ = Result::kError;
    error_ = why;
    return result_;
}

/* dst = (append ? dst : "") + the len bytes at s; false (kError) when memory runs out. */
bool ResponseParser::store(std::string &dst, bool append, const char *s, std::size_t len) noexcept {
    try {
        if (!append) dst.clear();
        dst.append(s, len);
        return true;
    } catch (...) {
        fail("out of memory");
        return false;
    }
}

/*
 * The next line: complete (its terminator consumed, CR LF or a bare LF
 * stripped) or, at the end of the data, buffered in partial_ for the next
 * feed.  False when the line is longer than limit (the caller says why)
 * or memory runs out (kError here).
 */
bool ResponseParser::take_line(const char *&p, const char *end, std::size_t limit, const char *&line, std::size_t &len,
                               bool &complete) noexcept {
    const char *nl = static_cast<const char *>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
    try {
        if (nl == nullptr) {
            if (partial_.size() + static_cast<std::size_t>(end - p) > limit) return false;
            partial_.append(p, static_cast<std::size_t>(end - p));
            p = end;
            complete = false;
            return true;
        }
        std::size_t n = static_cast<std::size_t>(nl - p);
        if (partial_.size() + n + 1 > limit) return false;
        if (partial_.empty()) {
            line = p;
            len = n;
        } else {
            partial_.append(p, n);
            line_.swap(partial_);
            partial_.clear();
            line = line_.data();
            len = line_.size();
        }
    } catch (...) {
        fail("out of memory");
        return false;
    }
    p = nl + 1;
    if (len > 0 && line[len - 1] == '\r') len--;
    complete = true;
    return true;
}

bool ResponseParser::status_line(const char *line, std::size_t len) noexcept {
    /* HTTP/1.<digit> SP <3 digits> [SP reason] */
    if (len < 12 || std::memcmp(line, "HTTP/1.", 7) != 0 || line[7] < '0' || line[7] > '9' || line[8] != ' ') {
        fail("the response does not begin with an HTTP/1.x status line");
        return false;
    }
    int code = 0;
    for (int i = 9; i < 12; i++) {
        if (line[i] < '0' || line[i] > '9') {
            fail("the response's status line has no three-digit status code");
            return false;
        }
        code = code * 10 + (line[i] - '0');
    }
    if ((len > 12 && line[12] != ' ') || code < 100 || code > 599) {
        fail("the response's status line has no three-digit status code");
        return false;
    }
    block_status_ = code;
    minor_ = line[7] - '0';
    clear_block();
    return true;
}

bool ResponseParser::header_field(const char *name, std::size_t nlen, const char *v, std::size_t vlen) noexcept {
    ascii_trim_ows(v, vlen);
    if (ascii_iequals(name, nlen, "content-length")) {
        bool ok = for_each_list_element(v, vlen, [this](const char *t, std::size_t tl) {
            std::uint64_t n = 0;
            for (std::size_t i = 0; i < tl; i++) {
                if (t[i] < '0' || t[i] > '9' || n > (UINT64_MAX - 9) / 10) return false;
                n = n * 10 + static_cast<std::uint64_t>(t[i] - '0');
            }
            if (have_length_ && n != length_) return false;
            have_length_ = true;
            length_ = n;
            return true;
        });
        if (!ok || vlen == 0) {
            fail("the response's Content-Length is malformed or conflicting");
            return false;
        }
    } else if (ascii_iequals(name, nlen, "transfer-encoding")) {
        for_each_list_element(v, vlen, [this](const char *t, std::size_t tl) {
            chunked_ = ascii_iequals(t, tl, "chunked");
            te_other_ = !chunked_;
            return true;
        });
    } else if (ascii_iequals(name, nlen, "connection")) {
        for_each_list_element(v, vlen, [this](const char *t, std::size_t tl) {
            if (ascii_iequals(t, tl, "close")) conn_close_ = true;
            if (ascii_iequals(t, tl, "keep-alive")) conn_keep_alive_ = true;
            return true;
        });
    } else if (ascii_iequals(name, nlen, "retry-after")) {
        return store(retry_after_, false, v, vlen);
    }
    return true;
}

/* A complete header line (obsolete folding already joined), without its terminator. */
bool ResponseParser::header_line(const char *line, std::size_t len) noexcept {
    const char *colon = static_cast<const char *>(std::memchr(line, ':', len));
    if (colon == nullptr || colon == line) {
        fail("the response has a header line without a name and colon");
        return false;
    }
    if (ascii_is_ows(colon[-1])) {
        /*
         * libcurl reads "Name : v" as a header of another name and goes on;
         * so do we, but for the framing: which length counts is then
         * uncertain, and a response whose end is uncertain is an error.
         */
        std::size_t n = static_cast<std::size_t>(colon - line);
        while (n > 0 && ascii_is_ows(line[n - 1])) n--;
        if (ascii_iequals(line, n, "content-length") || ascii_iequals(line, n, "transfer-encoding")) {
            fail("the response has white space between a framing header's name and its colon");
            return false;
        }
        return true;
    }
    std::size_t nlen = static_cast<std::size_t>(colon - line);
    return header_field(line, nlen, colon + 1, len - nlen - 1);
}

/* The empty line after the final response's headers: how its body is delimited. */
bool ResponseParser::end_of_head() noexcept {
    status_ = block_status_;
    keep_alive_ = minor_ >= 1 ? !conn_close_ : (conn_keep_alive_ && !conn_close_);
    if (status_ == 204 || status_ == 304) {
        state_ = State::kEnd;
    } else if (chunked_ || te_other_) {
        /* Transfer-Encoding overrides Content-Length; both at once is suspect: no reuse */
        if (have_length_) keep_alive_ = false;
        if (chunked_) {
            state_ = State::kChunkSize;
        } else {
            state_ = State::kClose;
            keep_alive_ = false;
        }
    } else if (have_length_) {
        remaining_ = length_;
        state_ = length_ == 0 ? State::kEnd : State::kLength;
    } else {
        state_ = State::kClose;
        keep_alive_ = false;
    }
    if (state_ == State::kEnd) result_ = Result::kDone;
    return true;
}

/* One line of the header section (status line, header line, folded line or the empty line). */
bool ResponseParser::head_line(const char *line, std::size_t len) noexcept {
    if (block_status_ == 0) {
        if (len == 0) return true; /* empty lines before a status line are skipped */
        return status_line(line, len);
    }
    if (len > 0 && ascii_is_ows(line[0])) {
        /* obsolete line folding: the value goes on */
        if (field_.empty()) {
            fail("the response's first header line is a continuation line");
            return false;
        }
        const char *v = line;
        std::size_t vlen = len;
        ascii_trim_ows(v, vlen);
        return store(field_, true, " ", 1) && store(field_, true, v, vlen);
    }
    if (!field_.empty()) {
        bool ok = header_line(field_.data(), field_.size());
        field_.clear();
        if (!ok) return false;
    }
    if (len > 0) return store(field_, false, line, len);
    /* the empty line: the end of a block */
    if (block_status_ < 200) {
        if (block_status_ == 101) {
            fail("the server switched protocols (101), which no request asks for");
            return false;
        }
        block_status_ = 0; /* an interim response: the final one follows */
        return true;
    }
    return end_of_head();
}

bool ResponseParser::chunk_size_line(const char *line, std::size_t len) noexcept {
    std::size_t i = 0;
    std::uint64_t n = 0;
    while (i < len) {
        char c = ascii_lower(line[i]);
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0) break;
        if (n >> 56) {
            fail("the response has a chunk size too large to be real");
            return false;
        }
        n = n * 16 + static_cast<std::uint64_t>(d);
        i++;
    }
    while (i < len && ascii_is_ows(line[i])) i++;
    if (i == 0 || (i < len && line[i] != ';')) {
        fail("the response has a malformed chunk size");
        return false;
    }
    if (n == 0) {
        state_ = State::kTrailers;
    } else {
        remaining_ = n;
        state_ = State::kChunkData;
    }
    return true;
}

bool ResponseParser::body(const char *data, std::size_t len) noexcept {
    if (len == 0) return true;
    body_bytes_ += len;
    if (sink_ != nullptr && !sink_(ctx_, data, len)) {
        sink_stopped_ = true;
        fail("the response body was refused by its reader");
        return false;
    }
    return true;
}

ResponseParser::Result ResponseParser::feed(const char *data, std::size_t len, std::size_t *consumed) noexcept {
    const char *p = data;
    const char *end = data + len;

    if (result_ != Result::kNeedMore) {
        if (consumed) *consumed = 0;
        return result_;
    }
    received_ += len;
    while (p < end && result_ == Result::kNeedMore) {
        switch (state_) {
            case State::kHead:
            case State::kTrailers:
            case State::kChunkSize:
            case State::kChunkDataEnd: {
                const char *line = nullptr;
                std::size_t n = 0;
                bool complete = false;
                const char *start = p;
                /* the section's bytes before the line being read (a partial line counts once, in take_line) */
                std::size_t used = (state_ == State::kHead ? head_bytes_ : trailer_bytes_) - partial_.size();
                std::size_t limit = state_ == State::kChunkSize      ? kMaxChunkLine
                                    : state_ == State::kChunkDataEnd ? 2
                                                                     : kMaxHeaderSection - used;
                if (!take_line(p, end, limit, line, n, complete)) {
                    if (result_ != Result::kError)
                        fail(state_ == State::kChunkDataEnd ? "the response has a chunk longer than its size"
                             : state_ == State::kChunkSize  ? "the response has a chunk size line too long"
                                                            : "the response's header section is too large");
                    break;
                }
                if (state_ == State::kHead) head_bytes_ += static_cast<std::size_t>(p - start);
                if (state_ == State::kTrailers) trailer_bytes_ += static_cast<std::size_t>(p - start);
                if (!complete) break;
                if (state_ == State::kHead) {
                    head_line(line, n);
                } else if (state_ == State::kTrailers) {
                    if (n == 0) { /* trailer fields are read and ignored */
                        state_ = State::kEnd;
                        result_ = Result::kDone;
                    }
                } else if (state_ == State::kChunkSize) {
                    chunk_size_line(line, n);
                } else if (n != 0) {
                    fail("the response has a chunk longer than its size");
                } else {
                    state_ = State::kChunkSize;
                }
                break;
            }
            case State::kLength:
            case State::kChunkData: {
                std::uint64_t avail = static_cast<std::uint64_t>(end - p);
                std::size_t n = static_cast<std::size_t>(avail < remaining_ ? avail : remaining_);
                if (!body(p, n)) break;
                p += n;
                remaining_ -= n;
                if (remaining_ == 0) {
                    if (state_ == State::kLength) {
                        state_ = State::kEnd;
                        result_ = Result::kDone;
                    } else {
                        state_ = State::kChunkDataEnd;
                    }
                }
                break;
            }
            case State::kClose:
                if (body(p, static_cast<std::size_t>(end - p))) p = end;
                break;
            case State::kEnd:
                result_ = Result::kDone;
                break;
        }
    }
    if (result_ == Result::kDone && p < end) extra_bytes_ = true;
    if (consumed) *consumed = static_cast<std::size_t>(p - data);
    return result_;
}

ResponseParser::Result ResponseParser::finish() noexcept {
    if (result_ != Result::kNeedMore) return result_;
    switch (state_) {
        case State::kClose:
            state_ = State::kEnd;
            result_ = Result::kDone;
            return result_;
        case State::kHead:
            return fail(received_ == 0 ? "the server closed the connection without answering"
                                       : "the connection was closed inside the response's header section");
        case State::kLength:
            return fail("the connection was closed before the end of the response body");
        default:
            return fail("the connection was closed before the last chunk of the response body");
    }
}

} // namespace http1
} // namespace od
