"""``Breakdown``: the memory of one rank by component (bytes), and ``check``: the combinations that cannot run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..config import ModelConfig, TrainConfig, check_int
from .stages import max_chunks, stage_layers
from .units import GB, GiB


@dataclass
class Breakdown:
    """Memory of one rank, in bytes. ``params``/``grads``/``optimizer``/``master`` are the model
    states (``master`` 0 where not used; ``grads`` includes an fp32 accumulation buffer if asked);
    ``activations`` = ``activations_layers`` (all layers on this rank x in-flight micro-batches) +
    ``activations_outside`` (embedding, final norm, head, loss); ``temporary``: transient buffers at
    the peak (ZeRO-3 gathered layers, recompute working set or logits gradient); ``overhead``:
    ``train.overhead_bytes``; ``total`` their sum. ``fits`` compares ``total`` with the GPU. With ``train.offload``
    the model-state fields are what stays on the accelerator, ``host`` the bytes held in host memory
    (``detail["host"]`` by state) and ``offload_bytes_per_step`` the host-link traffic of one step
    (``detail["offload"]``, ``checkpoint.offload.offload_bytes_per_step``); with ``train.finetune`` "lora" or
    "qlora", ``params`` = frozen base + adapters (``detail["finetune"]``), the other states the adapters'."""

    params: float
    grads: float
    optimizer: float
    master: float
    activations: float
    activations_per_layer: float
    activations_layers: float
    activations_outside: float
    temporary: float
    overhead: float
    total: float
    n_params_rank: float  # parameters this rank holds before ZeRO sharding (elements)
    n_params_total: int
    n_params_active: int
    layers: int  # transformer layers on this rank
    in_flight: float  # micro-batches held by the PP schedule
    stage: int
    gpu: str
    gpu_memory: float
    mode: str = "default"
    host: float = 0.0  # bytes held in host memory with train.offload (0 without)
    offload_bytes_per_step: float = 0.0  # bytes over the host link per optimizer step with train.offload
    terms: list = field(default_factory=list, repr=False)  # one layer's (name, bytes)
    detail: dict = field(default_factory=dict, repr=False)

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_memory

    def fits_on(self, gpu_name: str) -> bool:
        from .. import hardware

        return self.total <= hardware.gpu(gpu_name).memory_bytes

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer + self.master

    def to_frame(self):
        """A table of the components (bytes, GB = 1e9 B, GiB = 2**30 B)."""
        import pandas as pd

        rows = [
            ("parameters", self.params),
            ("gradients", self.grads),
            ("optimizer states", self.optimizer),
            ("master weights", self.master),
            ("activations (layers)", self.activations_layers),
            ("activations (outside layers)", self.activations_outside),
            ("temporary buffers", self.temporary),
            ("overhead", self.overhead),
            ("total", self.total),
        ]
        df = pd.DataFrame(rows, columns=["component", "bytes"])
        df["GB"] = df["bytes"] / GB
        df["GiB"] = df["bytes"] / GiB
        return df.set_index("component")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("terms")
        d.pop("detail")
        return d


def check(model: ModelConfig, train: TrainConfig) -> None:
    """Raise ``ValueError`` naming the parameter for impossible combinations."""
    m, t = model, train
    if m.n_heads % t.tp:
        raise ValueError(f"tp={t.tp} must divide n_heads={m.n_heads} (attention heads are split across TP ranks)")
    if not m.kv_lora_rank and t.tp > 1 and m.n_kv_heads % t.tp and t.tp % m.n_kv_heads:
        raise ValueError(
            f"tp={t.tp} and n_kv_heads={m.n_kv_heads}: one must divide the other (KV heads split or replicated)"
        )
    if m.ffn_hidden % t.tp or (m.is_moe and m.expert_ffn_hidden % t.tp):
        raise ValueError(f"tp={t.tp} must divide the FFN width ffn_hidden={m.ffn_hidden}")
    # every pipeline chunk needs at least one layer
    check_int(
        f"pp x virtual_stages = {t.pp} x {t.virtual_stages} (n_layers={m.n_layers})",
        t.pp * t.virtual_stages,
        1,
        m.n_layers if t.pp == 1 else m.n_layers + 2,
    )
    if t.pp_layers is not None:
        stage_layers(m.n_layers, t.pp, t.pp_layers)  # raises naming pp_layers
    if t.pp > 1 and t.virtual_stages > 1:  # the first chunk may hold only the embedding, the last only the head
        check_int(
            f"virtual_stages (n_layers={m.n_layers}, pp={t.pp}: chunks per rank = its layers, + 1 on the first "
            "and on the last stage, Llama 3 §3.3.2)",
            t.virtual_stages,
            1,
            max_chunks(m.n_layers, t.pp, t.pp_layers),
        )
    if t.pp_schedule == "dualpipe" and t.pp > 1 and t.pp % 2:
        raise ValueError(f"pp={t.pp}: pp_schedule='dualpipe' needs an even pp (stage i and pp-1-i share a rank)")
    if t.seq_len % t.cp:
        raise ValueError(f"cp={t.cp} must divide seq_len={t.seq_len}")
    if t.sp and t.seq_len // t.cp % t.tp:
        raise ValueError(f"with sp=True, tp={t.tp} must divide the local sequence length {t.seq_len // t.cp}")
    if t.ep > 1:
        if not m.is_moe:
            raise ValueError(f"ep={t.ep} needs a mixture-of-experts model (n_experts > 0)")
        if m.n_experts % t.ep:
            raise ValueError(f"ep={t.ep} must divide n_experts={m.n_experts}")
        if (t.dp * t.cp) % t.ep:
            raise ValueError(
                f"ep={t.ep} must divide dp x cp = {t.dp * t.cp} (experts are sharded over data-parallel ranks)"
            )
    if t.seq_len > m.seq_len and t.kernels == "eager":
        raise ValueError(f"seq_len={t.seq_len} exceeds the model's seq_len={m.seq_len}")
    if t.pp > 1:
        check_int("n_microbatches", t.microbatches, 1)
