// How many cores' worth of CPU this process may use: what thread pools are
// sized by, so that a server in a container with a CPU limit does not start
// a thread per core of the node and then stall on the limit's throttling.
#ifndef PRECOMPILE_BASE_USABLE_CORES_H_
#define PRECOMPILE_BASE_USABLE_CORES_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace precompile {

// The fewer of the cores this process may run on (its CPU affinity:
// taskset, cpusets) and the cores' worth of time its cgroups' CPU quota
// allows, rounded up (Kubernetes' CPU limit: cgroup v2's cpu.max, v1's
// cpu.cfs_quota_us); at least 1.
int UsableCores();

// Reads a cgroup file's text; nullopt when there is none.
using CgroupFileReader = std::function<std::optional<std::string>(const std::string& path)>;

// The CPU quota in cores that applies to a process whose /proc/self/cgroup
// reads `proc_cgroup` and whose /proc/self/mountinfo reads `mountinfo`: the
// smallest quota of its cpu cgroup and every ancestor up to the mounted
// hierarchy's root, v1 and v2 alike; nullopt when none sets one.
std::optional<double> CgroupCpuQuotaCores(absl::string_view proc_cgroup,
                                          absl::string_view mountinfo,
                                          const CgroupFileReader& read_file);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_USABLE_CORES_H_
