"""A time model of one kernel launch on an H100 SXM, from what the compiler produced for sm_90.

Everything this module returns is a MODEL, not a measurement: no GPU ran it. It is what
``scripts/sm90_report.py`` attaches to each compiled kernel (``predicted_us``) next to the op's
own limit (``roofline_us``); ``sm90_report.py --measure`` times the same cases on a GPU and puts
the measurements beside these numbers, so one GPU run checks the model.

Constants (H100 SXM5, datasheet unless said otherwise)
------------------------------------------------------
- 132 SMs. CLOCK_HZ = 1.98 GHz: the boost clock at which the FP32 figure below is 132 SMs x 128
  lanes x 2 flops. Every per-SM, per-clock rate below is a datasheet chip rate / (132 x CLOCK_HZ),
  so the rates stay mutually consistent; a card held at a lower clock scales all of them alike.
- FP32 (FFMA) 67 TF/s; FP64 vector (DFMA) 34 TF/s; FP64 tensor cores (DMMA) 67 TF/s.
- TF32 tensor cores 495 TF/s dense, FP16/BF16 989 TF/s dense: the wgmma (SASS ``HGMMA``) rates.
- Legacy ``mma.sync`` (SASS ``HMMA``) on Hopper: MMA_SYNC_FRACTION = 0.62 of the wgmma rate of the
  same type. ASSUMPTION, not measured and not a datasheet figure: Hopper micro-benchmark studies
  report mma.sync well below the wgmma peak; 0.62 is a placeholder that ``--measure`` is there to
  replace.
- HBM3 3.35 TB/s (datasheet peak; used as is, no efficiency factor).
- L2 5.5 TB/s: NOT a datasheet figure (NVIDIA publishes none). ASSUMPTION: the order of the
  sustained L2 read bandwidth third-party micro-benchmarks report for H100 (a few TB/s, depending
  on footprint and on which of the two L2 partitions holds the data), taken at the low end because
  these kernels stream tiles from both partitions; it is also the figure issue 13 used. Unverified
  here: ``--measure`` checks it through the L2-bound cases (tf32 Gram, pre-image).
- MUFU (exp2, rcp, ...): 16 results per clock per SM (CUDA C Programming Guide, arithmetic
  instruction throughput, compute capability 9.0) = 4.18e12 /s. Triton lowers a float32 tl.exp to
  one FMUL + one MUFU.EX2; float64 exp is a DFMA polynomial and shows up in the FP64 counts.
- Issue: 4 warp-instructions per clock per SM (one per sub-partition). Shared memory: one 128-byte
  wavefront per clock per SM. ASSUMPTION: a warp's LDS (any width) costs 1 wavefront: the loads in
  these hot loops are dot operands that threads of a warp share (Triton's FMA-dot layouts, the
  CUDA pre-image's broadcast of Z and its 32 consecutive words of B), so a warp reads <= 128
  distinct bytes; stores (STS) and cp.async (LDGSTS) write distinct addresses and cost their
  width's wavefronts (32/64/128 bits: 1/2/4); LDSM/STSM (ldmatrix) .x1/.x2/.x4 cost 1/2/4. Bank
  conflicts are not charged. Charging every 128-bit LDS 4 wavefronts instead would make the
  FFMA-path loops here up to ~2.7x slower in the model: this term is the least certain one.
- Occupancy (sm_90): 65,536 registers per SM, allocated per warp in units of 256 (per-thread
  count rounded up to a multiple of 8); 228 KB (233,472 B) shared memory per SM, 227 KB per block,
  1 KB reserved per block, allocated in 128 B units; at most 64 warps and 32 blocks per SM.
- LAUNCH_US = 2 us per launch (launch latency and the ramp-up / drain of the grid). ASSUMPTION;
  it only matters for the small kernels.

Achieved fractions (``predicted_us``; ``roofline_us`` stays at the datasheet peaks)
----------------------------------------------------------------------------------
Calibrated on this workplace's H100 (NVIDIA H100 80GB HBM3, 132 SMs, triton 3.6.0) by two bare
Triton GEMMs of scripts/tf32x3_schemes.py, measured in the GPU session of 2026-11-26
(results/gpu/session-h100-2026-11-26-run*.jsonl), never by the ops being predicted:
- Tensor-core pipes (HGMMA, HMMA, DMMA): TENSOR_FRACTION = 0.64 of the datasheet rate per K step
  of a 128 x 128 x 32 wgmma loop. The one-pass TF32 GEMM 4096 x 4096 x 512 (16 K steps a tile)
  ran in 77.7 us, the same GEMM over K' = 1536 ("planes", 48 K steps) in 186.7 us; both have 1024
  tiles (7.76 waves on 132 SMs), so a tile costs 3.0 us + 0.44 us a K step, against the 0.28 us a
  K step of 128 x 128 x 32 multiply-adds takes at 495 TF/s: 0.64. (An 8192^3 bf16 cuBLAS GEMM ran
  at 0.807 of its peak on the same machine, KINDS.md: Triton's loop gets less.)
- The 3.0 us a tile is its 64 KB float32 output at the SM's share of HBM (3.0 TB/s / 132 = 22.7
  GB/s: 2.9 us): with one block per SM nothing overlaps the store. ``predicted_worst_us`` adds
  the compulsory HBM time to the loop's time instead of overlapping them.
- HBM: HBM_FRACTION = 0.896, the device-to-device copy of KINDS.md (3.0 TB/s read + write).
- L2: L2_BYTES_S = 8.6 TB/s, a measured lower bound: the K' = 1536 GEMM moved 1.61 GB of tile
  loads in 186.7 us (5.5 TB/s, the figure before the GPU run, was an assumption it refutes).
- FP32, FP64, ALU, MUFU, shared memory and issue: the datasheet / programming-guide rates.

Two predictions per launch
--------------------------
- ``predicted_us`` (efficient): the hot loop's other instructions overlap the tensor-core work
  (step 1 below: the loop's time is the maximum of its pipes' cycles), the HBM traffic overlaps
  the loops, each pipe at its fraction.
- ``predicted_worst_us`` (no overlap): where the hot loop waits for its wgmma groups to finish
  (``WARPGROUP.DEPBAR.LE gsb0, 0x0``: nothing left in flight), a K step costs the tensor-core
  cycles PLUS the cycles of its other instructions (the largest of their pipes' cycles), as if
  no warp issued anything while the tensor cores ran; a loop whose waits leave a group in flight
  (``0x1``: Triton's pipelined GEMM) overlaps by construction and keeps its efficient loop
  time. The compulsory HBM time is added to the loops' time, not overlapped.
  On the GPU (2026-11-26, tf32x3) the Gram kernels measured within 12% above the no-overlap
  figure, rbf_matmul D512 and the K-Means assignment inside [predicted, worst], rbf_matmul D64
  1.6x, the projection 1.4x and the pre-image 1.6x above it, the FFMA kernels 3-6x (docs/
  gpu-model.md has the table and what each gap says).

How a launch is modelled
------------------------
1. The hot loop: in the SASS, every backward branch closes a loop; the innermost loop holding the
   most multiply-adds is the hot loop. Its instruction mix per warp-iteration gives the cycles an
   SM needs for it: the maximum of tensor-core cycles (multiply-adds / the pipe's rate), FP32-pipe
   cycles (FFMA/FADD/FMUL/IMAD/HFMA2 / 4 per clock), ALU cycles (compares, selects, logic, integer
   adds, FMNMX / 2 per clock), FP64 (DFMA/DADD/DMUL / 2 per clock), MUFU (2 clocks per warp),
   shared-memory wavefronts, and issue (all instructions / 4 per clock). ``loop_efficiency`` =
   the dot pipe's own cycles over that maximum: the fraction of the pipe's peak the loop can
   reach. The dot's pipe is the one the SASS uses: HGMMA (wgmma), HMMA (mma.sync), DMMA, else
   FFMA (float32) or DFMA (float64). At precision ``tf32x3`` each multiply-add of the op is three
   TF32 products (``DOT_PASSES``): the dot's time is three times the TF32 time.
2. Per program (thread block), from the launch configuration and the kernel's tile loop (the
   per-kernel work functions in sm90_report.py): multiply-adds executed (tiles are computed whole,
   padding included), bytes requested from L2 (every tile load: the tile reuse of the
   configuration), and exp evaluations (tile elements x the layout's redundancy, counted in the
   SASS as MUFU.EX2 x threads / tile elements). Its time on one SM is the maximum of dot time
   (pipe rate x loop_efficiency / 132), L2 time (5.5 TB/s / 132) and MUFU time.
3. Wave quantisation and imbalance: programs are handed, in block order, to the SM that frees up
   first (greedy list scheduling on 132 SMs; co-resident blocks share their SM's pipes, so an SM's
   time is the sum of its programs' times). The makespan over the balanced time (sum / 132) is the
   quantisation factor: ceil(P / 132) x 132 / P for P equal programs.
4. predicted_us = LAUNCH_US + max(makespan, compulsory HBM bytes / 3.35 TB/s). Compulsory HBM
   bytes: every input read once and every output written once (re-reads are assumed to hit L2).
5. float64: exp is a DFMA polynomial, so there is no MUFU term; its cost is counted only where it
   sits in the hot loop (the pre-image), not in an epilogue (the Gram's).
6. Not modelled: latency (a low-occupancy kernel is assumed to keep its pipe busy: warps_per_sm is
   reported so that this can be judged), instruction-cache misses, L1 hits between programs on one
   SM, L2 bandwidth beyond 1/132 per SM when few SMs are busy, clock throttling, tail effects of
   partially filled tiles other than the wasted multiply-adds.

Roofline (``roofline``): the op's own limit, whatever the kernel: max(its minimum flops at the
fastest precision that meets its accuracy bound, its minimum HBM bytes / 3.35 TB/s, its exps /
MUFU rate). geomkern's float32 bound is 1e-5 relative to float64 (tests/geomkern/_oracle.py TOL): one TF32
pass (~3e-4) does not meet it, 3xTF32 (three TF32 products: hi*hi + hi*lo + lo*hi) does, so float32
dots are priced at 495 / 3 = 165 TF/s (a split-bf16 scheme meeting 1e-5 needs six bf16 products:
989 / 6, no faster). float64 is priced at the DMMA rate (67 TF/s). ``roofline_tf32`` (one TF32
pass, 495 TF/s; what issue 13 quoted) is reported beside it.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------- constants

SMS = 132
CLOCK_HZ = 1.98e9
FP32_FLOPS = 67e12
FP64_FLOPS = 34e12
DMMA_FLOPS = 67e12
TF32_FLOPS = 495e12
FP16_FLOPS = 989e12
MMA_SYNC_FRACTION = 0.62
HBM_BYTES_S = 3.35e12
L2_BYTES_S = 8.6e12   # measured lower bound (docstring)
MUFU_PER_CLK_SM = 16
MUFU_PER_S = MUFU_PER_CLK_SM * SMS * CLOCK_HZ
ISSUE_PER_CLK_SM = 4
SMEM_WAVEFRONTS_PER_CLK_SM = 1
LAUNCH_US = 2.0
TENSOR_FRACTION = 0.64           # per K step of a Triton wgmma loop, measured (module docstring)
HBM_FRACTION = 3.0 / 3.35         # device-to-device copy measured there

REGS_PER_SM = 65536
REG_UNIT_PER_WARP = 256
SMEM_PER_SM = 233472
SMEM_PER_BLOCK_MAX = 232448
SMEM_RESERVED_PER_BLOCK = 1024
SMEM_UNIT = 128
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32

# Chip rate of each dot pipe (flops/s, 2 per multiply-add).
PIPE_FLOPS = {
    "ffma": FP32_FLOPS,
    "dfma": FP64_FLOPS,
    "dmma": DMMA_FLOPS,
    "hgmma_tf32": TF32_FLOPS,
    "hgmma_f16": FP16_FLOPS,
    "hmma_tf32": TF32_FLOPS * MMA_SYNC_FRACTION,
    "hmma_f16": FP16_FLOPS * MMA_SYNC_FRACTION,
}
# Fastest dot rate meeting each dtype's accuracy bound (see the docstring): 3xTF32 / DMMA.
ROOFLINE_FLOPS = {"float32": TF32_FLOPS / 3, "float64": DMMA_FLOPS}
# Tensor-core products per nominal product, by tl.dot input_precision (3xTF32: hi*hi + hi*lo +
# lo*hi, three HGMMA per multiply-add of the op; the SASS shows them as 3x the HGMMA count).
DOT_PASSES = {"tf32x3": 3}
TENSOR_OPS = ("HGMMA", "HMMA", "DMMA")


def _per_sm_clk(flops_per_s: float) -> float:
    """Multiply-adds per clock per SM of a chip rate in flops/s."""
    return flops_per_s / 2 / SMS / CLOCK_HZ


# ------------------------------------------------------------------------------ occupancy

def occupancy(regs: int, smem_bytes: int, threads: int) -> dict:
    """Blocks and warps per SM on sm_90 for a block of ``threads`` using ``regs`` registers per
    thread and ``smem_bytes`` of shared memory (static + dynamic), and what limits them."""
    warps = max(1, math.ceil(threads / 32))
    regs_per_warp = math.ceil(max(regs, 1) * 32 / REG_UNIT_PER_WARP) * REG_UNIT_PER_WARP
    by = {
        "registers": REGS_PER_SM // (regs_per_warp * warps),
        "warps": MAX_WARPS_PER_SM // warps,
        "blocks": MAX_BLOCKS_PER_SM,
    }
    if smem_bytes > SMEM_PER_BLOCK_MAX:
        by["shared_memory"] = 0
    else:
        per_block = math.ceil((smem_bytes + SMEM_RESERVED_PER_BLOCK) / SMEM_UNIT) * SMEM_UNIT
        by["shared_memory"] = SMEM_PER_SM // per_block
    blocks = min(by.values())
    limiter = min(by, key=lambda k: (by[k], k != "registers"))
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "limited_by": limiter}


# ----------------------------------------------------------------------------------- SASS

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_FUNC = re.compile(r"Function\s*:\s*(\S+)")


@dataclass
class Instr:
    addr: int
    op: str        # full opcode with modifiers, e.g. HGMMA.64x64x8.F32.TF32
    operands: str


def sass_functions(text: str) -> dict[str, list[Instr]]:
    """``cuobjdump -sass`` output -> {function name: instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    cur = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _LINE.search(line)
        if m and cur is not None:
            cur.append(Instr(int(m.group(1), 16), m.group(3), m.group(4)))
    return funcs


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) address of every loop: a branch back to an earlier address."""
    out = []
    for ins in instrs:
        if ins.op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", ins.operands)
            if m and int(m.group(1), 16) < ins.addr:
                out.append((int(m.group(1), 16), ins.addr))
    return out


def innermost_loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    ls = loops(instrs)
    return [a for a in ls if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in ls)]


def _in(instrs, rng):
    return [i for i in instrs if rng[0] <= i.addr <= rng[1]]


def mma_macs(op: str) -> float:
    """Multiply-adds one warp issues with this instruction (0 if none). HGMMA.MxNxK is a
    warpgroup instruction (each of its 4 warps issues it: M N K / 4 per warp); HMMA and DMMA are
    per warp, their shape written MxNxK (DMMA.8x8x4) or as digits (HMMA.1688 = m16 n8 k8, 16816,
    884); FFMA/DFMA: 32."""
    parts = op.split(".")
    base = parts[0]
    if base in ("FFMA", "DFMA"):
        return 32.0
    if base not in TENSOR_OPS or len(parts) < 2:
        return 0.0
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", parts[1])
    if m:
        mnk = tuple(int(g) for g in m.groups())
    else:
        mnk = {"1688": (16, 8, 8), "16816": (16, 8, 16), "884": (8, 8, 4), "8816": (8, 8, 16),
               "16832": (16, 8, 32), "1684": (16, 8, 4), "16864": (16, 8, 64)}.get(parts[1])
    if mnk is None:
        return 0.0
    return mnk[0] * mnk[1] * mnk[2] / (4 if base == "HGMMA" else 1)


def dot_pipe(counts: dict[str, int], dtype: str) -> str:
    """The pipe a kernel's dot runs on, from its SASS opcode counts (full opcodes)."""
    def has(prefix, *subs):
        return any(op.startswith(prefix) and all(s in op for s in subs) for op in counts)
    if has("HGMMA", "TF32"):
        return "hgmma_tf32"
    if has("HGMMA"):
        return "hgmma_f16"
    if has("HMMA", "TF32"):
        return "hmma_tf32"
    if has("HMMA"):
        return "hmma_f16"
    if has("DMMA"):
        return "dmma"
    return "dfma" if dtype == "float64" else "ffma"


