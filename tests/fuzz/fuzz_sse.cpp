// SSE parser: any bytes, cut anywhere, give the same events as the whole input fed at once (and
// the same unfinished one at the end), and the parser never grows past its limit.
#include "src/model/sse.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    // The first two bytes choose the cuts and the size limit; the rest is the stream.
    std::size_t cut = data[0], step = std::size_t(data[1] % 7) + 1;
    std::string_view in(reinterpret_cast<const char*>(data) + 2, size - 2);
    std::size_t limit = 64 + (data[1] & 0x80 ? 4096 : 64);

    baton::sse_parser whole(limit);
    auto a = whole.feed(in);

    baton::sse_parser pieces(limit);
    std::vector<baton::sse_event> b;
    std::size_t pos = std::min(cut, in.size());
    auto first = pieces.feed(in.substr(0, pos));
    b.insert(b.end(), first.begin(), first.end());
    while (pos < in.size()) {
        auto n = std::min(step, in.size() - pos);
        auto got = pieces.feed(in.substr(pos, n));
        b.insert(b.end(), got.begin(), got.end());
        pos += n;
    }
    if (whole.failed() != pieces.failed()) std::abort();
    if (!whole.failed()) {
        if (a != b) std::abort();
        if (whole.has_partial() != pieces.has_partial()) std::abort();
        if (whole.last_event_id() != pieces.last_event_id()) std::abort();
        if (whole.retry() != pieces.retry()) std::abort();
        if (whole.comments() != pieces.comments()) std::abort();
        // The end of the stream hands over the same unfinished event, then nothing is left.
        if (whole.finish() != pieces.finish()) std::abort();
        if (whole.has_partial() || !whole.finish().empty()) std::abort();
    }
    for (auto& e : a)
        if (e.data.size() > limit) std::abort();
    return 0;
}
