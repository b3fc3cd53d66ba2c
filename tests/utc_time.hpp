// UTC times for tests that reason about calendars and RFC 3339 stamps (cron, schedules).
#pragma once

#include <baton/types.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

namespace baton::test {

// Milliseconds since the epoch of a UTC date and time.
inline time_ms utc_ms(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0) {
    using namespace std::chrono;
    auto date = sys_days(year(y) / month(mo) / day(d));
    return duration_cast<milliseconds>((date + hours(h) + minutes(mi) + seconds(s)).time_since_epoch())
        .count();
}

// "2026-11-30T12:00:00.000Z" (what format_time writes) -> ms since the epoch; -1 when malformed.
inline time_ms parse_utc_ms(std::string_view s) {
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, ms = 0;
    if (std::sscanf(std::string(s).c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &y, &mo, &d, &h, &mi, &sec, &ms) !=
        7)
        return -1;
    return utc_ms(y, static_cast<unsigned>(mo), static_cast<unsigned>(d), h, mi, sec) + ms;
}

} // namespace baton::test
