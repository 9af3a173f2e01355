#include "attic/grammar/json_grammar.h"

#include <algorithm>
#include <bitset>
#include <climits>
#include <cmath>
#include <map>
#include <set>

namespace attic::grammar {

namespace {

using ojson = nlohmann::ordered_json;
using Node = Grammar::Node;
using Kind = Grammar::Node::Kind;
constexpr int64_t kInf = INT64_MAX / 4;

Status Unsupported(const std::string& keyword, const std::string& path, const std::string& why = "") {
  return InvalidArgumentError("JSON Schema keyword '" + keyword + "' (at " + path + ") is not supported" +
                              (why.empty() ? "" : ": " + why));
}

// Schema -> nodes. $ref targets are compiled once (recursion allowed).
class Compiler {
 public:
  explicit Compiler(const ojson& root) : root_(root) {}

  StatusOr<int> Compile(const ojson& s, const std::string& path, int into = -1);
  int Any(int depth);
  int PlainString();
  std::vector<Node> nodes;

 private:
  int New(Node n, int into) {
    if (into >= 0) {
      nodes[into] = std::move(n);
      return into;
    }
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  // strict: a keyword that does not apply to `type` is an error (else, in a list of
  // types, it applies to the others only).
  StatusOr<int> CompileType(const ojson& s, const std::string& type, const std::string& path, int into,
                            bool strict = true);
  StatusOr<int> Ref(const std::string& ref, const std::string& path);
  StatusOr<int64_t> Count(const ojson& s, const char* key, const std::string& path, int64_t dflt);

  const ojson& root_;
  std::map<std::string, int> refs_;
  std::vector<int> any_;  // Any(depth) nodes
  int plain_string_ = -1;
};

int Compiler::PlainString() {
  if (plain_string_ < 0) {
    Node n;
    n.kind = Kind::kString;
    plain_string_ = New(std::move(n), -1);
  }
  return plain_string_;
}

// Any JSON value at nesting `depth` (objects and arrays only below kMaxAnyDepth).
int Compiler::Any(int depth) {
  if (static_cast<int>(any_.size()) > depth) return any_[depth];
  any_.resize(depth + 1, -1);
  Node alt;
  alt.kind = Kind::kAnyOf;
  alt.depth = depth;
  const int self = New(alt, -1);
  any_[depth] = self;
  std::vector<int> alts;
  alts.push_back(PlainString());
  Node lit;
  lit.kind = Kind::kLiterals;
  lit.literals = {"true", "false", "null"};
  alts.push_back(New(lit, -1));
  Node num;
  num.kind = Kind::kNumber;
  alts.push_back(New(num, -1));
  if (depth + 1 < kMaxAnyDepth) {
    const int inner = Any(depth + 1);
    Node obj;
    obj.kind = Kind::kObject;
    obj.any_keys = true;
    obj.items = inner;
    alts.push_back(New(obj, -1));
    Node arr;
    arr.kind = Kind::kArray;
    arr.items = inner;
    alts.push_back(New(arr, -1));
  }
  nodes[self].alternatives = alts;
  return self;
}

StatusOr<int64_t> Compiler::Count(const ojson& s, const char* key, const std::string& path, int64_t dflt) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    return InvalidArgumentError("JSON Schema keyword '" + std::string(key) + "' (at " + path +
                                ") must be a non-negative integer");
  return it->get<int64_t>();
}

StatusOr<int> Compiler::Ref(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  if (ref.rfind("#", 0) != 0) return Unsupported("$ref", path, "only references inside the schema (#/...)");
  const ojson* target = &root_;
  std::string rest = ref.substr(1);
  size_t at = 0;
  while (at < rest.size()) {
    if (rest[at] != '/') return Unsupported("$ref", path, "'" + ref + "' is not a JSON pointer");
    size_t next = rest.find('/', at + 1);
    std::string part = rest.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    for (size_t p; (p = part.find("~1")) != std::string::npos;) part.replace(p, 2, "/");
    for (size_t p; (p = part.find("~0")) != std::string::npos;) part.replace(p, 2, "~");
    if (!target->is_object() || !target->contains(part))
      return InvalidArgumentError("JSON Schema '$ref' (at " + path + "): '" + ref + "' names nothing in the schema");
    target = &(*target)[part];
    at = next == std::string::npos ? rest.size() : next;
  }
  const int id = New(Node{}, -1);
  refs_[ref] = id;
  ATTIC_ASSIGN_OR_RETURN(int got, Compile(*target, ref, id));
  (void)got;
  return id;
}

StatusOr<int> Compiler::Compile(const ojson& s, const std::string& path, int into) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) return Unsupported("false", path, "a schema that allows nothing");
    return New(nodes[Any(0)], into);
  }
  if (!s.is_object()) return InvalidArgumentError("the JSON Schema at " + path + " must be an object");
  static const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                                     "$comment", "$defs", "definitions", "readOnly", "writeOnly",
                                                     "deprecated"};
  static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "items",
                                               "minItems", "maxItems", "enum", "const", "minLength", "maxLength",
                                               "anyOf", "oneOf", "$ref", "minimum", "maximum", "exclusiveMinimum",
                                               "exclusiveMaximum"};
  for (const auto& [key, value] : s.items()) {
    if (kAnnotations.count(key) == 0 && kKnown.count(key) == 0) return Unsupported(key, path);
  }
  if (auto ref = s.find("$ref"); ref != s.end()) {
    if (!ref->is_string()) return InvalidArgumentError("JSON Schema '$ref' (at " + path + ") must be a string");
    for (const auto& [key, value] : s.items())
      if (kKnown.count(key) && key != "$ref") return Unsupported(key, path, "beside '$ref'");
    ATTIC_ASSIGN_OR_RETURN(int target, Ref(ref->get<std::string>(), path));
    if (into < 0) return target;
    // Referenced from a $ref target itself: share the node by copying it once compiled
    // (an alias of an alias is resolved by its own compile).
    Node alias;
    alias.kind = Kind::kAnyOf;
    alias.alternatives = {target};
    return New(alias, into);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_array() || it->empty())
      return InvalidArgumentError("JSON Schema '" + std::string(key) + "' (at " + path + ") must be a non-empty array");
    for (const auto& [k, value] : s.items())
      if (kKnown.count(k) && k != key) return Unsupported(k, path, std::string("beside '") + key + "'");
    Node n;
    n.kind = Kind::kAnyOf;
    const int id = New(n, into);
    std::vector<int> alts;
    for (size_t i = 0; i < it->size(); ++i) {
      ATTIC_ASSIGN_OR_RETURN(int a, Compile((*it)[i], path + "/" + key + "/" + std::to_string(i)));
      alts.push_back(a);
    }
    nodes[id].alternatives = alts;
    nodes[id].depth = -1;  // checked for disjoint first bytes after compiling
    return id;
  }
  if (s.contains("enum") || s.contains("const")) {
    Node n;
    n.kind = Kind::kLiterals;
    if (auto c = s.find("const"); c != s.end()) {
      n.literals.push_back(c->dump());
    } else {
      const ojson& e = s.at("enum");
      if (!e.is_array() || e.empty())
        return InvalidArgumentError("JSON Schema 'enum' (at " + path + ") must be a non-empty array");
      for (const ojson& v : e) n.literals.push_back(v.dump());
    }
    return New(n, into);
  }
  auto type = s.find("type");
  if (type == s.end()) {
    if (s.contains("properties")) return CompileType(s, "object", path, into);
    if (s.contains("items")) return CompileType(s, "array", path, into);
    return New(nodes[Any(0)], into);
  }
  if (type->is_string()) return CompileType(s, type->get<std::string>(), path, into);
  if (!type->is_array() || type->empty())
    return InvalidArgumentError("JSON Schema 'type' (at " + path + ") must be a string or an array of strings");
  Node n;
  n.kind = Kind::kAnyOf;
  n.depth = -1;
  const int id = New(n, into);
  std::vector<int> alts;
  for (const ojson& t : *type) {
    if (!t.is_string()) return InvalidArgumentError("JSON Schema 'type' (at " + path + ") must name types");
    ATTIC_ASSIGN_OR_RETURN(int a, CompileType(s, t.get<std::string>(), path, -1, /*strict=*/false));
    alts.push_back(a);
  }
  nodes[id].alternatives = alts;
  return id;
}

