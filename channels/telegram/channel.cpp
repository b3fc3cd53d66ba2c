#include "channels/telegram/channel.hpp"

#include <algorithm>
#include <cstdlib>

namespace baton::telegram {

std::optional<options> options_from(const channels_config& c, std::string& error) {
    if (!c.telegram_token_env) return std::nullopt;
    const char* token = std::getenv(c.telegram_token_env->c_str());
    if (token == nullptr || *token == '\0') {
        error = "channels.telegram.token_env: the environment variable " + *c.telegram_token_env +
                (token ? " is empty" : " is not set");
        return std::nullopt;
    }
    options o;
    o.api_base = c.telegram_api_base;
    o.token = token;
    o.allow_chats = c.telegram_allow_chats;
    o.agent = c.telegram_agent;
    o.tenant = c.telegram_tenant;
    o.debounce = c.telegram_debounce;
    o.send_interval = c.telegram_send_interval;
    o.poll_timeout = std::chrono::seconds(c.telegram_poll_timeout_s);
    return o;
}

bool allowed(const options& o, std::string_view chat) {
    return o.allow_chats.empty() ||
           std::find(o.allow_chats.begin(), o.allow_chats.end(), chat) != o.allow_chats.end();
}

} // namespace baton::telegram
