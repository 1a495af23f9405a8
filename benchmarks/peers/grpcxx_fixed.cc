// The floor of a C++ gRPC front end (issue 25: a gRPC server that runs no Python per call):
// a grpc++ callback generic service answering /tensorflow.eas.PredictionService/Predict with
// fixed bytes, to set beside grpcio's floor (grpc_fixed.py) under bench_grpc's client.
// Not built by the Makefile (it needs Debian's libgrpc++-dev):
//   g++ -O2 -std=c++17 grpcxx_fixed.cc -o grpcxx_fixed $(pkg-config --cflags --libs grpc++)
//   ./grpcxx_fixed PORT RESPONSE_FILE      (prints "ready")
#include <grpcpp/grpcpp.h>
#include <grpcpp/generic/async_generic_service.h>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

static std::string response;

class Reactor : public grpc::ServerGenericBidiReactor {
 public:
  Reactor() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) { Finish(grpc::Status::OK); return; }
    grpc::Slice slice(response.data(), response.size());
    answer_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&answer_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }
 private:
  grpc::ByteBuffer request_, answer_;
};

class Service : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Reactor();
  }
};

int main(int argc, char** argv) {
  std::ifstream in(argv[2], std::ios::binary);
  response.assign(std::istreambuf_iterator<char>(in), {});
  Service service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("127.0.0.1:") + argv[1], grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&service);
  auto server = builder.BuildAndStart();
  std::cout << "ready" << std::endl;
  server->Wait();
}