// The largest integer part the matcher writes, and bounds beyond it.
constexpr int64_t kMaxWhole = 999999999999999;  // kMaxIntDigits nines
constexpr double kFar = 1e16;

Status Bounds(const ojson& s, const std::string& path, Node* n) {
  double lo = -kFar, hi = kFar;
  bool lo_ex = false, hi_ex = false;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_number())
      return InvalidArgumentError("JSON Schema '" + std::string(key) + "' (at " + path + ") must be a number");
    const double v = std::clamp(it->get<double>(), -kFar, kFar);
    const std::string k = key;
    if (k == "minimum" && v >= lo) lo = v, lo_ex = false;
    if (k == "exclusiveMinimum" && v >= lo) lo = v, lo_ex = true;
    if (k == "maximum" && v <= hi) hi = v, hi_ex = false;
    if (k == "exclusiveMaximum" && v <= hi) hi = v, hi_ex = true;
    n->bounded = true;
  }
  // Integers allowed as a value: [L, H].
  const double L = lo_ex ? std::floor(lo) + 1 : std::ceil(lo);
  const double H = hi_ex ? std::ceil(hi) - 1 : std::floor(hi);
  auto clampw = [](double v) { return static_cast<int64_t>(std::clamp(v, -1.0, static_cast<double>(kMaxWhole) + 1)); };
  // Positive: w itself, or w.fff in [w, w + 1) with w >= L and w + 1 <= the upper bound.
  n->valid[0] = {clampw(std::max(0.0, L)), clampw(H)};
  n->frac[0] = {clampw(std::max(0.0, L)), clampw(std::floor(hi) - 1)};
  // Negative (-w): -w in [L, H]; -w.fff in (-(w + 1), -w] with -w <= H and -(w + 1) >= lo.
  n->valid[1] = {clampw(std::max(0.0, -H)), clampw(-L)};
  n->frac[1] = {clampw(std::max(0.0, -H)), clampw(std::floor(-lo) - 1)};
  for (int sign = 0; sign < 2; ++sign) {
    n->valid[sign].hi = std::min(n->valid[sign].hi, kMaxWhole);
    n->frac[sign].hi = std::min(n->frac[sign].hi, kMaxWhole);
    if (n->integer) n->frac[sign] = {0, -1};
  }
  if (n->valid[0].lo > n->valid[0].hi && n->valid[1].lo > n->valid[1].hi && n->frac[0].lo > n->frac[0].hi &&
      n->frac[1].lo > n->frac[1].hi)
    return InvalidArgumentError("JSON Schema at " + path + ": no " + (n->integer ? "integer" : "number") +
                                " this server writes is within the bounds");
  return OkStatus();
}

