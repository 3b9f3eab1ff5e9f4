"""The strata package itself: versions, devices, determinism, forced implementations, plans, errors."""

import re

import pytest
import torch

import strata
from strata import _C, _ops


def test_version():
    v = strata.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    major, minor, patch = map(int, v.split("."))
    assert strata.version_int() == major * 10000 + minor * 100 + patch
    assert strata.__version__ == v


def test_devices():
    devs = strata.devices()
    assert devs[0]["type"] == "cpu" and devs[0]["index"] == 0
    assert devs[0]["multiprocessor_count"] >= 1 and devs[0]["total_memory"] > 0
    assert strata.device_properties("cpu")["name"] == devs[0]["name"]
    assert len(devs) == 1 + strata.cuda_device_count()
    with pytest.raises(ValueError):
        strata.device_properties("meta")


def test_determinism_roundtrip():
    prev = strata.get_determinism()
    try:
        for level in (0, 1, 2):
            strata.set_determinism(level)
            assert strata.get_determinism() == level
        with pytest.raises(strata.StrataError):
            strata.set_determinism(7)
    finally:
        strata.set_determinism(prev)


def test_num_threads():
    prev = strata.get_num_threads()
    try:
        strata.set_num_threads(1)
        assert strata.get_num_threads() == 1
    finally:
        strata.set_num_threads(prev)


def test_exception_hierarchy():
    assert issubclass(strata.StrataError, RuntimeError)
    assert issubclass(strata.StrataValueError, strata.StrataError)
    assert issubclass(strata.StrataValueError, ValueError)


def test_op_registry():
    names = strata.op_names()
    for op in ("l2norm_fwd", "l2norm_bwd", "rmsnorm_without_weight_fwd", "rmsnorm_without_weight_bwd",
               "chunk_local_cumsum"):
        assert op in names
        assert op in _C.OPS
        impls = strata.impl_names(op)
        assert impls and impls[-1] == "reference"
    with pytest.raises(ValueError):
        strata.impl_names("no_such_op")


def test_plan_inspection_and_cache():
    x = torch.randn(16, 64)
    y, rstd = torch.empty_like(x), torch.empty(16)
    plan = _ops.plan_for(_ops.OP.l2norm_fwd, (x, y, rstd), (1e-6,))
    assert plan.workspace_size >= 0
    assert plan.impl_name in strata.impl_names("l2norm_fwd")
    assert plan.op_name == "l2norm_fwd"
    plan.run([x.data_ptr(), y.data_ptr(), rstd.data_ptr()], 0, 0, 0)  # plain pointers work too
    torch.testing.assert_close(y, x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6), rtol=1e-5, atol=1e-6)
    y.fill_(float("nan"))
    _C.run(plan, [x.data_ptr(), y.data_ptr(), rstd.data_ptr()], 0, 0, 0)
    torch.testing.assert_close(y, x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6), rtol=1e-5, atol=1e-6)
    before = strata.plan_cache_stats()
    strata.api.l2norm(x)
    strata.api.l2norm(x)
    after = strata.plan_cache_stats()
    assert after["hits"] >= before["hits"] + 1


def test_force_impl():
    prev = strata.get_force_impl()
    x = torch.randn(8, 32)
    y, rstd = torch.empty_like(x), torch.empty(8)
    with strata.force_impl("reference"):
        assert strata.get_force_impl() == "reference"
        plan = _ops.plan_for(_ops.OP.l2norm_fwd, (x, y, rstd), (1e-6,))
        assert plan.impl_name == "reference"
        y_ref = strata.api.l2norm(x)
    assert strata.get_force_impl() == prev
    torch.testing.assert_close(strata.api.l2norm(x), y_ref, rtol=1e-6, atol=1e-7)
    # every CPU implementation of each op gives the same result within the f32 ceiling
    for impl in strata.impl_names("l2norm_fwd"):
        with strata.force_impl(impl):
            try:
                out = strata.api.l2norm(x)
            except strata.StrataError as e:  # not applicable here (a CUDA impl, a missing ISA)
                assert e.status in (200, 201, 202)
                continue
        assert ((out.double() - y_ref.double()).norm() / y_ref.double().norm()).item() <= 1e-5, impl


def test_execute_validates_in_c_and_writes_nothing():
    x = torch.randn(4, 8)
    y = torch.full((4, 9), float("nan"))  # wrong shape for y
    rstd = torch.full((4,), float("nan"))
    metas = [_ops._meta(t) for t in (x, y, rstd)]
    with pytest.raises(strata.StrataValueError) as e:
        _C.execute(_ops.OP.l2norm_fwd, metas, (1e-6,), 0)
    assert e.value.status == 103  # STRATA_ERROR_INVALID_SHAPE
    assert "y" in e.value.c_message and e.value.c_message in str(e.value)
    assert torch.isnan(y).all() and torch.isnan(rstd).all()
    # binding-level argument errors
    with pytest.raises(ValueError):
        _C.execute(_ops.OP.l2norm_fwd, metas[:2], (1e-6,), 0)  # tensor count
    with pytest.raises(ValueError):
        _C.execute(_ops.OP.l2norm_fwd, metas, (), 0)  # attribute count
    with pytest.raises(ValueError):
        _C.execute(999, metas, (1e-6,), 0)


