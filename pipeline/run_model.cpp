// The agent loop: call the model, run the tools it asks for, feed back the observations and
// repeat, until it answers in text or the step limiter stops it. Time limits and cancellation
// reach it through the awaiting coroutine's cancellation slot (see runtime.cpp).
#include "pipeline/compaction.hpp"
#include "pipeline/stages.hpp"

#include <baton/json_text.hpp>

#include <boost/system/system_error.hpp>

namespace baton::pipeline {

namespace {
// Cuts a reply at a UTF-8 character boundary at or below `max` bytes.
std::string clip_reply(std::string s, std::size_t max) {
    s.resize(clip_utf8(s, max).size());
    return s;
}

// The request's raw token estimate, kept as the loop appends to it.
struct request_budget {
    std::int64_t raw = 0;   // the whole request, estimated
    std::int64_t added = 0; // of which this turn's steps added (tool outputs, answers)
    std::int64_t limit = 0; // the context budget
    double factor = 1.0;
    std::size_t own_from = 0; // messages from here on are this turn's (never lent)

    void add(const chat_message& m) {
        auto t = estimate_tokens(m);
        raw += t;
        added += t;
    }
    // The learned factor scales what the prompt started with; what the steps add counts at least
    // at face value, so a factor learned on other content cannot let a big tool output through.
    std::int64_t estimate() const {
        return static_cast<std::int64_t>(factor * static_cast<double>(raw - added) +
                                         std::max(factor, 1.0) * static_cast<double>(added));
    }
    // A step's request must fit the window: this turn's large tool outputs become previews; if
    // it still does not fit, the turn fails rather than send it.
    void fit(model_request& req, const std::string& turn_id) {
        if (estimate() <= limit) return;
        for (std::size_t i = own_from; i < req.messages.size(); ++i) {
            auto& m = req.messages[i];
            if (m.role != "tool" || m.content.size() <= trim_above_bytes) continue;
            auto before = estimate_tokens(m);
            m.content = tool_output_preview(m.content, "the tape (turn " + turn_id + ", tool call " +
                                                           m.tool_call_id + ")");
            auto after = estimate_tokens(m);
            raw += after - before;
            added += after - before;
        }
        if (estimate() > limit)
            throw turn_error("context_overflow", "the next model request would need about " +
                                                     std::to_string(estimate()) +
                                                     " tokens; the context budget is " +
                                                     std::to_string(limit));
    }
};

// Admission mode `steer`: messages that arrived meanwhile join the conversation at a step
// boundary. True when there were any (the loop then takes another step).
asio::awaitable<bool> take_steering(turn_context& ctx, model_request& req, request_budget& budget) {
    auto& take = ctx.progress().take_steering;
    if (!take) co_return false;
    auto steered = co_await take();
    for (auto& m : steered) {
        auto entry = make_message("user", m.text);
        entry.turn_id = m.turn_id;
        ctx.new_entries.push_back(std::move(entry));
        req.messages.push_back({"user", m.text, {}, {}});
        budget.add(req.messages.back());
        ctx.steered.push_back(std::move(m));
    }
    co_return !steered.empty();
}

// The tape's record of an assistant step: its text and, when it had any, its reasoning as the
// provider sent it ({text, field, details}), kept for reading back, not for later turns' context.
tape_entry assistant_entry(std::string_view text, const chat_completion& c) {
    auto entry = make_message("assistant", text);
    if (c.reasoning.empty()) return entry;
    json::object r{{"text", c.reasoning.text}};
    if (!c.reasoning.field.empty()) r["field"] = c.reasoning.field;
    if (!c.reasoning.details.empty()) r["details"] = c.reasoning.details;
    entry.payload["reasoning"] = std::move(r);
    return entry;
}

json::object usage_json(const chat_completion& c) {
    return {{"prompt_tokens", c.prompt_tokens}, {"completion_tokens", c.completion_tokens}};
}

// Streamed text goes to the turn's progress as it arrives, so a stopped turn keeps it, cut at
// limits.max_reply_bytes as a completed reply is (a stream cut short after megabytes of text left
// them all in the record: found by a new-user check); reasoning goes to the live events only
// (model.reasoning), never into the reply.
asio::awaitable<chat_completion> call_model(turn_context& ctx, const model_request& req) {
    auto& progress = ctx.progress();
    progress.reply.clear();
    const auto max_reply = static_cast<std::size_t>(ctx.agent->config.limits.max_reply_bytes);
    bool reply_full = false; // cut: what comes later is not kept (the cut may be short of max)
    delta_handler on_delta = [&progress, &ctx, max_reply, &reply_full](const model_delta& d) {
        if (!reply_full && !d.text.empty()) {
            progress.reply.append(d.text);
            if (progress.reply.size() > max_reply) {
                progress.reply = clip_reply(std::move(progress.reply), max_reply);
                reply_full = true;
            }
        }
        if (!ctx.emitting()) return;
        auto emit = [&ctx](const char* type, std::string_view piece) {
            if (piece.empty()) return;
            std::string data = R"({"text":)";
            append_json_string(data, piece);
            data += '}';
            ctx.emit_text(type, std::move(data));
        };
        emit("model.reasoning", d.reasoning);
        emit("model.delta", d.text);
    };
    // One observation per call (metrics): ok when it answered, error however else it ended.
    metrics_registry::call_timer timer(ctx.framework->metrics());
    try {
        auto c = co_await ctx.agent->model->complete(req, on_delta);
        timer.ok();
        co_return c;
    } catch (const turn_error&) {
        throw;
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted) throw;
        throw turn_error("model_error", e.what());
    } catch (const std::exception& e) {
        throw turn_error("model_error", e.what());
    }
}
// The loop itself: steps until a text answer or the step limit.
asio::awaitable<model_output> agent_loop(turn_context& ctx, model_request& req, request_budget& budget) {
    const auto& cfg = ctx.agent->config;
    auto& progress = ctx.progress();
    model_output out;
    for (std::int64_t step = 1;; ++step) {
        if (step > cfg.limits.max_steps) {
            out.status = turn_status::step_limit;
            ctx.new_entries.push_back(
                make_event_entry("step_limit", json::object{{"max_steps", cfg.limits.max_steps}}));
            break;
        }
        budget.fit(req, ctx.inbound.turn_id);
        // The session's context, unchanged since it was lent, is sent as the window wrote it.
        if (ctx.internal.window && ctx.framework->context_reaches_model_unchanged() &&
            ctx.agent->model->reads_encoded_messages()) {
            req.encoded = ctx.internal.window->encode(req.messages);
            req.encoded_count = req.encoded.empty() ? 0 : ctx.internal.window->items.size();
        }
        chat_completion c;
        // A step counts once its call began: a turn stopped or failed in it reports it.
        progress.steps = step;
        if (ctx.emitting()) ctx.emit_text("model.call", R"({"step":)" + std::to_string(step) + "}");
        if (ctx.framework->has_before_model_call()) {
            // Hooks may edit the request of this step, not the conversation.
            model_request call = req;
            co_await ctx.framework->before_model_call(ctx, call);
            c = co_await call_model(ctx, call);
        } else {
            c = co_await call_model(ctx, req);
        }
        if (ctx.internal.window) ctx.internal.window->learn(c.prompt_tokens, budget.raw);
        out.steps = step; // progress.steps was set as the call began
        out.usage.prompt_tokens += c.prompt_tokens;
        out.usage.completion_tokens += c.completion_tokens;
        progress.usage = out.usage;
        if (ctx.emitting())
            ctx.emit("model.result", json::object{{"step", step},
                                                  {"finish_reason", c.finish_reason},
                                                  {"usage", usage_json(c)}});
        co_await ctx.framework->after_model_call(ctx, c);

        const bool spoke = !c.text.empty();
        if (spoke || c.tool_calls.empty()) {
            out.reply =
                clip_reply(std::move(c.text), static_cast<std::size_t>(cfg.limits.max_reply_bytes));
            out.refusal = c.refusal;
            progress.reply = out.reply;
        }
        const bool last = step == cfg.limits.max_steps;
        if (c.tool_calls.empty()) {
            ctx.new_entries.push_back(assistant_entry(out.reply, c));
            // After the last step's answer there is no step left to steer into: messages that
            // came meanwhile run as their own turn.
            if (!progress.take_steering || last) break;
            req.messages.push_back(assistant_message(out.reply, c));
            budget.add(req.messages.back());
            if (co_await take_steering(ctx, req, budget)) continue;
            break;
        }
        // The model asked for tools: record the calls, run them, feed the observations back. The
        // text of this step goes with them (a step with none repeats no earlier one), and so does
        // its reasoning, which thinking modes need back in the next request.
        std::string said = spoke ? out.reply : std::string();
        if (!said.empty() || !c.reasoning.empty()) ctx.new_entries.push_back(assistant_entry(said, c));
        req.messages.push_back(assistant_message(std::move(said), c));
        budget.add(req.messages.back());
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
        // Every call on the tape gets its result, whatever happens: a request holding a call
        // without one is refused by OpenAI-compatible servers, and every later turn of the
        // session would send it.
        auto record_result = [&](const tool_call& call_item, bool ok, std::string_view output) {
            ctx.emit("tool.result",
                     json::object{{"call_id", call_item.id}, {"ok", ok}, {"output", output}});
            ctx.new_entries.push_back(make_entry(
                tape_kind::tool_result, {{"call_id", call_item.id}, {"ok", ok}, {"output", output}}));
        };
        std::vector<std::optional<tool_result>> results;
        // Those without a result (not run, or cut off) get one saying why.
        auto unanswered = [&](std::string_view why) {
            for (std::size_t i = 0; i < c.tool_calls.size(); ++i) {
                if (i < results.size() && results[i])
                    record_result(c.tool_calls[i], results[i]->ok, results[i]->output);
                else
                    record_result(c.tool_calls[i], false, why);
            }
        };
        if (last) {
            // No step is left to read the results: the calls are not run (their side effects
            // would be for nothing), and the turn ends step_limit. Messages that came meanwhile
            // run as their own turn.
            unanswered("not run: the turn reached its step limit (limits.max_steps " +
                       std::to_string(cfg.limits.max_steps) + ")");
            continue;
        }
        try {
            co_await run_tools(ctx, c.tool_calls, results);
        } catch (...) {
            // Stopped, timed out, or a tool that threw: the turn ends here, keeping the results
            // of the calls that ended.
            unanswered("no result: the turn ended before the call returned");
            throw;
        }
        for (std::size_t i = 0; i < results.size(); ++i) {
            const auto& call_item = c.tool_calls[i];
            record_result(call_item, results[i]->ok, results[i]->output);
            req.messages.push_back({"tool", results[i]->output, {}, call_item.id});
            budget.add(req.messages.back());
        }
        co_await take_steering(ctx, req, budget);
    }
    co_return out;
}

} // namespace

asio::awaitable<std::optional<model_output>> run_model(turn_context& ctx, prompt& p) {
    const auto& cfg = ctx.agent->config;
    model_request req;
    req.model = cfg.model.model;
    req.messages = std::move(p.messages);
    req.max_tokens = cfg.model.max_output_tokens;
    req.tools = ctx.framework->tools().schemas(cfg.tools);

    request_budget budget;
    budget.limit = budget_of(cfg).tokens;
    budget.own_from = p.lent;
    if (ctx.internal.window) budget.factor = ctx.internal.window->token_factor;
    if (p.estimated_tokens > 0) {
        budget.raw = p.estimated_tokens;
    } else {
        for (const auto& m : req.messages)
            budget.add(m);
        budget.raw += estimate_tokens(req.tools);
    }
    // The window lent to the prompt goes back to the turn, whatever happens here.
    auto hand_back = [&] {
        if (p.lent > 0) ctx.history = std::move(req.messages);
    };
    std::optional<model_output> out;
    try {
        out = co_await agent_loop(ctx, req, budget);
    } catch (...) {
        hand_back();
        throw;
    }
    hand_back();
    co_return out;
}

} // namespace baton::pipeline