StatusOr<int> Compiler::CompileType(const ojson& s, const std::string& type, const std::string& path, int into,
                                    bool strict) {
  auto only = [&](std::initializer_list<const char*> allowed) -> Status {
    if (!strict) return OkStatus();
    static const char* kTyped[] = {"properties", "required", "additionalProperties", "items", "minItems",
                                   "maxItems", "minLength", "maxLength", "minimum", "maximum",
                                   "exclusiveMinimum", "exclusiveMaximum"};
    for (const char* k : kTyped) {
      if (!s.contains(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || std::string(a) == k;
      if (!ok) return Unsupported(k, path, "it does not apply to type '" + type + "'");
    }
    return OkStatus();
  };
  Node n;
  if (type == "string") {
    ATTIC_RETURN_IF_ERROR(only({"minLength", "maxLength"}));
    n.kind = Kind::kString;
    ATTIC_ASSIGN_OR_RETURN(n.min_length, Count(s, "minLength", path, 0));
    ATTIC_ASSIGN_OR_RETURN(n.max_length, Count(s, "maxLength", path, INT64_MAX));
    if (n.min_length > n.max_length)
      return InvalidArgumentError("JSON Schema at " + path + ": 'minLength' is larger than 'maxLength'");
    return New(n, into);
  }
  if (type == "number" || type == "integer") {
    ATTIC_RETURN_IF_ERROR(only({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}));
    n.kind = Kind::kNumber;
    n.integer = type == "integer";
    ATTIC_RETURN_IF_ERROR(Bounds(s, path, &n));
    return New(n, into);
  }
  if (type == "boolean" || type == "null") {
    ATTIC_RETURN_IF_ERROR(only({}));
    n.kind = Kind::kLiterals;
    n.literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
    return New(n, into);
  }
  if (type == "array") {
    ATTIC_RETURN_IF_ERROR(only({"items", "minItems", "maxItems"}));
    n.kind = Kind::kArray;
    ATTIC_ASSIGN_OR_RETURN(n.min_items, Count(s, "minItems", path, 0));
    ATTIC_ASSIGN_OR_RETURN(n.max_items, Count(s, "maxItems", path, INT64_MAX));
    if (n.min_items > n.max_items)
      return InvalidArgumentError("JSON Schema at " + path + ": 'minItems' is larger than 'maxItems'");
    const int id = New(n, into);
    int items;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return Unsupported("items", path, "an array of schemas (tuple validation)");
      ATTIC_ASSIGN_OR_RETURN(items, Compile(*it, path + "/items"));
    } else {
      items = Any(0);
    }
    nodes[id].items = items;
    return id;
  }
  if (type == "object") {
    ATTIC_RETURN_IF_ERROR(only({"properties", "required", "additionalProperties"}));
    n.kind = Kind::kObject;
    const int id = New(n, into);
    std::vector<Node::Property> props;
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) return InvalidArgumentError("JSON Schema 'required' (at " + path + ") must be an array");
      for (const ojson& name : *r) {
        if (!name.is_string()) return InvalidArgumentError("JSON Schema 'required' (at " + path + ") must name properties");
        required.insert(name.get<std::string>());
      }
    }
    auto p = s.find("properties");
    if (p != s.end()) {
      if (!p->is_object()) return InvalidArgumentError("JSON Schema 'properties' (at " + path + ") must be an object");
      for (const auto& [name, sub] : p->items()) {
        Node::Property prop;
        prop.key = ojson(name).dump();
        prop.required = required.erase(name) > 0;
        ATTIC_ASSIGN_OR_RETURN(prop.value, Compile(sub, path + "/properties/" + name));
        props.push_back(std::move(prop));
      }
    }
    if (!required.empty())
      return InvalidArgumentError("JSON Schema 'required' (at " + path + ") names '" + *required.begin() +
                                  "', which is not in 'properties'");
    nodes[id].properties = std::move(props);
    // No properties but additionalProperties allowed: a map (any keys, values of that schema).
    auto ap = s.find("additionalProperties");
    const bool open = ap == s.end() || !(ap->is_boolean() && !ap->get<bool>());
    if (p == s.end() && open) {
      nodes[id].any_keys = true;
      int values;
      if (ap != s.end() && ap->is_object()) {
        ATTIC_ASSIGN_OR_RETURN(values, Compile(*ap, path + "/additionalProperties"));
      } else {
        values = Any(1);
      }
      nodes[id].items = values;
    }
    return id;
  }
  return InvalidArgumentError("JSON Schema 'type' (at " + path + "): unknown type '" + type + "'");
}

using ByteSet = std::bitset<256>;

// The bytes a value of each node may start with.
std::vector<ByteSet> FirstBytes(const std::vector<Node>& nodes) {
  std::vector<ByteSet> first(nodes.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      ByteSet b;
      switch (n.kind) {
        case Kind::kObject: b.set('{'); break;
        case Kind::kArray: b.set('['); break;
        case Kind::kString: b.set('"'); break;
        case Kind::kNumber:
          b.set('-');
          for (int c = '0'; c <= '9'; ++c) b.set(c);
          break;
        case Kind::kLiterals:
          for (const std::string& l : n.literals)
            if (!l.empty()) b.set(static_cast<uint8_t>(l[0]));
          break;
        case Kind::kAnyOf:
        case Kind::kAny:
        case Kind::kSwitch:
          for (int a : n.alternatives) b |= first[a];
          break;
      }
      if (b != first[i]) {
        first[i] = b;
        changed = true;
      }
    }
  }
  return first;
}

int64_t Add(int64_t a, int64_t b) { return std::min(kInf, a + b); }
int64_t Mul(int64_t a, int64_t b) { return a == 0 || b == 0 ? 0 : a >= kInf / b ? kInf : a * b; }

int64_t NumberBytesLeft(const Node& n, int sign, int64_t v, int k, bool zero);

std::vector<int> MinBytes(const std::vector<Node>& nodes) {
  std::vector<int64_t> m(nodes.size(), kInf);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      int64_t v = kInf;
      switch (n.kind) {
        case Kind::kObject: {
          v = 2;
          int cnt = 0;
          for (const auto& p : n.properties) {
            if (!p.required) continue;
            v = Add(v, Add(static_cast<int64_t>(p.key.size()) + 1, m[p.value]));
            ++cnt;
          }
          v = Add(v, std::max(0, cnt - 1));
          break;
        }
        case Kind::kArray:
          v = n.min_items == 0 ? 2 : Add(2, Add(Mul(n.min_items, m[n.items]), n.min_items - 1));
          break;
        case Kind::kString: v = Add(2, n.min_length); break;
        case Kind::kNumber:
          v = n.bounded ? std::min(NumberBytesLeft(n, 0, 0, 0, false), Add(1, NumberBytesLeft(n, 1, 0, 0, false))) : 1;
          break;
        case Kind::kLiterals:
          for (const std::string& l : n.literals) v = std::min<int64_t>(v, l.size());
          break;
        case Kind::kAnyOf:
        case Kind::kAny:
          for (int a : n.alternatives) v = std::min(v, m[a]);
          break;
        case Kind::kSwitch:
          // Before the literal that chooses it is written: the largest alternative. An
          // overestimate keeps the budget rule safe (the choice only lowers it); the least
          // would let a name be chosen whose arguments no longer fit.
          v = 0;
          for (int a : n.alternatives) v = std::max(v, m[a]);
          break;
      }
      if (v < m[i]) {
        m[i] = v;
        changed = true;
      }
    }
  }
  std::vector<int> out(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) out[i] = static_cast<int>(std::min<int64_t>(m[i], INT_MAX));
  return out;
}

bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
int HexValue(uint8_t c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Checks a compiled grammar's alternatives and computes its first bytes and sizes.
Status FinishGrammar(Grammar* g);

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> Grammar::FromJsonSchema(const nlohmann::json& schema) {
  // Properties keep the order the client wrote them in: read the schema again ordered.
  ojson ordered;
  try {
    ordered = ojson::parse(schema.dump());
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("bad JSON Schema: ") + e.what());
  }
  return FromOrderedJsonSchema(ordered);
}

