"""What a ``--quality_model`` costs on the CPU: documents per second per core, memory per copy,
and a whole pipeline run with and without one, so that scoring a corpus can be priced before
it is run.

Three models are built in a temporary folder (``--workdir`` keeps and reuses them) from the
bench corpus's knowledge documents (``bench.corpus.base_documents``), nothing downloaded: a
fastText supervised classifier of a realistic size (dim 100, wordNgrams 2, bucket 200000,
labels hq/cc, trained by the real fastText library in a subprocess), a BERT-base-sized
regression classifier (``BertConfig`` defaults, as FineWeb-Edu's classifier, randomly
initialised, with a WordPiece tokenizer trained on the corpus, 512 tokens) and the tests' tiny
BERT (``tests.support.score_models.save_tiny_bert``).

1. Speed, in one process pinned to one core with one thread everywhere: our wrappers
   (``FastTextScores.score``, ``HfScores.score``, batched by length as the pipeline does) and
   the libraries' own loops over the same documents (fasttext-predict's ``predict(text, k=-1)``
   per document; a transformers forward pass per document, ``truncation=True``), with the
   pipeline's tokenizer (``raw_text_encoder``) as the familiar reference point.
2. Memory: the resident size loading each model adds to a fresh process (``/proc/self/status``),
   which is the cost of one copy per process.
3. End to end: wall time and peak resident memory of the whole ``python -m beam_pipeline``
   process tree on the documents, without a model, with the fastText one (also declared for
   the knowledge branch alone: the same memory, as a model both branches use is loaded once per
   process) and with the tiny BERT; and the fastText one with two DirectRunner worker
   processes, with and without ``share=true`` (one copy per process vs one per machine).

    .venv/bin/python -m bench.bench_scores [--quick] [--repeats 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import proc

ROOT = Path(__file__).resolve().parents[1]
FASTTEXT_TRAINER = ROOT / ".venv" / "fasttext-trainer"  # tests.support.score_models's
MB = 1024 * 1024
FULL_DOCS, QUICK_DOCS = None, 300  # documents for the fast models and the pipeline (None: all)
FULL_BASE_DOCS, QUICK_BASE_DOCS = 48, 8  # BERT-base reads this even sample
BASE_REPEATS = 1  # BERT-base is timed once (after a warm-up document): it is slow and steady
TOKENS_PER_DOC = 600  # for the cost lines: 1 T tokens in documents of this many tokens
TOKENS_TOTAL = 10**12
WORKERS = 2
HQ, CC = "hq", "cc"
_SENTENCE_END = re.compile(r"[.!?\"')\]]$")
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                 "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _say(text: str) -> None:
    print(f"[bench] {text}", flush=True)


def best_of(repeats: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeats`` runs, in seconds, and what the last run returned."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return min(times), result


def spread(items: Sequence[str], count: int | None) -> list[str]:
    """An evenly spread ``count`` of ``items``, in order (all of them for None)."""
    if count is None or count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def memory_mb() -> dict[str, float]:
    """This process's resident set now (VmRSS; RssAnon its private memory, RssFile the pages
    mapped from files, which processes on a machine share through the page cache) and at its
    peak so far (VmHWM), in MB."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024  # kB
    return found


def mb(value: float) -> str:
    return f"{value:,.1f} MB" if abs(value) < 10 else f"{value:,.0f} MB"


def size_mb(path: Path) -> float:
    """A file's size, or a folder's files' together, in MB."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / MB


# --------------------------------------------------------------------------- the models


_TRAIN = """
import sys, fasttext
assert hasattr(fasttext, "train_supervised"), fasttext.__file__
folder, threads = sys.argv[1], int(sys.argv[2])
model = fasttext.train_supervised(input=folder + "/train.txt", dim=100, wordNgrams=2,
                                  bucket=200000, epoch=5, lr=0.1, minCount=1, thread=threads,
                                  seed=1, verbose=0)
