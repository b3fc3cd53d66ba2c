// `baton chat`: a terminal chat on one session, either on an in-process runtime built like
// `baton serve` builds its own (no HTTP listener), or against a running daemon over its
// WebSocket channel. Both read stdin line by line and print through chat_view.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace baton {

struct chat_options {
    std::string session;                    // already validated
    std::optional<std::string> url;         // remote when set
    std::optional<std::string> config_file; // in-process only
    std::optional<std::string> data_dir;    // in-process only: SQLite there, else the memory store
    std::optional<std::string> token;       // remote only: the bearer token (--token, BATON_TOKEN)
    std::optional<std::string> ca_file;     // remote over TLS: PEM trust anchors (--cacert)
};

// The default session: "chat:<user>" from $USER (characters a session id cannot hold dropped),
// or "chat".
std::string default_chat_session();

// Both return the process exit code: 0 after stdin ended and every message was answered,
// 130 after SIGINT/SIGTERM, 1 when the runtime or the daemon cannot be reached, 2 for bad input.
int run_local_chat(const chat_options& opts);
int run_remote_chat(const chat_options& opts);

// Reads stdin on its own thread (a blocking read works for terminals, pipes and plain files
// alike) and hands over each line without its "\n" (and "\r"), then calls on_eof once.
class line_reader {
public:
    line_reader(std::function<void(std::string)> on_line, std::function<void()> on_eof);
    // Stops reading (on_eof is not called after it) and joins the thread.
    ~line_reader();
    line_reader(const line_reader&) = delete;
    line_reader& operator=(const line_reader&) = delete;

    void stop();

private:
    void run();
    std::function<void(std::string)> on_line_;
    std::function<void()> on_eof_;
    int wake_[2] = {-1, -1}; // a self-pipe: stop() makes the reader's poll() return
    std::thread thread_;
};

} // namespace baton
