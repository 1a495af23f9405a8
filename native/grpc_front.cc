// recserve's gRPC front end (issue 25: gRPC at its floor): a grpc++ server on the public
// gRPC port that answers EAS and TF Serving Predict on the native route (rs_route_process,
// rs_route_process_tfs: bytes to bytes in C) and Health's Check and Watch with no Python at
// all, and forwards every other call -- other methods, and every call it does not answer
// itself (a first-seen layout, a malformed request, a model with a timeline, a warmup
// recording or dynamic batching, several models and none named, a Check not SERVING) --
// byte for byte to recserve's Python gRPC server (grpcio, on a private Unix socket), whose
// answers, errors and metadata come back unchanged. Python stays the control plane
// (recserve/server/grpc_front.py): it names the models and their route slots, says which
// may be served natively, names each native servable's version, reports Health's statuses,
// and reads the counters into /metrics.
//
// Why: grpcio runs Python for every call (its poller and worker threads hand the GIL back
// and forth); measured under bench_grpc's client, grpc++ answering fixed bytes spent 0.35x
// of grpcio's server CPU a call (BENCHMARKS.md, bench_grpc).
//
// Calls are served by grpc++'s callback API: a native Predict runs inline in the callback
// (a batch-1 call is ~16 us of route); a forwarded call is pumped message by message both
// ways, so streams pass too. Thread-safe; the C functions below are the control plane's,
// called from Python with the GIL released (ctypes).

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

extern "C" {
#include "route.h"
// Plain C, compiled here as part of this library (setup.py builds one language per
// library; the fuzz target builds it as C).
#include "tfs_spec.c"
}

#define FRONT_API extern "C" __attribute__((visibility("default")))


typedef int (*route_fn)(rs_route_slot*, const uint8_t*, int64_t, uint8_t**, int64_t*, int64_t*);

static const char kEasPredict[] = "/tensorflow.eas.PredictionService/Predict";
static const char kTfsPredict[] = "/tensorflow.serving.PredictionService/Predict";
static const char kHealthCheck_[] = "/grpc.health.v1.Health/Check";
static const char kHealthWatch_[] = "/grpc.health.v1.Health/Watch";
// grpc.health.v1.HealthCheckResponse.ServingStatus
enum { kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
static const char kDefaultSignature[] = "serving_default";
// On a call forwarded after the native route declined it (and counted why): Python serves
// it without trying the route again (recserve.server.grpc_common.NATIVE_DECLINED).
static const char kDeclined[] = "x-recserve-native-declined";
static const char kModelKey[] = "model";
static const int kStages = 4;  // decode, lookup, run, encode: the route's info[] times

static int64_t now_ns(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// A Prometheus histogram's counts: bucket i counts values <= bounds[i] (the first such i),
// the last bucket the values above every bound; sum in the value's unit.
struct Histogram {
  std::vector<int64_t> bounds;
  std::unique_ptr<std::atomic<int64_t>[]> counts;
  std::atomic<int64_t> sum{0};
  void init(const int64_t* b, int64_t n) {
    bounds.assign(b, b + n);
    counts.reset(new std::atomic<int64_t>[n + 1]);
    for (int64_t i = 0; i <= n; i++) counts[i].store(0);
  }
  void add(int64_t value) {
    size_t i = 0;
    while (i < bounds.size() && value > bounds[i]) i++;
    counts[i].fetch_add(1, std::memory_order_relaxed);
    sum.fetch_add(value, std::memory_order_relaxed);
  }
  // Appends counts then sum.
  void read(std::vector<int64_t>* out) const {
    for (size_t i = 0; i <= bounds.size(); i++) out->push_back(counts[i].load(std::memory_order_relaxed));
    out->push_back(sum.load(std::memory_order_relaxed));
  }
};

// The protocols answered natively: their Predict methods, and index into Model::stats.
enum Protocol { kNone = -1, kEas = 0, kTfs = 1, kProtocols = 2, kHealthCheck = 3, kHealthWatch = 4 };

// What was served natively of one model over one protocol.
struct Stats {
  std::atomic<int64_t> served{0}, cpu_ns{0}, late{0};
  Histogram latency_ns, stage_ns[kStages], rows;
};

struct Model {
  std::string name;
  std::atomic<rs_route_slot*> slot{nullptr};  // null until the model serves: its calls go to Python
  std::atomic<int> native{1};  // 0: every call of it goes to Python (a timeline, a recording)
  bool ready = false;          // Health's view of it (Front::health_mu)
  Stats stats[kProtocols];
};

// A native servable's version, as its answers name it.
struct Label {
  std::string version;  // x-recserve-model-version
  int64_t number;       // TF Serving's version number (tfserving_grpc.version_number)
  std::string number_text;
};


class Front;
class Call;

// The forwarded call to the upstream (Python) server: its reactions go to the Call.
class Upstream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Upstream(Call* call) : call_(call) {}
  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  Call* call_;
};

// One call. Native: read the request, serve it on the route, answer; or, when the route
// declines it, become a forwarded call with that first message already read. Forwarded:
// messages pumped both ways between the client and the upstream server, each side's next
// read started when the other side has taken the last message; the upstream's status and
// trailing metadata end the call. grpc may run a reaction inline in a Start* call made
// outside reactions, so no lock is held across one.
class Call : public grpc::ServerGenericBidiReactor {
 public:
  Call(Front* front, grpc::GenericCallbackServerContext* ctx, Protocol protocol, Model* model)
      : front_(front), ctx_(ctx), protocol_(protocol), model_(model), up_(this) {}
  void Refuse(const grpc::Status& status) { end(status); }
  void Start();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  friend class Upstream;
  void serve_native();
  bool late(Stats* stats);
  const uint8_t* request(int64_t* size);
  void answer(Stats* stats, uint8_t* out, int64_t out_size, const std::string& tail, const Label& label,
              const int64_t* info, int64_t started, int64_t cpu);
  void serve_health(const uint8_t* data, int64_t size);

