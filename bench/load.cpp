// `baton-bench load`: closed-loop load against a running daemon (API.md). C clients, each with
// its own keep-alive connection, loop: POST a message to session `load-<i mod K>`, wait until the
// turn is terminal (poll GET /v1/turns/{tid}; or long-poll it with ?wait=30; or POST with
// ?wait=30 and take its 200; or read its SSE events; or use one WebSocket per client), then the next,
// until N turns in total or S seconds. Reports turns/s, accept latency (POST -> 202), completion latency
// (POST -> terminal status seen), errors by kind and, with
// --pid, the daemon's CPU time per turn and its RSS. Exit 0 without errors, 1 with, 2 on misuse.
#include "bench/bench.hpp"
#include "bench/measure.hpp"
#include "bench/net.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

namespace baton::bench {

namespace json = boost::json;
using clock_type = std::chrono::steady_clock;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

struct load_settings {
    http_url url;
    int clients = 50;
    int sessions = 50;
    std::uint64_t turns = 10000;
    std::uint64_t warmup = 0;
    double seconds = 0; // 0: no time limit
    int threads = 1;
    std::string mode = "poll";
    std::string text = "hello";
    std::string session_prefix = "load-"; // session ids: prefix + index
    std::string token;      // sent as Authorization: Bearer on every request and upgrade
    bool ws_events = false; // ws: follow the turn's event frames too (by default replies only)
    milliseconds timeout{60000};
};

// Shared by the clients of one phase.
struct phase_state {
    std::atomic<std::uint64_t> claimed{0};
    std::uint64_t budget = 0;
    clock_type::time_point deadline = clock_type::time_point::max();
    std::atomic<bool> abort{false};
    std::mutex mutex;
    std::string abort_message; // under mutex

    void stop(std::string why) {
        std::lock_guard lock(mutex);
        if (!abort.exchange(true)) abort_message = std::move(why);
    }
};

// One turn as one client saw it.
struct turn_result {
    std::string error; // empty: a terminal status was seen
    std::string status;
    double accept_ms = -1;
    double done_ms = -1;
    std::uint32_t polls = 0;
};

struct client_stats {
    std::vector<double> accept_ms, done_ms;
    std::uint64_t polls = 0, max_polls = 0, terminal = 0, completed = 0;
    std::map<std::string, std::uint64_t> errors;