StatusOr<std::shared_ptr<const Grammar>> Grammar::FromOrderedJsonSchema(const nlohmann::ordered_json& schema) {
  Compiler c(schema);
  auto root = c.Compile(schema, "#");
  if (!root.ok()) return root.status();
  auto g = std::make_shared<Grammar>();
  g->plain_string_ = c.PlainString();
  g->nodes_ = std::move(c.nodes);
  g->root_ = *root;
  if (g->nodes_[g->root_].kind != Kind::kObject)
    return InvalidArgumentError("the root of a response_format JSON Schema must be {\"type\": \"object\", ...}");
  ATTIC_RETURN_IF_ERROR(FinishGrammar(g.get()));
  return std::shared_ptr<const Grammar>(std::move(g));
}

StatusOr<std::shared_ptr<const Grammar>> Grammar::ToolCalls(const std::vector<Function>& functions,
                                                            const std::string& args_key, bool array) {
  if (functions.empty()) return InvalidArgumentError("tool calls: no function to call");
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Grammar>> cache;  // bounded: cleared when full
  ojson key_json = ojson::array({args_key, array});
  for (const Function& f : functions) key_json.push_back(ojson::array({f.name, f.parameters}));
  const std::string key = key_json.dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  // Each function's parameters compiled on its own root ($ref is relative to it) into
  // one node list.
  std::vector<Node> nodes;
  Node names;
  names.kind = Kind::kLiterals;
  Node pick;
  pick.kind = Kind::kSwitch;
  int plain = -1;
  for (size_t i = 0; i < functions.size(); ++i) {
    const std::string at = "functions[" + std::to_string(i) + "]: ";
    const ojson& params = functions[i].parameters.is_null() ? ojson{{"type", "object"}, {"properties", ojson::object()}}
                                                            : functions[i].parameters;
    Compiler c(params);
    c.nodes = std::move(nodes);
    auto root = c.Compile(params, "#");
    if (!root.ok()) return InvalidArgumentError(at + root.status().message());
    plain = c.PlainString();
    nodes = std::move(c.nodes);
    int r = *root;
    while (nodes[r].kind == Kind::kAnyOf && nodes[r].alternatives.size() == 1) r = nodes[r].alternatives[0];  // $ref
    if (nodes[r].kind != Kind::kObject)
      return InvalidArgumentError(at + "the parameters must be an object schema ({\"type\": \"object\", ...})");
    names.literals.push_back(ojson(functions[i].name).dump());
    pick.alternatives.push_back(*root);
  }
  nodes.push_back(names);
  const int names_id = static_cast<int>(nodes.size()) - 1;
  nodes.push_back(pick);
  const int pick_id = static_cast<int>(nodes.size()) - 1;
  Node call;
  call.kind = Kind::kObject;
  call.properties = {{"\"name\"", names_id, true}, {ojson(args_key).dump(), pick_id, true}};
  nodes.push_back(call);
  int root = static_cast<int>(nodes.size()) - 1;
  if (array) {
    Node list;
    list.kind = Kind::kArray;
    list.items = root;
    list.min_items = 1;
    nodes.push_back(list);
    root = static_cast<int>(nodes.size()) - 1;
  }
  auto g = std::make_shared<Grammar>();
  g->plain_string_ = plain;
  g->nodes_ = std::move(nodes);
  g->root_ = root;
  ATTIC_RETURN_IF_ERROR(FinishGrammar(g.get()));
  std::shared_ptr<const Grammar> out = std::move(g);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxSharedGrammars) cache.clear();
  cache.emplace(key, out);
  return out;
}

namespace {

Status FinishGrammar(Grammar* g) {
  // Alternatives must start differently (the matcher picks one by the first byte); enums
  // and literals that share first bytes merge into one list.
  const std::vector<ByteSet> first = FirstBytes(g->nodes_);
  for (Node& n : g->nodes_) {
    if (n.kind != Kind::kAnyOf || n.depth != -1) continue;
    n.depth = 0;
    bool all_literals = n.alternatives.size() > 1;
    for (int a : n.alternatives) all_literals = all_literals && g->nodes_[a].kind == Kind::kLiterals;
    if (all_literals) {
      std::vector<std::string> lits;
      for (int a : n.alternatives)
        for (const std::string& l : g->nodes_[a].literals) lits.push_back(l);
      n.kind = Kind::kLiterals;
      n.literals = std::move(lits);
      n.alternatives.clear();
      continue;
    }
    ByteSet seen;
    for (int a : n.alternatives) {
      if ((seen & first[a]).any())
        return Unsupported("anyOf", "a schema", "two alternatives can start with the same character (e.g. two "
                                                "objects, or two strings); alternatives must differ in type");
      seen |= first[a];
    }
  }
  g->first_ = FirstBytes(g->nodes_);
  g->min_bytes_ = MinBytes(g->nodes_);
  if (g->min_bytes_[g->root_] >= INT_MAX / 2)
    return InvalidArgumentError("the JSON Schema has no finite instance (a required property recurses forever)");
  for (size_t i = 0; i < g->nodes_.size(); ++i) {
    const Node& n = g->nodes_[i];
    if (n.kind == Kind::kArray && n.min_items > 0 && g->min_bytes_[n.items] >= INT_MAX / 2)
      return InvalidArgumentError("the JSON Schema has no finite instance (an array's items recurse forever)");
  }
  return OkStatus();
}

}  // namespace

std::shared_ptr<const Grammar> Grammar::AnyObject() {
  static const std::shared_ptr<const Grammar> any = *FromOrderedJsonSchema(ojson{{"type", "object"}});
  return any;
}

StatusOr<std::shared_ptr<const Grammar>> Grammar::Shared(const nlohmann::ordered_json& schema) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Grammar>> cache;  // bounded: cleared when full
  const std::string key = schema.dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  ATTIC_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, FromOrderedJsonSchema(schema));
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxSharedGrammars) cache.clear();
  cache.emplace(key, g);
  return g;
}

// --- Matcher ----------------------------------------------------------------------------

Matcher::Matcher(const Grammar* g) : g_(g) { stack_.push_back(NewFrame(g_->root())); }

