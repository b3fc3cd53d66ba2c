// Admission modes collect, steer and interrupt (docs/design.md "Admission"), through the daemon's HTTP
// API and its WebSocket channel, against a scripted model whose first answer is slow so that the
// next messages arrive while a turn runs.
#include "tests/model_daemon.hpp"
#include "tests/ws_client.hpp"

#include <boost/test/unit_test.hpp>

using namespace baton::test;

namespace {

json::object mode(std::string m) {
    return {{"admission", {{"mode", std::move(m)}, {"max_queued", 8}}}};
}

// The user messages of a recorded model request, in order.
std::vector<std::string> user_texts(const recorded_request& r) {
    std::vector<std::string> out;
    for (const auto& m : r.body.at("messages").as_array())
        if (m.at("role") == "user") out.emplace_back(m.at("content").as_string());
    return out;
}

// A time of a turn record (ISO 8601, milliseconds, UTC: ordered as text).
std::string at(const json::value& record, std::string_view key) {
    return std::string(record.at(key).as_string());
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

} // namespace

BOOST_AUTO_TEST_SUITE(admission_modes)

BOOST_AUTO_TEST_CASE(collect_answers_the_messages_queued_meanwhile_in_one_turn) {
    model_daemon d({}, false, {}, mode("collect"));
    d.model.push(fake_reply::completion("first answer").after(std::chrono::milliseconds(600)));
    d.model.push(fake_reply::completion("one answer for both"));
    auto t1 = d.post("first");
    d.wait_for_turn(t1, {"running"});
    auto t2 = d.post("second");
    auto t3 = d.post("third");
    auto r1 = d.wait_for_turn(t1);
    auto r2 = d.wait_for_turn(t2);
    auto r3 = d.wait_for_turn(t3);
    BOOST_TEST(r1.at("reply").as_string() == "first answer");
    BOOST_TEST(r2.at("status").as_string() == "completed");
    BOOST_TEST(r3.at("status").as_string() == "completed");
    BOOST_TEST(r2.at("reply").as_string() == "one answer for both");
    BOOST_TEST(r3.at("reply").as_string() == "one answer for both");
    // Each answered message ran once, started when the turn that answered it started.
    for (const auto* r : {&r2, &r3}) {
        BOOST_TEST(r->at("attempt").as_int64() == 1);
        BOOST_TEST(at(*r, "started_at") >= at(*r, "created_at"));
        BOOST_TEST(at(*r, "started_at") >= at(r1, "finished_at"));
    }
    auto reqs = d.model.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 2u); // not three
    auto texts = user_texts(reqs[1]);
    BOOST_TEST(contains(texts, "second"));
    BOOST_TEST(contains(texts, "third"));
    // The tape keeps every message.
    auto tape = d.request("GET", "/v1/sessions/s1/tape");
    for (auto t : {"first", "second", "third"})
        BOOST_TEST(tape.body.find(std::string("\"") + t + "\"") != std::string::npos, t);
}

BOOST_AUTO_TEST_CASE(steer_brings_a_message_into_the_running_turn_at_its_next_step) {
    model_daemon d({}, false, {}, mode("steer"));
    // Step 1 asks for the clock (slowly); the steered message joins before step 2.
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls")
                     .after(std::chrono::milliseconds(600)));
    d.model.push(fake_reply::completion("answered both"));
    auto t1 = d.post("what time is it?");
    d.wait_for_turn(t1, {"running"});
    auto t2 = d.post("and in Paris?");
    auto r1 = d.wait_for_turn(t1);
    auto r2 = d.wait_for_turn(t2);
    BOOST_TEST(r1.at("reply").as_string() == "answered both");
    BOOST_TEST(r2.at("status").as_string() == "completed");
    BOOST_TEST(r2.at("reply").as_string() == "answered both");
    // The steered message started when it joined, after it was stored, and ran once.
    BOOST_TEST(r2.at("attempt").as_int64() == 1);
    BOOST_TEST(at(r2, "started_at") >= at(r2, "created_at"));
    BOOST_TEST(at(r2, "started_at") > at(r1, "started_at"));
    auto reqs = d.model.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 2u);
    BOOST_TEST(!contains(user_texts(reqs[0]), "and in Paris?"));
    BOOST_TEST(contains(user_texts(reqs[1]), "and in Paris?"));
    // The steered message comes after the tool's observation.
    const auto& msgs = reqs[1].body.at("messages").as_array();
    BOOST_TEST(msgs.back().at("role").as_string() == "user");
}

