// The smallest host program: load a model folder and a tokenizer, generate greedily, print the answer.
//   hello MODEL_DIR [TOKENIZER_DIR] [PROMPT]
#include <iostream>
#include <opt/generate.hpp>

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::cerr << "usage: hello MODEL_DIR [TOKENIZER_DIR] [PROMPT]\n";
    return 2;
  }
  auto model = opt::Model::load(argv[1]);
  auto tok = opt::Tokenizer::from_dir(argc > 2 ? argv[2] : argv[1]);
  opt::GenerateOptions o;
  o.max_new_tokens = 32;
  std::cout << opt::generate(model, tok, argc > 3 ? argv[3] : "Hello, my name is", o) << '\n';
} catch (const std::exception& e) {
  std::cerr << "hello: " << e.what() << '\n';
  return 1;
}
