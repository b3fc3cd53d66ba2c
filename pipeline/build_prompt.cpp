#include "pipeline/compaction.hpp"
#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton::pipeline {

namespace {
// The raw estimate of what a turn adds to its window: its message(s), the tool schemas, priming.
std::int64_t turn_tokens(turn_context& ctx) {
    std::int64_t n = estimate_tokens(chat_message{"user", ctx.inbound.text, {}, {}}) + 3;
    for (const auto& m : ctx.inbound.collected)
        n += estimate_tokens(chat_message{"user", m.text, {}, {}});
    if (ctx.internal.window) n += ctx.internal.window->tool_tokens;
    return n;
}
} // namespace

asio::awaitable<std::optional<prompt>> build_prompt(turn_context& ctx) {
    const std::string& text = ctx.inbound.text;
    prompt p;
    // A command's anchor goes after its reply, so the next context starts clean.
    std::vector<tape_entry> anchors;
    if (auto reply = run_command(ctx, text, anchors)) {
        ctx.new_entries.push_back(make_message("user", text));
        ctx.new_entries.push_back(make_message("assistant", *reply));
        for (auto& a : anchors)
            ctx.new_entries.push_back(std::move(a));
        p.direct_reply = std::move(*reply);
        co_return p;
    }
    auto w = ctx.internal.window;
    if (!w) {
        // A plugin's load_state made the history: no budget bookkeeping to go by.
        ctx.new_entries.push_back(make_message("user", text));
        for (const auto& block : ctx.agent->config.instructions)
            p.messages.push_back({"system", block, {}, {}});
        for (auto& m : ctx.history)
            p.messages.push_back(std::move(m));
        ctx.history.clear();
    } else {
        const auto budget = budget_of(ctx.agent->config);
        const std::int64_t extra = turn_tokens(ctx);
        // Pinned blocks and the message itself are never cut: when they alone do not fit, no
        // request is sent.
        std::int64_t least = static_cast<std::int64_t>(
            w->token_factor * static_cast<double>(pinned_tokens(*w) + extra));
        if (least > budget.tokens)
            throw turn_error("context_overflow",
                             "the agent's instructions and this message need about " + std::to_string(least) +
                                 " tokens; the context budget is " + std::to_string(budget.tokens) +
                                 " (model.context_window less context.reserve_output_tokens)");
        w->messages = std::move(ctx.history);
        ctx.history.clear();
        w->close_open_calls();
        // Compaction's entries come before the message: they describe the context it joins.
        co_await compact({ctx.agent, extra, compaction_trigger::turn, &ctx, &ctx.framework->metrics()},
                         *w, ctx.new_entries);
        ctx.new_entries.push_back(make_message("user", text));
        p.messages = std::exchange(w->messages, {});
        p.lent = p.messages.size();
        p.estimated_tokens = w->tokens + extra;
    }
    p.messages.push_back({"user", text, {}, {}});
    // Admission mode `collect`: the messages queued behind this one are answered together.
    for (const auto& m : ctx.inbound.collected) {
        auto entry = make_message("user", m.text);
        entry.turn_id = m.turn_id;
        ctx.new_entries.push_back(std::move(entry));
        p.messages.push_back({"user", m.text, {}, {}});
    }
    co_return p;
}

} // namespace baton::pipeline
