#include "pipeline/compaction.hpp"

#include <boost/system/system_error.hpp>

#include <algorithm>
#include <cmath>

namespace baton::pipeline {

namespace {

const char* const stage_names[] = {"", "trim_tool_outputs", "drop_tool_rounds", "summarize", "handoff"};

constexpr std::string_view extract_header = "Earlier conversation (extract):";

// At most `cap` tokens of `s` (by the estimator: four ASCII bytes a token at best).
std::string clip_tokens(std::string_view s, std::int64_t cap) {
    if (cap <= 0) return {};
    std::string_view out = s;
    while (estimate_tokens(out) > cap)
        out = clip_utf8(out, out.size() * 3 / 4);
    return std::string(out);
}

// One line per message of the span, oldest first; each clipped to `line_bytes` (0: whole).
std::vector<std::string> transcript_lines(const std::vector<chat_message>& messages,
                                          const std::vector<window_item>& items, std::size_t from,
                                          std::size_t to, std::size_t line_bytes) {
    std::vector<std::string> lines;
    auto clip = [line_bytes](std::string_view s) {
        std::string_view c = line_bytes ? clip_utf8(s, line_bytes) : s;
        std::string out(c);
        if (c.size() < s.size()) out += " …";
        for (auto& ch : out)
            if (ch == '\n' || ch == '\r') ch = ' ';
        return out;
    };
    for (std::size_t i = from; i < to && i < messages.size(); ++i) {
        const auto& m = messages[i];
        switch (items[i].kind) {
        case item_kind::pinned:
            break;
        case item_kind::summary:
            lines.push_back("(summary of what came before) " + clip(m.content));
            break;
        case item_kind::message:
        case item_kind::tool_calls:
            if (!m.content.empty()) lines.push_back(m.role + ": " + clip(m.content));
            for (const auto& c : m.tool_calls)
                lines.push_back("assistant called " + c.name + "(" + clip(c.arguments) + ")");
            break;
        case item_kind::tool_result:
            lines.push_back("tool result: " + clip(m.content));
            break;
        }
    }
    return lines;
}

json::object event_data(int stage, std::int64_t before, std::int64_t after, compaction_trigger trig) {
    return {{"stage", stage_names[stage]},
            {"level", stage},
            {"before_tokens", before},
            {"after_tokens", after},
            {"trigger", trig == compaction_trigger::idle ? "idle" : "turn"}};
}

void record(const compaction_job& job, int stage, std::int64_t before, std::int64_t after,
            json::object data, std::vector<tape_entry>& out) {
    out.push_back(make_event_entry("compaction", std::move(data)));
    if (job.turn)
        job.turn->emit("compaction", json::object{{"stage", stage_names[stage]},
                                                  {"before_tokens", before},
                                                  {"after_tokens", after}});
}

// The model's summary of the span, or nullopt when it failed or said nothing.
asio::awaitable<std::optional<std::string>> model_summary(const baton::agent& ag,
                                                          std::vector<std::string> lines,
                                                          std::int64_t cap, std::int64_t room,
                                                          metrics_registry* metrics) {
    // The transcript keeps the earlier summary (at most a third of the room) and the newest lines
    // within what the request may hold; lines in between that do not fit stay in the tape only.
    std::string transcript;
    std::size_t oldest = 0;
    if (!lines.empty() && lines.front().starts_with("(summary")) {
        transcript = clip_tokens(lines.front(), room / 3) + "\n";
        room -= estimate_tokens(transcript);
        oldest = 1;
    }
    std::int64_t used = 0;
    std::size_t first = lines.size();
    while (first > oldest) {
        std::int64_t t = estimate_tokens(lines[first - 1]) + 1;
        if (used + t > room) break;
        used += t;
        --first;
    }
    for (std::size_t i = first; i < lines.size(); ++i) {
        transcript += lines[i];
        transcript += '\n';
    }
    model_request req;
    req.model = ag.config.model.model;
    req.max_tokens = std::min(cap, ag.config.model.max_output_tokens);
    req.messages.push_back(
        {"system",
         "You summarize conversations for an assistant's memory. Summarize the conversation "
         "below in at most " +
             std::to_string(std::max<std::int64_t>(cap * 3 / 4, 10)) +
             " words. Keep facts, names, numbers, decisions, open questions and what the user "
             "asked for. Plain text, no preamble.",
         {},
         {}});
    req.messages.push_back({"user", std::move(transcript), {}, {}});
    // A model call like the agent loop's (metrics: baton_model_call_duration_seconds).
    std::optional<metrics_registry::call_timer> timer;
    if (metrics) timer.emplace(*metrics);
    try {
        auto c = co_await ag.model->complete(req, [](const model_delta&) {});
        if (timer) timer->ok();
        if (c.text.empty()) co_return std::nullopt;
        co_return clip_tokens(c.text, cap);
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted) throw;
    } catch (const std::exception&) {
    }
    co_return std::nullopt;
}

// Summarises [from, to) of the window: through the model, else extractively.
asio::awaitable<std::pair<std::string, bool>> summarize(const compaction_job& job, const context_window& w,
                                                        std::size_t from, std::size_t to,
                                                        std::int64_t cap, std::int64_t room) {
    if (cap <= 0) co_return std::pair<std::string, bool>{};
    auto lines = transcript_lines(w.messages, w.items, from, to, 2000);
    if (auto s = co_await model_summary(*job.agent, std::move(lines), cap, room, job.metrics))
        co_return std::pair{std::move(*s), true};
    co_return std::pair{extractive_summary(w.messages, w.items, from, to, cap), false};
}

} // namespace

