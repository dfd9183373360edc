// sme2farm local runner: executor_runner's command line and log lines, built against the
// executorch wheel's shipped headers and shared libraries (runtime, optimized kernels, XNNPACK,
// ETDump, threadpool), so a host with only `pip install executorch` can run and profile a .pte.
//
// Flags (as upstream examples/portable/executor_runner, plus --warmup, --inputs_file, --outputs_file):
//   --model_path PATH  --num_executions N (1)  --cpu_threads N (-1: leave the default)
//   --etdump_path PATH  --method_name NAME (forward)  --warmup N (0)
//   --print_output (each output's values after the last execution)
//   --inputs_file PATH  (runners/inputs.py's SME2IN01 container: tensors of any dtype, ints,
//                        doubles, bools; without it tensor inputs are all ones, as upstream)
//   --outputs_file PATH (every output of the last timed execution, in the same SME2IN01 container:
//                        tensors in logical row-major order whatever their dim order; an output
//                        the container cannot carry (a list, a dtype outside it) is kind 0, none)
//   --memory_file PATH  (JSON: peak resident memory at exit and after loading, the
//                        planned buffers the runner allocated, what the method and temp allocators
//                        were asked for; see write_memory)
//   --llm_prompt P --llm_decode D  (LLM mode, both or neither: each iteration prefills a prompt of
//                        P tokens (id 1) from input_pos 0, in one call or, where P > S, in calls of
//                        S tokens (S = 1: token by token, as ExecuTorch's static-shape export needs),
//                        then decodes D times one token at input_pos P+i, each the greedy pick
//                        (argmax) of the call before's logits (output 0). The method must take
//                        tokens [1, S] int64 and positions int64 in either convention ExecuTorch's
//                        LLM runner serves (extension/llm/runner/util.h,
//                        populate_start_pos_or_cache_position): a second input declared [1] is
//                        fed the start position (ExecuTorch's Llama export), one declared [S] the
//                        positions start .. start+S-1 (Hugging Face's optimum-executorch export);
//                        the runner prints which. A prompt over S needs the program to declare its cache length
//                        (get_max_context_len or get_max_seq_len), prompt + decode within it. Each call's Execute
//                        block in the ETDump holds a marker event sme2farm::llm_prefill or
//                        sme2farm::llm_decode: chain_index = tokens in the call, instruction_id =
//                        input_pos; its span starts before the inputs are set.)
// Both --flag=value and --flag value are accepted.
//
// Environment: SME2FARM_HIDE_SME2=1 hides SME/SME2 from XNNPACK, so one binary serves both SME2
// arms (docs/design.md, "One runner binary, both arms"). On arm64 libsme2farm_hide
// (sme2_hide.c, linked so it initialises before the XNNPACK backend) checks cpuinfo_isa against
// the OS and clears its SME fields; the runner prints what XNNPACK was shown ("SME2 hiding: ...")
// and fails the off arm, before loading the model, where SME2 could not be hidden. On Linux the
// exported getauxval() below also clears HWCAP2_SME/SME2 for every other caller (a second line).
//
// Failures print one line `error: ...` to stderr naming the cause (the missing operator, the
// input that does not match, the runtime's own error message) and exit 1.
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

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

#if defined(__linux__)
#include <sys/auxv.h>
#endif

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

#if defined(SME2FARM_HIDE_LIBRARY)
#include "sme2_hide.h"
#endif

#if defined(__linux__) && defined(__aarch64__)
// Exported from the executable (ENABLE_EXPORTS), so the shared libraries' getauxval() calls land
// here first. glibc's __getauxval does the real work. The one caller let through unhidden is
// libsme2farm_hide's own cpuinfo_initialize(), whose result it checks against the OS and then
// clears; should cpuinfo initialise before it (a link order gone wrong), cpuinfo sees this view.
extern "C" unsigned long __getauxval(unsigned long type);
extern "C" unsigned long getauxval(unsigned long type) {
  unsigned long value = __getauxval(type);
  if (type == AT_HWCAP2) {
    const char* hide = std::getenv("SME2FARM_HIDE_SME2");
#if defined(SME2FARM_HIDE_LIBRARY)
    if (sme2farm_hide_checking()) hide = nullptr;
#endif
    if (hide != nullptr && hide[0] == '1') value &= ~((1UL << 23) | (1UL << 37));  // HWCAP2_SME, HWCAP2_SME2
  }
  return value;
}
#endif

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
using executorch::runtime::MethodMeta;
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
  EventTracer* target() const { return target_; }

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
  std::string inputs_file;
  std::string outputs_file;
  std::string memory_file;
  long llm_prompt = -1;  // -1: not in LLM mode
  long llm_decode = -1;
  bool print_output = false;
};

// The runtime's log goes through this PAL hook (register_pal): lines are printed as the
// default PAL would, and the error-level ones are kept so a failure can name its cause (the
// runtime logs "Missing operator: [i] name" before load_method returns OperatorMissing).
std::vector<std::string> g_runtime_errors;
std::vector<std::string> g_missing_operators;

void emit_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*, size_t line,
              const char* message, size_t length) {
  std::string msg(message, length);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r')) msg.pop_back();
  std::fprintf(stderr, "%c executorch:%s:%zu] %s\n", static_cast<char>(level), filename, line, msg.c_str());
  if (level == kError || level == kFatal) {
    const std::string marker = "Missing operator: ";
    size_t at = msg.find(marker);
    if (at != std::string::npos) {
      std::string op = msg.substr(at + marker.size());
      size_t bracket = op.find("] ");
      op = bracket == std::string::npos ? op : op.substr(bracket + 2);
      // each call site of an operator reports it: name it once
      if (std::find(g_missing_operators.begin(), g_missing_operators.end(), op) == g_missing_operators.end())
        g_missing_operators.push_back(op);
    }
    if (g_runtime_errors.size() < 16) g_runtime_errors.push_back(msg);
  }
}

[[noreturn]] void fail(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(1);
}

std::string error_name(Error err) {
  return std::string(executorch::runtime::to_string(err)) + " (" + std::to_string(int(err)) + ")";
}

