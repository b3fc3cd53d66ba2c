// `baton-bench embedded`: baton as a library in this process, the baton side of the peer comparison
// (bench/peers/run). C sessions each run turns one after another through runtime::accept against an
// OpenAI-compatible server (the mock): a model call that asks for the `lookup` tool, the tool, a
// second model call that answers. Reports this process's CPU per turn, turns/s and peak RSS.
#include "bench/bench.hpp"
#include "bench/measure.hpp"
#include "pipeline/context_window.hpp"

#include <baton/pipeline.hpp>
#include <baton/framework.hpp>
#include <baton/http_client.hpp>
#include <baton/openai_client.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace baton::bench {

namespace {
using finished_channel =
    asio::experimental::concurrent_channel<void(boost::system::error_code, turn_record)>;

// The tool the JS peer has too: `lookup {q}` answers a short string.
std::shared_ptr<tool> make_lookup_tool() {
    tool_schema schema{"lookup", "Looks a word up and returns a short note about it.",
                       json::object{{"type", "object"},
                                    {"properties", {{"q", {{"type", "string"}}}}},
                                    {"required", json::array{"q"}},
                                    {"additionalProperties", false}}};
    tool_function fn = [](json::object args, tool_context&) -> asio::awaitable<tool_result> {
        auto* q = args.if_contains("q");
        co_return tool_result{true, "note about " +
                                        std::string(q && q->is_string() ? q->get_string() : "nothing")};
    };
    return make_function_tool(std::move(schema), std::move(fn));
}

// One session's client: sends its next message once the previous turn has finished.
struct session_client {
    session_client(asio::any_io_executor ex, std::string sid) : id(std::move(sid)), finished(ex, 1) {}
    std::string id;
    finished_channel finished; // fed by runtime::on_turn_finished
    std::int64_t sent = 0;
};

struct tally {
    std::atomic<std::int64_t> ok{0};
    std::atomic<std::int64_t> bad{0};
    std::mutex mutex;
    std::string first_problem;
    void problem(std::string what) {
        bad.fetch_add(1);
        std::lock_guard lock(mutex);
        if (first_problem.empty()) first_problem = std::move(what);
    }
};

// Runs turns while the shared counter is below `limit`; checks each one: completed in 2 steps
// (the tool call, then the answer) with a reply starting "ok:".
asio::awaitable<void> run_session(runtime& rt, session_client& s, std::atomic<std::int64_t>& next,
                                  std::int64_t limit, tally& t) {
    while (next.fetch_add(1) < limit) {
        accept_request req;
        req.session_id = s.id;
        req.channel = "bench";
        req.text = "hello from " + s.id + ", turn " + std::to_string(++s.sent);
        accept_result r = co_await rt.accept(std::move(req));
        auto* ok = (r ? &*r : nullptr);
        if (!ok) {
            t.problem("not accepted: " + r.error().message);
            continue;
        }
        turn_record rec = co_await s.finished.async_receive(asio::use_awaitable);
        if (rec.turn_id != ok->turn_id)
            t.problem("finished " + rec.turn_id + ", expected " + ok->turn_id);
        else if (rec.status != turn_status::completed || rec.steps != 2 || !rec.reply ||
                 !rec.reply->starts_with("ok:"))
            t.problem("turn " + rec.turn_id + ": status " + std::string(to_string(rec.status)) +
                      ", steps " + std::to_string(rec.steps) + ", reply " +
                      rec.reply.value_or("(none)") +
                      (rec.error ? ", error " + rec.error->code + ": " + rec.error->message : ""));
        else
            t.ok.fetch_add(1);
    }
}

// Runs `limit` turns spread over all sessions and waits for them.
void run_phase(asio::io_context& ioc, runtime& rt, std::vector<std::unique_ptr<session_client>>& clients,
               std::int64_t limit, tally& t) {
    std::atomic<std::int64_t> next{0};
    std::vector<std::future<void>> done;
    for (auto& c : clients)
        done.push_back(asio::co_spawn(asio::make_strand(ioc), run_session(rt, *c, next, limit, t),
                                      asio::use_future));
    for (auto& f : done)
        f.get();
}
} // namespace