namespace {

// Object frames: a = next property index, b = 1 once a property was written, c = the
// property being written, d = bytes of its key matched, e = the index + 1 of the
// literal written last as a property value (what a kSwitch value follows; 0 = none). Phases: 0 before '{', 1 after
// '{' or a value, 2 after ',', 3 in a key, 4 before ':', 5 in a value.
// The last property that may be written next: the first required one from `from`.
int LastCandidate(const Node& n, int from) {
  for (int j = from; j < static_cast<int>(n.properties.size()); ++j)
    if (n.properties[j].required) return j;
  return static_cast<int>(n.properties.size()) - 1;
}
// A property's value node: a kSwitch resolved by the object's last literal (`written`:
// its index + 1; 0 = none yet: the switch itself, sized as its largest alternative).
int ValueNode(const Grammar& g, int value, int64_t written) {
  const Node& v = g.node(value);
  if (v.kind != Kind::kSwitch || written <= 0) return value;
  return v.alternatives[std::min<int64_t>(written, static_cast<int64_t>(v.alternatives.size())) - 1];
}
bool RequiredFrom(const Node& n, int from) {
  for (int j = from; j < static_cast<int>(n.properties.size()); ++j)
    if (n.properties[j].required) return true;
  return false;
}

// Whether an integer part that starts with the k digits of v (k = 0: none yet; zero: a
// leading 0, which takes no more digits) can still end in bounds. Pow10 up to 10^15.
int64_t Pow10(int j) {
  int64_t p = 1;
  while (j-- > 0) p *= 10;
  return p;
}
bool NumberFeasible(const Node& n, int sign, int64_t v, int k, bool zero) {
  if (!n.bounded) return true;
  const Node::Range& valid = n.valid[sign];
  const Node::Range& frac = n.frac[sign];
  if (k == 0) return valid.meets(0, kMaxWhole) || frac.meets(0, kMaxWhole);
  for (int j = 0; j <= (zero ? 0 : kMaxIntDigits - k); ++j) {
    const int64_t p = Pow10(j);
    const int64_t a = v * p, b = a + p - 1;
    if (valid.meets(a, b) || frac.meets(a, b)) return true;
  }
  return false;
}
// The fewest bytes that end a number whose integer part so far is v (k digits).
int64_t NumberBytesLeft(const Node& n, int sign, int64_t v, int k, bool zero) {
  if (!n.bounded) return k == 0 ? 1 : 0;  // after a '-', a digit is due
  int64_t best = kInf;
  for (int j = 0; j <= (zero ? 0 : kMaxIntDigits - k); ++j) {
    const int64_t p = Pow10(j);
    const int64_t a = k == 0 ? (j == 0 ? -1 : j == 1 ? 0 : Pow10(j - 1)) : v * p;
    const int64_t b = k == 0 ? (j == 0 ? -1 : Pow10(j) - 1) : a + p - 1;
    if (a < 0) continue;
    if (n.valid[sign].meets(a, b)) best = std::min<int64_t>(best, j);
    if (n.frac[sign].meets(a, b)) best = std::min<int64_t>(best, j + 2);
  }
  return best;
}

}  // namespace

