// Turn events over SSE (docs/api.md "Turn events"), through the daemon's HTTP API only: the whole
// stream of a turn, resume by Last-Event-ID and ?after=, a gap when frames were dropped, late
// subscribers, heartbeats on an idle stream, and a reader that does not read never slows a turn.
#include "tests/model_daemon.hpp"
#include "tests/sse_frames.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <thread>

using namespace baton::test;

namespace {

std::vector<sse_frame> events_of(const daemon_fixture& d, const std::string& tid, std::string query = "",
                                 const header_list& headers = {}) {
    auto r = d.request("GET", "/v1/turns/" + tid + "/events" + query, {}, headers);
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    BOOST_TEST(r.header("Content-Type").value_or("").starts_with("text/event-stream"));
    return parse_sse(r.body);
}

std::vector<std::string> names(const std::vector<sse_frame>& frames) {
    std::vector<std::string> out;
    for (const auto& f : frames)
        out.push_back(f.event);
    return out;
}

json::object stream_config(json::object server = {}) {
    return json::object{{"server", std::move(server)}};
}

} // namespace

BOOST_AUTO_TEST_SUITE(live_events)

BOOST_AUTO_TEST_CASE(a_finished_turn_replays_every_event_in_order_and_the_stream_ends) {
    model_daemon d(json::object{}, true);
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls"));
    d.model.push(fake_reply::stream_text({"it is ", "now"}));
    auto tid = d.post("what time is it?");
    d.wait_for_turn(tid);
    auto frames = events_of(d, tid);
    BOOST_TEST_REQUIRE(frames.size() > 10u);
    for (std::size_t i = 0; i < frames.size(); ++i)
        BOOST_TEST(frames[i].id == static_cast<std::int64_t>(i + 1));
    BOOST_TEST(frames.front().event == "turn.queued");
    BOOST_TEST(frames[1].event == "turn.started");
    BOOST_TEST(frames.back().event == "turn.finished");
    BOOST_TEST(frames.back().data.at("status").as_string() == "completed");
    BOOST_TEST(frames.back().data.at("reply").as_string() == "it is now");
    auto n = names(frames);
    auto has = [&](const std::string& e) { return std::find(n.begin(), n.end(), e) != n.end(); };
    for (auto e : {"stage.started", "stage.finished", "model.call", "model.result", "model.delta",
                   "tool.call", "tool.result"})
        BOOST_TEST(has(e), "no " << e);
    std::string streamed;
    for (const auto& f : frames) {
        if (f.event == "model.delta") streamed += f.data.at("text").as_string();
        if (f.event == "tool.call") {
            BOOST_TEST(f.data.at("name").as_string() == "clock");
            BOOST_TEST(f.data.at("call_id").as_string() == "call_1");
            BOOST_TEST(f.data.at("step").as_int64() == 1);
        }
        if (f.event == "tool.result") BOOST_TEST(f.data.at("ok").as_bool());
        if (f.event == "stage.finished") {
            // Milliseconds to the microsecond: "12", "0.5" or "3.141", never negative.
            const auto& ms = f.data.at("ms");
            BOOST_TEST_REQUIRE(ms.is_number());
            double v = ms.to_number<double>();
            BOOST_TEST(v >= 0);
            BOOST_TEST(std::abs(v * 1000 - std::round(v * 1000)) < 1e-6, v);
        }
    }
    BOOST_TEST(streamed == "it is now");
    // Every stage, in pipeline order.
    std::vector<std::string> stages;
    for (const auto& f : frames)
        if (f.event == "stage.started") stages.emplace_back(f.data.at("stage").as_string());
    BOOST_TEST(stages == (std::vector<std::string>{"resolve_session", "load_state", "build_prompt",
                                                   "run_model", "save_state", "render_outbound",
                                                   "dispatch_outbound"}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(last_event_id_and_after_resume_after_that_seq) {
    model_daemon d;
    d.model.push(fake_reply::completion("done"));
    auto tid = d.post("hi");
    d.wait_for_turn(tid);
    auto all = events_of(d, tid);
    BOOST_TEST_REQUIRE(all.size() > 5u);
    auto by_header = events_of(d, tid, "", {{"Last-Event-ID", "4"}});
    BOOST_TEST_REQUIRE(by_header.size() == all.size() - 4);
    BOOST_TEST(by_header.front().id == 5);
    auto by_query = events_of(d, tid, "?after=4");
    BOOST_TEST_REQUIRE(by_query.size() == all.size() - 4);
    BOOST_TEST(by_query.front().id == 5);
    // After the last one: nothing more, and the stream still ends.
    auto none = events_of(d, tid, "?after=" + std::to_string(all.back().id));
    BOOST_TEST(none.empty());
    // The largest id a client can send (found by probing the ASan daemon: after + 1 overflowed).
    auto largest = events_of(d, tid, "", {{"Last-Event-ID", "9223372036854775807"}});
    BOOST_TEST(largest.empty());
    BOOST_TEST(events_of(d, tid, "?after=9223372036854775807").empty());
    auto bad = d.request("GET", "/v1/turns/" + tid + "/events?after=x");
    check_error(bad, 400, "invalid_request");
    auto unknown = d.request("GET", "/v1/turns/t_01m8p3g4mhdmdqxn8qwp6jwrbk/events");
    check_error(unknown, 404, "not_found");
}

BOOST_AUTO_TEST_CASE(frames_dropped_from_the_buffer_give_a_leading_gap) {
    // 8 events a turn are kept; a streamed reply of 30 deltas makes many more.
    model_daemon d(json::object{}, true, {}, {}, stream_config({{"events_per_turn", 8}}));
    std::vector<std::string> deltas(30, "x");
    d.model.push(fake_reply::stream_text(deltas));
    auto tid = d.post("many deltas");
    d.wait_for_turn(tid);
    auto frames = events_of(d, tid);
    // The gap, then what is kept: at least the last 8 events.
    BOOST_TEST_REQUIRE(frames.size() >= 9u);
    BOOST_TEST_REQUIRE(frames.size() <= 17u);
    BOOST_TEST(frames.front().event == "stream.gap");
    BOOST_TEST(frames.front().data.at("from").as_int64() == 1);
    auto to = frames.front().data.at("to").as_int64();
    BOOST_TEST(frames[1].id == to + 1);
    BOOST_TEST(frames.back().event == "turn.finished");
    // Resuming inside the kept window needs no gap.
    auto resumed = events_of(d, tid, "?after=" + std::to_string(to + 2));
    BOOST_TEST_REQUIRE(!resumed.empty());
    BOOST_TEST(resumed.front().id == to + 3);
}

BOOST_AUTO_TEST_CASE(a_late_subscriber_after_a_restart_still_gets_turn_finished) {
    model_daemon d;
    d.model.push(fake_reply::completion("remembered"));
    auto tid = d.post("hi");
    d.wait_for_turn(tid);
    d.stop();
    d.start({"--config", (d.dir.root / "baton.json").string()});
    auto frames = events_of(d, tid);
    BOOST_TEST_REQUIRE(frames.size() == 1u);
    BOOST_TEST(frames[0].event == "turn.finished");
    BOOST_TEST(frames[0].data.at("status").as_string() == "completed");
    BOOST_TEST(frames[0].data.at("reply").as_string() == "remembered");
    // Its id follows the client's, even the largest one.
    auto resumed = events_of(d, tid, "", {{"Last-Event-ID", "9223372036854775807"}});
    BOOST_TEST_REQUIRE(resumed.size() == 1u);
    BOOST_TEST(resumed[0].id == std::numeric_limits<std::int64_t>::max());
}

BOOST_AUTO_TEST_CASE(a_live_stream_follows_the_turn_and_sends_heartbeats_while_idle) {
    model_daemon d(json::object{}, true, {}, {}, stream_config({{"sse_heartbeat_ms", 100}}));
    auto slow = fake_reply::stream_text({"slow ", "reply"});
    slow.delay = std::chrono::milliseconds(700);
    d.model.push(slow);
    auto tid = d.post("take your time");
    auto c = d.connect(std::chrono::milliseconds(4000));
    BOOST_TEST_REQUIRE(c.write(format_request("GET", "/v1/turns/" + tid + "/events")));
    // The model answers after 700 ms: meanwhile the idle stream carries comment lines.
    auto got = c.read_until_close();
    int comments = 0;
    auto frames = parse_sse(got.bytes.substr(got.bytes.find("\r\n\r\n") + 4), &comments);
    BOOST_TEST(comments >= 2, got.bytes);
    BOOST_TEST_REQUIRE(!frames.empty(), got.bytes);
    BOOST_TEST(got.bytes.find("event: turn.finished") != std::string::npos, got.bytes);
    BOOST_TEST(got.bytes.find("\"slow \"") != std::string::npos, got.bytes);
    // The connection stays open for the next request (chunked stream, keep-alive).
    BOOST_TEST(!got.closed);
}

BOOST_AUTO_TEST_CASE(a_reader_that_does_not_read_never_slows_the_turn) {
    // A 20 MB stream takes seconds under the sanitizers: a model timeout to match.
    model_daemon d(json::object{}, true, {}, json::object{{"model", {{"timeout_ms", 120000}}}},
                   stream_config({{"events_per_turn", 64}}));
    // ~20 MB of deltas: far more than the socket buffers (both ends, autotuned) of a reader that
    // does not read.
    std::vector<std::string> deltas(10000, std::string(2000, 'z'));
    d.model.push(fake_reply::stream_text(deltas, 64 * 1024));
    d.model.push(fake_reply::completion("second"));
    auto tid = d.post("flood");
    auto stalled = d.connect(std::chrono::seconds(100));
    BOOST_TEST_REQUIRE(stalled.write(format_request("GET", "/v1/turns/" + tid + "/events")));
    auto t = d.wait_for_turn(tid, terminal_statuses(), std::chrono::seconds(100));
    BOOST_TEST(t.at("status").as_string() == "completed");
    // The session goes on as usual while that reader still has not read.
    auto t2 = d.wait_for_turn(d.post("next"));
    BOOST_TEST(t2.at("reply").as_string() == "second");
    // When it finally reads, it gets a gap for what was dropped, then the end of the turn.
    auto got = stalled.read_response();
    BOOST_TEST_REQUIRE(got.has_value(), stalled.last_error());
    auto frames = parse_sse(got->body);
    BOOST_TEST_REQUIRE(!frames.empty());
    BOOST_TEST(frames.back().event == "turn.finished");
    bool gap = false;
    for (const auto& f : frames)
        gap = gap || f.event == "stream.gap";
    BOOST_TEST(gap);
}

BOOST_AUTO_TEST_SUITE_END()
