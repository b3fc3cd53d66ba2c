// `baton-bench mock-model`: a fast, deterministic OpenAI-compatible chat-completions server, so that
// a deployment can be benchmarked without a real model. One of the two bench files with Beast.
//
// Serves POST /v1/chat/completions (and /chat/completions), GET /v1/models; keep-alive, any number
// of connections, N io threads. Answers, for a request {model, messages, stream, tools?}:
//  - `tools` offered and no `tool` message after the last `user` message: ONE call to the first
//    tool, id "call_<n>", arguments "{}" or, when its parameters schema has `required` properties,
//    each of them set to: the first `enum` value if any, else "x" (string), 1 (number, integer),
//    true (boolean), [] (array), {} (object); finish_reason "tool_calls".
//  - otherwise the text "ok: " + the first 32 bytes (cut at a character boundary) of the last user
//    message's text; finish_reason "stop".
//  - usage: prompt_tokens = request body bytes / 4, completion_tokens = answer bytes / 4 (at least 1).
//  - stream: text/event-stream, chunked: a role delta, the text in K pieces (or the tool call as
//    a name delta then an arguments delta), a finish_reason chunk, a usage chunk (choices []), then
//    `data: [DONE]`. The whole stream goes out in one write: the mock is meant to cost little.
//  - --delay-ms D: a timer of D ms before answering (threads keep serving meanwhile).
//  - --reasoning: each answer also thinks, "thinking about: " + the same 32 bytes, as DeepSeek does:
//    `reasoning_content` in the message, or streamed in 2 pieces before the text or tool call.
//  - bad JSON or a malformed request: 400 with an OpenAI error object; unknown path: 404; another
//    method on a known path: 405.
// SIGINT/SIGTERM: stops, prints `requests: N` and the JSON line.
#include "bench/bench.hpp"
#include "bench/measure.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <thread>
#include <variant>

namespace baton::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace json = boost::json;
using asio::ip::tcp;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// ---- Protocol logic, no I/O ----

struct mock_answer {
    std::string model = "mock";
    bool stream = false;
    bool tool = false;
    std::string text;      // when !tool
    std::string tool_name; // when tool
    std::string arguments;
    std::string reasoning; // with --reasoning
    std::uint64_t prompt_tokens = 0;
    std::uint64_t completion_tokens = 0;
};

struct mock_reply {
    unsigned status = 200;
    std::string content_type = "application/json";
    std::string body;
    bool chunked = false;
    bool completion = false; // a chat completion: --delay-ms applies
};

mock_reply error_reply(unsigned status, std::string message, std::string code) {
    json::object e{{"message", message},
                   {"type", status == 404 ? "not_found_error" : "invalid_request_error"},
                   {"param", nullptr},
                   {"code", code}};
    return {status, "application/json", json::serialize(json::object{{"error", std::move(e)}}), false};
}

// At most `max` bytes of `s`, never cutting a UTF-8 sequence.
std::string_view cut_utf8(std::string_view s, std::size_t max) {
    if (s.size() <= max) return s;
    while (max > 0 && (static_cast<unsigned char>(s[max]) & 0xC0) == 0x80)
        --max;
    return s.substr(0, max);
}

// A message's text: a string, or the `text` parts of a content array.
std::string message_text(const json::value* content) {
    if (!content) return {};
    if (content->is_string()) return std::string(content->get_string());
    std::string out;
    if (content->is_array())
        for (const auto& part : content->get_array())
            if (part.is_object())
                if (auto t = part.get_object().if_contains("text"); t && t->is_string())
                    out += t->get_string();
    return out;
}

json::value example_value(const json::value* schema) {
    const json::object* s = schema && schema->is_object() ? &schema->get_object() : nullptr;
    if (!s) return "x";
    if (auto e = s->if_contains("enum"); e && e->is_array() && !e->get_array().empty())
        return e->get_array().front();
    auto t = s->if_contains("type");
    std::string_view type = t && t->is_string() ? std::string_view(t->get_string()) : "";
    if (type == "number" || type == "integer") return 1;
    if (type == "boolean") return true;
    if (type == "array") return json::array{};
    if (type == "object") return json::object{};
    return "x";
}

std::string example_arguments(const json::object& function) {
    json::object args;
    auto params = function.if_contains("parameters");
    if (params && params->is_object()) {
        const auto& p = params->get_object();
        auto required = p.if_contains("required");
        auto props = p.if_contains("properties");
        if (required && required->is_array())
            for (const auto& name : required->get_array()) {
                if (!name.is_string()) continue;
                const json::value* schema = nullptr;
                if (props && props->is_object())
                    schema = props->get_object().if_contains(name.get_string());
                args[name.get_string()] = example_value(schema);
            }
    }
    return json::serialize(args);
}

