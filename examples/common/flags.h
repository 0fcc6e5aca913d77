#pragma once
// Command-line flags of the example programs: --flag VALUE or --flag=VALUE,
// --help or -h for the help text, and errors (UsageError) that name the flag
// and what it expects.

#include "plugin/core/option_values.h"

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor::examples {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max);
// A finite number in [min, max] (or [min, max) when !max_included).
double parse_real(const std::string& flag, const std::string& text, double min, double max, bool max_included = true);
// "a,b,c" -> {"a", "b", "c"}; an empty item or list is an error.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);

class Flags {
 public:
  using Handler = std::function<void(const std::string& flag, const std::string& value)>;
  Flags& on(const std::string& name, Handler handler);
  Flags& integer(const std::string& name, int64_t* value, int64_t min, int64_t max);
  Flags& real(const std::string& name, double* value, double min, double max, bool max_included = true);
  Flags& text(const std::string& name, std::string* value);
  // A flag for the option row `row` of `options` (PipelineOptions): its
  // value read by the row's type, as Python's text
  // would be (plugin/core/option_values.h).
  template <typename Options>
  Flags& option(const std::string& name, Options* options, const std::string& row) {
    return on(name, [options, row](const std::string& flag, const std::string& value) {
      try {
        read_option(*options, row, c10::IValue(value), ValueText::kOrText, flag);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    });
  }
  // A switch: present sets *value (no value follows; --name=false clears it).
  Flags& toggle(const std::string& name, bool* value);
  // A flag's old spelling: using it is a UsageError that names the new one.
  Flags& renamed(const std::string& old_name, const std::string& new_name, const std::string& why = "");
  // Returns false when --help or -h is among the arguments; throws UsageError
  // for an unknown flag, a missing value or a value its flag refuses.
  bool parse(int argc, char** argv) const;

 private:
  std::map<std::string, Handler> handlers_;
  std::map<std::string, bool*> toggles_;
};

// An example's main: `parse` reads the flags (false: --help, so `help` is
// printed), then `run` gives the exit status. A UsageError or an
// std::invalid_argument prints "<program>: <what>" and a pointer to --help
// and gives 2; any other exception prints its message and gives 1.
int run_main(const std::string& program, const std::string& help, const std::function<bool()>& parse,
             const std::function<int()>& run);

// `value` with `digits` digits after the point.
std::string fixed(double value, int digits);

}  // namespace conveyor::examples
