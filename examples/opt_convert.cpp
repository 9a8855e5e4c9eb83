// opt-convert: a PyTorch (pytorch_model.bin, shards + pytorch_model.bin.index.json) or safetensors checkpoint
// to safetensors, with an optional float cast, plus config and tokenizer files. No Python needed. With --quantize
// int8 (or --packed) it writes the stored packed format (include/opt/packed.hpp), which Model::load runs from the
// file mapping: no quantizing or repacking at load.
//
//   opt-convert facebook-opt-125m/ opt-125m/                 # -> opt-125m/model.safetensors, config.json, ...
//   opt-convert pytorch_model.bin out/ --dtype f32           # widen F16 weights to F32
//   opt-convert big-model/ out/ --max-shard-size 2GB         # shards + model.safetensors.index.json
//   opt-convert opt-125m/ opt-125m-int8/ --quantize int8     # int8 panels + scales, LM head as stored
//   opt-convert opt-6.7b/ opt-6.7b-bf16p/ --dtype bf16 --packed   # bf16 panels: loads without a copy
#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdint>
#include <iostream>
#include <opt/packed.hpp>
#include <optional>
#include <string>

#include "size_option.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Convert a PyTorch or safetensors OPT checkpoint to safetensors", "opt-convert"};
  std::string input, output, dtype_name, shard_size = "0", quantize = "none";
  bool no_verify = false, packed = false, lm_head_int8 = false;
  app.add_option("INPUT", input, "model directory, pytorch_model.bin, or a .safetensors file")->required();
  app.add_option("OUTPUT_DIR", output, "directory to write model.safetensors (and copies of config/tokenizer) to")
      ->required();
  app.add_option("--dtype", dtype_name, "cast floating-point tensors to this type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("--max-shard-size", shard_size, "split into shards of at most this size, e.g. 2GB (0: one file)");
  app.add_flag("--no-verify", no_verify, "skip the CRC-32 check of PyTorch storage records");
  app.add_option("--quantize", quantize, "int8 (or int4): write the stored packed format, linear weights quantized")
      ->check(CLI::IsMember({"none", "int8", "int4"}))
      ->capture_default_str();
  app.add_flag("--packed", packed, "write the stored packed format, linear weights in float panels (with --quantize "
                                   "none)");
  app.add_flag("--lm-head-int8", lm_head_int8, "stored packed format: the tied LM head in int8 too");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "opt-convert: " << e.what() << " (see --help)\n";
    return e.get_exit_code() ? e.get_exit_code() : 2;
  }
  try {
    std::optional<opt::dtype> cast;
    if (dtype_name == "f32") cast = opt::dtype::F32;
    if (dtype_name == "f16") cast = opt::dtype::F16;
    if (dtype_name == "bf16") cast = opt::dtype::BF16;
    const uint64_t max_shard = parse_size(shard_size);
    if (lm_head_int8 && quantize == "none" && !packed)
      throw opt::input_error("--lm-head-int8 needs the stored packed format (--quantize int8|int4 or --packed)");
    opt::ConvertResult r;
    if (quantize != "none" || packed) {
      opt::PackedConvertOptions opts;
      if (quantize == "int8") opts.quantize = opt::dtype::I8;
      if (quantize == "int4") opts.quantize = opt::dtype::I4;
      opts.lm_head_int8 = lm_head_int8;
      opts.cast = cast;
      opts.max_shard_bytes = max_shard;
      opts.verify_crc = !no_verify;
      r = opt::convert_packed(input, output, opts);
    } else {
      opt::ConvertOptions opts;
      opts.cast = cast;
      opts.max_shard_bytes = max_shard;
      opts.verify_crc = !no_verify;
      r = opt::convert_checkpoint(input, output, opts);
    }
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