def test_unsupported_device_tensor():
    with pytest.raises(ValueError, match="cpu or cuda"):
        _ops.launch(_ops.OP.l2norm_fwd, (torch.empty(2, 3, device="meta"),) * 3, (1e-6,))


def test_dtype_codes():
    assert _ops.dtype_code(torch.float64) == 0 and _ops.dtype_code(torch.bfloat16) == 3
    assert _ops.dtype_code(torch.bool) == 9
    for dt, code in _ops.DTYPE_CODES.items():
        assert _C.dtype_size(code) == torch.empty((), dtype=dt).element_size()


def test_cpu_workspace_is_reused_per_thread_and_released():
    import threading

    strata.release_cpu_workspace()
    a = _ops.cpu_workspace(1000)
    assert a.numel() >= 1000 and a.device.type == "cpu"
    assert _ops.cpu_workspace(10).data_ptr() == a.data_ptr()  # smaller request: the same buffer
    b = _ops.cpu_workspace(5000)
    assert b.numel() >= 5000
    other = []
    t = threading.Thread(target=lambda: other.append(_ops.cpu_workspace(10).data_ptr()))
    t.start()
    t.join()
    assert other[0] != b.data_ptr()  # each thread has its own
    strata.release_cpu_workspace()
    assert getattr(_ops._cpu_ws, "buf", None) is None


def test_ops_with_cpu_workspace_give_the_same_bits_on_a_reused_buffer():
    # chunk_gated_delta_rule's CPU path needs workspace; the second call runs on the cached (dirty) buffer.
    torch.manual_seed(0)
    B, T, H, K = 1, 70, 2, 32
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v = torch.randn(B, T, H, K)
    g = -torch.rand(B, T, H)
    beta = torch.rand(B, T, H)
    strata.release_cpu_workspace()
    o1, s1 = strata.api.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert _ops._cpu_ws.buf is not None
    o2, s2 = strata.api.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_cpu_output_reuses_a_buffer_only_when_nothing_holds_it():
    import threading

    strata.release_cpu_workspace()
    like = torch.empty(0)
    shape, n = (256, 1024), 256 * 1024  # 1 MiB of f32: above the cache's smallest size
    a = _ops.cpu_output(shape, torch.float32, like)
    assert a.shape == shape and a.is_contiguous() and a._base is None and a.dtype == torch.float32
    a.fill_(1.0)
    pa = a.data_ptr()
    del a
    a = _ops.cpu_output(shape, torch.float32, like)
    assert a.data_ptr() == pa  # idle: handed out again
    # every kind of holder keeps the buffer: the tensor, a view, its storage object, numpy, a DLPack capsule
    holders = [lambda t: t, lambda t: t[3:], lambda t: t.untyped_storage(), lambda t: t.numpy(),
               lambda t: torch.utils.dlpack.to_dlpack(t)]
    for make_holder in holders:
        held = make_holder(a)
        del a
        b = _ops.cpu_output(shape, torch.float32, like)
        assert b.data_ptr() != pa  # a new buffer while the old one is held
        del held
        a = _ops.cpu_output(shape, torch.float32, like)
        assert a.data_ptr() == pa  # b's buffer is in use, the old one idle again
        del b
    assert torch.equal(a, torch.ones(shape))  # the old contents (no zeroing): it is an output buffer
    other_dtype = _ops.cpu_output((n,), torch.int32, like)  # same bytes, another dtype
    assert other_dtype.dtype == torch.int32 and other_dtype.numel() == n and other_dtype.data_ptr() != pa
    assert _ops.cpu_output((16,), torch.float32, like).shape == (16,)  # below the threshold: torch.empty
    # at most CPU_OUTPUT_CACHE buffers per thread (held ones are let go); other threads have their own
    held = [_ops.cpu_output((n + 16 * i,), torch.float32, like) for i in range(_ops.CPU_OUTPUT_CACHE + 3)]
    for i, h in enumerate(held):
        h.fill_(float(i))
    assert len(_ops._cpu_out.bufs) == _ops.CPU_OUTPUT_CACHE
    other = []
    t = threading.Thread(target=lambda: other.append(len(getattr(_ops._cpu_out, "bufs", []))))
    t.start()
    t.join()
    assert other == [0]
    strata.release_cpu_workspace()
    assert _ops._cpu_out.bufs == []
    assert all(torch.equal(h, torch.full_like(h, float(i))) for i, h in enumerate(held))  # still theirs


def test_chunk_gated_delta_rule_cpu_outputs_come_from_the_cache():
    # T=2048 HV=2 V=64: o is 1 MiB (cached); the second call reuses the first call's o once the caller dropped it,
    # and the dirty buffer gives the same bits. With the l2norm (without it these random keys, |k|^2 ~ 64, blow the state
    # up to inf within ~200 tokens, and NaN != NaN).
    torch.manual_seed(0)
    B, T, H, K = 1, 2048, 2, 64
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    g, beta = -torch.rand(B, T, H), torch.rand(B, T, H)
    strata.release_cpu_workspace()
    o1, _ = strata.api.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert torch.isfinite(o1).all()
    ref, p1 = o1.clone(), o1.data_ptr()
    o1.fill_(float("nan"))
    del o1
    o2, _ = strata.api.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert o2.data_ptr() == p1 and torch.equal(o2, ref)
    o3, _ = strata.api.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)  # o2 held: another
    assert o3.data_ptr() != p1 and torch.equal(o3, ref)
