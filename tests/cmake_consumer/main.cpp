// A host program that uses opt as a package: loads a fixture model and generates greedily.
#include <iostream>
#include <opt/generate.hpp>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  opt::Model model = opt::Model::load(argv[1]);
  opt::GenerateOptions o;
  o.max_new_tokens = 4;
  opt::GenerateResult r = opt::generate_ids(model, {{2, 206, 317, 15}}, o);
  for (int32_t id : r.sequences[0]) std::cout << id << ' ';
  std::cout << '\n';
  return r.new_tokens[0].size() == 4 ? 0 : 1;
}
