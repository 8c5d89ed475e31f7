/// The CPU backend's scheduler hooks.

#include <fmt/format.h>

#include <optional>
#include <string>

#include "codegen/cpp/cpp_epilogue.h"
#include "codegen/cpp/cpp_kernel.h"

namespace kiln::codegen {
namespace {

// Reductions whose reduction space is a single element gain nothing from the kernel structure,
// and kernels of a few elements are never worth a parallel region; both still fuse. What the CPU
// refuses is a kernel that would mix more than one reduction space, which the group already
// excludes, and members whose dtype the kernel cannot hold: strings.
std::optional<std::string> check_members(const sched::NodeInfo& node) {
  for (const ir::Buffer* b : node.buffers) {
    if (b->dtype == graph::DType::kString) {
      return fmt::format("{} holds strings, which C++ kernels do not compute", b->name);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> CppBackend::can_fuse_vertical(const sched::NodeInfo& node1,
                                                         const sched::NodeInfo& node2,
                                                         const sched::KernelGroup&) const {
  if (auto r = check_members(node1)) return r;
  return check_members(node2);
}

std::optional<std::string> CppBackend::can_fuse_horizontal(const sched::NodeInfo& node1,
                                                           const sched::NodeInfo& node2,
                                                           const sched::KernelGroup& fused) const {
  if (auto r = check_members(node1)) return r;
  if (auto r = check_members(node2)) return r;
  // Two unrelated reductions share a kernel only when they also share its dims exactly, so the
  // loops they run are the same loops.
  if (node1.is_reduction && node2.is_reduction && node1.group.sizes.size() != fused.sizes.size()) {
    return std::string("reductions over differently shaped outer dims");
  }
  return std::nullopt;
}

std::string CppBackend::template_epilogue_refusal(const ir::Program& program,
                                                  const ir::Buffer& product,
                                                  const ir::Buffer& consumer) const {
  return epilogue_refusal(program, product, consumer);
}

std::string CppBackend::conv_prologue_refusal(const ir::Program& program,
                                              const ir::Buffer& producer,
                                              const ir::Buffer& consumer) const {
  return prologue_refusal(program, producer, consumer);
}

bool CppBackend::fuse_library_epilogue(const ir::Program& program, const ir::Buffer& product,
                                       ir::Buffer& consumer) const {
  return fuse_onednn_post_ops(program, product, consumer);
}

}  // namespace kiln::codegen
