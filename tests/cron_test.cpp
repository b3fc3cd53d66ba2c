// Cron expressions (include/baton/cron.hpp), without I/O: every syntax form, the errors that name
// their field, next_after across month, year and leap-year ends, the day-of-month/day-of-week rule,
// and the config checks of channels.schedules (cron text, names).
#include <baton/config.hpp>
#include "channels/schedule/cron.hpp"

#include "tests/utc_time.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <vector>

using namespace baton;

namespace {

using test::utc_ms;
constexpr auto at = [](auto... a) { return utc_ms(a...); };

cron_schedule parse_ok(std::string_view text) {
    auto r = parse_cron(text);
    BOOST_TEST_REQUIRE(r.has_value(), text << ": " << r.error());
    return *r;
}

std::string parse_error(std::string_view text) {
    auto r = parse_cron(text);
    BOOST_TEST(!r.has_value(), text << " parsed");
    return r.error();
}

template <std::size_t N> std::vector<int> bits(const std::bitset<N>& b) {
    std::vector<int> out;
    for (std::size_t i = 0; i < N; ++i)
        if (b[i]) out.push_back(static_cast<int>(i));
    return out;
}

// next_after as RFC 3339 (readable failures); "never" when there is none.
std::string next(std::string_view expr, time_ms t) {
    auto n = next_after(parse_ok(expr), t);
    return n ? format_time(*n) : "never";
}

std::string errors_of(const std::string& config_text) {
    std::string out;
    for (const auto& e : parse_config(config_text).errors)
        out += (out.empty() ? "" : "\n") + e.to_string();
    return out;
}

std::string config_errors(const std::string& schedules) {
    return errors_of(R"({"channels": {"schedules": [)" + schedules + "]}}");
}

} // namespace

BOOST_AUTO_TEST_SUITE(cron)

BOOST_AUTO_TEST_CASE(every_syntax_form_selects_its_values) {
    auto all = parse_ok("* * * * *");
    BOOST_TEST(all.minutes.count() == 60u);
    BOOST_TEST(all.hours.count() == 24u);
    BOOST_TEST(bits(all.days_of_month).size() == 31u);
    BOOST_TEST(bits(all.months).size() == 12u);
    BOOST_TEST(all.days_of_week.count() == 7u);
    BOOST_TEST(!all.dom_restricted);
    BOOST_TEST(!all.dow_restricted);

    BOOST_TEST(bits(parse_ok("5 * * * *").minutes) == std::vector<int>{5});
    BOOST_TEST(bits(parse_ok("1,2,30 * * * *").minutes) == (std::vector<int>{1, 2, 30}));
    BOOST_TEST(bits(parse_ok("10-13 * * * *").minutes) == (std::vector<int>{10, 11, 12, 13}));
    BOOST_TEST(bits(parse_ok("*/15 * * * *").minutes) == (std::vector<int>{0, 15, 30, 45}));
    BOOST_TEST(bits(parse_ok("10-30/10 * * * *").minutes) == (std::vector<int>{10, 20, 30}));
    BOOST_TEST(bits(parse_ok("0 */6 * * *").hours) == (std::vector<int>{0, 6, 12, 18}));
    BOOST_TEST(bits(parse_ok("0 0 */10 * *").days_of_month) == (std::vector<int>{1, 11, 21, 31}));
    BOOST_TEST(bits(parse_ok("0,5-7,50-59/5 * * * *").minutes) ==
               (std::vector<int>{0, 5, 6, 7, 50, 55}));
    // Names, any case, also in ranges and with steps.
    BOOST_TEST(bits(parse_ok("0 0 1 jan-MAR *").months) == (std::vector<int>{1, 2, 3}));
    BOOST_TEST(bits(parse_ok("0 0 1 Dec,feb *").months) == (std::vector<int>{2, 12}));
    BOOST_TEST(bits(parse_ok("0 0 1 jan-dec/3 *").months) == (std::vector<int>{1, 4, 7, 10}));
    BOOST_TEST(bits(parse_ok("0 9 * * MON-fri").days_of_week) == (std::vector<int>{1, 2, 3, 4, 5}));
    BOOST_TEST(bits(parse_ok("0 9 * * Sun,sat").days_of_week) == (std::vector<int>{0, 6}));
    // 0 and 7 are both Sunday; a range may end at 7.
    BOOST_TEST(bits(parse_ok("0 0 * * 7").days_of_week) == std::vector<int>{0});
    BOOST_TEST(bits(parse_ok("0 0 * * 5-7").days_of_week) == (std::vector<int>{0, 5, 6}));
    BOOST_TEST(bits(parse_ok("0 0 * * */2").days_of_week) == (std::vector<int>{0, 2, 4, 6}));
    // Whitespace between fields is any run of spaces and tabs.
    BOOST_TEST(bits(parse_ok("  7\t 8  * * *  ").hours) == std::vector<int>{8});
    auto days = parse_ok("0 0 13 * fri");
    BOOST_TEST(days.dom_restricted);
    BOOST_TEST(days.dow_restricted);
    BOOST_TEST(!parse_ok("0 0 */2 * fri").dom_restricted);
}