// The first error the runtime logged, as context for a failed call ("" if none).
std::string runtime_said() {
  return g_runtime_errors.empty() ? "" : ": " + g_runtime_errors.front();
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
    } else if (name == "print_output") {
      value = "true";  // a boolean flag, as upstream's gflags --print_output
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
    else if (name == "inputs_file") o.inputs_file = value;
    else if (name == "outputs_file") o.outputs_file = value;
    else if (name == "memory_file") o.memory_file = value;
    else if (name == "llm_prompt") o.llm_prompt = parse_int(name, value);
    else if (name == "llm_decode") o.llm_decode = parse_int(name, value);
    else if (name == "print_output") o.print_output = value == "true" || value == "1";
    else fail("unknown flag --" + name);
  }
  if (o.model_path.empty()) fail("--model_path is required");
  if (o.num_executions < 1) fail("--num_executions must be >= 1");
  if (o.warmup < 0) fail("--warmup must be >= 0");
  if (o.cpu_threads == 0 || o.cpu_threads < -1) fail("--cpu_threads must be -1 or >= 1");
  if ((o.llm_prompt == -1) != (o.llm_decode == -1)) fail("--llm_prompt and --llm_decode go together");
  if (o.llm_prompt != -1 && o.llm_prompt < 1) fail("--llm_prompt must be >= 1");
  if (o.llm_decode != -1 && o.llm_decode < 0) fail("--llm_decode must be >= 0");
  if (o.llm_prompt != -1 && !o.inputs_file.empty()) fail("--inputs_file and LLM mode do not go together");
  return o;
}

// Fill `n` elements of `type` at `data` with one, like upstream prepare_input_tensors: every
// real type, Half, BFloat16 and Bool (fp16 models take Half inputs).
bool fill_ones(ScalarType type, void* data, size_t n) {
  switch (type) {
#define SME2FARM_FILL(ctype, stype)                                                 \
  case ScalarType::stype:                                                           \
    for (size_t i = 0; i < n; ++i) static_cast<ctype*>(data)[i] = static_cast<ctype>(1.0f); \
    return true;
    ET_FORALL_REALHBBF16_TYPES(SME2FARM_FILL)
#undef SME2FARM_FILL
    default:
      return false;
  }
}

std::string shape_str(ScalarType type, const std::vector<int64_t>& sizes) {
  std::string out = std::string(executorch::runtime::toString(type)) + " [";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// The inputs file holds row-major data; a tensor whose dim order is not the identity (a
// channels-last input, dim order 0 2 3 1) keeps its elements at `strides`. Move each element from
// its row-major offset to its strided one.
void to_dim_order(std::vector<uint8_t>& data, const std::vector<TensorImpl::SizesType>& sizes,
                  const std::vector<TensorImpl::StridesType>& strides, size_t elem) {
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (sizes[k] != 1 && strides[k] != expect) contiguous = false;
    expect *= sizes[k];
  }
  if (contiguous || data.empty()) return;
  std::vector<uint8_t> out(data.size());
  std::vector<int64_t> index(sizes.size(), 0);
  size_t numel = data.size() / elem;
  for (size_t flat = 0; flat < numel; ++flat) {
    int64_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) offset += index[k] * strides[k];
    std::memcpy(out.data() + static_cast<size_t>(offset) * elem, data.data() + flat * elem, elem);
    for (size_t k = sizes.size(); k-- > 0;) {  // next row-major index
      if (++index[k] < sizes[k]) break;
      index[k] = 0;
    }
  }
  data.swap(out);
}

// One input as read from an SME2IN01 file (runners/inputs.py writes them).
struct FileInput {
  uint8_t kind = 0;  // 0 none, 1 tensor, 2 int, 3 double, 4 bool
  ScalarType type = ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> data;
  int64_t i = 0;
  double d = 0;
  bool b = false;
};

std::vector<FileInput> read_inputs_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open inputs file '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](void* out, size_t n, const char* what) {
    if (buf.size() - pos < n) fail("inputs file '" + path + "' is truncated (reading " + what + ")");
    std::memcpy(out, buf.data() + pos, n);
    pos += n;
  };
  char magic[8];
  take(magic, 8, "the header");
  if (std::memcmp(magic, "SME2IN01", 8) != 0) fail("inputs file '" + path + "' is not an SME2IN01 file");
  uint32_t count = 0;
  take(&count, 4, "the input count");
  if (count > 4096) fail("inputs file '" + path + "' claims " + std::to_string(count) + " inputs");
  std::vector<FileInput> inputs(count);
  for (auto& in : inputs) {
    take(&in.kind, 1, "an input kind");
    if (in.kind == 1) {
      uint8_t st = 0, ndim = 0, reserved = 0;
      take(&st, 1, "a dtype");
      take(&ndim, 1, "a rank");
      take(&reserved, 1, "a reserved byte");
      in.type = static_cast<ScalarType>(st);
      in.sizes.resize(ndim);
      for (auto& sz : in.sizes) take(&sz, 8, "a size");
      uint64_t nbytes = 0;
      take(&nbytes, 8, "a byte count");
      if (nbytes > buf.size() - pos) fail("inputs file '" + path + "' is truncated (tensor data)");
      in.data.assign(buf.begin() + pos, buf.begin() + pos + nbytes);
      pos += nbytes;
    } else if (in.kind == 2) {
      take(&in.i, 8, "an int");
    } else if (in.kind == 3) {
      take(&in.d, 8, "a double");
    } else if (in.kind == 4) {
      uint8_t v = 0;
      take(&v, 1, "a bool");
      in.b = v != 0;
    } else if (in.kind != 0) {
      fail("inputs file '" + path + "' has an unknown input kind " + std::to_string(in.kind));
    }
  }
  return inputs;
}