 public:
  // A Health Watch: the status to send (sent only when it changed), and whether the stream
  // ends after it (shutdown). No lock held by the caller; the caller holds a reference.
  void watch_update(int status, bool end);
  const std::string& watch_service() const { return watch_service_; }  // set before it is watched
  void hold() { refs_.fetch_add(1); }
  void release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

 private:
  void watch_kick();
  // Finish is called once per call (grpc aborts on a second): every path that ends a call
  // claims it first. A watch cancelled before its request arrived has two (its read's
  // failure and OnCancel).
  bool claim_finish() {
    std::lock_guard<std::mutex> lock(mu_);
    bool first = !finished_;
    finished_ = true;
    return first;
  }
  void end(const grpc::Status& status) {
    if (claim_finish()) Finish(status);
  }
  void forward(bool have_first);
  bool drop_hold();

  Front* front_;
  grpc::GenericCallbackServerContext* ctx_;
  Protocol protocol_;  // kNone: forwarded from the start
  Model* model_;  // an EAS Predict's model (a TF Serving one's is named in its request)
  grpc::ByteBuffer from_client_, to_client_;
  std::vector<grpc::Slice> slices_;  // the request's, while it is served natively
  std::string joined_;
  Upstream up_;
  grpc::ClientContext up_ctx_;
  std::atomic<bool> forwarding_{false};
  std::mutex mu_;
  // The upstream call is held (it cannot end) until the client's half-close is passed on
  // (its writes start outside its reactions), and while a message of it is being written
  // to the client (the next read of it starts outside its reactions).
  bool hold_ = false;
  bool wrote_ = false;  // a message went to the client: its initial metadata is sent
  // A Health Watch's stream, under mu_: the status queued last, the one waiting to be
  // written (-1: none), a write in flight, the end asked for, the client gone, Finish called.
  std::string watch_service_;
  int watch_queued_ = -1, watch_pending_ = -1;
  bool watch_writing_ = false, watch_end_ = false, cancelled_ = false, finished_ = false;
  std::atomic<int> refs_{1};  // the client's call, and the upstream call once started
};


class Front : public grpc::CallbackGenericService {
 public:
  route_fn route = nullptr;
  std::vector<std::unique_ptr<Model>> models;
  std::unordered_map<std::string, Model*> by_name;
  int64_t max_in_flight = 0;
  std::atomic<int64_t> in_flight{0}, refused{0}, forwarded{0};
  std::shared_mutex labels_mu;
  std::unordered_map<int64_t, Label> labels;  // native servable id -> its version
  route_fn route_tfs = nullptr;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> upstream;
  std::unique_ptr<grpc::GenericStub> stub;
  // grpc.health.v1, as Python computes it (rs_front_health): the server's services' status,
  // each model's, shutdown begun; the open Watch streams.
  std::mutex health_mu;
  std::vector<std::string> services;  // "" and the service names: the whole server's status
  bool health_known = false, server_ready = false, draining = false;
  std::unordered_set<Call*> watches;

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

