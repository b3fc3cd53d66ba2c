// The only translation unit of the WebSocket channel that includes Beast's websocket.
#include "channels/ws/session.hpp"

#include <baton/json_text.hpp>
#include <baton/log.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

namespace baton::ws {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace websocket = boost::beast::websocket;

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// A connection: frames to send wait in a bounded queue, drained by a writer coroutine that runs
// only while there is something to send (an idle connection keeps no writer frames); the reader
// coroutine handles what the client sends. Both run on the connection's strand.
template <class NextLayer>
class session final : public connection, public std::enable_shared_from_this<session<NextLayer>> {
public:
    session(channel& ch, std::shared_ptr<void> slot, NextLayer stream, caller who)
        : ch_(ch), slot_(std::move(slot)), ws_(std::move(stream)), who_(std::move(who)) {}

    void send(std::string frame) override {
        {
            std::lock_guard lock(mutex_);
            if (closing_) return;
            if (queue_.size() >= ch_.opts().max_queued_frames) {
                // Too far behind: dropped, never buffered without bound.
                closing_ = true;
                close_code_ = websocket::close_code::policy_error;
            } else {
                queue_.push_back(std::move(frame));
            }
            if (writer_running_) return;
            writer_running_ = true;
        }
        start_writer();
    }

    void close() override {
        {
            std::lock_guard lock(mutex_);
            if (closing_) return;
            closing_ = true;
            close_code_ = websocket::close_code::going_away;
            if (writer_running_) return;
            writer_running_ = true;
        }
        start_writer();
    }

    asio::any_io_executor executor() { return ws_.get_executor(); }

    // The upgrade; false when it failed. The request is not kept after it; `early` (bytes after
    // it, already read) is read as frames.
    asio::awaitable<bool> accept(bhttp::request<bhttp::string_body> req, std::string early);
    // Reads frames until the connection ends.
    static asio::awaitable<void> read_loop(std::shared_ptr<session> self);

private:
    // Not under mutex_: a spawn from the strand may run the writer's first steps at once.
    void start_writer() {
        asio::co_spawn(ws_.get_executor(), write_loop(this->shared_from_this()),
                       log::spawn_logger{"ws writer"});
    }
    static asio::awaitable<void> write_loop(std::shared_ptr<session> self);
    asio::awaitable<void> handle(std::string_view text);
    asio::awaitable<void> on_message(const json::object& f, frame_ref id);
    // Follows the session with the frame's "events" (true when absent); false, after an error
    // frame, when "events" is not a boolean.
    asio::awaitable<bool> follow(const json::object& f, frame_ref id, const std::string& sid);