// The inputs of one method call: buffers and TensorImpls that outlive the Method's use of them,
// and the values to set. They are set again before every execution: set_input copies a tensor
// into planned memory, which the memory planner may reuse for intermediates once the input is
// dead, so a second execute() would otherwise read garbage (fatal for token ids; silently
// different work for anything else).
struct Inputs {
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<TensorImpl::SizesType>> sizes;
  std::vector<std::vector<TensorImpl::DimOrderType>> dim_order;
  std::vector<std::vector<TensorImpl::StridesType>> strides;
  std::vector<std::unique_ptr<TensorImpl>> impls;
  std::vector<std::pair<size_t, EValue>> values;
};

void reset_inputs(Method& method, const Inputs& in, const std::string& when) {
  for (const auto& [index, value] : in.values) {
    Error err = method.set_input(value, index);
    if (err != Error::Ok) fail("set_input " + std::to_string(index) + " failed " + when + ": " + error_name(err) + runtime_said());
  }
}

// Tensor inputs are all ones unless `file` gives them; non-tensor inputs (ints, doubles, bools)
// keep the values the program was exported with unless `file` gives them.
void set_inputs(Method& method, const std::string& method_name, const std::vector<FileInput>* file, Inputs& in) {
  auto meta = method.method_meta();
  if (file != nullptr && file->size() != meta.num_inputs())
    fail("the inputs file gives " + std::to_string(file->size()) + " input(s), method '" + method_name +
         "' takes " + std::to_string(meta.num_inputs()));
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    const std::string which = "input " + std::to_string(i) + " of method '" + method_name + "'";
    auto tag = meta.input_tag(i);
    if (!tag.ok()) fail("cannot read the tag of " + which);
    const FileInput* given = (file != nullptr && (*file)[i].kind != 0) ? &(*file)[i] : nullptr;
    if (*tag != Tag::Tensor) {
      // A scalar input not given keeps the value it was exported with (the Method still wants
      // set_input called for it, or execute() fails with "Input i has not been set").
      // get_input is deprecated for reading metadata, but it is the one way to read the value a
      // scalar input was exported with (MethodMeta carries only its tag).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      EValue value = method.get_input(i);
#pragma GCC diagnostic pop
      if (given != nullptr) {
        static const char* kinds[] = {"none", "a tensor", "an int", "a double", "a bool"};
        if (given->kind == 2 && *tag == Tag::Int) value = EValue(given->i);
        else if (given->kind == 3 && *tag == Tag::Double) value = EValue(given->d);
        else if (given->kind == 4 && *tag == Tag::Bool) value = EValue(given->b);
        else fail("the inputs file gives " + which + " as " + kinds[given->kind] + ", the method expects " +
                  (*tag == Tag::Int ? "an int" : *tag == Tag::Double ? "a double" : *tag == Tag::Bool ? "a bool"
                                                                                     : "another kind of value"));
      }
      Error err = method.set_input(value, i);
      if (err != Error::Ok) fail("set_input failed for " + which + ": " + error_name(err) + runtime_said());
      in.values.emplace_back(i, value);
      continue;
    }
    auto info = meta.input_tensor_meta(i);
    if (!info.ok()) fail("cannot read the metadata of " + which);
    auto s = info->sizes();
    auto d = info->dim_order();
    std::vector<int64_t> expected(s.begin(), s.end());
    if (given != nullptr) {
      if (given->kind != 1) fail("the inputs file gives " + which + " as a scalar, the method expects a tensor " +
                                 shape_str(info->scalar_type(), expected));
      if (given->type != info->scalar_type() || given->sizes.size() != expected.size())
        fail("the inputs file gives " + which + " as " + shape_str(given->type, given->sizes) +
             ", the method expects " + shape_str(info->scalar_type(), expected));
      in.sizes.emplace_back(given->sizes.begin(), given->sizes.end());
      size_t numel = 1;
      for (auto v : given->sizes) numel *= static_cast<size_t>(v);
      if (numel * executorch::runtime::elementSize(given->type) != given->data.size())
        fail("the inputs file's data for " + which + " has " + std::to_string(given->data.size()) +
             " bytes, " + shape_str(given->type, given->sizes) + " needs " +
             std::to_string(numel * executorch::runtime::elementSize(given->type)));
      in.data.push_back(given->data);
    } else {
      in.sizes.emplace_back(s.begin(), s.end());
      in.data.emplace_back(info->nbytes());
      size_t n = info->nbytes() / executorch::runtime::elementSize(info->scalar_type());
      if (!fill_ones(info->scalar_type(), in.data.back().data(), n))
        fail(which + " has dtype " + executorch::runtime::toString(info->scalar_type()) +
             ", which the runner cannot fill with ones; give it in an inputs file");
    }
    in.dim_order.emplace_back(d.begin(), d.end());
    in.strides.emplace_back(s.size());
    if (executorch::runtime::dim_order_to_stride(
            in.sizes.back().data(), in.dim_order.back().data(), s.size(), in.strides.back().data()) != Error::Ok)
      fail("bad dim order for " + which);
    if (given != nullptr) to_dim_order(in.data.back(), in.sizes.back(), in.strides.back(),
                                       executorch::runtime::elementSize(given->type));
    in.impls.push_back(std::make_unique<TensorImpl>(
        info->scalar_type(), s.size(), in.sizes.back().data(), in.data.back().data(),
        in.dim_order.back().data(), in.strides.back().data()));
    EValue value(executorch::aten::Tensor(in.impls.back().get()));
    Error err = method.set_input(value, i);
    in.values.emplace_back(i, value);
    if (err != Error::Ok) {
      std::vector<int64_t> got(in.sizes.back().begin(), in.sizes.back().end());
      fail("set_input failed for " + which + " (" + shape_str(info->scalar_type(), got) + ", the method expects " +
           shape_str(info->scalar_type(), expected) + "): " + error_name(err) + runtime_said());
    }
  }
}

// The element `off` elements into a real-valued tensor (Half and BFloat16 too), as a double in
// `v`; false for other types.
bool element_as_double(const executorch::aten::Tensor& t, int64_t off, double& v) {
  switch (t.scalar_type()) {
#define SME2FARM_READ(ctype, stype) \
  case ScalarType::stype: v = static_cast<double>(t.const_data_ptr<ctype>()[off]); return true;
    ET_FORALL_REALHBBF16_TYPES(SME2FARM_READ)
#undef SME2FARM_READ
    default: return false;
  }
}

