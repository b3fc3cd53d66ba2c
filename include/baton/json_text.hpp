// JSON written straight to text, for the hot paths (tape payloads, turn events, responses, model
// requests): no serializer object, no intermediate buffer. The text parses to the same value as
// json::serialize's (strings escape the same characters, integers print alike, doubles are
// printed by Boost.JSON itself).
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <functional>
#include <optional>
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

// JSON paths as errors name them: `parent.key`, or `parent["odd key"]` when the key is not
// [A-Za-z0-9_-]+; `parent[3]` for an array's element.
std::string json_child_path(std::string_view parent, std::string_view key);
std::string json_index_path(std::string_view parent, std::size_t index);

// Calls `found` with the path of every member whose key its object already had, in document order
// (json::parse keeps the last one silently). Reads `text` without building values; stops
// quietly at a syntax error, which json::parse reports. Returns how many it found.
std::size_t for_each_duplicate_key(std::string_view text,
                                   const std::function<void(const std::string& path)>& found);
// The first of them, if any: what a request's validation reports (`text: duplicate key`).
std::optional<std::string> first_duplicate_key(std::string_view text);

} // namespace baton
