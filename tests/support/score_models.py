"""Small quality-score models built on the spot from the bundled example data, and the scores
the libraries themselves give, for the model-based quality-score tests: nothing is downloaded.

fastText: the real training library (`fasttext-numpy2-wheel`) lives in its own folder,
`FASTTEXT_TRAINER` (made by `make setup`), because it and `fasttext-predict` in the venv are both
`import fasttext`; it is only ever imported in a subprocess with that folder first on the path.
Hugging Face: a tiny randomly initialised BERT with a WordPiece tokenizer trained here.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "data"
FASTTEXT_TRAINER = ROOT / ".venv" / "fasttext-trainer"

HQ_LABEL = "hq"  # Shakespeare paragraphs, Alpaca outputs, GSM8K answers
CC_LABEL = "cc"  # C4 web documents
HELD_OUT_EVERY = 5  # every 5th text of each class is kept out of fastText's training data


def shakespeare_paragraphs() -> list[str]:
    """The excerpt's blank-line-separated paragraphs, as the pipeline's `text_unit=paragraph`."""
    text = (EXAMPLES / "tinyshakespeare_excerpt.txt").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def c4_documents() -> list[str]:
    lines = (EXAMPLES / "c4_sample.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def instruction_answers() -> list[str]:
    """Alpaca outputs and GSM8K answers: curated, well-formed responses."""
    alpaca = json.loads((EXAMPLES / "alpaca_seed_tasks.json").read_text(encoding="utf-8"))
    gsm8k = (EXAMPLES / "gsm8k_sample.jsonl").read_text(encoding="utf-8").splitlines()
    return [r["output"] for r in alpaca if r.get("output")] + [
        json.loads(line)["answer"] for line in gsm8k if line.strip()
    ]


def labelled_texts() -> dict[str, list[str]]:
    """All bundled texts by fastText label (without the `__label__` prefix)."""
    return {HQ_LABEL: shakespeare_paragraphs() + instruction_answers(), CC_LABEL: c4_documents()}


def held_out_texts() -> dict[str, list[str]]:
    """The texts `train_fasttext` does not train on, by label, to test its predictions."""
    return {label: texts[::HELD_OUT_EVERY] for label, texts in labelled_texts().items()}


def _one_line(text: str) -> str:
    """fastText reads one example a line, so a text's newlines become spaces."""
    return text.replace("\r", " ").replace("\n", " ")


def _run_fasttext(code: str, folder: str, *args: str) -> None:
    """Runs `code` with arguments `folder, *args`, in `folder`, in a fresh interpreter where
    `import fasttext` is the real training library (the trainer folder ahead of the venv's
    fasttext-predict); fails loudly with its stderr."""
    if not (FASTTEXT_TRAINER / "fasttext").is_dir():
        raise FileNotFoundError(f"{FASTTEXT_TRAINER} is missing: run `make setup` (the fastText "
                                "trainer is installed there, apart from fasttext-predict)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(FASTTEXT_TRAINER), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", code, folder, *args], env=env, cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode:
        raise RuntimeError(f"fastText subprocess failed ({done.returncode}):\n{done.stderr}")


_TRAIN = """
import sys, fasttext
assert hasattr(fasttext, "train_supervised"), fasttext.__file__
folder = sys.argv[1]
model = fasttext.train_supervised(input=folder + "/train.txt", dim=16, epoch=5, lr=0.5,
                                  wordNgrams=2, minCount=1, bucket=20000, thread=1, seed=1234,
                                  verbose=0)
model.save_model(folder + "/model.bin")
"""


def train_fasttext(folder: Path) -> Path:
    """Trains a small supervised fastText model (`__label__hq` vs `__label__cc`) on the bundled
    texts less `held_out_texts()`, deterministically (one thread, fixed seed); writes
    `folder/train.txt` and the full (unquantized) `folder/model.bin` and returns the latter."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"__label__{label} {_one_line(text)}"
             for label, texts in labelled_texts().items()
             for i, text in enumerate(texts) if i % HELD_OUT_EVERY]
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _run_fasttext(_TRAIN, str(folder))
    return folder / "model.bin"


_PREDICT = """
import json, sys, fasttext
assert hasattr(fasttext, "train_supervised"), fasttext.__file__
folder, model_path, label = sys.argv[1:4]
model = fasttext.load_model(model_path)
texts = json.load(open(folder + "/texts.json", encoding="utf-8"))
scores = []
for text in texts:
    labels, probs = model.predict(text.replace("\\n", " "), k=-1)
    scores.append(dict(zip(labels, map(float, probs))).get("__label__" + label, 0.0))
json.dump(scores, open(folder + "/scores.json", "w"))
"""


def fasttext_reference(model: Path, texts: list[str], label: str) -> list[float]:
    """The real fastText library's probability of `__label__<label>` for each text (all labels
    asked for, k=-1; 0.0 when absent): what a fasttext-predict-based scorer must reproduce."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
        _run_fasttext(_PREDICT, tmp, str(Path(model).resolve()), label)
        return json.loads((Path(tmp) / "scores.json").read_text(encoding="utf-8"))


def save_tiny_bert(folder: Path, num_labels: int, seed: int = 0) -> Path:
    """Saves a tiny randomly initialised `BertForSequenceClassification` (a regression head when
    `num_labels == 1`) and a WordPiece tokenizer trained on the bundled texts into `folder`, in
    the layout `Auto*.from_pretrained(folder)` loads offline; returns `folder`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0-4, BertTokenizer's order
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    texts = [t for ts in labelled_texts().values() for t in ts]
    # The trainer numbers each "##c" as it meets it in a randomly ordered hash map, and breaks
    # ties between merges by number, so the vocabulary changes from run to run; listing them
    # after the specials numbers them in a fixed order and makes the vocabulary reproducible.
    inner = sorted({"##" + c for text in texts
                    for word, _ in wordpiece.pre_tokenizer.pre_tokenize_str(
                        wordpiece.normalizer.normalize_str(text))
                    for c in word[1:]})
    wordpiece.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=[*specials, *inner], show_progress=False))
    # transformers 5's BertTokenizer(Fast) rebuilds the same BERT normalizer, pre-tokenizer and
    # [CLS] $A [SEP] post-processor around the vocabulary, as it does again when loading it.
    tokenizer = BertTokenizerFast(vocab=wordpiece.get_vocab(), model_max_length=128)

    # initializer_range 0.5, not BERT's 0.02: with that an untrained model scores every text
    # alike (to 4 digits), so a scorer that mixed texts up would still match its reference.
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128, num_labels=num_labels, initializer_range=0.5,
                        pad_token_id=tokenizer.pad_token_id,
                        problem_type="regression" if num_labels == 1 else None)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def hf_reference(folder: Path, texts: list[str], label_index: int | None) -> list[float]:
    """The plain transformers score of each text on its own (no batching or padding), truncated
    to the model's max length as FineWeb-Edu's classifier is used: the logit of a regression
    head, else the softmax probability of class `label_index` (1 when None); float32."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    regression = model.config.num_labels == 1
    index = 1 if label_index is None else label_index
    scores = []
    with torch.no_grad():
        for text in texts:
            logits = model(**tokenizer(text, return_tensors="pt", truncation=True)).logits[0]
            value = logits[0] if regression else torch.softmax(logits, dim=-1)[index]
            scores.append(float(value.to(torch.float32)))
    return scores
