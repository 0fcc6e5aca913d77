#pragma once
// The test_distributed binary's worker: a process started as one rank runs
// the roles its test names, each defined in its own header.
#include "distributed/hybrid_roles.h"
#include "distributed/reshard_roles.h"
#include "distributed/sharded_roles.h"
#include "distributed_roles.h"
#include "distributed_tensor_roles.h"

#include <iostream>
#include <set>
#include <string>

namespace conveyor::testing {

inline int run_worker(const std::string& role) {
  const std::set<std::string> roles = {"two", "four", "sharded", "reshard", "faulty"};
  if (!roles.count(role)) {
    std::cerr << "unknown role " << role << "\n";
    return 2;
  }
  return run_rank([&](Worker& w) {
    if (role == "two") {
      pipelines(w);
      data_parallel(w);
      declared_shape_mismatch(w);
      released_sends(w);
      several_tensors(w);
      training_options(w);
    } else if (role == "four") {
      pipelines(w);
      hybrid(w);
      hybrid_schedules(w);
      training_options(w);
    } else if (role == "sharded") {
      sharded(w);
    } else if (role == "reshard") {
      reshard(w);
    } else {
      faulty(w);
    }
  });
}

}  // namespace conveyor::testing
