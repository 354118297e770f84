"""kernels.gemm: MKL's GEMMs against their np.matmul twins, the route they take, and how the backend is chosen.

The test extra installs the `mkl` wheel, so in CI the MKL kernels are the ones under test; the
first test fails (rather than skips) when the wheel is installed but not used.
"""

import importlib.metadata
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from tensorarena import kernels
from tensorarena.kernels import gemm as G
from tests.gemm_libraries import library, route_on  # noqa: F401 - library is a fixture


def _mkl_installed() -> bool:
    try:
        importlib.metadata.distribution("mkl")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_mkl = pytest.mark.skipif(G._mkl is None, reason=f"MKL is not this process's GEMM backend: {G._why_not}")
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def test_mkl_is_the_backend_when_its_wheel_is_installed():
    if not _mkl_installed():
        pytest.skip("the mkl wheel is not installed")
    assert G._mkl is not None, G._why_not
    assert G.backend().startswith("MKL (") and "GNU OpenMP" in G.backend()
    assert kernels.choose("gemm") == "fused" and kernels.choose("batched_gemm") == "fused"


def _operand(rng, rows, cols, dtype, layout):
    """A (rows, cols) array laid out as the GEMM callers hand them over."""
    if layout == "c":
        return rng.standard_normal((rows, cols)).astype(dtype)
    if layout == "t":  # a transposed view: BLAS's Trans flag on the base
        return rng.standard_normal((cols, rows)).astype(dtype).T
    if layout == "ld":  # rows of a wider array (leading dimension > cols)
        return rng.standard_normal((rows, cols + 5)).astype(dtype)[:, 2:2 + cols]
    if layout == "copy":  # every other column: no BLAS layout, gemm copies it
        return rng.standard_normal((rows, 2 * cols)).astype(dtype)[:, ::2]
    raise ValueError(layout)


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_layout", ["c", "t", "ld", "copy"])
@pytest.mark.parametrize("b_layout", ["c", "t", "ld"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_mkl_matches_its_numpy_twin(dtype, a_layout, b_layout, accumulate):
    rng = np.random.default_rng(0)
    a, b = _operand(rng, 37, 53, dtype, a_layout), _operand(rng, 53, 29, dtype, b_layout)
    start = rng.standard_normal((37, 29)).astype(dtype)
    got, want = start.copy(), start.copy()
    G.gemm_mkl(a, b, got, accumulate)
    G.gemm_reference(a, b, want, accumulate)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    exact = a.astype(np.float64) @ b.astype(np.float64) + (start if accumulate else 0)
    np.testing.assert_allclose(got, exact, **TOL[dtype])


@needs_mkl
@pytest.mark.parametrize("shape, route", [((37, 53, 29), "one_core"), ((300, 200, 100), "mkl_threads"),
                                          ((40, 200, 400), "column_cut")])
@pytest.mark.parametrize("accumulate", [False, True])
def test_a_prepared_gemm_does_what_gemm_mkl_does_on_the_same_arrays(shape, route, accumulate, library):
    # kernels.gemm.prepare_gemm_mkl: checked and planned once, then run again on whatever the arrays hold
    # (a captured fused step records it through tape.recorded).
    m, k, n = shape
    if route == "column_cut" and numba.get_num_threads() < 2:
        pytest.skip("a column cut needs two cores")
    route = route_on(library, route)
    rng = np.random.default_rng(2)
    a, b = _operand(rng, m, k, np.float32, "t"), _operand(rng, k, n, np.float32, "ld")
    start = rng.standard_normal((m, n)).astype(np.float32)
    out, want = start.copy(), start.copy()
    run = G.prepare_gemm_mkl(a, b, out, accumulate)
    for _ in range(2):  # new values in the same arrays: the prepared call reads them
        a[...] = rng.standard_normal(a.shape)
        before = kernels.calls[("gemm_route", route)]
        assert run() is out
        assert kernels.calls[("gemm_route", route)] == before + 1
        G.gemm_mkl(a, b, want, accumulate)
        np.testing.assert_array_equal(out, want)  # the same MKL calls on the same operands


@needs_mkl
def test_a_gemm_that_must_copy_an_operand_or_has_nothing_to_multiply_is_not_prepared():
    rng = np.random.default_rng(3)
    strided = _operand(rng, 6, 4, np.float32, "copy")  # copied on every call: a prepared call would not
    assert G.prepare_gemm_mkl(strided, np.ones((4, 3), np.float32), np.empty((6, 3), np.float32)) is None
    assert G.prepare_gemm_mkl(np.empty((6, 0), np.float32), np.empty((0, 3), np.float32),
                              np.empty((6, 3), np.float32)) is None
    with pytest.raises(ValueError, match="do not chain"):  # checked as gemm_mkl checks
        G.prepare_gemm_mkl(np.ones((6, 4), np.float32), np.ones((5, 3), np.float32), np.empty((6, 3), np.float32))


@needs_mkl
def test_gemm_mkl_writes_into_rows_of_a_wider_output_and_handles_empty_sizes():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 3))
    wide = np.full((6, 7), 9.0)
    G.gemm_mkl(a, b, wide[:, 2:5])
    np.testing.assert_allclose(wide[:, 2:5], a @ b, rtol=1e-12)
    assert (wide[:, :2] == 9).all() and (wide[:, 5:] == 9).all()  # nothing outside the view touched
    out = np.full((6, 3), 9.0)
    G.gemm_mkl(np.empty((6, 0)), np.empty((0, 3)), out)  # k = 0: a sum of nothing
    assert (out == 0).all()
    G.gemm_mkl(np.empty((0, 4)), b, np.empty((0, 3)))  # m = 0: nothing to do, no error


