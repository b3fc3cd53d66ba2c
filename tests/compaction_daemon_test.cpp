// The budgeted context and its compaction (issue 7), black-box through the real daemon: each stage
// triggers at its threshold and says so on the tape and in the turn's events, a failed summary
// falls back to an extract, oversized turns fail context_overflow without reaching the model, and
// /handoff and /reset start a new context. (Idle compaction and long sessions:
// compaction_session_test.cpp.)
//
// Budgets are sized with the fake's own count (tests/context_daemon.hpp), which baton's correction
// factor learns, so each scenario keeps a margin of 4% or more on both sides of the threshold it is
// about.
#include "tests/compaction_checks.hpp"

#include <boost/test/unit_test.hpp>

#include <regex>

using namespace baton::test;

namespace {

bool whole_number_in(const std::string& text, std::int64_t n) {
    std::regex re("(^|[^0-9])" + std::to_string(n) + "([^0-9]|$)");
    return std::regex_search(text, re);
}

// Runs `next`, which must complete with exactly one compaction, of `stage` at `level`: on the
// tape (crossed at its threshold) and in the turn's events. Returns the tape after it.
std::vector<json::object> turn_with_one_stage(context_daemon& c, const std::string& next,
                                              std::string_view stage, std::int64_t level) {
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    check_frame(t, stage);
    auto tape = c.tape();
    auto events = compaction_events(tape);
    BOOST_TEST(levels_of(events) == std::vector<std::int64_t>{level}, boost::test_tools::per_element());
    check_event(only_event_at(events, level), stage, level, "turn", c.threshold(static_cast<int>(level)) * 95 / 100);
    return tape;
}

// Fills the session past t3, then runs `next`: its summary must be the extract (the model's
// summary failed or was empty), with one stage-3 event saying so and one anchor.
turn_result turn_past_t3_expecting_an_extract(context_daemon& c, const std::string& next) {
    fill_past_t3(c);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    auto tape = c.tape();
    auto e = only_event_at(compaction_events(tape), 3);
    BOOST_TEST(string_at(e, "summarizer") == "extractive", e);
    auto anchors = entries_of(tape, "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    auto summary = string_at(anchors[0].at("payload").as_object(), "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
    return t;
}

// The model calls GET /metrics counted with `outcome` (baton_model_call_duration_seconds).
std::int64_t model_calls_counted(context_daemon& c, std::string_view outcome) {
    auto r = c.d.request("GET", "/metrics");
    const std::string key =
        "\nbaton_model_call_duration_seconds_count{outcome=\"" + std::string(outcome) + "\"} ";
    auto at = r.body.find(key);
    if (r.status != 200 || at == std::string::npos) return -1;
    return std::stoll(r.body.substr(at + key.size()));
}

// Every request the fake model answered is one model call in /metrics, summary calls included:
// `ok` those it answered, `error` the rest.
void check_model_calls_counted(context_daemon& c, std::int64_t errors) {
    const auto answered = static_cast<std::int64_t>(c.d.model.requests().size()) - errors;
    BOOST_TEST(eventually([&] { return model_calls_counted(c, "ok") == answered; },
                          std::chrono::milliseconds(5000)),
               "ok calls counted: " << model_calls_counted(c, "ok") << ", answered: " << answered);
    BOOST_TEST(model_calls_counted(c, "error") == errors);
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
    auto tape = turn_with_one_stage(c, beta, "trim_tool_outputs", 1);
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
    auto tape = turn_with_one_stage(c, beta, "drop_tool_rounds", 2);
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
    check_model_calls_counted(c, 0);
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

// A message that with the pinned blocks alone reaches t3 leaves a handoff no room under it: the
// request still fits the budget, so stage 3's summary stays rather than give way to an empty one.
BOOST_AUTO_TEST_CASE(a_message_that_alone_reaches_t3_keeps_the_summary_of_what_came_before) {
    context_daemon c; // B = 2000, t3 = 1800
    c.set_summarizer(
        [](const recorded_request&) { return fake_reply::completion("SHORT-SUMMARY of the notes"); });
    for (int i = 1; i <= 3; ++i)
        BOOST_TEST_REQUIRE(
            c.turn(user_message("note-" + std::to_string(i), 400, "{reply:40}")).status() ==
            "completed");
    // With the pinned blocks ~1,900 tokens by the learned count: past t3 by 5%, under B by 5%.
    auto next = user_message("huge-question", 6880);
    auto t = c.turn(next);
    BOOST_TEST_REQUIRE(t.status() == "completed", t.record);
    auto tape = c.tape();
    auto events = compaction_events(tape);
    BOOST_TEST(levels_of(events) == std::vector<std::int64_t>{3}, boost::test_tools::per_element());
    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    const auto& msgs = messages_of(*req);
    const auto pinned = c.options.pinned.size();
    BOOST_TEST_REQUIRE(msgs.size() == pinned + 2, describe(*req));
    BOOST_TEST(string_at(msgs[pinned].as_object(), "content").find("SHORT-SUMMARY") != std::string::npos,
               describe(*req));
    BOOST_TEST(string_at(msgs.back().as_object(), "content") == next);
    c.check_every_request_fits();
}

BOOST_AUTO_TEST_CASE(a_failing_summary_call_falls_back_to_an_extract_and_the_turn_completes) {
    context_daemon c;
    c.set_summarizer(
        [](const recorded_request&) { return fake_reply::error(400, "no summaries today"); });
    auto next = user_message("after-fill", 40);
    auto t = turn_past_t3_expecting_an_extract(c, next);
    check_frame(t, "summarize");
    BOOST_TEST(summary_requests(c).size() == 1u); // a 400 is final: no retry

    auto req = first_request_for(c.d.model.requests(), next);
    BOOST_TEST_REQUIRE(req.has_value());
    const auto& msgs = messages_of(*req);
    const auto pinned = c.options.pinned.size();
    BOOST_TEST_REQUIRE(msgs.size() >= pinned + 2);
    BOOST_TEST(string_at(msgs[pinned].as_object(), "content").find(extract_prefix) != std::string::npos);
    c.check_every_request_fits();
    check_model_calls_counted(c, 1); // the summary call that failed
}

BOOST_AUTO_TEST_CASE(a_summary_call_failing_with_500s_falls_back_to_an_extract_after_the_retries) {
    context_daemon c;
    c.set_summarizer([](const recorded_request&) { return fake_reply::error(500, "overloaded"); });
    turn_past_t3_expecting_an_extract(c, user_message("after-fill", 40));
    BOOST_TEST(summary_requests(c).size() > 1u, "a 500 was not retried");
}

BOOST_AUTO_TEST_CASE(an_empty_summary_falls_back_to_an_extract) {
    context_daemon c;
    c.set_summarizer([](const recorded_request&) { return fake_reply::completion(""); });
    turn_past_t3_expecting_an_extract(c, user_message("after-fill", 40));
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
    auto reqs = c.d.model.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 1u);
    // The failed message stays out of the context: it alone would overflow again.
    for (const auto* m : with_role(reqs[0], "user"))
        BOOST_TEST(string_at(m->as_object(), "content") != huge);
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

BOOST_AUTO_TEST_CASE(a_handoff_right_after_a_restart_still_carries_the_extract) {
    context_options o;
    o.window = 20200;
    context_daemon c(o);
    auto first = user_message("apples", 60);
    BOOST_TEST_REQUIRE(c.turn(first).status() == "completed");
    // The context is no longer cached: the command must see it as read back from the tape.
    c.restart();
    auto h = c.turn("/handoff after-restart");
    BOOST_TEST(h.status() == "completed", h.record);
    auto anchors = entries_of(c.tape(), "anchor");
    BOOST_TEST_REQUIRE(anchors.size() == 1u);
    auto summary = string_at(anchors[0].at("payload").as_object(), "summary");
    BOOST_TEST(summary.starts_with(extract_prefix), summary);
    BOOST_TEST(summary.find("apples") != std::string::npos, summary);
}

BOOST_AUTO_TEST_SUITE_END()
