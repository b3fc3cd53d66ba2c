// The library's only HTTP client translation unit: Beast's client side and Asio's TLS live here.
#include <baton/detail/async.hpp>
#include <baton/http_client.hpp>

#include <baton/strand.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace baton {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using asio::ip::tcp;
using boost::system::error_code;
using clock_type = std::chrono::steady_clock;
using head_fn = std::function<void(const http_response&)>;
using body_fn = std::function<void(std::string_view)>;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
constexpr std::uint64_t body_limit = 64 * 1024 * 1024;

struct target {
    bool tls = false;
    std::string host; // a name or an address, without IPv6 brackets
    std::uint16_t port = 0;
    std::string host_header;
    std::string path; // origin-form: path and query
    std::string key;  // the pool's endpoint: scheme://host:port
};

boost::system::result<target> parse_target(std::string_view url) {
    const auto bad = make_error_code(boost::system::errc::invalid_argument);
    auto u = boost::urls::parse_uri(url);
    if (!u) return bad;
    target t;
    if (u->scheme_id() == boost::urls::scheme::https)
        t.tls = true;
    else if (u->scheme_id() != boost::urls::scheme::http)
        return bad;
    if (!u->has_authority() || u->encoded_host().empty()) return bad;
    t.host = u->host_address();
    t.port = t.tls ? 443 : 80;
    if (u->has_port() && !u->port().empty()) {
        auto p = u->port();
        auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), t.port);
        if (ec != std::errc{} || end != p.data() + p.size() || t.port == 0) return bad;
    }
    t.host_header = u->encoded_host_and_port();
    t.path = u->encoded_target();
    if (t.path.empty() || t.path.front() != '/') t.path.insert(0, "/");
    t.key = std::string(t.tls ? "https://" : "http://") + t.host + ":" + std::to_string(t.port);
    return t;
}

// parse_target of the URL this thread asked for last (a model's or a webhook's, the same for
// every call): the parse is skipped when it repeats.
boost::system::result<std::shared_ptr<const target>> cached_target(std::string_view url) {
    thread_local std::string last_url;
    thread_local std::shared_ptr<const target> last;
    if (last && last_url == url) return last;
    auto t = parse_target(url);
    if (!t) return t.error();
    last_url.assign(url);
    last = std::make_shared<const target>(std::move(*t));
    return last;
}

// A request as it goes on the wire: its head serialized once, for every attempt, and its body,
// the caller's (or run()'s own copy), only pointed at. Two buffers, one gathered write.
struct outgoing_request {
    std::string head;
    std::string_view body;
    bool head_method = false; // HEAD: the response has no body
};

// The head in HTTP/1.1 form: the request line, Host (the URL's, or the caller's own Host header),
// the caller's headers in order, and Content-Length where a body is sent (or a POST, PUT or
// OPTIONS says that it is empty), as Beast's prepare_payload would. The caller's Content-Length
// and Transfer-Encoding are dropped: the body is framed here. A method that is not a token, a
// header name that is empty or not a token, or a value holding CR, LF or NUL (a header could
// otherwise be smuggled in) is invalid_argument, as is a TRACE with a body.
boost::system::result<outgoing_request> make_request(const std::string& method, const target& t,
                                                     const http_headers& headers, std::string_view body) {
    const auto bad = make_error_code(boost::system::errc::invalid_argument);
    auto token = [](std::string_view s) {
        return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
            return c > 0x20 && c < 0x7f && !std::strchr("\"(),/:;<=>?@[\\]{}", c);
        });
    };
    auto clean = [](std::string_view s) { return s.find_first_of(std::string_view("\r\n\0", 3)) == s.npos; };
    if (!token(method) || (method == "TRACE" && !body.empty())) return bad;
    std::string_view host = t.host_header;
    std::size_t size = method.size() + t.path.size() + 32 + host.size();
    for (const auto& [name, value] : headers) {
        if (!token(name) || !clean(value)) return bad;
        if (beast::iequals(name, "host")) host = value;
        size += name.size() + value.size() + 4;
    }
    outgoing_request r;
    r.body = body;
    r.head_method = method == "HEAD";
    auto& h = r.head;
    h.reserve(size + 32);
    h.append(method).append(" ").append(t.path).append(" HTTP/1.1\r\nHost: ").append(host).append("\r\n");
    for (const auto& [name, value] : headers) {
        if (beast::iequals(name, "host") || beast::iequals(name, "content-length") ||
            beast::iequals(name, "transfer-encoding"))
            continue;
        h.append(name).append(": ").append(value).append("\r\n");
    }
    if (!body.empty() || method == "POST" || method == "PUT" || method == "OPTIONS")
        h.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
    h.append("\r\n");
    return r;
}

