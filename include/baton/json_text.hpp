// JSON written straight to text, for the hot paths (tape payloads, turn events, responses, model
// requests): no serializer object, no intermediate buffer. The text parses to the same value as
// json::serialize's (strings escape the same characters, integers print alike, doubles are
// printed by Boost.JSON itself).
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <string>
#include <string_view>

namespace baton {

namespace json = boost::json;

// Appends `s` as a JSON string. The text must be UTF-8 already.
void append_json_string(std::string& out, std::string_view s);
// A finite number in its shortest form that reads back the same ("0.012", "3", "1e+21"); NaN
// and infinities, which JSON cannot hold, as null.
void append_json_number(std::string& out, double d);
void append_json(std::string& out, const json::value& v);
void append_json(std::string& out, const json::object& o);
void append_json(std::string& out, const json::array& a);

std::string json_text(const json::value& v);
std::string json_text(const json::object& o);

} // namespace baton
