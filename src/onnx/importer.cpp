// ONNX import in five steps: parse the protobuf, check opset versions, run the ONNX checker, run
// shape inference, build and verify the graph::Model. Each failure becomes one UserError line
// naming the file and, where one is to blame, the node.
#include "onnx/importer.h"

#include <google/protobuf/io/coded_stream.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graph/op_versions.h"
#include "onnx/function_inliner.h"
#include "onnx/inference_guard.h"
#include "onnx/newer_model_check.h"
#include "onnx/tensor_proto.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::onnx {

namespace fs = std::filesystem;
using graph::DType;
using graph::Type;

namespace {

/// The newest ai.onnx.ml opset of ONNX 1.23, and of ONNX 1.12.
constexpr int64_t kMaxMlOpset = 5;
constexpr int64_t kOnnx112MlOpset = 3;

/// Everything the graph builder needs besides the proto itself.
struct ImportContext {
  std::string source;  // the file, as named in messages
  fs::path model_dir;
  graph::OpsetImports opsets;
  std::set<std::string> dim_params;  // every dim_param in the model, so fresh names avoid them
  int64_t next_unknown = 0;
};

/// "" for the default domain, whichever way the model spells it.
std::string normalize_domain(const std::string& domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

/// ONNX library messages span several lines and append the offending proto as "==> Context";
/// Kiln's messages are one line.
std::string one_line(const std::string& message) {
  std::string text = message.substr(0, message.find("==> Context:"));
  text = std::regex_replace(text, std::regex(R"(\s+)"), " ");
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.pop_back();
  while (!text.empty() && text.front() == ' ') text.erase(0, 1);
  return text;
}

/// "node 'n3' (Add): " when an ONNX library message identifies a node, else "".
std::string node_from_message(const std::string& message) {
  static const std::regex kChecker(R"(Name:\s*(\S*)\s*OpType:\s*(\S+))");
  static const std::regex kInference(R"(op_type:\s*([^,\s]+),\s*node name:\s*([^)]*)\))");
  std::smatch match;
  if (std::regex_search(message, match, kChecker)) {
    return fmt::format("node '{}' ({}): ", match[1].str(), match[2].str());
  }
  if (std::regex_search(message, match, kInference)) {
    return fmt::format("node '{}' ({}): ", match[2].str(), match[1].str());
  }
  return "";
}

::onnx::ModelProto parse_model(std::string_view bytes, const std::string& source) {
  ::onnx::ModelProto model;
  google::protobuf::io::CodedInputStream stream(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int>(bytes.size()));
  stream.SetTotalBytesLimit(INT32_MAX);
  if (bytes.size() > INT32_MAX || !model.ParseFromCodedStream(&stream) ||
      !stream.ConsumedEntireMessage()) {
    user_error(
        "{}: not a valid ONNX model: the protobuf data cannot be parsed (truncated or not "
        "an ONNX file)",
        source);
  }
  if (model.ir_version() <= 0 || !model.has_graph()) {
    user_error("{}: not a valid ONNX model: {} is missing (empty or not an ONNX file)", source,
               model.ir_version() <= 0 ? "ir_version" : "the graph");
  }
  return model;
}

/// The newest opset Kiln imports per domain: ai.onnx and ai.onnx.ml as of ONNX 1.23, the others
/// as the ONNX library knows them (a domain it does not know is a custom one).
std::optional<int64_t> newest_opset(const std::string& domain) {
  if (domain.empty()) return graph::kMaxOpset;
  if (domain == "ai.onnx.ml") return kMaxMlOpset;
  const auto& known = ::onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = known.find(domain);
  if (it == known.end()) return std::nullopt;
  return it->second.second;
}

/// The model's opsets by domain; refuses versions newer than Kiln knows.
graph::OpsetImports read_opsets(const ::onnx::ModelProto& model, const std::string& source) {
  if (model.ir_version() > graph::kMaxIrVersion) {
    user_error("{}: model has IR version {}; Kiln supports up to {}", source, model.ir_version(),
               graph::kMaxIrVersion);
  }
  graph::OpsetImports opsets;
  for (const auto& import : model.opset_import()) {
    opsets[normalize_domain(import.domain())] = import.version();
  }
  // IR versions before 3 have no opset imports and mean ai.onnx opset 1.
  if (model.ir_version() < 3 && opsets.empty()) opsets[""] = 1;
  for (const auto& [domain, version] : opsets) {
    std::optional<int64_t> newest = newest_opset(domain);
    if (!newest || version <= *newest) continue;
    if (domain.empty()) {
      user_error("{}: model uses opset {}; Kiln supports up to {}", source, version, *newest);
    }
    user_error("{}: model uses opset {} of domain '{}'; Kiln supports up to {}", source, version,
               domain, *newest);
  }
  return opsets;
}

/// Whether ONNX 1.12 knows everything the model's header declares (then its checker runs on the
/// whole model as it is).
bool onnx112_knows(const ::onnx::ModelProto& model, const graph::OpsetImports& opsets) {
  auto version = [&](const std::string& domain) {
    auto it = opsets.find(domain);
    return it == opsets.end() ? 0 : it->second;
  };
  return model.ir_version() <= ::onnx::IR_VERSION && version("") <= graph::kOnnx112Opset &&
         version("ai.onnx.ml") <= kOnnx112MlOpset;
}

/// onnx::checker::check_model with the model's directory set, so that external data is found
/// without parsing the file a second time (the library's path overload re-reads it).
void run_onnx_checker(const ::onnx::ModelProto& model, const fs::path& model_dir) {
  namespace checker = ::onnx::checker;
  auto fail = [](const std::string& message) { throw checker::ValidationError(message); };
  if (model.ir_version() > ::onnx::IR_VERSION) {
    fail(fmt::format("model ir_version {} is newer than what Kiln's ONNX library knows ({})",
                     model.ir_version(), static_cast<int64_t>(::onnx::IR_VERSION)));
  }
  checker::CheckerContext ctx;
  ctx.set_ir_version(static_cast<int>(model.ir_version()));
  std::unordered_map<std::string, int> opsets;
  for (const auto& import : model.opset_import()) {
    opsets[import.domain()] = static_cast<int>(import.version());
  }
  if (model.ir_version() >= 3 && opsets.empty()) {
    fail("model with IR version >= 3 must specify opset_import for ONNX");
  }
  if (model.ir_version() < 3 && !opsets.empty()) {
    fail("model with IR version < 3 cannot have opset_import specified");
  }
  if (opsets.empty()) opsets[""] = 1;
  ctx.set_opset_imports(opsets);
  ctx.set_model_dir(model_dir.string());
  checker::LexicalScopeContext lex;
  checker::check_graph(model.graph(), ctx, lex);
  if (model.ir_version() >= 8) checker::check_model_local_functions(model, ctx, lex);
}

/// The nodes of type `op_type` in the default domain, in `graph` and its subgraphs.
void find_nodes(const ::onnx::GraphProto& graph, const std::string& op_type,
                std::vector<const ::onnx::NodeProto*>& out) {
  for (const auto& node : graph.node()) {
    if (node.op_type() == op_type && normalize_domain(node.domain()).empty()) out.push_back(&node);
    for (const auto& attr : node.attribute()) {
      if (attr.has_g()) find_nodes(attr.g(), op_type, out);
      for (const auto& g : attr.graphs()) find_nodes(g, op_type, out);
    }
  }
}

/// "node 'n3' (Conv): " when the model has one node of that type, else "a Conv node: ".
std::string guarded_node_label(const ::onnx::ModelProto& model, const std::string& op_type) {
  std::vector<const ::onnx::NodeProto*> nodes;
  find_nodes(model.graph(), op_type, nodes);
  if (nodes.size() == 1 && !nodes[0]->name().empty()) {
    return fmt::format("node '{}' ({}): ", nodes[0]->name(), op_type);
  }
  return fmt::format("a {} node: ", op_type);
}

/// ONNX shape inference through the guarded registry (onnx/inference_guard.h): a node that
/// would crash ONNX 1.12's inference function is refused first and reported here.
void infer_shapes(::onnx::ModelProto& model, const std::string& source) {
  take_guard_failure();  // forget a refusal left by an earlier import on this thread
  std::optional<std::string> error;
  try {
    ::onnx::ShapeInferenceOptions options(/*check_type=*/false, /*strict_mode=*/0,
                                          /*data_prop=*/true);
    ::onnx::shape_inference::InferShapes(model, guarded_schema_registry(), options);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (std::optional<GuardFailure> failure = take_guard_failure()) {
    user_error("{}: {}invalid model: {}", source, guarded_node_label(model, failure->op_type),
               failure->problem);
  }
  if (error) {
    user_error("{}: {}shape inference failed: {}", source, node_from_message(*error),
               one_line(*error));
  }
}

// ---------------------------------------------------------------------------------------------
// Types

void collect_dim_params(const ::onnx::TypeProto& type, std::set<std::string>& out) {
  if (type.has_tensor_type() && type.tensor_type().has_shape()) {
    for (const auto& dim : type.tensor_type().shape().dim()) {
      if (dim.has_dim_param() && !dim.dim_param().empty()) out.insert(dim.dim_param());
    }
  } else if (type.has_sequence_type()) {
    collect_dim_params(type.sequence_type().elem_type(), out);
  } else if (type.has_optional_type()) {
    collect_dim_params(type.optional_type().elem_type(), out);
  }
}

void collect_dim_params(const ::onnx::GraphProto& graph, std::set<std::string>& out) {
  for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& info : *list) collect_dim_params(info.type(), out);
  }
  for (const auto& node : graph.node()) {
    for (const auto& attr : node.attribute()) {
      if (attr.has_g()) collect_dim_params(attr.g(), out);
      for (const auto& g : attr.graphs()) collect_dim_params(g, out);
    }
  }
}

sym::Expr fresh_symbol(ImportContext& ctx) {
  std::string name;
  do {
    name = fmt::format("unk__{}", ctx.next_unknown++);
  } while (ctx.dim_params.count(name) != 0);
  return sym::Expr::symbol(name, sym::SymbolKind::kSize);
}

Type import_type(const ::onnx::TypeProto& proto, const std::string& value_name,
                 ImportContext& ctx) {
  Type type;
  switch (proto.value_case()) {
    case ::onnx::TypeProto::kTensorType: {
      const auto& tensor = proto.tensor_type();
      std::optional<DType> dtype = graph::dtype_from_onnx(tensor.elem_type());
      if (!dtype && tensor.elem_type() != 0) {
        user_error("{}: value '{}' has element type {} ({}), which Kiln does not support",
                   ctx.source, value_name, graph::onnx_type_name(tensor.elem_type()),
                   tensor.elem_type());
      }
      std::optional<graph::Shape> shape;
      if (tensor.has_shape()) {
        shape.emplace();
        for (const auto& dim : tensor.shape().dim()) {
          if (dim.has_dim_value() && dim.dim_value() >= 0) {
            shape->push_back(sym::Expr(static_cast<int64_t>(dim.dim_value())));
          } else if (dim.has_dim_param() && !dim.dim_param().empty()) {
            shape->push_back(sym::Expr::symbol(dim.dim_param(), sym::SymbolKind::kSize));
          } else {
            shape->push_back(fresh_symbol(ctx));
          }
        }
      }
      return Type::tensor(dtype.value_or(DType::kUndefined), std::move(shape));
    }
    case ::onnx::TypeProto::kSequenceType:
      type.kind = graph::ValueKind::kSequence;
      type.element = std::make_shared<const Type>(
          import_type(proto.sequence_type().elem_type(), value_name, ctx));
      return type;
    case ::onnx::TypeProto::kOptionalType:
      type.kind = graph::ValueKind::kOptional;
      type.element = std::make_shared<const Type>(
          import_type(proto.optional_type().elem_type(), value_name, ctx));
      return type;
    case ::onnx::TypeProto::VALUE_NOT_SET:
      return type;
    default:
      user_error("{}: value '{}' is a {}; Kiln supports tensor, sequence and optional values",
                 ctx.source, value_name,
                 proto.has_map_type() ? "map" : "sparse tensor or another unsupported kind");
  }
}

// ---------------------------------------------------------------------------------------------
// Graph building

class GraphBuilder {
 public:
  explicit GraphBuilder(ImportContext& ctx) : ctx_(ctx) {}

