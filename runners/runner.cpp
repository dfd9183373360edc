// sme2farm local runner: executor_runner's command line and log lines, built against the
// executorch wheel's shipped headers and shared libraries (runtime, optimized kernels, XNNPACK,
// ETDump, threadpool), so a host with only `pip install executorch` can run and profile a .pte.
//
// Flags (as upstream examples/portable/executor_runner, plus --warmup):
//   --model_path PATH  --num_executions N (1)  --cpu_threads N (-1: leave the default)
//   --etdump_path PATH  --method_name NAME (forward)  --warmup N (0)
// Both --flag=value and --flag value are accepted. Inputs are all-ones tensors, as upstream.
//
// Warm-up exclusion: the Method keeps the EventTracer pointer it was loaded with, so the
// tracer cannot be swapped per execution. The Method is therefore loaded with a RoutingTracer
// that forwards every event to a target: the real ETDumpGen while loading (keeping the
// "Default" block with Program::load_method / Method::init), a scratch ETDumpGen during the
// warm-up executions (same tracing cost as a timed run, then discarded), and the real one again
// for the timed executions. The written ETDump has exactly one "Execute" block per timed run.

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifndef SME2FARM_EXECUTORCH_VERSION
#define SME2FARM_EXECUTORCH_VERSION "unknown"
#endif

// The wheel ships libexecutorch_threadpool.so but not extension/threadpool/threadpool.h; these
// declarations match the exported symbols (non-virtual members, called through a pointer only,
// so the class layout is never used here).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
  size_t get_thread_count() const;
};
ThreadPool* get_threadpool();
} // namespace executorch::extension::threadpool

namespace {

using executorch::aten::ScalarType;
using executorch::aten::TensorImpl;
using executorch::etdump::ETDumpGen;
using executorch::extension::FileDataLoader;
using executorch::extension::MallocMemoryAllocator;
using executorch::runtime::AllocatorID;
using executorch::runtime::ArrayRef;
using executorch::runtime::ChainID;
using executorch::runtime::DebugHandle;
using executorch::runtime::DelegateDebugIntId;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::EventTracerEntry;
using executorch::runtime::EventTracerFilterBase;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::LoggedEValueType;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::runtime::Tag;

// Forwards every event to `target`. The chain id / debug handle the Method sets on *this*
// tracer (non-virtual state) are passed on explicitly, or operator events would lose their
// instruction_id.
class RoutingTracer final : public EventTracer {
 public:
  explicit RoutingTracer(EventTracer* target) : target_(target) {}
  void route_to(EventTracer* target) { target_ = target; }

  void create_event_block(const char* name) override { target_->create_event_block(name); }
  EventTracerEntry start_profiling(const char* name, ChainID chain_id, DebugHandle debug_handle) override {
    return target_->start_profiling(
        name, chain_id == -1 ? chain_id_ : chain_id, debug_handle == 0 ? debug_handle_ : debug_handle);
  }
  void end_profiling(EventTracerEntry entry) override { target_->end_profiling(entry); }
  EventTracerEntry start_profiling_delegate(const char* name, DelegateDebugIntId id) override {
    return target_->start_profiling_delegate(name, id);
  }
  void end_profiling_delegate(EventTracerEntry entry, const void* metadata, size_t len) override {
    target_->end_profiling_delegate(entry, metadata, len);
  }
  void log_profiling_delegate(const char* name, DelegateDebugIntId id, et_timestamp_t start,
                              et_timestamp_t end, const void* metadata, size_t len) override {
    target_->log_profiling_delegate(name, id, start, end, metadata, len);
  }
  void track_allocation(AllocatorID id, size_t size) override { target_->track_allocation(id, size); }
  AllocatorID track_allocator(const char* name) override { return target_->track_allocator(name); }
  Result<bool> log_evalue(const EValue& evalue, LoggedEValueType type) override {
    return target_->log_evalue(evalue, type);
  }
  Result<bool> log_intermediate_output_delegate(const char* name, DelegateDebugIntId id,
                                                const executorch::aten::Tensor& output) override {
    return target_->log_intermediate_output_delegate(name, id, output);
  }
  Result<bool> log_intermediate_output_delegate(const char* name, DelegateDebugIntId id,
                                                const ArrayRef<executorch::aten::Tensor> output) override {
    return target_->log_intermediate_output_delegate(name, id, output);
  }
  Result<bool> log_intermediate_output_delegate(const char* name, DelegateDebugIntId id, const int& output) override {
    return target_->log_intermediate_output_delegate(name, id, output);
  }
  Result<bool> log_intermediate_output_delegate(const char* name, DelegateDebugIntId id, const bool& output) override {
    return target_->log_intermediate_output_delegate(name, id, output);
  }
  Result<bool> log_intermediate_output_delegate(const char* name, DelegateDebugIntId id, const double& output) override {
    return target_->log_intermediate_output_delegate(name, id, output);
  }
  void set_delegation_intermediate_output_filter(EventTracerFilterBase* filter) override {
    target_->set_delegation_intermediate_output_filter(filter);
  }

