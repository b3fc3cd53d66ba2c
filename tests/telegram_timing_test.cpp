// The Telegram channel's timers, through baton::service in process against the fake Bot API
// server, on a manual clock: getUpdates failures back off 1 s, 2 s, 4 s; a 429's retry_after
// and a refused token's 30 s pause are kept; the debounce holds a chat's messages for its time
// and a command goes at once; a sendMessage 429 waits out its retry_after in the outbox and the
// next chat's send waits the overall gap. Each deadline is checked just before and at its time.
#include "tests/clocked_service.hpp"
#include "tests/fake_telegram.hpp"

#include <cstdlib>

using namespace baton;
using namespace baton::test;

namespace {

const std::string token = "424242:fake-bot-secret";
const char* const token_env = "TG_TIMING_TEST_TOKEN";

service_options telegram_options(const fake_telegram& tg) {
    ::setenv(token_env, token.c_str(), 1);
    auto o = clocked_service::memory_options();
    o.config.channels.telegram_token_env = token_env;
    o.config.channels.telegram_api_base = tg.api_base();
    o.config.channels.telegram_poll_timeout_s = 1;
    return o;
}

void check_log_has_no_token(clocked_service& s) {
    auto text = s.log_text();
    BOOST_TEST(text.find("fake-bot-secret") == std::string::npos, text);
}

} // namespace

BOOST_AUTO_TEST_SUITE(telegram_channel)

BOOST_AUTO_TEST_CASE(get_updates_failures_back_off_and_the_next_try_gets_through) {
    fake_telegram tg(token);
    tg.go_down(); // connections refused
    clocked_service s(telegram_options(tg));
    s.start();
    auto failures = [&] { return s.logged("telegram: getUpdates failed"); };
    BOOST_TEST_REQUIRE(eventually([&] { return failures() == 1; }), s.log_text());
    BOOST_TEST_REQUIRE(s.parked());
    std::size_t n = 1;
    for (auto backoff : {1000ms, 2000ms}) {
        s.clock->advance(backoff - 1ms);
        BOOST_TEST_REQUIRE(s.parked());
        BOOST_TEST(failures() == n);
        s.clock->advance(1ms);
        ++n;
        BOOST_TEST_REQUIRE(eventually([&] { return failures() == n; }), s.log_text());
        BOOST_TEST_REQUIRE(s.parked());
    }
    BOOST_TEST(s.logged(R"("retry_in_ms":1000)") == 1u);
    BOOST_TEST(s.logged(R"("retry_in_ms":2000)") == 1u);
    BOOST_TEST(s.logged(R"("retry_in_ms":4000)") == 1u);
    // Back on the same port: the try 4 s later gets the message through, not one before.
    tg.come_back();
    tg.push_message(42, "anyone there?");
    s.clock->advance(3999ms);
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(s.turns("telegram:42") == 0);
    s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("telegram:42") == 1; }), s.log_text());
    BOOST_TEST((s.user_texts("telegram:42") == std::vector<std::string>{"anyone there?"}));
    check_log_has_no_token(s);
}

BOOST_AUTO_TEST_CASE(get_updates_429_retry_after_is_honoured) {
    fake_telegram tg(token);
    tg.fail_next("getUpdates", 1, 429, "Too Many Requests: retry after 3", 3);
    clocked_service s(telegram_options(tg));
    s.start();
    BOOST_TEST_REQUIRE(eventually([&] { return tg.calls("getUpdates") == 1; }));
    BOOST_TEST_REQUIRE(s.parked());
    // The plain backoff would try again after 1 s; the server asked for 3.
    s.clock->advance(2999ms);
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(tg.calls("getUpdates") == 1u);
    s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(eventually([&] { return tg.calls("getUpdates") == 2; }));
    tg.push_message(42, "after the pause");
    BOOST_TEST(eventually([&] { return s.turns("telegram:42") == 1; }), s.log_text());
}

