// Bearer tokens (docs/api.md "Security"): the tokens of server.tokens, kept as SHA-256 digests and
// matched in constant time, and the parsers of the two places a token arrives in (the
// Authorization header; a WebSocket subprotocol, which is all a browser can set). Channels that
// authenticate their callers use these; the runtime then scopes every call by the caller's tenant.
#pragma once

#include <baton/config.hpp>
#include <baton/types.hpp>

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// Who a request comes from once its token matched. With no tokens configured every caller is the
// default tenant with both scopes (the daemon of a trusted network).
struct caller {
    std::string tenant{default_tenant};
    bool tenant_scope = true; // its own sessions, turns, events, tape, cancel, usage
    bool admin = false;       // the outbox listing, /metrics
};

class authenticator {
public:
    authenticator() = default; // no tokens: authentication is off
    explicit authenticator(const std::vector<token_config>& tokens);

    bool enabled() const { return !entries_.empty(); }
    // The caller a presented token stands for; nullopt when it is none of the configured ones.
    // The token is hashed and its digest compared with every configured digest in constant
    // time, without an early exit: how long this takes says nothing about what matched.
    std::optional<caller> authenticate(std::string_view token) const;

private:
    struct entry {
        std::array<unsigned char, 32> digest{};
        caller who;
    };
    std::vector<entry> entries_;
};

// The token of an Authorization header value "Bearer <token>" (the scheme in any case, RFC 6750
// b64token characters); nullopt for another scheme, an empty or malformed token.
std::optional<std::string_view> parse_bearer(std::string_view authorization);

// A WebSocket upgrade's Sec-WebSocket-Protocol offer (comma-separated). The web page offers
// "baton.v1, bearer.<token>"; the server answers "baton.v1" and never echoes the token.
struct ws_protocol_offer {
    std::optional<std::string_view> token; // the <token> of a "bearer.<token>" entry
    bool baton_v1 = false;                 // "baton.v1" was offered
    bool malformed = false;                // an entry that is not a token (RFC 7230 tchar)
};
ws_protocol_offer parse_ws_protocols(std::string_view header);

// A fresh bearer token: "bt_" and 43 characters of base64url, 32 random bytes from OpenSSL's
// generator. Throws std::runtime_error when the generator fails.
std::string make_token();

} // namespace baton
