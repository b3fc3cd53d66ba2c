#include "channels/schedule/cron.hpp"

#include <boost/beast/core/string.hpp>

#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <vector>

namespace baton {

namespace {

namespace chr = std::chrono;

constexpr std::int64_t minute_ms = 60'000;
constexpr std::int64_t day_ms = 86'400'000;
constexpr int minutes_per_day = 1440;
// The search window of next_after/last_at_or_before: a leap day recurs within 8 years.
constexpr int search_days = 366 * 30;
// 1970-01-01 .. 9999-12-31: where the civil calendar conversions are exact.
constexpr time_ms min_time = 0;
constexpr time_ms max_time = 253'402'300'799'999;

constexpr std::array<std::string_view, 12> month_names{"jan", "feb", "mar", "apr", "may", "jun",
                                                       "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr std::array<std::string_view, 7> day_names{"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

struct field_spec {
    std::string_view name;
    int min;
    int max;
    int star_max; // what `*` covers (day-of-week: 0-6, 7 being Sunday again)
    const std::string_view* names = nullptr;
    std::size_t name_count = 0;
    int first_named = 0; // the value of names[0]
};

constexpr std::array<field_spec, 5> fields{{
    {"minute", 0, 59, 59},
    {"hour", 0, 23, 23},
    {"day-of-month", 1, 31, 31},
    {"month", 1, 12, 12, month_names.data(), month_names.size(), 1},
    {"day-of-week", 0, 7, 6, day_names.data(), day_names.size(), 0},
}};

std::string quoted(std::string_view s) {
    return "\"" + std::string(s) + "\"";
}

// One value of a field: a number in range or a name. Sets `error` on failure.
std::optional<int> parse_value(std::string_view s, const field_spec& f, std::string& error) {
    if (s.empty()) {
        error = "missing value";
        return std::nullopt;
    }
    if (std::isdigit(static_cast<unsigned char>(s.front()))) {
        int v = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        bool whole = end == s.data() + s.size();
        if (whole && ec == std::errc() && v >= f.min && v <= f.max) return v;
        if (whole && (ec == std::errc() || ec == std::errc::result_out_of_range)) {
            error = std::string(s) + " is out of range " + std::to_string(f.min) + "-" +
                    std::to_string(f.max);
            return std::nullopt;
        }
    }
    for (std::size_t i = 0; i < f.name_count; ++i)
        if (boost::beast::iequals(s, f.names[i])) return f.first_named + static_cast<int>(i);
    error = quoted(s) + (f.names ? " is not a number or a name" : " is not a number");
    return std::nullopt;
}

// One list element: `*`, `*/n`, `a`, `a-b`, `a-b/n`. Sets the bits it selects.
using field_bits = std::bitset<64>;

bool parse_element(std::string_view s, const field_spec& f, field_bits& bits, std::string& error) {
    std::string_view base = s, step_text;
    if (auto slash = s.find('/'); slash != std::string_view::npos) {
        base = s.substr(0, slash);
        step_text = s.substr(slash + 1);
        if (step_text.empty() || step_text.find('/') != std::string_view::npos) {
            error = quoted(s) + ": expected a step as a-b/n or */n";
            return false;
        }
    }
    int lo = 0, hi = 0;
    if (base == "*") {
        lo = f.min;
        hi = f.star_max;
    } else if (auto dash = base.find('-'); dash != std::string_view::npos) {
        auto a = parse_value(base.substr(0, dash), f, error);
        if (!a) return false;
        auto b = parse_value(base.substr(dash + 1), f, error);
        if (!b) return false;
        if (*a > *b) {
            error = "range " + quoted(base) + " runs backwards";
            return false;
        }
        lo = *a;
        hi = *b;
    } else {
        if (!step_text.empty()) {
            error = quoted(s) + ": a step needs * or a range (a-b/n)";
            return false;
        }
        auto v = parse_value(base, f, error);
        if (!v) return false;
        lo = hi = *v;
    }
    int step = 1;
    if (!step_text.empty()) {
        auto [end, ec] = std::from_chars(step_text.data(), step_text.data() + step_text.size(), step);
        if (ec != std::errc() || end != step_text.data() + step_text.size() || step < 1 ||
            step > f.max - f.min + 1) {
            error = "step " + quoted(step_text) + " must be a number from 1 to " +
                    std::to_string(f.max - f.min + 1);
            return false;
        }
    }
    for (int v = lo; v <= hi; v += step)
        bits.set(static_cast<std::size_t>(v));
    return true;
}

bool parse_field(std::string_view text, const field_spec& f, field_bits& bits, std::string& error) {
    std::size_t start = 0;
    while (true) {
        auto comma = text.find(',', start);
        auto element = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
        if (element.empty()) {
            error = "empty list element in " + quoted(text);
            return false;
        }
        if (!parse_element(element, f, bits, error)) return false;
        if (comma == std::string_view::npos) return true;
        start = comma + 1;
    }
}

std::vector<std::string_view> split_fields(std::string_view text) {
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])))
            ++i;
        std::size_t start = i;
        while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])))
            ++i;
        if (i > start) out.push_back(text.substr(start, i - start));
    }
    return out;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
    std::int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