// --print_output: every output of the last execution, elements in logical (row-major) order
// whatever the tensor's dim order, as "Output i: <dtype> [sizes] v0 v1 ..." (at most 1000 values).
void print_outputs(Method& method) {
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const EValue& out = method.get_output(i);
    if (out.isInt()) { std::printf("Output %zu: Int %lld\n", i, static_cast<long long>(out.toInt())); continue; }
    if (out.isDouble()) { std::printf("Output %zu: Double %.9g\n", i, out.toDouble()); continue; }
    if (out.isBool()) { std::printf("Output %zu: Bool %d\n", i, int(out.toBool())); continue; }
    if (!out.isTensor()) { std::printf("Output %zu: (tag %d)\n", i, int(out.tag)); continue; }
    auto t = out.toTensor();
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    std::printf("Output %zu: %s", i, shape_str(t.scalar_type(), sizes).c_str());
    std::vector<int64_t> index(sizes.size(), 0);
    size_t n = std::min<size_t>(t.numel(), 1000);
    for (size_t flat = 0; flat < n; ++flat) {
      int64_t off = 0;
      for (size_t k = 0; k < sizes.size(); ++k) off += index[k] * t.strides()[k];
      double v = 0;   // 0 for a type element_as_double does not read
      element_as_double(t, off, v);
      std::printf(" %.9g", v);
      for (size_t k = sizes.size(); k-- > 0;) {
        if (++index[k] < sizes[k]) break;
        index[k] = 0;
      }
    }
    std::printf("%s\n", static_cast<size_t>(t.numel()) > n ? " ..." : "");
  }
}

// The scalar types the SME2IN01 container carries (runners/inputs.py SCALAR_TYPES): every real
// type, Half, Bool and BFloat16.
bool container_type(ScalarType type) {
  switch (type) {
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Short: case ScalarType::Int:
    case ScalarType::Long: case ScalarType::Half: case ScalarType::Float: case ScalarType::Double:
    case ScalarType::Bool: case ScalarType::BFloat16:
      return true;
    default:
      return false;
  }
}

// --outputs_file: every output of the last execution in the container --inputs_file reads, so one
// codec (runners/inputs.py) reads both. Tensor elements are copied from their strided offsets into
// row-major order (a channels-last output is written in its logical order).
void write_outputs(Method& method, const std::string& path) {
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  put("SME2IN01", 8);
  uint32_t count = static_cast<uint32_t>(method.outputs_size());
  put(&count, 4);
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const EValue& v = method.get_output(i);
    uint8_t kind = 0;
    if (v.isTensor() && container_type(v.toTensor().scalar_type())) {
      auto t = v.toTensor();
      kind = 1;
      put(&kind, 1);
      uint8_t header[3] = {static_cast<uint8_t>(t.scalar_type()), static_cast<uint8_t>(t.dim()), 0};
      put(header, 3);
      std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
      for (int64_t sz : sizes) put(&sz, 8);
      size_t elem = executorch::runtime::elementSize(t.scalar_type());
      uint64_t nbytes = static_cast<uint64_t>(t.numel()) * elem;
      put(&nbytes, 8);
      const auto* base = static_cast<const uint8_t*>(t.const_data_ptr());
      std::vector<int64_t> index(sizes.size(), 0);
      for (size_t flat = 0, numel = static_cast<size_t>(t.numel()); flat < numel; ++flat) {
        int64_t off = 0;
        for (size_t k = 0; k < sizes.size(); ++k) off += index[k] * t.strides()[k];
        put(base + static_cast<size_t>(off) * elem, elem);
        for (size_t k = sizes.size(); k-- > 0;) {  // next row-major index
          if (++index[k] < sizes[k]) break;
          index[k] = 0;
        }
      }
    } else if (v.isInt()) {
      kind = 2;
      int64_t x = v.toInt();
      put(&kind, 1);
      put(&x, 8);
    } else if (v.isDouble()) {
      kind = 3;
      double x = v.toDouble();
      put(&kind, 1);
      put(&x, 8);
    } else if (v.isBool()) {
      kind = 4;
      uint8_t x = v.toBool() ? 1 : 0;
      put(&kind, 1);
      put(&x, 1);
    } else {
      put(&kind, 1);
      std::printf("Output %zu: not written to the outputs file (%s)\n", i,
                  v.isTensor() ? executorch::runtime::toString(v.toTensor().scalar_type()) : "not a tensor or scalar");
    }
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail("cannot write outputs to '" + path + "': " + std::strerror(errno));
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail("short write of outputs to '" + path + "'");
  std::printf("Outputs written to %s (%zu outputs, %zu bytes)\n", path.c_str(), method.outputs_size(), out.size());
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The method and temp allocators: malloc'd as upstream, counting what the runtime asks for.
// The method allocator holds what load_method builds (values, tensors, kernel and delegate
// state); the temp allocator is reset after every kernel call, so its peak is the most scratch
// memory one call held.
class CountingAllocator final : public MallocMemoryAllocator {
 public:
  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    void* p = MallocMemoryAllocator::allocate(size, alignment);
    if (p != nullptr) {
      ++count_;
      total_ += size;
      current_ += size;
      peak_ = std::max(peak_, current_);
    }
    return p;
  }
  void reset() override {
    MallocMemoryAllocator::reset();
    current_ = 0;
  }
  uint64_t count() const { return count_; }
  uint64_t total() const { return total_; }
  uint64_t peak() const { return peak_; }

 private:
  uint64_t count_ = 0, total_ = 0, current_ = 0, peak_ = 0;
};

