// The budgeted context and its compaction (issue 7), black-box through the real daemon: the stages
// trigger at their thresholds and say so on the tape and the turn's events, the summary falls back
// to an extract, oversized turns fail context_overflow without reaching the model, /handoff and
// /reset start a new context, the idle timer never overlaps a turn, and a 1,000-turn session
// never sends the model a request over its budget.
//
// Budgets are sized with the fake's own count (tests/context_daemon.hpp); baton learns its
// correction factor from the same count, so each scenario keeps a margin of 5% or more on both
// sides of the threshold it is about.
#include "tests/context_daemon.hpp"

#include <boost/test/unit_test.hpp>

#include <map>
#include <random>
#include <regex>
#include <thread>

using namespace baton::test;
using steady = std::chrono::steady_clock;

namespace {

constexpr std::string_view model_summary = "MODEL-SUMMARY: the user sent notes and the agent replied.";

// A session filled until the window is past t3 by the last reply alone: `notes` turns of
// `note_bytes` with 40-byte replies, then a turn of `last_bytes` whose `last_reply`-byte reply takes
// the window past t3, while that turn's own request stayed well under it.
struct fill_plan {
    int notes;
    std::size_t note_bytes;
    std::size_t last_bytes;
    std::size_t last_reply;
};
// B = 2000 (t3 = 1800): the last turn's request ~1537 tokens, the window after it ~1941.
constexpr fill_plan small_fill{8, 600, 600, 1600};
// B = 20000 (t3 = 18000): ~15233, then ~18837; the last exchange (~3618 tokens) is small enough
// to stay verbatim after a summary (README: up to half of t1, less the summary's cap).
constexpr fill_plan large_fill{10, 6000, 40, 14400};

// Returns the user messages sent, the last one last.
std::vector<std::string> fill_past_t3(context_daemon& c, const fill_plan& plan = small_fill,
                                      std::string_view sid = "s1") {
    std::vector<std::string> sent;
    for (int i = 1; i <= plan.notes + 1; ++i) {
        bool last = i == plan.notes + 1;
        auto text = last ? user_message("last-note", plan.last_bytes,
                                        "{reply:" + std::to_string(plan.last_reply) + "}")
                         : user_message("note-" + std::to_string(i), plan.note_bytes, "{reply:40}");
        auto t = c.turn(text, sid);
        BOOST_TEST_REQUIRE(t.status() == "completed", "fill turn " << i << ": " << t.record);
        BOOST_TEST(t.compactions().empty(), "fill turn " << i << " compacted");
        sent.push_back(text);
    }
    // The scenario's own check, with the fake's count.
    auto reqs = c.d.model.requests();
    auto last = first_request_for(reqs, sent.back());
    BOOST_TEST_REQUIRE(last.has_value());
    auto before = prompt_tokens_of(last->body);
    BOOST_TEST_REQUIRE(before < c.threshold(3) * 95 / 100,
                       "setup: the last fill turn counts " << before);
    BOOST_TEST_REQUIRE(before + message_tokens(plan.last_reply) > c.threshold(3) * 104 / 100,
                       "setup: the window after the last fill turn is "
                           << before + message_tokens(plan.last_reply));
    return sent;
}

// The one compaction event of the tape at `level`, or fails the test.
json::object only_event_at(const std::vector<json::object>& events, std::int64_t level) {
    std::vector<json::object> at;
    for (const auto& e : events)
        if (int_at(e, "level") == level) at.push_back(e);
    BOOST_TEST_REQUIRE(at.size() == 1u, at.size() << " compaction events at level " << level);
    return at.front();
}

std::vector<std::int64_t> levels_of(const std::vector<json::object>& events) {
    std::vector<std::int64_t> out;
    for (const auto& e : events)
        out.push_back(int_at(e, "level"));
    return out;
}

void check_event(const json::object& e, std::string_view stage, std::int64_t level,
                 std::string_view trigger, std::int64_t at_least) {
    BOOST_TEST(string_at(e, "stage") == stage, e);
    BOOST_TEST(int_at(e, "level") == level, e);
    BOOST_TEST(string_at(e, "trigger") == trigger, e);
    auto before = int_at(e, "before_tokens");
    auto after = int_at(e, "after_tokens");
    BOOST_TEST(after >= 0, e);
    BOOST_TEST(before > after, e);
    BOOST_TEST(before >= at_least, "before_tokens " << before << " is under the threshold " << at_least);
}

// The single `compaction` frame of a turn's stream, with before > after.
void check_frame(const turn_result& t, std::string_view stage) {
    auto frames = t.compactions();
    bool found = false;
    for (const auto& f : frames) {
        BOOST_TEST(int_at(f, "before_tokens") > int_at(f, "after_tokens"), f);
        found = found || string_at(f, "stage") == stage;
    }
    BOOST_TEST(found, "no compaction frame with stage " << stage << " among " << frames.size());
}

bool whole_number_in(const std::string& text, std::int64_t n) {
    std::regex re("(^|[^0-9])" + std::to_string(n) + "([^0-9]|$)");
    return std::regex_search(text, re);
}

std::vector<const json::value*> with_role(const recorded_request& r, std::string_view role) {
    std::vector<const json::value*> out;
    for (const auto& m : messages_of(r))
        if (string_at(m.as_object(), "role") == role) out.push_back(&m);
    return out;
}

// A request in one line, for failure messages: its turn's tag, and each message as role:tokens.
std::string describe(const recorded_request& r) {
    std::string out = is_summary_request(r) ? "summary request [" : "[";
    std::string tag;
    for (const auto& m : messages_of(r)) {
        const auto& o = m.as_object();
        auto role = string_at(o, "role");
        auto content = string_at(o, "content");
        if (role == "user") tag = content.substr(0, content.find(' '));
        out += role.substr(0, 1) +
               std::to_string(prompt_tokens_of(json::object{{"messages", json::array{m}}})) + " ";
    }
    return (tag.empty() ? "" : tag + " ") + out + "]";
}

// Waits (polling, bounded) until `pred` holds.
template <class Pred> bool eventually(Pred pred, std::chrono::milliseconds limit) {
    auto deadline = steady::now() + limit;
    while (!pred()) {
        if (steady::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

std::vector<recorded_request> summary_requests(const context_daemon& c) {
    std::vector<recorded_request> out;
    for (auto& r : c.d.model.requests())
        if (is_summary_request(r)) out.push_back(std::move(r));
    return out;
}

// The messages of a long session, the same for every run: sizes vary, some turns call the bulk
// tool with a large or a small output, some the clock (unless `clock` is false: its output changes).
struct session_script {
    std::mt19937 rng{20261130};
    bool clock = true;
    std::size_t pick(int lo, int hi) {
        return static_cast<std::size_t>(std::uniform_int_distribution<int>(lo, hi)(rng));
    }
    std::string next(int i) {
        auto roll = pick(1, 100);
        auto bytes = roll <= 75 ? pick(20, 250) : roll <= 95 ? pick(250, 600) : pick(600, 900);
        std::string how = "{reply:" + std::to_string(pick(10, 300)) + "}";
        if (i % 10 == 3)
            how += "{bulk:" + std::to_string(pick(600, 2400)) + "}";
        else if (i % 10 == 7 && clock)
            how += "{clock}";
        else if (i % 25 == 11)
            how += "{bulk:" + std::to_string(pick(100, 400)) + "}";
        return user_message("turn-" + std::to_string(i), bytes, how);
    }
};

// Runs `turns` turns of varying sizes on s1 (some call the bulk tool with a large or a small
// output, some the clock), checking that every turn completes, every request carries the pinned
// blocks first and fits the budget by the model's count, and the tape keeps every message in
// order. Returns the number of compaction events by level.
std::map<std::int64_t, int> long_session(context_daemon& c, int turns) {
    session_script script;
    std::vector<std::string> sent;
    int not_completed = 0;
    auto started = steady::now();
    for (int i = 1; i <= turns; ++i) {
        auto text = script.next(i);
        auto t = c.turn(text);
        sent.push_back(text);
        if (t.status() != "completed") {
            ++not_completed;
            BOOST_TEST_MESSAGE("turn " << i << " ended " << t.record);
        }
        for (const auto& f : t.compactions())
            BOOST_TEST(int_at(f, "before_tokens") > int_at(f, "after_tokens"),
                       "turn " << i << ": " << f);
    }
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - started);
    BOOST_TEST_MESSAGE(turns << " turns in " << elapsed.count() << " ms");
    BOOST_TEST(not_completed == 0);

    // Every request: the pinned blocks first, and within the budget.
    auto reqs = c.d.model.requests();
    const auto& pinned_blocks = c.options.pinned;
    std::size_t over = 0, unpinned = 0, summaries = 0;
    std::string first_over;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        auto n = c.model_tokens(reqs[i]);
        bool summary = is_summary_request(reqs[i]);
        summaries += summary;
        if (n > c.budget() && over++ < 5)
            first_over +=
                "\n  request " + std::to_string(i) + ": " + std::to_string(n) + " tokens, " +
                describe(reqs[i]) + "; the one before: " +
                (i ? std::to_string(c.model_tokens(reqs[i - 1])) + " tokens, " + describe(reqs[i - 1])
                   : std::string("none"));
        if (summary) continue;
        const auto& msgs = messages_of(reqs[i]);
        bool pinned = msgs.size() > pinned_blocks.size();
        for (std::size_t k = 0; pinned && k < pinned_blocks.size(); ++k)
            pinned = string_at(msgs[k].as_object(), "role") == "system" &&
                     string_at(msgs[k].as_object(), "content") == pinned_blocks[k];
        unpinned += !pinned;
    }
    BOOST_TEST_MESSAGE(reqs.size() << " model requests, " << summaries << " of them summaries");
    BOOST_TEST(over == 0u,
               over << " requests over the budget " << c.budget() << "; the first ones:" << first_over);
    BOOST_TEST(unpinned == 0u, unpinned << " requests without the pinned blocks first");

    // The tape holds every message, in order.
    auto tape = c.tape();
    std::vector<std::string> users;
    for (const auto& e : tape)
        if (string_at(e, "kind") == "message" &&
            string_at(e.at("payload").as_object(), "role") == "user")
            users.push_back(string_at(e.at("payload").as_object(), "text"));
    BOOST_TEST(users.size() == sent.size());
    BOOST_TEST((users == sent), "the tape's user messages differ from those sent");
    std::map<std::int64_t, int> by_level;
    for (const auto& e : compaction_events(tape))
        ++by_level[int_at(e, "level")];
    BOOST_TEST_MESSAGE("compaction events by level: 1:"
                       << by_level[1] << " 2:" << by_level[2] << " 3:" << by_level[3]
                       << " 4:" << by_level[4] << "; anchors " << entries_of(tape, "anchor").size());
    return by_level;
}

} // namespace

BOOST_AUTO_TEST_SUITE(compaction_daemon)

BOOST_AUTO_TEST_CASE(crossing_t1_trims_earlier_tool_outputs_to_previews_and_nothing_else) {
    context_daemon c; // B = 2000: t1 1000, t2 1400, t3 1800
    // A tool output of 4400 bytes (1104 tokens) takes the window to ~1180: past t1, under t2.
    auto alpha = user_message("alpha", 40, "{bulk:4400}{reply:40}");
    auto a = c.turn(alpha);
    BOOST_TEST_REQUIRE(a.status() == "completed", a.record);
    BOOST_TEST(a.compactions().empty());
    auto steps = requests_for(c.d.model.requests(), alpha);
    BOOST_TEST_REQUIRE(steps.size() == 2u);
    // Within its own turn the output fitted the budget: it went to the model whole.
    BOOST_TEST(string_at(messages_of(steps[1]).back().as_object(), "content") == bulk_output(4400));

    auto beta = user_message("beta", 40);
    auto b = c.turn(beta);
    BOOST_TEST_REQUIRE(b.status() == "completed", b.record);
    check_frame(b, "trim_tool_outputs");
    auto tape = c.tape();
    auto events = compaction_events(tape);
    BOOST_TEST(levels_of(events) == std::vector<std::int64_t>{1}, boost::test_tools::per_element());
    check_event(only_event_at(events, 1), "trim_tool_outputs", 1, "turn", c.threshold(1) * 95 / 100);
    BOOST_TEST(entries_of(tape, "anchor").empty());

    // The tape keeps the whole output; the request carries a preview naming that entry.
    auto results = entries_of(tape, "tool_result");
    BOOST_TEST_REQUIRE(results.size() == 1u);
    const auto& full = results[0].at("payload").as_object();
    BOOST_TEST(string_at(full, "output") == bulk_output(4400));
    auto req = first_request_for(c.d.model.requests(), beta);
    BOOST_TEST_REQUIRE(req.has_value());
    check_pinned_first(*req, c.options.pinned);
    auto tools = with_role(*req, "tool");
    BOOST_TEST_REQUIRE(tools.size() == 1u, "the tool round of turn alpha is still in the window");
    auto preview = string_at(tools[0]->as_object(), "content");
    BOOST_TEST(preview.size() < 600u, "preview of " << preview.size() << " bytes");
    BOOST_TEST(preview.starts_with(bulk_output(4400).substr(0, 150)), preview);
    BOOST_TEST(whole_number_in(preview, int_at(results[0], "id")),
               "the preview does not name tape entry " << int_at(results[0], "id") << ": " << preview);
    BOOST_TEST(prompt_tokens_of(req->body) < c.threshold(1));
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(only_tool_outputs_over_512_bytes_are_trimmed) {
    context_daemon c;
    // Outputs of 512, 513 and 2400 bytes in three turns take the window past t1 (~1110 tokens).
    std::vector<std::size_t> sizes{512, 513, 2400};
    for (auto n : sizes) {
        auto text = user_message("out-" + std::to_string(n), 40, "{bulk:" + std::to_string(n) + "}");
        BOOST_TEST_REQUIRE(c.turn(text).status() == "completed");
    }
    auto next = user_message("next", 40);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    BOOST_TEST(levels_of(compaction_events(c.tape())) == std::vector<std::int64_t>{1},
               boost::test_tools::per_element());
    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    auto tools = with_role(*req, "tool");
    BOOST_TEST_REQUIRE(tools.size() == 3u, describe(*req));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        auto content = string_at(tools[i]->as_object(), "content");
        auto full = bulk_output(sizes[i]);
        if (sizes[i] <= 512) {
            BOOST_TEST(content == full,
                       "the " << sizes[i] << "-byte output was cut to " << content.size());
        } else {
            BOOST_TEST(content.size() < sizes[i], "the " << sizes[i] << "-byte output was not trimmed");
            BOOST_TEST(content.starts_with(full.substr(0, 150)), content);
        }
    }
}

BOOST_AUTO_TEST_CASE(crossing_t2_drops_earlier_tool_rounds_and_keeps_the_conversation) {
    context_daemon c;
    // 8 results of 500 bytes (not trimmable: 512 bytes or less) and a 1800-byte message take the
    // window to ~1580: past t2 (1400), under t3 (1800), and trimming cannot help.
    auto alpha = user_message("alpha", 1800, "{bulk:500x8}{reply:40}");
    auto a = c.turn(alpha);
    BOOST_TEST_REQUIRE(a.status() == "completed", a.record);
    BOOST_TEST(a.compactions().empty());

    auto beta = user_message("beta", 40);
    auto b = c.turn(beta);
    BOOST_TEST_REQUIRE(b.status() == "completed", b.record);
    check_frame(b, "drop_tool_rounds");
    auto tape = c.tape();
    auto events = compaction_events(tape);
    BOOST_TEST(levels_of(events) == std::vector<std::int64_t>{2}, boost::test_tools::per_element());
    check_event(only_event_at(events, 2), "drop_tool_rounds", 2, "turn", c.threshold(2) * 95 / 100);
    BOOST_TEST(entries_of(tape, "tool_result").size() == 8u); // the tape keeps them

    auto req = first_request_for(c.d.model.requests(), beta);
    BOOST_TEST_REQUIRE(req.has_value());
    check_pinned_first(*req, c.options.pinned);
    BOOST_TEST(with_role(*req, "tool").empty());
    for (const auto* m : with_role(*req, "assistant"))
        BOOST_TEST(!m->as_object().contains("tool_calls"), "a tool call is still in the window");
    // The conversation itself stays: alpha's message and its final reply.
    auto users = with_role(*req, "user");
    BOOST_TEST_REQUIRE(users.size() == 2u);
    BOOST_TEST(string_at(users[0]->as_object(), "content") == alpha);
    auto replies = with_role(*req, "assistant");
    BOOST_TEST_REQUIRE(replies.size() == 1u);
    BOOST_TEST(string_at(replies[0]->as_object(), "content") == reply_text(40));
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(crossing_t3_summarizes_older_messages_through_the_model_into_an_anchor) {
    // B = 20000: room for a summary of every note and for the last exchange verbatim.
    context_options o;
    o.window = 20200;
    context_daemon c(o);
    auto sent = fill_past_t3(c, large_fill);
    auto next = user_message("after-fill", 40);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    check_frame(t, "summarize");

    auto tape = c.tape();
    auto events = compaction_events(tape);
    BOOST_TEST(levels_of(events) == std::vector<std::int64_t>{3}, boost::test_tools::per_element());
    auto e = only_event_at(events, 3);
    check_event(e, "summarize", 3, "turn", c.threshold(3) * 95 / 100);
    BOOST_TEST(string_at(e, "summarizer") == "model");
    BOOST_TEST(int_at(e, "after_tokens") < c.threshold(3));
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    const auto& anchor = anchors[0].at("payload").as_object();
    BOOST_TEST(string_at(anchor, "name") == "compaction");
    BOOST_TEST(string_at(anchor, "summary").find(model_summary) != std::string::npos, anchor);
    // Nothing left the tape.
    for (const auto& m : sent)
        BOOST_TEST(message_ids(tape, "user", m).size() == 1u);

    // The summary request: its own system prompt, no tools, every older note inside.
    auto summaries = summary_requests(c);
    BOOST_TEST_REQUIRE(summaries.size() == 1u);
    const auto& s = summaries[0].body.as_object();
    BOOST_TEST((!s.contains("tools") || s.at("tools").as_array().empty()),
               "the summary request offers tools");
    auto transcript = json::serialize(s);
    for (int i = 1; i <= large_fill.notes; ++i)
        BOOST_TEST(transcript.find("note-" + std::to_string(i) + " ") != std::string::npos,
                   "note-" << i << " is not in the summary request");

    // The turn's request: pinned blocks, the summary, the last exchange verbatim, the new message.
    auto reqs = c.d.model.requests();
    auto req = first_request_for(reqs, next);
    BOOST_TEST_REQUIRE(req.has_value());
    BOOST_TEST((summaries[0].received_at < req->received_at));
    check_pinned_first(*req, o.pinned);
    const auto& msgs = messages_of(*req);
    const auto pinned = o.pinned.size();
    BOOST_TEST_REQUIRE(msgs.size() == pinned + 4, describe(*req));
    BOOST_TEST(string_at(msgs[pinned].as_object(), "role") == "system");
    BOOST_TEST(string_at(msgs[pinned].as_object(), "content").find(model_summary) != std::string::npos);
    BOOST_TEST(string_at(msgs[pinned + 1].as_object(), "content") == sent.back());
    BOOST_TEST(string_at(msgs[pinned + 2].as_object(), "content") == reply_text(large_fill.last_reply));
    BOOST_TEST(string_at(msgs.back().as_object(), "content") == next);
    BOOST_TEST(prompt_tokens_of(req->body) < c.threshold(3));
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(when_a_summary_leaves_the_context_over_t3_a_handoff_keeps_nothing_verbatim) {
    context_daemon c; // B = 2000, t3 = 1800; a summary may take up to B/5 = 400 tokens
    c.set_summarizer(
        [](const recorded_request&) { return fake_reply::completion("LONG-SUMMARY " + filler(2400)); });
    std::vector<std::string> notes;
    for (int i = 1; i <= 3; ++i) {
        notes.push_back(user_message("note-" + std::to_string(i), 400, "{reply:40}"));
        BOOST_TEST_REQUIRE(c.turn(notes.back()).status() == "completed");
    }
    // ~393 tokens of window and a 1504-token message: past t3. A 400-token summary of the window
    // leaves it past t3 still.
    auto next = user_message("big-question", 6000);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    check_frame(t, "handoff");

    auto tape = c.tape();
    auto events = compaction_events(tape);
    auto e = only_event_at(events, 4);
    check_event(e, "handoff", 4, "turn", c.threshold(3));
    BOOST_TEST(int_at(e, "after_tokens") < c.threshold(3));
    BOOST_TEST(string_at(e, "summarizer") == "model", e);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(!anchors.empty());
    const auto& handoff = anchors.back().at("payload").as_object();
    BOOST_TEST(string_at(handoff, "name") == "handoff");
    BOOST_TEST(string_at(handoff, "summary").starts_with("LONG-SUMMARY"), handoff);

    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    check_pinned_first(*req, c.options.pinned);
    const auto& msgs = messages_of(*req);
    const auto pinned = c.options.pinned.size();
    // Pinned blocks, the handoff's summary, the new message: nothing verbatim in between.
    BOOST_TEST_REQUIRE(msgs.size() == pinned + 2, describe(*req));
    BOOST_TEST(string_at(msgs[pinned].as_object(), "role") == "system");
    BOOST_TEST(string_at(msgs[pinned].as_object(), "content").find("LONG-SUMMARY") != std::string::npos);
    BOOST_TEST(string_at(msgs.back().as_object(), "content") == next);
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(a_failing_summary_call_falls_back_to_an_extract_and_the_turn_completes) {
    context_daemon c;
    c.set_summarizer(
        [](const recorded_request&) { return fake_reply::error(400, "no summaries today"); });
    fill_past_t3(c);
    auto next = user_message("after-fill", 40);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    check_frame(t, "summarize");
    auto tape = c.tape();
    auto e = only_event_at(compaction_events(tape), 3);
    BOOST_TEST(string_at(e, "summarizer") == "extractive", e);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    auto summary = string_at(anchors[0].at("payload").as_object(), "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
    BOOST_TEST(summary_requests(c).size() == 1u); // a 400 is final: no retry

    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    const auto& msgs = messages_of(*req);
    const auto pinned = c.options.pinned.size();
    BOOST_TEST_REQUIRE(msgs.size() >= pinned + 2);
    BOOST_TEST(string_at(msgs[pinned].as_object(), "content").find(extract_prefix) != std::string::npos);
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(a_summary_call_failing_with_500s_falls_back_to_an_extract_after_the_retries) {
    context_daemon c;
    c.set_summarizer([](const recorded_request&) { return fake_reply::error(500, "overloaded"); });
    fill_past_t3(c);
    auto t = c.turn(user_message("after-fill", 40));
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    auto tape = c.tape();
    auto e = only_event_at(compaction_events(tape), 3);
    BOOST_TEST(string_at(e, "summarizer") == "extractive", e);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    auto summary = string_at(anchors[0].at("payload").as_object(), "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
    BOOST_TEST(summary_requests(c).size() > 1u, "a 500 was not retried");
}

BOOST_AUTO_TEST_CASE(an_empty_summary_falls_back_to_an_extract) {
    context_daemon c;
    c.set_summarizer([](const recorded_request&) { return fake_reply::completion(""); });
    fill_past_t3(c);
    auto t = c.turn(user_message("after-fill", 40));
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    auto tape = c.tape();
    auto e = only_event_at(compaction_events(tape), 3);
    BOOST_TEST(string_at(e, "summarizer") == "extractive", e);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    auto summary = string_at(anchors[0].at("payload").as_object(), "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
}

BOOST_AUTO_TEST_CASE(a_message_over_the_budget_fails_context_overflow_without_a_model_request) {
    context_daemon c;
    auto huge = user_message("huge", 8400); // 2104 tokens: over B = 2000 with nothing else
    auto t = c.turn(huge);
    BOOST_TEST(t.status() == "failed", t.record);
    BOOST_TEST(t.error_code() == "context_overflow", t.record);
    BOOST_TEST(t.frames.back().data.at("status").as_string() == "failed");
    BOOST_TEST(c.d.model.requests().empty(), c.d.model.requests().size() << " model requests");
    // The session and the daemon go on.
    auto normal = user_message("normal", 40);
    auto ok = c.turn(normal);
    BOOST_TEST(ok.status() == "completed", ok.record);
    BOOST_TEST(c.d.model.requests().size() == 1u);
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(tool_outputs_that_overflow_a_step_are_trimmed_or_fail_context_overflow) {
    // Thresholds near 1 keep turn-start compaction out of the way: this is about one turn's steps.
    context_options o;
    o.window = 10200;
    o.reserve = 200;
    o.thresholds = {0.98, 0.99, 1.0};
    context_daemon c(o); // B = 10000
    // 7500 + 3004 tokens would not fit: the output goes as a preview, and then it fits.
    auto fits = user_message("fits-after-trim", 30000, "{bulk:12000}");
    auto t = c.turn(fits, "trim");
    BOOST_TEST(t.status() == "completed", t.record);
    auto steps = requests_for(c.d.model.requests(), fits);
    BOOST_TEST_REQUIRE(steps.size() == 2u);
    auto output = string_at(messages_of(steps[1]).back().as_object(), "content");
    BOOST_TEST(output.size() < 600u, "the step's tool output is " << output.size() << " bytes");
    BOOST_TEST(output.starts_with(bulk_output(12000).substr(0, 150)));
    auto results = entries_of(c.tape("trim"), "tool_result");
    BOOST_TEST_REQUIRE(results.size() == 1u);
    BOOST_TEST(string_at(results[0].at("payload").as_object(), "output").size() == 12000u);

    // A first request ~1.5% under t1, then ten tool results: even as previews they overflow.
    // What every request carries besides the messages: pinned blocks and tool schemas.
    const auto fixed = prompt_tokens_of(steps[0].body) - message_tokens(fits.size());
    const auto bytes = static_cast<std::size_t>((c.threshold(1) * 985 / 1000 - fixed - 4) * 4);
    auto tight = user_message("no-room", bytes, "{bulk:3000x10}");
    auto f = c.turn(tight, "tight");
    BOOST_TEST(f.status() == "failed", f.record);
    BOOST_TEST(f.error_code() == "context_overflow", f.record);
    auto sent = requests_for(c.d.model.requests(), tight);
    BOOST_TEST(sent.size() == 1u, "the model got " << sent.size() << " requests for the turn");
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(handoff_and_reset_start_a_new_context_without_calling_the_model) {
    context_options o;
    o.window = 20200; // no compaction here
    context_daemon c(o);
    auto first = user_message("apples", 60);
    auto second = user_message("pears", 60);
    BOOST_TEST_REQUIRE(c.turn(first).status() == "completed");
    BOOST_TEST_REQUIRE(c.turn(second).status() == "completed");
    auto count = c.d.model.requests().size();

    auto h = c.turn("/handoff phase-two");
    BOOST_TEST(h.status() == "completed", h.record);
    BOOST_TEST(int_at(h.record, "steps") == 0);
    BOOST_TEST(c.d.model.requests().size() == count);
    auto anchors = entries_of(c.tape(), "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    const auto& a = anchors[0].at("payload").as_object();
    BOOST_TEST(string_at(a, "name") == "phase-two");
    auto summary = string_at(a, "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
    BOOST_TEST(summary.find("apples") != std::string::npos, summary);

    // The next request: pinned blocks, the summary, the new message; nothing else.
    auto after_handoff = user_message("plums", 60);
    BOOST_TEST_REQUIRE(c.turn(after_handoff).status() == "completed");
    auto req = first_request_for(c.d.model.requests(), after_handoff);
    BOOST_TEST_REQUIRE(req.has_value());
    check_pinned_first(*req, o.pinned);
    const auto& msgs = messages_of(*req);
    BOOST_TEST_REQUIRE(msgs.size() == o.pinned.size() + 2, json::serialize(msgs));
    BOOST_TEST(string_at(msgs[o.pinned.size()].as_object(), "role") == "system");
    BOOST_TEST(string_at(msgs[o.pinned.size()].as_object(), "content").find(summary) !=
               std::string::npos);
    BOOST_TEST(string_at(msgs.back().as_object(), "content") == after_handoff);

    // A bare /handoff is named "handoff".
    BOOST_TEST(c.turn("/handoff").status() == "completed");
    anchors = entries_of(c.tape(), "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 2u);
    BOOST_TEST(string_at(anchors[1].at("payload").as_object(), "name") == "handoff");

    // /reset: an anchor with an empty summary; the next request is the pinned blocks and the message.
    count = c.d.model.requests().size();
    auto r = c.turn("/reset");
    BOOST_TEST(r.status() == "completed", r.record);
    BOOST_TEST(int_at(r.record, "steps") == 0);
    BOOST_TEST(c.d.model.requests().size() == count);
    anchors = entries_of(c.tape(), "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 3u);
    BOOST_TEST(string_at(anchors[2].at("payload").as_object(), "name") == "reset");
    BOOST_TEST(string_at(anchors[2].at("payload").as_object(), "summary").empty());
    auto after_reset = user_message("figs", 60);
    BOOST_TEST_REQUIRE(c.turn(after_reset).status() == "completed");
    req = first_request_for(c.d.model.requests(), after_reset);
    BOOST_TEST_REQUIRE(req.has_value());
    check_pinned_first(*req, o.pinned);
    BOOST_TEST(messages_of(*req).size() == o.pinned.size() + 1, json::serialize(messages_of(*req)));
    // The tape forgets nothing.
    auto tape = c.tape();
    for (const auto& m : {first, second, after_handoff, after_reset})
        BOOST_TEST(message_ids(tape, "user", m).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_message_during_idle_compaction_waits_for_its_summary_call) {
    context_options o;
    o.idle_ms = 300;
    context_daemon c(o);
    c.set_summarizer([](const recorded_request&) {
        return fake_reply::completion("IDLE-SUMMARY: notes were exchanged.")
            .after(std::chrono::milliseconds(500));
    });
    fill_past_t3(c);
    auto idle_from = steady::now();
    BOOST_TEST_REQUIRE(eventually([&] { return !summary_requests(c).empty(); }, std::chrono::seconds(5)),
                       "no idle compaction within 5 s");
    auto posted_at = steady::now();
    auto next = user_message("while-idle", 40);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);

    auto summaries = summary_requests(c);
    BOOST_TEST_REQUIRE(summaries.size() == 1u);
    const auto& s = summaries[0];
    BOOST_TEST((s.received_at - idle_from >= std::chrono::milliseconds(250)),
               "the idle timer fired early");
    BOOST_TEST_REQUIRE(s.answered_at.has_value());
    // The test is about overlap only if the message came while the summary was in flight.
    BOOST_TEST_REQUIRE((posted_at < *s.answered_at), "the message came after the summary answer");
    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    BOOST_TEST((req->received_at >= *s.answered_at),
               "the turn's request came " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 *s.answered_at - req->received_at)
                                                 .count()
                                          << " ms before the summary answer was sent");
    const auto& msgs = messages_of(*req);
    BOOST_TEST_REQUIRE(msgs.size() > c.options.pinned.size());
    BOOST_TEST(string_at(msgs[c.options.pinned.size()].as_object(), "content").find("IDLE-SUMMARY") !=
               std::string::npos);

    // The tape: the idle compaction's anchor and event come before the new message.
    auto tape = c.tape();
    auto user_ids = message_ids(tape, "user", next);
    BOOST_TEST_REQUIRE(user_ids.size() == 1u);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    BOOST_TEST(int_at(anchors[0], "id") < user_ids[0]);
    auto events = entries_of(tape, "event");
    BOOST_TEST_REQUIRE(!events.empty());
    for (const auto& e : events) {
        const auto& data = e.at("payload").at("data").as_object();
        BOOST_TEST(string_at(data, "trigger") == "idle", data);
        BOOST_TEST(int_at(e, "id") < user_ids[0]);
    }
    BOOST_TEST(t.compactions().empty(), "the turn compacted again after the idle compaction");
}

BOOST_AUTO_TEST_CASE(an_idle_session_is_compacted_once_not_repeatedly) {
    context_options o;
    o.idle_ms = 300;
    context_daemon c(o);
    fill_past_t3(c);
    auto idle_from = steady::now();
    BOOST_TEST_REQUIRE(
        eventually([&] { return !entries_of(c.tape(), "anchor").empty(); }, std::chrono::seconds(5)),
        "no idle compaction within 5 s");
    auto summaries = summary_requests(c);
    BOOST_TEST_REQUIRE(summaries.size() == 1u);
    BOOST_TEST((summaries[0].received_at - idle_from >= std::chrono::milliseconds(250)));
    std::this_thread::sleep_for(
        std::chrono::milliseconds(200)); // its event, if written after the anchor
    auto tape = c.tape();
    auto e = only_event_at(compaction_events(tape), 3);
    check_event(e, "summarize", 3, "idle", c.threshold(3) * 95 / 100);
    BOOST_TEST(string_at(e, "summarizer") == "model");
    // Five more idle periods: nothing more happens.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    BOOST_TEST(c.tape().size() == tape.size());
    BOOST_TEST(summary_requests(c).size() == 1u);
}

BOOST_AUTO_TEST_CASE(the_idle_timer_never_fires_into_a_running_turn) {
    context_options o;
    o.idle_ms = 300;
    context_daemon c(o);
    // Six notes: the window (~1137 tokens) is past t1 (1000), where idle compaction starts, and
    // under t3, so a turn does not compact it itself.
    for (int i = 1; i <= 6; ++i)
        BOOST_TEST_REQUIRE(
            c.turn(user_message("note-" + std::to_string(i), 600, "{reply:40}")).status() ==
            "completed");
    // At once, a turn whose model call takes a second: the timer armed by the last note would
    // fire in the middle of it.
    auto slow = user_message("slow-one", 40, "{reply:20}{delay:1000}");
    auto t = c.turn(slow);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    BOOST_TEST(t.compactions().empty());
    auto slow_request = first_request_for(c.d.model.requests(), slow);
    BOOST_TEST_REQUIRE(slow_request.has_value());
    BOOST_TEST_REQUIRE(slow_request->answered_at.has_value());

    // The idle compaction comes, after the turn.
    BOOST_TEST_REQUIRE(eventually([&] { return !summary_requests(c).empty(); }, std::chrono::seconds(5)),
                       "no idle compaction within 5 s of the turn");
    std::this_thread::sleep_for(std::chrono::milliseconds(700)); // two more idle periods
    auto summaries = summary_requests(c);
    BOOST_TEST(summaries.size() == 1u);
    for (const auto& s : summaries)
        BOOST_TEST((s.received_at >= *slow_request->answered_at),
                   "a summary call went out " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                                     *slow_request->answered_at - s.received_at)
                                                     .count()
                                              << " ms before the running turn's model answered");
    auto tape = c.tape();
    auto slow_ids = message_ids(tape, "user", slow);
    BOOST_TEST_REQUIRE(slow_ids.size() == 1u);
    auto events = entries_of(tape, "event");
    BOOST_TEST_REQUIRE(!events.empty());
    for (const auto& e : events) {
        BOOST_TEST(string_at(e.at("payload").at("data").as_object(), "trigger") == "idle");
        BOOST_TEST(int_at(e, "id") > slow_ids[0]);
    }
}

BOOST_AUTO_TEST_CASE(idle_compaction_after_ms_0_disables_the_idle_timer) {
    context_options o;
    o.idle_ms = 0;
    context_daemon c(o);
    fill_past_t3(c);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    BOOST_TEST(summary_requests(c).empty());
    BOOST_TEST(entries_of(c.tape(), "anchor").empty());
    BOOST_TEST(compaction_events(c.tape()).empty());
}

BOOST_AUTO_TEST_CASE(a_thousand_turns_never_send_a_request_over_the_budget_and_lose_nothing) {
    // B = 1000 with t3 = 0.85: a turn starts under 850 tokens and its own tool round (a preview
    // of a large output, or a small one, plus the call) must fit the remaining 150. With t3 = 0.9
    // the 100 left would be less than a small tool result, and such turns could rightly fail.
    context_options o;
    o.window = 1200;
    o.reserve = 200;
    o.thresholds = {0.6, 0.75, 0.85};
    context_daemon c(o);
    auto by_level = long_session(c, 1000);
    for (std::int64_t level : {1, 2, 3})
        BOOST_TEST(by_level[level] > 0, "no compaction at level " << level);
}

BOOST_AUTO_TEST_CASE(a_model_that_counts_twice_the_estimate_still_gets_requests_within_its_budget) {
    // The model reports twice the tokens baton's byte estimate sees: the correction factor must
    // make baton compact twice as early. The same session shape as above, at B = 2000 model
    // tokens (1000 by the bytes).
    context_options o;
    o.window = 2200;
    o.reserve = 200;
    o.thresholds = {0.6, 0.75, 0.85};
    o.token_scale = 2.0;
    context_daemon c(o);
    auto by_level = long_session(c, 150);
    BOOST_TEST(by_level[3] > 0, "no summary in 150 turns");
}

BOOST_AUTO_TEST_CASE(after_a_restart_the_context_is_rebuilt_from_the_tape_as_it_was) {
    context_options o;
    o.window = 1200;
    o.reserve = 200;
    o.thresholds = {0.6, 0.75, 0.85};
    // The reference: 100 turns in one daemon, no restart (no clock: its output differs per run).
    std::vector<std::string> texts;
    std::vector<bool> compacted;
    std::vector<json::array> reference;
    std::vector<std::int64_t> counts;
    {
        context_daemon ref(o);
        session_script script;
        script.clock = false;
        for (int i = 1; i <= 100; ++i) {
            texts.push_back(script.next(i));
            auto t = ref.turn(texts.back());
            BOOST_TEST_REQUIRE(t.status() == "completed", "reference turn " << i << ": " << t.record);
            compacted.push_back(!t.compactions().empty());
        }
        auto reqs = ref.d.model.requests();
        for (const auto& text : texts) {
            auto r = first_request_for(reqs, text);
            BOOST_TEST_REQUIRE(r.has_value());
            reference.push_back(messages_of(*r));
            counts.push_back(prompt_tokens_of(r->body));
        }
    }
    // Restart before a turn that compacted nothing and whose request is 7% or more from every
    // threshold (the correction factor, learned again after a restart, cannot change its fate);
    // rather one whose window holds a trimmed tool output, else a tool round, the latest such.
    auto far_from_thresholds = [&](std::int64_t n) {
        for (double t : o.thresholds) {
            double at = t * static_cast<double>(o.budget());
            if (n > at * 0.93 && n < at * 1.07) return false;
        }
        return true;
    };
    auto score = [&](const json::array& msgs) {
        int best = 0;
        std::map<std::string, std::size_t> asked; // call id -> bytes the bulk tool was asked for
        for (const auto& m : msgs) {
            const auto& mo = m.as_object();
            if (const auto* calls = mo.if_contains("tool_calls"))
                for (const auto& c : calls->as_array()) {
                    auto args = json::parse(c.at("function").at("arguments").as_string());
                    if (args.is_object() && args.as_object().contains("bytes"))
                        asked[string_at(c.as_object(), "id")] =
                            args.at("bytes").to_number<std::size_t>();
                }
            if (string_at(mo, "role") != "tool") continue;
            best = std::max(best, 1);
            auto it = asked.find(string_at(mo, "tool_call_id"));
            if (it != asked.end() && string_at(mo, "content").size() < it->second) best = 2;
        }
        return best;
    };
    std::size_t k = 0;
    int k_score = -1;
    for (std::size_t i = 30; i < texts.size(); ++i) {
        if (compacted[i] || !far_from_thresholds(counts[i])) continue;
        if (int sc = score(reference[i]); sc >= k_score) {
            k = i;
            k_score = sc;
        }
    }
    BOOST_TEST_REQUIRE(k > 0, "setup: no turn to restart before");
    BOOST_TEST_REQUIRE(std::count(compacted.begin(), compacted.begin() + k, true) > 0);
    BOOST_TEST_MESSAGE("restarting before turn " << k + 1 << " of 100 (window score " << k_score << ")");

    context_daemon a(o);
    for (std::size_t i = 0; i < k; ++i)
        BOOST_TEST_REQUIRE(a.turn(texts[i]).status() == "completed");
    a.restart();
    auto t = a.turn(texts[k]);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    BOOST_TEST(t.compactions().empty());
    auto req = first_request_for(a.d.model.requests(), texts[k]);
    BOOST_TEST_REQUIRE(req.has_value());
    BOOST_TEST_MESSAGE("its request: " << describe(*req));
    BOOST_TEST((messages_of(*req) == reference[k]),
               "turn " << k + 1 << " after a restart sends " << describe(*req)
                       << "\n  without a restart it sent " << json::serialize(reference[k]).size()
                       << " bytes: " << json::serialize(reference[k]).substr(0, 3000)
                       << "\n  after: " << json::serialize(messages_of(*req)).substr(0, 3000));
}

BOOST_AUTO_TEST_SUITE_END()
