/*
 * core/pattern.cpp — event-type patterns (see pattern.hpp).
 */
#include "core/pattern.hpp"

namespace od {

bool
event_pattern_matches(const char *pattern, std::size_t plen, const char *text, std::size_t tlen) noexcept
{
    std::size_t p = 0, t = 0;
    bool        starred = false; /* a '*' was seen */
    std::size_t star = 0;        /* position after the last '*' seen */
    std::size_t resume = 0;      /* where in text that '*' currently ends */

    while (t < tlen)
    {
        if (p < plen && pattern[p] == '*')
        {
            starred = true;
            star = ++p;
            resume = t;
        }
        else if (p < plen && pattern[p] == text[t])
        {
            p++;
            t++;
        }
        else if (starred)
        {
            /* let the last '*' swallow one more byte and retry from there */
            p = star;
            t = ++resume;
        }
        else
            return false;
    }
    while (p < plen && pattern[p] == '*')
        p++;
    return p == plen;
}

const char *
check_event_pattern(const char *pattern, std::size_t len) noexcept
{
    if (len == 0)
        return "is empty";
    if (len > kMaxEventPatternLength)
        return "is longer than 256 bytes";
    for (std::size_t i = 0; i < len; i++)
    {
        unsigned char c = (unsigned char) pattern[i];

        if (c < 0x20 || c == 0x7f)
            return "contains a control character";
    }
    return nullptr;
}

} // namespace od
