// The streaming client's protocol logic without sockets: SSE framing at every chunk boundary, and
// chat.completion.chunk assembly into the same chat_completion a non-streaming response gives.
#include "src/model/chat_delta.hpp"
#include "src/model/sse.hpp"

#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

// Qualified as baton::sse_parser below: the suite of the same name is a namespace.
using namespace baton;
using namespace std::string_literals;
namespace json = boost::json;

namespace {

std::vector<sse_event> feed_all(baton::sse_parser& p, std::initializer_list<std::string_view> chunks) {
    std::vector<sse_event> out;
    for (auto c : chunks)
        for (auto& e : p.feed(c))
            out.push_back(std::move(e));
    return out;
}

std::vector<std::string> datas(const std::vector<sse_event>& events) {
    std::vector<std::string> out;
    for (auto& e : events)
        out.push_back(e.data);
    return out;
}

using strings = std::vector<std::string>;

// A hand-recorded gpt-4o stream with include_usage: role chunk, text with "é" (raw and escaped)
// and an emoji, two tool calls whose fragments interleave and split mid-string, the finish
// chunk, the usage chunk with empty choices, a heartbeat comment, then [DONE].
std::string recorded_stream(std::string_view eol) {
    const std::string head =
        R"({"id":"chatcmpl-A1b2","object":"chat.completion.chunk","created":1718000000,)"
        R"("model":"gpt-4o-2024-08-06","system_fingerprint":"fp_3aa7262c27","choices":[)";
    const std::string tail = R"(],"usage":null})";
    auto choice = [&](std::string delta, std::string finish = "null") {
        return head + R"({"index":0,"delta":)" + delta + R"(,"logprobs":null,"finish_reason":)" +
               finish + "}" + tail;
    };
    auto tool = [&](std::string fragments) { return choice(R"({"tool_calls":[)" + fragments + "]}"); };
    strings lines = {
        "data: " + choice(R"({"role":"assistant","content":"","refusal":null})"),
        "data: " + choice(R"({"content":"Bonjour"})"),
        "data: " + choice(R"({"content":" caf)"
                          "\xC3\xA9"
                          R"( \u00e9t\u00e9 "})"),
        ": keep-alive",
        "data: " + choice(R"({"content":"\ud83c\udf89 )"
                          "\xF0\x9F\x8E\x89"
                          R"("})"),
        "data: " + tool(R"({"index":0,"id":"call_W1","type":"function",)"
                        R"("function":{"name":"get_weather","arguments":""}})"),
        "data: " + tool(R"({"index":0,"function":{"arguments":"{\"city\": \"Par"}})"),
        "data: " + tool(R"({"index":1,"id":"call_T2","type":"function",)"
                        R"("function":{"name":"get_time","arguments":"{\"tz\""}})"),
        "data: " + tool(R"({"index":0,"function":{"arguments":"is \u00cele\"}"}})"),
        "data: " + tool(R"({"index":1,"id":"call_T2","function":{"arguments":": \"Europe/Paris\"}"}})"),
        "data: " + choice("{}", R"("tool_calls")"),
        "data: " + head + R"(],"usage":{"prompt_tokens":82,"completion_tokens":41,"total_tokens":123}})",
        "data: [DONE]",
    };
    std::string s;
    for (auto& l : lines)
        s += l + std::string(eol) + (l.starts_with(':') ? "" : std::string(eol));
    return s;
}

struct stream_outcome {
    chat_completion completion;
    strings deltas;
    std::size_t comments = 0;
    bool done = false;
    std::string error;
    bool operator==(const stream_outcome&) const = default;
};

// What the streaming client will do: SSE events -> [DONE] check -> JSON -> assembler.
struct stream_driver {
    baton::sse_parser parser;
    chat_stream_assembler assembler;
    stream_outcome out;

    void feed(std::string_view bytes) {
        for (auto& ev : parser.feed(bytes)) {
            if (out.done) out.error = "event after [DONE]";
            if (ev.data == "[DONE]") {
                out.done = true;
                continue;
            }
            boost::system::error_code ec;
            auto v = json::parse(ev.data, ec);
            if (ec || !v.is_object()) {
                out.error = "bad JSON: " + ev.data;
                continue;
            }
            std::string err;
            auto delta = assembler.add(v.as_object(), err);
            if (!err.empty()) out.error = err;
            if (!delta.text.empty()) out.deltas.push_back(delta.text);
        }
    }
    stream_outcome finish() {
        out.completion = assembler.result();
        out.comments = parser.comments();
        BOOST_TEST(!parser.has_partial());
        return out;
    }
};

stream_outcome run_split(std::string_view s, std::vector<std::size_t> cuts) {
    stream_driver d;
    std::size_t from = 0;
    for (auto c : cuts) {
        d.feed(s.substr(from, c - from));
        from = c;
    }
    d.feed(s.substr(from));
    return d.finish();
}

json::object parse_object(std::string_view s) {
    return json::parse(s).as_object();
}

} // namespace

BOOST_AUTO_TEST_SUITE(sse_parser)