def _wavefronts(op: str) -> int:
    base = op.split(".")[0]
    if base == "LDS":
        return 1  # dot-operand loads: a warp reads <= 128 distinct bytes (broadcast)
    if base in ("STS", "LDGSTS", "ATOMS"):
        for width, wf in (("128", 4), ("64", 2)):
            if f".{width}" in op:
                return wf
        return 1
    if base in ("LDSM", "STSM"):
        m = re.search(r"\.(\d)$", op) or re.search(r"\.x(\d)", op)
        return int(m.group(1)) if m else 4
    return 0


_FP32_PIPE = ("FFMA", "FADD", "FMUL", "IMAD", "HFMA2", "HADD2")
_ALU_PIPE = ("ISETP", "FSETP", "DSETP", "FSEL", "SEL", "FMNMX", "IMNMX", "LOP3", "IADD3", "SHF", "LEA",
             "PLOP3", "IABS", "VIADD", "VIMNMX")
_FP64_PIPE = ("DFMA", "DADD", "DMUL", "DMNMX")


@dataclass
class LoopMix:
    """Instruction mix of one warp-iteration of the hot loop, and what it lets the pipe reach."""
    instructions: int = 0
    macs: float = 0.0              # multiply-adds per warp-iteration on the dot pipe
    fp32: int = 0
    fp64: int = 0
    alu: int = 0
    mufu: int = 0
    wavefronts: int = 0
    local: int = 0                 # LDL/STL: local memory (spills, or a dynamically indexed array)
    waits: int = 0                 # WARPGROUP.DEPBAR: waits on wgmma groups
    full_waits: int = 0            # ... of them with nothing left in flight (pendings 0)
    cycles: dict = field(default_factory=dict)
    efficiency: float = 1.0
    worst_efficiency: float = 1.0  # no overlap of full waits with the other instructions
    bound: str = ""


