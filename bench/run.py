"""``make bench``: the pipeline against the tokenizer's own speed and the tools users would pick.

Everything is measured in one run on the same cores, each approach in its own process, on the
same files built by ``bench.corpus`` from ``../shared/data``:

1. the ceiling: the Hugging Face fast tokenizer's batch encoding of the knowledge documents
   (with ``encode_batch_fast`` and tiktoken on the same ranks for reference);
2. the seed design's pretraining route: ``datasets`` streaming, batched map, ``run_clm`` grouping;
3. our knowledge branch, ``python -m beam_pipeline``, DirectRunner ``in_memory`` and
   ``multi_processing`` with 2 workers;
4. TRL's SFT preparation and ``pack_dataset(..., "bfd")`` on the instruction examples;
5. our instruction branch, both modes;
6. our peak memory at a quarter of those inputs (1x; the runs above are 4x);
7. our start-up (a run of each branch on a handful of records; a run on the 4-line
   ``broken_lines.jsonl`` against importing the entry point alone) and ``make demo``;
8. the cost of each extra ``--output_format`` beside the Parquet-only run, at 1x;
9. the training side: the load matrix (``bench.bench_load_matrix``) and one dataloader worker's
   per-epoch packing (``bench.bench_loader --epoch-packing``), appended to the report.

Each output is checked (``bench.checks``) as soon as it exists; a wrong output stops the run
before any speed is reported. Our times are whole-process wall times, start-up included; the
peers' are the work alone (imports and loading excluded), which favours them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench import checks, corpus, proc
from bench.report import Row, Target, render, write_section
from transforms.io.formats import EXTRA_FORMATS, PARQUET

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "data" / "templates"
CHAT_TEMPLATE = TEMPLATES / "chatml.jinja"  # the pipeline's mask needs no markers
MARKED_TEMPLATE = TEMPLATES / "chatml.generation.jinja"  # the same, marked for TRL's mask
# Copies of the knowledge documents and of the instruction examples: about two minutes per
# run of ours, where the start-up (8 s in_memory; 12 to 13 s multi_processing, mostly two
# worker processes importing and loading) is under 10% of every run.
FULL_SCALE = (40.0, 80.0)
QUICK_SCALE = (0.5, 0.25)
MEMORY_FACTOR = 4  # the main runs are "4x"; the memory baseline runs a quarter of their input
STARTUP_SCALE = 0.001  # a handful of records: what a run costs before any data
STARTUP_TRIES = 2  # the fastest of these is the start-up (it is short, so noise weighs more)
MODES = ("in_memory", "multi_processing")
WORKERS = 2
BLOCK_SIZE = SEQ_LEN = 2048
# Issue #35's targets: the knowledge branch with every default step on against the tokenizer
# alone, TRL, the seed's datasets route, and a 4-line run against importing the entry point.
GOALS = {"ceiling": 1.2, "tiktoken": 0.5, "datasets": 1.5, "trl": 4.0, "packing": 0.99,
         "memory": 1.5, "demo_s": 15.0, "startup": 0.10, "four_lines": 1.7}
FOUR_LINES = ROOT / "examples" / "data" / "broken_lines.jsonl"
ENTRY_POINT = "beam_pipeline.cli"  # what ``python -m beam_pipeline`` imports first


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of our pipeline: its manifest, where it wrote, and what it cost."""

    manifest: dict
    output: str
    measured: proc.Measured


