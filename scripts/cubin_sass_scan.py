#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-kernel SASS size and spill / tensor-core / warpgroup-sync instruction counts of a cubin, without cuobjdump.

This machine has nvcc and ptxas but no cuobjdump or nvdisasm. A cubin is an ELF file whose `.text.<kernel>`
sections hold the kernels' SASS: 16 bytes per instruction on sm_90, the opcode in the low 12 bits of the first
64-bit word. This script reads those sections and counts these opcodes, identified
against ptxas and ncu on the same kernels:
  STL  0x387  local store (a register spill: ptxas's "20 bytes spill stores" were 5 STL there)
  LDL  0x983  local load
  HGMMA 0xdf0 and 0x9f0, the two operand forms of the warpgroup MMA (the raw decode kernel's 36 + 32 per tile are
        0xdf0, as ncu's source page counts them; the small kernel's 68 are 0x9f0; the seesaw has both).
  QGMMA 0x9f3 (A from shared memory) and 0xdf3 (A from registers), the e4m3 warpgroup MMA: identified with probe
        kernels of 3 wgmma_e4m3_ss and 5 wgmma_e4m3_rs (the sm90_fp8 prefill kernel: 12 + 8, its 2 x 6 S and 2 x 4
        P V products).
  WGSYNC 0x9c5, WARPGROUP.ARRIVE (wgmma.fence) and WARPGROUP.DEPBAR (wgmma.wait_group) alike: identified with
        probe kernels (one more fence or one more wait_group each added one). A change
        whose kernels gain WGSYNC without a new fence or wait in the source made ptxas insert warpgroup syncs (its
        C7519 note, or silently: the serialised products of docs/DEVELOPING.md's wgmma rules).
Offsets (bytes from the kernel's start) of the STL / LDL tell whether a spill sits in a hot loop: compare them
with the HGMMA offsets (--where).

Make the cubin with the build's own command for a translation unit (docs/DEVELOPING.md "Code size without the
device"): `ninja -C build -t commands CMakeFiles/mla_cuda.dir/src/cuda/attention/sm90/seesaw/instantiations/ds_indexed.cu.o | tail -1`,
then `-c` -> `-cubin`, `-o X.cubin`, the `-MD -MT ... -MF ...` flags dropped.

Usage: scripts/cubin_sass_scan.py X.cubin [SUBSTRING] [--where]
"""
import re
import struct
import sys

OPS = {"STL": (0x387,), "LDL": (0x983,), "HGMMA": (0xDF0, 0x9F0), "QGMMA": (0x9F3, 0xDF3), "WGSYNC": (0x9C5,)}


def text_sections(path):
    """{section name: bytes} of the ELF64 file's .text.* sections."""
    with open(path, "rb") as fh:
        b = fh.read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        sys.exit(f"{path}: not an ELF64 file (a cubin from nvcc -cubin)")
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", b, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in heads:
        n = b[strtab + name:b.index(b"\0", strtab + name)].decode()
        if n.startswith(".text."):
            out[n[len(".text."):]] = b[off:off + size]
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    where = "--where" in sys.argv
    if not args:
        sys.exit(__doc__)
    path, sub = args[0], (args[1] if len(args) > 1 else "")
    print(f"{'bytes':>8} {'instr':>6} {'STL':>4} {'LDL':>4} {'HGMMA':>5} {'QGMMA':>5} {'WGSYNC':>6}  kernel")
    for name, code in sorted(text_sections(path).items()):
        if sub not in name:
            continue
        ops = [struct.unpack_from("<Q", code, i)[0] & 0xFFF for i in range(0, len(code), 16)]
        at = {k: [16 * i for i, o in enumerate(ops) if o in v] for k, v in OPS.items()}
        short = re.sub(r"^_ZN3mla4cuda\d+\w+?\d+(?=decode|mqa|sparse)", "", name)[:90]
        print(f"{len(code):8d} {len(ops):6d} {len(at['STL']):4d} {len(at['LDL']):4d} {len(at['HGMMA']):5d}"
              f" {len(at['QGMMA']):5d} {len(at['WGSYNC']):6d}  {short}")
        if where and (at["STL"] or at["LDL"]):
            hg = sorted(at["HGMMA"] + at["QGMMA"])
            print(f"           HGMMA {hex(hg[0]) if hg else '-'} .. {hex(hg[-1]) if hg else '-'};"
                  f" STL {[hex(x) for x in at['STL']]}; LDL {[hex(x) for x in at['LDL']]}")


if __name__ == "__main__":
    main()
