#include "tests/fake_openai.hpp"
#include "tests/fake_peer.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

namespace baton::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace json = boost::json;
namespace ssl = boost::asio::ssl;
using asio::ip::tcp;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

std::string hex(std::size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%zx", n);
    return buf;
}

} // namespace

std::optional<std::string> recorded_request::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (beast::iequals(k, name)) return v;
    return std::nullopt;
}

std::int64_t prompt_tokens_of(const json::value& request_body) {
    auto quarter = [](std::size_t bytes) { return static_cast<std::int64_t>((bytes + 3) / 4); };
    const auto* body = request_body.if_object();
    const auto* messages = body ? body->if_contains("messages") : nullptr;
    if (!messages || !messages->is_array()) return 0;
    std::int64_t total = 0;
    for (const auto& m : messages->get_array()) {
        const auto* msg = m.if_object();
        if (!msg) continue;
        total += 4;
        if (const auto* c = msg->if_contains("content"); c && c->is_string())
            total += quarter(c->get_string().size());
        const auto* calls = msg->if_contains("tool_calls");
        if (!calls || !calls->is_array()) continue;
        for (const auto& call : calls->get_array()) {
            const auto* f = call.is_object() ? call.get_object().if_contains("function") : nullptr;
            if (!f || !f->is_object()) continue;
            std::size_t bytes = 0;
            for (auto key : {"name", "arguments"})
                if (const auto* v = f->get_object().if_contains(key); v && v->is_string())
                    bytes += v->get_string().size();
            total += quarter(bytes);
        }
    }
    // Function definitions count too, as the model reads them.
    if (const auto* tools = body->if_contains("tools");
        tools && tools->is_array() && !tools->get_array().empty())
        total += quarter(json::serialize(*tools).size());
    return total;
}

json::object chunk(json::object delta, std::string finish_reason) {
    json::object choice{{"index", 0}, {"delta", std::move(delta)}};
    choice["finish_reason"] = finish_reason.empty() ? json::value(nullptr) : json::value(finish_reason);
    return {{"id", "chatcmpl-fake"},
            {"object", "chat.completion.chunk"},
            {"created", 1},
            {"model", "gpt-fake"},
            {"choices", json::array{std::move(choice)}}};
}

fake_reply fake_reply::completion(std::string text, std::vector<std::vector<std::string>> tool_calls,
                                  std::string finish_reason) {
    json::object message{{"role", "assistant"}};
    message["content"] = text.empty() ? json::value(nullptr) : json::value(text);
    if (!tool_calls.empty()) {
        json::array calls;
        for (auto& c : tool_calls)
            calls.push_back(
                json::object{{"id", c.at(0)},
                             {"type", "function"},
                             {"function", json::object{{"name", c.at(1)}, {"arguments", c.at(2)}}}});
        message["tool_calls"] = std::move(calls);
    }
    json::object body{
        {"id", "chatcmpl-fake"},
        {"object", "chat.completion"},
        {"created", 1},
        {"model", "gpt-fake"},
        {"choices",
         json::array{json::object{
             {"index", 0}, {"message", std::move(message)}, {"finish_reason", finish_reason}}}},
        {"usage", json::object{{"prompt_tokens", 7}, {"completion_tokens", 3}, {"total_tokens", 10}}}};
    fake_reply r;
    r.headers = {{"Content-Type", "application/json"}};
    r.pieces = {json::serialize(body)};
    return r;
}

fake_reply fake_reply::sse(const std::vector<json::object>& chunks, std::size_t piece_size, bool crlf,
                           bool done) {
    const std::string eol = crlf ? "\r\n" : "\n";
    std::vector<std::string> events;
    for (const auto& c : chunks)
        events.push_back("data: " + json::serialize(c) + eol + eol);
    if (done) events.push_back("data: [DONE]" + eol + eol);
    fake_reply r;
    r.headers = {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};
    r.chunked = true;
    r.piece_delay = std::chrono::microseconds(200);
    if (piece_size == 0) {
        r.pieces = std::move(events);
        return r;
    }
    std::string all;
    for (const auto& e : events)
        all += e;
    for (std::size_t i = 0; i < all.size(); i += piece_size)
        r.pieces.push_back(all.substr(i, piece_size));
    return r;
}

