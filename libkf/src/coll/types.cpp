// SPDX-License-Identifier: Apache-2.0
#include "kf/coll/types.hpp"

namespace kf {

std::string_view to_string(CollOp op) noexcept {
  switch (op) {
    case CollOp::allreduce: return "allreduce";
    case CollOp::broadcast: return "broadcast";
    case CollOp::allgather: return "allgather";
    case CollOp::reduce_scatter: return "reduce_scatter";
    case CollOp::gather: return "gather";
    case CollOp::barrier: return "barrier";
    case CollOp::consensus: return "consensus";
  }
  return "?";
}

std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::job_default: return "default";
    case Algorithm::auto_select: return "auto";
    case Algorithm::star: return "star";
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::clique: return "clique";
    case Algorithm::rhd: return "rhd";
    case Algorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

std::optional<Algorithm> parse_algorithm(std::string_view s) noexcept {
  for (auto a : {Algorithm::auto_select, Algorithm::star, Algorithm::ring, Algorithm::tree,
                 Algorithm::clique, Algorithm::rhd, Algorithm::hierarchical}) {
    if (to_string(a) == s) return a;
  }
  return std::nullopt;
}

}  // namespace kf