// Peak resident set size of this program so far, and where it was read. Linux and Android: the
// VmHWM line of /proc/self/status (kilobytes), the high-water mark of this process image's own
// memory. Not getrusage there: Linux carries ru_maxrss across execve, so a runner started by a
// large parent (a Python agent forking or vfork-spawning it) would report the parent's RSS (a
// 466 MB "peak" for a 7 MB runner was measured that way). Elsewhere (macOS), and where /proc is
// unreadable: getrusage's ru_maxrss (bytes on macOS, kilobytes on Linux). -1 when both fail.
long long peak_rss_bytes(const char** source = nullptr) {
#if defined(__linux__)
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtoll(line + 6, nullptr, 10);
    std::fclose(f);
    if (kb >= 0) {
      if (source != nullptr) *source = "/proc/self/status VmHWM";
      return kb * 1024;
    }
  }
#endif
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  if (source != nullptr) *source = "getrusage(RUSAGE_SELF).ru_maxrss";
#if defined(__APPLE__)
  return static_cast<long long>(usage.ru_maxrss);
#else
  return static_cast<long long>(usage.ru_maxrss) * 1024;
#endif
}

struct MemoryFigures {
  long long peak_rss_after_load = -1;
  std::vector<size_t> planned;
  const CountingAllocator* method_allocator = nullptr;
  const CountingAllocator* temp_allocator = nullptr;
  double recording_us = 0;  // time spent reading the RSS and writing the file (printed, for bench/)
};

// --memory_file: one JSON object. runtime_allocated_bytes = planned buffers + what the method
// allocator handed out + the temp allocator's peak; memory a delegate mallocs itself (XNNPACK's
// packed weights and workspace) is not in it, only in the peak RSS.
void write_memory(const MemoryFigures& m, const std::string& path) {
  auto t0 = std::chrono::steady_clock::now();
  unsigned long long planned_total = 0;
  std::string planned = "[";
  for (size_t i = 0; i < m.planned.size(); ++i) {
    planned_total += m.planned[i];
    planned += (i ? ", " : "") + std::to_string(m.planned[i]);
  }
  planned += "]";
  const unsigned long long method_bytes = m.method_allocator->total(), temp_peak = m.temp_allocator->peak();
  const char* source = "none";
  const long long peak = peak_rss_bytes(&source);
  auto opt = [](long long v) { return v < 0 ? std::string("null") : std::to_string(v); };
  std::string json = "{\"peak_rss_bytes\": " + opt(peak) +
                     ", \"peak_rss_after_load_bytes\": " + opt(m.peak_rss_after_load) +
                     ", \"rss_source\": \"" + source + "\"" +
                     ", \"planned_buffers_bytes\": " + planned +
                     ", \"planned_bytes\": " + std::to_string(planned_total) +
                     ", \"method_allocator_bytes\": " + std::to_string(method_bytes) +
                     ", \"method_allocator_allocations\": " + std::to_string(m.method_allocator->count()) +
                     ", \"temp_allocator_peak_bytes\": " + std::to_string(temp_peak) +
                     ", \"temp_allocator_allocations\": " + std::to_string(m.temp_allocator->count()) +
                     ", \"runtime_allocated_bytes\": " + std::to_string(planned_total + method_bytes + temp_peak) +
                     "}\n";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail("cannot write memory figures to '" + path + "': " + std::strerror(errno));
  bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail("short write of memory figures to '" + path + "'");
  double us = m.recording_us + std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("Peak RSS: %lld bytes; runtime allocated %llu bytes (planned %llu, method allocator %llu, "
              "temp peak %llu); written to %s (recording took %.1f us)\n", peak, planned_total + method_bytes + temp_peak,
              planned_total, method_bytes, temp_peak, path.c_str(), us);
}

// ---- LLM mode: prefill then decode, for tokens [1, S] int64 + input_pos [1] or cache_position [S] int64 ----

struct LlmInputs {
  std::vector<int64_t> tokens;     // the prompt (token id 1 throughout); [0] also feeds each decode call
  std::vector<int64_t> generated;  // the tokens the last generation decoded (greedy)
  bool greedy = true;              // false: output 0 is no real-valued tensor, decode feeds token 1
  bool positions = false;          // true: the second input takes one position per token, else the start
  std::vector<int64_t> pos;        // [start] or [start, start+1, ..., start+n-1]
  TensorImpl::SizesType token_sizes[2] = {1, 1};
  TensorImpl::DimOrderType token_dim_order[2] = {0, 1};
  TensorImpl::StridesType token_strides[2] = {1, 1};
  TensorImpl::SizesType pos_sizes[1] = {1};
  TensorImpl::DimOrderType pos_dim_order[1] = {0};
  TensorImpl::StridesType pos_strides[1] = {1};
};

std::string describe_inputs(const MethodMeta& meta) {
  std::string out;
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    out += i ? ", " : "";
    auto tag = meta.input_tag(i);
    auto info = meta.input_tensor_meta(i);
    if (tag.ok() && *tag == Tag::Tensor && info.ok()) {
      std::vector<int64_t> sizes(info->sizes().begin(), info->sizes().end());
      out += shape_str(info->scalar_type(), sizes);
    } else {
      out += "a non-tensor value";
    }
  }
  return out.empty() ? "no inputs" : out;
}

// The most tokens one call takes (the token input's upper bound), or fail naming the signature.
// Sets `positions` as ExecuTorch's LLM runner decides (populate_start_pos_or_cache_position):
// a second input declared with one element takes the start position, one declared with S
// elements the call's positions.
long llm_max_tokens(const MethodMeta& meta, const std::string& method_name, bool& positions) {
  auto is_long = [&](size_t i, size_t rank) {
    auto tag = meta.input_tag(i);
    auto info = meta.input_tensor_meta(i);
    return tag.ok() && *tag == Tag::Tensor && info.ok() && info->scalar_type() == ScalarType::Long &&
           info->sizes().size() == rank && (rank != 2 || info->sizes()[0] == 1);
  };
  const std::string shape = "LLM mode needs method '" + method_name + "' to take tokens Long [1, S] and either "
                            "input_pos Long [1] or cache_position Long [S]; it takes ";
  if (meta.num_inputs() != 2 || !is_long(0, 2) || !is_long(1, 1)) fail(shape + describe_inputs(meta));
  const long s = static_cast<long>(meta.input_tensor_meta(0)->sizes()[1]);
  const long n = static_cast<long>(meta.input_tensor_meta(1)->sizes()[0]);
  if (s < 1) fail("LLM mode needs method '" + method_name + "' to take at least one token per call; it takes " +
                  describe_inputs(meta));
  if (n != 1 && n != s) fail(shape + describe_inputs(meta));
  positions = n != 1;
  return s;
}

