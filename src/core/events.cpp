#include <baton/events.hpp>
#include <baton/json_text.hpp>

namespace baton {

turn_log::turn_log(std::string turn_id, session_ref session, std::size_t capacity,
                   std::function<void(const turn_log&, const event_ptr&)> fan_out)
    : turn_id_(std::move(turn_id)), session_(std::move(session)), session_key_(session_.key()),
      capacity_(capacity < 2 ? 2 : capacity), fan_out_(std::move(fan_out)) {}

event_ptr turn_log::publish(std::string_view type, const json::object& data) {
    return publish_text(type, json_text(data));
}

event_ptr turn_log::publish_text(std::string_view type, std::string data) {
    auto e = std::make_shared<turn_event>();
    e->type = type;
    e->data = std::move(data);
    std::vector<std::function<void()>> wake;
    {
        std::lock_guard lock(mutex_);
        if (finished_) return nullptr;
        e->seq = next_seq_++;
        events_.push_back(e);
        if (events_.size() >= 2 * capacity_)
            events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(capacity_));
        if (type == "turn.finished") finished_ = e;
        wake.swap(wakers_);
    }
    for (auto& w : wake)
        w();
    if (fan_out_) fan_out_(*this, e);
    return e;
}

turn_log::read_result turn_log::read_after(std::int64_t after, std::size_t max,
                                           std::function<void()> wake) {
    read_result r;
    std::lock_guard lock(mutex_);
    std::int64_t first = events_.empty() ? next_seq_ : events_.front()->seq;
    if (after < first - 1) { // not after + 1: a client's Last-Event-ID may be INT64_MAX
        r.gap_from = after + 1;
        r.gap_to = first - 1;
        after = first - 1;
    }
    for (const auto& e : events_) {
        if (e->seq <= after) continue;
        if (r.events.size() >= max) break;
        r.events.push_back(e);
    }
    r.finished = finished_ != nullptr;
    if (r.events.empty() && !r.finished && wake) wakers_.push_back(std::move(wake));
    return r;
}

void turn_log::compact() {
    std::lock_guard lock(mutex_);
    if (events_.size() > capacity_)
        events_.erase(events_.begin(),
                      events_.end() - static_cast<std::ptrdiff_t>(capacity_));
    events_.shrink_to_fit();
}

event_hub::event_hub(event_hub_options opts) : opts_(opts) {}

std::shared_ptr<turn_log> event_hub::open(const std::string& turn_id, const session_ref& session) {
    std::lock_guard lock(mutex_);
    auto& slot = logs_[turn_id];
    if (!slot)
        slot = std::make_shared<turn_log>(turn_id, session, opts_.events_per_turn,
                                          [this](const turn_log& l, const event_ptr& e) { fan_out(l, e); });
    return slot;
}

std::shared_ptr<turn_log> event_hub::find(const std::string& turn_id) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now());
    auto it = logs_.find(turn_id);
    return it == logs_.end() ? nullptr : it->second;
}

void event_hub::retire(const std::string& turn_id) {
    if (auto log = find(turn_id)) log->compact();
    std::lock_guard lock(mutex_);
    auto now = std::chrono::steady_clock::now();
    retired_.push_back({turn_id, now});
    expire_locked(now);
}

void event_hub::expire_locked(std::chrono::steady_clock::time_point now) {
    while (!retired_.empty() && (retired_.size() > opts_.finished_turns_kept ||
                                 now - retired_.front().at > opts_.finished_ttl)) {
        logs_.erase(retired_.front().turn_id);
        retired_.pop_front();
    }
}

std::size_t event_hub::live_logs() const {
    std::lock_guard lock(mutex_);
    return logs_.size();
}

std::uint64_t event_hub::listen(const session_ref& session, event_listener f) {
    auto key = session.key();
    std::lock_guard lock(listeners_mutex_);
    auto id = next_listener_++;
    listeners_[key].push_back({id, std::make_shared<event_listener>(std::move(f))});
    listening_.fetch_add(1);
    return id;
}

void event_hub::unlisten(const session_ref& session, std::uint64_t id) {
    auto key = session.key();
    std::lock_guard lock(listeners_mutex_);
    auto it = listeners_.find(key);
    if (it == listeners_.end()) return;
    listening_.fetch_sub(std::erase_if(it->second, [id](const listener& l) { return l.id == id; }));
    if (it->second.empty()) listeners_.erase(it);
}

void event_hub::fan_out(const turn_log& log, const event_ptr& e) {
    if (listening_.load() == 0) return;
    std::vector<std::shared_ptr<event_listener>> targets;
    {
        std::lock_guard lock(listeners_mutex_);
        if (listeners_.empty()) return;
        auto it = listeners_.find(log.session_key());
        if (it == listeners_.end()) return;
        for (const auto& l : it->second)
            targets.push_back(l.f);
    }
    for (auto& f : targets)
        (*f)(log, e);
}

std::string sse_frame(const turn_event& e) {
    std::string out;
    out.reserve(e.type.size() + e.data.size() + 40);
    out += "id: ";
    out += std::to_string(e.seq);
    out += "\nevent: ";
    out += e.type;
    out += "\ndata: ";
    out += e.data; // serialized JSON has no raw newline
    out += "\n\n";
    return out;
}

std::string ws_event_frame(std::string_view turn_id, const turn_event& e) {
    std::string out;
    out.reserve(e.type.size() + e.data.size() + turn_id.size() + 64);
    out += R"({"type":"event","turn_id":)";
    append_json_string(out, turn_id);
    out += R"(,"seq":)";
    out += std::to_string(e.seq);
    out += R"(,"event":)";
    append_json_string(out, e.type);
    out += R"(,"data":)";
    out += e.data;
    out += "}";
    return out;
}

} // namespace baton
