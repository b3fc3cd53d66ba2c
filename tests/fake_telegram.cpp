#include "tests/fake_telegram.hpp"
#include "tests/fake_peer.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace baton::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace json = boost::json;
using asio::ip::tcp;
using clock = std::chrono::steady_clock;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

struct injected {
    std::size_t left = 0;
    unsigned status = 500;
    std::string description;
    std::optional<int> retry_after;
};

struct answer {
    unsigned status = 200;
    json::object body;
};

answer api_error(unsigned status, const std::string& description, std::optional<int> retry_after = {}) {
    json::object body{{"ok", false}, {"error_code", status}, {"description", description}};
    if (retry_after) body["parameters"] = json::object{{"retry_after", *retry_after}};
    return {status, std::move(body)};
}

} // namespace

struct fake_telegram::impl {
    std::string token;
    asio::io_context ctx;
    tcp::acceptor acceptor{ctx};
    // While down: the port bound but not listening (connections are refused), so that no other
    // process of a parallel test run takes it meanwhile.
    tcp::socket holder{ctx};
    // Keeps the thread running while the server is down (no acceptor, no connection).
    asio::executor_work_guard<asio::io_context::executor_type> busy{ctx.get_executor()};
    std::thread thread;
    unsigned short port = 0;

    mutable std::mutex mutex;
    std::deque<json::object> updates;             // not yet confirmed, in update_id order
    std::map<std::int64_t, json::object> history; // every update ever pushed
    std::int64_t next_update_id = 100;
    std::int64_t next_message_id = 1;
    std::map<std::string, injected> failures;
    std::set<std::string> blocked;
    std::vector<sent_message> sent;
    std::map<std::string, std::size_t> calls;
    std::vector<std::int64_t> offsets;
    std::size_t unauthorized = 0;
    bool down = false; // on the server thread only

    void listen() {
        tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
        acceptor.open(ep.protocol());
        acceptor.set_option(tcp::acceptor::reuse_address(true));
        acceptor.bind(ep);
        acceptor.listen();
        port = acceptor.local_endpoint().port();
        asio::co_spawn(ctx, accept_loop(), report_fake_failure);
    }

    // Under the mutex: an injected failure for this call, if any is left.
    std::optional<answer> injected_for(const std::string& method) {
        auto it = failures.find(method);
        if (it == failures.end() || it->second.left == 0) return std::nullopt;
        --it->second.left;
        return api_error(it->second.status, it->second.description, it->second.retry_after);
    }

    // Updates at or above `offset`; those below are confirmed and forgotten, as Telegram does.
    json::array take_from(std::int64_t offset) {
        std::lock_guard lock(mutex);
        while (!updates.empty() && updates.front().at("update_id").as_int64() < offset)
            updates.pop_front();
        json::array out;
        for (const auto& u : updates)
            if (out.size() < 100) out.push_back(u);
        return out;
    }

    asio::awaitable<answer> get_updates(const json::object& req) {
        std::int64_t offset = 0, timeout = 0;
        if (auto* o = req.if_contains("offset"); o && o->is_int64()) offset = o->as_int64();
        if (auto* t = req.if_contains("timeout"); t && t->is_int64()) timeout = t->as_int64();
        {
            std::lock_guard lock(mutex);
            offsets.push_back(offset);
        }
        auto deadline = clock::now() + std::chrono::seconds(timeout);
        asio::steady_timer tick(ctx);
        for (;;) {
            auto found = take_from(offset);
            if (!found.empty() || clock::now() >= deadline)
                co_return answer{200, {{"ok", true}, {"result", std::move(found)}}};
            tick.expires_after(std::chrono::milliseconds(10));
            co_await tick.async_wait(use_tuple);
        }
    }

    answer send_message(const json::object& req) {
        const auto* chat = req.if_contains("chat_id");
        const auto* text = req.if_contains("text");
        if (!chat || !(chat->is_int64() || chat->is_string()) || !text || !text->is_string())
            return api_error(400, "Bad Request: chat_id and text are required");
        std::string chat_id =
            chat->is_int64() ? std::to_string(chat->as_int64()) : std::string(chat->as_string());
        std::lock_guard lock(mutex);
        if (blocked.count(chat_id)) return api_error(403, "Forbidden: bot was blocked by the user");
        sent.push_back({chat_id, std::string(text->as_string()), clock::now()});
        json::object result{
            {"message_id", next_message_id++}, {"chat", json::object{{"id", *chat}}}, {"text", *text}};
        return {200, {{"ok", true}, {"result", std::move(result)}}};
    }

    asio::awaitable<answer> dispatch(const bhttp::request<bhttp::string_body>& req) {
        std::string target(req.target());
        std::string prefix = "/bot" + token + "/";
        if (!target.starts_with("/bot")) co_return api_error(404, "Not Found");
        if (!target.starts_with(prefix)) {
            std::lock_guard lock(mutex);
            ++unauthorized;
            co_return api_error(401, "Unauthorized");
        }
        std::string method = target.substr(prefix.size());
        {
            std::lock_guard lock(mutex);
            ++calls[method];
            if (auto a = injected_for(method)) co_return std::move(*a);
        }
        boost::system::error_code ec;
        auto body = json::parse(req.body(), ec);
        if (ec || !body.is_object()) co_return api_error(400, "Bad Request: body is not a JSON object");
        if (method == "getUpdates") co_return co_await get_updates(body.get_object());
        if (method == "sendMessage") co_return send_message(body.get_object());
        if (method == "getMe")
            co_return answer{
                200,
                {{"ok", true}, {"result", {{"id", 1}, {"is_bot", true}, {"username", "fake_bot"}}}}};
        co_return api_error(404, "Not Found");
    }

