"""The package that local runs and Dataflow workers install (``--setup_file ./setup.py``)."""

from pathlib import Path

from setuptools import Extension, find_packages, setup

HERE = Path(__file__).parent


def requirements() -> list[str]:
    lines = (HERE / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


setup(
    name="beam-llm-dataprep",
    version="0.1.0",
    description="LLM training-data preparation on Apache Beam: pretraining blocks and packed SFT "
    "sequences as sharded Parquet.",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["beam_pipeline", "beam_pipeline.*", "transforms",
                                    "transforms.*"]),
    package_data={"transforms.instruction": ["schemas/*.pbtxt", "templates/*.jinja"]},
    install_requires=requirements(),
    entry_points={"console_scripts": ["beam-dataprep=beam_pipeline.cli:main"]},
    # The word finder's C kernel (transforms/knowledge/words.py). Optional: without a compiler
    # the package installs all the same and finds words with numpy, the kernel's reference.
    ext_modules=[Extension("transforms.knowledge._words", ["transforms/knowledge/_words.c"],
                           extra_compile_args=["-O3"], optional=True)],
)
