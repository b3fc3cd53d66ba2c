// Cron expressions: parse anything; for a valid schedule the next firing is strictly later, a
// matching minute, and the last firing at or before it is itself.
#include "channels/schedule/cron.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 4) return 0;
    std::uint32_t seed;
    std::memcpy(&seed, data, 4);
    std::string_view in(reinterpret_cast<const char*>(data) + 4, size - 4);
    auto r = baton::parse_cron(in);
    if (!r) {
        if (r.error().empty()) std::abort();
        return 0;
    }
    // Some time between 1970 and ~2106, in ms, not on a minute boundary.
    baton::time_ms t = static_cast<std::int64_t>(seed) * 1000 + 123;
    auto next = baton::next_after(*r, t);
    if (next) {
        if (*next <= t) std::abort();
        if (*next % 60000 != 0) std::abort();
        auto back = baton::last_at_or_before(*r, *next);
        if (!back || *back != *next) std::abort();
    }
    if (next && !baton::can_ever_fire(*r)) std::abort();
    return 0;
}
