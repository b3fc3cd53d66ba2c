// The OpenAI-compatible model client: POST {base_url}/chat/completions, streamed (SSE, text
// deltas as they arrive, tool calls assembled by index) or whole, with retries and backoff on
// connection failures, 429 and 5xx. Works with any server that speaks the chat-completions API.
#pragma once

#include <baton/config.hpp>
#include <baton/http_client.hpp>
#include <baton/model.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string_view>

namespace baton {

struct openai_retry_policy {
    int max_attempts = 4; // attempts in all, the first included
    std::chrono::milliseconds base_delay{500};
    std::chrono::milliseconds max_delay{20000};
};

// The wait before the next attempt after failed attempt number `attempt` (1-based): a server's
// Retry-After when it sent one, else exponential backoff with full jitter (uniform in
// [0, base_delay * 2^(attempt-1)], `jitter` in [0, 1] picking the point); both capped at max_delay.
std::chrono::milliseconds retry_delay(const openai_retry_policy& policy, int attempt, double jitter,
                                      std::optional<std::chrono::milliseconds> retry_after);

// A Retry-After header value: delay-seconds ("120") or an HTTP date ("Wed, 21 Oct 2015 07:28:00
// GMT", measured from `now`; a date in the past means no wait). Anything else: nullopt.
std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view value,
                                                           std::chrono::system_clock::time_point now);

// `cfg` gives base_url, model (when the request names none), api_key_env (Authorization:
// Bearer, omitted when the variable is unset or empty), stream and the per-attempt timeout.
// complete() throws turn_error("model_error") after the last failed attempt; a stream that has
// already delivered text is never retried. on_delta runs while complete() is suspended, on the
// HTTP connection's strand. Cancellation (the awaiting coroutine's slot) aborts the request or
// the backoff wait and throws system_error(operation_aborted).
std::shared_ptr<model_client> make_openai_model(boost::asio::any_io_executor ex, const model_config& cfg,
                                                std::shared_ptr<http_client> http,
                                                openai_retry_policy retry = {});

} // namespace baton
