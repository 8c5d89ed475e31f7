// Tests of TensorProto conversion (onnx/tensor_proto.h) and tensor files (onnx/tensor_file.h):
// the whole ONNX suite's test data, numpy interop both ways (numpy supplies the references), and
// the errors for malformed files and external data escaping the model directory.

#include "onnx/tensor_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "onnx/tensor_proto.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::onnx {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;

// Debian's python, which has numpy and onnx; the first python3 on PATH may not.
constexpr const char* kPython = "/usr/bin/python3";

/// A fresh scratch directory per test (ctest runs tests as separate, possibly parallel processes).
fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "tensor_file_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Writes `script` next to the scratch files and runs it with `args`; returns the exit status.
int run_python(const fs::path& dir, const std::string& script, const std::string& args) {
  fs::path path = dir / "script.py";
  files::write_atomic(path, script);
  std::string command = fmt::format("{} {} {}", kPython, path.string(), args);
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Expects `fn` to throw a UserError whose message contains every one of `parts`.
void expect_user_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message '" << message << "' lacks '" << part << "'";
    }
  }
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dims() != b.dims()) return false;
  if (a.dtype() == DType::kString) return a.string_values() == b.string_values();
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// ---------------------------------------------------------------------------------------------
// The ONNX backend suite's test data.

// Converts every suite .pb that onnx.numpy_helper understands to .npy (numpy's reading of the
// file is the reference) and lists "relative.pb<TAB>file.npy"; files it cannot convert are listed
// with "-" (sequences and optionals, which are not TensorProtos).
constexpr const char* kSuiteScript = R"PY(
import glob, os, sys
import numpy as np
from onnx import TensorProto, numpy_helper
root, out = sys.argv[1], sys.argv[2]
with open(os.path.join(out, "manifest.txt"), "w") as manifest:
    for i, f in enumerate(sorted(glob.glob(root + "/*/*/test_data_set_*/*.pb"))):
        rel = os.path.relpath(f, root)
        t = TensorProto()
        t.ParseFromString(open(f, "rb").read())
        try:
            a = numpy_helper.to_array(t)
        except Exception:
            manifest.write(rel + "\t-\n")
            continue
        if t.data_type in (TensorProto.STRING, TensorProto.BFLOAT16):
            continue  # numpy holds neither as Kiln does
        name = "%d.npy" % i
        np.save(os.path.join(out, name), a)
        manifest.write(rel + "\t" + name + "\n")
)PY";