BOOST_AUTO_TEST_CASE(recorded_stream_assembles_identically_at_every_split) {
    for (std::string_view eol : {"\n", "\r\n", "\r"}) {
        BOOST_TEST_CONTEXT("eol " << (eol == "\n" ? "LF" : eol == "\r" ? "CR" : "CRLF")) {
            auto s = recorded_stream(eol);
            auto ref = run_split(s, {});
            BOOST_TEST(ref.error == "");
            BOOST_TEST(ref.done);
            BOOST_TEST(ref.comments == 1u);
            const auto& c = ref.completion;
            BOOST_TEST(c.id == "chatcmpl-A1b2");
            BOOST_TEST(c.model == "gpt-4o-2024-08-06");
            BOOST_TEST(c.text ==
                       "Bonjour caf\xC3\xA9 \xC3\xA9t\xC3\xA9 \xF0\x9F\x8E\x89 \xF0\x9F\x8E\x89");
            BOOST_TEST((ref.deltas == strings{"Bonjour", " caf\xC3\xA9 \xC3\xA9t\xC3\xA9 ",
                                              "\xF0\x9F\x8E\x89 \xF0\x9F\x8E\x89"}));
            BOOST_TEST(c.finish_reason == "tool_calls");
            BOOST_TEST(c.has_usage);
            BOOST_TEST(c.prompt_tokens == 82);
            BOOST_TEST(c.completion_tokens == 41);
            BOOST_TEST_REQUIRE(c.tool_calls.size() == 2u);
            BOOST_TEST(c.tool_calls[0].id == "call_W1");
            BOOST_TEST(c.tool_calls[0].name == "get_weather");
            BOOST_TEST(c.tool_calls[0].arguments == "{\"city\": \"Paris \xC3\x8Ele\"}");
            BOOST_TEST(c.tool_calls[1].id == "call_T2");
            BOOST_TEST(c.tool_calls[1].name == "get_time");
            BOOST_TEST(c.tool_calls[1].arguments == R"({"tz": "Europe/Paris"})");
            BOOST_TEST(json::parse(c.tool_calls[0].arguments).at("city").as_string() ==
                       "Paris \xC3\x8Ele");

            // One boundary at every byte position, including inside "\r\n" and inside UTF-8.
            std::size_t mismatches = 0;
            for (std::size_t i = 0; i <= s.size(); ++i)
                if (!(run_split(s, {i}) == ref) && ++mismatches == 1) BOOST_TEST_ERROR("split at " << i);
            BOOST_TEST(mismatches == 0u);

            std::vector<std::size_t> every_byte;
            for (std::size_t i = 1; i < s.size(); ++i)
                every_byte.push_back(i);
            BOOST_TEST((run_split(s, every_byte) == ref));

            std::mt19937 rng(42);
            for (int round = 0; round < 200; ++round) {
                std::vector<std::size_t> cuts;
                for (std::size_t at = rng() % 17; at < s.size(); at += 1 + rng() % 17)
                    cuts.push_back(at);
                if (!(run_split(s, cuts) == ref)) BOOST_TEST_ERROR("random round " << round);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(every_field_kind_survives_every_split) {
    const std::string s =
        "\xEF\xBB\xBF: hello\r\nretry: 1500\r\nevent: a\rid: 1\ndata: x\r\ndata:  y\r\n\r\n"
        "data\n\nevent: b\r\ndata: caf\xC3\xA9\r\r: ping\n"
        "data: \xF0\x9F\x8E\x89\r\ndata: 2\r\n\r\n";
    auto run = [&](std::size_t step, std::size_t cut) {
        baton::sse_parser p;
        std::vector<sse_event> out;
        auto take = [&](std::string_view c) {
            for (auto& e : p.feed(c))
                out.push_back(std::move(e));
        };
        if (step == 0) {
            take(std::string_view(s).substr(0, cut));
            take(std::string_view(s).substr(cut));
        } else {
            for (std::size_t i = 0; i < s.size(); i += step)
                take(std::string_view(s).substr(i, step));
        }
        BOOST_TEST(p.comments() == 2u);
        BOOST_TEST(!p.has_partial());
        return out;
    };
    const std::vector<sse_event> expected = {
        {"a", "x\n y", "1", 1500},
        {"message", "", "1", std::nullopt},
        {"b", "caf\xC3\xA9", "1", std::nullopt},
        {"message", "\xF0\x9F\x8E\x89\n2", "1", std::nullopt},
    };
    for (std::size_t cut = 0; cut <= s.size(); ++cut)
        BOOST_TEST_CONTEXT("split at " << cut) BOOST_TEST((run(0, cut) == expected));
    for (std::size_t step : {1, 2, 3, 5})
        BOOST_TEST_CONTEXT("chunks of " << step) BOOST_TEST((run(step, 0) == expected));
}

BOOST_AUTO_TEST_CASE(line_endings_mix_and_split_crlf) {
    baton::sse_parser p;
    auto ev = p.feed("data: a\r\ndata: b\rdata: c\n\n");
    BOOST_TEST((datas(ev) == strings{"a\nb\nc"}));

    // "\r" at the end of a chunk: the "\n" that follows belongs to it and is not a blank line.
    BOOST_TEST(p.feed("data: x\r").empty());
    BOOST_TEST(p.feed("\n").empty());
    BOOST_TEST((datas(p.feed("\n")) == strings{"x"}));

    // ...but "\r" then "\r" is two line ends, so the event is complete without waiting.
    BOOST_TEST(p.feed("data: y\r").empty());
    BOOST_TEST((datas(p.feed("\r")) == strings{"y"}));
    BOOST_TEST((datas(p.feed("\ndata: z\n\n")) == strings{"z"}));
    BOOST_TEST(!p.has_partial());
}

BOOST_AUTO_TEST_CASE(comments_are_counted_not_dispatched) {
    baton::sse_parser p;
    BOOST_TEST(p.feed(": ping\n\n:\n\n").empty());
    BOOST_TEST(p.comments() == 2u);
    auto ev = p.feed("data: a\n: inside an event\ndata: b\n\n");
    BOOST_TEST((datas(ev) == strings{"a\nb"}));
    BOOST_TEST(p.comments() == 3u);
}

BOOST_AUTO_TEST_CASE(field_parsing) {
    baton::sse_parser p;
    // One leading space is stripped, not two; no space is fine; no colon means an empty value.
    auto ev = p.feed("data:  two\n\ndata:x\n\ndata\n\ndata: a\ndata:\ndata: b\n\ndata: k: v\n\n");
    BOOST_TEST((datas(ev) == strings{" two", "x", "", "a\n\nb", "k: v"}));
    // Unknown fields are ignored; a field name is case-sensitive.
    ev = p.feed("foo: bar\nData: no\ndata: yes\n\n");
    BOOST_TEST((datas(ev) == strings{"yes"}));
}

BOOST_AUTO_TEST_CASE(event_type_and_blocks_without_data) {
    baton::sse_parser p;
    auto ev = p.feed("event: ping\ndata: 1\n\ndata: 2\n\n");
    BOOST_TEST_REQUIRE(ev.size() == 2u);
    BOOST_TEST(ev[0].event == "ping");
    BOOST_TEST(ev[1].event == "message");
    // A block with no data is not dispatched, and its event type does not leak into the next.
    ev = p.feed("event: lost\n\ndata: 3\n\n");
    BOOST_TEST_REQUIRE(ev.size() == 1u);
    BOOST_TEST(ev[0].event == "message");
    BOOST_TEST(ev[0].data == "3");
}

BOOST_AUTO_TEST_CASE(id_and_retry) {
    baton::sse_parser p;
    auto ev = p.feed("id: 7\nretry: 3000\ndata: a\n\ndata: b\n\n");
    BOOST_TEST_REQUIRE(ev.size() == 2u);
    BOOST_TEST(ev[0].id == "7");
    BOOST_TEST((ev[0].retry == std::optional<std::int64_t>(3000)));
    BOOST_TEST(ev[1].id == "7"); // the last event ID persists
    BOOST_TEST(!ev[1].retry.has_value());

    // Invalid retry values are ignored; a block without data still updates retry() and the ID.
    ev = p.feed(
        "retry: 12a\nretry: -5\nretry:\nretry: 99999999999999999999\ndata: c\n\nretry: 250\nid: 9\n\n");
    BOOST_TEST_REQUIRE(ev.size() == 1u);
    BOOST_TEST(!ev[0].retry.has_value());
    BOOST_TEST((p.retry() == std::optional<std::int64_t>(250)));
    BOOST_TEST(p.last_event_id() == "9");

    // An ID containing NUL is ignored; an empty one resets.
    ev = p.feed("id: a\0b\ndata: d\n\nid\ndata: e\n\n"s);
    BOOST_TEST_REQUIRE(ev.size() == 2u);
    BOOST_TEST(ev[0].id == "9");
    BOOST_TEST(ev[1].id == "");
}

BOOST_AUTO_TEST_CASE(leading_bom_dropped_once_even_split) {
    baton::sse_parser p;
    auto ev = feed_all(p, {"\xEF", "\xBB",
                           "\xBF"
                           "data: a\n\n\xEF\xBB\xBF"
                           "data: b\n\ndata: c\n\n"});
    // Only the stream's first BOM is dropped: later it is part of the field name "\uFEFFdata".
    BOOST_TEST((datas(ev) == strings{"a", "c"}));

    // A partial BOM is kept: here it makes the first field name unknown.
    baton::sse_parser q;
    ev = feed_all(q, {"\xEF\xBB", "data: y\n\ndata: z\n\n"});
    BOOST_TEST((datas(ev) == strings{"z"}));
}

BOOST_AUTO_TEST_CASE(unfinished_event_is_partial_not_dispatched) {
    baton::sse_parser p;
    BOOST_TEST(!p.has_partial());
    BOOST_TEST(p.feed("data: a\n").empty());
    BOOST_TEST(p.has_partial());
    BOOST_TEST(p.feed("\n").size() == 1u);
    BOOST_TEST(!p.has_partial());
    BOOST_TEST(p.feed("data: half").empty());
    BOOST_TEST(p.has_partial());
}

// At the end of a body, finish() hands over what EventSource would discard, so that the model
// client can accept a last "data: [DONE]" without its blank line.
BOOST_AUTO_TEST_CASE(finish_hands_over_the_unfinished_event) {
    for (std::string_view tail : {"data: [DONE]\n", "data: [DONE]", "data:[DONE]\r"}) {
        BOOST_TEST_CONTEXT(tail) {
            baton::sse_parser p;
            BOOST_TEST(p.feed("data: {}\n\n").size() == 1u);
            BOOST_TEST(p.feed(tail).empty());
            auto last = p.finish();
            BOOST_REQUIRE_EQUAL(last.size(), 1u);
            BOOST_TEST(last[0].data == "[DONE]");
            BOOST_TEST(!p.has_partial());
            BOOST_TEST(p.finish().empty());
        }
    }
    baton::sse_parser blank;
    blank.feed("data: x\n\n  ");
    BOOST_TEST(blank.finish().empty()); // a line of white space is no event
}

BOOST_AUTO_TEST_CASE(size_limit) {
    // A line of exactly the limit is accepted.
    baton::sse_parser ok(16);
    BOOST_TEST((datas(ok.feed("data: 0123456789\n\n")) == strings{"0123456789"}));
    BOOST_TEST(!ok.failed());

    // A line that never ends fails once it passes the limit, however it is chunked.
    baton::sse_parser p(16);
    BOOST_TEST(p.feed("data: 01234").empty());
    BOOST_TEST(!p.failed());
    BOOST_TEST(p.feed("56789AB").empty());
    BOOST_TEST(p.failed());
    BOOST_TEST(p.error() == "sse line exceeds 16 bytes");
    BOOST_TEST(p.feed("\n\ndata: x\n\n").empty()); // failure is final

    // Short lines that add up to a too-large event fail too; events completed first still return.
    baton::sse_parser q(16);
    auto ev = q.feed("data: first\n\ndata: 0123456789\ndata: 0123456789\n\ndata: never\n\n");
    BOOST_TEST((datas(ev) == strings{"first"}));
    BOOST_TEST(q.error() == "sse event exceeds 16 bytes");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(chat_delta)

BOOST_AUTO_TEST_CASE(malformed_chunks_reported_without_throwing_and_change_nothing) {
    chat_stream_assembler a;
    std::string err;
    a.add(parse_object(R"({"choices":[{"index":0,"delta":{"content":"ok","tool_calls":[)"
                       R"({"index":0,"id":"call_1","function":{"name":"f","arguments":"{"}}]}}]})"),
          err);
    BOOST_TEST(err == "");
    const auto before = a.result();

    struct bad_case {
        const char* chunk;
        const char* error;
    };
    const bad_case cases[] = {
        {R"({"choices":{}})", "choices: expected array"},
        {R"({"choices":[7]})", "choices[0]: expected object"},
        {R"({"choices":[{"index":"0","delta":{}}]})", "choices[0].index: expected integer"},
        {R"({"choices":[{"index":0,"delta":"x"}]})", "choices[0].delta: expected object"},
        {R"({"choices":[{"index":0,"delta":{"content":42}}]})",
         "choices[0].delta.content: expected string or array"},
        {R"({"choices":[{"index":0,"delta":{"content":[{"type":"text","text":7}]}}]})",
         "choices[0].delta.content[0].text: expected string"},
        {R"({"choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":{}}]}}]})",
         "choices[0].delta.content[0].thinking: expected string or array"},
        {R"({"choices":[{"index":0,"delta":{"reasoning_content":1}}]})",
         "choices[0].delta.reasoning_content: expected string"},
        {R"({"choices":[{"index":0,"delta":{"reasoning_details":{}}}]})",
         "choices[0].delta.reasoning_details: expected array"},
        {R"({"choices":[],"x_groq":{"usage":{"prompt_tokens":"many"}}})",
         "x_groq.usage.prompt_tokens: expected integer"},
        {R"({"choices":[{"index":0,"delta":{},"finish_reason":1}]})",
         "choices[0].finish_reason: expected string"},
        {R"({"choices":[{"index":0,"delta":{"tool_calls":{}}}]})",
         "choices[0].delta.tool_calls: expected array"},
        {R"({"choices":[{"index":0,"delta":{"content":"lost","tool_calls":[{"index":"0"}]}}]})",
         "choices[0].delta.tool_calls[0].index: expected integer"},
        {R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":-1}]}}]})",
         "choices[0].delta.tool_calls[0].index: expected integer >= 0"},
        {R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":[]}}]}}]})",
         "choices[0].delta.tool_calls[0].function.arguments: expected string"},
        {R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_2"}]}}]})",
         "tool call index 0: id changed mid-stream"},
        {R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"g"}}]}}]})",
         "tool call index 0: name changed mid-stream"},
        {R"({"choices":[],"usage":{"prompt_tokens":"many"}})", "usage.prompt_tokens: expected integer"},
        {R"({"model":5,"choices":[]})", "model: expected string"},
        {R"({"error":{"message":"Rate limit reached","type":"requests"}})", "error: Rate limit reached"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.chunk) {
            std::string delta;
            BOOST_CHECK_NO_THROW(delta = a.add(parse_object(c.chunk), err).text);
            BOOST_TEST(err == c.error);
            BOOST_TEST(delta == "");
            BOOST_TEST((a.result() == before));
        }
    }
    // A good chunk after a bad one clears the error and carries on.
    BOOST_TEST(a.add(parse_object(R"({"choices":[{"index":0,"delta":{"content":"!"}}]})"), err).text ==
               "!");
    BOOST_TEST(err == "");
    BOOST_TEST(a.result().text == "ok!");
}