BOOST_AUTO_TEST_CASE(errors_name_the_field) {
    BOOST_TEST(parse_error("* * * *") ==
               "expected 5 fields (minute hour day-of-month month day-of-week), got 4");
    BOOST_TEST(parse_error("* * * * * *") ==
               "expected 5 fields (minute hour day-of-month month day-of-week), got 6");
    BOOST_TEST(parse_error("") ==
               "expected 5 fields (minute hour day-of-month month day-of-week), got 0");
    BOOST_TEST(parse_error("60 * * * *") == "minute: 60 is out of range 0-59");
    BOOST_TEST(parse_error("* 24 * * *") == "hour: 24 is out of range 0-23");
    BOOST_TEST(parse_error("* * 0 * *") == "day-of-month: 0 is out of range 1-31");
    BOOST_TEST(parse_error("* * 32 * *") == "day-of-month: 32 is out of range 1-31");
    BOOST_TEST(parse_error("* * * 13 *") == "month: 13 is out of range 1-12");
    BOOST_TEST(parse_error("* * * * 8") == "day-of-week: 8 is out of range 0-7");
    BOOST_TEST(parse_error("99999999999 * * * *") == "minute: 99999999999 is out of range 0-59");
    BOOST_TEST(parse_error("* * * foo *") == "month: \"foo\" is not a number or a name");
    BOOST_TEST(parse_error("* * * * funday") == "day-of-week: \"funday\" is not a number or a name");
    BOOST_TEST(parse_error("mon * * * *") == "minute: \"mon\" is not a number");
    BOOST_TEST(parse_error("5/2 * * * *") == "minute: \"5/2\": a step needs * or a range (a-b/n)");
    BOOST_TEST(parse_error("*/0 * * * *") == "minute: step \"0\" must be a number from 1 to 60");
    BOOST_TEST(parse_error("*/x * * * *") == "minute: step \"x\" must be a number from 1 to 60");
    BOOST_TEST(parse_error("*/ * * * *") == "minute: \"*/\": expected a step as a-b/n or */n");
    BOOST_TEST(parse_error("1-2/3/4 * * * *") == "minute: \"1-2/3/4\": expected a step as a-b/n or */n");
    BOOST_TEST(parse_error("* 10-5 * * *") == "hour: range \"10-5\" runs backwards");
    BOOST_TEST(parse_error("* * * * fri-mon") == "day-of-week: range \"fri-mon\" runs backwards");
    BOOST_TEST(parse_error("1,,2 * * * *") == "minute: empty list element in \"1,,2\"");
    BOOST_TEST(parse_error("1, * * * *") == "minute: empty list element in \"1,\"");
    BOOST_TEST(parse_error("* 1- * * *") == "hour: missing value");
    BOOST_TEST(parse_error("* * -1 * *") == "day-of-month: missing value");
    BOOST_TEST(parse_error("* * * * *-5") == "day-of-week: \"*\" is not a number or a name");
}