fake_reply fake_reply::stream_text(const std::vector<std::string>& deltas, std::size_t piece_size,
                                   bool crlf) {
    std::vector<json::object> chunks{chunk({{"role", "assistant"}, {"content", ""}})};
    for (const auto& d : deltas)
        chunks.push_back(chunk({{"content", d}}));
    chunks.push_back(chunk({}, "stop"));
    json::object usage = chunk({});
    usage["choices"] = json::array{};
    usage["usage"] = json::object{{"prompt_tokens", 11}, {"completion_tokens", 5}, {"total_tokens", 16}};
    chunks.push_back(std::move(usage));
    return sse(chunks, piece_size, crlf);
}

fake_reply fake_reply::error(unsigned status, std::string message,
                             std::optional<std::string> retry_after) {
    json::object body{
        {"error", json::object{{"message", std::move(message)},
                               {"type", status == 429 ? "rate_limit_error" : "server_error"},
                               {"code", nullptr}}}};
    fake_reply r;
    r.status = status;
    r.headers = {{"Content-Type", "application/json"}};
    if (retry_after) r.headers.emplace_back("Retry-After", *retry_after);
    r.pieces = {json::serialize(body)};
    return r;
}

fake_reply fake_reply::hang_up() {
    fake_reply r;
    r.send_head = false;
    r.drop_after = 0;
    return r;
}

struct fake_openai::impl {
    asio::io_context ctx;
    tcp::acceptor acceptor{ctx};
    std::thread thread;
    mutable std::mutex mutex;
    std::deque<fake_reply> replies;
    std::vector<recorded_request> requests;
    std::function<fake_reply(const recorded_request&)> handler;
    double token_scale = 0; // report prompt tokens as prompt_tokens_of times this; 0: off
    std::atomic<std::size_t> connections{0};
    unsigned short port = 0; // read by the test thread: cached before the server thread starts

    // The answer to request `index`: the next scripted reply, else the handler's, else a 500.
    fake_reply next(std::size_t index) {
        std::function<fake_reply(const recorded_request&)> h;
        recorded_request req;
        double scale = 0;
        {
            std::lock_guard lock(mutex);
            if (!replies.empty()) {
                auto r = std::move(replies.front());
                replies.pop_front();
                if (token_scale > 0) report_usage(r, requests[index].body, token_scale);
                return r;
            }
            if (!handler) return fake_reply::error(500, "fake_openai: no scripted reply left");
            h = handler;
            req = requests[index];
            scale = token_scale;
        }
        auto r = h(req);
        if (scale > 0) report_usage(r, req.body, scale);
        return r;
    }

    // Rewrites usage.prompt_tokens of a whole JSON answer to the fake's count of the request.
    static void report_usage(fake_reply& r, const json::value& request_body, double scale) {
        if (r.status != 200 || r.chunked || r.pieces.size() != 1) return;
        boost::system::error_code ec;
        auto v = json::parse(r.pieces[0], ec);
        auto* usage = ec || !v.is_object() ? nullptr : v.get_object().if_contains("usage");
        if (!usage || !usage->is_object()) return;
        auto prompt = static_cast<std::int64_t>(std::llround(prompt_tokens_of(request_body) * scale));
        auto& u = usage->get_object();
        const auto* completion = u.if_contains("completion_tokens");
        std::int64_t done = completion && completion->is_int64() ? completion->get_int64() : 0;
        u["prompt_tokens"] = prompt;
        u["total_tokens"] = prompt + done;
        r.pieces[0] = json::serialize(v);
    }

    std::size_t record(const bhttp::request<bhttp::string_body>& req) {
        recorded_request r{std::string(req.method_string()), std::string(req.target()), {}, nullptr};
        r.received_at = std::chrono::steady_clock::now();
        for (const auto& f : req)
            r.headers.emplace_back(f.name_string(), f.value());
        boost::system::error_code ec;
        auto v = json::parse(req.body(), ec);
        if (!ec) r.body = std::move(v);
        std::lock_guard lock(mutex);
        requests.push_back(std::move(r));
        return requests.size() - 1;
    }

