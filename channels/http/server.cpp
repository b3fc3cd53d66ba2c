// The only translation unit of the HTTP channel that includes Beast.
#include "channels/http/server.hpp"
#include <baton/log.hpp>
#include <baton/store.hpp>

#include "channels/http/api.hpp"
#include "channels/http/router.hpp"
#include "channels/ws/session.hpp"
#include <baton/strand.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <charconv>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace baton {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::ip::tcp;
namespace ssl = asio::ssl;
using tls_stream = beast::ssl_stream<beast::tcp_stream>;

namespace {

// What a request that threw answers: 503 store_unavailable when the store could not reach its
// database (a retry may pass), else 500.
http::reply failure_reply(const std::exception& e) {
    if (dynamic_cast<const store_unavailable*>(&e))
        return http::error_reply(errc::store_unavailable, "the database is unreachable; retry");
    return http::error_reply(errc::internal_error, "internal error");
}
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

template <class Stream> constexpr bool is_tls = std::is_same_v<Stream, tls_stream>;

// Reads and drops what the peer sends until it closes or the stream's deadline (set by the
// caller) passes: a refused client reads the answer before the close, not a reset.
asio::awaitable<void> drain(beast::tcp_stream& stream) {
    char sink[4096];
    for (;;) {
        auto [ec, n] = co_await stream.async_read_some(asio::buffer(sink), use_tuple);
        if (ec) break;
    }
}

// The listener's TLS context: TLS 1.2 and later, the certificate chain and key of server.tls.
std::unique_ptr<ssl::context> make_tls_context(const tls_config& files) {
    auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
    // Why a file was refused: OpenSSL's reason ("no start line", "No such file or directory")
    // with the file it was.
    auto why = [](const std::string& what, const std::string& file,
                  const boost::system::error_code& ec) {
        auto reason = ec ? ec.message() : std::string("unknown error");
        if (auto e = ::ERR_get_error()) {
            char buf[256];
            ::ERR_error_string_n(e, buf, sizeof buf);
            if (!ec) reason = buf;
        }
        ::ERR_clear_error();
        return what + " " + file + ": " + reason;
    };
    ::SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                     ssl::context::no_sslv3 | ssl::context::single_dh_use);
    // Stateless resumption tickets would need a key shared and rotated across restarts; a
    // session cache per process is enough for a client that reconnects.
    ::SSL_CTX_set_options(ctx->native_handle(), SSL_OP_NO_RENEGOTIATION);
    boost::system::error_code ec;
    ctx->use_certificate_chain_file(files.cert_file, ec);
    // When the certificate is refused the key is still read, so that one start names every file
    // that needs mending (a new-user check mended the first, to be told of the second).
    std::string cert_refused;
    if (ec)
        cert_refused =
            why("server.tls.cert_file: cannot load the certificate chain from", files.cert_file, ec);
    // An encrypted key would make OpenSSL ask for its passphrase on the terminal, and a daemon
    // started by a service manager wait for ever: no passphrase is given, and the key is refused.
    // (The context keeps the callback: it shares the flag rather than point into this frame.)
    auto encrypted = std::make_shared<bool>(false);
    ctx->set_password_callback([encrypted](std::size_t, ssl::context::password_purpose) {
        *encrypted = true;
        return std::string();
    });
    ec.clear();
    ctx->use_private_key_file(files.key_file, ssl::context::pem, ec);
    std::string key_refused;
    if (*encrypted)
        key_refused = "server.tls.key_file: " + files.key_file +
                      " is encrypted; baton reads unencrypted PEM keys only (openssl pkey -in " +
                      files.key_file + " -out plain.key)";
    else if (ec)
        key_refused = why("server.tls.key_file: cannot load the private key from", files.key_file, ec);
    ::ERR_clear_error();
    if (!cert_refused.empty() || !key_refused.empty())
        throw std::invalid_argument(
            cert_refused + (cert_refused.empty() || key_refused.empty() ? "" : "; ") + key_refused);
    if (::SSL_CTX_check_private_key(ctx->native_handle()) != 1)
        throw std::invalid_argument(
            why("server.tls.key_file: the key does not match the certificate of", files.cert_file, {}));
    return ctx;
}