// Errors meaning a reused connection had been closed by the server while it sat in the pool.
bool stale_connection_error(const error_code& ec) {
    return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
           ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
           ec == asio::error::connection_aborted || ec == ssl::error::stream_truncated;
}

struct connection {
    asio::any_io_executor strand; // every operation on this connection runs here
    std::optional<beast::tcp_stream> plain;
    std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
    // Beast reads at most what the buffer holds free, and never less than 512 bytes: a new one's
    // 512 made three reads (three system calls) of a short model reply. Sized in connect().
    static constexpr std::size_t read_size = 16384;
    beast::flat_buffer buffer;
    // Bounds an exchange (see exchange_deadline); on the strand, made with the stream.
    std::optional<asio::steady_timer> timer;
    // Where body pieces land; with the connection, not in every exchange's coroutine frame.
    std::array<char, 16384> piece;

    beast::tcp_stream& tcp() { return plain ? *plain : tls->next_layer(); }

    clock_type::time_point idle_since; // when it went back to the pool

    // An idle keep-alive connection is usable when the server has neither closed it (a FIN reads
    // as 0) nor sent anything unasked (a TLS close_notify, or bytes we could not frame). One that
    // went back to the pool less than fresh_idle ago is taken without asking the socket (a system
    // call a request): a server seldom closes a connection that soon, and when it did, the request
    // finds it closed before any answer and is sent again on a new one (see run()).
    static constexpr auto fresh_idle = std::chrono::milliseconds(500);
    bool alive(clock_type::time_point now) {
        auto& sock = tcp().socket();
        if (!sock.is_open() || buffer.size() != 0) return false;
        if (now - idle_since < fresh_idle) return true;
        char byte;
        auto n = ::recv(sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
};

struct exchange_state {
    error_code ec;
    bool got_response = false; // a response byte arrived: the server saw the request
    bool reusable = false;
};

struct attempt_result {
    exchange_state st;
    http_response out;
    std::unique_ptr<connection> conn; // handed back for the pool when reusable
};

// Resolution state shared with the resolver's handler: getaddrinfo cannot be interrupted, so on
// timeout the lookup is left to finish in the background and this keeps what it touches alive.
struct resolve_state {
    explicit resolve_state(const asio::any_io_executor& strand) : resolver(strand), wake(strand) {}
    tcp::resolver resolver;
    asio::steady_timer wake;
    bool done = false;
    error_code ec;
    std::vector<tcp::endpoint> endpoints;
};

// Resolves a host name within `deadline`. Runs on the connection's strand, which the resolver's
// handler shares. Cancellation: the awaiting coroutine's slot.
asio::awaitable<std::pair<error_code, std::vector<tcp::endpoint>>>
resolve(asio::any_io_executor strand, std::string host, std::uint16_t port,
        clock_type::time_point deadline) {
    auto st = std::make_shared<resolve_state>(strand);
    st->wake.expires_at(deadline);
    auto on_resolved = [st](error_code ec, const tcp::resolver::results_type& results) {
        st->done = true;
        st->ec = ec;
        for (const auto& e : results)
            st->endpoints.push_back(e.endpoint());
        st->wake.cancel();
    };
    st->resolver.async_resolve(host, std::to_string(port), asio::bind_executor(strand, on_resolved));
    auto [ec] = co_await st->wake.async_wait(use_tuple);
    if (st->done) co_return std::pair{st->ec, std::move(st->endpoints)};
    co_return std::pair{ec ? error_code(asio::error::operation_aborted)
                           : error_code(beast::error::timeout),
                        std::vector<tcp::endpoint>{}};
}

// One timer bounds a whole exchange, instead of the stream's expiry: Beast's basic_stream sets a
// timer for every read and write it does and cancels it when that ends (~6 a streamed call). At
// the deadline the socket's operations are cancelled and the exchange ends with error::timeout.
// The timer's handler and the exchange share the connection's strand; `done` tells a handler
// that comes late (the exchange ended, the connection may be gone) to touch nothing.
class exchange_deadline {
public:
    exchange_deadline(connection& c, clock_type::time_point at)
        : c_(c), watch_(std::make_shared<watch>()) {
        c.tcp().expires_never();
        if (!c.timer) c.timer.emplace(c.strand);
        c.timer->expires_at(at);
        c.timer->async_wait([w = watch_, &c](error_code ec) {
            if (ec || w->done) return;
            w->fired = true;
            error_code ignored;
            c.tcp().socket().cancel(ignored);
        });
    }
    ~exchange_deadline() {
        watch_->done = true;
        c_.timer->cancel();
    }
    exchange_deadline(const exchange_deadline&) = delete;
    exchange_deadline& operator=(const exchange_deadline&) = delete;

    // What an operation that just ended means: a timeout once the deadline has passed (even if
    // the operation itself got through just before), else its own error.
    error_code outcome(error_code ec) const {
        return watch_->fired ? error_code(beast::error::timeout) : ec;
    }

private:
    struct watch {
        bool done = false, fired = false;
    };
    connection& c_;
    std::shared_ptr<watch> watch_;
};

// The body of the response is read piece by piece into `piece`, each piece handed to on_body (or
// appended to out.body when there is none); everything is bounded by `deadline`.
template <class Stream>
asio::awaitable<void> exchange(Stream& s, connection& c, outgoing_request& req,
                               clock_type::time_point deadline, http_response& out,
                               const head_fn& on_head, const body_fn& on_body, exchange_state& st) {
    exchange_deadline bound(c, deadline);
    const std::array<asio::const_buffer, 2> out_buffers{asio::buffer(req.head), asio::buffer(req.body)};
    auto [wec, wn] = co_await asio::async_write(s, out_buffers, use_tuple);
    if ((st.ec = bound.outcome(wec))) co_return;
    std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
    // Interim answers (100 Continue, 103 Early Hints) come before the real one and are skipped
    // (RFC 9110 15.2); a few at most, so that a peer cannot keep us here.
    for (int interim = 0;; ++interim) {
        parser.emplace();
        parser->body_limit(body_limit);
        if (req.head_method) parser->skip(true);
        auto [hec, hn] = co_await bhttp::async_read_header(s, c.buffer, *parser, use_tuple);
        st.got_response = st.got_response || parser->got_some();
        if ((st.ec = bound.outcome(hec))) co_return;
        auto code = parser->get().result_int();
        if (code < 100 || code >= 200 || code == 101 || interim == 4) break;
    }
    auto& p = *parser;
    out.status = p.get().result_int();
    for (const auto& f : p.get())
        out.headers.emplace_back(f.name_string(), f.value());
    if (on_head) on_head(out);
    auto& piece = c.piece;
    while (!p.is_done()) {
        p.get().body().data = piece.data();
        p.get().body().size = piece.size();
        // read_some, not read: a streamed body must reach on_body as soon as it arrives.
        auto [ec, n] = co_await bhttp::async_read_some(s, c.buffer, p, use_tuple);
        std::string_view got(piece.data(), piece.size() - p.get().body().size);
        if (!got.empty()) {
            if (on_body)
                on_body(got);
            else
                out.body.append(got);
        }
        if (ec == bhttp::error::need_buffer) ec = {};
        if ((st.ec = bound.outcome(ec))) co_return;
    }
    st.reusable = p.keep_alive() && c.buffer.size() == 0;
}

} // namespace

std::optional<std::string_view> http_response::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (beast::iequals(k, name)) return std::string_view(v);
    return std::nullopt;
}

