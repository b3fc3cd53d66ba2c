// The WebSocket channel (docs/api.md "WebSocket channel: GET /v1/ws") through a real connection to the
// daemon: messages, events and replies, acks and re-sends after a reconnect, bad frames that leave
// the connection usable, the frame size limit (1009), and the connection limit (503).
#include "tests/model_daemon.hpp"
#include "tests/ws_client.hpp"

#include <boost/test/unit_test.hpp>

#include <set>
#include <thread>

using namespace baton::test;

namespace {

// The headers of a WebSocket upgrade request by hand; `key` empty: none sent.
header_list upgrade_headers(std::string version = "13",
                            std::string key = "dGhlIHNhbXBsZSBub25jZQ==") {
    header_list h{{"Upgrade", "websocket"}, {"Connection", "Upgrade"}};
    if (!key.empty()) h.emplace_back("Sec-WebSocket-Key", std::move(key));
    h.emplace_back("Sec-WebSocket-Version", std::move(version));
    return h;
}

std::unique_ptr<ws_client> open_ws(const daemon_fixture& d) {
    return std::make_unique<ws_client>(d.daemon->host(), d.daemon->port());
}

json::object message(std::string session, std::string text, std::string id) {
    return {{"type", "message"}, {"session", std::move(session)}, {"text", std::move(text)}, {"id", std::move(id)}};
}

std::string error_code_of(const json::object& f) {
    return string_at(f, "code");
}

} // namespace

BOOST_AUTO_TEST_SUITE(ws_channel)

BOOST_AUTO_TEST_CASE(a_message_is_accepted_streams_its_events_and_gets_an_acked_reply) {
    model_daemon d(json::object{}, true);
    d.model.push(fake_reply::stream_text({"hello ", "there"}));
    auto ws = open_ws(d);
    ws->send(message("w1", "hi", "c-1"));
    auto acc = ws->read_until(frame_type("accepted"));
    BOOST_TEST(string_at(acc, "id") == "c-1");
    BOOST_TEST(string_at(acc, "session") == "w1");
    auto tid = string_at(acc, "turn_id");
    BOOST_TEST_REQUIRE(!tid.empty());
    auto reply = ws->read_until(frame_type("reply"));
    BOOST_TEST(string_at(reply, "text") == "hello there");
    BOOST_TEST(string_at(reply, "turn_id") == tid);
    BOOST_TEST(string_at(reply, "session") == "w1");
    BOOST_TEST(reply.at("uncertain").as_bool() == false);
    auto key = string_at(reply, "key");
    BOOST_TEST_REQUIRE(!key.empty());
    ws->read_until(event_named("turn.finished", tid));
    // The events came with the turn id and increasing seqs; the text streamed as deltas.
    std::int64_t last = 0;
    std::string streamed;
    for (const auto& f : ws->seen) {
        if (string_at(f, "type") != "event") continue;
        BOOST_TEST(string_at(f, "turn_id") == tid);
        BOOST_TEST(int_at(f, "seq") > last);
        last = int_at(f, "seq");
        if (string_at(f, "event") == "model.delta") streamed += f.at("data").at("text").as_string();
    }
    BOOST_TEST(streamed == "hello there");
    // Until acked, the reply is pending in the outbox; the ack delivers it.
    auto pending = d.request("GET", "/v1/outbox?status=pending");
    BOOST_TEST(pending.body.find(key) != std::string::npos, pending.body);
    ws->send({{"type", "ack"}, {"key", key}});
    ws->barrier();
    pending = d.request("GET", "/v1/outbox?status=pending");
    BOOST_TEST(pending.body.find(key) == std::string::npos, pending.body);
    auto all = d.request("GET", "/v1/outbox");
    const auto& items = body_object(all).at("items").as_array();
    BOOST_TEST_REQUIRE(items.size() == 1u);
    BOOST_TEST(items[0].at("status").as_string() == "delivered");
    BOOST_TEST(items[0].at("channel").as_string() == "ws");
    BOOST_TEST(items[0].at("turn_id").as_string() == tid);
    // The turn record agrees.
    BOOST_TEST(d.wait_for_turn(tid).at("reply").as_string() == "hello there");
}

