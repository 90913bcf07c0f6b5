#include "base/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace precompile {
namespace {

// Where a cgroup hierarchy is mounted: the cgroup its mount shows (`root`,
// "/" unless the mount is of a subtree) at `point`.
struct CgroupMount {
  std::string root;
  std::string point;
};

// The mount of cgroup v2 (`version` 2) or of v1's cpu controller (1).
std::optional<CgroupMount> FindMount(absl::string_view mountinfo, int version) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    // "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const absl::string_view type = dash[1];
    bool wanted = version == 2 && type == "cgroup2";
    if (version == 1 && type == "cgroup") {
      for (absl::string_view option : absl::StrSplit(dash[3], ',')) wanted |= option == "cpu";
    }
    if (wanted) return CgroupMount{std::string(fields[3]), std::string(fields[4])};
  }
  return std::nullopt;
}

// The process's cgroup in hierarchy v2 (`version` 2) or in v1's cpu
// controller's (1), from /proc/self/cgroup's "ID:CONTROLLERS:PATH" lines.
std::optional<std::string> FindCgroup(absl::string_view proc_cgroup, int version) {
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    bool wanted = version == 2 && fields[0] == "0" && fields[1].empty();
    if (version == 1) {
      for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
        wanted |= controller == "cpu";
      }
    }
    if (wanted) return std::string(fields[2]);
  }
  return std::nullopt;
}

// One cgroup directory's quota in cores, if it sets one.
std::optional<double> QuotaIn(const std::string& directory, int version,
                              const CgroupFileReader& read_file) {
  double quota = 0, period = 0;
  if (version == 2) {
    // "max 100000" (no quota) or "QUOTA PERIOD", in microseconds.
    std::optional<std::string> max = read_file(directory + "/cpu.max");
    if (!max) return std::nullopt;
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(*max), ' ', absl::SkipEmpty());
    if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &quota) ||
        !absl::SimpleAtod(fields[1], &period)) {
      return std::nullopt;
    }
  } else {
    std::optional<std::string> q = read_file(directory + "/cpu.cfs_quota_us");
    std::optional<std::string> p = read_file(directory + "/cpu.cfs_period_us");
    if (!q || !p || !absl::SimpleAtod(absl::StripAsciiWhitespace(*q), &quota) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(*p), &period)) {
      return std::nullopt;
    }
  }
  if (quota <= 0 || period <= 0) return std::nullopt;  // v1's -1: no quota.
  return quota / period;
}

std::optional<double> QuotaInHierarchy(absl::string_view proc_cgroup, absl::string_view mountinfo,
                                       int version, const CgroupFileReader& read_file) {
  std::optional<CgroupMount> mount = FindMount(mountinfo, version);
  std::optional<std::string> cgroup = FindCgroup(proc_cgroup, version);
  if (!mount || !cgroup) return std::nullopt;
  // The cgroup's path below the mount. A cgroup outside the mounted subtree
  // (a container without its own cgroup namespace sees the host's path) is
  // looked for whole below the mount; where it is not there, its ancestors
  // up to the mount still are, and the mount itself is the container's.
  absl::string_view relative = *cgroup;
  if (mount->root != "/") {
    absl::string_view root = mount->root;
    if (absl::ConsumePrefix(&relative, root) && !relative.empty() && relative[0] != '/') {
      relative = *cgroup;  // "/a/bc" is not below "/a/b".
    }
  }
  std::string path(absl::StripSuffix(relative, "/"));
  if (!path.empty() && path[0] != '/') path.insert(0, "/");
  std::optional<double> smallest;
  while (true) {
    if (std::optional<double> quota = QuotaIn(mount->point + path, version, read_file)) {
      smallest = smallest ? std::min(*smallest, *quota) : *quota;
    }
    if (path.empty()) break;
    path.resize(path.rfind('/'));
  }
  return smallest;
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::optional<double> CgroupCpuQuotaCores(absl::string_view proc_cgroup,
                                          absl::string_view mountinfo,
                                          const CgroupFileReader& read_file) {
  std::optional<double> v1 = QuotaInHierarchy(proc_cgroup, mountinfo, 1, read_file);
  std::optional<double> v2 = QuotaInHierarchy(proc_cgroup, mountinfo, 2, read_file);
  if (v1 && v2) return std::min(*v1, *v2);
  return v1 ? v1 : v2;
}

int UsableCores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  std::optional<double> quota =
      CgroupCpuQuotaCores(ReadFile("/proc/self/cgroup").value_or(""),
                          ReadFile("/proc/self/mountinfo").value_or(""), ReadFile);
  if (quota) cores = std::min(cores, static_cast<int>(std::ceil(*quota)));
  return std::max(1, cores);
}

}  // namespace precompile