struct http_client::impl {
    impl(asio::any_io_executor e, http_client_options o) : ex(std::move(e)), opts(std::move(o)) {}

    asio::any_io_executor ex;
    http_client_options opts;

    // Made on the first https request: loading the system trust store costs milliseconds that a
    // plain-http client (tests, local models) should not pay. A bad trust store fails the https
    // requests with its error instead of throwing.
    std::once_flag tls_once;
    std::optional<ssl::context> tls_ctx;
    error_code tls_setup_error;

    ssl::context* tls_context(error_code& ec) {
        std::call_once(tls_once, [this] {
            tls_ctx.emplace(ssl::context::tls_client);
            SSL_CTX_set_min_proto_version(tls_ctx->native_handle(), TLS1_2_VERSION);
            if (!opts.verify_peer) {
                tls_ctx->set_verify_mode(ssl::verify_none);
                return;
            }
            if (opts.ca_file.empty())
                tls_ctx->set_default_verify_paths(tls_setup_error);
            else
                tls_ctx->load_verify_file(opts.ca_file, tls_setup_error);
            if (!tls_setup_error) tls_ctx->set_verify_mode(ssl::verify_peer, tls_setup_error);
        });
        ec = tls_setup_error;
        return ec ? nullptr : &*tls_ctx;
    }

    mutable std::mutex mutex;
    bool closed = false;
    std::unordered_map<std::string, std::deque<std::unique_ptr<connection>>> idle;

