#include <baton/framework.hpp>
#include <baton/json_text.hpp>

#include <charconv>
#include <chrono>
#include <stdexcept>

#include <boost/asio/this_coro.hpp>

namespace baton {

framework::framework(store_runner& db) : db_(db) { tools_.add(make_clock_tool()); }

framework::framework(store_runner& db, plugin defaults) : framework(db) {
    register_plugin(std::move(defaults));
}

framework::~framework() = default;

asio::awaitable<void> framework::compact_session(session_ref session, std::string agent) {
    const baton::agent* a = find_agent(agent);
    if (!a) co_return;
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it)
        if (it->compact_idle) co_await it->compact_idle(*this, *a, session);
}

asio::awaitable<void> framework::before_model_call(turn_context& ctx, model_request& req) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it)
        if (it->before_model_call) co_await it->before_model_call(ctx, req);
}

asio::awaitable<void> framework::after_model_call(turn_context& ctx, const chat_completion& c) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it)
        if (it->after_model_call) co_await it->after_model_call(ctx, c);
}

asio::awaitable<tool_decision> framework::before_tool_call(turn_context& ctx, const tool_call& call) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->before_tool_call) continue;
        auto d = co_await it->before_tool_call(ctx, call);
        if (d.action != tool_decision::kind::proceed) co_return d;
    }
    co_return tool_decision{};
}

asio::awaitable<void> framework::after_tool_call(turn_context& ctx, const tool_call& call,
                                                 tool_result& r) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it)
        if (it->after_tool_call) co_await it->after_tool_call(ctx, call, r);
}

void framework::register_plugin(plugin p) {
    if (p.before_model_call) has_before_model_call_ = true;
    if (!p.keeps_context && (p.load_state || p.build_prompt || p.run_model || p.before_model_call))
        context_hooked_ = true;
    plugins_.push_back(std::move(p));
}

void framework::add_agent(agent a) {
    auto name = a.config.name;
    agents_.insert_or_assign(std::move(name), std::move(a));
}

const agent* framework::find_agent(std::string_view name) const {
    auto it = agents_.find(name);
    return it == agents_.end() ? nullptr : &it->second;
}

void framework::report(std::string_view stage, std::exception_ptr e, const inbound& in) const {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->on_error) continue;
        // An observer that throws must not hide the turn's own error.
        try {
            it->on_error(stage, e, in);
        } catch (...) {
        }
    }
}

namespace {
// stage.started / stage.finished events (only when the turn's events are kept); the stage's
// duration goes to the metrics either way. Without events a stage starts when the one before
// ended (ctx.internal.stage_mark): one clock read per stage boundary, not two.
// A duration in milliseconds to the microsecond, written as a JSON number the way the shortest
// form of the double would be ("12", "0.5", "3.141"), from integers: cheaper than to_chars(double).
void append_ms(std::string& out, std::chrono::steady_clock::duration d) {
    auto us = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    us = us < 0 ? 0 : (us + 500) / 1000;
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, us / 1000);
    out.append(buf, r.ptr);
    if (auto frac = static_cast<int>(us % 1000)) {
        char f[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                     static_cast<char>('0' + frac % 10)};
        std::size_t n = 4;
        while (f[n - 1] == '0')
            --n;
        out.append(f, n);
    }
}

std::chrono::steady_clock::time_point stage_started(turn_context& ctx, turn_stage stage) {
    if (!ctx.emitting()) return ctx.internal.stage_mark;
    std::string data = R"({"stage":")";
    data += to_string(stage); // a plain name: nothing to escape
    data += "\"}";
    ctx.emit_text("stage.started", std::move(data));
    return std::chrono::steady_clock::now();
}

