// Numeric tuning variables: unset means the fallback, a listed value is taken,
// anything else fails with a message naming the variable and what it takes.
#include <gtest/gtest.h>

#include <string>

#include "common/env.h"
#include "common/error.h"
#include "testutil.h"

namespace qinfer {
namespace {

constexpr const char* kVar = "QINFER_ENV_TEST_VALUE";

void set_env(const char* value) {
    if (value) test::set_env(kVar, value);
    else test::unset_env(kVar);
}

// The message of the Error that f throws ("" when it does not throw).
template <class F> std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Env, UnsetOrEmptyGivesTheFallback) {
    set_env(nullptr);
    EXPECT_EQ(env_int(kVar, 1, 1024, 64), 64);
    EXPECT_EQ(env_int_of(kVar, {1, 2, 4, 8}, 0), 0);
    set_env("");
    EXPECT_EQ(env_int(kVar, 1, 1024, 64), 64);
    EXPECT_EQ(env_int_of(kVar, {1, 2, 4, 8}, 0), 0);
}

TEST(Env, TakesValuesInRangeOrList) {
    set_env("4");
    EXPECT_EQ(env_int(kVar, 1, 1024, 64), 4);
    EXPECT_EQ(env_int_of(kVar, {1, 2, 4, 8}, 0), 4);
    set_env("1024");
    EXPECT_EQ(env_int(kVar, 1, 1024, 64), 1024);
    set_env(nullptr);
}

TEST(Env, RejectsOtherValuesNamingTheVariable) {
    for (const char* bad : {"3", "0", "-2", "4x", "four", "4 ", "99999999999"}) {
        SCOPED_TRACE(bad);
        set_env(bad);
        const std::string e = error_of([] { env_int_of(kVar, {1, 2, 4, 8}, 0); });
        EXPECT_NE(e.find(kVar), std::string::npos) << e;
        EXPECT_NE(e.find("one of 1 2 4 8"), std::string::npos) << e;
    }
    for (const char* bad : {"0", "1025", "1.5", "x"}) {
        SCOPED_TRACE(bad);
        set_env(bad);
        const std::string e = error_of([] { env_int(kVar, 1, 1024, 64); });
        EXPECT_NE(e.find("an integer from 1 to 1024"), std::string::npos) << e;
    }
    set_env(nullptr);
}

TEST(Env, IsMatchesTheWholeValue) {
    set_env(nullptr);
    EXPECT_FALSE(env_is(kVar, "1"));
    set_env("1");
    EXPECT_TRUE(env_is(kVar, "1"));
    EXPECT_FALSE(env_is(kVar, "0"));
    set_env("10");
    EXPECT_FALSE(env_is(kVar, "1"));
    set_env(nullptr);
}

}  // namespace
}  // namespace qinfer
