// Records' plain helpers: times as RFC 3339 UTC with milliseconds, checked against the C library;
// JSON written straight to text, checked against Boost.JSON's parser and serializer.
#include <baton/command.hpp>
#include <baton/json_text.hpp>
#include <baton/types.hpp>

#include <boost/json.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>

using namespace baton;

namespace {
std::string reference(time_ms t) {
    std::time_t secs = static_cast<std::time_t>(t / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(t % 1000));
    return buf;
}
} // namespace

BOOST_AUTO_TEST_SUITE(types)

BOOST_AUTO_TEST_CASE(format_time_matches_the_c_library) {
    BOOST_TEST(format_time(0) == "1970-01-01T00:00:00.000Z");
    BOOST_TEST(format_time(951'782'400'123) == "2000-02-29T00:00:00.123Z");   // a leap day
    BOOST_TEST(format_time(4'107'542'399'999) == "2100-02-28T23:59:59.999Z"); // 2100 is no leap year
    BOOST_TEST(format_time(4'107'542'400'000) == "2100-03-01T00:00:00.000Z");
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<time_ms> any(0, 253'402'300'799'999); // up to 9999-12-31
    for (int i = 0; i < 20000; ++i) {
        auto t = any(rng);
        BOOST_TEST_REQUIRE(format_time(t) == reference(t));
    }
}

BOOST_AUTO_TEST_CASE(outbox_keys_are_derived_and_distinct) {
    auto k = outbox_key("s1", "t_1", "ws", "s1", 0);
    BOOST_TEST(k == outbox_key("s1", "t_1", "ws", "s1", 0));
    BOOST_TEST(k.size() == 35u);
    BOOST_TEST(k.rfind("ob_", 0) == 0u);
    BOOST_TEST(k != outbox_key("s1", "t_1", "ws", "s1", 1));
    BOOST_TEST(k != outbox_key("s1", "t_2", "ws", "s1", 0));
    BOOST_TEST(k != outbox_key("s1", "t_1", "webhook", "s1", 0));
    // Parts are delimited: moving a character from one part to the next gives another key.
    BOOST_TEST(outbox_key("a:b", "c", "ws", "", 0) != outbox_key("a", "b:c", "ws", "", 0));
    BOOST_TEST(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

BOOST_AUTO_TEST_CASE(json_text_parses_back_to_the_same_value) {
    // Every byte that needs escaping, at every position of the 8-byte blocks the writer skips and
    // of the bytes it looks at one by one.
    std::string special = "\"\\\n\r\t";
    for (int c = 0; c < 0x20; ++c)
        special.push_back(static_cast<char>(c));
    for (char c : special) {
        for (std::size_t at = 0; at < 40; ++at) {
            std::string s(40, 'a');
            s[at] = c;
            s += "\xc3\xa9\xe2\x82\xac"; // UTF-8 passes through
            auto text = json_text(json::value(json::string(s)));
            BOOST_TEST_REQUIRE(json::parse(text) == json::value(json::string(s)));
        }
    }
    json::value v =
        json::parse(R"({"role":"user","text":"hello \"there\"\n","n":-42,"u":18446744073709551615,
        "d":1.5,"e":-0.0,"big":1e300,"t":true,"f":false,"z":null,"a":[1,[2,{"k":"v"}],[]],"o":{}})");
    BOOST_TEST(json::parse(json_text(v)) == v);
    BOOST_TEST(json::parse(json_text(v.get_object())) == v);
    BOOST_TEST(json_text(json::parse(R"({"a":[1,true,null],"b":"x"})")) ==
               R"({"a":[1,true,null],"b":"x"})");
    // Random texts of plain, escaped and multi-byte characters.
    std::mt19937 rng(7);
    const std::string alphabet = std::string("abc \"\\/\n\x01\x1f\x7f") + "\xc3\xa9";
    for (int i = 0; i < 2000; ++i) {
        std::string s;
        auto n = rng() % 80;
        for (std::size_t j = 0; j < n; ++j)
            s.push_back(alphabet[rng() % alphabet.size()]);
        json::value sv = json::string(s);
        BOOST_TEST_REQUIRE(json::parse(json_text(sv), {}, {.allow_invalid_utf8 = true}) == sv);
    }
}

// Numbers as events write them (stage.finished "ms"): the shortest text that reads back the same.
BOOST_AUTO_TEST_CASE(json_numbers_read_back_the_same) {
    auto text = [](double d) {
        std::string out;
        append_json_number(out, d);
        return out;
    };
    BOOST_TEST(text(0.012) == "0.012");
    BOOST_TEST(text(3) == "3");
    BOOST_TEST(text(1234.5) == "1234.5");
    BOOST_TEST(text(std::nan("")) == "null");
    BOOST_TEST(text(-std::numeric_limits<double>::infinity()) == "null");
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> ms(0, 1e6);
    for (int i = 0; i < 2000; ++i) {
        double d = std::round(ms(rng) * 1000) / 1000;
        auto v = json::parse(text(d));
        BOOST_TEST_REQUIRE(v.to_number<double>() == d, text(d));
    }
    for (double d : {1e300, -1e-300, 5e-324, 1.7976931348623157e308, -0.0})
        BOOST_TEST(json::parse(text(d)).to_number<double>() == d);
}

// The turn record's JSON (GET /v1/turns/{tid}) has exactly the fields and order of docs/api.md's
// "Turn record", whatever is set.
BOOST_AUTO_TEST_CASE(turn_json_is_the_turn_record_of_the_api) {
    auto expected = [](const turn_record& t) {
        auto when = [](const std::optional<time_ms>& ms) {
            return ms ? json::value(format_time(*ms)) : json::value(nullptr);
        };
        json::object o;
        o["turn_id"] = t.turn_id;
        o["session_id"] = t.session_id;
        o["agent"] = t.agent;
        o["status"] = to_string(t.status);
        o["reply"] = t.reply ? json::value(*t.reply) : json::value(nullptr);
        o["steps"] = t.steps;
        o["attempt"] = t.attempt;
        o["usage"] = {{"prompt_tokens", t.usage.prompt_tokens},
                      {"completion_tokens", t.usage.completion_tokens}};
        o["error"] = t.error ? json::value{{"code", t.error->code}, {"message", t.error->message}}
                             : json::value(nullptr);
        o["created_at"] = format_time(t.created_at);
        o["started_at"] = when(t.started_at);
        o["finished_at"] = when(t.finished_at);
        return o;
    };
    turn_record queued;
    queued.turn_id = "t_0123456789abcdef";
    queued.session_id = "s \"quoted\"\n";
    queued.created_at = 1764547200123;
    queued.input.text = "not part of the record";
    turn_record done = queued;
    done.agent = "support";
    done.status = turn_status::completed;
    done.reply = std::string("r\xc3\xa9ply \x01 with \\ and a long tail ") + std::string(300, 'x');
    done.steps = 3;
    done.attempt = 2;
    done.usage = {9223372036854775807LL, -1};
    done.started_at = 1764547200456;
    done.finished_at = 1764547201789;
    turn_record failed = done;
    failed.status = turn_status::failed;
    failed.reply.reset();
    failed.error = error_info{"model_error", "upstream said \"no\"\t(500)"};
    for (const auto* t : {&queued, &done, &failed}) {
        auto text = turn_json(*t);
        BOOST_TEST(text == json::serialize(expected(*t)));
        BOOST_TEST(json::parse(text) == json::value(expected(*t)));
        BOOST_TEST(to_json(*t) == expected(*t));
        std::string appended = "prefix";
        append_turn_json(appended, *t);
        BOOST_TEST(appended == "prefix" + text);
    }
}

// One parser for direct commands, used by the runtime (/stop) and the command stage alike.
BOOST_AUTO_TEST_CASE(direct_commands_are_parsed_one_way) {
    auto c = parse_command("  /handoff   release notes \r\n");
    BOOST_REQUIRE(c);
    BOOST_TEST(c->word == "/handoff");
    BOOST_TEST(c->arg == "release notes");
    c = parse_command("\t/stop");
    BOOST_REQUIRE(c);
    BOOST_TEST(c->word == "/stop");
    BOOST_TEST(c->arg == "");
    BOOST_TEST(!parse_command("stop /now"));
    BOOST_TEST(!parse_command(""));
    BOOST_TEST(!parse_command(" \n "));
    BOOST_TEST(is_stop_command("/stop now"));
    BOOST_TEST(is_stop_command("\n/stop\t"));
    BOOST_TEST(!is_stop_command("/stopped"));
    BOOST_TEST(!is_stop_command("please /stop"));
}

BOOST_AUTO_TEST_SUITE_END()
