// Long poll and the synchronous POST (docs/api.md "HTTP API": `?wait=S`), through the daemon's
// socket, against a scripted model whose answers come late or soon. No assertion is about time:
// each case checks what the held answer says about the turn.
#include "tests/model_daemon.hpp"

#include <boost/test/unit_test.hpp>

#include <csignal>
#include <set>

using namespace baton::test;

namespace {

const std::set<std::string> record_fields{"turn_id", "session_id", "agent",      "status",
                                          "reply",   "steps",      "attempt",    "usage",
                                          "error",   "created_at", "started_at", "finished_at"};

// The model's answers come up to 4 s late: its timeout is longer.
const json::object patient{{"model", {{"timeout_ms", 10000}}}};

std::string message_body(std::string_view text) {
    return json::serialize(json::object{{"text", text}});
}

} // namespace

BOOST_AUTO_TEST_SUITE(long_poll)

BOOST_AUTO_TEST_CASE(get_with_wait_answers_once_the_turn_ends) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("late answer").after(std::chrono::milliseconds(400)));
    auto tid = d.post("hello");
    auto r = d.request("GET", "/v1/turns/" + tid + "?wait=20");
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    const auto& rec = body_object(r);
    BOOST_TEST(keys_of(rec) == record_fields);
    BOOST_TEST(string_at(rec, "status") == "completed");
    BOOST_TEST(string_at(rec, "reply") == "late answer");
}

BOOST_AUTO_TEST_CASE(get_with_wait_answers_the_record_as_it_stands_when_the_wait_passes) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("much later").after(std::chrono::milliseconds(3000)));
    auto tid = d.post("hello");
    auto r = d.request("GET", "/v1/turns/" + tid + "?wait=0.3");
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    auto status = string_at(body_object(r), "status");
    BOOST_TEST((status == "running" || status == "queued"), r.body);
    BOOST_TEST(body_object(r).at("reply").is_null());
    // Asked again, the answer comes with the end.
    auto again = d.request("GET", "/v1/turns/" + tid + "?wait=20");
    BOOST_TEST(string_at(body_object(again), "status") == "completed", again.body);
    BOOST_TEST(string_at(body_object(again), "reply") == "much later");
    // A finished turn, and wait=0, answer at once.
    auto done = d.request("GET", "/v1/turns/" + tid + "?wait=0");
    BOOST_TEST(string_at(body_object(done), "status") == "completed");
}

BOOST_AUTO_TEST_CASE(post_with_wait_answers_200_with_the_finished_record) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("sync answer").after(std::chrono::milliseconds(200)));
    auto r = d.request("POST", "/v1/sessions/s1/messages?wait=20", message_body("hi"));
    BOOST_TEST_REQUIRE(r.status == 200u, r.body);
    const auto& rec = body_object(r);
    BOOST_TEST(keys_of(rec) == record_fields);
    BOOST_TEST(string_at(rec, "status") == "completed");
    BOOST_TEST(string_at(rec, "reply") == "sync answer");
    BOOST_TEST(string_at(rec, "session_id") == "s1");
    auto tid = string_at(rec, "turn_id");
    BOOST_TEST(r.header("Location").value_or("") == "/v1/turns/" + tid);
    // The same record as GET answers, and the message and reply are on the tape.
    auto got = d.request("GET", "/v1/turns/" + tid);
    BOOST_TEST(got.body == r.body);
    auto tape = d.request("GET", "/v1/sessions/s1/tape");
    BOOST_TEST(body_object(tape).at("entries").as_array().size() == 2u, tape.body);
}

BOOST_AUTO_TEST_CASE(post_with_wait_answers_202_when_the_turn_outlasts_it) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("slow").after(std::chrono::milliseconds(3000)));
    auto r = d.request("POST", "/v1/sessions/s1/messages?wait=0.2", message_body("hi"));
    BOOST_TEST_REQUIRE(r.status == 202u, r.body);
    const auto& body = body_object(r);
    BOOST_TEST((keys_of(body) == std::set<std::string>{"turn_id", "session_id", "status", "links"}));
    auto status = string_at(body, "status");
    BOOST_TEST((status == "running" || status == "queued"), r.body);
    auto tid = turn_id_of(r);
    BOOST_TEST(r.header("Location").value_or("") == "/v1/turns/" + tid);
    // Stored before the answer: it runs to its end.
    auto rec = d.wait_for_turn(tid);
    BOOST_TEST(string_at(rec, "reply") == "slow");
}

