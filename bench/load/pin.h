// Pinning for bench-load's helper programs (floor.cpp, wake.cpp), each built on its own by run.sh.
#pragma once

#include <pthread.h>
#include <sched.h>

/// Pins the calling thread to `cpu`: whether it could.
inline bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}
