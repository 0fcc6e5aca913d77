#include "plugin/builder/request.h"

#include "plugin/builder/front_end.h"
#include "plugin/core/errors.h"
#include "plugin/core/option_values.h"
#include "schedules/generators.h"

#include <utility>
#include <vector>

namespace conveyor {

namespace {

// The options of the distributed section, which only a pipeline across
// processes reads: in one process, any of them off its default is refused
// rather than ignored.
void check_distributed_rows(const PipelineOptions& options) {
  std::vector<OptionDescription> given, defaults;
  describe_options(options, given);
  describe_options(PipelineOptions(), defaults);
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i].section != "distributed") continue;
    check_argument(python_repr(given[i].default_value) == python_repr(defaults[i].default_value), "conveyor: option '",
                   given[i].name, "' is for a pipeline across processes; this one runs in one (give process ",
                   "groups, or leave it out)");
  }
}

}  // namespace

void check_request(const BuildRequest& request, int processes, std::optional<ModelKind> kind) {
  count_request(RequestStage::kCheck);
  const bool across_processes = processes > 0;
  PipelineOptions options = request.options;
  check_option_values(options);
  (void)optimizer_factory(options);  // given whole: a name with its lr, or a factory alone
  if (options.schedule_text().empty()) (void)schedules::make_schedule(options.schedule(), 2, 4);  // a known name
  if (across_processes && options.workers() == 0) options.workers(processes);  // one worker per process
  if (!across_processes) check_distributed_rows(options);
  check_split_point_count(options, options.split_points());
  if (kind) check_model_kind(*kind, options);
  check_plan_mode(options, {.sample = request.sample ? &*request.sample : nullptr,
                            .loss = request.loss,
                            .batch_size = request.batch_size,
                            .across_processes = across_processes});
}

CheckedRequest::CheckedRequest(BuildRequest request, int processes, std::optional<ModelKind> kind)
    : request_(std::move(request)), processes_(processes), kind_(kind) {
  check_request(request_, processes_, kind_);
}

void CheckedRequest::attach_loss(TensorsLossFn loss) {
  check_argument(static_cast<bool>(request_.loss) == static_cast<bool>(loss),
                 "conveyor: the request was checked ", request_.loss ? "with" : "without", " a loss");
  request_.loss = std::move(loss);
}

void CheckedRequest::attach_lr_schedule(LearningRateSchedule schedule) {
  request_.options.lr_schedule(std::move(schedule));
}

void CheckedRequest::attach_groups(std::shared_ptr<ProcessGroups> groups) {
  check_argument(groups != nullptr && groups->layout().workers == processes_, "conveyor: the request was checked for ",
                 processes_, " processes, not the ", groups ? groups->layout().workers : 0, " of these groups");
  request_.groups = std::move(groups);
}

}  // namespace conveyor
