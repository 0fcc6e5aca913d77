// Tied parameters across processes: the holders of one logical parameter
// meet at the first holder, which adds their gradients in stage order and
// sends the sum back, so every copy gets the same bits.
#include "plugin/transport/c10d_state.h"

namespace conveyor {

at::Tensor C10dTransport::sum_over_holders(int tie, const std::vector<int>& holders, const at::Tensor& tensor) {
  State& s = *state_;
  s.check_usable();
  const int me = s.options.worker;
  TORCH_CHECK(!holders.empty() && std::find(holders.begin(), holders.end(), me) != holders.end(),
              "conveyor: ", s.prefix, " does not hold tied parameter ", tie);
  const auto deadline = Clock::now() + s.options.timeout;
  const int tag = kTieTags + 4 * tie;
  const std::string what = c10::str("the gradient of tied parameter ", tie);
  const at::Tensor host = tensor.to(c10::kCPU).contiguous();
  const auto exchange = [&](bool sending, at::Tensor buffer, int peer, int peer_tag) {
    std::vector<at::Tensor> list{buffer};
    c10::intrusive_ptr<Work> work;
    try {
      work = sending ? s.group->send(list, peer, peer_tag) : s.group->recv(list, peer, peer_tag);
    } catch (const std::exception& e) {
      s.fail(s.prefix + ": could not exchange " + what + " with " + s.stage_name(peer) + " [" + message_of(e) + "]");
    }
    s.wait(work, deadline, peer, what + (sending ? " to be taken by " : " from ") + s.stage_name(peer));
  };
  if (me != holders[0]) {
    exchange(true, host, holders[0], tag);
    at::Tensor sum = at::empty_like(host);
    exchange(false, sum, holders[0], tag + 1);
    return sum.to(tensor.device());
  }
  at::Tensor sum = host.clone();
  for (int peer : holders) {
    if (peer == me) continue;
    at::Tensor part = at::empty_like(host);
    exchange(false, part, peer, tag);
    sum.add_(part);
  }
  for (int peer : holders) {
    if (peer != me) exchange(true, sum, peer, tag + 1);
  }
  return sum.to(tensor.device());
}

at::Tensor C10dTransport::first_holders_value(int tie, const std::vector<int>& holders, const at::Tensor& tensor) {
  State& s = *state_;
  s.check_usable();
  const int me = s.options.worker;
  const auto deadline = Clock::now() + s.options.timeout;
  const int tag = kTieTags + 4 * tie + 2;
  const std::string what = c10::str("the initial value of tied parameter ", tie);
  at::Tensor host = tensor.to(c10::kCPU).contiguous();
  std::vector<c10::intrusive_ptr<Work>> works;
  std::vector<int> peers;
  try {
    if (me == holders.at(0)) {
      for (int peer : holders) {
        if (peer == me) continue;
        std::vector<at::Tensor> list{host};
        works.push_back(s.group->send(list, peer, tag));
        peers.push_back(peer);
      }
    } else {
      host = at::empty_like(host);
      std::vector<at::Tensor> list{host};
      works.push_back(s.group->recv(list, holders[0], tag));
      peers.push_back(holders[0]);
    }
  } catch (const std::exception& e) {
    s.fail(c10::str(s.prefix, ": could not exchange ", what, " [", message_of(e), "]"));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    s.wait(works[i], deadline, peers[i], c10::str(what, " with ", s.stage_name(peers[i])));
  }
  return host.to(tensor.device());
}

}  // namespace conveyor
