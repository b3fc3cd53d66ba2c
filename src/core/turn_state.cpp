#include <baton/turn_state.hpp>

namespace baton {

void turn_state::materialize() const {
    pending_ = false;
    auto write = [&](binding& b, std::string_view key) {
        if (!b.source || b.written) return;
        data_[key] = boost::json::string(*b.source);
        b.written = true;
    };
    write(turn_id_, "_runtime_turn_id");
    write(session_id_, "_runtime_session_id");
}

bool turn_state::set(std::string_view key, boost::json::value v) {
    if (reserved(key)) return false;
    if (pending_) materialize();
    data_[key] = std::move(v);
    return true;
}

bool turn_state::erase(std::string_view key) {
    if (reserved(key)) return false;
    if (pending_) materialize();
    return data_.erase(key) > 0;
}

} // namespace baton
