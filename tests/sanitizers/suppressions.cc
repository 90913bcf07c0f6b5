// Sanitizer suppressions, compiled into every binary of the asan and tsan
// configurations (.bazelrc links this library through --custom_malloc, the
// one hook Bazel has for a library every binary links).
//
// Only what lies inside libraries we do not build with the sanitizer is
// suppressed; each entry says why.

extern "C" {

const char* __lsan_default_suppressions() {
  return
      // libtorch keeps process-lifetime singletons (operator registry, thread
      // pools, the TorchScript compilation unit) that it never frees.
      "leak:libtorch_cpu.so\n"
      "leak:libc10.so\n"
      // AOTInductor's compiled model libraries are dlopen'ed and hold their
      // constants until process exit.
      "leak:aotinductor\n"
      // gRPC's and protobuf's process-wide state (the completion-queue
      // executor, descriptor pools) lives until exit by design.
      "leak:libgrpc.so\n"
      "leak:libgrpc++.so\n"
      "leak:libprotobuf.so\n";
}

const char* __tsan_default_suppressions() {
  return
      // libtorch is not built with ThreadSanitizer: its intra-op thread pool
      // and lazily initialised globals synchronise through code TSan cannot
      // see, so every access inside it looks unsynchronised.
      "race:libtorch_cpu.so\n"
      "race:libc10.so\n"
      "race:libgomp.so\n"
      "called_from_lib:libtorch_cpu.so\n"
      // libtorch's operator registry takes a lock in uninstrumented code and
      // releases it in a deregistration callback inlined into our binary (at
      // exit), and libtorch_cuda's static initialisers do the same at load:
      // TSan sees an unlock without the lock.
      "mutex:c10::RegistrationHandleRAII\n"
      "mutex:libtorch_cuda.so\n"
      // The same at exit for libtorch_python, which the embedded interpreter
      // of Python eager programs loads (import torch): its TORCH_LIBRARY
      // registrations are torn down after the registry's lock is gone.
      "mutex:libtorch_python.so\n"
      // Debian's gRPC is not instrumented either; its internal
      // synchronisation (atomics in absl/gpr) is invisible to TSan.
      "race:libgrpc.so\n"
      "race:libgrpc++.so\n"
      "race:libgpr.so\n"
      "called_from_lib:libgrpc.so\n"
      // And no race checks at all on what libgrpc++ frees (shared_ptrs it
      // releases on gRPC's executor threads), not only no reports: to match
      // a report against the entries above TSan symbolizes it, which takes
      // the dynamic loader's lock while holding its own, and a dlclose on
      // another thread (an AOTInductor model unloaded) frees memory holding
      // the loader's lock: each waits for the other for ever
      // (tests/server_batching_test, once, stacks by stacks_on_hang.sh;
      // dlclose below takes away the other side of that deadlock).
      "called_from_lib:libgrpc++.so\n"
      // µpb, the message library inside Debian's gRPC (its TLS and channel
      // configuration): a channel freed on our thread while a gRPC thread
      // still copies from it, ordered by gRPC's invisible synchronisation.
      "race:libupb.so\n"
      // The same invisible synchronisation hands a request's bytes from the
      // gRPC thread that received them to the one that takes the completion;
      // grpcpp's reader of those bytes is inlined into our binaries, so the
      // library entries above do not cover it.
      "race:grpc::ProtoBufferReader::Next\n"
      // And a call's status (its message, allocated on a gRPC thread) to the
      // client thread that plucks the completion and frees it in grpcpp's
      // inlined CallOpClientRecvStatus (reported since the build uses clang).
      "race:grpc::internal::CallOpClientRecvStatus::FinishOp\n"
      // Debian's abseil is not instrumented: gRPC's use of absl::Mutex (and
      // its deadlock-detection graph) synchronises invisibly to TSan. Our own
      // code uses std::mutex for that reason (base/notification.h).
      "race:libabsl_\n"
      // Nor are Debian's OpenSSL libraries, which gRPC's TLS uses from its
      // own threads.
      "race:libcrypto.so\n"
      "race:libssl.so\n"
      // gRPC's threads release shared_ptrs through libstdc++'s out-of-line
      // _M_release_last_use_cold, which the dynamic loader binds to the copy
      // libspdlog exports: the free of what our thread allocated before
      // handing it to gRPC, ordered by gRPC's invisible synchronisation
      // (tests/server_repository_test, once). A race entry, not
      // called_from_lib: that would also hide libspdlog's own mutexes from
      // TSan, which then reports two threads writing one log sink.
      "race:libspdlog.so\n"
      // Nor is Debian's cpp-httplib (the HTTP client of the C++ tests), whose
      // synchronisation is compiled into the library (seen when it served the
      // endpoint: both stacks wholly inside the library).
      "race:libcpp-httplib.so\n";
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
// Under ThreadSanitizer no library is ever unloaded: dlclose does nothing.
// A race report is matched against the suppressions above by symbolizing
// it, which takes the dynamic loader's lock while holding TSan's own; a
// dlclose (an AOTInductor model unloaded by a test's thread) holds the
// loader's lock while the library's destructors free memory, which waits
// for TSan's. Each waits for the other for ever (server_batching_test and
// server_repository_test, rarely, stacks by stacks_on_hang.sh, with the
// racing free reached from a different library each time, so no
// called_from_lib entry covers them all). Defined here, in the
// executable, it takes the place of TSan's own interceptor, which is a
// weak symbol, for every library that calls dlclose. What stays loaded is
// a few MiB per model for the length of one test.
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
#endif
#endif

}  // extern "C"
