// Suite openai_client: the OpenAI-compatible model client against a scripted fake server (text,
// streams cut anywhere, tool calls, retries and backoff, timeouts, drops, cancellation), the
// HTTP client underneath (keep-alive pool, stale connections, TLS verification), and the I/O-free
// backoff and Retry-After functions.
#include "tests/fake_openai.hpp"
#include "tests/test_util.hpp"

#include <baton/framework.hpp>
#include <baton/openai_client.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace baton;
using namespace baton::test;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

constexpr const char* key_env = "BATON_TEST_OPENAI_KEY";

long long ms_since(steady::time_point t0) {
    return std::chrono::duration_cast<milliseconds>(steady::now() - t0).count();
}

model_request user(std::string text) {
    model_request r;
    r.messages.push_back({"user", std::move(text), {}, {}});
    return r;
}

bool contains(std::string_view haystack, std::string_view needle) {
    return haystack.find(needle) != std::string_view::npos;
}

asio::awaitable<chat_completion> call(std::shared_ptr<model_client> m, model_request req,
                                      delta_handler on_delta) {
    co_return co_await m->complete(req, on_delta);
}

struct openai_fixture : io_fixture {
    fake_openai server;
    std::shared_ptr<http_client> http = std::make_shared<http_client>(ctx.get_executor());
    model_config cfg;
    openai_retry_policy retry{4, milliseconds(2), milliseconds(20)};
    std::vector<std::string> deltas;
    std::vector<std::string> reasoning_deltas;

    openai_fixture() {
        ::unsetenv(key_env);
        cfg.provider = "openai";
        cfg.base_url = server.base_url() + "/"; // the trailing slash must not double
        cfg.model = "gpt-test";
        cfg.api_key_env = key_env;
        cfg.stream = false;
        cfg.timeout = milliseconds(2000);
    }
    ~openai_fixture() { ::unsetenv(key_env); }

    chat_completion complete(model_request req = user("hi"), milliseconds limit = 5s) {
        auto m = make_openai_model(ctx.get_executor(), cfg, http, retry);
        delta_handler on_delta = [this](const model_delta& d) {
            if (!d.text.empty()) deltas.emplace_back(d.text);
            if (!d.reasoning.empty()) reasoning_deltas.emplace_back(d.reasoning);
        };
        return run_bounded(ctx, call(m, std::move(req), on_delta), limit);
    }

    // The message of the model_error the call must end with.
    std::string model_error(milliseconds limit = 5s) {
        try {
            complete(user("hi"), limit);
        } catch (const turn_error& e) {
            BOOST_TEST(e.code() == "model_error");
            return e.what();
        }
        BOOST_FAIL("expected a model_error");
        return {};
    }

    // Runs complete() and cancels it (terminal) after `after`; returns the exception it ended with.
    std::exception_ptr cancelled_after(milliseconds after) {
        auto m = make_openai_model(ctx.get_executor(), cfg, http, retry);
        asio::cancellation_signal cancel;
        std::exception_ptr error;
        bool done = false;
        auto handler = [&](std::exception_ptr e, chat_completion) {
            error = e;
            done = true;
        };
        asio::co_spawn(ctx, call(m, user("hi"), {}),
                       asio::bind_cancellation_slot(cancel.slot(), handler));
        asio::steady_timer timer(ctx, after);
        timer.async_wait(
            [&](boost::system::error_code) { cancel.emit(asio::cancellation_type::terminal); });
        auto deadline = steady::now() + 3s;
        ctx.restart();
        while (!done && steady::now() < deadline)
            ctx.run_one_for(10ms);
        BOOST_REQUIRE_MESSAGE(done, "the cancelled call did not finish");
        return error;
    }
};

void check_aborted(std::exception_ptr e) {
    BOOST_REQUIRE(e);
    try {
        std::rethrow_exception(e);
    } catch (const boost::system::system_error& x) {
        BOOST_TEST((x.code() == asio::error::operation_aborted), x.what());
    } catch (const std::exception& x) {
        BOOST_FAIL("expected operation_aborted, got: " << x.what());
    }
}

std::pair<boost::system::error_code, http_response> get(io_fixture& f, http_client& c, std::string url) {
    auto op = c.request("GET", std::move(url), {}, "", milliseconds(2000));
    return run_bounded(f.ctx, std::move(op), 5s);
}

} // namespace

BOOST_AUTO_TEST_SUITE(openai_client)

BOOST_AUTO_TEST_CASE(retry_delay_grows_exponentially_with_full_jitter) {
    openai_retry_policy p{5, milliseconds(100), milliseconds(1000)};
    BOOST_TEST(retry_delay(p, 1, 0.0, std::nullopt).count() == 0);
    BOOST_TEST(retry_delay(p, 1, 1.0, std::nullopt).count() == 100);
    BOOST_TEST(retry_delay(p, 2, 1.0, std::nullopt).count() == 200);
    BOOST_TEST(retry_delay(p, 3, 0.5, std::nullopt).count() == 200);
    BOOST_TEST(retry_delay(p, 4, 1.0, std::nullopt).count() == 800);
    BOOST_TEST(retry_delay(p, 5, 1.0, std::nullopt).count() == 1000);    // capped
    BOOST_TEST(retry_delay(p, 1000, 1.0, std::nullopt).count() == 1000); // no overflow
    BOOST_TEST(retry_delay(p, 2, 7.0, std::nullopt).count() == 200);     // jitter clamped
    // A server's Retry-After replaces the backoff, within the cap.
    BOOST_TEST(retry_delay(p, 1, 0.0, milliseconds(700)).count() == 700);
    BOOST_TEST(retry_delay(p, 1, 0.0, milliseconds(30000)).count() == 1000);
    BOOST_TEST(retry_delay(p, 1, 1.0, milliseconds(0)).count() == 0);
}

