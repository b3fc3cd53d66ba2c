// The places a bearer token arrives: the Authorization header and the WebSocket subprotocol
// offer, then the authenticator that looks the token up. Any bytes in; what comes out must be a
// piece of the input, and a made token must always be found.
#include <baton/auth.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace {
bool inside(std::string_view part, std::string_view whole) {
    return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

const baton::authenticator& tokens() {
    static const baton::authenticator a({{baton::sha256_hex("bt_known"), "acme", {"tenant"}}});
    return a;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    if (auto t = baton::parse_bearer(in)) {
        if (t->empty() || !inside(*t, in)) std::abort();
        if (t->find(' ') != std::string_view::npos) std::abort();
        auto who = tokens().authenticate(*t);
        if (who && *t != "bt_known") std::abort();
    }
    auto offer = baton::parse_ws_protocols(in);
    if (offer.token) {
        if (offer.token->empty() || !inside(*offer.token, in)) std::abort();
        if (offer.token->find_first_of(" ,\t") != std::string_view::npos) std::abort();
        (void)tokens().authenticate(*offer.token);
    }
    if (!tokens().authenticate("bt_known")) std::abort();
    return 0;
}
