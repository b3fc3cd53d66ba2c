// Budgeted context (docs/design.md "Context and compaction"): the budget is the model's context window
// less the tokens reserved for its answer. As a prompt's estimate crosses each
// `compaction_thresholds` fraction of it, progressively stronger stages apply to the session's
// window: (1) trim large tool outputs to previews, (2) drop older tool round-trips, (3) summarise
// older messages into an anchor through the model (an extractive summary when the model fails),
// (4) hand off to a fresh anchor. Every stage is written to the tape (an `event`, and an `anchor`
// for 3 and 4), so the window stays a function of the tape and nothing is deleted. An idle
// session (the runtime's timer) runs stages 1-3 from the first threshold on.
#pragma once

#include "pipeline/context_window.hpp"

#include <baton/framework.hpp>

#include <boost/asio/awaitable.hpp>

#include <optional>
#include <string>
#include <span>
#include <vector>

namespace baton::pipeline {

struct context_budget {
    std::int64_t tokens = 0; // context_window - reserve_output_tokens
    std::span<const double> thresholds; // the agent config's, which outlives the budget
    // The fraction at which stage 1-4 applies: thresholds[0..2] (the last one repeats when fewer
    // are given); stage 4 at thresholds[3] when given, else at stage 3's.
    double fraction(int stage) const;
    std::int64_t at(int stage) const;
    // The most a summary may take.
    std::int64_t summary_cap() const;
};
context_budget budget_of(const agent_config& cfg);

enum class compaction_trigger { turn, idle };

// What compaction needs to know besides the window.
struct compaction_job {
    const baton::agent* agent = nullptr;
    std::int64_t extra_tokens = 0; // the new message(s) and tool schemas, estimated
    compaction_trigger trigger = compaction_trigger::turn;
    turn_context* turn = nullptr; // for `compaction` turn events; null when idle
    metrics_registry* metrics = nullptr; // where the summary call is counted (model calls)
};

// Runs the stages the estimate calls for on `w` (its messages present), appending the entries
// it writes to `out` (not yet stored). Only cancellation escapes; a failed summary call falls
// back to the extractive summary.
asio::awaitable<void> compact(const compaction_job& job, context_window& w, std::vector<tape_entry>& out);

// The factor-adjusted estimate of a prompt made of the window plus `extra` raw tokens.
std::int64_t estimate_with(const context_window& w, std::int64_t extra);
// Pinned blocks' raw tokens.
std::int64_t pinned_tokens(const context_window& w);

// A deterministic summary of messages [from, to) of a window (`messages` may be lent out, hence
// separate), at most `cap` tokens; starts "Earlier conversation (extract):".
std::string extractive_summary(const std::vector<chat_message>& messages,
                               const std::vector<window_item>& items, std::size_t from, std::size_t to,
                               std::int64_t cap);

} // namespace baton::pipeline
