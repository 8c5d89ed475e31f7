#pragma once
// Control flow of the generated wrapper (Inductor's wrapper codegen_conditional /
// codegen_while_loop): the drivers of ONNX Loop and Scan. A subgraph is a function of the wrapper
// with the calling convention of kiln_run's body: it reads TensorArgs and returns its outputs in
// TensorArgs whose data it allocated (aligned, released with std::free). The drivers hand each
// iteration's outputs to the next iteration as its inputs (no copies of loop-carried values), stack
// scan outputs, and return their results the same way, so the caller adopts their storage.
//
// Tests: the ONNX node suite (test_loop*, test_scan*, test_range_*_expanded), tests/unit/driver.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln_rt.h"
#include "kiln_rt_error.h"

namespace kiln_rt {

inline size_t dtype_size(int32_t code) {
  switch (code) {
    case 2:
    case 3:
    case 9:
      return 1;
    case 4:
    case 5:
    case 10:
    case 16:
      return 2;
    case 1:
    case 6:
    case 12:
      return 4;
    default:
      return 8;
  }
}

inline int64_t numel(const TensorArg& t) {
  int64_t n = 1;
  for (int k = 0; k < t.rank; ++k) n *= t.dims[k];
  return n;
}

inline size_t nbytes(const TensorArg& t) {
  return static_cast<size_t>(numel(t)) * dtype_size(t.dtype);
}

/// A TensorArg for a buffer of the wrapper.
inline TensorArg tensor_arg(const void* data, int32_t dtype, std::initializer_list<int64_t> dims) {
  TensorArg t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(dims.size());
  int k = 0;
  for (int64_t d : dims) t.dims[k++] = d;
  return t;
}

/// A fresh copy of `t` (a result must own its storage; the caller frees it).
inline TensorArg copy_tensor(const TensorArg& t) {
  TensorArg c = t;
  c.data = aligned_alloc_bytes(nbytes(t));
  if (nbytes(t) > 0) std::memcpy(c.data, t.data, nbytes(t));
  return c;
}

/// Tensors a driver owns (intermediate iterations' outputs); freed when it returns or fails.
class OwnedTensors {
 public:
  OwnedTensors() = default;
  OwnedTensors(const OwnedTensors&) = delete;
  OwnedTensors& operator=(const OwnedTensors&) = delete;
  ~OwnedTensors() {
    for (void* p : owned_) std::free(p);
  }
  void own(void* p) { owned_.push_back(p); }
  void release(void* p) {
    for (auto it = owned_.begin(); it != owned_.end(); ++it) {
      if (*it == p) {
        std::free(p);
        owned_.erase(it);
        return;
      }
    }
  }
  /// Hands `p` to the caller.
  void detach(void* p) {
    for (auto it = owned_.begin(); it != owned_.end(); ++it) {
      if (*it == p) {
        owned_.erase(it);
        return;
      }
    }
  }

 private:
  std::vector<void*> owned_;
};

/// Scan outputs stacked along a new axis as iterations produce them; every iteration must give
/// the same shape.
class Stacker {
 public:
  Stacker(const char* node, int index) : node_(node), index_(index) {}
  void push(const TensorArg& t) {
    if (count_ == 0) {
      first_ = t;
    } else if (t.rank != first_.rank || t.dtype != first_.dtype ||
               std::memcmp(t.dims, first_.dims, sizeof(int64_t) * t.rank) != 0) {
      fail("%s: scan output %d has shape %s in iteration %lld but %s in iteration 0", node_, index_,
           dims_str(t.dims, t.rank).c_str(), static_cast<long long>(count_),
           dims_str(first_.dims, first_.rank).c_str());
    }
    const char* p = static_cast<const char*>(t.data);
    data_.insert(data_.end(), p, p + nbytes(t));
    ++count_;
  }
  int64_t count() const { return count_; }
  /// The stacked tensor [count, ...] along `axis` (iteration order reversed when `reverse`);
  /// `empty_shape` gives the element shape when no iteration ran (rank `empty_rank`, dtype).
  TensorArg finish(int axis, bool reverse, int32_t dtype, int empty_rank,
                   const int64_t* empty_dims) const {
    TensorArg element = first_;
    if (count_ == 0) {
      element.dtype = dtype;
      element.rank = empty_rank;
      for (int k = 0; k < empty_rank; ++k) element.dims[k] = empty_dims[k];
    }
    TensorArg out{};
    out.dtype = element.dtype;
    out.rank = element.rank + 1;
    int64_t outer = 1, inner = static_cast<int64_t>(dtype_size(element.dtype));
    for (int k = 0, j = 0; k < out.rank; ++k) {
      if (k == axis) {
        out.dims[k] = count_;
        continue;
      }
      out.dims[k] = element.dims[j];
      (j < axis ? outer : inner) *= element.dims[j];
      ++j;
    }
    out.data = aligned_alloc_bytes(nbytes(out));
    char* dst = static_cast<char*>(out.data);
    for (int64_t t = 0; t < count_; ++t) {
      const char* src = data_.data() + t * outer * inner;
      int64_t slot = reverse ? count_ - 1 - t : t;
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(dst + (o * count_ + slot) * inner, src + o * inner, static_cast<size_t>(inner));
      }
    }
    return out;
  }

