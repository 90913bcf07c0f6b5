// gRPC's completion queue orders what a thread does before it hands a tag to
// gRPC and what the thread that gets the tag back does. That ordering lives
// in libgrpc, which is not built with ThreadSanitizer, so the services that
// run on completion queues state it here for TSan; elsewhere these are
// no-ops.
#ifndef PRECOMPILE_SERVER_GRPC_COMPLETION_QUEUE_TAGS_H_
#define PRECOMPILE_SERVER_GRPC_COMPLETION_QUEUE_TAGS_H_

#if defined(__SANITIZE_THREAD__)
#define PRECOMPILE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PRECOMPILE_TSAN 1
#endif
#endif

#ifdef PRECOMPILE_TSAN
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
#endif

namespace precompile::server {

#ifdef PRECOMPILE_TSAN
inline void HandToGrpc(void* tag) { __tsan_release(tag); }
inline void TakeFromGrpc(void* tag) { __tsan_acquire(tag); }
#else
inline void HandToGrpc(void*) {}
inline void TakeFromGrpc(void*) {}
#endif

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_COMPLETION_QUEUE_TAGS_H_
