/*
 * core/netfilter.cpp — egress address filter (see netfilter.hpp).
 */
#include "core/netfilter.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace od {

bool NetRange::operator==(const NetRange &o) const noexcept {
    return family == o.family && prefix == o.prefix && std::memcmp(addr, o.addr, sizeof addr) == 0;
}

namespace {

bool parse_one(const std::string &tok, NetRange &r) {
    std::string host = tok;
    int prefix = -1;
    std::size_t slash = tok.find('/');
    if (slash != std::string::npos) {
        std::string bits = tok.substr(slash + 1);
        if (bits.empty() || bits.size() > 3) return false;
        for (char c : bits)
            if (c < '0' || c > '9') return false;
        prefix = std::atoi(bits.c_str());
        host = tok.substr(0, slash);
    }
    std::memset(&r, 0, sizeof r);
    if (host.find(':') != std::string::npos) {
        if (inet_pton(AF_INET6, host.c_str(), r.addr) != 1) return false;
        r.family = 6;
        if (prefix < 0) prefix = 128;
        if (prefix > 128) return false;
    } else {
        if (inet_pton(AF_INET, host.c_str(), r.addr) != 1) return false;
        r.family = 4;
        if (prefix < 0) prefix = 32;
        if (prefix > 32) return false;
    }
    r.prefix = prefix;
    /* clear the host bits: 10.1.2.3/8 is 10.0.0.0/8 */
    int bytes = r.family == 4 ? 4 : 16;
    for (int i = 0; i < bytes; i++) {
        int keep = prefix - i * 8;
        if (keep >= 8) continue;
        r.addr[i] &= keep <= 0 ? 0 : static_cast<unsigned char>(0xFF << (8 - keep));
    }
    return true;
}

} // namespace

const char *parse_networks(const char *list, std::vector<NetRange> &out) {
    static thread_local char problem[160];
    out.clear();
    if (list == nullptr) return nullptr;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (!*p) break;
        const char *start = p;
        while (*p && *p != ' ' && *p != ',' && *p != '\t') p++;
        std::string tok(start, static_cast<std::size_t>(p - start));
        NetRange r;
        if (tok.size() > 64 || !parse_one(tok, r)) {
            std::snprintf(problem, sizeof problem, "has an invalid network \"%.64s\"", tok.c_str());
            return problem;
        }
        if (out.size() >= kMaxNetworks) return "has more than 256 networks";
        out.push_back(r);
    }
    return nullptr;
}

bool in_range(const NetRange &r, int family, const unsigned char *addr) noexcept {
    if (r.family != family) return false;
    int full = r.prefix / 8, rest = r.prefix % 8;
    if (std::memcmp(r.addr, addr, static_cast<std::size_t>(full)) != 0) return false;
    if (rest == 0) return true;
    unsigned char mask = static_cast<unsigned char>(0xFF << (8 - rest));
    return (r.addr[full] & mask) == (addr[full] & mask);
}

bool AddressFilter::allows(const struct sockaddr *sa, std::size_t salen, char *why, std::size_t whylen) const noexcept {
    unsigned char a[16];
    int family;
    char text[INET6_ADDRSTRLEN] = "?";

    if (sa == nullptr) return false;
    if (sa->sa_family == AF_INET && salen >= sizeof(sockaddr_in)) {
        const auto *in = reinterpret_cast<const sockaddr_in *>(sa);
        std::memcpy(a, &in->sin_addr, 4);
        family = 4;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    } else if (sa->sa_family == AF_INET6 && salen >= sizeof(sockaddr_in6)) {
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
        std::memcpy(a, &in6->sin6_addr, 16);
        family = 6;
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
        if (std::memcmp(a, mapped, 12) == 0) { /* ::ffff:a.b.c.d is a.b.c.d */
            std::memmove(a, a + 12, 4);
            family = 4;
        }
    } else {
        if (why && whylen) std::snprintf(why, whylen, "address family %d is not connected to", sa->sa_family);
        return false;
    }
    for (const NetRange &r : denied)
        if (in_range(r, family, a)) {
            if (why && whylen) std::snprintf(why, whylen, "%s is in outbox_dispatcher.denied_networks", text);
            return false;
        }
    if (!allowed.empty()) {
        for (const NetRange &r : allowed)
            if (in_range(r, family, a)) return true;
        if (why && whylen) std::snprintf(why, whylen, "%s is not in outbox_dispatcher.allowed_networks", text);
        return false;
    }
    return true;
}

} // namespace od
