#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton::pipeline {

namespace {
struct loaded {
    json::object state;
    std::vector<tape_entry> entries;
};
} // namespace

asio::awaitable<std::optional<json::object>> load_state(store_runner& db, context_cache& cache,
                                                        turn_context& ctx) {
    json::object state;
    auto session = ctx.session();
    auto w = cache.lend(session.key(), state);
    if (!w) {
        // Not cached: one trip to the store for the state and the window's entries.
        auto load = [sid = std::move(session)](store& s) {
            loaded l;
            if (auto rec = s.get_session(sid)) l.state = std::move(rec->state);
            l.entries = read_context_entries(s, sid);
            return l;
        };
        loaded l = co_await db.run(std::move(load));
        state = std::move(l.state);
        w = std::make_shared<context_window>();
        w->set_pinned(ctx.agent->config.name, ctx.agent->config.instructions);
        for (const auto& e : l.entries)
            w->add(e);
    }
    w->set_pinned(ctx.agent->config.name, ctx.agent->config.instructions);
    if (w->tool_tokens < 0) {
        const auto& tools = ctx.agent->config.tools;
        w->tool_tokens = tools.empty() ? 0 : estimate_tokens(ctx.framework->tools().schemas(tools));
    }
    ctx.history = std::exchange(w->messages, {});
    ctx.internal.window = std::move(w);
    co_return state;
}

} // namespace baton::pipeline