 private:
  const char* node_;
  int index_;
  TensorArg first_{};
  int64_t count_ = 0;
  std::vector<char> data_;
};

/// The compile-time facts of a Loop or Scan's results that the drivers need when no iteration
/// runs: per scan output, its dtype and element shape (known at compile time, or 0 for a dim
/// that is not).
struct ScanOutputSpec {
  int32_t dtype;
  int rank;
  int64_t dims[kMaxRank];
  int axis;      // where the iteration axis goes
  bool reverse;  // Scan's output direction
};

/// ONNX Loop. `body(inputs, outputs)` runs one iteration: inputs are the iteration number
/// (int64 scalar), the condition (bool scalar), the carried values, then `captures`; outputs are
/// the condition, the carried values, then one element of each scan output. `max_trip` and
/// `cond` are null when the node omits them. Results: the final carried values, then the
/// stacked scan outputs.
template <typename Body>
inline void run_loop(Body&& body, const char* node, const int64_t* max_trip, const bool* cond,
                     int carried, const TensorArg* initial, int scan_outputs,
                     const ScanOutputSpec* scan_specs, int captures, const TensorArg* captured,
                     TensorArg* results) {
  OwnedTensors owned;
  std::vector<TensorArg> state(initial, initial + carried);  // not owned until iteration 1
  std::vector<Stacker> stacks;
  for (int k = 0; k < scan_outputs; ++k) stacks.emplace_back(node, k);
  int64_t iteration = 0;
  bool keep_going = cond == nullptr || *cond;
  std::vector<TensorArg> inputs(static_cast<size_t>(2 + carried + captures));
  std::vector<TensorArg> outputs(static_cast<size_t>(1 + carried + scan_outputs));
  for (; (max_trip == nullptr || iteration < *max_trip) && keep_going; ++iteration) {
    inputs[0] = tensor_arg(&iteration, 7, {});
    inputs[1] = tensor_arg(&keep_going, 9, {});
    for (int k = 0; k < carried; ++k) inputs[2 + k] = state[k];
    for (int k = 0; k < captures; ++k) inputs[2 + carried + k] = captured[k];
    body(inputs.data(), outputs.data());
    for (const TensorArg& t : outputs) owned.own(t.data);
    if (cond != nullptr) keep_going = *static_cast<const bool*>(outputs[0].data);
    owned.release(outputs[0].data);
    for (int k = 0; k < carried; ++k) {
      owned.release(state[k].data);  // no-op for the initial values
      state[k] = outputs[1 + k];
    }
    for (int k = 0; k < scan_outputs; ++k) {
      stacks[k].push(outputs[1 + carried + k]);
      owned.release(outputs[1 + carried + k].data);
    }
  }
  for (int k = 0; k < carried; ++k) {
    if (iteration == 0) {
      results[k] = copy_tensor(state[k]);
    } else {
      results[k] = state[k];
      owned.detach(state[k].data);
    }
  }
  for (int k = 0; k < scan_outputs; ++k) {
    const ScanOutputSpec& s = scan_specs[k];
    results[carried + k] = stacks[k].finish(0, false, s.dtype, s.rank, s.dims);
  }
}

/// One slice of `t` along `axis` at `index`, copied into `out` (contiguous).
inline TensorArg slice_axis(const TensorArg& t, int axis, int64_t index, std::vector<char>& out) {
  TensorArg s{};
  s.dtype = t.dtype;
  s.rank = t.rank - 1;
  int64_t outer = 1, inner = static_cast<int64_t>(dtype_size(t.dtype));
  for (int k = 0, j = 0; k < t.rank; ++k) {
    if (k == axis) continue;
    s.dims[j++] = t.dims[k];
    (k < axis ? outer : inner) *= t.dims[k];
  }
  out.resize(static_cast<size_t>(outer * inner));
  const char* src = static_cast<const char*>(t.data);
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + o * inner, src + (o * t.dims[axis] + index) * inner,
                static_cast<size_t>(inner));
  }
  s.data = out.data();
  return s;
}

/// The facts of a Scan's scan inputs.
struct ScanInputSpec {
  int axis;
  bool reverse;
};

