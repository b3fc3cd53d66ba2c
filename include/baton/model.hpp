// The model-client interface the agent loop calls. `echo` is the offline model; the
// OpenAI-compatible client (chat completions, streaming, tool calls) implements the same interface.
#pragma once

#include <baton/chat_delta.hpp>
#include <baton/types.hpp>

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

using tool_call = chat_completion::tool_call;

// A function the model may call: name, description and a JSON schema of its arguments.
struct tool_schema {
    std::string name;
    std::string description;
    json::object parameters;
};

struct chat_message {
    std::string role; // system | user | assistant | tool
    std::string content;
    std::vector<tool_call> tool_calls; // assistant messages that asked for tools
    std::string tool_call_id;          // tool messages: the call they answer
};

struct model_request {
    std::string model;
    std::vector<chat_message> messages;
    std::vector<tool_schema> tools;
    std::int64_t max_tokens = 0;
    // The session's context as already written: the first `encoded_count` messages as
    // chat-completions message objects (append_chat_message) joined by commas, in one block. The
    // agent loop fills it with the messages lent from the session's context, for clients that
    // say they read it; the turn's own messages, after them, are not in it. Empty (and 0) when
    // there is none.
    std::string_view encoded;
    std::size_t encoded_count = 0;
};

// Appends `m` as a chat-completions message object: {"role","content"[,"tool_calls"]
// [,"tool_call_id"]}.
void append_chat_message(std::string& out, const chat_message& m);

// Receives streamed text as it arrives (model.delta events).
using delta_handler = std::function<void(std::string_view)>;

class model_client {
public:
    virtual ~model_client() = default;
    // One model call (with the client's own retries). Failures after retries throw
    // turn_error("model_error"); cancellation follows the awaiting coroutine's slot
    // (operation_aborted).
    virtual boost::asio::awaitable<chat_completion> complete(const model_request& req,
                                                             const delta_handler& on_delta) = 0;
    virtual std::string name() const = 0;
    // True when complete() sends model_request::encoded's texts instead of writing them again.
    virtual bool reads_encoded_messages() const { return false; }
};

// Replies "echo: <last user text>"; usage counts whitespace-separated words.
std::shared_ptr<model_client> make_echo_model();

} // namespace baton
