"""Checks of ``mlsys_nb.parallel.tensor`` run on every rank of one launch (see test_tensor_parallel.py).

Every reference is the *unsharded* layer or model from ``mlsys_nb.models`` (or plain torch ops),
built from full weights drawn from a seed; each rank then slices its part. ``tp_checks()`` returns a
dict with the max abs errors (``err/...``), measured bytes and the matching closed forms, so one
launch per world size reports every failure at once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mlsys_nb.config import ModelConfig
from mlsys_nb.models.transformer import MLP, Attention, Block, Transformer
from mlsys_nb.parallel import functional as pf
from mlsys_nb.parallel import tensor as tp
from mlsys_nb.comm.counting import CommCounter

B, S = 2, 16
CFG = ModelConfig(n_layers=2, hidden=64, n_heads=8, n_kv_heads=4, vocab_size=128, seq_len=S, ffn_hidden=96)
# GPT-style layer for activation accounting (the closed forms assume LayerNorm, a 4h GeLU MLP, MHA,
# dropout, no FlashAttention)
GPT = ModelConfig(
    n_layers=1,
    hidden=64,
    n_heads=8,
    vocab_size=128,
    seq_len=S,
    activation="gelu",
    norm="layernorm",
    ffn_hidden=256,
    dropout=0.1,
)


def _seeded(seed):
    torch.manual_seed(seed)


def _max_err(a, b):
    return (a.detach() - b.detach()).abs().max().item()


def _errs(out: dict, prefix: str, d: dict):
    for k, v in d.items():
        out[f"err/{prefix}/{k}"] = v


def _check_linears(out, t, r):
    _seeded(1)
    i_f, o_f = 32, 48
    W, bias = torch.randn(o_f, i_f) / i_f**0.5, torch.randn(o_f)
    x, dy = torch.randn(B, S, i_f), torch.randn(B, S, o_f)
    xr = x.clone().requires_grad_()
    ref = nn.Linear(i_f, o_f)
    ref.load_state_dict({"weight": W, "bias": bias})
    y_ref = ref(xr)
    (y_ref * dy).sum().backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    for sp in (False, True):
        for regather in (True, False) if sp else (True,):
            tag = f"column/sp={sp}/regather={regather}"
            col = tp.ColumnParallelLinear(i_f, o_f, bias=True, sequence_parallel=sp, regather=regather)
            tp.load_full_state_dict(col, ref.state_dict())
            xl = (tp.shard(x, 1, r, t) if sp else x).clone().requires_grad_()
            y = col(xl)
            out[f"err/{tag}/out"] = _max_err(y, tp.shard(y_ref, -1, r, t))
            (y * tp.shard(dy, -1, r, t)).sum().backward()
            out[f"err/{tag}/dx"] = _max_err(xl.grad, tp.shard(xr.grad, 1, r, t) if sp else xr.grad)
            _errs(out, tag, tp.compare_with_full(col, ref_grads))
    # gather_output: every rank gets the full output
    col = tp.ColumnParallelLinear(i_f, o_f, bias=True, gather_output=True)
    tp.load_full_state_dict(col, ref.state_dict())
    xl = x.clone().requires_grad_()
    y = col(xl)
    (y * dy).sum().backward()
    out["err/column_gather/out"] = _max_err(y, y_ref)
    out["err/column_gather/dx"] = _max_err(xl.grad, xr.grad)
    _errs(out, "column_gather", tp.compare_with_full(col, ref_grads))

    for sp in (False, True):
        tag = f"row/sp={sp}"
        row = tp.RowParallelLinear(i_f, o_f, bias=True, sequence_parallel=sp)
        tp.load_full_state_dict(row, ref.state_dict())
        xl = tp.shard(x, -1, r, t).clone().requires_grad_()
        y = row(xl)
        out[f"err/{tag}/out"] = _max_err(y, tp.shard(y_ref, 1, r, t) if sp else y_ref)
        (y * (tp.shard(dy, 1, r, t) if sp else dy)).sum().backward()
        tp.sync_sequence_parallel_grads(row)
        out[f"err/{tag}/dx"] = _max_err(xl.grad, tp.shard(xr.grad, -1, r, t))
        _errs(out, tag, tp.compare_with_full(row, ref_grads))


def _check_blocks(out, t, r):
    cos, sin = Transformer(CFG).rope_cos, Transformer(CFG).rope_sin
    cases = [
        ("mlp_swiglu", CFG),
        ("mlp_gelu_bias", CFG.replace(activation="gelu", bias=True)),
        ("attention_gqa", CFG),
        ("attention_bias", CFG.replace(bias=True, n_kv_heads=8)),
        ("block", CFG),
        ("block_layernorm_bias", CFG.replace(norm="layernorm", bias=True)),
    ]
    for name, cfg in cases:
        _seeded(2)
        full = {"mlp": MLP, "att": Attention, "blo": Block}[name[:3]](cfg)
        x, dy = torch.randn(B, S, cfg.hidden), torch.randn(B, S, cfg.hidden)
        xr = x.clone().requires_grad_()
        call = (lambda m, a: m(a)) if name.startswith("mlp") else (lambda m, a: m(a, cos, sin))
        y_ref = call(full, xr)
        (y_ref * dy).sum().backward()
        ref_grads = {n: p.grad for n, p in full.named_parameters()}
        for sp in (False, True):
            tag = f"{name}/sp={sp}"
            cls = {"mlp": tp.TPMLP, "att": tp.TPAttention, "blo": tp.TPBlock}[name[:3]]
            mod = cls(cfg, sequence_parallel=sp)
            tp.load_full_state_dict(mod, full.state_dict())
            xl = (tp.shard(x, 1, r, t) if sp else x).clone().requires_grad_()
            y = call(mod, xl)
            out[f"err/{tag}/out"] = _max_err(y, tp.shard(y_ref, 1, r, t) if sp else y_ref)
            (y * (tp.shard(dy, 1, r, t) if sp else dy)).sum().backward()
            tp.sync_sequence_parallel_grads(mod)
            out[f"err/{tag}/dx"] = _max_err(xl.grad, tp.shard(xr.grad, 1, r, t) if sp else xr.grad)
            _errs(out, tag, tp.compare_with_full(mod, ref_grads))


def _check_embedding_and_loss(out, t, r):
    _seeded(3)
    V, h = CFG.vocab_size, CFG.hidden
    emb = nn.Embedding(V, h)
    tokens = torch.randint(0, V, (B, S))
    dy = torch.randn(B, S, h)
    y_ref = emb(tokens)
    (y_ref * dy).sum().backward()
    for sp in (False, True):
        tag = f"embedding/sp={sp}"
        pe = tp.VocabParallelEmbedding(V, h, sequence_parallel=sp)
        tp.load_full_state_dict(pe, emb.state_dict())
        y = pe(tokens)
        out[f"err/{tag}/out"] = _max_err(y, tp.shard(y_ref, 1, r, t) if sp else y_ref)
        (y * (tp.shard(dy, 1, r, t) if sp else dy)).sum().backward()
        _errs(out, tag, tp.compare_with_full(pe, {"weight": emb.weight.grad}))

    logits = (3 * torch.randn(B, S, V)).requires_grad_()
    targets = torch.randint(0, V, (B, S))
    loss_ref = F.cross_entropy(logits.view(-1, V), targets.view(-1))
    loss_ref.backward()
    local = tp.shard(logits.detach(), -1, r, t).clone().requires_grad_()
    loss = tp.vocab_parallel_cross_entropy(local, targets)
    loss.backward()
    out["err/vocab_ce/loss"] = abs(loss.item() - loss_ref.item())
    out["err/vocab_ce/dlogits"] = _max_err(local.grad, tp.shard(logits.grad, -1, r, t))


def _check_model(out, t, r):
    for tied in (False, True):
        cfg = CFG.replace(tied_embeddings=tied)
        _seeded(4)
        full = Transformer(cfg)
        tokens, targets = torch.randint(0, cfg.vocab_size, (B, S)), torch.randint(0, cfg.vocab_size, (B, S))
        loss_ref = full(tokens, targets)
        loss_ref.backward()
        logits_ref = full(tokens).detach()
        ref_grads = {n: p.grad for n, p in full.named_parameters()}
        if tied:
            ref_grads["lm_head.weight"] = full.embed.weight.grad
        for sp in (False, True):
            tag = f"model/tied={tied}/sp={sp}"
            model = tp.TPTransformer(cfg, sequence_parallel=sp)
            tp.load_full_state_dict(model, full.state_dict())
            out[f"err/{tag}/weights"] = max(tp.compare_with_full(model, full.state_dict(), grads=False).values())
            with CommCounter() as cc:
                loss = model(tokens, targets)
                loss.backward()
                tp.sync_sequence_parallel_grads(model)
            out[f"err/{tag}/loss"] = abs(loss.item() - loss_ref.item())
            with torch.no_grad():
                out[f"err/{tag}/logits"] = _max_err(model(tokens), tp.shard(logits_ref, -1, r, t))
            _errs(out, tag, tp.compare_with_full(model, ref_grads))
            out[f"bytes/{tag}/measured"] = cc.bytes_sent
            out[f"bytes/{tag}/formula"] = _model_step_bytes(cfg, t, sp)


# ---- closed forms (ring traffic, Megatron TP, exact counts, Korthikanti activations) ---------------
def _layer_step_bytes(h, t, sp, regather, elem=4):
    """Per-rank ring bytes of one transformer layer, forward + backward, activations [B, S, h].
    No SP: 4 all-reduces of b·s·h -> 8(t-1)/t·bsh elements (Shoeybi et al. 2019). SP: 4 all-gathers + 4
    reduce-scatters of the full b·s·h array -> the same 8(t-1)/t·bsh; Megatron's re-gather of the
    two column-parallel inputs in backward adds 2(t-1)/t·bsh."""
    bsh = B * S * h
    k = 8 + (2 if (sp and regather) else 0)
    return k * (t - 1) / t * bsh * elem


def _model_step_bytes(cfg, t, sp, elem=4):
    """Whole-model step: L layers (above, with Megatron's re-gather under SP), plus the embedding
    exit (all-reduce fwd, or RS fwd + AG bwd), the LM-head entry (AR bwd; under SP AG fwd + RS bwd + re-gather
    AG bwd), 3 all-reduces of b·s fp32 values in the loss, and under SP the all-reduce of the norm
    weight gradients (2 per layer + final norm, h each)."""
    bsh, bs, h, L = B * S * cfg.hidden, B * S, cfg.hidden, cfg.n_layers
    f = (t - 1) / t
    total = L * _layer_step_bytes(h, t, sp, True, elem)
    if sp:
        total += 2 * f * bsh * elem  # embedding: reduce-scatter fwd, all-gather bwd
        total += 3 * f * bsh * elem  # LM head: AG fwd, RS bwd, re-gather AG bwd
        total += (2 * L + 1) * 2 * f * h * elem  # SP norm-weight gradient all-reduces
    else:
        total += 2 * f * bsh * elem  # embedding all-reduce fwd
        total += 2 * f * bsh * elem  # LM head f: all-reduce bwd
    total += 3 * 2 * f * bs * 4  # CE: max, target logit, sum exp (fp32)
    return total


def _check_comm(out, t, r):
    _seeded(5)
    h = CFG.hidden
    cos, sin = Transformer(CFG).rope_cos, Transformer(CFG).rope_sin
    for sp, regather in ((False, True), (True, False), (True, True)):
        tag = f"layer/sp={sp}/regather={regather}"
        blk = tp.TPBlock(CFG, sequence_parallel=sp, regather=regather)
        x = torch.randn(B, S // t if sp else S, h, requires_grad=True)
        with CommCounter() as cc:
            blk(x, cos, sin).sum().backward()
        with CommCounter() as cc_sync:
            tp.sync_sequence_parallel_grads(blk)
        out[f"bytes/{tag}/measured"] = cc.bytes_sent
        out[f"bytes/{tag}/formula"] = _layer_step_bytes(h, t, sp, regather)
        out[f"calls/{tag}"] = {op: v["calls"] for op, v in cc.by_op().items()}
        out[f"bytes/{tag}/norm_grad_sync"] = cc_sync.bytes_sent


def _saved_bytes(fn, exclude):
    """Bytes of the unique storages autograd saves for backward while ``fn()`` runs, except the
    storages of the tensors in ``exclude`` (parameters, whose transposes get saved, and the RoPE
    tables), and the result of fn."""
    seen = {}
    params = {p.untyped_storage().data_ptr() for p in exclude}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        res = fn()
    return sum(seen.values()), res


def _layer_activation_formula(cfg, t, sp, B_=4, M=4):
    """Korthikanti et al. 2022 per-layer activations with general widths (arXiv:2205.05198, eq. 1-2;
    on CPU dropout masks are saved in the activation dtype):
    replicated under TP without SP: LayerNorm inputs 2B, QKV input B, MLP input B, 2 dropout masks
    M (all ·sbh); split by t: Q, K, V, O-input 4B·sbh, GeLU input and output 8B·sbh, attention core
    a·s²·b·(2B + M). With SP everything is split by t. Plus what the paper neglects and eager
    PyTorch saves: LayerNorm mean and rstd (2 values per token per norm, activation dtype on CPU)
    and the causal mask (s² bools)."""
    sbh, as2b = S * B * cfg.hidden, cfg.n_heads * S * S * B
    rep = (4 * B_ + 2 * M) * sbh
    split = (4 * B_ + 8 * B_) * sbh + (2 * B_ + M) * as2b
    main = (rep + split) / t if sp else rep + split / t
    ln_stats = 2 * 2 * B_ * S * B / (t if sp else 1)
    return main + ln_stats + S * S


def _check_memory(out, t, r):
    from mlsys_nb import memory
    from mlsys_nb.config import TrainConfig

    cos, sin = Transformer(GPT).rope_cos, Transformer(GPT).rope_sin
    for sp in (None, False, True):  # None: the unsharded layer
        tag = "layer/none" if sp is None else f"layer/tp/sp={sp}"
        _seeded(6)
        if sp is None:
            blk = Block(GPT, attn_impl="matmul")
        else:
            blk = tp.TPBlock(GPT, sequence_parallel=sp, attn_impl="matmul")
        x = torch.randn(B, S // t if sp else S, GPT.hidden, requires_grad=True)
        blk.train()
        measured, y = _saved_bytes(lambda blk=blk, x=x: blk(x, cos, sin), [*blk.parameters(), cos, sin])
        y.sum().backward()  # the saved graph is valid
        tt = 1 if sp is None else t
        train = TrainConfig(
            micro_batch=B,
            seq_len=S,
            precision="fp32",
            tp=tt,
            sp=bool(sp),
            recompute="none",
            flash_attention=False,
            kernels="eager",
            device="cpu",
        )
        out[f"act/{tag}/measured"] = measured
        out[f"act/{tag}/formula"] = _layer_activation_formula(GPT, tt, bool(sp))
        out[f"act/{tag}/memory.layer_terms"] = sum(b for _, b in memory.layer_terms(GPT, train))
    # parameters: Llama-style exact count (Llama Team 2024 shapes), matrices split by t, norms replicated
    for tied in (False, True):
        cfg = CFG.replace(tied_embeddings=tied)
        model = tp.TPTransformer(cfg)
        h, f, L, V = cfg.hidden, cfg.ffn_hidden, cfg.n_layers, cfg.vocab_size
        layer = (h * cfg.q_dim + 2 * h * cfg.kv_dim + cfg.q_dim * h + 3 * h * f) / t + 2 * h
        uniq = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
        out[f"param/tied={tied}/measured"] = sum(uniq.values())
        out[f"param/tied={tied}/formula"] = (L * layer + V * h / t * (1 if tied else 2) + h) * 4
        train = TrainConfig(micro_batch=B, seq_len=S, precision="fp32", tp=t)
        out[f"param/tied={tied}/memory.estimate"] = memory.estimate(cfg, train).params


def _check_torch_tp(out, t, r):
    """torch.distributed.tensor.parallel on the same MLP (GeLU, no bias), with and without SP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    cfg = CFG.replace(activation="gelu", ffn_hidden=128)
    _seeded(7)
    full = MLP(cfg)
    x, dy = torch.randn(B, S, cfg.hidden), torch.randn(B, S, cfg.hidden)
    xr = x.clone().requires_grad_()
    y_ref = full(xr)
    (y_ref * dy).sum().backward()
    mesh = init_device_mesh("cpu", (t,))
    for sp in (False, True):
        tag = f"torch_tp/sp={sp}"
        mod = MLP(cfg)
        mod.load_state_dict(full.state_dict())
        plan = {
            "up_proj": ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel(),
            "down_proj": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
        }
        parallelize_module(mod, mesh, plan)
        xl = (tp.shard(x, 1, r, t) if sp else x).clone().requires_grad_()
        with CommDebugMode() as cdm:
            y = mod(xl)
            (y * (tp.shard(dy, 1, r, t) if sp else dy)).sum().backward()
        y = y.to_local() if hasattr(y, "to_local") else y
        out[f"err/{tag}/out"] = _max_err(y, tp.shard(y_ref, 1, r, t) if sp else y_ref)
        out[f"err/{tag}/dx"] = _max_err(xl.grad, tp.shard(xr.grad, 1, r, t) if sp else xr.grad)
        out[f"err/{tag}/up_proj.weight"] = _max_err(
            mod.up_proj.weight.grad.to_local(), tp.shard(full.up_proj.weight.grad, 0, r, t)
        )
        out[f"err/{tag}/down_proj.weight"] = _max_err(
            mod.down_proj.weight.grad.to_local(), tp.shard(full.down_proj.weight.grad, 1, r, t)
        )
        out[f"calls/{tag}"] = {str(k).split(".")[-1]: v for k, v in cdm.get_comm_counts().items()}
        # ours, same MLP, same plan
        ours = tp.TPMLP(cfg, sequence_parallel=sp, regather=False)
        tp.load_full_state_dict(ours, full.state_dict())
        xo = (tp.shard(x, 1, r, t) if sp else x).clone().requires_grad_()
        with CommCounter() as cc:
            (ours(xo) * (tp.shard(dy, 1, r, t) if sp else dy)).sum().backward()
        out[f"calls/ours_mlp/sp={sp}"] = {op: v["calls"] for op, v in cc.by_op().items()}


def _run_counted(op, x, dy):
    """``op(x)``, then its backward with upstream gradient ``dy``; returns (y, dx, collectives
    counted in forward, collectives counted in backward)."""
    x = x.clone().requires_grad_(True)
    with CommCounter() as fwd:
        y = op(x)
    with CommCounter() as bwd:
        y.backward(dy)
    return y.detach(), x.grad, sorted(fwd.by_op()), sorted(bwd.by_op())


def _check_functional(out, t, r):
    """Every differentiable collective of ``mlsys_nb.parallel.functional`` on this rank: forward and
    input gradient against single-process formulas over every rank's data (all ranks draw all of it
    from one seed; ``xs[j]``, ``ws[j]``: rank j's input and upstream gradient), and the collectives
    counted in forward and backward, which the test compares with the module's table."""
    _seeded(7)
    dim = 1
    xs, ws = torch.randn(t, 2, 3 * t, 5), torch.randn(t, 2, 3 * t, 5)
    x_rep, w_rep = xs[0], ws[0]  # a replicated tensor: the same on every rank
    shard_r = lambda full: tp.shard(full, dim, r, t)  # noqa: E731
    cases = {  # name: (op, input, upstream gradient, forward reference, gradient reference)
        # copy_to: the input is replicated, each rank's consumer differs: dx = sum of every rank's dy
        "copy_to": (lambda x: pf.copy_to(x), x_rep, ws[r], x_rep, ws.sum(0)),
        # reduce_from: the output is replicated and consumed alike on every rank: dx = dy
        "reduce_from": (lambda x: pf.reduce_from(x), xs[r], w_rep, xs.sum(0), w_rep),
        # gather_from: every rank's copy of the gathered tensor feeds its own consumer
        "gather_from": (
            lambda x: pf.gather_from(x, dim),
            shard_r(xs[0]),
            ws[r],
            xs[0],
            shard_r(ws.sum(0)),
        ),
        "reduce_scatter_to": (
            lambda x: pf.reduce_scatter_to(x, dim),
            xs[r],
            shard_r(ws[r]),
            shard_r(xs.sum(0)),
            torch.cat([tp.shard(ws[j], dim, j, t) for j in range(t)], dim),
        ),
        # gather_replicated: the gathered tensor is consumed alike on every rank
        "gather_replicated": (
            lambda x: pf.gather_replicated(x, dim),
            shard_r(xs[0]),
            w_rep,
            xs[0],
            shard_r(w_rep),
        ),
    }
    # all_to_all with uneven splits: rank i sends split[i][j] = (i + 2j) % 3 + 1 rows to rank j
    split = [[(i + 2 * j) % 3 + 1 for j in range(t)] for i in range(t)]
    rows = [torch.randn(sum(split[i]), 4) for i in range(t)]  # every rank's send buffer
    grads = [torch.randn(sum(split[j][i] for j in range(t)), 4) for i in range(t)]  # every rank's dy

    def block(mats, sizes, k):  # rows of block k of a matrix cut into blocks of ``sizes`` rows
        return mats[sum(sizes[:k]) : sum(sizes[: k + 1])]

    recv = [split[j][r] for j in range(t)]
    cases["all_to_all"] = (
        lambda x: pf.all_to_all(x, split[r], recv),
        rows[r],
        grads[r],
        torch.cat([block(rows[j], split[j], r) for j in range(t)]),
        torch.cat([block(grads[j], [split[i][j] for i in range(t)], r) for j in range(t)]),
    )
    for name, (op, x, dy, y_ref, dx_ref) in cases.items():
        y, dx, fwd_ops, bwd_ops = _run_counted(op, x, dy)
        out[f"err/functional/{name}/forward"] = _max_err(y, y_ref)
        out[f"err/functional/{name}/grad"] = _max_err(dx, dx_ref)
        out[f"ops/functional/{name}"] = (fwd_ops, bwd_ops)
    # the idea broken on purpose: f without its backward all-reduce (a plain view)
    _, x, dy, _, dx_ref = cases["copy_to"]
    dx = _run_counted(lambda v: v.view_as(v), x, dy)[1]
    out["broken/functional/copy_to_without_all_reduce"] = _max_err(dx, dx_ref)


def tp_checks():
    """Run every check on this rank; returns a dict (errors, bytes, call counts)."""
    torch.set_num_threads(1)
    t, r = dist.get_world_size(), dist.get_rank()
    out = {"world": t}
    for fn in (
        _check_functional,
        _check_linears,
        _check_blocks,
        _check_embedding_and_loss,
        _check_model,
        _check_comm,
        _check_memory,
        _check_torch_tp,
    ):
        try:
            fn(out, t, r)
        except Exception as e:  # report every failing group, do not stop at the first
            import traceback

            out[f"exception/{fn.__name__}"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    return out