class Bench:
    """Runs each measurement in its own process with the same environment."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = {**os.environ, "TOKENIZERS_PARALLELISM": "true", "HF_HUB_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1"}

    def _say(self, text: str) -> None:
        print(f"[bench] {text}", flush=True)

    def peer(self, peer: str, files: Sequence[str], *extra: str) -> tuple[dict, proc.Measured]:
        out = self.workdir / "peers"
        self._say(f"{peer} on {len(files)} files ...")
        measured = proc.run([sys.executable, "-m", "bench.peers", peer, "--out", str(out),
                             *extra, *files], self.env, ROOT, peer)
        return json.loads((out / f"{peer}.json").read_text()), measured

    def ours(self, name: str, inputs: Sequence[str], mode: str, *extra: str) -> Run:
        output = str(self.workdir / "runs" / name)
        self._say(f"ours: {name} ...")
        command = [sys.executable, "-m", "beam_pipeline", *(f"--input={i}" for i in inputs),
                   f"--output={output}", "--overwrite=true", "--runner=DirectRunner",
                   f"--direct_running_mode={mode}", *extra]
        if mode == "multi_processing":
            command.append(f"--direct_num_workers={WORKERS}")
        measured = proc.run(command, self.env, ROOT, f"our pipeline ({name})")
        manifest = json.loads((Path(output) / "manifest.json").read_text())
        return Run(manifest, output, measured)

    def four_lines(self) -> tuple[proc.Measured, proc.Measured]:
        """The fastest of a few in_memory runs on the 4-line input, and of a few imports of
        the entry point alone (the same interpreter start and imports, no run)."""
        runs = [self.ours(f"four-lines-{attempt}", [str(FOUR_LINES)], MODES[0]).measured
                for attempt in range(STARTUP_TRIES + 1)]
        self._say(f"import {ENTRY_POINT} ...")
        imports = [proc.run([sys.executable, "-c", f"import {ENTRY_POINT}"], self.env, ROOT,
                            f"import {ENTRY_POINT}") for _ in range(STARTUP_TRIES + 1)]
        return min(runs, key=lambda m: m.wall_s), min(imports, key=lambda m: m.wall_s)

    def demo(self) -> proc.Measured:
        """``make demo``'s wall time; refuses to time a set-up step along with it."""
        dry_run = proc.run(["make", "--no-print-directory", "--dry-run", "demo"], self.env, ROOT,
                           "make --dry-run demo")
        if "pip install" in dry_run.log:
            raise RuntimeError("make demo would install packages first: run make setup, then "
                               "the benchmark")
        self._say("make demo ...")
        return proc.run(["make", "--no-print-directory", "demo"], self.env, ROOT, "make demo")


def _knowledge_input(inputs: corpus.Inputs) -> list[str]:
    directory = os.path.dirname(os.path.abspath(inputs.files[0]))
    return [f"{directory}/knowledge-*.parquet#branch=knowledge"]


def _instruction_input(inputs: corpus.Inputs) -> list[str]:
    directory = os.path.dirname(os.path.abspath(inputs.files[0]))
    return [f"{directory}/instruction-*.jsonl#branch=instruction"]


def _same_counts(runs: dict[str, Run], section: str, keys: Sequence[str]) -> None:
    """Both runner modes must produce the same output (the pipeline's determinism claim)."""
    first, second = (run.manifest[section] for run in runs.values())
    for key in keys:
        checks.expect_equal(f"{section}.{key}: in_memory vs multi_processing", second[key],
                            first[key])


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The benchmark's data sets at the sizes it runs."""

    knowledge: corpus.Inputs
    instruction: corpus.Inputs
    knowledge_1x: corpus.Inputs
    instruction_1x: corpus.Inputs
    tiny: tuple[corpus.Inputs, corpus.Inputs]

    @classmethod
    def build(cls, data: Path, knowledge_scale: float, instruction_scale: float) -> Inputs:
        def inst(scale: float) -> corpus.Inputs:
            return corpus.instruction(data, scale, SEQ_LEN, CHAT_TEMPLATE)

        return cls(corpus.knowledge(data, knowledge_scale), inst(instruction_scale),
                   corpus.knowledge(data, knowledge_scale / MEMORY_FACTOR),
                   inst(instruction_scale / MEMORY_FACTOR),
                   (corpus.knowledge(data, STARTUP_SCALE), inst(STARTUP_SCALE)))


@dataclasses.dataclass
class Results:
    """Everything one benchmark run measured, each output already checked."""

    ceiling: dict
    ceiling_proc: proc.Measured
    clm: dict
    clm_proc: proc.Measured
    ours_k: dict[str, Run]
    trl: dict
    trl_proc: proc.Measured
    ours_i: dict[str, Run]
    memory_1x: dict[tuple[str, str], Run]
    startup: dict[tuple[str, str], proc.Measured]  # by branch and mode
    four_lines: proc.Measured  # a run on broken_lines.jsonl, in_memory
    entry_import: proc.Measured  # python -c "import beam_pipeline.cli"
    demo: proc.Measured


