"""Parallelism on real ranks, one readable file per strategy, each checked against a reference.

- ``ddp``: data parallelism from scratch: ``allreduce_gradients(model)`` and
  ``DataParallel(model, bucket_cap_mb=25, overlap=True)`` (buckets, overlap, ``no_sync``;
  ``all_reduce="shm"``: the buckets over ``comm.shm.ShmAllReduce``).
- ``zero``: ZeRO stages 1-3 (``ZeRO(model, make_optimizer, stage=3, prefetch=True)``, ``FlatUnit``,
  ``default_units``) with reduce-scatter and all-gather; ``zero_bytes_per_step`` (bytes a rank sends per step
  under DDP and ZeRO-1..3).
- ``functional``: the differentiable collectives the strategies are built from, headed by the table
  of each one's forward and backward: ``copy_to`` / ``reduce_from`` (f and g), ``gather_from`` /
  ``reduce_scatter_to`` along a dimension, ``gather_replicated``, ``all_to_all``, and the plain
  ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``shard``. ``tensor``, ``context`` and
  ``expert`` use them (``tensor.copy_to_tp``, ``tensor.gather_from_sp``, ``expert.all_to_all``, ...
  are the same operators under their strategy's names).
- ``tensor``: Megatron-style tensor and sequence parallelism (``ColumnParallelLinear``,
  ``RowParallelLinear``, ``TPMLP``, ``TPAttention``, ``TPTransformer``, ...; ``tp_bytes_per_layer``, the bytes
  a rank sends per layer in forward).
- ``expert``: expert parallelism for mixture-of-experts layers (``EPMoE``: all_to_all dispatch with
  the counts exchanged first, local experts, all_to_all combine; capacity and drops as the dense
  ``mlsys_nb.models.MoE``), ``check_ep_args``, ``ep_bytes_per_layer``, ``tp_moe_bytes_per_layer``.
- ``context``: context parallelism: ``ring_attention`` (K/V on a ring, isend/irecv overlapped with
  the block compute, log-sum-exp merge, causal zig-zag chunks, GQA), ``allgather_attention`` (the
  Llama 3 variant), ``shard_sequence``, ``positions``, ``check_cp_args``, ``causal_work``.
- ``harness``: the run-and-compare harness: the same seeded model and batches under every
  data-parallel implementation (``compare_implementations``, ``train_parallel``, ``train_single``,
  ``dp_tiny_config``, ``make_batches``, ``time_ddp_steps``), compared with single-process training
  and with PyTorch's DDP/FSDP2 (pieces: ``build_model``, the seeded ``Transformer``; ``local_slice``, a rank's
  share of a batch; ``max_diff``, the largest difference between two ``{name: tensor}`` dicts);
  ``trace_ddp_step``: one DDP step under ``torch.profiler`` in three
  schedules (overlapped, blocking in the hook, after backward), read back by ``runtime.profiling`` (notebook 05b).
- ``data``: per-rank data and the batch recipe as closed forms (no torch): ``shard_indices`` (the shard
  ``DistributedSampler`` gives a rank from one epoch's order), ``samples_per_rank`` (⌈N/W⌉, ⌊N/W⌋ with
  ``drop_last``), ``sampler_problems`` (overlap beyond padding, samples missed, an epoch repeating the last: no
  ``set_epoch``), ``decompose_batch`` / ``BatchRecipe`` (global batch = DP x accumulation x micro-batch),
  ``critical_batch_tradeoff`` and ``noise_scale_from_two_batches`` (McCandlish et al. 2018's model).
- ``mesh``: a pp x dp x cp x tp device mesh (``build_mesh``, ``coordinates``, ``grid``,
  ``group_ranks``) and training that combines DDP, TP/SP and the pipeline executor on it
  (``train``, ``train_worker``, ``check_cases``; one training loop for every combination), compared
  with single-process training.

Rank-side check workers (functions run on every rank by ``mlsys_nb.launch``): those a notebook or
benchmark launches live in the package, beside what they check (``harness`` for data parallelism
and ZeRO, ``mesh.train_worker``); those only the tests launch live in the ``tests/*_checks`` modules
(``tensor_parallel_checks``, ``expert_parallel_checks``, ``context_parallel_checks``,
``mesh_checks``, ``ddp_zero_checks``). Breaking an idea on purpose, to show that its check fails,
is done there, on the test side (a notebook that shows it does the same in its own cell): the
library has no switch for it.

Every module but ``data`` imports torch; import the one you need (``from mlsys_nb.parallel import ddp``).
Bytes on the wire are counted by ``mlsys_nb.comm.counting.CommCounter``.
"""
