// The daemon against a fake OpenAI-compatible server, through the HTTP API only: a tool call
// completes in two steps, and the turn outcomes a client must handle.
#include "tests/daemon_fixture.hpp"
#include "tests/fake_openai.hpp"
#include "tests/model_daemon.hpp"
#include "tests/sse_frames.hpp"

#include <boost/test/unit_test.hpp>

#include <thread>

using namespace baton;
using namespace baton::test;


BOOST_AUTO_TEST_SUITE(daemon_model)

BOOST_AUTO_TEST_CASE(a_tool_call_completes_in_two_steps_with_the_tool_output_in_the_reply) {
    model_daemon d;
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls"));
    d.model.push(fake_reply::completion("the time is now"));
    auto t = d.wait_for_turn(d.post("what time is it?"));
    BOOST_TEST(t.at("status").as_string() == "completed");
    BOOST_TEST(t.at("steps").as_int64() == 2);
    BOOST_TEST(t.at("reply").as_string() == "the time is now");
    auto reqs = d.model.requests();
    BOOST_REQUIRE_EQUAL(reqs.size(), 2u);
    // The pinned instruction leads; the clock's observation is fed back as a tool message.
    const auto& first = reqs[0].body.at("messages").as_array();
    BOOST_TEST(first[0].at("role").as_string() == "system");
    BOOST_TEST(reqs[0].body.at("tools").as_array().size() == 1u);
    const auto& second = reqs[1].body.at("messages").as_array();
    const auto& observation = second.back().as_object();
    BOOST_TEST(observation.at("role").as_string() == "tool");
    BOOST_TEST(observation.at("tool_call_id").as_string() == "call_1");
    BOOST_TEST(is_rfc3339(observation.at("content")));
    auto tape = d.request("GET", "/v1/sessions/s1/tape");
    std::vector<std::string> kinds;
    for (auto& e : tape.json.at("entries").as_array())
        kinds.emplace_back(e.at("kind").as_string());
    BOOST_TEST(kinds == (std::vector<std::string>{"message", "tool_call", "tool_result", "message"}),
               boost::test_tools::per_element());
}

// DeepSeek's thinking mode answers 400 to a tool step whose assistant message lacks the
// reasoning_content it sent: the reasoning goes back within the turn, streams to clients as
// model.reasoning, stays on the tape, and never becomes the reply or later turns' context.
BOOST_AUTO_TEST_CASE(a_thinking_model_gets_its_reasoning_back_on_the_tool_step) {
    model_daemon d(json::object{}, true);
    json::array calls{
        {{"index", 0}, {"id", "call_1"}, {"function", {{"name", "clock"}, {"arguments", "{}"}}}}};
    d.model.push(fake_reply::sse(
        {chunk({{"role", "assistant"}, {"reasoning_content", "I should check "}}),
         chunk({{"reasoning_content", "the clock."}}), chunk({{"tool_calls", calls}}, "tool_calls")},
        7));
    d.model.push(fake_reply::sse(
        {chunk({{"reasoning_content", "Now answer."}}), chunk({{"content", "It is now."}}, "stop")}));
    auto tid = d.post("what time is it?");
    auto t = d.wait_for_turn(tid);
    BOOST_TEST(t.at("status").as_string() == "completed");
    BOOST_TEST(t.at("reply").as_string() == "It is now.");
    BOOST_TEST(!t.contains("refusal"));

    auto reqs = d.model.requests();
    BOOST_REQUIRE_EQUAL(reqs.size(), 2u);
    const auto& sent = reqs[1].body.at("messages").as_array();
    const auto& asked = sent[sent.size() - 2].as_object();
    BOOST_TEST(asked.at("role").as_string() == "assistant");
    BOOST_TEST(asked.at("tool_calls").at(0).at("id").as_string() == "call_1");
    BOOST_TEST(asked.at("reasoning_content").as_string() == "I should check the clock.");

    std::string reasoning, reply;
    for (const auto& f : parse_sse(d.request("GET", "/v1/turns/" + tid + "/events").body)) {
        if (f.event == "model.reasoning") reasoning += f.data.at("text").as_string();
        if (f.event == "model.delta") reply += f.data.at("text").as_string();
    }
    BOOST_TEST(reasoning == "I should check the clock.Now answer.");
    BOOST_TEST(reply == "It is now.");

    auto tape = d.request("GET", "/v1/sessions/s1/tape");
    std::vector<std::string> kept;
    for (auto& e : tape.json.at("entries").as_array()) {
        const auto& p = e.at("payload").as_object();
        if (e.at("kind") != "message" || p.at("role") != "assistant") continue;
        BOOST_TEST(p.at("reasoning").at("field").as_string() == "reasoning_content");
        kept.emplace_back(p.at("reasoning").at("text").as_string());
    }
    BOOST_TEST(kept == (std::vector<std::string>{"I should check the clock.", "Now answer."}),
               boost::test_tools::per_element());

    // The next turn's context has the earlier answer without its reasoning.
    d.model.push(fake_reply::sse({chunk({{"content", "Still now."}}, "stop")}));
    BOOST_TEST(d.wait_for_turn(d.post("and now?")).at("reply").as_string() == "Still now.");
    reqs = d.model.requests();
    BOOST_REQUIRE_EQUAL(reqs.size(), 3u);
    for (const auto& m : reqs[2].body.at("messages").as_array())
        BOOST_TEST(!m.as_object().contains("reasoning_content"));
}

