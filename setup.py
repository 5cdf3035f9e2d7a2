"""Sparse-softmax / AS-Softmax: the core library (``sparse_softmax``, plain PyTorch) and its two front doors, the
fairseq plugin (``user_dir``, with the data prep's ``preplib``) and the Hugging Face adapters
(``sparse_softmax.hf``).

``pip install .`` installs the core alone (torch, numpy, entmax); the extras add a front door or a tool:
``[hf]``, ``[fairseq]``, ``[prep]``, ``[scoring]``, ``[plots]``, ``[test]``, ``[all]``.
``scripts/setup_env.sh`` installs everything, pinned, the way fairseq needs (requirements/).
"""
from setuptools import find_packages, setup

FAIRSEQ = [
    # fairseq-fixed is fairseq main with the Python 3.11 dataclass fix; it imports as `fairseq`.
    "fairseq-fixed==0.12.3.1",
    "hydra-core>=1.3,<1.4",
    "omegaconf>=2.3,<2.4",
    "transformers>=5",  # --arch hf_encoder / hf_unilm
]
EXTRAS = {
    "hf": ["transformers>=5", "accelerate>=1.1"],
    "fairseq": FAIRSEQ,
    "prep": [*FAIRSEQ, "sentencepiece", "tqdm"],
    "scoring": ["rouge-score", "nltk", "sacrebleu>=2", "tqdm"],
    "plots": ["matplotlib"],
    "test": ["pytest", "scikit-learn"],
}
EXTRAS["all"] = sorted({requirement for group in EXTRAS.values() for requirement in group})

setup(
    name="sparse-softmax",
    version="0.2.0",
    description="Sparse-softmax and AS-Softmax: losses, a fused output layer and top-k renormalised decoding "
                "for PyTorch, fairseq and Hugging Face",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[*find_packages(include=["sparse_softmax", "sparse_softmax.*", "user_dir", "user_dir.*"]), "preplib"],
    package_dir={"preplib": "data-prep/preplib"},
    install_requires=["torch>=2.0", "numpy", "entmax"],
    extras_require=EXTRAS,
)
