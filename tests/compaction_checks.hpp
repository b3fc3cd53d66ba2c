// Scenarios and checks shared by the compaction suites (tests/compaction_*_test.cpp): a session
// filled past t3, the compaction events of a tape and of a turn's stream, and requests as a
// failure message can show them.
#pragma once

#include "tests/context_daemon.hpp"
#include "tests/test_util.hpp"

#include <chrono>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace baton::test {

// What the default summarizer of context_daemon answers.
inline constexpr std::string_view model_summary =
    "MODEL-SUMMARY: the user sent notes and the agent replied.";

// A session filled until the window is past t3 by the last reply alone: `notes` turns of
// `note_bytes` with 40-byte replies, then a turn of `last_bytes` whose `last_reply`-byte reply takes
// the window past t3, while that turn's own request stayed well under it.
struct fill_plan {
    int notes;
    std::size_t note_bytes;
    std::size_t last_bytes;
    std::size_t last_reply;
};
// B = 2000 (t3 = 1800): the last turn's request ~1627 tokens, the window after it ~2031.
inline constexpr fill_plan small_fill{8, 600, 600, 1600};
// B = 20000 (t3 = 18000): ~15323, then ~18927; the last exchange (~3618 tokens) is small enough
// to stay verbatim after a summary (README: up to half of t1, less the summary's cap).
inline constexpr fill_plan large_fill{10, 6000, 40, 14400};

// Runs the plan on `sid`, checking its margins with the fake's count; returns the user messages
// sent, the last one last.
std::vector<std::string> fill_past_t3(context_daemon& c, const fill_plan& plan = small_fill,
                                      std::string_view sid = "s1");

// The one compaction event (payload data) at `level`, or fails the test.
json::object only_event_at(const std::vector<json::object>& events, std::int64_t level);
std::vector<std::int64_t> levels_of(const std::vector<json::object>& events);
// Checks an event's stage, level, trigger, before > after, and before >= at_least.
void check_event(const json::object& e, std::string_view stage, std::int64_t level,
                 std::string_view trigger, std::int64_t at_least);
// Checks that the turn's stream has a `compaction` frame of `stage`, and before > after in each.
void check_frame(const turn_result& t, std::string_view stage);

// The request's messages with this role.
std::vector<const json::value*> with_role(const recorded_request& r, std::string_view role);
// A request in one line, for failure messages: its turn's tag, each message as role and tokens.
std::string describe(const recorded_request& r);
// The summary requests the model got, in order.
std::vector<recorded_request> summary_requests(const context_daemon& c);

} // namespace baton::test
