#include <baton/openai_client.hpp>

#include <baton/errors.hpp>
#include <baton/json_text.hpp>
#include <baton/log.hpp>
#include "src/model/chat_delta.hpp"
#include "src/model/sse.hpp"

#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace baton {

namespace asio = boost::asio;
using boost::system::error_code;
using std::chrono::milliseconds;

std::chrono::milliseconds retry_delay(const openai_retry_policy& policy, int attempt, double jitter,
                                      std::optional<std::chrono::milliseconds> retry_after) {
    const auto cap = std::max(policy.max_delay, milliseconds(0));
    if (retry_after) return std::clamp(*retry_after, milliseconds(0), cap);
    // Computed in double so that a large attempt number saturates at the cap instead of overflowing.
    double ceiling = static_cast<double>(std::max<std::int64_t>(policy.base_delay.count(), 0)) *
                     std::ldexp(1.0, std::clamp(attempt - 1, 0, 62));
    ceiling = std::min(ceiling, static_cast<double>(cap.count()));
    return milliseconds(std::llround(ceiling * std::clamp(jitter, 0.0, 1.0)));
}

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}

int month_number(const char* name) {
    static constexpr const char* names[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    for (int i = 0; i < 12; ++i)
        if (std::strcmp(name, names[i]) == 0) return i + 1;
    return 0;
}

// The three HTTP date formats a recipient must accept (RFC 9110 section 5.6.7), all in GMT.
std::optional<std::chrono::system_clock::time_point> parse_http_date(std::string_view v) {
    std::string s(v);
    char month[4] = {};
    int day = 0, year = 0, hh = 0, mm = 0, ss = 0, used = 0;
    const int len = static_cast<int>(s.size());
    bool ok = std::sscanf(s.c_str(), "%*3[A-Za-z], %2d %3[A-Za-z] %4d %2d:%2d:%2d GMT%n", &day, month,
                          &year, &hh, &mm, &ss, &used) == 6 &&
              used == len;
    if (!ok) { // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
        used = 0;
        ok = std::sscanf(s.c_str(), "%*[A-Za-z], %2d-%3[A-Za-z]-%2d %2d:%2d:%2d GMT%n", &day, month,
                         &year, &hh, &mm, &ss, &used) == 6 &&
             used == len;
        if (ok) year += year < 70 ? 2000 : 1900;
    }
    if (!ok) { // asctime: "Sun Nov  6 08:49:37 1994"
        used = 0;
        ok = std::sscanf(s.c_str(), "%*3[A-Za-z] %3[A-Za-z] %2d %2d:%2d:%2d %4d%n", month, &day, &hh,
                         &mm, &ss, &year, &used) == 6 &&
             used == len;
    }
    if (!ok || hh > 23 || mm > 59 || ss > 60) return std::nullopt;
    using namespace std::chrono;
    year_month_day date{std::chrono::year(year), std::chrono::month(month_number(month)),
                        std::chrono::day(static_cast<unsigned>(day))};
    if (!date.ok()) return std::nullopt;
    return sys_days(date) + hours(hh) + minutes(mm) + seconds(ss);
}

} // namespace

std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value,
                                                           std::chrono::system_clock::time_point now) {
    value = trim(value);
    if (value.empty()) return std::nullopt;
    if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        // Anything above a day is as good as "too long": saturate rather than overflow.
        if (value.size() > 6) return milliseconds(86400000);
        return milliseconds(std::min(std::stoll(std::string(value)), 86400LL) * 1000);
    }
    auto date = parse_http_date(value);
    if (!date) return std::nullopt;
    return std::max(std::chrono::duration_cast<milliseconds>(*date - now), milliseconds(0));
}

namespace {

enum class outcome { done, retry, fail };

struct attempt_result {
    outcome kind = outcome::fail;
    chat_completion completion;
    std::string message; // why the attempt failed
    std::optional<milliseconds> retry_after;
};

attempt_result failed(outcome kind, std::string message, std::optional<milliseconds> retry_after = {}) {
    return {kind, {}, std::move(message), retry_after};
}

double random_jitter() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// The server's own explanation: error.message of an OpenAI error body, else a short excerpt.
std::string server_message(std::string_view body) {
    error_code ec;
    auto v = json::parse(body, ec);
    if (!ec && v.is_object()) {
        const auto& o = v.get_object();
        const json::value* e = o.if_contains("error");
        if (e && e->is_string()) return std::string(e->get_string());
        if (e && e->is_object())
            e = e->get_object().if_contains("message");
        else
            e = o.if_contains("message");
        if (e && e->is_string()) return std::string(e->get_string());
    }
    std::string excerpt(body.substr(0, 200));
    std::replace_if(
        excerpt.begin(), excerpt.end(), [](char c) { return c == '\r' || c == '\n'; }, ' ');
    return excerpt;
}

std::optional<milliseconds> retry_after_of(const http_response& r) {
    // OpenAI and Azure also send the finer retry-after-ms; prefer it when it parses.
    if (auto ms = r.header("retry-after-ms")) {
        char* end = nullptr;
        std::string s(trim(*ms));
        double v = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && v >= 0 && v < 86400000.0)
            return milliseconds(std::llround(v));
    }
    if (auto v = r.header("retry-after")) return parse_retry_after(*v, std::chrono::system_clock::now());
    return std::nullopt;
}

