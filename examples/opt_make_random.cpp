// opt-make-random: writes a random-weight OPT checkpoint (config.json + safetensors, in shards of at most 5 GB with
// model.safetensors.index.json when larger, like the hub) of a published model's shape, so benchmarks and tests
// run without a download. One tensor is held in memory at a time. --dtype int8 (or --packed) writes the stored
// packed format (include/opt/packed.hpp) directly: a large quantized shape never exists as floats on disk.
//
//   opt-make-random out/opt-125m-f32                      # opt-125m shape, F32
//   opt-make-random out/opt-1.3b-bf16 --model opt-1.3b --dtype bf16 --seed 7
//   opt-make-random out/opt-13b-bf16 --model 13b --dtype bf16 --max-shard-size 2GB
//   opt-make-random out/opt-13b-int8 --model 13b --dtype int8 --float-dtype bf16   # int8 panels, bf16 embeddings
//   opt-make-random out/opt-6.7b-bf16p --model 6.7b --dtype bf16 --packed            # bf16 panels
//   opt-make-random --list                                 # the shapes, one per line
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <opt/random_checkpoint.hpp>
#include <string>

#include "size_option.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight OPT checkpoint", "opt-make-random"};
  std::string dir, model = "opt-125m", dtype_name = "f32", float_name = "f32", shard = "5GB";
  uint64_t seed = 1;
  bool list = false, packed = false;
  std::string names;
  for (const opt::OptShape& s : opt::kOptShapes) names += std::string(names.empty() ? "" : ", ") + s.name;
  app.add_option("dir", dir, "output folder");
  app.add_option("--model", model, "a published shape: " + names + " (or 125m, 1.3b, ...)")->capture_default_str();
  app.add_option("--dtype", dtype_name, "f32, f16, bf16, or int8 / int4 (the stored packed format)")
      ->capture_default_str();
  app.add_option("--float-dtype", float_name, "with --dtype int8|int4: the type of the other tensors and the LM head "
                                              "(f32, f16 or bf16)")
      ->capture_default_str();
  app.add_flag("--packed", packed, "with a float --dtype: the stored packed format (linear weights in panels)");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--max-shard-size", shard, "largest shard (5GB, 500MB, 0 = one file)")->capture_default_str();
  app.add_flag("--list", list, "print the shapes (name hidden layers heads ffn word_embed_proj_dim pre_ln) and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    if (list) {
      for (const opt::OptShape& s : opt::kOptShapes)
        std::cout << s.name << ' ' << s.hidden << ' ' << s.layers << ' ' << s.heads << ' ' << s.ffn << ' '
                  << s.word_embed_proj_dim << ' ' << (s.pre_ln ? "pre_ln" : "post_ln") << '\n';
      return 0;
    }
    if (dir.empty()) throw opt::input_error("an output folder is required");
    opt::RandomCheckpointOptions o;
    o.type = dtype_name == "f32"    ? opt::dtype::F32
             : dtype_name == "f16"  ? opt::dtype::F16
             : dtype_name == "bf16" ? opt::dtype::BF16
             : dtype_name == "int8" ? opt::dtype::I8
             : dtype_name == "int4" ? opt::dtype::I4
                                    : throw opt::input_error("--dtype: expected f32, f16, bf16, int8 or int4, got " +
                                                             dtype_name);
    o.float_type = float_name == "f32"    ? opt::dtype::F32
                   : float_name == "f16"  ? opt::dtype::F16
                   : float_name == "bf16" ? opt::dtype::BF16
                                          : throw opt::input_error("--float-dtype: expected f32, f16 or bf16, got " +
                                                                   float_name);
    o.packed = packed;
    o.seed = seed;
    o.max_shard_bytes = parse_size(shard);
    opt::write_random_checkpoint(dir, opt::opt_shape(model), o);
  } catch (const std::exception& e) {
    std::cerr << "opt-make-random: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
