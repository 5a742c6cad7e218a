"""Collectives built from point-to-point messages, with every byte counted.

Each function here runs inside a rank (started by ``mlsys_nb.launch``) and uses only
``send``/``recv``/``isend``/``irecv`` through a :class:`CountingComm`, which counts the bytes this
rank sends and receives. ``mlsys_nb.comm`` holds the closed forms those counts must equal.

Algorithms (``n`` ranks, a tensor of ``S`` bytes):

- :func:`ring_reduce_scatter`, :func:`ring_all_gather`, :func:`ring_all_reduce`: the ring.
  All-reduce *is* the reduce-scatter phase followed by the all-gather phase on one buffer
  (``2(n-1)`` steps of ``S/n`` bytes each, ``2(n-1)/n * S`` bytes sent per rank). The chunks follow
  ``torch.tensor_split``, so sizes that ``n`` does not divide work. :func:`ring_steps` is the plain
  ring (one batched send/recv pair per step); :func:`pipelined_ring_steps`, which the three run,
  cuts each chunk into pieces that are sent with ``isend`` as soon as they are ready, so reducing
  one piece overlaps the transfer of the next. The reduction is an in-place op on views (no copies).
- :func:`recursive_doubling_all_reduce`: ``log2(n)`` exchanges of the whole tensor with partner
  ``rank XOR 2^k`` (latency-optimal); non-powers of two fold the extra ranks in first.
- :func:`tree_reduce`, :func:`tree_broadcast`, :func:`tree_all_reduce`: a binomial tree,
  reduce to the root then broadcast back (``2 ceil(log2 n)`` steps of the whole tensor).
- :func:`all_reduce_via_reduce_scatter_all_gather`: the identity all_reduce = reduce_scatter +
  all_gather, composed from the two public out-of-place functions.
- :func:`pairwise_all_to_all`: ``n-1`` pairwise exchanges.

Checks: :func:`verify_against_torch` (every algorithm vs ``torch.distributed``, with byte counts)
and :func:`check_semantics` (the symbolic before/after of :func:`collective_semantics`, which
``mlsys_nb.comm.plots.draw_collective`` draws, vs ``torch.distributed``).

Reduction ops: ``"sum"``, ``"product"``, ``"max"``, ``"min"`` (in place on the receiving buffer).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..config import check_int

__all__ = [
    "CountingComm",
    "chunk_bounds",
    "REDUCE_OPS",
    "ring_reduce_scatter",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_steps",
    "pipelined_ring_steps",
    "recursive_doubling_all_reduce",
    "tree_reduce",
    "tree_broadcast",
    "tree_all_reduce",
    "all_reduce_via_reduce_scatter_all_gather",
    "pairwise_all_to_all",
    "ALL_REDUCE_ALGORITHMS",
    "rank_input",
    "verify_against_torch",
    "clear_workspace",
    "SEMANTICS_OPS",
    "collective_semantics",
    "evaluate_semantics",
    "check_semantics",
]

# Ring pipelining granularity. Measured on the 2-core CPU machine (gloo, 4 ranks): pieces below
# a few MiB cost more in per-message overhead than they gain in overlap (no idle core to overlap
# with), so only chunks above 8 MiB are cut. On GPUs/NICs, smaller pieces pay off.
DEFAULT_PIECE_BYTES = 8 << 20


def _sum_(a, b):
    return a.add_(b)


def _prod_(a, b):
    return a.mul_(b)


def _max_(a, b):
    return torch.maximum(a, b, out=a)


def _min_(a, b):
    return torch.minimum(a, b, out=a)


REDUCE_OPS = {"sum": _sum_, "product": _prod_, "max": _max_, "min": _min_}


def _reduce_fn(op: str):
    if op not in REDUCE_OPS:
        raise ValueError(f"op={op!r} is not supported: choose one of {sorted(REDUCE_OPS)}")
    return REDUCE_OPS[op]


class CountingComm:
    """Point-to-point messages on ``torch.distributed`` that count this rank's bytes.

    ``bytes_sent`` / ``bytes_received`` (bytes) and ``messages_sent`` grow with every call; call
    :meth:`reset` between measurements. Peers are ranks *within* ``group`` (``None`` = the world).
    ``count=False`` turns the counting off (e.g. inside a timing loop; it costs microseconds).
    """

    def __init__(self, group=None, count: bool = True):
        if not dist.is_initialized():
            raise RuntimeError("CountingComm needs an initialised process group: run it inside mlsys_nb.launch")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.count = count
        self.reset()

    def reset(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0

    def _peer(self, peer: int) -> int:
        check_int("peer", peer, 0, self.world_size - 1)
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def _sent(self, t):
        if self.count:
            self.bytes_sent += t.numel() * t.element_size()
            self.messages_sent += 1

    def _received(self, t):
        if self.count:
            self.bytes_received += t.numel() * t.element_size()

    def isend(self, t: torch.Tensor, dst: int, tag: int = 0):
        self._sent(t)
        return dist.isend(t, self._peer(dst), group=self.group, tag=tag)

    def irecv(self, t: torch.Tensor, src: int, tag: int = 0):
        self._received(t)
        return dist.irecv(t, self._peer(src), group=self.group, tag=tag)

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._sent(t)
        dist.send(t, self._peer(dst), group=self.group, tag=tag)

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> None:
        self._received(t)
        dist.recv(t, self._peer(src), group=self.group, tag=tag)

    def exchange(self, send_t: torch.Tensor, dst: int, recv_t: torch.Tensor, src: int) -> list:
        """Send ``send_t`` to ``dst`` and receive ``recv_t`` from ``src`` as one batched pair
        (``batch_isend_irecv``): NCCL needs the pair grouped when ``dst == src`` or the ranks
        form a cycle, or both sides block in their send. Returns the requests to ``wait()``."""
        self._sent(send_t)
        self._received(recv_t)
        ops = [
            dist.P2POp(dist.isend, send_t, self._peer(dst), self.group),
            dist.P2POp(dist.irecv, recv_t, self._peer(src), self.group),
        ]
        return dist.batch_isend_irecv(ops)

    def counts(self) -> dict:
        return {
            "rank": self.rank,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "messages_sent": self.messages_sent,
        }


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of ``n`` chunks covering ``numel`` elements, as ``torch.tensor_split``
    cuts them: the first ``numel % n`` chunks hold one element more."""
    check_int("n", n, 1)
    base, extra = divmod(int(numel), n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _comm(comm):
    return comm if comm is not None else CountingComm()


def _pieces(a: int, b: int, piece_elems: int) -> list[tuple[int, int]]:
    if b <= a:
        return []
    k = max(1, -(-(b - a) // piece_elems))
    return [(a + (b - a) * j // k, a + (b - a) * (j + 1) // k) for j in range(k)]


_WORKSPACE: dict = {}


def _workspace(k: int, numel: int, dtype, device) -> list[torch.Tensor]:
    """``k`` receive buffers of ``numel`` elements, reused across calls. A fresh large tensor is
    a fresh ``mmap``: touching it page-faults, which on CPU costs as much as the copy itself."""
    key = (k, dtype, str(device))
    bufs = _WORKSPACE.get(key)
    if bufs is None or bufs[0].numel() < numel:
        bufs = [torch.empty(numel, dtype=dtype, device=device) for _ in range(k)]
        _WORKSPACE[key] = bufs
    return [b[:numel] for b in bufs]


def clear_workspace() -> None:
    """Free the cached receive buffers (a long-lived rank keeps them between calls otherwise)."""
    _WORKSPACE.clear()


def ring_steps(flat, bounds, comm, first: int, last: int, op: str = "sum") -> None:
    """Ring steps ``first .. last-1`` of all-reduce on the 1-D buffer ``flat``, in place.

    Step ``t`` sends chunk ``(r-t-1) mod n`` to the right and receives chunk ``(r-t-2) mod n``
    from the left (``bounds[i]`` = chunk ``i``'s ``(start, stop)`` elements); steps ``t < n-1``
    (reduce-scatter phase) reduce what arrives into the local chunk, later steps (all-gather
    phase) receive straight into it. After step ``n-2`` rank ``r`` owns the fully reduced chunk
    ``r``; after step ``2n-3`` every rank holds every chunk. One batched send/recv pair per step:
    the form NCCL needs (an ungrouped send to the right and receive from the left can block each
    other on a GPU)."""
    n, r = comm.world_size, comm.rank
    reduce_ = _reduce_fn(op)
    right, left = (r + 1) % n, (r - 1) % n
    buf = _workspace(1, max(b - a for a, b in bounds), flat.dtype, flat.device)[0]
    for t in range(first, last):
        sa, sb = bounds[(r - t - 1) % n]
        ra, rb = bounds[(r - t - 2) % n]
        dst = buf[: rb - ra] if t < n - 1 else flat[ra:rb]  # reduce-scatter: a buffer; all-gather: in place
        for req in comm.exchange(flat[sa:sb], right, dst, left):
            req.wait()
        if t < n - 1:
            reduce_(flat[ra:rb], dst)


def pipelined_ring_steps(flat, bounds, comm, first: int, last: int, op: str, piece_bytes: int) -> None:
    """The steps of :func:`ring_steps`, pipelined: each chunk is cut into pieces of ``piece_bytes``
    bytes, and a received piece is forwarded (``isend``) the moment it is reduced, so reducing one
    piece overlaps the transfer of the next. ``piece_bytes <= 0`` or the NCCL backend run
    :func:`ring_steps` (one batched pair per step)."""
    n, r = comm.world_size, comm.rank
    if n == 1 or first >= last:
        return
    if piece_bytes <= 0 or dist.get_backend(comm.group) == "nccl":
        return ring_steps(flat, bounds, comm, first, last, op)
    reduce_ = _reduce_fn(op)
    right, left = (r + 1) % n, (r - 1) % n
    piece = max(1, piece_bytes // flat.element_size())
    maxc = max(b - a for a, b in bounds)
    bufs = _workspace(2, maxc, flat.dtype, flat.device) if first < n - 1 else [None, None]
    sends: dict[int, list] = {}

    def recv_chunk(t):
        return (r - t - 2) % n

    def tag(t, j):
        return t * 1_000_003 + j  # unique per (step, piece) so matching never depends on order

    def post_recvs(t):
        if t >= last:
            return []
        a, b = bounds[recv_chunk(t)]
        reqs = []
        if t >= n - 1:  # all-gather phase: receive in place, after our own send of it finished
            for req in sends.pop(t + 1 - n, []):
                req.wait()
        for j, (pa, pb) in enumerate(_pieces(a, b, piece)):
            dst = bufs[t % 2][pa - a : pb - a] if t < n - 1 else flat[pa:pb]
            reqs.append(comm.irecv(dst, left, tag=tag(t, j)))
        return reqs

    a, b = bounds[(r - first - 1) % n]
    sends[first] = [
        comm.isend(flat[pa:pb], right, tag=tag(first, j)) for j, (pa, pb) in enumerate(_pieces(a, b, piece))
    ]
    recvs = post_recvs(first)
    for t in range(first, last):
        nxt = post_recvs(t + 1)
        a, b = bounds[recv_chunk(t)]
        fwd = []
        for j, ((pa, pb), req) in enumerate(zip(_pieces(a, b, piece), recvs)):
            req.wait()
            if t < n - 1:
                reduce_(flat[pa:pb], bufs[t % 2][pa - a : pb - a])
            if t + 1 < last:
                fwd.append(comm.isend(flat[pa:pb], right, tag=tag(t + 1, j)))
        if t + 1 < last:
            sends[t + 1] = fwd
        recvs = nxt
    for reqs in sends.values():
        for req in reqs:
            req.wait()


def _flat_work(tensor: torch.Tensor):
    """A contiguous 1-D view of ``tensor`` (or a copy, if it is not contiguous)."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()


def _write_back(tensor: torch.Tensor, flat: torch.Tensor) -> None:
    """Copy the result back if :func:`_flat_work` had to work on a copy."""
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))


def ring_all_reduce(
    tensor: torch.Tensor, comm: CountingComm | None = None, op: str = "sum", piece_bytes: int = DEFAULT_PIECE_BYTES
) -> torch.Tensor:
    """In-place ring all-reduce: reduce-scatter phase (steps 0..n-2) then all-gather phase
    (steps n-1..2n-3) on one buffer. Returns ``tensor``. Sends ``2(n-1)/n * S`` bytes per rank
    when ``n`` divides the element count (``comm.ring_bytes_sent`` gives the exact count otherwise).
    ``piece_bytes``: pipelining granularity in bytes; ``0`` = one batched send/recv pair per step
    without pipelining (what the NCCL backend always uses)."""
    comm = _comm(comm)
    flat = _flat_work(tensor)
    n = comm.world_size
    pipelined_ring_steps(flat, chunk_bounds(flat.numel(), n), comm, 0, 2 * n - 2, op, piece_bytes)
    _write_back(tensor, flat)
    return tensor


def ring_reduce_scatter(
    tensor: torch.Tensor, comm: CountingComm | None = None, op: str = "sum", piece_bytes: int = DEFAULT_PIECE_BYTES
) -> torch.Tensor:
    """Out-of-place ring reduce-scatter of the flattened ``tensor``: returns this rank's chunk
    (``torch.tensor_split(tensor.flatten(), n)[rank]``, reduced over all ranks). ``tensor`` is
    left unchanged. Sends ``(n-1)/n * S`` bytes per rank, S = the full input."""
    comm = _comm(comm)
    flat = tensor.reshape(-1).clone()
    n, r = comm.world_size, comm.rank
    bounds = chunk_bounds(flat.numel(), n)
    pipelined_ring_steps(flat, bounds, comm, 0, n - 1, op, piece_bytes)
    a, b = bounds[r]
    return flat[a:b].clone()


def ring_all_gather(
    tensor: torch.Tensor,
    comm: CountingComm | None = None,
    sizes: list[int] | None = None,
    piece_bytes: int = DEFAULT_PIECE_BYTES,
) -> torch.Tensor:
    """Out-of-place ring all-gather: the 1-D concatenation of every rank's flattened ``tensor``
    (rank order). ``sizes`` = element count of each rank's input when they differ (default: all
    equal to this rank's). Sends ``(n-1)/n * S`` bytes per rank, S = the full output."""
    comm = _comm(comm)
    n, r = comm.world_size, comm.rank
    sizes = [tensor.numel()] * n if sizes is None else [int(s) for s in sizes]
    if len(sizes) != n or sizes[r] != tensor.numel():
        raise ValueError(f"sizes={sizes} must list {n} element counts with sizes[{r}] == {tensor.numel()}")
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    out = torch.empty(start, dtype=tensor.dtype, device=tensor.device)
    a, b = bounds[r]
    out[a:b].copy_(tensor.reshape(-1))
    pipelined_ring_steps(out, bounds, comm, n - 1, 2 * n - 2, "sum", piece_bytes)
    return out


def all_reduce_via_reduce_scatter_all_gather(
    tensor: torch.Tensor, comm: CountingComm | None = None, op: str = "sum"
) -> torch.Tensor:
    """all_reduce = reduce_scatter + all_gather, composed from the two out-of-place ring functions
    (in place on ``tensor``; returns it). Same bytes as :func:`ring_all_reduce`."""
    comm = _comm(comm)
    shard = ring_reduce_scatter(tensor, comm, op=op)
    sizes = [b - a for a, b in chunk_bounds(tensor.numel(), comm.world_size)]
    tensor.copy_(ring_all_gather(shard, comm, sizes=sizes).view(tensor.shape))
    return tensor


def recursive_doubling_all_reduce(
    tensor: torch.Tensor, comm: CountingComm | None = None, op: str = "sum"
) -> torch.Tensor:
    """In-place recursive-doubling all-reduce: at step k exchange the whole tensor with rank
    ``r XOR 2^k`` and reduce, ``log2(p)`` steps for the largest power of two ``p <= n``. When
    ``n`` is not a power of two, the first ``2(n-p)`` ranks pair up: even ones hand their tensor
    to the odd neighbour before and get the result back after. Returns ``tensor``."""
    comm = _comm(comm)
    reduce_ = _reduce_fn(op)
    flat = _flat_work(tensor)
    n, r = comm.world_size, comm.rank
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    buf = _workspace(1, flat.numel(), flat.dtype, flat.device)[0]
    if r < 2 * rem:
        if r % 2 == 0:
            comm.send(flat, r + 1)
            vr = -1
        else:
            comm.recv(buf, r - 1)
            reduce_(flat, buf)
            vr = r // 2
    else:
        vr = r - rem
    if vr >= 0:
        mask = 1
        while mask < p:
            vpeer = vr ^ mask
            peer = 2 * vpeer + 1 if vpeer < rem else vpeer + rem
            for req in comm.exchange(flat, peer, buf, peer):
                req.wait()
            reduce_(flat, buf)  # a+b == b+a in IEEE arithmetic: both partners get identical bits
            mask <<= 1
    if r < 2 * rem:
        if r % 2 == 0:
            comm.recv(flat, r + 1)
        else:
            comm.send(flat, r - 1)
    _write_back(tensor, flat)
    return tensor


def tree_reduce(tensor: torch.Tensor, comm: CountingComm | None = None, root: int = 0, op: str = "sum") -> torch.Tensor:
    """Binomial-tree reduce to ``root`` (in place; ``ceil(log2 n)`` steps). Only the root's
    result is defined; other ranks hold partial reductions. Returns ``tensor``."""
    comm = _comm(comm)
    reduce_ = _reduce_fn(op)
    n, r = comm.world_size, comm.rank
    check_int("root", root, 0, n - 1)
    flat = _flat_work(tensor)
    vr = (r - root) % n
    buf = _workspace(1, flat.numel(), flat.dtype, flat.device)[0]
    mask = 1
    while mask < n:
        if vr & mask:
            comm.send(flat, (vr - mask + root) % n)
            break
        if vr + mask < n:
            comm.recv(buf, (vr + mask + root) % n)
            reduce_(flat, buf)
        mask <<= 1
    _write_back(tensor, flat)
    return tensor


def tree_broadcast(tensor: torch.Tensor, comm: CountingComm | None = None, root: int = 0) -> torch.Tensor:
    """Binomial-tree broadcast from ``root`` (in place; ``ceil(log2 n)`` steps). Returns ``tensor``."""
    comm = _comm(comm)
    n, r = comm.world_size, comm.rank
    check_int("root", root, 0, n - 1)
    flat = _flat_work(tensor)
    vr = (r - root) % n
    mask = 1
    while mask < n:
        if vr & mask:
            comm.recv(flat, (vr - mask + root) % n)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            comm.send(flat, (vr + mask + root) % n)
        mask >>= 1
    _write_back(tensor, flat)
    return tensor


def tree_all_reduce(tensor: torch.Tensor, comm: CountingComm | None = None, op: str = "sum") -> torch.Tensor:
    """Binomial-tree all-reduce: :func:`tree_reduce` to rank 0, then :func:`tree_broadcast`."""
    comm = _comm(comm)
    tree_reduce(tensor, comm, root=0, op=op)
    return tree_broadcast(tensor, comm, root=0)


def pairwise_all_to_all(tensor: torch.Tensor, comm: CountingComm | None = None) -> torch.Tensor:
    """all_to_all of the flattened ``tensor`` cut into ``n`` equal chunks: chunk ``j`` of rank
    ``i`` lands in slot ``i`` of rank ``j``. ``n-1`` steps; at step ``s`` send to ``r+s`` and
    receive from ``r-s``. Returns a new 1-D tensor. Needs ``n`` to divide the element count."""
    comm = _comm(comm)
    n, r = comm.world_size, comm.rank
    flat = tensor.reshape(-1)
    if flat.numel() % n:
        raise ValueError(f"tensor.numel()={flat.numel()} must be divisible by world_size={n}")
    m = flat.numel() // n
    out = torch.empty_like(flat)
    out[r * m : (r + 1) * m].copy_(flat[r * m : (r + 1) * m])
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        for req in comm.exchange(flat[dst * m : (dst + 1) * m].contiguous(), dst, out[src * m : (src + 1) * m], src):
            req.wait()
    return out


ALL_REDUCE_ALGORITHMS = {
    "ring": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
    "tree": tree_all_reduce,
    "rs+ag": all_reduce_via_reduce_scatter_all_gather,
}


def rank_input(numel: int, rank: int, seed: int = 0, device=None) -> torch.Tensor:
    """The deterministic random input of ``rank`` (``randn``, float32): any rank can rebuild any
    other rank's input, which gives references that need no communication."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randn(int(numel), generator=g).to(device if device is not None else "cpu")


def verify_against_torch(numels=(1, 7, 1001), seed: int = 0, piece_bytes: int = 1024) -> list[dict]:
    """Run inside a rank: every from-scratch collective against ``torch.distributed``'s own result.

    For each element count (pick counts the world size does not divide) returns one row per
    algorithm with ``max_abs_err`` (vs torch), ``bytes_sent``/``bytes_received`` (counted), and
    ``numel``. Small ``piece_bytes`` makes the ring's pipelining run even on small tensors.
    Reduce ops: sum everywhere, plus max for the ring. ``reduce`` compares the root only (other
    ranks' buffers are undefined).
    """
    n, r = dist.get_world_size(), dist.get_rank()
    from ..runtime.ranks import device as _device

    dev = _device()
    rows = []

    def row(algorithm, numel, got, ref, comm):
        err = (got.reshape(-1).cpu() - ref.reshape(-1).cpu()).abs().max().item() if ref.numel() else 0.0
        rows.append(
            dict(
                rank=r,
                world_size=n,
                algorithm=algorithm,
                numel=int(numel),
                max_abs_err=err,
                **{k: v for k, v in comm.counts().items() if k != "rank"},
            )
        )

    for numel in numels:
        x = rank_input(numel, r, seed, dev)
        for opname, torch_op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
            ref = x.clone()
            dist.all_reduce(ref, op=torch_op)
            algos = dict(ALL_REDUCE_ALGORITHMS) if opname == "sum" else {"ring": ring_all_reduce}
            if opname == "sum":
                algos["ring/batched"] = ring_all_reduce
            for name, fn in algos.items():
                comm, y = CountingComm(), x.clone()
                kw = {"piece_bytes": 0 if name == "ring/batched" else piece_bytes} if fn is ring_all_reduce else {}
                fn(y, comm, op=opname, **kw)
                row(f"all_reduce/{name}" + ("" if opname == "sum" else f"/{opname}"), numel, y, ref, comm)
        # a non-contiguous input (a transposed view): worked on as a copy, written back in place
        y = x.repeat(2).view(2, -1).t()
        ref = y.contiguous()
        dist.all_reduce(ref)
        comm = CountingComm()
        ring_all_reduce(y, comm, piece_bytes=piece_bytes)
        row("all_reduce/ring/noncontiguous", y.numel(), y, ref, comm)
        # reduce_scatter: torch's list form accepts unequal chunks
        chunks = [c.contiguous() for c in torch.tensor_split(x, n)]
        ref = torch.empty_like(chunks[r])
        dist.reduce_scatter(ref, chunks)
        comm = CountingComm()
        row("reduce_scatter/ring", numel, ring_reduce_scatter(x, comm, piece_bytes=piece_bytes), ref, comm)
        # all_gather of equal inputs (numel each) against torch; unequal against rebuilt inputs
        outs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x)
        comm = CountingComm()
        row("all_gather/ring", numel * n, ring_all_gather(x, comm, piece_bytes=piece_bytes), torch.cat(outs), comm)
        sizes = [numel + k for k in range(n)]
        mine = rank_input(sizes[r], r, seed + 1, dev)
        comm = CountingComm()
        got = ring_all_gather(mine, comm, sizes=sizes, piece_bytes=piece_bytes)
        ref = torch.cat([rank_input(sizes[k], k, seed + 1, dev) for k in range(n)])
        row("all_gather/ring/unequal", sum(sizes), got, ref, comm)
        # broadcast and reduce from a root that is not 0
        root = n - 1
        ref = x.clone()
        dist.broadcast(ref, root)
        comm = CountingComm()
        row("broadcast/tree", numel, tree_broadcast(x.clone(), comm, root=root), ref, comm)
        ref = x.clone()
        dist.reduce(ref, root)
        comm = CountingComm()
        y = tree_reduce(x.clone(), comm, root=root)
        if r == root:
            row("reduce/tree", numel, y, ref, comm)
        else:
            row("reduce/tree", numel, ref[:0], ref[:0], comm)
        # all_to_all needs n | numel: use numel * n elements
        a = rank_input(numel * n, r, seed + 2, dev)
        ref = torch.empty_like(a)
        dist.all_to_all_single(ref, a)
        comm = CountingComm()
        row("all_to_all/pairwise", numel * n, pairwise_all_to_all(a, comm), ref, comm)
    return rows


# ----------------------------------------------------------------------------- semantics
SEMANTICS_OPS = ("broadcast", "scatter", "gather", "reduce", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def collective_semantics(op: str, n: int, root: int = 0):
    """What each rank holds before and after ``op`` on ``n`` ranks, symbolically.

    Returns ``(before, after)``: for each rank a list of blocks; a block is a ``frozenset`` of
    ``(source_rank, chunk)`` pairs whose sum it holds (one pair = a plain copy), or ``None`` for a
    buffer whose content is undefined (e.g. non-root ranks after ``reduce``; receive buffers
    before the op). Buffers are cut into ``n`` chunks where the op works on chunks.
    :func:`evaluate_semantics` turns blocks into numbers; :func:`check_semantics` compares them
    with ``torch.distributed`` on real ranks."""
    if op not in SEMANTICS_OPS:
        raise ValueError(f"op={op!r} is not known: choose one of {list(SEMANTICS_OPS)}")
    check_int("n", n, 1)

    check_int("root", root, 0, n - 1)
    one = lambda s, c: frozenset({(s, c)})  # noqa: E731
    total = lambda c: frozenset((s, c) for s in range(n))  # noqa: E731
    own = [[one(r, c) for c in range(n)] for r in range(n)]
    if op == "broadcast":
        before = [own[root] if r == root else [None] * n for r in range(n)]
        after = [own[root] for _ in range(n)]
    elif op == "scatter":
        before = [own[root] if r == root else [None] for r in range(n)]
        after = [[one(root, r)] for r in range(n)]
    elif op == "gather":
        before = [[one(r, 0)] for r in range(n)]
        after = [[one(s, 0) for s in range(n)] if r == root else [one(r, 0)] for r in range(n)]
    elif op == "reduce":
        before = own
        after = [[total(c) for c in range(n)] if r == root else [None] * n for r in range(n)]
    elif op == "all_gather":
        before = [[one(r, 0)] for r in range(n)]
        after = [[one(s, 0) for s in range(n)] for _ in range(n)]
    elif op == "reduce_scatter":
        before = own
        after = [[total(r)] for r in range(n)]
    elif op == "all_reduce":
        before = own
        after = [[total(c) for c in range(n)] for _ in range(n)]
    else:  # all_to_all: rank r's chunk c goes to rank c's slot r
        before = own
        after = [[one(s, r) for s in range(n)] for r in range(n)]
    return before, after


def evaluate_semantics(blocks, value):
    """Numbers for symbolic blocks: ``value(source_rank, chunk)`` gives one block's tensor; a block
    holds the sum of its pairs; ``None`` stays ``None``. ``blocks`` is one rank's list."""
    out = []
    for b in blocks:
        out.append(None if b is None else sum(value(s, c) for s, c in sorted(b)))
    return out


def check_semantics(ops=SEMANTICS_OPS, m: int = 3, seed: int = 0, root: int = 0) -> dict:
    """Run inside a rank: each op with ``torch.distributed``, compared block by block with
    :func:`collective_semantics`. Returns ``{op: max_abs_err}`` over the defined blocks."""
    n, r = dist.get_world_size(), dist.get_rank()
    from ..runtime.ranks import device as _device

    dev = _device()

    def v(s, c):
        g = torch.Generator().manual_seed(seed * 100_003 + s * 1009 + c)
        return torch.randn(m, generator=g).to(dev)

    errs = {}
    for op in ops:
        before, after = collective_semantics(op, n, root)
        mine = [b for b in evaluate_semantics(before[r], v)]
        if op == "broadcast":
            buf = torch.cat(mine) if r == root else torch.zeros(n * m, device=dev)
            dist.broadcast(buf, root)
            got = list(buf.split(m))
        elif op == "scatter":
            out = torch.empty(m, device=dev)
            dist.scatter(out, mine if r == root else None, src=root)
            got = [out]
        elif op == "gather":
            outs = [torch.empty(m, device=dev) for _ in range(n)] if r == root else None
            dist.gather(mine[0], outs, dst=root)
            got = outs if r == root else mine
        elif op == "reduce":
            buf = torch.cat(mine)
            dist.reduce(buf, root)
            got = list(buf.split(m))
        elif op == "all_gather":
            outs = [torch.empty(m, device=dev) for _ in range(n)]
            dist.all_gather(outs, mine[0])
            got = outs
        elif op == "reduce_scatter":
            out = torch.empty(m, device=dev)
            dist.reduce_scatter(out, mine)
            got = [out]
        elif op == "all_reduce":
            buf = torch.cat(mine)
            dist.all_reduce(buf)
            got = list(buf.split(m))
        else:
            out = torch.empty(n * m, device=dev)
            dist.all_to_all_single(out, torch.cat(mine))
            got = list(out.split(m))
        want = evaluate_semantics(after[r], v)
        if len(got) != len(want):
            raise AssertionError(f"{op}: rank {r} holds {len(got)} blocks, semantics say {len(want)}")
        errs[op] = max([(g - w).abs().max().item() for g, w in zip(got, want) if w is not None] or [0.0])
    return errs