/// ONNX Scan (opset 9 and later). `body(inputs, outputs)`: inputs are the state values, one
/// slice of each scan input, then `captures`; outputs are the states, then one element of each
/// scan output. Results: the final states, then the stacked scan outputs.
template <typename Body>
inline void run_scan(Body&& body, const char* node, int states, const TensorArg* initial,
                     int scan_inputs, const TensorArg* scanned, const ScanInputSpec* in_specs,
                     int scan_outputs, const ScanOutputSpec* out_specs, int captures,
                     const TensorArg* captured, TensorArg* results) {
  int64_t length = 0;
  for (int k = 0; k < scan_inputs; ++k) {
    int64_t n = scanned[k].dims[in_specs[k].axis];
    if (k == 0) length = n;
    if (n != length) {
      fail("%s: scan input %d has %lld elements along its scan axis, scan input 0 has %lld", node,
           k, static_cast<long long>(n), static_cast<long long>(length));
    }
  }
  OwnedTensors owned;
  std::vector<TensorArg> state(initial, initial + states);
  std::vector<Stacker> stacks;
  for (int k = 0; k < scan_outputs; ++k) stacks.emplace_back(node, k);
  std::vector<std::vector<char>> slices(static_cast<size_t>(scan_inputs));
  std::vector<TensorArg> inputs(static_cast<size_t>(states + scan_inputs + captures));
  std::vector<TensorArg> outputs(static_cast<size_t>(states + scan_outputs));
  for (int64_t t = 0; t < length; ++t) {
    for (int k = 0; k < states; ++k) inputs[k] = state[k];
    for (int k = 0; k < scan_inputs; ++k) {
      int64_t index = in_specs[k].reverse ? length - 1 - t : t;
      inputs[states + k] = slice_axis(scanned[k], in_specs[k].axis, index, slices[k]);
    }
    for (int k = 0; k < captures; ++k) inputs[states + scan_inputs + k] = captured[k];
    body(inputs.data(), outputs.data());
    for (const TensorArg& o : outputs) owned.own(o.data);
    for (int k = 0; k < states; ++k) {
      owned.release(state[k].data);  // no-op for the initial values
      state[k] = outputs[k];
    }
    for (int k = 0; k < scan_outputs; ++k) {
      stacks[k].push(outputs[states + k]);
      owned.release(outputs[states + k].data);
    }
  }
  for (int k = 0; k < states; ++k) {
    if (length == 0) {
      results[k] = copy_tensor(state[k]);
    } else {
      results[k] = state[k];
      owned.detach(state[k].data);
    }
  }
  for (int k = 0; k < scan_outputs; ++k) {
    const ScanOutputSpec& s = out_specs[k];
    results[states + k] = stacks[k].finish(s.axis, s.reverse, s.dtype, s.rank, s.dims);
  }
}

/// Element `b` of `t` along its leading (batch) axis, without a copy.
inline TensorArg batch_element(const TensorArg& t, int64_t b) {
  TensorArg e{};
  e.dtype = t.dtype;
  e.rank = t.rank - 1;
  for (int k = 1; k < t.rank; ++k) e.dims[k - 1] = t.dims[k];
  e.data = static_cast<char*>(t.data) + b * static_cast<int64_t>(nbytes(e));
  return e;
}

/// ONNX Scan 8: states and scan inputs have a leading batch axis (scan axis 1); each batch
/// element is an opset-9 scan, and the results are stacked along the batch axis again.
template <typename Body>
inline void run_scan_batched(Body&& body, const char* node, int states, const TensorArg* initial,
                             int scan_inputs, const TensorArg* scanned,
                             const ScanInputSpec* in_specs, int scan_outputs,
                             const ScanOutputSpec* out_specs, int captures,
                             const TensorArg* captured, TensorArg* results) {
  const int64_t batch = states > 0 ? initial[0].dims[0] : scanned[0].dims[0];
  const int n = states + scan_outputs;
  std::vector<Stacker> stacks;
  for (int k = 0; k < n; ++k) stacks.emplace_back(node, k);
  std::vector<TensorArg> init(static_cast<size_t>(states)), in(static_cast<size_t>(scan_inputs)),
      out(static_cast<size_t>(n));
  for (int64_t b = 0; b < batch; ++b) {
    for (int k = 0; k < states; ++k) init[k] = batch_element(initial[k], b);
    for (int k = 0; k < scan_inputs; ++k) in[k] = batch_element(scanned[k], b);
    run_scan(body, node, states, init.data(), scan_inputs, in.data(), in_specs, scan_outputs,
             out_specs, captures, captured, out.data());
    OwnedTensors owned;
    for (const TensorArg& o : out) owned.own(o.data);
    for (int k = 0; k < n; ++k) stacks[k].push(out[k]);
  }
  for (int k = 0; k < n; ++k) {
    if (k < states) {
      const TensorArg& s = initial[k];
      results[k] = stacks[k].finish(0, false, s.dtype, s.rank - 1, s.dims + 1);
    } else {
      // One batch element's scan output when no element ran: the scan length along its axis,
      // then the element shape known when compiling.
      const ScanOutputSpec& s = out_specs[k - states];
      const int64_t length = scan_inputs > 0 ? scanned[0].dims[1 + in_specs[0].axis] : 0;
      int64_t dims[kMaxRank] = {};
      for (int d = 0, j = 0; d < s.rank + 1; ++d) dims[d] = d == s.axis ? length : s.dims[j++];
      results[k] = stacks[k].finish(0, false, s.dtype, s.rank + 1, dims);
    }
  }
}

}  // namespace kiln_rt