TEST(SuiteTest, EveryTestDataFileReadsAndRoundTrips) {
  const fs::path root = KILN_TEST_DATA_DIR;
  const fs::path dir = scratch("suite");
  int read = 0;
  std::set<std::string> skipped;
  std::map<std::string, Tensor> tensors;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    for (const auto& test_case : fs::directory_iterator(root / suite)) {
      for (const auto& data_set : fs::directory_iterator(test_case.path())) {
        if (!data_set.is_directory() ||
            data_set.path().filename().string().rfind("test_data_set_", 0) != 0) {
          continue;
        }
        for (const auto& file : fs::directory_iterator(data_set.path())) {
          std::string name = file.path().filename().string();
          if (file.path().extension() != ".pb" ||
              (name.rfind("input_", 0) != 0 && name.rfind("output_", 0) != 0)) {
            continue;
          }
          std::string rel = fs::relative(file.path(), root).string();
          Tensor t;
          try {
            t = read_tensor_file(file.path());
          } catch (const UserError& e) {
            // Sequence and optional values: their case names say so.
            std::string case_name = test_case.path().filename().string();
            EXPECT_TRUE(case_name.find("seq") != std::string::npos ||
                        case_name.find("opt") != std::string::npos)
                << rel << ": " << e.what();
            skipped.insert(rel);
            continue;
          }
          ++read;
          int64_t product = 1;
          for (int64_t d : t.dims()) product *= d;
          ASSERT_EQ(product, t.numel()) << rel;
          if (t.dtype() == DType::kString) {
            ASSERT_EQ(static_cast<int64_t>(t.string_values().size()), product) << rel;
          } else {
            ASSERT_EQ(static_cast<int64_t>(t.nbytes()), product * graph::dtype_size(t.dtype()))
                << rel;
          }
          // Write, read back: identical tensor; serialize again: identical file bytes.
          write_tensor_file(t, dir / "a.pb", name);
          Tensor back = read_tensor_file(dir / "a.pb");
          ASSERT_TRUE(same_tensor(t, back)) << rel;
          ASSERT_EQ(files::read(dir / "a.pb"), tensor_to_proto(back, name).SerializeAsString())
              << rel;
          tensors.emplace(rel, std::move(t));
        }
      }
    }
  }
  std::cout << "suite tensor files: " << read << " read, " << skipped.size()
            << " skipped (SequenceProto / OptionalProto values)\n";
  EXPECT_GT(read, 2000);
  EXPECT_LT(skipped.size(), 60u);  // 51 in ONNX 1.12's data

  // numpy's reading of the same files, through onnx.numpy_helper.
  ASSERT_EQ(run_python(dir, kSuiteScript, root.string() + " " + dir.string()), 0);
  std::ifstream manifest(dir / "manifest.txt");
  std::string line;
  int compared = 0;
  std::set<std::string> numpy_rejected;
  while (std::getline(manifest, line)) {
    size_t tab = line.find('\t');
    std::string rel = line.substr(0, tab), npy = line.substr(tab + 1);
    if (npy == "-") {
      numpy_rejected.insert(rel);
      continue;
    }
    auto it = tensors.find(rel);
    ASSERT_NE(it, tensors.end()) << rel << " converted by numpy but not read by Kiln";
    ASSERT_TRUE(same_tensor(it->second, read_tensor_file(dir / npy))) << rel;
    ++compared;
  }
  EXPECT_EQ(numpy_rejected, skipped) << "Kiln and onnx.numpy_helper disagree on what is a tensor";
  EXPECT_GT(compared, 2000);
}

// ---------------------------------------------------------------------------------------------
// TensorProto conversion.

const fs::path kNoDir;

TEST(TensorProtoTest, TypedFieldsEveryDType) {
  auto proto = [](int32_t type, std::vector<int64_t> dims) {
    ::onnx::TensorProto p;
    p.set_data_type(type);
    for (int64_t d : dims) p.add_dims(d);
    return p;
  };
  ::onnx::TensorProto f = proto(1, {2});
  f.add_float_data(1.5f);
  f.add_float_data(-2.0f);
  Tensor t = tensor_from_proto(f, kNoDir, "f");
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.element_as_double(1), -2.0);

  for (int32_t type : {2, 3, 4, 5, 6, 9}) {  // uint8 int8 uint16 int16 int32 bool
    ::onnx::TensorProto p = proto(type, {3});
    for (int32_t v : {0, 1, 100}) p.add_int32_data(v);
    Tensor x = tensor_from_proto(p, kNoDir, "x");
    EXPECT_EQ(static_cast<int32_t>(x.dtype()), type);
    EXPECT_EQ(x.element_as_int64(2), type == 9 ? 1 : 100);
  }
  ::onnx::TensorProto i8 = proto(3, {1});
  i8.add_int32_data(-5);
  EXPECT_EQ(tensor_from_proto(i8, kNoDir, "i8").element_as_int64(0), -5);
  ::onnx::TensorProto h = proto(10, {2});
  h.add_int32_data(0x3e00);  // 1.5
  h.add_int32_data(0xfc00);  // -inf
  Tensor half = tensor_from_proto(h, kNoDir, "h");
  EXPECT_EQ(half.values<uint16_t>()[0], 0x3e00);
  EXPECT_EQ(half.element_as_double(1), -std::numeric_limits<double>::infinity());
  ::onnx::TensorProto bf = proto(16, {1});
  bf.add_int32_data(0xc040);
  EXPECT_EQ(tensor_from_proto(bf, kNoDir, "bf").element_as_double(0), -3.0);
  ::onnx::TensorProto i64 = proto(7, {});
  i64.add_int64_data(-(int64_t{1} << 40));
  EXPECT_EQ(tensor_from_proto(i64, kNoDir, "i64").element_as_int64(0), -(int64_t{1} << 40));
  ::onnx::TensorProto d = proto(11, {1});
  d.add_double_data(0.1);
  EXPECT_EQ(tensor_from_proto(d, kNoDir, "d").element_as_double(0), 0.1);
  ::onnx::TensorProto u32 = proto(12, {1});
  u32.add_uint64_data(4000000000u);
  EXPECT_EQ(tensor_from_proto(u32, kNoDir, "u32").element_as_int64(0), 4000000000);
  ::onnx::TensorProto u64 = proto(13, {1});
  u64.add_uint64_data(~0ull);
  EXPECT_EQ(tensor_from_proto(u64, kNoDir, "u64").values<uint64_t>()[0], ~0ull);
  ::onnx::TensorProto s = proto(8, {2});
  s.add_string_data("ab");
  s.add_string_data("");
  Tensor str = tensor_from_proto(s, kNoDir, "s");
  EXPECT_EQ(str.string_values(), (std::vector<std::string>{"ab", ""}));
  ::onnx::TensorProto back = tensor_to_proto(str, "s");
  EXPECT_EQ(back.string_data_size(), 2);
  EXPECT_EQ(back.name(), "s");
  ::onnx::TensorProto empty = proto(1, {0, 3});
  EXPECT_EQ(tensor_from_proto(empty, kNoDir, "e").numel(), 0);

  ::onnx::TensorProto raw = tensor_to_proto(t, "t");
  EXPECT_EQ(raw.raw_data().size(), 8u);
  EXPECT_TRUE(same_tensor(tensor_from_proto(raw, kNoDir, "raw"), t));
}

