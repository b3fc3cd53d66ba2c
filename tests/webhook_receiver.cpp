#include "tests/webhook_receiver.hpp"
#include "tests/fake_peer.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace baton::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace json = boost::json;
using asio::ip::tcp;

struct webhook_receiver::impl {
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
    std::thread thread;
    mutable std::mutex mutex;
    mutable std::condition_variable changed;
    std::function<receiver_answer(const recorded_request&)> decide;
    std::vector<recorded_request> requests;
    std::map<std::string, int> delivered;
    std::size_t delivered_total = 0;

    asio::awaitable<void> serve(tcp::socket socket) {
        beast::flat_buffer buffer;
        constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
        for (;;) {
            bhttp::request<bhttp::string_body> req;
            auto [ec, n] = co_await bhttp::async_read(socket, buffer, req, use_tuple);
            if (ec) co_return;
            recorded_request r;
            r.method = std::string(req.method_string());
            r.target = std::string(req.target());
            for (const auto& f : req)
                r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
            boost::system::error_code jec;
            r.body = json::parse(req.body(), jec);
            if (jec) r.body = nullptr;
            receiver_answer a;
            {
                std::lock_guard lock(mutex);
                requests.push_back(r);
                if (decide) a = decide(r);
            }
            if (a.delay.count() > 0) {
                asio::steady_timer t(socket.get_executor(), a.delay);
                co_await t.async_wait(use_tuple);
            }
            bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(a.status), 11};
            res.set(bhttp::field::content_type, "application/json");
            if (!a.retry_after.empty()) res.set(bhttp::field::retry_after, a.retry_after);
            res.body() = a.status < 300 ? R"({"ok":true})" : R"({"ok":false})";
            res.keep_alive(req.keep_alive());
            res.prepare_payload();
            auto [wec, wn] = co_await bhttp::async_write(socket, res, use_tuple);
            if (wec) co_return;
            if (a.status >= 200 && a.status < 300) {
                std::lock_guard lock(mutex);
                if (auto k = r.header("Idempotency-Key")) ++delivered[*k];
                ++delivered_total;
                changed.notify_all();
            }
            if (!req.keep_alive()) co_return;
        }
    }

    asio::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, s] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
            if (ec) co_return;
            asio::co_spawn(ioc, serve(std::move(s)), report_fake_failure);
        }
    }
};

webhook_receiver::webhook_receiver() : impl_(std::make_shared<impl>()) {
    asio::co_spawn(impl_->ioc, impl_->accept_loop(), report_fake_failure);
    impl_->thread = std::thread([i = impl_] { i->ioc.run(); });
}

webhook_receiver::~webhook_receiver() {
    impl_->ioc.stop();
    impl_->thread.join();
}

unsigned short webhook_receiver::port() const {
    return impl_->acceptor.local_endpoint().port();
}

std::string webhook_receiver::url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port()) + path;
}

void webhook_receiver::answer_with(std::function<receiver_answer(const recorded_request&)> f) {
    std::lock_guard lock(impl_->mutex);
    impl_->decide = std::move(f);
}

std::vector<recorded_request> webhook_receiver::requests() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->requests;
}

std::map<std::string, int> webhook_receiver::delivered_keys() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->delivered;
}

bool webhook_receiver::wait_delivered(std::size_t n, std::chrono::milliseconds limit) const {
    std::unique_lock lock(impl_->mutex);
    return impl_->changed.wait_for(lock, limit, [&] { return impl_->delivered_total >= n; });
}

} // namespace baton::test
