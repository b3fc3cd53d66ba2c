// A channel of one's own: baton connects, as a WebSocket client, to a chat service. The chat
// service is played here by a small loopback server speaking a JSON protocol:
//   server -> client  {"type":"message","room","id","text"}   a user wrote in a room
//   client -> server  {"type":"say","room","key","text"}      the agent answers in the room
//   server -> client  {"type":"ack","key"}                    the answer arrived
// Each room is a session. To show the acked re-send, the server drops the first connection
// without acking the answer; baton reconnects and sends it again, and the server acks it then.
#include <baton/service.hpp>
#include <baton/ws_client_channel.hpp>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <iostream>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace json = boost::json;
using namespace baton;
using tcp = asio::ip::tcp;

// The chat channel: frames in, messages out; all the connection work is the library's.
struct chat_channel : ws_client_channel {
    using ws_client_channel::ws_client_channel;
    asio::awaitable<void> on_frame(std::string frame) override {
        auto f = json::parse(frame).as_object();
        if (f["type"] == "ack") co_await acked(std::string(f["key"].as_string()));
        if (f["type"] != "message") co_return;
        std::string room(f["room"].as_string());
        co_await submit("room:" + room, room, std::string(f["text"].as_string()),
                        std::string(f["id"].as_string()));
    }
    std::string reply_frame(const outbox_item& item) override {
        return json::serialize(json::object{
            {"type", "say"}, {"room", item.recipient}, {"key", item.key}, {"text", item.text}});
    }
};

// The chat service: what it heard, and when it acked.
struct chat_server {
    tcp::acceptor acceptor;
    std::vector<std::string> heard; // the "say" texts, in order, with the connection's number
    asio::steady_timer done;        // cancelled once an answer is acked
    explicit chat_server(asio::io_context& io)
        : acceptor(io, {asio::ip::make_address("127.0.0.1"), 0}),
          done(io, asio::steady_timer::time_point::max()) {}

    asio::awaitable<void> serve() {
        for (int n = 1;; ++n) {
            beast::websocket::stream<tcp::socket> ws(
                co_await acceptor.async_accept(asio::use_awaitable));
            co_await ws.async_accept(asio::use_awaitable);
            ws.text(true);
            json::object m{{"type", "message"}, {"room", "lobby"}, {"id", "m1"}, {"text", "hello"}};
            co_await ws.async_write(asio::buffer(json::serialize(m)), asio::use_awaitable);
            beast::flat_buffer buf;
            co_await ws.async_read(buf, asio::use_awaitable);
            auto say = json::parse(beast::buffers_to_string(buf.data())).as_object();
            heard.push_back(std::string(say["text"].as_string()) + " (connection " + std::to_string(n) +
                            ")");
            if (n == 1) continue; // dropped without an ack: the client must send it again
            json::object ack{{"type", "ack"}, {"key", say["key"]}};
            co_await ws.async_write(asio::buffer(json::serialize(ack)), asio::use_awaitable);
            done.cancel();
            co_await ws.async_read(buf, asio::as_tuple(asio::use_awaitable)); // until baton closes
            co_return;
        }
    }
};

asio::awaitable<int> run(service& svc, chat_server& server) {
    co_await svc.async_start(asio::use_awaitable);
    co_await server.done.async_wait(asio::as_tuple(asio::use_awaitable));
    // The ack reached the outbox: the answer is delivered and will not be sent again.
    store::outbox_filter delivered;
    delivered.statuses = {outbox_status::delivered};
    delivered.channel = "chat";
    auto items = co_await svc.runtime().list_outbox(std::move(delivered));
    co_await svc.async_stop(asio::use_awaitable);
    for (const auto& h : server.heard)
        std::cout << "the chat heard: " << h << "\n";
    std::cout << "delivered: " << items.size() << "\n";
    co_return items.size() == 1 && server.heard.size() == 2 ? 0 : 1;
}

int main() {
    asio::io_context io;
    chat_server server(io);
    service_options opts{.http = false};
    opts.config.storage.type = storage_config::kind::memory;
    service svc(io.get_executor(), opts);
    auto port = std::to_string(server.acceptor.local_endpoint().port());
    svc.add_channel(
        std::make_shared<chat_channel>(ws_client_channel_options{.name = "chat", .port = port}));
    asio::co_spawn(io, server.serve(), asio::detached);
    auto done = asio::co_spawn(io, run(svc, server), asio::use_future);
    io.run_for(std::chrono::seconds(20));
    return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? done.get() : 2;
}
