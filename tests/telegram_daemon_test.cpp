// The Telegram channel through the real daemon (`baton serve`) against the fake Bot API server:
// chat messages become turns of `telegram:<chat_id>`, allow_chats, the offset and the held
// debounce buffer surviving stops and SIGKILL (no update lost, none run twice), replies through
// sendMessage (chunked, paced), a Bot API that is down not taking the daemon down, and a drain
// that does not wait for the long poll. The timers' deadlines (backoff, retry_after, a wrong
// token's pause, debounce, a sendMessage 429 and 403) are checked on a manual clock in
// telegram_timing_test.cpp.
#include "tests/daemon_fixture.hpp"
#include "tests/fake_openai.hpp"
#include "tests/fake_telegram.hpp"

#include <boost/test/unit_test.hpp>

#include <sqlite3.h>

#include <cstdlib>
#include <random>
#include <set>
#include <thread>

using namespace baton::test;

namespace {

const std::string token = "424242:fake-bot-secret";
const char* const token_env = "TG_TEST_TOKEN";

struct telegram_daemon : daemon_fixture {
    fake_telegram& tg;
    std::string config_path;

    // `config_extra` keys go into the config file as they are (e.g. "agents").
    explicit telegram_daemon(fake_telegram& f, json::object telegram = {}, bool start_now = true,
                             json::object config_extra = {})
        : daemon_fixture(deferred{}), tg(f) {
        ::setenv(token_env, token.c_str(), 1);
        json::object t{{"token_env", token_env}, {"api_base", f.api_base()}};
        for (auto& kv : telegram)
            t[kv.key()] = kv.value();
        json::object cfg{{"storage", {{"sqlite", {{"path", (data_dir() / "baton.db").string()}}}}},
                         {"channels", {{"telegram", std::move(t)}}}};
        for (auto& kv : config_extra)
            cfg[kv.key()] = kv.value();
        config_path = write_file("baton.json", json::serialize(cfg)).string();
        if (start_now) run();
    }
    void run() { start({"--config", config_path}); }

    std::string sid(std::int64_t chat) const { return "telegram:" + std::to_string(chat); }

    // The session's user messages on its tape, oldest first.
    std::vector<std::string> user_texts(std::int64_t chat) const {
        auto r = request("GET", "/v1/sessions/" + sid(chat) + "/tape?limit=1000");
        std::vector<std::string> out;
        if (r.status != 200) return out;
        for (const auto& e : body_object(r).at("entries").as_array()) {
            const auto& o = e.as_object();
            if (string_at(o, "kind") != "message") continue;
            const auto& p = o.at("payload").as_object();
            if (string_at(p, "role") == "user") out.push_back(string_at(p, "text"));
        }
        return out;
    }

    // Waits until the session has `n` turns and none queued or running; returns its view.
    json::object wait_turns(std::int64_t chat, std::int64_t n,
                            std::chrono::milliseconds limit = 15s) const {
        auto deadline = std::chrono::steady_clock::now() + limit;
        http_response last;
        for (;;) {
            last = request("GET", "/v1/sessions/" + sid(chat));
            if (last.status == 200) {
                const auto& o = body_object(last);
                if (int_at(o, "turns") >= n && int_at(o, "queued") == 0 && o.at("busy").is_bool() &&
                    !o.at("busy").as_bool())
                    return o;
            }
            if (std::chrono::steady_clock::now() >= deadline) break;
            std::this_thread::sleep_for(20ms);
        }
        BOOST_FAIL("session " << sid(chat) << " did not reach " << n << " turns: " << last.status << " "
                              << last.body << "\nlog:\n"
                              << log());
        return {};
    }

    // Waits until getUpdates has asked for an offset beyond `update_id` (the update is handled and
    // the offset stored: the poller asks for the next one only after that).
    void wait_past(std::int64_t update_id, std::chrono::milliseconds limit = 10s) const {
        auto deadline = std::chrono::steady_clock::now() + limit;
        for (;;) {
            auto offsets = tg.offsets();
            if (!offsets.empty() && offsets.back() > update_id) return;
            if (std::chrono::steady_clock::now() >= deadline) break;
            std::this_thread::sleep_for(5ms);
        }
        BOOST_FAIL("getUpdates never asked past update " << update_id << "\nlog:\n" << log());
    }