@needs_mkl
def test_gemm_mkl_refuses_what_blas_would_get_wrong():
    a = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"\(4, 3\) @ \(4, 2\) -> \(4, 2\)"):
        G.gemm_mkl(a, np.ones((4, 2), np.float32), np.empty((4, 2), np.float32))
    with pytest.raises(TypeError, match="float32 @ float64"):
        G.gemm_mkl(a, np.ones((3, 2)), np.empty((4, 2), np.float32))
    # out aliasing an operand is np.matmul's answer (the operand is read from a copy, f8ef128), not a refusal
    square = np.arange(16, dtype=np.float32).reshape(4, 4)
    want = square @ np.ones((4, 4), np.float32)
    G.gemm_mkl(square, np.ones((4, 4), np.float32), square)
    np.testing.assert_array_equal(square, want)
    with pytest.raises(ValueError, match="row-major"):
        G.gemm_mkl(a, np.ones((3, 2), np.float32), np.empty((2, 4), np.float32).T)


def _packed_heads(rng, b, t, h, hs, dtype):
    """q, k, v as (B, H, T, hs) views of one packed (B, T, 3, H, hs) projection, as attention takes them."""
    qkv = rng.standard_normal((b, t, 3, h, hs)).astype(dtype)
    return [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_gemm_mkl_matches_its_numpy_twin_on_attention_views(dtype):
    rng = np.random.default_rng(2)
    q, k, v = _packed_heads(rng, 3, 11, 4, 8, dtype)
    g = rng.standard_normal((3, 4, 11, 8)).astype(dtype)
    p = np.empty((3, 4, 11, 11), dtype)
    out = np.empty((3, 11, 4, 8), dtype).transpose(0, 2, 1, 3)  # heads written into (B, T, H, hs)
    cases = [(q, k.swapaxes(-1, -2), p), (p, v, out), (p.swapaxes(-1, -2), g, np.empty_like(g)),
             (g, v.swapaxes(-1, -2), np.empty_like(p))]
    for a, b, dst in cases:
        G.batched_gemm_mkl(a, b, dst)
        want = G.batched_gemm_reference(a, b, np.empty(dst.shape, dtype))
        np.testing.assert_allclose(dst, want, **TOL[dtype])
        np.testing.assert_allclose(dst, a.astype(np.float64) @ b.astype(np.float64), **TOL[dtype])


@needs_mkl
def test_batched_gemm_mkl_copies_an_operand_without_a_blas_layout_and_checks_shapes():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 5, 12))[:, :, ::2]  # unit stride on neither of the last two axes
    b = rng.standard_normal((2, 6, 4))
    out = np.empty((2, 5, 4))
    G.batched_gemm_mkl(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    with pytest.raises(ValueError, match=r"\(2, 5, 6\) @ \(3, 6, 4\)"):
        G.batched_gemm_mkl(a, np.empty((3, 6, 4)), np.empty((3, 5, 4)))


@needs_mkl
def test_linear_and_attention_run_their_products_on_mkl():
    from tensorarena import Tensor, nn

    rng = np.random.default_rng(4)
    layer = nn.MultiheadAttention(16, 2, rng=rng)
    x = Tensor(rng.standard_normal((2, 5, 16)).astype(np.float32), requires_grad=True)
    before = dict(kernels.calls)
    layer(x).sum().backward()
    ran = {key: kernels.calls[key] - before.get(key, 0) for key in kernels.calls}
    assert ran.get(("gemm", "fused"), 0) >= 6  # qkv and out projections, forward and both grads
    # attention's products: MKL from inside its per-(batch, head) loop, forward and backward
    assert ran.get(("attention_slices", "mkl"), 0) == 2
    assert ran.get(("gemm", "reference"), 0) == 0 and ran.get(("batched_gemm", "reference"), 0) == 0


@needs_mkl
def test_a_2d_matmul_op_runs_on_mkl_and_its_gradients_match_torch():
    import torch

    from tensorarena import Tensor, ops

    rng = np.random.default_rng(6)
    a_np, b_np = rng.standard_normal((7, 5)), rng.standard_normal((5, 3))
    a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    before = kernels.calls[("gemm", "fused")]
    out = ops.matmul(a, b)
    out.backward(np.ones((7, 3)))
    assert kernels.calls[("gemm", "fused")] == before + 3  # forward, d a, d b
    ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    (ta @ tb).sum().backward()
    np.testing.assert_allclose(out.data, (ta @ tb).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.grad, ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(b.grad, tb.grad.numpy(), rtol=1e-12)


def test_float16_products_go_to_numpy_and_are_counted_there():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 3)).astype(np.float16), rng.standard_normal((3, 2)).astype(np.float16)
    before = kernels.calls[("gemm", "reference")]
    out = G.gemm(a, b, np.empty((4, 2), np.float16))
    assert kernels.calls[("gemm", "reference")] == before + 1
    np.testing.assert_allclose(out, a @ b, rtol=1e-3)


