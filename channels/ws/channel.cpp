#include "channels/ws/channel.hpp"

#include <baton/log.hpp>

#include <algorithm>
#include <utility>

namespace baton::ws {

json::value frame_id(frame_ref id) {
    return id ? json::value(json::string(*id)) : json::value(nullptr);
}

std::string reply_frame(const outbox_item& item) {
    return json::serialize(json::object{{"type", "reply"},
                                        {"session", item.session_id},
                                        {"turn_id", item.turn_id},
                                        {"key", item.key},
                                        {"text", item.text},
                                        {"uncertain", item.uncertain}});
}

std::string error_frame(frame_ref id, std::string_view code, std::string_view message) {
    return json::serialize(
        json::object{{"type", "error"}, {"id", frame_id(id)}, {"code", code}, {"message", message}});
}

std::string error_frame(frame_ref id, const api_error& e) {
    json::object f{
        {"type", "error"}, {"id", frame_id(id)}, {"code", code_name(e.code)}, {"message", e.message}};
    if (auto s = retry_after(e); s > 0) f["retry_after"] = s;
    return json::serialize(f);
}

channel::channel(runtime& rt, options o) : rt_(rt), opts_(o) {
    // A ws reply goes to whoever follows its session: there is no recipient to name, and one
    // named is refused rather than ignored.
    rt_.add_route("ws", [](std::string_view to) -> std::optional<std::string> {
        if (to.empty()) return std::nullopt;
        return "the ws channel delivers to the session's own followers: give no to";
    });
}

channel::~channel() {
    stop();
}

plugin channel::make_plugin() {
    plugin p;
    p.name = "ws";
    p.dispatch_outbound = [this](turn_context& ctx, const outbound& item) {
        return dispatch(ctx, item);
    };
    return p;
}

// A reply for channel `ws` is addressed to its session: whoever follows the session gets it.
asio::awaitable<bool> channel::dispatch(turn_context& ctx, const outbound& item) {
    if (item.channel != "ws") co_return false;
    outbox_item o;
    o.turn_id = ctx.inbound.turn_id;
    o.tenant = ctx.inbound.tenant;
    o.session_id = ctx.session_id;
    o.channel = "ws";
    o.recipient = ctx.session_id;
    o.index = item.index;
    o.text = item.text;
    o.key = outbox_key(o.session_id, o.turn_id, o.channel, o.recipient, o.index);
    std::vector<outbox_item> items{std::move(o)};
    // Named before the co_await: g++ 12 destroys a temporary of a co_await's arguments twice.
    std::function<void(std::vector<outbox_item>)> send = [this](std::vector<outbox_item> added) {
        for (const auto& a : added)
            deliver(a);
    };
    co_await rt_.enqueue_outbox(ctx, std::move(items), std::move(send));
    co_return true;
}

std::shared_ptr<void> channel::try_open() {
    auto n = open_->load();
    do {
        if (n >= opts_.max_connections) return nullptr;
    } while (!open_->compare_exchange_weak(n, n + 1));
    auto count = open_;
    return std::shared_ptr<void>(count.get(), [count](void*) { count->fetch_sub(1); });
}

void channel::attach(const std::shared_ptr<connection>& c) {
    std::lock_guard lock(mutex_);
    conns_[c.get()].conn = c;
}

void channel::detach(const connection* c) {
    std::vector<followed> sessions;
    {
        std::lock_guard lock(mutex_);
        auto it = conns_.find(c);
        if (it == conns_.end()) return;
        sessions = std::move(it->second.sessions);
        conns_.erase(it);
        for (const auto& f : sessions) {
            auto s = by_session_.find(f.session.key());
            if (s == by_session_.end()) continue;
            std::erase_if(s->second, [c](const std::weak_ptr<connection>& w) {
                auto p = w.lock();
                return !p || p.get() == c;
            });
            if (s->second.empty()) by_session_.erase(s);
        }
    }
    for (const auto& f : sessions)
        if (f.listener != 0) rt_.events().unlisten(f.session, f.listener);
}

namespace {
// A turn.finished event after which no reply comes (a turn that failed, was stopped or timed out,
// or ended without text): what a replies-only follower is told, so that it does not wait for a
// reply forever (found by a new-user check).
// Read off the data's text as finished_event_data writes it ({"status":…,"reply":…}), without
// parsing a long reply: anything else counts as no reply (an extra frame, never a missing one).
bool ends_without_reply(const turn_event& e) {
    if (e.type != "turn.finished") return false;
    std::string_view d = e.data;
    for (std::string_view answered :
         {R"({"status":"completed","reply":")", R"({"status":"step_limit","reply":")"})
        if (d.starts_with(answered) && d.size() > answered.size() && d[answered.size()] != '"')
            return false;
    return true;
}
} // namespace

asio::awaitable<void> channel::subscribe(const std::shared_ptr<connection>& c,
                                         const session_ref& session, bool events) {
    bool first = false;
    {
        std::lock_guard lock(mutex_);
        auto it = conns_.find(c.get());
        if (it == conns_.end()) co_return; // already gone
        auto& subs = it->second.sessions;
        auto sub = std::find_if(subs.begin(), subs.end(),
                                [&](const followed& f) { return f.session == session; });
        if (sub == subs.end()) {
            std::weak_ptr<connection> weak = c;
            auto all = std::make_shared<std::atomic<bool>>(events);
            auto id = rt_.events().listen(session, [weak, all](const turn_log& log, const event_ptr& e) {
                if (!all->load(std::memory_order_relaxed) && !ends_without_reply(*e)) return;
                if (auto conn = weak.lock()) conn->send(ws_event_frame(log.turn_id(), *e));
            });
            subs.push_back({session, id, std::move(all)});
            by_session_[session.key()].push_back(weak);
            first = true;
        } else {
            sub->events->store(events,
                               std::memory_order_relaxed); // followed already: only the events switch
        }
    }
    if (!first) co_return;
    // Every reply of the session not acked yet, with its key (clients drop keys they have seen).
    store::outbox_filter unacked;
    unacked.statuses = {outbox_status::pending, outbox_status::sending};
    unacked.channel = "ws";
    unacked.tenant = session.tenant;
    unacked.session_id = session.id;
    for (const auto& item : co_await rt_.list_outbox(std::move(unacked)))
        c->send(reply_frame(item));
}

void channel::deliver(const outbox_item& item) {
    std::vector<std::shared_ptr<connection>> targets;
    {
        std::lock_guard lock(mutex_);
        auto it = by_session_.find(session_ref(item.tenant, item.session_id).key());
        if (it == by_session_.end()) return;
        for (const auto& w : it->second)
            if (auto c = w.lock()) targets.push_back(std::move(c));
    }
    auto frame = reply_frame(item);
    for (auto& c : targets)
        c->send(frame);
}

void channel::stop() {
    std::vector<std::shared_ptr<connection>> all;
    {
        std::lock_guard lock(mutex_);
        for (auto& [raw, a] : conns_)
            if (auto c = a.conn.lock()) all.push_back(std::move(c));
    }
    for (auto& c : all)
        c->close();
}

} // namespace baton::ws