double context_budget::fraction(int stage) const {
    if (thresholds.empty()) return 1.0;
    std::size_t n = thresholds.size();
    if (stage >= 4 && n >= 4) return thresholds[3];
    std::size_t i = static_cast<std::size_t>(std::min(stage, 3) - 1);
    return thresholds[std::min(i, n - 1)];
}

std::int64_t context_budget::at(int stage) const {
    return static_cast<std::int64_t>(std::floor(fraction(stage) * static_cast<double>(tokens)));
}

std::int64_t context_budget::summary_cap() const {
    return std::clamp<std::int64_t>(tokens / 8, 16, 1000);
}

context_budget budget_of(const agent_config& cfg) {
    return {std::max<std::int64_t>(cfg.model.context_window - cfg.context.reserve_output_tokens, 1),
            cfg.context.compaction_thresholds};
}

std::int64_t estimate_with(const context_window& w, std::int64_t extra) {
    return static_cast<std::int64_t>(std::ceil(w.token_factor * static_cast<double>(w.tokens + extra)));
}

std::int64_t pinned_tokens(const context_window& w) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < w.pinned; ++i)
        n += w.items[i].tokens;
    return n;
}

std::string extractive_summary(const std::vector<chat_message>& messages,
                               const std::vector<window_item>& items, std::size_t from, std::size_t to,
                               std::int64_t cap) {
    std::string out(extract_header);
    std::int64_t room = cap - estimate_tokens(out) - 1;
    auto lines = transcript_lines(messages, items, from, to, 200);
    // A summary of earlier times keeps at most a third; the newest lines take the rest.
    std::string earlier;
    if (!lines.empty() && lines.front().starts_with("(summary")) {
        earlier = clip_tokens(lines.front(), room / 3);
        lines.erase(lines.begin());
        room -= estimate_tokens(earlier) + 1;
    }
    std::size_t first = lines.size();
    while (first > 0) {
        std::int64_t t = estimate_tokens(lines[first - 1]) + 1;
        if (t > room) break;
        room -= t;
        --first;
    }
    if (!earlier.empty()) out += "\n" + earlier;
    for (std::size_t i = first; i < lines.size(); ++i)
        out += "\n- " + lines[i];
    return out;
}