// A client learns a turn's id from `accepted` before any event or reply of that turn reaches it,
// however fast the turn runs (the echo model answers at once, the turns race the frames).
BOOST_AUTO_TEST_CASE(accepted_comes_before_anything_of_its_turn) {
    daemon_fixture d;
    auto ws = open_ws(d);
    const int n = 200;
    for (int i = 0; i < n; ++i) {
        auto k = std::to_string(i);
        ws->send(message("order-" + std::to_string(i % 4), "m" + k, "o-" + k));
    }
    int replies = 0;
    while (replies < n) {
        auto f = ws->read_until(frame_type("reply"));
        ws->send({{"type", "ack"}, {"key", string_at(f, "key")}});
        ++replies;
    }
    std::set<std::string> announced;
    int accepted = 0;
    for (const auto& f : ws->seen) {
        auto type = string_at(f, "type");
        if (type == "accepted") {
            announced.insert(string_at(f, "turn_id"));
            ++accepted;
        } else if (type == "event" || type == "reply") {
            BOOST_TEST_REQUIRE(announced.count(string_at(f, "turn_id")) == 1u,
                               type << " of " << string_at(f, "turn_id") << " before its accepted: "
                                    << json::serialize(f));
        }
    }
    BOOST_TEST(accepted == n);
}

// "events": false on a message or subscribe frame: the connection follows the session's replies
// only (what a chat client needs: message, accepted, reply, ack); a later frame switches events
// back on or off; anything but a boolean is refused.
BOOST_AUTO_TEST_CASE(a_connection_can_follow_replies_only) {
    daemon_fixture d;
    auto ws = open_ws(d);
    auto count_events = [&](const std::string& tid) {
        int n = 0;
        for (const auto& f : ws->seen)
            if (string_at(f, "type") == "event" && string_at(f, "turn_id") == tid) ++n;
        return n;
    };
    auto turn = [&](json::object frame) {
        ws->send(frame);
        auto tid = string_at(ws->read_until(frame_type("accepted")), "turn_id");
        auto reply = ws->read_until(frame_type("reply"));
        BOOST_TEST(string_at(reply, "turn_id") == tid);
        ws->send({{"type", "ack"}, {"key", string_at(reply, "key")}});
        return tid;
    };
    auto quiet = message("r1", "one", "q-1");
    quiet["events"] = false;
    auto t1 = turn(quiet);
    d.wait_for_turn(t1);
    ws->barrier();
    BOOST_TEST(count_events(t1) == 0);
    // A message without "events" follows them again.
    auto t2 = turn(message("r1", "two", "q-2"));
    ws->read_until(event_named("turn.finished", t2));
    BOOST_TEST(count_events(t2) > 2);
    // A subscribe switches them off for the session; a bad value is refused and changes nothing.
    ws->send({{"type", "subscribe"}, {"session", "r1"}, {"events", "no"}, {"id", "s-1"}});
    auto bad = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(bad) == "invalid_request");
    BOOST_TEST(string_at(bad, "id") == "s-1");
    ws->send({{"type", "subscribe"}, {"session", "r1"}, {"events", false}});
    auto again = message("r1", "three", "q-3");
    again["events"] = false;
    auto t3 = turn(again);
    d.wait_for_turn(t3);
    ws->barrier();
    BOOST_TEST(count_events(t3) == 0);
    auto bad_message = message("r1", "four", "q-4");
    bad_message["events"] = 1;
    ws->send(bad_message);
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "invalid_request");
}