BOOST_AUTO_TEST_CASE(retry_after_accepts_seconds_and_http_dates) {
    using namespace std::chrono;
    auto now = sys_days(year(2015) / October / 21) + hours(7) + minutes(28);
    BOOST_TEST(parse_retry_after("120", now).value().count() == 120000);
    BOOST_TEST(parse_retry_after(" 0 ", now).value().count() == 0);
    BOOST_TEST(parse_retry_after("99999999999999999999", now).value().count() == 86400000);
    BOOST_TEST(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now).value().count() == 30000);
    BOOST_TEST(parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", now).value().count() == 60000);
    BOOST_TEST(parse_retry_after("Wed Oct 21 07:28:05 2015", now).value().count() == 5000);
    BOOST_TEST(parse_retry_after("Tue, 20 Oct 2015 07:28:00 GMT", now).value().count() == 0); // past
    for (const char* bad : {"", "-1", "1.5", "soon", "Wed, 32 Oct 2015 07:28:00 GMT",
                            "Wed, 21 Oct 2015 07:28:00 UTC", "Wed, 21 Oct 2015 07:28:00 GMT junk"})
        BOOST_TEST(!parse_retry_after(bad, now).has_value(), bad);
}

BOOST_FIXTURE_TEST_CASE(text_completion_without_streaming, openai_fixture) {
    server.push(fake_reply::completion("Hello there"));
    auto r = complete();
    BOOST_TEST(r.text == "Hello there");
    BOOST_TEST(r.finish_reason == "stop");
    BOOST_TEST(r.model == "gpt-fake");
    BOOST_TEST(r.has_usage);
    BOOST_TEST(r.prompt_tokens == 7);
    BOOST_TEST(r.completion_tokens == 3);
    BOOST_TEST(deltas == std::vector<std::string>{"Hello there"});
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 1u);
    BOOST_TEST(reqs[0].method == "POST");
    BOOST_TEST(reqs[0].target == "/v1/chat/completions");
    BOOST_TEST(reqs[0].header("content-type").value_or("") == "application/json");
    BOOST_TEST(reqs[0].header("user-agent").value_or("") == "baton/0.1.0"); // the project's version
    const auto& body = reqs[0].body.as_object();
    BOOST_TEST(body.at("model") == "gpt-test");
    BOOST_TEST(body.at("stream") == false);
    BOOST_TEST(!body.contains("stream_options"));
}

BOOST_FIXTURE_TEST_CASE(streamed_text_reports_deltas_in_order, openai_fixture) {
    cfg.stream = true;
    server.push(fake_reply::stream_text({"Hel", "lo", " wor", "ld"}));
    auto r = complete();
    BOOST_TEST(r.text == "Hello world");
    BOOST_TEST(deltas == (std::vector<std::string>{"Hel", "lo", " wor", "ld"}));
    BOOST_TEST(r.finish_reason == "stop");
    BOOST_TEST(r.prompt_tokens == 11);
    BOOST_TEST(r.completion_tokens == 5);
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 1u);
    BOOST_TEST(reqs[0].header("accept").value_or("") == "text/event-stream");
    const auto& body = reqs[0].body.as_object();
    BOOST_TEST(body.at("stream") == true);
    BOOST_TEST(body.at("stream_options") == (json::object{{"include_usage", true}}));

    // A compatible server that ignores stream:true and answers with one JSON object still works.
    deltas.clear();
    server.push(fake_reply::completion("all at once"));
    BOOST_TEST(complete().text == "all at once");
    BOOST_TEST(deltas == std::vector<std::string>{"all at once"});
}

// A 200 is read for what its first bytes are when its Content-Type does not say SSE: servers
// label streams application/json, or not at all, and some stream although stream:false was asked.
BOOST_FIXTURE_TEST_CASE(a_body_is_read_for_what_it_is_not_for_its_label, openai_fixture) {
    auto relabel = [](fake_reply r, std::optional<std::string> type) {
        r.headers.erase(r.headers.begin());
        if (type) r.headers.emplace(r.headers.begin(), "Content-Type", *type);
        return r;
    };
    for (bool stream : {true, false}) {
        cfg.stream = stream;
        for (std::optional<std::string> type :
             {std::optional<std::string>("application/json"), std::optional<std::string>()}) {
            BOOST_TEST_CONTEXT("stream " << stream << ", Content-Type " << type.value_or("none")) {
                deltas.clear();
                // Cut mid "data:" so that the first piece alone cannot decide.
                server.push(relabel(fake_reply::stream_text({"Hel", "lo"}, 3), type));
                auto r = complete();
                BOOST_TEST(r.text == "Hello");
                BOOST_TEST(r.finish_reason == "stop");
                BOOST_TEST(r.completion_tokens == 5);
                BOOST_TEST(deltas == (std::vector<std::string>{"Hel", "lo"}));

                deltas.clear();
                server.push(relabel(fake_reply::completion("whole"), type));
                BOOST_TEST(complete().text == "whole");
                BOOST_TEST(deltas == std::vector<std::string>{"whole"});
            }
        }
        // A stream so labelled and cut short is still a stream cut short, and retried.
        auto cut = relabel(fake_reply::stream_text({"Hel", "lo"}), "text/plain");
        cut.pieces.resize(1);
        server.push(cut);
        server.push(relabel(fake_reply::completion("second"), "text/plain"));
        BOOST_TEST(complete().text == "second");
        // And a 200 that is neither is called what it is.
        fake_reply html;
        html.headers = {{"Content-Type", "text/html"}};
        html.pieces = {"<html>proxy says hi</html>"};
        server.push(html);
        BOOST_TEST(contains(model_error(), "the response is not a JSON object"));
    }
}

