// A fake Telegram Bot API server for protocol tests: a Beast server on 127.0.0.1 with its own
// io_context thread. getUpdates follows the real offset rules (updates below the offset are
// confirmed and forgotten; the call holds until an update arrives or its timeout passes),
// sendMessage is recorded, a wrong token answers 401, and errors can be injected per method.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace baton::test {

struct sent_message {
    std::string chat_id; // as the client sent it (a number rendered as decimal text)
    std::string text;
    std::chrono::steady_clock::time_point at;
};

class fake_telegram {
public:
    // getMe answers the username fake_bot.
    explicit fake_telegram(std::string token);
    ~fake_telegram();
    fake_telegram(const fake_telegram&) = delete;
    fake_telegram& operator=(const fake_telegram&) = delete;

    unsigned short port() const;
    std::string api_base() const; // http://127.0.0.1:<port>

    // Queues a text message from `chat` and returns its update_id (increasing from 100).
    std::int64_t push_message(std::int64_t chat, std::string text, std::string username = "alice");
    // Serves an update again although it was confirmed (as if the confirming call never came).
    void redeliver(std::int64_t update_id);
    // The next `n` calls of `method` answer `status` with {"ok": false, "error_code",
    // "description"} and parameters.retry_after when given.
    void fail_next(std::string method, std::size_t n, unsigned status, std::string description,
                   std::optional<int> retry_after = std::nullopt);
    // Down: the port refuses connections and open ones are closed unanswered. Up: listening again
    // on the same port.
    void go_down();
    void come_back();
    // sendMessage to this chat answers 403 "Forbidden: bot was blocked by the user".
    void block_chat(std::int64_t chat);

    std::vector<sent_message> sent() const;
    std::size_t calls(const std::string& method) const; // answered or failed, by method name
    std::vector<std::int64_t> offsets() const;          // asked by getUpdates, in order
    std::size_t unauthorized() const;                   // requests with a wrong token
    std::size_t queued() const;                         // updates not yet confirmed

    // Bounded waits (polling every few ms); false when the limit passed first.
    bool wait_sent(std::size_t n, std::chrono::milliseconds limit) const;
    bool wait_calls(const std::string& method, std::size_t n, std::chrono::milliseconds limit) const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

} // namespace baton::test
