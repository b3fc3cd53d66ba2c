#include <baton/clock.hpp>
#include <baton/detail/async.hpp>
#include <baton/log.hpp>
#include <baton/strand.hpp>
#include <baton/ws_client.hpp>
#include <baton/ws_client_channel.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <deque>

namespace baton {

namespace {
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
}

// Everything below runs on `strand` (the loop is spawned there, and the subclass's hooks run
// inside it), except the atomics and the dispatch hook, which posts there.
struct ws_client_channel::impl : std::enable_shared_from_this<impl> {
    explicit impl(ws_client_channel_options opts) : o(std::move(opts)) {}
    ws_client_channel_options o;
    ws_client_channel* owner = nullptr;
    channel_host* host = nullptr;
    asio::any_io_executor strand;
    std::unique_ptr<timer> backoff; // between attempts, on the runtime's clock; cancelled by close()
    std::unique_ptr<asio::steady_timer> ended; // cancelled when the loop ends
    std::shared_ptr<ws_client> conn;           // the connection, while there is one
    std::deque<std::string> out;               // frames waiting for the writer
    bool writing = false;
    bool closing = false;
    bool looping = false;
    std::atomic<bool> accepting{false};
    std::atomic<bool> is_connected{false};
    std::atomic<std::uint64_t> count{0};

    void queue(std::string frame) {
        if (!conn) return; // replies go out again from the outbox at the next connection
        out.push_back(std::move(frame));
        if (!writing) {
            writing = true;
            asio::co_spawn(strand, writer(shared_from_this(), conn), asio::detached);
        }
    }

    static asio::awaitable<void> writer(std::shared_ptr<impl> self, std::shared_ptr<ws_client> c) {
        while (!self->out.empty() && self->conn == c) {
            auto frame = std::move(self->out.front());
            self->out.pop_front();
            if (co_await c->send(std::move(frame))) break; // the reader sees the failure too
        }
        self->writing = false;
        if (!self->out.empty() && self->conn && self->conn != c) {
            self->writing = true;
            asio::co_spawn(self->strand, writer(self, self->conn), asio::detached);
        }
    }

    // Every reply of the channel the peer has not acknowledged, oldest first.
    asio::awaitable<void> resend() {
        store::outbox_filter unacked;
        unacked.statuses = {outbox_status::pending, outbox_status::sending};
        unacked.channel = o.name;
        auto items = co_await host->runtime().list_outbox(std::move(unacked));
        for (const auto& item : items)
            queue(owner->reply_frame(item));
    }

    // Waits `pause` (close() cancels the wait), then doubles it up to backoff_max.
    asio::awaitable<void> back_off(std::chrono::milliseconds& pause) {
        backoff->expires_after(pause);
        co_await backoff->async_wait(use_tuple);
        pause = std::min(pause * 2, o.backoff_max);
    }

    // Every attempt after the first waits: after a failed dial, and after a connection ended. The
    // wait doubles each time, and starts again from backoff_min only after a connection that lasted
    // backoff_max, so that a peer that accepts and drops at once (or whose frames make on_frame
    // throw) is not dialled in a tight loop.
    static asio::awaitable<void> loop(std::shared_ptr<impl> self) {
        auto& s = *self;
        const auto& clk = s.host->runtime().clock();
        auto pause = s.o.backoff_min;
        while (!s.closing) {
            auto c = std::make_shared<ws_client>(s.strand, s.o.host, s.o.port);
            auto [ec, status] =
                co_await c->connect(s.o.target, s.o.connect_timeout, s.o.heartbeat * 2, true);
            if (s.closing) break;
            if (ec) {
                log::warn("ws client channel: cannot connect; trying again",
                          {{"channel", s.o.name},
                           {"error", ec.message()},
                           {"status", status},
                           {"after_ms", pause.count()}});
                co_await s.back_off(pause);
                continue;
            }
            const auto up_since = clk->now();
            s.conn = c;
            s.is_connected = true;
            s.count.fetch_add(1);
            log::info("ws client channel: connected", {{"channel", s.o.name}});
            try {
                co_await s.owner->on_connected();
                co_await s.resend();
                for (;;) {
                    auto [rec, frame] = co_await c->receive();
                    if (rec) {
                        if (!s.closing)
                            log::warn("ws client channel: connection lost",
                                      {{"channel", s.o.name}, {"error", rec.message()}});
                        break;
                    }
                    co_await s.owner->on_frame(std::move(frame));
                }
            } catch (const std::exception& e) {
                log::error("ws client channel: dropping the connection",
                           {{"channel", s.o.name}, {"error", e.what()}});
            }
            s.conn.reset();
            s.is_connected = false;
            s.out.clear();
            if (s.closing) break;
            if (clk->now() - up_since >= s.o.backoff_max) pause = s.o.backoff_min;
            log::info("ws client channel: reconnecting",
                      {{"channel", s.o.name}, {"after_ms", pause.count()}});
            co_await s.back_off(pause);
        }
        s.looping = false;
        s.ended->cancel();
    }

