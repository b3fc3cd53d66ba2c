#include "pipeline/stages.hpp"

#include <algorithm>

namespace baton::pipeline {

namespace {
struct loaded {
    json::object state;
    std::vector<tape_entry> history;
};
} // namespace

asio::awaitable<std::optional<json::object>> load_state(store_runner& db, turn_context& ctx) {
    // One trip to the store for both the state and the context window.
    auto load = [sid = ctx.session_id](store& s) {
        loaded l;
        if (auto rec = s.get_session(sid)) l.state = std::move(rec->state);
        l.history = s.tape_tail(sid, history_window);
        return l;
    };
    loaded l = co_await db.run(std::move(load));
    // Context starts at the last anchor (a handoff or reset).
    auto anchor = std::find_if(l.history.rbegin(), l.history.rend(),
                               [](const tape_entry& e) { return e.kind == tape_kind::anchor; });
    if (anchor != l.history.rend()) l.history.erase(l.history.begin(), anchor.base() - 1);
    ctx.history = std::move(l.history);
    co_return std::move(l.state);
}

} // namespace baton::pipeline
