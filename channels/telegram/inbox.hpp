// What the Telegram poller does with fetched updates, without I/O: per-chat debounce (messages of
// one chat arriving close together become one message, joined with "\n"), commands that bypass it,
// and the updates still buffered, which the poller persists with its offset so that a restart
// neither loses nor repeats them.
#pragma once

#include "channels/telegram/bot_api.hpp"

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace baton::telegram {

// One message for the runtime: one update, or the updates of one chat joined.
struct ready_message {
    std::string chat_id;
    std::vector<update> parts; // in update_id order; never empty
    std::string text() const;  // the parts' texts joined with "\n"
};

// True for a bot command: text starting with '/'.
bool is_command(std::string_view text);

class inbox {
public:
    using clock = std::chrono::steady_clock;
    // 0: no debounce, every update is ready at once. Otherwise a chat's buffer is ready once no
    // message came for `debounce`, and at the latest 5 x debounce after its first message.
    explicit inbox(std::chrono::milliseconds debounce) : debounce_(debounce) {}

    // Takes a fetched update. Returns what is ready now, in order: with no debounce the update
    // itself; for a command, what the chat had buffered, then the command alone.
    std::vector<ready_message> add(update u, clock::time_point now);
    // The buffers whose time has come, oldest first.
    std::vector<ready_message> due(clock::time_point now);
    std::optional<clock::time_point> next_deadline() const;
    // Every buffered update, in update_id order (what must outlive a crash).
    std::vector<update> buffered() const;
    bool empty() const { return chats_.empty(); }

    // Updates grouped per chat, each chat's in order; groups ordered by their first update.
    static std::vector<ready_message> group(std::vector<update> updates);

private:
    struct buffer {
        ready_message msg;
        clock::time_point first, last;
    };
    clock::time_point deadline(const buffer& b) const;

    std::chrono::milliseconds debounce_;
    std::map<std::string, buffer> chats_;
};

} // namespace baton::telegram