BOOST_AUTO_TEST_CASE(post_with_wait_and_an_idempotency_key_answers_the_same_turn) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("once"));
    const header_list key{{"Idempotency-Key", "sync-1"}};
    auto first = d.request("POST", "/v1/sessions/s1/messages?wait=20", message_body("pay"), key);
    BOOST_TEST_REQUIRE(first.status == 200u, first.body);
    auto again = d.request("POST", "/v1/sessions/s1/messages?wait=20", message_body("pay"), key);
    BOOST_TEST(again.status == 200u, again.body);
    // The same record, saying that it is a replay.
    auto replayed = body_object(again);
    BOOST_TEST(replayed.at("replayed") == json::value(true));
    replayed.erase("replayed");
    BOOST_TEST(json::serialize(replayed) == json::serialize(body_object(first)));
    BOOST_TEST(d.model.requests().size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_replay_with_wait_of_a_turn_still_running_is_202) {
    model_daemon d({}, false, {}, patient);
    d.model.push(fake_reply::completion("slow").after(std::chrono::milliseconds(3000)));
    const header_list key{{"Idempotency-Key", "sync-2"}};
    auto first = d.request("POST", "/v1/sessions/s1/messages", message_body("pay"), key);
    BOOST_TEST_REQUIRE(first.status == 202u, first.body);
    // With ?wait=, 200 means "ended", a replay's too: this one is still running.
    auto again = d.request("POST", "/v1/sessions/s1/messages?wait=0.1", message_body("pay"), key);
    BOOST_TEST(again.status == 202u, again.body);
    auto body = body_object(again);
    BOOST_TEST(body.at("replayed") == json::value(true));
    BOOST_TEST(string_at(body, "turn_id") == string_at(body_object(first), "turn_id"));
    BOOST_TEST(string_at(body, "status") != "completed");
    // Without ?wait= a replay stays the 200 it always was.
    auto plain = d.request("POST", "/v1/sessions/s1/messages", message_body("pay"), key);
    BOOST_TEST(plain.status == 200u, plain.body);
    BOOST_TEST(body_object(plain).at("replayed") == json::value(true));
}

BOOST_AUTO_TEST_CASE(bad_wait_values_are_400_and_store_nothing) {
    model_daemon d({}, false, {}, patient);
    for (const char* q : {"wait=61", "wait=60.001", "wait=-1", "wait=abc", "wait=", "wait=1.2345",
                          "wait=.5", "wait=5.", "wait=1e3", "wait=%20", "wait=1&wait=1"})
        BOOST_TEST_CONTEXT(q) {
            auto msg = check_error(
                d.request("POST", std::string("/v1/sessions/bad/messages?") + q, message_body("x")), 400,
                "invalid_request");
            BOOST_TEST(msg.find("wait") != std::string::npos, msg);
            check_error(d.request("GET", std::string("/v1/turns/t_unknown?") + q), 400,
                        "invalid_request");
        }
    check_error(d.request("GET", "/v1/sessions/bad"), 404, "not_found");
    // The bounds themselves are fine.
    d.model.push(fake_reply::completion("ok"));
    auto r = d.request("POST", "/v1/sessions/good/messages?wait=60", message_body("x"));
    BOOST_TEST(r.status == 200u, r.body);
    auto tid = string_at(body_object(r), "turn_id");
    BOOST_TEST(d.request("GET", "/v1/turns/" + tid + "?wait=0.001").status == 200u);
    check_error(d.request("GET", "/v1/turns/t_unknown?wait=1"), 404, "not_found");
}