    channel& ch_;
    std::shared_ptr<void> slot_; // this connection's place among max_connections
    websocket::stream<NextLayer> ws_;
    const caller who_; // the tenant every frame of this connection acts for
    std::mutex mutex_;
    std::deque<std::string> queue_;
    bool writer_running_ = false; // stays true once closing: nothing more is written
    bool closing_ = false;
    websocket::close_code close_code_ = websocket::close_code::normal;
};

template <class NextLayer>
asio::awaitable<void> session<NextLayer>::write_loop(std::shared_ptr<session<NextLayer>> self) {
    for (;;) {
        std::string frame;
        websocket::close_code code = websocket::close_code::normal;
        {
            std::lock_guard lock(self->mutex_);
            if (self->closing_) {
                code = self->close_code_;
                self->close_code_ = websocket::close_code::normal; // sent once
            } else if (self->queue_.empty()) {
                self->writer_running_ = false;
                co_return;
            } else {
                frame = std::move(self->queue_.front());
                self->queue_.pop_front();
            }
        }
        if (frame.empty()) {
            // Closing (drain, or too far behind); the reader then sees the close and ends.
            if (code != websocket::close_code::normal) co_await self->ws_.async_close(code, use_tuple);
            co_return;
        }
        self->ws_.text(true);
        auto [ec, n] = co_await self->ws_.async_write(asio::buffer(frame), use_tuple);
        if (ec) {
            std::lock_guard lock(self->mutex_);
            self->closing_ = true;
            co_return;
        }
    }
}

template <class NextLayer>
asio::awaitable<bool> session<NextLayer>::accept(bhttp::request<bhttp::string_body> req,
                                                 std::string early) {
    auto timeouts = websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeouts.idle_timeout = ch_.opts().idle_timeout;
    timeouts.keep_alive_pings = true;
    ws_.set_option(timeouts);
    // A client that offered "baton.v1" (the web page, with its token as "bearer.<token>") gets it
    // back: a browser fails a connection whose offer the server leaves unanswered. The token is
    // never echoed.
    bool baton_v1 = parse_ws_protocols(req[bhttp::field::sec_websocket_protocol]).baton_v1;
    ws_.set_option(websocket::stream_base::decorator([baton_v1](websocket::response_type& res) {
        res.set(bhttp::field::server, "baton");
        if (baton_v1) res.set(bhttp::field::sec_websocket_protocol, "baton.v1");
    }));
    // The size limit is ours (see the read loop): Beast's own (read_message_max) tears the TCP
    // connection down before the peer has read the 1009 close frame.
    ws_.read_message_max(0);
    beast::get_lowest_layer(ws_).expires_never();
    if (early.empty()) {
        auto [aec] = co_await ws_.async_accept(req, use_tuple);
        co_return !aec;
    }
    // Frames sent before the 101 (RFC 6455 says to wait for it; some clients do not) would be lost
    // with the request overload, which starts with an empty read buffer: the buffers overload reads
    // the upgrade again from bytes given to it and keeps what follows for the frames. The body, if
    // the upgrade had one, is not among them.
    bhttp::request_header<> head = req.base();
    head.erase(bhttp::field::content_length);
    head.erase(bhttp::field::transfer_encoding);
    std::ostringstream written;
    written << head; // Beast's serializer: the request line, the fields and the blank line
    std::string bytes = std::move(written).str() + early;
    auto [aec] = co_await ws_.async_accept(asio::buffer(bytes), use_tuple);
    co_return !aec;
}

template <class NextLayer>
asio::awaitable<void> session<NextLayer>::read_loop(std::shared_ptr<session<NextLayer>> self) {
    auto& ws_ = self->ws_;
    auto& ch_ = self->ch_;
    ch_.attach(self);
    beast::flat_buffer buffer;
    const std::size_t limit = ch_.opts().max_frame_bytes;
    for (;;) {
        // A message is read in pieces, so that one over the limit is refused before it is in memory.
        auto [ec, n] =
            co_await ws_.async_read_some(buffer, std::min<std::size_t>(limit + 1, 65536), use_tuple);
        if (ec) break; // closed or timed out
        // Within a frame, Beast's hint is what is left of it: a frame whose header announces more
        // than the limit is refused as soon as its first bytes arrive, not after the limit's worth.
        std::size_t left = ws_.is_message_done() ? 0 : ws_.read_size_hint(1);
        if (buffer.size() > limit || (left > 1 && left > limit - buffer.size())) {
            bool closed_already;
            {
                std::lock_guard lock(self->mutex_);
                closed_already = self->closing_;
                self->closing_ = true;
            }
            if (!closed_already) co_await ws_.async_close(websocket::close_code::too_big, use_tuple);
            break;
        }
        if (!ws_.is_message_done()) continue;
        if (!ws_.got_text()) {
            self->send(error_frame(std::nullopt, "invalid_request",
                                   "frames must be text (one JSON object each)"));
        } else {
            auto data = buffer.cdata();
            co_await self->handle(std::string_view(static_cast<const char*>(data.data()), data.size()));
        }
        buffer.consume(buffer.size());
    }
    ch_.detach(self.get());
    std::lock_guard lock(self->mutex_);
    self->closing_ = true;
}

// "unknown field X (…)" for a key the frame's type does not take; nullopt when all are known or
// the type is not one of ours (refused as such).
std::optional<std::string> unknown_field(const json::object& f, std::string_view type) {
    static const std::pair<std::string_view, std::vector<std::string_view>> fields[] = {
        // deliver and metadata are refused with their own reason (on_message).
        {"message", {"type", "id", "session", "text", "agent", "events", "deliver", "metadata"}},
        {"subscribe", {"type", "id", "session", "events"}},
        {"ack", {"type", "id", "key"}},
        {"cancel", {"type", "id", "turn_id"}},
        {"ping", {"type", "id"}},
    };
    for (const auto& [name, known] : fields) {
        if (name != type) continue;
        for (const auto& kv : f) {
            if (std::find(known.begin(), known.end(), std::string_view(kv.key())) != known.end())
                continue;
            std::string list;
            for (auto k : known)
                if (k != "deliver" && k != "metadata")
                    list += (list.empty() ? "" : ", ") + std::string(k);
            return "unknown field " + std::string(kv.key()) + " (a " + std::string(type) +
                   " frame takes " + list + ")";
        }
        return std::nullopt;
    }
    return std::nullopt;
}

std::string_view string_field(const json::object& f, std::string_view key) {
    auto* v = f.if_contains(key);
    return v && v->is_string() ? std::string_view(v->get_string()) : std::string_view{};
}

// A frame's "id" to echo: none when it has none or one that is not a string ("" is an id).
frame_ref frame_of(const json::object& f) {
    auto* v = f.if_contains("id");
    if (!v || !v->is_string()) return std::nullopt;
    return std::string_view(v->get_string());
}

// A frame's "events": true when absent; nullopt when it is not a boolean.
std::optional<bool> events_field(const json::object& f) {
    auto* v = f.if_contains("events");
    if (!v) return true;
    if (!v->is_bool()) return std::nullopt;
    return v->get_bool();
}

template <class NextLayer> asio::awaitable<void> session<NextLayer>::handle(std::string_view text) {
    boost::system::error_code ec;
    auto v = json::parse(text, ec);
    if (ec) {
        send(error_frame(std::nullopt, "invalid_json", "not JSON: " + ec.message()));
        co_return;
    }
    if (!v.is_object()) {
        // JSON, but not a frame: refused as HTTP refuses such a body.
        send(error_frame(std::nullopt, "invalid_request", "expected a JSON object"));
        co_return;
    }
    const auto& f = v.get_object();
    const frame_ref id = frame_of(f);
    if (auto dup = first_duplicate_key(text)) {
        // Which of two values was meant is a guess; an id given twice is not echoed.
        send(error_frame(*dup == "id" ? frame_ref() : id, "invalid_request", *dup + ": duplicate key"));
        co_return;
    }
    if (!id && f.contains("id")) {
        // Answered with "id": null: only a string can be echoed back as it came.
        send(error_frame(std::nullopt, "invalid_request", "id: expected a string"));
        co_return;
    }
    auto type = string_field(f, "type");
    if (auto unknown = unknown_field(f, type)) {
        // Refused, as HTTP refuses an unknown field: a misspelt "event": false would otherwise run
        // with events on (found by a new-user check).
        send(error_frame(id, "invalid_request", *unknown));
        co_return;
    }
    if (type == "ping") {
        // The answer to a ping carries its id, as every answer does.
        send(!id ? std::string(R"({"type":"pong"})")
                 : json::serialize(json::object{{"type", "pong"}, {"id", *id}}));
    } else if (type == "message") {
        co_await on_message(f, id);
    } else if (type == "subscribe") {
        std::string sid(string_field(f, "session"));
        if (!valid_session_id(sid)) {
            send(error_frame(id, "invalid_request",
                             "session: 1-128 characters of A-Z a-z 0-9 . _ : @ -"));
            co_return;
        }
        co_await follow(f, id, sid);
    } else if (type == "ack") {
        std::string key(string_field(f, "key"));
        if (key.empty()) {
            send(error_frame(id, "invalid_request", "ack: key (a string) is required"));
        } else if (!co_await ch_.rt().outbox_delivered(key, "", who_.tenant)) {
            send(error_frame(id, "not_found", "no outbox item with key " + key));
        }
    } else if (type == "cancel") {
        std::string tid(string_field(f, "turn_id"));
        if (tid.empty()) {
            send(error_frame(id, "invalid_request", "cancel: turn_id (a string) is required"));
            co_return;
        }
        if (auto err = co_await ch_.rt().cancel(tid, who_.tenant))
            send(error_frame(id, code_name(err->code), err->message));
    } else {
        send(error_frame(id, "invalid_request",
                         type.empty() ? "type (a string) is required"
                                      : "unknown type " + std::string(type) +
                                            "; expected message, subscribe, ack, cancel or ping"));
    }
}

template <class NextLayer>
asio::awaitable<bool> session<NextLayer>::follow(const json::object& f, frame_ref id,
                                                 const std::string& sid) {
    auto events = events_field(f);
    if (!events) {
        send(error_frame(id, "invalid_request", "events: expected true or false"));
        co_return false;
    }
    co_await ch_.subscribe(this->shared_from_this(), session_ref(who_.tenant, sid), *events);
    co_return true;
}

template <class NextLayer>
asio::awaitable<void> session<NextLayer>::on_message(const json::object& f, frame_ref id) {
    accept_request ar;
    ar.channel = "ws";
    ar.tenant = who_.tenant;
    ar.session_id = string_field(f, "session");
    if (!valid_session_id(ar.session_id)) {
        send(error_frame(id, "invalid_request", "session: 1-128 characters of A-Z a-z 0-9 . _ : @ -"));
        co_return;
    }
    auto* text = f.if_contains("text");
    if (!text || !text->is_string() || text->get_string().empty()) {
        send(error_frame(id, "invalid_request", "text: a non-empty string is required"));
        co_return;
    }
    ar.text = text->get_string();
    for (const char* field : {"deliver", "metadata"})
        if (f.contains(field)) {
            // Refused rather than ignored: the sender would think it had been applied.
            send(error_frame(id, "invalid_request",
                             std::string(field) + ": not taken over WebSocket (the reply comes back "
                                                  "on this connection); POST the message to use it"));
            co_return;
        }
    if (auto* agent = f.if_contains("agent")) {
        if (!agent->is_string()) {
            send(error_frame(id, "invalid_request", "agent: expected a string"));
            co_return;
        }
        ar.agent = agent->get_string();
    }
    // The sender follows its session: it gets the reply, and sees the turn's events unless the
    // frame said "events": false.
    if (!co_await follow(f, id, ar.session_id)) co_return;
    // `accepted` goes out as soon as the message is stored (accept() calls this for every message
    // it accepts, replays included, while this frame waits for it), before the turn can start:
    // its events and reply, sent from other threads as they happen, always come after it.
    ar.on_stored = [this, frame = frame_id(id), sid = ar.session_id](const accepted& ok) {
        send(json::serialize(json::object{
            {"type", "accepted"}, {"id", frame}, {"turn_id", ok.turn_id}, {"session", sid}}));
    };
    auto result = co_await ch_.rt().accept(std::move(ar));
    if (!result) send(error_frame(id, result.error()));
}

template <class NextLayer>
asio::awaitable<void> run(channel& ch, std::shared_ptr<void> slot, NextLayer stream,
                          bhttp::request<bhttp::string_body> req, caller who, std::string early) {
    auto s =
        std::make_shared<session<NextLayer>>(ch, std::move(slot), std::move(stream), std::move(who));
    if (!co_await s->accept(std::move(req), std::move(early))) co_return;
    // This coroutine ends here, with the upgrade request it holds.
    auto ex = s->executor();
    asio::co_spawn(ex, session<NextLayer>::read_loop(std::move(s)), log::spawn_logger{"ws connection"});
}
} // namespace

asio::awaitable<void> serve(channel& ch, std::shared_ptr<void> slot, beast::tcp_stream stream,
                            bhttp::request<bhttp::string_body> req, caller who, std::string early) {
    return run(ch, std::move(slot), std::move(stream), std::move(req), std::move(who), std::move(early));
}

asio::awaitable<void> serve(channel& ch, std::shared_ptr<void> slot,
                            beast::ssl_stream<beast::tcp_stream> stream,
                            bhttp::request<bhttp::string_body> req, caller who, std::string early) {
    return run(ch, std::move(slot), std::move(stream), std::move(req), std::move(who), std::move(early));
}

} // namespace baton::ws
