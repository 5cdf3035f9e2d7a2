"""Sparse-softmax / AS-Softmax training and decoding for fairseq (a --user-dir plugin)."""
from setuptools import find_packages, setup

setup(
    name="fairseq-sparse-softmax",
    version="0.1.0",
    description="Sparse-softmax and AS-Softmax losses, criterions and masked decoding for fairseq",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["user_dir", "user_dir.*"]),
    install_requires=[
        "torch>=2.0",
        # fairseq-fixed is fairseq main with the Python 3.11 dataclass fix; it imports as `fairseq`.
        "fairseq-fixed==0.12.3.1",
        "numpy",
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "sentencepiece",
        "sacrebleu>=2",
        "rouge-score",
        "nltk",
        "entmax",
        "tqdm",
        "matplotlib",
        "transformers>=5",
    ],
    extras_require={"test": ["pytest"]},
)
