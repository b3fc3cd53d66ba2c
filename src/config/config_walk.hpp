// Helpers for the strict config parser (src/config.cpp): JSON paths, a strict JSON front end
// (line/column on syntax errors, duplicate keys reported) and readers that record every problem.
#pragma once

#include <baton/config.hpp>
#include <baton/json_text.hpp>

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail {

using config_errors = std::vector<config_error>;

// The longest duration a config takes (`*_ms`): ten years.
inline constexpr std::int64_t max_duration_ms = 315'360'000'000;

// Parses JSON text; syntax errors (with line and column) and duplicate keys go to `errors`.
// Returns null when the text is not valid JSON.
boost::json::value parse_json_strict(std::string_view text, config_errors& errors);

// Scalar readers for a value at `path`: false (and an error recorded) on a wrong type or range.
bool read_string(config_errors& errors, const boost::json::value& v, const std::string& path,
                 std::string& out);
bool read_bool(config_errors& errors, const boost::json::value& v, const std::string& path, bool& out);
bool read_int(config_errors& errors, const boost::json::value& v, const std::string& path,
              std::int64_t& out, std::int64_t min,
              std::int64_t max = std::numeric_limits<std::int64_t>::max());
bool read_number(config_errors& errors, const boost::json::value& v, const std::string& path,
                 double& out);
const boost::json::object* as_object(config_errors& errors, const boost::json::value& v,
                                     const std::string& path);
const boost::json::array* as_array(config_errors& errors, const boost::json::value& v,
                                   const std::string& path);

// Reads one JSON object against a fixed set of keys. Construction reports `expected object` or
// each unknown key; the read functions leave `out` untouched when the key is absent or invalid.
class object_reader {
public:
    object_reader(config_errors& errors, const boost::json::value& v, std::string path,
                  std::initializer_list<std::string_view> keys);

    explicit operator bool() const { return obj_ != nullptr; }
    const std::string& path() const { return path_; }
    std::string path(std::string_view key) const { return json_child_path(path_, key); }
    config_errors& errors() const { return errors_; }

    const boost::json::value* find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }
    // Records an error at `path.key` (or at the object itself when key is empty).
    void fail(std::string_view key, std::string message) const;
    // Records `required` when the key is absent; returns whether it is present.
    bool require(std::string_view key) const;

    bool read(std::string_view key, std::string& out) const;
    // A string that must not be empty.
    bool read_text(std::string_view key, std::string& out) const;
    bool read(std::string_view key, bool& out) const;
    bool read(std::string_view key, std::int64_t& out, std::int64_t min,
              std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
    // A `*_ms` key: a whole number of milliseconds, at least `min` (1 unless 0 means "off").
    bool read(std::string_view key, std::chrono::milliseconds& out, std::int64_t min = 1) const;
    bool read(std::string_view key, std::vector<std::string>& out) const;
    const boost::json::object* object(std::string_view key) const;
    const boost::json::array* array(std::string_view key) const;

private:
    config_errors& errors_;
    const boost::json::object* obj_ = nullptr;
    std::string path_;
};

bool is_http_url(std::string_view s);
// True when a libpq conninfo (keywords, or a postgres:// URI) names a password: a `password`
// keyword or query parameter, or user:password@ in the URI.
bool conninfo_names_password(std::string_view conninfo);

} // namespace baton::detail
