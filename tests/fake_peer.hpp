// Shared by the fake peers (model server, Telegram Bot API, webhook receiver): their coroutines run
// on the fake's own thread, so an escaped exception is reported on stderr, not through Boost.Test,
// which is not thread-safe.
#pragma once

#include <cstdio>
#include <exception>

namespace baton::test {

// A co_spawn completion handler for a fake peer's coroutine.
inline void report_fake_failure(std::exception_ptr e) {
    if (!e) return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        std::fprintf(stderr, "fake peer coroutine failed: %s\n", x.what());
    }
}

} // namespace baton::test
