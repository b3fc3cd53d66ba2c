// The budgeted context over time, black-box through the real daemon: idle compaction summarizes in
// the session's queue (a message arriving meanwhile waits for it; its timer is
// idle_compaction_test.cpp's, on a manual clock); long
// sessions never send the model a request over its budget, whatever its tokenizer counts, and lose
// nothing from the tape; after a restart the context is rebuilt as it was.
#include "tests/compaction_checks.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <map>
#include <random>

using namespace baton::test;
using steady = std::chrono::steady_clock;

namespace {

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

BOOST_AUTO_TEST_CASE(an_idle_session_is_compacted_with_a_summary) {
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
    // Its event, if written after the anchor.
    BOOST_TEST_REQUIRE(
        eventually([&] { return !compaction_events(c.tape()).empty(); }, std::chrono::seconds(5)));
    auto e = only_event_at(compaction_events(c.tape()), 3);
    check_event(e, "summarize", 3, "idle", c.threshold(3) * 95 / 100);
    BOOST_TEST(string_at(e, "summarizer") == "model");
    // That nothing more comes in later idle periods, and the timer's exact times, are
    // idle_compaction_test.cpp's, on a manual clock.
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