asio::awaitable<void> compact(const compaction_job& job, context_window& w, std::vector<tape_entry>& out) {
    const auto budget = budget_of(job.agent->config);
    auto estimate = [&] { return estimate_with(w, job.extra_tokens); };
    // An idle session does the work early: stages 1-3 from the first threshold on, so that its
    // next turn starts with room.
    auto mark = [&](int stage) {
        return job.trigger == compaction_trigger::idle && stage <= 3 ? budget.at(1) : budget.at(stage);
    };
    auto apply = [&](tape_entry e) {
        w.apply(e);
        out.push_back(std::move(e));
    };

    std::int64_t before = estimate();
    // Stages 1 and 2 act on everything stored so far (`through`); the event itself is the change.
    auto cut_stage = [&](int stage) {
        auto data = event_data(stage, before, 0, job.trigger);
        data["through"] = w.last_id;
        w.apply(make_event_entry("compaction", data));
        std::int64_t after = estimate();
        data["after_tokens"] = after;
        record(job, stage, before, after, std::move(data), out);
        before = after;
    };
    if (before >= mark(1) && w.has_trimmable_outputs()) cut_stage(1);
    if (before >= mark(2) && w.has_tool_rounds()) cut_stage(2);
    const double factor = w.token_factor;
    auto raw = [factor](std::int64_t t) {
        return static_cast<std::int64_t>(static_cast<double>(t) / factor);
    };
    const std::int64_t cap = budget.summary_cap();
    // What a summary request may carry: the budget less the answer and the instructions.
    const std::int64_t room = raw(budget.tokens) - cap - 80;
    const std::int64_t fixed = pinned_tokens(w) + job.extra_tokens;
    if (before >= mark(3)) {
        // Keep the newest exchanges verbatim within half of stage 1's mark, less the summary.
        std::int64_t allowance = raw(budget.at(1) / 2) - fixed - cap;
        std::size_t start = w.pinned;
        if (start < w.items.size() && w.items[start].kind == item_kind::summary) ++start;
        std::size_t cut = w.items.size();
        std::int64_t kept = 0;
        for (std::size_t i = w.items.size(); i-- > start;) {
            kept += w.items[i].tokens;
            if (kept > allowance) break;
            if (w.items[i].kind == item_kind::message && w.messages[i].role == "user") cut = i;
        }
        if (cut > start) {
            auto [text, by_model] = co_await summarize(job, w, w.pinned, cut, cap, room);
            std::int64_t from = cut < w.items.size() ? w.items[cut].id : w.last_id + 1;
            apply(make_entry(tape_kind::anchor,
                             {{"name", "compaction"}, {"summary", text}, {"from", from}}));
            std::int64_t after = estimate();
            auto data = event_data(3, before, after, job.trigger);
            data["summarizer"] = by_model ? "model" : "extractive";
            data["from"] = from;
            record(job, 3, before, after, std::move(data), out);
            before = after;
        }
    }
    if (before >= mark(4) && w.items.size() > w.pinned) {
        // Still too big: a fresh anchor, no message kept verbatim, its summary within the mark.
        std::int64_t fits = raw(budget.at(4)) - fixed - 16;
        if (fits < 16) {
            // The pinned blocks and the new message alone reach the mark, so no handoff brings
            // the context under it: while the request fits the budget, the context (with stage
            // 3's summary) stays; else the summary gets what the budget leaves.
            if (before <= budget.tokens) co_return;
            fits = raw(budget.tokens) - fixed - 16;
        }
        auto [text, by_model] =
            co_await summarize(job, w, w.pinned, w.items.size(), std::min(cap, fits), room);
        apply(make_entry(tape_kind::anchor, {{"name", "handoff"}, {"summary", text}}));
        std::int64_t after = estimate();
        auto data = event_data(4, before, after, job.trigger);
        data["summarizer"] = by_model ? "model" : "extractive";
        record(job, 4, before, after, std::move(data), out);
    }
}

} // namespace baton::pipeline