 private:
  EventTracer* target_;
};

struct Options {
  std::string model_path;
  std::string etdump_path;
  std::string method_name = "forward";
  long num_executions = 1;
  long cpu_threads = -1;
  long warmup = 0;
};

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::fflush(stdout);
  std::exit(1);
}

long parse_int(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0) fail("--" + flag + " needs an integer, got '" + value + "'");
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) fail("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) fail("--" + name + " needs a value");
      value = argv[++i];
    }
    if (name == "model_path") o.model_path = value;
    else if (name == "etdump_path") o.etdump_path = value;
    else if (name == "method_name") o.method_name = value;
    else if (name == "num_executions") o.num_executions = parse_int(name, value);
    else if (name == "cpu_threads") o.cpu_threads = parse_int(name, value);
    else if (name == "warmup") o.warmup = parse_int(name, value);
    else fail("unknown flag --" + name);
  }
  if (o.model_path.empty()) fail("--model_path is required");
  if (o.num_executions < 1) fail("--num_executions must be >= 1");
  if (o.warmup < 0) fail("--warmup must be >= 0");
  if (o.cpu_threads == 0 || o.cpu_threads < -1) fail("--cpu_threads must be -1 or >= 1");
  return o;
}

// Fill `n` elements of `type` at `data` with one, like upstream prepare_input_tensors.
bool fill_ones(ScalarType type, void* data, size_t n) {
  switch (type) {
#define SME2FARM_FILL(ctype, stype)                                    \
  case ScalarType::stype:                                              \
    for (size_t i = 0; i < n; ++i) static_cast<ctype*>(data)[i] = ctype(1); \
    return true;
    ET_FORALL_REAL_TYPES_AND(Bool, SME2FARM_FILL)
#undef SME2FARM_FILL
    default:
      return false;
  }
}

// The input tensors of one method call: buffers and TensorImpls that must outlive the Method's
// use of them (set_input copies into planned memory, but keep them alive for safety of
// non-planned inputs).
struct Inputs {
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<TensorImpl::SizesType>> sizes;
  std::vector<std::vector<TensorImpl::DimOrderType>> dim_order;
  std::vector<std::vector<TensorImpl::StridesType>> strides;
  std::vector<std::unique_ptr<TensorImpl>> impls;
};

