#include "src/model/sse.hpp"

#include <limits>

namespace baton {

namespace {

constexpr std::string_view utf8_bom = "\xEF\xBB\xBF";

// The spec accepts only ASCII digits; a value too large for int64 is ignored like any other
// invalid value rather than wrapped.
std::optional<std::int64_t> parse_retry(std::string_view v) {
    if (v.empty()) return std::nullopt;
    std::int64_t n = 0;
    for (char c : v) {
        if (c < '0' || c > '9') return std::nullopt;
        int d = c - '0';
        if (n > (std::numeric_limits<std::int64_t>::max() - d) / 10) return std::nullopt;
        n = n * 10 + d;
    }
    return n;
}

} // namespace

sse_parser::sse_parser(std::size_t max_size) : max_size_(max_size) {}

bool sse_parser::has_partial() const {
    return !line_.empty() || !bom_buf_.empty() || in_event_;
}

std::vector<sse_event> sse_parser::finish() {
    std::vector<sse_event> out;
    if (failed()) return out;
    if (!bom_buf_.empty()) {
        std::string held = std::move(bom_buf_);
        bom_buf_.clear();
        bom_done_ = true;
        consume(held, out);
    }
    if (!line_.empty()) {
        std::string line = std::move(line_);
        line_.clear();
        process_line(line, out);
    }
    if (in_event_) dispatch(out);
    return out;
}

void sse_parser::fail(std::string_view what) {
    error_ = std::string(what) + " exceeds " + std::to_string(max_size_) + " bytes";
    line_.clear();
    data_.clear();
    event_.clear();
    bom_buf_.clear();
}

std::vector<sse_event> sse_parser::feed(std::string_view bytes) {
    std::vector<sse_event> out;
    if (failed()) return out;
    // The BOM may itself arrive split, so hold back bytes while they could still be one.
    while (!bom_done_ && !bytes.empty()) {
        bom_buf_ += bytes.front();
        bytes.remove_prefix(1);
        if (bom_buf_ == utf8_bom) {
            bom_done_ = true;
            bom_buf_.clear();
        } else if (!utf8_bom.starts_with(bom_buf_)) {
            bom_done_ = true;
            std::string held = std::move(bom_buf_);
            bom_buf_.clear();
            consume(held, out);
        }
    }
    consume(bytes, out);
    return out;
}

void sse_parser::consume(std::string_view in, std::vector<sse_event>& out) {
    while (!in.empty() && !failed()) {
        if (after_cr_) {
            after_cr_ = false;
            if (in.front() == '\n') {
                in.remove_prefix(1);
                continue;
            }
        }
        // Two memchr scans (find_first_of tries both characters byte by byte).
        auto end = in.find('\n');
        if (auto cr = in.substr(0, end).find('\r'); cr != std::string_view::npos) end = cr;
        auto piece = in.substr(0, end);
        if (line_.size() + piece.size() > max_size_) return fail("sse line");
        if (end == std::string_view::npos) {
            line_.append(piece);
            return;
        }
        after_cr_ = in[end] == '\r';
        in.remove_prefix(end + 1);
        // Most lines arrive whole: parse them straight from the input without copying.
        if (line_.empty()) {
            process_line(piece, out);
        } else {
            line_.append(piece);
            process_line(line_, out);
            line_.clear();
        }
    }
}

void sse_parser::process_line(std::string_view line, std::vector<sse_event>& out) {
    if (line.empty()) return dispatch(out);
    if (line.front() == ':') {
        ++comments_;
        return;
    }
    auto colon = line.find(':');
    std::string_view name = line.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
        value = line.substr(colon + 1);
        if (value.starts_with(' ')) value.remove_prefix(1);
    }
    in_event_ = true;
    process_field(name, value);
    if (data_.size() + event_.size() > max_size_) fail("sse event");
}

void sse_parser::process_field(std::string_view name, std::string_view value) {
    if (name == "data") {
        data_.append(value);
        data_ += '\n';
    } else if (name == "event") {
        event_.assign(value);
    } else if (name == "id") {
        // A NUL would make the ID unusable in a Last-Event-ID header; the spec ignores the field.
        if (value.find('\0') == std::string_view::npos) last_id_.assign(value);
    } else if (name == "retry") {
        if (auto ms = parse_retry(value)) event_retry_ = retry_ = ms;
    }
    // Other field names are ignored, as the spec requires.
}

void sse_parser::dispatch(std::vector<sse_event>& out) {
    in_event_ = false;
    // A block without data (only "event:", "id:" or "retry:") is not an event.
    if (!data_.empty()) {
        data_.pop_back(); // the "\n" after the last data line
        sse_event ev;
        if (!event_.empty()) ev.event = std::move(event_);
        ev.data = std::move(data_);
        ev.id = last_id_;
        ev.retry = event_retry_;
        out.push_back(std::move(ev));
    }
    data_.clear();
    event_.clear();
    event_retry_.reset();
}

} // namespace baton
