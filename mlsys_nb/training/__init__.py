"""The rest of the training loop: the data a model trains on, how it is evaluated and tuned, and how it is
made smaller (notebook 25). Readable reference code; every idea is checked against an independent route in
``tests/test_training.py``, with the mutation that breaks it.

- ``sft``: the SFT data path: chat and instruct records rendered with a chat template by a byte-level
  tokenizer (``encode``, ``decode``, ``to_messages``, ``format_chat``, ``SPECIAL``, ``VOCAB``), the loss mask
  over response tokens only and its targets (``labels``, ``IGNORE``).
- ``packing``: several documents in one row (``pack``: tokens, document ids, positions, labels), the
  block-diagonal causal mask (``document_mask``) and the model run on packed rows through its attention hook
  (``packed_logits``, ``DocumentAttention``); ``mask_documents=False`` shows the leak across documents.
- ``dedup``: exact (``exact_duplicates``) and near-duplicate removal with MinHash and LSH from scratch
  (``shingles``, ``jaccard``, ``minhash_signatures``, ``lsh_candidates``, ``lsh_probability``,
  ``near_duplicates``).
- ``evaluation``: ``perplexity``, ``bits_per_token``, ``model_loss`` (held-out loss on the positions that see
  their full context), ``NGramModel`` (the unigram bound; a memorising high order), ``windows`` and the two
  splits: ``split_documents`` (clean) and ``split_windows`` (leaks).
- ``loop``: ``train_lm`` (AdamW, ``lr_factor``: linear warm-up, cosine decay) and ``next_token_loss``.
- ``search``: ``sample_configs`` and ``random_search`` (seeded, reproducible), the learning-rate range test
  (``lr_range_test``, ``pick_lr``, ``blow_up_lr``).
- ``compression``: ``magnitude_prune`` and its control ``random_prune`` (``prunable_weights``, ``sparsity``);
  distillation (``distill_loss``, ``distillation``: a loss for ``train_lm``; ``kl_to_teacher``).
"""

from .compression import (
    distill_loss,
    distillation,
    kl_to_teacher,
    magnitude_prune,
    prunable_weights,
    random_prune,
    sparsity,
)
from .dedup import (
    exact_duplicates,
    jaccard,
    lsh_candidates,
    lsh_probability,
    minhash_signatures,
    near_duplicates,
    shingles,
)
from .evaluation import NGramModel, bits_per_token, model_loss, perplexity, split_documents, split_windows, windows
from .loop import lr_factor, next_token_loss, train_lm
from .packing import DocumentAttention, document_mask, pack, packed_logits
from .search import blow_up_lr, lr_range_test, pick_lr, random_search, sample_configs
from .sft import IGNORE, SPECIAL, VOCAB, decode, encode, format_chat, labels, to_messages

__all__ = [
    "IGNORE",
    "SPECIAL",
    "VOCAB",
    "DocumentAttention",
    "NGramModel",
    "bits_per_token",
    "blow_up_lr",
    "decode",
    "distill_loss",
    "distillation",
    "document_mask",
    "encode",
    "exact_duplicates",
    "format_chat",
    "jaccard",
    "kl_to_teacher",
    "labels",
    "lr_factor",
    "lr_range_test",
    "lsh_candidates",
    "lsh_probability",
    "magnitude_prune",
    "minhash_signatures",
    "model_loss",
    "near_duplicates",
    "next_token_loss",
    "pack",
    "packed_logits",
    "perplexity",
    "pick_lr",
    "prunable_weights",
    "random_prune",
    "random_search",
    "sample_configs",
    "shingles",
    "sparsity",
    "split_documents",
    "split_windows",
    "to_messages",
    "train_lm",
    "windows",
]
