/*
 * core/pattern.hpp — event-type patterns of outbox.subscriptions.
 *
 * Pure C++ (no PostgreSQL headers), noexcept, allocation-free.  A pattern
 * is matched against a message's event_type byte by byte; '*' matches any
 * run of bytes (the empty run too), every other byte matches itself (so
 * "order.*" matches "order.created" and "order." but not "orders.created",
 * and "*" matches every event type).  There is no escape: event types
 * containing '*' are matched by a '*' in the pattern.
 */
#pragma once

#include <cstddef>

namespace od {

/* Patterns of one subscription at most. */
constexpr std::size_t kMaxEventPatterns = 64;
/* Bytes of one pattern at most. */
constexpr std::size_t kMaxEventPatternLength = 256;

/*
 * Does the pattern match the whole text?  Linear in len(pattern) *
 * len(text) at worst (the classic single-backtrack glob), whatever the
 * number of '*'.
 */
bool event_pattern_matches(const char *pattern, std::size_t plen, const char *text, std::size_t tlen) noexcept;

/*
 * A pattern fit for a subscription: 1..kMaxEventPatternLength bytes, no
 * control characters (bytes below 0x20 and 0x7f).  nullptr when fine, else
 * why (a static phrase).
 */
const char *check_event_pattern(const char *pattern, std::size_t len) noexcept;

} // namespace od