int run_embedded(const options& opt) {
    opt.only({"--model-url", "--turns", "--clients", "--warmup", "--stream", "--threads"});
    std::string url = opt.text("--model-url", "");
    auto turns = static_cast<std::int64_t>(opt.number("--turns", 2000));
    auto clients = static_cast<int>(opt.number("--clients", 1));
    auto warmup = static_cast<std::int64_t>(opt.number("--warmup", 100));
    bool stream = opt.number("--stream", 1) != 0;
    int threads = static_cast<int>(opt.number("--threads", 2));
    if (url.empty() || turns < 1 || clients < 1 || warmup < 0 || threads < 1) {
        std::cerr << "usage: baton-bench embedded --model-url URL [--turns T] [--clients C] "
                     "[--warmup W] [--stream 0|1] [--threads N]\n";
        return 2;
    }

    asio::io_context ioc(threads);
    store_runner db{std::shared_ptr<store>(make_memory_store())};
    framework fw{db, make_default_plugin(db)};
    // As many pooled connections as sessions: no reconnects in steady state (Node's fetch pools too).
    http_client_options hopts;
    hopts.max_idle_per_endpoint = static_cast<std::size_t>(std::max(8, clients));
    auto http = std::make_shared<http_client>(ioc.get_executor(), hopts);
    agent_config cfg;
    cfg.model.provider = "openai";
    cfg.model.base_url = url;
    cfg.model.model = "mock";
    cfg.model.api_key_env = "BATON_BENCH_UNSET_KEY"; // no Authorization header
    cfg.model.stream = stream;
    cfg.model.timeout = std::chrono::seconds(10);
    cfg.instructions = {"You are a concise assistant. Use the lookup tool, then answer."};
    cfg.tools = {"lookup"};
    cfg.limits.turn_timeout = std::chrono::seconds(30);
    // One attempt: a failed call shows up as a failed turn instead of hiding in a retry.
    openai_retry_policy once;
    once.max_attempts = 1;
    fw.add_agent(agent{cfg, make_openai_model(ioc.get_executor(), cfg.model, http, once)});
    fw.tools().add(make_lookup_tool());
    // How many messages a turn's first model call carries, so that the JS side can send as many
    // (bench/peers/run passes it on): the most seen, i.e. the full context window. Counted after
    // the call from the session's window (lent to it whole) and the turn's message: a
    // before_model_call hook would make every request a copy, written afresh.
    std::atomic<std::size_t> first_call_messages{0};
    plugin probe;
    probe.name = "bench-probe";
    probe.after_model_call = [&first_call_messages](turn_context& ctx,
                                                    const chat_completion&) -> asio::awaitable<void> {
        if (ctx.progress().steps == 1 && ctx.internal.window) {
            std::size_t n = ctx.internal.window->items.size() + 1, seen = first_call_messages.load();
            while (n > seen && !first_call_messages.compare_exchange_weak(seen, n)) {
            }
        }
        co_return;
    };
    fw.register_plugin(std::move(probe));
    runtime rt(ioc.get_executor(), fw);

    std::vector<std::unique_ptr<session_client>> sessions;
    std::map<std::string, session_client*, std::less<>> by_id;
    for (int i = 0; i < clients; ++i) {
        sessions.push_back(
            std::make_unique<session_client>(ioc.get_executor(), "peer-" + std::to_string(i)));
        by_id[sessions.back()->id] = sessions.back().get();
    }
    // by_id is not modified once turns run, so the observer reads it without a lock.
    rt.on_turn_finished([&by_id](const turn_record& rec) {
        auto it = by_id.find(rec.session_id);
        if (it != by_id.end() && !it->second->finished.try_send(boost::system::error_code{}, rec))
            std::cerr << "baton-bench embedded: turn " << rec.turn_id << " finished unexpectedly\n";
    });

    auto work = asio::make_work_guard(ioc);
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
        pool.emplace_back([&] { ioc.run(); });

    tally warm, measured;
    int exit_code = 0;
    double elapsed = 0;
    double cpu_before = 0, cpu_after = 0;
    try {
        run_phase(ioc, rt, sessions, warmup, warm);
        cpu_before = self_cpu_us();
        auto start = std::chrono::steady_clock::now();
        run_phase(ioc, rt, sessions, turns, measured);
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        cpu_after = self_cpu_us();
    } catch (const std::exception& e) {
        std::cerr << "baton-bench embedded: " << e.what() << "\n";
        exit_code = 1;
    }
    work.reset();
    ioc.stop();
    for (auto& t : pool)
        t.join();
    db.stop();
    if (exit_code) return exit_code;

    std::int64_t bad = warm.bad.load() + measured.bad.load();
    if (bad > 0) {
        std::cerr << "baton-bench embedded: " << bad << " turns went wrong; first: "
                  << (measured.first_problem.empty() ? warm.first_problem : measured.first_problem)
                  << "\n";
        exit_code = 1;
    }
    double peak_rss_mb = read_proc(static_cast<int>(getpid())).hwm_mb;
    auto n = static_cast<double>(measured.ok.load());
    double cpu_per_turn = n > 0 ? (cpu_after - cpu_before) / n : 0;
    double per_s = elapsed > 0 ? n / elapsed : 0;
    // The instructions and the new user message are not history.
    std::size_t history =
        first_call_messages.load() - std::min(first_call_messages.load(), cfg.instructions.size() + 1);
    std::cout << "embedded: " << measured.ok.load() << " turns (+" << warm.ok.load() << " warm-up) in "
              << elapsed << " s, " << clients << " sessions, " << threads << " io threads, stream "
              << (stream ? "on" : "off") << "\n";
    std::cout << "cpu per turn: " << cpu_per_turn << " us, turns/s: " << per_s
              << ", peak rss: " << peak_rss_mb << " MB, history: up to " << history
              << " messages a turn\n";
    print_json({{"peer", "baton-embedded"},
                {"turns", measured.ok.load()},
                {"clients", clients},
                {"threads", threads},
                {"stream", stream},
                {"cpu_us_per_turn", cpu_per_turn},
                {"turns_per_s", per_s},
                {"rss_mb", peak_rss_mb},
                {"history_messages", history}});
    return exit_code;
}

} // namespace baton::bench