// An OpenAI refusal: its text is the reply, and the record says it was one.
BOOST_AUTO_TEST_CASE(a_refusal_is_the_reply_and_the_record_says_so) {
    model_daemon d;
    fake_reply r;
    r.headers = {{"Content-Type", "application/json"}};
    r.pieces = {
        R"({"id":"chatcmpl-r","object":"chat.completion","model":"gpt-fake","choices":[{"index":0,)"
        R"("message":{"role":"assistant","content":null,"refusal":"I can't help with that."},)"
        R"("finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7}})"};
    d.model.push(r);
    auto tid = d.post("something bad");
    auto t = d.wait_for_turn(tid);
    BOOST_TEST(t.at("status").as_string() == "completed");
    BOOST_TEST(t.at("reply").as_string() == "I can't help with that.");
    BOOST_TEST(t.at("refusal").as_bool());
    BOOST_TEST(t.at("usage").at("completion_tokens").as_int64() == 7);
    const auto frames = parse_sse(d.request("GET", "/v1/turns/" + tid + "/events").body);
    BOOST_REQUIRE(!frames.empty());
    BOOST_TEST(frames.back().event == "turn.finished");
    BOOST_TEST(frames.back().data.at("refusal").as_bool());
}

BOOST_AUTO_TEST_CASE(streamed_replies_complete) {
    model_daemon d(json::object{}, true);
    d.model.push(fake_reply::stream_text({"hel", "lo ", "wor", "ld"}, 3));
    auto t = d.wait_for_turn(d.post("hi"));
    BOOST_TEST(t.at("status").as_string() == "completed");
    BOOST_TEST(t.at("reply").as_string() == "hello world");
}

BOOST_AUTO_TEST_CASE(a_model_that_keeps_failing_ends_failed_with_model_error) {
    model_daemon d;
    for (int i = 0; i < 4; ++i)
        d.model.push(fake_reply::error(400, "bad request"));
    auto t = d.wait_for_turn(d.post("hi"));
    BOOST_TEST(t.at("status").as_string() == "failed");
    BOOST_TEST(t.at("error").at("code").as_string() == "model_error");
    BOOST_TEST(d.model.requests().size() == 1u); // a 400 is not retried
}

BOOST_AUTO_TEST_CASE(the_step_limiter_ends_step_limit) {
    model_daemon d({{"max_steps", 2}});
    for (int i = 0; i < 3; ++i)
        d.model.push(fake_reply::completion("", {{"c", "clock", "{}"}}, "tool_calls"));
    auto t = d.wait_for_turn(d.post("loop"));
    BOOST_TEST(t.at("status").as_string() == "step_limit");
    BOOST_TEST(t.at("steps").as_int64() == 2);
}

BOOST_AUTO_TEST_CASE(the_turn_deadline_ends_timed_out) {
    model_daemon d({{"turn_timeout_ms", 300}});
    d.model.push(fake_reply::completion("too late").after(std::chrono::milliseconds(1500)));
    auto t = d.wait_for_turn(d.post("slow"));
    BOOST_TEST(t.at("status").as_string() == "timed_out");
}

BOOST_AUTO_TEST_CASE(cancel_ends_stopped_and_a_finished_turn_answers_409) {
    model_daemon d;
    d.model.push(fake_reply::completion("too late").after(std::chrono::milliseconds(1500)));
    auto tid = d.post("slow");
    d.wait_for_turn(tid, {"running"});
    auto c = d.request("POST", "/v1/turns/" + tid + "/cancel");
    BOOST_TEST(c.status == 202u);
    auto t = d.wait_for_turn(tid);
    BOOST_TEST(t.at("status").as_string() == "stopped");
    auto again = d.request("POST", "/v1/turns/" + tid + "/cancel");
    check_error(again, 409, "turn_not_running");
}

