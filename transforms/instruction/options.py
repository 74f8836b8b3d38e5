"""The instruction branch's command-line options and the configuration they fill."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from transforms.core.option_types import boolean, non_negative_int, positive_int
from transforms.core.tokenizer import BUILTIN_TEMPLATES
from transforms.core.vocabulary import INSTRUCTION_FORMATS
from transforms.instruction.chat_template import OVERFLOW_POLICIES
from transforms.instruction.rendering.renderer import SYSTEM_NONE, SYSTEM_TEMPLATE
from transforms.instruction.rendering.values import MaskOptions
from transforms.instruction.schema import ConversationLimits, RecordSchema, load_schemas
from transforms.knowledge.dedup.config import MODES as DEDUP_MODES

GROUP = "instruction branch"


class InstructionOptions(PipelineOptions):
    """Options of the instruction branch."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(GROUP)
        group.add_argument(
            "--seq_len", type=positive_int, default=2048,
            help="Maximum tokens per packed SFT sequence (default 2048).")
        group.add_argument(
            "--chat_template", default=None,
            help="A Jinja chat template that overrides the tokenizer's: a path (local or gs://) or "
            f"a built-in name ({', '.join(BUILTIN_TEMPLATES)}). Its control "
            "markup must be tokens of --tokenizer: another family's template stops the run "
            "before any work (see --template_markup_as_text).")
        group.add_argument(
            "--template_markup_as_text", type=boolean, default=False,
            help="Accept a --chat_template whose control markup (such as <|user|>) --tokenizer "
            "spells as text, as Zephyr-style templates do by design; the markup is then trained "
            "as the text it is (default false: such a template stops the run).")
        group.add_argument(
            "--system_prompt", type=system_prompt, default=SYSTEM_TEMPLATE,
            help="The system message of conversations that have none (their own is always "
            f"kept): '{SYSTEM_TEMPLATE}' (default) renders them as the chat template does, "
            "with the default it writes, if any, as apply_chat_template does (the default "
            "tokenizer's ChatML template, like Qwen2-Instruct's, writes 'You are a helpful "
            f"assistant.'; the other built-in templates write none); '{SYSTEM_NONE}' adds no "
            "system turn, leaving out the template's default too (a template that cannot leave "
            "it out stops the run); any other text is added as their system message.")
        group.add_argument(
            "--assistant_turns", choices=("all", "last"), default="all",
            help="Which assistant turns carry loss: all of them (default) or only the last.")
        group.add_argument(
            "--train_end_of_turn", type=boolean, default=True,
            help="Whether the end-of-turn token after each trained assistant turn carries loss "
            "(default true).")
        group.add_argument(
            "--train_reasoning", type=boolean, default=True,
            help="Whether the reasoning a reply carries (reasoning_content, a <think> block, or "
            "#reasoning=FIELD), where the chat template renders it, carries loss (default true).")
        group.add_argument(
            "--max_segments_per_pack", type=non_negative_int, default=0,
            help="Cap on examples per packed sequence; 0 means no cap (default).")
        group.add_argument(
            "--schema", action="append", default=None, metavar="FORMAT=PATH",
            help="A tensorflow-metadata Schema (.pbtxt, local or gs://) that replaces the "
            f"built-in one of an instruction format ({', '.join(INSTRUCTION_FORMATS)}); repeat "
            "the option or give a comma-separated list.")
        group.add_argument(
            "--max_turns", type=non_negative_int, default=0,
            help="Reject conversations with more messages than this (too_many_turns); 0 means "
            "no limit (default).")
        group.add_argument(
            "--max_chars", type=non_negative_int, default=0,
            help="Reject conversations with more characters of message content than this "
            "(too_many_chars); 0 means no limit (default).")
        group.add_argument(
            "--overflow", choices=OVERFLOW_POLICIES, default="truncate",
            help="Conversations longer than --seq_len: truncate them to the earliest turns that "
            "fit, ending with a complete assistant turn (default), or drop them; either way one "
            "with nothing left to train is filtered as too_long.")
        group.add_argument(
            "--pad_to_seq_len", type=boolean, default=False,
            help="Pad every packed sequence to exactly --seq_len tokens for trainers that need "
            "fixed shapes: the pad run is one more segment of pad tokens with no loss "
            "(default false: no padding).")
        group.add_argument(
            "--write_examples", type=boolean, default=False,
            help="Also write the tokenized, masked examples unpacked to OUTPUT/sft_examples/ "
            "(input_ids, labels, sources; one example per row), for a loader that packs anew "
            "each epoch (default false).")
        group.add_argument(
            "--instruction_dedup", choices=DEDUP_MODES, default="none",
            help="Deduplicate conversations across the run over their normalised text (each "
            "message's role and text content, NFKC, case-folded, spacing collapsed): 'exact', "
            "'near' (MinHash with the --dedup_* settings) or 'none' (default). The copy with "
            "the smallest (input, source, position) survives; with --dedup_against an earlier "
            "run's copy wins.")