  // A service's status, under health_mu: -1 for a name that is no service and no model.
  int health_status(const std::string& service) {
    for (const auto& name : services)
      if (name == service) return server_ready ? kServing : kNotServing;
    auto found = by_name.find(service);
    if (found == by_name.end()) return -1;
    return found->second->ready && !draining ? kServing : kNotServing;
  }

  Model* model_of(grpc::GenericCallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto named = md.find(kModelKey);
    if (named == md.end()) return models.size() == 1 ? models[0].get() : nullptr;
    auto found = by_name.find(std::string(named->second.data(), named->second.size()));
    return found == by_name.end() ? nullptr : found->second;
  }

  Label label(int64_t id) {
    std::shared_lock<std::shared_mutex> lock(labels_mu);
    auto found = labels.find(id);
    return found == labels.end() ? Label{std::string(), 0, "0"} : found->second;
  }
};


// Keys a forwarded call does not copy: HTTP/2 pseudo-headers and what gRPC sets itself
// (the deadline travels as the upstream call's own).
static bool reserved(const grpc::string_ref& key) {
  if (key.starts_with(":") || key.starts_with("grpc-")) return true;
  static const char* const kOwn[] = {"user-agent", "content-type", "te", "host", "accept-encoding",
                                     "content-encoding"};
  for (const char* own : kOwn)
    if (key == own) return true;
  return false;
}

static std::string str(const grpc::string_ref& s) { return std::string(s.data(), s.size()); }

void Call::Start() {
  if (protocol_ != kNone)
    StartRead(&from_client_);
  else
    forward(false);
}

void Call::OnReadDone(bool ok) {
  if (forwarding_.load()) {
    if (ok) {
      up_.StartWrite(&from_client_);  // held: the half-close has not passed
    } else if (drop_hold()) {  // the client half-closed: so does the upstream call
      up_.StartWritesDone();
      up_.RemoveHold();
    }
    return;
  }
  if (!ok) {  // the client sent no message: nothing to serve
    end(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"));
    return;
  }
  serve_native();
}

bool Call::drop_hold() {
  std::lock_guard<std::mutex> lock(mu_);
  bool held = hold_;
  hold_ = false;
  return held;
}

bool Call::late(Stats* stats) {
  if (std::chrono::system_clock::now() <= ctx_->deadline()) return false;
  stats->late.fetch_add(1, std::memory_order_relaxed);
  end(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                   "the call's deadline passed before its turn came; it was not run"));
  return true;
}

// The request's bytes, in one piece (null when it has none).
const uint8_t* Call::request(int64_t* size) {
  *size = 0;
  if (!from_client_.Dump(&slices_).ok() || slices_.empty()) return nullptr;
  if (slices_.size() == 1) {
    *size = (int64_t)slices_[0].size();
    return slices_[0].begin();
  }
  for (const auto& s : slices_) joined_.append((const char*)s.begin(), s.size());
  *size = (int64_t)joined_.size();
  return (const uint8_t*)joined_.data();
}

void Call::serve_native() {
  int64_t size;
  const uint8_t* data = request(&size);
  if (protocol_ == kHealthCheck || protocol_ == kHealthWatch) {
    serve_health(data, size);
    return;
  }
  int64_t started = now_ns(CLOCK_MONOTONIC), cpu = now_ns(CLOCK_THREAD_CPUTIME_ID);
  uint8_t* out = nullptr;
  int64_t out_size = 0, info[RS_INFO_SIZE] = {0};
  if (protocol_ == kEas) {
    Stats* stats = &model_->stats[kEas];
    if (late(stats)) return;
    rs_route_slot* slot = model_->slot.load(std::memory_order_acquire);
    if (size > 0 && slot && front_->route(slot, data, size, &out, &out_size, info) == 200) {
      answer(stats, out, out_size, std::string(), front_->label(info[RS_INFO_SERVABLE]), info, started, cpu);
      return;
    }
  } else {
    // TF Serving: the model the spec names, served natively only as the version it asks
    // for; any other case is Python's, with its error (NOT_FOUND for a version not served).
    rs_tfs_spec spec;
    Model* model = nullptr;
    if (data && rs_tfs_spec_parse(data, size, &spec)) {
      auto found = front_->by_name.find(std::string((const char*)spec.name, (size_t)spec.name_size));
      if (found != front_->by_name.end() && found->second->native.load(std::memory_order_relaxed))
        model = found->second;
    }
    if (model != nullptr) {
      Stats* stats = &model->stats[kTfs];
      if (late(stats)) return;
      rs_route_slot* slot = model->slot.load(std::memory_order_acquire);
      if (slot && front_->route_tfs(slot, data, size, &out, &out_size, info) == 200) {
        Label label = front_->label(info[RS_INFO_SERVABLE]);
        std::string_view asked_label((const char*)spec.version_label, (size_t)spec.version_label_size);
        bool asked = (!spec.has_version || spec.version == label.number) &&
                     (!spec.has_label || asked_label == label.version || asked_label == label.number_text);
        if (asked && !label.version.empty()) {
          const uint8_t* signature = spec.signature_name_size ? spec.signature_name : (const uint8_t*)kDefaultSignature;
          int64_t signature_size = spec.signature_name_size ? spec.signature_name_size : (int64_t)strlen(kDefaultSignature);
          const uint8_t* name = (const uint8_t*)model->name.data();
          int64_t name_size = (int64_t)model->name.size();
          std::string tail((size_t)rs_tfs_spec_field(name, name_size, label.number, signature, signature_size,
                                                     nullptr, 0), '\0');  // the size it needs
          rs_tfs_spec_field(name, name_size, label.number, signature, signature_size, (uint8_t*)&tail[0],
                            (int64_t)tail.size());
          answer(stats, out, out_size, tail, label, info, started, cpu);
          return;
        }
        free(out);
      }
    }
  }
  forward(true);  // the route declined it: Python serves it, or answers its error
}

// A natively served call's answer: the route's bytes (and `tail`), the version in the
// trailing metadata, its counts.
void Call::answer(Stats* stats, uint8_t* out, int64_t out_size, const std::string& tail, const Label& label,
                  const int64_t* info, int64_t started, int64_t cpu) {
  if (tail.empty()) {
    grpc::Slice whole(out, (size_t)out_size, free);
    to_client_ = grpc::ByteBuffer(&whole, 1);
  } else {
    grpc::Slice parts[2] = {grpc::Slice(out, (size_t)out_size, free), grpc::Slice(tail)};
    to_client_ = grpc::ByteBuffer(parts, 2);
  }
  ctx_->AddTrailingMetadata("x-recserve-model-version", label.version);
  ctx_->AddTrailingMetadata("x-recserve-delta-step", std::to_string(info[RS_INFO_DELTA_STEP]));
  stats->served.fetch_add(1, std::memory_order_relaxed);
  stats->latency_ns.add(now_ns(CLOCK_MONOTONIC) - started);
  for (int i = 0; i < kStages; i++) stats->stage_ns[i].add(info[RS_INFO_T0 + i + 1] - info[RS_INFO_T0 + i]);
  stats->rows.add(info[RS_INFO_BATCH]);
  stats->cpu_ns.fetch_add(now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu, std::memory_order_relaxed);
  if (claim_finish()) StartWriteAndFinish(&to_client_, grpc::WriteOptions(), grpc::Status::OK);
}

// A HealthCheckRequest's service (field 1); false -- Python reads it -- when malformed.
static bool health_service(const uint8_t* data, int64_t size, std::string* service) {
  const uint8_t *p = data, *end = data + size;
  service->clear();
  while (p < end) {
    uint64_t tag, n;
    if (!rs_varint_get(&p, end, &tag)) return false;
    switch (tag & 7) {
      case 0:
        if (!rs_varint_get(&p, end, &n)) return false;
        break;
      case 1:
      case 5:
        n = (tag & 7) == 1 ? 8 : 4;
        if ((uint64_t)(end - p) < n) return false;
        p += n;
        break;
      case 2:
        if (!rs_varint_get(&p, end, &n) || n > (uint64_t)(end - p)) return false;
        if (tag >> 3 == 1) service->assign((const char*)p, (size_t)n);
        p += n;
        break;
      default:
        return false;
    }
  }
  return true;
}

static grpc::ByteBuffer health_response(int status) {
  char bytes[2] = {0x08, (char)status};
  grpc::Slice slice(bytes, 2);
  return grpc::ByteBuffer(&slice, 1);
}

// Health's Check and Watch for the services and models Python named: what Python would
// answer, without a Python thread held by each open Watch. A Check not answered SERVING
// (an unknown name's error message, a model still loading), and anything before Python's
// first report, are Python's.
void Call::serve_health(const uint8_t* data, int64_t size) {
  std::string service;
  if (!health_service(data ? data : (const uint8_t*)"", size, &service)) {
    forward(true);
    return;
  }
  int status;
  bool known, draining;
  {
    std::lock_guard<std::mutex> lock(front_->health_mu);
    known = front_->health_known;
    status = known ? front_->health_status(service) : -1;
    draining = front_->draining;
    if (protocol_ == kHealthWatch && known) {
      watch_service_ = service;
      front_->watches.insert(this);
      hold();  // for watch_update below: rs_front_health may update it meanwhile
    }
  }
  if (!known || (protocol_ == kHealthCheck && status != kServing)) {
    forward(true);  // Python's view is fresh; this one is up to a report old
    return;
  }
  if (protocol_ == kHealthCheck) {
    to_client_ = health_response(status);
    if (claim_finish()) StartWriteAndFinish(&to_client_, grpc::WriteOptions(), grpc::Status::OK);
    return;
  }
  // Serving (or shutting down): said now. Otherwise the next report, at most one period
  // away, says it: "not serving yet" may be stale, and a client waits for the change.
  if (status == kServing || draining) watch_update(status, draining);
  release();
}

void Call::watch_update(int status, bool end) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status != watch_queued_) watch_pending_ = watch_queued_ = status;
    if (end) watch_end_ = true;
  }
  watch_kick();
}