BOOST_AUTO_TEST_CASE(out_of_order_indices_and_other_choices) {
    chat_stream_assembler a;
    std::string err;
    auto add = [&](std::string_view s) {
        auto d = a.add(parse_object(s), err);
        BOOST_TEST(err == "");
        return d.text;
    };
    // Index 2 before index 0, and both in one chunk; repeated id and name are harmless.
    add(R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"id":"c2","function":{"name":"b"}},)"
        R"({"index":0,"id":"c0","function":{"name":"a","arguments":"[1"}},)"
        R"({"index":0,"id":"c0","function":{"name":"a","arguments":",2]"}}]}}]})");
    // A second choice (n > 1) is not mixed into the first.
    BOOST_TEST(add(R"({"choices":[{"index":1,"delta":{"content":"other"}}]})") == "");
    // Nulls are "not sent"; a choice without "index" counts as choice 0.
    BOOST_TEST(add(R"({"id":null,"usage":null,"choices":[{"delta":{"content":"mine","tool_calls":null},)"
                   R"("finish_reason":null}]})") == "mine");
    auto c = a.take();
    BOOST_TEST(c.text == "mine");
    BOOST_TEST(c.finish_reason == "");
    BOOST_TEST(!c.has_usage);
    BOOST_TEST_REQUIRE(c.tool_calls.size() == 2u);
    BOOST_TEST((c.tool_calls[0] == chat_completion::tool_call{"c0", "a", "[1,2]"}));
    BOOST_TEST((c.tool_calls[1] == chat_completion::tool_call{"c2", "b", ""}));
    BOOST_TEST((a.result() == chat_completion{}));
}

