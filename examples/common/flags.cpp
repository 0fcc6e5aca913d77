#include "examples/common/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace conveyor::examples {

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    throw UsageError(flag + " expects an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                     text + "'");
  }
  return value;
}

double parse_real(const std::string& flag, const std::string& text, double min, double max, bool max_included) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool in_range = value >= min && (max_included ? value <= max : value < max);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || !in_range) {
    std::ostringstream os;
    os << flag << " expects a number in [" << min << ", " << max << (max_included ? "]" : ")") << ", got '" << text
       << "'";
    throw UsageError(os.str());
  }
  return value;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw UsageError(flag + " has an empty item in '" + text + "'");
    items.push_back(item);
  }
  if (items.empty()) throw UsageError(flag + " needs at least one value");
  return items;
}

Flags& Flags::on(const std::string& name, Handler handler) {
  handlers_[name] = std::move(handler);
  return *this;
}

Flags& Flags::integer(const std::string& name, int64_t* value, int64_t min, int64_t max) {
  return on(name, [=](const std::string& flag, const std::string& text) { *value = parse_int(flag, text, min, max); });
}

Flags& Flags::real(const std::string& name, double* value, double min, double max, bool max_included) {
  return on(name, [=](const std::string& flag, const std::string& text) {
    *value = parse_real(flag, text, min, max, max_included);
  });
}

Flags& Flags::text(const std::string& name, std::string* value) {
  return on(name, [=](const std::string&, const std::string& text) { *value = text; });
}

Flags& Flags::renamed(const std::string& old_name, const std::string& new_name, const std::string& why) {
  return on(old_name, [=](const std::string&, const std::string&) {
    throw UsageError(old_name + " is now " + new_name + (why.empty() ? "" : ": " + why));
  });
}

Flags& Flags::toggle(const std::string& name, bool* value) {
  toggles_[name] = value;
  return *this;
}

bool Flags::parse(int argc, char** argv) const {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") return false;
    const size_t eq = flag.find('=');
    const bool inline_value = flag.starts_with("--") && eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    }
    if (const auto toggle = toggles_.find(flag); toggle != toggles_.end()) {
      if (inline_value && value != "true" && value != "false") {
        throw UsageError(flag + " takes no value (or =true / =false), got '" + value + "'");
      }
      *toggle->second = !inline_value || value == "true";
      continue;
    }
    const auto handler = handlers_.find(flag);
    if (handler == handlers_.end()) throw UsageError("unknown argument '" + flag + "'");
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      value = argv[++i];
    }
    handler->second(flag, value);
  }
  return true;
}

int run_main(const std::string& program, const std::string& help, const std::function<bool()>& parse,
             const std::function<int()>& run) {
  try {
    if (!parse()) {
      std::cout << help;
      return 0;
    }
    return run();
  } catch (const std::exception& e) {
    const bool usage = dynamic_cast<const UsageError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e);
    std::cerr << program << ": " << e.what() << "\n";
    if (usage) std::cerr << "Run '" << program << " --help' for the flags and the data.\n";
    return usage ? 2 : 1;
  }
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace conveyor::examples
