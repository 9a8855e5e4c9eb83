// opt-make-random: writes a random-weight OPT checkpoint (config.json + model.safetensors) of a real model's
// shape, so benchmarks and tests run without a download.
//
//   opt-make-random out/opt-125m-f32                      # opt-125m shape, F32
//   opt-make-random out/opt-1.3b-bf16 --model opt-1.3b --dtype bf16 --seed 7
#include <CLI/CLI.hpp>
#include <iostream>
#include <opt/random_checkpoint.hpp>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight OPT checkpoint", "opt-make-random"};
  std::string dir, model = "opt-125m", dtype_name = "f32";
  uint64_t seed = 1;
  app.add_option("dir", dir, "output folder")->required();
  app.add_option("--model", model, "opt-125m, opt-350m or opt-1.3b")->capture_default_str();
  app.add_option("--dtype", dtype_name, "f32, f16 or bf16")->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    opt::dtype t = dtype_name == "f32"    ? opt::dtype::F32
                   : dtype_name == "f16"  ? opt::dtype::F16
                   : dtype_name == "bf16" ? opt::dtype::BF16
                                          : throw opt::input_error("--dtype: expected f32, f16 or bf16, got " + dtype_name);
    opt::write_random_checkpoint(dir, opt::opt_shape(model), t, seed);
  } catch (const std::exception& e) {
    std::cerr << "opt-make-random: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