// Mistral sends tool-call deltas without an index: a new id starts the next call, no id continues
// the last, a known id continues its own.
BOOST_AUTO_TEST_CASE(tool_calls_without_an_index_follow_their_ids) {
    chat_stream_assembler a;
    std::string err;
    auto add = [&](std::string_view s) {
        a.add(parse_object(s), err);
        BOOST_TEST(err == "", s);
    };
    add(R"({"choices":[{"delta":{"tool_calls":[{"id":"A1","function":{"name":"f","arguments":"{\"x\""}},)"
        R"({"id":"B2","function":{"name":"g","arguments":"[1"}}]}}]})");
    add(R"({"choices":[{"delta":{"tool_calls":[{"function":{"arguments":",2]"}}]}}]})");
    add(R"({"choices":[{"delta":{"tool_calls":[{"id":"A1","function":{"arguments":":1}"}}]}}]})");
    add(R"({"choices":[{"delta":{"tool_calls":[{"id":"C3","function":{"name":"h","arguments":"{}"}}]},)"
        R"("finish_reason":"tool_calls"}]})");
    auto c = a.take();
    BOOST_REQUIRE_EQUAL(c.tool_calls.size(), 3u);
    BOOST_TEST((c.tool_calls[0] == chat_completion::tool_call{"A1", "f", R"({"x":1})"}));
    BOOST_TEST((c.tool_calls[1] == chat_completion::tool_call{"B2", "g", "[1,2]"}));
    BOOST_TEST((c.tool_calls[2] == chat_completion::tool_call{"C3", "h", "{}"}));
    // Whole in one delta, as Mistral's tool calls usually come.
    add(R"({"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"id":"gS","function":)"
        R"({"name":"weather","arguments":"{}"}}]},"finish_reason":"tool_calls"}]})");
    BOOST_TEST(
        (a.take().tool_calls == std::vector<chat_completion::tool_call>{{"gS", "weather", "{}"}}));
}

