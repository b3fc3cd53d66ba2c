#include "src/core/tenant_quotas.hpp"

#include <algorithm>

namespace baton::detail {

tenant_quotas::tenant_quotas(std::map<std::string, tenant_limits> limits, std::shared_ptr<baton::clock> clk)
    : limits_(std::move(limits)), clk_(clk ? std::move(clk) : system_clock()) {
    for (const auto& [name, l] : limits_)
        tenants_[name]; // listed in the metrics from the start
}

const tenant_limits& tenant_quotas::limits(const std::string& tenant) const {
    static const tenant_limits none;
    auto it = limits_.find(tenant);
    return it == limits_.end() ? none : it->second;
}

tenant_quotas::state& tenant_quotas::of(const std::string& tenant) {
    return tenants_[tenant];
}

void tenant_quotas::roll(state& s, std::int64_t today) {
    if (s.day == today) return;
    if (s.day < today) {
        s.day = today;
        s.turns_today = 0;
        s.tokens_today = 0;
    }
}

std::optional<api_error> tenant_quotas::admit(const std::string& tenant) {
    // A tenant without a rate or a budget (most, and every one without tenants config) takes no lock.
    const auto& fixed = limits(tenant);
    if (fixed.turns_per_minute <= 0 && fixed.tokens_per_day <= 0) return std::nullopt;
    std::lock_guard lock(mutex_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return std::nullopt;
    auto& s = it->second;
    const auto& l = fixed;
    if (l.tokens_per_day > 0) {
        auto utc = clk_->utc_ms();
        if (spent(s, l, utc)) {
            ++s.quota_exceeded;
            auto to_midnight = (utc_day(utc) + 1) * ms_per_day - utc;
            api_error e{errc::quota_exceeded, "tenant " + tenant + " has used its " +
                                                  std::to_string(l.tokens_per_day) +
                                                  " model tokens for today (UTC)"};
            e.retry_after_s = std::max<std::int64_t>(1, (to_midnight + 999) / 1000);
            return e;
        }
    }
    if (l.turns_per_minute > 0) {
        // GCRA: a bucket of turns_per_minute messages, refilled at turns_per_minute a minute.
        using namespace std::chrono;
        const auto interval = duration_cast<clock::duration>(minutes(1)) / l.turns_per_minute;
        const auto tolerance = interval * (l.turns_per_minute - 1);
        auto now = clk_->now();
        auto tat = s.tat_set ? std::max(s.tat, now) : now;
        if (tat - now > tolerance) {
            ++s.rate_limited;
            auto wait = duration_cast<milliseconds>(tat - now - tolerance).count();
            api_error e{errc::rate_limited, "tenant " + tenant + " is over its " +
                                                std::to_string(l.turns_per_minute) +
                                                " messages a minute"};
            e.retry_after_s = std::max<std::int64_t>(1, (wait + 999) / 1000);
            return e;
        }
        s.tat = tat + interval;
        s.tat_set = true;
    }
    return std::nullopt;
}

bool tenant_quotas::tokens_spent(const std::string& tenant) {
    const auto& l = limits(tenant);
    if (l.tokens_per_day <= 0) return false;
    std::lock_guard lock(mutex_);
    auto it = tenants_.find(tenant);
    return it != tenants_.end() && spent(it->second, l, clk_->utc_ms());
}

bool tenant_quotas::spent(state& s, const tenant_limits& l, time_ms utc) {
    roll(s, utc_day(utc));
    return l.tokens_per_day > 0 && s.tokens_today >= l.tokens_per_day;
}

void tenant_quotas::add_usage(const std::string& tenant, time_ms at, const baton::usage& u) {
    std::lock_guard lock(mutex_);
    auto& s = of(tenant);
    auto day = utc_day(at);
    roll(s, day);
    if (s.day != day) return; // a turn of an earlier day, counted late: not today's
    s.turns_today += 1;
    s.tokens_today += u.prompt_tokens + u.completion_tokens;
}

void tenant_quotas::restore_usage(const std::string& tenant, std::int64_t day, std::int64_t turns,
                                  std::int64_t tokens) {
    std::lock_guard lock(mutex_);
    auto& s = of(tenant);
    roll(s, day);
    if (s.day != day) return;
    s.turns_today += turns;
    s.tokens_today += tokens;
}

bool tenant_quotas::acquire(const std::string& tenant, const std::shared_ptr<session_actor>& a) {
    if (!limited_concurrency(tenant)) return true;
    std::lock_guard lock(mutex_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return true;
    auto& s = it->second;
    if (s.running < limits(tenant).max_running_turns && s.waiting.empty()) {
        ++s.running;
        return true;
    }
    s.waiting.push_back(a);
    return false;
}

std::shared_ptr<session_actor> tenant_quotas::release(const std::string& tenant) {
    if (!limited_concurrency(tenant)) return nullptr;
    std::lock_guard lock(mutex_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return nullptr;
    auto& s = it->second;
    if (!s.waiting.empty()) {
        // The slot goes to the session that waited longest: `running` stays as it is.
        auto next = std::move(s.waiting.front());
        s.waiting.erase(s.waiting.begin());
        return next;
    }
    if (s.running > 0) --s.running;
    return nullptr;
}

std::vector<tenant_quotas::stats> tenant_quotas::snapshot() const {
    std::lock_guard lock(mutex_);
    std::vector<stats> out;
    auto today = utc_day(clk_->utc_ms());
    for (const auto& [name, s] : tenants_) {
        stats st;
        st.tenant = name;
        st.running = s.running;
        st.waiting = static_cast<std::int64_t>(s.waiting.size());
        if (s.day == today) {
            st.turns_today = s.turns_today;
            st.tokens_today = s.tokens_today;
        }
        st.rate_limited = s.rate_limited;
        st.quota_exceeded = s.quota_exceeded;
        out.push_back(std::move(st));
    }
    std::sort(out.begin(), out.end(), [](const stats& a, const stats& b) { return a.tenant < b.tenant; });
    return out;
}

} // namespace baton::detail
