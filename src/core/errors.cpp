#include <baton/errors.hpp>

#include <boost/system/system_error.hpp>
#include <boost/throw_exception.hpp>

namespace baton {

namespace {
struct entry {
    std::string_view name;
    unsigned status;
};

entry lookup(errc e) {
    switch (e) {
    case errc::invalid_json:
        return {"invalid_json", 400};
    case errc::invalid_request:
        return {"invalid_request", 400};
    case errc::unauthorized:
        return {"unauthorized", 401};
    case errc::not_found:
        return {"not_found", 404};
    case errc::method_not_allowed:
        return {"method_not_allowed", 405};
    case errc::idempotency_key_reused:
        return {"idempotency_key_reused", 409};
    case errc::turn_not_running:
        return {"turn_not_running", 409};
    case errc::session_busy:
        return {"session_busy", 409};
    case errc::payload_too_large:
        return {"payload_too_large", 413};
    case errc::unsupported_media_type:
        return {"unsupported_media_type", 415};
    case errc::session_queue_full:
        return {"session_queue_full", 429};
    case errc::overloaded:
        return {"overloaded", 429};
    case errc::draining:
        return {"draining", 503};
    case errc::request_timeout:
        return {"request_timeout", 408};
    case errc::internal_error:
        return {"internal_error", 500};
    case errc::invalid_config:
        return {"invalid_config", 500};
    case errc::headers_too_large:
        return {"invalid_request", 431};
    case errc::upgrade_required:
        return {"invalid_request", 426};
    case errc::websocket_full:
        return {"overloaded", 503};
    case errc::forbidden:
        return {"forbidden", 403};
    case errc::rate_limited:
        return {"rate_limited", 429};
    case errc::quota_exceeded:
        return {"quota_exceeded", 429};
    case errc::too_many_connections:
        return {"overloaded", 503};
    case errc::store_unavailable:
        return {"store_unavailable", 503};
    }
    return {"internal_error", 500};
}

class category final : public boost::system::error_category {
public:
    const char* name() const noexcept override { return "baton"; }
    std::string message(int ev) const override {
        return std::string(lookup(static_cast<errc>(ev)).name);
    }
};
} // namespace

const boost::system::error_category& baton_category() noexcept {
    static const category c;
    return c;
}

boost::system::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), baton_category()};
}

void throw_exception_from_error(const api_error& e, const boost::source_location& loc) {
    boost::throw_exception(boost::system::system_error(make_error_code(e.code), e.message), loc);
}

std::string_view code_name(errc e) {
    return lookup(e).name;
}
unsigned http_status(errc e) {
    return lookup(e).status;
}

std::int64_t retry_after(const api_error& e) {
    if (e.retry_after_s > 0) return e.retry_after_s;
    switch (e.code) {
    case errc::session_queue_full:
    case errc::overloaded:
    case errc::websocket_full:
    case errc::rate_limited:
    case errc::quota_exceeded:
    case errc::store_unavailable:
        return 1;
    default:
        return 0;
    }
}

} // namespace baton