BOOST_AUTO_TEST_CASE(next_after_is_strictly_later_at_minute_resolution) {
    BOOST_TEST(next("* * * * *", at(2026, 11, 30, 12, 0)) == "2026-11-30T12:01:00.000Z");
    BOOST_TEST(next("* * * * *", at(2026, 11, 30, 12, 0, 30)) == "2026-11-30T12:01:00.000Z");
    BOOST_TEST(next("* * * * *", at(2026, 11, 30, 12, 0, 59) + 999) == "2026-11-30T12:01:00.000Z");
    BOOST_TEST(next("*/15 * * * *", at(2026, 11, 30, 12, 14, 59)) == "2026-11-30T12:15:00.000Z");
    BOOST_TEST(next("*/15 * * * *", at(2026, 11, 30, 12, 15)) == "2026-11-30T12:30:00.000Z");
    BOOST_TEST(next("10-30/10 * * * *", at(2026, 11, 30, 12, 0)) == "2026-11-30T12:10:00.000Z");
    BOOST_TEST(next("10-30/10 * * * *", at(2026, 11, 30, 12, 30)) == "2026-11-30T13:10:00.000Z");
    BOOST_TEST(next("0 */6 * * *", at(2026, 11, 30, 19, 0)) == "2026-12-01T00:00:00.000Z");
    BOOST_TEST(next("30 9 * * *", at(2026, 11, 30, 9, 29)) == "2026-11-30T09:30:00.000Z");
    BOOST_TEST(next("30 9 * * *", at(2026, 11, 30, 9, 30)) == "2026-12-01T09:30:00.000Z");
}

BOOST_AUTO_TEST_CASE(next_after_crosses_month_and_year_ends) {
    BOOST_TEST(next("0 0 1 * *", at(2026, 1, 31, 12, 0)) == "2026-02-01T00:00:00.000Z");
    // April has no 31st: the next one is in May.
    BOOST_TEST(next("30 23 31 * *", at(2026, 4, 1)) == "2026-05-31T23:30:00.000Z");
    BOOST_TEST(next("0 0 1 1 *", at(2026, 12, 31, 23, 59)) == "2027-01-01T00:00:00.000Z");
    BOOST_TEST(next("59 23 31 12 *", at(2026, 12, 31, 23, 59)) == "2027-12-31T23:59:00.000Z");
    BOOST_TEST(next("0 12 * jan *", at(2026, 2, 1)) == "2027-01-01T12:00:00.000Z");
    BOOST_TEST(next("* * * * *", at(2026, 12, 31, 23, 59, 30)) == "2027-01-01T00:00:00.000Z");
}

BOOST_AUTO_TEST_CASE(leap_days_and_expressions_that_never_match) {
    BOOST_TEST(next("0 0 29 2 *", at(2026, 3, 1)) == "2028-02-29T00:00:00.000Z");
    BOOST_TEST(next("0 0 29 2 *", at(2028, 2, 29)) == "2032-02-29T00:00:00.000Z");
    // 2100 is not a leap year.
    BOOST_TEST(next("0 0 29 2 *", at(2096, 3, 1)) == "2104-02-29T00:00:00.000Z");
    BOOST_TEST(next("0 0 28 2 *", at(2028, 2, 28, 0, 1)) == "2029-02-28T00:00:00.000Z");
    BOOST_TEST(next("0 0 * 2 *", at(2028, 2, 28, 0, 1)) == "2028-02-29T00:00:00.000Z");
    BOOST_TEST(next("0 0 30 2 *", at(2026, 1, 1)) == "never");
    BOOST_TEST(next("0 0 31 4,6,9,11 *", at(2026, 1, 1)) == "never");
    BOOST_TEST(!last_at_or_before(parse_ok("0 0 30 2 *"), at(2026, 1, 1)).has_value());
    BOOST_TEST(!can_ever_fire(parse_ok("0 0 30 2 *")));
    BOOST_TEST(!can_ever_fire(parse_ok("0 0 31 4,6 *")));
    BOOST_TEST(can_ever_fire(parse_ok("0 0 31 4,5 *")));
    BOOST_TEST(can_ever_fire(parse_ok("0 0 29 2 *")));
    // Either day field may match when both are restricted.
    BOOST_TEST(can_ever_fire(parse_ok("0 0 30 2 mon")));
    BOOST_TEST(next("0 0 30 2 mon", at(2026, 11, 30)) == "2027-02-01T00:00:00.000Z");
}