void stage_finished(turn_context& ctx, turn_stage stage, std::chrono::steady_clock::time_point started,
                    bool ok) {
    ctx.internal.stage_mark = std::chrono::steady_clock::now();
    auto elapsed = ctx.internal.stage_mark - started;
    ctx.framework->metrics().observe_stage(stage, elapsed);
    if (!ctx.emitting()) return;
    std::string data = R"({"stage":")";
    data += to_string(stage);
    data += R"(","ms":)";
    append_ms(data, elapsed);
    if (!ok) data += R"(,"ok":false)";
    data += '}';
    ctx.emit_text("stage.finished", std::move(data));
}
} // namespace

// The stage's coroutine, not started (a plain function: no frame of its own).
asio::awaitable<void> framework::stage(turn_stage s, turn_context& ctx, prompt& p) {
    switch (s) {
    case turn_stage::resolve_session: return resolve_session(ctx);
    case turn_stage::load_state: return load_state(ctx);
    case turn_stage::build_prompt: return build_prompt(ctx, p);
    case turn_stage::save_state: return save_state(ctx);
    case turn_stage::render_outbound: return render_outbound(ctx);
    case turn_stage::dispatch_outbound: return dispatch_outbound(ctx);
    case turn_stage::run_model: break; // awaited on its own: save_state follows it whatever happens
    }
    throw std::logic_error("no such stage here");
}

namespace {
// The tape's record of a failed model run.
tape_entry error_entry_of(std::exception_ptr e, const std::string& stop_reason) {
    std::string code = "internal_error", message = "run_model failed";
    try {
        std::rethrow_exception(e);
    } catch (const turn_error& e) {
        code = e.code(), message = e.what();
    } catch (const boost::system::system_error& e) {
        // The code's own message: what() would add Boost's source location for API clients.
        bool aborted = e.code() == asio::error::operation_aborted;
        code = !aborted ? "internal_error" : stop_reason.empty() ? "stopped" : stop_reason;
        message = !aborted              ? e.code().message()
                  : code == "timed_out" ? "the turn ran past turn_timeout_ms"
                                        : "the turn was stopped";
    } catch (const std::exception& e) {
        message = e.what();
    } catch (...) {
    }
    return make_error_entry(code, message);
}
} // namespace

// The end of a stage: its stage.finished event; a failure is shown to on_error and re-raised.
void framework::close_stage(turn_context& ctx, turn_stage stage, std::chrono::steady_clock::time_point started,
                            std::exception_ptr error) const {
    stage_finished(ctx, stage, started, !error);
    if (!error) return;
    report(to_string(stage), error, ctx.inbound);
    std::rethrow_exception(error);
}

asio::awaitable<void> framework::resolve_session(turn_context& ctx) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->resolve_session) continue;
        if (auto sid = co_await it->resolve_session(ctx)) {
            ctx.session_id = std::move(*sid);
            co_return;
        }
    }
    throw turn_error("internal_error", "no resolve_session hook produced a session");
}

asio::awaitable<void> framework::load_state(turn_context& ctx) {
    // Lowest priority first, so a later-registered plugin wins a key.
    json::object merged;
    for (auto& p : plugins_) {
        if (!p.load_state) continue;
        auto part = co_await p.load_state(ctx);
        if (!part) continue;
        if (merged.empty()) {
            merged = std::move(*part);
            continue;
        }
        for (auto& kv : *part)
            merged[kv.key()] = std::move(kv.value());
    }
    ctx.session_state = std::move(merged);
}

asio::awaitable<void> framework::build_prompt(turn_context& ctx, prompt& out) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->build_prompt) continue;
        if (auto p = co_await it->build_prompt(ctx)) {
            out = std::move(*p);
            co_return;
        }
    }
    throw turn_error("internal_error", "no build_prompt hook produced a prompt");
}

asio::awaitable<void> framework::run_model(turn_context& ctx, prompt& p) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->run_model) continue;
        if (auto out = co_await it->run_model(ctx, p)) {
            ctx.output = std::move(*out);
            co_return;
        }
    }
    throw turn_error("internal_error", "no run_model hook produced an output");
}

asio::awaitable<void> framework::save_state(turn_context& ctx) {
    // Every implementation runs, even after one failed; the first failure is raised afterwards.
    std::exception_ptr first;
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->save_state) continue;
        try {
            co_await it->save_state(ctx);
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
}