BOOST_AUTO_TEST_CASE(held_requests_count_against_max_connections) {
    model_daemon d({}, false, {}, patient, json::object{{"server", {{"max_connections", 2}}}});
    d.model.push(fake_reply::completion("late").after(std::chrono::milliseconds(2500)));
    d.model.push(fake_reply::completion("second"));
    // The message goes over `a` itself: a connection of its own might still count against the
    // limit (its close not yet seen by the daemon) when `b` connects.
    auto a = d.connect();
    BOOST_TEST_REQUIRE(
        a.write(format_request("POST", "/v1/sessions/s1/messages", message_body("hello"))));
    auto posted = a.read_response();
    BOOST_TEST_REQUIRE(posted.has_value(), a.last_error());
    BOOST_TEST_REQUIRE(posted->status == 202u, posted->body);
    auto tid = string_at(body_object(*posted), "turn_id");
    auto b = d.connect();
    BOOST_TEST_REQUIRE(a.write(format_request("GET", "/v1/turns/" + tid + "?wait=30")));
    BOOST_TEST_REQUIRE(
        b.write(format_request("POST", "/v1/sessions/s2/messages?wait=30", message_body("x"))));
    // Both are held: a third connection is refused, as any over the limit is.
    auto third = d.connect().read_until_close();
    BOOST_TEST(third.bytes.starts_with("HTTP/1.1 503"), third.bytes);
    auto ra = a.read_response();
    BOOST_TEST_REQUIRE(ra.has_value(), a.last_error());
    BOOST_TEST(string_at(body_object(*ra), "status") == "completed", ra->body);
    auto rb = b.read_response();
    BOOST_TEST_REQUIRE(rb.has_value(), b.last_error());
    BOOST_TEST((rb->status == 200u || rb->status == 202u), rb->body);
}

BOOST_AUTO_TEST_CASE(a_drain_answers_held_requests_at_once_with_the_record_as_it_stands) {
    model_daemon d({}, false, {}, patient);
    // Longer than the test takes to drain the held requests, shorter than the drain's grace.
    d.model.push(fake_reply::completion("after the drain began").after(std::chrono::milliseconds(4000)));
    auto tid = d.post("hello");
    d.wait_for_turn(tid, {"running"});
    auto held_get = d.connect(30s), held_post = d.connect(30s);
    // Open, idle, before the drain: a read on one, a new message on the other, after it began.
    auto idle_read = d.connect(30s), idle_post = d.connect(30s);
    BOOST_TEST_REQUIRE(idle_read.request("GET", "/healthz").status == 200u);
    BOOST_TEST_REQUIRE(idle_post.request("GET", "/healthz").status == 200u);
    BOOST_TEST_REQUIRE(held_get.write(format_request("GET", "/v1/turns/" + tid + "?wait=60")));
    BOOST_TEST_REQUIRE(held_post.write(
        format_request("POST", "/v1/sessions/s1/messages?wait=60", message_body("next"))));
    // The POST is stored (its 202 or 200 can only come after): wait until the session counts it.
    for (int i = 0; i < 500; ++i) {
        auto s = d.request("GET", "/v1/sessions/s1");
        if (int_at(body_object(s), "queued") >= 1) break;
        std::this_thread::sleep_for(10ms);
    }
    ::kill(d.daemon->pid(), SIGTERM);
    auto g = held_get.read_response();
    BOOST_TEST_REQUIRE(g.has_value(), held_get.last_error());
    BOOST_TEST(g->status == 200u);
    BOOST_TEST(string_at(body_object(*g), "status") == "running", g->body);
    auto p = held_post.read_response();
    BOOST_TEST_REQUIRE(p.has_value(), held_post.last_error());
    BOOST_TEST(p->status == 202u, p->body);
    BOOST_TEST(string_at(body_object(*p), "status") == "queued", p->body);
    // Draining now: a read is answered as usual, and closes its connection; a new message is
    // refused and not stored.
    auto r = idle_read.request("GET", "/v1/turns/" + tid);
    BOOST_TEST(r.status == 200u, r.body);
    BOOST_TEST(!r.keep_alive);
    auto m = idle_post.request("POST", "/v1/sessions/s1/messages", message_body("too late"));
    check_error(m, 503, "draining");
    BOOST_TEST(!m.keep_alive);
    // The running turn still ends within the drain's grace, and the daemon exits cleanly.
    BOOST_TEST(d.stop() == 0, d.log());
}

BOOST_AUTO_TEST_SUITE_END()
