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
    for (const auto& block : ctx.agent->config.instructions)
        p.messages.push_back({"system", block});
    for (const auto& e : ctx.history) {
        if (e.kind == tape_kind::anchor) {
            auto* summary = e.payload.if_contains("summary");
            if (summary && summary->is_string() && !summary->get_string().empty())
                p.messages.push_back({"system", std::string(summary->get_string())});
            continue;
        }
        if (e.kind != tape_kind::message) continue;
        auto* role = e.payload.if_contains("role");
        auto* body = e.payload.if_contains("text");
        if (role && role->is_string() && body && body->is_string())
            p.messages.push_back({std::string(role->get_string()), std::string(body->get_string())});
    }
    p.messages.push_back({"user", text});
    co_return p;
}

} // namespace baton::pipeline
