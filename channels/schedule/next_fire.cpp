#include "channels/schedule/next_fire.hpp"

#include <algorithm>

namespace baton::schedule {

std::optional<time_ms> next_fire(const timing& t, std::optional<time_ms> last, time_ms now) {
    if (t.every_ms) {
        const std::int64_t every = std::max<std::int64_t>(1, *t.every_ms);
        if (!last) return now + every;
        // A cursor from the future (the clock went back) waits one period at most.
        if (*last + every > now) return std::min(*last + every, now + every);
        return *last + (now - *last) / every * every;
    }
    if (!t.cron) return std::nullopt;
    if (!last) return next_after(*t.cron, now);
    auto next = next_after(*t.cron, *last);
    if (!next || *next > now) return next;
    return last_at_or_before(*t.cron, now);
}

} // namespace baton::schedule
