#include "plugin/model/stage_split.h"

#include <sstream>

namespace conveyor {

std::string StageSplit::str() const {
  std::ostringstream os;
  for (size_t k = 0; k < stages.size(); ++k) {
    if (k) os << "; ";
    os << "stage " << k << ": layers [" << stages[k].begin << ", " << stages[k].end << ") on " << stages[k].device;
  }
  return os.str();
}

}  // namespace conveyor