// Magistral: content as an array of parts, streamed and whole; text parts are the reply,
// thinking parts reasoning (not sent back: no field), other parts neither.
BOOST_AUTO_TEST_CASE(content_parts_make_reply_and_reasoning) {
    chat_stream_assembler a;
    std::string err;
    auto d =
        a.add(parse_object(R"({"choices":[{"delta":{"content":[{"type":"thinking","thinking":)"
                           R"([{"type":"text","text":"two plus "},{"type":"text","text":"two"}]},)"
                           R"({"type":"text","text":"4"},{"type":"image_url","image_url":"x"}]}}]})"),
              err);
    BOOST_TEST(err == "");
    BOOST_TEST(d.text == "4");
    BOOST_TEST(d.reasoning == "two plus two");
    d = a.add(parse_object(R"({"choices":[{"delta":{"content":"!"},"finish_reason":"stop"}]})"), err);
    BOOST_TEST(d.text == "!");
    auto c = a.take();
    BOOST_TEST(c.text == "4!");
    BOOST_TEST(c.reasoning.text == "two plus two");
    BOOST_TEST(c.reasoning.field == "");
    auto whole = parse_chat_completion(
        parse_object(R"({"choices":[{"index":0,"message":{"role":"assistant","content":[)"
                     R"({"type":"thinking","thinking":"hm"},{"type":"text","text":"4!"}]},)"
                     R"("finish_reason":"stop"}]})"),
        err);
    BOOST_TEST(err == "");
    BOOST_TEST(whole.text == "4!");
    BOOST_TEST(whole.reasoning.text == "hm");
}

// Reasoning keeps the name it came under (it goes back under that name), and OpenRouter's
// reasoning_details are merged by index into what the provider needs back.
BOOST_AUTO_TEST_CASE(reasoning_is_kept_apart_with_its_field) {
    chat_stream_assembler a;
    std::string err;
    auto d = a.add(
        parse_object(R"({"choices":[{"delta":{"role":"assistant","reasoning_content":"Let me "}}]})"),
        err);
    BOOST_TEST(d.reasoning == "Let me ");
    BOOST_TEST(d.text == "");
    a.add(parse_object(R"({"choices":[{"delta":{"reasoning_content":"think.","content":null}}]})"), err);
    a.add(
        parse_object(
            R"({"choices":[{"delta":{"reasoning_content":null,"content":"Hi"},"finish_reason":"stop"}]})"),
        err);
    auto c = a.take();
    BOOST_TEST(err == "");
    BOOST_TEST(c.text == "Hi");
    BOOST_TEST(c.reasoning.text == "Let me think.");
    BOOST_TEST(c.reasoning.field == "reasoning_content");

    // OpenRouter: `reasoning` and reasoning_details side by side; the signature comes last.
    a.add(parse_object(
              R"({"choices":[{"delta":{"reasoning":"A","reasoning_details":[{"type":"reasoning.text",)"
              R"("text":"A","signature":"","index":0}]}}]})"),
          err);
    a.add(parse_object(
              R"({"choices":[{"delta":{"reasoning":"B","reasoning_details":[{"type":"reasoning.text",)"
              R"("text":"B","index":0}]}}]})"),
          err);
    a.add(parse_object(
              R"({"choices":[{"delta":{"reasoning_details":[{"type":"reasoning.text","signature":"s1",)"
              R"("index":0},{"type":"reasoning.encrypted","data":"xyz","index":1}]},)"
              R"("finish_reason":"stop"}]})"),
          err);
    BOOST_TEST(err == "");
    c = a.take();
    BOOST_TEST(c.reasoning.text == "AB");
    BOOST_TEST(c.reasoning.field == "reasoning");
    BOOST_TEST(json::serialize(c.reasoning.details) ==
               R"([{"type":"reasoning.text","text":"AB","signature":"s1","index":0},)"
               R"({"type":"reasoning.encrypted","data":"xyz","index":1}])");

    // Only reasoning_details, with a summary: its text is what there is to show; no field.
    d = a.add(parse_object(R"({"choices":[{"delta":{"reasoning_details":[{"type":"reasoning.summary",)"
                           R"("summary":"Planning","index":0}]}}]})"),
              err);
    BOOST_TEST(d.reasoning == "Planning");
    c = a.take();
    BOOST_TEST(c.reasoning.field == "");
    BOOST_TEST(c.reasoning.details.size() == 1u);
}

