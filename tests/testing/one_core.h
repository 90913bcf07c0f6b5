// Pins the calling thread, and what it starts afterwards (threads, child
// processes), to one core: how a test checks that thread counts follow
// the affinity rather than the machine.
#ifndef PRECOMPILE_TESTS_TESTING_ONE_CORE_H_
#define PRECOMPILE_TESTS_TESTING_ONE_CORE_H_

#include <sched.h>

namespace precompile::testing {

// The first core of this thread's affinity becomes its only one; false if
// the affinity could not be read or set. Other threads keep theirs.
inline bool PinThisThreadToOneCore() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return false;
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) ++first;
  if (first == CPU_SETSIZE) return false;
  CPU_ZERO(&set);
  CPU_SET(first, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_ONE_CORE_H_