// A non-200 answer: 408, 409, 429 and 5xx are worth another attempt (as OpenAI's own SDKs
// judge them: a request timeout, a lock conflict, a rate limit, a server error), any other status
// is final.
attempt_result status_failure(const http_response& head, std::string_view body) {
    std::string message = "HTTP " + std::to_string(head.status);
    if (auto detail = server_message(body); !detail.empty()) message += ": " + detail;
    if (head.status == 408 || head.status == 409 || head.status == 429 || head.status >= 500)
        return failed(outcome::retry, message, retry_after_of(head));
    return failed(outcome::fail, message);
}

// A whole answer is reported to the delta handler at once, as one delta.
void show_whole(const chat_completion& c, const delta_handler& on_delta) {
    if (on_delta && (!c.text.empty() || !c.reasoning.text.empty())) on_delta({c.text, c.reasoning.text});
}

attempt_result parse_whole(std::string_view body) {
    error_code ec;
    auto v = json::parse(body, ec);
    if (ec || !v.is_object()) return failed(outcome::fail, "the response is not a JSON object");
    std::string error;
    auto c = parse_chat_completion(v.get_object(), error);
    if (!error.empty()) return failed(outcome::fail, "malformed response: " + error);
    return {outcome::done, std::move(c), {}, {}};
}

} // namespace

namespace {

// The chat-completions request, written straight to text: a turn's whole context goes out on
// every model call, so no JSON tree is built and torn down for it, and the messages the session's
// context has already written (model_request::encoded) are copied, not written again.
std::string request_body(const model_request& req, const model_config& cfg) {
    using namespace std::string_view_literals;
    std::string out;
    // A block that claims more messages than the request has is not used.
    const std::size_t kept =
        !req.encoded.empty() && req.encoded_count <= req.messages.size() ? req.encoded_count : 0;
    std::size_t estimate = 256 + (kept ? req.encoded.size() : 0);
    for (std::size_t i = kept; i < req.messages.size(); ++i)
        estimate += req.messages[i].content.size() + 48;
    out.reserve(estimate);
    out += "{\"model\":"sv;
    append_json_string(out, req.model.empty() ? cfg.model : req.model);
    out += ",\"messages\":["sv;
    if (kept) out += req.encoded;
    for (std::size_t i = kept; i < req.messages.size(); ++i) {
        if (i) out += ',';
        append_chat_message(out, req.messages[i]);
    }
    out += ']';
    if (!req.tools.empty()) {
        out += ",\"tools\":["sv;
        for (std::size_t i = 0; i < req.tools.size(); ++i) {
            const auto& t = req.tools[i];
            out += i ? ",{\"type\":\"function\",\"function\":{\"name\":"sv
                     : "{\"type\":\"function\",\"function\":{\"name\":"sv;
            append_json_string(out, t.name);
            out += ",\"description\":"sv;
            append_json_string(out, t.description);
            out += ",\"parameters\":"sv;
            append_json(out, t.parameters);
            out += "}}"sv;
        }
        out += ']';
    }
    if (req.max_tokens > 0) {
        out += ",\"max_tokens\":"sv;
        out += std::to_string(req.max_tokens);
    }
    out += cfg.stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"sv
                      : ",\"stream\":false}"sv;
    return out;
}

// Whether a 200 body is an SSE stream, judged by its first bytes: a server may mislabel one (an
// SSE stream sent as application/json, or with no Content-Type) or stream although stream:false
// was asked. True: SSE (a field name and a colon, or a comment); false: anything else (JSON, or
// what parse_whole will call malformed); nullopt: too few bytes yet.
std::optional<bool> sniff_sse(std::string_view body) {
    auto start = body.find_first_not_of(" \t\r\n");
    if (start == std::string_view::npos) return std::nullopt;
    body.remove_prefix(start);
    if (body.front() == ':') return true;
    for (std::string_view field : {"data:", "event:", "id:", "retry:"}) {
        if (body.starts_with(field)) return true;
        if (field.starts_with(body)) return std::nullopt;
    }
    return false;
}

// One streamed attempt, fed by the HTTP client's callbacks: SSE events become chunks, chunks
// become deltas and the assembled completion. A body that is not SSE (an error, or a server that
// ignored stream:true) is kept whole instead. A 200 is taken for SSE by its Content-Type, else by
// its first bytes (sniff_sse).
struct stream_state {
    explicit stream_state(const delta_handler& d) : on_delta(d) {}