    void add(const turn_result& r) {
        if (r.accept_ms >= 0) accept_ms.push_back(r.accept_ms);
        if (!r.error.empty()) {
            ++errors[r.error];
            return;
        }
        ++terminal;
        done_ms.push_back(r.done_ms);
        polls += r.polls;
        max_polls = std::max<std::uint64_t>(max_polls, r.polls);
        if (r.status == "completed")
            ++completed;
        else
            ++errors["status_" + r.status];
    }
};

struct client {
    client(asio::any_io_executor ex, int i, const load_settings& s)
        : executor(ex), index(i), session(s.session_prefix + std::to_string(i % s.sessions)),
          http(std::make_unique<http_connection>(ex, s.url.host, s.url.port)) {
        if (!s.token.empty()) http->set_header("Authorization", "Bearer " + s.token);
        drop_ws(s);
    }
    // A broken WebSocket cannot be reused: the next turn connects a new one.
    void drop_ws(const load_settings& s) {
        ws = std::make_unique<ws_connection>(executor, s.url.host, s.url.port);
        if (!s.token.empty()) ws->set_header("Authorization", "Bearer " + s.token);
        ws_open = false;
    }
    asio::any_io_executor executor; // the client's strand
    int index;
    std::string session;
    std::unique_ptr<http_connection> http;
    std::unique_ptr<ws_connection> ws;
    bool ws_open = false;
    std::size_t ws_connects = 0;
    std::uint64_t seq = 0;
    std::string lg_thread; // langgraph-*: this client's thread on the Agent Server
    client_stats stats;
};

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// The error kind of a non-2xx answer: "http_429_session_queue_full".
std::string http_error(std::string_view prefix, const http_reply& r) {
    std::string kind = std::string(prefix) + std::to_string(r.status);
    boost::system::error_code ec;
    auto v = json::parse(r.body, ec);
    if (!ec && v.is_object())
        if (auto e = v.get_object().if_contains("error"); e && e->is_object())
            if (auto c = e->get_object().if_contains("code"); c && c->is_string())
                kind += "_" + std::string(c->get_string());
    return kind;
}

// POST the message; fills accept_ms and returns the turn id, or "" with r.error set.
asio::awaitable<std::string> post_message(client& c, const load_settings& s, clock_type::time_point t0,
                                          turn_result& r) {
    std::string target = s.url.path + "/v1/sessions/" + c.session + "/messages";
    if (s.mode == "sync") target += "?wait=30";
    // Built apart: an initializer list inside a co_await expression trips g++ 12.
    std::string body = json::serialize(json::object{{"text", s.text}});
    auto [ec, reply] = co_await c.http->request(method_post, target, std::move(body), s.timeout);
    if (ec) {
        r.error = "connection: " + ec.message();
        co_return std::string();
    }
    bool finished = s.mode == "sync" && reply.status == 200;
    if (reply.status != 202 && !finished) {
        r.error = http_error("http_", reply);
        co_return std::string();
    }
    r.accept_ms = ms_since(t0);
    auto tid = json_field(reply.body, "turn_id");
    if (tid.empty()) r.error = "bad_response";
    if (finished) {
        // The synchronous answer: the finished record.
        r.done_ms = r.accept_ms;
        r.status = json_field(reply.body, "status");
        co_return std::string();
    }
    co_return tid;
}

asio::awaitable<void> wait_poll(client& c, const load_settings& s, const std::string& tid,
                                clock_type::time_point t0, turn_result& r) {
    // Long poll (and a synchronous POST that answered 202): each GET is held up to 30 s.
    bool held = s.mode == "longpoll" || s.mode == "sync";
    auto p = co_await poll_turn(*c.http, s.url.path, tid, s.timeout, held);
    r.polls = p.polls;
    if (p.ec)
        r.error = "connection: " + p.ec.message();
    else if (p.last.status != 200)
        r.error = http_error("poll_http_", p.last);
    r.done_ms = ms_since(t0);
    r.status = p.status;
}

// Reads the turn's events until turn.finished.
asio::awaitable<void> wait_sse(client& c, const load_settings& s, phase_state& ph,
                               const std::string& tid, clock_type::time_point t0, turn_result& r) {
    std::string target = s.url.path + "/v1/turns/" + tid + "/events";
    std::function<bool(const sse_event&)> on_event = [&](const sse_event& ev) {
        if (ev.event != "turn.finished") return true;
        r.done_ms = ms_since(t0);
        r.status = json_field(ev.data, "status");
        return false;
    };
    auto [ec, reply] = co_await c.http->events(target, on_event, s.timeout);
    if (ec) {
        r.error = "connection: " + ec.message();
    } else if (reply.status == 404) {
        r.error = "sse_http_404";
        ph.stop("the daemon does not serve /v1/turns/{tid}/events (404)");
    } else if (reply.status != 200) {
        r.error = http_error("sse_http_", reply);
    } else if (r.status.empty()) {
        r.error = "sse_ended_without_turn_finished";
    }
}

// One turn over the client's WebSocket: message -> accepted -> reply (acked) or turn.finished.
asio::awaitable<void> turn_ws(client& c, const load_settings& s, phase_state& ph, turn_result& r) {
    if (!c.ws_open) {
        auto [ec, status] = co_await c.ws->connect(s.url.path + "/v1/ws", s.timeout, s.timeout);
        if (status == 404) ph.stop("the daemon does not serve /v1/ws (404)");
        if (ec) {
            c.drop_ws(s);
            r.error =
                status > 0 ? "ws_upgrade_" + std::to_string(status) : "connection: " + ec.message();
            co_return;
        }
        c.ws_open = true;
        ++c.ws_connects;
    }
    std::string id = "c" + std::to_string(c.index) + "-" + std::to_string(++c.seq);
    auto t0 = clock_type::now();
    json::object msg{{"type", "message"}, {"session", c.session}, {"text", s.text}, {"id", id}};
    // A chat client's frames only (message, accepted, reply, ack) unless --ws-events 1.
    if (!s.ws_events) msg["events"] = false;
    if (auto ec = co_await c.ws->send(json::serialize(msg))) {
        c.drop_ws(s);
        r.error = "connection: " + ec.message();
        co_return;
    }
    std::string tid;
    // Turns that ended before their `accepted` came (a daemon that sends frames out of order):
    // the turn is done as soon as its id is known.
    std::vector<std::string> ended_early;
    for (;;) {
        auto [ec, text] = co_await c.ws->receive();
        if (ec) {
            c.drop_ws(s);
            r.error = "connection: " + ec.message();
            co_return;
        }
        boost::system::error_code pec;
        auto v = json::parse(text, pec);
        if (pec || !v.is_object()) {
            r.error = "bad_frame";
            co_return;
        }
        const auto& f = v.get_object();
        auto str = [&](std::string_view k) {
            auto p = f.if_contains(k);
            return p && p->is_string() ? std::string(p->get_string()) : std::string();
        };
        auto type = str("type");
        if (type == "accepted" && str("id") == id) {
            r.accept_ms = ms_since(t0);
            tid = str("turn_id");
            if (std::find(ended_early.begin(), ended_early.end(), tid) != ended_early.end()) {
                r.done_ms = r.accept_ms;
                r.status = "completed";
                co_return;
            }
        } else if (type == "error" && str("id") == id) {
            r.error = "ws_error_" + str("code");
            co_return;
        } else if (type == "reply") {
            json::object ack{{"type", "ack"}, {"key", str("key")}};
            co_await c.ws->send(json::serialize(ack));
            if (!tid.empty() && str("turn_id") == tid) {
                r.done_ms = ms_since(t0);
                r.status = "completed";
                co_return;
            }
            if (tid.empty()) ended_early.push_back(str("turn_id"));
        } else if (type == "event" && !tid.empty() && str("turn_id") == tid &&
                   str("event") == "turn.finished") {
            auto d = f.if_contains("data");
            r.done_ms = ms_since(t0);
            r.status = d && d->is_object() && d->get_object().if_contains("status") &&
                               d->get_object().at("status").is_string()
                           ? std::string(d->get_object().at("status").get_string())
                           : "completed";
            co_return;
        }
    }
}

// Targets and bodies are named before each co_await below: temporaries in a co_await's arguments
// trip g++ 12.
// One request of a LangGraph turn: its answer when it is a 200; otherwise r.error is set
// ("connection: ..." or KIND_http_STATUS) and the turn ends.
asio::awaitable<std::optional<http_reply>> langgraph_request(client& c, const load_settings& s,
                                                             std::string_view method, std::string target,
                                                             std::string body, std::string_view kind,
                                                             turn_result& r) {
    auto [ec, reply] = co_await c.http->request(method, std::move(target), std::move(body), s.timeout);
    if (ec) {
        r.error = "connection: " + ec.message();
        co_return std::nullopt;
    }
    if (reply.status != 200) {
        r.error = std::string(kind) + "_http_" + std::to_string(reply.status);
        co_return std::nullopt;
    }
    co_return std::move(reply);
}

// One turn on LangGraph's Agent Server (bench/peers/langgraph), through its own API: the client's
// thread is made on its first turn (POST /threads); a turn is a run on it (POST
// /threads/{thread}/runs with the message as input), then either polls of GET
// /threads/{thread}/runs/{run} (at once, then 1 ms doubling to 20 ms, as poll_turn does) until a
// terminal status, and GET /threads/{thread}/state for the answer (langgraph-poll), or one GET
// /threads/{thread}/runs/{run}/join, which answers when the run has ended (langgraph-join).
asio::awaitable<void> turn_langgraph(client& c, const load_settings& s, turn_result& r) {
    auto t0 = clock_type::now();
    if (c.lg_thread.empty()) {
        std::string target = s.url.path + "/threads", none = "{}";
        auto made = co_await langgraph_request(c, s, method_post, std::move(target), std::move(none),
                                               "threads", r);
        if (!made) co_return;
        c.lg_thread = json_field(made->body, "thread_id");
        if (c.lg_thread.empty()) {
            r.error = "bad_response";
            co_return;
        }
        t0 = clock_type::now();
    }
    const std::string thread = s.url.path + "/threads/" + c.lg_thread;
    std::string body = json::serialize(json::object{
        {"assistant_id", "agent"},
        {"input",
         json::object{{"messages", json::array{json::object{{"role", "user"}, {"content", s.text}}}}}}});
    std::string runs = thread + "/runs";
    auto created =
        co_await langgraph_request(c, s, method_post, std::move(runs), std::move(body), "runs", r);
    if (!created) co_return;
    r.accept_ms = ms_since(t0);
    auto run = json_field(created->body, "run_id");
    if (run.empty()) {
        r.error = "bad_response";
        co_return;
    }
    std::string status;
    if (s.mode == "langgraph-join") {
        std::string target = thread + "/runs/" + run + "/join", none;
        auto joined =
            co_await langgraph_request(c, s, method_get, std::move(target), std::move(none), "join", r);
        ++r.polls;
        if (!joined) co_return;
        // A failed run answers 200 too, with "__error__".
        status = joined->body.find("\"__error__\"") == std::string::npos ? "success" : "error";
    } else {
        asio::steady_timer timer(c.executor);
        for (milliseconds delay{0};; delay = std::clamp(delay * 2, milliseconds(1), milliseconds(20))) {
            if (delay.count() > 0) {
                timer.expires_after(delay);
                co_await timer.async_wait(use_tuple);
            }
            std::string target = thread + "/runs/" + run, none;
            auto polled = co_await langgraph_request(c, s, method_get, std::move(target),
                                                     std::move(none), "poll", r);
            ++r.polls;
            if (!polled) co_return;
            status = json_field(polled->body, "status");
            if (status != "pending" && status != "running") break;
        }
        if (status == "success") {
            // The run record has no output: the answer is the thread's state.
            std::string target = thread + "/state", none;
            auto state = co_await langgraph_request(c, s, method_get, std::move(target), std::move(none),
                                                    "state", r);
            ++r.polls;
            if (!state) co_return;
        }
    }
    r.done_ms = ms_since(t0);
    r.status = status == "success" ? "completed" : status;
}

asio::awaitable<void> client_loop(client& c, const load_settings& s, phase_state& ph, bool record) {
    for (;;) {
        if (ph.abort.load() || clock_type::now() >= ph.deadline || ph.claimed.fetch_add(1) >= ph.budget)
            co_return;
        turn_result r;
        if (s.mode == "ws") {
            co_await turn_ws(c, s, ph, r);
        } else if (s.mode.starts_with("langgraph-")) {
            co_await turn_langgraph(c, s, r);
        } else {
            auto t0 = clock_type::now();
            auto tid = co_await post_message(c, s, t0, r);
            if (!tid.empty()) {
                if (s.mode == "sse")
                    co_await wait_sse(c, s, ph, tid, t0, r);
                else
                    co_await wait_poll(c, s, tid, t0, r);
            }
        }
        if (record) c.stats.add(r);
        if (!r.error.empty() && r.status.empty()) {
            // A refused connection or a full queue: pause instead of spinning.
            asio::steady_timer pause(c.executor, milliseconds(10));
            co_await pause.async_wait(use_tuple);
        }
    }
}

void run_phase(asio::io_context& ctx, std::vector<std::unique_ptr<client>>& clients,
               const load_settings& s, phase_state& ph, bool record) {
    // The phase ends with its last client, not when the io_context runs out of work: an open
    // WebSocket's idle timer stays pending between phases.
    std::atomic<std::size_t> running{clients.size()};
    auto done = [&](std::exception_ptr e) {
        if (--running == 0) ctx.stop();
        if (e) std::rethrow_exception(e);
    };
    for (auto& c : clients)
        asio::co_spawn(c->executor, client_loop(*c, s, ph, record), done);
    std::vector<std::thread> pool;
    for (int i = 1; i < s.threads; ++i)
        pool.emplace_back([&] { ctx.run(); });
    ctx.run();
    for (auto& t : pool)
        t.join();
    ctx.restart();
}
} // namespace