BOOST_AUTO_TEST_CASE(stop_command_ends_the_running_turn_stopped_keeping_the_partial_reply) {
    model_daemon d(json::object{}, true);
    auto slow = fake_reply::stream_text({"partial ", "reply ", "that ", "never ", "ends"});
    slow.piece_delay = std::chrono::milliseconds(400);
    d.model.push(slow);
    auto tid = d.post("talk slowly");
    // Wait until the first piece of text is in, then stop.
    d.wait_for_turn(tid, {"running"});
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    auto stop = d.post("/stop");
    auto t = d.wait_for_turn(tid);
    BOOST_TEST(t.at("status").as_string() == "stopped");
    BOOST_REQUIRE(t.at("reply").is_string());
    BOOST_TEST(t.at("reply").as_string().starts_with("partial "));
    BOOST_TEST(t.at("reply").as_string() != "partial reply that never ends");
    auto s = d.wait_for_turn(stop);
    BOOST_TEST(s.at("status").as_string() == "completed");
    BOOST_TEST(s.at("steps").as_int64() == 0);
}

BOOST_AUTO_TEST_CASE(an_http_tool_gets_the_arguments_and_its_body_is_the_observation) {
    json::object tools{{"weather",
                        {{"kind", "http"},
                         {"url", "http://127.0.0.1:1/replaced"},
                         {"description", "weather by city"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}}}}},
                           {"required", json::array{"city"}}}}}}};
    // The fake model server also plays the tool's server: the URL is set once its port is known.
    fake_openai tool_server;
    tools["weather"].as_object()["url"] =
        "http://127.0.0.1:" + std::to_string(tool_server.port()) + "/weather";
    model_daemon d(json::object{}, false, tools);
    d.model.push(fake_reply::completion("", {{"w1", "weather", R"({"city":"Oslo"})"}}, "tool_calls"));
    fake_reply sunny;
    sunny.pieces = {"sunny, 21 C"};
    tool_server.push(sunny);
    d.model.push(fake_reply::completion("It is sunny in Oslo"));
    auto t = d.wait_for_turn(d.post("weather in Oslo?"));
    BOOST_TEST(t.at("status").as_string() == "completed");
    BOOST_TEST(t.at("reply").as_string() == "It is sunny in Oslo");
    auto calls = tool_server.requests();
    BOOST_REQUIRE_EQUAL(calls.size(), 1u);
    BOOST_TEST(calls[0].method == "POST");
    BOOST_TEST(calls[0].target == "/weather");
    BOOST_TEST(calls[0].body.at("city").as_string() == "Oslo");
    auto second = d.model.requests().at(1).body.at("messages").as_array();
    BOOST_TEST(second.back().at("content").as_string() == "sunny, 21 C");
}

// The tool's own timeout_ms is worded as limits.tool_timeout_ms is: a call that ran out of time.
BOOST_AUTO_TEST_CASE(an_http_tool_past_its_timeout_is_an_error_observation_saying_so) {
    fake_openai tool_server;
    json::object tools{{"slow",
                        {{"kind", "http"},
                         {"url", "http://127.0.0.1:" + std::to_string(tool_server.port()) + "/slow"},
                         {"timeout_ms", 100},
                         {"description", "slow"},
                         {"parameters", {{"type", "object"}}}}}};
    model_daemon d(json::object{}, false, tools);
    d.model.push(fake_reply::completion("", {{"s1", "slow", "{}"}}, "tool_calls"));
    fake_reply late;
    late.pieces = {"too late"};
    tool_server.push(late.after(std::chrono::milliseconds(1500)));
    d.model.push(fake_reply::completion("gave up"));
    auto t = d.wait_for_turn(d.post("try the slow one"));
    BOOST_TEST(t.at("status").as_string() == "completed");
    auto second = d.model.requests().at(1).body.at("messages").as_array();
    BOOST_TEST(second.back().at("content").as_string() == "tool slow timed out after 100 ms");
}

BOOST_AUTO_TEST_CASE(max_reply_bytes_clips_the_reply) {
    model_daemon d({{"max_reply_bytes", 5}});
    d.model.push(fake_reply::completion("0123456789"));
    auto t = d.wait_for_turn(d.post("long"));
    BOOST_TEST(t.at("reply").as_string() == "01234");
}

BOOST_AUTO_TEST_SUITE_END()
