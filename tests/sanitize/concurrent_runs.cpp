// Runs a model library (built by `kiln compile`) from several threads at once through the C API of
// include/kiln/runtime.h and checks every run's outputs against a run made alone, bit for bit.
// make test-sanitize builds it with ThreadSanitizer and the library with KILN_SANITIZE=thread, so
// a data race in the generated wrapper, its kernels or the runtime (the per-run arena, the
// profile, the weights) is reported (scripts/test_sanitize.sh).
//
// Usage: kiln_concurrent_runs LIBRARY [RUN_THREADS]  (RUN_THREADS: OpenMP threads of each run,
// default 1). Symbolic dims are 2; floating inputs hold a fixed pattern, integer inputs 0.
#include <kiln/runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 4;
constexpr int kRuns = 10;

[[noreturn]] void die(const std::string& what, kiln_status* status) {
  std::fprintf(stderr, "kiln_concurrent_runs: %s: %s\n", what.c_str(),
               status != nullptr ? kiln_status_message(status) : "");
  kiln_status_free(status);
  std::exit(1);
}

/// One input's bytes: dims from the model (symbolic dims 2), values from a fixed pattern.
kiln_tensor make_input(const kiln_value_info& info, std::vector<std::vector<char>>& storage) {
  kiln_tensor t{};
  t.dtype = info.dtype;
  t.rank = info.rank;
  size_t numel = 1;
  for (int k = 0; k < info.rank; ++k) {
    t.dims[k] = info.dims[k] < 0 ? 2 : info.dims[k];
    numel *= static_cast<size_t>(t.dims[k]);
  }
  std::vector<char>& bytes = storage.emplace_back(numel * kiln_dtype_size(info.dtype) + 1, 0);
  if (info.dtype == KILN_FLOAT32) {
    auto* values = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < numel; ++i) values[i] = static_cast<float>(i % 17) / 8.0f - 1.0f;
  }
  t.data = bytes.data();
  return t;
}

/// The outputs' bytes, concatenated; frees the outputs.
std::vector<char> collect(std::vector<kiln_tensor>& outputs) {
  std::vector<char> all;
  for (kiln_tensor& o : outputs) {
    size_t numel = 1;
    for (int k = 0; k < o.rank; ++k) numel *= static_cast<size_t>(o.dims[k]);
    const char* p = static_cast<const char*>(o.data);
    all.insert(all.end(), p, p + numel * kiln_dtype_size(o.dtype));
    kiln_free(o.data);
    o = kiln_tensor{};
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kiln_concurrent_runs LIBRARY [RUN_THREADS]\n");
    return 2;
  }
  kiln_options options = kiln_default_options();
  options.threads = argc > 2 ? std::atoi(argv[2]) : 1;
  kiln_model* model = nullptr;
  if (kiln_status* s = kiln_model_load(argv[1], &options, &model)) die(argv[1], s);
  std::vector<std::vector<char>> storage;
  std::vector<kiln_tensor> inputs;
  for (size_t i = 0; i < kiln_model_input_count(model); ++i) {
    kiln_value_info info;
    if (kiln_status* s = kiln_model_input_info(model, i, &info)) die("input info", s);
    inputs.push_back(make_input(info, storage));
  }
  const size_t output_count = kiln_model_output_count(model);
  std::vector<kiln_tensor> ref(output_count);
  if (kiln_status* s = kiln_model_run(model, inputs.data(), inputs.size(), ref.data(), ref.size()))
    die("the first run", s);
  const std::vector<char> reference = collect(ref);

  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        std::vector<kiln_tensor> out(output_count);
        if (kiln_status* s =
                kiln_model_run(model, inputs.data(), inputs.size(), out.data(), out.size()))
          die("a concurrent run", s);
        mismatches[t] += collect(out) != reference;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  kiln_model_free(model);
  int total = 0;
  for (int m : mismatches) total += m;
  if (total != 0) {
    std::fprintf(stderr, "kiln_concurrent_runs: %d of %d concurrent runs differ from a run alone\n",
                 total, kThreads * kRuns);
    return 1;
  }
  std::printf("%s: %d threads x %d runs, outputs identical to a run alone\n", argv[1], kThreads,
              kRuns);
  return 0;
}
