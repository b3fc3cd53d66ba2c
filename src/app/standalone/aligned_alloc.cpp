// The daemon's aligned_alloc (linked with -Wl,--wrap=aligned_alloc, only with jemalloc; see
// CMakeLists.txt). Asio allocates every coroutine frame, handler and operation it does not recycle
// with aligned_alloc(16, n), ~75 a turn. jemalloc takes those through its aligned path, ~140
// instructions each against ~20 for malloc's thread cache. jemalloc's malloc already aligns to
// 16 bytes any size that is a multiple of 16 (Asio rounds the size up to the alignment), so such
// calls go to malloc; a larger alignment goes to jemalloc's aligned_alloc as before. Memory from
// either is released by the same free.
#include <cstddef>
#include <cstdlib>

extern "C" {
void* __real_aligned_alloc(std::size_t alignment, std::size_t size);

void* __wrap_aligned_alloc(std::size_t alignment, std::size_t size) {
    if (alignment <= alignof(std::max_align_t) && size % alignof(std::max_align_t) == 0 && size != 0)
        return std::malloc(size);
    return __real_aligned_alloc(alignment, size);
}
}