    const delta_handler& on_delta;
    sse_parser parser;
    chat_stream_assembler assembler;
    bool sse = false;
    bool undecided = false; // a 200 not labelled SSE, until its first bytes say what it is
    std::string body;
    std::string error; // the first malformed or error chunk: the rest is ignored
    bool done = false; // "data: [DONE]" arrived
    bool delivered = false; // reply text went to on_delta (reasoning alone may be shown again)

    void head(const http_response& h) {
        std::string type(h.header("content-type").value_or("").substr(0, 17));
        std::transform(type.begin(), type.end(), type.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        sse = h.status == 200 && type == "text/event-stream";
        undecided = h.status == 200 && !sse;
    }

    void piece(std::string_view bytes) {
        if (!sse) {
            body.append(bytes);
            if (!undecided) return;
            auto is_sse = sniff_sse(body);
            if (!is_sse) return;
            undecided = false;
            if (!*is_sse) return;
            sse = true;
            take(parser.feed(std::exchange(body, {})));
            if (parser.failed()) error = parser.error();
            return;
        }
        if (done || !error.empty()) return;
        take(parser.feed(bytes));
        if (parser.failed()) error = parser.error();
    }

    // The end of the body: a last event without its blank line is judged here. "[DONE]" so
    // framed still ends the stream; a chunk so framed may have been cut, and is not taken.
    void end() {
        if (!sse || done || !error.empty()) return;
        for (auto& ev : parser.finish()) {
            if (is_done(ev.data))
                done = true;
            else
                unfinished = true;
        }
    }

    // The body is complete: [DONE] came, or (some compatible servers omit it) a finish_reason
    // and nothing after it but white space.
    bool complete() const {
        return error.empty() && (done || (!unfinished && !assembler.result().finish_reason.empty()));
    }
    // Why an incomplete stream is: it ended inside an event, or had neither ending.
    std::string_view incomplete_reason() const {
        return unfinished ? "the stream ended inside an event"
                          : "the stream ended without [DONE] or a finish_reason";
    }

private:
    static bool is_done(std::string_view data) {
        while (!data.empty() && (data.back() == ' ' || data.back() == '\t'))
            data.remove_suffix(1);
        return data == "[DONE]";
    }

    void take(std::vector<sse_event> events) {
        for (auto& ev : events) {
            if (is_done(ev.data)) {
                done = true;
                return;
            }
            auto d = assembler.add_text(ev.data, error);
            if (!error.empty()) return;
            if (!d.text.empty()) delivered = true;
            if ((!d.text.empty() || !d.reasoning.empty()) && on_delta) on_delta({d.text, d.reasoning});
        }
    }

    bool unfinished = false; // the body ended inside an event that was not [DONE]
};

class openai_model final : public model_client {
public:
    openai_model(asio::any_io_executor ex, model_config cfg, std::shared_ptr<http_client> http,
                 openai_retry_policy retry)
        : ex_(std::move(ex)), cfg_(std::move(cfg)), http_(std::move(http)), retry_(retry) {
        std::string base = cfg_.base_url;
        while (!base.empty() && base.back() == '/')
            base.pop_back();
        url_ = base + "/chat/completions";
    }

    asio::awaitable<chat_completion> complete(const model_request& req,
                                              const delta_handler& on_delta) override {
        const std::string body = request_body(req, cfg_);
        const auto headers = request_headers();
        const int attempts = std::max(1, retry_.max_attempts);
        for (int attempt = 1;; ++attempt) {
            attempt_result r;
            if (cfg_.stream)
                r = co_await attempt_stream(body, headers, on_delta);
            else
                r = co_await attempt_whole(body, headers, on_delta);
            if (r.kind == outcome::done) co_return std::move(r.completion);
            if (r.kind == outcome::fail || attempt >= attempts) {
                std::string why = r.kind == outcome::fail && attempt == 1
                                      ? "openai model call failed: "
                                      : "openai model call failed after " + std::to_string(attempt) +
                                            (attempt == 1 ? " attempt: " : " attempts: ");
                throw turn_error("model_error", why + r.message);
            }
            auto delay = retry_delay(retry_, attempt, random_jitter(), r.retry_after);
            log::warn("model call failed, retrying", {{"url", url_},
                                                      {"attempt", attempt},
                                                      {"delay_ms", delay.count()},
                                                      {"error", r.message}});
            // Cancellation aborts the wait: use_awaitable throws operation_aborted.
            asio::steady_timer timer(ex_, delay);
            co_await timer.async_wait(asio::use_awaitable);
        }
    }

