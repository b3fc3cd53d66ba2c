// The delivery rules without I/O: the retry budget and state transitions of an outbox item, and
// how a long reply is cut into chunks.
#include <baton/delivery.hpp>

#include "channels/webhook/channel.hpp"

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>

#include <boost/test/unit_test.hpp>

using namespace baton;
using namespace std::chrono_literals;

namespace {
outbox_item sending(std::int64_t attempts) {
    outbox_item o;
    o.key = "ob_x";
    o.status = outbox_status::sending;
    o.attempts = attempts;
    return o;
}

std::size_t code_points(std::string_view s) {
    std::size_t n = 0;
    for (unsigned char c : s)
        n += (c & 0xC0) != 0x80;
    return n;
}
} // namespace

BOOST_AUTO_TEST_SUITE(delivery_rules)

BOOST_AUTO_TEST_CASE(backoff_is_1_5_25_120_600_seconds_then_failed) {
    retry_policy p;
    const time_ms now = 1'000'000;
    const std::int64_t want[] = {1000, 5000, 25000, 120000, 600000};
    for (std::int64_t n = 1; n <= 5; ++n) {
        auto next = after_attempt(sending(n), send_outcome::again("HTTP 503"), now, p);
        BOOST_TEST((next.status == outbox_status::pending));
        BOOST_TEST(next.next_attempt_at - now == want[n - 1]);
        BOOST_TEST(next.last_error == "HTTP 503");
        BOOST_TEST(next.attempts == n);
    }
    auto last = after_attempt(sending(6), send_outcome::again("HTTP 503"), now, p);
    BOOST_TEST((last.status == outbox_status::failed));
    BOOST_TEST(last.next_attempt_at == 0);
    BOOST_TEST(last.last_error == "HTTP 503");
}

BOOST_AUTO_TEST_CASE(a_peer_hint_longer_than_the_backoff_wins) {
    retry_policy p;
    auto next = after_attempt(sending(1), send_outcome::again("HTTP 429", 30s), 0, p);
    BOOST_TEST(next.next_attempt_at == 30000);
    next = after_attempt(sending(3), send_outcome::again("HTTP 429", 2s), 0, p);
    BOOST_TEST(next.next_attempt_at == 25000);
}

BOOST_AUTO_TEST_CASE(delivered_and_failed_are_final) {
    retry_policy p;
    auto item = sending(2);
    item.last_error = "HTTP 503";
    auto ok = after_attempt(item, send_outcome::ok(), 5, p);
    BOOST_TEST((ok.status == outbox_status::delivered));
    BOOST_TEST(ok.last_error.empty());
    BOOST_TEST(ok.updated_at == 5);
    auto no = after_attempt(sending(1), send_outcome::give_up("HTTP 404"), 5, p);
    BOOST_TEST((no.status == outbox_status::failed));
    BOOST_TEST(no.last_error == "HTTP 404");
}

BOOST_AUTO_TEST_CASE(an_uncertain_item_stays_uncertain) {
    auto item = sending(1);
    item.uncertain = true;
    BOOST_TEST(after_attempt(item, send_outcome::ok(), 0, retry_policy{}).uncertain);
}

BOOST_AUTO_TEST_CASE(an_unanswered_attempt_makes_the_retry_uncertain) {
    auto refused =
        after_attempt(sending(1), send_outcome::again("Connection refused"), 0, retry_policy{});
    BOOST_TEST(!refused.uncertain);
    auto timeout = after_attempt(sending(1), send_outcome::unanswered("timed out"), 0, retry_policy{});
    BOOST_TEST(timeout.uncertain);
    BOOST_TEST((timeout.status == outbox_status::pending));
}

BOOST_AUTO_TEST_CASE(short_text_is_one_chunk) {
    BOOST_TEST(split_chunks("hello", 4096) == std::vector<std::string>{"hello"});
    BOOST_TEST(split_chunks("hello", 0) == std::vector<std::string>{"hello"});
    BOOST_TEST(split_chunks("", 10) == std::vector<std::string>{""});
    BOOST_TEST(split_chunks("abcdef", 6) == std::vector<std::string>{"abcdef"});
}

BOOST_AUTO_TEST_CASE(long_text_is_cut_at_a_line_break_then_a_space) {
    // 10 per chunk: the last quarter is characters 8-10.
    BOOST_TEST(split_chunks("aaaaaaaa\nbbbbbbb", 10) ==
               (std::vector<std::string>{"aaaaaaaa\n", "bbbbbbb"}));
    BOOST_TEST(split_chunks("aaaaaaaaa bbbbbbb", 10) ==
               (std::vector<std::string>{"aaaaaaaaa ", "bbbbbbb"}));
    // A break too early would waste the chunk: cut hard instead.
    BOOST_TEST(split_chunks("a bbbbbbbbbbbb", 10) == (std::vector<std::string>{"a bbbbbbbb", "bbbb"}));
}

