"""The hand-written LLVM IR kernels, checked on any host (no VNNI needed).

Every int8 kernel (int8_ir: all VARIANTS x SHAPES) parses, verifies and compiles for
named VNNI CPUs, and its machine code uses vpdpbusd, the instruction the fast path is
for (k4 and u6, whose sub-block scales apply as integers: vpmaddubsw and vpmaddwd);
built for AVX2 (no VNNI) it uses vpmaddubsw and vpmaddwd instead, and no AVX-512. The
gemm kernels compile for x86-64 and AArch64 with fused multiply-adds, and prefill's wide one
(zmm accumulators) gives decode's bits. Each kernel's IR
parameters are its declared signature, and an argument list that does not match that
signature is a Python error naming the argument, not a wild pointer.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from zinfer.kernels.cpu_fast import gemm_ir, llvm_host
from zinfer.kernels.cpu_fast.int8 import ir as int8_ir, ir_dot as int8_ir_dot
from zinfer.kernels.cpu_fast.gemm_ir import GemmArgs
from zinfer.kernels.cpu_fast.kernel_signature import call_kernel

VNNI_FEATURES = "+avx512f,+avx512vnni,+avx512vl,+avx512bw,+avx512dq,+avx2,+fma,+f16c"


def functions_of(assembly: str, names: list[str]) -> dict[str, str]:
    """The assembly of each named function: from its label to the end of its body."""
    bodies = {}
    for name in names:
        start = re.search(rf"^{re.escape(name)}:$", assembly, re.M)
        assert start, f"{name} missing from the assembly"
        end = assembly.index(".Lfunc_end", start.end())
        bodies[name] = assembly[start.end() : end]
    return bodies


# cascadelake: the first VNNI CPU (no VBMI, no BITALG)
@pytest.mark.parametrize("cpu", ["sapphirerapids", "cascadelake"])
def test_every_int8_kernel_compiles_to_vpdpbusd(cpu):
    names = [int8_ir.kernel_name(*key) for key in int8_ir.KEYS]
    assert len(names) == len(int8_ir.VARIANTS) * len(int8_ir.SHAPES) == 66
    bodies = functions_of(llvm_host.compile_for_target(int8_ir.module_ir(), cpu, VNNI_FEATURES), names)
    for (kind, *_), name in zip(int8_ir.KEYS, names):
        if kind == "u6":  # integer sub-block scales: int16 pair sums, then vpmaddwd by the scales
            assert "vpmaddubsw" in bodies[name] and "vpmaddwd" in bodies[name] and "vpdpbusd" not in bodies[name], name
        elif kind == "k4":  # one block per int32 lane: vpdpbusd per step, vpmulld by the scales per super-block
            assert "vpdpbusd" in bodies[name] and "vpmulld" in bodies[name] and "vpmaddubsw" not in bodies[name], name
        else:
            assert "vpdpbusd" in bodies[name], name
        if kind in ("p8", "i8"):  # |w| times a * sign(w)
            assert "vpsignb" in bodies[name] and "vpabsb" in bodies[name], name
        if kind in ("u5", "u6"):  # the high bits shifted per 64-bit lane, codes unsigned
            assert "vpsrlvq" in bodies[name] and "vpsignb" not in bodies[name], name


@pytest.mark.parametrize("cpu", ["sapphirerapids", "cascadelake"])
def test_outer_product_kernels_compile_to_vpdpbusd_on_broadcasts(cpu):
    """u5's, k4's and u6's convert kernels unpack and transpose (shuffles), without products
    (u5's and u6's high bits shifted per 64-bit lane); their outer products multiply broadcast
    activations by 8 rows a vector with vpdpbusd."""
    names = [name for pair in int8_ir.OUTER_NAMES.values() for name in pair]
    bodies = functions_of(llvm_host.compile_for_target(int8_ir.module_ir(), cpu, VNNI_FEATURES), names)
    for kind, (convert, product) in int8_ir.OUTER_NAMES.items():
        assert ("vpdpbusd" not in bodies[convert]
                and ("vpunpck" in bodies[convert] or "vperm" in bodies[convert])), convert
        assert ("vpsrlvq" in bodies[convert]) == (kind in ("u5", "u6")), convert
        assert ("vpdpbusd" in bodies[product] and "vpbroadcastd" in bodies[product]
                and "vpsignb" not in bodies[product]), product


@pytest.mark.parametrize("cpu", ["znver1", "haswell"])  # AVX2 CPUs without AVX-512
def test_every_int8_kernel_builds_for_avx2_without_avx512(cpu):
    names = ([int8_ir.kernel_name(*key) for key in int8_ir.KEYS]
             + [product for _, product in int8_ir.OUTER_NAMES.values()])
    bodies = functions_of(llvm_host.compile_for_target(int8_ir.module_ir("avx2"), cpu, "+avx2,+fma,+f16c"), names)
    for name in names:
        assert "vpmaddubsw" in bodies[name] and "vpmaddwd" in bodies[name], name
        assert "vpdpbusd" not in bodies[name] and "zmm" not in bodies[name] and "kmov" not in bodies[name], name


def test_the_host_picks_vnni_over_avx2_and_neither_without_avx2():
    vnni = "+avx2,+fma,+f16c,+avx512f,+avx512vnni,+avx512vl,+avx512bw"
    assert int8_ir_dot.host_isa(vnni) == "vnni"
    assert int8_ir_dot.host_isa("+avx2,+fma,+f16c,-avx512vnni") == "avx2"
    assert int8_ir_dot.host_isa("+sse4.2,+avx,-avx2") is None


@pytest.mark.parametrize(("triple", "cpu", "features", "fma"), [
    (llvm_host.X86_64, "haswell", "+avx2,+fma", "vfmadd"),
    ("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon", "fmla"),
])
def test_gemm_kernel_compiles_with_fma(triple, cpu, features, fma):
    name = f"sgemm_{gemm_ir.MR}x16"
    body = functions_of(llvm_host.compile_for_target(gemm_ir.kernel_ir(), cpu, features, triple), [name])[name]
    assert fma in body


def test_the_wide_gemm_kernel_compiles_to_zmm_fmas_on_broadcasts():
    """The prefill kernel (WIDE_MR rows of one 16-float vector) keeps a row's accumulator in
    one AVX-512 register and reads A[r, k] as an fma's broadcast operand."""
    name = gemm_ir.kernel_name(gemm_ir.WIDE_MR)
    body = functions_of(llvm_host.compile_for_target(gemm_ir.kernel_ir(gemm_ir.WIDE_MR), "sapphirerapids",
                                                     VNNI_FEATURES), [name])[name]
    assert len(re.findall(r"vfmadd231ps\s+\S+\{1to16\}, %zmm", body)) == gemm_ir.WIDE_MR
    assert "(%rsp)" not in body.split("vfmadd231ps", 1)[1]  # no accumulator spilled inside the loop