// Starts the next write of a Watch, or ends it, when nothing is being written.
void Call::watch_kick() {
  int status = -1;
  bool finish = false;
  grpc::Status how = grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (watch_writing_ || finished_) return;
    if (cancelled_) {
      finished_ = finish = true;
      how = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
    } else if (watch_pending_ >= 0) {
      status = watch_pending_;
      watch_pending_ = -1;
      watch_writing_ = true;
    } else if (watch_end_) {
      finished_ = finish = true;
    } else {
      return;
    }
  }
  if (finish) {
    Finish(how);
    return;
  }
  to_client_ = health_response(status);
  StartWrite(&to_client_);
}

void Call::forward(bool have_first) {
  front_->forwarded.fetch_add(1, std::memory_order_relaxed);
  refs_.fetch_add(1);  // the upstream call's OnDone gives it back
  if (ctx_->raw_deadline().tv_sec != gpr_inf_future(GPR_CLOCK_REALTIME).tv_sec) up_ctx_.set_deadline(ctx_->deadline());
  for (const auto& kv : ctx_->client_metadata())
    if (!reserved(kv.first) && kv.first != kDeclined) up_ctx_.AddMetadata(str(kv.first), str(kv.second));
  if (have_first) up_ctx_.AddMetadata(kDeclined, "1");
  front_->stub->PrepareBidiStreamingCall(&up_ctx_, ctx_->method(), grpc::StubOptions(), &up_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  up_.AddHold();
  up_.StartRead(&to_client_);
  if (have_first) up_.StartWrite(&from_client_);
  forwarding_.store(true);
  up_.StartCall();
  if (!have_first) StartRead(&from_client_);
}

void Upstream::OnWriteDone(bool ok) {
  // The upstream took the client's last message: read the next one (or the half-close).
  if (ok) {
    call_->StartRead(&call_->from_client_);
  } else if (call_->drop_hold()) {  // the upstream call is ending: its OnDone gives the status
    RemoveHold();
  }
}

void Upstream::OnReadInitialMetadataDone(bool ok) {
  if (!ok) return;
  std::lock_guard<std::mutex> lock(call_->mu_);
  if (call_->wrote_) return;
  for (const auto& kv : call_->up_ctx_.GetServerInitialMetadata())
    if (!reserved(kv.first)) call_->ctx_->AddInitialMetadata(str(kv.first), str(kv.second));
}

void Upstream::OnReadDone(bool ok) {
  if (!ok) return;  // no more messages: OnDone(status) follows
  {
    std::lock_guard<std::mutex> lock(call_->mu_);
    call_->wrote_ = true;
  }
  AddHold();  // until the next read is started, after the client took this message
  call_->StartWrite(&call_->to_client_);
}

void Call::OnWriteDone(bool ok) {
  if (protocol_ == kHealthWatch && !forwarding_.load()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_writing_ = false;
      if (!ok) cancelled_ = true;
    }
    watch_kick();
    return;
  }
  // A message of the upstream's went to the client: read its next one, or give up on it.
  if (ok)
    up_.StartRead(&to_client_);
  else
    up_ctx_.TryCancel();
  up_.RemoveHold();
}

