"""``OUTPUT/tokenizer/``: the tokenizer the run used, chat template included, saved with
``save_pretrained`` so a training job loads it with ``AutoTokenizer.from_pretrained`` instead of
finding ``--tokenizer`` and ``--chat_template`` again (``qwen2-offline`` is this project's name,
not a hub id). Written by the step that writes ``manifest.json``, just before it: with the outputs,
by a worker, and not at all by a dry run; with curriculum phases, into each phase's directory."""

from __future__ import annotations

import os
import tempfile

from apache_beam.io.filesystems import FileSystems

from transforms.core.tokenizer import DEFAULT_TOKENIZER, default_saved_files, load_tokenizer

TOKENIZER_DIR = "tokenizer"


def write_tokenizer(spec: str, chat_template: str | None, output_dir: str) -> list[str]:
    """Saves the tokenizer into ``output_dir/tokenizer/`` (local or any Beam filesystem) and
    returns the names of the files written, for the manifest (an overwrite deletes those).
    The default with its own template is copied from its build, which ``save_pretrained``
    wrote: saving it again re-serialises 18 MB for the same bytes (0.3 s)."""
    if (spec or DEFAULT_TOKENIZER) == DEFAULT_TOKENIZER and chat_template is None:
        directory, names = default_saved_files()
        return _copy(directory, names, output_dir)
    tokenizer = load_tokenizer(spec, chat_template)
    with tempfile.TemporaryDirectory() as local:
        tokenizer.save_pretrained(local)
        return _copy(local, sorted(os.listdir(local)), output_dir)


def _copy(local: str, names: list[str], output_dir: str) -> list[str]:
    target = FileSystems.join(output_dir, TOKENIZER_DIR)
    for name in names:
        with open(os.path.join(local, name), "rb") as source, \
                FileSystems.create(FileSystems.join(target, name)) as handle:
            handle.write(source.read())
    return names