// Older Groq models report usage only under x_groq.
BOOST_AUTO_TEST_CASE(usage_under_x_groq) {
    chat_stream_assembler a;
    std::string err;
    a.add(parse_object(R"({"choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}],)"
                       R"("x_groq":{"id":"req_1","usage":{"prompt_tokens":21,"completion_tokens":9}}})"),
          err);
    auto c = a.take();
    BOOST_TEST(err == "");
    BOOST_TEST(c.has_usage);
    BOOST_TEST(c.prompt_tokens == 21);
    BOOST_TEST(c.completion_tokens == 9);
    // The usual field wins where both are sent.
    auto whole = parse_chat_completion(
        parse_object(
            R"({"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1,)"
            R"("completion_tokens":2},"x_groq":{"usage":{"prompt_tokens":7,"completion_tokens":8}}})"),
        err);
    BOOST_TEST(whole.prompt_tokens == 1);
    auto groq = parse_chat_completion(
        parse_object(R"({"choices":[{"message":{"content":"x"}}],"usage":null,)"
                     R"("x_groq":{"usage":{"prompt_tokens":7,"completion_tokens":8}}})"),
        err);
    BOOST_TEST(groq.completion_tokens == 8);
}

// An OpenAI refusal: its text is the reply, and the completion says it was one.
BOOST_AUTO_TEST_CASE(a_refusal_is_the_reply) {
    chat_stream_assembler a;
    std::string err;
    a.add(parse_object(R"({"choices":[{"delta":{"role":"assistant","content":null,"refusal":""}}]})"),
          err);
    auto d = a.add(parse_object(R"({"choices":[{"delta":{"refusal":"I can't "}}]})"), err);
    BOOST_TEST(d.text == "I can't ");
    a.add(parse_object(R"({"choices":[{"delta":{"refusal":"help."},"finish_reason":"stop"}]})"), err);
    auto c = a.take();
    BOOST_TEST(c.text == "I can't help.");
    BOOST_TEST(c.refusal);
    // An empty refusal (Snowflake sends one beside every delta) is none.
    a.add(parse_object(R"({"choices":[{"delta":{"content":"4","refusal":""}}]})"), err);
    BOOST_TEST(!a.take().refusal);
    auto whole = parse_chat_completion(
        parse_object(R"({"choices":[{"message":{"role":"assistant","content":null,"refusal":"No."},)"
                     R"("finish_reason":"stop"}]})"),
        err);
    BOOST_TEST(err == "");
    BOOST_TEST(whole.text == "No.");
    BOOST_TEST(whole.refusal);
}

BOOST_AUTO_TEST_CASE(non_streaming_with_text) {
    std::string err;
    auto c =
        parse_chat_completion(parse_object(R"({"id":"chatcmpl-9","object":"chat.completion",)"
                                           R"("model":"gpt-4o-mini","choices":[{"index":0,)"
                                           R"("message":{"role":"assistant","content":"Salut \u00e9",)"
                                           R"("refusal":null},"logprobs":null,"finish_reason":"stop"}],)"
                                           R"("usage":{"prompt_tokens":9,"completion_tokens":3,)"
                                           R"("total_tokens":12}})"),
                              err);
    BOOST_TEST(err == "");
    BOOST_TEST(c.id == "chatcmpl-9");
    BOOST_TEST(c.model == "gpt-4o-mini");
    BOOST_TEST(c.text == "Salut \xC3\xA9");
    BOOST_TEST(c.finish_reason == "stop");
    BOOST_TEST(c.tool_calls.empty());
    BOOST_TEST(c.has_usage);
    BOOST_TEST(c.prompt_tokens == 9);
    BOOST_TEST(c.completion_tokens == 3);
}

BOOST_AUTO_TEST_CASE(non_streaming_null_content_with_tool_calls_matches_stream) {
    std::string err;
    auto c = parse_chat_completion(
        parse_object(
            R"({"id":"chatcmpl-A1b2","model":"gpt-4o-2024-08-06","choices":[{"index":0,)"
            R"("message":{"role":"assistant","content":null,"tool_calls":[)"
            R"({"id":"call_W1","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\": \"Paris\"}"}},)"
            R"({"id":"call_T2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},)"
            R"("finish_reason":"tool_calls"}]})"),
        err);
    BOOST_TEST(err == "");
    BOOST_TEST(c.text == "");
    BOOST_TEST(!c.has_usage);

    // The same answer streamed assembles to the same struct.
    chat_stream_assembler a;
    for (auto s :
         {R"({"id":"chatcmpl-A1b2","model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":)"
          R"({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_W1",)"
          R"("type":"function","function":{"name":"get_weather","arguments":"{\"city\": "}}]}}]})",
          R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_T2",)"
          R"("type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]})",
          R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":)"
          R"({"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls"}]})"}) {
        a.add(parse_object(s), err);
        BOOST_TEST(err == "");
    }
    BOOST_TEST((a.result() == c));
}

