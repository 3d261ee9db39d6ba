/*
 * core/ascii.hpp — ASCII protocol text (header names and values, URL
 * schemes, HTTP tokens and dates): letter case, where only A-Z fold,
 * whatever the locale, unlike tolower(), and no byte outside ASCII ever
 * matches a letter; optional white space (OWS: space and tab); and the
 * elements of a comma-separated header value.
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

inline bool ascii_is_ows(char c) noexcept {
    return c == ' ' || c == '\t';
}

/* Moves v and shortens len past the optional white space at both ends. */
inline void ascii_trim_ows(const char *&v, std::size_t &len) noexcept {
    while (len > 0 && ascii_is_ows(*v)) {
        v++;
        len--;
    }
    while (len > 0 && ascii_is_ows(v[len - 1])) len--;
}

/*
 * Calls f(element, element_len) for each element of a comma-separated
 * value (a header list, a tracestate), white space trimmed, empty elements
 * skipped; stops and returns false at the first f that returns false.
 */
template <typename F>
bool for_each_list_element(const char *v, std::size_t len, F f) {
    std::size_t i = 0;
    while (i <= len) {
        std::size_t j = i;
        while (j < len && v[j] != ',') j++;
        const char *t = v + i;
        std::size_t tl = j - i;
        ascii_trim_ows(t, tl);
        if (tl > 0 && !f(t, tl)) return false;
        i = j + 1;
    }
    return true;
}

} // namespace od