// The answer to a request body, or the 400 that it deserves.
std::variant<mock_answer, mock_reply> plan(std::string_view body, bool reasoning) {
    boost::system::error_code ec;
    auto v = json::parse(body, ec);
    if (ec) return error_reply(400, "the body is not valid JSON: " + ec.message(), "invalid_json");
    if (!v.is_object()) return error_reply(400, "the body must be a JSON object", "invalid_request");
    const auto& req = v.get_object();
    auto messages = req.if_contains("messages");
    if (!messages || !messages->is_array())
        return error_reply(400, "`messages` must be an array", "invalid_request");
    mock_answer a;
    if (auto m = req.if_contains("model"); m && m->is_string()) a.model = m->get_string();
    if (auto s = req.if_contains("stream"); s && s->is_bool()) a.stream = s->get_bool();
    const auto& msgs = messages->get_array();
    std::size_t after_user = 0; // index just past the last user message
    std::string user_text;
    bool tool_after_user = false;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        if (!msgs[i].is_object())
            return error_reply(400, "a message must be an object", "invalid_request");
        const auto& m = msgs[i].get_object();
        auto role = m.if_contains("role");
        if (!role || !role->is_string())
            return error_reply(400, "a message needs a `role`", "invalid_request");
        if (role->get_string() == "user") {
            after_user = i + 1;
            user_text = message_text(m.if_contains("content"));
            tool_after_user = false;
        } else if (role->get_string() == "tool" && i >= after_user) {
            tool_after_user = true;
        }
    }
    auto tools = req.if_contains("tools");
    const json::object* first_tool = nullptr;
    if (tools && tools->is_array() && !tools->get_array().empty()) {
        const auto& t = tools->get_array().front();
        auto f = t.is_object() ? t.get_object().if_contains("function") : nullptr;
        auto name = f && f->is_object() ? f->get_object().if_contains("name") : nullptr;
        if (!name || !name->is_string())
            return error_reply(400, "a tool needs `function.name`", "invalid_request");
        first_tool = &f->get_object();
    }
    if (first_tool && !tool_after_user) {
        a.tool = true;
        a.tool_name = first_tool->at("name").get_string();
        a.arguments = example_arguments(*first_tool);
    } else {
        a.text = "ok: " + std::string(cut_utf8(user_text, 32));
    }
    if (reasoning) a.reasoning = "thinking about: " + std::string(cut_utf8(user_text, 32));
    a.prompt_tokens = body.size() / 4;
    a.completion_tokens = std::max<std::uint64_t>(1, (a.tool ? a.arguments.size() : a.text.size()) / 4);
    return a;
}

json::object usage_of(const mock_answer& a) {
    return {{"prompt_tokens", a.prompt_tokens},
            {"completion_tokens", a.completion_tokens},
            {"total_tokens", a.prompt_tokens + a.completion_tokens}};
}

std::string render_completion(const mock_answer& a, std::uint64_t n, std::int64_t created) {
    json::object message{{"role", "assistant"}};
    if (a.tool) {
        message["content"] = nullptr;
        message["tool_calls"] = json::array{
            json::object{{"id", "call_" + std::to_string(n)},
                         {"type", "function"},
                         {"function", json::object{{"name", a.tool_name}, {"arguments", a.arguments}}}}};
    } else {
        message["content"] = a.text;
    }
    if (!a.reasoning.empty()) message["reasoning_content"] = a.reasoning;
    json::object choice{{"index", 0},
                        {"message", std::move(message)},
                        {"finish_reason", a.tool ? "tool_calls" : "stop"}};
    return json::serialize(json::object{{"id", "chatcmpl-mock-" + std::to_string(n)},
                                        {"object", "chat.completion"},
                                        {"created", created},
                                        {"model", a.model},
                                        {"choices", json::array{std::move(choice)}},
                                        {"usage", usage_of(a)}});
}

