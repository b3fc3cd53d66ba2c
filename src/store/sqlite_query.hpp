// SQLite statement helpers shared by the store's files: a statement prepared once, and one use of
// it (bind, step, read, reset) that never leaves it half-run.
#pragma once

#include <boost/json.hpp>

#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace baton::detail {

namespace json = boost::json;

[[noreturn]] inline void fail(sqlite3* db, std::string_view what) {
    throw std::runtime_error("sqlite: " + std::string(what) + ": " + sqlite3_errmsg(db));
}

class statement {
public:
    statement(sqlite3* db, const std::string& sql) : db_(db) {
        // PERSISTENT: these live as long as the connection, which SQLite can allocate for.
        if (sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                               &stmt_, nullptr) != SQLITE_OK)
            fail(db, "prepare " + sql);
    }
    statement(const statement&) = delete;
    statement& operator=(const statement&) = delete;
    ~statement() { sqlite3_finalize(stmt_); }

    sqlite3* db() const { return db_; }
    sqlite3_stmt* get() const { return stmt_; }

private:
    sqlite3* db_;
    sqlite3_stmt* stmt_ = nullptr;
};

// One use of a cached statement: binds, steps, reads columns, and resets it when done, so a thrown
// error never leaves a statement half-run (which would hold a read lock or block ROLLBACK).
class query {
public:
    explicit query(statement& s) : s_(s) {}
    query(const query&) = delete;
    query& operator=(const query&) = delete;
    ~query() {
        sqlite3_reset(s_.get());
        sqlite3_clear_bindings(s_.get());
    }

    query& bind(int i, std::int64_t v) { return check(sqlite3_bind_int64(s_.get(), i, v)); }
    // Text that outlives this query (a named string, a literal, a string_view of either) is bound
    // without a copy: SQLite reads it only while a step runs, and this query's destructor resets
    // and clears the statement before any such text can go. A temporary std::string (an rvalue)
    // may end before the step that reads it, so SQLite copies that one.
    query& bind(int i, std::string_view v) {
        return check(
            sqlite3_bind_text(s_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC));
    }
    query& bind(int i, std::string&& v) {
        return check(
            sqlite3_bind_text(s_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    }
    query& bind(int i, std::nullptr_t) { return check(sqlite3_bind_null(s_.get(), i)); }
    template <class T> query& bind(int i, const std::optional<T>& v) {
        return v ? bind(i, *v) : bind(i, nullptr);
    }
    template <class T> query& bind(int i, std::optional<T>&& v) {
        return v ? bind(i, std::move(*v)) : bind(i, nullptr);
    }

    // True while there is a row to read.
    bool step() {
        int rc = sqlite3_step(s_.get());
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        fail(s_.db(), sqlite3_sql(s_.get()));
    }
    // Runs a write and returns the number of rows it changed.
    int run() {
        while (step()) {
        }
        return sqlite3_changes(s_.db());
    }

    bool is_null(int c) const { return sqlite3_column_type(s_.get(), c) == SQLITE_NULL; }
    std::int64_t int64(int c) const { return sqlite3_column_int64(s_.get(), c); }
    std::string text(int c) const {
        auto p = reinterpret_cast<const char*>(sqlite3_column_text(s_.get(), c));
        return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s_.get(), c)))
                 : std::string();
    }
    std::optional<std::string> opt_text(int c) const {
        return is_null(c) ? std::nullopt : std::optional(text(c));
    }
    std::optional<std::int64_t> opt_int64(int c) const {
        return is_null(c) ? std::nullopt : std::optional(int64(c));
    }
    json::value json_value(int c) const {
        if (is_null(c)) return nullptr;
        std::error_code ec;
        auto v = json::parse(text(c), ec);
        if (ec) throw std::runtime_error("sqlite: corrupt JSON in column " + column_name(c));
        return v;
    }
    json::object json_object(int c) const {
        auto v = json_value(c);
        if (!v.is_object())
            throw std::runtime_error("sqlite: expected a JSON object in " + column_name(c));
        return std::move(v.as_object());
    }

private:
    query& check(int rc) {
        if (rc != SQLITE_OK) fail(s_.db(), "bind");
        return *this;
    }
    std::string column_name(int c) const { return sqlite3_column_name(s_.get(), c); }

    statement& s_;
};

inline std::int64_t sql_limit(std::size_t limit) {
    return static_cast<std::int64_t>(std::min<std::size_t>(
        limit, static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())));
}

inline void step_and_reset(statement& s) {
    sqlite3_step(s.get());
    sqlite3_reset(s.get());
}

} // namespace baton::detail
