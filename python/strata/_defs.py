"""The torch ops over Strata's C ops: implementation, fake (shape/dtype) function and autograd of each.

Adding an op: one row in python/src/strata_ext.cpp (kOps), then here an impl that allocates the outputs
and calls `launch`, a fake that allocates the same outputs, and (if differentiable) setup_context and
backward; then a public wrapper with defaults in api.py.
"""

from ._ops import OP, OPS, define, empty, empty_like, launch, stat_dtype

# ---------------------------------------------------------------------------------------------------------
# l2norm (ops_gdn_kda.md §4.1): y = x / sqrt(sum(x^2) + eps), rstd saved.


def _l2norm_fwd_fake(x, eps, output_dtype):
    return (x.new_empty(x.shape, dtype=output_dtype or x.dtype),
            x.new_empty(x.shape[:-1], dtype=stat_dtype(x.dtype)))


def _l2norm_fwd_setup(ctx, inputs, output):
    y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(y, rstd)
    ctx.x_dtype = inputs[0].dtype


def _l2norm_fwd_backward(ctx, dy, drstd):
    # rstd is a saved statistic (not differentiable), as in fla: its gradient is ignored.
    y, rstd = ctx.saved_tensors
    return OPS["l2norm_bwd"](y, rstd, dy, ctx.x_dtype), None, None


@define("l2norm_fwd", "(Tensor x, float eps, ScalarType? output_dtype) -> (Tensor, Tensor)",
        fake=_l2norm_fwd_fake, setup_context=_l2norm_fwd_setup, backward=_l2norm_fwd_backward)
def _l2norm_fwd(x, eps, output_dtype):
    y = empty_like(x, output_dtype or x.dtype)
    rstd = empty(x.shape[:-1], stat_dtype(x.dtype), x)
    launch(OP.l2norm_fwd, (x, y, rstd), (eps,))
    return y, rstd


def _l2norm_bwd_fake(y, rstd, dy, output_dtype):
    return y.new_empty(y.shape, dtype=output_dtype or y.dtype)


@define("l2norm_bwd", "(Tensor y, Tensor rstd, Tensor dy, ScalarType? output_dtype) -> Tensor",
        fake=_l2norm_bwd_fake, tensor_args=(0, 1, 2))
def _l2norm_bwd(y, rstd, dy, output_dtype):
    dx = empty_like(y, output_dtype or y.dtype)
    launch(OP.l2norm_bwd, (y, rstd, dy, dx), ())
    return dx


# ---------------------------------------------------------------------------------------------------------
# rmsnorm_without_weight (ops_fused.md §3): r = 1 / sqrt(mean(x^2) + eps); normalize: y = x * r.

_NORMALIZE, _FACTOR = 0, 1


def _r_shape(x):
    return tuple(x.shape[:-1]) + (1,)


def _rms_fwd_fake(x, eps, out_dtype):
    return (x.new_empty(x.shape, dtype=out_dtype or x.dtype),
            x.new_empty(_r_shape(x), dtype=stat_dtype(x.dtype)))


def _rms_fwd_setup(ctx, inputs, output):
    y, r = output
    ctx.mark_non_differentiable(r)
    ctx.save_for_backward(inputs[0], r)


def _rms_fwd_backward(ctx, dy, dr):
    x, r = ctx.saved_tensors
    return OPS["rmsnorm_without_weight_bwd"](x, r, dy, _NORMALIZE, x.dtype), None, None


@define("rmsnorm_without_weight_fwd", "(Tensor x, float eps, ScalarType? out_dtype) -> (Tensor, Tensor)",
        fake=_rms_fwd_fake, setup_context=_rms_fwd_setup, backward=_rms_fwd_backward)
def _rms_fwd(x, eps, out_dtype):
    y = empty_like(x, out_dtype or x.dtype)
    r = empty(_r_shape(x), stat_dtype(x.dtype), x)
    launch(OP.rmsnorm_without_weight_fwd, (x, y, r), (eps, _NORMALIZE))
    return y, r


def _rms_factor_fake(x, eps, out_dtype):
    return x.new_empty(_r_shape(x), dtype=out_dtype or x.dtype)


def _rms_factor_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)


def _rms_factor_backward(ctx, dr):
    x, r = ctx.saved_tensors
    return OPS["rmsnorm_without_weight_bwd"](x, r, dr, _FACTOR, x.dtype), None, None


@define("rmsnorm_without_weight_factor", "(Tensor x, float eps, ScalarType? out_dtype) -> Tensor",
        fake=_rms_factor_fake, setup_context=_rms_factor_setup, backward=_rms_factor_backward)
def _rms_factor(x, eps, out_dtype):
    r = empty(_r_shape(x), out_dtype or x.dtype, x)
    launch(OP.rmsnorm_without_weight_fwd, (x, None, r), (eps, _FACTOR))
    return r


def _rms_bwd_fake(x, r, dout, mode, output_dtype):
    return x.new_empty(x.shape, dtype=output_dtype or x.dtype)


@define("rmsnorm_without_weight_bwd",
        "(Tensor x, Tensor r, Tensor dout, int mode, ScalarType? output_dtype) -> Tensor",
        fake=_rms_bwd_fake, tensor_args=(0, 1, 2))
def _rms_bwd(x, r, dout, mode, output_dtype):
    dx = empty_like(x, output_dtype or x.dtype)
    launch(OP.rmsnorm_without_weight_bwd, (x, r, dout, dx), (mode,))
    return dx


# ---------------------------------------------------------------------------------------------------------
# chunk_local_cumsum (ops_gdn_kda.md §4.2); linear, its adjoint is the reverse cumsum (same scale).


def _cumsum_fake(g, chunk_size, reverse, scale, cu_seqlens, output_dtype):
    return g.new_empty(g.shape, dtype=output_dtype)


def _cumsum_setup(ctx, inputs, output):
    g, chunk_size, reverse, scale, cu_seqlens, _ = inputs
    ctx.save_for_backward(cu_seqlens)
    ctx.g_dtype = g.dtype
    ctx.chunk_size, ctx.reverse, ctx.scale = chunk_size, reverse, scale


def _cumsum_backward(ctx, dout):
    (cu_seqlens,) = ctx.saved_tensors
    dg = OPS["chunk_local_cumsum"](dout, ctx.chunk_size, not ctx.reverse, ctx.scale, cu_seqlens, ctx.g_dtype)
    return dg, None, None, None, None, None


@define("chunk_local_cumsum",
        "(Tensor g, int chunk_size, bool reverse, float scale, Tensor? cu_seqlens, ScalarType output_dtype)"
        " -> Tensor",
        fake=_cumsum_fake, tensor_args=(0, 4), setup_context=_cumsum_setup, backward=_cumsum_backward)
def _cumsum(g, chunk_size, reverse, scale, cu_seqlens, output_dtype):
    out = empty_like(g, output_dtype)
    launch(OP.chunk_local_cumsum, (g, cu_seqlens, out), (chunk_size, 1 if reverse else 0, scale))
    return out

