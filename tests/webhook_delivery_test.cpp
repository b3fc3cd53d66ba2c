// The webhook channel through the real daemon: replies routed with {"deliver": {"channel":
// "webhook", "to": ...}} reach a receiver on loopback with their outbox key, are retried on the
// statuses that call for it, fail on the others, and survive a restart.
#include "tests/daemon_fixture.hpp"
#include "tests/webhook_receiver.hpp"

#include <thread>

using namespace baton::test;

namespace {

// A daemon on the echo model with webhook targets `crm` (the receiver) and `down` (nothing listens).
struct webhook_daemon : daemon_fixture {
    webhook_receiver receiver;

    explicit webhook_daemon(json::object extra_target = {}) : daemon_fixture(deferred{}) {
        json::object crm{{"url", receiver.url()},
                         {"timeout_ms", 2000},
                         {"headers", json::object{{"Authorization", "Bearer hook-secret"}}}};
        for (auto& [k, v] : extra_target)
            crm[k] = v;
        json::object cfg{
            {"agents", json::object{{"default", json::object{}}}},
            {"channels",
             json::object{
                 {"webhook",
                  json::object{
                      {"targets", json::object{{"crm", crm},
                                               {"down", json::object{{"url", "http://127.0.0.1:9/x"},
                                                                     {"timeout_ms", 500}}}}}}}}}};
        write_file("baton.json", json::serialize(cfg));
        start_again();
    }
    void start_again() { start({"--config", (dir.root / "baton.json").string()}); }

    std::string post_to(std::string_view sid, std::string_view text, std::string_view target = "crm") {
        json::object body{{"text", text},
                          {"deliver", json::object{{"channel", "webhook"}, {"to", target}}}};
        auto r =
            request("POST", "/v1/sessions/" + std::string(sid) + "/messages", json::serialize(body));
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        return turn_id_of(r);
    }

    json::array outbox(std::string_view query = "") {
        auto r = request("GET", "/v1/outbox" + std::string(query));
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        return body_object(r).at("items").as_array();
    }

