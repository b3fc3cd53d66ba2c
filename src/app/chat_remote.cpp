// `baton chat --url`: the chat against a running daemon over its WebSocket channel (docs/api.md
// "WebSocket channel"). One io thread runs everything here; stdin has its own thread.
#include "src/app/chat.hpp"

#include "src/app/chat_view.hpp"
#include <algorithm>

#include <baton/http_client.hpp>
#include <baton/ws_client.hpp>

#include <boost/asio/ssl/error.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <boost/url/parse.hpp>

#include <deque>
#include <iostream>
#include <map>
#include <set>

#include <unistd.h>

namespace baton {

namespace asio = boost::asio;

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

struct chat_url {
    std::string host, port, target; // target: the WebSocket path, e.g. /v1/ws
    std::string http_base;          // http(s)://HOST:PORT[prefix], for GET /v1/turns/{tid}
    bool tls = false;               // wss:// or https://
};

// ws://HOST:PORT[/v1/ws] or http://HOST:PORT[/prefix] (wss:// and https:// with TLS); the
// WebSocket path ends in /v1/ws.
std::optional<chat_url> parse_chat_url(const std::string& text, std::string& error) {
    auto u = boost::urls::parse_uri(text);
    if (!u) {
        error = "not a URL: " + text;
        return std::nullopt;
    }
    std::string scheme(u->scheme());
    if (scheme != "ws" && scheme != "http" && scheme != "wss" && scheme != "https") {
        error = "expected ws://HOST:PORT or http://HOST:PORT (wss://, https:// with TLS), got " + text;
        return std::nullopt;
    }
    chat_url out;
    out.tls = scheme == "wss" || scheme == "https";
    out.host = u->host_type() == boost::urls::host_type::ipv6 ? u->host_address() : u->host();
    out.port = u->has_port() ? std::string(u->port()) : std::string(out.tls ? "443" : "80");
    if (out.host.empty()) {
        error = "no host in " + text;
        return std::nullopt;
    }
    std::string path(u->encoded_path());
    while (!path.empty() && path.back() == '/')
        path.pop_back();
    constexpr std::string_view ws_path = "/v1/ws";
    if (path.ends_with(ws_path)) path.resize(path.size() - ws_path.size());
    out.target = path + std::string(ws_path);
    out.http_base =
        (out.tls ? "https://" : "http://") + std::string(u->encoded_host()) + ":" + out.port + path;
    return out;
}

std::string str(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

struct remote_chat {
    remote_chat(asio::io_context& c, chat_url u, std::string url_text, std::string sid,
                std::optional<std::string> bearer, std::string ca)
        : ioc(c), url(std::move(u)), url_text(std::move(url_text)), session(std::move(sid)),
          token(std::move(bearer)), ca_file(std::move(ca)), tty(::isatty(0) == 1), wake(c), grace(c),
          stop_after(c), http(std::make_shared<http_client>(c.get_executor(), client_options(ca_file))) {
    }

    static http_client_options client_options(const std::string& ca_file) {
        http_client_options o;
        o.ca_file = ca_file;
        return o;
    }

    struct message {
        std::string id, text, turn_id;
        bool accepted = false;
        bool done = false;
    };

    asio::io_context& ioc;
    chat_url url;
    std::string url_text;
    std::string session;
    std::optional<std::string> token; // sent as Authorization: Bearer on the upgrade and polls
    std::string ca_file;              // wss://: the trust anchors (empty: the system's)
    bool tty;
    chat_view view{std::cout, chat_view::mode::remote, dim_stdout()};
    std::vector<message> messages;        // "c-N" is messages[N-1]
    std::set<std::string> finished_turns; // no reply frame to wait for
    // Turns that turn.finished said completed with this reply, and when it said so.
    std::map<std::string, std::pair<std::string, clock_type::time_point>> completed_replies;
    std::set<std::string> seen_keys;
    std::shared_ptr<ws_client> ws;
    std::uint64_t generation = 0; // one per connection
    std::deque<std::string> out;  // frames for the current connection's writer
    asio::steady_timer wake;      // the writer waits on it while `out` is empty
    asio::steady_timer grace;
    asio::steady_timer stop_after;
    std::shared_ptr<http_client> http;
    bool eof = false;
    int exit_code = -1;

    void push(std::string frame) {
        out.push_back(std::move(frame));
        wake.cancel();
    }

    std::string message_frame(const message& m) const {
        return json::serialize(
            json::object{{"type", "message"}, {"session", session}, {"text", m.text}, {"id", m.id}});
    }

    bool outstanding() const {
        for (const auto& m : messages)
            if (!m.done) return true;
        return false;
    }

    // The writer sends what is queued (acks included), closes the connection and stops the loop;
    // a daemon that does not answer the close must not hold the exit.
    void finish(int code) {
        if (exit_code >= 0) return;
        exit_code = code;
        grace.cancel();
        if (!ws) return ioc.stop();
        wake.cancel();
        stop_after.expires_after(2s);
        stop_after.async_wait([this](boost::system::error_code ec) {
            if (!ec) ioc.stop();
        });
    }

    void maybe_finish() {
        if (!outstanding() && eof) finish(0);
    }

    void mark_turn_done(const std::string& tid) {
        finished_turns.insert(tid);
        completed_replies.erase(tid);
        for (auto& m : messages)
            if (m.turn_id == tid) m.done = true;
    }

    void on_line(std::string text) {
        if (exit_code >= 0) return;
        if (text.find_first_not_of(" \t\r") == std::string::npos) {
            if (tty) view.prompt();
            return;
        }
        message m;
        m.id = "c-" + std::to_string(messages.size() + 1);
        m.text = std::move(text);
        messages.push_back(std::move(m));
        if (ws) push(message_frame(messages.back()));
    }

    void on_eof() {
        eof = true;
        maybe_finish();
        check_replies();
    }

    // A completed turn's reply comes as a reply frame; should one not come within 5 s, the text
    // that turn.finished carried is shown instead of waiting forever (after stdin ended only).
    void check_replies() {
        if (exit_code >= 0) return;
        auto now = clock_type::now();
        for (auto [tid, pending] : std::map(completed_replies))
            if (now - pending.second > 5s) {
                view.on_reply(tid, pending.first);
                mark_turn_done(tid);
            }
        maybe_finish();
        grace.expires_after(1s);
        grace.async_wait([this](boost::system::error_code ec) {
            if (!ec) check_replies();
        });
    }

    void on_frame(const std::string& text) {
        bool waiting = outstanding();
        handle_frame(text);
        // A person at a terminal is asked for the next line once every answer is in.
        if (tty && !eof && waiting && !outstanding()) view.prompt();
        maybe_finish();
    }

    void handle_frame(const std::string& text) {
        boost::system::error_code ec;
        auto v = json::parse(text, ec);
        if (ec || !v.is_object()) return view.note("[bad frame from the daemon: " + text + "]");
        const auto& f = v.get_object();
        std::string type = str(f, "type");
        if (type == "accepted") {
            message* m = find(str(f, "id"));
            if (!m) return;
            m->accepted = true;
            m->turn_id = str(f, "turn_id");
            if (finished_turns.contains(m->turn_id)) m->done = true;
        } else if (type == "event") {
            static const json::object empty;
            const auto* d = f.if_contains("data");
            const auto& data = d && d->is_object() ? d->get_object() : empty;
            std::string tid = str(f, "turn_id"), event = str(f, "event");
            view.on_event(tid, event, data);
            if (event != "turn.finished") return;
            std::string reply = str(data, "reply");
            if (str(data, "status") == "completed" && !reply.empty())
                completed_replies[tid] = {reply, clock_type::now()};
            else
                mark_turn_done(tid);
        } else if (type == "reply") {
            std::string key = str(f, "key"), tid = str(f, "turn_id");
            // Ack every copy: the daemon re-sends until one ack arrives.
            push(json::serialize(json::object{{"type", "ack"}, {"key", key}}));
            if (!seen_keys.insert(key).second) return;
            view.on_reply(tid, str(f, "text"));
            mark_turn_done(tid);
        } else if (type == "error") {
            message* m = find(str(f, "id"));
            if (m && str(f, "code") == "session_queue_full") {
                // Lines piped faster than the session's queue takes them wait their turn here,
                // rather than being lost: sent again after the daemon's retry_after.
                std::int64_t after = 1;
                if (auto* r = f.if_contains("retry_after"); r && r->is_int64())
                    after = std::clamp<std::int64_t>(r->get_int64(), 1, 60);
                auto timer = std::make_shared<asio::steady_timer>(ioc, std::chrono::seconds(after));
                timer->async_wait([this, timer, index = static_cast<std::size_t>(m - messages.data())](
                                      boost::system::error_code ec) {
                    if (ec || exit_code >= 0) return;
                    const auto& again = messages[index];
                    if (ws && !again.accepted && !again.done) push(message_frame(again));
                });
                return;
            }
            view.on_error(str(f, "code"), str(f, "message"));
            if (m) m->done = true;
        } // pong and anything newer: nothing to do
    }

    message* find(const std::string& id) {
        if (!id.starts_with("c-")) return nullptr;
        std::size_t n = std::strtoull(id.c_str() + 2, nullptr, 10);
        return n >= 1 && n <= messages.size() ? &messages[n - 1] : nullptr;
    }

    // The connection's one writer. Cancellation: ends when its connection is replaced or gone.
    asio::awaitable<void> writer(std::shared_ptr<ws_client> c, std::uint64_t gen) {
        for (;;) {
            if (gen != generation) co_return;
            if (out.empty() && exit_code >= 0) {
                co_await c->close();
                ioc.stop();
                co_return;
            }
            if (out.empty()) {
                wake.expires_at(clock_type::time_point::max());
                co_await wake.async_wait(use_tuple);
                continue;
            }
            std::string frame = std::move(out.front());
            out.pop_front();
            if (co_await c->send(std::move(frame))) co_return; // the reader sees it too
        }
    }

    // Turns that ended while the connection was down sent their turn.finished to nobody: ask.
    asio::awaitable<void> check_turns() {
        for (std::size_t i = 0; i < messages.size(); ++i) {
            if (!messages[i].accepted || messages[i].done) continue;
            std::string tid = messages[i].turn_id;
            std::string method = "GET", target = url.http_base + "/v1/turns/" + tid;
            http_headers headers;
            if (token) headers.emplace_back("Authorization", "Bearer " + *token);
            auto [ec, res] = co_await http->request(method, target, std::move(headers), {}, 5s);
            if (ec || res.status != 200) continue;
            boost::system::error_code pec;
            auto v = json::parse(res.body, pec);
            if (pec || !v.is_object()) continue;
            const auto& rec = v.get_object();
            std::string status = str(rec, "status");
            if (status == "queued" || status == "running") continue;
            // A completed turn's reply is an unacked outbox item: the daemon sends it again.
            if (status == "completed" && !str(rec, "reply").empty()) continue;
            view.on_event(tid, "turn.finished", rec);
            mark_turn_done(tid);
        }
        maybe_finish();
    }

    asio::awaitable<void> run() {
        auto backoff = 200ms;
        auto down_since = clock_type::now();
        bool ever = false;
        asio::steady_timer pause(ioc);
        while (exit_code < 0) {
            auto c = std::make_shared<ws_client>(ioc.get_executor(), url.host, url.port);
            if (token) c->set_header("Authorization", "Bearer " + *token);
            if (url.tls) {
                ws_client_tls t;
                t.ca_file = ca_file;
                if (auto tec = c->use_tls(t)) {
                    std::cerr << "baton: --cacert " << ca_file << ": " << tec.message() << "\n";
                    finish(2);
                    co_return;
                }
            }
            auto [ec, status] = co_await c->connect(url.target, 5s, 20s, true);
            if (exit_code >= 0) co_return;
            if (ec && url.tls && status == 0 && ec.category() == asio::error::get_ssl_category()) {
                // A certificate that is not trusted stays untrusted: say so once.
                std::cerr << "baton: " << url_text << ": TLS: " << ec.message()
                          << (ca_file.empty() ? " (--cacert FILE trusts a self-signed certificate)" : "")
                          << "\n";
                finish(1);
                co_return;
            }
            if (ec && (status == 401 || status == 403)) {
                // Trying again cannot help: say so once, and never print the token.
                std::cerr << "baton: " << url_text << " refused the connection (HTTP " << status << "): "
                          << (status == 403 ? "the token lacks the tenant scope"
                              : token       ? "the token is not valid"
                                            : "the daemon needs a token: --token or BATON_TOKEN")
                          << "\n";
                finish(1);
                co_return;
            }
            if (ec) {
                std::string why = status > 0 ? "HTTP " + std::to_string(status) +
                                                   " (no WebSocket channel at " + url.target + ")"
                                             : ec.message();
                // The first attempt tells whether there is a daemon at all.
                if (!ever || clock_type::now() - down_since > 30s) {
                    std::cerr << "baton: cannot connect to " << url_text << ": " << why << "\n";
                    finish(1);
                    co_return;
                }
                pause.expires_after(backoff);
                co_await pause.async_wait(use_tuple);
                backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
                continue;
            }
            if (ever) view.note("[reconnected]");
            backoff = 200ms;
            ws = c;
            ++generation;
            out.clear();
            push(json::serialize(json::object{{"type", "subscribe"}, {"session", session}}));
            for (const auto& m : messages)
                if (!m.accepted && !m.done) push(message_frame(m));
            asio::co_spawn(ioc, writer(c, generation), asio::detached);
            if (ever) asio::co_spawn(ioc, check_turns(), asio::detached);
            ever = true;
            for (;;) {
                auto [rec, text] = co_await c->receive();
                if (rec) break;
                on_frame(text);
            }
            ws.reset();
            ++generation;
            wake.cancel();
            if (exit_code >= 0) co_return;
            view.note("[connection lost; reconnecting]");
            down_since = clock_type::now();
        }
    }
};

} // namespace

int run_remote_chat(const chat_options& opts) {
    std::string error;
    auto url = parse_chat_url(*opts.url, error);
    if (!url) {
        std::cerr << "baton: --url: " << error << "\n";
        return 2;
    }
    asio::io_context ioc(1);
    if (opts.ca_file && !url->tls) {
        std::cerr << "baton: --cacert needs a wss:// or https:// --url\n";
        return 2;
    }
    remote_chat chat(ioc, *url, *opts.url, opts.session, opts.token, opts.ca_file.value_or(""));
    asio::signal_set signals(ioc, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int) {
        if (!ec) chat.finish(130);
    });
    auto on_done = [&chat](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            std::cerr << "baton: " << ex.what() << "\n";
        }
        chat.finish(1);
    };
    asio::co_spawn(ioc, chat.run(), on_done);
    if (chat.tty) chat.view.prompt();
    {
        line_reader reader([&](std::string l) { asio::post(ioc, [&chat, l] { chat.on_line(l); }); },
                           [&] { asio::post(ioc, [&chat] { chat.on_eof(); }); });
        ioc.run();
    }
    return chat.exit_code < 0 ? 1 : chat.exit_code;
}

} // namespace baton
