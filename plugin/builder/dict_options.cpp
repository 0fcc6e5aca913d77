#include "plugin/builder/dict_options.h"

#include "plugin/builder/option_table.h"
#include "plugin/core/errors.h"

#include <c10/util/StringUtil.h>
#include <torch/nn/functional/loss.h>

#include <stdexcept>

namespace conveyor {

namespace {

at::Tensor first_of(const Tensors& tensors, const char* what) {
  check_argument(!tensors.empty() && tensors[0].defined(), "conveyor.Pipeline: the built-in loss needs a ", what);
  return tensors[0];
}

at::Tensor mse(const Tensors& outputs, const Tensors& targets) {
  return torch::mse_loss(first_of(outputs, "model output"), first_of(targets, "target"));
}

at::Tensor cross_entropy(const Tensors& outputs, const Tensors& targets) {
  const at::Tensor out = first_of(outputs, "model output"), target = first_of(targets, "target");
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

TensorsLossFn loss_from(const c10::IValue& v) {
  if (v.isString()) {
    if (v.toStringRef() == "mse") return mse;
    if (v.toStringRef() == "cross_entropy") return cross_entropy;
  } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
    torch::jit::Module module(v.toObject());
    return [module](const Tensors& outputs, const Tensors& targets) mutable {
      std::vector<c10::IValue> args(outputs.begin(), outputs.end());
      args.insert(args.end(), targets.begin(), targets.end());
      return module.forward(std::move(args)).toTensor();
    };
  }
  throw bad_option("loss", "\"cross_entropy\", \"mse\" or a scripted module", v);
}

}  // namespace

const std::set<std::string>& dict_option_names() {
  static const std::set<std::string> known = [] {
    std::set<std::string> out = {"loss", "sample"};
    for (const OptionDescription& row : every_option()) {
      if (!row.type.empty()) out.insert(row.name);
    }
    return out;
  }();
  return known;
}

BuildRequest request_from_dict(const PythonOptions& options, ValueText text) {
  count_request(RequestStage::kParse);
  BuildRequest request;
  request.loss = mse;
  for (const auto& entry : options) {
    const std::string& key = entry.key();
    const c10::IValue& v = entry.value();
    if (key == "stages") {
      throw std::invalid_argument("conveyor.Pipeline: option 'stages' is now 'workers': a stage is a piece of the "
                                  "model, a worker the thread that runs one or more stages");
    }
    if (key == "loss") {
      request.loss = loss_from(v);
    } else if (key == "sample") {
      if (!v.isTuple() || v.toTupleRef().elements().size() != 2) {
        throw bad_type(key, "an (input, target) tuple, each a tensor or a tuple of tensors", v);
      }
      request.sample = SampleBatch{as_tensors("sample input", v.toTupleRef().elements()[0]),
                                   as_tensors("sample target", v.toTupleRef().elements()[1])};
    } else if (!read_option(request.options, key, v, text)) {
      throw std::invalid_argument("conveyor.Pipeline: unknown option '" + key + "' (known: " +
                                  c10::Join(", ", dict_option_names()) + ")");
    }
  }
  return request;
}

Model model_from_value(const c10::IValue& model) {
  if (model.isString()) return model.toStringRef();
  if (model.isObject() && model.toObjectRef().type()->is_module()) return torch::jit::Module(model.toObject());
  throw std::invalid_argument(std::string("conveyor.Pipeline: the model must be a TorchScript module ") +
                              "(torch.jit.script or torch.jit.trace), the path of one saved with " +
                              "torch.jit.save, or the path of a torch.export program (.pt2), got " +
                              python_type(model));
}

}  // namespace conveyor
