// The Telegram Bot API as the channel speaks it, without I/O: request bodies for getUpdates and
// sendMessage, and what their answers mean (updates, retry hints, give-up reasons). The token
// only ever appears in method_url(); nothing here puts it into an error text or a log line.
#pragma once

#include <baton/delivery.hpp>

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::telegram {

namespace json = boost::json;

// One incoming text message (an update of type "message" with text).
struct update {
    std::int64_t update_id = 0;
    std::string chat_id; // decimal text of message.chat.id (negative for groups)
    std::int64_t message_id = 0;
    std::string text;
    std::optional<std::int64_t> from_id;
    std::string from_username;
};
json::object to_json(const update& u);
std::optional<update> update_from_json(const json::value& v);

// "<api_base>/bot<token>/<method>" (api_base without a trailing slash).
std::string method_url(std::string_view api_base, std::string_view token, std::string_view method);

// The bot's numeric id: the part of the token before ':' (not secret); empty when malformed.
std::string bot_id(std::string_view token);

// {"offset", "timeout", "allowed_updates": ["message"]}
std::string get_updates_body(std::int64_t offset, std::int64_t timeout_s);

// What a getUpdates answer came to.
struct poll_result {
    enum class kind { ok, retry, unauthorized } what = kind::ok;
    std::vector<update> updates;                     // ok: the text messages
    std::int64_t next_offset = 0;                    // ok: one past the highest update_id seen (0: none)
    std::string error;                               // retry, unauthorized: why, for the log
    std::optional<std::chrono::seconds> retry_after; // the server's hint (429)
};
// `status` and `body` of the HTTP answer; updates without message.text only advance the offset.
poll_result parse_get_updates(unsigned status, std::string_view body);

// The bot's username from a getMe answer, or empty (any failure: then not known).
std::string parse_get_me(unsigned status, std::string_view body);

// In a group, Telegram clients address a command to one bot: "/stop@my_bot now". The text as this
// bot (`me`, its username; empty when not known: any bot is this one) takes it: the command without
// "@my_bot"; nullopt for a command addressed to another bot (not this bot's to answer). Other
// texts are as they are.
std::optional<std::string> addressed_text(std::string_view text, std::string_view me);

// {"chat_id", "text"}: an integer chat id is sent as a number, anything else as a string.
std::string send_message_body(std::string_view chat_id, std::string_view text);

// ok: delivered; 429: again after parameters.retry_after; 5xx and other surprises: again;
// 400/403 (chat not found, bot blocked) and other 4xx: give up with the description.
send_outcome parse_send_message(unsigned status, std::string_view body);

// A chat id as the Bot API makes them: an optional '-' and 1-19 digits fitting in int64.
bool is_chat_id(std::string_view s);

} // namespace baton::telegram