    void answered(std::size_t index) {
        std::lock_guard lock(mutex);
        requests[index].answered_at = std::chrono::steady_clock::now();
    }

    // False when the connection must be closed afterwards (a drop, or a write error).
    asio::awaitable<bool> write_reply(beast::tcp_stream& stream, const fake_reply& r) {
        if (!r.send_head) co_return false;
        std::size_t total = 0;
        for (const auto& p : r.pieces)
            total += p.size();
        std::string head = r.interim + "HTTP/1.1 " + std::to_string(r.status) + " " +
                           std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(r.status))) +
                           "\r\n";
        for (const auto& [k, v] : r.headers)
            head += k + ": " + v + "\r\n";
        head += r.chunked ? "Transfer-Encoding: chunked\r\n"
                          : "Content-Length: " + std::to_string(total) + "\r\n";
        if (r.close) head += "Connection: close\r\n";
        head += "\r\n";
        auto [hec, hn] = co_await asio::async_write(stream, asio::buffer(head), use_tuple);
        if (hec) co_return false;
        std::size_t sent = 0;
        for (std::size_t i = 0; i < r.pieces.size(); ++i) {
            if (r.drop_after && sent >= *r.drop_after) co_return false;
            if (i > 0 && r.piece_delay.count() > 0) {
                asio::steady_timer t(ctx, r.piece_delay);
                co_await t.async_wait(use_tuple);
            }
            std::string_view piece = r.pieces[i];
            auto take = r.drop_after ? std::min(piece.size(), *r.drop_after - sent) : piece.size();
            std::string out;
            if (r.chunked) out = hex(piece.size()) + "\r\n";
            out.append(piece.substr(0, take));
            if (r.chunked && take == piece.size()) out += "\r\n";
            auto [ec, n] = co_await asio::async_write(stream, asio::buffer(out), use_tuple);
            if (ec) co_return false;
            sent += take;
        }
        if (r.drop_after) co_return false;
        if (r.chunked) {
            auto [ec, n] = co_await asio::async_write(
                stream, asio::buffer(std::string_view("0\r\n\r\n")), use_tuple);
            if (ec) co_return false;
        }
        co_return !r.close;
    }

    asio::awaitable<void> serve(tcp::socket socket) {
        boost::system::error_code ec;
        socket.set_option(tcp::no_delay(true), ec); // pieces leave at once, not batched by Nagle
        beast::tcp_stream stream(std::move(socket));
        beast::flat_buffer buffer;
        for (;;) {
            bhttp::request_parser<bhttp::string_body> p;
            p.body_limit(64 * 1024 * 1024);
            auto [rec, n] = co_await bhttp::async_read(stream, buffer, p, use_tuple);
            if (rec) co_return;
            auto index = record(p.get());
            auto reply = next(index);
            if (reply.delay.count() > 0) {
                asio::steady_timer t(ctx, reply.delay);
                co_await t.async_wait(use_tuple);
            }
            // Stamped before the write: a request that depends on this answer is received later.
            answered(index);
            bool keep = co_await write_reply(stream, reply);
            if (!keep || !p.get().keep_alive()) {
                stream.socket().shutdown(tcp::socket::shutdown_both, ec);
                co_return;
            }
        }
    }

    asio::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
            if (ec) co_return;
            ++connections;
            asio::co_spawn(ctx, serve(std::move(socket)), report_fake_failure);
        }
    }
};

fake_openai::fake_openai() : impl_(std::make_unique<impl>()) {
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen();
    impl_->port = impl_->acceptor.local_endpoint().port();
    asio::co_spawn(impl_->ctx, impl_->accept_loop(), report_fake_failure);
    impl_->thread = std::thread([this] { impl_->ctx.run(); });
}

// Stopping the context abandons the server coroutines mid-wait; their frames (and sockets) go
// with the context.
fake_openai::~fake_openai() {
    impl_->ctx.stop();
    impl_->thread.join();
}

unsigned short fake_openai::port() const {
    return impl_->port;
}

std::string fake_openai::base_url() const {
    return "http://127.0.0.1:" + std::to_string(port()) + "/v1";
}

