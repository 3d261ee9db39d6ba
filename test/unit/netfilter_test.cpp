// Unit tests for src/core/netfilter.cpp: the egress address filter.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/netfilter.hpp"

namespace {

sockaddr_in v4(const char *a) {
    sockaddr_in s{};
    s.sin_family = AF_INET;
    inet_pton(AF_INET, a, &s.sin_addr);
    return s;
}

sockaddr_in6 v6(const char *a) {
    sockaddr_in6 s{};
    s.sin6_family = AF_INET6;
    inet_pton(AF_INET6, a, &s.sin6_addr);
    return s;
}

od::AddressFilter filter(const char *denied, const char *allowed = "") {
    od::AddressFilter f;
    EXPECT_EQ(od::parse_networks(denied, f.denied), nullptr) << denied;
    EXPECT_EQ(od::parse_networks(allowed, f.allowed), nullptr) << allowed;
    return f;
}

template <typename S> bool allows(const od::AddressFilter &f, const S &s, std::string *why = nullptr) {
    char buf[160] = "";
    bool ok = f.allows(reinterpret_cast<const sockaddr *>(&s), sizeof s, buf, sizeof buf);
    if (why) *why = buf;
    return ok;
}

TEST(NetFilter, ParsesListsAndRefusesGarbage) {
    std::vector<od::NetRange> r;
    EXPECT_EQ(od::parse_networks("", r), nullptr);
    EXPECT_TRUE(r.empty());
    EXPECT_EQ(od::parse_networks("  , ,", r), nullptr);
    EXPECT_TRUE(r.empty());
    EXPECT_EQ(od::parse_networks(od::kDefaultDeniedNetworks, r), nullptr);
    EXPECT_EQ(r.size(), 6u);
    EXPECT_EQ(od::parse_networks("10.0.0.0/8 192.168.0.0/16,::1, 10.1.2.3", r), nullptr);
    ASSERT_EQ(r.size(), 4u);
    EXPECT_EQ(r[2].family, 6);
    EXPECT_EQ(r[2].prefix, 128);
    EXPECT_EQ(r[3].prefix, 32);
    // host bits are cleared
    EXPECT_EQ(od::parse_networks("10.1.2.3/8", r), nullptr);
    EXPECT_EQ(r[0].addr[1], 0);
    for (const char *bad : {"10.0.0.0/33", "::/129", "10.0.0/8", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8x",
                            "example.com", "fe80::/1000", "1.2.3.4.5", "/8"})
        EXPECT_NE(od::parse_networks(bad, r), nullptr) << bad;
    EXPECT_STREQ(od::parse_networks("10.0.0.0/8, 10.0.0.0/33", r), "has an invalid network \"10.0.0.0/33\"");
    std::string many;
    for (int i = 0; i < 257; i++) many += "10.0.0." + std::to_string(i % 256) + ",";
    EXPECT_STREQ(od::parse_networks(many.c_str(), r), "has more than 256 networks");
}

TEST(NetFilter, DefaultDeniesMetadataAndLinkLocalOnly) {
    od::AddressFilter f = filter(od::kDefaultDeniedNetworks);
    std::string why;
    EXPECT_FALSE(allows(f, v4("169.254.169.254"), &why));
    EXPECT_EQ(why, "169.254.169.254 is in outbox_dispatcher.denied_networks");
    EXPECT_FALSE(allows(f, v4("0.0.0.0")));
    EXPECT_FALSE(allows(f, v4("0.1.2.3")));
    EXPECT_FALSE(allows(f, v6("fe80::1")));
    EXPECT_FALSE(allows(f, v6("febf::1")));
    EXPECT_TRUE(allows(f, v6("fec0::1")));
    EXPECT_FALSE(allows(f, v6("::")));
    EXPECT_FALSE(allows(f, v6("fd00:ec2::254")));
    EXPECT_TRUE(allows(f, v6("fd00:ec2::253")));
    EXPECT_FALSE(allows(f, v4("100.100.100.200")));
    EXPECT_TRUE(allows(f, v4("100.100.100.201")));
    EXPECT_TRUE(allows(f, v4("127.0.0.1")));
    EXPECT_TRUE(allows(f, v4("10.0.0.1")));
    EXPECT_TRUE(allows(f, v4("169.253.255.255")));
    EXPECT_TRUE(allows(f, v4("169.255.0.0")));
    EXPECT_TRUE(allows(f, v6("::1")));
    EXPECT_TRUE(allows(f, v6("2001:db8::1")));
}

TEST(NetFilter, MappedV6IsJudgedAsItsV4) {
    od::AddressFilter f = filter(od::kDefaultDeniedNetworks);
    std::string why;
    EXPECT_FALSE(allows(f, v6("::ffff:169.254.169.254"), &why));
    EXPECT_NE(why.find("denied_networks"), std::string::npos);
    EXPECT_TRUE(allows(f, v6("::ffff:127.0.0.1")));
    od::AddressFilter only_loopback = filter("", "127.0.0.0/8");
    EXPECT_TRUE(allows(only_loopback, v6("::ffff:127.0.0.1")));
}

TEST(NetFilter, AllowListAndDeniedWins) {
    od::AddressFilter f = filter("10.9.0.0/16", "10.0.0.0/8, 2001:db8::/32");
    std::string why;
    EXPECT_TRUE(allows(f, v4("10.1.2.3")));
    EXPECT_TRUE(allows(f, v6("2001:db8:1::5")));
    EXPECT_FALSE(allows(f, v4("10.9.1.1"), &why));
    EXPECT_EQ(why, "10.9.1.1 is in outbox_dispatcher.denied_networks");
    EXPECT_FALSE(allows(f, v4("127.0.0.1"), &why));
    EXPECT_EQ(why, "127.0.0.1 is not in outbox_dispatcher.allowed_networks");
    EXPECT_FALSE(allows(f, v6("::1")));
    // prefix boundaries that are not byte boundaries
    od::AddressFilter g = filter("192.168.4.0/22");
    EXPECT_FALSE(allows(g, v4("192.168.7.255")));
    EXPECT_TRUE(allows(g, v4("192.168.8.0")));
    EXPECT_TRUE(allows(g, v4("192.168.3.255")));
    od::AddressFilter all = filter("0.0.0.0/0, ::/0");
    EXPECT_FALSE(allows(all, v4("8.8.8.8")));
    EXPECT_FALSE(allows(all, v6("2001:4860::8888")));
}

TEST(NetFilter, OtherFamiliesAreRefused) {
    od::AddressFilter f = filter("");
    sockaddr s{};
    s.sa_family = AF_UNIX;
    std::string why;
    EXPECT_FALSE(f.allows(&s, sizeof s, nullptr, 0));
    EXPECT_FALSE(allows(f, s, &why));
    EXPECT_NE(why.find("address family"), std::string::npos);
    EXPECT_FALSE(f.allows(nullptr, 0, nullptr, 0));
}

} // namespace