  void build(const ::onnx::GraphProto& proto, graph::Graph& graph) {
    std::unordered_map<std::string, const ::onnx::TypeProto*> declared;
    for (const auto* list : {&proto.value_info(), &proto.input(), &proto.output()}) {
      for (const auto& info : *list) declared[info.name()] = &info.type();
    }
    Locals locals;
    add_inputs_and_initializers(proto, graph, locals);
    // Every node output exists before the first node is added, so that subgraphs and verify()
    // can refer to values defined later (and report them).
    for (const auto& node : proto.node()) {
      for (const auto& name : node.output()) {
        if (name.empty() || locals.count(name) != 0) continue;
        auto it = declared.find(name);
        locals[name] = graph.add_value(
            name, it == declared.end() ? Type() : import_type(*it->second, name, ctx_));
      }
    }
    for (int i = 0; i < proto.node_size(); ++i) add_node(proto.node(i), i, graph, locals);
    for (const auto& output : proto.output()) {
      graph.add_output(lookup(output.name(), graph, locals));
    }
  }

 private:
  using Locals = std::unordered_map<std::string, graph::Value*>;

  /// The value named `name` in this graph or an enclosing one; an undefined name gets a
  /// placeholder value with no producer, which verify() reports with the node that reads it.
  graph::Value* lookup(const std::string& name, graph::Graph& graph, Locals& locals) {
    if (graph::Value* value = graph.find_value(name)) return value;
    return locals[name] = graph.add_value(name, Type());
  }