    void check_log_has_no_token() const {
        auto text = log();
        BOOST_TEST(text.find("fake-bot-secret") == std::string::npos, text);
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(telegram_channel)

BOOST_AUTO_TEST_CASE(a_chat_message_becomes_a_turn_of_its_session) {
    fake_telegram tg(token);
    telegram_daemon d(tg);
    auto id = tg.push_message(42, "hello bot", "carol");
    auto view = d.wait_turns(42, 1);
    BOOST_TEST(string_at(view, "agent") == "default");
    auto rec = d.wait_for_turn(string_at(view, "last_turn_id"), {"completed"});
    BOOST_TEST(string_at(rec, "session_id") == "telegram:42");
    BOOST_TEST(string_at(rec, "reply") == "echo: hello bot");
    BOOST_TEST((d.user_texts(42) == std::vector<std::string>{"hello bot"}));
    // The reply goes back to the chat through the outbox.
    BOOST_TEST_REQUIRE(tg.wait_sent(1, 10s), d.log());
    BOOST_TEST(tg.sent()[0].chat_id == "42");
    BOOST_TEST(tg.sent()[0].text == "echo: hello bot");
    auto items = body_object(d.request("GET", "/v1/outbox")).at("items").as_array();
    BOOST_REQUIRE_EQUAL(items.size(), 1u);
    BOOST_TEST(items[0].at("channel").as_string() == "telegram");
    // Every member docs/api.md lists for an outbox item.
    for (const char* k : {"key", "turn_id", "tenant", "session_id", "channel", "status", "attempts",
                          "uncertain", "last_error"})
        BOOST_TEST(items[0].as_object().contains(k), k);
    BOOST_TEST(items[0].at("tenant").as_string() == "default");
    d.wait_past(id);
    // A group chat (negative id) is a session of its own.
    tg.push_message(-1001234, "group hi");
    d.wait_turns(-1001234, 1);
    BOOST_TEST((d.user_texts(-1001234) == std::vector<std::string>{"group hi"}));
    // The drain cancels the long poll (25 s by default) instead of waiting for it.
    auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(d.stop() == 0);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));
    d.check_log_has_no_token();
}

// In a group, a command addressed to this bot (getMe's username) is that command; one addressed
// to another bot is not this one's and is left alone.
BOOST_AUTO_TEST_CASE(a_command_addressed_to_another_bot_is_left_alone) {
    fake_telegram tg(token);
    telegram_daemon d(tg);
    tg.push_message(-77, "/stop@other_bot");
    tg.push_message(-77, "/help@FAKE_BOT");
    auto id = tg.push_message(-77, "hello");
    d.wait_turns(-77, 2);
    d.wait_past(id);
    BOOST_TEST((d.user_texts(-77) == std::vector<std::string>{"/help", "hello"}));
    BOOST_TEST(tg.calls("getMe") == 1u);
}

BOOST_AUTO_TEST_CASE(chats_outside_allow_chats_are_ignored) {
    fake_telegram tg(token);
    telegram_daemon d(tg, {{"allow_chats", json::array{42}}});
    tg.push_message(43, "words from a stranger");
    auto id = tg.push_message(42, "a friend");
    d.wait_turns(42, 1);
    d.wait_past(id);
    BOOST_TEST(d.request("GET", "/v1/sessions/telegram:43").status == 404u);
    auto log = d.log();
    BOOST_TEST(log.find("not in allow_chats") != std::string::npos, log);
    BOOST_TEST(log.find("words from a stranger") == std::string::npos, log);
}

BOOST_AUTO_TEST_CASE(no_update_is_lost_or_run_twice_across_stops_and_crashes) {
    fake_telegram tg(token);
    telegram_daemon d(tg, {{"poll_timeout_s", 1}}, false);
    std::mt19937 rng(std::random_device{}());
    std::int64_t pushed = 0;
    for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < 5; ++i)
            tg.push_message(42, "m" + std::to_string(pushed++));
        d.run();
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
        // Two rounds crash, two drain.
        if (round % 2 == 0)
            d.crash();
        else
            BOOST_TEST(d.stop() == 0);
    }
    d.run();
    auto view = d.wait_turns(42, pushed);
    BOOST_TEST(int_at(view, "turns") == pushed, "every update is one turn: " << view);
    // Turns cut short by a crash end `abandoned` without a tape entry; the others appear once.
    auto texts = d.user_texts(42);
    std::set<std::string> unique(texts.begin(), texts.end());
    BOOST_TEST(unique.size() == texts.size());
    // Still exactly one turn per update after one more restart.
    BOOST_TEST(d.stop() == 0);
    d.run();
    std::this_thread::sleep_for(500ms);
    BOOST_TEST(int_at(d.wait_turns(42, pushed), "turns") == pushed);
    BOOST_TEST(tg.queued() == 0u); // every update was confirmed
}

