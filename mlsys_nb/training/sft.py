"""The supervised fine-tuning (SFT) data path: records -> a chat template -> tokens, a loss mask, packed rows.

A chat record is a list of messages ``{"role": "system" | "user" | "assistant", "content": str}``; an
instruct record (Alpaca style: ``{"instruction", "input", "output"}``) becomes one user and one assistant
message (``to_messages``). ``format_chat`` renders the messages with the template ::

    <|user|>{content}<|end|><|assistant|>{content}<|end|> ...

where each ``<|role|>`` and ``<|end|>`` is one special token (ids 256..259) and text is UTF-8 bytes (ids
0..255): the byte-level tokenizer of ``encode``. It returns the token ids and a **loss mask**: 1 on the tokens
the model is trained to produce (each assistant message's content and the ``<|end|>`` that closes it), 0 on
the template and on everything the user or system wrote. ``labels(ids, mask)`` turns them into next-token
targets with ``IGNORE`` (-100, what ``F.cross_entropy(ignore_index=-100)`` skips) wherever the target is not a
response token (Ouyang et al. 2022, InstructGPT, trains its SFT model this way).
"""

from __future__ import annotations

from ..config import ArgumentError, check_choice

IGNORE = -100  # the target id F.cross_entropy skips (its default ignore_index)
ROLES = ("system", "user", "assistant")
SPECIAL = {"<|system|>": 256, "<|user|>": 257, "<|assistant|>": 258, "<|end|>": 259, "<|pad|>": 260}
END, PAD = SPECIAL["<|end|>"], SPECIAL["<|pad|>"]
VOCAB = 261  # 256 bytes + 5 special tokens

__all__ = [
    "END",
    "IGNORE",
    "PAD",
    "ROLES",
    "SPECIAL",
    "VOCAB",
    "decode",
    "encode",
    "format_chat",
    "labels",
    "to_messages",
]


def encode(text: str) -> list[int]:
    """Byte-level tokens of ``text``: its UTF-8 bytes, ids 0..255 (no special token can come from text)."""
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Text of token ``ids``; special tokens are written by name (``<|end|>``)."""
    names = {v: k for k, v in SPECIAL.items()}
    out, run = [], bytearray()
    for i in ids:
        i = int(i)
        if i < 256:
            run.append(i)
            continue
        out.append(run.decode("utf-8", errors="replace") + names[i])
        run = bytearray()
    return "".join(out) + run.decode("utf-8", errors="replace")


def to_messages(record: dict) -> list[dict]:
    """A chat record (``{"messages": [...]}``) as is; an instruct record (``instruction``, optional ``input``,
    ``output``) as one user message (instruction, a blank line, input) and one assistant message."""
    if "messages" in record:
        msgs = record["messages"]
    elif "instruction" in record and "output" in record:
        prompt = record["instruction"] + (f"\n\n{record['input']}" if record.get("input") else "")
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
    else:
        raise ArgumentError(f"record must hold 'messages' or 'instruction' and 'output', got keys {sorted(record)}")
    for i, m in enumerate(msgs):
        check_choice(f"messages[{i}].role", m.get("role"), ROLES)
    return msgs


def format_chat(record: dict) -> tuple[list[int], list[int]]:
    """Token ids of ``record`` rendered with the template, and the loss mask (1 = a response token, see the
    module docstring); both lists have one entry per token."""
    ids, mask = [], []
    for m in to_messages(record):
        trained = 1 if m["role"] == "assistant" else 0
        body = encode(m["content"]) + [END]
        ids += [SPECIAL[f"<|{m['role']}|>"]] + body
        mask += [0] + [trained] * len(body)  # the role marker is the prompt's; the reply and its <|end|> are not
    return ids, mask


def labels(ids, mask) -> list[int]:
    """Next-token targets: ``labels[t] = ids[t + 1]`` where ``mask[t + 1]`` is 1, else ``IGNORE``; the last
    position predicts nothing. Feed ``ids`` as inputs and these as targets."""
    if len(ids) != len(mask):
        raise ArgumentError(f"ids and mask must have one entry per token, got {len(ids)} and {len(mask)}")
    return [ids[t + 1] if mask[t + 1] else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