// Found by a new-user check: with "events": false a turn that failed sent nothing at all, and the
// client waited for a reply that would never come. It gets the turn's turn.finished; a turn that
// replies sends only its reply, as before.
BOOST_AUTO_TEST_CASE(replies_only_still_tells_of_a_turn_that_ends_without_a_reply) {
    model_daemon d;
    d.model.push(fake_reply::error(400, "no such model"));
    d.model.push(fake_reply::completion("fine now"));
    auto ws = open_ws(d);
    auto quiet = message("rf", "one", "f-1");
    quiet["events"] = false;
    ws->send(quiet);
    auto t1 = string_at(ws->read_until(frame_type("accepted")), "turn_id");
    auto fin = ws->read_until(event_named("turn.finished", t1));
    BOOST_TEST(fin.at("data").at("status").as_string() == "failed");
    BOOST_TEST(fin.at("data").at("error").at("code").as_string() == "model_error");
    auto again = message("rf", "two", "f-2");
    again["events"] = false;
    ws->send(again);
    auto t2 = string_at(ws->read_until(frame_type("accepted")), "turn_id");
    auto reply = ws->read_until(frame_type("reply"));
    BOOST_TEST(string_at(reply, "text") == "fine now");
    d.wait_for_turn(t2);
    ws->barrier();
    int events = 0;
    for (const auto& f : ws->seen)
        if (string_at(f, "type") == "event") ++events;
    BOOST_TEST(events == 1); // t1's end only
}

BOOST_AUTO_TEST_CASE(an_unacked_reply_is_sent_again_with_the_same_key_after_a_reconnect) {
    model_daemon d;
    d.model.push(fake_reply::completion("while you were away").after(std::chrono::milliseconds(500)));
    std::string tid;
    {
        auto ws = open_ws(d);
        ws->send(message("w2", "hello?", "c-1"));
        tid = string_at(ws->read_until(frame_type("accepted")), "turn_id");
        ws->drop(); // the network goes away before the reply
    }
    d.wait_for_turn(tid);
    auto again = open_ws(d);
    again->send({{"type", "subscribe"}, {"session", "w2"}});
    auto r1 = again->read_until(frame_type("reply"));
    BOOST_TEST(string_at(r1, "text") == "while you were away");
    BOOST_TEST(string_at(r1, "turn_id") == tid);
    auto key = string_at(r1, "key");
    // Not acked yet: a second connection subscribing gets the same item under the same key.
    auto other = open_ws(d);
    other->send({{"type", "subscribe"}, {"session", "w2"}});
    BOOST_TEST(string_at(other->read_until(frame_type("reply")), "key") == key);
    other->send({{"type", "ack"}, {"key", key}});
    other->barrier();
    // Acked: a later subscriber gets nothing again.
    auto later = open_ws(d);
    later->send({{"type", "subscribe"}, {"session", "w2"}});
    later->barrier();
    for (const auto& f : later->seen)
        BOOST_TEST(string_at(f, "type") != "reply", json::serialize(f));
}