BOOST_FIXTURE_TEST_CASE(stream_cut_inside_utf8_characters_and_crlf_lines, openai_fixture) {
    cfg.stream = true;
    const std::vector<std::string> parts{"h\xc3\xa9llo ", "w\xc3\xb6rld ", "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80"};
    for (std::size_t piece : {1u, 2u, 3u, 5u}) {
        BOOST_TEST_CONTEXT("piece size " << piece) {
            deltas.clear();
            auto reply = fake_reply::stream_text(parts, piece, true);
            if (piece < 3) reply.piece_delay = {}; // a thousand tiny writes: no need to space them
            server.push(reply);
            auto r = complete();
            BOOST_TEST(r.text == "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac\xf0\x9f\x98\x80");
            BOOST_TEST(deltas == parts);
            BOOST_TEST(r.has_usage);
        }
    }
}

BOOST_FIXTURE_TEST_CASE(tool_calls_split_across_chunks_are_assembled, openai_fixture) {
    cfg.stream = true;
    auto call_delta = [](int index, json::object fields) {
        fields["index"] = index;
        return chunk({{"tool_calls", json::array{std::move(fields)}}});
    };
    std::vector<json::object> chunks{
        chunk({{"role", "assistant"}, {"content", nullptr}}),
        call_delta(0, {{"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "get_weather"}, {"arguments", ""}}}}),
        call_delta(0, {{"function", {{"arguments", "{\"city\":"}}}}),
        call_delta(1, {{"id", "call_2"},
                       {"type", "function"},
                       {"function", {{"name", "get_time"}, {"arguments", "{}"}}}}),
        call_delta(0, {{"function", {{"arguments", "\"Paris\"}"}}}}),
        chunk({}, "tool_calls")};
    server.push(fake_reply::sse(chunks, 7));
    auto r = complete();
    using tc = chat_completion::tool_call;
    BOOST_TEST((r.tool_calls == std::vector<tc>{{"call_1", "get_weather", "{\"city\":\"Paris\"}"},
                                                {"call_2", "get_time", "{}"}}));
    BOOST_TEST(r.finish_reason == "tool_calls");
    BOOST_TEST(r.text.empty());
    BOOST_TEST(deltas.empty());
}

// `arguments` is a string of JSON by the contract; some servers send the object itself.
BOOST_FIXTURE_TEST_CASE(tool_call_arguments_given_as_an_object_are_taken, openai_fixture) {
    using tc = chat_completion::tool_call;
    auto whole = fake_reply::completion("", {{"call_1", "get_weather", "{}"}}, "tool_calls");
    auto body = json::parse(whole.pieces[0]).as_object();
    auto arguments = [&body]() -> json::value& {
        auto& call =
            body["choices"].as_array()[0].as_object()["message"].as_object()["tool_calls"].as_array()[0];
        return call.as_object()["function"].as_object()["arguments"];
    };
    arguments() = json::object{{"city", "Paris"}};
    whole.pieces = {json::serialize(body)};
    server.push(whole);
    BOOST_TEST(
        (complete().tool_calls == std::vector<tc>{{"call_1", "get_weather", "{\"city\":\"Paris\"}"}}));

    cfg.stream = true;
    server.push(fake_reply::sse(
        {chunk({{"role", "assistant"}, {"content", nullptr}}),
         chunk(
             {{"tool_calls",
               json::array{json::object{
                   {"index", 0},
                   {"id", "call_2"},
                   {"type", "function"},
                   {"function", {{"name", "get_time"}, {"arguments", json::object{{"tz", "UTC"}}}}}}}}}),
         chunk({}, "tool_calls")}));
    BOOST_TEST((complete().tool_calls == std::vector<tc>{{"call_2", "get_time", "{\"tz\":\"UTC\"}"}}));

    // Any other type is still refused, with its path.
    cfg.stream = false;
    arguments() = 7;
    whole.pieces = {json::serialize(body)};
    server.push(whole);
    BOOST_TEST(contains(model_error(), "arguments: expected string"));
}

BOOST_FIXTURE_TEST_CASE(rate_limit_retry_after_is_honoured, openai_fixture) {
    retry.max_delay = milliseconds(5000);
    server.push(fake_reply::error(429, "Rate limit reached", "1"));
    server.push(fake_reply::completion("after the wait"));
    auto t0 = steady::now();
    BOOST_TEST(complete(user("hi"), 8s).text == "after the wait");
    BOOST_TEST(ms_since(t0) >= 950);
    BOOST_TEST(ms_since(t0) < 4000);
    BOOST_TEST(server.requests().size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(retry_after_is_capped_and_retry_after_ms_preferred, openai_fixture) {
    retry.max_delay = milliseconds(150);
    server.push(fake_reply::error(429, "slow down", "30")); // capped at 150 ms
    auto ms = fake_reply::error(503, "busy", "30");
    ms.headers.emplace_back("retry-after-ms", "100"); // wins over Retry-After
    server.push(ms);
    server.push(fake_reply::completion("ok"));
    auto t0 = steady::now();
    BOOST_TEST(complete().text == "ok");
    BOOST_TEST(ms_since(t0) >= 240);
    BOOST_TEST(ms_since(t0) < 2000);
}

BOOST_FIXTURE_TEST_CASE(server_error_then_success, openai_fixture) {
    // Each try sends the same request (the body is lent to the client, not moved into it), streamed
    // or not, with its Content-Length.
    for (bool stream : {false, true}) {
        cfg.stream = stream;
        server.push(fake_reply::error(500, "boom"));
        server.push(fake_reply::error(503, "still booming"));
        server.push(stream ? fake_reply::stream_text({"recov", "ered"})
                           : fake_reply::completion("recovered"));
        BOOST_TEST(complete(user(std::string(70000, 'x'))).text == "recovered");
        auto reqs = server.requests();
        BOOST_TEST_REQUIRE(reqs.size() == (stream ? 6u : 3u));
        const auto& first = reqs[reqs.size() - 3];
        BOOST_TEST(first.body.is_object());
        BOOST_TEST(contains(json::serialize(first.body), std::string(70000, 'x')));
        for (std::size_t i = reqs.size() - 2; i < reqs.size(); ++i) {
            BOOST_TEST(reqs[i].body == first.body);
            BOOST_TEST(reqs[i].header("Content-Length").value_or("") ==
                       first.header("Content-Length").value_or("?"));
        }
    }
}

BOOST_FIXTURE_TEST_CASE(server_error_forever_ends_in_model_error, openai_fixture) {
    for (int i = 0; i < 4; ++i)
        server.push(fake_reply::error(502, "upstream is down"));
    auto msg = model_error();
    BOOST_TEST(contains(msg, "HTTP 502"), msg);
    BOOST_TEST(contains(msg, "upstream is down"), msg);
    BOOST_TEST(contains(msg, "4 attempts"), msg);
    BOOST_TEST(server.requests().size() == 4u);
}

BOOST_FIXTURE_TEST_CASE(client_error_is_not_retried, openai_fixture) {
    server.push(fake_reply::error(400, "Invalid 'messages': empty"));
    server.push(fake_reply::completion("never sent"));
    auto msg = model_error();
    BOOST_TEST(contains(msg, "HTTP 400: Invalid 'messages': empty"), msg);
    BOOST_TEST(server.requests().size() == 1u);
    BOOST_TEST(server.pending() == 1u);
    // 408 (request timeout) and 409 (conflict) are, as OpenAI's SDKs retry them.
    BOOST_TEST(complete().text == "never sent"); // the next call takes it
    for (unsigned status : {408u, 409u}) {
        server.push(fake_reply::error(status, "try again"));
        server.push(fake_reply::completion("second try"));
        BOOST_TEST(complete().text == "second try");
    }
    BOOST_TEST(server.requests().size() == 6u);
}

BOOST_FIXTURE_TEST_CASE(slow_answer_times_out_each_attempt, openai_fixture) {
    cfg.timeout = milliseconds(150);
    retry.max_attempts = 2;
    server.push(fake_reply::completion("late").after(milliseconds(1500)));
    server.push(fake_reply::completion("late").after(milliseconds(1500)));
    auto t0 = steady::now();
    auto msg = model_error();
    BOOST_TEST(contains(msg, "timeout"), msg);
    BOOST_TEST(contains(msg, "2 attempts"), msg);
    BOOST_TEST(ms_since(t0) >= 290);
    BOOST_TEST(ms_since(t0) < 1200);
    BOOST_TEST(server.requests().size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(dropped_connection_is_retried, openai_fixture) {
    auto cut = fake_reply::completion("this body is cut short");
    cut.drop_after = 10;
    server.push(cut);
    server.push(fake_reply::completion("whole"));
    BOOST_TEST(complete().text == "whole");
    BOOST_TEST(server.requests().size() == 2u);

    // Streamed, cut before the first text delta: nothing was shown, so it is retried too.
    cfg.stream = true;
    auto early = fake_reply::stream_text({"never", "shown"});
    early.drop_after = early.pieces.at(0).size() + 5;
    server.push(early);
    server.push(fake_reply::stream_text({"shown"}));
    deltas.clear();
    BOOST_TEST(complete().text == "shown");
    BOOST_TEST(deltas == std::vector<std::string>{"shown"});
}

BOOST_FIXTURE_TEST_CASE(stream_broken_after_text_is_not_retried, openai_fixture) {
    cfg.stream = true;
    auto broken = fake_reply::stream_text({"Hello", " world"});
    broken.drop_after = broken.pieces.at(0).size() + broken.pieces.at(1).size() + 3;
    server.push(broken);
    server.push(fake_reply::stream_text({"Hello", " world"}));
    auto msg = model_error();
    BOOST_TEST(contains(msg, "after text was delivered"), msg);
    BOOST_TEST(deltas == std::vector<std::string>{"Hello"});
    BOOST_TEST(server.requests().size() == 1u);
}

// Found with a model server that answered broken streams: a body that ended without [DONE] was
// taken as complete whatever it held, so a cut stream became a short reply and a body of
// garbage an empty one.
BOOST_FIXTURE_TEST_CASE(a_stream_without_done_needs_a_finish_reason, openai_fixture) {
    cfg.stream = true;
    // Some compatible servers omit [DONE]: a finish_reason is enough.
    server.push(fake_reply::sse({chunk({{"content", "all"}}), chunk({}, "stop")}, 0, false, false));
    BOOST_TEST(complete().text == "all");

    // Text and then the end of the body, with neither: cut short, and already shown.
    server.push(fake_reply::sse({chunk({{"content", "half"}})}, 0, false, false));
    server.push(fake_reply::stream_text({"never asked for"}));
    deltas.clear();
    auto msg = model_error();
    BOOST_TEST(contains(msg, "without [DONE] or a finish_reason"), msg);
    BOOST_TEST(deltas == std::vector<std::string>{"half"});
    BOOST_TEST(server.pending() == 1u);
    BOOST_TEST(complete().text == "never asked for");

    // An event stream without a single event (nothing shown yet): tried again.
    auto garbage = fake_reply::sse({}, 0, false, false);
    garbage.pieces = {"\x1f\x8b garbage, not events"};
    server.push(garbage);
    server.push(fake_reply::stream_text({"second try"}));
    deltas.clear();
    BOOST_TEST(complete().text == "second try");
    BOOST_TEST(server.requests().size() == 5u);
}

// Replayed provider streams showed bodies whose [DONE] lacks its blank line: "data: [DONE]\n", or
// "data: [DONE]" at the end of the body. The turn failed although the answer had arrived whole.
BOOST_FIXTURE_TEST_CASE(done_in_any_framing_ends_the_stream, openai_fixture) {
    cfg.stream = true;
    const std::string head =
        R"(data: {"choices":[{"index":0,"delta":{"content":"Checking."}}]})"
        "\n\n"
        R"(data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"clock","arguments":"{}"}}]},"finish_reason":"tool_calls"}]})"
        "\n\n"
        R"(data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}})"
        "\n\n";
    for (std::string tail : {"data: [DONE]\n", "data: [DONE]", "data:[DONE]\r\n", "data: [DONE] \n"}) {
        BOOST_TEST_CONTEXT(tail) {
            auto r = fake_reply::sse({}, 0, false, false);
            r.pieces = {head + tail};
            server.push(r);
            auto c = complete();
            BOOST_TEST(c.text == "Checking.");
            BOOST_REQUIRE_EQUAL(c.tool_calls.size(), 1u);
            BOOST_TEST(c.tool_calls[0].id == "c1");
            BOOST_TEST(c.prompt_tokens == 12);
            BOOST_TEST(c.completion_tokens == 5);
        }
    }
    // A finish_reason with only white space after it is complete too; a chunk without its blank
    // line at the end may have been cut, and is not taken.
    auto spaces = fake_reply::sse({}, 0, false, false);
    spaces.pieces = {head + "  "};
    server.push(spaces);
    BOOST_TEST(complete().completion_tokens == 5);
    auto cut = fake_reply::sse({}, 0, false, false);
    cut.pieces = {head + R"(data: {"choices":[{"index":0,"delta":{"content":"more"}}]})"};
    server.push(cut);
    auto msg = model_error();
    BOOST_TEST(contains(msg, "the stream ended inside an event"), msg);
    // Found by a new user's model server: the same whole events, and then the connection lost
    // before the body's declared end (a Content-Length or a chunked body not finished). All of the
    // answer had come; the turn failed.
    for (bool chunked : {false, true}) {
        BOOST_TEST_CONTEXT("chunked " << chunked) {
            auto dropped = fake_reply::sse({}, 0, false, false);
            dropped.pieces = {head, "data: [DONE]\n\n"};
            dropped.chunked = chunked;
            dropped.drop_after = head.size();
            server.push(dropped);
            auto c = complete();
            BOOST_TEST(c.text == "Checking.");
            BOOST_TEST(c.completion_tokens == 5);
        }
    }
    // Lost inside an event instead: the text was shown, so no second attempt.
    auto broken = fake_reply::sse({}, 0, false, false);
    broken.pieces = {head + R"(data: {"choices":[{"index":0,"del)", "ta\":{}}]}\n\n"};
    broken.drop_after = broken.pieces[0].size();
    server.push(broken);
    msg = model_error();
    BOOST_TEST(contains(msg, "after text was delivered"), msg);
}

// Reasoning is reported apart from the reply (model.reasoning events) and never joins it; it goes
// back to the model with the assistant message under the name it came in.
BOOST_FIXTURE_TEST_CASE(reasoning_is_reported_apart_and_sent_back, openai_fixture) {
    cfg.stream = true;
    server.push(fake_reply::sse(
        {chunk({{"role", "assistant"}, {"reasoning_content", "The user wants "}}),
         chunk({{"reasoning_content", "the time."}}),
         chunk({{"tool_calls", json::array{{{"index", 0},
                                            {"id", "call_0"},
                                            {"function", {{"name", "clock"}, {"arguments", "{}"}}}}}}},
               "tool_calls")},
        5));
    auto c = complete();
    BOOST_TEST(c.text == "");
    BOOST_TEST(deltas.empty());
    BOOST_TEST(reasoning_deltas == (std::vector<std::string>{"The user wants ", "the time."}));
    BOOST_TEST(c.reasoning.text == "The user wants the time.");

    auto next = user("what time is it?");
    next.messages.push_back(assistant_message("", c));
    next.messages.push_back({"tool", "12:00", {}, "call_0"});
    server.push(fake_reply::stream_text({"noon"}));
    BOOST_TEST(complete(next).text == "noon");
    auto requests = server.requests();
    const auto& sent = requests.back().body.at("messages").at(1).as_object();
    BOOST_TEST(sent.at("reasoning_content") == "The user wants the time.");
    BOOST_TEST(sent.at("content").is_null());
    BOOST_TEST(sent.at("tool_calls").at(0).at("id") == "call_0");
    BOOST_TEST(!sent.contains("reasoning"));
    BOOST_TEST(!sent.contains("reasoning_details"));
    // A message without reasoning carries none of the fields.
    const auto& user_msg = requests.back().body.at("messages").at(0).as_object();
    BOOST_TEST(!user_msg.contains("reasoning_content"));
}

// Interim answers before the real one are skipped (they were taken as the answer: "HTTP 100").
BOOST_FIXTURE_TEST_CASE(interim_1xx_answers_are_skipped, openai_fixture) {
    auto r = fake_reply::completion("after the interim ones");
    r.interim = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n";
    server.push(r);
    BOOST_TEST(complete().text == "after the interim ones");
    cfg.stream = true;
    auto s = fake_reply::stream_text({"streamed ", "too"});
    s.interim = "HTTP/1.1 100 Continue\r\n\r\n";
    server.push(s);
    BOOST_TEST(complete().text == "streamed too");
    BOOST_TEST(server.requests().size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(cancellation_during_a_slow_answer_is_prompt, openai_fixture) {
    server.push(fake_reply::completion("too late").after(milliseconds(2000)));
    auto t0 = steady::now();
    check_aborted(cancelled_after(milliseconds(50)));
    BOOST_TEST(ms_since(t0) < 500);
    BOOST_TEST(http->idle_connections() == 0u); // the aborted connection is never pooled
}

BOOST_FIXTURE_TEST_CASE(cancellation_during_backoff_is_prompt, openai_fixture) {
    retry.max_delay = milliseconds(10000);
    server.push(fake_reply::error(503, "busy", "5"));
    server.push(fake_reply::completion("too late"));
    auto t0 = steady::now();
    check_aborted(cancelled_after(milliseconds(100)));
    BOOST_TEST(ms_since(t0) < 1000);
    BOOST_TEST(server.requests().size() == 1u);
}

BOOST_FIXTURE_TEST_CASE(keep_alive_reuses_one_connection, openai_fixture) {
    for (int i = 0; i < 3; ++i)
        server.push(fake_reply::completion("one of three"));
    server.push(fake_reply::stream_text({"streamed"}));
    for (int i = 0; i < 3; ++i)
        BOOST_TEST(complete().text == "one of three");
    cfg.stream = true;
    BOOST_TEST(complete().text == "streamed");
    BOOST_TEST(server.requests().size() == 4u);
    BOOST_TEST(server.connections() == 1u);
    BOOST_TEST(http->idle_connections() == 1u);
}

BOOST_FIXTURE_TEST_CASE(pooled_connection_closed_by_server_is_replaced, openai_fixture) {
    retry.max_attempts = 1; // only the HTTP client's own retry may save the second call
    server.push(fake_reply::completion("first"));
    server.push(fake_reply::hang_up());
    server.push(fake_reply::completion("second"));
    BOOST_TEST(complete().text == "first");
    BOOST_TEST(complete().text == "second");
    BOOST_TEST(server.requests().size() == 3u);
    BOOST_TEST(server.connections() == 2u);
}

// A connection back in the pool for less than half a second is taken without asking the socket
// whether the server has closed it since; when it has, the request finds it closed before any
// answer and goes again on a new connection.
BOOST_FIXTURE_TEST_CASE(a_connection_closed_just_after_its_answer_is_replaced, openai_fixture) {
    retry.max_attempts = 1; // only the HTTP client's own retry may save the second call
    auto first = fake_reply::completion("first");
    first.drop_after = std::size_t(1) << 30; // the whole answer, then a close it did not announce
    server.push(first);
    server.push(fake_reply::completion("second"));
    BOOST_TEST(complete().text == "first");
    BOOST_TEST(complete().text == "second");
    BOOST_TEST(server.requests().size() == 2u);
    BOOST_TEST(server.connections() == 2u);
}

BOOST_AUTO_TEST_CASE(concurrent_calls_share_the_pool_across_threads) {
    fake_openai server;
    asio::io_context ioc;
    auto http = std::make_shared<http_client>(ioc.get_executor(), http_client_options{2});
    model_config cfg;
    cfg.base_url = server.base_url();
    cfg.stream = true;
    cfg.api_key_env = "";
    auto model = make_openai_model(ioc.get_executor(), cfg, http, {1});
    constexpr int calls = 16;
    for (int i = 0; i < calls; ++i)
        server.push(fake_reply::stream_text({"a", "b"}, 9));
    std::atomic<int> ok{0};
    std::vector<std::string> texts(calls);
    for (int i = 0; i < calls; ++i) {
        delta_handler on_delta = [&texts, i](const model_delta& d) { texts[i] += d.text; };
        auto done = [&ok](std::exception_ptr e, chat_completion c) { ok += !e && c.text == "ab"; };
        asio::co_spawn(asio::make_strand(ioc), call(model, user("hi"), on_delta), done);
    }
    std::thread second([&] { ioc.run_for(5s); });
    ioc.run_for(5s);
    second.join();
    BOOST_TEST(ok.load() == calls);
    BOOST_TEST(std::count(texts.begin(), texts.end(), "ab") == calls);
    BOOST_TEST(server.requests().size() == std::size_t(calls));
    BOOST_TEST(http->idle_connections() <= 2u);
}

BOOST_FIXTURE_TEST_CASE(host_names_are_resolved, openai_fixture) {
    server.push(fake_reply::completion("by name"));
    auto [ec, resp] =
        get(*this, *http, "http://localhost:" + std::to_string(server.port()) + "/v1/models?x=1");
    BOOST_TEST(!ec, ec.message());
    BOOST_TEST(resp.status == 200u);
    BOOST_TEST(contains(resp.body, "by name"));
    BOOST_TEST(resp.header("CONTENT-TYPE").value_or("") == "application/json");
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 1u);
    BOOST_TEST(reqs[0].method == "GET");
    BOOST_TEST(reqs[0].target == "/v1/models?x=1");
    BOOST_TEST(reqs[0].header("host").value_or("") == "localhost:" + std::to_string(server.port()));
}

BOOST_FIXTURE_TEST_CASE(authorization_header_from_the_environment, openai_fixture) {
    for (int i = 0; i < 3; ++i)
        server.push(fake_reply::completion("ok"));
    ::setenv(key_env, "sk-test-123", 1);
    complete();
    ::setenv(key_env, "", 1);
    complete();
    ::unsetenv(key_env);
    complete();
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 3u);
    BOOST_TEST(reqs[0].header("authorization").value_or("") == "Bearer sk-test-123");
    BOOST_TEST(!reqs[1].header("authorization").has_value());
    BOOST_TEST(!reqs[2].header("authorization").has_value());
}

BOOST_FIXTURE_TEST_CASE(request_body_carries_tools_and_tool_round_trips, openai_fixture) {
    server.push(fake_reply::completion("", {{"call_9", "lookup", "{\"q\":\"x\"}"}}, "tool_calls"));
    server.push(fake_reply::completion("plain"));
    model_request req;
    req.model = "gpt-override";
    req.max_tokens = 256;
    req.messages = {{"system", "be brief", {}, {}},
                    {"user", "look it up", {}, {}},
                    {"assistant", "", {{"call_1", "lookup", "{\"q\":\"a\"}"}}, {}},
                    {"tool", "result a", {}, "call_1"}};
    json::object params{{"type", "object"},
                        {"properties", json::object{{"q", json::object{{"type", "string"}}}}}};
    req.tools = {{"lookup", "Looks things up", params}};
    auto r = complete(req);
    BOOST_TEST((r.tool_calls == std::vector<tool_call>{{"call_9", "lookup", "{\"q\":\"x\"}"}}));
    complete(user("no tools"));

    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 2u);
    auto expected = json::parse(R"({
      "model": "gpt-override",
      "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": null, "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"a\"}"}}]},
        {"role": "tool", "content": "result a", "tool_call_id": "call_1"}],
      "tools": [{"type": "function", "function": {"name": "lookup", "description": "Looks things up",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
      "max_tokens": 256,
      "stream": false})");
    BOOST_TEST(reqs[0].body == expected, json::serialize(reqs[0].body));
    auto plain =
        json::parse(R"({"model": "gpt-test", "messages": [{"role": "user", "content": "no tools"}],
                                 "stream": false})");
    BOOST_TEST(reqs[1].body == plain, json::serialize(reqs[1].body));
}

BOOST_FIXTURE_TEST_CASE(request_body_escapes_every_text_it_carries, openai_fixture) {
    server.push(fake_reply::completion("ok"));
    // Quotes, backslashes, line breaks, tabs, control bytes, non-ASCII and a JSON-looking text.
    const std::string tricky = "say \"hi\"\\ now\n\r\t\x01\x1f end: caf\xc3\xa9 \xe2\x9c\x93 {\"k\":[1]}";
    model_request req;
    req.messages = {{"user", tricky, {}, {}},
                    {"assistant", "thinking \"out loud\"", {{"c\"1", "look\\up", "{\"q\":\"\\n\"}"}}, {}},
                    {"tool", "line1\nline2", {}, "c\"1"}};
    complete(req);
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 1u);
    const auto& msgs = reqs[0].body.at("messages").as_array();
    BOOST_TEST_REQUIRE(msgs.size() == 3u);
    BOOST_TEST(msgs[0].at("content").as_string() == tricky);
    BOOST_TEST(msgs[1].at("content").as_string() == "thinking \"out loud\"");
    const auto& call = msgs[1].at("tool_calls").as_array().at(0);
    BOOST_TEST(call.at("id").as_string() == "c\"1");
    BOOST_TEST(call.at("function").at("name").as_string() == "look\\up");
    BOOST_TEST(call.at("function").at("arguments").as_string() == "{\"q\":\"\\n\"}");
    BOOST_TEST(msgs[2].at("content").as_string() == "line1\nline2");
    BOOST_TEST(msgs[2].at("tool_call_id").as_string() == "c\"1");
}

