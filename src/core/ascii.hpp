/*
 * core/ascii.hpp — ASCII letter case for protocol text (header names,
 * URL schemes, HTTP tokens and dates): only A-Z fold, whatever the locale,
 * unlike tolower(), and no byte outside ASCII ever matches a letter.
 */
#pragma once

#include <cstddef>
#include <cstring>

namespace od {

inline char ascii_lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

/* s (len bytes) is lower_lit (lower case, NUL-terminated) in any letter case. */
inline bool ascii_iequals(const char *s, std::size_t len, const char *lower_lit) noexcept {
    std::size_t n = std::strlen(lower_lit);
    if (len != n) return false;
    for (std::size_t i = 0; i < n; i++)
        if (ascii_lower(s[i]) != lower_lit[i]) return false;
    return true;
}

/* s (len bytes) begins with lower_lit (lower case, NUL-terminated) in any letter case. */
inline bool ascii_istarts(const char *s, std::size_t len, const char *lower_lit) noexcept {
    std::size_t n = std::strlen(lower_lit);
    if (len < n) return false;
    for (std::size_t i = 0; i < n; i++)
        if (ascii_lower(s[i]) != lower_lit[i]) return false;
    return true;
}

} // namespace od