void Upstream::OnDone(const grpc::Status& status) {
  Call* call = call_;
  for (const auto& kv : call->up_ctx_.GetServerTrailingMetadata())
    if (!reserved(kv.first)) call->ctx_->AddTrailingMetadata(str(kv.first), str(kv.second));
  call->end(status);
  call->release();
}

void Call::OnCancel() {
  if (forwarding_.load()) {
    up_ctx_.TryCancel();
  } else if (protocol_ == kHealthWatch) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    watch_kick();
  }
}

void Call::OnDone() {
  if (protocol_ == kHealthWatch) {
    std::lock_guard<std::mutex> lock(front_->health_mu);
    front_->watches.erase(this);
  }
  front_->in_flight.fetch_sub(1, std::memory_order_relaxed);
  release();
}


grpc::ServerGenericBidiReactor* Front::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  Protocol protocol = kNone;
  Model* model = nullptr;
  if (ctx->method() == kEasPredict) {
    model = model_of(ctx);
    if (model != nullptr && model->native.load(std::memory_order_relaxed)) protocol = kEas;
  } else if (ctx->method() == kTfsPredict) {
    protocol = kTfs;
  } else if (ctx->method() == kHealthCheck_) {
    protocol = kHealthCheck;
  } else if (ctx->method() == kHealthWatch_) {
    protocol = kHealthWatch;
  }
  Call* call = new Call(this, ctx, protocol, model);
  if (in_flight.fetch_add(1, std::memory_order_relaxed) >= max_in_flight) {
    refused.fetch_add(1, std::memory_order_relaxed);
    call->Refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              "the server has its maximum of calls in flight (its worker threads, every model's "
                              "max_queued_requests and 64 for Health watches); retry later"));
    return call;
  }
  call->Start();
  return call;
}

