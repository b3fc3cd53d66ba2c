#include "pipeline/stages.hpp"

namespace baton::pipeline {

asio::awaitable<std::optional<prompt>> build_prompt(turn_context& ctx) {
    const std::string& text = ctx.inbound.text;
    ctx.new_entries.push_back(make_message("user", text));
    prompt p;
    // A command's anchor goes after its reply, so the next context starts clean.
    std::vector<tape_entry> anchors;
    if (auto reply = run_command(ctx, text, anchors)) {
        ctx.new_entries.push_back(make_message("assistant", *reply));
        for (auto& a : anchors)
            ctx.new_entries.push_back(std::move(a));
        p.direct_reply = std::move(*reply);
        co_return p;
    }
    // Pinned instructions first, then the window since the last anchor, then the new message.
    for (const auto& block : ctx.agent->config.instructions)
        p.messages.push_back({"system", block});
    p.messages.reserve(ctx.agent->config.instructions.size() + ctx.history.size() + 1);
    for (auto& m : ctx.history)
        p.messages.push_back(std::move(m));
    ctx.history.clear();
    p.messages.push_back({"user", text});
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