namespace {
load_settings parse_settings(const options& opt) {
    opt.only({"--url", "--clients", "--sessions", "--turns", "--seconds", "--mode", "--pid", "--text",
              "--warmup", "--threads", "--timeout-ms", "--token", "--ws-events", "--session-prefix"});
    load_settings s;
    auto url = opt.text("--url", "http://127.0.0.1:8080");
    auto parsed = parse_http_url(url);
    if (!parsed) throw std::invalid_argument("--url: expected http://HOST:PORT, got " + url);
    s.url = *parsed;
    s.clients = static_cast<int>(opt.number("--clients", 50));
    s.sessions = static_cast<int>(opt.number("--sessions", s.clients));
    s.turns = static_cast<std::uint64_t>(opt.number("--turns", 10000));
    s.warmup = static_cast<std::uint64_t>(opt.number("--warmup", 0));
    s.seconds = opt.number("--seconds", 0);
    s.threads = static_cast<int>(opt.number("--threads", 1));
    s.mode = opt.text("--mode", "poll");
    s.text = opt.text("--text", "hello");
    s.session_prefix = opt.text("--session-prefix", "load-");
    s.token = opt.text("--token", "");
    auto ws_events = opt.number("--ws-events", 0);
    if (ws_events != 0 && ws_events != 1) throw std::invalid_argument("--ws-events: 0 or 1");
    s.ws_events = ws_events == 1;
    s.timeout = milliseconds(static_cast<long>(opt.number("--timeout-ms", 60000)));
    if (s.clients < 1 || s.sessions < 1 || s.turns < 1 || s.seconds < 0 || s.threads < 1 ||
        s.timeout.count() < 1)
        throw std::invalid_argument("--clients, --sessions, --turns, --threads >= 1, --seconds >= 0");
    if (s.mode != "poll" && s.mode != "longpoll" && s.mode != "sync" && s.mode != "sse" &&
        s.mode != "ws" && s.mode != "langgraph-poll" && s.mode != "langgraph-join")
        throw std::invalid_argument(
            "--mode: poll, longpoll, sync, sse, ws, langgraph-poll or langgraph-join");
    // A LangGraph thread takes one run at a time (a second is refused with 422): one per client.
    if (s.mode.starts_with("langgraph-") && s.sessions != s.clients)
        throw std::invalid_argument("--mode langgraph-*: --sessions must equal --clients");
    return s;
}

} // namespace