Matcher::Step Matcher::StepFrame(Frame& f, uint8_t c, int* push) const {
  const Node& n = g_->node(f.node);
  switch (n.kind) {
    case Kind::kAnyOf:
    case Kind::kAny:
    case Kind::kSwitch: {  // a switch is resolved by its object; alone, the first that fits
      for (int a : n.alternatives) {
        // The alternative whose value can start with c (they are disjoint).
        if (g_->first_bytes(a).test(c)) {
          *push = a;
          return Step::kReplaceRetry;
        }
      }
      return Step::kReject;
    }
    case Kind::kLiterals: {
      const std::string& cur = n.literals[f.c];
      for (size_t j = f.c; j < n.literals.size(); ++j) {
        const std::string& l = n.literals[j];
        if (l.size() > static_cast<size_t>(f.a) && l.compare(0, f.a, cur, 0, f.a) == 0 && static_cast<uint8_t>(l[f.a]) == c) {
          f.c = static_cast<int32_t>(j);
          ++f.a;
          // Complete, and no other literal goes on from here: done.
          bool longer = false;
          for (size_t k = j; k < n.literals.size() && !longer; ++k)
            longer = n.literals[k].size() > static_cast<size_t>(f.a) && n.literals[k].compare(0, f.a, l, 0, f.a) == 0;
          return longer ? Step::kConsumed : l.size() == static_cast<size_t>(f.a) ? Step::kPopConsumed : Step::kConsumed;
        }
      }
      for (size_t j = f.c; j < n.literals.size(); ++j)
        if (n.literals[j].size() == static_cast<size_t>(f.a) && n.literals[j].compare(0, f.a, cur, 0, f.a) == 0 && f.a > 0)
          return Step::kPopRetry;
      return Step::kReject;
    }
    case Kind::kNumber: {
      // Phases: 0 start, 1 after '-', 2 integer digits, 3 after a leading 0, 4 after '.',
      // 5 fraction digits, 6 after e, 7 after the exponent's sign, 8 exponent digits.
      // a = digits of the current part, e = the integer part, c = 1 when negative.
      const bool digit = IsDigit(c);
      const bool bounded = n.bounded;
      switch (f.phase) {
        case 0:
          if (c == '-') {
            if (!NumberFeasible(n, 1, 0, 0, false)) return Step::kReject;
            f.phase = 1;
            f.c = 1;
            return Step::kConsumed;
          }
          [[fallthrough]];
        case 1:
          if (!digit) return Step::kReject;
          if (!NumberFeasible(n, f.c, c - '0', 1, c == '0')) return Step::kReject;
          f.phase = c == '0' ? 3 : 2;
          f.a = 1;
          f.e = c - '0';
          return Step::kConsumed;
        case 2:
          if (digit) {
            if (f.a >= kMaxIntDigits || !NumberFeasible(n, f.c, f.e * 10 + (c - '0'), f.a + 1, false))
              return Step::kReject;
            ++f.a;
            f.e = f.e * 10 + (c - '0');
            return Step::kConsumed;
          }
          [[fallthrough]];
        case 3:
          if (c == '.' && !n.integer && (!bounded || n.frac[f.c].has(f.e))) {
            f.phase = 4;
            return Step::kConsumed;
          }
          if ((c == 'e' || c == 'E') && !n.integer && !bounded) {
            f.phase = 6;
            return Step::kConsumed;
          }
          return !bounded || n.valid[f.c].has(f.e) ? Step::kPopRetry : Step::kReject;
        case 4:
          if (digit) { f.phase = 5; f.a = 1; return Step::kConsumed; }
          return Step::kReject;
        case 5:
          if (digit) {
            if (f.a >= kMaxFracDigits) return Step::kReject;
            ++f.a;
            return Step::kConsumed;
          }
          if ((c == 'e' || c == 'E') && !bounded) { f.phase = 6; return Step::kConsumed; }
          return Step::kPopRetry;
        case 6:
          if (c == '+' || c == '-') { f.phase = 7; return Step::kConsumed; }
          [[fallthrough]];
        case 7:
          if (digit) { f.phase = 8; f.a = 1; return Step::kConsumed; }
          return Step::kReject;
        case 8:
          if (digit) {
            if (f.a >= kMaxExpDigits) return Step::kReject;
            ++f.a;
            return Step::kConsumed;
          }
          return Step::kPopRetry;
      }
      return Step::kReject;
    }
    case Kind::kString: {
      // a = characters so far, b = continuation bytes still due, c = escape state (1 after
      // '\', 2..5 in \uXXXX), d = the lead byte / the \u value so far.
      if (f.phase == 0) {
        if (c != '"') return Step::kReject;
        f.phase = 1;
        return Step::kConsumed;
      }
      if (f.b > 0) {
        if ((c & 0xC0) != 0x80) return Step::kReject;
        if (f.d == 0xE0 && c < 0xA0) return Step::kReject;  // overlong
        if (f.d == 0xED && c >= 0xA0) return Step::kReject;  // a surrogate
        f.d = 0;
        --f.b;
        return Step::kConsumed;
      }
      if (f.c == 1) {
        if (c == 'u') {
          f.c = 2;
          f.d = 0;
          return Step::kConsumed;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
          f.c = 0;
          return Step::kConsumed;
        }
        return Step::kReject;
      }
      if (f.c >= 2) {
        const int h = HexValue(c);
        if (h < 0) return Step::kReject;
        f.d = f.d * 16 + h;
        if (f.c == 3 && f.d >= 0xD8 && f.d <= 0xDF) return Step::kReject;  // a surrogate: outside the BMP
        f.c = f.c == 5 ? 0 : f.c + 1;
        return Step::kConsumed;
      }
      if (c == '"') return f.a >= n.min_length ? Step::kPopConsumed : Step::kReject;
      if (c < 0x20 || c >= 0xF0 || (c >= 0x80 && c < 0xC2)) return Step::kReject;
      if (f.a >= n.max_length) return Step::kReject;
      ++f.a;
      if (c == '\\') {
        f.c = 1;
      } else if (c >= 0xE0) {
        f.b = 2;
        f.d = c;
      } else if (c >= 0xC2) {
        f.b = 1;
      }
      return Step::kConsumed;
    }
    case Kind::kArray: {
      // a = items done. Phases: 0 before '[', 1 after '[', 2 in an item, 3 after an item.
      switch (f.phase) {
        case 0:
          if (c != '[') return Step::kReject;
          f.phase = 1;
          return Step::kConsumed;
        case 1:
          if (c == ']') return n.min_items == 0 ? Step::kPopConsumed : Step::kReject;
          if (n.max_items == 0) return Step::kReject;
          f.phase = 2;
          *push = n.items;
          return Step::kPushRetry;
        case 3:
          if (c == ']') return f.a >= n.min_items ? Step::kPopConsumed : Step::kReject;
          if (c == ',' && f.a < n.max_items) {
            f.phase = 2;
            *push = n.items;
            return Step::kConsumed;
          }
          return Step::kReject;
      }
      return Step::kReject;
    }
    case Kind::kObject: {
      if (n.any_keys) {
        // A map: phases 0 before '{', 1 after '{' or a value, 2 after ',', 3 in a key,
        // 4 before ':', 5 in a value.
        switch (f.phase) {
          case 0:
            if (c != '{') return Step::kReject;
            f.phase = 1;
            return Step::kConsumed;
          case 1:
            if (c == '}') return Step::kPopConsumed;
            if (c == ',' && f.b) { f.phase = 2; return Step::kConsumed; }
            if (c == '"' && !f.b) break;
            return Step::kReject;
          case 2:
            if (c == '"') break;
            return Step::kReject;
          case 4:
            if (c != ':') return Step::kReject;
            f.phase = 5;
            *push = n.items;
            return Step::kConsumed;
          default:
            return Step::kReject;
        }
        f.phase = 3;
        *push = g_->plain_string();  // the key
        return Step::kPushRetry;
      }
      const int np = static_cast<int>(n.properties.size());
      auto start_key = [&]() {
        if (f.a >= np) return Step::kReject;
        f.c = f.a;  // the first candidate; all keys start with '"'
        f.d = 1;
        f.phase = 3;
        return Step::kConsumed;
      };
      switch (f.phase) {
        case 0:
          if (c != '{') return Step::kReject;
          f.phase = 1;
          return Step::kConsumed;
        case 1:
          if (c == '}') return RequiredFrom(n, static_cast<int>(f.a)) ? Step::kReject : Step::kPopConsumed;
          if (c == ',' && f.b && f.a < np) { f.phase = 2; return Step::kConsumed; }
          if (c == '"' && !f.b) return start_key();
          return Step::kReject;
        case 2:
          if (c == '"') return start_key();
          return Step::kReject;
        case 3: {
          const std::string& cur = n.properties[f.c].key;
          const int last = LastCandidate(n, static_cast<int>(f.a));
          for (int j = f.c; j <= last; ++j) {
            const std::string& k = n.properties[j].key;
            if (k.size() > static_cast<size_t>(f.d) && k.compare(0, f.d, cur, 0, f.d) == 0 &&
                static_cast<uint8_t>(k[f.d]) == c) {
              f.c = j;
              if (++f.d == static_cast<int32_t>(k.size())) f.phase = 4;
              return Step::kConsumed;
            }
          }
          return Step::kReject;
        }
        case 4:
          if (c != ':') return Step::kReject;
          f.phase = 5;
          *push = ValueNode(*g_, n.properties[f.c].value, f.e);
          return Step::kConsumed;
      }
      return Step::kReject;
    }
  }
  return Step::kReject;
}

