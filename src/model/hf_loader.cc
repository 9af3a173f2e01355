// Loading a Hugging Face checkpoint directory: config.json, model.safetensors or
// model.safetensors.index.json + shards, tokenizer.json, tokenizer_config.json /
// chat_template.jinja.
#include <set>

#include "attic/model/tensor_specs.h"
#include "model/json_util.h"
#include "model/model_builder.h"
#include "model/safetensors.h"

namespace attic::model {

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Reads the shard index: tensor name -> shard file name.
StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  ATTIC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ATTIC_ASSIGN_OR_RETURN(Json j, ParseJson(text, path));
  const Json* wm = FindMember(j, "weight_map");
  if (wm == nullptr || !wm->is_object()) return DataLossError(path + ": no 'weight_map' object");
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return DataLossError(path + ": weight_map values must be file names");
    std::string file = it.value().get<std::string>();
    if (file.empty() || file[0] == '/' || file.find("..") != std::string::npos) {
      return DataLossError(path + ": weight_map names an invalid file '" + file + "'");
    }
    out[it.key()] = file;
  }
  if (out.empty()) return DataLossError(path + ": empty weight_map");
  return out;
}

// The chat template of tokenizer_config.json ("chat_template": a string, or a list of
// {"name", "template"} from which "default" is taken), else chat_template.jinja.
StatusOr<std::string> ReadChatTemplate(const std::string& dir) {
  const std::string cfg = JoinPath(dir, "tokenizer_config.json");
  if (FileExists(cfg)) {
    ATTIC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(cfg));
    ATTIC_ASSIGN_OR_RETURN(Json j, ParseJson(text, cfg));
    if (const Json* t = FindMember(j, "chat_template")) {
      if (t->is_string()) return t->get<std::string>();
      if (t->is_array()) {
        for (const Json& e : *t) {
          const Json* name = FindMember(e, "name");
          const Json* tmpl = FindMember(e, "template");
          if (name && tmpl && name->is_string() && tmpl->is_string() && name->get<std::string>() == "default") {
            return tmpl->get<std::string>();
          }
        }
      }
    }
  }
  const std::string jinja = JoinPath(dir, "chat_template.jinja");
  if (FileExists(jinja)) return ReadFileToString(jinja);
  return std::string();
}

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadHfDirectory(const std::string& dir, const LoadOptions& opts) {
  const std::string cfg_path = JoinPath(dir, "config.json");
  if (!FileExists(cfg_path)) return NotFoundError("'" + dir + "' has no config.json (not a Hugging Face model directory)");
  ATTIC_ASSIGN_OR_RETURN(std::string cfg_text, ReadFileToString(cfg_path));
  auto cfg = ParseHfConfig(cfg_text);
  if (!cfg.ok()) return cfg.status().WithContext(cfg_path);

  ModelBuilder b(dir, /*is_gguf=*/false);
  b.config() = *cfg;

  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // sharded checkpoints only
  if (FileExists(JoinPath(dir, kSingleFile))) {
    files.push_back(kSingleFile);
  } else if (FileExists(JoinPath(dir, kIndexFile))) {
    ATTIC_ASSIGN_OR_RETURN(weight_map, ReadIndex(JoinPath(dir, kIndexFile)));
    std::set<std::string> unique;
    for (const auto& [name, file] : weight_map) unique.insert(file);
    files.assign(unique.begin(), unique.end());
  } else {
    return NotFoundError("'" + dir + "' has neither " + kSingleFile + " nor " + kIndexFile);
  }

  std::set<std::string> needed;
  for (const TensorSpec& s : ModelTensorSpecs(*cfg)) needed.insert(s.name);

  std::map<std::string, SourceTensor> tensors;
  for (const std::string& file : files) {
    const std::string path = JoinPath(dir, file);
    ATTIC_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
    ATTIC_ASSIGN_OR_RETURN(auto entries, ParseSafetensors(mapped->data(), mapped->size(), path));
    for (SafetensorsEntry& e : entries) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->second != file) continue;  // the index decides
      }
      if (needed.count(e.name) != 0 && !e.dtype) {
        return UnimplementedError(path + ": tensor '" + e.name + "' has dtype " + e.dtype_name +
                                  " (supported: F32, F16, BF16)");
      }
      if (!e.dtype) continue;
      if (tensors.count(e.name) != 0) return DataLossError(path + ": tensor '" + e.name + "' appears twice");
      tensors[e.name] = SourceTensor{*e.dtype, std::move(e.shape), e.data, e.nbytes, file};
    }
    b.AddFile(std::move(mapped));
  }
  for (const auto& [name, file] : weight_map) {
    if (needed.count(name) != 0 && tensors.count(name) == 0) {
      return DataLossError(JoinPath(dir, kIndexFile) + " places tensor '" + name + "' in " + file +
                           ", which does not contain it");
    }
  }

  const std::string tok = JoinPath(dir, "tokenizer.json");
  if (FileExists(tok)) b.set_tokenizer_json_path(tok);
  ATTIC_ASSIGN_OR_RETURN(std::string chat_template, ReadChatTemplate(dir));
  b.set_chat_template(std::move(chat_template));
  return b.Finish(tensors, opts);
}

}  // namespace attic::model