  void add_inputs_and_initializers(const ::onnx::GraphProto& proto, graph::Graph& graph,
                                   Locals& locals) {
    std::unordered_map<std::string, const ::onnx::TensorProto*> initializers;
    for (const auto& tensor : proto.initializer()) {
      if (!initializers.emplace(tensor.name(), &tensor).second) {
        user_error("{}: initializer '{}' is defined twice", ctx_.source, tensor.name());
      }
    }
    if (proto.sparse_initializer_size() != 0) {
      user_error("{}: initializer '{}' is sparse; Kiln supports dense initializers only",
                 ctx_.source, proto.sparse_initializer(0).values().name());
    }
    // Graph inputs that have an initializer are constants (IR < 4 lists every initializer
    // among the inputs); the real inputs are the others.
    for (const auto& input : proto.input()) {
      if (locals.count(input.name()) != 0) {
        user_error("{}: graph input '{}' is declared twice", ctx_.source, input.name());
      }
      graph::Value* value =
          graph.add_value(input.name(), import_type(input.type(), input.name(), ctx_));
      locals[input.name()] = value;
      if (initializers.count(input.name()) == 0) graph.add_input(value);
    }
    for (const auto& tensor : proto.initializer()) {
      std::string context = fmt::format("{}: initializer '{}'", ctx_.source, tensor.name());
      auto data =
          std::make_shared<const graph::Tensor>(tensor_from_proto(tensor, ctx_.model_dir, context));
      graph::Value*& value = locals[tensor.name()];
      if (value == nullptr) value = graph.add_value(tensor.name(), Type());
      graph::Shape shape(data->dims().begin(), data->dims().end());
      value->set_type(Type::tensor(data->dtype(), std::move(shape)));
      graph.set_initializer(value, std::move(data));
    }
  }