std::string render_stream(const mock_answer& a, std::uint64_t n, std::int64_t created, int pieces) {
    std::string out;
    const std::string id = "chatcmpl-mock-" + std::to_string(n);
    auto event = [&](json::array choices, json::value usage = nullptr) {
        json::object c{{"id", id},
                       {"object", "chat.completion.chunk"},
                       {"created", created},
                       {"model", a.model},
                       {"choices", std::move(choices)}};
        if (!usage.is_null()) c["usage"] = std::move(usage);
        out += "data: ";
        out += json::serialize(c);
        out += "\n\n";
    };
    auto delta = [&](json::object d, json::value finish = nullptr) {
        event(
            json::array{json::object{{"index", 0}, {"delta", std::move(d)}, {"finish_reason", finish}}});
    };
    // `rest` as `field` deltas, in `k` pieces of about the same size.
    auto stream_text = [&](std::string_view rest, std::string_view field, int k) {
        std::size_t size = (rest.size() + k - 1) / static_cast<std::size_t>(std::max(k, 1));
        while (!rest.empty()) {
            auto piece = cut_utf8(rest, std::max<std::size_t>(size, 1));
            if (piece.empty()) { // one character longer than a piece: send it whole
                std::size_t len = 1;
                while (len < rest.size() && (static_cast<unsigned char>(rest[len]) & 0xC0) == 0x80)
                    ++len;
                piece = rest.substr(0, len);
            }
            delta({{field, piece}});
            rest.remove_prefix(piece.size());
        }
    };
    delta({{"role", "assistant"}, {"content", ""}});
    stream_text(a.reasoning, "reasoning_content", 2);
    if (a.tool) {
        json::object fn{{"name", a.tool_name}, {"arguments", ""}};
        delta({{"tool_calls", json::array{json::object{{"index", 0},
                                                       {"id", "call_" + std::to_string(n)},
                                                       {"type", "function"},
                                                       {"function", std::move(fn)}}}}});
        delta({{"tool_calls",
                json::array{json::object{{"index", 0},
                                         {"function", json::object{{"arguments", a.arguments}}}}}}});
    } else {
        stream_text(a.text, "content", pieces);
    }
    delta({}, a.tool ? "tool_calls" : "stop");
    event(json::array{}, usage_of(a));
    out += "data: [DONE]\n\n";
    return out;
}

// ---- The server ----

struct settings {
    std::chrono::milliseconds delay{0};
    int pieces = 4;
    bool reasoning = false;
};

struct counters {
    std::atomic<std::uint64_t> requests{0}, completions{0}, streamed{0}, tool_calls{0}, bad{0},
        connections{0};
};

mock_reply handle(const bhttp::request<bhttp::string_body>& req, const settings& cfg, counters& n) {
    std::string_view target = req.target();
    std::string_view path = target.substr(0, target.find('?'));
    if (path == "/v1/chat/completions" || path == "/chat/completions") {
        if (req.method() != bhttp::verb::post)
            return error_reply(405, "use POST on " + std::string(path), "method_not_allowed");
        auto planned = plan(req.body(), cfg.reasoning);
        if (auto* r = std::get_if<mock_reply>(&planned)) return std::move(*r);
        const auto& a = std::get<mock_answer>(planned);
        auto id = n.completions.fetch_add(1, std::memory_order_relaxed) + 1;
        if (a.tool) n.tool_calls.fetch_add(1, std::memory_order_relaxed);
        auto created = static_cast<std::int64_t>(std::time(nullptr));
        if (!a.stream) return {200, "application/json", render_completion(a, id, created), false, true};
        n.streamed.fetch_add(1, std::memory_order_relaxed);
        return {200, "text/event-stream", render_stream(a, id, created, cfg.pieces), true, true};
    }
    if (path == "/v1/models" || path == "/models") {
        if (req.method() != bhttp::verb::get)
            return error_reply(405, "use GET on " + std::string(path), "method_not_allowed");
        json::object m{{"id", "mock"}, {"object", "model"}, {"created", 0}, {"owned_by", "baton-bench"}};
        return {200, "application/json",
                json::serialize(json::object{{"object", "list"}, {"data", json::array{m}}}), false};
    }
    return error_reply(404, "no route for " + std::string(path), "not_found");
}

// One connection: requests answered in order. Cancellation: ends when the io_context stops.
asio::awaitable<void> serve(tcp::socket socket, const settings& cfg, counters& n) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    for (;;) {
        bhttp::request_parser<bhttp::string_body> parser;
        parser.body_limit(16 * 1024 * 1024);
        stream.expires_after(std::chrono::seconds(120));
        auto [ec, read] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
        if (ec) break;
        const auto& req = parser.get();
        n.requests.fetch_add(1, std::memory_order_relaxed);
        mock_reply r = handle(req, cfg, n);
        if (r.status >= 400) n.bad.fetch_add(1, std::memory_order_relaxed);
        if (r.completion && cfg.delay.count() > 0) {
            asio::steady_timer t(stream.get_executor(), cfg.delay);
            co_await t.async_wait(use_tuple);
        }
        bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(r.status), req.version()};
        res.set(bhttp::field::server, "baton-bench mock-model");
        res.set(bhttp::field::content_type, r.content_type);
        if (r.chunked) res.set(bhttp::field::cache_control, "no-cache");
        res.keep_alive(req.keep_alive());
        res.body() = std::move(r.body);
        if (r.chunked && req.version() >= 11)
            res.chunked(true);
        else
            res.prepare_payload();
        stream.expires_after(std::chrono::seconds(30));
        auto [wec, written] = co_await bhttp::async_write(stream, res, use_tuple);
        if (wec || !res.keep_alive()) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

