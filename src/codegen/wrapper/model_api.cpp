#include "codegen/wrapper/model_api.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/kiln_rt_weights.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

namespace {

/// The tables of one input or output: its dims (-1 where symbolic) and their names.
void write_value(IndentedBuffer& out, const std::string& id, const std::vector<sym::Expr>& shape) {
  std::vector<std::string> dims, names;
  for (const sym::Expr& d : shape) {
    std::optional<int64_t> v = d.as_integer();
    dims.push_back(v ? std::to_string(*v) : "-1");
    names.push_back(v ? "nullptr" : cpp_quote(d.str()));
  }
  if (shape.empty()) {
    dims.push_back("0");
    names.push_back("nullptr");
  }
  out.linef("const int64_t {}_dims[] = {{{}}};", id, fmt::join(dims, ", "));
  out.linef("const char* const {}_names[] = {{{}}};", id, fmt::join(names, ", "));
}

int64_t rank_of(const ir::InputSpec& spec) { return static_cast<int64_t>(spec.shape.size()); }

/// -1 for an output whose rank is known only after a run (its dtype is 0 when that too).
int64_t rank_of(const ir::OutputSpec& spec) {
  return spec.type_known_after_run() ? -1 : static_cast<int64_t>(spec.shape.size());
}

template <typename Spec>
void write_values(IndentedBuffer& out, const std::string& kind, const std::vector<Spec>& specs) {
  std::vector<std::string> entries;
  for (size_t k = 0; k < specs.size(); ++k) {
    const std::string id = fmt::format("{}{}", kind, k);
    write_value(out, id, specs[k].shape);
    entries.push_back(fmt::format("{{{}, {}, {}, {}_dims, {}_names}}",
                                  cpp_quote(specs[k].onnx_name), static_cast<int>(specs[k].dtype),
                                  rank_of(specs[k]), id, id));
  }
  if (entries.empty()) entries.push_back("{nullptr, 0, 0, nullptr, nullptr}");
  out.linef("const kiln_value_info k{}s[] = {{", kind == "in" ? "Input" : "Output");
  for (const std::string& e : entries) out.linef("    {},", e);
  out.line("};");
}

/// Defines `symbol` (hidden, 64-byte aligned, in read-only data) as the bytes of `file` from
/// offset `skip`.
void write_incbin(IndentedBuffer& out, const std::string& symbol, const std::string& file,
                  uint64_t skip) {
  out.linef("extern \"C\" const unsigned char {}[];", symbol);
  out.line("asm(R\"(");
  out.linef("    .section .rodata.{},\"a\"", symbol);
  out.line("    .balign 64");
  out.linef("    .hidden {}", symbol);
  out.linef("    .globl {}", symbol);
  out.linef("{}:", symbol);
  out.linef("    .incbin \"{}\", {}", file, skip);
  out.line("    .previous");
  out.line(")\");");
}

}  // namespace

WeightsBlob layout_weights(const std::vector<std::shared_ptr<const graph::Tensor>>& constants) {
  WeightsBlob blob;
  for (const auto& c : constants) {
    blob.offsets.push_back(blob.payload_bytes);
    blob.payload_bytes += (c->nbytes() + 63) / 64 * 64;
  }
  return blob;
}

