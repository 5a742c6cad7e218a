"""A token-level radix-tree prefix cache with LRU eviction (SGLang's RadixAttention, Zheng et al., 2023,
arXiv:2312.07104, §3).

Every prompt and generated sequence a server has computed is kept as a path in a tree whose edges
are runs of token ids (a compressed trie: an edge is split when a new sequence diverges inside it).
A new request walks the tree: the matched prefix's K/V already exist and need no prefill. Unlike
hash-chained blocks (``paged.BlockManager``), a match can end at any token, not only at a block
boundary.

This module is an exhibit, not a part of the serving engine: the engine's prefix index is the
hash-chained ``BlockManager``; notebook 14 runs both on the same multi-turn workload.

- ``match_prefix(tokens)`` -> ``(n_matched, node, values)``; marks the path as just used.
- ``insert(tokens, values=None)`` -> tokens that were already present; stores the rest.
- ``lock(node)`` / ``unlock(node)``: a running request pins its path (reference count on every node
  up to the root) so eviction cannot take K/V it is reading.
- ``evict(num_tokens)``: removes least-recently-used *unlocked leaves* until ``num_tokens`` are freed
  (a parent whose last child goes becomes a leaf and a candidate itself).

``values`` (optional) is one payload per token, e.g. the KV-pool slot of that token; it is split and
returned along with the tokens. ``stats`` counts queried and matched tokens (the hit rate).
"""

from __future__ import annotations

import heapq
import itertools

from ..config import check_int

__all__ = ["RadixCache", "RadixNode", "multi_turn_workload"]


class RadixNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, key=(), value=None, parent=None):
        self.children: dict[int, RadixNode] = {}  # first token of the child's edge -> child
        self.key: tuple[int, ...] = tuple(key)  # the edge's tokens (from parent to this node)
        self.value = value  # one payload per token of key, or None
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0

    def __repr__(self):
        return f"RadixNode(key={self.key[:8]}{'...' if len(self.key) > 8 else ''}, lock_ref={self.lock_ref})"