BOOST_AUTO_TEST_CASE(bad_frames_get_an_error_frame_and_the_connection_stays_usable) {
    model_daemon d;
    auto ws = open_ws(d);
    ws->send_text("this is not json");
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "invalid_json");
    // JSON but not an object: as HTTP answers such a body.
    ws->send_text("[1, 2, 3]");
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "invalid_request");
    // A field the frame does not take is refused, not ignored (a misspelt "event": false).
    ws->send({{"type", "subscribe"}, {"session", "w3"}, {"event", false}, {"id", "u-1"}});
    auto unknown_field = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(unknown_field) == "invalid_request");
    BOOST_TEST(string_at(unknown_field, "id") == "u-1");
    BOOST_TEST(string_at(unknown_field, "message").find("unknown field event") == 0u,
               string_at(unknown_field, "message"));
    ws->send({{"type", "ping"}, {"id", "p-1"}});
    BOOST_TEST(string_at(ws->read_until(frame_type("pong")), "id") == "p-1");
    // "" is an id like any other: echoed as "", not as null (nor dropped from a pong).
    ws->send({{"type", "ping"}, {"id", ""}});
    auto empty_pong = ws->read_until(frame_type("pong"));
    BOOST_TEST_REQUIRE(empty_pong.contains("id"));
    BOOST_TEST(empty_pong.at("id") == json::value(""));
    ws->send({{"type", "dance"}, {"id", ""}});
    auto empty_error = ws->read_until(frame_type("error"));
    BOOST_TEST(empty_error.at("id") == json::value(""));
    ws->send({{"type", "dance"}, {"id", "x-1"}});
    auto unknown = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(unknown) == "invalid_request");
    BOOST_TEST(string_at(unknown, "id") == "x-1");
    BOOST_TEST(!string_at(unknown, "message").empty());
    ws->send({{"type", "message"}, {"session", "w3"}, {"id", "m-1"}}); // no text
    auto no_text = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(no_text) == "invalid_request");
    BOOST_TEST(string_at(no_text, "id") == "m-1");
    ws->send(message("bad session id!", "hi", "m-2"));
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "invalid_request");
    ws->send_binary("\x01\x02");
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "invalid_request");
    // An id that is not a string cannot be echoed: refused, with "id": null.
    ws->send({{"type", "ping"}, {"id", 42}});
    auto numeric = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(numeric) == "invalid_request");
    BOOST_TEST(numeric.at("id").is_null());
    // A key given twice: refused, naming it; the id is echoed unless it is the key given twice.
    ws->send_text(R"({"type":"message","id":"d-1","session":"w4","text":"a","text":"b"})");
    auto dup = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(dup) == "invalid_request");
    BOOST_TEST(string_at(dup, "id") == "d-1");
    BOOST_TEST(string_at(dup, "message") == "text: duplicate key");
    ws->send_text(R"({"type":"ping","id":"d-2","id":"d-3"})");
    auto dup_id = ws->read_until(frame_type("error"));
    BOOST_TEST(string_at(dup_id, "message") == "id: duplicate key");
    BOOST_TEST(dup_id.at("id").is_null());
    // A message takes no deliver or metadata: refused, not silently dropped, and not stored.
    for (const char* field : {"deliver", "metadata"}) {
        auto m = message("w4", "hi", "m-x");
        m[field] = json::object{};
        ws->send(m);
        auto refused = ws->read_until(frame_type("error"));
        BOOST_TEST(error_code_of(refused) == "invalid_request");
        BOOST_TEST(string_at(refused, "message").find(field) != std::string::npos);
    }
    check_error(d.request("GET", "/v1/sessions/w4"), 404, "not_found");
    ws->send({{"type", "ack"}, {"key", "ob_nope"}});
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "not_found");
    ws->send({{"type", "cancel"}, {"turn_id", "t_01m8p3g4mhdmdqxn8qwp6jwrbk"}});
    BOOST_TEST(error_code_of(ws->read_until(frame_type("error"))) == "not_found");
    // Still usable.
    ws->barrier();
    d.model.push(fake_reply::completion("still here"));
    ws->send(message("w3", "are you there?", "m-3"));
    BOOST_TEST(string_at(ws->read_until(frame_type("reply")), "text") == "still here");
}

BOOST_AUTO_TEST_CASE(a_frame_over_the_limit_closes_with_1009_and_the_daemon_goes_on) {
    model_daemon d({}, false, {}, {}, json::object{{"channels", {{"ws", {{"max_frame_bytes", 1024}}}}}});
    auto ws = open_ws(d);
    ws->try_send_text(json::serialize(message("w4", std::string(4096, 'a'), "big")));
    BOOST_TEST(!ws->read().has_value());
    BOOST_TEST(ws->close_code() == 1009);
    auto again = open_ws(d);
    again->barrier();
    BOOST_TEST(d.request("GET", "/healthz").status == 200u);
}