// ---- the control plane's C functions (recserve/server/grpc_front.py) ----

FRONT_API Front* rs_front_create(route_fn route, route_fn route_tfs, int64_t max_in_flight) {
  if (!route || !route_tfs) return nullptr;
  Front* f = new Front();
  f->route = route;
  f->route_tfs = route_tfs;
  f->max_in_flight = max_in_flight;
  return f;
}

// A model the front may serve natively; the histograms' bounds: latency and
// stages in ns, rows. Returns its index for rs_front_set_native/rs_front_stats. Before start.
FRONT_API int64_t rs_front_add_model(Front* f, const char* name, const int64_t* latency_bounds, int64_t n_latency,
                                     const int64_t* row_bounds, int64_t n_rows) {
  std::unique_ptr<Model> m(new Model());
  m->name = name;
  for (Stats& stats : m->stats) {
    stats.latency_ns.init(latency_bounds, n_latency);
    for (int i = 0; i < kStages; i++) stats.stage_ns[i].init(latency_bounds, n_latency);
    stats.rows.init(row_bounds, n_rows);
  }
  f->by_name[m->name] = m.get();
  f->models.push_back(std::move(m));
  return (int64_t)f->models.size() - 1;
}

// The route slot of the model's processor, once it serves (set once: a registry entry's
// processor is made once; the caller keeps the slot alive while the front end runs).
FRONT_API void rs_front_set_slot(Front* f, int64_t model, rs_route_slot* slot) {
  f->models[model]->slot.store(slot, std::memory_order_release);
}