namespace {

/// Writes all of `bytes` to `fd` (write may take less than it is given); false with errno set
/// on failure.
bool write_all(int fd, const unsigned char* bytes, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void write_weights_file(const std::filesystem::path& path,
                        const std::vector<std::shared_ptr<const graph::Tensor>>& constants,
                        WeightsBlob& blob) {
  namespace fs = std::filesystem;
  const fs::path temp = path.string() + fmt::format(".tmp-{}", ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    fs::remove(temp, ignored);
    user_error("{}: cannot {} the weights file: {}", path.string(), what, std::strerror(err));
  };
  if (fd < 0) fail("create");
  // The header last (its checksum is known once the payload is written): a hole until then.
  unsigned char header[kiln_rt::kWeightsHeaderBytes] = {};
  if (::lseek(fd, kiln_rt::kWeightsHeaderBytes, SEEK_SET) < 0) fail("write");
  kiln_rt::WeightsChecksum checksum;
  static constexpr unsigned char kZeros[64] = {};
  uint64_t written = 0;
  // In pieces, so that a tensor that is written as it is read (the weights of a lazily mapped
  // file) need not be resident whole before it is written.
  constexpr size_t kPiece = size_t{64} << 20;
  for (size_t k = 0; k < constants.size(); ++k) {
    const graph::Tensor& c = *constants[k];
    KILN_CHECK(written == blob.offsets.at(k), "weights layout: constant {} at {}, expected {}", k,
               written, blob.offsets[k]);
    const auto* bytes = static_cast<const unsigned char*>(c.data());
    for (size_t at = 0; at < c.nbytes(); at += kPiece) {
      const size_t n = std::min(kPiece, c.nbytes() - at);
      checksum.update(bytes + at, n);
      if (!write_all(fd, bytes + at, n)) fail("write");
    }
    const size_t pad = (64 - c.nbytes() % 64) % 64;
    checksum.update(kZeros, pad);
    if (!write_all(fd, kZeros, pad)) fail("write");
    written += c.nbytes() + pad;
    c.release_pages();
  }
  KILN_CHECK(written == blob.payload_bytes, "weights layout: {} bytes written, expected {}",
             written, blob.payload_bytes);
  blob.checksum = checksum.finish();
  kiln_rt::weights_header(header, blob.payload_bytes, blob.checksum);
  if (::pwrite(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) fail("write");
  if (::close(fd) != 0) {
    const int err = errno;
    std::error_code ignored;
    fs::remove(temp, ignored);
    user_error("{}: cannot write the weights file: {}", path.string(), std::strerror(err));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::error_code ignored;
    fs::remove(temp, ignored);
    user_error("{}: cannot rename the weights file into place: {}", path.string(),
               std::strerror(err));
  }
}

std::string generate_model_api(const ir::Program& program, const WeightsBlob& weights,
                               const ModelApiOptions& options) {
  IndentedBuffer out;
  out.line("// Generated by Kiln: the C API of a compiled model (include/kiln/runtime.h). Do not");
  out.line("// edit.");
  out.linef("#define KILN_MODEL_TARGET {}", cpp_quote(options.target));
  out.linef("#define KILN_MODEL_VERSION {}", cpp_quote(KILN_VERSION));
  if (options.cuda) out.line("#define KILN_MODEL_DEVICE_CUDA 1");
  out.line("#include \"kiln_rt_api.h\"");
  out.line("");
  out.line("namespace {");
  out.line("");
  write_values(out, "in", program.inputs);
  write_values(out, "out", program.outputs);
  for (size_t v = 0; v < options.variants.size(); ++v) {
    std::vector<std::string> offsets;
    for (size_t c : options.variants[v].constants)
      offsets.push_back(std::to_string(weights.offsets.at(c)));
    if (offsets.empty()) offsets.push_back("0");
    out.linef("const uint64_t kVariant{}Constants[] = {{{}}};", v, fmt::join(offsets, ", "));
  }
  out.line("");
  out.line("}  // namespace");
  out.line("");
  if (options.embed_weights) {
    out.linef("// The weights ({} bytes), in read-only data.", weights.payload_bytes);
    write_incbin(out, "kiln_weights", options.weights_file, kiln_rt::kWeightsHeaderBytes);
  } else {
    out.linef("// The weights ({} bytes) are in <stem>.weights beside the library.",
              weights.payload_bytes);
  }
  out.line("");
  out.line("// The variants, each a shared library built for its ISA level.");
  for (size_t v = 0; v < options.variants.size(); ++v) {
    write_incbin(out, fmt::format("kiln_variant{}", v), options.variants[v].image_file, 0);
  }
  out.line("");
  out.line("namespace {");
  out.line("");
  out.line("constexpr kiln_rt::api::Variant kVariants[] = {");
  for (size_t v = 0; v < options.variants.size(); ++v) {
    const ModelVariant& variant = options.variants[v];
    out.linef("    {{{}, {}, kiln_variant{}, {}ull,", cpp_quote(variant.name),
              cpp_quote(variant.features), v, variant.image_bytes);
    out.linef("     kVariant{}Constants, {}}},", v, variant.constants.size());
  }
  out.line("};");
  out.line("static_assert(std::size(kVariants) <= kiln_rt::api::kMaxVariants);");
  out.line("");
  out.line("}  // namespace");
  out.line("");
  out.line("const kiln_rt::api::ModelInfo& kiln_rt::api::model_info() {");
  out.line("    static constexpr kiln_rt::api::ModelInfo info = {");
  out.linef("        kInputs, {}, kOutputs, {},", program.inputs.size(), program.outputs.size());
  out.linef("        kVariants, {},", options.variants.size());
  out.linef("        {}ull, {}ull, {}}};", weights.payload_bytes, weights.checksum,
            options.embed_weights ? "kiln_weights" : "nullptr");
  out.line("    return info;");
  out.line("}");
  return out.str();
}

}  // namespace kiln::codegen