// The bytes of an address, IPv4 as its IPv6-mapped form, for the per-address connection count.
std::array<unsigned char, 16> address_key(const asio::ip::address& a) {
    if (a.is_v4()) return asio::ip::make_address_v6(asio::ip::v4_mapped, a.to_v4()).to_bytes();
    return a.to_v6().to_bytes();
}
struct address_hash {
    std::size_t operator()(const std::array<unsigned char, 16>& k) const noexcept {
        return std::hash<std::string_view>{}(
            std::string_view(reinterpret_cast<const char*>(k.data()), k.size()));
    }
};

// Connections open now per client address (server.max_connections_per_ip).
struct address_counts {
    std::mutex mutex;
    std::unordered_map<std::array<unsigned char, 16>, std::size_t, address_hash> open;
};

// What a failed read deserves: an error reply, or (nullopt) a silent close.
std::optional<http::reply> read_failure_reply(const boost::system::error_code& ec, bool got_bytes) {
    if (ec == bhttp::error::body_limit)
        return http::error_reply(errc::payload_too_large, "the body is larger than max_body_bytes");
    if (ec == bhttp::error::header_limit) {
        return http::error_reply(errc::headers_too_large, "the request headers are too large");
    }
    if (ec == beast::error::timeout)
        return got_bytes ? std::optional(http::error_reply(errc::request_timeout,
                                                           "the request was not received in time"))
                         : std::nullopt;
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
        ec == bhttp::error::partial_message)
        return std::nullopt;
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category())
        return http::error_reply(errc::invalid_request, "malformed HTTP request: " + ec.message());
    return std::nullopt;
}
// What a request's head must not be (RFC 9112), checked before its body is read: a framing other
// than Content-Length or chunked alone could be read otherwise by a proxy in front (request
// smuggling), and a Host or Authorization given twice is ambiguous. The answer closes the
// connection.
std::optional<std::string> head_refusal(const bhttp::request_parser<bhttp::string_body>& parser) {
    const auto& req = parser.get();
    std::size_t codings = 0, hosts = 0, authorizations = 0, idempotency_keys = 0;
    for (const auto& f : req) {
        if (f.name() == bhttp::field::transfer_encoding) {
            ++codings;
            std::string_view v = f.value();
            while (!v.empty() && (v.front() == ' ' || v.front() == '\t'))
                v.remove_prefix(1);
            while (!v.empty() && (v.back() == ' ' || v.back() == '\t'))
                v.remove_suffix(1);
            if (!beast::iequals(v, "chunked"))
                return "Transfer-Encoding: only chunked is understood, not '" + std::string(f.value()) +
                       "'";
        } else if (f.name() == bhttp::field::host) {
            ++hosts;
        } else if (f.name() == bhttp::field::authorization) {
            ++authorizations;
        } else if (beast::iequals(f.name_string(), "Idempotency-Key")) {
            ++idempotency_keys;
        }
    }
    if (codings > 1) return "Transfer-Encoding given more than once";
    if (hosts > 1) return "Host given more than once";
    if (hosts == 0 && req.version() >= 11) return "an HTTP/1.1 request needs a Host header";
    if (authorizations > 1) return "Authorization given more than once";
    // Which key a retry must repeat would be a guess (found by a new-user check: the first was
    // taken, and a retry with the second made a second turn).
    if (idempotency_keys > 1) return "Idempotency-Key given more than once";
    return std::nullopt;
}

// A read deadline that cancels the socket instead of closing it (as tcp_stream's own timeout
// does), so that a 408 can still be written after a slow request.
class read_deadline {
public:
    explicit read_deadline(tcp::socket& s)
        : timer_(s.get_executor()), state_(std::make_shared<state>()) {
        state_->socket = &s;
    }
    ~read_deadline() { state_->socket = nullptr; }

    void arm(std::chrono::milliseconds d) {
        auto st = state_;
        auto generation = ++st->generation;
        st->fired = false;
        timer_.expires_after(d);
        timer_.async_wait([st, generation](boost::system::error_code ec) {
            // A stale expiry (the read finished meanwhile) must not cancel a later operation.
            if (ec || !st->socket || st->generation != generation) return;
            st->fired = true;
            boost::system::error_code ignored;
            st->socket->cancel(ignored);
        });
    }
    // True when the deadline passed before disarm.
    bool disarm() {
        ++state_->generation;
        timer_.cancel();
        return std::exchange(state_->fired, false);
    }

private:
    struct state {
        tcp::socket* socket = nullptr;
        std::uint64_t generation = 0;
        bool fired = false;
    };
    asio::steady_timer timer_;
    std::shared_ptr<state> state_;
};
} // namespace