int Matcher::LiteralWritten(const Frame& f) const {
  const Node& n = g_->node(f.node);
  if (n.kind != Kind::kLiterals) return -1;
  if (n.literals[f.c].size() == static_cast<size_t>(f.a)) return f.c;
  for (size_t j = 0; j < n.literals.size(); ++j)  // a pop on the next byte: the exact one
    if (n.literals[j].size() == static_cast<size_t>(f.a) && n.literals[j].compare(0, f.a, n.literals[f.c], 0, f.a) == 0)
      return static_cast<int>(j);
  return -1;
}

void Matcher::ChildDone(int literal) {
  if (stack_.empty()) return;
  Frame& f = stack_.back();
  const Node& n = g_->node(f.node);
  if (n.kind == Kind::kArray) {
    ++f.a;
    f.phase = 3;
  } else if (n.kind == Kind::kObject) {
    if (n.any_keys) {
      if (f.phase == 3) {
        f.phase = 4;
      } else {
        f.b = 1;
        f.phase = 1;
      }
    } else {
      f.a = f.c + 1;
      f.b = 1;
      f.phase = 1;
      if (literal >= 0) f.e = literal + 1;
    }
  }
}

bool Matcher::Feed(uint8_t byte) {
  for (int guard = 0; guard < 4 * kMaxAnyDepth + 64; ++guard) {
    if (stack_.empty()) return false;
    int push = -1;
    const Step s = StepFrame(stack_.back(), byte, &push);
    switch (s) {
      case Step::kConsumed:
        if (push >= 0) stack_.push_back(NewFrame(push));
        return true;
      case Step::kReject:
        return false;
      case Step::kPopConsumed: {
        const int literal = LiteralWritten(stack_.back());
        stack_.pop_back();
        ChildDone(literal);
        return true;
      }
      case Step::kPopRetry: {
        const int literal = LiteralWritten(stack_.back());
        stack_.pop_back();
        ChildDone(literal);
        continue;
      }
      case Step::kPushRetry:
        stack_.push_back(NewFrame(push));
        continue;
      case Step::kReplaceRetry:
        stack_.back() = NewFrame(push);
        continue;
    }
  }
  return false;
}

int64_t Matcher::MinBytesLeft() const {
  int64_t total = 0;
  for (const Frame& f : stack_) {
    const Node& n = g_->node(f.node);
    int64_t v = 0;
    switch (n.kind) {
      case Kind::kAnyOf:
      case Kind::kAny:
      case Kind::kSwitch:
        v = g_->min_bytes(f.node);
        break;
      case Kind::kLiterals: {
        v = kInf;
        const std::string& cur = n.literals[f.c];
        for (size_t j = f.c; j < n.literals.size(); ++j)
          if (n.literals[j].size() >= static_cast<size_t>(f.a) && n.literals[j].compare(0, f.a, cur, 0, f.a) == 0)
            v = std::min<int64_t>(v, n.literals[j].size() - f.a);
        break;
      }
      case Kind::kNumber:
        if (f.phase == 0) {
          v = g_->min_bytes(f.node);
        } else if (f.phase == 1) {
          v = NumberBytesLeft(n, 1, 0, 0, false);
        } else if (f.phase == 2 || f.phase == 3) {
          v = NumberBytesLeft(n, f.c, f.e, static_cast<int>(f.a), f.phase == 3);
        } else {
          v = (f.phase == 5 || f.phase == 8) ? 0 : 1;
        }
        break;
      case Kind::kString:
        if (f.phase == 0) {
          v = g_->min_bytes(f.node);
        } else {
          v = f.b + (f.c == 1 ? 1 : f.c >= 2 ? 6 - f.c : 0) + std::max<int64_t>(0, n.min_length - f.a) + 1;
        }
        break;
      case Kind::kArray: {
        const int64_t item = g_->min_bytes(n.items);
        if (f.phase == 0) {
          v = g_->min_bytes(f.node);
        } else if (f.phase == 1) {
          v = n.min_items == 0 ? 1 : Add(Add(Mul(n.min_items, item), n.min_items - 1), 1);
        } else {
          const int64_t done = f.a + (f.phase == 2 ? 1 : 0);
          v = Add(Mul(std::max<int64_t>(0, n.min_items - done), item + 1), 1);
        }
        break;
      }
      case Kind::kObject: {
        if (f.phase == 0) {
          v = g_->min_bytes(f.node);
          break;
        }
        if (n.any_keys) {
          static const int64_t kByPhase[] = {2, 1, 5, 3, 3, 1};
          v = kByPhase[f.phase];
          break;
        }
        // The required properties after position `from`, each with its comma.
        auto rest = [&](int from, bool comma_first) {
          int64_t r = 0;
          bool first = !comma_first;
          for (int j = from; j < static_cast<int>(n.properties.size()); ++j) {
            const auto& p = n.properties[j];
            if (!p.required) continue;
            r = Add(r, Add(static_cast<int64_t>(p.key.size()) + 1 + (first ? 0 : 1), g_->min_bytes(ValueNode(*g_, p.value, f.e))));
            first = false;
          }
          return r;
        };
        const auto& props = n.properties;
        switch (f.phase) {
          case 1:
            v = Add(1, rest(static_cast<int>(f.a), f.b != 0));
            break;
          case 2: {
            if (RequiredFrom(n, static_cast<int>(f.a))) {
              v = Add(1, rest(static_cast<int>(f.a), false));
            } else {
              v = kInf;
              for (size_t j = f.a; j < props.size(); ++j)
                v = std::min(v, Add(static_cast<int64_t>(props[j].key.size()) + 2, g_->min_bytes(ValueNode(*g_, props[j].value, f.e))));
            }
            break;
          }
          case 3:
            v = Add(Add(static_cast<int64_t>(props[f.c].key.size()) - f.d + 1, g_->min_bytes(ValueNode(*g_, props[f.c].value, f.e))),
                    Add(1, rest(f.c + 1, true)));
            break;
          case 4:
            v = Add(Add(1, g_->min_bytes(ValueNode(*g_, props[f.c].value, f.e))), Add(1, rest(f.c + 1, true)));
            break;
          case 5:
            v = Add(1, rest(f.c + 1, true));
            break;
        }
        break;
      }
    }
    total = Add(total, v);
  }
  return total;
}

