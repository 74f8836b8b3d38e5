"""Cost per example of each loss-mask method, on the same conversations and tokenizer.

The real Qwen3 tokenizer (``../shared/tokenizers/qwen3``) encodes the shared multi-turn chat and
tool-call conversations three ways, each timed as the best of ``--repeats`` runs:

* ``full_render``: Qwen3's stock template, which rewrites history, so multi-turn conversations
  are located in the full rendering;
* ``prefix``: TRL's ``qwen3_training.jinja`` with its ``{% generation %}`` tags removed, a
  prefix-stable template of the same family and length: the reference;
* ``generation_markers``: the same TRL template with its tags;
* ``sentinels``: the general method alone (``MaskOptions(sentinels_only=True)``) on the stock
  template and on the prefix-stable one; by default it runs only where locating turn by turn
  fails (GPT-OSS's harmony).

    .venv/bin/python -m bench.bench_masks [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import time
from pathlib import Path

import trl
from transformers import AutoTokenizer

from transforms.core.vocabulary import (
    Drop,
)
from transforms.instruction.adapters import (
    Conversation,
    to_conversation,
)
from transforms.instruction.chat_template import encode_conversations
from transforms.instruction.rendering.values import EncodedExample, MaskOptions

SHARED = Path(__file__).resolve().parents[2] / "shared"
FILES = ("chat/fastchat_dummy_conversation.json", "chat/kto_en_demo_messages.json",
         "chat/glaive_toolcall_en_demo.json", "chat/glaive_toolcall_zh_demo.json")
TAGS = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")


def conversations() -> list[Conversation]:
    found = []
    for relative in FILES:
        for row in json.loads((SHARED / "data" / relative).read_text(encoding="utf-8")):
            with contextlib.suppress(Drop):  # the few the adapters reject
                found.append(to_conversation(row))
    return found


def timed(tok, chats: list[Conversation], repeats: int, options: MaskOptions
          ) -> tuple[float, collections.Counter]:
    best, methods = float("inf"), collections.Counter()
    for _ in range(repeats):
        start = time.perf_counter()
        results = encode_conversations(tok, chats, options)
        best = min(best, time.perf_counter() - start)
        methods = collections.Counter(r.mask_method if isinstance(r, EncodedExample) else r.reason
                                      for r in results)
    return best, methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    stock = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / "qwen3")
    training = (Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja").read_text()
    chats = conversations()
    rows = []
    general = MaskOptions(sentinels_only=True)
    for label, template, options in (
            ("prefix (reference)", TAGS.sub("", training), MaskOptions()),
            ("full_render (stock Qwen3)", stock.chat_template, MaskOptions()),
            ("generation_markers", training, MaskOptions()),
            ("sentinels (stock Qwen3)", stock.chat_template, general),
            ("sentinels (prefix-stable template)", TAGS.sub("", training), general)):
        tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / "qwen3")
        tok.chat_template = template
        seconds, methods = timed(tok, chats, args.repeats, options)
        rows.append((label, seconds, methods))
    reference = rows[0][1]
    print(f"{len(chats)} conversations, Qwen3 tokenizer, best of {args.repeats}\n")
    print("| method | us per conversation | x the prefix method | conversations by method |")
    print("|---|---|---|---|")
    for label, seconds, methods in rows:
        print(f"| {label} | {seconds / len(chats) * 1e6:,.0f} | {seconds / reference:.2f} | "
              f"{dict(sorted(methods.items()))} |")


if __name__ == "__main__":
    main()