void check_tls_files(const tls_config& files) {
    (void)make_tls_context(files);
}

struct http_server::impl : std::enable_shared_from_this<impl> {
    impl(asio::any_io_executor e, runtime& rt, http_server_options o, std::function<bool()> ready,
         ws::channel* w)
        : ex(std::move(e)), acceptor(asio::make_strand(ex)),
          api(rt, std::move(ready), std::move(o.access)), opts(std::move(o)), ws(w),
          metrics(rt.fw().metrics()) {
        if (opts.tls) tls = make_tls_context(*opts.tls);
    }

    asio::any_io_executor ex;
    tcp::acceptor acceptor;
    http::api api;
    http_server_options opts;
    ws::channel* ws;
    metrics_registry& metrics;
    std::unique_ptr<ssl::context> tls; // server.tls: every connection starts with a handshake
    std::atomic<bool> stopped{false};
    // Connections open now (HTTP, SSE, WebSocket): each holds a share of this until it closes.
    std::shared_ptr<std::atomic<std::size_t>> open = std::make_shared<std::atomic<std::size_t>>(0);
    std::shared_ptr<void> take_connection() {
        auto n = open->fetch_add(1) + 1;
        auto counter = open;
        std::shared_ptr<void> share(counter.get(), [counter](void*) { counter->fetch_sub(1); });
        if (n > opts.max_connections) return nullptr; // the share is given back at once
        return share;
    }
    // server.max_connections_per_ip: a share of the client address's count, or null when that
    // address has as many open already (or the cap is off: then no share is needed).
    std::shared_ptr<address_counts> by_address = std::make_shared<address_counts>();
    std::shared_ptr<void> take_address_share(const tcp::socket& socket, bool& refused) {
        refused = false;
        if (opts.max_connections_per_ip == 0) return nullptr;
        boost::system::error_code ec;
        auto peer = socket.remote_endpoint(ec);
        if (ec) return nullptr;
        auto key = address_key(peer.address());
        auto counts = by_address;
        std::lock_guard lock(counts->mutex);
        auto& n = counts->open[key];
        if (n >= opts.max_connections_per_ip) {
            refused = true;
            return nullptr;
        }
        ++n;
        return std::shared_ptr<void>(counts.get(), [counts, key](void*) {
            std::lock_guard lock(counts->mutex);
            auto it = counts->open.find(key);
            if (it != counts->open.end() && --it->second == 0) counts->open.erase(it);
        });
    }

    static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self);
    static asio::awaitable<void> handshake(std::shared_ptr<impl> self, tcp::socket socket,
                                           std::shared_ptr<void> share,
                                           std::shared_ptr<void> address_share);
    template <class Stream>
    static asio::awaitable<void> serve(std::shared_ptr<impl> self, Stream stream,
                                       std::shared_ptr<void> share, std::shared_ptr<void> address_share);
    template <class Stream>
    asio::awaitable<bool> write(Stream& stream, unsigned version, bool keep_alive, http::reply r);
    template <class Stream>
    asio::awaitable<bool> stream_events(Stream& stream, unsigned version, bool keep_alive,
                                        http::event_stream es);
};

namespace {
// Only GET /v1/ws and GET .../events need more than a request and a reply.
enum class stream_kind { none, events, websocket };

stream_kind classify(const bhttp::request<bhttp::string_body>& req, std::string& turn_id,
                     std::string& query) {
    if (req.method() != bhttp::verb::get) return stream_kind::none;
    std::string_view target = req.target();
    std::string_view path = target.substr(0, target.find('?'));
    if (path != "/v1/ws" && path != "/v1/ws/" && !path.ends_with("/events") &&
        !path.ends_with("/events/"))
        return stream_kind::none;
    auto m = http::match_route("GET", target);
    if (m.error) return stream_kind::none;
    if (m.id == http::route_id::websocket) return stream_kind::websocket;
    if (m.id != http::route_id::turn_events) return stream_kind::none;
    turn_id = m.turn_id;
    query = m.query;
    return stream_kind::events;
}

// Feeds the parser what the buffer holds: a clean result with the parser not done means more
// bytes are needed (Beast wants the whole header in one piece, so it may take none yet).
boost::system::error_code parse_buffered(bhttp::request_parser<bhttp::string_body>& parser,
                                         beast::flat_buffer& buffer) {
    parser.eager(true);
    boost::system::error_code ec;
    while (buffer.size() > 0 && !parser.is_done()) {
        auto n = parser.put(buffer.data(), ec);
        buffer.consume(n);
        if (ec == bhttp::error::need_more) return {};
        if (ec) return ec;
        if (n == 0) break;
    }
    return ec;
}

std::string chunk(std::string_view data, bool chunked) {
    if (!chunked) return std::string(data);
    char size[20];
    int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out(size, static_cast<std::size_t>(n));
    out += data;
    out += "\r\n";
    return out;
}
} // namespace