std::string Matcher::Key() const {
  return std::string(reinterpret_cast<const char*>(stack_.data()), stack_.size() * sizeof(Frame));
}

// --- Vocabulary ---------------------------------------------------------------------------

Vocabulary::Vocabulary(const tokenizer::Tokenizer& tok) : vocab_(tok.vocab_size()) {
  trie_.push_back(TrieNode{});
  bytes_.resize(vocab_);
  std::vector<std::pair<int32_t, int32_t>> ends;  // (trie node, token)
  ByteSet single;
  for (int32_t id = 0; id < vocab_; ++id) {
    if (tok.IsSpecial(id)) continue;
    const std::string bytes = tok.TokenBytes(id);
    if (bytes.empty()) continue;
    if (bytes.size() == 1) single.set(static_cast<uint8_t>(bytes[0]));
    bytes_[id] = bytes;
    int32_t at = 0;
    for (unsigned char b : bytes) {
      int32_t child = trie_[at].first_child;
      while (child >= 0 && trie_[child].byte != b) child = trie_[child].next_sibling;
      if (child < 0) {
        TrieNode node;
        node.byte = b;
        node.next_sibling = trie_[at].first_child;
        trie_.push_back(node);
        child = static_cast<int32_t>(trie_.size()) - 1;
        trie_[at].first_child = child;
      }
      at = child;
    }
    ends.emplace_back(at, id);
  }
  std::sort(ends.begin(), ends.end());
  tokens_.reserve(ends.size());
  for (const auto& [node, id] : ends) {
    if (trie_[node].n_tokens == 0) trie_[node].first_token = static_cast<int32_t>(tokens_.size());
    ++trie_[node].n_tokens;
    tokens_.push_back(id);
  }
  // The structural bytes and digits are what completing a value needs.
  every_byte_ = true;
  for (const char* s = "{}[],:\"-0123456789.eEtrufalsn\\"; *s; ++s) every_byte_ = every_byte_ && single.test(static_cast<uint8_t>(*s));
}

// --- JsonProcessor --------------------------------------------------------------------------

JsonProcessor::JsonProcessor(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> vocab, int64_t budget)
    : g_(std::move(g)), vocab_(std::move(vocab)), matcher_(g_.get()), left_(budget) {}

namespace {

struct Walk {
  const Vocabulary& v;
  std::vector<uint32_t>& mask;
  int64_t budget;  // < 0: none; else the most bytes what a token leaves may need
  int64_t max_left = 0;
  std::vector<Matcher> scratch;

  void Visit(int32_t node, int depth) {
    for (int32_t child = v.trie_[node].first_child; child >= 0; child = v.trie_[child].next_sibling) {
      if (static_cast<int>(scratch.size()) <= depth + 1) scratch.push_back(scratch[depth]);
      scratch[depth + 1] = scratch[depth];
      Matcher& m = scratch[depth + 1];
      if (!m.Feed(v.trie_[child].byte)) continue;
      const Vocabulary::TrieNode& t = v.trie_[child];
      if (t.n_tokens > 0) {
        const int64_t left = m.MinBytesLeft();
        if (budget < 0 || left <= budget) {
          max_left = std::max(max_left, left);
          for (int32_t i = 0; i < t.n_tokens; ++i) {
            const int32_t id = v.tokens_[t.first_token + i];
            mask[id >> 5] |= 1u << (id & 31);
          }
        }
      }
      Visit(child, depth + 1);
    }
  }
};

}  // namespace

std::shared_ptr<const std::vector<uint32_t>> JsonProcessor::Compute(int64_t budget, int64_t* max_left) const {
  auto mask = std::make_shared<std::vector<uint32_t>>((vocab_->size() + 31) / 32, 0u);
  Walk w{*vocab_, *mask, budget, 0, {matcher_}};
  w.scratch.reserve(64);
  w.Visit(0, 0);
  *max_left = w.max_left;
  return mask;
}

std::shared_ptr<const std::vector<uint32_t>> JsonProcessor::Mask() {
  // The mask without the budget, cached by state with the most bytes any allowed token
  // leaves to write; when the tokens left cover that, the budget changes nothing.
  const std::string key = matcher_.Key();
  Grammar::MaskCache& cache = g_->cache();
  std::shared_ptr<const std::vector<uint32_t>> mask;
  int64_t max_left = 0;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.vocab != vocab_.get()) {
      cache.masks.clear();
      cache.vocab = vocab_.get();
    }
    if (auto it = cache.masks.find(key); it != cache.masks.end()) {
      mask = it->second.first;
      max_left = it->second.second;
    }
  }
  if (!mask) {
    mask = Compute(-1, &max_left);
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.masks.size() >= Grammar::kMaxCachedMasks) cache.masks.clear();
    cache.masks.emplace(key, std::make_pair(mask, max_left));
  }
  // After this token, left_ - 1 tokens remain, each at least one byte.
  if (max_left > left_ - 1) {
    int64_t unused;
    auto budgeted = Compute(std::max<int64_t>(0, left_ - 1), &unused);
    // Nothing can end in time (a budget below the shortest instance): keep to the
    // grammar, the reply ends by length.
    for (uint32_t w : *budgeted)
      if (w != 0) return budgeted;
  }
  return mask;
}

void JsonProcessor::Apply(float* logits, int vocab) {
  if (matcher_.Complete()) return;
  const std::shared_ptr<const std::vector<uint32_t>> mask = Mask();
  bool any = false;
  for (uint32_t w : *mask) any = any || w != 0;
  if (!any) return;  // nothing fits (cannot happen with every byte a token): leave the row
  const std::vector<uint32_t>& m = *mask;
  const int n = std::min(vocab, vocab_->size());
  for (int i = 0; i < n; ++i)
    if (!(m[i >> 5] >> (i & 31) & 1)) logits[i] = -INFINITY;
  for (int i = n; i < vocab; ++i) logits[i] = -INFINITY;
}

void JsonProcessor::Accept(int32_t token) {
  --left_;
  if (token < 0 || token >= vocab_->size()) return;
  for (unsigned char b : vocab_->bytes_[token]) matcher_.Feed(b);
}

}  // namespace attic::grammar
