/*
 * core/oauth.cpp — OAuth 2.0 client credentials (see oauth.hpp).
 *
 * The answer is read with a small JSON scanner of its own: only the top
 * level object's members matter, nested values are skipped (bounded
 * depth), and any syntax error rejects the answer.  No allocation beyond
 * the token itself.
 */
#include "core/oauth.hpp"

#include "core/ascii.hpp"

#include <cstdio>
#include <cstring>

#include "core/validate.hpp"

namespace od {

void append_form_encoded(std::string &out, const char *s, std::size_t len) {
    static const char hex[] = "0123456789ABCDEF";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '*')
            out.push_back(static_cast<char>(c));
        else if (c == ' ')
            out.push_back('+');
        else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
}

bool build_token_request(const OAuthClient &c, std::vector<std::string> &header_lines, std::string &body) noexcept {
    try {
        std::string cred;
        append_form_encoded(cred, c.client_id.data(), c.client_id.size());
        cred.push_back(':');
        append_form_encoded(cred, c.client_secret.data(), c.client_secret.size());
        std::string b64(4 * ((cred.size() + 2) / 3), '\0');
        b64.resize(base64_encode(reinterpret_cast<const unsigned char *>(cred.data()), cred.size(), &b64[0]));
        header_lines.clear();
        header_lines.push_back("Authorization: Basic " + b64);
        header_lines.emplace_back("Content-Type: application/x-www-form-urlencoded");
        header_lines.emplace_back("Accept: application/json");
        body.assign("grant_type=client_credentials");
        if (!c.scope.empty()) {
            body.append("&scope=");
            append_form_encoded(body, c.scope.data(), c.scope.size());
        }
        /* the credentials are not left behind in freed memory any longer than needed */
        std::memset(&cred[0], 0, cred.size());
        return true;
    } catch (...) {
        return false;
    }
}

namespace {

/* A strict JSON scanner over [p, end): each method returns false on a syntax error. */
struct Scanner {
    const char *p;
    const char *end;

    void ws() noexcept {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    }
    bool lit(const char *w) noexcept {
        std::size_t n = std::strlen(w);
        if (static_cast<std::size_t>(end - p) < n || std::memcmp(p, w, n) != 0) return false;
        p += n;
        return true;
    }
    /* A string; its unescaped bytes go to out when out is not null (\u escapes as UTF-8). */
    bool string(std::string *out) {
        if (p >= end || *p != '"') return false;
        p++;
        while (p < end) {
            unsigned char c = static_cast<unsigned char>(*p++);
            if (c == '"') return true;
            if (c < 0x20) return false;
            if (c != '\\') {
                if (out) out->push_back(static_cast<char>(c));
                continue;
            }
            if (p >= end) return false;
            char e = *p++;
            char plain = 0;
            switch (e) {
            case '"': plain = '"'; break;
            case '\\': plain = '\\'; break;
            case '/': plain = '/'; break;
            case 'b': plain = '\b'; break;
            case 'f': plain = '\f'; break;
            case 'n': plain = '\n'; break;
            case 'r': plain = '\r'; break;
            case 't': plain = '\t'; break;
            case 'u': {
                if (end - p < 4) return false;
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *p++;
                    v <<= 4;
                    if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
                    else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
                    else return false;
                }
                if (out) {
                    /* a token is visible ASCII: anything else is rejected later, so a marker will do */
                    out->push_back(v < 0x80 ? static_cast<char>(v) : '\x01');
                }
                continue;
            }
            default: return false;
            }
            if (out) out->push_back(plain);
        }
        return false;
    }
    /* A number; its value to *out (integer part, saturated) when out is not null. */
    bool number(double *out) noexcept {
        const char *s = p;
        if (p < end && *p == '-') p++;
        if (p >= end || *p < '0' || *p > '9') return false;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p < end && *p == '.') {
            p++;
            if (p >= end || *p < '0' || *p > '9') return false;
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            p++;
            if (p < end && (*p == '+' || *p == '-')) p++;
            if (p >= end || *p < '0' || *p > '9') return false;
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        if (out) {
            char buf[64];
            std::size_t n = static_cast<std::size_t>(p - s);
            if (n >= sizeof buf) n = sizeof buf - 1;
            std::memcpy(buf, s, n);
            buf[n] = '\0';
            *out = std::strtod(buf, nullptr);
        }
        return true;
    }
    /* Any value, skipped. */
    bool skip(int depth) {
        ws();
        if (p >= end || depth > 32) return false;
        char c = *p;
        if (c == '"') return string(nullptr);
        if (c == '{' || c == '[') {
            char close = c == '{' ? '}' : ']';
            p++;
            ws();
            if (p < end && *p == close) {
                p++;
                return true;
            }
            for (;;) {
                if (c == '{') {
                    ws();
                    if (!string(nullptr)) return false;
                    ws();
                    if (p >= end || *p++ != ':') return false;
                }
                if (!skip(depth + 1)) return false;
                ws();
                if (p >= end) return false;
                if (*p == ',') {
                    p++;
                    continue;
                }
                if (*p++ != close) return false;
                return true;
            }
        }
        if (c == 't') return lit("true");
        if (c == 'f') return lit("false");
        if (c == 'n') return lit("null");
        return number(nullptr);
    }
};

bool visible_ascii(const std::string &s) noexcept {
    for (unsigned char c : s)
        if (c < 0x21 || c > 0x7e) return false;
    return true;
}