  void add_node(const ::onnx::NodeProto& proto, int index, graph::Graph& graph, Locals& locals) {
    // ONNX allows unnamed nodes; messages need a name, so give a stable one.
    std::string name =
        proto.name().empty() ? fmt::format("{}_{}", proto.op_type(), index) : proto.name();
    std::string domain = normalize_domain(proto.domain());
    auto opset = ctx_.opsets.find(domain);
    std::vector<graph::Value*> inputs;
    for (const auto& input : proto.input()) {
      inputs.push_back(input.empty() ? nullptr : lookup(input, graph, locals));
    }
    std::vector<graph::Value*> outputs;
    for (const auto& output : proto.output()) {
      outputs.push_back(output.empty() ? nullptr : locals.at(output));
    }
    std::map<std::string, graph::AttributeValue> attributes;
    std::string label = fmt::format("{}: node '{}' ({})", ctx_.source, name, proto.op_type());
    for (const auto& attr : proto.attribute()) {
      attributes[attr.name()] = import_attribute(attr, label, graph);
    }
    graph.add_node(std::move(name), proto.op_type(), std::move(domain),
                   opset == ctx_.opsets.end() ? 0 : opset->second, std::move(inputs),
                   std::move(outputs), std::move(attributes));
  }

  std::shared_ptr<graph::Graph> import_subgraph(const ::onnx::GraphProto& proto,
                                                graph::Graph& parent) {
    auto subgraph = std::make_shared<graph::Graph>(proto.name(), &parent);
    build(proto, *subgraph);
    return subgraph;
  }

