"""The offline Qwen2 tokenizer: ids, control tokens, chat template, caching, loading, identity."""

import csv
import hashlib
import itertools
import json
import os
import unicodedata
from pathlib import Path

import huggingface_hub.constants
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from tests.conftest import ROOT, require_shared_data
from transforms.core import tokenizer as tk

require_shared_data()

SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="module")
def tok():
    return tk.load_tokenizer()


def _ids(tokenizer, text, **kwargs):
    return tokenizer(text, **{"add_special_tokens": False, **kwargs})["input_ids"]


def test_hello_world_matches_qwen2(tok):
    assert _ids(tok, "Hello, world!") == [9707, 11, 1879, 0]


def test_control_tokens_have_qwen2_ids(tok):
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151643,
        151644,
        151645,
    ]
    assert len(tok) == 151646
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (tok.pad_token, tok.bos_token_id) == ("<|endoftext|>", None)
    assert _ids(tok, "hi", add_special_tokens=True) == _ids(tok, "hi")  # no BOS, no EOS


def test_split_special_tokens_keeps_literal_markup_as_text(tok):
    text = "a web page quoting <|im_start|>system"
    assert 151644 in _ids(tok, text)
    split = _ids(tok, text, split_special_tokens=True)
    assert not set(split) & {151643, 151644, 151645}
    assert tok.decode(split) == text


@pytest.mark.parametrize(
    "text",
    [
        "秦川雄帝宅，函谷壯皇居。綺殿千尋起，離宮百雉餘。",  # noqa: RUF001 (real punctuation)
        "机器学习是人工智能的一个分支。",
        "12시 땡! 하루가 또 가네요. 위로해 드립니다.",
        "mixed 한국어 and 中文 with emoji 🙂 and tabs\tand\nnewlines",
    ],
)
def test_multilingual_text_round_trips(tok, text):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert tok.decode(enc["input_ids"]) == text
    assert enc["offset_mapping"][-1][1] == len(text)


def test_shared_multilingual_data_round_trips(tok):
    poems = json.loads(
        (SHARED_DATA / "multilingual" / "zh_quantangshi_poet.tang.0.json").read_text()
    )
    with open(SHARED_DATA / "multilingual" / "ko_chatbot_data.csv", encoding="utf-8") as f:
        chats = [row["Q"] + "\n" + row["A"] for row in itertools.islice(csv.DictReader(f), 100)]
    texts = ["\n".join(p["paragraphs"]) for p in poems[:100]] + chats
    for text in texts:
        assert tok.decode(_ids(tok, text, split_special_tokens=True)) == text


def test_nfc_normalizer_unifies_composed_and_decomposed_text(tok):
    assert _ids(tok, "cafe\u0301") == _ids(tok, "caf\u00e9")


def test_chat_template_renders_chatml(tok):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert tok.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )
    ids = tok.apply_chat_template(messages, tokenize=True)["input_ids"]
    assert ids[0] == 151644 and ids[-2:] == [151645, 198]  # 198 is "\n"


def test_chat_template_adds_qwen2_default_system_and_generation_prompt(tok):
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_renders_tools_like_qwen25(tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Seoul?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"c": 1}'}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"c": 2}}},
            ],
        },
        {"role": "tool", "content": "3C"},
        {"role": "tool", "content": "4C"},
        {"role": "assistant", "content": "3C and 4C."},
    ]
    assert tok.apply_chat_template(messages, tools=tools, tokenize=False) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Seoul?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"c": 1}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"c": 2}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3C\n</tool_response>\n"
        "<tool_response>\n4C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n3C and 4C.<|im_end|>\n"
    )


def test_build_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_PIPELINE_CACHE", str(tmp_path))
    first = tk.build_default_tokenizer()
    assert first.startswith(str(tmp_path))
    marker = os.path.join(first, tk._COMPLETE_MARKER)
    built_at = os.stat(marker).st_mtime_ns

    def fail(_directory):
        raise AssertionError("rebuilt although a complete build was cached")

    monkeypatch.setattr(tk, "_build_qwen2_into", fail)
    assert tk.build_default_tokenizer() == first
    assert os.stat(marker).st_mtime_ns == built_at
    assert os.listdir(os.path.dirname(first)) == [os.path.basename(first)]  # no temp dirs left
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(first))


def test_materialise_uses_the_copy_of_a_process_that_won_the_race(tmp_path):
    target = str(tmp_path / "tokenizers" / "x")

    def populate_while_another_process_finishes(directory):
        Path(directory, "ours").write_text("ours")
        tk._materialise(target, lambda d: Path(d, "theirs").write_text("theirs"))

    assert tk._materialise(target, populate_while_another_process_finishes) == target
    assert sorted(os.listdir(target)) == [tk._COMPLETE_MARKER, "theirs"]
    assert os.listdir(tmp_path / "tokenizers") == ["x"]


