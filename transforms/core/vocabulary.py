"""The pipeline's vocabulary, defined once: branches and output kinds, input and instruction
formats, the loss-mask methods, ``IGNORE_INDEX``, and every reason code with its meaning.

Reason codes are part of the output contract: they name each record in ``rejected/`` and
``filtered/`` and count it in ``manifest.json``. ``REASONS`` gives each its kind (``rejected``:
the input is bad; ``filtered``: a policy dropped it) and the one line the README's table is
generated from (``scripts/gen_reason_table.py``). A record that cannot go on raises
``Drop`` with its reason code, wherever the step.
"""

from __future__ import annotations

import dataclasses

KNOWLEDGE = "knowledge"
INSTRUCTION = "instruction"
BRANCHES = (KNOWLEDGE, INSTRUCTION)

# What a dropped record is: bad input, or taken out by a policy.
REJECTED = "rejected"
FILTERED = "filtered"

# Input file formats, and the instruction formats a record is adapted from.
FILE_FORMATS = ("jsonl", "json", "parquet", "text", "csv")
INSTRUCTION_FORMATS = ("messages", "sharegpt", "prompt_response", "alpaca", "transcript")

# How the instruction branch found a conversation's trained spans (docs/masking.md).
PREFIX, FULL_RENDER, GENERATION_MARKERS = "prefix", "full_render", "generation_markers"
SENTINELS = "sentinels"
MASK_METHODS = (PREFIX, FULL_RENDER, SENTINELS, GENERATION_MARKERS)

IGNORE_INDEX = -100  # a label that carries no loss (the Hugging Face convention)


@dataclasses.dataclass(frozen=True)
class Reason:
    kind: str  # REJECTED or FILTERED
    meaning: str  # one line, for the README's table