asio::awaitable<void> framework::render_outbound(turn_context& ctx) {
    for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
        if (!it->render_outbound) continue;
        auto items = co_await it->render_outbound(ctx);
        for (auto& item : items) {
            // The item's place among the turn's items: part of its outbox key.
            item.index = static_cast<std::int64_t>(ctx.outbox.size());
            ctx.outbox.push_back(std::move(item));
        }
    }
}

asio::awaitable<void> framework::dispatch_outbound(turn_context& ctx) {
    for (const auto& item : ctx.outbox) {
        for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
            if (!it->dispatch_outbound) continue;
            if (co_await it->dispatch_outbound(ctx, item)) break;
        }
    }
}

asio::awaitable<turn_result> framework::process_inbound(inbound in) {
    turn_context ctx;
    if (in.turn_id.empty()) in.turn_id = make_turn_id();
    if (!in.progress) in.progress = std::make_shared<turn_progress>();
    ctx.inbound = std::move(in);
    ctx.framework = this;
    ctx.agent = find_agent(ctx.inbound.agent);
    if (!ctx.agent) {
        auto e = std::make_exception_ptr(
            turn_error("invalid_request", "unknown agent: " + ctx.inbound.agent));
        report("resolve_session", e, ctx.inbound);
        std::rethrow_exception(e);
    }
    ctx.state.bind_turn_id(&ctx.inbound.turn_id);
    ctx.internal.stage_mark = std::chrono::steady_clock::now();

    // Each stage is awaited in this frame (no coroutine per guard): started, awaited, closed.
    std::exception_ptr error;
    prompt p;
    // Before run_model: a failure here ends the turn without save_state.
    for (auto s : {turn_stage::resolve_session, turn_stage::load_state, turn_stage::build_prompt}) {
        auto started = stage_started(ctx, s);
        try {
            co_await stage(s, ctx, p);
        } catch (...) {
            error = std::current_exception();
        }
        close_stage(ctx, s, started, error);
        if (s == turn_stage::resolve_session) ctx.state.bind_session_id(&ctx.session_id);
    }

    std::exception_ptr model_error;
    if (p.direct_reply) {
        ctx.direct_command = true;
        ctx.output = model_output{*p.direct_reply, 0, {}};
    } else {
        // From here on save_state runs whatever happens to the model run (the seed's finally).
        ctx.entered_run_model = true;
        auto started = stage_started(ctx, turn_stage::run_model);
        try {
            co_await run_model(ctx, p);
        } catch (...) {
            model_error = std::current_exception();
        }
        stage_finished(ctx, turn_stage::run_model, started, !model_error);
        if (model_error) {
            report("run_model", model_error, ctx.inbound);
            ctx.new_entries.push_back(error_entry_of(model_error, ctx.progress().stop_reason));
            // A cancelled turn must still be able to await its save.
            co_await asio::this_coro::reset_cancellation_state();
        }
    }

    for (auto s : {turn_stage::save_state, turn_stage::render_outbound, turn_stage::dispatch_outbound}) {
        auto started = stage_started(ctx, s);
        try {
            co_await stage(s, ctx, p);
        } catch (...) {
            error = std::current_exception();
        }
        if (model_error) {
            // The save's own failure is reported; the model's is the turn's.
            try {
                close_stage(ctx, s, started, error);
            } catch (...) {
            }
            std::rethrow_exception(model_error);
        }
        close_stage(ctx, s, started, error);
    }

    turn_result r;
    r.turn_id = ctx.inbound.turn_id;
    r.session_id = ctx.session_id;
    r.reply = std::move(ctx.output.reply);
    r.refusal = ctx.output.refusal;
    r.steps = ctx.output.steps;
    r.usage = ctx.output.usage;
    r.status = ctx.output.status;
    r.direct_command = ctx.direct_command;
    co_return r;
}

} // namespace baton