// The cache length the program declares through the ExecuTorch LLM export's constant methods
// (get_max_context_len, else get_max_seq_len); -1 when it declares none.
long llm_cache_len(Program& program) {
  for (const char* name : {"get_max_context_len", "get_max_seq_len"}) {
    auto meta = program.method_meta(name);
    if (!meta.ok() || meta->num_outputs() != 1) continue;
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<Span<uint8_t>> spans;
    for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
      buffers.emplace_back(static_cast<size_t>(meta->memory_planned_buffer_size(i).get()));
      spans.emplace_back(buffers.back().data(), buffers.back().size());
    }
    HierarchicalAllocator planned({spans.data(), spans.size()});
    MallocMemoryAllocator method_allocator;
    MemoryManager memory(&method_allocator, &planned);
    auto method = program.load_method(name, &memory);
    if (!method.ok() || method->execute() != Error::Ok) continue;
    const EValue& out = method->get_output(0);
    if (out.isInt() && out.toInt() > 0) return static_cast<long>(out.toInt());
  }
  return -1;
}

// One call: `n` tokens at input_pos `pos`, bracketed by a marker event in the call's Execute block.
double llm_call(Method& method, RoutingTracer& tracer, LlmInputs& in, long n, long pos, bool prefill,
                const std::string& when) {
  auto t0 = std::chrono::steady_clock::now();
  et_timestamp_t ticks0 = et_pal_current_ticks();
  in.token_sizes[1] = static_cast<TensorImpl::SizesType>(n);
  in.token_strides[0] = static_cast<TensorImpl::StridesType>(n);
  const long n_pos = in.positions ? n : 1;
  for (long i = 0; i < n_pos; ++i) in.pos[static_cast<size_t>(i)] = pos + i;
  in.pos_sizes[0] = static_cast<TensorImpl::SizesType>(n_pos);
  TensorImpl tokens(ScalarType::Long, 2, in.token_sizes, in.tokens.data(), in.token_dim_order, in.token_strides);
  TensorImpl position(ScalarType::Long, 1, in.pos_sizes, in.pos.data(), in.pos_dim_order, in.pos_strides);
  Error err = method.set_input(EValue(executorch::aten::Tensor(&tokens)), 0);
  if (err != Error::Ok)
    fail("set_input of " + std::to_string(n) + " token(s) failed " + when + ": " + error_name(err) + runtime_said() +
         (n > 1 ? " (is the token input's length dynamic?)" : ""));
  err = method.set_input(EValue(executorch::aten::Tensor(&position)), 1);
  if (err != Error::Ok)
    fail("set_input of " + std::string(in.positions ? "cache_position" : "input_pos") + " failed " + when + ": " +
         error_name(err) + runtime_said());
  err = method.execute();
  if (err != Error::Ok) fail("execution failed " + when + ": " + error_name(err) + runtime_said());
  EventTracer* target = tracer.target();
  EventTracerEntry marker = target->start_profiling(prefill ? "sme2farm::llm_prefill" : "sme2farm::llm_decode",
                                                    static_cast<ChainID>(n), static_cast<DebugHandle>(pos));
  marker.start_time = ticks0;
  target->end_profiling(marker);
  return ms_since(t0);
}

// The greedy next token: the index of the largest value along the last dimension of output 0 at
// its last position (logits [1, V], [1, 1, V] or [1, S, V]), as a temperature-0 generation picks
// it; -1 when output 0 is not a real-valued tensor. Read after Method::execute, outside the times.
int64_t greedy_next(const Method& method) {
  if (method.outputs_size() < 1 || !method.get_output(0).isTensor()) return -1;
  const auto t = method.get_output(0).toTensor();
  if (t.dim() < 1 || t.numel() == 0) return -1;
  const size_t last = static_cast<size_t>(t.dim() - 1);
  int64_t base = 0;
  for (size_t k = 0; k < last; ++k) base += (t.size(k) - 1) * t.strides()[k];
  int64_t best = -1;
  double best_v = 0;
  for (int64_t j = 0; j < t.size(last); ++j) {
    double v = 0;
    if (!element_as_double(t, base + j * t.strides()[last], v)) return -1;
    if (best < 0 || v > best_v) best = j, best_v = v;
  }
  return best;
}

// One generation: prefill `prompt` tokens in calls of at most `chunk` tokens (their input_pos 0,
// chunk, 2 chunk, ...), then decode `decode` tokens one at a time, each call fed the greedy token
// of the one before. Returns (prefill ms, decode ms).
std::pair<double, double> llm_generate(Method& method, RoutingTracer& tracer, LlmInputs& in, long prompt, long decode,
                                       long chunk, const std::string& when) {
  in.tokens[0] = 1;   // every generation the same prompt
  in.generated.clear();
  double prefill = 0;
  for (long pos = 0; pos < prompt; pos += chunk)
    prefill += llm_call(method, tracer, in, std::min(chunk, prompt - pos), pos, true,
                        "in the prefill of " + when + (pos ? " at input_pos " + std::to_string(pos) : ""));
  double decoding = 0;
  for (long i = 0; i < decode; ++i) {
    const int64_t next = in.greedy ? greedy_next(method) : -1;
    in.greedy = next >= 0;
    in.tokens[0] = next >= 0 ? next : 1;
    in.generated.push_back(in.tokens[0]);
    decoding += llm_call(method, tracer, in, 1, prompt + i, false,
                         "decoding token " + std::to_string(i) + " of " + when);
  }
  return {prefill, decoding};
}

