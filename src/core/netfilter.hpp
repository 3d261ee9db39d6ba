/*
 * core/netfilter.hpp — which addresses the workers may connect to (egress).
 *
 * Pure C++ (no PostgreSQL headers).  Two lists of networks in CIDR form
 * ("169.254.0.0/16", "fe80::/10", "10.1.2.3", separated by commas and/or
 * spaces): denied ones are never connected to; when the allow-list is not
 * empty, only addresses in it are.  Denied wins.  An IPv4-mapped IPv6
 * address (::ffff:a.b.c.d) is judged as the IPv4 address it carries, so
 * that a v6 socket cannot reach a denied v4 network.  The check is made on
 * the resolved address of every connection the engine opens
 * (CURLOPT_OPENSOCKETFUNCTION): DNS rebinding cannot get around it.
 */
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct sockaddr;

namespace od {

struct NetRange {
    int family;              /* 4 or 6 */
    unsigned char addr[16];  /* network address, the first 4 bytes for IPv4 */
    int prefix;              /* 0..32 or 0..128 */
    bool operator==(const NetRange &o) const noexcept;
};

/*
 * The default of outbox_dispatcher.denied_networks: "this" network and the
 * unspecified v6 address (both reach the local host), link-local v4 (cloud
 * metadata at 169.254.169.254) and v6, and the metadata services outside
 * them (AWS's IPv6 fd00:ec2::254, Alibaba Cloud's 100.100.100.200).
 */
constexpr const char *kDefaultDeniedNetworks =
    "0.0.0.0/8, ::/128, 169.254.0.0/16, fe80::/10, fd00:ec2::254/128, 100.100.100.200/32";
/* Networks a list may hold at most. */
constexpr std::size_t kMaxNetworks = 256;

/*
 * Parse a list into out (cleared first).  Returns nullptr, or what is wrong
 * (e.g. "has an invalid network \"10.0.0.0/33\""); an empty or blank list
 * is valid (no networks).  Host bits beyond the prefix are cleared.
 */
const char *parse_networks(const char *list, std::vector<NetRange> &out);

/* Whether the address (4 or 16 bytes) lies in the range. */
bool in_range(const NetRange &r, int family, const unsigned char *addr) noexcept;

class AddressFilter {
  public:
    std::vector<NetRange> denied;
    std::vector<NetRange> allowed; /* empty: every address not denied */

    bool operator==(const AddressFilter &o) const noexcept { return denied == o.denied && allowed == o.allowed; }
    bool operator!=(const AddressFilter &o) const noexcept { return !(*this == o); }

    /*
     * May the workers connect to this socket address?  If not, writes why
     * into why (e.g. "169.254.169.254 is in outbox_dispatcher.denied_networks")
     * and returns false.  Addresses of other families (unix sockets) are
     * not connected to by the engine and are refused.
     */
    bool allows(const struct sockaddr *sa, std::size_t salen, char *why, std::size_t whylen) const noexcept;
};

} // namespace od
