// Crash recovery with real processes (issue 6): the daemon takes a stream of messages whose replies
// go to a webhook receiver, is killed with SIGKILL at random moments several times and restarted on
// the same data. Afterwards every accepted message has reached a terminal turn, every completed
// turn's reply was delivered, a reply received twice carries the same key and is flagged
// uncertain, and the SQLite file passes its integrity check after each kill.
#include "tests/daemon_fixture.hpp"
#include "tests/model_daemon.hpp"
#include "tests/webhook_receiver.hpp"

#include <sqlite3.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace baton::test;

namespace {

std::string integrity_of(const std::filesystem::path& db) {
    sqlite3* raw = nullptr;
    if (sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
        std::string e = raw ? sqlite3_errmsg(raw) : "cannot open";
        sqlite3_close(raw);
        return e;
    }
    std::string out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK) {
        while (sqlite3_step(st) == SQLITE_ROW)
            out += reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    } else {
        out = sqlite3_errmsg(raw);
    }
    sqlite3_finalize(st);
    sqlite3_close(raw);
    return out;
}

// At most this many accepted messages a round: five rounds stay within one outbox listing
// (`GET /v1/outbox?limit=10000`), which the checks below read whole. A fast machine accepted
// over 10,000 in five rounds, and the replies past the listing looked lost.
constexpr std::size_t max_per_round = 1500;

// Posts messages (round robin over a few sessions) until the daemon goes away, `stop` is set or
// max_per_round were accepted; returns the turn ids it got a 202 for. Runs on a thread of its own:
// no Boost.Test check in here (they are not for other threads), hence the connection passed in.
std::vector<std::string> post_until_gone(connection conn, std::atomic<bool>& stop, int offset) {
    std::vector<std::string> accepted;
    for (int i = offset; !stop.load() && accepted.size() < max_per_round; ++i) {
        json::object body{{"text", "m" + std::to_string(i)},
                          {"deliver", json::object{{"channel", "webhook"}, {"to", "crm"}}}};
        auto sid = "crash-" + std::to_string(i % 8);
        if (!conn.write(
                format_request("POST", "/v1/sessions/" + sid + "/messages", json::serialize(body))))
            break;
        auto r = conn.read_response();
        if (!r) break;
        if (r->status == 202) accepted.push_back(string_at(r->json.as_object(), "turn_id"));
    }
    return accepted;
}

} // namespace

BOOST_AUTO_TEST_SUITE(crash_recovery)