    std::string name() const override { return "openai"; }
    bool reads_encoded_messages() const override { return true; }

private:
    http_headers request_headers() const {
        http_headers h{{"Content-Type", "application/json"},
                       {"Accept", cfg_.stream ? "text/event-stream" : "application/json"},
                       {"User-Agent", "baton/" BATON_VERSION}};
        const char* key = cfg_.api_key_env.empty() ? nullptr : std::getenv(cfg_.api_key_env.c_str());
        if (key && *key) h.emplace_back("Authorization", std::string("Bearer ") + key);
        return h;
    }

    std::string transport_failure(const error_code& ec) const { return url_ + ": " + ec.message(); }

    // Cancellation: http_client returns operation_aborted, rethrown here as system_error.
    // `body` is complete()'s, kept for every attempt: lent to the client, not copied.
    asio::awaitable<attempt_result> attempt_whole(const std::string& body, http_headers headers,
                                                  const delta_handler& on_delta) {
        std::string method = "POST";
        auto [ec, resp] = co_await http_->request(method, url_, std::move(headers),
                                                  borrowed_body{body}, cfg_.timeout);
        if (ec == asio::error::operation_aborted) throw boost::system::system_error(ec);
        if (ec) co_return failed(outcome::retry, transport_failure(ec));
        if (resp.status != 200) co_return status_failure(resp, resp.body);
        if (sniff_sse(resp.body).value_or(false)) {
            // A server that streams although stream:false was asked: read as the stream it is.
            stream_state st(on_delta);
            st.sse = true;
            st.piece(resp.body);
            st.end();
            if (st.complete()) co_return attempt_result{outcome::done, st.assembler.take(), {}, {}};
            co_return stream_failure(st);
        }
        auto r = parse_whole(resp.body);
        if (r.kind == outcome::done) show_whole(r.completion, on_delta);
        co_return r;
    }

    // An SSE body that ended, whole, without being complete: a malformed or error chunk, or a
    // stream cut short (a server that died with a close-delimited body) or never one of chunks at
    // all. Shown text is never shown twice, so then no second attempt.
    static attempt_result stream_failure(const stream_state& st) {
        if (!st.error.empty()) return failed(outcome::fail, "stream error: " + st.error);
        return failed(st.delivered ? outcome::fail : outcome::retry,
                      std::string(st.incomplete_reason()));
    }

    // Cancellation: as attempt_whole.
    asio::awaitable<attempt_result> attempt_stream(const std::string& body, http_headers headers,
                                                   const delta_handler& on_delta) {
        stream_state st(on_delta);
        std::function<void(const http_response&)> on_head = [&st](const http_response& h) {
            st.head(h);
        };
        std::function<void(std::string_view)> on_body = [&st](std::string_view p) { st.piece(p); };
        std::string method = "POST";
        auto [ec, head] = co_await http_->stream(method, url_, std::move(headers),
                                                 borrowed_body{body}, cfg_.timeout, on_head, on_body);
        if (ec == asio::error::operation_aborted) throw boost::system::system_error(ec);
        st.end();
        // Everything arrived: a connection lost (or a body cut short) after [DONE], or after a
        // finish_reason followed by whole events only, costs nothing.
        if (st.complete()) co_return attempt_result{outcome::done, st.assembler.take(), {}, {}};
        if (ec) {
            // The caller has shown the text already: a second attempt would show it twice.
            if (st.delivered)
                co_return failed(outcome::fail,
                                 "the stream broke after text was delivered: " + transport_failure(ec));
            co_return failed(outcome::retry, transport_failure(ec));
        }
        if (head.status != 200) co_return status_failure(head, st.body);
        if (!st.sse) {
            auto r = parse_whole(st.body);
            if (r.kind == outcome::done) show_whole(r.completion, on_delta);
            co_return r;
        }
        co_return stream_failure(st);
    }

    asio::any_io_executor ex_;
    model_config cfg_;
    std::shared_ptr<http_client> http_;
    openai_retry_policy retry_;
    std::string url_;
};

} // namespace

std::shared_ptr<model_client> make_openai_model(asio::any_io_executor ex, const model_config& cfg,
                                                std::shared_ptr<http_client> http,
                                                openai_retry_policy retry) {
    return std::make_shared<openai_model>(std::move(ex), cfg, std::move(http), retry);
}

} // namespace baton