asio::awaitable<void> accept_loop(tcp::acceptor& acceptor, const settings& cfg, counters& n) {
    auto& ctx = static_cast<asio::io_context&>(acceptor.get_executor().context());
    for (;;) {
        auto [ec, socket] = co_await acceptor.async_accept(asio::make_strand(ctx), use_tuple);
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
        if (ec) {
            // Out of descriptors and the like: pause instead of spinning.
            asio::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));
            co_await pause.async_wait(use_tuple);
            continue;
        }
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        n.connections.fetch_add(1, std::memory_order_relaxed);
        auto ex = socket.get_executor();
        asio::co_spawn(ex, serve(std::move(socket), cfg, n), [](std::exception_ptr e) {
            if (e) {
                try {
                    std::rethrow_exception(e);
                } catch (const std::exception& x) {
                    std::cerr << "mock-model: connection failed: " << x.what() << "\n";
                }
            }
        });
    }
}
} // namespace

int run_mock_model(const options& opt) {
    opt.only({"--listen", "--delay-ms", "--threads", "--chunks"}, {"--reasoning"});
    std::string listen = opt.text("--listen", "127.0.0.1:0");
    settings cfg;
    cfg.delay = std::chrono::milliseconds(static_cast<long>(opt.number("--delay-ms", 0)));
    cfg.pieces = static_cast<int>(opt.number("--chunks", 4));
    cfg.reasoning = opt.flag("--reasoning");
    int threads = static_cast<int>(opt.number("--threads", 1));
    auto colon = listen.rfind(':');
    if (colon == std::string::npos || threads < 1 || cfg.pieces < 1 || cfg.delay.count() < 0) {
        std::cerr << "baton-bench mock-model: --listen HOST:PORT, --threads >= 1, --chunks >= 1, "
                     "--delay-ms >= 0\n";
        return 2;
    }
    std::string host = listen.substr(0, colon);
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    auto port = static_cast<unsigned short>(std::stoul(listen.substr(colon + 1)));

    asio::io_context ctx(threads);
    tcp::acceptor acceptor(asio::make_strand(ctx));
    tcp::endpoint ep(asio::ip::make_address(host), port);
    acceptor.open(ep.protocol());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(asio::socket_base::max_listen_connections);
    counters n;
    asio::co_spawn(acceptor.get_executor(), accept_loop(acceptor, cfg, n), asio::detached);

    asio::signal_set signals(ctx, SIGINT, SIGTERM);
    signals.async_wait([&](boost::system::error_code ec, int) {
        if (!ec) ctx.stop();
    });
    std::cout << "listening on http://" << listen.substr(0, colon) << ":"
              << acceptor.local_endpoint().port() << std::endl;
    auto start = std::chrono::steady_clock::now();
    auto cpu0 = self_cpu_us();
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i)
        pool.emplace_back([&] { ctx.run(); });
    ctx.run();
    for (auto& t : pool)
        t.join();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto requests = n.requests.load();
    double cpu_us = static_cast<double>(self_cpu_us() - cpu0);
    std::cout << "requests: " << requests << " (" << n.completions.load() << " completions, "
              << n.streamed.load() << " streamed, " << n.tool_calls.load() << " tool calls, "
              << n.bad.load() << " errors) on " << n.connections.load() << " connections in " << seconds
              << " s\n";
    print_json({{"bench", "mock-model"},
                {"requests", requests},
                {"completions", n.completions.load()},
                {"streamed", n.streamed.load()},
                {"tool_calls", n.tool_calls.load()},
                {"errors", n.bad.load()},
                {"connections", n.connections.load()},
                {"seconds", seconds},
                {"requests_per_s", seconds > 0 ? static_cast<double>(requests) / seconds : 0.0},
                {"cpu_us_per_request", requests > 0 ? cpu_us / static_cast<double>(requests) : 0.0}});
    return 0;
}

} // namespace baton::bench