void fail(TokenAnswer &out, const char *why) noexcept {
    out.ok = false;
    out.access_token.clear();
    std::snprintf(out.error, sizeof out.error, "%s", why);
}

} // namespace

void read_token_answer(int transport_error, const char *transport_message, long status, const char *body,
                       std::size_t len, TokenAnswer &out) noexcept {
    out = TokenAnswer();
    if (transport_error != 0) {
        /* curl's own text: it names the host, never the request's headers or body */
        fail(out, "");
        std::snprintf(out.error, sizeof out.error, "token request failed: %s",
                      transport_message && *transport_message ? transport_message : "transport error");
        return;
    }
    try {
        std::string token, token_type, error_code;
        double expires_in = -1;
        bool has_token = false, has_expires = false, syntax = true;
        Scanner s{body ? body : "", (body ? body : "") + len};
        s.ws();
        if (s.p >= s.end || *s.p != '{') syntax = false;
        else {
            s.p++;
            s.ws();
            if (s.p < s.end && *s.p == '}') s.p++;
            else
                for (;;) {
                    std::string key;
                    s.ws();
                    if (!s.string(&key)) { syntax = false; break; }
                    s.ws();
                    if (s.p >= s.end || *s.p++ != ':') { syntax = false; break; }
                    s.ws();
                    bool ok;
                    if (key == "access_token" && s.p < s.end && *s.p == '"') {
                        token.clear();
                        ok = s.string(&token);
                        has_token = ok;
                    } else if (key == "token_type" && s.p < s.end && *s.p == '"') {
                        token_type.clear();
                        ok = s.string(&token_type);
                    } else if (key == "error" && s.p < s.end && *s.p == '"') {
                        error_code.clear();
                        ok = s.string(&error_code);
                    } else if (key == "expires_in" && s.p < s.end && (*s.p == '-' || (*s.p >= '0' && *s.p <= '9'))) {
                        ok = s.number(&expires_in);
                        has_expires = ok;
                    } else if (key == "expires_in" && s.p < s.end && *s.p == '"') {
                        /* some servers send it as a string */
                        std::string v;
                        ok = s.string(&v);
                        if (ok && !v.empty() && v.size() < 20 && v.find_first_not_of("0123456789") == std::string::npos) {
                            expires_in = std::strtod(v.c_str(), nullptr);
                            has_expires = true;
                        }
                    } else
                        ok = s.skip(0);
                    if (!ok) { syntax = false; break; }
                    s.ws();
                    if (s.p < s.end && *s.p == ',') { s.p++; continue; }
                    if (s.p < s.end && *s.p == '}') { s.p++; break; }
                    syntax = false;
                    break;
                }
            s.ws();
            if (syntax && s.p != s.end) syntax = false;
        }
        if (status != 200) {
            /* RFC 6749 5.2: {"error": "invalid_client", ...}; only a short printable code is repeated */
            fail(out, "");
            if (syntax && !error_code.empty() && error_code.size() <= 64 && visible_ascii(error_code))
                std::snprintf(out.error, sizeof out.error, "token endpoint answered %ld (%s)", status,
                              error_code.c_str());
            else
                std::snprintf(out.error, sizeof out.error, "token endpoint answered %ld", status);
            return;
        }
        if (!syntax) {
            fail(out, "token endpoint answered 200 without a JSON object");
            return;
        }
        if (!has_token || token.empty()) {
            fail(out, "token endpoint answered 200 without an access_token");
            return;
        }
        if (token.size() > kMaxAccessToken) {
            fail(out, "");
            std::snprintf(out.error, sizeof out.error, "access token is longer than %zu bytes", kMaxAccessToken);
            return;
        }
        if (!visible_ascii(token)) {
            fail(out, "access token contains characters that cannot be sent in an HTTP header");
            return;
        }
        if (!token_type.empty() && !ascii_iequals(token_type.data(), token_type.size(), "bearer")) {
            fail(out, "token type is not Bearer");
            return;
        }
        int64_t life = kDefaultTokenLifetimeS;
        if (has_expires) {
            if (!(expires_in >= 1)) {
                fail(out, "token endpoint answered 200 with an expires_in below 1 second");
                return;
            }
            life = expires_in >= static_cast<double>(kMaxTokenLifetimeS) ? kMaxTokenLifetimeS
                                                                          : static_cast<int64_t>(expires_in);
        }
        out.ok = true;
        out.access_token.swap(token);
        out.lifetime_s = life;
    } catch (...) {
        fail(out, "out of memory reading the token answer");
    }
}

TokenTimes token_times(int64_t obtained_ms, int64_t lifetime_s) noexcept {
    if (lifetime_s < 1) lifetime_s = 1;
    if (lifetime_s > kMaxTokenLifetimeS) lifetime_s = kMaxTokenLifetimeS;
    const int64_t life_ms = lifetime_s * 1000;
    const int64_t refresh_margin = life_ms / 4 < 60000 ? life_ms / 4 : 60000;
    const int64_t use_margin = life_ms / 10 < 5000 ? life_ms / 10 : 5000;
    return TokenTimes{obtained_ms + life_ms - refresh_margin, obtained_ms + life_ms - use_margin};
}

int64_t token_retry_delay_ms(int failures) noexcept {
    if (failures <= 1) return 1000;
    if (failures >= 7) return 60000;
    int64_t d = 1000LL << (failures - 1);
    return d > 60000 ? 60000 : d;
}

} // namespace od
