#include "bench/common/model_shapes.h"

namespace attic::bench {

const std::vector<ModelShape>& BenchModelShapes() {
  static const std::vector<ModelShape> kShapes = {
      {"smollm2-135m", 576, 9, 3, 64, 1536, 30, 49152},
      {"llama-1b", 2048, 32, 8, 64, 8192, 16, 49152},
  };
  return kShapes;
}

}  // namespace attic::bench
