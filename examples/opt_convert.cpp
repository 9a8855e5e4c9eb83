// opt-convert: a PyTorch (pytorch_model.bin, shards + pytorch_model.bin.index.json) or safetensors checkpoint
// to safetensors, with an optional float cast, plus config and tokenizer files. No Python needed.
//
//   opt-convert facebook-opt-125m/ opt-125m/                 # -> opt-125m/model.safetensors, config.json, ...
//   opt-convert pytorch_model.bin out/ --dtype f32           # widen F16 weights to F32
//   opt-convert big-model/ out/ --max-shard-size 2GB         # shards + model.safetensors.index.json
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdint>
#include <iostream>
#include <opt/pytorch.hpp>
#include <string>

#include "size_option.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Convert a PyTorch or safetensors OPT checkpoint to safetensors", "opt-convert"};
  std::string input, output, dtype_name, shard_size = "0";
  bool no_verify = false;
  app.add_option("INPUT", input, "model directory, pytorch_model.bin, or a .safetensors file")->required();
  app.add_option("OUTPUT_DIR", output, "directory to write model.safetensors (and copies of config/tokenizer) to")
      ->required();
  app.add_option("--dtype", dtype_name, "cast floating-point tensors to this type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--max-shard-size", shard_size, "split into shards of at most this size, e.g. 2GB (0: one file)");
  app.add_flag("--no-verify", no_verify, "skip the CRC-32 check of PyTorch storage records");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "opt-convert: " << e.what() << " (see --help)\n";
    return e.get_exit_code() ? e.get_exit_code() : 2;
  }
  try {
    opt::ConvertOptions opts;
    if (dtype_name == "f32") opts.cast = opt::dtype::F32;
    if (dtype_name == "f16") opts.cast = opt::dtype::F16;
    if (dtype_name == "bf16") opts.cast = opt::dtype::BF16;
    opts.max_shard_bytes = parse_size(shard_size);
    opts.verify_crc = !no_verify;
    opt::ConvertResult r = opt::convert_checkpoint(input, output, opts);
    std::cout << "read " << r.tensors << " tensors (" << r.source_format << ") from";
    for (auto& p : r.inputs) std::cout << ' ' << p.string();
    std::cout << "\nwrote " << r.bytes << " bytes of tensor data to";
    for (auto& p : r.written) std::cout << ' ' << p.string();
    std::cout << '\n';
    if (!r.copied.empty()) {
      std::cout << "copied";
      for (auto& c : r.copied) std::cout << ' ' << c;
      std::cout << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "opt-convert: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
