// What `baton chat` prints: turn events, replies and errors turned into lines for a person or a
// script. No I/O of its own beyond the stream it writes to, so it is tested without a terminal.
// Not thread-safe: call it from one thread or strand.
#pragma once

#include <boost/json/object.hpp>

#include <cstddef>
#include <deque>
#include <map>
#include <ostream>
#include <string>
#include <string_view>

namespace baton {

class chat_view {
public:
    // in_process: the reply comes with turn.finished. remote: it comes as a `reply` frame (an
    // outbox item), and turn.finished only reports how the turn ended.
    enum class mode { in_process, remote };

    // dim: wrap the folded thinking lines in the terminal's dim attribute (for a terminal only).
    chat_view(std::ostream& out, mode m, bool dim = false) : out_(out), mode_(m), dim_(dim) {}

    // A turn event (docs/api.md "Turn events"); unknown types are ignored.
    void on_event(std::string_view turn_id, std::string_view type, const boost::json::object& data);
    // A `reply` frame: printed unless that turn's text was already shown (streamed).
    void on_reply(std::string_view turn_id, std::string_view text);
    // A refused message or a bad frame.
    void on_error(std::string_view code, std::string_view message);
    // Any other line of our own (notes about the connection, ...).
    void note(std::string_view text);
    // `you> ` with no newline, for a terminal.
    void prompt();

    // How much of a tool's arguments and output a line shows.
    static constexpr std::size_t args_preview = 200;
    static constexpr std::size_t output_preview = 120;
    // How much of a model call's reasoning its `[thinking: ...]` line shows.
    static constexpr std::size_t thinking_preview = 60;

private:
    struct turn_view {
        std::string streamed;                     // model.delta text of the current model call
        std::string reasoning;                    // model.reasoning text not yet shown
        std::size_t reasoning_chars = 0;          // its non-blank bytes, to stop keeping it
        std::map<std::string, std::string> tools; // call_id -> tool name
    };
    void end_line();
    void line(std::string_view text);
    void finish(std::string_view turn_id, const boost::json::object& data);
    void show_thinking(std::string_view turn_id);
    void remember_shown(std::string_view turn_id, std::string text);

    std::ostream& out_;
    mode mode_;
    bool dim_;
    bool open_line_ = false; // streamed text with no newline yet
    std::string streaming_turn_;
    std::map<std::string, turn_view, std::less<>> turns_;
    // Finished turns and the text shown for them (a reply frame may come after turn.finished).
    std::deque<std::pair<std::string, std::string>> shown_;
};

// `s` on one line, whitespace runs as one space, cut to at most `max` bytes at a UTF-8 character
// boundary (with "..." when cut).
std::string one_line_preview(std::string_view s, std::size_t max);

// Whether thinking lines on stdout should be dim: it is a terminal and NO_COLOR is not set.
bool dim_stdout();

} // namespace baton