BOOST_FIXTURE_TEST_CASE(the_request_head_is_framed_here_and_a_smuggled_header_is_refused, openai_fixture) {
    auto url = server.base_url() + "/models?x=1";
    auto send = [&](std::string method, http_headers h, std::string body) {
        return run_bounded(ctx, http->request(std::move(method), url, std::move(h), std::move(body),
                                              milliseconds(2000)),
                           5s);
    };
    // Refused before anything is sent: CR, LF or NUL in a value, a name or method that is not a
    // token, a TRACE with a body.
    const std::vector<std::pair<std::string, http_headers>> bad{
        {"GET", {{"X-A", "1\r\nX-Injected: 2"}}},
        {"GET", {{"X-A", "1\nX-Injected: 2"}}},
        {"GET", {{"X-A", std::string("1\0", 2)}}},
        {"GET", {{"X A", "1"}}},
        {"GET", {{"", "1"}}},
        {"GET", {{"X:A", "1"}}},
        {"GE T", {}},
        {"", {}},
    };
    for (const auto& [method, headers] : bad) {
        auto [ec, resp] = send(method, headers, "");
        BOOST_TEST((ec == boost::system::errc::invalid_argument), method << ": " << ec.message());
    }
    auto [tec, tresp] = send("TRACE", {}, "body");
    BOOST_TEST((tec == boost::system::errc::invalid_argument), tec.message());
    BOOST_TEST(server.requests().empty());
    BOOST_TEST(server.connections() == 0u);

    // The body is framed by the client: a caller's Content-Length and Transfer-Encoding are
    // dropped, a caller's Host replaces the URL's, the other headers go as given, in order.
    server.push(fake_reply::completion("one"));
    server.push(fake_reply::completion("two"));
    server.push(fake_reply::completion("three"));
    auto [ec1, r1] = send("POST", {{"Content-Length", "999"}, {"Transfer-Encoding", "chunked"},
                                   {"Host", "example.test"}, {"X-First", "a"}, {"X-Second", "b"}},
                          "{\"a\":1}");
    BOOST_TEST(!ec1, ec1.message());
    BOOST_TEST(r1.status == 200u);
    auto [ec2, r2] = send("POST", {}, ""); // an empty POST still says Content-Length: 0
    BOOST_TEST(!ec2, ec2.message());
    auto [ec3, r3] = send("DELETE", {}, "");
    BOOST_TEST(!ec3, ec3.message());
    auto reqs = server.requests();
    BOOST_TEST_REQUIRE(reqs.size() == 3u);
    BOOST_TEST(reqs[0].method == "POST");
    BOOST_TEST(reqs[0].target == "/v1/models?x=1");
    BOOST_TEST(reqs[0].header("Content-Length").value_or("") == "7");
    BOOST_TEST(!reqs[0].header("Transfer-Encoding"));
    BOOST_TEST(reqs[0].header("Host").value_or("") == "example.test");
    BOOST_TEST(reqs[0].body.at("a").as_int64() == 1);
    std::vector<std::string> names;
    for (const auto& [n, v] : reqs[0].headers)
        names.push_back(n);
    BOOST_TEST(std::count(names.begin(), names.end(), "Host") == 1);
    auto first = std::find(names.begin(), names.end(), "X-First");
    auto second = std::find(names.begin(), names.end(), "X-Second");
    BOOST_TEST((first != names.end() && second != names.end() && first < second));
    BOOST_TEST(reqs[1].header("Content-Length").value_or("") == "0");
    BOOST_TEST(!reqs[2].header("Content-Length"));
    BOOST_TEST(reqs[2].header("Host").value_or("") == "127.0.0.1:" + std::to_string(server.port()));
}