BOOST_AUTO_TEST_CASE(non_streaming_malformed) {
    struct bad_case {
        const char* body;
        const char* error;
    };
    const bad_case cases[] = {
        {R"({"id":"x"})", "choices: no choice with index 0"},
        {R"({"choices":[]})", "choices: no choice with index 0"},
        {R"({"choices":[{"index":0}]})", "choices[0].message: missing"},
        {R"({"choices":[{"index":0,"message":{"content":["a"]}}]})",
         "choices[0].message.content[0]: expected object"},
        {R"({"choices":[{"index":0,"message":{"content":{}}}]})",
         "choices[0].message.content: expected string or array"},
        {R"({"choices":[{"index":0,"message":{"refusal":false}}]})",
         "choices[0].message.refusal: expected string"},
        {R"({"choices":[{"index":0,"message":{"tool_calls":[1]}}]})",
         "choices[0].message.tool_calls[0]: expected object"},
        {R"({"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","function":{"name":3}}]}}]})",
         "choices[0].message.tool_calls[0].function.name: expected string"},
        {R"({"choices":[{"index":0,"message":{}}],"usage":{"completion_tokens":1.5}})",
         "usage.completion_tokens: expected integer"},
        {R"({"error":{"message":"Invalid API key","code":"invalid_api_key"}})",
         "error: Invalid API key"},
        {R"({"error":"boom"})", "error: \"boom\""},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.body) {
            std::string err;
            chat_completion got;
            BOOST_CHECK_NO_THROW(got = parse_chat_completion(parse_object(c.body), err));
            BOOST_TEST(err == c.error);
            BOOST_TEST((got == chat_completion{}));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- add_text(): the direct reading of a common chunk against parse + add(). ----

namespace {

// Two assemblers fed the same chunks: one through add_text(), one through the JSON tree. After
// every chunk they must agree on the delta, the error and the result, whichever path add_text()
// took; `direct` counts the chunks add_common() read itself.
struct twin {
    chat_stream_assembler text, tree;
    std::size_t direct = 0, chunks = 0;

    void feed(std::string_view chunk) {
        ++chunks;
        {
            auto probe = text;
            chunk_delta d;
            std::string e;
            if (probe.add_common(chunk, d, e)) ++direct;
        }
        std::string text_error = "stale", tree_error = "stale";
        auto a = text.add_text(chunk, text_error);
        chunk_delta b;
        boost::system::error_code ec;
        auto v = json::parse(chunk, ec);
        if (ec || !v.is_object())
            tree_error = "a stream event is not a JSON object";
        else
            b = tree.add(v.get_object(), tree_error);
        BOOST_TEST(text_error == tree_error);
        BOOST_TEST(a.text == b.text);
        BOOST_TEST(a.reasoning == b.reasoning);
        BOOST_TEST((text.result() == tree.result()));
    }
};

std::vector<std::string> events_of(std::string_view stream) {
    baton::sse_parser p;
    std::vector<std::string> out;
    for (auto& ev : p.feed(stream))
        if (ev.data != "[DONE]") out.push_back(ev.data);
    for (auto& ev : p.finish())
        if (ev.data != "[DONE]") out.push_back(ev.data);
    return out;
}

// Every chunk again after a truncation, and with each byte replaced by each of `subs`, each
// from a copy of the same state: what the direct reading rejects must be rejected the same way.
void mutate(const twin& base, std::string_view chunk) {
    static const char subs[] = {'"', '\\', '}', ']', '{', '[', ',', ':', '0', '-', 'e', 'n', ' ', '\x01', '\xC3'};
    for (std::size_t n = 0; n < chunk.size(); ++n) {
        auto t = base;
        t.feed(chunk.substr(0, n));
        for (char c : subs) {
            std::string m(chunk);
            if (m[n] == c) continue;
            m[n] = c;
            auto u = base;
            BOOST_TEST_CONTEXT(m) { u.feed(m); }
        }
    }
}

} // namespace

BOOST_AUTO_TEST_SUITE(chat_delta_direct)

BOOST_AUTO_TEST_CASE(common_chunks_are_read_directly_and_the_rest_as_before) {
    const std::string head =
        R"({"id":"chatcmpl-9","object":"chat.completion.chunk","created":1718000000,"model":"m",)";
    struct crafted {
        std::string chunk;
        bool direct;
    };
    const crafted cases[] = {
        {head + R"("choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"finish_reason":null}]})", true},
        {head + R"("choices":[{"index":0,"delta":{"content":"a \"b\" \\ \/ \n\t\r\b\f"},"logprobs":null,"finish_reason":null}],"usage":null})", true},
        {head + R"("system_fingerprint":"fp","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", true},
        {head + R"("choices":[{"delta":{"content":"no index"}}]})", true},
        {head + R"("choices":[{"index":null,"delta":null,"finish_reason":""}]})", true},
        {R"( { "choices" : [ ] , "id" : null , "model" : null } )", true},
        {R"({"choices":null,"obfuscation":"x","x":[1,-2.5,0.25,true,false,null,{"a":[{}]},[]]})", true},
        {R"({"choices":[{"index":0,"delta":{"content":"x","tool_calls":null,"reasoning":null,"reasoning_content":null,"reasoning_details":null},"logprobs":{"content":[{"token":"x","logprob":-0.01,"bytes":[120]}]}}]})", true},
        {R"({})", true},
        {R"({"error":null,"x_groq":null,"choices":[]})", true},
        {head + R"("choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})", true},
        {R"({"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":null,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":12}}})", true},
        {R"({"choices":[],"usage":{"total_tokens":4}})", true},
        {R"({"choices":[],"usage":{}})", true},
        {R"({"choices":[],"usage":{"prompt_tokens":999999999999999999}})", true},
        // The slow path: what add() reads and the direct reading leaves to it.
        {R"({"choices":[],"usage":{"prompt_tokens":9999999999999999999}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":-1}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":3.0}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":3e2}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":"3"}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":03}})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":3,"prompt_tokens":4}})", false},
        {R"({"choices":[],"usage":[]})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":3},"usage":null})", false},
        {R"({"choices":[],"usage":{"prompt_tokens":3},"x_groq":{"usage":{"prompt_tokens":5}}})", false},
        {head + R"("choices":[{"index":0,"delta":{"content":"caf\u00e9"}}]})", false},
        {head + "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xC3\xA9\"}}]}", false},
        {head + R"("choices":[{"index":0,"delta":{"content":[{"type":"text","text":"parts"}]}}]})", false},
        {head + R"("choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}}]})", false},
        {head + R"("choices":[{"index":0,"delta":{"reasoning_content":"think"}}]})", false},
        {head + R"("choices":[{"index":0,"delta":{"refusal":"no"}}]})", false},
        {head + R"("choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"two"}}]})", false},
        {head + R"("choices":[{"index":1,"delta":{"content":"other"}}]})", false},
        {head + R"("choices":[{"index":0,"delta":{"content":"a","content":"b"}}]})", false},
        {R"({"id":"a","id":"b","choices":[]})", false},
        {R"({"created":1e3,"choices":[]})", false},
        {R"({"error":{"message":"overloaded"}})", false},
        {R"({"choices":[],"x_groq":{"usage":{"prompt_tokens":1,"completion_tokens":2}}})", false},
        {R"({"id":"a\"b","choices":[]})", false},
        {R"({"choices":[{"index":0,"delta":{"content":42}}]})", false},
        {R"({"choices":[{"index":"0","delta":{}}]})", false},
        {R"({"choices":[{"index":0,"delta":{},"finish_reason":1}]})", false},
        {R"({"model":5,"choices":[]})", false},
        {R"({"choices":[]} x)", false},
        {R"({"choices":[],})", false},
        {R"([1])", false},
        {R"("text")", false},
        {"", false},
        {R"({"a":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]})", false},
    };
    twin t;
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.chunk) {
            const auto before = t.direct;
            t.feed(c.chunk);
            BOOST_TEST((t.direct == before + 1) == c.direct);
        }
    }
}