model.save_model(folder + "/fasttext.bin")
"""


def fasttext_label(line: str) -> str:
    """A crude label, good enough for timing: long lines that end a sentence are "hq"."""
    return HQ if len(line.split()) >= 20 and _SENTENCE_END.search(line) else CC


def train_fasttext(folder: Path, documents: Sequence[str]) -> Path:
    """A supervised fastText model (dim 100, word bigrams, 200,000 buckets) trained by the real
    library on the documents' lines; the trainer shares the module name ``fasttext`` with the
    venv's fasttext-predict, so it runs in a subprocess with its folder first on the path."""
    if not (FASTTEXT_TRAINER / "fasttext").is_dir():
        raise FileNotFoundError(f"{FASTTEXT_TRAINER} is missing: run `make setup`")
    lines = [line.strip() for doc in documents for line in doc.split("\n") if line.strip()]
    (folder / "train.txt").write_text(
        "".join(f"__label__{fasttext_label(line)} {line}\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(FASTTEXT_TRAINER), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _TRAIN, str(folder), str(os.cpu_count() or 1)],
                          env=env, cwd=folder, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"fastText training failed ({done.returncode}):\n{done.stderr}")
    (folder / "train.txt").unlink()
    return folder / "fasttext.bin"


def save_bert_base(folder: Path, documents: Sequence[str]) -> Path:
    """A randomly initialised BERT-base regression classifier (``BertConfig`` defaults: 768
    hidden, 12 layers, 12 heads, 512 positions; one output, as FineWeb-Edu's) and a WordPiece
    tokenizer of BERT's vocabulary size trained on the documents, ``model_max_length=512``."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    defaults = BertConfig()
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(list(documents), trainers.WordPieceTrainer(
        vocab_size=defaults.vocab_size, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tokenizer = BertTokenizerFast(vocab=wordpiece.get_vocab(),
                                  model_max_length=defaults.max_position_embeddings)
    config = BertConfig(vocab_size=len(tokenizer), num_labels=1, problem_type="regression",
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@dataclasses.dataclass(frozen=True)
class Models:
    fasttext: Path
    bert_base: Path
    tiny: Path


def build_models(folder: Path, documents: Sequence[str]) -> tuple[Models, dict[str, float]]:
    """The three models (kept if ``folder`` already holds them) and the seconds each took."""
    from tests.support.score_models import save_tiny_bert

    folder.mkdir(parents=True, exist_ok=True)
    models = Models(folder / "fasttext.bin", folder / "bert-base", folder / "tiny-bert")
    builds = {"fasttext": (models.fasttext, lambda: train_fasttext(folder, documents)),
              "bert_base": (models.bert_base, lambda: save_bert_base(models.bert_base, documents)),
              "tiny": (models.tiny, lambda: save_tiny_bert(models.tiny, num_labels=1))}
    seconds = {}
    for name, (path, build) in builds.items():
        if path.exists():
            continue
        _say(f"building {name} ...")
        start = time.perf_counter()
        build()
        seconds[name] = time.perf_counter() - start
    return models, seconds


# --------------------------------------------------------------------------- speed (child)


def _check_same(what: str, ours: Any, reference: Sequence[float], tolerance: float) -> float:
    """The largest difference between our scores and the library's; raises past ``tolerance``
    (a wrong score would make its speed meaningless)."""
    worst = max((abs(float(a) - float(b)) for a, b in zip(ours, reference, strict=True)),
                default=0.0)
    if worst > tolerance:
        raise RuntimeError(f"{what}: our scores differ from the library's by {worst:.3g}")
    return worst


def speed_child(spec: dict) -> dict:
    """Docs per second on one core: ours and the library's own loop, per model."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    import numpy as np
    import torch

    from transforms.core.tokenizer import DEFAULT_TOKENIZER
    from transforms.curation.score_models import FastTextScores, HfScores
    from transforms.knowledge.encoding import raw_text_encoder

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    texts = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    base_texts = spread(texts, spec["base_docs"])
    repeats = spec["repeats"]
    out: dict[str, Any] = {"cpu": cpu}
    wall, cpu_s = time.perf_counter(), time.process_time()

    encoder = raw_text_encoder(DEFAULT_TOKENIZER)
    seconds, ids = best_of(repeats, lambda: encoder.encode(texts, parallel=False))
    out["tokenizer"] = {"docs": len(texts), "ours_s": seconds,
                        "mean_tokens": float(np.mean([len(i) for i in ids]))}
    _say(f"  tokenizer: {len(texts) / seconds:,.0f} docs/s")

    words = FastTextScores(spec["fasttext"], HQ)
    label = words.label

    def fasttext_reference() -> list[float]:
        scores = []
        for text in texts:
            labels, probabilities = words.model.predict(text.replace("\n", " "), k=-1)
            scores.append(dict(zip(labels, probabilities, strict=True)).get(label, 0.0))
        return scores

    ours_s, ours = best_of(repeats, lambda: words.score(texts))
    reference_s, reference = best_of(repeats, fasttext_reference)
    out["fasttext"] = {"docs": len(texts), "ours_s": ours_s, "reference_s": reference_s,
                       "mean_tokens": float(np.mean([len(t.split()) for t in texts])),
                       "max_difference": _check_same("fastText", ours, reference, 1e-6)}
    _say(f"  fastText: {len(texts) / ours_s:,.0f} docs/s ours, "
         f"{len(texts) / reference_s:,.0f} the library's loop")

    for name, sample, times in (("tiny", texts, repeats), ("bert_base", base_texts, BASE_REPEATS)):
        scorer = HfScores(spec[name], None)

        def hf_reference(sample: list[str] = sample, scorer: HfScores = scorer) -> list[float]:
            scores = []
            with torch.no_grad():
                for text in sample:
                    encoded = scorer.tokenizer(text, truncation=True, return_tensors="pt")
                    scores.append(float(scorer.model(**encoded).logits[0, 0]))
            return scores

        read = [len(row) for row in scorer.tokenizer(sample, truncation=True,
                                                     max_length=scorer.max_length)["input_ids"]]
        scorer.score(sample[:1])  # warm-up: first calls allocate and pick kernels
        hf_reference(sample[:1])
        ours_s, ours = best_of(times, lambda sample=sample, scorer=scorer: scorer.score(sample))
        reference_s, reference = best_of(times, hf_reference)
        out[name] = {"docs": len(sample), "ours_s": ours_s, "reference_s": reference_s,
                     "mean_tokens": float(np.mean(read)), "max_tokens": scorer.max_length,
                     "max_difference": _check_same(name, ours, reference, 1e-3)}
        _say(f"  {name}: {len(sample) / ours_s:,.1f} docs/s ours, "
             f"{len(sample) / reference_s:,.1f} one document at a time")
    # Under 1 when another process shared the core: every figure above is slowed as much.
    out["core_share"] = (time.process_time() - cpu_s) / (time.perf_counter() - wall)
    return out


# --------------------------------------------------------------------------- memory (child)


def memory_child(spec: dict) -> dict:
    """What one process's resident set gains, step by step: the library that serves the model
    (Beam's ``RunInference``, whose model manager imports torch when it is installed, and
    fasttext-predict or torch with the model's class), the model loaded and warm (one short
    document scored, so that weights mapped from the file are read in), and its peak while
    scoring ``spec["texts"]`` in one call. The baseline is what the pipeline's process
    imports anyway (Beam, transformers)."""
    steps = {"start": memory_mb()}
    import apache_beam
    import transformers

    del apache_beam, transformers
    steps["pipeline_imports"] = memory_mb()
    import apache_beam.ml.inference.base  # noqa: F401

    from transforms.curation.score_models import FastTextScores, HfScores

    if spec["kind"] == "fasttext":
        import fasttext  # noqa: F401
    else:
        from transformers import AutoConfig, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(spec["path"])
        AutoModelForSequenceClassification._model_mapping[type(config)]  # imports its module
    steps["library"] = memory_mb()
    model = (FastTextScores(spec["path"], HQ) if spec["kind"] == "fasttext"
             else HfScores(spec["path"], None))
    steps["loaded"] = memory_mb()
    model.score(["A short document to warm the model up."])
    steps["warm"] = memory_mb()
    texts = json.loads(Path(spec["texts"]).read_text(encoding="utf-8"))
    model.score(texts)
    steps["scored"] = memory_mb()
    library, warm = steps["library"], steps["warm"]
    return {"steps": steps, "texts": len(texts),
            "library_mb": library["VmRSS"] - steps["pipeline_imports"]["VmRSS"],
            "model_mb": warm["VmRSS"] - library["VmRSS"],
            "model_file_mb": warm["RssFile"] - library["RssFile"],
            "load_peak_mb": steps["loaded"]["VmHWM"] - library["VmRSS"],
            "scoring_peak_mb": steps["scored"]["VmHWM"] - library["VmRSS"]}


def child(kind: str, spec: dict, env: dict[str, str], result: Path) -> dict:
    """Runs ``speed_child`` or ``memory_child`` in a fresh interpreter (its progress lines on
    our stdout, its libraries' warnings kept for an error message); returns what it wrote."""
    result.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "bench.bench_scores", "--child", kind,
                           json.dumps({**spec, "result": str(result)})], cwd=ROOT, env=env,
                          text=True, check=False, stderr=subprocess.PIPE)
    if done.returncode:
        raise RuntimeError(f"{kind} child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(result.read_text())


# --------------------------------------------------------------------------- end to end


@dataclasses.dataclass(frozen=True)
class EndToEnd:
    name: str
    mode: str
    model: str | None  # the --quality_model value
    baseline: str  # the run without a model in the same mode


def end_to_end_runs(models: Models) -> list[EndToEnd]:
    fasttext = f"ft=fasttext:{models.fasttext}#label={HQ}"
    return [
        EndToEnd("no model", "in_memory", None, "no model"),
        EndToEnd("fastText", "in_memory", fasttext, "no model"),
        # A model declared for no branch is loaded once per branch in each process (each
        # branch's RunInference holds its own copy), even for a branch without input.
        EndToEnd("fastText, branch=knowledge", "in_memory", fasttext + ";branch=knowledge",
                 "no model"),
        EndToEnd("tiny BERT", "in_memory", f"edu=hf:{models.tiny}", "no model"),
        EndToEnd("no model, 2 workers", "multi_processing", None, "no model, 2 workers"),
        EndToEnd("fastText, 2 workers", "multi_processing", fasttext, "no model, 2 workers"),
        EndToEnd("fastText, 2 workers, share=true", "multi_processing", fasttext + ";share=true",
                 "no model, 2 workers"),
    ]


def run_pipeline(run: EndToEnd, jsonl: Path, workdir: Path, env: dict[str, str]) -> dict:
    output = workdir / "runs" / re.sub(r"\W+", "-", run.name)
    command = [sys.executable, "-m", "beam_pipeline", f"--input={jsonl}#branch=knowledge",
               f"--output={output}", "--overwrite=true", "--runner=DirectRunner",
               f"--direct_running_mode={run.mode}"]
    if run.mode == "multi_processing":
        command.append(f"--direct_num_workers={WORKERS}")
    if run.model:
        command.append(f"--quality_model={run.model}")
    _say(f"pipeline: {run.name} ...")
    measured = proc.run(command, env, ROOT, f"pipeline ({run.name})")
    manifest = json.loads((output / "manifest.json").read_text())
    documents = manifest["knowledge"]["documents"]
    scored = None
    if run.model:
        name = run.model.partition("=")[0]
        scored = manifest["quality_scores"]["knowledge"][name]["scored"]
        if not scored:
            raise RuntimeError(f"pipeline ({run.name}): the model scored no document")
    return {"name": run.name, "mode": run.mode, "model": run.model, "documents": documents,
            "scored": scored, "wall_s": measured.wall_s, "cpu_s": measured.cpu_s,
            "peak_rss_mb": measured.peak_rss_mb, "others_cores": measured.others_cores}


# --------------------------------------------------------------------------- report


def cost_lines(rates: dict[str, float]) -> list[str]:
    """Documents per vCPU-hour and vCPU-hours to score 1 T tokens, from docs/s per core."""
    documents = TOKENS_TOTAL / TOKENS_PER_DOC
    lines = [f"Cost of scoring alone, at the measured docs/s per core (one vCPU), for "
             f"{TOKENS_TOTAL / 1e12:g} T tokens in documents of {TOKENS_PER_DOC} tokens "
             f"({documents / 1e9:.2f} B documents):", ""]
    for name, rate in rates.items():
        lines.append(f"- {name}: {rate * 3600:,.0f} documents per vCPU-hour; "
                     f"{documents / (rate * 3600):,.0f} vCPU-hours for the corpus")
    return lines


def report(speed: dict, memory: dict[str, dict], sizes: dict[str, float],
           models: Models, e2e: list[dict]) -> str:
    keys = {"fasttext": "fastText (dim 100, 2-grams, 200k buckets)",
            "bert_base": "BERT-base regression (512 tokens)",
            "tiny": "tiny BERT (32 hidden, 128 tokens)"}
    lines = ["| model | docs/s/core ours | reference | ratio | mean tokens read | "
             "RSS added by the model | file size | + its library | peak while scoring |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rates: dict[str, float] = {}
    for key, label in keys.items():
        s, m = speed[key], memory[key]
        ours, reference = s["docs"] / s["ours_s"], s["docs"] / s["reference_s"]
        rates[label] = ours
        unit = "words" if key == "fasttext" else f"of {s['max_tokens']}"
        lines.append(
            f"| {label}, {s['docs']} docs | {ours:,.1f} | {reference:,.1f} | "
            f"{ours / reference:.2f} | {s['mean_tokens']:,.0f} {unit} | "
            f"{mb(m['model_mb'])} ({mb(m['model_file_mb'])} mapped) | {mb(sizes[key])} | "
            f"{mb(m['library_mb'])} | {mb(m['scoring_peak_mb'])} ({m['texts']} docs) |")
    tokenizer = speed["tokenizer"]
    rate = tokenizer["docs"] / tokenizer["ours_s"]
    rates["tokenizer (reference point)"] = rate
    lines.append(f"| tokenizer (`raw_text_encoder`, reference point), {tokenizer['docs']} docs | "
                 f"{rate:,.1f} | | | {tokenizer['mean_tokens']:,.0f} | | | | |")
    lines += ["", "RSS added by the model: one process's resident set after loading it and scoring "
              "one short document, beyond its library (in brackets, the part mapped from the "
              "model's file, which processes on one machine share through the page cache). "
              "+ its library: Beam's RunInference (its model manager imports torch whenever "
              "torch is installed) and the model's reader, per process, whatever the model. "
              "Peak while scoring: the process's peak beyond its library, scoring the documents "
              "shown in one call, as the pipeline scores a chunk.",
              "", "| pipeline run | mode | documents | wall s | CPU s | peak RSS of the tree | "
              "over the same mode without a model | other processes' cores |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    by_name = {run["name"]: run for run in e2e}
    for run, spec in zip(e2e, end_to_end_runs(models), strict=True):
        extra = run["peak_rss_mb"] - by_name[spec.baseline]["peak_rss_mb"]
        lines.append(f"| {run['name']} | {run['mode']} | {run['documents']:,} | "
                     f"{run['wall_s']:.1f} | {run['cpu_s']:.1f} | {run['peak_rss_mb']:,.0f} MB | "
                     f"{'' if spec.model is None else f'{extra:+,.0f} MB'} | "
                     f"{run['others_cores']:.2f} |")
    lines += ["", "Peak RSS of the tree: the resident sets of the pipeline's process and its "
              f"{WORKERS} worker processes summed at their peak (pages shared between processes "
              "counted in each: an upper bound)."]
    lines += ["", *cost_lines(rates), "",
              f"Bench documents average {tokenizer['mean_tokens']:,.0f} tokens of the default "
              f"tokenizer: fastText and the tokenizer read whole documents, so on "
              f"{TOKENS_PER_DOC}-token documents they cost about "
              f"{TOKENS_PER_DOC / tokenizer['mean_tokens']:.2f}x the above; the BERTs read at most "
              "512 and 128 tokens of a document either way."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_DOCS} documents, {QUICK_BASE_DOCS} for BERT-base")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="keep the models and runs here (reused)")
    parser.add_argument("--child", choices=("speed", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.spec)
        work = speed_child if args.child == "speed" else memory_child
        Path(spec["result"]).write_text(json.dumps(work(spec)))
        return
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        measure(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench_scores-") as tmp:
            measure(args, Path(tmp))


def measure(args: argparse.Namespace, workdir: Path) -> None:
    from bench.corpus import base_documents

    start = time.perf_counter()
    corpus = base_documents()
    texts = spread(corpus, QUICK_DOCS if args.quick else FULL_DOCS)
    base_docs = QUICK_BASE_DOCS if args.quick else FULL_BASE_DOCS
    models, built = build_models(workdir / "models", corpus)
    sizes = {"fasttext": size_mb(models.fasttext), "bert_base": size_mb(models.bert_base),
             "tiny": size_mb(models.tiny)}
    texts_path, base_path = workdir / "texts.json", workdir / "base_texts.json"
    texts_path.write_text(json.dumps(texts), encoding="utf-8")
    base_path.write_text(json.dumps(spread(texts, base_docs)), encoding="utf-8")
    env = {**os.environ, **OFFLINE, "TOKENIZERS_PARALLELISM": "true"}

    _say(f"speed on one core: {len(texts)} documents, {base_docs} for BERT-base ...")
    speed = child("speed", {"texts": str(texts_path), "base_docs": base_docs,
                            "repeats": args.repeats, "fasttext": str(models.fasttext),
                            "bert_base": str(models.bert_base), "tiny": str(models.tiny)},
                  {**env, **SINGLE_THREAD}, workdir / "speed.json")
    memory = {}
    for key, kind, path, sample in (("fasttext", "fasttext", models.fasttext, texts_path),
                                    ("bert_base", "hf", models.bert_base, base_path),
                                    ("tiny", "hf", models.tiny, texts_path)):
        _say(f"memory: {key} in a fresh process ...")
        memory[key] = child("memory", {"kind": kind, "path": str(path), "texts": str(sample)},
                            env, workdir / f"memory-{key}.json")

    jsonl = workdir / "documents.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    e2e = [run_pipeline(run, jsonl, workdir, env) for run in end_to_end_runs(models)]

    print(f"\n{len(texts):,} bench documents ({sum(map(len, texts)) / 1e6:.1f} M characters), "
          f"{base_docs} of them for BERT-base; speed on one core (core {speed['cpu']}, one "
          f"thread, {speed['core_share']:.0%} of it ours), best of {args.repeats} "
          f"({BASE_REPEATS} for BERT-base); reference: the library's own loop, one document at "
          "a time; ratio = ours / reference.\n")
    print(report(speed, memory, sizes, models, e2e))
    print(json.dumps({"bench": "scores", "quick": args.quick, "documents": len(texts),
                      "base_documents": base_docs, "repeats": args.repeats, "speed": speed,
                      "memory": memory, "file_mb": sizes, "build_s": built,
                      "end_to_end": e2e, "total_s": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
