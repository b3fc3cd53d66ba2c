#include "pipeline/context_cache.hpp"
#include "pipeline/stages.hpp"

namespace baton::pipeline {

asio::awaitable<void> save_state(store_runner& db, context_cache& cache, turn_context& ctx) {
    state_update u;
    u.session_id = ctx.session_id;
    u.turn_id = ctx.inbound.turn_id;
    u.entries = std::move(ctx.new_entries);
    u.state = ctx.session_state;
    auto save = [u = std::move(u)](store& s) mutable {
        s.save_state(u);
        return std::move(u.entries);
    };
    try {
        // The stored entries come back with their ids, for whoever reads the context after us.
        ctx.new_entries = co_await db.run(std::move(save));
    } catch (...) {
        // What the store holds is now unknown here: the next turn reads it again.
        cache.erase(ctx.session_id);
        throw;
    }
    cache.apply(ctx.session_id, ctx.new_entries, ctx.session_state);
}

} // namespace baton::pipeline
