#include <baton/turn_state.hpp>

namespace baton {

bool turn_state::set(std::string_view key, boost::json::value v) {
    if (reserved(key)) return false;
    data_[key] = std::move(v);
    return true;
}

bool turn_state::erase(std::string_view key) {
    if (reserved(key)) return false;
    return data_.erase(key) > 0;
}

} // namespace baton