TEST(TensorProtoTest, SizeAndTypeErrors) {
  ::onnx::TensorProto p;
  p.set_data_type(1);
  p.add_dims(5);
  p.add_float_data(1);
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "initializer 'W'"); },
                    {"initializer 'W'", "[5]", "5 elements", "float_data has 1"});
  p.clear_float_data();
  p.set_raw_data(std::string(12, '\0'));
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "initializer 'W'"); },
                    {"initializer 'W'", "20 bytes", "raw_data has 12"});
  p.set_data_type(14);
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "initializer 'C'"); },
                    {"initializer 'C'", "COMPLEX64"});
  p.set_data_type(17);
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "initializer 'F8'"); },
                    {"initializer 'F8'", "float8e4m3fn", "5 bytes", "raw_data has 12"});
  p.set_data_type(22);  // int4: 5 elements pack into 3 bytes
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "initializer 'I4'"); },
                    {"initializer 'I4'", "int4", "3 bytes", "raw_data has 12"});
  p.set_data_type(0);
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "x"); }, {"UNDEFINED"});
  p.set_data_type(1);
  p.set_dims(0, -1);
  expect_user_error([&] { tensor_from_proto(p, kNoDir, "neg"); }, {"neg", "negative"});
}

::onnx::TensorProto external_proto(const std::string& location, int64_t offset, int64_t length,
                                   std::vector<int64_t> dims) {
  ::onnx::TensorProto p;
  p.set_name("W");
  p.set_data_type(1);
  for (int64_t d : dims) p.add_dims(d);
  p.set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* entry = p.add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
  return p;
}