// One deadline bounds the whole exchange, the body too: a stream that stops sending ends in
// error::timeout with what came before it delivered, and the connection is not pooled. The
// timeout is the call's own: the calls before and after it on the same client are not touched.
BOOST_FIXTURE_TEST_CASE(a_stream_that_stalls_times_out_mid_body, openai_fixture) {
    auto url = server.base_url() + "/chat/completions";
    server.push(fake_reply::completion("first"));
    auto [ec0, r0] = run_bounded(ctx, http->request("POST", url, {}, "{}", milliseconds(2000)), 5s);
    BOOST_TEST(!ec0, ec0.message());
    BOOST_TEST(http->idle_connections() == 1u);

    auto stall = fake_reply::stream_text({"one", "two", "three"});
    stall.piece_delay = std::chrono::microseconds(milliseconds(600));
    server.push(stall);
    std::string got;
    auto t0 = steady::now();
    auto [ec, head] = run_bounded(
        ctx,
        http->stream("POST", url, {}, "{}", milliseconds(300), [](const http_response&) {},
                     [&](std::string_view piece) { got += piece; }),
        5s);
    BOOST_TEST((ec == boost::beast::error::timeout), ec.message());
    BOOST_TEST(head.status == 200u);
    BOOST_TEST(contains(got, "assistant"), got); // the first piece came before the stall
    BOOST_TEST(!contains(got, "[DONE]"), got);
    BOOST_TEST(ms_since(t0) >= 290); // not before its deadline
    BOOST_TEST(http->idle_connections() == 0u);

    server.push(fake_reply::completion("after"));
    auto [ec2, r2] = run_bounded(ctx, http->request("POST", url, {}, "{}", milliseconds(2000)), 5s);
    BOOST_TEST(!ec2, ec2.message());
    BOOST_TEST(contains(r2.body, "after"), r2.body);
    BOOST_TEST(http->idle_connections() == 1u);
}