def measure_knowledge(bench: Bench, inputs: Inputs) -> tuple:
    """The ceiling, the datasets route and ours, each checked against the ceiling."""
    knowledge = inputs.knowledge
    ceiling, ceiling_proc = bench.peer("ceiling", knowledge.files)
    peers = bench.workdir / "peers"
    lengths = np.load(peers / "ceiling_lengths.npy")
    histogram = np.load(peers / "ceiling_histogram.npy")
    hf_tokens = ceiling["encoders"]["hf_batch"]["tokens"]
    checks.expect_equal("ceiling: documents", ceiling["documents"], knowledge.records)
    clm, clm_proc = bench.peer("datasets", knowledge.files, f"--block_size={BLOCK_SIZE}")
    checks.datasets_run(clm, hf_tokens, BLOCK_SIZE)
    ours = {}
    for mode in MODES:
        run = bench.ours(f"knowledge-{mode}", _knowledge_input(knowledge), mode,
                         "--write_filtered=true")
        checks.knowledge_run(run.output, run.manifest, knowledge.files, knowledge.records,
                             lengths, histogram, ceiling["separator_id"], f"ours knowledge {mode}")
        ours[mode] = run
    _same_counts(ours, "knowledge", ("documents", "tokens", "blocks", "remainder_tokens"))
    return ceiling, ceiling_proc, clm, clm_proc, ours


def measure_instruction(bench: Bench, inputs: Inputs) -> tuple:
    """TRL and ours, ours checked against TRL token for token."""
    instruction = inputs.instruction
    trl, trl_proc = bench.peer("trl", instruction.files, f"--seq_len={SEQ_LEN}",
                               f"--template={MARKED_TEMPLATE}")
    checks.trl_run(trl, instruction.records, SEQ_LEN)
    histogram = np.load(bench.workdir / "peers" / "trl_histogram.npy")
    ours = {}
    for mode in MODES:
        run = bench.ours(f"instruction-{mode}", _instruction_input(instruction), mode,
                         f"--chat_template={CHAT_TEMPLATE}")
        checks.instruction_run(run.output, run.manifest, instruction.records, trl, histogram,
                               SEQ_LEN, f"ours instruction {mode}")
        ours[mode] = run
    _same_counts(ours, "instruction", ("examples", "tokens", "trained_tokens", "packs"))
    return trl, trl_proc, ours


def measure_memory_and_startup(bench: Bench, inputs: Inputs) -> tuple:
    """Ours at 1x (a quarter of the main runs), each branch on a handful of records (its
    start-up: loading, graph, workers, the encoders' set-up), and ``make demo``."""
    template = f"--chat_template={CHAT_TEMPLATE}"
    memory_1x: dict[tuple[str, str], Run] = {}
    for mode in MODES:
        run = bench.ours(f"knowledge-1x-{mode}", _knowledge_input(inputs.knowledge_1x), mode)
        checks.balanced(run.manifest, inputs.knowledge_1x.records, f"ours knowledge 1x {mode}")
        memory_1x["knowledge", mode] = run
        run = bench.ours(f"instruction-1x-{mode}", _instruction_input(inputs.instruction_1x),
                         mode, template)
        checks.balanced(run.manifest, inputs.instruction_1x.records,
                        f"ours instruction 1x {mode}")
        memory_1x["instruction", mode] = run
    startup = {}
    tiny_knowledge, tiny_instruction = inputs.tiny
    tiny = {"knowledge": (_knowledge_input(tiny_knowledge), tiny_knowledge.records, ()),
            "instruction": (_instruction_input(tiny_instruction), tiny_instruction.records,
                            (template,))}
    for mode in MODES:
        for branch, (files, records, extra) in tiny.items():
            tries = []
            for attempt in range(STARTUP_TRIES):
                run = bench.ours(f"startup-{branch}-{mode}-{attempt}", files, mode, *extra)
                checks.balanced(run.manifest, records, f"start-up {branch} {mode}")
                tries.append(run.measured)
            startup[branch, mode] = min(tries, key=lambda m: m.wall_s)
    return memory_1x, startup, *bench.four_lines(), bench.demo()


