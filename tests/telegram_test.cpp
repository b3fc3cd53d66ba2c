// The Telegram channel without a daemon: the Bot API answers and what they mean, the debounce and
// its held updates (no I/O), and sendMessage against the fake Bot API server (pacing on a manual
// clock, 429 with retry_after, 403, 5xx, a server that is down).
#include "channels/telegram/bot_api.hpp"
#include "channels/telegram/channel.hpp"
#include "channels/telegram/inbox.hpp"
#include "tests/fake_telegram.hpp"
#include "tests/test_util.hpp"

#include <baton/clock.hpp>

#include <baton/command.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <boost/test/unit_test.hpp>

using namespace baton;
using namespace baton::test;
using namespace baton::telegram;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string token = "123456:secret-token";

std::string updates_body(const std::string& result) {
    return R"({"ok": true, "result": )" + result + "}";
}

update text_update(std::int64_t id, std::string chat, std::string text) {
    update u;
    u.update_id = id;
    u.chat_id = std::move(chat);
    u.message_id = id * 10;
    u.text = std::move(text);
    return u;
}

std::vector<std::string> texts(const std::vector<ready_message>& ms) {
    std::vector<std::string> out;
    for (const auto& m : ms)
        out.push_back(m.chat_id + ":" + m.text());
    return out;
}

outbox_item item_for(std::string chat, std::string text) {
    outbox_item o;
    o.key = "ob_test";
    o.channel = "telegram";
    o.recipient = std::move(chat);
    o.text = std::move(text);
    return o;
}

options sender_options(const fake_telegram& f) {
    options o;
    o.api_base = f.api_base();
    o.token = token;
    o.send_interval = std::chrono::milliseconds(0);
    o.send_timeout = std::chrono::milliseconds(3000);
    return o;
}

} // namespace

BOOST_AUTO_TEST_SUITE(telegram_channel)

// In groups a command is addressed to a bot ("/stop@my_bot"): this bot's is the command without
// the name, another bot's is not this one's; without the bot's name (getMe failed) any is taken.
BOOST_AUTO_TEST_CASE(a_command_addressed_to_the_bot_is_the_command) {
    BOOST_TEST(addressed_text("/stop@my_bot", "my_bot").value_or("?") == "/stop");
    BOOST_TEST(addressed_text("  /handoff@My_Bot phase two", "my_bot").value_or("?") ==
               "  /handoff phase two");
    BOOST_TEST(is_stop_command(*addressed_text("/stop@my_bot", "my_bot")));
    BOOST_TEST(!addressed_text("/stop@other_bot", "my_bot"));
    BOOST_TEST(addressed_text("/stop@other_bot", "").value_or("?") == "/stop");
    BOOST_TEST(addressed_text("mail me@example.org", "my_bot").value_or("?") == "mail me@example.org");
    BOOST_TEST(addressed_text("/@odd", "my_bot").value_or("?") == "/@odd");
    BOOST_TEST(parse_get_me(200, R"({"ok":true,"result":{"id":1,"is_bot":true,"username":"my_bot"}})") ==
               "my_bot");
    BOOST_TEST(parse_get_me(404, R"({"ok":false})").empty());
    BOOST_TEST(parse_get_me(200, "not json").empty());
}

BOOST_AUTO_TEST_CASE(get_updates_answers) {
    auto r = parse_get_updates(200, updates_body(R"([
        {"update_id": 7, "message": {"message_id": 1, "chat": {"id": -1001}, "text": "hi",
                                     "from": {"id": 42, "username": "bob"}}},
        {"update_id": 8, "edited_message": {"message_id": 1, "chat": {"id": 5}, "text": "x"}},
        {"update_id": 9, "message": {"message_id": 2, "chat": {"id": 5}, "sticker": {}}}])"));
    BOOST_TEST((r.what == poll_result::kind::ok));
    BOOST_TEST(r.next_offset == 10); // updates without text still move the offset
    BOOST_REQUIRE_EQUAL(r.updates.size(), 1u);
    BOOST_TEST(r.updates[0].update_id == 7);
    BOOST_TEST(r.updates[0].chat_id == "-1001");
    BOOST_TEST(r.updates[0].text == "hi");
    BOOST_TEST(r.updates[0].from_id.value_or(0) == 42);
    BOOST_TEST(r.updates[0].from_username == "bob");
    BOOST_TEST(parse_get_updates(200, updates_body("[]")).next_offset == 0);

    auto limited = parse_get_updates(
        429, R"({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 3",
                 "parameters": {"retry_after": 3}})");
    BOOST_TEST((limited.what == poll_result::kind::retry));
    BOOST_TEST(limited.retry_after.value_or(std::chrono::seconds(0)).count() == 3);
    BOOST_TEST((parse_get_updates(401, R"({"ok": false, "description": "Unauthorized"})").what ==
                poll_result::kind::unauthorized));
    BOOST_TEST((parse_get_updates(404, "").what == poll_result::kind::unauthorized));
    BOOST_TEST((parse_get_updates(502, "<html>").what == poll_result::kind::retry));
    BOOST_TEST((parse_get_updates(200, R"({"ok": false, "description": "x"})").what ==
                poll_result::kind::retry));
    BOOST_TEST((parse_get_updates(200, "not json").what == poll_result::kind::retry));
}

