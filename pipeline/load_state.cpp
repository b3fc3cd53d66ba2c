#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton::pipeline {

namespace {
struct loaded {
    json::object state;
    std::vector<tape_entry> tail;
};
} // namespace

asio::awaitable<std::optional<json::object>> load_state(store_runner& db, context_cache& cache,
                                                        turn_context& ctx) {
    json::object state;
    if (cache.get(ctx.session_id, state, ctx.history)) co_return state;
    // Not cached: one trip to the store for both the state and the tape's tail.
    auto load = [sid = ctx.session_id](store& s) {
        loaded l;
        if (auto rec = s.get_session(sid)) l.state = std::move(rec->state);
        l.tail = s.tape_tail(sid, history_window);
        return l;
    };
    loaded l = co_await db.run(std::move(load));
    auto w = cache.render(l.tail);
    ctx.history.assign(w.messages.begin(), w.messages.end());
    cache.put(ctx.session_id, l.state, std::move(w));
    co_return std::move(l.state);
}

} // namespace baton::pipeline
