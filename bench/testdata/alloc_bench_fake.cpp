// alloc_bench_fake.cpp — bench/alloc_bench.cu compiled as host C++ (it has no
// kernels) against the test suite's fake shared cudart and
// fake_cudart_extra.c, for the test bench_harness_fake_driver: the harness,
// the floor's hooks and cachalloc's stats dump exercised on the fake driver.
#include "../alloc_bench.cu"