#if defined(SME2FARM_HIDE_LIBRARY)
// What libsme2farm_hide did, in one line the farm reads ("SME2 hiding: <how>; XNNPACK saw SME s
// SME2 t ..."), or the off arm's one-sentence failure, before any model is loaded.
void report_sme2_hiding() {
  const struct sme2farm_hide_report* r = sme2farm_hide_report();
  char os[160];
  std::snprintf(os, sizeof os, "OS: SME %d SME2 %d through %s", r->os_sme, r->os_sme2, r->os_source);
  if (r->status == SME2FARM_HIDE_FAILED)
    fail(std::string("SME2 cannot be hidden in this build: ") + r->detail + " (" + os +
         "), so this SME2-off run stops before loading the model; compare with a two-build pair instead "
         "(python -m sme2farm.runners.recipe, its SME2-off build made with XNNPACK_ENABLE_ARM_SME2=OFF)");
  if (r->status == SME2FARM_HIDE_NOT_ASKED && !r->layout_ok) {
    std::printf("SME2 hiding: not asked (SME2FARM_HIDE_SME2 unset); what XNNPACK saw is not known: %s; %s; "
                "the SME2-off arm of this build would fail\n", r->detail, os);
    return;
  }
  const char* how = "not asked (SME2FARM_HIDE_SME2 unset)";
  if (r->status == SME2FARM_HIDE_HIDDEN) how = "SME2 hidden through cpuinfo_isa before XNNPACK initialised";
  if (r->status == SME2FARM_HIDE_NOTHING) how = "nothing to hide (the CPU has no SME)";
  if (r->status == SME2FARM_HIDE_BY_GETAUXVAL)
    how = "SME2 hidden through getauxval only (cpuinfo initialised before libsme2farm_hide)";
  std::printf("SME2 hiding: %s; XNNPACK saw SME %d SME2 %d (SME length %u); cpuinfo read SME %d SME2 %d; %s; "
              "cpuinfo_isa layout %s\n", how, r->shown_sme, r->shown_sme2, r->shown_smelen, r->read_sme,
              r->read_sme2, os, r->layout_ok ? "agrees with the OS" : "not checked");
}
#endif

} // namespace

int main(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  std::printf("sme2farm runner (executor_runner-compatible), ExecuTorch %s\n", SME2FARM_EXECUTORCH_VERSION);
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(emit_log, __FILE__));
  executorch::runtime::runtime_init();
#if defined(__linux__) && defined(__aarch64__)
  {
    unsigned long real = __getauxval(AT_HWCAP2), seen = getauxval(AT_HWCAP2);
    std::printf("HWCAP2: SME %d SME2 %d; as the libraries see it: SME %d SME2 %d%s\n", int((real >> 23) & 1),
                int((real >> 37) & 1), int((seen >> 23) & 1), int((seen >> 37) & 1),
                seen != real ? " (hidden by SME2FARM_HIDE_SME2=1)" : "");
  }
#endif
#if defined(SME2FARM_HIDE_LIBRARY)
  report_sme2_hiding();
