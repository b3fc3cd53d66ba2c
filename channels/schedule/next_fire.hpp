// When a schedule fires next, without I/O: the missed-fire policy in one function, so that it is
// tested with plain numbers. Times are slots (the instant a fire stands for), in ms since the epoch.
#pragma once

#include "channels/schedule/cron.hpp"
#include <baton/types.hpp>

#include <optional>

namespace baton::schedule {

// Either an interval or a cron expression.
struct timing {
    std::optional<std::int64_t> every_ms;
    std::optional<cron_schedule> cron;
};

// The slot to fire next, given the last slot fired (from the cursor; nullopt when it never fired)
// and the time now. A result at or before `now` is due at once: it is the latest slot missed, so
// any number of missed slots fire once. With no last slot the first fire is the next regular one
// (every_ms: now + every_ms; cron: the first match after now). nullopt: never (cron only).
// `last` need not be a slot: the channel stores its first start time as the first `last`.
std::optional<time_ms> next_fire(const timing& t, std::optional<time_ms> last, time_ms now);

} // namespace baton::schedule