def _run(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TENSORARENA_GEMM", "MKL_THREADING_LAYER", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_tensorarena_gemm_numpy_keeps_numpys_blas_and_says_so():
    out = _run("from tensorarena.kernels import gemm, choose; print(choose('gemm'), '|', gemm.backend())",
               TENSORARENA_GEMM="numpy")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reference | NumPy's BLAS (TENSORARENA_GEMM=numpy)"


def test_a_bad_tensorarena_gemm_value_is_an_error_naming_the_choices():
    out = _run("import tensorarena.kernels.gemm", TENSORARENA_GEMM="openblas")
    assert out.returncode != 0 and "TENSORARENA_GEMM must be 'auto', 'mkl' or 'numpy', got 'openblas'" in out.stderr


def test_asking_for_mkl_without_it_is_an_error_that_says_what_to_install(monkeypatch):
    monkeypatch.setenv("TENSORARENA_GEMM", "mkl")
    monkeypatch.setattr(G, "find_mkl_rt", lambda: (None, "the mkl package is not installed (pip install 'tensorarena[mkl]')"))
    with pytest.raises(RuntimeError, match=r"TENSORARENA_GEMM=mkl, but the mkl package is not installed \(pip install"):
        G._choose()
    monkeypatch.setenv("TENSORARENA_GEMM", "auto")
    assert G._choose() == (None, "the mkl package is not installed (pip install 'tensorarena[mkl]')")


@needs_mkl
def test_use_backend_switches_the_route_both_ways():
    try:
        G.use_backend("numpy")
        assert kernels.choose("gemm") == "reference" and G.backend().startswith("NumPy's BLAS (use_backend")
    finally:
        G.use_backend("mkl")
    assert kernels.choose("gemm") == "fused" and kernels.choose("batched_gemm") == "fused"


# After a GEMM the main thread sleeps 80 ms; the CPU the process burns meanwhile is what the idle
# OpenMP threads (MKL's and the Numba kernels' one libgomp pool) spin. With MKL, kernels/__init__
# lets them spin GOMP_SPINCOUNT=100000 rounds (~2-3 ms) before they sleep; a user's OMP_WAIT_POLICY
# wins: PASSIVE sleeps at once, ACTIVE (libgomp's default 30e9 rounds) spins through the whole sleep.
# The median of 5 sleeps: under README's `-n 2` the other worker's test shares the cores, and the least of the five
# once fell to 0.1 ms by default (the spinning thread kept off its core); with two busy loops beside it the five
# were 0.9-3.8 ms, their median 3.2 (alone: 3.1-6.8, median 6.5).
SPIN_PROBE = """
import os, time, numpy as np
from tensorarena.kernels import gemm as G
a = np.random.default_rng(0).random((1200, 1200), dtype=np.float32)
out = np.empty_like(a)
burnt = []
for _ in range(5):
    G.gemm(a, a, out)
    t = time.process_time(); time.sleep(0.08); burnt.append(time.process_time() - t)
print(sorted(burnt)[2], max(burnt), G.backend().split()[0], os.environ["OMP_WAIT_POLICY"],
      os.environ.get("GOMP_SPINCOUNT", "-"))
"""


@needs_mkl
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: no idle OpenMP thread to spin")
@pytest.mark.parametrize("policy, burn_ms", [(None, (0.3, 15)), ("PASSIVE", (0, 1)), ("ACTIVE", (30, 100))])
def test_mkl_threads_spin_briefly_then_sleep_after_a_gemm(policy, burn_ms):
    low, high = burn_ms
    seen = []
    # The brief spin's floor on the most of the five: on a Zen 4 under `-n 2` the median once fell to 0.06 ms
    # (2026-12-05, the whole suite beside it), while a sleep that found its core free still spun. On an Intel Xeon
    # (2026-12-07) the whole suite's other worker kept both cores busy through all five twice in a row (0.10 ms
    # most; alone 4-5 ms): up to three probes, the floor met by one of them, the ceiling by every one.
    for _ in range(3):
        out = _run(SPIN_PROBE, **({"OMP_WAIT_POLICY": policy} if policy else {}))
        assert out.returncode == 0, out.stderr
        median, most, backend, wait_policy, spin_count = out.stdout.split()
        assert backend == "MKL"
        assert (wait_policy, spin_count) == ((policy, "-") if policy else ("ACTIVE", "100000"))
        assert float(median) * 1e3 <= high, f"idle threads burnt {float(median) * 1e3:.2f} ms (median) of 80 ms sleeps"
        seen.append(f"{float(median) * 1e3:.2f} ms (median), {float(most) * 1e3:.2f} ms (most)")
        if low <= float(most if policy is None else median) * 1e3:
            return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under README's `-n 2` the other worker's test can hold both cores through every probe (fresh-clone CI on
        # an AVX-512 Xeon, 2026-12-07: 0.06, 0.21 and 0.06 ms most, while alone 3 of 3 runs met the floor): the
        # spin cannot be seen then. Said as a skip, with the numbers; the ceilings above were checked all the same,
        # and run alone (no -n) this still fails.
        pytest.skip(f"the brief spin was not observable beside the other xdist worker: {'; '.join(seen)}")
    pytest.fail(f"idle threads burnt {'; '.join(seen)} of 80 ms sleeps, below {low} ms in every probe")


def test_without_mkl_the_kernels_threads_sleep_at_once():
    # OpenBLAS's own threads run the GEMMs then: a spinning libgomp worker would take their core.
    out = _run("import os, tensorarena; print(os.environ['OMP_WAIT_POLICY'], os.environ.get('GOMP_SPINCOUNT', '-'))",
               TENSORARENA_GEMM="numpy")
    assert out.returncode == 0 and out.stdout.split() == ["PASSIVE", "-"], out.stderr


@needs_mkl
def test_an_ilp64_interface_in_the_environment_does_not_garble_the_arguments():
    code = ("import numpy as np; from tensorarena.kernels import gemm as G\n"
            "a = np.arange(12.0).reshape(3, 4); b = np.arange(8.0).reshape(4, 2); o = np.empty((3, 2))\n"
            "G.gemm_mkl(a, b, o); print(np.array_equal(o, a @ b))")
    out = _run(code, MKL_INTERFACE_LAYER="ILP64")
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


@needs_mkl
def test_mkl_already_set_up_by_someone_else_is_reported_not_hidden():
    # Another library in the process picked MKL's sequential layer first: ours cannot change it, and says so.
    code = ("import ctypes, logging; logging.basicConfig()\n"
            f"ctypes.CDLL({G._mkl.path!r}).MKL_Set_Threading_Layer(1)\n"
            "from tensorarena.kernels import gemm; print(gemm.backend())")
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert "sequential threading layer" in out.stdout
    assert "MKL's threading layer is sequential, not GNU OpenMP" in out.stderr