#endif

  if (opt.cpu_threads > 0) {
    auto* pool = executorch::extension::threadpool::get_threadpool();
    if (pool == nullptr || !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(opt.cpu_threads)))
      fail("cannot set the thread pool to " + std::to_string(opt.cpu_threads) + " threads");
  }
  if (auto* pool = executorch::extension::threadpool::get_threadpool())
    std::printf("Threads: %zu\n", pool->get_thread_count());

  std::vector<FileInput> file_inputs;
  if (!opt.inputs_file.empty()) file_inputs = read_inputs_file(opt.inputs_file);

  auto loader = FileDataLoader::from(opt.model_path.c_str());
  if (!loader.ok()) fail("cannot open model '" + opt.model_path + "': " + error_name(loader.error()));
  auto program = Program::load(&loader.get());
  if (!program.ok()) fail("cannot load program '" + opt.model_path + "': not a valid .pte (" +
                          error_name(program.error()) + ")" + runtime_said());
  auto meta = program->method_meta(opt.method_name.c_str());
  if (!meta.ok()) {
    std::string names;
    for (size_t i = 0; i < program->num_methods(); ++i) {
      auto name = program->get_method_name(i);
      if (name.ok()) names += std::string(names.empty() ? "" : ", ") + *name;
    }
    fail("the model has no method '" + opt.method_name + "' (it has: " + names + ")");
  }

  // Planned memory: one malloc'd buffer per memory-planned arena, as upstream.
  std::vector<std::vector<uint8_t>> planned_buffers;
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    planned_buffers.emplace_back(static_cast<size_t>(meta->memory_planned_buffer_size(i).get()));
    planned_spans.emplace_back(planned_buffers.back().data(), planned_buffers.back().size());
  }
  HierarchicalAllocator planned_memory({planned_spans.data(), planned_spans.size()});
  CountingAllocator method_allocator, temp_allocator;
  MemoryManager memory_manager(&method_allocator, &planned_memory, &temp_allocator);
  MemoryFigures memory{-1, {}, &method_allocator, &temp_allocator};
  for (const auto& b : planned_buffers) memory.planned.push_back(b.size());

  ETDumpGen etdump, warmup_etdump;
  RoutingTracer tracer(&etdump);
  auto method = program->load_method(opt.method_name.c_str(), &memory_manager, &tracer);
  if (!method.ok()) {
    if (!g_missing_operators.empty()) {
      std::string ops;
      bool llm_custom_ops = false;
      for (const auto& op : g_missing_operators) {
        ops += (ops.empty() ? "" : ", ") + op;
        llm_custom_ops = llm_custom_ops || op.rfind("llama::", 0) == 0;
      }
      // ExecuTorch's LLM custom ops (extension/llm/custom_ops): the pip wheel ships them only in
      // custom_ops_aot_lib, which needs libtorch; say which export runs here and which build runs this one.
      fail("this runner has no kernel for operator(s) " + ops + " needed by method '" + opt.method_name +
           "' (" + error_name(method.error()) + ")" +
           (llm_custom_ops ? std::string("; these are ExecuTorch's LLM custom ops (extension/llm/custom_ops), which "
                                         "this runner build does not carry. A program this runner runs: export "
                                         "without them (optimum-executorch: without --use_custom_sdpa and "
                                         "--use_custom_kv_cache; ExecuTorch's export_llama: without "
                                         "--use_sdpa_with_kv_cache). A build that runs this one: "
                                         "python -m sme2farm.runners.recipe from an ExecuTorch checkout, which "
                                         "builds the custom_ops library into upstream executor_runner (which has "
                                         "no LLM mode: one forward call per iteration)")
                           : std::string()));
    }
    fail("cannot load method '" + opt.method_name + "': " + error_name(method.error()) + runtime_said());
  }

  {
    auto t0 = std::chrono::steady_clock::now();
    memory.peak_rss_after_load = peak_rss_bytes();
    memory.recording_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }

  const bool llm = opt.llm_prompt != -1;
  LlmInputs llm_inputs;
  if (llm) {
    long max_tokens = llm_max_tokens(*meta, opt.method_name, llm_inputs.positions);
    long cache = llm_cache_len(*program);
    // Past one call, the prompt is split; only a declared cache says how far positions may go.
    if (opt.llm_prompt > max_tokens && cache <= 0)
      fail("a prompt of " + std::to_string(opt.llm_prompt) + " tokens is longer than the " +
           std::to_string(max_tokens) + " tokens method '" + opt.method_name + "' takes in one call, and the " +
           "program declares no cache length (get_max_context_len) to prefill it in several calls");
    if (cache > 0 && opt.llm_prompt + opt.llm_decode > cache)
      fail("a prompt of " + std::to_string(opt.llm_prompt) + " tokens and " + std::to_string(opt.llm_decode) +
           " decoded run past the cache: the program holds " + std::to_string(cache) +
           " positions (prompt + decode must be at most that)");
    llm_inputs.tokens.assign(static_cast<size_t>(std::min(opt.llm_prompt, max_tokens)), 1);
    llm_inputs.pos.assign(llm_inputs.positions ? llm_inputs.tokens.size() : 1, 0);
    std::printf("LLM mode: prompt %ld tokens, decode %ld tokens, at most %ld tokens per call, cache %s\n",
                opt.llm_prompt, opt.llm_decode, max_tokens,
                cache > 0 ? (std::to_string(cache) + " positions").c_str() : "length not declared");
    std::printf("LLM positions: %s\n", llm_inputs.positions
                    ? "cache_position [S], the positions start .. start+S-1 of each call's tokens (as ExecuTorch's "
                      "LLM runner feeds a second input declared with S elements)"
                    : "input_pos [1], the start position of each call (as ExecuTorch's LLM runner feeds a second "
                      "input declared with one element)");
    const long prefill_calls = (opt.llm_prompt + max_tokens - 1) / max_tokens;
    if (prefill_calls > 1) std::printf("Prefill in %ld calls of at most %ld tokens\n", prefill_calls, max_tokens);
    if (opt.warmup > 0) {
      tracer.route_to(&warmup_etdump);
      for (long i = 0; i < opt.warmup; ++i) {
        auto [p, d] = llm_generate(*method, tracer, llm_inputs, opt.llm_prompt, opt.llm_decode, max_tokens,
                                   "warm-up " + std::to_string(i));
        std::printf("Warm-up %ld of %ld: %f ms\n", i + 1, opt.warmup, p + d);
      }
      tracer.route_to(&etdump);
    }
    double total_ms = 0;
    for (long i = 0; i < opt.num_executions; ++i) {
      auto [p, d] = llm_generate(*method, tracer, llm_inputs, opt.llm_prompt, opt.llm_decode, max_tokens,
                                 "execution " + std::to_string(i));
      total_ms += p + d;
      std::printf("Iteration %ld of %ld: %f ms (prefill %ld tokens %f ms, decode %ld tokens %f ms)\n", i + 1,
                  opt.num_executions, p + d, opt.llm_prompt, p, opt.llm_decode, d);
    }
    std::printf("Model executed successfully %ld time(s) in %f ms.\n", opt.num_executions, total_ms);
    std::string fed;
    for (int64_t t : llm_inputs.generated) fed += " " + std::to_string(t);
    if (llm_inputs.greedy)
      std::printf("Decode fed (greedy, the last generation):%s\n", fed.c_str());
    else
      std::printf("Decode fed token 1 each step: output 0 is not a real-valued tensor to pick from\n");
  }

  Inputs inputs;
  if (!llm) set_inputs(*method, opt.method_name, opt.inputs_file.empty() ? nullptr : &file_inputs, inputs);

  if (!llm && opt.warmup > 0) {
    tracer.route_to(&warmup_etdump);
    for (long i = 0; i < opt.warmup; ++i) {
      reset_inputs(*method, inputs, "before warm-up " + std::to_string(i));
      auto t0 = std::chrono::steady_clock::now();
      Error err = method->execute();
      if (err != Error::Ok) fail("warm-up execution " + std::to_string(i) + " failed: " + error_name(err) + runtime_said());
      std::printf("Warm-up %ld of %ld: %f ms\n", i + 1, opt.warmup, ms_since(t0));
    }
    tracer.route_to(&etdump);
  }

  double total_ms = 0;
  for (long i = 0; i < (llm ? 0 : opt.num_executions); ++i) {
    reset_inputs(*method, inputs, "before execution " + std::to_string(i));
    auto t0 = std::chrono::steady_clock::now();
    Error err = method->execute();
    double ms = ms_since(t0);
    if (err != Error::Ok) fail("execution " + std::to_string(i) + " failed: " + error_name(err) + runtime_said());
    total_ms += ms;
    std::printf("Iteration %ld of %ld: %f ms\n", i + 1, opt.num_executions, ms);
  }
  if (!llm) std::printf("Model executed successfully %ld time(s) in %f ms.\n", opt.num_executions, total_ms);
  if (opt.print_output) print_outputs(*method);
  if (!opt.outputs_file.empty()) write_outputs(*method, opt.outputs_file);

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
  if (!opt.memory_file.empty()) write_memory(memory, opt.memory_file);
  std::fflush(stdout);
  return 0;
}