    // Polls the outbox until the item of `tid` has `status` (bounded); returns it.
    json::object wait_item(const std::string& tid, std::string_view status,
                           std::chrono::milliseconds limit) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        json::object last;
        while (std::chrono::steady_clock::now() < deadline) {
            for (const auto& v : outbox())
                if (string_at(v.as_object(), "turn_id") == tid) last = v.as_object();
            if (string_at(last, "status") == status) return last;
            std::this_thread::sleep_for(20ms);
        }
        BOOST_FAIL("item of " << tid << " is not " << status << ": " << json::serialize(last));
        return last;
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(webhook_delivery)

BOOST_AUTO_TEST_CASE(a_reply_is_posted_with_its_outbox_key) {
    webhook_daemon d;
    auto tid = d.post_to("hook-1", "hello");
    BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "completed");
    BOOST_TEST_REQUIRE(d.receiver.wait_delivered(1, 10s));
    auto got = d.receiver.requests();
    BOOST_TEST_REQUIRE(got.size() == 1u);
    const auto& req = got[0];
    BOOST_TEST(req.method == "POST");
    BOOST_TEST(req.target == "/hook");
    BOOST_TEST(req.header("Authorization").value_or("") == "Bearer hook-secret");
    BOOST_TEST(req.header("Content-Type").value_or("") == "application/json");
    const auto& body = req.body.as_object();
    BOOST_TEST(string_at(body, "text") == "echo: hello");
    BOOST_TEST(string_at(body, "turn_id") == tid);
    BOOST_TEST(string_at(body, "session_id") == "hook-1");
    BOOST_TEST(string_at(body, "target") == "crm");
    BOOST_TEST(body.at("uncertain").as_bool() == false);
    auto key = req.header("Idempotency-Key").value_or("");
    BOOST_TEST(key == string_at(body, "key"));
    BOOST_TEST(key.starts_with("ob_"));
    auto item = d.wait_item(tid, "delivered", 5s);
    BOOST_TEST(string_at(item, "key") == key);
    BOOST_TEST(string_at(item, "channel") == "webhook");
    BOOST_TEST(int_at(item, "attempts") == 1);
    BOOST_TEST(item.at("uncertain").as_bool() == false);
    // The turn's events say where the reply went.
    auto r = d.request("GET", "/v1/turns/" + tid + "/events");
    BOOST_TEST(r.body.find("event: outbox.enqueued") != std::string::npos, r.body);
    BOOST_TEST(r.body.find(key) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(unknown_channels_and_targets_are_refused_before_anything_is_stored) {
    webhook_daemon d;
    auto post = [&](json::object deliver) {
        json::object body{{"text", "x"}, {"deliver", std::move(deliver)}};
        return d.request("POST", "/v1/sessions/refused/messages", json::serialize(body));
    };
    auto msg = check_error(post({{"channel", "webhook"}, {"to", "nope"}}), 400, "invalid_request");
    BOOST_TEST(msg.find("nope") != std::string::npos, msg);
    BOOST_TEST(msg.find("crm") != std::string::npos, msg);
    check_error(post({{"channel", "webhook"}}), 400, "invalid_request");
    msg = check_error(post({{"channel", "pigeon"}, {"to", "x"}}), 400, "invalid_request");
    BOOST_TEST(msg.find("pigeon") != std::string::npos, msg);
    // Found by a new user: a `to` for http or ws was taken and ignored (the reply went to the
    // sender's session). Neither has a recipient to name.
    for (const char* channel : {"http", "ws"}) {
        msg = check_error(post({{"channel", channel}, {"to", "other-session"}}), 400, "invalid_request");
        BOOST_TEST(msg.find("deliver.to: ") != std::string::npos, msg);
    }
    BOOST_TEST(d.request("GET", "/v1/sessions/refused").status == 404u);
    // http needs no recipient and is always there.
    auto ok = post({{"channel", "http"}});
    BOOST_TEST(ok.status == 202u, ok.body);
}

BOOST_AUTO_TEST_CASE(a_5xx_is_retried_with_the_same_key_and_a_4xx_fails) {
    webhook_daemon d;
    std::atomic<int> calls{0};
    d.receiver.answer_with([&](const recorded_request& r) {
        auto text = string_at(r.body.as_object(), "text");
        if (text == "echo: refuse") return receiver_answer{422, {}, 0ms};
        return receiver_answer{++calls == 1 ? 503u : 200u, {}, 0ms};
    });
    auto tid = d.post_to("hook-2", "retry me");
    auto item = d.wait_item(tid, "delivered", 10s);
    BOOST_TEST(int_at(item, "attempts") == 2);
    auto got = d.receiver.requests();
    BOOST_TEST_REQUIRE(got.size() == 2u);
    BOOST_TEST(got[0].header("Idempotency-Key").value_or("a") == got[1].header("Idempotency-Key").value_or("b"));
    BOOST_TEST(got[1].body.as_object().at("attempt").as_int64() == 2);

    auto refused = d.post_to("hook-2", "refuse");
    item = d.wait_item(refused, "failed", 10s);
    BOOST_TEST(int_at(item, "attempts") == 1);
    BOOST_TEST(string_at(item, "last_error").find("422") != std::string::npos);
    auto failed = d.outbox("?status=failed");
    BOOST_TEST_REQUIRE(failed.size() == 1u);
    BOOST_TEST(string_at(failed[0].as_object(), "turn_id") == refused);
}

BOOST_AUTO_TEST_CASE(an_unreachable_target_keeps_the_item_pending_and_a_restart_resumes_it) {
    webhook_daemon d;
    auto tid = d.post_to("hook-3", "later", "down");
    BOOST_TEST(string_at(d.wait_for_turn(tid), "status") == "completed");
    // Connection refused: retried, so it stays pending with the reason.
    auto item = d.wait_item(tid, "pending", 5s);
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (int_at(item, "attempts") < 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(50ms);
        item = d.wait_item(tid, "pending", 1s);
    }
    BOOST_TEST(int_at(item, "attempts") >= 1);
    BOOST_TEST(!string_at(item, "last_error").empty());
    BOOST_TEST(d.outbox("?status=pending").size() == 1u);
    // A drain does not wait for it.
    BOOST_TEST(d.stop() == 0);
}

BOOST_AUTO_TEST_CASE(items_left_pending_are_sent_after_a_restart) {
    webhook_daemon d;
    std::atomic<bool> accept{false};
    d.receiver.answer_with(
        [&](const recorded_request&) { return receiver_answer{accept ? 200u : 503u, {}, 0ms}; });
    auto tid = d.post_to("hook-5", "survive");
    auto item = d.wait_item(tid, "pending", 5s);
    BOOST_TEST(d.stop() == 0, d.log());
    accept = true;
    d.start_again();
    item = d.wait_item(tid, "delivered", 15s);
    BOOST_TEST(int_at(item, "attempts") >= 2);
    BOOST_TEST(item.at("uncertain").as_bool() == false);
    BOOST_TEST(d.receiver.delivered_keys().size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