  graph::Tensor import_tensor(const ::onnx::TensorProto& proto, const std::string& context) {
    return tensor_from_proto(proto, ctx_.model_dir, context);
  }

  graph::AttributeValue import_attribute(const ::onnx::AttributeProto& attr,
                                         const std::string& node_label, graph::Graph& graph);

  ImportContext& ctx_;
};

/// The attribute's type; models written before IR version 2 may leave it unset.
::onnx::AttributeProto::AttributeType attribute_type(const ::onnx::AttributeProto& attr) {
  using A = ::onnx::AttributeProto;
  if (attr.type() != A::UNDEFINED) return attr.type();
  if (attr.floats_size() != 0) return A::FLOATS;
  if (attr.ints_size() != 0) return A::INTS;
  if (attr.strings_size() != 0) return A::STRINGS;
  if (attr.tensors_size() != 0) return A::TENSORS;
  if (attr.graphs_size() != 0) return A::GRAPHS;
  if (attr.has_f()) return A::FLOAT;
  if (attr.has_i()) return A::INT;
  if (attr.has_s()) return A::STRING;
  if (attr.has_t()) return A::TENSOR;
  if (attr.has_g()) return A::GRAPH;
  return A::UNDEFINED;
}

graph::AttributeValue GraphBuilder::import_attribute(const ::onnx::AttributeProto& attr,
                                                     const std::string& node_label,
                                                     graph::Graph& graph) {
  using A = ::onnx::AttributeProto;
  std::string context = fmt::format("{}: attribute '{}'", node_label, attr.name());
  switch (attribute_type(attr)) {
    case A::FLOAT:
      return attr.f();
    case A::INT:
      return static_cast<int64_t>(attr.i());
    case A::STRING:
      return attr.s();
    case A::TENSOR:
      return import_tensor(attr.t(), context);
    case A::GRAPH:
      return import_subgraph(attr.g(), graph);
    case A::FLOATS:
      return std::vector<float>(attr.floats().begin(), attr.floats().end());
    case A::INTS:
      return std::vector<int64_t>(attr.ints().begin(), attr.ints().end());
    case A::STRINGS:
      return std::vector<std::string>(attr.strings().begin(), attr.strings().end());
    case A::TENSORS: {
      std::vector<graph::Tensor> tensors;
      for (const auto& t : attr.tensors()) tensors.push_back(import_tensor(t, context));
      return tensors;
    }
    case A::GRAPHS: {
      std::vector<std::shared_ptr<graph::Graph>> graphs;
      for (const auto& g : attr.graphs()) graphs.push_back(import_subgraph(g, graph));
      return graphs;
    }
    // Type attributes (Optional, SequenceEmpty...) are kept as the text of the Kiln type.
    case A::TYPE_PROTO:
      return import_type(attr.tp(), attr.name(), ctx_).str();
    case A::TYPE_PROTOS: {
      std::vector<std::string> types;
      for (const auto& tp : attr.type_protos())
        types.push_back(import_type(tp, attr.name(), ctx_).str());
      return types;
    }
    default:
      user_error("{}: attribute '{}' has type {}, which Kiln does not support", node_label,
                 attr.name(), A::AttributeType_Name(attr.type()));
  }
}

graph::Model build_model(const ::onnx::ModelProto& proto, ImportContext& ctx) {
  graph::Model model;
  model.path = ctx.source;
  model.ir_version = proto.ir_version();
  model.producer_name = proto.producer_name();
  model.opsets = ctx.opsets;
  collect_dim_params(proto.graph(), ctx.dim_params);
  std::string name = proto.graph().name().empty() ? "main" : proto.graph().name();
  model.graph = std::make_unique<graph::Graph>(name);
  GraphBuilder(ctx).build(proto.graph(), *model.graph);
  return model;
}

/// Runs the ONNX checker. When it refuses the model, Kiln's own verifier is tried on the
/// unchecked model first: for undefined values and cycles its message is the clearer one.
void check_model(const ::onnx::ModelProto& proto, ImportContext& ctx) {
  std::string message;
  try {
    run_onnx_checker(proto, ctx.model_dir);
    return;
  } catch (const std::exception& e) {
    message = e.what();
  }
  try {
    ImportContext scratch = ctx;
    graph::Model unchecked = build_model(proto, scratch);
    graph::verify(*unchecked.graph, ctx.source);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception&) {
    // Fall through to the checker's message.
  }
  user_error("{}: {}invalid model: {}", ctx.source, node_from_message(message), one_line(message));
}

}  // namespace