// Runs one statement on the daemon's SQLite file (the daemon is stopped).
static void sql(const std::filesystem::path& db, const std::string& statement) {
    sqlite3* raw = nullptr;
    BOOST_REQUIRE(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
    char* err = nullptr;
    int rc = sqlite3_exec(raw, statement.c_str(), nullptr, nullptr, &err);
    std::string message = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(raw);
    BOOST_REQUIRE_MESSAGE(rc == SQLITE_OK, statement << ": " << message);
}

BOOST_AUTO_TEST_CASE(an_update_fetched_again_is_a_replay_not_a_second_turn) {
    fake_telegram tg(token);
    telegram_daemon d(tg);
    auto first = tg.push_message(42, "only once");
    d.wait_turns(42, 1);
    d.wait_past(first);
    BOOST_TEST(d.stop() == 0);
    // As if the process had died after accepting the update but before storing the offset, and
    // Telegram served it again.
    sql(d.data_dir() / "baton.db",
        "UPDATE cursors SET value = '" + std::to_string(first) + "' WHERE name = 'telegram.offset'");
    tg.redeliver(first);
    auto second = tg.push_message(42, "then this");
    d.run();
    d.wait_past(second);
    auto view = d.wait_turns(42, 2);
    BOOST_TEST(int_at(view, "turns") == 2);
    BOOST_TEST((d.user_texts(42) == std::vector<std::string>{"only once", "then this"}));
    BOOST_TEST_REQUIRE(tg.wait_sent(2, 10s));
    std::this_thread::sleep_for(300ms);
    BOOST_TEST(tg.sent().size() == 2u); // one reply each
}

// A chat's session queue holds one message while a slow model answers the one before: the
// messages after it wait at the Bot API (unconfirmed) and are fetched again until there is room,
// instead of being dropped. Another chat's message behind them waits too, and is not lost either.
BOOST_AUTO_TEST_CASE(a_full_session_queue_holds_updates_until_there_is_room) {
    fake_telegram tg(token);
    fake_openai model;
    constexpr int burst = 4;
    for (int i = 0; i < burst + 1; ++i)
        model.push(fake_reply::completion("answer " + std::to_string(i)).after(400ms));
    json::object agents{{"default",
                         {{"model",
                           {{"provider", "openai"},
                            {"base_url", model.base_url()},
                            {"model", "fake-1"},
                            {"stream", false},
                            {"timeout_ms", 5000}}},
                          {"admission", {{"mode", "queue"}, {"max_queued", 1}}}}}};
    for (int i = 0; i < burst; ++i)
        tg.push_message(42, "m" + std::to_string(i));
    auto other = tg.push_message(7, "from another chat");
    telegram_daemon d(tg, {{"poll_timeout_s", 1}}, true, {{"agents", std::move(agents)}});
    auto view = d.wait_turns(42, burst, 20s);
    BOOST_TEST(int_at(view, "turns") == burst);
    BOOST_TEST((d.user_texts(42) == std::vector<std::string>{"m0", "m1", "m2", "m3"}));
    d.wait_turns(7, 1, 10s);
    BOOST_TEST((d.user_texts(7) == std::vector<std::string>{"from another chat"}));
    d.wait_past(other);
    BOOST_TEST(tg.queued() == 0u);
    auto text = d.log();
    BOOST_TEST(text.find("session_queue_full") != std::string::npos, text);
    BOOST_TEST(text.find("message dropped") == std::string::npos, text);
    BOOST_TEST(d.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_held_message_survives_a_crash) {
    fake_telegram tg(token);
    telegram_daemon d(tg, {{"debounce_ms", 20000}});
    auto id = tg.push_message(42, "held");
    d.wait_past(id); // held in the store with the offset past it
    BOOST_TEST(d.request("GET", "/v1/sessions/telegram:42").status == 404u);
    d.crash();
    // The restart admits it at once, without waiting for more.
    d.run();
    d.wait_turns(42, 1, 5s);
    BOOST_TEST((d.user_texts(42) == std::vector<std::string>{"held"}));
    BOOST_TEST(tg.queued() == 0u);
}

BOOST_AUTO_TEST_CASE(the_daemon_stays_up_while_the_bot_api_is_down) {
    fake_telegram tg(token);
    tg.go_down(); // connections refused
    telegram_daemon d(tg);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (d.log().find("getUpdates failed") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(20ms);
    BOOST_TEST_REQUIRE(d.log().find("getUpdates failed") != std::string::npos, d.log());
    BOOST_TEST(d.request("GET", "/healthz").status == 200u);
    // Back on the same port: the next attempt (backoff 1 s, 2 s, 4 s: telegram_timing_test.cpp)
    // gets the message through.
    tg.come_back();
    tg.push_message(42, "anyone there?");
    d.wait_turns(42, 1);
    BOOST_TEST((d.user_texts(42) == std::vector<std::string>{"anyone there?"}));
    d.check_log_has_no_token();
}

BOOST_AUTO_TEST_CASE(a_long_reply_arrives_as_ordered_paced_chunks) {
    fake_telegram tg(token);
    telegram_daemon d(tg, {{"send_interval_ms", 200}});
    std::string text;
    for (int i = 0; text.size() < 9000; ++i)
        text += "line " + std::to_string(i) + " of a long message\n";
    tg.push_message(42, text);
    auto view = d.wait_turns(42, 1);
    auto reply = string_at(d.wait_for_turn(string_at(view, "last_turn_id"), {"completed"}), "reply");
    BOOST_TEST_REQUIRE(reply.size() > 8192u);
    BOOST_TEST_REQUIRE(tg.wait_sent(3, 15s), d.log());
    std::this_thread::sleep_for(300ms); // nothing more comes
    auto sent = tg.sent();
    BOOST_TEST(sent.size() == 3u);
    std::string joined;
    for (std::size_t i = 0; i < sent.size(); ++i) {
        BOOST_TEST(sent[i].chat_id == "42");
        BOOST_TEST(sent[i].text.size() <= 4096u); // ASCII: bytes are characters
        joined += sent[i].text;
        if (i > 0) BOOST_TEST((sent[i].at - sent[i - 1].at >= 190ms));
    }
    BOOST_TEST(joined == reply);
}

BOOST_AUTO_TEST_CASE(serve_refuses_to_start_without_the_token) {
    daemon_fixture d(daemon_fixture::deferred{});
    json::object cfg{{"channels", {{"telegram", {{"token_env", "TG_TEST_TOKEN_NEVER_SET"}}}}}};
    auto path = d.write_file("baton.json", json::serialize(cfg));
    auto r = run_baton({"serve", "--config", path.string(), "--listen", "127.0.0.1:0", "--data",
                        d.data_dir().string()});
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(r.output.find("TG_TEST_TOKEN_NEVER_SET is not set") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_SUITE_END()
