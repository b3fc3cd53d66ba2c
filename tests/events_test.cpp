// The turn event logs and the hub (include/baton/events.hpp), without I/O: seqs, replay after a
// resume point, the gap when the bound dropped frames, wake-ups, retention and session listeners.
#include <baton/events.hpp>

#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

using namespace baton;

namespace {
json::object data(int i) {
    return {{"i", i}};
}
} // namespace

BOOST_AUTO_TEST_SUITE(turn_events)

BOOST_AUTO_TEST_CASE(events_get_increasing_seqs_and_replay_after_a_resume_point) {
    event_hub hub;
    auto log = hub.open("t_1", "s1");
    BOOST_TEST(hub.open("t_1", "s1") == log); // one log per turn
    for (int i = 0; i < 5; ++i)
        BOOST_TEST(log->publish("model.delta", data(i))->seq == i + 1);
    auto all = log->read_after(0, 100);
    BOOST_TEST_REQUIRE(all.events.size() == 5u);
    BOOST_TEST(!all.gap_from.has_value());
    BOOST_TEST(all.events[0]->data == R"({"i":0})");
    BOOST_TEST(all.events[0]->turn_id == "t_1");
    BOOST_TEST(all.events[0]->session_id == "s1");
    auto tail = log->read_after(3, 100);
    BOOST_TEST_REQUIRE(tail.events.size() == 2u);
    BOOST_TEST(tail.events[0]->seq == 4);
    BOOST_TEST(log->read_after(1, 2).events.size() == 2u); // at most `max`
    BOOST_TEST(!all.finished);
}

BOOST_AUTO_TEST_CASE(a_reader_behind_the_bound_gets_a_gap_and_turn_finished_is_kept) {
    event_hub_options o;
    o.events_per_turn = 4;
    event_hub hub(o);
    auto log = hub.open("t_1", "s1");
    for (int i = 0; i < 10; ++i)
        log->publish("model.delta", data(i));
    log->publish("turn.finished", json::object{{"status", "completed"}});
    BOOST_TEST(log->publish("model.delta", data(99)) == nullptr); // nothing after the end
    auto r = log->read_after(0, 100);
    BOOST_TEST_REQUIRE(r.gap_from.has_value());
    BOOST_TEST(*r.gap_from == 1);
    BOOST_TEST(r.gap_to == 7);
    BOOST_TEST_REQUIRE(r.events.size() == 4u);
    BOOST_TEST(r.events.front()->seq == 8);
    BOOST_TEST(r.events.back()->type == "turn.finished");
    BOOST_TEST(r.finished);
    // Resuming inside the kept window: no gap.
    auto inside = log->read_after(9, 100);
    BOOST_TEST(!inside.gap_from.has_value());
    BOOST_TEST(inside.events.size() == 2u);
    // After the end: nothing new, finished.
    auto after_end = log->read_after(11, 100);
    BOOST_TEST(after_end.events.empty());
    BOOST_TEST(after_end.finished);
}

BOOST_AUTO_TEST_CASE(a_waiting_reader_is_woken_once_by_the_next_event) {
    event_hub hub;
    auto log = hub.open("t_1", "s1");
    int woken = 0;
    auto r = log->read_after(0, 10, [&] { ++woken; });
    BOOST_TEST(r.events.empty());
    BOOST_TEST(woken == 0);
    log->publish("turn.started", {});
    BOOST_TEST(woken == 1);
    log->publish("stage.started", {});
    BOOST_TEST(woken == 1); // one-shot
    // A reader with something to read is not registered.
    log->read_after(0, 10, [&] { ++woken; });
    log->publish("stage.finished", {});
    BOOST_TEST(woken == 1);
}

BOOST_AUTO_TEST_CASE(session_listeners_get_every_event_of_their_session_only) {
    event_hub hub;
    std::vector<std::string> got;
    auto id = hub.listen("s1", [&](const event_ptr& e) { got.push_back(e->turn_id + ":" + e->type); });
    hub.open("t_1", "s1")->publish("turn.queued", {});
    hub.open("t_2", "s2")->publish("turn.queued", {});
    hub.open("t_3", "s1")->publish("turn.started", {});
    BOOST_TEST(got == (std::vector<std::string>{"t_1:turn.queued", "t_3:turn.started"}),
               boost::test_tools::per_element());
    hub.unlisten("s1", id);
    hub.open("t_1", "s1")->publish("turn.started", {});
    BOOST_TEST(got.size() == 2u);
}

BOOST_AUTO_TEST_CASE(finished_turns_stay_attachable_within_the_retention_bound) {
    event_hub_options o;
    o.finished_turns_kept = 2;
    event_hub hub(o);
    for (int i = 1; i <= 3; ++i) {
        auto id = "t_" + std::to_string(i);
        hub.open(id, "s1")->publish("turn.finished", {});
        hub.retire(id);
    }
    BOOST_TEST(hub.find("t_1") == nullptr);
    BOOST_TEST(hub.find("t_2") != nullptr);
    BOOST_TEST(hub.find("t_3") != nullptr);
    BOOST_TEST(hub.live_logs() == 2u);
    // A live (not retired) turn is never dropped.
    hub.open("t_live", "s1");
    for (int i = 4; i <= 8; ++i) {
        auto id = "t_" + std::to_string(i);
        hub.open(id, "s1");
        hub.retire(id);
    }
    BOOST_TEST(hub.find("t_live") != nullptr);
}

BOOST_AUTO_TEST_CASE(frames_render_as_sse_and_websocket) {
    turn_event e;
    e.turn_id = "t_1";
    e.seq = 7;
    e.type = "model.delta";
    e.data = R"({"text":"a\nb"})";
    BOOST_TEST(sse_frame(e) == "id: 7\nevent: model.delta\ndata: {\"text\":\"a\\nb\"}\n\n");
    auto ws = json::parse(ws_event_frame(e)).as_object();
    BOOST_TEST(ws.at("type").as_string() == "event");
    BOOST_TEST(ws.at("turn_id").as_string() == "t_1");
    BOOST_TEST(ws.at("seq").as_int64() == 7);
    BOOST_TEST(ws.at("event").as_string() == "model.delta");
    BOOST_TEST(ws.at("data").at("text").as_string() == "a\nb");
}

BOOST_AUTO_TEST_SUITE_END()
