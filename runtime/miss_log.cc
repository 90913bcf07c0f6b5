#include "runtime/miss_log.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace precompile {
namespace {

// A signature's key: per argument its kind, then what the guards read of it,
// in fixed-width native encoding. Keys are compared and decoded only by this
// process.
template <typename T>
void Put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T Take(absl::string_view& key) {
  T value;
  std::memcpy(&value, key.data(), sizeof(value));
  key.remove_prefix(sizeof(value));
  return value;
}

std::string KeyOf(absl::Span<const ArgView> args) {
  std::string key;
  for (const ArgView& a : args) {
    Put(key, a.kind);
    switch (a.kind) {
      case ArgView::Kind::kNone: break;
      case ArgView::Kind::kTensor:
        Put(key, a.dtype);
        Put(key, a.device);
        Put(key, a.rank);
        key.append(reinterpret_cast<const char*>(a.sizes), sizeof(int64_t) * a.rank);
        break;
      case ArgView::Kind::kBool: Put(key, a.bool_value); break;
      case ArgView::Kind::kInt: Put(key, a.int_value); break;
      case ArgView::Kind::kFloat: Put(key, a.float_value); break;
      case ArgView::Kind::kString: {
        const absl::string_view s = a.string_value.substr(0, MissLog::kMaxStringBytes);
        Put(key, static_cast<uint32_t>(s.size()));
        key.append(s.data(), s.size());
        break;
      }
    }
  }
  return key;
}

artifact::v1::CallSignature Decode(absl::string_view key,
                                   const std::vector<std::string>& names) {
  artifact::v1::CallSignature call;
  for (size_t i = 0; !key.empty(); ++i) {
    auto* arg = call.add_arguments();
    if (i < names.size()) arg->set_name(names[i]);
    switch (Take<ArgView::Kind>(key)) {
      case ArgView::Kind::kNone: arg->mutable_scalar()->set_none(true); break;
      case ArgView::Kind::kTensor: {
        auto* t = arg->mutable_tensor();
        t->set_dtype(DTypeToProto(Take<DType>(key)));
        t->set_device(std::string(DeviceTypeName(Take<DeviceType>(key))));
        const auto rank = Take<int32_t>(key);
        for (int32_t d = 0; d < rank; ++d) t->add_shape(Take<int64_t>(key));
        break;
      }
      case ArgView::Kind::kBool: arg->mutable_scalar()->set_bool_value(Take<bool>(key)); break;
      case ArgView::Kind::kInt: arg->mutable_scalar()->set_int_value(Take<int64_t>(key)); break;
      case ArgView::Kind::kFloat:
        arg->mutable_scalar()->set_float_value(Take<double>(key));
        break;
      case ArgView::Kind::kString: {
        const auto size = Take<uint32_t>(key);
        arg->mutable_scalar()->set_string_value(std::string(key.substr(0, size)));
        key.remove_prefix(size);
        break;
      }
    }
  }
  return call;
}

}  // namespace

MissLog::MissLog(std::vector<std::vector<std::string>> parameter_names,
                 int signatures_per_frame)
    : parameter_names_(std::move(parameter_names)),
      signatures_per_frame_(std::max(0, signatures_per_frame)) {
  for (size_t i = 0; i < parameter_names_.size(); ++i) {
    frames_.push_back(std::make_unique<Frame>());
  }
}

size_t MissLog::Record(int frame_index, absl::Span<const ArgView> args, Outcome outcome,
                       absl::FunctionRef<MissExplanation()> explain, absl::Time now) {
  if (signatures_per_frame_ == 0 || frame_index < 0 ||
      frame_index >= static_cast<int>(frames_.size())) {
    return 0;
  }
  Frame& frame = *frames_[frame_index];
  std::string key = KeyOf(args);
  {
    std::lock_guard<std::mutex> lock(frame.mu);
    auto it = frame.entries.find(key);
    if (it != frame.entries.end()) {
      ++it->second.count;
      it->second.last_seen = now;
      return frame.entries.size();
    }
  }
  Entry entry;
  entry.count = 1;
  entry.first_seen = now;
  entry.last_seen = now;
  entry.outcome = outcome;
  entry.explanation = explain();
  std::lock_guard<std::mutex> lock(frame.mu);
  // Another call may have added the same signature meanwhile.
  if (auto it = frame.entries.find(key); it != frame.entries.end()) {
    ++it->second.count;
    it->second.last_seen = now;
    return frame.entries.size();
  }
  if (frame.entries.size() >= static_cast<size_t>(signatures_per_frame_)) {
    auto victim = frame.entries.begin();
    for (auto it = frame.entries.begin(); it != frame.entries.end(); ++it) {
      const Entry& e = it->second;
      const Entry& v = victim->second;
      if (e.count < v.count || (e.count == v.count && e.last_seen < v.last_seen)) victim = it;
    }
    frame.other_calls += victim->second.count;
    frame.entries.erase(victim);
  }
  frame.entries.emplace(std::move(key), std::move(entry));
  return frame.entries.size();
}

std::vector<FrameMisses> MissLog::Snapshot() const {
  std::vector<FrameMisses> out;
  for (size_t f = 0; f < frames_.size(); ++f) {
    FrameMisses misses;
    misses.frame_index = static_cast<int>(f);
    std::vector<std::pair<std::string, Entry>> copied;
    {
      std::lock_guard<std::mutex> lock(frames_[f]->mu);
      misses.other_calls = frames_[f]->other_calls;
      copied.assign(frames_[f]->entries.begin(), frames_[f]->entries.end());
    }
    if (copied.empty() && misses.other_calls == 0) continue;
    std::sort(copied.begin(), copied.end(), [](const auto& a, const auto& b) {
      if (a.second.count != b.second.count) return a.second.count > b.second.count;
      return a.second.first_seen < b.second.first_seen;
    });
    for (auto& [key, entry] : copied) {
      MissRecord record;
      record.call = Decode(key, parameter_names_[f]);
      record.count = entry.count;
      record.first_seen = entry.first_seen;
      record.last_seen = entry.last_seen;
      record.outcome = entry.outcome;
      record.explanation = std::move(entry.explanation);
      misses.signatures.push_back(std::move(record));
    }
    out.push_back(std::move(misses));
  }
  return out;
}

size_t MissLog::MemoryBytes() const {
  size_t bytes = 0;
  for (const auto& frame : frames_) {
    std::lock_guard<std::mutex> lock(frame->mu);
    bytes += frame->entries.capacity() * (sizeof(std::string) + sizeof(Entry) + 1);
    for (const auto& [key, entry] : frame->entries) {
      bytes += key.capacity() + entry.explanation.closest_variant.capacity() +
               entry.explanation.failing_guard.capacity();
    }
  }
  return bytes;
}

}  // namespace precompile