BOOST_AUTO_TEST_CASE(day_of_month_or_day_of_week_when_both_are_restricted) {
    // 2026-11-30 is a Monday; 2026-12-04 and 12-11 are Fridays; 12-13 is a Sunday.
    BOOST_TEST(next("0 0 13 * fri", at(2026, 11, 30)) == "2026-12-04T00:00:00.000Z");
    BOOST_TEST(next("0 0 13 * fri", at(2026, 12, 11)) == "2026-12-13T00:00:00.000Z");
    BOOST_TEST(next("0 0 13 * fri", at(2026, 12, 13)) == "2026-12-18T00:00:00.000Z");
    BOOST_TEST(next("0 0 13 * *", at(2026, 11, 30)) == "2026-12-13T00:00:00.000Z");
    BOOST_TEST(next("0 0 * * fri", at(2026, 11, 30)) == "2026-12-04T00:00:00.000Z");
    BOOST_TEST(next("0 0 * * 7", at(2026, 11, 30)) == "2026-12-06T00:00:00.000Z");
    BOOST_TEST(next("0 0 * * 0", at(2026, 11, 30)) == "2026-12-06T00:00:00.000Z");
    BOOST_TEST(next("0 9 * * mon-fri", at(2026, 12, 4, 10, 0)) == "2026-12-07T09:00:00.000Z");
    // A day field that begins with * does not count as restricted: both must match (vixie cron).
    BOOST_TEST(next("0 0 */2 * fri", at(2026, 11, 30)) == "2026-12-11T00:00:00.000Z");
}

BOOST_AUTO_TEST_CASE(last_at_or_before_includes_its_minute) {
    auto noon = parse_ok("0 12 * * *");
    BOOST_TEST(format_time(*last_at_or_before(noon, at(2026, 11, 30, 11, 0))) ==
               "2026-11-29T12:00:00.000Z");
    BOOST_TEST(format_time(*last_at_or_before(noon, at(2026, 11, 30, 12, 0))) ==
               "2026-11-30T12:00:00.000Z");
    BOOST_TEST(format_time(*last_at_or_before(noon, at(2026, 11, 30, 12, 0, 59))) ==
               "2026-11-30T12:00:00.000Z");
    BOOST_TEST(format_time(*last_at_or_before(parse_ok("0 0 1 1 *"), at(2027, 1, 1, 0, 0) - 1)) ==
               "2026-01-01T00:00:00.000Z");
    BOOST_TEST(format_time(*last_at_or_before(parse_ok("0 0 29 2 *"), at(2031, 6, 1))) ==
               "2028-02-29T00:00:00.000Z");
}