BOOST_AUTO_TEST_CASE(recorded_chunks_and_their_mutations_agree) {
    twin t;
    const auto chunks = events_of(recorded_stream("\n"));
    for (const auto& c : chunks) {
        mutate(t, c);
        t.feed(c);
    }
    BOOST_TEST(t.direct == 4u); // role, "Bonjour", the finish and the usage: the others need the slow path
    BOOST_TEST(t.text.result().text == "Bonjour café été \xF0\x9F\x8E\x89 \xF0\x9F\x8E\x89");
}

// The scanner steps over plain string bytes eight at a time: each byte it must stop at (quote,
// backslash escapes, a control character, a non-ASCII byte, \u) at every offset of strings
// around that stride, in a value and in a key, agrees with the tree path.
BOOST_AUTO_TEST_CASE(special_bytes_at_every_offset_of_a_string_agree) {
    const std::vector<std::string> specials{"\\\"", "\\\\", "\\n", "\\/", "\\u0041", "\\x",
                                            "\t",   "\x01",  "\x7f", "\xC3\xA9", "\x80",  "\""};
    std::size_t direct_cases = 0, cases = 0;
    for (std::size_t len = 0; len <= 24; ++len) {
        for (std::size_t at = 0; at <= len; ++at) {
            for (const auto& sp : specials) {
                std::string text = std::string(at, 'a') + sp + std::string(len - at, 'b');
                twin t;
                t.feed(R"({"choices":[{"index":0,"delta":{"content":")" + text + R"("}}]})");
                t.feed(R"({"choices":[],")" + text + R"(":1})");
                direct_cases += t.direct;
                cases += 2;
            }
        }
    }
    // Plain escapes and DEL are read directly; \u, raw control bytes and UTF-8 are not.
    BOOST_TEST(direct_cases > 0u);
    BOOST_TEST(direct_cases < cases);
}

// Every chunk of every recorded provider stream (when $BATON_PROVIDER_STREAMS has them), each
// recording from a fresh pair of assemblers; the second chunk of each (the first text, as a rule)
// is mutated as above.
BOOST_AUTO_TEST_CASE(provider_recordings_agree) {
    const char* dir = std::getenv("BATON_PROVIDER_STREAMS");
    if (!dir || !*dir) return;
    std::ifstream mf(std::string(dir) + "/manifest.json");
    if (!mf) return;
    std::ostringstream ms;
    ms << mf.rdbuf();
    std::size_t recordings = 0, direct = 0, chunks = 0;
    const auto manifest = json::parse(ms.str());
    for (const auto& [name, entry] : manifest.as_object()) {
        if (entry.at("kind").as_string() != "stream") continue;
        std::ifstream in(std::string(dir) + "/" + std::string(entry.at("file").as_string()),
                         std::ios::binary);
        std::ostringstream s;
        s << in.rdbuf();
        BOOST_TEST_CONTEXT(name) {
            twin t;
            std::size_t n = 0;
            for (const auto& c : events_of(s.str())) {
                if (n++ == 1) mutate(t, c);
                t.feed(c);
            }
            direct += t.direct;
            chunks += t.chunks;
        }
        ++recordings;
    }
    BOOST_TEST_MESSAGE(recordings << " recordings, " << chunks << " chunks, " << direct << " read directly");
    BOOST_TEST(recordings > 0u);
    BOOST_TEST(direct > 0u);
}

BOOST_AUTO_TEST_SUITE_END()