def rows_of(r: Results, inputs: Inputs) -> list[Row]:
    hf = r.ceiling["encoders"]["hf_batch"]
    documents = f"{inputs.knowledge.records:,} documents"
    examples = f"{inputs.instruction.records:,} examples"
    return [
        Row("ceiling: HF fast tokenizer batch encode", documents, hf["tokens"], hf["seconds"],
            hf["cpu_seconds"], r.ceiling_proc.peak_rss_mb, r.ceiling_proc.others_cores,
            "encode calls only"),
        *(Row(f"reference: {name}", documents, e["tokens"], e["seconds"], e["cpu_seconds"],
              None, None,
              "same ids" if e["identical_to_hf_batch"] else "**ids differ**")
          for name, e in r.ceiling["encoders"].items() if name != "hf_batch"),
        Row("datasets streaming map + run_clm grouping", documents, r.clm["tokens"],
            r.clm["seconds"], r.clm["cpu_seconds"], r.clm_proc.peak_rss_mb, r.clm_proc.others_cores,
            f"{r.clm['dropped_tokens']:,} tokens dropped by per-batch grouping"),
        *(Row(f"ours knowledge, {mode}", documents, run.manifest["knowledge"]["tokens"],
              run.measured.wall_s, run.measured.cpu_s, run.measured.peak_rss_mb,
              run.measured.others_cores, "whole process")
          for mode, run in r.ours_k.items()),
        Row("TRL prepare + pack_dataset bfd", examples, r.trl["tokens"], r.trl["seconds"],
            r.trl["cpu_seconds"], r.trl_proc.peak_rss_mb, r.trl_proc.others_cores,
            f"prepare {r.trl['prepare_seconds']:.1f} s + pack {r.trl['pack_seconds']:.1f} s, "
            f"dataset_num_proc={r.trl['dataset_num_proc']}"),
        *(Row(f"ours instruction, {mode}", examples, run.manifest["instruction"]["tokens"],
              run.measured.wall_s, run.measured.cpu_s, run.measured.peak_rss_mb,
              run.measured.others_cores, "whole process")
          for mode, run in r.ours_i.items()),
    ]


def _speed(name: str, ours: Run, startup: proc.Measured, branch: str, peer: dict, goal: float,
           strict: bool = False) -> Target:
    """Ours / peer in tokens per wall second (the target); beside it, per CPU second and per
    wall second less our start-up (the peers' times exclude theirs)."""
    tokens = ours.manifest[branch]["tokens"]
    peer_rate = peer["tokens"] / peer["seconds"]
    wall = (tokens / ours.measured.wall_s) / peer_rate
    cpu = (tokens / ours.measured.cpu_s) / (peer["tokens"] / peer["cpu_seconds"])
    working_s = ours.measured.wall_s - startup.wall_s
    working = f"{tokens / working_s / peer_rate:.2f}x" if working_s > 0 else "n/a"
    met = wall > goal if strict else wall >= goal
    return Target(name, f"{wall:.2f}x (per CPU second {cpu:.2f}x; less start-up {working})",
                  f"{'>' if strict else '>='} {goal:g}x", met)


def targets_of(r: Results) -> list[Target]:
    hf = r.ceiling["encoders"]["hf_batch"]
    targets = []
    tiktoken = r.ceiling["encoders"]["tiktoken"]
    for mode, run in r.ours_k.items():
        startup = r.startup["knowledge", mode]
        targets.append(_speed(f"knowledge {mode} / ceiling", run, startup, "knowledge", hf,
                              GOALS["ceiling"]))
        targets.append(_speed(f"knowledge {mode} / tiktoken (the limit)", run, startup,
                              "knowledge", tiktoken, GOALS["tiktoken"]))
        targets.append(_speed(f"knowledge {mode} / datasets route", run, startup, "knowledge",
                              r.clm, GOALS["datasets"]))
    one, many = (r.ours_k[mode].measured.wall_s for mode in MODES)
    targets.append(Target(f"knowledge speed, multi_processing ({WORKERS} workers) / in_memory",
                          f"{one / many:.2f}x", "> 1x", many < one))
    targets += [_speed(f"instruction {mode} / TRL", run, r.startup["instruction", mode],
                       "instruction", r.trl, GOALS["trl"])
                for mode, run in r.ours_i.items()]
    ours = r.ours_i["in_memory"].manifest["instruction"]
    trl_eff = r.trl["tokens"] / (r.trl["packs"] * SEQ_LEN)
    fewest = math.ceil(r.trl["tokens"] / SEQ_LEN)
    targets += [
        Target(f"packing efficiency at {SEQ_LEN}", f"{ours['packing_efficiency']:.2%}",
               f">= {GOALS['packing']:.0%}", ours["packing_efficiency"] >= GOALS["packing"]),
        Target("packing efficiency, ours vs TRL bfd",
               f"{ours['packing_efficiency']:.2%} vs {trl_eff:.2%}", ">= TRL",
               ours["packing_efficiency"] >= trl_eff),
        Target("packing lower bound ceil(tokens / seq_len)",
               f"{fewest:,} packs = {r.trl['tokens'] / (fewest * SEQ_LEN):.2%}; ours "
               f"{ours['packs']:,}, TRL {r.trl['packs']:,}", "", None),
    ]
    for (branch, mode), small in r.memory_1x.items():
        big = (r.ours_k if branch == "knowledge" else r.ours_i)[mode].measured.peak_rss_mb
        one = small.measured.peak_rss_mb
        targets.append(Target(f"peak memory {branch} {mode}, 4x / 1x",
                              f"{big:,.0f} / {one:,.0f} MB = {big / one:.2f}x",
                              f"<= {GOALS['memory']}x", big <= GOALS["memory"] * one))
    run_s, import_s = r.four_lines.wall_s, r.entry_import.wall_s
    four = run_s / import_s
    targets.append(Target(f"4-line run in_memory / import of {ENTRY_POINT}",
                          f"{run_s:.2f} / {import_s:.2f} s = {four:.2f}x",
                          f"<= {GOALS['four_lines']}x", four <= GOALS["four_lines"]))
    targets.append(Target("`make demo` wall time",
                          f"{r.demo.wall_s:.1f} s (others' load {r.demo.others_cores:.2f} cores)",
                          f"< {GOALS['demo_s']:g} s", r.demo.wall_s < GOALS["demo_s"]))
    for mode in MODES:
        shares = {branch: r.startup[branch, mode].wall_s / runs[mode].measured.wall_s
                  for branch, runs in (("knowledge", r.ours_k), ("instruction", r.ours_i))}
        startups = ", ".join(f"{branch} {r.startup[branch, mode].wall_s:.1f} s = {share:.1%}"
                             for branch, share in shares.items())
        worst = max(shares.values())
        targets.append(Target(f"start-up share of our {mode} runs (harness validity)",
                              f"{worst:.1%} (start-up {startups})",
                              f"< {GOALS['startup']:.0%}", worst < GOALS["startup"]))
    return targets


