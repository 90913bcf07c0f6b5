// Thread pools are sized by the CPU the process may use: its affinity and
// the quota of its cgroups, as a container's CPU limit sets them.
#include "base/usable_cores.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "tests/testing/one_core.h"

namespace precompile {
namespace {

// Mount tables as a Kubernetes node shows them to a container.
constexpr char kV2Mounts[] =
    "25 30 0:22 / /proc rw,nosuid - proc proc rw\n"
    "30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n";
constexpr char kV1Mounts[] =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "33 31 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid shared:9 - cgroup cgroup "
    "rw,cpu,cpuacct\n";

struct Files {
  std::map<std::string, std::string> text;
  CgroupFileReader reader() const {
    return [this](const std::string& path) -> std::optional<std::string> {
      auto it = text.find(path);
      if (it == text.end()) return std::nullopt;
      return it->second;
    };
  }
};

TEST(CgroupCpuQuota, ACgroupV2LimitIsItsQuotaOverItsPeriod) {
  Files files{{{"/sys/fs/cgroup/cpu.max", "150000 100000\n"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/\n", kV2Mounts, files.reader()), 1.5);
  files.text["/sys/fs/cgroup/cpu.max"] = "max 100000\n";
  EXPECT_EQ(CgroupCpuQuotaCores("0::/\n", kV2Mounts, files.reader()), std::nullopt);
}

TEST(CgroupCpuQuota, AnAncestorsSmallerLimitHolds) {
  Files files{{{"/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000"},
               {"/sys/fs/cgroup/kubepods/pod1/cpu.max", "50000 100000"},
               {"/sys/fs/cgroup/kubepods/cpu.max", "400000 100000"},
               {"/sys/fs/cgroup/cpu.max", "max 100000"}}};
  // Lines of v1 hierarchies before it (a hybrid host's) are not v2's.
  EXPECT_EQ(CgroupCpuQuotaCores("1:name=systemd:/x\n0::/kubepods/pod1/c1\n", kV2Mounts,
                                files.reader()),
            0.5);
  // The leaf's own, smaller still.
  files.text["/sys/fs/cgroup/kubepods/pod1/c1/cpu.max"] = "25000 100000";
  EXPECT_EQ(CgroupCpuQuotaCores("0::/kubepods/pod1/c1\n", kV2Mounts, files.reader()), 0.25);
}

TEST(CgroupCpuQuota, ACgroupV1ControllerMountedAsASubtree) {
  // Docker on cgroup v1: the container sees its own cgroup mounted, and its
  // path relative to that mount's root.
  const char cgroup[] = "5:cpuset:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
  Files files{{{"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"}}};
  EXPECT_EQ(CgroupCpuQuotaCores(cgroup, kV1Mounts, files.reader()), 2.0);
  files.text["/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"] = "-1\n";
  EXPECT_EQ(CgroupCpuQuotaCores(cgroup, kV1Mounts, files.reader()), std::nullopt);
}

TEST(CgroupCpuQuota, ACgroupBelowASubtreeMountIsFoundBelowItsMountPoint) {
  const char mounts[] = "33 31 0:30 /kubepods/pod1 /cg - cgroup2 cgroup2 rw\n";
  Files files{{{"/cg/c1/cpu.max", "50000 100000"}, {"/cg/cpu.max", "max 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/kubepods/pod1/c1\n", mounts, files.reader()), 0.5);
}

TEST(CgroupCpuQuota, TheCpuControllersCgroupNotAnotherControllers) {
  const char mounts[] =
      "34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
      "33 31 0:30 /pod1 /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n";
  Files files{{{"/sys/fs/cgroup/cpu/c1/cpu.cfs_quota_us", "50000"},
               {"/sys/fs/cgroup/cpu/c1/cpu.cfs_period_us", "100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("5:cpuset:/elsewhere\n4:cpu:/pod1/c1\n", mounts, files.reader()),
            0.5);
}

TEST(CgroupCpuQuota, ACgroupPathTheMountDoesNotHoldFallsBackToTheMountsOwnLimit) {
  // A container without its own cgroup namespace: /proc/self/cgroup names
  // the host's path, which its mount (of its own cgroup, at root "/") lacks.
  Files files{{{"/sys/fs/cgroup/cpu.max", "100000 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/system.slice/docker-abc.scope\n", kV2Mounts, files.reader()),
            1.0);
}

TEST(CgroupCpuQuota, APathThatOnlySharesAPrefixWithTheMountRootIsNotBelowIt) {
  const char mounts[] = "33 31 0:30 /a/b /cg - cgroup2 cgroup2 rw\n";
  Files files{{{"/cg/a/bc/cpu.max", "300000 100000"}, {"/cg/cpu.max", "max 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/a/bc\n", mounts, files.reader()), 3.0);
}

TEST(CgroupCpuQuota, BothHierarchiesTheSmallerHolds) {
  const std::string mounts = std::string(kV1Mounts) +
                             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  const char cgroup[] = "4:cpu,cpuacct:/docker/abc\n0::/\n";
  Files files{{{"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "300000"},
               {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000"},
               {"/sys/fs/cgroup/unified/cpu.max", "100000 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores(cgroup, mounts, files.reader()), 1.0);
  files.text["/sys/fs/cgroup/unified/cpu.max"] = "500000 100000";
  EXPECT_EQ(CgroupCpuQuotaCores(cgroup, mounts, files.reader()), 3.0);
}

TEST(CgroupCpuQuota, NoLimitWhereTheFilesAreMissingOrUnreadable) {
  Files none;
  EXPECT_EQ(CgroupCpuQuotaCores("0::/\n", kV2Mounts, none.reader()), std::nullopt);
  EXPECT_EQ(CgroupCpuQuotaCores("", "", none.reader()), std::nullopt);
  EXPECT_EQ(CgroupCpuQuotaCores("garbage", "- - -\n1 2 3\n", none.reader()), std::nullopt);
  Files garbled{{{"/sys/fs/cgroup/cpu.max", "lots 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/\n", kV2Mounts, garbled.reader()), std::nullopt);
  Files zero_period{{{"/sys/fs/cgroup/cpu.max", "100000 0"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::/\n", kV2Mounts, zero_period.reader()), std::nullopt);
  Files relative{{{"/sys/fs/cgroup/cpu.max", "100000 100000"}}};
  EXPECT_EQ(CgroupCpuQuotaCores("0::relative\n", kV2Mounts, relative.reader()), 1.0);
}

TEST(UsableCores, TheAffinitysCoresBound) {
  int cores = 0;
  std::thread([&] {
    ASSERT_TRUE(testing::PinThisThreadToOneCore());
    cores = UsableCores();
  }).join();
  EXPECT_EQ(cores, 1);
}

// Writes `text` to a cgroup file; whether the kernel took it.
bool WriteCgroupFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return out.good();
}

TEST(UsableCores, AProcessInARealCgroupWithHalfACoresQuotaUsesOne) {
  if (UsableCores() < 2) GTEST_SKIP() << "one core: a quota of half a core changes nothing";
  // A cgroup of our own, where this machine lets us make one: cgroup v1's
  // cpu controller, or v2 with the cpu controller enabled below the root.
  const std::string name = "/usable_cores_test_" + std::to_string(getpid());
  std::string directory, quota_file, quota;
  if (mkdir(("/sys/fs/cgroup/cpu" + name).c_str(), 0755) == 0) {
    directory = "/sys/fs/cgroup/cpu" + name;
    quota_file = directory + "/cpu.cfs_quota_us";
    quota = "50000";  // Of the default period, 100000 µs.
  } else if (mkdir(("/sys/fs/cgroup" + name).c_str(), 0755) == 0) {
    directory = "/sys/fs/cgroup" + name;
    quota_file = directory + "/cpu.max";
    quota = "50000 100000";
  } else {
    GTEST_SKIP() << "no cgroup can be made here (not root, or cgroupfs read-only)";
  }
  struct Remove {
    std::string directory;
    ~Remove() { rmdir(directory.c_str()); }
  } remove{directory};
  if (!WriteCgroupFile(quota_file, quota)) GTEST_SKIP() << "cannot set " << quota_file;

  // A child moves itself into the cgroup and exits with what it counts.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!WriteCgroupFile(directory + "/cgroup.procs", std::to_string(getpid()))) _exit(100);
    _exit(UsableCores());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 100) GTEST_SKIP() << "cannot move a process into " << directory;
  EXPECT_EQ(WEXITSTATUS(status), 1) << "cores counted in a cgroup with half a core's quota";
}

}  // namespace
}  // namespace precompile
