#pragma once
// One visitor from several lambdas, for std::visit over a variant: a missing alternative does
// not compile.
//
//   std::visit(common::Overloaded{[](const A&) { ... }, [](const B&) { ... }}, value);

namespace ddprun::common {

template <class... Handlers>
struct Overloaded : Handlers... {
  using Handlers::operator()...;
};
template <class... Handlers>
Overloaded(Handlers...) -> Overloaded<Handlers...>;

}  // namespace ddprun::common