class Drop(Exception):
    """Why a record leaves the pipeline: a reason code (one of ``REASONS``) and a message.

    The one way every step says so: raised where work cannot go on, returned where a rule
    decides, and kept on a ``Record`` that could not be read. Equal drops compare equal, and a
    drop pickles, so it can travel inside a record between workers.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Drop) and (self.reason, self.message) == (other.reason,
                                                                          other.message)

    def __hash__(self) -> int:
        return hash((self.reason, self.message))


REASONS: dict[str, Reason] = {}


def _reason(code: str, kind: str, meaning: str) -> str:
    REASONS[code] = Reason(kind, meaning)
    return code


# Reading and classifying.
MALFORMED_JSON = _reason("malformed_json", REJECTED, "a line or file that is not valid JSON")
MALFORMED_CSV = _reason("malformed_csv", REJECTED, "a CSV row that does not parse")
INVALID_UTF8 = _reason("invalid_utf8", REJECTED, "bytes that are not UTF-8")
LONE_SURROGATE = _reason("lone_surrogate", REJECTED,
                         "a JSON string escaping half a UTF-16 surrogate pair (`\\ud800`)")
UNREADABLE_FILE = _reason("unreadable_file", REJECTED, "a file that cannot be opened or read")
NOT_AN_OBJECT = _reason("not_an_object", REJECTED, "a JSON value that is not an object")
RECORD_TOO_LARGE = _reason("record_too_large", REJECTED, "a record over `--max_record_mb`")
TOO_DEEPLY_NESTED = _reason("too_deeply_nested", REJECTED, "JSON nested too deeply to read safely")
EMPTY_RECORD = _reason("empty_record", REJECTED, "a record with no content")
UNCLASSIFIABLE = _reason("unclassifiable", REJECTED,
                         "no branch fits the record's shape or its input's declaration")
MISSING_FIELD = _reason("missing_field", REJECTED,
                        "a field the format or a declared mapping needs is absent")
WRONG_TYPE = _reason("wrong_type", REJECTED, "a field of the wrong type")

# Adapting instruction records.
UNKNOWN_FORMAT = _reason("unknown_format", REJECTED, "no instruction format matches the record")
UNKNOWN_ROLE = _reason("unknown_role", REJECTED, "a message role or ShareGPT speaker not known")
BAD_TOOL_CALL = _reason("bad_tool_call", REJECTED,
                        "a tool call without a name or with arguments that are not an object")
BAD_TOOLS = _reason("bad_tools", REJECTED, "tool definitions that are not a list of functions")
EMPTY_CONVERSATION = _reason("empty_conversation", REJECTED, "a conversation with no messages")
DUPLICATE_SYSTEM = _reason("duplicate_system", REJECTED,
                           "both a `system` field and a system message")
DUPLICATE_REASONING = _reason("duplicate_reasoning", REJECTED,
                              "both a reasoning field and a `<think>` block in one reply")

# Validating instruction records (schemas, then the conversation rules).
SCHEMA_MISSING_FEATURE = _reason("schema_missing_feature", REJECTED,
                                 "a field the schema requires is absent or null")
SCHEMA_WRONG_TYPE = _reason("schema_wrong_type", REJECTED, "a value of the wrong schema type")
SCHEMA_VALUE_COUNT = _reason("schema_value_count", REJECTED, "too few or too many values")
SCHEMA_DOMAIN = _reason("schema_domain", REJECTED, "a value outside the schema's domain")
NO_ASSISTANT_TURN = _reason("no_assistant_turn", REJECTED, "no assistant message")
BAD_ROLE_ORDER = _reason("bad_role_order", REJECTED, "roles out of the allowed order")
EMPTY_ASSISTANT_TURN = _reason("empty_assistant_turn", REJECTED,
                               "an assistant message without content or tool calls")
TOO_MANY_TURNS = _reason("too_many_turns", REJECTED, "more messages than `--max_turns`")
TOO_MANY_CHARS = _reason("too_many_chars", REJECTED, "more characters than `--max_chars`")

# Rendering with the chat template and masking.
TEMPLATE_ERROR = _reason("template_error", REJECTED,
                         "the chat template raised, or broke a sandbox limit")
TURN_NOT_LOCATED = _reason("turn_not_located", REJECTED,
                           "the template rewrites a turn in a way no mask method can read off")
TOOLS_NOT_RENDERED = _reason("tools_not_rendered", REJECTED,
                             "the template drops the tool definitions or the tool calls")
CONTROL_TOKEN_TEXT = _reason("control_token_text", REJECTED,
                             "the template alters content that holds control-token text")
NO_TRAINED_TOKENS = _reason("no_trained_tokens", REJECTED, "no token of the example is trained")

# Policies.
TOO_LONG = _reason("too_long", FILTERED, "a conversation over `--seq_len` that cannot be cut")
URL_BLOCKLISTED = _reason("url_blocklisted", FILTERED,
                          "a document whose URL's domain is on `--url_blocklist`")
LANGUAGE_NOT_SELECTED = _reason("language_not_selected", FILTERED,
                                "a document whose language is not one of `--languages`")
LOW_LANGUAGE_SCORE = _reason("low_language_score", FILTERED,
                             "a document in a selected language scored under "
                             "`--min_language_score`")
LOW_QUALITY_SCORE = _reason("low_quality_score", FILTERED,
                            "scored under `--min_quality_score` by a `--quality_model`")
EMPTY_AFTER_NORMALIZATION = _reason("empty_after_normalization", FILTERED,
                                    "a document with no text left after normalisation")
TOO_FEW_WORDS = _reason("too_few_words", FILTERED, "fewer words than `--min_words`")
TOO_MANY_WORDS = _reason("too_many_words", FILTERED, "more words than `--max_words`")
MEAN_WORD_LENGTH = _reason("mean_word_length", FILTERED,
                           "mean word length out of `--min/max_mean_word_length`")
SYMBOL_RATIO = _reason("symbol_ratio", FILTERED, "too many `#` and ellipsis symbols per word")
ELLIPSIS_LINES = _reason("ellipsis_lines", FILTERED, "too many lines ending in an ellipsis")
BULLET_LINES = _reason("bullet_lines", FILTERED, "too many lines starting with a bullet")
LOW_ALPHA = _reason("low_alpha_fraction", FILTERED,
                    "too few letters among the non-space characters")
DUPLICATE_LINES = _reason("duplicate_lines", FILTERED, "too many repeated lines")
DUPLICATE_PARAGRAPHS = _reason("duplicate_paragraphs", FILTERED, "too many repeated paragraphs")
TOP_NGRAM = _reason("repeated_top_ngram", FILTERED, "one n-gram covers too much of the text")
DUPLICATE_NGRAMS = _reason("duplicate_ngrams", FILTERED,
                           "too much of the text in repeated n-grams")
DUPLICATE_EXACT = _reason("duplicate_exact", FILTERED, "an exact copy of a kept document")
DUPLICATE_NEAR = _reason("duplicate_near", FILTERED, "a near copy (MinHash) of a kept document")
DUPLICATE_EARLIER_RUN = _reason("duplicate_earlier_run", FILTERED,
                                "an exact or near copy of a document an earlier run published "
                                "(`--dedup_against`)")
BOILERPLATE_TOO_SHORT = _reason("boilerplate_too_short", FILTERED,
                                "fewer words than `--min_words` once boilerplate shared with "
                                "other documents is removed")
CONTAMINATED = _reason("contaminated", FILTERED, "shares n-grams with an evaluation set")
MIX_UNSELECTED = _reason("mix_unselected", FILTERED, "left out by the mixing weights")
