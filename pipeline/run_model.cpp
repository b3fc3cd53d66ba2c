// The agent loop: call the model, run the tools it asks for, feed back the observations and
// repeat, until it answers in text or the step limiter stops it. Time limits and cancellation
// reach it through the awaiting coroutine's cancellation slot (see runtime.cpp).
#include "pipeline/stages.hpp"

#include <boost/system/system_error.hpp>

namespace baton::pipeline {

namespace {
// Cuts at a UTF-8 character boundary at or below `max` bytes.
std::string clip_utf8(std::string s, std::size_t max) {
    if (s.size() <= max) return s;
    std::size_t end = max;
    while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80)
        --end;
    s.resize(end);
    return s;
}

// Admission mode `steer`: messages that arrived meanwhile join the conversation at a step
// boundary. True when there were any (the loop then takes another step).
bool take_steering(turn_context& ctx, model_request& req) {
    auto& take = ctx.progress().take_steering;
    if (!take) return false;
    auto steered = take();
    for (auto& m : steered) {
        auto entry = make_message("user", m.text);
        entry.turn_id = m.turn_id;
        ctx.new_entries.push_back(std::move(entry));
        req.messages.push_back({"user", std::move(m.text), {}, {}});
    }
    return !steered.empty();
}

json::object usage_json(const chat_completion& c) {
    return {{"prompt_tokens", c.prompt_tokens}, {"completion_tokens", c.completion_tokens}};
}

// Streamed text goes to the turn's progress as it arrives, so a stopped turn keeps it.
asio::awaitable<chat_completion> call_model(turn_context& ctx, const model_request& req) {
    auto& progress = ctx.progress();
    progress.reply.clear();
    delta_handler on_delta = [&progress, &ctx](std::string_view piece) {
        progress.reply.append(piece);
        ctx.emit("model.delta", json::object{{"text", piece}});
    };
    try {
        co_return co_await ctx.agent->model->complete(req, on_delta);
    } catch (const turn_error&) {
        throw;
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted) throw;
        throw turn_error("model_error", e.what());
    } catch (const std::exception& e) {
        throw turn_error("model_error", e.what());
    }
}
} // namespace

asio::awaitable<std::optional<model_output>> run_model(turn_context& ctx, prompt& p) {
    const auto& cfg = ctx.agent->config;
    auto& progress = ctx.progress();
    model_request req;
    req.model = cfg.model.model;
    req.messages = std::move(p.messages);
    req.max_tokens = cfg.model.max_output_tokens;
    req.tools = ctx.framework->tools().schemas(cfg.tools);

    model_output out;
    for (std::int64_t step = 1;; ++step) {
        if (step > cfg.limits.max_steps) {
            out.status = turn_status::step_limit;
            ctx.new_entries.push_back(
                make_event_entry("step_limit", json::object{{"max_steps", cfg.limits.max_steps}}));
            break;
        }
        chat_completion c;
        ctx.emit("model.call", json::object{{"step", step}});
        if (ctx.framework->has_before_model_call()) {
            // Hooks may edit the request of this step, not the conversation.
            model_request call = req;
            co_await ctx.framework->before_model_call(ctx, call);
            c = co_await call_model(ctx, call);
        } else {
            c = co_await call_model(ctx, req);
        }
        out.steps = progress.steps = step;
        out.usage.prompt_tokens += c.prompt_tokens;
        out.usage.completion_tokens += c.completion_tokens;
        progress.usage = out.usage;
        if (ctx.emitting())
            ctx.emit("model.result", json::object{{"step", step},
                                                  {"finish_reason", c.finish_reason},
                                                  {"usage", usage_json(c)}});
        co_await ctx.framework->after_model_call(ctx, c);

        if (!c.text.empty() || c.tool_calls.empty()) {
            out.reply =
                clip_utf8(std::move(c.text), static_cast<std::size_t>(cfg.limits.max_reply_bytes));
            progress.reply = out.reply;
        }
        if (c.tool_calls.empty()) {
            ctx.new_entries.push_back(make_message("assistant", out.reply));
            if (!progress.take_steering) break;
            req.messages.push_back({"assistant", out.reply, {}, {}});
            if (take_steering(ctx, req)) continue;
            break;
        }
        // The model asked for tools: record the calls, run them, feed the observations back.
        if (!out.reply.empty()) ctx.new_entries.push_back(make_message("assistant", out.reply));
        chat_message asked{"assistant", out.reply, c.tool_calls, {}};
        req.messages.push_back(std::move(asked));
        for (const auto& call_item : c.tool_calls) {
            ctx.emit("tool.call", json::object{{"step", step},
                                               {"call_id", call_item.id},
                                               {"name", call_item.name},
                                               {"arguments", call_item.arguments}});
            ctx.new_entries.push_back(
                make_entry(tape_kind::tool_call, {{"call_id", call_item.id},
                                                  {"name", call_item.name},
                                                  {"arguments", call_item.arguments}}));
        }
        auto results = co_await run_tools(ctx, c.tool_calls);
        for (std::size_t i = 0; i < results.size(); ++i) {
            const auto& call_item = c.tool_calls[i];
            ctx.emit("tool.result", json::object{{"call_id", call_item.id},
                                                 {"ok", results[i].ok},
                                                 {"output", results[i].output}});
            ctx.new_entries.push_back(make_entry(
                tape_kind::tool_result,
                {{"call_id", call_item.id}, {"ok", results[i].ok}, {"output", results[i].output}}));
            req.messages.push_back({"tool", results[i].output, {}, call_item.id});
        }
        take_steering(ctx, req);
    }
    co_return out;
}

} // namespace baton::pipeline