BOOST_AUTO_TEST_CASE(send_message_answers) {
    BOOST_TEST((parse_send_message(200, R"({"ok": true, "result": {}})").what ==
                send_outcome::kind::delivered));
    auto limited = parse_send_message(429, R"({"ok": false, "error_code": 429,
        "description": "Too Many Requests: retry after 2", "parameters": {"retry_after": 2}})");
    BOOST_TEST((limited.what == send_outcome::kind::retry));
    BOOST_TEST(limited.retry_after.value_or(std::chrono::milliseconds(0)).count() == 2000);
    BOOST_TEST((parse_send_message(500, "").what == send_outcome::kind::retry));
    BOOST_TEST((parse_send_message(200, R"({"ok": false})").what == send_outcome::kind::retry));
    auto blocked = parse_send_message(
        403, R"({"ok": false, "description": "Forbidden: bot was blocked by the user"})");
    BOOST_TEST((blocked.what == send_outcome::kind::failed));
    BOOST_TEST(blocked.error.find("bot was blocked by the user") != std::string::npos);
    BOOST_TEST((
        parse_send_message(400, R"({"ok": false, "description": "Bad Request: chat not found"})").what ==
        send_outcome::kind::failed));
}

// Found by tests/fuzz/fuzz_telegram: a huge retry_after overflowed when turned into
// milliseconds, and update_id INT64_MAX overflowed the next offset.
BOOST_AUTO_TEST_CASE(answers_a_real_server_never_sends) {
    auto huge =
        R"({"ok": false, "error_code": 429, "parameters": {"retry_after": 2233720368547758084}})";
    BOOST_TEST(parse_get_updates(429, huge).retry_after.value_or(std::chrono::seconds(0)).count() ==
               86400);
    BOOST_TEST(
        parse_send_message(429, huge).retry_after.value_or(std::chrono::milliseconds(0)).count() ==
        86400000);
    auto r = parse_get_updates(200, updates_body(R"([
        {"update_id": 9223372036854775807, "message": {"chat": {"id": 5}, "text": "a"}},
        {"update_id": -3, "message": {"chat": {"id": 5}, "text": "b"}},
        {"update_id": 4, "message": {"chat": {"id": 5}, "text": "c"}}])"));
    BOOST_TEST((r.what == poll_result::kind::ok));
    BOOST_REQUIRE_EQUAL(r.updates.size(), 1u);
    BOOST_TEST(r.updates[0].text == "c");
    BOOST_TEST(r.next_offset == 5);
}

BOOST_AUTO_TEST_CASE(request_shapes) {
    BOOST_TEST(method_url("http://x/", "1:t", "getUpdates") == "http://x/bot1:t/getUpdates");
    BOOST_TEST(bot_id("123456:abc") == "123456");
    BOOST_TEST(bot_id("abc") == "");
    BOOST_TEST(send_message_body("-1001", "hi") == R"({"chat_id":-1001,"text":"hi"})");
    BOOST_TEST(send_message_body("@chan", "hi") == R"({"chat_id":"@chan","text":"hi"})");
    auto body = json::parse(get_updates_body(12, 25)).as_object();
    BOOST_TEST(body.at("offset").as_int64() == 12);
    BOOST_TEST(body.at("timeout").as_int64() == 25);
    BOOST_TEST(json::serialize(body.at("allowed_updates")) == R"(["message"])");
    BOOST_TEST(is_chat_id("42"));
    BOOST_TEST(is_chat_id("-1001234567890"));
    BOOST_TEST(!is_chat_id(""));
    BOOST_TEST(!is_chat_id("-"));
    BOOST_TEST(!is_chat_id("4 2"));
    BOOST_TEST(!is_chat_id("99999999999999999999"));
    auto u = text_update(5, "-7", "t");
    u.from_id = 9;
    auto back = update_from_json(to_json(u));
    BOOST_REQUIRE(back.has_value());
    BOOST_TEST(back->update_id == 5);
    BOOST_TEST(back->chat_id == "-7");
    BOOST_TEST(back->from_id.value_or(0) == 9);
}

