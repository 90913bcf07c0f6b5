#include "server/grpc/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>

#include "server/grpc/message_bytes.h"

namespace precompile::server {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

// `file`, then the files it imports, each once.
void AddFile(const FileDescriptor* file, std::unordered_set<std::string>* added,
             ServerReflectionResponse* response) {
  if (!added->insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(
      response->mutable_file_descriptor_response()->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), added, response);
}

constexpr size_t kMaxRequestBytes = 4096;

void SetError(grpc::StatusCode code, const std::string& message,
              ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(code);
  response->mutable_error_response()->set_error_message(message);
}

}  // namespace

// One open stream: reads a request, writes its answer, reads the next,
// until the client closes its side. A read and a write are never pending at
// once, so its callbacks never run at the same time. Each request and answer
// is freed once done with: an idle stream holds no message.
class ReflectionService::Stream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Stream(ReflectionService* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    service_->AnswerBytes(request_, &response_);
    request_.Clear();
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    response_.Clear();
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the answer could not be written"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    service_->open_streams_.fetch_sub(1);
    delete this;
  }

 private:
  ReflectionService* const service_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

// A stream opened past the limit: finished at once.
class ReflectionService::Refusal final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Refusal(int max_streams) {
    Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "the server has " + std::to_string(max_streams) +
                            " reflection streams open, its limit; close one and try again"));
  }
  void OnDone() override { delete this; }
};

ReflectionService::ReflectionService(std::vector<std::string> services, int max_streams)
    : services_(std::move(services)), max_streams_(max_streams) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReflectionService::ServerReflectionInfo(grpc::CallbackServerContext*) {
  if (open_streams_.fetch_add(1) >= max_streams_) {
    open_streams_.fetch_sub(1);
    return new Refusal(max_streams_);
  }
  return new Stream(this);
}

void ReflectionService::AnswerBytes(const grpc::ByteBuffer& bytes, grpc::ByteBuffer* answer) const {
  ServerReflectionResponse response;
  // Names here are short; a request of any size gRPC takes would otherwise
  // be parsed, held twice, and echoed back.
  ServerReflectionRequest request;
  if (const size_t size = bytes.Length(); size > kMaxRequestBytes) {
    SetError(grpc::StatusCode::INVALID_ARGUMENT,
             "a reflection request of " + std::to_string(size) + " bytes; at most " +
                 std::to_string(kMaxRequestBytes) + " are read",
             &response);
  } else if (grpc::Status parsed = ParseMessage(bytes, &request); !parsed.ok()) {
    SetError(parsed.error_code(), parsed.error_message(), &response);
  } else {
    response = Answer(request);
  }
  SerializeMessage(response, answer);
}

ServerReflectionResponse ReflectionService::Answer(const ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  std::unordered_set<std::string> added;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kFileByFilename:
      if (const FileDescriptor* file = pool->FindFileByName(request.file_by_filename())) {
        AddFile(file, &added, &response);
      } else {
        SetError(grpc::StatusCode::NOT_FOUND, "no file '" + request.file_by_filename() + "'",
                 &response);
      }
      break;
    case ServerReflectionRequest::kFileContainingSymbol:
      if (const FileDescriptor* file =
              pool->FindFileContainingSymbol(request.file_containing_symbol())) {
        AddFile(file, &added, &response);
      } else {
        SetError(grpc::StatusCode::NOT_FOUND,
                 "no symbol '" + request.file_containing_symbol() + "'", &response);
      }
      break;
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& asked = request.file_containing_extension();
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(asked.containing_type());
      const google::protobuf::FieldDescriptor* extension =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, asked.extension_number());
      if (extension != nullptr) {
        AddFile(extension->file(), &added, &response);
      } else {
        SetError(grpc::StatusCode::NOT_FOUND,
                 "no extension " + std::to_string(asked.extension_number()) + " of '" +
                     asked.containing_type() + "'",
                 &response);
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 "no type '" + request.all_extension_numbers_of_type() + "'", &response);
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
      break;
    }
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(grpc::StatusCode::UNIMPLEMENTED, "the request asks for nothing this server knows",
               &response);
      break;
  }
  return response;
}

}  // namespace precompile::server