// Whether the model's Predicts may be served natively (0: each goes to Python).
FRONT_API void rs_front_set_native(Front* f, int64_t model, int32_t on) { f->models[model]->native.store(on); }

// The version of native servable `id`: its name, which each natively answered call's
// metadata gives, and its TF Serving number.
FRONT_API void rs_front_label(Front* f, int64_t id, const char* version, int64_t number) {
  std::unique_lock<std::shared_mutex> lock(f->labels_mu);
  f->labels[id] = Label{version, number, std::to_string(number)};
}

// A name whose Health status is the whole server's ("" and the service names).
FRONT_API void rs_front_add_service(Front* f, const char* name) { f->services.push_back(name); }

// What Health answers from now on: the server ready, each model (in rs_front_add_model's
// order) ready, shutdown begun. Open watches are sent each status that changed; once
// draining, each ends after its last status (NOT_SERVING), as Python's Watch does.
FRONT_API void rs_front_health(Front* f, int32_t server_ready, const int32_t* model_ready, int32_t draining) {
  std::vector<std::pair<Call*, int>> updates;
  {
    std::lock_guard<std::mutex> lock(f->health_mu);
    f->health_known = true;
    f->server_ready = server_ready != 0;
    f->draining = draining != 0;
    for (size_t i = 0; i < f->models.size(); i++) f->models[i]->ready = model_ready[i] != 0;
    for (Call* call : f->watches) {
      call->hold();  // alive past the lock: its OnDone may run meanwhile
      int status = f->health_status(call->watch_service());
      updates.emplace_back(call, status < 0 ? kServiceUnknown : status);
    }
  }
  for (auto& [call, status] : updates) {  // no lock held: a write may run reactions inline
    call->watch_update(status, draining != 0);
    call->release();
  }
}

// Listens on `address` (host:port; port 0: any) and forwards to `upstream` (a gRPC target,
// e.g. unix:/path). Returns the port bound, or -1 with the reason in err.
FRONT_API int64_t rs_front_start(Front* f, const char* address, const char* upstream, int32_t reuse_port,
                                 int64_t max_receive_bytes, char* err, int64_t err_cap) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  f->upstream = grpc::CreateCustomChannel(upstream, grpc::InsecureChannelCredentials(), args);
  f->stub.reset(new grpc::GenericStub(f->upstream));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes > INT32_MAX ? INT32_MAX : (int)max_receive_bytes);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  builder.RegisterCallbackGenericService(f);
  f->server = builder.BuildAndStart();
  if (!f->server || port == 0) {
    snprintf(err, (size_t)err_cap, "grpc++ could not listen on %s (is the port taken?)", address);
    f->server.reset();
    return -1;
  }
  return port;
}

// The model's counters over one protocol (0: EAS, 1: TF Serving), cumulative: served, CPU
// ns, calls dropped for a passed deadline; latency (ns) bucket counts then sum; each
// stage's the same; rows' the same. Returns the number of values (written up to cap).
FRONT_API int64_t rs_front_stats(Front* f, int64_t model, int32_t protocol, int64_t* out, int64_t cap) {
  const Stats& m = f->models[model]->stats[protocol];
  std::vector<int64_t> v = {m.served.load(), m.cpu_ns.load(), m.late.load()};
  m.latency_ns.read(&v);
  for (int i = 0; i < kStages; i++) m.stage_ns[i].read(&v);
  m.rows.read(&v);
  for (size_t i = 0; i < v.size() && (int64_t)i < cap; i++) out[i] = v[i];
  return (int64_t)v.size();
}

// Calls since the start: forwarded to the upstream server; refused (the server had its
// maximum in flight). (Those served natively: each model's rs_front_stats.)
FRONT_API void rs_front_calls(Front* f, int64_t* out) {
  out[0] = f->forwarded.load();
  out[1] = f->refused.load();
}

// Stops listening at once; calls in flight get up to grace_seconds to end, then are
// cancelled. Returns when all are done.
FRONT_API void rs_front_shutdown(Front* f, double grace_seconds) {
  if (!f->server) return;
  f->server->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::microseconds((int64_t)(grace_seconds * 1e6)));
  f->server->Wait();
}

FRONT_API void rs_front_free(Front* f) {
  rs_front_shutdown(f, 0);
  f->server.reset();
  f->stub.reset();
  f->upstream.reset();
  delete f;
}
