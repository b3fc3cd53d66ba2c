#include "pipeline/stages.hpp"

namespace baton::pipeline {

asio::awaitable<void> save_state(store_runner& db, turn_context& ctx) {
    state_update u;
    u.session_id = ctx.session_id;
    u.turn_id = ctx.inbound.turn_id;
    u.entries = std::move(ctx.new_entries);
    u.state = ctx.session_state;
    auto save = [u = std::move(u)](store& s) mutable {
        s.save_state(u);
        return std::move(u.entries);
    };
    // The stored entries come back with their ids, for whoever reads the context after us.
    ctx.new_entries = co_await db.run(std::move(save));
}

} // namespace baton::pipeline