BOOST_FIXTURE_TEST_CASE(refused_connection_is_retried_then_model_error, openai_fixture) {
    unsigned short port;
    {
        asio::ip::tcp::acceptor probe(ctx, {asio::ip::make_address("127.0.0.1"), 0});
        port = probe.local_endpoint().port();
    } // closed: nothing listens there now
    cfg.base_url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
    retry.max_attempts = 2;
    auto msg = model_error();
    BOOST_TEST(contains(msg, "2 attempts"), msg);
    BOOST_TEST(contains(msg, "refused"), msg);
    auto [ec, resp] = get(*this, *http, "ftp://127.0.0.1/");
    BOOST_TEST((ec == boost::system::errc::invalid_argument), ec.message());
    std::tie(ec, resp) = get(*this, *http, "not a url");
    BOOST_TEST((ec == boost::system::errc::invalid_argument), ec.message());
}

BOOST_FIXTURE_TEST_CASE(https_verifies_the_certificate_and_host_name, io_fixture) {
    auto right = make_self_signed("IP:127.0.0.1");
    auto wrong_name = make_self_signed("DNS:example.invalid");
    auto ca_path = std::filesystem::temp_directory_path() /
                   ("baton-test-ca-" + std::to_string(::getpid()) + ".pem");
    std::ofstream(ca_path) << right.cert_pem << wrong_name.cert_pem;
    tls_responder good(right);
    tls_responder mismatched(wrong_name);
    auto url = [](const tls_responder& r) {
        return "https://127.0.0.1:" + std::to_string(r.port()) + "/";
    };

    // The system trust store does not know a self-signed certificate.
    http_client system_trust(ctx.get_executor());
    auto [ec, resp] = get(*this, system_trust, url(good));
    BOOST_TEST((ec.category() == asio::error::get_ssl_category()), ec.message());
    BOOST_TEST(contains(ec.message(), "certificate verify failed"), ec.message());

    // Trusted, and issued for 127.0.0.1: the request goes through.
    http_client trusting(ctx.get_executor(), {8, milliseconds(2000), true, ca_path.string()});
    std::tie(ec, resp) = get(*this, trusting, url(good));
    BOOST_TEST(!ec, ec.message());
    BOOST_TEST(resp.status == 200u);
    BOOST_TEST(resp.body == "ok");

    // Trusted, but issued for another name: host name verification refuses it.
    std::tie(ec, resp) = get(*this, trusting, url(mismatched));
    BOOST_TEST((ec.category() == asio::error::get_ssl_category()), ec.message());
    BOOST_TEST(mismatched.handshakes() == 0u);

    // Verification off: the same server is accepted.
    http_client unverified(ctx.get_executor(), {8, milliseconds(2000), false, ""});
    std::tie(ec, resp) = get(*this, unverified, url(mismatched));
    BOOST_TEST(!ec, ec.message());
    BOOST_TEST(resp.body == "ok");
    std::filesystem::remove(ca_path);
}

BOOST_AUTO_TEST_SUITE_END()
