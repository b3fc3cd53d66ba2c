#include "pipeline/compaction.hpp"
#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton::pipeline {

namespace {
// Takes the lent window back from the turn; null when the turn did not give it back whole (a
// plugin took the prompt's messages): then the next turn rebuilds it from the store.
std::shared_ptr<context_window> reclaim(turn_context& ctx) {
    auto w = std::move(ctx.internal.window);
    if (!w || ctx.history.size() < w->items.size()) return nullptr;
    // What follows the window in a handed-back request is this turn's, re-added from its entries.
    ctx.history.resize(w->items.size());
    w->messages = std::move(ctx.history);
    ctx.history.clear();
    return w;
}

// Tells the runtime when the session's window is big enough to compact while it is idle.
void report_idle_due(const agent& ag, framework* fw, const session_ref& session,
                     const context_window& w) {
    const auto& cfg = ag.config;
    if (!fw || !fw->on_compaction_due || cfg.context.idle_compaction_after.count() <= 0) return;
    if (estimate_with(w, w.tool_tokens) < budget_of(cfg).at(1)) return;
    fw->on_compaction_due(session, cfg.name, cfg.context.idle_compaction_after);
}

asio::awaitable<std::vector<tape_entry>> store_entries(store_runner& db, state_update u) {
    auto save = [u = std::move(u)](store& s) mutable {
        s.save_state(u);
        return std::move(u.entries);
    };
    co_return co_await db.run(std::move(save));
}
} // namespace

asio::awaitable<void> save_state(store_runner& db, context_cache& cache, turn_context& ctx) {
    auto w = reclaim(ctx);
    auto key = ctx.session().key();
    state_update u;
    u.tenant = ctx.inbound.tenant;
    u.session_id = ctx.session_id;
    u.turn_id = ctx.inbound.turn_id;
    u.entries = std::move(ctx.new_entries);
    u.state = ctx.session_state;
    if (ctx.inbound.progress && ctx.inbound.progress->deferred) {
        // Written with the turn's end, in its transaction; the window goes back to the cache once
        // the entries have their ids.
        auto& p = *ctx.inbound.progress;
        p.end.state = std::move(u);
        p.after_end.push_back([&cache, key, w = std::move(w), ag = ctx.agent, fw = ctx.framework,
                               session = ctx.session()](bool stored, const turn_end& end,
                                                        const std::vector<outbox_item>&) mutable {
            if (!stored || !w || !end.state) {
                cache.erase(key);
                return;
            }
            auto kept = w;
            const auto& st = end.state->state;
            cache.give_back(key, std::move(w), end.state->entries, st ? &*st : nullptr);
            report_idle_due(*ag, fw, session, *kept);
        });
        co_return;
    }
    try {
        // The stored entries come back with their ids, for whoever reads the context after us.
        ctx.new_entries = co_await store_entries(db, std::move(u));
    } catch (...) {
        // What the store holds is now unknown here: the next turn reads it again.
        cache.erase(key);
        throw;
    }
    if (!w) {
        cache.erase(key);
        co_return;
    }
    auto kept = w;
    cache.give_back(key, std::move(w), ctx.new_entries, &ctx.session_state);
    report_idle_due(*ctx.agent, ctx.framework, ctx.session(), *kept);
}

asio::awaitable<void> compact_idle(store_runner& db, context_cache& cache, const agent& ag,
                                   const session_ref& session, metrics_registry& metrics) {
    json::object state;
    auto key = session.key();
    auto w = cache.lend(key, state);
    if (!w) co_return; // not in memory (evicted, or a turn failed): the next turn compacts
    std::vector<tape_entry> entries;
    try {
        co_await compact({&ag, std::max<std::int64_t>(w->tool_tokens, 0), compaction_trigger::idle,
                          nullptr, &metrics},
                         *w, entries);
        if (!entries.empty()) {
            state_update u;
            u.tenant = session.tenant;
            u.session_id = session.id;
            u.entries = std::move(entries);
            entries = co_await store_entries(db, std::move(u));
        }
    } catch (...) {
        cache.erase(key);
        throw;
    }
    cache.give_back(key, std::move(w), entries, nullptr);
}

} // namespace baton::pipeline