void set_ones_inputs(Method& method, Inputs& in) {
  auto meta = method.method_meta();
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    auto tag = meta.input_tag(i);
    if (!tag.ok()) fail("cannot read the tag of input " + std::to_string(i));
    if (*tag != Tag::Tensor) continue;  // upstream leaves non-tensor inputs as the program set them
    auto info = meta.input_tensor_meta(i);
    if (!info.ok()) fail("cannot read the metadata of input " + std::to_string(i));
    auto s = info->sizes();
    auto d = info->dim_order();
    in.sizes.emplace_back(s.begin(), s.end());
    in.dim_order.emplace_back(d.begin(), d.end());
    in.strides.emplace_back(s.size());
    if (executorch::runtime::dim_order_to_stride(
            in.sizes.back().data(), in.dim_order.back().data(), s.size(), in.strides.back().data()) != Error::Ok)
      fail("bad dim order for input " + std::to_string(i));
    in.data.emplace_back(info->nbytes());
    size_t n = info->nbytes() / executorch::runtime::elementSize(info->scalar_type());
    if (!fill_ones(info->scalar_type(), in.data.back().data(), n))
      fail("input " + std::to_string(i) + " has an unsupported dtype " +
           executorch::runtime::toString(info->scalar_type()));
    in.impls.push_back(std::make_unique<TensorImpl>(
        info->scalar_type(), s.size(), in.sizes.back().data(), in.data.back().data(),
        in.dim_order.back().data(), in.strides.back().data()));
    Error err = method.set_input(EValue(executorch::aten::Tensor(in.impls.back().get())), i);
    if (err != Error::Ok) fail("set_input " + std::to_string(i) + " failed: error " + std::to_string(int(err)));
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  std::printf("sme2farm runner (executor_runner-compatible), ExecuTorch %s\n", SME2FARM_EXECUTORCH_VERSION);
  executorch::runtime::runtime_init();

  if (opt.cpu_threads > 0) {
    auto* pool = executorch::extension::threadpool::get_threadpool();
    if (pool == nullptr || !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(opt.cpu_threads)))
      fail("cannot set the thread pool to " + std::to_string(opt.cpu_threads) + " threads");
  }
  if (auto* pool = executorch::extension::threadpool::get_threadpool())
    std::printf("Threads: %zu\n", pool->get_thread_count());

  auto loader = FileDataLoader::from(opt.model_path.c_str());
  if (!loader.ok()) fail("cannot open model '" + opt.model_path + "' (error " + std::to_string(int(loader.error())) + ")");
  auto program = Program::load(&loader.get());
  if (!program.ok()) fail("cannot load program '" + opt.model_path + "': not a valid .pte (error " +
                          std::to_string(int(program.error())) + ")");
  auto meta = program->method_meta(opt.method_name.c_str());
  if (!meta.ok()) fail("the model has no method '" + opt.method_name + "'");

  // Planned memory: one malloc'd buffer per memory-planned arena, as upstream.
  std::vector<std::vector<uint8_t>> planned_buffers;
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    planned_buffers.emplace_back(static_cast<size_t>(meta->memory_planned_buffer_size(i).get()));
    planned_spans.emplace_back(planned_buffers.back().data(), planned_buffers.back().size());
  }
  HierarchicalAllocator planned_memory({planned_spans.data(), planned_spans.size()});
  MallocMemoryAllocator method_allocator, temp_allocator;
  MemoryManager memory_manager(&method_allocator, &planned_memory, &temp_allocator);

  ETDumpGen etdump, warmup_etdump;
  RoutingTracer tracer(&etdump);
  auto method = program->load_method(opt.method_name.c_str(), &memory_manager, &tracer);
  if (!method.ok()) fail("cannot load method '" + opt.method_name + "' (error " + std::to_string(int(method.error())) +
                         "); is an operator or delegate missing from this runner?");

  Inputs inputs;
  set_ones_inputs(*method, inputs);

  if (opt.warmup > 0) {
    tracer.route_to(&warmup_etdump);
    for (long i = 0; i < opt.warmup; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      Error err = method->execute();
      if (err != Error::Ok) fail("warm-up execution " + std::to_string(i) + " failed (error " + std::to_string(int(err)) + ")");
      std::printf("Warm-up %ld of %ld: %f ms\n", i + 1, opt.warmup, ms_since(t0));
    }
    tracer.route_to(&etdump);
  }

  double total_ms = 0;
  for (long i = 0; i < opt.num_executions; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Error err = method->execute();
    double ms = ms_since(t0);
    if (err != Error::Ok) fail("execution " + std::to_string(i) + " failed (error " + std::to_string(int(err)) + ")");
    total_ms += ms;
    std::printf("Iteration %ld of %ld: %f ms\n", i + 1, opt.num_executions, ms);
  }
  std::printf("Model executed successfully %ld time(s) in %f ms.\n", opt.num_executions, total_ms);

  if (!opt.etdump_path.empty()) {
    auto result = etdump.get_etdump_data();  // size-prefixed flatbuffer, malloc'd by ETDumpGen
    if (result.buf == nullptr || result.size == 0) fail("the ETDump is empty");
    FILE* f = std::fopen(opt.etdump_path.c_str(), "wb");
    if (f == nullptr) fail("cannot write ETDump to '" + opt.etdump_path + "': " + std::strerror(errno));
    bool ok = std::fwrite(result.buf, 1, result.size, f) == result.size;
    ok = (std::fclose(f) == 0) && ok;
    std::free(result.buf);
    if (!ok) fail("short write of ETDump to '" + opt.etdump_path + "'");
    std::printf("ETDump written to %s (%zu bytes)\n", opt.etdump_path.c_str(), result.size);
  }
  std::fflush(stdout);
  return 0;
}