// GET /v1/turns/{tid}/events: replay what the log holds after the resume point, then follow it
// until turn.finished. The turn never waits for this reader: a reader that fell behind the log's
// bound gets a stream.gap frame for what was dropped.
template <class Stream>
asio::awaitable<bool> http_server::impl::stream_events(Stream& stream, unsigned version, bool keep_alive,
                                                       http::event_stream es) {
    auto open = metrics.open_connection(connection_kind::sse);
    bool chunked = version >= 11;
    keep_alive = keep_alive && chunked && !stopped.load();
    std::string head = chunked ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.0 200 OK\r\n";
    head += "Server: baton\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
            "X-Accel-Buffering: no\r\n";
    if (chunked) head += "Transfer-Encoding: chunked\r\n";
    head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    auto send = [&stream, this](std::string bytes) -> asio::awaitable<bool> {
        beast::get_lowest_layer(stream).expires_after(opts.body_timeout);
        auto [ec, n] = co_await asio::async_write(stream, asio::buffer(bytes), use_tuple);
        co_return !ec;
    };
    if (!co_await send(std::move(head))) co_return false;
    if (es.final_only) {
        if (!co_await send(chunk(sse_frame(*es.final_only), chunked))) co_return false;
        co_return chunked ? (co_await send("0\r\n\r\n")) && keep_alive : false;
    }
    // A publish wakes this reader by cancelling its wait, on the connection's strand.
    auto ex = stream.get_executor();
    auto wake = std::make_shared<asio::steady_timer>(ex);
    std::weak_ptr<asio::steady_timer> weak = wake;
    std::int64_t cursor = es.after;
    for (;;) {
        auto waker = [ex, weak] {
            asio::post(ex, [weak] {
                if (auto t = weak.lock()) t->cancel();
            });
        };
        auto r = es.log->read_after(cursor, 256, waker);
        std::string out;
        if (r.gap_from) {
            turn_event gap;
            gap.seq = r.gap_to;
            gap.type = "stream.gap";
            gap.data = json::serialize(json::object{{"from", *r.gap_from}, {"to", r.gap_to}});
            out += sse_frame(gap);
            cursor = r.gap_to;
        }
        bool finished = false;
        for (const auto& e : r.events) {
            out += sse_frame(*e);
            cursor = e->seq;
            finished = finished || e->type == "turn.finished";
        }
        if (!out.empty() && !co_await send(chunk(out, chunked))) co_return false;
        // A turn that finished before the resume point still ends the stream.
        if (finished || (r.finished && r.events.empty() && !r.gap_from)) break;
        if (!r.events.empty() || r.gap_from) continue;
        wake->expires_after(opts.sse_heartbeat);
        auto [ec] = co_await wake->async_wait(use_tuple);
        if (!ec && !co_await send(chunk(": keep-alive\n\n", chunked))) co_return false;
    }
    co_return chunked ? (co_await send("0\r\n\r\n")) && keep_alive : false;
}