BOOST_AUTO_TEST_CASE(no_debounce_passes_every_update) {
    inbox box(std::chrono::milliseconds(0));
    auto t = clock_type::now();
    BOOST_TEST((texts(box.add(text_update(1, "5", "a"), t)) == std::vector<std::string>{"5:a"}));
    BOOST_TEST((texts(box.add(text_update(2, "5", "b"), t)) == std::vector<std::string>{"5:b"}));
    BOOST_TEST(box.empty());
    BOOST_TEST(!box.next_deadline());
}

BOOST_AUTO_TEST_CASE(debounce_joins_a_chat_and_a_command_bypasses_it) {
    using std::chrono::milliseconds;
    inbox box(milliseconds(100));
    auto t = clock_type::now();
    BOOST_TEST(box.add(text_update(1, "5", "a"), t).empty());
    BOOST_TEST(box.add(text_update(2, "6", "x"), t + milliseconds(10)).empty());
    BOOST_TEST(box.add(text_update(3, "5", "b"), t + milliseconds(50)).empty());
    // Held updates, oldest first: what the poller stores with its offset.
    std::vector<std::int64_t> held;
    for (const auto& u : box.buffered())
        held.push_back(u.update_id);
    BOOST_TEST((held == std::vector<std::int64_t>{1, 2, 3}));
    BOOST_TEST((box.next_deadline() == t + milliseconds(110)));
    BOOST_TEST(box.due(t + milliseconds(109)).empty());
    BOOST_TEST((texts(box.due(t + milliseconds(110))) == std::vector<std::string>{"6:x"}));
    // Another message moves chat 5's deadline; a command flushes it, then goes alone.
    BOOST_TEST(box.add(text_update(4, "5", "c"), t + milliseconds(140)).empty());
    BOOST_TEST((texts(box.add(text_update(5, "5", "/stop"), t + milliseconds(150))) ==
                std::vector<std::string>{"5:a\nb\nc", "5:/stop"}));
    BOOST_TEST(box.empty());
    // A command with nothing held goes at once.
    BOOST_TEST((texts(box.add(text_update(6, "6", "/help"), t)) == std::vector<std::string>{"6:/help"}));
}

BOOST_AUTO_TEST_CASE(debounce_is_capped_for_a_chat_that_never_pauses) {
    using std::chrono::milliseconds;
    inbox box(milliseconds(100));
    auto t = clock_type::now();
    for (int i = 0; i < 10; ++i)
        box.add(text_update(i + 1, "5", std::to_string(i)), t + milliseconds(60 * i));
    // Messages 60 ms apart keep the window open, but not beyond 5 x debounce after the first.
    BOOST_TEST((box.next_deadline() == t + milliseconds(500)));
    auto out = box.due(t + milliseconds(500));
    BOOST_REQUIRE_EQUAL(out.size(), 1u);
    BOOST_TEST(out[0].parts.size() == 10u);
}

BOOST_AUTO_TEST_CASE(held_updates_regroup_per_chat_after_a_restart) {
    auto groups =
        inbox::group({text_update(3, "5", "b"), text_update(2, "6", "x"), text_update(1, "5", "a")});
    BOOST_TEST((texts(groups) == std::vector<std::string>{"5:a\nb", "6:x"}));
}

BOOST_FIXTURE_TEST_CASE(send_posts_send_message_and_reads_the_answer, io_fixture) {
    fake_telegram fake(token);
    fake.block_chat(666);
    {
        auto http = std::make_shared<http_client>(ctx.get_executor());
        auto s = make_sender(http, sender_options(fake));
        BOOST_TEST(s->name() == "telegram");
        BOOST_TEST(s->max_chunk_chars() == 4096u);
        BOOST_TEST(s->ordered());
        BOOST_TEST(!s->check_recipient("42"));
        BOOST_TEST(s->check_recipient("bob").has_value());

        auto ok = run_bounded(ctx, s->send(item_for("42", "hello")));
        BOOST_TEST((ok.what == send_outcome::kind::delivered));
        BOOST_REQUIRE_EQUAL(fake.sent().size(), 1u);
        BOOST_TEST(fake.sent()[0].chat_id == "42");
        BOOST_TEST(fake.sent()[0].text == "hello");

        fake.fail_next("sendMessage", 1, 429, "Too Many Requests: retry after 2", 2);
        auto limited = run_bounded(ctx, s->send(item_for("42", "again")));
        BOOST_TEST((limited.what == send_outcome::kind::retry));
        BOOST_TEST(limited.retry_after.value_or(std::chrono::milliseconds(0)).count() == 2000);

        fake.fail_next("sendMessage", 1, 500, "Internal Server Error");
        BOOST_TEST((run_bounded(ctx, s->send(item_for("42", "x"))).what == send_outcome::kind::retry));

        auto blocked = run_bounded(ctx, s->send(item_for("666", "x")));
        BOOST_TEST((blocked.what == send_outcome::kind::failed));
        BOOST_TEST(blocked.error.find("blocked") != std::string::npos);
        BOOST_TEST(blocked.error.find(token) == std::string::npos);
        BOOST_TEST(fake.sent().size() == 1u);

        // A wrong token: the Bot API answers 401, and retrying cannot help.
        auto wrong = sender_options(fake);
        wrong.token = "123456:wrong";
        auto bad = run_bounded(ctx, make_sender(http, wrong)->send(item_for("42", "x")));
        BOOST_TEST((bad.what == send_outcome::kind::failed));
        BOOST_TEST(bad.error.find("wrong") == std::string::npos);
    }
}

