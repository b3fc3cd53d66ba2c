// Per-tenant limits (docs/api.md "Quotas"): the rate of accepted messages (GCRA), the model
// tokens of the UTC day, and the turns running at once. Plain bookkeeping under one mutex; the
// runtime asks at accept and around each turn, on its clock.
#pragma once

#include <baton/clock.hpp>
#include <baton/config.hpp>
#include <baton/errors.hpp>
#include <baton/types.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace baton::detail {

struct session_actor;

constexpr time_ms ms_per_day = 86'400'000;
inline std::int64_t utc_day(time_ms t) {
    return t >= 0 ? t / ms_per_day : (t - ms_per_day + 1) / ms_per_day;
}

class tenant_quotas {
public:
    tenant_quotas(std::map<std::string, tenant_limits> limits, std::shared_ptr<baton::clock> clk);

    // At accept: nullopt, or the 429 to answer (rate_limited: the tenant's turns_per_minute;
    // quota_exceeded: its tokens_per_day are spent), with its Retry-After. A message let through
    // takes its place in the rate.
    std::optional<api_error> admit(const std::string& tenant);
    // True when admit() would answer quota_exceeded now (nothing counted).
    bool tokens_spent(const std::string& tenant);

    // A turn ended: its tokens and one turn count for the tenant's day.
    void add_usage(const std::string& tenant, time_ms at, const baton::usage& u);
    // What an earlier process counted today (recovery reads it from the store).
    void restore_usage(const std::string& tenant, std::int64_t day, std::int64_t turns, std::int64_t tokens);

    // max_running_turns: true when the session may run its next turn now (a slot is taken);
    // false when the tenant is at its limit (the actor waits its turn; release() hands it a
    // slot and returns it). Tenants without the limit always get one, uncounted.
    bool acquire(const std::string& tenant, const std::shared_ptr<session_actor>& a);
    // Gives the slot back, or to the first session waiting (returned: its drain goes on).
    std::shared_ptr<session_actor> release(const std::string& tenant);

    struct stats {
        std::string tenant;
        std::int64_t running = 0;
        std::int64_t waiting = 0;        // sessions waiting for a slot
        std::int64_t turns_today = 0;
        std::int64_t tokens_today = 0;
        std::int64_t rate_limited = 0;   // messages refused, since start
        std::int64_t quota_exceeded = 0;
    };
    // Every tenant with limits or usage (metrics).
    std::vector<stats> snapshot() const;
    bool limited_concurrency(const std::string& tenant) const { return limits(tenant).max_running_turns > 0; }
    // The tenant's limits (none: all zero). Fixed at construction: read without the lock.
    const tenant_limits& limits(const std::string& tenant) const;

private:
    struct state {
        clock::time_point tat{};        // GCRA: theoretical arrival time
        bool tat_set = false;
        std::int64_t day = -1;
        std::int64_t turns_today = 0, tokens_today = 0;
        std::int64_t running = 0;
        std::vector<std::shared_ptr<session_actor>> waiting; // FIFO
        std::int64_t rate_limited = 0, quota_exceeded = 0;
    };
    state& of(const std::string& tenant);
    void roll(state& s, std::int64_t today);
    // Under mutex_: the tenant's tokens_per_day are spent at `utc` (the day rolled first).
    bool spent(state& s, const tenant_limits& l, time_ms utc);

    const std::map<std::string, tenant_limits> limits_;
    std::shared_ptr<baton::clock> clk_;
    mutable std::mutex mutex_;
    std::unordered_map<std::string, state> tenants_;
};

} // namespace baton::detail