// A message that comes during the turn's last step has no step left to join: the answer of that
// step completes the turn, and the message runs as its own turn.
BOOST_AUTO_TEST_CASE(a_message_steered_during_the_last_step_runs_as_its_own_turn) {
    auto agent = mode("steer");
    model_daemon d({{"max_steps", 2}}, false, {}, agent);
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls"));
    d.model.push(
        fake_reply::completion("final answer of step two").after(std::chrono::milliseconds(800)));
    d.model.push(fake_reply::completion("the second message's own answer"));
    auto t1 = d.post("first");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (d.model.requests().size() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    BOOST_REQUIRE(d.model.requests().size() == 2u); // step two is under way
    auto t2 = d.post("steered during the last step");
    auto r1 = d.wait_for_turn(t1);
    auto r2 = d.wait_for_turn(t2);
    BOOST_TEST(r1.at("status").as_string() == "completed");
    BOOST_TEST(r1.at("reply").as_string() == "final answer of step two");
    BOOST_TEST(r1.at("steps").as_int64() == 2);
    BOOST_TEST(r2.at("status").as_string() == "completed");
    BOOST_TEST(r2.at("reply").as_string() == "the second message's own answer");
    BOOST_TEST(r2.at("steps").as_int64() == 1);
    auto reqs = d.model.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 3u);
    BOOST_TEST(user_texts(reqs[2]).back() == "steered during the last step");
}

BOOST_AUTO_TEST_CASE(a_steered_message_that_comes_too_late_runs_as_its_own_turn) {
    model_daemon d({}, false, {}, mode("steer"));
    d.model.push(fake_reply::completion("one"));
    d.model.push(fake_reply::completion("two"));
    auto r1 = d.wait_for_turn(d.post("first"));
    auto r2 = d.wait_for_turn(d.post("second"));
    BOOST_TEST(r1.at("reply").as_string() == "one");
    BOOST_TEST(r2.at("reply").as_string() == "two");
}

BOOST_AUTO_TEST_CASE(interrupt_stops_the_running_turn_and_runs_the_new_message) {
    model_daemon d({}, false, {}, mode("interrupt"));
    d.model.push(fake_reply::completion("never seen").after(std::chrono::milliseconds(3000)));
    d.model.push(fake_reply::completion("the new answer"));
    auto t1 = d.post("long question");
    d.wait_for_turn(t1, {"running"});
    auto t2 = d.post("never mind, this instead");
    auto r1 = d.wait_for_turn(t1);
    auto r2 = d.wait_for_turn(t2);
    BOOST_TEST(r1.at("status").as_string() == "stopped");
    BOOST_TEST(r2.at("status").as_string() == "completed");
    BOOST_TEST(r2.at("reply").as_string() == "the new answer");
}

BOOST_AUTO_TEST_CASE(interrupt_with_no_queue_still_interrupts) {
    model_daemon d({}, false, {}, {{"admission", {{"mode", "interrupt"}, {"max_queued", 0}}}});
    d.model.push(fake_reply::completion("never seen").after(std::chrono::milliseconds(3000)));
    d.model.push(fake_reply::completion("the new answer"));
    auto t1 = d.post("long question");
    d.wait_for_turn(t1, {"running"});
    auto t2 = d.post("never mind, this instead");
    BOOST_TEST(d.wait_for_turn(t1).at("status").as_string() == "stopped");
    BOOST_TEST(d.wait_for_turn(t2).at("reply").as_string() == "the new answer");
}

BOOST_AUTO_TEST_CASE(queue_with_no_room_refuses_a_message_while_busy_and_says_why) {
    model_daemon d({}, false, {}, {{"admission", {{"mode", "queue"}, {"max_queued", 0}}}});
    d.model.push(fake_reply::completion("slow").after(std::chrono::milliseconds(1500)));
    auto t1 = d.post("first");
    d.wait_for_turn(t1, {"running"});
    auto r = d.request("POST", "/v1/sessions/s1/messages", R"({"text":"second"})");
    BOOST_TEST(r.status == 429);
    BOOST_TEST(r.body.find("admission.max_queued is 0") != std::string::npos, r.body);
    d.wait_for_turn(t1);
}