BOOST_AUTO_TEST_CASE(chunks_never_split_a_utf8_sequence_and_rejoin_to_the_text) {
    std::string text;
    for (int i = 0; i < 5000; ++i)
        text += (i % 3 == 0) ? "\xc3\xa9" : (i % 3 == 1 ? "\xf0\x9f\x98\x80" : "x");
    // Counted as Telegram counts, in UTF-16 units: 6,667 here.
    auto utf16_units = [](std::string_view c) {
        std::size_t n = 0;
        for (unsigned char b : c)
            n += (b & 0xC0) != 0x80 ? (b >= 0xF0 ? 2 : 1) : 0;
        return n;
    };
    auto chunks = split_chunks(text, 4096);
    BOOST_TEST(chunks.size() == 2u);
    std::string joined;
    for (const auto& c : chunks) {
        BOOST_TEST(utf16_units(c) <= 4096u);
        BOOST_TEST((static_cast<unsigned char>(c.front()) & 0xC0) != 0x80);
        joined += c;
    }
    BOOST_TEST(joined == text);
    BOOST_TEST(utf16_units(chunks[0]) >= 4095u); // full, but for an emoji that would not fit
    // 4,100 emoji are 8,200 units: three chunks, not two of 4,096 code points.
    std::string emoji;
    for (int i = 0; i < 4100; ++i)
        emoji += "\xf0\x9f\x98\x80";
    auto e = split_chunks(emoji, 4096);
    BOOST_TEST_REQUIRE(e.size() == 3u);
    BOOST_TEST(utf16_units(e[0]) == 4096u);
    BOOST_TEST(utf16_units(e[2]) == 8u);
}

BOOST_AUTO_TEST_CASE(keys_are_derived_per_chunk) {
    auto a = outbox_key("s1", "t_1", "webhook", "crm", 0);
    BOOST_TEST(a == outbox_key("s1", "t_1", "webhook", "crm", 0));
    BOOST_TEST(a != outbox_key("s1", "t_1", "webhook", "crm", 1));
    BOOST_TEST(a != outbox_key("s1", "t_1", "webhook", "erp", 0));
    BOOST_TEST(a != outbox_key("s1", "t_2", "webhook", "crm", 0));
}

BOOST_AUTO_TEST_CASE(webhook_answers_map_to_delivered_retry_or_failed) {
    using kind = send_outcome::kind;
    auto answer = [](unsigned status, std::string retry_after = "") {
        http_response r;
        r.status = status;
        if (!retry_after.empty()) r.headers.emplace_back("Retry-After", retry_after);
        return webhook::classify({}, r);
    };
    BOOST_TEST((answer(200).what == kind::delivered));
    BOOST_TEST((answer(204).what == kind::delivered));
    for (unsigned retried : {408u, 429u, 500u, 502u, 503u})
        BOOST_TEST((answer(retried).what == kind::retry), retried);
    for (unsigned refused : {301u, 400u, 401u, 404u, 422u})
        BOOST_TEST((answer(refused).what == kind::failed), refused);
    BOOST_TEST(answer(429, "30").retry_after.value_or(0ms).count() == 30000);
    BOOST_TEST(!answer(429, "soon").retry_after.has_value());
    BOOST_TEST(answer(404).error == "HTTP 404");

    http_response none;
    auto refused = webhook::classify(boost::asio::error::connection_refused, none);
    BOOST_TEST((refused.what == kind::retry));
    BOOST_TEST(!refused.maybe_delivered);
    auto timeout = webhook::classify(boost::beast::error::timeout, none);
    BOOST_TEST((timeout.what == kind::retry));
    BOOST_TEST(timeout.maybe_delivered);
    BOOST_TEST(webhook::classify(boost::asio::error::eof, none).maybe_delivered);
}

BOOST_AUTO_TEST_CASE(a_webhook_body_carries_the_key_and_the_text) {
    outbox_item o;
    o.key = "ob_1";
    o.session_id = "s1";
    o.turn_id = "t_1";
    o.recipient = "crm";
    o.text = "hi \"there\"";
    o.attempts = 2;
    o.uncertain = true;
    o.created_at = 1'700'000'000'000;
    auto body = boost::json::parse(webhook::request_body(o)).as_object();
    BOOST_TEST(body.at("key").as_string() == "ob_1");
    BOOST_TEST(body.at("target").as_string() == "crm");
    BOOST_TEST(body.at("text").as_string() == "hi \"there\"");
    BOOST_TEST(body.at("attempt").as_int64() == 2);
    BOOST_TEST(body.at("uncertain").as_bool());
    BOOST_TEST(body.at("created_at").as_string() == "2023-11-14T22:13:20.000Z");
}

BOOST_AUTO_TEST_SUITE_END()