TEST(TensorProtoTest, ExternalDataIsMappedAndConfined) {
  const fs::path dir = scratch("external");
  const fs::path model = dir / "model";
  fs::create_directories(model / "sub");
  std::vector<float> values(16);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  files::write_atomic(model / "weights.bin", bytes);
  files::write_atomic(model / "sub" / "w2.bin", bytes);
  files::write_atomic(dir / "outside.bin", bytes);
  fs::create_symlink(dir / "outside.bin", model / "link.bin");
  fs::create_symlink("weights.bin", model / "inner_link.bin");
  const std::string ctx = "initializer 'W'";

  Tensor t = tensor_from_proto(external_proto("weights.bin", 8, 16, {2, 2}), model, ctx);
  EXPECT_EQ(t.element_as_double(0), 1.0);
  EXPECT_EQ(t.element_as_double(3), 2.5);
  EXPECT_THROW(t.mutable_data(), InternalError);  // borrowed from the read-only mapping
  Tensor whole = tensor_from_proto(external_proto("sub/w2.bin", -1, -1, {16}), model, ctx);
  EXPECT_EQ(whole.element_as_double(15), 7.5);
  Tensor linked = tensor_from_proto(external_proto("inner_link.bin", 4, 4, {1}), model, ctx);
  EXPECT_EQ(linked.element_as_double(0), 0.5);
  Tensor odd = tensor_from_proto(external_proto("weights.bin", 6, 4, {1}), model, ctx);
  EXPECT_EQ(odd.nbytes(), 4u);  // misaligned offset: copied, still correct bytes
  EXPECT_EQ(std::memcmp(odd.data(), bytes.data() + 6, 4), 0);

  expect_user_error([&] { tensor_from_proto(external_proto("../x", 0, 4, {1}), model, ctx); },
                    {ctx, "'../x'", ".."});
  expect_user_error(
      [&] { tensor_from_proto(external_proto("sub/../../outside.bin", 0, 4, {1}), model, ctx); },
      {ctx, ".."});
  std::string absolute = (dir / "outside.bin").string();
  expect_user_error([&] { tensor_from_proto(external_proto(absolute, 0, 4, {1}), model, ctx); },
                    {ctx, absolute, "absolute"});
  expect_user_error([&] { tensor_from_proto(external_proto("link.bin", 0, 4, {1}), model, ctx); },
                    {ctx, "link.bin", "outside the model directory"});
  expect_user_error([&] { tensor_from_proto(external_proto("nope.bin", 0, 4, {1}), model, ctx); },
                    {ctx, "nope.bin", "not found"});
  expect_user_error(
      [&] { tensor_from_proto(external_proto("weights.bin", 65, 4, {1}), model, ctx); },
      {ctx, "offset 65", "beyond the end"});
  expect_user_error(
      [&] { tensor_from_proto(external_proto("weights.bin", 60, 8, {2}), model, ctx); },
      {ctx, "past the end"});
  expect_user_error(
      [&] { tensor_from_proto(external_proto("weights.bin", 0, 8, {3}), model, ctx); },
      {ctx, "12 bytes", "length is 8"});
  // Without a length the data runs to the end of the file, as in onnx's own loader.
  expect_user_error(
      [&] { tensor_from_proto(external_proto("weights.bin", 16, -1, {3}), model, ctx); },
      {ctx, "12 bytes", "length is 48"});
  expect_user_error([&] { tensor_from_proto(external_proto("", 0, 4, {1}), model, ctx); },
                    {ctx, "empty location"});
}

/// The path of the file whose mapping holds `address` in this process (/proc/self/maps), or ""
/// when no file mapping does.
std::string mapped_file_of(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) != 2 || at < begin || at >= end) {
      continue;
    }
    const size_t slash = line.find('/');
    return slash == std::string::npos ? "" : line.substr(slash);
  }
  return "";
}

