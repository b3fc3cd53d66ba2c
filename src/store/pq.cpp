#include "src/store/pq.hpp"

#include <dlfcn.h>

#include <stdexcept>

namespace baton::detail {
namespace {

pq_api load() {
    void* lib = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        throw std::runtime_error(std::string("postgres: cannot load libpq.so.5 (Debian: libpq5): ") +
                                 dlerror());
    pq_api api;
#define BATON_PQ_LOAD(name)                                                                             \
    api.name = reinterpret_cast<decltype(api.name)>(dlsym(lib, #name));                                 \
    if (!api.name)                                                                                      \
        throw std::runtime_error("postgres: libpq.so.5 has no " #name " (libpq 14 or later is "         \
                                                                      "needed)");
    BATON_PQ_FUNCTIONS(BATON_PQ_LOAD)
#undef BATON_PQ_LOAD
    return api;
}

} // namespace

const pq_api& pq() {
    static const pq_api api = load();
    return api;
}

} // namespace baton::detail
