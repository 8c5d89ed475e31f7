#include "codegen/cuda/host_fallback.h"

#include <optional>
#include <string_view>
#include <variant>

namespace kiln::codegen {

std::optional<std::string_view> cuda_host_fallback(const ir::LibraryCall& call) {
  using Reason = std::optional<std::string_view>;
  return std::visit(
      ir::Overloaded{
          // Matrix products run on cuBLASLt and convolutions on cuDNN (codegen/cuda/
          // cuda_matmul.h, cuda_conv.h); GEMM and convolution choices (CPU templates with packed
          // weights) are never made for CUDA (lower/nn.cpp, driver/compile.cpp).
          [](const ir::MatMulCall&) -> Reason { return std::nullopt; },
          [](const ir::GemmCall&) -> Reason { return std::nullopt; },
          [](const ir::ConvCall&) -> Reason { return std::nullopt; },
          // Fused attention is Kiln's own kernel on the GPU (codegen/cuda/cuda_attention.h).
          [](const ir::AttentionCall&) -> Reason { return std::nullopt; },
          // Ops whose work is sequential or data-dependent in shape, small next to the model.
          [](const ir::TopKCall&) -> Reason {
            return "TopK: a partial sort per row, no GPU selection kernel yet";
          },
          [](const ir::RnnCall&) -> Reason {
            return "RNN/LSTM/GRU: a sequential loop over time steps with small GEMMs";
          },
          [](const ir::DetCall&) -> Reason { return "Det: LU factorization per matrix"; },
          [](const ir::RoiAlignCall&) -> Reason {
            return "RoiAlign: per-box sampling, no GPU kernel yet";
          },
          [](const ir::TfIdfCall&) -> Reason {
            return "TfIdfVectorizer: n-gram matching over a pool, string-like work";
          },
          [](const ir::UniqueCall&) -> Reason {
            return "Unique: sort and deduplicate, its output size is data-dependent";
          },
          [](const ir::NmsCall&) -> Reason {
            return "NonMaxSuppression: greedy sequential selection, data-dependent output size";
          },
          // Sizes computed from data: the host needs them to size what follows.
          [](const ir::ShapeValuesCall&) -> Reason {
            return "a shape read from a tensor: the host needs the sizes";
          },
          [](const ir::ReshapeDimsCall&) -> Reason {
            return "Reshape's target shape from data: the host needs the sizes";
          },
          [](const ir::ExpandDimsCall&) -> Reason {
            return "Expand's shape from data: the host needs the sizes";
          },
          [](const ir::RangeCountCall&) -> Reason {
            return "Range's element count from data: the host needs the size";
          },
          [](const ir::CountNonZeroCall&) -> Reason {
            return "NonZero's count: the host needs the size";
          },
          [](const ir::NonZeroPositionsCall&) -> Reason {
            return "NonZero's positions: a sequential scan, after its count";
          },
          // Control flow: the wrapper's drivers (kiln_rt_control.h) run the subgraphs, compiled
          // for the CPU (CudaCodegen::subgraph_codegen), over host copies of what the call reads;
          // the results go to the GPU after it (CudaWrapperOps::write_control_flow).
          [](const ir::IfCall&) -> Reason {
            return "If: the branch taken depends on data, and its subgraph runs on the host";
          },
          [](const ir::LoopCall&) -> Reason {
            return "Loop: iterations depend on data, and its body runs on the host";
          },
          [](const ir::ScanCall&) -> Reason {
            return "Scan: a sequential loop of small steps, its body runs on the host";
          },
          [](const ir::ControlResultCall&) -> Reason {
            return "a control-flow result: control flow runs on the host";
          },
      },
      call);
}

}  // namespace kiln::codegen