// Found by a new-user check: a client retrying after a lost 202 (as the docs advise) was told
// `session_busy` (reject) or `session_queue_full` while its turn ran, and a reuse of the key with
// another body got the same instead of idempotency_key_reused.
BOOST_AUTO_TEST_CASE(a_replay_is_answered_as_such_whatever_the_admission_mode_would_refuse) {
    for (const char* m : {"reject", "queue"}) {
        BOOST_TEST_CONTEXT(m) {
            model_daemon d({}, false, {}, {{"admission", {{"mode", m}, {"max_queued", 0}}}});
            d.model.push(fake_reply::completion("slow").after(std::chrono::milliseconds(1500)));
            const header_list key{{"Idempotency-Key", "retry-1"}};
            auto first = d.request("POST", "/v1/sessions/s1/messages", R"({"text":"first"})", key);
            BOOST_TEST_REQUIRE(first.status == 202u, first.body);
            auto tid = string_at(body_object(first), "turn_id");
            d.wait_for_turn(tid, {"running"});
            auto again = d.request("POST", "/v1/sessions/s1/messages", R"({"text":"first"})", key);
            BOOST_TEST(again.status == 200u, again.body);
            BOOST_TEST(string_at(body_object(again), "turn_id") == tid);
            check_error(d.request("POST", "/v1/sessions/s1/messages", R"({"text":"other"})", key), 409,
                        "idempotency_key_reused");
            // A new message is still refused as the mode says.
            auto fresh = d.request("POST", "/v1/sessions/s1/messages", R"({"text":"new"})");
            BOOST_TEST((fresh.status == 409u || fresh.status == 429u), fresh.body);
            d.wait_for_turn(tid);
        }
    }
}

BOOST_AUTO_TEST_CASE(interrupt_through_the_websocket_channel) {
    model_daemon d({}, false, {}, mode("interrupt"));
    d.model.push(fake_reply::completion("never seen").after(std::chrono::milliseconds(3000)));
    d.model.push(fake_reply::completion("interrupted you"));
    ws_client ws(d.daemon->host(), d.daemon->port());
    ws.send({{"type", "message"}, {"session", "wm"}, {"text", "long"}, {"id", "a"}});
    auto t1 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    ws.read_until(event_named("model.call", t1));
    ws.send({{"type", "message"}, {"session", "wm"}, {"text", "stop that"}, {"id", "b"}});
    auto t2 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    auto fin1 = ws.read_until(event_named("turn.finished", t1));
    BOOST_TEST(fin1.at("data").at("status").as_string() == "stopped");
    auto reply = ws.read_until(frame_type("reply"));
    BOOST_TEST(string_at(reply, "turn_id") == t2);
    BOOST_TEST(string_at(reply, "text") == "interrupted you");
}

BOOST_AUTO_TEST_CASE(collect_through_the_websocket_channel) {
    model_daemon d({}, false, {}, mode("collect"));
    d.model.push(fake_reply::completion("first").after(std::chrono::milliseconds(600)));
    d.model.push(fake_reply::completion("both at once"));
    ws_client ws(d.daemon->host(), d.daemon->port());
    ws.send({{"type", "message"}, {"session", "wc"}, {"text", "one"}, {"id", "1"}});
    auto t1 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    ws.read_until(event_named("model.call", t1));
    ws.send({{"type", "message"}, {"session", "wc"}, {"text", "two"}, {"id", "2"}});
    ws.send({{"type", "message"}, {"session", "wc"}, {"text", "three"}, {"id", "3"}});
    auto t2 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    auto t3 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    ws.read_until(event_named("turn.finished", t2));
    auto fin3 = ws.read_until(event_named("turn.finished", t3));
    BOOST_TEST(fin3.at("data").at("reply").as_string() == "both at once");
    BOOST_TEST(d.model.requests().size() == 2u);
}

// Found by a new-user check: the reply went only to the route of the turn that carried it, so a
// folded message's own sender (here a WebSocket client behind an HTTP message) got nothing.
BOOST_AUTO_TEST_CASE(a_folded_message_gets_the_reply_on_its_own_route) {
    model_daemon d({}, false, {}, mode("collect"));
    d.model.push(fake_reply::completion("first").after(std::chrono::milliseconds(600)));
    d.model.push(fake_reply::completion("both at once"));
    auto post = [&](std::string text) {
        auto r = d.request("POST", "/v1/sessions/routes/messages",
                           json::serialize(json::object{{"text", std::move(text)}}));
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        return string_at(body_object(r), "turn_id");
    };
    auto t1 = post("one");
    d.wait_for_turn(t1, {"running"});
    auto t2 = post("two"); // over HTTP: it carries the collect turn
    ws_client ws(d.daemon->host(), d.daemon->port());
    ws.send({{"type", "message"}, {"session", "routes"}, {"text", "three"}, {"events", false}});
    auto t3 = string_at(ws.read_until(frame_type("accepted")), "turn_id");
    auto reply = ws.read_until(frame_type("reply"));
    BOOST_TEST(string_at(reply, "text") == "both at once");
    BOOST_TEST(string_at(reply, "turn_id") == t2); // the turn that answered it
    BOOST_TEST(d.wait_for_turn(t3).at("reply").as_string() == "both at once");
    BOOST_TEST(d.model.requests().size() == 2u);
    ws.send({{"type", "ack"}, {"key", string_at(reply, "key")}});
    ws.barrier();
}

BOOST_AUTO_TEST_SUITE_END()