    std::unique_ptr<connection> take(const std::string& key) {
        const auto now = clock_type::now();
        std::lock_guard lock(mutex);
        auto it = idle.find(key);
        if (it == idle.end()) return nullptr;
        // The most recently used first: it is the least likely to have been closed by the server.
        while (!it->second.empty()) {
            auto c = std::move(it->second.back());
            it->second.pop_back();
            if (c->alive(now)) return c;
        }
        return nullptr;
    }

    void put(const std::string& key, std::unique_ptr<connection> c) {
        std::lock_guard lock(mutex);
        if (closed || opts.max_idle_per_endpoint == 0) return;
        auto& list = idle[key];
        c->idle_since = clock_type::now();
        list.push_back(std::move(c));
        while (list.size() > opts.max_idle_per_endpoint)
            list.pop_front();
    }

    void close() {
        std::lock_guard lock(mutex);
        closed = true;
        idle.clear();
    }

    static asio::awaitable<std::pair<error_code, std::unique_ptr<connection>>>
    open(std::shared_ptr<impl> self, const target& t, asio::any_io_executor strand,
         clock_type::time_point deadline);

    static asio::awaitable<attempt_result>
    attempt(std::shared_ptr<impl> self, const target& t, outgoing_request& req,
            clock_type::time_point deadline, std::unique_ptr<connection> conn,
            asio::any_io_executor strand, const head_fn& on_head, const body_fn& on_body);

    static asio::awaitable<std::pair<error_code, http_response>>
    run(std::shared_ptr<impl> self, std::string method, std::string url, http_headers headers,
        std::string owned, std::string_view body, std::chrono::milliseconds timeout, head_fn on_head,
        body_fn on_body);
};

// Connects (and for https, handshakes) a new connection on `strand`, within the connect timeout.
// Cancellation: the awaiting coroutine's slot (resolve, connect and handshake are all aborted).
asio::awaitable<std::pair<error_code, std::unique_ptr<connection>>>
http_client::impl::open(std::shared_ptr<impl> self, const target& t, asio::any_io_executor strand,
                        clock_type::time_point deadline) {
    using result = std::pair<error_code, std::unique_ptr<connection>>;
    auto connect_deadline = std::min(deadline, clock_type::now() + self->opts.connect_timeout);
    ssl::context* tls_ctx = nullptr;
    error_code ec;
    if (t.tls && !(tls_ctx = self->tls_context(ec))) co_return result{ec, nullptr};

    auto address = asio::ip::make_address(t.host, ec);
    const bool is_address = !ec;
    std::vector<tcp::endpoint> endpoints;
    if (is_address) {
        endpoints.emplace_back(address, t.port);
    } else {
        auto [rec, found] = co_await resolve(strand, t.host, t.port, connect_deadline);
        if (rec) co_return result{rec, nullptr};
        endpoints = std::move(found);
    }

    auto c = std::make_unique<connection>();
    c->strand = strand;
    c->buffer.reserve(connection::read_size);
    if (t.tls)
        c->tls.emplace(strand, *tls_ctx);
    else
        c->plain.emplace(strand);
    c->tcp().expires_at(connect_deadline);
    auto [cec, ep] = co_await c->tcp().async_connect(endpoints, use_tuple);
    if (cec) co_return result{cec, nullptr};
    c->tcp().socket().set_option(tcp::no_delay(true), ec);
    if (!t.tls) co_return result{error_code(), std::move(c)};

    // SNI carries host names only (RFC 6066); verification checks names and IP addresses alike.
    if (!is_address && !SSL_set_tlsext_host_name(c->tls->native_handle(), t.host.c_str()))
        co_return result{
            error_code(static_cast<int>(::ERR_get_error()), asio::error::get_ssl_category()), nullptr};
    if (self->opts.verify_peer) c->tls->set_verify_callback(ssl::host_name_verification(t.host));
    c->tcp().expires_at(connect_deadline);
    auto [hec] = co_await c->tls->async_handshake(ssl::stream_base::client, use_tuple);
    if (hec) co_return result{hec, nullptr};
    co_return result{error_code(), std::move(c)};
}