// Found by a new-user check: a frame whose header announced 2^40 bytes was refused only once the
// limit's worth had arrived; a client that sent a few bytes of it waited for nothing.
BOOST_AUTO_TEST_CASE(a_frame_header_announcing_more_than_the_limit_closes_with_1009_at_once) {
    model_daemon d({}, false, {}, {}, json::object{{"channels", {{"ws", {{"max_frame_bytes", 1024}}}}}});
    auto ws =
        std::make_unique<ws_client>(d.daemon->host(), d.daemon->port(), std::chrono::milliseconds(3000));
    // A masked text frame, FIN set, with a 64-bit length of 2^40 and the first 16 bytes of it.
    std::string frame = {'\x81', '\xff', 0, 0, 1, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    frame += std::string(16, 'x');
    ws->send_raw(frame);
    BOOST_TEST(!ws->read().has_value());
    BOOST_TEST(ws->close_code() == 1009);
    // A frame just within the limit is still taken.
    auto again = open_ws(d);
    again->send_text(R"({"type":"ping","id":")" + std::string(1000, 'p') + "\"}");
    BOOST_TEST(string_at(again->read_until(frame_type("pong")), "id") == std::string(1000, 'p'));
}

// Found by a new-user check: a frame sent in the same write as the upgrade request (before the
// 101; RFC 6455 says to wait, some clients do not) was dropped without a word, a message with it.
BOOST_AUTO_TEST_CASE(frames_sent_with_the_upgrade_request_are_read) {
    model_daemon d;
    d.model.push(fake_reply::completion("early reply"));
    auto masked = [](std::string_view text) {
        std::string f = {'\x81', static_cast<char>(0x80 | text.size()), 1, 2, 3, 4};
        for (std::size_t i = 0; i < text.size(); ++i)
            f += static_cast<char>(text[i] ^ "\x01\x02\x03\x04"[i % 4]);
        return f;
    };
    std::string bytes = "GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n";
    bytes += masked(R"({"type":"ping","id":"p1"})");
    bytes += masked(R"({"type":"message","session":"early","text":"hi","events":false})");
    auto c = d.connect();
    BOOST_TEST_REQUIRE(c.write(bytes));
    auto got = c.read_until_seen({R"("type":"pong")", R"("type":"accepted")", "early reply"});
    BOOST_TEST(got.find("HTTP/1.1 101") == 0u, got);
    BOOST_TEST(got.find(R"("type":"pong")") != std::string::npos, got);
    BOOST_TEST(got.find(R"("type":"accepted")") != std::string::npos, got);
    BOOST_TEST(got.find("early reply") != std::string::npos, got);
}

// Found by a new-user check: HTTP answers a full queue with Retry-After: 1, the WebSocket error
// frame said nothing of when to try again.
BOOST_AUTO_TEST_CASE(a_full_queue_error_frame_says_when_to_retry) {
    model_daemon d({}, false, {}, {{"admission", {{"mode", "queue"}, {"max_queued", 0}}}});
    d.model.push(fake_reply::completion("slow").after(std::chrono::milliseconds(1500)));
    auto ws = open_ws(d);
    ws->send(message("wq", "first", "q-1"));
    auto tid = string_at(ws->read_until(frame_type("accepted")), "turn_id");
    d.wait_for_turn(tid, {"running"});
    ws->send(message("wq", "second", "q-2"));
    auto refused = ws->read_until(frame_type("error"));
    BOOST_TEST(error_code_of(refused) == "session_queue_full");
    BOOST_TEST(string_at(refused, "id") == "q-2");
    BOOST_TEST(int_at(refused, "retry_after") == 1);
    d.wait_for_turn(tid);
}