namespace {
void append_decimal(std::string& out, std::size_t v) {
    char digits[24];
    auto [end, ec] = std::to_chars(digits, digits + sizeof digits, v);
    out.append(digits, end);
}

// A header value as it goes on the wire: CR and LF would end the line (and start another).
void append_header(std::string& out, std::string_view name, std::string_view value) {
    out += name;
    out += ": ";
    for (char c : value)
        out += (c == '\r' || c == '\n') ? ' ' : c;
    out += "\r\n";
}

// The response as one buffer: status line, headers, body. Connection follows Beast's rules: 1.1
// says `close` when it will close, 1.0 says `keep-alive` when it will not.
std::string response_bytes(const http::reply& r, unsigned version, bool keep_alive) {
    auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(r.status));
    std::string out;
    out.reserve(160 + r.content_type.size() + r.body.size());
    out += version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ";
    append_decimal(out, static_cast<std::size_t>(r.status));
    out += ' ';
    out += reason;
    out += "\r\nServer: baton\r\n";
    append_header(out, "Content-Type", r.content_type);
    out += "Cache-Control: no-store\r\n";
    for (const auto& [name, value] : r.headers)
        append_header(out, name, value);
    out += "Content-Length: ";
    append_decimal(out, r.body.size());
    if (version >= 11)
        out += keep_alive ? "\r\n\r\n" : "\r\nConnection: close\r\n\r\n";
    else
        out += keep_alive ? "\r\nConnection: keep-alive\r\n\r\n" : "\r\n\r\n";
    if (!r.head) out += r.body;
    return out;
}
} // namespace

// A reply is written as it is in almost every case: straight into the socket's buffer, without
// an asynchronous operation, a timer or a completion handler. Only what the socket cannot take
// now waits (under the body timeout) for it to drain.
// Over TLS the reply is encrypted by an asynchronous write.
template <class Stream>
asio::awaitable<bool> http_server::impl::write(Stream& stream, unsigned version, bool keep_alive,
                                               http::reply r) {
    keep_alive = keep_alive && !stopped.load();
    auto bytes = response_bytes(r, version, keep_alive);
    boost::system::error_code ec;
    std::size_t sent = 0;
    if constexpr (!is_tls<Stream>) {
        auto& socket = stream.socket();
        if (!socket.non_blocking()) socket.non_blocking(true, ec); // set once: it costs an ioctl
        while (!ec && sent < bytes.size())
            sent += socket.write_some(asio::buffer(bytes.data() + sent, bytes.size() - sent), ec);
        if (ec != asio::error::would_block && ec != asio::error::try_again) co_return !ec && keep_alive;
        ec = {};
    }
    auto& tcp_layer = beast::get_lowest_layer(stream);
    tcp_layer.expires_after(opts.body_timeout);
    std::tie(ec, std::ignore) = co_await asio::async_write(
        stream, asio::buffer(bytes.data() + sent, bytes.size() - sent), use_tuple);
    tcp_layer.expires_never();
    co_return !ec && keep_alive;
}

// server.tls: the handshake, under the header timeout, before the first request is read. A
// client that speaks plain HTTP (or nothing) to a TLS listener is closed.
asio::awaitable<void> http_server::impl::handshake(std::shared_ptr<impl> self, tcp::socket socket,
                                                   std::shared_ptr<void> share,
                                                   std::shared_ptr<void> address_share) {
    tls_stream stream(beast::tcp_stream(std::move(socket)), *self->tls);
    auto& tcp_layer = beast::get_lowest_layer(stream);
    tcp_layer.expires_after(self->opts.header_timeout);
    // A TLS record starts with 0x16 (handshake). Anything else is most likely plain HTTP sent to
    // this port: it gets a plain answer that says so, as nginx does.
    char first[4096];
    auto [rec, got] = co_await tcp_layer.async_read_some(asio::buffer(first), use_tuple);
    if (rec) co_return;
    if (static_cast<unsigned char>(first[0]) != 0x16) {
        auto r = http::error_reply(errc::invalid_request,
                                   "this port speaks TLS (server.tls): use https:// or wss://");
        auto bytes = response_bytes(r, 11, false);
        tcp_layer.expires_after(std::chrono::seconds(1));
        co_await asio::async_write(tcp_layer, asio::buffer(bytes), use_tuple);
        boost::system::error_code ignored;
        tcp_layer.socket().shutdown(tcp::socket::shutdown_send, ignored);
        // The rest of what it sent is dropped within that same second.
        co_await drain(tcp_layer);
        co_return;
    }
    auto [ec, used] =
        co_await stream.async_handshake(ssl::stream_base::server, asio::buffer(first, got), use_tuple);
    if (ec) {
        log::debug("TLS handshake failed", {{"error", ec.message()}});
        co_return;
    }
    tcp_layer.expires_never();
    co_await serve(std::move(self), std::move(stream), std::move(share), std::move(address_share));
}

