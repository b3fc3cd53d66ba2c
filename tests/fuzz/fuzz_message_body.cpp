// POST /v1/sessions/{sid}/messages bodies: any bytes are accepted or refused with a code and a
// message naming the problem; an accepted text is valid UTF-8.
#include "channels/http/api.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    baton::accept_request out;
    auto err = baton::http::parse_message_body(in, out);
    if (err) {
        if (err->message.empty()) std::abort();
    } else if (!baton::http::valid_utf8(out.text)) {
        std::abort();
    }
    return 0;
}
