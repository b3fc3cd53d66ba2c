// ws_client_channel (<baton/ws_client_channel.hpp>) against a WebSocket peer on loopback: it keeps
// dialling until the peer listens, turns the peer's frames into turns, stores each reply before
// sending it, sends it again after a reconnect until acked, and ends cleanly with the service.
#include "tests/fake_peer.hpp"

#include <baton/service.hpp>
#include <baton/ws_client_channel.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>
#include <boost/test/unit_test.hpp>

#include <future>
#include <mutex>
#include <thread>

using namespace baton;
namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

struct room_channel : ws_client_channel {
    using ws_client_channel::ws_client_channel;
    asio::awaitable<void> on_frame(std::string frame) override {
        auto f = json::parse(frame).as_object();
        if (f["type"] == "ack") co_await acked(std::string(f["key"].as_string()));
        if (f["type"] == "message")
            co_await submit("room:" + std::string(f["room"].as_string()), std::string(f["room"].as_string()),
                            std::string(f["text"].as_string()), std::string(f["id"].as_string()));
    }
    std::string reply_frame(const outbox_item& item) override {
        return json::serialize(json::object{{"room", item.recipient}, {"key", item.key}, {"text", item.text}});
    }
};

// The peer, on a thread of its own: each connection gets the same message (id m1); the first
// answer is dropped unacked with the connection, the second acked.
struct chat_peer {
    asio::io_context io;
    tcp::acceptor acceptor{io};
    unsigned short port = 0;
    std::mutex mutex;
    std::vector<std::string> heard; // the answers' texts, one per connection that got one
    std::promise<void> acked;
    std::thread thread;

    chat_peer() {
        // Pick a port, but do not listen yet: the channel must retry until we do.
        tcp::acceptor probe(io, {asio::ip::make_address("127.0.0.1"), 0});
        port = probe.local_endpoint().port();
    }
    void listen() {
        acceptor.open(tcp::v4());
        acceptor.set_option(tcp::acceptor::reuse_address(true));
        acceptor.bind({asio::ip::make_address("127.0.0.1"), port});
        acceptor.listen();
        asio::co_spawn(io, serve(), test::report_fake_failure);
        thread = std::thread([this] { io.run(); });
    }
    ~chat_peer() {
        io.stop();
        if (thread.joinable()) thread.join();
    }
    asio::awaitable<void> serve() {
        for (int n = 1;; ++n) {
            beast::websocket::stream<tcp::socket> ws(co_await acceptor.async_accept(asio::use_awaitable));
            co_await ws.async_accept(asio::use_awaitable);
            ws.text(true);
            json::object m{{"type", "message"}, {"room", "lobby"}, {"id", "m1"}, {"text", "hi"}};
            co_await ws.async_write(asio::buffer(json::serialize(m)), asio::use_awaitable);
            beast::flat_buffer buf;
            co_await ws.async_read(buf, asio::use_awaitable);
            auto say = json::parse(beast::buffers_to_string(buf.data())).as_object();
            {
                std::lock_guard lock(mutex);
                heard.emplace_back(say["text"].as_string());
            }
            if (n == 1) continue; // dropped: the answer must come again
            json::object ack{{"type", "ack"}, {"key", say["key"]}};
            co_await ws.async_write(asio::buffer(json::serialize(ack)), asio::use_awaitable);
            acked.set_value();
            // Until the channel closes: its close handshake answered.
            co_await ws.async_read(buf, asio::as_tuple(asio::use_awaitable));
            co_return;
        }
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(ws_client_channel_suite)

BOOST_AUTO_TEST_CASE(dials_until_up_resends_until_acked_and_closes) {
    chat_peer peer;
    asio::io_context io{1};
    auto work = asio::make_work_guard(io);
    std::thread thread([&] { io.run(); });

    service_options o;
    o.http = false;
    o.config.storage.type = storage_config::kind::memory;
    {
        service svc(io.get_executor(), o);
        ws_client_channel_options co;
        co.name = "rooms";
        co.port = std::to_string(peer.port);
        co.backoff_min = 5ms;
        co.backoff_max = 20ms;
        auto ch = std::make_shared<room_channel>(co);
        svc.add_channel(ch);
        auto started = svc.async_start(asio::use_future);
        BOOST_REQUIRE(started.wait_for(10s) == std::future_status::ready);
        started.get();
        // Nobody listens yet: the channel keeps trying; then the peer comes up.
        BOOST_TEST(!ch->connected());
        peer.listen();
        auto acked = peer.acked.get_future();
        BOOST_REQUIRE_MESSAGE(acked.wait_for(20s) == std::future_status::ready, "no ack within 20 s");
        BOOST_TEST(ch->connections() >= 2u);
        {
            std::lock_guard lock(peer.mutex);
            BOOST_TEST(peer.heard == (std::vector<std::string>{"echo: hi", "echo: hi"}),
                       boost::test_tools::per_element());
        }
        // The ack made the reply delivered; the message sent twice made one turn.
        auto listed = asio::co_spawn(
            io,
            [&]() -> asio::awaitable<std::vector<outbox_item>> {
                for (int i = 0; i < 200; ++i) {
                    store::outbox_filter f;
                    f.channel = "rooms";
                    auto items = co_await svc.runtime().list_outbox(std::move(f));
                    if (items.size() == 1 && items[0].status == outbox_status::delivered) co_return items;
                    asio::steady_timer t(io, 10ms);
                    co_await t.async_wait(asio::use_awaitable);
                }
                co_return std::vector<outbox_item>{};
            },
            asio::use_future);
        BOOST_REQUIRE(listed.wait_for(10s) == std::future_status::ready);
        auto items = listed.get();
        BOOST_REQUIRE_EQUAL(items.size(), 1u);
        BOOST_TEST(items[0].recipient == "lobby");
        BOOST_TEST(items[0].session_id == "room:lobby");

        auto stopped = svc.async_stop(asio::use_future);
        BOOST_REQUIRE(stopped.wait_for(10s) == std::future_status::ready);
        stopped.get();
        BOOST_TEST(!ch->connected());
    }
    work.reset();
    io.stop();
    thread.join();
}

BOOST_AUTO_TEST_SUITE_END()
