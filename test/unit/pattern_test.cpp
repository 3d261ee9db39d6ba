// Unit tests for src/core/pattern.cpp: subscription event-type patterns.
#include <gtest/gtest.h>

#include <string>

#include "core/pattern.hpp"

namespace {

bool match(const std::string &p, const std::string &t) {
    return od::event_pattern_matches(p.data(), p.size(), t.data(), t.size());
}
const char *check(const std::string &p) {
    return od::check_event_pattern(p.data(), p.size());
}

TEST(EventPattern, LiteralMatchesOnlyItself) {
    EXPECT_TRUE(match("order.created", "order.created"));
    EXPECT_FALSE(match("order.created", "order.created2"));
    EXPECT_FALSE(match("order.created", "order.create"));
    EXPECT_FALSE(match("order.created", "Order.created")); // bytes, case-sensitive
    EXPECT_FALSE(match("order.created", ""));
}

TEST(EventPattern, StarMatchesAnyRunIncludingEmpty) {
    EXPECT_TRUE(match("*", ""));
    EXPECT_TRUE(match("*", "anything at all"));
    EXPECT_TRUE(match("order.*", "order.created"));
    EXPECT_TRUE(match("order.*", "order."));
    EXPECT_TRUE(match("order.*", "order.line.added"));
    EXPECT_FALSE(match("order.*", "orders.created"));
    EXPECT_FALSE(match("order.*", "order"));
    EXPECT_TRUE(match("*.created", "invoice.created"));
    EXPECT_FALSE(match("*.created", "invoice.created.v2"));
    EXPECT_TRUE(match("order.*.v2", "order.created.v2"));
    EXPECT_TRUE(match("order.*.v2", "order..v2"));
    EXPECT_FALSE(match("order.*.v2", "order.created.v3"));
    EXPECT_TRUE(match("a**b", "ab"));
    EXPECT_TRUE(match("a*b*c", "a-b-b-c"));
    EXPECT_FALSE(match("a*b*c", "a-b-b-"));
}

TEST(EventPattern, BacktracksPastEarlierPartialMatches) {
    EXPECT_TRUE(match("*ab", "aab"));
    EXPECT_TRUE(match("*aab", "aaab"));
    EXPECT_TRUE(match("a*aab", "aaaab"));
    EXPECT_FALSE(match("*aab", "aaba"));
}

TEST(EventPattern, MultibyteIsMatchedByBytes) {
    EXPECT_TRUE(match("commande.*", "commande.payée"));
    EXPECT_TRUE(match("*é*", "commande.payée"));
    EXPECT_FALSE(match("commande.payee", "commande.payée"));
}

TEST(EventPattern, WorstCaseStaysFast) {
    // many stars against a long text without a match: quadratic at worst, never exponential
    std::string p;
    for (int i = 0; i < 100; i++) p += "*a";
    p += "b";
    std::string t(4096, 'a');
    EXPECT_FALSE(match(p, t));
}

TEST(EventPattern, Validation) {
    EXPECT_EQ(check("order.*"), nullptr);
    EXPECT_EQ(check("*"), nullptr);
    EXPECT_EQ(check("commande.payée"), nullptr);
    EXPECT_EQ(check("with space"), nullptr);
    EXPECT_STREQ(check(""), "is empty");
    EXPECT_STREQ(check(std::string(257, 'a')), "is longer than 256 bytes");
    EXPECT_EQ(check(std::string(256, 'a')), nullptr);
    EXPECT_STREQ(check("a\nb"), "contains a control character");
    EXPECT_STREQ(check("a\x7f"), "contains a control character");
    EXPECT_STREQ(check(std::string("a\0b", 3)), "contains a control character");
}

} // namespace