BOOST_AUTO_TEST_CASE(sigkill_at_random_points_loses_no_message_and_no_reply) {
    auto seed = std::random_device{}();
    BOOST_TEST_MESSAGE("seed " << seed);
    std::mt19937 rng(seed);
    webhook_receiver receiver;
    // A short random delay widens the window between sending a reply and recording it.
    std::mutex rng_mutex;
    receiver.answer_with([&](const recorded_request&) {
        std::lock_guard lock(rng_mutex);
        return receiver_answer{200, {}, std::chrono::milliseconds(rng() % 15)};
    });
    daemon_fixture d(daemon_fixture::deferred{});
    json::object cfg{
        {"agents", json::object{{"default", json::object{}}}},
        {"channels",
         json::object{
             {"webhook",
              json::object{{"targets", json::object{{"crm", json::object{{"url", receiver.url()},
                                                                         {"timeout_ms", 5000}}}}}}}}}};
    auto config = d.write_file("baton.json", json::serialize(cfg));
    const auto db = d.data_dir() / "baton.db";

    std::vector<std::string> accepted;
    const int rounds = 5;
    for (int round = 0; round < rounds; ++round) {
        d.start({"--config", config.string()});
        std::atomic<bool> stop{false};
        std::vector<std::string> got;
        std::thread client([&, conn = d.connect(2s)]() mutable {
            got = post_until_gone(std::move(conn), stop, round * 100000);
        });
        int wait_ms;
        {
            std::lock_guard lock(rng_mutex);
            wait_ms = 100 + static_cast<int>(rng() % 600);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        BOOST_TEST(d.crash() == 128 + SIGKILL);
        stop = true;
        client.join();
        accepted.insert(accepted.end(), got.begin(), got.end());
        BOOST_TEST_MESSAGE("round " << round << ": killed after " << wait_ms << " ms, " << got.size()
                                    << " accepted");
        BOOST_TEST(integrity_of(db) == "ok");
    }
    BOOST_TEST_REQUIRE(accepted.size() >= 50u, "too few messages to mean anything: " << accepted.size());
    BOOST_TEST_REQUIRE(accepted.size() <= 10000u, "more replies than one outbox listing holds");

    // The last start runs what is left and delivers what is pending.
    d.start({"--config", config.string()});
    std::map<std::string, std::string> status;
    for (const auto& tid : accepted)
        status[tid] = string_at(d.wait_for_turn(tid, terminal_statuses(), 30s), "status");
    auto deadline = std::chrono::steady_clock::now() + 30s;
    json::array pending;
    do {
        pending = body_object(d.request("GET", "/v1/outbox?status=pending")).at("items").as_array();
        if (pending.empty()) break;
        std::this_thread::sleep_for(50ms);
    } while (std::chrono::steady_clock::now() < deadline);
    BOOST_TEST_REQUIRE(pending.empty(), "still pending: " << json::serialize(pending));

    std::map<std::string, json::object> item_of_turn, item_of_key;
    auto listing = d.request("GET", "/v1/outbox?limit=10000");
    for (const auto& v : body_object(listing).at("items").as_array()) {
        const auto& o = v.as_object();
        // One reply, one item: a turn recovered or re-rendered never enqueues under a second key.
        BOOST_TEST(item_of_turn.count(string_at(o, "turn_id")) == 0u, "two items for one turn");
        item_of_turn[string_at(o, "turn_id")] = o;
        item_of_key[string_at(o, "key")] = o;
    }
    auto delivered = receiver.delivered_keys();
    std::size_t completed = 0, abandoned = 0, duplicates = 0;
    for (const auto& [tid, st] : status) {
        BOOST_TEST((st == "completed" || st == "failed"), tid << " ended " << st);
        if (st == "failed") ++abandoned;
        if (st != "completed") continue;
        ++completed;
        auto it = item_of_turn.find(tid);
        BOOST_TEST_REQUIRE((it != item_of_turn.end()), "no outbox item for completed turn " << tid);
        BOOST_TEST(string_at(it->second, "status") == "delivered", json::serialize(it->second));
        BOOST_TEST(delivered.count(string_at(it->second, "key")) == 1u,
                   "reply of " << tid << " never reached the receiver");
    }
    for (const auto& [key, times] : delivered) {
        auto it = item_of_key.find(key);
        BOOST_TEST_REQUIRE((it != item_of_key.end()), "the receiver got an unknown key " << key);
        if (times > 1) {
            ++duplicates;
            BOOST_TEST(it->second.at("uncertain").as_bool(),
                       key << " received " << times << " times but not flagged uncertain");
        }
    }
    BOOST_TEST_MESSAGE(accepted.size() << " accepted, " << completed << " completed, " << abandoned
                                       << " abandoned, " << duplicates << " replies received twice");
    BOOST_TEST(completed > 0u);
    BOOST_TEST(integrity_of(db) == "ok");
}

namespace {
// The assistant messages on a session's tape (GET /v1/sessions/{sid}/tape).
std::vector<std::string> assistant_texts(model_daemon& d, const std::string& sid) {
    auto r = d.request("GET", "/v1/sessions/" + sid + "/tape?limit=100");
    BOOST_TEST_REQUIRE(r.status == 200, r.body);
    std::vector<std::string> out;
    auto body = json::parse(r.body);
    for (const auto& e : body.at("entries").as_array()) {
        const auto& p = e.at("payload").as_object();
        if (p.contains("role") && p.at("role") == "assistant")
            out.push_back(std::string(p.at("text").as_string()));
    }
    return out;
}
} // namespace

// A turn the daemon died under in its model call had begun no side effect: it runs again from its
// stored message at the next start (attempt 2) and answers once; the messages queued behind it
// run after it, in accept order.
BOOST_AUTO_TEST_CASE(a_turn_cut_off_in_its_model_call_runs_again_and_answers_once) {
    model_daemon d;
    auto slow = fake_reply::completion("never seen");
    slow.delay = 5s;
    d.model.push(slow);
    auto first = d.post("first", "recover-1");
    d.wait_for_turn(first, {"running"});
    BOOST_TEST(int_at(d.wait_for_turn(first, {"running"}), "attempt") == 1);
    auto second = d.post("second", "recover-1");
    auto third = d.post("third", "recover-1");
    BOOST_TEST(d.crash() == 128 + SIGKILL);
    d.model.push(fake_reply::completion("answer one"));
    d.model.push(fake_reply::completion("answer two"));
    d.model.push(fake_reply::completion("answer three"));
    d.start({"--config", (d.dir.root / "baton.json").string()});
    auto rec = d.wait_for_turn(first);
    BOOST_TEST(string_at(rec, "status") == "completed");
    BOOST_TEST(string_at(rec, "reply") == "answer one");
    BOOST_TEST(int_at(rec, "attempt") == 2);
    BOOST_TEST(string_at(d.wait_for_turn(second), "reply") == "answer two");
    BOOST_TEST(int_at(d.wait_for_turn(second), "attempt") == 1);
    BOOST_TEST(string_at(d.wait_for_turn(third), "reply") == "answer three");
    auto started2 = string_at(d.wait_for_turn(second), "finished_at");
    auto started3 = string_at(d.wait_for_turn(third), "started_at");
    BOOST_TEST(started2 <= started3);
    // One reply each: the cut-off run left nothing on the tape.
    std::vector<std::string> want{"answer one", "answer two", "answer three"};
    BOOST_TEST(assistant_texts(d, "recover-1") == want, boost::test_tools::per_element());
}

// A turn the daemon died under in a tool call had begun a side effect: it ends `failed` with
// error.code "abandoned", and the tool is not called again.
BOOST_AUTO_TEST_CASE(a_turn_cut_off_in_a_tool_call_is_abandoned) {
    fake_openai tool_server;
    json::object tools{{"slow_tool",
                        {{"kind", "http"},
                         {"url", "http://127.0.0.1:" + std::to_string(tool_server.port()) + "/slow"},
                         {"description", "takes its time"},
                         {"timeout_ms", 30000},
                         {"parameters", {{"type", "object"}, {"properties", json::object{}}}}}}};
    model_daemon d(json::object{}, false, tools);
    tool_server.push(fake_reply::completion("late").after(30s));
    d.model.push(fake_reply::completion("", {{"c1", "slow_tool", "{}"}}, "tool_calls"));
    auto tid = d.post("do the slow thing", "recover-tool");
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (tool_server.requests().empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    BOOST_TEST_REQUIRE(tool_server.requests().size() == 1u, "the tool was never called");
    BOOST_TEST(d.crash() == 128 + SIGKILL);
    d.model.push(fake_reply::completion("never asked"));
    d.start({"--config", (d.dir.root / "baton.json").string()});
    auto rec = d.wait_for_turn(tid);
    BOOST_TEST(string_at(rec, "status") == "failed");
    BOOST_TEST(string_at(rec.at("error").as_object(), "code") == "abandoned");
    BOOST_TEST(int_at(rec, "attempt") == 1);
    BOOST_TEST(tool_server.requests().size() == 1u);
    BOOST_TEST(d.model.requests().size() == 1u);
    // The tape keeps what was asked and that it went unanswered, for the next turn's context.
    auto tape = json::parse(d.request("GET", "/v1/sessions/recover-tool/tape").body);
    const auto& entries = tape.at("entries").as_array();
    BOOST_TEST_REQUIRE(entries.size() == 2u, json::serialize(tape));
    BOOST_TEST(entries[0].at("kind") == "message");
    BOOST_TEST(entries[0].at("payload").at("text") == "do the slow thing");
    BOOST_TEST(entries[1].at("kind") == "error");
    BOOST_TEST(entries[1].at("payload").at("code") == "abandoned");
    // (The model answers with the reply pushed above, which the abandoned turn never asked for.)
    BOOST_TEST(string_at(d.wait_for_turn(d.post("did it work?", "recover-tool")), "reply") ==
               "never asked");
    auto reqs = d.model.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 2u);
    const auto sent = reqs.back().body.at("messages").as_array();
    bool asked = false;
    for (const auto& m : sent)
        asked = asked || (m.at("role") == "user" && m.at("content") == "do the slow thing");
    BOOST_TEST(asked, json::serialize(sent));
}

BOOST_AUTO_TEST_CASE(an_agent_with_on_abandoned_rerun_runs_the_turn_again) {
    model_daemon d({}, false, {}, json::object{{"on_abandoned", "rerun"}});
    auto slow = fake_reply::completion("never seen");
    slow.delay = 5s;
    d.model.push(slow);
    auto tid = d.post("again", "recover-2");
    d.wait_for_turn(tid, {"running"});
    BOOST_TEST(d.crash() == 128 + SIGKILL);
    d.model.push(fake_reply::completion("second run"));
    d.start({"--config", (d.dir.root / "baton.json").string()});
    auto rec = d.wait_for_turn(tid);
    BOOST_TEST(string_at(rec, "status") == "completed");
    BOOST_TEST(string_at(rec, "reply") == "second run");
}

namespace {
// An agent whose messages fold into the running turn (`collect` or `steer`), with a model
// timeout longer than the slow answers below.
json::object folding(std::string mode) {
    return {{"admission", {{"mode", std::move(mode)}, {"max_queued", 8}}},
            {"model", {{"timeout_ms", 30000}}}};
}

// Waits (bounded) until the fake model has received `n` requests.
void wait_for_requests(model_daemon& d, std::size_t n) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (d.model.requests().size() < n && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    BOOST_TEST_REQUIRE(d.model.requests().size() >= n, "the model never got request " << n);
}

void check_abandoned(model_daemon& d, const std::string& tid, const std::string& what) {
    auto rec = d.wait_for_turn(tid);
    BOOST_TEST(string_at(rec, "status") == "failed", what << " ended " << string_at(rec, "status"));
    BOOST_TEST(
        (rec.at("error").is_object() && string_at(rec.at("error").as_object(), "code") == "abandoned"),
        what << ": " << json::serialize(rec));
}
} // namespace

// Messages answered by another turn run with it. A crash in its model call runs the turn again,
// and it collects them again: each is answered once, by the rerun.
BOOST_AUTO_TEST_CASE(messages_collected_into_a_turn_run_again_with_it_after_a_crash) {
    model_daemon d({}, false, {}, folding("collect"));
    d.model.push(fake_reply::completion("first answer").after(600ms));
    d.model.push(fake_reply::completion("never seen").after(30s));
    auto first = d.post("first", "fold-1");
    d.wait_for_turn(first, {"running"});
    auto second = d.post("second", "fold-1");
    auto third = d.post("third", "fold-1");
    BOOST_TEST(string_at(d.wait_for_turn(first), "reply") == "first answer");
    wait_for_requests(d, 2); // the turn of `second`, carrying `third`, is asking the model
    BOOST_TEST(d.crash() == 128 + SIGKILL);
    d.model.push(fake_reply::completion("a second answer"));
    d.model.push(fake_reply::completion("unexpected"));
    d.start({"--config", (d.dir.root / "baton.json").string()});
    auto carrier = d.wait_for_turn(second);
    BOOST_TEST(string_at(carrier, "reply") == "a second answer");
    BOOST_TEST(int_at(carrier, "attempt") == 2);
    BOOST_TEST(string_at(d.wait_for_turn(third), "reply") == "a second answer");
    BOOST_TEST(d.model.requests().size() == 3u);
    auto last = d.model.requests().at(2).body.at("messages").as_array();
    BOOST_TEST(last.back().at("content") == "third");
}

// A message steered into a turn that had called a tool shares its side effects: both end
// `abandoned` after a crash.
BOOST_AUTO_TEST_CASE(a_steered_message_ends_with_its_turn_after_a_crash) {
    model_daemon d({}, false, {}, folding("steer"));
    // Step 1 asks for the clock (slowly); the steered message joins before step 2, which hangs.
    d.model.push(fake_reply::completion("", {{"call_1", "clock", "{}"}}, "tool_calls").after(600ms));
    d.model.push(fake_reply::completion("never seen").after(30s));
    auto first = d.post("what time is it?", "fold-2");
    d.wait_for_turn(first, {"running"});
    auto steered = d.post("and in Paris?", "fold-2");
    wait_for_requests(d, 2);
    BOOST_TEST(d.model.requests()[1].body.at("messages").as_array().back().at("content") ==
               "and in Paris?");
    BOOST_TEST(d.crash() == 128 + SIGKILL);
    d.model.push(fake_reply::completion("a second answer"));
    d.start({"--config", (d.dir.root / "baton.json").string()});
    check_abandoned(d, first, "the carrier");
    check_abandoned(d, steered, "the steered message");
    BOOST_TEST(d.model.requests().size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