// Offsets and lengths past 2^31 and 2^32 (a sparse file: the holes take no disk, and only the
// pages read are ever touched), read through a mapping of the file rather than copied.
TEST(TensorProtoTest, ExternalDataPast4GiBIsMappedNotCopied) {
  const fs::path dir = scratch("external_4gib");
  const fs::path path = dir / "big.bin";
  constexpr int64_t kFar = (int64_t{1} << 32) + 4096 + 8;  // past 2^32, not page aligned
  constexpr int64_t kLongAt = int64_t{1} << 31;            // a 2^31 + 64 byte tensor from 2^31
  constexpr int64_t kLongBytes = (int64_t{1} << 31) + 64;
  const float values[4] = {1.5f, -2.25f, 3.0f, 1e-3f};
  {
    std::ofstream out(path, std::ios::binary);
    out.seekp(kLongAt);
    out.put('\x11');
    out.seekp(kLongAt + kLongBytes - 1);
    out.put('\x22');
    out.seekp(kFar);
    out.write(reinterpret_cast<const char*>(values), sizeof values);
    ASSERT_TRUE(out.good());
  }
  ASSERT_EQ(static_cast<int64_t>(fs::file_size(path)), kFar + 16);
  const std::string ctx = "initializer 'W'";

  Tensor far = tensor_from_proto(external_proto("big.bin", kFar, 16, {2, 2}), dir, ctx);
  EXPECT_EQ(far.element_as_double(0), 1.5);
  EXPECT_EQ(far.element_as_double(1), -2.25);
  EXPECT_EQ(far.element_as_double(3), static_cast<double>(1e-3f));
  EXPECT_TRUE(far.is_mapped());
  EXPECT_EQ(mapped_file_of(far.data()), fs::canonical(path).string());
  // Given back to the kernel, the pages are read again from the file on the next access.
  far.release_pages();
  EXPECT_EQ(far.element_as_double(1), -2.25);

  ::onnx::TensorProto long_proto = external_proto("big.bin", kLongAt, kLongBytes, {kLongBytes});
  long_proto.set_data_type(2);  // uint8
  Tensor long_tensor = tensor_from_proto(long_proto, dir, ctx);
  ASSERT_EQ(static_cast<int64_t>(long_tensor.nbytes()), kLongBytes);
  const auto* bytes = static_cast<const uint8_t*>(long_tensor.data());
  EXPECT_EQ(bytes[0], 0x11);
  EXPECT_EQ(bytes[kLongBytes / 2], 0);  // a hole reads as zeros
  EXPECT_EQ(bytes[kLongBytes - 1], 0x22);
  EXPECT_TRUE(long_tensor.is_mapped());
  EXPECT_EQ(mapped_file_of(long_tensor.data()), fs::canonical(path).string());

  // The end of the data is checked against the file past 2^32 too.
  expect_user_error([&] { tensor_from_proto(external_proto("big.bin", kFar, 32, {8}), dir, ctx); },
                    {ctx, "past the end", std::to_string(kFar + 16) + " bytes"});
  fs::remove(path);
}

// ---------------------------------------------------------------------------------------------
// numpy interop. Each array's values are arange-based; numpy prints them as the reference.

constexpr const char* kNumpyWriteScript = R"PY(
import sys
import numpy as np
out = sys.argv[1]
listing = open(out + "/expected.txt", "w")
def emit(name, a, version=None):
    path = "%s/%s.npy" % (out, name)
    if version is None:
        np.save(path, a)
    else:
        with open(path, "wb") as f:
            np.lib.format.write_array(f, a, version=version)
    flat = a.ravel(order="C")
    vals = [repr(float(v)) if a.dtype.kind == "f" else str(int(v)) for v in flat]
    listing.write(" ".join([name, a.dtype.str, str(a.ndim)] + [str(d) for d in a.shape] + vals) + "\n")