@pytest.mark.skipif(gemm_ir.address(gemm_ir.WIDE_MR) is None, reason="llvmlite cannot compile for this host")
@pytest.mark.parametrize("K", [1, 37, 256])
def test_the_wide_gemm_kernel_equals_the_decode_kernel_bit_for_bit(K):
    """Decode (MR rows) and prefill (WIDE_MR rows) attention multiply with different kernels;
    each C element is the same fma chain over k, so a token prefilled and the same token
    decoded get the same scores."""
    rng = np.random.default_rng(K)
    a = rng.standard_normal((gemm_ir.WIDE_MR, K), np.float32)  # [WIDE_MR, K]
    b = rng.standard_normal((K, 40), np.float32)  # [K, 40]: a stride wider than the 16 columns
    c = {mr: np.zeros((gemm_ir.WIDE_MR, 16), np.float32) for mr in (gemm_ir.MR, gemm_ir.WIDE_MR)}  # [WIDE_MR, 16]
    for mr, out in c.items():
        fn = gemm_ir.SIGNATURE.ctypes_function(gemm_ir.address(mr))
        for r in range(0, gemm_ir.WIDE_MR, mr):
            fn(A=a[r:].ctypes.data, lda=K, B=b.ctypes.data + 12, ldb=40, C=out[r:].ctypes.data, ldc=16, K=K)
    np.testing.assert_array_equal(c[gemm_ir.MR], c[gemm_ir.WIDE_MR])
    np.testing.assert_allclose(c[gemm_ir.MR], a @ b[:, 3:19], rtol=1e-4, atol=1e-4)


def test_kernel_parameters_are_the_declared_signature():
    import llvmlite.binding as llvm

    for text, signature, names in (
        (int8_ir.module_ir(), int8_ir.SIGNATURE,
         [int8_ir.kernel_name(*key) for key in int8_ir.KEYS]
         + [n for pair in int8_ir.OUTER_NAMES.values() for n in pair]),
        (gemm_ir.kernel_ir(), gemm_ir.SIGNATURE, [f"sgemm_{gemm_ir.MR}x16"]),
    ):
        module = llvm.parse_assembly(text)
        for name in names:
            args = list(module.get_function(name).arguments)
            assert [a.name for a in args] == list(signature.names), name
            assert {str(a.type) for a in args} == {"i64"}, name