int run_load(const options& opt) {
    load_settings s;
    try {
        s = parse_settings(opt);
    } catch (const std::invalid_argument& e) {
        std::cerr << "baton-bench load: " << e.what() << "\n";
        return 2;
    }
    int pid = static_cast<int>(opt.number("--pid", 0));
    asio::io_context ctx(s.threads);

    // Preflight: a daemon that is not there is a usage problem, not 10,000 errors.
    http_connection probe(ctx.get_executor(), s.url.host, s.url.port);
    std::pair<error_code, http_reply> health;
    // LangGraph's Agent Server answers its health at /ok.
    const std::string health_path = s.url.path + (s.mode.starts_with("langgraph-") ? "/ok" : "/healthz");
    auto check = [&]() -> asio::awaitable<void> {
        std::string target = health_path;
        health = co_await probe.request(method_get, std::move(target), {}, milliseconds(5000));
    };
    asio::co_spawn(ctx, check(), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
    ctx.run();
    ctx.restart();
    if (health.first || health.second.status != 200) {
        std::cerr << "baton-bench load: " << s.url.host << ":" << s.url.port << health_path << ": "
                  << (health.first ? health.first.message()
                                   : "HTTP " + std::to_string(health.second.status))
                  << "\n";
        return 2;
    }

    std::vector<std::unique_ptr<client>> clients;
    for (int i = 0; i < s.clients; ++i)
        clients.push_back(std::make_unique<client>(asio::make_strand(ctx), i, s));
    std::string abort_message;
    if (s.warmup > 0) {
        phase_state warm;
        warm.budget = s.warmup;
        run_phase(ctx, clients, s, warm, false);
        abort_message = warm.abort_message;
        std::cout << "warm-up: " << s.warmup << " turns\n";
    }
    phase_state ph;
    ph.budget = s.turns;
    auto start = clock_type::now();
    if (s.seconds > 0)
        ph.deadline = start + std::chrono::duration_cast<clock_type::duration>(
                                  std::chrono::duration<double>(s.seconds));
    auto daemon0 = pid > 0 ? read_proc(pid) : proc_sample{};
    auto self0 = self_cpu_us();
    if (abort_message.empty()) run_phase(ctx, clients, s, ph, true);
    double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    auto self1 = self_cpu_us();
    auto daemon1 = pid > 0 ? read_proc(pid) : proc_sample{};
    if (abort_message.empty()) abort_message = ph.abort_message;
    if (!abort_message.empty()) {
        std::cerr << "baton-bench load: " << abort_message << "\n";
        return 2;
    }

    client_stats all;
    std::size_t connects = 0;
    for (auto& c : clients) {
        auto& st = c->stats;
        all.accept_ms.insert(all.accept_ms.end(), st.accept_ms.begin(), st.accept_ms.end());
        all.done_ms.insert(all.done_ms.end(), st.done_ms.begin(), st.done_ms.end());
        all.polls += st.polls;
        all.max_polls = std::max(all.max_polls, st.max_polls);
        all.terminal += st.terminal;
        all.completed += st.completed;
        for (auto& [k, n] : st.errors)
            all.errors[k] += n;
        connects += c->http->connects() + c->ws_connects;
    }
    std::uint64_t errors = 0;
    json::object by_kind;
    for (auto& [k, n] : all.errors) {
        errors += n;
        by_kind[k] = n;
    }
    auto acc = summarize(all.accept_ms);
    auto done = summarize(all.done_ms);
    double turns = static_cast<double>(all.terminal);
    double per_s = seconds > 0 ? turns / seconds : 0;
    double polls = turns > 0 ? static_cast<double>(all.polls) / turns : 0;
    double self_us = turns > 0 ? (self1 - self0) / turns : 0;

    std::cout << "load: " << all.terminal << " turns (" << all.completed << " completed) in "
              << fixed(seconds, 2) << " s, " << s.clients << " clients, " << s.sessions << " sessions, "
              << s.mode << " mode\n";
    std::cout << "turns/s: " << fixed(per_s) << "\n";
    std::cout << "accept ms p50/p90/p99/max: " << fixed(acc.p50, 2) << " / " << fixed(acc.p90, 2)
              << " / " << fixed(acc.p99, 2) << " / " << fixed(acc.max, 2) << "\n";
    std::cout << "completion ms p50/p90/p99/max: " << fixed(done.p50, 2) << " / " << fixed(done.p90, 2)
              << " / " << fixed(done.p99, 2) << " / " << fixed(done.max, 2) << "\n";
    const bool polled =
        s.mode == "poll" || s.mode == "longpoll" || s.mode == "sync" || s.mode.starts_with("langgraph-");
    if (polled) std::cout << "polls per turn: " << fixed(polls, 2) << " (max " << all.max_polls << ")\n";
    std::cout << "errors: " << errors << "\n";
    for (auto& [k, n] : all.errors)
        std::cout << "  " << k << ": " << n << "\n";
    json::object out{{"bench", "load"},
                     {"mode", s.mode},
                     {"clients", s.clients},
                     {"sessions", s.sessions},
                     {"turns", all.terminal},
                     {"completed", all.completed},
                     {"seconds", seconds},
                     {"turns_per_s", per_s},
                     {"accept_p50_ms", acc.p50},
                     {"accept_p90_ms", acc.p90},
                     {"accept_p99_ms", acc.p99},
                     {"p50_ms", done.p50},
                     {"p90_ms", done.p90},
                     {"p99_ms", done.p99},
                     {"max_ms", done.max},
                     {"errors", errors},
                     {"errors_by_kind", std::move(by_kind)},
                     {"load_cpu_us_per_turn", self_us},
                     {"connects", connects},
                     {"cpu_us_per_turn", nullptr},
                     {"rss_mb", nullptr},
                     {"rss_now_mb", nullptr}};
    if (polled) out["polls_per_turn"] = polls;
    if (s.mode == "ws") out["ws_events"] = s.ws_events;
    if (pid > 0 && daemon0.ok && daemon1.ok) {
        double cpu = turns > 0 ? static_cast<double>(daemon1.cpu_us - daemon0.cpu_us) / turns : 0;
        std::cout << "daemon (pid " << pid << "): " << fixed(cpu) << " cpu us/turn, rss "
                  << fixed(daemon1.rss_mb) << " MB, peak " << fixed(daemon1.hwm_mb) << " MB\n";
        out["cpu_us_per_turn"] = cpu;
        out["rss_mb"] = daemon1.hwm_mb;
        out["rss_now_mb"] = daemon1.rss_mb;
    } else if (pid > 0) {
        std::cout << "daemon (pid " << pid << "): cannot read /proc/" << pid << "\n";
    }
    std::cout << "load generator: " << fixed(self_us) << " cpu us/turn, " << connects
              << " connections made\n";
    print_json(out);
    return errors > 0 ? 1 : 0;
}

} // namespace baton::bench
