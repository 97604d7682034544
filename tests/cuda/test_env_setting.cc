// The environment knobs' reader (cuda/env_setting.h): a listed value comes back, unset or empty is
// empty, anything else is an error that names the choices; env_switch takes 1 and 0 only.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "cuda/env_setting.h"
#include "cuda/launch.h"

namespace nibble {
namespace {

constexpr const char* kName = "NIBBLE_TEST_ENV_SETTING";

std::string error_of(const std::string& value) {
  setenv(kName, value.c_str(), 1);
  try {
    cuda::env_choice(kName, {"cluster", "kernel"});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EnvSetting, ChoicesAndErrors) {
  unsetenv(kName);
  EXPECT_EQ(cuda::env_choice(kName, {"cluster", "kernel"}), "");
  setenv(kName, "", 1);
  EXPECT_EQ(cuda::env_choice(kName, {"cluster", "kernel"}), "");
  setenv(kName, "kernel", 1);
  EXPECT_EQ(cuda::env_choice(kName, {"cluster", "kernel"}), "kernel");
  EXPECT_EQ(error_of("Kernel"), "NIBBLE_TEST_ENV_SETTING must be one of cluster, kernel, not Kernel");
  EXPECT_EQ(error_of("kernel2"), "NIBBLE_TEST_ENV_SETTING must be one of cluster, kernel, not kernel2");
  unsetenv(kName);
}

TEST(EnvSetting, Switch) {
  unsetenv(kName);
  EXPECT_FALSE(cuda::env_switch(kName));
  setenv(kName, "1", 1);
  EXPECT_TRUE(cuda::env_switch(kName));
  setenv(kName, "0", 1);
  EXPECT_FALSE(cuda::env_switch(kName));
  setenv(kName, "yes", 1);
  EXPECT_THROW(cuda::env_switch(kName), Error);
  unsetenv(kName);
}

// NIBBLE_TRIGGER_FIRST's sites (launch.h): comma-separated names or all, empty names skipped, anything
// else an error naming the choices.
TEST(EnvSetting, TriggerFirstSites) {
  EXPECT_EQ(cuda::parse_trigger_sites(""), 0u);
  EXPECT_EQ(cuda::parse_trigger_sites("norm"), unsigned{cuda::kTriggerNorm});
  EXPECT_EQ(cuda::parse_trigger_sites("gemv,attention"), unsigned{cuda::kTriggerGemv | cuda::kTriggerAttention});
  EXPECT_EQ(cuda::parse_trigger_sites("combine,,norm,"), unsigned{cuda::kTriggerCombine | cuda::kTriggerNorm});
  EXPECT_EQ(cuda::parse_trigger_sites("all"), unsigned{cuda::kTriggerNorm | cuda::kTriggerGemv |
                                                        cuda::kTriggerAttention | cuda::kTriggerCombine});
  try {
    cuda::parse_trigger_sites("norm,rope");
    ADD_FAILURE() << "rope was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "NIBBLE_TRIGGER_FIRST lists norm, gemv, attention, combine or all, not rope");
  }
}

}  // namespace
}  // namespace nibble
