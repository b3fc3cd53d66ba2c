// Cron expressions for the schedule channel, without I/O: five fields (minute hour day-of-month
// month day-of-week) evaluated in UTC at minute resolution. Parsing reports the field at fault;
// next_after/last_at_or_before search a bounded window and say "never" beyond it.
#pragma once

#include <baton/types.hpp>

#include <bitset>
#include <optional>
#include <string>
#include <string_view>

namespace baton {

struct cron_schedule {
    std::bitset<60> minutes;
    std::bitset<24> hours;
    std::bitset<32> days_of_month; // bits 1-31
    std::bitset<13> months;        // bits 1-12
    std::bitset<7> days_of_week;   // 0 = Sunday (7 is folded into 0)
    // A day field that begins with `*` is unrestricted (vixie cron's rule). When both are
    // restricted a day matches if either matches; otherwise it must match both.
    bool dom_restricted = false;
    bool dow_restricted = false;
};

// What parse_cron answers: a schedule, or an error message that names the field.
class cron_parse_result {
public:
    cron_parse_result(const cron_schedule& s) : schedule_(s) {}
    static cron_parse_result failure(std::string message) {
        return cron_parse_result(std::move(message));
    }

    explicit operator bool() const { return schedule_.has_value(); }
    bool has_value() const { return schedule_.has_value(); }
    const cron_schedule& value() const { return *schedule_; }
    const cron_schedule& operator*() const { return *schedule_; }
    const cron_schedule* operator->() const { return &*schedule_; }
    // e.g. "minute: 61 is out of range 0-59" (empty on success)
    const std::string& error() const { return error_; }

private:
    explicit cron_parse_result(std::string message) : error_(std::move(message)) {}
    std::optional<cron_schedule> schedule_;
    std::string error_;
};

// "*/15 9-17 * * mon-fri": `*`, numbers, lists `a,b`, ranges `a-b`, steps `*/n` and `a-b/n`, month
// names jan-dec, day names sun-sat (case-insensitive), day-of-week 0-7 (0 and 7 are Sunday).
cron_parse_result parse_cron(std::string_view text);

// The first matching minute strictly after `t` (UTC), or nullopt when none comes within about 30
// years (an expression such as "0 0 30 2 *" that never matches).
std::optional<time_ms> next_after(const cron_schedule& s, time_ms t);
// The last matching minute at or before `t`, or nullopt when none within about 30 years before it.
std::optional<time_ms> last_at_or_before(const cron_schedule& s, time_ms t);

// Whether the schedule can ever match: some selected month has a selected day that exists in it.
bool can_ever_fire(const cron_schedule& s);

} // namespace baton