BOOST_FIXTURE_TEST_CASE(allow_chats_limits_recipients, io_fixture) {
    auto http = std::make_shared<http_client>(ctx.get_executor());
    options o;
    o.token = token;
    o.allow_chats = {"42", "-100"};
    auto s = make_sender(http, o);
    BOOST_TEST(!s->check_recipient("42"));
    BOOST_TEST(!s->check_recipient("-100"));
    BOOST_TEST(s->check_recipient("43").value_or("").find("allow_chats") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(sends_to_one_chat_are_paced, io_fixture) {
    using std::chrono::milliseconds;
    fake_telegram fake(token);
    {
        auto http = std::make_shared<http_client>(ctx.get_executor());
        auto c = std::make_shared<manual_clock>();
        auto o = sender_options(fake);
        o.send_interval = milliseconds(300);
        o.clock = c;
        auto s = make_sender(http, o);
        auto three = [](std::shared_ptr<outbound_channel> s) -> asio::awaitable<void> {
            co_await s->send(item_for("1", "a"));
            co_await s->send(item_for("2", "b")); // another chat: only the overall gap
            co_await s->send(item_for("1", "c"));
        };
        const auto t0 = c->now();
        bool done = false;
        asio::co_spawn(ctx, three(s), [&](std::exception_ptr e) {
            BOOST_TEST(!e);
            done = true;
        });
        // The first goes at once; the second waits the overall gap (34 ms) after it.
        BOOST_TEST_REQUIRE(run_until(ctx, [&] { return fake.sent().size() == 1 && c->waiting() == 1; }));
        BOOST_TEST((c->next_deadline() == t0 + milliseconds(34)));
        c->advance(milliseconds(33));
        BOOST_TEST(run_until(ctx, [&] { return c->waiting() == 1; }));
        BOOST_TEST(fake.sent().size() == 1u);
        c->advance(milliseconds(1));
        // The third, to the first chat again, waits its interval (300 ms) after that chat's send.
        BOOST_TEST_REQUIRE(run_until(ctx, [&] { return fake.sent().size() == 2 && c->waiting() == 1; }));
        BOOST_TEST((c->next_deadline() == t0 + milliseconds(300)));
        c->advance_to(t0 + milliseconds(299));
        BOOST_TEST(run_until(ctx, [&] { return c->waiting() == 1; }));
        BOOST_TEST(fake.sent().size() == 2u);
        c->advance(milliseconds(1));
        BOOST_TEST_REQUIRE(run_until(ctx, [&] { return done; }));
        auto sent = fake.sent();
        BOOST_REQUIRE_EQUAL(sent.size(), 3u);
        BOOST_TEST(sent[0].chat_id == "1");
        BOOST_TEST(sent[1].chat_id == "2");
        BOOST_TEST(sent[2].text == "c");
    }
}

BOOST_FIXTURE_TEST_CASE(a_server_that_is_down_means_try_again, io_fixture) {
    unsigned short port = 0;
    {
        fake_telegram gone(token);
        port = gone.port();
    }
    auto http = std::make_shared<http_client>(ctx.get_executor());
    options o;
    o.api_base = "http://127.0.0.1:" + std::to_string(port);
    o.token = token;
    o.send_timeout = std::chrono::milliseconds(2000);
    auto r = run_bounded(ctx, make_sender(http, o)->send(item_for("42", "x")));
    BOOST_TEST((r.what == send_outcome::kind::retry));
    BOOST_TEST(r.error.find(token) == std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
