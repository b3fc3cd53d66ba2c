// A scripted fake OpenAI server for protocol tests: a Beast server on 127.0.0.1:0 with its own
// io_context thread. The test queues the replies (JSON completions, SSE streams cut at chosen
// byte boundaries, error statuses, delays, dropped connections) and inspects every request it got.
// When no scripted reply is queued, an optional handler answers (long conversations).
// Also here: a self-signed certificate maker and a tiny TLS responder, for the https checks.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton::test {

struct recorded_request {
    std::string method;
    std::string target;
    std::vector<std::pair<std::string, std::string>> headers;
    boost::json::value body;                             // null when the body is not JSON
    std::chrono::steady_clock::time_point received_at{}; // the whole request was read
    // The answer started to go out (after its scripted delay); unset before.
    std::optional<std::chrono::steady_clock::time_point> answered_at;
    std::optional<std::string> header(std::string_view name) const;
};

// The fake's own token count of a chat-completions request: per message 4 + ceil(bytes(content)/4),
// plus ceil(bytes(name + arguments)/4) per tool call, plus ceil(bytes(the "tools" array as JSON)/4):
// like a real model's prompt_tokens, it counts the function definitions it is offered.
std::int64_t prompt_tokens_of(const boost::json::value& request_body);

// One scripted answer. Build with the factories, adjust the public fields as needed.
struct fake_reply {
    unsigned status = 200;
    std::vector<std::pair<std::string, std::string>> headers;
    std::vector<std::string> pieces;          // the body, one socket write per piece
    bool chunked = false;                     // Transfer-Encoding: chunked, one HTTP chunk per piece
    std::chrono::milliseconds delay{0};       // before the status line
    std::chrono::microseconds piece_delay{0}; // between pieces, so that they arrive apart
    std::optional<std::size_t> drop_after;    // close the connection after this many body bytes
    bool send_head = true;                    // false with drop_after: close without answering
    bool close = false;                       // answer with Connection: close
    std::string interim;                      // raw bytes before the status line (1xx answers)

    // A chat.completion object; tool calls as {id, name, arguments}.
    static fake_reply completion(std::string text, std::vector<std::vector<std::string>> tool_calls = {},
                                 std::string finish_reason = "stop");
    // An SSE body of the given chunk objects followed by "data: [DONE]", cut into pieces of
    // `piece_size` bytes (0: one piece per event); `crlf` ends lines with "\r\n".
    static fake_reply sse(const std::vector<boost::json::object>& chunks, std::size_t piece_size = 0,
                          bool crlf = false, bool done = true);
    // Streamed text deltas: role chunk, one chunk per delta, finish chunk, usage chunk.
    static fake_reply stream_text(const std::vector<std::string>& deltas, std::size_t piece_size = 0,
                                  bool crlf = false);
    // {"error": {"message", "type"}} with the status; Retry-After when given.
    static fake_reply error(unsigned status, std::string message,
                            std::optional<std::string> retry_after = std::nullopt);
    // Reads the request, then closes the connection without a byte of answer.
    static fake_reply hang_up();

    fake_reply& after(std::chrono::milliseconds d) {
        delay = d;
        return *this;
    }
};

// A chat.completion.chunk with the given delta (and finish_reason when not empty).
boost::json::object chunk(boost::json::object delta, std::string finish_reason = "");

class fake_openai {
public:
    fake_openai();
    ~fake_openai();
    fake_openai(const fake_openai&) = delete;
    fake_openai& operator=(const fake_openai&) = delete;

    unsigned short port() const;
    std::string base_url() const; // http://127.0.0.1:<port>/v1

    void push(fake_reply r);
    // Answers every request that finds no scripted reply queued (else a 500). Called on the
    // server's thread, without the fake's lock held; it may call requests().
    void set_handler(std::function<fake_reply(const recorded_request&)> handler);
    // When `scale` > 0, a 200 JSON answer with a "usage" object reports prompt_tokens_of(the
    // request) times `scale` (a model whose tokenizer counts more or fewer tokens); 0 turns it off.
    void report_prompt_tokens(double scale = 1.0);
    std::vector<recorded_request> requests() const;
    std::size_t connections() const; // accepted so far
    std::size_t pending() const;     // scripted replies not used yet

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

struct tls_identity {
    std::string cert_pem;
    std::string key_pem;
};

// A fresh P-256 key and a self-signed certificate (CN="baton-test <san>") whose subjectAltName is `san`,
// e.g. "IP:127.0.0.1" or "DNS:example.invalid".
tls_identity make_self_signed(const std::string& san);

// Accepts TLS connections on 127.0.0.1:0 with `id` and answers any request with 200 "ok" and
// Connection: close. Its own io_context thread.
class tls_responder {
public:
    explicit tls_responder(const tls_identity& id);
    ~tls_responder();
    unsigned short port() const;
    std::size_t handshakes() const; // completed server-side handshakes

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

} // namespace baton::test
