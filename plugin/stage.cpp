#include "plugin/stage.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <stdexcept>

namespace conveyor {

Stage::Stage(int index, std::vector<std::pair<std::string, torch::nn::AnyModule>> layers, int64_t first_layer,
             c10::Device device)
    : index_(index), first_layer_(first_layer), device_(device), layers_(std::move(layers)) {
  for (auto& [name, layer] : layers_) {
    layer.ptr()->to(device_);
    module_->push_back(name, layer);
  }
}

at::Tensor Stage::forward(const at::Tensor& input) const {
  at::Tensor x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string& name = layers_[i].first;
    torch::nn::AnyModule layer = layers_[i].second;  // forward() is non-const; the copy shares the module
    try {
      x = layer.forward<at::Tensor>(x);
    } catch (const std::exception& e) {
      std::ostringstream os;
      os << "layer " << name << " (";
      layer.ptr()->pretty_print(os);
      os << "): ";
      if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
        os << c10_error->what_without_backtrace();
      } else {
        os << e.what();
      }
      throw std::runtime_error(os.str());
    }
  }
  return x;
}

}  // namespace conveyor