BOOST_AUTO_TEST_CASE(too_many_connections_answer_503_at_the_upgrade) {
    model_daemon d({}, false, {}, {}, json::object{{"channels", {{"ws", {{"max_connections", 1}}}}}});
    auto first = open_ws(d);
    first->barrier();
    auto c = d.connect();
    auto r = c.request("GET", "/v1/ws", {},
                       upgrade_headers());
    check_error(r, 503, "overloaded");
    // A plain GET is told to upgrade.
    auto plain = d.request("GET", "/v1/ws");
    BOOST_TEST(plain.status == 426u);
    // When the first one leaves, there is room again.
    first.reset();
    for (int i = 0; i < 100; ++i) {
        auto probe = d.connect();
        auto pr = probe.request("GET", "/v1/ws", {},
                                upgrade_headers());
        if (pr.status == 101u) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    BOOST_FAIL("no room for a new WebSocket connection after the first one closed");
}

// Found by probing the daemon by hand: Beast's own refusals had a plain-text body.
BOOST_AUTO_TEST_CASE(a_bad_handshake_gets_the_api_error_shape) {
    model_daemon d;
    auto c = d.connect();
    auto old = c.request("GET", "/v1/ws", {},
                         upgrade_headers("8"));
    check_error(old, 426, "invalid_request");
    BOOST_TEST(old.header("Sec-WebSocket-Version").value_or("") == "13");
    // The same connection still answers HTTP.
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
    auto no_key = c.request(
        "GET", "/v1/ws", {},
        upgrade_headers("13", ""));
    check_error(no_key, 400, "invalid_request");
    BOOST_TEST(no_key.body.find("Sec-WebSocket-Key") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(cancel_over_websocket_stops_the_running_turn) {
    model_daemon d;
    d.model.push(fake_reply::completion("too late").after(std::chrono::milliseconds(3000)));
    auto ws = open_ws(d);
    ws->send(message("w5", "slow one", "c-1"));
    auto tid = string_at(ws->read_until(frame_type("accepted")), "turn_id");
    ws->read_until(event_named("model.call", tid));
    ws->send({{"type", "cancel"}, {"turn_id", tid}});
    auto fin = ws->read_until(event_named("turn.finished", tid));
    BOOST_TEST(fin.at("data").at("status").as_string() == "stopped");
}

BOOST_AUTO_TEST_CASE(a_subscriber_that_falls_behind_is_dropped_and_its_reply_waits_in_the_outbox) {
    // A 20 MB stream takes seconds under the sanitizers: a model timeout to match.
    model_daemon d(json::object{}, true, {}, json::object{{"model", {{"timeout_ms", 120000}}}},
                   json::object{{"channels", {{"ws", {{"max_queued_frames", 16}}}}}});
    // ~20 MB of deltas: far more than the socket buffers (both ends, autotuned) of a client that
    // does not read.
    std::vector<std::string> deltas(10000, std::string(2000, 'z'));
    d.model.push(fake_reply::stream_text(deltas, 64 * 1024));
    auto slow = open_ws(d);
    slow->send(message("w6", "flood me", "c-1"));
    // The turn is not slowed by the client that does not read.
    auto listing = [&] { return d.request("GET", "/v1/outbox?status=pending").body; };
    std::string pending;
    for (int i = 0; i < 3000 && pending.find("\"w6\"") == std::string::npos; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        pending = listing();
    }
    BOOST_TEST_REQUIRE(pending.find("\"w6\"") != std::string::npos, pending);
    // What it finally reads ends with a close (1008), not with the whole flood.
    std::size_t frames = 0;
    while (slow->read())
        ++frames;
    BOOST_TEST(slow->close_code() == 1008);
    BOOST_TEST(frames < 10000u);
    // The reply was not lost: a new connection gets it.
    auto back = open_ws(d);
    back->send({{"type", "subscribe"}, {"session", "w6"}});
    auto reply = back->read_until(frame_type("reply"));
    BOOST_TEST(string_at(reply, "text").starts_with("zzzz")); // clipped at limits.max_reply_bytes
}

BOOST_AUTO_TEST_CASE(a_peer_that_stops_answering_pings_is_closed_after_the_idle_timeout) {
    model_daemon d({}, false, {}, {}, json::object{{"channels", {{"ws", {{"idle_timeout_ms", 400}}}}}});
    auto c = d.connect(std::chrono::milliseconds(5000));
    auto r = c.request("GET", "/v1/ws", {},
                       upgrade_headers());
    BOOST_TEST_REQUIRE(r.status == 101u);
    // This peer never answers: the daemon pings, then gives up.
    auto t0 = std::chrono::steady_clock::now();
    auto got = c.read_until_close();
    BOOST_TEST(got.closed);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(3000)));
}

BOOST_AUTO_TEST_SUITE_END()