def loop_mix(instrs: list[Instr], pipe: str) -> LoopMix:
    """Mix and efficiency of the hot loop: the innermost loop with the most multiply-adds on
    ``pipe`` (whole kernel when it has no loop)."""
    tensor = pipe.startswith(("hgmma", "hmma", "dmma"))

    def macs(ins_list):
        tot = 0.0
        for i in ins_list:
            base = i.op.split(".")[0]
            if tensor and base in TENSOR_OPS:
                tot += mma_macs(i.op)
            elif not tensor and base == ("DFMA" if pipe == "dfma" else "FFMA"):
                tot += 32.0
        return tot

    cands = innermost_loops(instrs)
    best = max(cands, key=lambda r: macs(_in(instrs, r)), default=None)
    body = _in(instrs, best) if best and macs(_in(instrs, best)) > 0 else instrs
    mix = LoopMix(instructions=len(body), macs=macs(body))
    for i in body:
        base = i.op.split(".")[0]
        mix.fp32 += base in _FP32_PIPE
        mix.fp64 += base in _FP64_PIPE
        mix.alu += base in _ALU_PIPE
        mix.mufu += base == "MUFU"
        mix.wavefronts += _wavefronts(i.op)
        mix.local += base in ("LDL", "STL")
        if i.op.startswith("WARPGROUP.DEPBAR"):
            mix.waits += 1
            mix.full_waits += bool(re.search(r"gsb\d+,\s*0x0\b", i.operands))
    rate = _per_sm_clk(PIPE_FLOPS[pipe])
    dot_cycles = mix.macs / rate
    mix.cycles = {
        "dot": dot_cycles,
        "issue": mix.instructions / ISSUE_PER_CLK_SM,
        "fp32_pipe": mix.fp32 / 4,
        "alu_pipe": mix.alu / 2,
        "fp64_pipe": mix.fp64 / 2,
        "mufu": mix.mufu * 32 / MUFU_PER_CLK_SM,
        "shared_memory": mix.wavefronts / SMEM_WAVEFRONTS_PER_CLK_SM,
    }
    worst = max(mix.cycles, key=mix.cycles.get)
    mix.bound = worst
    mix.efficiency = dot_cycles / mix.cycles[worst] if mix.cycles[worst] > 0 else 1.0
    mix.worst_efficiency = mix.efficiency
    if tensor and mix.full_waits and dot_cycles > 0:
        # the K step's other instructions: issue counts every instruction but the tensor ones
        n_tc = sum(1 for i in body if i.op.split(".")[0] in TENSOR_OPS)
        other = dict(mix.cycles, issue=(mix.instructions - n_tc) / ISSUE_PER_CLK_SM)
        other.pop("dot")
        mix.worst_efficiency = dot_cycles / (dot_cycles + max(other.values()))
    return mix


