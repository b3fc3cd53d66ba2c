// Bot API answers: any status and body are sorted into ok / retry / unauthorized without a crash.
#include "channels/telegram/bot_api.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    static constexpr unsigned statuses[] = {200, 200, 200, 200, 400, 401, 403, 404, 429, 500, 502, 0};
    unsigned status = statuses[data[0] % std::size(statuses)];
    std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
    auto p = baton::telegram::parse_get_updates(status, body);
    if (p.what == baton::telegram::poll_result::kind::ok) {
        for (auto& u : p.updates)
            if (u.update_id < 0 || u.update_id >= p.next_offset) std::abort();
    }
    (void)baton::telegram::parse_send_message(status, body);
    (void)baton::telegram::is_chat_id(body);
    return 0;
}
