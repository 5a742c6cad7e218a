"""Packing: several documents in one training row, with no attention from one document to another.

Padding every document to the row length wastes the padded positions' compute; packing concatenates
documents into rows of ``seq_len`` tokens instead (Krell et al. 2021). Two things then have to be right:

- **attention**: a token may attend only to earlier tokens of *its own* document: the mask is causal
  *and* block-diagonal over documents (``document_mask``). With the plain causal mask of the row, the
  second document's tokens see the first's: its logits change, and the model learns from a context it
  will never have at inference (the leak ``packed_logits(..., mask_documents=False)`` shows);
- **targets**: the last token of a document must not be trained to predict the first token of the next
  one (``pack`` puts ``IGNORE`` there, and on the padding).

Positions restart at 0 in each document (``pack``'s ``positions``). With rotary embeddings attention
depends only on the distance between two tokens, so inside a document-masked row the restart changes
nothing; with learned absolute positions it would.

``packed_logits`` runs the kit's ``Transformer`` on packed rows through its attention hook (the ``cache``
argument of ``Transformer.forward``: ``begin`` gives the positions, ``attend`` the attention; the same
protocol as ``mlsys_nb.inference.kv_cache``), so the model itself is not changed.
"""

from __future__ import annotations

from ..config import ArgumentError, check_int
from .sft import IGNORE, PAD

__all__ = ["DocumentAttention", "document_mask", "pack", "packed_logits"]


def pack(docs, seq_len: int, *, pad_id: int = PAD, target_mask=None) -> dict:
    """Greedy packing of ``docs`` (lists of token ids, in order) into rows of ``seq_len`` tokens: a document
    goes into the current row if it fits, else it starts a new one (none is split; a document longer than
    ``seq_len`` is refused). ``target_mask``: one 0/1 list per document (SFT's loss mask); by default every
    token of a document is a target.

    Returns int lists of shape [rows][seq_len]: ``tokens``; ``doc_ids`` (0, 1, ... in packing order, -1 on
    padding); ``positions`` (0.. within each document, 0 on padding); ``labels`` (the next token of the same
    document where it is a target, else ``IGNORE``); and ``fill``, the fraction of positions holding a token."""
    check_int("seq_len", seq_len, 2)
    masks = target_mask if target_mask is not None else [[1] * len(d) for d in docs]
    rows, row = [], []
    for i, doc in enumerate(docs):
        if not 1 <= len(doc) <= seq_len:
            raise ArgumentError(f"document {i} has {len(doc)} tokens: each must have 1..{seq_len} (seq_len)")
        if len(row) + len(doc) > seq_len:
            rows.append(row)
            row = []
        row += [(i, j, tok, masks[i][j]) for j, tok in enumerate(doc)]
    rows.append(row)
    out = {"tokens": [], "doc_ids": [], "positions": [], "labels": []}
    for row in rows:
        pad = seq_len - len(row)
        out["tokens"].append([tok for _, _, tok, _ in row] + [pad_id] * pad)
        out["doc_ids"].append([d for d, _, _, _ in row] + [-1] * pad)
        out["positions"].append([j for _, j, _, _ in row] + [0] * pad)
        lab = [IGNORE] * seq_len
        for t in range(len(row) - 1):
            (d, _, _, _), (d_next, _, tok_next, m_next) = row[t], row[t + 1]
            if d == d_next and m_next:
                lab[t] = tok_next
        out["labels"].append(lab)
    out["fill"] = sum(len(r) for r in rows) / (len(rows) * seq_len)
    return out


def document_mask(doc_ids):
    """Boolean attention mask [b, s, s] (True = may attend) from ``doc_ids`` [b, s] (a tensor): query t sees key
    u when u <= t and both belong to the same document; a padding position (-1) sees only itself."""
    import torch

    doc_ids = torch.as_tensor(doc_ids)
    s = doc_ids.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (causal & same) | torch.eye(s, dtype=torch.bool)


class DocumentAttention:
    """The attention hook ``Transformer.forward(tokens, cache=hook)`` calls: positions from ``positions`` [b, s];
    attention over the keys ``mask`` allows ([b, s, s], True = may attend; ``document_mask`` or a plain causal
    one). Stores nothing between forwards."""

    def __init__(self, positions, mask):
        import torch

        self.positions, self.mask = torch.as_tensor(positions), torch.as_tensor(mask)

    def begin(self, b: int, s: int):
        if tuple(self.positions.shape) != (b, s):
            raise ArgumentError(f"positions have shape {tuple(self.positions.shape)}, the batch ({b}, {s})")
        return self.positions

    def attend(self, layer_idx: int, q, k, v):
        """q [b, heads, s, d], k and v [b, kv_heads, s, d] -> attention output [b, heads, s, d]."""
        import torch.nn.functional as F

        group = q.shape[1] // k.shape[1]
        if group > 1:  # grouped-query attention: each KV head serves `group` query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:, None].to(q.device))

    def commit(self) -> None:
        pass


def packed_logits(model, tokens, doc_ids, positions, *, mask_documents: bool = True):
    """Logits [b, s, vocab] of ``model`` (a ``Transformer``) on packed rows (tensors [b, s] from ``pack``).
    ``mask_documents=False`` uses the row's plain causal mask: the leak across documents."""
    import torch

    tokens, doc_ids = torch.as_tensor(tokens), torch.as_tensor(doc_ids)
    if mask_documents:
        mask = document_mask(doc_ids)
    else:
        s = tokens.shape[-1]
        mask = torch.ones(s, s, dtype=torch.bool).tril().expand(tokens.shape[0], s, s)
    return model(tokens, cache=DocumentAttention(positions, mask))
