// The default implementation of each turn stage (one file per stage in pipeline/). The framework
// registers them as its first plugin, so any plugin registered later overrides them.
#pragma once

#include <baton/framework.hpp>

namespace baton::pipeline {

asio::awaitable<std::optional<std::string>> resolve_session(turn_context& ctx);
class context_cache;
asio::awaitable<std::optional<json::object>> load_state(store_runner& db, context_cache& cache,
                                                        turn_context& ctx);
asio::awaitable<std::optional<prompt>> build_prompt(turn_context& ctx);
// Takes the prompt's messages.
asio::awaitable<std::optional<model_output>> run_model(turn_context& ctx, prompt& p);
// The tool calls of one step (pipeline/run_tools.cpp): `results` (sized to the calls, in call
// order) gets each result as its call ends, so that a turn stopped meanwhile keeps those that did.
asio::awaitable<void> run_tools(turn_context& ctx, const std::vector<tool_call>& calls,
                                std::vector<std::optional<tool_result>>& results);
asio::awaitable<void> save_state(store_runner& db, context_cache& cache, turn_context& ctx);
// Idle compaction of one session (framework::compact_session).
asio::awaitable<void> compact_idle(store_runner& db, context_cache& cache, const agent& ag,
                                   const session_ref& session, metrics_registry& metrics);
asio::awaitable<std::vector<outbound>> render_outbound(turn_context& ctx);
asio::awaitable<bool> dispatch_outbound(turn_context& ctx, const outbound& item);

// Direct commands (`/help`, `/model`, `/handoff [name]`, `/reset`): the reply, or nullopt when the
// text is not one. Anchors it starts go to `anchors`.
std::optional<std::string> run_command(turn_context& ctx, std::string_view text,
                                       std::vector<tape_entry>& anchors);

} // namespace baton::pipeline