def test_load_from_saved_directory(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = tk.load_tokenizer(str(tmp_path))
    assert loaded is not tok and loaded is tk.load_tokenizer(str(tmp_path))
    assert _ids(loaded, "Hello, world!") == [9707, 11, 1879, 0]
    own, other = tk.tokenizer_identity(tok), tk.tokenizer_identity(loaded)
    assert other.pop("name") == str(tmp_path)
    assert own.pop("name") == tk.DEFAULT_TOKENIZER
    assert own == other


def test_remote_directory_is_copied_once(tok, tmp_path):
    source = tmp_path / "bucket" / "qwen"
    tok.save_pretrained(source)
    cache_root = str(tmp_path / "cache")
    local = tk.fetch_remote_dir(str(source) + "/", cache_root)
    assert local.startswith(cache_root)
    for name in os.listdir(source):
        assert Path(local, name).read_bytes() == (source / name).read_bytes()
    assert tk.fetch_remote_dir(str(source), cache_root) == local
    (source / "tokenizer_config.json").write_text("{}")  # a re-upload is fetched again
    assert tk.fetch_remote_dir(str(source), cache_root) != local


def test_chat_template_override_and_identity(tok, tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", encoding="utf-8"
    )
    custom = tk.load_tokenizer(None, str(template))
    rendered = custom.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "user: hi\n"
    assert tok.chat_template == tk.CHATML_TEMPLATE  # the shared default is untouched

    base, changed = tk.tokenizer_identity(tok), tk.tokenizer_identity(custom)
    assert changed["chat_template_sha256"] != base["chat_template_sha256"]
    assert changed["vocab_sha256"] == base["vocab_sha256"]


def test_vocab_digest_is_that_of_the_sorted_vocab_as_json(tok):
    """The digest's definition, computed the plain way; the vocabulary holds quotes,
    backslashes and non-ASCII tokens, which the fast path must escape exactly alike."""
    vocab = tok.get_vocab()
    assert {'"', "\\"} <= set(vocab) and any(not token.isascii() for token in vocab)
    plain = json.dumps(sorted(vocab.items()), ensure_ascii=False, separators=(",", ":"))
    expected = hashlib.sha256(plain.encode("utf-8")).hexdigest()
    assert tk.tokenizer_identity(tok)["vocab_sha256"] == expected


def test_identity_is_stable_across_loads(tok, monkeypatch):
    first = tk.tokenizer_identity(tok)
    monkeypatch.setattr(tk, "_cache", {})
    reloaded = tk.load_tokenizer()
    assert reloaded is not tok
    assert tk.tokenizer_identity(reloaded) == first
    assert first == {
        "name": "qwen2-offline",
        "vocab_size": 151646,
        "vocab_sha256": first["vocab_sha256"],
        "chat_template_sha256": first["chat_template_sha256"],
        "eos_token": "<|im_end|>",
        "eos_token_id": 151645,
        "bos_token_id": None,
        "end_of_text_id": 151643,
    }


def test_end_of_text_id_falls_back_to_eos():
    backend = Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    with_eos = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    assert tk.end_of_text_id(with_eos) == 1
    with pytest.raises(ValueError, match="no end-of-text or eos"):
        tk.end_of_text_id(PreTrainedTokenizerFast(tokenizer_object=backend))


def test_bad_local_paths_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        tk.load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="none of the tokenizer files"):
        tk.load_tokenizer(str(tmp_path))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="does not exist"):
        tk.load_tokenizer(str(tmp_path / "file.txt"))


def test_unreachable_hub_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="could not load tokenizer 'no-such-org/no-such-model'"):
        tk.load_tokenizer("no-such-org/no-such-model")


def _pretrain_lines(name, limit=200):
    with open(SHARED_DATA / "pretrain" / name, encoding="utf-8") as f:
        lines = [line for line in itertools.islice(f, limit) if line.strip()]
    return [json.loads(line)["text"] for line in lines] if name.endswith(".jsonl") else lines


def test_ids_agree_with_tiktoken_on_real_text(tok):
    tiktoken = pytest.importorskip("tiktoken")
    encoding = tiktoken.Encoding(
        "qwen", pat_str=tk.QWEN2_PATTERN, mergeable_ranks=tk._read_qwen_ranks(), special_tokens={}
    )
    texts = _pretrain_lines("llamafactory_c4_demo.jsonl") + _pretrain_lines("wikitext2_test.txt")
    texts += _pretrain_lines("tinyshakespeare.txt")
    assert len(texts) > 400
    ours = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    theirs = encoding.encode_ordinary_batch([unicodedata.normalize("NFC", t) for t in texts])
    assert ours == theirs


def test_the_default_loads_as_auto_tokenizer_loads_it(tok):
    """Constructed directly from the built files: the same tokenizer as AutoTokenizer's."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tk.build_default_tokenizer())
    auto.name_or_path = tok.name_or_path
    assert type(auto) is type(tok)
    assert tk.tokenizer_identity(auto) == tk.tokenizer_identity(tok)
    assert auto.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert auto.special_tokens_map == tok.special_tokens_map
    assert auto.added_tokens_decoder == tok.added_tokens_decoder
    assert (auto.model_max_length, auto.padding_side, auto.truncation_side) == (
        tok.model_max_length, tok.padding_side, tok.truncation_side)
    assert auto.clean_up_tokenization_spaces == tok.clean_up_tokenization_spaces
    texts = ["Hello, world!", "<|im_start|>x<|im_end|>", "机器学习 🙂 cafe\u0301"]
    for kwargs in ({}, {"split_special_tokens": True}, {"return_offsets_mapping": True}):
        assert auto(texts, **kwargs).data == tok(texts, **kwargs).data
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    assert auto.apply_chat_template(messages, tokenize=True, return_dict=False) == \
        tok.apply_chat_template(messages, tokenize=True, return_dict=False)


def test_loading_the_default_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from transforms.core.tokenizer import load_tokenizer; load_tokenizer(); "
            "import transforms.knowledge.branch, transforms.instruction.branch; "
            "print('torch' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=ROOT)
    assert found.stdout.strip() == "False"


def test_a_chat_template_shares_the_loaded_backend(tok, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    custom = tk.load_tokenizer(None, str(template))
    assert custom is not tok and custom.backend_tokenizer is tok.backend_tokenizer
    assert tk.load_tokenizer(None, str(template)) is custom
    assert custom.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    assert tok.chat_template == tk.CHATML_TEMPLATE
