// Numeric tuning variables from the environment (A/B switches of the
// backends). Unset or empty: the fallback. Anything else must be one of the
// values the variable takes, or the call fails saying which ones they are --
// a typo must not quietly measure the default.
#pragma once
#include <initializer_list>

namespace qinfer {

// An integer in [lo, hi].
int env_int(const char* name, int lo, int hi, int fallback);
// One of `allowed`.
int env_int_of(const char* name, std::initializer_list<int> allowed, int fallback);
// Whether the variable is set to exactly `value`.
bool env_is(const char* name, const char* value);

}  // namespace qinfer