void fake_openai::push(fake_reply r) {
    std::lock_guard lock(impl_->mutex);
    impl_->replies.push_back(std::move(r));
}

void fake_openai::set_handler(std::function<fake_reply(const recorded_request&)> handler) {
    std::lock_guard lock(impl_->mutex);
    impl_->handler = std::move(handler);
}

void fake_openai::report_prompt_tokens(double scale) {
    std::lock_guard lock(impl_->mutex);
    impl_->token_scale = scale;
}

std::vector<recorded_request> fake_openai::requests() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->requests;
}

std::size_t fake_openai::connections() const {
    return impl_->connections.load();
}

std::size_t fake_openai::pending() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->replies.size();
}

tls_identity make_self_signed(const std::string& san) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    if (!key || !cert) throw std::runtime_error("make_self_signed: out of memory");
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert),
                     static_cast<long>(std::random_device{}() & 0x7fffffff));
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    // A distinct subject per identity: OpenSSL finds issuers by name, and two trusted certificates
    // with one name would fail each other's verification for the wrong reason.
    const std::string cn = "baton-test " + san;
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, cert, cert, nullptr, nullptr, 0);
    const std::pair<int, std::string> exts[] = {{NID_subject_alt_name, san},
                                                {NID_basic_constraints, "critical,CA:TRUE"},
                                                {NID_subject_key_identifier, "hash"}};
    for (const auto& [nid, value] : exts) {
        X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value.c_str());
        if (!ext) throw std::runtime_error("make_self_signed: bad extension " + value);
        X509_add_ext(cert, ext, -1);
        X509_EXTENSION_free(ext);
    }
    X509_sign(cert, key, EVP_sha256());
    auto pem = [](auto write) {
        BIO* bio = BIO_new(BIO_s_mem());
        write(bio);
        char* data = nullptr;
        long n = BIO_get_mem_data(bio, &data);
        std::string out(data, static_cast<std::size_t>(n));
        BIO_free(bio);
        return out;
    };
    tls_identity id;
    id.cert_pem = pem([&](BIO* b) { PEM_write_bio_X509(b, cert); });
    id.key_pem =
        pem([&](BIO* b) { PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
    X509_free(cert);
    EVP_PKEY_free(key);
    return id;
}

struct tls_responder::impl {
    asio::io_context ctx;
    ssl::context tls{ssl::context::tls_server};
    tcp::acceptor acceptor{ctx};
    std::thread thread;
    std::atomic<std::size_t> handshakes{0};
    unsigned short port = 0;

    asio::awaitable<void> serve(tcp::socket socket) {
        ssl::stream<tcp::socket> stream(std::move(socket), tls);
        auto [ec] = co_await stream.async_handshake(ssl::stream_base::server, use_tuple);
        if (ec) co_return;
        ++handshakes;
        std::string request;
        auto [rec, rn] = co_await asio::async_read_until(stream, asio::dynamic_buffer(request),
                                                         "\r\n\r\n", use_tuple);
        if (rec) co_return;
        std::string_view reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        co_await asio::async_write(stream, asio::buffer(reply), use_tuple);
    }

    asio::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
            if (ec) co_return;
            asio::co_spawn(ctx, serve(std::move(socket)), report_fake_failure);
        }
    }
};

tls_responder::tls_responder(const tls_identity& id) : impl_(std::make_unique<impl>()) {
    impl_->tls.use_certificate_chain(asio::buffer(id.cert_pem));
    impl_->tls.use_private_key(asio::buffer(id.key_pem), ssl::context::pem);
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen();
    impl_->port = impl_->acceptor.local_endpoint().port();
    asio::co_spawn(impl_->ctx, impl_->accept_loop(), report_fake_failure);
    impl_->thread = std::thread([this] { impl_->ctx.run(); });
}

tls_responder::~tls_responder() {
    impl_->ctx.stop();
    impl_->thread.join();
}

unsigned short tls_responder::port() const {
    return impl_->port;
}

std::size_t tls_responder::handshakes() const {
    return impl_->handshakes.load();
}

} // namespace baton::test