// One connection: requests are read and answered in order (pipelined ones wait in the buffer).
template <class Stream>
asio::awaitable<void> http_server::impl::serve(std::shared_ptr<impl> self, Stream stream,
                                               std::shared_ptr<void> share,
                                               std::shared_ptr<void> address_share) {
    // Until the connection closes or becomes a WebSocket (counted by its slot from then on).
    auto open = self->metrics.open_connection(connection_kind::http);
    auto& tcp_layer = beast::get_lowest_layer(stream);
    beast::flat_buffer buffer;
    read_deadline deadline(tcp_layer.socket());
    const auto& opts = self->opts;
    for (;;) {
        if (buffer.size() == 0) {
            // Keep-alive: wait for the next request's first byte under the idle timeout.
            tcp_layer.expires_after(opts.idle_timeout);
            auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), use_tuple);
            if (ec) break;
            buffer.commit(n);
        }
        bhttp::request_parser<bhttp::string_body> parser;
        parser.header_limit(static_cast<std::uint32_t>(opts.max_header_bytes));
        parser.body_limit(opts.max_body_bytes);
        tcp_layer.expires_never();
        // A request that arrived whole (nearly every one) is parsed where it lies; the reads
        // below, under their deadlines, are for the rest of one that did not.
        auto hec = parse_buffered(parser, buffer);
        if (!hec && !parser.is_header_done()) {
            deadline.arm(opts.header_timeout);
            std::tie(hec, std::ignore) =
                co_await bhttp::async_read_header(stream, buffer, parser, use_tuple);
            if (deadline.disarm()) hec = beast::error::timeout;
        }
        if (!hec) {
            if (auto why = head_refusal(parser)) {
                co_await self->write(stream, parser.get().version(), false,
                                     http::error_reply(errc::invalid_request, *why));
                break;
            }
        }
        if (!hec && !parser.is_done()) {
            auto expect = parser.get()[bhttp::field::expect];
            if (beast::iequals(expect, "100-continue")) {
                bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_,
                                                        parser.get().version()};
                co_await bhttp::async_write(stream, cont, use_tuple);
            }
            deadline.arm(opts.body_timeout);
            auto [bec, bn] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
            hec = deadline.disarm() ? beast::error::timeout : bec;
        }
        if (hec) {
            if (auto r = read_failure_reply(hec, true))
                co_await self->write(stream, 11, false, std::move(*r));
            break;
        }
        auto& req = parser.get();
        http::request_view view;
        view.method = req.method_string();
        view.target = req.target();
        view.content_type = req[bhttp::field::content_type];
        view.has_content_type = req.find(bhttp::field::content_type) != req.end();
        if (auto it = req.find("Idempotency-Key"); it != req.end()) {
            view.idempotency_key = it->value();
            view.has_idempotency_key = true;
        }
        view.body = req.body();
        if (auto it = req.find("Last-Event-ID"); it != req.end()) view.last_event_id = it->value();
        if (auto it = req.find(bhttp::field::authorization); it != req.end()) {
            view.authorization = it->value();
            view.has_authorization = true;
        }
        view.ws_protocols = req[bhttp::field::sec_websocket_protocol];
        view.host = req[bhttp::field::host];
        if (auto it = req.find(bhttp::field::origin); it != req.end()) {
            view.origin = it->value();
            view.has_origin = true;
        }
        // A connection that presented a valid token no longer counts against its address's cap.
        if (address_share && self->api.token_valid(view)) address_share.reset();
        std::string turn_id, query;
        auto kind = classify(req, turn_id, query);
        if (kind == stream_kind::websocket && self->ws && beast::websocket::is_upgrade(req)) {
            // What Beast's accept would refuse with a plain-text body, refused here in the API's
            // error shape (RFC 6455 4.2.1, 4.4: a version other than 13 gets 426 and the one we speak).
            auto key = req[bhttp::field::sec_websocket_key];
            auto version = req[bhttp::field::sec_websocket_version];
            bool bad_key = key.empty() || key.size() > 24;
            if (bad_key || version != "13") {
                auto r = bad_key ? http::error_reply(errc::invalid_request,
                                                     "Sec-WebSocket-Key: 16 bytes in base64 expected")
                                 : http::error_reply(errc::upgrade_required,
                                                     "Sec-WebSocket-Version: 13 expected, not '" +
                                                         std::string(version) + "'");
                if (!bad_key) r.headers.emplace_back("Sec-WebSocket-Version", "13");
                if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(r))) break;
                continue;
            }
            // The token of the upgrade: its Authorization header, or (a browser's only way) a
            // "bearer.<token>" subprotocol. Refused before a slot is taken.
            auto authorized = self->api.authorize(view, http::api::scope::tenant);
            if (auto* refused = std::get_if<http::reply>(&authorized)) {
                if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(*refused)))
                    break;
                continue;
            }
            auto slot = self->ws->try_open();
            if (!slot) {
                // The and API's word for a full channel: 503 at the upgrade.
                auto r = http::error_reply(errc::websocket_full, "too many WebSocket connections");
                co_await self->write(stream, req.version(), false, std::move(r));
                break;
            }
            // The connection belongs to the WebSocket channel from here on; this coroutine (and
            // its buffers) ends now, so that an idle WebSocket costs only what it needs itself.
            struct counted_slot {
                std::shared_ptr<void> slot;
                metrics_registry::connection_guard open;
                std::shared_ptr<void> share;         // of server.max_connections
                std::shared_ptr<void> address_share; // of server.max_connections_per_ip
            };
            // Not an HTTP connection any more: uncounted before it counts as a WebSocket, so
            // that no scrape sees it as both.
            open = metrics_registry::connection_guard{};
            slot = std::make_shared<counted_slot>(
                counted_slot{std::move(slot), self->metrics.open_connection(connection_kind::websocket),
                             std::move(share), std::move(address_share)});
            auto ex = stream.get_executor();
            boost::system::error_code blocking_ec;
            tcp_layer.socket().non_blocking(false, blocking_ec); // as the WebSocket code expects it
            // What came after the upgrade request is the client's first frames.
            std::string early(static_cast<const char*>(buffer.data().data()), buffer.size());
            asio::co_spawn(ex,
                           ws::serve(*self->ws, std::move(slot), std::move(stream), parser.release(),
                                     std::get<caller>(std::move(authorized)), std::move(early)),
                           log::spawn_logger{"ws connection"});
            co_return;
        }
        if (kind == stream_kind::websocket) {
            // Authorized first: the web page probes here whether its token would be taken.
            auto authorized = self->api.authorize(view, http::api::scope::tenant);
            if (auto* refused = std::get_if<http::reply>(&authorized)) {
                if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(*refused)))
                    break;
                continue;
            }
            auto r = self->ws ? http::error_reply(errc::upgrade_required,
                                                  "GET /v1/ws needs a WebSocket upgrade request")
                              : http::error_reply(errc::not_found, "the WebSocket channel is disabled");
            if (self->ws) r.headers.emplace_back("Upgrade", "websocket");
            if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(r))) break;
            continue;
        }
        if (kind == stream_kind::events) {
            std::variant<http::reply, http::event_stream> opened;
            try {
                opened = co_await self->api.open_events(view, turn_id, query);
            } catch (const std::exception& e) {
                log::error("request failed",
                           {{"target", std::string(view.target)}, {"error", e.what()}});
                opened = failure_reply(e);
            }
            bool again = false;
            if (auto* err = std::get_if<http::reply>(&opened))
                again = co_await self->write(stream, req.version(), req.keep_alive(), std::move(*err));
            else
                again = co_await self->stream_events(stream, req.version(), req.keep_alive(),
                                                     std::move(std::get<http::event_stream>(opened)));
            if (!again) break;
            continue;
        }
        http::reply r;
        try {
            r = co_await self->api.handle(view);
        } catch (const std::exception& e) {
            log::error("request failed", {{"target", std::string(view.target)}, {"error", e.what()}});
            r = failure_reply(e);
        }
        r.head = req.method() == bhttp::verb::head;
        if (!co_await self->write(stream, req.version(), req.keep_alive(), std::move(r))) break;
    }
    if constexpr (is_tls<Stream>) {
        // close_notify, then the peer's (or its close) for at most a second.
        tcp_layer.expires_after(std::chrono::seconds(1));
        co_await stream.async_shutdown(use_tuple);
    } else {
        boost::system::error_code ignored;
        tcp_layer.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
}