class RadixCache:
    """Prefix cache over token ids; ``capacity_tokens`` (optional) evicts LRU leaves after each insert."""

    def __init__(self, capacity_tokens: int | None = None):
        if capacity_tokens is not None:
            capacity_tokens = check_int("capacity_tokens", capacity_tokens)
        self.capacity = capacity_tokens
        self.root = RadixNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.size = 0  # tokens stored (sum of edge lengths)
        self._clock = itertools.count(1)
        self.stats = {"queries": 0, "query_tokens": 0, "hit_tokens": 0, "evicted_tokens": 0}

    @property
    def hit_rate(self) -> float:
        return self.stats["hit_tokens"] / max(1, self.stats["query_tokens"])

    # ---- walking -------------------------------------------------------------------------------
    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper node (which keeps node's locks)."""
        upper = RadixNode(node.key[:at], None if node.value is None else node.value[:at], node.parent)
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        upper.children[node.key[at]] = node
        node.parent.children[node.key[0]] = upper
        node.key, node.parent = node.key[at:], upper
        if node.value is not None:
            node.value = node.value[at:]
        return upper

    def _walk(self, tokens) -> tuple[int, RadixNode, list]:
        node, i, values, now = self.root, 0, [], next(self._clock)
        while i < len(tokens) and tokens[i] in node.children:
            child = node.children[tokens[i]]
            n = 0
            while n < len(child.key) and i + n < len(tokens) and child.key[n] == tokens[i + n]:
                n += 1
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            if child.value is not None:
                values.extend(child.value)
            node, i = child, i + n
        return i, node, values

    def match_prefix(self, tokens) -> tuple[int, RadixNode, list]:
        """Longest cached prefix of ``tokens``: (its length, the node where it ends, its values)."""
        tokens = tuple(int(t) for t in tokens)
        n, node, values = self._walk(tokens)
        self.stats["queries"] += 1
        self.stats["query_tokens"] += len(tokens)
        self.stats["hit_tokens"] += n
        return n, node, values

    def insert(self, tokens, values=None) -> int:
        """Store ``tokens`` (and one value per token); return how many leading tokens were already stored."""
        tokens = tuple(int(t) for t in tokens)
        if values is not None and len(values) != len(tokens):
            raise ValueError(f"values has {len(values)} entries for {len(tokens)} tokens: need one per token")
        n, node, _ = self._walk(tokens)
        if n < len(tokens):
            leaf = RadixNode(tokens[n:], None if values is None else list(values[n:]), node)
            leaf.last_access = next(self._clock)
            node.children[tokens[n]] = leaf
            self.size += len(tokens) - n
        if self.capacity is not None and self.size > self.capacity:
            self.evict(self.size - self.capacity)
        return n

    # ---- locking and eviction ------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        path = []
        while node is not None:
            path.append(node)
            node = node.parent
        if any(n.lock_ref <= (1 if n is self.root else 0) for n in path):
            raise ValueError(f"unlock of {path[0]!r}, which is not locked (lock_ref would go below 0)")
        for n in path:
            n.lock_ref -= 1

    def _leaves(self):
        stack, out = [self.root], []
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if not n.children and n is not self.root:
                out.append(n)
        return out

    def evict(self, num_tokens: int) -> int:
        """Remove least-recently-used unlocked leaves until ``num_tokens`` are freed; return tokens freed."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            if not parent.children and parent.lock_ref == 0 and parent is not self.root:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.size -= freed
        self.stats["evicted_tokens"] += freed
        return freed

    # ---- checks --------------------------------------------------------------------------------
    def sequences(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token sequence stored."""
        out, stack = [], [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            prefix += node.key
            if not node.children and node is not self.root:
                out.append(prefix)
            stack.extend((c, prefix) for c in node.children.values())
        return out

    def check_invariants(self) -> None:
        """Sizes, child keys, non-empty edges, parent links and lock counts; ``AssertionError`` if broken."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key)
            if node is not self.root:
                assert node.key, f"{node!r}: empty edge"
                assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
                assert node.value is None or len(node.value) == len(node.key), f"{node!r}: values != tokens"
            for first, child in node.children.items():
                assert child.parent is node and child.key[0] == first, f"{child!r}: wrong parent or child key"
                assert node.lock_ref >= child.lock_ref, f"{child!r}: locked more than its parent"
                stack.append(child)
        assert total == self.size, f"size={self.size} but the edges hold {total} tokens"
        assert self.capacity is None or self.size <= self.capacity or self._locked_tokens() >= self.capacity, (
            f"size={self.size} exceeds capacity_tokens={self.capacity} with evictable leaves left"
        )

    def _locked_tokens(self) -> int:
        stack, n = [self.root], 0
        while stack:
            node = stack.pop()
            n += len(node.key) if node.lock_ref > 0 else 0
            stack.extend(node.children.values())
        return n


def multi_turn_workload(
    *,
    n_systems: int = 2,
    conversations: int = 3,
    turns: int = 3,
    system_len: int = 64,
    user_len: int = 16,
    reply_len: int = 24,
    first_id: int = 0,
):
    """Chat requests in arrival order: ``[(conversation, prompt_ids, reply_ids), ...]``.

    ``n_systems`` system prompts, each opening ``conversations`` conversations of ``turns`` turns;
    turn t's prompt is the system prompt + every earlier user message and reply + a new user message.
    Requests arrive turn by turn (all turn-0 requests, then all turn-1 requests, ...). Every message
    gets fresh token ids, so tokens are shared exactly where the structure says (no accidental matches)."""
    ids = itertools.count(first_id)

    def fresh(n):
        return [next(ids) for _ in range(n)]

    history = {}
    for s in range(n_systems):
        system = fresh(system_len)
        for c in range(conversations):
            history[(s, c)] = list(system)
    out = []
    for _t in range(turns):
        for conv, hist in history.items():
            prompt = hist + fresh(user_len)
            reply = fresh(reply_len)
            out.append((conv, prompt, reply))
            history[conv] = prompt + reply
    return out