def extra_formats(bench: Bench, inputs: Inputs) -> str:
    """What each ``--output_format`` beside Parquet costs: both branches' 1x inputs in one
    in_memory run with Parquet alone, then with each extra format and with all three, as
    ratios to the Parquet-only run measured here. Every run must balance and write the same
    Parquet rows (the pipeline itself refuses a format whose files hold other rows)."""
    files = _knowledge_input(inputs.knowledge_1x) + _instruction_input(inputs.instruction_1x)
    records = inputs.knowledge_1x.records + inputs.instruction_1x.records
    runs: dict[str, Run] = {}
    for name in (PARQUET, *EXTRA_FORMATS, ",".join(EXTRA_FORMATS)):
        run = bench.ours(f"formats-{name.replace(',', '-')}", files, MODES[0],
                         f"--chat_template={CHAT_TEMPLATE}", f"--output_format=parquet,{name}")
        checks.balanced(run.manifest, records, f"formats {name}")
        base = runs.get(PARQUET, run)
        for kind in ("pretrain", "sft"):
            checks.expect_equal(f"formats {name}: {kind} rows", _rows(run, kind), _rows(base, kind))
            for fmt in name.split(","):
                checks.expect(fmt == PARQUET or _rows(run, f"{fmt}/{kind}") > 0,
                              f"formats {name}: no {fmt}/{kind} rows")
        runs[name] = run
    one = runs[PARQUET].measured
    lines = ["| --output_format | wall s | CPU s | peak RSS MB | wall / Parquet only | "
             "CPU / Parquet only | peak / Parquet only | others' load |",
             "|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        m = run.measured
        label = PARQUET if name == PARQUET else f"{PARQUET},{name}"
        lines.append(f"| {label} | {m.wall_s:.1f} | {m.cpu_s:.1f} | {m.peak_rss_mb:,.0f} | "
                     f"{m.wall_s / one.wall_s:.2f}x | {m.cpu_s / one.cpu_s:.2f}x | "
                     f"{m.peak_rss_mb / one.peak_rss_mb:.2f}x | {m.others_cores:.2f} |")
    return (f"\n\n### Extra output formats\n\nBoth branches' 1x inputs in one in_memory run "
            f"({records:,} records).\n\n" + "\n".join(lines) + "\n")


def _rows(run: Run, kind: str) -> int:
    return sum(f["rows"] for f in run.manifest["outputs"].get(kind, []))


def training_side(workdir: Path, quick: bool) -> str:
    """The load matrix (256 MB; 16 MB quick, its chart then under ``workdir``) and one
    worker's per-epoch packing, as markdown to append to the report."""
    from bench.bench_load_matrix import load_matrix
    from bench.bench_loader import epoch_packing_report

    chart = workdir / "load_matrix.png" if quick else ROOT / "docs" / "load_matrix.png"
    matrix, _ = load_matrix(16 if quick else 256, chart)
    return (f"\n\n### Load matrix\n\n{matrix}\n\n### Per-epoch packing in one dataloader "
            f"worker\n\n{epoch_packing_report(workdir)}\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"small inputs ({QUICK_SCALE[0]:g} and {QUICK_SCALE[1]:g} copies) "
                        "for a check of the harness in a few minutes; BENCHMARKS.md is left alone")
    parser.add_argument("--scale", type=float, nargs=2, metavar=("KNOWLEDGE", "INSTRUCTION"),
                        help=f"copies of the knowledge documents and instruction examples "
                        f"(default {FULL_SCALE[0]:g} {FULL_SCALE[1]:g})")
    parser.add_argument("--workdir", type=Path, default=ROOT / "out" / "bench",
                        help="inputs, outputs and results (default out/bench)")
    parser.add_argument("--formats_only", action="store_true",
                        help="only the extra output formats' cost, on the 1x inputs of this "
                        "scale (a quarter of the main runs'); written to WORKDIR/formats.md")
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    scale = tuple(args.scale) if args.scale else QUICK_SCALE if args.quick else FULL_SCALE
    if args.formats_only:
        one = [s / MEMORY_FACTOR for s in scale]
        data = args.workdir / "data"
        knowledge = corpus.knowledge(data, one[0])
        instruction = corpus.instruction(data, one[1], SEQ_LEN, CHAT_TEMPLATE)
        inputs = Inputs(knowledge, instruction, knowledge, instruction, (knowledge, instruction))
        section = extra_formats(Bench(args.workdir), inputs)
        (args.workdir / "formats.md").write_text(section)
        print(section)
        return
    command = "make bench" + (f" BENCH_ARGS={shlex.quote(shlex.join(given))}" if given else "")
    for module in ("datasets", "trl", "tiktoken"):
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"bench needs {module}: .venv/bin/pip install -r requirements-train.txt "
                     "-c constraints.txt")

    bench = Bench(args.workdir)
    inputs = Inputs.build(args.workdir / "data", *scale)
    results = Results(*measure_knowledge(bench, inputs), *measure_instruction(bench, inputs),
                      *measure_memory_and_startup(bench, inputs))
    hf_tokens = results.ceiling["encoders"]["hf_batch"]["tokens"]
    scale_note = (
        f"{scale[0]:g} copies of the knowledge documents ({inputs.knowledge.records:,} "
        f"documents, {hf_tokens:,} tokens), {scale[1]:g} copies of the instruction examples "
        f"({inputs.instruction.records:,} examples, {results.trl['tokens']:,} tokens); memory "
        f"baseline (1x) at a quarter of each. TOKENIZERS_PARALLELISM=true everywhere.")
    notes = [
        "Every output above was checked before this table was written (`bench/checks.py`): "
        "ours vs the ceiling token for token, datasets vs the ceiling, ours vs TRL token for "
        "token and trained token for trained token, both runner modes alike.",
        "Ours: wall and CPU time of the whole `python -m beam_pipeline` process tree, start-up "
        "included. Peers: the work alone, imports and loading excluded. Targets use wall "
        "time; the ratio per CPU second beside it holds up better when other processes crowd "
        "the machine (it does not credit parallelism, and it still counts our start-up); "
        "\"less start-up\" takes the start-up run below off our wall time, for a like-for-like "
        "view of the work (the targets do not use it).",
        f"Peak RSS: the process and all its children, polled every {proc.POLL_S:g} s from "
        "/proc. Others' load: the cores that processes outside the measurement kept busy on "
        "average (from /proc/stat); anything well above 0 means a shared machine slowed that "
        "row, and ratios against it are suspect.",
    ]
    section = render(command, scale_note, rows_of(results, inputs), targets_of(results), notes)
    section += extra_formats(bench, inputs)
    section += training_side(args.workdir, quick=scale != FULL_SCALE)
    print(section)
    if scale == FULL_SCALE:
        write_section(ROOT / "BENCHMARKS.md", section)
        print("[bench] results written to BENCHMARKS.md")
    else:
        (args.workdir / "report.md").write_text(section)
        print(f"[bench] not the full size: results in {args.workdir / 'report.md'} only")


if __name__ == "__main__":
    try:
        main()
    except checks.CheckFailed as failure:
        sys.exit(f"[bench] OUTPUT CHECK FAILED, no speed reported: {failure}")