def opcode_counts(instrs: list[Instr]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in instrs:
        out[i.op] = out.get(i.op, 0) + 1
    return out


def tensor_core_instructions(instrs: list[Instr]) -> int:
    """Static count of HGMMA + HMMA + DMMA instructions."""
    return sum(1 for i in instrs if i.op.split(".")[0] in TENSOR_OPS)


def exp_redundancy(instrs: list[Instr], threads: int, tile_elems: int) -> float:
    """How many times each exp of a tile is computed: MUFU.EX2 in the smallest loop holding one
    (the whole kernel when none is in a loop) x threads / tile elements. Assumes the compiler did
    not unroll that loop (it would multiply the count)."""
    ex2 = [i for i in instrs if i.op.startswith("MUFU.EX2")]
    if not ex2 or tile_elems <= 0:
        return 0.0
    holding = [r for r in loops(instrs) if any(r[0] <= i.addr <= r[1] for i in ex2)]
    if holding:
        r = min(holding, key=lambda r: r[1] - r[0])
        n = sum(1 for i in ex2 if r[0] <= i.addr <= r[1])
    else:
        n = len(ex2)
    return n * threads / tile_elems


# ---------------------------------------------------------------------------------- model

@dataclass
class Work:
    """What one launch does, per program (thread block, in block order) and in total.

    macs, l2_bytes, exps: per-program lists (exps = exp evaluations the op needs in that
    program, before the layout's redundancy); hbm_bytes: compulsory bytes of the launch."""
    macs: list[float]
    l2_bytes: list[float]
    exps: list[float]
    hbm_bytes: float
    exp_tile: int = 0              # elements of one exp tile (for the redundancy)
    note: str = ""


def _makespan(times: list[float]) -> float:
    """Greedy list scheduling in block order on SMS SMs (each SM works through its programs)."""
    if len(times) <= SMS:
        return max(times, default=0.0)
    heap = [0.0] * SMS
    for t in times:
        heapq.heapreplace(heap, heap[0] + t)
    return max(heap)


def dot_passes(precision: str, pipe: str) -> int:
    """Tensor-core products per nominal product: 3 for 3xTF32 on a TF32 pipe, else 1."""
    return DOT_PASSES.get(precision, 1) if pipe in ("hgmma_tf32", "hmma_tf32") else 1


def predict(work: Work, pipe: str, loop_efficiency: float, exp_redundancy: float,
            dtype: str = "float32", passes: int = 1, serial_hbm: bool = False) -> dict:
    """The model's time of one launch (see the module docstring) and its components, in us.
    ``passes``: tensor-core products per nominal multiply-add (``dot_passes``); ``serial_hbm``:
    the compulsory HBM time adds to the loops' instead of overlapping them (the worst case)."""
    tensor = pipe.startswith(("hgmma", "hmma", "dmma"))
    dot_rate_sm = (PIPE_FLOPS[pipe] * (TENSOR_FRACTION if tensor else 1.0)
                   * max(loop_efficiency, 1e-3) / SMS / passes)
    l2_rate_sm = L2_BYTES_S / SMS
    mufu_rate_sm = MUFU_PER_S / SMS
    # float64 exp is a DFMA polynomial: its cost is inside the loop mix, not on MUFU
    mufu_x = exp_redundancy if dtype != "float64" else 0.0
    t_dot = [2 * m / dot_rate_sm for m in work.macs]
    t_l2 = [b / l2_rate_sm for b in work.l2_bytes]
    t_exp = [e * mufu_x / mufu_rate_sm for e in work.exps]
    per_prog = [max(a, b, c) for a, b, c in zip(t_dot, t_l2, t_exp)]
    balanced = sum(per_prog) / SMS
    makespan = _makespan([t for t in per_prog if t > 0])
    t_hbm = work.hbm_bytes / (HBM_BYTES_S * HBM_FRACTION)
    body = makespan + t_hbm if serial_hbm else max(makespan, t_hbm)
    us = 1e6
    return {
        "predicted_us": LAUNCH_US + body * us,
        "dot_us": sum(t_dot) / SMS * us,
        "l2_us": sum(t_l2) / SMS * us,
        "mufu_us": sum(t_exp) / SMS * us,
        "hbm_us": t_hbm * us,
        "quantisation": makespan / balanced if balanced > 0 else 1.0,
        "bound": ("hbm" if t_hbm >= makespan else
                  max((("dot", sum(t_dot)), ("l2", sum(t_l2)), ("mufu", sum(t_exp))),
                      key=lambda kv: kv[1])[0]),
        "dot_flops": 2 * sum(work.macs),
        "l2_bytes": sum(work.l2_bytes),
        "hbm_bytes": work.hbm_bytes,
        "exps": sum(work.exps) * (exp_redundancy if dtype != "float64" else 1.0),
    }


def roofline(flops: float, hbm_bytes: float, exps: float, dtype: str = "float32") -> dict:
    """The op's own limit in us: at the fastest precision meeting its bound, and with one TF32
    pass (issue 13's convention, which does not meet the float32 bound)."""
    us = 1e6
    t_b = hbm_bytes / HBM_BYTES_S
    t_e = exps / MUFU_PER_S if dtype != "float64" else 0.0
    t_f = flops / ROOFLINE_FLOPS[dtype]
    t_f1 = flops / (TF32_FLOPS if dtype != "float64" else DMMA_FLOPS)
    return {"roofline_us": max(t_f, t_b, t_e) * us, "roofline_tf32_us": max(t_f1, t_b, t_e) * us,
            "roofline_bound": max((("flops", t_f), ("hbm", t_b), ("exp", t_e)), key=lambda kv: kv[1])[0]}