    asio::awaitable<void> serve(tcp::socket socket) {
        beast::tcp_stream stream(std::move(socket));
        beast::flat_buffer buffer;
        for (;;) {
            bhttp::request<bhttp::string_body> req;
            auto [rec, rn] = co_await bhttp::async_read(stream, buffer, req, use_tuple);
            if (rec || down) co_return;
            auto a = co_await dispatch(req);
            if (down) co_return;
            bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(a.status), 11};
            res.set(bhttp::field::content_type, "application/json");
            res.keep_alive(req.keep_alive());
            res.body() = json::serialize(a.body);
            res.prepare_payload();
            auto [wec, wn] = co_await bhttp::async_write(stream, res, use_tuple);
            if (wec || !req.keep_alive()) co_return;
        }
    }

    asio::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
            if (ec) co_return;
            asio::co_spawn(ctx, serve(std::move(socket)), report_fake_failure);
        }
    }
};

fake_telegram::fake_telegram(std::string token) : impl_(std::make_unique<impl>()) {
    impl_->token = std::move(token);
    impl_->listen();
    impl_->thread = std::thread([this] { impl_->ctx.run(); });
}

void fake_telegram::go_down() {
    auto done = std::make_shared<std::promise<void>>();
    asio::post(impl_->ctx, [this, done] {
        impl_->down = true;
        impl_->acceptor.close();
        auto& h = impl_->holder;
        h.open(tcp::v4());
        h.set_option(tcp::socket::reuse_address(true));
        h.bind({asio::ip::make_address("127.0.0.1"), impl_->port});
        done->set_value();
    });
    done->get_future().wait();
}

void fake_telegram::come_back() {
    auto done = std::make_shared<std::promise<void>>();
    asio::post(impl_->ctx, [this, done] {
        impl_->down = false;
        impl_->holder.close();
        impl_->listen();
        done->set_value();
    });
    done->get_future().wait();
}

// Stopping the context abandons the server coroutines mid-wait; their sockets close with it.
fake_telegram::~fake_telegram() {
    impl_->ctx.stop();
    impl_->thread.join();
}

unsigned short fake_telegram::port() const {
    return impl_->port;
}

std::string fake_telegram::api_base() const {
    return "http://127.0.0.1:" + std::to_string(port());
}

std::int64_t fake_telegram::push_message(std::int64_t chat, std::string text, std::string username) {
    std::lock_guard lock(impl_->mutex);
    auto id = impl_->next_update_id++;
    json::object from{{"id", chat > 0 ? chat : 7}, {"is_bot", false}, {"username", std::move(username)}};
    json::object message{{"message_id", impl_->next_message_id++},
                         {"from", std::move(from)},
                         {"chat", json::object{{"id", chat}, {"type", chat > 0 ? "private" : "group"}}},
                         {"date", 1764504000},
                         {"text", std::move(text)}};
    json::object update{{"update_id", id}, {"message", std::move(message)}};
    impl_->history[id] = update;
    impl_->updates.push_back(std::move(update));
    return id;
}

void fake_telegram::redeliver(std::int64_t update_id) {
    std::lock_guard lock(impl_->mutex);
    auto& q = impl_->updates;
    auto it = q.begin();
    while (it != q.end() && it->at("update_id").as_int64() < update_id)
        ++it;
    if (it != q.end() && it->at("update_id").as_int64() == update_id) return;
    q.insert(it, impl_->history.at(update_id));
}

void fake_telegram::fail_next(std::string method, std::size_t n, unsigned status,
                              std::string description, std::optional<int> retry_after) {
    std::lock_guard lock(impl_->mutex);
    impl_->failures[std::move(method)] = injected{n, status, std::move(description), retry_after};
}

void fake_telegram::block_chat(std::int64_t chat) {
    std::lock_guard lock(impl_->mutex);
    impl_->blocked.insert(std::to_string(chat));
}

std::vector<sent_message> fake_telegram::sent() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->sent;
}

std::size_t fake_telegram::calls(const std::string& method) const {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->calls.find(method);
    return it == impl_->calls.end() ? 0 : it->second;
}

std::vector<std::int64_t> fake_telegram::offsets() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->offsets;
}

std::size_t fake_telegram::unauthorized() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->unauthorized;
}

std::size_t fake_telegram::queued() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->updates.size();
}

bool fake_telegram::wait_sent(std::size_t n, std::chrono::milliseconds limit) const {
    auto deadline = clock::now() + limit;
    while (sent().size() < n) {
        if (clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

bool fake_telegram::wait_calls(const std::string& method, std::size_t n,
                               std::chrono::milliseconds limit) const {
    auto deadline = clock::now() + limit;
    while (calls(method) < n) {
        if (clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

} // namespace baton::test