for code in ["<f4", "<f8", "<f2", "|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]:
    i = np.arange(24)
    if code[1] == "f":
        a = ((i - 7.5) * 0.37).astype(code)
    elif code[1] == "b":
        a = (i % 3 == 0)
    elif code[1] == "u":
        a = (i * 11).astype(code)
    else:
        a = (i * 7 - 80).astype(code)
    emit("c_" + code[1:], a.reshape(2, 3, 4))
    emit("f_" + code[1:], np.asfortranarray(a.reshape(2, 3, 4)))
emit("big_u8", np.array([2**64 - 1, 2**63 + 5], dtype="<u8"))
emit("scalar", np.array(3.25, dtype="<f4"))
emit("empty", np.zeros((0, 3), dtype="<i8"))
emit("v2", np.arange(6, dtype="<i4").reshape(3, 2), version=(2, 0))
emit("v3", np.arange(6, dtype="<f8").reshape(2, 3), version=(3, 0))
np.save(out + "/big_endian.npy", np.arange(4, dtype=">f4"))
np.save(out + "/unicode.npy", np.array(["ab", "c"]))
np.save(out + "/complex.npy", np.arange(4, dtype="<c8"))
np.save(out + "/structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
)PY";

DType dtype_for_descr(const std::string& descr) {
  static const std::map<std::string, DType> kMap = {
      {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<f2", DType::kFloat16},
      {"|b1", DType::kBool},    {"|i1", DType::kInt8},    {"|u1", DType::kUInt8},
      {"<i2", DType::kInt16},   {"<u2", DType::kUInt16},  {"<i4", DType::kInt32},
      {"<u4", DType::kUInt32},  {"<i8", DType::kInt64},   {"<u8", DType::kUInt64}};
  return kMap.at(descr);
}

TEST(NumpyTest, ReadsWhatNumpyWrites) {
  const fs::path dir = scratch("numpy_read");
  ASSERT_EQ(run_python(dir, kNumpyWriteScript, dir.string()), 0);
  std::ifstream expected(dir / "expected.txt");
  std::string line;
  int files_checked = 0;
  while (std::getline(expected, line)) {
    std::istringstream in(line);
    std::string name, descr;
    size_t rank = 0;
    in >> name >> descr >> rank;
    std::vector<int64_t> dims(rank);
    for (int64_t& d : dims) in >> d;
    Tensor t = read_tensor_file(dir / (name + ".npy"));
    SCOPED_TRACE(name);
    ASSERT_EQ(t.dtype(), dtype_for_descr(descr));
    ASSERT_EQ(t.dims(), dims);
    std::string value;
    for (int64_t i = 0; in >> value; ++i) {
      ASSERT_LT(i, t.numel());
      if (graph::is_floating(t.dtype())) {
        ASSERT_EQ(t.element_as_double(i), std::strtod(value.c_str(), nullptr)) << i;
      } else if (t.dtype() == DType::kUInt64) {
        ASSERT_EQ(t.values<uint64_t>()[i], std::strtoull(value.c_str(), nullptr, 10)) << i;
      } else {
        ASSERT_EQ(t.element_as_int64(i), std::strtoll(value.c_str(), nullptr, 10)) << i;
      }
    }
    ++files_checked;
  }
  EXPECT_EQ(files_checked, 29);

  expect_user_error([&] { read_tensor_file(dir / "big_endian.npy"); },
                    {"big_endian.npy", "'>f4'", "big-endian"});
  expect_user_error([&] { read_tensor_file(dir / "unicode.npy"); }, {"unicode.npy", "'<U2'"});
  expect_user_error([&] { read_tensor_file(dir / "complex.npy"); }, {"complex.npy", "'<c8'"});
  expect_user_error([&] { read_tensor_file(dir / "structured.npy"); },
                    {"structured.npy", "structured"});
}

// Kiln writes these; numpy rebuilds each array itself and compares values and file bytes.
constexpr const char* kNumpyCheckScript = R"PY(
import io, sys
import numpy as np
from onnx import TensorProto, numpy_helper
out = sys.argv[1]
bad = 0
def check(name, want):
    global bad
    got = np.load("%s/%s.npy" % (out, name))
    buf = io.BytesIO()
    np.save(buf, want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        print("value mismatch", name, got.dtype, got.shape, want.dtype, want.shape); bad += 1
    elif open("%s/%s.npy" % (out, name), "rb").read() != buf.getvalue():
        print("byte mismatch", name); bad += 1
for code in ["<f4", "<f8", "<f2", "|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]:
    i = np.arange(24)
    if code[1] == "f":
        a = ((i - 7.5) * 0.25).astype(code)
    elif code[1] == "b":
        a = (i % 3 == 0)
    elif code[1] == "u":
        a = (i * 11).astype(code)
    else:
        a = (i * 7 - 80).astype(code)
    check("k_" + code[1:], a.reshape(2, 3, 4))
check("scalar", np.array(-1.5, dtype="<f8"))
check("empty", np.zeros((4, 0), dtype="<i4"))
check("long", np.arange(123456789012, 123456789012 + 3, dtype="<i8"))
t = TensorProto(); t.ParseFromString(open(out + "/strings.pb", "rb").read())
if t.name != "s" or list(numpy_helper.to_array(t).ravel()) != [b"x", b"yz"] and \
   list(numpy_helper.to_array(t).ravel()) != ["x", "yz"]:
    print("strings.pb mismatch", t); bad += 1
t = TensorProto(); t.ParseFromString(open(out + "/half.pb", "rb").read())
if not np.array_equal(numpy_helper.to_array(t), ((np.arange(24) - 7.5) * 0.25).astype("<f2").reshape(2, 3, 4)):
    print("half.pb mismatch"); bad += 1
sys.exit(1 if bad else 0)
)PY";

Tensor arange_tensor(DType dtype, std::vector<int64_t> dims) {
  Tensor t(dtype, std::move(dims));
  auto* bytes = static_cast<char*>(t.mutable_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    auto put = [&](auto v) { std::memcpy(bytes + i * sizeof(v), &v, sizeof(v)); };
    switch (dtype) {
      case DType::kFloat32:
        put(static_cast<float>((i - 7.5) * 0.25));
        break;
      case DType::kFloat64:
        put((i - 7.5) * 0.25);
        break;
      case DType::kFloat16:
        put(graph::float_to_half(static_cast<float>((i - 7.5) * 0.25)));
        break;
      case DType::kBool:
        put(static_cast<uint8_t>(i % 3 == 0));
        break;
      case DType::kInt8:
        put(static_cast<int8_t>(i * 7 - 80));
        break;
      case DType::kInt16:
        put(static_cast<int16_t>(i * 7 - 80));
        break;
      case DType::kInt32:
        put(static_cast<int32_t>(i * 7 - 80));
        break;
      case DType::kInt64:
        put(static_cast<int64_t>(i * 7 - 80));
        break;
      case DType::kUInt8:
        put(static_cast<uint8_t>(i * 11));
        break;
      case DType::kUInt16:
        put(static_cast<uint16_t>(i * 11));
        break;
      case DType::kUInt32:
        put(static_cast<uint32_t>(i * 11));
        break;
      case DType::kUInt64:
        put(static_cast<uint64_t>(i * 11));
        break;
      default:
        ADD_FAILURE() << "no arange for " << graph::dtype_name(dtype);
    }
  }
  return t;
}

TEST(NumpyTest, NumpyReadsWhatKilnWrites) {
  const fs::path dir = scratch("numpy_write");
  const std::pair<const char*, DType> kCodes[] = {
      {"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"f2", DType::kFloat16},
      {"b1", DType::kBool},    {"i1", DType::kInt8},    {"u1", DType::kUInt8},
      {"i2", DType::kInt16},   {"u2", DType::kUInt16},  {"i4", DType::kInt32},
      {"u4", DType::kUInt32},  {"i8", DType::kInt64},   {"u8", DType::kUInt64}};
  for (const auto& [code, dtype] : kCodes) {
    Tensor t = arange_tensor(dtype, {2, 3, 4});
    fs::path path = dir / fmt::format("k_{}.npy", code);
    write_tensor_file(t, path);
    EXPECT_TRUE(same_tensor(read_tensor_file(path), t)) << code;
  }
  Tensor scalar(DType::kFloat64, {});
  scalar.mutable_values<double>()[0] = -1.5;
  write_tensor_file(scalar, dir / "scalar.npy");
  write_tensor_file(Tensor(DType::kInt32, {4, 0}), dir / "empty.npy");
  Tensor big(DType::kInt64, {3});
  for (int64_t i = 0; i < 3; ++i) big.mutable_values<int64_t>()[i] = 123456789012 + i;
  write_tensor_file(big, dir / "long.npy");
  write_tensor_file(Tensor::strings({2}, {"x", "yz"}), dir / "strings.pb", "s");
  write_tensor_file(arange_tensor(DType::kFloat16, {2, 3, 4}), dir / "half.pb", "h");
  EXPECT_EQ(run_python(dir, kNumpyCheckScript, dir.string()), 0);
}

// ---------------------------------------------------------------------------------------------
// Errors and summaries.

TEST(TensorFileErrorTest, MalformedFilesNameThePath) {
  const fs::path dir = scratch("errors");
  write_tensor_file(arange_tensor(DType::kFloat32, {2, 3, 4}), dir / "good.npy");
  std::string good = files::read(dir / "good.npy");
  files::write_atomic(dir / "short_data.npy", good.substr(0, good.size() - 5));
  expect_user_error([&] { read_tensor_file(dir / "short_data.npy"); },
                    {"short_data.npy", "96 data bytes", "has 91", "truncated"});
  files::write_atomic(dir / "short_header.npy", good.substr(0, 40));
  expect_user_error([&] { read_tensor_file(dir / "short_header.npy"); },
                    {"short_header.npy", "truncated .npy header"});
  files::write_atomic(dir / "tiny.npy", good.substr(0, 7));
  expect_user_error([&] { read_tensor_file(dir / "tiny.npy"); }, {"tiny.npy", "not a .npy"});
  files::write_atomic(dir / "garbage.npy", "hello, world, this is not numpy");
  expect_user_error([&] { read_tensor_file(dir / "garbage.npy"); }, {"garbage.npy", "magic"});
  std::string bad_header = good;
  bad_header.replace(bad_header.find("'shape'"), 7, "'shope'");
  files::write_atomic(dir / "bad_header.npy", bad_header);
  expect_user_error([&] { read_tensor_file(dir / "bad_header.npy"); },
                    {"bad_header.npy", "malformed .npy header", "shope"});
  std::string native = good;
  native.replace(native.find("'<f4'"), 5, "'=f4'");  // '=' is native order: little here
  files::write_atomic(dir / "native.npy", native);
  EXPECT_EQ(read_tensor_file(dir / "native.npy").dtype(), DType::kFloat32);
  expect_user_error([&] { read_tensor_file(dir / "missing.npy"); }, {"missing.npy"});

  files::write_atomic(dir / "garbage.pb",
                      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  expect_user_error([&] { read_tensor_file(dir / "garbage.pb"); },
                    {"garbage.pb", "not a valid TensorProto"});
  write_tensor_file(arange_tensor(DType::kFloat32, {2, 3, 4}), dir / "good.pb", "g");
  std::string pb = files::read(dir / "good.pb");
  files::write_atomic(dir / "cut.pb", pb.substr(0, pb.size() - 10));
  expect_user_error([&] { read_tensor_file(dir / "cut.pb"); }, {"cut.pb"});
  expect_user_error([&] { read_tensor_file(dir / "x.txt"); }, {"x.txt", "extension"});

  Tensor bf(DType::kBFloat16, {2});
  expect_user_error([&] { write_tensor_file(bf, dir / "bf.npy"); },
                    {"bf.npy", "numpy has no bfloat16", ".pb"});
  EXPECT_FALSE(fs::exists(dir / "bf.npy"));
  write_tensor_file(bf, dir / "bf.pb");
  EXPECT_TRUE(same_tensor(read_tensor_file(dir / "bf.pb"), bf));
  expect_user_error([&] { write_tensor_file(Tensor::strings({1}, {"a"}), dir / "s.npy"); },
                    {"s.npy", "string", ".pb"});
}

TEST(TensorFileTest, Summary) {
  EXPECT_EQ(tensor_summary(arange_tensor(DType::kFloat32, {2, 3, 4})),
            "float32[2, 3, 4] min=-1.875 max=3.875 mean=1 values=[-1.875, -1.625, -1.375, "
            "-1.125, -0.875, -0.625, ...]");
  EXPECT_EQ(tensor_summary(arange_tensor(DType::kInt64, {3})),
            "int64[3] min=-80 max=-66 mean=-73 values=[-80, -73, -66]");
  EXPECT_EQ(tensor_summary(Tensor(DType::kUInt8, {0, 2})), "uint8[0, 2] (empty)");
  EXPECT_EQ(tensor_summary(Tensor::strings({2}, {"a", "b"})), "string[2] values=[\"a\", \"b\"]");
  Tensor nan(DType::kFloat32, {2});
  nan.mutable_values<float>()[0] = NAN;
  EXPECT_EQ(tensor_summary(nan), "float32[2] min=0 max=0 mean=0 nan=1 values=[nan, 0]");
}

}  // namespace
}  // namespace kiln::onnx