template <std::size_t N> void copy_bits(const field_bits& from, std::bitset<N>& to) {
    for (std::size_t i = 0; i < N; ++i)
        to[i] = from[i];
}

bool day_matches(const cron_schedule& s, std::int64_t day) {
    chr::sys_days sd{chr::days{day}};
    chr::year_month_day ymd{sd};
    if (!s.months[static_cast<unsigned>(ymd.month())]) return false;
    bool dom = s.days_of_month[static_cast<unsigned>(ymd.day())];
    bool dow = s.days_of_week[chr::weekday{sd}.c_encoding()];
    // An unrestricted field has every bit set, unless it is a step such as */2: then both count.
    if (s.dom_restricted && s.dow_restricted) return dom || dow;
    return dom && dow;
}

bool minute_matches(const cron_schedule& s, int minute_of_day) {
    return s.hours[static_cast<std::size_t>(minute_of_day / 60)] &&
           s.minutes[static_cast<std::size_t>(minute_of_day % 60)];
}

} // namespace

cron_parse_result parse_cron(std::string_view text) {
    auto parts = split_fields(text);
    if (parts.size() != fields.size())
        return cron_parse_result::failure(
            "expected 5 fields (minute hour day-of-month month day-of-week), got " +
            std::to_string(parts.size()));
    std::array<field_bits, 5> bits;
    for (std::size_t i = 0; i < fields.size(); ++i) {
        std::string error;
        if (!parse_field(parts[i], fields[i], bits[i], error))
            return cron_parse_result::failure(std::string(fields[i].name) + ": " + error);
    }
    cron_schedule s;
    copy_bits(bits[0], s.minutes);
    copy_bits(bits[1], s.hours);
    copy_bits(bits[2], s.days_of_month);
    copy_bits(bits[3], s.months);
    copy_bits(bits[4], s.days_of_week);
    if (bits[4][7]) s.days_of_week[0] = true; // 7 is Sunday too
    s.dom_restricted = parts[2].front() != '*';
    s.dow_restricted = parts[4].front() != '*';
    return s;
}

std::optional<time_ms> next_after(const cron_schedule& s, time_ms t) {
    if (t < min_time - minute_ms || t >= max_time) return std::nullopt;
    time_ms start = (floor_div(t, minute_ms) + 1) * minute_ms;
    std::int64_t day = floor_div(start, day_ms);
    int from = static_cast<int>((start - day * day_ms) / minute_ms);
    for (int i = 0; i <= search_days; ++i, ++day, from = 0) {
        if (!day_matches(s, day)) continue;
        for (int m = from; m < minutes_per_day; ++m)
            if (minute_matches(s, m)) {
                time_ms at = day * day_ms + m * minute_ms;
                return at <= max_time ? std::optional(at) : std::nullopt;
            }
    }
    return std::nullopt;
}

std::optional<time_ms> last_at_or_before(const cron_schedule& s, time_ms t) {
    if (t < min_time || t > max_time) return std::nullopt;
    time_ms end = floor_div(t, minute_ms) * minute_ms;
    std::int64_t day = floor_div(end, day_ms);
    int to = static_cast<int>((end - day * day_ms) / minute_ms);
    for (int i = 0; i <= search_days && day >= 0; ++i, --day, to = minutes_per_day - 1) {
        if (!day_matches(s, day)) continue;
        for (int m = to; m >= 0; --m)
            if (minute_matches(s, m)) return day * day_ms + m * minute_ms;
    }
    return std::nullopt;
}

bool can_ever_fire(const cron_schedule& s) {
    // Either day field may match then, and every weekday comes in every month.
    if (s.dom_restricted && s.dow_restricted) return true;
    constexpr std::array<unsigned, 13> longest{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    for (unsigned m = 1; m <= 12; ++m) {
        if (!s.months[m]) continue;
        for (unsigned d = 1; d <= longest[m]; ++d)
            if (s.days_of_month[d]) return true;
    }
    return false;
}

} // namespace baton
