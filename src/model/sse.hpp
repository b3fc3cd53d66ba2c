// Server-sent events parsing for streaming model clients, without I/O: the driver feeds whatever
// bytes the socket delivered and gets back the events they completed (WHATWG EventSource rules).
// The OpenAI "[DONE]" sentinel is ordinary event data here; the caller recognises it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

struct sse_event {
    std::string event = "message";     // the "event:" field, or "message"
    std::string data;                  // "data:" lines joined with "\n"
    std::string id;                    // the last event ID seen on the stream: it persists across events
    std::optional<std::int64_t> retry; // a valid "retry:" (ms) inside this event's block

    bool operator==(const sse_event&) const = default;
};

class sse_parser {
public:
    static constexpr std::size_t default_max_size = 8 * 1024 * 1024;

    // `max_size` bounds one line and one event's accumulated fields, so a peer that never sends a
    // newline cannot grow memory without limit.
    explicit sse_parser(std::size_t max_size = default_max_size);

    // Parses the next bytes; chunk boundaries may fall anywhere. Returns the events they complete.
    // Past the size limit the parser fails: events completed before that point are still
    // returned, then failed() is true and every later feed returns nothing.
    std::vector<sse_event> feed(std::string_view bytes);

    bool failed() const { return !error_.empty(); }
    const std::string& error() const { return error_; }

    // Comment lines (": ping") seen so far: servers send them as heartbeats.
    std::size_t comments() const { return comments_; }
    // For a reconnect's Last-Event-ID header, and the latest valid "retry:" even from a block
    // that carried no data and so was never dispatched.
    const std::string& last_event_id() const { return last_id_; }
    std::optional<std::int64_t> retry() const { return retry_; }

    // True when bytes of an unfinished line or event are buffered: at end of stream they are
    // discarded, which tells a client the stream was cut short.
    bool has_partial() const;

    // The end of the stream. EventSource discards an unfinished event there; finish() returns it
    // instead (the unfinished line taken as ended, the event as dispatched), for a caller that
    // judges it: the model client accepts a last "data: [DONE]" that lacks its blank line.
    // Afterwards nothing is buffered.
    std::vector<sse_event> finish();

private:
    void consume(std::string_view in, std::vector<sse_event>& out);
    void process_line(std::string_view line, std::vector<sse_event>& out);
    void process_field(std::string_view name, std::string_view value);
    void dispatch(std::vector<sse_event>& out);
    void fail(std::string_view what);

    std::size_t max_size_;
    std::string line_;      // an unfinished line carried over from the previous chunk
    bool after_cr_ = false; // the last line ended in '\r': a '\n' starting the next chunk is part of it
    bool bom_done_ = false;
    std::string bom_buf_; // a possible BOM prefix split across chunks

    std::string data_;
    std::string event_;
    std::optional<std::int64_t> event_retry_;
    bool in_event_ = false; // some field line arrived since the last blank line

    std::string last_id_;
    std::optional<std::int64_t> retry_;
    std::size_t comments_ = 0;
    std::string error_;
};

} // namespace baton
