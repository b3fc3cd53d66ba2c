#include "pipeline/compaction.hpp"
#include "pipeline/stages.hpp"

#include <baton/command.hpp>

namespace baton::pipeline {

namespace {
tape_entry make_anchor(std::string_view name, std::string_view summary) {
    return make_entry(tape_kind::anchor, {{"name", name}, {"summary", summary}});
}

// What a handoff carries over: an extractive summary of the window (a command never calls the
// model).
std::string handoff_summary(const turn_context& ctx) {
    const auto& w = ctx.internal.window;
    if (!w || ctx.history.size() != w->items.size() || w->items.size() <= w->pinned) return {};
    return extractive_summary(ctx.history, w->items, w->pinned, w->items.size(),
                              budget_of(ctx.agent->config).summary_cap());
}
} // namespace

std::optional<std::string> run_command(turn_context& ctx, std::string_view text,
                                       std::vector<tape_entry>& anchors) {
    auto command = parse_command(text);
    if (!command) return std::nullopt;
    auto [word, arg] = *command;

    if (word == "/help")
        return std::string("commands: /help (this list), /model (the agent's model), "
                           "/handoff [name] (a new context anchor carrying a summary), /reset (a new anchor, "
                           "no summary), "
                           "/stop (stop the running turn)");
    if (word == "/model") {
        const auto& m = ctx.agent->config.model;
        // A client of the program's own (add_agent with a model) is named by itself: the config's
        // provider and model then describe nothing that runs.
        const std::string client = ctx.agent->model ? ctx.agent->model->name() : m.provider;
        if (client != m.provider) return "agent " + ctx.agent->config.name + " uses " + client;
        return "agent " + ctx.agent->config.name + " uses " + m.provider + ":" + m.model;
    }
    if (word == "/handoff") {
        std::string name = arg.empty() ? std::string("handoff") : std::string(arg);
        anchors.push_back(make_anchor(name, handoff_summary(ctx)));
        return "handed off to a new anchor: " + name;
    }
    if (word == "/stop")
        return std::string("stop requested: the turn this session was running, if any, ends stopped");
    if (word == "/reset") {
        anchors.push_back(make_anchor("reset", ""));
        return std::string("context reset; the tape keeps the history");
    }
    return std::nullopt;
}

} // namespace baton::pipeline
