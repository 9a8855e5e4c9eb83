#!/usr/bin/env bash
# The aarch64 build under qemu-user: cross-compiles the fixture tests and opt-generate with
# cmake/toolchains/aarch64-linux-gnu.cmake and checks that NEON (and the scalar path) give the bits of the x86
# build in ./build: test_isa's digests of every fixture's logits, the goldens (test_model, test_batch,
# test_generate_text), and opt-generate --jsonl --logits byte for byte. Run from the repository root after the
# x86 build (the README's test command). Root: installs the cross compiler, qemu and the arm64 libsimdjson.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
X86=$ROOT/build
ARM=$ROOT/build-arm64
SYSROOT=$ARM/sysroot
SHARED=$(cd "${OPT_SHARED_DIR:-$ROOT/../shared}" && pwd)

apt-get install -y g++-aarch64-linux-gnu qemu-user
# libsimdjson-dev:arm64 cannot be installed beside the amd64 one (they conflict): unpack it into a sysroot
dpkg --add-architecture arm64
apt-get update
mkdir -p "$ARM/debs" "$SYSROOT"
(cd "$ARM/debs" && apt-get download libsimdjson-dev:arm64 libsimdjson14:arm64)
for d in "$ARM"/debs/*.deb; do dpkg -x "$d" "$SYSROOT"; done

cmake -S . -B "$ARM" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DOPT_AARCH64_SYSROOT="$SYSROOT" \
  -DOPT_SHARED_DIR="$SHARED" -DOPT_INSTALL=OFF
cmake --build "$ARM" -j2 --target test_isa test_model test_batch test_generate_text opt-generate

QEMU=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
echo "== x86 digests"
(cd "$X86/tests" && OPT_ISA_DIGEST_WRITE="$ARM/x86-digests.txt" ./test_isa)
echo "== aarch64 (qemu): the same bits on neon and scalar, equal to x86's"
(cd "$ARM/tests" && OPT_ISA_DIGEST_EXPECT="$ARM/x86-digests.txt" "${QEMU[@]}" ./test_isa)
for t in test_model test_batch test_generate_text; do
  echo "== aarch64 (qemu): $t"
  (cd "$ARM/tests" && "${QEMU[@]}" ./$t)
done
echo "== opt-generate --jsonl --logits: aarch64 output equals x86 output byte for byte"
printf '{"prompt": "Hello, my dog is cute"}\n{"prompt": "The capital of France is"}\n{"ids": [2, 100, 200]}\n' > "$ARM/in.jsonl"
for threads in 1 2; do
  "$X86/examples/opt-generate" -m "$SHARED/fixtures/opt-tiny-realvocab" -t "$SHARED/tokenizer" -n 12 --threads $threads \
    --jsonl "$ARM/in.jsonl" --logits > "$ARM/x86.jsonl"
  "${QEMU[@]}" "$ARM/examples/opt-generate" -m "$SHARED/fixtures/opt-tiny-realvocab" -t "$SHARED/tokenizer" -n 12 \
    --threads $threads --jsonl "$ARM/in.jsonl" --logits > "$ARM/arm64.jsonl"
  cmp "$ARM/x86.jsonl" "$ARM/arm64.jsonl"
done
echo "arm64: 5 passed, 0 failed"
