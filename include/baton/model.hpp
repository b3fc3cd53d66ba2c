// The model-client interface the agent loop calls. `echo` is the offline model; the
// OpenAI-compatible client (chat completions, streaming, tool calls) implements the same interface.
#pragma once

#include <baton/types.hpp>

#include <boost/json/array.hpp>

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <cstdint>

namespace baton {

// What a model thought before it answered. Never part of the reply. Some providers need it sent
// back with the assistant message in the next request of the turn (DeepSeek's thinking mode
// answers 400 without it on tool-call steps), so it keeps the name it came under.
struct model_reasoning {
    // The readable text: `reasoning_content` (DeepSeek, xAI, Qwen, Moonshot, GLM), `reasoning`
    // (Groq, OpenRouter, Ollama), Mistral's "thinking" content parts, or the text of OpenRouter's
    // reasoning_details when nothing else carried it.
    std::string text;
    // The message field it came in and goes back in: "reasoning_content" or "reasoning"; empty
    // when it came as content parts or inside reasoning_details only (then `text` is not sent).
    std::string field;
    // OpenRouter's reasoning_details, the stream's pieces merged by index; sent back as they came
    // (encrypted blocks and signatures included). Empty when none came.
    boost::json::array details;

    bool empty() const { return text.empty() && details.empty(); }
    bool operator==(const model_reasoning&) const = default;
};

struct chat_completion {
    struct tool_call {
        std::string id;
        std::string name;
        std::string arguments; // raw JSON text, as the model wrote it (it may not even parse)

        bool operator==(const tool_call&) const = default;
    };

    std::string id;    // "chatcmpl-..."
    std::string model; // the model that actually answered, e.g. "gpt-4o-2024-08-06"
    std::string text;  // the reply; a refusal's text when `refusal`
    model_reasoning reasoning;
    bool refusal = false;              // the model refused (OpenAI's `refusal`): `text` says why
    std::vector<tool_call> tool_calls; // ordered by the stream's tool-call index
    std::string finish_reason;         // "stop", "length", "tool_calls", ...; empty if never sent
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
    bool has_usage = false;

    bool operator==(const chat_completion&) const = default;
};

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
    // Assistant messages of the running turn: what the model thought, sent back under the field
    // it came in (reasoning.field, and reasoning_details) as providers with thinking modes need.
    // Earlier turns' messages carry none: the tape keeps it, the context does not send it again.
    model_reasoning reasoning = {};
};

// The assistant message that goes back to the model after a step: the step's text (`text`, which
// the caller may have clipped), its tool calls and its reasoning.
chat_message assistant_message(std::string text, const chat_completion& c);

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
// [,"tool_call_id"][,<reasoning.field>][,"reasoning_details"]}.
void append_chat_message(std::string& out, const chat_message& m);

// What a streaming model reported as it arrived: reply text (model.delta events) and reasoning
// (model.reasoning events); either may be empty.
struct model_delta {
    std::string_view text;
    std::string_view reasoning;
};
using delta_handler = std::function<void(const model_delta&)>;

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