namespace {
// server.max_connections and max_connections_per_ip: a short answer, then the connection is
// closed; no request is read. In plain HTTP it is written without waiting (what the socket takes
// now); over TLS after a handshake of at most a second.
std::string overloaded_response(std::string_view message) {
    // Framed as every other answer is (Server, Cache-Control: no-store, ...), and closed.
    auto r = http::error_reply(errc::too_many_connections, message);
    r.headers.emplace_back("Retry-After", "1");
    return response_bytes(r, 11, false);
}

// What the client sent meanwhile is read and dropped for at most a second, so that closing does
// not reset the connection before it has read the answer.
asio::awaitable<void> drain_and_close(tcp::socket s) {
    beast::tcp_stream stream(std::move(s));
    stream.expires_after(std::chrono::seconds(1));
    co_await drain(stream);
}

asio::awaitable<void> refuse_tls(tcp::socket socket, ssl::context& ctx, std::string response) {
    tls_stream stream(beast::tcp_stream(std::move(socket)), ctx);
    auto& tcp_layer = beast::get_lowest_layer(stream);
    tcp_layer.expires_after(std::chrono::seconds(1));
    auto [ec] = co_await stream.async_handshake(ssl::stream_base::server, use_tuple);
    if (ec) co_return;
    std::tie(ec, std::ignore) = co_await asio::async_write(stream, asio::buffer(response), use_tuple);
    if (!ec) std::tie(ec) = co_await stream.async_shutdown(use_tuple);
}

void refuse(tcp::socket socket, std::string_view message, ssl::context* tls) {
    auto ex = socket.get_executor();
    if (tls) {
        asio::co_spawn(ex, refuse_tls(std::move(socket), *tls, overloaded_response(message)),
                       asio::detached);
        return;
    }
    boost::system::error_code wec;
    auto full = overloaded_response(message);
    socket.non_blocking(true, wec);
    socket.write_some(asio::buffer(full), wec);
    socket.shutdown(tcp::socket::shutdown_send, wec);
    asio::co_spawn(ex, drain_and_close(std::move(socket)), asio::detached);
}
} // namespace