// One try on one connection (a new one when `conn` is null), run on the connection's strand:
// Beast's tcp_stream wants its I/O and its timeout handler on one strand, whatever thread the
// caller runs on. Cancellation: co_spawn forwards the caller's, dispatched onto the strand.
asio::awaitable<attempt_result>
http_client::impl::attempt(std::shared_ptr<impl> self, const target& t, outgoing_request& req,
                           clock_type::time_point deadline, std::unique_ptr<connection> conn,
                           asio::any_io_executor strand, const head_fn& on_head,
                           const body_fn& on_body) {
    attempt_result r;
    try {
        if (!conn) {
            auto [ec, fresh] = co_await open(self, t, strand, deadline);
            r.st.ec = ec;
            conn = std::move(fresh);
        }
        if (!r.st.ec && conn->tls)
            co_await exchange(*conn->tls, *conn, req, deadline, r.out, on_head, on_body, r.st);
        else if (!r.st.ec)
            co_await exchange(*conn->plain, *conn, req, deadline, r.out, on_head, on_body, r.st);
    } catch (const boost::system::system_error& e) {
        // A cancelled coroutine throws at its next co_await; report it like an aborted read.
        if (e.code() != asio::error::operation_aborted) throw;
        r.st = {e.code(), r.st.got_response, false};
    }
    // Anything else is closed here, on its strand: an aborted or failed connection is never pooled.
    if (!r.st.ec && r.st.reusable) r.conn = std::move(conn);
    co_return r;
}

// The body sent is `owned` (kept in this frame) when `body` is null, else `body` (the caller's,
// from a borrowed_body, which is never null).
asio::awaitable<std::pair<error_code, http_response>>
http_client::impl::run(std::shared_ptr<impl> self, std::string method, std::string url,
                       http_headers headers, std::string owned, std::string_view body,
                       std::chrono::milliseconds timeout, head_fn on_head, body_fn on_body) {
    using result = std::pair<error_code, http_response>;
    const auto deadline = clock_type::now() + timeout;
    auto parsed = cached_target(url);
    if (!parsed) co_return result{parsed.error(), {}};
    const std::shared_ptr<const target> t = std::move(*parsed);
    auto made = make_request(method, *t, headers, body.data() ? body : owned);
    if (!made) co_return result{made.error(), {}};
    auto& req = *made;

    for (int n = 0;; ++n) {
        auto conn = n == 0 ? self->take(t->key) : nullptr;
        const bool reused = conn != nullptr;
        auto strand = reused ? conn->strand : detail::make_thin_strand(self->ex);
        attempt_result r;
        try {
            r = co_await detail::run_on(
                strand, attempt(self, *t, req, deadline, std::move(conn), strand, on_head, on_body));
        } catch (const boost::system::system_error& e) {
            // Cancelled before the attempt could start.
            if (e.code() != asio::error::operation_aborted) throw;
            r.st.ec = e.code();
        }
        if (!r.st.ec) {
            if (r.conn) self->put(t->key, std::move(r.conn));
            co_return result{error_code(), std::move(r.out)};
        }
        // The server closed a pooled connection before seeing the request: once more, afresh.
        if (reused && n == 0 && !r.st.got_response && stale_connection_error(r.st.ec)) continue;
        co_return result{r.st.ec, std::move(r.out)};
    }
}

http_client::http_client(asio::any_io_executor ex, http_client_options opts)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(opts))) {}

http_client::~http_client() {
    impl_->close();
}

asio::awaitable<std::pair<error_code, http_response>>
http_client::request(std::string method, std::string url, http_headers headers, std::string body,
                     std::chrono::milliseconds timeout) {
    return impl::run(impl_, std::move(method), std::move(url), std::move(headers), std::move(body), {},
                     timeout, nullptr, nullptr);
}

asio::awaitable<std::pair<error_code, http_response>>
http_client::request(std::string method, std::string url, http_headers headers, borrowed_body body,
                     std::chrono::milliseconds timeout) {
    return impl::run(impl_, std::move(method), std::move(url), std::move(headers), {}, body.text,
                     timeout, nullptr, nullptr);
}

asio::awaitable<std::pair<error_code, http_response>>
http_client::stream(std::string method, std::string url, http_headers headers, std::string body,
                    std::chrono::milliseconds timeout, std::function<void(const http_response&)> on_head,
                    std::function<void(std::string_view)> on_body) {
    return impl::run(impl_, std::move(method), std::move(url), std::move(headers), std::move(body), {},
                     timeout, std::move(on_head), std::move(on_body));
}

asio::awaitable<std::pair<error_code, http_response>>
http_client::stream(std::string method, std::string url, http_headers headers, borrowed_body body,
                    std::chrono::milliseconds timeout, std::function<void(const http_response&)> on_head,
                    std::function<void(std::string_view)> on_body) {
    return impl::run(impl_, std::move(method), std::move(url), std::move(headers), {}, body.text,
                     timeout, std::move(on_head), std::move(on_body));
}

std::size_t http_client::idle_connections() const {
    std::lock_guard lock(impl_->mutex);
    std::size_t n = 0;
    for (const auto& [key, list] : impl_->idle)
        n += list.size();
    return n;
}

} // namespace baton
