// Live turn events (docs/api.md "Turn events"). Every turn publishes typed events with a per-turn
// increasing seq into a bounded log; readers (SSE streams, WebSocket connections, the terminal
// chat) replay the log and follow it. A reader never slows a turn: publishing only appends and
// wakes, a reader that falls behind the log's bound sees a gap, and session listeners must not block.
#pragma once

#include <baton/types.hpp>

#include <boost/json/object.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace baton {

namespace json = boost::json;

// One event of one turn (its log knows which turn).
struct turn_event {
    std::int64_t seq = 0;
    std::string type; // "turn.queued", "model.delta", ... (docs/api.md)
    std::string data; // the event's JSON object, serialized once for every reader
};
using event_ptr = std::shared_ptr<const turn_event>;

class turn_log;
using event_listener = std::function<void(const turn_log&, const event_ptr&)>;

// One turn's events. Thread-safe.
class turn_log {
public:
    turn_log(std::string turn_id, session_ref session, std::size_t capacity,
             std::function<void(const turn_log&, const event_ptr&)> fan_out);

    const std::string& turn_id() const { return turn_id_; }
    const std::string& session_id() const { return session_.id; }
    // Whose turn: a reader of another tenant must not see its events.
    const std::string& tenant() const { return session_.tenant; }
    const session_ref& session() const { return session_; }
    const std::string& session_key() const { return session_key_; }

    // Appends an event (seq = last + 1) and wakes the readers. After turn.finished nothing more is
    // appended. Returns the event (nullptr once finished).
    event_ptr publish(std::string_view type, const json::object& data);
    // The same with the data already written: `data` is a JSON object's text.
    event_ptr publish_text(std::string_view type, std::string data);

    struct read_result {
        std::vector<event_ptr> events;           // seq > after, oldest first
        std::optional<std::int64_t> gap_from;    // seqs [gap_from, gap_to] were dropped
        std::int64_t gap_to = 0;
        bool finished = false;                   // turn.finished is among `events` or was before
    };
    // What a reader resuming after `after` gets now. When nothing is new and the turn has not
    // finished, `wake` (if given) is called once on the next publish (from the publisher's thread:
    // it must only post); a later read or publish drops it.
    read_result read_after(std::int64_t after, std::size_t max, std::function<void()> wake = {});

    // Once finished: gives back the memory a long turn's buffer no longer needs.
    void compact();

private:
    const std::string turn_id_;
    const session_ref session_;
    const std::string session_key_; // session_.key(), for the hub's listeners
    const std::size_t capacity_;
    std::function<void(const turn_log&, const event_ptr&)> fan_out_;
    mutable std::mutex mutex_;
    // At least the last `capacity_` events (at most twice that: the front is dropped in bulk);
    // turn.finished, the last one, is always kept.
    std::vector<event_ptr> events_;
    event_ptr finished_;
    std::int64_t next_seq_ = 1;
    std::vector<std::function<void()>> wakers_;
};

struct event_hub_options {
    std::size_t events_per_turn = 1024;      // older events of a turn are dropped (readers see a gap)
    std::size_t finished_turns_kept = 1024;  // finished turns stay attachable ...
    std::chrono::milliseconds finished_ttl{std::chrono::minutes(10)}; // ... this long at most
};

// All turns' logs, and listeners per session. Thread-safe.
class event_hub {
public:
    explicit event_hub(event_hub_options opts = {});

    // The log of a new turn (or the existing one).
    std::shared_ptr<turn_log> open(const std::string& turn_id, const session_ref& session);
    // The log of a live or recently finished turn; nullptr when unknown or expired.
    std::shared_ptr<turn_log> find(const std::string& turn_id);
    // Called once a turn's log has turn.finished: it is kept for a while, then dropped.
    void retire(const std::string& turn_id);

    // Every event of the session's turns from now on, called on the publisher's thread with no
    // hub lock held. The listener must not block (queue and post). Returns an id for unlisten.
    std::uint64_t listen(const session_ref& session, event_listener f);
    void unlisten(const session_ref& session, std::uint64_t id);

    std::size_t live_logs() const;

private:
    void fan_out(const turn_log& log, const event_ptr& e);
    void expire_locked(std::chrono::steady_clock::time_point now);

    event_hub_options opts_;
    mutable std::mutex mutex_;
    std::unordered_map<std::string, std::shared_ptr<turn_log>> logs_;
    struct retired {
        std::string turn_id;
        std::chrono::steady_clock::time_point at;
    };
    std::deque<retired> retired_; // oldest first
    mutable std::mutex listeners_mutex_;
    std::atomic<std::size_t> listening_{0}; // listeners in all: none, no lock per event
    struct listener {
        std::uint64_t id;
        std::shared_ptr<event_listener> f;
    };
    std::unordered_map<std::string, std::vector<listener>> listeners_; // by session_ref::key()
    std::uint64_t next_listener_ = 1;
};

// The SSE frame of an event (`id:`, `event:`, `data:` lines and a blank line).
std::string sse_frame(const turn_event& e);
// The WebSocket frame of an event: {"type":"event","turn_id","seq","event","data"}.
std::string ws_event_frame(std::string_view turn_id, const turn_event& e);

} // namespace baton