    static asio::awaitable<void> shut(std::shared_ptr<impl> self) {
        self->closing = true;
        self->accepting = false;
        self->backoff->cancel();
        if (auto c = self->conn) co_await c->close(); // the reader then ends with `closed`
        while (self->looping) {
            self->ended->expires_at(asio::steady_timer::time_point::max());
            co_await self->ended->async_wait(use_tuple);
        }
    }
};

ws_client_channel::ws_client_channel(ws_client_channel_options o)
    : impl_(std::make_shared<impl>(std::move(o))) {
    impl_->owner = this;
}

ws_client_channel::~ws_client_channel() = default;

std::string_view ws_client_channel::name() const {
    return impl_->o.name;
}
bool ws_client_channel::connected() const {
    return impl_->is_connected.load();
}
std::uint64_t ws_client_channel::connections() const {
    return impl_->count.load();
}
channel_host& ws_client_channel::host() {
    return *impl_->host;
}

void ws_client_channel::attach(channel_host& h) {
    auto& i = *impl_;
    i.host = &h;
    i.strand = detail::make_thin_strand(h.get_executor());
    i.backoff = std::make_unique<timer>(h.runtime().clock(), i.strand);
    i.ended = std::make_unique<asio::steady_timer>(i.strand);
    h.runtime().add_route(i.o.name, [](std::string_view to) -> std::optional<std::string> {
        if (to.empty()) return "a recipient is required";
        return std::nullopt;
    });
    // A reply of this channel is stored before it is sent, then sent if connected.
    plugin p;
    p.name = i.o.name;
    p.dispatch_outbound = [self = impl_](turn_context& ctx,
                                         const outbound& item) -> asio::awaitable<bool> {
        if (item.channel != self->o.name) co_return false;
        outbox_item o;
        o.turn_id = ctx.inbound.turn_id;
        o.tenant = ctx.inbound.tenant;
        o.session_id = ctx.session_id;
        o.channel = self->o.name;
        o.recipient = item.to;
        o.index = item.index;
        o.text = item.text;
        o.key = outbox_key(o.session_id, o.turn_id, o.channel, o.recipient, o.index);
        std::vector<outbox_item> items{std::move(o)};
        // Named before the co_await: g++ 12 destroys a temporary of a co_await's arguments twice.
        std::function<void(std::vector<outbox_item>)> send = [self](std::vector<outbox_item> added) {
            for (auto& a : added)
                asio::post(self->strand,
                           [self, a = std::move(a)] { self->queue(self->owner->reply_frame(a)); });
        };
        co_await self->host->runtime().enqueue_outbox(ctx, std::move(items), std::move(send));
        co_return true;
    };
    h.add_plugin(std::move(p));
}

asio::awaitable<void> ws_client_channel::start() {
    impl_->accepting = true;
    impl_->looping = true;
    asio::co_spawn(impl_->strand, impl::loop(impl_), asio::detached);
    co_return;
}

asio::awaitable<void> ws_client_channel::stop() {
    impl_->accepting = false;
    co_return;
}

asio::awaitable<void> ws_client_channel::close() {
    if (!impl_->host) co_return;
    co_await baton::detail::run_on(impl_->strand, impl::shut(impl_));
}

asio::awaitable<accept_result> ws_client_channel::submit(std::string session_id, std::string recipient,
                                                         std::string text, std::string key) {
    if (!impl_->accepting) co_return api_error{errc::draining, "the channel is stopping"};
    accept_request m;
    m.session_id = std::move(session_id);
    m.channel = impl_->o.name;
    m.deliver = json::object{{"channel", impl_->o.name}, {"to", recipient}};
    // The peer's ids are its own: scoped by channel and recipient, they meet no other key (a key
    // with spaces is none an HTTP client can send).
    if (!key.empty()) m.idem.key = impl_->o.name + ' ' + recipient + ' ' + key;
    m.idem.fingerprint = sha256_hex(recipient + '\n' + text);
    m.text = std::move(text);
    co_return co_await impl_->host->runtime().accept(std::move(m));
}

asio::awaitable<bool> ws_client_channel::acked(std::string key) {
    co_return co_await impl_->host->runtime().outbox_delivered(std::move(key), impl_->o.name);
}

bool ws_client_channel::send(std::string frame) {
    bool up = impl_->is_connected.load();
    asio::post(impl_->strand,
               [self = impl_, f = std::move(frame)]() mutable { self->queue(std::move(f)); });
    return up;
}

} // namespace baton