BOOST_AUTO_TEST_CASE(a_wrong_token_is_reported_and_retried_after_30_s) {
    fake_telegram tg("999:the-real-token");
    clocked_service s(telegram_options(tg));
    s.start();
    BOOST_TEST_REQUIRE(eventually([&] { return tg.unauthorized() == 1; }));
    BOOST_TEST_REQUIRE(s.parked());
    s.clock->advance(29999ms);
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(tg.unauthorized() == 1u);
    s.clock->advance(1ms);
    BOOST_TEST(eventually([&] { return tg.unauthorized() == 2; }));
    BOOST_TEST(s.logged("refused the bot token") >= 1u, s.log_text());
    check_log_has_no_token(s);
}

BOOST_AUTO_TEST_CASE(debounce_joins_messages_and_a_command_goes_alone) {
    fake_telegram tg(token);
    auto o = telegram_options(tg);
    o.config.channels.telegram_debounce = 400ms;
    tg.push_message(42, "one");
    tg.push_message(42, "two");
    auto last = tg.push_message(7, "other chat");
    clocked_service s(o);
    s.start();
    // Fetched and held (the offset asked for next is past them), waiting for the debounce.
    BOOST_TEST_REQUIRE(eventually([&] {
        auto offsets = tg.offsets();
        return !offsets.empty() && offsets.back() > last && s.clock->waiting() == 1;
    }));
    s.clock->advance(399ms);
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(s.turns("telegram:42") == 0);
    BOOST_TEST(s.turns("telegram:7") == 0);
    s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(
        eventually([&] { return s.turns("telegram:42") == 1 && s.turns("telegram:7") == 1; }));
    BOOST_TEST((s.user_texts("telegram:42") == std::vector<std::string>{"one\ntwo"}));
    BOOST_TEST((s.user_texts("telegram:7") == std::vector<std::string>{"other chat"}));
    // A command flushes what the chat has held, then runs alone: no time passes.
    tg.push_message(42, "three");
    tg.push_message(42, "/help");
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("telegram:42") == 3; }), s.log_text());
    BOOST_TEST((s.user_texts("telegram:42") == std::vector<std::string>{"one\ntwo", "three", "/help"}));
}

BOOST_AUTO_TEST_CASE(send_message_429_waits_its_retry_after_and_403_gives_up) {
    fake_telegram tg(token);
    tg.block_chat(666);
    clocked_service s(telegram_options(tg));
    s.start();
    tg.fail_next("sendMessage", 1, 429, "Too Many Requests: retry after 2", 2);
    tg.push_message(42, "slow down");
    BOOST_TEST_REQUIRE(eventually([&] { return tg.calls("sendMessage") == 1; }), s.log_text());
    BOOST_TEST_REQUIRE(s.parked());
    auto pending = s.outbox(outbox_status::pending);
    BOOST_TEST_REQUIRE(pending.size() == 1u);
    // The outbox backoff alone would retry after 1 s; the Bot API asked for 2.
    BOOST_TEST(pending[0].next_attempt_at == s.clock->utc_ms() + 2000);
    s.clock->advance(1999ms);
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(tg.sent().empty());
    s.clock->advance(1ms);
    BOOST_TEST_REQUIRE(eventually([&] { return tg.sent().size() == 1; }), s.log_text());
    BOOST_TEST(tg.sent()[0].text == "echo: slow down");
    // A chat that blocked the bot: its send waits the overall gap (34 ms) after the last send,
    // then fails at once with Telegram's reason.
    tg.push_message(666, "are you there");
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("telegram:666") == 1; }));
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST((s.clock->next_deadline() == s.clock->now() + 34ms));
    s.clock->advance(34ms);
    BOOST_TEST_REQUIRE(eventually([&] { return s.outbox(outbox_status::failed).size() == 1; }));
    auto failed = s.outbox(outbox_status::failed)[0];
    BOOST_TEST(failed.session_id == "telegram:666");
    BOOST_TEST(failed.last_error.find("blocked") != std::string::npos, failed.last_error);
    BOOST_TEST(failed.attempts == 1);
    BOOST_TEST(tg.calls("sendMessage") == 3u); // 429, the retry, the 403: nothing more
    check_log_has_no_token(s);
}

BOOST_AUTO_TEST_SUITE_END()
