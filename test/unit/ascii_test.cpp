// Unit tests for src/core/ascii.hpp: ASCII letter case only.
#include <gtest/gtest.h>

#include "core/ascii.hpp"

namespace {

TEST(Ascii, FoldsOnlyAsciiLetters) {
    EXPECT_EQ(od::ascii_lower('A'), 'a');
    EXPECT_EQ(od::ascii_lower('Z'), 'z');
    EXPECT_EQ(od::ascii_lower('a'), 'a');
    EXPECT_EQ(od::ascii_lower('@'), '@');
    EXPECT_EQ(od::ascii_lower('['), '[');
    EXPECT_EQ(od::ascii_lower('\xC4'), '\xC4'); // a Latin-1 capital stays as it is
}

TEST(Ascii, EqualsAndStartsInAnyLetterCase) {
    EXPECT_TRUE(od::ascii_iequals("Content-Length", 14, "content-length"));
    EXPECT_TRUE(od::ascii_iequals("X-Ab", 2, "x-")); // only len bytes count
    EXPECT_FALSE(od::ascii_iequals("Content-Lengths", 15, "content-length"));
    EXPECT_FALSE(od::ascii_iequals("Content-Lengt", 13, "content-length"));
    EXPECT_FALSE(od::ascii_iequals("K", 1, "\xC4")); // no byte outside ASCII matches a letter
    EXPECT_TRUE(od::ascii_istarts("HTTPS://x", 9, "https://"));
    EXPECT_FALSE(od::ascii_istarts("HTTP", 4, "https://"));
    EXPECT_TRUE(od::ascii_istarts("", 0, ""));
}

} // namespace