int64_t max_supported_opset() { return graph::kMaxOpset; }

namespace {

/// import_model_from_bytes after the parse.
graph::Model import_parsed(::onnx::ModelProto proto, const std::string& source_name,
                           const fs::path& model_dir) {
  ImportContext ctx;
  ctx.source = source_name;
  ctx.model_dir = model_dir;
  read_opsets(proto, source_name);
  check_newer_fields(proto, source_name);
  inline_model_functions(proto, source_name);
  // Inlining may add the opset imports of the functions.
  ctx.opsets = read_opsets(proto, source_name);
  if (onnx112_knows(proto, ctx.opsets)) {
    check_model(proto, ctx);
  } else {
    check_newer_model(proto, ctx.opsets, source_name);
  }
  infer_shapes(proto, source_name);
  graph::Model model = build_model(proto, ctx);
  graph::verify(*model.graph, source_name);
  return model;
}

}  // namespace

graph::Model import_model_from_bytes(std::string_view bytes, const std::string& source_name,
                                     const fs::path& model_dir) {
  return import_parsed(parse_model(bytes, source_name), source_name, model_dir);
}

graph::Model import_model(const fs::path& path, ImportStats* stats) {
  std::string source = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) user_error("{}: no such file", source);
  if (fs::is_directory(path, ec)) user_error("{}: is a directory, expected an .onnx file", source);
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  // Mapped, not read into a string: the parser reads the bytes from the page cache, and the
  // mapping is gone before the initializers are built, so a model with its weights inside holds
  // at most two forms of them at once (the file's pages and the parsed protobuf, then the
  // protobuf and the tensors).
  ::onnx::ModelProto proto;
  {
    const files::MappedFile file(path);
    if (stats != nullptr) stats->model_bytes_mapped = file.bytes().size();
    proto = parse_model(file.bytes(), source);
  }
  return import_parsed(std::move(proto), source, dir);
}

}  // namespace kiln::onnx
