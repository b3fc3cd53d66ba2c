// ws_client_channel (<baton/ws_client_channel.hpp>) against a WebSocket peer on loopback: it keeps
// dialling until the peer listens, turns the peer's frames into turns, stores each reply before
// sending it, sends it again after a reconnect until acked, and ends cleanly with the service.
// Its backoff runs on the runtime's clock: with a manual clock the test sees each wait's length.
#include "tests/clocked_service.hpp"
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

#include <atomic>
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
    std::atomic<int> acks_taken{0}, acks_refused{0};
    asio::awaitable<void> on_frame(std::string frame) override {
        auto f = json::parse(frame).as_object();
        if (f["type"] == "ack") {
            bool ok = co_await acked(std::string(f["key"].as_string()));
            ++(ok ? acks_taken : acks_refused);
        }
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

// A peer on a thread of its own that accepts WebSocket connections and closes each at once, or,
// while `hold` is set, keeps it open until release(). `frames` go out on each connection first.
struct dropping_peer {
    asio::io_context io;
    tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
    std::atomic<int> accepted{0};
    std::atomic<bool> hold{false};
    std::vector<std::string> frames;
    std::mutex mutex;
    std::vector<std::string> heard;
    asio::steady_timer released{io, asio::steady_timer::time_point::max()};
    std::thread thread;

    void run() {
        asio::co_spawn(io, serve(), test::report_fake_failure);
        thread = std::thread([this] { io.run(); });
    }
    ~dropping_peer() {
        io.stop();
        if (thread.joinable()) thread.join();
    }
    std::string port() const { return std::to_string(acceptor.local_endpoint().port()); }
    void release() {
        asio::post(io, [this] { released.cancel(); });
    }
    using ws_t = beast::websocket::stream<tcp::socket>;
    asio::awaitable<void> serve() {
        for (;;) {
            auto ws = std::make_shared<ws_t>(co_await acceptor.async_accept(asio::use_awaitable));
            co_await ws->async_accept(asio::use_awaitable);
            ws->text(true);
            for (const auto& f : frames)
                co_await ws->async_write(asio::buffer(f), asio::use_awaitable);
            ++accepted;
            if (hold) {
                asio::co_spawn(io, read_all(ws), asio::detached);
                co_await released.async_wait(asio::as_tuple(asio::use_awaitable));
                released.expires_at(asio::steady_timer::time_point::max());
            }
            co_await ws->async_close(beast::websocket::close_code::normal, asio::as_tuple(asio::use_awaitable));
        }
    }
    asio::awaitable<void> read_all(std::shared_ptr<ws_t> ws) {
        for (;;) {
            beast::flat_buffer buf;
            auto [ec, n] = co_await ws->async_read(buf, asio::as_tuple(asio::use_awaitable));
            if (ec) co_return;
            std::lock_guard lock(mutex);
            heard.push_back(beast::buffers_to_string(buf.data()));
        }
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(ws_client_channel_suite)

// A peer that drops every connection at once is dialled again after a wait that doubles up to
// backoff_max, never in a tight loop; a connection that lasted backoff_max starts the waits over.
BOOST_AUTO_TEST_CASE(backs_off_after_lost_connections_on_the_clock) {
    dropping_peer peer;
    peer.run();
    test::clocked_service cs(test::clocked_service::memory_options());
    ws_client_channel_options co;
    co.name = "rooms";
    co.port = peer.port();
    co.backoff_min = 100ms;
    co.backoff_max = 800ms;
    auto ch = std::make_shared<room_channel>(co);
    cs.svc->add_channel(ch);
    cs.start();
    auto& clock = *cs.clock;
    // Parked on one wait of `d` after `n` connections, none up.
    auto backing_off = [&](std::uint64_t n, std::chrono::milliseconds d) {
        return test::eventually([&] {
            return ch->connections() == n && !ch->connected() && clock.waiting() == 1 &&
                   clock.next_deadline() == clock.now() + d;
        });
    };
    BOOST_TEST_REQUIRE(backing_off(1, 100ms));
    clock.advance(99ms); // not yet
    BOOST_TEST_REQUIRE(backing_off(1, 1ms));
    BOOST_TEST(peer.accepted.load() == 1);
    clock.advance(1ms);
    BOOST_TEST_REQUIRE(backing_off(2, 200ms));
    clock.advance(200ms);
    BOOST_TEST_REQUIRE(backing_off(3, 400ms));
    clock.advance(400ms);
    BOOST_TEST_REQUIRE(backing_off(4, 800ms));
    clock.advance(800ms);
    BOOST_TEST_REQUIRE(backing_off(5, 800ms)); // capped at backoff_max
    BOOST_TEST(peer.accepted.load() == 5);

    // A connection that stays up for backoff_max: after it, the first wait is backoff_min again.
    peer.hold = true;
    clock.advance(800ms);
    BOOST_TEST_REQUIRE(test::eventually([&] { return ch->connected() && ch->connections() == 6u; }));
    BOOST_TEST(clock.waiting() == 0u);
    clock.advance(800ms);
    peer.hold = false;
    peer.release();
    BOOST_TEST_REQUIRE(backing_off(6, 100ms));
    BOOST_TEST(cs.logged("ws client channel: reconnecting") == 6u);
    cs.stop(); // the pending wait ends with the service
    BOOST_TEST(!ch->connected());
}

// The peer's message ids are scoped to the channel and the room: the same id from two rooms makes
// two turns, and an HTTP-style key with the same text is a third. An ack of a key that is not the
// channel's own (another channel's item) marks nothing.
BOOST_AUTO_TEST_CASE(keys_are_the_channels_own) {
    dropping_peer peer;
    auto msg = [](const char* room) {
        return json::serialize(json::object{{"type", "message"}, {"room", room}, {"id", "m1"}, {"text", "hi"}});
    };
    peer.frames = {msg("lobby"), msg("hall"), json::serialize(json::object{{"type", "ack"}, {"key", "k-other"}})};
    peer.hold = true;
    test::clocked_service cs(test::clocked_service::memory_options());
    outbox_item other;
    other.key = "k-other";
    other.turn_id = "t_other";
    other.session_id = "elsewhere";
    other.channel = "other";
    other.recipient = "someone";
    other.text = "not the room channel's";
    std::vector<outbox_item> items{other};
    BOOST_TEST_REQUIRE(cs.run(cs.svc->runtime().enqueue_outbox(std::move(items))).size() == 1u);
    peer.run();

    ws_client_channel_options co;
    co.name = "rooms";
    co.port = peer.port();
    auto ch = std::make_shared<room_channel>(co);
    cs.svc->add_channel(ch);
    cs.start();
    BOOST_TEST_REQUIRE(test::eventually([&] { return ch->acks_refused.load() == 1; }));
    BOOST_TEST(ch->acks_taken.load() == 0);
    BOOST_TEST_REQUIRE(test::eventually([&] {
        std::lock_guard lock(peer.mutex);
        return peer.heard.size() == 2u;
    }));
    BOOST_TEST(cs.turns("room:lobby") == 1);
    BOOST_TEST(cs.turns("room:hall") == 1);
    auto pending = cs.outbox(outbox_status::pending);
    BOOST_TEST(std::count_if(pending.begin(), pending.end(), [](const auto& o) { return o.key == "k-other"; }) == 1);

    accept_request m{.session_id = "room:lobby", .text = "hi"};
    m.idem.key = "m1";
    m.idem.fingerprint = sha256_hex("lobby\nhi");
    auto a = cs.run([&]() -> asio::awaitable<accepted> {
        co_return co_await cs.svc->async_submit(std::move(m), asio::use_awaitable);
    }());
    BOOST_TEST(!a.replayed);
    peer.hold = false;
    peer.release();
    cs.stop();
}

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