asio::awaitable<void> http_server::impl::accept_loop(std::shared_ptr<impl> self) {
    for (;;) {
        auto [ec, socket] =
            co_await self->acceptor.async_accept(detail::make_thin_strand(self->ex), use_tuple);
        if (self->stopped.load()) co_return;
        if (ec) {
            if (ec == asio::error::operation_aborted) co_return;
            // Out of descriptors and the like: back off instead of spinning.
            log::warn("accept failed", {{"error", ec.message()}});
            asio::steady_timer pause(self->acceptor.get_executor(), std::chrono::milliseconds(50));
            co_await pause.async_wait(use_tuple);
            continue;
        }
        boost::system::error_code nodelay_ec;
        socket.set_option(tcp::no_delay(true), nodelay_ec);
        auto share = self->take_connection();
        bool address_full = false;
        auto address_share = share ? self->take_address_share(socket, address_full) : nullptr;
        if (!share || address_full) {
            refuse(std::move(socket),
                   share ? "too many connections from this address" : "too many connections",
                   self->tls.get());
            continue;
        }
        auto conn_ex = socket.get_executor();
        if (self->tls)
            asio::co_spawn(
                conn_ex, handshake(self, std::move(socket), std::move(share), std::move(address_share)),
                log::spawn_logger{"https connection"});
        else
            asio::co_spawn(conn_ex,
                           serve(self, beast::tcp_stream(std::move(socket)), std::move(share),
                                 std::move(address_share)),
                           log::spawn_logger{"http connection"});
    }
}

http_server::http_server(asio::any_io_executor ex, runtime& rt, http_server_options opts,
                         std::function<bool()> ready, ws::channel* websocket)
    : impl_(std::make_shared<impl>(std::move(ex), rt, opts, std::move(ready), websocket)) {}

http_server::~http_server() {
    stop();
}

boost::system::error_code http_server::listen(const tcp::endpoint& ep) {
    boost::system::error_code ec;
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    return ec;
}

tcp::endpoint http_server::local_endpoint() const {
    boost::system::error_code ec;
    return impl_->acceptor.local_endpoint(ec);
}

void http_server::start() {
    asio::co_spawn(impl_->acceptor.get_executor(), impl::accept_loop(impl_),
                   log::spawn_logger{"http accept loop"});
}

void http_server::stop() {
    if (impl_->stopped.exchange(true)) return;
    asio::post(impl_->acceptor.get_executor(), [self = impl_] {
        boost::system::error_code ec;
        self->acceptor.close(ec);
    });
}

} // namespace baton