BOOST_AUTO_TEST_CASE(config_checks_cron_text_and_schedule_names) {
    BOOST_TEST(config_errors(R"({"cron": "*/5 9-17 * * mon-fri", "session": "s", "text": "t"})") == "");
    BOOST_TEST(config_errors(R"({"cron": "61 * * * *", "session": "s", "text": "t"})") ==
               "channels.schedules[0].cron: minute: 61 is out of range 0-59");
    BOOST_TEST(config_errors(R"({"cron": "* * *", "session": "s", "text": "t"})") ==
               "channels.schedules[0].cron: expected 5 fields (minute hour day-of-month month "
               "day-of-week), got 3");
    BOOST_TEST(config_errors(R"({"cron": "0 0 30 2 *", "session": "s", "text": "t"})") ==
               "channels.schedules[0].cron: never fires (no selected month has the selected day "
               "of month)");
    BOOST_TEST(config_errors(R"({"cron": "", "session": "s", "text": "t"})") ==
               "channels.schedules[0].cron: must not be empty");
    BOOST_TEST(config_errors(R"({"every_ms": 315360000001, "session": "s", "text": "t"})") ==
               "channels.schedules[0].every_ms: must be between 1 and 315360000000");
    BOOST_TEST(config_errors(R"({"name": "a b", "every_ms": 5, "session": "s", "text": "t"})") ==
               "channels.schedules[0].name: expected 1-64 characters of [A-Za-z0-9._:@-]");
    BOOST_TEST(config_errors(R"({"name": "x", "every_ms": 5, "session": "s", "text": "t"},
                                {"name": "x", "every_ms": 6, "session": "s", "text": "t"})") ==
               "channels.schedules[1].name: duplicate schedule name \"x\"");

    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "webhook", "to": "nowhere"}})") ==
               "channels.schedules[0].deliver.to: unknown webhook target \"nowhere\"");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "webhook"}})") ==
               "channels.schedules[0].deliver.to: required");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "pigeon"}})") ==
               "channels.schedules[0].deliver.channel: expected http, ws, webhook or telegram");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"to": "x", "via": 1}})") ==
               "channels.schedules[0].deliver.via: unknown key\n"
               "channels.schedules[0].deliver.channel: required");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "telegram", "to": "42"}})") ==
               "channels.schedules[0].deliver.channel: channels.telegram is not configured");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "ws"}})") == "");
    // As the HTTP API refuses it.
    BOOST_TEST(
        config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "http", "to": "x"}})") ==
        "channels.schedules[0].deliver.to: the http channel's reply is the turn record: give no to");
    BOOST_TEST(config_errors(R"({"every_ms": 5, "session": "s", "text": "t",
                                 "deliver": {"channel": "ws", "to": "x"}})") ==
               "channels.schedules[0].deliver.to: the ws channel delivers to the session's own "
               "followers: give no to");
    BOOST_TEST(errors_of(R"({"channels": {"ws": {"enabled": false}, "schedules": [
        {"every_ms": 5, "session": "s", "text": "t", "deliver": {"channel": "ws"}}]}})") ==
               "channels.schedules[0].deliver.channel: channels.ws is disabled");
    auto hooked = parse_config(R"({"channels": {
        "webhook": {"targets": {"crm": {"url": "http://127.0.0.1:9/hook"}}},
        "schedules": [{"every_ms": 5, "session": "s", "text": "t",
                       "deliver": {"channel": "webhook", "to": "crm"}},
                      {"every_ms": 5, "session": "s", "text": "t"}]}})");
    BOOST_TEST_REQUIRE(hooked.errors.empty());
    BOOST_TEST(json::serialize(hooked.cfg.channels.schedules[0].deliver) ==
               R"({"channel":"webhook","to":"crm"})");
    BOOST_TEST(hooked.cfg.channels.schedules[1].deliver.is_null());

    auto r = parse_config(R"({"channels": {"schedules": [
        {"every_ms": 1000, "session": "s", "text": "t"},
        {"every_ms": 1000, "session": "s", "text": "t"},
        {"name": "nightly", "cron": "0 3 * * *", "session": "s", "text": "t"}]}})");
    BOOST_TEST_REQUIRE(r.errors.empty());
    const auto& s = r.cfg.channels.schedules;
    // Derived names: index and a hash of the spec, so two identical schedules still differ.
    BOOST_TEST(s[0].name.starts_with("s0-"));
    BOOST_TEST(s[0].name.size() == 11u);
    BOOST_TEST(s[1].name.starts_with("s1-"));
    BOOST_TEST(s[0].name.substr(3) == s[1].name.substr(3));
    BOOST_TEST(s[2].name == "nightly");
    // Stable across parses (the cursor is found again after a restart).
    auto again = parse_config(R"({"channels": {"schedules": [
        {"every_ms": 1000, "session": "s", "text": "t"}]}})");
    BOOST_TEST(again.cfg.channels.schedules[0].name == s[0].name);
    auto other = parse_config(R"({"channels": {"schedules": [
        {"every_ms": 2000, "session": "s", "text": "t"}]}})");
    BOOST_TEST(other.cfg.channels.schedules[0].name != s[0].name);
}

BOOST_AUTO_TEST_SUITE_END()
