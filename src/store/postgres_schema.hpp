// The PostgreSQL store's schema: versioned migrations, each a list of statements run in one
// transaction, recorded in baton_schema.
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace baton::detail {

// Migration v (1-based) is postgres_migrations()[v - 1].
std::span<const std::vector<std::string_view>> postgres_migrations();

} // namespace baton::detail