def system_prompt(text: str) -> str:
    """``--system_prompt``: a mode or a non-empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected {SYSTEM_TEMPLATE!r}, {SYSTEM_NONE!r} or the text of a system message, got "
            f"{text!r} (for no system turn, give {SYSTEM_NONE!r})")
    return text


def parse_schema_options(values: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``FORMAT=PATH`` values (repeated or comma-separated) as sorted ``(format, path)`` pairs."""
    pairs: dict[str, str] = {}
    for item in (part.strip() for value in values or () for part in value.split(",")):
        if not item:
            continue
        fmt, sep, path = item.partition("=")
        if not sep or not path:
            raise ValueError(f"--schema {item!r}: expected FORMAT=PATH, e.g. alpaca=my.pbtxt")
        if fmt in pairs:
            raise ValueError(f"--schema gives format {fmt!r} twice")
        pairs[fmt] = path
    return tuple(sorted(pairs.items()))


@dataclasses.dataclass(frozen=True)
class InstructionConfig:
    seq_len: int
    chat_template: str | None
    system_prompt: str  # SYSTEM_TEMPLATE, SYSTEM_NONE or a text
    assistant_turns: str
    train_end_of_turn: bool
    max_segments_per_pack: int
    train_reasoning: bool = True
    schemas: tuple[tuple[str, str], ...] = ()  # (format, path) of user schemas
    max_turns: int = 0
    max_chars: int = 0
    overflow: str = "truncate"
    pad_to_seq_len: bool = False
    write_examples: bool = False
    template_markup_as_text: bool = False
    dedup: str = "none"  # --instruction_dedup

    @classmethod
    def from_options(cls, options: PipelineOptions) -> InstructionConfig:
        """Reads the options; a bad or unreadable ``--schema`` is a ValueError here, early."""
        view = options.view_as(InstructionOptions)
        config = cls(seq_len=view.seq_len, chat_template=view.chat_template,
                     system_prompt=view.system_prompt, assistant_turns=view.assistant_turns,
                     train_end_of_turn=view.train_end_of_turn,
                     train_reasoning=view.train_reasoning,
                     max_segments_per_pack=view.max_segments_per_pack,
                     schemas=parse_schema_options(view.schema), max_turns=view.max_turns,
                     max_chars=view.max_chars, overflow=view.overflow,
                     pad_to_seq_len=view.pad_to_seq_len,
                     write_examples=view.write_examples,
                     template_markup_as_text=view.template_markup_as_text,
                     dedup=view.instruction_dedup)
        config.load_schemas()
        return config

    def load_schemas(self) -> dict[str, RecordSchema]:
        return load_schemas(dict(self.schemas))

    @property
    def mask_options(self) -> MaskOptions:
        return MaskOptions(last_turn_only=self.assistant_turns == "last",
                           train_end_of_turn=self.train_end_of_turn,
                           train_reasoning=self.train_reasoning)

    @property
    def limits(self) -> ConversationLimits:
        return ConversationLimits(max_turns=self.max_turns, max_chars=self.max_chars)