def test_an_edit_that_breaks_the_ir_fails_here():
    broken = int8_ir.module_ir().replace("%accn0_0 = call", "%accn0_0 = cal", 1)
    with pytest.raises(RuntimeError):
        llvm_host.compile_for_target(broken, "sapphirerapids", VNNI_FEATURES)


@pytest.fixture(scope="module")
def gemm():
    address = gemm_ir.address()
    if address is None:
        pytest.skip("llvmlite cannot compile for this host")
    return gemm_ir.SIGNATURE.ctypes_function(address)


def test_gemm_kernel_by_keyword_computes_the_product(gemm):
    rng = np.random.default_rng(0)
    K = 37
    a = rng.standard_normal((gemm_ir.MR, K), np.float32)  # [MR, K]
    b = rng.standard_normal((K, 16), np.float32)  # [K, 16]
    c = np.zeros((gemm_ir.MR, 16), np.float32)  # [MR, 16]
    gemm(A=a.ctypes.data, lda=K, B=b.ctypes.data, ldb=16, C=c.ctypes.data, ldc=16, K=K)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_object_cache_keeps_the_machine_code_and_a_later_compile_runs_it(tmp_path):
    """compile_for_host with a cache_dir writes one object file per module and CPU; a
    second compile of the same IR loads it (no new file) and computes the same product,
    and other IR gets a file of its own."""
    name = f"sgemm_{gemm_ir.MR}x16"
    rng = np.random.default_rng(1)
    K = 21
    a = rng.standard_normal((gemm_ir.MR, K), np.float32)  # [MR, K]
    b = rng.standard_normal((K, 16), np.float32)  # [K, 16]
    outs, files = [], []
    for _ in range(2):
        fn = gemm_ir.SIGNATURE.ctypes_function(
            llvm_host.compile_for_host(gemm_ir.kernel_ir(), [name], cache_dir=tmp_path)[name])
        c = np.zeros((gemm_ir.MR, 16), np.float32)  # [MR, 16]
        fn(A=a.ctypes.data, lda=K, B=b.ctypes.data, ldb=16, C=c.ctypes.data, ldc=16, K=K)
        outs.append(c)
        files.append([(p.name, p.stat().st_ino) for p in tmp_path.glob("*.o")])
    assert len(files[0]) == 1 and files[1] == files[0]  # the same file, not written again: loaded
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], a @ b, rtol=1e-5, atol=1e-5)
    llvm_host.compile_for_host(gemm_ir.kernel_ir() + "\n; another module", [name], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.o"))) == 2


def test_python_call_with_a_wrong_argument_list_raises_naming_it(gemm):
    a = np.zeros((gemm_ir.MR, 16), np.float32)
    ok = dict(A=a.ctypes.data, lda=16, B=a.ctypes.data, ldb=16, C=a.ctypes.data, ldc=16)
    with pytest.raises(TypeError, match="'K'"):  # missing
        gemm(**ok)
    with pytest.raises(TypeError, match="'k'"):  # misspelt
        gemm(**ok, k=16)
    with pytest.raises(TypeError, match=r"GemmArgs\.K is float"):
        gemm(**ok, K=16.0)
    with pytest.raises(TypeError, match=r"GemmArgs\.C is ndarray"):  # the array, not its address
        gemm(**{**ok, "C": a}, K=16)


def test_numba_call_with_a_wrong_argument_list_fails_to_compile_naming_it():
    """call_kernel checks at compile time, so a mismatch never runs (address 0 is never called)."""

    @njit
    def float_stride(x):
        call_kernel(np.int64(0), GemmArgs(A=x.ctypes.data, lda=16, B=x.ctypes.data, ldb=16.0, C=x.ctypes.data, ldc=16,
                                          K=1))

    @njit
    def raw_tuple(x):
        call_kernel(np.int64(0), (x.ctypes.data, 16, x.ctypes.data, 16, x.ctypes.data, 16, 1))

    @njit
    def missing(x):
        call_kernel(np.int64(0), GemmArgs(A=x.ctypes.data, lda=16, B=x.ctypes.data, ldb=16, C=x.ctypes.data, ldc=16))

    x = np.zeros(16, np.float32)
    with pytest.raises(TypingError, match=r"GemmArgs\.ldb is float64"):
        float_stride(x)
    with pytest.raises(TypingError, match="want a kernel's NamedTuple"):
        raw_tuple(x)
    with pytest.raises(TypeError, match="missing a required argument: 'K'"):
        missing(x)
