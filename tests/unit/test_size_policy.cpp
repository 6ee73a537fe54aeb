// test_size_policy.cpp — rounding and segment sizes, with PyTorch's numbers.
#include <catch2/catch.hpp>

#include "size_policy.h"

using namespace cachalloc;

TEST_CASE("sizes round up to 512 B, with 512 B minimum") {
  Config c;
  CHECK(round_size(1, c) == 512);
  CHECK(round_size(511, c) == 512);
  CHECK(round_size(512, c) == 512);
  CHECK(round_size(513, c) == 1024);
  CHECK(round_size(1 * MiB + 1, c) == 1 * MiB + 512);
  CHECK(round_size(100'000'000, c) == 100'000'256);  // 195313 * 512
}

TEST_CASE("segment sizes: 2 MiB small, 20 MiB for 1-10 MiB, else rounded to 2 MiB") {
  CHECK(segment_size_for(512) == 2 * MiB);
  CHECK(segment_size_for(1 * MiB) == 2 * MiB);
  CHECK(segment_size_for(1 * MiB + 512) == 20 * MiB);
  CHECK(segment_size_for(10 * MiB - 512) == 20 * MiB);
  CHECK(segment_size_for(10 * MiB) == 10 * MiB);
  CHECK(segment_size_for(10 * MiB + 512) == 12 * MiB);
  CHECK(segment_size_for(64 * MiB) == 64 * MiB);
  CHECK(is_small_request(1 * MiB));
  CHECK_FALSE(is_small_request(1 * MiB + 512));
}

TEST_CASE("power-of-two intervals start at 1 MiB, 16 of them") {
  CHECK(power2_interval(512) == 0);
  CHECK(power2_interval(1 * MiB) == 0);
  CHECK(power2_interval(2 * MiB) == 1);
  CHECK(power2_interval(3 * MiB) == 1);
  CHECK(power2_interval(256 * MiB) == 8);
  CHECK(power2_interval(1024 * GiB) == kPower2Intervals - 1);
}

TEST_CASE("roundup_power2_divisions rounds to the next division of the power-of-two range") {
  Config c;
  c.roundup_power2_divisions.fill(4);
  // 1200 MiB lies in [1024, 2048) MiB whose quarters are 256 MiB -> 1280 MiB.
  CHECK(round_size(1200 * MiB, c) == 1280 * MiB);
  CHECK(round_size(1024 * MiB, c) == 1024 * MiB);  // powers of two stay
  CHECK(round_size(1025 * MiB, c) == 1280 * MiB);
  // Small sizes (<= 512 * divisions) keep the 512 B rule.
  CHECK(round_size(1500, c) == 1536);
  // 5000 B in [4096, 8192) quarters of 1024 -> 5120.
  CHECK(round_size(5000, c) == 5120);
  SECTION("a per-interval table applies only where set") {
    Config d;
    d.roundup_power2_divisions[power2_interval(300 * MiB)] = 2;  // [256, 512) MiB in halves
    CHECK(round_size(300 * MiB, d) == 384 * MiB);
    CHECK(round_size(600 * MiB + 1, d) == 600 * MiB + 512);  // interval 9 unset: plain 512 B rounding
  }
}

TEST_CASE("round_size's inline small case agrees with the general rule") {
  Config plain;
  Config divided;
  divided.roundup_power2_divisions[0] = 4;
  for (const Config* c : {&plain, &divided})
    for (std::size_t size = 1; size <= 2 * MiB + 1024; size += (size < 70'000 ? 1 : 4093))
      REQUIRE(round_size(size, *c) == round_size_general(size, *c));
  CHECK(round_size(0, plain) == round_size_general(0, plain));
  CHECK(round_size(300, divided) == round_size_general(300, divided));
}
